//! The same-host fast path for RDMA READ and RDMA WRITE.
//!
//! When both ends of a connection are processes of this host and the kernel lets each attach
//! to the other's memory (process_vm_readv/writev: the ptrace access check, the same PID
//! namespace), an initiator moves an RDMA read's or write's bytes itself, on the posting
//! thread, between its registered memory and the target's, and completes the request before
//! the post returns: no frame crosses the socket. Everything else (sends, atomics,
//! write-with-immediate, connection management, and every read or write the fast path
//! declines) is framed as over TCP, but the frames travel through a shared-memory ring per
//! direction instead of the socket (ring.rs), which then only wakes sleepers and says when
//! the peer is gone.
//!
//! For that, each device publishes its key registry (keys.rs) in a table in a memfd mapped
//! MAP_SHARED: a header (magic, version, a random nonce, capacity, entry count), a
//! process-shared robust pthread mutex, and open-addressed slots by key index. Per device,
//! not per process: a device's keys, protection domains and lifetime are its own (two IAs of
//! one process are two registries), and a table dies with its device.
//!
//! The registry's invariant (once deregistration returns, no copy touches the range) holds
//! across processes because the owner changes a slot only under the table's mutex, and a peer
//! holds that mutex across its check of the slot AND its process_vm call. The mutex is robust:
//! a peer killed while holding it hands it to the next locker (EOWNERDEAD), and the table is
//! still consistent, since only its owner ever writes it. A peer that maps our table already
//! has ptrace rights over us (opening /proc/<pid>/fd/<n> needs them), so it is trusted no
//! less than that; we still treat what we read from a peer's table as untrusted (bounded,
//! read once), and bound our wait for its mutex.
//!
//! Registered memory that peers copy through often moves into an *arena*, a memfd peers map,
//! so that their copies need no system call (daplrs_backend::arena). Peers ask for it: the table has a
//! small ring of requests, written under its mutex, and a futex word (the bell) that the
//! owner's keeper thread sleeps on; the owner checks each key asked for and moves what it
//! may. What a peer writes there can make us move a region of ours, never touch another.
//!
//! Control: DAPLRS_SAME_HOST=auto (default: when possible) | never (always TCP) | require (a
//! connection that cannot use the path fails, so tests can prove it is used), read when the
//! device opens. Log target `daplrs::samehost`: whether each connection took the path, and why
//! not.

pub(crate) use daplrs_backend::arena;
pub(crate) mod board;
pub(crate) mod peer;
pub(crate) mod peer_table;
pub(crate) mod ring;
pub(crate) mod sys;

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::keys::{KeyEntry, Keys};
use super::wire::SameHostOffer;
use arena::ArenaSpan;
use daplrs_backend::intmap::{IntMap, IntSet};
use daplrs_backend::memfile;
use peer_table::{Moved, PeerMapping, PeerTable};

pub(crate) const LOG: &str = "daplrs::samehost";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Auto,
    Never,
    Require,
}

impl Mode {
    /// DAPLRS_SAME_HOST's value; anything unknown is `auto` (with a warning).
    pub fn parse(value: Option<&str>) -> Mode {
        match value.map(str::trim) {
            None | Some("") | Some("auto") => Mode::Auto,
            Some("never") => Mode::Never,
            Some("require") => Mode::Require,
            Some(other) => {
                log::warn!(target: LOG, "DAPLRS_SAME_HOST={other:?}: not auto|never|require; using auto");
                Mode::Auto
            }
        }
    }

    /// The mode of a device opening now: DAPLRS_SAME_HOST (tests: their thread's override).
    pub fn for_new_device() -> Mode {
        #[cfg(any(test, feature = "testing"))]
        if let Some(m) = test_hooks::MODE.with(|m| m.get()) {
            return m;
        }
        Mode::parse(std::env::var("DAPLRS_SAME_HOST").ok().as_deref())
    }
}

// ---- the table's layout ----------------------------------------------------------------------

const MAGIC: u64 = u64::from_le_bytes(*b"DAPLRSKT");
const VERSION: u32 = 3;
const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 8;
const OFF_CAPACITY: usize = 12;
const OFF_NONCE: usize = 16;
const OFF_COUNT: usize = 24;
/// The mutex guarding the slots and the requests.
const OFF_MUTEX: usize = 64;
/// The owner's liveness: a robust mutex its keeper thread holds while the table lives.
const OFF_ALIVE: usize = 128;
/// Peers' requests that the owner map a key's memory into an arena (`Heat`): a futex word
/// peers add one to after each request (the owner's keeper thread sleeps on it), the count of
/// requests ever made, and the last REQUESTS keys asked for. Peers write them under the mutex.
const OFF_BELL: usize = 192;
const OFF_REQ_COUNT: usize = 196;
const OFF_REQS: usize = 200;
const REQUESTS: usize = 32;
const OFF_SLOTS: usize = 384;
const _: () = assert!(OFF_MUTEX + sys::MUTEX_SIZE <= OFF_ALIVE);
const _: () = assert!(OFF_ALIVE + sys::MUTEX_SIZE <= OFF_BELL);
const _: () = assert!(OFF_REQS + 4 * REQUESTS <= OFF_SLOTS);

