//! The sinks of RDMA reads on iWARP devices.
//!
//! RFC 5040 places a read's response through its sink's STag, as an RDMA write: the STag
//! goes to the peer in the read request. What that STag lets the peer do afterwards
//! depends on the device, so the sink is chosen per device (`ReadSink`):
//! - iWARP NICs check remote write on the sink. Registering every region the consumer may
//!   write locally with remote write too would let any peer that learns such an STag write
//!   the region as long as it is registered: more than the consumer granted. Instead each
//!   read's sink segments are registered for that read alone, with local and remote write,
//!   and deregistered when it completes: the STags a peer sees stop working with the read.
//! - siw checks only local write on a sink, but it also checks no remote read right: a peer
//!   that knows any STag of the PD reads its whole region (see `Shared::checks_remote_read`).
//!   The consumer's own STag, or one of a registration over its memory, must then never go
//!   on the wire. So a read lands in a fresh anonymous mapping registered for it alone (a
//!   peer that reads it finds zeros or its own response) and is copied into the consumer's
//!   segments when it completes.
//!
//! DAPLRS_VERBS_SINK_MR=always gives siw the NICs' way, to test that path there.

use rdma_sys::*;

use super::sys::{self, Ptr};
use daplrs_backend::{Error, Resource, Result, Sge, SgeList};

/// Where an RDMA read's response lands, by device (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ReadSink {
    /// The consumer's own registration: InfiniBand and RoCE send no sink STag.
    Consumer,
    /// Registrations of the consumer's segments for this read alone (iWARP NICs).
    Own,
    /// A buffer of ours registered for this read alone, copied out at completion (siw).
    Bounce,
}

impl ReadSink {
    pub fn for_device(iwarp: bool, siw: bool) -> ReadSink {
        let always = std::env::var("DAPLRS_VERBS_SINK_MR").as_deref() == Ok("always");
        match (iwarp, siw) {
            (false, _) => ReadSink::Consumer,
            (true, true) if !always => ReadSink::Bounce,
            (true, _) => ReadSink::Own,
        }
    }
}

/// The registrations of one read's sink, deregistered when dropped (after the read
/// completed, or with its QP).
pub(super) struct Sinks {
    mrs: Vec<Ptr<ibv_mr>>,
    bounce: Option<Bounce>,
}

/// A read's private landing buffer and the consumer's segments it is copied into.
struct Bounce {
    addr: usize,
    len: usize,
    segments: Vec<(u64, u32)>,
}

impl Sinks {
    /// Registers each segment of `sgl` in `pd` for local and remote write, and points the
    /// segment at its registration.
    pub fn register(pd: *mut ibv_pd, sgl: &mut [Sge]) -> Result<Sinks> {
        let mut sinks = Sinks {
            mrs: Vec::new(),
            bounce: None,
        };
        let access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        for s in sgl.iter_mut().filter(|s| s.length > 0) {
            // SAFETY: the segment lies in a region the consumer registered (the core checked
            // it against its LMR), mapped while that LMR lives, which outlives the read.
            s.lkey = unsafe { sinks.add_mr(pd, s.addr as usize, s.length as usize, access)? };
        }
        Ok(sinks)
    }

    /// Replaces `sgl` by one segment in a fresh mapping of its total length, registered in
    /// `pd` for local write; `finish` copies the response into the segments of `sgl`.
    pub fn bounce(pd: *mut ibv_pd, sgl: &mut SgeList) -> Result<Sinks> {
        let segments: Vec<(u64, u32)> = sgl.iter().map(|s| (s.addr, s.length)).collect();
        let len: usize = segments.iter().map(|&(_, l)| l as usize).sum();
        if len == 0 {
            // Nothing lands: the request names no memory of the consumer's.
            return Ok(Sinks {
                mrs: Vec::new(),
                bounce: None,
            });
        }
        // SAFETY: a new private anonymous mapping; nothing else refers to it.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(Error::NoResource(Resource::Memory));
        }
        let mut sinks = Sinks {
            mrs: Vec::new(),
            bounce: Some(Bounce {
                addr: addr as usize,
                len,
                segments,
            }),
        };
        let access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        // SAFETY: the mapping just made, unmapped only when `sinks` drops, after its MR.
        let lkey = unsafe { sinks.add_mr(pd, addr as usize, len, access)? };
        *sgl = SgeList::new();
        sgl.push(Sge {
            addr: addr as u64,
            length: len as u32,
            lkey,
        });
        Ok(sinks)
    }

    /// Whether the read lands in a bounce buffer (copied out by `finish`).
    pub fn bounced(&self) -> bool {
        self.bounce.is_some()
    }

    /// Registers `[addr, addr + len)`, kept until `self` drops; its lkey.
    ///
    /// # Safety
    /// The range is mapped for as long as `self` lives.
    unsafe fn add_mr(
        &mut self,
        pd: *mut ibv_pd,
        addr: usize,
        len: usize,
        access: u32,
    ) -> Result<u32> {
        // SAFETY: the caller's promise.
        let mr = unsafe { ibv_reg_mr(pd, addr as *mut _, len, access as i32) };
        if mr.is_null() {
            log::debug!("read sink ({addr:#x}, {len}): errno {}", sys::errno());
            return Err(Error::NoResource(Resource::Key));
        }
        self.mrs.push(Ptr(mr));
        // SAFETY: the registration just made.
        Ok(unsafe { (*mr).lkey })
    }

    /// The read is done (`succeeded`: its response is in): a bounced response is copied into
    /// the consumer's segments. False if that copy failed (the consumer unmapped them).
    pub fn finish(&self, succeeded: bool) -> bool {
        let Some(b) = self.bounce.as_ref().filter(|_| succeeded) else {
            return true;
        };
        // Through the kernel, so that segments the consumer unmapped under its read fail the
        // read rather than fault in the thread that reaps it.
        let local = libc::iovec {
            iov_base: b.addr as *mut _,
            iov_len: b.len,
        };
        let remote: Vec<libc::iovec> = b
            .segments
            .iter()
            .filter(|&&(_, l)| l > 0)
            .map(|&(a, l)| libc::iovec {
                iov_base: a as usize as *mut _,
                iov_len: l as usize,
            })
            .collect();
        if remote.is_empty() {
            return true;
        }
        // SAFETY: the iovecs name our mapping and the consumer's segments; the kernel checks
        // every address and copies nothing where one is not mapped writable.
        let n = unsafe {
            libc::process_vm_writev(
                libc::getpid(),
                &local,
                1,
                remote.as_ptr(),
                remote.len() as libc::c_ulong,
                0,
            )
        };
        n == b.len as isize
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
        if let Some(b) = self.bounce.take() {
            // SAFETY: our mapping, whose registration is gone.
            unsafe { libc::munmap(b.addr as *mut _, b.len) };
        }
    }
}
