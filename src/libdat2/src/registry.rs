//! The registry: dat.conf entries (static registry), provider tables
//! registered by providers (dynamic registry), loaded provider libraries
//! with their open counts, and the IA handle table.
//!
//! Locking: `STATIC` serialises opening and closing IAs (loading and
//! unloading libraries); `DYNAMIC` and `IA_TABLE` are separate read-mostly
//! locks, because a provider's `dat_provider_init` calls back into
//! `dat_registry_add_provider` while `STATIC` is held, and every dispatched
//! call reads them.

use crate::conf::{self, ConfEntry};
use dat_abi::*;
use parking_lot::{Mutex, RwLock};
use std::ffi::{c_char, c_void, CStr, CString};

/// A provider table pointer; tables are immutable and live as long as their
/// library stays loaded, which the open counts guarantee.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ProviderPtr(pub *const DAT_PROVIDER);
// SAFETY: the pointee is an immutable table of function pointers.
unsafe impl Send for ProviderPtr {}
unsafe impl Sync for ProviderPtr {}

impl ProviderPtr {
    /// # Safety
    /// The table must still be registered (its library loaded).
    pub unsafe fn table(&self) -> &'static DAT_PROVIDER {
        &*self.0
    }
}

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
        let info = &*info;
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
    log::debug!("provider {:?} registered as {:?}", provider.0, key);
    reg.push((key, provider));
    DAT_SUCCESS
}

