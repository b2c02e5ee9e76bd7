//! Prompt text that remembers which byte ranges are template special tokens.
//!
//! Provenance is the security boundary: only text pushed with
//! [`PromptBuilder::push_special`] may become a reserved token id. Everything
//! else, including user text that happens to spell a special token, is plain.

use std::ops::Range;

use crate::conversation::ImageRef;

/// A rendered prompt: its text, the byte ranges of the special tokens the
/// template inserted, and the images whose placeholders it holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RenderedPrompt {
    /// The prompt text.
    pub text: String,
    /// Ascending, disjoint UTF-8 byte ranges of inserted special tokens.
    pub special_ranges: Vec<Range<usize>>,
    /// Images in placeholder order.
    pub images: Vec<ImageRef>,
}

/// One piece of a rendered prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece<'a> {
    /// Text to encode without the added vocabulary.
    Plain(&'a str),
    /// A template special token, encoded as its reserved id.
    Special(&'a str),
}

impl RenderedPrompt {
    /// The prompt as alternating plain and special pieces (empty plain pieces
    /// are skipped).
    pub fn pieces(&self) -> Vec<Piece<'_>> {
        let mut pieces = Vec::with_capacity(self.special_ranges.len() * 2 + 1);
        let mut cursor = 0;
        for range in &self.special_ranges {
            if range.start > cursor {
                pieces.push(Piece::Plain(&self.text[cursor..range.start]));
            }
            pieces.push(Piece::Special(&self.text[range.clone()]));
            cursor = range.end;
        }
        if cursor < self.text.len() {
            pieces.push(Piece::Plain(&self.text[cursor..]));
        }
        pieces
    }

    /// The spellings of the inserted special tokens, in order.
    pub fn special_tokens(&self) -> Vec<&str> {
        self.special_ranges
            .iter()
            .map(|range| &self.text[range.clone()])
            .collect()
    }
}

/// Builds prompt text while recording special-token ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromptBuilder {
    text: String,
    special_ranges: Vec<Range<usize>>,
}

impl PromptBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Append plain text.
    pub fn push_plain(&mut self, text: &str) -> &mut Self {
        self.text.push_str(text);
        self
    }

    /// Append a special token; an empty spelling appends nothing.
    pub fn push_special(&mut self, spelling: &str) -> &mut Self {
        if !spelling.is_empty() {
            let start = self.text.len();
            self.text.push_str(spelling);
            self.special_ranges.push(start..self.text.len());
        }
        self
    }

    /// Append another builder, keeping its special ranges.
    pub fn append(&mut self, other: &PromptBuilder) -> &mut Self {
        let offset = self.text.len();
        self.text.push_str(&other.text);
        self.special_ranges.extend(
            other
                .special_ranges
                .iter()
                .map(|range| range.start + offset..range.end + offset),
        );
        self
    }

    /// Whether no text has been appended.
    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    /// The text so far.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Finish with the images the prompt refers to.
    pub fn finish(self, images: Vec<ImageRef>) -> RenderedPrompt {
        RenderedPrompt {
            text: self.text,
            special_ranges: self.special_ranges,
            images,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_follow_bytes_and_appends() {
        let mut inner = PromptBuilder::new();
        inner.push_plain("你").push_special("<b>");
        let mut prompt = PromptBuilder::new();
        prompt.push_special("<a>").append(&inner).push_plain("<a>");
        let rendered = prompt.finish(Vec::new());
        assert_eq!(rendered.text, "<a>你<b><a>");
        assert_eq!(rendered.special_ranges, vec![0..3, 6..9]);
        assert_eq!(
            rendered.pieces(),
            vec![
                Piece::Special("<a>"),
                Piece::Plain("你"),
                Piece::Special("<b>"),
                Piece::Plain("<a>")
            ]
        );
    }

    #[test]
    fn empty_special_is_ignored() {
        let mut prompt = PromptBuilder::new();
        prompt.push_special("");
        assert!(prompt.is_empty());
        assert!(prompt.finish(Vec::new()).special_ranges.is_empty());
    }
}
