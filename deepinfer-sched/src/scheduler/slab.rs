//! The two record slabs of the scheduler: running requests (dense, renumbered
//! into running order when slot reuse scatters them) and parked ones (waiting
//! or preempted), with the id index over both.

use super::{Req, Scheduler};
use crate::request::RequestId;
use std::mem;

/// Where a live request's record is: a slot of the dense running slab, or of
/// the parked slab (waiting and preempted requests). Keeping the running
/// records apart makes them dense, whatever the number of waiting requests, so
/// the per-step walk over them stays in a few hundred KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Loc {
    pub(super) slot: u32,
    pub(super) parked: bool,
}

/// The record at `loc` in the running slab (`slots`, where a vacant entry has
/// epoch 0) or the parked one, if any; a free function so callers can borrow
/// other fields of the scheduler meanwhile.
pub(super) fn slab_mut<'a>(
    slots: &'a mut [Req],
    parked: &'a mut [Option<Req>],
    loc: Loc,
) -> Option<&'a mut Req> {
    if loc.parked {
        parked.get_mut(loc.slot as usize)?.as_mut()
    } else {
        slots.get_mut(loc.slot as usize).filter(|r| r.epoch != 0)
    }
}

impl Scheduler {
    /// The record at `loc`, if any.
    pub(super) fn get(&self, loc: Loc) -> Option<&Req> {
        if loc.parked {
            self.parked.get(loc.slot as usize)?.as_ref()
        } else {
            self.slots.get(loc.slot as usize).filter(|r| r.epoch != 0)
        }
    }

    /// The record at `loc`, if any, mutably.
    pub(super) fn get_mut(&mut self, loc: Loc) -> Option<&mut Req> {
        slab_mut(&mut self.slots, &mut self.parked, loc)
    }

    /// The running request in `slot`.
    pub(super) fn req(&self, slot: u32) -> &Req {
        // Slots in the running list always hold a request; see `release`.
        let r = &self.slots[slot as usize];
        debug_assert!(r.epoch != 0, "running slot {slot} is empty");
        r
    }

    /// The running request in `slot`, mutably.
    pub(super) fn req_mut(&mut self, slot: u32) -> &mut Req {
        let r = &mut self.slots[slot as usize];
        debug_assert!(r.epoch != 0, "running slot {slot} is empty");
        r
    }

    /// Where the request of a row in flight is now, if it is still the same
    /// request (same placement epoch). The fast path is its running slot; a
    /// request preempted since lives in the parked slab (with the epoch it
    /// had), found through its id.
    #[inline]
    pub(super) fn find_row(&self, slot: u32, id: RequestId, epoch: u32) -> Option<Loc> {
        // (Rows never carry epoch 0, so a vacant slot never matches.)
        if let Some(r) = self.slots.get(slot as usize)
            && r.epoch == epoch
            && r.id == id
        {
            return Some(Loc {
                slot,
                parked: false,
            });
        }
        self.find_moved(id, epoch)
    }

    #[cold]
    #[inline(never)]
    pub(super) fn find_moved(&self, id: RequestId, epoch: u32) -> Option<Loc> {
        let loc = *self.ids.get(&id)?;
        (self.get(loc)?.epoch == epoch).then_some(loc)
    }

    /// Put a record into a slab; returns its location. A record entering the
    /// running slab gets a new placement epoch (never 0, which marks a vacant
    /// running slot and a request that has not run yet).
    pub(super) fn place(&mut self, mut r: Req, parked: bool) -> Loc {
        let id = r.id;
        let slot = if parked {
            match self.free_parked.pop() {
                Some(s) => {
                    self.parked[s as usize] = Some(r);
                    s
                }
                None => {
                    self.parked.push(Some(r));
                    (self.parked.len() - 1) as u32
                }
            }
        } else {
            self.next_epoch = self.next_epoch.wrapping_add(1).max(1);
            r.epoch = self.next_epoch;
            match self.free_slots.pop() {
                Some(s) => {
                    self.slots[s as usize] = r;
                    s
                }
                None => {
                    self.slots.push(r);
                    (self.slots.len() - 1) as u32
                }
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
            slab.push(mem::replace(&mut self.slots[s as usize], Req::vacant()));
        }
        // Only running requests live in this slab; keep any other record anyway.
        for (s, r) in self.slots.iter_mut().enumerate() {
            if r.epoch != 0 {
                perm[s] = slab.len() as u32;
                slab.push(mem::replace(r, Req::vacant()));
            }
        }
        std::mem::swap(&mut self.slots, &mut slab);
        self.slab_scratch = slab;
        self.free_slots.clear();
        for (i, s) in self.running.iter_mut().enumerate() {
            *s = i as u32;
        }
        for (i, r) in self.slots.iter().enumerate() {
            if r.epoch != 0 {
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
        if loc.parked {
            self.free_parked.push(loc.slot);
            self.parked[loc.slot as usize]
                .take()
                .unwrap_or_else(|| unreachable!("taking empty slot {loc:?}"))
        } else {
            self.free_slots.push(loc.slot);
            let r = mem::replace(&mut self.slots[loc.slot as usize], Req::vacant());
            debug_assert!(r.epoch != 0, "taking empty slot {loc:?}");
            r
        }
    }

    /// Drop a request from every structure but the running list (caller's job).
    pub(super) fn release(&mut self, loc: Loc) -> Req {
        let r = self.take(loc);
        self.ids.remove(&r.id);
        r
    }
}
