//! Queue pair (an RC ibv_qp made with ibv_create_qp, moved through its states by us with the
//! attributes rdma_cm gives).
//!
//! The QP exists from dat_ep_create on, before any connection: it is taken to INIT at once so
//! receives can be posted early, and to RTR/RTS when rdma_cm has a path (see `cm.rs`).
//!
//! A datagram QP (IBV_QPT_UD, `VerbsQp::create_ud`) goes to RTS at once with rdma_cm's UDP
//! Q_Key and stays there: it needs no connection. Its sends name an address handle
//! (`VerbsAh`, ah.rs, made from the path rdma_cm resolved) and the remote QP number.

use std::collections::VecDeque;
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdma_sys::*;

use super::ah::VerbsAh;
use super::cq::VerbsCq;
use super::mem::{downcast_pd, PdInner, VerbsMr, VerbsMw};
use super::shared::Shared;
use super::sink::{ReadSink, Sinks};
use super::srq::{recv_sges, VerbsSrq};
use super::sys::Ptr;
use super::{INTERNAL_BIT, RECV_BIT, SPLIT_BIT};
use daplrs_backend::intmap::{IntMap, IntSet};
use daplrs_backend::{
    AddressHandle, MemoryWindow, QpCap, QpInit, QpState, QueuePair, RecvWr, SendOp, SendWr,
    SharedReceiveQueue, WcOpcode, WcStatus, WorkCompletion, WrContext,
};
use daplrs_backend::{Error, Resource, Result};

mod room;
mod states;

use room::{recv_bound, reserve, send_bound, FIRST_ROOM};

/// Every QP of the process by (device context, qp_num): asynchronous events arrive on the
/// device's descriptor, which IAs on the same device share.
/// Looked up for every completion (an IntMap: no SipHash on that path).
pub(super) type QpMap = IntMap<(usize, u32), Weak<VerbsQp>>;
pub(super) fn all_qps() -> &'static Mutex<QpMap> {
    static QPS: OnceLock<Mutex<QpMap>> = OnceLock::new();
    QPS.get_or_init(|| Mutex::new(IntMap::default()))
}

/// An IA's QPs in the process's map (`all_qps`): kept here, with the QP, so that the IA's
/// state names no QP.
impl Shared {
    /// The QP numbered `qp_num` if its drop has not begun, without a reference: the caller
    /// holds the queue lock of one of its CQs, which its drop waits for first
    /// (`VerbsCq::forget_qp`), for as long as it uses it.
    pub(super) fn live_qp(&self, qp_num: u32) -> Option<std::ptr::NonNull<VerbsQp>> {
        let qps = all_qps().lock();
        // The entry stays (and with it the allocation) while the map's lock is held: the
        // drop removes it only after it forgot the QP in its CQs.
        let w = qps.get(&(self.ctx.0 as usize, qp_num))?;
        (w.strong_count() > 0)
            .then(|| std::ptr::NonNull::new(w.as_ptr().cast_mut()).expect("a live QP"))
    }

    pub(super) fn qp(&self, qp_num: u32) -> Option<Arc<VerbsQp>> {
        all_qps()
            .lock()
            .get(&(self.ctx.0 as usize, qp_num))
            .and_then(|w| w.upgrade())
    }

    fn register_qp(&self, qp: &Arc<VerbsQp>) {
        all_qps()
            .lock()
            .insert((self.ctx.0 as usize, qp.qp_num), Arc::downgrade(qp));
    }

    fn unregister_qp(&self, qp_num: u32) {
        let mut m = all_qps().lock();
        let key = (self.ctx.0 as usize, qp_num);
        if m.get(&key).is_some_and(|w| w.strong_count() == 0) {
            m.remove(&key);
        }
    }
}

/// How long teardown waits for the hardware to flush a QP's outstanding requests.
const FLUSH_WAIT: Duration = Duration::from_secs(5);

/// Where a QP is in its connection's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Phase {
    Idle,
    Connecting,
    Connected,
    Error,
}

pub(super) struct Conn {
    pub cm_id: Ptr<rdma_cm_id>,
    /// The consumer's private data for the connect request.
    pub private_data: Vec<u8>,
    pub deadline: Option<Instant>,
    pub local: Option<SocketAddrV4>,
    pub remote: Option<SocketAddrV4>,
    /// We sent the disconnect request (the peer's DISCONNECTED answer needs no reply).
    pub disconnecting: bool,
}

pub(crate) struct VerbsQp {
    /// Lets the backend get its own Arc back from the trait object the core hands over.
    pub(super) me: Weak<VerbsQp>,
    pub(super) shared: Arc<Shared>,
    pub(super) qp: Ptr<ibv_qp>,
    pub(super) qp_num: u32,
    send_cq: Arc<VerbsCq>,
    recv_cq: Arc<VerbsCq>,
    srq: Option<Arc<VerbsSrq>>,
    _pd: Arc<PdInner>,
    pub(super) cap: QpCap,
    /// The hardware send queue's depth: `cap.max_send_wr`, times the pieces a read may be
    /// split into where reads are split (`post_split_read`).
    hw_send_wr: u32,
    /// The pieces of split reads outstanding beyond one per read: `sends_out` counts every
    /// work request, the EP's depth (`begin_send`) one per request of the consumer.
    split_extra: AtomicU32,
    /// What this QP has added to its send CQ's size: room for as many completions as it ever
    /// had requests outstanding (`sends_out`), grown as that grows, at most `max_send_wr`.
    send_room: AtomicU32,
    /// The same for its receive CQ (`recvs_out`, at most `max_recv_wr`); with an SRQ, the SRQ's
    /// whole depth from the start.
    recv_room: AtomicU32,
    max_inline: u32,
    /// A reliable QP on a device with none of the quirks a request is adjusted for
    /// (`Shared::posts_plain`, read once a post from here): its sends, writes, reads and
    /// atomics take `post_send`'s plain path, which leaves those adjustments out.
    plain: bool,
    pub(super) conn: Mutex<Conn>,
    /// The `Phase`, changed only under `conn`'s lock (with the rest of the connection's
    /// state) and read without it: every post looks at it, and a lock taken and released
    /// around one read told the post nothing more (the phase may change as soon as it is
    /// released either way; a request posted as it changes is flushed by the device).
    phase: AtomicU8,
    sends_out: AtomicU32,
    recvs_out: AtomicU32,
    /// Window binds in flight: wr_id -> (window, rkey it gives, 0 for an invalidation).
    binds: Mutex<IntMap<u64, (Arc<VerbsMw>, u32)>>,
    /// How many entries `binds` holds (set under its lock): a completion of a QP with no
    /// bind in flight, nearly every one, does not take that lock.
    binds_out: AtomicU32,
    /// Signaled sends, RDMA writes and reads by wr_id and their length, on siw, whose
    /// completions of them say byte_len 0 (ibverbs defines byte_len for receives, reads and
    /// atomics; DAT reports every request's length): `sent_len` gives it.
    sent_lens: Mutex<IntMap<u64, u32>>,
    /// A non-flush error completion was seen: the connection is broken (reported once).
    pub(super) broken: AtomicBool,
    /// Windows bound through this QP.
    windows: Mutex<Vec<Weak<VerbsMw>>>,
    /// The send queue as posted (held across ibv_post_send, so it is in posting order).
    sq: Mutex<SendQueue>,
    /// A datagram QP (IBV_QPT_UD).
    pub(super) ud: bool,
    /// The sinks of reads in flight, registered for them alone (sink.rs), by wr_id; how many
    /// (a completion of a QP with none takes no lock).
    sinks: Mutex<IntMap<u64, super::sink::Sinks>>,
    sinks_out: AtomicU32,
    /// Of those, the reads into a bounce buffer whose response is not copied out yet.
    bounced_out: AtomicU32,
    /// The receives posted (without an SRQ) and not completed, oldest first, each with the
    /// consumer's record of it (`RecvWr::ctx`, given back in its completion): a device that
    /// dies completes none of them, and `flush_lost` does.
    recv_ids: Mutex<VecDeque<Posted>>,
    /// The device is gone and what was outstanding completed here (`flush_lost`): what it
    /// may still report of this QP is dropped, and every later request completes flushed.
    flushed_here: AtomicBool,
}

