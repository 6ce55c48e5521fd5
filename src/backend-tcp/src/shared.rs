//! The IA's shared state (`Shared`): the engine behind its lock, the key registry, the
//! objects the engine reaches by id, and the delivery of what a turn on the engine produced
//! (completions, connection events) once the lock is released.

use std::collections::VecDeque;
use std::io::Write;
use std::net::Ipv4Addr;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use daplrs_backend::intmap::IntMap;
use daplrs_backend::{CmEvent, CmHandler, CompletionQueue, DeviceAttr, Error, Result};

use crate::completions::Completions;
use crate::engine::{Deferred, Engine};
use crate::keys::Keys;
use crate::read_mostly::ReadMostly;
use crate::receives::SharedReceives;
use crate::window::Window;
use crate::{samehost, sigio, wire, MAX_MESSAGE};

pub(crate) struct Shared {
    pub(crate) name: String,
    pub(crate) addr: Ipv4Addr,
    pub(crate) attr: DeviceAttr,
    pub(crate) engine: Mutex<Engine>,
    /// Read by every copy into or out of registered memory, written by registrations.
    pub(crate) keys: ReadMostly<Keys>,
    wake_tx: UnixStream,
    pub(crate) wake_rx: UnixStream,
    pub(crate) cm_handler: Mutex<Option<CmHandler>>,
    /// Connection events in the order the engine made them, for `deliver_cm`.
    cm_events: Mutex<VecDeque<CmEvent>>,
    /// Held by the one thread handing connection events to the handler.
    cm_turn: Mutex<()>,
    /// The CQs' completions by CQ id, so a QP can reach its CQs and a driver be interrupted.
    pub(crate) cqs: Mutex<IntMap<u64, Weak<Completions>>>,
    /// The SRQs' receives by SRQ id, so a QP can reach its SRQ.
    pub(crate) srqs: Mutex<IntMap<u64, Weak<SharedReceives>>>,
    /// Memory windows by key index, so a bind work request can reach its window.
    pub(crate) mws: Mutex<IntMap<u32, Weak<Window>>>,
    next_id: AtomicU64,
    pub(crate) limits: wire::Limits,
    pub(crate) stopped: AtomicBool,
    /// A signal handler found the engine busy: the progress thread reads the connections
    /// armed for the target signal (sigio.rs).
    signal_sweep: AtomicBool,
    /// The ACK timer fired while the engine was held: the held ACKs are due (sigio.rs).
    acks_due: AtomicBool,
    /// Datagrams dropped on arrival for lack of a posted receive (`Device::ud_dropped`).
    pub(crate) ud_dropped: AtomicU64,
    /// The same-host path: our published key table, mode and counters (samehost/).
    pub(crate) samehost: samehost::Local,
    /// The arena each memory region's memory lies in (samehost/arena.rs), by region key:
    /// held while the region is registered; its pages move back to private memory with the
    /// last registration in it. Held while a region's pages move in (`promote`), so that a
    /// deregistration meanwhile waits and still returns with the memory as it was.
    pub(crate) arenas: Mutex<IntMap<u32, Arc<samehost::arena::Arena>>>,
}

thread_local! {
    /// The list of deferred work a thread last delivered, empty, for its next turn on the
    /// engine (`Shared::take_deferred` leaves it there): the common turn, one completion,
    /// then allocates nothing.
    static SPARE_DEFERRED: std::cell::Cell<Vec<Deferred>> =
        const { std::cell::Cell::new(Vec::new()) };
}

/// A spare list with more room than this is dropped rather than kept.
const SPARE_DEFERRED_MAX: usize = 64;

