//! The InfiniBand extensions of DAT 2.0 (OFED's interface 2.0.9, reached through
//! dat_extension_op): RDMA write with immediate data, 64-bit fetch-and-add and
//! compare-and-swap, and the operation counters.
//!
//! The rules follow the base operations they extend: the request-queue, flag and local-IOV
//! checks of dat_ep_post_rdma_write / dat_ep_post_rdma_read, completion through the EP's
//! request EVD, exactly once. What differs is how a completion is reported: as a
//! DAT_IB_DTO_EVENT whose extension data names the operation (see `completion::event`), and, for a
//! write with immediate data, a receive consumed at the target that reports the data.

use super::consts::{completion_flags, ib_ext, mem_priv};
use super::counters;
use super::ep::{Ep, RemoteBuffer};
use super::error::{DatError, DatResult, Param};
use super::handle::Object;
use super::pending::PendingDto;
use daplrs_backend::{SendOp, SendWr, Sge, WrContext};

/// The two 64-bit atomics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Atomic {
    FetchAdd { add: u64 },
    CmpSwap { compare: u64, swap: u64 },
}

impl Ep {
    /// dat_ib_post_rdma_write_immed. Writes the IOV to the remote buffer, then
    /// consumes one receive at the peer, which completes with `imm` and the write's length.
    pub fn post_rdma_write_immed(
        &self,
        iov: &[Sge],
        cookie: u64,
        remote: RemoteBuffer,
        imm: u32,
        flags: u32,
    ) -> DatResult<()> {
        // Not on this device (iWARP has no immediate data): DAT_NOT_IMPLEMENTED, as for an
        // extension the provider does not have; DAT_IB_ATTR_IMMED_DATA is not reported.
        if !self.ia().device().attr().write_imm {
            return Err(DatError::not_implemented());
        }
        let (pz, qp) = self.request_common(flags, iov.len(), |a| a.max_rdma_write_iov)?;
        let (sgl, total) = self.ia().lmrs.check_iov(pz, iov, mem_priv::LOCAL_READ)?;
        if total > u64::from(self.ia().max_rdma_size) || total > u64::from(remote.length) {
            return Err(DatError::length());
        }
        self.post_tracked(
            Some(qp),
            &mut SendWr {
                wr_id: 0,
                ctx: WrContext::NONE,
                op: SendOp::RdmaWriteImm {
                    remote_addr: remote.address,
                    rkey: remote.rmr_context,
                    imm,
                },
                sgl,
                signaled: Self::report_success(flags),
                solicited: flags & completion_flags::SOLICITED_WAIT != 0,
                fence: flags & completion_flags::BARRIER_FENCE != 0,
            },
            PendingDto {
                ep: self.handle(),
                cookie,
                op: ib_ext::DTO_RDMA_WRITE_IMMED,
                report_success: Self::report_success(flags),
                rmr: None,
                ext: Some(ib_ext::TYPE_RDMA_WRITE_IMMED),
            },
        )?;
        self.count_post(counters::ep::POST_WRITE_IMM, total);
        Ok(())
    }

    /// dat_ib_post_fetch_and_add / dat_ib_post_cmp_and_swap. The 64-bit word at the remote address (naturally aligned, in an RMR or
    /// LMR granting DAT_IB_MEM_PRIV_REMOTE_ATOMIC) is updated atomically with respect to every
    /// other atomic on it, and its previous value lands in the one 8-byte local segment.
    pub fn post_atomic(
        &self,
        op: Atomic,
        local: &Sge,
        cookie: u64,
        remote: RemoteBuffer,
        flags: u32,
    ) -> DatResult<()> {
        // Not on this device (siw and most iWARP NICs): DAT_NOT_IMPLEMENTED, and the
        // DAT_IB_ATTR_FETCH_AND_ADD / CMP_AND_SWAP attributes are not reported.
        if !self.ia().device().attr().atomics {
            return Err(DatError::not_implemented());
        }
        let (pz, qp) = self.request_common(flags, 1, |a| a.max_rdma_read_iov)?;
        let (sgl, total) =
            self.ia()
                .lmrs
                .check_iov(pz, std::slice::from_ref(local), mem_priv::LOCAL_WRITE)?;
        if total != 8 {
            return Err(DatError::length());
        }
        // The target word must be naturally aligned; known here, so refused here, on every
        // backend alike (a NIC refuses it at post or fails it at the target).
        if !remote.address.is_multiple_of(8) {
            return Err(DatError::bad(Param::RemoteIov));
        }
        let (send_op, dto, kind, counter) = match op {
            Atomic::FetchAdd { add } => (
                SendOp::FetchAdd {
                    remote_addr: remote.address,
                    rkey: remote.rmr_context,
                    add,
                },
                ib_ext::DTO_FETCH_ADD,
                ib_ext::TYPE_FETCH_AND_ADD,
                counters::ep::POST_FETCH_ADD,
            ),
            Atomic::CmpSwap { compare, swap } => (
                SendOp::CmpSwap {
                    remote_addr: remote.address,
                    rkey: remote.rmr_context,
                    compare,
                    swap,
                },
                ib_ext::DTO_CMP_SWAP,
                ib_ext::TYPE_CMP_AND_SWAP,
                counters::ep::POST_CMP_SWAP,
            ),
        };
        self.post_tracked(
            Some(qp),
            &mut SendWr {
                wr_id: 0,
                ctx: WrContext::NONE,
                op: send_op,
                sgl,
                signaled: Self::report_success(flags),
                solicited: false,
                fence: flags & completion_flags::BARRIER_FENCE != 0,
            },
            PendingDto {
                ep: self.handle(),
                cookie,
                op: dto,
                report_success: Self::report_success(flags),
                rmr: None,
                ext: Some(kind),
            },
        )?;
        self.shared.counters.inc(counter);
        Ok(())
    }
}

/// The counters of an IA, EP or EVD (dat_query_counters): all of them when `counter` is the
/// kind's DCNT_*_ALL_COUNTERS, else the one it names; what was read is zeroed when `reset`.
/// None for objects without counters and for counters out of range.
pub fn query_counters(object: &Object, counter: usize, reset: bool) -> Option<Vec<u64>> {
    let c = match object {
        Object::Ia(ia) => {
            ia.sync_device_counters();
            &ia.counters
        }
        Object::Ep(ep) => &ep.shared.counters,
        Object::Evd(evd) => &evd.counters,
        _ => return None,
    };
    let mut all = c.snapshot(reset);
    if let Object::Evd(_) = object {
        // Every dequeue finds or does not (`Evd::dequeue_into`): its own count is their sum,
        // not a third increment on each call.
        use super::counters::evd;
        all[evd::DEQUEUE] = all[evd::DEQUEUE_FOUND] + all[evd::DEQUEUE_NOT_FOUND];
    }
    match counter {
        n if n == all.len() => Some(all),
        n if n < all.len() => Some(vec![all[n]]),
        _ => None,
    }
}

/// Names of the counters, for dat_print_counters.
pub fn counter_owner_name(object: &Object) -> &'static str {
    match object {
        Object::Ia(_) => "IA",
        Object::Ep(_) => "EP",
        Object::Evd(_) => "EVD",
        _ => "?",
    }
}
