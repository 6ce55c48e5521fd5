//! Completion queues: an fid_cq whose entries are turned into work
//! completions, in each QP's posting order (see `qp`), in a software queue the
//! core polls. Reading the fid_cq is also what moves the provider forward.

use std::any::Any;
use std::collections::VecDeque;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Weak};

use daplrs_backend::{
    CompletionQueue, Error, NotifyFn, Resource, Result, WcStatus, WorkCompletion,
};
use ofi_sys as fi;
use parking_lot::Mutex;

use crate::domain::Domain;
use crate::ready::{Feed, Ready, Seat};
use crate::{opened, Fid};

/// What reads a CQ's fid_cq into its queue, handing each entry to the QP
/// its context names (`reap`, above the QPs): the CQ keeps it, for its
/// consumer's polls and the QPs' own reads (`reap_and_notify`).
pub(crate) trait Reader: Send + Sync {
    /// Reads `cq`'s entries into its queue; `consumer`: from the consumer's
    /// own poll (a connection broken meanwhile is left to the progress
    /// thread). Returns whether completions were added.
    fn read(&self, cq: &OfiCq, consumer: bool) -> bool;
}

/// Entries read from the fid_cq at a time.
const BATCH: usize = 16;
/// How long a blocked consumer reads a CQ that has no wait object itself
/// (reliable datagrams: see `drive`) before it sleeps until the progress
/// thread's next look: about a round trip on a loaded host.
const DRIVE_SPIN: std::time::Duration = std::time::Duration::from_micros(200);

pub(crate) struct OfiCq {
    id: u64,
    pub(crate) cq: Fid<fi::fid_cq>,
    /// The provider's descriptor for this CQ (FI_WAIT_FD), if it gave one.
    pub(crate) wait_fd: Option<std::os::fd::RawFd>,
    pub(crate) dev: Weak<Domain>,
    /// What reads the fid_cq into `queue` (`reap`, above the QPs its
    /// entries name), for the consumer's polls and the QPs' own reads.
    reader: Weak<dyn Reader>,
    /// Completions ready for the core, in order. Held while the fid_cq is read,
    /// so that two readers cannot reorder what they read.
    pub(crate) queue: Mutex<VecDeque<WorkCompletion>>,
    notify: Mutex<Option<NotifyFn>>,
    depth: AtomicU32,
    /// Connected endpoints complete on fid_cqs of their own, which this CQ
    /// reads as their descriptors say (`ready`); the device's fid_cq above
    /// serves reliable-datagram ports.
    pub(crate) ready: Arc<Ready>,
    /// Reliable datagrams: ports' endpoints complete on `cq` (not read otherwise).
    pub(crate) shared: bool,
    /// QPs whose request CQ this is and whose sends wait for the peer's
    /// receipt (`OfiQp::take_receipt`): each read of the CQ looks at their
    /// receipt words after the provider's entries. The CQ only keeps them
    /// for its reader, which knows them.
    pub(crate) awaiting: Mutex<Vec<Weak<dyn Any + Send + Sync>>>,
    /// Datagram QPs completing here: each read of the CQ reads theirs
    /// (`dgram`). Kept for the reader, which knows them, as `awaiting`.
    pub(crate) datagrams: Mutex<Vec<Weak<dyn Any + Send + Sync>>>,
    /// A consumer's wait found completions (`drive`): the poll that takes them does not
    /// count it as gone (`PollStamp`).
    wait_found: AtomicBool,
}

