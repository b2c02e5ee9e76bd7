//! The device half of an engine step: everything that reads the model's results.
//!
//! A [`Job`] holds, per scheduled request, what the step needs to compute: the sequence's
//! state (moved in, not shared), its input tokens, how many drafts to verify, its grammar
//! matcher and its sampling parameters. [`run_job`] drafts (DSpark), runs the forward calls,
//! verifies drafts (re-running the accepted prefix after a rejection), fills grammar masks,
//! samples, advances the matchers and, in budgeted speculation, drafts the next block; it
//! hands every moved part back in [`JobOut`]. Nothing in here touches the scheduler, the
//! stream parser or the caller's callback, so the host thread can do that work while a job
//! runs (overlapped scheduling, see [`super::engine`]).

use super::request::GenParams;
use crate::model::ExpertPlacement;
use crate::{BatchItem, Logits, Model, SeqState};
use deepinfer_kernels::Backend;
use deepinfer_kv::TrafficClass;
use deepinfer_recipe::grammar::Matcher;
use deepinfer_sample::{SampleRequest, VerifyMode, VerifyRequest, sample_batch, verify_batch};
use std::sync::Arc;
use std::time::Instant;

use super::engine::{DRAFT_POSITIONS, EngineError};

/// One generated token with its log-probability and top alternatives.
pub(crate) type Tok = (u32, f32, Vec<(u32, f32)>);

/// A request's settings that do not change while it runs (shared with every job).
#[derive(Debug)]
pub(crate) struct Fixed {
    pub params: GenParams,
    /// Token ids that end the request (stop ids, EOS).
    pub stop_tokens: Vec<u32>,
    /// Prompt length as the user sent it (a fork parent's forced token included).
    pub prompt_len: usize,
}

/// Drafts for the next decode row of a request (budgeted speculation drafts at the end of
/// a step so the planner sees their confidences before it plans).
pub(crate) struct NextDraft {
    /// State position and anchor token they were drafted from.
    pub pos: usize,
    pub anchor: u32,
    /// The drafter's argmax chain: a function of the context, which is what
    /// [`VerifyMode::Match`] needs to keep the output distribution exact.
    pub ids: Vec<u32>,
}

/// The parts of a request that travel to the device with each step and come back.
pub(crate) struct Dev<T> {
    /// Model state (`None`: rebuilt from a prefix snapshot or by replay at the next step).
    pub state: Option<SeqState<T>>,
    /// Grammar matcher (structured outputs).
    pub matcher: Option<Box<dyn Matcher>>,
    pub next_draft: Option<NextDraft>,
    /// Input-token buffer, reused from step to step.
    pub rows: Vec<u32>,
    /// Bounded replay: the state is windowless and its last this many tokens are replayed
    /// ([`Model::rebuild_window`]) before the step's rows.
    pub rebuild_window: usize,
}

impl<T> Default for Dev<T> {
    fn default() -> Self {
        Dev {
            state: None,
            matcher: None,
            next_draft: None,
            rows: Vec::new(),
            rebuild_window: 0,
        }
    }
}

/// One request's work in a step.
pub(crate) struct JobSeq<T> {
    pub sid: u64,
    pub fx: Arc<Fixed>,
    /// `dev.rows`: input tokens from `state.pos` up to `to` (replayed rows first).
    pub dev: Dev<T>,
    /// Row offsets (ascending, inside `rows`) where a forward piece ends at a prefix-snapshot
    /// point: the rows run as `rows[..splits[0]]`, `rows[splits[0]..splits[1]]`, … .
    pub splits: Vec<usize>,
    /// Position after the last input row (the sampling position).
    pub to: usize,
    /// Sample a token after the last row.
    pub sample: bool,
    /// Drafts to verify after the input row (a decode row with a state at its anchor).
    pub drafts: usize,
    /// Budgeted speculation: draft the next block after this step.
    pub draft_ahead: bool,
    /// A fork-group parent's forced token (the row samples nothing; the host emits it).
    pub forced: Option<u32>,
}

