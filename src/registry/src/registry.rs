//! The registry: dat.conf entries (static registry), provider tables
//! registered by providers (dynamic registry), loaded provider libraries
//! with their open counts, and the IA handle table.
//!
//! Locking: `STATIC` serialises opening and closing IAs (loading and
//! unloading libraries); `DYNAMIC` and `IA_TABLE` are separate read-mostly
//! locks, because a provider's `dat_provider_init` calls back into
//! `dat_registry_add_provider` while `STATIC` is held, and every dispatched
//! call reads them.
//!
//! Both registry libraries use it with the provider tables of their own ABI
//! ([`ProviderPtr`]). Codes the registry makes are DAT 2.0 values; where a
//! call returns a provider's result too (opening and closing an IA), the
//! [`Library`] asking converts the registry's own to its numbering.

use crate::conf::{self, ConfEntry};
pub use crate::table::ProviderPtr;
use dat_abi::*;
use parking_lot::{Mutex, MutexGuard, RwLock};
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::atomic::Ordering;

// ------------------------------------------------------------- dynamic registry

/// What a provider registered itself under: exact-match key of dat_ia_openv.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderKey {
    pub ia_name: String,
    pub major: u32,
    pub minor: u32,
    pub thread_safe: bool,
}

impl ProviderKey {
    /// # Safety
    /// `info` must point to a readable DAT_PROVIDER_INFO.
    pub unsafe fn from_info(info: *const DAT_PROVIDER_INFO) -> ProviderKey {
        // SAFETY: the caller's contract.
        let info = unsafe { &*info };
        let bytes = c_array_bytes(&info.ia_name);
        ProviderKey {
            ia_name: String::from_utf8_lossy(bytes).into_owned(),
            major: info.dapl_version_major,
            minor: info.dapl_version_minor,
            thread_safe: info.is_thread_safe != DAT_FALSE,
        }
    }

    pub fn to_info(&self) -> DAT_PROVIDER_INFO {
        let mut info = DAT_PROVIDER_INFO {
            ia_name: [0; DAT_NAME_MAX_LENGTH],
            dapl_version_major: self.major,
            dapl_version_minor: self.minor,
            is_thread_safe: if self.thread_safe {
                DAT_TRUE
            } else {
                DAT_FALSE
            },
        };
        for (dst, src) in info
            .ia_name
            .iter_mut()
            .zip(self.ia_name.bytes().take(DAT_NAME_MAX_LENGTH - 1))
        {
            *dst = src as c_char;
        }
        info
    }
}

static DYNAMIC: RwLock<Vec<(ProviderKey, ProviderPtr)>> = RwLock::new(Vec::new());

pub fn add_provider(key: ProviderKey, provider: ProviderPtr) -> DAT_RETURN {
    let mut reg = DYNAMIC.write();
    if reg.iter().any(|(k, _)| *k == key) {
        return dat_error(DAT_PROVIDER_ALREADY_REGISTERED, DAT_NO_SUBTYPE);
    }
    log::debug!("provider {:?} registered as {:?}", provider.addr(), key);
    reg.push((key, provider));
    DAT_SUCCESS
}

pub fn remove_provider(key: &ProviderKey, provider: ProviderPtr) -> DAT_RETURN {
    let mut reg = DYNAMIC.write();
    match reg.iter().position(|(k, p)| k == key && *p == provider) {
        Some(i) => {
            reg.remove(i);
            LAST_TABLE.store(0, Ordering::Relaxed);
            log::debug!("provider {:?} removed ({:?})", provider.addr(), key);
            DAT_SUCCESS
        }
        None => dat_error(DAT_PROVIDER_NOT_FOUND, DAT_NAME_NOT_REGISTERED),
    }
}

fn find_registered(key: &ProviderKey) -> Option<ProviderPtr> {
    DYNAMIC
        .read()
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, p)| *p)
}

