//! `deepinfer serve`: the engine behind OpenAI- and Anthropic-compatible HTTP (see
//! [`crate::server`]). With no flags: the embedded default model on 127.0.0.1:8000.

use super::CliResult;
use super::backend::{self, BackendArg};
use super::engine_args::{EngineArgs, Loaded};
use crate::runtime::OnlineEngine;
use crate::server::{AppState, ServerConfig, serve};
use clap::Args;
use deepinfer_kernels::{Backend, CpuBackend};
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `deepinfer serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The model name `/v1/models` lists (default: the model directory's name, or
    /// `deepinfer` for the embedded model).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Requests that may wait beyond the running batch; more get 429.
    #[arg(long, default_value_t = 256)]
    pub max_queued_requests: usize,
    /// Largest request body, bytes; larger ones get 413.
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Seconds to let in-flight requests finish after SIGINT or SIGTERM before the rest are
    /// aborted.
    #[arg(long, default_value_t = 60.0)]
    pub shutdown_grace: f64,
    /// The model and the engine.
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// Run `deepinfer serve`.
pub fn run(a: &ServeArgs) -> CliResult {
    if !(a.shutdown_grace.is_finite() && a.shutdown_grace >= 0.0) {
        return Err(format!("--shutdown-grace {} is not a duration", a.shutdown_grace).into());
    }
    let cpu = a.engine.cpu_config();
    match a.engine.backend {
        BackendArg::Cpu => run_on(a, CpuBackend::with_config(cpu)?),
        BackendArg::Cuda => run_on(a, backend::cuda(cpu)?),
    }
}

fn run_on<B>(a: &ServeArgs, be: B) -> CliResult
where
    B: Backend + Send + 'static,
    B::Tensor: Clone + Send,
{
    let Loaded {
        engine,
        front,
        label,
        load_s,
    } = a.engine.load(be)?;
    let name = a.served_model_name.clone().unwrap_or_else(|| {
        a.engine
            .model
            .as_ref()
            .and_then(|d| d.file_name())
            .map_or_else(|| "deepinfer".into(), |n| n.to_string_lossy().into_owned())
    });
    let pool = super::engine_args::pool_line(&engine.kv_pool(), a.engine.max_num_seqs);
    let online = Arc::new(OnlineEngine::start(engine, a.max_queued_requests));
    let state = AppState::new(
        online.clone(),
        front,
        ServerConfig {
            model_name: name.clone(),
            max_body_bytes: a.max_body_bytes,
            seed: a.engine.seed,
        },
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let grace = Duration::from_secs_f64(a.shutdown_grace);
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port))
            .await
            .map_err(|e| format!("cannot listen on {}:{}: {e}", a.host, a.port))?;
        let addr = listener.local_addr()?;
        eprintln!("model: {label} (ready in {load_s:.1} s), served as '{name}'");
        eprintln!("{pool}");
        eprintln!("listening on http://{addr}");
        let drain = online.clone();
        let shutdown = async move {
            stop_signal().await;
            eprintln!(
                "draining: finishing in-flight requests for up to {:.0} s",
                grace.as_secs_f64()
            );
            let aborted = tokio::task::spawn_blocking(move || drain.shutdown(grace))
                .await
                .unwrap_or(0);
            if aborted > 0 {
                eprintln!("aborted {aborted} request(s) still running after the grace period");
            }
        };
        serve(listener, state, shutdown).await?;
        Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    })?;
    eprintln!("stopped");
    Ok(())
}

/// SIGINT (Ctrl-C) or, on Unix, SIGTERM.
async fn stop_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return ctrl_c.await,
            };
        tokio::select! {
            () = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await;
}
