//! Turns scanner segments back into text events, one event per piece of
//! input (a special token, or the plain tokens of one push), so streamed
//! deltas follow the backend's chunking.

use std::collections::VecDeque;

use super::Event;
use super::scanner::Action;

#[derive(Debug, Default)]
pub(crate) struct Emitter {
    pieces: VecDeque<Vec<u8>>,
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

    pub fn push_piece(&mut self, bytes: Vec<u8>) {
        if !bytes.is_empty() {
            self.pieces.push_back(bytes);
        }
    }

    /// Nothing queued: a text event may be emitted directly.
    pub fn is_idle(&self) -> bool {
        self.pieces.is_empty() && self.pending.is_none_or(|(_, len)| len == 0)
    }

    /// Emit a whole piece of answer or reasoning text directly.
    pub fn emit_text(&mut self, action: Action, text: String, events: &mut Vec<Event>) {
        self.previous = Some(action);
        match action {
            Action::Reasoning => {
                self.reasoning.push_str(&text);
                events.push(Event::Reasoning(text));
            }
            _ => events.push(Event::Content(text)),
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
    pub fn apply(&mut self, segments: &[(Action, usize)], last: bool, events: &mut Vec<Event>) {
        for &(action, len) in segments {
            match &mut self.pending {
                Some((pending, count)) if *pending == action => *count += len,
                _ => {
                    self.flush_pending(events);
                    self.pending = Some((action, len));
                }
            }
        }
        self.take_whole_pieces(events);
        if last {
            self.flush_pending(events);
        }
    }

    /// Emit the pending segment over whole pieces, then its partial rest.
    fn flush_pending(&mut self, events: &mut Vec<Event>) {
        self.take_whole_pieces(events);
        if let Some((action, len)) = self.pending.take()
            && len > 0
        {
            self.take(action, len, events);
        }
    }

    fn take_whole_pieces(&mut self, events: &mut Vec<Event>) {
        while let (Some((action, len)), Some(front)) = (self.pending, self.pieces.front()) {
            let front_len = front.len();
            if front_len > len {
                break;
            }
            self.take(action, front_len, events);
            self.pending = Some((action, len - front_len));
        }
    }

    /// Take `len` bytes (at most the front piece) as `action`.
    fn take(&mut self, action: Action, len: usize, events: &mut Vec<Event>) {
        let Some(mut piece) = self.pieces.pop_front() else {
            return;
        };
        if len < piece.len() {
            let rest = piece.split_off(len);
            self.pieces.push_front(rest);
        }
        let first = self.previous != Some(action);
        self.previous = Some(action);

        match action {
            Action::Content => events.push(Event::Content(into_text(piece))),
            Action::Reasoning => {
                let text = into_text(piece);
                self.reasoning.push_str(&text);
                events.push(Event::Reasoning(text));
            }
            Action::ToSpace => events.push(Event::Content(" ".to_owned())),
            Action::Skip | Action::ToolCallBegin => {}
            Action::StopSequence => self
                .stop
                .get_or_insert_with(String::new)
                .push_str(&into_text(piece)),
            Action::ToolName => self.name.extend_from_slice(&piece),
            Action::ToolNameEnd => {
                if first {
                    let name =
                        String::from_utf8_lossy(&std::mem::take(&mut self.name)).into_owned();
                    events.push(Event::ToolCallStart {
                        index: self.calls,
                        name,
                    });
                    self.calls += 1;
                }
            }
            Action::ArgLabel(label) => {
                if first {
                    events.push(self.args(label.to_owned()));
                }
            }
            Action::ArgText { string } => {
                let text = into_text(piece);
                let delta = if string { escape_json(&text) } else { text };
                events.push(self.args(delta));
            }
            Action::ArgEnd(closing) => {
                if first {
                    events.push(self.args(closing.to_owned()));
                    events.push(Event::ToolCallEnd {
                        index: self.calls.saturating_sub(1),
                    });
                }
            }
            Action::Label(label) => {
                if first {
                    events.push(Event::Content(label.to_owned()));
                }
            }
        }
    }

    fn args(&self, delta: String) -> Event {
        Event::ToolCallArgs {
            index: self.calls.saturating_sub(1),
            delta,
        }
    }
}

/// Pieces are whole UTF-8 runs, so this moves rather than copies (a piece
/// split inside a character falls back to lossy text).
fn into_text(piece: Vec<u8>) -> String {
    match String::from_utf8(piece) {
        Ok(text) => text,
        Err(error) => String::from_utf8_lossy(error.as_bytes()).into_owned(),
    }
}

/// The inside of a JSON string literal for `text`.
fn escape_json(text: &str) -> String {
    let quoted = serde_json::Value::String(text.to_owned()).to_string();
    quoted[1..quoted.len() - 1].to_owned()
}
