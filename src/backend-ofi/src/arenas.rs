//! Registered memory a peer on this host copies through with no system call: arenas
//! (daplrs_backend::arena, as rs-tcp's same-host path uses them).
//!
//! An initiator whose target is on this host moves small RDMA itself (`qp/inline.rs`), by
//! cross-memory attach: a system call of about a microsecond, where shm's own queues need
//! none (8 B writes and reads 2.3-2.8x raw shm's). Once a peer has copied through one of our
//! keys often, it asks us (a request in its own key table, which we map, and its doorbell);
//! our progress thread hands the keys to a thread of ours that moves each region's pages into
//! an arena, and the key's span in our table says where. From then on the peer maps that
//! memfd and copies with the CPU. The key table's entry still decides every access, as
//! before (live key, range, rights, PD: `OfiQp::refused`); the span only changes how the
//! bytes move.
//!
//! Owner side (`Arenas`): the arenas our keys hold, made on request or found at registration
//! (memory inside an arena made before: `arena::existing`), dropped at deregistration after
//! the span is withdrawn. Peer side (`PeerArenas`): the peer's arenas mapped here and how
//! often each key was copied by cross-memory attach.
//!
//! A copy racing the owner's deregistration lands in the memfd's pages, which the owner's
//! memory no longer uses once the last registration in the arena ended (its pages moved
//! back): as an RDMA NIC's access racing a deregistration, never another registration's
//! memory. DAPLRS_SAME_HOST_MAP=never keeps every region where it is.

use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use daplrs_backend::arena::{self, Arena, ArenaSpan, Heat};
use daplrs_backend::intmap::IntMap;
use daplrs_backend::shared_map::SharedMap;
use daplrs_backend::{peer_fd, Sge, WcStatus};
use parking_lot::Mutex;

use crate::domain::Domain;
use crate::keymap::PeerKeys;

/// The arenas our registrations hold, by key.
#[derive(Default)]
pub(crate) struct Arenas {
    /// Held while pages move in, so that a deregistration meeting a move waits for it.
    held: Mutex<IntMap<u32, Arc<Arena>>>,
    /// A thread of ours is moving pages (one at a time).
    moving: Arc<AtomicBool>,
    /// When the progress thread last read peers' requests (`serve`).
    served: Mutex<Option<std::time::Instant>>,
}

/// How often the progress thread reads peers' requests at most: a request waits that long,
/// a turn (every 25 us while the IA posts) costs nothing in between.
const SERVE_EVERY: std::time::Duration = std::time::Duration::from_millis(1);

impl Arenas {
    /// A new registration `key` of `[addr, addr + len)`: published with the arena that
    /// already holds its pages, if one does (no system call when none does).
    pub(crate) fn registered(&self, dom: &Domain, key: u32, addr: u64, len: u64) {
        if !dom.shares_pages {
            return;
        }
        if let Some((held, span)) = arena::existing(addr, len) {
            self.held.lock().insert(key, held);
            dom.keys.set_span(key, Some(span));
        }
    }

    /// `key` is being deregistered: peers stop mapping its memory before the key goes; the
    /// arena goes with its last registration (its pages move back, outside our lock). The
    /// span is withdrawn under the lock a move holds, so a move that met this
    /// deregistration cannot publish it again after.
    pub(crate) fn deregistered(&self, dom: &Domain, key: u32) {
        if !dom.shares_pages {
            return;
        }
        let dropped = {
            let mut held = self.held.lock();
            dom.keys.set_span(key, None);
            held.remove(&key)
        };
        drop(dropped);
    }

    /// The progress thread's turn: keys peers asked us to move, handed to a mover thread.
    pub(crate) fn serve(&self, dom: &Arc<Domain>) {
        if !dom.shares_pages {
            return;
        }
        let now = std::time::Instant::now();
        {
            let mut served = self.served.lock();
            if served.is_some_and(|t| now.duration_since(t) < SERVE_EVERY) {
                return;
            }
            *served = Some(now);
        }
        let token = dom.keys.token();
        let mut keys: Vec<u32> = dom
            .peer_keys
            .mapped()
            .iter()
            .flat_map(|p| p.asked_of(token))
            .collect();
        if keys.is_empty() {
            return;
        }
        keys.sort_unstable();
        keys.dedup();
        if self.moving.swap(true, Ordering::AcqRel) {
            // One move at a time; the peer asks again later.
            return;
        }
        let (me, moving) = (Arc::downgrade(dom), self.moving.clone());
        let spawned = std::thread::Builder::new()
            .name("daplrs-ofi-arena".into())
            .spawn(move || {
                if let Some(dom) = me.upgrade() {
                    dom.arenas.promote(&dom, &keys);
                }
                moving.store(false, Ordering::Release);
            });
        if spawned.is_err() {
            self.moving.store(false, Ordering::Release);
        }
    }

