//! Ports: reliable-datagram endpoints shared by the QPs of an EVD set
//! (docs/libfabric.md, "Many connections over reliable datagrams").
//!
//! A QP of an RDM device sends and receives through a port: one per (request
//! CQ, receive CQ, side), the side being whether the QP connected or
//! accepted, so that the two ends of a connection inside one process are
//! never the same endpoint. Peers are entries of the port's AV, counted by
//! the QPs that use them; messages are tagged with the receiving
//! connection's id, so each QP's receives match its own connection's
//! messages only. A QP of an SRQ of ours keeps a port of its own (its bounce
//! buffers are the QP's).
//!
//! The provider's receive depth is the port's: each QP may always have one
//! receive with the provider (so a message to it always finds one, whatever
//! the others hold), and receives beyond that take the port's spare slots.
//! A shared port keeps eager buffers of its own posted (`eager`): its QPs'
//! short messages land there, and the provider holds a QP's receive only
//! for a large message announced.

use std::collections::{HashMap, VecDeque};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};

use daplrs_backend::{Error, Resource, Result};
use ofi_sys as fi;
use parking_lot::Mutex;

use crate::cq::{Done, OfiCq};
use crate::domain::Domain;
use crate::eager::{EagerPool, Landing};
use crate::wait::Waiter;
use crate::{opened, Fid};

/// The connection number of an eager buffer's context (`next_conn` never
/// gives it): its token is the port's id (above 8 bits) and the slot.
pub(crate) const POOL_CONN: u32 = 0;

/// Distinct peer names a shared port's AV takes before it retires (takes no
/// new QP, and closes once its last QP left), on a provider whose AV holds
/// 256 peers (shm, 1.17's SMR_MAX_PEERS; it reuses a removed entry's slot
/// only after 256 inserts, and then its state of the old peer, left behind
/// by `fi_av_remove`, would mislead it). `PEERS_MAX` bounds what the QPs
/// attached may bring: their names inserted, and one each for those whose
/// peer is not known yet (connects under way).
const NAMES_MAX: usize = 128;
const PEERS_MAX: usize = 256;
/// The same on other providers (ofi_rxm's AV grows as needed): only a
/// bound on the entries left by peers gone.
const NAMES_MAX_GROWING: usize = 1 << 16;

/// Which QPs share a port.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum PortKey {
    /// The QPs of one EVD set and side (`passive`: they accepted).
    Shared {
        send_cq: u64,
        recv_cq: u64,
        passive: bool,
    },
    /// One QP's alone (an SRQ of ours: its bounce buffers).
    Own { qp: u32 },
}

/// A peer endpoint in the port's AV, and how many QPs of the port use it.
struct Peer {
    addr: u64,
    users: usize,
}

#[derive(Default)]
struct State {
    peers: HashMap<Vec<u8>, Peer>,
    /// Distinct names inserted so far (removed ones included).
    names: usize,
    /// QPs attached whose peer is not inserted yet (each may add a name).
    unresolved: usize,
    qps: usize,
    /// Takes no new QP (its AV took `names_max` names).
    retired: bool,
    /// Receive slots of the provider held beyond each QP's first.
    spare_used: usize,
    /// QPs (by number) whose receives wait for a spare slot, oldest first.
    waiting: VecDeque<u32>,
}

pub(crate) struct Port {
    key: PortKey,
    dev: Weak<Domain>,
    /// The device's ports (this one's id there, the eager buffers to post again).
    ports: Weak<Ports>,
    /// The endpoint, then its AV: closed in that order (`Drop`).
    ep: Option<Fid<fi::fid_ep>>,
    av: Option<Fid<fi::fid_av>>,
    /// The endpoint's fabric address (`fi_getname`), what peers insert.
    name: Vec<u8>,
    /// The provider's receive depth: the receives all QPs of the port may
    /// give it at once.
    rx_depth: usize,
    state: Mutex<State>,
    /// Kept open while the endpoint is bound to them (a parked endpoint too).
    cqs: Vec<Arc<OfiCq>>,
    /// Bounce buffers of the port's one SRQ QP, freed after the endpoint.
    bounces: Mutex<crate::bounce::Bounces>,
    /// A shared port's eager buffers (`eager`), freed after the endpoint;
    /// `id` names the port in their contexts.
    pool: Mutex<Option<EagerPool>>,
    id: u32,
    /// The AV's bounds (NAMES_MAX and PEERS_MAX where it holds 256 peers).
    names_max: usize,
    peers_max: usize,
}

