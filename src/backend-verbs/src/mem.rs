//! Protection domain, memory regions and memory windows (type 2, bound by work requests).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use rdma_sys::*;

use super::shared::Shared;
use super::sys::Ptr;
use daplrs_backend::{Error, Resource, Result};
use daplrs_backend::{MemoryRegion, MemoryWindow, ProtectionDomain, Registration};

pub(crate) struct PdInner {
    pub(super) id: u32,
    pub(super) pd: Ptr<ibv_pd>,
    pub(super) shared: Arc<Shared>,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: every MR, MW, SRQ and QP of the PD holds an Arc to it, so none is left.
        let rc = unsafe { ibv_dealloc_pd(self.pd.0) };
        if rc != 0 {
            log::warn!("ibv_dealloc_pd: error {rc}");
        }
    }
}

pub(crate) struct VerbsPd {
    pub(super) inner: Arc<PdInner>,
}

impl VerbsPd {
    pub(super) fn alloc(shared: &Arc<Shared>) -> Result<Arc<VerbsPd>> {
        // SAFETY: the device context lives as long as `shared`.
        let pd = unsafe { ibv_alloc_pd(shared.ctx.0) };
        if pd.is_null() {
            return Err(Error::NoResource(Resource::Pd));
        }
        Ok(Arc::new(VerbsPd {
            inner: Arc::new(PdInner {
                id: shared.next_id() as u32,
                pd: Ptr(pd),
                shared: shared.clone(),
            }),
        }))
    }
}

impl ProtectionDomain for VerbsPd {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn id(&self) -> u32 {
        self.inner.id
    }
    fn reg_mr(&self, addr: u64, length: u64, access: u32) -> Result<Arc<dyn MemoryRegion>> {
        // The backend's access bits are the IBV_ACCESS_* values: the device gets what the
        // consumer asked for, no more (an iWARP NIC's read sinks: sink.rs).
        let shared = &self.inner.shared;
        let remote_read = access & ibv_access_flags::IBV_ACCESS_REMOTE_READ.0 != 0;
        let remote_write = access & ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0 != 0;
        // SAFETY: the caller guarantees [addr, addr+length) is valid memory until deregister.
        let mr = unsafe {
            ibv_reg_mr(
                self.inner.pd.0,
                addr as usize as *mut libc::c_void,
                length as usize,
                access as i32,
            )
        };
        if mr.is_null() {
            let e = super::sys::errno();
            log::debug!("ibv_reg_mr({addr:#x}, {length}): errno {e}");
            if e == libc::ENOMEM {
                pin_limit_reached(&shared.name, shared.attr.pin_limit, length);
            }
            return Err(match e {
                // Memory that is not there, or not writable for write access (the TCP
                // backend refuses the same memory the same way).
                libc::EFAULT => Error::BadAddress,
                _ => Error::NoResource(Resource::Key),
            });
        }
        if !shared.checks_remote_read && remote_write && !remote_read {
            // A peer that may write such a region could read it too (`checks_remote_read`):
            // refused, rather than grant more than asked; after the registration, so that
            // memory that cannot be registered at all is refused as on any device.
            // SAFETY: the MR we just registered, not handed out.
            unsafe { ibv_dereg_mr(mr) };
            log::warn!(
                "verbs {}: a region peers may write but not read: this device lets a peer \
                 read every region it may write (siw checks no remote read right); refused",
                shared.name
            );
            return Err(Error::Unsupported);
        }
        // SAFETY: the MR we just registered.
        let rkey = unsafe { (*mr).rkey };
        Ok(Arc::new(VerbsMr {
            mr: Mutex::new(Ptr(mr)),
            reg: Registration {
                // SAFETY: as above.
                lkey: unsafe { (*mr).lkey },
                // A region with no remote right on a device that would let a peer read it by
                // its STag anyway: the context handed out names no STag the device knows (its
                // key byte differs, which siw compares), so no peer reads the region through it.
                rkey: match shared.checks_remote_read || remote_read || remote_write {
                    true => rkey,
                    false => rkey ^ HIDDEN_KEY_BIT,
                },
                addr,
                length,
                access,
                pd_id: self.inner.id,
            },
            _pd: self.inner.clone(),
        }))
    }
    fn alloc_mw(&self) -> Result<Arc<dyn MemoryWindow>> {
        Ok(VerbsMw::alloc(&self.inner)?)
    }
}

/// A registration refused for lack of memory where registrations pin against the locked-memory
/// limit: said once per process (an error, shown with no DAT_LOG set), since the remedy is
/// the user's (siw pins against it even for root; Debian's default is 8 MiB).
fn pin_limit_reached(device: &str, limit: Option<u64>, length: u64) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let Some(limit) = limit else {
        return;
    };
    if !SAID.swap(true, Ordering::Relaxed) {
        log::error!(
            "verbs {device}: registering {length} bytes failed: out of locked memory? \
             Registrations pin their pages against RLIMIT_MEMLOCK, {} KiB here: raise it \
             (ulimit -l, limits.conf memlock)",
            limit / 1024
        );
    }
}

/// Flipped in the key byte of a region's STag to make the rmr_context of a region with no
/// remote right on a device that does not check the read right (`Shared::checks_remote_read`).
const HIDDEN_KEY_BIT: u32 = 0x80;

pub(crate) struct VerbsMr {
    /// NULL once deregistered.
    pub(super) mr: Mutex<Ptr<ibv_mr>>,
    reg: Registration,
    /// Held, not read: the PD is deallocated (PdInner's drop) only after its regions.
    _pd: Arc<PdInner>,
}

