//! Our conversation in the types of DeepSeek's reference crates
//! (`deepseek-recipe-core` / `-encoding` 0.2.0), for differential tests and
//! side-by-side benchmarks.

#![allow(dead_code)]

use deepinfer_recipe::conversation::{
    Conversation, Message, Part, ReasoningEffort, ResponseFormat, ToolChoice, ToolDefinition,
};
use deepinfer_recipe::{PromptFormat, RenderedPrompt};
use deepseek_recipe_core::conversation as rc;
use deepseek_recipe_core::messages as rm;
use deepseek_recipe_core::multimodal::{ImageDetail, ImageSource};
use deepseek_recipe_core::prompt::Prompt;
use deepseek_recipe_core::tools as rt;
use deepseek_recipe_encoding::PromptEncoding;
use deepseek_recipe_encoding::dsv4::DeepseekV4Encoding;
use deepseek_recipe_encoding::dsv41::DeepseekV41Encoding;

fn content(content: &deepinfer_recipe::Content) -> (Prompt, Vec<ImageSource>) {
    let mut prompt = Prompt::new();
    let mut images = Vec::new();
    for part in &content.parts {
        match part {
            Part::Text(text) => prompt.push_plain(text),
            Part::Image(image) => {
                prompt.push_special("<｜image｜>");
                images.push(ImageSource::Url {
                    url: image.url.clone(),
                    detail: ImageDetail::High,
                    path: String::new(),
                });
            }
        }
    }
    (prompt, images)
}

fn tool(tool: &ToolDefinition) -> rt::ToolDefinition {
    rt::ToolDefinition {
        name: tool.name.clone(),
        description: tool.description.clone(),
        parameters: tool.parameters.clone(),
        strict: tool.strict,
        defer_loading: tool.defer_loading,
    }
}

/// The same conversation in the reference types.
pub fn to_reference(conversation: &Conversation) -> rc::Conversation {
    let messages = conversation
        .messages
        .iter()
        .map(|message| match message {
            Message::System { content: c, tools } => {
                let (content, image_sources) = content(c);
                rm::InputMessage::System {
                    content,
                    image_sources,
                    tools: tools.as_ref().map(|tools| tools.iter().map(tool).collect()),
                }
            }
            Message::User { content: c } => {
                let (content, image_sources) = content(c);
                rm::InputMessage::User {
                    content,
                    image_sources,
                }
            }
            Message::Tool {
                content: c,
                tool_call_id,
            } => {
                let (content, image_sources) = content(c);
                rm::InputMessage::Tool {
                    content,
                    image_sources,
                    tool_call_id: tool_call_id.clone(),
                }
            }
            Message::Assistant {
                content,
                reasoning,
                tool_calls,
                prefix,
            } => rm::InputMessage::Assistant {
                content: content.clone(),
                reasoning_content: reasoning.clone(),
                tool_calls: tool_calls.as_ref().map(|calls| {
                    calls
                        .iter()
                        .map(|call| rm::ToolCall {
                            id: call.id.clone(),
                            name: call.name.clone(),
                            arguments: call.arguments.clone(),
                        })
                        .collect()
                }),
                prefix: *prefix,
            },
            Message::LatestReminder { content } => rm::InputMessage::LatestReminder {
                content: content.clone(),
            },
        })
        .collect();
    rc::Conversation {
        messages,
        thinking_mode: conversation.thinking,
        tools: conversation.tools.iter().map(tool).collect(),
        tool_choice: match conversation.tool_choice {
            ToolChoice::Auto => rt::ToolChoice::Auto,
            ToolChoice::None => rt::ToolChoice::None,
            ToolChoice::Required => rt::ToolChoice::Required,
        },
        reasoning_effort: conversation.reasoning_effort.map(|effort| match effort {
            ReasoningEffort::Low => rc::ReasoningEffort::Low,
            ReasoningEffort::High => rc::ReasoningEffort::High,
            ReasoningEffort::Xhigh => rc::ReasoningEffort::Xhigh,
            ReasoningEffort::Max => rc::ReasoningEffort::Max,
        }),
        response_format: match &conversation.response_format {
            ResponseFormat::Text => rc::ResponseFormat::Text,
            ResponseFormat::JsonObject => rc::ResponseFormat::JsonObject,
            ResponseFormat::JsonSchema(schema) => rc::ResponseFormat::JsonSchema(schema.clone()),
            ResponseFormat::Regex(regex) => rc::ResponseFormat::Regex(regex.clone()),
        },
    }
}

/// The reference rendering, as our type.
pub fn reference_render(format: PromptFormat, conversation: &rc::Conversation) -> RenderedPrompt {
    let rendered = match format {
        PromptFormat::V4 => DeepseekV4Encoding::new().render_conversation(conversation),
        PromptFormat::V41 => DeepseekV41Encoding::new().render_conversation(conversation),
    };
    RenderedPrompt {
        text: rendered.prompt,
        special_ranges: rendered.special_ranges,
        images: Vec::new(),
    }
}
