//! The IA's state (`Shared`), which its objects, its connection manager and its event
//! thread hold: the device context and what it offers, the IA's channels (completions,
//! rdma_cm events, the event thread's wake-up), the work left for the event thread
//! (`Deferred`), its CQs by id (`ChannelCq`) and its rdma_cm ids (cm_state.rs).
//!
//! It names none of the objects that hold it: the process's QPs are qp.rs's (`all_qps`), a
//! completion event is cq.rs's (`completion_events`), and the CQs are held here through
//! `ChannelCq`.

use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Weak;

use parking_lot::Mutex;
use rdma_sys::*;

use super::cm_state::CmState;
use super::sink;
use super::sys::{self, Ptr};
use daplrs_backend::intmap::IntMap;
use daplrs_backend::{CmEvent, CmHandler, DeviceAttr};

/// What happens on the event thread for work found elsewhere.
pub(crate) enum Deferred {
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

/// The IA's state: one per `VerbsDevice`, held by each of its objects and its event thread.
pub(crate) struct Shared {
    pub(crate) name: String,
    pub(crate) addr: Ipv4Addr,
    pub(crate) port: u8,
    pub(crate) ctx: Ptr<ibv_context>,
    pub(crate) attr: DeviceAttr,
    pub(crate) max_inline: u32,
    pub(crate) mw_type2: bool,
    /// Where an RDMA read's response lands: on iWARP its sink's STag goes to the peer in
    /// the read request (sink.rs).
    pub(crate) read_sink: sink::ReadSink,
    /// The device checks a region's remote read right when a peer reads it. siw does not:
    /// it sends a read response from any region of the QP's PD whose STag the request names
    /// (siw_qp_tx.c checks the source with no access bits). See `mem.rs` for what we do there.
    pub(crate) checks_remote_read: bool,
    /// The segments one RDMA read takes on the device (`read_sge_limit`); on iWARP a read with
    /// more is split (`VerbsQp::post_split_read`).
    pub(crate) read_sge_limit: u32,
    /// An iWARP device: connections are TCP streams with MPA (see `cm.rs` for how their
    /// failures read).
    pub(crate) iwarp: bool,
    /// The device refuses receives with no segment (libsiw): see `srq::recv_sges`.
    pub(crate) recv_needs_sge: bool,
    /// The device resizes CQs (ibv_resize_cq); siw does not (see `cq::NO_RESIZE_CQE`).
    pub(crate) cq_resize: bool,
    /// The CQ `probe_cq_resize` made, kept until the device closes (null if none).
    pub(crate) probe_cq: Ptr<ibv_cq>,
    pub(crate) comp_channel: Ptr<ibv_comp_channel>,
    pub(crate) cm_channel: Ptr<rdma_event_channel>,
    pub(crate) wake: OwnedFd,
    pub(crate) cm_handler: Mutex<Option<CmHandler>>,
    pub(crate) deferred: Mutex<Vec<Deferred>>,
    /// The IA's CQs by id (their hardware CQ's context), for their channel's events.
    pub(crate) cqs: Mutex<IntMap<u64, Weak<dyn ChannelCq>>>,
    pub(crate) cm: Mutex<CmState>,
    pub(crate) closing: AtomicBool,
    /// The device failed or was removed (fault.rs).
    pub(crate) lost: AtomicBool,
    pub(crate) next_id: AtomicU64,
    /// Threads sleeping on the completion channel in `VerbsCq::drive`.
    pub(crate) drivers: AtomicU32,
}

impl Shared {
    /// Reads with more segments than the device reads into are split (iWARP: reads complete
    /// in order there, which the split relies on; see `VerbsQp::post_split_read`). Not where
    /// reads land in a bounce buffer (siw), which is one segment whatever the consumer gave:
    /// a QP's send queue then needs no room for the pieces.
    pub(crate) fn splits_reads(&self) -> bool {
        self.iwarp
            && self.read_sink != sink::ReadSink::Bounce
            && self.read_sge_limit < self.attr.max_sge
    }

    /// The device needs none of the adjustments a send-queue request may get: iWARP's reads
    /// (signaled, in order, split: `splits_reads` implies iWARP), siw's lengths and empty
    /// reads, reads into sinks of our own. Its reliable QPs post on the plain path
    /// (`VerbsQp::plain`).
    pub(crate) fn posts_plain(&self) -> bool {
        !self.iwarp && !self.recv_needs_sge && self.read_sink == sink::ReadSink::Consumer
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn defer(&self, d: Deferred) {
        self.deferred.lock().push(d);
        self.kick();
    }

    pub(crate) fn defer_event(&self, ev: CmEvent) {
        self.defer(Deferred::Event(ev));
    }

    pub(crate) fn defer_break(&self, qp_num: u32) {
        self.defer(Deferred::Break(qp_num));
    }

    /// Wakes the event thread.
    pub(crate) fn kick(&self) {
        sys::eventfd_signal(&self.wake);
    }

    /// Hands a connection event to the core (on the event thread, holding no lock of ours).
    pub(crate) fn emit(&self, ev: CmEvent) {
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
