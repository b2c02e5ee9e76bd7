//! What the step loop reports (stream events) and how it is driven: offline, or by the
//! online engine's commands.

use super::*;

/// One streamed event of [`Engine::generate_stream`].
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// A token was generated.
    Token {
        /// The request.
        id: RequestId,
        /// The token.
        token: u32,
        /// Its log-probability.
        logprob: f32,
        /// The best alternatives (`sampling.top_logprobs` of them, when log-probabilities
        /// were asked for).
        top: Vec<(u32, f32)>,
    },
    /// Answer text.
    Text {
        /// The request.
        id: RequestId,
        /// Text delta.
        delta: String,
    },
    /// Reasoning text.
    Reasoning {
        /// The request.
        id: RequestId,
        /// Text delta.
        delta: String,
    },
    /// A stream-parser event of one of the request's samples (answer or reasoning text,
    /// tool-call start, arguments and end, finish), in order: what a protocol's streaming
    /// renderer (`deepinfer_recipe::protocol`) consumes. Every `Text` and `Reasoning` event
    /// also comes as one of these.
    Parsed {
        /// The request.
        id: RequestId,
        /// Which of its `n` samples.
        index: usize,
        /// The event.
        event: Event,
    },
    /// The request was planned into a step for the first time (its queueing ended).
    Scheduled {
        /// The request.
        id: RequestId,
    },
    /// The request finished.
    Finished(Box<Output>),
}

impl StreamEvent {
    /// The request the event belongs to.
    pub fn request(&self) -> RequestId {
        match self {
            StreamEvent::Token { id, .. }
            | StreamEvent::Text { id, .. }
            | StreamEvent::Reasoning { id, .. }
            | StreamEvent::Parsed { id, .. }
            | StreamEvent::Scheduled { id } => *id,
            StreamEvent::Finished(o) => o.id,
        }
    }
}

/// What the step loop serves: where events go and, between steps, what joins or leaves.
pub(crate) trait Driver {
    /// An event of a request; `false` aborts the request.
    fn event(&mut self, ev: &StreamEvent) -> bool;
    /// Commands that arrived since the last call; with `wait`, block until one does.
    /// `None`: no more will come (the loop ends once no request is left).
    fn poll(&mut self, wait: bool) -> Option<Vec<Command>>;
    /// While a step computes: wait until `done` receives (the step is done: `None`) or
    /// commands arrive first (`Some`; the step may still be computing). A driver that takes
    /// nothing between steps just waits for the step.
    fn wait_step(&mut self, done: &crossbeam_channel::Receiver<()>) -> Option<Vec<Command>> {
        let _ = done.recv();
        None
    }
    /// A submitted request could not be admitted.
    fn rejected(&mut self, id: RequestId, err: EngineError);
    /// The scheduler's queue lengths and the engine's counters, before each plan.
    fn observe(&mut self, running: usize, waiting: usize, metrics: &Metrics);
    /// Whether the device loop may live on a thread of rayon's pool for the whole run.
    fn park_on_pool(&self) -> bool {
        true
    }
}

/// A command to the step loop from outside (see [`super::online`]).
pub(crate) enum Command {
    /// Admit a request (its id unique among live ones).
    Submit(Box<Request>),
    /// End a request now; it finishes as [`FinishReason::Aborted`].
    Abort(RequestId),
    /// End every live request now.
    AbortAll,
    /// Forget every cached prefix ([`Engine::reset_prefix_cache`]).
    ResetPrefixCache,
}

/// The offline driver: a fixed set of requests, events to a callback.
pub(super) struct Offline<F>(pub(super) F);

impl<F: FnMut(&StreamEvent) -> bool> Driver for Offline<F> {
    fn event(&mut self, ev: &StreamEvent) -> bool {
        (self.0)(ev)
    }
    fn poll(&mut self, _wait: bool) -> Option<Vec<Command>> {
        None
    }
    fn rejected(&mut self, _id: RequestId, _err: EngineError) {}
    fn observe(&mut self, _running: usize, _waiting: usize, _metrics: &Metrics) {}
}

impl<B: Backend> Engine<B>
where
    B::Tensor: Clone,
{
    /// Apply the driver's commands; `false` when it has closed.
    pub(super) fn take_commands(
        &mut self,
        driver: &mut dyn Driver,
        live: &mut HashMap<u64, Live<B::Tensor>>,
        t0: Instant,
        wait: bool,
    ) -> bool {
        let Some(cmds) = driver.poll(wait) else {
            return false;
        };
        self.apply_commands(cmds, driver, live, t0);
        true
    }

    /// Admit, abort and reset as `cmds` say.
    pub(super) fn apply_commands(
        &mut self,
        cmds: Vec<Command>,
        driver: &mut dyn Driver,
        live: &mut HashMap<u64, Live<B::Tensor>>,
        t0: Instant,
    ) {
        for c in cmds {
            match c {
                Command::Submit(r) => {
                    let r = *r;
                    let id = r.id;
                    if let Err(e) = self.check_request(&r).and_then(|()| self.admit(r, live)) {
                        driver.rejected(id, e);
                    }
                }
                Command::Abort(id) => self.abort_user(&[id], live, t0, driver),
                Command::AbortAll => {
                    let mut ids: Vec<RequestId> = live.values().map(|l| l.user_id).collect();
                    ids.sort_unstable();
                    ids.dedup();
                    self.abort_user(&ids, live, t0, driver);
                }
                Command::ResetPrefixCache => self.reset_prefix_cache(),
            }
        }
    }

    /// End the live samples of requests `ids` (their blocks go back to the pool now; a row
    /// of theirs in flight is ignored when it returns).
    pub(super) fn abort_user(
        &mut self,
        ids: &[RequestId],
        live: &mut HashMap<u64, Live<B::Tensor>>,
        t0: Instant,
        driver: &mut dyn Driver,
    ) {
        let mut sids: Vec<u64> = live
            .iter()
            .filter(|(_, l)| ids.contains(&l.user_id))
            .map(|(&sid, _)| sid)
            .collect();
        sids.sort_unstable();
        let finished: Vec<Finished> = sids
            .into_iter()
            .filter_map(|sid| self.sched.abort(sid).ok())
            .collect();
        finish_all(finished, live, t0, &mut |e| driver.event(e));
    }
}
