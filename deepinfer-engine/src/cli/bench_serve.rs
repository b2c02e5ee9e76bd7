//! `deepinfer bench-serve --url URL`: one fixed prompt set replayed against any
//! OpenAI-compatible server (streamed `/v1/completions` with token-id prompts), at rising
//! Poisson arrival rates until the server saturates, or at fixed client concurrencies
//! (closed loop). Per point: TTFT p50/p90/p99, TPOT and inter-token latency p50/p99,
//! end-to-end latency, throughput and goodput (the share of requests meeting both SLOs),
//! with requests whose prompt prefix the server reported cached apart from the rest.

use super::CliResult;
use clap::Args;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Arguments of `deepinfer bench-serve`.
#[derive(Debug, Args)]
pub struct BenchServeArgs {
    /// The server, e.g. `http://127.0.0.1:8000`.
    #[arg(long)]
    pub url: String,
    /// Model name to send.
    #[arg(long, default_value = "deepinfer")]
    pub model: String,
    /// Poisson arrival rates, requests/s (default: 1, 2, 4, ... until saturation or 256).
    #[arg(long, value_delimiter = ',')]
    pub rates: Vec<f64>,
    /// Closed-loop client concurrencies instead of arrival rates.
    #[arg(long, value_delimiter = ',')]
    pub concurrency: Vec<usize>,
    /// Requests per point.
    #[arg(long, default_value_t = 64)]
    pub requests: usize,
    /// Prompt tokens per request. Half the prompts share their first three quarters across
    /// every point (a server with a prefix cache serves that part from it after the first
    /// point); the other half are new at each point.
    #[arg(long, default_value_t = 64)]
    pub prompt_len: usize,
    /// New tokens per request (`ignore_eos`, so every request generates them all).
    #[arg(long, default_value_t = 32)]
    pub new_tokens: usize,
    /// Prompt token ids are drawn below this.
    #[arg(long, default_value_t = 100_000)]
    pub vocab: u32,
    /// Time-to-first-token objective, ms.
    #[arg(long, default_value_t = 1000.0)]
    pub slo_ttft_ms: f64,
    /// Time-per-output-token objective, ms.
    #[arg(long, default_value_t = 100.0)]
    pub slo_tpot_ms: f64,
    /// Seed of the prompts and arrivals.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Output prefix: writes PREFIX.json and PREFIX.svg.
    #[arg(long, default_value = "deepinfer-bench-serve")]
    pub output: PathBuf,
}

/// One request's measurements.
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    ok: bool,
    ttft_ms: f64,
    e2e_ms: f64,
    tokens: usize,
    cached: bool,
    /// Mean gap between streamed chunks after the first, ms.
    itl_ms: f64,
}

impl Sample {
    fn tpot_ms(&self) -> f64 {
        if self.tokens > 1 {
            (self.e2e_ms - self.ttft_ms) / (self.tokens - 1) as f64
        } else {
            0.0
        }
    }
}

