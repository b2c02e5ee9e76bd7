//! A libFuzzer-free fuzz driver (no nightly needed): feeds mutated golden-dev
//! requests and structured random token streams to the fuzz bodies for a
//! while, and stops at the first panic, saving the input.
//!
//! `cargo run --release -p deepinfer-recipe --example fuzz_driver -- SECONDS [SEED]`

mod bodies;

use std::io::Read;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use deepinfer_recipe::PromptTokenizer;

/// xorshift64*: small, deterministic, good enough for input generation.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Fragments that reach deep into the parsers and the template.
const DICTIONARY: &[&str] = &[
    "<｜User｜>",
    "<｜Assistant｜>",
    "</think>",
    "<think>",
    "<｜DSML｜",
    "｜DSML｜",
    "<｜end▁of▁sentence｜>",
    "\"role\"",
    "\"tool\"",
    "\"tool_calls\"",
    "\"content\"",
    "null",
    "[]",
    "{}",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "\"type\": \"image_url\"",
    "\"strict\": true",
    "\"response_format\": {\"type\": \"grammar\", \"grammar\": \"root ::= root\"}",
    "\"n\": 1000000",
    "\"max_tokens\": -1",
    "\"tool_choice\": \"required\"",
    "1e999",
    "-0",
    "\"\u{1F600}\"",
];

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut data = seed.to_vec();
    for _ in 0..1 + rng.below(8) {
        let at = rng.below(data.len() + 1);
        match rng.below(5) {
            0 if !data.is_empty() => {
                let i = at.min(data.len() - 1);
                data[i] ^= 1 << rng.below(8);
            }
            1 => {
                let word = DICTIONARY[rng.below(DICTIONARY.len())].as_bytes();
                data.splice(at..at, word.iter().copied());
            }
            2 if at < data.len() => {
                let end = (at + rng.below(64)).min(data.len());
                data.drain(at..end);
            }
            3 => data.truncate(at),
            _ => {
                let len = rng.below(16);
                let copy: Vec<u8> = data
                    .iter()
                    .skip(rng.below(data.len() + 1))
                    .take(len)
                    .copied()
                    .collect();
                data.splice(at..at, copy);
            }
        }
    }
    data
}

fn token_stream(rng: &mut Rng, interesting: &[u32]) -> Vec<u8> {
    let mut data = vec![rng.next() as u8];
    for _ in 0..rng.below(400) {
        let id = if rng.below(3) == 0 {
            rng.below(130_000) as u32
        } else {
            interesting[rng.below(interesting.len())]
        };
        data.extend_from_slice(&id.to_be_bytes()[1..]);
    }
    data
}

fn main() {
    let mut args = std::env::args().skip(1);
    let seconds: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let seed: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(0x5EED);
    let tokenizer = Arc::new(PromptTokenizer::deepseek_v4().expect("vendored tokenizer"));
    let mut text = String::new();
    flate2::read::GzDecoder::new(
        &include_bytes!("../../tests/data/golden-dev-requests.json.gz")[..],
    )
    .read_to_string(&mut text)
    .expect("fixture");
    let golden: serde_json::Value = serde_json::from_str(&text).expect("fixture");
    let seeds: Vec<Vec<u8>> = golden
        .as_array()
        .into_iter()
        .flatten()
        .map(|case| case["request"].to_string().into_bytes())
        .collect();
    let mut interesting: Vec<u32> = tokenizer.reserved_ids().into_iter().collect();
    for text in [
        "<",
        "</",
        " calls>",
        "invoke",
        " name=\"",
        "\">",
        "\n",
        "\n\n",
        "{",
        "}",
        "```json\n",
        "\"",
        "é",
        "\u{1d518}",
        " true",
        "false",
    ] {
        interesting.extend(tokenizer.encode_plain(text).expect("encodes"));
    }
    interesting.sort_unstable();
    let mut rng = Rng(seed | 1);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let (mut requests, mut streams) = (0u64, 0u64);
    let start = Instant::now();
    while Instant::now() < deadline {
        for _ in 0..50 {
            let pick = rng.below(seeds.len());
            let request = mutate(&mut rng, &seeds[pick]);
            let stream = token_stream(&mut rng, &interesting);
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                bodies::request_parsing(&request, &tokenizer);
                requests += 1;
                bodies::stream_parser(&stream, &tokenizer);
                streams += 1;
            }));
            if outcome.is_err() {
                let path = std::env::temp_dir().join("deepinfer-recipe-fuzz-crash.bin");
                let input = if requests == streams {
                    &request
                } else {
                    &stream
                };
                std::fs::write(&path, input).ok();
                eprintln!(
                    "panic after {requests} requests / {streams} streams; input saved to {}",
                    path.display()
                );
                std::process::exit(1);
            }
        }
    }
    println!(
        "fuzz_driver: {requests} request bodies and {streams} token streams in {:.1} s, seed {seed}, no panic",
        start.elapsed().as_secs_f64()
    );
}
