//! The DAT 2.0 C API of libdat2, one function an entry point.
//!
//! The dispatched calls (every call on an IA, object or any handle) are
//! declared once, for this library and libdat.so.1, in dat-registry's
//! `dat_calls!` list; `dat_calls!(v20, exports)` below expands to their
//! 2.0 exports, each the same three steps: check the handle (the exact
//! code OFED's libdat2 returns for NULL, and for any handle that is not a
//! live object of a registered provider), map IA handles to the
//! provider's own, and call the provider's slot. The names it uses are
//! this module's: dat-abi's types and the library's `ffi_guard` and
//! `error`. gen-header reads the same list for `dat_api.h`. The registry
//! calls (open, close, add/remove/list providers, strerror) are written
//! out after it, each one call of dat-registry's `api`, which libdat
//! calls too; `dats_get_ia_handle`, the providers-related query and the
//! extension entries are 2.0's only.

// Each export's safety contract is the DAT specification of that call:
// the pointers it takes are valid as the DAT 2.0 API describes them.
#![allow(clippy::missing_safety_doc)]

use crate::registry::{self, ProviderKey};
use crate::{error, ffi_guard, init_logging, LIBRARY};
use dat_abi::*;
use dat_registry::{api, args};
use std::ffi::{c_char, CStr};

dat_registry::dat_calls!(v20, exports);

// ------------------------------------------------------------ registry

