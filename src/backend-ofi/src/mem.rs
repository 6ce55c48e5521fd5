//! Protection domains and memory registrations.
//!
//! libfabric has one protection scope per domain: a PD is a tag the core
//! checks. A registration's context (lkey and rkey) is a key of ours, from a
//! per-device counter; where the provider picks its own key (FI_MR_PROV_KEY)
//! the key table's entry names that one (`keys`), so it may be of any width.

use std::any::Any;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Weak};

use daplrs_backend::{
    access, Error, MemoryRegion, MemoryWindow, ProtectionDomain, Registration, Resource, Result,
    Sge, WcStatus,
};
use ofi_sys as fi;
use parking_lot::Mutex;

use crate::domain::{Domain, Window};
use crate::keys::{Remote, WINDOW};
use crate::{opened, Fid};

static NEXT_PD: AtomicU32 = AtomicU32::new(1);

pub(crate) struct OfiPd {
    id: u32,
    dev: Weak<Domain>,
}

impl OfiPd {
    pub(crate) fn new(dev: &Domain) -> Arc<OfiPd> {
        Arc::new(OfiPd {
            id: NEXT_PD.fetch_add(1, Ordering::Relaxed),
            dev: dev.me.clone(),
        })
    }
}

impl OfiPd {
    /// Registers [addr, addr+length) asking for `key` and publishes it in the
    /// device's key table under `key`, with the provider's key (another where
    /// the provider chooses: FI_MR_PROV_KEY). The context is `key` either way.
    fn register_published(
        &self,
        dev: &Domain,
        key: u32,
        addr: u64,
        length: u64,
        rights: u32,
    ) -> Result<Fid<fi::fid_mr>> {
        let fi_access = local_access(rights) | remote_access(rights);
        let mr = register(dev, addr, length, fi_access, key, "fi_mr_regattr")?;
        // SAFETY: the registration just made.
        let (provider_key, desc) = unsafe { (fi::fi_mr_key(mr.ptr()), fi::fi_mr_desc(mr.ptr())) };
        let found = Remote {
            start: addr,
            length,
            rights,
            pd: self.id,
            provider_key,
        };
        if !dev.keys.publish(key, &found) {
            log::warn!("key {key:#x}: its key table slot is taken");
            return Err(Error::NoResource(Resource::Key));
        }
        dev.descs.lock().insert(key, desc as usize);
        dev.arenas.registered(dev, key, addr, length);
        Ok(mr)
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
        let key = dev.new_key();
        let mr = self
            .register_published(&dev, key, addr, length, rights)
            .inspect_err(|_| {
                // Not published: the reserved key's slot is free again.
                dev.release_key(key);
            })?;
        Ok(Arc::new(OfiMr {
            reg: Registration {
                lkey: key,
                rkey: key,
                addr,
                length,
                access: rights,
                pd_id: self.id,
            },
            dev: self.dev.clone(),
            mr: Mutex::new(Some(mr)),
        }))
    }

    fn alloc_mw(&self) -> Result<Arc<dyn MemoryWindow>> {
        self.dev.upgrade().ok_or(Error::NoDevice)?;
        Ok(Arc::new_cyclic(|me| OfiMw {
            me: me.clone(),
            pd: self.id,
            dev: self.dev.clone(),
            bound: Mutex::new(None),
            reserved: Mutex::new(Vec::new()),
            live: AtomicBool::new(true),
        }))
    }
}

/// The local uses of a registration: the source of sends and RDMA writes
/// always; a receive's or an RDMA read's sink only with local write (verbs
/// registers those with IBV_ACCESS_LOCAL_WRITE, which read-only memory
/// refuses; the core posts into no region without local write).
fn local_access(rights: u32) -> u64 {
    let mut fi_access = (fi::FI_SEND | fi::FI_WRITE) as u64;
    if rights & access::LOCAL_WRITE != 0 {
        fi_access |= (fi::FI_RECV | fi::FI_READ) as u64;
    }
    fi_access
}