impl OfiCq {
    pub(crate) fn open(dev: &Domain, reader: Weak<dyn Reader>, depth: u32) -> Result<Arc<OfiCq>> {
        // A descriptor to sleep on where the provider offers one (see `wait`);
        // a CQ without one is read by the progress thread every millisecond.
        // Reliable-datagram providers are read every millisecond (they move
        // data only when called), and ofi_rxm (1.17) leaves a closed
        // endpoint's descriptor in a CQ's wait set ("fd not found in wait
        // list"), which a later read follows to freed memory: no wait object.
        let wait = if dev.rdm {
            Err(Error::Unsupported)
        } else {
            Self::open_fid(dev, depth, fi::fi_wait_obj_FI_WAIT_FD)
        };
        let (cq, wait_fd) = match wait {
            Ok(cq) => {
                let fd = crate::wait::wait_fd(cq.fid());
                (cq, fd)
            }
            Err(_) => (
                Self::open_fid(dev, depth, fi::fi_wait_obj_FI_WAIT_NONE)?,
                None,
            ),
        };
        Ok(Arc::new(OfiCq {
            id: dev.next_id(),
            cq,
            wait_fd,
            dev: dev.me.clone(),
            reader,
            queue: Mutex::new(VecDeque::new()),
            notify: Mutex::new(None),
            depth: AtomicU32::new(depth),
            ready: Ready::new(dev.waiter.clone()).map_err(|e| {
                log::warn!("epoll_create1: {e}");
                Error::NoResource(Resource::Memory)
            })?,
            shared: dev.rdm,
            awaiting: Mutex::new(Vec::new()),
            datagrams: Mutex::new(Vec::new()),
            wait_found: AtomicBool::new(false),
        }))
    }

    pub(crate) fn open_fid(
        dev: &Domain,
        depth: u32,
        wait: fi::fi_wait_obj,
    ) -> Result<Fid<fi::fid_cq>> {
        // A port's entries carry the tag of what an eager buffer took (`port`).
        let tagged = dev.rdm;
        Self::open_sized(dev, (depth.max(64) as usize) * 4, wait, tagged)
    }

    /// A fid_cq of `size` entries (the provider keeps those beyond in a
    /// list of its own, so it bounds memory, not completions).
    fn open_sized(
        dev: &Domain,
        size: usize,
        wait: fi::fi_wait_obj,
        tagged: bool,
    ) -> Result<Fid<fi::fid_cq>> {
        let format = if tagged {
            fi::fi_cq_format_FI_CQ_FORMAT_TAGGED
        } else {
            fi::fi_cq_format_FI_CQ_FORMAT_DATA
        };
        let mut attr = fi::fi_cq_attr {
            size,
            format,
            wait_obj: wait,
            ..Default::default()
        };
        let mut cq = null_mut();
        // SAFETY: an open domain; `cq` receives the new object.
        let rc = unsafe { fi::fi_cq_open(dev.domain.ptr(), &mut attr, &mut cq, null_mut()) };
        opened(rc, "fi_cq_open", Error::NoResource(Resource::Memory))?;
        Ok(Fid(cq))
    }

    /// Queues a completion the backend makes itself (a flush).
    pub(crate) fn push(&self, wcs: impl IntoIterator<Item = WorkCompletion>) {
        let before;
        {
            let mut q = self.queue.lock();
            before = q.len();
            q.extend(wcs);
            if q.len() == before {
                return;
            }
        }
        self.fire();
    }

    /// Runs `f` on the queue of completions ready for the core, with its lock
    /// held (before any QP's lock, as a reader of the fid_cq takes them), and
    /// notifies the consumer when completions were added.
    pub(crate) fn deliver<R>(&self, f: impl FnOnce(&mut VecDeque<WorkCompletion>) -> R) -> R {
        let (r, added) = {
            let mut q = self.queue.lock();
            let before = q.len();
            let r = f(&mut q);
            (r, q.len() > before)
        };
        if added {
            self.fire();
        }
        r
    }

    /// `deliver` on two CQs at once, `send` and `recv` (one queue when they
    /// are one CQ: `f` then gets None for the second): both queues held,
    /// taken in the CQs' order and before any QP's lock; notifies those
    /// that got completions.
    pub(crate) fn deliver_both<R>(
        send: &OfiCq,
        recv: &OfiCq,
        f: impl FnOnce(&mut VecDeque<WorkCompletion>, Option<&mut VecDeque<WorkCompletion>>) -> R,
    ) -> R {
        if std::ptr::eq(send, recv) {
            return send.deliver(|q| f(q, None));
        }
        let (r, sent, received) = {
            let (mut sq, mut rq);
            if send.id < recv.id {
                sq = send.queue.lock();
                rq = recv.queue.lock();
            } else {
                rq = recv.queue.lock();
                sq = send.queue.lock();
            }
            let (s0, r0) = (sq.len(), rq.len());
            let r = f(&mut sq, Some(&mut rq));
            (r, sq.len() > s0, rq.len() > r0)
        };
        if sent {
            send.fire();
        }
        if received {
            recv.fire();
        }
        r
    }

