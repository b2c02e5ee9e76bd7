//! Cache arithmetic in deployment record formats: the paged (growing) cache of the layers
//! that own compressed entries, and the fixed per-sequence state (windows, open compressor
//! rows), as a [`deepinfer_kv::KvLayout`] so a block pool can be sized from it.
//!
//! # V4.1-Flash: 890 B per token
//!
//! Only the four KV-source layers keep growing state (v41-architecture.md section 8.1); every
//! other compressed layer reads their entries. Each source keeps, per entry, an NVFP4
//! compressed K=V entry of 512 dims (256 B of e2m1 pairs + 32 e4m3 scales, one per 16 dims:
//! **288 B**) and an MXFP4 indexer key of 128 dims (64 B + 4 UE8M0 scales, one per 32:
//! **68 B**), 356 B per entry. Layers 2, 8 and 14 (ratio 2) write one entry per 2 tokens,
//! layer 20 (ratio 1) one per token:
//!
//! `3 x 356 / 2 + 1 x 356 = 534 + 356 = 890 B per token`, i.e. 113,920 B per 128-token
//! block (3 x 64 + 128 entries of 356 B).
//!
//! The window row is MXFP8: 512 e4m3 + 16 UE8M0 scales = **528 B**. The published
//! per-sequence window figure, 20 layers x 134 rows x 528 B = 1,415,040 B, is reproduced by
//! [`WindowAccounting::BoundedReplay`]: the layers from the last KV source (20) to the last
//! backbone layer (39) are 20 layers, and 134 = the 128-row window + 6 rows of speculative
//! slack. The reference implementations keep a window on all 40 layers (plus the 3 DSpark
//! stages); [`WindowAccounting::AllLayers`] counts that.
//!
//! # V4-Flash
//!
//! V4's CSA layers (ratio 4) keep a main entry and an indexer key per entry; HCA layers
//! (ratio 128) a main entry. Window rows and main entries use the 584 B record vLLM keeps for
//! V4 (448 no-RoPE dims in e4m3 + 7 UE8M0 scales per 64 + 1 pad + 64 RoPE dims in bf16, the
//! FP8 rounding DeepSeek's QAT applies); indexer keys are assumed MXFP4 (68 B) like V4.1's,
//! since the V4 document gives only the QAT rounding, not a cache record.

use super::PlanError;
use crate::config::{AttnKind, ModelConfig, ModelKind};
use deepinfer_kv::KvLayout;
use serde::Serialize;

/// Bytes of one cache record of each kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KvFormat {
    /// One window K=V row (V4.1: MXFP8, 528 B).
    pub window_row: u64,
    /// One compressed K=V entry (V4.1: NVFP4, 288 B).
    pub entry: u64,
    /// One indexer key (MXFP4, 68 B).
    pub index_key: u64,
}

impl KvFormat {
    /// The deployment record formats of a model (see the module docs).
    pub fn for_config(c: &ModelConfig) -> Self {
        let (d, r, di) = (
            c.head_dim as u64,
            c.rope_dim as u64,
            c.index_head_dim as u64,
        );
        let mxfp4_key = di.div_ceil(2) + di.div_ceil(32);
        match c.kind {
            ModelKind::V41 => Self {
                window_row: d + d.div_ceil(32),
                entry: d.div_ceil(2) + d.div_ceil(16),
                index_key: mxfp4_key,
            },
            ModelKind::V4 => {
                let nope = d - r;
                let record = (nope + nope.div_ceil(64) + 2 * r).next_multiple_of(8);
                Self {
                    window_row: record,
                    entry: record,
                    index_key: mxfp4_key,
                }
            }
        }
    }
}

/// One layer that owns growing (paged) cache state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KvOwner {
    /// Backbone layer index.
    pub layer: usize,
    /// Tokens per entry.
    pub ratio: usize,
    /// Bytes per entry: the compressed entry, plus the indexer key where the layer keeps one.
    pub bytes_per_entry: u64,
}