pub fn remove_provider(key: &ProviderKey, provider: ProviderPtr) -> DAT_RETURN {
    let mut reg = DYNAMIC.write();
    match reg.iter().position(|(k, p)| k == key && *p == provider) {
        Some(i) => {
            reg.remove(i);
            log::debug!("provider {:?} removed ({:?})", provider.0, key);
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
pub fn is_registered_table(p: *const DAT_PROVIDER) -> bool {
    DYNAMIC.read().iter().any(|(_, q)| q.0 == p)
}

// ------------------------------------------------------------- IA handle table

/// IA handles given to consumers are small integers `(generation << 8) |
/// slot`, slot 1..=255: never a dereferenceable address (the kernel maps
/// nothing below 64 KiB), and a closed handle is caught by its generation
/// instead of aliasing the next IA opened in the same slot.
const IA_SLOTS: usize = 256;
pub(crate) const IA_HANDLE_LIMIT: usize = 0x1_0000;

#[derive(Clone, Copy)]
pub struct OpenIa {
    pub provider_ia: DAT_IA_HANDLE,
    pub provider: ProviderPtr,
    /// Index of the loaded library entry this IA holds open, if it came
    /// from dat.conf (not from a provider the application registered).
    lib: Option<usize>,
}
// SAFETY: provider_ia is an opaque token of the provider.
unsafe impl Send for OpenIa {}
unsafe impl Sync for OpenIa {}

struct IaTable {
    generation: [u8; IA_SLOTS],
    open: [Option<OpenIa>; IA_SLOTS],
}

static IA_TABLE: RwLock<IaTable> = RwLock::new(IaTable {
    generation: [0; IA_SLOTS],
    open: [None; IA_SLOTS],
});

fn decode_ia(handle: DAT_IA_HANDLE) -> Option<(usize, u8)> {
    let v = handle as usize;
    if v == 0 || v >= IA_HANDLE_LIMIT {
        return None;
    }
    let slot = v & 0xff;
    if slot == 0 {
        return None;
    }
    Some((slot, (v >> 8) as u8))
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
    Some(((usize::from(t.generation[slot]) << 8) | slot) as DAT_IA_HANDLE)
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

/// `dat_provider_init` and `dat_provider_fini` as found in a provider library.
type ProviderInit = unsafe extern "C" fn(*const DAT_PROVIDER_INFO, *const c_char);
type ProviderFini = unsafe extern "C" fn(*const DAT_PROVIDER_INFO);

struct LoadedLib {
    entry: usize,
    dl: *mut c_void,
    fini: ProviderFini,
    info: DAT_PROVIDER_INFO,
    opens: usize,
}

struct StaticRegistry {
    entries: Option<Vec<ConfEntry>>,
    libs: Vec<LoadedLib>,
}
// SAFETY: dl is a loader handle, used only under the STATIC lock.
unsafe impl Send for StaticRegistry {}

static STATIC: Mutex<StaticRegistry> = Mutex::new(StaticRegistry {
    entries: None,
    libs: Vec::new(),
});

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
fn warn_load_failure(entry: &ConfEntry, what: &str) {
    *LAST_LOAD_FAILURE.lock() = Some(format!("provider library '{}': {}", entry.library, what));
    eprintln!(
        "libdat2: warning: dat.conf entry '{}' ({}): provider library '{}': {}",
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

/// Loads the library of entry `idx`, runs its dat_provider_init, and checks
/// that it registered itself. Returns the index into `libs`.
fn load_entry(
    reg: &mut StaticRegistry,
    idx: usize,
    key: &ProviderKey,
) -> Result<usize, DAT_RETURN> {
    if let Some(i) = reg.libs.iter().position(|l| l.entry == idx) {
        return Ok(i);
    }
    let entry = reg.entries()[idx].clone();
    let Ok(lib) = CString::new(entry.library.as_str()) else {
        warn_load_failure(&entry, "library name contains a NUL byte");
        return Err(not_found(DAT_NAME_NOT_REGISTERED));
    };
    // SAFETY: lib is NUL-terminated; RTLD_GLOBAL as OFED does, so providers
    // that expect their symbols to be visible to plug-ins keep working.
    let dl = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if dl.is_null() {
        warn_load_failure(&entry, &dlerror_string());
        return Err(not_found(DAT_NAME_NOT_REGISTERED));
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
        warn_load_failure(&entry, &format!("symbol {missing} not found"));
        // SAFETY: dl came from dlopen above and nothing of it is in use.
        unsafe { libc::dlclose(dl) };
        return Err(not_found(DAT_NAME_NOT_REGISTERED));
    }
    // SAFETY: both symbols are non-NULL and the DAT registry protocol fixes
    // their signatures.
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
    // SAFETY: info and params outlive the call; init registers via callback.
    unsafe { init(&info, params.as_ptr()) };
    if find_registered(key).is_none() {
        warn_load_failure(
            &entry,
            "dat_provider_init did not register a provider (no device or bad ia_params?)",
        );
        // SAFETY: the provider registered nothing; undo its init and unload.
        unsafe {
            fini(&info);
            libc::dlclose(dl);
        }
        return Err(not_found(DAT_NAME_NOT_REGISTERED));
    }
    reg.libs.push(LoadedLib {
        entry: idx,
        dl,
        fini,
        info,
        opens: 0,
    });
    Ok(reg.libs.len() - 1)
}

/// Drops one open of library `lib_entry`; the last one runs
/// dat_provider_fini and unloads it.
fn release_lib(reg: &mut StaticRegistry, lib_entry: usize) {
    if let Some(l) = reg.libs.iter_mut().find(|l| l.entry == lib_entry) {
        l.opens = l.opens.saturating_sub(1);
    }
    unload_if_idle(reg, lib_entry);
}

/// Runs dat_provider_fini and unloads library `lib_entry` if no IA holds it.
fn unload_if_idle(reg: &mut StaticRegistry, lib_entry: usize) {
    let Some(i) = reg.libs.iter().position(|l| l.entry == lib_entry) else {
        return;
    };
    if reg.libs[i].opens == 0 {
        let lib = reg.libs.remove(i);
        log::debug!(
            "last IA of entry {} closed: dat_provider_fini and dlclose",
            lib.entry
        );
        // SAFETY: no IA of this provider remains open; fini unregisters it.
        unsafe {
            (lib.fini)(&lib.info);
            libc::dlclose(lib.dl);
        }
    }
}

/// The provider that serves `key`, as dat_ia_openv finds it: the exact
/// dat.conf entry (its library loaded and initialised if it is not yet),
/// else a provider the application registered itself. Returns the table and
/// the loaded library's entry, which the caller counts an open of once it
/// keeps something of the provider, or unloads if idle on failure.
fn find_provider(
    reg: &mut StaticRegistry,
    key: &ProviderKey,
) -> Result<(ProviderPtr, Option<usize>), DAT_RETURN> {
    // Entries from dat.conf take part only as user-level, default entries.
    let entries: Vec<(usize, ConfEntry)> = reg
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
        let li = load_entry(reg, *idx, key)?;
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
    Ok((provider, lib.map(|li| reg.libs[li].entry)))
}

/// dat_ia_openv after argument checks: find the provider, load it if
/// needed, open the IA through it and hand out a small-integer handle.
///
/// # Safety
/// `name` is a C string and `async_evd` a valid EVD handle slot, as for
/// `dat_ia_openv`; they are handed to the provider.
pub unsafe fn open_ia(
    key: &ProviderKey,
    name: *const c_char,
    async_evd_qlen: DAT_COUNT,
    async_evd: *mut DAT_EVD_HANDLE,
) -> Result<DAT_IA_HANDLE, DAT_RETURN> {
    let mut reg = STATIC.lock();
    let (provider, lib_entry) = find_provider(&mut reg, key)?;
    // SAFETY: the provider is registered and its library loaded.
    let table = unsafe { provider.table() };
    let mut provider_ia: DAT_IA_HANDLE = std::ptr::null_mut();
    let rc = match table.ia_open_func {
        // SAFETY: arguments were checked by the caller; the provider owns
        // the semantics of the call.
        Some(f) => unsafe { f(name, async_evd_qlen, async_evd, &mut provider_ia) },
        None => dat_error(DAT_NOT_IMPLEMENTED, DAT_NO_SUBTYPE),
    };
    // A failed open leaves a library loaded only if another IA holds it.
    let undo_load = |reg: &mut StaticRegistry| {
        if let Some(e) = lib_entry {
            unload_if_idle(reg, e);
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
                if let Some(l) = reg.libs.iter_mut().find(|l| l.entry == e) {
                    l.opens += 1;
                }
            }
            log::debug!("IA {} opened as handle {:?}", key.ia_name, h);
            Ok(h)
        }
        None => {
            // SAFETY: the IA was just opened by this provider.
            if let Some(close) = table.ia_close_func {
                unsafe { close(provider_ia, DAT_CLOSE_ABRUPT_FLAG) };
            }
            undo_load(&mut reg);
            Err(dat_error(DAT_INSUFFICIENT_RESOURCES, DAT_RESOURCE_MEMORY))
        }
    }
}

/// dat_ia_close: close through the provider; on success free the handle
/// and drop the library's open count.
pub fn close_ia(handle: DAT_IA_HANDLE, flags: DAT_CLOSE_FLAGS) -> DAT_RETURN {
    let mut reg = STATIC.lock();
    let Some(ia) = lookup_ia(handle) else {
        return dat_error(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_IA);
    };
    // SAFETY: the IA is open, so its provider is registered and loaded.
    let table = unsafe { ia.provider.table() };
    let rc = match table.ia_close_func {
        // SAFETY: provider_ia is the provider's own live handle.
        Some(f) => unsafe { f(ia.provider_ia, flags) },
        None => dat_error(DAT_NOT_IMPLEMENTED, DAT_NO_SUBTYPE),
    };
    if rc == DAT_SUCCESS {
        remove_ia(handle);
        if let Some(e) = ia.lib {
            release_lib(&mut reg, e);
        }
    }
    rc
}

// ------------------------------------------------- extension open and close

/// An IA a provider opened for the open-query extension (`dat_ib_open_query`).
struct ExtensionOpen {
    /// The provider's own IA handle, as an address.
    ia: usize,
    /// The provider that opened it. The close calls this table: the first
    /// word of a provider's IA need not be a table it registered (ours
    /// holds a copy naming the IA, for OFED's registry).
    provider: ProviderPtr,
    /// The library entry the open holds loaded.
    lib: Option<usize>,
}

static EXTENSION_OPENS: Mutex<Vec<ExtensionOpen>> = Mutex::new(Vec::new());

/// `dat_extension_op` with DAT_OPEN_EXTENSION_BASE in `ext_op`: loads the
/// provider of `key` as dat_ia_openv does and calls its extension slot
/// with the IA name as the handle and the rest of the caller's arguments.
/// On success the library stays loaded until [`close_extension`] of the IA
/// the provider stored in `*ia_out`; on failure a load made here is undone.
///
/// # Safety
/// `name` is a C string; `args` is the caller's va_list after the name,
/// read by the provider; `ia_out` is its next argument (or NULL).
pub unsafe fn open_extension(
    key: &ProviderKey,
    name: *const c_char,
    ext_op: DAT_EXTENDED_OP,
    ia_out: *const DAT_HANDLE,
    args: va_list,
) -> DAT_RETURN {
    let mut reg = STATIC.lock();
    let (provider, lib_entry) = match find_provider(&mut reg, key) {
        Ok(found) => found,
        Err(rc) => return rc,
    };
    // SAFETY: the provider is registered and its library loaded.
    let table = unsafe { provider.table() };
    let rc = match table.handle_extendedop_func {
        // SAFETY: the provider reads the caller's arguments; the name is
        // the handle of an open, as in OFED's registry.
        Some(f) => unsafe { f(name as DAT_HANDLE, ext_op, args) },
        None => dat_error(DAT_NOT_IMPLEMENTED, DAT_NO_SUBTYPE),
    };
    if rc != DAT_SUCCESS {
        if let Some(e) = lib_entry {
            unload_if_idle(&mut reg, e);
        }
        return rc;
    }
    if let Some(e) = lib_entry {
        if let Some(l) = reg.libs.iter_mut().find(|l| l.entry == e) {
            l.opens += 1;
        }
    }
    // SAFETY: the provider just stored its IA there (the open's contract).
    let ia = if ia_out.is_null() {
        std::ptr::null_mut()
    } else {
        unsafe { *ia_out }
    };
    log::debug!(
        "extension open {:#x} of {}: provider IA {:?}",
        ext_op,
        key.ia_name,
        ia
    );
    EXTENSION_OPENS.lock().push(ExtensionOpen {
        ia: ia as usize,
        provider,
        lib: lib_entry,
    });
    DAT_SUCCESS
}

/// `dat_extension_op` with DAT_CLOSE_EXTENSION_BASE in `ext_op`: `handle`
/// is a provider's own IA from [`open_extension`], closed by the extension
/// slot of the provider that opened it; on success the open's hold on the
/// library is dropped (the last one runs dat_provider_fini and unloads it).
/// Any other handle goes to the provider table at its first word if that
/// is a registered one (as every object call checks), and releases nothing.
///
/// # Safety
/// `handle` is consumer input, read only as described; `args` is the
/// caller's va_list.
pub unsafe fn close_extension(
    handle: DAT_HANDLE,
    ext_op: DAT_EXTENDED_OP,
    args: va_list,
) -> DAT_RETURN {
    let mut reg = STATIC.lock();
    let opened = EXTENSION_OPENS
        .lock()
        .iter()
        .find(|o| !handle.is_null() && o.ia == handle as usize)
        .map(|o| o.provider);
    let table = match opened {
        // SAFETY: the open holds this provider's library loaded.
        Some(p) => unsafe { p.table() },
        // SAFETY: provider_of reads the handle only once it may be an object.
        None => match unsafe { crate::dispatch::provider_of(handle) } {
            Some(t) => t,
            None => return dat_error(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_IA),
        },
    };
    let rc = match table.handle_extendedop_func {
        // SAFETY: the provider's own IA (or object), its own call.
        Some(f) => unsafe { f(handle, ext_op, args) },
        None => dat_error(DAT_NOT_IMPLEMENTED, DAT_NO_SUBTYPE),
    };
    if rc == DAT_SUCCESS {
        let mut opens = EXTENSION_OPENS.lock();
        if let Some(i) = opens.iter().position(|o| o.ia == handle as usize) {
            let lib_entry = opens.remove(i).lib;
            drop(opens);
            if let Some(e) = lib_entry {
                release_lib(&mut reg, e);
            }
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
            provider: ProviderPtr(std::ptr::null()),
            lib: None,
        };
        let h = insert_ia(fake).unwrap();
        assert!((h as usize) < IA_HANDLE_LIMIT && !h.is_null());
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

    #[test]
    fn provider_info_round_trip() {
        let k = ProviderKey {
            ia_name: "rs-tcp".into(),
            major: 2,
            minor: 0,
            thread_safe: false,
        };
        let info = k.to_info();
        assert_eq!(unsafe { ProviderKey::from_info(&info) }, k);
    }
}
