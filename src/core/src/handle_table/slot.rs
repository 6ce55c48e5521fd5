//! What a handle points at: a 32-byte slot holding the word C's registry dispatches through and
//! the live object, which a lookup takes without a lock.
//!
//! A slot is never unmapped (space.rs), so any thread may read one whatever happened to its
//! object: resolving a handle is a range check, a load of the slot's tag and, if the tag names
//! the kind asked for, a count of the lookup in the tag, which holds the object until the
//! lookup is done (`hold`, `unhold`). A removal clears the kind (no lookup starts after that)
//! and drops the slot's reference at once if no lookup holds it; else it marks the slot, and
//! the last lookup to leave drops the reference. No thread-local cache, no table lock, no wait.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::HandleKind;

/// The tag's low half: lookups holding the object.
const READERS: usize = (1 << 32) - 1;
const KIND_SHIFT: u32 = 32;
/// The kind's bits (`(kind + 1) << KIND_SHIFT`; 0: none).
const KIND: usize = 0xff << KIND_SHIFT;
/// Set by a removal that found lookups holding the object: the last to leave drops the
/// slot's reference.
const RELEASE_PENDING: usize = 1 << 62;

#[repr(C, align(32))]
pub(crate) struct Slot {
    /// The DAT_PROVIDER pointer C's registry jumps through: the handle is this word's address.
    pub(super) dispatch: AtomicUsize,
    /// `(kind + 1) << 32` while an object of that kind is live (0 when none), plus the lookups
    /// holding the object, plus `RELEASE_PENDING` while a removed object waits for the last.
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

    /// Counts a lookup of the live object if it is of `kind`: its pointer, the object alive
    /// until the matching `unhold`. `T` must be the type `kind`'s objects are published with
    /// (`HandleObject::KINDS` says which).
    #[inline]
    pub(super) fn hold<T>(&self, kind: HandleKind) -> Option<*const T> {
        let live = Self::live(kind);
        // A plain load first: a stale handle's slot (or a page given back) is never written.
        if self.tag.load(Ordering::Relaxed) & KIND != live {
            return None;
        }
        let tag = self.tag.fetch_add(1, Ordering::Acquire);
        if tag & KIND != live {
            self.unhold();
            return None;
        }
        Some(self.object.load(Ordering::Relaxed) as *const T)
    }

    /// A lookup counted by `hold` is done; the last to leave a removed slot drops its reference.
    #[inline]
    pub(super) fn unhold(&self) {
        let before = self.tag.fetch_sub(1, Ordering::AcqRel);
        if before & READERS == 1 && before & RELEASE_PENDING != 0 {
            self.release_object();
            self.tag.fetch_and(!RELEASE_PENDING, Ordering::Release);
        }
    }

    /// The live object if it is of `kind`, with a reference of the caller's.
    #[inline]
    pub(super) fn get<T>(&self, kind: HandleKind) -> Option<Arc<T>> {
        let p = self.hold::<T>(kind)?;
        // SAFETY: held, `p` is the slot's `Arc<T>`'s object (the kind's type), alive.
        let object = unsafe {
            Arc::increment_strong_count(p);
            Arc::from_raw(p)
        };
        self.unhold();
        Some(object)
    }

    /// Ends the slot's object: no lookup finds it from now on, and the slot's reference is
    /// dropped now, or by the last lookup holding it. Returns whether there was one.
    pub(super) fn retract(&self) -> bool {
        let tag = self.tag.fetch_and(READERS, Ordering::AcqRel);
        if tag & KIND == 0 {
            return false;
        }
        let mut now = tag & READERS;
        loop {
            if now & READERS == 0 {
                self.release_object();
                return true;
            }
            match self.tag.compare_exchange(
                now,
                now | RELEASE_PENDING,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(seen) => now = seen,
            }
        }
    }

    /// Drops the slot's reference (once: a retraction's, or its last lookup's).
    fn release_object(&self) {
        let object = self.object.swap(0, Ordering::Relaxed);
        let release = self.release.swap(0, Ordering::Relaxed);
        if release == 0 {
            return;
        }
        // SAFETY: `release` was stored by `publish` as `release::<T>` for the type of
        // `object`, whose reference is the slot's and is dropped here once.
        unsafe {
            let release: unsafe fn(usize) = std::mem::transmute(release);
            release(object);
        }
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

    /// A removal while a lookup holds the object leaves it to that lookup to drop the slot's
    /// reference; the slot is vacant after.
    #[test]
    fn the_last_holder_of_a_removed_object_releases_it() {
        let slot = Slot::empty();
        let object = Arc::new(5u32);
        slot.publish(object.clone(), HandleKind::Evd);
        let p = slot.hold::<u32>(HandleKind::Evd).unwrap();
        let q = slot.hold::<u32>(HandleKind::Evd).unwrap();
        assert!(slot.retract());
        assert!(slot.hold::<u32>(HandleKind::Evd).is_none());
        // SAFETY: held.
        assert_eq!(unsafe { *p }, 5);
        assert_eq!(
            Arc::strong_count(&object),
            2,
            "held: the slot's reference stays"
        );
        slot.unhold();
        assert_eq!(Arc::strong_count(&object), 2);
        // SAFETY: still held once.
        assert_eq!(unsafe { *q }, 5);
        slot.unhold();
        assert_eq!(Arc::strong_count(&object), 1, "the last holder dropped it");
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
