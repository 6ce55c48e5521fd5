//! What a QP holds in its CQs: room that grows with what it has outstanding, and the
//! completions the consumer may be owed (`VerbsCq::bound`).

use std::sync::atomic::{AtomicU32, Ordering};

use super::super::cq::VerbsCq;
use daplrs_backend::{QpCap, Result};

/// The CQ entries a new QP adds to each of its CQs; `reserve` adds more as its requests
/// outstanding grow.
pub(super) const FIRST_ROOM: u32 = 1;

/// Makes `room` (the entries a QP has added to `cq`) at least `need` requests outstanding: a
/// QP never has more completions in its CQ than requests outstanding, so the CQ, holding the
/// room of every QP it serves, cannot overflow. Inlined: nearly every post finds the room it
/// needs made already (one load and a compare); `grow` makes more.
#[inline(always)]
pub(super) fn reserve(cq: &VerbsCq, room: &AtomicU32, need: u32, cap: u32) -> Result<()> {
    if need <= room.load(Ordering::SeqCst) {
        return Ok(());
    }
    grow(cq, room, need, cap)
}

/// `reserve` when the room must grow: by doubling, at most to `cap` (the queue's depth),
/// resizing the CQ only when it is too small.
#[inline(never)]
fn grow(cq: &VerbsCq, room: &AtomicU32, need: u32, cap: u32) -> Result<()> {
    loop {
        let cur = room.load(Ordering::SeqCst);
        if need <= cur {
            return Ok(());
        }
        let new = cur.saturating_mul(2).min(cap).max(need);
        cq.attach(new - cur, new - cur)?;
        if room
            .compare_exchange(cur, new, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            return Ok(());
        }
        cq.detach(new - cur, new - cur);
    }
}

/// The most completions a QP's send queue may give its CQ (`VerbsCq::bound`): its room,
/// which grows as it posts; or, where CQs cannot grow and the room is every piece a split
/// read may take, its depth in the consumer's requests.
pub(super) fn send_bound(cq_resize: bool, send_room: u32, cap: &QpCap) -> u32 {
    if cq_resize {
        send_room
    } else {
        cap.max_send_wr
    }
}

/// The same for its receives: its room, or none for a QP of an SRQ, whose room is the SRQ's
/// whole depth for each of its QPs though all of them together take no more than it holds
/// (counted once per QP, EPs sharing an SRQ and an EVD would make every completion raise an
/// event). An overrun through an SRQ is found when the EVD is next read.
pub(super) fn recv_bound(of_srq: bool, recv_room: u32) -> u32 {
    if of_srq {
        0
    } else {
        recv_room
    }
}