/// The tokens `s` has generated before the sampling position, less its last `drafts` inputs
/// (drafts under verification): what the sampler's penalties read. The model state's token
/// history is the one copy on the device side; its prompt part is the first `prompt_len`.
fn generated<T>(s: &JobSeq<T>, drafts: usize) -> &[u32] {
    let h = s
        .dev
        .state
        .as_ref()
        .map_or(&[][..], |st| st.history.as_slice());
    let end = h.len().saturating_sub(drafts);
    &h[s.fx.prompt_len.min(end)..end]
}

/// Settings of [`run_job`] that do not change between steps.
#[derive(Debug, Clone)]
pub(crate) struct JobCfg {
    pub vocab: usize,
    pub eos: Option<u32>,
    /// Prefix caching on: snapshot states that end on a multiple of this many tokens.
    pub snapshot_block: Option<usize>,
    /// Most drafts per row (budgeted drafting ahead).
    pub spec_drafts: usize,
    /// Temperatures for the drafter's confidences before planning.
    pub draft_calibration: Option<Arc<deepinfer_spec::TemperatureScaling>>,
    /// In-process expert-parallel ranks of each forward (1: none).
    pub expert_parallel: usize,
    /// Where the routed experts are, with expert parallelism (set per job).
    pub placement: Option<Arc<ExpertPlacement>>,
}

/// Time and counts of one job.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct DevStats {
    pub forward_ms: f64,
    pub sample_ms: f64,
    pub draft_ms: f64,
    pub grammar_ms: f64,
    pub forward_calls: u64,
    pub forward_tokens: u64,
    pub draft_tokens: u64,
    pub accepted_drafts: u64,
    pub spec_rows: u64,
    pub drafts_offered_at: [u64; DRAFT_POSITIONS],
    pub drafts_accepted_at: [u64; DRAFT_POSITIONS],
}

/// One request's results.
pub(crate) struct SeqOut<T> {
    pub sid: u64,
    pub dev: Dev<T>,
    /// Tokens of this step (none for a non-final prefill chunk or a forced row), cut after
    /// the first stop token.
    pub toks: Vec<Tok>,
    /// Drafter confidences for the next step (budgeted speculation).
    pub confs: Vec<f64>,
    /// The forced token of a fork-group parent's row.
    pub forced: Option<u32>,
}

/// A job's results, in job order.
pub(crate) struct JobOut<T> {
    pub seqs: Vec<SeqOut<T>>,
    /// Block-aligned state snapshots for the prefix store (keyed by their own history).
    pub snapshots: Vec<(TrafficClass, SeqState<T>)>,
    pub stats: DevStats,
    /// When the job finished (overlap accounting).
    pub done: Instant,
}