    pub(crate) fn fire(&self) {
        let notify = self.notify.lock().clone();
        if let Some(n) = notify {
            n();
        }
    }

    /// Reads the fid_cq; notifies the consumer when completions were added.
    pub(crate) fn reap_and_notify(&self) {
        if self.reap() {
            self.fire();
        }
    }

    /// Reads every entry the provider has; returns whether completions were added.
    fn reap(&self) -> bool {
        self.reader.upgrade().is_some_and(|r| r.read(self, false))
    }

    /// `reap` for the consumer's own poll: the core calls it with its EVD's
    /// lock held, and a broken connection's flush would notify that EVD (and
    /// take that lock) from inside it. The progress thread breaks such
    /// connections instead, at once.
    /// Returns whether completions were added.
    fn reap_for_consumer(&self) -> bool {
        self.reader.upgrade().is_some_and(|r| r.read(self, true))
    }

    /// A QP's sends wait for its peer's receipt: this CQ's reads look at its
    /// receipt words until none does (`OfiQp::take_receipt`).
    pub(crate) fn await_receipts(&self, qp: Weak<dyn Any + Send + Sync>) {
        self.awaiting.lock().push(qp);
    }

    /// The datagram QPs completing here (those gone are forgotten).
    pub(crate) fn datagram_qps(&self) -> Vec<Arc<dyn Any + Send + Sync>> {
        let mut d = self.datagrams.lock();
        if d.is_empty() {
            return Vec::new();
        }
        d.retain(|w| w.strong_count() > 0);
        d.iter().filter_map(Weak::upgrade).collect()
    }

    /// A datagram QP completes here: the CQ's reads read its own CQ.
    pub(crate) fn add_datagram_qp(&self, qp: Weak<dyn Any + Send + Sync>) {
        let mut d = self.datagrams.lock();
        if !d.iter().any(|w| w.ptr_eq(&qp)) {
            d.push(qp);
        }
    }

    /// A seat for an endpoint on a fid_cq this CQ reads (see `ready`): on
    /// one shared by a few endpoints, or with `srq` on SRQ QP `srq`'s own
    /// (for its receives of the SRQ: see `srq`).
    pub(crate) fn seat(
        &self,
        dev: &Domain,
        srq: Option<Arc<dyn Any + Send + Sync>>,
    ) -> Result<Seat> {
        // Room for a few requests per endpoint; the provider keeps those
        // beyond in a list of its own (it bounds memory, not completions).
        let open = || Self::open_sized(dev, 1024, fi::fi_wait_obj_FI_WAIT_FD, false);
        match srq {
            Some(qp) => Ok(self.ready.own(&qp, open()?)),
            None => self.ready.seat(open, !dev.level_waits),
        }
    }

    /// The fid_cqs to ask `fi_trywait` of before the progress thread
    /// sleeps, held open meanwhile: those read at every look (SRQ QPs'), or
    /// with `all` every one (a provider arming descriptors there).
    pub(crate) fn feeds(&self, all: bool) -> Vec<Arc<Feed>> {
        self.ready.to_ask(all)
    }
}

/// Reads every entry of `cq` (its errors included) into `each`.
/// `verbs`: the provider's error entries carry an ibv_wc_status (`status_of`).
/// `tagged`: the fid_cq's format is FI_CQ_FORMAT_TAGGED (a port's: see `port`).
pub(crate) fn drain(cq: *mut fi::fid_cq, verbs: bool, tagged: bool, each: impl FnMut(Done)) {
    if tagged {
        drain_as::<fi::fi_cq_tagged_entry>(cq, verbs, each)
    } else {
        drain_as::<fi::fi_cq_data_entry>(cq, verbs, each)
    }
}

/// An entry of a fid_cq's format.
trait Entry: Default + Copy {
    fn done(&self) -> Done;
}