/// Whether `p` is a provider table someone registered: the check that
/// keeps a garbage handle from making us jump through a garbage table.
pub fn is_registered_table(p: *const c_void) -> bool {
    // Every call through a handle asks this: the table asked for last answers without the
    // lock (a program uses one provider, nearly always).
    if !p.is_null() && LAST_TABLE.load(Ordering::Relaxed) == p as usize {
        return true;
    }
    let found = DYNAMIC.read().iter().any(|(_, q)| q.addr() == p);
    if found {
        LAST_TABLE.store(p as usize, Ordering::Relaxed);
    }
    found
}

/// The table `is_registered_table` found last; 0 once any table is removed.
static LAST_TABLE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

// ------------------------------------------------------------- IA handle table

/// IA handles given to consumers are odd integers `(generation << 9) |
/// (slot << 1) | 1`, slot 1..=255, generation 32 bits: never an address we
/// read through (object handles are pointer-aligned, see `dispatch`), and a
/// closed handle is caught by its generation instead of aliasing the next IA
/// opened in the same slot, for 2^32 further opens of that slot. They stay
/// small (below 2^17 for the first 256 opens of a slot), as OFED's are.
const IA_SLOTS: usize = 256;
/// Object handles below this are garbage, never a provider's object.
pub(crate) const IA_HANDLE_LIMIT: usize = 0x1_0000;

#[derive(Clone, Copy)]
pub struct OpenIa {
    pub provider_ia: DAT_IA_HANDLE,
    pub provider: ProviderPtr,
    /// The loaded library entry this IA holds open, if it came from
    /// dat.conf (not from a provider the application registered).
    lib: Option<LoadedEntry>,
}
// SAFETY: provider_ia is an opaque token of the provider.
unsafe impl Send for OpenIa {}
// SAFETY: as above.
unsafe impl Sync for OpenIa {}

struct IaTable {
    generation: [u32; IA_SLOTS],
    open: [Option<OpenIa>; IA_SLOTS],
}

static IA_TABLE: RwLock<IaTable> = RwLock::new(IaTable {
    generation: [0; IA_SLOTS],
    open: [None; IA_SLOTS],
});

fn encode_ia(slot: usize, generation: u32) -> DAT_IA_HANDLE {
    (((generation as usize) << 9) | (slot << 1) | 1) as DAT_IA_HANDLE
}

fn decode_ia(handle: DAT_IA_HANDLE) -> Option<(usize, u32)> {
    let v = handle as usize;
    let slot = (v >> 1) & 0xff;
    if v & 1 == 0 || slot == 0 {
        return None;
    }
    Some((slot, u32::try_from(v >> 9).ok()?))
}

/// The provider's IA behind a consumer IA handle, if that handle is open.
pub fn lookup_ia(handle: DAT_IA_HANDLE) -> Option<OpenIa> {
    let (slot, gen) = decode_ia(handle)?;
    let t = IA_TABLE.read();
    if t.generation[slot] != gen {
        return None;
    }
    t.open[slot]
}

fn insert_ia(ia: OpenIa) -> Option<DAT_IA_HANDLE> {
    let mut t = IA_TABLE.write();
    let slot = (1..IA_SLOTS).find(|&s| t.open[s].is_none())?;
    t.open[slot] = Some(ia);
    Some(encode_ia(slot, t.generation[slot]))
}

fn remove_ia(handle: DAT_IA_HANDLE) -> Option<OpenIa> {
    let (slot, gen) = decode_ia(handle)?;
    let mut t = IA_TABLE.write();
    if t.generation[slot] != gen {
        return None;
    }
    let ia = t.open[slot].take()?;
    t.generation[slot] = t.generation[slot].wrapping_add(1);
    Some(ia)
}

// ------------------------------------------------------------- static registry

/// The registry library a call comes from: how warnings name it and how it
/// numbers the codes the registry makes (given as DAT 2.0 values).
/// Provider results are never converted: a provider returns its own ABI's.
#[derive(Clone, Copy)]
pub struct Library {
    /// "libdat2", "libdat".
    pub name: &'static str,
    /// From a DAT 2.0 code to the library's value of it.
    pub own_code: fn(DAT_RETURN) -> DAT_RETURN,
    /// The one DAT major version the library serves (libdat: 1), or None
    /// for any (libdat2): see [`crate::api`].
    pub major: Option<DAT_UINT32>,
}

