//! The bounce buffers of a QP whose SRQ is a pool of ours (see `srq`): a few
//! buffers of the backend's own posted on the QP's endpoint, where messages
//! for the SRQ land before they are copied into its oldest receive.
//!
//! A provider may complete receives of one endpoint out of the order they
//! were matched (ofi_rxm's large messages complete after a read); it matches
//! them in the order they were posted. So what landed is released in posting
//! order, as a QP's own receives are (`qp::Ring`).

use std::collections::VecDeque;
use std::ptr::null_mut;
use std::sync::atomic::Ordering;

use daplrs_backend::{Error, Result, WcStatus};
use ofi_sys as fi;

use crate::domain::Domain;
use crate::Fid;

/// Buffers a QP keeps posted (at most the provider's receive depth). More
/// messages than this wait in the provider, which keeps what arrives for an
/// endpoint with no receive posted (reliable datagrams do).
pub(crate) const BOUNCES: usize = 8;
/// The smallest bounce buffer (a pool whose receives are all shorter).
const MIN_BYTES: usize = 64;

/// What landed in a bounce buffer: its length or error, and its remote CQ data.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Landed {
    pub slot: usize,
    pub result: std::result::Result<u32, WcStatus>,
    pub data: Option<u64>,
}

#[derive(Default)]
struct Bounce {
    /// Closed before `mem` is freed (fields drop in order).
    mr: Option<Fid<fi::fid_mr>>,
    mem: Vec<u8>,
    posted: bool,
    /// Asked back (`cancel_shorter`): its completion may be the cancel.
    cancelling: bool,
    landed: Option<Landed>,
}

/// A QP's bounce buffers, owned with its endpoint (and parked with it: see
/// `port::Keeper`), so that none is freed while the provider may write it.
#[derive(Default)]
pub(crate) struct Bounces {
    bufs: Vec<Bounce>,
    /// The posted slots, oldest first.
    order: VecDeque<usize>,
}

impl Bounces {
    /// Posts every slot not posted, each at least `len` bytes long; `context`
    /// gives a slot's request context.
    pub(crate) fn post_all(
        &mut self,
        dev: &Domain,
        ep: *mut fi::fid_ep,
        count: usize,
        len: usize,
        tag: Option<u64>,
        context: impl Fn(usize) -> *mut libc::c_void,
    ) -> Result<()> {
        if self.bufs.len() < count {
            self.bufs.resize_with(count, Bounce::default);
        }
        for slot in 0..count {
            if !self.bufs[slot].posted && self.bufs[slot].landed.is_none() {
                self.post(dev, ep, slot, len, tag, context(slot))?;
            }
        }
        Ok(())
    }

    /// Posts `slot` again once its message was copied out (`len`: what it
    /// must hold now); `tag`: over a port, the connection's (tagged receive).
    pub(crate) fn post(
        &mut self,
        dev: &Domain,
        ep: *mut fi::fid_ep,
        slot: usize,
        len: usize,
        tag: Option<u64>,
        context: *mut libc::c_void,
    ) -> Result<()> {
        let buf = &mut self.bufs[slot];
        let len = len.max(MIN_BYTES);
        if buf.mem.len() < len {
            // Not posted: nothing of the provider's refers to the old memory.
            buf.mr = None;
            buf.mem = vec![0; len];
        }
        if buf.mr.is_none() {
            buf.mr = register_for_recv(dev, &mut buf.mem, "fi_mr_regattr (bounce buffer)")?;
        }
        // A closing send of a write with immediate data has its own bits.
        let tag = tag.map(|t| (t, crate::qp::IMM_FIELDS));
        let rc = post_buffer(ep, &mut buf.mem, buf.mr.as_ref(), tag, context);
        crate::check(rc, "fi_recvmsg (bounce buffer)", Error::Internal)?;
        buf.posted = true;
        buf.cancelling = false;
        self.order.push_back(slot);
        Ok(())
    }

