//! Queue pairs: over connected endpoints (FI_EP_MSG) one libfabric endpoint
//! each, opened when the connection is made (a passive side's endpoint must
//! come from the connection request); over reliable datagrams a port shared
//! with the other QPs of its EVD set (`port`), from the connection on.
//!
//! libfabric does not promise completions in posting order; DAT reports an
//! EP's requests in that order. Each request and receive takes the next slot
//! of its ring; a completion marks its slot, and completions leave the ring
//! only from the oldest slot on (`Ring::release`).
//!
//! This file holds the object, its state and how it ends; its jobs are
//! beside it: `connect` (its endpoint opened and closed), `post` (requests),
//! `recv` (receives and receipts), `complete` (a provider completion handed
//! to it), `queue_pair` (the backend trait). The `Registry` is where its
//! device finds it; what reads its CQs (`reap`) and its connection
//! management (`cm`, `rdm`) stand above it.

mod complete;
mod connect;
mod inline;
mod post;
mod queue_pair;
mod recv;

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddrV4;
use std::ptr::null_mut;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use daplrs_backend::{
    Error, MemoryRegion, MemoryWindow, QpCap, QpInit, QpState, QueuePair, RecvWr, Resource, Result,
    SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion, WrContext,
};
use ofi_sys as fi;
use parking_lot::Mutex;

use crate::bounce::Landed;
use crate::cq::{Done, OfiCq};
use crate::domain::Domain;
use crate::eager::{Arrival, Landing, ANNOUNCE, EAGER, EAGER_MAX, LARGE};
use crate::keymap::PeerKeys;
use crate::keys::PeerTable;
use crate::keys::{self, ENTRY_BYTES};
use crate::mem::io_vectors;
use crate::mem::OfiMw;
use crate::port::{Port, PortKey, Ports};
use crate::ready::Seat;
use crate::srq::OfiSrq;
use crate::wait::Waiter;
use crate::{opened, FI_ADDR_UNSPEC};
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
/// CQ data can only be an invalidation (`invalidation_data`).
pub(crate) const INVALIDATE: u64 = 1 << 32;
/// The remote CQ data of the send closing an RDMA write with immediate data
/// (libfabric's tcp consumes no receive for a write's own CQ data, DAT does):
/// this bit, the immediate data (low 32 bits) and the write's length (from
/// bit 34: at most MAX_IMM_WRITE bytes).
const WRITE_IMM: u64 = 1 << 33;
const MAX_IMM_WRITE: u64 = (1 << 30) - 1;
/// Where the provider carries 4 bytes of remote CQ data (verbs;ofi_rxm),
/// the closing send over reliable datagrams carries the immediate data
/// alone, and its tag says what it is: this bit, and the write's length in
/// `IMM_LEN_LOW` (its low 8 bits) and `IMM_LEN_HIGH` (the next 19), the tag
/// bits the connection's number, `DIRECT` and the eager bits leave free. A
/// receive ignores those bits, and the completion's data is read as the 8
/// bytes' form (`remote_data`), so the rest of the path is the same.
const IMM_CLOSE: u64 = 1 << 60;
const IMM_LEN_LOW: u64 = 0xff << 32;
const IMM_LEN_HIGH: u64 = ((1 << 19) - 1) << 41;
/// The tag bits a receive ignores (see `IMM_CLOSE`).
pub(crate) const IMM_FIELDS: u64 = IMM_CLOSE | IMM_LEN_LOW | IMM_LEN_HIGH;
/// The longest write with immediate data whose length its tag carries.
const MAX_IMM_WRITE_TAGGED: u64 = (1 << 27) - 1;

/// The tag bits of the closing send of a write of `len` bytes (at most
/// `MAX_IMM_WRITE_TAGGED`) with immediate data, over 4 bytes of CQ data.
fn imm_close_tag(len: u64) -> u64 {
    IMM_CLOSE | ((len & 0xff) << 32) | (((len >> 8) << 41) & IMM_LEN_HIGH)
}

/// A received message's remote CQ data in its 8 bytes' form: a closing send
/// whose tag carries the write's length (`IMM_CLOSE`) reads as one whose
/// data carries it (`WRITE_IMM`); any other as it came.
pub(crate) fn remote_data(tag: u64, data: u64) -> u64 {
    if tag & IMM_CLOSE == 0 {
        return data;
    }
    let len = ((tag & IMM_LEN_LOW) >> 32) | (((tag & IMM_LEN_HIGH) >> 41) << 8);
    WRITE_IMM | u64::from(data as u32) | (len << 34)
}
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

