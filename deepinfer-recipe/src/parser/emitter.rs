//! Turns scanner segments back into text events, one event per piece of
//! input (a special token, or the plain tokens of one push), so streamed
//! deltas follow the backend's chunking.
//!
//! The bytes of queued pieces live in one reused byte queue, and events go
//! to an [`EventSink`]: owned [`Event`]s for `Vec<Event>`, ranges of one
//! string for [`EventBuffer`] (no allocation per event).

use std::borrow::Cow;
use std::collections::VecDeque;

use super::Event;
use super::buffer::{EventBuffer, EventRef};
use super::scanner::Action;

/// Where the parser's events go.
pub(crate) trait EventSink {
    /// Answer (`reasoning == false`) or reasoning text.
    fn text(&mut self, reasoning: bool, text: &str);
    /// Any event.
    fn event(&mut self, event: EventRef<'_>);
}

impl EventSink for Vec<Event> {
    fn text(&mut self, reasoning: bool, text: &str) {
        self.push(if reasoning {
            Event::Reasoning(text.to_owned())
        } else {
            Event::Content(text.to_owned())
        });
    }

    fn event(&mut self, event: EventRef<'_>) {
        self.push(event.to_event());
    }
}

impl EventSink for EventBuffer {
    fn text(&mut self, reasoning: bool, text: &str) {
        self.push(if reasoning {
            EventRef::Reasoning(text)
        } else {
            EventRef::Content(text)
        });
    }

    fn event(&mut self, event: EventRef<'_>) {
        self.push(event);
    }
}

#[derive(Debug, Default)]
pub(crate) struct Emitter {
    /// Bytes of the queued pieces, from `head` on.
    bytes: Vec<u8>,
    head: usize,
    /// Lengths of the queued pieces (none empty).
    pieces: VecDeque<usize>,
    pending: Option<(Action, usize)>,
    previous: Option<Action>,
    name: Vec<u8>,
    reasoning: String,
    stop: Option<String>,
    calls: usize,
}

impl Emitter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push_piece(&mut self, bytes: &[u8]) {
        if !bytes.is_empty() {
            self.bytes.extend_from_slice(bytes);
            self.pieces.push_back(bytes.len());
        }
    }

    /// Nothing queued: a text event may be emitted directly.
    pub fn is_idle(&self) -> bool {
        self.pieces.is_empty() && self.pending.is_none_or(|(_, len)| len == 0)
    }

    /// Emit a whole piece of answer or reasoning text directly.
    pub fn emit_text(&mut self, action: Action, text: String, events: &mut Vec<Event>) {
        self.note_text(action, &text);
        match action {
            Action::Reasoning => events.push(Event::Reasoning(text)),
            _ => events.push(Event::Content(text)),
        }
    }

    /// Record a piece of answer or reasoning text that the caller emits
    /// itself (the buffered path).
    pub fn note_text(&mut self, action: Action, text: &str) {
        self.previous = Some(action);
        if action == Action::Reasoning {
            self.reasoning.push_str(text);
        }
    }

    /// Whether all queued bytes may go out as `action` text: nothing is
    /// pending under another action.
    pub fn can_release_as(&self, action: Action) -> bool {
        self.pending
            .is_none_or(|(pending, len)| len == 0 || pending == action)
    }

    /// Emit every queued piece whole as `action`, as the general path does
    /// when held bytes are released together with the next text.
    #[inline]
    pub fn release_queued(&mut self, action: Action, out: &mut impl EventSink) {
        while let Some(&front) = self.pieces.front() {
            self.take(action, front, out);
        }
        self.pending = None;
    }

