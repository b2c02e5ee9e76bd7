//! A reusable event buffer: the text of all events lives in one string and
//! events are ranges into it, so a caller that clears and refills the same
//! buffer on every push allocates nothing once the buffer has grown.

use std::ops::Range;

use super::{CompletionUsage, Event, FinishReason};

/// One buffered event: like [`Event`], with text as a range of the buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Slot {
    Reasoning(Range<usize>),
    Content(Range<usize>),
    ToolCallStart {
        index: usize,
        name: Range<usize>,
    },
    ToolCallArgs {
        index: usize,
        delta: Range<usize>,
    },
    ToolCallEnd {
        index: usize,
    },
    Finish {
        reason: FinishReason,
        stop_sequence: Option<Range<usize>>,
        usage: CompletionUsage,
    },
}

/// An event borrowed from an [`EventBuffer`] (or from an [`Event`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventRef<'a> {
    /// Reasoning text.
    Reasoning(&'a str),
    /// Answer text.
    Content(&'a str),
    /// A tool call opened; `index` counts calls from 0.
    ToolCallStart {
        /// Call index.
        index: usize,
        /// Function name.
        name: &'a str,
    },
    /// More JSON text of the call's arguments.
    ToolCallArgs {
        /// Call index.
        index: usize,
        /// Text to append.
        delta: &'a str,
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
        stop_sequence: Option<&'a str>,
        /// Token counts.
        usage: CompletionUsage,
    },
}

impl EventRef<'_> {
    /// An owned copy.
    pub fn to_event(&self) -> Event {
        match *self {
            EventRef::Reasoning(text) => Event::Reasoning(text.to_owned()),
            EventRef::Content(text) => Event::Content(text.to_owned()),
            EventRef::ToolCallStart { index, name } => Event::ToolCallStart {
                index,
                name: name.to_owned(),
            },
            EventRef::ToolCallArgs { index, delta } => Event::ToolCallArgs {
                index,
                delta: delta.to_owned(),
            },
            EventRef::ToolCallEnd { index } => Event::ToolCallEnd { index },
            EventRef::Finish {
                reason,
                stop_sequence,
                usage,
            } => Event::Finish {
                reason,
                stop_sequence: stop_sequence.map(str::to_owned),
                usage,
            },
        }
    }
}

impl Event {
    /// This event, borrowed.
    pub fn as_event_ref(&self) -> EventRef<'_> {
        match self {
            Event::Reasoning(text) => EventRef::Reasoning(text),
            Event::Content(text) => EventRef::Content(text),
            Event::ToolCallStart { index, name } => EventRef::ToolCallStart {
                index: *index,
                name,
            },
            Event::ToolCallArgs { index, delta } => EventRef::ToolCallArgs {
                index: *index,
                delta,
            },
            Event::ToolCallEnd { index } => EventRef::ToolCallEnd { index: *index },
            Event::Finish {
                reason,
                stop_sequence,
                usage,
            } => EventRef::Finish {
                reason: *reason,
                stop_sequence: stop_sequence.as_deref(),
                usage: *usage,
            },
        }
    }
}

/// Events of one or more pushes, with their text in one reusable string.
///
/// Fill it with [`super::StreamParser::push_tokens_buffered`], read it with
/// [`Self::iter`], then [`Self::clear`] it (capacity is kept).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventBuffer {
    text: String,
    slots: Vec<Slot>,
}

impl EventBuffer {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty buffer with room for `events` events and `bytes` bytes of text.
    pub fn with_capacity(events: usize, bytes: usize) -> Self {
        Self {
            text: String::with_capacity(bytes),
            slots: Vec::with_capacity(events),
        }
    }

    /// Drop all events, keeping the allocations.
    pub fn clear(&mut self) {
        self.text.clear();
        self.slots.clear();
    }

