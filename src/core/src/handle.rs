//! One handle mechanism for every DAT object.
//!
//! C receives the address of a word holding the DAT_PROVIDER pointer its registry dispatches
//! through (`space`: a new word for every creation, so a handle value names one object for at
//! least 2^32 further creations: its place in the stretch is its generation). The table of live
//! handles is keyed by that address and is consulted *before* anything is read through a
//! pointer, so a freed, stale or foreign handle is rejected without dereferencing it.

mod space;

use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::Mutex;

use super::cno::Cno;
use super::consts::handle_type;
use super::cr::Cr;
use super::ep::Ep;
use super::error::{DatError, DatResult, Param, SubType};
use super::evd::Evd;
use super::ia::Ia;
use super::lmr::Lmr;
use super::pz::Pz;
use super::rmr::Rmr;
use super::sp::Sp;
use super::srq::Srq;
use daplrs_backend::intmap::IntMap;
use space::Space;

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
    /// subtype per role; callers that know the role pass it to `lookup_evd` instead.
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

/// A live object as the table holds it.
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
}

struct Entry {
    object: Object,
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
pub struct Reservation {
    handle: Handle,
    kind: HandleKind,
    committed: bool,
}

impl Reservation {
    pub fn handle(&self) -> Handle {
        self.handle
    }

    /// Makes the object reachable through its handle.
    pub fn commit(mut self, object: Object, owner: Handle) -> Handle {
        debug_assert_eq!(object.kind(), self.kind);
        let mut t = table().lock();
        t.reserved.remove(&self.handle.0);
        if let Some(index) = create_counter(self.kind) {
            count_for_owner(&t, owner, index);
        }
        if !owner.is_null() {
            *t.owned.entry((owner.0, self.kind)).or_default() += 1;
        }
        t.live.insert(
            self.handle.0,
            Entry {
                object,
                owner,
                consumer_context: 0,
            },
        );
        self.committed = true;
        self.handle
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
pub fn reserve(kind: HandleKind, dispatch: usize) -> Reservation {
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
        space::word(handle.0).store(dispatch, Ordering::SeqCst);
    }
}

/// The live object behind `handle`, whatever its kind.
pub fn lookup_any(handle: Handle) -> Option<Object> {
    if handle.is_null() {
        return None;
    }
    table().lock().live.get(&handle.0).map(|e| e.object.clone())
}

/// The live object behind `handle` if it is of `kind`; else INVALID_HANDLE with `bad`.
pub fn lookup(handle: Handle, kind: HandleKind, bad: SubType) -> DatResult<Object> {
    match lookup_any(handle) {
        Some(obj) if obj.kind() == kind => Ok(obj),
        _ => Err(DatError::invalid_handle(bad)),
    }
}

macro_rules! typed_lookup {
    ($fn_name:ident, $variant:ident, $ty:ty, $kind:expr) => {
        /// Typed lookup; a NULL, freed, stale or wrong-type handle gives INVALID_HANDLE with the
        /// kind's subtype.
        pub fn $fn_name(handle: Handle) -> DatResult<Arc<$ty>> {
            match lookup(handle, $kind, $kind.invalid_subtype())? {
                Object::$variant(o) => Ok(o),
                _ => Err($kind.invalid()),
            }
        }
    };
}

/// Removals of live handles so far: a cached lookup is good while this has not moved.
static REMOVALS: AtomicU64 = AtomicU64::new(0);

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
        if self.handle != handle.0 || self.removals != removals {
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
        let removals = REMOVALS.load(Ordering::Acquire);
        self.0.iter().find_map(|l| l.get(handle, removals))
    }

    fn remember(&mut self, latest: LastLookup<T>) {
        self.0.swap(0, 1);
        self.0[0] = latest;
    }
}

macro_rules! cached_lookup {
    ($fn_name:ident, $slow_name:ident, $cache:ident, $variant:ident, $ty:ty, $kind:expr) => {
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
            let removals = REMOVALS.load(Ordering::Acquire);
            match lookup(handle, $kind, bad)? {
                Object::$variant(o) => {
                    $cache.with(|c| {
                        c.borrow_mut().remember(LastLookup {
                            handle: handle.0,
                            removals,
                            object: Arc::downgrade(&o),
                        })
                    });
                    Ok(o)
                }
                _ => Err(DatError::invalid_handle(bad)),
            }
        }
    };
}

typed_lookup!(ia, Ia, Ia, HandleKind::Ia);
typed_lookup!(pz, Pz, Pz, HandleKind::Pz);
typed_lookup!(lmr, Lmr, Lmr, HandleKind::Lmr);
typed_lookup!(rmr, Rmr, Rmr, HandleKind::Rmr);
typed_lookup!(cno, Cno, Cno, HandleKind::Cno);
cached_lookup!(ep_as, ep_from_table, LAST_EP, Ep, Ep, HandleKind::Ep);

/// EP lookup (see `ep_as`), with the EP subtype.
#[inline]
pub fn ep(handle: Handle) -> DatResult<Arc<Ep>> {
    ep_as(handle, SubType::InvalidHandleEp)
}
typed_lookup!(psp, Psp, Sp, HandleKind::Psp);
typed_lookup!(rsp, Rsp, Sp, HandleKind::Rsp);
typed_lookup!(cr, Cr, Cr, HandleKind::Cr);
typed_lookup!(srq, Srq, Srq, HandleKind::Srq);
typed_lookup!(csp, Csp, Sp, HandleKind::Csp);

