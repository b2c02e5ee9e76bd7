//! Manifold-constrained hyper-connection ops on slices (row-local; mixes computed in f64).

#[inline]
fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// pre `[S, N]`, post `[S, N]`, comb `[S, N, N]` from `mix[S, (2+N)N]`.
pub(crate) fn hc_mixes(
    mix: &[f32],
    s_len: usize,
    n: usize,
    scale: &[f32],
    base: &[f32],
    eps: f32,
    iters: usize,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let width = (2 + n) * n;
    let eps = eps as f64;
    let mut pre = vec![0.0f32; s_len * n];
    let mut post = vec![0.0f32; s_len * n];
    let mut comb = vec![0.0f32; s_len * n * n];
    let mut c = vec![0.0f64; n * n];
    for s in 0..s_len {
        let m = &mix[s * width..(s + 1) * width];
        for i in 0..n {
            pre[s * n + i] = (sigmoid(m[i] as f64 * scale[0] as f64 + base[i] as f64) + eps) as f32;
            post[s * n + i] =
                (2.0 * sigmoid(m[n + i] as f64 * scale[1] as f64 + base[n + i] as f64)) as f32;
        }
        for j in 0..n {
            let row = &mut c[j * n..(j + 1) * n];
            for (k, v) in row.iter_mut().enumerate() {
                *v = m[2 * n + j * n + k] as f64 * scale[2] as f64 + base[2 * n + j * n + k] as f64;
            }
            let mx = row.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
            let mut sum = 0.0;
            for v in row.iter_mut() {
                *v = (*v - mx).exp();
                sum += *v;
            }
            for v in row.iter_mut() {
                *v = *v / sum + eps;
            }
        }
        normalize_cols(&mut c, n, eps);
        for _ in 1..iters.max(1) {
            normalize_rows(&mut c, n, eps);
            normalize_cols(&mut c, n, eps);
        }
        for (o, v) in comb[s * n * n..(s + 1) * n * n].iter_mut().zip(&c) {
            *o = *v as f32;
        }
    }
    (pre, post, comb)
}

/// Divides each column (fixed destination k, sum over sources j) by its sum + eps.
fn normalize_cols(c: &mut [f64], n: usize, eps: f64) {
    for k in 0..n {
        let sum: f64 = (0..n).map(|j| c[j * n + k]).sum();
        for j in 0..n {
            c[j * n + k] /= sum + eps;
        }
    }
}

/// Divides each row (fixed source j) by its sum + eps.
fn normalize_rows(c: &mut [f64], n: usize, eps: f64) {
    for j in 0..n {
        let sum: f64 = c[j * n..(j + 1) * n].iter().sum();
        for v in &mut c[j * n..(j + 1) * n] {
            *v /= sum + eps;
        }
    }
}

/// `sigmoid(mix * scale0 + base) + eps`.
pub(crate) fn hc_pre_only(mix: &[f32], n: usize, scale0: f32, base: &[f32], eps: f32) -> Vec<f32> {
    mix.iter()
        .enumerate()
        .map(|(i, &m)| (sigmoid(m as f64 * scale0 as f64 + base[i % n] as f64) + eps as f64) as f32)
        .collect()
}

/// `Σ_n pre[s,n] X[s,n,:]`.
pub(crate) fn collapse(x: &[f32], s_len: usize, n: usize, d: usize, pre: &[f32]) -> Vec<f32> {
    let mut out = vec![0.0f32; s_len * d];
    for s in 0..s_len {
        let o = &mut out[s * d..(s + 1) * d];
        for j in 0..n {
            let p = pre[s * n + j];
            for (ov, xv) in o.iter_mut().zip(&x[(s * n + j) * d..(s * n + j + 1) * d]) {
                *ov += p * xv;
            }
        }
    }
    out
}

/// `Y[s,k] = post[s,k] out[s] + Σ_j comb[s,j,k] X[s,j]`.
pub(crate) fn expand(
    x: &[f32],
    s_len: usize,
    n: usize,
    d: usize,
    out: &[f32],
    post: &[f32],
    comb: &[f32],
) -> Vec<f32> {
    let mut y = vec![0.0f32; s_len * n * d];
    for s in 0..s_len {
        for k in 0..n {
            let yk = &mut y[(s * n + k) * d..(s * n + k + 1) * d];
            let p = post[s * n + k];
            for (yv, ov) in yk.iter_mut().zip(&out[s * d..(s + 1) * d]) {
                *yv = p * ov;
            }
            for j in 0..n {
                let cjk = comb[(s * n + j) * n + k];
                for (yv, xv) in yk.iter_mut().zip(&x[(s * n + j) * d..(s * n + j + 1) * d]) {
                    *yv += cjk * xv;
                }
            }
        }
    }
    y
}
