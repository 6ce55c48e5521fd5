//! The completion queue (`TcpCq`): the backend's trait object over the completions the
//! engine queues (completions.rs), and the waiting or polling application thread that
//! drives its own connections (`drive`, `progress`) through the device's `Shared`.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use parking_lot::Mutex;

use daplrs_backend::{CompletionQueue, NotifyFn, Result, WorkCompletion};

use crate::completions::Completions;
use crate::poll_wait::{self, RingWatch};
use crate::shared::Shared;
use crate::sys;

pub(crate) struct TcpCq {
    /// What the engine queues into and `Shared` notifies (completions.rs).
    completions: Arc<Completions>,
    depth: AtomicU32,
    shared: Weak<Shared>,
    /// The driver's (or poller's) read buffer.
    buf: Mutex<Vec<u8>>,
    /// The poller's lists, taken with `buf`.
    looks: Mutex<Looks>,
    /// Drives in a row whose spin window ended with nothing to read (see `drive`).
    spin_misses: AtomicU32,
    /// Connections stay claimed between the drives of one wait (see `end_drive`).
    keeps_claims: AtomicBool,
    /// A poller's look turned the target signal of a connection off (sigio.rs): the next
    /// completion found turns it on again (`rearm`).
    disarmed: AtomicBool,
}

/// A polling consumer's lists (`TcpCq::progress`).
#[derive(Default)]
struct Looks {
    /// The connections this look reads.
    ready: Vec<u64>,
    /// Those the last look left quiet, whose small frames no poller is told of: read each look.
    quiet: Vec<u64>,
}

/// Read buffer of a driving application thread (large payloads are read past it, straight
/// into their frames).
const DRIVE_BUF: usize = 64 * 1024;
/// Longest single wait of a driver, so that it looks at its EVD, and claims connections
/// established since, regularly.
const DRIVE_MAX_MS: u64 = 50;
/// A driver stops spinning after this many spins in a row that found nothing (the traffic is
/// slower than the spin window: spinning only burns a CPU), and tries again every
/// `SPIN_RETRY`-th drive (a power of two).
const SPIN_GIVE_UP: u32 = 8;
const SPIN_RETRY: u32 = 64;

impl TcpCq {
    /// A CQ of `depth` completions over `completions` (which the device's `Shared` finds by
    /// id), of the device whose state is `shared`.
    pub(crate) fn new(completions: Arc<Completions>, depth: u32, shared: Weak<Shared>) -> TcpCq {
        TcpCq {
            completions,
            depth: AtomicU32::new(depth),
            shared,
            buf: Mutex::new(Vec::new()),
            looks: Mutex::new(Looks::default()),
            spin_misses: AtomicU32::new(0),
            keeps_claims: AtomicBool::new(false),
            disarmed: AtomicBool::new(false),
        }
    }

    /// A consumer that polled found a completion: its connections get their target signal
    /// back (`Engine::rearm_for_cq`) before it goes back to spinning on its memory.
    fn rearm(&self) {
        let Some(sh) = self.shared.upgrade() else {
            return;
        };
        // No `run`: what it delivers could call back into the consumer's EVD, which polls.
        self.disarmed.store(false, Ordering::Relaxed);
        sh.engine.lock().rearm_for_cq(self.completions.id);
        if sh.sweep_asked() {
            sh.wake(); // a signal handler came meanwhile: left to the progress thread
        }
    }
}

impl CompletionQueue for TcpCq {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn id(&self) -> u64 {
        self.completions.id
    }
    fn poll(&self, max: usize, out: &mut Vec<WorkCompletion>) -> usize {
        let n = self.completions.take(max, out);
        if n > 0 && self.disarmed.load(Ordering::Relaxed) {
            self.rearm();
        }
        n
    }
    fn set_notify(&self, notify: Option<NotifyFn>) {
        self.completions.set_notify(notify);
    }
    fn resize(&self, depth: u32) -> Result<()> {
        self.depth.store(depth, Ordering::SeqCst);
        Ok(())
    }
    fn depth(&self) -> u32 {
        self.depth.load(Ordering::SeqCst)
    }