/// The room for an endpoint's fabric name (libfabric's FI_NAME_MAX is 64).
pub(crate) const NAME_BYTES: usize = 256;

impl Port {
    /// Opens a port: an endpoint of the device's fi_info, its AV, bound to
    /// the CQs and enabled.
    fn open(
        dev: &Domain,
        ports: &Arc<Ports>,
        key: PortKey,
        send_cq: &Arc<OfiCq>,
        recv_cq: &Arc<OfiCq>,
    ) -> Result<Port> {
        let mut ep = null_mut();
        // SAFETY: an open domain and its provider's fi_info; `ep` receives the endpoint.
        let rc = unsafe { fi::fi_endpoint(dev.domain.ptr(), dev.info.ptr(), &mut ep, null_mut()) };
        opened(rc, "fi_endpoint", Error::NoResource(Resource::Qp))?;
        let ep = Fid(ep);
        // Providers naming endpoints by string (shm) hold 256 peers an AV.
        let (names_max, peers_max) = if dev.parks {
            (NAMES_MAX, PEERS_MAX)
        } else {
            (NAMES_MAX_GROWING, usize::MAX)
        };
        let peers = match key {
            PortKey::Shared { .. } => NAMES_MAX,
            PortKey::Own { .. } => 1,
        };
        let av = open_av(dev, peers)?;
        let bind = |fid: *mut fi::fid, flags: u64, what: &str| {
            // SAFETY: the endpoint just opened; `fid` an open object of its domain.
            opened(
                unsafe { fi::fi_ep_bind(ep.ptr(), fid, flags) },
                what,
                Error::Internal,
            )
        };
        bind(av.fid(), 0, "bind AV")?;
        let same = Arc::ptr_eq(send_cq, recv_cq);
        let tx = fi::FI_TRANSMIT as u64 | if same { fi::FI_RECV as u64 } else { 0 };
        bind(send_cq.cq.fid(), tx, "bind CQ")?;
        if !same {
            bind(recv_cq.cq.fid(), fi::FI_RECV as u64, "bind CQ")?;
        }
        // SAFETY: the endpoint, bound to its AV and CQs.
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
        let mut name = vec![0u8; NAME_BYTES];
        let mut len = name.len();
        // SAFETY: an enabled endpoint; `name` has `len` writable bytes.
        let rc = unsafe { fi::fi_getname(ep.ptr(), name.as_mut_ptr().cast(), &mut len) };
        opened(rc, "fi_getname", Error::Internal)?;
        name.truncate(len);
        Ok(Port {
            key,
            dev: dev.me.clone(),
            ports: Arc::downgrade(ports),
            ep: Some(ep),
            av: Some(av),
            name,
            rx_depth: dev.queue_depths().0,
            state: Mutex::new(State::default()),
            cqs: vec![send_cq.clone(), recv_cq.clone()],
            bounces: Mutex::new(Default::default()),
            pool: Mutex::new(None),
            id: 0,
            names_max,
            peers_max,
        })
    }

    /// Gives a shared port of a device with eager buffers its buffers, posted.
    fn open_pool(self: &Arc<Self>, dev: &Domain, ports: &Ports) -> Result<()> {
        let pool = EagerPool::new(dev)?;
        *self.pool.lock() = Some(pool);
        ports.by_id.lock().insert(self.id, Arc::downgrade(self));
        self.repost();
        Ok(())
    }

