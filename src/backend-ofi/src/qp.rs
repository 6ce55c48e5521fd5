//! Queue pairs: over connected endpoints (FI_EP_MSG) one libfabric endpoint
//! each, opened when the connection is made (a passive side's endpoint must
//! come from the connection request); over reliable datagrams a port shared
//! with the other QPs of its EVD set (`port`), from the connection on.
//!
//! libfabric does not promise completions in posting order; DAT reports an
//! EP's requests in that order. Each request and receive takes the next slot
//! of its ring; a completion marks its slot, and completions leave the ring
//! only from the oldest slot on (`Ring::release`).

use std::any::Any;
use std::collections::VecDeque;
use std::net::SocketAddrV4;
use std::ptr::null_mut;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use daplrs_backend::{
    Error, MemoryRegion, MemoryWindow, QpCap, QpInit, QpState, QueuePair, RecvWr, Resource, Result,
    SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion,
};
use ofi_sys as fi;
use parking_lot::Mutex;

use crate::bounce::Landed;
use crate::cm::PeerTable;
use crate::cq::OfiCq;
use crate::device::{opened, OfiDevice};
use crate::eager::{Arrival, Landing, ANNOUNCE, EAGER, EAGER_MAX, LARGE};
use crate::keys::{self, ENTRY_BYTES};
use crate::mem::OfiMw;
use crate::port::{Port, PortKey};
use crate::ready::Seat;
use crate::srq::OfiSrq;
use crate::{Fid, Info};

/// A receive's token carries this bit; a request's does not.
const RECV_BIT: u32 = 1 << 31;
/// The bits of a ring's tokens (below the backend's own tokens).
const TOKEN_MASK: u32 = (1 << 28) - 1;
/// With a request's token: the write of an RDMA write with immediate data
/// (the send that follows it completes the request).
const WRITE_PART: u32 = 1 << 28;
/// The token of the farewell write (see `farewell`).
const FAREWELL_TOKEN: u32 = 1 << 29;
/// A receive into a bounce buffer (an SRQ of ours: `bounce`), its slot in
/// the low bits.
const BOUNCE: u32 = RECV_BIT | (1 << 29);
/// The remote CQ data of a send with invalidate: this bit and the rkey the
/// receiver is to invalidate (libfabric has no invalidation of its own).
/// Where the provider carries only 4 bytes (verbs) the data is the rkey
/// alone: there no write with immediate data is offered, so a send's remote
/// CQ data can only be an invalidation (`OfiDevice::invalidation_data`).
pub(crate) const INVALIDATE: u64 = 1 << 32;
/// The remote CQ data of the send closing an RDMA write with immediate data
/// (libfabric's tcp consumes no receive for a write's own CQ data, DAT does):
/// this bit, the immediate data (low 32 bits) and the write's length (from
/// bit 34: at most MAX_IMM_WRITE bytes).
const WRITE_IMM: u64 = 1 << 33;
const MAX_IMM_WRITE: u64 = (1 << 30) - 1;
/// A connection tag's bit (reliable datagrams): its receives are the
/// provider's to match, not fed from its port's eager buffers (an SRQ of
/// ours: see `eager`); its peer sends every message under the tag as is.
const DIRECT: u64 = 1 << 40;
/// Messages that landed for a connection and found no receive: past this
/// many beyond its receive queue's depth the peer is flooding it, and the
/// connection breaks (as an RDMA NIC's would, the receiver not ready).
const ARRIVED_SLACK: usize = crate::eager::BUFFERS;
/// How long a disconnect waits for its farewell to be delivered.
const FAREWELL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);
/// How long a graceful disconnect waits at most for the requests posted. On a
/// live connection each completes or fails: ofi_rxm's first send waits for
/// its verbs connection, over a second under emulation. A bound all the same,
/// for a provider that never reports a request's end.
const DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);
/// The token of the backend's own read of a peer's key table entry.
const LOOKUP_TOKEN: u32 = 1 << 30;
/// The "start" of a key the peer's table does not have (such a request is
/// refused before it reaches the provider: `OfiQp::refused`).
const NOT_AT_PEER: u64 = u64::MAX;

struct Slot {
    wr_id: u64,
    opcode: WcOpcode,
    /// A request's length (libfabric reports lengths for receives only).
    len: u32,
    done: Option<WorkCompletion>,
    /// The immediate data of an RDMA write whose closing send waits for the
    /// write to complete (a provider without send-after-write order: shm).
    closing_imm: Option<u32>,
    /// An atomic's operands (the value to add, or the swap and compare
    /// values), which the provider may read until the request completes.
    operands: Option<Box<[u64; 2]>>,
    /// A message whose success waits for the peer's receipt: its number on
    /// the connection (see `OfiDevice::receipts`).
    receipt: Option<u64>,
}

/// Outstanding requests (or receives) of a QP, oldest first.
#[derive(Default)]
struct Ring {
    /// The token of the oldest slot.
    base: u32,
    slots: VecDeque<Slot>,
    /// Messages of this connection the peer said it received (`receipt`).
    received: u64,
}

impl Ring {
    fn push(&mut self, slot: Slot) -> u32 {
        let token = self.base.wrapping_add(self.slots.len() as u32) & TOKEN_MASK;
        self.slots.push_back(slot);
        token
    }

    fn mark(&mut self, token: u32, wc: impl FnOnce(&Slot) -> WorkCompletion) {
        let idx = (token.wrapping_sub(self.base) & TOKEN_MASK) as usize;
        // The first result stands (a write with immediate data may fail in
        // its write and then be flushed in its send).
        if let Some(slot) = self.slots.get_mut(idx).filter(|s| s.done.is_none()) {
            slot.done = Some(wc(slot));
        }
    }

    fn get_mut(&mut self, token: u32) -> Option<&mut Slot> {
        let idx = (token.wrapping_sub(self.base) & TOKEN_MASK) as usize;
        self.slots.get_mut(idx)
    }

    /// Whether a slot's completion may go to the consumer: it completed, and
    /// a message that succeeded was received by the peer where that is
    /// awaited (a failure needs no receipt).
    fn ready(&self, slot: &Slot) -> bool {
        slot.done.as_ref().is_some_and(|wc| {
            wc.status != WcStatus::Success || slot.receipt.is_none_or(|n| n <= self.received)
        })
    }

    /// Moves the completed slots at the front to `out`, in order.
    fn release(&mut self, out: &mut VecDeque<WorkCompletion>) {
        while self.slots.front().is_some_and(|s| self.ready(s)) {
            let slot = self.slots.pop_front().expect("front checked");
            self.base = self.base.wrapping_add(1) & TOKEN_MASK;
            out.extend(slot.done);
        }
    }

    /// Every slot, completed or flushed, in order. A message sent but not
    /// received by the peer is flushed: its data reached no receive.
    fn flush(&mut self, qp_num: u32) -> Vec<WorkCompletion> {
        self.base = self.base.wrapping_add(self.slots.len() as u32) & TOKEN_MASK;
        let received = self.received;
        self.slots
            .drain(..)
            .map(|s| {
                let unreceived = s.receipt.is_some_and(|n| n > received);
                match s.done {
                    Some(wc) if !(unreceived && wc.status == WcStatus::Success) => wc,
                    _ => WorkCompletion::flushed(s.wr_id, s.opcode, qp_num),
                }
            })
            .collect()
    }
}

struct Inner {
    state: QpState,
    /// A connected endpoint's own (FI_EP_MSG).
    ep: Option<Fid<fi::fid_ep>>,
    /// Reliable datagrams: the port the QP sends and receives through
    /// (`port`), from its connection until its reset or destroy.
    port: Option<Arc<Port>>,
    /// Reliable datagrams: this connection's id (the tag of the messages it
    /// receives) and the peer connection's (the tag of those it sends).
    tag: u64,
    peer_tag: u64,
    /// Tokens of the receives (ours, not bounce buffers) the provider holds:
    /// given back (`fi_cancel`) when the QP leaves its port.
    given: Vec<u32>,
    /// The receives the QP may give the provider at once.
    rx_cap: usize,
    sends: Ring,
    recvs: Ring,
    /// Receives the provider does not hold yet, oldest first: posted before
    /// the endpoint exists, or beyond the provider's receive depth (fed to it
    /// as earlier ones complete, so DAT's deeper queues lose nothing).
    pending: VecDeque<(u32, RecvWr)>,
    /// Reliable datagrams: what landed in the port's eager buffers for this
    /// connection and found no receive yet, oldest first (`arrived`).
    arrived: VecDeque<Arrival>,
    /// A large message's announce went and its send was refused (busy): its
    /// request's token, so that the retry sends no second announce.
    announced: Option<u32>,
    /// Receives and requests the provider holds now (at most its depths).
    recvs_given: usize,
    sends_given: usize,
    local: Option<SocketAddrV4>,
    remote: Option<SocketAddrV4>,
    /// The disconnection was reported (once per connection).
    ended: bool,
    /// A request failed so that the connection broke: later errors are flushes.
    broke: bool,
    /// The backend refused a request as a remote access error: the connection
    /// is to be broken once no queue lock is held (`OfiQp::broken`).
    break_pending: bool,
    /// The peer's key table, and the start of each of its keys read so far
    /// (see `keys`).
    peer: PeerTable,
    starts: std::collections::HashMap<u32, Option<keys::Remote>>,
    /// The key whose entry is being read from the peer's table (one at a time:
    /// the requests needing it wait in `held`, so a post never waits on the peer).
    lookup: Option<u32>,
    /// Requests behind a fence (see `post_request`), oldest first.
    held: VecDeque<Request>,
    /// RDMA writes with immediate data whose closing send the provider
    /// refused for now (shm: FI_EAGAIN): (token, length, immediate data),
    /// posted again by the progress thread (`retry_held`).
    unclosed: VecDeque<(u32, u64, u32)>,
    /// A connected endpoint's seats on the fid_cqs its CQs read (shared by a
    /// few endpoints; with an SRQ of the provider's, its receives' of its
    /// own: see `ready`, `srq`). Declared after `ep`, which must close first.
    feeds: Feeds,
    /// With an SRQ of ours, the endpoint's bounce buffers (closed with it).
    bounces: crate::bounce::Bounces,
    /// The peer endpoint's address in the port's AV (reliable datagrams;
    /// FI_ADDR_UNSPEC on a connected endpoint or before the handshake).
    dest: u64,
    /// Reliable datagrams: the peer endpoint's fabric address (its entry in
    /// the port's AV, counted: `Port::insert`).
    dest_name: Vec<u8>,
    /// Messages posted on this connection (each send's receipt number) and
    /// messages of the peer received whole, in order, into our receives (what
    /// our receipts say), where the device has receipts (`OfiDevice::receipts`).
    messages: u64,
    received: u64,
    /// A receive failed: the connection breaks, no later one is vouched for.
    receipts_over: bool,
}

/// Where the backend's own read of a peer's key table entry lands: memory of
/// the QP, registered when first needed.
struct Lookup {
    buf: Box<[u8; ENTRY_BYTES]>,
    mr: Option<Fid<fi::fid_mr>>,
}

pub(crate) struct OfiQp {
    num: u32,
    /// The current connection's number (its requests' contexts name it, so
    /// that what completes after it ended is not taken for a later one's):
    /// given at `open_endpoint`, 0 before.
    conn: std::sync::atomic::AtomicU32,
    dev: Weak<OfiDevice>,
    /// The device's progress thread's, told of each post (`Waiter::note_post`).
    waiter: Arc<crate::wait::Waiter>,
    send_cq: Arc<OfiCq>,
    recv_cq: Arc<OfiCq>,
    cap: QpCap,
    /// Reliable datagrams: our connection layer (`rdm`).
    rdm: bool,
    /// The provider's receive and transmit depths (what it takes at once).
    depths: (usize, usize),
    pd: u32,
    inner: Mutex<Inner>,
    /// Taken under `inner` (never the other way round).
    lookup: Mutex<Lookup>,
    pub(crate) farewell: crate::farewell::Farewell,
    /// Our farewell write completed (or failed).
    farewell_done: std::sync::atomic::AtomicBool,
    /// This side is disconnecting: the provider's FI_SHUTDOWN for our own
    /// `fi_shutdown` may be read before `disconnect` ends the QP.
    leaving: std::sync::atomic::AtomicBool,
    /// The shared receive queue the QP receives from, if any. After `inner`:
    /// fields drop in order, and the endpoint must close before the shared
    /// context it is bound to.
    srq: Option<Arc<OfiSrq>>,
    /// Reliable datagrams: the handshake's connection, open for the DAT
    /// connection's life (see `rdm`), and the number of the last one.
    link: Mutex<Option<crate::rdm::Link>>,
    links: std::sync::atomic::AtomicU64,
    /// Our receives took messages the peer has not been told of (`give_receipts`).
    receipt_due: std::sync::atomic::AtomicBool,
    /// Sends of ours wait for the peer's receipt: the request CQ reads our
    /// receipt words (`take_receipt`). Set and cleared under `inner`.
    awaiting_receipts: std::sync::atomic::AtomicBool,
    me: Weak<OfiQp>,
}

