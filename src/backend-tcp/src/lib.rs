//! The TCP software transport: implements the verbs-shaped traits over TCP sockets.
//!
//! One progress thread per device (per IA) polls every socket of the device, so a target
//! serves RDMA reads and writes and places incoming sends without its application calling
//! anything. All queue-pair and connection state lives in one `Engine` behind one lock; calls
//! from application threads take the lock, do their work (including a first non-blocking write
//! attempt), and hand anything left to the progress thread. Completions and connection events
//! produced under the lock are delivered after it is released, in the order produced.
//!
//! An application thread that waits on an EVD drives its own connections meanwhile
//! (`TcpCq::drive`): it claims the sockets of the QPs completing into that CQ, polls and reads
//! them itself, and gets its completion without a second thread waking it (a round trip costs
//! two thread wake-ups, as plain TCP ping-pong does, instead of three). The progress thread
//! leaves claimed sockets alone and is woken when they are given back, so a target is served
//! either way. Large RDMA read answers go from the target's registered memory straight to the
//! socket, and from the socket straight into the initiator's buffers (see `ReadSink`).
//!
//! This crate implements the contract of `daplrs-backend` and depends on nothing else of the
//! provider: it cannot name a DAT type.
#![deny(unsafe_op_in_unsafe_fn)]

// The DAT test helpers this crate's tests include (src/tests.rs) name it by its own name.
#[cfg(test)]
extern crate self as daplrs_tcp;

mod engine;
mod guarded;
mod keys;
mod readiness;
mod samehost;
mod sigio;
pub(crate) mod sys;
/// Also for the fuzzer's peers, which make thousands of connections (see the function).
#[cfg(feature = "fuzzing")]
pub use sys::connect_reusable;
/// The frame format. Public only for the fuzzers and the hostile-peer test (feature `fuzzing`).
#[cfg(feature = "fuzzing")]
pub mod wire;
#[cfg(not(feature = "fuzzing"))]
pub(crate) mod wire;

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use daplrs_backend::intmap::IntMap;
use daplrs_backend::{
    AddressHandle, CmEvent, CmHandler, CompletionQueue, ConnRequestId, Device, DeviceAttr,
    Listener, MemoryRegion, MemoryWindow, NotifyFn, ProtectionDomain, QpInit, QpState, QueuePair,
    RecvWr, SendWr, SharedReceiveQueue, UdPeer, WorkCompletion,
};
use daplrs_backend::{Error, Resource, Result};
use engine::{Deferred, Engine, TcpAh};
use keys::{KeyEntry, Keys};

/// Largest message / RDMA transfer (also the wire bound on payloads).
pub const MAX_MESSAGE: u32 = 16 << 20;

pub use daplrs_backend::netif::resolve_address;

pub(crate) struct Shared {
    name: String,
    addr: Ipv4Addr,
    attr: DeviceAttr,
    engine: Mutex<Engine>,
    keys: Mutex<Keys>,
    wake_tx: UnixStream,
    wake_rx: UnixStream,
    cm_handler: Mutex<Option<CmHandler>>,
    /// Connection events in the order the engine made them, for `deliver_cm`.
    cm_events: Mutex<VecDeque<CmEvent>>,
    /// Held by the one thread handing connection events to the handler.
    cm_turn: Mutex<()>,
    cqs: Mutex<IntMap<u64, Weak<TcpCq>>>,
    srqs: Mutex<IntMap<u64, Weak<TcpSrq>>>,
    /// Memory windows by key index, so a bind work request can reach its window.
    mws: Mutex<IntMap<u32, Weak<TcpMw>>>,
    next_id: AtomicU64,
    limits: wire::Limits,
    stopped: AtomicBool,
    /// A signal handler found the engine busy: the progress thread reads the connections
    /// armed for the target signal (sigio.rs).
    signal_sweep: AtomicBool,
    /// The ACK timer fired while the engine was held: the held ACKs are due (sigio.rs).
    acks_due: AtomicBool,
    /// Datagrams dropped on arrival for lack of a posted receive (`Device::ud_dropped`).
    ud_dropped: AtomicU64,
    /// The same-host path: our published key table, mode and counters (samehost/).
    samehost: samehost::Local,
    /// The arena each memory region's memory lies in (samehost/arena.rs), by region key:
    /// held while the region is registered; its pages move back to private memory with the
    /// last registration in it. Held while a region's pages move in (`promote`), so that a
    /// deregistration meanwhile waits and still returns with the memory as it was.
    arenas: Mutex<IntMap<u32, Arc<samehost::arena::Arena>>>,
}

thread_local! {
    /// The list of deferred work a thread last delivered, empty, for its next turn on the
    /// engine (`Shared::take_deferred` leaves it there): the common turn, one completion,
    /// then allocates nothing.
    static SPARE_DEFERRED: std::cell::Cell<Vec<Deferred>> =
        const { std::cell::Cell::new(Vec::new()) };
}

/// A spare list with more room than this is dropped rather than kept.
const SPARE_DEFERRED_MAX: usize = 64;

impl Shared {
    /// Maps the memory of regions same-host peers asked for into arenas (samehost/arena.rs),
    /// so that their copies become plain memory copies: `keys` are the peers' requests (a
    /// region's key, or a window's, whose region is meant), checked here. Runs on the
    /// same-host keeper thread. The pages move under the table's mutex (no peer copies
    /// meanwhile) and under `arenas` (a deregistration waits for the move, then finds the
    /// arena and moves the pages back before it returns).
    fn promote(&self, keys: &[u32]) {
        for &key in keys {
            let region = {
                let keys = self.keys.lock();
                let Some(e) = keys.get(key) else { continue };
                let region = if e.window { e.region } else { key };
                match keys.get(region) {
                    Some(r) if r.arena.is_none() => (region, r.addr, r.len),
                    _ => continue,
                }
            };
            let mut arenas = self.arenas.lock();
            let Some((arena, span)) = self
                .samehost
                .with_table_locked(|| samehost::arena::share(region.1, region.2))
            else {
                continue;
            };
            let mut keys = self.keys.lock();
            // Still the region that was asked for (not deregistered meanwhile): publish.
            if keys.set_region_arena(region.0, region.1, region.2, span) {
                arenas.insert(region.0, arena);
            } else {
                drop(keys);
                drop(arena);
            }
        }
    }

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Wakes the progress thread (a full pipe is already a pending wake-up).
    pub(crate) fn wake(&self) {
        let _ = (&self.wake_tx).write(&[1u8]);
    }

