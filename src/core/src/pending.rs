//! A request between its post and its completion: its record (`PendingDto`), the IA's table of
//! them by wr_id, and what the completion needs of the EP and RMR it names (`EpShared`,
//! `Window`). The table is the IA's, below every object, so it holds those two through what
//! `completion` reads of them, not through the types `Ep` and `Rmr`.

use std::any::Any;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use super::counters::{self, Counters};
use super::handle_table::Handle;
use daplrs_backend::WrContext;

/// A posted request the core waits to see completed.
pub(crate) struct PendingDto {
    /// NULL for SRQ receives: the EP is known only from the completing QP.
    pub ep: Handle,
    pub cookie: u64,
    pub op: u32,
    /// DAT_COMPLETION_SUPPRESS_FLAG / UNSIGNALLED: no event on success.
    pub report_success: bool,
    /// For an RMR bind: the RMR and the rmr_context the bind gives.
    pub rmr: Option<(Arc<dyn Window>, u32)>,
    /// For an IB-extension request: the DAT_IB_EXT_TYPE its DAT_IB_DTO_EVENT reports.
    pub ext: Option<u32>,
}

/// The wr_id of the `seq`th request an EP posted with its record carried by the backend
/// (`Carried`): unique among the QP's requests in flight (a queue holds fewer than
/// 2^32), and never a tracked request's, whose generation bits are never all 0.
#[inline]
pub(crate) fn carried_wr_id(seq: u64) -> u64 {
    seq & u64::from(u32::MAX)
}

/// How a carried record's third word says what the request is: the operation, whether its
/// success is reported, and a mark that it is a record at all (`WrContext::NONE` is not); a
/// receive's also says that it is one and the DAT_IB_EXT_TYPE its event reports, if any.
const CARRIED: u64 = 1 << 63;
const REPORT_SUCCESS: u64 = 1 << 62;
const RECEIVE: u64 = 1 << 61;
const HAS_EXT: u64 = 1 << 60;
const EXT_SHIFT: u32 = 32;
const EXT_MASK: u64 = 0xffff;

/// The whole record of a send, RDMA write or RDMA read: what its completion's event names.
/// It rides in the request's context (`SendWr::ctx`), which the backend keeps in its own
/// record of the request and hands back in every completion: no entry in the IA's table, and
/// plain words with no drop on either path (a bind, an extended request or a receive holds
/// more and is a `PendingDto` in the table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Carried {
    pub ep: Handle,
    pub cookie: u64,
    pub op: u32,
    /// DAT_COMPLETION_SUPPRESS_FLAG / UNSIGNALLED: no event on success.
    pub report_success: bool,
}

impl Carried {
    /// The record as the request's context.
    #[inline]
    pub(crate) fn ctx(self) -> WrContext {
        let report = if self.report_success {
            REPORT_SUCCESS
        } else {
            0
        };
        WrContext([
            self.cookie,
            self.ep.addr() as u64,
            CARRIED | report | u64::from(self.op),
        ])
    }

    /// The record a completion carries back, if it carries one of a send-queue request.
    #[inline]
    pub(crate) fn from_ctx(ctx: &WrContext) -> Option<Carried> {
        let [cookie, ep, word] = ctx.0;
        if word & (CARRIED | RECEIVE) != CARRIED {
            return None;
        }
        Some(Carried {
            ep: Handle::from_ptr(ep as usize as *const std::ffi::c_void),
            cookie,
            op: word as u32,
            report_success: word & REPORT_SUCCESS != 0,
        })
    }
}

/// The whole record of a receive of an EP's own queue (not an SRQ's): what its completion's
/// event names and counts. Like `Carried` it rides in the request's context (`RecvWr::ctx`),
/// which the backend keeps in its record of the receive and hands back in every completion
/// of it: no entry in the IA's table. The context holds the record's reference to the EP's
/// `EpShared` (the EP may be gone when its receives complete, flushed), which `from_ctx`
/// takes back, once, with the completion.
pub(crate) struct Received {
    pub shared: Arc<EpShared>,
    pub cookie: u64,
    pub op: u32,
    /// DAT_COMPLETION_SUPPRESS_FLAG / UNSIGNALLED: no event on success.
    pub report_success: bool,
    /// For a datagram EP's receive: the DAT_IB_EXT_TYPE its DAT_IB_DTO_EVENT reports.
    pub ext: Option<u32>,
}

