//! Completion queue: an ibv_cq on the device's completion channel.
//!
//! Completions are moved from the hardware CQ into a software queue before the core sees them.
//! That lets the backend itself reap a QP's flush completions (to know when a QP that is being
//! destroyed or reset is empty) without taking them away from the EVD that reports them.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use parking_lot::Mutex;
use rdma_sys::*;

use super::shared::{ChannelCq, Shared};
use super::sys::Ptr;
use super::{INTERNAL_BIT, RECV_BIT};
use daplrs_backend::{CompletionQueue, NotifyFn, WcOpcode, WcStatus, WorkCompletion, WrContext};
use daplrs_backend::{Error, Resource, Result};

pub(crate) struct VerbsCq {
    /// Lets the backend get its own Arc back from the trait object the core hands over.
    pub(super) me: Weak<VerbsCq>,
    pub(super) id: u64,
    pub(super) cq: Ptr<ibv_cq>,
    pub(super) shared: Weak<Shared>,
    queue: Mutex<Reaped>,
    notify: Mutex<Option<NotifyFn>>,
    /// What the consumer asked for (dat_evd_create's qlen).
    depth: AtomicU32,
    /// The hardware CQ's size: at least `depth` and the queue depths of every QP using it, so
    /// the CQ cannot overrun (an overrun is fatal to every QP on it).
    cqe: AtomicU32,
    attached: AtomicU32,
    /// The most completions the QPs on this CQ may have outstanding, in the consumer's
    /// requests: `attached` where the CQ grows as they post, their queue depths where it
    /// cannot (siw, whose `attached` counts every piece a split read may take).
    bound: AtomicU32,
    /// Whether completions must raise events even when nobody drives this CQ: its EVD feeds
    /// a CNO, whose waiter learns of them only through the event thread. Otherwise the CQ is
    /// armed only by a thread about to sleep in `drive`, or while it may hold more than
    /// `depth` (`may_overrun`): a consumer that polls costs no event, no event-thread
    /// wake-up and no system call per completion.
    events_wanted: std::sync::atomic::AtomicBool,
    /// Ends a `drive` (an eventfd).
    interrupt: OwnedFd,
    /// The thread in `drive` (0: none): it needs no interrupt for events it queues itself.
    driver: AtomicU64,
}

/// The software queue, and the QP the last completion came from (the next one usually comes
/// from the same: no lookup in the process's QP map then).
#[derive(Default)]
struct Reaped {
    wcs: VecDeque<WorkCompletion>,
    last_qp: Option<LastQp>,
}

/// The QP the last completion came from, by number and address. It holds no reference: the
/// QP's drop first clears it from both its CQs (`VerbsCq::forget_qp`), under the queue's
/// lock, which a reap holds throughout; so a QP named here is alive for the whole of a reap
/// (its drop, if begun, waits for the lock before it touches anything). A reference per reap
/// (a `Weak` upgraded, then dropped) cost each poll that found a completion an atomic
/// compare-and-swap loop and a decrement; one held by the CQ would have kept its QP alive.
#[derive(Clone, Copy)]
struct LastQp {
    qp_num: u32,
    qp: std::ptr::NonNull<super::qp::VerbsQp>,
}

// SAFETY: a QP is Sync; the address is only dereferenced under the queue's lock (see above).
unsafe impl Send for LastQp {}

/// Where converted completions go: the CQ's software queue, or, when nothing waits in it,
/// the caller's batch itself (no move through the queue on the way).
pub(super) trait WcSink {
    fn push_wc(&mut self, wc: WorkCompletion);
}

impl WcSink for VecDeque<WorkCompletion> {
    fn push_wc(&mut self, wc: WorkCompletion) {
        self.push_back(wc);
    }
}

impl WcSink for Vec<WorkCompletion> {
    fn push_wc(&mut self, wc: WorkCompletion) {
        self.push(wc);
    }
}

