//! Which of a CQ's connections a polling consumer's look reads (`TcpCq::progress`), so that a
//! look costs what is ready, not how many connections the CQ has (an MPI rank has one EP per
//! peer, all completing into a few EVDs, and polls them in a loop).
//!
//! Each CQ keeps an epoll set of the sockets of its established TCP connections (level-
//! triggered: looking consumes nothing) and a list of the same-host rings its connections'
//! frames come through (samehost/ring.rs), whose data no socket reports. A look asks the
//! epoll set which sockets hold input, and the device's ready board which rings their
//! writers marked (samehost/board.rs; a ring without a slot there is read each look); the
//! engine is taken only if something is there. A connection joins these sets when it is established
//! and leaves them (`Watched`, dropped) when it closes or its frames move to a ring.
//!
//! What the kernel does not report is looked at directly: a socket made quiet (its receive
//! low-water mark raised while its consumer has requests outstanding, engine/progress.rs
//! `settle_quiet`) wakes no poller, epoll included, for a small frame; the look keeps the
//! connections it left quiet and reads them each time, as before. Those are the connections
//! with requests of the consumer's outstanding: work, not the connection count.
//!
//! Each CQ also keeps the parked set of the connections it receives for that need only their
//! input watched (`Parked`): the progress thread watches it nested in its own epoll set, and
//! a thread waiting on the CQ claims it whole (engine/mod.rs `claim_for_cq`).
//!
//! The sets are the CQ's (completions.rs holds them), but a connection's place in them
//! (`Watched`, `Parked`) holds the sets alone: the engine's connections name no CQ object
//! here, so this file stands below both the CQ and the engine.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use daplrs_backend::intmap::IntSet;
use parking_lot::Mutex;

use crate::samehost::ring::Ring;
use crate::sys::Epoll;

/// One CQ's readiness sets.
#[derive(Default)]
pub(crate) struct CqReadiness {
    /// The sockets of its TCP connections, by token; made at the first (None: epoll refused,
    /// then every connection is looked at, as before: `Watched::socket`).
    sockets: OnceLock<Option<Epoll>>,
    /// The tokens of the sockets in `sockets` (a set: connections leave it one by one).
    socket_tokens: Mutex<IntSet<u64>>,
    /// The rings its connections' frames come through, by token, that a look reads each
    /// time: those not on the device's ready board (samehost/board.rs).
    rings: Mutex<Vec<(u64, Arc<Ring>)>>,
    /// The connections whose rings are on the board: a look reads those marked there.
    boarded: Mutex<IntSet<u64>>,
    /// Connections a request was posted on since the last look (`note_posted`).
    posted: Mutex<Vec<u64>>,
    /// The parked connections of the QPs this CQ receives for: those that need only their
    /// input watched by the progress thread (engine/progress.rs `add_conn`). It watches them
    /// through this set, nested in its set of returned connections while no driver claims
    /// it; a driver claims them all with one `epoll_ctl`, not one per connection
    /// (engine/mod.rs `claim_for_cq`).
    parked: OnceLock<Option<Epoll>>,
    /// How many connections are parked in it.
    parked_count: AtomicUsize,
    /// A connection could not be put in these sets (`failed`): a look reads every connection
    /// of the CQ instead, as it did before there were such sets.
    scan_all: AtomicBool,
}

/// Connections noted as posted on between two looks, at most: past that, a consumer that does
/// not poll (it waits, or polls another EVD) makes no list grow. A connection left out is
/// only not made quiet before its answer comes (the progress thread may then be woken by
/// it, as by any frame): the look still reads it when its socket reports the answer.
const POSTED_MAX: usize = 256;

/// Up to this many sockets, a look reads each instead of asking epoll first: a read that
/// finds nothing costs what epoll_wait costs, and one that finds something saves it.
const READ_ALL_UPTO: usize = 2;

impl CqReadiness {
    fn epoll(&self) -> Option<&Epoll> {
        self.sockets
            .get_or_init(|| {
                Epoll::new()
                    .map_err(|e| log::warn!("epoll: {e}; a poller reads every connection"))
                    .ok()
            })
            .as_ref()
    }

    /// Watches socket `fd` of connection `token` for input; false if epoll refused it.
    fn watch_socket(&self, fd: RawFd, token: u64) -> bool {
        let Some(epoll) = self.epoll() else {
            return false;
        };
        match epoll.add(fd, token) {
            Ok(()) => {
                self.socket_tokens.lock().insert(token);
                true
            }
            Err(e) => {
                log::warn!("epoll_ctl(ADD): {e}");
                false
            }
        }
    }