    /// A signal handler's service of connection `fd` (sigio.rs): nothing that blocks or
    /// allocates. Whether the connection is this device's (or maybe is: the engine was busy,
    /// and its holder or the progress thread, woken here, serves it).
    pub(crate) fn serve_signalled(&self, fd: i32) -> bool {
        #[cfg(test)]
        let busy = sigio::test_hooks::FORCE_BUSY.load(Ordering::Relaxed);
        #[cfg(not(test))]
        let busy = false;
        let Some(mut eng) = self.engine.try_lock().filter(|_| !busy) else {
            // The holder reads the armed connections before it lets go (`run_locked`), or
            // just after; the progress thread at its next wake-up or tick otherwise.
            sigio::stats::add(&sigio::stats::LEFT, 1);
            self.signal_sweep.store(true, Ordering::SeqCst);
            return false;
        };
        let served = eng.serve_signalled(self, fd);
        #[cfg(test)]
        {
            use sigio::test_hooks::{POSTERS, SERVED, SERVED_ELSEWHERE};
            let n = served.unwrap_or(0) as u64;
            SERVED.fetch_add(n, Ordering::Relaxed);
            // SAFETY: gettid has no preconditions.
            let me = unsafe { libc::gettid() };
            let posters = POSTERS.each_ref().map(|p| p.load(Ordering::Relaxed));
            if posters[0] != 0 && !posters.contains(&me) {
                SERVED_ELSEWHERE.fetch_add(n, Ordering::Relaxed);
            }
        }
        // Completions to notify without a timer, a frame left: the progress thread.
        let wake = std::mem::take(&mut eng.wake_needed) || eng.signal_sweep;
        drop(eng);
        if wake {
            self.wake();
        }
        served.is_some()
    }

    /// A signal handler's service of the ACK timer (sigio.rs): the held ACKs written, or,
    /// with the engine held, left to its holder (which sweeps the armed connections).
    pub(crate) fn write_held_acks(&self) {
        let Some(mut eng) = self.engine.try_lock() else {
            sigio::stats::add(&sigio::stats::LEFT, 1);
            self.leave_acks_to_others();
            return;
        };
        eng.write_held_acks();
        let wake = std::mem::take(&mut eng.wake_needed);
        drop(eng);
        if wake {
            self.wake();
        }
    }

    /// A signal handler that may not serve now leaves its connection to the engine's next
    /// holder, or the progress thread, woken for it.
    pub(crate) fn leave_to_others(&self) {
        self.signal_sweep.store(true, Ordering::SeqCst);
        self.wake();
    }

    /// The ACK timer's handler may not write the held ACKs now: the engine's holder or the
    /// progress thread does.
    pub(crate) fn leave_acks_to_others(&self) {
        self.acks_due.store(true, Ordering::SeqCst);
        self.leave_to_others();
    }

    /// Whether the ACK timer fired with the engine held (taking the request).
    pub(crate) fn take_acks_due(&self) -> bool {
        self.acks_due.load(Ordering::Relaxed) && self.acks_due.swap(false, Ordering::SeqCst)
    }

    /// Whether a signal handler found the engine held and left its connection to the holder.
    pub(crate) fn sweep_asked(&self) -> bool {
        self.signal_sweep.load(Ordering::Relaxed)
    }

    /// Runs `f` on the engine, then delivers what it produced with no lock held.
    pub(crate) fn run<T>(&self, f: impl FnOnce(&mut Engine, &Shared) -> T) -> T {
        self.run_locked(self.engine.lock(), f)
    }

    /// `run`, unless another thread holds the engine now (None: `f` did not run).
    pub(crate) fn try_run<T>(&self, f: impl FnOnce(&mut Engine, &Shared) -> T) -> Option<T> {
        Some(self.run_locked(self.engine.try_lock()?, f))
    }

    fn run_locked<T>(
        &self,
        mut eng: parking_lot::MutexGuard<'_, Engine>,
        f: impl FnOnce(&mut Engine, &Shared) -> T,
    ) -> T {
        let result = f(&mut eng, self);
        self.sweep_if_asked(&mut eng);
        let wake = std::mem::take(&mut eng.wake_needed);
        let deferred = self.take_deferred(&mut eng);
        drop(eng);
        if wake {
            self.wake();
        }
        self.deliver(deferred);
        self.sweep_after_release();
        result
    }

    /// A signal handler that found the engine held after our look, before our release:
    /// served now unless another thread holds the engine (which serves it on release).
    fn sweep_after_release(&self) {
        while self.signal_sweep.load(Ordering::SeqCst) {
            let Some(mut eng) = self.engine.try_lock() else {
                return;
            };
            self.sweep_if_asked(&mut eng);
            let wake = std::mem::take(&mut eng.wake_needed);
            let deferred = self.take_deferred(&mut eng);
            drop(eng);
            if wake {
                self.wake();
            }
            self.deliver(deferred);
        }
    }

    /// Reads the connections armed for the target signal if a signal handler found the
    /// engine held (sigio.rs): the holder serves what the handler could not.
    fn sweep_if_asked(&self, eng: &mut Engine) {
        let asked = self.signal_sweep.load(Ordering::Relaxed)
            && self.signal_sweep.swap(false, Ordering::SeqCst);
        // Or the engine's own request: a driver gave back an armed connection.
        if asked || eng.signal_sweep {
            let mut buf = [0u8; 16 << 10];
            let acks_due = self.take_acks_due();
            eng.sweep_signalled(self, &mut buf, acks_due);
        }
    }

    /// What the engine left to do once its lock is released, taken while it is held: the
    /// connection events go to the shared queue there, so that they reach the consumer in the
    /// engine's order whichever thread hands them over (see `deliver_cm`).
    pub(crate) fn take_deferred(&self, eng: &mut Engine) -> Vec<Deferred> {
        // The engine keeps this thread's spare list (empty, with room), so that the next
        // completion pushed allocates nothing; a turn that left nothing (a look that found
        // nothing) touches no thread-local.
        let mut all = match eng.deferred.is_empty() {
            true => Vec::new(),
            false => std::mem::replace(&mut eng.deferred, SPARE_DEFERRED.take()),
        };
        eng.take_signalled(&mut all);
        if !all.iter().any(|d| matches!(d, Deferred::Cm(_))) {
            return all; // the common case: completions only
        }
        let mut rest = Vec::with_capacity(all.len());
        let mut events = None;
        for d in all {
            match d {
                Deferred::Cm(ev) => events
                    .get_or_insert_with(|| self.cm_events.lock())
                    .push_back(ev),
                other => rest.push(other),
            }
        }
        rest
    }

