//! A work completion becomes the DAT event its request asked for: the request's tracking entry
//! (`PendingDto`, the IA's table), DAT's rules of suppressed success and notification, and
//! what the completion does to the objects it names (a failed bind's RMR, an RMR a peer
//! invalidated, an EP's receive counters, an SRQ's low watermark).
//!
//! The EVD's drain converts every completion here, inlined: the module sits below the EVD and
//! names no object above it, only what the IA keeps of them (`EpShared`, `Window`).

use super::consts::{completion_flags, dto_op, dto_status, event_number, ib_ext};
use super::counters;
use super::event::{DtoExt, Event, EventData};
use super::handle_table::Handle;
use super::ia::Ia;
use super::pending::{Carried, EpShared, PendingDto, Received};
use super::srq;
use daplrs_backend::{WcOpcode, WcStatus, WorkCompletion};

/// Ends the tracking of a completed request nobody converts (an EVD's end, a sink CQ's
/// completions): a receive of an EP's own queue gives back its record's reference to the
/// EP's `EpShared` (`Received`), a table record leaves the IA's table (`untracked`). A
/// request whose record the backend carried (`Carried`) has no more to it.
#[inline]
pub(crate) fn retire(ia: &Ia, wc: &WorkCompletion) {
    if Carried::from_ctx(&wc.ctx).is_some() {
        return;
    }
    // SAFETY: a completion is converted or retired once (an EVD's drain, a sink's, an EVD's
    // end), and the backend gives a receive's context back in one completion
    // (`RecvWr::ctx`'s contract).
    if let Some(record) = unsafe { Received::from_ctx(&wc.ctx) } {
        drop(record);
        return;
    }
    untracked(ia, wc);
}

/// The record of a completed request that waits in the IA's table (a bind, an extended
/// request, an SRQ's receive), taken out of it. Every such completion passes here, once
/// (converted or retired, those of a NULL EVD's sink CQ too), so this is where the core
/// learns that an SRQ receive was consumed and the SRQ's low watermark may have been
/// crossed.
#[inline]
fn untracked(ia: &Ia, wc: &WorkCompletion) -> Option<PendingDto> {
    let p = ia.untrack(wc.wr_id)?;
    if p.ep.is_null() && p.op == dto_op::RECEIVE {
        srq::receive_consumed();
    }
    Some(p)
}

/// The event of a send, RDMA write or RDMA read whose record came back in its completion:
/// always a notification event (only receives may be unsolicited), a DTO completion naming
/// the EP, the cookie and the operation; None when its success is not reported.
#[inline(always)]
fn carried_event(record: Carried, wc: &WorkCompletion, evd: Handle) -> Option<(Event, bool)> {
    let status = dto_status_of(wc.status);
    if status == dto_status::SUCCESS && !record.report_success {
        return None;
    }
    let transferred = if status == dto_status::SUCCESS {
        wc.byte_len
    } else {
        0
    };
    let event = Event {
        number: event_number::DTO_COMPLETION,
        evd,
        data: EventData::Dto {
            ep: record.ep,
            cookie: record.cookie,
            status,
            transferred,
            op: record.op,
            rmr_context: 0,
            ext: None,
        },
    };
    Some((event, true))
}

/// Converts a work completion into the DAT event for the EVD `evd` and whether it is a
/// notification event (see `evd`'s module notes), or None when the consumer asked not to
/// see it. Inlined into the EVD's drain, its one caller: as a call of its own it saved
/// and restored registers and passed the event (72 bytes) out through memory.
#[inline(always)]
pub(crate) fn event(ia: &Ia, wc: &WorkCompletion, evd: Handle) -> Option<(Event, bool)> {
    if let Some(record) = Carried::from_ctx(&wc.ctx) {
        return carried_event(record, wc, evd);
    }
    recorded_event(ia, wc, evd)
}

