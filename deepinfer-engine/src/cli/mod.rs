//! The `deepinfer` command line. Each subcommand lives in its own module with its own
//! clap `Args` struct and a `run` function; `main` only dispatches.

pub mod backend;
#[cfg(feature = "runtime")]
pub mod bench;
#[cfg(feature = "server")]
pub mod bench_serve;
#[cfg(feature = "runtime")]
pub mod draft_calibration;
#[cfg(feature = "runtime")]
pub mod engine_args;
pub mod forward_bench;
#[cfg(feature = "runtime")]
pub mod generate;
#[cfg(feature = "runtime")]
pub mod perplexity;
#[cfg(feature = "runtime")]
pub mod plan;
pub mod score;
#[cfg(feature = "server")]
pub mod serve;

use clap::{Parser, Subcommand};

/// deepinfer: a DeepSeek V4.1 / V4 inference engine.
#[derive(Debug, Parser)]
#[command(name = "deepinfer", version, about)]
pub struct Cli {
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Teacher-forced scoring: logits (or log-probabilities) at every position.
    Score(score::ScoreArgs),
    /// Prefill and batch-1 decode tokens/s of one model (for side-by-side peer figures).
    ForwardBench(forward_bench::ForwardBenchArgs),
    /// Write a random-weight checkpoint for a config (benchmarks of any model size).
    RandomCheckpoint(forward_bench::RandomCheckpointArgs),
    /// Generate completions (OpenAI Batch JSONL, a quick prompt, or the built-in sample batch).
    #[cfg(feature = "runtime")]
    Generate(generate::GenerateArgs),
    /// Offline throughput at several concurrencies: table, JSON and SVG chart.
    #[cfg(feature = "runtime")]
    Bench(bench::BenchArgs),
    /// Perplexity of a text file, scored teacher-forced in windows.
    #[cfg(feature = "runtime")]
    Perplexity(perplexity::PerplexityArgs),
    /// How well the drafter's confidences predict acceptance; fits per-position temperatures.
    #[cfg(feature = "runtime")]
    DraftCalibration(draft_calibration::DraftCalibrationArgs),
    /// Memory plan of a model on devices: weights, cache per token and sequence, what fits.
    #[cfg(feature = "runtime")]
    Plan(plan::PlanArgs),
    /// Serve the model over OpenAI- and Anthropic-compatible HTTP.
    #[cfg(feature = "server")]
    Serve(serve::ServeArgs),
    /// Replay a prompt set against an OpenAI-compatible server at rising arrival rates.
    #[cfg(feature = "server")]
    BenchServe(bench_serve::BenchServeArgs),
}

/// Errors of the command line, printed as one line.
pub type CliResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Run a parsed command line.
pub fn run(cli: Cli) -> CliResult {
    match cli.command {
        Command::Score(a) => score::run(&a),
        Command::ForwardBench(a) => forward_bench::run(&a),
        Command::RandomCheckpoint(a) => forward_bench::run_random(&a),
        #[cfg(feature = "runtime")]
        Command::Generate(a) => generate::run(&a),
        #[cfg(feature = "runtime")]
        Command::Bench(a) => bench::run(&a),
        #[cfg(feature = "runtime")]
        Command::Perplexity(a) => perplexity::run(&a),
        #[cfg(feature = "runtime")]
        Command::DraftCalibration(a) => draft_calibration::run(&a),
        #[cfg(feature = "runtime")]
        Command::Plan(a) => plan::run(&a),
        #[cfg(feature = "server")]
        Command::Serve(a) => serve::run(&a),
        #[cfg(feature = "server")]
        Command::BenchServe(a) => bench_serve::run(&a),
    }
}
