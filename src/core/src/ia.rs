//! IA: an opened interface adapter. Owns the backend device, routes connection-manager events to
//! EPs and service points, turns work completions into DTO events, and tears children down on
//! abrupt close.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::consts::{
    close_flags, completion_flags, dto_op, dto_status, evd_flags, event_number, ib_ext,
};
use super::counters::{self, Counters};
use super::ep::{Ep, EpShared};
use super::error::{DatError, DatResult, Param, SubType};
use super::evd::{DtoExt, Evd, Event, EventData};
use super::handle::{self, Handle, HandleKind, Object};
use super::lmr::Lmr;
use super::lmr_table::LmrTable;
use super::rmr::Rmr;
use super::sp::Sp;
use super::srq;
use daplrs_backend::intmap::{IntMap, IntSet};
use daplrs_backend::{CmEvent, Device, WcOpcode, WcStatus, WorkCompletion};

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

/// A posted request the core waits to see completed.
pub(crate) struct PendingDto {
    /// NULL for SRQ receives: the EP is known only from the completing QP.
    pub ep: Handle,
    pub cookie: u64,
    pub op: u32,
    /// DAT_COMPLETION_SUPPRESS_FLAG / UNSIGNALLED: no event on success.
    pub report_success: bool,
    /// For an RMR bind: the RMR and the rmr_context the bind gives.
    pub rmr: Option<(Arc<Rmr>, u32)>,
    /// For an IB-extension request: the DAT_IB_EXT_TYPE its DAT_IB_DTO_EVENT reports.
    pub ext: Option<u32>,
    /// For a receive of an EP's own queue (not an SRQ's): the EP's counters and
    /// recv_completion_flags, for its completion (see `EpShared`).
    pub recv: Option<Arc<EpShared>>,
}

/// The requests posted and not completed yet, by wr_id: a slab whose wr_id is a slot's index
/// (low 32 bits) and the slot's generation (the next 30: the top two bits are the backend's),
/// so a post and its completion cost an index, not a hash, and a wr_id of a retired request
/// (a completion reported twice, a backend's bug) finds nothing.
#[derive(Default)]
struct PendingTable {
    slots: Vec<(u32, Option<PendingDto>)>,
    free: Vec<u32>,
}

const GENERATION_MASK: u32 = (1 << 30) - 1;

impl PendingTable {
    fn insert(&mut self, p: PendingDto) -> u64 {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push((0, None));
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.0 = slot.0.wrapping_add(1) & GENERATION_MASK;
        slot.1 = Some(p);
        (u64::from(slot.0) << 32) | u64::from(index)
    }

    fn remove(&mut self, wr_id: u64) -> Option<PendingDto> {
        let index = wr_id as u32;
        let generation = (wr_id >> 32) as u32;
        let slot = self.slots.get_mut(index as usize)?;
        if slot.0 != generation || slot.1.is_none() {
            return None;
        }
        self.free.push(index);
        slot.1.take()
    }

    fn clear(&mut self) {
        self.slots.clear();
        self.free.clear();
    }
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
    /// The IA's async EVD (implicit ones are freed by graceful close).
    async_evd: Mutex<Option<(Weak<Evd>, bool)>>,
    pub(crate) eps_by_qp: Mutex<IntMap<u32, Weak<Ep>>>,
    pub(crate) sps_by_listener: Mutex<IntMap<u64, Weak<Sp>>>,
    /// Requests that reached a listener before its service point was registered above (the
    /// backend listens, and may deliver a request, before `Sp::create` knows the listener's
    /// id): they wait here for `register_sp`, which hands them on. Guarded by the lock of
    /// `sps_by_listener`'s users in the order: `sps_by_listener`, then this.
    early_requests: Mutex<IntMap<u64, Vec<CmEvent>>>,
    /// Listeners whose service point is gone: a late request for one is rejected, not parked.
    closed_listeners: Mutex<IntSet<u64>>,
    /// The LMRs by lmr_context, with what a post checks of each, read without a lock.
    pub(crate) lmrs: LmrTable,
    /// RMRs by the rmr_context of their latest bind (stale entries are told apart by the
    /// RMR's own state): a peer's send-with-invalidate and dat_ep_post_rdma_read_to_rmr name
    /// an RMR by its context.
    pub(crate) rmrs_by_context: Mutex<IntMap<u32, Weak<Rmr>>>,
    pending: Mutex<PendingTable>,
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
    /// dat_ia_open: opens the device named by `ia_params` ("tcp lo", "tcp 10.0.0.1", ...)
    /// with `open_device`.
    /// With `async_evd_qlen`, also creates the IA's async EVD (the DAT_HANDLE_NULL case);
    /// without, the caller names an existing one or none (see `Ia::open_with_async_evd`).
    /// `dispatch` is the C table this IA's handles start with (see `Ia::dispatch`).
    pub fn open(
        name: &str,
        ia_params: &str,
        open_device: OpenDevice,
        async_evd_qlen: Option<i32>,
        dispatch: usize,
    ) -> DatResult<(Arc<Ia>, Option<Arc<Evd>>)> {
        let async_evd = match async_evd_qlen {
            Some(qlen) => AsyncEvd::Create(qlen),
            None => AsyncEvd::None,
        };
        Self::open_with_async_evd(name, ia_params, open_device, async_evd, dispatch)
    }

