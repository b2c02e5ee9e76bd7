//! Each step's device job: state restores, input rows, snapshot points, drafts.

use super::*;

impl<B: Backend> Engine<B>
where
    B::Tensor: Clone,
{
    /// A plan was made or joined: each request planned for the first time ends its queueing
    /// (`Scheduled`), and its first chunk's start is what the prefix cache gave it.
    pub(super) fn note_planned(
        &mut self,
        plan: &StepPlan,
        live: &mut HashMap<u64, Live<B::Tensor>>,
        driver: &mut dyn Driver,
    ) {
        for c in &plan.prefill {
            let Some(l) = live.get_mut(&c.request) else {
                continue;
            };
            if l.cached.is_some() {
                continue;
            }
            l.cached = Some(c.start);
            self.metrics.cached_prompt_tokens += c.start as u64;
            match l.imported {
                Some((n, Tier::Host)) => self.metrics.cached_host_tokens += n.min(c.start) as u64,
                Some((n, Tier::Disk)) => self.metrics.cached_disk_tokens += n.min(c.start) as u64,
                _ => {}
            }
            driver.event(&StreamEvent::Scheduled { id: l.user_id });
        }
    }

    /// The device work of `plan`: each row group's state (restored from a prefix snapshot
    /// or rebuilt by replay when it is not where the scheduler resumes), input rows, drafts
    /// to verify and sampling settings. Returns whether a fork-group parent emits its
    /// forced token (the step must be updated before the next one is planned).
    pub(super) fn build_job(
        &mut self,
        plan: &StepPlan,
        live: &mut HashMap<u64, Live<B::Tensor>>,
    ) -> Result<(Job<B::Tensor>, bool), EngineError> {
        let mut job = Vec::with_capacity(plan.num_groups());
        let mut drain = false;
        // Entries before blocks are read: imported prefixes, then the plan's copies (a
        // forked sequence's last block).
        self.flush_imports()?;
        self.model.copy_global_blocks(&plan.block_copies)?;
        let cache = self.model.global_cache().clone();
        let max_len = self
            .cfg
            .max_model_len
            .min(self.cfg.num_blocks * self.cfg.block_size);
        let budgeted = self.cfg.spec_drafts > 0 && self.cfg.spec_budget == SpecBudget::Budgeted;
        let groups = plan
            .prefill
            .iter()
            .map(|c| (c.request, c.start, c.start + c.len, c.samples, 0))
            .chain(
                plan.decode
                    .iter()
                    .map(|d| (d.request, d.position, d.position + 1, true, d.drafts)),
            );
        for (sid, start, end, samples, drafts) in groups {
            let l = live.get_mut(&sid).ok_or(SchedError::UnknownRequest(sid))?;
            let toks = self
                .sched
                .tokens(sid)
                .ok_or(SchedError::UnknownRequest(sid))?;
            if end > toks.len() {
                return Err(EngineError::Sched(SchedError::UnknownRequest(sid)));
            }
            let ids = self.sched.kv().block_table(sid).map_err(SchedError::Kv)?;
            match l.dev.state.as_mut() {
                Some(s) if s.pos == start => s.global.set_block_ids(ids),
                _ => {
                    let (st, w) = resume_state(
                        &mut self.prefix,
                        &mut self.metrics,
                        &self.model,
                        self.cfg.bounded_replay,
                        (&toks[..start], ids),
                        &cache,
                    )?;
                    l.dev.state = Some(st);
                    l.dev.rebuild_window = w;
                }
            }
            let from = l.dev.state.as_ref().map_or(0, |s| s.pos);
            let mut dev = std::mem::take(&mut l.dev);
            dev.rows.clear();
            dev.rows.extend_from_slice(&toks[from..end]);
            // Split at the snapshot points so a later identical prefix can resume there: the
            // prompt's cut, and a hit's resume point that had to be replayed to (where
            // prompts sharing this prefix diverged, so the next one resumes without replay).
            let splits = self.snapshot_points(from, end, [l.cut, start]);
            let forced = if samples { l.forced } else { None };
            drain |= forced.is_some();
            let sample = samples && forced.is_none();
            // Drafts past the token or context limit are wasted rows; a plan made while the
            // previous step computed counted one token fewer (overlap), so cap them here
            // from the known tokens, as the in-order loop's scheduler did.
            let left_new =
                (l.fx.params.max_tokens + l.fx.prompt_len).saturating_sub(toks.len() + 1);
            let left_ctx = max_len.saturating_sub(toks.len() + 1);
            let drafts = drafts.min(left_new).min(left_ctx);
            job.push(JobSeq {
                sid,
                fx: l.fx.clone(),
                dev,
                splits,
                to: end,
                sample,
                drafts,
                draft_ahead: sample && budgeted,
                forced,
            });
        }
        Ok((
            Job {
                seqs: job,
                placement: self.placement.clone(),
            },
            drain,
        ))
    }

    /// Offsets inside a prefill of positions `from..end` where the forward pauses so a
    /// prefix state is kept: every multiple of `prefix_state_interval` and the `marks` (the
    /// prompt's largest reusable prefix, so prompts that share only a prefix with this one or
    /// extend it resume near where they diverge; a replayed hit's resume point).
    pub(super) fn snapshot_points(&self, from: usize, end: usize, marks: [usize; 2]) -> Vec<usize> {
        if !self.cfg.prefix_caching {
            return Vec::new();
        }
        let every = self
            .cfg
            .prefix_state_interval
            .next_multiple_of(self.cfg.block_size);
        let mut at: Vec<usize> = match every {
            0 => Vec::new(),
            k => (from / k + 1..)
                .map(|i| i * k)
                .take_while(|&p| p < end)
                .collect(),
        };
        let bs = self.cfg.block_size.max(1);
        at.extend(
            marks
                .into_iter()
                .filter(|&c| from < c && c < end && c.is_multiple_of(bs)),
        );
        at.sort_unstable();
        at.dedup();
        at.iter().map(|p| p - from).collect()
    }

    pub(super) fn add_stats(&mut self, s: &DevStats) {
        let m = &mut self.metrics;
        m.forward_ms += s.forward_ms;
        m.sample_ms += s.sample_ms;
        m.draft_ms += s.draft_ms;
        m.grammar_ms += s.grammar_ms;
        m.forward_calls += s.forward_calls;
        m.forward_tokens += s.forward_tokens;
        m.draft_tokens += s.draft_tokens;
        m.accepted_drafts += s.accepted_drafts;
        m.spec_rows += s.spec_rows;
        for p in 0..DRAFT_POSITIONS {
            m.drafts_offered_at[p] += s.drafts_offered_at[p];
            m.drafts_accepted_at[p] += s.drafts_accepted_at[p];
        }
    }
}