/// The QP numbered `qp_num`: the one the CQ saw last (`last`), or the process's map's,
/// which becomes `last`. The caller holds the CQ's queue lock, from which `last` is borrowed,
/// for as long as it uses the QP (see `LastQp`).
#[inline(always)]
fn qp_of<'a>(
    last: &'a mut Option<LastQp>,
    shared: &Weak<Shared>,
    qp_num: u32,
) -> Option<&'a super::qp::VerbsQp> {
    let seen = match *last {
        Some(seen) if seen.qp_num == qp_num => seen,
        // The device's state is needed only on a miss.
        _ => {
            let qp = shared.upgrade()?.live_qp(qp_num)?;
            *last = Some(LastQp { qp_num, qp });
            last.expect("just set")
        }
    };
    // SAFETY: a QP named by `last` is alive while the queue lock is held (`LastQp`); the
    // borrow is tied to `last`'s, which is the lock's.
    Some(unsafe { seen.qp.as_ref() })
}

/// How long a waiting consumer polls the hardware queue before it sleeps.
const SPIN: std::time::Duration = std::time::Duration::from_micros(50);

/// A small id of the calling thread (never 0).
fn thread_token() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local!(static ME: u64 = NEXT.fetch_add(1, Ordering::Relaxed));
    ME.with(|m| *m)
}

/// The entries of a CQ on a device that cannot resize CQs (siw): the EPs that share an EVD add
/// their send and receive depths to it, and none of them may find it too small. siw keeps 32
/// bytes per entry: 256 KiB a CQ.
pub(super) const NO_RESIZE_CQE: u32 = 8192;

impl VerbsCq {
    pub(super) fn create(shared: &Arc<Shared>, depth: u32) -> Result<Arc<VerbsCq>> {
        let id = shared.next_id();
        let mut cqe = depth.max(1);
        if !shared.cq_resize {
            // It cannot grow when EPs attach their queues: room for them from the start.
            cqe = cqe.max(NO_RESIZE_CQE).min(shared.attr.max_cqe.max(cqe));
        }
        // SAFETY: the context and channel live as long as `shared`; the cq_context is a token
        // the event loop maps back to this CQ.
        let cq = unsafe {
            ibv_create_cq(
                shared.ctx.0,
                cqe as i32,
                id as usize as *mut libc::c_void,
                shared.comp_channel.0,
                0,
            )
        };
        if cq.is_null() {
            return Err(Error::NoResource(Resource::Memory));
        }
        // SAFETY: a CQ we just created.
        let actual = unsafe { (*cq).cqe } as u32;
        let Some(interrupt) = super::sys::eventfd() else {
            // SAFETY: the CQ we just created, used by nobody.
            unsafe { ibv_destroy_cq(cq) };
            return Err(Error::NoResource(Resource::Memory));
        };
        let me = Arc::new_cyclic(|me| VerbsCq {
            me: me.clone(),
            id,
            cq: Ptr(cq),
            shared: Arc::downgrade(shared),
            queue: Mutex::new(Reaped::default()),
            notify: Mutex::new(None),
            depth: AtomicU32::new(depth),
            cqe: AtomicU32::new(actual),
            attached: AtomicU32::new(0),
            bound: AtomicU32::new(0),
            events_wanted: std::sync::atomic::AtomicBool::new(false),
            interrupt,
            driver: AtomicU64::new(0),
        });
        let weak = Arc::downgrade(&me);
        shared.cqs.lock().insert(id, weak);
        Ok(me)
    }

    /// Grows the hardware CQ by `add` entries for a QP, whose completions outstanding may
    /// grow by `bound` with them (see `bound`).
    pub(super) fn attach(&self, add: u32, bound: u32) -> Result<()> {
        let want = self.attached.fetch_add(add, Ordering::SeqCst) + add;
        self.ensure(want.max(self.depth.load(Ordering::SeqCst)))
            .inspect_err(|_| {
                self.attached.fetch_sub(add, Ordering::SeqCst);
            })?;
        self.bound.fetch_add(bound, Ordering::SeqCst);
        self.arm_if_overrun_possible();
        Ok(())
    }

    /// Whether the QPs on this CQ may have more completions outstanding than the consumer
    /// sized it for (`depth`). The hardware CQ is made big enough for all of them, so none
    /// is lost, but the consumer must learn of the overrun as it happens (its EVD's overflow
    /// is an asynchronous error, which a consumer polling another EVD waits for): the
    /// completions must then reach the consumer by themselves, as for a CNO.
    fn may_overrun(&self) -> bool {
        self.bound.load(Ordering::SeqCst) > self.depth.load(Ordering::SeqCst)
    }