impl Shared {
    /// The state of a device opened for `target` (see `TcpDevice::open`): `wake` is the pair
    /// that wakes its progress thread.
    pub(crate) fn new(
        target: &str,
        addr: Ipv4Addr,
        attr: DeviceAttr,
        (wake_tx, wake_rx): (UnixStream, UnixStream),
        samehost: samehost::Local,
    ) -> Arc<Shared> {
        let shared = Arc::new(Shared {
            name: format!("tcp:{target}"),
            addr,
            attr,
            engine: Mutex::new(Engine::new(samehost.supported())),
            keys: ReadMostly::new(Keys::published_in(samehost.publisher())),
            wake_tx,
            wake_rx,
            cm_handler: Mutex::new(None),
            cm_events: Mutex::new(VecDeque::new()),
            cm_turn: Mutex::new(()),
            cqs: Mutex::new(IntMap::default()),
            srqs: Mutex::new(IntMap::default()),
            mws: Mutex::new(IntMap::default()),
            next_id: AtomicU64::new(1),
            limits: wire::Limits {
                max_message: MAX_MESSAGE,
            },
            stopped: AtomicBool::new(false),
            signal_sweep: AtomicBool::new(false),
            acks_due: AtomicBool::new(false),
            ud_dropped: AtomicU64::new(0),
            samehost,
            arenas: Mutex::new(IntMap::default()),
        });
        let weak = Arc::downgrade(&shared);
        shared.samehost.set_promoter(Box::new(move |keys| {
            if let Some(shared) = weak.upgrade() {
                shared.promote(keys);
            }
        }));
        shared
    }

