//! The progress thread (`progress_loop`): one per IA, polling the wake-up socket, listeners,
//! connections and datagram sockets until the device closes, spinning first and watching
//! same-host rings as a waiting application thread does (../poll_wait.rs); and what it does
//! for polling consumers (their leases, quiet sockets).

use super::*;
use crate::poll_wait::{spin_poll, spin_window, RingWatch};

enum Target {
    Wake,
    /// The set of returned connections (`Engine::release_cq_claims`).
    Returned,
    Listener(u64),
    Conn(u64),
    /// A datagram QP's socket.
    Datagram(u32),
    /// The socket of a QP's connect under way.
    Connecting(u32),
}

/// The progress thread: polls the wake-up pipe, listeners and connections until the device
/// closes.
pub(crate) fn progress_loop(shared: Arc<Shared>) {
    ProgressThread::start().run(&shared);
}

/// What the progress thread keeps from one iteration to the next.
struct ProgressThread {
    /// Where frames are read into.
    buf: Vec<u8>,
    realtime: Option<Realtime>,
    /// The spin window (zero for a real-time thread).
    spin: Duration,
    /// When this thread last served traffic: for a spin window after it, it polls without
    /// sleeping (see `spin_window`).
    last_traffic: Option<Instant>,
    /// The engine's `requests_served` at our last look (see `PollSet::target_polled`).
    requests_seen: u64,
    /// Whether the thread is starved (then it does not spin).
    starvation: Starvation,
}

impl ProgressThread {
    fn start() -> ProgressThread {
        let realtime = Realtime::start();
        ProgressThread {
            buf: vec![0u8; 256 * 1024],
            // A real-time thread must not spin: its sched_yield lets no ordinary thread run.
            spin: match realtime {
                Some(_) => Duration::ZERO,
                None => spin_window(),
            },
            realtime,
            last_traffic: None,
            requests_seen: 0,
            starvation: Starvation::default(),
        }
    }

