//! MoE routing on slices: expert scores, biased top-k selection, renormalisation.

use crate::backend::{RouteParams, RouteScore};

use super::attention::topk_row;

/// `log(1 + exp(x))` without overflow.
#[inline]
pub(crate) fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

/// Expert scores of one row of logits.
pub(crate) fn scores(logits: &[f32], f: RouteScore) -> Vec<f64> {
    match f {
        RouteScore::SqrtSoftplus => logits.iter().map(|&x| softplus(x as f64).sqrt()).collect(),
        RouteScore::Sigmoid => logits
            .iter()
            .map(|&x| 1.0 / (1.0 + (-(x as f64)).exp()))
            .collect(),
        RouteScore::Softmax => {
            let mx = logits
                .iter()
                .fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let e: Vec<f64> = logits.iter().map(|&x| (x as f64 - mx).exp()).collect();
            let sum: f64 = e.iter().sum();
            e.into_iter().map(|v| v / sum).collect()
        }
    }
}

/// Weights of the picked experts: gathered scores, renormalised and scaled.
pub(crate) fn pick_weights(sc: &[f64], sel: &[i32], p: RouteParams, out: &mut [f32]) {
    let picked: Vec<f64> = sel
        .iter()
        .map(|&e| if e >= 0 { sc[e as usize] } else { 0.0 })
        .collect();
    let sum: f64 = picked.iter().sum();
    for (o, v) in out.iter_mut().zip(&picked) {
        let w = if p.renormalize { v / (sum + 1e-20) } else { *v };
        *o = (w * p.scale as f64) as f32;
    }
}

/// Biased top-k routing of `logits[S, E]`.
pub(crate) fn route(
    logits: &[f32],
    e: usize,
    bias: Option<&[f32]>,
    p: RouteParams,
) -> (Vec<i32>, Vec<f32>) {
    let rows = logits.len().checked_div(e).unwrap_or(0);
    let k = p.top_k;
    let mut idx = vec![-1i32; rows * k];
    let mut wts = vec![0.0f32; rows * k];
    for s in 0..rows {
        let sc = scores(&logits[s * e..(s + 1) * e], p.score);
        let biased: Vec<f32> = match bias {
            Some(b) => sc
                .iter()
                .zip(b)
                .map(|(v, b)| (v + *b as f64) as f32)
                .collect(),
            None => sc.iter().map(|&v| v as f32).collect(),
        };
        topk_row(&biased, k, &mut idx[s * k..(s + 1) * k]);
        pick_weights(
            &sc,
            &idx[s * k..(s + 1) * k],
            p,
            &mut wts[s * k..(s + 1) * k],
        );
    }
    (idx, wts)
}