    /// The waiting application thread claims the connections of this CQ's QPs from the
    /// progress thread (which leaves them out of its poll set meanwhile), polls them itself
    /// and runs the engine on what arrives; the completions it produces are delivered on this
    /// thread, so the waiter needs no wake-up. The claim lasts the whole wait: the next drive
    /// of the same wait keeps it, and `end_drive` ends it. (Ending it at each drive's return,
    /// as before, woke the progress thread each time, to poll a set the waiter's next drive
    /// made stale again at once: on a target whose application waits, one wake-up per request
    /// served, and the progress thread then took the CPU of the peer polling for the answer.)
    fn drive(&self, deadline: Option<Instant>) -> bool {
        let Some(sh) = self.shared.upgrade() else {
            return false;
        };
        if sh.stopped.load(Ordering::SeqCst) {
            return false;
        }
        let Some((_, wake_rx)) = self.completions.waker() else {
            return false;
        };
        let (claimed, sets) = sh.run(|eng, _| eng.claim_for_cq(&self.completions));
        if claimed.is_empty() && sets.is_empty() {
            return false;
        }
        self.completions
            .set_driver(Some(std::thread::current().id()));
        let ms = match deadline {
            None => DRIVE_MAX_MS,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                (left.as_micros().div_ceil(1000) as u64).min(DRIVE_MAX_MS)
            }
        };
        // The waker, the claimed connections, the parked sets, then the rings' bells.
        let mut fds = Vec::with_capacity(claimed.len() + sets.len() + 1);
        let mut rings = RingWatch::default();
        fds.push(sys::PollFd::new(wake_rx.as_raw_fd(), sys::POLLIN));
        for c in &claimed {
            let input = if c.input { sys::POLLIN } else { 0 };
            let output = if c.output && c.ring_out.is_none() {
                sys::POLLOUT
            } else {
                0
            };
            if let Some(ring) = c.ring.as_ref().filter(|_| c.input) {
                rings.watch_input(fds.len(), ring);
            }
            if let Some(ring) = c.ring_out.as_ref().filter(|_| c.output) {
                rings.watch_output(fds.len(), ring);
            }
            fds.push(sys::PollFd::new(c.fd, input | output));
        }
        for set in &sets {
            if let Some(fd) = set.readiness.parked_fd() {
                fds.push(sys::PollFd::new(fd, sys::POLLIN));
            }
        }
        rings.add_bells(&mut fds);
        // Spin first when spinning has paid lately: an answer a round trip away is then read
        // without this thread going to sleep and being woken for it.
        let spin = poll_wait::spin_window();
        let misses = self.spin_misses.load(Ordering::Relaxed);
        let spin_now = !spin.is_zero() && (misses < SPIN_GIVE_UP || misses & (SPIN_RETRY - 1) == 0);
        let mut polled = Ok(0);
        let ready = rings.begin();
        if ready {
            polled = sys::poll(&mut fds, 0);
        } else if spin_now {
            let until = Instant::now() + spin;
            let until = deadline.map_or(until, |d| d.min(until));
            polled = poll_wait::spin_poll(&mut fds, until, false);
        }
        let caught = ready || matches!(polled, Ok(n) if n > 0);
        let misses = if caught { 0 } else { misses.saturating_add(1) };
        self.spin_misses.store(misses, Ordering::Relaxed);
        if !caught {
            polled = sys::poll(&mut fds, ms as i32);
        }
        rings.end(&mut fds);
        if let Err(e) = polled {
            log::error!("poll failed: {e}");
        }
        if fds[0].revents() != 0 {
            let mut drain = [0u8; 64];
            while let Ok(n) = (&*wake_rx).read(&mut drain) {
                if n == 0 {
                    break;
                }
            }
        }
        let mut buf = self.buf.lock();
        if buf.len() < DRIVE_BUF {
            buf.resize(DRIVE_BUF, 0);
        }
        sh.run(|eng, sh| {
            for (c, fd) in claimed.iter().zip(fds.iter().skip(1)) {
                let rev = fd.revents();
                if rev & (sys::POLLIN | sys::POLLHUP | sys::POLLERR | sys::POLLNVAL) != 0 {
                    eng.read_conn(sh, c.token, &mut buf);
                }
                if rev & sys::POLLOUT != 0 {
                    eng.try_write(c.token);
                }
            }
            let parked_fds = fds.iter().skip(1 + claimed.len());
            let mut ready = Vec::new();
            for (set, fd) in sets.iter().zip(parked_fds) {
                if fd.revents() != 0 {
                    set.readiness.parked_ready(&mut ready);
                }
            }
            for token in ready {
                if eng.parked(token) {
                    eng.read_conn(sh, token, &mut buf);
                }
            }
            eng.retry_drained(sh);
            eng.settle_failed_writes(sh, &mut buf);
            // The claims stay until the wait ends (`end_drive`).
            self.keeps_claims.store(true, Ordering::Relaxed);
        });
        self.completions.set_driver(None);
        true
    }

    /// The wait that drove ends: the connections its drives claimed go back to the progress
    /// thread (see `Engine::release_cq_claims`).
    fn end_drive(&self) {
        if !self.keeps_claims.swap(false, Ordering::Relaxed) {
            return;
        }
        if let Some(sh) = self.shared.upgrade() {
            sh.run(|eng, _| eng.release_cq_claims(self.completions.id));
        }
    }

    /// A polling consumer's look at its connections: reads, on this thread and without
    /// waiting, those that hold something (readiness.rs: the kernel's word for sockets, a load
    /// for same-host rings) and those it left quiet; the engine is not taken when none does.
    /// The progress thread still watches them (see `PollSet::gather` in engine/progress.rs).
    /// Skipped, not waited for, when another thread holds the engine.
    fn progress(&self) -> bool {
        let Some(sh) = self.shared.upgrade() else {
            return false;
        };
        if sh.stopped.load(Ordering::SeqCst) {
            return false;
        }
        let Some(mut buf) = self.buf.try_lock() else {
            return false; // another thread of this CQ is at it
        };
        let mut looks = self.looks.lock();
        let Looks { ready, quiet } = &mut *looks;
        ready.clear();
        let readiness = &self.completions.readiness;
        let scan_all = readiness.scan_all();
        // Rings marked on the device's board (any CQ's: a look reads what it takes).
        let board = sh.samehost.board().filter(|b| !scan_all && b.marked());
        if !scan_all {
            readiness.ready(ready);
            ready.extend_from_slice(quiet);
            if ready.is_empty() && board.is_none() {
                return false;
            }
        }
        if buf.len() < DRIVE_BUF {
            buf.resize(DRIVE_BUF, 0);
        }
        sh.try_run(|eng, sh| {
            if scan_all {
                *ready = eng.pollable_for_cq(self.completions.id);
            } else {
                if let Some(b) = board {
                    b.take(ready);
                }
                ready.sort_unstable();
                ready.dedup();
            }
            quiet.clear();
            let mut looked = false;
            for &token in ready.iter() {
                if !eng.pollable(token) {
                    continue;
                }
                looked = true;
                if eng.note_poller(token) {
                    self.disarmed.store(true, Ordering::Relaxed);
                }
                eng.look_at_conn(sh, token, &mut buf);
                eng.try_write(token);
                if eng.settle_quiet(token) {
                    quiet.push(token);
                }
            }
            eng.retry_drained(sh);
            eng.settle_failed_writes(sh, &mut buf);
            looked
        })
        .unwrap_or(false)
    }

    fn interrupt(&self) {
        self.completions.interrupt();
    }
}
