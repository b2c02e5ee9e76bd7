//! The DeepSeek V4.1 prompt format.
//!
//! The first system block (inserted when missing) carries the reasoning-effort
//! line, the tool prompt and the response format; tool results are ordered by
//! the calls of the preceding assistant message.

use super::{Ctx, TOOL_PROMPT_END, call_parameters, parameter_value, tool_schema};
use crate::conversation::{
    Content, Conversation, Message, ReasoningEffort, ResponseFormat, ToolCall, ToolChoice,
};
use crate::json_style::{FloatStyle, to_spaced_json};
use crate::special::SpecialToken;

const BLOCK: &str = " calls";
const INVOKE: &str = " invoke";
const PARAMETER: &str = " parameter";
const FLOATS: FloatStyle = FloatStyle::Python;

fn effort_line(effort: Option<ReasoningEffort>) -> String {
    let score = match effort {
        Some(ReasoningEffort::Low) => 50,
        Some(ReasoningEffort::Max) => 100,
        None | Some(ReasoningEffort::High) | Some(ReasoningEffort::Xhigh) => 75,
    };
    format!(
        "Reasoning Effort: {score} (range 1-100, the higher the value, the more thorough the reasoning)\n\n"
    )
}

pub(super) fn render(ctx: &mut Ctx<'_>, conversation: &Conversation) {
    let mut messages = normalize(&conversation.messages);
    let tool_prompt = conversation.renders_tool_prompt();
    let schema = match &conversation.response_format {
        ResponseFormat::Text | ResponseFormat::Regex(_) => None,
        ResponseFormat::JsonObject => Some(serde_json::json!({"type": "json_object"})),
        ResponseFormat::JsonSchema(schema) => Some(schema.clone()),
    };
    let has_suffix = tool_prompt || schema.is_some();
    if has_suffix && !matches!(messages.first(), Some(Message::System { .. })) {
        messages.insert(
            0,
            Message::System {
                content: Content::default(),
                tools: None,
            },
        );
    }
    // Earlier reasoning is kept only when the tool prompt is rendered.
    let drop_thinking = !tool_prompt;

    ctx.special(SpecialToken::Bos);
    for index in 0..messages.len() {
        let suffix = (index == 0 && has_suffix).then_some((tool_prompt, schema.as_ref()));
        message(ctx, &messages, index, conversation, drop_thinking, suffix);
    }
    if !matches!(
        messages.last(),
        Some(Message::Assistant { prefix: true, .. })
    ) {
        ctx.special(SpecialToken::Assistant);
        ctx.special(if conversation.thinking {
            SpecialToken::ThinkingStart
        } else {
            SpecialToken::ThinkingEnd
        });
    }
    if conversation.tool_choice == ToolChoice::Required && tool_prompt {
        ctx.plain("\n\n<");
        ctx.special(SpecialToken::Dsml);
        ctx.plain(BLOCK);
        ctx.plain(">\n");
    }
}

/// What the first system block appends after its content.
type Suffix<'a> = Option<(bool, Option<&'a serde_json::Value>)>;

fn message(
    ctx: &mut Ctx<'_>,
    messages: &[Message],
    index: usize,
    conversation: &Conversation,
    drop_thinking: bool,
    suffix: Suffix<'_>,
) {
    let current = &messages[index];
    let previous = index.checked_sub(1).map(|i| &messages[i]);
    let effort =
        (index == 0 && conversation.thinking).then(|| effort_line(conversation.reasoning_effort));
    if index == 0 && (effort.is_some() || matches!(current, Message::System { .. })) {
        ctx.special(SpecialToken::System);
    }
    if let Some(line) = &effort {
        ctx.plain(line);
    }
    let after_user = matches!(previous, Some(Message::User { .. } | Message::Tool { .. }));
    let open_user = |ctx: &mut Ctx<'_>| {
        if after_user {
            ctx.plain("\n\n");
        } else {
            ctx.special(SpecialToken::User);
        }
    };
    match current {
        Message::System { content, tools } => {
            if index > 0 {
                ctx.special(SpecialToken::System);
            }
            ctx.content(content);
            if let Some((tool_prompt, schema)) = suffix {
                if tool_prompt {
                    ctx.plain("\n\n");
                    render_tool_prompt(ctx, conversation);
                }
                if let Some(schema) = schema {
                    ctx.plain(
                        "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n",
                    );
                    ctx.plain(&to_spaced_json(schema, FLOATS));
                }
            }
            if let Some(tools) = tools.as_ref().filter(|tools| !tools.is_empty()) {
                let schemas: Vec<String> =
                    tools.iter().map(|tool| tool_schema(tool, FLOATS)).collect();
                ctx.plain("\n\n### Updated Tool Schemas\n\n");
                ctx.plain(&schemas.join("\n"));
            }
        }
        Message::User { content } => {
            open_user(ctx);
            ctx.content(content);
        }
        Message::LatestReminder { content } => {
            ctx.special(SpecialToken::LatestReminder);
            ctx.plain(content);
        }
        Message::Tool { content, .. } => {
            open_user(ctx);
            ctx.plain("<tool_result>");
            ctx.content(content);
            ctx.plain("</tool_result>");
        }
        Message::Assistant {
            content,
            reasoning,
            tool_calls,
            prefix,
        } => {
            let calls = tool_calls.as_deref().filter(|calls| !calls.is_empty());
            let renders_reasoning =
                conversation.thinking && index > 0 && (!drop_thinking || *prefix);
            // The reasoning block closes with `</think>` unless this is a
            // reasoning-only prefix still being continued.
            let closes = !(*prefix && content.is_empty() && calls.is_none());
            let has_reasoning_text = reasoning.as_deref().is_some_and(|r| !r.is_empty());
            let opens_thinking = renders_reasoning && (has_reasoning_text || closes || *prefix);
            ctx.special(SpecialToken::Assistant);
            ctx.special(if opens_thinking {
                SpecialToken::ThinkingStart
            } else {
                SpecialToken::ThinkingEnd
            });
            if renders_reasoning {
                if let Some(reasoning) = reasoning {
                    ctx.assistant_text(reasoning);
                }
                if closes {
                    ctx.special(SpecialToken::ThinkingEnd);
                }
            }
            ctx.assistant_text(content);
            if let Some(calls) = calls {
                render_calls(ctx, calls);
            }
            if !*prefix {
                ctx.special(SpecialToken::Eos);
            }
        }
    }
}

