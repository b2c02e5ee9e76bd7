//! A running request's record, and its tokens parsed into the output it returns.

use super::*;

/// A request in flight.
pub(super) struct Live<T> {
    pub(super) user_id: RequestId,
    /// Which of the request's `n` samples.
    pub(super) index: usize,
    pub(super) fx: Arc<Fixed>,
    /// Fork group parent still to fork: its last prompt token is fed as a forced "output"
    /// (the scheduler holds the prompt minus that token), then `n - 1` children are forked.
    pub(super) forced: Option<u32>,
    /// Leading scheduler output tokens that are prompt, not generated (the forced token).
    pub(super) strip: usize,
    /// How children of a fork group are set up.
    pub(super) parsing: Option<ParsingOptions>,
    pub(super) grammar: Option<GrammarConstraint>,
    /// Where a prefix-hit snapshot is taken: the largest reusable prefix of this prompt.
    pub(super) cut: usize,
    /// Prompt tokens whose blocks were brought back into the device pool from a slower tier
    /// at admission, and that tier.
    pub(super) imported: Option<(usize, Tier)>,
    /// Model state, matcher, pending drafts, history: with the device worker during a step.
    pub(super) dev: Dev<T>,
    pub(super) parser: Option<StreamParser>,
    pub(super) logprobs: Vec<TokenLogprob>,
    /// Text, reasoning and tool calls parsed so far.
    pub(super) msg: Assembled,
    pub(super) cached: Option<usize>,
    pub(super) first_token: Option<f64>,
    pub(super) last_token: f64,
    /// Generated tokens parsed so far.
    pub(super) ngen: usize,
    /// Generated tokens the output keeps, once a stop sequence or an abort ended it.
    pub(super) kept: Option<usize>,
    /// A stop sequence ended the output.
    pub(super) stopped: bool,
}

/// What parsing a step's tokens found.
pub(super) struct Parsed {
    /// Tokens of the step kept (up to the one that completed a stop sequence).
    pub(super) used: usize,
    /// The caller asked to abort the request.
    pub(super) abort: bool,
    /// A stop sequence ended the output.
    pub(super) stopped: bool,
}

/// Feed a step's tokens to the request's output: log-probabilities, token events, the
/// stream parser. Tokens after a stop sequence are dropped.
pub(super) fn parse_tokens<T>(
    l: &mut Live<T>,
    toks: &[Tok],
    now: f64,
    metrics: &mut Metrics,
    on_event: &mut dyn FnMut(&StreamEvent) -> bool,
) -> Parsed {
    let mut keep = true;
    let mut used = 0;
    for (token, logprob, top) in toks {
        if l.kept.is_some() {
            break;
        }
        used += 1;
        l.ngen += 1;
        metrics.generated_tokens += 1;
        l.first_token.get_or_insert(now);
        l.last_token = now;
        if l.fx.params.logprobs {
            l.logprobs.push(TokenLogprob {
                token: *token,
                logprob: *logprob,
                top: top.clone(),
            });
        }
        keep &= on_event(&StreamEvent::Token {
            id: l.user_id,
            token: *token,
            logprob: *logprob,
            top: if l.fx.params.logprobs {
                top.clone()
            } else {
                Vec::new()
            },
        });
        if !l.fx.stop_tokens.contains(token)
            && let Some(parser) = l.parser.as_mut()
        {
            let evs = parser.push_tokens(&[*token]);
            let stopped = parser.is_stopped();
            keep &= apply_events(l, evs, on_event);
            if stopped {
                l.stopped = true;
                l.kept = Some(l.ngen);
            }
        }
    }
    if !keep && l.kept.is_none() {
        l.kept = Some(l.ngen);
    }
    Parsed {
        used,
        abort: !keep,
        stopped: l.stopped,
    }
}

