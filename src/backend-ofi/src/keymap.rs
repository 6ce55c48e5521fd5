//! The key table's memory (`keys`), shared with peers on this host, and a peer's table
//! mapped by an initiator on the same host.
//!
//! On shm the initiator must read a key's entry before every RDMA request (see
//! `Domain::fresh_lookups`). Read through the provider, that is a second request to the
//! target before each one, served by the target's progress: an 8 B write took two of the
//! target's turns. So the table lives in a sealed memfd, and our connection header names it
//! (`Share`: our pid, its descriptor and a random token the file holds, `cm::with_header`);
//! an initiator on the same host maps it read-only and reads an entry in place, as
//! fresh as a read through the provider and without the target. A peer on another host
//! cannot open it, or finds another file without the token. Where the table is mapped,
//! small RDMA requests are done by the initiator itself (`qp/inline.rs`).
//!
//! The page after the entries also holds the target's doorbell: the descriptor of its
//! progress thread's eventfd and a word saying the thread sleeps at its idle pace (shm and
//! ofi_rxm have no descriptor to sleep on, so the thread looks once a millisecond). An
//! initiator that hands the provider a request for such a target rings it: a target blocked
//! in `dat_evd_wait` served 1 MiB reads at one a millisecond (about 1,000 MB/s) without it.
//!
//! And it holds the target's sign of life: a robust process-shared mutex its progress thread
//! holds while the device lives (`TableMemory::hold_alive`). libfabric 1.17's shm guards each
//! endpoint's queues with a spin lock in shared memory; a process killed while holding its
//! own (its progress takes it all the time) leaves it held, and a request of ours to it then
//! spins forever inside the provider, with the QP's lock held, so that the connection's end
//! is never reported (test_peer_killed hung 3 runs in 8). The kernel marks a robust mutex
//! whose holder died (FUTEX_OWNER_DIED in its word): one load says the peer is gone, and the
//! QP gives the provider nothing more for it (`OfiQp::peer_gone`).
//!
//! After that page come the keys' arenas (`arenas`): where a key's memory lies in a memfd of
//! the target's (daplrs_backend::arena) that a peer on this host maps and copies through,
//! with no system call; and a page of our own requests that peers move keys of theirs into
//! arenas (a peer's table is read-only to us, so we ask in ours, which it maps).

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use daplrs_backend::arena::ArenaSpan;
use daplrs_backend::clock::monotonic_ns;
use daplrs_backend::shared_map::{SharedMap, SharedWords};
use daplrs_backend::{memfile, peer_fd};
use parking_lot::Mutex;

use crate::keys::{Entry, Remote, ENTRY_BYTES, SLOTS};

const TABLE_BYTES: usize = SLOTS * ENTRY_BYTES;
/// The file: the entries, then a page holding the token and the doorbell (outside the
/// registration peers read through the provider), the keys' arena spans (a slot per entry)
/// and the page of our requests.
const FILE_BYTES: usize = REQUESTS_AT + 4096;
const SPANS_AT: usize = TABLE_BYTES + 4096;
const REQUESTS_AT: usize = SPANS_AT + SLOTS * std::mem::size_of::<SpanSlot>();
/// The requests after their count's line: a ring.
const REQUESTS: usize = (4096 - 64) / std::mem::size_of::<RequestSlot>();
/// In that page: the token (8 bytes), the doorbell's descriptor, the nap word (`Nap`), and
/// when a consumer of ours last polled and posted (`PollStamp`).
const BELL_FD_AT: usize = TABLE_BYTES + 8;
const NAP_AT: usize = TABLE_BYTES + 12;
const POLLED_AT: usize = TABLE_BYTES + 16;
const POSTED_AT: usize = TABLE_BYTES + 24;
/// The sign of life: a pthread_mutex_t (robust, process-shared), its futex word first.
const ALIVE_AT: usize = TABLE_BYTES + 64;
/// The futex word's bit the kernel sets when a robust mutex's holder dies (linux/futex.h).
const FUTEX_OWNER_DIED: u32 = 0x4000_0000;
/// The doorbell's descriptor word before one is set.
const NO_BELL: u32 = u32::MAX;

