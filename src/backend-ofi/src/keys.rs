//! The contexts DAT programs see, and what the initiator learns of them.
//!
//! DAT programs name remote memory by (rmr_context, virtual address); tcp,
//! shm and ofi_rxm take (key, offset from the registration's start), and
//! verbs takes (a key it chose itself, virtual address). Each device exports
//! a table, registered for remote reads, with one entry per key slot: (our
//! key, the provider's key, start, length, rights and PZ). The context is
//! always our key; the connection handshake carries the table's key and
//! address; an initiator reads a context's entry once per connection (one
//! RDMA read, no CPU on the target), checks each request against it and
//! addresses the provider's key it names; on shm before every RDMA request,
//! and on providers choosing their own keys before every request through a
//! window (`Domain::fresh_lookup`).
//! A freed registration's key is never reused (keys come from a counter), so
//! a cached entry never applies to other memory: an access through a freed
//! key fails at the provider's key check.
//!
//! A key's slot is its value modulo SLOTS, so the counter skips values whose
//! slot a live key holds (`KeyTable::reserve`): were a new key to take a
//! live one's slot, every later read of the live key would find the other
//! one and refuse the access (after 65536 registrations in a long run).

use std::ptr::null_mut;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use daplrs_backend::{Error, Resource, Result};
use ofi_sys as fi;

use crate::keymap::TableMemory;
use crate::opened;
use crate::Fid;

/// Key slots of the table (an entry per slot: at most this many registrations
/// are findable at once; a key is only given out while its slot is free).
pub(crate) const SLOTS: usize = 1 << 16;

/// One entry as the peer reads it: the key last registered in the slot, the
/// provider's key of that registration (the same where we choose keys), the
/// start and the length of its memory, and its remote rights (low half, with
/// WINDOW) and protection domain (high half): the initiator checks those
/// itself, since the provider sees no protection domains and drops a
/// connection on a refused access without saying why (docs/libfabric.md,
/// Memory, "The initiator's checks").
#[repr(C)]
#[derive(Default)]
pub(crate) struct Entry {
    pub(crate) key: AtomicU64,
    pub(crate) start: AtomicU64,
    pub(crate) length: AtomicU64,
    pub(crate) scope: AtomicU64,
    pub(crate) provider_key: AtomicU64,
}

// SAFETY: atomics only: an entry may lie in a table file a peer maps (keymap.rs).
unsafe impl daplrs_backend::shared_map::SharedWords for Entry {}

impl Entry {
    /// Holds `found` for `key`. The key last: a peer that reads the slot
    /// while it changes sees the old key (gone) or the new one with its start.
    pub(crate) fn fill(&self, key: u32, found: &Remote) {
        self.key.store(0, Ordering::Release);
        self.provider_key
            .store(found.provider_key, Ordering::Release);
        self.start.store(found.start, Ordering::Release);
        self.length.store(found.length, Ordering::Release);
        let scope = ((found.pd as u64) << 32) | found.rights as u64;
        self.scope.store(scope, Ordering::Release);
        self.key.store(key as u64, Ordering::Release);
    }
}

/// In an entry's rights: the key is a window's binding (an unbind or rebind
/// ends it while peers may hold it: `Domain::fresh_lookup`).
pub(crate) const WINDOW: u32 = 1 << 31;

/// What a peer's entry says of one of its keys.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Remote {
    pub start: u64,
    pub length: u64,
    /// `daplrs_backend::access` bits, and WINDOW.
    pub rights: u32,
    pub pd: u32,
    /// What the provider is given as the RMA key.
    pub provider_key: u64,
}

pub(crate) const ENTRY_BYTES: usize = std::mem::size_of::<Entry>();

#[cfg(test)]
impl Remote {
    /// Every field, for tests to compare at once.
    pub(crate) fn fields(&self) -> (u64, u64, u32, u32, u64) {
        (
            self.start,
            self.length,
            self.rights,
            self.pd,
            self.provider_key,
        )
    }
}

