//! A QP's way through its states (RESET, INIT, RTR, RTS, ERROR) and the wait for its
//! flush: ibv_modify_qp with the attributes each step needs.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_sys::*;

use super::{VerbsQp, FLUSH_WAIT};
use daplrs_backend::{Error, Resource, Result};

/// The receiver-not-ready NAK timer our QPs advertise, in IB's encoding: 12 is 0.64 ms. The
/// sender retries without end (`rnr_retry` 7), so a short wait costs only retries.
const MIN_RNR_TIMER: u8 = 12;

impl VerbsQp {
    /// RESET -> INIT -> RTR -> RTS for a datagram QP: the IA's port, rdma_cm's UDP Q_Key
    /// (what its address resolution tells peers), send PSN 0.
    pub(super) fn to_ud_ready(&self) -> Result<()> {
        for state in [
            ibv_qp_state::IBV_QPS_INIT,
            ibv_qp_state::IBV_QPS_RTR,
            ibv_qp_state::IBV_QPS_RTS,
        ] {
            // SAFETY: plain data.
            let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
            a.qp_state = state;
            let mut mask = ibv_qp_attr_mask::IBV_QP_STATE.0;
            if state == ibv_qp_state::IBV_QPS_INIT {
                a.pkey_index = 0;
                a.port_num = self.shared.port;
                a.qkey = RDMA_UDP_QKEY;
                mask |= ibv_qp_attr_mask::IBV_QP_PKEY_INDEX.0
                    | ibv_qp_attr_mask::IBV_QP_PORT.0
                    | ibv_qp_attr_mask::IBV_QP_QKEY.0;
            }
            if state == ibv_qp_state::IBV_QPS_RTS {
                a.sq_psn = 0;
                mask |= ibv_qp_attr_mask::IBV_QP_SQ_PSN.0;
            }
            // SAFETY: our QP.
            let rc = unsafe { ibv_modify_qp(self.qp.0, &mut a, mask as i32) };
            if rc != 0 {
                log::warn!("datagram QP {}: to state {state}: error {rc}", self.qp_num);
                return Err(Error::NoResource(Resource::Qp));
            }
        }
        Ok(())
    }

    /// RESET -> INIT, with the IA's port and every remote access the QP may be asked for.
    pub(super) fn to_init(&self) -> Result<()> {
        // SAFETY: plain data.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = self.shared.port;
        a.qp_access_flags = (ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
            | ibv_access_flags::IBV_ACCESS_REMOTE_READ.0
            | ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0) as _;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE.0
            | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX.0
            | ibv_qp_attr_mask::IBV_QP_PORT.0
            | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS.0;
        // SAFETY: our QP.
        let rc = unsafe { ibv_modify_qp(self.qp.0, &mut a, mask as i32) };
        if rc != 0 {
            log::warn!("QP {}: INIT failed: error {rc}", self.qp_num);
            return Err(Error::NoResource(Resource::Qp));
        }
        Ok(())
    }

    /// INIT -> RTR -> RTS with the path and limits rdma_cm negotiated on `id`, and our
    /// receiver-not-ready timer (`MIN_RNR_TIMER`).
    pub(crate) fn to_rts(&self, id: *mut rdma_cm_id) -> Result<(), String> {
        for state in [ibv_qp_state::IBV_QPS_RTR, ibv_qp_state::IBV_QPS_RTS] {
            // SAFETY: plain data.
            let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
            a.qp_state = state;
            let mut mask: i32 = 0;
            // SAFETY: a live cm id and our QP.
            let rc = unsafe { rdma_init_qp_attr(id, &mut a, &mut mask) };
            if rc != 0 {
                return Err(super::super::sys::os_error(
                    "rdma_init_qp_attr",
                    super::super::sys::errno(),
                ));
            }
            if state == ibv_qp_state::IBV_QPS_RTR && !self.shared.iwarp {
                // What a sender that found no receive posted waits before it sends again.
                // The kernel's CM sets 0, which IB encodes as 655 ms: one message that
                // outran the receiver's repost stalled the connection that long (a soft-RoCE
                // send_bw run at 64 in flight: 18,000 messages/s against 45,000).
                a.min_rnr_timer = MIN_RNR_TIMER;
                mask |= ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER.0 as i32;
            }
            if state == ibv_qp_state::IBV_QPS_RTS {
                a.retry_cnt = 7;
                a.rnr_retry = 7;
            }
            // SAFETY: as above.
            let rc = unsafe { ibv_modify_qp(self.qp.0, &mut a, mask) };
            if rc != 0 {
                return Err(super::super::sys::os_error("ibv_modify_qp", rc));
            }
        }
        Ok(())
    }

    /// Moves the QP to ERR: the hardware flushes every outstanding request.
    pub(crate) fn to_error(&self) {
        self.set_state(ibv_qp_state::IBV_QPS_ERR);
    }

    pub(super) fn to_reset(&self) {
        self.set_state(ibv_qp_state::IBV_QPS_RESET);
    }

    pub(super) fn set_state(&self, state: ibv_qp_state::Type) {
        // SAFETY: plain data.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = state;
        // SAFETY: our QP.
        unsafe { ibv_modify_qp(self.qp.0, &mut a, ibv_qp_attr_mask::IBV_QP_STATE.0 as i32) };
    }

    /// Waits (bounded) until the hardware has completed every request posted to the QP,
    /// reaping its CQs into their software queues; the EVDs report them afterwards.
    pub(crate) fn wait_flushed(&self, sends_only: bool) {
        let until = Instant::now() + FLUSH_WAIT;
        loop {
            let recvs = if sends_only {
                0
            } else {
                self.recvs_out.load(Ordering::SeqCst)
            };
            if self.sends_out.load(Ordering::SeqCst) == 0 && recvs == 0 {
                break;
            }
            if Instant::now() >= until {
                log::warn!(
                    "QP {}: {} sends and {} receives not completed after {:?}",
                    self.qp_num,
                    self.sends_out.load(Ordering::SeqCst),
                    recvs,
                    FLUSH_WAIT
                );
                break;
            }
            self.send_cq.reap_now();
            self.recv_cq.reap_now();
            std::thread::sleep(Duration::from_micros(200));
        }
        self.send_cq.fire();
        if !Arc::ptr_eq(&self.send_cq, &self.recv_cq) {
            self.recv_cq.fire();
        }
    }
}
