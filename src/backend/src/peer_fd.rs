//! A peer process on this host as backends reach its descriptors: a duplicate of one through
//! a pidfd (pidfd_getfd(2), Linux 5.6: one system call, under the kernel's ptrace check, and
//! no way to name another process once the peer's pid is reused), and eventfds checked and
//! rung. rs-tcp's same-host path reaches its peers' rings and bells this way, the libfabric
//! backend its same-host peers' doorbells.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::memfile;

pub struct PeerProcess {
    pid: u32,
    pidfd: Option<OwnedFd>,
}

impl PeerProcess {
    /// Process `pid` (untrusted: read from a peer), through a pidfd if the kernel gives one.
    pub fn new(pid: u32) -> PeerProcess {
        let pidfd = memfile::is_process_and_descriptor(pid, 0)
            .then(|| pidfd_open(pid).ok())
            .flatten();
        PeerProcess { pid, pidfd }
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether descriptors can be duplicated (a pidfd was given).
    pub fn has_pidfd(&self) -> bool {
        self.pidfd.is_some()
    }

    /// Our duplicate of the peer's descriptor `fd` (pidfd_getfd(2): it needs the right to
    /// ptrace-attach to the peer, as cross-memory attach does).
    pub fn getfd(&self, fd: u32) -> io::Result<OwnedFd> {
        let Some(pidfd) = self.pidfd.as_ref() else {
            return Err(io::ErrorKind::Unsupported.into());
        };
        if !memfile::is_process_and_descriptor(self.pid, fd) {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        // SAFETY: pidfd_getfd(2) with no flags; the new descriptor (close-on-exec) is
        // owned at once.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd as i32, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: as above: `raw` was just created and nobody else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(raw as RawFd) })
    }

    /// Our duplicate of the peer's eventfd `fd` (see `checked_eventfd`).
    pub fn eventfd(&self, fd: u32) -> io::Result<OwnedFd> {
        checked_eventfd(self.getfd(fd)?)
    }
}

fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open(2) with no flags; the descriptor is owned at once.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` was just created and nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(raw as RawFd) })
}

/// A new eventfd (non-blocking: a reader drains it, a writer never waits on it).
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain eventfd(2); the descriptor is owned at once.
    let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` was just created and nobody else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Signals an eventfd (a full counter is signalled already: nothing lost).
pub fn eventfd_signal(fd: RawFd) {
    let one = 1u64;
    // SAFETY: writes the 8 bytes of `one` to a descriptor the caller holds.
    let _ = unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// `dup`, a duplicate of a peer's descriptor, if it is an eventfd, made non-blocking: it
/// shares the peer's open file, so that ringing never waits however the peer made it.
pub fn checked_eventfd(dup: OwnedFd) -> io::Result<OwnedFd> {
    // The kernel gives every eventfd (and other descriptors with no file of their own) one
    // anonymous inode: one with another inode is no eventfd. One with that inode is taken
    // without a look at its name through /proc (a path walk, the dearest part of mapping a
    // peer's ring): what we write to it (8 bytes) lands in the peer's own open file, which
    // only an eventfd takes; the others refuse the write.
    if identity(dup.as_raw_fd()).ok() != eventfd_identity() {
        let what = std::fs::read_link(format!("/proc/self/fd/{}", dup.as_raw_fd()))?;
        return match what.as_os_str() == "anon_inode:[eventfd]" {
            true => nonblocking(dup),
            false => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is no eventfd", what.display()),
            )),
        };
    }
    nonblocking(dup)
}

/// The device and inode of what descriptor `fd` names.
pub fn identity(fd: RawFd) -> io::Result<(u64, u64)> {
    // SAFETY: fstat(2) fills the one struct we pass.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((st.st_dev, st.st_ino))
}

/// The device and inode an eventfd of ours has (None if it cannot be told).
fn eventfd_identity() -> Option<(u64, u64)> {
    static IDENTITY: std::sync::OnceLock<Option<(u64, u64)>> = std::sync::OnceLock::new();
    *IDENTITY.get_or_init(|| identity(eventfd().ok()?.as_raw_fd()).ok())
}

/// `fd`, made non-blocking (it may share a peer's open file: ringing never waits).
fn nonblocking(dup: OwnedFd) -> io::Result<OwnedFd> {
    // SAFETY: fcntl(2) on the descriptor we own.
    let flags = unsafe { libc::fcntl(dup.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    if flags & libc::O_NONBLOCK == 0
        // SAFETY: as above.
        && unsafe { libc::fcntl(dup.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(dup)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Our own eventfd comes back through the pidfd and rings; a memfd is no eventfd.
    #[test]
    fn reaches_eventfds_and_refuses_the_rest() {
        let me = PeerProcess::new(std::process::id());
        assert!(me.has_pidfd(), "pidfd_open refused here");
        let e = eventfd().unwrap();
        let dup = me.eventfd(e.as_raw_fd() as u32).expect("eventfd");
        eventfd_signal(dup.as_raw_fd());
        let mut n = 0u64;
        // SAFETY: reads 8 bytes into `n`.
        let r = unsafe { libc::read(e.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
        assert_eq!((r, n), (8, 1), "the ring reached our own eventfd");
        let m = memfile::create_sealed("peer-fd-test", 4096).unwrap();
        assert!(me.eventfd(m.as_raw_fd() as u32).is_err());
        assert!(me.getfd(u32::MAX).is_err());
        assert!(PeerProcess::new(0).getfd(1).is_err());
    }
}
