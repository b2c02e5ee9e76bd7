//! The DeepSeek V4 prompt format.
//!
//! No system token: non-empty system messages are hoisted after the BOS and
//! the reasoning-effort text, followed by the tool prompt and the response
//! format; tool calls and their results are sorted by call id.

use super::{Ctx, TOOL_PROMPT_END, call_parameters, parameter_value, tool_schema};
use crate::conversation::{
    Content, Conversation, Message, ReasoningEffort, ResponseFormat, ToolCall, ToolChoice,
};
use crate::json_style::{FloatStyle, to_spaced_json};
use crate::special::SpecialToken;

const FLOATS: FloatStyle = FloatStyle::Rust;

const EFFORT_HIGH: &str = "Reasoning Effort: Absolute maximum with no shortcuts permitted.
You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.
Explicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.

";

const EFFORT_MAX: &str = "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.
You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively decompose the problem into its most fundamental components, trace every causal chain to its root, and resolve the underlying cause rather than any surface symptom.
Do not stop reasoning until you have independently verified the solution from multiple angles and are certain that no assumption remains unchecked and no error remains undiscovered.

";

const JSON_OBJECT_PROMPT: &str = "You are a helpful assistant designed to output JSON.\n## Response Format:\n\nReply with JSON object ONLY.";

/// A system block after normalisation: user content, or a template block.
enum Block {
    Content(Content),
    ToolPrompt,
    Text(String),
}

/// A message after normalisation.
enum Item {
    System(Block),
    Other(Message),
}

pub(super) fn render(ctx: &mut Ctx<'_>, conversation: &Conversation) {
    let items = normalize(conversation);
    let drop_thinking = !conversation.renders_tool_prompt();
    let thinking = conversation.thinking;

    ctx.special(SpecialToken::Bos);
    if thinking {
        match conversation.reasoning_effort {
            Some(ReasoningEffort::Low) => {}
            Some(ReasoningEffort::Max) => ctx.plain(EFFORT_MAX),
            None | Some(ReasoningEffort::High) | Some(ReasoningEffort::Xhigh) => {
                ctx.plain(EFFORT_HIGH)
            }
        }
    }

    let mut has_system = false;
    let mut previous_user = false;
    let mut previous_tool = false;
    let count = items.len();
    for (index, item) in items.iter().enumerate() {
        let message = match item {
            Item::System(block) => {
                if has_system {
                    ctx.plain("\n\n");
                }
                match block {
                    Block::Content(content) => ctx.content(content),
                    Block::ToolPrompt => render_tool_prompt(ctx, conversation),
                    Block::Text(text) => ctx.plain(text),
                }
                has_system = true;
                previous_user = false;
                previous_tool = false;
                continue;
            }
            Item::Other(message) => message,
        };
        match message {
            Message::System { .. } => {}
            Message::User { content } => {
                if previous_user || previous_tool {
                    ctx.plain("\n\n");
                } else {
                    ctx.special(SpecialToken::User);
                }
                ctx.content(content);
            }
            Message::Assistant {
                content,
                reasoning,
                tool_calls,
                prefix,
            } => {
                ctx.special(SpecialToken::Assistant);
                if let Some(reasoning) = reasoning
                    && (*prefix || !drop_thinking)
                {
                    ctx.special(SpecialToken::ThinkingStart);
                    ctx.assistant_text(reasoning);
                }
                if !thinking || !*prefix || !content.is_empty() {
                    ctx.special(SpecialToken::ThinkingEnd);
                }
                ctx.assistant_text(content);
                if let Some(calls) = tool_calls {
                    render_calls(ctx, calls);
                }
                if index + 1 < count || !*prefix {
                    ctx.special(SpecialToken::Eos);
                }
            }
            Message::Tool { content, .. } => {
                if previous_tool {
                    ctx.plain("\n\n");
                } else {
                    ctx.special(SpecialToken::User);
                }
                ctx.plain("<tool_result>");
                ctx.content(content);
                ctx.plain("</tool_result>");
            }
            Message::LatestReminder { content } => {
                ctx.special(SpecialToken::LatestReminder);
                ctx.plain(content);
            }
        }
        previous_user = matches!(message, Message::User { .. });
        previous_tool = matches!(message, Message::Tool { .. });
    }
    let continues = matches!(
        items.last(),
        Some(Item::Other(Message::Assistant { prefix: true, .. }))
    );
    if !continues {
        ctx.special(SpecialToken::Assistant);
        ctx.special(if thinking {
            SpecialToken::ThinkingStart
        } else {
            SpecialToken::ThinkingEnd
        });
    }
    if conversation.tool_choice == ToolChoice::Required && conversation.renders_tool_prompt() {
        ctx.plain("\n\n<");
        ctx.special(SpecialToken::Dsml);
        ctx.plain("tool_calls>\n");
    }
}

