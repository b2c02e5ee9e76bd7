//! The step loop: plan, device work, update, and (overlapped) parsing of the last step.

use super::*;

/// What the loop carries from one step to the next.
#[derive(Default)]
pub(super) struct LoopState {
    /// The step being run.
    plan: StepPlan,
    /// The next step, planned while this one computes (overlap).
    ahead: StepPlan,
    have_ahead: bool,
    out: StepOutput,
    ids: Vec<u32>,
    /// Overlap: the step just updated, parsed while the next one computes.
    post: Option<Post>,
}

/// What [`Engine::plan_step`] found.
enum Planned {
    Run,
    Retired,
    Stop,
}

impl<B: Backend> Engine<B>
where
    B::Tensor: Clone,
{
    /// The step loop. Without a worker every step runs in order (schedule, device work,
    /// parse, update). With one, see the module docs: step N's device work runs on the
    /// worker while this thread parses step N−1's tokens and plans step N+1.
    pub(super) fn step_loop(
        &mut self,
        live: &mut HashMap<u64, Live<B::Tensor>>,
        worker: Option<&Worker<B::Tensor>>,
        t0: Instant,
        driver: &mut dyn Driver,
    ) -> Result<(), EngineError> {
        let jcfg = self.job_cfg();
        let mut lp = LoopState::default();
        loop {
            match self.plan_step(&mut lp, live, t0, driver)? {
                Planned::Stop => break,
                Planned::Retired => continue,
                Planned::Run => {}
            }
            let (done, step_ms) = self.run_step(&mut lp, live, worker, &jcfg, t0, driver)?;
            self.apply_step(&mut lp, done, step_ms, worker.is_some(), live, t0, driver)?;
            self.rebalance_experts()?;
        }
        if let Some(p) = lp.post.take() {
            self.post_process(p, live, t0, driver)?;
        }
        Ok(())
    }

    /// The plan of the next step in `lp.plan`: the one made ahead while the last step
    /// computed, else a fresh one (after reporting the last step and waiting for work when
    /// idle). `Stop` when the driver has no more work; `Retired` when every row planned ahead
    /// was cancelled by the last update (the empty plan is retired through `update`).
    fn plan_step(
        &mut self,
        lp: &mut LoopState,
        live: &mut HashMap<u64, Live<B::Tensor>>,
        t0: Instant,
        driver: &mut dyn Driver,
    ) -> Result<Planned, EngineError> {
        if lp.have_ahead {
            // (Commands wait for the next step's host work: an abort now would leave a row
            // of the plan ahead without its request, and only an update cancels it.)
            std::mem::swap(&mut lp.plan, &mut lp.ahead);
            lp.have_ahead = false;
        } else {
            driver.observe(
                self.sched.num_running(),
                self.sched.num_waiting(),
                &self.metrics(),
            );
            if self.sched.is_idle() {
                // Report the last step before waiting for more work.
                if let Some(p) = lp.post.take() {
                    self.post_process(p, live, t0, driver)?;
                }
                if !self.take_commands(driver, live, t0, true) {
                    return Ok(Planned::Stop);
                }
                if self.sched.is_idle() {
                    return Ok(Planned::Retired);
                }
            } else {
                self.take_commands(driver, live, t0, false);
            }
            self.schedule(&mut lp.plan)?;
            drop_states(&lp.plan.preempted, live);
            self.note_planned(&lp.plan, live, driver);
            if lp.plan.is_empty() {
                return Err(EngineError::Stuck(
                    self.sched.num_running() + self.sched.num_waiting(),
                ));
            }
        }
        if lp.plan.is_empty() {
            lp.out.clear(lp.plan.step);
            let ts = Instant::now();
            let res = self.sched.update(&lp.out)?;
            self.metrics.sched_ms += ms_since(ts);
            drop_states(&res.preempted, live);
            return Ok(Planned::Retired);
        }
        Ok(Planned::Run)
    }

    /// EPLB between two steps: a new expert placement when one is due (later jobs take it;
    /// the one in flight keeps the old, and either gives the same outputs).
    fn rebalance_experts(&mut self) -> Result<(), EngineError> {
        let Some(b) = self.balancer.as_mut() else {
            return Ok(());
        };
        let Some(load) = self.model.expert_load() else {
            return Ok(());
        };
        if let Some(p) = b
            .after_step(self.metrics.steps, &load)
            .map_err(EngineError::Config)?
        {
            self.placement = Some(Arc::new(p));
        }
        Ok(())
    }

    /// Waiting requests into the plan made ahead (overlap), or a plan ahead for them when
    /// none was made (nothing was left to plan then).
    fn join_plan_ahead(
        &mut self,
        lp: &mut LoopState,
        live: &mut HashMap<u64, Live<B::Tensor>>,
        driver: &mut dyn Driver,
    ) -> Result<(), EngineError> {
        if self.sched.num_waiting() == 0 {
            return Ok(());
        }
        if !lp.have_ahead {
            return self.plan_ahead(lp, live, driver);
        }
        let ts = Instant::now();
        self.sched.admit_into_planned(&mut lp.ahead)?;
        self.metrics.sched_ms += ms_since(ts);
        self.note_planned(&lp.ahead, live, driver);
        Ok(())
    }

    /// The plan ahead (overlap), made while the step in flight computes. (Its preempted
    /// requests' states are dropped when the update of that step is applied to it.)
    fn plan_ahead(
        &mut self,
        lp: &mut LoopState,
        live: &mut HashMap<u64, Live<B::Tensor>>,
        driver: &mut dyn Driver,
    ) -> Result<(), EngineError> {
        self.schedule(&mut lp.ahead)?;
        lp.have_ahead = true;
        self.note_planned(&lp.ahead, live, driver);
        Ok(())
    }

    fn schedule(&mut self, plan: &mut StepPlan) -> Result<(), EngineError> {
        let ts = Instant::now();
        {
            let _span = tracing::debug_span!("schedule").entered();
            self.sched.schedule_into(plan)?;
        }
        self.metrics.sched_ms += ms_since(ts);
        Ok(())
    }

    /// The device work of `lp.plan`, here or on the worker; with the worker, the host work
    /// that overlaps it (parsing the last step, new commands, the plan ahead). Returns the
    /// results and the step's wall time, ms (recorded with the step's counters).
    #[allow(clippy::too_many_arguments)]
    fn run_step(
        &mut self,
        lp: &mut LoopState,
        live: &mut HashMap<u64, Live<B::Tensor>>,
        worker: Option<&Worker<B::Tensor>>,
        jcfg: &JobCfg,
        t0: Instant,
        driver: &mut dyn Driver,
    ) -> Result<(JobOut<B::Tensor>, f64), EngineError> {
        self.metrics.steps += 1;
        self.metrics.decode_rows += lp.plan.decode.len() as u64;
        let tb = Instant::now();
        let (job, drain) = {
            let _span = tracing::debug_span!("build").entered();
            self.build_job(&lp.plan, live)?
        };
        self.metrics.build_ms += ms_since(tb);
        let launched = Instant::now();
        let done = match worker {
            None => {
                let model = &*self.model;
                if jcfg.expert_parallel > 1 {
                    run_job(model, jcfg, job)
                } else {
                    on_pool(|| run_job(model, jcfg, job))
                }
            }
            Some(w) => {
                w.jobs
                    .send(job)
                    .map_err(|_| EngineError::Worker("the device worker stopped".into()))?;
                // Host work while the step computes: the previous step's tokens, then the
                // next plan (not when this step forks: a fork needs its parent out of flight).
                if let Some(p) = lp.post.take() {
                    self.post_process(p, live, t0, driver)?;
                }
                // New requests and aborts join before the next plan is made.
                self.take_commands(driver, live, t0, false);
                if !drain && !self.sched.is_idle() {
                    self.plan_ahead(lp, live, driver)?;
                }
                let host_end = Instant::now();
                // Requests that arrive while the step computes join the plan ahead at once
                // (it has not launched), not the plan after it. An abort now is safe: this
                // step's update cancels the request's rows in the plan ahead.
                while let Some(cmds) = driver.wait_step(&w.done) {
                    self.apply_commands(cmds, driver, live, t0);
                    if !drain {
                        self.join_plan_ahead(lp, live, driver)?;
                    }
                }
                let r = w
                    .results
                    .recv()
                    .map_err(|_| EngineError::Worker("the device worker stopped".into()))?;
                if let Ok(o) = &r {
                    let end = host_end.min(o.done);
                    self.metrics.hidden_ms +=
                        end.saturating_duration_since(launched).as_secs_f64() * 1e3;
                }
                self.metrics.wait_ms += ms_since(host_end);
                r
            }
        }?;
        let step_ms = ms_since(launched);
        let record = StepRecord {
            ms: step_ms as f32,
            predicted_ms: lp.plan.predicted_ms.map(|t| t as f32),
            decode_rows: lp.plan.decode.len() as u32,
            prefill_tokens: lp.plan.prefill.iter().map(|c| c.len as u32).sum(),
        };
        tracing::debug!(
            step = lp.plan.step,
            ms = record.ms,
            predicted_ms = record.predicted_ms,
            decode_rows = record.decode_rows,
            prefill_tokens = record.prefill_tokens,
            "step"
        );
        if self.step_log.len() >= 2 * STEP_HISTORY {
            self.step_log.drain(..STEP_HISTORY);
        }
        self.step_log.push(record);
        let pool = self.sched.kv().pool();
        self.kv_peak = self.kv_peak.max(pool.num_blocks() - pool.num_free());
        self.add_stats(&done.stats);
        Ok((done, step_ms))
    }

    /// The step's results into the scheduler: prefix states kept, each row's tokens into
    /// the step output (without overlap, parsed first so a stop sequence ends the request in
    /// this very update), `update`, forks of parents whose prompt is complete; then the
    /// step's tokens are parsed now (in order) or kept for the next step's overlap.
    #[allow(clippy::too_many_arguments)]
    fn apply_step(
        &mut self,
        lp: &mut LoopState,
        done: JobOut<B::Tensor>,
        step_ms: f64,
        overlap: bool,
        live: &mut HashMap<u64, Live<B::Tensor>>,
        t0: Instant,
        driver: &mut dyn Driver,
    ) -> Result<(), EngineError> {
        let tp = Instant::now();
        for (class, snap) in done.snapshots {
            self.prefix.insert(&self.model, snap, class);
        }
        let now = ms_since(t0);
        let mut aborts = Vec::new();
        let mut to_fork = Vec::new();
        let mut step_toks = Vec::with_capacity(done.seqs.len());
        let (out, ids) = (&mut lp.out, &mut lp.ids);
        out.clear(lp.plan.step);
        for s in done.seqs {
            let sid = s.sid;
            if let Some(t) = s.forced {
                // The prompt's last token, fed as a fork parent's first "output".
                out.push(sid, &[t], false);
                if let Some(l) = live.get_mut(&sid) {
                    l.dev = s.dev;
                    l.forced = None;
                    to_fork.push(sid);
                }
                continue;
            }
            ids.clear();
            ids.extend(s.toks.iter().map(|t| t.0));
            let Some(l) = live.get_mut(&sid) else {
                // Ended (stop sequence, abort) while this step computed: the scheduler
                // ignores the row, but the output must still list it.
                out.push(sid, ids, false);
                continue;
            };
            l.dev = s.dev;
            if overlap {
                out.push_with_confidences(sid, ids, false, &s.confs);
                step_toks.push((sid, s.toks));
            } else {
                let r = parse_tokens(l, &s.toks, now, &mut self.metrics, &mut |e| driver.event(e));
                if r.abort {
                    aborts.push(sid);
                }
                out.push_with_confidences(sid, &ids[..r.used], r.stopped, &s.confs);
            }
        }
        self.metrics.post_ms += ms_since(tp);
        // The step's wall time feeds the cost models (the draft planner's buckets).
        out.step_ms = Some(step_ms.max(1e-3));
        let tu = Instant::now();
        let res = {
            let _span = tracing::debug_span!("update").entered();
            self.sched.update(out)?
        };
        if lp.have_ahead {
            res.apply_to(&mut lp.ahead);
            drop_states(&lp.ahead.preempted, live);
        }
        drop_states(&res.preempted, live);
        for sid in to_fork {
            if !res.finished.iter().any(|f| f.id == sid) {
                self.fork_children(sid, live)?;
            }
        }
        self.metrics.sched_ms += ms_since(tu);
        if overlap {
            lp.post = Some(Post {
                toks: step_toks,
                finished: res.finished,
            });
        } else {
            let tp = Instant::now();
            let mut finished = res.finished;
            for sid in aborts {
                if let Ok(f) = self.sched.abort(sid) {
                    finished.push(f);
                }
            }
            finish_all(finished, live, t0, &mut |e| driver.event(e));
            self.metrics.post_ms += ms_since(tp);
        }
        Ok(())
    }

    /// Overlap: parse a step's tokens (stream parser, events, log-probabilities), end the
    /// requests a stop sequence or the caller ended, and report every finished request.
    pub(super) fn post_process(
        &mut self,
        p: Post,
        live: &mut HashMap<u64, Live<B::Tensor>>,
        t0: Instant,
        driver: &mut dyn Driver,
    ) -> Result<(), EngineError> {
        let tp = Instant::now();
        let on_event = &mut |e: &StreamEvent| driver.event(e);
        let _span = tracing::debug_span!("parse").entered();
        let now = ms_since(t0);
        let mut finished = p.finished;
        for (sid, toks) in p.toks {
            let Some(l) = live.get_mut(&sid) else {
                continue;
            };
            let r = parse_tokens(l, &toks, now, &mut self.metrics, on_event);
            // The step after this one already runs with the request: end it now (the
            // scheduler drops that step's row) and keep only what was parsed.
            if (r.abort || r.stopped)
                && !finished.iter().any(|f| f.id == sid)
                && let Ok(f) = self.sched.abort(sid)
            {
                finished.push(f);
            }
        }
        finish_all(finished, live, t0, on_event);
        self.metrics.post_ms += ms_since(tp);
        Ok(())
    }
}
