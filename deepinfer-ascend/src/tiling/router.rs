//! MoE router: scores (softmax or sqrt-softplus), top-k on score + bias, normalised weights.

use super::{
    BUFFER_NUM, FieldRole::*, KernelTiling, Partition, TilingAbi, UbBudget, align_up, align32,
    tiling_struct, u32_of,
};
use crate::chip::ChipSpec;
use crate::error::{Result, shape_err};

/// How router logits become scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScoreFunc {
    /// softmax over experts.
    Softmax,
    /// sqrt(softplus(z)) per expert (DeepSeek V4).
    SqrtSoftplus,
}

impl ScoreFunc {
    /// Code used in the tiling struct.
    pub const fn code(self) -> u32 {
        match self {
            ScoreFunc::Softmax => 0,
            ScoreFunc::SqrtSoftplus => 1,
        }
    }
}

/// Problem shape of one router launch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RouterShape {
    /// Tokens.
    pub rows: usize,
    /// Experts.
    pub experts: usize,
    /// Experts chosen per token.
    pub top_k: usize,
    /// Scoring function.
    pub score: ScoreFunc,
    /// Logits are divided by this (> 0).
    pub temperature: f32,
    /// Normalise the chosen scores to sum to one before scaling.
    pub renorm: bool,
    /// Final weight multiplier (routed scaling factor).
    pub route_scale: f32,
}

tiling_struct! {
    /// Tiling of `router.asc`.
    RouterTiling {
        /// Tokens.
        rows: u32 = Scalar,
        /// Experts.
        experts: u32 = Scalar,
        /// Experts rounded up to 8 (UB row length in f32).
        experts_pad: u32 = AlignedCount { elem_bytes: 4 },
        /// Chosen experts per token.
        top_k: u32 = Scalar,
        /// 0 softmax, 1 sqrt-softplus.
        score_func: u32 = Scalar,
        /// 1 to renormalise the chosen weights.
        renorm: u32 = Scalar,
        /// 1 / temperature.
        inv_temp: f32 = Scalar,
        /// Routed scaling factor.
        route_scale: f32 = Scalar,
        /// Blocks launched.
        block_dim: u32 = Scalar,
        /// Tokens per block.
        rows_per_block: u32 = Scalar,
        /// Tokens of the last block.
        last_rows: u32 = Scalar,
        /// Bytes of one logits row buffer.
        in_bytes: u32 = BufferBytes,
        /// Bytes of the bias buffer.
        bias_bytes: u32 = BufferBytes,
        /// Bytes of one ids output buffer.
        ids_bytes: u32 = BufferBytes,
        /// Bytes of one weights output buffer.
        wts_bytes: u32 = BufferBytes,
        /// Bytes of the work area (scores, keys, reduction work).
        tmp_bytes: u32 = BufferBytes,
    }
}

impl RouterTiling {
    /// Plan a launch.
    pub fn plan(spec: &ChipSpec, s: &RouterShape) -> Result<Self> {
        if s.rows == 0 || s.experts == 0 {
            return shape_err("router: empty input");
        }
        if s.top_k == 0 || s.top_k > s.experts {
            return shape_err(format!(
                "router: top_k {} not in 1..={}",
                s.top_k, s.experts
            ));
        }
        if !(s.temperature > 0.0 && s.temperature.is_finite() && s.route_scale.is_finite()) {
            return shape_err("router: temperature must be finite and > 0, scale finite");
        }
        let part = Partition::new(s.rows, spec.vector_cores, 1)?;
        let pad = align_up(s.experts, 8);
        let t = Self {
            rows: u32_of(s.rows, "rows")?,
            experts: u32_of(s.experts, "experts")?,
            experts_pad: u32_of(pad, "experts_pad")?,
            top_k: u32_of(s.top_k, "top_k")?,
            score_func: s.score.code(),
            renorm: u32::from(s.renorm),
            inv_temp: 1.0 / s.temperature,
            route_scale: s.route_scale,
            block_dim: part.block_dim,
            rows_per_block: part.per_block,
            last_rows: part.last,
            in_bytes: u32_of(align32(pad * 4), "in_bytes")?,
            bias_bytes: u32_of(align32(pad * 4), "bias_bytes")?,
            ids_bytes: u32_of(align32(s.top_k * 4), "ids_bytes")?,
            wts_bytes: u32_of(align32(s.top_k * 4), "wts_bytes")?,
            // scores, selection keys, reduction work.
            tmp_bytes: u32_of(3 * align32(pad * 4), "tmp_bytes")?,
        };
        t.budget().check(spec, "router")?;
        t.validate()?;
        Ok(t)
    }
}

impl KernelTiling for RouterTiling {
    fn budget(&self) -> UbBudget {
        UbBudget::default()
            .queue("inQueueLogits", BUFFER_NUM, self.in_bytes as usize)
            .queue("inQueueBias", 1, self.bias_bytes as usize)
            .queue("outQueueIds", BUFFER_NUM, self.ids_bytes as usize)
            .queue("outQueueWts", BUFFER_NUM, self.wts_bytes as usize)
            .tmp("tmpBuf", self.tmp_bytes as usize)
    }
}