/// One slot: state (0 empty, 1 live), key, addr, len, access, pd, window (0/1), region, and
/// the key's arena (daplrs_backend::arena): our descriptor of its memfd (NO_ARENA: none), its inode, and
/// the offset of the key's first byte in it.
const SLOT_LEN: usize = 64;
const S_STATE: usize = 0;
const S_KEY: usize = 4;
const S_ADDR: usize = 8;
const S_LEN: usize = 16;
const S_ACCESS: usize = 24;
const S_PD: usize = 28;
const S_WINDOW: usize = 32;
const S_REGION: usize = 36;
const S_ARENA_FD: usize = 40;
const S_ARENA_INO: usize = 48;
const S_ARENA_OFF: usize = 56;
const NO_ARENA: u32 = u32::MAX;
const LIVE: u32 = 1;
/// Slots a key may take, from its home slot on; a key that finds none free is not published
/// (peers then use TCP for it), and a lookup reads at most this many.
const PROBES: usize = 16;
/// The largest table a peer's offer may make us map.
const MAX_TABLE_BYTES: u64 = 1 << 30;
/// The most slots a table has, whatever the device allows: every key lands on a random slot,
/// so in time every page of the table is touched (memory of the memfd's, in the owner and in
/// each peer that maps it): 4 MiB at this size. A key beyond it goes over TCP.
const MAX_SLOTS: usize = 1 << 16;
/// How long a peer waits for a table's mutex before it uses TCP for that request instead (a
/// live holder never keeps it longer than one copy; this bounds a misbehaving one).
const PEER_LOCK_LIMIT: Duration = Duration::from_millis(20);

fn table_bytes(capacity: usize) -> usize {
    OFF_SLOTS + capacity * SLOT_LEN
}

fn home(key: u32, capacity: usize) -> usize {
    // Indexes are random (keys.rs), so the index itself spreads keys over the slots.
    (key >> 8) as usize % capacity
}

/// Our own table: the memfd and our mapping of it.
struct Table {
    map: sys::SharedMap,
    fd: OwnedFd,
    capacity: usize,
}

/// What the owner does with the keys peers asked it to map into arenas (`Heat`): the device
/// sets it once it can (`Local::set_promoter`); requests that come before are dropped, and
/// the peers ask again later.
pub(crate) type Promoter = Box<dyn Fn(&[u32]) + Send + Sync>;

