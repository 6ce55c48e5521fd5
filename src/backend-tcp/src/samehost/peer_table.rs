//! Peers' key tables, as a connection's initiator uses them: a peer's table mapped once per
//! device (`PeerMapping`), checked under the peer's mutex, and the RDMA reads and writes, and
//! sends placed into published receives, that it lets us do here (`PeerTable::transfer`,
//! `place`): through our mapping of the peer's arena, or by cross-memory attach, whose cost
//! (`Heat`) makes us ask the peer to map the memory into an arena. The table's layout is the
//! owner's (mod.rs).

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use daplrs_backend::arena::Heat;
use daplrs_backend::intmap::IntMap;

use super::arena::ArenaSpan;
use super::{home, peer, ring, sys, table_bytes, Refusal, LOG};
use super::{LIVE, MAGIC, MAX_TABLE_BYTES, NO_ARENA, PEER_LOCK_LIMIT, PROBES, REQUESTS, VERSION};
use super::{OFF_ALIVE, OFF_BELL, OFF_CAPACITY, OFF_MAGIC, OFF_MUTEX, OFF_NONCE, OFF_VERSION};
use super::{OFF_REQS, OFF_REQ_COUNT, OFF_SLOTS, SLOT_LEN};
use super::{S_ACCESS, S_ADDR, S_ARENA_FD, S_ARENA_INO, S_ARENA_OFF, S_KEY, S_LEN, S_PD};
use super::{S_REGION, S_STATE, S_WINDOW};
use crate::keys::{KeyEntry, Keys, Ranges};
use crate::wire::SameHostOffer;

/// A peer's table, mapped, and the process it belongs to.
pub(crate) struct PeerTable {
    pub(super) mapping: Arc<PeerMapping>,
    /// The protection domain of the peer's QP on this connection.
    pub(super) qp_pd: u32,
    /// The arena this connection copied through last, with our mapping of it (None: it
    /// could not be mapped): the connections of one IA share `mapping`, whose arena list
    /// and mappings' counts each of their copies locked and counted, passing those cache
    /// lines between threads posting on different EPs (`bench/mtrate -s`). It keeps that
    /// one mapping alive after the mapping's list dropped it, until the connection copies
    /// through another arena or ends.
    last_arena: parking_lot::Mutex<Option<(ArenaSpan, Option<Arc<sys::SharedMap>>)>>,
}

/// A peer's table as mapped here: once per device and peer table, however many connections
/// lead to it (a mapping per connection would spend the process's map count, 65530 by
/// default, on tables).
pub(super) struct PeerMapping {
    map: sys::SharedMap,
    capacity: usize,
    pid: u32,
    nonce: u64,
    /// The peer's descriptors (its rings, board and bells) are reached through it.
    process: peer::PeerProcess,
    /// The peer's `/proc/<pid>/mem`, for small transfers (`sys::proc_mem`); None if it could
    /// not be opened (then process_vm_readv/writev carry everything).
    mem: Option<std::fs::File>,
    /// The peer's arenas (daplrs_backend::arena) mapped here.
    pub(super) arenas: parking_lot::Mutex<PeerArenas>,
    /// What copying through the peer's keys by cross-memory attach has cost us, to ask the
    /// peer to map their memory into arenas where that pays.
    heat: parking_lot::Mutex<Heat>,
}

/// A peer's arenas we mapped (or failed to: not tried again), by its descriptor and inode,
/// oldest first. A mapping keeps the memfd's pages alive, also once the peer deregistered
/// them: each time another arena is mapped, those whose memfd the peer closed (its arena
/// ended) are dropped, and there are never more than `PEER_ARENAS`.
#[derive(Default)]
pub(super) struct PeerArenas {
    pub(super) maps: Vec<(ArenaSpan, Option<Arc<sys::SharedMap>>)>,
}

const PEER_ARENAS: usize = 64;

fn same_arena(a: &ArenaSpan, b: &ArenaSpan) -> bool {
    a.fd == b.fd && a.ino == b.ino
}