    /// Does what `take_deferred` left, outside the engine lock.
    pub(crate) fn deliver(&self, mut deferred: Vec<Deferred>) {
        let mut last_cq: Option<u64> = None;
        for d in deferred.drain(..) {
            match d {
                Deferred::Notify(cq) => {
                    if last_cq == Some(cq.id) {
                        continue;
                    }
                    last_cq = Some(cq.id);
                    cq.notify();
                }
                Deferred::Interrupt(cq) => {
                    let cq = self.cqs.lock().get(&cq).and_then(|w| w.upgrade());
                    if let Some(cq) = cq {
                        cq.interrupt();
                    }
                }
                // Not from `take_deferred` (a test's hand-made list): queued now, in order
                // with what this thread queued before.
                Deferred::Cm(ev) => self.cm_events.lock().push_back(ev),
            }
        }
        if deferred.capacity() > 0 && deferred.capacity() <= SPARE_DEFERRED_MAX {
            SPARE_DEFERRED.set(deferred);
        }
        self.deliver_cm();
    }

    /// Hands the queued connection events to the handler, one thread at a time and in order.
    /// Each thread used to deliver the events it had made itself, after releasing the engine:
    /// an accepting thread's ESTABLISHED could then reach the consumer after the progress
    /// thread's DISCONNECTED for the same connection, and the EP, already disconnected, drop
    /// it (Debian's dtestcm server then waited forever for its 2,000th event, about one run in
    /// 100). A thread that finds another delivering leaves its events to it: that one looks
    /// at the queue again after giving up its turn.
    fn deliver_cm(&self) {
        loop {
            if self.cm_events.lock().is_empty() {
                return;
            }
            let Some(turn) = self.cm_turn.try_lock() else {
                return;
            };
            loop {
                let next = self.cm_events.lock().pop_front();
                let Some(ev) = next else {
                    break;
                };
                let handler = self.cm_handler.lock().clone();
                if let Some(h) = handler {
                    h(ev);
                }
            }
            drop(turn);
        }
    }

    fn cq(&self, cq: &Arc<dyn CompletionQueue>) -> Result<Arc<TcpCq>> {
        self.cqs
            .lock()
            .get(&cq.id())
            .and_then(|w| w.upgrade())
            .ok_or(Error::Foreign)
    }
}

/// A TCP "device": one local IPv4 address and its progress thread.
pub struct TcpDevice {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl TcpDevice {
    /// Opens the device for `target` ("lo", "eth0", "127.0.0.1", ...).
    pub fn open(target: &str) -> Result<Arc<TcpDevice>> {
        // Before the application's own handlers, if it installs any later (guarded.rs).
        guarded::install();
        let addr = resolve_address(target).map_err(|why| {
            log::warn!("tcp device {target}: {why}");
            Error::NoResource(Resource::Device)
        })?;
        let (wake_tx, wake_rx) =
            UnixStream::pair().map_err(|_| Error::NoResource(Resource::Memory))?;
        wake_tx.set_nonblocking(true).map_err(|_| Error::Internal)?;
        wake_rx.set_nonblocking(true).map_err(|_| Error::Internal)?;
        let attr = DeviceAttr {
            max_qp: 4096,
            // Queues are grown as work is posted, never allocated to their maximum: what a
            // program may ask for is bounded by its memory, not a device's (published uDAPL
            // benchmarks post 20,000 receives per EP).
            max_qp_wr: 1 << 18,
            max_sge: 32,
            max_cq: 16384,
            max_cqe: 1 << 20,
            max_mr: 1 << 20,
            max_mr_size: 1 << 40,
            max_pd: 4096,
            max_mw: 1 << 20,
            max_srq: 4096,
            max_srq_wr: 1 << 18,
            max_msg_size: MAX_MESSAGE,
            max_rdma_size: MAX_MESSAGE,
            max_rd_atomic: 128,
            max_private_data: wire::MAX_PRIVATE_DATA,
            // What one datagram carries unfragmented on the interface holding the address
            // (its MTU less the IPv4, UDP and datagram headers; loopback's 65536 is capped at
            // what a UDP datagram holds; 1500 if the MTU cannot be read): the bound of a
            // datagram's message, as an InfiniBand port's MTU bounds a UD message.
            mtu: wire::ud_max_message(sys::interface_mtu(addr).unwrap_or(1500)),
            // Datagram QPs are UDP sockets (engine/datagram.rs).
            ud: true,
            max_rdma_read_sge: 32,
            atomics: true,
            pins_for_write: false,
            pin_limit: None,
            write_imm: true,
            transport: "TCP",
        };
        let max_keys = (attr.max_mr + attr.max_mw) as usize;
        let samehost = samehost::Local::new(samehost::Mode::for_new_device(), max_keys, target);
        let shared = Arc::new(Shared {
            name: format!("tcp:{target}"),
            addr,
            attr,
            engine: Mutex::new(Engine::new(samehost.supported())),
            keys: Mutex::new(Keys::published_in(samehost.publisher())),
            wake_tx,
            wake_rx,
            cm_handler: Mutex::new(None),
            cm_events: Mutex::new(VecDeque::new()),
            cm_turn: Mutex::new(()),
            cqs: Mutex::new(IntMap::default()),
            srqs: Mutex::new(IntMap::default()),
            mws: Mutex::new(IntMap::default()),
            next_id: AtomicU64::new(1),
            limits: wire::Limits {
                max_message: MAX_MESSAGE,
            },
            stopped: AtomicBool::new(false),
            signal_sweep: AtomicBool::new(false),
            acks_due: AtomicBool::new(false),
            ud_dropped: AtomicU64::new(0),
            samehost,
            arenas: Mutex::new(IntMap::default()),
        });
        let weak = Arc::downgrade(&shared);
        shared.samehost.set_promoter(Box::new(move |keys| {
            if let Some(shared) = weak.upgrade() {
                shared.promote(keys);
            }
        }));
        let s2 = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("daplrs-tcp-{target}"))
            .spawn(move || {
                sigio::block_here();
                engine::progress_loop(s2)
            })
            .map_err(|_| Error::NoResource(Resource::Device))?;
        let slot = sigio::register(&shared);
        shared.engine.lock().signal_slot = slot;
        Ok(Arc::new(TcpDevice {
            shared,
            thread: Mutex::new(Some(thread)),
        }))
    }

    fn qp_num_of(&self, qp: &Arc<dyn QueuePair>) -> u32 {
        qp.qp_num()
    }
}

impl Drop for TcpDevice {
    fn drop(&mut self) {
        self.close();
    }
}

impl Device for TcpDevice {
    fn name(&self) -> String {
        self.shared.name.clone()
    }
    fn address(&self) -> Ipv4Addr {
        self.shared.addr
    }
    fn attr(&self) -> DeviceAttr {
        self.shared.attr.clone()
    }

    fn alloc_pd(&self) -> Result<Arc<dyn ProtectionDomain>> {
        let id = self.shared.next_id() as u32;
        Ok(Arc::new(TcpPd {
            id,
            shared: self.shared.clone(),
        }))
    }

