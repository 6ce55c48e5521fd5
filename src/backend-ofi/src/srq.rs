//! Shared receive queues, in one of two ways, by what the provider has.
//!
//! A shared receive context (`fi_srx_context`, where
//! `domain_attr->max_ep_srx_ctx > 0`: tcp) that the endpoints of the SRQ's
//! QPs are bound to. A receive's completion is reported on the CQ bound to the
//! endpoint that consumed it, with no word of which endpoint that was; so each
//! such QP reads its receives from a fid_cq of its own, which its DAT
//! receive CQ reads at every look (`OfiCq::seat`, `ready`), and the QP names
//! itself in the completion. Receives beyond the provider's depth wait here, in posting
//! order, and are given to it as earlier ones are consumed.
//!
//! Elsewhere (shm and ofi_rxm have none in 1.17) a pool of ours: the SRQ keeps
//! the consumer's receives, each QP of it keeps a few bounce buffers of its own
//! posted on its endpoint (`bounce`), and a message landing in one is copied
//! into the SRQ's oldest receive, which completes on that QP. A message that
//! finds no receive waits, in its bounce buffer, for the next one posted
//! (oldest message first). Receives posted ahead to each endpoint instead would
//! copy nothing, but a message would then take the receive its endpoint
//! happens to hold, not the SRQ's oldest, and one EP could starve while
//! another holds receives it never uses (docs/libfabric.md, "Shared receive
//! queues").

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};

use daplrs_backend::{Error, RecvWr, Resource, Result, SharedReceiveQueue, WcStatus, WrContext};
use ofi_sys as fi;
use parking_lot::Mutex;

use crate::bounce::Landed;
use crate::domain::Domain;
use crate::opened;
use crate::Fid;

/// Tokens wrap below this (a receive's context is its token).
const TOKENS: u32 = 1 << 30;

/// The provider's shared receive context, and our receives it has (or waits for room for).
struct Context {
    srx: Fid<fi::fid_ep>,
    depth: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next: u32,
    /// Posted and not consumed: token -> wr_id.
    slots: HashMap<u32, (u64, WrContext)>,
    /// Posted, waiting for the provider's room, oldest first.
    waiting: VecDeque<(u32, RecvWr)>,
    /// Given to the provider and not consumed.
    given: usize,
}

/// A message in a QP's bounce buffer that found no receive yet.
struct Arrival {
    qp_num: u32,
    landed: Landed,
}

/// Our own pool (no shared receive context: see the module's comment).
#[derive(Default)]
struct Pool {
    /// Posted and not consumed, oldest first.
    posted: VecDeque<RecvWr>,
    /// Messages waiting for a receive, oldest first.
    arrived: VecDeque<Arrival>,
    /// The longest receive posted so far: what a bounce buffer must hold.
    longest: usize,
    /// The QPs receiving for the SRQ, by number (told when `longest` grows).
    qps: Vec<(u32, Weak<dyn Member>)>,
}

enum Mode {
    Context(Context),
    Pool(Mutex<Pool>),
}

/// A QP receiving for an SRQ of ours (`qp`, above it): asked to post
/// longer bounce buffers as the receives grow, and to complete the messages
/// of its that waited for a receive.
pub(crate) trait Member: Send + Sync {
    /// The SRQ's receives grew beyond the bounce buffers posted: those are
    /// asked back, and posted again longer as their cancels complete.
    fn lengthen_bounces(&self, len: usize);
    /// A receive was posted to the SRQ while a message of this QP waited for
    /// one: it completes on the QP's receive CQ.
    fn serve_srq(&self, srq: &OfiSrq);
}

pub(crate) struct OfiSrq {
    id: u64,
    dev: Weak<Domain>,
    max_sge: u32,
    max_wr: AtomicU32,
    mode: Mode,
}

impl OfiSrq {
    pub(crate) fn open(dev: &Domain, max_wr: u32, max_sge: u32) -> Result<Arc<OfiSrq>> {
        let mode = if dev.shared_rx() {
            Mode::Context(Self::open_context(dev)?)
        } else {
            Mode::Pool(Mutex::new(Pool::default()))
        };
        Ok(Arc::new(OfiSrq {
            id: dev.next_id(),
            dev: dev.me.clone(),
            max_sge,
            max_wr: AtomicU32::new(max_wr),
            mode,
        }))
    }

