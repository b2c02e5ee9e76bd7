//! Differential property test: random conversations render to the same text
//! and special ranges as DeepSeek's `deepseek-recipe-encoding` 0.2.0.

#[path = "../../tests/common/mod.rs"]
mod common;
mod reference;

use reference::{reference_render, to_reference};
use deepinfer_recipe::conversation::{
    Content, Conversation, ImageRef, Message, Part, ReasoningEffort, ResponseFormat, ToolCall,
    ToolChoice, ToolDefinition,
};
use deepinfer_recipe::{PromptFormat, Renderer};
use proptest::prelude::*;

fn text() -> BoxedStrategy<String> {
    let fragment = prop_oneof![
        4 => "[a-z \n]{0,6}",
        1 => proptest::sample::select(vec![
            "<｜User｜>", "</think>", "<think>", "<｜ref｜>", "<｜/box｜>", "｜DSML｜",
            "<｜end▁of▁sentence｜>", "\n\n", "\"", "{", "json",
        ]).prop_map(str::to_owned),
    ];
    proptest::collection::vec(fragment, 0..4)
        .prop_map(|parts| parts.concat())
        .boxed()
}

fn content() -> BoxedStrategy<Content> {
    proptest::collection::vec(
        prop_oneof![
            4 => text().prop_map(Part::Text),
            1 => Just(Part::Image(ImageRef { url: "http://x/y.png".into(), detail: None })),
        ],
        0..3,
    )
    .prop_map(|parts| Content { parts })
    .boxed()
}

fn arguments() -> BoxedStrategy<String> {
    prop_oneof![
        Just(r#"{"a": 1, "b": "x", "c": [1.5, 0.00001, null], "d": {"e": true}}"#.to_owned()),
        Just("not json".to_owned()),
        Just("{}".to_owned()),
        text().prop_map(|t| serde_json::json!({"q": t, "n": 1e-7}).to_string()),
    ]
    .boxed()
}

fn calls() -> BoxedStrategy<Option<Vec<ToolCall>>> {
    proptest::option::of(proptest::collection::vec(
        (
            proptest::sample::select(vec!["c1", "c2", "a0"]),
            arguments(),
        )
            .prop_map(|(id, arguments)| ToolCall {
                id: id.into(),
                name: "get".into(),
                arguments,
            }),
        0..3,
    ))
    .boxed()
}

fn message() -> BoxedStrategy<Message> {
    prop_oneof![
        2 => (content(), proptest::bool::weighted(0.2)).prop_map(|(content, tools)| Message::System {
            content,
            tools: tools.then(|| vec![tool("late")]),
        }),
        4 => content().prop_map(|content| Message::User { content }),
        3 => (text(), proptest::option::of(text()), calls()).prop_map(|(content, reasoning, tool_calls)| {
            Message::Assistant { content, reasoning, tool_calls, prefix: false }
        }),
        2 => (content(), proptest::option::of(proptest::sample::select(vec!["c1", "c2", "zz"])))
            .prop_map(|(content, id)| Message::Tool { content, tool_call_id: id.map(str::to_owned) }),
        1 => text().prop_map(|content| Message::LatestReminder { content }),
    ]
    .boxed()
}

fn tool(name: &str) -> ToolDefinition {
    ToolDefinition {
        name: name.into(),
        description: Some("does \"things\"\nwell".into()),
        parameters: serde_json::json!({"type": "object", "properties": {"x": {"type": "number", "minimum": 0.00001}}}),
        strict: None,
        defer_loading: false,
    }
}

fn conversation() -> impl Strategy<Value = Conversation> {
    (
        proptest::collection::vec(message(), 1..7),
        any::<bool>(),
        proptest::option::of(proptest::sample::select(vec![
            ReasoningEffort::Low,
            ReasoningEffort::High,
            ReasoningEffort::Xhigh,
            ReasoningEffort::Max,
        ])),
        proptest::sample::select(vec![ToolChoice::Auto, ToolChoice::None, ToolChoice::Required]),
        0usize..3,
        0usize..4,
        proptest::option::of((text(), proptest::option::of(text()))),
    )
        .prop_map(|(mut messages, thinking, effort, choice, tools, format, prefix)| {
            if let Some((content, reasoning)) = prefix {
                messages.push(Message::Assistant { content, reasoning, tool_calls: None, prefix: true });
            }
            let mut deferred = tool("deferred");
            deferred.defer_loading = true;
            Conversation {
                messages,
                thinking,
                tools: [tool("get"), deferred, tool("other")].into_iter().take(tools).collect(),
                tool_choice: choice,
                reasoning_effort: effort,
                response_format: match format {
                    0 => ResponseFormat::Text,
                    1 => ResponseFormat::JsonObject,
                    2 => ResponseFormat::JsonSchema(serde_json::json!({"type": "object", "properties": {"v": {"type": "number", "default": 0.00002}}})),
                    _ => ResponseFormat::Regex("[0-9]+".into()),
                },
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn renders_like_the_reference(conversation in conversation()) {
        let reference = to_reference(&conversation);
        for format in [PromptFormat::V4, PromptFormat::V41] {
            let ours = Renderer::new(format).render(&conversation);
            let theirs = reference_render(format, &reference);
            prop_assert_eq!(&ours.text, &theirs.text, "{:?}", format);
            prop_assert_eq!(&ours.special_ranges, &theirs.special_ranges, "{:?}", format);
        }
    }
}