impl Drop for OfiQp {
    fn drop(&mut self) {
        let dev = self.dev.upgrade();
        let _closing = dev.as_ref().map(|d| d.closing.lock());
        let conn = self.conn.load(Ordering::Acquire);
        close_endpoint(&self.dev, self.inner.get_mut(), conn);
    }
}

/// A connected endpoint's seats on the fid_cqs its CQs read (`Inner::feeds`).
#[derive(Default)]
pub(crate) struct Feeds {
    /// Held (until the endpoint closed), read by the request CQ.
    tx: Option<Seat>,
    /// The receive CQ's seat (None: the request CQ's is the one).
    rx: Option<Seat>,
}

impl Feeds {
    /// A receive was posted: the provider may take a message it had read
    /// before, which no descriptor shows (`Seat::mark`).
    fn received(&self) {
        if let Some(rx) = self.rx.as_ref().or(self.tx.as_ref()) {
            rx.mark();
        }
    }
}

/// The context of request `token` of connection `conn` (what its
/// completion names: `cq::complete`).
fn context_of(conn: u32, token: u32) -> *mut libc::c_void {
    (((conn as u64) << 32) | token as u64) as *mut libc::c_void
}

/// Ends the QP's use of its endpoint (connection `conn`'s): a connected
/// endpoint closes; over reliable datagrams the QP gives back the receives
/// the provider holds (`fi_cancel`) and leaves its port, which closes with
/// its last QP (an endpoint a peer of this process still names is parked:
/// `rdm::Keeper`). Completions of the connection that come after are dropped.
fn close_endpoint(dev: &Weak<OfiDevice>, inner: &mut Inner, conn: u32) {
    let dev = dev.upgrade();
    if let Some(d) = &dev {
        d.tables.lock().conns.remove(&conn);
    }
    inner.dest = crate::rdm::FI_ADDR_UNSPEC;
    let dest_name = std::mem::take(&mut inner.dest_name);
    if let Some(port) = inner.port.take() {
        for token in std::mem::take(&mut inner.given) {
            // SAFETY: the port's open endpoint; a receive posted with this
            // context (one matched already completes as it is).
            unsafe { fi::fi_cancel(port.ep(), context_of(conn, token | RECV_BIT)) };
        }
        let parks = dev.as_ref().is_some_and(|d| d.parks);
        let peer = (!dest_name.is_empty()).then_some(dest_name.as_slice());
        let woken = port.leave(peer, inner.recvs_given, parks);
        inner.recvs_given = 0;
        port.keep_bounces(std::mem::take(&mut inner.bounces));
        drop(port);
        if let Some(d) = &dev {
            for qp in woken {
                d.retry_later(qp);
            }
        }
        return;
    }
    let Some(ep) = inner.ep.take() else { return };
    if let Some(d) = &dev {
        d.tables.lock().eps.remove(&(ep.ptr() as usize));
    }
    drop(ep);
    // Bounce buffers (if any) are freed once the endpoint closed.
    inner.bounces = Default::default();
}

/// Our object behind a trait object the core hands back (`any` is its
/// `as_any()`): the core hands back objects this device made, anything else
/// is foreign.
fn ours<T: Any, D: ?Sized>(object: &Arc<D>, any: &dyn Any) -> Result<Arc<T>> {
    let concrete = any.downcast_ref::<T>().ok_or(Error::Foreign)?;
    // Rebuild an Arc from the trait object's: same allocation, the concrete type.
    let raw = Arc::into_raw(object.clone()) as *const T;
    debug_assert!(std::ptr::eq(raw, concrete));
    // SAFETY: `raw` came from Arc::into_raw of an Arc whose value is this T
    // (checked by the downcast), so it is rebuilt with the same count.
    Ok(unsafe { Arc::from_raw(raw) })
}

fn ofi_cq(cq: &Arc<dyn daplrs_backend::CompletionQueue>) -> Result<Arc<OfiCq>> {
    ours(cq, cq.as_any())
}

impl OfiQp {
    pub(crate) fn new(dev: &OfiDevice, init: QpInit) -> Result<Arc<OfiQp>> {
        let send_cq = ofi_cq(&init.send_cq)?;
        let recv_cq = ofi_cq(&init.recv_cq)?;
        let srq = match &init.srq {
            Some(srq) => Some(ours::<OfiSrq, _>(srq, srq.as_any())?),
            None => None,
        };
        Ok(Arc::new_cyclic(|me| OfiQp {
            me: me.clone(),
            num: dev.next_qp_num(),
            conn: std::sync::atomic::AtomicU32::new(0),
            dev: dev.me.clone(),
            waiter: dev.waiter.clone(),
            send_cq,
            recv_cq,
            srq,
            cap: init.cap,
            rdm: dev.rdm,
            pd: init.pd.id(),
            depths: dev.queue_depths(),
            inner: Mutex::new(Inner {
                state: QpState::Init,
                ep: None,
                port: None,
                tag: 0,
                peer_tag: 0,
                given: Vec::new(),
                rx_cap: dev.queue_depths().0,
                sends: Ring::default(),
                recvs: Ring::default(),
                pending: VecDeque::new(),
                arrived: VecDeque::new(),
                announced: None,
                recvs_given: 0,
                sends_given: 0,
                local: None,
                remote: None,
                ended: false,
                broke: false,
                break_pending: false,
                peer: PeerTable::default(),
                starts: std::collections::HashMap::new(),
                lookup: None,
                held: VecDeque::new(),
                unclosed: VecDeque::new(),
                feeds: Feeds::default(),
                bounces: Default::default(),
                dest: crate::rdm::FI_ADDR_UNSPEC,
                dest_name: Vec::new(),
                messages: 0,
                received: 0,
                receipts_over: false,
            }),
            link: Mutex::new(None),
            links: std::sync::atomic::AtomicU64::new(0),
            receipt_due: std::sync::atomic::AtomicBool::new(false),
            awaiting_receipts: std::sync::atomic::AtomicBool::new(false),
            farewell: crate::farewell::Farewell::new(),
            farewell_done: std::sync::atomic::AtomicBool::new(false),
            leaving: std::sync::atomic::AtomicBool::new(false),
            lookup: Mutex::new(Lookup {
                buf: Box::new([0; ENTRY_BYTES]),
                mr: None,
            }),
        }))
    }

    pub(crate) fn num(&self) -> u32 {
        self.num
    }

    /// The protection domain of the QP (announced to the peer: `keys::Remote`).
    pub(crate) fn pd(&self) -> u32 {
        self.pd
    }

    /// Our QP behind a trait object the core hands back.
    pub(crate) fn of(qp: &Arc<dyn QueuePair>) -> Result<Arc<OfiQp>> {
        ours(qp, qp.as_any())
    }

    fn context(&self, token: u32) -> *mut libc::c_void {
        context_of(self.conn.load(Ordering::Acquire), token)
    }

    /// The endpoint the QP posts on: its own, or its port's.
    fn ep_of(inner: &Inner) -> Option<*mut fi::fid_ep> {
        match (&inner.ep, &inner.port) {
            (Some(ep), _) => Some(ep.ptr()),
            (None, Some(port)) => Some(port.ep()),
            (None, None) => None,
        }
    }

    /// This connection's id, the tag of the messages it receives (reliable
    /// datagrams: the peer learns it in the handshake).
    pub(crate) fn tag(&self) -> u64 {
        self.inner.lock().tag
    }

    /// The peer connection's id, the tag of the messages we send it.
    pub(crate) fn set_peer_tag(&self, tag: u64) {
        self.inner.lock().peer_tag = tag;
    }

    /// Opens the endpoint from `info` (the device's for an active side, the
    /// request's for a passive one), binds the device's EQ and the QP's CQs,
    /// enables it and posts the receives waiting for it.
    pub(crate) fn open_endpoint(
        self: &Arc<Self>,
        dev: &OfiDevice,
        info: &Info,
        passive: bool,
    ) -> Result<()> {
        // Bound to its CQs, an endpoint is progressed by their reads: not
        // before it is enabled (ofi_rxm's opens its own CQ then).
        let asked = std::time::Instant::now();
        let _opening = dev.closing.lock();
        let locked = asked.elapsed();
        let mut inner = self.inner.lock();
        if inner.state != QpState::Init || inner.ep.is_some() || inner.port.is_some() {
            return Err(Error::BadState);
        }
        self.farewell.arm(dev)?;
        self.farewell_done.store(false, Ordering::Release);
        self.leaving.store(false, Ordering::Release);
        let conn = dev.next_conn();
        self.conn.store(conn, Ordering::Release);
        if dev.rdm {
            let key = if self.srq.is_some() {
                PortKey::Own { qp: self.num }
            } else {
                PortKey::Shared {
                    send_cq: daplrs_backend::CompletionQueue::id(&*self.send_cq),
                    recv_cq: daplrs_backend::CompletionQueue::id(&*self.recv_cq),
                    passive,
                }
            };
            let port = dev.attach_port(key, &self.send_cq, &self.recv_cq)?;
            log::debug!(
                "QP {}: port {key:?} (lock {locked:?}, {:?})",
                self.num,
                asked.elapsed()
            );
            inner.port = Some(port);
            // The tag's low 32 bits name the connection (`eager`).
            let direct = !dev.eager || self.srq.is_some();
            inner.tag = conn as u64 | if direct { DIRECT } else { 0 };
            inner.peer_tag = 0;
            inner.arrived.clear();
            inner.announced = None;
            inner.rx_cap = (self.cap.max_recv_wr.max(1) as usize).min(self.depths.0);
        } else {
            self.open_own(dev, info, &mut inner, locked, asked)?;
        }
        dev.tables.lock().conns.insert(conn, self.me.clone());
        inner.state = QpState::Connecting;
        inner.recvs_given = 0;
        inner.sends_given = 0;
        inner.messages = 0;
        inner.received = 0;
        inner.receipts_over = false;
        inner.sends.received = 0;
        if let Some(srq) = self.pooled_srq() {
            srq.enroll(self);
            // Any not posted now are retried (`post_bounces`).
            let _ = self.post_bounces(dev, srq, &mut inner);
            return Ok(());
        }
        self.feed_recvs(&mut inner)
    }

    /// Opens a connected endpoint of the QP's own (FI_EP_MSG) from `info`,
    /// bound to the device's EQ and the QP's CQs, and enabled.
    fn open_own(
        self: &Arc<Self>,
        dev: &OfiDevice,
        info: &Info,
        inner: &mut Inner,
        locked: std::time::Duration,
        asked: std::time::Instant,
    ) -> Result<()> {
        let mut ep = null_mut();
        // SAFETY: an open domain and a provider fi_info; `ep` receives the endpoint.
        let rc = unsafe { fi::fi_endpoint(dev.domain.ptr(), info.ptr(), &mut ep, null_mut()) };
        opened(rc, "fi_endpoint", Error::NoResource(Resource::Qp))?;
        let ep = Fid(ep);
        // Connection events come on the EQ.
        opened(
            // SAFETY: the endpoint just opened; the EQ is an open object of its fabric.
            unsafe { fi::fi_ep_bind(ep.ptr(), dev.eq.fid(), 0) },
            "bind EQ",
            Error::Internal,
        )?;
        let feeds = self.bind_cqs(dev, &ep)?;
        // SAFETY: the endpoint, bound to its EQ and CQs.
        let enable = || unsafe { fi::fi_enable(ep.ptr()) };
        let mut rc = enable();
        if rc == -(fi::FI_EBUSY as i32) {
            // shm names an endpoint's memory "<pid>:<uid>:<index>" and
            // refuses a file of that name whose recorded pid is alive, then
            // removes it. A killed process leaves its files behind, and once
            // pids wrap the live pid is ours: the second try creates it anew.
            rc = enable();
        }
        opened(rc, "fi_enable", Error::NoResource(Resource::Qp))?;
        log::debug!(
            "QP {}: endpoint lock {locked:?}, opened in {:?}",
            self.num,
            asked.elapsed()
        );
        dev.tables.lock().eps.insert(ep.ptr() as usize, self.num);
        inner.ep = Some(ep);
        inner.feeds = feeds;
        inner.rx_cap = self.depths.0;
        Ok(())
    }

