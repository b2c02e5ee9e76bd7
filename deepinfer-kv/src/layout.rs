//! The byte layout of the cache as the engine describes it: bytes per block for each layer kind,
//! plus fixed bytes per sequence (window state and other small per-sequence state).
//!
//! The crate never touches these bytes; it only needs their sizes to turn a memory budget into a
//! block count and to size host-tier entries.

use crate::error::{KvError, Result};

/// One named component of the layout and its size in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutPart {
    /// A label for reports (for example `"global"` or `"window"`).
    pub name: String,
    /// Bytes of this part (per block, or per sequence, depending on the list it is in).
    pub bytes: u64,
}

/// Bytes per block per layer kind plus fixed bytes per sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvLayout {
    block_size: usize,
    per_block: Vec<LayoutPart>,
    per_sequence: Vec<LayoutPart>,
}

impl KvLayout {
    /// An empty layout for blocks of `block_size` tokens.
    pub fn new(block_size: usize) -> Result<Self> {
        if block_size == 0 {
            return Err(KvError::ZeroBlockSize);
        }
        Ok(Self {
            block_size,
            per_block: Vec::new(),
            per_sequence: Vec::new(),
        })
    }

    /// Adds a paged layer kind costing `bytes_per_block` bytes per block.
    pub fn with_block_part(mut self, name: &str, bytes_per_block: u64) -> Self {
        self.per_block.push(LayoutPart {
            name: name.to_owned(),
            bytes: bytes_per_block,
        });
        self
    }

    /// Adds a paged layer kind that costs `bytes_per_token` per token (summed over its layers).
    pub fn with_block_part_per_token(self, name: &str, bytes_per_token: u64) -> Self {
        let per_block = bytes_per_token * self.block_size as u64;
        self.with_block_part(name, per_block)
    }

    /// Adds fixed per-sequence state of `bytes` bytes.
    pub fn with_sequence_part(mut self, name: &str, bytes: u64) -> Self {
        self.per_sequence.push(LayoutPart {
            name: name.to_owned(),
            bytes,
        });
        self
    }

    /// Adds a sliding-window state: `layers` layers each keeping `rows` rows of `bytes_per_row`.
    pub fn with_window_state(self, name: &str, layers: u64, rows: u64, bytes_per_row: u64) -> Self {
        self.with_sequence_part(name, layers * rows * bytes_per_row)
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The paged parts.
    pub fn block_parts(&self) -> &[LayoutPart] {
        &self.per_block
    }

    /// The per-sequence parts.
    pub fn sequence_parts(&self) -> &[LayoutPart] {
        &self.per_sequence
    }

    /// Bytes of one block over all paged layer kinds.
    pub fn bytes_per_block(&self) -> u64 {
        self.per_block.iter().map(|p| p.bytes).sum()
    }

    /// Fixed bytes of one sequence (window state and other small state).
    pub fn bytes_per_sequence(&self) -> u64 {
        self.per_sequence.iter().map(|p| p.bytes).sum()
    }

    /// How many blocks fit in `budget_bytes` after reserving the fixed state of
    /// `max_sequences` sequences. Errors if not even one block fits, or the layout has no paged part.
    pub fn blocks_for_budget(&self, budget_bytes: u64, max_sequences: u64) -> Result<usize> {
        let per_block = self.bytes_per_block();
        if per_block == 0 {
            return Err(KvError::InvalidConfig(
                "layout has no paged bytes per block".into(),
            ));
        }
        let fixed = self.bytes_per_sequence().saturating_mul(max_sequences);
        let needed = fixed.saturating_add(per_block);
        if budget_bytes < needed {
            return Err(KvError::BudgetTooSmall {
                budget: budget_bytes,
                needed,
            });
        }
        let blocks = (budget_bytes - fixed) / per_block;
        Ok(usize::try_from(blocks).unwrap_or(usize::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_block_size_is_an_error() {
        assert_eq!(KvLayout::new(0), Err(KvError::ZeroBlockSize));
    }

    #[test]
    fn budget_to_blocks() {
        let l = KvLayout::new(128)
            .unwrap()
            .with_block_part_per_token("global", 890)
            .with_window_state("window", 40, 128, 528);
        assert_eq!(l.bytes_per_block(), 113_920);
        assert_eq!(l.bytes_per_sequence(), 2_703_360);
        // 10 sequences of window state plus 100 blocks exactly.
        let budget = 10 * 2_703_360 + 100 * 113_920;
        assert_eq!(l.blocks_for_budget(budget, 10), Ok(100));
        assert_eq!(l.blocks_for_budget(budget + 113_919, 10), Ok(100));
        assert!(matches!(
            l.blocks_for_budget(1000, 10),
            Err(KvError::BudgetTooSmall { .. })
        ));
        let empty = KvLayout::new(16).unwrap();
        assert!(empty.blocks_for_budget(1 << 30, 1).is_err());
    }
}