/// What a device's QPs are found by: their numbers, their connections'
/// (what their requests' contexts name) and their connected endpoints' (for
/// connection events); the ports they share; and the connections a
/// consumer's poll found broken, for the progress thread to break. The
/// device keeps it, each QP and CQ shares it.
pub(crate) struct Registry {
    tables: Mutex<Tables>,
    /// Reliable datagrams: the endpoints QPs share (`port`).
    pub(crate) ports: Arc<Ports>,
    /// Connections that broke under a consumer's poll, for the progress
    /// thread to break (a `cq::Reader` read for the consumer).
    deferred: Mutex<Vec<Arc<OfiQp>>>,
    /// The progress thread's, woken for what it is left.
    waiter: Arc<Waiter>,
}

#[derive(Default)]
struct Tables {
    qps: HashMap<u32, Weak<OfiQp>>,
    /// A connection's number (what its requests' contexts name) -> its QP.
    conns: HashMap<u32, Weak<OfiQp>>,
    /// An endpoint's `fid_ep` address -> its QP, for connection events.
    eps: HashMap<usize, u32>,
}

impl Registry {
    pub(crate) fn new(waiter: Arc<Waiter>) -> Arc<Registry> {
        Arc::new(Registry {
            tables: Mutex::new(Tables::default()),
            ports: Arc::new(Ports::new(waiter.clone())),
            deferred: Mutex::new(Vec::new()),
            waiter,
        })
    }

    pub(crate) fn insert(&self, qp: &Arc<OfiQp>) {
        self.tables.lock().qps.insert(qp.num(), Arc::downgrade(qp));
    }

    pub(crate) fn qp(&self, qp_num: u32) -> Option<Arc<OfiQp>> {
        self.tables.lock().qps.get(&qp_num).and_then(Weak::upgrade)
    }

    /// Every QP of the device still open.
    pub(crate) fn all(&self) -> Vec<Arc<OfiQp>> {
        let t = self.tables.lock();
        t.qps.values().filter_map(Weak::upgrade).collect()
    }

    /// The QP of connection number `conn`, while it has it.
    pub(crate) fn conn(&self, conn: u32) -> Option<Arc<OfiQp>> {
        self.tables.lock().conns.get(&conn).and_then(Weak::upgrade)
    }

    fn bind_conn(&self, conn: u32, qp: Weak<OfiQp>) {
        self.tables.lock().conns.insert(conn, qp);
    }

    fn unbind_conn(&self, conn: u32) {
        self.tables.lock().conns.remove(&conn);
    }

    fn bind_ep(&self, ep: usize, qp_num: u32) {
        self.tables.lock().eps.insert(ep, qp_num);
    }

    fn unbind_ep(&self, ep: usize) {
        self.tables.lock().eps.remove(&ep);
    }

    /// The QP whose connected endpoint is `fid` (a connection event's).
    pub(crate) fn qp_of(&self, fid: *mut fi::fid) -> Option<Arc<OfiQp>> {
        let t = self.tables.lock();
        let num = *t.eps.get(&(fid as usize))?;
        t.qps.get(&num).and_then(Weak::upgrade)
    }

    /// An eager buffer's completion (`port::POOL_CONN`): the port, the QP of
    /// the connection its tag names, and what landed for it.
    pub(crate) fn pool_landed(&self, done: &Done) -> Option<(Arc<Port>, Arc<OfiQp>, Landing)> {
        let token = done.context as u32;
        let port = self.ports.by_token(token)?;
        let qp = self.conn(crate::eager::conn_of(done.tag));
        // The buffer goes back to the provider whoever it was for.
        let arrival = port.landed((token & 0xff) as usize, done)?;
        Some((port, qp?, arrival))
    }

    /// Has the progress thread break these connections (see `deferred`).
    pub(crate) fn defer_broken(&self, qps: Vec<Arc<OfiQp>>) {
        self.deferred.lock().extend(qps);
        self.waiter.wake();
    }

    /// The connections `defer_broken` left (the progress thread's).
    pub(crate) fn take_deferred(&self) -> Vec<Arc<OfiQp>> {
        std::mem::take(&mut *self.deferred.lock())
    }
}

