//! What a handle points at: a 32-byte slot holding the word C's registry dispatches through and
//! the live object, which a lookup takes without a lock.
//!
//! A slot is never unmapped (space.rs), so any thread may read one whatever happened to its
//! object: resolving a handle is a range check, a load of the slot's tag and, if the tag names
//! the kind asked for, a reference taken on the object. The tag counts the lookups in flight; a
//! removal first clears the kind (no lookup starts after that) and then waits for the count
//! to drain before it lets the slot's reference go, so a lookup that read the object pointer
//! always finds the object alive. No thread-local cache, no table lock on the way.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::HandleKind;

/// The tag's low half: lookups between their count and their release.
const READERS: usize = (1 << 32) - 1;
const KIND_SHIFT: u32 = 32;

#[repr(C, align(32))]
pub(crate) struct Slot {
    /// The DAT_PROVIDER pointer C's registry jumps through: the handle is this word's address.
    pub(super) dispatch: AtomicUsize,
    /// `(kind + 1) << 32` while an object of that kind is live (0 when none), plus the lookups
    /// in flight.
    tag: AtomicUsize,
    /// `Arc::into_raw` of the live object: the slot's own reference.
    object: AtomicUsize,
    /// Drops that reference (`release::<T>` for the object's type).
    release: AtomicUsize,
}

impl Slot {
    pub(super) const fn empty() -> Slot {
        Slot {
            dispatch: AtomicUsize::new(0),
            tag: AtomicUsize::new(0),
            object: AtomicUsize::new(0),
            release: AtomicUsize::new(0),
        }
    }

    fn live(kind: HandleKind) -> usize {
        (kind as usize + 1) << KIND_SHIFT
    }

    /// Whether nothing is published here and no lookup is in flight (a slot may be reissued).
    pub(super) fn is_vacant(&self) -> bool {
        self.tag.load(Ordering::Acquire) == 0
    }

    /// Publishes `object` as this slot's object of `kind`.
    pub(super) fn publish<T: Send + Sync + 'static>(&self, object: Arc<T>, kind: HandleKind) {
        self.object
            .store(Arc::into_raw(object) as usize, Ordering::Relaxed);
        self.release
            .store(release::<T> as unsafe fn(usize) as usize, Ordering::Relaxed);
        // An add, not a store: a stale lookup's count in flight stays balanced.
        self.tag.fetch_add(Self::live(kind), Ordering::Release);
    }

    /// The live object if it is of `kind`, with a reference of the caller's. `T` must be the
    /// type `kind`'s objects are published with (`HandleObject::KINDS` says which).
    #[inline]
    pub(super) fn get<T>(&self, kind: HandleKind) -> Option<Arc<T>> {
        let live = Self::live(kind);
        // A plain load first: a stale handle's slot (or a page given back) is never written.
        if self.tag.load(Ordering::Relaxed) & !READERS != live {
            return None;
        }
        let tag = self.tag.fetch_add(1, Ordering::Acquire);
        let object = if tag & !READERS == live {
            let p = self.object.load(Ordering::Relaxed) as *const T;
            // SAFETY: counted in the tag while the kind was live, so the removal that clears it
            // waits for this lookup before it drops the slot's reference: `p` is that
            // reference's object, an `Arc<T>` (the kind's type), alive until then.
            unsafe {
                Arc::increment_strong_count(p);
                Some(Arc::from_raw(p))
            }
        } else {
            None
        };
        self.tag.fetch_sub(1, Ordering::Release);
        object
    }

    /// Ends the slot's object: no lookup finds it from now on, and the slot's reference is
    /// dropped once the lookups in flight have taken theirs. Returns whether there was one.
    pub(super) fn retract(&self) -> bool {
        let tag = self.tag.fetch_and(READERS, Ordering::AcqRel);
        if tag & !READERS == 0 {
            return false;
        }
        let mut spins = 0u32;
        while self.tag.load(Ordering::Acquire) & READERS != 0 {
            // A lookup holds its count for a few instructions, unless it was preempted.
            spins += 1;
            if spins < 100 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        let object = self.object.swap(0, Ordering::Relaxed);
        let release = self.release.swap(0, Ordering::Relaxed);
        // SAFETY: `release` was stored by `publish` as `release::<T>` for the type of
        // `object`, whose reference is the slot's and is dropped here once.
        unsafe {
            let release: unsafe fn(usize) = std::mem::transmute(release);
            release(object);
        }
        true
    }
}

/// Drops the slot's reference to an `Arc<T>` published as `p`.
///
/// # Safety
/// `p` is `Arc::into_raw` of an `Arc<T>` whose reference the caller owns.
unsafe fn release<T>(p: usize) {
    // SAFETY: as the function's contract says.
    drop(unsafe { Arc::from_raw(p as *const T) });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// A lookup finds the object of its kind only, and nothing once it is retracted; the
    /// slot's reference is dropped then.
    #[test]
    fn a_slot_gives_its_kind_until_retracted() {
        let slot = Slot::empty();
        assert!(slot.get::<u64>(HandleKind::Ep).is_none());
        let object = Arc::new(7u64);
        slot.publish(object.clone(), HandleKind::Ep);
        assert_eq!(Arc::strong_count(&object), 2);
        assert!(slot.get::<u64>(HandleKind::Evd).is_none());
        let found = slot.get::<u64>(HandleKind::Ep).unwrap();
        assert_eq!(*found, 7);
        assert_eq!(Arc::strong_count(&object), 3);
        drop(found);
        assert!(slot.retract());
        assert!(!slot.retract());
        assert_eq!(Arc::strong_count(&object), 1);
        assert!(slot.get::<u64>(HandleKind::Ep).is_none());
        assert!(slot.is_vacant());
    }

    /// Lookups racing a retraction either get a live reference or nothing, never a freed one.
    #[test]
    fn lookups_racing_a_retraction_stay_sound() {
        static SLOT: Slot = Slot::empty();
        for round in 0..200 {
            let object = Arc::new(vec![round; 8]);
            SLOT.publish(object.clone(), HandleKind::Lmr);
            drop(object);
            let stop = Arc::new(AtomicBool::new(false));
            let readers: Vec<_> = (0..2)
                .map(|_| {
                    let stop = stop.clone();
                    std::thread::spawn(move || {
                        let mut found = 0;
                        while !stop.load(Ordering::Relaxed) {
                            if let Some(v) = SLOT.get::<Vec<i32>>(HandleKind::Lmr) {
                                assert_eq!(v[7], round);
                                found += 1;
                            }
                        }
                        found
                    })
                })
                .collect();
            std::thread::yield_now();
            assert!(SLOT.retract());
            stop.store(true, Ordering::Relaxed);
            for r in readers {
                r.join().unwrap();
            }
            assert!(SLOT.is_vacant());
        }
    }
}
