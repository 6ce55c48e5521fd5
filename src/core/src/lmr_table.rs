//! An IA's LMRs by lmr_context: what a post checks of each segment (bounds, privileges, PZ),
//! read without a lock (docs/architecture.md, "The DTO path to build").
//!
//! Every post checks every segment of its IOV here. Under the IA's LMR mutex, that check wrote
//! the mutex's cache line twice a post, which threads posting on different EPs of one IA then
//! passed between their CPUs. Now the checks read an open-addressed array of plain values
//! under a sequence count (a seqlock): create and free change it under the table's mutex,
//! making the count odd while they write and even again after, and a reader that saw the
//! count change (or odd) reads again. A reader writes nothing.
//!
//! The array grows by tiers that are never given back while the IA lives, so a reader that
//! loaded the current tier just before a writer moved to the next still reads memory that is
//! there (and then rereads, as the count changed). When freed regions' tombstones fill it (a
//! consumer that registers per message), the writer rebuilds it in place from its own map.

use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::Mutex;

use super::consts::mem_priv;
use super::error::{DatError, DatResult, ErrorType, Param, SubType};
use super::handle_table::AnyObject;
use daplrs_backend::intmap::IntMap;
use daplrs_backend::{Sge, SgeList};

/// What a post checks of an LMR, kept as plain values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RegionCheck {
    /// The LMR's PZ, by address (compared, never followed).
    pub pz: usize,
    pub addr: u64,
    pub len: u64,
    pub privileges: u32,
}

impl RegionCheck {
    /// Whether `[addr, addr + len)` lies inside the region.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        let Some(end) = self.addr.checked_add(self.len) else {
            return false;
        };
        addr >= self.addr && addr.checked_add(len).is_some_and(|e| e <= end)
    }
}

/// An entry's state, in the low bits of its key word (the lmr_context above them).
const EMPTY: u64 = 0;
const LIVE: u64 = 1;
const DEAD: u64 = 2;

/// One slot of the array; every field an atomic, read relaxed under the sequence count.
#[derive(Default)]
struct Entry {
    key: AtomicU64,
    pz: AtomicUsize,
    addr: AtomicU64,
    len: AtomicU64,
    privileges: AtomicU64,
}

impl Entry {
    fn read(&self) -> RegionCheck {
        RegionCheck {
            pz: self.pz.load(Ordering::Relaxed),
            addr: self.addr.load(Ordering::Relaxed),
            len: self.len.load(Ordering::Relaxed),
            privileges: self.privileges.load(Ordering::Relaxed) as u32,
        }
    }

    fn write(&self, key: u32, r: &RegionCheck) {
        self.pz.store(r.pz, Ordering::Relaxed);
        self.addr.store(r.addr, Ordering::Relaxed);
        self.len.store(r.len, Ordering::Relaxed);
        self.privileges
            .store(u64::from(r.privileges), Ordering::Relaxed);
        self.key
            .store(u64::from(key) << 2 | LIVE, Ordering::Relaxed);
    }
}

/// Tier `t` holds `FIRST_TIER << t` entries: up to 2^27, far beyond any device's LMRs.
const FIRST_TIER: usize = 64;
const TIERS: usize = 22;

/// What create and free keep under the mutex: the LMRs themselves (for lookups that need the
/// object, as DAT 1.2's dat_rmr_bind; an `Lmr`, which lmr.rs downcasts: the IA's table sits
/// below it) and the array's occupancy.
#[derive(Default)]
struct Writer {
    regions: IntMap<u32, (Weak<AnyObject>, RegionCheck)>,
    /// Entries not EMPTY in the current tier (live and tombstones).
    used: usize,
}

pub(crate) struct LmrTable {
    seq: AtomicU64,
    tier: AtomicUsize,
    tiers: [OnceLock<Box<[Entry]>>; TIERS],
    writer: Mutex<Writer>,
}

impl Default for LmrTable {
    fn default() -> Self {
        LmrTable {
            seq: AtomicU64::new(0),
            tier: AtomicUsize::new(0),
            tiers: std::array::from_fn(|_| OnceLock::new()),
            writer: Mutex::new(Writer::default()),
        }
    }
}

fn slot_of(key: u32, mask: usize) -> usize {
    // Fibonacci hashing: TCP's keys differ in their high bits (index << 8 | generation),
    // verbs lkeys anywhere.
    ((u64::from(key).wrapping_mul(0x9E37_79B9_7F4A_7C15)) >> 32) as usize & mask
}

