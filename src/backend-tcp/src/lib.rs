//! The TCP software transport: implements the verbs-shaped traits over TCP sockets.
//!
//! One progress thread per device (per IA) polls every socket of the device, so a target
//! serves RDMA reads and writes and places incoming sends without its application calling
//! anything. All queue-pair and connection state lives in one `Engine` behind one lock; calls
//! from application threads take the lock, do their work (including a first non-blocking write
//! attempt), and hand anything left to the progress thread. Completions and connection events
//! produced under the lock are delivered after it is released, in the order produced.
//!
//! An application thread that waits on an EVD drives its own connections meanwhile
//! (`TcpCq::drive`): it claims the sockets of the QPs completing into that CQ, polls and reads
//! them itself, and gets its completion without a second thread waking it (a round trip costs
//! two thread wake-ups, as plain TCP ping-pong does, instead of three). The progress thread
//! leaves claimed sockets alone and is woken when they are given back, so a target is served
//! either way. Large RDMA read answers go from the target's registered memory straight to the
//! socket, and from the socket straight into the initiator's buffers (see `ReadSink`).
//!
//! This crate implements the contract of `daplrs-backend` and depends on nothing else of the
//! provider: it cannot name a DAT type.
#![deny(unsafe_op_in_unsafe_fn)]

// The DAT test helpers this crate's tests include (src/tests.rs) name it by its own name.
#[cfg(test)]
extern crate self as daplrs_tcp;

mod cm;
mod completions;
mod cq;
mod device;
mod engine;
use daplrs_backend::guarded;
mod keys;
mod mem;
mod poll_wait;
mod qp;
mod read_mostly;
mod readiness;
mod receives;
mod samehost;
mod shared;
mod sigio;
mod srq;
pub(crate) mod sys;
mod window;
/// Also for the fuzzer's peers, which make thousands of connections (see the function).
#[cfg(feature = "fuzzing")]
pub use sys::connect_reusable;
/// The frame format. Public only for the fuzzers and the hostile-peer test (feature `fuzzing`).
#[cfg(feature = "fuzzing")]
pub mod wire;
#[cfg(not(feature = "fuzzing"))]
pub(crate) mod wire;

pub use device::TcpDevice;

/// Largest message / RDMA transfer (also the wire bound on payloads).
pub const MAX_MESSAGE: u32 = 16 << 20;

pub use daplrs_backend::netif::resolve_address;

/// What the DAT tests' helpers (the `daplrs` crate's testing.rs) need of this backend: the
/// same-host mode of devices a test thread opens, and private page-aligned memory for test
/// buffers. Public with the feature `testing`, which only the `daplrs` crate's tests enable.
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod test_support {
    pub use super::samehost::{test_hooks, Mode, Stats};
    pub use daplrs_backend::arena::test_pages::Pages;
}

#[cfg(test)]
mod tests;
