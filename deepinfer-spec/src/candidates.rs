//! Draft candidates of a batch and their order: by running product, best first.
//!
//! The order is total and deterministic: larger product first; equal products by request index,
//! then position. That keeps every request's selection a prefix of its drafts (along a request
//! the product never grows, and among equal products the earlier position comes first), and it
//! is the order a device kernel must reproduce for `split` to match bit for bit.
//!
//! Sorting is the planner's hot spot, so it is a stable LSD radix sort (two 8-bit passes) on a
//! 16-bit key: the distance of the product's IEEE bit pattern from that of 1.0 (monotone for
//! non-negative floats, roughly logarithmic in the value), shifted to the batch's range. The
//! key carries the flat draft index; input is in flat (request, position) order, so stability
//! gives the index tie-break for free. Products that share a key are then put in exact order by a
//! pass over the runs of equal keys (insertion sort for short runs, a comparison sort for long
//! ones, so an adversarial batch costs `O(n log n)`, not `O(n²)`).

use crate::error::SpecError;

/// Bits of 1.0: every product in `[0, 1]` has bits `≤ ONE_BITS`, and `ONE_BITS − bits` grows as
/// the product falls.
const ONE_BITS: u64 = 0x3FF0_0000_0000_0000;

/// Reusable buffers holding one batch's candidates.
#[derive(Debug, Clone, Default)]
pub(crate) struct Candidates {
    /// Exact running product per flat draft index.
    prod: Vec<f64>,
    /// Request of each flat draft index.
    req: Vec<u32>,
    /// `(key16 << 32) | flat index`, sorted best first after [`Candidates::sort`].
    items: Vec<u64>,
    tmp: Vec<u64>,
}

/// Checks one confidence.
#[inline]
pub(crate) fn check(request: usize, position: usize, value: f64) -> Result<(), SpecError> {
    if (0.0..=1.0).contains(&value) {
        Ok(())
    } else {
        Err(SpecError::InvalidConfidence {
            request,
            position,
            value,
        })
    }
}

/// Runs of equal keys up to this length are fixed by insertion sort.
const INSERTION_RUN: usize = 24;

#[inline]
fn distance(product: f64) -> u64 {
    // `+ 0.0` turns -0.0 into +0.0 so the bit pattern stays monotone.
    ONE_BITS - (product + 0.0).to_bits()
}

impl Candidates {
    /// Validates every confidence and loads the drafts (at most `max_drafts` per request), in
    /// flat (request, position) order.
    pub(crate) fn build<C: AsRef<[f64]>>(
        &mut self,
        requests: &[C],
        max_drafts: usize,
    ) -> Result<(), SpecError> {
        if requests.is_empty() {
            return Err(SpecError::EmptyBatch);
        }
        self.prod.clear();
        self.req.clear();
        self.items.clear();
        let (mut lo, mut hi) = (u64::MAX, 0u64);
        for (r, confs) in requests.iter().enumerate() {
            let confs = confs.as_ref();
            let mut a = 1.0f64;
            for (i, &c) in confs.iter().enumerate() {
                check(r, i, c)?;
                if i < max_drafts {
                    a *= c;
                    let d = distance(a);
                    lo = lo.min(d);
                    hi = hi.max(d);
                    self.prod.push(a);
                    self.req.push(r as u32);
                }
            }
        }
        if requests.len() > u32::MAX as usize || self.prod.len() > u32::MAX as usize {
            return Err(SpecError::BatchTooLarge {
                requests: requests.len(),
                max: u32::MAX as usize,
            });
        }
        // The top 16 significant bits of the distance above the batch's best product: a
        // monotone key that spends its resolution on the range actually present.
        let shift = (64 - (hi.wrapping_sub(lo)).leading_zeros()).saturating_sub(16);
        self.items.extend(
            self.prod
                .iter()
                .enumerate()
                .map(|(i, &a)| (((distance(a) - lo) >> shift) << 32) | i as u64),
        );
        Ok(())
    }

