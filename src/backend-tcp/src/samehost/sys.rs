//! The same-host path's unsafe code: process_vm_readv / process_vm_writev between our
//! registered memory and a peer's, futexes and eventfds. Its shared memory is mapped with
//! `SharedMap` (daplrs_backend), which the libfabric backend shares.

use std::io;
use std::os::fd::RawFd;

pub(crate) use daplrs_backend::shared_map::SharedMap;

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

/// The inode number of a file we hold (what /proc/<pid>/maps shows for its mappings).
pub(crate) fn inode_of(fd: RawFd) -> io::Result<u64> {
    daplrs_backend::peer_fd::identity(fd).map(|(_, ino)| ino)
}
