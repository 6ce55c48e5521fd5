//! Protection domains, memory regions and memory windows: entries of the key registry
//! (keys.rs), and the arenas same-host peers copy through (daplrs_backend::arena). A window's
//! bindings, which the engine applies, are window.rs's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use daplrs_backend::{Error, Resource, Result};
use daplrs_backend::{MemoryRegion, MemoryWindow, ProtectionDomain, Registration};

use crate::keys::KeyEntry;
use crate::samehost;
use crate::shared::Shared;
use crate::window::Window;

pub(crate) struct TcpPd {
    id: u32,
    shared: Arc<Shared>,
}

impl TcpPd {
    pub(crate) fn new(id: u32, shared: Arc<Shared>) -> TcpPd {
        TcpPd { id, shared }
    }
}

impl ProtectionDomain for TcpPd {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn id(&self) -> u32 {
        self.id
    }

    fn reg_mr(&self, addr: u64, length: u64, access: u32) -> Result<Arc<dyn MemoryRegion>> {
        if length == 0 || addr.checked_add(length).is_none() {
            return Err(Error::BadAddress);
        }
        // Memory already in an arena is published with it; other memory moves into one only
        // once peers use it enough (`Shared::promote`), never here.
        let shared_pages = match self.shared.samehost.shares_pages() {
            true => samehost::arena::existing(addr, length),
            false => None,
        };
        let mut keys = self.shared.keys.write();
        let index = keys.alloc_index().ok_or(Error::NoResource(Resource::Key))?;
        let key = keys.first_key(index);
        keys.insert(
            key,
            KeyEntry {
                addr,
                len: length,
                access,
                pd: self.id,
                window: false,
                region: key,
                arena: shared_pages.as_ref().map(|(_, span)| *span),
            },
        );
        drop(keys);
        if let Some((arena, _)) = shared_pages {
            self.shared.arenas.lock().insert(key, arena);
        }
        Ok(Arc::new(TcpMr {
            reg: Registration {
                lkey: key,
                rkey: key,
                addr,
                length,
                access,
                pd_id: self.id,
            },
            shared: Arc::downgrade(&self.shared),
            live: AtomicBool::new(true),
        }))
    }

    fn alloc_mw(&self) -> Result<Arc<dyn MemoryWindow>> {
        let (index, key) = {
            let mut keys = self.shared.keys.write();
            let index = keys.alloc_index().ok_or(Error::NoResource(Resource::Key))?;
            (index, keys.first_key(index))
        };
        let window = Arc::new(Window::new(index, key, self.id));
        let weak = Arc::downgrade(&window);
        self.shared.mws.lock().insert(index, weak);
        Ok(Arc::new(TcpMw {
            window,
            shared: Arc::downgrade(&self.shared),
        }))
    }
}

struct TcpMr {
    /// lkey and rkey are one key (keys.rs).
    reg: Registration,
    shared: Weak<Shared>,
    live: AtomicBool,
}

impl MemoryRegion for TcpMr {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn registration(&self) -> &Registration {
        &self.reg
    }
    fn deregister(&self) {
        if !self.live.swap(false, Ordering::SeqCst) {
            return;
        }
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        {
            let mut keys = shared.keys.write();
            keys.remove(self.reg.lkey);
            // A window bound into this region must not outlive it: its range would then name
            // memory the consumer may unmap.
            keys.remove_windows_of(self.reg.lkey);
            keys.free_index(self.reg.lkey >> 8);
        }
        // After the registry lock: no peer copies through the key any more, and moving the
        // pages back takes hundreds of microseconds. Waits for a move of them in progress.
        let arena = shared.arenas.lock().remove(&self.reg.lkey);
        drop(arena);
    }
}

impl Drop for TcpMr {
    fn drop(&mut self) {
        self.deregister();
    }
}

/// The backend's trait object over a memory window (window.rs), which the engine applies
/// binds to.
pub(crate) struct TcpMw {
    /// What the engine binds (window.rs), which the device's `Shared` finds by key index.
    window: Arc<Window>,
    shared: Weak<Shared>,
}

impl MemoryWindow for TcpMw {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn rkey(&self) -> u32 {
        self.window.rkey()
    }
    fn next_rkey(&self) -> u32 {
        let cur = (self.window.index() << 8) | (self.window.rkey() & 0xff);
        match self.shared.upgrade() {
            Some(shared) => shared.keys.write().next_generation(cur),
            // The device is gone: any key will do, binds on it fail.
            None => (cur & !0xff) | ((cur + 1) & 0xff),
        }
    }
    fn pd_id(&self) -> u32 {
        self.window.pd()
    }
    fn invalidate(&self) {
        if let Some(shared) = self.shared.upgrade() {
            self.window.invalidate(&mut shared.keys.write());
        }
    }
    fn dealloc(&self) {
        if !self.window.retire() {
            return;
        }
        if let Some(shared) = self.shared.upgrade() {
            self.window.release(&mut shared.keys.write());
            shared.mws.lock().remove(&self.window.index());
        }
    }
}

impl Drop for TcpMw {
    fn drop(&mut self) {
        self.dealloc();
    }
}
