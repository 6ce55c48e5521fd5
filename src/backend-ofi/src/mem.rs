//! Protection domains and memory registrations.
//!
//! libfabric has one protection scope per domain: a PD is a tag the core
//! checks. A registration's key is ours (a per-device counter) unless the
//! provider picks it (FI_MR_PROV_KEY); DAT's contexts are 32 bits, so a
//! provider key that does not fit is refused (docs/libfabric.md, Later).

use std::any::Any;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};

use daplrs_backend::{
    access, Error, MemoryRegion, MemoryWindow, ProtectionDomain, Resource, Result,
};
use ofi_sys as fi;
use parking_lot::Mutex;

use crate::device::{opened, OfiDevice};
use crate::Fid;

static NEXT_PD: AtomicU32 = AtomicU32::new(1);

pub(crate) struct OfiPd {
    id: u32,
    dev: Weak<OfiDevice>,
}

impl OfiPd {
    pub(crate) fn new(dev: &OfiDevice) -> Arc<OfiPd> {
        Arc::new(OfiPd {
            id: NEXT_PD.fetch_add(1, Ordering::Relaxed),
            dev: dev.me.clone(),
        })
    }
}

impl ProtectionDomain for OfiPd {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn id(&self) -> u32 {
        self.id
    }

    fn reg_mr(&self, addr: u64, length: u64, rights: u32) -> Result<Arc<dyn MemoryRegion>> {
        let dev = self.dev.upgrade().ok_or(Error::NoDevice)?;
        if length == 0 || addr.checked_add(length).is_none() {
            return Err(Error::BadAddress);
        }
        let key = dev.next_key.fetch_add(1, Ordering::Relaxed);
        let iov = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: length as usize,
        };
        let mut fi_access = (fi::FI_SEND | fi::FI_RECV | fi::FI_READ | fi::FI_WRITE) as u64;
        if rights & access::REMOTE_READ != 0 {
            fi_access |= fi::FI_REMOTE_READ as u64;
        }
        if rights & access::REMOTE_WRITE != 0 {
            fi_access |= fi::FI_REMOTE_WRITE as u64;
        }
        let attr = fi::fi_mr_attr {
            mr_iov: (&iov as *const libc::iovec).cast(),
            iov_count: 1,
            access: fi_access,
            requested_key: key as u64,
            ..Default::default()
        };
        let mut mr = null_mut();
        // SAFETY: an open domain; the attributes point at `iov`, alive for the call.
        let rc = unsafe { fi::fi_mr_regattr(dev.domain.ptr(), &attr, 0, &mut mr) };
        opened(rc, "fi_mr_regattr", Error::NoResource(Resource::Key))?;
        let mr = Fid(mr);
        // SAFETY: the registration just made.
        let (prov_key, desc) = unsafe { (fi::fi_mr_key(mr.ptr()), fi::fi_mr_desc(mr.ptr())) };
        let rkey = u32::try_from(prov_key).map_err(|_| {
            log::warn!("the provider's memory key {prov_key:#x} does not fit DAT's 32-bit context");
            Error::NoResource(Resource::Key)
        })?;
        dev.tables.lock().descs.insert(rkey, desc as usize);
        if let Some(keys) = &dev.keys {
            keys.publish(rkey, addr, length);
        }
        Ok(Arc::new(OfiMr {
            pd: self.id,
            addr,
            length,
            rights,
            key: rkey,
            dev: self.dev.clone(),
            mr: Mutex::new(Some(mr)),
        }))
    }

    fn alloc_mw(&self) -> Result<Arc<dyn MemoryWindow>> {
        Err(Error::Unsupported)
    }
}

pub(crate) struct OfiMr {
    pd: u32,
    addr: u64,
    length: u64,
    rights: u32,
    /// Both lkey and rkey: libfabric has one key per registration.
    key: u32,
    dev: Weak<OfiDevice>,
    mr: Mutex<Option<Fid<fi::fid_mr>>>,
}

impl MemoryRegion for OfiMr {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn lkey(&self) -> u32 {
        self.key
    }
    fn rkey(&self) -> u32 {
        self.key
    }
    fn addr(&self) -> u64 {
        self.addr
    }
    fn length(&self) -> u64 {
        self.length
    }
    fn access(&self) -> u32 {
        self.rights
    }
    fn pd_id(&self) -> u32 {
        self.pd
    }
    fn deregister(&self) {
        if let Some(dev) = self.dev.upgrade() {
            dev.tables.lock().descs.remove(&self.key);
            if let Some(keys) = &dev.keys {
                keys.withdraw(self.key);
            }
        }
        // Closing the registration (Fid's drop) makes its key invalid for every peer.
        self.mr.lock().take();
    }
}