fn render_tool_prompt(ctx: &mut Ctx<'_>, conversation: &Conversation) {
    ctx.tool_instructions("tool_calls", "invoke", "parameter");
    for tool in conversation.tools.iter().filter(|tool| !tool.defer_loading) {
        ctx.plain(&tool_schema(tool, FLOATS));
        ctx.plain("\n");
    }
    ctx.plain("\n");
    ctx.plain(TOOL_PROMPT_END);
}

fn tag(ctx: &mut Ctx<'_>, closing: bool, name: &str) {
    ctx.plain(if closing { "</" } else { "<" });
    ctx.special(SpecialToken::Dsml);
    ctx.plain(name);
}

fn render_calls(ctx: &mut Ctx<'_>, calls: &[ToolCall]) {
    ctx.plain("\n\n");
    tag(ctx, false, "tool_calls");
    ctx.plain(">\n");
    for call in calls {
        tag(ctx, false, "invoke");
        ctx.plain(&format!(" name=\"{}\">\n", call.name));
        for (key, value) in &call_parameters(call) {
            let (is_string, text) = parameter_value(value, FLOATS);
            tag(ctx, false, "parameter");
            ctx.plain(&format!(" name=\"{key}\" string=\"{is_string}\">{text}"));
            tag(ctx, true, "parameter");
            ctx.plain(">\n");
        }
        tag(ctx, true, "invoke");
        ctx.plain(">\n");
    }
    tag(ctx, true, "tool_calls");
    ctx.plain(">");
}

fn normalize(conversation: &Conversation) -> Vec<Item> {
    let mut systems: Vec<Item> = Vec::new();
    let mut others: Vec<Message> = Vec::new();
    for message in &conversation.messages {
        match (others.last_mut(), message) {
            (_, Message::System { content, .. }) => {
                if !content.is_empty() {
                    systems.push(Item::System(Block::Content(content.clone())));
                }
            }
            (Some(Message::User { content: previous }), Message::User { content }) => {
                // Empty content has no images either, so skipping it loses nothing.
                if !content.is_empty() {
                    let separator = if previous.is_empty() { "" } else { "\n\n" };
                    previous.extend_with(separator, content.clone());
                }
            }
            (_, message) => others.push(message.clone()),
        }
    }

    // Sort each assistant's calls by id, and the following results (one slot
    // per call) by call id, results before other messages, missing ids first.
    let mut ranges = Vec::new();
    for (index, message) in others.iter_mut().enumerate() {
        if let Message::Assistant {
            tool_calls: Some(calls),
            ..
        } = message
        {
            calls.sort_by(|a, b| a.id.cmp(&b.id));
            if !calls.is_empty() {
                ranges.push(index + 1..index + 1 + calls.len());
            }
        }
    }
    for range in ranges {
        if let Some(slice) = others.get_mut(range) {
            slice.sort_by(|a, b| result_key(a).cmp(&result_key(b)));
        }
    }

    let tool_prompt = conversation.renders_tool_prompt();
    let format = match &conversation.response_format {
        ResponseFormat::Text | ResponseFormat::Regex(_) => None,
        ResponseFormat::JsonObject => Some(JSON_OBJECT_PROMPT.to_owned()),
        ResponseFormat::JsonSchema(schema) => Some(format!(
            "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n{}",
            to_spaced_json(schema, FLOATS)
        )),
    };
    if tool_prompt || format.is_some() {
        if systems.is_empty() {
            systems.push(Item::System(Block::Content(Content::default())));
        }
        if tool_prompt {
            systems.push(Item::System(Block::ToolPrompt));
        }
        if let Some(text) = format {
            systems.push(Item::System(Block::Text(text)));
        }
    }
    systems.extend(others.into_iter().map(Item::Other));
    systems
}

fn result_key(message: &Message) -> (bool, Option<&str>) {
    match message {
        Message::Tool { tool_call_id, .. } => (false, tool_call_id.as_deref()),
        _ => (true, None),
    }
}