    /// The context of eager buffer `slot`.
    fn pool_context(&self, slot: usize) -> *mut libc::c_void {
        let token = (self.id << 8) | slot as u32;
        (((POOL_CONN as u64) << 32) | token as u64) as *mut libc::c_void
    }

    /// Posts the eager buffers not posted; a busy provider leaves them for
    /// the progress thread (`Ports::retry`).
    pub(crate) fn repost(self: &Arc<Self>) {
        let all = match self.pool.lock().as_mut() {
            Some(pool) => pool.post_all(self.ep(), |slot| self.pool_context(slot)),
            None => true,
        };
        if !all {
            self.retry();
        }
    }

    /// Eager buffer `slot` completed: what landed (see `EagerPool::landed`);
    /// the buffer is posted again (by the progress thread if the provider
    /// refuses it now).
    pub(crate) fn landed(self: &Arc<Self>, slot: usize, done: &Done) -> Option<Landing> {
        let mut pool = self.pool.lock();
        let pool = pool.as_mut()?;
        let landed = pool.landed(slot, done);
        if !pool.post(self.ep(), slot, self.pool_context(slot)) {
            self.retry();
        }
        landed
    }

    /// The progress thread posts the eager buffers at its next turn.
    fn retry(self: &Arc<Self>) {
        if let (Some(_), Some(ports)) = (self.dev.upgrade(), self.ports.upgrade()) {
            ports.retry(self);
        }
    }

    pub(crate) fn ep(&self) -> *mut fi::fid_ep {
        self.ep.as_ref().map_or(null_mut(), Fid::ptr)
    }

    pub(crate) fn name(&self) -> &[u8] {
        &self.name
    }

    /// Whether the port takes one more QP: not retired, a name left for its
    /// peer, and a receive slot of its own (beside the spares in use).
    fn admits(&self, st: &mut State) -> bool {
        if st.retired {
            return false;
        }
        if matches!(self.key, PortKey::Own { .. }) {
            return st.qps == 0;
        }
        if st.names >= self.names_max {
            st.retired = true;
            return false;
        }
        if st.names + st.unresolved >= self.peers_max {
            // Full for now: connects under way may bring new names.
            return false;
        }
        st.qps + 1 + st.spare_used + self.pool_len() <= self.rx_depth
    }

    /// The provider's receive slots the eager buffers take.
    fn pool_len(&self) -> usize {
        if self.id == 0 {
            0
        } else {
            crate::eager::BUFFERS
        }
    }

    /// Inserts `name` (a peer's fabric address, its shape checked by the
    /// caller) into the AV, or counts one more user of it; returns its
    /// fi_addr. `parks`: names of this process are told to the keeper.
    pub(crate) fn insert(&self, name: &[u8], parks: bool) -> Result<u64> {
        let mut st = self.state.lock();
        if let Some(peer) = st.peers.get_mut(name) {
            peer.users += 1;
            let addr = peer.addr;
            st.unresolved = st.unresolved.saturating_sub(1);
            return Ok(addr);
        }
        // Handed over zero-padded to the size of our own names' buffer: a
        // provider that reads a fixed length, whatever a string's end, reads
        // nothing of the peer's beyond it.
        let mut padded = [0u8; NAME_BYTES];
        padded
            .get_mut(..name.len())
            .ok_or(Error::NoResource(Resource::Qp))?
            .copy_from_slice(name);
        let av = self.av.as_ref().ok_or(Error::BadState)?.ptr();
        let mut addr = crate::FI_ADDR_UNSPEC;
        // SAFETY: an open AV; `padded` holds a name of this provider's
        // shape (checked by the caller), `addr` receives one fi_addr_t.
        let rc =
            unsafe { fi::fi_av_insert(av, padded.as_ptr().cast(), 1, &mut addr, 0, null_mut()) };
        if rc != 1 {
            log::warn!("fi_av_insert: {}", fi::strerror(rc.min(0)));
            return Err(Error::NoResource(Resource::Qp));
        }
        st.names += 1;
        st.unresolved = st.unresolved.saturating_sub(1);
        st.peers.insert(name.to_vec(), Peer { addr, users: 1 });
        if parks {
            keeper().named(name);
        }
        Ok(addr)
    }

