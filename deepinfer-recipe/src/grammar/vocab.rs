//! The vocabulary as the grammar sees it: token byte strings, sorted for
//! prefix-sharing walks, with reserved tokens either excluded or mapped to
//! private symbols (`0xFF`, n) that plain text can never produce.

use std::collections::HashSet;

use crate::tokenizer::PromptTokenizer;

/// The byte that starts a reserved-token symbol in grammar patterns.
pub const SPECIAL_BYTE: u8 = 0xFF;

/// Token byte strings for grammar matching.
#[derive(Debug, Clone)]
pub struct GrammarVocab {
    pub(crate) size: usize,
    /// Tokens sorted by bytes: (id, byte range in `bytes`, common prefix with the previous).
    pub(crate) sorted: Vec<(u32, u32, u32, u32)>,
    pub(crate) bytes: Vec<u8>,
    pub(crate) eos: Vec<u32>,
    pub(crate) token_bytes: Vec<Option<Vec<u8>>>,
}

impl GrammarVocab {
    /// Build from explicit token bytes (`None`: never allowed), end-of-sequence
    /// ids, and reserved ids the grammar refers to as symbols
    /// (`(id, n)` → bytes `[0xFF, n]`).
    pub fn new(mut tokens: Vec<Option<Vec<u8>>>, eos: &[u32], symbols: &[(u32, u8)]) -> Self {
        for &(id, symbol) in symbols {
            if let Some(slot) = tokens.get_mut(id as usize) {
                *slot = Some(vec![SPECIAL_BYTE, symbol]);
            }
        }
        let symbol_ids: HashSet<u32> = symbols.iter().map(|&(id, _)| id).collect();
        for (id, token) in tokens.iter_mut().enumerate() {
            let id = id as u32;
            let drop = match token {
                None => false,
                Some(bytes) => {
                    bytes.is_empty()
                        || eos.contains(&id)
                        || (!symbol_ids.contains(&id) && bytes.contains(&SPECIAL_BYTE))
                }
            };
            if drop {
                *token = None;
            }
        }
        let mut order: Vec<u32> = (0..tokens.len() as u32)
            .filter(|&id| tokens[id as usize].is_some())
            .collect();
        order.sort_by(|&a, &b| tokens[a as usize].cmp(&tokens[b as usize]));
        let mut bytes = Vec::new();
        let mut sorted = Vec::with_capacity(order.len());
        let mut previous: &[u8] = &[];
        for &id in &order {
            let token = tokens[id as usize].as_deref().unwrap_or_default();
            let common = token
                .iter()
                .zip(previous)
                .take_while(|(a, b)| a == b)
                .count();
            let start = bytes.len() as u32;
            bytes.extend_from_slice(token);
            sorted.push((id, start, token.len() as u32, common as u32));
            previous = token;
        }
        Self {
            size: tokens.len(),
            sorted,
            bytes,
            eos: eos.to_vec(),
            token_bytes: tokens,
        }
    }

    /// From a prompt tokenizer: plain tokens by their bytes, reserved tokens
    /// excluded except `symbols`; `eos` ends the output.
    pub fn from_tokenizer(tokenizer: &PromptTokenizer, eos: &[u32], symbols: &[(u32, u8)]) -> Self {
        let reserved = tokenizer.reserved_ids();
        let tokens = tokenizer
            .token_bytes()
            .iter()
            .enumerate()
            .map(|(id, bytes)| (!reserved.contains(&(id as u32))).then(|| bytes.clone()))
            .collect();
        Self::new(tokens, eos, symbols)
    }

    /// Number of token ids (the mask covers `size.div_ceil(32)` words).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Words in a bitmask for this vocabulary.
    pub fn mask_words(&self) -> usize {
        self.size.div_ceil(32)
    }

    /// Sets the end-of-sequence bits in `mask` (an output that may end here);
    /// whether any was set.
    pub(crate) fn allow_eos(&self, mask: &mut [u32]) -> bool {
        let mut any = false;
        for &eos in &self.eos {
            if let Some(word) = mask.get_mut(eos as usize / 32) {
                *word |= 1 << (eos % 32);
                any = true;
            }
        }
        any
    }

    pub(crate) fn token(&self, id: u32) -> Option<&[u8]> {
        self.token_bytes.get(id as usize)?.as_deref()
    }
}