    /// Binds the endpoint to fid_cqs of its own that the QP's CQs read
    /// (`ready`): one for its requests and receives when both CQs are one,
    /// else one each; with an SRQ of the provider's, its shared context and
    /// a fid_cq for its receives (see `srq`).
    fn bind_cqs(self: &Arc<Self>, dev: &OfiDevice, ep: &Fid<fi::fid_ep>) -> Result<Feeds> {
        let srx = self.srq.as_ref().and_then(|srq| srq.srx());
        let same = srx.is_none() && Arc::ptr_eq(&self.send_cq, &self.recv_cq);
        let bind = |fid: *mut fi::fid, flags: u64| {
            // SAFETY: the endpoint just opened; `fid` an open object of its domain.
            opened(
                unsafe { fi::fi_ep_bind(ep.ptr(), fid, flags) },
                "bind CQ",
                Error::Internal,
            )
        };
        let tx_flags = fi::FI_TRANSMIT as u64 | if same { fi::FI_RECV as u64 } else { 0 };
        let tx = self.send_cq.seat(dev, None)?;
        bind(tx.cq().fid(), tx_flags)?;
        if same {
            return Ok(Feeds {
                tx: Some(tx),
                rx: None,
            });
        }
        let rx = self.recv_cq.seat(dev, srx.is_some().then_some(self))?;
        if let Some(srx) = srx {
            bind(srx.fid(), 0)?;
        }
        bind(rx.cq().fid(), fi::FI_RECV as u64)?;
        Ok(Feeds {
            tx: Some(tx),
            rx: Some(rx),
        })
    }

    /// A receive of the SRQ completed on this QP's endpoint. Returns whether
    /// the connection broke under it (as `completed`).
    pub(crate) fn srq_received(
        &self,
        token: u32,
        result: Result<u32, WcStatus>,
        data: Option<u64>,
        out: &mut VecDeque<WorkCompletion>,
    ) -> bool {
        let Some(wr_id) = self.srq.as_ref().and_then(|srq| srq.take(token)) else {
            log::debug!("QP {}: completion of SRQ receive {token}, gone", self.num);
            return false;
        };
        let (wc, refused) = self.shared_completion(wr_id, result, data);
        out.push_back(wc);
        if refused {
            let mut inner = self.inner.lock();
            inner.broke = true;
            inner.break_pending = true;
        }
        refused
    }

    /// The completion of an SRQ's receive `wr_id` this QP consumed, and
    /// whether it named a window it may not invalidate (it then fails and
    /// the connection breaks).
    fn shared_completion(
        &self,
        wr_id: u64,
        result: Result<u32, WcStatus>,
        data: Option<u64>,
    ) -> (WorkCompletion, bool) {
        let num = self.num;
        let (invalidated, refused) = self.invalidation(data);
        let imm = data.filter(|d| d & WRITE_IMM != 0);
        let wc = match (refused, result) {
            (true, _) => {
                WorkCompletion::new(wr_id, WcStatus::LocalProtection, WcOpcode::Recv, 0, num)
            }
            (false, Err(status)) => WorkCompletion::new(wr_id, status, WcOpcode::Recv, 0, num),
            (false, Ok(got)) => WorkCompletion {
                solicited: true,
                invalidated,
                imm: imm.map(|d| d as u32),
                ..WorkCompletion::new(
                    wr_id,
                    WcStatus::Success,
                    imm.map_or(WcOpcode::Recv, |_| WcOpcode::RecvRdmaImm),
                    imm.map_or(got, |d| (d >> 34) as u32),
                    num,
                )
            },
        };
        (wc, refused)
    }

    /// The QP's SRQ where it is a pool of ours (see `srq`).
    fn pooled_srq(&self) -> Option<&Arc<OfiSrq>> {
        self.srq.as_ref().filter(|srq| srq.srx().is_none())
    }

    /// Posts the bounce buffers not posted (an SRQ of ours).
    /// One the provider refuses for now (busy) is posted again by the
    /// progress thread (`retry_held`): with none posted, nothing would come
    /// back here.
    fn post_bounces(&self, dev: &OfiDevice, srq: &OfiSrq, inner: &mut Inner) -> Result<()> {
        let ep = Self::ep_of(inner).ok_or(Error::BadState)?;
        let count = crate::bounce::BOUNCES.min(self.depths.0);
        let len = srq.bounce_len();
        let tag = self.rdm.then_some(inner.tag);
        let posted = inner.bounces.post_all(dev, ep, count, len, tag, |slot| {
            self.context(BOUNCE | slot as u32)
        });
        match &posted {
            Err(Error::NoResource(Resource::WorkQueue)) => dev.retry_later(self.num),
            Err(e) => log::warn!("QP {}: bounce buffers not posted: {e:?}", self.num),
            Ok(()) => inner.feeds.received(),
        }
        posted
    }

    /// A bounce buffer completed: what landed, in order, waits in the SRQ for
    /// a receive, and this QP's oldest waiting messages take those posted.
    fn bounce_landed(&self, inner: &mut Inner, landed: Landed, out: &mut VecDeque<WorkCompletion>) {
        let Some(srq) = self.pooled_srq() else { return };
        let mut ready = Vec::new();
        let cancelled = inner.bounces.landed(landed, &mut ready);
        if inner.state == QpState::Error || Self::ep_of(inner).is_none() {
            // Flushed as the connection ended: nothing of the consumer's was in it.
            return;
        }
        if cancelled {
            if let Some(dev) = self.dev.upgrade() {
                let _ = self.post_bounces(&dev, srq, inner);
            }
            return;
        }
        for landed in ready {
            srq.arrived(self.num, landed);
        }
        self.serve_locked(inner, srq, out);
    }

    /// Copies this QP's waiting messages into the SRQ's receives while it
    /// has them and the oldest waiting message is this QP's; each receive
    /// completes into `out` (the receive CQ's queue) and its bounce buffer is
    /// posted again.
    fn serve_locked(&self, inner: &mut Inner, srq: &OfiSrq, out: &mut VecDeque<WorkCompletion>) {
        let mut served = false;
        while let Some((landed, wr)) = srq.take_for(self.num) {
            let result = match landed.result {
                Ok(len) => {
                    crate::srq::copy_into(&wr, inner.bounces.take(landed.slot, len as usize))
                }
                Err(status) => {
                    inner.bounces.take(landed.slot, 0);
                    Err(status)
                }
            };
            let (wc, refused) = self.shared_completion(wr.wr_id, result, landed.data);
            self.give_receipts(inner, std::iter::once(&wc));
            out.push_back(wc);
            if refused {
                inner.broke = true;
                inner.break_pending = true;
            }
            served = true;
        }
        if served {
            if let Some(dev) = self.dev.upgrade() {
                let _ = self.post_bounces(&dev, srq, inner);
            }
        }
    }

    /// A receive was posted to the SRQ (of ours) while a message of this QP
    /// waited for one: it completes on the QP's receive CQ.
    pub(crate) fn serve_srq(&self, srq: &OfiSrq) {
        self.recv_cq.deliver(|out| {
            let mut inner = self.inner.lock();
            self.serve_locked(&mut inner, srq, out);
        });
        self.send_receipt();
        if std::mem::take(&mut self.inner.lock().break_pending) {
            self.broken();
        }
    }

    /// The SRQ's receives grew beyond the bounce buffers posted: those are
    /// asked back, and posted again longer as their cancels complete.
    pub(crate) fn lengthen_bounces(&self, len: usize) {
        let mut inner = self.inner.lock();
        let Some(ep) = Self::ep_of(&inner) else {
            return;
        };
        if inner.state == QpState::Error {
            return;
        }
        inner
            .bounces
            .cancel_shorter(ep, len, |slot| self.context(BOUNCE | slot as u32));
    }

    /// Gives the provider the waiting receives it has room for, in order
    /// (fed from eager buffers: those for the large messages announced).
    fn feed_recvs(&self, inner: &mut Inner) -> Result<()> {
        if Self::receives_eagerly(inner) {
            return self.give_announced(inner);
        }
        while !inner.pending.is_empty() && self.may_give_recv(inner) {
            let (token, wr) = inner.pending.pop_front().expect("checked");
            if let Err(e) = self.give_recv(inner, token, &wr) {
                // Kept, in its place, for the next completion to retry.
                inner.pending.push_front((token, wr));
                return Err(e);
            }
        }
        Ok(())
    }

    /// Whether the QP may give the provider one more receive: below its cap
    /// and, over a port, its own slot or a spare one (else it waits for one,
    /// woken by `retry_held`: `Port::take_slot`).
    fn may_give_recv(&self, inner: &Inner) -> bool {
        if inner.recvs_given >= inner.rx_cap {
            return false;
        }
        match &inner.port {
            Some(port) => port.take_slot(self.num, inner.recvs_given),
            None => true,
        }
    }

    /// Posts receive `token` (its room taken by `may_give_recv`); a refusal
    /// gives the room back. Over a port a busy provider (its receive entries
    /// also hold messages that came before their receive) keeps the receive
    /// waiting, for the progress thread to post (`retry_held`).
    fn give_recv(&self, inner: &mut Inner, token: u32, wr: &RecvWr) -> Result<()> {
        match self.post_recv_now(inner, token, wr) {
            Ok(()) => {
                inner.recvs_given += 1;
                inner.given.push(token);
                Ok(())
            }
            Err(e) => {
                if let Some(port) = &inner.port {
                    let woken = port.returned(inner.recvs_given + 1);
                    if let Some(dev) = self.dev.upgrade() {
                        for qp in woken {
                            dev.retry_later(qp);
                        }
                        // shm's receive entries also hold the messages that came
                        // before their receive: full, it says ENOMEM, not EAGAIN.
                        let busy = e == Error::NoResource(Resource::WorkQueue)
                            || (self.rdm && e == Error::NoResource(Resource::Memory));
                        if busy {
                            dev.retry_later(self.num);
                        }
                    }
                }
                Err(e)
            }
        }
    }

    /// A receive the provider held is done (completed, or given back): its
    /// room frees (a spare slot of the port wakes a QP waiting for one).
    fn recv_done(&self, inner: &mut Inner, token: u32) {
        let had = inner.recvs_given;
        inner.recvs_given = had.saturating_sub(1);
        let token = token & TOKEN_MASK;
        if let Some(i) = inner.given.iter().position(|&t| t == token) {
            inner.given.swap_remove(i);
        }
        if let Some(port) = &inner.port {
            let woken = port.returned(had);
            if let Some(dev) = self.dev.upgrade() {
                for qp in woken {
                    dev.retry_later(qp);
                }
            }
        }
    }

    /// The endpoint's fabric address (`fi_getname`), for the peer's AV.
    pub(crate) fn fabric_name(&self) -> Result<Vec<u8>> {
        let inner = self.inner.lock();
        let port = inner.port.as_ref().ok_or(Error::BadState)?;
        Ok(port.name().to_vec())
    }

    /// Inserts the peer endpoint's fabric address (`name`) into the
    /// endpoint's AV: sends go there.
    /// `name` came from the peer's handshake: its shape is checked against
    /// our own endpoint's name before the provider reads it.
    pub(crate) fn insert_peer(&self, name: &[u8]) -> Result<()> {
        let dev = self.dev.upgrade().ok_or(Error::BadState)?;
        let parks = dev.parks;
        // SAFETY: the device's fi_info.
        let string_format = unsafe { (*dev.info.ptr()).addr_format } == fi::FI_ADDR_STR;
        drop(dev);
        let own = self.fabric_name()?;
        if !peer_name_fits(&own, string_format, name) {
            log::warn!(
                "a peer's fabric address of {} bytes is not of this provider's shape ({} bytes{}): refused",
                name.len(),
                own.len(),
                if string_format { ", a string" } else { "" }
            );
            return Err(Error::NoResource(Resource::Qp));
        }
        let mut inner = self.inner.lock();
        if !inner.dest_name.is_empty() {
            return Err(Error::BadState);
        }
        let port = inner.port.clone().ok_or(Error::BadState)?;
        inner.dest = port.insert(name, parks)?;
        inner.dest_name = name.to_vec();
        Ok(())
    }

    /// Keeps the handshake's connection for a connection being made; returns
    /// its number (Err: this side gave up meanwhile).
    pub(crate) fn attach_link(&self, stream: &std::net::TcpStream) -> Result<u64> {
        let inner = self.inner.lock();
        if inner.state != QpState::Connecting || self.is_leaving() {
            return Err(Error::BadState);
        }
        let stream = stream
            .try_clone()
            .map_err(|_| Error::NoResource(Resource::Host))?;
        let generation = self.links.fetch_add(1, Ordering::AcqRel) + 1;
        *self.link.lock() = Some(crate::rdm::Link {
            stream: Arc::new(stream),
            generation,
        });
        Ok(generation)
    }

    /// Whether the QP's connection is still the one numbered `generation`.
    pub(crate) fn is_link(&self, generation: u64) -> bool {
        self.link
            .lock()
            .as_ref()
            .is_some_and(|l| l.generation == generation)
    }

    pub(crate) fn is_leaving(&self) -> bool {
        self.leaving.load(Ordering::Acquire)
    }