/// What a peer's handshake announced: its key table and its farewell word.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PeerTable {
    pub key: u64,
    pub address: u64,
    pub farewell_key: u64,
    pub farewell_address: u64,
    /// The peer QP's protection domain (0: not said).
    pub pd: u32,
    /// Where a peer on this host maps the table (`keymap`; None: not offered).
    pub share: Option<crate::keymap::Share>,
}

/// The device's exported table.
pub(crate) struct KeyTable {
    /// Held for the registration's life, and declared before the entries:
    /// fields drop in order, so the registration closes before the memory goes.
    #[allow(dead_code)]
    mr: Fid<fi::fid_mr>,
    /// Shared with peers on this host (`keymap`).
    memory: TableMemory,
    /// Which key holds each slot (not exported).
    claims: Claims,
    /// What a peer passes as the RMA key and the address of entry 0.
    pub key: u64,
    pub address: u64,
}

impl KeyTable {
    /// The doorbell peers on this host ring (`keymap`): the progress thread's eventfd.
    pub(crate) fn set_bell(&self, fd: std::os::fd::RawFd) {
        self.memory.set_bell(fd);
    }

    /// Our sign of life for peers on this host, held by the calling thread (`keymap`).
    pub(crate) fn hold_alive(&self) -> crate::keymap::Alive {
        self.memory.hold_alive()
    }

    /// Where `key`'s memory lies in an arena of ours, for peers on this host (`arenas`).
    pub(crate) fn set_span(&self, key: u32, span: Option<daplrs_backend::arena::ArenaSpan>) {
        self.memory.set_span(key, span);
    }

    /// Asks a peer on this host (its table's `token`) for `key`'s arena (`arenas`).
    pub(crate) fn ask(&self, token: u64, key: u32) {
        self.memory.ask(token, key);
    }

    /// Our table's token, which peers' requests name.
    pub(crate) fn token(&self) -> u64 {
        self.memory.token()
    }

    /// The memory of our live registration `key` (start, length); None for a window's key
    /// or a key not live.
    pub(crate) fn region(&self, key: u32) -> Option<(u64, u64)> {
        let e = self.entry(key);
        let (start, length) = (
            e.start.load(Ordering::Acquire),
            e.length.load(Ordering::Acquire),
        );
        let rights = e.scope.load(Ordering::Acquire) as u32;
        let live = e.key.load(Ordering::Acquire) == key as u64;
        (live && rights & WINDOW == 0).then_some((start, length))
    }

    /// How the progress thread naps, which says when peers ring (`keymap::Nap`).
    pub(crate) fn set_nap(&self, nap: crate::keymap::Nap) {
        self.memory.set_nap(nap);
    }

    /// Where our consumers' polls are stamped (`keymap::PollStamp`).
    pub(crate) fn poll_stamp(&self) -> crate::keymap::PollStamp {
        self.memory.poll_stamp()
    }

    /// Registers the table for remote reads; `by_offset`: the provider
    /// addresses registrations by offset (the table's entry 0 is then at 0).
    pub(crate) fn open(domain: *mut fi::fid_domain, by_offset: bool) -> Result<KeyTable> {
        let memory = TableMemory::new().map_err(|e| {
            log::warn!("key table: {e}");
            Error::NoResource(Resource::Host)
        })?;
        let base = memory.entries().as_ptr();
        let iov = libc::iovec {
            iov_base: base as *mut libc::c_void,
            iov_len: SLOTS * ENTRY_BYTES,
        };
        let attr = fi::fi_mr_attr {
            mr_iov: (&iov as *const libc::iovec).cast(),
            iov_count: 1,
            access: fi::FI_REMOTE_READ as u64,
            // Our registrations' keys count up from 1; the table's is apart.
            requested_key: u32::MAX as u64,
            ..Default::default()
        };
        let mut mr = null_mut();
        // SAFETY: an open domain; `memory` stays mapped while the registration lives
        // (both are fields of the table, the registration dropped first).
        let rc = unsafe { fi::fi_mr_regattr(domain, &attr, 0, &mut mr) };
        opened(
            rc,
            "fi_mr_regattr (key table)",
            Error::NoResource(Resource::Key),
        )?;
        let mr = Fid(mr);
        // SAFETY: the registration just made.
        let key = unsafe { fi::fi_mr_key(mr.ptr()) };
        let address = if by_offset { 0 } else { base as u64 };
        Ok(KeyTable {
            memory,
            claims: Claims::new(),
            mr,
            key,
            address,
        })
    }