    /// Arms the CQ when it may overrun and nothing else arms it. Called as the QPs' room
    /// grows (where it grows as they post, before the request that grew it is posted: that
    /// request's completion then raises the event, whose drain takes whatever came before).
    fn arm_if_overrun_possible(&self) {
        if !self.events_wanted.load(Ordering::SeqCst) && self.may_overrun() {
            self.arm();
        }
    }

    /// Undoes `attach(n, bound)`.
    pub(super) fn detach(&self, n: u32, bound: u32) {
        self.attached.fetch_sub(n, Ordering::SeqCst);
        self.bound.fetch_sub(bound, Ordering::SeqCst);
    }

    fn ensure(&self, entries: u32) -> Result<()> {
        if entries <= self.cqe.load(Ordering::SeqCst) {
            return Ok(());
        }
        // SAFETY: our CQ.
        let rc = unsafe { ibv_resize_cq(self.cq.0, entries as i32) };
        if rc != 0 {
            return Err(Error::NoResource(Resource::Memory));
        }
        // SAFETY: our live CQ.
        let actual = unsafe { (*self.cq.0).cqe } as u32;
        self.cqe.store(actual.max(entries), Ordering::SeqCst);
        Ok(())
    }

    /// Moves what the hardware CQ holds, up to `limit` of its entries, into `out` (holding
    /// the software queue's lock, so completions keep their order).
    fn reap(&self, last: &mut Option<LastQp>, out: &mut impl WcSink, limit: usize) {
        const BATCH: usize = 32;
        // Not zeroed (1.5 KiB a call, each poll of an empty queue too): ibv_poll_cq writes
        // the entries it returns, and only those are read.
        let mut wcs = std::mem::MaybeUninit::<[ibv_wc; BATCH]>::uninit();
        let mut left = limit;
        while left > 0 {
            let want = BATCH.min(left);
            let first = wcs.as_mut_ptr().cast::<ibv_wc>();
            // SAFETY: our CQ and room for BATCH >= want entries.
            let n = unsafe { ibv_poll_cq(self.cq.0, want as i32, first) };
            if n <= 0 {
                break;
            }
            // SAFETY: ibv_poll_cq wrote the first n entries (n <= want).
            let got = unsafe { std::slice::from_raw_parts(first, n as usize) };
            for wc in got {
                self.convert(wc, last, out);
            }
            // A short batch emptied the queue: no second poll of it.
            if (n as usize) < want {
                break;
            }
            left -= n as usize;
        }
    }

