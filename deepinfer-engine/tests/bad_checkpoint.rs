//! Bad checkpoints give clear errors (never a crash): missing, unexpected, mis-shaped and
//! mis-typed tensors all reported at once; truncated files and lying headers rejected;
//! unknown model types refused. Also: quantised storage decodes to the right values.

mod common;
use common::*;
use deepinfer_engine::checkpoint::Checkpoint;
use deepinfer_engine::weights::{WeightLoader, WeightProblem};
use deepinfer_engine::{Model, ModelError};
use safetensors::{Dtype, SafeTensors};
use std::path::Path;

/// Copy v4-tiny-dev (upstream names) into a temp dir, editing the tensor list on the way.
fn rewrite(edit: impl Fn(&mut Vec<(String, Dtype, Vec<usize>, Vec<u8>)>)) -> tempfile::TempDir {
    rewrite_fixture("v4-tiny-dev", |_| {}, edit)
}

fn load_err(dir: &Path) -> ModelError {
    Model::load(dir, backend()).expect_err("must fail")
}

#[test]
fn upstream_file_loads_and_matches_hf_names() {
    let d = data("v4-tiny-dev");
    let up =
        Model::load_with_files(&d, &[d.join("model.upstream.safetensors")], backend()).unwrap();
    let g = golden("v4-tiny-dev");
    let ids = g["p1.input_ids"].ids();
    let got = chunked(&up, &ids, ids.len());
    let diff = max_diff(&got, &g["p1.logits"].v);
    assert!(diff < 1e-4, "upstream-named weights: {diff:.3e}");
}

#[test]
fn all_tensor_problems_reported_together() {
    let dir = rewrite(|ts| {
        ts.retain(|t| t.0 != "layers.1.attn.wq_a.weight" && t.0 != "norm.weight");
        let t = ts
            .iter_mut()
            .find(|t| t.0 == "layers.2.attn.wkv.weight")
            .unwrap();
        t.2 = vec![32, 128]; // same bytes, wrong shape
        let t = ts
            .iter_mut()
            .find(|t| t.0 == "layers.0.attn.attn_sink")
            .unwrap();
        t.1 = Dtype::I32; // same bytes, wrong type
        ts.push((
            "layers.0.attn.extra".into(),
            Dtype::F32,
            vec![1],
            vec![0; 4],
        ));
    });
    let msg = load_err(dir.path()).to_string();
    for needle in [
        "missing `layers.1.attn.wq_a.weight`",
        "missing `norm.weight`",
        "`layers.2.attn.wkv.weight` has shape [32, 128], expected [64, 64]",
        "`layers.0.attn.attn_sink` is stored as I32",
        "unexpected tensor `layers.0.attn.extra`",
    ] {
        assert!(msg.contains(needle), "`{needle}` not in: {msg}");
    }
}

#[test]
fn truncated_file_is_an_error() {
    let dir = rewrite(|_| {});
    let p = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() - 1000]).unwrap();
    let e = load_err(dir.path());
    assert!(matches!(e, ModelError::Checkpoint(_)), "{e}");
    assert!(
        e.to_string().contains("not a valid safetensors file"),
        "{e}"
    );
}

