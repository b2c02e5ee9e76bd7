//! The `deepinfer serve` binary: it starts with no flags but a port, serves, and on SIGTERM
//! drains (in-flight requests finish, new ones are refused) and exits 0; past the grace
//! period it aborts what is left.
#![cfg(all(feature = "server", unix))]

mod http;

use serde_json::json;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `deepinfer serve --port 0 ARGS`, with the address it printed.
fn spawn(args: &[&str]) -> (Child, SocketAddr) {
    let cache = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("server-cli-cache");
    let mut child = Command::new(env!("CARGO_BIN_EXE_deepinfer"))
        .args(["serve", "--port", "0"])
        .args(args)
        .env("DEEPINFER_CACHE", &cache)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("deepinfer serve starts");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(a) = line.strip_prefix("listening on http://") {
                let _ = tx.send(a.parse::<SocketAddr>().expect("an address"));
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(240))
        .expect("the server printed its address");
    (child, addr)
}

fn sigterm(child: &Child) {
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs")
        .success();
    assert!(ok);
}

fn wait_exit(child: &mut Child, secs: u64) -> Option<i32> {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if let Some(s) = child.try_wait().expect("wait") {
            return s.code();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    None
}

/// Start a streamed chat of `max_tokens` and read until its first bytes arrived.
fn open_stream(addr: SocketAddr, max_tokens: u64) -> (TcpStream, Vec<u8>) {
    let body = json!({
        "model": "m", "max_tokens": max_tokens, "stream": true,
        "messages": [{"role": "user", "content": "go on"}],
    });
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(120))).ok();
    c.write_all(&http::request_bytes(
        "POST",
        "/v1/chat/completions",
        &body.to_string(),
    ))
    .unwrap();
    let mut got = vec![0u8; 4096];
    let n = c.read(&mut got).unwrap();
    got.truncate(n);
    (c, got)
}

#[test]
fn sigterm_drains_in_flight_requests_and_exits_zero() {
    let (mut child, addr) = spawn(&["--shutdown-grace", "60"]);
    assert_eq!(http::get(addr, "/health").status, 200);
    let (mut c, mut got) = open_stream(addr, 300);
    sigterm(&child);
    // The in-flight stream runs to its end.
    c.read_to_end(&mut got).unwrap();
    let r = http::parse(&got);
    assert_eq!(r.status, 200);
    let ev = r.events();
    assert_eq!(
        ev.last().map(|e| e.1.as_str()),
        Some("[DONE]"),
        "{}",
        r.body
    );
    assert!(
        ev.iter()
            .any(|e| e.1.contains("\"finish_reason\":\"length\""))
    );
    assert_eq!(wait_exit(&mut child, 60), Some(0));
}

#[test]
fn past_the_grace_period_the_rest_is_aborted() {
    let (mut child, addr) = spawn(&["--shutdown-grace", "0"]);
    let (mut c, mut got) = open_stream(addr, 8000);
    let t = Instant::now();
    sigterm(&child);
    let _ = c.read_to_end(&mut got);
    assert_eq!(wait_exit(&mut child, 60), Some(0));
    // Far sooner than 8,000 tokens would take.
    assert!(t.elapsed() < Duration::from_secs(30));
}
