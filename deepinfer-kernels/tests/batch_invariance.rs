//! Batch-invariant mode: a row's output is bit-identical alone and inside batches of 1–64 rows
//! with any split, on any thread count.

mod common;

use common::Rng;
use deepinfer_kernels::{
    Backend, CpuBackend, CpuConfig, CpuTensor, ExpertWeights, QuantFormat, QuantMatrix,
};
use proptest::prelude::*;

const K: usize = 80;
const N: usize = 24;

struct Fixture {
    w_f32: Vec<f32>,
    w_bf16: Vec<half::bf16>,
    w_q: QuantMatrix,
    experts: Vec<[Vec<f32>; 3]>,
}

fn fixture() -> Fixture {
    let mut rng = Rng::new(42);
    let w_f32 = rng.vec(N * K, 1.0);
    let w_bf16 = w_f32.iter().map(|&v| half::bf16::from_f32(v)).collect();
    let w_q = QuantMatrix::quantize(&w_f32, N, K, QuantFormat::Nvfp4).unwrap();
    let experts = (0..4)
        .map(|_| {
            [
                rng.vec(16 * K, 0.5),
                rng.vec(16 * K, 0.5),
                rng.vec(K * 16, 0.5),
            ]
        })
        .collect();
    Fixture {
        w_f32,
        w_bf16,
        w_q,
        experts,
    }
}

/// Everything row-local one layer of the model does to a batch, downloaded per row.
fn run(b: &CpuBackend, f: &Fixture, rows: &[f32]) -> Vec<f32> {
    let m = rows.len() / K;
    let x = b.upload_f32(rows, &[m, K]).unwrap();
    let h = b.rms_norm(&x, None, 1e-6).unwrap();
    let y1 = b
        .matmul(&h, &b.upload_f32(&f.w_f32, &[N, K]).unwrap())
        .unwrap();
    let y2 = b
        .matmul(&h, &b.upload_bf16(&f.w_bf16, &[N, K]).unwrap())
        .unwrap();
    let y3 = b.matmul(&h, &b.upload_quant(&f.w_q).unwrap()).unwrap();
    let logits = b.narrow(&y1, 1, 0, 4).unwrap();
    let p = deepinfer_kernels::RouteParams {
        score: deepinfer_kernels::RouteScore::SqrtSoftplus,
        top_k: 2,
        renormalize: true,
        scale: 1.0,
    };
    let (idx, wts) = b.moe_route(&logits, None, p).unwrap();
    let mats: Vec<[CpuTensor; 3]> = f
        .experts
        .iter()
        .map(|[g, u, d]| {
            [
                b.upload_f32(g, &[16, K]).unwrap(),
                b.upload_f32(u, &[16, K]).unwrap(),
                b.upload_f32(d, &[K, 16]).unwrap(),
            ]
        })
        .collect();
    let ew: Vec<ExpertWeights<'_, CpuTensor>> = mats
        .iter()
        .map(|[g, u, d]| ExpertWeights {
            gate: g,
            up: u,
            down: d,
        })
        .collect();
    let moe = b.moe_experts(&h, &idx, &wts, &ew, 10.0).unwrap();
    let mut out = Vec::new();
    let parts = [y1, y2, y3, moe];
    let vs: Vec<Vec<f32>> = parts.iter().map(|t| b.download_f32(t).unwrap()).collect();
    for r in 0..m {
        out.extend_from_slice(&vs[0][r * N..(r + 1) * N]);
        out.extend_from_slice(&vs[1][r * N..(r + 1) * N]);
        out.extend_from_slice(&vs[2][r * N..(r + 1) * N]);
        out.extend_from_slice(&vs[3][r * K..(r + 1) * K]);
    }
    out
}

const PER_ROW: usize = 3 * N + K;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn row_bits_do_not_depend_on_batch(seed in 0u64..1_000_000, total in 1usize..=64, cuts in proptest::collection::vec(1usize..64, 0..4), threads in 1usize..4) {
        let f = fixture();
        let mut rng = Rng::new(seed);
        let rows = rng.vec(total * K, 2.0);
        let b = CpuBackend::with_config(CpuConfig { batch_invariant: true, threads: Some(threads) }).unwrap();
        // Each row alone, on a single-threaded backend.
        let single = CpuBackend::with_config(CpuConfig { batch_invariant: true, threads: Some(1) }).unwrap();
        let alone: Vec<f32> = (0..total).flat_map(|r| run(&single, &f, &rows[r * K..(r + 1) * K])).collect();
        // The whole batch, split at arbitrary points (prefill chunking).
        let mut bounds: Vec<usize> = cuts.iter().map(|c| c % total).filter(|&c| c > 0).collect();
        bounds.push(0);
        bounds.push(total);
        bounds.sort_unstable();
        bounds.dedup();
        let mut batched = Vec::new();
        for w in bounds.windows(2) {
            batched.extend(run(&b, &f, &rows[w[0] * K..w[1] * K]));
        }
        prop_assert_eq!(alone.len(), total * PER_ROW);
        for (i, (a, c)) in alone.iter().zip(&batched).enumerate() {
            prop_assert_eq!(a.to_bits(), c.to_bits(), "row {} element {}", i / PER_ROW, i % PER_ROW);
        }
    }
}
