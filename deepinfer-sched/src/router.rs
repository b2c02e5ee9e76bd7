//! Routing requests across engine replicas (a library a serving layer calls).
//!
//! * **Prefill** requests are bucketed by context length into tiers (four by
//!   default), each served by its own subset of replicas, so a 100k-token prompt
//!   never sits in front of a stream of short ones. Inside a tier the replica
//!   with the fewest outstanding prefill tokens wins; with prefix-aware routing
//!   on, tokens a replica already caches are subtracted from its cost.
//! * **Decode** requests are balanced on both the number of running requests and
//!   the total cache length per replica (two replicas with equal request counts
//!   can differ tenfold in attention work).
//! * **Prefix-aware routing** is fed by cache events ([`CacheEvent`]: blocks
//!   stored / removed / cleared on a replica, keyed by block hash), the shape of
//!   the block-manager events a KV cache emits.

use std::collections::HashMap;

use thiserror::Error;

/// Errors from the router.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RouterError {
    /// No replicas, or a tier with no replica.
    #[error("invalid router configuration: {0}")]
    Config(String),
    /// A replica index out of range.
    #[error("unknown replica {0}")]
    UnknownReplica(usize),
    /// A request id the router does not track.
    #[error("unknown request {0}")]
    UnknownRequest(u64),
    /// A request id already tracked.
    #[error("duplicate request {0}")]
    DuplicateRequest(u64),
}

/// Router configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterConfig {
    /// Number of prefill replicas.
    pub prefill_replicas: usize,
    /// Number of decode replicas.
    pub decode_replicas: usize,
    /// Ascending context-length upper bounds of all tiers but the last
    /// (`n` bounds make `n + 1` tiers). Default `[2048, 8192, 32768]`: four tiers.
    pub tier_bounds: Vec<usize>,
    /// Weight of the request-count term in the decode score.
    pub decode_request_weight: f64,
    /// Weight of the cache-length term in the decode score.
    pub decode_token_weight: f64,
    /// Route prefill by prefix-cache hits when block hashes are supplied.
    pub prefix_aware: bool,
    /// Tokens per cache block (to turn matched blocks into tokens).
    pub block_size: usize,
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            prefill_replicas: 4,
            decode_replicas: 4,
            tier_bounds: vec![2048, 8192, 32768],
            decode_request_weight: 1.0,
            decode_token_weight: 1.0,
            prefix_aware: true,
            block_size: 128,
        }
    }
}

/// A prefix-cache event from one replica's block manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheEvent {
    /// Blocks with these hashes became cached on the replica.
    Stored {
        /// Replica index (prefill replicas).
        replica: usize,
        /// Chained block hashes.
        hashes: Vec<u128>,
    },
    /// Blocks with these hashes were evicted from the replica.
    Removed {
        /// Replica index.
        replica: usize,
        /// Chained block hashes.
        hashes: Vec<u128>,
    },
    /// The replica dropped its whole cache.
    Cleared {
        /// Replica index.
        replica: usize,
    },
}

impl CacheEvent {
    /// Translate a block-manager event of `replica` (`deepinfer-kv`'s event stream).
    pub fn from_kv(replica: usize, ev: &deepinfer_kv::KvEvent) -> Self {
        match ev {
            deepinfer_kv::KvEvent::Stored { hash, .. } => CacheEvent::Stored {
                replica,
                hashes: vec![hash.0],
            },
            deepinfer_kv::KvEvent::Removed { hashes } => CacheEvent::Removed {
                replica,
                hashes: hashes.iter().map(|h| h.0).collect(),
            },
            deepinfer_kv::KvEvent::Cleared => CacheEvent::Cleared { replica },
        }
    }
}

#[derive(Debug, Clone, Default)]
struct PrefillLoad {
    pending_tokens: u64,
}

#[derive(Debug, Clone, Default)]
struct DecodeLoad {
    requests: u64,
    cache_tokens: u64,
}