/// How the progress thread naps (the nap word), so that peers on this host know when a
/// request of theirs needs our doorbell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum Nap {
    /// It is awake, or sleeps on descriptors that the provider wakes: nobody rings.
    Awake = 0,
    /// It naps at the polled pace (`device::Cadence`): peers ring.
    IdlePace = 1,
    /// It stands back while a consumer of ours polls and moves the provider itself: peers
    /// ring once the consumer stopped (`PollStamp`). A consumer that went to spin on its
    /// memory for a peer's send moves nothing, and without the bell that send waited for
    /// the thread's next turn, up to a millisecond later.
    ForPoller = 2,
}

/// How long after a consumer's last poll it still counts as polling: its next look comes
/// well within it (a `sched_yield` apart), while a consumer that went to spin on its memory
/// or to block hands the provider back to the progress thread (`Nap::ForPoller`).
const POLLER_WINDOW_NS: u64 = 100_000;

/// When a consumer of ours last polled a CQ and moved the provider itself, in the doorbell's
/// page, and whether it found what it polled for since: CLOCK_MONOTONIC nanoseconds shifted
/// left by one, the low bit `FOUND` (0: never polled); and when it last posted. Our
/// progress thread stands back while the consumer polls; peers read both to know whether
/// to ring.
///
/// A consumer whose poll found what it looked for and that does not poll again has left:
/// to spin on its memory for the peer's answer (having posted its own), or to compute. One
/// that polls in a loop finds, posts and polls again within a microsecond or two; so a find
/// counts as leaving once `POST_GRACE_NS` passed since the consumer's last post, less than
/// any answer to that post takes to come from a peer whose thread must be woken for it.
/// A wait that found its completion (`OfiCq::drive`) is not a find: the consumer waits
/// again soon. Measured on 2 CPUs, 8 B over shm: with a wait's find counted, the peers of
/// blocking ping-pongs rang between the find and the next wait (an eventfd write a message:
/// sends 1.9 -> 4.2 us); with a grace of 3 us counted from the find instead of the post,
/// the peers of spinning ones did not ring (they post after their finds).
#[derive(Clone)]
pub(crate) struct PollStamp(Arc<Mapping>);

/// The stamp's bit saying a find came after the last poll.
const FOUND: u64 = 1;
/// How long after its last post a consumer that found what it polled for still counts as
/// polling (see `PollStamp`).
const POST_GRACE_NS: u64 = 5_000;

impl PollStamp {
    /// A consumer polled.
    #[inline]
    pub(crate) fn polled(&self) {
        self.0
            .polled_at()
            .store(monotonic_ns() << 1, Ordering::SeqCst);
    }

    /// The consumer found what it polled for: unless it polls again, it has left once its
    /// last post is `POST_GRACE_NS` old. Read before written, so that finds in a row leave
    /// the line shared.
    #[inline]
    pub(crate) fn found(&self) {
        let at = self.0.polled_at();
        let v = at.load(Ordering::Relaxed);
        if v & FOUND == 0 {
            at.store(v | FOUND, Ordering::SeqCst);
        }
    }

    /// A consumer posted.
    #[inline]
    pub(crate) fn posted(&self) {
        self.0.posted_at().store(monotonic_ns(), Ordering::SeqCst);
    }

    /// Whether a consumer polls (it did within `POLLER_WINDOW_NS`, and has not left).
    pub(crate) fn polling(&self) -> bool {
        stamp_polling(&self.0)
    }
}

/// Whether the stamps of `map` say a consumer polls now.
#[inline]
fn stamp_polling(map: &Mapping) -> bool {
    let v = map.polled_at().load(Ordering::SeqCst);
    let now = monotonic_ns();
    let fresh = v != 0 && now.saturating_sub(v >> 1) < POLLER_WINDOW_NS;
    let left = v & FOUND != 0
        && now.saturating_sub(map.posted_at().load(Ordering::SeqCst)) >= POST_GRACE_NS;
    fresh && !left
}

/// Where a key's memory lies in an arena (`ArenaSpan`), for peers: the key last, as in
/// `Entry::fill` (0: none).
#[repr(C)]
struct SpanSlot {
    key: AtomicU64,
    fd: AtomicU64,
    ino: AtomicU64,
    off: AtomicU64,
}

// SAFETY: atomics only.
unsafe impl SharedWords for SpanSlot {}

/// One of our requests that a peer (its table's token) move a key of its into an arena.
#[repr(C)]
struct RequestSlot {
    token: AtomicU64,
    key: AtomicU64,
}

// SAFETY: atomics only.
unsafe impl SharedWords for RequestSlot {}

