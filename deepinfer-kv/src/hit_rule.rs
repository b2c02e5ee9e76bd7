//! The production prefix-hit rule, as a parameter.
//!
//! For an input of `L` tokens at most `L − (window + spec_slack)` tokens come from the cache,
//! rounded down to whole blocks: the last window (plus room for speculative tokens) is always
//! recomputed so the sliding-window state comes out of the forward pass. If the window state for
//! the hit is missing, the hit backs off one block and the last `window` tokens of the shortened
//! hit are replayed to rebuild it.

/// The hit rule's parameters. `HitRule::none()` reuses every matched full block except that the
/// last prompt token is always recomputed (its logits are needed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HitRule {
    /// Sliding-window length in tokens (128 for V4.1-Flash); 0 when the model has no window state.
    pub window: usize,
    /// Extra tokens kept out of the cache for speculative decoding (6 for V4.1-Flash).
    pub spec_slack: usize,
}

/// How a prompt's tokens are served, as decided by [`HitRule::plan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HitPlan {
    /// Tokens whose KV comes from the cache (a whole number of blocks).
    pub reused_tokens: usize,
    /// Tokens at the end of the reused part that are run again to rebuild the window state
    /// (their KV is reused; only their window rows are recomputed).
    pub replayed_tokens: usize,
    /// Tokens computed from scratch: `prompt_len − reused_tokens`.
    pub computed_tokens: usize,
}

impl HitPlan {
    /// Number of reused blocks for the given block size.
    pub fn reused_blocks(&self, block_size: usize) -> usize {
        self.reused_tokens / block_size.max(1)
    }
}

impl HitRule {
    /// No window: reuse every matched full block but never the last prompt token.
    pub const fn none() -> Self {
        Self {
            window: 0,
            spec_slack: 0,
        }
    }

    /// The published DeepSeek V4.1-Flash rule: window 128, speculative slack 6.
    pub const fn v41_flash() -> Self {
        Self {
            window: 128,
            spec_slack: 6,
        }
    }

    /// Most tokens of a `prompt_len`-token prompt that may come from cache, in whole blocks.
    pub fn max_reusable_tokens(&self, prompt_len: usize, block_size: usize) -> usize {
        if block_size == 0 || prompt_len == 0 {
            return 0;
        }
        // The last prompt token is always recomputed, whatever the window.
        let keep_out = (self.window + self.spec_slack).max(1);
        let limit = prompt_len.saturating_sub(keep_out);
        limit / block_size * block_size
    }

    /// Plans a prompt of `prompt_len` tokens given `matched_tokens` found in the cache (a whole
    /// number of blocks) and whether the window state at the end of the hit is available.
    /// `window_state_present` is called with the number of reused blocks; it is not called
    /// when there is no hit or the rule has no window.
    pub fn plan(
        &self,
        prompt_len: usize,
        matched_tokens: usize,
        block_size: usize,
        window_state_present: impl FnOnce(usize) -> bool,
    ) -> HitPlan {
        let bs = block_size.max(1);
        let matched = matched_tokens.min(prompt_len) / bs * bs;
        let mut reused = matched.min(self.max_reusable_tokens(prompt_len, bs));
        let mut replayed = 0;
        if self.window > 0 && reused > 0 && !window_state_present(reused / bs) {
            reused -= bs;
            replayed = self.window.min(reused);
        }
        HitPlan {
            reused_tokens: reused,
            replayed_tokens: replayed,
            computed_tokens: prompt_len - reused,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_numbers_window_present() {
        let p = HitRule::v41_flash().plan(10_000, 10_000 / 128 * 128, 128, |_| true);
        assert_eq!(p.reused_tokens, 9_856);
        assert_eq!(p.replayed_tokens, 0);
        assert_eq!(p.computed_tokens, 144);
    }

    #[test]
    fn published_numbers_window_missing() {
        let p = HitRule::v41_flash().plan(10_000, 9_984, 128, |_| false);
        assert_eq!(p.reused_tokens, 9_728);
        assert_eq!(p.replayed_tokens, 128);
        assert_eq!(p.computed_tokens, 272);
        // "about 400 in all": replayed plus new.
        assert_eq!(p.replayed_tokens + p.computed_tokens, 400);
    }

    #[test]
    fn no_cache_computes_everything() {
        let p = HitRule::v41_flash().plan(10_000, 0, 128, |_| true);
        assert_eq!(p.computed_tokens, 10_000);
        assert_eq!(p.reused_tokens, 0);
    }

    #[test]
    fn no_window_rule_keeps_last_token() {
        let p = HitRule::none().plan(256, 256, 128, |_| unreachable!());
        assert_eq!(p.reused_tokens, 128);
        assert_eq!(p.computed_tokens, 128);
        let p = HitRule::none().plan(257, 256, 128, |_| true);
        assert_eq!(p.reused_tokens, 256);
        assert_eq!(p.computed_tokens, 1);
    }

    #[test]
    fn window_missing_with_single_block_hit() {
        let p = HitRule {
            window: 4,
            spec_slack: 0,
        }
        .plan(20, 8, 8, |_| false);
        assert_eq!(p.reused_tokens, 0);
        assert_eq!(p.replayed_tokens, 0);
        assert_eq!(p.computed_tokens, 20);
    }
}
