//! Shared test helpers: a seeded generator and straightforward f64 references.
#![allow(dead_code, clippy::needless_range_loop, clippy::too_many_arguments)]

use half::bf16;

/// SplitMix64: small, seeded, reproducible.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x9e37_79b9_7f4a_7c15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    pub fn f32(&mut self, lo: f32, hi: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * u
    }
    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32(lo, hi)).collect()
    }
    pub fn bf16s(&mut self, n: usize, lo: f32, hi: f32) -> Vec<bf16> {
        (0..n).map(|_| bf16::from_f32(self.f32(lo, hi))).collect()
    }
}

pub fn f(v: &[bf16]) -> Vec<f64> {
    v.iter().map(|x| f64::from(x.to_f32())).collect()
}

/// bf16 output tolerance: one bf16 ulp (2^-8 relative) of `scale`, plus a tiny absolute floor.
pub fn bf16_tol(scale: f64) -> f64 {
    scale * 2f64.powi(-8) + 1e-6
}

pub fn rmsnorm_ref(x: &[f64], w: &[f64], rows: usize, dim: usize, eps: f64) -> Vec<f64> {
    let mut out = Vec::with_capacity(rows * dim);
    for r in 0..rows {
        let row = &x[r * dim..(r + 1) * dim];
        let ms = row.iter().map(|v| v * v).sum::<f64>() / dim as f64;
        let rstd = 1.0 / (ms + eps).sqrt();
        out.extend(row.iter().zip(w).map(|(v, wv)| v * rstd * wv));
    }
    out
}

pub fn rope_ref(
    x: &[f64],
    rows: usize,
    heads: usize,
    d: usize,
    pos: &[u32],
    inv_freq: &[f64],
    inverse: bool,
) -> Vec<f64> {
    let half = inv_freq.len();
    let nope = d - 2 * half;
    let mut y = x.to_vec();
    for r in 0..rows {
        for h in 0..heads {
            let base = (r * heads + h) * d + nope;
            for (i, fr) in inv_freq.iter().enumerate() {
                let mut ang = f64::from(pos[r]) * fr;
                if inverse {
                    ang = -ang;
                }
                let (a, b) = (x[base + 2 * i], x[base + 2 * i + 1]);
                y[base + 2 * i] = a * ang.cos() - b * ang.sin();
                y[base + 2 * i + 1] = a * ang.sin() + b * ang.cos();
            }
        }
    }
    y
}

pub fn gemv_ref(x: &[f64], w: &[f64], m: usize, n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0.0; m * n];
    let mut mag = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            for kk in 0..k {
                y[i * n + j] += x[i * k + kk] * w[j * k + kk];
                mag[i * n + j] += (x[i * k + kk] * w[j * k + kk]).abs();
            }
        }
    }
    (y, mag)
}

/// Scores, chosen ids (ties to lower id) and weights in f64.
pub fn router_ref(
    logits: &[f64],
    bias: &[f64],
    experts: usize,
    k: usize,
    softmax: bool,
    temp: f64,
    renorm: bool,
    scale: f64,
) -> (Vec<Vec<f64>>, Vec<u32>, Vec<f64>) {
    let rows = logits.len() / experts;
    let (mut all_keys, mut ids, mut wts) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rows {
        let z: Vec<f64> = logits[r * experts..(r + 1) * experts]
            .iter()
            .map(|v| v / temp)
            .collect();
        let s: Vec<f64> = if softmax {
            let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = z.iter().map(|v| (v - m).exp()).collect();
            let t: f64 = e.iter().sum();
            e.iter().map(|v| v / t).collect()
        } else {
            z.iter()
                .map(|&v| (if v > 20.0 { v } else { v.exp().ln_1p() }).sqrt())
                .collect()
        };
        let keys: Vec<f64> = s.iter().zip(bias).map(|(a, b)| a + b).collect();
        let mut order: Vec<usize> = (0..experts).collect();
        order.sort_by(|&a, &b| keys[b].partial_cmp(&keys[a]).unwrap().then(a.cmp(&b)));
        let sel = &order[..k];
        let sum: f64 = sel.iter().map(|&i| s[i]).sum();
        for &i in sel {
            ids.push(i as u32);
            wts.push(if renorm { s[i] / (sum + 1e-20) } else { s[i] } * scale);
        }
        all_keys.push(keys);
    }
    (all_keys, ids, wts)
}

pub fn hc_mix_ref(
    x: &[f64],
    out: &[f64],
    post: &[f64],
    comb: &[f64],
    rows: usize,
    ns: usize,
    d: usize,
) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0.0; rows * ns * d];
    let mut mag = vec![0.0; rows * ns * d];
    for r in 0..rows {
        for k in 0..ns {
            for c in 0..d {
                let mut a = post[r * ns + k] * out[r * d + c];
                let mut m = a.abs();
                for j in 0..ns {
                    let t = comb[(r * ns + j) * ns + k] * x[(r * ns + j) * d + c];
                    a += t;
                    m += t.abs();
                }
                y[(r * ns + k) * d + c] = a;
                mag[(r * ns + k) * d + c] = m;
            }
        }
    }
    (y, mag)
}

/// Attention with a sink over explicit key rows `keys` (`n × d`), K = V.
pub fn attention_ref(
    q: &[f64],
    keys: &[f64],
    sinks: &[f64],
    heads: usize,
    d: usize,
    scale: f64,
) -> Vec<f64> {
    let n = keys.len() / d;
    let mut o = vec![0.0; heads * d];
    for h in 0..heads {
        let qh = &q[h * d..(h + 1) * d];
        let s: Vec<f64> = (0..n)
            .map(|j| {
                qh.iter()
                    .zip(&keys[j * d..(j + 1) * d])
                    .map(|(a, b)| a * b)
                    .sum::<f64>()
                    * scale
            })
            .collect();
        let m = s.iter().cloned().fold(sinks[h], f64::max);
        let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
        let denom: f64 = e.iter().sum::<f64>() + (sinks[h] - m).exp();
        for j in 0..n {
            for c in 0..d {
                o[h * d + c] += e[j] / denom * keys[j * d + c];
            }
        }
    }
    o
}