/// The state a sequence resumes from at `tokens.len()`, the scheduler's resume point, on
/// the pool blocks `ids`, whose first `tokens.len()` positions hold their entries (a
/// prefix hit or an import): the longest stored state at or below it, whose tokens up to
/// the resume point the first forward replays (exact); with bounded replay, when that
/// replay would be longer than the window, a windowless state whose last window of
/// tokens is replayed on the device before the step's rows (the returned count).
fn resume_state<B: Backend>(
    prefix: &mut PrefixCache<B::Tensor>,
    metrics: &mut Metrics,
    model: &Model<B>,
    bounded_replay: bool,
    (tokens, ids): (&[u32], &[deepinfer_kv::BlockId]),
    cache: &crate::model::SharedGlobalCache<B::Tensor>,
) -> Result<(SeqState<B::Tensor>, usize), EngineError>
where
    B::Tensor: Clone,
{
    let start = tokens.len();
    let mut st = match prefix.lookup(tokens) {
        Some(s) => {
            metrics.state_snapshot_hits += 1;
            s
        }
        None => model.new_state(),
    };
    let w = model.cfg.sliding_window.min(start);
    if bounded_replay && start - st.pos > w && w > 0 {
        let mut b = model.windowless_state(tokens)?;
        b.global.attach(cache.clone(), ids, start);
        metrics.replayed_tokens += w as u64;
        metrics.bounded_replays += 1;
        return Ok((b, w));
    }
    metrics.replayed_tokens += (start - st.pos) as u64;
    st.global.attach(cache.clone(), ids, start);
    Ok((st, 0))
}
