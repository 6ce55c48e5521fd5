//! SRQ: a shared receive queue several EPs of one PZ draw receives from.

use std::sync::Arc;

use super::consts::{dto_op, mem_priv};
use super::ep::Ep;
use super::error::{DatError, DatResult, SubType};
use super::handle::{self, Handle, HandleKind, Object, UseCount};
use super::ia::{Ia, PendingDto};
use super::pz::Pz;
use crate::backend::{RecvWr, Sge, SharedReceiveQueue};

/// DAT_SRQ_ATTR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrqAttr {
    pub max_recv_dtos: u32,
    pub max_recv_iov: u32,
    pub low_watermark: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SrqParam {
    pub ia: Handle,
    pub pz: Handle,
    pub attr: SrqAttr,
    /// Receives posted and not yet consumed.
    pub available_dto_count: u32,
    /// EPs using the SRQ.
    pub ep_count: u32,
}

pub struct Srq {
    handle: Handle,
    ia: Arc<Ia>,
    pz: Arc<Pz>,
    srq: Arc<dyn SharedReceiveQueue>,
    attr: parking_lot::Mutex<SrqAttr>,
    /// EPs attached.
    pub(crate) users: UseCount,
}

impl Srq {
    /// dat_srq_create (positions: ia 1, pz 2, attr 3).
    pub fn create(ia: &Arc<Ia>, pz: &Arc<Pz>, attr: SrqAttr) -> DatResult<Arc<Srq>> {
        ia.check_open()?;
        let dev = ia.device().attr();
        if attr.max_recv_dtos == 0
            || attr.max_recv_dtos > dev.max_srq_wr
            || attr.max_recv_iov == 0
            || attr.max_recv_iov > dev.max_sge
            || attr.low_watermark > attr.max_recv_dtos
        {
            return Err(DatError::invalid_arg(3));
        }
        pz.acquire()?;
        let srq = match ia
            .device()
            .create_srq(pz.pd(), attr.max_recv_dtos, attr.max_recv_iov)
        {
            Ok(s) => s,
            Err(e) => {
                pz.users.release();
                return Err(e);
            }
        };
        let reservation = handle::reserve(HandleKind::Srq);
        let s = Arc::new(Srq {
            handle: reservation.handle(),
            ia: ia.clone(),
            pz: pz.clone(),
            srq,
            attr: parking_lot::Mutex::new(attr),
            users: UseCount::default(),
        });
        reservation.commit(Object::Srq(s.clone()), ia.handle());
        Ok(s)
    }

    pub fn handle(&self) -> Handle {
        self.handle
    }
    pub(crate) fn backend(&self) -> &Arc<dyn SharedReceiveQueue> {
        &self.srq
    }

    pub fn query(&self) -> SrqParam {
        SrqParam {
            ia: self.ia.handle(),
            pz: self.pz.handle(),
            attr: *self.attr.lock(),
            available_dto_count: self.srq.posted(),
            ep_count: self.users.users() as u32,
        }
    }

    /// dat_srq_post_recv (positions: num_segments 2, local_iov 3, cookie 4).
    pub fn post_recv(&self, iov: &[Sge], cookie: u64) -> DatResult<()> {
        let attr = *self.attr.lock();
        if iov.len() > attr.max_recv_iov as usize {
            return Err(DatError::invalid_arg(2));
        }
        let (sgl, _) = Ep::check_local_iov(&self.ia, &self.pz, iov, mem_priv::LOCAL_WRITE, 3)?;
        let wr_id = self.ia.track(PendingDto {
            ep: Handle::NULL,
            cookie,
            op: dto_op::RECEIVE,
            report_success: true,
            rmr: None,
        });
        if let Err(e) = self.srq.post_recv(RecvWr { wr_id, sgl }) {
            self.ia.untrack(wr_id);
            return Err(e);
        }
        Ok(())
    }

    /// dat_srq_resize.
    pub fn resize(&self, max_recv_dtos: i32) -> DatResult<()> {
        if max_recv_dtos <= 0 || max_recv_dtos as u32 > self.ia.device().attr().max_srq_wr {
            return Err(DatError::invalid_arg(2));
        }
        if (max_recv_dtos as u32) < self.srq.posted() {
            return Err(DatError::invalid_state(SubType::SrqInUse));
        }
        self.srq.resize(max_recv_dtos as u32)?;
        self.attr.lock().max_recv_dtos = max_recv_dtos as u32;
        Ok(())
    }

    /// dat_srq_set_lw.
    pub fn set_lw(&self, low_watermark: i32) -> DatResult<()> {
        let mut a = self.attr.lock();
        if low_watermark < 0 || low_watermark as u32 > a.max_recv_dtos {
            return Err(DatError::invalid_arg(2));
        }
        a.low_watermark = low_watermark as u32;
        self.srq.set_limit(low_watermark as u32);
        Ok(())
    }

    /// dat_srq_free: refused while an EP uses the SRQ.
    pub fn free(self: &Arc<Self>) -> DatResult<()> {
        if !handle::is_live(self.handle) {
            return Err(HandleKind::Srq.invalid());
        }
        if self.users.retire().is_err() {
            return Err(DatError::invalid_state(SubType::SrqInUse));
        }
        handle::remove(self.handle, HandleKind::Srq)?;
        self.destroy();
        Ok(())
    }

    pub(crate) fn destroy(&self) {
        self.users.force_retire();
        self.srq.destroy();
        self.pz.users.release();
    }
}