/// What a completion did to its QP (`VerbsQp::completed`): the rkey a window bind gave, and
/// the context of the request it completed.
pub(super) struct Completed {
    pub(super) new_rkey: Option<u32>,
    pub(super) ctx: WrContext,
}

/// A request in the send or receive queue: the device's wr_id and the consumer's record of
/// it (`SendWr::ctx`, `RecvWr::ctx`), given back with the request's completion.
#[derive(Clone, Copy)]
struct Posted {
    wr_id: u64,
    ctx: WrContext,
}

impl Posted {
    /// One of the backend's own requests (a bind's invalidation, a piece of a split read).
    fn internal(wr_id: u64) -> Posted {
        Posted {
            wr_id,
            ctx: WrContext::NONE,
        }
    }
}

/// Posted send requests, oldest first, and how many unsignaled ones were posted in a row.
#[derive(Default)]
struct SendQueue {
    posted: VecDeque<Posted>,
    unsignaled_run: u32,
    /// iWARP: the requests posted that the device completes with their own completion (the
    /// signaled ones, every read among them), and the completions that came before those of
    /// requests posted earlier (`VerbsQp::completed_in_order`).
    signaled: IntSet<u64>,
    early: IntMap<u64, WorkCompletion>,
    /// Numbers the pieces of split reads.
    split_seq: u64,
    /// A piece of a split read failed: the status its read (the next request completed,
    /// flushed behind it) reports.
    split_error: Option<WcStatus>,
}

impl VerbsQp {
    /// What every send-queue post checks first: the QP's phase (in Error the request is flushed
    /// at once, where the consumer can see it: after whatever the hardware still holds of this
    /// QP; then false), the scatter list's length, and the request queue's depth (as deep as
    /// the EP asked, whatever the device rounded it up to). True: post it. Inlined, as is
    /// `post_begun`: `post_send` is one function from the trait call to the doorbell.
    #[inline(always)]
    fn begin_send(&self, wr: &SendWr) -> Result<bool> {
        match self.phase() {
            Phase::Connected => {}
            Phase::Error => {
                self.wait_flushed(true);
                self.send_cq.push_synthetic(vec![WorkCompletion::flushed(
                    wr.wr_id,
                    wr.op.opcode(),
                    self.qp_num,
                )
                .with_ctx(wr.ctx)]);
                return Ok(false);
            }
            _ => return Err(Error::NotConnected),
        }
        if wr.sgl.len() > self.cap.max_send_sge as usize {
            return Err(Error::TooLong);
        }
        let requests =
            self.sends_out.load(Ordering::SeqCst) - self.split_extra.load(Ordering::SeqCst);
        if requests + 1 > self.cap.max_send_wr {
            return Err(Error::NoResource(Resource::Qp));
        }
        Ok(true)
    }

    pub(super) fn create(shared: &Arc<Shared>, init: QpInit) -> Result<Arc<VerbsQp>> {
        Self::create_typed(shared, init, false)
    }

    /// A datagram QP, ready to send and receive at once.
    pub(super) fn create_ud(shared: &Arc<Shared>, init: QpInit) -> Result<Arc<VerbsQp>> {
        if init.srq.is_some() {
            return Err(Error::Invalid);
        }
        Self::create_typed(shared, init, true)
    }

