//! The KV pool's size from the model and a memory budget: block size from the model's
//! compression ratios, block count from `Model::kv_layout` and the budget.

use super::*;

/// How much memory the KV pool may hold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvCacheMemory {
    /// This many bytes for the pool: every running sequence's fixed window state plus the
    /// paged blocks (compressed entries and indexer keys).
    Bytes(u64),
    /// This fraction (0, 1] of the host memory available when the engine starts
    /// (`MemAvailable`), as `gpu_memory_utilization` sizes a GPU engine's cache. The pool
    /// never grows past what `max_num_seqs` sequences of `max_model_len` tokens can use.
    Auto(f64),
}

/// The resolved pool of an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvPool {
    /// Blocks in the pool.
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Bytes of one paged block (all layers).
    pub bytes_per_block: u64,
    /// Fixed bytes of one running sequence (window rows, drafter windows).
    pub bytes_per_sequence: u64,
}

impl KvPool {
    /// Bytes the pool holds when full, running sequences' fixed state included.
    pub fn bytes(&self, sequences: usize) -> u64 {
        self.num_blocks as u64 * self.bytes_per_block + sequences as u64 * self.bytes_per_sequence
    }
}

/// `MemAvailable` of `/proc/meminfo`, in bytes (`None` where there is no such file).
pub fn available_host_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Sizes the pool of `cfg` for `model`: a zero `block_size` becomes the model's block size,
/// and with `kv_cache_memory` set the block count comes from the budget (else `num_blocks`).
pub(super) fn size_pool<B: Backend>(
    model: &Model<B>,
    cfg: &EngineConfig,
) -> Result<KvPool, EngineError> {
    let block_size = match cfg.block_size {
        0 => default_block_size(&model.cfg),
        b => b,
    };
    let layout = model
        .kv_layout(block_size, cfg.spec_slack)
        .map_err(|e| EngineError::Config(format!("block size {block_size}: {e}")))?;
    let (per_block, per_seq) = (layout.bytes_per_block(), layout.bytes_per_sequence());
    let num_blocks = match cfg.kv_cache_memory {
        None => cfg.num_blocks,
        Some(mem) => blocks_for_budget(mem, cfg, block_size, per_block.max(1), per_seq)?,
    };
    if num_blocks == 0 {
        return Err(EngineError::Config(
            "num_blocks and block_size must be positive".into(),
        ));
    }
    Ok(KvPool {
        num_blocks,
        block_size,
        bytes_per_block: per_block,
        bytes_per_sequence: per_seq,
    })
}

/// The model's block size: the least multiple of 32, of every compression ratio and of the
/// sliding window rounded up to a power of two, at most 128, so a block holds whole
/// compressed entries and ends where a window state can be kept (128 for V4.1-Flash and
/// V4-Flash, 32 for the embedded model).
pub fn default_block_size(c: &crate::config::ModelConfig) -> usize {
    fn gcd(a: usize, b: usize) -> usize {
        if b == 0 { a } else { gcd(b, a % b) }
    }
    let window = c.sliding_window.clamp(1, 128).next_power_of_two();
    c.compress_ratios
        .iter()
        .filter(|&&r| r > 0)
        .chain([&window])
        .fold(32, |acc, &r| acc / gcd(acc, r) * r)
}

fn blocks_for_budget(
    mem: KvCacheMemory,
    cfg: &EngineConfig,
    block_size: usize,
    per_block: u64,
    per_seq: u64,
) -> Result<usize, EngineError> {
    let seq_blocks = cfg.max_model_len.div_ceil(block_size).max(1);
    // More blocks than every sequence at full length can fill would be budget never used.
    let cap = cfg.max_num_seqs.max(1).saturating_mul(seq_blocks);
    let budget = match mem {
        KvCacheMemory::Bytes(b) => b,
        KvCacheMemory::Auto(f) => {
            if !(f > 0.0 && f <= 1.0) {
                return Err(EngineError::Config(format!(
                    "kv cache memory fraction {f} must be in (0, 1]"
                )));
            }
            let avail = available_host_memory().ok_or_else(|| {
                EngineError::Config(
                    "kv cache memory auto: this system reports no available memory; give a size"
                        .into(),
                )
            })?;
            (avail as f64 * f) as u64
        }
    };
    let fixed = per_seq.saturating_mul(cfg.max_num_seqs as u64);
    let blocks = budget.saturating_sub(fixed) / per_block;
    // One sequence at the full context must fit, or long prompts could never run.
    let need = seq_blocks as u64 * per_block + fixed;
    if blocks < seq_blocks as u64 {
        return Err(EngineError::Config(format!(
            "kv cache memory of {budget} bytes is too small: {} sequences' window state and one \
             {}-token context need {need} bytes",
            cfg.max_num_seqs, cfg.max_model_len
        )));
    }
    Ok((blocks as usize).min(cap))
}

#[cfg(test)]
mod tests {
    use super::default_block_size;
    use crate::plan::PlanModel;

    #[test]
    fn the_published_models_get_128_token_blocks() {
        for name in ["v4.1-flash", "v4-flash"] {
            let m = PlanModel::preset(name).unwrap();
            assert_eq!(default_block_size(&m.config), 128, "{name}");
        }
    }
}
