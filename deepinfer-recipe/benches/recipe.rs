//! Benchmarks: 1M-token prompt encoding (parallel vs one sequential pass),
//! stream parser throughput, render + encode of the golden-dev requests (the
//! side-by-side run with `deepseek-recipe-encoding` 0.2.0 is in
//! `reference-check/`), and grammar compile / mask-fill time for the
//! golden-dev JSON schemas.

#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use deepinfer_recipe::grammar::{GrammarBackend, GrammarSpec, GrammarVocab, RegexBackend};
use deepinfer_recipe::protocol::chat::ChatRequest;
use deepinfer_recipe::protocol::{ConversionOptions, ParsingOptions, ThinkingStart};
use deepinfer_recipe::{
    Conversation, EventBuffer, Message, PromptFormat, PromptTokenizer, Renderer, SpecialToken,
    StreamParser,
};

fn tokenizer_with_system() -> Arc<PromptTokenizer> {
    Arc::new(
        PromptTokenizer::deepseek_v4()
            .unwrap()
            .with_special_id(SpecialToken::System.deepseek_spelling(), 129_280),
    )
}

fn encode_million(c: &mut Criterion) {
    let tokenizer = tokenizer_with_system();
    let text = common::corpus(&tokenizer, 1_000_000);
    let rendered =
        Renderer::new(PromptFormat::V4).render(&Conversation::new(vec![Message::user(text)]));
    let tokens = tokenizer.encode_sequential(&rendered).unwrap().len();
    assert_eq!(tokenizer.encode(&rendered).unwrap().len(), tokens);
    let mut group = c.benchmark_group("encode_1m_tokens");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(3));
    group.throughput(Throughput::Elements(tokens as u64));
    group.bench_function("parallel", |b| {
        b.iter(|| tokenizer.encode(black_box(&rendered)).unwrap())
    });
    group.bench_function("sequential", |b| {
        b.iter(|| tokenizer.encode_sequential(black_box(&rendered)).unwrap())
    });
    group.finish();
}

/// This crate's byte-level BPE against the `tokenizers` pipeline it
/// replaces, on the same 50,000-token text (same ids checked first).
fn encode_plain_paths(c: &mut Criterion) {
    let tokenizer = tokenizer_with_system();
    let text = common::corpus(&tokenizer, 50_000);
    let ids = tokenizer.encode_plain(&text).unwrap();
    assert!(tokenizer.has_fast_path());
    assert_eq!(tokenizer.encode_plain_tokenizers(&text).unwrap(), ids);
    let mut group = c.benchmark_group("encode_plain_50k_tokens");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(2));
    group.throughput(Throughput::Elements(ids.len() as u64));
    group.bench_function("byte_bpe", |b| {
        b.iter(|| tokenizer.encode_plain(black_box(&text)).unwrap())
    });
    group.bench_function("tokenizers_pipeline", |b| {
        b.iter(|| tokenizer.encode_plain_tokenizers(black_box(&text)).unwrap())
    });
    group.finish();
}

fn stream_parser(c: &mut Criterion) {
    let tokenizer = tokenizer_with_system();
    let think_end = tokenizer.special_id("</think>").unwrap();
    let mut ids = tokenizer
        .encode_plain(&common::corpus(&tokenizer, 50_000))
        .unwrap();
    ids.push(think_end);
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
    let mut group = c.benchmark_group("stream_parser");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(2));
    group.throughput(Throughput::Elements(ids.len() as u64));
    // Streaming work only: `finish` re-encodes the reasoning text to count
    // its tokens (as the reference does), which is tokenizer time.
    // Three APIs on the same stream, in the same run: `push_tokens` (a new
    // Vec per push), `push_tokens_into` (a reused Vec, one String per text
    // event) and `push_tokens_buffered` (a reused EventBuffer: no allocation
    // per push once it has grown).
    for chunk in [1usize, 16] {
        group.bench_function(format!("push_tokens/{chunk}"), |b| {
            b.iter(|| {
                let mut parser = StreamParser::new(Arc::clone(&tokenizer), &options);
                let mut count = 0;
                for piece in ids.chunks(chunk) {
                    count += parser.push_tokens(piece).len();
                }
                count
            })
        });
        group.bench_function(format!("push_tokens_into/{chunk}"), |b| {
            b.iter(|| {
                let mut parser = StreamParser::new(Arc::clone(&tokenizer), &options);
                let mut events = Vec::with_capacity(64);
                let mut count = 0;
                for piece in ids.chunks(chunk) {
                    parser.push_tokens_into(piece, &mut events);
                    count += events.len();
                    events.clear();
                }
                count
            })
        });
        group.bench_function(format!("push_tokens_buffered/{chunk}"), |b| {
            b.iter(|| {
                let mut parser = StreamParser::new(Arc::clone(&tokenizer), &options);
                let mut events = EventBuffer::with_capacity(64, 4096);
                let mut count = 0;
                for piece in ids.chunks(chunk) {
                    parser.push_tokens_buffered(piece, &mut events);
                    count += events.len();
                    events.clear();
                }
                count
            })
        });
    }
    group.bench_function("tokens_per_push_16_with_finish", |b| {
        b.iter(|| {
            let mut parser = StreamParser::new(Arc::clone(&tokenizer), &options);
            let mut events = 0;
            for piece in ids.chunks(16) {
                events += parser.push_tokens(piece).len();
            }
            events + parser.finish(None).len()
        })
    });
    group.finish();
}

