//! From the engine thread to a request's HTTP task: an [`EventSink`] that hands events to a
//! tokio channel (never blocking the step loop), and the receiving side that waits for
//! them and keeps the request's latency figures.

use super::metrics::ServerMetrics;
use crate::runtime::{EngineError, EventSink, Output, StreamEvent};
use deepinfer_recipe::Event;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// What the HTTP task receives.
#[derive(Debug)]
pub(crate) enum Update {
    /// An engine event (text deltas come as their `Parsed` events only).
    Event(StreamEvent),
    /// The request could not run.
    Failed(String),
}

/// The engine side: `false` from `event` once the HTTP task is gone aborts the request.
pub(crate) struct ChannelSink {
    tx: mpsc::UnboundedSender<Update>,
}

impl EventSink for ChannelSink {
    fn event(&mut self, ev: &StreamEvent) -> bool {
        match ev {
            // Duplicates of their `Parsed` events: not sent, but a closed channel still aborts.
            StreamEvent::Text { .. } | StreamEvent::Reasoning { .. } => !self.tx.is_closed(),
            _ => self.tx.send(Update::Event(ev.clone())).is_ok(),
        }
    }

    fn failed(&mut self, err: &EngineError) {
        let _ = self.tx.send(Update::Failed(err.to_string()));
    }
}

/// A pair: the sink for the engine, the receiver for the HTTP task.
pub(crate) fn channel() -> (ChannelSink, mpsc::UnboundedReceiver<Update>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (ChannelSink { tx }, rx)
}

/// A generated token, its log-probability and its best alternatives.
pub(crate) type TokLogprob = (u32, f32, Vec<(u32, f32)>);

/// One step of a request's progress, as the HTTP task sees it.
#[derive(Debug)]
pub(crate) enum Progress {
    /// A parser event of sample `index`, with the log-probabilities of the tokens generated
    /// since the previous one (when the request asked for them).
    Parsed {
        index: usize,
        event: Event,
        logprobs: Vec<TokLogprob>,
    },
    /// Every sample has finished: outputs in index order.
    Done(Vec<Output>),
    /// The request failed (engine error or shutdown).
    Failed(String),
}

/// The HTTP side of one request: events in, progress out, latency figures recorded.
pub(crate) struct Tracker {
    rx: mpsc::UnboundedReceiver<Update>,
    samples: usize,
    outs: Vec<Output>,
    pending: Vec<TokLogprob>,
    scheduled: bool,
    want_logprobs: bool,
    arrived: Instant,
    last_token: Option<Instant>,
    metrics: Arc<ServerMetrics>,
}

impl Tracker {
    /// Track a request of `samples` choices that arrived at `arrived`.
    pub fn new(
        rx: mpsc::UnboundedReceiver<Update>,
        samples: usize,
        want_logprobs: bool,
        arrived: Instant,
        metrics: Arc<ServerMetrics>,
    ) -> Self {
        Self {
            rx,
            samples: samples.max(1),
            outs: Vec::new(),
            pending: Vec::new(),
            scheduled: false,
            want_logprobs,
            arrived,
            last_token: None,
            metrics,
        }
    }

    /// The next step; `Done` or `Failed` is the last.
    pub async fn next(&mut self) -> Progress {
        loop {
            let Some(u) = self.rx.recv().await else {
                return Progress::Failed("the engine stopped".into());
            };
            match u {
                Update::Failed(m) => return Progress::Failed(m),
                Update::Event(StreamEvent::Scheduled { .. }) => {
                    if !self.scheduled {
                        self.scheduled = true;
                        self.metrics.queue_time(self.arrived.elapsed());
                    }
                }
                Update::Event(StreamEvent::Token {
                    logprob,
                    token,
                    top,
                    ..
                }) => {
                    let now = Instant::now();
                    match self.last_token {
                        None => self.metrics.ttft(now - self.arrived),
                        Some(t) => self.metrics.inter_token(now - t),
                    }
                    self.last_token = Some(now);
                    if self.want_logprobs {
                        self.pending.push((token, logprob, top));
                    }
                }
                Update::Event(StreamEvent::Parsed { index, event, .. }) => {
                    return Progress::Parsed {
                        index,
                        event,
                        logprobs: std::mem::take(&mut self.pending),
                    };
                }
                Update::Event(StreamEvent::Finished(o)) => {
                    self.outs.push(*o);
                    if self.outs.len() == self.samples {
                        let mut outs = std::mem::take(&mut self.outs);
                        outs.sort_by_key(|o| o.index);
                        self.metrics.finished(&outs, self.arrived.elapsed());
                        return Progress::Done(outs);
                    }
                }
                Update::Event(_) => {}
            }
        }
    }
}
