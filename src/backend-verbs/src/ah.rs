//! Address handle (an ibv_ah) of a datagram QP's sends.

use std::net::Ipv4Addr;
use std::sync::Arc;

use rdma_sys::*;

use super::mem::PdInner;
use super::sys::Ptr;
use daplrs_backend::{AddressHandle, Result};

/// An address handle: an ibv_ah made in a QP's PD from the path rdma_cm resolved, the remote
/// IA's address and the remote QP's Q_Key.
pub(crate) struct VerbsAh {
    pub(super) ah: Ptr<ibv_ah>,
    addr: Ipv4Addr,
    pub(super) qkey: u32,
    _pd: Arc<PdInner>,
}

impl VerbsAh {
    /// An address handle in a QP's PD `pd` for the path `attr` (from an rdma_cm UDP event).
    pub(super) fn create(
        pd: &Arc<PdInner>,
        attr: &mut ibv_ah_attr,
        addr: Ipv4Addr,
        qkey: u32,
    ) -> Result<Arc<VerbsAh>, String> {
        // SAFETY: a PD of this device, alive while the QP holds it; a path attribute block.
        let ah = unsafe { ibv_create_ah(pd.pd.0, attr) };
        if ah.is_null() {
            return Err(super::sys::os_error("ibv_create_ah", super::sys::errno()));
        }
        Ok(Arc::new(VerbsAh {
            ah: Ptr(ah),
            addr,
            qkey,
            _pd: pd.clone(),
        }))
    }
}

impl AddressHandle for VerbsAh {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn address(&self) -> Ipv4Addr {
        self.addr
    }
}

impl Drop for VerbsAh {
    fn drop(&mut self) {
        // SAFETY: our AH; its PD lives until after this (held above).
        let rc = unsafe { ibv_destroy_ah(self.ah.0) };
        if rc != 0 {
            log::warn!("ibv_destroy_ah: error {rc}");
        }
    }
}