/// `dat_provider_init` and `dat_provider_fini` as found in a provider library.
type ProviderInit = unsafe extern "C" fn(*const DAT_PROVIDER_INFO, *const c_char);
type ProviderFini = unsafe extern "C" fn(*const DAT_PROVIDER_INFO);

/// A dat.conf entry whose provider library is loaded: what an open holds
/// (counted by [`StaticRegistry::count_open`], dropped by
/// [`StaticRegistry::release`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct LoadedEntry(usize);

struct LoadedLib {
    entry: LoadedEntry,
    dl: *mut c_void,
    fini: ProviderFini,
    info: DAT_PROVIDER_INFO,
    opens: usize,
}

/// dat.conf and the provider libraries loaded for its entries. Held locked
/// ([`lock_static`]) while an IA (or another kind of open a library adds,
/// libdat2's extension open) is opened or closed.
pub struct StaticRegistry {
    entries: Option<Vec<ConfEntry>>,
    libs: Vec<LoadedLib>,
}
// SAFETY: dl is a loader handle, used only under the STATIC lock.
unsafe impl Send for StaticRegistry {}

static STATIC: Mutex<StaticRegistry> = Mutex::new(StaticRegistry {
    entries: None,
    libs: Vec::new(),
});

/// The static registry, locked: opens and closes are serialised on it.
pub fn lock_static() -> MutexGuard<'static, StaticRegistry> {
    STATIC.lock()
}

/// The dat.conf entries the registry serves (user API, `default`).
pub fn static_entries() -> Vec<ConfEntry> {
    let mut reg = STATIC.lock();
    reg.entries()
        .iter()
        .filter(|e| e.user_api && e.is_default)
        .cloned()
        .collect()
}

/// Why the last provider load failed, for tools (datinfo) that report it.
static LAST_LOAD_FAILURE: Mutex<Option<String>> = Mutex::new(None);

/// Takes the reason the last provider load failed, if one did since the
/// last call.
pub fn take_load_failure() -> Option<String> {
    LAST_LOAD_FAILURE.lock().take()
}

/// One line on stderr, even with logging off: OFED is silent when a
/// provider cannot be loaded, and users are left guessing why.
fn warn_load_failure(registry_name: &str, entry: &ConfEntry, what: &str) {
    *LAST_LOAD_FAILURE.lock() = Some(format!("provider library '{}': {}", entry.library, what));
    eprintln!(
        "{registry_name}: warning: dat.conf entry '{}' ({}): provider library '{}': {}",
        entry.ia_name, entry.origin, entry.library, what
    );
    log::warn!(
        "entry {} ({}): {}: {}",
        entry.ia_name,
        entry.origin,
        entry.library,
        what
    );
}

fn dlerror_string() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated message.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown loader error".into()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

fn not_found(sub: DAT_RETURN_SUBTYPE) -> DAT_RETURN {
    dat_error(DAT_PROVIDER_NOT_FOUND, sub)
}

impl StaticRegistry {
    /// dat.conf is read once, at first use, like OFED does at load time.
    fn entries(&mut self) -> &Vec<ConfEntry> {
        self.entries.get_or_insert_with(|| {
            let path = conf::conf_path();
            let (entries, errors) = conf::load(&path);
            for e in &errors {
                log::warn!("dat.conf: {e}");
            }
            log::debug!("{}: {} entries", path.display(), entries.len());
            entries
        })
    }