    fn create_cq(&self, depth: u32) -> Result<Arc<dyn CompletionQueue>> {
        let cq = Arc::new(TcpCq {
            id: self.shared.next_id(),
            // Room a signal handler may fill without allocating (sigio.rs).
            queue: Mutex::new(VecDeque::with_capacity(64)),
            notify: Mutex::new(None),
            depth: AtomicU32::new(depth),
            shared: Arc::downgrade(&self.shared),
            waker: OnceLock::new(),
            driver: Mutex::new(None),
            buf: Mutex::new(Vec::new()),
            readiness: Default::default(),
            looks: Mutex::new(Looks::default()),
            scan_all: AtomicBool::new(false),
            spin_misses: AtomicU32::new(0),
            keeps_claims: AtomicBool::new(false),
            disarmed: AtomicBool::new(false),
        });
        self.shared.cqs.lock().insert(cq.id, Arc::downgrade(&cq));
        Ok(cq)
    }

    fn create_qp(&self, init: QpInit) -> Result<Arc<dyn QueuePair>> {
        let send_cq = self.shared.cq(&init.send_cq)?;
        let recv_cq = self.shared.cq(&init.recv_cq)?;
        let srq = match &init.srq {
            Some(s) => Some(
                self.shared
                    .srqs
                    .lock()
                    .get(&s.id())
                    .and_then(|w| w.upgrade())
                    .ok_or(Error::Foreign)?,
            ),
            None => None,
        };
        let pd = init.pd.id();
        let (qp_num, lane) = self.shared.run(|eng, _| {
            let n = eng.create_qp(pd, send_cq, recv_cq, srq, init.cap);
            (n, eng.qp_lane(n).unwrap_or_default())
        });
        Ok(Arc::new(TcpQp {
            qp_num,
            shared: self.shared.clone(),
            lane,
        }))
    }