/// What a peer needs to map our table, as the handshake carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Share {
    pub pid: u32,
    pub fd: u32,
    /// Random, in the file after the entries: proves the file is the one announced.
    pub token: u64,
}

impl Share {
    pub(crate) fn encode(share: Option<Share>) -> Vec<u8> {
        share.map_or_else(Vec::new, |s| {
            let mut v = s.pid.to_le_bytes().to_vec();
            v.extend_from_slice(&s.fd.to_le_bytes());
            v.extend_from_slice(&s.token.to_le_bytes());
            v
        })
    }

    /// None: empty (not offered) or not 16 bytes.
    pub(crate) fn decode(b: &[u8]) -> Option<Share> {
        let b: &[u8; 16] = b.try_into().ok()?;
        let word = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        Some(Share {
            pid: word(0),
            fd: word(4),
            token: u64::from_le_bytes(b[8..].try_into().expect("8 bytes")),
        })
    }
}

/// A table file's FILE_BYTES mapped (or as much anonymous memory), unmapped on drop.
struct Mapping(SharedMap);

impl Mapping {
    /// The table's SLOTS entries, at the start of the mapping.
    fn entries(&self) -> &[Entry] {
        self.0.slice(0, SLOTS)
    }

    /// The token's word, after the entries (a page boundary, so 8-aligned).
    fn token(&self) -> *mut u64 {
        self.0.at(TABLE_BYTES)
    }

    /// The span slots, one per entry, at SPANS_AT.
    fn spans(&self) -> &[SpanSlot] {
        self.0.slice(SPANS_AT, SLOTS)
    }

    /// How many requests were ever made, then (on the next cache line) the ring of the last
    /// REQUESTS.
    fn requests(&self) -> (&AtomicU64, &[RequestSlot]) {
        let ring = self.0.slice(REQUESTS_AT + 64, REQUESTS);
        (self.0.atomic_u64(REQUESTS_AT), ring)
    }

    /// When a consumer last polled (POLLED_AT, 8-aligned, inside the mapping; an atomic is
    /// valid at any bit pattern, and only read where the mapping is read-only).
    fn polled_at(&self) -> &AtomicU64 {
        self.0.atomic_u64(POLLED_AT)
    }

    /// When a consumer last posted (POSTED_AT, as POLLED_AT).
    fn posted_at(&self) -> &AtomicU64 {
        self.0.atomic_u64(POSTED_AT)
    }

    /// The 32-bit word at `at` of the doorbell (4-aligned, inside the mapping; an atomic is
    /// valid at any bit pattern, and only read where the mapping is read-only).
    fn word(&self, at: usize) -> &AtomicU32 {
        self.0.atomic_u32(at)
    }
}

/// Our table's entries: a sealed memfd mapped shared, or private memory where a memfd
/// cannot be had (then nothing is offered to peers).
pub(crate) struct TableMemory {
    /// Shared with the thread holding the sign of life (`Alive`), which unlocks it before
    /// the memory may go.
    map: Arc<Mapping>,
    file: Option<OwnedFd>,
    token: u64,
}

impl TableMemory {
    pub(crate) fn new() -> std::io::Result<TableMemory> {
        let file = memfile::create_sealed("daplrs-ofi-keys", FILE_BYTES)
            .inspect_err(|e| log::debug!("key table not shared: {e}"))
            .ok();
        // Zero-filled: an entry of zeros holds no key.
        let map = Mapping(match &file {
            Some(f) => SharedMap::map(f.as_raw_fd(), FILE_BYTES)?,
            None => SharedMap::anonymous(FILE_BYTES)?,
        });
        let token = random_token();
        // SAFETY: the token's word, writable; nothing else refers to it yet.
        unsafe { map.token().write(token) };
        map.word(BELL_FD_AT).store(NO_BELL, Ordering::Release);
        map.0.init_robust_mutex(ALIVE_AT)?;
        Ok(TableMemory {
            map: Arc::new(map),
            file,
            token,
        })
    }

    /// Holds our sign of life on the calling thread until the guard drops (on this thread).
    /// The progress thread's, for the device's life: its end, or the process's, tells peers.
    pub(crate) fn hold_alive(&self) -> Alive {
        // An earlier holder thread of ours that ended without unlocking makes it ours again
        // (EOWNERDEAD, made consistent by `lock`).
        let held = self.map.0.lock(ALIVE_AT, None);
        Alive {
            map: held.is_ok().then(|| self.map.clone()),
            _here: std::marker::PhantomData,
        }
    }