impl Entry for fi::fi_cq_data_entry {
    fn done(&self) -> Done {
        Done {
            context: self.op_context as u64,
            result: Ok(self.len as u32),
            data: (self.flags & fi::FI_REMOTE_CQ_DATA as u64 != 0).then_some(self.data),
            tag: 0,
        }
    }
}

impl Entry for fi::fi_cq_tagged_entry {
    fn done(&self) -> Done {
        Done {
            context: self.op_context as u64,
            result: Ok(self.len as u32),
            data: (self.flags & fi::FI_REMOTE_CQ_DATA as u64 != 0)
                .then(|| crate::qp::remote_data(self.tag, self.data)),
            tag: self.tag,
        }
    }
}

fn drain_as<E: Entry>(cq: *mut fi::fid_cq, verbs: bool, mut each: impl FnMut(Done)) {
    let mut entries = [E::default(); BATCH];
    loop {
        // SAFETY: an open CQ of E's format; room for BATCH entries.
        let n = unsafe { fi::fi_cq_read(cq, entries.as_mut_ptr().cast(), BATCH) };
        if n > 0 {
            for e in &entries[..n as usize] {
                each(e.done());
            }
            if (n as usize) < BATCH {
                return;
            }
            continue;
        }
        if n != -(fi::FI_EAVAIL as isize) {
            return;
        }
        let mut err = fi::fi_cq_err_entry::default();
        // SAFETY: the same CQ; one error entry.
        if unsafe { fi::fi_cq_readerr(cq, &mut err, 0) } == 1 {
            log::debug!(
                "completion error {} (provider {}): {}",
                err.err,
                err.prov_errno,
                fi::strerror(err.err)
            );
            each(Done {
                context: err.op_context as u64,
                result: Err(status_of(err.err, verbs.then_some(err.prov_errno))),
                data: None,
                tag: err.tag,
            });
        }
    }
}

/// One entry of the fid_cq: its context (QP number and token), the length
/// or error, the remote CQ data a receive carries (see `qp::INVALIDATE`) and
/// a tagged receive's tag (0 where the format has none).
pub(crate) struct Done {
    pub context: u64,
    pub result: Result<u32, WcStatus>,
    pub data: Option<u64>,
    pub tag: u64,
}

/// A libfabric error entry's status; `wc_status`: the ibv_wc_status a verbs
/// provider reports behind EIO (it gives EIO for every failure but a flush).
fn status_of(err: i32, wc_status: Option<i32>) -> WcStatus {
    if err.unsigned_abs() == libc::EIO as u32 {
        if let Some(status) = wc_status.and_then(verbs_status) {
            return status;
        }
    }
    match err.unsigned_abs() {
        // The connection ended under the request (the peer went, or closed it):
        // what the connection's end reports, as our TCP transport flushes.
        fi::FI_ECANCELED | fi::FI_ENOTCONN | fi::FI_ECONNRESET | fi::FI_ECONNABORTED => {
            WcStatus::Flushed
        }
        fi::FI_EACCES | fi::FI_EPERM | fi::FI_EKEYREJECTED => WcStatus::RemoteAccess,
        fi::FI_ETRUNC | fi::FI_EMSGSIZE => WcStatus::LocalLength,
        fi::FI_EINVAL => WcStatus::RemoteInvalidRequest,
        _ => WcStatus::Transport,
    }
}

/// What an ibv_wc_status says, for the statuses a request's failure has
/// (values of <infiniband/verbs.h>, stable ABI); None for the rest.
fn verbs_status(wc: i32) -> Option<WcStatus> {
    Some(match wc {
        1 => WcStatus::LocalLength,          // IBV_WC_LOC_LEN_ERR
        2 => WcStatus::LocalQpOp,            // IBV_WC_LOC_QP_OP_ERR
        4 => WcStatus::LocalProtection,      // IBV_WC_LOC_PROT_ERR
        5 => WcStatus::Flushed,              // IBV_WC_WR_FLUSH_ERR
        6 => WcStatus::MwBind,               // IBV_WC_MW_BIND_ERR
        8 => WcStatus::LocalProtection,      // IBV_WC_LOC_ACCESS_ERR
        7 => WcStatus::BadResponse,          // IBV_WC_BAD_RESP_ERR
        9 => WcStatus::RemoteInvalidRequest, // IBV_WC_REM_INV_REQ_ERR
        10 => WcStatus::RemoteAccess,        // IBV_WC_REM_ACCESS_ERR
        11 => WcStatus::RemoteOp,            // IBV_WC_REM_OP_ERR
        13 => WcStatus::ReceiverNotReady,    // IBV_WC_RNR_RETRY_EXC_ERR
        _ => return None,
    })
}

