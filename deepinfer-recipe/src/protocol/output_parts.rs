//! The output parts that the Messages and Responses streams both keep:
//! reasoning, answer text and tool calls in stream order, the last one
//! possibly still open. Each stream turns them into its own events.

use super::chat_response::CallIds;

/// What a part holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PartKind {
    Reasoning,
    Text,
    Call,
}

/// One output part.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Part {
    Reasoning(String),
    Text(String),
    Call {
        id: String,
        name: String,
        arguments: String,
    },
}

impl Part {
    fn kind(&self) -> PartKind {
        match self {
            Self::Reasoning(_) => PartKind::Reasoning,
            Self::Text(_) => PartKind::Text,
            Self::Call { .. } => PartKind::Call,
        }
    }
}

/// The parts so far, whether the last is open, and the call-id generator.
#[derive(Debug, Clone)]
pub(crate) struct OutputParts {
    pub items: Vec<Part>,
    pub open: bool,
    ids: CallIds,
    thinking: bool,
}

impl OutputParts {
    /// Parts of response `id` (call ids are seeded by it).
    pub fn new(id: &str, thinking: bool) -> Self {
        Self {
            items: Vec::new(),
            open: false,
            ids: CallIds::new(id),
            thinking,
        }
    }

    /// Whether more of `kind` continues the open last part.
    pub fn continues(&self, kind: PartKind) -> bool {
        self.open && self.items.last().is_some_and(|part| part.kind() == kind)
    }

    /// Append to the last part if it is of `kind`.
    pub fn append(&mut self, kind: PartKind, text: &str) {
        match self.items.last_mut() {
            Some(Part::Reasoning(all)) if kind == PartKind::Reasoning => all.push_str(text),
            Some(Part::Text(all)) if kind == PartKind::Text => all.push_str(text),
            Some(Part::Call { arguments, .. }) if kind == PartKind::Call => {
                arguments.push_str(text)
            }
            _ => {}
        }
    }

    /// The id of tool call `index` (marked when thinking produced no text).
    pub fn call_id(&mut self, index: usize) -> String {
        let empty = self.thinking
            && !self
                .items
                .iter()
                .any(|part| matches!(part, Part::Reasoning(text) if !text.is_empty()));
        self.ids.next_id(index, empty)
    }

    /// Index of the last part (0 when there is none).
    pub fn last_index(&self) -> usize {
        self.items.len().saturating_sub(1)
    }
}