/// The event of a receive of an EP's own queue, whose record came back in its completion
/// (`Received`): no table and no `PendingDto` on the way (through a `PendingDto`, a send
/// ping-pong's receive cost 200 instructions here; this way, 134: bench-cost, per function).
#[inline(always)]
fn received_event(
    ia: &Ia,
    record: Received,
    wc: &WorkCompletion,
    evd: Handle,
) -> Option<(Event, bool)> {
    let status = dto_status_of(wc.status);
    if status == dto_status::SUCCESS && !record.report_success {
        return None;
    }
    let notify = notifies(ia, wc, Some(&record.shared));
    if status == dto_status::SUCCESS {
        count_receive(ia, wc, record.op, Some(&record.shared));
    }
    let kind = dto_kind(ia, wc, status, record.op, record.ext);
    let event = dto_event(evd, record.shared.handle, record.cookie, wc, status, kind);
    Some((event, notify))
}

/// `event` for a completion whose record is not `Carried`: a receive of an EP's own queue
/// (`Received`), or a `PendingDto` of the IA's table (an SRQ's receive, a bind, an extended
/// request). A call of its own: inlined, its drops and branches cost the drain of every
/// send, write and read's completion about 15 instructions (cost guard: a same-host read);
/// the receive's check inlined cost a blocking read's 5.
#[inline(never)]
fn recorded_event(ia: &Ia, wc: &WorkCompletion, evd: Handle) -> Option<(Event, bool)> {
    // SAFETY: a completion is converted or retired once (see `retire`).
    if let Some(record) = unsafe { Received::from_ctx(&wc.ctx) } {
        return received_event(ia, record, wc, evd);
    }
    let pending = untracked(ia, wc)?;
    let status = dto_status_of(wc.status);
    if status == dto_status::SUCCESS && !pending.report_success {
        return None;
    }
    let notify = notifies(ia, wc, None);
    // A bind is known by its tracking entry, not by the completion's opcode: verbs leaves
    // the opcode of a failed or flushed completion undefined.
    if let Some((rmr, rmr_context)) = pending.rmr.as_ref() {
        if status != dto_status::SUCCESS {
            rmr.bind_failed(*rmr_context);
        }
        let event = Event {
            number: event_number::RMR_BIND_COMPLETION,
            evd,
            data: EventData::RmrBind {
                rmr: rmr.handle(),
                cookie: pending.cookie,
                status,
            },
        };
        return Some((event, notify));
    }
    let ep = if pending.ep.is_null() {
        ia.ep_shared_by_qp(wc.qp_num)
            .map(|e| e.handle)
            .unwrap_or(Handle::NULL)
    } else {
        pending.ep
    };
    if status == dto_status::SUCCESS {
        count_receive(ia, wc, pending.op, None);
    }
    let kind = dto_kind(ia, wc, status, pending.op, pending.ext);
    Some((dto_event(evd, ep, pending.cookie, wc, status, kind), notify))
}

/// What a DTO completion's event says beyond its record: its number, operation, extension
/// data and the RMR context a peer's send-with-invalidate ended the binding of (0 for none).
struct DtoKind {
    number: u32,
    op: u32,
    ext: Option<DtoExt>,
    invalidated: u32,
}

/// The `DtoKind` of a completed request of operation `op` (and DAT_IB_EXT_TYPE `ext`, for an
/// extended request or a datagram receive). A receive a peer's send-with-invalidate consumed
/// ends that binding of one of our RMRs here.
#[inline(always)]
fn dto_kind(ia: &Ia, wc: &WorkCompletion, status: u32, op: u32, ext: Option<u32>) -> DtoKind {
    let (op, invalidated) = match wc.invalidated {
        Some(ctx) if status == dto_status::SUCCESS => {
            if let Some(rmr) = ia.rmr_by_context(ctx) {
                rmr.bind_failed(ctx);
            }
            (dto_op::RECEIVE_WITH_INVALIDATE, ctx)
        }
        _ => (op, 0),
    };
    // An extended request, or a receive the peer's write-with-immediate consumed, is a
    // DAT_IB_DTO_EVENT carrying its extension data; everything else a DTO completion.
    let (number, op, ext) = match (ext, wc.imm) {
        (Some(kind), _) => (ib_ext::DTO_EVENT, op, Some(DtoExt { kind, imm: 0 })),
        (None, Some(imm)) if wc.opcode == WcOpcode::RecvRdmaImm => (
            ib_ext::DTO_EVENT,
            ib_ext::DTO_RECV_IMMED,
            Some(DtoExt {
                kind: ib_ext::TYPE_RDMA_WRITE_IMMED_DATA,
                imm,
            }),
        ),
        _ => (event_number::DTO_COMPLETION, op, None),
    };
    DtoKind {
        number,
        op,
        ext,
        invalidated,
    }
}

