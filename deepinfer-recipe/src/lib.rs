//! # deepinfer-recipe
//!
//! Prompt rendering, API protocols, streaming output parsing and structured outputs. Part of the deepinfer workspace; see the crate README.
#![doc = include_str!("../README.md")]

pub mod conversation;
pub mod grammar;
pub mod json_style;
pub mod parser;
pub mod prompt;
pub mod protocol;
pub mod render;
pub mod special;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tokenizer;

pub use conversation::{Content, Conversation, Message, Part, ToolCall, ToolDefinition};
pub use parser::{BackendFinish, Event, EventBuffer, EventRef, FinishReason, StreamParser};
pub use prompt::{Piece, PromptBuilder, RenderedPrompt};
pub use render::{PromptFormat, Renderer};
pub use special::{SpecialToken, SpecialTokens};
pub use tokenizer::{PromptTokenizer, TokenizerError};

/// The crate's version, as packaged.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
