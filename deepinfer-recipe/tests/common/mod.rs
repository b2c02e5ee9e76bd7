//! Shared fixtures: the vendored tokenizer and the golden-dev data set
//! (renderings and parses by `deepseek-recipe` 0.2.0, copied from
//! `shared/oracle/recipe/golden-dev`).

#![allow(dead_code)]

use std::io::Read;
use std::sync::{Arc, OnceLock};

use deepinfer_recipe::PromptTokenizer;

pub fn tokenizer() -> Arc<PromptTokenizer> {
    static TOKENIZER: OnceLock<Arc<PromptTokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| Arc::new(PromptTokenizer::deepseek_v4().expect("vendored tokenizer loads")))
        .clone()
}

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

/// The grammar vocabulary of the vendored tokenizer (EOS ends a grammar, the DSML marker is
/// symbol 0), built once per test binary.
pub fn grammar_vocab() -> Arc<deepinfer_recipe::grammar::GrammarVocab> {
    static VOCAB: OnceLock<Arc<deepinfer_recipe::grammar::GrammarVocab>> = OnceLock::new();
    VOCAB
        .get_or_init(|| {
            let tokenizer = tokenizer();
            let dsml = tokenizer
                .special_id(deepinfer_recipe::SpecialToken::Dsml.deepseek_spelling())
                .unwrap();
            Arc::new(deepinfer_recipe::grammar::GrammarVocab::from_tokenizer(
                &tokenizer,
                &[eos()],
                &[(dsml, 0)],
            ))
        })
        .clone()
}

/// The vendored tokenizer's end-of-sequence id.
pub fn eos() -> u32 {
    tokenizer()
        .special_id(deepinfer_recipe::SpecialToken::Eos.deepseek_spelling())
        .unwrap()
}

/// Whether token `id` is allowed by a grammar bitmask.
pub fn allowed(mask: &[u32], id: u32) -> bool {
    mask[id as usize / 32] & (1 << (id % 32)) != 0
}

/// The matcher's current bitmask over [`grammar_vocab`].
pub fn mask_of(matcher: &mut dyn deepinfer_recipe::grammar::Matcher) -> Vec<u32> {
    let mut mask = vec![0u32; grammar_vocab().mask_words()];
    matcher.fill_bitmask(&mut mask).unwrap();
    mask
}
