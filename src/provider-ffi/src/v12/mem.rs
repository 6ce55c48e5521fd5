//! LMR and RMR calls of DAT 1.2: dat_lmr_create without a VA type,
//! 1.2's parameter structs, the 7-argument dat_rmr_bind, and the sync calls
//! over 24-byte triplets.

use super::convert::{lmr_param_to_v12, rmr_param_to_v12};
use super::{calls, guard12};
use crate::boundary::{h, input, out};
use crate::{lmr as lmr20, rmr as rmr20};
use daplrs::core::error::{DatError, ErrorType, Param, SubType};
use daplrs::core::handle;
use dat_abi::{
    DAT_COMPLETION_FLAGS, DAT_EP_HANDLE, DAT_IA_HANDLE, DAT_LMR_HANDLE, DAT_LMR_PARAM_MASK,
    DAT_MEM_PRIV_FLAGS, DAT_MEM_TYPE, DAT_PZ_HANDLE, DAT_REGION_DESCRIPTION, DAT_RETURN,
    DAT_RMR_CONTEXT, DAT_RMR_COOKIE, DAT_RMR_HANDLE, DAT_RMR_PARAM_MASK, DAT_VADDR, DAT_VLEN,
};
use dat_abi12 as d12;

/// dat_lmr_create of 1.2: 2.0's with DAT_VA_TYPE_VA (1.2 regions are
/// virtually addressed); the outputs are one argument earlier than 2.0's.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn lmr_create(
    ia: DAT_IA_HANDLE,
    mem_type: DAT_MEM_TYPE,
    region: DAT_REGION_DESCRIPTION,
    length: DAT_VLEN,
    pz: DAT_PZ_HANDLE,
    privileges: DAT_MEM_PRIV_FLAGS,
    lmr_handle: *mut DAT_LMR_HANDLE,
    lmr_context: *mut dat_abi::DAT_LMR_CONTEXT,
    rmr_context: *mut DAT_RMR_CONTEXT,
    registered_length: *mut DAT_VLEN,
    registered_address: *mut DAT_VADDR,
) -> DAT_RETURN {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    guard12(&calls::LMR_CREATE, || unsafe {
        lmr20::create_lmr(
            ia,
            mem_type,
            region,
            length,
            pz,
            privileges,
            dat_abi::DAT_VA_TYPE_VA,
            lmr_handle,
            lmr_context,
            rmr_context,
            registered_length,
            registered_address,
        )
    })
}

/// A 2.0 query mask for a 1.2 one: every field when the 1.2 mask is valid
/// (the 2.0 queries fill every field anyway), else one the 2.0 check refuses
/// (DAT_INVALID_ARG2, where it always refuses a mask).
fn query_mask(mask: u32, all_v12: u32, all_v20: u32) -> u32 {
    if mask & !all_v12 != 0 {
        u32::MAX
    } else {
        all_v20
    }
}

/// Runs a 2.0 query into a zeroed 2.0 struct and writes its 1.2 form.
unsafe fn query_into<P20, P12>(
    param: *mut P12,
    call: impl FnOnce(*mut P20) -> DAT_RETURN,
    convert: impl FnOnce(&P20) -> P12,
) -> DAT_RETURN {
    // SAFETY: the 2.0 parameter structs are plain C data; all-zero is valid.
    let mut p: P20 = unsafe { std::mem::zeroed() };
    let rc = call(if param.is_null() {
        std::ptr::null_mut()
    } else {
        &mut p
    });
    if rc == dat_abi::DAT_SUCCESS {
        // SAFETY: `param` is NULL or points to a writable value of its type (the C caller's
        // contract).
        if let Some(out) = unsafe { param.as_mut() } {
            *out = convert(&p);
        }
    }
    d12::from_v20(rc)
}

pub(crate) unsafe extern "C" fn lmr_query(
    lmr: DAT_LMR_HANDLE,
    mask: DAT_LMR_PARAM_MASK,
    param: *mut d12::DAT_LMR_PARAM,
) -> DAT_RETURN {
    let mask = query_mask(mask, d12::DAT_LMR_FIELD_ALL, dat_abi::DAT_LMR_FIELD_ALL);
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    unsafe { query_into(param, |p| lmr20::query(lmr, mask, p), lmr_param_to_v12) }
}