    /// Names `fd` (the progress thread's eventfd) as our doorbell for peers on this host.
    pub(crate) fn set_bell(&self, fd: std::os::fd::RawFd) {
        self.map
            .word(BELL_FD_AT)
            .store(fd as u32, Ordering::Release);
    }

    /// How the progress thread naps, which says when peers ring (`Nap`). Sequentially
    /// consistent, against the initiator's post-then-look (`PeerKeys::ring`): the thread
    /// says it naps, then looks once more (its queues, or whether a consumer still polls),
    /// then naps.
    pub(crate) fn set_nap(&self, nap: Nap) {
        self.map.word(NAP_AT).store(nap as u32, Ordering::SeqCst);
    }

    /// Where our consumers' polls are stamped, for our progress thread and our peers.
    pub(crate) fn poll_stamp(&self) -> PollStamp {
        PollStamp(self.map.clone())
    }

    pub(crate) fn entries(&self) -> &[Entry] {
        self.map.entries()
    }

    /// Says where `key`'s memory lies in an arena of ours; `None`: nowhere (any more).
    pub(crate) fn set_span(&self, key: u32, span: Option<ArenaSpan>) {
        let slot = &self.map.spans()[key as usize % SLOTS];
        slot.key.store(0, Ordering::Release);
        if let Some(s) = span {
            slot.fd.store(s.fd as u64, Ordering::Release);
            slot.ino.store(s.ino, Ordering::Release);
            slot.off.store(s.off, Ordering::Release);
            slot.key.store(key as u64, Ordering::Release);
        }
    }

    /// Asks the peer whose table holds `token` to move its `key` into an arena: a slot of
    /// our ring (a request overwritten before the peer read it is made again later).
    pub(crate) fn ask(&self, token: u64, key: u32) {
        let (count, ring) = self.map.requests();
        let n = count.fetch_add(1, Ordering::AcqRel);
        let slot = &ring[n as usize % REQUESTS];
        slot.token.store(token, Ordering::Release);
        slot.key.store(key as u64, Ordering::Release);
    }

    /// Our table's token (peers' requests name it).
    pub(crate) fn token(&self) -> u64 {
        self.token
    }

    /// What a peer on this host opens to map the table.
    pub(crate) fn share(&self) -> Option<Share> {
        let fd = self.file.as_ref()?.as_raw_fd();
        Some(Share {
            pid: std::process::id(),
            fd: fd as u32,
            token: self.token,
        })
    }
}

/// Our sign of life held (`TableMemory::hold_alive`): unlocked on drop, on the thread that
/// locked it, before the table's memory can be unmapped (the kernel's robust list of that
/// thread names it until then).
pub(crate) struct Alive {
    map: Option<Arc<Mapping>>,
    /// Unlocked where it was locked: never sent to another thread.
    _here: std::marker::PhantomData<*const ()>,
}

impl Drop for Alive {
    fn drop(&mut self) {
        if let Some(map) = &self.map {
            // Locked by this thread in `hold_alive` (the guard is not Send).
            map.0.unlock(ALIVE_AT);
        }
    }
}

/// A token no other table has (the kernel's randomness; the time and our pid where it has
/// none, enough against a file of another process).
fn random_token() -> u64 {
    let mut t = 0u64;
    // SAFETY: getrandom(2) writes at most 8 bytes into `t`.
    let n = unsafe { libc::getrandom((&mut t as *mut u64).cast(), 8, 0) };
    if n != 8 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        t = now ^ (u64::from(std::process::id()) << 32);
    }
    t
}

/// A peer's table, mapped read-only, and the peer process it came from.
pub(crate) struct PeerKeys {
    map: Mapping,
    /// Its pid (from the handshake): the target of our own reads and writes
    /// of its memory (`qp/inline.rs`).
    pub(crate) pid: u32,
    /// The kernel let us attach to its memory so far (cleared at the first
    /// refusal: requests then go through the provider).
    cma: AtomicBool,
    /// Its /proc/<pid>/maps, where its mappings are asked (`memory_there`).
    maps: Option<std::fs::File>,
    /// Our duplicate of its doorbell (None: it names none, or the kernel gave no pidfd).
    bell: Option<OwnedFd>,
    /// Its table's token: what our requests of it name.
    pub(crate) token: u64,
    /// How many of its requests we have read (`asked_of`).
    seen: AtomicU64,
    /// Its arenas we mapped, and which of its keys we copy through often (`arenas`).
    pub(crate) arenas: crate::arenas::PeerArenas,
}

