//! A connected QP's same-host lane: its RDMA reads and writes done on the posting thread
//! without the engine's lock.
//!
//! Every post of an IA took the engine's one mutex, so threads posting on different EPs of one
//! IA took turns (docs/architecture.md, "rs-tcp's engine lock"). A same-host RDMA read or
//! write needs nothing of the engine once the engine has found that the QP may do it inline
//! (`Engine::try_same_host`): the QP connected, nothing of it waiting in the engine, the
//! peer's key table attached. The engine then opens the lane with what such a post needs,
//! and closes it wherever one of those stops holding: a request joins the QP's outstanding or
//! fenced ones, the QP is flushed (every way out of Connected goes through `flush_qp`), the QP
//! is reset. A post that finds the lane closed, or that the lane cannot do inline (a refusal
//! of the peer's table goes over TCP, where the target reports it), goes to the engine as
//! before, which may open the lane again.
//!
//! Lock order: the engine, then a lane, then the key registry and the peer's table mutex. A
//! lane's post holds its mutex across the copy and the completion's queueing and takes no
//! engine lock, so closing the lane waits for a post under way: a request the engine starts
//! after that completes after it, as the QP's order requires.

use super::super::samehost::{self as shm, peer_table::PeerTable};
use super::*;

#[derive(Default)]
pub(crate) struct Lane {
    open: parking_lot::Mutex<Option<Open>>,
}

/// What an inline post needs, taken from the engine when it opened the lane.
struct Open {
    peer: Arc<PeerTable>,
    pd: u32,
    cq: Arc<Completions>,
    qp: u32,
}

impl Lane {
    /// Does `wr` inline if the lane is open and the peer's table allows it: returns the CQ
    /// its completion was queued on, for the caller to notify with no lock held. None: the
    /// request is the engine's.
    pub(crate) fn post(&self, sh: &Shared, wr: &SendWr) -> Option<Arc<Completions>> {
        let open = self.open.lock();
        let o = open.as_ref()?;
        let total = rdma_inline(sh, &o.peer, o.pd, wr)?;
        o.cq.push(WorkCompletion::new(
            wr.wr_id,
            WcStatus::Success,
            wr.op.opcode(),
            total,
            o.qp,
        ));
        Some(o.cq.clone())
    }

    pub(super) fn open(&self, peer: Arc<PeerTable>, pd: u32, cq: Arc<Completions>, qp: u32) {
        *self.open.lock() = Some(Open { peer, pd, cq, qp });
    }

    /// Waits for a post under way, after which every post goes to the engine.
    pub(super) fn close(&self) {
        self.open.lock().take();
    }
}

/// An RDMA read or write of `wr` done here, now, between our segments (checked against our
/// registry under `pd`) and the peer's memory (checked against its table as its own target
/// would: samehost/peer_table.rs `PeerTable::transfer`). Returns the bytes moved; None when it was
/// not done (not an RDMA read or write, a refusal, a failure), nothing being completed then.
pub(super) fn rdma_inline(sh: &Shared, peer: &PeerTable, pd: u32, wr: &SendWr) -> Option<u32> {
    let (remote_addr, rkey, need, write) = match wr.op {
        SendOp::RdmaRead { remote_addr, rkey } => (
            remote_addr,
            rkey,
            daplrs_backend::access::REMOTE_READ,
            false,
        ),
        SendOp::RdmaWrite { remote_addr, rkey } => (
            remote_addr,
            rkey,
            daplrs_backend::access::REMOTE_WRITE,
            true,
        ),
        _ => return None,
    };
    let keys = sh.keys.lock();
    // A read writes our segments; a write reads them.
    let ranges = keys.local_ranges(&wr.sgl, pd, !write).ok()?;
    let total: u64 = ranges.iter().map(|&(_, n)| n as u64).sum();
    if total > u64::from(sh.limits.max_message) {
        return None;
    }
    let how = peer.transfer(&keys, rkey, remote_addr, need, &ranges, write);
    drop(keys);
    if !how.done() {
        return None;
    }
    shm::count_inline(&sh.samehost.stats, how);
    Some(total as u32)
}
