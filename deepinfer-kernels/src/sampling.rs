//! The sampling kernel: fixed-point weights from logits, Philox-4x32-10 draws and an integer
//! CDF walk, so CPU and GPU pick the same token from the same logits.
//!
//! This mirrors `deepinfer-sample`'s contract without depending on it (the crate's
//! `draw_index` and plain-temperature `sample`; a dev-dependency test checks equality):
//! - weights: `w_i = floor(det_exp((l_i - l_max) / T) * 2^32)`, `det_exp` a fixed polynomial
//!   (no libm), `T = max(temperature, 1e-5)`;
//! - random numbers: Philox-4x32-10 keyed by the request seed, counter
//!   `[offset lo, offset hi, block lo, block hi]` with `offset = position * 3 + kind`;
//! - draw: `t = below(Σw)` by rejection on the top bits of a 64-bit word; the token is the
//!   first whose running weight sum exceeds `t`.
//!
//! Filters (top-k / top-p / min-p, penalties, grammar masks) stay in `deepinfer-sample`;
//! a backend applies them before this kernel by masking logits to `-inf`.

use crate::error::{Result, invalid};

/// Philox multiplier for word 0.
pub const PHILOX_M0: u32 = 0xD251_1F53;
/// Philox multiplier for word 2.
pub const PHILOX_M1: u32 = 0xCD9E_8D57;
/// Philox key increment, word 0 (golden ratio).
pub const PHILOX_W0: u32 = 0x9E37_79B9;
/// Philox key increment, word 1 (sqrt 3 - 1).
pub const PHILOX_W1: u32 = 0xBB67_AE85;
/// Random draws reserved per token position (sample, resample, accept coin).
pub const DRAWS_PER_POSITION: u64 = 3;
/// Fixed-point weight of probability 1.
pub const WEIGHT_ONE: u64 = 1 << 32;
/// Smallest temperature; lower values (greedy) are clamped to it.
pub const MIN_TEMPERATURE: f32 = 1e-5;

const EXP_CUTOFF: f32 = -87.0;
const EXP_LOG2E: f32 = std::f32::consts::LOG2_E;
const EXP_LN2_HI: f32 = 0.693_359_4;
const EXP_LN2_LO: f32 = -2.121_944_4e-4;
const EXP_ROUND_MAGIC: f32 = 12_582_912.0;
const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];

/// Which of a position's three draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DrawKind {
    /// The sample itself.
    Sample = 0,
    /// A resample after a rejected draft token.
    Resample = 1,
    /// The accept / reject coin of speculative verification.
    Coin = 2,
}

/// Philox-4x32-10 on one counter block.
pub fn philox4x32_10(ctr: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (ctr, key);
    for round in 0..10 {
        if round > 0 {
            k[0] = k[0].wrapping_add(PHILOX_W0);
            k[1] = k[1].wrapping_add(PHILOX_W1);
        }
        let p0 = u64::from(PHILOX_M0) * u64::from(c[0]);
        let p1 = u64::from(PHILOX_M1) * u64::from(c[2]);
        c = [
            (p1 >> 32) as u32 ^ c[1] ^ k[0],
            p1 as u32,
            (p0 >> 32) as u32 ^ c[3] ^ k[1],
            p0 as u32,
        ];
    }
    c
}

/// The word stream of one draw: blocks `0, 1, ..` at the draw's offset.
#[derive(Debug, Clone)]
pub struct Philox {
    key: [u32; 2],
    offset: u64,
    block: u64,
    buf: [u32; 4],
    used: usize,
}

impl Philox {
    /// The stream for `(seed, position, kind)`.
    pub fn for_draw(seed: u64, position: u64, kind: DrawKind) -> Self {
        Self {
            key: [seed as u32, (seed >> 32) as u32],
            offset: position
                .wrapping_mul(DRAWS_PER_POSITION)
                .wrapping_add(kind as u64),
            block: 0,
            buf: [0; 4],
            used: 4,
        }
    }