/// The DTO event of a completion with DAT status `status` for EP `ep`'s request `cookie`.
#[inline(always)]
fn dto_event(
    evd: Handle,
    ep: Handle,
    cookie: u64,
    wc: &WorkCompletion,
    status: u32,
    kind: DtoKind,
) -> Event {
    let transferred = if status == dto_status::SUCCESS {
        wc.byte_len
    } else {
        0
    };
    Event {
        number: kind.number,
        evd,
        data: EventData::Dto {
            ep,
            cookie,
            status,
            transferred,
            op: kind.op,
            rmr_context: kind.invalidated,
            ext: kind.ext,
        },
    }
}

/// Whether a work completion's event is a notification event (see `evd`'s module rules):
/// not for a successful receive of an EP whose recv_completion_flags ask for
/// DAT_COMPLETION_SOLICITED_WAIT_FLAG when the peer's send did not ask for solicited
/// notification. The EP's flags are read without its lock (drains run under EP locks):
/// through `ep`, the receive's record's, or for an SRQ's receive through the QP it reached.
fn notifies(ia: &Ia, wc: &WorkCompletion, ep: Option<&EpShared>) -> bool {
    if wc.solicited
        || wc.status != WcStatus::Success
        || !matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaImm)
    {
        return true;
    }
    let flags = match ep {
        Some(shared) => shared.recv_completion_flags(),
        None => match ia.ep_shared_by_qp(wc.qp_num) {
            Some(ep) => ep.recv_completion_flags(),
            None => return true,
        },
    };
    flags & completion_flags::SOLICITED_WAIT == 0
}

/// Counts a successful receive on its EP: DCNT_EP_RECV (or _RECV_UD, _RECV_RDMA_IMM) and its
/// bytes, for a request of operation `op`. An EP's own receive names its counters (`ep`); an
/// SRQ's is known by the QP it reached.
#[inline(always)]
fn count_receive(ia: &Ia, wc: &WorkCompletion, op: u32, ep: Option<&EpShared>) {
    if op != dto_op::RECEIVE && op != ib_ext::DTO_RECV_UD {
        return;
    }
    let counter = if wc.opcode == WcOpcode::RecvRdmaImm {
        counters::ep::RECV_RDMA_IMM
    } else if op == ib_ext::DTO_RECV_UD {
        counters::ep::RECV_UD
    } else {
        counters::ep::RECV
    };
    match ep {
        Some(shared) => shared.count(counter, u64::from(wc.byte_len)),
        None => {
            if let Some(e) = ia.ep_shared_by_qp(wc.qp_num) {
                e.count(counter, u64::from(wc.byte_len));
            }
        }
    }
}

/// Maps a backend completion status onto DAT_DTO_COMPLETION_STATUS.
pub(crate) fn dto_status_of(s: WcStatus) -> u32 {
    match s {
        WcStatus::Success => dto_status::SUCCESS,
        WcStatus::Flushed => dto_status::FLUSHED,
        WcStatus::LocalLength => dto_status::LOCAL_LENGTH,
        WcStatus::LocalQpOp => dto_status::LOCAL_EP,
        WcStatus::LocalProtection => dto_status::LOCAL_PROTECTION,
        WcStatus::MwBind => dto_status::RMR_OPERATION_FAILED,
        WcStatus::BadResponse => dto_status::BAD_RESPONSE,
        WcStatus::RemoteAccess => dto_status::REMOTE_ACCESS,
        WcStatus::RemoteInvalidRequest | WcStatus::RemoteOp => dto_status::REMOTE_RESPONDER,
        WcStatus::Transport => dto_status::TRANSPORT,
        WcStatus::ReceiverNotReady => dto_status::RECEIVER_NOT_READY,
    }
}
