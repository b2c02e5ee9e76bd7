//! Attention building blocks on slices: RoPE, sink attention over a shared KV head, the KV
//! compressor's gated pooling, lightning-indexer scores, top-k and block max.
//!
//! Every output row depends only on its own inputs, with a fixed summation order.

use rayon::prelude::*;

use super::gemm::dots_rows;

/// Interleaved RoPE in place on `x` viewed as `[S, inner, d]`; rotates the trailing
/// `2 * inv_freq.len()` channels of every `d`-row (angles and rotation in f64).
pub(crate) fn rope(
    x: &mut [f32],
    s_len: usize,
    d: usize,
    pos: &[i64],
    inv_freq: &[f64],
    inverse: bool,
) {
    let r = 2 * inv_freq.len();
    let per_s = x.len().checked_div(s_len).unwrap_or(0);
    if per_s == 0 {
        return;
    }
    x.par_chunks_mut(per_s).enumerate().for_each(|(s, xs)| {
        let p = pos[s] as f64;
        let sign = if inverse { -1.0 } else { 1.0 };
        let cs: Vec<(f64, f64)> = inv_freq
            .iter()
            .map(|f| {
                let a = p * f;
                (a.cos(), sign * a.sin())
            })
            .collect();
        for row in xs.chunks_mut(d) {
            let tail = &mut row[d - r..];
            for (i, &(c, sn)) in cs.iter().enumerate() {
                let a = tail[2 * i] as f64;
                let b = tail[2 * i + 1] as f64;
                tail[2 * i] = (a * c - b * sn) as f32;
                tail[2 * i + 1] = (a * sn + b * c) as f32;
            }
        }
    });
}

/// Sink attention: `q[S, H, d]`, `kv[J, d]`, `idx[S, K]`, `sink[H]` → `[S, H, d]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sparse_attention(
    q: &[f32],
    s_len: usize,
    h: usize,
    d: usize,
    kv: &[f32],
    idx: &[i64],
    kk: usize,
    sink: &[f32],
    scale: f32,
) -> Vec<f32> {
    let mut out = vec![0.0f32; s_len * h * d];
    if out.is_empty() {
        return out;
    }
    out.par_chunks_mut(h * d).enumerate().for_each(|(s, os)| {
        let sel: Vec<&[f32]> = idx[s * kk..(s + 1) * kk]
            .iter()
            .filter(|&&j| j >= 0)
            .map(|&j| &kv[j as usize * d..(j as usize + 1) * d])
            .collect();
        let n = sel.len();
        // Scores of every head against every selected key at once ([h, n]): the heads share
        // the KV head, so each key is read once per tile of heads, not once per head.
        let mut logits = vec![0.0f32; h * n];
        dots_rows(&q[s * h * d..(s + 1) * h * d], h, d, &sel, &mut logits);
        let mut weights = vec![0.0f32; h];
        for (hh, ls) in logits.chunks_mut(n.max(1)).enumerate().take(h) {
            let mut mx = sink[hh];
            for l in ls.iter_mut() {
                *l *= scale;
                mx = mx.max(*l);
            }
            let mut denom = 0.0f32;
            for l in ls.iter_mut() {
                *l = (*l - mx).exp();
                denom += *l;
            }
            denom += (sink[hh] - mx).exp();
            weights[hh] = 1.0 / denom;
        }
        // Values: every output element sums its keys in their order (a multiply, then an add).
        weighted_values(os, &logits, &sel, h, d);
        for (o, inv) in os.chunks_mut(d).zip(&weights) {
            for ov in o.iter_mut() {
                *ov *= inv;
            }
        }
    });
    out
}

/// `out[hh, c] += Σ_j p[hh, j] · v_j[c]` for `h` heads over the keys `v` in order, each
/// term a multiply then an add (`out` starts at zero): the same bits in every build.
fn weighted_values(out: &mut [f32], p: &[f32], v: &[&[f32]], h: usize, d: usize) {
    #[cfg(target_arch = "x86_64")]
    if super::gemm_tiled::available() {
        // SAFETY: the CPU has AVX-512F (checked at run time).
        return unsafe { weighted_values_avx512(out, p, v, h, d) };
    }
    weighted_values_body(out, p, v, h, d)
}

