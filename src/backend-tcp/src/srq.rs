//! The shared receive queue (`TcpSrq`): the backend's trait object over the receives the
//! engine takes from for the QPs using it (receives.rs).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};

use daplrs_backend::{Error, RecvWr, Resource, Result, SharedReceiveQueue};

use crate::receives::SharedReceives;
use crate::shared::Shared;

pub(crate) struct TcpSrq {
    /// What the engine takes from (receives.rs), which the device's `Shared` finds by id.
    receives: Arc<SharedReceives>,
    max_wr: AtomicU32,
    max_sge: u32,
    shared: Weak<Shared>,
}

impl TcpSrq {
    pub(crate) fn new(
        receives: Arc<SharedReceives>,
        max_wr: u32,
        max_sge: u32,
        shared: Weak<Shared>,
    ) -> TcpSrq {
        TcpSrq {
            receives,
            max_wr: AtomicU32::new(max_wr),
            max_sge,
            shared,
        }
    }
}

impl SharedReceiveQueue for TcpSrq {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn id(&self) -> u64 {
        self.receives.id
    }
    fn post_recv(&self, wr: RecvWr) -> Result<()> {
        if wr.sgl.len() > self.max_sge as usize {
            return Err(Error::TooLong);
        }
        {
            let mut q = self.receives.queue.lock();
            if q.len() >= self.max_wr.load(Ordering::SeqCst) as usize {
                return Err(Error::NoResource(Resource::Srq));
            }
            q.push_back(wr);
        }
        // A send may be waiting for exactly this receive.
        if let Some(shared) = self.shared.upgrade() {
            let id = self.receives.id;
            shared.run(|eng, sh| eng.retry_held_for_srq(sh, id));
        }
        Ok(())
    }
    fn posted(&self) -> u32 {
        self.receives.queue.lock().len() as u32
    }
    fn max_wr(&self) -> u32 {
        self.max_wr.load(Ordering::SeqCst)
    }
    fn resize(&self, max_wr: u32) -> Result<()> {
        self.max_wr.store(max_wr, Ordering::SeqCst);
        Ok(())
    }
    fn destroy(&self) {
        // Receives never consumed are dropped with the SRQ; DAT forbids freeing an SRQ that
        // EPs still use, so no connection can need them.
        self.receives.queue.lock().clear();
    }
}