/// The layers that own paged cache state: V4.1's KV sources (entry + indexer key), V4's CSA
/// layers (entry + indexer key) and HCA layers (entry).
pub fn kv_owners(c: &ModelConfig) -> Vec<KvOwner> {
    let f = KvFormat::for_config(c);
    (0..c.num_layers)
        .filter_map(|l| {
            let bytes_per_entry = match c.attn_kinds[l] {
                AttnKind::Shared if c.kv_source_layers.contains(&l) => f.entry + f.index_key,
                AttnKind::Csa => f.entry + f.index_key,
                AttnKind::Hca => f.entry,
                _ => return None,
            };
            Some(KvOwner {
                layer: l,
                ratio: c.compress_ratios[l],
                bytes_per_entry,
            })
        })
        .collect()
}

/// Growing cache bytes per token over all owners (exact, before rounding to blocks).
pub fn kv_bytes_per_token(c: &ModelConfig) -> f64 {
    kv_owners(c)
        .iter()
        .map(|o| o.bytes_per_entry as f64 / o.ratio as f64)
        .sum()
}

/// Which layers' window rows a sequence keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WindowAccounting {
    /// The published V4.1 deployment figure: windows on the layers from the last KV source
    /// to the last backbone layer (the layers decoder-side bounded replay runs on the
    /// trailing window). A model without KV sources keeps windows on every layer.
    BoundedReplay,
    /// A window on every backbone layer, as DeepSeek's reference, vLLM and SGLang keep them
    /// in exact mode.
    AllLayers,
}

/// Window state of one sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct WindowState {
    /// Layers keeping a window.
    pub layers: u64,
    /// Rows per window (sliding window + speculative slack).
    pub rows: u64,
    /// Bytes per row.
    pub row_bytes: u64,
    /// `layers x rows x row_bytes`.
    pub bytes: u64,
}

/// The window state of one sequence under `accounting`, with `slack` rows beyond the window.
pub fn window_state(c: &ModelConfig, slack: usize, accounting: WindowAccounting) -> WindowState {
    let layers = match (accounting, c.kv_source_layers.last()) {
        (WindowAccounting::BoundedReplay, Some(&last)) => c.num_layers - last,
        _ => c.num_layers,
    } as u64;
    let rows = (c.sliding_window + slack) as u64;
    let row_bytes = KvFormat::for_config(c).window_row;
    WindowState {
        layers,
        rows,
        row_bytes,
        bytes: layers * rows * row_bytes,
    }
}

/// Open compressor rows of one sequence, f32 (kv and gate): a V4.1 ratio-r source keeps up to
/// r-1 rows of 2d; V4 HCA keeps m'-1 rows of 2d, CSA keeps m-1 rows of 4d + 4di plus the
/// overlap (the A halves of the last window, m rows of 2d + 2di).
pub fn compressor_state_bytes(c: &ModelConfig) -> u64 {
    let (d, di) = (c.head_dim as u64, c.index_head_dim as u64);
    (0..c.num_layers)
        .map(|l| {
            let r = c.compress_ratios[l] as u64;
            match c.attn_kinds[l] {
                AttnKind::Shared if c.kv_source_layers.contains(&l) => {
                    r.saturating_sub(1) * 2 * d * 4
                }
                AttnKind::Hca => r.saturating_sub(1) * 2 * d * 4,
                AttnKind::Csa => {
                    (r.saturating_sub(1) * (4 * d + 4 * di) + r * (2 * d + 2 * di)) * 4
                }
                _ => 0,
            }
        })
        .sum()
}

/// How to lay out the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KvOptions {
    /// Tokens per block (128 for the published V4.1-Flash deployment).
    pub block_size: usize,
    /// Window rows beyond `sliding_window` (6: DeepSeek's speculative slack).
    pub window_slack: usize,
    /// Which layers keep windows.
    pub windows: WindowAccounting,
}

