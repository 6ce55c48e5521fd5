//! The DAT 1.2 C API of libdat.so.1: the 72 functions of
//! `include/dat/dat_api.h`, with their 1.2 signatures.
//!
//! The dispatched calls are declared once, for this library and
//! libdat2.so.2, in dat-registry's `dat_calls!` list, whose lines tagged
//! `both` or `v12` are 1.2's calls (`dat_cr_reject`, `dat_lmr_create` and
//! `dat_rmr_bind` have a line of their own, their argument lists being
//! 1.2's). `dat_calls!(v12, exports)` below expands to their exports,
//! each the same three steps: check the handle (the code libdat2 returns
//! for the same call, in 1.2's numbering, for NULL and for any handle
//! that is not an open IA or a live object of a registered 1.2 provider),
//! map an IA handle to the provider's own, and call the provider's slot,
//! or return DAT_NOT_IMPLEMENTED when the provider left it empty. The
//! names it uses are this module's: dat-abi12's types, constants and
//! 70-slot `DAT_PROVIDER`, and the library's `ffi_guard` and `error` (1.2
//! codes). gen-header reads the same list for `include/dat/dat_api.h`.
//! The registry calls (open, close, add/remove/list providers, strerror)
//! are written out after it.

// Each export's safety contract is the DAT 1.2 specification of that call:
// the pointers it takes are valid as the DAT 1.2 API describes them.
#![allow(clippy::missing_safety_doc)]

use crate::{error, ffi_guard, LIBRARY};
use dat_abi12::codes::from_v20;
use dat_abi12::*;
use dat_registry::registry::{self, ProviderKey, ProviderPtr};
use dat_registry::strerror::ReturnNames;
use std::ffi::{c_char, CStr};

dat_registry::dat_calls!(v12, exports);

// ------------------------------------------------------------ registry

/// Opens an IA by dat.conf name; `dat_ia_open` is a macro over this. Only
/// DAT 1.x is served here: a table of another version registered in this
/// library would be dispatched as a 1.2 one.
#[no_mangle]
pub unsafe extern "C" fn dat_ia_openv(
    name: *const c_char,
    async_evd_qlen: DAT_COUNT,
    async_evd_handle: *mut DAT_EVD_HANDLE,
    ia_handle: *mut DAT_IA_HANDLE,
    dapl_major: DAT_UINT32,
    dapl_minor: DAT_UINT32,
    thread_safety: DAT_BOOLEAN,
) -> DAT_RETURN {
    dat_registry::init_logging();
    ffi_guard(|| {
        if name.is_null() {
            return error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG1);
        }
        if async_evd_handle.is_null() {
            return error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG3);
        }
        if ia_handle.is_null() {
            return error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG4);
        }
        if dapl_major != DAT_VERSION_MAJOR {
            return error(DAT_PROVIDER_NOT_FOUND, DAT_MAJOR_NOT_FOUND);
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
            unsafe { registry::open_ia(&LIBRARY, &key, name, async_evd_qlen, async_evd_handle) };
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

/// Closes an IA through its provider, whose result passes through.
#[no_mangle]
pub unsafe extern "C" fn dat_ia_close(
    ia_handle: DAT_IA_HANDLE,
    close_flags: DAT_CLOSE_FLAGS,
) -> DAT_RETURN {
    ffi_guard(|| registry::close_ia(&LIBRARY, ia_handle, close_flags))
}

/// The key a provider registers under, if it is one this library serves:
/// a DAT 1.x table (see dat_ia_openv).
///
/// # Safety
/// `provider_info` is non-NULL and readable.
unsafe fn key_of_v12(provider_info: *const DAT_PROVIDER_INFO) -> Option<ProviderKey> {
    // SAFETY: the caller's contract.
    let key = unsafe { ProviderKey::from_info(provider_info) };
    (key.major == DAT_VERSION_MAJOR).then_some(key)
}

/// Called by a provider's dat_provider_init to register its 1.2 table
/// (found as `dat_registry_add_provider@DAT_1.2`).
#[no_mangle]
pub unsafe extern "C" fn dat_registry_add_provider(
    provider: *const DAT_PROVIDER,
    provider_info: *const DAT_PROVIDER_INFO,
) -> DAT_RETURN {
    dat_registry::init_logging();
    ffi_guard(|| {
        if provider.is_null() {
            return error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG1);
        }
        if provider_info.is_null() {
            return error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG2);
        }
        // SAFETY: checked non-NULL.
        match unsafe { key_of_v12(provider_info) } {
            Some(key) => from_v20(registry::add_provider(key, ProviderPtr::new(provider))),
            None => error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG2),
        }
    })
}

