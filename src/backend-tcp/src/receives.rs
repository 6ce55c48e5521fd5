//! An SRQ's posted receives as the engine holds them (`SharedReceives`): the QPs using the
//! SRQ take their receives from here, in post order, under their PD.
//!
//! Plain state, below the engine; the trait object above it (`TcpSrq`, srq.rs) posts into it
//! and has the engine retry what waited for a receive.

use std::collections::VecDeque;

use parking_lot::Mutex;

use daplrs_backend::RecvWr;

pub(crate) struct SharedReceives {
    pub(crate) id: u64,
    /// The PD the receives' buffers are registered under.
    pub(crate) pd: u32,
    pub(crate) queue: Mutex<VecDeque<RecvWr>>,
}

impl SharedReceives {
    /// The receives of SRQ `id` in PD `pd`, none posted.
    pub(crate) fn new(id: u64, pd: u32) -> SharedReceives {
        SharedReceives {
            id,
            pd,
            queue: Mutex::new(VecDeque::new()),
        }
    }
}