    /// A QP leaves the port: its peer (`peer`: the name it inserted, if it
    /// did) has one user less; an entry naming an endpoint of this process
    /// goes when it has none (so that endpoint may close: `Keeper`).
    /// `given`: the receives it had with the provider (cancelled by the
    /// caller). Returns QPs to wake (spare slots freed).
    pub(crate) fn leave(&self, peer: Option<&[u8]>, given: usize, parks: bool) -> Vec<u32> {
        let mut st = self.state.lock();
        st.qps = st.qps.saturating_sub(1);
        st.spare_used = st.spare_used.saturating_sub(given.saturating_sub(1));
        let mut released = None;
        match peer {
            None => st.unresolved = st.unresolved.saturating_sub(1),
            Some(name) => {
                let gone = st.peers.get_mut(name).is_some_and(|p| {
                    p.users = p.users.saturating_sub(1);
                    p.users == 0
                });
                if gone && parks {
                    if let (Some(mut p), Some(av)) = (st.peers.remove(name), self.av.as_ref()) {
                        // SAFETY: the port's open AV; `p.addr` was inserted by `insert`.
                        unsafe { fi::fi_av_remove(av.ptr(), &mut p.addr, 1, 0) };
                        released = keeper().unnamed(name);
                    }
                }
            }
        }
        let woken = self.wake(&mut st);
        drop(st);
        // A parked endpoint no longer named closes outside both locks.
        drop(released);
        woken
    }

    /// A QP with none of its receives with the provider may give it one
    /// (its own slot); one that has some takes a spare slot, if any is left:
    /// else it waits (woken by `returned`). Returns whether it may give.
    pub(crate) fn take_slot(&self, qp: u32, given: usize) -> bool {
        if given == 0 {
            return true;
        }
        let mut st = self.state.lock();
        if st.qps + st.spare_used + self.pool_len() < self.rx_depth {
            st.spare_used += 1;
            return true;
        }
        if !st.waiting.contains(&qp) {
            st.waiting.push_back(qp);
        }
        false
    }

    /// A receive of a QP that had `given` with the provider completed (or
    /// was given back): a spare slot frees unless it was the QP's own.
    /// Returns the QPs to wake (to give their waiting receives).
    pub(crate) fn returned(&self, given: usize) -> Vec<u32> {
        if given < 2 {
            return Vec::new();
        }
        let mut st = self.state.lock();
        st.spare_used = st.spare_used.saturating_sub(1);
        self.wake(&mut st)
    }

    fn wake(&self, st: &mut State) -> Vec<u32> {
        let free = self
            .rx_depth
            .saturating_sub(st.qps + st.spare_used + self.pool_len());
        let n = free.min(st.waiting.len());
        st.waiting.drain(..n).collect()
    }

    /// Keeps an SRQ QP's bounce buffers until the endpoint closed.
    pub(crate) fn keep_bounces(&self, bounces: crate::bounce::Bounces) {
        *self.bounces.lock() = bounces;
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        let dev = self.dev.upgrade();
        // No CQ is read while an endpoint closes (`Domain::closing`).
        let _closing = dev.as_ref().map(|d| d.closing.lock());
        let parks = dev.as_ref().is_some_and(|d| d.parks);
        let peers = std::mem::take(&mut self.state.get_mut().peers);
        let mut released = Vec::new();
        if parks {
            // Entries naming endpoints of this process go first (they may
            // then close: `Keeper`); the others go with the AV.
            for (name, mut peer) in peers {
                if let Some(av) = &self.av {
                    // SAFETY: the port's open AV; the entry was inserted by `insert`.
                    unsafe { fi::fi_av_remove(av.ptr(), &mut peer.addr, 1, 0) };
                }
                released.extend(keeper().unnamed(&name));
            }
        }
        drop(released);
        let (Some(ep), av) = (self.ep.take(), self.av.take()) else {
            return;
        };
        if let (Some(_), Some(ports), true) = (&dev, self.ports.upgrade(), self.id != 0) {
            ports.by_id.lock().remove(&self.id);
        }
        let parked = Parked {
            _ep: ep,
            _av: av,
            _bounces: std::mem::take(self.bounces.get_mut()),
            _pool: self.pool.get_mut().take(),
            _cqs: std::mem::take(&mut self.cqs),
        };
        keeper().close(parked, &self.name);
    }
}

