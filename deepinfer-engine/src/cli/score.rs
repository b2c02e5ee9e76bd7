//! `deepinfer score --model DIR --input IDS.json --output OUT.safetensors [--logprobs]`:
//! for every named token list, the logits (or log-softmax) at every position, f32 `[len, V]`,
//! written as `<name>.logits` (exact mode, f32, CPU backend).

use super::CliResult;
use crate::model::{BatchItem, Logits, Model};
use clap::Args;
use deepinfer_kernels::{CpuBackend, CpuConfig};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Arguments of `deepinfer score`.
#[derive(Debug, Args)]
pub struct ScoreArgs {
    /// Model directory (config.json, weights, engram_token_map.json for V4.1).
    #[arg(long)]
    pub model: PathBuf,
    /// JSON object mapping names to token-id lists.
    #[arg(long)]
    pub input: PathBuf,
    /// Output safetensors file.
    #[arg(long)]
    pub output: PathBuf,
    /// Write log-softmax values instead of raw logits.
    #[arg(long)]
    pub logprobs: bool,
    /// Weight files to load instead of the directory's default (repeatable).
    #[arg(long)]
    pub weights: Vec<PathBuf>,
    /// Prefill chunk size (0: each input in one chunk).
    #[arg(long, default_value_t = 0)]
    pub chunk: usize,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Expert parallelism over N in-process CPU ranks (the logits are those of one rank).
    #[arg(long, default_value_t = 1)]
    pub expert_parallel: usize,
}

/// Read the input map `{"name": [ids...]}`.
pub fn read_inputs(path: &std::path::Path) -> Result<BTreeMap<String, Vec<u32>>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let obj = v.as_object().ok_or_else(|| {
        format!(
            "{}: expected an object of name -> token ids",
            path.display()
        )
    })?;
    let mut out = BTreeMap::new();
    for (name, ids) in obj {
        let arr = ids
            .as_array()
            .ok_or_else(|| format!("{}: `{name}` is not a list", path.display()))?;
        let ids = arr
            .iter()
            .map(|x| {
                x.as_u64()
                    .and_then(|u| u32::try_from(u).ok())
                    .ok_or_else(|| {
                        format!("{}: `{name}` holds a non-token value {x}", path.display())
                    })
            })
            .collect::<Result<Vec<u32>, String>>()?;
        if ids.is_empty() {
            return Err(format!("{}: `{name}` is empty", path.display()));
        }
        out.insert(name.clone(), ids);
    }
    Ok(out)
}

/// In-place log-softmax of each `v`-wide row.
pub fn log_softmax_rows(x: &mut [f32], v: usize) {
    for row in x.chunks_mut(v) {
        let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let lse = m as f64
            + row
                .iter()
                .map(|&z| ((z - m) as f64).exp())
                .sum::<f64>()
                .ln();
        for z in row.iter_mut() {
            *z = (*z as f64 - lse) as f32;
        }
    }
}

/// Run the subcommand.
pub fn run(a: &ScoreArgs) -> CliResult {
    let be = CpuBackend::with_config(CpuConfig {
        batch_invariant: true,
        threads: a.threads,
    })?;
    let model = if a.weights.is_empty() {
        Model::load(&a.model, be)?
    } else {
        Model::load_with_files(&a.model, &a.weights, be)?
    };
    let experts = model.cfg.n_routed_experts;
    if a.expert_parallel == 0 || a.expert_parallel > experts {
        return Err(format!(
            "--expert-parallel must be between 1 and the model's {experts} routed experts"
        )
        .into());
    }
    let placement = (a.expert_parallel > 1).then(|| {
        crate::model::ExpertPlacement::contiguous(model.cfg.num_layers, experts, a.expert_parallel)
    });
    let inputs = read_inputs(&a.input)?;
    let v = model.cfg.vocab_size;
    let mut results: Vec<(String, Vec<u8>, Vec<usize>)> = Vec::new();
    for (name, ids) in &inputs {
        let mut st = model.new_state();
        let chunk = if a.chunk == 0 { ids.len() } else { a.chunk };
        let mut logits = Vec::with_capacity(ids.len() * v);
        for part in ids.chunks(chunk) {
            let item = BatchItem {
                state: &mut st,
                tokens: part,
            };
            let out = match &placement {
                Some(p) => model.forward_expert_parallel(vec![item], Logits::All, p)?,
                None => model.forward(&mut [item], Logits::All, None)?,
            };
            logits.extend_from_slice(&out[0]);
        }
        if a.logprobs {
            log_softmax_rows(&mut logits, v);
        }
        let bytes: Vec<u8> = logits.iter().flat_map(|f| f.to_le_bytes()).collect();
        results.push((format!("{name}.logits"), bytes, vec![ids.len(), v]));
    }
    let views = results
        .iter()
        .map(|(n, b, s)| {
            Ok((
                n.clone(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)?,
            ))
        })
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()?;
    safetensors::serialize_to_file(views, None, &a.output)?;
    Ok(())
}