/// The thread that holds a table's liveness mutex (OFF_ALIVE) for as long as its device
/// lives: peers check it before each copy, without a system call, so that a peer whose process
/// died (and whose pid may come back as another process) is never copied to. It also serves
/// the peers' requests (OFF_BELL), asleep on the bell between them. Dropping this ends the
/// thread, which releases the mutex (peers then see the table as gone).
struct Keeper {
    table: Arc<Table>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Keeper {
    fn drop(&mut self) {
        // Released before the device's close returns, so that peers stop copying.
        self.stop.store(true, Ordering::SeqCst);
        let bell = self.table.map.atomic_u32(OFF_BELL);
        bell.fetch_add(1, Ordering::SeqCst);
        sys::futex_wake(bell);
        if let Some(t) = self.thread.take() {
            // The keeper itself drops the device when its promoter held the last reference:
            // it ends right after.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

impl Keeper {
    fn start(table: &Arc<Table>, promoter: Arc<OnceLock<Promoter>>) -> std::io::Result<Keeper> {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (t, until) = (table.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("daplrs-samehost".into())
            // The promoter moves pages (daplrs_backend::arena) on this thread.
            .stack_size(256 * 1024)
            .spawn(move || {
                crate::sigio::block_here();
                let held = t.map.lock(OFF_ALIVE, None);
                let ok = held.is_ok();
                let _ = ready_tx.send(held);
                if ok {
                    t.serve_requests(&until, &promoter);
                    t.map.unlock(OFF_ALIVE);
                }
            })?;
        ready_rx
            .recv()
            .map_err(|_| std::io::Error::other("keeper thread ended"))??;
        Ok(Keeper {
            table: table.clone(),
            stop,
            thread: Some(thread),
        })
    }
}

/// Counters tests and diagnostics read.
#[derive(Default)]
pub struct Stats {
    /// RDMA reads and writes completed on the same-host path.
    pub inline_ops: AtomicU64,
    /// Of those, the ones copied through a mapping of the peer's arena (daplrs_backend::arena).
    pub mapped_ops: AtomicU64,
    /// Connections whose peer table we mapped.
    pub attached: AtomicU64,
    /// Connections whose incoming frames switched to our ring (ring.rs).
    pub rings: AtomicU64,
    /// Connections whose peer declined our offer (it could not map our table or our ring,
    /// as from another PID namespace): its frames stay on the socket.
    pub declined: AtomicU64,
}

/// A device's side of the same-host path.
pub(crate) struct Local {
    pub mode: Mode,
    table: Option<Arc<Table>>,
    /// A copy of the table's nonce in our private memory: the address peers probe.
    nonce_copy: Box<u64>,
    pub stats: Arc<Stats>,
    _keeper: Option<Keeper>,
    /// Peers' tables mapped here, by (pid, nonce), shared by the connections to them.
    peers: parking_lot::Mutex<IntMap<(u32, u64), std::sync::Weak<PeerMapping>>>,
    /// Registrations make arenas (daplrs_backend::arena): the path is supported and DAPLRS_SAME_HOST_MAP
    /// allows it.
    shares_pages: bool,
    /// What the keeper hands peers' requests to.
    promoter: Arc<OnceLock<Promoter>>,
    /// Where the writers of our rings mark them (board.rs): made with the first ring (None:
    /// it could not be, every look reads every ring).
    board: OnceLock<Option<Arc<board::Board>>>,
    /// Tests: every peer's offer is refused, as from another PID namespace.
    #[cfg(any(test, feature = "testing"))]
    refuse_offers: bool,
}

impl Local {
    /// Creates the device's table (unless `mode` is never), room for `max_keys` keys.
    pub fn new(mode: Mode, max_keys: usize, device: &str) -> Local {
        let stats = Arc::new(Stats::default());
        #[cfg(any(test, feature = "testing"))]
        test_hooks::OPENED.with(|o| o.borrow_mut().push(stats.clone()));
        let mut local = Local {
            mode,
            table: None,
            nonce_copy: Box::new(0),
            stats,
            _keeper: None,
            peers: Default::default(),
            shares_pages: false,
            promoter: Default::default(),
            board: OnceLock::new(),
            #[cfg(any(test, feature = "testing"))]
            refuse_offers: test_hooks::REFUSE_OFFERS.with(|r| r.get()),
        };
        if mode == Mode::Never {
            return local;
        }
        let made = Table::create(max_keys.clamp(1, MAX_SLOTS)).and_then(|t| {
            let t = Arc::new(t);
            Ok((Keeper::start(&t, local.promoter.clone())?, t))
        });
        match made {
            Ok((keeper, t)) => {
                *local.nonce_copy = t.map.read_u64(OFF_NONCE);
                local.table = Some(t);
                local._keeper = Some(keeper);
                local.shares_pages = arena::enabled();
            }
            Err(e) => log::info!(target: LOG, "{device}: no same-host table ({e}); TCP only"),
        }
        local
    }

    /// A slot on our board for the ring of connection `token` (None: the ring is read at
    /// every look).
    pub fn board_slot(&self, token: u64) -> Option<board::Slot> {
        let board = self.board.get_or_init(|| {
            board::Board::create()
                .map_err(|e| log::info!(target: LOG, "no ready board ({e}): looks read every ring"))
                .ok()
        });
        board.as_ref()?.slot(token)
    }

    /// Our board, once a ring made it.
    pub fn board(&self) -> Option<&board::Board> {
        self.board.get()?.as_deref()
    }

    /// Whether we advertise the path (and can honour what advertising promises: an offer).
    pub fn supported(&self) -> bool {
        self.mode != Mode::Never && self.table.is_some()
    }

    /// Whether memory registered on this device may move into arenas peers map (daplrs_backend::arena).
    pub fn shares_pages(&self) -> bool {
        self.shares_pages
    }

    /// Sets what is done with the keys peers ask us to map into arenas (once; it runs on the
    /// keeper thread). Without it, or where pages are not shared, requests are dropped.
    pub fn set_promoter(&self, promoter: Promoter) {
        if self.shares_pages {
            let _ = self.promoter.set(promoter);
        }
    }

    /// Runs `f` holding our table's mutex, so that no peer copies meanwhile (the pages of a
    /// key move into an arena under it: a peer's write into the old pages would be lost).
    pub fn with_table_locked<T>(&self, f: impl FnOnce() -> T) -> T {
        match self.table_lock() {
            Some(lock) => lock.locked(f),
            None => f(),
        }
    }

    /// Our table's mutex, for whoever must exclude peers' copies later (see `TableLock`).
    pub fn table_lock(&self) -> Option<TableLock> {
        self.table.clone().map(TableLock)
    }

    /// The publisher the key registry updates the table through.
    pub fn publisher(&self) -> Option<Publisher> {
        self.table.as_ref().map(|t| Publisher {
            table: t.clone(),
            slot_of: IntMap::default(),
            used: IntSet::default(),
        })
    }

    /// Checks a peer's offer (see `PeerTable::attach`), reusing our mapping of its table if
    /// another connection already has one.
    pub fn attach(&self, offer: &SameHostOffer) -> Result<PeerTable, Refusal> {
        #[cfg(any(test, feature = "testing"))]
        if self.refuse_offers {
            return Err("refused by the test".into());
        }
        PeerTable::attach_reusing(&mut self.peers.lock(), offer)
    }

    /// Our offer for a connection whose local QP is in protection domain `pd`, naming our
    /// ring for it (`ring_fd`) if we made one.
    pub fn offer(&self, pd: u32, ring_fd: Option<u32>) -> Option<SameHostOffer> {
        let t = self.table.as_ref()?;
        Some(SameHostOffer {
            pid: std::process::id(),
            fd: t.fd.as_raw_fd() as u32,
            nonce: *self.nonce_copy,
            nonce_addr: &*self.nonce_copy as *const u64 as u64,
            pd,
            ring_fd,
        })
    }
}

/// Our table's mutex as a handle: held, no peer copies into our memory (a peer holds it
/// across its check and its copy). A connection keeps one to withdraw the receives it
/// published (ring.rs) before it flushes them.
#[derive(Clone)]
pub(crate) struct TableLock(Arc<Table>);

impl TableLock {
    pub fn locked<T>(&self, f: impl FnOnce() -> T) -> T {
        let map = &self.0.map;
        match map.lock(OFF_MUTEX, None) {
            Ok(()) => {
                let r = f();
                map.unlock(OFF_MUTEX);
                r
            }
            // Unrecoverable: no peer can lock it either (see Publisher::locked).
            Err(_) => f(),
        }
    }
}

impl Table {
    fn create(capacity: usize) -> std::io::Result<Table> {
        let len = table_bytes(capacity);
        let fd = daplrs_backend::memfile::create_sealed("daplrs-keys", len)?;
        let map = sys::SharedMap::map(fd.as_raw_fd(), len)?;
        let mut nonce = [0u8; 8];
        getrandom(&mut nonce);
        map.init_robust_mutex(OFF_MUTEX)?;
        map.init_robust_mutex(OFF_ALIVE)?;
        map.write_u32(OFF_VERSION, VERSION);
        map.write_u32(OFF_CAPACITY, capacity as u32);
        map.write_u64(OFF_NONCE, u64::from_ne_bytes(nonce));
        map.write_u32(OFF_COUNT, 0);
        // The magic last: a table is offered only after this anyway, but a reader that sees
        // the magic sees a whole header.
        map.write_u64(OFF_MAGIC, MAGIC);
        Ok(Table { map, fd, capacity })
    }
}

impl Table {
    /// The keeper's loop until `stop`: asleep on the bell, then the keys requested since the
    /// last look go to the promoter.
    fn serve_requests(&self, stop: &std::sync::atomic::AtomicBool, promoter: &OnceLock<Promoter>) {
        let bell = self.map.atomic_u32(OFF_BELL);
        let mut seen = 0u32;
        loop {
            let rung = bell.load(Ordering::SeqCst);
            if stop.load(Ordering::SeqCst) {
                return;
            }
            let keys = self.take_requests(&mut seen);
            if let (false, Some(promote)) = (keys.is_empty(), promoter.get()) {
                promote(&keys);
            }
            sys::futex_wait(bell, rung);
        }
    }

    /// The keys requested since `seen` (at most the last REQUESTS: peers ask again for one
    /// lost), without repeats. Peers write what they like here: the promoter checks each key.
    fn take_requests(&self, seen: &mut u32) -> Vec<u32> {
        if self.map.lock(OFF_MUTEX, None).is_err() {
            return Vec::new();
        }
        let count = self.map.read_u32(OFF_REQ_COUNT);
        let n = count.wrapping_sub(*seen).min(REQUESTS as u32);
        let mut keys: Vec<u32> = (0..n)
            .map(|i| count.wrapping_sub(n).wrapping_add(i) as usize % REQUESTS)
            .map(|i| self.map.read_u32(OFF_REQS + 4 * i))
            .collect();
        self.map.unlock(OFF_MUTEX);
        *seen = count;
        keys.sort_unstable();
        keys.dedup();
        keys
    }
}

fn getrandom(out: &mut [u8]) {
    // Keys::random draws from getrandom (and its fallback); 4 bytes at a time.
    let mut k = Keys::default();
    for chunk in out.chunks_mut(4) {
        let r = k.random().to_ne_bytes();
        chunk.copy_from_slice(&r[..chunk.len()]);
    }
}

/// The owner's writer of its table; lives in the key registry, so every change to the
/// registry changes the table under both locks.
pub(crate) struct Publisher {
    table: Arc<Table>,
    /// Our own record of which slot holds which key (we never read back the shared slots,
    /// which a peer could scribble on).
    slot_of: IntMap<u32, usize>,
    used: IntSet<usize>,
}

impl Publisher {
    fn locked(&self, f: impl FnOnce(&sys::SharedMap)) {
        let map = &self.table.map;
        // No time limit: deregistration must not return while a peer may still copy. A dead
        // holder is taken over (robust mutex).
        match map.lock(OFF_MUTEX, None) {
            Ok(()) => {
                f(map);
                map.unlock(OFF_MUTEX);
            }
            Err(e) => {
                // Unrecoverable: no peer can lock it either, so none can copy; carry on.
                log::error!(target: LOG, "key table mutex: {e}");
                f(map);
            }
        }
    }

    /// Publishes (or replaces) `key`. A key that finds no free slot stays unpublished.
    pub fn set(&mut self, key: u32, e: &KeyEntry) {
        let cap = self.table.capacity;
        let slot = match self.slot_of.get(&key) {
            Some(&s) => s,
            None => {
                let h = home(key, cap);
                let Some(s) = (0..PROBES.min(cap))
                    .map(|i| (h + i) % cap)
                    .find(|s| !self.used.contains(s))
                else {
                    log::debug!(target: LOG, "key {key:#x}: table full around its slot; TCP only");
                    return;
                };
                self.used.insert(s);
                self.slot_of.insert(key, s);
                s
            }
        };
        let count = self.slot_of.len() as u32;
        let base = OFF_SLOTS + slot * SLOT_LEN;
        self.locked(|m| {
            m.write_u32(base + S_KEY, key);
            m.write_u64(base + S_ADDR, e.addr);
            m.write_u64(base + S_LEN, e.len);
            m.write_u32(base + S_ACCESS, e.access);
            m.write_u32(base + S_PD, e.pd);
            m.write_u32(base + S_WINDOW, u32::from(e.window));
            m.write_u32(base + S_REGION, e.region);
            let arena = e.arena.unwrap_or(ArenaSpan {
                fd: NO_ARENA,
                ino: 0,
                off: 0,
            });
            m.write_u32(base + S_ARENA_FD, arena.fd);
            m.write_u64(base + S_ARENA_INO, arena.ino);
            m.write_u64(base + S_ARENA_OFF, arena.off);
            m.write_u32(base + S_STATE, LIVE);
            m.write_u32(OFF_COUNT, count);
        });
    }

    /// Withdraws `key`: once this returns, no peer copies through it (see the module docs).
    pub fn unset(&mut self, key: u32) {
        let Some(slot) = self.slot_of.remove(&key) else {
            return;
        };
        self.used.remove(&slot);
        let count = self.slot_of.len() as u32;
        let base = OFF_SLOTS + slot * SLOT_LEN;
        self.locked(|m| {
            m.write_u32(base + S_STATE, 0);
            m.write_u32(base + S_KEY, 0);
            m.write_u32(OFF_COUNT, count);
        });
    }
}

/// Why a peer's offer cannot be used.
pub(crate) use daplrs_backend::memfile::Refusal;

/// Whether the peer's descriptor `fd` is gone (closed, or its process ended). A peer keeps
/// a connection's ring, and its key table, open for as long as the connection: when either
/// has gone by the time its offer is read, the peer is tearing the connection down (a
/// program that connects many EPs and frees them at once: Debian's dtestcm), and the end
/// follows on the socket. That is no refusal of the same-host path, even in require mode.
pub(crate) fn peer_descriptor_gone(pid: u32, fd: u32) -> bool {
    memfile::is_process_and_descriptor(pid, fd)
        && matches!(std::fs::symlink_metadata(format!("/proc/{pid}/fd/{fd}")),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound)
}

/// Opens the peer's memfd `fd` (a key table or ring) read-write: daplrs_backend::memfile.
pub(crate) fn open_peer_memfd(pid: u32, fd: u32) -> Result<(std::fs::File, u64), Refusal> {
    memfile::open_peer(pid, fd, true).map(|(file, meta)| (file, meta.len()))
}

/// A connection's same-host state (engine/samehost.rs).
#[derive(Default)]
pub(crate) struct Link {
    /// The peer advertised the path in its HELLO (passive side, until accept).
    pub peer_advertised: bool,
    /// We advertised and expect the peer's one offer.
    pub expect_offer: bool,
    /// Both sides use the path, and our offer waits for the connection's first request, ours
    /// (our QP's first post) or the peer's (its offer): engine/samehost.rs.
    pub offer_pending: bool,
    /// The peer's table, once its offer checked out.
    pub peer: Option<Arc<PeerTable>>,
    /// Our ring for what the peer sends (ring.rs), named in our offer.
    pub incoming: Option<Arc<ring::Ring>>,
    /// The peer's SWITCH came: its frames arrive through `incoming`; the socket carries only
    /// doorbells and its end of stream.
    pub peer_switched: bool,
    /// The peer's ring, mapped: what we send goes there once our SWITCH frame is out.
    pub outgoing: Option<Arc<ring::Ring>>,
    /// Where in our output stream our SWITCH frame ends, while it is not all written yet.
    pub switch_at: Option<u64>,
}

impl Link {
    /// The peer's ring, if what we write goes there now.
    pub fn writing_ring(&self) -> Option<&Arc<ring::Ring>> {
        match self.switch_at {
            None => self.outgoing.as_ref(),
            Some(_) => None,
        }
    }

    /// Our ring, if what we read comes from there now.
    pub fn reading_ring(&self) -> Option<&Arc<ring::Ring>> {
        match self.peer_switched {
            true => self.incoming.as_ref(),
            false => None,
        }
    }
}

/// Counts a transfer done on the same-host path in the device's counters, in test builds
/// only: the tests read them to see which path a request took, and every thread posting on
/// one IA writing the same cache line per request took a third of a 2-thread run's time
/// (`bench/mtrate -s`).
#[inline]
pub(crate) fn count_inline(stats: &Stats, how: Moved) {
    if !cfg!(any(test, feature = "testing")) {
        return;
    }
    stats.inline_ops.fetch_add(1, Ordering::Relaxed);
    if how == Moved::Mapped {
        stats.mapped_ops.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(any(test, feature = "testing"))]
pub mod test_hooks {
    use super::{Mode, Stats};
    use std::cell::{Cell, RefCell};
    use std::sync::Arc;

    thread_local! {
        /// The mode of devices this thread opens (None: DAPLRS_SAME_HOST). Tests run in
        /// parallel threads of one process: an env var would leak across them.
        pub(super) static MODE: Cell<Option<Mode>> = const { Cell::new(None) };
        /// The stats of the devices this thread opened, in order.
        pub(super) static OPENED: RefCell<Vec<Arc<Stats>>> = const { RefCell::new(Vec::new()) };
        /// Devices this thread opens refuse every peer's offer (`refusing_offers`).
        pub(super) static REFUSE_OFFERS: Cell<bool> = const { Cell::new(false) };
    }

    /// Runs `f` (which opens devices) with devices that refuse every peer's same-host offer,
    /// as a peer in another PID namespace does.
    pub fn refusing_offers<T>(f: impl FnOnce() -> T) -> T {
        REFUSE_OFFERS.with(|r| r.set(true));
        let r = f();
        REFUSE_OFFERS.with(|r| r.set(false));
        r
    }

    /// Runs `f` (which opens devices) with `mode` for them; returns what it returned and the
    /// stats of each device it opened.
    pub fn open_with<T>(mode: Mode, f: impl FnOnce() -> T) -> (T, Vec<Arc<Stats>>) {
        MODE.with(|m| m.set(Some(mode)));
        OPENED.with(|o| o.borrow_mut().clear());
        let r = f();
        MODE.with(|m| m.set(None));
        (r, OPENED.with(|o| std::mem::take(&mut *o.borrow_mut())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use daplrs_backend::access;
    use daplrs_backend::arena::worth_mapping;

    fn entry(addr: u64, len: u64) -> KeyEntry {
        KeyEntry {
            addr,
            len,
            access: access::REMOTE_READ,
            pd: 7,
            window: false,
            region: 0,
            arena: None,
        }
    }

    fn offer_of(local: &Local) -> SameHostOffer {
        local.offer(7, None).expect("a table")
    }

    /// A descriptor the peer closed (a connection it tore down before we read its offer)
    /// is told from one still open, and from a process that is gone.
    #[test]
    fn a_closed_peer_descriptor_is_gone() {
        use std::os::fd::AsRawFd;
        let pid = std::process::id();
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        // A high number, so that other tests' new descriptors do not take it once closed.
        const HIGH: i32 = 987;
        // SAFETY: dup2 onto a number no other code of this process uses; closed below.
        assert_eq!(unsafe { libc::dup2(file.as_raw_fd(), HIGH) }, HIGH);
        assert!(!peer_descriptor_gone(pid, HIGH as u32));
        // SAFETY: the duplicate made above, closed once.
        unsafe { libc::close(HIGH) };
        assert!(peer_descriptor_gone(pid, HIGH as u32));
        assert!(peer_descriptor_gone(i32::MAX as u32, 0), "no such process");
        assert!(
            !peer_descriptor_gone(0, 0),
            "pid 0 names no process: not this case"
        );
    }

    /// Our own pid reads our own table: the probe, the lookup and the checks of `transfer`.
    #[test]
    fn a_published_key_is_found_checked_and_withdrawn() {
        let local = Local::new(Mode::Auto, 64, "test");
        let mut keys = Keys::published_in(local.publisher());
        let src = [0x5au8; 64];
        let key = 0x1234_5601;
        keys.insert(key, entry(src.as_ptr() as u64, 64));
        let peer = PeerTable::attach(&offer_of(&local)).expect("attach to ourselves");
        let mut dst = vec![0u8; 16];
        let ranges = [(dst.as_mut_ptr() as u64, 16usize)];
        let base = src.as_ptr() as u64;
        assert!(peer
            .transfer(&keys, key, base + 8, access::REMOTE_READ, &ranges, false)
            .done());
        assert_eq!(dst, vec![0x5au8; 16]);
        // The target's rules: privilege, range, live key.
        assert!(!peer
            .transfer(&keys, key, base, access::REMOTE_WRITE, &ranges, true)
            .done());
        assert!(!peer
            .transfer(&keys, key, base + 56, access::REMOTE_READ, &ranges, false)
            .done());
        assert!(!peer
            .transfer(&keys, key ^ 1, base, access::REMOTE_READ, &ranges, false)
            .done());
        keys.remove(key);
        assert!(!peer
            .transfer(&keys, key, base, access::REMOTE_READ, &ranges, false)
            .done());
    }

    /// A key whose memory lies in an arena (daplrs_backend::arena) is copied through our mapping of the
    /// arena, under the same checks; an arena the table names wrongly (a hostile owner's, or
    /// a descriptor reused) is not used, and cross-memory attach moves the bytes instead.
    #[test]
    fn a_key_in_an_arena_is_copied_through_the_mapping() {
        let local = Local::new(Mode::Auto, 64, "test");
        let mut keys = Keys::published_in(local.publisher());
        let pages = arena::test_pages::Pages::new(3 * 4096);
        // SAFETY: our own mapping, used only through this slice in this test.
        let target = unsafe { std::slice::from_raw_parts_mut(pages.ptr, pages.len) };
        target[100..108].copy_from_slice(b"arena!!!");
        let base = target.as_ptr() as u64;
        let (_arena, span) = arena::share(base, target.len() as u64).expect("an arena");
        let key = 0x2345_6701;
        let e = KeyEntry {
            access: access::REMOTE_READ | access::REMOTE_WRITE,
            arena: Some(span),
            ..entry(base, target.len() as u64)
        };
        keys.insert(key, e);
        let peer = PeerTable::attach(&offer_of(&local)).expect("attach to ourselves");
        let mut dst = [0u8; 8];
        let ranges = [(dst.as_mut_ptr() as u64, 8usize)];
        let read = |addr| peer.transfer(&keys, key, addr, access::REMOTE_READ, &ranges, false);
        assert_eq!(read(base + 100), Moved::Mapped);
        assert_eq!(&dst, b"arena!!!");
        assert_eq!(read(base + 3 * 4096 - 4), Moved::Not, "past the region");
        let src = *b"written.";
        let from = [(src.as_ptr() as u64, 8usize)];
        let write = peer.transfer(&keys, key, base + 8200, access::REMOTE_WRITE, &from, true);
        assert_eq!(write, Moved::Mapped);
        assert_eq!(&target[8200..8208], b"written.");
        // The table names another file under the arena's descriptor: not mapped.
        let mut wrong = e;
        wrong.arena = Some(ArenaSpan {
            ino: span.ino + 1,
            ..span
        });
        keys.insert(key, wrong);
        dst = [0; 8];
        let read = peer.transfer(&keys, key, base + 100, access::REMOTE_READ, &ranges, false);
        assert_eq!((read, &dst), (Moved::Attached, b"arena!!!"));
        keys.remove(key);
        let read = peer.transfer(&keys, key, base + 100, access::REMOTE_READ, &ranges, false);
        assert_eq!(read, Moved::Not, "deregistered");
    }

    /// A peer's mapping of an arena whose keys all ended is dropped when it maps another (it
    /// would keep the memory alive).
    #[test]
    fn a_peer_drops_its_mapping_of_an_arena_no_key_names() {
        let local = Local::new(Mode::Auto, 64, "test");
        let mut keys = Keys::published_in(local.publisher());
        // Mappings of their own: two heap buffers may share a page, and a region with a page
        // in another's arena gets none.
        let (a, b) = (
            arena::test_pages::Pages::new(1 << 20),
            arena::test_pages::Pages::new(1 << 20),
        );
        // SAFETY: inside our own mappings.
        unsafe {
            a.ptr.write_bytes(1, a.len);
            b.ptr.write_bytes(2, b.len);
        }
        let (a_addr, b_addr) = (a.addr(), b.addr());
        let (arena_a, span_a) = arena::share(a_addr, 1 << 20).expect("an arena");
        let (_arena_b, span_b) = arena::share(b_addr, 1 << 20).expect("another");
        keys.insert(
            0x100,
            KeyEntry {
                arena: Some(span_a),
                ..entry(a_addr, 1 << 20)
            },
        );
        keys.insert(
            0x200,
            KeyEntry {
                arena: Some(span_b),
                ..entry(b_addr, 1 << 20)
            },
        );
        let peer = PeerTable::attach(&offer_of(&local)).expect("attach to ourselves");
        let mut dst = [0u8; 8];
        let ranges = [(dst.as_mut_ptr() as u64, 8usize)];
        let read = |key, addr| peer.transfer(&keys, key, addr, access::REMOTE_READ, &ranges, false);
        assert_eq!(read(0x100, a_addr), Moved::Mapped);
        let cached = || {
            peer.mapping
                .arenas
                .lock()
                .maps
                .iter()
                .map(|(s, _)| s.ino)
                .collect::<Vec<_>>()
        };
        assert_eq!(cached(), vec![span_a.ino]);
        keys.remove(0x100);
        drop(arena_a);
        let read = |key, addr| peer.transfer(&keys, key, addr, access::REMOTE_READ, &ranges, false);
        assert_eq!(read(0x200, b_addr), Moved::Mapped);
        assert_eq!(dst, [2u8; 8]);
        assert_eq!(
            cached(),
            vec![span_b.ino],
            "the first arena's mapping dropped"
        );
    }

    /// A peer asks the owner to map a key once its copies by cross-memory attach have cost
    /// about what the move would (`worth_mapping`), not before; the owner's keeper hands the
    /// key to its promoter.
    #[test]
    fn a_peer_asks_for_a_key_its_copies_made_worth_mapping() {
        let local = Local::new(Mode::Auto, 64, "test");
        let (tx, rx) = std::sync::mpsc::channel();
        let tx = parking_lot::Mutex::new(tx);
        local.set_promoter(Box::new(move |keys| {
            let _ = tx.lock().send(keys.to_vec());
        }));
        let mut keys = Keys::published_in(local.publisher());
        let src = [9u8; 64];
        keys.insert(0x4400, entry(src.as_ptr() as u64, 64));
        let peer = PeerTable::attach(&offer_of(&local)).expect("attach");
        let mut dst = [0u8; 8];
        let ranges = [(dst.as_mut_ptr() as u64, 8usize)];
        let base = src.as_ptr() as u64;
        let worth = worth_mapping(64);
        for _ in 1..worth {
            assert_eq!(
                peer.transfer(&keys, 0x4400, base, access::REMOTE_READ, &ranges, false),
                Moved::Attached
            );
        }
        assert!(rx.try_recv().is_err(), "asked before {worth} copies");
        peer.transfer(&keys, 0x4400, base, access::REMOTE_READ, &ranges, false);
        let asked = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the keeper hands the request on");
        assert_eq!(asked, vec![0x4400]);
        // Asked again only at twice the cost (should the first be lost or refused).
        for _ in 0..worth - 1 {
            peer.transfer(&keys, 0x4400, base, access::REMOTE_READ, &ranges, false);
        }
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
        peer.transfer(&keys, 0x4400, base, access::REMOTE_READ, &ranges, false);
        assert!(rx.recv_timeout(Duration::from_secs(10)).is_ok());
    }

    /// What peers write into the request ring is bounded where the owner reads it: a count
    /// garbled far ahead yields at most the ring's keys, once each.
    #[test]
    fn garbled_requests_are_bounded() {
        let local = Local::new(Mode::Auto, 64, "test");
        let t = local.table.as_ref().expect("table");
        for i in 0..REQUESTS {
            t.map.write_u32(OFF_REQS + 4 * i, (i % 3) as u32);
        }
        t.map.write_u32(OFF_REQ_COUNT, 0xdead_beef);
        let mut seen = 0;
        assert_eq!(t.take_requests(&mut seen), vec![0, 1, 2]);
        assert_eq!(seen, 0xdead_beef);
        assert!(t.take_requests(&mut seen).is_empty());
    }

    /// The PD of the peer's QP, as its target checks it.
    #[test]
    fn a_key_of_another_protection_domain_is_refused() {
        let local = Local::new(Mode::Auto, 64, "test");
        let mut keys = Keys::published_in(local.publisher());
        let src = [1u8; 8];
        keys.insert(0x100, entry(src.as_ptr() as u64, 8));
        let mut offer = offer_of(&local);
        offer.pd = 8;
        let peer = PeerTable::attach(&offer).expect("attach");
        let mut dst = [0u8; 8];
        let ranges = [(dst.as_mut_ptr() as u64, 8usize)];
        assert!(!peer
            .transfer(
                &keys,
                0x100,
                src.as_ptr() as u64,
                access::REMOTE_READ,
                &ranges,
                false
            )
            .done());
    }

    #[test]
    fn offers_that_do_not_check_out_are_refused() {
        let local = Local::new(Mode::Auto, 64, "test");
        let good = offer_of(&local);
        let mut o = good;
        o.nonce ^= 1;
        assert!(PeerTable::attach(&o).is_err(), "nonce");
        let elsewhere = !good.nonce;
        let mut o = good;
        o.nonce_addr = &elsewhere as *const u64 as u64;
        assert!(PeerTable::attach(&o).is_err(), "probe address");
        let mut o = good;
        o.fd = 0; // stdin or whatever it is: not our table
        assert!(PeerTable::attach(&o).is_err(), "descriptor");
        let mut o = good;
        o.pid = 0;
        assert!(PeerTable::attach(&o).is_err(), "pid");
        assert!(PeerTable::attach(&good).is_ok());
        assert!(Local::new(Mode::Never, 64, "test").offer(1, None).is_none());
    }

    /// Keys that find no free slot within PROBES of their home stay unpublished (TCP).
    #[test]
    fn a_full_table_leaves_keys_unpublished() {
        let local = Local::new(Mode::Auto, 4, "test");
        let mut keys = Keys::published_in(local.publisher());
        let src = [0u8; 8];
        for i in 1..=6u32 {
            keys.insert(i << 8, entry(src.as_ptr() as u64, 8));
        }
        let peer = PeerTable::attach(&offer_of(&local)).expect("attach");
        let found = (1..=6u32).filter(|i| peer.lookup(i << 8).is_some()).count();
        assert_eq!(found, 4);
        assert_eq!(local.table.as_ref().unwrap().map.read_u32(OFF_COUNT), 4);
    }

    /// A holder that dies with the mutex held (a killed peer) does not block us: the robust
    /// mutex hands it over. A thread that exits holding it stands in for the process.
    #[test]
    fn a_dead_holder_does_not_block_the_table() {
        let local = Local::new(Mode::Auto, 4, "test");
        let table = local.table.clone().expect("table");
        let t2 = table.clone();
        std::thread::spawn(move || t2.map.lock(OFF_MUTEX, None).expect("lock"))
            .join()
            .expect("thread");
        table
            .map
            .lock(OFF_MUTEX, Some(Duration::from_secs(5)))
            .expect("taken over from the dead holder");
        table.map.unlock(OFF_MUTEX);
        // And the owner's own updates go on.
        let mut keys = Keys::published_in(local.publisher());
        keys.insert(0x100, entry(0x1000, 8));
    }

    /// A table whose owner is gone (its keeper released the liveness mutex, as a dead
    /// process's would be) is copied through no more.
    #[test]
    fn a_table_whose_owner_is_gone_is_not_used() {
        let local = Local::new(Mode::Auto, 64, "test");
        let mut keys = Keys::published_in(local.publisher());
        let src = [3u8; 8];
        keys.insert(0x100, entry(src.as_ptr() as u64, 8));
        let peer = PeerTable::attach(&offer_of(&local)).expect("attach");
        let mut dst = [0u8; 8];
        let ranges = [(dst.as_mut_ptr() as u64, 8usize)];
        let base = src.as_ptr() as u64;
        assert!(peer
            .transfer(&keys, 0x100, base, access::REMOTE_READ, &ranges, false)
            .done());
        drop(keys);
        drop(local);
        let keys = Keys::default();
        assert!(!peer
            .transfer(&keys, 0x100, base, access::REMOTE_READ, &ranges, false)
            .done());
    }

    /// Connections to one peer share one mapping of its table (the map count is finite),
    /// each with its own QP's protection domain.
    #[test]
    fn connections_to_one_peer_share_its_mapping() {
        let owner = Local::new(Mode::Auto, 64, "owner");
        let user = Local::new(Mode::Auto, 64, "user");
        let a = user.attach(&owner.offer(1, None).unwrap()).expect("first");
        let b = user.attach(&owner.offer(2, None).unwrap()).expect("second");
        assert!(Arc::ptr_eq(&a.mapping, &b.mapping));
        assert_eq!((a.qp_pd, b.qp_pd), (1, 2));
        drop((a, b));
        let c = user
            .attach(&owner.offer(3, None).unwrap())
            .expect("after the others closed");
        assert_eq!(c.qp_pd, 3);
        let mut wrong = owner.offer(1, None).unwrap();
        wrong.nonce_addr = 8;
        assert!(
            user.attach(&wrong).is_err(),
            "a cached mapping still needs the probe"
        );
    }

    #[test]
    fn modes_parse() {
        assert_eq!(Mode::parse(None), Mode::Auto);
        assert_eq!(Mode::parse(Some("never")), Mode::Never);
        assert_eq!(Mode::parse(Some(" require ")), Mode::Require);
        assert_eq!(Mode::parse(Some("sometimes")), Mode::Auto);
    }
}
