//! The engine online: a handle that takes requests while the step loop runs.
//!
//! [`OnlineEngine::start`] moves an [`Engine`] onto a thread of its own, where the step
//! loop runs for the life of the handle. [`OnlineEngine::submit`] hands it a request and an
//! [`EventSink`]; the request joins the next step that has not launched (arriving while a
//! step computes, it joins the step planned to follow, before that one launches) and its
//! events (tokens, parser events, the finished output) go to the sink as they happen. A
//! sink that answers `false` (its client went away) or [`OnlineEngine::abort`] ends the
//! request between two steps, and its KV blocks go back to the pool at once. No call on
//! the handle waits for a step: submitting, aborting and reading the gauges only touch a
//! channel and atomics.
//!
//! ```no_run
//! use deepinfer_engine::Model;
//! use deepinfer_engine::runtime::{
//!     Engine, EngineConfig, EngineError, EventSink, GenParams, OnlineEngine, Request,
//!     StreamEvent,
//! };
//! use deepinfer_kernels::CpuBackend;
//!
//! struct Print;
//! impl EventSink for Print {
//!     fn event(&mut self, ev: &StreamEvent) -> bool {
//!         if let StreamEvent::Finished(o) = ev {
//!             println!("{:?}", o.token_ids);
//!         }
//!         true
//!     }
//!     fn failed(&mut self, err: &EngineError) {
//!         eprintln!("{err}");
//!     }
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let model = Model::load(std::path::Path::new("model-dir"), CpuBackend::new())?;
//! let online = OnlineEngine::start(Engine::new(model, EngineConfig::default())?, 64);
//! online.submit(Request::new(0, vec![1, 2, 3], GenParams::greedy(8)), Box::new(Print))?;
//! online.shutdown(std::time::Duration::from_secs(60));
//! # Ok(())
//! # }
//! ```

use super::engine::{Command, Driver, Engine, EngineError, Metrics, StreamEvent};
use super::request::{Request, RequestId};
use crossbeam_channel as channel;
use deepinfer_kernels::Backend;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Where one request's events go. Called on the engine's thread, between steps: it must
/// not block (hand the event to a channel).
pub trait EventSink: Send {
    /// An event of the request. `false` aborts it (the client has gone).
    fn event(&mut self, ev: &StreamEvent) -> bool;
    /// The request could not run: it was rejected on admission, or the engine stopped.
    fn failed(&mut self, err: &EngineError);
}

/// Why a request was not taken.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// Requests beyond the running batch and the queue bound.
    #[error("the engine's queue is full ({0} requests outstanding)")]
    QueueFull(usize),
    /// The engine is shutting down or has stopped.
    #[error("the engine is not accepting requests")]
    Closed,
    /// The request cannot run on this engine (prompt, vocabulary, limits, parameters).
    #[error(transparent)]
    Invalid(EngineError),
}

/// Gauges and counters the engine thread keeps up to date.
#[derive(Debug, Default)]
struct Shared {
    running: AtomicUsize,
    waiting: AtomicUsize,
    /// Submitted requests that have not finished.
    outstanding: AtomicUsize,
    preemptions: AtomicU64,
    draft_tokens: AtomicU64,
    accepted_drafts: AtomicU64,
    /// Set when the step loop ended with an error.
    failed: AtomicBool,
    accepting: AtomicBool,
}

/// A snapshot of the engine's gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OnlineStats {
    /// Sequences in the running batch (a request with `n > 1` counts `n`).
    pub running: usize,
    /// Sequences waiting for admission to the batch.
    pub waiting: usize,
    /// Requests submitted and not finished (queued in the channel included).
    pub outstanding: usize,
    /// Preemptions so far.
    pub preemptions: u64,
    /// Draft tokens proposed so far (speculative decoding).
    pub draft_tokens: u64,
    /// Draft tokens accepted so far.
    pub accepted_drafts: u64,
    /// The step loop stopped with an error (the engine serves nothing more).
    pub failed: bool,
}

/// The engine's request check, kept by the handle.
type Checker = dyn Fn(&Request) -> Result<(), EngineError> + Send + Sync;

/// The handle of an engine running on its own thread.
pub struct OnlineEngine {
    tx: Mutex<Option<channel::Sender<Msg>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    shared: Arc<Shared>,
    next_id: AtomicU64,
    /// Most outstanding requests before [`SubmitError::QueueFull`].
    limit: usize,
    max_model_len: usize,
    check: Box<Checker>,
}

impl std::fmt::Debug for OnlineEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnlineEngine")
            .field("stats", &self.stats())
            .field("limit", &self.limit)
            .finish()
    }
}

