//! The ibverbs backend: the verbs-shaped traits on a real RDMA device (rdma-sys), connections
//! through rdma_cm.
//!
//! IA = device + port; its address is the IPv4 address of the port's network interface.
//! PZ = PD, LMR = MR (lmr_context = lkey, rmr_context = rkey), RMR = type 2 memory window bound
//! by a work request, EVD = CQ (plus a software queue, see `cq.rs`), EP = RC QP, SRQ = SRQ.
//! The NIC serves the target side of RDMA: no thread moves data.
//!
//! One event thread per IA (events.rs) waits (poll(2), never spinning) on three descriptors:
//! the IA's completion channel (it acknowledges and re-arms the CQ, then lets the CQ's
//! consumer reap it), the IA's rdma_cm event channel (connection events, acknowledged before
//! they are handled so that handlers may destroy ids), and the device's asynchronous event
//! descriptor (QP fatal errors become broken connections).
//!
//! This crate implements the contract of `daplrs-backend` and depends on nothing else of the
//! provider: it cannot name a DAT type.
#![deny(unsafe_op_in_unsafe_fn)]

mod ah;
mod cm;
mod cm_state;
mod cq;
mod device;
mod events;
mod fault;
mod mem;
mod qp;
mod sink;
mod srq;
mod sys;

pub use device::{diagnose, VerbsDevice};

use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Weak;

use parking_lot::Mutex;
use rdma_sys::*;

use cm_state::CmState;
use daplrs_backend::intmap::IntMap;
use daplrs_backend::{CmEvent, CmHandler, DeviceAttr};
use sys::Ptr;

/// Marks a receive's wr_id, so a completion says which queue it came from even when its
/// opcode is undefined (failed and flushed completions). The core's ids never reach it.
const RECV_BIT: u64 = 1 << 63;
/// Marks a request the backend posts for itself (the invalidation before a window is bound
/// again): its completion is accounted for and never reaches the core.
const INTERNAL_BIT: u64 = 1 << 62;
/// With INTERNAL_BIT: a piece of a split read (`VerbsQp::post_split_read`) other than its
/// last; the low bits number it.
const SPLIT_BIT: u64 = 1 << 61;

/// What happens on the event thread for work found elsewhere.
enum Deferred {
    /// A connection event to hand to the core.
    Event(CmEvent),
    /// The QP failed (an error completion or a fatal async event): break its connection.
    Break(u32),
}

/// A CQ on the IA's completion channel (cq.rs `VerbsCq`), as `Shared` finds it by the id
/// its hardware CQ carries: what a completion event does to it (cq.rs `completion_events`).
/// The IA's state holds its CQs through this, and so names no type above it.
pub(crate) trait ChannelCq: Send + Sync {
    /// Arms the CQ for its next event if its completions must raise events.
    fn rearm(&self);
    /// Tells the consumer there may be completions.
    fn fire(&self);
}

pub(crate) struct Shared {
    name: String,
    addr: Ipv4Addr,
    port: u8,
    ctx: Ptr<ibv_context>,
    attr: DeviceAttr,
    max_inline: u32,
    mw_type2: bool,
    /// Where an RDMA read's response lands: on iWARP its sink's STag goes to the peer in
    /// the read request (sink.rs).
    read_sink: sink::ReadSink,
    /// The device checks a region's remote read right when a peer reads it. siw does not:
    /// it sends a read response from any region of the QP's PD whose STag the request names
    /// (siw_qp_tx.c checks the source with no access bits). See `mem.rs` for what we do there.
    checks_remote_read: bool,
    /// The segments one RDMA read takes on the device (`read_sge_limit`); on iWARP a read with
    /// more is split (`VerbsQp::post_split_read`).
    read_sge_limit: u32,
    /// An iWARP device: connections are TCP streams with MPA (see `cm.rs` for how their
    /// failures read).
    iwarp: bool,
    /// The device refuses receives with no segment (libsiw): see `srq::recv_sges`.
    recv_needs_sge: bool,
    /// The device resizes CQs (ibv_resize_cq); siw does not (see `cq::NO_RESIZE_CQE`).
    cq_resize: bool,
    /// The CQ `probe_cq_resize` made, kept until the device closes (null if none).
    probe_cq: Ptr<ibv_cq>,
    comp_channel: Ptr<ibv_comp_channel>,
    cm_channel: Ptr<rdma_event_channel>,
    wake: OwnedFd,
    cm_handler: Mutex<Option<CmHandler>>,
    deferred: Mutex<Vec<Deferred>>,
    /// The IA's CQs by id (their hardware CQ's context), for their channel's events.
    cqs: Mutex<IntMap<u64, Weak<dyn ChannelCq>>>,
    cm: Mutex<CmState>,
    closing: AtomicBool,
    /// The device failed or was removed (fault.rs).
    lost: AtomicBool,
    next_id: AtomicU64,
    /// Threads sleeping on the completion channel in `VerbsCq::drive`.
    drivers: AtomicU32,
}

impl Shared {
    /// Reads with more segments than the device reads into are split (iWARP: reads complete
    /// in order there, which the split relies on; see `VerbsQp::post_split_read`).
    fn splits_reads(&self) -> bool {
        self.iwarp && self.read_sge_limit < self.attr.max_sge
    }

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn defer(&self, d: Deferred) {
        self.deferred.lock().push(d);
        self.kick();
    }

    fn defer_event(&self, ev: CmEvent) {
        self.defer(Deferred::Event(ev));
    }

    fn defer_break(&self, qp_num: u32) {
        self.defer(Deferred::Break(qp_num));
    }

    /// Wakes the event thread.
    fn kick(&self) {
        sys::eventfd_signal(&self.wake);
    }

    /// Hands a connection event to the core (on the event thread, holding no lock of ours).
    fn emit(&self, ev: CmEvent) {
        let h = self.cm_handler.lock().clone();
        if let Some(h) = h {
            h(ev);
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: every CQ and CM id of the channels is gone (each holds an Arc to us); the
        // probe CQ is ours alone.
        unsafe {
            if !self.probe_cq.0.is_null() {
                ibv_destroy_cq(self.probe_cq.0);
            }
            rdma_destroy_event_channel(self.cm_channel.0);
            ibv_destroy_comp_channel(self.comp_channel.0);
        }
    }
}