    fn create_typed(shared: &Arc<Shared>, init: QpInit, ud: bool) -> Result<Arc<VerbsQp>> {
        let pd = downcast_pd(&*init.pd)?;
        let send_cq = downcast_cq(&init.send_cq)?;
        let recv_cq = downcast_cq(&init.recv_cq)?;
        let srq = match &init.srq {
            Some(s) => Some(
                s.as_any()
                    .downcast_ref::<VerbsSrq>()
                    .and_then(|x| x.me.upgrade())
                    .ok_or(Error::Internal)?,
            ),
            None => None,
        };
        let attr = &shared.attr;
        let cap = QpCap {
            max_send_wr: init.cap.max_send_wr.clamp(1, attr.max_qp_wr),
            max_recv_wr: if srq.is_some() {
                0
            } else {
                init.cap.max_recv_wr.clamp(1, attr.max_qp_wr)
            },
            max_send_sge: init.cap.max_send_sge.clamp(1, attr.max_sge),
            max_recv_sge: init.cap.max_recv_sge.clamp(1, attr.max_sge),
            max_rd_atomic: init.cap.max_rd_atomic.clamp(1, attr.max_rd_atomic.max(1)),
            max_inline: 0,
        };
        // Room for every request of the EP split into as many reads as its segments need.
        let pieces = match shared.splits_reads() {
            true => cap.max_send_sge.div_ceil(shared.read_sge_limit.max(1)),
            false => 1,
        };
        let hw_send_wr = cap
            .max_send_wr
            .saturating_mul(pieces)
            .min(attr.max_qp_wr)
            .max(cap.max_send_wr);
        // Inline sends for small payloads where the device takes them.
        let mut qp = std::ptr::null_mut();
        let mut max_inline = 0;
        for inline in [shared.max_inline, 0] {
            // SAFETY: plain data.
            let mut ia: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
            ia.qp_context = std::ptr::null_mut();
            ia.send_cq = send_cq.cq.0;
            ia.recv_cq = recv_cq.cq.0;
            ia.srq = srq
                .as_ref()
                .map(|s| s.srq.0)
                .unwrap_or(std::ptr::null_mut());
            ia.cap.max_send_wr = hw_send_wr;
            ia.cap.max_recv_wr = cap.max_recv_wr;
            ia.cap.max_send_sge = cap.max_send_sge;
            ia.cap.max_recv_sge = cap.max_recv_sge;
            ia.cap.max_inline_data = inline;
            ia.qp_type = if ud {
                ibv_qp_type::IBV_QPT_UD
            } else {
                ibv_qp_type::IBV_QPT_RC
            };
            ia.sq_sig_all = 0;
            // SAFETY: PD and CQs belong to this device and outlive the QP (held below).
            qp = unsafe { ibv_create_qp(pd.pd.0, &mut ia) };
            if !qp.is_null() {
                max_inline = ia.cap.max_inline_data;
                break;
            }
            log::debug!(
                "ibv_create_qp (send {} x {}, recv {} x {}, inline {inline}): errno {}",
                cap.max_send_wr,
                cap.max_send_sge,
                cap.max_recv_wr,
                cap.max_recv_sge,
                super::sys::errno()
            );
        }
        if qp.is_null() {
            return Err(Error::NoResource(Resource::Qp));
        }
        // SAFETY: the QP we just created.
        let qp_num = unsafe { (*qp).qp_num };
        // Each CQ grows by what the QP has outstanding (`reserve`), not by the whole depths it
        // could hold: EPs that share an EVD pay for what they post, not for the queue depths
        // they asked for. Receives of an SRQ complete on the CQ of whichever QP takes them:
        // the SRQ's whole depth counts against each of its QPs' receive CQs from the start.
        // A CQ that cannot be resized (siw) cannot grow later: there the QP takes its whole
        // depths now, so a lack of room refuses the EP, never a post.
        let first = if shared.cq_resize {
            FIRST_ROOM
        } else {
            u32::MAX
        };
        let send_room = first.min(hw_send_wr);
        let send_bound = send_bound(shared.cq_resize, send_room, &cap);
        let recv_room = srq
            .as_ref()
            .map_or(first.min(cap.max_recv_wr), |s| s.max_wr());
        let recv_bound = recv_bound(srq.is_some(), recv_room);
        if let Err(e) = send_cq.attach(send_room, send_bound).and_then(|_| {
            recv_cq.attach(recv_room, recv_bound).inspect_err(|_| {
                send_cq.detach(send_room, send_bound);
            })
        }) {
            // SAFETY: not shared with anyone yet.
            unsafe { ibv_destroy_qp(qp) };
            return Err(e);
        }
        let me = Arc::new_cyclic(|me| VerbsQp {
            me: me.clone(),
            shared: shared.clone(),
            qp: Ptr(qp),
            qp_num,
            send_cq,
            recv_cq,
            srq,
            _pd: pd.clone(),
            cap,
            hw_send_wr,
            split_extra: AtomicU32::new(0),
            send_room: AtomicU32::new(send_room),
            recv_room: AtomicU32::new(recv_room),
            max_inline,
            plain: !ud && shared.posts_plain(),
            phase: AtomicU8::new(if ud { Phase::Connected } else { Phase::Idle } as u8),
            conn: Mutex::new(Conn {
                cm_id: Ptr::null(),
                private_data: Vec::new(),
                deadline: None,
                local: None,
                remote: None,
                disconnecting: false,
            }),
            sends_out: AtomicU32::new(0),
            recvs_out: AtomicU32::new(0),
            binds: Mutex::new(IntMap::default()),
            binds_out: AtomicU32::new(0),
            sent_lens: Mutex::new(IntMap::default()),
            broken: AtomicBool::new(false),
            windows: Mutex::new(Vec::new()),
            sq: Mutex::new(SendQueue::default()),
            sinks: Mutex::new(IntMap::default()),
            sinks_out: AtomicU32::new(0),
            bounced_out: AtomicU32::new(0),
            recv_ids: Mutex::new(VecDeque::new()),
            flushed_here: AtomicBool::new(false),
            ud,
        });
        if ud {
            me.to_ud_ready()?;
        } else {
            me.to_init()?;
        }
        shared.register_qp(&me);
        Ok(me)
    }

    /// Accounts for one completion of this QP; returns the new rkey when it was a window bind.
    /// Unsignaled requests it retires are queued to `queue` first, as successes: a send queue
    /// completes in order, so everything posted before a completed request has completed.
    pub(super) fn completed(
        &self,
        wr_id: u64,
        is_recv: bool,
        status: WcStatus,
        queue: &mut impl super::cq::WcSink,
    ) -> Completed {
        let mut ctx = WrContext::NONE;
        if is_recv {
            match &self.srq {
                Some(s) => ctx = s.completed(wr_id),
                None => {
                    self.recvs_out.fetch_sub(1, Ordering::SeqCst);
                    // Receives complete in order: it is the first (the search ends there).
                    let id = wr_id & !RECV_BIT;
                    let mut ids = self.recv_ids.lock();
                    let posted = match ids.front() {
                        Some(front) if front.wr_id == id => ids.pop_front(),
                        _ => match ids.iter().position(|r| r.wr_id == id) {
                            Some(at) => ids.remove(at),
                            None => None,
                        },
                    };
                    if let Some(p) = posted {
                        ctx = p.ctx;
                    }
                }
            }
        } else if self.shared.iwarp {
            // Retired in posting order by `completed_in_order`, given the completion itself.
        } else {
            let mut sq = self.sq.lock();
            // The oldest request, always when every request is signaled: nothing before it
            // to retire, no search.
            match sq.posted.front() {
                Some(front) if front.wr_id == wr_id => {
                    ctx = front.ctx;
                    sq.posted.pop_front();
                    self.sends_out.fetch_sub(1, Ordering::SeqCst);
                }
                _ => ctx = self.retire_through(&mut sq, wr_id, queue),
            }
        }
        // A datagram QP in error stops too (reported as broken, see `cm::break_connection`).
        if status != WcStatus::Success
            && status != WcStatus::Flushed
            && !self.broken.swap(true, Ordering::SeqCst)
        {
            // A failed request put the QP in error: the connection is gone.
            self.shared.defer_break(self.qp_num);
        }
        // A bind's entry is made before its post (`post_wr`), so before its completion is
        // reaped (on RoCE its send-queue record, read under the lock just taken, says so).
        if is_recv || self.binds_out.load(Ordering::Acquire) == 0 {
            return Completed {
                new_rkey: None,
                ctx,
            };
        }
        let new_rkey = self.forget_bind(wr_id).map(|(mw, rkey)| {
            if status == WcStatus::Success {
                mw.set_bound(rkey);
            }
            rkey
        });
        Completed { new_rkey, ctx }
    }

    /// Retires the send-queue requests posted up to `wr_id`, whose completion this is: those
    /// before it are unsignaled ones, queued to `queue` as successes. A request no longer
    /// posted (a device completing one twice, or out of posting order after it was retired)
    /// retires nothing: without this check it would retire every request still outstanding,
    /// each as a success.
    /// Returns the completed request's context.
    fn retire_through(
        &self,
        sq: &mut SendQueue,
        wr_id: u64,
        queue: &mut impl super::cq::WcSink,
    ) -> WrContext {
        let Some(at) = sq.posted.iter().position(|p| p.wr_id == wr_id) else {
            log::warn!("QP {}: completion of {wr_id:#x}, not posted", self.qp_num);
            return WrContext::NONE;
        };
        let mut ctx = WrContext::NONE;
        for front in sq.posted.drain(..=at) {
            self.sends_out.fetch_sub(1, Ordering::SeqCst);
            if front.wr_id == wr_id {
                ctx = front.ctx;
            } else if front.wr_id & INTERNAL_BIT == 0 {
                queue.push_wc(
                    WorkCompletion::new(
                        front.wr_id,
                        WcStatus::Success,
                        WcOpcode::Send,
                        0,
                        self.qp_num,
                    )
                    .with_ctx(front.ctx),
                );
            }
        }
        ctx
    }

