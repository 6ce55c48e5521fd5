//! A memory window as the engine and `Shared` hold it (`Window`): its key index, its rkeys and
//! whether it grants anything now. Binds and remote invalidations are applied here by the
//! engine, in QP order, against the key registry (keys.rs).
//!
//! Plain state, below the engine; the trait object above it (`TcpMw`, mem.rs) reaches the
//! registry through the device's `Shared` for what the consumer asks of it.

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use crate::keys::{KeyEntry, Keys};

pub(crate) struct Window {
    index: u32,
    /// The rkey of the last bind posted (index << 8 | generation): what the window carries
    /// and what the next bind derives from. A bind posted behind a fence takes effect later.
    rkey: Mutex<u32>,
    /// The key under which the window's current binding is in the key registry (absent
    /// there when the window grants nothing).
    mapped: Mutex<u32>,
    bound: AtomicBool,
    pd: u32,
    live: AtomicBool,
}

impl Window {
    /// The window of key index `index` in PD `pd`, whose first rkey is `key`: bound to nothing.
    pub(crate) fn new(index: u32, key: u32, pd: u32) -> Window {
        Window {
            index,
            rkey: Mutex::new(key),
            mapped: Mutex::new(key),
            bound: AtomicBool::new(false),
            pd,
            live: AtomicBool::new(true),
        }
    }

    pub(crate) fn index(&self) -> u32 {
        self.index
    }

    pub(crate) fn pd(&self) -> u32 {
        self.pd
    }

    /// The rkey of the last bind posted.
    pub(crate) fn rkey(&self) -> u32 {
        *self.rkey.lock()
    }

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

    /// The consumer invalidates the window: its binding leaves the registry.
    pub(crate) fn invalidate(&self, keys: &mut Keys) {
        keys.remove(*self.mapped.lock());
        self.bound.store(false, Ordering::SeqCst);
    }

    /// The window is freed: no bind applies to it from now on. Whether it was live (a second
    /// free does nothing more).
    pub(crate) fn retire(&self) -> bool {
        self.live.swap(false, Ordering::SeqCst)
    }

    /// Its binding and its key index leave the registry (once retired, the device still open).
    pub(crate) fn release(&self, keys: &mut Keys) {
        keys.remove(*self.mapped.lock());
        keys.free_index(self.index);
    }
}
