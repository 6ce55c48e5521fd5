//! Where handle values come from: one word each in a reserved stretch of address space.
//!
//! A DAT handle must be the address of a word holding its DAT_PROVIDER pointer (libdat2 jumps
//! through it), so the handle *is* an address, and a freed handle names a new object as soon as
//! its address is handed out again. Instead of reusing freed headers, every creation takes the
//! next word of a stretch of 2^32 words (32 GiB of address space, reserved without memory):
//! a value comes back only after 2^32 further creations, so the position in the stretch is the
//! handle's generation, and looking a handle up stays one map probe by address.
//!
//! Memory follows what is in use, not what was ever issued: a page of words none of which is
//! live is given back to the kernel (it then reads as zeros) once the cursor is `WINDOW` words
//! past it. Until then a stale handle still reads its provider pointer, so even a registry that
//! dereferences without checking (OFED's libdat2) reaches us and gets DAT_INVALID_HANDLE; ours
//! checks the word and refuses a zero one itself. A page keeps its memory while one of its
//! handles lives: 4 KiB per long-lived handle at worst, interleaved with a million short ones.

use std::sync::atomic::{AtomicUsize, Ordering};

use daplrs_backend::intmap::IntMap;

/// Words in the stretch: how many creations a freed handle stays unused for.
const WORDS_LOG2: u32 = 32;
/// Smaller stretches tried when the address space is limited (RLIMIT_AS, strict overcommit).
const MIN_WORDS_LOG2: u32 = 16;
const WORD: usize = std::mem::size_of::<usize>();
const PAGE: usize = 4096;
const WORDS_PER_PAGE: u64 = (PAGE / WORD) as u64;
/// Pages this many words behind the cursor may be given back once empty.
const WINDOW: u64 = 1 << 16;

pub(super) struct Space {
    base: usize,
    words: u64,
    /// Creations so far; the next word is `issued % words`.
    issued: u64,
    /// Live (or reserved) words per page index; pages absent hold none.
    in_use: IntMap<u64, u32>,
    /// Whether pages can be given back (false for the heap fallback).
    releasable: bool,
}

impl Space {
    pub(super) fn new() -> Space {
        for log2 in (MIN_WORDS_LOG2..=WORDS_LOG2).rev() {
            let words = 1u64 << log2;
            if let Some(base) = reserve(words as usize * WORD) {
                if log2 < WORDS_LOG2 {
                    log::warn!("handles: only 2^{log2} words of address space for handle values");
                }
                return Space::at(base, words, true);
            }
        }
        // No mapping at all: a leaked heap block (values then recur after 2^16 creations).
        let words = 1u64 << MIN_WORDS_LOG2;
        let block: &'static [AtomicUsize] =
            Box::leak((0..words).map(|_| AtomicUsize::new(0)).collect());
        log::warn!("handles: no address space reserved; handle values recur sooner");
        Space::at(block.as_ptr() as usize, words, false)
    }

    fn at(base: usize, words: u64, releasable: bool) -> Space {
        Space {
            base,
            words,
            issued: 0,
            in_use: IntMap::default(),
            releasable,
        }
    }

    /// Takes the next word not `taken` (only words of an earlier lap can be), writes `dispatch`
    /// into it and returns its address.
    pub(super) fn take(&mut self, dispatch: usize, taken: impl Fn(usize) -> bool) -> usize {
        loop {
            let index = self.issued % self.words;
            self.issued += 1;
            if index.is_multiple_of(WORDS_PER_PAGE) {
                self.passed_page(index / WORDS_PER_PAGE);
            }
            let addr = self.addr(index);
            if self.issued > self.words && taken(addr) {
                continue;
            }
            *self.in_use.entry(index / WORDS_PER_PAGE).or_default() += 1;
            word(addr).store(dispatch, Ordering::SeqCst);
            return addr;
        }
    }

    /// A word is no longer live: its value stays invalid until the stretch comes round again.
    pub(super) fn give_back(&mut self, addr: usize) {
        let page = (addr - self.base) as u64 / WORD as u64 / WORDS_PER_PAGE;
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

    /// The cursor entered `page`: the page `WINDOW` words before it left the window.
    fn passed_page(&mut self, page: u64) {
        let pages = self.words / WORDS_PER_PAGE;
        let window_pages = WINDOW / WORDS_PER_PAGE;
        if self.issued <= WINDOW || pages <= window_pages {
            return;
        }
        let old = (page + pages - window_pages) % pages;
        if !self.in_use.contains_key(&old) {
            self.release(old);
        }
    }

    fn behind_window(&self, page: u64) -> bool {
        let pages = self.words / WORDS_PER_PAGE;
        let cursor = (self.issued % self.words) / WORDS_PER_PAGE;
        (cursor + pages - page) % pages > WINDOW / WORDS_PER_PAGE
    }

    fn release(&self, page: u64) {
        if self.releasable {
            discard(self.base + page as usize * PAGE, PAGE);
        }
    }

    fn addr(&self, index: u64) -> usize {
        self.base + index as usize * WORD
    }
}

/// The word at `addr`, an address `Space` handed out.
pub(super) fn word(addr: usize) -> &'static AtomicUsize {
    // SAFETY: `addr` is a word of the stretch (or heap block), which is never unmapped: its
    // memory stays readable and writable for the life of the process.
    unsafe { &*(addr as *const AtomicUsize) }
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
    // SAFETY: a page of our own reservation, holding only handle words none of which is live.
    unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTNEED) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(words_log2: u32) -> Space {
        let words = 1u64 << words_log2;
        Space::at(reserve(words as usize * WORD).unwrap(), words, true)
    }

    /// A value recurs only after the whole stretch, and never while it is live.
    #[test]
    fn values_recur_after_the_stretch_and_skip_live_ones() {
        let mut s = small(16);
        let first = s.take(7, |_| false);
        let second = s.take(7, |_| false);
        assert_eq!(word(first).load(Ordering::SeqCst), 7);
        s.give_back(second);
        for _ in 2..s.words {
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

    /// Pages behind the window with nothing live read zero again; a page with a live word keeps
    /// it, and so does every page within the window.
    #[test]
    fn empty_pages_behind_the_window_are_given_back() {
        let mut s = small(20);
        let pinned = s.take(5, |_| false);
        let early = s.take(5, |_| false);
        s.give_back(early);
        let mut recent = 0;
        for _ in 0..WINDOW + 4 * WORDS_PER_PAGE {
            recent = s.take(5, |_| false);
            s.give_back(recent);
        }
        assert_eq!(
            word(pinned).load(Ordering::SeqCst),
            5,
            "a live word keeps its page"
        );
        let freed_page_word = s.addr(WORDS_PER_PAGE);
        assert_eq!(word(freed_page_word).load(Ordering::SeqCst), 0);
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
