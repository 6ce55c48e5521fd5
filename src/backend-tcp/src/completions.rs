//! A completion queue as the engine and `Shared` hold it (`Completions`): the completions
//! queued for its consumer, the consumer's notify, the wake-up of a thread driving it, and
//! the readiness sets of its connections (readiness.rs).
//!
//! Plain state, below the engine: the engine queues completions here and `Shared` notifies
//! or interrupts after its lock is released, while the trait object above it (`TcpCq`,
//! cq.rs) polls, drives and looks through the device's `Shared`. Nothing here reaches up.

use std::collections::VecDeque;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, OnceLock};
use std::thread::ThreadId;

use parking_lot::{Mutex, MutexGuard};

use daplrs_backend::{NotifyFn, WorkCompletion};

use crate::readiness::CqReadiness;

pub(crate) struct Completions {
    pub(crate) id: u64,
    queue: Mutex<VecDeque<WorkCompletion>>,
    notify: Mutex<Option<NotifyFn>>,
    /// Wakes a thread blocked in `TcpCq::drive` (written by `interrupt`, polled by the
    /// driver); made on the first drive (None if the pair could not be made: then nobody
    /// drives).
    waker: OnceLock<Option<(UnixStream, UnixStream)>>,
    /// The thread in `TcpCq::drive`, if any.
    driver: Mutex<Option<ThreadId>>,
    /// Which connections a poller's look reads (readiness.rs); held too by the connections'
    /// places in these sets (`Watched`, `Parked`), which need nothing else of the CQ.
    pub(crate) readiness: Arc<CqReadiness>,
}

impl Completions {
    /// The completions of CQ `id`, none queued.
    pub(crate) fn new(id: u64) -> Completions {
        Completions {
            id,
            // Room a signal handler may fill without allocating (sigio.rs).
            queue: Mutex::new(VecDeque::with_capacity(64)),
            notify: Mutex::new(None),
            waker: OnceLock::new(),
            driver: Mutex::new(None),
            readiness: Default::default(),
        }
    }

    /// Queues a completion (never dropped: a CQ past its depth keeps growing; the EVD above
    /// reports the overflow).
    pub(crate) fn push(&self, wc: WorkCompletion) {
        self.queue.lock().push_back(wc);
    }

    /// The queue, unless another thread holds it (for a signal handler: sigio.rs).
    pub(crate) fn try_queue(&self) -> Option<MutexGuard<'_, VecDeque<WorkCompletion>>> {
        self.queue.try_lock()
    }

    /// Moves up to `max` completions, oldest first, to `out`; returns how many.
    pub(crate) fn take(&self, max: usize, out: &mut Vec<WorkCompletion>) -> usize {
        let mut q = self.queue.lock();
        let n = max.min(q.len());
        out.extend(q.drain(..n));
        n
    }

    pub(crate) fn set_notify(&self, notify: Option<NotifyFn>) {
        *self.notify.lock() = notify;
    }

    /// Calls the consumer's notify, if it set one (with no lock of ours held).
    pub(crate) fn notify(&self) {
        let n = self.notify.lock().clone();
        if let Some(n) = n {
            n();
        }
    }

    /// The pair that wakes a driver, made at first use (by `drive` or by `interrupt`, which
    /// may come first: its byte then waits for the driver).
    pub(crate) fn waker(&self) -> Option<&(UnixStream, UnixStream)> {
        self.waker
            .get_or_init(|| {
                let (tx, rx) = UnixStream::pair().ok()?;
                tx.set_nonblocking(true).ok()?;
                rx.set_nonblocking(true).ok()?;
                Some((tx, rx))
            })
            .as_ref()
    }

    /// Notes the thread driving this CQ now (None: its drive returned), which `interrupt`
    /// then need not wake.
    pub(crate) fn set_driver(&self, driver: Option<ThreadId>) {
        *self.driver.lock() = driver;
    }

    /// Wakes the thread driving this CQ, so that it looks at its EVD and its connections
    /// again (a byte on the waker; one sent before the drive waits for it).
    pub(crate) fn interrupt(&self) {
        // The driver itself needs no wake-up: it looks at its EVD again once `drive` returns.
        if *self.driver.lock() == Some(std::thread::current().id()) {
            return;
        }
        if let Some((tx, _)) = self.waker() {
            let _ = (&*tx).write(&[1u8]);
        }
    }
}