/// The remote rights of DAT access bits, as libfabric access flags.
fn remote_access(rights: u32) -> u64 {
    let mut fi_access = 0;
    if rights & access::REMOTE_READ != 0 {
        fi_access |= fi::FI_REMOTE_READ as u64;
    }
    if rights & access::REMOTE_WRITE != 0 {
        fi_access |= fi::FI_REMOTE_WRITE as u64;
    }
    if rights & access::REMOTE_ATOMIC != 0 {
        // libfabric has no atomic right of its own: an atomic reads and
        // writes the target word (the key table keeps the right apart).
        fi_access |= (fi::FI_REMOTE_READ | fi::FI_REMOTE_WRITE) as u64;
    }
    fi_access
}

/// Registers [addr, addr+length) with `fi_access`, asking for `key` (the
/// provider's own key where it picks them: FI_MR_PROV_KEY). `what` names the
/// registration in the log when the provider refuses it.
pub(crate) fn register(
    dev: &Domain,
    addr: u64,
    length: u64,
    fi_access: u64,
    key: u32,
    what: &str,
) -> Result<Fid<fi::fid_mr>> {
    let iov = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: length as usize,
    };
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
    opened(rc, what, Error::NoResource(Resource::Key))?;
    Ok(Fid(mr))
}

pub(crate) struct OfiMr {
    /// lkey and rkey are one key: libfabric has one per registration.
    reg: Registration,
    dev: Weak<Domain>,
    mr: Mutex<Option<Fid<fi::fid_mr>>>,
}

impl MemoryRegion for OfiMr {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn registration(&self) -> &Registration {
        &self.reg
    }
    fn deregister(&self) {
        if let Some(dev) = self.dev.upgrade() {
            dev.descs.lock().remove(&self.reg.lkey);
            dev.arenas.deregistered(&dev, self.reg.lkey);
            dev.keys.withdraw(self.reg.lkey);
        }
        // Closing the registration (Fid's drop) makes its key invalid for every peer.
        self.mr.lock().take();
    }
}

impl OfiMr {
    /// Whether a window may expose [addr, addr+length) of this region: still
    /// registered, and the range inside it.
    fn may_expose(&self, addr: u64, length: u64) -> bool {
        let end = addr.checked_add(length);
        addr >= self.reg.addr
            && end.is_some_and(|e| e <= self.reg.addr + self.reg.length)
            && self.mr.lock().is_some()
    }
}

/// A memory window: libfabric has none, so a bind registers the bound range
/// anew with the window's remote rights (the pages are pinned already by the
/// region's registration) and its key is the window's rkey; an unbind or
/// rebind closes that registration, so the old key grants nothing from then
/// on (docs/libfabric.md, RMR bind).
pub(crate) struct OfiMw {
    me: Weak<OfiMw>,
    pd: u32,
    dev: Weak<Domain>,
    /// The current binding's registration and key (None: grants nothing).
    bound: Mutex<Option<(u32, Fid<fi::fid_mr>)>>,
    /// Keys given out by `next_rkey` whose bind has not run yet.
    reserved: Mutex<Vec<u32>>,
    live: AtomicBool,
}

impl OfiMw {
    /// Executes a bind (or, `mr` None, an unbind) in the QP's order; its
    /// completion's status. `new_rkey` came from `next_rkey`.
    pub(crate) fn bind(
        &self,
        mr: Option<&Arc<dyn MemoryRegion>>,
        addr: u64,
        length: u64,
        rights: u32,
        new_rkey: u32,
    ) -> WcStatus {
        self.unbind();
        // The key was reserved for this bind: published below, or given back.
        self.reserved.lock().retain(|k| *k != new_rkey);
        let status = self.bind_anew(mr, addr, length, rights, new_rkey);
        if self.rkey() != new_rkey {
            // Failed, or an unbind.
            if let Some(dev) = self.dev.upgrade() {
                dev.release_key(new_rkey);
            }
        }
        status
    }

