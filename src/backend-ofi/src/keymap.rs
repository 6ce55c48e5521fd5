//! The key table's memory (`keys`), shared with peers on this host, and a peer's table
//! mapped by an initiator on the same host.
//!
//! On shm the initiator must read a key's entry before every RDMA request (see
//! `Domain::fresh_lookups`). Read through the provider, that is a second request to the
//! target before each one, served by the target's progress: an 8 B write took two of the
//! target's turns. So the table lives in a sealed memfd, and over shm the handshake names it
//! (our pid and its descriptor, `rdm`); the initiator maps it read-only and reads an entry in
//! place, as fresh as a read through the provider and without the target.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use daplrs_backend::memfile;
use parking_lot::Mutex;

use crate::keys::{Entry, Remote, ENTRY_BYTES, SLOTS};

const TABLE_BYTES: usize = SLOTS * ENTRY_BYTES;

/// Our table's entries: a sealed memfd mapped shared, or private memory where a memfd
/// cannot be had (then nothing is offered to peers).
pub(crate) struct TableMemory {
    entries: NonNull<Entry>,
    file: Option<OwnedFd>,
}

// SAFETY: the mapping is only reached through `&[Entry]`, whose fields are atomics.
unsafe impl Send for TableMemory {}
// SAFETY: as for Send.
unsafe impl Sync for TableMemory {}

impl TableMemory {
    pub(crate) fn new() -> std::io::Result<TableMemory> {
        let file = memfile::create("daplrs-ofi-keys", TABLE_BYTES)
            .and_then(|fd| memfile::seal_size(&fd).map(|()| fd))
            .inspect_err(|e| log::debug!("key table not shared: {e}"))
            .ok();
        let (flags, fd) = match &file {
            Some(f) => (libc::MAP_SHARED, f.as_raw_fd()),
            None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1),
        };
        // SAFETY: a fresh mapping chosen by the kernel, zero-filled (an entry of zeros holds
        // no key); no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                TABLE_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let entries = NonNull::new(p.cast()).expect("mmap gave a mapping");
        Ok(TableMemory { entries, file })
    }

    pub(crate) fn entries(&self) -> &[Entry] {
        // SAFETY: SLOTS entries of zero-initialized, page-aligned memory mapped for our
        // life; an Entry is atomics only, valid at any bit pattern.
        unsafe { std::slice::from_raw_parts(self.entries.as_ptr(), SLOTS) }
    }

    /// What a peer on this host opens to map the table: our pid and the memfd's descriptor.
    pub(crate) fn share(&self) -> Option<(u32, u32)> {
        let fd = self.file.as_ref()?.as_raw_fd();
        Some((std::process::id(), fd as u32))
    }
}

impl Drop for TableMemory {
    fn drop(&mut self) {
        // SAFETY: our mapping, no longer borrowed (`entries` borrows self).
        unsafe { libc::munmap(self.entries.as_ptr().cast(), TABLE_BYTES) };
    }
}

/// A peer's table, mapped read-only, and the peer process it came from.
pub(crate) struct PeerKeys {
    entries: NonNull<Entry>,
    /// Its pid (from the handshake): the target of our own reads and writes
    /// of its memory (`qp/inline.rs`).
    pub(crate) pid: u32,
    /// The kernel let us attach to its memory so far (cleared at the first
    /// refusal: requests then go through the provider).
    cma: AtomicBool,
    /// Its /proc/<pid>/maps, where its mappings are asked (`memory_there`).
    maps: Option<std::fs::File>,
}

// SAFETY: as TableMemory's: reached only through atomic loads.
unsafe impl Send for PeerKeys {}
// SAFETY: as for Send.
unsafe impl Sync for PeerKeys {}

impl PeerKeys {
    /// Maps the table the peer `pid` holds at descriptor `fd` (untrusted: from its
    /// handshake), if it is a sealed memfd of a table's size; also gives its identity
    /// (device, inode), under which connections to one peer share the mapping.
    fn open(pid: u32, fd: u32) -> Result<(PeerKeys, (u64, u64)), memfile::Refusal> {
        let (file, len) = memfile::open_peer(pid, fd, false)?;
        if len != TABLE_BYTES as u64 {
            return Err(format!("pid {pid} fd {fd}: {len} bytes, not a key table"));
        }
        let meta = file.metadata().map_err(|e| e.to_string())?;
        // SAFETY: a fresh read-only mapping of a file whose size is sealed (so it stays
        // backed); no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                TABLE_BYTES,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!("mmap: {}", std::io::Error::last_os_error()));
        }
        let entries = NonNull::new(p.cast()).expect("mmap gave a mapping");
        let keys = PeerKeys {
            entries,
            pid,
            cma: AtomicBool::new(true),
            maps: std::fs::File::open(format!("/proc/{pid}/maps")).ok(),
        };
        Ok((keys, (meta.dev(), meta.ino())))
    }

    /// What the peer's entry says of `key` now, as `keys::remote_of` reads a copy (None:
    /// the slot holds another key, or changed while read).
    pub(crate) fn read(&self, key: u32) -> Option<Remote> {
        // SAFETY: the slot is inside the mapping (SLOTS entries); atomics only.
        let e = unsafe { &*self.entries.as_ptr().add(key as usize % SLOTS) };
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

impl Drop for PeerKeys {
    fn drop(&mut self) {
        // SAFETY: our mapping; nothing borrows it past `read`.
        unsafe { libc::munmap(self.entries.as_ptr().cast(), TABLE_BYTES) };
    }
}

/// The peers' tables a device has mapped, by file identity: one mapping per peer process
/// however many connections it has with us.
#[derive(Default)]
pub(crate) struct PeerKeysCache {
    mapped: Mutex<HashMap<(u64, u64), Weak<PeerKeys>>>,
}

impl PeerKeysCache {
    /// The peer's table named in its handshake (`share`: pid and descriptor, 8 bytes), or
    /// None: not offered, or not ours to open (another user, a ptrace policy); the QP
    /// then reads entries through the provider.
    pub(crate) fn get(&self, share: &[u8]) -> Option<Arc<PeerKeys>> {
        let [p0, p1, p2, p3, f0, f1, f2, f3] = *share else {
            return None;
        };
        let (pid, fd) = (
            u32::from_le_bytes([p0, p1, p2, p3]),
            u32::from_le_bytes([f0, f1, f2, f3]),
        );
        let (keys, id) = PeerKeys::open(pid, fd)
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
}

/// Our share as the handshake carries it (empty: none).
pub(crate) fn encode_share(share: Option<(u32, u32)>) -> Vec<u8> {
    share.map_or_else(Vec::new, |(pid, fd)| {
        let mut v = pid.to_le_bytes().to_vec();
        v.extend_from_slice(&fd.to_le_bytes());
        v
    })
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
        let share = encode_share(ours.share());
        let cache = PeerKeysCache::default();
        let theirs = cache.get(&share).expect("mapped");
        assert!(Arc::ptr_eq(&theirs, &cache.get(&share).expect("again")));
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
        assert_eq!(
            (
                back.start,
                back.length,
                back.rights,
                back.pd,
                back.provider_key
            ),
            (found.start, 4096, found.rights, 3, 99)
        );
        assert!(theirs.read(77 + SLOTS as u32).is_none());
        e.key.store(0, Ordering::Release);
        assert!(theirs.read(77).is_none());
        assert!(cache.get(&[1, 2, 3]).is_none());
    }
}
