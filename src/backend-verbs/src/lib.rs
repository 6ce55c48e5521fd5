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
mod shared;
mod sink;
mod srq;
mod sys;

pub use device::{diagnose, VerbsDevice};

/// Marks a receive's wr_id, so a completion says which queue it came from even when its
/// opcode is undefined (failed and flushed completions). The core's ids never reach it.
const RECV_BIT: u64 = 1 << 63;
/// Marks a request the backend posts for itself (the invalidation before a window is bound
/// again): its completion is accounted for and never reaches the core.
const INTERNAL_BIT: u64 = 1 << 62;
/// With INTERNAL_BIT: a piece of a split read (`VerbsQp::post_split_read`) other than its
/// last; the low bits number it.
const SPLIT_BIT: u64 = 1 << 61;