impl CompletionQueue for OfiCq {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn id(&self) -> u64 {
        self.id
    }

    fn poll(&self, max: usize, out: &mut Vec<WorkCompletion>) -> usize {
        self.reap_for_consumer();
        let mut q = self.queue.lock();
        let n = max.min(q.len());
        out.extend(q.drain(..n));
        drop(q);
        // Found: a consumer that polled for it leaves (perhaps to spin on its memory, which
        // moves nothing) unless it polls again soon, so the progress thread and peers'
        // bells serve again (`PollStamp`); not one whose wait found it (`drive`), which
        // waits again.
        if n > 0 {
            if self.wait_found.load(Ordering::Relaxed) {
                self.wait_found.store(false, Ordering::Relaxed);
            } else {
                self.ready.waiter().consumer_found();
            }
        }
        n
    }

    fn set_notify(&self, notify: Option<NotifyFn>) {
        *self.notify.lock() = notify;
    }

    fn resize(&self, depth: u32) -> Result<()> {
        self.depth.store(depth, Ordering::Relaxed);
        Ok(())
    }

    fn depth(&self) -> u32 {
        self.depth.load(Ordering::Relaxed)
    }

    /// A CQ without a wait object (FI_EP_RDM: shm and ofi_rxm move data only
    /// when called) is read by the progress thread once a millisecond, so a
    /// consumer blocked on it would wait up to that long. It reads the CQ
    /// itself instead, yielding between reads, for `DRIVE_SPIN` (the progress
    /// thread keeps off meanwhile); then it sleeps as before (false).
    fn drive(&self, deadline: Option<std::time::Instant>) -> bool {
        if self.wait_fd.is_some() {
            return false;
        }
        let Some(dev) = self.dev.upgrade() else {
            return false;
        };
        let mut until = std::time::Instant::now() + DRIVE_SPIN;
        if let Some(d) = deadline {
            until = until.min(d);
        }
        loop {
            dev.waiter.consumer_polled();
            if self.reap_for_consumer() {
                // Still counts as polling: it comes back to wait (`poll`).
                self.wait_found.store(true, Ordering::Relaxed);
                return true;
            }
            if std::time::Instant::now() >= until {
                // Going to sleep: it leaves as after a find.
                dev.waiter.consumer_found();
                return false;
            }
            std::thread::yield_now();
        }
    }

    fn progress(&self) -> bool {
        // The core calls this for a consumer that polls (dat_evd_dequeue found
        // nothing): the progress thread keeps off while it does (`wait`).
        // Once it found something it leaves (maybe to spin on its memory, which
        // moves nothing): the thread takes over again at its next look.
        let Some(dev) = self.dev.upgrade() else {
            return false;
        };
        dev.waiter.consumer_polled();
        if self.reap_for_consumer() {
            dev.waiter.consumer_found();
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verbs_eio_says_what_its_wc_status_says() {
        let eio = libc::EIO;
        assert_eq!(status_of(eio, Some(10)), WcStatus::RemoteAccess);
        assert_eq!(status_of(eio, Some(1)), WcStatus::LocalLength);
        // Not verbs, or a status without a meaning here: the transport failed.
        assert_eq!(status_of(eio, None), WcStatus::Transport);
        assert_eq!(status_of(eio, Some(12)), WcStatus::Transport);
        // Other errors keep their own meaning whatever the provider says.
        assert_eq!(status_of(libc::EACCES, Some(1)), WcStatus::RemoteAccess);
        assert_eq!(
            status_of(-(fi::FI_ECANCELED as i32), Some(5)),
            WcStatus::Flushed
        );
    }
}
