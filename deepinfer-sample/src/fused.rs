//! The fused full-vocabulary path: rows where most of the vocabulary keeps a
//! non-zero weight (temperature around 1, no top-k) are drawn without listing
//! candidates.
//!
//! The filtered distribution and the draw are those of the listing path (same
//! weights, same survivors, same target, same token), computed differently:
//! * one pass computes every weight (`det_exp`, then [`weight_halves`]: `f32`
//!   and `i32` arithmetic only, so the loop over a 32-token chunk vectorises)
//!   and sums them per block of 1024 tokens, storing nothing per token;
//! * the target `t = below(W)` selects a block from the block sums, and only
//!   that block is weighed again to find the token (integer sums are exact,
//!   so prefix sums by block equal the token-by-token ones);
//! * top-p adds a pass that builds a histogram of weight by rank bucket (a
//!   monotone function of the logit), finds the bucket where the best-first
//!   prefix reaches its target, and resolves only that bucket's tokens with
//!   the weighted quickselect of the listing path.

use crate::filter::{Cand, top_p_need, weighted_prefix};
use crate::fixed_point::{det_exp, weight_halves};
use crate::logits::{LogitValue, Row, adjusted, allowed};
use crate::params::SamplingParams;
use crate::rng::PhiloxStream;
use crate::verify::RESIDUAL_GUARD;

/// Tokens per chunk (one mask word).
const LANES: usize = 32;
/// Tokens per block of the block sums.
pub(crate) const BLOCK: usize = 1024;
/// Rank buckets of the top-p histogram (a power of two).
const BUCKETS: usize = 2048;
/// Buckets per unit of `-x` (`x = (l - l_max) / T`): bucket
/// `floor(min(-x * 64, 2047))`. Weights are 0 below `x = -22.2`, so every
/// positive weight falls below the last bucket.
const BUCKET_SCALE: f32 = 64.0;

/// Buffers of the fused path (contents never affect results).
#[derive(Debug, Default)]
pub(crate) struct FusedScratch {
    blocks: Vec<u64>,
    hist: Vec<u64>,
    edge: Vec<Cand>,
    /// Top-p only: each token's weight and rank bucket from the first pass.
    weights: Vec<u64>,
    buckets: Vec<u16>,
    /// Verification: residual weight per block.
    rblocks: Vec<u64>,
}

/// 32 consecutive tokens: adjusted logits and which of them are allowed.
struct Chunk {
    base: usize,
    vals: [f32; LANES],
    bits: u32,
}

/// Per-lane results of weighing a chunk.
struct Weighed {
    /// High and low 16-bit halves of the weight (0 for tokens not allowed).
    hi: [u32; LANES],
    lo: [u32; LANES],
    /// Whether the weight reaches the min-p floor and the token is allowed.
    floor_ok: [bool; LANES],
    /// Rank bucket.
    bucket: [u32; LANES],
}

/// The parameters every pass shares.
#[derive(Clone, Copy)]
struct Consts {
    l_max: f32,
    temperature: f32,
    /// The smallest `f32` at least the min-p floor: `w >= floor` iff
    /// `r * 2^32 >= floor_a` (`w = floor(r * 2^32)` and `floor` is an integer).
    floor_a: f32,
}

/// Weight of one lane: `(hi, lo, r * 2^32, x)`.
#[inline(always)]
fn lane(v: f32, k: &Consts) -> (u32, u32, f32, f32) {
    let x = (v - k.l_max) / k.temperature;
    let r = det_exp(x);
    let (hi, lo) = weight_halves(r);
    (hi, lo, r * 4_294_967_296.0, x)
}

/// Rank bucket of `x`: monotone in x (hence in the logit); NaN (only from an
/// infinite temperature, weight 0) lands in the last bucket.
#[inline(always)]
fn bucket_of(x: f32) -> u32 {
    let y = -x * BUCKET_SCALE;
    let y = if y < (BUCKETS - 1) as f32 {
        y
    } else {
        (BUCKETS - 1) as f32
    };
    let y = if y > 0.0 { y } else { 0.0 };
    // SAFETY: y is finite and in [0, BUCKETS - 1], representable as i32 (a
    // plain `as` would not vectorise).
    (unsafe { y.to_int_unchecked::<i32>() }) as u32
}