    /// Number of drafts loaded.
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    /// Sorts the drafts best first (see the module docs for the order).
    pub(crate) fn sort(&mut self) {
        let n = self.items.len();
        if n < 2 {
            return;
        }
        let mut counts = [[0u32; 256]; 2];
        for &item in &self.items {
            counts[0][((item >> 32) & 0xFF) as usize] += 1;
            counts[1][((item >> 40) & 0xFF) as usize] += 1;
        }
        self.tmp.clear();
        self.tmp.resize(n, 0);
        for (p, count) in counts.iter().enumerate() {
            let shift = 32 + 8 * p;
            let first = ((self.items[0] >> shift) & 0xFF) as usize;
            if count[first] as usize == n {
                continue; // Every key shares this digit.
            }
            let mut offsets = [0u32; 256];
            let mut sum = 0;
            for (o, &c) in offsets.iter_mut().zip(count) {
                *o = sum;
                sum += c;
            }
            for &item in &self.items {
                let d = ((item >> shift) & 0xFF) as usize;
                self.tmp[offsets[d] as usize] = item;
                offsets[d] += 1;
            }
            std::mem::swap(&mut self.items, &mut self.tmp);
        }
        self.fix_up_runs();
    }

    /// Adds one draft row per request for each of the `k` best drafts into `rows`, without
    /// sorting everything: a radix *select*. Drafts whose key byte is below the byte holding
    /// the `k`-th are all taken; only that byte's bucket is examined further, and only drafts
    /// sharing the `k`-th's full key are ordered exactly. Same result as
    /// [`Candidates::sort`] followed by [`Candidates::count_into`].
    pub(crate) fn count_top_into(&mut self, k: usize, rows: &mut [usize]) {
        let mut need = k.min(self.items.len());
        if need == self.items.len() {
            self.count_into(need, rows);
            return;
        }
        // `tmp` holds the undecided drafts, in index order.
        self.tmp.clear();
        self.tmp.extend_from_slice(&self.items);
        for shift in [40u32, 32] {
            if need == 0 {
                return;
            }
            let mut count = [0u32; 256];
            for &item in &self.tmp {
                count[((item >> shift) & 0xFF) as usize] += 1;
            }
            let (mut below, mut t) = (0usize, 0usize);
            while below + count[t] as usize <= need {
                below += count[t] as usize;
                t += 1;
            }
            need -= below;
            let mut kept = 0;
            for i in 0..self.tmp.len() {
                let item = self.tmp[i];
                let b = ((item >> shift) & 0xFF) as usize;
                if b < t {
                    rows[self.req[(item as u32) as usize] as usize] += 1;
                } else if b == t {
                    self.tmp[kept] = item;
                    kept += 1;
                }
            }
            self.tmp.truncate(kept);
        }
        if need == 0 {
            return;
        }
        // Every remaining draft shares the full key: exact order, then take `need`.
        let prod = &self.prod;
        self.tmp.sort_unstable_by(|&x, &y| {
            let (ax, ay) = (prod[(x as u32) as usize], prod[(y as u32) as usize]);
            ay.partial_cmp(&ax)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then((x as u32).cmp(&(y as u32)))
        });
        for &item in &self.tmp[..need] {
            rows[self.req[(item as u32) as usize] as usize] += 1;
        }
    }

    /// Exact order inside runs of equal keys. Runs arrive in index order (the tie-break), so
    /// only products that differ need moving.
    fn fix_up_runs(&mut self) {
        let (items, prod) = (&mut self.items, &self.prod);
        let n = items.len();
        let mut start = 0;
        while start < n {
            let key = items[start] >> 32;
            let mut end = start + 1;
            while end < n && items[end] >> 32 == key {
                end += 1;
            }
            let run = &mut items[start..end];
            if run.len() > INSERTION_RUN {
                run.sort_unstable_by(|&x, &y| {
                    let (ax, ay) = (prod[(x as u32) as usize], prod[(y as u32) as usize]);
                    // Products are in [0, 1] (never NaN): larger first, then lower index.
                    ay.partial_cmp(&ax)
                        .unwrap_or(std::cmp::Ordering::Equal)
                        .then((x as u32).cmp(&(y as u32)))
                });
            } else {
                for i in 1..run.len() {
                    let item = run[i];
                    let a = prod[(item as u32) as usize];
                    let mut j = i;
                    while j > 0 && prod[(run[j - 1] as u32) as usize] < a {
                        run[j] = run[j - 1];
                        j -= 1;
                    }
                    run[j] = item;
                }
            }
            start = end;
        }
    }

