//! The embedded default model: a tiny `deepseek_v41` checkpoint created deterministically
//! from [`DEFAULT_SEED`] and the config in `default_config.json` (the `v41-tiny-dev`
//! architecture — 8 layers, hidden size 64, 8 experts, Engram, KV sharing, three DSpark
//! stages — at the real DeepSeek vocabulary of 129,280 tokens, so the vendored tokenizer of
//! `deepinfer-recipe` works with it).
//!
//! **Its weights are random**: it exercises every code path of the engine, its text is not
//! meaningful. The list of tensors comes from the model loader itself (it is asked which
//! tensors an empty checkpoint lacks), so the generator can never drift from the graph.
//!
//! Values: tensor `name` draws from SplitMix64 seeded with `seed ^ fnv1a64(name)` (Box–Muller
//! normals), so each tensor is independent of the others and of their order:
//! norm weights `1 + 0.1·N`, embedding tables `N(0, 1)`, output heads `0.25·N`, attention
//! sinks and hyper-connection biases `0.5·N`, hyper-connection scales `1 + 0.2·N`, router
//! biases `0.2·N`, Engram query/key weights `1 + 0.3·N`, the confidence head `0.05·N`, every
//! other matrix `N / sqrt(fan_in)`. The Engram token map sends token `t` to
//! `splitmix(seed ^ t) mod compressed_vocab_size`.

use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::model::{LoadWeightsError, Model, ModelError};
use crate::splitmix::SplitMix64;
use crate::weights::WeightProblem;
use deepinfer_kernels::Backend;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The documented seed of the embedded default's weights.
pub const DEFAULT_SEED: u64 = 0x0041_2026;

/// The embedded default's config (HF `deepseek_v41` spelling).
pub const DEFAULT_CONFIG_JSON: &str = include_str!("default_config.json");

/// Bumped whenever the generator changes, so stale cached copies are rebuilt.
const GENERATOR_VERSION: u32 = 1;
const MARKER: &str = "deepinfer-default.json";