impl Received {
    /// The record as the receive's context.
    #[inline]
    pub(crate) fn ctx(
        shared: Arc<EpShared>,
        cookie: u64,
        op: u32,
        ext: Option<u32>,
        report_success: bool,
    ) -> WrContext {
        let report = if report_success { REPORT_SUCCESS } else { 0 };
        let ext = ext.map_or(0, |k| HAS_EXT | ((u64::from(k) & EXT_MASK) << EXT_SHIFT));
        WrContext([
            cookie,
            Arc::into_raw(shared) as usize as u64,
            CARRIED | RECEIVE | report | ext | u64::from(op),
        ])
    }

    /// The record a receive's completion carries back (`ctx`), if it carries one.
    ///
    /// # Safety
    /// Once per receive: the context's reference to the EP's `EpShared` becomes the returned
    /// record's. Every backend gives a receive's context back in exactly one completion (the
    /// trait's contract for `post_recv`), and that completion is converted (`completion`) or
    /// retired exactly once; a post the backend refused gives it back to the poster.
    #[inline]
    pub(crate) unsafe fn from_ctx(ctx: &WrContext) -> Option<Received> {
        let [cookie, shared, word] = ctx.0;
        if word & (CARRIED | RECEIVE) != CARRIED | RECEIVE {
            return None;
        }
        // SAFETY: `shared` is `Arc::into_raw` of an `Arc<EpShared>` (`ctx`), whose
        // reference is taken back here once (the function's contract).
        let shared = unsafe { Arc::from_raw(shared as usize as *const EpShared) };
        Some(Received {
            shared,
            cookie,
            op: word as u32,
            report_success: word & REPORT_SUCCESS != 0,
            ext: (word & HAS_EXT != 0).then_some(((word >> EXT_SHIFT) & EXT_MASK) as u32),
        })
    }
}

/// The requests posted and not completed yet, by wr_id: a slab whose wr_id is a slot's index
/// (the low 28 bits; the 4 above name the table's shard, `Pending`) and the slot's generation
/// (the next 30: the top two bits are the backend's), so a post and its completion cost an
/// index, not a hash, and a wr_id of a retired request (a completion reported twice, a
/// backend's bug) finds nothing.
#[derive(Default)]
pub(crate) struct PendingTable {
    slots: Vec<(u32, Option<PendingDto>)>,
    free: Vec<u32>,
}

const GENERATION_MASK: u32 = (1 << 30) - 1;
const INDEX_BITS: u32 = 28;
const INDEX_MASK: u32 = (1 << INDEX_BITS) - 1;

// Both inlined into the IA's `track` and `untrack`, as they were when the table was the IA's
// own: a call of its own costs the post and the reap a few instructions each.
impl PendingTable {
    #[inline]
    pub(crate) fn insert(&mut self, p: PendingDto) -> u64 {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push((0, None));
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[index as usize];
        // Never generation 0: a wr_id with none is a carried request's (`carried_wr_id`).
        slot.0 = (slot.0 & GENERATION_MASK) % GENERATION_MASK + 1;
        slot.1 = Some(p);
        (u64::from(slot.0) << 32) | u64::from(index)
    }

    /// Whether a new request would get an index the wr_id has room for.
    fn has_room(&self) -> bool {
        !self.free.is_empty() || self.slots.len() <= INDEX_MASK as usize
    }

    #[inline]
    pub(crate) fn remove(&mut self, wr_id: u64) -> Option<PendingDto> {
        let index = wr_id as u32 & INDEX_MASK;
        let generation = (wr_id >> 32) as u32;
        let slot = self.slots.get_mut(index as usize)?;
        if slot.0 != generation || slot.1.is_none() {
            return None;
        }
        self.free.push(index);
        slot.1.take()
    }

    pub(crate) fn clear(&mut self) {
        self.slots.clear();
        self.free.clear();
    }
}

/// The IA's requests in flight, in `SHARDS` tables, each behind its own lock on its own cache
/// lines: an EP's (or SRQ's) requests go to the shard its handle names, so threads posting on
/// different EPs of one IA neither wait for one lock nor pass its cache lines between them
/// (one table: a third of a 2-thread same-host run was spent there, `bench/mtrate -s`). A
/// wr_id names its shard, so a completion finds its request without knowing the EP.
pub(crate) struct Pending {
    shards: [Shard; SHARDS],
}

const SHARDS: usize = 1 << (32 - INDEX_BITS);

/// One shard; 128 bytes apart (the adjacent-line prefetch pairs 64-byte lines).
#[repr(align(128))]
#[derive(Default)]
struct Shard(parking_lot::Mutex<PendingTable>);