impl PeerKeys {
    /// Maps the table the handshake named (untrusted), if it is a sealed memfd of a table's
    /// size holding the token; also gives its identity (device, inode), under which
    /// connections to one peer share the mapping.
    fn open(share: Share) -> Result<(PeerKeys, (u64, u64)), memfile::Refusal> {
        let Share { pid, fd, token } = share;
        let (file, meta) = memfile::open_peer(pid, fd, false)?;
        if meta.len() != FILE_BYTES as u64 {
            let len = meta.len();
            return Err(format!("pid {pid} fd {fd}: {len} bytes, not a key table"));
        }
        let map = SharedMap::map_read_only(file.as_raw_fd(), FILE_BYTES)
            .map(Mapping)
            .map_err(|e| format!("mmap: {e}"))?;
        // SAFETY: the token's word; read once (volatile: another process's).
        if unsafe { map.token().read_volatile() } != token {
            return Err(format!("pid {pid} fd {fd}: not the table announced"));
        }
        let bell = match map.word(BELL_FD_AT).load(Ordering::Acquire) {
            NO_BELL => None,
            fd => peer_fd::PeerProcess::new(pid)
                .eventfd(fd)
                .inspect_err(|e| log::debug!("pid {pid}: doorbell fd {fd}: {e}"))
                .ok(),
        };
        let keys = PeerKeys {
            map,
            pid,
            cma: AtomicBool::new(true),
            maps: std::fs::File::open(format!("/proc/{pid}/maps")).ok(),
            bell,
            token,
            seen: AtomicU64::new(0),
            arenas: Default::default(),
        };
        Ok((keys, (meta.dev(), meta.ino())))
    }

    /// What the peer's entry says of `key` now, as `keys::remote_of` reads a copy (None:
    /// the slot holds another key, or changed while read).
    pub(crate) fn read(&self, key: u32) -> Option<Remote> {
        let e = &self.map.entries()[key as usize % SLOTS];
        // `Entry::fill` clears the key first and sets it last: the key read the same before
        // and after the fields (every load acquiring) means the fields are that key's.
        if e.key.load(Ordering::Acquire) != key as u64 {
            return None;
        }
        let scope = e.scope.load(Ordering::Acquire);
        let found = Remote {
            start: e.start.load(Ordering::Acquire),
            length: e.length.load(Ordering::Acquire),
            rights: scope as u32,
            pd: (scope >> 32) as u32,
            provider_key: e.provider_key.load(Ordering::Acquire),
        };
        (e.key.load(Ordering::Acquire) == key as u64).then_some(found)
    }
}

impl PeerKeys {
    /// After a request went to the provider: wakes the peer's progress thread if it sleeps
    /// at its idle pace (one load of a line the peer writes twice a millisecond at most).
    #[inline]
    pub(crate) fn ring(&self) {
        if let Some(bell) = &self.bell {
            let rung = match self.map.word(NAP_AT).load(Ordering::SeqCst) {
                n if n == Nap::IdlePace as u32 => true,
                n if n == Nap::ForPoller as u32 => !stamp_polling(&self.map),
                _ => false,
            };
            if rung {
                peer_fd::eventfd_signal(bell.as_raw_fd());
            }
        }
    }

    /// Whether the peer's process (or its device's progress thread) ended: it held its sign
    /// of life when it died. One load of a line written once.
    #[inline]
    pub(crate) fn gone(&self) -> bool {
        let word = self.map.word(ALIVE_AT).load(Ordering::Acquire);
        word & FUTEX_OWNER_DIED != 0
    }

    /// Where the peer's `key` lies in one of its arenas (None: in none, or the slot changed
    /// while read).
    pub(crate) fn span(&self, key: u32) -> Option<ArenaSpan> {
        let slot = &self.map.spans()[key as usize % SLOTS];
        if slot.key.load(Ordering::Acquire) != key as u64 {
            return None;
        }
        let span = ArenaSpan {
            fd: slot.fd.load(Ordering::Acquire) as u32,
            ino: slot.ino.load(Ordering::Acquire),
            off: slot.off.load(Ordering::Acquire),
        };
        (slot.key.load(Ordering::Acquire) == key as u64).then_some(span)
    }