    fn create_srq(
        &self,
        pd: &Arc<dyn ProtectionDomain>,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<Arc<dyn SharedReceiveQueue>> {
        let srq = Arc::new(TcpSrq {
            id: self.shared.next_id(),
            pd: pd.id(),
            queue: Mutex::new(VecDeque::new()),
            max_wr: AtomicU32::new(max_wr),
            max_sge,
            shared: Arc::downgrade(&self.shared),
        });
        self.shared.srqs.lock().insert(srq.id, Arc::downgrade(&srq));
        Ok(srq)
    }

    fn set_cm_handler(&self, handler: Option<CmHandler>) {
        *self.shared.cm_handler.lock() = handler;
    }

    fn listen(&self, port: u16) -> Result<Arc<dyn Listener>> {
        let sock = TcpListener::bind(SocketAddrV4::new(self.shared.addr, port)).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AddrInUse {
                Error::AddrInUse
            } else {
                log::warn!("listen on port {port}: {e}");
                Error::NoResource(Resource::Host)
            }
        })?;
        sock.set_nonblocking(true).map_err(|_| Error::Internal)?;
        let port = sock
            .local_addr()
            .map(|a| a.port())
            .map_err(|_| Error::Internal)?;
        let id = self.shared.next_id();
        self.shared.run(|eng, _| {
            eng.listeners.insert(id, engine::ListenerEntry { sock });
            eng.wake_needed = true;
        });
        Ok(Arc::new(TcpListenerHandle {
            id,
            port,
            shared: Arc::downgrade(&self.shared),
        }))
    }

    fn connect(
        &self,
        qp: &Arc<dyn QueuePair>,
        remote: SocketAddrV4,
        private_data: &[u8],
        timeout: Option<Duration>,
    ) -> Result<()> {
        let qp_num = self.qp_num_of(qp);
        let attempt = self
            .shared
            .run(|eng, _| eng.begin_connect(qp_num, remote, private_data.to_vec(), timeout))?;
        // Started here without blocking; the progress thread sees it finish (engine/connection.rs
        // `connect_started`). A thread per connect, as before, cost more than the rest of a
        // connection's setup together.
        let limit = timeout
            .unwrap_or(Duration::from_secs(60))
            .max(Duration::from_millis(1));
        let started = sys::connect_start(remote);
        self.shared
            .run(|eng, _| eng.connect_started(qp_num, attempt, started, Instant::now() + limit));
        Ok(())
    }

    fn accept(
        &self,
        req: ConnRequestId,
        qp: &Arc<dyn QueuePair>,
        private_data: &[u8],
    ) -> Result<()> {
        let qp_num = self.qp_num_of(qp);
        self.shared
            .run(|eng, sh| eng.accept(sh, req, qp_num, private_data))
    }

    fn reject(&self, req: ConnRequestId, private_data: &[u8]) -> Result<()> {
        self.shared.run(|eng, sh| eng.reject(sh, req, private_data))
    }

    fn disconnect(&self, qp: &Arc<dyn QueuePair>, abrupt: bool) -> Result<()> {
        let qp_num = self.qp_num_of(qp);
        self.shared
            .run(|eng, sh| eng.disconnect(sh, qp_num, abrupt))
    }

    fn create_ud_qp(&self, init: QpInit) -> Result<Arc<dyn QueuePair>> {
        if init.srq.is_some() {
            return Err(Error::Invalid);
        }
        let send_cq = self.shared.cq(&init.send_cq)?;
        let recv_cq = self.shared.cq(&init.recv_cq)?;
        let sock = UdpSocket::bind(SocketAddrV4::new(self.shared.addr, 0)).map_err(|e| {
            log::warn!("datagram socket on {}: {e}", self.shared.addr);
            Error::NoResource(Resource::Qp)
        })?;
        sock.set_nonblocking(true).map_err(|_| Error::Internal)?;
        let local = match sock.local_addr() {
            Ok(std::net::SocketAddr::V4(a)) => a,
            _ => return Err(Error::Internal),
        };
        let pd = init.pd.id();
        let qp_num = self
            .shared
            .run(|eng, _| eng.create_ud_qp(sock, local, pd, send_cq, recv_cq, init.cap));
        Ok(Arc::new(TcpQp {
            qp_num,
            shared: self.shared.clone(),
            // A datagram QP has no same-host lane: one that is never opened.
            lane: Arc::default(),
        }))
    }

    fn ud_resolve(
        &self,
        qp: &Arc<dyn QueuePair>,
        remote: SocketAddrV4,
        private_data: &[u8],
        timeout: Option<Duration>,
    ) -> Result<u64> {
        let qp_num = self.qp_num_of(qp);
        let id = self
            .shared
            .run(|eng, _| eng.begin_ud_resolve(qp_num, private_data.to_vec(), timeout))?;
        // As for `connect`: a helper thread makes the handshake's TCP connection.
        let weak = Arc::downgrade(&self.shared);
        let limit = timeout
            .unwrap_or(Duration::from_secs(60))
            .max(Duration::from_millis(1));
        std::thread::Builder::new()
            .name("daplrs-ud-resolve".into())
            .spawn(move || {
                sigio::block_here();
                let result = sys::connect_reusable(remote, limit);
                if let Some(shared) = weak.upgrade() {
                    shared.run(|eng, _| {
                        eng.ud_connect_results.push((id, result));
                        eng.wake_needed = true;
                    });
                }
            })
            .map_err(|_| Error::NoResource(Resource::Host))?;
        Ok(id)
    }

    fn ud_accept(
        &self,
        req: ConnRequestId,
        qp: &Arc<dyn QueuePair>,
        private_data: &[u8],
    ) -> Result<UdPeer> {
        let qp_num = self.qp_num_of(qp);
        self.shared
            .run(|eng, _| eng.ud_accept(req, qp_num, private_data))
    }

    fn ud_dropped(&self) -> u64 {
        self.shared.ud_dropped.load(Ordering::Relaxed)
    }

    fn close(&self) {
        if self.shared.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        sigio::unregister(&self.shared);
        self.shared.run(|eng, sh| eng.shutdown(sh));
        self.shared.wake();
        let handle = self.thread.lock().take();
        if let Some(h) = handle {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

struct TcpPd {
    id: u32,
    shared: Arc<Shared>,
}

impl ProtectionDomain for TcpPd {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn id(&self) -> u32 {
        self.id
    }

    fn reg_mr(&self, addr: u64, length: u64, access: u32) -> Result<Arc<dyn MemoryRegion>> {
        if length == 0 || addr.checked_add(length).is_none() {
            return Err(Error::BadAddress);
        }
        // Memory already in an arena is published with it; other memory moves into one only
        // once peers use it enough (`Shared::promote`), never here.
        let shared_pages = match self.shared.samehost.shares_pages() {
            true => samehost::arena::existing(addr, length),
            false => None,
        };
        let mut keys = self.shared.keys.lock();
        let index = keys.alloc_index().ok_or(Error::NoResource(Resource::Key))?;
        let key = keys.first_key(index);
        keys.insert(
            key,
            KeyEntry {
                addr,
                len: length,
                access,
                pd: self.id,
                window: false,
                region: key,
                arena: shared_pages.as_ref().map(|(_, span)| *span),
            },
        );
        drop(keys);
        if let Some((arena, _)) = shared_pages {
            self.shared.arenas.lock().insert(key, arena);
        }
        Ok(Arc::new(TcpMr {
            key,
            addr,
            length,
            access,
            pd: self.id,
            shared: Arc::downgrade(&self.shared),
            live: AtomicBool::new(true),
        }))
    }

    fn alloc_mw(&self) -> Result<Arc<dyn MemoryWindow>> {
        let (index, key) = {
            let mut keys = self.shared.keys.lock();
            let index = keys.alloc_index().ok_or(Error::NoResource(Resource::Key))?;
            (index, keys.first_key(index))
        };
        let mw = Arc::new(TcpMw {
            index,
            rkey: Mutex::new(key),
            mapped: Mutex::new(key),
            bound: AtomicBool::new(false),
            pd: self.id,
            shared: Arc::downgrade(&self.shared),
            live: AtomicBool::new(true),
        });
        self.shared.mws.lock().insert(index, Arc::downgrade(&mw));
        Ok(mw)
    }
}

struct TcpMr {
    key: u32,
    addr: u64,
    length: u64,
    access: u32,
    pd: u32,
    shared: Weak<Shared>,
    live: AtomicBool,
}

impl MemoryRegion for TcpMr {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn lkey(&self) -> u32 {
        self.key
    }
    fn rkey(&self) -> u32 {
        self.key
    }
    fn addr(&self) -> u64 {
        self.addr
    }
    fn length(&self) -> u64 {
        self.length
    }
    fn access(&self) -> u32 {
        self.access
    }
    fn pd_id(&self) -> u32 {
        self.pd
    }
    fn deregister(&self) {
        if !self.live.swap(false, Ordering::SeqCst) {
            return;
        }
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        {
            let mut keys = shared.keys.lock();
            keys.remove(self.key);
            // A window bound into this region must not outlive it: its range would then name
            // memory the consumer may unmap.
            keys.remove_windows_of(self.key);
            keys.free_index(self.key >> 8);
        }
        // After the registry lock: no peer copies through the key any more, and moving the
        // pages back takes hundreds of microseconds. Waits for a move of them in progress.
        let arena = shared.arenas.lock().remove(&self.key);
        drop(arena);
    }
}

impl Drop for TcpMr {
    fn drop(&mut self) {
        self.deregister();
    }
}

pub(crate) struct TcpMw {
    index: u32,
    /// The rkey of the last bind posted (index << 8 | generation): what the window carries
    /// and what the next bind derives from. A bind posted behind a fence takes effect later.
    rkey: Mutex<u32>,
    /// The key under which the window's current binding is in the key registry (absent
    /// there when the window grants nothing).
    mapped: Mutex<u32>,
    bound: AtomicBool,
    pd: u32,
    shared: Weak<Shared>,
    live: AtomicBool,
}

impl TcpMw {
    /// Applies a bind (mr Some) or unbind (None) with the new rkey; called by the engine in QP
    /// order. Checks the region key is live, in the same PD, and covers the range.
    fn apply_bind(
        &self,
        keys: &mut Keys,
        mr_key: Option<u32>,
        addr: u64,
        length: u64,
        access: u32,
        new_rkey: u32,
    ) -> bool {
        if !self.live.load(Ordering::SeqCst) || new_rkey >> 8 != self.index {
            return false;
        }
        let mut cur = self.mapped.lock();
        keys.remove(*cur);
        *cur = new_rkey;
        self.bound.store(false, Ordering::SeqCst);
        let Some(mr_key) = mr_key else { return true };
        let Some(mr) = keys.get(mr_key) else {
            return false;
        };
        let inside = addr >= mr.addr
            && addr
                .checked_add(length)
                .map(|e| e <= mr.addr + mr.len)
                .unwrap_or(false);
        if mr.window || mr.pd != self.pd || !inside {
            return false;
        }
        keys.insert(
            new_rkey,
            KeyEntry {
                addr,
                len: length,
                access,
                pd: self.pd,
                window: true,
                region: mr_key,
                arena: mr.arena.map(|span| span.advanced(addr - mr.addr)),
            },
        );
        self.bound.store(true, Ordering::SeqCst);
        true
    }

    /// A peer's send-with-invalidate names `rkey`: if that is this window's current binding,
    /// in the PD of the receiving QP, the binding ends (the window grants nothing until bound
    /// again). Returns whether it did.
    fn remote_invalidate(&self, keys: &mut Keys, rkey: u32, pd: u32) -> bool {
        let cur = self.mapped.lock();
        if !self.live.load(Ordering::SeqCst)
            || *cur != rkey
            || self.pd != pd
            || !self.bound.load(Ordering::SeqCst)
        {
            return false;
        }
        keys.remove(rkey);
        self.bound.store(false, Ordering::SeqCst);
        true
    }

    /// A bind on this window was posted with `rkey` (called by the engine at post time).
    pub(crate) fn note_posted(&self, rkey: u32) {
        if rkey >> 8 == self.index {
            *self.rkey.lock() = rkey;
        }
    }
}

impl MemoryWindow for TcpMw {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn rkey(&self) -> u32 {
        *self.rkey.lock()
    }
    fn next_rkey(&self) -> u32 {
        let cur = (self.index << 8) | (*self.rkey.lock() & 0xff);
        match self.shared.upgrade() {
            Some(shared) => shared.keys.lock().next_generation(cur),
            // The device is gone: any key will do, binds on it fail.
            None => (cur & !0xff) | ((cur + 1) & 0xff),
        }
    }
    fn pd_id(&self) -> u32 {
        self.pd
    }
    fn invalidate(&self) {
        if let Some(shared) = self.shared.upgrade() {
            let mut keys = shared.keys.lock();
            keys.remove(*self.mapped.lock());
            self.bound.store(false, Ordering::SeqCst);
        }
    }
    fn dealloc(&self) {
        if !self.live.swap(false, Ordering::SeqCst) {
            return;
        }
        if let Some(shared) = self.shared.upgrade() {
            let mut keys = shared.keys.lock();
            keys.remove(*self.mapped.lock());
            keys.free_index(self.index);
            drop(keys);
            shared.mws.lock().remove(&self.index);
        }
    }
}

impl Drop for TcpMw {
    fn drop(&mut self) {
        self.dealloc();
    }
}

pub(crate) struct TcpCq {
    pub(crate) id: u64,
    queue: Mutex<VecDeque<WorkCompletion>>,
    notify: Mutex<Option<NotifyFn>>,
    depth: AtomicU32,
    shared: Weak<Shared>,
    /// Wakes a thread blocked in `drive` (written by `interrupt`, polled by the driver);
    /// made on the first drive (None if the pair could not be made: then nobody drives).
    waker: OnceLock<Option<(UnixStream, UnixStream)>>,
    /// The thread in `drive`, if any.
    driver: Mutex<Option<ThreadId>>,
    /// The driver's (or poller's) read buffer.
    buf: Mutex<Vec<u8>>,
    /// Which connections a poller's look reads (readiness.rs).
    pub(crate) readiness: readiness::CqReadiness,
    /// The poller's lists, taken with `buf`.
    looks: Mutex<Looks>,
    /// A connection could not be watched in `readiness`: looks read every connection.
    scan_all: AtomicBool,
    /// Drives in a row whose spin window ended with nothing to read (see `drive`).
    spin_misses: AtomicU32,
    /// Connections stay claimed between the drives of one wait (see `end_drive`).
    keeps_claims: AtomicBool,
    /// A poller's look turned the target signal of a connection off (sigio.rs): the next
    /// completion found turns it on again (`rearm`).
    disarmed: AtomicBool,
}

/// A polling consumer's lists (`TcpCq::progress`).
#[derive(Default)]
struct Looks {
    /// The connections this look reads.
    ready: Vec<u64>,
    /// Those the last look left quiet, whose small frames no poller is told of: read each look.
    quiet: Vec<u64>,
}

/// Read buffer of a driving application thread (large payloads are read past it, straight
/// into their frames).
const DRIVE_BUF: usize = 64 * 1024;
/// Longest single wait of a driver, so that it looks at its EVD, and claims connections
/// established since, regularly.
const DRIVE_MAX_MS: u64 = 50;
/// A driver stops spinning after this many spins in a row that found nothing (the traffic is
/// slower than the spin window: spinning only burns a CPU), and tries again every
/// `SPIN_RETRY`-th drive (a power of two).
const SPIN_GIVE_UP: u32 = 8;
const SPIN_RETRY: u32 = 64;

impl TcpCq {
    /// Queues a completion (never dropped: a CQ past its depth keeps growing; the EVD above
    /// reports the overflow).
    pub(crate) fn push(&self, wc: WorkCompletion) {
        self.queue.lock().push_back(wc);
    }

    /// A consumer that polled found a completion: its connections get their target signal
    /// back (`Engine::rearm_for_cq`) before it goes back to spinning on its memory.
    fn rearm(&self) {
        let Some(sh) = self.shared.upgrade() else {
            return;
        };
        // No `run`: what it delivers could call back into the consumer's EVD, which polls.
        self.disarmed.store(false, Ordering::Relaxed);
        sh.engine.lock().rearm_for_cq(self.id);
        if sh.sweep_asked() {
            sh.wake(); // a signal handler came meanwhile: left to the progress thread
        }
    }

    /// The queue, unless another thread holds it (for a signal handler: sigio.rs).
    pub(crate) fn try_queue(
        &self,
    ) -> Option<parking_lot::MutexGuard<'_, VecDeque<WorkCompletion>>> {
        self.queue.try_lock()
    }

    /// The pair that wakes a driver, made at first use (by `drive` or by `interrupt`, which
    /// may come first: its byte then waits for the driver).
    fn waker(&self) -> Option<&(UnixStream, UnixStream)> {
        self.waker
            .get_or_init(|| {
                let (tx, rx) = UnixStream::pair().ok()?;
                tx.set_nonblocking(true).ok()?;
                rx.set_nonblocking(true).ok()?;
                Some((tx, rx))
            })
            .as_ref()
    }

    /// Whether a connection could not be put in this CQ's readiness sets (`readiness_failed`).
    pub(crate) fn scan_all(&self) -> bool {
        self.scan_all.load(Ordering::Relaxed)
    }

    /// A connection could not be put in this CQ's readiness sets: from now on a poller's look
    /// reads every connection of the CQ, as it did before there were such sets.
    pub(crate) fn readiness_failed(&self) {
        self.scan_all.store(true, Ordering::Relaxed);
    }

    fn notify(&self) {
        let n = self.notify.lock().clone();
        if let Some(n) = n {
            n();
        }
    }
}

impl CompletionQueue for TcpCq {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn id(&self) -> u64 {
        self.id
    }
    fn poll(&self, max: usize, out: &mut Vec<WorkCompletion>) -> usize {
        let n = {
            let mut q = self.queue.lock();
            let n = max.min(q.len());
            out.extend(q.drain(..n));
            n
        };
        if n > 0 && self.disarmed.load(Ordering::Relaxed) {
            self.rearm();
        }
        n
    }
    fn set_notify(&self, notify: Option<NotifyFn>) {
        *self.notify.lock() = notify;
    }
    fn resize(&self, depth: u32) -> Result<()> {
        self.depth.store(depth, Ordering::SeqCst);
        Ok(())
    }
    fn depth(&self) -> u32 {
        self.depth.load(Ordering::SeqCst)
    }

    /// The waiting application thread claims the connections of this CQ's QPs from the
    /// progress thread (which leaves them out of its poll set meanwhile), polls them itself
    /// and runs the engine on what arrives; the completions it produces are delivered on this
    /// thread, so the waiter needs no wake-up. The claim lasts the whole wait: the next drive
    /// of the same wait keeps it, and `end_drive` ends it. (Ending it at each drive's return,
    /// as before, woke the progress thread each time, to poll a set the waiter's next drive
    /// made stale again at once: on a target whose application waits, one wake-up per request
    /// served, and the progress thread then took the CPU of the peer polling for the answer.)
    fn drive(&self, deadline: Option<Instant>) -> bool {
        let Some(sh) = self.shared.upgrade() else {
            return false;
        };
        if sh.stopped.load(Ordering::SeqCst) {
            return false;
        }
        let Some((_, wake_rx)) = self.waker() else {
            return false;
        };
        let (claimed, sets) = sh.run(|eng, _| eng.claim_for_cq(self));
        if claimed.is_empty() && sets.is_empty() {
            return false;
        }
        *self.driver.lock() = Some(std::thread::current().id());
        let ms = match deadline {
            None => DRIVE_MAX_MS,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                (left.as_micros().div_ceil(1000) as u64).min(DRIVE_MAX_MS)
            }
        };
        // The waker, the claimed connections, the parked sets, then the rings' bells.
        let mut fds = Vec::with_capacity(claimed.len() + sets.len() + 1);
        let mut rings = engine::RingWatch::default();
        fds.push(sys::PollFd::new(wake_rx.as_raw_fd(), sys::POLLIN));
        for c in &claimed {
            let input = if c.input { sys::POLLIN } else { 0 };
            let output = if c.output && c.ring_out.is_none() {
                sys::POLLOUT
            } else {
                0
            };
            if let Some(ring) = c.ring.as_ref().filter(|_| c.input) {
                rings.watch_input(fds.len(), ring);
            }
            if let Some(ring) = c.ring_out.as_ref().filter(|_| c.output) {
                rings.watch_output(fds.len(), ring);
            }
            fds.push(sys::PollFd::new(c.fd, input | output));
        }
        for set in &sets {
            if let Some(fd) = set.readiness.parked_fd() {
                fds.push(sys::PollFd::new(fd, sys::POLLIN));
            }
        }
        rings.add_bells(&mut fds);
        // Spin first when spinning has paid lately: an answer a round trip away is then read
        // without this thread going to sleep and being woken for it.
        let spin = engine::spin_window();
        let misses = self.spin_misses.load(Ordering::Relaxed);
        let spin_now = !spin.is_zero() && (misses < SPIN_GIVE_UP || misses & (SPIN_RETRY - 1) == 0);
        let mut polled = Ok(0);
        let ready = rings.begin();
        if ready {
            polled = sys::poll(&mut fds, 0);
        } else if spin_now {
            let until = Instant::now() + spin;
            let until = deadline.map_or(until, |d| d.min(until));
            polled = engine::spin_poll(&mut fds, until, false);
        }
        let caught = ready || matches!(polled, Ok(n) if n > 0);
        let misses = if caught { 0 } else { misses.saturating_add(1) };
        self.spin_misses.store(misses, Ordering::Relaxed);
        if !caught {
            polled = sys::poll(&mut fds, ms as i32);
        }
        rings.end(&mut fds);
        if let Err(e) = polled {
            log::error!("poll failed: {e}");
        }
        if fds[0].revents() != 0 {
            let mut drain = [0u8; 64];
            while let Ok(n) = (&*wake_rx).read(&mut drain) {
                if n == 0 {
                    break;
                }
            }
        }
        let mut buf = self.buf.lock();
        if buf.len() < DRIVE_BUF {
            buf.resize(DRIVE_BUF, 0);
        }
        sh.run(|eng, sh| {
            for (c, fd) in claimed.iter().zip(fds.iter().skip(1)) {
                let rev = fd.revents();
                if rev & (sys::POLLIN | sys::POLLHUP | sys::POLLERR | sys::POLLNVAL) != 0 {
                    eng.read_conn(sh, c.token, &mut buf);
                }
                if rev & sys::POLLOUT != 0 {
                    eng.try_write(c.token);
                }
            }
            let parked_fds = fds.iter().skip(1 + claimed.len());
            let mut ready = Vec::new();
            for (set, fd) in sets.iter().zip(parked_fds) {
                if fd.revents() != 0 {
                    set.readiness.parked_ready(&mut ready);
                }
            }
            for token in ready {
                if eng.parked(token) {
                    eng.read_conn(sh, token, &mut buf);
                }
            }
            eng.retry_drained(sh);
            eng.settle_failed_writes(sh, &mut buf);
            // The claims stay until the wait ends (`end_drive`).
            self.keeps_claims.store(true, Ordering::Relaxed);
        });
        *self.driver.lock() = None;
        true
    }

    /// The wait that drove ends: the connections its drives claimed go back to the progress
    /// thread (see `Engine::release_cq_claims`).
    fn end_drive(&self) {
        if !self.keeps_claims.swap(false, Ordering::Relaxed) {
            return;
        }
        if let Some(sh) = self.shared.upgrade() {
            sh.run(|eng, _| eng.release_cq_claims(self.id));
        }
    }

    /// A polling consumer's look at its connections: reads, on this thread and without
    /// waiting, those that hold something (readiness.rs: the kernel's word for sockets, a load
    /// for same-host rings) and those it left quiet; the engine is not taken when none does.
    /// The progress thread still watches them (see `PollSet::gather` in engine/progress.rs).
    /// Skipped, not waited for, when another thread holds the engine.
    fn progress(&self) -> bool {
        let Some(sh) = self.shared.upgrade() else {
            return false;
        };
        if sh.stopped.load(Ordering::SeqCst) {
            return false;
        }
        let Some(mut buf) = self.buf.try_lock() else {
            return false; // another thread of this CQ is at it
        };
        let mut looks = self.looks.lock();
        let Looks { ready, quiet } = &mut *looks;
        ready.clear();
        let scan_all = self.scan_all.load(Ordering::Relaxed);
        // Rings marked on the device's board (any CQ's: a look reads what it takes).
        let board = sh.samehost.board().filter(|b| !scan_all && b.marked());
        if !scan_all {
            self.readiness.ready(ready);
            ready.extend_from_slice(quiet);
            if ready.is_empty() && board.is_none() {
                return false;
            }
        }
        if buf.len() < DRIVE_BUF {
            buf.resize(DRIVE_BUF, 0);
        }
        sh.try_run(|eng, sh| {
            if scan_all {
                *ready = eng.pollable_for_cq(self.id);
            } else {
                if let Some(b) = board {
                    b.take(ready);
                }
                ready.sort_unstable();
                ready.dedup();
            }
            quiet.clear();
            let mut looked = false;
            for &token in ready.iter() {
                if !eng.pollable(token) {
                    continue;
                }
                looked = true;
                if eng.note_poller(token) {
                    self.disarmed.store(true, Ordering::Relaxed);
                }
                eng.look_at_conn(sh, token, &mut buf);
                eng.try_write(token);
                if eng.settle_quiet(token) {
                    quiet.push(token);
                }
            }
            eng.retry_drained(sh);
            eng.settle_failed_writes(sh, &mut buf);
            looked
        })
        .unwrap_or(false)
    }

    fn interrupt(&self) {
        // The driver itself needs no wake-up: it looks at its EVD again once `drive` returns.
        if *self.driver.lock() == Some(std::thread::current().id()) {
            return;
        }
        if let Some((tx, _)) = self.waker() {
            let _ = (&*tx).write(&[1u8]);
        }
    }
}