/// A small xorshift for prompts and arrivals.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The prompts of point `point`.
fn prompts(a: &BenchServeArgs, point: u64) -> Vec<Vec<u32>> {
    let vocab = u64::from(a.vocab.max(20));
    let mut shared_rng = Rng(a.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let shared: Vec<u32> = (0..a.prompt_len * 3 / 4)
        .map(|_| (shared_rng.next() % (vocab - 10)) as u32 + 10)
        .collect();
    let mut r = Rng((a.seed ^ (point + 1).wrapping_mul(0xD1B5_4A32_D192_ED03)) | 1);
    (0..a.requests)
        .map(|i| {
            let mut p = if i % 2 == 0 {
                shared.clone()
            } else {
                Vec::new()
            };
            while p.len() < a.prompt_len.max(1) {
                p.push((r.next() % (vocab - 10)) as u32 + 10);
            }
            p
        })
        .collect()
}

/// Run `deepinfer bench-serve`.
pub fn run(a: &BenchServeArgs) -> CliResult {
    let addr = a
        .url
        .strip_prefix("http://")
        .ok_or("--url must start with http://")?
        .trim_end_matches('/')
        .to_string();
    if a.requests == 0 {
        return Err("--requests must be at least 1".into());
    }
    if a.rates.iter().any(|r| !(r.is_finite() && *r > 0.0)) {
        return Err("--rates must be positive numbers".into());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut points = Vec::new();
    rt.block_on(async {
        // Warm-up: one request, so the first point does not pay for lazy set-up.
        let _ = one(&addr, a, &prompts(a, u64::MAX)[0]).await;
        if !a.concurrency.is_empty() {
            for (k, &c) in a.concurrency.iter().enumerate() {
                let prompts = Arc::new(prompts(a, k as u64));
                let t0 = Instant::now();
                let samples = closed_loop(&addr, a, &prompts, c.max(1)).await;
                let p = point(a, json!({"concurrency": c}), &samples, t0.elapsed());
                eprintln!("{}", line(&p));
                points.push(p);
            }
            return;
        }
        let auto = a.rates.is_empty();
        let mut rates = if auto { vec![1.0] } else { a.rates.clone() };
        let mut i = 0;
        let mut first_ttft = None;
        while i < rates.len() {
            let rate = rates[i];
            let prompts = Arc::new(prompts(a, i as u64));
            let t0 = Instant::now();
            let samples = open_loop(&addr, a, &prompts, rate).await;
            let p = point(a, json!({"rate": rate}), &samples, t0.elapsed());
            eprintln!("{}", line(&p));
            let ttft = p["all"]["ttft_ms"]["p50"].as_f64().unwrap_or(f64::INFINITY);
            let goodput = p["all"]["goodput"].as_f64().unwrap_or(0.0);
            let base = *first_ttft.get_or_insert(ttft);
            points.push(p);
            // Saturated: queueing dominates the first token, or most requests miss the SLOs.
            let saturated = ttft > (10.0 * base).max(a.slo_ttft_ms) || goodput < 0.5;
            if auto && !saturated && rate < 256.0 {
                rates.push(rate * 2.0);
            }
            i += 1;
        }
    });
    print!("{}", table(&points));
    let setup = json!({
        "url": a.url, "model": a.model, "requests": a.requests, "prompt_len": a.prompt_len,
        "new_tokens": a.new_tokens, "slo_ttft_ms": a.slo_ttft_ms, "slo_tpot_ms": a.slo_tpot_ms,
    });
    let json_path = a.output.with_extension("json");
    let svg_path = a.output.with_extension("svg");
    std::fs::write(
        &json_path,
        serde_json::to_string_pretty(&json!({"setup": setup, "points": points}))?,
    )
    .map_err(|e| format!("cannot write {}: {e}", json_path.display()))?;
    std::fs::write(&svg_path, svg(&points))
        .map_err(|e| format!("cannot write {}: {e}", svg_path.display()))?;
    println!("wrote {} and {}", json_path.display(), svg_path.display());
    Ok(())
}

async fn open_loop(
    addr: &str,
    a: &BenchServeArgs,
    prompts: &Arc<Vec<Vec<u32>>>,
    rate: f64,
) -> Vec<Sample> {
    let mut r = Rng((a.seed ^ rate.to_bits()) | 1);
    let start = Instant::now();
    let mut at = 0.0f64;
    let mut tasks = Vec::with_capacity(prompts.len());
    for i in 0..prompts.len() {
        at += -(1.0 - r.unit()).ln() / rate;
        let when = start + Duration::from_secs_f64(at);
        tokio::time::sleep_until(when.into()).await;
        let (addr, prompts) = (addr.to_string(), prompts.clone());
        let args = Args1::from(a);
        tasks.push(tokio::spawn(async move {
            one_with(&addr, &args, &prompts[i]).await
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap_or_default());
    }
    out
}

async fn closed_loop(
    addr: &str,
    a: &BenchServeArgs,
    prompts: &Arc<Vec<Vec<u32>>>,
    c: usize,
) -> Vec<Sample> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..c {
        let (addr, prompts, next) = (addr.to_string(), prompts.clone(), next.clone());
        let args = Args1::from(a);
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= prompts.len() {
                    return out;
                }
                out.push(one_with(&addr, &args, &prompts[i]).await);
            }
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.extend(t.await.unwrap_or_default());
    }
    out
}

/// What a request task needs of the arguments.
#[derive(Debug, Clone)]
struct Args1 {
    model: String,
    new_tokens: usize,
}

impl From<&BenchServeArgs> for Args1 {
    fn from(a: &BenchServeArgs) -> Self {
        Self {
            model: a.model.clone(),
            new_tokens: a.new_tokens,
        }
    }
}

async fn one(addr: &str, a: &BenchServeArgs, prompt: &[u32]) -> Sample {
    one_with(addr, &Args1::from(a), prompt).await
}

/// One streamed completion; failures count as not ok.
async fn one_with(addr: &str, a: &Args1, prompt: &[u32]) -> Sample {
    match tokio::time::timeout(Duration::from_secs(600), stream_completion(addr, a, prompt)).await {
        Ok(Ok(s)) => s,
        _ => Sample::default(),
    }
}

async fn stream_completion(addr: &str, a: &Args1, prompt: &[u32]) -> std::io::Result<Sample> {
    let body = json!({
        "model": a.model, "prompt": prompt, "max_tokens": a.new_tokens, "temperature": 0.0,
        "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true,
    })
    .to_string();
    let t0 = Instant::now();
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await?;
    let mut raw = Vec::new();
    let mut buf = vec![0u8; 16384];
    let mut head_end = None;
    let mut frames = Frames::default();
    let mut sample = Sample::default();
    let mut first: Option<Instant> = None;
    let mut last: Option<Instant> = None;
    let mut gaps = 0.0;
    let mut n_gaps = 0usize;
    loop {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        if head_end.is_none() {
            head_end = raw.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
            if let Some(h) = head_end {
                if !raw.starts_with(b"HTTP/1.1 200") {
                    return Ok(Sample::default());
                }
                frames.push(&raw[h..]);
            }
        } else {
            frames.push(&buf[..n]);
        }
        for f in frames.take() {
            let now = Instant::now();
            let Some(data) = f.strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                sample.ok = true;
                continue;
            }
            let Ok(v) = serde_json::from_str::<Value>(data) else {
                continue;
            };
            if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                sample.tokens = u["completion_tokens"].as_u64().unwrap_or(0) as usize;
                sample.cached = u["prompt_tokens_details"]["cached_tokens"]
                    .as_u64()
                    .unwrap_or(0)
                    > 0;
            }
            let has_text = v["choices"][0]["text"]
                .as_str()
                .is_some_and(|t| !t.is_empty());
            if has_text {
                if first.is_none() {
                    first = Some(now);
                } else if let Some(l) = last {
                    gaps += (now - l).as_secs_f64() * 1e3;
                    n_gaps += 1;
                }
                last = Some(now);
            }
        }
    }
    let end = Instant::now();
    sample.ttft_ms = (first.unwrap_or(end) - t0).as_secs_f64() * 1e3;
    sample.e2e_ms = (end - t0).as_secs_f64() * 1e3;
    sample.itl_ms = if n_gaps > 0 {
        gaps / n_gaps as f64
    } else {
        0.0
    };
    Ok(sample)
}