#[test]
fn lying_headers_are_errors() {
    let dir = rewrite(|_| {});
    let p = dir.path().join("model.safetensors");
    let orig = std::fs::read(&p).unwrap();
    // 1. header length pointing far past the end (would be a huge allocation if trusted)
    let mut b = orig.clone();
    b[..8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    std::fs::write(&p, &b).unwrap();
    assert!(matches!(load_err(dir.path()), ModelError::Checkpoint(_)));
    // 2. an offset that overlaps the next tensor: rewrite the JSON header in place
    let n = u64::from_le_bytes(orig[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(orig[8..8 + n].to_vec()).unwrap();
    let lied = header.replacen("\"data_offsets\":[0,", "\"data_offsets\":[4,", 1);
    assert_ne!(lied, header);
    let mut b = orig[..8].to_vec();
    b.extend_from_slice(lied.as_bytes());
    b.extend_from_slice(&orig[8 + n..]);
    std::fs::write(&p, &b).unwrap();
    let e = load_err(dir.path());
    assert!(
        e.to_string().contains("not a valid safetensors file"),
        "{e}"
    );
    // 3. not JSON at all
    let mut b = orig.clone();
    b[8] = b'!';
    std::fs::write(&p, &b).unwrap();
    assert!(matches!(load_err(dir.path()), ModelError::Checkpoint(_)));
}

#[test]
fn unknown_model_type_is_an_error() {
    let dir = rewrite(|_| {});
    let cfg = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        cfg.replace("\"deepseek_v4\"", "\"deepseek_v5\""),
    )
    .unwrap();
    let e = load_err(dir.path());
    assert_eq!(
        e.to_string(),
        "unknown model_type `deepseek_v5` (supported: deepseek_v41, deepseek_v4)"
    );
}

#[test]
fn sharded_checkpoint_loads_through_the_index() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        data("v4-tiny-dev/config.json"),
        dir.path().join("config.json"),
    )
    .unwrap();
    let bytes = std::fs::read(data("v4-tiny-dev/model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let all: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| (n, t.dtype(), t.shape().to_vec(), t.data().to_vec()))
        .collect();
    let (a, b): (Vec<_>, Vec<_>) = all
        .into_iter()
        .partition(|t| t.0.contains("layers.1") || t.0.contains("embed"));
    write_safetensors(&dir.path().join("model-00001-of-00002.safetensors"), &a);
    write_safetensors(&dir.path().join("model-00002-of-00002.safetensors"), &b);
    let mut map = serde_json::Map::new();
    for t in &a {
        map.insert(t.0.clone(), "model-00001-of-00002.safetensors".into());
    }
    for t in &b {
        map.insert(t.0.clone(), "model-00002-of-00002.safetensors".into());
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    let m = Model::load(dir.path(), backend()).unwrap();
    let g = golden("v4-tiny-dev");
    let ids = g["p0.input_ids"].ids();
    assert!(max_diff(&chunked(&m, &ids, 1), &g["p0.logits"].v) < 1e-4);
}

#[test]
fn quantised_storage_decodes() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("q.safetensors");
    // FP8 e4m3 [2, 4] with [1, 2] ue8m0 block scales (blocks of 2 rows x 2 cols):
    // codes 0x38 = 1.0, 0x40 = 2.0; scales 2^1, 2^-1.
    let fp8 = vec![0x38u8, 0x40, 0x38, 0x40, 0xb8, 0x38, 0x40, 0x40];
    let fp8_scale = vec![128u8, 126];
    // FP4 [1, 64] as 32 bytes: all pairs (1.0, -2.0) = codes 2 and 12; scales for 2 blocks of 32.
    let fp4 = vec![0xc2u8; 32];
    let fp4_scale = vec![127u8, 129];
    let bf16: Vec<u8> = [1.5f32, -0.25]
        .iter()
        .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
        .collect();
    write_safetensors(
        &p,
        &[
            ("a.weight".into(), Dtype::F8_E4M3, vec![2, 4], fp8),
            ("a.scale".into(), Dtype::F8_E8M0, vec![1, 2], fp8_scale),
            ("b.weight".into(), Dtype::U8, vec![1, 32], fp4),
            ("b.scale".into(), Dtype::F8_E8M0, vec![1, 2], fp4_scale),
            ("c.weight".into(), Dtype::BF16, vec![2], bf16),
        ],
    );
    let ck = Checkpoint::open_files(&[p]).unwrap();
    let mut ld = WeightLoader::new(&ck);
    let a = ld.f32("a.weight", &[2, 4]);
    assert_eq!(a.data(), &[2.0, 4.0, 0.5, 1.0, -2.0, 2.0, 1.0, 1.0]);
    let b = ld.f32("b.weight", &[1, 64]);
    assert_eq!(&b.data()[..2], &[1.0, -2.0]);
    assert_eq!(&b.data()[32..34], &[4.0, -8.0]);
    let c = ld.f32("c.weight", &[2]);
    assert_eq!(c.data(), &[1.5, -0.25]);
    ld.finish().unwrap();

    // an FP8 weight without its scale is a dtype problem, not a silent misread
    let p2 = dir.path().join("noscale.safetensors");
    write_safetensors(
        &p2,
        &[(
            "a.weight".into(),
            Dtype::F8_E4M3,
            vec![1, 2],
            vec![0x38, 0x38],
        )],
    );
    let ck = Checkpoint::open_files(&[p2]).unwrap();
    let mut ld = WeightLoader::new(&ck);
    ld.f32("a.weight", &[1, 2]);
    let probs = ld.finish().unwrap_err().0;
    assert!(
        matches!(&probs[0], WeightProblem::Dtype { name, .. } if name == "a.weight"),
        "{probs:?}"
    );
}

#[test]
fn f32_weights_are_zero_copy() {
    let ck = Checkpoint::open_files(&[data("v4-tiny-dev/model.upstream.safetensors")]).unwrap();
    let mut ld = WeightLoader::new(&ck);
    let t = ld.f32("embed.weight", &[512, 64]);
    assert!(t.is_zero_copy() || !cfg!(target_endian = "little"));
}

#[test]
fn hf_and_upstream_files_give_identical_logits() {
    let d = data("v4-tiny-dev");
    let hf = Model::load(&d, backend()).unwrap();
    let up =
        Model::load_with_files(&d, &[d.join("model.upstream.safetensors")], backend()).unwrap();
    let ids = golden("v4-tiny-dev")["p2.input_ids"].ids();
    assert!(chunked(&hf, &ids, 7) == chunked(&up, &ids, 7));
}

#[test]
fn bf16_checkpoint_equals_f32_of_the_rounded_values() {
    // The same weights stored as bf16 (what real checkpoints hold for most tensors) must give
    // exactly the logits of an f32 checkpoint holding the bf16-rounded values.
    fn rounded(c: &[u8]) -> half::bf16 {
        half::bf16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
    }
    let bf = rewrite(|ts| {
        for t in ts.iter_mut().filter(|t| t.1 == Dtype::F32) {
            t.3 =
                t.3.chunks_exact(4)
                    .flat_map(|c| rounded(c).to_le_bytes())
                    .collect();
            t.1 = Dtype::BF16;
        }
    });
    let f32r = rewrite(|ts| {
        for t in ts.iter_mut().filter(|t| t.1 == Dtype::F32) {
            t.3 =
                t.3.chunks_exact(4)
                    .flat_map(|c| rounded(c).to_f32().to_le_bytes())
                    .collect();
        }
    });
    let a = Model::load(bf.path(), backend()).unwrap();
    let b = Model::load(f32r.path(), backend()).unwrap();
    let g = golden("v4-tiny-dev");
    let ids = g["p2.input_ids"].ids();
    let la = chunked(&a, &ids, ids.len());
    assert!(la == chunked(&b, &ids, ids.len()));
    // Distance to the f32 golden is printed, not asserted: measured 5.6e-2 (p0), 9.3e-2 (p1),
    // 2.5 (p2); longer prompts have more discrete router / indexer choices that rounding can
    // move (not investigated further).
    eprintln!(
        "bf16-stored weights: max |logit diff| vs f32 golden {:.3e}",
        max_diff(&la, &g["p2.logits"].v)
    );
    for p in ["p0", "p1"] {
        let ids = g[&format!("{p}.input_ids")].ids();
        let d = max_diff(&chunked(&a, &ids, ids.len()), &g[&format!("{p}.logits")].v);
        eprintln!("bf16-stored weights, {p}: {d:.3e}");
    }
}

#[test]
fn parts_the_engine_does_not_run_are_skipped_and_listed() {
    let extra = [
        "vision_tower.blocks.0.attn.qkv.weight",
        "aligner.proj.weight",
        "image_newline",
        "layers.2.ffn.gate.bias_vl",
        "mtp.0.emb.weight",
        "mtp.0.emb.weight.scale",
    ];
    let dir = rewrite(|ts| {
        for n in extra {
            ts.push((n.into(), Dtype::F32, vec![2], vec![0; 8]));
        }
    });
    let m = Model::load(dir.path(), backend()).expect("the published extra parts are skipped");
    let mut want: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(m.skipped_tensors(), want.as_slice());
    let s = m.skipped_summary().unwrap();
    assert!(s.starts_with("skipped 6 checkpoint tensor(s)"), "{s}");
    assert!(
        s.contains("multi-token prediction: 2") && s.contains("vision tower: 1"),
        "{s}"
    );
    // The weights still give the oracle's logits.
    let g = golden("v4-tiny-dev");
    let ids = g["p1.input_ids"].ids();
    assert!(max_diff(&chunked(&m, &ids, ids.len()), &g["p1.logits"].v) < 1e-4);
    // Anything else unused is still an error, with the skipped parts not mentioned.
    let dir = rewrite(|ts| {
        ts.push((
            "aligner.proj.weight".into(),
            Dtype::F32,
            vec![2],
            vec![0; 8],
        ));
        ts.push((
            "layers.0.attn.extra".into(),
            Dtype::F32,
            vec![1],
            vec![0; 4],
        ));
    });
    let msg = load_err(dir.path()).to_string();
    assert!(
        msg.contains("unexpected tensor `layers.0.attn.extra`"),
        "{msg}"
    );
    assert!(!msg.contains("aligner"), "{msg}");
}

#[test]
fn fp8_blocks_come_from_weight_block_size_when_the_config_gives_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("q.safetensors");
    // [48, 4] of 1.0 with a [2, 1] scale (2^1, 2^-1): blocks of 32 rows, the last one short.
    write_safetensors(
        &p,
        &[
            (
                "a.weight".into(),
                Dtype::F8_E4M3,
                vec![48, 4],
                vec![0x38; 192],
            ),
            ("a.scale".into(), Dtype::F8_E8M0, vec![2, 1], vec![128, 126]),
            (
                "b.weight".into(),
                Dtype::F8_E4M3,
                vec![48, 4],
                vec![0x38; 192],
            ),
            ("b.scale".into(), Dtype::F8_E8M0, vec![3, 1], vec![127; 3]),
        ],
    );
    let ck = Checkpoint::open_files(&[p]).unwrap();
    let rows = |t: &deepinfer_engine::weights::Tensor| {
        (0..48).map(|r| t.data()[r * 4]).collect::<Vec<f32>>()
    };
    let mut ld = WeightLoader::new(&ck).with_fp8_block(Some([32, 32]));
    let a = ld.f32("a.weight", &[48, 4]);
    let mut want = vec![2.0; 32];
    want.extend([0.5; 16]);
    assert_eq!(rows(&a), want);
    // A scale that does not fit the configured blocks is a problem, not a misread.
    ld.f32("b.weight", &[48, 4]);
    let probs = ld.finish().unwrap_err().0;
    assert!(
        matches!(&probs[..], [WeightProblem::Dtype { name, expected, .. }]
            if name == "b.weight" && expected.contains("weight_block_size [32, 32]")),
        "{probs:?}"
    );
    // Without the config the blocks are inferred from the scale's shape: 24 rows each,
    // which is what a checkpoint with [32, 32] blocks must not be read as.
    let mut ld = WeightLoader::new(&ck);
    let a = ld.f32("a.weight", &[48, 4]);
    assert_eq!(&rows(&a)[24..32], &[0.5; 8]);
}