enum Msg {
    Submit(Box<Request>, Box<dyn EventSink>),
    Abort(RequestId),
    AbortAll,
    ResetPrefixCache,
}

impl OnlineEngine {
    /// Start the step loop of `engine` on a thread of its own. At most
    /// `max_num_seqs + max_queued` requests are outstanding at once; more are refused with
    /// [`SubmitError::QueueFull`] instead of queueing without bound.
    pub fn start<B>(engine: Engine<B>, max_queued: usize) -> Self
    where
        B: Backend + Send + 'static,
        B::Tensor: Clone + Send,
    {
        let (tx, rx) = channel::unbounded();
        let shared = Arc::new(Shared {
            accepting: AtomicBool::new(true),
            ..Shared::default()
        });
        let limit = engine.config().max_num_seqs + max_queued;
        let max_model_len = engine.config().max_model_len;
        let checker = engine.request_checker();
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("deepinfer-engine".into())
            .spawn(move || run(engine, rx, sh))
            .expect("spawning the engine thread");
        Self {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            shared,
            next_id: AtomicU64::new(0),
            limit,
            max_model_len,
            check: Box::new(checker),
        }
    }

    /// Submit a request; its id is replaced by a fresh one, which is returned (abort and
    /// events use it). Invalid requests are refused here, before they reach the loop.
    pub fn submit(
        &self,
        mut request: Request,
        sink: Box<dyn EventSink>,
    ) -> Result<RequestId, SubmitError> {
        if !self.shared.accepting.load(Ordering::Acquire)
            || self.shared.failed.load(Ordering::Acquire)
        {
            return Err(SubmitError::Closed);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        request.id = id;
        (self.check)(&request).map_err(SubmitError::Invalid)?;
        let out = self.shared.outstanding.fetch_add(1, Ordering::AcqRel);
        if out >= self.limit {
            self.shared.outstanding.fetch_sub(1, Ordering::AcqRel);
            return Err(SubmitError::QueueFull(out));
        }
        let sent = self.tx.lock().ok().and_then(|g| {
            g.as_ref()
                .map(|tx| tx.send(Msg::Submit(Box::new(request), sink)).is_ok())
        });
        if sent != Some(true) {
            self.shared.outstanding.fetch_sub(1, Ordering::AcqRel);
            return Err(SubmitError::Closed);
        }
        Ok(id)
    }

    /// End a request now (it finishes as aborted with what it generated so far). Unknown or
    /// finished ids are ignored.
    pub fn abort(&self, id: RequestId) {
        self.send(Msg::Abort(id));
    }

    /// Forget every cached prefix between two steps (requests in flight keep their state;
    /// the persistent tier keeps its files).
    pub fn reset_prefix_cache(&self) {
        self.send(Msg::ResetPrefixCache);
    }

    fn send(&self, m: Msg) {
        if let Ok(g) = self.tx.lock()
            && let Some(tx) = g.as_ref()
        {
            let _ = tx.send(m);
        }
    }

    /// The engine's gauges now.
    pub fn stats(&self) -> OnlineStats {
        OnlineStats {
            running: self.shared.running.load(Ordering::Acquire),
            waiting: self.shared.waiting.load(Ordering::Acquire),
            outstanding: self.shared.outstanding.load(Ordering::Acquire),
            preemptions: self.shared.preemptions.load(Ordering::Acquire),
            draft_tokens: self.shared.draft_tokens.load(Ordering::Acquire),
            accepted_drafts: self.shared.accepted_drafts.load(Ordering::Acquire),
            failed: self.shared.failed.load(Ordering::Acquire),
        }
    }

    /// The engine's context limit (prompt + generated tokens).
    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    /// Whether new requests are taken.
    pub fn is_accepting(&self) -> bool {
        self.shared.accepting.load(Ordering::Acquire) && !self.shared.failed.load(Ordering::Acquire)
    }

    /// Stop taking requests, let the outstanding ones finish for up to `grace`, abort the
    /// rest, and wait for the engine thread to end. Returns how many were aborted.
    pub fn shutdown(&self, grace: Duration) -> usize {
        self.shared.accepting.store(false, Ordering::Release);
        let deadline = Instant::now() + grace;
        while self.shared.outstanding.load(Ordering::Acquire) > 0
            && !self.shared.failed.load(Ordering::Acquire)
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        let left = self.shared.outstanding.load(Ordering::Acquire);
        if left > 0 {
            self.send(Msg::AbortAll);
        }
        // Closing the channel ends the loop once no request is left.
        if let Ok(mut g) = self.tx.lock() {
            g.take();
        }
        if let Some(t) = self.thread.lock().ok().and_then(|mut g| g.take()) {
            let _ = t.join();
        }
        left
    }
}

impl Drop for OnlineEngine {
    fn drop(&mut self) {
        if let Ok(mut g) = self.tx.lock()
            && let Some(tx) = g.take()
        {
            let _ = tx.send(Msg::AbortAll);
        }
        if let Some(t) = self.thread.lock().ok().and_then(|mut g| g.take()) {
            let _ = t.join();
        }
    }
}

/// The engine thread: the step loop with the channel as its driver; when the loop fails,
/// every outstanding request is told.
fn run<B>(mut engine: Engine<B>, rx: channel::Receiver<Msg>, shared: Arc<Shared>)
where
    B: Backend,
    B::Tensor: Clone,
{
    let mut d = Channel {
        rx,
        sinks: HashMap::new(),
        shared: shared.clone(),
    };
    if let Err(e) = engine.drive(Vec::new(), &mut d) {
        tracing::error!("the engine's step loop stopped: {e}");
        shared.failed.store(true, Ordering::Release);
        for (_, mut s) in d.sinks.drain() {
            s.sink.failed(&e);
        }
        // Requests still in the channel.
        while let Ok(m) = d.rx.try_recv() {
            if let Msg::Submit(_, mut sink) = m {
                sink.failed(&e);
            }
        }
        shared.outstanding.store(0, Ordering::Release);
    }
}

/// A request's sink and how many of its samples are still to finish.
struct Route {
    sink: Box<dyn EventSink>,
    left: usize,
}

/// The online driver: commands from the handle's channel, events to each request's sink.
struct Channel {
    rx: channel::Receiver<Msg>,
    sinks: HashMap<RequestId, Route>,
    shared: Arc<Shared>,
}

impl Channel {
    fn command(&mut self, m: Msg) -> Command {
        match m {
            Msg::Submit(r, sink) => {
                self.sinks.insert(
                    r.id,
                    Route {
                        sink,
                        left: r.params.n.max(1),
                    },
                );
                Command::Submit(r)
            }
            Msg::Abort(id) => Command::Abort(id),
            Msg::AbortAll => Command::AbortAll,
            Msg::ResetPrefixCache => Command::ResetPrefixCache,
        }
    }

