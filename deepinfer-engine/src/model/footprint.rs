//! The weight bytes one decode step must read: the floor a memory-bound batch-1 decode is
//! measured against.

use super::{BlockW, Model};
use deepinfer_kernels::{Backend, DType, TensorInfo};

/// Bytes of weights a batch-1 decode step reads, by part (the drafter excluded).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DecodeBytes {
    /// The output head (read whole every step).
    pub head: f64,
    /// Attention, compressors, indexers, norms, hyper-connections, routers, shared experts
    /// and Engram projections of every layer, and the final norm.
    pub dense: f64,
    /// The routed experts one token uses: `num_experts_per_tok` of each MoE layer's experts
    /// (their mean size).
    pub routed_experts: f64,
    /// One embedding row and, per Engram layer, one table row per hash head and n-gram order.
    pub rows: f64,
}

impl DecodeBytes {
    /// All of it.
    pub fn total(&self) -> f64 {
        self.head + self.dense + self.routed_experts + self.rows
    }
}

/// Stored bytes of a tensor (block-scaled formats with their scales, approximately).
fn bytes<T: TensorInfo>(t: &T) -> f64 {
    let per = match t.dtype() {
        DType::BF16 | DType::F16 => 2.0,
        DType::I64 => 8.0,
        DType::F8E4M3 => 1.0 + 1.0 / 1024.0,
        DType::Mxfp4 => 0.5 + 1.0 / 32.0,
        DType::Nvfp4 => 0.5 + 1.0 / 16.0,
        // f32, i32 and any wider type to come.
        _ => 4.0,
    };
    t.numel() as f64 * per
}

fn row_bytes<T: TensorInfo>(t: &T) -> f64 {
    let rows = t.shape().first().copied().unwrap_or(1).max(1);
    bytes(t) / rows as f64
}

/// Dense bytes of one block and the mean bytes of one of its routed experts.
fn block_bytes<T: TensorInfo>(b: &BlockW<T>) -> (f64, f64) {
    let a = &b.attn;
    let mut dense = [
        &b.attn_norm,
        &b.ffn_norm,
        &a.wq_a,
        &a.q_norm,
        &a.wq_b,
        &a.wkv,
        &a.kv_norm,
        &a.wo_a,
        &a.wo_b,
        &a.sink,
    ]
    .iter()
    .map(|t| bytes(*t))
    .sum::<f64>();
    for hc in [&b.hc_attn, &b.hc_ffn] {
        dense += bytes(&hc.fn_) + bytes(&hc.base) + bytes(&hc.scale);
    }
    let compressor = |c: &super::CompressorW<T>| {
        bytes(&c.wkv) + c.wgate.as_ref().map_or(0.0, bytes) + bytes(&c.norm)
    };
    dense += a.compressor.as_ref().map_or(0.0, compressor);
    if let Some(ix) = &a.indexer {
        dense += bytes(&ix.wq_b) + bytes(&ix.weights_proj);
        dense += ix.wk.as_ref().map_or(0.0, |(w, n)| bytes(w) + bytes(n));
        dense += ix.compressor.as_ref().map_or(0.0, compressor);
    }
    let f = &b.ffn;
    dense += bytes(&f.gate) + f.bias.as_ref().map_or(0.0, bytes);
    dense += bytes(&f.shared.0) + bytes(&f.shared.1) + bytes(&f.shared.2);
    if let Some(e) = &b.engram {
        dense += bytes(&e.wkv) + bytes(&e.qk);
    }
    let experts = f
        .experts
        .iter()
        .map(|(w1, w3, w2)| bytes(w1) + bytes(w3) + bytes(w2))
        .sum::<f64>();
    (dense, experts / f.experts.len().max(1) as f64)
}

impl<B: Backend> Model<B> {
    /// The weight bytes a batch-1 decode step reads (see [`DecodeBytes`]).
    pub fn decode_bytes(&self) -> DecodeBytes {
        let w = &self.w;
        let mut out = DecodeBytes {
            head: bytes(&w.head),
            dense: bytes(&w.norm),
            rows: row_bytes(&w.embed),
            ..DecodeBytes::default()
        };
        if let Some(hc) = &w.hc_head {
            out.dense += bytes(&hc.fn_) + bytes(&hc.base) + bytes(&hc.scale);
        }
        // Rows read per Engram layer: one per hash head of each n-gram order.
        let engram_rows = self
            .cfg
            .engram
            .as_ref()
            .map_or(0, |e| e.max_ngram_size.saturating_sub(1) * e.n_heads);
        for b in &w.layers {
            let (dense, expert) = block_bytes(b);
            out.dense += dense;
            out.routed_experts += expert * self.cfg.num_experts_per_tok as f64;
            if let Some(e) = &b.engram {
                out.rows += row_bytes(&e.embed) * engram_rows as f64;
            }
        }
        out
    }
}
