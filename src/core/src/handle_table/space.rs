//! Where handle values come from: one 32-byte slot each in a reserved stretch of address space.
//!
//! A DAT handle must be the address of a word holding its DAT_PROVIDER pointer (libdat2 jumps
//! through it), so the handle *is* an address, and a freed handle names a new object as soon as
//! its address is handed out again. Instead of reusing freed headers, every creation takes the
//! next slot of a stretch of 2^32 (128 GiB of address space, reserved without memory): a value
//! comes back only after 2^32 further creations, so the position in the stretch is the handle's
//! generation. The slot begins with that word and holds the live object (slot.rs), so a lookup
//! reads the cache line the registry's dispatch has just read.
//!
//! Memory follows what is in use, not what was ever issued: a page of slots none of which is
//! live is given back to the kernel (it then reads as zeros) once the cursor is `WINDOW` slots
//! past it. Until then a stale handle still reads its provider pointer, so even a registry that
//! dereferences without checking (OFED's libdat2) reaches us and gets DAT_INVALID_HANDLE; ours
//! checks the word and refuses a zero one itself. A page keeps its memory while one of its
//! handles lives: 4 KiB per long-lived handle at worst (one in every 128 creations).

use std::sync::atomic::{AtomicUsize, Ordering};

use super::slot::Slot;
use daplrs_backend::intmap::IntMap;

/// Slots in the stretch: how many creations a freed handle stays unused for.
const SLOTS_LOG2: u32 = 32;
/// Smaller stretches tried when the address space is limited (RLIMIT_AS, strict overcommit).
const MIN_SLOTS_LOG2: u32 = 16;
const SLOT: usize = std::mem::size_of::<Slot>();
const PAGE: usize = 4096;
const SLOTS_PER_PAGE: u64 = (PAGE / SLOT) as u64;
/// Pages this many slots behind the cursor may be given back once empty.
const WINDOW: u64 = 1 << 16;

/// The stretch of the process's handles, for lookups that take no lock (`slot`): set once,
/// before the first handle is issued.
static BASE: AtomicUsize = AtomicUsize::new(0);
static END: AtomicUsize = AtomicUsize::new(0);

pub(super) struct Space {
    base: usize,
    slots: u64,
    /// Creations so far; the next slot is `issued % slots`.
    issued: u64,
    /// Live (or reserved) slots per page index; pages absent hold none.
    in_use: IntMap<u64, u32>,
    /// Whether pages can be given back (false for the heap fallback).
    releasable: bool,
}

impl Space {
    /// The process's stretch: lookups through `slot` find its slots.
    pub(super) fn new() -> Space {
        let space = Space::reserved();
        BASE.store(space.base, Ordering::Release);
        END.store(space.base + space.slots as usize * SLOT, Ordering::Release);
        space
    }

    fn reserved() -> Space {
        for log2 in (MIN_SLOTS_LOG2..=SLOTS_LOG2).rev() {
            let slots = 1u64 << log2;
            if let Some(base) = reserve(slots as usize * SLOT) {
                if log2 < SLOTS_LOG2 {
                    log::warn!("handles: only 2^{log2} slots of address space for handle values");
                }
                return Space::at(base, slots, true);
            }
        }
        // No mapping at all: a leaked heap block (values then recur after 2^16 creations).
        let slots = 1u64 << MIN_SLOTS_LOG2;
        let block: &'static [Slot] = Box::leak((0..slots).map(|_| Slot::empty()).collect());
        log::warn!("handles: no address space reserved; handle values recur sooner");
        Space::at(block.as_ptr() as usize, slots, false)
    }

    fn at(base: usize, slots: u64, releasable: bool) -> Space {
        Space {
            base,
            slots,
            issued: 0,
            in_use: IntMap::default(),
            releasable,
        }
    }

    /// Takes the next slot not `taken` (only slots of an earlier lap can be) and vacant,
    /// writes `dispatch` into its word and returns its address.
    pub(super) fn take(&mut self, dispatch: usize, taken: impl Fn(usize) -> bool) -> usize {
        loop {
            let index = self.issued % self.slots;
            self.issued += 1;
            if index.is_multiple_of(SLOTS_PER_PAGE) {
                self.passed_page(index / SLOTS_PER_PAGE);
            }
            let addr = self.addr(index);
            if self.issued > self.slots && (taken(addr) || !slot_at(addr).is_vacant()) {
                continue;
            }
            *self.in_use.entry(index / SLOTS_PER_PAGE).or_default() += 1;
            slot_at(addr).dispatch.store(dispatch, Ordering::SeqCst);
            return addr;
        }
    }

