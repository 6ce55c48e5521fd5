//! The CNO, CR and SRQ calls of DAT 1.2 that differ from 2.0's.

use super::convert::{cno_param_to_v12, srq_state_to_v12};
use super::{calls, guard12};
use crate::{cno as cno20, cr as cr20, srq as srq20};
use dat_abi::{
    DAT_CNO_HANDLE, DAT_CNO_PARAM_MASK, DAT_COUNT, DAT_CR_HANDLE, DAT_DTO_COOKIE, DAT_RETURN,
    DAT_SRQ_HANDLE, DAT_SRQ_PARAM, DAT_SRQ_PARAM_MASK,
};
use dat_abi12 as d12;

pub(crate) unsafe extern "C" fn cno_query(
    cno: DAT_CNO_HANDLE,
    mask: DAT_CNO_PARAM_MASK,
    param: *mut d12::DAT_CNO_PARAM,
) -> DAT_RETURN {
    // 2.0's CNO mask values are not bits (ALL is 4): a valid 1.2 mask asks
    // for all, an invalid one becomes one the 2.0 check refuses.
    let mask = if mask & !d12::DAT_CNO_FIELD_ALL != 0 {
        u32::MAX
    } else {
        dat_abi::DAT_CNO_FIELD_ALL
    };
    // SAFETY: plain C data; all-zero is a valid value.
    let mut p: dat_abi::DAT_CNO_PARAM = unsafe { std::mem::zeroed() };
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    let rc = unsafe {
        cno20::query(
            cno,
            mask,
            if param.is_null() {
                std::ptr::null_mut()
            } else {
                &mut p
            },
        )
    };
    if rc == dat_abi::DAT_SUCCESS {
        // SAFETY: `param` is NULL or points to a writable value of its type (the C caller's
        // contract).
        if let Some(out) = unsafe { param.as_mut() } {
            *out = cno_param_to_v12(&p);
        }
    }
    d12::from_v20(rc)
}

/// dat_cr_reject of 1.2: no private data.
pub(crate) unsafe extern "C" fn cr_reject(cr: DAT_CR_HANDLE) -> DAT_RETURN {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    d12::from_v20(unsafe { cr20::reject(cr, 0, std::ptr::null_mut()) })
}

pub(crate) unsafe extern "C" fn srq_post_recv(
    srq: DAT_SRQ_HANDLE,
    n: DAT_COUNT,
    iov: *mut d12::DAT_LMR_TRIPLET,
    cookie: DAT_DTO_COOKIE,
) -> DAT_RETURN {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    guard12(&calls::SRQ_POST_RECV, || unsafe {
        srq20::post_recv_iov(srq, n, iov as *const d12::DAT_LMR_TRIPLET, cookie)
    })
}

/// The SRQ parameters are the same struct in both versions; only the state
/// is numbered differently.
pub(crate) unsafe extern "C" fn srq_query(
    srq: DAT_SRQ_HANDLE,
    mask: DAT_SRQ_PARAM_MASK,
    param: *mut DAT_SRQ_PARAM,
) -> DAT_RETURN {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    let rc = unsafe { srq20::query(srq, mask, param) };
    if rc == dat_abi::DAT_SUCCESS {
        // SAFETY: `param` is NULL or points to a writable value of its type (the C caller's
        // contract).
        if let Some(p) = unsafe { param.as_mut() } {
            p.srq_state = srq_state_to_v12(p.srq_state);
        }
    }
    d12::from_v20(rc)
}