    /// Maps the memory of regions same-host peers asked for into arenas (samehost/arena.rs),
    /// so that their copies become plain memory copies: `keys` are the peers' requests (a
    /// region's key, or a window's, whose region is meant), checked here. Runs on the
    /// same-host keeper thread. The pages move under the table's mutex (no peer copies
    /// meanwhile) and under `arenas` (a deregistration waits for the move, then finds the
    /// arena and moves the pages back before it returns).
    fn promote(&self, keys: &[u32]) {
        for &key in keys {
            let region = {
                let keys = self.keys.read();
                let Some(e) = keys.get(key) else { continue };
                let region = if e.window { e.region } else { key };
                match keys.get(region) {
                    Some(r) if r.arena.is_none() => (region, r.addr, r.len),
                    _ => continue,
                }
            };
            let mut arenas = self.arenas.lock();
            let Some((arena, span)) = self
                .samehost
                .with_table_locked(|| samehost::arena::share(region.1, region.2))
            else {
                continue;
            };
            let mut keys = self.keys.write();
            // Still the region that was asked for (not deregistered meanwhile): publish.
            if keys.set_region_arena(region.0, region.1, region.2, span) {
                arenas.insert(region.0, arena);
            } else {
                drop(keys);
                drop(arena);
            }
        }
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Wakes the progress thread (a full pipe is already a pending wake-up).
    pub(crate) fn wake(&self) {
        let _ = (&self.wake_tx).write(&[1u8]);
    }

    /// A signal handler's service of connection `fd` (sigio.rs): nothing that blocks or
    /// allocates. Whether the connection is this device's (or maybe is: the engine was busy,
    /// and its holder or the progress thread, woken here, serves it).
    pub(crate) fn serve_signalled(&self, fd: i32) -> bool {
        #[cfg(test)]
        let busy = sigio::test_hooks::FORCE_BUSY.load(Ordering::Relaxed);
        #[cfg(not(test))]
        let busy = false;
        let Some(mut eng) = self.engine.try_lock().filter(|_| !busy) else {
            // The holder reads the armed connections before it lets go (`run_locked`), or
            // just after; the progress thread at its next wake-up or tick otherwise.
            sigio::stats::add(&sigio::stats::LEFT, 1);
            self.signal_sweep.store(true, Ordering::SeqCst);
            return false;
        };
        let served = eng.serve_signalled(self, fd);
        #[cfg(test)]
        {
            use sigio::test_hooks::{elsewhere, SERVED, SERVED_ELSEWHERE};
            let n = served.unwrap_or(0) as u64;
            SERVED.fetch_add(n, Ordering::Relaxed);
            if elsewhere() {
                SERVED_ELSEWHERE.fetch_add(n, Ordering::Relaxed);
            }
        }
        // Completions to notify without a timer, a frame left: the progress thread.
        let wake = std::mem::take(&mut eng.wake_needed) || eng.signal_sweep;
        drop(eng);
        if wake {
            self.wake();
        }
        served.is_some()
    }

    /// A signal handler's service of the ACK timer (sigio.rs): the held ACKs written, or,
    /// with the engine held, left to its holder (which sweeps the armed connections).
    pub(crate) fn write_held_acks(&self) {
        let Some(mut eng) = self.engine.try_lock() else {
            sigio::stats::add(&sigio::stats::LEFT, 1);
            self.leave_acks_to_others();
            return;
        };
        eng.write_held_acks();
        let wake = std::mem::take(&mut eng.wake_needed);
        drop(eng);
        if wake {
            self.wake();
        }
    }

    /// A signal handler that may not serve now leaves its connection to the engine's next
    /// holder, or the progress thread, woken for it.
    pub(crate) fn leave_to_others(&self) {
        self.signal_sweep.store(true, Ordering::SeqCst);
        self.wake();
    }

    /// The ACK timer's handler may not write the held ACKs now: the engine's holder or the
    /// progress thread does.
    pub(crate) fn leave_acks_to_others(&self) {
        self.acks_due.store(true, Ordering::SeqCst);
        self.leave_to_others();
    }

    /// Whether the ACK timer fired with the engine held (taking the request).
    pub(crate) fn take_acks_due(&self) -> bool {
        self.acks_due.load(Ordering::Relaxed) && self.acks_due.swap(false, Ordering::SeqCst)
    }

    /// Whether a signal handler found the engine held and left its connection to the holder.
    pub(crate) fn sweep_asked(&self) -> bool {
        self.signal_sweep.load(Ordering::Relaxed)
    }

    /// Runs `f` on the engine, then delivers what it produced with no lock held.
    pub(crate) fn run<T>(&self, f: impl FnOnce(&mut Engine, &Shared) -> T) -> T {
        self.run_locked(self.engine.lock(), f)
    }

    /// `run`, unless another thread holds the engine now (None: `f` did not run).
    pub(crate) fn try_run<T>(&self, f: impl FnOnce(&mut Engine, &Shared) -> T) -> Option<T> {
        Some(self.run_locked(self.engine.try_lock()?, f))
    }

    fn run_locked<T>(
        &self,
        mut eng: parking_lot::MutexGuard<'_, Engine>,
        f: impl FnOnce(&mut Engine, &Shared) -> T,
    ) -> T {
        let result = f(&mut eng, self);
        self.sweep_if_asked(&mut eng);
        let wake = std::mem::take(&mut eng.wake_needed);
        let deferred = self.take_deferred(&mut eng);
        drop(eng);
        if wake {
            self.wake();
        }
        self.deliver(deferred);
        self.sweep_after_release();
        result
    }

    /// A signal handler that found the engine held after our look, before our release:
    /// served now unless another thread holds the engine (which serves it on release).
    fn sweep_after_release(&self) {
        while self.signal_sweep.load(Ordering::SeqCst) {
            let Some(mut eng) = self.engine.try_lock() else {
                return;
            };
            self.sweep_if_asked(&mut eng);
            let wake = std::mem::take(&mut eng.wake_needed);
            let deferred = self.take_deferred(&mut eng);
            drop(eng);
            if wake {
                self.wake();
            }
            self.deliver(deferred);
        }
    }

    /// Reads the connections armed for the target signal if a signal handler found the
    /// engine held (sigio.rs): the holder serves what the handler could not.
    fn sweep_if_asked(&self, eng: &mut Engine) {
        let asked = self.signal_sweep.load(Ordering::Relaxed)
            && self.signal_sweep.swap(false, Ordering::SeqCst);
        // Or the engine's own request: a driver gave back an armed connection.
        if asked || eng.signal_sweep {
            self.sweep(eng);
        }
    }

    /// `sweep_if_asked`'s sweep. Never inlined: `run` is, into every caller, and this
    /// function's 16 KiB read buffer would then widen each caller's frame (page probes and
    /// a memset on every post, sweep or not).
    #[inline(never)]
    fn sweep(&self, eng: &mut Engine) {
        let mut buf = [0u8; 16 << 10];
        let acks_due = self.take_acks_due();
        eng.sweep_signalled(self, &mut buf, acks_due);
    }

    /// What the engine left to do once its lock is released, taken while it is held: the
    /// connection events go to the shared queue there, so that they reach the consumer in the
    /// engine's order whichever thread hands them over (see `deliver_cm`).
    pub(crate) fn take_deferred(&self, eng: &mut Engine) -> Vec<Deferred> {
        // The engine keeps this thread's spare list (empty, with room), so that the next
        // completion pushed allocates nothing; a turn that left nothing (a look that found
        // nothing) touches no thread-local.
        let mut all = match eng.deferred.is_empty() {
            true => Vec::new(),
            false => std::mem::replace(&mut eng.deferred, SPARE_DEFERRED.take()),
        };
        eng.take_signalled(&mut all);
        if !all.iter().any(|d| matches!(d, Deferred::Cm(_))) {
            return all; // the common case: completions only
        }
        let mut rest = Vec::with_capacity(all.len());
        let mut events = None;
        for d in all {
            match d {
                Deferred::Cm(ev) => events
                    .get_or_insert_with(|| self.cm_events.lock())
                    .push_back(ev),
                other => rest.push(other),
            }
        }
        rest
    }

    /// Does what `take_deferred` left, outside the engine lock.
    pub(crate) fn deliver(&self, mut deferred: Vec<Deferred>) {
        let mut last_cq: Option<u64> = None;
        for d in deferred.drain(..) {
            match d {
                Deferred::Notify(cq) => {
                    if last_cq == Some(cq.id) {
                        continue;
                    }
                    last_cq = Some(cq.id);
                    cq.notify();
                }
                Deferred::Interrupt(cq) => {
                    let cq = self.cqs.lock().get(&cq).and_then(|w| w.upgrade());
                    if let Some(cq) = cq {
                        cq.interrupt();
                    }
                }
                // Not from `take_deferred` (a test's hand-made list): queued now, in order
                // with what this thread queued before.
                Deferred::Cm(ev) => self.cm_events.lock().push_back(ev),
            }
        }
        if deferred.capacity() > 0 && deferred.capacity() <= SPARE_DEFERRED_MAX {
            SPARE_DEFERRED.set(deferred);
        }
        self.deliver_cm();
    }

    /// Hands the queued connection events to the handler, one thread at a time and in order.
    /// Each thread used to deliver the events it had made itself, after releasing the engine:
    /// an accepting thread's ESTABLISHED could then reach the consumer after the progress
    /// thread's DISCONNECTED for the same connection, and the EP, already disconnected, drop
    /// it (Debian's dtestcm server then waited forever for its 2,000th event, about one run in
    /// 100). A thread that finds another delivering leaves its events to it: that one looks
    /// at the queue again after giving up its turn.
    fn deliver_cm(&self) {
        loop {
            if self.cm_events.lock().is_empty() {
                return;
            }
            let Some(turn) = self.cm_turn.try_lock() else {
                return;
            };
            loop {
                let next = self.cm_events.lock().pop_front();
                let Some(ev) = next else {
                    break;
                };
                let handler = self.cm_handler.lock().clone();
                if let Some(h) = handler {
                    h(ev);
                }
            }
            drop(turn);
        }
    }

    /// The completions of `cq`, a CQ of this device (`Error::Foreign` for another's).
    pub(crate) fn cq(&self, cq: &Arc<dyn CompletionQueue>) -> Result<Arc<Completions>> {
        self.cqs
            .lock()
            .get(&cq.id())
            .and_then(|w| w.upgrade())
            .ok_or(Error::Foreign)
    }
}

/// The signal handler's way to a device (../sigio.rs), which names no type above it.
impl crate::sigio::SignalledDevice for Shared {
    fn serve_signalled(&self, fd: i32) -> bool {
        Shared::serve_signalled(self, fd)
    }
    fn leave_to_others(&self) {
        Shared::leave_to_others(self)
    }
    fn leave_acks_to_others(&self) {
        Shared::leave_acks_to_others(self)
    }
    fn write_held_acks(&self) {
        Shared::write_held_acks(self)
    }
    fn wake(&self) {
        Shared::wake(self)
    }
}