    /// The keys the peer asked since the last call that a table of `token` (ours) move into
    /// arenas; untrusted (the owner checks each). At most a ring's worth.
    pub(crate) fn asked_of(&self, token: u64) -> Vec<u32> {
        let (count, ring) = self.map.requests();
        let now = count.load(Ordering::Acquire);
        if self.seen.load(Ordering::Relaxed) == now {
            return Vec::new();
        }
        let seen = self.seen.swap(now, Ordering::AcqRel);
        let from = seen.max(now.saturating_sub(REQUESTS as u64));
        (from..now)
            .map(|n| &ring[n as usize % REQUESTS])
            .filter(|s| s.token.load(Ordering::Acquire) == token)
            .map(|s| s.key.load(Ordering::Acquire) as u32)
            .collect()
    }

    /// Rings the peer's doorbell whether it naps or not (a request of ours waits in our
    /// table for its progress thread).
    pub(crate) fn ring_now(&self) {
        if let Some(bell) = &self.bell {
            peer_fd::eventfd_signal(bell.as_raw_fd());
        }
    }

    /// Whether our reads and writes of the peer's memory may be tried.
    pub(crate) fn cma_allowed(&self) -> bool {
        self.cma.load(Ordering::Relaxed)
    }

    /// The kernel refused cross-memory attach to the peer: not tried again.
    pub(crate) fn cma_refused(&self) {
        self.cma.store(false, Ordering::Relaxed);
    }

    /// Whether the peer has `[va, va + len)` mapped readable (and writable if `write`), as
    /// the kernel says (PROCMAP_QUERY, a call per mapping); None where it cannot say.
    pub(crate) fn memory_there(&self, va: u64, len: u64, write: bool) -> Option<bool> {
        daplrs_backend::mapping::mapped_in(self.maps.as_ref()?, va, len, write)
    }
}

/// The peers' tables a device has mapped, by file identity: one mapping per peer process
/// however many connections it has with us.
#[derive(Default)]
pub(crate) struct PeerKeysCache {
    mapped: Mutex<HashMap<(u64, u64), Weak<PeerKeys>>>,
}

impl PeerKeysCache {
    /// The peer's table named in its header (`cm::with_header`), or None: not offered, on
    /// another host, or not ours to open (another user, a ptrace policy); the QP then reads
    /// entries through the provider.
    pub(crate) fn get(&self, share: Option<Share>) -> Option<Arc<PeerKeys>> {
        let (keys, id) = PeerKeys::open(share?)
            .inspect_err(|e| log::debug!("peer key table not mapped: {e}"))
            .ok()?;
        let mut mapped = self.mapped.lock();
        mapped.retain(|_, w| w.strong_count() > 0);
        if let Some(known) = mapped.get(&id).and_then(Weak::upgrade) {
            return Some(known);
        }
        let keys = Arc::new(keys);
        mapped.insert(id, Arc::downgrade(&keys));
        Some(keys)
    }

