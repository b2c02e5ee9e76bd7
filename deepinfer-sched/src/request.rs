//! What goes in and out of the scheduler: requests, step plans and step outputs.

use deepinfer_kv::CopyOp;

/// A request id, chosen by the caller and unique among live requests.
pub type RequestId = u64;

/// A request submitted to the scheduler.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRequest {
    /// Caller-chosen id.
    pub id: RequestId,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Most tokens to generate.
    pub max_new_tokens: usize,
    /// Larger runs first; equal priorities are first come, first served.
    pub priority: i32,
    /// Generation stops after any of these tokens (the token is kept in the output).
    pub stop_tokens: Vec<u32>,
}

impl NewRequest {
    /// A request with priority 0 and no stop tokens.
    pub fn new(id: RequestId, prompt: Vec<u32>, max_new_tokens: usize) -> Self {
        Self {
            id,
            prompt,
            max_new_tokens,
            priority: 0,
            stop_tokens: Vec::new(),
        }
    }
}

/// Why a request left the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// A stop token, or the engine reported a stop (stop string, grammar end).
    Stop,
    /// `max_new_tokens` or the context limit was reached.
    Length,
    /// Aborted by the caller.
    Aborted,
}

/// A finished request and everything it generated.
///
/// The request's history is handed over as it is, prompt first, without a
/// copy: [`Finished::output`] is the generated part. (Copying the output out
/// of a long history reads lines written hundreds of steps ago, a cost the
/// scheduler would pay for every finished request whether the caller needs an
/// owned vector or not.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// The request.
    pub id: RequestId,
    /// Why it finished.
    pub reason: FinishReason,
    /// The whole history: the prompt's `prompt_len` tokens, then the
    /// generated ones.
    pub tokens: Vec<u32>,
    /// Prompt tokens at the front of `tokens`.
    pub prompt_len: usize,
}

impl Finished {
    /// The generated tokens (prompt excluded).
    pub fn output(&self) -> &[u32] {
        self.tokens.get(self.prompt_len..).unwrap_or(&[])
    }

    /// The generated tokens as a vector of their own, reusing the history's
    /// buffer (the output is moved to its front).
    pub fn into_output(self) -> Vec<u32> {
        let mut t = self.tokens;
        t.drain(..self.prompt_len.min(t.len()));
        t
    }
}

/// A chunk of prompt (or recompute) tokens: positions `start .. start + len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillChunk {
    /// The request.
    pub request: RequestId,
    /// First position.
    pub start: usize,
    /// Number of tokens.
    pub len: usize,
    /// The chunk reaches the end of the known tokens, so its last row samples a token.
    pub samples: bool,
}

/// One decode row (the input token at `position`) plus `drafts` draft rows after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeRow {
    /// The request.
    pub request: RequestId,
    /// Position of the input token. Provisional when the input token is still being
    /// sampled by a step in flight (overlapped scheduling); `update` of that step
    /// confirms or fixes it.
    pub position: usize,
    /// Draft rows verified after the input row, at positions `position + 1 ..= position + drafts`.
    pub drafts: usize,
    /// Whether `position` and the input token are placeholders (see above).
    pub provisional: bool,
}

/// Everything one engine step runs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepPlan {
    /// Step number (starts at 0).
    pub step: u64,
    /// Prefill chunks, in row order.
    pub prefill: Vec<PrefillChunk>,
    /// Decode rows, in row order after the prefill chunks.
    pub decode: Vec<DecodeRow>,
    /// Block copies to perform before the step (copy-on-write forks).
    pub block_copies: Vec<CopyOp>,
    /// Requests preempted by this step (their blocks are freed; they will be recomputed).
    pub preempted: Vec<RequestId>,
    /// Requests aborted since the previous plan.
    pub aborted: Vec<RequestId>,
    /// Tokens (rows) in the step, drafts included.
    pub num_tokens: usize,
    /// The cost model's predicted step time, when a cost model is set.
    pub predicted_ms: Option<f64>,
}

impl StepPlan {
    /// Number of row groups (prefill chunks + decode rows); the length a [`StepOutput`] must have.
    pub fn num_groups(&self) -> usize {
        self.prefill.len() + self.decode.len()
    }

    /// Request of every row group in output order.
    pub fn requests(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.prefill
            .iter()
            .map(|c| c.request)
            .chain(self.decode.iter().map(|d| d.request))
    }

    /// Whether the plan runs nothing.
    pub fn is_empty(&self) -> bool {
        self.prefill.is_empty() && self.decode.is_empty()
    }
}

/// The result of one row group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowOutput {
    /// The request (checked against the plan).
    pub request: RequestId,
    /// How many tokens of [`StepOutput::tokens`] belong to this row group: 0 for a
    /// prefill chunk that does not sample; `1 + accepted drafts` for a decode row.
    pub num_tokens: u32,
    /// How many entries of [`StepOutput::confidences`] belong to it (the drafter's
    /// confidences for the next step, used by budgeted speculation).
    pub num_confidences: u32,
    /// The engine saw a stop (stop string, grammar end) at the last token.
    pub stop: bool,
}