impl MemoryRegion for VerbsMr {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn registration(&self) -> &Registration {
        &self.reg
    }
    fn deregister(&self) {
        let mut mr = self.mr.lock();
        if mr.is_null() {
            return;
        }
        // SAFETY: our MR, deregistered once.
        let rc = unsafe { ibv_dereg_mr(mr.0) };
        if rc != 0 {
            log::warn!("ibv_dereg_mr: error {rc}");
        }
        *mr = Ptr::null();
    }
}

impl Drop for VerbsMr {
    fn drop(&mut self) {
        self.deregister();
    }
}

pub(crate) struct VerbsMw {
    /// Lets a bind work request keep the window it binds (the core hands it over as a trait
    /// object).
    pub(super) me: Weak<VerbsMw>,
    /// The window; replaced by a fresh one when a binding must die at once (see `invalidate`).
    pub(super) mw: Mutex<Ptr<ibv_mw>>,
    /// The rkey a bind gave last (the 8-bit tag advances with every bind).
    tag: AtomicU32,
    /// The rkey that grants access now (0 while unbound).
    bound: AtomicU32,
    /// The rkey of the last bind posted, until an invalidation is posted (0: none). A type 2
    /// window must be invalidated before it is bound again.
    pub(super) live: AtomicU32,
    /// The QP the last bind went through: a type 2 binding holds its QP, which cannot be
    /// destroyed promptly until the window lets go (see `VerbsQp::release_windows`).
    pub(super) bound_qp: AtomicU32,
    pd: Arc<PdInner>,
}

impl VerbsMw {
    fn alloc(pd: &Arc<PdInner>) -> Result<Arc<VerbsMw>> {
        let mw = Self::alloc_raw(pd)?;
        Ok(Arc::new_cyclic(|me| VerbsMw {
            me: me.clone(),
            // SAFETY: the window we just allocated.
            tag: AtomicU32::new(unsafe { (*mw.0).rkey }),
            mw: Mutex::new(mw),
            bound: AtomicU32::new(0),
            live: AtomicU32::new(0),
            bound_qp: AtomicU32::new(0),
            pd: pd.clone(),
        }))
    }

    fn alloc_raw(pd: &Arc<PdInner>) -> Result<Ptr<ibv_mw>> {
        if !pd.shared.mw_type2 {
            // rdma-sys's inline helpers unwrap the device's function pointers: never call
            // them on a device without windows.
            return Err(Error::Unsupported);
        }
        // SAFETY: the device supports type 2 windows (checked at open).
        match unsafe { ibv_alloc_mw(pd.pd.0, ibv_mw_type::IBV_MW_TYPE_2) } {
            Some(p) if !p.is_null() => Ok(Ptr(p)),
            _ => Err(Error::NoResource(Resource::Key)),
        }
    }

    pub(super) fn raw(&self) -> *mut ibv_mw {
        self.mw.lock().0
    }

    /// A bind with `rkey` completed: that rkey grants access now (0: unbound).
    pub(super) fn set_bound(&self, rkey: u32) {
        self.bound.store(rkey, Ordering::SeqCst);
    }
}

impl MemoryWindow for VerbsMw {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn rkey(&self) -> u32 {
        self.bound.load(Ordering::SeqCst)
    }
    fn next_rkey(&self) -> u32 {
        // Reserve the next tag now: a bind that fails leaves a gap, never a reuse.
        let mut cur = self.tag.load(Ordering::SeqCst);
        loop {
            let next = (cur & !0xff) | (cur.wrapping_add(1) & 0xff);
            match self
                .tag
                .compare_exchange(cur, next, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return next,
                Err(actual) => cur = actual,
            }
        }
    }
    fn pd_id(&self) -> u32 {
        self.pd.id
    }
    fn invalidate(&self) {
        // A bind failed or was flushed, typically on a QP in error where no invalidation can be
        // posted: replace the window, so whatever rkey it granted dies now.
        let mut mw = self.mw.lock();
        if mw.is_null() {
            return;
        }
        if let Ok(fresh) = Self::alloc_raw(&self.pd) {
            // SAFETY: the old window is ours and no bind on it is outstanding.
            unsafe { ibv_dealloc_mw(mw.0) };
            // SAFETY: the new window.
            self.tag.store(unsafe { (*fresh.0).rkey }, Ordering::SeqCst);
            *mw = fresh;
        }
        self.bound.store(0, Ordering::SeqCst);
        self.live.store(0, Ordering::SeqCst);
        self.bound_qp.store(0, Ordering::SeqCst);
    }
    fn dealloc(&self) {
        let mut mw = self.mw.lock();
        if mw.is_null() {
            return;
        }
        // SAFETY: our window, freed once.
        let rc = unsafe { ibv_dealloc_mw(mw.0) };
        if rc != 0 {
            log::warn!("ibv_dealloc_mw: error {rc}");
        }
        *mw = Ptr::null();
        self.bound.store(0, Ordering::SeqCst);
    }
}

impl Drop for VerbsMw {
    fn drop(&mut self) {
        self.dealloc();
    }
}

/// The PD behind a trait object of this backend's.
pub(super) fn downcast_pd(pd: &dyn ProtectionDomain) -> Result<Arc<PdInner>> {
    pd.as_any()
        .downcast_ref::<VerbsPd>()
        .map(|p| p.inner.clone())
        .ok_or(Error::Internal)
}