    fn unwatch_socket(&self, fd: RawFd, token: u64) {
        if let Some(Some(epoll)) = self.sockets.get() {
            epoll.remove(fd);
            self.socket_tokens.lock().remove(&token);
        }
    }

    fn watch_ring(&self, token: u64, ring: Arc<Ring>) {
        match ring.on_board() {
            true => {
                self.boarded.lock().insert(token);
            }
            false => self.rings.lock().push((token, ring)),
        }
    }

    fn forget_ring(&self, token: u64) {
        self.rings.lock().retain(|(t, _)| *t != token);
        self.boarded.lock().remove(&token);
    }

    /// A connection could not be put in these sets: from now on a poller's look reads every
    /// connection of the CQ, as it did before there were such sets.
    pub(crate) fn failed(&self) {
        self.scan_all.store(true, Ordering::Relaxed);
    }

    /// Whether a connection could not be put in these sets (`failed`): then they do not hold
    /// every connection of the CQ, and a look or a driver walks them all.
    pub(crate) fn scan_all(&self) -> bool {
        self.scan_all.load(Ordering::Relaxed)
    }

    /// Appends the tokens of the connections in these sets (sockets and rings): not all of
    /// the CQ's if one could not be put in them (`failed`).
    pub(crate) fn members(&self, out: &mut Vec<u64>) {
        out.extend(self.socket_tokens.lock().iter());
        out.extend(self.rings.lock().iter().map(|(t, _)| *t));
        out.extend(self.boarded.lock().iter());
    }

    /// Parks socket `fd` of connection `token`; false if the set could not be made or took it.
    pub(crate) fn park(&self, fd: RawFd, token: u64) -> bool {
        let added = self.add_parked(fd, token);
        if added {
            self.parked_count.fetch_add(1, Ordering::Relaxed);
        }
        added
    }

    /// Adds the bell `fd` of parked connection `token`'s ring to the parked set (it counts
    /// with its connection, not apart).
    fn park_bell(&self, fd: RawFd, token: u64) -> bool {
        self.add_parked(fd, token)
    }

    fn unpark_bell(&self, fd: RawFd) {
        self.remove_parked(fd);
    }