    /// Loads the library of entry `idx`, runs its dat_provider_init, and
    /// checks that it registered itself. Returns the index into `libs`.
    fn load_entry(
        &mut self,
        registry_name: &str,
        idx: usize,
        key: &ProviderKey,
    ) -> Result<usize, DAT_RETURN> {
        if let Some(i) = self.libs.iter().position(|l| l.entry == LoadedEntry(idx)) {
            return Ok(i);
        }
        let entry = self.entries()[idx].clone();
        let fail = |what: &str| -> Result<usize, DAT_RETURN> {
            warn_load_failure(registry_name, &entry, what);
            Err(not_found(DAT_NAME_NOT_REGISTERED))
        };
        let Ok(lib) = CString::new(entry.library.as_str()) else {
            return fail("library name contains a NUL byte");
        };
        // SAFETY: lib is NUL-terminated; RTLD_GLOBAL as OFED does, so
        // providers that expect their symbols to be visible to plug-ins keep
        // working.
        let dl = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if dl.is_null() {
            return fail(&dlerror_string());
        }
        // SAFETY: dl is a live handle; the names are NUL-terminated.
        let (init, fini) = unsafe {
            (
                libc::dlsym(dl, c"dat_provider_init".as_ptr()),
                libc::dlsym(dl, c"dat_provider_fini".as_ptr()),
            )
        };
        if init.is_null() || fini.is_null() {
            let missing = if init.is_null() {
                "dat_provider_init"
            } else {
                "dat_provider_fini"
            };
            // SAFETY: dl came from dlopen above and nothing of it is in use.
            unsafe { libc::dlclose(dl) };
            return fail(&format!("symbol {missing} not found"));
        }
        // SAFETY: both symbols are non-NULL and the DAT registry protocol
        // fixes their signatures (the same in 1.2 and 2.0).
        let (init, fini) = unsafe {
            (
                std::mem::transmute::<*mut c_void, ProviderInit>(init),
                std::mem::transmute::<*mut c_void, ProviderFini>(fini),
            )
        };
        let info = key.to_info();
        let params = CString::new(entry.ia_params.replace('\0', "")).unwrap_or_default();
        log::debug!(
            "calling dat_provider_init of {} for {}",
            entry.library,
            entry.ia_name
        );
        // SAFETY: info and params outlive the call; init registers via
        // callback.
        unsafe { init(&info, params.as_ptr()) };
        if find_registered(key).is_none() {
            // SAFETY: the provider registered nothing; undo its init and
            // unload.
            unsafe {
                fini(&info);
                libc::dlclose(dl);
            }
            return fail(
                "dat_provider_init did not register a provider (no device or bad ia_params?)",
            );
        }
        self.libs.push(LoadedLib {
            entry: LoadedEntry(idx),
            dl,
            fini,
            info,
            opens: 0,
        });
        Ok(self.libs.len() - 1)
    }

    /// Counts one more open holding `entry` loaded.
    pub fn count_open(&mut self, entry: LoadedEntry) {
        if let Some(l) = self.libs.iter_mut().find(|l| l.entry == entry) {
            l.opens += 1;
        }
    }

    /// Drops one open of `entry`; the last one runs dat_provider_fini and
    /// unloads the library.
    pub fn release(&mut self, entry: LoadedEntry) {
        if let Some(l) = self.libs.iter_mut().find(|l| l.entry == entry) {
            l.opens = l.opens.saturating_sub(1);
        }
        self.unload_if_idle(entry);
    }

    /// Runs dat_provider_fini and unloads the library of `entry` if no open
    /// holds it (after a failed open, the load it made is undone).
    pub fn unload_if_idle(&mut self, entry: LoadedEntry) {
        let Some(i) = self.libs.iter().position(|l| l.entry == entry) else {
            return;
        };
        if self.libs[i].opens == 0 {
            let lib = self.libs.remove(i);
            log::debug!(
                "last IA of entry {:?} closed: dat_provider_fini and dlclose",
                lib.entry
            );
            // SAFETY: no IA of this provider remains open; fini unregisters
            // it.
            unsafe {
                (lib.fini)(&lib.info);
                libc::dlclose(lib.dl);
            }
        }
    }

