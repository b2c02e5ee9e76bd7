//! The fuzz bodies, shared by the `cargo fuzz` targets (`fuzz/`), the
//! libFuzzer-free driver (`examples/fuzz_driver`) and the smoke test
//! (`tests/fuzz_smoke.rs`). Each must never panic, whatever the input.

#![allow(dead_code)]

use std::sync::Arc;

use deepinfer_recipe::protocol::anthropic::MessagesRequest;
use deepinfer_recipe::protocol::chat::ChatRequest;
use deepinfer_recipe::protocol::responses::convert_request;
use deepinfer_recipe::protocol::{ConversionOptions, ParsingOptions, ThinkingStart};
use deepinfer_recipe::{PromptTokenizer, Renderer, StreamParser};

/// Any bytes as a request body of each protocol; what converts is rendered
/// and encoded.
pub fn request_parsing(data: &[u8], tokenizer: &PromptTokenizer) {
    let Ok(body) = std::str::from_utf8(data) else {
        return;
    };
    let options = ConversionOptions::default();
    let converted = [
        ChatRequest::from_json(body).and_then(|r| r.convert(&options)),
        MessagesRequest::from_json(body).and_then(|r| r.convert(&options)),
        convert_request(body, &options),
    ];
    for request in converted.into_iter().flatten() {
        let rendered = Renderer::new(request.format).render(&request.conversation);
        // A V4.1 rendering may use `<｜System｜>`, which the V4 file lacks:
        // that is a typed error, not a panic.
        let _ = tokenizer.encode(&rendered);
    }
}

/// Token ids (3 bytes each) and chunking from `data`, with parsing options
/// from its first byte, through the stream parser.
pub fn stream_parser(data: &[u8], tokenizer: &Arc<PromptTokenizer>) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let options = ParsingOptions {
        parse_tool_calls: flags & 1 != 0,
        starts_in_tool_calls: flags & 2 != 0,
        parse_json_output: flags & 4 != 0,
        thinking: (flags & 8 != 0).then_some(ThinkingStart::ReasoningStart),
        stop_sequences: if flags & 16 != 0 {
            vec!["\n\n".into(), "</".into()]
        } else {
            Vec::new()
        },
    };
    let mut parser = StreamParser::new(Arc::clone(tokenizer), &options);
    let ids: Vec<u32> = rest
        .chunks(3)
        .map(|c| {
            u32::from(c[0]) << 16
                | u32::from(*c.get(1).unwrap_or(&0)) << 8
                | u32::from(*c.get(2).unwrap_or(&0))
        })
        .map(|id| id % 130_000)
        .collect();
    for chunk in ids.chunks(1 + (flags as usize >> 5)) {
        parser.push_tokens(chunk);
    }
    parser.finish(None);
}
