//! How a thread about to sleep in poll(2) waits for frames: the progress thread
//! (engine/progress.rs) and an application thread driving its CQ (`TcpCq::drive`) alike. It
//! first polls without sleeping for the spin window (`spin_window`, `spin_poll`), and it
//! watches the same-host rings of the connections in its poll set, whose frames no socket
//! reports (`RingWatch`).
//!
//! Below the engine and the CQ both: it knows poll sets and rings, not connections.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::samehost::ring::Ring;
use crate::sys::{self, PollFd, POLLIN, POLLOUT};

/// Environment variable: how long, in microseconds, a thread that just saw traffic (the
/// progress thread after serving a request, an application thread waiting in `dat_evd_wait`)
/// polls its sockets without sleeping before it blocks; 0 turns spinning off.
pub(crate) const SPIN_ENV: &str = "DAPLRS_SPIN_US";
/// The spin window when the variable is unset: a few loopback or LAN round trips. Sleeping
/// costs a wake-up when the next frame comes (tens of microseconds for an idle CPU of a
/// virtual machine), which is what a request-answer exchange would otherwise pay on each side.
pub(crate) const SPIN_DEFAULT_US: u64 = 50;

/// The spin window in effect (`DAPLRS_SPIN_US`, read once per process; at most 10 ms).
pub(crate) fn spin_window() -> Duration {
    static SPIN: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| parse_spin(std::env::var(SPIN_ENV).ok().as_deref()))
}

/// The spin window a value of `DAPLRS_SPIN_US` asks for (None: unset); the default, with a
/// warning, for one out of range.
pub(crate) fn parse_spin(value: Option<&str>) -> Duration {
    let Some(v) = value else {
        return Duration::from_micros(SPIN_DEFAULT_US);
    };
    match v.trim().parse::<u64>() {
        Ok(us) if us <= 10_000 => Duration::from_micros(us),
        _ => {
            log::warn!("{SPIN_ENV}={v:?} is not a number of microseconds (0..=10000); using {SPIN_DEFAULT_US}");
            Duration::from_micros(SPIN_DEFAULT_US)
        }
    }
}

/// How long after a polling consumer's last look at a connection (`TcpCq::progress`) the
/// progress thread leaves a same-host ring to that consumer: it sleeps deferring to it (see
/// `RingWatch`), and the peer's writer rings for it only once the consumer has not looked for
/// this long, so the consumer's messages wake nobody; a consumer polling in a loop looks again
/// within microseconds (the peer's writer applies the same lease: ring.rs). For as long,
/// frames the progress thread reads on the connection, if it is quiet (`Engine::settle_quiet`),
/// start no spin window (see `ProgressThread::serve` in engine/progress.rs).
pub(crate) const POLL_LEASE: Duration = Duration::from_micros(100);

/// The same-host rings (samehost/ring.rs) of connections in a poll set, by their index in the
/// set: rings we read (the peer's frames) and rings we write (the peer's ring, while output
/// waits). A thread that may sleep in poll counts itself on each ring it reads first, so that
/// the peer's writes ring the doorbell on the socket, and does not sleep if a ring it reads
/// holds data or a ring it writes has room: the socket's POLLIN and POLLOUT stand for those.
///
/// The progress thread defers a ring a polling consumer holds a lease on (`POLL_LEASE`) to
/// that consumer: the writer rings for it only once the consumer stopped looking, so the
/// consumer's messages wake nobody (ring.rs).
///
/// The bells of the rings read (ring.rs) are polled too, after every other entry (`add_bells`):
/// they only wake the poll; `end` rearms the ones that rang and marks their connection's entry.
#[derive(Default)]
pub(crate) struct RingWatch {
    /// Each ring read: the index of its connection's entry, the index of its bell's entry.
    input: Vec<(usize, Arc<Ring>, Option<usize>)>,
    /// Rings read that a polling consumer reads meanwhile, likewise.
    deferring: Vec<(usize, Arc<Ring>, Option<usize>)>,
    output: Vec<(usize, Arc<Ring>)>,
}

