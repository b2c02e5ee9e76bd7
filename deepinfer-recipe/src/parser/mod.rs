//! Streaming output parser: token ids in, events out.
//!
//! Markup (`</think>`, the DSML tool-call block) is recognised only when its
//! special part comes from the reserved token id, so text that merely spells
//! `</think>` stays text. Incomplete UTF-8 at the end of a push is buffered
//! until a later token completes it. Stop sequences are matched in the answer
//! across token boundaries, and text is released as soon as it cannot be part
//! of a stop sequence or marker.

mod assemble;
mod buffer;
mod emitter;
mod scanner;

use std::sync::Arc;

pub use assemble::{Assembled, ToolCallText};
pub use buffer::{EventBuffer, EventRef};
use emitter::{Emitter, EventSink};
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
    /// Off only in tests that compare the one-pass path with the general one.
    plain_runs: bool,
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
            plain_runs: true,
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
        self.push_tokens_into(ids, &mut events);
        events
    }

    /// [`Self::push_tokens`], appending to a caller's event buffer (no
    /// allocation for the list itself).
    pub fn push_tokens_into(&mut self, ids: &[u32], events: &mut Vec<Event>) {
        if self.stopped || self.push_plain_run(ids, events) {
            return;
        }
        self.push_general(ids, events);
    }

    /// The general path: markup, held bytes, split characters.
    fn push_general(&mut self, ids: &[u32], out: &mut impl EventSink) {
        let table = Arc::clone(&self.tokenizer);
        let bytes = table.token_bytes();
        for &id in ids {
            let token: &[u8] = bytes.get(id as usize).map_or(&[], Vec::as_slice);
            if self.reserved.get(id as usize).copied().unwrap_or(false) {
                self.flush_plain(true, out);
                if self.stopped {
                    return;
                }
                self.feed_piece(token, 1, Provenance::Special, out);
                if self.stopped {
                    return;
                }
            } else {
                self.pending.extend_from_slice(token);
                self.pending_tokens += 1;
            }
        }
        self.flush_plain(false, out);
    }

    /// [`Self::push_tokens`], appending to a reusable [`EventBuffer`]: the
    /// same events, but a push of ordinary text (the common case) allocates
    /// nothing once the buffer has grown.
    pub fn push_tokens_buffered(&mut self, ids: &[u32], out: &mut EventBuffer) {
        if self.stopped || self.push_plain_run_buffered(ids, out) {
            return;
        }
        self.push_general(ids, out);
    }

    /// [`Self::push_plain_run`] writing straight into the buffer's text,
    /// and also taken when the scanner holds only newlines waiting to be
    /// absorbed before a marker (ends of lines): text that cannot start a
    /// marker releases them, one event per queued piece, as the general path
    /// would. Tokens must each be complete UTF-8 here (a split character
    /// takes the general path, which gives the same events).
    fn push_plain_run_buffered(&mut self, ids: &[u32], out: &mut EventBuffer) -> bool {
        if !self.plain_runs || !self.pending.is_empty() {
            return false;
        }
        let Some((action, starts)) = self.scanner.text_action_after_newlines() else {
            return false;
        };
        if !self.emitter.can_release_as(action) {
            return false;
        }
        let texts = self.tokenizer.token_texts();
        let plain = |text: &str| !text.bytes().any(|b| starts[b as usize]);
        // The last token may end in newlines: they are held (see below).
        let Some((&last, init)) = ids.split_last() else {
            return false;
        };
        let last_text = texts.get(last).unwrap_or("\u{0}");
        let last_body = if last_text.ends_with('\n') {
            last_text.trim_end_matches('\n')
        } else {
            last_text
        };
        let newlines = last_text.len() - last_body.len();
        if newlines > 0 {
            if !plain(last_body) {
                return false;
            }
            let mut text_len = last_body.len();
            for &id in init {
                match texts.get(id) {
                    Some(text) if plain(text) => text_len += text.len(),
                    _ => return false,
                }
            }
            let after_text = text_len > 0;
            if !self.scanner.can_hold_newlines(after_text) {
                return false;
            }
            // Released text stays queued with its newlines, as the general
            // path leaves it: the piece is one event once they are released.
            self.completion_tokens += ids.len() as u32;
            self.scanner.hold_newlines(newlines, after_text);
            if after_text {
                self.emitter.release_queued(action, out);
            }
            let parts = init
                .iter()
                .map(|&id| texts.get(id).unwrap_or("").as_bytes());
            self.emitter
                .queue_piece(parts.chain([last_text.as_bytes()]), action, text_len);
            return true;
        }
        let start = out.text_len();
        for &id in ids {
            match texts.get(id) {
                Some(text) if plain(text) => out.append_text(text),
                _ => {
                    out.truncate_text(start);
                    return false;
                }
            }
        }
        let run = start..out.text_len();
        if run.is_empty() {
            return false;
        }
        self.completion_tokens += ids.len() as u32;
        self.scanner.note_released_all();
        self.emitter.release_queued(action, out);
        self.emitter.note_text(action, out.text_at(run.clone()));
        out.close_text(run, action == Action::Reasoning);
        true
    }

    /// The common case on one pass: a push of ordinary tokens whose text is
    /// complete UTF-8 and holds no byte that could start markup or a stop
    /// sequence, while nothing is held back. It becomes one text event,
    /// exactly as the general path would make it. Returns false (having
    /// changed nothing) when the push needs the general path.
    fn push_plain_run(&mut self, ids: &[u32], events: &mut Vec<Event>) -> bool {
        if !self.plain_runs || !self.pending.is_empty() || !self.emitter.is_idle() {
            return false;
        }
        let Some((action, starts)) = self.scanner.idle_text_action() else {
            return false;
        };
        let table = self.tokenizer.token_bytes();
        let mut text = Vec::with_capacity(ids.len() * 8);
        for &id in ids {
            if self.reserved.get(id as usize).copied().unwrap_or(false) {
                return false;
            }
            let token: &[u8] = table.get(id as usize).map_or(&[], Vec::as_slice);
            if token.iter().any(|&b| starts[b as usize]) {
                return false;
            }
            text.extend_from_slice(token);
        }
        let Ok(text) = String::from_utf8(text) else {
            return false;
        };
        if text.is_empty() {
            return false;
        }
        self.completion_tokens += ids.len() as u32;
        self.scanner.note_released();
        self.emitter.emit_text(action, text, events);
        true
    }

    /// Feed text from a backend without token ids (markers then match by
    /// spelling), counting `token_count` tokens.
    pub fn push_text(&mut self, text: &str, token_count: u32) -> Vec<Event> {
        let mut events = Vec::new();
        if !self.stopped && !text.is_empty() {
            self.flush_plain(true, &mut events);
            if !self.stopped {
                self.feed_piece(
                    text.as_bytes(),
                    token_count,
                    Provenance::Unknown,
                    &mut events,
                );
            }
        }
        events
    }

    /// Finish the stream: release held text and report the finish.
    pub fn finish(self, backend: Option<BackendFinish>) -> Vec<Event> {
        let mut events = Vec::new();
        self.finish_to(backend, &mut events);
        events
    }

    /// [`Self::finish`], appending to an [`EventBuffer`].
    pub fn finish_into(self, backend: Option<BackendFinish>, out: &mut EventBuffer) {
        self.finish_to(backend, out);
    }

    fn finish_to(mut self, backend: Option<BackendFinish>, out: &mut impl EventSink) {
        if !self.stopped {
            self.flush_plain(true, out);
        }
        self.segments.clear();
        self.scanner.finish(&mut self.segments);
        self.emitter.apply(&self.segments, true, out);
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
        out.event(EventRef::Finish {
            reason,
            stop_sequence: self.emitter.stop_sequence(),
            usage: CompletionUsage {
                completion_tokens: self.completion_tokens,
                reasoning_tokens,
            },
        });
    }

    fn flush_plain(&mut self, force: bool, out: &mut impl EventSink) {
        if self.pending.is_empty() {
            // Tokens without bytes (ids outside the vocabulary) still count.
            self.completion_tokens += std::mem::take(&mut self.pending_tokens);
            return;
        }
        let pending = std::mem::take(&mut self.pending);
        let count = std::mem::take(&mut self.pending_tokens);
        match std::str::from_utf8(&pending) {
            Ok(_) => self.feed_piece(&pending, count, Provenance::Plain, out),
            // Keep the whole run while its end is an incomplete character.
            Err(error) if !force && error.error_len().is_none() => {
                self.pending = pending;
                self.pending_tokens = count;
                return;
            }
            Err(_) => {
                let text = String::from_utf8_lossy(&pending).into_owned();
                self.feed_piece(text.as_bytes(), count, Provenance::Plain, out);
            }
        }
        // `pending` keeps its capacity for the next push.
        self.pending = pending;
        self.pending.clear();
    }

    fn feed_piece(
        &mut self,
        bytes: &[u8],
        tokens: u32,
        provenance: Provenance,
        out: &mut impl EventSink,
    ) {
        self.completion_tokens += tokens;
        self.segments.clear();
        self.scanner.feed(bytes, provenance, &mut self.segments);
        self.emitter.push_piece(bytes);
        self.emitter.apply(&self.segments, false, out);
        if self.emitter.stop_sequence().is_some() {
            self.stopped = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::OnceLock;

    use proptest::prelude::*;

    use super::*;

    fn tokenizer() -> Arc<PromptTokenizer> {
        static TOKENIZER: OnceLock<Arc<PromptTokenizer>> = OnceLock::new();
        TOKENIZER
            .get_or_init(|| Arc::new(PromptTokenizer::deepseek_v4().expect("vendored tokenizer")))
            .clone()
    }

    fn run(ids: &[u32], cuts: &[usize], options: &ParsingOptions, plain_runs: bool) -> Vec<Event> {
        let mut parser = StreamParser::new(tokenizer(), options);
        parser.plain_runs = plain_runs;
        let mut events = Vec::new();
        let mut at = 0;
        for &cut in cuts.iter().cycle() {
            if at >= ids.len() {
                break;
            }
            let end = (at + cut).min(ids.len());
            parser.push_tokens_into(&ids[at..end], &mut events);
            at = end;
        }
        events.extend(parser.finish(Some(BackendFinish::Stop)));
        events
    }

    /// The buffered path, reading and clearing the buffer after every
    /// `drain_every` pushes.
    fn run_buffered(
        ids: &[u32],
        cuts: &[usize],
        options: &ParsingOptions,
        drain_every: usize,
    ) -> Vec<Event> {
        let mut parser = StreamParser::new(tokenizer(), options);
        let mut buffer = EventBuffer::new();
        let mut events = Vec::new();
        let mut at = 0;
        let mut pushes = 0;
        for &cut in cuts.iter().cycle() {
            if at >= ids.len() {
                break;
            }
            let end = (at + cut).min(ids.len());
            parser.push_tokens_buffered(&ids[at..end], &mut buffer);
            at = end;
            pushes += 1;
            if pushes % drain_every == 0 {
                events.extend(buffer.iter().map(|event| event.to_event()));
                buffer.clear();
            }
        }
        parser.finish_into(Some(BackendFinish::Stop), &mut buffer);
        events.extend(buffer.to_events());
        events
    }

    /// Regression (found by the differential fuzz body): tokens without
    /// bytes at the end of a push were never counted.
    #[test]
    fn ids_outside_the_vocabulary_are_counted() {
        let tokenizer = tokenizer();
        let mut ids = tokenizer.encode_plain("Hello world").unwrap();
        ids.push(u32::MAX);
        let options = ParsingOptions {
            parse_tool_calls: true,
            starts_in_tool_calls: false,
            parse_json_output: false,
            thinking: None,
            stop_sequences: Vec::new(),
        };
        for cuts in [&[1][..], &[16]] {
            for events in [
                run(&ids, cuts, &options, false),
                run(&ids, cuts, &options, true),
                run_buffered(&ids, cuts, &options, 1),
            ] {
                let Some(Event::Finish { usage, .. }) = events.last() else {
                    panic!("no finish");
                };
                assert_eq!(usage.completion_tokens, ids.len() as u32);
            }
        }
    }

    #[test]
    fn held_newlines_before_a_newline_stop_sequence_stay_on_the_general_path() {
        let tokenizer = tokenizer();
        let mut ids = Vec::new();
        for piece in ["Hello", "\n", "X", " more"] {
            ids.extend(tokenizer.encode_plain(piece).unwrap());
        }
        let options = ParsingOptions {
            parse_tool_calls: true,
            starts_in_tool_calls: false,
            parse_json_output: false,
            thinking: None,
            stop_sequences: vec!["\nX".into()],
        };
        let general = run(&ids, &[1], &options, false);
        assert!(general.iter().any(|event| matches!(
            event,
            Event::Finish {
                reason: FinishReason::StopSequence,
                ..
            }
        )));
        assert_eq!(run_buffered(&ids, &[1], &options, 1), general);
        assert_eq!(run(&ids, &[1], &options, true), general);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// The one-pass path for plain runs, and the buffered path, give
        /// exactly the events of the general path, for any chunking.
        #[test]
        fn plain_runs_match_the_general_path(
            pieces in prop::collection::vec(prop::sample::select(vec![
                "Hello", " world", "\n", "\n\n", "<", "</", " calls>", "END", "E", "你好",
                "é", "{\"a\": 1}", "```json\n", "invoke name=\"f\">", "</think>", "<｜DSML｜",
                "<｜end▁of▁sentence｜>", "X", "end.\n", "ok\n\n", ".\n",
            ]), 0..40),
            cuts in prop::collection::vec(1usize..6, 1..10),
            thinking in any::<bool>(),
            json in any::<bool>(),
            split_utf8 in any::<bool>(),
            drain_every in 1usize..4,
            newline_stop in any::<bool>(),
        ) {
            let tokenizer = tokenizer();
            let mut ids = Vec::new();
            for piece in &pieces {
                match tokenizer.special_id(piece) {
                    Some(id) if piece.starts_with("</think") || piece.starts_with("<｜end") => ids.push(id),
                    _ if *piece == "<｜DSML｜" => {
                        ids.extend(tokenizer.encode_plain("<").unwrap());
                        ids.push(tokenizer.special_id("｜DSML｜").unwrap());
                    }
                    _ => ids.extend(tokenizer.encode_plain(piece).unwrap()),
                }
            }
            if split_utf8 {
                // A token that is an incomplete character.
                let partial = tokenizer.encode_plain("\u{1d518}").unwrap()[0];
                prop_assert!(std::str::from_utf8(&tokenizer.decode_bytes(&[partial]).unwrap()).is_err());
                ids.insert(ids.len() / 2, partial);
            }
            let options = ParsingOptions {
                parse_tool_calls: true,
                starts_in_tool_calls: false,
                parse_json_output: json,
                thinking: thinking.then_some(ThinkingStart::ReasoningStart),
                // A stop sequence that starts with a newline keeps held
                // newlines on the general path.
                stop_sequences: if newline_stop {
                    vec!["END".into(), "\nX".into()]
                } else {
                    vec!["END".into()]
                },
            };
            let general = run(&ids, &cuts, &options, false);
            prop_assert_eq!(&run(&ids, &cuts, &options, true), &general);
            // The allocation-free buffered path gives the same events too.
            prop_assert_eq!(&run_buffered(&ids, &cuts, &options, drain_every), &general);
        }
    }
}