    /// The provider that serves `key`, as dat_ia_openv finds it: the exact
    /// dat.conf entry (its library loaded and initialised if it is not
    /// yet), else a provider the application registered itself. Returns the
    /// table and the loaded library's entry, which the caller counts an
    /// open of ([`Self::count_open`]) once it keeps something of the
    /// provider, or unloads if idle ([`Self::unload_if_idle`]) on failure.
    /// `lib` names the library in warnings; the codes are DAT 2.0 values.
    pub fn find_provider(
        &mut self,
        lib: &Library,
        key: &ProviderKey,
    ) -> Result<(ProviderPtr, Option<LoadedEntry>), DAT_RETURN> {
        // Entries from dat.conf take part only as user-level, default entries.
        let entries: Vec<(usize, ConfEntry)> = self
            .entries()
            .iter()
            .enumerate()
            .filter(|(_, e)| e.user_api && e.is_default && e.ia_name == key.ia_name)
            .map(|(i, e)| (i, e.clone()))
            .collect();
        let exact = entries.iter().find(|(_, e)| {
            e.api_major == key.major && e.api_minor == key.minor && e.thread_safe == key.thread_safe
        });

        let (provider, lib) = if let Some((idx, _)) = exact {
            let li = self.load_entry(lib.name, *idx, key)?;
            let p = find_registered(key).ok_or_else(|| not_found(DAT_NAME_NOT_REGISTERED))?;
            (p, Some(li))
        } else if let Some(p) = find_registered(key) {
            // Registered by the application itself, not through dat.conf.
            (p, None)
        } else if entries.is_empty() {
            return Err(not_found(DAT_NAME_NOT_REGISTERED));
        } else if !entries.iter().any(|(_, e)| e.api_major == key.major) {
            return Err(not_found(DAT_MAJOR_NOT_FOUND));
        } else if !entries
            .iter()
            .any(|(_, e)| e.api_major == key.major && e.api_minor == key.minor)
        {
            return Err(not_found(DAT_MINOR_NOT_FOUND));
        } else {
            return Err(not_found(DAT_THREAD_SAFETY_NOT_FOUND));
        };
        Ok((provider, lib.map(|li| self.libs[li].entry)))
    }
}

/// dat_ia_openv after argument checks: find the provider, load it if
/// needed, open the IA through it and hand out a small-integer handle.
///
/// The error is the provider's result, or the registry's own code in
/// `lib`'s numbering.
///
/// # Safety
/// `name` is a C string and `async_evd` a valid EVD handle slot, as for
/// `dat_ia_openv`; they are handed to the provider.
pub unsafe fn open_ia(
    lib: &Library,
    key: &ProviderKey,
    name: *const c_char,
    async_evd_qlen: DAT_COUNT,
    async_evd: *mut DAT_EVD_HANDLE,
) -> Result<DAT_IA_HANDLE, DAT_RETURN> {
    let mut reg = STATIC.lock();
    let (provider, lib_entry) = reg.find_provider(lib, key).map_err(lib.own_code)?;
    // SAFETY: the provider is registered and its library loaded.
    let head = unsafe { provider.head() };
    let mut provider_ia: DAT_IA_HANDLE = std::ptr::null_mut();
    let rc = match head.ia_open_func {
        // SAFETY: arguments were checked by the caller; the provider owns
        // the semantics of the call.
        Some(f) => unsafe { f(name, async_evd_qlen, async_evd, &mut provider_ia) },
        None => (lib.own_code)(dat_error(DAT_NOT_IMPLEMENTED, DAT_NO_SUBTYPE)),
    };
    // A failed open leaves a library loaded only if another IA holds it.
    let undo_load = |reg: &mut StaticRegistry| {
        if let Some(e) = lib_entry {
            reg.unload_if_idle(e);
        }
    };
    if rc != DAT_SUCCESS {
        undo_load(&mut reg);
        return Err(rc);
    }
    match insert_ia(OpenIa {
        provider_ia,
        provider,
        lib: lib_entry,
    }) {
        Some(h) => {
            if let Some(e) = lib_entry {
                reg.count_open(e);
            }
            log::debug!("IA {} opened as handle {:?}", key.ia_name, h);
            Ok(h)
        }
        None => {
            if let Some(close) = head.ia_close_func {
                // SAFETY: the IA was just opened by this provider.
                unsafe { close(provider_ia, DAT_CLOSE_ABRUPT_FLAG) };
            }
            undo_load(&mut reg);
            Err((lib.own_code)(dat_error(
                DAT_INSUFFICIENT_RESOURCES,
                DAT_RESOURCE_MEMORY,
            )))
        }
    }
}

