//! Streaming output parser: token ids in, events out.
//!
//! Markup (`</think>`, the DSML tool-call block) is recognised only when its
//! special part comes from the reserved token id, so text that merely spells
//! `</think>` stays text. Incomplete UTF-8 at the end of a push is buffered
//! until a later token completes it. Stop sequences are matched in the answer
//! across token boundaries, and text is released as soon as it cannot be part
//! of a stop sequence or marker.

mod emitter;
mod scanner;

use std::sync::Arc;

use emitter::Emitter;
use scanner::{Action, MarkupSpellings, Provenance, Scanner, Stage};

use crate::protocol::{ParsingOptions, ThinkingStart};
use crate::special::{SpecialToken, SpecialTokens};
use crate::tokenizer::PromptTokenizer;

/// Why the backend stopped generating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendFinish {
    /// End of sequence (or a stop token).
    Stop,
    /// Token limit reached.
    Length,
    /// Filtered.
    ContentFilter,
}

/// Why the response finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// Natural end.
    Stop,
    /// Natural end after tool calls.
    ToolCalls,
    /// Token limit.
    Length,
    /// Filtered.
    ContentFilter,
    /// A stop sequence matched.
    StopSequence,
    /// The stream ended without a finish from the backend.
    EndOfStream,
}

/// Token counts of the generated output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompletionUsage {
    /// Tokens consumed (up to a matched stop sequence).
    pub completion_tokens: u32,
    /// Tokens of the reasoning text (thinking mode only).
    pub reasoning_tokens: Option<u32>,
}

/// One parsed event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Reasoning text.
    Reasoning(String),
    /// Answer text.
    Content(String),
    /// A tool call opened; `index` counts calls from 0.
    ToolCallStart {
        /// Call index.
        index: usize,
        /// Function name.
        name: String,
    },
    /// More JSON text of the call's arguments.
    ToolCallArgs {
        /// Call index.
        index: usize,
        /// Text to append.
        delta: String,
    },
    /// The call's arguments are complete.
    ToolCallEnd {
        /// Call index.
        index: usize,
    },
    /// The output is complete.
    Finish {
        /// Why.
        reason: FinishReason,
        /// The stop sequence that matched, if any.
        stop_sequence: Option<String>,
        /// Token counts.
        usage: CompletionUsage,
    },
}

/// Parses one output stream.
#[derive(Debug)]
pub struct StreamParser {
    tokenizer: Arc<PromptTokenizer>,
    scanner: Scanner,
    emitter: Emitter,
    /// Plain token bytes not yet released (incomplete UTF-8), and their count.
    pending: Vec<u8>,
    pending_tokens: u32,
    segments: Vec<(Action, usize)>,
    thinking: bool,
    completion_tokens: u32,
    stopped: bool,
    reserved: Arc<Vec<bool>>,
}

impl StreamParser {
    /// A parser with the DeepSeek spellings.
    pub fn new(tokenizer: Arc<PromptTokenizer>, options: &ParsingOptions) -> Self {
        Self::with_special_tokens(tokenizer, options, &SpecialTokens::deepseek())
    }

    /// A parser with custom spellings (ids still come from the tokenizer).
    pub fn with_special_tokens(
        tokenizer: Arc<PromptTokenizer>,
        options: &ParsingOptions,
        tokens: &SpecialTokens,
    ) -> Self {
        let stage = if options.starts_in_tool_calls {
            Stage::ToolCalls
        } else {
            match options.thinking {
                Some(ThinkingStart::ReasoningStart) => Stage::Reasoning { strip: true },
                Some(ThinkingStart::ReasoningContinuation) => Stage::Reasoning { strip: false },
                Some(ThinkingStart::ContentContinuation) => Stage::Content { strip: false },
                None => Stage::Content { strip: true },
            }
        };
        let spellings = MarkupSpellings {
            dsml: tokens.spelling(SpecialToken::Dsml).as_bytes().to_vec(),
            thinking_end: tokens
                .spelling(SpecialToken::ThinkingEnd)
                .as_bytes()
                .to_vec(),
            stop_sequences: options
                .stop_sequences
                .iter()
                .filter(|s| !s.is_empty())
                .map(|s| s.as_bytes().to_vec())
                .collect(),
            tools: options.parse_tool_calls,
            json: options.parse_json_output,
        };
        let reserved = tokenizer.reserved_mask();
        Self {
            scanner: Scanner::new(stage, spellings),
            emitter: Emitter::new(),
            pending: Vec::new(),
            pending_tokens: 0,
            segments: Vec::new(),
            thinking: options.thinking.is_some(),
            completion_tokens: 0,
            stopped: false,
            reserved,
            tokenizer,
        }
    }

