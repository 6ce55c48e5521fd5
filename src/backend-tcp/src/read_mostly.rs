//! A lock for data that many threads read at once and few change: the key registry, which
//! every copy into or out of registered memory reads for the copy's length and only
//! registrations change.
//!
//! As one mutex, the registry made threads posting on different EPs of one IA take turns for
//! every copy on the same-host path, and a reader-writer lock's one reader count passes its
//! cache line between them at each read. Here a reader counts itself in one of `SLOTS`
//! counters, each on its own cache lines, chosen by where its stack lies, so threads reading
//! at once mostly write different lines; a writer announces itself, then waits until every
//! counter is zero. The two sides are Dekker's: a reader counts itself and then looks for a
//! writer, a writer announces itself and then looks for readers (both sequentially
//! consistent), so at least one of them sees the other.
//!
//! Not reentrant, as the mutex was not: a thread that holds a read must not ask again while a
//! writer may be waiting, nor ask to write.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

const SLOTS: usize = 16;

/// One reader counter, 128 bytes from the next (the adjacent-line prefetch pairs lines).
#[repr(align(128))]
#[derive(Default)]
struct Slot(AtomicUsize);

pub(crate) struct ReadMostly<T> {
    writer: parking_lot::Mutex<()>,
    writing: AtomicBool,
    readers: [Slot; SLOTS],
    value: UnsafeCell<T>,
}

// SAFETY: readers share `&T` (so T: Sync) across threads, a writer gets `&mut T` (T: Send); the
// counters and the writer's flag make the two exclusive.
unsafe impl<T: Send + Sync> Sync for ReadMostly<T> {}

impl<T> ReadMostly<T> {
    pub(crate) fn new(value: T) -> ReadMostly<T> {
        ReadMostly {
            writer: parking_lot::Mutex::new(()),
            writing: AtomicBool::new(false),
            readers: Default::default(),
            value: UnsafeCell::new(value),
        }
    }

    /// Shared access, waiting while a writer holds or waits for the data.
    #[inline]
    pub(crate) fn read(&self) -> ReadGuard<'_, T> {
        let slot = &self.readers[this_threads_slot()].0;
        loop {
            slot.fetch_add(1, Ordering::SeqCst);
            if !self.writing.load(Ordering::SeqCst) {
                return ReadGuard { lock: self, slot };
            }
            slot.fetch_sub(1, Ordering::Release);
            // Wait for the writer where it holds its mutex: no spinning against it.
            drop(self.writer.lock());
        }
    }

    /// Shared access if no writer holds or waits for the data, without waiting: for a
    /// signal handler, whose thread may hold a read (then this counts once more) or be the
    /// writer (then this finds it).
    #[inline]
    pub(crate) fn try_read(&self) -> Option<ReadGuard<'_, T>> {
        let slot = &self.readers[this_threads_slot()].0;
        slot.fetch_add(1, Ordering::SeqCst);
        if self.writing.load(Ordering::SeqCst) {
            slot.fetch_sub(1, Ordering::Release);
            return None;
        }
        Some(ReadGuard { lock: self, slot })
    }

    /// Exclusive access, once the readers under way are done; new readers wait for it.
    pub(crate) fn write(&self) -> WriteGuard<'_, T> {
        let held = self.writer.lock();
        self.writing.store(true, Ordering::SeqCst);
        for s in &self.readers {
            let mut spins = 0u32;
            while s.0.load(Ordering::SeqCst) != 0 {
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
        WriteGuard {
            lock: self,
            _held: held,
        }
    }
}

/// A slot for the calling thread: its stack's megabyte, hashed (thread stacks are megabytes
/// apart, and a multiple of 8 MiB apart under glibc's defaults, so the raw bits would give few
/// slots). The same thread may land elsewhere at another depth; the guard keeps its slot.
#[inline]
fn this_threads_slot() -> usize {
    let marker = 0u8;
    let mb = (std::ptr::addr_of!(marker) as usize >> 20) as u64;
    (mb.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 60) as usize % SLOTS
}

pub(crate) struct ReadGuard<'a, T> {
    lock: &'a ReadMostly<T>,
    slot: &'a AtomicUsize,
}

impl<T> Deref for ReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: counted as a reader with no writer announced: no `&mut T` exists until the
        // count drops.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> Drop for ReadGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.slot.fetch_sub(1, Ordering::Release);
    }
}

pub(crate) struct WriteGuard<'a, T> {
    lock: &'a ReadMostly<T>,
    _held: parking_lot::MutexGuard<'a, ()>,
}

impl<T> Deref for WriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the only writer, every reader gone.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for WriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as for deref.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for WriteGuard<'_, T> {
    fn drop(&mut self) {
        // Before the mutex (dropped after this): readers waiting on it then find no writer.
        self.lock.writing.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::ReadMostly;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// Readers never see a write half done: the writer keeps two fields equal, changing them
    /// one after the other, while readers on other threads check them.
    #[test]
    fn readers_never_see_a_write_half_done() {
        let lock = Arc::new(ReadMostly::new((0u64, 0u64)));
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..4)
            .map(|_| {
                let (lock, stop) = (lock.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut reads = 0u64;
                    while !stop.load(Ordering::Relaxed) || reads == 0 {
                        let g = lock.read();
                        assert_eq!(g.0, g.1, "a write seen half done");
                        reads += 1;
                    }
                    reads
                })
            })
            .collect();
        for i in 1..=20_000u64 {
            let mut g = lock.write();
            g.0 = i;
            std::hint::black_box(&mut *g);
            g.1 = i;
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            assert!(r.join().unwrap() > 0);
        }
        assert_eq!(*lock.read(), (20_000, 20_000));
    }
}