impl Default for Pending {
    fn default() -> Pending {
        Pending {
            shards: std::array::from_fn(|_| Shard::default()),
        }
    }
}

impl Pending {
    /// Records `p`, posted on the EP or SRQ `owner`; returns its wr_id, or None when the
    /// shard holds 2^28 requests already.
    #[inline]
    pub(crate) fn insert(&self, owner: Handle, p: PendingDto) -> Option<u64> {
        // Handles are 32-byte slots, handed out in order: consecutive EPs, different shards.
        let shard = (owner.addr() >> 5) % SHARDS;
        let mut t = self.shards[shard].0.lock();
        if !t.has_room() {
            return None;
        }
        Some(t.insert(p) | ((shard as u64) << INDEX_BITS))
    }

    #[inline]
    pub(crate) fn remove(&self, wr_id: u64) -> Option<PendingDto> {
        let shard = (wr_id as u32 >> INDEX_BITS) as usize;
        self.shards[shard].0.lock().remove(wr_id)
    }

    pub(crate) fn clear(&self) {
        for s in &self.shards {
            s.0.lock().clear();
        }
    }
}

/// What the completion of one of an EP's receives needs of the EP, shared with the receive's
/// tracking entry (`PendingDto::recv`) and the IA's QP index: the completion is counted and its
/// notification decided without the EP itself (the IA's table sits below it) and, for its own
/// receives, without finding it by its QP number (a map under a lock) on the reap path.
pub(crate) struct EpShared {
    /// The EP's handle, which an SRQ receive's event names.
    pub(crate) handle: Handle,
    /// DCNT_EP_* (see `counters`).
    pub(crate) counters: Counters,
    /// `attr.recv_completion_flags`, readable without the EP lock (the EVD reads it while it
    /// drains completions, which happens under EP locks).
    recv_flags: AtomicU32,
}

impl EpShared {
    pub(crate) fn new(handle: Handle, recv_completion_flags: u32) -> EpShared {
        EpShared {
            handle,
            counters: Counters::new(counters::ep::ALL),
            recv_flags: AtomicU32::new(recv_completion_flags),
        }
    }

    /// The EP's recv_completion_flags, without taking its lock.
    pub(crate) fn recv_completion_flags(&self) -> u32 {
        self.recv_flags.load(Ordering::Relaxed)
    }

    /// dat_ep_modify changed them.
    pub(crate) fn set_recv_completion_flags(&self, flags: u32) {
        self.recv_flags.store(flags, Ordering::Relaxed);
    }

    /// Counts a posted or completed request: DCNT_EP_x, and its bytes in DCNT_EP_x_DATA (the
    /// counter after it).
    #[inline]
    pub(crate) fn count(&self, counter: usize, bytes: u64) {
        self.counters.inc(counter);
        self.counters.add(counter + 1, bytes);
    }
}

/// An RMR as a bind's completion and a peer's send-with-invalidate reach it (rmr.rs implements
/// it): both can end its binding.
pub(crate) trait Window: Send + Sync {
    fn handle(&self) -> Handle;
    /// Whether the RMR's latest bind gave `rmr_context` and it is bound.
    fn is_bound_as(&self, rmr_context: u32) -> bool;
    /// The bind that gave `rmr_context` failed, or the peer invalidated it: if it is still
    /// the latest, the window stops granting access and the LMR is released.
    fn bind_failed(&self, rmr_context: u32);
    /// The RMR itself, for rmr.rs, which names its type.
    fn as_any(&self) -> &dyn Any;
}

#[cfg(test)]
mod tests {
    use super::{Pending, PendingDto, PendingTable, SHARDS};
    use crate::handle_table::Handle;

    fn dto(cookie: u64) -> PendingDto {
        PendingDto {
            ep: Handle::NULL,
            cookie,
            op: 0,
            report_success: true,
            rmr: None,
            ext: None,
        }
    }

    /// Each wr_id finds its request once; a slot reused gets a new wr_id, and the old one
    /// (a completion reported twice) finds nothing; the backend's two top bits stay clear.
    #[test]
    fn a_wr_id_finds_its_request_once() {
        let mut t = PendingTable::default();
        let a = t.insert(dto(1));
        let b = t.insert(dto(2));
        assert_ne!(a, b);
        assert_eq!(t.remove(a).map(|p| p.cookie), Some(1));
        assert!(t.remove(a).is_none(), "retired");
        let c = t.insert(dto(3));
        assert_ne!(c, a, "the slot is reused under another wr_id");
        assert_eq!(c as u32, a as u32, "same slot");
        assert!(t.remove(a).is_none());
        assert_eq!(t.remove(c).map(|p| p.cookie), Some(3));
        assert_eq!(t.remove(b).map(|p| p.cookie), Some(2));
        assert!(t.remove(u64::MAX).is_none() && t.remove(0).is_none());
        for _ in 0..100_000 {
            let id = t.insert(dto(0));
            assert_eq!(id >> 62, 0);
            assert!(t.remove(id).is_some());
        }
    }

