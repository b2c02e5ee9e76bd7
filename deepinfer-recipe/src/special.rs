//! Names and spellings of the special tokens the prompt formats use.
//!
//! Spellings are configuration: a deployment with another vocabulary replaces
//! them here, and the ids come from the tokenizer (see
//! [`crate::tokenizer::PromptTokenizer`]), never from constants.

/// A kind of special token that rendering inserts or the output parser
/// recognises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpecialToken {
    /// Start of the prompt.
    Bos,
    /// End of an assistant message (and of generation).
    Eos,
    /// Opens reasoning content.
    ThinkingStart,
    /// Closes reasoning content.
    ThinkingEnd,
    /// Opens a system block (V4.1 only; the V4 vocabulary lacks it).
    System,
    /// Opens a user turn.
    User,
    /// Opens an assistant turn.
    Assistant,
    /// Opens a latest-reminder block.
    LatestReminder,
    /// The DSML marker written before each tool-call tag name.
    Dsml,
    /// Image placeholder.
    Image,
    /// Grounding: opens a reference.
    Ref,
    /// Grounding: closes a reference.
    RefEnd,
    /// Grounding: opens a box.
    Box,
    /// Grounding: closes a box.
    BoxEnd,
    /// Grounding: opens a point.
    Point,
    /// Grounding: closes a point.
    PointEnd,
    /// Grounding: opens a polygon.
    Polygon,
    /// Grounding: closes a polygon.
    PolygonEnd,
}

impl SpecialToken {
    /// Every kind, in declaration order.
    pub const ALL: [SpecialToken; 18] = [
        Self::Bos,
        Self::Eos,
        Self::ThinkingStart,
        Self::ThinkingEnd,
        Self::System,
        Self::User,
        Self::Assistant,
        Self::LatestReminder,
        Self::Dsml,
        Self::Image,
        Self::Ref,
        Self::RefEnd,
        Self::Box,
        Self::BoxEnd,
        Self::Point,
        Self::PointEnd,
        Self::Polygon,
        Self::PolygonEnd,
    ];

    /// The grounding tokens: the only special tokens that assistant content
    /// and reasoning content may carry into a prompt.
    pub const GROUNDING: [SpecialToken; 8] = [
        Self::Ref,
        Self::RefEnd,
        Self::Box,
        Self::BoxEnd,
        Self::Point,
        Self::PointEnd,
        Self::Polygon,
        Self::PolygonEnd,
    ];

    /// The DeepSeek V4 / V4.1 spelling.
    pub const fn deepseek_spelling(self) -> &'static str {
        match self {
            Self::Bos => "<｜begin▁of▁sentence｜>",
            Self::Eos => "<｜end▁of▁sentence｜>",
            Self::ThinkingStart => "<think>",
            Self::ThinkingEnd => "</think>",
            Self::System => "<｜System｜>",
            Self::User => "<｜User｜>",
            Self::Assistant => "<｜Assistant｜>",
            Self::LatestReminder => "<｜latest_reminder｜>",
            Self::Dsml => "｜DSML｜",
            Self::Image => "<｜image｜>",
            Self::Ref => "<｜ref｜>",
            Self::RefEnd => "<｜/ref｜>",
            Self::Box => "<｜box｜>",
            Self::BoxEnd => "<｜/box｜>",
            Self::Point => "<｜point｜>",
            Self::PointEnd => "<｜/point｜>",
            Self::Polygon => "<｜polygon｜>",
            Self::PolygonEnd => "<｜/polygon｜>",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The spelling of every [`SpecialToken`]; defaults to the DeepSeek ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialTokens {
    spellings: Vec<String>,
}

impl Default for SpecialTokens {
    fn default() -> Self {
        Self::deepseek()
    }
}

impl SpecialTokens {
    /// The DeepSeek V4 / V4.1 spellings.
    pub fn deepseek() -> Self {
        Self {
            spellings: SpecialToken::ALL
                .iter()
                .map(|token| token.deepseek_spelling().to_owned())
                .collect(),
        }
    }

    /// Replace the spelling of one token.
    pub fn with(mut self, token: SpecialToken, spelling: impl Into<String>) -> Self {
        self.spellings[token.index()] = spelling.into();
        self
    }

    /// The spelling of `token`.
    pub fn spelling(&self, token: SpecialToken) -> &str {
        &self.spellings[token.index()]
    }

    /// Every spelling with its kind.
    pub fn iter(&self) -> impl Iterator<Item = (SpecialToken, &str)> {
        SpecialToken::ALL
            .iter()
            .map(|&token| (token, self.spelling(token)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_one_spelling() {
        let tokens = SpecialTokens::deepseek().with(SpecialToken::System, "<sys>");
        assert_eq!(tokens.spelling(SpecialToken::System), "<sys>");
        assert_eq!(tokens.spelling(SpecialToken::User), "<｜User｜>");
        assert_eq!(tokens.iter().count(), SpecialToken::ALL.len());
    }
}
