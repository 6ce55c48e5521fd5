//! SRQ: a shared receive queue several EPs of one PZ draw receives from.
//!
//! The low watermark (dat_srq_create's low_watermark, dat_srq_set_lw): once set, the SRQ is
//! armed, and the first time fewer receives are posted to it than the watermark (at once, if
//! that is already so, or when an EP consumes a receive) one asynchronous event goes to the
//! IA's async EVD; then it stays disarmed until the watermark is set again. A watermark of 0
//! (DAT_SRQ_LW_DEFAULT) never fires: no count is below 0.
//!
//! The rule lives here, with no help from the backend: every SRQ receive a QP consumes
//! completes, every completion passes through `completion::untracked` as soon as the backend
//! produces it (the EVD drains its CQ from the CQ's notify hook), and by then the backend's
//! `posted()` count, which dat_srq_query reports, no longer holds that receive. Checking the
//! armed SRQs there is one rule for both backends with no trait surface: the alternative, the
//! backend reporting the crossing itself, would have the TCP engine check at every place it
//! takes a receive (sends and writes with immediate data), and verbs' hardware limit
//! (IBV_EVENT_SRQ_LIMIT_REACHED) counts receives not yet taken by the device, a different
//! number from the one the consumer queries, and arrives on a descriptor the IAs of a device
//! share.

use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::consts::{async_reason, dto_op, event_number, mem_priv};
use super::error::{from_backend, DatError, DatResult, Param, SubType};
use super::handle_table::{self, Handle, HandleKind};
use super::ia::Ia;
use super::pending::PendingDto;
use super::pz::Pz;
use super::use_count::UseCount;
use daplrs_backend::{RecvWr, Sge, SharedReceiveQueue, WrContext};

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

/// The event number of the low-watermark event. DAT 2.0 defines none of its own: the event is
/// an asynchronous error event whose handle (of type DAT_HANDLE_TYPE_SRQ) and reason
/// (DAT_SRQ_LOW_WATERMARK_EVENT) say what happened. Its number is the one OFED's provider
/// gives the verbs SRQ limit event, DAT_ASYNC_ERROR_EP_BROKEN.
pub const LOW_WATERMARK_EVENT: u32 = event_number::ASYNC_EP_BROKEN;

/// SRQs (of every IA) whose low watermark is armed.
static ARMED: Mutex<Vec<Weak<Srq>>> = Mutex::new(Vec::new());

/// Called when a completion of an SRQ receive is retired: fires the event of every armed SRQ
/// now below its watermark.
pub(crate) fn receive_consumed() {
    let fired: Vec<Arc<Srq>> = {
        let mut armed = ARMED.lock();
        if armed.is_empty() {
            return;
        }
        let mut fired = Vec::new();
        armed.retain(|w| match w.upgrade() {
            Some(s) if s.below_watermark() => {
                fired.push(s);
                false
            }
            Some(_) => true,
            None => false,
        });
        fired
    };
    for s in fired {
        s.post_low_watermark();
    }
}

pub struct Srq {
    handle: Handle,
    ia: Arc<Ia>,
    pz: Arc<Pz>,
    srq: Arc<dyn SharedReceiveQueue>,
    attr: Mutex<SrqAttr>,
    /// EPs attached.
    pub(crate) users: UseCount,
}

