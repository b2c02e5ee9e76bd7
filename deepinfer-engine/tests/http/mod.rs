//! A minimal blocking HTTP/1.1 client for the server tests (one request per connection,
//! chunked bodies decoded, server-sent events split into frames), and an in-process server
//! on a loopback port over the embedded default model.
#![allow(dead_code)]

use deepinfer_engine::Model;
use deepinfer_engine::runtime::{
    ChatFrontend, Engine, EngineConfig, OnlineEngine, materialize_default,
};
use deepinfer_engine::server::{AppState, ServerConfig, serve};
use deepinfer_kernels::CpuBackend;
use deepinfer_recipe::PromptTokenizer;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The embedded default model, made once per test binary.
pub fn model_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("server-model");
        materialize_default(&dir).expect("default model created")
    })
    .clone()
}

/// A server on `127.0.0.1:<free port>`; it runs until the test process ends.
pub struct TestServer {
    pub addr: SocketAddr,
    pub online: Arc<OnlineEngine>,
}

/// Start a server with `cfg` and a queue bound of `max_queued`.
pub fn start(cfg: EngineConfig, max_queued: usize, server: ServerConfig) -> TestServer {
    let model = Model::load(&model_dir(), CpuBackend::batch_invariant()).expect("model loads");
    let front = ChatFrontend::new(
        PromptTokenizer::deepseek_v4().expect("tokenizer"),
        model.kind(),
    );
    let engine = Engine::new(model, cfg)
        .expect("engine")
        .with_tokenizer(front.tokenizer().clone());
    let online = Arc::new(OnlineEngine::start(engine, max_queued));
    let state = AppState::new(online.clone(), front, server);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            tx.send(l.local_addr().expect("addr")).expect("send addr");
            serve(l, state, std::future::pending())
                .await
                .expect("serve");
        });
    });
    let addr = rx.recv().expect("server started");
    TestServer { addr, online }
}

/// A response: status, headers (lower-case names) and the decoded body.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Resp {
    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Server-sent events: `(event name, data)` per frame.
    pub fn events(&self) -> Vec<(Option<String>, String)> {
        self.body
            .split("\n\n")
            .filter(|f| !f.trim().is_empty())
            .map(|f| {
                let mut name = None;
                let mut data = String::new();
                for line in f.lines() {
                    if let Some(n) = line.strip_prefix("event: ") {
                        name = Some(n.to_string());
                    } else if let Some(d) = line.strip_prefix("data: ") {
                        data.push_str(d);
                    }
                }
                (name, data)
            })
            .collect()
    }
}

/// Raw request bytes for `method path` with a JSON body.
pub fn request_bytes(method: &str, path: &str, body: &str) -> Vec<u8> {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Send `POST path` with a JSON body and hand back the open connection, unread (a client that
/// reads some of a stream, or none, and may go away).
pub fn send(addr: SocketAddr, path: &str, body: &Value) -> TcpStream {
    let mut c = TcpStream::connect(addr).expect("connect");
    c.set_read_timeout(Some(Duration::from_secs(120))).ok();
    c.write_all(&request_bytes("POST", path, &body.to_string()))
        .expect("write");
    c
}

/// Send raw bytes, read the whole answer.
pub fn raw(addr: SocketAddr, bytes: &[u8]) -> Resp {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).ok();
    // A server may answer (413) and close before reading the whole body.
    let _ = s.write_all(bytes);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16384];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            // A reset after the answer (the server closed on an unread body) ends it.
            Err(e) if !buf.is_empty() => {
                let _ = e;
                break;
            }
            Err(e) => panic!("read: {e}"),
        }
    }
    parse(&buf)
}

/// `POST path` with a JSON body.
pub fn post(addr: SocketAddr, path: &str, body: &Value) -> Resp {
    raw(addr, &request_bytes("POST", path, &body.to_string()))
}

/// `GET path`.
pub fn get(addr: SocketAddr, path: &str) -> Resp {
    raw(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes(),
    )
}

/// Parse a whole HTTP/1.1 response.
pub fn parse(buf: &[u8]) -> Resp {
    let text = String::from_utf8_lossy(buf);
    let (head, rest) = text.split_once("\r\n\r\n").expect("a header block");
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        dechunk(rest.as_bytes())
    } else {
        rest.to_string()
    };
    Resp {
        status,
        headers,
        body,
    }
}

fn dechunk(mut b: &[u8]) -> String {
    let mut out = Vec::new();
    while let Some(i) = b.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&b[..i])
            .ok()
            .and_then(|s| usize::from_str_radix(s.trim(), 16).ok())
            .unwrap_or(0);
        if size == 0 || b.len() < i + 2 + size {
            break;
        }
        out.extend_from_slice(&b[i + 2..i + 2 + size]);
        b = &b[(i + 4 + size).min(b.len())..];
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Wait until `f` holds (polling), up to `secs` seconds.
pub fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + Duration::from_secs(secs);
    while std::time::Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}
