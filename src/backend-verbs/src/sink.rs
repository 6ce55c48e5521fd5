//! The sinks of RDMA reads on iWARP NICs.
//!
//! RFC 5040 places a read's response through its sink's STag, as an RDMA write, and iWARP
//! NICs check remote write on it. Registering every region the consumer may write locally
//! with remote write too would let any peer that learns such an STag write the region as long
//! as it is registered: more than the consumer granted. Instead each read's sink segments
//! are registered for that read alone, with local and remote write, and deregistered when it
//! completes: the STags a peer sees in the read request stop working with the read. siw checks
//! only local write, so it reads into the consumer's own registration
//! (`Shared::read_sink_remote_write`); DAPLRS_VERBS_SINK_MR=always makes every iWARP device
//! take this path, to test it on siw.

use rdma_sys::*;

use super::sys::{self, Ptr};
use daplrs_backend::{Error, Resource, Result, Sge};

/// The registrations of one read's sink segments, deregistered when dropped (after the read
/// completed, or with its QP).
pub(super) struct Sinks {
    mrs: Vec<Ptr<ibv_mr>>,
}

impl Sinks {
    /// Registers each segment of `sgl` in `pd` for local and remote write, and points the
    /// segment at its registration.
    pub fn register(pd: *mut ibv_pd, sgl: &mut [Sge]) -> Result<Sinks> {
        let mut sinks = Sinks { mrs: Vec::new() };
        let access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        for s in sgl.iter_mut().filter(|s| s.length > 0) {
            // SAFETY: the segment lies in a region the consumer registered (the core checked
            // it against its LMR), mapped while that LMR lives, which outlives the read.
            let mr = unsafe {
                ibv_reg_mr(
                    pd,
                    s.addr as usize as *mut _,
                    s.length as usize,
                    access as i32,
                )
            };
            if mr.is_null() {
                log::debug!(
                    "read sink ({:#x}, {}): errno {}",
                    s.addr,
                    s.length,
                    sys::errno()
                );
                return Err(Error::NoResource(Resource::Key));
            }
            sinks.mrs.push(Ptr(mr));
            // SAFETY: the registration just made.
            s.lkey = unsafe { (*mr).lkey };
        }
        Ok(sinks)
    }
}

impl Drop for Sinks {
    fn drop(&mut self) {
        for mr in self.mrs.drain(..) {
            // SAFETY: our registration, which no request still uses.
            let rc = unsafe { ibv_dereg_mr(mr.0) };
            if rc != 0 {
                log::warn!("read sink: ibv_dereg_mr: error {rc}");
            }
        }
    }
}