impl PeerArenas {
    /// Our mapping of the arena `span` names (its `off` is ignored), mapped now if need be.
    fn get(&mut self, peer: &peer::PeerProcess, span: ArenaSpan) -> Option<Arc<sys::SharedMap>> {
        let pid = peer.pid();
        if let Some((_, m)) = self.maps.iter().find(|(s, _)| same_arena(s, &span)) {
            return m.clone();
        }
        // An arena lives as long as the peer's descriptor of its memfd: one look each (a
        // system call) at the mappings we hold, only when another is made.
        self.maps
            .retain(|(s, _)| sys::inode_at(&format!("/proc/{pid}/fd/{}", s.fd)) == Some(s.ino));
        let map = match Self::open(peer, span) {
            Ok(m) => Some(Arc::new(m)),
            Err(e) => {
                log::info!(target: LOG, "pid {pid}: arena fd {}: {e}; cross-memory attach", span.fd);
                None
            }
        };
        if self.maps.len() >= PEER_ARENAS {
            self.maps.remove(0);
        }
        self.maps.push((span, map.clone()));
        map
    }

    fn open(peer: &peer::PeerProcess, span: ArenaSpan) -> Result<sys::SharedMap, Refusal> {
        let (file, len) = peer.memfd(span.fd)?;
        if sys::inode_of(file.as_raw_fd()).ok() != Some(span.ino) {
            return Err("another file now".into());
        }
        let len = usize::try_from(len).map_err(|_| "too large".to_string())?;
        sys::SharedMap::map(file.as_raw_fd(), len).map_err(|e| format!("mmap: {e}"))
    }
}

/// Transfers up to this many bytes go through the peer's /proc/<pid>/mem, larger ones through
/// process_vm_readv/writev (see `sys::proc_mem`: the crossover measured here is 4-8 KiB).
const SMALL_VIA_MEM: u64 = 4096;

impl PeerTable {
    /// Checks an offer: opens and maps the peer's memfd (the kernel's ptrace check), checks
    /// the magic, version and nonce, and probes the nonce's copy in the peer's memory with
    /// process_vm_readv (a pid in another PID namespace may name some other process: the
    /// probe proves cross-memory attach reaches the process that made the table).
    pub fn attach(offer: &SameHostOffer) -> Result<PeerTable, Refusal> {
        let mapping = PeerMapping::map(offer)?;
        Ok(PeerTable {
            mapping: Arc::new(mapping),
            qp_pd: offer.pd,
            last_arena: Default::default(),
        })
    }

    /// `attach`, reusing the mapping in `peers` (by pid and nonce) that serves the offer, if
    /// any; a new mapping joins `peers`.
    pub(super) fn attach_reusing(
        peers: &mut IntMap<(u32, u64), Weak<PeerMapping>>,
        offer: &SameHostOffer,
    ) -> Result<PeerTable, Refusal> {
        let key = (offer.pid, offer.nonce);
        if let Some(mapping) = peers.get(&key).and_then(|w| w.upgrade()) {
            if mapping.serves(offer) {
                return Ok(PeerTable {
                    mapping,
                    qp_pd: offer.pd,
                    last_arena: Default::default(),
                });
            }
        }
        let table = PeerTable::attach(offer)?;
        peers.retain(|_, w| w.strong_count() > 0);
        peers.insert(key, Arc::downgrade(&table.mapping));
        Ok(table)
    }

    pub fn pid(&self) -> u32 {
        self.mapping.pid
    }

    /// The peer, as its rings are reached.
    pub fn process(&self) -> &peer::PeerProcess {
        &self.mapping.process
    }
}

