//! IA: an opened interface adapter, as its objects see it: the backend device and its limits,
//! the async EVD, the handles of its objects and their limits, and what it keeps of them for
//! the paths that start below them (the device's connection events, its work completions): its
//! EPs by QP number, its service points by listener, its LMRs and RMRs by context, its posted
//! requests by wr_id.
//!
//! Every object holds its IA, so the IA names none of their types: what it keeps of an object
//! is what those paths call on it (`EpShared`, the `Window` of an RMR, the `EventQueue` of an
//! EVD) or the object erased (`AnyObject`), which the module naming its type downcasts. The
//! paths themselves are elsewhere: `completion` turns work completions into events (below the
//! EVD, whose drain runs it), `cm` routes connection events (above the objects); `lifecycle`
//! opens and closes an IA.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::consts::event_number;
use super::counters::{self, Counters};
use super::error::{DatError, DatResult, SubType};
use super::event::{Event, EventData};
use super::handle_table::{self, AnyObject, Handle, HandleKind, HandleObject, Reservation};
use super::lmr_table::LmrTable;
use super::pending::{EpShared, Pending, PendingDto, Window};
use daplrs_backend::intmap::{IntMap, IntSet};
use daplrs_backend::{CmEvent, Device};

/// What dat_ia_query reports (DAT_IA_ATTR, minus the fixed strings the ffi layer fills).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IaAttr {
    pub adapter_name: String,
    pub vendor_name: String,
    pub address: Ipv4Addr,
    pub max_eps: u32,
    pub max_dto_per_ep: u32,
    pub max_rdma_read_per_ep_in: u32,
    pub max_rdma_read_per_ep_out: u32,
    pub max_evds: u32,
    pub max_evd_qlen: u32,
    pub max_iov_segments_per_dto: u32,
    pub max_lmrs: u32,
    pub max_lmr_block_size: u64,
    pub max_lmr_virtual_address: u64,
    pub max_pzs: u32,
    pub max_message_size: u32,
    pub max_rdma_size: u32,
    pub max_rmrs: u32,
    pub max_rmr_target_address: u64,
    pub max_srqs: u32,
    pub max_ep_per_srq: u32,
    pub max_recv_per_srq: u32,
    pub max_iov_segments_per_rdma_read: u32,
    pub max_iov_segments_per_rdma_write: u32,
    pub max_rdma_read_in: u32,
    pub max_rdma_read_out: u32,
    pub max_private_data_size: u32,
}

/// An EVD as the IA's async events reach it (evd.rs implements it).
pub(crate) trait EventQueue: Send + Sync {
    fn handle(&self) -> Handle;
    /// Queues a provider-generated notification event (never dropped).
    fn push_provider(&self, event: Event);
    /// The EVD itself, for evd.rs, which names its type.
    fn into_any(self: Arc<Self>) -> Arc<AnyObject>;
}

/// An EP as its IA finds it by its QP's number.
pub(crate) struct QpOwner {
    /// What the completion of an SRQ receive the QP consumed needs of the EP.
    pub(crate) shared: Weak<EpShared>,
    /// The EP itself (an `Ep`, which cm.rs downcasts), for connection events.
    pub(crate) ep: Weak<AnyObject>,
}

pub struct Ia {
    handle: Handle,
    name: String,
    /// The address of the C dispatch table every handle of this IA starts with (the DAT
    /// version's provider table the IA was opened through; 0 in the core's own tests). The
    /// core only stores it: one core serves both ABIs, each IA through its own table.
    dispatch: usize,
    device: Arc<dyn Device>,
    /// The device's max_msg_size and max_rdma_size, the bounds every post checks (kept here:
    /// no call through the device for its whole attribute set per post).
    pub(crate) max_msg_size: u32,
    pub(crate) max_rdma_size: u32,
    /// Segments the device reads into (siw: one), which an RDMA read's checks look at.
    pub(crate) max_rdma_read_sge: u32,
    closed: AtomicBool,
    /// The IA's async EVD, and whether the IA created it (implicit ones are freed by graceful
    /// close).
    async_evd: Mutex<Option<(Weak<dyn EventQueue>, bool)>>,
    pub(crate) eps_by_qp: Mutex<IntMap<u32, QpOwner>>,
    /// Service points (each an `Sp`, which cm.rs and sp.rs downcast) by listener id.
    pub(crate) sps_by_listener: Mutex<IntMap<u64, Weak<AnyObject>>>,
    /// Requests that reached a listener before its service point was registered above (the
    /// backend listens, and may deliver a request, before `Sp::create` knows the listener's
    /// id): they wait here for `register_listener`, which hands them on. Guarded by the lock
    /// of `sps_by_listener`'s users in the order: `sps_by_listener`, then this.
    pub(crate) early_requests: Mutex<IntMap<u64, Vec<CmEvent>>>,
    /// Listeners whose service point is gone: a late request for one is rejected, not parked.
    pub(crate) closed_listeners: Mutex<IntSet<u64>>,
    /// The LMRs by lmr_context, with what a post checks of each, read without a lock.
    pub(crate) lmrs: LmrTable,
    /// RMRs by the rmr_context of their latest bind (stale entries are told apart by the
    /// RMR's own state): a peer's send-with-invalidate and dat_ep_post_rdma_read_to_rmr name
    /// an RMR by its context.
    pub(crate) rmrs_by_context: Mutex<IntMap<u32, Weak<dyn Window>>>,
    pending: Pending,
    /// DCNT_IA_* (see `counters`).
    pub(crate) counters: Counters,
    /// The device's count of dropped datagrams as last added to `counters`.
    ud_dropped_seen: AtomicU64,
}

