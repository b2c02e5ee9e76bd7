//! Random token ids (and chunking) through the stream parser: never a panic
//! (the body is shared with `examples/fuzz_driver`).
#![no_main]

use std::sync::{Arc, OnceLock};

use deepinfer_recipe::PromptTokenizer;
use libfuzzer_sys::fuzz_target;

#[path = "../../examples/fuzz_driver/bodies.rs"]
mod bodies;

fuzz_target!(|data: &[u8]| {
    static TOKENIZER: OnceLock<Arc<PromptTokenizer>> = OnceLock::new();
    let tokenizer = TOKENIZER.get_or_init(|| Arc::new(PromptTokenizer::deepseek_v4().unwrap()));
    bodies::stream_parser(data, tokenizer);
});
