//! The objects behind C's handles, by kind: how the C layer turns a handle into an object.
//!
//! Every object registers its handle in `handle_table`, which holds it erased (it sits below
//! the objects). This module, above them all, names every kind: the typed lookups (`handle::ep`,
//! `handle::pz`, ...), which check a handle against the table before anything is read through
//! it and give DAT_INVALID_HANDLE with the kind's subtype for a NULL, freed, stale or
//! wrong-type one, and `Object`, what an untyped handle names.
//!
//! A typed lookup is a load of the handle's slot and a reference taken (handle_table's `slot`):
//! no lock and no cache, the same for every kind. A data transfer call holds its EP or EVD in
//! the slot for the call instead (`ep_held`, `evd_held`: no reference).

use std::sync::Arc;

use super::cno::Cno;
use super::cr::Cr;
use super::ep::Ep;
use super::error::{DatError, DatResult, SubType};
use super::evd::Evd;
use super::handle_table::{self, AnyObject, HandleObject};
use super::ia::Ia;
use super::lmr::Lmr;
use super::pz::Pz;
use super::rmr::Rmr;
use super::sp::Sp;
use super::srq::Srq;

pub use super::handle_table::{
    consumer_context, handle_type, set_consumer_context, set_dispatch, Handle, HandleKind, Held,
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

/// The one type of each kind's objects (a slot of a kind holds that type).
macro_rules! handle_object {
    ($ty:ty: $($kind:expr),+) => {
        impl HandleObject for $ty {
            const KINDS: &'static [HandleKind] = &[$($kind),+];
        }
    };
}
handle_object!(Ia: HandleKind::Ia);
handle_object!(Pz: HandleKind::Pz);
handle_object!(Lmr: HandleKind::Lmr);
handle_object!(Rmr: HandleKind::Rmr);
handle_object!(Evd: HandleKind::Evd);
handle_object!(Cno: HandleKind::Cno);
handle_object!(Ep: HandleKind::Ep);
handle_object!(Sp: HandleKind::Psp, HandleKind::Rsp, HandleKind::Csp);
handle_object!(Cr: HandleKind::Cr);
handle_object!(Srq: HandleKind::Srq);

macro_rules! typed_lookup {
    ($fn_name:ident, $ty:ty, $kind:expr) => {
        /// Typed lookup; a NULL, freed, stale or wrong-type handle gives INVALID_HANDLE with the
        /// kind's subtype.
        #[inline]
        pub fn $fn_name(handle: Handle) -> DatResult<Arc<$ty>> {
            handle_table::get::<$ty>(handle, $kind).ok_or_else(|| $kind.invalid())
        }
    };
}

typed_lookup!(ia, Ia, HandleKind::Ia);
typed_lookup!(pz, Pz, HandleKind::Pz);
typed_lookup!(lmr, Lmr, HandleKind::Lmr);
typed_lookup!(rmr, Rmr, HandleKind::Rmr);
typed_lookup!(cno, Cno, HandleKind::Cno);
typed_lookup!(psp, Sp, HandleKind::Psp);
typed_lookup!(rsp, Sp, HandleKind::Rsp);
typed_lookup!(cr, Cr, HandleKind::Cr);
typed_lookup!(srq, Srq, HandleKind::Srq);
typed_lookup!(csp, Sp, HandleKind::Csp);

/// EP lookup with the subtype `bad` for a bad handle (some calls name the EP's role).
#[inline]
pub fn ep_as(handle: Handle, bad: SubType) -> DatResult<Arc<Ep>> {
    handle_table::get::<Ep>(handle, HandleKind::Ep).ok_or_else(|| DatError::invalid_handle(bad))
}

/// EP lookup (see `ep_as`), with the EP subtype.
#[inline]
pub fn ep(handle: Handle) -> DatResult<Arc<Ep>> {
    ep_as(handle, SubType::InvalidHandleEp)
}

/// An EP held for one data transfer call (see `handle_table::hold`), with the EP subtype.
#[inline]
pub fn ep_held(handle: Handle) -> DatResult<Held<Ep>> {
    handle_table::hold::<Ep>(handle, HandleKind::Ep)
        .ok_or_else(|| DatError::invalid_handle(SubType::InvalidHandleEp))
}

/// An EVD held for one dequeue (see `handle_table::hold`), with the subtype `bad`.
#[inline]
pub fn evd_held(handle: Handle, bad: SubType) -> DatResult<Held<Evd>> {
    handle_table::hold::<Evd>(handle, HandleKind::Evd).ok_or_else(|| DatError::invalid_handle(bad))
}

/// EVD lookup with the role-specific subtype (INVALID_HANDLE_EVD_CONN, _EVD_REQUEST, ...).
#[inline]
pub fn evd(handle: Handle, bad: SubType) -> DatResult<Arc<Evd>> {
    handle_table::get::<Evd>(handle, HandleKind::Evd).ok_or_else(|| DatError::invalid_handle(bad))
}

/// An optional EVD argument: NULL means none.
pub fn evd_opt(handle: Handle, bad: SubType) -> DatResult<Option<Arc<Evd>>> {
    if handle.is_null() {
        Ok(None)
    } else {
        evd(handle, bad).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind has one type: the slot of a kind's handle holds that type's object.
    #[test]
    fn every_kind_has_one_type() {
        let lists: [&[HandleKind]; 10] = [
            Ia::KINDS,
            Pz::KINDS,
            Lmr::KINDS,
            Rmr::KINDS,
            Evd::KINDS,
            Cno::KINDS,
            Ep::KINDS,
            Sp::KINDS,
            Cr::KINDS,
            Srq::KINDS,
        ];
        let all: Vec<HandleKind> = lists.iter().flat_map(|l| l.iter().copied()).collect();
        for kind in [
            HandleKind::Ia,
            HandleKind::Pz,
            HandleKind::Lmr,
            HandleKind::Rmr,
            HandleKind::Evd,
            HandleKind::Cno,
            HandleKind::Ep,
            HandleKind::Psp,
            HandleKind::Rsp,
            HandleKind::Cr,
            HandleKind::Srq,
            HandleKind::Csp,
        ] {
            assert_eq!(all.iter().filter(|k| **k == kind).count(), 1, "{kind:?}");
        }
        assert_eq!(all.len(), 12);
    }
}
