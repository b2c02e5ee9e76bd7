//! `deepinfer serve`: the engine online behind OpenAI- and Anthropic-compatible HTTP.
//!
//! ```no_run
//! # async fn run(online: std::sync::Arc<deepinfer_engine::runtime::OnlineEngine>,
//! #              front: deepinfer_engine::runtime::ChatFrontend) -> std::io::Result<()> {
//! use deepinfer_engine::server::{AppState, ServerConfig, serve};
//! let state = AppState::new(online, front, ServerConfig::default());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8000").await?;
//! serve(listener, state, std::future::pending()).await
//! # }
//! ```
//!
//! Routes: `POST /v1/chat/completions`, `/v1/responses`, `/v1/messages` (Anthropic),
//! `/v1/completions`, `/tokenize`, `/detokenize`; `GET /v1/models`, `/health`, `/metrics`.
//! Each generation request is handed to the [`OnlineEngine`] at once and answered as its
//! events arrive (server-sent events when the body asks to stream). The step loop never
//! waits for the network: events go through an unbounded channel per request, and a client
//! that goes away aborts its request. Bad bodies get 400 in the protocol's error shape (the
//! Anthropic shape on `/v1/messages`), bodies over the size bound 413, a full queue 429 and
//! a draining server 503; the server keeps serving.

mod error;
mod generate;
mod metrics;
mod misc;
mod render;
mod sink;

pub use error::ApiError;
pub use metrics::ServerMetrics;

use crate::runtime::{ChatFrontend, OnlineEngine};
use axum::Router;
use axum::http::{HeaderMap, StatusCode, header};
use axum::routing::{get, post};
use deepinfer_recipe::protocol::Protocol;
use serde_json::Value;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The model name `/v1/models` lists (any requested name is served by the one model).
    pub model_name: String,
    /// Largest request body, bytes; larger ones get 413.
    pub max_body_bytes: usize,
    /// Base of the seeds of requests that do not set one.
    pub seed: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            model_name: "deepinfer".into(),
            max_body_bytes: 4 << 20,
            seed: 0,
        }
    }
}

/// What every handler shares.
pub struct AppState {
    online: Arc<OnlineEngine>,
    front: ChatFrontend,
    cfg: ServerConfig,
    metrics: Arc<ServerMetrics>,
    seeds: AtomicU64,
    ids: AtomicU64,
    started: u64,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl AppState {
    /// The state of a server over `online`, converting bodies with `front`.
    pub fn new(online: Arc<OnlineEngine>, front: ChatFrontend, cfg: ServerConfig) -> Arc<Self> {
        Arc::new(Self {
            online,
            front,
            metrics: Arc::new(ServerMetrics::new()),
            seeds: AtomicU64::new(cfg.seed),
            ids: AtomicU64::new(0),
            started: unix_now(),
            cfg,
        })
    }

    /// The engine handle.
    pub fn online(&self) -> &Arc<OnlineEngine> {
        &self.online
    }

    /// A seed for a request that sets none (a fresh one each request).
    fn next_seed(&self) -> u64 {
        let n = self.seeds.fetch_add(1, Ordering::Relaxed);
        n.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x5EED
    }

    /// A response id with `prefix`, unique in this server's life.
    fn next_id(&self, prefix: &str) -> String {
        let n = self.ids.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}{:x}{n:06x}", self.started)
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The routes over `state`.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(generate::chat))
        .route("/v1/responses", post(generate::responses))
        .route("/v1/messages", post(generate::messages))
        .route("/v1/completions", post(generate::completions))
        .route("/v1/models", get(misc::models))
        .route("/health", get(misc::health))
        .route("/tokenize", post(misc::tokenize))
        .route("/detokenize", post(misc::detokenize))
        .route("/metrics", get(misc::metrics))
        .route("/reset_prefix_cache", post(misc::reset_prefix_cache))
        .fallback(misc::not_found)
        .method_not_allowed_fallback(misc::method_not_allowed)
        .with_state(state)
}

/// Serve `state` on `listener` until `shutdown` completes, then finish the open
/// connections. (Drain the engine first with [`OnlineEngine::shutdown`] inside `shutdown`
/// to bound how long that takes.)
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

/// The body as a JSON object, or the protocol's 400 / 413.
async fn read_json(
    headers: &HeaderMap,
    body: axum::body::Body,
    limit: usize,
    protocol: Protocol,
) -> Result<Value, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            protocol,
            format!("the request body is larger than {limit} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let bytes = axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| too_large())?;
    let v: Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(protocol, format!("invalid JSON body: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad_request(
            protocol,
            "the request body must be a JSON object",
        ));
    }
    Ok(v)
}