impl PeerMapping {
    fn map(offer: &SameHostOffer) -> Result<PeerMapping, Refusal> {
        let process = peer::PeerProcess::new(offer.pid);
        let (file, len) = process.memfd(offer.fd)?;
        let path = format!("/proc/{}/fd/{}", offer.pid, offer.fd);
        if !(OFF_SLOTS as u64 + SLOT_LEN as u64..=MAX_TABLE_BYTES).contains(&len) {
            return Err(format!("{path}: {len} bytes is no key table"));
        }
        let map = sys::SharedMap::map(file.as_raw_fd(), len as usize)
            .map_err(|e| format!("mmap {path}: {e}"))?;
        if map.read_u64(OFF_MAGIC) != MAGIC || map.read_u32(OFF_VERSION) != VERSION {
            return Err(format!("{path}: not a key table of version {VERSION}"));
        }
        let capacity = map.read_u32(OFF_CAPACITY) as usize;
        if capacity == 0 || table_bytes(capacity) > map.len() {
            return Err(format!("{path}: capacity {capacity} does not fit"));
        }
        if map.read_u64(OFF_NONCE) != offer.nonce {
            return Err(format!("{path}: nonce differs from the offer's"));
        }
        match sys::peek_u64(offer.pid, offer.nonce_addr) {
            Ok(v) if v == offer.nonce => {}
            Ok(_) => return Err(format!("pid {}: nonce probe read another value", offer.pid)),
            Err(e) => return Err(format!("pid {}: nonce probe: {e}", offer.pid)),
        }
        if !map.held_by_live_owner(OFF_ALIVE) {
            return Err(format!("pid {} exited or closed its device", offer.pid));
        }
        let mem = Self::open_mem(offer);
        Ok(PeerMapping {
            map,
            capacity,
            pid: offer.pid,
            nonce: offer.nonce,
            process,
            mem,
            arenas: Default::default(),
            heat: Default::default(),
        })
    }

    /// The peer's /proc/<pid>/mem, kept only if it reads the offer's nonce at the offer's
    /// address (so it is the process that made the offer, not one that took its pid since
    /// the probe above).
    fn open_mem(offer: &SameHostOffer) -> Option<std::fs::File> {
        let path = format!("/proc/{}/mem", offer.pid);
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) => {
                log::info!(target: LOG, "{path}: {e}: small transfers use process_vm_readv too");
                return None;
            }
        };
        let mut word = 0u64;
        let range = [(&mut word as *mut u64 as u64, 8usize)];
        // SAFETY: the only local memory written is `word`, 8 bytes we own.
        let read = unsafe { sys::proc_mem(file.as_raw_fd(), &range, (offer.nonce_addr, 8), false) };
        match read {
            Ok(8) if word == offer.nonce => Some(file),
            _ => {
                log::info!(target: LOG, "{path} does not read the offer's nonce: not used");
                None
            }
        }
    }

    /// Whether `offer` names this mapping's table, which is still usable: same pid and nonce,
    /// owner alive, and the nonce probe at the offer's address still reaches it.
    fn serves(&self, offer: &SameHostOffer) -> bool {
        self.pid == offer.pid
            && self.nonce == offer.nonce
            && self.map.held_by_live_owner(OFF_ALIVE)
            && sys::peek_u64(offer.pid, offer.nonce_addr).is_ok_and(|v| v == offer.nonce)
    }

    /// Asks the owner to map `key`'s memory into an arena (under the mutex; the caller rings
    /// the bell once it is released).
    fn request(&self, key: u32) {
        let m = &self.map;
        let count = m.read_u32(OFF_REQ_COUNT);
        m.write_u32(OFF_REQS + 4 * (count as usize % REQUESTS), key);
        m.write_u32(OFF_REQ_COUNT, count.wrapping_add(1));
    }

    /// Wakes the owner's keeper thread to read the requests.
    fn ring(&self) {
        let bell = self.map.atomic_u32(OFF_BELL);
        bell.fetch_add(1, Ordering::SeqCst);
        sys::futex_wake(bell);
    }

    /// The live slot of `key` (read under the mutex).
    fn lookup(&self, key: u32) -> Option<KeyEntry> {
        let cap = self.capacity;
        let h = home(key, cap);
        (0..PROBES.min(cap)).find_map(|i| {
            let base = OFF_SLOTS + ((h + i) % cap) * SLOT_LEN;
            let m = &self.map;
            if m.read_u32(base + S_STATE) != LIVE || m.read_u32(base + S_KEY) != key {
                return None;
            }
            Some(KeyEntry {
                addr: m.read_u64(base + S_ADDR),
                len: m.read_u64(base + S_LEN),
                access: m.read_u32(base + S_ACCESS),
                pd: m.read_u32(base + S_PD),
                window: m.read_u32(base + S_WINDOW) != 0,
                region: m.read_u32(base + S_REGION),
                arena: match m.read_u32(base + S_ARENA_FD) {
                    NO_ARENA => None,
                    fd => Some(ArenaSpan {
                        fd,
                        ino: m.read_u64(base + S_ARENA_INO),
                        off: m.read_u64(base + S_ARENA_OFF),
                    }),
                },
            })
        })
    }
}