/// The device's ports: by key (those of a key in the order opened), and
/// those with eager buffers by id (their buffers' contexts name it).
pub(crate) struct Ports {
    by_key: Mutex<HashMap<PortKey, Vec<Weak<Port>>>>,
    by_id: Mutex<HashMap<u32, Weak<Port>>>,
    next_id: AtomicU32,
    /// Ports whose eager buffers the provider was too busy to take, for the
    /// progress thread to post (`take_retries`).
    retries: Mutex<Vec<Weak<Port>>>,
    /// The progress thread's, woken for a retry.
    waiter: Arc<Waiter>,
}

impl Ports {
    pub(crate) fn new(waiter: Arc<Waiter>) -> Ports {
        Ports {
            by_key: Mutex::new(HashMap::new()),
            by_id: Mutex::new(HashMap::new()),
            next_id: AtomicU32::new(1),
            retries: Mutex::new(Vec::new()),
            waiter,
        }
    }

    /// A new shared port's id (never 0, below 2^24: see `POOL_CONN`).
    fn next_id(&self) -> u32 {
        let by_id = self.by_id.lock();
        loop {
            let n = self.next_id.fetch_add(1, Ordering::Relaxed) & 0xff_ffff;
            if n != 0 && !by_id.contains_key(&n) {
                return n;
            }
        }
    }

    /// The port of eager buffer context `token` (its id above 8 bits).
    pub(crate) fn by_token(&self, token: u32) -> Option<Arc<Port>> {
        self.by_id.lock().get(&(token >> 8)).and_then(Weak::upgrade)
    }

    /// The progress thread posts `port`'s eager buffers at its next turn.
    fn retry(&self, port: &Arc<Port>) {
        self.retries.lock().push(Arc::downgrade(port));
        self.waiter.wake();
    }

    /// The ports `retry` named since the last call, still open.
    pub(crate) fn take_retries(&self) -> Vec<Arc<Port>> {
        let ports = std::mem::take(&mut *self.retries.lock());
        ports.iter().filter_map(Weak::upgrade).collect()
    }

    /// Whether some port waits to be tried again.
    pub(crate) fn retries_waiting(&self) -> bool {
        !self.retries.lock().is_empty()
    }

    /// The port a QP attaches to (one with room, else a new one), counted as
    /// attached: its peer unresolved until `Port::insert`. Called with the
    /// device's closing lock held (an endpoint may open).
    pub(crate) fn attach(
        self: &Arc<Self>,
        dev: &Domain,
        key: PortKey,
        send_cq: &Arc<OfiCq>,
        recv_cq: &Arc<OfiCq>,
    ) -> Result<Arc<Port>> {
        let mut ports = self.by_key.lock();
        let list = ports.entry(key).or_default();
        list.retain(|w| w.strong_count() > 0);
        for port in list.iter().filter_map(Weak::upgrade) {
            let mut st = port.state.lock();
            if port.admits(&mut st) {
                st.qps += 1;
                st.unresolved += 1;
                drop(st);
                return Ok(port);
            }
        }
        let mut port = Port::open(dev, self, key, send_cq, recv_cq)?;
        let eager = dev.eager && matches!(key, PortKey::Shared { .. });
        if eager {
            port.id = self.next_id();
        }
        let port = Arc::new(port);
        if eager {
            port.open_pool(dev, self)?;
        }
        {
            let mut st = port.state.lock();
            st.qps = 1;
            st.unresolved = 1;
        }
        list.push(Arc::downgrade(&port));
        Ok(port)
    }
}