impl LmrTable {
    /// What a post checks of the LMR whose lmr_context is `key`, if it is live. No lock.
    #[inline]
    pub(crate) fn check(&self, key: u32) -> Option<RegionCheck> {
        let mut tries = 0u32;
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before & 1 == 0 {
                let found = self.probe(key);
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == before {
                    return found;
                }
            }
            // A write section is a few stores (no system call, no allocation): spin, but
            // give the CPU up should its writer have been preempted in one.
            tries += 1;
            match tries % 64 {
                0 => std::thread::yield_now(),
                _ => std::hint::spin_loop(),
            }
        }
    }

    /// Checks a local IOV against the LMRs: each non-empty segment must name a live LMR (else
    /// PRIVILEGES_VIOLATION) of the PZ `pz` (else PROTECTION_VIOLATION), lie inside it (else
    /// INVALID_PARAMETER on the local IOV) and have `need` privilege. Returns the segments to
    /// post and the total length.
    pub(crate) fn check_iov(&self, pz: usize, iov: &[Sge], need: u32) -> DatResult<(SgeList, u64)> {
        let mut out = SgeList::new();
        let total = self.check_iov_into(pz, iov, need, &mut out)?;
        Ok((out, total))
    }

    /// `check_iov`, appending the segments to post to `out` (the work request's own list: no
    /// copy of it on the post path); returns the total length. Inlined into each post: as a
    /// call of its own, its entry and exit were a sixth of it.
    #[inline(always)]
    pub(crate) fn check_iov_into(
        &self,
        pz: usize,
        iov: &[Sge],
        need: u32,
        out: &mut SgeList,
    ) -> DatResult<u64> {
        let mut total: u64 = 0;
        for seg in iov {
            if seg.length == 0 {
                continue;
            }
            let lmr = self.check(seg.lkey).ok_or_else(|| {
                DatError::new(
                    ErrorType::PrivilegesViolation,
                    if need == mem_priv::LOCAL_READ {
                        SubType::PrivilegesRead
                    } else {
                        SubType::PrivilegesWrite
                    },
                )
            })?;
            if lmr.pz != pz {
                return Err(DatError::new(
                    ErrorType::ProtectionViolation,
                    if need == mem_priv::LOCAL_READ {
                        SubType::ProtectionRead
                    } else {
                        SubType::ProtectionWrite
                    },
                ));
            }
            if !lmr.contains(seg.addr, u64::from(seg.length)) {
                return Err(DatError::bad(Param::LocalIov));
            }
            // Local write privilege implies local read, as on every RDMA NIC
            // (verbs has no local-read flag): OFED's dtest sends from an LMR
            // registered with DAT_MEM_PRIV_LOCAL_WRITE_FLAG alone.
            let granted = if need == mem_priv::LOCAL_READ {
                lmr.privileges & (mem_priv::LOCAL_READ | mem_priv::LOCAL_WRITE)
            } else {
                lmr.privileges & need
            };
            if granted == 0 {
                return Err(DatError::new(
                    ErrorType::PrivilegesViolation,
                    if need == mem_priv::LOCAL_READ {
                        SubType::PrivilegesRead
                    } else {
                        SubType::PrivilegesWrite
                    },
                ));
            }
            total += u64::from(seg.length);
            out.push(*seg);
        }
        Ok(total)
    }

    #[inline]
    fn probe(&self, key: u32) -> Option<RegionCheck> {
        let entries = self.tiers[self.tier.load(Ordering::Relaxed)].get()?;
        let mask = entries.len() - 1;
        let want = u64::from(key) << 2 | LIVE;
        let mut i = slot_of(key, mask);
        for _ in 0..entries.len() {
            let e = &entries[i];
            match e.key.load(Ordering::Relaxed) {
                k if k == want => return Some(e.read()),
                k if k & 3 == EMPTY => return None,
                _ => i = (i + 1) & mask,
            }
        }
        None
    }

    /// The live LMR whose lmr_context is `key` (see `Writer`).
    pub(crate) fn lmr(&self, key: u32) -> Option<Arc<AnyObject>> {
        self.writer.lock().regions.get(&key)?.0.upgrade()
    }

    /// Enters a new LMR; false if the array cannot hold another (2^26 live).
    pub(crate) fn insert(&self, key: u32, lmr: Weak<AnyObject>, region: RegionCheck) -> bool {
        let mut w = self.writer.lock();
        if w.regions.remove(&key).is_some() {
            // A context the device reissued while we still held it: the old entry goes.
            self.write_section(|| self.kill(key));
        }
        let tier = self.tier.load(Ordering::Relaxed);
        let cap = FIRST_TIER << tier;
        let live = w.regions.len() + 1;
        if (w.used + 1) * 2 > cap {
            // Grow to keep it at most half live; else only tombstones filled it: rebuild.
            let mut want = tier;
            while (FIRST_TIER << want) < live * 4 {
                want += 1;
            }
            if want >= TIERS {
                return false;
            }
            // Allocated before the write section, which readers wait out.
            self.tiers[want].get_or_init(|| new_entries(FIRST_TIER << want));
            w.regions.insert(key, (lmr, region));
            self.write_section(|| self.rebuild(&mut w, want));
            return true;
        }
        w.regions.insert(key, (lmr, region));
        self.tiers[tier].get_or_init(|| new_entries(FIRST_TIER << tier));
        self.write_section(|| {
            if self.place(tier, key, &region) {
                w.used += 1;
            }
        });
        true
    }

    /// Takes the LMR whose lmr_context is `key` out: no check finds it from now on.
    pub(crate) fn remove(&self, key: u32) {
        let mut w = self.writer.lock();
        if w.regions.remove(&key).is_some() {
            self.write_section(|| self.kill(key));
        }
    }

    /// Makes `key`'s live entry a tombstone (in a write section, under the mutex).
    fn kill(&self, key: u32) {
        let Some(entries) = self.tiers[self.tier.load(Ordering::Relaxed)].get() else {
            return;
        };
        let mask = entries.len() - 1;
        let want = u64::from(key) << 2 | LIVE;
        let mut i = slot_of(key, mask);
        for _ in 0..entries.len() {
            let k = entries[i].key.load(Ordering::Relaxed);
            if k == want {
                entries[i]
                    .key
                    .store(u64::from(key) << 2 | DEAD, Ordering::Relaxed);
                return;
            }
            if k & 3 == EMPTY {
                return;
            }
            i = (i + 1) & mask;
        }
    }

    /// Runs `f` with the sequence count odd: readers meanwhile read again.
    fn write_section(&self, f: impl FnOnce()) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        f();
        self.seq.store(s + 2, Ordering::Release);
    }

    /// Puts `key` in the first tombstone or empty entry of its probe in tier `tier`; true if
    /// that entry was empty (the array's occupancy grew).
    fn place(&self, tier: usize, key: u32, region: &RegionCheck) -> bool {
        let entries = self.tiers[tier].get_or_init(|| new_entries(FIRST_TIER << tier));
        let mask = entries.len() - 1;
        let mut i = slot_of(key, mask);
        loop {
            let k = entries[i].key.load(Ordering::Relaxed) & 3;
            if k != LIVE {
                entries[i].write(key, region);
                return k == EMPTY;
            }
            i = (i + 1) & mask;
        }
    }

    /// Makes tier `tier` (the current one or a larger) hold exactly the live regions.
    fn rebuild(&self, w: &mut Writer, tier: usize) {
        let entries = self.tiers[tier].get_or_init(|| new_entries(FIRST_TIER << tier));
        for e in entries.iter() {
            e.key.store(EMPTY, Ordering::Relaxed);
        }
        for (key, (_, region)) in w.regions.iter() {
            self.place(tier, *key, region);
        }
        w.used = w.regions.len();
        self.tier.store(tier, Ordering::Relaxed);
    }
}

