//! Throughput of prompt encoding, of the stream parser and of grammar mask
//! fill, in wall time and in this process's CPU time (useful on a shared,
//! loaded machine).
//!
//! `cargo run --release --example throughput -p deepinfer-recipe [encode|parser|grammar]`
//!
//! `grammar` compares the DFA path (a flat schema) with the pushdown path
//! (`json_object`, a recursive tree schema): per token, one mask fill and one
//! accept along a document, with every state already cached (steady state)
//! and from a fresh compile (first visits). `GRAMMAR=dfa|json_object|tree`
//! runs one; for instruction counts of the cached walks, run it under
//! `valgrind --tool=callgrind --toggle-collect='*measured_walk*'` (with
//! `FIRST=0` to skip the first-visit runs).

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use deepinfer_recipe::grammar::{
    CompiledGrammar, GrammarBackend, GrammarSpec, GrammarVocab, RegexBackend,
};
use deepinfer_recipe::protocol::{ParsingOptions, ThinkingStart};
use deepinfer_recipe::{
    Conversation, EventBuffer, Message, PromptFormat, PromptTokenizer, Renderer, SpecialToken,
    StreamParser,
};

/// One mask fill and one accept per token along `ids` (states cached).
#[inline(never)]
fn steady_walk(grammar: &dyn CompiledGrammar, ids: &[u32], mask: &mut [u32]) {
    let mut matcher = grammar.matcher();
    for &id in ids {
        matcher.fill_bitmask(mask).expect("mask");
        matcher.accept(id).expect("accept");
    }
}

/// [`steady_walk`] for the measured repetitions only.
#[inline(never)]
fn measured_walk(grammar: &dyn CompiledGrammar, ids: &[u32], mask: &mut [u32]) {
    steady_walk(grammar, ids, mask);
}