    /// `bind` once the old binding ended: registers and publishes the new one.
    fn bind_anew(
        &self,
        mr: Option<&Arc<dyn MemoryRegion>>,
        addr: u64,
        length: u64,
        rights: u32,
        new_rkey: u32,
    ) -> WcStatus {
        let Some(mr) = mr else {
            return WcStatus::Success;
        };
        let region = mr.as_any().downcast_ref::<OfiMr>();
        let dev = self.dev.upgrade();
        let (Some(region), Some(dev)) = (region, dev) else {
            return WcStatus::MwBind;
        };
        if !self.live.load(Ordering::Acquire)
            || region.reg.pd_id != self.pd
            || !region.may_expose(addr, length)
        {
            return WcStatus::MwBind;
        }
        let Ok(reg) = register(
            &dev,
            addr,
            length,
            remote_access(rights),
            new_rkey,
            "fi_mr_regattr (bind)",
        ) else {
            return WcStatus::MwBind;
        };
        // The consumer was told new_rkey already; where the provider chose
        // another key, the entry names it (peers address it through new_rkey).
        // SAFETY: the registration just made.
        let provider_key = unsafe { fi::fi_mr_key(reg.ptr()) };
        let found = Remote {
            start: addr,
            length,
            rights: rights | WINDOW,
            pd: self.pd,
            provider_key,
        };
        if !dev.keys.publish(new_rkey, &found) {
            return WcStatus::MwBind;
        }
        let me: Weak<dyn Window> = self.me.clone();
        dev.windows.lock().insert(new_rkey, me);
        *self.bound.lock() = Some((new_rkey, reg));
        WcStatus::Success
    }

    /// Ends the current binding: its key is withdrawn and its registration
    /// closed, so every later access through it fails at the provider.
    fn unbind(&self) {
        let taken = self.bound.lock().take();
        if let Some((key, reg)) = taken {
            self.release(key, reg);
        }
    }

    /// Withdraws binding `key` and closes its registration.
    fn release(&self, key: u32, reg: Fid<fi::fid_mr>) {
        if let Some(dev) = self.dev.upgrade() {
            dev.windows.lock().remove(&key);
            dev.keys.withdraw(key);
        }
        drop(reg);
    }
}

impl Window for OfiMw {
    /// A peer's send invalidates `rkey` on a QP of protection domain `pd`:
    /// the binding ends if it is this window's current one, in that domain.
    fn invalidate_as(&self, rkey: u32, pd: u32) -> bool {
        let taken = {
            let mut bound = self.bound.lock();
            let current = bound.as_ref().map(|(k, _)| *k);
            if pd != self.pd || current != Some(rkey) {
                return false;
            }
            bound.take()
        };
        if let Some((key, reg)) = taken {
            self.release(key, reg);
        }
        true
    }
}

impl MemoryWindow for OfiMw {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn rkey(&self) -> u32 {
        self.bound.lock().as_ref().map_or(0, |(k, _)| *k)
    }
    fn next_rkey(&self) -> u32 {
        // A fresh key from the device's counter: keys are never reused, so a
        // peer's cached start of an old key never applies to new memory. Its
        // slot is reserved until the bind publishes it (`bind`) or the
        // window goes (`dealloc`).
        let Some(dev) = self.dev.upgrade() else {
            return 0;
        };
        let key = dev.new_key();
        self.reserved.lock().push(key);
        key
    }
    fn pd_id(&self) -> u32 {
        self.pd
    }
    fn invalidate(&self) {
        self.unbind();
    }
    fn dealloc(&self) {
        self.live.store(false, Ordering::Release);
        self.unbind();
        let reserved = std::mem::take(&mut *self.reserved.lock());
        if let Some(dev) = self.dev.upgrade() {
            reserved.into_iter().for_each(|k| dev.release_key(k));
        }
    }
}

impl Drop for OfiMw {
    fn drop(&mut self) {
        self.dealloc();
    }
}

/// The iovec and descriptor arrays of a scatter-gather list. Descriptors
/// only where the provider wants them (FI_MR_LOCAL): otherwise the device's
/// descriptors are not locked on the posting path at all.
pub(crate) fn io_vectors(dev: &Domain, sgl: &[Sge]) -> (Vec<libc::iovec>, Vec<*mut libc::c_void>) {
    let iov = |s: &Sge| libc::iovec {
        iov_base: s.addr as *mut libc::c_void,
        iov_len: s.length as usize,
    };
    if !dev.local_descs {
        return sgl.iter().map(|s| (iov(s), null_mut())).unzip();
    }
    let descs = dev.descs.lock();
    sgl.iter()
        .map(|s| {
            let desc = descs.get(&s.lkey).copied().unwrap_or(0) as *mut libc::c_void;
            (iov(s), desc)
        })
        .unzip()
}