    /// A send's, write's or read's record rides in its context and comes back whole; an empty
    /// context carries none; a carried request's wr_id is never a tracked one's.
    #[test]
    fn a_carried_record_comes_back_whole() {
        use super::{carried_wr_id, Carried};
        use daplrs_backend::WrContext;
        let c = Carried {
            ep: Handle::from_ptr(0x7f00_0000_1020 as *const _),
            cookie: 0xfeed_beef_0000_0001,
            op: 3,
            report_success: false,
        };
        assert_eq!(Carried::from_ctx(&c.ctx()), Some(c));
        let reported = Carried {
            report_success: true,
            ..c
        };
        assert_eq!(Carried::from_ctx(&reported.ctx()), Some(reported));
        assert!(Carried::from_ctx(&WrContext::NONE).is_none());
        let mut t = PendingTable::default();
        for _ in 0..3 {
            let id = t.insert(dto(1));
            assert_ne!(id >> 32, 0, "a tracked wr_id has a generation");
            t.remove(id);
        }
        assert_eq!(carried_wr_id(u64::from(u32::MAX) + 5) >> 32, 0);
    }

    /// A receive's record rides in its context and comes back whole, with its reference to
    /// the EP's counters taken back once; a send-queue record is not a receive's, nor the
    /// reverse.
    #[test]
    fn a_receive_record_comes_back_whole() {
        use super::{Carried, EpShared, Received};
        use std::sync::Arc;
        let shared = Arc::new(EpShared::new(
            Handle::from_ptr(0x7f00_0000_2040 as *const _),
            0,
        ));
        for (ext, report) in [(None, true), (Some(9u32), false)] {
            let ctx = Received::ctx(shared.clone(), 0xabcd, 14, ext, report);
            assert_eq!(
                Arc::strong_count(&shared),
                2,
                "the context holds a reference"
            );
            assert!(Carried::from_ctx(&ctx).is_none(), "not a send-queue record");
            // SAFETY: the context is taken back once, here.
            let r = unsafe { Received::from_ctx(&ctx) }.expect("a receive's record");
            assert_eq!(r.shared.handle, shared.handle);
            assert_eq!(
                (r.cookie, r.op, r.ext, r.report_success),
                (0xabcd, 14, ext, report)
            );
            drop(r);
            assert_eq!(Arc::strong_count(&shared), 1, "taken back and dropped");
        }
        let send = Carried {
            ep: shared.handle,
            cookie: 1,
            op: 0,
            report_success: true,
        };
        // SAFETY: not a receive's context: nothing is taken.
        assert!(unsafe { Received::from_ctx(&send.ctx()) }.is_none());
        // SAFETY: as above.
        assert!(unsafe { Received::from_ctx(&daplrs_backend::WrContext::NONE) }.is_none());
    }

    /// Consecutive handles' requests go to different shards, and each wr_id finds its own
    /// request through its shard only, whatever the index in the shard.
    #[test]
    fn each_shard_answers_its_own_wr_ids() {
        let pending = Pending::default();
        let owner = |i: usize| Handle::from_ptr((0x10_0000 + 32 * i) as *const _);
        let ids: Vec<u64> = (0..2 * SHARDS)
            .map(|i| pending.insert(owner(i), dto(i as u64)).unwrap())
            .collect();
        let shard = |id: u64| (id as u32 >> 28) as usize;
        assert_ne!(shard(ids[0]), shard(ids[1]));
        assert_eq!(shard(ids[0]), shard(ids[SHARDS]));
        assert!(ids.iter().all(|id| id >> 62 == 0));
        for (i, id) in ids.iter().enumerate().rev() {
            assert_eq!(pending.remove(*id).map(|p| p.cookie), Some(i as u64));
            assert!(pending.remove(*id).is_none(), "retired");
        }
        // A wr_id naming another shard than its own finds nothing there.
        let id = pending.insert(owner(0), dto(7)).unwrap();
        assert!(pending.remove(id ^ (1 << 28)).is_none());
        assert_eq!(pending.remove(id).map(|p| p.cookie), Some(7));
    }
}