    /// Whether the hardware already put the QP in error (a responder that refused a remote
    /// access does so), or a failed completion said the connection broke.
    pub(super) fn failed(&self) -> bool {
        self.send_cq.reap_now();
        self.recv_cq.reap_now();
        if self.broken.load(Ordering::SeqCst) {
            return true;
        }
        // SAFETY: plain data.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: plain data.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: our QP.
        let rc = unsafe {
            ibv_query_qp(
                self.qp.0,
                &mut a,
                ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
                &mut init,
            )
        };
        rc == 0 && a.qp_state == ibv_qp_state::IBV_QPS_ERR
    }

    /// Ends the bindings of windows last bound through this QP. A type 2 binding holds its
    /// QP (rxe waits about 50 s in ibv_destroy_qp for it), and a window bound through a QP
    /// that is gone grants nothing anyway.
    fn release_windows(&self) {
        let windows = std::mem::take(&mut *self.windows.lock());
        for w in windows.iter().filter_map(|w| w.upgrade()) {
            if w.bound_qp.load(Ordering::SeqCst) == self.qp_num {
                w.invalidate();
            }
        }
    }

    pub(super) fn phase(&self) -> Phase {
        match self.phase.load(Ordering::Acquire) {
            0 => Phase::Idle,
            1 => Phase::Connecting,
            2 => Phase::Connected,
            _ => Phase::Error,
        }
    }

    /// Sets the phase; the caller holds `conn`'s lock.
    pub(super) fn set_phase(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::Release);
    }
}

impl VerbsQp {
    /// The QP's PD (a datagram QP's address handles are made in it: ah.rs).
    pub(super) fn pd(&self) -> &Arc<PdInner> {
        &self._pd
    }
}

fn downcast_cq(cq: &Arc<dyn daplrs_backend::CompletionQueue>) -> Result<Arc<VerbsCq>> {
    cq.as_any()
        .downcast_ref::<VerbsCq>()
        .and_then(|c| c.me.upgrade())
        .ok_or(Error::Internal)
}

impl VerbsQp {
    /// An iWARP QP: its send queue completes out of posting order (`completed_in_order`).
    pub(super) fn iwarp(&self) -> bool {
        self.shared.iwarp
    }

    /// iWARP: queues the completion `wc` of a send-queue request, and with it, in posting
    /// order, the requests it lets retire. siw completes a send or RDMA write once it is sent
    /// but an RDMA read only when its response is in, so a read's completion may come after
    /// those of requests posted behind it; DAT reports an EP's requests in posting order,
    /// each once, with its own status and length. So a completion that comes early waits in
    /// `SendQueue::early` for those of the signaled requests before it; an unsignaled request
    /// (never a read here: `post_send` signals every read) has no completion of its own and
    /// retires, as a success, once a request after it has completed (sends and writes
    /// complete in posting order). On error the device completes every request, unsignaled
    /// ones too, in posting order.
    pub(super) fn completed_in_order(
        &self,
        wc: WorkCompletion,
        queue: &mut impl super::cq::WcSink,
    ) {
        let mut sq = self.sq.lock();
        let sq = &mut *sq;
        if !sq.posted.iter().any(|p| p.wr_id == wc.wr_id) {
            log::warn!(
                "QP {}: completion of {:#x}, not posted",
                self.qp_num,
                wc.wr_id
            );
            return;
        }
        // A read's sink is done when its response is in, not when it retires in order: a
        // fenced request waits for exactly this (`wait_bounced_reads`).
        let mut wc = wc;
        if !self.finish_sinks(wc.wr_id, wc.status == WcStatus::Success) {
            wc.status = WcStatus::LocalProtection;
        }
        sq.early.insert(wc.wr_id, wc);
        while let Some(&Posted { wr_id: front, ctx }) = sq.posted.front() {
            let done = match sq.early.remove(&front) {
                Some(wc) => Some(wc),
                // Unsignaled: done once anything after it is.
                None if !sq.signaled.contains(&front) && !sq.early.is_empty() => None,
                None => break,
            };
            sq.posted.pop_front();
            sq.signaled.remove(&front);
            self.sends_out.fetch_sub(1, Ordering::SeqCst);
            if front & SPLIT_BIT != 0 {
                self.split_extra.fetch_sub(1, Ordering::SeqCst);
                match done.map(|wc| wc.status) {
                    Some(WcStatus::Success) | None => {}
                    Some(failed) => {
                        sq.split_error.get_or_insert(failed);
                    }
                }
                continue;
            }
            if front & INTERNAL_BIT != 0 {
                continue;
            }
            let mut wc = done
                .unwrap_or_else(|| {
                    WorkCompletion::new(front, WcStatus::Success, WcOpcode::Send, 0, self.qp_num)
                })
                .with_ctx(ctx);
            // The read a failed piece belonged to: flushed behind it, it fails as the piece did.
            if let Some(failed) = sq.split_error.take() {
                if wc.status != WcStatus::Success {
                    wc.status = failed;
                }
            }
            queue.push_wc(wc);
        }
    }

    /// Fills the work request of a window bind (or unbind) `op` into `w`: what it adds to the
    /// post (`BindPost`), or None when it completed here (the unbind of a window that is not
    /// bound: no work request).
    fn prepare_bind(
        &self,
        wr_id: u64,
        op: &SendOp,
        w: &mut ibv_send_wr,
    ) -> Result<Option<BindPost>> {
        let SendOp::BindMw {
            mw,
            mr,
            addr,
            length,
            access,
            new_rkey,
        } = op
        else {
            return Err(Error::Internal);
        };
        let mut post = BindPost::default();
        let mw_any = mw
            .as_any()
            .downcast_ref::<VerbsMw>()
            .ok_or(Error::Internal)?;
        let mw_arc = mw_any.me.upgrade().ok_or(Error::Internal)?;
        let live = mw_any.live.load(Ordering::SeqCst);
        match mr {
            Some(mr) if *length > 0 => {
                let vmr = mr
                    .as_any()
                    .downcast_ref::<VerbsMr>()
                    .ok_or(Error::Internal)?;
                if live != 0 {
                    if self.sends_out.load(Ordering::SeqCst) + 2 > self.cap.max_send_wr {
                        return Err(Error::NoResource(Resource::Qp));
                    }
                    // SAFETY: plain data.
                    let mut i: ibv_send_wr = unsafe { std::mem::zeroed() };
                    i.wr_id = INTERNAL_BIT;
                    i.opcode = ibv_wr_opcode::IBV_WR_LOCAL_INV;
                    i.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
                    i.imm_data_invalidated_rkey_union.invalidated_rkey = live;
                    post.inv = Some(i);
                }
                w.opcode = ibv_wr_opcode::IBV_WR_BIND_MW;
                w.bind_mw_tso_union.bind_mw.mw = mw_any.raw();
                w.bind_mw_tso_union.bind_mw.rkey = *new_rkey;
                w.bind_mw_tso_union.bind_mw.bind_info.mr = vmr.mr.lock().0;
                w.bind_mw_tso_union.bind_mw.bind_info.addr = *addr;
                w.bind_mw_tso_union.bind_mw.bind_info.length = *length;
                w.bind_mw_tso_union.bind_mw.bind_info.mw_access_flags = *access;
                mw_any.live.store(*new_rkey, Ordering::SeqCst);
                post.bind = Some((mw_arc, *new_rkey));
                post.bound = Some((mw_any.raw(), *new_rkey));
                mw_any.bound_qp.store(self.qp_num, Ordering::SeqCst);
                let mut windows = self.windows.lock();
                windows.retain(|w| w.strong_count() > 0);
                if !windows.iter().any(|w| w.ptr_eq(&mw_any.me)) {
                    windows.push(mw_any.me.clone());
                }
                drop(windows);
            }
            _ => {
                if live == 0 {
                    // Not bound: nothing to invalidate. Complete the unbind here, as
                    // the hardware would (no data moves).
                    self.send_cq.push_synthetic(vec![WorkCompletion {
                        new_rkey: *new_rkey,
                        ..WorkCompletion::new(
                            wr_id,
                            WcStatus::Success,
                            WcOpcode::BindMw,
                            0,
                            self.qp_num,
                        )
                    }]);
                    return Ok(None);
                }
                w.opcode = ibv_wr_opcode::IBV_WR_LOCAL_INV;
                w.imm_data_invalidated_rkey_union.invalidated_rkey = live;
                mw_any.live.store(0, Ordering::SeqCst);
                // After the invalidation the window grants nothing.
                post.bind = Some((mw_arc, 0));
            }
        }
        Ok(Some(post))
    }

