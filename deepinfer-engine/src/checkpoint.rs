//! Safetensors checkpoints through `memmap2`: single files, several files, or shards listed
//! by `model.safetensors.index.json`. Headers are validated by the `safetensors` crate
//! (offsets contiguous and inside the file, sizes matching dtype × shape), so a truncated
//! file or a header that lies is an error before any tensor is touched, and no allocation
//! is ever sized from an unchecked header.

use crate::names::canonical_name;
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A checkpoint file could not be opened or parsed.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Reading a file failed.
    #[error("cannot read {path}: {reason}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        reason: String,
    },
    /// A safetensors file is truncated or its header is inconsistent.
    #[error("{path} is not a valid safetensors file: {reason}")]
    Format {
        /// The file.
        path: String,
        /// What the parser found.
        reason: String,
    },
    /// The shard index is malformed.
    #[error("bad shard index {path}: {reason}")]
    Index {
        /// The index file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The same canonical tensor name appears twice.
    #[error("tensor `{name}` appears twice (in {first} and {second})")]
    Duplicate {
        /// Canonical name.
        name: String,
        /// One file.
        first: String,
        /// The other file.
        second: String,
    },
    /// No weight file was found in a model directory.
    #[error("no model.safetensors or model.safetensors.index.json in {0}")]
    NoWeights(String),
}

/// One stored tensor: where its bytes are and how they are typed.
#[derive(Debug, Clone)]
pub struct RawTensor {
    /// Name as stored in the file.
    pub stored_name: String,
    /// Stored dtype.
    pub dtype: Dtype,
    /// Stored shape.
    pub shape: Vec<usize>,
    file: usize,
    start: usize,
    end: usize,
}

/// The mapped files of one checkpoint with their tensors indexed by canonical
/// (DeepSeek upstream) name.
#[derive(Debug)]
pub struct Checkpoint {
    files: Vec<(PathBuf, Arc<Mmap>)>,
    tensors: BTreeMap<String, RawTensor>,
}

/// Bytes of a tensor, kept alive by the file mapping.
#[derive(Debug, Clone)]
pub struct MappedBytes {
    map: Arc<Mmap>,
    start: usize,
    end: usize,
}

impl MappedBytes {
    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map[self.start..self.end]
    }

    /// The whole mapping, shared, and where these bytes start in it: for backends that read
    /// a weight in place ([`deepinfer_kernels::Backend::upload_shared`]).
    pub fn shared(&self) -> (deepinfer_kernels::SharedBytes, usize) {
        (self.map.clone(), self.start)
    }
}

impl Checkpoint {
    /// Open the weights of a model directory: the shards of `model.safetensors.index.json`
    /// when present, otherwise `model.safetensors`.
    pub fn open_dir(dir: &Path) -> Result<Self, CheckpointError> {
        let index = dir.join("model.safetensors.index.json");
        if index.exists() {
            let files = shard_files(&index)?;
            let paths: Vec<PathBuf> = files.iter().map(|f| dir.join(f)).collect();
            return Self::open_files(&paths);
        }
        let single = dir.join("model.safetensors");
        if single.exists() {
            return Self::open_files(&[single]);
        }
        Err(CheckpointError::NoWeights(dir.display().to_string()))
    }

    /// Open the given safetensors files as one checkpoint.
    pub fn open_files(paths: &[PathBuf]) -> Result<Self, CheckpointError> {
        let mut files = Vec::new();
        let mut tensors: BTreeMap<String, RawTensor> = BTreeMap::new();
        for path in paths {
            let io = |e: std::io::Error| CheckpointError::Io {
                path: path.display().to_string(),
                reason: e.to_string(),
            };
            let file = std::fs::File::open(path).map_err(io)?;
            // SAFETY: the mapping is read-only and the file is opened read-only; as with every
            // memory-mapped loader, a concurrent writer truncating the file could fault, which
            // checkpoints (written once, then read) do not do.
            let map = unsafe { Mmap::map(&file) }.map_err(io)?;
            let fidx = files.len();
            let (header_len, meta) =
                SafeTensors::read_metadata(&map).map_err(|e| CheckpointError::Format {
                    path: path.display().to_string(),
                    reason: e.to_string(),
                })?;
            let base = 8 + header_len;
            for (name, info) in meta.tensors() {
                let (s, e) = info.data_offsets;
                let raw = RawTensor {
                    stored_name: name.clone(),
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    file: fidx,
                    start: base + s,
                    end: base + e,
                };
                let canon = canonical_name(&name);
                if let Some(prev) = tensors.get(&canon) {
                    return Err(CheckpointError::Duplicate {
                        name: canon,
                        first: files
                            .get(prev.file)
                            .map(|(p, _): &(PathBuf, Arc<Mmap>)| p.display().to_string())
                            .unwrap_or_else(|| path.display().to_string()),
                        second: path.display().to_string(),
                    });
                }
                tensors.insert(canon, raw);
            }
            files.push((path.clone(), Arc::new(map)));
        }
        Ok(Checkpoint { files, tensors })
    }

    /// A checkpoint with no tensors (loading from it lists every tensor a config needs).
    pub fn empty() -> Self {
        Checkpoint {
            files: Vec::new(),
            tensors: BTreeMap::new(),
        }
    }

    /// Canonical names of every stored tensor, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// The stored tensor under a canonical name.
    pub fn get(&self, name: &str) -> Option<&RawTensor> {
        self.tensors.get(name)
    }

    /// The bytes of a stored tensor (validated to lie inside its file when opened).
    pub fn bytes(&self, t: &RawTensor) -> MappedBytes {
        MappedBytes {
            map: self.files[t.file].1.clone(),
            start: t.start,
            end: t.end,
        }
    }
}

fn shard_files(index: &Path) -> Result<Vec<String>, CheckpointError> {
    let bad = |reason: String| CheckpointError::Index {
        path: index.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(index).map_err(|e| CheckpointError::Io {
        path: index.display().to_string(),
        reason: e.to_string(),
    })?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("no `weight_map` object".into()))?;
    let mut files: Vec<String> = Vec::new();
    for (name, f) in map {
        let f = f
            .as_str()
            .ok_or_else(|| bad(format!("entry `{name}` is not a file name")))?;
        if f.contains('/') || f.contains('\\') || f.starts_with('.') {
            return Err(bad(format!("shard `{f}` is not a plain file name")));
        }
        if !files.iter().any(|x| x == f) {
            files.push(f.to_string());
        }
    }
    files.sort();
    if files.is_empty() {
        return Err(bad("empty `weight_map`".into()));
    }
    Ok(files)
}
