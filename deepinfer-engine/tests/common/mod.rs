//! Shared helpers for the golden tests: fixture paths, a golden-file reader, model loading.
#![allow(dead_code)]

use deepinfer_engine::{BatchItem, Logits, Model};
use deepinfer_kernels::{Backend, CpuBackend, CpuConfig};
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::PathBuf;

/// `tests/data/<name>`.
pub fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// A golden tensor as f64 values (ints converted) with its shape.
#[derive(Debug, Clone)]
pub struct G {
    pub shape: Vec<usize>,
    pub v: Vec<f64>,
}

impl G {
    pub fn ids(&self) -> Vec<u32> {
        self.v.iter().map(|&x| x as u32).collect()
    }
    pub fn row(&self, r: usize) -> &[f64] {
        let c: usize = self.shape[1..].iter().product();
        &self.v[r * c..(r + 1) * c]
    }
}

pub fn golden(dir: &str) -> HashMap<String, G> {
    let bytes = std::fs::read(data(dir).join("golden.safetensors")).expect("golden file");
    let st = SafeTensors::deserialize(&bytes).expect("golden parses");
    let mut out = HashMap::new();
    for (name, t) in st.tensors() {
        let d = t.data();
        let v: Vec<f64> = match t.dtype() {
            Dtype::F32 => d
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
                .collect(),
            Dtype::I64 => d
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64)
                .collect(),
            Dtype::U8 => d.iter().map(|&x| x as f64).collect(),
            other => panic!("unexpected golden dtype {other:?}"),
        };
        out.insert(
            name,
            G {
                shape: t.shape().to_vec(),
                v,
            },
        );
    }
    out
}

pub fn backend() -> CpuBackend {
    CpuBackend::with_config(CpuConfig {
        batch_invariant: true,
        threads: Some(2),
    })
    .expect("cpu backend")
}

pub fn load(dir: &str) -> Model<CpuBackend> {
    Model::load(&data(dir), backend()).expect("model loads")
}

pub fn max_diff(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y).abs())
        .fold(0.0, f64::max)
}

/// Logits of every position for `ids` fed in chunks of `chunk`.
pub fn chunked<B: Backend>(m: &Model<B>, ids: &[u32], chunk: usize) -> Vec<f32> {
    let mut st = m.new_state();
    let mut out = Vec::new();
    for part in ids.chunks(chunk) {
        let mut items = [BatchItem {
            state: &mut st,
            tokens: part,
        }];
        out.extend(
            m.forward(&mut items, Logits::All, None)
                .expect("forward")
                .remove(0),
        );
    }
    out
}

pub fn argmax(v: &[f32]) -> usize {
    let mut b = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[b] {
            b = i;
        }
    }
    b
}

/// Prefill `ids`, then decode `steps` tokens greedily one forward at a time. Returns the
/// tokens produced and the logits each was chosen from (`steps` rows).
pub fn greedy_decode<B: Backend>(
    m: &Model<B>,
    ids: &[u32],
    steps: usize,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut st = m.new_state();
    let mut forward = |tokens: &[u32]| {
        let mut items = [BatchItem {
            state: &mut st,
            tokens,
        }];
        m.forward(&mut items, Logits::Last, None)
            .expect("forward")
            .remove(0)
    };
    let mut last = forward(ids);
    let (mut produced, mut logits) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        let tok = argmax(&last) as u32;
        produced.push(tok);
        let next = forward(&[tok]);
        logits.push(std::mem::replace(&mut last, next));
    }
    (produced, logits)
}

/// A deterministic pseudo-random prompt of `len` ids in `3..503` (below both fixtures'
/// vocabulary of 512), from `seed`.
pub fn prompt(seed: u64, len: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 500) as u32 + 3
        })
        .collect()
}

/// A checkpoint tensor as the test helpers write it: name, dtype, shape, little-endian bytes.
pub type RawTensor = (String, safetensors::Dtype, Vec<usize>, Vec<u8>);

/// Writes `ts` as one safetensors file.
pub fn write_safetensors(path: &std::path::Path, ts: &[RawTensor]) {
    use safetensors::tensor::TensorView;
    let views: Vec<(String, TensorView<'_>)> = ts
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// Copies fixture `dir` (its config, edited by `config`, and its upstream-named weights,
/// edited by `edit`) into a temp dir.
pub fn rewrite_fixture(
    dir: &str,
    config: impl Fn(&mut serde_json::Value),
    edit: impl Fn(&mut Vec<RawTensor>),
) -> tempfile::TempDir {
    let out = tempfile::tempdir().unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data(&format!("{dir}/config.json"))).unwrap())
            .unwrap();
    config(&mut cfg);
    std::fs::write(out.path().join("config.json"), cfg.to_string()).unwrap();
    let map = data(&format!("{dir}/engram_token_map.json"));
    if map.exists() {
        std::fs::copy(&map, out.path().join("engram_token_map.json")).unwrap();
    }
    let file = match dir {
        "v4-tiny-dev" => "model.upstream.safetensors",
        _ => "model.safetensors",
    };
    let bytes = std::fs::read(data(&format!("{dir}/{file}"))).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut ts: Vec<RawTensor> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| (n, t.dtype(), t.shape().to_vec(), t.data().to_vec()))
        .collect();
    edit(&mut ts);
    write_safetensors(&out.path().join("model.safetensors"), &ts);
    out
}