    /// `slot` completed. Returns whether that was its cancel (it is then out
    /// of the order, to be posted again); otherwise what landed in posting
    /// order so far goes to `out`.
    pub(crate) fn landed(&mut self, landed: Landed, out: &mut Vec<Landed>) -> bool {
        let Some(buf) = self.bufs.get_mut(landed.slot) else {
            return false;
        };
        buf.posted = false;
        if std::mem::take(&mut buf.cancelling) && landed.result == Err(WcStatus::Flushed) {
            self.order.retain(|&s| s != landed.slot);
            return true;
        }
        buf.landed = Some(landed);
        while let Some(&front) = self.order.front() {
            let Some(done) = self.bufs[front].landed else {
                break;
            };
            self.order.pop_front();
            out.push(done);
        }
        false
    }

    /// The bytes that landed in `slot` (`len` of them), to be copied out; the
    /// slot is free again after.
    pub(crate) fn take(&mut self, slot: usize, len: usize) -> &[u8] {
        let Some(buf) = self.bufs.get_mut(slot) else {
            return &[];
        };
        buf.landed = None;
        &buf.mem[..len.min(buf.mem.len())]
    }

    /// Asks back every posted buffer shorter than `len` (the pool's receives
    /// grew): each is posted again, longer, when its cancel completes.
    pub(crate) fn cancel_shorter(
        &mut self,
        ep: *mut fi::fid_ep,
        len: usize,
        context: impl Fn(usize) -> *mut libc::c_void,
    ) {
        for (slot, buf) in self.bufs.iter_mut().enumerate() {
            if buf.posted && !buf.cancelling && buf.mem.len() < len {
                // SAFETY: the endpoint the buffer is posted on; its context.
                let rc = unsafe { fi::fi_cancel(ep, context(slot)) };
                // Not found: it matched already, and completes as it is.
                buf.cancelling = rc == 0;
            }
        }
    }
}

/// Registers `mem` for receives where the provider needs descriptors
/// (FI_MR_LOCAL); None elsewhere.
pub(crate) fn register_for_recv(
    dev: &Domain,
    mem: &mut [u8],
    what: &str,
) -> Result<Option<Fid<fi::fid_mr>>> {
    if !dev.local_descs {
        return Ok(None);
    }
    let key = dev.next_key.fetch_add(1, Ordering::Relaxed);
    let (addr, len) = (mem.as_mut_ptr() as u64, mem.len() as u64);
    crate::mem::register(dev, addr, len, fi::FI_RECV as u64, key, what).map(Some)
}

/// Posts `mem` as one receive of the backend's own on `ep` (`mr`: its
/// registration, if any): tagged with (tag, ignore bits), or untagged.
/// Returns the provider's answer.
pub(crate) fn post_buffer(
    ep: *mut fi::fid_ep,
    mem: &mut [u8],
    mr: Option<&Fid<fi::fid_mr>>,
    tag: Option<(u64, u64)>,
    context: *mut libc::c_void,
) -> isize {
    let mut desc = mr.map_or(null_mut(), |m| {
        // SAFETY: the buffer's registration.
        unsafe { fi::fi_mr_desc(m.ptr()) }
    });
    let iov = libc::iovec {
        iov_base: mem.as_mut_ptr().cast(),
        iov_len: mem.len(),
    };
    let msg = fi::fi_msg {
        msg_iov: (&iov as *const libc::iovec).cast(),
        desc: &mut desc,
        iov_count: 1,
        context,
        addr: crate::FI_ADDR_UNSPEC,
        ..Default::default()
    };
    let (t, ignore) = tag.unwrap_or_default();
    let tagged = fi::fi_msg_tagged {
        msg_iov: msg.msg_iov,
        desc: msg.desc,
        iov_count: 1,
        addr: msg.addr,
        tag: t,
        ignore,
        context,
        data: 0,
    };
    let flags = fi::FI_COMPLETION as u64;
    // SAFETY: an enabled endpoint; the caller keeps the buffer (and its
    // registration) alive while the provider may write it, the structs live
    // for the call.
    unsafe {
        match tag {
            Some(_) => fi::fi_trecvmsg(ep, &tagged, flags),
            None => fi::fi_recvmsg(ep, &msg, flags),
        }
    }
}