    fn open_context(dev: &Domain) -> Result<Context> {
        // SAFETY: our fi_info's receive attributes, read only.
        let mut attr = unsafe { *(*dev.info.ptr()).rx_attr };
        let mut srx = null_mut();
        // SAFETY: an open domain; `srx` receives the context.
        let rc = unsafe { fi::fi_srx_context(dev.domain.ptr(), &mut attr, &mut srx, null_mut()) };
        opened(rc, "fi_srx_context", Error::NoResource(Resource::Srq))?;
        Ok(Context {
            srx: Fid(srx),
            depth: dev.queue_depths().0,
            inner: Mutex::new(Inner::default()),
        })
    }

    /// The provider's shared receive context (None: a pool of ours).
    pub(crate) fn srx(&self) -> Option<&Fid<fi::fid_ep>> {
        match &self.mode {
            Mode::Context(c) => Some(&c.srx),
            Mode::Pool(_) => None,
        }
    }

    fn post_now(&self, srx: &Fid<fi::fid_ep>, token: u32, wr: &RecvWr) -> Result<()> {
        let dev = self.dev.upgrade().ok_or(Error::NoDevice)?;
        let (iov, mut desc) = crate::mem::io_vectors(&dev, &wr.sgl);
        let msg = fi::fi_msg {
            msg_iov: iov.as_ptr().cast(),
            desc: desc.as_mut_ptr(),
            iov_count: iov.len(),
            context: token as usize as *mut libc::c_void,
            ..Default::default()
        };
        // SAFETY: an open shared receive context; the vectors live for the call.
        let rc = unsafe { fi::fi_recvmsg(srx.ptr(), &msg, fi::FI_COMPLETION as u64) };
        crate::check(rc, "fi_recvmsg", Error::NoResource(Resource::Srq)).map(|_| ())
    }

    /// The receive `token` was consumed: its wr_id; the provider's room goes
    /// to the oldest waiting receive.
    pub(crate) fn take(&self, token: u32) -> Option<(u64, WrContext)> {
        let Mode::Context(c) = &self.mode else {
            return None;
        };
        let mut inner = c.inner.lock();
        let taken = inner.slots.remove(&token)?;
        inner.given = inner.given.saturating_sub(1);
        while inner.given < c.depth {
            let Some((t, wr)) = inner.waiting.pop_front() else {
                break;
            };
            if let Err(e) = self.post_now(&c.srx, t, &wr) {
                log::debug!("SRQ {}: receive waits for room: {e:?}", self.id);
                inner.waiting.push_front((t, wr));
                break;
            }
            inner.given += 1;
        }
        Some(taken)
    }

    fn post_to_context(&self, c: &Context, wr: RecvWr) -> Result<()> {
        let mut inner = c.inner.lock();
        if inner.slots.len() >= self.max_wr.load(Ordering::Acquire) as usize {
            return Err(Error::NoResource(Resource::Srq));
        }
        let token = inner.next;
        inner.next = (inner.next + 1) % TOKENS;
        inner.slots.insert(token, (wr.wr_id, wr.ctx));
        if inner.given < c.depth && inner.waiting.is_empty() {
            if let Err(e) = self.post_now(&c.srx, token, &wr) {
                inner.slots.remove(&token);
                return Err(e);
            }
            inner.given += 1;
        } else {
            inner.waiting.push_back((token, wr));
        }
        Ok(())
    }

    /// A receive into the pool: a waiting message takes it at once; QPs whose
    /// bounce buffers are now too short post longer ones.
    fn post_to_pool(&self, pool: &Mutex<Pool>, wr: RecvWr) -> Result<()> {
        let longer: Vec<Arc<dyn Member>> = {
            let mut p = pool.lock();
            if p.posted.len() >= self.max_wr.load(Ordering::Acquire) as usize {
                return Err(Error::NoResource(Resource::Srq));
            }
            let len: usize = wr.sgl.iter().map(|s| s.length as usize).sum();
            p.posted.push_back(wr);
            if len > p.longest {
                p.longest = len;
                p.qps.retain(|(_, q)| q.strong_count() > 0);
                p.qps.iter().filter_map(|(_, q)| q.upgrade()).collect()
            } else {
                Vec::new()
            }
        };
        self.serve_arrivals(pool);
        for qp in longer {
            qp.lengthen_bounces(self.bounce_len());
        }
        Ok(())
    }

    /// Gives the waiting messages the receives posted, oldest first, each
    /// through its QP (which completes it on its receive CQ, in order).
    fn serve_arrivals(&self, pool: &Mutex<Pool>) {
        let Some(_dev) = self.dev.upgrade() else {
            return;
        };
        loop {
            let qp = {
                let mut p = pool.lock();
                if p.posted.is_empty() {
                    return;
                }
                let Some(front) = p.arrived.front() else {
                    return;
                };
                let num = front.qp_num;
                let member = p.qps.iter().find(|(n, _)| *n == num);
                match member.and_then(|(_, q)| q.upgrade()) {
                    Some(qp) => qp,
                    None => {
                        p.arrived.pop_front();
                        continue;
                    }
                }
            };
            qp.serve_srq(self);
        }
    }

