//! Handle values and the table of live handles, for every kind of DAT object.
//!
//! C receives the address of a slot whose first word holds the DAT_PROVIDER pointer its
//! registry dispatches through (`space`: a new slot for every creation, so a handle value names
//! one object for at least 2^32 further creations: its place in the stretch is its generation).
//! A typed lookup (`get::<Ep>`) checks that the value is a slot of the stretch before it reads
//! it, and the slot gives its object only while it is live and of the kind asked for
//! (`slot`): a freed, stale or foreign handle is rejected without a lock or a dereference
//! outside the stretch. The table, keyed by the same address, holds what slower calls need:
//! each object's owner and consumer context, and an IA's objects.
//!
//! The table names no object type: it sits below the objects, which register themselves in it
//! when they are created, so it holds each as an `AnyObject` tagged with its `HandleKind`, and
//! hands it back typed to code that names the type (`HandleObject` says which kinds a type's
//! objects have). What needs every kind at once (the C layer's typed lookups, an IA's close) is
//! in `handle`, above the objects.

mod slot;
mod space;

use std::any::Any;
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::consts::handle_type;
use super::error::{DatError, DatResult, Param, SubType};
use daplrs_backend::intmap::IntMap;
use space::Space;

/// A DAT object of any kind, as code below its kind's module holds it; that module (or one
/// above it) downcasts it to the type.
pub(crate) type AnyObject = dyn Any + Send + Sync;

/// A type whose objects handles name, and the kinds of those handles: the one type of every
/// kind (`handle`'s test checks that no kind has two), so a slot of a kind holds that type.
pub trait HandleObject: Any + Send + Sync {
    const KINDS: &'static [HandleKind];
}

/// A handle value: the address of its word (0 = DAT_HANDLE_NULL).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Handle(usize);

impl Handle {
    pub const NULL: Handle = Handle(0);

    /// Wraps any pointer a caller passed in; nothing is read through it.
    pub fn from_ptr(ptr: *const c_void) -> Handle {
        Handle(ptr as usize)
    }
    pub fn as_ptr(self) -> *mut c_void {
        self.0 as *mut c_void
    }
    pub fn is_null(self) -> bool {
        self.0 == 0
    }
    pub fn addr(self) -> usize {
        self.0
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HandleKind {
    Ia,
    Pz,
    Lmr,
    Rmr,
    Evd,
    Cno,
    Ep,
    Psp,
    Rsp,
    Cr,
    Srq,
    Csp,
}

impl HandleKind {
    /// DAT_HANDLE_TYPE value.
    pub fn dat_type(self) -> u32 {
        match self {
            HandleKind::Ia => handle_type::IA,
            HandleKind::Pz => handle_type::PZ,
            HandleKind::Lmr => handle_type::LMR,
            HandleKind::Rmr => handle_type::RMR,
            HandleKind::Evd => handle_type::EVD,
            HandleKind::Cno => handle_type::CNO,
            HandleKind::Ep => handle_type::EP,
            HandleKind::Psp => handle_type::PSP,
            HandleKind::Rsp => handle_type::RSP,
            HandleKind::Cr => handle_type::CR,
            HandleKind::Srq => handle_type::SRQ,
            HandleKind::Csp => handle_type::CSP,
        }
    }

    /// The DAT_INVALID_HANDLE subtype for a bad handle of this kind. EVD handles have one
    /// subtype per role; callers that know the role pass it to `handle::evd` instead.
    pub fn invalid_subtype(self) -> SubType {
        match self {
            HandleKind::Ia => SubType::InvalidHandleIa,
            HandleKind::Pz => SubType::InvalidHandlePz,
            HandleKind::Lmr => SubType::InvalidHandleLmr,
            HandleKind::Rmr => SubType::InvalidHandleRmr,
            HandleKind::Evd => SubType::InvalidHandle1,
            HandleKind::Cno => SubType::InvalidHandleCno,
            HandleKind::Ep => SubType::InvalidHandleEp,
            HandleKind::Psp => SubType::InvalidHandlePsp,
            HandleKind::Rsp => SubType::InvalidHandleRsp,
            HandleKind::Cr => SubType::InvalidHandleCr,
            HandleKind::Srq => SubType::InvalidHandleSrq,
            HandleKind::Csp => SubType::InvalidHandleCsp,
        }
    }

    pub fn invalid(self) -> DatError {
        DatError::invalid_handle(self.invalid_subtype())
    }
}

struct Entry {
    object: Arc<AnyObject>,
    kind: HandleKind,
    /// The IA this object belongs to (NULL for an IA).
    owner: Handle,
    consumer_context: u64,
}

struct Table {
    live: IntMap<usize, Entry>,
    /// Handles reserved for an object under construction.
    reserved: IntMap<usize, HandleKind>,
    /// Where handle values come from.
    space: Space,
    /// Live objects per owning IA and kind: what the IA's limits (max_eps, max_lmrs, ...) are
    /// checked against (`owned_count`).
    owned: IntMap<(usize, HandleKind), usize>,
}

impl Table {
    /// Whether `owner` is a live IA: its counters count what its objects' handles do.
    fn is_live_ia(&self, owner: Handle) -> bool {
        self.live
            .get(&owner.0)
            .is_some_and(|e| e.kind == HandleKind::Ia)
    }
}

static TABLE: OnceLock<Mutex<Table>> = OnceLock::new();

fn table() -> &'static Mutex<Table> {
    TABLE.get_or_init(|| {
        Mutex::new(Table {
            live: IntMap::default(),
            reserved: IntMap::default(),
            space: Space::new(),
            owned: IntMap::default(),
        })
    })
}

/// A handle set aside for an object under construction. Dropping it without `commit` gives
/// the value up (it is not reissued for 2^32 creations, like any freed one).
pub(crate) struct Reservation {
    handle: Handle,
    kind: HandleKind,
    committed: bool,
}

impl Reservation {
    pub(crate) fn handle(&self) -> Handle {
        self.handle
    }
    pub(crate) fn kind(&self) -> HandleKind {
        self.kind
    }

