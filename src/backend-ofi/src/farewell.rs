//! Telling a disconnection from a broken connection.
//!
//! libfabric's tcp provider ends a connection the same way whatever the
//! reason: the consumer's `fi_shutdown`, the peer's process gone, or the
//! provider itself dropping it on a remote access error (a bad key, a range
//! outside the registration, a right it lacks). Each side sees FI_SHUTDOWN.
//! DAT tells the first (DISCONNECTED) from the others (BROKEN, on both sides).
//! So a QP's disconnect first writes a word into the peer's farewell word (one
//! RDMA write, delivered before the shutdown that follows it on the same
//! connection), and a connection that ends with no farewell written broke.
//!
//! Over reliable datagrams (our connection layer, `rdm`) the same
//! registration holds the QP's receipt words: where the peer writes how many
//! of our messages its receives took (`Domain::receipts`), one RDMA write
//! on the fabric, read by whoever reads our request CQ next.

use std::ptr::null_mut;
use std::sync::atomic::{AtomicU64, Ordering};

use daplrs_backend::Result;
use ofi_sys as fi;
use parking_lot::Mutex;

use crate::domain::Domain;
use crate::keys::PeerTable;
use crate::mem::register;
use crate::Fid;

/// Word 0: where the peer's farewell lands; word 1: what ours is written
/// from; words 2 and 3: the peer's receipt, a count and its complement (a
/// read that sees them disagree caught the write half done, and looks again
/// at its next read).
pub(crate) struct Farewell {
    /// Registered when the QP first opens an endpoint. Declared before the
    /// words: fields drop in order, so the registration closes first.
    mr: Mutex<Option<Fid<fi::fid_mr>>>,
    words: Box<[AtomicU64; WORDS]>,
}

const WORDS: usize = 4;
/// Where the receipt words sit in the registration (bytes).
pub(crate) const RECEIPT_OFFSET: u64 = 16;

impl Farewell {
    pub(crate) fn new() -> Farewell {
        Farewell {
            mr: Mutex::new(None),
            words: Box::new([
                AtomicU64::new(0),
                AtomicU64::new(1),
                AtomicU64::new(0),
                AtomicU64::new(0),
            ]),
        }
    }

    /// Readies the word for a new connection: registered (once), cleared.
    pub(crate) fn arm(&self, dev: &Domain) -> Result<()> {
        self.words[0].store(0, Ordering::Release);
        self.words[2].store(0, Ordering::Release);
        self.words[3].store(0, Ordering::Release);
        let mut mr = self.mr.lock();
        if mr.is_some() {
            return Ok(());
        }
        // The words are boxed, alive while the QP (and so this registration) is.
        let key = dev.next_key.fetch_add(1, Ordering::Relaxed);
        *mr = Some(register(
            dev,
            self.words.as_ptr() as u64,
            std::mem::size_of::<[AtomicU64; WORDS]>() as u64,
            (fi::FI_WRITE | fi::FI_REMOTE_WRITE) as u64,
            key,
            "fi_mr_regattr (farewell)",
        )?);
        Ok(())
    }

    /// What the handshake announces: the word's key and RMA address (0 where
    /// the provider addresses registrations by offset), or zeros unregistered.
    pub(crate) fn announce(&self, dev: &Domain) -> (u64, u64) {
        let Some(key) = self.mr.lock().as_ref().map(|m| {
            // SAFETY: the word's open registration.
            unsafe { fi::fi_mr_key(m.ptr()) }
        }) else {
            return (0, 0);
        };
        let address = if !dev.virt_addr {
            0
        } else {
            self.words.as_ptr() as u64
        };
        (key, address)
    }

    /// The count of the peer's last receipt written whole (0: none yet).
    pub(crate) fn receipt(&self) -> u64 {
        let count = self.words[2].load(Ordering::Acquire);
        let check = self.words[3].load(Ordering::Acquire);
        if check == !count {
            count
        } else {
            0
        }
    }

    /// Whether the peer wrote its farewell before the connection ended.
    pub(crate) fn received(&self) -> bool {
        self.words[0].load(Ordering::Acquire) != 0
    }

    /// Writes our farewell into the peer's word (completing as `context`);
    /// false when the peer announced none or the write could not be posted.
    pub(crate) fn send(
        &self,
        ep: *mut fi::fid_ep,
        peer: &PeerTable,
        context: *mut libc::c_void,
    ) -> bool {
        if peer.farewell_key == 0 {
            return false;
        }
        let mut desc = self.mr.lock().as_ref().map_or(null_mut(), |m| {
            // SAFETY: the word's open registration.
            unsafe { fi::fi_mr_desc(m.ptr()) }
        });
        let iov = libc::iovec {
            iov_base: self.words[1].as_ptr().cast(),
            iov_len: 8,
        };
        let rma = fi::fi_rma_iov {
            addr: peer.farewell_address,
            len: 8,
            key: peer.farewell_key,
        };
        let msg = fi::fi_msg_rma {
            msg_iov: (&iov as *const libc::iovec).cast(),
            desc: &mut desc,
            iov_count: 1,
            rma_iov: &rma,
            rma_iov_count: 1,
            context,
            ..Default::default()
        };
        let flags = (fi::FI_COMPLETION | fi::FI_DELIVERY_COMPLETE) as u64;
        // SAFETY: an enabled endpoint; word 1 is registered and never changes.
        let rc = unsafe { fi::fi_writemsg(ep, &msg, flags) };
        rc == 0
    }
}