fn golden_render_encode(c: &mut Criterion) {
    // The side-by-side run against `deepseek-recipe-encoding` 0.2.0 lives in
    // `reference-check/benches/side_by_side.rs` (outside the workspace).
    let tokenizer = tokenizer_with_system();
    let conversations: Vec<(PromptFormat, Conversation)> = common::golden_requests()
        .iter()
        .filter(|case| case["error"].is_null())
        .map(|case| {
            let converted = ChatRequest::from_json(&case["request"].to_string())
                .and_then(|r| r.convert(&ConversionOptions::default()))
                .unwrap();
            (converted.format, converted.conversation)
        })
        .collect();
    let mut group = c.benchmark_group("golden_dev_render_encode");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(2));
    group.throughput(Throughput::Elements(conversations.len() as u64));
    group.bench_function("deepinfer_recipe", |b| {
        b.iter(|| {
            let mut total = 0;
            for (format, conversation) in &conversations {
                let rendered = Renderer::new(*format).render(conversation);
                total += tokenizer.encode(&rendered).unwrap().len();
            }
            total
        })
    });
    group.finish();
}

fn grammar(c: &mut Criterion) {
    let tokenizer = tokenizer_with_system();
    let eos = tokenizer
        .special_id(SpecialToken::Eos.deepseek_spelling())
        .unwrap();
    let dsml = tokenizer
        .special_id(SpecialToken::Dsml.deepseek_spelling())
        .unwrap();
    let vocab = Arc::new(GrammarVocab::from_tokenizer(
        &tokenizer,
        &[eos],
        &[(dsml, 0)],
    ));
    let schemas: Vec<serde_json::Value> = common::golden_requests()
        .iter()
        .flat_map(|case| {
            let request = &case["request"];
            let mut found = Vec::new();
            if let Some(schema) = request.pointer("/response_format/json_schema/schema") {
                found.push(schema.clone());
            }
            for tool in request["tools"].as_array().into_iter().flatten() {
                if let Some(parameters) = tool.pointer("/function/parameters") {
                    found.push(parameters.clone());
                }
            }
            found
        })
        .collect();
    let backend = RegexBackend::default();
    let mut group = c.benchmark_group("grammar");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(2));
    group.bench_function("compile_golden_schemas", |b| {
        b.iter(|| {
            schemas
                .iter()
                .filter(|schema| {
                    backend
                        .compile(&GrammarSpec::JsonSchema((*schema).clone()), &vocab)
                        .is_ok()
                })
                .count()
        })
    });
    // Mask fill per token along a valid document, first visit of each state
    // (uncached) and steady state (cached).
    let schema = serde_json::json!({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]});
    let document = tokenizer
        .encode_plain(r#"{"city": "Paris, the capital of France", "days": 14}"#)
        .unwrap();
    group.throughput(Throughput::Elements(document.len() as u64));
    group.bench_function("mask_fill_per_document_uncached", |b| {
        b.iter(|| {
            let grammar = backend
                .compile(&GrammarSpec::JsonSchema(schema.clone()), &vocab)
                .unwrap();
            let mut matcher = grammar.matcher();
            let mut mask = vec![0u32; vocab.mask_words()];
            for &id in &document {
                matcher.fill_bitmask(&mut mask).unwrap();
                matcher.accept(id).unwrap();
            }
        })
    });
    let grammar = backend
        .compile(&GrammarSpec::JsonSchema(schema), &vocab)
        .unwrap();
    group.bench_function("mask_fill_per_document_cached", |b| {
        b.iter(|| {
            let mut matcher = grammar.matcher();
            let mut mask = vec![0u32; vocab.mask_words()];
            for &id in &document {
                matcher.fill_bitmask(&mut mask).unwrap();
                matcher.accept(id).unwrap();
            }
        })
    });
    // The pushdown path: `json_object` (unbounded nesting) and a recursive
    // tree schema, compile time and mask fill per token (per element).
    let tree = serde_json::json!({
        "type": "object",
        "properties": {
            "value": {"type": "integer"},
            "children": {"type": "array", "items": {"$ref": "#"}},
        },
        "required": ["value"],
    });
    let recursive = [
        (
            "json_object",
            GrammarSpec::JsonObject,
            r#"{"user": {"name": "Ann", "tags": ["a", "b", {"k": [1, 2.5, null]}]}, "ok": true, "n": -3}"#,
        ),
        (
            "tree_schema",
            GrammarSpec::JsonSchema(tree),
            r#"{"value": 1, "children": [{"value": 2, "children": [{"value": 3}]}, {"value": 4, "children": []}]}"#,
        ),
    ];
    group.throughput(Throughput::Elements(1));
    for (name, spec, _) in &recursive {
        group.bench_function(format!("compile_{name}"), |b| {
            b.iter(|| backend.compile(spec, &vocab).unwrap())
        });
    }
    for (name, spec, text) in &recursive {
        let document = tokenizer.encode_plain(text).unwrap();
        group.throughput(Throughput::Elements(document.len() as u64));
        group.bench_function(format!("mask_fill_{name}_uncached"), |b| {
            b.iter(|| {
                let grammar = backend.compile(spec, &vocab).unwrap();
                let mut matcher = grammar.matcher();
                let mut mask = vec![0u32; vocab.mask_words()];
                for &id in &document {
                    matcher.fill_bitmask(&mut mask).unwrap();
                    matcher.accept(id).unwrap();
                }
            })
        });
        let grammar = backend.compile(spec, &vocab).unwrap();
        group.bench_function(format!("mask_fill_{name}_cached"), |b| {
            b.iter(|| {
                let mut matcher = grammar.matcher();
                let mut mask = vec![0u32; vocab.mask_words()];
                for &id in &document {
                    matcher.fill_bitmask(&mut mask).unwrap();
                    matcher.accept(id).unwrap();
                }
            })
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    encode_million,
    encode_plain_paths,
    stream_parser,
    golden_render_encode,
    grammar
);
criterion_main!(benches);
