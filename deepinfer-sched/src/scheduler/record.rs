//! The scheduler's internal records: a live request ([`Req`]), its key in the
//! waiting queue ([`WaitKey`]), and the rows of a step in flight ([`Flight`]).
//!
//! Layout guarantees (checked by the tests below): everything a steady decode
//! row reads and writes is in the first cache line of its [`Req`], what
//! `sync_kv` and `flush_computed` read of it in the second, `Option<Req>`
//! costs no space, and a [`DecodeFlight`] is 32 bytes.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use deepinfer_kv::SeqHandle;

use crate::cost_model::StepFeatures;
use crate::request::RequestId;

/// Multiplicative hashing for caller-chosen u64 ids (SipHash costs more than the
/// rest of a lookup; ids are not attacker-controlled inside an engine).
#[derive(Default)]
pub(super) struct IdHasher(u64);
impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}
pub(super) type IdMap<V> = HashMap<RequestId, V, BuildHasherDefault<IdHasher>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Waiting,
    Running,
}

/// A live request. `repr(C)` with the alignment puts everything a steady
/// decode row reads and writes, in `schedule_into` and in `update`, in the
/// first cache line (lengths are `u32`: the context limit is capped to fit);
/// the rest is cold. `has_stops` is the first field with a large niche, so the
/// tag of `Option<Req>` lives in the hot line too.
#[derive(Debug, Clone)]
#[repr(C, align(64))]
pub(super) struct Req {
    // Hot line.
    pub(super) tokens: Vec<u32>,
    pub(super) id: RequestId,
    /// Tokens whose KV is computed or scheduled.
    pub(super) scheduled: u32,
    /// Tokens in the KV sequence, drafts excluded (the block manager has been
    /// given `kv_synced` of them).
    pub(super) kv_len: u32,
    /// Free slots in the sequence's last block (so growth needs no division).
    pub(super) kv_room: u32,
    /// Committed length at which the block holding the next decode input is
    /// full (then its blocks are reported computed to the prefix cache).
    pub(super) next_full: u32,
    /// History length at which the request stops: `prompt_len +
    /// max_new_tokens`, capped by the context limit.
    pub(super) limit: u32,
    /// Set each time the request is placed in the running slab (admission,
    /// fork) from a counter: a row in flight belongs to this request, on this
    /// KV sequence, only while the record's epoch is the row's (a preempted
    /// request keeps its epoch while parked, and is re-admitted only once its
    /// rows have landed).
    pub(super) epoch: u32,
    /// Placeholder drafts after the committed tokens.
    pub(super) kv_drafts: u32,
    pub(super) has_stops: bool,
    /// `confidences` is not empty.
    pub(super) has_confs: bool,
    /// Row groups of this request in steps in flight.
    pub(super) inflight: u8,
    /// Rows in flight that will append a token to the history (once a row
    /// samples, every later row of the request samples too).
    pub(super) sampling_rows: u8,
    // Cold.
    /// The KV sequence's handle (skips the id lookup).
    pub(super) kv: Option<SeqHandle>,
    pub(super) arrival: u64,
    /// Bumped whenever the KV sequence is dropped (preemption): keys of the
    /// waiting queue from an older incarnation are stale.
    pub(super) incarnation: u32,
    pub(super) phase: Phase,
    /// Tokens of the history handed to the KV sequence so far (`<= kv_len`).
    /// A steady decode row only counts its input in `kv_len`; the tokens go
    /// to the block manager in one call per block (see `sync_kv`), so a decode
    /// step touches no per-sequence state of the manager.
    pub(super) kv_synced: usize,
    pub(super) prompt_len: usize,
    pub(super) max_new_tokens: usize,
    pub(super) stop_tokens: Vec<u32>,
    pub(super) priority: i32,
    /// Drafter confidences from the last output (budgeted speculation).
    pub(super) confidences: Vec<f64>,
    pub(super) preempted_before: bool,
}

