//! The two record slabs of the scheduler: running requests (dense, renumbered
//! into running order when slot reuse scatters them) and parked ones (waiting
//! or preempted), with the id index over both.

use super::{Req, Scheduler};
use crate::request::RequestId;

/// Where a live request's record is: a slot of the dense running slab, or of
/// the parked slab (waiting and preempted requests). Keeping the running
/// records apart makes them dense, whatever the number of waiting requests, so
/// the per-step walk over them stays in a few hundred KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Loc {
    pub(super) slot: u32,
    pub(super) parked: bool,
}

impl Scheduler {
    /// The record at `loc`, if any.
    pub(super) fn get(&self, loc: Loc) -> Option<&Req> {
        let slab = if loc.parked {
            &self.parked
        } else {
            &self.slots
        };
        slab.get(loc.slot as usize)?.as_ref()
    }

    /// The record at `loc`, if any, mutably.
    pub(super) fn get_mut(&mut self, loc: Loc) -> Option<&mut Req> {
        let slab = if loc.parked {
            &mut self.parked
        } else {
            &mut self.slots
        };
        slab.get_mut(loc.slot as usize)?.as_mut()
    }

    /// The running request in `slot`.
    pub(super) fn req(&self, slot: u32) -> &Req {
        // Slots in the running list always hold a request; see `release`.
        self.slots[slot as usize]
            .as_ref()
            .unwrap_or_else(|| unreachable!("running slot {slot} is empty"))
    }

    /// The running request in `slot`, mutably.
    pub(super) fn req_mut(&mut self, slot: u32) -> &mut Req {
        self.slots[slot as usize]
            .as_mut()
            .unwrap_or_else(|| unreachable!("running slot {slot} is empty"))
    }

    /// Where the request of a row in flight is now, if it is still the same
    /// request (same arrival). The fast path is its running slot; a request
    /// preempted since lives in the parked slab, found through its id.
    #[inline]
    pub(super) fn find_row(&self, slot: u32, id: RequestId, arrival: u64) -> Option<Loc> {
        if let Some(Some(r)) = self.slots.get(slot as usize)
            && r.arrival == arrival
        {
            return Some(Loc {
                slot,
                parked: false,
            });
        }
        self.find_moved(id, arrival)
    }

    #[cold]
    #[inline(never)]
    pub(super) fn find_moved(&self, id: RequestId, arrival: u64) -> Option<Loc> {
        let loc = *self.ids.get(&id)?;
        (self.get(loc)?.arrival == arrival).then_some(loc)
    }

    /// Put a record into a slab; returns its location.
    pub(super) fn place(&mut self, r: Req, parked: bool) -> Loc {
        let id = r.id;
        let (slab, free) = if parked {
            (&mut self.parked, &mut self.free_parked)
        } else {
            (&mut self.slots, &mut self.free_slots)
        };
        let slot = match free.pop() {
            Some(s) => {
                slab[s as usize] = Some(r);
                s
            }
            None => {
                slab.push(Some(r));
                (slab.len() - 1) as u32
            }
        };
        let loc = Loc { slot, parked };
        self.ids.insert(id, loc);
        loc
    }

    /// Renumber the running slab so that slot order is the running order: the
    /// per-step walks then read the records one after the other (which the
    /// hardware prefetcher follows) instead of hopping around the slab as slots
    /// are reused. Rows in flight are renumbered with them; a row whose request
    /// left the slab gets a slot that matches nothing, so it is resolved by id.
    pub(super) fn compact_running(&mut self) {
        let mut perm = std::mem::take(&mut self.perm_scratch);
        perm.clear();
        perm.resize(self.slots.len(), u32::MAX);
        let mut slab = std::mem::take(&mut self.slab_scratch);
        slab.clear();
        slab.reserve(self.slots.len());
        for &s in &self.running {
            perm[s as usize] = slab.len() as u32;
            slab.push(self.slots[s as usize].take());
        }
        // Only running requests live in this slab; keep any other record anyway.
        for (s, r) in self.slots.iter_mut().enumerate() {
            if r.is_some() {
                perm[s] = slab.len() as u32;
                slab.push(r.take());
            }
        }
        std::mem::swap(&mut self.slots, &mut slab);
        self.slab_scratch = slab;
        self.free_slots.clear();
        for (i, s) in self.running.iter_mut().enumerate() {
            *s = i as u32;
        }
        for (i, r) in self.slots.iter().enumerate() {
            if let Some(r) = r {
                self.ids.insert(
                    r.id,
                    Loc {
                        slot: i as u32,
                        parked: false,
                    },
                );
            }
        }
        let new_slot = |s: u32| perm.get(s as usize).copied().unwrap_or(u32::MAX);
        for f in &mut self.flights {
            for fr in &mut f.prefill {
                fr.slot = new_slot(fr.slot);
            }
            for fr in &mut f.rows {
                fr.slot = new_slot(fr.slot);
            }
        }
        self.perm_scratch = perm;
    }

    /// Take a record out of its slab (its id stays mapped; the caller re-places or forgets it).
    pub(super) fn take(&mut self, loc: Loc) -> Req {
        let (slab, free) = if loc.parked {
            (&mut self.parked, &mut self.free_parked)
        } else {
            (&mut self.slots, &mut self.free_slots)
        };
        let r = slab[loc.slot as usize]
            .take()
            .unwrap_or_else(|| unreachable!("taking empty slot {loc:?}"));
        free.push(loc.slot);
        r
    }

    /// Drop a request from every structure but the running list (caller's job).
    pub(super) fn release(&mut self, loc: Loc) -> Req {
        let r = self.take(loc);
        self.ids.remove(&r.id);
        r
    }
}