    fn unpark(&self, fd: RawFd) {
        if self.remove_parked(fd) {
            self.parked_count.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Adds `fd` to the parked set under `token`, making the set first if need be.
    fn add_parked(&self, fd: RawFd, token: u64) -> bool {
        let set = self.parked.get_or_init(|| {
            Epoll::new()
                .map_err(|e| log::warn!("epoll: {e}; connections are not parked"))
                .ok()
        });
        match set.as_ref().map(|s| s.add(fd, token)) {
            Some(Ok(())) => true,
            Some(Err(e)) => {
                log::warn!("epoll_ctl(ADD): {e}");
                false
            }
            None => false,
        }
    }

    /// Takes `fd` out of the parked set; false if there is no set.
    fn remove_parked(&self, fd: RawFd) -> bool {
        match self.parked.get() {
            Some(Some(set)) => {
                set.remove(fd);
                true
            }
            _ => false,
        }
    }

    /// How many connections are parked here.
    pub(crate) fn parked_count(&self) -> usize {
        self.parked_count.load(Ordering::Relaxed)
    }

    /// The parked set's descriptor, once made.
    pub(crate) fn parked_fd(&self) -> Option<RawFd> {
        self.parked.get()?.as_ref().map(|s| s.fd())
    }

    /// Appends the tokens of the parked connections with input (at most 64).
    pub(crate) fn parked_ready(&self, out: &mut Vec<u64>) {
        if let Some(Some(set)) = self.parked.get() {
            set.ready(out);
        }
    }

    /// A request was posted on connection `token`: the next look reads it whatever its socket
    /// says, so that it is made quiet before the answer comes if the consumer polls for it
    /// (engine/progress.rs `settle_quiet`), as it was when every look read every connection.
    pub(crate) fn note_posted(&self, token: u64) {
        let mut posted = self.posted.lock();
        if posted.len() < POSTED_MAX && posted.last() != Some(&token) {
            posted.push(token);
        }
    }

    /// Appends the tokens of the connections with something to read now: sockets with input
    /// (at most 64 a look; the rest stay ready for the next), rings off the board with data,
    /// and those posted on since the last look. The rings marked on the board are taken
    /// under the engine (`TcpCq::progress`), where nothing taken can be dropped.
    pub(crate) fn ready(&self, out: &mut Vec<u64>) {
        out.append(&mut self.posted.lock());
        if let Some(Some(epoll)) = self.sockets.get() {
            let tokens = self.socket_tokens.lock();
            match tokens.len() {
                0 => {}
                n if n <= READ_ALL_UPTO => out.extend(tokens.iter()),
                _ => {
                    drop(tokens);
                    epoll.ready(out);
                }
            }
        }
        let rings = self.rings.lock();
        out.extend(rings.iter().filter(|(_, r)| r.has_data()).map(|(t, _)| *t));
    }
}

/// A connection's place in the readiness sets of its QP's CQs (one or two); dropped, it
/// leaves them. Declared before the socket in `Conn`, so that it leaves before the socket
/// closes.
pub(crate) struct Watched {
    /// The sets of the CQs it is in.
    sets: Vec<Arc<CqReadiness>>,
    token: u64,
    via: Via,
}

enum Via {
    Socket(RawFd),
    Ring,
}

impl Watched {
    /// Watches socket `fd` of connection `token` in `sets` (its CQs'). A set that refuses it
    /// turns its CQ's looks back to reading every connection (`CqReadiness::failed`).
    pub(crate) fn socket(sets: Vec<Arc<CqReadiness>>, token: u64, fd: RawFd) -> Watched {
        let mut added = Vec::with_capacity(sets.len());
        for set in sets {
            if !set.watch_socket(fd, token) {
                set.failed();
                continue;
            }
            added.push(set);
        }
        Watched {
            sets: added,
            token,
            via: Via::Socket(fd),
        }
    }

    /// Watches `ring`, through which connection `token`'s frames come, in `sets` (its CQs').
    /// A ring on our board (samehost/board.rs) is read when marked there, by any look.
    pub(crate) fn ring(sets: Vec<Arc<CqReadiness>>, token: u64, ring: &Arc<Ring>) -> Watched {
        for set in &sets {
            set.watch_ring(token, ring.clone());
        }
        Watched {
            sets,
            token,
            via: Via::Ring,
        }
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        for set in &self.sets {
            match self.via {
                Via::Socket(fd) => set.unwatch_socket(fd, self.token),
                Via::Ring => set.forget_ring(self.token),
            }
        }
    }
}

/// A connection's place in its receive CQ's parked set (`CqReadiness::park`); dropped, it
/// leaves it. Declared before the socket in `Conn`.
pub(crate) struct Parked {
    /// The id of the CQ whose set it is in (a driver claims the set by it).
    pub(crate) cq: u64,
    /// That CQ's sets.
    sets: Arc<CqReadiness>,
    fd: RawFd,
    /// The same-host ring its frames come through: we count as its sleeper while parked, so
    /// that its writer rings the bell (samehost/ring.rs), which is in the set beside the
    /// socket (None: no bell, the writer's doorbells come through the socket).
    ring: Option<(Arc<Ring>, Option<RawFd>)>,
}

impl Parked {
    /// Parks socket `fd` of connection `token` in the parked set of CQ `cq` (in `sets`), with
    /// the bell of `ring` if its frames come through one; None if it could not be, or if the
    /// ring holds data already.
    pub(crate) fn new(
        cq: u64,
        sets: Arc<CqReadiness>,
        fd: RawFd,
        token: u64,
        ring: Option<Arc<Ring>>,
    ) -> Option<Parked> {
        if !sets.park(fd, token) {
            return None;
        }
        let mut parked = Parked {
            cq,
            sets,
            fd,
            ring: None,
        };
        if let Some(ring) = ring {
            // Counted first, so that a frame written from now on rings the bell; one written
            // before is found here, and the connection is left to be read.
            let has_data = ring.begin_sleep();
            let bell = ring.bell_fd();
            parked.ring = Some((ring, None));
            if has_data {
                return None;
            }
            if let Some(bell) = bell {
                if !parked.sets.park_bell(bell, token) {
                    return None;
                }
                parked.ring = parked.ring.take().map(|(r, _)| (r, Some(bell)));
            }
        }
        Some(parked)
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        if let Some((ring, bell)) = self.ring.take() {
            if let Some(bell) = bell {
                self.sets.unpark_bell(bell);
            }
            ring.end_sleep();
        }
        self.sets.unpark(self.fd);
    }
}
