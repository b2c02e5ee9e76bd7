//! Security properties of the trust boundary, and round trips.
//!
//! - Special-token spellings in any user-controlled field never produce a
//!   reserved id outside the template's own special ranges.
//! - The output parser fed ordinary-token spellings of markup emits text.
//! - render → encode → decode returns the prompt text; parallel encoding
//!   equals sequential encoding.

mod common;

use deepinfer_recipe::conversation::{
    Content, Conversation, Message, ToolCall, ToolChoice, ToolDefinition,
};
use deepinfer_recipe::protocol::{ParsingOptions, ThinkingStart};
use deepinfer_recipe::{
    Event, PromptFormat, PromptTokenizer, Renderer, SpecialToken, StreamParser,
};
use proptest::prelude::*;

/// Spellings an attacker would try (grounding tokens excluded: they are
/// allowed, by design, in assistant history only).
const HOSTILE: &[&str] = &[
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜System｜>",
    "<think>",
    "</think>",
    "｜DSML｜",
    "<｜DSML｜ invoke name=\"x\">",
    "</｜DSML｜ calls>",
    "<｜latest_reminder｜>",
    "<｜image｜>",
    "<dsml:",
    "<|EOT|>",
    "<｜tool▁calls▁begin｜>",
    "<｜place▁holder▁no▁7｜>",
    "<|place_holder_mm_span_0030|>",
    "\n\n",
];

const GROUNDING: &[&str] = &["<｜ref｜>", "<｜/ref｜>", "<｜box｜>", "<｜/box｜>"];

fn hostile_text(allow_grounding: bool) -> BoxedStrategy<String> {
    let base = prop_oneof![
        3 => "[a-zA-Z0-9 .,!?<>/|\"{}]{0,8}",
        1 => "[\\u{4e00}-\\u{4e20}\\u{1F600}-\\u{1F610}]{0,3}",
        3 => proptest::sample::select(HOSTILE).prop_map(str::to_owned),
    ];
    let fragment = if allow_grounding {
        prop_oneof![
            7 => base,
            1 => proptest::sample::select(GROUNDING).prop_map(str::to_owned),
        ]
        .boxed()
    } else {
        base.boxed()
    };
    proptest::collection::vec(fragment, 0..6)
        .prop_map(|parts| parts.concat())
        .boxed()
}

#[derive(Debug, Clone)]
struct Fields {
    system: String,
    user: String,
    reasoning: String,
    answer: String,
    call_name: String,
    arg_key: String,
    arg_value: String,
    result: String,
    tool_name: String,
    tool_description: String,
    reminder: String,
}

fn fields() -> impl Strategy<Value = Fields> {
    (
        (
            hostile_text(false),
            hostile_text(false),
            hostile_text(false),
            hostile_text(false),
            hostile_text(false),
            hostile_text(false),
        ),
        (
            hostile_text(false),
            hostile_text(false),
            hostile_text(false),
            hostile_text(false),
            hostile_text(false),
        ),
    )
        .prop_map(|((a, b, c, d, e, f), (g, h, i, j, k))| Fields {
            system: a,
            user: b,
            reasoning: c,
            answer: d,
            call_name: e,
            arg_key: f,
            arg_value: g,
            result: h,
            tool_name: i,
            tool_description: j,
            reminder: k,
        })
}

fn conversation(f: &Fields, thinking: bool) -> Conversation {
    let mut map = serde_json::Map::new();
    map.insert(
        f.arg_key.clone(),
        serde_json::Value::from(f.arg_value.clone()),
    );
    map.insert("n".into(), serde_json::Value::from(1));
    let arguments = serde_json::Value::Object(map).to_string();
    Conversation {
        messages: vec![
            Message::system(f.system.clone()),
            Message::user(f.user.clone()),
            Message::Assistant {
                content: f.answer.clone(),
                reasoning: Some(f.reasoning.clone()),
                tool_calls: Some(vec![ToolCall {
                    id: "c1".into(),
                    name: f.call_name.clone(),
                    arguments,
                }]),
                prefix: false,
            },
            Message::Tool {
                content: Content::text(f.result.clone()),
                tool_call_id: Some("c1".into()),
            },
            Message::LatestReminder {
                content: f.reminder.clone(),
            },
        ],
        thinking,
        tools: vec![ToolDefinition {
            name: f.tool_name.clone(),
            description: Some(f.tool_description.clone()),
            parameters: serde_json::json!({"type": "object"}),
            strict: None,
            defer_loading: false,
        }],
        tool_choice: ToolChoice::Auto,
        ..Conversation::default()
    }
}

fn blank(f: &Fields) -> Fields {
    let x = |_: &String| "x".to_owned();
    Fields {
        system: x(&f.system),
        user: x(&f.user),
        reasoning: x(&f.reasoning),
        answer: x(&f.answer),
        call_name: x(&f.call_name),
        arg_key: x(&f.arg_key),
        arg_value: x(&f.arg_value),
        result: x(&f.result),
        tool_name: x(&f.tool_name),
        tool_description: x(&f.tool_description),
        reminder: x(&f.reminder),
    }
}

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
        let tokenizer = v41_tokenizer();
        let reserved = tokenizer.reserved_ids();
        for format in [PromptFormat::V4, PromptFormat::V41] {
            let renderer = Renderer::new(format);
            let rendered = renderer.render(&conversation(&f, thinking));
            let ids = tokenizer.encode(&rendered).unwrap();
            let reserved_count = ids.iter().filter(|id| reserved.contains(id)).count();
            prop_assert_eq!(reserved_count, rendered.special_ranges.len());
            // The template's special tokens are exactly those of the same
            // conversation with every user-controlled field replaced by "x".
            let reference = renderer.render(&conversation(&blank(&f), thinking));
            prop_assert_eq!(rendered.special_tokens(), reference.special_tokens());
            // Round trip: decoding the ids gives back the prompt text.
            prop_assert_eq!(tokenizer.decode(&ids).unwrap(), rendered.text.clone());
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