struct Slot {
    wr_id: u64,
    /// The consumer's record of a request (`SendWr::ctx`), given back with its completion
    /// whatever made it (`Ring::mark`, `Ring::flush`).
    ctx: WrContext,
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
    /// the connection (see `Domain::receipts`).
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
            slot.done = Some(wc(slot).with_ctx(slot.ctx));
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
                    _ => WorkCompletion::flushed(s.wr_id, s.opcode, qp_num).with_ctx(s.ctx),
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
    /// A read the provider moves in segments, one at a time per peer (shm:
    /// `Domain::segmented_read`), is out: its token. The requests after it wait.
    segmented: Option<u32>,
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
    /// The peer's table mapped (on this host, shm): each request's entry is
    /// read there, now, instead of through the provider (`needs_lookup`).
    peer_keys: Option<Arc<PeerKeys>>,
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
    /// our receipts say), where the device has receipts (`Domain::receipts`).
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
    dev: Weak<Domain>,
    /// Where the device finds its QPs (this one's connection and endpoint).
    registry: Weak<Registry>,
    /// The device's progress thread's, told of each post (`Waiter::note_post`).
    waiter: Arc<Waiter>,
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
    link: Mutex<Option<crate::wire::Link>>,
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
        close_endpoint(&self.dev, &self.registry, self.inner.get_mut(), conn);
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
/// `port::Keeper`). Completions of the connection that come after are dropped.
fn close_endpoint(dev: &Weak<Domain>, registry: &Weak<Registry>, inner: &mut Inner, conn: u32) {
    let dev = dev.upgrade();
    let registry = dev.as_ref().and(registry.upgrade());
    if let Some(r) = &registry {
        r.unbind_conn(conn);
    }
    inner.dest = FI_ADDR_UNSPEC;
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
    if let Some(r) = &registry {
        r.unbind_ep(ep.ptr() as usize);
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

pub(crate) fn ofi_cq(cq: &Arc<dyn daplrs_backend::CompletionQueue>) -> Result<Arc<OfiCq>> {
    ours(cq, cq.as_any())
}
impl OfiQp {
    pub(crate) fn new(dev: &Domain, registry: &Arc<Registry>, init: QpInit) -> Result<Arc<OfiQp>> {
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
            registry: Arc::downgrade(registry),
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
                segmented: None,
                local: None,
                remote: None,
                ended: false,
                broke: false,
                break_pending: false,
                peer: PeerTable::default(),
                starts: std::collections::HashMap::new(),
                peer_keys: None,
                lookup: None,
                held: VecDeque::new(),
                unclosed: VecDeque::new(),
                feeds: Feeds::default(),
                bounces: Default::default(),
                dest: FI_ADDR_UNSPEC,
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

    /// The peer on this host died holding its sign of life (`keymap`): nothing more of
    /// ours goes to the provider for it (shm would spin forever on the lock the peer left
    /// held); what waits is flushed when the connection's end is read (`rdm::on_end`).
    fn peer_gone(inner: &Inner) -> bool {
        inner.peer_keys.as_ref().is_some_and(|p| p.gone())
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

    /// Whether the connection's end is a disconnection: ours, or the peer's
    /// (its farewell arrived); otherwise it broke.
    pub(crate) fn ended_gracefully(&self) -> bool {
        self.leaving.load(Ordering::Acquire) || self.farewell.received()
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

    /// The peer's table as its handshake announced it; `mapped`: the table
    /// itself, where this host lets us map it (`keymap`).
    pub(crate) fn set_peer_table(&self, peer: PeerTable, mapped: Option<Arc<PeerKeys>>) {
        let mut inner = self.inner.lock();
        inner.peer = peer;
        inner.peer_keys = mapped;
        inner.starts.clear();
        inner.lookup = None;
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

/// A request on its way to the provider (kept while held behind a fence or
/// a key lookup).
struct Request {
    token: u32,
    kind: Kind,
    fence: bool,
    sgl: Vec<Sge>,
    len: u64,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A closing send's tag carries every length up to its bound, clear of
    /// the connection's number, `DIRECT` and the eager bits, and reads back
    /// as the 8 bytes' form; any other data reads as it came.
    #[test]
    fn a_write_length_rides_in_the_closing_sends_tag() {
        let conn = 0xdead_beef_u64 | DIRECT;
        for len in [0, 1, 255, 256, 4096, 1 << 20, MAX_IMM_WRITE_TAGGED] {
            let tag = imm_close_tag(len);
            assert_eq!(tag & !IMM_FIELDS, 0, "{len}");
            assert_eq!(tag & (conn | eager_bits()), 0, "{len}");
            let data = remote_data(conn | tag, 0x1234_5678);
            assert_eq!(data, WRITE_IMM | 0x1234_5678 | (len << 34), "{len}");
        }
        assert_eq!(remote_data(conn, INVALIDATE | 7), INVALIDATE | 7);
        assert_eq!(remote_data(conn, 7), 7);
    }

    fn eager_bits() -> u64 {
        crate::eager::EAGER | crate::eager::ANNOUNCE | crate::eager::LARGE
    }

    fn send(ring: &mut Ring, wr_id: u64) -> u32 {
        ring.push(Slot {
            wr_id,
            ctx: WrContext::NONE,
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
}
