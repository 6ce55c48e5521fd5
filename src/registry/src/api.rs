//! The registry calls of the C API, once for both libraries: what
//! `dat_ia_openv`, `dat_ia_close`, `dat_registry_add_provider`,
//! `dat_registry_remove_provider`, `dat_registry_list_providers` and
//! `dat_strerror` do. Each library's export (written out there, so that
//! cbindgen sees its prototype and documentation) is one call to the
//! function of the same name here, with its [`Library`].
//!
//! Each function is the whole export: the library's panic boundary, the
//! argument checks and the registry's work. Codes are made as DAT 2.0
//! values and returned through `lib.own_code` (1.2's numbering in libdat;
//! `DAT_INTERNAL_ERROR` for a panic is the same value in both). What the
//! versions do differently is `lib.major`: a library serving one DAT
//! major version (libdat: 1) refuses to open, register or list another.

use crate::args::{self, RegistryCall};
use crate::registry::{self, Library, ProviderKey, ProviderPtr};
use crate::strerror::ReturnNames;
use crate::table::ProviderTable;
use dat_abi::*;
use std::ffi::{c_char, CStr};

/// A code the library makes, in its numbering.
fn code(lib: &Library, ty: DAT_RETURN_TYPE, sub: DAT_RETURN_SUBTYPE) -> DAT_RETURN {
    (lib.own_code)(dat_error(ty, sub))
}

/// DAT_INVALID_PARAMETER for argument `param` of `call`, in the library's
/// numbering.
fn bad(lib: &Library, call: &RegistryCall, param: &str) -> DAT_RETURN {
    (lib.own_code)(call.bad(param))
}

/// `f` inside the library's panic boundary.
fn guard(lib: &Library, f: impl FnOnce() -> DAT_RETURN) -> DAT_RETURN {
    crate::ffi_guard((lib.own_code)(crate::PANIC_CODE_V20), f)
}

/// Whether the library serves DAT major version `major`.
fn serves(lib: &Library, major: DAT_UINT32) -> bool {
    lib.major.is_none_or(|m| m == major)
}

/// `dat_ia_openv`: opens an IA by dat.conf name.
///
/// # Safety
/// The arguments of `dat_ia_openv`, as the DAT API describes them.
#[allow(clippy::too_many_arguments)]
pub unsafe fn ia_openv(
    lib: &Library,
    name: *const c_char,
    async_evd_qlen: DAT_COUNT,
    async_evd_handle: *mut DAT_EVD_HANDLE,
    ia_handle: *mut DAT_IA_HANDLE,
    dapl_major: DAT_UINT32,
    dapl_minor: DAT_UINT32,
    thread_safety: DAT_BOOLEAN,
) -> DAT_RETURN {
    crate::init_logging();
    guard(lib, || {
        if name.is_null() {
            return bad(lib, &args::IA_OPENV, "name");
        }
        if async_evd_handle.is_null() {
            return bad(lib, &args::IA_OPENV, "async_event_handle");
        }
        if ia_handle.is_null() {
            return bad(lib, &args::IA_OPENV, "ia_handle");
        }
        if !serves(lib, dapl_major) {
            return code(lib, DAT_PROVIDER_NOT_FOUND, DAT_MAJOR_NOT_FOUND);
        }
        // SAFETY: checked non-NULL; a C string by the API's contract.
        let ia_name = unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned();
        let key = ProviderKey {
            ia_name,
            major: dapl_major,
            minor: dapl_minor,
            thread_safe: thread_safety != DAT_FALSE,
        };
        // SAFETY: name and async_evd_handle as the caller passed them,
        // checked above; the provider reads them.
        let opened =
            unsafe { registry::open_ia(lib, &key, name, async_evd_qlen, async_evd_handle) };
        match opened {
            Ok(h) => {
                // SAFETY: checked non-NULL; the consumer's IA handle slot.
                unsafe { *ia_handle = h };
                DAT_SUCCESS
            }
            Err(rc) => {
                log::debug!("dat_ia_openv({}) = {:#x}", key.ia_name, rc);
                rc
            }
        }
    })
}

/// `dat_ia_close`: closes an IA through its provider, whose result passes
/// through.
pub fn ia_close(
    lib: &Library,
    ia_handle: DAT_IA_HANDLE,
    close_flags: DAT_CLOSE_FLAGS,
) -> DAT_RETURN {
    guard(lib, || registry::close_ia(lib, ia_handle, close_flags))
}

/// The key `provider_info` registers under, or the code refusing it (for
/// `call`, dat_registry_add_provider or _remove_provider): NULL arguments,
/// or a provider of a major version the library does not serve (its
/// provider_info is refused).
///
/// # Safety
/// `provider_info` is NULL or readable.
unsafe fn key_of<T>(
    lib: &Library,
    call: &RegistryCall,
    provider: *const T,
    provider_info: *const DAT_PROVIDER_INFO,
) -> Result<ProviderKey, DAT_RETURN> {
    if provider.is_null() {
        return Err(bad(lib, call, "provider"));
    }
    if provider_info.is_null() {
        return Err(bad(lib, call, "provider_info"));
    }
    // SAFETY: checked non-NULL; the provider's own info.
    let key = unsafe { ProviderKey::from_info(provider_info) };
    if !serves(lib, key.major) {
        return Err(bad(lib, call, "provider_info"));
    }
    Ok(key)
}

