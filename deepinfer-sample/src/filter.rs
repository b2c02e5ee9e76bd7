//! Candidate gathering and the top-k / top-p / min-p filters, computed
//! without sorting the vocabulary but with results identical to the
//! sort-then-filter definition.
//!
//! Ranking ("best first") is by adjusted logit descending, ties by token id
//! ascending. Temperature does not change the ranking (it is applied after the
//! adjusted logits are ranked). Top-k keeps the first `k` in that order. Top-p
//! keeps the shortest best-first prefix (of the top-k survivors) whose integer
//! weight reaches `ceil(Z * ceil(top_p * 2^32) / 2^32)`, `Z` the total weight
//! of the top-k survivors. Min-p then keeps tokens whose weight is at least
//! `ceil(min_p * 2^32)` (the top token has weight `2^32`).

use std::cmp::Ordering;

use crate::error::SampleError;
use crate::fixed_point::{WEIGHT_BITS, relative_weight};
use crate::logits::{LogitValue, Row};

/// A candidate token: id, adjusted logit and (once computed) integer weight.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Cand {
    pub id: u32,
    pub l: f32,
    pub w: u64,
}

/// Best-first order: adjusted logit descending, then token id ascending.
/// Logits are finite, so this is a strict total order on distinct ids.
#[inline]
pub(crate) fn rank(a: &Cand, b: &Cand) -> Ordering {
    b.l.partial_cmp(&a.l)
        .unwrap_or(Ordering::Equal)
        .then(a.id.cmp(&b.id))
}

/// What [`gather`] found.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gathered {
    /// Number of allowed tokens.
    pub allowed: usize,
    /// `Some(l_max)` when the listing passed its limit: `out` was emptied
    /// and only the maximum adjusted logit was tracked from then on.
    pub overflow: Option<f32>,
}

/// Collect the allowed tokens of `row` into `out`: all of them when `keep` is
/// `None`, else the `keep` best (fewer if fewer are allowed), found with one
/// streaming pass plus occasional partial selections. With `cutoff = Some(c)`
/// tokens more than `c` below the running maximum may be left out: callers
/// pass a `c` past which the integer weight is 0, so the filtered distribution
/// (and every draw from it) is unchanged. With `keep = None`, once more than
/// `limit` tokens are listed the listing stops (see [`Gathered::overflow`]);
/// the scan still checks every allowed logit and counts them.
pub(crate) fn gather<L: LogitValue>(
    row: &Row<'_, L>,
    keep: Option<usize>,
    cutoff: Option<f32>,
    limit: usize,
    out: &mut Vec<Cand>,
) -> Result<Gathered, SampleError> {
    out.clear();
    let mut threshold = f32::NEG_INFINITY;
    let cut = cutoff.unwrap_or(f32::INFINITY);
    let mut top = f32::NEG_INFINITY;
    // Raise the scan threshold to just below `top - cut` (never lower it).
    // `l - cut` rounds, possibly up (to `l` itself when `cut` is below half
    // its spacing, which would drop ties of the maximum): the next float down
    // is strictly below the exact difference.
    let raise = |l: f32, top: &mut f32, th: &mut f32| {
        if l > *top {
            *top = l;
            let floor = (l - cut).next_down();
            if floor > *th {
                *th = floor;
            }
        }
    };
    let mut overflow = false;
    let allowed = match keep {
        None => row.scan(&mut threshold, |id, l, th| {
            if overflow {
                // The threshold is the running maximum: only a new maximum
                // gets here (ties keep the first, as `best` does).
                top = l;
                *th = l;
                return;
            }
            out.push(Cand { id, l, w: 0 });
            raise(l, &mut top, th);
            if out.len() > limit {
                overflow = true;
                out.clear();
                *th = top;
            }
        })?,
        Some(k) => {
            let k = k.max(1);
            // A small buffer keeps the threshold close to the running k-th best,
            // so few tokens are pushed; each selection is amortised over `k` pushes.
            let cap = 2 * k + 32;
            let allowed = row.scan(&mut threshold, |id, l, th| {
                out.push(Cand { id, l, w: 0 });
                raise(l, &mut top, th);
                if out.len() >= cap {
                    out.select_nth_unstable_by(k - 1, rank);
                    out.truncate(k);
                    // Later tokens have larger ids, so one equal to the k-th
                    // best ranks after it: only strictly larger logits matter.
                    if out[k - 1].l > *th {
                        *th = out[k - 1].l;
                    }
                }
            })?;
            if out.len() > k {
                out.select_nth_unstable_by(k - 1, rank);
                out.truncate(k);
            }
            allowed
        }
    };
    Ok(Gathered {
        allowed,
        overflow: overflow.then_some(top),
    })
}

