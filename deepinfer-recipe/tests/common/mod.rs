//! Shared fixtures: the vendored tokenizer and the golden-dev data set
//! (renderings and parses by `deepseek-recipe` 0.2.0, copied from
//! `shared/oracle/recipe/golden-dev`).

#![allow(dead_code)]

use std::io::Read;

use deepinfer_recipe::PromptTokenizer;
// The vendored tokenizer and the grammar helpers live in the crate's `testing` module (each test
// binary uses some of them).
#[allow(unused_imports)]
pub use deepinfer_recipe::testing::{allowed, eos, grammar_vocab, mask_of, tokenizer};

fn gunzip(bytes: &[u8]) -> serde_json::Value {
    let mut text = String::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_string(&mut text)
        .expect("fixture decompresses");
    serde_json::from_str(&text).expect("fixture parses")
}

pub fn golden_requests() -> Vec<serde_json::Value> {
    let value = gunzip(include_bytes!("../data/golden-dev-requests.json.gz"));
    value.as_array().expect("a list").clone()
}

pub fn golden_outputs() -> Vec<serde_json::Value> {
    let value = gunzip(include_bytes!("../data/golden-dev-outputs.json.gz"));
    value.as_array().expect("a list").clone()
}

/// Deterministic prose with paragraphs, code and CJK, about `tokens` tokens.
pub fn corpus(tokenizer: &PromptTokenizer, tokens: usize) -> String {
    let words = [
        "the",
        "model",
        "reads",
        "every",
        "token",
        "of",
        "its",
        "prompt",
        "before",
        "answering",
        "photosynthesis",
        "converts",
        "light",
        "into",
        "chemical",
        "energy",
        "你好",
        "世界",
        "fn",
        "main()",
        "{",
        "}",
        "let",
        "x",
        "=",
        "42;",
        "println!(\"{x}\");",
        "über",
        "naïve",
    ];
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut paragraph = String::new();
    for line in 0..400 {
        for _ in 0..(8 + line % 9) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            paragraph.push_str(words[(state % words.len() as u64) as usize]);
            paragraph.push(' ');
        }
        paragraph.push_str(if line % 5 == 4 { ".\n\n" } else { ".\n" });
    }
    let per_paragraph = tokenizer.encode_plain(&paragraph).unwrap().len();
    paragraph.repeat(tokens.div_ceil(per_paragraph))
}