/// A step's work.
pub(crate) struct Job<T> {
    pub seqs: Vec<JobSeq<T>>,
    /// The expert placement this step runs with (expert parallelism).
    pub placement: Option<Arc<ExpertPlacement>>,
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Per-request scratch of one job.
struct Scratch<T> {
    /// Drafts appended to `rows` (verified by this step).
    drafts: usize,
    /// Pre-draft state, restored when a draft is rejected.
    snap: Option<SeqState<T>>,
    masks: Option<Vec<u32>>,
    /// Drafts the matcher advanced over while building `masks`.
    grammar_k: usize,
    logits: Vec<f32>,
    toks: Vec<Tok>,
}

/// Run one step's device work. States come back advanced by exactly the accepted tokens.
pub(crate) fn run_job<B: Backend>(
    model: &Model<B>,
    cfg: &JobCfg,
    job: Job<B::Tensor>,
) -> Result<JobOut<B::Tensor>, EngineError>
where
    B::Tensor: Clone,
{
    let Job {
        mut seqs,
        placement,
    } = job;
    let with_placement;
    let cfg = match placement {
        Some(p) => {
            with_placement = JobCfg {
                placement: Some(p),
                ..cfg.clone()
            };
            &with_placement
        }
        None => cfg,
    };
    let v = cfg.vocab;
    let words = v.div_ceil(32);
    let mut st = DevStats::default();
    let mut snapshots = Vec::new();
    let tf = Instant::now();
    for s in seqs.iter_mut() {
        let w = std::mem::take(&mut s.dev.rebuild_window);
        if let (Some(state), true) = (s.dev.state.as_mut(), w > 0) {
            let tail = state.history[state.pos.saturating_sub(w)..].to_vec();
            model.rebuild_window(state, &tail)?;
        }
    }
    st.forward_ms += ms_since(tf);
    let mut sc: Vec<Scratch<B::Tensor>> = seqs
        .iter()
        .map(|_| Scratch {
            drafts: 0,
            snap: None,
            masks: None,
            grammar_k: 0,
            logits: Vec::new(),
            toks: Vec::new(),
        })
        .collect();

    // Drafts (DSpark) for decode rows whose state sits at the anchor: those drafted ahead
    // last step are reused, the rest drafted in one drafter pass.
    let td = Instant::now();
    let mut drafts: Vec<Option<Vec<u32>>> = vec![None; seqs.len()];
    let mut fresh = Vec::new();
    for (i, s) in seqs.iter_mut().enumerate() {
        if s.drafts == 0 || s.dev.rows.len() != 1 {
            continue;
        }
        let Some(state) = s.dev.state.as_ref() else {
            continue;
        };
        let anchor = s.dev.rows[0];
        match s.dev.next_draft.take() {
            Some(nd) if nd.pos == state.pos && nd.anchor == anchor && !nd.ids.is_empty() => {
                let k = s.drafts.min(nd.ids.len());
                drafts[i] = Some(nd.ids[..k].to_vec());
            }
            _ => fresh.push(i),
        }
    }
    if !fresh.is_empty() {
        let items: Vec<(&SeqState<B::Tensor>, u32)> = fresh
            .iter()
            .filter_map(|&i| Some((seqs[i].dev.state.as_ref()?, seqs[i].dev.rows[0])))
            .collect();
        let depth = fresh.iter().map(|&i| seqs[i].drafts).max().unwrap_or(1);
        for (&i, d) in fresh.iter().zip(model.draft_ids_batch(&items, depth)?) {
            let k = seqs[i].drafts.min(d.draft_ids.len());
            drafts[i] = Some(d.draft_ids[..k].to_vec());
        }
    }
    st.draft_ms += ms_since(td);
    for ((s, x), ids) in seqs.iter_mut().zip(sc.iter_mut()).zip(drafts) {
        let (Some(ids), Some(state)) = (ids, s.dev.state.as_ref()) else {
            continue;
        };
        // The rollback point: the same blocks, the entry counts of now.
        {
            x.snap = Some(state.clone());
            x.drafts = ids.len();
            st.draft_tokens += ids.len() as u64;
            st.spec_rows += 1;
            if let Some(m) = s.dev.matcher.as_mut() {
                let tg = Instant::now();
                let (masks, k) = draft_masks(m.as_mut(), &ids, words, cfg.eos);
                x.masks = Some(masks);
                x.grammar_k = k;
                st.grammar_ms += ms_since(tg);
            }
            s.dev.rows.extend_from_slice(&ids);
        }
    }

    // Forward: the plain row groups piece by piece (a piece ends at a snapshot point; the
    // k-th pieces of all groups run together), then the rows verifying drafts (logits of
    // every row).
    let pieces = seqs
        .iter()
        .zip(&sc)
        .filter(|(_, x)| x.drafts == 0)
        .map(|(s, _)| s.splits.len() + 1)
        .max()
        .unwrap_or(0);
    for p in 0..pieces {
        let piece = |s: &JobSeq<B::Tensor>, x: &Scratch<B::Tensor>| {
            if x.drafts > 0 {
                return None;
            }
            let lo = match p {
                0 => 0,
                _ => *s.splits.get(p - 1)?,
            };
            let hi = s.splits.get(p).copied().unwrap_or(s.dev.rows.len());
            Some(lo..hi)
        };
        forward_set(
            model,
            cfg,
            &mut seqs,
            &mut sc,
            piece,
            Logits::Last,
            &mut st,
            &mut snapshots,
        )?;
    }
    forward_set(
        model,
        cfg,
        &mut seqs,
        &mut sc,
        |s, x| (x.drafts > 0).then_some(0..s.dev.rows.len()),
        Logits::All,
        &mut st,
        &mut snapshots,
    )?;

    // Verify drafts: every position samples exactly as a plain decode row would and a
    // draft is kept iff it equals that token (the drafts are the drafter's argmax chain,
    // a function of the context), so outputs equal those without drafts, greedy or seeded.
    let tv = Instant::now();
    let mut rerun = vec![None; seqs.len()];
    let spec_at: Vec<usize> = (0..seqs.len()).filter(|&i| sc[i].drafts > 0).collect();
    let verified = {
        let reqs: Vec<VerifyRequest<'_, f32>> = spec_at
            .iter()
            .map(|&i| {
                let s = &seqs[i];
                let x = &sc[i];
                VerifyRequest {
                    target_logits: x.logits.as_slice(),
                    vocab: v,
                    draft_tokens: &s.dev.rows[s.dev.rows.len() - x.drafts..],
                    draft_probs: None,
                    masks: x.masks.as_deref(),
                    history: generated(s, x.drafts),
                    position: s.to as u64,
                    params: &s.fx.params.sampling,
                    mode: VerifyMode::Match,
                }
            })
            .collect();
        verify_batch(&reqs)
    };
    for (&i, vo) in spec_at.iter().zip(verified) {
        let vo = vo?;
        let (s, x) = (&mut seqs[i], &mut sc[i]);
        st.accepted_drafts += vo.accepted as u64;
        for p in 0..x.drafts.min(DRAFT_POSITIONS) {
            st.drafts_offered_at[p] += 1;
            st.drafts_accepted_at[p] += u64::from(p < vo.accepted);
        }
        if vo.accepted < x.drafts {
            // Back to the pre-draft state; the accepted prefix is re-run below.
            s.dev.state = x.snap.take();
            rerun[i] = Some(0..1 + vo.accepted);
        }
        x.toks = vo
            .tokens
            .into_iter()
            .zip(vo.logprobs)
            .zip(vo.top_logprobs)
            .map(|((t, lp), top)| (t, lp, top))
            .collect();
    }
    st.sample_ms += ms_since(tv);
    if rerun.iter().any(Option::is_some) {
        let mut k = 0;
        let pick = |_: &JobSeq<B::Tensor>, _: &Scratch<B::Tensor>| {
            let r = rerun[k].clone();
            k += 1;
            r
        };
        // The rows already have their tokens: the re-run only rebuilds the exact state.
        forward_set(
            model,
            cfg,
            &mut seqs,
            &mut sc,
            pick,
            Logits::Last,
            &mut st,
            &mut snapshots,
        )?;
    }

    // Grammar masks of the sampling rows (bit set = allowed), then one token per row.
    let tg = Instant::now();
    let mut rows_at = Vec::new();
    let mut masks: Vec<Option<Vec<u32>>> = Vec::new();
    for (i, (s, x)) in seqs.iter_mut().zip(sc.iter()).enumerate() {
        if !s.sample || x.drafts > 0 {
            continue;
        }
        rows_at.push(i);
        masks.push(s.dev.matcher.as_mut().map(|m| {
            let mut mask = vec![0u32; words];
            fill_mask(m.as_mut(), &mut mask, cfg.eos);
            mask
        }));
    }
    st.grammar_ms += ms_since(tg);
    let tsm = Instant::now();
    let sampled = {
        let rows: Vec<SampleRequest<'_, f32>> = rows_at
            .iter()
            .zip(&masks)
            .map(|(&i, mask)| SampleRequest {
                logits: sc[i].logits.as_slice(),
                mask: mask.as_deref(),
                history: generated(&seqs[i], 0),
                position: seqs[i].to as u64,
                params: &seqs[i].fx.params.sampling,
            })
            .collect();
        let _span = tracing::debug_span!("sample", rows = rows.len()).entered();
        sample_batch(&rows)
    };
    for (i, r) in rows_at.into_iter().zip(sampled) {
        let s = r?;
        sc[i].toks = vec![(s.token, s.logprob, s.top_logprobs)];
    }
    st.sample_ms += ms_since(tsm);

    // Per request: cut after a stop token, advance the matcher, remember the history,
    // draft ahead (budgeted speculation).
    let mut outs = Vec::with_capacity(seqs.len());
    let mut ahead = Vec::new();
    for (mut s, mut x) in seqs.into_iter().zip(sc) {
        if let Some(j) = x.toks.iter().position(|t| s.fx.stop_tokens.contains(&t.0)) {
            x.toks.truncate(j + 1);
        }
        if let Some(m) = s.dev.matcher.as_mut() {
            let tg = Instant::now();
            if x.grammar_k > 0 {
                let _ = m.rollback(x.grammar_k);
            }
            for t in &x.toks {
                // A rejected token (only a stop token outside the grammar can be) leaves
                // the matcher where it was.
                let _ = m.accept(t.0);
            }
            st.grammar_ms += ms_since(tg);
        }
        if s.draft_ahead
            && let Some(&(anchor, _, _)) = x.toks.last()
            && !s.fx.stop_tokens.contains(&anchor)
        {
            let next_len = s.to + x.toks.len();
            let at_anchor = s
                .dev
                .state
                .as_ref()
                .is_some_and(|st| st.pos + 1 == next_len);
            if at_anchor && next_len.saturating_sub(s.fx.prompt_len) < s.fx.params.max_tokens {
                ahead.push((outs.len(), anchor));
            }
        }
        outs.push(SeqOut {
            sid: s.sid,
            dev: s.dev,
            toks: x.toks,
            confs: Vec::new(),
            forced: s.forced,
        });
    }
    if !ahead.is_empty() {
        let td = Instant::now();
        draft_ahead(model, cfg, &mut outs, &ahead);
        st.draft_ms += ms_since(td);
    }
    Ok(JobOut {
        seqs: outs,
        snapshots,
        stats: st,
        done: Instant::now(),
    })
}

/// One forward call over the requests `pick` selects (with the row range it gives),
/// keeping each one's logits and snapshotting states that end on a block boundary.
#[allow(clippy::too_many_arguments)]
fn forward_set<B: Backend>(
    model: &Model<B>,
    cfg: &JobCfg,
    seqs: &mut [JobSeq<B::Tensor>],
    sc: &mut [Scratch<B::Tensor>],
    mut pick: impl FnMut(&JobSeq<B::Tensor>, &Scratch<B::Tensor>) -> Option<std::ops::Range<usize>>,
    which: Logits,
    st: &mut DevStats,
    snapshots: &mut Vec<(TrafficClass, SeqState<B::Tensor>)>,
) -> Result<(), EngineError>
where
    B::Tensor: Clone,
{
    let mut at = Vec::new();
    let mut items: Vec<BatchItem<'_, B::Tensor>> = Vec::new();
    for (i, (s, x)) in seqs.iter_mut().zip(sc.iter()).enumerate() {
        let Some(r) = pick(s, x) else { continue };
        if r.is_empty() {
            continue;
        }
        let Dev { state, rows, .. } = &mut s.dev;
        let Some(state) = state.as_mut() else {
            continue;
        };
        st.forward_tokens += r.len() as u64;
        items.push(BatchItem {
            state,
            tokens: &rows[r],
        });
        at.push(i);
    }
    if items.is_empty() {
        return Ok(());
    }
    let tf = Instant::now();
    let res = {
        let _span = tracing::debug_span!("forward", sequences = items.len()).entered();
        if let Some(p) = cfg.placement.as_deref() {
            model.forward_expert_parallel(std::mem::take(&mut items), which, p)
        } else {
            model.forward(&mut items, which, None)
        }
    };
    drop(items);
    st.forward_ms += ms_since(tf);
    st.forward_calls += 1;
    let v = cfg.vocab;
    for (i, mut row) in at.into_iter().zip(res?) {
        let x = &mut sc[i];
        if which == Logits::All {
            // Keep the rows of the decode input and its drafts (replayed rows come first).
            let keep = (1 + x.drafts) * v;
            row.drain(..row.len().saturating_sub(keep));
        } else if let (Some(b), Some(state)) = (cfg.snapshot_block, seqs[i].dev.state.as_ref())
            && state.pos.is_multiple_of(b)
            && state.pos > 0
        {
            // Detached: the scheduler may give these blocks to other sequences later.
            snapshots.push((seqs[i].fx.params.cache_class, state.detached()));
        }
        x.logits = row;
    }
    Ok(())
}

/// Budgeted speculation: draft the next block now, in one drafter pass for every request
/// of `ahead` (`(index in outs, anchor)`: its state has consumed everything but `anchor`,
/// the last token of this step), and hand the drafter's confidences to the planner; the
/// drafts wait in the request for its next decode row. A drafter error drafts nothing.
fn draft_ahead<B: Backend>(
    model: &Model<B>,
    cfg: &JobCfg,
    outs: &mut [SeqOut<B::Tensor>],
    ahead: &[(usize, u32)],
) where
    B::Tensor: Clone,
{
    let items: Vec<(&SeqState<B::Tensor>, u32)> = ahead
        .iter()
        .filter_map(|&(k, a)| Some((outs[k].dev.state.as_ref()?, a)))
        .collect();
    if items.len() != ahead.len() {
        return;
    }
    let Ok(drafts) = model.draft_ids_batch(&items, cfg.spec_drafts) else {
        return;
    };
    for (&(k, anchor), d) in ahead.iter().zip(drafts) {
        let n = cfg.spec_drafts.min(d.draft_ids.len());
        let o = &mut outs[k];
        let Some(pos) = o.dev.state.as_ref().map(|st| st.pos) else {
            continue;
        };
        o.confs = d.planner_confidences(n);
        if let Some(t) = &cfg.draft_calibration {
            t.apply(&mut o.confs);
        }
        o.dev.next_draft = Some(NextDraft {
            pos,
            anchor,
            ids: d.draft_ids[..n].to_vec(),
        });
    }
}

/// Fill `mask` from the matcher; when the grammar allows nothing (it cannot complete), allow
/// only the end-of-sequence token so the request ends instead of failing the batch.
fn fill_mask(m: &mut dyn Matcher, mask: &mut [u32], eos: Option<u32>) {
    if m.fill_bitmask(mask).is_err() {
        mask.fill(0);
        match eos {
            Some(e) if (e as usize) < mask.len() * 32 => mask[e as usize / 32] |= 1 << (e % 32),
            _ => mask.fill(u32::MAX),
        }
    }
}

/// Masks for a verified draft block: mask `i` assumes drafts `..i` were accepted. The matcher
/// is advanced over the drafts it accepts (returned count, to roll back); after the first
/// draft it rejects, the remaining masks repeat the last one (verification stops there).
fn draft_masks(
    m: &mut dyn Matcher,
    drafts: &[u32],
    words: usize,
    eos: Option<u32>,
) -> (Vec<u32>, usize) {
    let mut masks = vec![0u32; (drafts.len() + 1) * words];
    let mut k = 0;
    let mut live = true;
    for i in 0..=drafts.len() {
        if live {
            fill_mask(m, &mut masks[i * words..(i + 1) * words], eos);
            if i < drafts.len() {
                if m.accept(drafts[i]).is_ok() {
                    k += 1;
                } else {
                    live = false;
                }
            }
        } else {
            masks.copy_within((i - 1) * words..i * words, i * words);
        }
    }
    (masks, k)
}
