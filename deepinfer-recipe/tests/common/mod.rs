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