impl Req {
    /// A vacant entry of the running slab (epoch 0; allocates nothing).
    pub(super) fn vacant() -> Self {
        Req {
            tokens: Vec::new(),
            id: 0,
            scheduled: 0,
            kv_len: 0,
            kv_room: 0,
            next_full: 0,
            limit: 0,
            epoch: 0,
            kv_drafts: 0,
            has_stops: false,
            has_confs: false,
            inflight: 0,
            sampling_rows: 0,
            kv: None,
            arrival: 0,
            incarnation: 0,
            phase: Phase::Waiting,
            kv_synced: 0,
            prompt_len: 0,
            max_new_tokens: 0,
            stop_tokens: Vec::new(),
            priority: 0,
            confidences: Vec::new(),
            preempted_before: false,
        }
    }

    pub(super) fn output_len(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }
}

/// A waiting request's place in the queue; stale once its parked slot holds
/// another arrival or incarnation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct WaitKey {
    pub(super) priority: i32,
    pub(super) arrival: u64,
    pub(super) slot: u32,
    pub(super) incarnation: u32,
}
impl Ord for WaitKey {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        // Greatest first: higher priority, then earlier arrival.
        self.priority
            .cmp(&o.priority)
            .then(o.arrival.cmp(&self.arrival))
            .then(o.slot.cmp(&self.slot))
            .then(self.incarnation.cmp(&o.incarnation))
    }
}
impl PartialOrd for WaitKey {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

/// A prefill chunk in flight.
#[derive(Debug, Clone, Copy)]
pub(super) struct FlightRow {
    pub(super) slot: u32,
    /// The request's placement epoch (a freed slot may be reused).
    pub(super) epoch: u32,
    pub(super) id: RequestId,
    pub(super) start: usize,
    pub(super) len: usize,
    pub(super) samples: bool,
    /// Cancelled by a later update: the engine drops it, the output skips it.
    pub(super) cancelled: bool,
}

/// A decode row in flight (32 bytes: the decode list is the long one).
#[derive(Debug, Clone, Copy)]
pub(super) struct DecodeFlight {
    pub(super) id: RequestId,
    /// Input position.
    pub(super) position: u32,
    pub(super) slot: u32,
    /// The request's placement epoch (a freed slot may be reused).
    pub(super) epoch: u32,
    pub(super) drafts: u16,
    /// Blocks reserved for a provisional row (released when it is
    /// materialised or cancelled).
    pub(super) reserved: u16,
    pub(super) provisional: bool,
    /// Cancelled by a later update: the engine drops it, the output skips it.
    pub(super) cancelled: bool,
}

/// A step planned and not yet updated.
#[derive(Debug, Clone)]
pub(super) struct Flight {
    pub(super) step: u64,
    /// Row groups in output order: the prefill chunks, then the decode rows
    /// (two vectors, so the large decode list is never copied).
    pub(super) prefill: Vec<FlightRow>,
    pub(super) rows: Vec<DecodeFlight>,
    /// Decode rows marked cancelled (so `update` counts the live ones without
    /// a pass over the list).
    pub(super) cancelled_rows: usize,
    pub(super) features: StepFeatures,
    pub(super) num_tokens: usize,
    /// Blocks reserved by its provisional rows still to be materialised.
    pub(super) reserved: usize,
}

#[cfg(test)]
mod layout_tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// What a steady decode row touches stays in one cache line per record and
    /// 32 bytes per row in flight.
    #[test]
    fn hot_fields_fit_the_first_cache_line() {
        let end = offset_of!(Req, sampling_rows) + 1;
        assert!(end <= 64, "hot line ends at {end}");
        for off in [
            offset_of!(Req, tokens),
            offset_of!(Req, id),
            offset_of!(Req, scheduled),
            offset_of!(Req, kv_len),
            offset_of!(Req, kv_room),
            offset_of!(Req, next_full),
            offset_of!(Req, limit),
            offset_of!(Req, epoch),
            offset_of!(Req, kv_drafts),
            offset_of!(Req, has_stops),
            offset_of!(Req, has_confs),
            offset_of!(Req, inflight),
        ] {
            assert!(off < 64);
        }
        // What `flush_computed` and `sync_kv` read of a queued block's record
        // is on the second line (`prefetch_cold_line`).
        for off in [offset_of!(Req, kv), offset_of!(Req, kv_synced)] {
            assert!((64..128).contains(&off), "cold field at {off}");
        }
        // The slab's `Option` costs no space (its tag sits in a niche).
        assert_eq!(size_of::<Option<Req>>(), size_of::<Req>());
        assert_eq!(size_of::<DecodeFlight>(), 32);
    }
}