    /// A slot is no longer live: its value stays invalid until the stretch comes round again.
    pub(super) fn give_back(&mut self, addr: usize) {
        let page = (addr - self.base) as u64 / SLOT as u64 / SLOTS_PER_PAGE;
        let Some(n) = self.in_use.get_mut(&page) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            self.in_use.remove(&page);
            if self.behind_window(page) {
                self.release(page);
            }
        }
    }

    /// The cursor entered `page`: the page `WINDOW` slots before it left the window.
    fn passed_page(&mut self, page: u64) {
        let pages = self.slots / SLOTS_PER_PAGE;
        let window_pages = WINDOW / SLOTS_PER_PAGE;
        if self.issued <= WINDOW || pages <= window_pages {
            return;
        }
        let old = (page + pages - window_pages) % pages;
        if !self.in_use.contains_key(&old) {
            self.release(old);
        }
    }

    fn behind_window(&self, page: u64) -> bool {
        let pages = self.slots / SLOTS_PER_PAGE;
        let cursor = (self.issued % self.slots) / SLOTS_PER_PAGE;
        (cursor + pages - page) % pages > WINDOW / SLOTS_PER_PAGE
    }

    fn release(&self, page: u64) {
        if self.releasable {
            discard(self.base + page as usize * PAGE, PAGE);
        }
    }

    fn addr(&self, index: u64) -> usize {
        self.base + index as usize * SLOT
    }
}

/// The slot at `addr`, an address `Space` handed out.
pub(super) fn slot_at(addr: usize) -> &'static Slot {
    // SAFETY: `addr` is a slot of a stretch (or heap block), which is never unmapped: its
    // memory stays readable and writable for the life of the process.
    unsafe { &*(addr as *const Slot) }
}

/// The slot a handle value names, if it is one of the process's stretch (any value a caller
/// passes: nothing is read unless it is).
#[inline]
pub(super) fn slot(addr: usize) -> Option<&'static Slot> {
    let base = BASE.load(Ordering::Relaxed);
    if addr < base || addr >= END.load(Ordering::Relaxed) || !(addr - base).is_multiple_of(SLOT) {
        return None;
    }
    Some(slot_at(addr))
}

/// Reserves `len` bytes of zeroed, writable address space that costs memory only where touched.
fn reserve(len: usize) -> Option<usize> {
    // SAFETY: a new private anonymous mapping; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as usize)
}

/// Gives the memory of a page back; the page then reads as zeros.
fn discard(addr: usize, len: usize) {
    // SAFETY: a page of our own reservation, holding only handle slots none of which is live.
    unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTNEED) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(slots_log2: u32) -> Space {
        let slots = 1u64 << slots_log2;
        Space::at(reserve(slots as usize * SLOT).unwrap(), slots, true)
    }

    fn word(addr: usize) -> &'static AtomicUsize {
        &slot_at(addr).dispatch
    }

    /// A value recurs only after the whole stretch, and never while it is live.
    #[test]
    fn values_recur_after_the_stretch_and_skip_live_ones() {
        let mut s = small(16);
        let first = s.take(7, |_| false);
        let second = s.take(7, |_| false);
        assert_eq!(word(first).load(Ordering::SeqCst), 7);
        s.give_back(second);
        for _ in 2..s.slots {
            let a = s.take(7, |_| false);
            assert!(a != first && a != second);
            s.give_back(a);
        }
        // A new lap: `first` is still live and skipped, `second` is reissued.
        let again = s.take(9, |a| a == first);
        assert_eq!(again, second);
        assert_eq!(word(first).load(Ordering::SeqCst), 7);
        assert_eq!(word(again).load(Ordering::SeqCst), 9);
    }

    /// Pages behind the window with nothing live read zero again; a page with a live slot keeps
    /// it, and so does every page within the window.
    #[test]
    fn empty_pages_behind_the_window_are_given_back() {
        let mut s = small(20);
        let pinned = s.take(5, |_| false);
        let early = s.take(5, |_| false);
        s.give_back(early);
        let mut recent = 0;
        for _ in 0..WINDOW + 4 * SLOTS_PER_PAGE {
            recent = s.take(5, |_| false);
            s.give_back(recent);
        }
        assert_eq!(
            word(pinned).load(Ordering::SeqCst),
            5,
            "a live slot keeps its page"
        );
        let freed_page_slot = s.addr(SLOTS_PER_PAGE);
        assert_eq!(word(freed_page_slot).load(Ordering::SeqCst), 0);
        assert_eq!(word(recent).load(Ordering::SeqCst), 5, "within the window");
        s.give_back(pinned);
        assert_eq!(
            word(pinned).load(Ordering::SeqCst),
            0,
            "emptied behind the window"
        );
        assert!(s.in_use.is_empty());
    }
}