    /// Ends the handshake's connection (reliable datagrams): with a close, the
    /// peer reports a disconnection, without, a broken connection.
    fn end_link(&self, graceful: bool) {
        let link = self.link.lock().take();
        if let Some(link) = link {
            link.end(graceful);
        }
    }

    /// The connected endpoint's fid_ep (for connect, accept and shutdown;
    /// None over a port, which other QPs share).
    pub(crate) fn endpoint(&self) -> Option<*mut fi::fid_ep> {
        self.inner.lock().ep.as_ref().map(Fid::ptr)
    }

    pub(crate) fn set_addresses(&self, local: Option<SocketAddrV4>, remote: Option<SocketAddrV4>) {
        let mut inner = self.inner.lock();
        inner.local = local.or(inner.local);
        inner.remote = remote.or(inner.remote);
    }

    /// FI_CONNECTED: whether the QP was connecting (the event is then reported).
    pub(crate) fn on_connected(&self) -> bool {
        let mut inner = self.inner.lock();
        if inner.state != QpState::Connecting {
            return false;
        }
        inner.state = QpState::Connected;
        true
    }

    /// The connection ended (either side, or failed): the QP goes to Error and
    /// everything outstanding is flushed. Returns whether this is the first
    /// end of the connection (to report once).
    pub(crate) fn end(&self) -> bool {
        self.end_if(|_| true)
    }

    /// Ends the connection an EQ entry of endpoint `fid` reports, if that is
    /// still this QP's endpoint: the progress thread reads an entry before it
    /// handles it, and a `reset` meanwhile (the consumer saw the connection
    /// end another way) closed that endpoint; ending the reset QP would leave
    /// it in Error and refuse the next connect.
    pub(crate) fn end_of(&self, fid: *mut fi::fid) -> bool {
        self.end_if(|inner| inner.ep.as_ref().map(|ep| ep.ptr() as usize) == Some(fid as usize))
    }

    /// The flush goes into the CQs' queues with them held (taken before the
    /// QP's lock, as a reader or a post does): pushed after the QP's lock
    /// was released, a request posted meanwhile (flushed at once, the QP in
    /// Error) came before those posted ahead of it (test_remote_violation,
    /// once the progress thread found the violation while the requests after
    /// it were still being posted).
    fn end_if(&self, current: impl FnOnce(&Inner) -> bool) -> bool {
        OfiCq::deliver_both(&self.send_cq, &self.recv_cq, |sq, rq| {
            let mut inner = self.inner.lock();
            if !current(&inner) {
                return false;
            }
            inner.state = QpState::Error;
            inner.held.clear();
            inner.unclosed.clear();
            sq.extend(inner.sends.flush(self.num));
            let recvs = inner.recvs.flush(self.num);
            match rq {
                Some(rq) => rq.extend(recvs),
                None => sq.extend(recvs),
            }
            let pending: Vec<_> = inner.pending.drain(..).collect();
            drop(pending);
            // Messages that found no receive die with the connection (their
            // senders had no receipt of them).
            inner.arrived.clear();
            if let Some(srq) = self.pooled_srq() {
                // Messages that found no receive die with the connection.
                srq.forget(self.num);
            }
            !std::mem::replace(&mut inner.ended, true)
        })
    }

    pub(crate) fn was_connecting(&self) -> bool {
        self.inner.lock().state == QpState::Connecting
    }

    pub(crate) fn disconnect(&self, abrupt: bool) {
        self.leaving.store(true, Ordering::Release);
        // Graceful: the requests posted complete first (the farewell's
        // completion may come before theirs, and the close would flush them).
        if !abrupt {
            self.drain_requests();
        }
        if self.link.lock().is_some() {
            self.end_link(true);
        } else {
            self.say_farewell();
        }
        let ep = self.endpoint();
        if let Some(ep) = ep {
            // SAFETY: the QP's open endpoint (connected: a port is shared).
            let rc = unsafe { fi::fi_shutdown(ep, 0) };
            if rc != 0 && !abrupt {
                log::debug!("fi_shutdown: {}", fi::strerror(rc));
            }
        }
        if self.end() {
            if let Some(dev) = self.dev.upgrade() {
                dev.emit(daplrs_backend::CmEvent::Disconnected { qp_num: self.num });
            }
        }
    }

    /// A graceful disconnect: the requests posted complete first (while the
    /// connection lives, bounded by DRAIN_LIMIT), so that they are not
    /// flushed by the close and the peer has what we sent before it learns
    /// of it.
    fn drain_requests(&self) {
        let deadline = std::time::Instant::now() + DRAIN_LIMIT;
        loop {
            {
                let inner = self.inner.lock();
                // A connection that ended or broke flushes what is left.
                if inner.sends.slots.is_empty() || inner.ended || inner.broke {
                    return;
                }
            }
            if std::time::Instant::now() >= deadline {
                log::warn!(
                    "QP {}: graceful disconnect: requests still outstanding after {DRAIN_LIMIT:?}",
                    self.num
                );
                return;
            }
            self.send_cq.reap_and_notify();
            std::thread::yield_now();
        }
    }

    /// Whether the connection's end is a disconnection: ours, or the peer's
    /// (its farewell arrived); otherwise it broke.
    pub(crate) fn ended_gracefully(&self) -> bool {
        self.leaving.load(Ordering::Acquire) || self.farewell.received()
    }

    /// Writes our farewell into the peer's word and waits (bounded) for its
    /// delivery, so that the peer reports a disconnection, not a broken
    /// connection (see `farewell`).
    fn say_farewell(&self) {
        let (ep, peer) = {
            let inner = self.inner.lock();
            match (&inner.ep, inner.state) {
                (Some(ep), QpState::Connected) => (ep.ptr(), inner.peer),
                _ => return,
            }
        };
        if !self.farewell.send(ep, &peer, self.context(FAREWELL_TOKEN)) {
            log::debug!("QP {}: no farewell to send", self.num);
            return;
        }
        let deadline = std::time::Instant::now() + FAREWELL_TIMEOUT;
        while !self.farewell_done.load(Ordering::Acquire) && std::time::Instant::now() < deadline {
            self.send_cq.reap_and_notify();
            std::thread::yield_now();
        }
        log::debug!(
            "QP {}: farewell delivered: {}",
            self.num,
            self.farewell_done.load(Ordering::Acquire)
        );
    }

    /// A connect or accept failed after the endpoint opened, before anything
    /// went to the peer: the endpoint closes and the QP is as before (Init).
    /// Receives the endpoint held are flushed (not kept: the provider had
    /// them), so that none is lost silently.
    pub(crate) fn abandon(&self) {
        self.end_link(false);
        self.end();
        self.inner.lock().ended = false;
        let dev = self.dev.upgrade();
        let _closing = dev.as_ref().map(|d| d.closing.lock());
        let feeds = {
            let mut inner = self.inner.lock();
            close_endpoint(&self.dev, &mut inner, self.conn.load(Ordering::Acquire));
            inner.state = QpState::Init;
            std::mem::take(&mut inner.feeds)
        };
        drop(feeds);
    }

    pub(crate) fn destroy_now(&self) {
        self.end_link(false);
        self.end();
        let dev = self.dev.upgrade();
        let _closing = dev.as_ref().map(|d| d.closing.lock());
        let feeds = {
            let mut inner = self.inner.lock();
            close_endpoint(&self.dev, &mut inner, self.conn.load(Ordering::Acquire));
            std::mem::take(&mut inner.feeds)
        };
        // The endpoint closed first: its CQs may close now.
        drop(feeds);
    }

    /// The connection failed under a request (a remote access error, a
    /// transport failure): as on an RDMA NIC the QP goes to Error, the rest is
    /// flushed, and the consumer learns the connection broke.
    pub(crate) fn broken(&self) {
        // The peer learns the connection broke: its end, with no close.
        self.end_link(false);
        if let Some(ep) = self.endpoint() {
            // SAFETY: the QP's open endpoint; the peer learns the connection ended.
            unsafe { fi::fi_shutdown(ep, 0) };
        }
        if self.end() {
            if let Some(dev) = self.dev.upgrade() {
                dev.emit(daplrs_backend::CmEvent::Broken { qp_num: self.num });
            }
        }
    }

    /// A provider completion (or error) of slot `token`. Returns whether the
    /// connection broke under it (the caller calls `broken` once it holds no
    /// queue lock).
    pub(crate) fn completed(
        &self,
        token: u32,
        result: Result<u32, WcStatus>,
        data: Option<u64>,
        out: &mut VecDeque<WorkCompletion>,
    ) -> bool {
        // Over reliable datagrams no connection drops under a failed request
        // (a stale key, say): as on an RDMA NIC any failed request breaks it.
        let fatal = matches!(
            result,
            Err(WcStatus::RemoteAccess
                | WcStatus::RemoteInvalidRequest
                | WcStatus::Transport
                | WcStatus::RemoteOp)
        ) || (self.rdm && result.is_err() && token & RECV_BIT == 0)
            // A message longer than its receive: as on an RDMA NIC the
            // receive fails and the connection breaks (the sender's message
            // then never counts as received: `Ring::flush`).
            || (self.rdm && token & RECV_BIT != 0 && result == Err(WcStatus::LocalLength));
        if token == FAREWELL_TOKEN {
            // The connection ends next either way.
            self.farewell_done.store(true, Ordering::Release);
            return false;
        }
        let mut inner = self.inner.lock();
        let mut token = token;
        if token != LOOKUP_TOKEN && token & (RECV_BIT | WRITE_PART) == WRITE_PART {
            inner.sends_given = inner.sends_given.saturating_sub(1);
            if result.is_ok() {
                // Its send completes the request (or did, failing at post),
                // or goes now if it waited for the write (`issue`).
                let base = token & !WRITE_PART;
                if let Some(slot) = inner.sends.get_mut(base) {
                    if let Some(imm) = slot.closing_imm.take() {
                        let len = slot.len as u64;
                        self.close_write_imm(&mut inner, base, len, imm);
                    }
                }
                inner.sends.release(out);
                self.release_held(&mut inner, out);
                return false;
            }
            // Its failure is the request's.
            token &= !WRITE_PART;
        }
        if token == LOOKUP_TOKEN {
            // Not the consumer's: the requests waiting for the entry go on. A
            // lookup fails only as its connection ends: they wait for the flush.
            self.looked_up(&mut inner, result.is_ok());
            if result.is_ok() {
                self.release_held(&mut inner, out);
            }
            inner.broke |= fatal;
            let refused = std::mem::take(&mut inner.break_pending);
            return (fatal || refused) && inner.state == QpState::Connected;
        }
        // libfabric fails every request outstanding when a connection ends; as
        // on an RDMA NIC, only the first error is the QP's, what follows it (and
        // a receive, which sees no transport) is flushed.
        let result = match result {
            Err(WcStatus::LocalLength) => result,
            // soft-RoCE fails a receive too small for its message as a local
            // QP operation error (the sender sees REM_OP_ERR), not LOC_LEN_ERR;
            // the core checked the receive's own segments before the post, so
            // a message longer than them is the cause left.
            Err(WcStatus::LocalQpOp) if !inner.broke && token & RECV_BIT != 0 => {
                Err(WcStatus::LocalLength)
            }
            Err(_) if inner.broke || token & RECV_BIT != 0 => Err(WcStatus::Flushed),
            _ => result,
        };
        inner.broke |= fatal;
        if token & BOUNCE == BOUNCE {
            let slot = (token & TOKEN_MASK) as usize;
            self.bounce_landed(&mut inner, Landed { slot, result, data }, out);
        } else if token & RECV_BIT != 0 {
            self.received(&mut inner, token, result, data, out);
        } else {
            inner.sends_given = inner.sends_given.saturating_sub(1);
            let num = self.num;
            inner.sends.mark(token, |s| match result {
                Ok(_) => WorkCompletion::new(s.wr_id, WcStatus::Success, s.opcode, s.len, num),
                Err(status) => WorkCompletion::new(s.wr_id, status, s.opcode, 0, num),
            });
            inner.sends.release(out);
            self.release_held(&mut inner, out);
        }
        let refused = std::mem::take(&mut inner.break_pending);
        (fatal || refused) && inner.state == QpState::Connected
    }

    /// A receive's completion: its length (or error) and remote CQ data (an
    /// invalidation, or a write with immediate data); then the receives
    /// waiting for the provider's room get it.
    fn received(
        &self,
        inner: &mut Inner,
        token: u32,
        result: Result<u32, WcStatus>,
        data: Option<u64>,
        out: &mut VecDeque<WorkCompletion>,
    ) {
        self.fill_recv(inner, token, result, data, out);
        self.recv_done(inner, token);
        if Self::receives_eagerly(inner) {
            self.match_arrivals(inner, out);
        } else if inner.state == QpState::Connected {
            if let Err(e) = self.feed_recvs(inner) {
                log::debug!("QP {}: receives wait for room: {e:?}", self.num);
            }
        }
    }

