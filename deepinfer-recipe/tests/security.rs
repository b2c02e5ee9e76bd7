//! Security properties of the trust boundary, and round trips.
//!
//! - Special-token spellings in any user-controlled field never produce a
//!   reserved id outside the template's own special ranges.
//! - The output parser fed ordinary-token spellings of markup emits text.
//! - render → encode → decode returns the prompt text; parallel encoding
//!   equals sequential encoding.

mod common;

use deepinfer_recipe::conversation::{Conversation, Message};
use deepinfer_recipe::protocol::{ParsingOptions, ThinkingStart};
use deepinfer_recipe::testing::{
    GROUNDING, check_trust_boundary, conversation_fields as fields, hostile_text,
};
use deepinfer_recipe::{
    Event, PromptFormat, PromptTokenizer, Renderer, SpecialToken, StreamParser,
};
use proptest::prelude::*;

/// The V4 vocabulary plus an id for `<｜System｜>` (as a V4.1 deployment configures it).
fn v41_tokenizer() -> &'static PromptTokenizer {
    static TOKENIZER: std::sync::OnceLock<PromptTokenizer> = std::sync::OnceLock::new();
    TOKENIZER.get_or_init(|| {
        PromptTokenizer::deepseek_v4()
            .unwrap()
            .with_special_id(SpecialToken::System.deepseek_spelling(), 129_300)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn user_controlled_spellings_never_become_reserved_ids(f in fields(), thinking in any::<bool>()) {
        for format in [PromptFormat::V4, PromptFormat::V41] {
            // One reserved id per special range of the template; the template's special
            // tokens are those of the same conversation with every user-controlled field
            // replaced by "x"; decoding the ids gives back the prompt text.
            check_trust_boundary(v41_tokenizer(), format, &f, thinking).map_err(TestCaseError::fail)?;
        }
    }

    #[test]
    fn grounding_tokens_in_assistant_history_are_the_only_extra_specials(
        answer in hostile_text(true),
    ) {
        let conversation = Conversation::new(vec![
            Message::user("q"),
            Message::assistant(answer.clone()),
            Message::user("r"),
        ]);
        let rendered = Renderer::new(PromptFormat::V41).render(&conversation);
        let grounding = GROUNDING.iter().map(|g| answer.matches(g).count()).sum::<usize>();
        let base = Renderer::new(PromptFormat::V41)
            .render(&Conversation::new(vec![
                Message::user("q"),
                Message::assistant("x"),
                Message::user("r"),
            ]))
            .special_ranges
            .len();
        prop_assert_eq!(rendered.special_ranges.len(), base + grounding);
    }

    #[test]
    fn parser_reads_markup_spelled_with_ordinary_tokens_as_text(
        text in hostile_text(true),
        cuts in proptest::collection::vec(1usize..6, 0..40),
        reasoning in any::<bool>(),
    ) {
        let tokenizer = common::tokenizer();
        let ids = tokenizer.encode_plain(&text).unwrap();
        let options = ParsingOptions {
            parse_tool_calls: true,
            starts_in_tool_calls: false,
            parse_json_output: false,
            thinking: reasoning.then_some(ThinkingStart::ReasoningStart),
            stop_sequences: Vec::new(),
        };
        let mut parser = StreamParser::new(tokenizer.clone(), &options);
        let mut events = Vec::new();
        let mut rest = ids.as_slice();
        let mut cut = cuts.iter().cycle();
        while !rest.is_empty() {
            let n = (*cut.next().unwrap_or(&1)).min(rest.len());
            events.extend(parser.push_tokens(&rest[..n]));
            rest = &rest[n..];
        }
        events.extend(parser.finish(None));
        let mut out = String::new();
        for event in &events {
            match event {
                Event::Reasoning(t) if reasoning => out.push_str(t),
                Event::Content(t) if !reasoning => out.push_str(t),
                Event::Finish { .. } => {}
                other => prop_assert!(false, "unexpected event {:?}", other),
            }
        }
        prop_assert_eq!(out, text.trim_start_matches('\n'));
    }

    #[test]
    fn parser_never_panics_on_random_ids(
        ids in proptest::collection::vec(0u32..130_000, 0..200),
        tools in any::<bool>(),
        json in any::<bool>(),
    ) {
        let options = ParsingOptions {
            parse_tool_calls: tools,
            starts_in_tool_calls: false,
            parse_json_output: json,
            thinking: Some(ThinkingStart::ReasoningStart),
            stop_sequences: vec!["</".into(), "\n\n".into()],
        };
        let mut parser = StreamParser::new(common::tokenizer(), &options);
        for chunk in ids.chunks(3) {
            parser.push_tokens(chunk);
        }
        let events = parser.finish(None);
        let is_finish = matches!(events.last(), Some(Event::Finish { .. }));
        prop_assert!(is_finish);
    }
}

proptest! {
    // Long texts: few cases keep the suite fast.
    #![proptest_config(ProptestConfig::with_cases(6))]

    #[test]
    fn parallel_encoding_equals_sequential(
        lines in proptest::collection::vec("[ \\ta-zA-Z0-9.,;:!?'\"()\\[\\]{}<>/\\\\|\\u{4e00}-\\u{4e10}\\u{00e9}\\u{0301}-]{0,40}", 1..400),
        newline_runs in proptest::collection::vec(1usize..4, 1..400),
    ) {
        let tokenizer = common::tokenizer();
        let mut text = String::new();
        for (line, run) in lines.iter().zip(newline_runs.iter().cycle()) {
            text.push_str(line);
            text.push_str(&"\n".repeat(*run));
        }
        // Long enough for the parallel path (64 KiB) and many cuts (16 KiB).
        let text = text.repeat(1 + 100_000 / text.len().max(1));
        let rendered = Renderer::new(PromptFormat::V41)
            .render(&Conversation { thinking: false, ..Conversation::new(vec![Message::user(text)]) });
        let tokenizer_v41 = v41_tokenizer();
        let _ = tokenizer;
        prop_assert_eq!(
            tokenizer_v41.encode(&rendered).unwrap(),
            tokenizer_v41.encode_sequential(&rendered).unwrap()
        );
    }

}

#[test]
fn tokenizer_without_the_system_token_reports_it() {
    let tokenizer = common::tokenizer();
    let rendered =
        Renderer::new(PromptFormat::V41).render(&Conversation::new(vec![Message::user("hi")]));
    let error = tokenizer.encode(&rendered).unwrap_err();
    assert!(error.to_string().contains("<｜System｜>"), "{error}");
}

/// A user argument key equal to the generator's fixed key: the blank conversation must have
/// the same number of arguments, or the comparison reports markup the template never had.
#[test]
fn argument_key_equal_to_the_fixed_key_keeps_the_template() {
    let f = deepinfer_recipe::testing::ConversationFields {
        system: String::new(),
        user: String::new(),
        reasoning: String::new(),
        answer: String::new(),
        call_name: String::new(),
        arg_key: "n".into(),
        arg_value: String::new(),
        result: String::new(),
        tool_name: String::new(),
        tool_description: String::new(),
        reminder: String::new(),
    };
    for format in [PromptFormat::V4, PromptFormat::V41] {
        for thinking in [false, true] {
            check_trust_boundary(v41_tokenizer(), format, &f, thinking).unwrap();
        }
    }
}
