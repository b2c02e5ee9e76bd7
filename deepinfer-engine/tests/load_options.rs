//! Random-weight checkpoints (the tensor list the loader asks for), bf16 matmul weights,
//! and the `forward-bench` / `random-checkpoint` commands.
#![cfg(feature = "cli")]

mod common;

use clap::Parser;
use common::{backend, chunked, data, golden, max_diff};
use deepinfer_engine::checkpoint::Checkpoint;
use deepinfer_engine::cli::{Cli, run};
use deepinfer_engine::model::{
    LoadOptions, MatmulWeights, RandomDtype, required_tensors, write_random_checkpoint,
};
use deepinfer_engine::{BatchItem, Logits, Model, ModelConfig};
use deepinfer_kernels::{CpuBackend, CpuConfig};

#[test]
fn required_tensors_are_exactly_the_fixture_tensors() {
    for (dir, file) in [
        ("v4-tiny-dev", "model.upstream.safetensors"),
        ("v41-tiny-dev", "model.safetensors"),
    ] {
        let cfg = ModelConfig::from_file(&data(dir).join("config.json")).unwrap();
        let mut want: Vec<(String, Vec<usize>)> = required_tensors(&cfg).unwrap();
        want.sort();
        let ck = Checkpoint::open_files(&[data(dir).join(file)]).unwrap();
        let mut have: Vec<(String, Vec<usize>)> = ck
            .names()
            .map(|n| (n.to_string(), ck.get(n).unwrap().shape.clone()))
            .collect();
        have.sort();
        // Packed FP4 or fused tensors would differ in shape; the fixtures hold neither.
        assert_eq!(want, have, "{dir}");
    }
}

#[test]
fn random_checkpoints_load_and_run() {
    for dir in ["v4-tiny-dev", "v41-tiny-dev"] {
        for dt in [RandomDtype::F32, RandomDtype::Bf16] {
            let out = tempfile::tempdir().unwrap();
            write_random_checkpoint(&data(dir).join("config.json"), out.path(), 7, dt).unwrap();
            let m = Model::load(out.path(), backend()).unwrap();
            let mut st = m.new_state();
            let ids = [1u32, 5, 9, 2, 300];
            let l = m
                .forward(
                    &mut [BatchItem {
                        state: &mut st,
                        tokens: &ids,
                    }],
                    Logits::All,
                    None,
                )
                .unwrap();
            assert_eq!(l[0].len(), ids.len() * m.cfg.vocab_size);
            assert!(l[0].iter().all(|x| x.is_finite()), "{dir} {dt:?}");
            // Same seed, same values: a second write is byte-identical.
            let again = tempfile::tempdir().unwrap();
            write_random_checkpoint(&data(dir).join("config.json"), again.path(), 7, dt).unwrap();
            let a = std::fs::read(out.path().join("model.safetensors")).unwrap();
            let b = std::fs::read(again.path().join("model.safetensors")).unwrap();
            assert!(a == b, "{dir} {dt:?}: not reproducible");
        }
    }
}

#[test]
fn bf16_stored_matrices_match_f32_copies_in_fast_mode() {
    // A bf16 random checkpoint against the same values widened to f32: the matmul matrices
    // stay bf16 on the backend, and even in fast mode (blocked GEMM for long chunks) the
    // logits are bit-identical.
    let cfg = data("v4-tiny-dev").join("config.json");
    let bf = tempfile::tempdir().unwrap();
    write_random_checkpoint(&cfg, bf.path(), 3, RandomDtype::Bf16).unwrap();
    let widened = tempfile::tempdir().unwrap();
    std::fs::copy(&cfg, widened.path().join("config.json")).unwrap();
    {
        let bytes = std::fs::read(bf.path().join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut blobs = Vec::new();
        for (name, t) in st.tensors() {
            let (dt, b) = match t.dtype() {
                safetensors::Dtype::BF16 => (
                    safetensors::Dtype::F32,
                    t.data()
                        .chunks_exact(2)
                        .flat_map(|c| {
                            half::bf16::from_le_bytes([c[0], c[1]])
                                .to_f32()
                                .to_le_bytes()
                        })
                        .collect::<Vec<u8>>(),
                ),
                other => (other, t.data().to_vec()),
            };
            blobs.push((name, dt, t.shape().to_vec(), b));
        }
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = blobs
            .iter()
            .map(|(n, dt, s, b)| {
                (
                    n.clone(),
                    safetensors::tensor::TensorView::new(*dt, s.clone(), b).unwrap(),
                )
            })
            .collect();
        safetensors::serialize_to_file(views, None, &widened.path().join("model.safetensors"))
            .unwrap();
    }
    let fast = || {
        CpuBackend::with_config(CpuConfig {
            batch_invariant: false,
            threads: Some(2),
        })
        .unwrap()
    };
    let a = Model::load(bf.path(), fast()).unwrap();
    let b = Model::load(widened.path(), fast()).unwrap();
    let ids: Vec<u32> = (0..40).map(|i| (i * 37 % 500) as u32).collect();
    assert!(chunked(&a, &ids, 40) == chunked(&b, &ids, 40));
    assert!(chunked(&a, &ids, 3) == chunked(&b, &ids, 3));
    // The option rounds an f32 checkpoint's matrices the same way.
    let c = Model::load_with_options(
        widened.path(),
        fast(),
        LoadOptions {
            matmul_weights: MatmulWeights::Bf16,
        },
    )
    .unwrap();
    assert!(chunked(&a, &ids, 40) == chunked(&c, &ids, 40));
}

#[test]
fn bf16_matmul_option_stays_close_on_the_fixture() {
    // An approximation on f32 checkpoints: measured, and bounded loosely (rounding can flip a
    // discrete router / indexer choice on longer prompts, see bad_checkpoint.rs).
    let g = golden("v4-tiny-dev");
    let m = Model::load_with_options(
        &data("v4-tiny-dev"),
        backend(),
        LoadOptions {
            matmul_weights: MatmulWeights::Bf16,
        },
    )
    .unwrap();
    for p in ["p0", "p1"] {
        let ids = g[&format!("{p}.input_ids")].ids();
        let d = max_diff(&chunked(&m, &ids, ids.len()), &g[&format!("{p}.logits")].v);
        eprintln!("bf16 matmul weights, {p}: max |logit diff| {d:.3e}");
        assert!(d > 0.0 && d < 0.2, "{p}: {d}");
    }
}

#[test]
fn forward_bench_and_random_checkpoint_commands_run() {
    let out = tempfile::tempdir().unwrap();
    let cfg = data("v4-tiny-dev").join("config.json");
    let dir = out.path().join("m");
    let cli = Cli::parse_from([
        "deepinfer",
        "random-checkpoint",
        "--config",
        cfg.to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
        "--bf16",
    ]);
    run(cli).unwrap();
    for extra in [&[][..], &["--bf16-weights", "--json"][..]] {
        let mut args = vec![
            "deepinfer",
            "forward-bench",
            "--model",
            dir.to_str().unwrap(),
            "--prompt-len",
            "20",
            "--decode-tokens",
            "3",
            "--repeat",
            "1",
        ];
        args.extend_from_slice(extra);
        run(Cli::parse_from(args)).unwrap();
    }
    let bad = Cli::parse_from([
        "deepinfer",
        "forward-bench",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-len",
        "0",
    ]);
    assert!(run(bad).is_err());
}