    /// Whether the domain gives overlapping registrations keys of their own:
    /// registers the table's first entry again and compares the keys.
    /// libfabric's MR cache (verbs, 1.17: `FI_MR_CACHE_MONITOR`) hands out
    /// the registration that covers the memory already, with every remote
    /// right and kept after it is closed: a freed LMR's or unbound window's
    /// context would keep granting access, and two LMRs would share a key.
    pub(crate) fn registrations_distinct(&self, domain: *mut fi::fid_domain) -> bool {
        let iov = libc::iovec {
            iov_base: self.memory.entries().as_ptr() as *mut libc::c_void,
            iov_len: ENTRY_BYTES,
        };
        let attr = fi::fi_mr_attr {
            mr_iov: (&iov as *const libc::iovec).cast(),
            iov_count: 1,
            access: fi::FI_REMOTE_READ as u64,
            requested_key: u32::MAX as u64 - 1,
            ..Default::default()
        };
        let mut mr = null_mut();
        // SAFETY: an open domain; the entries outlive the registration, closed
        // (Fid's drop) before this returns.
        let rc = unsafe { fi::fi_mr_regattr(domain, &attr, 0, &mut mr) };
        if rc != 0 {
            return true;
        }
        let again = Fid(mr);
        // SAFETY: the registration just made.
        unsafe { fi::fi_mr_key(again.ptr()) != self.key }
    }

    fn entry(&self, key: u32) -> &Entry {
        &self.memory.entries()[key as usize % SLOTS]
    }

    /// What a peer on this host maps to read entries in place: our pid and descriptor.
    pub(crate) fn share(&self) -> Option<crate::keymap::Share> {
        self.memory.share()
    }

    /// A key for a registration to be published: the next counter value
    /// whose slot no live key holds (the slot is then the key's until
    /// `withdraw` or `release`). None: every slot is taken.
    pub(crate) fn reserve(&self, counter: &AtomicU32) -> Option<u32> {
        self.claims.reserve(counter)
    }

    /// Gives back a reserved key that was never published.
    pub(crate) fn release(&self, key: u32) {
        self.claims.release(key);
    }

    /// A registration made: findable by its key (ours) from now on. False
    /// (nothing published) when another live key holds the slot (a key not
    /// from `reserve`).
    #[must_use]
    pub(crate) fn publish(&self, key: u32, found: &Remote) -> bool {
        if !self.claims.claim(key) {
            return false;
        }
        self.entry(key).fill(key, found);
        true
    }

    /// A registration freed: its key reads as gone, its slot is free again.
    pub(crate) fn withdraw(&self, key: u32) {
        let e = self.entry(key);
        let _ = e
            .key
            .compare_exchange(key as u64, 0, Ordering::AcqRel, Ordering::Relaxed);
        self.claims.release(key);
    }

    /// The RMA address of entry `key`'s slot in a peer's table at `table_address`.
    pub(crate) fn remote_slot(table_address: u64, key: u32) -> u64 {
        table_address + (key as usize % SLOTS * ENTRY_BYTES) as u64
    }
}

