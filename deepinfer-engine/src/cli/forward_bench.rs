//! `deepinfer forward-bench --model DIR --prompt-len 1024 --decode-tokens 64 --threads 2`:
//! prefill tokens/s for one prompt and greedy decode tokens/s at batch 1, measured the way
//! the peers (transformers, llama.cpp) are measured side by side: one sequence, the whole
//! prompt in one forward call, then one token per call. Also `deepinfer random-checkpoint`,
//! which writes random weights for a config so any model size can be benchmarked.

use super::CliResult;
use super::backend::{self, BackendArg};
use crate::model::{
    BatchItem, LoadOptions, Logits, MatmulWeights, Model, RandomDtype, argmax,
    write_random_checkpoint,
};
use clap::Args;
use deepinfer_kernels::{Backend, CpuBackend, CpuConfig};
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `deepinfer forward-bench`.
#[derive(Debug, Args)]
pub struct ForwardBenchArgs {
    /// Model directory (config.json and weights).
    #[arg(long)]
    pub model: PathBuf,
    /// Prompt length (pseudo-random token ids).
    #[arg(long, default_value_t = 1024)]
    pub prompt_len: usize,
    /// Greedy decode steps after the prompt (batch 1, one token per forward).
    #[arg(long, default_value_t = 64)]
    pub decode_tokens: usize,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Prefill repetitions (the best and the median are reported).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Batch-invariant kernels (fixed-order GEMMs) instead of the fast mode.
    #[arg(long)]
    pub batch_invariant: bool,
    /// Round every matmul matrix to bf16 at load (an approximation for f32 checkpoints;
    /// bf16-stored checkpoints are kept in bf16 anyway, exactly).
    #[arg(long)]
    pub bf16_weights: bool,
    /// Seed of the prompt's token ids.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Compute backend: `cpu` (default) or `cuda` (GPU 0; a build with the `cuda` feature).
    /// Each forward returns its logits to the host, so the times include that copy.
    #[arg(long, value_enum, default_value_t = BackendArg::Cpu)]
    pub backend: BackendArg,
}

/// Arguments of `deepinfer random-checkpoint`.
#[derive(Debug, Args)]
pub struct RandomCheckpointArgs {
    /// A model config (`config.json`, HF or DeepSeek names).
    #[arg(long)]
    pub config: PathBuf,
    /// Output directory (gets config.json and model.safetensors).
    #[arg(long)]
    pub out: PathBuf,
    /// Seed of the weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Store bf16 instead of f32.
    #[arg(long)]
    pub bf16: bool,
}

/// Pseudo-random prompt ids below `vocab` (xorshift, reproducible from `seed`).
pub fn prompt_ids(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab as u64) as u32
        })
        .collect()
}

/// Run `deepinfer forward-bench`.
pub fn run(a: &ForwardBenchArgs) -> CliResult {
    if a.prompt_len == 0 {
        return Err("--prompt-len must be at least 1".into());
    }
    // The whole measurement runs inside one pool of `threads` workers and the backend uses
    // the calling thread's pool: each op then starts on a worker, with no hand-off from the
    // main thread to the pool (and back) per op.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(a.threads.max(1))
        .build()?;
    pool.install(|| measure(a))
}

fn measure(a: &ForwardBenchArgs) -> CliResult {
    let cpu = CpuConfig {
        batch_invariant: a.batch_invariant,
        threads: None,
    };
    match a.backend {
        BackendArg::Cpu => measure_on(a, CpuBackend::with_config(cpu)?),
        BackendArg::Cuda => measure_on(a, backend::cuda(cpu)?),
    }
}