    fn run(&mut self, shared: &Shared) {
        let mut drain = [0u8; 256];
        loop {
            if shared.stopped.load(Ordering::SeqCst) {
                break;
            }
            let mut set =
                PollSet::gather(shared, &mut shared.engine.lock(), &mut self.requests_seen);
            if set.target_polled && !self.spin.is_zero() {
                self.last_traffic = Some(Instant::now());
            }
            let (polled, returned_ready) = self.sleep(shared, &mut set);
            // A tick with nothing ready also reads the connections armed for the target
            // signal: a signal no application thread took (all block it) waits no longer.
            let tick = matches!(polled, Ok(0));
            if self.realtime.as_mut().is_some_and(|r| r.hogging()) {
                self.realtime = None;
            }
            if let Err(e) = polled {
                log::error!("poll failed: {e}");
                std::thread::sleep(Duration::from_millis(TICK_MS as u64));
            }
            if set.fds[0].revents() != 0 {
                while let Ok(n) = (&shared.wake_rx).read(&mut drain) {
                    if n == 0 {
                        break;
                    }
                }
            }
            if shared.stopped.load(Ordering::SeqCst) {
                break;
            }
            // A panic not caught around one connection (a bug) costs this iteration's work,
            // not the thread: every other connection of the IA is still served.
            let iteration = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.serve(shared, &set, returned_ready, tick)
            }));
            match iteration {
                Ok(true) => self.last_traffic = Some(Instant::now()),
                Ok(false) => {}
                Err(_) => {
                    log::error!("progress thread: panic caught; serving on");
                    shared.engine.lock().panics += 1;
                }
            }
        }
    }

    /// Waits for something in `set` to be ready: spinning first for a spin window after
    /// traffic, not at all if a watched ring is ready already. Returns poll's result and the
    /// returned connections found ready (see `sleep_on_returned`).
    fn sleep(&mut self, shared: &Shared, set: &mut PollSet) -> (io::Result<usize>, Vec<u64>) {
        // Back when the first poll lease ends, to watch what it left to its poller again.
        let tick = Duration::from_millis(TICK_MS as u64);
        let timeout = set.lease_end.map_or(tick, |l| l.min(tick));
        // No spin window while the thread is starved (`Starvation`).
        let spin_until = self
            .last_traffic
            .map(|t| t + self.spin)
            .filter(|_| !self.spin.is_zero() && self.starvation.may_spin(Instant::now()));
        self.follow_starvation();
        let rings_ready = set.rings.begin();
        let mut polled = match spin_until {
            // A signal handler left a connection to the engine's holder (us) while we
            // gathered: look at once.
            _ if rings_ready || shared.sweep_asked() => sys::poll(&mut set.fds, 0),
            // Spinning for a polled target: at the window's end look again whether it still
            // is one, instead of falling asleep.
            Some(until) => {
                let spun = spin_poll(&mut set.fds, until, true);
                self.starvation.spun(until, Instant::now());
                self.follow_starvation();
                match spun {
                    Ok(0) if !set.target_polled => sys::poll_for(&mut set.fds, timeout),
                    other => other,
                }
            }
            _ => sys::poll_for(&mut set.fds, timeout),
        };
        let mut returned_ready = Vec::new();
        if !rings_ready {
            polled = set.sleep_on_returned(shared, polled, timeout, &mut returned_ready);
        }
        set.rings.end(&mut set.fds);
        (polled, returned_ready)
    }

    /// Asks for the time slices the thread's starvation calls for, if it changed.
    fn follow_starvation(&mut self) {
        if let Some(slice) = self.starvation.slice_change() {
            if let Err(e) = sys::set_time_slice(slice) {
                log::debug!("progress thread: time slice {slice:?} not set: {e}");
            }
        }
    }

    /// Serves what `set`'s poll found ready, under the engine lock; whether that was traffic
    /// worth a spin window.
    fn serve(
        &mut self,
        shared: &Shared,
        set: &PollSet,
        mut returned_ready: Vec<u64>,
        tick: bool,
    ) -> bool {
        let buf = &mut self.buf;
        shared.run(|eng, sh| {
            let frames_before = eng.frames_served;
            // Frames read on connections a polling consumer reads too (see below).
            let mut polled_frames = 0;
            let now = Instant::now();
            let mut traffic = false;
            eng.process_connect_results();
            eng.process_ud_connect_results();
            for (fd, target) in set.fds.iter().zip(set.targets.iter()) {
                let rev = fd.revents();
                if rev == 0 {
                    continue;
                }
                match target {
                    Target::Wake => {}
                    Target::Returned => {
                        // The parked sets that hold input, then their connections.
                        let mut sets = std::mem::take(&mut returned_ready);
                        if let Some(epoll) = set.returned.as_ref().filter(|_| sets.is_empty()) {
                            epoll.ready(&mut sets);
                        }
                        let mut ready = Vec::new();
                        eng.parked_ready(&sets, &mut ready);
                        for t in ready {
                            if eng.conns.get(&t).is_some_and(|c| c.parked.is_some()) {
                                eng.read_conn(sh, t, buf);
                            }
                        }
                    }
                    Target::Listener(id) => {
                        traffic = true;
                        eng.accept_incoming(*id)
                    }
                    Target::Conn(t) => {
                        polled_frames += eng.serve_conn_events(sh, *t, rev, now, buf)
                    }
                    Target::Connecting(qp) => {
                        traffic = true;
                        eng.connect_ended(*qp, now, true);
                    }
                    Target::Datagram(qp) => {
                        traffic = true;
                        if rev & (POLLIN | POLLERR) != 0 {
                            eng.read_ud(sh, *qp, buf);
                        }
                        if rev & POLLOUT != 0 {
                            eng.flush_ud(*qp);
                        }
                    }
                }
            }
            eng.expire_connects(now);
            eng.process_connect_results();
            eng.forget_exited_posters();
            if tick || std::mem::take(&mut eng.signal_sweep) {
                let tick_len = Duration::from_millis(TICK_MS as u64);
                let acks_due = sh.take_acks_due() || eng.ack_timer_overdue(tick_len);
                eng.sweep_signalled(sh, buf, acks_due);
            }
            eng.retry_drained(sh);
            eng.settle_failed_writes(sh, buf);
            eng.check_deadlines();
            // Wake-ups requested by our own work are already served by the next iteration.
            eng.wake_needed = false;
            // Spin after serving something only: a socket that woke us but whose frames
            // an application thread read first (it drives or polls it) is no reason to
            // keep a CPU busy; spinning then only takes that CPU from the applications.
            // Nor are frames we happened to read first on a connection a consumer polls
            // for answers (a quiet one): it reads the next ones itself, and a spinning
            // progress thread on the consumer's CPU preempted it about once per read (8 B
            // polled reads over veth, 2 CPUs: ~36,000 preemptions in 40,000 reads). A
            // peer's requests on a connection whose consumer polls with nothing
            // outstanding (a target) are ours to serve: the spin stays for them.
            traffic || eng.frames_served - polled_frames != frames_before
        })
    }
}

