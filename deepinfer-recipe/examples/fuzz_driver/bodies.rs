//! The fuzz bodies, shared by the `cargo fuzz` targets (`fuzz/`), the
//! libFuzzer-free driver (`examples/fuzz_driver`) and the smoke test
//! (`tests/fuzz_smoke.rs`). Each must never panic, whatever the input.

#![allow(dead_code)]

use std::sync::Arc;

use deepinfer_recipe::grammar::{GrammarBackend, GrammarSpec, GrammarVocab, RegexBackend};
use deepinfer_recipe::protocol::anthropic::MessagesRequest;
use deepinfer_recipe::protocol::chat::ChatRequest;
use deepinfer_recipe::protocol::responses::convert_request;
use deepinfer_recipe::protocol::{ConversionOptions, ParsingOptions, ThinkingStart};
use deepinfer_recipe::{EventBuffer, PromptTokenizer, Renderer, StreamParser};

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
    let mut buffered = StreamParser::new(Arc::clone(tokenizer), &options);
    let mut buffer = EventBuffer::new();
    let ids: Vec<u32> = rest
        .chunks(3)
        .map(|c| {
            u32::from(c[0]) << 16
                | u32::from(*c.get(1).unwrap_or(&0)) << 8
                | u32::from(*c.get(2).unwrap_or(&0))
        })
        .map(|id| id % 130_000)
        .collect();
    // The allocation-free path must give the very same events.
    for chunk in ids.chunks(1 + (flags as usize >> 5)) {
        let events = parser.push_tokens(chunk);
        buffered.push_tokens_buffered(chunk, &mut buffer);
        assert_eq!(buffer.to_events(), events, "buffered path differs");
        buffer.clear();
    }
    let events = parser.finish(None);
    buffered.finish_into(None, &mut buffer);
    assert_eq!(buffer.to_events(), events, "buffered finish differs");
}

/// Any bytes as a JSON schema, a regex or an EBNF grammar, compiled for a
/// small byte vocabulary and walked along the input: a typed error or a
/// working matcher, never a panic.
pub fn grammar(data: &[u8]) {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let spec = match kind % 3 {
        0 => match serde_json::from_str(text) {
            Ok(schema) => GrammarSpec::JsonSchema(schema),
            Err(_) => return,
        },
        1 => GrammarSpec::Regex(text.to_owned()),
        _ => GrammarSpec::Ebnf(text.to_owned()),
    };
    // Every single byte is a token, plus an end-of-sequence id.
    let mut tokens: Vec<Option<Vec<u8>>> = (0..=255u8).map(|b| Some(vec![b])).collect();
    tokens.push(None);
    let vocab = Arc::new(GrammarVocab::new(tokens, &[256], &[]));
    let backend = RegexBackend {
        dfa_size_limit: 4 << 20,
        max_depth: 64,
        ..RegexBackend::default()
    };
    let Ok(grammar) = backend.compile(&spec, &vocab) else {
        return;
    };
    let mut matcher = grammar.matcher();
    let mut mask = vec![0u32; vocab.mask_words()];
    for &byte in rest.iter().take(64) {
        if matcher.fill_bitmask(&mut mask).is_err() || matcher.accept(u32::from(byte)).is_err() {
            break;
        }
    }
    let _ = matcher.rollback(1);
}