    fn pool(&self) -> Option<&Mutex<Pool>> {
        match &self.mode {
            Mode::Pool(p) => Some(p),
            Mode::Context(_) => None,
        }
    }

    /// What a QP's bounce buffer must hold now.
    pub(crate) fn bounce_len(&self) -> usize {
        self.pool().map_or(0, |p| p.lock().longest)
    }

    /// `qp` receives for the pool from now on (its endpoint is open).
    pub(crate) fn enroll<M: Member + 'static>(&self, qp_num: u32, qp: &Arc<M>) {
        if let Some(pool) = self.pool() {
            let mut p = pool.lock();
            let this = Arc::as_ptr(qp) as *const ();
            p.qps
                .retain(|(_, q)| q.strong_count() > 0 && q.as_ptr() as *const () != this);
            let qp: Weak<dyn Member> = Arc::downgrade(qp) as Weak<M>;
            p.qps.push((qp_num, qp));
        }
    }

    /// A message landed on `qp` (in its order): it waits for a receive.
    pub(crate) fn arrived(&self, qp_num: u32, landed: Landed) {
        if let Some(pool) = self.pool() {
            pool.lock().arrived.push_back(Arrival { qp_num, landed });
        }
    }

    /// The oldest waiting message, if it is `qp_num`'s and a receive is
    /// posted, with the oldest receive (the caller completes it).
    pub(crate) fn take_for(&self, qp_num: u32) -> Option<(Landed, RecvWr)> {
        let mut p = self.pool()?.lock();
        if p.posted.is_empty() || p.arrived.front()?.qp_num != qp_num {
            return None;
        }
        let arrival = p.arrived.pop_front()?;
        let wr = p.posted.pop_front()?;
        Some((arrival.landed, wr))
    }

    /// `qp_num`'s connection ended: its waiting messages go (the receives stay).
    pub(crate) fn forget(&self, qp_num: u32) {
        if let Some(pool) = self.pool() {
            pool.lock().arrived.retain(|a| a.qp_num != qp_num);
        }
    }
}

/// Copies `bytes` into the receive's segments: its length, or a length error
/// where they do not fit.
pub(crate) fn copy_into(wr: &RecvWr, bytes: &[u8]) -> std::result::Result<u32, WcStatus> {
    let room: usize = wr.sgl.iter().map(|s| s.length as usize).sum();
    if bytes.len() > room {
        return Err(WcStatus::LocalLength);
    }
    let mut rest = bytes;
    for s in wr.sgl.iter() {
        if rest.is_empty() {
            break;
        }
        let n = rest.len().min(s.length as usize);
        // SAFETY: the segment is the consumer's registered memory, checked by
        // the core against its LMR when the receive was posted, and no other
        // writer has it: the receive was posted to us and not yet completed.
        unsafe { std::ptr::copy_nonoverlapping(rest.as_ptr(), s.addr as *mut u8, n) };
        rest = &rest[n..];
    }
    Ok(bytes.len() as u32)
}

impl SharedReceiveQueue for OfiSrq {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn id(&self) -> u64 {
        self.id
    }

    fn post_recv(&self, wr: RecvWr) -> Result<()> {
        if wr.sgl.len() > self.max_sge.max(1) as usize {
            return Err(Error::TooLong);
        }
        match &self.mode {
            Mode::Context(c) => self.post_to_context(c, wr),
            Mode::Pool(p) => self.post_to_pool(p, wr),
        }
    }

    fn posted(&self) -> u32 {
        match &self.mode {
            Mode::Context(c) => c.inner.lock().slots.len() as u32,
            Mode::Pool(p) => p.lock().posted.len() as u32,
        }
    }

    fn max_wr(&self) -> u32 {
        self.max_wr.load(Ordering::Acquire)
    }

    fn resize(&self, max_wr: u32) -> Result<()> {
        self.max_wr.store(max_wr, Ordering::Release);
        Ok(())
    }

    fn destroy(&self) {
        // DAT refuses to free an SRQ an EP still uses, so no connection can
        // consume these; the provider's receives go with the context.
        match &self.mode {
            Mode::Context(c) => {
                let mut inner = c.inner.lock();
                inner.slots.clear();
                inner.waiting.clear();
            }
            Mode::Pool(p) => {
                let mut p = p.lock();
                p.posted.clear();
                p.arrived.clear();
            }
        }
    }
}