impl Engine {
    /// Serves connection `token`, whose socket poll reported `rev`: reads it, writes it.
    /// Returns the frames read if a polling consumer reads the connection too (a quiet one).
    #[inline]
    fn serve_conn_events(
        &mut self,
        sh: &Shared,
        token: u64,
        rev: i16,
        now: Instant,
        buf: &mut [u8],
    ) -> u64 {
        let mut polled_frames = 0;
        if rev & (POLLRDHUP | POLLHUP | POLLERR) != 0 {
            // The peer shut its side or is gone: what it sent before is read whatever is
            // held, then its end is seen.
            if let Some(c) = self.conns.get_mut(&token) {
                c.peer_closing = true;
            }
        }
        if rev & (POLLIN | POLLHUP | POLLERR | POLLNVAL | POLLRDHUP) != 0 {
            let polled = self
                .conns
                .get(&token)
                .is_some_and(|c| c.quiet && c.polled_at(now));
            let before = self.frames_served;
            self.read_conn(sh, token, buf);
            if polled {
                polled_frames = self.frames_served - before;
            }
        }
        if rev & POLLOUT != 0 {
            self.try_write(token);
        }
        polled_frames
    }
}

/// One iteration's poll set, built under the engine lock (`gather`): the wake-up socket at
/// index 0, the set of returned connections at index 1 if there is one, listeners,
/// connections, datagram sockets, then the bells of the rings watched (`RingWatch`).
struct PollSet {
    fds: Vec<PollFd>,
    targets: Vec<Target>,
    rings: RingWatch,
    /// When the first poll lease (or deferral backstop) ends, from now.
    lease_end: Option<Duration>,
    /// An application polls a connection we serve requests on (see `gather`).
    target_polled: bool,
    /// The set of returned connections (`Engine::release_cq_claims`).
    returned: Option<Arc<sys::Epoll>>,
    /// Connections a waiting application thread drives were left out.
    excluding: bool,
    /// A polling consumer reads a connection watched for input over its socket.
    app_polled: bool,
}

impl PollSet {
    /// The poll set of `eng` now; `requests_seen` is the engine's `requests_served` at the
    /// previous look, updated.
    fn gather(shared: &Shared, eng: &mut Engine, requests_seen: &mut u64) -> PollSet {
        let mut set = PollSet {
            fds: vec![PollFd::new(shared.wake_rx.as_raw_fd(), POLLIN)],
            targets: vec![Target::Wake],
            rings: RingWatch::default(),
            lease_end: None,
            target_polled: false,
            returned: eng.returned_set().cloned(),
            excluding: false,
            app_polled: false,
        };
        // At index 1 (see `sleep_on_returned`).
        if let Some(fd) = set.returned.as_ref().map(|s| s.fd()) {
            set.push(fd, POLLIN, Target::Returned);
        }
        let now = Instant::now();
        for (id, l) in &eng.listeners {
            if eng.accept_paused.get(id).is_some_and(|until| *until > now) {
                continue; // out of descriptors: see `accept_incoming`
            }
            set.push(l.sock.as_raw_fd(), POLLIN, Target::Listener(*id));
        }
        // Connections a waiting application thread drives are left out; the first one it
        // gives back wakes us (`release_cq_claims`). Those a polling consumer reads
        // (`TcpCq::progress`) stay in: keeping us off them for a while after each poll
        // (a lease, tried) made an application that polls memory for a peer's RDMA write,
        // not its EVD, wait for the lease to run out (8 B write ping-pong over veth: 170
        // us one-way with a 200 us lease, 16-22 us without). Instead their sockets stay
        // quiet while the consumer has requests outstanding (`settle_quiet`), and on a
        // same-host ring we sleep deferring to the poller (`RingWatch::watch_deferring`).
        let mut to_park = Vec::new();
        for (t, c) in eng.conns.iter_mut() {
            if set.add_conn(*t, c, now, true) {
                to_park.push(*t);
            }
        }
        for t in to_park {
            if !eng.park(t) {
                if let Some(c) = eng.conns.get_mut(&t) {
                    set.add_conn(t, c, now, false);
                }
            }
        }
        let (connects, first_limit) = eng.connects_to_watch(now);
        for (qp, fd) in connects {
            set.push(fd, POLLOUT, Target::Connecting(qp));
        }
        if let Some(left) = first_limit {
            set.lease_ends(left);
        }
        for (qp, fd, output) in eng.ud_sockets() {
            let ev = if output { POLLIN | POLLOUT } else { POLLIN };
            set.push(fd, ev, Target::Datagram(qp));
        }
        eng.poll_excludes = set.excluding;
        set.rings.add_bells(&mut set.fds);
        // A polled target: an application polls a connection with nothing of its own
        // outstanding there (so its socket is not quiet) while the peer's reads, writes
        // or atomics keep coming, and its looks serve them. Asleep, we would be woken by
        // each of them for nothing, and on a VM a wake-up across CPUs is dear: over veth,
        // the target's process on one CPU, polled 8 B reads took 20-23 us with this
        // thread asleep, 10-11 us with it spinning (docs/performance.md, "What makes it fast").
        // So we spin (yielding) meanwhile, and look again each spin window.
        set.target_polled = set.app_polled && eng.requests_served != *requests_seen;
        *requests_seen = eng.requests_served;
        set
    }