/// Report finished requests (in order) and forget them.
pub(super) fn finish_all<T>(
    finished: Vec<Finished>,
    live: &mut HashMap<u64, Live<T>>,
    t0: Instant,
    on_event: &mut dyn FnMut(&StreamEvent) -> bool,
) {
    for f in finished {
        let Some(l) = live.remove(&f.id) else {
            continue;
        };
        let o = finish(l, f, ms_since(t0), on_event);
        on_event(&StreamEvent::Finished(Box::new(o)));
    }
}

/// Content-only parsing (no thinking, no tools, no stop sequences).
pub(super) fn plain_parsing() -> deepinfer_recipe::protocol::ParsingOptions {
    deepinfer_recipe::protocol::ParsingOptions {
        parse_tool_calls: false,
        starts_in_tool_calls: false,
        parse_json_output: false,
        thinking: None,
        stop_sequences: Vec::new(),
    }
}

/// Fold parser events into the request's output; returns whether the caller wants more.
pub(super) fn apply_events<T>(
    l: &mut Live<T>,
    evs: Vec<Event>,
    on_event: &mut dyn FnMut(&StreamEvent) -> bool,
) -> bool {
    let mut keep = true;
    for ev in evs {
        keep &= on_event(&StreamEvent::Parsed {
            id: l.user_id,
            index: l.index,
            event: ev.clone(),
        });
        match &ev {
            Event::Content(t) => {
                keep &= on_event(&StreamEvent::Text {
                    id: l.user_id,
                    delta: t.clone(),
                });
            }
            Event::Reasoning(t) => {
                keep &= on_event(&StreamEvent::Reasoning {
                    id: l.user_id,
                    delta: t.clone(),
                });
            }
            _ => {}
        }
        l.msg.push(&ev);
    }
    keep
}

/// The output of a finished request; the parser's last events (text it held back, the
/// finish) go to `on_event` first.
pub(super) fn finish<T>(
    mut l: Live<T>,
    f: Finished,
    now_ms: f64,
    on_event: &mut dyn FnMut(&StreamEvent) -> bool,
) -> Output {
    // A stop sequence seen after the next step was launched ends the request by abort.
    let reason = if l.stopped && f.reason == SchedFinish::Aborted {
        SchedFinish::Stop
    } else {
        f.reason
    };
    let backend = match reason {
        SchedFinish::Stop => Some(BackendFinish::Stop),
        SchedFinish::Length => Some(BackendFinish::Length),
        SchedFinish::Aborted => None,
    };
    if let Some(parser) = l.parser.take() {
        let evs = parser.finish(backend);
        apply_events(&mut l, evs, on_event);
    }
    let finish_reason = match backend.map(|b| l.msg.finish_reason(b)) {
        None => FinishReason::Aborted,
        Some(ParseFinish::StopSequence) => FinishReason::StopSequence,
        Some(ParseFinish::ToolCalls) => FinishReason::ToolCalls,
        Some(ParseFinish::Length) => FinishReason::Length,
        Some(_) => FinishReason::Stop,
    };
    // One move of the kept part to the front of the history's buffer.
    let mut token_ids = f.tokens;
    token_ids.drain(..(f.prompt_len + l.strip).min(token_ids.len()));
    if let Some(k) = l.kept {
        token_ids.truncate(k);
    }
    let completion_tokens = token_ids.len();
    Output {
        id: l.user_id,
        index: l.index,
        logprobs: l.fx.params.logprobs.then_some(l.logprobs),
        token_ids,
        text: l.msg.content,
        reasoning: l.msg.reasoning,
        tool_calls: l.msg.tool_calls,
        finish_reason,
        usage: Usage {
            prompt_tokens: l.fx.prompt_len,
            cached_tokens: l.cached.unwrap_or(0),
            completion_tokens,
        },
        timing: Timing {
            ttft_ms: l.first_token.unwrap_or(now_ms),
            total_ms: if l.first_token.is_some() {
                l.last_token
            } else {
                now_ms
            },
        },
    }
}