    /// Receive `token` is done (`result`, `data`: as `received`): its slot
    /// is marked, the receives done in order go to `out`, and the peer is
    /// owed a receipt of them.
    fn fill_recv(
        &self,
        inner: &mut Inner,
        token: u32,
        result: Result<u32, WcStatus>,
        data: Option<u64>,
        out: &mut VecDeque<WorkCompletion>,
    ) {
        let num = self.num;
        let (invalidated, refused) = self.invalidation(data);
        let imm = data.filter(|d| d & WRITE_IMM != 0);
        inner.recvs.mark(token, |s| match (refused, result) {
            (true, _) => WorkCompletion::new(s.wr_id, WcStatus::LocalProtection, s.opcode, 0, num),
            (false, Err(status)) => WorkCompletion::new(s.wr_id, status, s.opcode, 0, num),
            (false, Ok(got)) => WorkCompletion {
                solicited: true,
                invalidated,
                imm: imm.map(|d| d as u32),
                ..WorkCompletion::new(
                    s.wr_id,
                    WcStatus::Success,
                    imm.map_or(s.opcode, |_| WcOpcode::RecvRdmaImm),
                    imm.map_or(got, |d| (d >> 34) as u32),
                    num,
                )
            },
        });
        if refused {
            // As on an RDMA NIC, the receive fails and the connection breaks.
            inner.broke = true;
            inner.break_pending = true;
        }
        let before = out.len();
        inner.recvs.release(out);
        self.give_receipts(inner, out.range(before..));
    }

    /// Whether the QP's receives are fed from its port's eager buffers
    /// (`eager`), not matched by the provider.
    fn receives_eagerly(inner: &Inner) -> bool {
        inner.port.is_some() && inner.tag & DIRECT == 0
    }

    /// A message for this connection landed in the eager buffers of `port`
    /// (`eager`): it takes the oldest receive waiting, or waits for one.
    /// Returns whether the connection is to break (as `completed`).
    pub(crate) fn arrived(
        &self,
        port: &Arc<Port>,
        arrival: Landing,
        out: &mut VecDeque<WorkCompletion>,
    ) -> bool {
        let mut inner = self.inner.lock();
        let ours = inner.port.as_ref().is_some_and(|p| Arc::ptr_eq(p, port));
        if !ours || !matches!(inner.state, QpState::Connected | QpState::Connecting) {
            // Another port's connection (a peer naming a connection not its
            // own), or one that ended: nobody's receive takes it.
            return false;
        }
        match arrival {
            Ok(arrival) => inner.arrived.push_back(arrival),
            Err(status) => {
                log::warn!("QP {}: eager buffer failed: {status:?}", self.num);
                inner.broke = true;
                inner.break_pending = true;
            }
        }
        if inner.arrived.len() > self.cap.max_recv_wr as usize + ARRIVED_SLACK {
            log::warn!("QP {}: the peer sends beyond our receives", self.num);
            inner.arrived.clear();
            inner.broke = true;
            inner.break_pending = true;
        }
        self.match_arrivals(&mut inner, out);
        let refused = std::mem::take(&mut inner.break_pending);
        refused && inner.state == QpState::Connected
    }

    /// Pairs what arrived with the receives waiting, oldest with oldest: a
    /// short message is copied into its receive, which completes into `out`
    /// (the receive CQ's queue); a large one's receive goes to the provider
    /// (`give_announced`), and waits there while that has no room.
    fn match_arrivals(&self, inner: &mut Inner, out: &mut VecDeque<WorkCompletion>) {
        loop {
            if self.give_announced(inner).is_err() {
                return;
            }
            if inner.pending.is_empty()
                || !matches!(inner.arrived.front(), Some(Arrival::Eager { .. }))
            {
                return;
            }
            let Some(Arrival::Eager { bytes, data }) = inner.arrived.pop_front() else {
                return;
            };
            let (token, wr) = inner.pending.pop_front().expect("checked");
            let result = crate::srq::copy_into(&wr, &bytes);
            if result.is_err() {
                // A message longer than its receive: as on an RDMA NIC the
                // receive fails and the connection breaks.
                inner.broke = true;
                inner.break_pending = true;
            }
            self.fill_recv(inner, token, result, data, out);
        }
    }

    /// `match_arrivals` from outside a read of the receive CQ: completions
    /// into its queue (taken before the QP's lock), then the receipts due.
    fn match_waiting(&self) {
        self.recv_cq.deliver(|out| {
            let mut inner = self.inner.lock();
            if Self::receives_eagerly(&inner) && !inner.arrived.is_empty() {
                self.match_arrivals(&mut inner, out);
            }
        });
        self.send_receipt();
        if std::mem::take(&mut self.inner.lock().break_pending) {
            self.broken();
        }
    }

    /// Gives the provider the waiting receives of the large messages
    /// announced at the front of what arrived, in order, while it has room.
    fn give_announced(&self, inner: &mut Inner) -> Result<()> {
        while matches!(inner.arrived.front(), Some(Arrival::Large)) && !inner.pending.is_empty() {
            if !self.may_give_recv(inner) {
                return Err(Error::NoResource(Resource::WorkQueue));
            }
            let (token, wr) = inner.pending.pop_front().expect("checked");
            if let Err(e) = self.give_recv(inner, token, &wr) {
                inner.pending.push_front((token, wr));
                return Err(e);
            }
            inner.arrived.pop_front();
        }
        Ok(())
    }

    /// A message was posted (request `token`'s send): where the provider
    /// reports it sent once the peer's NIC has it, whether or not a receive
    /// of the peer took it (`OfiDevice::receipts`), its success waits for
    /// the peer's receipt of it.
    fn await_receipt(&self, dev: &OfiDevice, inner: &mut Inner, token: u32) {
        if !dev.receipts {
            return;
        }
        inner.messages += 1;
        let number = inner.messages;
        if let Some(slot) = inner.sends.get_mut(token) {
            slot.receipt = Some(number);
        }
        // The request CQ's reads look at our receipt words from now on.
        if !self.awaiting_receipts.swap(true, Ordering::AcqRel) {
            self.send_cq.await_receipts(&self.me);
        }
    }

