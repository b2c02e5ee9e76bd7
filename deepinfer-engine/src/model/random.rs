//! Random-weight checkpoints for any config: the tensor list comes from the loader itself
//! (an empty checkpoint makes it report every tensor it needs, with its shape), so a random
//! checkpoint always loads. Used to benchmark peer-sized models without downloading weights.

use super::{ModelError, config_path};
use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::model::weights::{LoadWeightsError, ModelW};
use crate::weights::WeightProblem;
use deepinfer_kernels::CpuBackend;
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use std::path::Path;

/// Storage dtype of the floating-point tensors of a random checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RandomDtype {
    /// 32-bit floats.
    F32,
    /// bfloat16 (what Hugging Face checkpoints usually store).
    Bf16,
}

/// Every tensor a config needs, as `(canonical name, shape)`, in load order.
pub fn required_tensors(cfg: &ModelConfig) -> Result<Vec<(String, Vec<usize>)>, ModelError> {
    let ck = Checkpoint::empty();
    match ModelW::load(cfg, &ck, &CpuBackend::new()) {
        Ok(_) => Ok(Vec::new()),
        Err(LoadWeightsError::Tensors(p)) => Ok(p
            .0
            .into_iter()
            .filter_map(|p| match p {
                WeightProblem::Missing { name, expected } => Some((name, expected)),
                _ => None,
            })
            .collect()),
        Err(e) => Err(e.into()),
    }
}

use crate::splitmix::SplitMix64 as Rng;

/// Values for one float tensor: norms are ones, sinks zeros, everything else uniform with
/// standard deviation 0.02 (transformers' `initializer_range`).
fn float_values(name: &str, n: usize, rng: &mut Rng) -> Vec<f32> {
    let leaf = name.rsplit('.').nth(1).unwrap_or(name);
    if leaf.ends_with("norm") || name.ends_with("norm.weight") {
        return vec![1.0; n];
    }
    if name.ends_with("sink") || name.ends_with("sinks") {
        return vec![0.0; n];
    }
    let a = 0.02 * 3f32.sqrt();
    (0..n).map(|_| rng.sym() * a).collect()
}

/// Write a random-weight checkpoint for the config file `config` into `out_dir`
/// (`config.json`, `model.safetensors` under canonical names, and a random
/// `engram_token_map.json` when the config has Engram layers).
pub fn write_random_checkpoint(
    config: &Path,
    out_dir: &Path,
    seed: u64,
    dtype: RandomDtype,
) -> Result<(), ModelError> {
    let text = std::fs::read_to_string(config)
        .map_err(|e| ModelError::Input(format!("cannot read {}: {e}", config.display())))?;
    let cfg = ModelConfig::from_json_str(&text)?;
    let io = |e: std::io::Error| ModelError::Input(format!("{}: {e}", out_dir.display()));
    std::fs::create_dir_all(out_dir).map_err(io)?;
    std::fs::write(out_dir.join("config.json"), &text).map_err(io)?;
    let mut rng = Rng(seed);
    let mut blobs: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, shape) in required_tensors(&cfg)? {
        let n: usize = shape.iter().product();
        if name.ends_with("tid2eid") {
            // Hash routing table: k distinct experts per token.
            let (rows, k) = (shape[0], shape.get(1).copied().unwrap_or(1));
            let e = cfg.n_routed_experts.max(k) as u64;
            let mut v = Vec::with_capacity(n);
            for _ in 0..rows {
                let mut picked: Vec<i64> = Vec::with_capacity(k);
                while picked.len() < k {
                    let x = (rng.next_u64() % e) as i64;
                    if !picked.contains(&x) {
                        picked.push(x);
                    }
                }
                v.extend(picked);
            }
            let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            blobs.push((name, Dtype::I64, shape, bytes));
            continue;
        }
        let vals = float_values(&name, n, &mut rng);
        let (dt, bytes) = match dtype {
            RandomDtype::F32 => (
                Dtype::F32,
                vals.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ),
            RandomDtype::Bf16 => (
                Dtype::BF16,
                vals.iter()
                    .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                    .collect(),
            ),
        };
        blobs.push((name, dt, shape, bytes));
    }
    let views = blobs
        .iter()
        .map(|(name, dt, shape, bytes)| {
            TensorView::new(*dt, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| ModelError::Input(format!("tensor {name}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::serialize_to_file(views, None, &out_dir.join("model.safetensors"))
        .map_err(|e| ModelError::Input(format!("writing model.safetensors: {e}")))?;
    if let Some(ec) = &cfg.engram {
        let map: Vec<u64> = (0..cfg.vocab_size)
            .map(|_| rng.next_u64() % ec.compressed_vocab_size)
            .collect();
        let json = serde_json::json!({ "token_map": map });
        std::fs::write(out_dir.join("engram_token_map.json"), json.to_string()).map_err(io)?;
    }
    debug_assert!(config_path(out_dir).exists());
    Ok(())
}