/// Incremental chunked-transfer decoding and server-sent-event framing.
#[derive(Default)]
struct Frames {
    chunked: Vec<u8>,
    text: String,
}

impl Frames {
    fn push(&mut self, bytes: &[u8]) {
        self.chunked.extend_from_slice(bytes);
        loop {
            let Some(i) = self.chunked.windows(2).position(|w| w == b"\r\n") else {
                return;
            };
            let size = std::str::from_utf8(&self.chunked[..i])
                .ok()
                .and_then(|s| usize::from_str_radix(s.trim(), 16).ok());
            let Some(size) = size else {
                self.chunked.clear();
                return;
            };
            if self.chunked.len() < i + 2 + size + 2 {
                return;
            }
            self.text
                .push_str(&String::from_utf8_lossy(&self.chunked[i + 2..i + 2 + size]));
            self.chunked.drain(..i + 4 + size);
        }
    }

    fn take(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(i) = self.text.find("\n\n") {
            out.push(self.text[..i].trim().to_string());
            self.text.drain(..i + 2);
        }
        out
    }
}

fn pct(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 - 1.0) * q).round() as usize;
    v[i.min(v.len() - 1)]
}

fn stats(a: &BenchServeArgs, s: &[&Sample]) -> Value {
    let mut ttft: Vec<f64> = s.iter().map(|x| x.ttft_ms).collect();
    let mut tpot: Vec<f64> = s.iter().map(|x| x.tpot_ms()).collect();
    let mut itl: Vec<f64> = s.iter().map(|x| x.itl_ms).collect();
    let mut e2e: Vec<f64> = s.iter().map(|x| x.e2e_ms).collect();
    let good = s
        .iter()
        .filter(|x| x.ttft_ms <= a.slo_ttft_ms && x.tpot_ms() <= a.slo_tpot_ms)
        .count();
    json!({
        "requests": s.len(),
        "ttft_ms": {"p50": pct(&mut ttft, 0.5), "p90": pct(&mut ttft, 0.9), "p99": pct(&mut ttft, 0.99)},
        "tpot_ms": {"p50": pct(&mut tpot, 0.5), "p99": pct(&mut tpot, 0.99)},
        "itl_ms": {"p50": pct(&mut itl, 0.5), "p99": pct(&mut itl, 0.99)},
        "e2e_ms": {"p50": pct(&mut e2e, 0.5), "p99": pct(&mut e2e, 0.99)},
        "goodput": if s.is_empty() { 0.0 } else { good as f64 / s.len() as f64 },
    })
}

