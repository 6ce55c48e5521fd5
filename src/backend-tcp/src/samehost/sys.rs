//! The same-host path's unsafe code: a memfd mapped MAP_SHARED and volatile access to it,
//! process-shared robust pthread mutexes living in that mapping, and process_vm_readv /
//! process_vm_writev between our registered memory and a peer's.

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

/// A MAP_SHARED mapping of a file (a memfd: ours or a peer's), unmapped on drop.
pub(crate) struct SharedMap {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; every access goes through the volatile
// accessors or the pthread calls below, which any thread may make (the data is guarded by the
// mutex it contains, and readers treat what they read as untrusted).
unsafe impl Send for SharedMap {}
// SAFETY: as for Send: no method hands out references into the mapping.
unsafe impl Sync for SharedMap {}

impl SharedMap {
    /// Maps `len` bytes of `fd` read-write and shared.
    pub fn map(fd: RawFd, len: usize) -> io::Result<SharedMap> {
        if len == 0 {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        // SAFETY: a fresh mapping chosen by the kernel; no existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(SharedMap {
            ptr: ptr.cast(),
            len,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    fn at<T>(&self, off: usize) -> *mut T {
        assert!(
            off.is_multiple_of(std::mem::align_of::<T>())
                && off + std::mem::size_of::<T>() <= self.len,
            "offset {off} outside the shared table"
        );
        // SAFETY: in bounds of the mapping (asserted above).
        unsafe { self.ptr.add(off).cast() }
    }

    /// Reads a word another process may write at any time (volatile: read once, as is).
    pub fn read_u32(&self, off: usize) -> u32 {
        // SAFETY: in bounds and aligned (see `at`); any bit pattern is a valid u32.
        unsafe { std::ptr::read_volatile(self.at::<u32>(off)) }
    }

    pub fn read_u64(&self, off: usize) -> u64 {
        // SAFETY: as in read_u32.
        unsafe { std::ptr::read_volatile(self.at::<u64>(off)) }
    }

    pub fn write_u32(&self, off: usize, v: u32) {
        // SAFETY: in bounds and aligned; the mapping is writable.
        unsafe { std::ptr::write_volatile(self.at::<u32>(off), v) }
    }

    pub fn write_u64(&self, off: usize, v: u64) {
        // SAFETY: as in write_u32.
        unsafe { std::ptr::write_volatile(self.at::<u64>(off), v) }
    }

    /// A word of the mapping both processes update atomically (ring positions and flags).
    pub fn atomic_u64(&self, off: usize) -> &std::sync::atomic::AtomicU64 {
        // SAFETY: in bounds and aligned (see `at`); the mapping lives as long as `self`, and
        // an AtomicU64 has the size and alignment of a u64. Another process may change it at
        // any time, which atomics allow.
        unsafe { &*self.at::<std::sync::atomic::AtomicU64>(off) }
    }

    pub fn atomic_u32(&self, off: usize) -> &std::sync::atomic::AtomicU32 {
        // SAFETY: as in atomic_u64.
        unsafe { &*self.at::<std::sync::atomic::AtomicU32>(off) }
    }

    /// Copies `data` into the mapping at `off` (bounds checked).
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

fn check(r: libc::c_int) -> io::Result<()> {
    match r {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

/// Bytes of a pthread_mutex_t (the table reserves room for it).
pub(crate) const MUTEX_SIZE: usize = std::mem::size_of::<libc::pthread_mutex_t>();

/// Our side of a transfer as iovecs: most requests have a segment or two, so no allocation
/// for up to 8.
struct Iovecs {
    inline: [libc::iovec; 8],
    heap: Vec<libc::iovec>,
    len: usize,
}

impl Iovecs {
    fn new(local: &[(u64, usize)]) -> Iovecs {
        let iovec = |&(a, n): &(u64, usize)| libc::iovec {
            iov_base: a as usize as *mut libc::c_void,
            iov_len: n,
        };
        let mut v = Iovecs {
            inline: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; 8],
            heap: Vec::new(),
            len: local.len(),
        };
        if local.len() <= v.inline.len() {
            for (slot, r) in v.inline.iter_mut().zip(local) {
                *slot = iovec(r);
            }
        } else {
            v.heap = local.iter().map(iovec).collect();
        }
        v
    }

    fn as_slice(&self) -> &[libc::iovec] {
        if self.heap.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.heap
        }
    }
}

/// Copies between ranges of our memory (`local`, in order) and one range of process `pid`'s
/// (`remote`): from theirs into ours (`write` false) or from ours into theirs. Returns the
/// bytes moved (fewer than asked: a fault part-way).
///
/// # Safety
/// Every local range lies inside a live registration of ours (writable for a read into it),
/// and the caller holds our key registry lock for the call, so that the registration cannot
/// end during it (keys.rs). The remote side is the kernel's to check: a bad remote range is
/// EFAULT, not undefined behaviour here.
pub(crate) unsafe fn process_vm(
    pid: u32,
    local: &[(u64, usize)],
    remote: (u64, usize),
    write: bool,
) -> io::Result<usize> {
    let iovs = Iovecs::new(local);
    let liov = iovs.as_slice();
    let riov = libc::iovec {
        iov_base: remote.0 as usize as *mut libc::c_void,
        iov_len: remote.1,
    };
    // SAFETY: the local iovecs are the caller's ranges, live registrations of ours held for
    // the call (this function's contract); the remote range is checked by the kernel.
    let n = unsafe {
        if write {
            libc::process_vm_writev(
                pid as libc::pid_t,
                liov.as_ptr(),
                liov.len() as libc::c_ulong,
                &riov,
                1,
                0,
            )
        } else {
            libc::process_vm_readv(
                pid as libc::pid_t,
                liov.as_ptr(),
                liov.len() as libc::c_ulong,
                &riov,
                1,
                0,
            )
        }
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// As `process_vm`, through the peer's `/proc/<pid>/mem` opened as `mem`: preadv/pwritev
/// with the remote address as the file offset. For small transfers this is cheaper than
/// process_vm_readv, which repeats its ptrace access check on every call (measured here: 8 B
/// in 1.11 us against 1.48 us; from 8 KiB on process_vm_readv wins, it copies pages in bulk);
/// the mem file was checked once, when it was opened, and pins the peer's address space, not
/// its pid (a peer that exited reads as end of file).
///
/// # Safety
/// As for `process_vm`.
pub(crate) unsafe fn proc_mem(
    mem: RawFd,
    local: &[(u64, usize)],
    remote: (u64, usize),
    write: bool,
) -> io::Result<usize> {
    let Ok(offset) = libc::off_t::try_from(remote.0) else {
        return Err(io::ErrorKind::InvalidInput.into());
    };
    if local.len() > libc::UIO_MAXIOV as usize {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    let iovs = Iovecs::new(local);
    let iov = iovs.as_slice();
    // SAFETY: as in `process_vm`: the local iovecs (at most UIO_MAXIOV, checked above) are
    // live registrations of ours held for the call; the offset is checked by the kernel.
    let n = unsafe {
        if write {
            libc::pwritev(mem, iov.as_ptr(), iov.len() as libc::c_int, offset)
        } else {
            libc::preadv(mem, iov.as_ptr(), iov.len() as libc::c_int, offset)
        }
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Reads 8 bytes at `addr` of process `pid` (the probe of a peer's nonce).
pub(crate) fn peek_u64(pid: u32, addr: u64) -> io::Result<u64> {
    let mut word = 0u64;
    let local = libc::iovec {
        iov_base: (&mut word as *mut u64).cast(),
        iov_len: 8,
    };
    let remote = libc::iovec {
        iov_base: addr as usize as *mut libc::c_void,
        iov_len: 8,
    };
    // SAFETY: the only local memory written is `word`, 8 bytes we own.
    let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    match n {
        8 => Ok(word),
        n if n < 0 => Err(io::Error::last_os_error()),
        _ => Err(io::ErrorKind::UnexpectedEof.into()),
    }
}

pub(crate) use daplrs_backend::peer_fd::{eventfd, eventfd_signal};

/// Resets an eventfd's counter (non-blocking: nothing to read is fine).
pub(crate) fn eventfd_drain(fd: RawFd) {
    let mut count = 0u64;
    // SAFETY: reads 8 bytes into `count`, which we own.
    let _ = unsafe { libc::read(fd, (&mut count as *mut u64).cast(), 8) };
}

/// Sleeps while the shared word `word` (in a MAP_SHARED mapping: a shared futex, which a
/// thread of another process wakes through its own mapping of the same memory) holds
/// `expected`; returns at once if it no longer does. Any wake-up may be spurious: the caller
/// looks again.
pub(crate) fn futex_wait(word: &std::sync::atomic::AtomicU32, expected: u32) {
    // SAFETY: FUTEX_WAIT reads the aligned u32 `word` points to, which lives for the call;
    // no timeout.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            std::ptr::null::<libc::timespec>(),
        )
    };
}

/// Wakes every thread, of any process, asleep in `futex_wait` on the shared word `word`.
pub(crate) fn futex_wake(word: &std::sync::atomic::AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the address as the futex's key.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
}

/// The inode of the file `path` names (following symbolic links: /proc/<pid>/fd/<n> gives
/// the open file's), None if there is none.
pub(crate) fn inode_at(path: &str) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| {
        use std::os::unix::fs::MetadataExt;
        m.ino()
    })
}

// ---- copies through a peer's arena (daplrs_backend::arena) ------------------------------------

impl SharedMap {
    /// Copies between our ranges `local` (in order) and the mapping's `[off, off + total)`:
    /// into ours (`write` false) or from ours. Returns false, copying nothing, if that is not
    /// inside the mapping.
    ///
    /// # Safety
    /// Every local range lies inside a live registration of ours (writable for a read into
    /// it), held for the call (as for `process_vm`).
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

/// The inode number of a file we hold (what /proc/<pid>/maps shows for its mappings).
pub(crate) fn inode_of(fd: RawFd) -> io::Result<u64> {
    daplrs_backend::peer_fd::identity(fd).map(|(_, ino)| ino)
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
