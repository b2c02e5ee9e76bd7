//! The DeepSeek V4 pre-tokenizer, re-implemented on `regex-automata`.
//!
//! The vocabulary's pre-tokenizer is a sequence of three regex splits
//! (digit groups, CJK runs, then the GPT-style word pattern), each isolating
//! its matches, followed by the byte-level map. The `tokenizers` crate runs
//! the word pattern with a backtracking engine because of one look-ahead,
//! `\s+(?!\S)`; here that alternative is replaced by `\s+` and the look-ahead
//! is applied afterwards (a whitespace run of two or more characters that is
//! followed by a non-space gives back its last character), which yields the
//! same pieces. `tests/fast_encode.rs` checks this against `tokenizers`.

use regex_automata::meta::{Cache, Regex};
use regex_automata::{Anchored, Input};

/// Digit groups of one to three (`\p{N}{1,3}`).
const DIGITS: &str = r"\p{N}{1,3}";
/// Runs of CJK ideographs, hiragana and katakana.
const CJK: &str = "[一-龥぀-ゟ゠-ヿ]+";
/// The word pattern with `\s+(?!\S)|\s+` folded into `\s+` (see the module docs).
const WORDS: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+"##;

/// The three compiled splits.
#[derive(Debug)]
pub(crate) struct DeepSeekSplitter {
    digits: Regex,
    cjk: Regex,
    words: Regex,
}

/// Per-thread search state of a [`DeepSeekSplitter`].
#[derive(Debug)]
pub(crate) struct SplitCaches {
    digits: Cache,
    cjk: Cache,
    words: Cache,
}

impl DeepSeekSplitter {
    /// Compile the splits (the patterns are constants, so this cannot fail
    /// unless `regex-automata` lacks Unicode support).
    pub(crate) fn new() -> Result<Self, String> {
        let build = |pattern: &str| Regex::new(pattern).map_err(|error| error.to_string());
        Ok(Self {
            digits: build(DIGITS)?,
            cjk: build(CJK)?,
            words: build(WORDS)?,
        })
    }

    /// Fresh search state for one thread.
    pub(crate) fn caches(&self) -> SplitCaches {
        SplitCaches {
            digits: self.digits.create_cache(),
            cjk: self.cjk.create_cache(),
            words: self.words.create_cache(),
        }
    }

    /// Call `piece` for each pre-token of `text`, in order; the pieces
    /// concatenate to `text`.
    pub(crate) fn for_each_piece(
        &self,
        caches: &mut SplitCaches,
        text: &str,
        piece: &mut impl FnMut(&str),
    ) {
        let SplitCaches { digits, cjk, words } = caches;
        isolate(&self.digits, digits, text, &mut |part| {
            isolate(&self.cjk, cjk, part, &mut |part| {
                split_words(&self.words, words, part, piece)
            })
        });
    }
}

/// Split `text` into matches of `regex` and the gaps between them.
fn isolate(regex: &Regex, cache: &mut Cache, text: &str, piece: &mut impl FnMut(&str)) {
    let mut at = 0;
    while at < text.len() {
        let Some(found) = regex.search_with(cache, &Input::new(text).range(at..)) else {
            break;
        };
        if found.start() > at {
            piece(&text[at..found.start()]);
        }
        piece(&text[found.range()]);
        at = found.end();
    }
    if at < text.len() {
        piece(&text[at..]);
    }
}

/// The word split, with the `\s+(?!\S)` look-ahead applied after matching.
fn split_words(regex: &Regex, cache: &mut Cache, text: &str, piece: &mut impl FnMut(&str)) {
    let mut at = 0;
    while at < text.len() {
        // Nearly every pre-token starts where the last one ended; an anchored
        // search finds it without the reverse scan an unanchored one needs.
        let anchored = Input::new(text).range(at..).anchored(Anchored::Yes);
        let Some(found) = regex
            .search_with(cache, &anchored)
            .or_else(|| regex.search_with(cache, &Input::new(text).range(at..)))
        else {
            break;
        };
        if found.start() > at {
            piece(&text[at..found.start()]);
        }
        let start = found.start();
        let mut end = found.end();
        // Only the folded `\s+` alternative matches whitespace without a line
        // break (`\s*[\r\n]+` comes first and takes any run with one).
        if end < text.len() {
            let run = &text[start..end];
            let mut chars = run.chars();
            let all_blank = run
                .chars()
                .all(|c| c.is_whitespace() && c != '\r' && c != '\n');
            if all_blank && chars.next().is_some() && chars.next().is_some() {
                // `\s+(?!\S)` backs off one character before the non-space.
                let last = run.chars().next_back().map_or(0, char::len_utf8);
                end -= last;
            }
        }
        piece(&text[start..end]);
        at = end;
    }
    if at < text.len() {
        piece(&text[at..]);
    }
}

/// Whether plain text may be cut at byte `at` without changing its
/// pre-tokens: after a newline that precedes a non-space (no pattern crosses
/// from a line break into the next word), or at a space between two ASCII
/// letters (the letter run before it always ends a pre-token there).
pub(crate) fn is_safe_cut(text: &str, at: usize) -> bool {
    let bytes = text.as_bytes();
    if at == 0 || at >= bytes.len() || !text.is_char_boundary(at) {
        return false;
    }
    let before = bytes[at - 1];
    if before == b'\n' {
        return text[at..]
            .chars()
            .next()
            .is_some_and(|c| !c.is_whitespace());
    }
    before.is_ascii_alphabetic()
        && bytes[at] == b' '
        && bytes.get(at + 1).is_some_and(u8::is_ascii_alphabetic)
}

/// Cut `text` into pieces of about `target` bytes at safe boundaries
/// ([`is_safe_cut`]); text with no safe boundary stays whole.
pub(crate) fn safe_chunks(text: &str, target: usize) -> impl Iterator<Item = &str> {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= text.len() {
            return None;
        }
        let mut cut = text.len();
        let mut at = start + target.max(1);
        while at < text.len() {
            if is_safe_cut(text, at) {
                cut = at;
                break;
            }
            at += 1;
        }
        let piece = &text[start..cut];
        start = cut;
        Some(piece)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(text: &str) -> Vec<String> {
        let splitter = DeepSeekSplitter::new().unwrap();
        let mut caches = splitter.caches();
        let mut out = Vec::new();
        splitter.for_each_piece(&mut caches, text, &mut |p| out.push(p.to_owned()));
        out
    }

    #[test]
    fn look_ahead_gives_back_the_last_space() {
        assert_eq!(pieces("a   b"), ["a", "  ", " b"]);
        assert_eq!(pieces("a \tb"), ["a", " ", "\tb"]);
        assert_eq!(pieces("a b"), ["a", " b"]);
        assert_eq!(pieces("a   "), ["a", "   "]);
    }

    #[test]
    fn digits_and_cjk_are_isolated() {
        assert_eq!(pieces("12345"), ["123", "45"]);
        assert_eq!(pieces("x你好y"), ["x", "你好", "y"]);
        assert_eq!(pieces("hi.\n\nThere"), ["hi", ".\n\n", "There"]);
    }

    #[test]
    fn chunks_cover_text_and_cut_only_at_safe_points() {
        let text = "a\nb\n\n c\nd ef  gh".repeat(50);
        let chunks: Vec<&str> = safe_chunks(&text, 7).collect();
        assert_eq!(chunks.concat(), text);
        assert!(chunks.len() > 10);
        let mut at = 0;
        for chunk in &chunks[..chunks.len() - 1] {
            at += chunk.len();
            assert!(is_safe_cut(&text, at));
        }
    }
}