    #[inline]
    fn push(&mut self, fd: std::os::fd::RawFd, events: i16, target: Target) {
        self.fds.push(PollFd::new(fd, events));
        self.targets.push(target);
    }

    /// The first lease ends no later than `left` from now.
    #[inline]
    fn lease_ends(&mut self, left: Duration) {
        self.lease_end = Some(self.lease_end.map_or(left, |l| l.min(left)));
    }

    /// Adds connection `t` (`c`) with what it waits for, if anything.
    /// Returns true, having added nothing, if it is to be parked instead (`may_park`:
    /// `Engine::park`, after the walk).
    #[inline]
    fn add_conn(&mut self, t: u64, c: &mut Conn, now: Instant, may_park: bool) -> bool {
        // A poller that stopped looking leaves its socket quiet no longer; until then
        // we look again when its lease ends.
        if c.quiet {
            match c.lease_left(QUIET_LEASE, now) {
                Some(left) => self.lease_ends(left),
                None => c.set_quiet(false),
            }
        }
        if c.driven.is_some() {
            self.excluding = true;
            return false;
        }
        // Watched in the set of returned connections, while that is enough (it
        // watches for input only). An idle connection goes there too (`parks`), so
        // that the poll set holds the connections with something under way and a
        // wake-up costs what they cost, not what the connections of the IA cost.
        let parks = c.parkable(now) && (c.quiet || !c.polled_at(now));
        if c.parked.is_some() {
            if parks {
                return false; // in its parked set (held by a driver or watched by us)
            }
            c.parked = None;
        }
        if parks && may_park {
            return true;
        }
        let mut ev = 0;
        // A poller that stopped looking gets the target signal back (../sigio.rs).
        if c.signalled && !c.armed && c.driven.is_none() {
            match c.lease_left(QUIET_LEASE, now) {
                Some(left) => self.lease_ends(left),
                None => c.set_armed(true),
            }
        }
        if c.wants_input() && c.armed {
            // Its input raises the target signal (../sigio.rs); only its end is ours to see.
            ev |= POLLRDHUP;
        } else if c.wants_input() {
            ev |= POLLIN;
        } else if c.watch_for_end() {
            // Held back: only its peer's end is looked for (see `peer_ended`).
            ev |= POLLRDHUP;
        }
        // Output for the peer's same-host ring waits for room there, not in the socket
        // (the reader's doorbell says when there is room again).
        let output = c.output_due() && !c.write_failed && !c.draining;
        let ring_out = c.same_host.writing_ring().filter(|_| output);
        if output && ring_out.is_none() {
            ev |= POLLOUT;
        }
        if ev == 0 && ring_out.is_none() {
            // Back-pressured and nothing to send: leave it out entirely, since poll
            // reports hang-ups even for no events and we would spin on them.
            return false;
        }
        // Our ring from when we offered it, switched to or not (see `Claim::ring`).
        if let Some(ring) = c.same_host.incoming.as_ref().filter(|_| ev & POLLIN != 0) {
            // Only a ring the peer switched to is its poller's (before, the poller
            // reads the socket; a peer that cannot attach, from another PID
            // namespace, never switches).
            if c.polled_at(now) && c.same_host.reading_ring().is_some() {
                // Left to its poller: the writer wakes us once the poller stopped,
                // except for a frame that came just before (see `DEFER_BACKSTOP`).
                self.rings.watch_deferring(self.fds.len(), ring);
                self.lease_ends(DEFER_BACKSTOP);
            } else {
                self.rings.watch_input(self.fds.len(), ring);
            }
        }
        if let Some(ring) = ring_out {
            self.rings.watch_output(self.fds.len(), ring);
        }
        self.app_polled |= ev & POLLIN != 0
            && !c.quiet
            && c.polled_at(now)
            && c.same_host.reading_ring().is_none();
        self.push(c.stream.as_raw_fd(), ev, Target::Conn(t));
        false
    }