struct TcpQp {
    qp_num: u32,
    shared: Arc<Shared>,
    /// Its same-host RDMA reads and writes, without the engine (engine/lane.rs).
    lane: Arc<engine::Lane>,
}

impl QueuePair for TcpQp {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn qp_num(&self) -> u32 {
        self.qp_num
    }
    fn state(&self) -> QpState {
        self.shared.run(|eng, _| eng.qp_state(self.qp_num))
    }
    fn post_send(&self, wr: &SendWr) -> Result<()> {
        if let Some(cq) = self.lane.post(&self.shared, wr) {
            cq.notify();
            return Ok(());
        }
        // The engine keeps the request until it completes.
        self.shared
            .run(|eng, sh| eng.post_send(sh, self.qp_num, wr.clone()))
    }
    fn post_recv(&self, wr: RecvWr) -> Result<()> {
        self.shared
            .run(|eng, sh| eng.post_recv(sh, self.qp_num, wr))
    }
    fn reset(&self) -> Result<()> {
        self.shared.run(|eng, _| eng.reset_qp(self.qp_num))
    }
    fn posted_recvs(&self) -> u32 {
        self.shared.run(|eng, _| eng.posted_recvs(self.qp_num))
    }
    fn local_addr(&self) -> Option<SocketAddrV4> {
        self.shared.run(|eng, _| eng.qp_addrs(self.qp_num).0)
    }
    fn remote_addr(&self) -> Option<SocketAddrV4> {
        self.shared.run(|eng, _| eng.qp_addrs(self.qp_num).1)
    }
    fn destroy(&self) {
        self.shared.run(|eng, sh| eng.destroy_qp(sh, self.qp_num));
    }
    fn post_send_ud(&self, wr: SendWr, ah: &Arc<dyn AddressHandle>, remote_qpn: u32) -> Result<()> {
        // Our address handles only; the QP number of a datagram QP is its UDP port.
        let addr = ah
            .as_any()
            .downcast_ref::<TcpAh>()
            .map(|a| a.addr)
            .ok_or(Error::Foreign)?;
        let port = u16::try_from(remote_qpn).map_err(|_| Error::Foreign)?;
        let dest = SocketAddrV4::new(addr, port);
        self.shared
            .run(|eng, sh| eng.post_send_ud(sh, self.qp_num, wr, dest))
    }
}