/// The async EVD dat_ia_open is asked for.
#[derive(Clone, Copy, Debug)]
pub enum AsyncEvd {
    /// DAT_HANDLE_NULL given: the provider creates one of this queue length.
    Create(i32),
    /// A handle given: the consumer's existing async EVD.
    Existing(Handle),
    /// None at all (a consumer-created async EVD is adopted later).
    None,
}

/// What opens the device named by an IA's ia_params: the core knows no backend, so the
/// provider passes its device factory (`daplrs::device::open_device`), tests a backend's.
pub type OpenDevice = fn(&str) -> daplrs_backend::Result<Arc<dyn Device>>;

impl Ia {
    /// The IA of `device`, under a handle reserved for it (`Ia::open` commits it once the
    /// device's events reach it).
    pub(crate) fn new(
        name: &str,
        device: Arc<dyn Device>,
        dispatch: usize,
    ) -> (Arc<Ia>, Reservation) {
        let reservation = handle_table::reserve(HandleKind::Ia, dispatch);
        let dev = device.attr();
        let ia = Arc::new(Ia {
            handle: reservation.handle(),
            name: name.to_string(),
            dispatch,
            device,
            max_msg_size: dev.max_msg_size,
            max_rdma_size: dev.max_rdma_size,
            max_rdma_read_sge: dev.max_rdma_read_sge,
            closed: AtomicBool::new(false),
            async_evd: Mutex::new(None),
            eps_by_qp: Mutex::new(IntMap::default()),
            sps_by_listener: Mutex::new(IntMap::default()),
            early_requests: Mutex::new(IntMap::default()),
            closed_listeners: Mutex::new(IntSet::default()),
            lmrs: LmrTable::default(),
            rmrs_by_context: Mutex::new(IntMap::default()),
            pending: Pending::default(),
            counters: Counters::new(counters::ia::ALL),
            ud_dropped_seen: AtomicU64::new(0),
        });
        (ia, reservation)
    }

    pub fn handle(&self) -> Handle {
        self.handle
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The C dispatch table address every new handle of this IA starts with.
    pub fn dispatch(&self) -> usize {
        self.dispatch
    }
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }
    pub fn address(&self) -> Ipv4Addr {
        self.device.address()
    }

    pub(crate) fn check_open(&self) -> DatResult<()> {
        if self.closed.load(Ordering::SeqCst) {
            Err(HandleKind::Ia.invalid())
        } else {
            Ok(())
        }
    }

