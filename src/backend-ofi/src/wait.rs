//! Where the progress thread sleeps: one epoll set holding the wait objects
//! (`FI_WAIT_FD`, `fi_control(FI_GETWAIT)`) of the IA's event queue and CQs,
//! and an eventfd that wakes it to stop. An idle IA then wakes no thread, and
//! a completion or a peer's RDMA data is handled as soon as the provider's
//! descriptor says so, not on the next millisecond tick (docs/libfabric.md,
//! Progress).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use ofi_sys as fi;

pub(crate) struct Waiter {
    epoll: OwnedFd,
    wake: OwnedFd,
}

impl Waiter {
    pub(crate) fn new() -> std::io::Result<Waiter> {
        // SAFETY: plain system calls; each descriptor is owned once created.
        unsafe {
            let epoll = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            if epoll < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let epoll = OwnedFd::from_raw_fd(epoll);
            let wake = libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK);
            if wake < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let wake = OwnedFd::from_raw_fd(wake);
            let w = Waiter { epoll, wake };
            w.watch(w.wake.as_raw_fd())?;
            Ok(w)
        }
    }

    /// Adds a descriptor to the set. Several CQs may share the provider's
    /// descriptor: adding it again is not an error. A descriptor closed with
    /// its CQ leaves the set by itself (epoll forgets closed files).
    pub(crate) fn watch(&self, fd: RawFd) -> std::io::Result<()> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: fd as u64,
        };
        // SAFETY: an open epoll descriptor and an event struct of ours.
        let rc =
            unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
        let err = std::io::Error::last_os_error();
        if rc < 0 && err.raw_os_error() != Some(libc::EEXIST) {
            return Err(err);
        }
        Ok(())
    }

    /// Wakes the thread sleeping in `sleep` (to stop it).
    pub(crate) fn wake(&self) {
        let one = 1u64;
        // SAFETY: eight bytes to our eventfd; a full counter only means it is already awake.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Whether the thread may sleep: `fi_trywait` says nothing is pending on
    /// `fids` and the provider armed their descriptors (else the caller reads
    /// again).
    pub(crate) fn may_sleep(&self, fabric: *mut fi::fid_fabric, fids: &mut [*mut fi::fid]) -> bool {
        // SAFETY: an open fabric and objects of it, held open by the caller.
        unsafe { fi::fi_trywait(fabric, fids.as_mut_ptr(), fids.len() as i32) == 0 }
    }

    /// Sleeps until a descriptor of the set is ready (after `may_sleep` said
    /// so: whatever arrived since has made its descriptor ready).
    pub(crate) fn sleep(&self) {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 8];
        // SAFETY: an open epoll descriptor; room for 8 events.
        let n = unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), events.as_mut_ptr(), 8, -1) };
        let wake = self.wake.as_raw_fd();
        if events
            .iter()
            .take(n.max(0) as usize)
            .any(|e| e.u64 == wake as u64)
        {
            let mut v = 0u64;
            // SAFETY: reading our eventfd's counter resets it.
            unsafe { libc::read(wake, (&mut v as *mut u64).cast(), 8) };
        }
    }
}

/// The wait descriptor of an object opened with `FI_WAIT_FD`, if it has one.
pub(crate) fn wait_fd(fid: *mut fi::fid) -> Option<RawFd> {
    let mut fd: RawFd = -1;
    // SAFETY: an open object; FI_GETWAIT writes an int for FI_WAIT_FD objects.
    let rc = unsafe { fi::fi_control(fid, fi::FI_GETWAIT as i32, (&mut fd as *mut RawFd).cast()) };
    (rc == 0 && fd >= 0).then_some(fd)
}
