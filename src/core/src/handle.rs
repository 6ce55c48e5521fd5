//! The objects behind C's handles, by kind: how the C layer turns a handle into an object.
//!
//! Every object registers its handle in `handle_table`, which holds it erased (it sits below
//! the objects). This module, above them all, names every kind: the typed lookups (`handle::ep`,
//! `handle::pz`, ...), which check a handle against the table before anything is read through
//! it and give DAT_INVALID_HANDLE with the kind's subtype for a NULL, freed, stale or
//! wrong-type one, and `Object`, what an untyped handle names.
//!
//! `handle::ep` and `handle::evd`, on every data transfer, first try the calling thread's last
//! lookups of their kind (`cached_lookup!`).

use std::cell::RefCell;
use std::sync::{Arc, Weak};

use super::cno::Cno;
use super::cr::Cr;
use super::ep::Ep;
use super::error::{DatError, DatResult, SubType};
use super::evd::Evd;
use super::handle_table::{self, AnyObject};
use super::ia::Ia;
use super::lmr::Lmr;
use super::pz::Pz;
use super::rmr::Rmr;
use super::sp::Sp;
use super::srq::Srq;

pub use super::handle_table::{
    consumer_context, handle_type, set_consumer_context, set_dispatch, Handle, HandleKind,
};

/// A live object, whatever its kind.
#[derive(Clone)]
pub enum Object {
    Ia(Arc<Ia>),
    Pz(Arc<Pz>),
    Lmr(Arc<Lmr>),
    Rmr(Arc<Rmr>),
    Evd(Arc<Evd>),
    Cno(Arc<Cno>),
    Ep(Arc<Ep>),
    Psp(Arc<Sp>),
    Rsp(Arc<Sp>),
    Cr(Arc<Cr>),
    Srq(Arc<Srq>),
    Csp(Arc<Sp>),
}

impl Object {
    pub fn kind(&self) -> HandleKind {
        match self {
            Object::Ia(_) => HandleKind::Ia,
            Object::Pz(_) => HandleKind::Pz,
            Object::Lmr(_) => HandleKind::Lmr,
            Object::Rmr(_) => HandleKind::Rmr,
            Object::Evd(_) => HandleKind::Evd,
            Object::Cno(_) => HandleKind::Cno,
            Object::Ep(_) => HandleKind::Ep,
            Object::Psp(_) => HandleKind::Psp,
            Object::Rsp(_) => HandleKind::Rsp,
            Object::Cr(_) => HandleKind::Cr,
            Object::Srq(_) => HandleKind::Srq,
            Object::Csp(_) => HandleKind::Csp,
        }
    }

    /// The object the handle table holds as `object` of `kind` (None only if an object was
    /// registered under another kind's type, which no create does).
    fn of(kind: HandleKind, object: Arc<AnyObject>) -> Option<Object> {
        Some(match kind {
            HandleKind::Ia => Object::Ia(object.downcast().ok()?),
            HandleKind::Pz => Object::Pz(object.downcast().ok()?),
            HandleKind::Lmr => Object::Lmr(object.downcast().ok()?),
            HandleKind::Rmr => Object::Rmr(object.downcast().ok()?),
            HandleKind::Evd => Object::Evd(object.downcast().ok()?),
            HandleKind::Cno => Object::Cno(object.downcast().ok()?),
            HandleKind::Ep => Object::Ep(object.downcast().ok()?),
            HandleKind::Psp => Object::Psp(object.downcast().ok()?),
            HandleKind::Rsp => Object::Rsp(object.downcast().ok()?),
            HandleKind::Cr => Object::Cr(object.downcast().ok()?),
            HandleKind::Srq => Object::Srq(object.downcast().ok()?),
            HandleKind::Csp => Object::Csp(object.downcast().ok()?),
        })
    }
}

/// The live object behind `handle`, whatever its kind.
pub fn lookup_any(handle: Handle) -> Option<Object> {
    let (kind, object) = handle_table::get_any(handle)?;
    Object::of(kind, object)
}

/// Every live object owned by the IA `ia`.
pub fn children(ia: Handle) -> Vec<(Handle, Object)> {
    handle_table::children(ia)
        .into_iter()
        .filter_map(|(h, kind, object)| Some((h, Object::of(kind, object)?)))
        .collect()
}

macro_rules! typed_lookup {
    ($fn_name:ident, $ty:ty, $kind:expr) => {
        /// Typed lookup; a NULL, freed, stale or wrong-type handle gives INVALID_HANDLE with the
        /// kind's subtype.
        pub fn $fn_name(handle: Handle) -> DatResult<Arc<$ty>> {
            handle_table::get::<$ty>(handle, $kind).ok_or_else(|| $kind.invalid())
        }
    };
}