    /// The peers' tables mapped now.
    pub(crate) fn mapped(&self) -> Vec<Arc<PeerKeys>> {
        self.mapped
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Remote;

    /// An entry filled in our table reads back through a peer's mapping of it; a withdrawn
    /// key or another key reads as gone; two lookups of one table share a mapping.
    #[test]
    fn a_peer_reads_our_entries_in_place() {
        let ours = TableMemory::new().expect("table memory");
        let share = ours.share();
        let cache = PeerKeysCache::default();
        let theirs = cache.get(share).expect("mapped");
        assert!(Arc::ptr_eq(&theirs, &cache.get(share).expect("again")));
        let found = Remote {
            start: 0x7f00_0000_1000,
            length: 4096,
            rights: daplrs_backend::access::REMOTE_WRITE,
            pd: 3,
            provider_key: 99,
        };
        let e = &ours.entries()[77];
        e.fill(77, &found);
        let back = theirs.read(77).expect("key 77");
        assert_eq!(back.fields(), (found.start, 4096, found.rights, 3, 99));
        assert!(theirs.read(77 + SLOTS as u32).is_none());
        e.key.store(0, Ordering::Release);
        assert!(theirs.read(77).is_none());
        assert!(Share::decode(&[1, 2, 3]).is_none());
        assert_eq!(Share::decode(&Share::encode(share)), share);
        let forged = Share {
            token: ours.share().expect("shared").token ^ 1,
            ..ours.share().expect("shared")
        };
        assert!(cache.get(Some(forged)).is_none());
    }

    /// A table whose sign of life's holder ended holding it reads as gone to a peer (a
    /// killed process: the kernel marks the robust mutex); one never held, or let go, does
    /// not; a new holder makes it alive again.
    #[test]
    fn a_holder_that_ended_holding_the_sign_of_life_reads_as_gone() {
        let ours = TableMemory::new().expect("table memory");
        let theirs = PeerKeysCache::default().get(ours.share()).expect("mapped");
        assert!(!theirs.gone(), "never held");
        std::thread::scope(|s| {
            s.spawn(|| {
                let held = ours.hold_alive();
                assert!(!theirs.gone(), "held");
                drop(held);
            });
        });
        assert!(!theirs.gone(), "let go");
        // Joined by hand: the scope's own join returns once the closure ended, maybe
        // before the kernel walked the thread's robust list at its exit.
        std::thread::scope(|s| {
            let ended = s.spawn(|| std::mem::forget(ours.hold_alive()));
            ended.join().expect("the holder thread");
        });
        assert!(theirs.gone(), "its holder ended holding it");
        let again = ours.hold_alive();
        assert!(!theirs.gone(), "held again");
        drop(again);
    }

    /// A peer rings our doorbell only while we say we nap; a table naming no doorbell
    /// (or a descriptor that is no eventfd) is mapped without one.
    #[test]
    fn a_peer_rings_only_a_napping_target_nobody_polls_for() {
        use std::os::fd::AsRawFd;
        let count = |fd: i32| {
            let mut n = 0u64;
            // SAFETY: reads 8 bytes into `n` from a non-blocking eventfd of ours.
            let r = unsafe { libc::read(fd, (&mut n as *mut u64).cast(), 8) };
            if r == 8 {
                n
            } else {
                0
            }
        };
        let bell = peer_fd::eventfd().expect("eventfd");
        let ours = TableMemory::new().expect("table memory");
        ours.set_bell(bell.as_raw_fd());
        let theirs = PeerKeysCache::default().get(ours.share()).expect("mapped");
        theirs.ring();
        assert_eq!(count(bell.as_raw_fd()), 0, "awake: not rung");
        ours.set_nap(Nap::IdlePace);
        theirs.ring();
        theirs.ring();
        assert_eq!(count(bell.as_raw_fd()), 2, "napping: rung");
        ours.set_nap(Nap::Awake);
        theirs.ring();
        assert_eq!(count(bell.as_raw_fd()), 0, "awake again");
        // Standing back for a consumer that polls: rung only once it stopped.
        let stamp = ours.poll_stamp();
        ours.set_nap(Nap::ForPoller);
        stamp.polled();
        theirs.ring();
        assert_eq!(count(bell.as_raw_fd()), 0, "a consumer polls: not rung");
        stamp.posted();
        stamp.found();
        theirs.ring();
        assert_eq!(
            count(bell.as_raw_fd()),
            0,
            "found, just after a post: not rung"
        );
        std::thread::sleep(std::time::Duration::from_nanos(POST_GRACE_NS));
        assert!(!stamp.polling());
        theirs.ring();
        assert_eq!(
            count(bell.as_raw_fd()),
            1,
            "the consumer found and left: rung"
        );
        stamp.polled();
        theirs.ring();
        assert_eq!(count(bell.as_raw_fd()), 0, "it polls again: not rung");
        stamp.polled();
        std::thread::sleep(std::time::Duration::from_nanos(POLLER_WINDOW_NS));
        assert!(!stamp.polling());
        theirs.ring();
        assert_eq!(count(bell.as_raw_fd()), 1, "its last poll is old: rung");
        // No doorbell named, or a memfd named as one: nothing to ring, nothing fails.
        let plain = TableMemory::new().expect("table memory");
        plain.set_nap(Nap::IdlePace);
        PeerKeysCache::default()
            .get(plain.share())
            .expect("mapped")
            .ring();
        let odd = TableMemory::new().expect("table memory");
        odd.set_bell(odd.file.as_ref().expect("memfd").as_raw_fd());
        odd.set_nap(Nap::IdlePace);
        let mapped = PeerKeysCache::default().get(odd.share()).expect("mapped");
        assert!(mapped.bell.is_none(), "a memfd is no doorbell");
        mapped.ring();
    }
}
