//! Per-sequence state between forward calls.
//!
//! Exact model state, kept per sequence in backend tensors:
//! - window state: the last `sliding_window - 1` K=V rows of every layer (fixed size);
//! - global state: compressed entries and indexer keys of the layers that own them (grows
//!   with the sequence; V4.1 keeps them only on KV-source layers);
//! - small state: open compressor rows not yet pooled (and, for V4's overlapping
//!   compressors, the last complete group), the token history for the Engram look-back, and
//!   the DSpark stages' context windows.
//!
//! The global state lives in paged blocks, read and written through the sequence's
//! [`GlobalTable`]: in an engine, the blocks of the scheduler's `deepinfer-kv` block table in
//! the model's [`super::global::GlobalCache`]; outside one, blocks of its own.
//! [`SeqState::global_entries`] reports its size.

use super::global::{GlobalPart, GlobalTable};

/// Open rows of one compressor: raw value and gate projections not yet pooled, plus (for
/// overlapping compressors) the rows of the last complete group.
#[derive(Debug, Clone)]
pub struct CompressorState<T> {
    /// `(a, z)` rows of the open group.
    pub pending: Option<(T, T)>,
    /// `(a, z)` rows of the last complete group (V4 CSA overlap context).
    pub previous: Option<(T, T)>,
}

impl<T> Default for CompressorState<T> {
    fn default() -> Self {
        CompressorState {
            pending: None,
            previous: None,
        }
    }
}

/// Everything that persists between forward calls for one sequence.
#[derive(Debug, Clone)]
pub struct SeqState<T> {
    /// Tokens consumed so far (the next token's position).
    pub pos: usize,
    /// Token ids consumed so far (the Engram look-back reads the tail).
    pub history: Vec<u32>,
    /// Per layer: the last `sliding_window - 1` K=V rows `[rows, d]`.
    pub window: Vec<Option<T>>,
    /// Compressed entries and indexer keys (where the layer owns them), in paged blocks.
    pub global: GlobalTable<T>,
    /// Per layer: the main compressor's open rows.
    pub compressor: Vec<CompressorState<T>>,
    /// Per layer: the V4 indexer compressor's open rows.
    pub index_compressor: Vec<CompressorState<T>>,
    /// Per DSpark stage: context K=V rows of the last `sliding_window` positions.
    pub dspark_window: Vec<Option<T>>,
}

impl<T: Clone + deepinfer_kernels::TensorInfo> SeqState<T> {
    /// A fresh sequence for a model with `layers` backbone layers and `stages` drafter stages
    /// whose global state is `global` (see `Model::new_state`).
    pub fn with_global(layers: usize, stages: usize, global: GlobalTable<T>) -> Self {
        SeqState {
            pos: 0,
            history: Vec::new(),
            window: (0..layers).map(|_| None).collect(),
            global,
            compressor: (0..layers).map(|_| CompressorState::default()).collect(),
            index_compressor: (0..layers).map(|_| CompressorState::default()).collect(),
            dspark_window: (0..stages).map(|_| None).collect(),
        }
    }

    /// A snapshot that no longer names the pool's blocks (see [`GlobalTable::detached`]):
    /// what a slower cache tier keeps.
    pub fn detached(&self) -> Self {
        SeqState {
            global: self.global.detached(),
            ..self.clone()
        }
    }
}

impl<T> SeqState<T> {
    /// Forget the window state (every layer's window rows and the DSpark context windows),
    /// as a prefix cache that keeps only global state would.
    pub fn drop_window(&mut self) {
        self.window.iter_mut().for_each(|w| *w = None);
        self.dspark_window.iter_mut().for_each(|w| *w = None);
    }
}

impl<T: Clone + deepinfer_kernels::TensorInfo> SeqState<T> {
    /// Compressed entries held per layer (0 where the layer owns none).
    pub fn global_entries(&self) -> Vec<usize> {
        (0..self.window.len())
            .map(|l| self.global.count(GlobalPart::Entries, l))
            .collect()
    }
}
