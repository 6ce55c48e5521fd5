//! libfabric's exported functions, reached through `dlopen` at first use.
//!
//! Why not link libfabric.so.1: a library's constructors run when the
//! program loads it, and Debian's libfabric pulls in libinfinipath.so.4
//! (through its psm provider), whose constructor replaces the handlers of
//! SIGINT, SIGILL, SIGABRT, SIGBUS, SIGSEGV and SIGTERM with one that prints
//! a backtrace and calls `exit(1)`: a DAT program's own SIGTERM handler,
//! installed before `dat_ia_open` loaded our provider, was gone after it, and
//! a crash became exit status 1. Opened here, the load is bracketed: every
//! signal's action is read before and put back after if the load changed it
//! (`with_signal_actions_kept`), whichever libdat2 loads the provider.
//!
//! Only the seven functions below are exported by libfabric; everything else
//! in its API goes through the objects' operations tables (lib.rs).

use crate::{fi_fabric_attr, fi_info, fi_type, fid_fabric, FI_ENOSYS};
use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

type GetInfo = unsafe extern "C" fn(
    u32,
    *const c_char,
    *const c_char,
    u64,
    *const fi_info,
    *mut *mut fi_info,
) -> c_int;
type FreeInfo = unsafe extern "C" fn(*mut fi_info);
type DupInfo = unsafe extern "C" fn(*const fi_info) -> *mut fi_info;
type Fabric = unsafe extern "C" fn(*mut fi_fabric_attr, *mut *mut fid_fabric, *mut c_void) -> c_int;
type StrError = unsafe extern "C" fn(c_int) -> *const c_char;
type ToStr = unsafe extern "C" fn(*const c_void, fi_type) -> *mut c_char;
type Version = unsafe extern "C" fn() -> u32;

/// The library's entry points, resolved once.
struct Api {
    getinfo: GetInfo,
    freeinfo: FreeInfo,
    dupinfo: DupInfo,
    fabric: Fabric,
    strerror: StrError,
    tostr: ToStr,
    version: Version,
}

/// The soname Debian's libfabric1 (and every libfabric 1.x) installs.
const SONAME: &std::ffi::CStr = c"libfabric.so.1";

static API: OnceLock<Result<Api, String>> = OnceLock::new();

fn api() -> Result<&'static Api, &'static str> {
    API.get_or_init(open).as_ref().map_err(|e| e.as_str())
}

/// Whether libfabric.so.1 could be opened (and why not).
pub fn available() -> Result<(), String> {
    api().map(|_| ()).map_err(str::to_owned)
}

fn open() -> Result<Api, String> {
    // SAFETY: SONAME is NUL-terminated; RTLD_LOCAL: nothing of ours is
    // resolved through it but the symbols below.
    let dl = with_signal_actions_kept(|| unsafe {
        libc::dlopen(SONAME.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL)
    });
    if dl.is_null() {
        return Err(format!("cannot open libfabric.so.1: {}", dlerror()));
    }
    let sym = |name: &std::ffi::CStr| -> Result<*mut c_void, String> {
        // SAFETY: dl is a live handle (never closed); name is NUL-terminated.
        let p = unsafe { libc::dlsym(dl, name.as_ptr()) };
        if p.is_null() {
            Err(format!("libfabric.so.1 has no {}", name.to_string_lossy()))
        } else {
            Ok(p)
        }
    };
    // SAFETY: each transmute: the symbol is the libfabric function of that
    // name, whose C signature (rdma/fabric.h) the type above spells out.
    unsafe {
        Ok(Api {
            getinfo: std::mem::transmute::<*mut c_void, GetInfo>(sym(c"fi_getinfo")?),
            freeinfo: std::mem::transmute::<*mut c_void, FreeInfo>(sym(c"fi_freeinfo")?),
            dupinfo: std::mem::transmute::<*mut c_void, DupInfo>(sym(c"fi_dupinfo")?),
            fabric: std::mem::transmute::<*mut c_void, Fabric>(sym(c"fi_fabric")?),
            strerror: std::mem::transmute::<*mut c_void, StrError>(sym(c"fi_strerror")?),
            tostr: std::mem::transmute::<*mut c_void, ToStr>(sym(c"fi_tostr")?),
            version: std::mem::transmute::<*mut c_void, Version>(sym(c"fi_version")?),
        })
    }
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        return "unknown error".into();
    }
    // SAFETY: non-NULL, NUL-terminated.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

/// Runs `load` and puts back every signal action it changed. (A handler
/// another thread installs meanwhile is undone too; this runs twice per
/// process, at the first open of an ofi entry.)
pub(crate) fn with_signal_actions_kept<T>(load: impl FnOnce() -> T) -> T {
    const SIGNALS: std::ops::RangeInclusive<c_int> = 1..=64;
    let before: Vec<_> = SIGNALS.map(action_of).collect();
    let out = load();
    for (sig, old) in SIGNALS.zip(before) {
        let (Some(old), Some(now)) = (old, action_of(sig)) else {
            continue;
        };
        if now.sa_sigaction != old.sa_sigaction || now.sa_flags != old.sa_flags {
            // SAFETY: old is the action the process had before the load.
            unsafe { libc::sigaction(sig, &old, std::ptr::null_mut()) };
        }
    }
    out
}

/// Signal `sig`'s current action; None for a number that is no signal.
fn action_of(sig: c_int) -> Option<libc::sigaction> {
    // SAFETY: an all-zero sigaction is a valid out-parameter.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: reading only.
    (unsafe { libc::sigaction(sig, std::ptr::null(), &mut act) } == 0).then_some(act)
}