// EVD lookup with the role-specific subtype (INVALID_HANDLE_EVD_CONN, _EVD_REQUEST, ...).
cached_lookup!(evd, evd_from_table, LAST_EVD, Evd, Evd, HandleKind::Evd);

/// An optional EVD argument: NULL means none.
pub fn evd_opt(handle: Handle, bad: SubType) -> DatResult<Option<Arc<Evd>>> {
    if handle.is_null() {
        Ok(None)
    } else {
        evd(handle, bad).map(Some)
    }
}

/// Removes a live handle of `kind`; later lookups fail. Returns the object so the caller can
/// tear it down. Its value is not reissued for 2^32 creations.
pub fn remove(handle: Handle, kind: HandleKind) -> DatResult<Object> {
    let mut t = table().lock();
    match t.live.get(&handle.0) {
        Some(e) if e.object.kind() == kind => {}
        _ => return Err(kind.invalid()),
    }
    let entry = t.live.remove(&handle.0).ok_or_else(|| kind.invalid())?;
    // Under the table lock, before the handle's word is given back: a thread's cached
    // lookup made before this point is as if it had looked up just before the removal.
    REMOVALS.fetch_add(1, Ordering::Release);
    if let Some(n) = t.owned.get_mut(&(entry.owner.0, kind)) {
        *n -= 1;
        if *n == 0 {
            t.owned.remove(&(entry.owner.0, kind));
        }
    }
    if let Some(index) = create_counter(kind) {
        // Each kind's FREE counter follows its CREATE counter (DCNT_IA_*; PSP_CREATE_ANY sits
        // between PSP's two).
        let free = if kind == HandleKind::Psp {
            index + 2
        } else {
            index + 1
        };
        count_for_owner(&t, entry.owner, free);
    }
    t.space.give_back(handle.0);
    Ok(entry.object)
}

/// How many live objects of `kind` the IA `owner` has.
pub fn owned_count(owner: Handle, kind: HandleKind) -> usize {
    table()
        .lock()
        .owned
        .get(&(owner.0, kind))
        .copied()
        .unwrap_or(0)
}

/// The DCNT_IA_*_CREATE counter of an object kind.
fn create_counter(kind: HandleKind) -> Option<usize> {
    use super::counters::ia;
    Some(match kind {
        HandleKind::Pz => ia::PZ_CREATE,
        HandleKind::Lmr => ia::LMR_CREATE,
        HandleKind::Rmr => ia::RMR_CREATE,
        HandleKind::Psp => ia::PSP_CREATE,
        HandleKind::Rsp => ia::RSP_CREATE,
        HandleKind::Evd => ia::EVD_CREATE,
        HandleKind::Ep => ia::EP_CREATE,
        HandleKind::Srq => ia::SRQ_CREATE,
        _ => return None,
    })
}

/// Counts one event on the IA `owner` (creations and frees of its objects).
fn count_for_owner(t: &Table, owner: Handle, index: usize) {
    if let Some(Entry {
        object: Object::Ia(ia),
        ..
    }) = t.live.get(&owner.0)
    {
        ia.counters.inc(index);
    }
}

/// dat_get_handle_type.
pub fn handle_type(handle: Handle) -> DatResult<u32> {
    lookup_any(handle)
        .map(|o| o.kind().dat_type())
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

/// Every live object owned by the IA `ia`.
pub fn children(ia: Handle) -> Vec<(Handle, Object)> {
    let t = table().lock();
    t.live
        .iter()
        .filter(|(_, e)| e.owner == ia && !ia.is_null())
        .map(|(addr, e)| (Handle(*addr), e.object.clone()))
        .collect()
}

/// Whether `handle` currently names a live object (no dereference).
pub fn is_live(handle: Handle) -> bool {
    table().lock().live.contains_key(&handle.0)
}

/// Counts uses of an object by others (an EP of a PZ, an EVD of a CNO, ...) and refuses new uses
/// once the object is being freed, so "free while in use" and "use while freeing" cannot race.
#[derive(Default)]
pub struct UseCount {
    state: Mutex<(usize, bool)>,
}

impl UseCount {
    /// Records one more user; false once the object is retired.
    pub fn acquire(&self) -> bool {
        let mut s = self.state.lock();
        if s.1 {
            return false;
        }
        s.0 += 1;
        true
    }
    pub fn release(&self) {
        let mut s = self.state.lock();
        s.0 = s.0.saturating_sub(1);
    }
    /// Retires the object if nobody uses it; else returns the number of users.
    pub fn retire(&self) -> Result<(), usize> {
        let mut s = self.state.lock();
        if s.0 > 0 {
            return Err(s.0);
        }
        s.1 = true;
        Ok(())
    }
    /// Undoes a successful `retire` (a later check refused the free).
    pub fn release_retire(&self) {
        self.state.lock().1 = false;
    }
    /// Retires regardless of users (abrupt teardown).
    pub fn force_retire(&self) {
        self.state.lock().1 = true;
    }
    pub fn users(&self) -> usize {
        self.state.lock().0
    }
}
