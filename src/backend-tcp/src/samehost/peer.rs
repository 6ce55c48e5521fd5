//! A peer process as we reach its descriptors: the memfds of its key table, rings and board,
//! and its rings' eventfds.
//!
//! Through a pidfd (pidfd_getfd(2), Linux 5.6) where the kernel gives one: a duplicate of
//! the peer's descriptor in one system call, under the same ptrace check, with no path walk
//! through /proc (a connection's setup reached the peer's descriptors six times that way,
//! most of its system calls) and no way to name another process once the peer's pid is
//! reused. Else (an older kernel, a seccomp filter, a ptrace policy that lets us read a
//! process's descriptors but not attach to it) through /proc/<pid>/fd, as before.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::{sys, Refusal};
use daplrs_backend::memfile;

pub(crate) struct PeerProcess {
    pid: u32,
    pidfd: Option<OwnedFd>,
}

impl PeerProcess {
    /// Process `pid` (untrusted: read from an offer), through a pidfd if one is given.
    pub fn new(pid: u32) -> PeerProcess {
        let pidfd = memfile::is_process_and_descriptor(pid, 0)
            .then(|| pidfd_open(pid).ok())
            .flatten();
        PeerProcess { pid, pidfd }
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Our duplicate of the peer's descriptor `fd` (pidfd_getfd(2): it needs the right to
    /// ptrace-attach to the peer, as cross-memory attach does).
    fn getfd(&self, fd: u32) -> io::Result<OwnedFd> {
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

    /// The peer's memfd `fd` (a key table, ring or board) and its size, if it is a memfd
    /// whose size is sealed. A duplicate opens nothing, so naming a FIFO or a device does
    /// nothing; `super::open_peer_memfd` takes the same care on the /proc path.
    pub fn memfd(&self, fd: u32) -> Result<(File, u64), Refusal> {
        let Ok(dup) = self.getfd(fd) else {
            return super::open_peer_memfd(self.pid, fd);
        };
        let what = format!("pid {} fd {fd}", self.pid);
        memfile::sealed(File::from(dup), &what).map(|(file, meta)| (file, meta.len()))
    }

    /// Our duplicate of the peer's eventfd `fd` (see `sys::checked_eventfd`).
    pub fn eventfd(&self, fd: u32) -> io::Result<OwnedFd> {
        sys::checked_eventfd(self.getfd(fd)?)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Our own memfd and eventfd come back through the pidfd; a descriptor that is neither
    /// is refused.
    #[test]
    fn reaches_memfds_and_eventfds() {
        let me = PeerProcess::new(std::process::id());
        assert!(me.pidfd.is_some(), "pidfd_open refused here");
        let m = daplrs_backend::memfile::create_sealed("peer-test", 8192).unwrap();
        let (_, len) = me.memfd(m.as_raw_fd() as u32).expect("memfd");
        assert_eq!(len, 8192);
        let e = sys::eventfd().unwrap();
        me.eventfd(e.as_raw_fd() as u32).expect("eventfd");
        let unsealed = daplrs_backend::memfile::create("peer-test", 8192).unwrap();
        assert!(me.memfd(unsealed.as_raw_fd() as u32).is_err());
        assert!(me.eventfd(m.as_raw_fd() as u32).is_err());
        assert!(me.memfd(e.as_raw_fd() as u32).is_err());
        assert!(me.memfd(1 << 30).is_err());
    }
}