fn measure_on<B: Backend>(a: &ForwardBenchArgs, be: B) -> CliResult {
    let t0 = Instant::now();
    let opts = LoadOptions {
        matmul_weights: if a.bf16_weights {
            MatmulWeights::Bf16
        } else {
            MatmulWeights::AsStored
        },
    };
    let model = Model::load_with_options(&a.model, be, opts)?;
    let load_s = t0.elapsed().as_secs_f64();
    let ids = prompt_ids(a.prompt_len, model.cfg.vocab_size, a.seed);
    let mut times = Vec::new();
    let mut state = model.new_state();
    let mut next = 0;
    for _ in 0..a.repeat.max(1) {
        state = model.new_state();
        let t = Instant::now();
        let logits = model.forward(
            &mut [BatchItem {
                state: &mut state,
                tokens: &ids,
            }],
            Logits::Last,
            None,
        )?;
        times.push(t.elapsed().as_secs_f64());
        next = argmax(&logits[0]) as u32;
    }
    let prefill_profile = crate::model::profile_report();
    times.sort_by(f64::total_cmp);
    let best = times[0];
    let median = times[times.len() / 2];
    let t = Instant::now();
    for _ in 0..a.decode_tokens {
        let logits = model.forward(
            &mut [BatchItem {
                state: &mut state,
                tokens: std::slice::from_ref(&next),
            }],
            Logits::Last,
            None,
        )?;
        next = argmax(&logits[0]) as u32;
    }
    let dec_s = t.elapsed().as_secs_f64();
    let decode_profile = crate::model::profile_report();
    let floor = Floor::measure(&model, a.decode_tokens);
    if !prefill_profile.is_empty() {
        eprintln!("prefill spans ({} runs):\n{prefill_profile}", times.len());
        eprintln!(
            "decode spans ({} steps):\n{decode_profile}",
            a.decode_tokens
        );
    }
    let n = a.prompt_len as f64;
    let dec_tps = if a.decode_tokens > 0 {
        a.decode_tokens as f64 / dec_s
    } else {
        0.0
    };
    let c = &model.cfg;
    if a.json {
        let v = serde_json::json!({
            "model": a.model.display().to_string(),
            "kind": format!("{:?}", c.kind),
            "layers": c.num_layers,
            "hidden": c.hidden_size,
            "vocab": c.vocab_size,
            "backend": format!("{:?}", a.backend).to_lowercase(),
            "threads": a.threads,
            "batch_invariant": a.batch_invariant,
            "bf16_weights": a.bf16_weights,
            "load_s": load_s,
            "prompt_len": a.prompt_len,
            "prefill_best_s": best,
            "prefill_median_s": median,
            "prefill_tok_s": n / best,
            "prefill_median_tok_s": n / median,
            "decode_tokens": a.decode_tokens,
            "decode_s": dec_s,
            "decode_tok_s": dec_tps,
            "decode_weight_bytes": floor.bytes.total(),
            "stream_read_gb_s": floor.gb_s,
            "decode_floor_tok_s": floor.tok_s(),
            "decode_fraction_of_floor": dec_tps / floor.tok_s(),
            "last_token": next,
        });
        println!("{v}");
    } else {
        println!(
            "model {} ({:?}, {} layers, hidden {}, vocab {}), {}, {} threads, {} mode, loaded in {:.2} s",
            a.model.display(),
            c.kind,
            c.num_layers,
            c.hidden_size,
            c.vocab_size,
            format!("{:?}", a.backend).to_lowercase(),
            a.threads,
            if a.batch_invariant {
                "batch-invariant"
            } else {
                "fast"
            },
            load_s
        );
        println!(
            "prefill {} tokens: best {:.4} s = {:.1} tok/s (median {:.4} s = {:.1} tok/s, {} runs)",
            a.prompt_len,
            best,
            n / best,
            median,
            n / median,
            times.len()
        );
        println!(
            "decode {} tokens at batch 1: {:.4} s = {:.1} tok/s",
            a.decode_tokens, dec_s, dec_tps
        );
        if a.decode_tokens > 0 {
            let b = &floor.bytes;
            println!(
                "decode floor: {:.1} MB of weights per token (head {:.1}, dense {:.1}, routed experts {:.1}, rows {:.2}) at a streaming read of {:.1} GB/s = {:.1} tok/s; measured {:.0}% of it",
                b.total() / 1e6,
                b.head / 1e6,
                b.dense / 1e6,
                b.routed_experts / 1e6,
                b.rows / 1e6,
                floor.gb_s,
                floor.tok_s(),
                100.0 * dec_tps / floor.tok_s()
            );
        }
    }
    Ok(())
}

/// The memory floor of batch-1 decode: the weight bytes a step reads and the machine's
/// streaming read bandwidth, measured with the same threads in the same run.
struct Floor {
    bytes: crate::model::DecodeBytes,
    gb_s: f64,
}

impl Floor {
    fn measure<B: Backend>(model: &Model<B>, decode_tokens: usize) -> Self {
        let bytes = model.decode_bytes();
        let gb_s = if decode_tokens > 0 {
            stream_read_gb_s(256 << 20)
        } else {
            0.0
        };
        Floor { bytes, gb_s }
    }

    fn tok_s(&self) -> f64 {
        self.gb_s * 1e9 / self.bytes.total().max(1.0)
    }
}

/// Best of three parallel sums over `bytes` of memory (the current rayon pool's threads),
/// in GB/s: what any memory-bound kernel can at most read.
fn stream_read_gb_s(bytes: usize) -> f64 {
    deepinfer_kernels::bandwidth::read_bandwidth_gb_s(bytes)
}

/// Run `deepinfer random-checkpoint`.
pub fn run_random(a: &RandomCheckpointArgs) -> CliResult {
    let dt = if a.bf16 {
        RandomDtype::Bf16
    } else {
        RandomDtype::F32
    };
    write_random_checkpoint(&a.config, &a.out, a.seed, dt)?;
    println!("wrote {}", a.out.display());
    Ok(())
}