fn render_tool_prompt(ctx: &mut Ctx<'_>, conversation: &Conversation) {
    ctx.tool_instructions(BLOCK, INVOKE, PARAMETER);
    let schemas: Vec<String> = conversation
        .tools
        .iter()
        .filter(|tool| !tool.defer_loading)
        .map(|tool| tool_schema(tool, FLOATS))
        .collect();
    ctx.plain(&schemas.join("\n"));
    ctx.plain("\n\n");
    ctx.plain(TOOL_PROMPT_END);
}

fn dsml_tag(ctx: &mut Ctx<'_>, closing: bool, name: &str) {
    ctx.plain(if closing { "</" } else { "<" });
    ctx.special(SpecialToken::Dsml);
    ctx.plain(name);
}

fn render_calls(ctx: &mut Ctx<'_>, calls: &[ToolCall]) {
    ctx.plain("\n\n");
    dsml_tag(ctx, false, BLOCK);
    ctx.plain(">\n");
    for (call_index, call) in calls.iter().enumerate() {
        if call_index > 0 {
            ctx.plain("\n");
        }
        dsml_tag(ctx, false, INVOKE);
        ctx.plain(&format!(" name=\"{}\">\n", call.name));
        for (arg_index, (key, value)) in call_parameters(call).iter().enumerate() {
            if arg_index > 0 {
                ctx.plain("\n");
            }
            let (is_string, text) = parameter_value(value, FLOATS);
            dsml_tag(ctx, false, PARAMETER);
            ctx.plain(&format!(" name=\"{key}\" string=\"{is_string}\">{text}"));
            dsml_tag(ctx, true, PARAMETER);
            ctx.plain(">");
        }
        ctx.plain("\n");
        dsml_tag(ctx, true, INVOKE);
        ctx.plain(">");
    }
    ctx.plain("\n");
    dsml_tag(ctx, true, BLOCK);
    ctx.plain(">");
}

/// Merge consecutive user messages, drop a latest reminder that follows
/// another, and order tool results by call.
fn normalize(messages: &[Message]) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::with_capacity(messages.len());
    for message in messages {
        match (out.last_mut(), message) {
            (Some(Message::User { content: previous }), Message::User { content }) => {
                previous.extend_with("\n\n", content.clone());
            }
            (Some(Message::LatestReminder { .. }), Message::LatestReminder { .. }) => {}
            _ => out.push(message.clone()),
        }
    }
    order_tool_results(&mut out);
    out
}

/// In each run of user/tool messages, the results with a call id take the
/// order of the latest assistant's calls (unknown ids sort first); other
/// messages keep their slots.
fn order_tool_results(messages: &mut [Message]) {
    let mut call_order: Vec<String> = Vec::new();
    let mut index = 0;
    while index < messages.len() {
        match &messages[index] {
            Message::Assistant {
                tool_calls: Some(calls),
                ..
            } if !calls.is_empty() => {
                call_order = calls.iter().map(|call| call.id.clone()).collect();
                index += 1;
            }
            Message::User { .. } | Message::Tool { .. } => {
                let start = index;
                while index < messages.len()
                    && matches!(messages[index], Message::User { .. } | Message::Tool { .. })
                {
                    index += 1;
                }
                let slots: Vec<usize> = (start..index)
                    .filter(|&i| {
                        matches!(
                            messages[i],
                            Message::Tool {
                                tool_call_id: Some(_),
                                ..
                            }
                        )
                    })
                    .collect();
                if slots.len() > 1 && !call_order.is_empty() {
                    let mut results: Vec<Message> =
                        slots.iter().map(|&i| messages[i].clone()).collect();
                    results.sort_by_key(|message| match message {
                        Message::Tool {
                            tool_call_id: Some(id),
                            ..
                        } => call_order.iter().position(|call| call == id).unwrap_or(0),
                        _ => 0,
                    });
                    for (slot, result) in slots.into_iter().zip(results) {
                        messages[slot] = result;
                    }
                }
            }
            _ => index += 1,
        }
    }
}