impl PeerTable {
    pub(super) fn lookup(&self, key: u32) -> Option<KeyEntry> {
        self.mapping.lookup(key)
    }

    /// An RDMA read (`write` false: the peer's `[addr, addr + len)` into our `local` ranges)
    /// or write (ours into theirs), done here if the peer's registry allows it exactly as the
    /// target would (keys.rs `check_remote`: live key, the peer QP's PD, range inside, the
    /// privilege `need`). Returns how it was done: `Not` on any refusal or failure, and
    /// the caller then sends the request over TCP, where the target decides (and reports)
    /// itself. A read's local ranges may have been partly written by then: the TCP answer
    /// overwrites them.
    ///
    /// `_registry` is our own key registry, locked by the caller, which checked `local`
    /// against it (keys.rs `local_ranges`) and holds it across this call: asking for it makes
    /// the caller show that it holds the lock.
    pub fn transfer(
        &self,
        _registry: &Keys,
        rkey: u32,
        addr: u64,
        need: u32,
        local: &[(u64, usize)],
        write: bool,
    ) -> Moved {
        let len: u64 = local.iter().map(|&(_, n)| n as u64).sum();
        if len == 0 {
            // A zero-length access needs no key (as at the target): nothing to move.
            return Moved::Attached;
        }
        self.under_peer_mutex(|requests| {
            let Some(e) = self.lookup(rkey) else {
                return Moved::Not;
            };
            if !e.allows_remote(addr, len, self.qp_pd, need) {
                return Moved::Not;
            }
            self.copy(&e, rkey, addr, local, write, requests)
        })
    }

    /// A send placed here, now, into receive `k` that the peer published in its ring `ring`
    /// (which we write) as `recv`: our `local` ranges copied into the receive's segments, each
    /// checked against the peer's table as the peer's own scatter would check it (a live
    /// region key of the peer QP's PD with local write, the range inside), then the receive
    /// taken. `Not` on any refusal or failure, nothing taken: the caller then sends the message
    /// through the ring, and the receiver decides (and reports) as before. `_registry` as for
    /// `transfer`.
    pub fn place(
        &self,
        _registry: &Keys,
        ring: &ring::Ring,
        k: u64,
        recv: &ring::PublishedRecv,
        local: &[(u64, usize)],
        solicited: bool,
    ) -> Moved {
        let len: u64 = local.iter().map(|&(_, n)| n as u64).sum();
        let Some(segments) = recv.segments().filter(|_| len <= recv.capacity()) else {
            return Moved::Not;
        };
        self.under_peer_mutex(|requests| {
            // The peer withdraws a receive under this mutex before it flushes it.
            if !ring.recv_published(k) {
                return Moved::Not;
            }
            let mut how = Moved::Mapped;
            let mut at = 0u64;
            for &(addr, seg_len, key) in segments {
                if at == len {
                    break;
                }
                let n = u64::from(seg_len).min(len - at);
                let Some(e) = self.lookup(key) else {
                    return Moved::Not;
                };
                if !e.allows_local_write(addr, n, self.qp_pd) {
                    return Moved::Not;
                }
                let part = sub_ranges(local, at, n);
                match self.copy(&e, key, addr, &part, true, requests) {
                    Moved::Not => return Moved::Not,
                    Moved::Attached => how = Moved::Attached,
                    Moved::Mapped => {}
                }
                at += n;
            }
            let placed = ring::Placement {
                len: len as u32,
                imm: None,
                solicited,
            };
            if at < len || !ring.take_recv(k, placed) {
                return Moved::Not;
            }
            how
        })
    }

    /// Takes the peer's published receive `k` for a write-with-immediate (whose data went
    /// where its rkey said), under the peer's mutex as `place` takes one.
    pub fn take(&self, ring: &ring::Ring, k: u64, placed: ring::Placement) -> bool {
        let mut taken = false;
        self.under_peer_mutex(|_| {
            taken = ring.take_recv(k, placed);
            Moved::Attached
        });
        taken
    }