/// What a read of a peer's entry says of `key`, or None when the slot holds
/// another key (freed, or never registered).
pub(crate) fn remote_of(raw: &[u8; ENTRY_BYTES], key: u32) -> Option<Remote> {
    let word = |i: usize| u64::from_ne_bytes(raw[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    (word(0) == key as u64).then(|| Remote {
        start: word(1),
        length: word(2),
        rights: word(3) as u32,
        pd: (word(3) >> 32) as u32,
        provider_key: word(4),
    })
}

/// The key holding each slot (0: free), reserved before the registration is
/// made and freed when it is withdrawn.
struct Claims {
    owners: Box<[AtomicU32]>,
}

impl Claims {
    fn new() -> Claims {
        Claims {
            owners: (0..SLOTS).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    fn owner(&self, key: u32) -> &AtomicU32 {
        &self.owners[key as usize % SLOTS]
    }

    /// Takes the slot of `key` unless another key holds it.
    fn claim(&self, key: u32) -> bool {
        match self
            .owner(key)
            .compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => true,
            Err(holder) => holder == key,
        }
    }

    fn release(&self, key: u32) {
        let _ = self
            .owner(key)
            .compare_exchange(key, 0, Ordering::AcqRel, Ordering::Relaxed);
    }

    /// The next counter value whose slot is free, claimed; 0 and u32::MAX
    /// (the table's own key) are skipped. One pass over the slots at most.
    fn reserve(&self, counter: &AtomicU32) -> Option<u32> {
        for _ in 0..SLOTS + 2 {
            let key = counter.fetch_add(1, Ordering::Relaxed);
            if key != 0 && key != u32::MAX && self.claim(key) {
                return Some(key);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Several threads make and free registrations (more than SLOTS keys
    /// in all) while some stay live: no key is ever given out twice and no
    /// live key loses its slot, so a lookup of a live key finds that key.
    #[test]
    fn live_keys_keep_their_slots_under_concurrent_churn() {
        let claims = Arc::new(Claims::new());
        let counter = Arc::new(AtomicU32::new(1));
        let live: Vec<u32> = (0..100)
            .map(|_| claims.reserve(&counter).expect("a free slot"))
            .collect();
        let churners: Vec<_> = (0..4)
            .map(|_| {
                let (claims, counter) = (claims.clone(), counter.clone());
                std::thread::spawn(move || {
                    let mut held = std::collections::VecDeque::new();
                    for _ in 0..SLOTS / 2 + 1000 {
                        let key = claims.reserve(&counter).expect("a free slot");
                        assert_eq!(claims.owner(key).load(Ordering::Acquire), key);
                        held.push_back(key);
                        if held.len() > 50 {
                            claims.release(held.pop_front().expect("held"));
                        }
                    }
                    held
                })
            })
            .collect();
        let mut still: Vec<u32> = live.clone();
        for c in churners {
            still.extend(c.join().expect("churner"));
        }
        assert!(counter.load(Ordering::Relaxed) as usize > SLOTS);
        for key in still {
            assert_eq!(claims.owner(key).load(Ordering::Acquire), key, "key {key}");
        }
        for key in live {
            assert!(!claims.claim(key + SLOTS as u32));
        }
    }

    /// An entry read as a peer reads it (its bytes) gives back what was
    /// published, the provider's own key included; another key finds nothing.
    #[test]
    fn an_entry_reads_back_with_the_providers_key() {
        let entry = Entry::default();
        let found = Remote {
            start: 0x7f00_1234_5000,
            length: 8192,
            rights: daplrs_backend::access::REMOTE_READ | WINDOW,
            pd: 7,
            provider_key: 0x1_2345_6789,
        };
        entry.fill(42, &found);
        let mut raw = [0u8; ENTRY_BYTES];
        // SAFETY: Entry is repr(C), ENTRY_BYTES of plain words.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&entry as *const Entry).cast::<u8>(),
                raw.as_mut_ptr(),
                ENTRY_BYTES,
            )
        };
        let back = remote_of(&raw, 42).expect("key 42's entry");
        assert_eq!(
            back.fields(),
            (found.start, 8192, found.rights, 7, 0x1_2345_6789)
        );
        assert!(remote_of(&raw, 42 + SLOTS as u32).is_none());
    }

    #[test]
    fn a_full_table_gives_no_key_and_a_release_frees_one() {
        let claims = Claims::new();
        let counter = AtomicU32::new(1);
        let keys: Vec<u32> = (0..SLOTS)
            .filter_map(|_| claims.reserve(&counter))
            .collect();
        assert_eq!(keys.len(), SLOTS);
        assert_eq!(claims.reserve(&counter), None);
        claims.release(keys[7]);
        assert_eq!(
            claims.reserve(&counter).map(|k| k as usize % SLOTS),
            Some(keys[7] as usize % SLOTS)
        );
    }
}
