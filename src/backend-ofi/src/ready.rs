//! Which connected endpoints' completion queues have something to read.
//!
//! libfabric 1.17's tcp provider, reading a CQ (`fi_cq_read`, `fi_trywait`),
//! first walks every endpoint bound to it, each under its own mutex
//! (prov/tcp/src/tcpx_cq.c, `tcpx_progress`), and only then asks its epoll
//! set which sockets are ready: with all the connections of an EVD on one
//! fid_cq, a message on one of 1,024 connections cost 4 to 5 times what it
//! did on one (issue 37). So connected endpoints (FI_EP_MSG) complete on
//! small fid_cqs (`Feed`s of at most `SEATS` endpoints: each tcp fid_cq
//! also holds a pool of 1,024 transfer entries, ~400 KiB once used, too much
//! for one per connection), whose reads walk those endpoints alone, and each
//! of our CQs keeps this set of its feeds: an epoll set of their wait
//! descriptors (`FI_WAIT_FD`: the provider's own epoll set of its endpoints'
//! sockets and of the CQ's signal, which every completion written sets), and
//! the feeds to read whatever their descriptors say (`mark`: a receive
//! posted, which lets the provider take a message it had already read from
//! the socket; an SRQ QP's own receive feed, read on every look as before;
//! every feed on a provider whose descriptors say nothing until
//! `fi_trywait` arms them, verbs).

use std::any::Any;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use daplrs_backend::Result;
use ofi_sys as fi;
use parking_lot::Mutex;

use crate::wait::Waiter;
use crate::Fid;

/// Ready descriptors taken from the epoll set at a time.
const EVENTS: usize = 64;
/// Endpoints per shared feed: a read walks them all (about 0.1 us each),
/// and a feed costs ~450 KiB once used (measured in the commit adding it).
pub(crate) const SEATS: usize = 32;

/// A fid_cq of endpoints' own, which a CQ of ours reads (see the module).
/// Leaves its set when dropped, before the fid_cq closes.
pub(crate) struct Feed {
    token: u64,
    fd: Option<RawFd>,
    set: Weak<Ready>,
    /// Endpoints seated (`Seat`).
    users: AtomicUsize,
    pub(crate) cq: Fid<fi::fid_cq>,
}

impl Drop for Feed {
    fn drop(&mut self) {
        if let Some(set) = self.set.upgrade() {
            set.forget(self.token, self.fd);
        }
    }
}

/// A QP's place on a feed (its endpoint is bound to the feed's fid_cq):
/// held until the endpoint closed.
pub(crate) struct Seat {
    feed: Arc<Feed>,
}

impl Seat {
    pub(crate) fn cq(&self) -> &Fid<fi::fid_cq> {
        &self.feed.cq
    }

    /// The provider may hold something the feed's descriptor does not show
    /// (a message read from the socket before its receive was posted): the
    /// next look reads the feed.
    pub(crate) fn mark(&self) {
        if let Some(set) = self.feed.set.upgrade() {
            set.mark(self.feed.token);
        }
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.feed.users.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A feed as a look hands it out: its fid_cq, and for an SRQ QP's own
/// receive feed that QP (its entries go to `OfiQp::srq_received`), kept
/// as the CQ's reader knows it (`reap`).
pub(crate) struct Source {
    pub feed: Arc<Feed>,
    pub srq: Option<Arc<dyn Any + Send + Sync>>,
}

struct Entry {
    feed: Weak<Feed>,
    srq: Option<Weak<dyn Any + Send + Sync>>,
}

pub(crate) struct Ready {
    epoll: OwnedFd,
    /// The progress thread's: a mark wakes it if it sleeps (a consumer
    /// blocked on the CQ waits for its read).
    waiter: Arc<Waiter>,
    next: AtomicU64,
    feeds: Mutex<HashMap<u64, Entry>>,
    /// The shared feeds, in the order opened (new seats go to the first with room).
    shared: Mutex<Vec<Weak<Feed>>>,
    /// Feeds to read at the next look whatever their descriptors say.
    marked: Mutex<Vec<u64>>,
    /// Feeds read at every look (SRQ feeds, or one without a descriptor).
    always: Mutex<Vec<u64>>,
    /// Descriptors in the epoll set: with none (the CQ of a reliable-datagram
    /// device, whose ports read their own fid_cqs), a look makes no system call.
    in_epoll: AtomicUsize,
}

impl Ready {
    /// The IA's progress thread's waiter, which the CQ's consumers stamp.
    pub(crate) fn waiter(&self) -> &Waiter {
        &self.waiter
    }

    pub(crate) fn new(waiter: Arc<Waiter>) -> std::io::Result<Arc<Ready>> {
        // SAFETY: a plain system call; the descriptor is owned once created.
        let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epoll < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Arc::new(Ready {
            // SAFETY: just created, owned here alone.
            epoll: unsafe { OwnedFd::from_raw_fd(epoll) },
            waiter,
            next: AtomicU64::new(1),
            feeds: Mutex::new(HashMap::new()),
            shared: Mutex::new(Vec::new()),
            marked: Mutex::new(Vec::new()),
            always: Mutex::new(Vec::new()),
            in_epoll: AtomicUsize::new(0),
        }))
    }

    /// The set's descriptor: ready while some feed's is.
    pub(crate) fn fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }

    /// A seat on a shared feed with room, or on a new one (`open` opens its
    /// fid_cq, FI_WAIT_FD). `read_always`: the provider's wait descriptors
    /// show nothing until `fi_trywait` armed them (verbs), and `fi_trywait`
    /// refuses to arm a CQ that holds entries: a feed whose descriptor
    /// stays quiet may still hold completions, so every look reads it.
    pub(crate) fn seat(
        self: &Arc<Self>,
        open: impl FnOnce() -> Result<Fid<fi::fid_cq>>,
        read_always: bool,
    ) -> Result<Seat> {
        let mut shared = self.shared.lock();
        shared.retain(|w| w.strong_count() > 0);
        for w in shared.iter() {
            let Some(feed) = w.upgrade() else { continue };
            let taken = feed
                .users
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < SEATS).then_some(n + 1)
                })
                .is_ok();
            if taken {
                return Ok(Seat { feed });
            }
        }
        let feed = self.add(open()?, None, read_always);
        feed.users.store(1, Ordering::Release);
        shared.push(Arc::downgrade(&feed));
        Ok(Seat { feed })
    }

    /// A feed of SRQ QP `qp`'s alone, for its receives of the SRQ (read at
    /// every look, as the provider's shared context may hold their messages).
    pub(crate) fn own(
        self: &Arc<Self>,
        qp: &Arc<dyn Any + Send + Sync>,
        cq: Fid<fi::fid_cq>,
    ) -> Seat {
        let feed = self.add(cq, Some(qp), true);
        feed.users.store(1, Ordering::Release);
        Seat { feed }
    }

    fn add(
        self: &Arc<Self>,
        cq: Fid<fi::fid_cq>,
        srq: Option<&Arc<dyn Any + Send + Sync>>,
        read_always: bool,
    ) -> Arc<Feed> {
        let token = self.next.fetch_add(1, Ordering::Relaxed);
        let fd = crate::wait::wait_fd(cq.fid());
        let mut watched = false;
        if let Some(fd) = fd {
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: token,
            };
            // SAFETY: our epoll descriptor, an open descriptor and an event of ours.
            watched = unsafe {
                libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev)
            } == 0;
            if watched {
                self.in_epoll.fetch_add(1, Ordering::Relaxed);
            }
        }
        let feed = Arc::new(Feed {
            token,
            fd: fd.filter(|_| watched),
            set: Arc::downgrade(self),
            users: AtomicUsize::new(0),
            cq,
        });
        self.feeds.lock().insert(
            token,
            Entry {
                feed: Arc::downgrade(&feed),
                srq: srq.map(Arc::downgrade),
            },
        );
        if srq.is_some() || !watched || read_always {
            self.always.lock().push(token);
        }
        feed
    }

    fn mark(&self, token: u64) {
        {
            let mut marked = self.marked.lock();
            if marked.contains(&token) {
                return;
            }
            marked.push(token);
        }
        self.waiter.wake_sleeper();
    }

    fn forget(&self, token: u64, fd: Option<RawFd>) {
        if let Some(fd) = fd {
            // SAFETY: our epoll descriptor; `fd` is still open (its fid_cq closes after this).
            unsafe {
                libc::epoll_ctl(
                    self.epoll.as_raw_fd(),
                    libc::EPOLL_CTL_DEL,
                    fd,
                    std::ptr::null_mut(),
                )
            };
            self.in_epoll.fetch_sub(1, Ordering::Relaxed);
        }
        self.feeds.lock().remove(&token);
        self.always.lock().retain(|t| *t != token);
        self.marked.lock().retain(|t| *t != token);
    }

    /// Whether some feed is marked to be read whatever its descriptor says
    /// (those read at every look are asked with `fi_trywait`: `to_ask`).
    pub(crate) fn has_marked(&self) -> bool {
        !self.marked.lock().is_empty()
    }

    /// The feeds to read now: those whose descriptor is ready, those marked
    /// (no longer, once handed out) and those read at every look.
    pub(crate) fn take(&self) -> Vec<Source> {
        let mut tokens: Vec<u64> = std::mem::take(&mut *self.marked.lock());
        {
            let always = self.always.lock();
            tokens.extend(always.iter().copied());
        }
        if self.in_epoll.load(Ordering::Relaxed) != 0 {
            let mut events = [libc::epoll_event { events: 0, u64: 0 }; EVENTS];
            // SAFETY: our epoll descriptor; room for EVENTS events; no wait.
            let n = unsafe {
                libc::epoll_wait(
                    self.epoll.as_raw_fd(),
                    events.as_mut_ptr(),
                    EVENTS as i32,
                    0,
                )
            };
            tokens.extend(events.iter().take(n.max(0) as usize).map(|e| e.u64));
        }
        if tokens.is_empty() {
            return Vec::new();
        }
        tokens.sort_unstable();
        tokens.dedup();
        let feeds = self.feeds.lock();
        tokens
            .iter()
            .filter_map(|t| {
                let e = feeds.get(t)?;
                let srq = match &e.srq {
                    Some(qp) => Some(qp.upgrade()?),
                    None => None,
                };
                Some(Source {
                    feed: e.feed.upgrade()?,
                    srq,
                })
            })
            .collect()
    }

    /// The fid_cqs read at every look, or with `all` every one (for
    /// `fi_trywait` before the progress thread sleeps), held open.
    pub(crate) fn to_ask(&self, all: bool) -> Vec<Arc<Feed>> {
        let feeds = self.feeds.lock();
        if all {
            return feeds.values().filter_map(|e| e.feed.upgrade()).collect();
        }
        let always = self.always.lock().clone();
        always
            .iter()
            .filter_map(|t| feeds.get(t)?.feed.upgrade())
            .collect()
    }
}