    /// Woken by the set of returned connections alone, which holds nothing to read by the
    /// time we look: an answer came between a wait's end and the next wait, which took the
    /// connection back and read it. Asleep again at once, without the engine (whose holder
    /// is that waiter: we would spin for it on its CPU) and without rebuilding the set.
    /// What the look finds is left in `returned_ready`, read by `serve`, not asked of the
    /// set again. Returns poll's result after the last sleep.
    fn sleep_on_returned(
        &mut self,
        shared: &Shared,
        mut polled: io::Result<usize>,
        timeout: Duration,
        returned_ready: &mut Vec<u64>,
    ) -> io::Result<usize> {
        let Some(epoll) = self.returned.as_ref() else {
            return polled;
        };
        let slept = Instant::now();
        // Bounded, should the set's descriptor and its contents ever disagree for good
        // (they should not: both ask each socket): then the full iteration runs.
        let mut looks = 0;
        while looks < 64
            && matches!(polled, Ok(n) if n > 0)
            && self.fds[1].revents() != 0
            && self
                .fds
                .iter()
                .enumerate()
                .all(|(i, f)| i == 1 || f.revents() == 0)
            && {
                epoll.ready(returned_ready);
                returned_ready.is_empty()
            }
            && !shared.stopped.load(Ordering::SeqCst)
        {
            looks += 1;
            let left = timeout.saturating_sub(slept.elapsed());
            if left.is_zero() {
                return Ok(0);
            }
            polled = sys::poll_for(&mut self.fds, left);
        }
        polled
    }
}

// ---- scheduling ------------------------------------------------------------------------------

/// Environment variable: how progress threads are scheduled: `normal` (the default) or
/// `realtime` (SCHED_FIFO at the lowest real-time priority, where the process may: root,
/// CAP_SYS_NICE, or an RLIMIT_RTPRIO of 1 or more).
///
/// Why: an application that spins on its memory for a peer's RDMA write or send, with no DAT
/// call and no sched_yield, holds its CPU; on a machine whose CPUs all run such spinners, the
/// progress thread that must place the peer's data is woken but not run until a spinner's
/// time slice ends: 2-4 ms a message here (docs/performance.md, "What limits it"). A real-time
/// progress thread preempts the spinner at once (30-45 us one-way over loopback here). It is
/// not the default because it also preempts applications that poll or wait for what they
/// would read themselves: the ordinary latencies over TCP about doubled. No spin window for
/// it (a real-time thread's sched_yield lets no ordinary thread run), and a watchdog (see
/// `Realtime::hogging`). On the same host, sends and RDMA writes need no progress thread.
pub(crate) const PRIORITY_ENV: &str = "DAPLRS_PROGRESS_PRIORITY";

/// A progress thread running SCHED_FIFO, and what its watchdog keeps of it.
struct Realtime {
    blocked: u64,
    since: Instant,
}

/// A real-time progress thread that has not blocked for this long is made ordinary again:
/// a bug that kept it busy would otherwise starve every ordinary thread of its CPU.
const REALTIME_HOG: Duration = Duration::from_millis(200);

impl Realtime {
    /// Makes the calling thread real-time if DAPLRS_PROGRESS_PRIORITY asks for it and the
    /// kernel lets it; None otherwise (said in the log).
    fn start() -> Option<Realtime> {
        match std::env::var(PRIORITY_ENV).as_deref().map(str::trim) {
            Err(_) | Ok("") | Ok("normal") => return None,
            Ok("realtime") => {}
            Ok(other) => {
                log::warn!("{PRIORITY_ENV}={other:?}: not normal|realtime; using normal");
                return None;
            }
        }
        match sys::set_realtime(true) {
            Ok(()) => {
                log::info!("progress thread: SCHED_FIFO ({PRIORITY_ENV}=realtime)");
                Some(Realtime {
                    blocked: sys::times_blocked(),
                    since: Instant::now(),
                })
            }
            Err(e) => {
                log::warn!("{PRIORITY_ENV}=realtime: {e}; the progress thread stays ordinary");
                None
            }
        }
    }