impl Consts {
    /// Sum of the weights of the allowed lanes of `c` that reach the floor.
    #[inline(always)]
    fn chunk_sum(&self, c: &Chunk) -> u64 {
        let (mut hs, mut ls) = ([0u32; 8], [0u32; 8]);
        for g in 0..LANES / 8 {
            for j in 0..8 {
                let lane_id = g * 8 + j;
                let (hi, lo, a, _) = lane(c.vals[lane_id], self);
                let allowed = (c.bits >> lane_id) & 1 == 1;
                let m = if allowed && a >= self.floor_a {
                    u32::MAX
                } else {
                    0
                };
                hs[j] += hi & m;
                ls[j] += lo & m;
            }
        }
        join(hs.iter().sum(), ls.iter().sum())
    }

    /// Weigh the lanes of `c` one by one (rank buckets included).
    #[inline(always)]
    fn weigh(&self, c: &Chunk, out: &mut Weighed) {
        for j in 0..LANES {
            let (hi, lo, a, x) = lane(c.vals[j], self);
            let allowed = (c.bits >> j) & 1 == 1;
            out.hi[j] = if allowed { hi } else { 0 };
            out.lo[j] = if allowed { lo } else { 0 };
            out.floor_ok[j] = allowed && a >= self.floor_a;
            out.bucket[j] = bucket_of(x);
        }
    }
}

/// The weight from its halves.
#[inline(always)]
fn join(hi: u32, lo: u32) -> u64 {
    (u64::from(hi) << 16) + u64::from(lo)
}

/// Walks a row 32 tokens at a time, applying mask and adjustments. Tokens
/// not allowed (and the padding of a short last chunk) get the value `fill`
/// and a clear bit.
struct Chunks<'r, 'a, L> {
    row: &'r Row<'a, L>,
    next: usize,
    end: usize,
    next_adj: usize,
    fill: f32,
    c: Chunk,
}

impl<'r, 'a, L: LogitValue> Chunks<'r, 'a, L> {
    /// The chunks starting in `tokens` (`tokens.start` a multiple of 32).
    #[inline(always)]
    fn new(row: &'r Row<'a, L>, tokens: std::ops::Range<usize>, fill: f32) -> Self {
        Self {
            row,
            next: tokens.start,
            end: tokens.end.min(row.logits.len()),
            next_adj: row
                .adjust
                .partition_point(|a| (a.id as usize) < tokens.start),
            fill,
            c: Chunk {
                base: 0,
                vals: [fill; LANES],
                bits: 0,
            },
        }
    }

    /// Load the next chunk into `self.c`; false when there is none.
    #[inline(always)]
    fn advance(&mut self) -> bool {
        let base = self.next;
        if base >= self.end {
            return false;
        }
        let row = self.row;
        let adjust = row.adjust;
        let chunk = &row.logits[base..(base + LANES).min(self.end)];
        self.next = base + chunk.len();
        let full: u32 = if chunk.len() == LANES {
            u32::MAX
        } else {
            (1u32 << chunk.len()) - 1
        };
        let bits = row.mask.map_or(full, |m| m[base / LANES] & full);
        let chunk_end = base + chunk.len();
        let mut next_adj = self.next_adj;
        let adj_here = next_adj < adjust.len() && (adjust[next_adj].id as usize) < chunk_end;
        let c = &mut self.c;
        c.base = base;
        c.bits = bits;
        if bits == u32::MAX && !adj_here {
            for (v, s) in c.vals.iter_mut().zip(chunk) {
                *v = s.to_f32();
            }
            return true;
        }
        for (j, slot) in c.vals.iter_mut().enumerate() {
            let token = base + j;
            let mut v = self.fill;
            if bits >> j & 1 == 1 {
                v = chunk[j].to_f32();
                while next_adj < adjust.len() && (adjust[next_adj].id as usize) < token {
                    next_adj += 1;
                }
                if next_adj < adjust.len() && adjust[next_adj].id as usize == token {
                    v = adjusted(v, &adjust[next_adj], row.params);
                }
            }
            *slot = v;
        }
        while next_adj < adjust.len() && (adjust[next_adj].id as usize) < chunk_end {
            next_adj += 1;
        }
        self.next_adj = next_adj;
        true
    }
}

