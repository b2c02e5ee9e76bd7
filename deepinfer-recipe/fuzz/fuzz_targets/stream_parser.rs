//! Random token ids (and chunking) through the stream parser: never a panic.
#![no_main]

use std::sync::{Arc, OnceLock};

use deepinfer_recipe::protocol::{ParsingOptions, ThinkingStart};
use deepinfer_recipe::{PromptTokenizer, StreamParser};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    static TOKENIZER: OnceLock<Arc<PromptTokenizer>> = OnceLock::new();
    let tokenizer = TOKENIZER.get_or_init(|| Arc::new(PromptTokenizer::deepseek_v4().unwrap()));
    let Some((&flags, rest)) = data.split_first() else { return };
    let options = ParsingOptions {
        parse_tool_calls: flags & 1 != 0,
        starts_in_tool_calls: flags & 2 != 0,
        parse_json_output: flags & 4 != 0,
        thinking: (flags & 8 != 0).then_some(ThinkingStart::ReasoningStart),
        stop_sequences: if flags & 16 != 0 { vec!["\n\n".into(), "</".into()] } else { Vec::new() },
    };
    let mut parser = StreamParser::new(Arc::clone(tokenizer), &options);
    let ids: Vec<u32> = rest
        .chunks(3)
        .map(|c| u32::from(c[0]) << 16 | u32::from(*c.get(1).unwrap_or(&0)) << 8 | u32::from(*c.get(2).unwrap_or(&0)))
        .map(|id| id % 130_000)
        .collect();
    for chunk in ids.chunks(1 + (flags as usize >> 5)) {
        parser.push_tokens(chunk);
    }
    parser.finish(None);
});