    /// Number of events.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether there is no event.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The event at `index`.
    pub fn get(&self, index: usize) -> Option<EventRef<'_>> {
        self.slots.get(index).map(|slot| self.view(slot))
    }

    /// The events in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = EventRef<'_>> + '_ {
        self.slots.iter().map(|slot| self.view(slot))
    }

    /// Owned copies of the events.
    pub fn to_events(&self) -> Vec<Event> {
        self.iter().map(|event| event.to_event()).collect()
    }

    /// Append an event (its text is copied into the buffer).
    pub fn push(&mut self, event: EventRef<'_>) {
        let slot = match event {
            EventRef::Reasoning(text) => Slot::Reasoning(self.store(text)),
            EventRef::Content(text) => Slot::Content(self.store(text)),
            EventRef::ToolCallStart { index, name } => Slot::ToolCallStart {
                index,
                name: self.store(name),
            },
            EventRef::ToolCallArgs { index, delta } => Slot::ToolCallArgs {
                index,
                delta: self.store(delta),
            },
            EventRef::ToolCallEnd { index } => Slot::ToolCallEnd { index },
            EventRef::Finish {
                reason,
                stop_sequence,
                usage,
            } => Slot::Finish {
                reason,
                stop_sequence: stop_sequence.map(|text| self.store(text)),
                usage,
            },
        };
        self.slots.push(slot);
    }

    /// Start of a text run appended with [`Self::append_text`].
    pub(crate) fn text_len(&self) -> usize {
        self.text.len()
    }

    pub(crate) fn append_text(&mut self, text: &str) {
        self.text.push_str(text);
    }

    /// Undo [`Self::append_text`] back to `len`.
    pub(crate) fn truncate_text(&mut self, len: usize) {
        self.text.truncate(len);
    }

    /// Text appended earlier.
    pub(crate) fn text_at(&self, range: Range<usize>) -> &str {
        &self.text[range]
    }

    /// Close a run appended earlier as one reasoning or content event.
    pub(crate) fn close_text(&mut self, range: Range<usize>, reasoning: bool) {
        self.slots.push(if reasoning {
            Slot::Reasoning(range)
        } else {
            Slot::Content(range)
        });
    }

    fn store(&mut self, text: &str) -> Range<usize> {
        let start = self.text.len();
        self.text.push_str(text);
        start..self.text.len()
    }

    fn view(&self, slot: &Slot) -> EventRef<'_> {
        let text = |range: &Range<usize>| &self.text[range.clone()];
        match slot {
            Slot::Reasoning(range) => EventRef::Reasoning(text(range)),
            Slot::Content(range) => EventRef::Content(text(range)),
            Slot::ToolCallStart { index, name } => EventRef::ToolCallStart {
                index: *index,
                name: text(name),
            },
            Slot::ToolCallArgs { index, delta } => EventRef::ToolCallArgs {
                index: *index,
                delta: text(delta),
            },
            Slot::ToolCallEnd { index } => EventRef::ToolCallEnd { index: *index },
            Slot::Finish {
                reason,
                stop_sequence,
                usage,
            } => EventRef::Finish {
                reason: *reason,
                stop_sequence: stop_sequence.as_ref().map(text),
                usage: *usage,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_through_the_buffer() {
        let events = vec![
            Event::Reasoning("think".into()),
            Event::Content(String::new()),
            Event::ToolCallStart {
                index: 0,
                name: "f".into(),
            },
            Event::ToolCallArgs {
                index: 0,
                delta: "{\"a\": \"é\"}".into(),
            },
            Event::ToolCallEnd { index: 0 },
            Event::Finish {
                reason: FinishReason::StopSequence,
                stop_sequence: Some("END".into()),
                usage: CompletionUsage {
                    completion_tokens: 3,
                    reasoning_tokens: Some(1),
                },
            },
        ];
        let mut buffer = EventBuffer::new();
        for event in &events {
            buffer.push(event.as_event_ref());
        }
        assert_eq!(buffer.len(), events.len());
        assert_eq!(buffer.to_events(), events);
        assert_eq!(buffer.get(3), Some(events[3].as_event_ref()));
        buffer.clear();
        assert!(buffer.is_empty() && buffer.get(0).is_none());
    }
}