impl Drop for TcpQp {
    fn drop(&mut self) {
        self.destroy();
    }
}

pub(crate) struct TcpSrq {
    id: u64,
    pub(crate) pd: u32,
    pub(crate) queue: Mutex<VecDeque<RecvWr>>,
    max_wr: AtomicU32,
    max_sge: u32,
    shared: Weak<Shared>,
}

impl SharedReceiveQueue for TcpSrq {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn id(&self) -> u64 {
        self.id
    }
    fn post_recv(&self, wr: RecvWr) -> Result<()> {
        if wr.sgl.len() > self.max_sge as usize {
            return Err(Error::TooLong);
        }
        {
            let mut q = self.queue.lock();
            if q.len() >= self.max_wr.load(Ordering::SeqCst) as usize {
                return Err(Error::NoResource(Resource::Srq));
            }
            q.push_back(wr);
        }
        // A send may be waiting for exactly this receive.
        if let Some(shared) = self.shared.upgrade() {
            let id = self.id;
            shared.run(|eng, sh| eng.retry_held_for_srq(sh, id));
        }
        Ok(())
    }
    fn posted(&self) -> u32 {
        self.queue.lock().len() as u32
    }
    fn max_wr(&self) -> u32 {
        self.max_wr.load(Ordering::SeqCst)
    }
    fn resize(&self, max_wr: u32) -> Result<()> {
        self.max_wr.store(max_wr, Ordering::SeqCst);
        Ok(())
    }
    fn destroy(&self) {
        // Receives never consumed are dropped with the SRQ; DAT forbids freeing an SRQ that
        // EPs still use, so no connection can need them.
        self.queue.lock().clear();
    }
}

struct TcpListenerHandle {
    id: u64,
    port: u16,
    shared: Weak<Shared>,
}

impl Listener for TcpListenerHandle {
    fn id(&self) -> u64 {
        self.id
    }
    fn port(&self) -> u16 {
        self.port
    }
    fn close(&self) {
        if let Some(shared) = self.shared.upgrade() {
            shared.run(|eng, _| {
                // Dropped here: the port is free on return (ListenerEntry's drop).
                eng.listeners.remove(&self.id);
                eng.wake_needed = true;
            });
        }
    }
}

impl Drop for TcpListenerHandle {
    fn drop(&mut self) {
        self.close();
    }
}

/// What the DAT tests' helpers (the `daplrs` crate's testing.rs) need of this backend: the
/// same-host mode of devices a test thread opens, and private page-aligned memory for test
/// buffers. Public with the feature `testing`, which only the `daplrs` crate's tests enable.
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod test_support {
    pub use super::samehost::arena::test_pages::Pages;
    pub use super::samehost::{test_hooks, Mode, Stats};
}

#[cfg(test)]
mod tests;
