//! The text of every ordinary token that is complete UTF-8, in one string,
//! so the output parser's common path neither validates nor chases a
//! pointer per token.

/// A token's place in [`TokenTexts::text`], or why it has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenSpan {
    start: u32,
    len: u32,
}

/// Marks ids that are reserved, outside the vocabulary, or not complete
/// UTF-8 on their own.
const NO_TEXT: u32 = u32::MAX;

/// Text of the ordinary, complete-UTF-8 tokens of a vocabulary.
#[derive(Debug, Clone, Default)]
pub struct TokenTexts {
    text: String,
    spans: Vec<TokenSpan>,
}

impl TokenTexts {
    /// Built from each id's bytes and its reserved flag.
    pub(crate) fn new(bytes: &[Vec<u8>], reserved: &[bool]) -> Self {
        let mut text = String::new();
        let spans = bytes
            .iter()
            .enumerate()
            .map(|(id, token)| match std::str::from_utf8(token) {
                Ok(token) if !reserved.get(id).copied().unwrap_or(false) => {
                    let start = text.len() as u32;
                    text.push_str(token);
                    TokenSpan {
                        start,
                        len: token.len() as u32,
                    }
                }
                _ => TokenSpan {
                    start: NO_TEXT,
                    len: 0,
                },
            })
            .collect();
        Self { text, spans }
    }

    /// The text of an ordinary token that is complete UTF-8 by itself;
    /// `None` for reserved, unknown or partial-character tokens.
    #[inline]
    pub fn get(&self, id: u32) -> Option<&str> {
        let span = *self.spans.get(id as usize)?;
        if span.start == NO_TEXT {
            return None;
        }
        let start = span.start as usize;
        self.text.get(start..start + span.len as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_and_partial_tokens_have_no_text() {
        let bytes = vec![b"ab".to_vec(), vec![0xE4], b"<s>".to_vec(), Vec::new()];
        let texts = TokenTexts::new(&bytes, &[false, false, true]);
        assert_eq!(texts.get(0), Some("ab"));
        assert_eq!(texts.get(1), None);
        assert_eq!(texts.get(2), None);
        assert_eq!(texts.get(3), Some(""));
        assert_eq!(texts.get(4), None);
    }
}