fn point(a: &BenchServeArgs, at: Value, samples: &[Sample], wall: Duration) -> Value {
    let ok: Vec<&Sample> = samples.iter().filter(|s| s.ok).collect();
    let cached: Vec<&Sample> = ok.iter().copied().filter(|s| s.cached).collect();
    let fresh: Vec<&Sample> = ok.iter().copied().filter(|s| !s.cached).collect();
    let secs = wall.as_secs_f64().max(1e-9);
    let tokens: usize = ok.iter().map(|s| s.tokens).sum();
    let mut p = at;
    p["failed"] = json!(samples.len() - ok.len());
    p["request_throughput"] = json!(ok.len() as f64 / secs);
    p["output_tok_s"] = json!(tokens as f64 / secs);
    p["all"] = stats(a, &ok);
    p["cached_prefix"] = stats(a, &cached);
    p["recomputed"] = stats(a, &fresh);
    p
}

fn label(p: &Value) -> String {
    match (p.get("rate"), p.get("concurrency")) {
        (Some(r), _) => format!("{} req/s", r),
        (_, Some(c)) => format!("c={c}"),
        _ => "?".into(),
    }
}

fn line(p: &Value) -> String {
    format!(
        "  {}: {:.1} tok/s, TTFT p50 {:.1} ms, TPOT p50 {:.2} ms, goodput {:.0}%",
        label(p),
        p["output_tok_s"].as_f64().unwrap_or(0.0),
        p["all"]["ttft_ms"]["p50"].as_f64().unwrap_or(0.0),
        p["all"]["tpot_ms"]["p50"].as_f64().unwrap_or(0.0),
        100.0 * p["all"]["goodput"].as_f64().unwrap_or(0.0)
    )
}

fn table(points: &[Value]) -> String {
    let mut t = String::from(
        "| point | req/s | tok/s | TTFT p50 / p90 / p99 ms | TPOT p50 / p99 ms | ITL p50 / p99 ms | e2e p50 / p99 ms | goodput | TTFT p50 cached / recomputed ms | failed |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for p in points {
        let f = |k: &str, s: &str| p["all"][k][s].as_f64().unwrap_or(0.0);
        t.push_str(&format!(
            "| {} | {:.2} | {:.1} | {:.1} / {:.1} / {:.1} | {:.2} / {:.2} | {:.2} / {:.2} | {:.0} / {:.0} | {:.0}% | {:.1} / {:.1} | {} |\n",
            label(p),
            p["request_throughput"].as_f64().unwrap_or(0.0),
            p["output_tok_s"].as_f64().unwrap_or(0.0),
            f("ttft_ms", "p50"), f("ttft_ms", "p90"), f("ttft_ms", "p99"),
            f("tpot_ms", "p50"), f("tpot_ms", "p99"),
            f("itl_ms", "p50"), f("itl_ms", "p99"),
            f("e2e_ms", "p50"), f("e2e_ms", "p99"),
            100.0 * p["all"]["goodput"].as_f64().unwrap_or(0.0),
            p["cached_prefix"]["ttft_ms"]["p50"].as_f64().unwrap_or(0.0),
            p["recomputed"]["ttft_ms"]["p50"].as_f64().unwrap_or(0.0),
            p["failed"],
        ));
    }
    t
}

/// Throughput (x) against TTFT p50 (y), one dot per point.
fn svg(points: &[Value]) -> String {
    let (w, h, m) = (640.0, 400.0, 60.0);
    let xs: Vec<f64> = points
        .iter()
        .map(|p| p["output_tok_s"].as_f64().unwrap_or(0.0))
        .collect();
    let ys: Vec<f64> = points
        .iter()
        .map(|p| p["all"]["ttft_ms"]["p50"].as_f64().unwrap_or(0.0))
        .collect();
    let xmax = xs.iter().copied().fold(1e-9, f64::max) * 1.1;
    let ymax = ys.iter().copied().fold(1e-9, f64::max) * 1.1;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{m}\" y=\"24\">deepinfer bench-serve: output tokens/s against TTFT p50</text>\n<line x1=\"{m}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n<line x1=\"{m}\" y1=\"{m}\" x2=\"{m}\" y2=\"{}\" stroke=\"black\"/>\n<text x=\"{}\" y=\"{}\">{xmax:.0} tok/s</text>\n<text x=\"4\" y=\"{}\">{ymax:.0} ms</text>\n",
        h - m,
        w - m,
        h - m,
        h - m,
        w - m - 60.0,
        h - m + 20.0,
        m + 4.0
    );
    let px = |x: f64| m + (w - 2.0 * m) * x / xmax;
    let py = |y: f64| h - m - (h - 2.0 * m) * y / ymax;
    for (i, p) in points.iter().enumerate() {
        s.push_str(&format!(
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"steelblue\"/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>\n",
            px(xs[i]),
            py(ys[i]),
            px(xs[i]) + 6.0,
            py(ys[i]) - 6.0,
            label(p)
        ));
    }
    s.push_str("</svg>\n");
    s
}