pub(crate) unsafe extern "C" fn rmr_query(
    rmr: DAT_RMR_HANDLE,
    mask: DAT_RMR_PARAM_MASK,
    param: *mut d12::DAT_RMR_PARAM,
) -> DAT_RETURN {
    let mask = query_mask(mask, d12::DAT_RMR_FIELD_ALL, dat_abi::DAT_RMR_FIELD_ALL);
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    unsafe { query_into(param, |p| rmr20::query(rmr, mask, p), rmr_param_to_v12) }
}

pub(crate) unsafe extern "C" fn lmr_sync_rdma_read(
    ia: DAT_IA_HANDLE,
    segs: *const d12::DAT_LMR_TRIPLET,
    n: DAT_VLEN,
) -> DAT_RETURN {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    guard12(&calls::LMR_SYNC_RDMA_READ, || unsafe {
        lmr20::sync_segments(ia, segs, n)
    })
}

pub(crate) unsafe extern "C" fn lmr_sync_rdma_write(
    ia: DAT_IA_HANDLE,
    segs: *const d12::DAT_LMR_TRIPLET,
    n: DAT_VLEN,
) -> DAT_RETURN {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    guard12(&calls::LMR_SYNC_RDMA_WRITE, || unsafe {
        lmr20::sync_segments(ia, segs, n)
    })
}

/// dat_rmr_bind of 1.2 (7 arguments: no LMR handle, no VA type). The LMR is
/// the one of the RMR's IA whose lmr_context the triplet carries, and then
/// the core binds exactly as for 2.0 (with DAT_VA_TYPE_VA).
///
/// The rules of the seed page, as the core applies them: a length of 0
/// unbinds (no LMR needed; the returned context is then the window's
/// current one); the EP must be connected or disconnected (else
/// DAT_INVALID_STATE); a range outside the LMR is DAT_INVALID_PARAMETER;
/// remote read without the LMR's local read, or remote write without its
/// local write, is DAT_PRIVILEGES_VIOLATION; an EP or LMR of another PZ is
/// DAT_PROTECTION_VIOLATION; DAT_COMPLETION_UNSIGNALLED_FLAG on an EP not
/// configured for it is DAT_INVALID_PARAMETER.
///
/// A non-empty triplet whose lmr_context names no live LMR of the IA is
/// DAT_PRIVILEGES_VIOLATION: the page gives no code of its own for it, and
/// this is the provider's one answer to an lmr_context that names no LMR
/// (the post pages: "one of the LMRs used ... was invalid"; the bind page
/// lists the code for local memory access). A segment_length beyond 32
/// bits, more than any LMR of ours holds, is DAT_INVALID_PARAMETER
/// (DAT_INVALID_ARG2: "segment_length exceeded the limits of the existing
/// LMR").
pub(crate) unsafe extern "C" fn rmr_bind(
    rmr: DAT_RMR_HANDLE,
    triplet: *const d12::DAT_LMR_TRIPLET,
    privileges: DAT_MEM_PRIV_FLAGS,
    ep: DAT_EP_HANDLE,
    cookie: DAT_RMR_COOKIE,
    flags: DAT_COMPLETION_FLAGS,
    rmr_context: *mut DAT_RMR_CONTEXT,
) -> DAT_RETURN {
    guard12(&calls::RMR_BIND, || {
        let rmr = handle::rmr(h(rmr))?;
        // SAFETY: `triplet` is NULL or points to a readable struct (the C caller's contract).
        let t = unsafe { input(triplet, Param::LmrTriplet) }?;
        let ep = handle::ep(h(ep))?;
        // SAFETY: `rmr_context` is NULL or points to writable memory (the C caller's contract).
        let ctx_out = unsafe { out(rmr_context, Param::RmrContext) }?;
        let length =
            u32::try_from(t.segment_length).map_err(|_| DatError::bad(Param::LmrTriplet))?;
        let lmr = if length == 0 {
            None
        } else {
            rmr.ia().lmr_by_context(t.lmr_context)
        };
        let bound = rmr.bind(
            lmr.as_ref(),
            (t.virtual_address, length, t.lmr_context),
            privileges,
            dat_abi::DAT_VA_TYPE_VA,
            &ep,
            cookie.as_u64(),
            flags,
        );
        let ctx = bound.map_err(|e| match (e.kind, e.sub) {
            // The core's "no LMR" for a non-empty bind: see above.
            (ErrorType::InvalidHandle, SubType::InvalidHandleLmr) => {
                DatError::plain(ErrorType::PrivilegesViolation)
            }
            _ => e,
        })?;
        *ctx_out = ctx;
        Ok(())
    })
}