    /// Receives completed (`done`, in order): the peer learns how many of its
    /// messages our receives took, each whole, so far (the first failed one
    /// ends the count: the connection breaks).
    fn give_receipts<'a>(&self, inner: &mut Inner, done: impl Iterator<Item = &'a WorkCompletion>) {
        if !self.rdm || inner.receipts_over {
            return;
        }
        let before = inner.received;
        for wc in done {
            if wc.status != WcStatus::Success {
                inner.receipts_over = true;
                break;
            }
            inner.received += 1;
        }
        if inner.received != before && self.dev.upgrade().is_some_and(|d| d.receipts) {
            self.receipt_due.store(true, Ordering::Release);
        }
    }

    /// Whether our receives took messages the peer has not been told of.
    pub(crate) fn receipt_due(&self) -> bool {
        self.receipt_due.load(Ordering::Acquire)
    }

    /// Tells the peer how many of its messages our receives took: one RDMA
    /// write of the count and its complement into the peer's receipt words
    /// (`farewell`), injected (no completion, nothing to wait for), on the
    /// fabric, so that the peer's next read of its request CQ finds it with
    /// no thread of ours in between (a socket frame read by a blocked thread
    /// cost a polling pair about 11 ms a round trip: docs/libfabric.md,
    /// Receipts). Called with no lock of the QP's CQs held. A busy provider
    /// leaves it due, for the progress thread to write (`retry_held`).
    pub(crate) fn send_receipt(&self) {
        if !self.receipt_due.swap(false, Ordering::AcqRel) {
            return;
        }
        let inner = self.inner.lock();
        let open = inner.state != QpState::Error && inner.dest != crate::rdm::FI_ADDR_UNSPEC;
        let (Some(ep), true, key) = (Self::ep_of(&inner), open, inner.peer.farewell_key) else {
            return;
        };
        if key == 0 {
            return;
        }
        let words = [inner.received, !inner.received];
        let at = inner
            .peer
            .farewell_address
            .wrapping_add(crate::farewell::RECEIPT_OFFSET);
        // SAFETY: an enabled endpoint and a peer in its AV; the 16 bytes are
        // copied before the call returns (an inject).
        let rc = unsafe {
            fi::fi_inject_write(
                ep,
                words.as_ptr().cast(),
                std::mem::size_of_val(&words),
                inner.dest,
                at,
                key,
            )
        };
        drop(inner);
        if rc == -(fi::FI_EAGAIN as isize) {
            self.receipt_due.store(true, Ordering::Release);
            if let Some(dev) = self.dev.upgrade() {
                dev.retry_later(self.num);
            }
        } else if rc < 0 {
            log::warn!("QP {}: receipt: {}", self.num, fi::strerror(rc as i32));
        }
    }

    /// Reads our receipt words: the sends the peer's receipt covers complete,
    /// in order, into `out` (the request CQ's queue, its lock held by the
    /// caller). Returns whether the connection is to break (as `completed`).
    /// Once nothing awaits a receipt, the request CQ stops looking
    /// (`awaits_receipts`).
    pub(crate) fn take_receipt(&self, out: &mut VecDeque<WorkCompletion>) -> bool {
        let mut inner = self.inner.lock();
        let count = self.farewell.receipt();
        if count > inner.sends.received {
            inner.sends.received = count;
            inner.sends.release(out);
            self.release_held(&mut inner, out);
        }
        if inner.sends.received >= inner.messages || inner.state == QpState::Error {
            self.awaiting_receipts.store(false, Ordering::Release);
        }
        let refused = std::mem::take(&mut inner.break_pending);
        refused && inner.state == QpState::Connected
    }

    /// Whether sends of ours wait for the peer's receipt.
    pub(crate) fn awaits_receipts(&self) -> bool {
        self.awaiting_receipts.load(Ordering::Acquire)
    }

    /// Reads the QP's CQs (what the provider completed before an event).
    pub(crate) fn reap_completions(&self) {
        self.send_cq.reap_and_notify();
        if !Arc::ptr_eq(&self.send_cq, &self.recv_cq) {
            self.recv_cq.reap_and_notify();
        }
    }

    pub(crate) fn set_peer_table(&self, peer: PeerTable) {
        let mut inner = self.inner.lock();
        inner.peer = peer;
        inner.starts.clear();
        inner.lookup = None;
    }

    /// Whether the peer's entry of an RDMA request's key refuses it: no such
    /// key, the range outside its memory, a right it lacks, or its memory in
    /// another protection domain than the peer QP's. The provider would drop
    /// the connection without saying why (or, across protection domains,
    /// which it does not have, allow it): the backend fails the request as
    /// the remote access error it is (`keys::Entry`).
    fn refused(&self, inner: &Inner, request: &Request) -> bool {
        let (va, rkey, right) = match request.kind {
            Kind::Write { va, rkey, .. } => (va, rkey, daplrs_backend::access::REMOTE_WRITE),
            Kind::Read { va, rkey } => (va, rkey, daplrs_backend::access::REMOTE_READ),
            Kind::Atomic { va, rkey, .. } => (va, rkey, daplrs_backend::access::REMOTE_ATOMIC),
            _ => return false,
        };
        let Some(found) = inner.starts.get(&rkey) else {
            // Not looked up: the provider addresses by virtual address and checks.
            return false;
        };
        let Some(r) = found else { return true };
        let inside = va >= r.start
            && va
                .checked_add(request.len)
                .is_some_and(|end| end <= r.start.saturating_add(r.length));
        let same_pd = inner.peer.pd == 0 || r.pd == inner.peer.pd;
        !inside || r.rights & right == 0 || !same_pd
    }

    /// What a receive's remote CQ data asks: the rkey of a window of ours
    /// invalidated (Some), and whether it named none of this QP's protection
    /// domain (the receive then fails).
    fn invalidation(&self, data: Option<u64>) -> (Option<u32>, bool) {
        let Some(dev) = self.dev.upgrade() else {
            return (None, false);
        };
        let flagged = |d: &u64| d & INVALIDATE != 0 || !dev.remote_data();
        let Some(rkey) = data.filter(flagged).map(|d| d as u32) else {
            return (None, false);
        };
        let done = dev.invalidate_window(rkey, self.pd);
        (done.then_some(rkey), !done)
    }

    /// Whether a request to `rkey` must wait for the peer's table entry.
    fn needs_lookup(&self, inner: &Inner, rkey: Option<u32>) -> bool {
        rkey.is_some_and(|k| !inner.starts.contains_key(&k))
    }

    /// The lookup in flight completed (`ok`: what the peer's entry says is
    /// cached, None where the peer has no such key) or failed.
    fn looked_up(&self, inner: &mut Inner, ok: bool) {
        let Some(rkey) = inner.lookup.take() else {
            return;
        };
        if ok {
            let remote = keys::remote_of(&self.lookup.lock().buf, rkey);
            inner.starts.insert(rkey, remote);
        }
    }

    /// Reads the peer's key table entry for `rkey` (one RDMA read, completed
    /// through the send CQ as LOOKUP_TOKEN), unless a lookup is in flight.
    fn start_lookup(&self, inner: &mut Inner, rkey: u32) -> Result<()> {
        if inner.lookup.is_some() {
            return Ok(());
        }
        let ep = Self::ep_of(inner).ok_or(Error::NotConnected)?;
        let dev = self.dev.upgrade().ok_or(Error::NoDevice)?;
        let mut lookup = self.lookup.lock();
        if lookup.mr.is_none() {
            lookup.mr = Some(register_lookup(&dev, &mut lookup.buf)?);
        }
        let mut desc = lookup.mr.as_ref().map_or(null_mut(), |m| {
            // SAFETY: the lookup buffer's registration.
            unsafe { fi::fi_mr_desc(m.ptr()) }
        });
        let iov = libc::iovec {
            iov_base: lookup.buf.as_mut_ptr().cast(),
            iov_len: ENTRY_BYTES,
        };
        let rma = fi::fi_rma_iov {
            addr: keys::KeyTable::remote_slot(inner.peer.address, rkey),
            len: ENTRY_BYTES,
            key: inner.peer.key,
        };
        let msg = fi::fi_msg_rma {
            msg_iov: (&iov as *const libc::iovec).cast(),
            desc: &mut desc,
            iov_count: 1,
            rma_iov: &rma,
            rma_iov_count: 1,
            context: self.context(LOOKUP_TOKEN),
            addr: inner.dest,
            ..Default::default()
        };
        // SAFETY: an enabled endpoint; the buffer is registered, and no other
        // lookup writes it until this one's completion (`inner.lookup`).
        let rc = unsafe { fi::fi_readmsg(ep, &msg, fi::FI_COMPLETION as u64) };
        crate::check(
            rc,
            "fi_readmsg (key lookup)",
            Error::NoResource(Resource::WorkQueue),
        )?;
        inner.lookup = Some(rkey);
        Ok(())
    }

    fn post_recv_now(&self, inner: &Inner, token: u32, wr: &RecvWr) -> Result<()> {
        let ep = Self::ep_of(inner).ok_or(Error::BadState)?;
        let dev = self.dev.upgrade().ok_or(Error::NoDevice)?;
        let (iov, mut desc) = io_vectors(&dev, &wr.sgl);
        let context = self.context(token | RECV_BIT);
        let flags = fi::FI_COMPLETION as u64;
        // SAFETY: an enabled endpoint; the vectors live for the call (the provider
        // copies the message description, not the buffers, which stay registered).
        let rc = unsafe {
            if self.rdm {
                // Over a port: this connection's messages only (their tag).
                let msg = fi::fi_msg_tagged {
                    msg_iov: or_null(&iov).cast(),
                    desc: or_null_mut(&mut desc),
                    iov_count: iov.len(),
                    addr: crate::rdm::FI_ADDR_UNSPEC,
                    // Fed from eager buffers, the provider holds a receive
                    // only for a large message announced.
                    tag: if Self::receives_eagerly(inner) {
                        inner.tag | LARGE
                    } else {
                        inner.tag
                    },
                    ignore: 0,
                    context,
                    data: 0,
                };
                fi::fi_trecvmsg(ep, &msg, flags)
            } else {
                let msg = fi::fi_msg {
                    msg_iov: or_null(&iov).cast(),
                    desc: or_null_mut(&mut desc),
                    iov_count: iov.len(),
                    context,
                    addr: crate::rdm::FI_ADDR_UNSPEC,
                    ..Default::default()
                };
                fi::fi_recvmsg(ep, &msg, flags)
            }
        };
        crate::check(rc, "fi_recvmsg", Error::NoResource(Resource::WorkQueue))?;
        inner.feeds.received();
        Ok(())
    }

    /// Posts `wr`. A fenced request waits (in `held`, its slot taken) until
    /// every earlier one completed, an RDMA request until the peer's entry of
    /// its key was read, and everything posted after either waits behind it.
    /// A bind issued at once completes here, into `out`.
    fn post_request(
        &self,
        inner: &mut Inner,
        wr: &SendWr,
        out: &mut VecDeque<WorkCompletion>,
    ) -> Result<()> {
        let dev = self.dev.upgrade().ok_or(Error::NoDevice)?;
        let kind = Kind::of(wr, &dev)?;
        if !self.send_room(inner) {
            return Err(Error::NoResource(Resource::WorkQueue));
        }
        let len: u64 = wr.sgl.iter().map(|s| s.length as u64).sum();
        let operands = match kind {
            Kind::Atomic { op, .. } => Some(Box::new(op.operands())),
            _ => None,
        };
        let token = inner.sends.push(Slot {
            wr_id: wr.wr_id,
            opcode: wr.op.opcode(),
            len: len as u32,
            done: None,
            closing_imm: None,
            operands,
            receipt: None,
        });
        let request = Request {
            token,
            kind,
            fence: wr.fence || self.unordered(&dev, inner),
            sgl: wr.sgl.to_vec(),
            len,
        };
        if self.needs_lookup(inner, request.kind.rkey()) {
            inner.held.push_back(request);
            self.release_held(inner, out);
            return Ok(());
        }
        if inner.broke
            || !inner.held.is_empty()
            || (request.fence && inner.sends.slots.len() > 1)
            || !self.provider_room(inner, &request.kind)
        {
            inner.held.push_back(request);
            return Ok(());
        }
        match self.issue(inner, &request) {
            Err(Error::NoResource(Resource::WorkQueue)) if dev.rdm => {
                // The provider is busy (ofi_rxm: its connection to the peer
                // is still being made): held, and tried again by the
                // progress thread, in order.
                inner.held.push_back(request);
                dev.retry_later(self.num);
                Ok(())
            }
            Err(e) => {
                // Not posted: the slot goes (it is the newest).
                inner.sends.slots.pop_back();
                Err(e)
            }
            Ok(done) => {
                self.complete_local(inner, &request, done, out);
                Ok(())
            }
        }
    }

    /// A request the backend executed itself (a bind) completes in order.
    fn complete_local(
        &self,
        inner: &mut Inner,
        request: &Request,
        done: Option<WcStatus>,
        out: &mut VecDeque<WorkCompletion>,
    ) {
        let Some(status) = done else { return };
        if status == WcStatus::RemoteAccess {
            self.fail_request(inner, request, status, out);
            return;
        }
        let new_rkey = match request.kind {
            Kind::Bind { new_rkey, .. } => new_rkey,
            _ => 0,
        };
        let num = self.num;
        inner.sends.mark(request.token, |s| WorkCompletion {
            new_rkey,
            ..WorkCompletion::new(s.wr_id, status, s.opcode, 0, num)
        });
        inner.sends.release(out);
        self.release_held(inner, out);
    }

    /// Whether the newest request must wait for every earlier one because the
    /// provider would not keep DAT's order (`OfiDevice::ordered`): all but a
    /// send following a send (send-after-send order every provider keeps).
    fn unordered(&self, dev: &OfiDevice, inner: &Inner) -> bool {
        let n = inner.sends.slots.len();
        if dev.ordered || n < 2 {
            return false;
        }
        let is_send = |i: usize| inner.sends.slots[i].opcode == WcOpcode::Send;
        !is_send(n - 1) || !is_send(n - 2)
    }

    /// Posts `wr` under the QP's lock; what completes at once goes to `out`.
    fn post_locked(&self, wr: &SendWr, out: &mut VecDeque<WorkCompletion>) -> Result<()> {
        let mut inner = self.inner.lock();
        match inner.state {
            QpState::Connected => self.post_request(&mut inner, wr, out),
            QpState::Error => {
                out.push_back(WorkCompletion::flushed(wr.wr_id, wr.op.opcode(), self.num));
                Ok(())
            }
            _ => Err(Error::NotConnected),
        }
    }

    /// Whether the provider has room for one more request (two places are
    /// kept for the backend's own reads and writes: a lookup, a farewell).
    fn provider_room(&self, inner: &Inner, kind: &Kind) -> bool {
        let need = match kind {
            Kind::Write { imm: Some(_), .. } => 2,
            _ => 1,
        };
        inner.sends_given + need <= self.depths.1.saturating_sub(2).max(need)
    }

    fn send_room(&self, inner: &Inner) -> bool {
        inner.sends.slots.len() < self.cap.max_send_wr.max(1) as usize
    }

    /// Posts the held requests whose turn came: a fenced one once nothing
    /// before it is outstanding. One the provider refuses completes in error.
    /// Nothing goes once a request broke the connection (a remote access
    /// error, ours or the provider's): what follows it is flushed when the
    /// connection breaks, never executed, as on an RDMA NIC.
    fn release_held(&self, inner: &mut Inner, out: &mut VecDeque<WorkCompletion>) {
        while let Some(front) = inner.held.front() {
            if inner.broke {
                return;
            }
            let first = front.token.wrapping_sub(inner.sends.base) & TOKEN_MASK == 0;
            if front.fence && !first {
                return;
            }
            let Some(dev) = self.dev.upgrade() else {
                return;
            };
            if self.needs_lookup(inner, front.kind.rkey()) {
                let rkey = front.kind.rkey().expect("an RDMA request");
                match self.start_lookup(inner, rkey) {
                    // Its completion calls this again.
                    Ok(()) => return,
                    Err(Error::NoResource(Resource::WorkQueue)) if dev.rdm => {
                        // Busy (see `post_request`): tried again soon.
                        dev.retry_later(self.num);
                        return;
                    }
                    Err(e) => {
                        // The request cannot learn where to go: it fails, the rest go on.
                        log::debug!("key lookup: {e:?}");
                        let request = inner.held.pop_front().expect("front checked");
                        self.fail_request(inner, &request, WcStatus::LocalQpOp, out);
                        continue;
                    }
                }
            }
            let local = matches!(front.kind, Kind::Bind { .. });
            if !local && !self.provider_room(inner, &front.kind) {
                // A completion makes room, and comes back here.
                return;
            }
            let request = inner.held.pop_front().expect("front checked");
            let done = match self.issue(inner, &request) {
                Err(Error::NoResource(Resource::WorkQueue)) if dev.rdm => {
                    // Busy (see `post_request`): it keeps its place.
                    inner.held.push_front(request);
                    dev.retry_later(self.num);
                    return;
                }
                Err(e) => {
                    log::debug!("a held request failed at post: {e:?}");
                    Some(WcStatus::LocalQpOp)
                }
                Ok(done) => done,
            };
            if let Some(status) = done {
                self.fail_request(inner, &request, status, out);
                if inner.break_pending {
                    // What follows is flushed when the connection breaks.
                    return;
                }
            }
        }
    }

    /// Posts the held requests again (the provider was busy: `retry_later`),
    /// and bounce buffers it refused.
    pub(crate) fn retry_held(&self) {
        self.send_cq.deliver(|out| {
            let mut inner = self.inner.lock();
            if inner.state == QpState::Connected {
                for (token, len, imm) in std::mem::take(&mut inner.unclosed) {
                    self.close_write_imm(&mut inner, token, len, imm);
                }
                inner.sends.release(out);
                self.release_held(&mut inner, out);
            }
            if matches!(inner.state, QpState::Connected | QpState::Connecting) {
                // Receives that waited for room in the port (or a busy provider).
                let _ = self.feed_recvs(&mut inner);
            }
            let open = matches!(inner.state, QpState::Connected | QpState::Connecting);
            if let (Some(srq), Some(dev), true) = (self.pooled_srq(), self.dev.upgrade(), open) {
                let _ = self.post_bounces(&dev, srq, &mut inner);
            }
        });
        self.match_waiting();
        self.send_receipt();
        if std::mem::take(&mut self.inner.lock().break_pending) {
            self.broken();
        }
    }

    /// Completes `request` now with `status` (in order: its slot is marked).
    fn fail_request(
        &self,
        inner: &mut Inner,
        request: &Request,
        status: WcStatus,
        out: &mut VecDeque<WorkCompletion>,
    ) {
        let num = self.num;
        inner.sends.mark(request.token, |s| {
            WorkCompletion::new(s.wr_id, status, s.opcode, 0, num)
        });
        inner.sends.release(out);
        if status == WcStatus::RemoteAccess {
            // As on an RDMA NIC, a remote access error breaks the connection.
            inner.broke = true;
            inner.break_pending = true;
        }
    }

    /// One request to the provider; a bind the backend executes now, giving
    /// its completion's status (None: the provider completes the request).
    fn issue(&self, inner: &mut Inner, request: &Request) -> Result<Option<WcStatus>> {
        let ep = Self::ep_of(inner).ok_or(Error::NotConnected)?;
        let refused = self.refused(inner, request);
        let known = request.kind.rkey().and_then(|k| inner.starts.get(&k));
        let fresh = self
            .dev
            .upgrade()
            .is_some_and(|d| d.fresh_lookup(known.copied().flatten().as_ref()));
        // The next request through this key reads its entry again (after
        // this one's address is taken from it: `remote_target`).
        let forget = request.kind.rkey().filter(|_| fresh);
        if let Some(rkey) = forget.filter(|_| refused || request.len == 0) {
            inner.starts.remove(&rkey);
        }
        if refused {
            return Ok(Some(WcStatus::RemoteAccess));
        }
        if let Kind::Bind {
            mw,
            mr,
            addr,
            length,
            access,
            new_rkey,
        } = &request.kind
        {
            let Some(mw) = mw.as_any().downcast_ref::<OfiMw>() else {
                return Ok(Some(WcStatus::MwBind));
            };
            return Ok(Some(mw.bind(
                mr.as_ref(),
                *addr,
                *length,
                *access,
                *new_rkey,
            )));
        }
        let dev = self.dev.upgrade().ok_or(Error::NoDevice)?;
        if dev.rdm
            && request.len == 0
            && matches!(
                request.kind,
                Kind::Read { .. } | Kind::Write { imm: None, .. }
            )
        {
            // Nothing to move (shm never completes an empty RMA): done, in order.
            return Ok(Some(WcStatus::Success));
        }
        let (iov, mut desc) = io_vectors(&dev, &request.sgl);
        // shm never completes a message of one empty segment; of none it does.
        let segments = if dev.rdm && request.len == 0 {
            0
        } else {
            iov.len()
        };
        let context = self.context(request.token);
        let flags = fi::FI_COMPLETION as u64;
        // Sends and writes complete once their data is placed at the target,
        // as on an RDMA NIC (not merely once it left).
        let placed = flags | fi::FI_DELIVERY_COMPLETE as u64;
        // SAFETY: an enabled endpoint; the message structs and vectors live for the call.
        let rc = unsafe {
            match request.kind {
                Kind::Send { data } => {
                    let with_data = data.map_or(0, |_| fi::FI_REMOTE_CQ_DATA as u64);
                    // An empty message has nothing to place (and shm never
                    // reports one delivered).
                    // Where the peer's receipt tells (`OfiDevice::receipts`),
                    // the provider's own word of delivery would cost a second
                    // answer from the peer.
                    let when = if segments == 0 || dev.receipts {
                        flags
                    } else {
                        placed
                    };
                    if self.rdm {
                        // Over a port: tagged with the peer connection's id
                        // (and how it lands: `eager`).
                        match self.message_tag(inner, request) {
                            Err(rc) => rc,
                            Ok(tag) => {
                                let msg = fi::fi_msg_tagged {
                                    msg_iov: or_null(&iov).cast(),
                                    desc: or_null_mut(&mut desc),
                                    iov_count: segments,
                                    addr: inner.dest,
                                    tag,
                                    ignore: 0,
                                    context,
                                    data: data.unwrap_or(0),
                                };
                                let rc = fi::fi_tsendmsg(ep, &msg, when | with_data);
                                if rc == 0 {
                                    inner.announced = None;
                                }
                                rc
                            }
                        }
                    } else {
                        let msg = fi::fi_msg {
                            msg_iov: or_null(&iov).cast(),
                            desc: or_null_mut(&mut desc),
                            iov_count: segments,
                            context,
                            addr: inner.dest,
                            data: data.unwrap_or(0),
                        };
                        fi::fi_sendmsg(ep, &msg, when | with_data)
                    }
                }
                Kind::Write { va, rkey, .. } | Kind::Read { va, rkey } => {
                    let (addr, key) = remote_target(&dev, inner, va, rkey);
                    let rma = fi::fi_rma_iov {
                        addr,
                        len: request.len as usize,
                        key,
                    };
                    let msg = fi::fi_msg_rma {
                        msg_iov: or_null(&iov).cast(),
                        desc: or_null_mut(&mut desc),
                        iov_count: iov.len(),
                        rma_iov: &rma,
                        rma_iov_count: 1,
                        context,
                        addr: inner.dest,
                        ..Default::default()
                    };
                    match request.kind {
                        Kind::Read { .. } => fi::fi_readmsg(ep, &msg, flags),
                        Kind::Write { imm: Some(_), .. } => {
                            let msg = fi::fi_msg_rma {
                                context: self.context(request.token | WRITE_PART),
                                ..msg
                            };
                            fi::fi_writemsg(ep, &msg, placed)
                        }
                        _ => fi::fi_writemsg(ep, &msg, placed),
                    }
                }
                Kind::Atomic { va, rkey, op } => {
                    let (addr, key) = remote_target(&dev, inner, va, rkey);
                    self.post_atomic(inner, request, addr, key, op, &iov, &mut desc)
                }
                Kind::Bind { .. } => unreachable!("executed above"),
            }
        };
        if let Some(rkey) = forget {
            inner.starts.remove(&rkey);
        }
        crate::check(rc, "post", Error::NoResource(Resource::WorkQueue))?;
        inner.sends_given += 1;
        if let Kind::Send { .. } = request.kind {
            self.await_receipt(&dev, inner, request.token);
        }
        if let Kind::Write { imm: Some(imm), .. } = request.kind {
            if dev.ordered {
                self.close_write_imm(inner, request.token, request.len, imm);
            } else if let Some(slot) = inner.sends.get_mut(request.token) {
                // The provider could deliver the send before the write's data
                // (shm has no FI_ORDER_SAW): it goes once the write completes
                // (delivered: FI_DELIVERY_COMPLETE).
                slot.closing_imm = Some(imm);
            }
        }
        Ok(None)
    }

    /// Posts an atomic on the peer's word at `addr` (as the provider addresses
    /// it) of `rkey`: `fi_fetch_atomicmsg` (FI_SUM) or `fi_compare_atomicmsg`
    /// (FI_CSWAP) on one FI_UINT64, its result into the request's segment
    /// (`iov`, `desc`: registered memory of the consumer's LMR). The operands
    /// are the slot's, alive until the request completes.
    #[allow(clippy::too_many_arguments)]
    fn post_atomic(
        &self,
        inner: &mut Inner,
        request: &Request,
        addr: u64,
        key: u64,
        op: AtomicOp,
        iov: &[libc::iovec],
        desc: &mut [*mut libc::c_void],
    ) -> isize {
        let Some(ep) = Self::ep_of(inner) else {
            return -(fi::FI_ENOTCONN as isize);
        };
        let dest = inner.dest;
        let Some(operands) = inner
            .sends
            .get_mut(request.token)
            .and_then(|s| s.operands.as_mut())
        else {
            return -(fi::FI_EINVAL as isize);
        };
        let [origin, compare] = &mut **operands;
        let word = |value: &mut u64| fi::fi_ioc {
            addr: (value as *mut u64).cast(),
            count: 1,
        };
        let (origin, compare) = (word(origin), word(compare));
        let mut result = fi::fi_ioc {
            addr: iov[0].iov_base,
            count: 1,
        };
        let target = fi::fi_rma_ioc {
            addr,
            count: 1,
            key,
        };
        let msg = fi::fi_msg_atomic {
            msg_iov: &origin,
            desc: null_mut(),
            iov_count: 1,
            addr: dest,
            rma_iov: &target,
            rma_iov_count: 1,
            datatype: fi::fi_datatype_FI_UINT64,
            op: match op {
                AtomicOp::FetchAdd { .. } => fi::fi_op_FI_SUM,
                AtomicOp::CmpSwap { .. } => fi::fi_op_FI_CSWAP,
            },
            context: self.context(request.token),
            data: 0,
        };
        let flags = fi::FI_COMPLETION as u64;
        // SAFETY: an enabled endpoint; the operands live in the request's
        // slot until it completes, the result buffer is the consumer's
        // registered segment, the structs live for the call.
        unsafe {
            match op {
                AtomicOp::FetchAdd { .. } => {
                    fi::fi_fetch_atomicmsg(ep, &msg, &mut result, desc.as_mut_ptr(), 1, flags)
                }
                AtomicOp::CmpSwap { .. } => fi::fi_compare_atomicmsg(
                    ep,
                    &msg,
                    &compare,
                    null_mut(),
                    1,
                    &mut result,
                    desc.as_mut_ptr(),
                    1,
                    flags,
                ),
            }
        }
    }

    /// The tag of send `request` to the peer connection: as is where the
    /// provider matches the peer's receives (`DIRECT`); else eager, or a
    /// large message's, announced first (once: a send refused for now is
    /// retried without a second announce). Err: the announce's refusal.
    fn message_tag(&self, inner: &mut Inner, request: &Request) -> std::result::Result<u64, isize> {
        let peer = inner.peer_tag;
        if peer & DIRECT != 0 {
            return Ok(peer);
        }
        if request.len as usize <= EAGER_MAX {
            return Ok(peer | EAGER);
        }
        if inner.announced != Some(request.token) {
            let ep = Self::ep_of(inner).ok_or(-(fi::FI_ENOTCONN as isize))?;
            // SAFETY: an enabled endpoint and a peer in its AV; no payload.
            let rc =
                unsafe { fi::fi_tinject(ep, null_mut(), 0, inner.dest, peer | EAGER | ANNOUNCE) };
            if rc != 0 {
                return Err(rc);
            }
            inner.announced = Some(request.token);
        }
        Ok(peer | LARGE)
    }

    /// The send that follows the write of an RDMA write with immediate data:
    /// no payload, the immediate data and the write's length in its remote CQ
    /// data; it consumes the target's receive, after the write's data (send
    /// after write order), and its completion is the request's. Should the
    /// provider refuse it, the request fails (its write is posted already).
    fn close_write_imm(&self, inner: &mut Inner, token: u32, len: u64, imm: u32) {
        let msg = fi::fi_msg {
            context: self.context(token),
            addr: inner.dest,
            data: WRITE_IMM | imm as u64 | (len << 34),
            ..Default::default()
        };
        let mut flags = (fi::FI_COMPLETION | fi::FI_REMOTE_CQ_DATA) as u64;
        if !self.rdm {
            // Over reliable datagrams the write was delivered before (or is
            // ordered before) this empty send, which shm never reports
            // delivered (see `issue`).
            flags |= fi::FI_DELIVERY_COMPLETE as u64;
        }
        let eager = inner.peer_tag & DIRECT == 0;
        let tagged = fi::fi_msg_tagged {
            addr: msg.addr,
            tag: inner.peer_tag | if eager { EAGER } else { 0 },
            context: msg.context,
            data: msg.data,
            ..Default::default()
        };
        let posted = Self::ep_of(inner).map_or(-(fi::FI_ENOTCONN as isize), |ep| {
            // SAFETY: an enabled endpoint; no buffers.
            unsafe {
                if self.rdm {
                    fi::fi_tsendmsg(ep, &tagged, flags)
                } else {
                    fi::fi_sendmsg(ep, &msg, flags)
                }
            }
        });
        let posted = crate::check(posted, "post (immediate data)", Error::Internal);
        if posted.is_ok() {
            inner.sends_given += 1;
            if let Some(dev) = self.dev.upgrade() {
                self.await_receipt(&dev, inner, token);
            }
        } else if self.rdm && posted == Err(Error::NoResource(Resource::WorkQueue)) {
            // Busy (see `post_request`): posted again soon, in order.
            inner.unclosed.push_back((token, len, imm));
            if let Some(dev) = self.dev.upgrade() {
                dev.retry_later(self.num);
            }
        } else {
            let num = self.num;
            inner.sends.mark(token, |s| {
                WorkCompletion::new(s.wr_id, WcStatus::LocalQpOp, s.opcode, 0, num)
            });
        }
    }
}