    /// Posts the work request `w` of `wr` (after the invalidation a bind may bring) with the
    /// send flags `flags`, signaled where it must be, and records it in the send queue.
    /// Posts `w`, built from `wr` by `post_begun`. Both it and `bind` stay in the caller's
    /// frame: moved in by value they were copied (some 300 bytes) on every post. Inlined into
    /// `post_begun`, its one caller: as a call of its own its entry and exit cost every post
    /// about 20 instructions.
    #[inline(always)]
    fn post_wr(
        &self,
        wr: &SendWr,
        w: &mut ibv_send_wr,
        mut flags: u32,
        total: u64,
        bind: &mut BindPost,
        plain: bool,
    ) -> Result<()> {
        if let Some(b) = bind.bind.take() {
            let mut binds = self.binds.lock();
            binds.insert(wr.wr_id, b);
            self.binds_out.store(binds.len() as u32, Ordering::Release);
        }
        // Unsignaled only for a request whose success nobody waits for, and never so many
        // in a row that the device could not reclaim its send queue (it frees slots when a
        // signaled completion is reaped). The lock is held across the post so the queue's
        // record is in posting order.
        let mut sq = self.sq.lock();
        if self.flushed_here.load(Ordering::SeqCst) {
            drop(sq);
            self.forget_bind(wr.wr_id);
            self.flushed_now(wr);
            return Ok(());
        }
        // Room in the send CQ first, under the send queue's lock: no other post raises
        // `sends_out` meanwhile.
        let posted = if bind.inv.is_some() { 2 } else { 1 };
        if let Err(e) = reserve(
            &self.send_cq,
            &self.send_room,
            self.sends_out.load(Ordering::SeqCst) + posted,
            self.hw_send_wr,
        ) {
            self.forget_bind(wr.wr_id);
            return Err(e);
        }
        // On iWARP every read is signaled: a later request may complete before it (see
        // `completed_in_order`), so only its own completion says it is done.
        let signaled = wr.signaled
            || matches!(wr.op, SendOp::BindMw { .. })
            || (!plain && self.shared.iwarp && matches!(wr.op, SendOp::RdmaRead { .. }))
            || sq.unsignaled_run + 1 >= self.cap.max_send_wr / 2;
        if signaled {
            flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if !plain
            && signaled
            && self.shared.recv_needs_sge
            && matches!(
                wr.op,
                SendOp::Send
                    | SendOp::SendInv { .. }
                    | SendOp::RdmaWrite { .. }
                    | SendOp::RdmaRead { .. }
            )
        {
            self.sent_lens.lock().insert(wr.wr_id, total as u32);
        }
        w.send_flags = flags;
        let with_inv = bind.inv.is_some();
        self.sends_out.fetch_add(posted, Ordering::SeqCst);
        if with_inv {
            sq.posted.push_back(Posted::internal(INTERNAL_BIT));
        }
        sq.posted.push_back(Posted {
            wr_id: wr.wr_id,
            ctx: wr.ctx,
        });
        if !plain && self.shared.iwarp && signaled {
            sq.signaled.insert(wr.wr_id);
        }
        let head: *mut ibv_send_wr = match bind.inv.as_mut() {
            Some(i) => {
                i.next = &mut *w;
                i
            }
            None => w,
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: our QP; the work requests and their scatter list live across the call (verbs
        // copies them, or the inline payload, before returning).
        let rc = unsafe { ibv_post_send(self.qp.0, head, &mut bad) };
        if rc != 0 {
            self.sends_out.fetch_sub(posted, Ordering::SeqCst);
            for _ in 0..posted {
                sq.posted.pop_back();
            }
            sq.signaled.remove(&wr.wr_id);
            self.forget_bind(wr.wr_id);
            if self.shared.recv_needs_sge {
                self.sent_lens.lock().remove(&wr.wr_id);
            }
            log::debug!("QP {}: ibv_post_send: error {rc}", self.qp_num);
            return Err(Error::NoResource(Resource::Qp));
        }
        sq.unsignaled_run = if signaled { 0 } else { sq.unsignaled_run + 1 };
        drop(sq);
        if let Some((mw, rkey)) = bind.bound {
            // The device names a window by its current rkey in the next bind request; verbs
            // does not update ibv_mw.rkey for a type 2 bind, so we do (the bind is in order on
            // this QP; if it fails, `invalidate` replaces the window).
            // SAFETY: our window, alive while the core holds its RMR.
            unsafe { (*mw).rkey = rkey };
        }
        Ok(())
    }

    /// The length of a completed signaled send, write or read where the device reports none
    /// (siw), else what it reported; forgets the request either way.
    pub(super) fn sent_len(&self, wr_id: u64, reported: u32) -> u32 {
        if !self.shared.recv_needs_sge && !self.shared.splits_reads() {
            return reported;
        }
        self.sent_lens.lock().remove(&wr_id).unwrap_or(reported)
    }
}

impl VerbsQp {
    /// An RDMA read whose sink is registered for it alone (sink.rs): the consumer's segments
    /// or a bounce buffer, released when it completes (`finish_sinks`).
    fn post_read_to_own_sinks(&self, wr: &SendWr) -> Result<()> {
        let mut own = wr.clone();
        let pd = self._pd.pd.0;
        let sinks = match self.shared.read_sink {
            ReadSink::Bounce => Sinks::bounce(pd, &mut own.sgl)?,
            _ => Sinks::register(pd, &mut own.sgl)?,
        };
        if sinks.bounced() {
            self.bounced_out.fetch_add(1, Ordering::SeqCst);
        }
        self.sinks.lock().insert(wr.wr_id, sinks);
        self.sinks_out.fetch_add(1, Ordering::SeqCst);
        let posted = self.post_begun(&own, false);
        if posted.is_err() {
            self.finish_sinks(wr.wr_id, false);
        }
        posted
    }

    /// The window bind `wr_id` had in flight, no longer (its completion, or a post refused).
    fn forget_bind(&self, wr_id: u64) -> Option<(Arc<VerbsMw>, u32)> {
        let mut binds = self.binds.lock();
        let bind = binds.remove(&wr_id);
        self.binds_out.store(binds.len() as u32, Ordering::Release);
        bind
    }

    /// Request `wr` completes flushed at once: the device is gone (`flush_lost`).
    fn flushed_now(&self, wr: &SendWr) {
        self.finish_sinks(wr.wr_id, false);
        self.send_cq.push_synthetic(vec![WorkCompletion::flushed(
            wr.wr_id,
            wr.op.opcode(),
            self.qp_num,
        )
        .with_ctx(wr.ctx)]);
    }

    /// The device is gone (fault.rs): every request and receive still outstanding completes
    /// flushed now, in posting order (a dead device completes none of them), and whatever the
    /// device may still report of this QP is dropped (`dropped_after_loss`). Receives of an
    /// SRQ stay the SRQ's.
    pub(super) fn flush_lost(&self) {
        let mut sq = self.sq.lock();
        let mut ids = self.recv_ids.lock();
        if self.flushed_here.swap(true, Ordering::SeqCst) {
            return;
        }
        let flushed = |id: u64, op| WorkCompletion::flushed(id, op, self.qp_num);
        let sends: Vec<WorkCompletion> = sq
            .posted
            .drain(..)
            .filter(|p| p.wr_id & INTERNAL_BIT == 0)
            .map(|p| flushed(p.wr_id, WcOpcode::Send).with_ctx(p.ctx))
            .collect();
        sq.early.clear();
        sq.signaled.clear();
        sq.split_error = None;
        self.sends_out.store(0, Ordering::SeqCst);
        self.split_extra.store(0, Ordering::SeqCst);
        let recvs: Vec<WorkCompletion> = ids
            .drain(..)
            .map(|p| flushed(p.wr_id, WcOpcode::Recv).with_ctx(p.ctx))
            .collect();
        self.recvs_out.store(0, Ordering::SeqCst);
        drop(ids);
        drop(sq);
        self.sinks.lock().clear();
        self.sinks_out.store(0, Ordering::SeqCst);
        self.bounced_out.store(0, Ordering::SeqCst);
        self.sent_lens.lock().clear();
        if !sends.is_empty() {
            self.send_cq.push_synthetic(sends);
        }
        if !recvs.is_empty() {
            self.recv_cq.push_synthetic(recvs);
        }
    }

    /// Whether a completion the device reports of this QP comes after `flush_lost` completed
    /// it already (a receive of an SRQ is the SRQ's, and reported).
    pub(super) fn dropped_after_loss(&self, is_recv: bool) -> bool {
        self.flushed_here.load(Ordering::SeqCst) && !(is_recv && self.srq.is_some())
    }

    /// The sinks of read `wr_id`, if it had its own, finished (its bounced response copied
    /// out if it `succeeded`) and deregistered: it is done. False if the copy failed.
    fn finish_sinks(&self, wr_id: u64, succeeded: bool) -> bool {
        if self.sinks_out.load(Ordering::SeqCst) == 0 {
            return true;
        }
        let Some(sinks) = self.sinks.lock().remove(&wr_id) else {
            return true;
        };
        self.sinks_out.fetch_sub(1, Ordering::SeqCst);
        let copied = sinks.finish(succeeded);
        if sinks.bounced() {
            self.bounced_out.fetch_sub(1, Ordering::SeqCst);
        }
        copied
    }

    /// A fenced request must see the bytes of the reads before it, and a bounced read's bytes
    /// reach the consumer's memory only when its completion is reaped (sink.rs): so the
    /// request waits, in its post, reaping the send CQ, until those copies are done (or the
    /// QP failed: then it is flushed anyway). Bounded: a read whose peer answers in no
    /// 30 s leaves the request refused (resources), for the consumer to post again.
    fn wait_bounced_reads(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.bounced_out.load(Ordering::SeqCst) > 0 {
            if self.phase() == Phase::Error || self.flushed_here.load(Ordering::SeqCst) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::NoResource(Resource::Qp));
            }
            self.send_cq.reap_for_consumer();
            std::thread::yield_now();
        }
        Ok(())
    }

    /// An RDMA read with more segments than the device reads into (siw: one), as one read
    /// per run of segments, of consecutive remote ranges, posted together. On iWARP (the only
    /// devices this is done on, `Shared::splits_reads`) reads complete in order, each
    /// signaled: every piece but the last is the backend's own (INTERNAL_BIT | SPLIT_BIT), and
    /// the last completes the read, with the length of all (`sent_len`) and the status of a
    /// piece that failed (`completed_in_order`).
    fn post_split_read(&self, wr: &SendWr, remote_addr: u64, rkey: u32) -> Result<()> {
        let limit = self.shared.read_sge_limit.max(1) as usize;
        let runs: Vec<&[daplrs_backend::Sge]> = wr.sgl.chunks(limit).collect();
        let n = runs.len() as u32;
        let total: u64 = wr.sgl.iter().map(|s| u64::from(s.length)).sum();
        let mut sq = self.sq.lock();
        if self.flushed_here.load(Ordering::SeqCst) {
            drop(sq);
            self.flushed_now(wr);
            return Ok(());
        }
        reserve(
            &self.send_cq,
            &self.send_room,
            self.sends_out.load(Ordering::SeqCst) + n,
            self.hw_send_wr,
        )?;
        let mut ids = Vec::with_capacity(runs.len());
        for _ in 1..n {
            sq.split_seq += 1;
            ids.push(INTERNAL_BIT | SPLIT_BIT | (sq.split_seq & (SPLIT_BIT - 1)));
        }
        ids.push(wr.wr_id);
        // SAFETY: plain data.
        let mut wrs: Vec<ibv_send_wr> =
            runs.iter().map(|_| unsafe { std::mem::zeroed() }).collect();
        let mut at = remote_addr;
        for (i, run) in runs.iter().enumerate() {
            let w = &mut wrs[i];
            w.wr_id = ids[i];
            w.sg_list = super::sys::sge_ptr(run);
            w.num_sge = run.len() as i32;
            set_opcode(
                &SendOp::RdmaRead {
                    remote_addr: at,
                    rkey,
                },
                w,
            );
            w.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
            at += run.iter().map(|s| u64::from(s.length)).sum::<u64>();
        }
        for i in 1..wrs.len() {
            let next: *mut ibv_send_wr = &mut wrs[i];
            wrs[i - 1].next = next;
        }
        self.sent_lens.lock().insert(wr.wr_id, total as u32);
        self.sends_out.fetch_add(n, Ordering::SeqCst);
        self.split_extra.fetch_add(n - 1, Ordering::SeqCst);
        for &id in &ids {
            // The last piece is the read's own: it carries the read's context.
            let ctx = if id == wr.wr_id {
                wr.ctx
            } else {
                WrContext::NONE
            };
            sq.posted.push_back(Posted { wr_id: id, ctx });
            sq.signaled.insert(id);
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: our QP; the work requests and the scatter list they point into live across
        // the call (verbs copies them before returning).
        let rc = unsafe { ibv_post_send(self.qp.0, wrs.as_mut_ptr(), &mut bad) };
        if rc == 0 {
            sq.unsignaled_run = 0;
            return Ok(());
        }
        // The pieces before the one refused are posted and complete as the device says; the
        // rest, the read's own among them, are not: the read is refused.
        let posted = wrs.iter().position(|w| std::ptr::eq(w, bad)).unwrap_or(0);
        for &id in &ids[posted..] {
            sq.posted.pop_back();
            sq.signaled.remove(&id);
        }
        let unposted = n - posted as u32;
        self.sends_out.fetch_sub(unposted, Ordering::SeqCst);
        self.split_extra.fetch_sub(unposted - 1, Ordering::SeqCst);
        self.sent_lens.lock().remove(&wr.wr_id);
        log::debug!("QP {}: ibv_post_send (split read): error {rc}", self.qp_num);
        Err(Error::NoResource(Resource::Qp))
    }
}

/// What a window bind adds to its post: the invalidation posted before it (a type 2 window
/// bound again), the window and the rkey it gives (0 for an unbind) for the completion, and
/// the window whose rkey the post updates.
#[derive(Default)]
struct BindPost {
    inv: Option<ibv_send_wr>,
    bind: Option<(Arc<VerbsMw>, u32)>,
    bound: Option<(*mut ibv_mw, u32)>,
}

/// Fills the opcode and operands of `op`, any request but a window bind, into `w`.
fn set_opcode(op: &SendOp, w: &mut ibv_send_wr) {
    match op {
        SendOp::Send => {
            w.opcode = ibv_wr_opcode::IBV_WR_SEND;
        }
        SendOp::SendInv { rkey } => {
            w.opcode = ibv_wr_opcode::IBV_WR_SEND_WITH_INV;
            w.imm_data_invalidated_rkey_union.invalidated_rkey = *rkey;
        }
        SendOp::RdmaWrite { remote_addr, rkey } => {
            w.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
            w.wr.rdma.remote_addr = *remote_addr;
            w.wr.rdma.rkey = *rkey;
        }
        SendOp::RdmaRead { remote_addr, rkey } => {
            w.opcode = ibv_wr_opcode::IBV_WR_RDMA_READ;
            w.wr.rdma.remote_addr = *remote_addr;
            w.wr.rdma.rkey = *rkey;
        }
        SendOp::RdmaWriteImm {
            remote_addr,
            rkey,
            imm,
        } => {
            w.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
            w.wr.rdma.remote_addr = *remote_addr;
            w.wr.rdma.rkey = *rkey;
            // Immediate data travels in network order (verbs' imm_data is __be32).
            w.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        }
        SendOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        } => {
            w.opcode = ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD;
            w.wr.atomic.remote_addr = *remote_addr;
            w.wr.atomic.rkey = *rkey;
            w.wr.atomic.compare_add = *add;
        }
        SendOp::CmpSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        } => {
            w.opcode = ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP;
            w.wr.atomic.remote_addr = *remote_addr;
            w.wr.atomic.rkey = *rkey;
            w.wr.atomic.compare_add = *compare;
            w.wr.atomic.swap = *swap;
        }
        SendOp::BindMw { .. } => unreachable!("binds are prepared by VerbsQp::prepare_bind"),
    }
}

