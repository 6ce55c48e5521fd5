//! Shared receive queues: a provider shared receive context (`fi_srx_context`,
//! where `domain_attr->max_ep_srx_ctx > 0`: tcp) that the endpoints of the
//! SRQ's QPs are bound to. A receive's completion is reported on the CQ bound
//! to the endpoint that consumed it, with no word of which endpoint that was;
//! so each such QP reads its receives from a fid_cq of its own, which its DAT
//! receive CQ reads with its own (`OfiCq::add_feed`), and the QP names itself
//! in the completion. Receives beyond the provider's depth wait here, in
//! posting order, and are given to it as earlier ones are consumed.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};

use daplrs_backend::{Error, RecvWr, Resource, Result, SharedReceiveQueue};
use ofi_sys as fi;
use parking_lot::Mutex;

use crate::device::{opened, OfiDevice};
use crate::Fid;

/// Tokens wrap below this (a receive's context is its token).
const TOKENS: u32 = 1 << 30;

#[derive(Default)]
struct Inner {
    next: u32,
    /// Posted and not consumed: token -> wr_id.
    slots: HashMap<u32, u64>,
    /// Posted, waiting for the provider's room, oldest first.
    waiting: VecDeque<(u32, RecvWr)>,
    /// Given to the provider and not consumed.
    given: usize,
}

pub(crate) struct OfiSrq {
    id: u64,
    dev: Weak<OfiDevice>,
    pub(crate) srx: Fid<fi::fid_ep>,
    depth: usize,
    max_sge: u32,
    max_wr: AtomicU32,
    inner: Mutex<Inner>,
}

impl OfiSrq {
    pub(crate) fn open(dev: &OfiDevice, max_wr: u32, max_sge: u32) -> Result<Arc<OfiSrq>> {
        // SAFETY: our fi_info's receive attributes, read only.
        let mut attr = unsafe { *(*dev.info.ptr()).rx_attr };
        let mut srx = null_mut();
        // SAFETY: an open domain; `srx` receives the context.
        let rc = unsafe { fi::fi_srx_context(dev.domain.ptr(), &mut attr, &mut srx, null_mut()) };
        opened(rc, "fi_srx_context", Error::NoResource(Resource::Srq))?;
        Ok(Arc::new(OfiSrq {
            id: dev.next_id(),
            dev: dev.me.clone(),
            srx: Fid(srx),
            depth: dev.queue_depths().0,
            max_sge,
            max_wr: AtomicU32::new(max_wr),
            inner: Mutex::new(Inner::default()),
        }))
    }

    fn post_now(&self, token: u32, wr: &RecvWr) -> Result<()> {
        let dev = self.dev.upgrade().ok_or(Error::NoDevice)?;
        let (iov, mut desc) = crate::qp::io_vectors(&dev, &wr.sgl);
        let msg = fi::fi_msg {
            msg_iov: iov.as_ptr().cast(),
            desc: desc.as_mut_ptr(),
            iov_count: iov.len(),
            context: token as usize as *mut libc::c_void,
            ..Default::default()
        };
        // SAFETY: an open shared receive context; the vectors live for the call.
        let rc = unsafe { fi::fi_recvmsg(self.srx.ptr(), &msg, fi::FI_COMPLETION as u64) };
        crate::check(rc, "fi_recvmsg", Error::NoResource(Resource::Srq)).map(|_| ())
    }

    /// The receive `token` was consumed: its wr_id; the provider's room goes
    /// to the oldest waiting receive.
    pub(crate) fn take(&self, token: u32) -> Option<u64> {
        let mut inner = self.inner.lock();
        let wr_id = inner.slots.remove(&token)?;
        inner.given = inner.given.saturating_sub(1);
        while inner.given < self.depth {
            let Some((t, wr)) = inner.waiting.pop_front() else {
                break;
            };
            if let Err(e) = self.post_now(t, &wr) {
                log::debug!("SRQ {}: receive waits for room: {e:?}", self.id);
                inner.waiting.push_front((t, wr));
                break;
            }
            inner.given += 1;
        }
        Some(wr_id)
    }
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
        let mut inner = self.inner.lock();
        if inner.slots.len() >= self.max_wr.load(Ordering::Acquire) as usize {
            return Err(Error::NoResource(Resource::Srq));
        }
        let token = inner.next;
        inner.next = (inner.next + 1) % TOKENS;
        inner.slots.insert(token, wr.wr_id);
        if inner.given < self.depth && inner.waiting.is_empty() {
            if let Err(e) = self.post_now(token, &wr) {
                inner.slots.remove(&token);
                return Err(e);
            }
            inner.given += 1;
        } else {
            inner.waiting.push_back((token, wr));
        }
        Ok(())
    }

    fn posted(&self) -> u32 {
        self.inner.lock().slots.len() as u32
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
        let mut inner = self.inner.lock();
        inner.slots.clear();
        inner.waiting.clear();
    }
}