/// The router state.
#[derive(Debug, Clone)]
pub struct Router {
    cfg: RouterConfig,
    /// Replicas serving each tier.
    tier_replicas: Vec<Vec<usize>>,
    prefill: Vec<PrefillLoad>,
    decode: Vec<DecodeLoad>,
    /// Which replicas hold a block hash (bit i = replica i; up to 64 prefill replicas
    /// are tracked for prefix routing, the rest route by load only).
    cached: HashMap<u128, u64>,
    /// Request id → (replica, tokens charged) for prefill; (replica, cache tokens) for decode.
    prefill_of: HashMap<u64, (usize, u64)>,
    decode_of: HashMap<u64, (usize, u64)>,
}

/// Where a prefill request went and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillRoute {
    /// Chosen replica.
    pub replica: usize,
    /// Context-length tier.
    pub tier: usize,
    /// Tokens the replica already caches for this prompt.
    pub cached_tokens: usize,
}

impl Router {
    /// A router; prefill replicas are split evenly over the tiers (tier `t` gets
    /// replicas `t, t + T, t + 2T, …`), or all replicas serve all tiers when there
    /// are fewer replicas than tiers.
    pub fn new(cfg: RouterConfig) -> Result<Self, RouterError> {
        if cfg.prefill_replicas == 0 && cfg.decode_replicas == 0 {
            return Err(RouterError::Config("no replicas".into()));
        }
        if cfg.tier_bounds.windows(2).any(|w| w[0] >= w[1]) {
            return Err(RouterError::Config("tier bounds must ascend".into()));
        }
        if cfg.block_size == 0 {
            return Err(RouterError::Config("block size must be positive".into()));
        }
        for (n, v) in [
            ("decode_request_weight", cfg.decode_request_weight),
            ("decode_token_weight", cfg.decode_token_weight),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(RouterError::Config(format!("{n} must be finite and >= 0")));
            }
        }
        let tiers = cfg.tier_bounds.len() + 1;
        let tier_replicas: Vec<Vec<usize>> = if cfg.prefill_replicas >= tiers {
            (0..tiers)
                .map(|t| (t..cfg.prefill_replicas).step_by(tiers).collect())
                .collect()
        } else {
            vec![(0..cfg.prefill_replicas).collect(); tiers]
        };
        Ok(Self {
            prefill: vec![PrefillLoad::default(); cfg.prefill_replicas],
            decode: vec![DecodeLoad::default(); cfg.decode_replicas],
            tier_replicas,
            cfg,
            cached: HashMap::new(),
            prefill_of: HashMap::new(),
            decode_of: HashMap::new(),
        })
    }

    /// The tier of a context length.
    pub fn tier_of(&self, context_len: usize) -> usize {
        self.cfg.tier_bounds.partition_point(|&b| b < context_len)
    }

    /// Replicas serving a tier.
    pub fn tier_replicas(&self, tier: usize) -> &[usize] {
        self.tier_replicas.get(tier).map_or(&[], |v| v.as_slice())
    }

    /// Apply a cache event.
    pub fn apply(&mut self, ev: &CacheEvent) -> Result<(), RouterError> {
        let replica = match ev {
            CacheEvent::Stored { replica, .. }
            | CacheEvent::Removed { replica, .. }
            | CacheEvent::Cleared { replica } => *replica,
        };
        if replica >= self.cfg.prefill_replicas {
            return Err(RouterError::UnknownReplica(replica));
        }
        if replica >= 64 {
            return Ok(());
        }
        let bit = 1u64 << replica;
        match ev {
            CacheEvent::Stored { hashes, .. } => {
                for h in hashes {
                    *self.cached.entry(*h).or_insert(0) |= bit;
                }
            }
            CacheEvent::Removed { hashes, .. } => {
                for h in hashes {
                    if let Some(m) = self.cached.get_mut(h) {
                        *m &= !bit;
                        if *m == 0 {
                            self.cached.remove(h);
                        }
                    }
                }
            }
            CacheEvent::Cleared { .. } => {
                self.cached.retain(|_, m| {
                    *m &= !bit;
                    *m != 0
                });
            }
        }
        Ok(())
    }

    /// Longest cached prefix, in blocks, of a hash chain on a replica.
    pub fn cached_blocks(&self, replica: usize, chain: &[u128]) -> usize {
        if replica >= 64 {
            return 0;
        }
        let bit = 1u64 << replica;
        chain
            .iter()
            .take_while(|h| self.cached.get(h).is_some_and(|m| m & bit != 0))
            .count()
    }

    /// Route a prefill request of `context_len` tokens with the hash chain of
    /// its full blocks (empty when unknown). Charges the uncached tokens to the
    /// chosen replica until [`Router::finish_prefill`].
    pub fn route_prefill(
        &mut self,
        id: u64,
        context_len: usize,
        chain: &[u128],
    ) -> Result<PrefillRoute, RouterError> {
        if self.prefill_of.contains_key(&id) {
            return Err(RouterError::DuplicateRequest(id));
        }
        let tier = self.tier_of(context_len);
        let cands = &self.tier_replicas[tier];
        if cands.is_empty() {
            return Err(RouterError::Config(format!("tier {tier} has no replica")));
        }
        // Cost = outstanding tokens after this request's uncached part; ties to the lower index.
        let mut best: Option<(u64, usize, usize)> = None;
        for &r in cands {
            let cached = if self.cfg.prefix_aware {
                (self.cached_blocks(r, chain) * self.cfg.block_size).min(context_len)
            } else {
                0
            };
            let cost = self.prefill[r].pending_tokens + (context_len - cached) as u64;
            if best.is_none_or(|b| cost < b.0) {
                best = Some((cost, r, cached));
            }
        }
        let Some((_, replica, cached)) = best else {
            return Err(RouterError::Config(format!("tier {tier} has no replica")));
        };
        let charge = (context_len - cached) as u64;
        self.prefill[replica].pending_tokens += charge;
        self.prefill_of.insert(id, (replica, charge));
        Ok(PrefillRoute {
            replica,
            tier,
            cached_tokens: cached,
        })
    }

    /// A prefill finished (or was aborted): release its charge.
    pub fn finish_prefill(&mut self, id: u64) -> Result<usize, RouterError> {
        let (r, charge) = self
            .prefill_of
            .remove(&id)
            .ok_or(RouterError::UnknownRequest(id))?;
        self.prefill[r].pending_tokens -= charge;
        Ok(r)
    }

    fn decode_score(&self, r: usize, extra_tokens: u64) -> f64 {
        let n = self.decode.len() as f64;
        let (tot_req, tot_tok) = self.decode.iter().fold((0u64, 0u64), |a, d| {
            (a.0 + d.requests, a.1 + d.cache_tokens)
        });
        // Normalise each term by the mean per replica after placing this request,
        // so the two weights compare like with like.
        let mean_req = (tot_req + 1) as f64 / n;
        let mean_tok = ((tot_tok + extra_tokens) as f64 / n).max(1.0);
        let d = &self.decode[r];
        self.cfg.decode_request_weight * (d.requests + 1) as f64 / mean_req
            + self.cfg.decode_token_weight * (d.cache_tokens + extra_tokens) as f64 / mean_tok
    }

    /// Route a decode request with its current cache length.
    pub fn route_decode(&mut self, id: u64, cache_len: usize) -> Result<usize, RouterError> {
        if self.decode.is_empty() {
            return Err(RouterError::Config("no decode replicas".into()));
        }
        if self.decode_of.contains_key(&id) {
            return Err(RouterError::DuplicateRequest(id));
        }
        let extra = cache_len as u64;
        let r = (0..self.decode.len())
            .min_by(|&a, &b| {
                self.decode_score(a, extra)
                    .total_cmp(&self.decode_score(b, extra))
                    .then(a.cmp(&b))
            })
            .unwrap_or(0);
        self.decode[r].requests += 1;
        self.decode[r].cache_tokens += extra;
        self.decode_of.insert(id, (r, extra));
        Ok(r)
    }

    /// A decode request grew by `tokens` tokens.
    pub fn grow_decode(&mut self, id: u64, tokens: usize) -> Result<(), RouterError> {
        let e = self
            .decode_of
            .get_mut(&id)
            .ok_or(RouterError::UnknownRequest(id))?;
        e.1 += tokens as u64;
        self.decode[e.0].cache_tokens += tokens as u64;
        Ok(())
    }

    /// A decode request finished: release it.
    pub fn finish_decode(&mut self, id: u64) -> Result<usize, RouterError> {
        let (r, tok) = self
            .decode_of
            .remove(&id)
            .ok_or(RouterError::UnknownRequest(id))?;
        self.decode[r].requests -= 1;
        self.decode[r].cache_tokens -= tok;
        Ok(r)
    }

    /// `(running requests, cache tokens)` of every decode replica.
    pub fn decode_loads(&self) -> Vec<(u64, u64)> {
        self.decode
            .iter()
            .map(|d| (d.requests, d.cache_tokens))
            .collect()
    }

    /// Outstanding prefill tokens of every prefill replica.
    pub fn prefill_loads(&self) -> Vec<u64> {
        self.prefill.iter().map(|p| p.pending_tokens).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_split_by_length() {
        let r = Router::new(RouterConfig {
            prefill_replicas: 8,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(r.tier_of(1), 0);
        assert_eq!(r.tier_of(2048), 0);
        assert_eq!(r.tier_of(2049), 1);
        assert_eq!(r.tier_of(100_000), 3);
        assert_eq!(r.tier_replicas(0), &[0, 4]);
        assert_eq!(r.tier_replicas(3), &[3, 7]);
    }

    #[test]
    fn long_prompts_never_land_on_short_tier() {
        let mut r = Router::new(RouterConfig {
            prefill_replicas: 4,
            ..Default::default()
        })
        .unwrap();
        for i in 0..20 {
            let p = r.route_prefill(i, 50_000, &[]).unwrap();
            assert_eq!(p.replica, 3);
        }
        let p = r.route_prefill(100, 10, &[]).unwrap();
        assert_eq!(p.replica, 0);
    }

    #[test]
    fn prefix_hit_attracts_request() {
        let mut r = Router::new(RouterConfig {
            prefill_replicas: 2,
            tier_bounds: vec![],
            ..Default::default()
        })
        .unwrap();
        r.apply(&CacheEvent::Stored {
            replica: 1,
            hashes: vec![10, 11, 12],
        })
        .unwrap();
        let p = r.route_prefill(1, 500, &[10, 11, 12]).unwrap();
        assert_eq!((p.replica, p.cached_tokens), (1, 384));
        r.apply(&CacheEvent::Removed {
            replica: 1,
            hashes: vec![11],
        })
        .unwrap();
        assert_eq!(r.cached_blocks(1, &[10, 11, 12]), 1);
        r.apply(&CacheEvent::Cleared { replica: 1 }).unwrap();
        assert_eq!(r.cached_blocks(1, &[10]), 0);
        assert_eq!(
            r.apply(&CacheEvent::Cleared { replica: 9 }),
            Err(RouterError::UnknownReplica(9))
        );
    }

    #[test]
    fn decode_balances_tokens_and_count() {
        let mut r = Router::new(RouterConfig {
            decode_replicas: 2,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(r.route_decode(1, 100_000).unwrap(), 0);
        // Replica 0 holds a huge cache; short requests go to 1 until counts dominate.
        assert_eq!(r.route_decode(2, 100).unwrap(), 1);
        assert_eq!(r.route_decode(3, 100).unwrap(), 1);
        assert_eq!(r.route_decode(2, 1), Err(RouterError::DuplicateRequest(2)));
        assert_eq!(r.finish_decode(1).unwrap(), 0);
        assert_eq!(r.route_decode(4, 100).unwrap(), 0);
        assert_eq!(r.decode_loads(), vec![(1, 100), (2, 200)]);
    }
}
