//! The shared receive queue (`TcpSrq`): receives the engine takes from for the QPs using it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Weak;

use parking_lot::Mutex;

use daplrs_backend::{Error, RecvWr, Resource, Result, SharedReceiveQueue};

use crate::shared::Shared;

pub(crate) struct TcpSrq {
    pub(crate) id: u64,
    pub(crate) pd: u32,
    pub(crate) queue: Mutex<VecDeque<RecvWr>>,
    max_wr: AtomicU32,
    max_sge: u32,
    shared: Weak<Shared>,
}

impl TcpSrq {
    pub(crate) fn new(id: u64, pd: u32, max_wr: u32, max_sge: u32, shared: Weak<Shared>) -> TcpSrq {
        TcpSrq {
            id,
            pd,
            queue: Mutex::new(VecDeque::new()),
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
        self.id
    }
    fn post_recv(&self, wr: RecvWr) -> Result<()> {
        if wr.sgl.len() > self.max_sge as usize {
            return Err(Error::TooLong);
        }
        {
            let mut q = self.queue.lock();
            if q.len() >= self.max_wr.load(Ordering::SeqCst) as usize {
                return Err(Error::NoResource(Resource::Srq));
            }
            q.push_back(wr);
        }
        // A send may be waiting for exactly this receive.
        if let Some(shared) = self.shared.upgrade() {
            let id = self.id;
            shared.run(|eng, sh| eng.retry_held_for_srq(sh, id));
        }
        Ok(())
    }
    fn posted(&self) -> u32 {
        self.queue.lock().len() as u32
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
        self.queue.lock().clear();
    }
}