    /// Next 32-bit word.
    pub fn next_u32(&mut self) -> u32 {
        if self.used == 4 {
            let o = self.offset;
            let b = self.block;
            self.buf = philox4x32_10(
                [o as u32, (o >> 32) as u32, b as u32, (b >> 32) as u32],
                self.key,
            );
            self.block = self.block.wrapping_add(1);
            self.used = 0;
        }
        self.used += 1;
        self.buf[self.used - 1]
    }

    /// Next 64-bit word (first word high).
    pub fn next_u64(&mut self) -> u64 {
        let hi = u64::from(self.next_u32());
        (hi << 32) | u64::from(self.next_u32())
    }

    /// Uniform integer in `[0, n)` by rejection on the top bits (0 when `n <= 1`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n <= 1 {
            return 0;
        }
        let bits = 64 - (n - 1).leading_zeros();
        loop {
            let x = self.next_u64() >> (64 - bits);
            if x < n {
                return x;
            }
        }
    }
}

/// Deterministic `exp(x)` for `x <= 0` (0 below -87 and for NaN).
#[inline]
pub fn det_exp(x: f32) -> f32 {
    let below = x.is_nan() || x < EXP_CUTOFF;
    let x = if below { EXP_CUTOFF } else { x.min(0.0) };
    let n = (x * EXP_LOG2E + EXP_ROUND_MAGIC) - EXP_ROUND_MAGIC;
    let f = (x - n * EXP_LN2_HI) - n * EXP_LN2_LO;
    let c = EXP_POLY;
    let p =
        (((((c[0] * f + c[1]) * f + c[2]) * f + c[3]) * f + c[4]) * f + c[5]) * (f * f) + f + 1.0;
    let r = p * f32::from_bits((((n as i32) + 127) as u32) << 23);
    if below { 0.0 } else { r }
}

/// Fixed-point weights of a row of logits at a temperature (see the module docs).
pub fn weights(logits: &[f32], temperature: f32) -> Result<Vec<u64>> {
    if let Some(bad) = logits.iter().find(|v| !v.is_finite()) {
        return Err(invalid("sample", format!("non-finite logit {bad}")));
    }
    if logits.is_empty() {
        return Err(invalid("sample", "empty row"));
    }
    let t = temperature.max(MIN_TEMPERATURE);
    let l_max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    Ok(logits
        .iter()
        .map(|&l| (f64::from(det_exp((l - l_max) / t)) * WEIGHT_ONE as f64) as u64)
        .collect())
}

/// Index drawn from `weights` for `(seed, position, kind)`; `None` if all weights are 0.
pub fn draw_index(weights: &[u64], seed: u64, position: u64, kind: DrawKind) -> Option<usize> {
    let total: u64 = weights.iter().sum();
    if total == 0 {
        return None;
    }
    let t = Philox::for_draw(seed, position, kind).below(total);
    let mut acc = 0u64;
    for (i, &w) in weights.iter().enumerate() {
        acc += w;
        if acc > t {
            return Some(i);
        }
    }
    None
}

/// Per-row parameters of [`crate::Backend::sample`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleRow {
    /// The request's seed.
    pub seed: u64,
    /// Token position being sampled (selects the Philox offset).
    pub position: u64,
    /// Temperature (clamped to [`MIN_TEMPERATURE`]; 0 is greedy).
    pub temperature: f32,
}

/// Samples one row of logits.
pub fn sample_row(logits: &[f32], row: SampleRow) -> Result<usize> {
    let w = weights(logits, row.temperature)?;
    draw_index(&w, row.seed, row.position, DrawKind::Sample)
        .ok_or_else(|| invalid("sample", "all weights are zero"))
}

/// Samples every row of a row-major `[rows, vocab]` buffer (in parallel; rows are independent).
pub fn sample_rows(logits: &[f32], vocab: usize, rows: &[SampleRow]) -> Result<Vec<i32>> {
    use rayon::prelude::*;
    if vocab == 0 || logits.len() != vocab * rows.len() {
        return Err(crate::error::shape_err(
            "sample",
            format!("{} logits for {} rows", logits.len(), rows.len()),
        ));
    }
    logits
        .par_chunks(vocab)
        .zip(rows.par_iter())
        .map(|(l, &r)| sample_row(l, r).map(|i| i as i32))
        .collect()
}
