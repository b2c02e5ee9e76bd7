//! Copy-on-write fork of a sequence.

use crate::error::{KvError, Result};

use super::{BlockManager, CopyOp};

impl BlockManager {
    /// Forks `parent` into a new sequence `child` (beam search, parallel sampling). The child
    /// shares every full block; a partly filled last block is copied into a fresh block for the
    /// child, and the returned [`CopyOp`] tells the engine to copy it. All or nothing.
    pub fn fork(&mut self, parent: u64, child: u64) -> Result<Option<CopyOp>> {
        if self.ids.contains_key(&child) {
            return Err(KvError::SequenceExists(child));
        }
        let bs = self.cfg.block_size;
        let p = self.seq(parent)?;
        let mut c = p.clone();
        c.id = child;
        let partial = !p.len.is_multiple_of(bs);
        let mut copy = None;
        if partial {
            let src = *c.blocks.last().ok_or(KvError::UnknownSequence(parent))?;
            let dst = self.pool.allocate()?;
            *c.blocks
                .last_mut()
                .ok_or(KvError::UnknownSequence(parent))? = dst;
            copy = Some(CopyOp { src, dst });
        }
        let shared = c.blocks.len() - usize::from(partial);
        for &b in &c.blocks[..shared] {
            self.pool.retain(b)?;
        }
        self.insert_seq(c);
        Ok(copy)
    }
}
