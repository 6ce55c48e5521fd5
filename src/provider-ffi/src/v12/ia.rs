//! dat_ia_open and dat_ia_query of DAT 1.2.

use super::convert::{ia_attr_to_v12, provider_attr_to_v12};
use super::{calls, guard12, PROVIDER12, PROVIDER12_TS};
use crate::ia::{open_ia_with, query_ia};
use daplrs::core::error::{DatError, Param};
use dat_abi::{
    DAT_COUNT, DAT_EVD_HANDLE, DAT_IA_ATTR_MASK, DAT_IA_HANDLE, DAT_PROVIDER_ATTR_MASK, DAT_RETURN,
};
use dat_abi12 as d12;
use std::ffi::c_char;

/// ia_open_func of the `nonthreadsafe` `u1.2` entries: opens the entry
/// `name`; the IA and all its handles start with [`PROVIDER12`]
/// (libdat.so.1 keeps its own small-integer IA handles and closes an IA
/// through that handle, so the IA needs no per-name table copy as the 2.0
/// one has for OFED's libdat2).
pub(crate) unsafe extern "C" fn open(
    name: *const c_char,
    qlen: DAT_COUNT,
    async_evd: *mut DAT_EVD_HANDLE,
    ia_handle: *mut DAT_IA_HANDLE,
) -> DAT_RETURN {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    guard12(&calls::IA_OPEN, || unsafe {
        open12(name, qlen, async_evd, ia_handle, false)
    })
}

/// ia_open_func of the `threadsafe` `u1.2` entries: the IA and its handles
/// start with [`PROVIDER12_TS`].
pub(crate) unsafe extern "C" fn open_threadsafe(
    name: *const c_char,
    qlen: DAT_COUNT,
    async_evd: *mut DAT_EVD_HANDLE,
    ia_handle: *mut DAT_IA_HANDLE,
) -> DAT_RETURN {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    guard12(&calls::IA_OPEN, || unsafe {
        open12(name, qlen, async_evd, ia_handle, true)
    })
}

unsafe fn open12(
    name: *const c_char,
    qlen: DAT_COUNT,
    async_evd: *mut DAT_EVD_HANDLE,
    ia_handle: *mut DAT_IA_HANDLE,
    thread_safe: bool,
) -> daplrs::core::error::DatResult<()> {
    let table = if thread_safe {
        &PROVIDER12_TS
    } else {
        &PROVIDER12
    };
    let dispatch = table as *const d12::DAT_PROVIDER as usize;
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    unsafe {
        open_ia_with(
            name,
            qlen,
            async_evd,
            ia_handle,
            d12::DAT_VERSION_MAJOR,
            thread_safe,
            dispatch,
        )
    }
    .map(|_| ())
    // 1.2 names two arguments otherwise: async_evd_qlen and async_evd_handle (2.0: async_event_*).
    .map_err(|e| match e.param {
        Some(Param::AsyncEventHandle) => DatError::bad(Param::AsyncEvdHandle),
        Some(Param::AsyncEventQlen) => DatError::bad(Param::AsyncEvdQlen),
        _ => e,
    })
}

/// ia_query_func: the 2.0 query into 2.0 structs, converted to 1.2's.
pub(crate) unsafe extern "C" fn query(
    ia: DAT_IA_HANDLE,
    async_evd: *mut DAT_EVD_HANDLE,
    ia_mask: DAT_IA_ATTR_MASK,
    ia_attr: *mut d12::DAT_IA_ATTR,
    provider_mask: DAT_PROVIDER_ATTR_MASK,
    provider_attr: *mut d12::DAT_PROVIDER_ATTR,
) -> DAT_RETURN {
    guard12(&calls::IA_QUERY, || {
        // SAFETY: plain C data; all-zero is a valid value.
        let mut a: dat_abi::DAT_IA_ATTR = unsafe { std::mem::zeroed() };
        // SAFETY: the C struct is plain data (integers, pointers, handles), valid all zero.
        let mut p: dat_abi::DAT_PROVIDER_ATTR = unsafe { std::mem::zeroed() };
        // NULL stays NULL, so the 2.0 code refuses it at its usual point.
        let a_ptr = if ia_attr.is_null() {
            std::ptr::null_mut()
        } else {
            &mut a as *mut _
        };
        let p_ptr = if provider_attr.is_null() {
            std::ptr::null_mut()
        } else {
            &mut p as *mut _
        };
        // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
        unsafe { query_ia(ia, async_evd, ia_mask, a_ptr, provider_mask, p_ptr) }?;
        if ia_mask != 0 {
            // SAFETY: `ia_attr` is NULL or points to a writable value of its type (the C caller's
            // contract).
            if let Some(out) = unsafe { ia_attr.as_mut() } {
                *out = ia_attr_to_v12(&a);
            }
        }
        if provider_mask != 0 {
            // SAFETY: `provider_attr` is NULL or points to a writable value of its type (the C
            // caller's contract).
            if let Some(out) = unsafe { provider_attr.as_mut() } {
                *out = provider_attr_to_v12(&p);
            }
        }
        Ok(())
    })
}