/// Endpoints of this process that an address vector of this process still
/// names, kept open until it no longer does. libfabric 1.17's shm keeps, in an
/// AV entry for an endpoint of the same process, a pointer to that endpoint's
/// memory region (not a mapping of its own, as for another process's), reads
/// it when any later endpoint of the AV is enabled and writes through it when
/// the entry is removed (prov/util/src/util_shm.c: smr_map_to_endpoint,
/// smr_unmap_from_endpoint, smr_map_del). An endpoint closed first frees the
/// region under the entry, and the process crashes or corrupts memory (seen:
/// a SIGSEGV in fi_enable). Both sides of a DAT connection in one process is
/// what most DAT test programs do.
#[derive(Default)]
pub(crate) struct Keeper {
    /// A fabric address -> how many AV entries of this process name it.
    named: std::collections::HashMap<Vec<u8>, usize>,
    /// Endpoints (with their AV) closed by their QP while still named.
    parked: std::collections::HashMap<Vec<u8>, Parked>,
}

pub(crate) fn keeper() -> parking_lot::MutexGuard<'static, Keeper> {
    static KEEPER: std::sync::OnceLock<Mutex<Keeper>> = std::sync::OnceLock::new();
    KEEPER.get_or_init(Mutex::default).lock()
}

impl Keeper {
    pub(crate) fn named(&mut self, name: &[u8]) {
        *self.named.entry(name.to_vec()).or_insert(0) += 1;
    }

    /// An AV entry naming `name` was removed: a parked endpoint no longer
    /// named closes (after the keeper's lock is released: dropped by the caller).
    #[must_use]
    pub(crate) fn unnamed(&mut self, name: &[u8]) -> Option<Parked> {
        let count = self.named.get_mut(name)?;
        *count -= 1;
        if *count > 0 {
            return None;
        }
        self.named.remove(name);
        self.parked.remove(name)
    }

    /// Closes a QP's endpoint (`name`: its fabric address), or parks it while
    /// an AV entry of this process names it.
    pub(crate) fn close(&mut self, endpoint: Parked, name: &[u8]) {
        if name.is_empty() || !self.named.contains_key(name) {
            drop(endpoint);
            return;
        }
        self.parked.insert(name.to_vec(), endpoint);
    }
}

/// An endpoint, its AV and its bounce buffers, held only to be closed and
/// freed, in that order, when dropped; then the CQs it was bound to.
pub(crate) struct Parked {
    pub _ep: Fid<fi::fid_ep>,
    pub _av: Option<Fid<fi::fid_av>>,
    /// Where the endpoint's receives land (an SRQ of ours): freed after it closes.
    pub _bounces: crate::bounce::Bounces,
    /// A shared port's eager buffers: freed after it closes.
    pub _pool: Option<crate::eager::EagerPool>,
    pub _cqs: Vec<Arc<OfiCq>>,
}

/// An AV for a port's peers (`count`: how many it is sized for).
fn open_av(dev: &Domain, count: usize) -> Result<Fid<fi::fid_av>> {
    let mut attr = fi::fi_av_attr {
        type_: fi::fi_av_type_FI_AV_TABLE,
        count,
        ..Default::default()
    };
    let mut av = null_mut();
    // SAFETY: an open domain; `av` receives the new object.
    let rc = unsafe { fi::fi_av_open(dev.domain.ptr(), &mut attr, &mut av, null_mut()) };
    opened(rc, "fi_av_open", Error::NoResource(Resource::Qp))?;
    Ok(Fid(av))
}