    fn done(&mut self, id: RequestId) {
        if self.sinks.remove(&id).is_some() {
            self.shared.outstanding.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Driver for Channel {
    fn event(&mut self, ev: &StreamEvent) -> bool {
        let id = ev.request();
        let Some(route) = self.sinks.get_mut(&id) else {
            return false;
        };
        let keep = route.sink.event(ev);
        if matches!(ev, StreamEvent::Finished(_)) {
            route.left = route.left.saturating_sub(1);
            if route.left == 0 {
                self.done(id);
            }
        }
        keep
    }

    fn poll(&mut self, wait: bool) -> Option<Vec<Command>> {
        let mut out = Vec::new();
        if wait {
            match self.rx.recv() {
                Ok(m) => out.push(self.command(m)),
                Err(_) => return None,
            }
        }
        loop {
            match self.rx.try_recv() {
                Ok(m) => out.push(self.command(m)),
                Err(channel::TryRecvError::Empty) => return Some(out),
                Err(channel::TryRecvError::Disconnected) => {
                    return (!out.is_empty() || !self.sinks.is_empty()).then_some(out);
                }
            }
        }
    }

    fn wait_step(&mut self, done: &channel::Receiver<()>) -> Option<Vec<Command>> {
        channel::select! {
            recv(done) -> _ => None,
            recv(self.rx) -> m => match m {
                Ok(m) => {
                    let first = self.command(m);
                    // Whatever else is queued comes with it.
                    let mut out = self.poll(false).unwrap_or_default();
                    out.insert(0, first);
                    Some(out)
                }
                // Closed: only the step is left to wait for.
                Err(_) => {
                    let _ = done.recv();
                    None
                }
            },
        }
    }

    fn rejected(&mut self, id: RequestId, err: EngineError) {
        if let Some(r) = self.sinks.get_mut(&id) {
            r.sink.failed(&err);
        }
        self.done(id);
    }

    fn park_on_pool(&self) -> bool {
        false
    }

    fn observe(&mut self, running: usize, waiting: usize, m: &Metrics) {
        let sh = &self.shared;
        sh.running.store(running, Ordering::Release);
        sh.waiting.store(waiting, Ordering::Release);
        sh.preemptions.store(m.preemptions, Ordering::Release);
        sh.draft_tokens.store(m.draft_tokens, Ordering::Release);
        sh.accepted_drafts
            .store(m.accepted_drafts, Ordering::Release);
    }
}
