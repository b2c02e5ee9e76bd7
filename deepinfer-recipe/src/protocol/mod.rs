//! API protocols: requests become a [`Conversation`] plus sampling and
//! parsing options; errors serialise in each protocol's own JSON shape.

pub mod anthropic;
pub mod chat;
pub mod chat_response;
mod output_parts;
pub mod responses;

use std::collections::BTreeMap;

use serde::Serialize;

use crate::conversation::{Conversation, ReasoningEffort, ToolDefinition};
use crate::render::PromptFormat;

/// A model name the server accepts, and what it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSpec {
    /// Prompt format.
    pub format: PromptFormat,
    /// Whether images are accepted (otherwise replaced by `[Unsupported Image]`).
    pub supports_images: bool,
}

/// Conversion settings shared by all protocols.
#[derive(Debug, Clone)]
pub struct ConversionOptions {
    /// Accepted model names.
    pub models: BTreeMap<String, ModelSpec>,
    /// Thinking mode when the request does not say.
    pub default_thinking: bool,
    /// Largest `max_tokens` accepted.
    pub max_tokens_upper_bound: u32,
    /// Largest `n` accepted (this crate supports `n > 1`).
    pub max_n: u32,
    /// Reject images sent to a model without image input (instead of
    /// replacing each with `[Unsupported Image]`, as the reference does).
    pub reject_unsupported_images: bool,
}

impl Default for ConversionOptions {
    fn default() -> Self {
        let mut models = BTreeMap::new();
        models.insert(
            "DeepSeek-V4-Pro".to_owned(),
            ModelSpec {
                format: PromptFormat::V4,
                supports_images: false,
            },
        );
        models.insert(
            "DeepSeek-V4.1-Flash".to_owned(),
            ModelSpec {
                format: PromptFormat::V41,
                supports_images: true,
            },
        );
        Self {
            models,
            default_thinking: true,
            max_tokens_upper_bound: 393_216,
            max_n: 16,
            reject_unsupported_images: false,
        }
    }
}

impl ConversionOptions {
    /// Accept another model name.
    pub fn with_model(mut self, name: impl Into<String>, spec: ModelSpec) -> Self {
        self.models.insert(name.into(), spec);
        self
    }

    pub(crate) fn model(&self, name: &str) -> Result<ModelSpec, RequestError> {
        self.models.get(name).copied().ok_or_else(|| {
            let names: Vec<&str> = self.models.keys().map(String::as_str).collect();
            RequestError::invalid(format!(
                "The supported API model names are {}, but you passed {name}.",
                names.join(", ")
            ))
        })
    }
}

/// Sampling settings taken from a request.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingOptions {
    /// Output token limit, if requested.
    pub max_tokens: Option<u32>,
    /// Temperature (1.0 in thinking mode).
    pub temperature: f32,
    /// Nucleus mass.
    pub top_p: f32,
    /// Whether to report log probabilities of the chosen tokens.
    pub logprobs: bool,
    /// How many alternatives to report per token (0..=20).
    pub top_logprobs: Option<u8>,
    /// Seed.
    pub seed: Option<u64>,
    /// Number of choices.
    pub n: u32,
}

/// Where the output starts relative to reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThinkingStart {
    /// A fresh reasoning block.
    ReasoningStart,
    /// Continuing reasoning text from a prefix.
    ReasoningContinuation,
    /// Continuing answer text from a prefix (reasoning already closed).
    ContentContinuation,
}

/// How the output parser should read the model output.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsingOptions {
    /// Recognise DSML tool-call blocks.
    pub parse_tool_calls: bool,
    /// The prompt already opened the tool-call block.
    pub starts_in_tool_calls: bool,
    /// Extract a JSON object from the answer (`json_object` format).
    pub parse_json_output: bool,
    /// `None` outside thinking mode.
    pub thinking: Option<ThinkingStart>,
    /// Stop sequences matched in the answer text.
    pub stop_sequences: Vec<String>,
}

/// The constraint a grammar backend would enforce on the output.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputConstraint {
    /// Any JSON object, or JSON matching `schema`.
    Json {
        /// The schema, if any.
        schema: Option<serde_json::Value>,
    },
    /// Text matching a regular expression.
    Regex(String),
    /// A tool-call block using these tools; `required` forces at least one call.
    ToolCalls {
        /// Tools allowed.
        tools: Vec<ToolDefinition>,
        /// Whether a call is required.
        required: bool,
    },
}

/// A converted request, ready to render, encode and run.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvertedRequest {
    /// The model name as requested.
    pub model: String,
    /// Prompt format of that model.
    pub format: PromptFormat,
    /// The conversation.
    pub conversation: Conversation,
    /// Sampling settings.
    pub sampling: SamplingOptions,
    /// Output parsing settings.
    pub parsing: ParsingOptions,
    /// Constraint for structured output, if any.
    pub constraint: Option<OutputConstraint>,
    /// Whether to stream.
    pub stream: bool,
    /// Whether a streamed response ends with a usage chunk.
    pub include_usage: bool,
}