impl VerbsQp {
    /// The rest of `post_send`, once `begin_send` took the request. `plain` (a constant at
    /// each call): a request of the plain path, for which every device quirk below is known
    /// to be absent and compiled out.
    #[inline(always)]
    fn post_begun(&self, wr: &SendWr, plain: bool) -> Result<()> {
        if let SendOp::RdmaRead { remote_addr, rkey } = wr.op {
            if !plain
                && wr.sgl.len() > self.shared.read_sge_limit as usize
                && self.shared.splits_reads()
            {
                return self.post_split_read(wr, remote_addr, rkey);
            }
        }
        // SAFETY: plain data.
        let mut w: ibv_send_wr = unsafe { std::mem::zeroed() };
        w.wr_id = wr.wr_id;
        // A zero-byte read on siw gets one empty segment: siw reads into exactly one
        // (siw_qp.c sets num_sge 1 for every read), and with none it would use what a former
        // request left in the slot of its mapped send queue.
        let sgl: &[daplrs_backend::Sge] =
            if !plain && wr.sgl.is_empty() && matches!(wr.op, SendOp::RdmaRead { .. }) {
                recv_sges(&self.shared, &wr.sgl)
            } else {
                &wr.sgl
            };
        w.sg_list = super::sys::sge_ptr(sgl);
        w.num_sge = sgl.len() as i32;
        let mut flags = 0u32;
        if wr.solicited {
            flags |= ibv_send_flags::IBV_SEND_SOLICITED.0;
        }
        // siw refuses a fenced read ("a READ cannot be fenced", siw_qp.c): on iWARP a read
        // asked to wait for earlier reads needs no fence, reads complete in order.
        if wr.fence && (plain || !(self.shared.iwarp && matches!(wr.op, SendOp::RdmaRead { .. }))) {
            flags |= ibv_send_flags::IBV_SEND_FENCE.0;
        }
        let total: u64 = wr.sgl.iter().map(|s| u64::from(s.length)).sum();
        let mut bind = if !plain && matches!(wr.op, SendOp::BindMw { .. }) {
            match self.prepare_bind(wr.wr_id, &wr.op, &mut w)? {
                Some(b) => b,
                // Completed here (the unbind of a window that is not bound).
                None => return Ok(()),
            }
        } else {
            set_opcode(&wr.op, &mut w);
            BindPost::default()
        };
        if matches!(wr.op, SendOp::Send | SendOp::RdmaWrite { .. })
            && total > 0
            && total <= u64::from(self.max_inline)
        {
            flags |= ibv_send_flags::IBV_SEND_INLINE.0;
        }
        self.post_wr(wr, &mut w, flags, total, &mut bind, plain)
    }
}