impl Default for KvOptions {
    fn default() -> Self {
        Self {
            block_size: 128,
            window_slack: 6,
            windows: WindowAccounting::BoundedReplay,
        }
    }
}

/// The cache layout of a model in deployment record formats: one paged part per owning layer
/// (`layer{l}.kv`: entries per block, rounded up, times bytes per entry) and the per-sequence
/// parts `window`, `drafter.window` (`drafter_stages` windows of `sliding_window` rows) and
/// `compressor` (open compressor rows). Errors on a zero block size.
pub fn kv_layout(
    c: &ModelConfig,
    drafter_stages: u64,
    opts: &KvOptions,
) -> Result<KvLayout, PlanError> {
    let mut lay = KvLayout::new(opts.block_size).map_err(PlanError::Layout)?;
    for o in kv_owners(c) {
        let entries = opts.block_size.div_ceil(o.ratio) as u64;
        lay = lay.with_block_part(&format!("layer{}.kv", o.layer), entries * o.bytes_per_entry);
    }
    let w = window_state(c, opts.window_slack, opts.windows);
    lay = lay.with_window_state("window", w.layers, w.rows, w.row_bytes);
    if drafter_stages > 0 {
        lay = lay.with_window_state(
            "drafter.window",
            drafter_stages,
            c.sliding_window as u64,
            w.row_bytes,
        );
    }
    Ok(lay.with_sequence_part("compressor", compressor_state_bytes(c)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::PlanModel;

    #[test]
    fn v41_flash_records_and_890_per_token() {
        let m = PlanModel::preset("v4.1-flash").unwrap();
        let c = &m.config;
        let f = KvFormat::for_config(c);
        assert_eq!((f.window_row, f.entry, f.index_key), (528, 288, 68));
        let owners = kv_owners(c);
        let layers: Vec<(usize, usize)> = owners.iter().map(|o| (o.layer, o.ratio)).collect();
        assert_eq!(layers, [(2, 2), (8, 2), (14, 2), (20, 1)]);
        assert!(owners.iter().all(|o| o.bytes_per_entry == 356));
        assert_eq!(kv_bytes_per_token(c), 890.0);
        let lay = kv_layout(c, 3, &KvOptions::default()).unwrap();
        assert_eq!(lay.bytes_per_block(), 113_920);
        let window = &lay.sequence_parts()[0];
        assert_eq!((window.name.as_str(), window.bytes), ("window", 1_415_040));
        // Drafter windows 3 x 128 x 528 and the open pairs of layers 2, 8, 14 (4 KiB each).
        assert_eq!(lay.bytes_per_sequence(), 1_415_040 + 202_752 + 12_288);
        let all = window_state(c, 6, WindowAccounting::AllLayers);
        assert_eq!((all.layers, all.bytes), (40, 40 * 134 * 528));
    }

    #[test]
    fn v4_flash_records() {
        let m = PlanModel::preset("v4-flash").unwrap();
        let c = &m.config;
        let f = KvFormat::for_config(c);
        assert_eq!((f.window_row, f.entry, f.index_key), (584, 584, 68));
        // 21 CSA layers x 652 B / 4 + 20 HCA layers x 584 B / 128.
        assert_eq!(kv_bytes_per_token(c), 21.0 * 163.0 + 20.0 * 4.5625);
        let lay = kv_layout(c, 1, &KvOptions::default()).unwrap();
        assert_eq!(lay.bytes_per_block(), 21 * 32 * 652 + 20 * 584);
        // No KV sources: windows on all 43 layers either way.
        let w = window_state(c, 6, WindowAccounting::BoundedReplay);
        assert_eq!((w.layers, w.bytes), (43, 43 * 134 * 584));
        assert_eq!(compressor_state_bytes(c), 20 * 127 * 4096 + 21 * 51_200);
        assert!(
            kv_layout(
                c,
                1,
                &KvOptions {
                    block_size: 0,
                    ..KvOptions::default()
                }
            )
            .is_err()
        );
    }
}