    /// Queue one piece made of `parts`, of which the first `released`
    /// bytes are released as `action` (the rest is held by the scanner), as
    /// the general path leaves it. Whole earlier pieces must have been
    /// released already when `released > 0`.
    pub fn queue_piece<'a>(
        &mut self,
        parts: impl Iterator<Item = &'a [u8]>,
        action: Action,
        released: usize,
    ) {
        let before = self.bytes.len();
        for part in parts {
            self.bytes.extend_from_slice(part);
        }
        let len = self.bytes.len() - before;
        if len > 0 {
            self.pieces.push_back(len);
        }
        if released > 0 {
            self.pending = Some((action, released));
        }
    }

    pub fn reasoning(&self) -> &str {
        &self.reasoning
    }

    pub fn stop_sequence(&self) -> Option<&str> {
        self.stop.as_deref()
    }

    pub fn tool_calls(&self) -> usize {
        self.calls
    }

    /// Apply segments; with `last`, flush everything.
    pub fn apply(&mut self, segments: &[(Action, usize)], last: bool, out: &mut impl EventSink) {
        for &(action, len) in segments {
            match &mut self.pending {
                Some((pending, count)) if *pending == action => *count += len,
                _ => {
                    self.flush_pending(out);
                    self.pending = Some((action, len));
                }
            }
        }
        self.take_whole_pieces(out);
        if last {
            self.flush_pending(out);
        }
    }

    /// Emit the pending segment over whole pieces, then its partial rest.
    fn flush_pending(&mut self, out: &mut impl EventSink) {
        self.take_whole_pieces(out);
        if let Some((action, len)) = self.pending.take()
            && len > 0
        {
            self.take(action, len, out);
        }
    }

    fn take_whole_pieces(&mut self, out: &mut impl EventSink) {
        while let (Some((action, len)), Some(&front)) = (self.pending, self.pieces.front()) {
            if front > len {
                break;
            }
            self.take(action, front, out);
            self.pending = Some((action, len - front));
        }
    }

    /// Take `len` bytes (at most the front piece) as `action`.
    fn take(&mut self, action: Action, len: usize, out: &mut impl EventSink) {
        let Some(front) = self.pieces.front_mut() else {
            return;
        };
        let len = len.min(*front);
        *front -= len;
        if *front == 0 {
            self.pieces.pop_front();
        }
        let start = self.head;
        self.head += len;
        let first = self.previous != Some(action);
        self.previous = Some(action);
        let piece = &self.bytes[start..self.head];

        match action {
            Action::Content => out.text(false, &as_text(piece)),
            Action::Reasoning => {
                let text = as_text(piece);
                self.reasoning.push_str(&text);
                out.text(true, &text);
            }
            Action::ToSpace => out.text(false, " "),
            Action::Skip | Action::ToolCallBegin => {}
            Action::StopSequence => self
                .stop
                .get_or_insert_with(String::new)
                .push_str(&as_text(piece)),
            Action::ToolName => self.name.extend_from_slice(piece),
            Action::ToolNameEnd => {
                if first {
                    let name = String::from_utf8_lossy(&self.name).into_owned();
                    self.name.clear();
                    out.event(EventRef::ToolCallStart {
                        index: self.calls,
                        name: &name,
                    });
                    self.calls += 1;
                }
            }
            Action::ArgLabel(label) => {
                if first {
                    out.event(args(self.calls, label));
                }
            }
            Action::ArgText { string } => {
                let text = as_text(piece);
                if string {
                    out.event(args(self.calls, &escape_json(&text)));
                } else {
                    out.event(args(self.calls, &text));
                }
            }
            Action::ArgEnd(closing) => {
                if first {
                    out.event(args(self.calls, closing));
                    out.event(EventRef::ToolCallEnd {
                        index: self.calls.saturating_sub(1),
                    });
                }
            }
            Action::Label(label) => {
                if first {
                    out.text(false, label);
                }
            }
        }
        if self.pieces.is_empty() {
            // Everything queued was taken: reuse the queue from the start.
            self.bytes.clear();
            self.head = 0;
        }
    }
}

fn args(calls: usize, delta: &str) -> EventRef<'_> {
    EventRef::ToolCallArgs {
        index: calls.saturating_sub(1),
        delta,
    }
}

/// Pieces are whole UTF-8 runs, so this borrows (a piece split inside a
/// character falls back to lossy text).
fn as_text(piece: &[u8]) -> Cow<'_, str> {
    String::from_utf8_lossy(piece)
}

/// The inside of a JSON string literal for `text`.
fn escape_json(text: &str) -> String {
    let quoted = serde_json::Value::String(text.to_owned()).to_string();
    quoted[1..quoted.len() - 1].to_owned()
}