impl RingWatch {
    /// For a thread that waits for this ring's data (a driver): counts itself as a sleeper.
    pub fn watch_input(&mut self, index: usize, ring: &Arc<Ring>) {
        self.input.push((index, ring.clone(), None));
    }

    /// For the progress thread, on a ring a polling consumer reads: counts itself as deferring
    /// to that consumer, and reads the ring only once the consumer's lease ended.
    pub fn watch_deferring(&mut self, index: usize, ring: &Arc<Ring>) {
        self.deferring.push((index, ring.clone(), None));
    }

    /// Appends the bells of the rings watched for input to `fds` (after the entries the
    /// caller matches with its own list, which these do not disturb).
    pub fn add_bells(&mut self, fds: &mut Vec<PollFd>) {
        for (_, ring, bell) in self.input.iter_mut().chain(self.deferring.iter_mut()) {
            if let Some(fd) = ring.bell_fd() {
                *bell = Some(fds.len());
                fds.push(PollFd::new(fd, POLLIN));
            }
        }
    }

    pub fn watch_output(&mut self, index: usize, ring: &Arc<Ring>) {
        self.output.push((index, ring.clone()));
    }

    /// Counts us as a possible sleeper on every ring we read: true if one holds data already
    /// or one we write has room (then the caller polls without waiting).
    pub fn begin(&self) -> bool {
        let readable = self
            .input
            .iter()
            .fold(false, |ready, (_, r, _)| r.begin_sleep() | ready);
        // Data on a deferred ring is its consumer's, unless that one has stopped looking.
        let deferred = self.deferring.iter().fold(false, |ready, (_, r, _)| {
            (r.begin_defer() && !r.polled_within(POLL_LEASE)) | ready
        });
        readable || deferred || self.output.iter().any(|(_, r)| r.has_room())
    }

    /// Ends what `begin` started, and marks the entries whose ring holds data readable and
    /// those whose peer ring has room writable.
    pub fn end(&self, fds: &mut [PollFd]) {
        for (i, r, bell) in &self.input {
            r.end_sleep();
            if bell.is_some_and(|b| fds[b].revents() != 0) {
                r.drain_bell();
            }
            if r.has_data() {
                fds[*i].mark(POLLIN);
            }
        }
        for (i, r, bell) in &self.deferring {
            r.end_defer();
            if bell.is_some_and(|b| fds[b].revents() != 0) {
                r.drain_bell();
            }
            if r.has_data() && !r.polled_within(POLL_LEASE) {
                fds[*i].mark(POLLIN);
            }
        }
        for (i, r) in &self.output {
            if r.has_room() {
                fds[*i].mark(POLLOUT);
            }
        }
    }
}

/// poll(2) that looks without sleeping until `until` (spinning); Ok(0) once the window has
/// ended with nothing ready (its last look just before), for the caller to sleep as it
/// chooses (the progress thread first notes how late the window ended: `Starvation`).
/// Returns how many descriptors are ready. With `yield_cpu`, each look
/// that finds nothing gives the CPU to any other runnable thread: the progress thread spins
/// that way, since on a machine with as many busy threads as CPUs the application thread it
/// would keep off the CPU may be the very one that produces the next frame (measured: RDMA
/// write ping-pong over veth on 2 CPUs, 66 us one-way with the progress threads spinning
/// hard, 18 us yielding). An application thread waiting for its own completion spins hard.
pub(crate) fn spin_poll(fds: &mut [PollFd], until: Instant, yield_cpu: bool) -> io::Result<usize> {
    loop {
        let n = sys::poll(fds, 0)?;
        if n > 0 {
            return Ok(n);
        }
        if Instant::now() >= until {
            return Ok(0);
        }
        if yield_cpu {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}