/// The best-ranked candidate (`cands` must be non-empty).
pub(crate) fn best(cands: &[Cand]) -> Cand {
    let mut b = cands[0];
    for c in &cands[1..] {
        if rank(c, &b) == Ordering::Less {
            b = *c;
        }
    }
    b
}

/// Keep the `k` best of `cands` (unordered).
pub(crate) fn top_k(cands: &mut Vec<Cand>, k: usize) {
    if k > 0 && cands.len() > k {
        cands.select_nth_unstable_by(k - 1, rank);
        cands.truncate(k);
    }
}

/// Set every candidate's weight for the row maximum `l_max` and temperature.
pub(crate) fn weigh(cands: &mut [Cand], l_max: f32, temperature: f32) {
    for c in cands {
        c.w = relative_weight(c.l - l_max, temperature);
    }
}

/// The top-p weight target: `ceil(z * top_p_fixed / 2^32)`.
pub(crate) fn top_p_need(z: u64, top_p_fixed: u64) -> u64 {
    let prod = u128::from(z) * u128::from(top_p_fixed);
    prod.div_ceil(1u128 << WEIGHT_BITS) as u64
}

/// Coarse, order-preserving bucket of a weight: 0 for 0, else its binary
/// exponent and the next 4 bits (`1 + 16 * e + m`, at most 528). Weight is
/// non-decreasing in rank, so a higher bucket always ranks first.
#[inline]
fn weight_bucket(w: u64) -> usize {
    if w == 0 {
        return 0;
    }
    let lz = w.leading_zeros();
    let m = ((w << lz) >> 59) & 0xF;
    (16 * (63 - lz) + m as u32 + 1) as usize
}

/// Number of weight buckets.
const WEIGHT_BUCKETS: usize = 16 * 33 + 1;

/// Keep the shortest best-first prefix of `c` whose weight reaches `need`
/// (as [`weighted_prefix`]), for large `c`: a histogram of weight buckets finds
/// the bucket where the prefix ends; only that bucket is searched.
pub(crate) fn top_p_filter(c: &mut Vec<Cand>, need: u64) {
    if c.len() <= 512 {
        let n = weighted_prefix(c, need);
        c.truncate(n);
        return;
    }
    let mut hist = [0u64; WEIGHT_BUCKETS];
    for x in c.iter() {
        hist[weight_bucket(x.w)] += x.w;
    }
    let mut above = 0u64;
    let mut edge = 0usize;
    for b in (0..WEIGHT_BUCKETS).rev() {
        if above + hist[b] >= need {
            edge = b;
            break;
        }
        above += hist[b];
    }
    // [bucket > edge | bucket == edge], everything lower dropped.
    let mut n_above = 0usize;
    let mut n_keep = 0usize;
    for r in 0..c.len() {
        let b = weight_bucket(c[r].w);
        if b >= edge {
            c.swap(n_keep, r);
            if b > edge {
                c.swap(n_above, n_keep);
                n_above += 1;
            }
            n_keep += 1;
        }
    }
    c.truncate(n_keep);
    let k = weighted_prefix(&mut c[n_above..], need.saturating_sub(above).max(1));
    c.truncate(n_above + k);
}