impl QueuePair for VerbsQp {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn qp_num(&self) -> u32 {
        self.qp_num
    }
    fn state(&self) -> QpState {
        match self.phase() {
            Phase::Idle => QpState::Init,
            Phase::Connecting => QpState::Connecting,
            Phase::Connected => QpState::Connected,
            Phase::Error => QpState::Error,
        }
    }
    fn post_send(&self, wr: &SendWr) -> Result<()> {
        // No bounce buffers (no reads to wait for behind a fence), no sinks of our own, no
        // split reads: on to the post once the request is taken.
        if self.plain && !matches!(wr.op, SendOp::BindMw { .. }) {
            if !self.begin_send(wr)? {
                return Ok(());
            }
            return self.post_begun(wr, true);
        }
        if wr.fence && self.bounced_out.load(Ordering::SeqCst) > 0 {
            self.wait_bounced_reads()?;
        }
        if !self.begin_send(wr)? {
            return Ok(());
        }
        if matches!(wr.op, SendOp::RdmaRead { .. }) && self.shared.read_sink != ReadSink::Consumer {
            return self.post_read_to_own_sinks(wr);
        }
        self.post_begun(wr, false)
    }
    fn post_recv(&self, wr: RecvWr) -> Result<()> {
        if self.srq.is_some() {
            return Err(Error::BadState);
        }
        if wr.sgl.len() > self.cap.max_recv_sge as usize {
            return Err(Error::TooLong);
        }
        if self.phase() == Phase::Error {
            // Flushed at once (see post_send).
            self.wait_flushed(false);
            self.recv_cq.push_synthetic(vec![wr.flushed(self.qp_num)]);
            return Ok(());
        }
        if self.recvs_out.load(Ordering::SeqCst) + 1 > self.cap.max_recv_wr {
            return Err(Error::NoResource(Resource::Qp));
        }
        let sges = recv_sges(&self.shared, &wr.sgl);
        // SAFETY: plain data.
        let mut w: ibv_recv_wr = unsafe { std::mem::zeroed() };
        w.wr_id = wr.wr_id | RECV_BIT;
        w.sg_list = super::sys::sge_ptr(sges);
        w.num_sge = sges.len() as i32;
        // Held across the post, so the record is in posting order (and no `flush_lost` runs
        // between the two).
        let mut ids = self.recv_ids.lock();
        if self.flushed_here.load(Ordering::SeqCst) {
            drop(ids);
            self.recv_cq.push_synthetic(vec![wr.flushed(self.qp_num)]);
            return Ok(());
        }
        let out = self.recvs_out.fetch_add(1, Ordering::SeqCst) + 1;
        if let Err(e) = reserve(&self.recv_cq, &self.recv_room, out, self.cap.max_recv_wr) {
            self.recvs_out.fetch_sub(1, Ordering::SeqCst);
            return Err(e);
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: our QP; the request is copied by verbs.
        let rc = unsafe { ibv_post_recv(self.qp.0, &mut w, &mut bad) };
        if rc != 0 {
            self.recvs_out.fetch_sub(1, Ordering::SeqCst);
            log::debug!("QP {}: ibv_post_recv: error {rc}", self.qp_num);
            return Err(Error::NoResource(Resource::Qp));
        }
        ids.push_back(Posted {
            wr_id: wr.wr_id,
            ctx: wr.ctx,
        });
        Ok(())
    }
    fn replaced_after_reset(&self) -> bool {
        // siw_qp_modify has no transition out of ERROR (drivers/infiniband/sw/siw/siw_qp.c).
        self.shared.recv_needs_sge
    }
    fn reset(&self) -> Result<()> {
        if self.ud {
            // Flushed, and ready again (a datagram QP needs no connection).
            self.to_error();
            self.wait_flushed(false);
            self.to_reset();
            self.to_ud_ready()?;
            let _c = self.conn.lock();
            self.set_phase(Phase::Connected);
            self.broken.store(false, Ordering::SeqCst);
            return Ok(());
        }
        {
            let _c = self.conn.lock();
            if !matches!(self.phase(), Phase::Idle | Phase::Error) {
                return Err(Error::BadState);
            }
        }
        self.to_error();
        self.wait_flushed(false);
        self.shared.release_cm_id(self);
        self.to_reset();
        self.to_init()?;
        let mut c = self.conn.lock();
        self.set_phase(Phase::Idle);
        c.local = None;
        c.remote = None;
        c.deadline = None;
        c.disconnecting = false;
        self.broken.store(false, Ordering::SeqCst);
        Ok(())
    }
    fn posted_recvs(&self) -> u32 {
        self.recvs_out.load(Ordering::SeqCst)
    }
    fn local_addr(&self) -> Option<SocketAddrV4> {
        self.conn.lock().local
    }
    fn remote_addr(&self) -> Option<SocketAddrV4> {
        self.conn.lock().remote
    }
    fn destroy(&self) {
        let c = self.conn.lock();
        self.set_phase(Phase::Error);
        drop(c);
        self.to_error();
        self.wait_flushed(false);
        self.shared.release_cm_id(self);
        self.release_windows();
    }
    fn post_send_ud(&self, wr: SendWr, ah: &Arc<dyn AddressHandle>, remote_qpn: u32) -> Result<()> {
        let ah = ah
            .as_any()
            .downcast_ref::<VerbsAh>()
            .ok_or(Error::Foreign)?;
        if !self.ud || !matches!(wr.op, SendOp::Send) {
            return Err(Error::Invalid);
        }
        if !self.begin_send(&wr)? {
            return Ok(());
        }
        let sges = &wr.sgl;
        // SAFETY: plain data.
        let mut w: ibv_send_wr = unsafe { std::mem::zeroed() };
        w.wr_id = wr.wr_id;
        w.sg_list = super::sys::sge_ptr(sges);
        w.num_sge = sges.len() as i32;
        w.opcode = ibv_wr_opcode::IBV_WR_SEND;
        w.wr.ud.ah = ah.ah.0;
        w.wr.ud.remote_qpn = remote_qpn;
        w.wr.ud.remote_qkey = ah.qkey;
        let mut flags = 0u32;
        if wr.solicited {
            flags |= ibv_send_flags::IBV_SEND_SOLICITED.0;
        }
        let total: u64 = wr.sgl.iter().map(|s| u64::from(s.length)).sum();
        if total > 0 && total <= u64::from(self.max_inline) {
            flags |= ibv_send_flags::IBV_SEND_INLINE.0;
        }
        // As in post_send: signaled unless nobody waits, and never too many unsignaled in a row.
        let mut sq = self.sq.lock();
        let signaled = wr.signaled || sq.unsignaled_run + 1 >= self.cap.max_send_wr / 2;
        if signaled {
            flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        w.send_flags = flags;
        reserve(
            &self.send_cq,
            &self.send_room,
            self.sends_out.load(Ordering::SeqCst) + 1,
            self.cap.max_send_wr,
        )?;
        self.sends_out.fetch_add(1, Ordering::SeqCst);
        sq.posted.push_back(Posted {
            wr_id: wr.wr_id,
            ctx: wr.ctx,
        });
        let mut bad = std::ptr::null_mut();
        // SAFETY: our QP; the request, its scatter list and the AH (held by the caller) live
        // across the call.
        let rc = unsafe { ibv_post_send(self.qp.0, &mut w, &mut bad) };
        if rc != 0 {
            self.sends_out.fetch_sub(1, Ordering::SeqCst);
            sq.posted.pop_back();
            log::debug!("datagram QP {}: ibv_post_send: error {rc}", self.qp_num);
            return Err(Error::NoResource(Resource::Qp));
        }
        sq.unsignaled_run = if signaled { 0 } else { sq.unsignaled_run + 1 };
        Ok(())
    }
}

impl Drop for VerbsQp {
    fn drop(&mut self) {
        // First: a reap that found this QP uses it until it lets its CQ's lock go.
        self.send_cq.forget_qp(self);
        self.recv_cq.forget_qp(self);
        self.shared.unregister_qp(self.qp_num);
        self.release_windows();
        let send_room = self.send_room.load(Ordering::SeqCst);
        let send_bound = send_bound(self.shared.cq_resize, send_room, &self.cap);
        self.send_cq.detach(send_room, send_bound);
        let recv_room = self.recv_room.load(Ordering::SeqCst);
        self.recv_cq
            .detach(recv_room, recv_bound(self.srq.is_some(), recv_room));
        // SAFETY: our QP; its cm id (if any) was destroyed by `destroy`/`reset`.
        let rc = unsafe { ibv_destroy_qp(self.qp.0) };
        if rc != 0 {
            log::warn!("ibv_destroy_qp: error {rc}");
        }
    }
}
