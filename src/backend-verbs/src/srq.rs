//! Shared receive queue (an ibv_srq), and the scatter list a device takes for a receive.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use rdma_sys::*;

use super::mem::{downcast_pd, PdInner};
use super::shared::Shared;
use super::sys::Ptr;
use super::RECV_BIT;
use daplrs_backend::intmap::IntMap;
use daplrs_backend::{Error, RecvWr, Resource, Result, SharedReceiveQueue, WrContext};

/// One empty segment, for a receive of zero-length messages where the device wants one.
static EMPTY_SGE: [daplrs_backend::Sge; 1] = [daplrs_backend::Sge {
    addr: 0,
    length: 0,
    lkey: 0,
}];

/// A receive's scatter list as the device takes it: libsiw refuses a receive with no
/// segment (EINVAL, providers/siw push_recv_wqe), so there it gets one empty segment, which
/// takes a zero-length message just the same (siw skips empty segments and looks at no key)
/// and fails a longer one with a length error, as no segment does.
pub(super) fn recv_sges<'a>(
    shared: &Shared,
    sgl: &'a [daplrs_backend::Sge],
) -> &'a [daplrs_backend::Sge] {
    if sgl.is_empty() && shared.recv_needs_sge {
        &EMPTY_SGE
    } else {
        sgl
    }
}

/// Shared receive queue.
pub(crate) struct VerbsSrq {
    pub(super) id: u64,
    pub(super) srq: Ptr<ibv_srq>,
    pub(super) me: Weak<VerbsSrq>,
    _pd: Arc<PdInner>,
    max_wr: AtomicU32,
    /// Receives posted and not completed (dat_srq_query counts them), with the consumer's
    /// record of each (`RecvWr::ctx`, given back in its completion).
    posted: Mutex<IntMap<u64, WrContext>>,
}

impl VerbsSrq {
    pub(super) fn create(
        shared: &Arc<Shared>,
        pd: &dyn daplrs_backend::ProtectionDomain,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<Arc<VerbsSrq>> {
        let pd = downcast_pd(pd)?;
        // SAFETY: plain data.
        let mut a: ibv_srq_init_attr = unsafe { std::mem::zeroed() };
        a.attr.max_wr = max_wr.max(1);
        a.attr.max_sge = max_sge.max(1);
        // SAFETY: a PD of this device.
        let srq = unsafe { ibv_create_srq(pd.pd.0, &mut a) };
        if srq.is_null() {
            return Err(Error::NoResource(Resource::Srq));
        }
        Ok(Arc::new_cyclic(|me| VerbsSrq {
            id: shared.next_id(),
            srq: Ptr(srq),
            me: me.clone(),
            _pd: pd,
            max_wr: AtomicU32::new(a.attr.max_wr),
            posted: Mutex::new(IntMap::default()),
        }))
    }

    /// A receive of the SRQ completed: its context.
    pub(super) fn completed(&self, wr_id: u64) -> WrContext {
        self.posted
            .lock()
            .remove(&(wr_id & !RECV_BIT))
            .unwrap_or(WrContext::NONE)
    }

    fn modify(&self, mut attr: ibv_srq_attr, mask: ibv_srq_attr_mask) -> Result<(), i32> {
        // SAFETY: our SRQ and an attribute block that lives across the call.
        match unsafe { ibv_modify_srq(self.srq.0, &mut attr, mask.0 as i32) } {
            0 => Ok(()),
            rc => Err(rc),
        }
    }
}

impl SharedReceiveQueue for VerbsSrq {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn id(&self) -> u64 {
        self.id
    }
    fn post_recv(&self, wr: RecvWr) -> Result<()> {
        let sges = recv_sges(&self._pd.shared, &wr.sgl);
        // SAFETY: plain data.
        let mut w: ibv_recv_wr = unsafe { std::mem::zeroed() };
        w.wr_id = wr.wr_id | RECV_BIT;
        w.sg_list = super::sys::sge_ptr(sges);
        w.num_sge = sges.len() as i32;
        self.posted.lock().insert(wr.wr_id, wr.ctx);
        let mut bad = std::ptr::null_mut();
        // SAFETY: our SRQ; the request is copied by verbs.
        let rc = unsafe { ibv_post_srq_recv(self.srq.0, &mut w, &mut bad) };
        if rc != 0 {
            self.posted.lock().remove(&wr.wr_id);
            return Err(Error::NoResource(Resource::Srq));
        }
        Ok(())
    }
    fn posted(&self) -> u32 {
        self.posted.lock().len() as u32
    }
    fn max_wr(&self) -> u32 {
        self.max_wr.load(Ordering::SeqCst)
    }
    fn resize(&self, max_wr: u32) -> Result<()> {
        self.modify(
            ibv_srq_attr {
                max_wr,
                max_sge: 0,
                srq_limit: 0,
            },
            ibv_srq_attr_mask::IBV_SRQ_MAX_WR,
        )
        .map_err(|_| Error::NoResource(Resource::Srq))?;
        self.max_wr.store(max_wr, Ordering::SeqCst);
        Ok(())
    }
    fn destroy(&self) {
        // Receives never taken are dropped with the SRQ, as the TCP backend drops them: DAT
        // forbids freeing an SRQ that an EP still uses, so no QP's CQ is left to report on.
        let left = std::mem::take(&mut *self.posted.lock()).len();
        if left > 0 {
            log::debug!("SRQ {}: {left} receives dropped with the SRQ", self.id);
        }
    }
}

impl Drop for VerbsSrq {
    fn drop(&mut self) {
        // SAFETY: no QP uses the SRQ (each holds an Arc to it).
        let rc = unsafe { ibv_destroy_srq(self.srq.0) };
        if rc != 0 {
            log::warn!("ibv_destroy_srq: error {rc}");
        }
    }
}