impl Srq {
    /// dat_srq_create.
    pub fn create(ia: &Arc<Ia>, pz: &Arc<Pz>, attr: SrqAttr) -> DatResult<Arc<Srq>> {
        ia.check_open()?;
        let dev = ia.device().attr();
        if attr.max_recv_dtos == 0
            || attr.max_recv_dtos > dev.max_srq_wr
            || attr.max_recv_iov == 0
            || attr.max_recv_iov > dev.max_sge
            || attr.low_watermark > attr.max_recv_dtos
        {
            return Err(DatError::bad(Param::SrqAttr));
        }
        ia.check_room(HandleKind::Srq, dev.max_srq, SubType::ResourceSrq)?;
        pz.acquire()?;
        let srq = match ia
            .device()
            .create_srq(pz.pd(), attr.max_recv_dtos, attr.max_recv_iov)
        {
            Ok(s) => s,
            Err(e) => {
                pz.users.release();
                return Err(e.into());
            }
        };
        let reservation = ia.reserve(HandleKind::Srq);
        let s = Arc::new(Srq {
            handle: reservation.handle(),
            ia: ia.clone(),
            pz: pz.clone(),
            srq,
            attr: Mutex::new(attr),
            users: UseCount::default(),
        });
        ia.commit(reservation, &s);
        // The watermark of the attributes is armed as one set later would be: with nothing
        // posted yet, a nonzero one fires at once (why DAT asks for DAT_SRQ_LW_DEFAULT here).
        s.arm_low_watermark();
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

    /// dat_srq_post_recv.
    pub fn post_recv(&self, iov: &[Sge], cookie: u64) -> DatResult<()> {
        let attr = *self.attr.lock();
        if iov.len() > attr.max_recv_iov as usize {
            return Err(DatError::bad(Param::NumSegments));
        }
        let (sgl, _) =
            self.ia
                .lmrs
                .check_iov(Arc::as_ptr(&self.pz) as usize, iov, mem_priv::LOCAL_WRITE)?;
        let wr_id = self.ia.track(
            self.handle,
            PendingDto {
                ep: Handle::NULL,
                cookie,
                op: dto_op::RECEIVE,
                report_success: true,
                rmr: None,
                ext: None,
            },
        )?;
        // The record waits in the IA's table: the EP that takes the receive is not known yet.
        let ctx = WrContext::NONE;
        if let Err(e) = self.srq.post_recv(RecvWr { wr_id, ctx, sgl }) {
            self.ia.untrack(wr_id);
            return Err(from_backend(e, Some(Param::NumSegments)));
        }
        Ok(())
    }

    /// dat_srq_resize.
    pub fn resize(&self, max_recv_dtos: i32) -> DatResult<()> {
        if max_recv_dtos <= 0 || max_recv_dtos as u32 > self.ia.device().attr().max_srq_wr {
            return Err(DatError::bad(Param::SrqMaxRecvDto));
        }
        if (max_recv_dtos as u32) < self.srq.posted() {
            return Err(DatError::invalid_state(SubType::SrqInUse));
        }
        self.srq.resize(max_recv_dtos as u32)?;
        self.attr.lock().max_recv_dtos = max_recv_dtos as u32;
        Ok(())
    }

    /// dat_srq_set_lw: sets the watermark and arms it, whether or not it fired before. If
    /// fewer receives are posted than the new watermark, the event is generated during this
    /// call (the spec's description: "This can occur during the current call").
    pub fn set_lw(self: &Arc<Self>, low_watermark: i32) -> DatResult<()> {
        {
            let mut a = self.attr.lock();
            if low_watermark < 0 || low_watermark as u32 > a.max_recv_dtos {
                return Err(DatError::bad(Param::LowWatermark));
            }
            a.low_watermark = low_watermark as u32;
        }
        self.arm_low_watermark();
        Ok(())
    }

    /// Arms the current watermark (replacing an armed one), or fires it at once.
    fn arm_low_watermark(self: &Arc<Self>) {
        let fire_now = {
            // Checked and armed under the list's lock: a receive consumed meanwhile either
            // left `posted()` before the check, or is retired (and checked) after the arming.
            let mut armed = ARMED.lock();
            armed.retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), &**self));
            let fire_now = self.below_watermark();
            if !fire_now && self.attr.lock().low_watermark > 0 {
                armed.push(Arc::downgrade(self));
            }
            fire_now
        };
        if fire_now {
            self.post_low_watermark();
        }
    }

    /// Fewer receives posted than a nonzero watermark.
    fn below_watermark(&self) -> bool {
        let lw = self.attr.lock().low_watermark;
        lw > 0 && self.srq.posted() < lw
    }

    fn post_low_watermark(&self) {
        log::debug!(
            "SRQ {:#x}: fewer than {} receives posted",
            self.handle.addr(),
            self.attr.lock().low_watermark
        );
        self.ia.post_async_reason(
            LOW_WATERMARK_EVENT,
            self.handle,
            async_reason::SRQ_LOW_WATERMARK,
        );
    }

    /// dat_srq_free: refused while an EP uses the SRQ.
    pub fn free(self: &Arc<Self>) -> DatResult<()> {
        if !handle_table::is_live(self.handle) {
            return Err(HandleKind::Srq.invalid());
        }
        if self.users.retire().is_err() {
            return Err(DatError::invalid_state(SubType::SrqInUse));
        }
        self.ia.remove(self.handle, HandleKind::Srq)?;
        self.destroy();
        Ok(())
    }

    pub(crate) fn destroy(&self) {
        ARMED
            .lock()
            .retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), self));
        self.users.force_retire();
        self.srq.destroy();
        self.pz.users.release();
    }
}
