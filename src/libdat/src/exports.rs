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
//! are written out after it, each one call of dat-registry's `api`, which
//! libdat2 calls too (with its `LIBRARY`: 1.2 codes, DAT 1.x only).

// Each export's safety contract is the DAT 1.2 specification of that call:
// the pointers it takes are valid as the DAT 1.2 API describes them.
#![allow(clippy::missing_safety_doc)]

use crate::{error, ffi_guard, LIBRARY};
use dat_abi12::*;
use dat_registry::api;
use dat_registry::strerror::ReturnNames;
use std::ffi::c_char;

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
    // SAFETY: the caller's arguments, as the DAT API describes them.
    unsafe {
        api::ia_openv(
            &LIBRARY,
            name,
            async_evd_qlen,
            async_evd_handle,
            ia_handle,
            dapl_major,
            dapl_minor,
            thread_safety,
        )
    }
}

/// Closes an IA through its provider, whose result passes through.
#[no_mangle]
pub unsafe extern "C" fn dat_ia_close(
    ia_handle: DAT_IA_HANDLE,
    close_flags: DAT_CLOSE_FLAGS,
) -> DAT_RETURN {
    api::ia_close(&LIBRARY, ia_handle, close_flags)
}

/// Called by a provider's dat_provider_init to register its 1.2 table
/// (found as `dat_registry_add_provider@DAT_1.2`).
#[no_mangle]
pub unsafe extern "C" fn dat_registry_add_provider(
    provider: *const DAT_PROVIDER,
    provider_info: *const DAT_PROVIDER_INFO,
) -> DAT_RETURN {
    // SAFETY: the caller's arguments, as the DAT API describes them.
    unsafe { api::add_provider(&LIBRARY, provider, provider_info) }
}

/// Called by a provider's dat_provider_fini.
#[no_mangle]
pub unsafe extern "C" fn dat_registry_remove_provider(
    provider: *const DAT_PROVIDER,
    provider_info: *const DAT_PROVIDER_INFO,
) -> DAT_RETURN {
    // SAFETY: the caller's arguments, as the DAT API describes them.
    unsafe { api::remove_provider(&LIBRARY, provider, provider_info) }
}

/// Lists the dat.conf entries this library serves: user-level, default,
/// DAT 1.x. With `max_to_return` 0 it only counts them.
#[no_mangle]
pub unsafe extern "C" fn dat_registry_list_providers(
    max_to_return: DAT_COUNT,
    entries_returned: *mut DAT_COUNT,
    dat_provider_list: *mut *mut DAT_PROVIDER_INFO,
) -> DAT_RETURN {
    // SAFETY: the caller's arguments, as the DAT API describes them.
    unsafe { api::list_providers(&LIBRARY, max_to_return, entries_returned, dat_provider_list) }
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
    // SAFETY: the caller's arguments, as the DAT API describes them.
    unsafe { api::strerror(&LIBRARY, &NAMES, value, major_message, minor_message) }
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

    /// The registry calls make their codes through dat-registry's `api`
    /// as 2.0 values turned into 1.2's: the same as 1.2's own constants.
    #[test]
    fn registry_calls_give_12_codes() {
        use std::ptr::{null, null_mut};
        let invalid = |arg| error(DAT_INVALID_PARAMETER, arg);
        let mut count: DAT_COUNT = 0;
        let mut ia: DAT_IA_HANDLE = null_mut();
        let mut evd: DAT_EVD_HANDLE = null_mut();
        let x = c"x".as_ptr();
        // SAFETY: NULL or valid pointers, checked before anything is read.
        unsafe {
            assert_eq!(
                dat_ia_openv(null(), 8, null_mut(), null_mut(), 1, 2, DAT_FALSE),
                invalid(DAT_INVALID_ARG1)
            );
            assert_eq!(
                dat_ia_openv(x, 8, null_mut(), &mut ia, 1, 2, DAT_FALSE),
                invalid(DAT_INVALID_ARG3)
            );
            assert_eq!(
                dat_ia_openv(x, 8, &mut evd, null_mut(), 1, 2, DAT_FALSE),
                invalid(DAT_INVALID_ARG4)
            );
            assert_eq!(
                dat_ia_openv(x, 8, &mut evd, &mut ia, 2, 0, DAT_FALSE),
                error(DAT_PROVIDER_NOT_FOUND, DAT_MAJOR_NOT_FOUND)
            );
            assert_eq!(
                dat_registry_add_provider(null(), null()),
                invalid(DAT_INVALID_ARG1)
            );
            assert_eq!(
                dat_registry_remove_provider(8 as _, null()),
                invalid(DAT_INVALID_ARG2)
            );
            assert_eq!(
                dat_registry_list_providers(-1, &mut count, null_mut()),
                invalid(DAT_INVALID_ARG1)
            );
            assert_eq!(
                dat_registry_list_providers(1, null_mut(), null_mut()),
                invalid(DAT_INVALID_ARG2)
            );
            assert_eq!(
                dat_strerror(0, null_mut(), null_mut()),
                invalid(DAT_INVALID_ARG2)
            );
        }
    }
}