/// Reorder `c` so its shortest best-first prefix with weight `>= need`
/// occupies `c[..n]`, and return `n` (all of `c` if the total is below
/// `need`). Weighted quickselect: expected linear time, no full sort.
pub(crate) fn weighted_prefix(c: &mut [Cand], need: u64) -> usize {
    let (mut lo, mut hi, mut need) = (0usize, c.len(), need);
    // Invariant: c[..lo] rank before everything in c[lo..hi] and are kept;
    // c[hi..] rank after it and are dropped; `need` is what c[lo..] must add.
    loop {
        let n = hi - lo;
        if n <= 48 {
            c[lo..hi].sort_unstable_by(rank);
            let mut acc = 0u64;
            for (i, x) in c[lo..hi].iter().enumerate() {
                acc += x.w;
                if acc >= need {
                    return lo + i + 1;
                }
            }
            return hi;
        }
        let half = n / 2;
        c[lo..hi].select_nth_unstable_by(half, rank);
        let m = lo + half;
        let upper: u64 = c[lo..m].iter().map(|x| x.w).sum();
        if upper >= need {
            hi = m;
        } else if upper + c[m].w >= need {
            return m + 1;
        } else {
            need -= upper + c[m].w;
            lo = m + 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands(ws: &[(f32, u64)]) -> Vec<Cand> {
        ws.iter()
            .enumerate()
            .map(|(i, &(l, w))| Cand { id: i as u32, l, w })
            .collect()
    }

    #[test]
    fn weighted_prefix_matches_sorted_walk() {
        // Pseudo-random logits with many ties, many sizes.
        for n in [1usize, 5, 49, 200, 1000] {
            let mut c: Vec<Cand> = (0..n)
                .map(|i| {
                    let l = ((i * 7919) % 37) as f32;
                    Cand {
                        id: i as u32,
                        l,
                        w: (l as u64 + 1) * 1000,
                    }
                })
                .collect();
            let total: u64 = c.iter().map(|x| x.w).sum();
            for need in [1, total / 3, total / 2, total - 1, total] {
                let mut sorted = c.clone();
                sorted.sort_by(rank);
                let mut acc = 0;
                let mut expect = sorted.len();
                for (i, x) in sorted.iter().enumerate() {
                    acc += x.w;
                    if acc >= need {
                        expect = i + 1;
                        break;
                    }
                }
                let k = weighted_prefix(&mut c, need);
                assert_eq!(k, expect);
                let mut got: Vec<u32> = c[..k].iter().map(|x| x.id).collect();
                let mut want: Vec<u32> = sorted[..k].iter().map(|x| x.id).collect();
                got.sort();
                want.sort();
                assert_eq!(got, want);
            }
        }
        let mut c = cands(&[(1.0, 5), (2.0, 5)]);
        assert_eq!(weighted_prefix(&mut c, 100), 2);
    }

    #[test]
    fn buckets_are_monotone() {
        let mut prev = 0;
        for w in (0..33).flat_map(|e| (0..64u64).map(move |m| (1u64 << e) + m * ((1u64 << e) / 64)))
        {
            let b = weight_bucket(w);
            assert!(b >= prev && b < WEIGHT_BUCKETS, "{w}");
            prev = b;
        }
        assert_eq!(weight_bucket(0), 0);
        assert_eq!(weight_bucket(1), 1);
    }

    #[test]
    fn top_p_filter_matches_weighted_prefix() {
        for n in [600usize, 3000] {
            let c: Vec<Cand> = (0..n)
                .map(|i| {
                    let l = ((i * 7919) % 1013) as f32 * 0.01;
                    Cand {
                        id: i as u32,
                        l,
                        w: relative_weight(l - 10.12, 0.5),
                    }
                })
                .collect();
            let total: u64 = c.iter().map(|x| x.w).sum();
            for need in [1, total / 10, total / 2, total - 1, total] {
                let mut a = c.clone();
                let k = weighted_prefix(&mut a, need);
                let mut want: Vec<u32> = a[..k].iter().map(|x| x.id).collect();
                let mut b = c.clone();
                top_p_filter(&mut b, need);
                let mut got: Vec<u32> = b.iter().map(|x| x.id).collect();
                want.sort();
                got.sort();
                assert_eq!(got, want, "n {n} need {need}");
            }
        }
    }

    #[test]
    fn need_rounds_up() {
        assert_eq!(top_p_need(10, 1 << 31), 5);
        assert_eq!(top_p_need(11, 1 << 31), 6);
        assert_eq!(top_p_need(7, 1 << 32), 7);
    }
}