/// What a step produced, in the plan's row-group order (flat buffers, so building
/// one costs no allocation per row).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepOutput {
    /// The step number of the plan.
    pub step: u64,
    /// One entry per row group of the plan, in order.
    pub rows: Vec<RowOutput>,
    /// Sampled tokens of all rows, concatenated.
    pub tokens: Vec<u32>,
    /// Draft confidences of all rows, concatenated.
    pub confidences: Vec<f64>,
    /// Measured step time in ms, fed to the cost models.
    pub step_ms: Option<f64>,
    /// Dense form of the decode rows' results (the fast path of a decode loop):
    /// when not empty, it holds exactly one sampled token per decode row of the
    /// plan, in the plan's order, and `rows` / `tokens` / `confidences` hold only
    /// the prefill chunks' groups. The dense form carries no accepted drafts,
    /// stop flags or confidences, and `update` checks only its length (not the
    /// request of each row); a step that needs any of those uses `rows` for every
    /// row group. Fill it with [`StepOutput::push_decode`].
    pub decode_tokens: Vec<u32>,
}

impl StepOutput {
    /// An empty output for `step`.
    pub fn new(step: u64) -> Self {
        Self {
            step,
            ..Default::default()
        }
    }

    /// Append a row group's result.
    #[inline]
    pub fn push(&mut self, request: RequestId, tokens: &[u32], stop: bool) {
        self.push_with_confidences(request, tokens, stop, &[]);
    }

    /// Append a row group's result with the drafter's confidences for its next step.
    #[inline]
    pub fn push_with_confidences(
        &mut self,
        request: RequestId,
        tokens: &[u32],
        stop: bool,
        confidences: &[f64],
    ) {
        self.rows.push(RowOutput {
            request,
            num_tokens: tokens.len() as u32,
            num_confidences: confidences.len() as u32,
            stop,
        });
        // One token is the common row: a push, not a copy call.
        if let [t] = tokens {
            self.tokens.push(*t);
        } else {
            self.tokens.extend_from_slice(tokens);
        }
        if !confidences.is_empty() {
            self.confidences.extend_from_slice(confidences);
        }
    }

    /// Append the result of a row group that sampled exactly one token (a decode
    /// row without accepted drafts, or a chunk that reaches the end of its prompt):
    /// the cheapest way to build an output in a decode loop.
    #[inline]
    pub fn push_token(&mut self, request: RequestId, token: u32, stop: bool) {
        self.rows.push(RowOutput {
            request,
            num_tokens: 1,
            num_confidences: 0,
            stop,
        });
        self.tokens.push(token);
    }

    /// Append the sampled token of the next decode row in dense form (see
    /// [`StepOutput::decode_tokens`]): the prefill chunks' groups go through
    /// [`StepOutput::push`], the decode rows through this, in plan order.
    #[inline]
    pub fn push_decode(&mut self, token: u32) {
        self.decode_tokens.push(token);
    }

    /// Clear for reuse.
    pub fn clear(&mut self, step: u64) {
        self.step = step;
        self.rows.clear();
        self.tokens.clear();
        self.confidences.clear();
        self.decode_tokens.clear();
        self.step_ms = None;
    }
}

/// A change `update` made to the plan still waiting to run (overlapped scheduling).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanFix {
    /// The row group of this request must not run (it finished, was aborted or preempted).
    Cancel(RequestId),
    /// The decode row's input token is now known at this position.
    Position {
        /// The request.
        request: RequestId,
        /// Its real position.
        position: usize,
    },
}

/// What `update` reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpdateResult {
    /// Requests that finished with this step.
    pub finished: Vec<Finished>,
    /// Fixes to the pending plan (empty unless one is pending).
    pub fixes: Vec<PlanFix>,
    /// Requests preempted while reconciling the pending plan.
    pub preempted: Vec<RequestId>,
    /// Fixes to the plan after the pending one, when two plans are pending
    /// (two-step overlap): cancellations, and a `Position` for each of its
    /// provisional rows confirmed already (its request had no row in the
    /// pending plan); apply them with [`UpdateResult::apply_later_to`].
    pub later_fixes: Vec<PlanFix>,
}

impl UpdateResult {
    /// Apply [`UpdateResult::later_fixes`] to the plan after the pending one
    /// (two-step overlap): drop its cancelled row groups and confirm the rows
    /// given a position; its other provisional rows stay provisional until the
    /// next `update` confirms them.
    pub fn apply_later_to(&self, plan: &mut StepPlan) {
        if self.later_fixes.is_empty() {
            return;
        }
        apply_fixes(&self.later_fixes, plan, false);
    }

    /// Apply the fixes to the pending plan: drop cancelled row groups, set the
    /// confirmed positions and clear their provisional flags.
    pub fn apply_to(&self, plan: &mut StepPlan) {
        if self.fixes.is_empty() && !plan.decode.iter().any(|d| d.provisional) {
            return;
        }
        apply_fixes(&self.fixes, plan, true);
    }
}

/// Drop the cancelled row groups of `plan`, set the confirmed positions (those rows are no
/// longer provisional) and recount its tokens; with `confirm_all`, every row is confirmed.
fn apply_fixes(fixes: &[PlanFix], plan: &mut StepPlan, confirm_all: bool) {
    let mut pos = std::collections::HashMap::new();
    let mut cancel = std::collections::HashSet::new();
    for f in fixes {
        match *f {
            PlanFix::Cancel(r) => {
                cancel.insert(r);
            }
            PlanFix::Position { request, position } => {
                pos.insert(request, position);
            }
        }
    }
    plan.prefill.retain(|c| !cancel.contains(&c.request));
    plan.decode.retain(|d| !cancel.contains(&d.request));
    for d in &mut plan.decode {
        if let Some(&p) = pos.get(&d.request) {
            d.position = p;
            d.provisional = false;
        } else if confirm_all {
            d.provisional = false;
        }
    }
    plan.num_tokens = plan.prefill.iter().map(|c| c.len).sum::<usize>()
        + plan.decode.iter().map(|d| 1 + d.drafts).sum::<usize>();
}