    /// Makes the object reachable through its handle, as an object of the reserved kind owned
    /// by the IA `owner` (NULL for an IA). Returns whether `owner` is a live IA, whose
    /// counters then count the creation (`Ia::commit`).
    pub(crate) fn commit<T: HandleObject>(mut self, object: Arc<T>, owner: Handle) -> bool {
        assert!(
            T::KINDS.contains(&self.kind),
            "a handle of another type's kind"
        );
        let mut t = table().lock();
        space::slot_at(self.handle.0).publish(object.clone(), self.kind);
        t.reserved.remove(&self.handle.0);
        let owner_live = t.is_live_ia(owner);
        if !owner.is_null() {
            *t.owned.entry((owner.0, self.kind)).or_default() += 1;
        }
        t.live.insert(
            self.handle.0,
            Entry {
                object,
                kind: self.kind,
                owner,
                consumer_context: 0,
            },
        );
        self.committed = true;
        owner_live
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.committed {
            let mut t = table().lock();
            t.reserved.remove(&self.handle.0);
            t.space.give_back(self.handle.0);
        }
    }
}

/// Takes a new handle value for an object of `kind`, whose word is `dispatch`: the address of
/// the C dispatch table the registry calls this handle's functions through (the owning IA's,
/// see `Ia::dispatch`; the core never reads it).
pub(crate) fn reserve(kind: HandleKind, dispatch: usize) -> Reservation {
    let mut t = table().lock();
    let Table {
        live,
        reserved,
        space,
        ..
    } = &mut *t;
    let addr = space.take(dispatch, |a| {
        live.contains_key(&a) || reserved.contains_key(&a)
    });
    reserved.insert(addr, kind);
    Reservation {
        handle: Handle(addr),
        kind,
        committed: false,
    }
}

/// Points a live handle at another dispatch table (an IA learns its entry's table after open).
pub fn set_dispatch(handle: Handle, dispatch: usize) {
    let t = table().lock();
    if t.live.contains_key(&handle.0) || t.reserved.contains_key(&handle.0) {
        space::slot_at(handle.0)
            .dispatch
            .store(dispatch, Ordering::SeqCst);
    }
}

/// The live object behind `handle` and its kind.
pub(crate) fn get_any(handle: Handle) -> Option<(HandleKind, Arc<AnyObject>)> {
    if handle.is_null() {
        return None;
    }
    let t = table().lock();
    t.live.get(&handle.0).map(|e| (e.kind, e.object.clone()))
}

/// The live object behind `handle` if it is of `kind` (one of `T`'s kinds): no lock, a load of
/// its slot and a reference taken (inlined into every entry point that takes a handle).
#[inline]
pub(crate) fn get<T: HandleObject>(handle: Handle, kind: HandleKind) -> Option<Arc<T>> {
    if !T::KINDS.contains(&kind) {
        return None;
    }
    space::slot(handle.0)?.get(kind)
}

/// The live object behind `handle` if it is of `kind`, held by its slot for as long as the
/// `Held` lives, without a reference of its own: what a data transfer call uses, which needs
/// the object only for the call (two atomic adds on the slot, not four with a reference).
/// A free meanwhile leaves the object to the last holder to drop, so a `Held` must not be
/// kept beyond the call, nor across the free of its own handle.
#[inline]
pub(crate) fn hold<T: HandleObject>(handle: Handle, kind: HandleKind) -> Option<Held<T>> {
    if !T::KINDS.contains(&kind) {
        return None;
    }
    let slot = space::slot(handle.0)?;
    let object = std::ptr::NonNull::new(slot.hold::<T>(kind)?.cast_mut())?;
    Some(Held { slot, object })
}

/// An object held by its handle's slot (see `hold`).
pub struct Held<T: HandleObject> {
    slot: &'static slot::Slot,
    object: std::ptr::NonNull<T>,
}

impl<T: HandleObject> Held<T> {
    /// A reference of the caller's own, to keep beyond the call.
    pub fn arc(&self) -> Arc<T> {
        // SAFETY: held, `object` is the slot's `Arc<T>`'s object, alive.
        unsafe {
            Arc::increment_strong_count(self.object.as_ptr());
            Arc::from_raw(self.object.as_ptr())
        }
    }
}

impl<T: HandleObject> std::ops::Deref for Held<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the slot holds the object alive while `self` lives (`Slot::hold`).
        unsafe { self.object.as_ref() }
    }
}