enum Kind {
    /// A send; `data`: its remote CQ data (a send with invalidate).
    Send {
        data: Option<u64>,
    },
    /// `imm`: an RDMA write with immediate data (a write, then a send).
    Write {
        va: u64,
        rkey: u32,
        imm: Option<u32>,
    },
    Read {
        va: u64,
        rkey: u32,
    },
    /// A 64-bit atomic on the peer's word at `va`; the word's previous value
    /// lands in the request's one 8-byte segment.
    Atomic {
        va: u64,
        rkey: u32,
        op: AtomicOp,
    },
    /// A memory window bind, executed by the backend (`OfiMw::bind`).
    Bind {
        mw: Arc<dyn MemoryWindow>,
        mr: Option<Arc<dyn MemoryRegion>>,
        addr: u64,
        length: u64,
        access: u32,
        new_rkey: u32,
    },
}

#[derive(Clone, Copy)]
enum AtomicOp {
    FetchAdd { add: u64 },
    CmpSwap { compare: u64, swap: u64 },
}

impl AtomicOp {
    /// The operands as the provider reads them: the origin value (what is
    /// added, or swapped in), then the compare value.
    fn operands(self) -> [u64; 2] {
        match self {
            AtomicOp::FetchAdd { add } => [add, 0],
            AtomicOp::CmpSwap { compare, swap } => [swap, compare],
        }
    }
}