fn new_entries(n: usize) -> Box<[Entry]> {
    (0..n).map(|_| Entry::default()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(i: u64) -> RegionCheck {
        RegionCheck {
            pz: 1,
            addr: i << 12,
            len: 4096,
            privileges: 3,
        }
    }

    #[test]
    fn finds_what_is_live_through_growth_and_churn() {
        let t = LmrTable::default();
        assert_eq!(t.check(7), None);
        // Growth: 1,000 live regions, keys shaped as TCP's (index << 8 | generation).
        for i in 0..1000u32 {
            assert!(t.insert(i << 8 | 1, Weak::<()>::new(), region(u64::from(i))));
        }
        for i in 0..1000u32 {
            assert_eq!(t.check(i << 8 | 1), Some(region(u64::from(i))));
            assert_eq!(t.check(i << 8 | 2), None);
        }
        // Churn: register and free per message, far more times than the array has entries;
        // tombstones are rebuilt away and the live ones stay found.
        for n in 0..100_000u32 {
            let key = (2000 + n % 7) << 8 | (n / 7) & 0xff;
            assert!(t.insert(key, Weak::<()>::new(), region(9)));
            assert_eq!(t.check(key), Some(region(9)));
            t.remove(key);
            assert_eq!(t.check(key), None);
        }
        for i in (0..1000u32).step_by(2) {
            t.remove(i << 8 | 1);
        }
        for i in 0..1000u32 {
            let want = (i % 2 == 1).then(|| region(u64::from(i)));
            assert_eq!(t.check(i << 8 | 1), want);
        }
        assert!(t.tier.load(Ordering::Relaxed) <= 6, "grew past 4x live");
    }

    #[test]
    fn readers_never_see_a_torn_or_missing_live_region() {
        let t = Arc::new(LmrTable::default());
        // One region stays live throughout; others come and go around it.
        assert!(t.insert(1 << 8, Weak::<()>::new(), region(1)));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (t, stop) = (t.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut looks = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    assert_eq!(t.check(1 << 8), Some(region(1)));
                    if let Some(r) = t.check(2 << 8) {
                        assert_eq!(r, region(2));
                    }
                    looks += 1;
                }
                looks
            })
        };
        // The others: one that comes and goes, and 20,000 more of which a third are freed,
        // so that the array grows and is rebuilt while the reader reads.
        for n in 0..20_000u32 {
            assert!(t.insert(2 << 8, Weak::<()>::new(), region(2)));
            assert!(t.insert((3 + n) << 8, Weak::<()>::new(), region(3)));
            t.remove(2 << 8);
            if n % 3 == 0 {
                t.remove((3 + n) << 8);
            }
        }
        // A context reissued while held replaces its entry.
        assert!(t.insert(5 << 8, Weak::<()>::new(), region(5)));
        assert_eq!(t.check(5 << 8), Some(region(5)));
        stop.store(true, Ordering::Relaxed);
        assert!(reader.join().expect("reader") > 0);
    }
}
