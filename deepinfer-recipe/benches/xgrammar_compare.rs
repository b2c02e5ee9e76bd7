//! xgrammar vs the regex backend, same run (feature `xgrammar`): compile
//! time of the golden-dev JSON schemas, and mask fill + accept per token
//! along a valid document for each schema.
//!
//! `cargo bench -p deepinfer-recipe --features xgrammar --bench xgrammar_compare`

#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use deepinfer_recipe::SpecialToken;
use deepinfer_recipe::grammar::{
    CompiledGrammar, GrammarBackend, GrammarSpec, GrammarVocab, RegexBackend, XGrammarBackend,
};

/// The golden-dev schemas (response formats and tool parameters, each
/// once) with a document each follows.
fn schemas_and_documents() -> Vec<(serde_json::Value, &'static str)> {
    let documents = [
        r#"{"name": "Ann", "age": 31, "tags": ["a", "b"]}"#,
        r#"{"location": "Paris", "days": 3, "unit": "celsius"}"#,
        r#"{"query": "rust", "filters": {"tags": ["x"]}, "limit": 5, "exact": true, "mode": null}"#,
        r#"{"title": "Fix it", "priority": 2, "labels": ["bug"]}"#,
    ];
    let mut schemas: Vec<serde_json::Value> = Vec::new();
    for case in common::golden_requests() {
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
        for schema in found {
            if schema.is_object() && !schemas.contains(&schema) {
                schemas.push(schema);
            }
        }
    }
    // Each schema with the first document it accepts whole.
    let tokenizer = common::tokenizer();
    let vocab = vocab();
    schemas
        .into_iter()
        .map(|schema| {
            let grammar = RegexBackend::default()
                .compile(&GrammarSpec::JsonSchema(schema.clone()), &vocab)
                .unwrap();
            let document = documents
                .iter()
                .find(|document| {
                    let mut matcher = grammar.matcher();
                    tokenizer
                        .encode_plain(document)
                        .unwrap()
                        .iter()
                        .all(|&id| matcher.accept(id).is_ok())
                        && matcher.is_complete()
                })
                .expect("a document for every golden-dev schema");
            (schema, *document)
        })
        .collect()
}

fn vocab() -> Arc<GrammarVocab> {
    let tokenizer = common::tokenizer();
    let eos = tokenizer
        .special_id(SpecialToken::Eos.deepseek_spelling())
        .unwrap();
    let dsml = tokenizer
        .special_id(SpecialToken::Dsml.deepseek_spelling())
        .unwrap();
    Arc::new(GrammarVocab::from_tokenizer(
        &tokenizer,
        &[eos],
        &[(dsml, 0)],
    ))
}

/// A schema compiled by both backends, and a document's token ids.
type Walk = (Arc<dyn CompiledGrammar>, Arc<dyn CompiledGrammar>, Vec<u32>);

fn walk(grammar: &dyn CompiledGrammar, ids: &[u32], mask: &mut [u32]) {
    let mut matcher = grammar.matcher();
    for &id in ids {
        matcher.fill_bitmask(mask).unwrap();
        matcher.accept(id).unwrap();
    }
    black_box(&mask);
}

fn compare(c: &mut Criterion) {
    let tokenizer = common::tokenizer();
    let vocab = vocab();
    let cases = schemas_and_documents();
    let regex = RegexBackend::default();
    let xgrammar = XGrammarBackend::new(1);
    // Build xgrammar's vocabulary description once, outside the timings.
    xgrammar.duplicate_tokens(&vocab).unwrap();
    let backends: [(&str, &dyn GrammarBackend); 2] = [("regex", &regex), ("xgrammar", &xgrammar)];

    let mut group = c.benchmark_group("xgrammar_compare");
    group.sample_size(10);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));
    for (name, backend) in backends {
        group.bench_function(format!("compile_golden_schemas/{name}"), |b| {
            b.iter(|| {
                for (schema, _) in &cases {
                    black_box(
                        backend
                            .compile(&GrammarSpec::JsonSchema(schema.clone()), &vocab)
                            .unwrap(),
                    );
                }
            })
        });
    }
    let documents: Vec<Walk> = cases
        .iter()
        .map(|(schema, document)| {
            let spec = GrammarSpec::JsonSchema(schema.clone());
            (
                regex.compile(&spec, &vocab).unwrap(),
                xgrammar.compile(&spec, &vocab).unwrap(),
                tokenizer.encode_plain(document).unwrap(),
            )
        })
        .collect();
    let tokens: usize = documents.iter().map(|(_, _, ids)| ids.len()).sum();
    group.throughput(Throughput::Elements(tokens as u64));
    let mut mask = vec![0u32; vocab.mask_words()];
    // The regex backend caches masks per DFA state: after the first
    // iteration every state of these documents is cached.
    group.bench_function("mask_fill_per_token/regex_cached", |b| {
        b.iter(|| {
            for (grammar, _, ids) in &documents {
                walk(grammar.as_ref(), ids, &mut mask);
            }
        })
    });
    group.bench_function("mask_fill_per_token/xgrammar", |b| {
        b.iter(|| {
            for (_, grammar, ids) in &documents {
                walk(grammar.as_ref(), ids, &mut mask);
            }
        })
    });
    // First visit of every state: compile + walk, minus compile alone.
    for (name, backend) in backends {
        group.bench_function(format!("compile_and_walk/{name}"), |b| {
            b.iter(|| {
                for ((schema, _), (_, _, ids)) in cases.iter().zip(&documents) {
                    let grammar = backend
                        .compile(&GrammarSpec::JsonSchema(schema.clone()), &vocab)
                        .unwrap();
                    walk(grammar.as_ref(), ids, &mut mask);
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, compare);
criterion_main!(benches);
