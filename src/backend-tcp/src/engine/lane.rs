//! A connected QP's same-host lane: its RDMA reads and writes, and its sends and writes with
//! immediate placed in the peer's receives, done on the posting thread without the engine's
//! lock.
//!
//! Every post of an IA took the engine's one mutex, so threads posting on different EPs of one
//! IA took turns (docs/architecture.md, "rs-tcp's engine lock"). A same-host RDMA read or
//! write needs nothing of the engine once the engine has found that the QP may do it inline
//! (`Engine::try_same_host`): the QP connected, nothing of it waiting in the engine, the
//! peer's key table attached. The engine then opens the lane with what such a post needs,
//! and closes it wherever one of those stops holding: a request joins the QP's outstanding or
//! fenced ones, the QP is flushed (every way out of Connected goes through `flush_qp`), the QP
//! is reset, a post goes to the engine. A post that finds the lane closed, or that the lane
//! cannot do inline (a refusal of the peer's table goes over TCP, where the target reports
//! it), goes to the engine as before, which may open the lane again.
//!
//! A send (or write with immediate) placed in the peer's published receive also needs the
//! index of the peer's receive it consumes, and its PLACED frame written into the peer's ring
//! in order with the other frames that consume receives. While the connection's frames go
//! through that ring, the lane holds the ring and the next index (`Sends`), which it gives
//! back to the engine when it closes. Every frame that consumes a receive comes from one of
//! the QP's posts, so with the lane open only the lane writes them; the engine's other frames
//! (answers, doorbells) may interleave with its PLACED frames, never inside one: both write
//! under the ring's writer turn, and the lane writes only when the engine's output to that
//! ring is all written (`WriterTurn::engine_behind`), else leaves the post to the engine.
//!
//! Lock order: the engine, then a lane, then the ring's writer turn, then the key registry and
//! the peer's table mutex. A lane's post holds its mutex across the copy, the PLACED frame and
//! the completion's queueing and takes no engine lock, so closing the lane waits for a post
//! under way: a request the engine starts after that completes after it, as the QP's order
//! requires.

use super::super::samehost::{self as shm, peer_table::PeerTable, ring::Ring};
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
    sends: Option<Sends>,
}

/// What a send placed in the peer's receive needs: the peer's ring, which our frames go
/// through, and the connection's index of the peer's next receive (the QP's `sent_to_recvs`
/// while the lane is open).
pub(super) struct Sends {
    pub ring: Arc<Ring>,
    pub next_recv: u64,
}

impl Lane {
    /// Does `wr` inline if the lane is open and the peer's table allows it: returns the CQ
    /// its completion was queued on, for the caller to notify with no lock held. None: the
    /// request is the engine's.
    pub(crate) fn post(&self, sh: &Shared, wr: &SendWr) -> Option<Arc<Completions>> {
        let mut open = self.open.lock();
        let o = open.as_mut()?;
        let total = match wr.op {
            SendOp::Send | SendOp::RdmaWriteImm { .. } => {
                send_on_lane(sh, &o.peer, o.pd, o.sends.as_mut()?, wr)?
            }
            _ => rdma_inline(sh, &o.peer, o.pd, wr)?,
        };
        o.cq.push(
            WorkCompletion::new(wr.wr_id, WcStatus::Success, wr.op.opcode(), total, o.qp)
                .with_ctx(wr.ctx),
        );
        Some(o.cq.clone())
    }

    pub(super) fn open(
        &self,
        peer: Arc<PeerTable>,
        pd: u32,
        cq: Arc<Completions>,
        qp: u32,
        sends: Option<Sends>,
    ) {
        *self.open.lock() = Some(Open {
            peer,
            pd,
            cq,
            qp,
            sends,
        });
    }