    /// Whether the thread has run REALTIME_HOG without blocking once; if so it is ordinary
    /// again (said in the log).
    fn hogging(&mut self) -> bool {
        let blocked = sys::times_blocked();
        if blocked != self.blocked {
            self.blocked = blocked;
            self.since = Instant::now();
            return false;
        }
        if self.since.elapsed() < REALTIME_HOG {
            return false;
        }
        let _ = sys::set_realtime(false);
        log::error!(
            "progress thread: busy {REALTIME_HOG:?} without blocking as a real-time thread; \
             ordinary from now on"
        );
        true
    }
}

/// Whether the progress thread is starved: the threads it shares the CPUs with do not give
/// them back (programs that spin on their memory without `sched_yield`, as many as CPUs).
/// Seen when spin windows lose their CPU for long (`LOST_CPU`), `LOST_TO_STARVE` in a row;
/// then, for a spell, the thread does not spin and asks for short time slices; at its end one
/// spin looks again, and each spell that ends with the CPUs still held is followed by one
/// twice as long (so that the looks, a few milliseconds each, cost spinners little).
///
/// Why: a spin window (and each `sched_yield` in it) spends the thread's claim on a CPU, and
/// the kernel then lets the woken thread wait for a running one's slice to end: when every
/// CPU runs a program that spins on its memory for a peer's RDMA write, with no DAT call, the
/// frame that carries that write waited for the scheduler's tick, 2 ms a message on average
/// here (4 ms ticks). Without the window, and with slices shorter than the spinner's (Linux
/// 6.12 and later: EEVDF lets a woken thread with a shorter slice go first), the woken thread
/// preempts the spinner: 70-85 us one-way over loopback TCP, 2 CPUs (without the short slice
/// 47-1,890 us, erratic). Neither is kept for programs that poll or yield: there the window
/// spares a wake-up a message, and short slices made the woken thread preempt the poller
/// that would have read the frame itself (8 B polled writes 65-71 us against 32-40).
#[derive(Default)]
struct Starvation {
    /// Starved until then: no spin window, short slices.
    until: Option<Instant>,
    /// Spins in a row that lost their CPU.
    lost_in_a_row: u32,
    /// How long the next starved spell lasts.
    spell: Duration,
    /// The thread asked for short slices (`slice_change`).
    short_slices: bool,
}

/// A spin that ended this long after its window lost its CPU to a thread that kept it. Over
/// loopback TCP, 2 CPUs, the spins of a progress thread whose CPUs spinners held ended 1 to
/// over 4 ms late (4,373 of 4,507); those of ping-pongs that poll or block, 11 to 17 in
/// 2,100-2,500 more than 250 us late.
const LOST_CPU: Duration = Duration::from_micros(500);
/// How many spins in a row must lose their CPU for the thread to be starved: with two, the
/// polling and blocking ping-pongs above were starved 2 to 5 times a run (their setup), and
/// their writes took twice as long.
const LOST_TO_STARVE: u32 = 3;
/// How long the thread stays starved: the first spell, and the longest, each spell twice as
/// long as the one before while every look at its end finds the CPUs held still.
const FIRST_SPELL: Duration = Duration::from_millis(10);
const LONGEST_SPELL: Duration = Duration::from_secs(1);
/// The time slice a starved progress thread asks for.
const STARVED_SLICE: Duration = Duration::from_micros(100);

impl Starvation {
    /// Whether the thread is starved now.
    fn starved(&self) -> bool {
        self.until.is_some()
    }

    /// The time slice to ask for (zero: the kernel's default), if it is not the one asked
    /// for last: short while starved.
    fn slice_change(&mut self) -> Option<Duration> {
        let starved = self.starved();
        (starved != self.short_slices).then(|| {
            self.short_slices = starved;
            match starved {
                true => STARVED_SLICE,
                false => Duration::ZERO,
            }
        })
    }