/// Called by a provider's dat_provider_fini.
#[no_mangle]
pub unsafe extern "C" fn dat_registry_remove_provider(
    provider: *const DAT_PROVIDER,
    provider_info: *const DAT_PROVIDER_INFO,
) -> DAT_RETURN {
    ffi_guard(|| {
        if provider.is_null() {
            return error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG1);
        }
        if provider_info.is_null() {
            return error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG2);
        }
        // SAFETY: checked non-NULL.
        match unsafe { key_of_v12(provider_info) } {
            Some(key) => from_v20(registry::remove_provider(&key, ProviderPtr::new(provider))),
            None => error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG2),
        }
    })
}

/// Lists the dat.conf entries this library serves: user-level, default,
/// DAT 1.x. With `max_to_return` 0 it only counts them.
#[no_mangle]
pub unsafe extern "C" fn dat_registry_list_providers(
    max_to_return: DAT_COUNT,
    entries_returned: *mut DAT_COUNT,
    dat_provider_list: *mut *mut DAT_PROVIDER_INFO,
) -> DAT_RETURN {
    dat_registry::init_logging();
    ffi_guard(|| {
        if max_to_return < 0 {
            return error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG1);
        }
        if entries_returned.is_null() {
            return error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG2);
        }
        let entries: Vec<_> = registry::static_entries()
            .into_iter()
            .filter(|e| e.api_major == DAT_VERSION_MAJOR)
            .collect();
        if max_to_return == 0 {
            // SAFETY: checked non-NULL; the consumer's count.
            unsafe { *entries_returned = entries.len() as DAT_COUNT };
            return DAT_SUCCESS;
        }
        if dat_provider_list.is_null() {
            return error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG3);
        }
        let n = entries.len().min(max_to_return as usize);
        for (i, e) in entries.iter().take(n).enumerate() {
            // SAFETY: the consumer's array holds max_to_return pointers.
            let slot = unsafe { *dat_provider_list.add(i) };
            if slot.is_null() {
                return error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG3);
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

/// 1.2's code names (its numbering of types and subtypes).
static NAMES: ReturnNames = ReturnNames::new(DAT_RETURN_TYPE_NAMES, DAT_RETURN_SUBTYPE_NAMES);

/// Names the type and subtype of a 1.2 DAT_RETURN ("DAT_INVALID_HANDLE",
/// "DAT_INVALID_HANDLE_EP"). The strings are static.
#[no_mangle]
pub unsafe extern "C" fn dat_strerror(
    value: DAT_RETURN,
    major_message: *mut *const c_char,
    minor_message: *mut *const c_char,
) -> DAT_RETURN {
    ffi_guard(|| {
        if major_message.is_null() {
            return error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG2);
        }
        if minor_message.is_null() {
            return error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG3);
        }
        match NAMES.names(value) {
            Some((major, minor)) => {
                // SAFETY: both checked non-NULL; the strings are static.
                unsafe {
                    *major_message = major.as_ptr();
                    *minor_message = minor.as_ptr();
                }
                DAT_SUCCESS
            }
            None => error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG1),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_12s() {
        let (major, minor) = NAMES.names(0x8fff_0000).unwrap();
        assert_eq!((major, minor), (c"DAT_NOT_IMPLEMENTED", c"DAT_NO_SUBTYPE"));
        let (major, minor) = NAMES.names(0x8005_001a).unwrap();
        assert_eq!(
            (major, minor),
            (c"DAT_INVALID_HANDLE", c"DAT_INVALID_HANDLE1")
        );
        assert!(NAMES.names(0x3fff_0000).is_none(), "2.0's NOT_IMPLEMENTED");
    }

    #[test]
    fn null_handles_give_12_codes() {
        // SAFETY: NULL handles are checked before anything is read.
        unsafe {
            assert_eq!(dat_ep_free(std::ptr::null_mut()), 0x8005_000c);
            assert_eq!(
                dat_get_handle_type(std::ptr::null_mut(), std::ptr::null_mut()),
                0x8005_001a
            );
            assert_eq!(
                dat_ia_close(std::ptr::null_mut(), DAT_CLOSE_ABRUPT_FLAG),
                0x8005_000b
            );
            assert_eq!(dat_cr_reject(0x20 as _), 0x8005_0012);
        }
    }
}