/// dat_ia_close: close through the provider; on success free the handle
/// and drop the library's open count. Returns the provider's result, or
/// the registry's own code in `lib`'s numbering.
pub fn close_ia(lib: &Library, handle: DAT_IA_HANDLE, flags: DAT_CLOSE_FLAGS) -> DAT_RETURN {
    let mut reg = STATIC.lock();
    let Some(ia) = lookup_ia(handle) else {
        return (lib.own_code)(dat_error(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_IA));
    };
    // SAFETY: the IA is open, so its provider is registered and loaded.
    let head = unsafe { ia.provider.head() };
    let rc = match head.ia_close_func {
        // SAFETY: provider_ia is the provider's own live handle.
        Some(f) => unsafe { f(ia.provider_ia, flags) },
        None => (lib.own_code)(dat_error(DAT_NOT_IMPLEMENTED, DAT_NO_SUBTYPE)),
    };
    if rc == DAT_SUCCESS {
        remove_ia(handle);
        if let Some(e) = ia.lib {
            reg.release(e);
        }
    }
    rc
}

/// `dat_registry_providers_related`: are two IA names served by the same
/// provider library? (The DAT 2.0 HA query; OFED does not export it.)
pub fn providers_related(a: &str, b: &str) -> Result<DAT_HA_RELATIONSHIP, DAT_RETURN> {
    let entries = static_entries();
    let lib_of = |n: &str| {
        entries
            .iter()
            .find(|e| e.ia_name == n)
            .map(|e| e.library.clone())
    };
    match (lib_of(a), lib_of(b)) {
        (Some(x), Some(y)) => Ok(if x == y { DAT_HA_UNKNOWN } else { DAT_HA_FALSE }),
        _ => Err(not_found(DAT_NAME_NOT_REGISTERED)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ia_handles_are_small_and_stale_ones_are_caught() {
        let fake = OpenIa {
            provider_ia: 0x1234 as _,
            provider: ProviderPtr::new(std::ptr::null::<DAT_PROVIDER>()),
            lib: None,
        };
        let h = insert_ia(fake).unwrap();
        // Odd (never a provider's pointer), slot and 32-bit generation below 2^41 (other
        // tests of this process have opened IAs before: the generation is theirs too).
        assert!((h as usize) < 1 << 41 && (h as usize) & 1 == 1);
        assert!(lookup_ia(h).is_some());
        assert!(remove_ia(h).is_some());
        assert!(lookup_ia(h).is_none(), "closed handle must not resolve");
        let h2 = insert_ia(fake).unwrap();
        assert_ne!(h, h2, "a reused slot gets a new generation");
        assert!(lookup_ia(h).is_none());
        remove_ia(h2);
        assert!(lookup_ia(std::ptr::null_mut()).is_none());
        assert!(lookup_ia(0xdead_beef_usize as _).is_none());
    }

    /// A closed IA handle never names a later IA of its slot (u8 generations came round after
    /// 256 opens); object handles are aligned, IA handles never are.
    #[test]
    fn closed_ia_handles_stay_closed_past_256_opens() {
        let fake = OpenIa {
            provider_ia: 0x1234 as _,
            provider: ProviderPtr::new(std::ptr::null::<DAT_PROVIDER>()),
            lib: None,
        };
        let first = insert_ia(fake).unwrap();
        remove_ia(first);
        for _ in 0..1000 {
            let h = insert_ia(fake).unwrap();
            assert_ne!(h, first);
            assert!(lookup_ia(first).is_none());
            remove_ia(h);
        }
        let (slot, _) = decode_ia(first).unwrap();
        assert_eq!(decode_ia(encode_ia(slot, u32::MAX)), Some((slot, u32::MAX)));
        assert!(
            decode_ia(0x1000 as _).is_none(),
            "aligned values are objects"
        );
    }

    #[test]
    fn provider_info_round_trip() {
        let k = ProviderKey {
            ia_name: "rs-tcp".into(),
            major: 2,
            minor: 0,
            thread_safe: false,
        };
        let info = k.to_info();
        // SAFETY: an info just made, whose strings live as long as it.
        assert_eq!(unsafe { ProviderKey::from_info(&info) }, k);
    }
}
