//! The protocol-independent conversation that rendering turns into a prompt.

use serde::{Deserialize, Serialize};

/// An image supplied with a message; the prompt holds one placeholder token
/// per image. Fetching and preprocessing belong to the caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRef {
    /// A data URL or an external URL.
    pub url: String,
    /// The requested detail level, if any.
    pub detail: Option<String>,
}

/// One part of user-supplied content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// Text: always plain, whatever it spells.
    Text(String),
    /// An image, rendered as the image placeholder special token.
    Image(ImageRef),
}

/// Content of a system, user or tool message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Content {
    /// Parts in order.
    pub parts: Vec<Part>,
}

impl Content {
    /// Text-only content.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            parts: vec![Part::Text(text.into())],
        }
    }

    /// Whether the content renders to nothing.
    pub fn is_empty(&self) -> bool {
        self.parts.iter().all(|part| match part {
            Part::Text(text) => text.is_empty(),
            Part::Image(_) => false,
        })
    }

    /// Append another content after `separator` text.
    pub fn extend_with(&mut self, separator: &str, other: Content) {
        if !separator.is_empty() {
            self.parts.push(Part::Text(separator.to_owned()));
        }
        self.parts.extend(other.parts);
    }

    /// The images, in order.
    pub fn images(&self) -> impl Iterator<Item = &ImageRef> {
        self.parts.iter().filter_map(|part| match part {
            Part::Image(image) => Some(image),
            Part::Text(_) => None,
        })
    }

    /// The concatenated text, with each image written as `image_spelling`.
    pub fn flatten(&self, image_spelling: &str) -> String {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(text) => out.push_str(text),
                Part::Image(_) => out.push_str(image_spelling),
            }
        }
        out
    }
}

/// A historical tool call; `arguments` is the JSON text the model produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Call id, matched by tool results.
    pub id: String,
    /// Function name.
    pub name: String,
    /// Arguments as JSON text (ideally an object).
    pub arguments: String,
}

/// A client tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDefinition {
    /// Function name.
    pub name: String,
    /// What it does.
    pub description: Option<String>,
    /// JSON schema of the arguments object.
    pub parameters: serde_json::Value,
    /// Whether arguments must follow the schema exactly (enforced by the
    /// grammar backend when enabled).
    pub strict: Option<bool>,
    /// Leave out of the initial tool prompt (V4.1 deferred loading).
    pub defer_loading: bool,
}

/// A message of the conversation.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// System instructions.
    System {
        /// The text (and images).
        content: Content,
        /// Tools introduced by this message (V4.1 renders them; V4 ignores them).
        tools: Option<Vec<ToolDefinition>>,
    },
    /// A user turn.
    User {
        /// The text (and images).
        content: Content,
    },
    /// An assistant turn from history, or the prefix to continue.
    Assistant {
        /// Answer text.
        content: String,
        /// Reasoning text, when kept.
        reasoning: Option<String>,
        /// Tool calls made in this turn.
        tool_calls: Option<Vec<ToolCall>>,
        /// Continue this message instead of opening a new turn (last message only).
        prefix: bool,
    },
    /// A tool result.
    Tool {
        /// The result (and images).
        content: Content,
        /// The call it answers.
        tool_call_id: Option<String>,
    },
    /// A latest-reminder block.
    LatestReminder {
        /// Reminder text.
        content: String,
    },
}

impl Message {
    /// A user message with text content.
    pub fn user(text: impl Into<String>) -> Self {
        Self::User {
            content: Content::text(text),
        }
    }

    /// A system message with text content.
    pub fn system(text: impl Into<String>) -> Self {
        Self::System {
            content: Content::text(text),
            tools: None,
        }
    }

    /// An assistant message with answer text only.
    pub fn assistant(text: impl Into<String>) -> Self {
        Self::Assistant {
            content: text.into(),
            reasoning: None,
            tool_calls: None,
            prefix: false,
        }
    }

    /// A tool result with text content.
    pub fn tool(call_id: impl Into<String>, text: impl Into<String>) -> Self {
        Self::Tool {
            content: Content::text(text),
            tool_call_id: Some(call_id.into()),
        }
    }
}

/// How much the model should reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasoningEffort {
    /// Light reasoning.
    Low,
    /// The default.
    High,
    /// Rendered like `High`.
    Xhigh,
    /// Maximum effort.
    Max,
}

/// Tool selection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model may answer or call a tool.
    #[default]
    Auto,
    /// No tool prompt.
    None,
    /// The output starts inside a tool-call block.
    Required,
}

/// The requested answer format.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum ResponseFormat {
    /// Free text.
    #[default]
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON following a schema (rendered into the prompt).
    JsonSchema(serde_json::Value),
    /// Text matching a regular expression (not rendered into the prompt).
    Regex(String),
}

/// A conversation and its prompt settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    /// Messages in order.
    pub messages: Vec<Message>,
    /// Whether the next assistant turn reasons first.
    pub thinking: bool,
    /// Client tools.
    pub tools: Vec<ToolDefinition>,
    /// Tool selection.
    pub tool_choice: ToolChoice,
    /// Reasoning effort (thinking mode only); `None` renders like `High`.
    pub reasoning_effort: Option<ReasoningEffort>,
    /// Answer format.
    pub response_format: ResponseFormat,
}

impl Default for Conversation {
    fn default() -> Self {
        Self {
            messages: Vec::new(),
            thinking: true,
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            reasoning_effort: None,
            response_format: ResponseFormat::Text,
        }
    }
}

impl Conversation {
    /// A conversation of `messages` with default settings (thinking on).
    pub fn new(messages: Vec<Message>) -> Self {
        Self {
            messages,
            ..Self::default()
        }
    }

    /// Whether the tool prompt is rendered: tools exist and choice is not `None`.
    pub fn renders_tool_prompt(&self) -> bool {
        self.tool_choice != ToolChoice::None && !self.tools.is_empty()
    }

    /// Whether the last message is an assistant prefix to continue.
    pub fn is_prefix_continuation(&self) -> bool {
        matches!(
            self.messages.last(),
            Some(Message::Assistant { prefix: true, .. })
        )
    }
}
