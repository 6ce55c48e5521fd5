//! The DAT 1.2 face of the provider: the 70-slot 1.2 DAT_PROVIDER table
//! libdat.so.1 dispatches through, over the same core and, wherever the C
//! shapes allow, the same 2.0 functions.
//!
//! Every 1.2 slot reads its 1.2 arguments (through `boundary`), converts
//! them to the 2.0 shapes ([`convert`]), runs what the 2.0 slot runs, turns
//! 2.0 results back into 1.2 structs, and returns the 1.2 reading of the
//! 2.0 code (`dat_abi12::codes::from_v20`). An IA opened through this table
//! gives the core this table's address as its dispatch word, so each of its
//! handles (the IA's own, and every EVD, EP, LMR, CR, ... made under it)
//! starts with the table libdat.so.1 registered.
//!
//! [`table`] holds the table and the slots whose C signature 1.2 shares
//! with 2.0; the others live in one module per object.

mod calls;
mod convert;
mod ep;
mod evd;
mod ia;
mod mem;
mod misc;
mod table;

use crate::boundary::guard;
use crate::calls::Call;
use daplrs::core::error::DatResult;
use dat_abi::{DAT_PROVIDER_INFO, DAT_RETURN};
use dat_abi12 as d12;
use std::ffi::{c_void, CStr};

pub(crate) use table::{PROVIDER12, PROVIDER12_TS};

/// A 1.2 slot's body, `call` of the 1.2 table: the 2.0 guard with 1.2's
/// argument list, then the 1.2 code of its result.
fn guard12(call: &Call, f: impl FnOnce() -> DatResult<()>) -> DAT_RETURN {
    d12::from_v20(guard(call, f))
}

type RegistryFunc =
    unsafe extern "C" fn(*const d12::DAT_PROVIDER, *const DAT_PROVIDER_INFO) -> DAT_RETURN;

/// The 1.2 registry's `name` (symbol version DAT_1.2, which libdat.so.1
/// gives its exports so that they never bind to libdat2's 2.0 functions of
/// the same names).
fn registry_func(name: &CStr) -> Option<RegistryFunc> {
    // SAFETY: dlvsym only looks a name up.
    let p: *mut c_void =
        unsafe { libc::dlvsym(libc::RTLD_DEFAULT, name.as_ptr(), c"DAT_1.2".as_ptr()) };
    // SAFETY: libdat.so.1 defines these two functions with this signature.
    (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, RegistryFunc>(p) })
}

/// dat_provider_init for a 1.2 registry: registers [`PROVIDER12`] (or,
/// for a `threadsafe` entry, [`PROVIDER12_TS`]) for the entry `info`. Returns the registry's answer (a 1.2 code).
pub(crate) unsafe fn register(info: &DAT_PROVIDER_INFO, thread_safe: bool) -> DAT_RETURN {
    match registry_func(c"dat_registry_add_provider") {
        // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
        Some(add) => unsafe { add(table(thread_safe), info) },
        None => {
            log::warn!("dat_provider_init for DAT 1.2, but no dat_registry_add_provider@DAT_1.2");
            d12::DAT_CLASS_ERROR | d12::DAT_INTERNAL_ERROR
        }
    }
}

/// dat_provider_fini for a 1.2 registry.
pub(crate) unsafe fn unregister(info: &DAT_PROVIDER_INFO, thread_safe: bool) {
    if let Some(remove) = registry_func(c"dat_registry_remove_provider") {
        // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
        unsafe { remove(table(thread_safe), info) };
    }
}

/// The 1.2 table of an entry of the given thread safety.
fn table(thread_safe: bool) -> &'static d12::DAT_PROVIDER {
    if thread_safe {
        &PROVIDER12_TS
    } else {
        &PROVIDER12
    }
}