#[inline(always)]
fn weighted_values_body(out: &mut [f32], p: &[f32], v: &[&[f32]], h: usize, d: usize) {
    let n = v.len();
    for (j, vj) in v.iter().enumerate() {
        for (hh, o) in out.chunks_mut(d).enumerate().take(h) {
            let e = p[hh * n + j];
            for (ov, vv) in o.iter_mut().zip(vj.iter()) {
                *ov += e * vv;
            }
        }
    }
}

/// [`weighted_values_body`] with the sums of 4 heads × 48 channels in registers across all
/// keys (each key chunk loaded once for 4 heads, no store per key); leftovers the plain way.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn weighted_values_avx512(out: &mut [f32], p: &[f32], v: &[&[f32]], h: usize, d: usize) {
    use std::arch::x86_64::*;
    const HG: usize = 4;
    const CW: usize = 3;
    let n = v.len();
    assert!(out.len() >= h * d && p.len() >= h * n && v.iter().all(|r| r.len() >= d));
    let (heads, chans) = (h / HG * HG, d / (16 * CW) * (16 * CW));
    for h0 in (0..heads).step_by(HG) {
        for c0 in (0..chans).step_by(16 * CW) {
            let mut acc = [[_mm512_setzero_ps(); CW]; HG];
            for (j, vj) in v.iter().enumerate() {
                let mut vv = [_mm512_setzero_ps(); CW];
                for (w, x) in vv.iter_mut().enumerate() {
                    // SAFETY: c0 + 16 * (w + 1) <= chans <= d <= vj.len() (asserted).
                    *x = unsafe { _mm512_loadu_ps(vj.as_ptr().add(c0 + 16 * w)) };
                }
                for (g, row) in acc.iter_mut().enumerate() {
                    let e = _mm512_set1_ps(p[(h0 + g) * n + j]);
                    for (a, x) in row.iter_mut().zip(&vv) {
                        *a = _mm512_add_ps(*a, _mm512_mul_ps(e, *x));
                    }
                }
            }
            for (g, row) in acc.iter().enumerate() {
                for (w, a) in row.iter().enumerate() {
                    let at = (h0 + g) * d + c0 + 16 * w;
                    // SAFETY: at + 16 <= (h0 + g) * d + chans <= h * d <= out.len(). The sums
                    // start from zero as `out` does, so storing them equals adding them.
                    unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(at), *a) };
                }
            }
        }
    }
    // Channels past the blocks for the blocked heads, and every channel of the other heads.
    let n_keys = n;
    for (j, vj) in v.iter().enumerate() {
        for hh in 0..h {
            let from = if hh < heads { chans } else { 0 };
            let e = p[hh * n_keys + j];
            let o = &mut out[hh * d + from..(hh + 1) * d];
            for (ov, vv) in o.iter_mut().zip(&vj[from..d]) {
                *ov += e * vv;
            }
        }
    }
}

/// Gated pooling (see `Backend::compress_pool`). `width` is the channel count of `a`/`z`.
pub(crate) fn compress_pool(
    a: &[f32],
    z: &[f32],
    groups: usize,
    ratio: usize,
    width: usize,
    overlap: bool,
    first_is_context: bool,
) -> Vec<f32> {
    let c = if overlap { width / 2 } else { width };
    let first = usize::from(first_is_context);
    let n_out = groups.saturating_sub(first);
    let mut out = vec![0.0f32; n_out * c];
    if out.is_empty() {
        return out;
    }
    out.par_chunks_mut(c).enumerate().for_each(|(o, row)| {
        let w = o + first;
        let mut zs = Vec::with_capacity(2 * ratio);
        let mut as_ = Vec::with_capacity(2 * ratio);
        for (ch, out_v) in row.iter_mut().enumerate() {
            zs.clear();
            as_.clear();
            if overlap {
                if w > 0 {
                    for r in 0..ratio {
                        let i = ((w - 1) * ratio + r) * width + ch;
                        zs.push(z[i]);
                        as_.push(a[i]);
                    }
                }
                for r in 0..ratio {
                    let i = (w * ratio + r) * width + c + ch;
                    zs.push(z[i]);
                    as_.push(a[i]);
                }
            } else {
                for r in 0..ratio {
                    let i = (w * ratio + r) * width + ch;
                    zs.push(z[i]);
                    as_.push(a[i]);
                }
            }
            let mx = zs.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let mut den = 0.0f32;
            let mut num = 0.0f32;
            for (&zv, &av) in zs.iter().zip(&as_) {
                let e = (zv - mx).exp();
                den += e;
                num += e * av;
            }
            *out_v = num / den;
        }
    });
    out
}