    /// Moves each asked key's region (a live registration of ours, not a window's) into an
    /// arena and publishes its span.
    fn promote(&self, dom: &Domain, keys: &[u32]) {
        for &key in keys {
            let mut held = self.held.lock();
            if held.contains_key(&key) {
                continue;
            }
            let Some((start, length)) = dom.keys.region(key) else {
                continue;
            };
            if let Some((made, span)) = arena::share(start, length) {
                // Still that registration (deregistration takes this lock first)?
                if dom.keys.region(key) == Some((start, length)) {
                    held.insert(key, made);
                    dom.keys.set_span(key, Some(span));
                }
            }
        }
    }
}

/// Arenas mapped per peer at most: an old one whose memfd the peer closed stays mapped (its
/// pages) until then.
const MAPPED_MAX: usize = 8;

/// The peer's arenas we mapped, and how often we copied through each of its keys.
#[derive(Default)]
pub(crate) struct PeerArenas {
    maps: Mutex<Vec<(ArenaSpan, Arc<SharedMap>)>>,
    /// What our requests through each key cost us without an arena, as rs-tcp counts it:
    /// asked once that is about what moving the key's memory costs the owner.
    heat: Mutex<Heat>,
}

impl PeerArenas {
    /// Counts a request of `len` bytes through `key` (of `key_len` bytes) not made through
    /// an arena: true when it is time to ask the peer for the key's arena.
    pub(crate) fn copied(&self, key: u32, key_len: u64, len: u64) -> bool {
        self.heat.lock().add(key, key_len, len)
    }

    /// Copies between our segments and the peer's memory at `off` bytes into its key of
    /// `span` (`write`: into the peer's): None where the key has no arena we can map (then
    /// the caller attaches as before).
    pub(crate) fn copy(
        &self,
        peer: &PeerKeys,
        span: ArenaSpan,
        off: u64,
        sgl: &[Sge],
        write: bool,
    ) -> Option<WcStatus> {
        let map = self.mapped(peer, span)?;
        let total: u64 = sgl.iter().map(|s| s.length as u64).sum();
        let start = span.off.checked_add(off)?;
        if start.checked_add(total)? > map.len() as u64 {
            return None;
        }
        let mut at = start as usize;
        for s in sgl {
            let n = s.length as usize;
            // SAFETY: `at..at + n` is inside the mapping (checked above); ours is the
            // consumer's registered segment, which the guarded copy survives being unmapped.
            let done = unsafe {
                let theirs = map.as_ptr().add(at);
                let ours = s.addr as usize as *mut u8;
                if write {
                    daplrs_backend::guarded::copy(theirs, ours, n)
                } else {
                    daplrs_backend::guarded::copy(ours, theirs, n)
                }
            };
            if !done {
                return Some(WcStatus::LocalProtection);
            }
            at += n;
        }
        Some(WcStatus::Success)
    }

    /// Our mapping of the peer's arena of `span`: opened through its pidfd the first time
    /// (its descriptor must still name that memfd: the inode checks it).
    fn mapped(&self, peer: &PeerKeys, span: ArenaSpan) -> Option<Arc<SharedMap>> {
        let same = |s: &ArenaSpan| s.fd == span.fd && s.ino == span.ino;
        let mut maps = self.maps.lock();
        if let Some((_, m)) = maps.iter().find(|(s, _)| same(s)) {
            return Some(m.clone());
        }
        let file = std::fs::File::from(peer_fd::PeerProcess::new(peer.pid).getfd(span.fd).ok()?);
        let meta = file.metadata().ok()?;
        let len = meta.len() as usize;
        if meta.ino() != span.ino
            || len == 0
            || !daplrs_backend::memfile::size_sealed(file.as_raw_fd())
        {
            return None;
        }
        // The peer's memfd is sealed: it cannot shrink under the mapping.
        let m = Arc::new(SharedMap::map(file.as_raw_fd(), len).ok()?);
        if maps.len() >= MAPPED_MAX {
            maps.remove(0);
        }
        maps.push((span, m.clone()));
        Some(m)
    }
}
