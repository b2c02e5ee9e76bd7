//! A matcher that lets free text through until its trigger tokens, e.g. JSON
//! only after `</think>`, or a tool-call grammar only from the DSML marker
//! token after `</think>`.

use super::{GrammarError, Matcher};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Free text until `arm_after` (e.g. `</think>`).
    Waiting,
    /// Free text until `trigger` (e.g. the DSML marker).
    Armed,
    /// The inner grammar constrains every token.
    Active,
}

/// Free text, then the inner grammar from a trigger token id on. Triggers are
/// token ids, so text that merely spells them never engages the grammar.
pub struct Triggered {
    inner: Box<dyn Matcher>,
    arm_after: Option<u32>,
    trigger: Option<u32>,
    vocab_size: usize,
    /// Phase before each accepted token, for rollback.
    history: Vec<Phase>,
    phase: Phase,
}

impl std::fmt::Debug for Triggered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Triggered")
            .field("phase", &self.phase)
            .field("arm_after", &self.arm_after)
            .field("trigger", &self.trigger)
            .finish_non_exhaustive()
    }
}

impl Triggered {
    /// Engage `inner` after token `arm_after` (if any) and then token
    /// `trigger` (if any); with neither, `inner` constrains from the start.
    pub fn new(
        inner: Box<dyn Matcher>,
        arm_after: Option<u32>,
        trigger: Option<u32>,
        vocab_size: usize,
    ) -> Self {
        let phase = match (arm_after, trigger) {
            (Some(_), _) => Phase::Waiting,
            (None, Some(_)) => Phase::Armed,
            (None, None) => Phase::Active,
        };
        Self {
            inner,
            arm_after,
            trigger,
            vocab_size,
            history: Vec::new(),
            phase,
        }
    }

    /// Whether the inner grammar is engaged.
    pub fn is_active(&self) -> bool {
        self.phase == Phase::Active
    }
}

impl Matcher for Triggered {
    fn fill_bitmask(&mut self, mask: &mut [u32]) -> Result<(), GrammarError> {
        if self.phase == Phase::Active {
            return self.inner.fill_bitmask(mask);
        }
        mask.fill(0);
        for id in 0..self.vocab_size {
            if let Some(word) = mask.get_mut(id / 32) {
                *word |= 1 << (id % 32);
            }
        }
        Ok(())
    }

    fn accept(&mut self, token: u32) -> Result<(), GrammarError> {
        let before = self.phase;
        match self.phase {
            Phase::Active => self.inner.accept(token)?,
            Phase::Waiting if Some(token) == self.arm_after => {
                self.phase = if self.trigger.is_some() {
                    Phase::Armed
                } else {
                    Phase::Active
                };
            }
            Phase::Armed if Some(token) == self.trigger => self.phase = Phase::Active,
            Phase::Waiting | Phase::Armed => {}
        }
        self.history.push(before);
        Ok(())
    }

    fn rollback(&mut self, count: usize) -> Result<(), GrammarError> {
        if count > self.history.len() {
            return Err(GrammarError::Rollback(count));
        }
        for _ in 0..count {
            let before = self.history.pop().unwrap_or(Phase::Waiting);
            if before == Phase::Active {
                self.inner.rollback(1)?;
            }
            self.phase = before;
        }
        Ok(())
    }

    fn is_complete(&self) -> bool {
        self.phase != Phase::Active || self.inner.is_complete()
    }
}
