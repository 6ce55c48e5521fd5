//! A file mapped shared with other processes (a memfd: ours or a peer's; a POSIX shm
//! region), with bounds-checked access to its words, bytes and the process-shared robust
//! mutexes that live in it; unmapped on drop. rs-tcp's same-host tables, rings and arenas and
//! the libfabric backend's key table, shm regions and arenas all go through it, so the
//! mapping's unsafe code is here once.
//!
//! The accessors are `#[inline]`: rs-tcp's same-host DTOs read and lock the peer's table
//! through them, and called across the crate boundary they cost a same-host write 150
//! instructions more and an empty dequeue 80 (tests-c/scripts/cost-guard.sh).

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

/// A type whose values may lie in a shared mapping and be read as `&T` while another
/// process writes them: valid at every bit pattern, every field an atomic (`SharedMap::slice`).
///
/// # Safety
/// Implement it only for the atomic integers and `#[repr(C)]` structs of them.
pub unsafe trait SharedWords {}

// SAFETY: atomics, valid at every bit pattern, changed by any process at any time.
unsafe impl SharedWords for std::sync::atomic::AtomicU64 {}
// SAFETY: as above.
unsafe impl SharedWords for std::sync::atomic::AtomicU32 {}

/// A shared mapping of a file, unmapped on drop.
pub struct SharedMap {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; every access goes through the volatile
// accessors, atomics or the pthread calls below, which any thread may make (the data is
// guarded by the mutex it contains, and readers treat what they read as untrusted).
unsafe impl Send for SharedMap {}
// SAFETY: as for Send: what a method hands out into the mapping is an atomic.
unsafe impl Sync for SharedMap {}

impl SharedMap {
    /// Maps `len` bytes of `fd` read-write and shared.
    pub fn map(fd: RawFd, len: usize) -> io::Result<SharedMap> {
        Self::new(
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
        )
    }

    /// Maps `len` bytes of `fd` (opened for reading only) read-only and shared. Only reads
    /// are for it: a write accessor, or a store through an atomic it hands out, faults.
    pub fn map_read_only(fd: RawFd, len: usize) -> io::Result<SharedMap> {
        Self::new(len, libc::PROT_READ, libc::MAP_SHARED, fd)
    }

    /// `len` bytes of zero-filled memory of this process alone, with the same accessors
    /// (where a file to share cannot be had).
    pub fn anonymous(len: usize) -> io::Result<SharedMap> {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        Self::new(len, libc::PROT_READ | libc::PROT_WRITE, flags, -1)
    }

    fn new(len: usize, prot: i32, flags: i32, fd: RawFd) -> io::Result<SharedMap> {
        if len == 0 {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        // SAFETY: a fresh mapping chosen by the kernel; no existing memory is affected.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, 0) };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(SharedMap {
            ptr: ptr.cast(),
            len,
        })
    }