    /// dat_ia_open with the consumer's choice of async EVD. An existing one must be a live EVD
    /// created with DAT_EVD_ASYNC_FLAG (of any IA: one EVD may collect the async errors of
    /// several), checked before the device is opened.
    pub fn open_with_async_evd(
        name: &str,
        ia_params: &str,
        open_device: OpenDevice,
        async_evd: AsyncEvd,
        dispatch: usize,
    ) -> DatResult<(Arc<Ia>, Option<Arc<Evd>>)> {
        let existing = match async_evd {
            AsyncEvd::Existing(h) => {
                let evd = handle::evd(h, SubType::InvalidHandleEvdAsync)?;
                if evd.flags() & evd_flags::ASYNC == 0 {
                    return Err(DatError::invalid_handle(SubType::InvalidHandleEvdAsync));
                }
                Some(evd)
            }
            _ => None,
        };
        let async_evd_qlen = match async_evd {
            AsyncEvd::Create(qlen) => Some(qlen),
            _ => None,
        };
        let device = open_device(ia_params)?;
        let reservation = handle::reserve(HandleKind::Ia, dispatch);
        let dev = device.attr();
        let ia = Arc::new(Ia {
            handle: reservation.handle(),
            name: name.to_string(),
            dispatch,
            device: device.clone(),
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
            pending: Mutex::new(PendingTable::default()),
            counters: Counters::new(counters::ia::ALL),
            ud_dropped_seen: AtomicU64::new(0),
        });
        let weak = Arc::downgrade(&ia);
        device.set_cm_handler(Some(Arc::new(move |ev| {
            if let Some(ia) = weak.upgrade() {
                ia.on_cm_event(ev);
            }
        })));
        reservation.commit(Object::Ia(ia.clone()), Handle::NULL);
        let async_evd = match async_evd_qlen {
            Some(qlen) => match Evd::create(&ia, qlen, None, evd_flags::ASYNC) {
                Ok(evd) => {
                    *ia.async_evd.lock() = Some((Arc::downgrade(&evd), true));
                    Some(evd)
                }
                Err(e) => {
                    let _ = ia.close(close_flags::ABRUPT);
                    return Err(e);
                }
            },
            None => None,
        };
        if let Some(evd) = existing {
            ia.adopt_async_evd(&evd);
        }
        Ok((ia, async_evd))
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

    /// The async EVD, if the IA has one.
    pub fn async_evd(&self) -> Option<Arc<Evd>> {
        self.async_evd
            .lock()
            .as_ref()
            .and_then(|(w, _)| w.upgrade())
    }

    /// Makes a consumer-created ASYNC EVD the IA's async EVD if it has none.
    pub(crate) fn adopt_async_evd(&self, evd: &Arc<Evd>) {
        let mut slot = self.async_evd.lock();
        let has_live = slot
            .as_ref()
            .map(|(w, _)| w.strong_count() > 0)
            .unwrap_or(false);
        if !has_live {
            *slot = Some((Arc::downgrade(evd), false));
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
        if let Some(evd) = self.async_evd() {
            if evd.handle() == source_evd && number == event_number::ASYNC_EVD_OVERFLOW {
                return; // an overflowing async EVD cannot report itself
            }
        }
        self.post_async_reason(number, object, 0);
    }

    /// Queues an async error event naming `object` with an object-specific `reason` (see
    /// `consts::async_reason`); no-op without an async EVD.
    pub(crate) fn post_async_reason(&self, number: u32, object: Handle, reason: u32) {
        if let Some(evd) = self.async_evd() {
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

    /// DAT_INSUFFICIENT_RESOURCES with `sub` when the IA already has `limit` live objects of
    /// `kind`: the limits dat_ia_query reports (max_eps, max_lmrs, ...) hold. Checked before
    /// the object is built; callers creating concurrently may overshoot by their number.
    pub(crate) fn check_room(&self, kind: HandleKind, limit: u32, sub: SubType) -> DatResult<()> {
        if handle::owned_count(self.handle, kind) >= limit as usize {
            return Err(DatError::resources(sub));
        }
        Ok(())
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

    /// dat_ia_close. Graceful fails with INVALID_STATE IA_IN_USE while any object other than the
    /// implicit async EVD remains; abrupt destroys every child first.
    pub fn close(self: &Arc<Self>, flags: u32) -> DatResult<()> {
        if !handle::is_live(self.handle) {
            return Err(HandleKind::Ia.invalid());
        }
        let implicit_async = {
            let slot = self.async_evd.lock();
            match slot.as_ref() {
                Some((w, true)) => w.upgrade().map(|e| e.handle()),
                _ => None,
            }
        };
        let mut children = handle::children(self.handle);
        if flags == close_flags::GRACEFUL {
            if children.iter().any(|(h, _)| Some(*h) != implicit_async) {
                return Err(DatError::invalid_state(SubType::IaInUse));
            }
        } else if flags != close_flags::ABRUPT {
            return Err(DatError::bad(Param::CloseFlags));
        }
        self.closed.store(true, Ordering::SeqCst);
        children.sort_by_key(|(_, o)| teardown_rank(o));
        for (h, obj) in children {
            if handle::remove(h, obj.kind()).is_err() {
                continue; // freed concurrently by its owner
            }
            destroy_object(&obj);
        }
        handle::remove(self.handle, HandleKind::Ia)?;
        self.device.set_cm_handler(None);
        self.device.close();
        self.pending.lock().clear();
        Ok(())
    }

    // ---- DTO bookkeeping -------------------------------------------------------------------

    /// Registers a request about to be posted; the returned id is its wr_id.
    pub(crate) fn track(&self, p: PendingDto) -> u64 {
        self.pending.lock().insert(p)
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

    /// Forgets a request whose post failed.
    pub(crate) fn untrack(&self, wr_id: u64) {
        self.pending.lock().remove(wr_id);
    }

    /// Ends the tracking of a completed request and returns it. Every completion passes here
    /// (those of a NULL EVD's sink CQ too), so this is where the core learns that an SRQ
    /// receive was consumed and the SRQ's low watermark may have been crossed. Inlined into
    /// `dto_event`: as a call of its own it cost a fifth more, saving registers and moving the
    /// entry out through its return value.
    #[inline]
    pub(crate) fn retire(&self, wr_id: u64) -> Option<PendingDto> {
        let p = self.pending.lock().remove(wr_id)?;
        if p.ep.is_null() && p.op == dto_op::RECEIVE {
            srq::receive_consumed();
        }
        Some(p)
    }

    /// Converts a work completion into the DAT event for the EVD `evd` and whether it is a
    /// notification event (see `evd`'s module notes), or None when the consumer asked not to
    /// see it. Inlined into the EVD's drain, its one caller: as a call of its own it saved
    /// and restored registers and passed the event (72 bytes) out through memory.
    #[inline(always)]
    pub(crate) fn dto_event(&self, wc: &WorkCompletion, evd: Handle) -> Option<(Event, bool)> {
        let pending = self.retire(wc.wr_id)?;
        let status = dto_status_of(wc.status);
        if status == dto_status::SUCCESS && !pending.report_success {
            return None;
        }
        let notify = self.completion_notifies(wc, &pending);
        // A bind is known by its tracking entry, not by the completion's opcode: verbs leaves
        // the opcode of a failed or flushed completion undefined.
        if let Some((rmr, rmr_context)) = pending.rmr.as_ref() {
            if status != dto_status::SUCCESS {
                rmr.bind_failed(*rmr_context);
            }
            let event = Event {
                number: event_number::RMR_BIND_COMPLETION,
                evd,
                data: EventData::RmrBind {
                    rmr: rmr.handle(),
                    cookie: pending.cookie,
                    status,
                },
            };
            return Some((event, notify));
        }
        let ep = if pending.ep.is_null() {
            self.eps_by_qp
                .lock()
                .get(&wc.qp_num)
                .and_then(|w| w.upgrade())
                .map(|e| e.handle())
                .unwrap_or(Handle::NULL)
        } else {
            pending.ep
        };
        let transferred = if status == dto_status::SUCCESS {
            wc.byte_len
        } else {
            0
        };
        // A peer's send-with-invalidate ended the binding of one of our RMRs.
        let (recv_op, invalidated) = match wc.invalidated {
            Some(ctx) if status == dto_status::SUCCESS => {
                if let Some(rmr) = self.rmr_by_context(ctx) {
                    rmr.bind_failed(ctx);
                }
                (dto_op::RECEIVE_WITH_INVALIDATE, ctx)
            }
            _ => (pending.op, 0),
        };
        if status == dto_status::SUCCESS
            && (pending.op == dto_op::RECEIVE || pending.op == ib_ext::DTO_RECV_UD)
        {
            let counter = if wc.opcode == WcOpcode::RecvRdmaImm {
                counters::ep::RECV_RDMA_IMM
            } else if pending.op == ib_ext::DTO_RECV_UD {
                counters::ep::RECV_UD
            } else {
                counters::ep::RECV
            };
            // An EP's own receive names its counters; an SRQ's is known by the QP it reached.
            match &pending.recv {
                Some(shared) => {
                    shared.counters.inc(counter);
                    shared.counters.add(counter + 1, u64::from(wc.byte_len));
                }
                None => {
                    if let Some(e) = self.ep_by_qp(wc.qp_num) {
                        e.count_post(counter, u64::from(wc.byte_len));
                    }
                }
            }
        }
        // An extended request, or a receive the peer's write-with-immediate consumed, is a
        // DAT_IB_DTO_EVENT carrying its extension data; everything else a DTO completion.
        let (number, op, ext) = match (pending.ext, wc.imm) {
            (Some(kind), _) => (ib_ext::DTO_EVENT, pending.op, Some(DtoExt { kind, imm: 0 })),
            (None, Some(imm)) if wc.opcode == WcOpcode::RecvRdmaImm => (
                ib_ext::DTO_EVENT,
                ib_ext::DTO_RECV_IMMED,
                Some(DtoExt {
                    kind: ib_ext::TYPE_RDMA_WRITE_IMMED_DATA,
                    imm,
                }),
            ),
            _ => (event_number::DTO_COMPLETION, recv_op, None),
        };
        let event = Event {
            number,
            evd,
            data: EventData::Dto {
                ep,
                cookie: pending.cookie,
                status,
                transferred,
                op,
                rmr_context: invalidated,
                ext,
            },
        };
        Some((event, notify))
    }

    /// Whether a work completion's event is a notification event (see `evd`'s module rules):
    /// not for a successful receive of an EP whose recv_completion_flags ask for
    /// DAT_COMPLETION_SOLICITED_WAIT_FLAG when the peer's send did not ask for solicited
    /// notification. The EP's flags are read without its lock (drains run under EP locks):
    /// through the receive's tracking entry, or for an SRQ's receive through the QP it reached.
    fn completion_notifies(&self, wc: &WorkCompletion, pending: &PendingDto) -> bool {
        if wc.solicited
            || wc.status != WcStatus::Success
            || !matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaImm)
        {
            return true;
        }
        let flags = match &pending.recv {
            Some(shared) => shared.recv_completion_flags(),
            None => match self.ep_by_qp(wc.qp_num) {
                Some(ep) => ep.recv_completion_flags(),
                None => return true,
            },
        };
        flags & completion_flags::SOLICITED_WAIT == 0
    }

    /// The live LMR of this IA whose lmr_context is `lmr_context` (DAT 1.2's dat_rmr_bind
    /// names the LMR by its triplet's context only).
    pub fn lmr_by_context(&self, lmr_context: u32) -> Option<Arc<Lmr>> {
        self.lmrs.lmr(lmr_context)
    }

    /// The RMR whose latest bind gave `rmr_context`, if it is still bound with it.
    pub(crate) fn rmr_by_context(&self, rmr_context: u32) -> Option<Arc<Rmr>> {
        let rmr = self.rmrs_by_context.lock().get(&rmr_context)?.upgrade()?;
        rmr.is_bound_as(rmr_context).then_some(rmr)
    }

    // ---- connection manager events ----------------------------------------------------------

    fn ep_by_qp(&self, qp_num: u32) -> Option<Arc<Ep>> {
        self.eps_by_qp.lock().get(&qp_num).and_then(|w| w.upgrade())
    }

    /// Makes a new service point reachable from its listener's requests, and hands it those
    /// that arrived before.
    pub(crate) fn register_sp(self: &Arc<Self>, listener: u64, sp: &Arc<Sp>) {
        let early = {
            let mut sps = self.sps_by_listener.lock();
            sps.insert(listener, Arc::downgrade(sp));
            self.early_requests.lock().remove(&listener)
        };
        for ev in early.unwrap_or_default() {
            self.on_cm_event(ev);
        }
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

    fn on_cm_event(self: &Arc<Self>, ev: CmEvent) {
        log::debug!("IA {}: cm event {:?}", self.name, ev);
        // A datagram EP's address-resolution request takes the connection request's path.
        let ud = matches!(ev, CmEvent::UdRequest { .. });
        match ev {
            ev @ (CmEvent::ConnectRequest { listener, .. }
            | CmEvent::UdRequest { listener, .. }) => {
                let sp = {
                    let sps = self.sps_by_listener.lock();
                    match sps.get(&listener) {
                        Some(w) => w.upgrade(),
                        None if !self.closed_listeners.lock().contains(&listener) => {
                            // Its service point is being created: it takes this on registering.
                            self.early_requests
                                .lock()
                                .entry(listener)
                                .or_default()
                                .push(ev);
                            return;
                        }
                        None => None,
                    }
                };
                let (CmEvent::ConnectRequest {
                    req,
                    private_data,
                    remote,
                    local,
                    ..
                }
                | CmEvent::UdRequest {
                    req,
                    private_data,
                    remote,
                    local,
                    ..
                }) = ev
                else {
                    return;
                };
                match sp {
                    Some(sp) => sp.on_connect_request(req, private_data, remote, local, ud),
                    None => {
                        let _ = self.device.reject(req, &[]);
                    }
                }
            }
            CmEvent::UdResolved {
                qp_num,
                peer,
                private_data,
                ..
            } => {
                if let Some(ep) = self.ep_by_qp(qp_num) {
                    ep.on_ud_resolved(peer, private_data, false);
                }
            }
            CmEvent::UdFailed {
                qp_num,
                by_peer,
                private_data,
                ..
            } => {
                if let Some(ep) = self.ep_by_qp(qp_num) {
                    ep.on_ud_failed(by_peer, private_data);
                }
            }
            CmEvent::RequestCancelled { .. } => {}
            CmEvent::Established {
                qp_num,
                private_data,
            } => {
                if let Some(ep) = self.ep_by_qp(qp_num) {
                    ep.on_established(private_data);
                }
            }
            CmEvent::Rejected {
                qp_num,
                private_data,
                by_peer,
            } => {
                if let Some(ep) = self.ep_by_qp(qp_num) {
                    let number = if by_peer {
                        event_number::CONNECTION_PEER_REJECTED
                    } else {
                        event_number::CONNECTION_NON_PEER_REJECTED
                    };
                    ep.on_connection_lost(number, private_data);
                }
            }
            CmEvent::Unreachable { qp_num } => {
                if let Some(ep) = self.ep_by_qp(qp_num) {
                    ep.on_connection_lost(event_number::CONNECTION_UNREACHABLE, Vec::new());
                }
            }
            CmEvent::TimedOut { qp_num } => {
                if let Some(ep) = self.ep_by_qp(qp_num) {
                    ep.on_connection_lost(event_number::CONNECTION_TIMED_OUT, Vec::new());
                }
            }
            CmEvent::Disconnected { qp_num } => {
                if let Some(ep) = self.ep_by_qp(qp_num) {
                    if ep.is_ud() {
                        ep.on_ud_stopped(event_number::CONNECTION_DISCONNECTED);
                    } else {
                        ep.on_connection_lost(event_number::CONNECTION_DISCONNECTED, Vec::new());
                    }
                }
            }
            CmEvent::Broken { qp_num } => {
                if let Some(ep) = self.ep_by_qp(qp_num) {
                    if ep.is_ud() {
                        ep.on_ud_stopped(event_number::CONNECTION_BROKEN);
                    } else {
                        ep.on_connection_lost(event_number::CONNECTION_BROKEN, Vec::new());
                    }
                }
            }
            // The IA is unusable (its EPs' connections are reported broken one by one).
            CmEvent::DeviceLost => self.post_async(
                event_number::ASYNC_IA_CATASTROPHIC,
                self.handle(),
                Handle::NULL,
            ),
            CmEvent::CqOverrun { cq } => {
                let overran = handle::children(self.handle())
                    .into_iter()
                    .find_map(|(h, o)| {
                        matches!(&o, Object::Evd(e) if e.cq().is_some_and(|c| c.id() == cq))
                            .then_some(h)
                    });
                if let Some(evd) = overran {
                    self.post_async(event_number::ASYNC_EVD_OVERFLOW, evd, evd);
                }
            }
        }
    }
}

/// Children die before what they use: EPs, then CRs and service points, RMRs, LMRs, SRQs,
/// EVDs, CNOs, PZs.
fn teardown_rank(o: &Object) -> u8 {
    match o {
        Object::Ep(_) => 0,
        Object::Cr(_) => 1,
        Object::Psp(_) | Object::Rsp(_) | Object::Csp(_) => 2,
        Object::Rmr(_) => 3,
        Object::Lmr(_) => 4,
        Object::Srq(_) => 5,
        Object::Evd(_) => 6,
        Object::Cno(_) => 7,
        Object::Pz(_) => 8,
        Object::Ia(_) => 9,
    }
}

fn destroy_object(o: &Object) {
    match o {
        Object::Ep(x) => x.destroy(),
        Object::Cr(x) => x.destroy(),
        Object::Psp(x) | Object::Rsp(x) | Object::Csp(x) => x.destroy(),
        Object::Rmr(x) => x.destroy(),
        Object::Lmr(x) => x.destroy(),
        Object::Srq(x) => x.destroy(),
        Object::Evd(x) => x.destroy(),
        Object::Cno(x) => x.destroy(),
        Object::Pz(x) => x.destroy(),
        Object::Ia(_) => {}
    }
}

/// Maps a backend completion status onto DAT_DTO_COMPLETION_STATUS.
pub(crate) fn dto_status_of(s: WcStatus) -> u32 {
    match s {
        WcStatus::Success => dto_status::SUCCESS,
        WcStatus::Flushed => dto_status::FLUSHED,
        WcStatus::LocalLength => dto_status::LOCAL_LENGTH,
        WcStatus::LocalQpOp => dto_status::LOCAL_EP,
        WcStatus::LocalProtection => dto_status::LOCAL_PROTECTION,
        WcStatus::MwBind => dto_status::RMR_OPERATION_FAILED,
        WcStatus::BadResponse => dto_status::BAD_RESPONSE,
        WcStatus::RemoteAccess => dto_status::REMOTE_ACCESS,
        WcStatus::RemoteInvalidRequest | WcStatus::RemoteOp => dto_status::REMOTE_RESPONDER,
        WcStatus::Transport => dto_status::TRANSPORT,
        WcStatus::ReceiverNotReady => dto_status::RECEIVER_NOT_READY,
    }
}

#[cfg(test)]
mod pending_tests {
    use super::{PendingDto, PendingTable};
    use crate::handle::Handle;

    fn dto(cookie: u64) -> PendingDto {
        PendingDto {
            ep: Handle::NULL,
            cookie,
            op: 0,
            report_success: true,
            rmr: None,
            ext: None,
            recv: None,
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
}
