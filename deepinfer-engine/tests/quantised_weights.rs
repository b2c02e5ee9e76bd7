//! FP8 and FP4 checkpoints are kept as stored: a fixture quantised the way DeepSeek ships
//! V4.1 (FP8 e4m3 with [32, 32] UE8M0 block scales for the projections, MXFP4 for the routed
//! experts) loads into quantised backend tensors, reads about a quarter of the f32 bytes per
//! decode step, and gives the logits of the same values decoded to f32, bit for bit in
//! batch-invariant mode.

mod common;
use common::*;
use deepinfer_engine::Model;
use deepinfer_engine::model::{LoadOptions, MatmulWeights};
use deepinfer_kernels::{QuantFormat, QuantMatrix, ScaleFormat};
use safetensors::Dtype;

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Quantises every f32 matrix but the embedding table and norms.
fn quantise(ts: &mut Vec<RawTensor>) {
    let mut out = Vec::new();
    for (name, dtype, shape, bytes) in ts.drain(..) {
        let quantisable = dtype == Dtype::F32
            && shape.len() == 2
            && name.ends_with(".weight")
            && name != "embed.weight"
            && !name.contains("norm");
        if !quantisable {
            out.push((name, dtype, shape, bytes));
            continue;
        }
        let (rows, cols) = (shape[0], shape[1]);
        let base = name.strip_suffix(".weight").unwrap().to_string();
        let x = f32s(&bytes);
        if name.contains(".experts.") && cols % 32 == 0 {
            let q = QuantMatrix::quantize(&x, rows, cols, QuantFormat::Mxfp4).unwrap();
            out.push((name, Dtype::U8, vec![rows, cols / 2], q.data().to_vec()));
            let s = q.scale_bytes().unwrap().to_vec();
            out.push((
                format!("{base}.scale"),
                Dtype::F8_E8M0,
                vec![rows, cols / 32],
                s,
            ));
        } else {
            let fmt = QuantFormat::Fp8 {
                block_rows: 32,
                block_cols: 32,
                scale: ScaleFormat::Ue8m0,
            };
            let q = QuantMatrix::quantize(&x, rows, cols, fmt).unwrap();
            out.push((name, Dtype::F8_E4M3, shape.clone(), q.data().to_vec()));
            let s = q.scale_bytes().unwrap().to_vec();
            let sshape = vec![rows.div_ceil(32), cols.div_ceil(32)];
            out.push((format!("{base}.scale"), Dtype::F8_E8M0, sshape, s));
        }
    }
    *ts = out;
}

#[test]
fn quantised_weights_stay_quantised_and_match_their_f32_decoding() {
    for fixture in ["v4-tiny-dev", "v41-tiny-dev"] {
        let dir = rewrite_fixture(
            fixture,
            |c| {
                c["quantization_config"] =
                    serde_json::json!({"quant_method": "fp8", "weight_block_size": [32, 32]})
            },
            quantise,
        );
        let kept = Model::load(dir.path(), backend()).expect("quantised checkpoint loads");
        let wide = Model::load_with_options(
            dir.path(),
            backend(),
            LoadOptions {
                matmul_weights: MatmulWeights::F32,
            },
        )
        .unwrap();
        // The head alone: 1 byte per weight plus scales, against 4.
        let (k, w) = (kept.decode_bytes(), wide.decode_bytes());
        assert!(
            k.head * 3.5 < w.head,
            "{fixture}: head {} vs {}",
            k.head,
            w.head
        );
        assert!(
            k.total() * 2.0 < w.total(),
            "{fixture}: {} vs {}",
            k.total(),
            w.total()
        );
        let ids = prompt(7, 33);
        let (a, b) = (chunked(&kept, &ids, 33), chunked(&wide, &ids, 33));
        assert_eq!(a.len(), b.len());
        let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{fixture}: quantised and decoded logits differ");
        // Chunked and token by token too (the decode path's GEMV).
        let c = chunked(&kept, &ids, 1);
        let same = c.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{fixture}: token-by-token logits differ");
    }
}
