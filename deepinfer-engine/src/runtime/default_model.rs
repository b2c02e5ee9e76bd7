//! The embedded default model: a tiny `deepseek_v41` checkpoint (the `v41-tiny-dev`
//! architecture of `default_config.json`: 8 layers, hidden size 64, 8 experts, Engram, KV
//! sharing, three DSpark stages, at DeepSeek's vocabulary of 129,280 tokens so the vendored
//! tokenizer of `deepinfer-recipe` works with it) **trained on Shakespeare's plays**.
//!
//! It is a toy (about a million parameters besides the vocabulary): it writes text that reads
//! like the corpus, and answers a chat message with a speech, but knows nothing else. Its
//! weights ship gzipped in the crate (`data/default-model.safetensors.gz`, bf16) with its
//! Engram token map; `scripts/train_default/` holds the training script, the corpus (the
//! `shakespeare` package of the Python Package Index, MIT licence over public-domain texts)
//! and the export. The first use unpacks them into an ordinary model directory, so `--model
//! DIR` works on it too.

use crate::model::{Model, ModelError};
use deepinfer_kernels::Backend;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The embedded default's config (HF `deepseek_v41` spelling).
pub const DEFAULT_CONFIG_JSON: &str = include_str!("default_config.json");

const MODEL_GZ: &[u8] = include_bytes!("../../data/default-model.safetensors.gz");
const TOKEN_MAP_GZ: &[u8] = include_bytes!("../../data/default-engram-token-map.json.gz");
/// The drafter's confidence temperatures, fitted by `deepinfer draft-calibration`.
const CALIBRATION_JSON: &str = include_str!("../../data/default-dspark-calibration.json");
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
    /// The embedded weights did not unpack (a damaged build).
    #[error("the embedded default model is damaged: {0}")]
    Damaged(String),
    /// The loader refused the checkpoint.
    #[error(transparent)]
    Model(#[from] ModelError),
}

fn io_err(path: &Path, e: std::io::Error) -> DefaultModelError {
    DefaultModelError::Io {
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

/// A fingerprint of what is embedded (weights, token map, config): it names the cache
/// directory, so a binary with other weights never reuses a stale copy.
fn fingerprint() -> u64 {
    static FINGERPRINT: OnceLock<u64> = OnceLock::new();
    *FINGERPRINT.get_or_init(|| {
        [
            MODEL_GZ,
            TOKEN_MAP_GZ,
            CALIBRATION_JSON.as_bytes(),
            DEFAULT_CONFIG_JSON.as_bytes(),
        ]
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |h, b| fnv1a64(h, b))
    })
}

/// Where the default checkpoint is cached: `$DEEPINFER_CACHE`, else `$XDG_CACHE_HOME/deepinfer`,
/// else `$HOME/.cache/deepinfer`, else the system temp dir; one sub-directory per build of
/// the embedded weights.
pub fn default_model_dir() -> PathBuf {
    let base = std::env::var_os("DEEPINFER_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|p| PathBuf::from(p).join("deepinfer")))
        .or_else(|| {
            std::env::var_os("HOME").map(|p| PathBuf::from(p).join(".cache").join("deepinfer"))
        })
        .unwrap_or_else(|| std::env::temp_dir().join("deepinfer"));
    base.join(format!("default-v41-shakespeare-{:016x}", fingerprint()))
}

/// The marker written last: its presence means the directory is complete.
fn marker_text() -> String {
    serde_json::json!({
        "fingerprint": format!("{:016x}", fingerprint()),
        "note": "deepinfer's embedded default: a toy deepseek_v41 trained on Shakespeare",
    })
    .to_string()
}

/// Make sure `dir` holds the embedded default checkpoint (unpacking it if needed) and return
/// `dir`. The directory is an ordinary model directory (`config.json`, `model.safetensors`,
/// `engram_token_map.json`, and the drafter's `dspark_calibration.json`).
pub fn materialize_default(dir: &Path) -> Result<PathBuf, DefaultModelError> {
    let marker = dir.join(MARKER);
    if std::fs::read_to_string(&marker).ok().as_deref() == Some(marker_text().as_str()) {
        return Ok(dir.to_path_buf());
    }
    std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
    let write = |name: &str, bytes: &[u8]| -> Result<(), DefaultModelError> {
        // Written beside and renamed, so a concurrent reader never sees half a file.
        let tmp = dir.join(format!("{name}.partial-{}", unique()));
        std::fs::write(&tmp, bytes).map_err(|e| io_err(&tmp, e))?;
        let fin = dir.join(name);
        std::fs::rename(&tmp, &fin).map_err(|e| io_err(&fin, e))
    };
    write("config.json", DEFAULT_CONFIG_JSON.as_bytes())?;
    write("engram_token_map.json", &gunzip(TOKEN_MAP_GZ)?)?;
    write("model.safetensors", &gunzip(MODEL_GZ)?)?;
    write(
        crate::runtime::draft_calibration::CALIBRATION_FILE,
        CALIBRATION_JSON.as_bytes(),
    )?;
    write(MARKER, marker_text().as_bytes())?;
    Ok(dir.to_path_buf())
}

/// Unpack (or reuse the cached copy of) the default checkpoint and load it on `be`.
pub fn load_default<B: Backend>(be: B) -> Result<Model<B>, DefaultModelError> {
    let dir = materialize_default(&default_model_dir())?;
    Ok(Model::load(&dir, be)?)
}

fn gunzip(bytes: &[u8]) -> Result<Vec<u8>, DefaultModelError> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .map_err(|e| DefaultModelError::Damaged(e.to_string()))?;
    Ok(out)
}

/// A suffix that keeps concurrent creators (tests, two processes) off each other's files.
fn unique() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{}-{nanos}", std::process::id())
}

fn fnv1a64(mut h: u64, bytes: &[u8]) -> u64 {
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
    fn damaged_weights_are_an_error_not_a_panic() {
        let err = gunzip(&MODEL_GZ[..MODEL_GZ.len() / 2]).unwrap_err();
        assert!(matches!(err, DefaultModelError::Damaged(_)), "{err}");
    }

    #[test]
    fn the_embedded_calibration_parses() {
        crate::runtime::draft_calibration::parse_calibration(CALIBRATION_JSON).unwrap();
    }

    #[test]
    fn the_fingerprint_names_the_cache_directory() {
        let name = default_model_dir();
        let name = name.file_name().unwrap().to_string_lossy();
        assert_eq!(
            name,
            format!("default-v41-shakespeare-{:016x}", fingerprint())
        );
    }
}