/// Creating the default checkpoint failed.
#[derive(Debug, thiserror::Error)]
pub enum DefaultModelError {
    /// Writing the files failed.
    #[error("cannot write the default model to {path}: {reason}")]
    Io {
        /// The file or directory.
        path: String,
        /// The OS error.
        reason: String,
    },
    /// The loader refused the generated checkpoint (a bug) or the config.
    #[error(transparent)]
    Model(#[from] ModelError),
}

fn io_err(path: &Path, e: std::io::Error) -> DefaultModelError {
    DefaultModelError::Io {
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

/// Where the default checkpoint is cached: `$DEEPINFER_CACHE`, else `$XDG_CACHE_HOME/deepinfer`,
/// else `$HOME/.cache/deepinfer`, else the system temp dir; one sub-directory per seed.
pub fn default_model_dir(seed: u64) -> PathBuf {
    let base = std::env::var_os("DEEPINFER_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|p| PathBuf::from(p).join("deepinfer")))
        .or_else(|| {
            std::env::var_os("HOME").map(|p| PathBuf::from(p).join(".cache").join("deepinfer"))
        })
        .unwrap_or_else(|| std::env::temp_dir().join("deepinfer"));
    base.join(format!("default-v41-tiny-{seed:x}-g{GENERATOR_VERSION}"))
}

/// The marker written last: its presence means the directory is complete.
fn marker_text(seed: u64) -> String {
    serde_json::json!({
        "generator_version": GENERATOR_VERSION,
        "seed": seed,
        "config_fnv1a64": fnv1a64(DEFAULT_CONFIG_JSON.as_bytes()),
        "note": "random weights: deepinfer's embedded default, text is not meaningful",
    })
    .to_string()
}

/// Make sure `dir` holds the default checkpoint for `seed` (creating it if needed) and return
/// `dir`. The directory is an ordinary model directory (`config.json`, `model.safetensors`,
/// `engram_token_map.json`), so `--model DIR` works on it too.
pub fn materialize_default(dir: &Path, seed: u64) -> Result<PathBuf, DefaultModelError> {
    let marker = dir.join(MARKER);
    if std::fs::read_to_string(&marker).ok().as_deref() == Some(marker_text(seed).as_str()) {
        return Ok(dir.to_path_buf());
    }
    std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    let cfg = ModelConfig::from_json_str(DEFAULT_CONFIG_JSON).map_err(ModelError::from)?;
    let write = |name: &str, bytes: &[u8]| -> Result<(), DefaultModelError> {
        let p = dir.join(name);
        std::fs::write(&p, bytes).map_err(|e| io_err(&p, e))
    };
    write("config.json", DEFAULT_CONFIG_JSON.as_bytes())?;
    let token_map = engram_token_map(&cfg, seed);
    if let Some(tm) = &token_map {
        let text = serde_json::json!({ "note": "random token map of deepinfer's default model", "token_map": tm });
        write("engram_token_map.json", text.to_string().as_bytes())?;
    }
    let specs = required_tensors(&cfg, dir, token_map.clone())?;
    let tmp = dir.join(format!("model.safetensors.partial-{}", unique()));
    write_safetensors(&tmp, &specs, seed)?;
    let fin = dir.join("model.safetensors");
    std::fs::rename(&tmp, &fin).map_err(|e| io_err(&fin, e))?;
    write(MARKER, marker_text(seed).as_bytes())?;
    Ok(dir.to_path_buf())
}

/// Create (or reuse the cached copy of) the default checkpoint and load it on `be`.
pub fn load_default<B: Backend>(be: B) -> Result<Model<B>, DefaultModelError> {
    let dir = materialize_default(&default_model_dir(DEFAULT_SEED), DEFAULT_SEED)?;
    Ok(Model::load(&dir, be)?)
}

/// `(name, shape)` of every tensor the graph needs, asked from the loader with an empty
/// checkpoint.
fn required_tensors(
    cfg: &ModelConfig,
    dir: &Path,
    token_map: Option<Vec<i64>>,
) -> Result<Vec<(String, Vec<usize>)>, DefaultModelError> {
    let empty = dir.join(format!("empty-{}.safetensors", unique()));
    write_safetensors(&empty, &[], 0)?;
    let ck = Checkpoint::open_files(std::slice::from_ref(&empty)).map_err(ModelError::from)?;
    let res = Model::from_parts(
        cfg.clone(),
        &ck,
        token_map,
        deepinfer_kernels::CpuBackend::new(),
    );
    let _ = std::fs::remove_file(&empty);
    match res {
        Err(ModelError::Weights(LoadWeightsError::Tensors(problems))) => {
            let mut out = Vec::new();
            for p in problems.0 {
                match p {
                    WeightProblem::Missing { name, expected } => out.push((name, expected)),
                    other => {
                        return Err(DefaultModelError::Model(ModelError::Input(format!(
                            "unexpected loader answer for an empty checkpoint: {other}"
                        ))));
                    }
                }
            }
            out.sort();
            Ok(out)
        }
        Err(e) => Err(e.into()),
        Ok(_) => Err(DefaultModelError::Model(ModelError::Input(
            "the loader accepted an empty checkpoint".into(),
        ))),
    }
}

/// A suffix that keeps concurrent creators (tests, two processes) off each other's files.
fn unique() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{}-{nanos}", std::process::id())
}

fn engram_token_map(cfg: &ModelConfig, seed: u64) -> Option<Vec<i64>> {
    let ec = cfg.engram.as_ref()?;
    let n = ec.compressed_vocab_size.max(1);
    Some(
        (0..cfg.vocab_size as u64)
            .map(|t| {
                (SplitMix64(seed ^ t.wrapping_mul(0x9E37_79B9_7F4A_7C15)).next_u64() % n) as i64
            })
            .collect(),
    )
}

/// Write an f32 safetensors file, generating each tensor as it is written.
fn write_safetensors(
    path: &Path,
    specs: &[(String, Vec<usize>)],
    seed: u64,
) -> Result<(), DefaultModelError> {
    let mut header = serde_json::Map::new();
    let mut off = 0usize;
    for (name, shape) in specs {
        let bytes = 4 * shape.iter().product::<usize>();
        header.insert(
            name.clone(),
            serde_json::json!({ "dtype": "F32", "shape": shape, "data_offsets": [off, off + bytes] }),
        );
        off += bytes;
    }
    let mut h = serde_json::Value::Object(header).to_string().into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let f = std::fs::File::create(path).map_err(|e| io_err(path, e))?;
    let mut w = std::io::BufWriter::new(f);
    let mut put = |b: &[u8]| w.write_all(b).map_err(|e| io_err(path, e));
    put(&(h.len() as u64).to_le_bytes())?;
    put(&h)?;
    for (name, shape) in specs {
        let vals = generate(name, shape, seed);
        put(bytemuck::cast_slice(&vals))?;
    }
    w.flush().map_err(|e| io_err(path, e))
}

/// The values of one tensor (see the module docs for the rules).
fn generate(name: &str, shape: &[usize], seed: u64) -> Vec<f32> {
    let n: usize = shape.iter().product();
    let fan_in = *shape.last().unwrap_or(&1) as f64;
    let (base, scale) = if name.ends_with("norm.weight") {
        (1.0, 0.1)
    } else if name.ends_with("embed.weight") {
        (0.0, 1.0)
    } else if name == "head.weight" || name.ends_with("markov_head.head.weight") {
        (0.0, 0.25)
    } else if name.ends_with("attn_sink") || name.ends_with("_base") {
        (0.0, 0.5)
    } else if name.ends_with("_scale") {
        (1.0, 0.2)
    } else if name.ends_with("gate.bias") {
        (0.0, 0.2)
    } else if name.ends_with("q_weight") || name.ends_with("k_weight") {
        (1.0, 0.3)
    } else if name.contains("confidence_head") {
        (0.0, 0.05)
    } else {
        (0.0, 1.0 / fan_in.max(1.0).sqrt())
    };
    let mut rng = SplitMix64(seed ^ fnv1a64(name.as_bytes()));
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let (a, b) = rng.normal_pair();
        out.push((base + scale * a) as f32);
        if out.len() < n {
            out.push((base + scale * b) as f32);
        }
    }
    out
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_is_deterministic_and_per_name() {
        let a = generate("layers.0.attn.wkv.weight", &[4, 16], 7);
        assert_eq!(a, generate("layers.0.attn.wkv.weight", &[4, 16], 7));
        assert_ne!(a, generate("layers.1.attn.wkv.weight", &[4, 16], 7));
        assert_ne!(a, generate("layers.0.attn.wkv.weight", &[4, 16], 8));
        let norm = generate("norm.weight", &[1000], 1);
        let mean = norm.iter().map(|&x| x as f64).sum::<f64>() / 1000.0;
        assert!((mean - 1.0).abs() < 0.02, "{mean}");
    }
}
