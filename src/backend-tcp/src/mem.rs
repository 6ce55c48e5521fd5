//! Protection domains, memory regions and memory windows: entries of the key registry
//! (keys.rs), and the arenas same-host peers copy through (samehost/arena.rs).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use daplrs_backend::{Error, Resource, Result};
use daplrs_backend::{MemoryRegion, MemoryWindow, ProtectionDomain, Registration};

use crate::keys::{KeyEntry, Keys};
use crate::samehost;
use crate::shared::Shared;

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
        let mut keys = self.shared.keys.lock();
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
            let mut keys = self.shared.keys.lock();
            let index = keys.alloc_index().ok_or(Error::NoResource(Resource::Key))?;
            (index, keys.first_key(index))
        };
        let mw = Arc::new(TcpMw {
            index,
            rkey: Mutex::new(key),
            mapped: Mutex::new(key),
            bound: AtomicBool::new(false),
            pd: self.id,
            shared: Arc::downgrade(&self.shared),
            live: AtomicBool::new(true),
        });
        self.shared.mws.lock().insert(index, Arc::downgrade(&mw));
        Ok(mw)
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
            let mut keys = shared.keys.lock();
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

pub(crate) struct TcpMw {
    index: u32,
    /// The rkey of the last bind posted (index << 8 | generation): what the window carries
    /// and what the next bind derives from. A bind posted behind a fence takes effect later.
    rkey: Mutex<u32>,
    /// The key under which the window's current binding is in the key registry (absent
    /// there when the window grants nothing).
    mapped: Mutex<u32>,
    bound: AtomicBool,
    pd: u32,
    shared: Weak<Shared>,
    live: AtomicBool,
}

impl TcpMw {
    /// Applies a bind (mr Some) or unbind (None) with the new rkey; called by the engine in QP
    /// order. Checks the region key is live, in the same PD, and covers the range.
    pub(crate) fn apply_bind(
        &self,
        keys: &mut Keys,
        mr_key: Option<u32>,
        addr: u64,
        length: u64,
        access: u32,
        new_rkey: u32,
    ) -> bool {
        if !self.live.load(Ordering::SeqCst) || new_rkey >> 8 != self.index {
            return false;
        }
        let mut cur = self.mapped.lock();
        keys.remove(*cur);
        *cur = new_rkey;
        self.bound.store(false, Ordering::SeqCst);
        let Some(mr_key) = mr_key else { return true };
        let Some(mr) = keys.get(mr_key) else {
            return false;
        };
        let inside = addr >= mr.addr
            && addr
                .checked_add(length)
                .map(|e| e <= mr.addr + mr.len)
                .unwrap_or(false);
        if mr.window || mr.pd != self.pd || !inside {
            return false;
        }
        keys.insert(
            new_rkey,
            KeyEntry {
                addr,
                len: length,
                access,
                pd: self.pd,
                window: true,
                region: mr_key,
                arena: mr.arena.map(|span| span.advanced(addr - mr.addr)),
            },
        );
        self.bound.store(true, Ordering::SeqCst);
        true
    }

    /// A peer's send-with-invalidate names `rkey`: if that is this window's current binding,
    /// in the PD of the receiving QP, the binding ends (the window grants nothing until bound
    /// again). Returns whether it did.
    pub(crate) fn remote_invalidate(&self, keys: &mut Keys, rkey: u32, pd: u32) -> bool {
        let cur = self.mapped.lock();
        if !self.live.load(Ordering::SeqCst)
            || *cur != rkey
            || self.pd != pd
            || !self.bound.load(Ordering::SeqCst)
        {
            return false;
        }
        keys.remove(rkey);
        self.bound.store(false, Ordering::SeqCst);
        true
    }

    /// A bind on this window was posted with `rkey` (called by the engine at post time).
    pub(crate) fn note_posted(&self, rkey: u32) {
        if rkey >> 8 == self.index {
            *self.rkey.lock() = rkey;
        }
    }
}

impl MemoryWindow for TcpMw {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn rkey(&self) -> u32 {
        *self.rkey.lock()
    }
    fn next_rkey(&self) -> u32 {
        let cur = (self.index << 8) | (*self.rkey.lock() & 0xff);
        match self.shared.upgrade() {
            Some(shared) => shared.keys.lock().next_generation(cur),
            // The device is gone: any key will do, binds on it fail.
            None => (cur & !0xff) | ((cur + 1) & 0xff),
        }
    }
    fn pd_id(&self) -> u32 {
        self.pd
    }
    fn invalidate(&self) {
        if let Some(shared) = self.shared.upgrade() {
            let mut keys = shared.keys.lock();
            keys.remove(*self.mapped.lock());
            self.bound.store(false, Ordering::SeqCst);
        }
    }
    fn dealloc(&self) {
        if !self.live.swap(false, Ordering::SeqCst) {
            return;
        }
        if let Some(shared) = self.shared.upgrade() {
            let mut keys = shared.keys.lock();
            keys.remove(*self.mapped.lock());
            keys.free_index(self.index);
            drop(keys);
            shared.mws.lock().remove(&self.index);
        }
    }
}

impl Drop for TcpMw {
    fn drop(&mut self) {
        self.dealloc();
    }
}