    /// dat_ia_close began: no object is created from now on.
    pub(crate) fn mark_closed(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    /// The IA's handle is gone: its device stops delivering events and closes, and the
    /// requests still tracked are forgotten.
    pub(crate) fn release_device(&self) {
        self.device.set_cm_handler(None);
        self.device.close();
        self.pending.clear();
    }

    // ---- the handles of its objects -----------------------------------------------------------

    /// Takes a handle value for a new object of this IA (its word: this IA's dispatch table).
    pub(crate) fn reserve(&self, kind: HandleKind) -> Reservation {
        handle_table::reserve(kind, self.dispatch)
    }

    /// Makes a new object of this IA reachable through its handle, and counts its creation
    /// (DCNT_IA_*_CREATE).
    pub(crate) fn commit<T: HandleObject>(&self, reservation: Reservation, object: &Arc<T>) {
        let kind = reservation.kind();
        if reservation.commit(object.clone(), self.handle) {
            if let Some(index) = create_counter(kind) {
                self.counters.inc(index);
            }
        }
    }

    /// Removes the handle of one of this IA's objects (freed, or torn down with the IA); later
    /// lookups fail. Counts the removal (DCNT_IA_*_FREE).
    pub(crate) fn remove(&self, handle: Handle, kind: HandleKind) -> DatResult<()> {
        if handle_table::remove(handle, kind)? {
            if let Some(index) = create_counter(kind) {
                // Each kind's FREE counter follows its CREATE counter (DCNT_IA_*;
                // PSP_CREATE_ANY sits between PSP's two).
                let free = if kind == HandleKind::Psp {
                    index + 2
                } else {
                    index + 1
                };
                self.counters.inc(free);
            }
        }
        Ok(())
    }

    /// DAT_INSUFFICIENT_RESOURCES with `sub` when the IA already has `limit` live objects of
    /// `kind`: the limits dat_ia_query reports (max_eps, max_lmrs, ...) hold. Checked before
    /// the object is built; callers creating concurrently may overshoot by their number.
    pub(crate) fn check_room(&self, kind: HandleKind, limit: u32, sub: SubType) -> DatResult<()> {
        if handle_table::owned_count(self.handle, kind) >= limit as usize {
            return Err(DatError::resources(sub));
        }
        Ok(())
    }

    // ---- the async EVD ------------------------------------------------------------------------

    /// The async EVD, if the IA has one (`Ia::async_evd`, in evd.rs, gives it typed).
    pub(crate) fn async_queue(&self) -> Option<Arc<dyn EventQueue>> {
        self.async_evd
            .lock()
            .as_ref()
            .and_then(|(w, _)| w.upgrade())
    }

    /// The async EVD the IA created itself, which a graceful close frees.
    pub(crate) fn implicit_async_evd(&self) -> Option<Handle> {
        let slot = self.async_evd.lock();
        match slot.as_ref() {
            Some((w, true)) => w.upgrade().map(|e| e.handle()),
            _ => None,
        }
    }

    /// Makes the async EVD `evd` (created by the IA when `implicit`) the IA's: an implicit one
    /// at open, a consumer-created one only if the IA has none.
    pub(crate) fn adopt_async_evd<E: EventQueue + 'static>(&self, evd: &Arc<E>, implicit: bool) {
        let mut slot = self.async_evd.lock();
        let has_live = slot
            .as_ref()
            .map(|(w, _)| w.strong_count() > 0)
            .unwrap_or(false);
        if implicit || !has_live {
            let weak: Weak<dyn EventQueue> = Arc::downgrade(evd) as Weak<dyn EventQueue>;
            *slot = Some((weak, implicit));
        }
    }

    pub(crate) fn forget_async_evd(&self, evd: Handle) {
        let mut slot = self.async_evd.lock();
        let is_it = slot
            .as_ref()
            .and_then(|(w, _)| w.upgrade())
            .map(|e| e.handle() == evd)
            .unwrap_or(false);
        if is_it {
            *slot = None;
        }
    }

    /// Queues an async error event (no-op without an async EVD).
    pub(crate) fn post_async(&self, number: u32, object: Handle, source_evd: Handle) {
        if let Some(evd) = self.async_queue() {
            if evd.handle() == source_evd && number == event_number::ASYNC_EVD_OVERFLOW {
                return; // an overflowing async EVD cannot report itself
            }
        }
        self.post_async_reason(number, object, 0);
    }

    /// Queues an async error event naming `object` with an object-specific `reason` (see
    /// `consts::async_reason`); no-op without an async EVD.
    pub(crate) fn post_async_reason(&self, number: u32, object: Handle, reason: u32) {
        if let Some(evd) = self.async_queue() {
            evd.push_provider(Event {
                number,
                evd: evd.handle(),
                data: EventData::Async {
                    handle: object,
                    reason,
                },
            });
        }
    }

