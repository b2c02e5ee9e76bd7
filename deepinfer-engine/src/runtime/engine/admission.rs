//! Requests into the engine: limits, admission (with prefix imports from slower cache
//! tiers) and the forks of `n > 1` requests.

use super::*;

impl<B: Backend> Engine<B>
where
    B::Tensor: Clone,
{
    /// Whether a request can run on this engine (prompt, vocabulary, limits, parameters).
    pub fn check_request(&self, r: &Request) -> Result<(), EngineError> {
        self.limits().check(r)
    }

    /// A check of requests against this engine's limits that outlives the borrow (for a
    /// front end on another thread).
    pub fn request_checker(
        &self,
    ) -> impl Fn(&Request) -> Result<(), EngineError> + Send + Sync + 'static {
        let limits = self.limits();
        move |r| limits.check(r)
    }

    pub(super) fn limits(&self) -> Limits {
        Limits {
            vocab: self.model.cfg.vocab_size,
            max_model_len: self.cfg.max_model_len,
            kv_tokens: self.cfg.num_blocks * self.cfg.block_size,
        }
    }

    /// Add a checked request to the scheduler: one sequence, or for `n > 1` a fork group (a
    /// parent that prefills the prompt once, then forks `n - 1` children sharing its blocks)
    /// or, when the prompt cannot be split that way, `n` independent sequences.
    pub(super) fn admit(
        &mut self,
        r: Request,
        live: &mut HashMap<u64, Live<B::Tensor>>,
    ) -> Result<(), EngineError> {
        self.metrics.prompt_tokens += r.prompt.len() as u64;
        let eos = self.model.cfg.eos_token_id.map(|e| e as u32);
        let mut stop_tokens = r.params.stop_token_ids.clone();
        if r.params.stop_at_eos
            && let Some(e) = eos
        {
            stop_tokens.push(e);
        }
        let n = r.params.n.max(1);
        let last = r.prompt[r.prompt.len() - 1];
        let fork = n > 1 && r.prompt.len() >= 2 && !stop_tokens.contains(&last);
        let copies = if n > 1 && !fork { n } else { 1 };
        let cut = hit_rule(&self.model, &self.cfg)
            .max_reusable_tokens(r.prompt.len(), self.cfg.block_size);
        let imported = self.import_prefix(&r.prompt, cut);
        for index in 0..copies {
            let sid = self.next_sid;
            self.next_sid += 1;
            let mut params = r.params.clone();
            params.sampling.seed = params.sampling.seed.wrapping_add(index as u64);
            let nr = if fork {
                let mut nr = NewRequest::new(
                    sid,
                    r.prompt[..r.prompt.len() - 1].to_vec(),
                    r.params.max_tokens + 1,
                );
                nr.stop_tokens = stop_tokens.clone();
                nr
            } else {
                let mut nr = NewRequest::new(sid, r.prompt.clone(), r.params.max_tokens);
                nr.stop_tokens = stop_tokens.clone();
                nr
            };
            self.sched.add_request(nr)?;
            let l = Live {
                user_id: r.id,
                index,
                fx: Arc::new(Fixed {
                    params,
                    stop_tokens: stop_tokens.clone(),
                    prompt_len: r.prompt.len(),
                }),
                forced: fork.then_some(last),
                strip: usize::from(fork),
                parsing: r.parsing.clone(),
                grammar: r.grammar.clone(),
                cut,
                imported,
                dev: Dev {
                    matcher: r.grammar.as_ref().map(GrammarConstraint::matcher),
                    ..Dev::default()
                },
                parser: self.parser_for(r.parsing.as_ref()),
                logprobs: Vec::new(),
                msg: Assembled::default(),
                cached: None,
                first_token: None,
                last_token: 0.0,
                ngen: 0,
                kept: None,
                stopped: false,
            };
            live.insert(sid, l);
        }
        Ok(())
    }

    /// Brings the longest prefix of `prompt[..cut]` whose state a slower tier holds (host, or
    /// disk: loaded into the host tier now) back into the scheduler's device pool, so the
    /// scheduler's allocation hits it; the state's entries are written into the imported
    /// blocks before the next step runs (`pending_imports`). Returns the tokens imported and
    /// the tier.
    pub(super) fn import_prefix(&mut self, prompt: &[u32], cut: usize) -> Option<(usize, Tier)> {
        if !self.cfg.prefix_caching || cut == 0 {
            return None;
        }
        let (len, tier) = self.prefix.reach(&self.model, &prompt[..cut])?;
        let state = self.prefix.lookup(&prompt[..len])?;
        let bs = self.cfg.block_size;
        let kv = self.sched.kv_mut();
        // No free block to import into: the device pool misses and the prefix is replayed
        // from the host state instead (still exact).
        let blocks = kv
            .import_blocks(prompt, &ExtraKeys::none(), 0, len / bs)
            .ok()?;
        let chain = kv.prefix_hashes(&prompt[..len], &ExtraKeys::none());
        let at: Vec<(usize, deepinfer_kv::BlockId)> = blocks
            .iter()
            .filter_map(|&(b, h)| Some((chain.iter().position(|&c| c == h)?, b)))
            .collect();
        if at.is_empty() {
            return None;
        }
        let tokens = at.len() * bs;
        self.pending_imports
            .push(PendingImport { state, blocks: at });
        Some((tokens, tier))
    }

    /// Write the entries of the prefixes imported since the last step into their blocks
    /// (before any forward reads them). A state that cannot fill its blocks is a bug: the
    /// step fails with the error rather than read missing entries.
    pub(super) fn flush_imports(&mut self) -> Result<(), EngineError> {
        let cache = self.model.global_cache().clone();
        for p in std::mem::take(&mut self.pending_imports) {
            p.state
                .global
                .write_blocks(self.model.backend(), &cache, &p.blocks)?;
        }
        Ok(())
    }

    pub(super) fn parser_for(&self, parsing: Option<&ParsingOptions>) -> Option<StreamParser> {
        match (&self.tokenizer, parsing) {
            (Some(tok), Some(p)) => Some(StreamParser::new(tok.clone(), p)),
            (Some(tok), None) => Some(StreamParser::new(tok.clone(), &plain_parsing())),
            _ => None,
        }
    }

    /// Fork the `n - 1` children of a fork-group parent whose prompt is now complete.
    pub(super) fn fork_children(
        &mut self,
        parent: u64,
        live: &mut HashMap<u64, Live<B::Tensor>>,
    ) -> Result<(), EngineError> {
        let Some(p) = live.get(&parent) else {
            return Ok(());
        };
        let n = p.fx.params.n.max(1);
        let base_seed = p.fx.params.sampling.seed;
        let mut children = Vec::with_capacity(n - 1);
        for index in 1..n {
            let sid = self.next_sid;
            self.next_sid += 1;
            let mut params = p.fx.params.clone();
            params.sampling.seed = base_seed.wrapping_add(index as u64);
            // No free block for the copy of the parent's last block: the child waits as a
            // request of its own with the whole prompt (its blocks hit the parent's cached
            // ones once memory frees), and gives the tokens the fork would have.
            let (state, strip) = match self.sched.fork(parent, sid) {
                Ok(()) => {
                    self.metrics.forks += 1;
                    // The child's blocks: the parent's full ones shared, a copy of its last
                    // (the plan's block copy, done before the next step runs).
                    (p.dev.state.clone(), p.strip)
                }
                Err(SchedError::Kv(deepinfer_kv::KvError::OutOfBlocks { .. })) => {
                    let toks = self
                        .sched
                        .tokens(parent)
                        .ok_or(SchedError::UnknownRequest(parent))?;
                    let prompt = toks[..p.fx.prompt_len.min(toks.len())].to_vec();
                    let mut nr = NewRequest::new(sid, prompt, p.fx.params.max_tokens);
                    nr.stop_tokens = p.fx.stop_tokens.clone();
                    self.sched.add_request(nr)?;
                    (None, 0)
                }
                Err(e) => return Err(e.into()),
            };
            children.push((
                sid,
                Live {
                    user_id: p.user_id,
                    index,
                    fx: Arc::new(Fixed {
                        params,
                        stop_tokens: p.fx.stop_tokens.clone(),
                        prompt_len: p.fx.prompt_len,
                    }),
                    forced: None,
                    strip,
                    parsing: p.parsing.clone(),
                    grammar: p.grammar.clone(),
                    cut: p.cut,
                    imported: p.imported,
                    dev: Dev {
                        state,
                        matcher: p.grammar.as_ref().map(GrammarConstraint::matcher),
                        ..Dev::default()
                    },
                    parser: self.parser_for(p.parsing.as_ref()),
                    logprobs: Vec::new(),
                    msg: Assembled::default(),
                    cached: p.cached,
                    first_token: None,
                    last_token: 0.0,
                    ngen: 0,
                    kept: None,
                    stopped: false,
                },
            ));
        }
        live.extend(children);
        Ok(())
    }
}