    /// Waits for a post under way, after which every post goes to the engine. Returns the
    /// index of the peer's next receive if the lane had the QP's sends: the engine's
    /// `sent_to_recvs` from then on.
    #[must_use]
    pub(super) fn close(&self) -> Option<u64> {
        let open = self.open.lock().take()?;
        open.sends.map(|s| s.next_recv)
    }
}

/// A send or write with immediate of `wr` placed in the peer's next receive and its PLACED
/// frame written, under the ring's writer turn: the frame must follow the placement, so the
/// lane declines (None, nothing done) unless the frame fits and the engine's output is all
/// written. Returns the bytes moved.
fn send_on_lane(
    sh: &Shared,
    peer: &PeerTable,
    pd: u32,
    sends: &mut Sends,
    wr: &SendWr,
) -> Option<u32> {
    let ring = &sends.ring;
    let mut turn = ring.writer_turn();
    if turn.engine_behind || !ring.has_room_for(wire::HEADER_LEN) {
        return None;
    }
    let (total, placed) = send_inline(sh, peer, ring, pd, sends.next_recv, wr)?;
    sends.next_recv += 1;
    let frame = placed.encode();
    // Room only grows under the turn; a write refused now is a peer that broke the ring's
    // positions, which the engine's next write finds and reports as the connection's loss.
    if !ring
        .write(&[std::io::IoSlice::new(&frame)])
        .is_ok_and(|n| n == frame.len())
    {
        turn.engine_behind = true;
    }
    drop(turn);
    if ring.reader_needs_bell(POLL_LEASE) {
        ring.ring_bell();
    }
    Some(total)
}

/// A send or write with immediate of `wr` done here, now, into the peer's published receive
/// `k` of `ring` (a send's data placed in the receive, a write's where its rkey names, the
/// receive taken), checked against our registry under `pd` and the peer's table. Returns the
/// bytes moved and the PLACED frame that tells the peer; None when nothing was done (no
/// receive published, a refusal, a failure): the request then goes through the ring as
/// before, which also produces every error.
pub(super) fn send_inline(
    sh: &Shared,
    peer: &PeerTable,
    ring: &Ring,
    pd: u32,
    k: u64,
    wr: &SendWr,
) -> Option<(u32, Header)> {
    let write = match wr.op {
        SendOp::Send => None,
        SendOp::RdmaWriteImm {
            remote_addr,
            rkey,
            imm,
        } => Some((remote_addr, rkey, imm)),
        _ => return None,
    };
    let recv = ring.published_recv(k)?;
    let keys = sh.keys.read();
    let ranges = keys.local_ranges(&wr.sgl, pd, false).ok()?;
    let total: u64 = ranges.iter().map(|&(_, n)| n as u64).sum();
    if total > u64::from(sh.limits.max_message) {
        return None;
    }
    let how = match write {
        None => peer.place(&keys, ring, k, &recv, &ranges, wr.solicited),
        Some((addr, rkey, imm)) => {
            let need = daplrs_backend::access::REMOTE_WRITE;
            match peer.transfer(&keys, rkey, addr, need, &ranges, true) {
                // The write's data is there: the receive is taken to report it (a withdrawn
                // one reports nothing: the peer's QP is gone).
                moved if moved.done() => {
                    let placed = shm::ring::Placement {
                        len: total as u32,
                        imm: Some(imm),
                        solicited: wr.solicited,
                    };
                    let _ = peer.take(ring, k, placed);
                    moved
                }
                not => not,
            }
        }
    };
    drop(keys);
    if !how.done() {
        return None;
    }
    shm::count_inline(&sh.samehost.stats, how);
    let mut h = Header::new(Kind::Placed);
    h.addr = k;
    h.length = total as u32;
    if wr.solicited {
        h.flags = wire::FLAG_SOLICITED;
    }
    if let Some((_, _, imm)) = write {
        h.flags |= wire::FLAG_IMMEDIATE;
        h.key = imm;
    }
    Some((total as u32, h))
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
    let keys = sh.keys.read();
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