fn grammar_cases(tokenizer: &Arc<PromptTokenizer>) {
    let eos = tokenizer
        .special_id(SpecialToken::Eos.deepseek_spelling())
        .expect("eos");
    let vocab = Arc::new(GrammarVocab::from_tokenizer(tokenizer, &[eos], &[]));
    let cases = [
        (
            "dfa",
            GrammarSpec::JsonSchema(serde_json::json!({
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            })),
            r#"{"city": "Paris, the capital of France", "days": 14}"#,
        ),
        (
            "json_object",
            GrammarSpec::JsonObject,
            r#"{"user": {"name": "Ann", "tags": ["a", "b", {"k": [1, 2.5, null]}]}, "ok": true, "n": -3}"#,
        ),
        (
            "tree",
            GrammarSpec::JsonSchema(serde_json::json!({
                "type": "object",
                "properties": {
                    "value": {"type": "integer"},
                    "children": {"type": "array", "items": {"$ref": "#"}},
                },
                "required": ["value"],
            })),
            r#"{"value": 1, "children": [{"value": 2, "children": [{"value": 3}]}, {"value": 4, "children": []}]}"#,
        ),
    ];
    let only = std::env::var("GRAMMAR").unwrap_or_default();
    let reps = std::env::var("REPS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(200);
    let backend = RegexBackend::default();
    let mut mask = vec![0u32; vocab.mask_words()];
    for (name, spec, text) in cases {
        if !only.is_empty() && only != name {
            continue;
        }
        let ids = tokenizer.encode_plain(text).expect("encode");
        let grammar = backend.compile(&spec, &vocab).expect("compile");
        steady_walk(grammar.as_ref(), &ids, &mut mask);
        measure(
            &format!(
                "grammar {name}: fill + accept per token, cached ({} tokens)",
                ids.len()
            ),
            ids.len(),
            reps,
            || measured_walk(grammar.as_ref(), &ids, &mut mask),
        );
        if std::env::var("FIRST").is_ok_and(|f| f == "0") {
            continue;
        }
        measure(
            &format!("grammar {name}: compile + walk, first visits"),
            ids.len(),
            3,
            || {
                let fresh = backend.compile(&spec, &vocab).expect("compile");
                steady_walk(fresh.as_ref(), &ids, &mut mask);
            },
        );
    }
}

/// CPU time (user + system) of this process so far.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name: utime is 14th, stime 15th (1-based).
    let fields: Vec<&str> = stat.rsplit(") ").next().unwrap_or("").split(' ').collect();
    let ticks: u64 = fields.get(11).and_then(|f| f.parse().ok()).unwrap_or(0)
        + fields.get(12).and_then(|f| f.parse().ok()).unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

fn measure(label: &str, units: usize, reps: u32, mut run: impl FnMut()) {
    let (wall, cpu) = (Instant::now(), cpu_time());
    for _ in 0..reps {
        run();
    }
    let wall = wall.elapsed() / reps;
    let cpu = (cpu_time() - cpu) / reps;
    println!(
        "{label}: {wall:?} wall ({:.2} M/s), {cpu:?} cpu ({:.2} M/s per cpu-second)",
        units as f64 / wall.as_secs_f64() / 1e6,
        units as f64 / cpu.as_secs_f64().max(1e-9) / 1e6
    );
}

fn main() {
    let load = Instant::now();
    let tokenizer = Arc::new(PromptTokenizer::deepseek_v4().expect("vendored tokenizer"));
    println!("load: {:?}", load.elapsed());
    let what = std::env::args().nth(1).unwrap_or_default();
    if what.is_empty() || what == "encode" {
        let text = common::corpus(&tokenizer, 1_000_000);
        let rendered =
            Renderer::new(PromptFormat::V4).render(&Conversation::new(vec![Message::user(text)]));
        let n = tokenizer.encode_sequential(&rendered).unwrap().len();
        measure("encode 1M sequential", n, 5, || {
            drop(tokenizer.encode_sequential(&rendered))
        });
        measure("encode 1M parallel", n, 5, || {
            drop(tokenizer.encode(&rendered))
        });
    }
    if what.is_empty() || what == "grammar" {
        grammar_cases(&tokenizer);
    }
    if what.is_empty() || what == "parser" {
        let mut ids = tokenizer
            .encode_plain(&common::corpus(&tokenizer, 50_000))
            .unwrap();
        ids.push(tokenizer.special_id("</think>").unwrap());
        ids.extend(
            tokenizer
                .encode_plain(&common::corpus(&tokenizer, 50_000))
                .unwrap(),
        );
        let options = ParsingOptions {
            parse_tool_calls: true,
            starts_in_tool_calls: false,
            parse_json_output: false,
            thinking: Some(ThinkingStart::ReasoningStart),
            stop_sequences: vec!["<|stop|>".into()],
        };
        let reps = std::env::var("REPS")
            .ok()
            .and_then(|r| r.parse().ok())
            .unwrap_or(20);
        // `CHUNKS=1` picks the push sizes (e.g. for a callgrind run).
        let chunks: Vec<usize> = std::env::var("CHUNKS")
            .unwrap_or_else(|_| "1,16".into())
            .split(',')
            .filter_map(|c| c.trim().parse().ok())
            .collect();
        // Tables built on first use are not part of the measurement.
        let _ = (tokenizer.token_bytes(), tokenizer.token_texts());
        // `API=into` or `API=buffered` runs one of the two.
        let api = std::env::var("API").unwrap_or_default();
        for chunk in chunks {
            if api != "buffered" {
                measure(
                    &format!("parser (push_tokens_into), {chunk} tokens per push"),
                    ids.len(),
                    reps,
                    || {
                        let mut parser = StreamParser::new(Arc::clone(&tokenizer), &options);
                        let mut events = Vec::with_capacity(64);
                        for piece in ids.chunks(chunk) {
                            parser.push_tokens_into(piece, &mut events);
                            events.clear();
                        }
                    },
                );
            }
            if api != "into" {
                measure(
                    &format!("parser (push_tokens_buffered), {chunk} tokens per push"),
                    ids.len(),
                    reps,
                    || {
                        let mut parser = StreamParser::new(Arc::clone(&tokenizer), &options);
                        let mut events = EventBuffer::with_capacity(64, 4096);
                        for piece in ids.chunks(chunk) {
                            parser.push_tokens_buffered(piece, &mut events);
                            events.clear();
                        }
                    },
                );
            }
        }
    }
}