/// Which protocol an error is reported in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OpenAI Chat Completions.
    ChatCompletions,
    /// OpenAI Responses.
    Responses,
    /// Anthropic Messages.
    AnthropicMessages,
}

/// A rejected request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The body is not valid JSON or does not have the protocol's shape.
    #[error("{0}")]
    Malformed(String),
    /// The request is well-formed but invalid or unsupported.
    #[error("{message}")]
    Invalid {
        /// Human-readable reason.
        message: String,
        /// The offending parameter, when known.
        param: Option<String>,
    },
}

impl RequestError {
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::Invalid {
            message: message.into(),
            param: None,
        }
    }

    pub(crate) fn invalid_param(message: impl Into<String>, param: &str) -> Self {
        Self::Invalid {
            message: message.into(),
            param: Some(param.to_owned()),
        }
    }

    /// HTTP status to answer with.
    pub fn status(&self) -> u16 {
        400
    }

    /// The error body in `protocol`'s own shape.
    pub fn to_json(&self, protocol: Protocol) -> serde_json::Value {
        let (message, param) = match self {
            Self::Malformed(message) => (message.clone(), None),
            Self::Invalid { message, param } => (message.clone(), param.clone()),
        };
        match protocol {
            Protocol::ChatCompletions | Protocol::Responses => serde_json::json!({
                "error": {
                    "message": message,
                    "type": "invalid_request_error",
                    "param": param,
                    "code": "invalid_request_error",
                }
            }),
            Protocol::AnthropicMessages => serde_json::json!({
                "type": "error",
                "error": {"type": "invalid_request_error", "message": message},
            }),
        }
    }
}

/// Thinking mode and effort from the protocol's `thinking` type and
/// `reasoning_effort` words.
pub(crate) fn resolve_thinking(
    default: bool,
    thinking_type: Option<&str>,
    effort: Option<&str>,
) -> Result<(bool, Option<ReasoningEffort>), RequestError> {
    let mode = match thinking_type {
        Some("enabled" | "adaptive") => true,
        Some("disabled") => false,
        Some(other) => {
            return Err(RequestError::invalid_param(
                format!("Unknown thinking type '{other}'"),
                "thinking.type",
            ));
        }
        None => match effort {
            Some("none") => false,
            Some(_) => true,
            None => default,
        },
    };
    let effort = match effort {
        None | Some("none") => None,
        Some("minimal" | "low") => Some(ReasoningEffort::Low),
        Some("medium" | "high") => Some(ReasoningEffort::High),
        Some("xhigh") => Some(ReasoningEffort::Xhigh),
        Some("ultra" | "max") => Some(ReasoningEffort::Max),
        Some(other) => {
            return Err(RequestError::invalid_param(
                format!("Unknown reasoning_effort '{other}'"),
                "reasoning_effort",
            ));
        }
    };
    Ok((mode, mode.then(|| effort.unwrap_or(ReasoningEffort::High))))
}

/// `top_p` as the models serve it.
pub(crate) fn resolve_top_p(
    format: PromptFormat,
    requested: Option<f32>,
    thinking: bool,
    tools: bool,
) -> f32 {
    match (format, thinking) {
        (PromptFormat::V41, true) => requested.unwrap_or(1.0).max(0.95),
        (PromptFormat::V4, true) if tools => 0.95,
        (PromptFormat::V4, true) | (PromptFormat::V41, false) => 1.0,
        (PromptFormat::V4, false) => requested.unwrap_or(1.0),
    }
}

/// Validate a tool name: 1–128 characters of `[a-zA-Z0-9_-]`.
pub(crate) fn validate_tool_name(name: &str, path: &str) -> Result<(), RequestError> {
    if name.is_empty() || name.len() > 128 {
        return Err(RequestError::invalid_param(
            format!("Invalid '{path}.name': expected 1 to 128 characters."),
            path,
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(RequestError::invalid_param(
            format!(
                "Invalid '{path}.name': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'."
            ),
            path,
        ));
    }
    Ok(())
}

/// Prompt-side token counts the server reports with a response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PromptUsage {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u32,
}

/// A `strict: true` tool's parameters must have a strict normal form
/// ([`crate::grammar::strict_schema`]); the error names the function.
pub(crate) fn check_strict_tool(tool: &ToolDefinition) -> Result<(), RequestError> {
    if tool.strict != Some(true) {
        return Ok(());
    }
    crate::grammar::strict_schema(&tool.parameters)
        .map(drop)
        .map_err(|error| {
            RequestError::invalid_param(
                format!("Invalid schema for function '{}': {error}", tool.name),
                "tools",
            )
        })
}