    /// The mapping's first byte: what it holds is another process's to change at any time.
    #[inline]
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never: a mapping has a byte at least).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of a `T` at `off`, which must lie in the mapping, aligned (else a panic).
    #[inline]
    pub fn at<T>(&self, off: usize) -> *mut T {
        assert!(
            off.is_multiple_of(std::mem::align_of::<T>())
                && off + std::mem::size_of::<T>() <= self.len,
            "offset {off} outside the shared mapping"
        );
        // SAFETY: in bounds of the mapping (asserted above).
        unsafe { self.ptr.add(off).cast() }
    }

    /// Reads a byte another process may write at any time (volatile: read once, as is).
    #[inline]
    pub fn read_u8(&self, off: usize) -> u8 {
        // SAFETY: in bounds (see `at`); any bit pattern is a valid u8.
        unsafe { std::ptr::read_volatile(self.at::<u8>(off)) }
    }

    #[inline]
    pub fn write_u8(&self, off: usize, v: u8) {
        // SAFETY: in bounds; the mapping is writable.
        unsafe { std::ptr::write_volatile(self.at::<u8>(off), v) }
    }

    /// Reads a word another process may write at any time (volatile: read once, as is).
    #[inline]
    pub fn read_u32(&self, off: usize) -> u32 {
        // SAFETY: in bounds and aligned (see `at`); any bit pattern is a valid u32.
        unsafe { std::ptr::read_volatile(self.at::<u32>(off)) }
    }

    #[inline]
    pub fn read_u64(&self, off: usize) -> u64 {
        // SAFETY: as in read_u32.
        unsafe { std::ptr::read_volatile(self.at::<u64>(off)) }
    }

    #[inline]
    pub fn write_u32(&self, off: usize, v: u32) {
        // SAFETY: in bounds and aligned; the mapping is writable.
        unsafe { std::ptr::write_volatile(self.at::<u32>(off), v) }
    }

    #[inline]
    pub fn write_u64(&self, off: usize, v: u64) {
        // SAFETY: as in write_u32.
        unsafe { std::ptr::write_volatile(self.at::<u64>(off), v) }
    }

    /// A word of the mapping both processes update atomically (ring positions and flags).
    #[inline]
    pub fn atomic_u64(&self, off: usize) -> &std::sync::atomic::AtomicU64 {
        // SAFETY: in bounds and aligned (see `at`); the mapping lives as long as `self`, and
        // an AtomicU64 has the size and alignment of a u64. Another process may change it at
        // any time, which atomics allow.
        unsafe { &*self.at::<std::sync::atomic::AtomicU64>(off) }
    }

    #[inline]
    pub fn atomic_u32(&self, off: usize) -> &std::sync::atomic::AtomicU32 {
        // SAFETY: as in atomic_u64.
        unsafe { &*self.at::<std::sync::atomic::AtomicU32>(off) }
    }

    #[inline]
    pub fn atomic_i32(&self, off: usize) -> &std::sync::atomic::AtomicI32 {
        // SAFETY: as in atomic_u64.
        unsafe { &*self.at::<std::sync::atomic::AtomicI32>(off) }
    }

    /// `n` values of `T` at `off`, which must lie in the mapping, aligned (else a panic).
    #[inline]
    pub fn slice<T: SharedWords>(&self, off: usize, n: usize) -> &[T] {
        assert!(
            off.is_multiple_of(std::mem::align_of::<T>())
                && n.checked_mul(std::mem::size_of::<T>())
                    .and_then(|bytes| bytes.checked_add(off))
                    .is_some_and(|end| end <= self.len),
            "{n} values at offset {off} outside the shared mapping"
        );
        // SAFETY: in bounds and aligned (asserted above); the mapping lives as long as `self`,
        // and a `SharedWords` type is valid at every bit pattern and changed only atomically.
        unsafe { std::slice::from_raw_parts(self.ptr.add(off).cast(), n) }
    }

    /// Copies `data` into the mapping at `off` (bounds checked).
    #[inline]
    pub fn copy_in(&self, off: usize, data: &[u8]) {
        assert!(off
            .checked_add(data.len())
            .is_some_and(|end| end <= self.len));
        // SAFETY: the range is inside the mapping (asserted); `data` is ours. The peer never
        // touches the part of a ring the writer fills (a hostile one garbles only its own
        // stream, which we treat as untrusted).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) }
    }

    /// Copies bytes at `off` out of the mapping into `out` (bounds checked).
    #[inline]
    pub fn copy_out(&self, off: usize, out: &mut [u8]) {
        assert!(off
            .checked_add(out.len())
            .is_some_and(|end| end <= self.len));
        // SAFETY: as in copy_in, the other way; whatever the bytes are, they are plain bytes.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), out.as_mut_ptr(), out.len()) }
    }

    /// Makes the bytes at `off` a process-shared, robust pthread mutex (owner only, before
    /// the table is offered to anyone).
    pub fn init_robust_mutex(&self, off: usize) -> io::Result<()> {
        let m = self.at::<libc::pthread_mutex_t>(off);
        // SAFETY: `attr` is initialised by pthread_mutexattr_init before use and destroyed
        // after; `m` is in bounds, aligned, and nobody else uses it yet.
        unsafe {
            let mut attr: libc::pthread_mutexattr_t = std::mem::zeroed();
            check(libc::pthread_mutexattr_init(&mut attr))?;
            let r = (|| {
                check(libc::pthread_mutexattr_setpshared(
                    &mut attr,
                    libc::PTHREAD_PROCESS_SHARED,
                ))?;
                check(libc::pthread_mutexattr_setrobust(
                    &mut attr,
                    libc::PTHREAD_MUTEX_ROBUST,
                ))?;
                check(libc::pthread_mutex_init(m, &attr))
            })();
            libc::pthread_mutexattr_destroy(&mut attr);
            r
        }
    }

    /// Locks the mutex at `off`, waiting at most `limit` (None: as long as it takes). A
    /// holder that died makes the lock ours with EOWNERDEAD: the table it guards is written
    /// only by its owner, so it is consistent and we mark the mutex so.
    #[inline]
    pub fn lock(&self, off: usize, limit: Option<Duration>) -> io::Result<()> {
        let m = self.at::<libc::pthread_mutex_t>(off);
        // SAFETY: `m` was initialised by `init_robust_mutex` (the owner's) before the table was
        // offered; a peer checked the table's magic before using it. `ts` is a valid timespec.
        let r = unsafe {
            match limit {
                None => libc::pthread_mutex_lock(m),
                Some(limit) => {
                    let mut r = libc::pthread_mutex_trylock(m);
                    if r == libc::EBUSY {
                        r = try_lock_spinning(m);
                    }
                    match r {
                        // Free (the usual case): no clock reading, no system call. EOWNERDEAD
                        // (taken over from a dead holder) is handled below, as for a lock.
                        r @ (0 | libc::EOWNERDEAD | libc::ENOTRECOVERABLE) => r,
                        _ => {
                            let mut ts: libc::timespec = std::mem::zeroed();
                            libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts);
                            let ns = ts.tv_nsec as u64 + limit.subsec_nanos() as u64;
                            ts.tv_sec += limit.as_secs() as libc::time_t
                                + (ns / 1_000_000_000) as libc::time_t;
                            ts.tv_nsec = (ns % 1_000_000_000) as _;
                            libc::pthread_mutex_timedlock(m, &ts)
                        }
                    }
                }
            }
        };
        match r {
            0 => Ok(()),
            libc::EOWNERDEAD => {
                // SAFETY: we hold the mutex (EOWNERDEAD hands it to us).
                check(unsafe { libc::pthread_mutex_consistent(m) })?;
                Ok(())
            }
            e => Err(io::Error::from_raw_os_error(e)),
        }
    }

    /// Whether the mutex at `off` is held by a live thread (not ours): the owner's keeper
    /// thread holds it for the table's life, and when that thread ends, by the process's death
    /// too, the kernel marks the mutex owner-dead (robust futex list). A trylock is a
    /// compare-and-swap in user space: no system call while the owner lives. A dead owner's
    /// mutex is unlocked without being made consistent, so it stays unrecoverable and every
    /// later look also says dead.
    #[inline]
    pub fn held_by_live_owner(&self, off: usize) -> bool {
        let m = self.at::<libc::pthread_mutex_t>(off);
        // SAFETY: `m` is an initialised robust mutex (see `lock`); we unlock only what the
        // trylock gave us.
        unsafe {
            match libc::pthread_mutex_trylock(m) {
                libc::EBUSY => true,
                0 | libc::EOWNERDEAD => {
                    libc::pthread_mutex_unlock(m);
                    false
                }
                _ => false,
            }
        }
    }

    /// Unlocks the mutex at `off`, which this thread holds.
    #[inline]
    pub fn unlock(&self, off: usize) {
        let m = self.at::<libc::pthread_mutex_t>(off);
        // SAFETY: the caller locked it with `lock` on this thread.
        unsafe { libc::pthread_mutex_unlock(m) };
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once; nothing refers into it any more.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

impl SharedMap {
    /// Copies between our ranges `local` (in order) and the mapping's `[off, off + total)`:
    /// into ours (`write` false) or from ours. Returns false, copying nothing, if that is not
    /// inside the mapping.
    ///
    /// # Safety
    /// Every local range lies inside a live registration of ours (writable for a read into
    /// it), held for the call (as for `process_vm`).
    #[inline]
    pub unsafe fn copy_ranges(&self, off: u64, local: &[(u64, usize)], write: bool) -> bool {
        let total: u64 = local.iter().map(|&(_, n)| n as u64).sum();
        if off
            .checked_add(total)
            .is_none_or(|end| end > self.len as u64)
        {
            return false;
        }
        let mut at = off as usize;
        for &(addr, n) in local {
            // SAFETY: `at..at + n` is inside the mapping (checked above); the local range is
            // the caller's (see Safety). The peer may write its side meanwhile, as a NIC's
            // peer may: plain bytes either way.
            unsafe {
                let theirs = self.ptr.add(at);
                let ours = addr as usize as *mut u8;
                if write {
                    std::ptr::copy_nonoverlapping(ours, theirs, n);
                } else {
                    std::ptr::copy_nonoverlapping(theirs, ours, n);
                }
            }
            at += n;
        }
        true
    }
}

fn check(r: libc::c_int) -> io::Result<()> {
    match r {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

/// A trylock of `m` that found it held, tried again for about a microsecond: the
/// table's mutex is held for one key's check and copy (tens of ns for small messages), so a
/// thread that finds it held nearly always gets it by spinning, where sleeping in the kernel
/// cost each of two threads posting on one IA a futex wait and wake per message.
///
/// # Safety
/// `m` is an initialised mutex, as for `pthread_mutex_trylock`.
#[cold]
unsafe fn try_lock_spinning(m: *mut libc::pthread_mutex_t) -> libc::c_int {
    const TRIES: u32 = 64;
    let mut r = libc::EBUSY;
    for i in 0..TRIES {
        for _ in 0..(4 << i.min(4)) {
            std::hint::spin_loop();
        }
        // SAFETY: the caller's.
        r = unsafe { libc::pthread_mutex_trylock(m) };
        if r != libc::EBUSY {
            return r;
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::SharedMap;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A slice names the mapping's words where they lie: a store through it is read at its
    /// offset.
    #[test]
    fn a_slice_is_the_mapping_s_words() {
        let map = SharedMap::anonymous(4096).expect("an anonymous mapping");
        let words: &[AtomicU64] = map.slice(64, 8);
        words[3].store(0x5eed, Ordering::SeqCst);
        assert_eq!(map.read_u64(64 + 3 * 8), 0x5eed);
        assert_eq!(
            map.slice::<AtomicU64>(4096 - 8, 1).len(),
            1,
            "the last word"
        );
    }

    /// Out of bounds, misaligned or overflowing: a panic, never a slice.
    #[test]
    fn a_slice_outside_the_mapping_panics() {
        let map = SharedMap::anonymous(4096).expect("an anonymous mapping");
        for (off, n) in [(4096 - 8, 2), (4, 1), (8, usize::MAX / 4)] {
            let r = std::panic::catch_unwind(|| map.slice::<AtomicU64>(off, n).len());
            assert!(r.is_err(), "{n} words at {off}");
        }
    }
}