    /// dat_ia_query.
    pub fn query(&self) -> IaAttr {
        let a = self.device.attr();
        IaAttr {
            adapter_name: self.device.name(),
            vendor_name: "udapl-rs".to_string(),
            address: self.device.address(),
            max_eps: a.max_qp,
            max_dto_per_ep: a.max_qp_wr,
            max_rdma_read_per_ep_in: a.max_rd_atomic,
            max_rdma_read_per_ep_out: a.max_rd_atomic,
            max_evds: a.max_cq,
            max_evd_qlen: a.max_cqe,
            max_iov_segments_per_dto: a.max_sge,
            max_lmrs: a.max_mr,
            max_lmr_block_size: a.max_mr_size,
            max_lmr_virtual_address: u64::MAX,
            max_pzs: a.max_pd,
            max_message_size: a.max_msg_size,
            max_rdma_size: a.max_rdma_size,
            max_rmrs: a.max_mw,
            max_rmr_target_address: u64::MAX,
            max_srqs: a.max_srq,
            max_ep_per_srq: a.max_qp,
            max_recv_per_srq: a.max_srq_wr,
            max_iov_segments_per_rdma_read: a.max_rdma_read_sge,
            max_iov_segments_per_rdma_write: a.max_sge,
            max_rdma_read_in: a.max_rd_atomic,
            max_rdma_read_out: a.max_rd_atomic,
            max_private_data_size: a.max_private_data,
        }
    }

    // ---- DTO bookkeeping -------------------------------------------------------------------

    /// Registers a request about to be posted on the EP or SRQ `owner`; the returned id is
    /// its wr_id.
    #[inline]
    pub(crate) fn track(&self, owner: Handle, p: PendingDto) -> DatResult<u64> {
        self.pending
            .insert(owner, p)
            .ok_or(DatError::resources(SubType::None))
    }

    /// Ends the tracking of a request: its post failed, or it completed (then through
    /// `completion::untracked`). Inlined into the completion's conversion: as a call of its own it
    /// cost a fifth more, saving registers and moving the entry out through its return value.
    #[inline]
    pub(crate) fn untrack(&self, wr_id: u64) -> Option<PendingDto> {
        self.pending.remove(wr_id)
    }

    /// Brings the counters the device keeps itself up to date (before they are read):
    /// DCNT_IA_DIAG_ERR_RQ_UDSDPRD, datagrams dropped for lack of a posted receive.
    pub(crate) fn sync_device_counters(&self) {
        let now = self.device.ud_dropped();
        let before = self.ud_dropped_seen.swap(now, Ordering::Relaxed);
        self.counters.add(
            counters::ia::DIAG_ERR_RQ_UDSDPRD,
            now.saturating_sub(before),
        );
    }

    // ---- what the device's events find -------------------------------------------------------

    /// What a completion needs of the EP whose QP is `qp_num`.
    pub(crate) fn ep_shared_by_qp(&self, qp_num: u32) -> Option<Arc<EpShared>> {
        self.eps_by_qp
            .lock()
            .get(&qp_num)
            .and_then(|o| o.shared.upgrade())
    }

    /// The RMR whose latest bind gave `rmr_context`, if it is still bound with it.
    pub(crate) fn rmr_by_context(&self, rmr_context: u32) -> Option<Arc<dyn Window>> {
        let rmr = self.rmrs_by_context.lock().get(&rmr_context)?.upgrade()?;
        rmr.is_bound_as(rmr_context).then_some(rmr)
    }

    /// Makes a new service point (an `Sp`) reachable from its listener's requests; returns
    /// those that arrived before, for it to take.
    pub(crate) fn register_listener(&self, listener: u64, sp: Weak<AnyObject>) -> Vec<CmEvent> {
        let mut sps = self.sps_by_listener.lock();
        sps.insert(listener, sp);
        self.early_requests
            .lock()
            .remove(&listener)
            .unwrap_or_default()
    }

    /// A listener's service point is gone (freed, or its creation failed): requests that
    /// waited for it, and any that still come, are rejected.
    pub(crate) fn unregister_listener(&self, listener: u64) {
        let early = {
            let mut sps = self.sps_by_listener.lock();
            sps.remove(&listener);
            self.closed_listeners.lock().insert(listener);
            self.early_requests.lock().remove(&listener)
        };
        for ev in early.unwrap_or_default() {
            if let CmEvent::ConnectRequest { req, .. } | CmEvent::UdRequest { req, .. } = ev {
                let _ = self.device.reject(req, &[]);
            }
        }
    }
}

/// The DCNT_IA_*_CREATE counter of an object kind.
fn create_counter(kind: HandleKind) -> Option<usize> {
    use super::counters::ia;
    Some(match kind {
        HandleKind::Pz => ia::PZ_CREATE,
        HandleKind::Lmr => ia::LMR_CREATE,
        HandleKind::Rmr => ia::RMR_CREATE,
        HandleKind::Psp => ia::PSP_CREATE,
        HandleKind::Rsp => ia::RSP_CREATE,
        HandleKind::Evd => ia::EVD_CREATE,
        HandleKind::Ep => ia::EP_CREATE,
        HandleKind::Srq => ia::SRQ_CREATE,
        _ => return None,
    })
}