/// What a request must fit: the vocabulary, the context limit and the KV pool.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub(super) vocab: usize,
    pub(super) max_model_len: usize,
    pub(super) kv_tokens: usize,
}

impl Limits {
    pub(super) fn check(&self, r: &Request) -> Result<(), EngineError> {
        let bad = |reason: String| EngineError::InvalidRequest { id: r.id, reason };
        let v = self.vocab;
        if r.prompt.is_empty() {
            return Err(bad("empty prompt".into()));
        }
        if let Some(t) = r.prompt.iter().find(|&&t| t as usize >= v) {
            return Err(bad(format!(
                "prompt token {t} outside the vocabulary ({v})"
            )));
        }
        if r.params.max_tokens == 0 {
            return Err(bad("max_tokens must be at least 1".into()));
        }
        if r.prompt.len() >= self.max_model_len {
            return Err(bad(format!(
                "prompt of {} tokens exceeds the context limit of {}",
                r.prompt.len(),
                self.max_model_len
            )));
        }
        if r.prompt.len() + 1 > self.kv_tokens {
            return Err(bad(format!(
                "prompt of {} tokens exceeds the KV pool of {} tokens",
                r.prompt.len(),
                self.kv_tokens
            )));
        }
        r.params
            .sampling
            .validate()
            .map_err(|e| bad(e.to_string()))?;
        if r.params.n == 0 {
            return Err(bad("n must be at least 1".into()));
        }
        if let Some(g) = &r.grammar
            && g.vocab_size > v
        {
            return Err(bad(format!(
                "the grammar's vocabulary ({}) is larger than the model's ({v})",
                g.vocab_size
            )));
        }
        Ok(())
    }
}

/// A prefix state from a slower tier and the pool blocks `(index in its block chain, block
/// id)` the scheduler imported for it.
pub(super) struct PendingImport<T> {
    state: SeqState<T>,
    blocks: Vec<(usize, deepinfer_kv::BlockId)>,
}