/// `dat_registry_add_provider`: a provider's dat_provider_init makes its
/// table (of the library's ABI, `T`) known.
///
/// # Safety
/// `provider` is NULL or a provider table of the library's ABI that stays
/// valid until removed; `provider_info` is NULL or readable.
pub unsafe fn add_provider<T: ProviderTable>(
    lib: &Library,
    provider: *const T,
    provider_info: *const DAT_PROVIDER_INFO,
) -> DAT_RETURN {
    crate::init_logging();
    guard(lib, || {
        // SAFETY: the caller's contract.
        match unsafe { key_of(lib, &args::REGISTRY_ADD_PROVIDER, provider, provider_info) } {
            Ok(key) => (lib.own_code)(registry::add_provider(key, ProviderPtr::new(provider))),
            Err(rc) => rc,
        }
    })
}

/// `dat_registry_remove_provider`, from a provider's dat_provider_fini.
///
/// # Safety
/// As for [`add_provider`].
pub unsafe fn remove_provider<T: ProviderTable>(
    lib: &Library,
    provider: *const T,
    provider_info: *const DAT_PROVIDER_INFO,
) -> DAT_RETURN {
    guard(lib, || {
        // SAFETY: the caller's contract.
        match unsafe {
            key_of(
                lib,
                &args::REGISTRY_REMOVE_PROVIDER,
                provider,
                provider_info,
            )
        } {
            Ok(key) => (lib.own_code)(registry::remove_provider(&key, ProviderPtr::new(provider))),
            Err(rc) => rc,
        }
    })
}

/// `dat_registry_list_providers`: the dat.conf entries the library serves
/// (user-level, default, of its major version if it serves one). With
/// `max_to_return` 0 it only counts them.
///
/// # Safety
/// The arguments of `dat_registry_list_providers`: `entries_returned`
/// NULL or writable, `dat_provider_list` NULL or an array of
/// `max_to_return` pointers, each NULL or writable.
pub unsafe fn list_providers(
    lib: &Library,
    max_to_return: DAT_COUNT,
    entries_returned: *mut DAT_COUNT,
    dat_provider_list: *mut *mut DAT_PROVIDER_INFO,
) -> DAT_RETURN {
    crate::init_logging();
    guard(lib, || {
        if max_to_return < 0 {
            return bad(lib, &args::REGISTRY_LIST_PROVIDERS, "max_to_return");
        }
        if entries_returned.is_null() {
            return bad(lib, &args::REGISTRY_LIST_PROVIDERS, "entries_returned");
        }
        let entries: Vec<_> = registry::static_entries()
            .into_iter()
            .filter(|e| serves(lib, e.api_major))
            .collect();
        if max_to_return == 0 {
            // SAFETY: checked non-NULL; the consumer's count.
            unsafe { *entries_returned = entries.len() as DAT_COUNT };
            return DAT_SUCCESS;
        }
        if dat_provider_list.is_null() {
            return bad(lib, &args::REGISTRY_LIST_PROVIDERS, "dat_provider_list");
        }
        let n = entries.len().min(max_to_return as usize);
        for (i, e) in entries.iter().take(n).enumerate() {
            // SAFETY: the consumer's array holds max_to_return pointers.
            let slot = unsafe { *dat_provider_list.add(i) };
            if slot.is_null() {
                return bad(lib, &args::REGISTRY_LIST_PROVIDERS, "dat_provider_list");
            }
            let key = ProviderKey {
                ia_name: e.ia_name.clone(),
                major: e.api_major,
                minor: e.api_minor,
                thread_safe: e.thread_safe,
            };
            // SAFETY: a non-NULL element of the consumer's array.
            unsafe { *slot = key.to_info() };
        }
        // SAFETY: checked non-NULL.
        unsafe { *entries_returned = n as DAT_COUNT };
        DAT_SUCCESS
    })
}

/// `dat_strerror`: the names of `value`'s type and subtype in `names`
/// (the library's ABI's); the strings are static.
///
/// # Safety
/// `major_message` and `minor_message` are NULL or writable.
pub unsafe fn strerror(
    lib: &Library,
    names: &ReturnNames,
    value: DAT_RETURN,
    major_message: *mut *const c_char,
    minor_message: *mut *const c_char,
) -> DAT_RETURN {
    guard(lib, || {
        if major_message.is_null() {
            return bad(lib, &args::STRERROR, "major_message");
        }
        if minor_message.is_null() {
            return bad(lib, &args::STRERROR, "minor_message");
        }
        match names.names(value) {
            Some((major, minor)) => {
                // SAFETY: both checked non-NULL; the strings are static.
                unsafe {
                    *major_message = major.as_ptr();
                    *minor_message = minor.as_ptr();
                }
                DAT_SUCCESS
            }
            None => bad(lib, &args::STRERROR, "value"),
        }
    })
}
