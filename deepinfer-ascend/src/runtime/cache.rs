//! On-disk cache of compiled kernel binaries, keyed by kernel, NPU arch and source hash.

use std::path::{Path, PathBuf};

use crate::error::{AscendError, Result};

/// FNV-1a, 64 bit: a stable content hash for cache keys (not for security).
pub(crate) fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Where compiled binaries are kept.
#[derive(Debug, Clone)]
pub struct KernelCache {
    dir: Option<PathBuf>,
}

impl KernelCache {
    /// A cache in `dir` (created on first write), or none.
    pub fn new(dir: Option<PathBuf>) -> Self {
        Self { dir }
    }

    /// The default folder: `$DEEPINFER_ASCEND_CACHE`, else `$XDG_CACHE_HOME/deepinfer-ascend`,
    /// else `$HOME/.cache/deepinfer-ascend`.
    pub fn default_dir() -> Option<PathBuf> {
        if let Some(d) = std::env::var_os("DEEPINFER_ASCEND_CACHE") {
            return Some(PathBuf::from(d));
        }
        if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
            return Some(Path::new(&d).join("deepinfer-ascend"));
        }
        std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache").join("deepinfer-ascend"))
    }

    /// File name of a binary.
    pub fn file_name(kernel: &str, arch: &str, source: &str, options: &[String]) -> String {
        let opts = options.join(" ");
        let key = fnv1a(&[source.as_bytes(), opts.as_bytes()]);
        format!("{kernel}-{arch}-{key:016x}.bin")
    }

    /// A cached binary, if present.
    pub fn get(&self, file: &str) -> Option<Vec<u8>> {
        let dir = self.dir.as_ref()?;
        std::fs::read(dir.join(file)).ok().filter(|b| !b.is_empty())
    }

    /// Store a binary (write to a temporary name, then rename, so readers never see half).
    pub fn put(&self, file: &str, bin: &[u8]) -> Result<()> {
        let Some(dir) = &self.dir else { return Ok(()) };
        let io = |e: std::io::Error| AscendError::Cache(format!("{}: {e}", dir.display()));
        std::fs::create_dir_all(dir).map_err(io)?;
        let tmp = dir.join(format!("{file}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, bin).map_err(io)?;
        std::fs::rename(&tmp, dir.join(file)).map_err(io)
    }
}