    /// Whether a spin window is worth its CPU at `now` (the starved spell, if any, ends:
    /// that spin looks whether the spinners still hold the CPUs).
    fn may_spin(&mut self, now: Instant) -> bool {
        match self.until {
            Some(until) if now < until => false,
            Some(_) => {
                self.until = None;
                true
            }
            None => true,
        }
    }

    /// After a spin whose window ended at `window_end`, at `now`.
    fn spun(&mut self, window_end: Instant, now: Instant) {
        if now <= window_end + LOST_CPU {
            self.lost_in_a_row = 0;
            self.spell = FIRST_SPELL;
            return;
        }
        self.lost_in_a_row += 1;
        if self.lost_in_a_row >= LOST_TO_STARVE {
            self.spell = self.spell.clamp(FIRST_SPELL, LONGEST_SPELL);
            self.until = Some(now + self.spell);
            self.spell = (self.spell * 2).min(LONGEST_SPELL);
        }
    }
}

// ---- polling consumers -----------------------------------------------------------------------

/// How long the progress thread sleeps at most while it defers a same-host ring to a polling
/// consumer (`RingWatch::watch_deferring`): the peer's writer wakes it once the consumer has
/// not looked for `POLL_LEASE`, but a frame written within a lease of the consumer's last
/// look, after which the consumer stopped for good, waits for this. Long next to a lease, so
/// that a consumer polling in a loop costs this thread 1,000 wake-ups a second, not 10,000
/// (each of which takes a CPU from a spinner); only such a frame ever waits this long, and
/// only for work no application call asked for (a read or atomic the peer's target must
/// serve): a consumer that waits, or polls again, reads it at once.
const DEFER_BACKSTOP: Duration = Duration::from_millis(1);

/// How long after a polling consumer's last look a TCP socket may stay quiet (see
/// `Engine::settle_quiet`): the progress thread, which then sees no small frame on it, lowers
/// the mark again when this ends. Long next to a look (a consumer polling in a loop renews it
/// thousands of times). It bounds the delay of a peer's request when a consumer stops polling
/// with requests of its own still outstanding, together with the progress thread's sleep: one
/// that fell asleep before the socket turned quiet looks at it again at its next wake-up, at
/// the latest its tick (`TICK_MS`); waking it at each raise would cost a wake-up per request.
const QUIET_LEASE: Duration = Duration::from_millis(2);

/// The receive low-water mark of a quiet socket: frames shorter than this (an 8 B read's
/// answer, an ACK) wake no poller; longer ones do. At most a quarter of the socket's receive
/// buffer: Linux grows the buffer, and clamps the window, for a mark above half of it.
const QUIET_LOW_WATER: i32 = 16 << 10;

impl Engine {
    /// A polling consumer reads connection `token` now and will again soon: it reads what
    /// arrives itself, so the target signal is off until it finds a completion
    /// (`rearm_for_cq`) or stops looking (`PollSet::add_conn`). Whether it was on.
    pub(crate) fn note_poller(&mut self, token: u64) -> bool {
        let Some(c) = self.conns.get_mut(&token) else {
            return false;
        };
        let armed = c.armed;
        c.set_armed(false);
        c.last_look = Some(Instant::now());
        if let Some(ring) = c.same_host.incoming.as_ref() {
            ring.note_poller();
        }
        armed
    }

    /// The consumer of CQ `cq` found a completion: it may go back to spinning on its memory
    /// (or do anything but look), so its connections get their target signal back.
    pub(crate) fn rearm_for_cq(&mut self, cq: u64) {
        for token in self.pollable_for_cq(cq) {
            if let Some(c) = self.conns.get_mut(&token).filter(|c| c.driven.is_none()) {
                c.set_armed(true);
            }
        }
    }