    /// Queues the completion `wc` reports (after those of the unsignaled requests it retires;
    /// the backend's own requests are accounted for and not queued).
    fn convert(&self, wc: &ibv_wc, last: &mut Option<LastQp>, queue: &mut impl WcSink) {
        let is_recv = wc.wr_id & RECV_BIT != 0;
        let status = match status_of(wc.status) {
            // soft-RoCE fails a receive too small for its message as a local QP
            // operation error (the sender sees REM_OP_ERR), not LOC_LEN_ERR; the
            // core checked the receive's own segments before the post, so a
            // message longer than them is the cause left.
            WcStatus::LocalQpOp if is_recv => WcStatus::LocalLength,
            s => s,
        };
        if status != WcStatus::Success && status != WcStatus::Flushed {
            log::debug!(
                "QP {}: completion status {} (vendor error {:#x}) opcode {} wr_id {:#x}",
                wc.qp_num,
                wc.status,
                wc.vendor_err,
                wc.opcode,
                wc.wr_id
            );
        }
        let qp = qp_of(last, &self.shared, wc.qp_num);
        if qp.as_ref().is_some_and(|q| q.dropped_after_loss(is_recv)) {
            return; // completed already, flushed, when the device went (qp.rs `flush_lost`)
        }
        let mut imm = None;
        let mut invalidated = None;
        // soft-RoCE (rxe) hands user space the kernel's flag value for "with invalidate" (bit 2,
        // IB_WC_WITH_INVALIDATE), not IBV_WC_WITH_INV (bit 3); bit 2's user-space meaning
        // (IBV_WC_IP_CSUM_OK) never applies to our RC receives, so either bit means it.
        const KERNEL_WC_WITH_INVALIDATE: u32 = 1 << 2;
        if is_recv
            && status == WcStatus::Success
            && wc.wc_flags & (ibv_wc_flags::IBV_WC_WITH_INV.0 | KERNEL_WC_WITH_INVALIDATE) != 0
        {
            // SAFETY: invalidated_rkey is the member a receive with IBV_WC_WITH_INV fills.
            invalidated = Some(unsafe { wc.imm_data_invalidated_rkey_union.invalidated_rkey });
        }
        let mut opcode = if is_recv {
            if status == WcStatus::Success && wc.opcode == ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM
            {
                // SAFETY: imm_data is the member IBV_WC_RECV_RDMA_WITH_IMM fills.
                imm = Some(u32::from_be(unsafe {
                    wc.imm_data_invalidated_rkey_union.imm_data
                }));
                WcOpcode::RecvRdmaImm
            } else {
                WcOpcode::Recv
            }
        } else if status == WcStatus::Success {
            match wc.opcode {
                ibv_wc_opcode::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
                ibv_wc_opcode::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
                ibv_wc_opcode::IBV_WC_FETCH_ADD => WcOpcode::FetchAdd,
                ibv_wc_opcode::IBV_WC_COMP_SWAP => WcOpcode::CmpSwap,
                ibv_wc_opcode::IBV_WC_BIND_MW | ibv_wc_opcode::IBV_WC_LOCAL_INV => WcOpcode::BindMw,
                _ => WcOpcode::Send,
            }
        } else {
            WcOpcode::Send
        };
        let mut new_rkey = 0;
        let mut ctx = WrContext::NONE;
        if let Some(qp) = &qp {
            let completed = qp.completed(wc.wr_id, is_recv, status, queue);
            ctx = completed.ctx;
            if let Some(rkey) = completed.new_rkey {
                opcode = WcOpcode::BindMw;
                new_rkey = rkey;
            }
        }
        let byte_len = match &qp {
            Some(q) if !is_recv => {
                let len = q.sent_len(wc.wr_id, wc.byte_len);
                if status == WcStatus::Success {
                    len
                } else {
                    wc.byte_len
                }
            }
            _ => wc.byte_len,
        };
        let wc_out = WorkCompletion {
            wr_id: wc.wr_id & !RECV_BIT,
            ctx,
            status,
            opcode,
            byte_len,
            qp_num: wc.qp_num,
            new_rkey,
            imm,
            invalidated,
            // An ibv_wc carries no solicited bit (the sender's solicited event is seen only by
            // a CQ armed for solicited completions, not in the completion): every receive is
            // reported as solicited, so it notifies as under DAT's default notification.
            solicited: is_recv,
        };
        match &qp {
            // iWARP: in posting order (see `VerbsQp::completed_in_order`).
            Some(q) if !is_recv && q.iwarp() => q.completed_in_order(wc_out, queue),
            _ if wc.wr_id & INTERNAL_BIT != 0 => {}
            _ => queue.push_wc(wc_out),
        }
    }

    /// Reaps the hardware CQ (the backend's own progress: QP teardown waiting for flushes).
    pub(super) fn reap_now(&self) {
        let mut q = self.queue.lock();
        let q = &mut *q;
        self.reap(&mut q.last_qp, &mut q.wcs, usize::MAX);
    }

    /// Reaps the hardware CQ for a thread other than the consumer's (a post that waits for
    /// reads, `VerbsQp::wait_bounced_reads`), telling the consumer of what it queued.
    pub(super) fn reap_for_consumer(&self) {
        if self.reap_some() {
            self.fire();
        }
    }

    /// Reaps the hardware CQ; whether that queued anything.
    fn reap_some(&self) -> bool {
        let mut q = self.queue.lock();
        let q = &mut *q;
        let before = q.wcs.len();
        self.reap(&mut q.last_qp, &mut q.wcs, usize::MAX);
        q.wcs.len() > before
    }