/// Opens an IA by dat.conf name; `dat_ia_open` is a macro over this.
#[no_mangle]
pub unsafe extern "C" fn dat_ia_openv(
    name: *const c_char,
    async_event_qlen: DAT_COUNT,
    async_event_handle: *mut DAT_EVD_HANDLE,
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
            async_event_qlen,
            async_event_handle,
            ia_handle,
            dapl_major,
            dapl_minor,
            thread_safety,
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn dat_ia_close(
    ia_handle: DAT_IA_HANDLE,
    close_flags: DAT_CLOSE_FLAGS,
) -> DAT_RETURN {
    api::ia_close(&LIBRARY, ia_handle, close_flags)
}

/// Maps a consumer IA handle to the provider's own (OFED-internal export,
/// kept for binary compatibility).
#[no_mangle]
pub unsafe extern "C" fn dats_get_ia_handle(
    handle: DAT_IA_HANDLE,
    ia_handle_p: *mut DAT_IA_HANDLE,
) -> DAT_RETURN {
    ffi_guard(|| match registry::lookup_ia(handle) {
        Some(_) if ia_handle_p.is_null() => args::DATS_GET_IA_HANDLE.bad("ia_handle_p"),
        Some(open) => {
            // SAFETY: checked non-NULL; the consumer's handle slot.
            unsafe { *ia_handle_p = open.provider_ia };
            DAT_SUCCESS
        }
        None => dat_error(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_IA),
    })
}

/// The variadic `dat_extension_op` is a C shim (c/extension_op.c) that
/// forwards its `va_list` here (and to the two functions after this one
/// for the open and close ranges of `ext_op`).
#[no_mangle]
pub unsafe extern "C" fn dat2_extension_opv(
    handle: DAT_HANDLE,
    ext_op: DAT_EXTENDED_OP,
    args: va_list,
) -> DAT_RETURN {
    // The dispatch of the dat_calls! exports, for any handle.
    dat_registry::__dat_call! { @body any handle => handle_extendedop_func(ext_op, args) }
}

/// `dat_extension_op` with DAT_OPEN_EXTENSION_BASE set in `ext_op` (the IB
/// extensions' `dat_ib_open_query`): the shim has taken the IA name off the
/// argument list and peeked at the next argument, where the provider will
/// store its IA. The provider is found and loaded as by `dat_ia_open` (DAT
/// 2.0, not thread-safe); its handle is its own, not a registry handle.
#[no_mangle]
pub unsafe extern "C" fn dat2_extension_openv(
    name: *const c_char,
    ext_op: DAT_EXTENDED_OP,
    ia_out: *const DAT_HANDLE,
    args: va_list,
) -> DAT_RETURN {
    init_logging();
    ffi_guard(|| {
        if name.is_null() {
            // What OFED's registry returns for a NULL name.
            return dat_error(DAT_INVALID_HANDLE, DAT_INVALID_ARG3);
        }
        let key = ProviderKey {
            // SAFETY: checked non-NULL; a C string by the API's contract.
            ia_name: unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned(),
            major: DAT_VERSION_MAJOR,
            minor: DAT_VERSION_MINOR,
            thread_safe: false,
        };
        // SAFETY: name checked non-NULL; ia_out and args as the C shim
        // passed them (the consumer's argument list).
        unsafe { crate::extension::open_extension(&key, name, ext_op, ia_out, args) }
    })
}

/// `dat_extension_op` with DAT_CLOSE_EXTENSION_BASE set in `ext_op`
/// (`dat_ib_close_query`): `handle` is the provider's IA from the open.
#[no_mangle]
pub unsafe extern "C" fn dat2_extension_closev(
    handle: DAT_HANDLE,
    ext_op: DAT_EXTENDED_OP,
    args: va_list,
) -> DAT_RETURN {
    // SAFETY: handle and args as the C shim passed them; close_extension
    // checks the handle before it reads through it.
    ffi_guard(|| unsafe { crate::extension::close_extension(handle, ext_op, args) })
}

/// Called by a provider's dat_provider_init to make itself known.
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

/// Lists the dat.conf entries in effect. With `max_to_return` 0 it only
/// counts them.
#[no_mangle]
pub unsafe extern "C" fn dat_registry_list_providers(
    max_to_return: DAT_COUNT,
    entries_returned: *mut DAT_COUNT,
    dat_provider_list: *mut *mut DAT_PROVIDER_INFO,
) -> DAT_RETURN {
    // SAFETY: the caller's arguments, as the DAT API describes them.
    unsafe { api::list_providers(&LIBRARY, max_to_return, entries_returned, dat_provider_list) }
}

/// Whether two IA names are served by the same provider (DAT 2.0 HA).
#[no_mangle]
pub unsafe extern "C" fn dat_registry_providers_related(
    provider1: *const c_char,
    provider2: *const c_char,
    answer: *mut DAT_HA_RELATIONSHIP,
) -> DAT_RETURN {
    ffi_guard(|| {
        let related = &args::REGISTRY_PROVIDERS_RELATED;
        if provider1.is_null() {
            return related.bad("provider1");
        }
        if provider2.is_null() {
            return related.bad("provider2");
        }
        if answer.is_null() {
            return related.bad("answer");
        }
        // SAFETY: both checked non-NULL; C strings by the API's contract.
        let (a, b) = unsafe { (CStr::from_ptr(provider1), CStr::from_ptr(provider2)) };
        let (a, b) = (a.to_string_lossy(), b.to_string_lossy());
        match registry::providers_related(&a, &b) {
            Ok(r) => {
                // SAFETY: checked non-NULL; the consumer's answer.
                unsafe { *answer = r };
                DAT_SUCCESS
            }
            Err(rc) => rc,
        }
    })
}

/// Names the type and subtype of a DAT_RETURN ("DAT_INVALID_HANDLE",
/// "DAT_INVALID_HANDLE_EP"). The strings are static.
#[no_mangle]
pub unsafe extern "C" fn dat_strerror(
    value: DAT_RETURN,
    major_message: *mut *const c_char,
    minor_message: *mut *const c_char,
) -> DAT_RETURN {
    // SAFETY: the caller's arguments, as the DAT API describes them.
    unsafe {
        api::strerror(
            &LIBRARY,
            &crate::strerror::NAMES,
            value,
            major_message,
            minor_message,
        )
    }
}