    /// Whether a stop sequence ended the output (later input is ignored).
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Feed one backend chunk of token ids. Ids outside the vocabulary are
    /// treated as empty tokens.
    pub fn push_tokens(&mut self, ids: &[u32]) -> Vec<Event> {
        let mut events = Vec::new();
        if self.stopped {
            return events;
        }
        let table = Arc::clone(&self.tokenizer);
        let bytes = table.token_bytes();
        for &id in ids {
            let token: &[u8] = bytes.get(id as usize).map_or(&[], Vec::as_slice);
            if self.reserved.get(id as usize).copied().unwrap_or(false) {
                self.flush_plain(true, &mut events);
                if self.stopped {
                    return events;
                }
                self.feed_piece(token.to_vec(), 1, Provenance::Special, &mut events);
                if self.stopped {
                    return events;
                }
            } else {
                self.pending.extend_from_slice(token);
                self.pending_tokens += 1;
            }
        }
        self.flush_plain(false, &mut events);
        events
    }

    /// Feed text from a backend without token ids (markers then match by
    /// spelling), counting `token_count` tokens.
    pub fn push_text(&mut self, text: &str, token_count: u32) -> Vec<Event> {
        let mut events = Vec::new();
        if !self.stopped && !text.is_empty() {
            self.flush_plain(true, &mut events);
            if !self.stopped {
                self.feed_piece(
                    text.as_bytes().to_vec(),
                    token_count,
                    Provenance::Unknown,
                    &mut events,
                );
            }
        }
        events
    }

    /// Finish the stream: release held text and report the finish.
    pub fn finish(mut self, backend: Option<BackendFinish>) -> Vec<Event> {
        let mut events = Vec::new();
        if !self.stopped {
            self.flush_plain(true, &mut events);
        }
        self.segments.clear();
        self.scanner.finish(&mut self.segments);
        self.emitter.apply(&self.segments, true, &mut events);
        let has_calls = self.emitter.tool_calls() > 0;
        let reason = if self.emitter.stop_sequence().is_some() {
            FinishReason::StopSequence
        } else {
            match backend {
                Some(BackendFinish::Stop) if has_calls => FinishReason::ToolCalls,
                Some(BackendFinish::Stop) => FinishReason::Stop,
                Some(BackendFinish::Length) => FinishReason::Length,
                Some(BackendFinish::ContentFilter) => FinishReason::ContentFilter,
                None => FinishReason::EndOfStream,
            }
        };
        let reasoning_tokens = self.thinking.then(|| {
            self.tokenizer
                .encode_plain(self.emitter.reasoning())
                .map_or(0, |ids| ids.len() as u32)
        });
        events.push(Event::Finish {
            reason,
            stop_sequence: self.emitter.stop_sequence().map(str::to_owned),
            usage: CompletionUsage {
                completion_tokens: self.completion_tokens,
                reasoning_tokens,
            },
        });
        events
    }

    fn flush_plain(&mut self, force: bool, events: &mut Vec<Event>) {
        if self.pending.is_empty() {
            return;
        }
        // Keep the whole run while its end is an incomplete character.
        if !force
            && let Err(error) = std::str::from_utf8(&self.pending)
            && error.error_len().is_none()
        {
            return;
        }
        let bytes = std::mem::take(&mut self.pending);
        let count = std::mem::take(&mut self.pending_tokens);
        let text = match String::from_utf8(bytes) {
            Ok(text) => text.into_bytes(),
            Err(error) => String::from_utf8_lossy(error.as_bytes())
                .into_owned()
                .into_bytes(),
        };
        self.feed_piece(text, count, Provenance::Plain, events);
    }

    fn feed_piece(
        &mut self,
        bytes: Vec<u8>,
        tokens: u32,
        provenance: Provenance,
        events: &mut Vec<Event>,
    ) {
        self.completion_tokens += tokens;
        self.segments.clear();
        self.scanner.feed(&bytes, provenance, &mut self.segments);
        self.emitter.push_piece(bytes);
        self.emitter.apply(&self.segments, false, events);
        if self.emitter.stop_sequence().is_some() {
            self.stopped = true;
        }
    }
}