    /// Forgets `qp` as the QP this CQ saw last: the first thing its drop does (see `LastQp`).
    pub(super) fn forget_qp(&self, qp: &super::qp::VerbsQp) {
        let mut q = self.queue.lock();
        if q.last_qp.is_some_and(|l| std::ptr::eq(l.qp.as_ptr(), qp)) {
            q.last_qp = None;
        }
    }

    /// Queues completions the hardware will never produce (receives of a destroyed SRQ).
    pub(super) fn push_synthetic(&self, wcs: Vec<WorkCompletion>) {
        self.queue.lock().wcs.extend(wcs);
        self.fire();
    }

    /// Tells the consumer there may be completions (from the event loop, after re-arming).
    pub(super) fn fire(&self) {
        let hook = self.notify.lock().clone();
        if let Some(hook) = hook {
            hook();
        }
    }

    /// After an event: arms the CQ for the next one if its completions must raise events
    /// (`events_wanted`); a thread that drives it arms it itself before it sleeps.
    pub(super) fn rearm(&self) {
        if self.events_wanted.load(Ordering::SeqCst) || self.may_overrun() {
            self.arm();
        }
    }

    /// Asks for an event at the next completion.
    fn arm(&self) {
        // SAFETY: our CQ.
        unsafe { ibv_req_notify_cq(self.cq.0, 0) };
    }
}

/// A completion channel event: acknowledge, re-arm, then let the CQ's consumer reap it (the
/// re-arm comes first so a completion arriving meanwhile raises a new event). The event
/// thread's, and a consumer's that sleeps on the channel itself (`drive`).
pub(super) fn completion_events(s: &Arc<Shared>) {
    // One event a call: the channel stays readable while more are pending, and a consumer
    // woken for its completion should not pay a failed read on its way back.
    let mut cq: *mut ibv_cq = std::ptr::null_mut();
    let mut ctx: *mut libc::c_void = std::ptr::null_mut();
    // SAFETY: our non-blocking channel.
    if unsafe { ibv_get_cq_event(s.comp_channel.0, &mut cq, &mut ctx) } != 0 {
        return;
    }
    let mine = s
        .cqs
        .lock()
        .get(&(ctx as usize as u64))
        .and_then(|w| w.upgrade());
    // SAFETY: the event's CQ; its destruction waits for this acknowledgement.
    unsafe { ibv_ack_cq_events(cq, 1) };
    if let Some(c) = mine {
        c.rearm();
        c.fire();
    }
}

impl ChannelCq for VerbsCq {
    fn rearm(&self) {
        VerbsCq::rearm(self);
    }
    fn fire(&self) {
        VerbsCq::fire(self);
    }
}