impl<T: HandleObject> Drop for Held<T> {
    fn drop(&mut self) {
        self.slot.unhold();
    }
}

/// Removes a live handle of `kind`; later lookups fail. Its value is not reissued for 2^32
/// creations. Returns whether its owner is a live IA, whose counters then count the removal
/// (`Ia::remove`).
pub(crate) fn remove(handle: Handle, kind: HandleKind) -> DatResult<bool> {
    let mut t = table().lock();
    match t.live.get(&handle.0) {
        Some(e) if e.kind == kind => {}
        _ => return Err(kind.invalid()),
    }
    let entry = t.live.remove(&handle.0).ok_or_else(|| kind.invalid())?;
    // Before the slot is given back; a lookup holding the object drops it when done.
    space::slot_at(handle.0).retract();
    if let Some(n) = t.owned.get_mut(&(entry.owner.0, kind)) {
        *n -= 1;
        if *n == 0 {
            t.owned.remove(&(entry.owner.0, kind));
        }
    }
    let owner_live = t.is_live_ia(entry.owner);
    t.space.give_back(handle.0);
    Ok(owner_live)
}

/// How many live objects of `kind` the IA `owner` has.
pub(crate) fn owned_count(owner: Handle, kind: HandleKind) -> usize {
    table()
        .lock()
        .owned
        .get(&(owner.0, kind))
        .copied()
        .unwrap_or(0)
}

/// dat_get_handle_type.
pub fn handle_type(handle: Handle) -> DatResult<u32> {
    get_any(handle)
        .map(|(kind, _)| kind.dat_type())
        .ok_or(DatError::bad_handle(Param::Handle))
}

/// dat_set_consumer_context.
pub fn set_consumer_context(handle: Handle, context: u64) -> DatResult<()> {
    let mut t = table().lock();
    match t.live.get_mut(&handle.0) {
        Some(e) => {
            e.consumer_context = context;
            Ok(())
        }
        None => Err(DatError::bad_handle(Param::Handle)),
    }
}

/// dat_get_consumer_context.
pub fn consumer_context(handle: Handle) -> DatResult<u64> {
    let t = table().lock();
    t.live
        .get(&handle.0)
        .map(|e| e.consumer_context)
        .ok_or(DatError::bad_handle(Param::Handle))
}

/// Every live object owned by the IA `ia`, with its kind.
pub(crate) fn children(ia: Handle) -> Vec<(Handle, HandleKind, Arc<AnyObject>)> {
    let t = table().lock();
    t.live
        .iter()
        .filter(|(_, e)| e.owner == ia && !ia.is_null())
        .map(|(addr, e)| (Handle(*addr), e.kind, e.object.clone()))
        .collect()
}

/// Whether `handle` currently names a live object (no dereference).
pub(crate) fn is_live(handle: Handle) -> bool {
    table().lock().live.contains_key(&handle.0)
}