/// Indexer scores `[S, T]` (see `Backend::indexer_scores`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn indexer_scores(
    q: &[f32],
    s_len: usize,
    hi: usize,
    di: usize,
    k: &[f32],
    t_len: usize,
    w: &[f32],
    visible: &[usize],
    scale: f32,
) -> Vec<f32> {
    let mut out = vec![f32::NEG_INFINITY; s_len * t_len];
    if out.is_empty() {
        return out;
    }
    out.par_chunks_mut(t_len).enumerate().for_each(|(s, row)| {
        let vis = visible[s].min(t_len);
        // Every head against every visible key at once ([hi, vis]), then the heads summed
        // in order for each key.
        let keys: Vec<&[f32]> = k[..vis * di].chunks_exact(di.max(1)).collect();
        let mut qd = vec![0.0f32; hi * vis];
        dots_rows(&q[s * hi * di..(s + 1) * hi * di], hi, di, &keys, &mut qd);
        for (t, o) in row[..vis].iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for h in 0..hi {
                acc += w[s * hi + h] * qd[h * vis + t].max(0.0);
            }
            *o = acc * scale;
        }
    });
    out
}

/// Total order for top-k: larger value first, NaN lowest, ties to the lower index.
#[inline]
fn rank_cmp(a: (f32, usize), b: (f32, usize)) -> std::cmp::Ordering {
    let key = |v: f32| if v.is_nan() { f32::NEG_INFINITY } else { v };
    key(b.0)
        .partial_cmp(&key(a.0))
        .unwrap_or(std::cmp::Ordering::Equal)
        .then(a.1.cmp(&b.1))
}

/// Indices of the `k` largest values of one row (`-1` for `-inf` picks and missing slots).
pub(crate) fn topk_row(row: &[f32], k: usize, out: &mut [i32]) {
    let mut items: Vec<(f32, usize)> = row.iter().copied().zip(0..).collect();
    let take = k.min(items.len());
    if take > 0 && take < items.len() {
        items.select_nth_unstable_by(take - 1, |a, b| rank_cmp(*a, *b));
    }
    items.truncate(take);
    items.sort_by(|a, b| rank_cmp(*a, *b));
    for (o, slot) in out.iter_mut().zip(0..) {
        *o = match items.get(slot) {
            Some(&(v, i)) if v > f32::NEG_INFINITY => i as i32,
            _ => -1,
        };
    }
}

/// Top-k over rows of length `t` → `[rows, k]`.
pub(crate) fn topk(x: &[f32], t: usize, k: usize) -> Vec<i32> {
    let rows = x.len().checked_div(t).unwrap_or(0);
    let mut out = vec![-1i32; rows * k];
    if k == 0 || rows == 0 {
        return out;
    }
    out.par_chunks_mut(k)
        .zip(x.par_chunks(t))
        .for_each(|(o, row)| topk_row(row, k, o));
    out
}

/// Max over blocks of `block` consecutive entries per row of length `t`.
pub(crate) fn block_max(x: &[f32], t: usize, block: usize) -> Vec<f32> {
    let nb = t.div_ceil(block);
    let rows = x.len().checked_div(t).unwrap_or(0);
    let mut out = vec![f32::NEG_INFINITY; rows * nb];
    for r in 0..rows {
        for (b, chunk) in x[r * t..(r + 1) * t].chunks(block).enumerate() {
            out[r * nb + b] = chunk.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{weighted_values, weighted_values_body};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The vectorised value sums are the plain ones, bit for bit, for any head count,
        /// width and key count.
        #[test]
        fn weighted_values_match_the_plain_sums(
            h in 1usize..11,
            d in 1usize..140,
            n in 0usize..40,
            seed in any::<u64>(),
        ) {
            let mut s = seed | 1;
            let mut next = || {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            };
            let p: Vec<f32> = (0..h * n).map(|_| next()).collect();
            let keys: Vec<Vec<f32>> = (0..n).map(|_| (0..d).map(|_| next()).collect()).collect();
            let v: Vec<&[f32]> = keys.iter().map(Vec::as_slice).collect();
            let mut fast = vec![0.0f32; h * d];
            let mut plain = vec![0.0f32; h * d];
            weighted_values(&mut fast, &p, &v, h, d);
            weighted_values_body(&mut plain, &p, &v, h, d);
            let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&fast), bits(&plain));
        }
    }
}