impl Kind {
    /// An atomic, where the device has them (`OfiDevice::atomics`); its one
    /// segment receives the target word's previous value.
    fn atomic(wr: &SendWr, atomics: bool, va: u64, rkey: u32, op: AtomicOp) -> Result<Kind> {
        if !atomics {
            return Err(Error::Unsupported);
        }
        if wr.sgl.len() != 1 || wr.sgl[0].length != 8 {
            return Err(Error::TooLong);
        }
        Ok(Kind::Atomic { va, rkey, op })
    }

    /// What `wr` asks of `dev`'s provider (remote CQ data, atomics: refused
    /// where it has none).
    fn of(wr: &SendWr, dev: &OfiDevice) -> Result<Kind> {
        let (remote_data, atomics) = (dev.remote_data(), dev.atomics);
        Ok(match &wr.op {
            SendOp::Send => Kind::Send { data: None },
            SendOp::SendInv { rkey } => Kind::Send {
                data: Some(dev.invalidation_data(*rkey).ok_or(Error::Unsupported)?),
            },
            SendOp::RdmaWrite { remote_addr, rkey } => Kind::Write {
                va: *remote_addr,
                rkey: *rkey,
                imm: None,
            },
            SendOp::RdmaWriteImm {
                remote_addr,
                rkey,
                imm,
            } => {
                if !remote_data {
                    return Err(Error::Unsupported);
                }
                if wr.sgl.iter().map(|s| s.length as u64).sum::<u64>() > MAX_IMM_WRITE {
                    return Err(Error::TooLong);
                }
                Kind::Write {
                    va: *remote_addr,
                    rkey: *rkey,
                    imm: Some(*imm),
                }
            }
            SendOp::RdmaRead { remote_addr, rkey } => Kind::Read {
                va: *remote_addr,
                rkey: *rkey,
            },
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            } => Kind::atomic(
                wr,
                atomics,
                *remote_addr,
                *rkey,
                AtomicOp::FetchAdd { add: *add },
            )?,
            SendOp::CmpSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => Kind::atomic(
                wr,
                atomics,
                *remote_addr,
                *rkey,
                AtomicOp::CmpSwap {
                    compare: *compare,
                    swap: *swap,
                },
            )?,
            SendOp::BindMw {
                mw,
                mr,
                addr,
                length,
                access,
                new_rkey,
            } => Kind::Bind {
                mw: mw.clone(),
                mr: mr.clone(),
                addr: *addr,
                length: *length,
                access: *access,
                new_rkey: *new_rkey,
            },
        })
    }

    /// The remote key of an RDMA request.
    fn rkey(&self) -> Option<u32> {
        match self {
            Kind::Write { rkey, .. } | Kind::Read { rkey, .. } | Kind::Atomic { rkey, .. } => {
                Some(*rkey)
            }
            _ => None,
        }
    }
}

/// The address and key the provider wants for the peer's virtual address
/// `va` of context `rkey`: the offset from the start of its registration
/// where the provider addresses by offset, else `va` itself; the provider's
/// key of the registration, as the peer's entry names it (read before:
/// `needs_lookup`).
fn remote_target(dev: &OfiDevice, inner: &Inner, va: u64, rkey: u32) -> (u64, u64) {
    let found = inner.starts.get(&rkey).copied().flatten();
    let key = found.map_or(rkey as u64, |r| r.provider_key);
    if dev.virt_addr {
        return (va, key);
    }
    (va.wrapping_sub(found.map_or(NOT_AT_PEER, |r| r.start)), key)
}

/// A request on its way to the provider (kept while held behind a fence or
/// a key lookup).
struct Request {
    token: u32,
    kind: Kind,
    fence: bool,
    sgl: Vec<Sge>,
    len: u64,
}

/// Registers a lookup buffer for the QP's reads of peer key tables.
fn register_lookup(dev: &OfiDevice, buf: &mut [u8; ENTRY_BYTES]) -> Result<Fid<fi::fid_mr>> {
    // The buffer is the QP's, alive while the registration is.
    let key = dev.next_key.fetch_add(1, Ordering::Relaxed);
    crate::mem::register(
        dev,
        buf.as_mut_ptr() as u64,
        ENTRY_BYTES as u64,
        (fi::FI_READ | fi::FI_RECV) as u64,
        key,
        "fi_mr_regattr (lookup)",
    )
}

/// An empty message's vectors as null pointers, not an empty Vec's dangling
/// one: libfabric's verbs provider reads `desc[0]` even when `iov_count` is 0.
fn or_null<T>(v: &[T]) -> *const T {
    if v.is_empty() {
        std::ptr::null()
    } else {
        v.as_ptr()
    }
}

fn or_null_mut<T>(v: &mut [T]) -> *mut T {
    if v.is_empty() {
        null_mut()
    } else {
        v.as_mut_ptr()
    }
}

/// The iovec and descriptor arrays of a scatter-gather list. Descriptors
/// only where the provider wants them (FI_MR_LOCAL): otherwise the device's
/// tables are not locked on the posting path at all.
pub(crate) fn io_vectors(
    dev: &OfiDevice,
    sgl: &[Sge],
) -> (Vec<libc::iovec>, Vec<*mut libc::c_void>) {
    let iov = |s: &Sge| libc::iovec {
        iov_base: s.addr as *mut libc::c_void,
        iov_len: s.length as usize,
    };
    if !dev.local_descs {
        return sgl.iter().map(|s| (iov(s), null_mut())).unzip();
    }
    let tables = dev.tables.lock();
    sgl.iter()
        .map(|s| {
            let desc = tables.descs.get(&s.lkey).copied().unwrap_or(0) as *mut libc::c_void;
            (iov(s), desc)
        })
        .unzip()
}

impl QueuePair for OfiQp {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn qp_num(&self) -> u32 {
        self.num
    }

    fn state(&self) -> QpState {
        self.inner.lock().state
    }

    fn post_send(&self, wr: &SendWr) -> Result<()> {
        if wr.sgl.len() > self.cap.max_send_sge.max(1) as usize {
            return Err(Error::TooLong);
        }
        self.waiter.note_post();
        if self.state() == QpState::Connected && !self.send_room(&self.inner.lock()) {
            return Err(Error::NoResource(Resource::WorkQueue));
        }
        if matches!(
            wr.op,
            SendOp::BindMw { .. }
                | SendOp::RdmaWrite { .. }
                | SendOp::RdmaRead { .. }
                | SendOp::FetchAdd { .. }
                | SendOp::CmpSwap { .. }
        ) {
            // A bind, or a request whose key lookup fails, may complete right
            // here: the CQ's queue is taken before the QP's lock, as the reaper
            // does, so nothing the provider completes after it is queued before it.
            let posted = self.send_cq.deliver(|q| self.post_locked(wr, q));
            if std::mem::take(&mut self.inner.lock().break_pending) {
                self.broken();
            }
            return posted;
        }
        let mut out = VecDeque::new();
        let posted = self.post_locked(wr, &mut out);
        self.send_cq.push(out);
        posted
    }

    fn post_recv(&self, wr: RecvWr) -> Result<()> {
        if wr.sgl.len() > self.cap.max_recv_sge.max(1) as usize {
            return Err(Error::TooLong);
        }
        let mut inner = self.inner.lock();
        if inner.state != QpState::Init {
            // A receive of an EP not connected yet moves nothing: the
            // progress thread keeps its pace (many EPs readied before their
            // connections are made cost it no quick turns).
            self.waiter.note_post();
        }
        if inner.state == QpState::Error {
            drop(inner);
            self.recv_cq
                .push([WorkCompletion::flushed(wr.wr_id, WcOpcode::Recv, self.num)]);
            return Ok(());
        }
        if inner.recvs.slots.len() >= self.cap.max_recv_wr.max(1) as usize {
            return Err(Error::NoResource(Resource::WorkQueue));
        }
        let token = inner.recvs.push(Slot {
            wr_id: wr.wr_id,
            opcode: WcOpcode::Recv,
            len: 0,
            done: None,
            closing_imm: None,
            operands: None,
            receipt: None,
        });
        if Self::receives_eagerly(&inner) {
            // Fed from the port's eager buffers: it takes what arrived, if
            // anything did (with the receive CQ's queue, taken first).
            inner.pending.push_back((token, wr));
            let waiting = !inner.arrived.is_empty();
            drop(inner);
            if waiting {
                self.match_waiting();
            }
            return Ok(());
        }
        if Self::ep_of(&inner).is_none() || !inner.pending.is_empty() || !self.may_give_recv(&inner)
        {
            inner.pending.push_back((token, wr));
            return Ok(());
        }
        match self.give_recv(&mut inner, token, &wr) {
            Ok(()) => Ok(()),
            Err(Error::NoResource(Resource::WorkQueue)) if self.rdm => {
                // The port's provider is busy: posted by the progress thread.
                inner.pending.push_back((token, wr));
                Ok(())
            }
            Err(e) => {
                inner.recvs.slots.pop_back();
                Err(e)
            }
        }
    }

    fn reset(&self) -> Result<()> {
        let dev = self.dev.upgrade();
        let _closing = dev.as_ref().map(|d| d.closing.lock());
        let mut inner = self.inner.lock();
        if !matches!(inner.state, QpState::Error | QpState::Init) {
            return Err(Error::BadState);
        }
        close_endpoint(&self.dev, &mut inner, self.conn.load(Ordering::Acquire));
        self.end_link(false);
        inner.feeds = Feeds::default();
        inner.state = QpState::Init;
        inner.ended = false;
        inner.broke = false;
        inner.break_pending = false;
        // The endpoint that was reading a key table entry is closed.
        inner.lookup = None;
        Ok(())
    }

    fn posted_recvs(&self) -> u32 {
        self.inner.lock().recvs.slots.len() as u32
    }

    fn local_addr(&self) -> Option<SocketAddrV4> {
        self.inner.lock().local
    }

    fn remote_addr(&self) -> Option<SocketAddrV4> {
        self.inner.lock().remote
    }

    fn destroy(&self) {
        self.destroy_now();
    }
}

/// Whether a peer's fabric address, as its handshake carried it, has the
/// shape of `own` (one of our endpoints' names on the same provider):
/// `fi_av_insert` reads as many bytes as the provider's addresses have, or a
/// string format up to its NUL, and trusts them, so a short name from a
/// broken or hostile peer would be read past its end.
fn peer_name_fits(own: &[u8], string_format: bool, name: &[u8]) -> bool {
    if string_format {
        name.contains(&0)
    } else {
        name.len() == own.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(ring: &mut Ring, wr_id: u64) -> u32 {
        ring.push(Slot {
            wr_id,
            opcode: WcOpcode::Send,
            len: 8,
            done: None,
            closing_imm: None,
            operands: None,
            receipt: None,
        })
    }

    fn sent(ring: &mut Ring, token: u32, receipt: u64) {
        ring.get_mut(token).expect("a slot").receipt = Some(receipt);
        ring.mark(token, |s| {
            WorkCompletion::new(s.wr_id, WcStatus::Success, s.opcode, s.len, 1)
        });
    }

    #[test]
    fn a_send_waits_for_its_receipt_and_is_flushed_without_it() {
        let mut ring = Ring::default();
        let (a, b, c) = (send(&mut ring, 1), send(&mut ring, 2), send(&mut ring, 3));
        sent(&mut ring, a, 1);
        sent(&mut ring, b, 2);
        // A failure needs no receipt, but waits for the sends before it.
        ring.mark(c, |s| {
            WorkCompletion::new(s.wr_id, WcStatus::RemoteOp, s.opcode, 0, 1)
        });
        let mut out = VecDeque::new();
        ring.release(&mut out);
        assert!(out.is_empty(), "nothing before the peer's receipt");
        ring.received = 1;
        ring.release(&mut out);
        assert_eq!(out.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1]);
        // The connection ends: the second send reached no receive.
        let rest = ring.flush(1);
        let statuses: Vec<_> = rest.iter().map(|w| (w.wr_id, w.status)).collect();
        assert_eq!(statuses, [(2, WcStatus::Flushed), (3, WcStatus::RemoteOp)]);
    }

    #[test]
    fn a_peer_name_must_have_the_shape_of_ours() {
        let own = [7u8; 16];
        assert!(peer_name_fits(&own, false, &[1u8; 16]));
        assert!(!peer_name_fits(&own, false, &[1u8; 3]));
        assert!(!peer_name_fits(&own, false, &[1u8; 17]));
        assert!(!peer_name_fits(&own, false, &[]));
        assert!(peer_name_fits(b"fi_shm://1\0", true, b"fi_shm://22\0"));
        assert!(!peer_name_fits(b"fi_shm://1\0", true, b"no terminator"));
    }
}
