//! Consistency check of the sequence table, for the `testing` feature.

use super::{BlockManager, div_ceil};

#[cfg(feature = "testing")]
impl BlockManager {
    /// Checks the sequence table's internal bookkeeping (see
    /// [`crate::testing::check_invariants`]): ids and vacant entries, per-sequence counts, and
    /// that a held block's hash is the one its sequence computed for that position (if it has).
    pub(crate) fn check_sequences(&self) -> std::result::Result<(), String> {
        let bs = self.cfg.block_size;
        let live = self.seqs.0.iter().filter(|s| s.live).count();
        if live != self.ids.len() {
            return Err(format!("{live} live entries, {} ids", self.ids.len()));
        }
        for (&id, &i) in &self.ids {
            match self.seqs.get(i as usize) {
                Some(s) if s.id == id => {}
                _ => return Err(format!("id {id} names entry {i}, which is not it")),
            }
        }
        let mut vacant: Vec<u32> = self.free_idx.clone();
        vacant.sort_unstable();
        vacant.dedup();
        if vacant.len() != self.free_idx.len() {
            return Err("an entry is vacant twice".into());
        }
        if vacant.len() + live != self.seqs.0.len() {
            return Err(format!(
                "{} entries: {live} live, {} vacant",
                self.seqs.0.len(),
                vacant.len()
            ));
        }
        if let Some(&i) = vacant
            .iter()
            .find(|&&i| self.seqs.get(i as usize).is_some())
        {
            return Err(format!("entry {i} is live and vacant"));
        }
        for s in self.seqs.0.iter().filter(|s| s.live) {
            let id = s.id;
            if s.blocks.len() != div_ceil(s.len, bs) {
                return Err(format!(
                    "sequence {id}: {} blocks for {} tokens",
                    s.blocks.len(),
                    s.len
                ));
            }
            if s.committed > s.len || s.computed > s.len {
                return Err(format!(
                    "sequence {id}: {} committed, {} computed of {}",
                    s.committed, s.computed, s.len
                ));
            }
            if s.keeps_tokens && s.tokens.len() != s.len || !s.keeps_tokens && !s.tokens.is_empty()
            {
                return Err(format!(
                    "sequence {id}: {} token ids for {} tokens (kept: {})",
                    s.tokens.len(),
                    s.len,
                    s.keeps_tokens
                ));
            }
            if s.registered as usize > s.blocks.len() || s.hashes.len() > s.committed / bs {
                return Err(format!(
                    "sequence {id}: {} registered, {} hashes, {} blocks, {} committed",
                    s.registered,
                    s.hashes.len(),
                    s.blocks.len(),
                    s.committed
                ));
            }
            if s.plain_keys != s.keys.is_empty() {
                return Err(format!(
                    "sequence {id}: plain_keys flag disagrees with its keys"
                ));
            }
            // (A block shared with another sequence may be cached by it before this one has
            // hashed that position.)
            for (i, (&b, &mine)) in s.blocks.iter().zip(&s.hashes).enumerate() {
                if let Some(h) = self.pool.hash_of(b)
                    && h != mine
                {
                    return Err(format!(
                        "sequence {id}: block {i} ({b}) cached as {h:?}, the sequence's hash is {mine:?}"
                    ));
                }
            }
        }
        Ok(())
    }
}
