//! Where the progress thread sleeps: one epoll set holding the wait objects
//! (`FI_WAIT_FD`, `fi_control(FI_GETWAIT)`) of the IA's event queue and CQs,
//! and an eventfd that wakes it to stop. An idle IA then wakes no thread, and
//! a completion or a peer's RDMA data is handled as soon as the provider's
//! descriptor says so, not on the next millisecond tick (docs/libfabric.md,
//! Progress).
//!
//! It also keeps out of a polling consumer's way: a thread that polls its EVD
//! reads its CQ itself (`OfiCq::progress`), which is what moves the provider,
//! so while one does the progress thread naps instead of reading the same
//! provider's queues under the same locks (two threads fighting over them
//! cost the poller its round trips, docs/libfabric.md, Progress).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ofi_sys as fi;

use crate::keymap::PollStamp;

/// What ended a nap (`Waiter::nap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Woken {
    /// It ran its course.
    No,
    /// A peer on this host rang (`keymap`): a request of theirs is for us.
    Bell,
    /// We were woken: a connection to break, a new CQ or the stop.
    Wake,
}

pub(crate) struct Waiter {
    epoll: OwnedFd,
    wake: OwnedFd,
    /// The doorbell peers on this host ring (`keymap`): apart from `wake`, so that a
    /// thread standing back for a polling consumer can tell a peer's ring, which the
    /// consumer answers if it still polls, from work of its own.
    bell: OwnedFd,
    /// When a consumer last polled a CQ of the IA and posted, in the doorbell's
    /// page that peers on this host read (`keymap::PollStamp`).
    polled: PollStamp,
    /// A request or receive was posted since the progress thread last looked
    /// (`take_posted`): on a provider it must poll, its turns come quickly for
    /// a while (`device::Cadence`).
    posted: AtomicBool,
    /// The thread is going to sleep, or sleeps (`sleep`): a feed marked
    /// meanwhile wakes it (`wake_sleeper`, `ready`).
    sleeping: AtomicBool,
}

impl Waiter {
    pub(crate) fn new(polled: PollStamp) -> std::io::Result<Waiter> {
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
            let bell = libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK);
            if bell < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let bell = OwnedFd::from_raw_fd(bell);
            let w = Waiter {
                epoll,
                wake,
                bell,
                polled,
                posted: AtomicBool::new(false),
                sleeping: AtomicBool::new(false),
            };
            w.watch(w.wake.as_raw_fd())?;
            w.watch(w.bell.as_raw_fd())?;
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

    /// The eventfd peers on this host ring (`keymap`).
    pub(crate) fn bell_fd(&self) -> RawFd {
        self.bell.as_raw_fd()
    }

    /// A consumer polled a CQ and moved the provider itself.
    pub(crate) fn consumer_polled(&self) {
        self.polled.polled();
    }

    /// A post on the IA: its answer, or the peer's next message, is due soon.
    /// Stamped for peers (`PollStamp::posted`); the thread's flag is read
    /// before written, so that a stream of posts leaves its line shared.
    #[inline]
    pub(crate) fn note_post(&self) {
        self.polled.posted();
        if !self.posted.load(Ordering::Relaxed) {
            self.posted.store(true, Ordering::Relaxed);
        }
    }

    /// Whether anything was posted since the last call.
    pub(crate) fn take_posted(&self) -> bool {
        self.posted.load(Ordering::Relaxed) && self.posted.swap(false, Ordering::Relaxed)
    }

    /// The consumer found what it polled for: unless it polls again, it no longer
    /// counts as polling once its last post is a few microseconds old (`PollStamp`).
    #[inline]
    pub(crate) fn consumer_found(&self) {
        self.polled.found();
    }

    /// Whether a consumer polls (it did lately, and has not left: `PollStamp`).
    pub(crate) fn consumer_polling(&self) -> bool {
        self.polled.polling()
    }

    /// Sleeps for `d` on the wake descriptor and the doorbell alone (not the
    /// provider's, which stay ready until the poller reads them): returns what
    /// ended it (`Wake`: there is work for the thread itself).
    pub(crate) fn nap(&self, d: Duration) -> Woken {
        let mut pfds = [self.wake.as_raw_fd(), self.bell.as_raw_fd()].map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        });
        let ts = libc::timespec {
            tv_sec: d.as_secs() as libc::time_t,
            tv_nsec: d.subsec_nanos() as libc::c_long,
        };
        // SAFETY: two pollfds of ours and a timespec, no signal mask.
        let n = unsafe { libc::ppoll(pfds.as_mut_ptr(), 2, &ts, std::ptr::null()) };
        if n <= 0 {
            return Woken::No;
        }
        let [wake, bell] = pfds.map(|p| p.revents != 0);
        if bell {
            drain(&self.bell);
        }
        if wake {
            drain(&self.wake);
            return Woken::Wake;
        }
        Woken::Bell
    }

    /// Naps end when asked, not up to 50 us late (the default timer slack).
    pub(crate) fn precise_naps(&self) {
        // SAFETY: sets the calling thread's timer slack (1 us).
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong) };
    }

    /// Wakes the thread sleeping in `sleep` (to stop it).
    pub(crate) fn wake(&self) {
        let one = 1u64;
        // SAFETY: eight bytes to our eventfd; a full counter only means it is already awake.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// The thread is about to look whether it may sleep: from now a mark
    /// wakes it (it looks at the marks after this, a marker at this after
    /// its mark).
    pub(crate) fn going_to_sleep(&self) {
        self.sleeping.store(true, Ordering::SeqCst);
    }

    /// The thread is awake (did not sleep, or woke).
    pub(crate) fn awake(&self) {
        self.sleeping.store(false, Ordering::SeqCst);
    }

    /// Wakes the thread if it sleeps or is going to (see `going_to_sleep`).
    #[inline]
    pub(crate) fn wake_sleeper(&self) {
        if self.sleeping.load(Ordering::SeqCst) {
            self.wake();
        }
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
        for fd in [&self.wake, &self.bell] {
            let mut ready = events.iter().take(n.max(0) as usize);
            if ready.any(|e| e.u64 == fd.as_raw_fd() as u64) {
                drain(fd);
            }
        }
    }
}

/// Resets an eventfd of ours (nonblocking: nothing to read is no wait).
fn drain(fd: &OwnedFd) {
    let mut v = 0u64;
    // SAFETY: reading our eventfd's counter into eight bytes of ours.
    unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
}

/// The wait descriptor of an object opened with `FI_WAIT_FD`, if it has one.
pub(crate) fn wait_fd(fid: *mut fi::fid) -> Option<RawFd> {
    let mut fd: RawFd = -1;
    // SAFETY: an open object; FI_GETWAIT writes an int for FI_WAIT_FD objects.
    let rc = unsafe { fi::fi_control(fid, fi::FI_GETWAIT as i32, (&mut fd as *mut RawFd).cast()) };
    (rc == 0 && fd >= 0).then_some(fd)
}