    /// Runs `f` under the peer table's mutex (bounded wait), while the peer's process lives;
    /// `f` collects the keys to ask the owner to map, which are asked for after. `Not` if the
    /// mutex or the owner is not there.
    fn under_peer_mutex(&self, f: impl FnOnce(&mut Vec<u32>) -> Moved) -> Moved {
        let map = &self.mapping.map;
        if map.lock(OFF_MUTEX, Some(PEER_LOCK_LIMIT)).is_err() {
            return Moved::Not;
        }
        let mut requests = Vec::new();
        // The owner's process still lives (and so its pid is still its own): its keeper
        // thread holds OFF_ALIVE. A process dying between this look and the copy is met by
        // the copy as ESRCH; its pid would have to be reaped and handed to a new process in
        // between to mislead us.
        let done = match map.held_by_live_owner(OFF_ALIVE) {
            true => f(&mut requests),
            false => Moved::Not,
        };
        for &key in &requests {
            self.mapping.request(key);
        }
        map.unlock(OFF_MUTEX);
        if !requests.is_empty() {
            self.mapping.ring();
        }
        done
    }

    /// Copies between our `local` ranges and the peer's `[addr, addr + len)` under key `key`
    /// (entry `e`, checked by the caller under the mutex, which it holds): through our mapping
    /// of the key's arena, else by cross-memory attach; the latter counts against the key's
    /// `Heat`, and a key it made worth mapping joins `requests`.
    fn copy(
        &self,
        e: &KeyEntry,
        key: u32,
        addr: u64,
        local: &[(u64, usize)],
        write: bool,
        requests: &mut Vec<u32>,
    ) -> Moved {
        let len: u64 = local.iter().map(|&(_, n)| n as u64).sum();
        if let Some(span) = e.arena {
            let mut last = self.last_arena.lock();
            if !last.as_ref().is_some_and(|(s, _)| same_arena(s, &span)) {
                let map = self.mapping.arenas.lock().get(&self.mapping.process, span);
                *last = Some((span, map));
            }
            let map = last.as_ref().and_then(|(_, m)| m.as_ref());
            // The offset comes from the peer's table (untrusted): copy_ranges copies nothing
            // outside the mapping.
            if let (Some(map), Some(off)) = (map, span.off.checked_add(addr - e.addr)) {
                // SAFETY: as for the copies below.
                if unsafe { map.copy_ranges(off, local, write) } {
                    return Moved::Mapped;
                }
            }
        }
        let moved = match &self.mapping.mem {
            // SAFETY: the caller checked every local range against our registry, which it
            // holds locked for this call (so no local registration ends meanwhile); the
            // peer's range was just checked against its registry under its table's mutex,
            // which we hold until the copy is over (so its deregistration waits for us).
            Some(mem) if len <= SMALL_VIA_MEM => unsafe {
                sys::proc_mem(mem.as_raw_fd(), local, (addr, len as usize), write)
            },
            // SAFETY: as above.
            _ => unsafe { sys::process_vm(self.mapping.pid, local, (addr, len as usize), write) },
        };
        match moved {
            Ok(n) if n as u64 == len => {
                if e.arena.is_none() && self.mapping.heat.lock().add(key, e.len, len) {
                    requests.push(key);
                }
                Moved::Attached
            }
            _ => Moved::Not,
        }
    }
}

/// The part `[from, from + n)` of the byte stream that `ranges` make, in order.
fn sub_ranges(ranges: &[(u64, usize)], from: u64, n: u64) -> Ranges {
    let mut out = Ranges::default();
    let (mut skip, mut left) = (from, n);
    for &(addr, len) in ranges {
        if left == 0 {
            break;
        }
        let len = len as u64;
        if skip >= len {
            skip -= len;
            continue;
        }
        let take = (len - skip).min(left);
        out.push((addr + skip, take as usize));
        left -= take;
        skip = 0;
    }
    out
}

/// How a same-host transfer went (`PeerTable::transfer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Moved {
    /// Not done: the request goes over TCP, where the target decides.
    Not,
    /// Copied through our mapping of the peer's arena.
    Mapped,
    /// Copied by cross-memory attach.
    Attached,
}

impl Moved {
    pub fn done(self) -> bool {
        self != Moved::Not
    }
}
