//! A peer process as we reach its descriptors: the memfds of its key table, rings and board,
//! and its rings' eventfds.
//!
//! Through a pidfd where the kernel gives one (`daplrs_backend::peer_fd`): no path walk
//! through /proc (a connection's setup reached the peer's descriptors six times that way,
//! most of its system calls). Else (an older kernel, a seccomp filter, a ptrace policy that
//! lets us read a process's descriptors but not attach to it) memfds through
//! /proc/<pid>/fd, as before.

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;

use super::Refusal;
use daplrs_backend::{memfile, peer_fd};

pub(crate) struct PeerProcess(peer_fd::PeerProcess);

impl PeerProcess {
    /// Process `pid` (untrusted: read from an offer), through a pidfd if one is given.
    pub fn new(pid: u32) -> PeerProcess {
        PeerProcess(peer_fd::PeerProcess::new(pid))
    }

    pub fn pid(&self) -> u32 {
        self.0.pid()
    }

    /// The peer's memfd `fd` (a key table, ring or board) and its size, if it is a memfd
    /// whose size is sealed. A duplicate opens nothing, so naming a FIFO or a device does
    /// nothing; `super::open_peer_memfd` takes the same care on the /proc path.
    pub fn memfd(&self, fd: u32) -> Result<(File, u64), Refusal> {
        let Ok(dup) = self.0.getfd(fd) else {
            return super::open_peer_memfd(self.pid(), fd);
        };
        let what = format!("pid {} fd {fd}", self.pid());
        memfile::sealed(File::from(dup), &what).map(|(file, meta)| (file, meta.len()))
    }

    /// Our duplicate of the peer's eventfd `fd` (`peer_fd::checked_eventfd`).
    pub fn eventfd(&self, fd: u32) -> io::Result<OwnedFd> {
        self.0.eventfd(fd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// Our own memfd and eventfd come back through the pidfd; a descriptor that is neither
    /// is refused.
    #[test]
    fn reaches_memfds_and_eventfds() {
        let me = PeerProcess::new(std::process::id());
        assert!(me.0.has_pidfd(), "pidfd_open refused here");
        let m = daplrs_backend::memfile::create_sealed("peer-test", 8192).unwrap();
        let (_, len) = me.memfd(m.as_raw_fd() as u32).expect("memfd");
        assert_eq!(len, 8192);
        let e = peer_fd::eventfd().unwrap();
        me.eventfd(e.as_raw_fd() as u32).expect("eventfd");
        let unsealed = daplrs_backend::memfile::create("peer-test", 8192).unwrap();
        assert!(me.memfd(unsealed.as_raw_fd() as u32).is_err());
        assert!(me.eventfd(m.as_raw_fd() as u32).is_err());
        assert!(me.memfd(e.as_raw_fd() as u32).is_err());
        assert!(me.memfd(1 << 30).is_err());
    }
}