impl CompletionQueue for VerbsCq {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn id(&self) -> u64 {
        self.id
    }
    fn poll(&self, max: usize, out: &mut Vec<WorkCompletion>) -> usize {
        let mut q = self.queue.lock();
        let q = &mut *q;
        if q.wcs.is_empty() {
            // Nothing queued ahead of what the hardware holds: converted straight into the
            // caller's batch. The unsignaled requests a completion retires may take it past
            // `max`: those wait in the queue, in order.
            let start = out.len();
            self.reap(&mut q.last_qp, out, max);
            if out.len() > start + max {
                q.wcs.extend(out.drain(start + max..));
            }
            return out.len() - start;
        }
        // What is queued came first and is handed over alone: most often a drive reaped it,
        // which emptied the hardware queue a moment ago, and a second look there would find
        // nothing. Later completions wait for the next poll.
        let n = q.wcs.len().min(max);
        out.extend(q.wcs.drain(..n));
        n
    }
    fn set_notify(&self, notify: Option<NotifyFn>) {
        *self.notify.lock() = notify;
    }
    fn set_events_wanted(&self, wanted: bool) {
        if !self.events_wanted.swap(wanted, Ordering::SeqCst) && wanted {
            self.arm();
            // Completions that came before the arm raised nothing: hand them over now.
            if self.reap_some() {
                self.fire();
            }
        }
    }
    fn resize(&self, depth: u32) -> Result<()> {
        self.depth.store(depth, Ordering::SeqCst);
        self.ensure(depth.max(self.attached.load(Ordering::SeqCst)))?;
        self.arm_if_overrun_possible();
        Ok(())
    }
    fn depth(&self) -> u32 {
        self.depth.load(Ordering::SeqCst)
    }
    /// Sleeps on the IA's completion channel itself, so the kernel wakes the waiting thread
    /// when a completion arrives (instead of the event thread, which would then have to wake
    /// it). Events of other CQs of the IA met meanwhile are handled here as the event thread
    /// would.
    fn drive(&self, deadline: Option<Instant>) -> bool {
        let Some(shared) = self.shared.upgrade() else {
            return false;
        };
        // Poll the hardware queue briefly first, as OFED's provider does: a completion that
        // is microseconds away costs no sleep, no re-arm and no wake-up.
        let spin_until = Instant::now() + SPIN;
        let mut spins = 0u32;
        // What the reaps below find is not announced (`fire`): the caller drains it as soon
        // as this returns (see the trait's `drive`).
        loop {
            if self.reap_some() {
                return true;
            }
            spins += 1;
            if spins & 15 == 0 && Instant::now() >= spin_until {
                break;
            }
            std::hint::spin_loop();
        }
        // Armed before the last look: a completion after it raises an event that wakes us,
        // one before it is found by the look.
        self.arm();
        if self.reap_some() {
            return true;
        }
        // Bounded, so a lost wake-up costs a round of the caller's loop, never a hang.
        let mut timeout_ms: i32 = 1000;
        if let Some(d) = deadline {
            let left = d.saturating_duration_since(Instant::now());
            timeout_ms = timeout_ms.min(left.as_millis().min(i32::MAX as u128) as i32);
        }
        // SAFETY: the channel lives as long as `shared`.
        let comp_fd = unsafe { (*shared.comp_channel.0).fd };
        let mut fds = [
            super::sys::pollin(comp_fd),
            super::sys::pollin(self.interrupt.as_raw_fd()),
        ];
        shared.drivers.fetch_add(1, Ordering::SeqCst);
        // SAFETY: two pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
        shared.drivers.fetch_sub(1, Ordering::SeqCst);
        if n > 0 {
            if fds[1].revents != 0 {
                super::sys::eventfd_clear(&self.interrupt);
            }
            if fds[0].revents != 0 {
                // Events this thread queues need no interrupt: it returns next anyway.
                self.driver.store(thread_token(), Ordering::SeqCst);
                completion_events(&shared);
                self.driver.store(0, Ordering::SeqCst);
            }
        }
        true
    }
    fn interrupt(&self) {
        if self.driver.load(Ordering::SeqCst) != thread_token() {
            super::sys::eventfd_signal(&self.interrupt);
        }
    }
}

impl Drop for VerbsCq {
    fn drop(&mut self) {
        if let Some(s) = self.shared.upgrade() {
            s.cqs.lock().remove(&self.id);
        }
        // SAFETY: no QP uses the CQ any more (each holds an Arc to it); every completion event
        // was acknowledged by the event loop as it was read.
        let rc = unsafe { ibv_destroy_cq(self.cq.0) };
        if rc != 0 {
            log::warn!("ibv_destroy_cq: error {rc}");
        }
    }
}

/// Maps a verbs work completion status onto the backend's.
fn status_of(s: ibv_wc_status::Type) -> WcStatus {
    use ibv_wc_status::*;
    match s {
        IBV_WC_SUCCESS => WcStatus::Success,
        IBV_WC_LOC_LEN_ERR => WcStatus::LocalLength,
        IBV_WC_LOC_QP_OP_ERR => WcStatus::LocalQpOp,
        IBV_WC_LOC_PROT_ERR | IBV_WC_LOC_ACCESS_ERR => WcStatus::LocalProtection,
        IBV_WC_WR_FLUSH_ERR => WcStatus::Flushed,
        IBV_WC_MW_BIND_ERR => WcStatus::MwBind,
        IBV_WC_BAD_RESP_ERR => WcStatus::BadResponse,
        IBV_WC_REM_ACCESS_ERR => WcStatus::RemoteAccess,
        IBV_WC_REM_INV_REQ_ERR => WcStatus::RemoteInvalidRequest,
        IBV_WC_REM_OP_ERR => WcStatus::RemoteOp,
        IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::ReceiverNotReady,
        _ => WcStatus::Transport,
    }
}