/// The adjusted logit of an allowed token (as [`Chunks`] computes it).
fn adjusted_value<L: LogitValue>(row: &Row<'_, L>, id: u32) -> f32 {
    let v = row.logits[id as usize].to_f32();
    match row.adjust.binary_search_by_key(&id, |a| a.id) {
        Ok(i) => adjusted(v, &row.adjust[i], row.params),
        Err(_) => v,
    }
}

/// Index of the block where the running sum of `blocks` passes `target`,
/// and the sum of the blocks before it.
fn find_block(blocks: &[u64], target: u64) -> (usize, u64) {
    let mut acc = 0u64;
    for (b, &sum) in blocks.iter().enumerate() {
        if acc + sum > target {
            return (b, acc);
        }
        acc += sum;
    }
    (blocks.len() - 1, acc)
}

/// The weighed distribution of a full-vocabulary row: block sums of the
/// survivors in [`FusedScratch`] plus what is needed to weigh any token
/// again. Valid until the scratch is reused.
#[derive(Clone, Copy)]
pub(crate) struct FullDist {
    k: Consts,
    /// The min-p floor as an integer weight (0 without min-p).
    floor: u64,
    /// With top-p: the edge bucket (weights and buckets are stored, and the
    /// survivors of the edge bucket are listed in `FusedScratch::edge`).
    edge: Option<u16>,
    /// Total surviving weight (> 0: the top token weighs 2^32 and survives).
    pub total: u64,
}