    /// The `j`-th best draft (after [`Candidates::sort`]): `(product, request)`.
    #[cfg(test)]
    #[inline]
    pub(crate) fn get(&self, j: usize) -> (f64, usize) {
        let i = (self.items[j] as u32) as usize;
        (self.prod[i], self.req[i] as usize)
    }

    /// Products of the first `m` drafts in order.
    #[inline]
    pub(crate) fn products(&self, m: usize) -> impl Iterator<Item = f64> + '_ {
        self.items[..m]
            .iter()
            .map(|&it| self.prod[(it as u32) as usize])
    }

    /// Adds one draft row per request for each of the first `m` drafts into `rows`.
    pub(crate) fn count_into(&self, m: usize, rows: &mut [usize]) {
        for &it in &self.items[..m] {
            rows[self.req[(it as u32) as usize] as usize] += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_product_then_request_then_position() {
        let mut c = Candidates::default();
        // Products: r0: 0.5, 0.5·0.999…; r1: 0.9, 0.0; r2: 0.5, -0.0 → 0.
        let near = 1.0 - 1e-15;
        c.build(
            &[vec![0.5, near], vec![0.9, 0.0], vec![0.5, -0.0]],
            usize::MAX,
        )
        .unwrap();
        c.sort();
        let got: Vec<(f64, usize)> = (0..c.len()).map(|j| c.get(j)).collect();
        assert_eq!(
            got,
            [
                (0.9, 1),
                (0.5, 0),
                (0.5, 2),
                (0.5 * near, 0),
                (0.0, 1),
                (0.0, 2)
            ]
        );
    }

    fn reference_order(batch: &[Vec<f64>]) -> Vec<(f64, usize)> {
        let mut want: Vec<(f64, usize, usize)> = Vec::new();
        for (r, confs) in batch.iter().enumerate() {
            let mut a = 1.0;
            for (i, &x) in confs.iter().enumerate() {
                a *= x;
                want.push((a, r, i));
            }
        }
        want.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)).then(x.2.cmp(&y.2)));
        want.iter().map(|w| (w.0, w.1)).collect()
    }

    fn sorted(batch: &[Vec<f64>]) -> Vec<(f64, usize)> {
        let mut c = Candidates::default();
        c.build(batch, usize::MAX).unwrap();
        c.sort();
        (0..c.len()).map(|j| c.get(j)).collect()
    }

    #[test]
    fn select_counts_match_sorted_counts() {
        let mut seed = 99u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        for trial in 0..40 {
            let batch: Vec<Vec<f64>> = (0..1 + trial * 3)
                .map(|_| {
                    (0..5)
                        .map(|_| match (next() * 8.0) as u32 {
                            0 => 1.0,
                            1 => 0.0,
                            2 => 0.9,
                            _ => next(),
                        })
                        .collect()
                })
                .collect();
            let mut c = Candidates::default();
            c.build(&batch, usize::MAX).unwrap();
            for k in [
                0,
                1,
                2,
                7,
                c.len() / 2,
                c.len().saturating_sub(1),
                c.len(),
                c.len() + 3,
            ] {
                let mut selected = vec![0; batch.len()];
                c.count_top_into(k, &mut selected);
                let mut d = c.clone();
                d.sort();
                let mut sorted = vec![0; batch.len()];
                d.count_into(k.min(d.len()), &mut sorted);
                assert_eq!(selected, sorted, "trial {trial} k {k}");
            }
        }
    }

    #[test]
    fn long_runs_of_one_key_are_ordered_exactly() {
        // One outlier at 0 squeezes everything else into the same few keys.
        let mut batch: Vec<Vec<f64>> = (0..300)
            .map(|r| vec![0.9 + 1e-7 * ((r * 7919) % 300) as f64])
            .collect();
        batch.push(vec![0.0]);
        assert_eq!(sorted(&batch), reference_order(&batch));
    }

    #[test]
    fn radix_order_matches_a_comparison_sort() {
        let mut s = 12345u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64
        };
        let batch: Vec<Vec<f64>> = (0..200)
            .map(|r| {
                (0..(r % 7))
                    .map(|_| match (next() * 10.0) as u32 {
                        0 => 1.0,
                        1 => 0.0,
                        2 => 0.5,
                        _ => next(),
                    })
                    .collect()
            })
            .collect();
        assert_eq!(sorted(&batch), reference_order(&batch));
    }
}
