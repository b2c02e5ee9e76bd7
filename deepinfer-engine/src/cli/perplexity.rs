//! `deepinfer perplexity --text FILE [--model DIR] [--window N] [--json]`: tokenise a text
//! file (BOS first), score it teacher-forced in windows of `--window` tokens (each window
//! from a fresh state, so its first token is context only), and print the tokens scored,
//! the mean negative log-likelihood (nats per token) and the perplexity `exp(mean NLL)`.

use super::CliResult;
use super::backend::{self, BackendArg};
use super::engine_args::{NumericsArgs, tokenizer_for};
use crate::model::{BatchItem, Logits, Model};
use crate::runtime::{default_model_dir, materialize_default};
use clap::Args;
use deepinfer_kernels::{Backend, CpuBackend, CpuConfig};
use deepinfer_recipe::SpecialToken;
use std::path::PathBuf;

/// Arguments of `deepinfer perplexity`.
#[derive(Debug, Args)]
pub struct PerplexityArgs {
    /// The text to score (UTF-8).
    #[arg(long)]
    pub text: PathBuf,
    /// Model directory (default: the embedded toy V4.1 model, trained on Shakespeare).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Tokens per window (the context each scored token sees at most).
    #[arg(long, default_value_t = 4096)]
    pub window: usize,
    /// Rows per forward call inside a window (bounds the logits held at once).
    #[arg(long, default_value_t = 256)]
    pub chunk: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Batch-invariant kernels.
    #[arg(long)]
    pub deterministic: bool,
    /// Numerics of the model (`--fp8-activations`).
    #[command(flatten)]
    pub numerics: NumericsArgs,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Compute backend.
    #[arg(long, value_enum, default_value_t = BackendArg::Cpu)]
    pub backend: BackendArg,
}

/// What scoring a text gives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PerplexityReport {
    /// Tokens of the text (BOS included).
    pub tokens: usize,
    /// Tokens whose probability was scored (all but each window's first).
    pub scored: usize,
    /// Windows.
    pub windows: usize,
    /// Mean negative log-likelihood, nats per scored token.
    pub mean_nll: f64,
}

impl PerplexityReport {
    /// `exp(mean NLL)`.
    pub fn perplexity(&self) -> f64 {
        self.mean_nll.exp()
    }
}

/// Score `tokens` teacher-forced in windows of `window` tokens, `chunk` rows per forward.
pub fn score_tokens<B: Backend>(
    model: &Model<B>,
    tokens: &[u32],
    window: usize,
    chunk: usize,
) -> Result<PerplexityReport, Box<dyn std::error::Error + Send + Sync>>
where
    B::Tensor: Clone,
{
    if window < 2 {
        return Err("--window must be at least 2 tokens".into());
    }
    if chunk == 0 {
        return Err("--chunk must be at least 1".into());
    }
    if tokens.len() < 2 {
        return Err("the text gives fewer than 2 tokens: nothing to score".into());
    }
    let v = model.cfg.vocab_size;
    let (mut nll, mut scored, mut windows) = (0.0f64, 0usize, 0usize);
    for w in tokens.chunks(window) {
        windows += 1;
        let mut st = model.new_state();
        let mut at = 0;
        for part in w.chunks(chunk) {
            let rows = model.forward(
                &mut [BatchItem {
                    state: &mut st,
                    tokens: part,
                }],
                Logits::All,
                None,
            )?;
            for (i, row) in rows[0].chunks_exact(v).enumerate() {
                // Row `at + i` predicts token `at + i + 1` of the window.
                let Some(&next) = w.get(at + i + 1) else {
                    break;
                };
                let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
                let z: f64 = row.iter().map(|&x| (x as f64 - m).exp()).sum();
                nll += m + z.ln() - row[next as usize] as f64;
                scored += 1;
            }
            at += part.len();
        }
    }
    Ok(PerplexityReport {
        tokens: tokens.len(),
        scored,
        windows,
        mean_nll: nll / scored.max(1) as f64,
    })
}

/// Run `deepinfer perplexity`.
pub fn run(a: &PerplexityArgs) -> CliResult {
    let cpu = CpuConfig {
        batch_invariant: a.deterministic,
        threads: a.threads,
    };
    match a.backend {
        BackendArg::Cpu => run_on(a, CpuBackend::with_config(cpu)?),
        BackendArg::Cuda => run_on(a, backend::cuda(cpu)?),
    }
}

fn run_on<B: Backend>(a: &PerplexityArgs, be: B) -> CliResult
where
    B::Tensor: Clone,
{
    let text = std::fs::read_to_string(&a.text)
        .map_err(|e| format!("cannot read {}: {e}", a.text.display()))?;
    let mut model = match &a.model {
        Some(dir) => Model::load(dir, be)?,
        None => Model::load(&materialize_default(&default_model_dir())?, be)?,
    };
    a.numerics.apply(&mut model);
    let tok = tokenizer_for(a.model.as_deref(), model.cfg.vocab_size)?;
    let mut ids: Vec<u32> = tok
        .special_id(SpecialToken::Bos.deepseek_spelling())
        .into_iter()
        .collect();
    tok.encode_plain_into(&text, &mut ids)
        .map_err(|e| format!("cannot tokenise {}: {e}", a.text.display()))?;
    let r = score_tokens(&model, &ids, a.window, a.chunk)?;
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "tokens": r.tokens, "scored_tokens": r.scored, "windows": r.windows,
                "mean_nll": r.mean_nll, "perplexity": r.perplexity(),
            })
        );
    } else {
        println!(
            "{} tokens ({} scored in {} window(s) of up to {}): mean NLL {:.4} nats/token, perplexity {:.3}",
            r.tokens,
            r.scored,
            r.windows,
            a.window,
            r.mean_nll,
            r.perplexity()
        );
    }
    Ok(())
}