/// Defines `$name`, which runs `$body` compiled for AVX2 (8 lanes instead of
/// 4) when the CPU has it, and the baseline build otherwise. Both builds do
/// the same IEEE operations in the same order (Rust never contracts
/// `a * b + c` into an FMA), so they give the same bits; the bodies are
/// `#[inline(always)]` so each build gets its own vectorised copy.
macro_rules! avx2_dispatch {
    (
        $(#[$doc:meta])*
        $vis:vis fn $name:ident / $avx:ident => $body:ident
        <$g:ident: $bound:path> ($($arg:ident: $ty:ty),*) $(-> $ret:ty)?
    ) => {
        $(#[$doc])*
        $vis fn $name<$g: $bound>($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU supports AVX2 (checked just above).
                return unsafe { $avx($($arg),*) };
            }
            $body($($arg),*)
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2")]
        fn $avx<$g: $bound>($($arg: $ty),*) $(-> $ret)? {
            $body($($arg),*)
        }
    };
}

avx2_dispatch! {
    /// Draw one token of a row whose allowed adjusted logits have maximum `l_max`
    /// (all finite; checked by the caller's scan), with top-k off. Returns the
    /// chosen token (id, adjusted logit, weight) and the total surviving weight:
    /// exactly what the listing path gives.
    pub(crate) fn draw_full / draw_full_avx2 => draw_full_body
    <L: LogitValue> (
        row: &Row<'_, L>,
        l_max: f32,
        params: &SamplingParams,
        stream: &mut PhiloxStream,
        s: &mut FusedScratch
    ) -> (Cand, u64)
}

#[inline(always)]
fn draw_full_body<L: LogitValue>(
    row: &Row<'_, L>,
    l_max: f32,
    params: &SamplingParams,
    stream: &mut PhiloxStream,
    s: &mut FusedScratch,
) -> (Cand, u64) {
    let d = weigh_full_body(row, l_max, params, s);
    let target = stream.below(d.total);
    (pick_full(row, &d, target, s), d.total)
}

avx2_dispatch! {
    /// Weigh a row for the fused path (see [`draw_full`] for the conditions):
    /// block sums of the survivors and the total.
    pub(crate) fn weigh_full / weigh_full_avx2 => weigh_full_body
    <L: LogitValue> (
        row: &Row<'_, L>,
        l_max: f32,
        params: &SamplingParams,
        s: &mut FusedScratch
    ) -> FullDist
}

#[inline(always)]
fn weigh_full_body<L: LogitValue>(
    row: &Row<'_, L>,
    l_max: f32,
    params: &SamplingParams,
    s: &mut FusedScratch,
) -> FullDist {
    let floor = if params.min_p > 0.0 {
        params.min_p_weight()
    } else {
        0
    };
    let mut floor_a = floor as f32;
    if (floor_a as f64) < floor as f64 {
        floor_a = floor_a.next_up();
    }
    let k = Consts {
        l_max,
        temperature: params.effective_temperature(),
        floor_a,
    };
    let vocab = row.logits.len();
    s.blocks.clear();
    s.blocks.resize(vocab.div_ceil(BLOCK), 0);
    if params.top_p < 1.0 {
        let mut w = new_weighed();
        let (edge, total) = weigh_top_p(row, &k, floor, params, s, &mut w);
        return FullDist {
            k,
            floor,
            edge: Some(edge),
            total,
        };
    }
    let mut it = Chunks::new(row, 0..vocab, l_max);
    while it.advance() {
        s.blocks[it.c.base / BLOCK] += k.chunk_sum(&it.c);
    }
    FullDist {
        k,
        floor,
        edge: None,
        total: s.blocks.iter().sum(),
    }
}

fn new_weighed() -> Weighed {
    Weighed {
        hi: [0; LANES],
        lo: [0; LANES],
        floor_ok: [false; LANES],
        bucket: [0; LANES],
    }
}

/// Whether a token of stored weight `wt` and bucket `b` survives top-p and
/// min-p.
#[inline(always)]
fn top_p_keeps(d: &FullDist, edge: u16, s: &FusedScratch, id: usize, wt: u64, b: u16) -> bool {
    wt >= d.floor
        && (b < edge || (b == edge && s.edge.binary_search_by_key(&(id as u32), |c| c.id).is_ok()))
}

/// The token where the running sum of the survivors' weights (by id) passes
/// `target < d.total`: what the listing path's CDF draw picks.
pub(crate) fn pick_full<L: LogitValue>(
    row: &Row<'_, L>,
    d: &FullDist,
    target: u64,
    s: &FusedScratch,
) -> Cand {
    let (block, mut acc) = find_block(&s.blocks, target);
    let start = block * BLOCK;
    let vocab = row.logits.len();
    if let Some(edge) = d.edge {
        let end = (start + BLOCK).min(vocab);
        for id in start..end {
            let (wt, b) = (s.weights[id], s.buckets[id]);
            if !top_p_keeps(d, edge, s, id, wt, b) {
                continue;
            }
            acc += wt;
            if acc > target {
                let id = id as u32;
                return Cand {
                    id,
                    l: adjusted_value(row, id),
                    w: wt,
                };
            }
        }
    } else {
        let mut w = new_weighed();
        let mut it = Chunks::new(row, start..start + BLOCK, d.k.l_max);
        while it.advance() {
            let c = &it.c;
            d.k.weigh(c, &mut w);
            for j in 0..LANES {
                if !w.floor_ok[j] {
                    continue;
                }
                let wt = join(w.hi[j], w.lo[j]);
                acc += wt;
                if acc > target {
                    return Cand {
                        id: (c.base + j) as u32,
                        l: c.vals[j],
                        w: wt,
                    };
                }
            }
        }
    }
    // Unreachable: the block's surviving weights sum past the target.
    Cand {
        id: 0,
        l: d.k.l_max,
        w: 0,
    }
}

/// The surviving weight of token `id` (0 if filtered out or not allowed).
pub(crate) fn weight_full<L: LogitValue>(
    row: &Row<'_, L>,
    d: &FullDist,
    id: u32,
    s: &FusedScratch,
) -> u64 {
    let i = id as usize;
    if let Some(edge) = d.edge {
        let (wt, b) = (s.weights[i], s.buckets[i]);
        return if top_p_keeps(d, edge, s, i, wt, b) {
            wt
        } else {
            0
        };
    }
    if !allowed(row.mask, id) {
        return 0;
    }
    let (hi, lo, a, _) = lane(adjusted_value(row, id), &d.k);
    if a >= d.k.floor_a { join(hi, lo) } else { 0 }
}

avx2_dispatch! {
    /// Residual weights `residual_weight(w, q, total)` of every survivor, summed
    /// per block into the scratch; returns their total. `q` (one value per
    /// token) must be valid (finite, in `[0, 1]`) everywhere.
    pub(crate) fn residual_full / residual_full_avx2 => residual_full_body
    <L: LogitValue> (
        row: &Row<'_, L>,
        d: &FullDist,
        q: &[f32],
        s: &mut FusedScratch
    ) -> u64
}

/// `residual_weight` of the verifier, inlined here so it vectorises.
#[inline(always)]
fn residual_of(w: u64, q: f32, scale: f64) -> u64 {
    let cut = (f64::from(q) * RESIDUAL_GUARD) * scale;
    w - w.min(cut as u64)
}

#[inline(always)]
fn residual_full_body<L: LogitValue>(
    row: &Row<'_, L>,
    d: &FullDist,
    q: &[f32],
    s: &mut FusedScratch,
) -> u64 {
    let vocab = row.logits.len();
    let scale = d.total as f64;
    s.rblocks.clear();
    s.rblocks.resize(vocab.div_ceil(BLOCK), 0);
    if let Some(edge) = d.edge {
        for bi in 0..s.rblocks.len() {
            let start = bi * BLOCK;
            let end = (start + BLOCK).min(vocab);
            let mut sum = 0u64;
            let ws = &s.weights[start..end];
            let bs = &s.buckets[start..end];
            for (j, ((&wt, &b), &qv)) in ws.iter().zip(bs).zip(&q[start..end]).enumerate() {
                // Tokens of the edge bucket are rare: look them up.
                let keep = wt >= d.floor
                    && b <= edge
                    && (b < edge || top_p_keeps(d, edge, s, start + j, wt, b));
                let wt = if keep { wt } else { 0 };
                sum += residual_of(wt, qv, scale);
            }
            s.rblocks[bi] = sum;
        }
    } else {
        let mut w = new_weighed();
        let mut it = Chunks::new(row, 0..vocab, d.k.l_max);
        while it.advance() {
            let c = &it.c;
            d.k.weigh(c, &mut w);
            let n = (vocab - c.base).min(LANES);
            let qs = &q[c.base..c.base + n];
            let mut sum = 0u64;
            for (j, &qv) in qs.iter().enumerate() {
                let wt = if w.floor_ok[j] {
                    join(w.hi[j], w.lo[j])
                } else {
                    0
                };
                sum += residual_of(wt, qv, scale);
            }
            s.rblocks[c.base / BLOCK] += sum;
        }
    }
    s.rblocks.iter().sum()
}

/// The token where the running sum of residual weights (by id) passes
/// `target` (below the total of [`residual_full`], called just before).
pub(crate) fn pick_residual<L: LogitValue>(
    row: &Row<'_, L>,
    d: &FullDist,
    q: &[f32],
    target: u64,
    s: &FusedScratch,
) -> Cand {
    let (block, mut acc) = find_block(&s.rblocks, target);
    let start = block * BLOCK;
    let end = (start + BLOCK).min(row.logits.len());
    let scale = d.total as f64;
    for (j, &qv) in q[start..end].iter().enumerate() {
        let id = start + j;
        let wt = weight_full(row, d, id as u32, s);
        let r = residual_of(wt, qv, scale);
        acc += r;
        if r > 0 && acc > target {
            let id = id as u32;
            return Cand {
                id,
                l: adjusted_value(row, id),
                w: wt,
            };
        }
    }
    // Unreachable: the block's residual weights sum past the target.
    Cand {
        id: 0,
        l: d.k.l_max,
        w: 0,
    }
}

/// [`weigh_full`] with top-p: a first pass stores every weight and rank
/// bucket and sums weight per bucket; the bucket where the best-first prefix
/// reaches its target is resolved exactly; a second pass over the stored
/// weights sums the survivors per block. Returns the edge bucket and the
/// total.
#[inline(always)]
fn weigh_top_p<L: LogitValue>(
    row: &Row<'_, L>,
    k: &Consts,
    floor: u64,
    params: &SamplingParams,
    s: &mut FusedScratch,
    w: &mut Weighed,
) -> (u16, u64) {
    const LAST: u16 = (BUCKETS - 1) as u16;
    let vocab = row.logits.len();
    // Top-p comes before min-p: the histogram takes every weight.
    let no_floor = Consts { floor_a: 0.0, ..*k };
    s.hist.clear();
    s.hist.resize(BUCKETS, 0);
    if s.weights.len() < vocab {
        s.weights.resize(vocab, 0);
        s.buckets.resize(vocab, 0);
    }
    let hist = &mut s.hist[..BUCKETS];
    let mut it = Chunks::new(row, 0..vocab, k.l_max);
    while it.advance() {
        let c = &it.c;
        no_floor.weigh(c, w);
        let n = (vocab - c.base).min(LANES);
        let ws = &mut s.weights[c.base..c.base + n];
        let bs = &mut s.buckets[c.base..c.base + n];
        for j in 0..n {
            let wt = join(w.hi[j], w.lo[j]);
            // Tokens not allowed weigh 0 and go to the last bucket, which
            // holds only zero weights and so is never the edge. (Buckets are
            // below BUCKETS, a power of two: the mask only drops the bounds
            // check.)
            let b = if (c.bits >> j) & 1 == 1 {
                w.bucket[j] as usize & (BUCKETS - 1)
            } else {
                LAST as usize
            };
            ws[j] = wt;
            bs[j] = b as u16;
            hist[b] += wt;
        }
    }
    let z: u64 = s.hist.iter().sum();
    let need = top_p_need(z, params.top_p_fixed());
    let mut above = 0u64;
    let mut edge = 0u16;
    for (b, &h) in s.hist.iter().enumerate() {
        if above + h >= need {
            edge = b as u16;
            break;
        }
        above += h;
    }
    // Survivors below the edge bucket, per block; the edge bucket's tokens
    // are listed and resolved exactly by rank.
    s.edge.clear();
    let weights = &s.weights[..vocab];
    let buckets = &s.buckets[..vocab];
    for (bi, (ws, bs)) in weights.chunks(BLOCK).zip(buckets.chunks(BLOCK)).enumerate() {
        let mut sum = 0u64;
        let mut on_edge = 0u32;
        for (&wt, &b) in ws.iter().zip(bs) {
            sum += if b < edge && wt >= floor { wt } else { 0 };
            on_edge += u32::from(b == edge);
        }
        s.blocks[bi] = sum;
        if on_edge > 0 {
            for (j, (&wt, &b)) in ws.iter().zip(bs).enumerate() {
                if b == edge {
                    let id = (bi * BLOCK + j) as u32;
                    s.edge.push(Cand {
                        id,
                        l: adjusted_value(row, id),
                        w: wt,
                    });
                }
            }
        }
    }
    let n = weighted_prefix(&mut s.edge, need.saturating_sub(above).max(1));
    s.edge.truncate(n);
    s.edge.retain(|c| c.w >= floor);
    s.edge.sort_unstable_by_key(|c| c.id);
    for c in &s.edge {
        s.blocks[c.id as usize / BLOCK] += c.w;
    }
    (edge, s.blocks.iter().sum())
}

avx2_dispatch! {
    /// The `n` best survivors by weight (ties by id), best first, into `out`:
    /// what the listing path reports as alternatives for
    /// [`crate::LogprobSource::Sampled`]. Fewer when fewer tokens survive.
    pub(crate) fn top_survivors / top_survivors_avx2 => top_survivors_body
    <L: LogitValue> (
        row: &Row<'_, L>,
        d: &FullDist,
        n: usize,
        s: &FusedScratch,
        out: &mut Vec<Cand>
    )
}

#[inline(always)]
fn top_survivors_body<L: LogitValue>(
    row: &Row<'_, L>,
    d: &FullDist,
    n: usize,
    s: &FusedScratch,
    out: &mut Vec<Cand>,
) {
    out.clear();
    if n == 0 {
        return;
    }
    let by_weight = |a: &Cand, b: &Cand| b.w.cmp(&a.w).then(a.id.cmp(&b.id));
    // Tokens come in id order, so once `n` are held a new one must weigh
    // strictly more than the n-th best to rank before it.
    let cap = 2 * n + 32;
    let mut th: Option<u64> = None;
    let offer = |out: &mut Vec<Cand>, th: &mut Option<u64>, id: usize, w: u64| {
        if th.is_none_or(|t| w > t) {
            out.push(Cand {
                id: id as u32,
                l: 0.0,
                w,
            });
            if out.len() >= cap {
                out.select_nth_unstable_by(n - 1, by_weight);
                out.truncate(n);
                *th = Some(out[n - 1].w);
            }
        }
    };
    let vocab = row.logits.len();
    if let Some(edge) = d.edge {
        let (ws, bs) = (&s.weights[..vocab], &s.buckets[..vocab]);
        for (id, (&wt, &b)) in ws.iter().zip(bs).enumerate() {
            if th.is_none_or(|t| wt > t)
                && wt >= d.floor
                && b <= edge
                && (b < edge || top_p_keeps(d, edge, s, id, wt, b))
            {
                offer(out, &mut th, id, wt);
            }
        }
    } else {
        let mut w = new_weighed();
        let mut it = Chunks::new(row, 0..vocab, d.k.l_max);
        while it.advance() {
            let c = &it.c;
            d.k.weigh(c, &mut w);
            if let Some(t) = th {
                // Most chunks hold nothing above the n-th best: one
                // vectorised test skips them.
                let mut hit = false;
                for j in 0..LANES {
                    hit |= w.floor_ok[j] & (join(w.hi[j], w.lo[j]) > t);
                }
                if !hit {
                    continue;
                }
            }
            for j in 0..LANES {
                if w.floor_ok[j] {
                    offer(out, &mut th, c.base + j, join(w.hi[j], w.lo[j]));
                }
            }
        }
    }
    if out.len() > n {
        out.select_nth_unstable_by(n - 1, by_weight);
        out.truncate(n);
    }
    out.sort_unstable_by(by_weight);
}

/// The first allowed token whose adjusted logit equals `l_max` (the row's
/// maximum): the best-ranked token, ties by id, as the listing's `best`.
pub(crate) fn first_max<L: LogitValue>(row: &Row<'_, L>, l_max: f32) -> u32 {
    // Lanes not allowed are filled with -inf and never match a finite maximum.
    let mut it = Chunks::new(row, 0..row.logits.len(), f32::NEG_INFINITY);
    while it.advance() {
        let c = &it.c;
        let mut hits = 0u32;
        for (j, &v) in c.vals.iter().enumerate() {
            hits |= u32::from(v == l_max) << j;
        }
        hits &= c.bits;
        if hits != 0 {
            return (c.base + hits.trailing_zeros() as usize) as u32;
        }
    }
    // Unreachable: `l_max` is the value of an allowed token.
    0
}