/// The last handle of one kind a thread looked up, for the data-transfer path: a program
/// posts on and polls the same EP and EVD over and over, and each lookup through the table
/// (its lock, its map, a reference count up and down) cost a tenth of an RDMA read's
/// instructions on the verbs path. The cache holds a `Weak`, so it keeps no object alive.
struct LastLookup<T> {
    handle: usize,
    removals: u64,
    object: Weak<T>,
}

impl<T> LastLookup<T> {
    const EMPTY: LastLookup<T> = LastLookup {
        handle: 0,
        removals: u64::MAX,
        object: Weak::new(),
    };

    /// The cached object if `handle` is the one cached and no handle was removed since.
    fn get(&self, handle: Handle, removals: u64) -> Option<Arc<T>> {
        if self.handle != handle.addr() || self.removals != removals {
            return None;
        }
        self.object.upgrade()
    }
}

/// A thread's last two lookups of one kind, the latest first: a program that alternates
/// between two objects of a kind (a send ping-pong waits on its request EVD, then on its
/// receive EVD) finds both.
struct LastLookups<T>([LastLookup<T>; 2]);

impl<T> LastLookups<T> {
    const EMPTY: LastLookups<T> = LastLookups([LastLookup::EMPTY, LastLookup::EMPTY]);

    fn get(&self, handle: Handle) -> Option<Arc<T>> {
        let removals = handle_table::removals();
        self.0.iter().find_map(|l| l.get(handle, removals))
    }

    fn remember(&mut self, latest: LastLookup<T>) {
        self.0.swap(0, 1);
        self.0[0] = latest;
    }
}

macro_rules! cached_lookup {
    ($fn_name:ident, $slow_name:ident, $cache:ident, $ty:ty, $kind:expr) => {
        thread_local! {
            static $cache: RefCell<LastLookups<$ty>> = const { RefCell::new(LastLookups::EMPTY) };
        }

        /// Typed lookup, first through this thread's last lookups of the kind (see
        /// `LastLookups`); a NULL, freed, stale or wrong-type handle gives INVALID_HANDLE with
        /// `bad`. Inlined into each entry point that takes such a handle: a hit is the cache's
        /// look and nothing else (the call of a function that also holds the table's path cost
        /// about as much again, saving and restoring the registers that path needs).
        #[inline]
        pub fn $fn_name(handle: Handle, bad: SubType) -> DatResult<Arc<$ty>> {
            match $cache.with(|c| c.borrow().get(handle)) {
                Some(o) => Ok(o),
                None => $slow_name(handle, bad),
            }
        }

        /// `$fn_name` through the table, remembering what it finds.
        #[cold]
        #[inline(never)]
        fn $slow_name(handle: Handle, bad: SubType) -> DatResult<Arc<$ty>> {
            // Read before the table: a removal between the two leaves the entry stale.
            let removals = handle_table::removals();
            match handle_table::get::<$ty>(handle, $kind) {
                Some(o) => {
                    $cache.with(|c| {
                        c.borrow_mut().remember(LastLookup {
                            handle: handle.addr(),
                            removals,
                            object: Arc::downgrade(&o),
                        })
                    });
                    Ok(o)
                }
                None => Err(DatError::invalid_handle(bad)),
            }
        }
    };
}

typed_lookup!(ia, Ia, HandleKind::Ia);
typed_lookup!(pz, Pz, HandleKind::Pz);
typed_lookup!(lmr, Lmr, HandleKind::Lmr);
typed_lookup!(rmr, Rmr, HandleKind::Rmr);
typed_lookup!(cno, Cno, HandleKind::Cno);
cached_lookup!(ep_as, ep_from_table, LAST_EP, Ep, HandleKind::Ep);

/// EP lookup (see `ep_as`), with the EP subtype.
#[inline]
pub fn ep(handle: Handle) -> DatResult<Arc<Ep>> {
    ep_as(handle, SubType::InvalidHandleEp)
}
typed_lookup!(psp, Sp, HandleKind::Psp);
typed_lookup!(rsp, Sp, HandleKind::Rsp);
typed_lookup!(cr, Cr, HandleKind::Cr);
typed_lookup!(srq, Srq, HandleKind::Srq);
typed_lookup!(csp, Sp, HandleKind::Csp);

// EVD lookup with the role-specific subtype (INVALID_HANDLE_EVD_CONN, _EVD_REQUEST, ...).
cached_lookup!(evd, evd_from_table, LAST_EVD, Evd, HandleKind::Evd);

/// An optional EVD argument: NULL means none.
pub fn evd_opt(handle: Handle, bad: SubType) -> DatResult<Option<Arc<Evd>>> {
    if handle.is_null() {
        Ok(None)
    } else {
        evd(handle, bad).map(Some)
    }
}