    /// After a polling consumer's look at TCP connection `token`: while its QP has requests
    /// outstanding, the consumer reads their answers itself, and the progress thread, which
    /// polls the same socket, would be woken by each for nothing; on a machine with as many
    /// busy threads as CPUs that wake-up takes the CPU from the consumer or from the peer.
    /// The socket's receive low-water mark is raised meanwhile (SO_RCVLOWAT): the kernel then
    /// wakes no poller for a small frame. It is lowered when nothing is outstanding (an
    /// application that polls its memory for the peer's RDMA write, not its EVD, needs the
    /// progress thread to see that write at once), when a driver claims the connection (it
    /// sleeps in poll), and by the progress thread when the consumer's `QUIET_LEASE` ends.
    /// Lowering it wakes a poller at once if frames came meanwhile.
    /// Returns whether the socket is quiet now.
    pub(crate) fn settle_quiet(&mut self, token: u64) -> bool {
        let Some(c) = self.conns.get(&token) else {
            return false;
        };
        let busy = match c.phase {
            // A quiet socket raises no target signal either (../sigio.rs).
            Phase::Established { qp } if c.same_host.reading_ring().is_none() && !c.armed => {
                self.qps.get(&qp).is_some_and(|e| !e.outstanding.is_empty())
            }
            _ => false,
        };
        let Some(c) = self.conns.get_mut(&token) else {
            return false;
        };
        c.set_quiet(busy);
        c.quiet
    }
}

impl Conn {
    /// What is left at `now` of a `lease` from a polling consumer's last look, if any.
    fn lease_left(&self, lease: Duration, now: Instant) -> Option<Duration> {
        self.last_look
            .and_then(|at| (at + lease).checked_duration_since(now))
    }

    /// Whether a polling consumer looked at this connection within `POLL_LEASE` of `now`.
    fn polled_at(&self, now: Instant) -> bool {
        self.last_look.is_some_and(|at| now < at + POLL_LEASE)
    }

    /// Raises (`quiet`) or lowers the socket's receive low-water mark (see `settle_quiet`).
    /// A failure leaves the mark as it was: the socket then only wakes its pollers as usual.
    pub(super) fn set_quiet(&mut self, quiet: bool) {
        if quiet == self.quiet {
            return;
        }
        let fd = self.stream.as_raw_fd();
        let mark = if quiet {
            if self.rcvbuf == 0 {
                self.rcvbuf = sys::int_option(fd, libc::SOL_SOCKET, libc::SO_RCVBUF).unwrap_or(-1);
            }
            let mark = QUIET_LOW_WATER.min(self.rcvbuf / 4);
            if mark < 2 {
                return; // a buffer too small (or unknown) to raise the mark safely
            }
            mark
        } else {
            1
        };
        if sys::set_int_option(fd, libc::SOL_SOCKET, libc::SO_RCVLOWAT, mark).is_ok() {
            self.quiet = quiet;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spins that lose their CPU three times in a row starve the thread for a spell that
    /// doubles while the CPUs stay held, up to a second; one spin that keeps its CPU ends it.
    #[test]
    fn spins_that_lose_their_cpu_starve_the_progress_thread() {
        let mut s = Starvation::default();
        let t0 = Instant::now();
        let late = |end: Instant| end + LOST_CPU + Duration::from_micros(1);
        // Two late spins, one on time: not starved (the count starts again).
        s.spun(t0, late(t0));
        s.spun(t0, late(t0));
        s.spun(t0, t0 + LOST_CPU);
        s.spun(t0, late(t0));
        s.spun(t0, late(t0));
        assert!(!s.starved() && s.may_spin(t0));
        // The third late one in a row: starved for FIRST_SPELL.
        let now = late(t0);
        assert_eq!(s.slice_change(), None);
        s.spun(t0, now);
        assert!(s.starved() && !s.may_spin(now + FIRST_SPELL / 2));
        assert_eq!(s.slice_change(), Some(STARVED_SLICE));
        assert_eq!(s.slice_change(), None);
        // The spell ends: one spin looks; late again, the next spell is twice as long.
        let end = now + FIRST_SPELL;
        assert!(s.may_spin(end) && !s.starved());
        assert_eq!(s.slice_change(), Some(Duration::ZERO));
        s.spun(end, late(end));
        assert!(!s.may_spin(late(end) + FIRST_SPELL));
        assert!(s.may_spin(late(end) + FIRST_SPELL * 2));
        // Spells stop growing at LONGEST_SPELL.
        let mut at = late(end) + FIRST_SPELL * 2;
        for _ in 0..20 {
            s.spun(at, late(at));
            at = late(at) + LONGEST_SPELL;
            assert!(s.may_spin(at));
        }
        // A spin that keeps its CPU: the next starvation needs three late ones again, and
        // starts with the first spell.
        s.spun(at, at);
        s.spun(at, late(at));
        s.spun(at, late(at));
        assert!(!s.starved());
        s.spun(at, late(at));
        assert!(s.starved() && s.may_spin(late(at) + FIRST_SPELL));
    }
}
