//! The `deepinfer serve` binary: it starts with no flags but a port, serves, and on SIGTERM
//! drains (in-flight requests finish, new ones are refused) and exits 0; past the grace
//! period it aborts what is left.
#![cfg(all(feature = "cli", feature = "server", unix))]

mod http;

use serde_json::json;
use std::io::{BufRead, BufReader, Read};
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
        "model": "m", "max_tokens": max_tokens, "stream": true, "ignore_eos": true,
        "messages": [{"role": "user", "content": "go on"}],
    });
    let mut c = http::send(addr, "/v1/chat/completions", &body);
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

/// Resident memory of a process, KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Rounds of 128 concurrent streaming clients, every fourth leaving mid-stream: over four
/// more rounds the server's resident memory comes back within 10 % of the most it held
/// during the first three (nothing is kept per finished or abandoned request).
#[test]
fn memory_returns_to_its_baseline_after_a_load_with_disconnects() {
    let (mut child, addr) = spawn(&[]);
    let round = || {
        let clients: Vec<_> = (0..128u64)
            .map(|i| {
                std::thread::spawn(move || {
                    let body = json!({
                        // Every request runs to its length (the trained model may end
                        // early), so each round is the same load.
                        "model": "m", "max_tokens": 8 + i % 5, "stream": true, "seed": i,
                        "ignore_eos": true,
                        "messages": [{"role": "user", "content": format!("client {i}")}],
                    });
                    if i % 4 == 1 {
                        let mut c = http::send(addr, "/v1/chat/completions", &body);
                        let mut buf = [0u8; 256];
                        let _ = c.read(&mut buf);
                        return true;
                    }
                    let r = http::post(addr, "/v1/chat/completions", &body);
                    r.status == 200 && r.events().iter().any(|e| e.1 == "[DONE]")
                })
            })
            .collect();
        clients.into_iter().all(|c| c.join().unwrap())
    };
    let idle = || {
        http::eventually(30, || {
            let m = http::get(addr, "/metrics").body;
            m.contains("vllm:num_requests_running 0") && m.contains("vllm:num_requests_waiting 0")
        })
    };
    // The pools fill and the allocator settles over the first rounds: the baseline is the
    // most seen then; a per-request leak would grow past it round after round.
    let mut baseline = 0;
    for _ in 0..3 {
        assert!(round());
        assert!(idle());
        baseline = baseline.max(rss_kib(child.id()));
    }
    // The allocator's resident size swings by 10-20 % from round to round; a leak grows
    // every round, so the least of the next rounds must come back near the baseline.
    let mut after = u64::MAX;
    for _ in 0..4 {
        assert!(round());
        assert!(idle());
        std::thread::sleep(Duration::from_millis(100));
        after = after.min(rss_kib(child.id()));
    }
    sigterm(&child);
    assert_eq!(wait_exit(&mut child, 60), Some(0));
    eprintln!(
        "server RSS: at most {baseline} KiB over 3 warming rounds, at least {after} KiB over 4 more"
    );
    assert!(baseline > 0);
    assert!(
        after as f64 <= 1.1 * baseline as f64,
        "RSS {after} KiB after the load, {baseline} KiB before"
    );
}
