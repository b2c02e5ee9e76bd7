//! Any bytes as a request body of each protocol: never a panic (the body is
//! shared with `examples/fuzz_driver`, which runs without nightly).
#![no_main]

use std::sync::OnceLock;

use deepinfer_recipe::PromptTokenizer;
use libfuzzer_sys::fuzz_target;

#[path = "../../examples/fuzz_driver/bodies.rs"]
mod bodies;

fuzz_target!(|data: &[u8]| {
    static TOKENIZER: OnceLock<PromptTokenizer> = OnceLock::new();
    let tokenizer = TOKENIZER.get_or_init(|| PromptTokenizer::deepseek_v4().unwrap());
    bodies::request_parsing(data, tokenizer);
});