/// `fi_getinfo`; `-FI_ENOSYS` where libfabric.so.1 cannot be opened.
///
/// # Safety
/// As the C function: the strings are NUL-terminated or NULL, `hints` is
/// NULL or an `fi_info` of libfabric, `info` is writable.
pub unsafe fn fi_getinfo(
    version: u32,
    node: *const c_char,
    service: *const c_char,
    flags: u64,
    hints: *const fi_info,
    info: *mut *mut fi_info,
) -> c_int {
    let Ok(a) = api() else {
        return -(FI_ENOSYS as c_int);
    };
    // SAFETY: the caller's arguments, as the C function takes them.
    let call = || unsafe { (a.getinfo)(version, node, service, flags, hints, info) };
    // The first call initializes libfabric's providers: bracketed as the load is.
    static PROVIDERS_STARTED: AtomicBool = AtomicBool::new(false);
    if PROVIDERS_STARTED.swap(true, Ordering::AcqRel) {
        call()
    } else {
        with_signal_actions_kept(call)
    }
}

/// `fi_freeinfo`.
///
/// # Safety
/// `info` came from `fi_getinfo`, `fi_dupinfo` or a CM event and is freed once.
pub unsafe fn fi_freeinfo(info: *mut fi_info) {
    if let Ok(a) = api() {
        // SAFETY: see above.
        unsafe { (a.freeinfo)(info) }
    }
}

/// `fi_dupinfo`; NULL where libfabric.so.1 cannot be opened.
///
/// # Safety
/// `info` is NULL or a live `fi_info` of libfabric.
pub unsafe fn fi_dupinfo(info: *const fi_info) -> *mut fi_info {
    match api() {
        // SAFETY: see above.
        Ok(a) => unsafe { (a.dupinfo)(info) },
        Err(_) => std::ptr::null_mut(),
    }
}

/// `fi_fabric`.
///
/// # Safety
/// `attr` is the fabric attribute of an `fi_info` of libfabric; `fabric` is writable.
pub unsafe fn fi_fabric(
    attr: *mut fi_fabric_attr,
    fabric: *mut *mut fid_fabric,
    context: *mut c_void,
) -> c_int {
    match api() {
        // SAFETY: see above.
        Ok(a) => unsafe { (a.fabric)(attr, fabric, context) },
        Err(_) => -(FI_ENOSYS as c_int),
    }
}

/// `fi_strerror`; NULL where libfabric.so.1 cannot be opened.
///
/// # Safety
/// None beyond the C function's (any code is accepted).
pub unsafe fn fi_strerror(errnum: c_int) -> *const c_char {
    match api() {
        // SAFETY: fi_strerror accepts any code.
        Ok(a) => unsafe { (a.strerror)(errnum) },
        Err(_) => std::ptr::null(),
    }
}

/// `fi_tostr`; NULL where libfabric.so.1 cannot be opened.
///
/// # Safety
/// `data` points to a value of the libfabric type `datatype` names.
pub unsafe fn fi_tostr(data: *const c_void, datatype: fi_type) -> *mut c_char {
    match api() {
        // SAFETY: see above.
        Ok(a) => unsafe { (a.tostr)(data, datatype) },
        Err(_) => std::ptr::null_mut(),
    }
}

/// `fi_version`: the library's API version; 0 where it cannot be opened.
pub fn fi_version() -> u32 {
    match api() {
        // SAFETY: no arguments.
        Ok(a) => unsafe { (a.version)() },
        Err(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" fn mark(_: c_int) {}

    /// The tests of one binary run on parallel threads, and both of these look at the
    /// process's signal actions: one sets SIGUSR2's while the other compares them all (a
    /// fresh-clone CI run saw it fail so: "signal 12's handler changed").
    static SIGNAL_ACTIONS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// A load that replaces a handler leaves it as it was.
    #[test]
    fn a_load_that_installs_handlers_leaves_the_programs_in_place() {
        let _alone = SIGNAL_ACTIONS.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: a test-only handler for SIGUSR2, which nothing else here uses.
        unsafe {
            let mut ours: libc::sigaction = std::mem::zeroed();
            ours.sa_sigaction = mark as *const () as usize;
            libc::sigaction(libc::SIGUSR2, &ours, std::ptr::null_mut());
            with_signal_actions_kept(|| {
                let dfl: libc::sigaction = std::mem::zeroed();
                libc::sigaction(libc::SIGUSR2, &dfl, std::ptr::null_mut());
            });
            let now = action_of(libc::SIGUSR2).expect("SIGUSR2");
            assert_eq!(now.sa_sigaction, mark as *const () as usize);
        }
    }

    /// Opening libfabric itself changes no handler of the program.
    #[test]
    fn opening_libfabric_changes_no_signal_action() {
        let _alone = SIGNAL_ACTIONS.lock().unwrap_or_else(|e| e.into_inner());
        let handler = |s| action_of(s).map(|a| a.sa_sigaction);
        let before: Vec<_> = (1..=31).map(handler).collect();
        available().expect("libfabric.so.1 (libfabric1) is installed for these tests");
        assert!(fi_version() >= crate::API_VERSION);
        for (s, old) in (1..=31).zip(before) {
            let now = handler(s);
            assert_eq!(
                now, old,
                "signal {s}'s handler changed when libfabric was opened"
            );
        }
    }
}
