//! Routed experts on the CPU: each expert's rows gathered, its clamped-SwiGLU MLP run as three
//! GEMMs (one rayon task per expert), and the results combined per row in slot order.

use rayon::prelude::*;

use super::CpuBackend;
use super::gemm;
use super::impl_backend::{check_index, f32t, weight_ref};
use super::tensor::{CpuTensor, want_rank};
use crate::backend::ExpertWeights;
use crate::error::{Result, shape_err};

/// One expert's result: its id, the (row, slot) pairs it served, and their outputs.
type ExpertOut = (usize, Vec<(usize, usize)>, Vec<f32>);

pub(super) fn moe_experts(
    be: &CpuBackend,
    x: &CpuTensor,
    indices: &CpuTensor,
    weights: &CpuTensor,
    experts: &[ExpertWeights<'_, CpuTensor>],
    limit: f32,
) -> Result<CpuTensor> {
    const OP: &str = "moe_experts";
    want_rank(OP, x, 2)?;
    want_rank(OP, indices, 2)?;
    let (s, d) = (x.shape[0], x.shape[1]);
    let k = indices.shape[1];
    if indices.shape[0] != s || weights.shape != indices.shape {
        return Err(shape_err(
            OP,
            format!(
                "x {:?}, indices {:?}, weights {:?}",
                x.shape, indices.shape, weights.shape
            ),
        ));
    }
    let idx = indices.to_i64(OP)?;
    check_index(OP, &idx, experts.len())?;
    let wv = weights.to_f32(OP)?;
    let xv = x.to_f32(OP)?;
    // Rows per expert, in (row, slot) order.
    let mut per_expert: Vec<Vec<(usize, usize)>> = vec![Vec::new(); experts.len()];
    for r in 0..s {
        for j in 0..k {
            let e = idx[r * k + j];
            if e >= 0 {
                per_expert[e as usize].push((r, j));
            }
        }
    }
    let inv = be.config.batch_invariant;
    // One output row per (row, slot), filled by the expert that serves it.
    let results: Vec<ExpertOut> = be.run(|| {
        per_expert
            .into_par_iter()
            .enumerate()
            .filter(|(_, rows)| !rows.is_empty())
            .map(|(e, rows)| -> Result<_> {
                let ew = experts[e];
                let (g, gi, gk) = weight_ref(OP, ew.gate)?;
                let (u, ui, uk) = weight_ref(OP, ew.up)?;
                let (dn, dd, dk) = weight_ref(OP, ew.down)?;
                if gk != d || uk != d || ui != gi || dd != d || dk != gi {
                    return Err(shape_err(
                        OP,
                        format!(
                            "expert {e}: gate {:?}, up {:?}, down {:?} for hidden {d}",
                            ew.gate.shape, ew.up.shape, ew.down.shape
                        ),
                    ));
                }
                let m = rows.len();
                let xe: Vec<f32> = rows
                    .iter()
                    .flat_map(|&(r, _)| xv[r * d..(r + 1) * d].iter().copied())
                    .collect();
                let gv = gemm::linear(&xe, m, d, g, gi, inv);
                let uv = gemm::linear(&xe, m, d, u, gi, inv);
                let a = swiglu_vec(&gv, &uv, limit);
                let y = gemm::linear(&a, m, gi, dn, d, inv);
                Ok((e, rows, y))
            })
            .collect::<Result<Vec<_>>>()
    })?;
    let mut slots = vec![Vec::new(); s * k];
    for (_, rows, y) in results {
        for (i, (r, j)) in rows.into_iter().enumerate() {
            slots[r * k + j] = y[i * d..(i + 1) * d].to_vec();
        }
    }
    let mut out = vec![0.0f32; s * d];
    for r in 0..s {
        let o = &mut out[r * d..(r + 1) * d];
        for j in 0..k {
            let y = &slots[r * k + j];
            if y.is_empty() {
                continue;
            }
            let w = wv[r * k + j];
            for (ov, yv) in o.iter_mut().zip(y) {
                *ov += w * yv;
            }
        }
    }
    Ok(f32t(out, &[s, d]))
}

/// Clamped SwiGLU on slices.
pub(crate) fn swiglu_vec(g: &[f32], u: &[f32], limit: f32) -> Vec<f32> {
    g.iter()
        .zip(u)
        .map(|(&g, &u)| {
            let (g, u) = if limit > 0.0 {
                (g.min(limit), u.clamp(-limit, limit))
            } else {
                (g, u)
            };
            g / (1.0 + (-g).exp()) * u
        })
        .collect()
}
