//! RMR: memory windows a peer reaches by rmr_context, bound to part of an
//! LMR through an EP.

use crate::boundary::{c, guard, h, input, out};
use crate::calls;
use daplrs::core::error::{DatError, DatResult, Param};
use daplrs::core::handle;
use daplrs::core::rmr::Rmr;
use dat_abi::*;

pub(crate) unsafe extern "C" fn create(pz: DAT_PZ_HANDLE, rmr: *mut DAT_RMR_HANDLE) -> DAT_RETURN {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    guard(&calls::RMR_CREATE, || unsafe { create_rmr(pz, rmr) })
}

/// dat_rmr_create and dat_rmr_create_for_ep.
unsafe fn create_rmr(pz: DAT_PZ_HANDLE, rmr: *mut DAT_RMR_HANDLE) -> DatResult<()> {
    let pz = handle::pz(h(pz))?;
    // SAFETY: `rmr` is NULL or points to writable memory (the C caller's contract).
    let rmr = unsafe { out(rmr, Param::RmrHandle) }?;
    *rmr = c(Rmr::create(&pz)?.handle());
    Ok(())
}

/// RMRs of this provider are already scoped to the EP they are bound
/// through, so the EP-scoped variant is the same object.
pub(crate) unsafe extern "C" fn create_for_ep(
    pz: DAT_PZ_HANDLE,
    rmr: *mut DAT_RMR_HANDLE,
) -> DAT_RETURN {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    guard(&calls::RMR_CREATE_FOR_EP, || unsafe { create_rmr(pz, rmr) })
}

pub(crate) unsafe extern "C" fn query(
    rmr: DAT_RMR_HANDLE,
    mask: DAT_RMR_PARAM_MASK,
    param: *mut DAT_RMR_PARAM,
) -> DAT_RETURN {
    guard(&calls::RMR_QUERY, || {
        let rmr = handle::rmr(h(rmr))?;
        // SAFETY: `param` is NULL or points to writable memory (the C caller's contract).
        let param = unsafe { out(param, Param::RmrParam) }?;
        if mask & !DAT_RMR_FIELD_ALL != 0 {
            return Err(DatError::bad(Param::RmrParamMask));
        }
        let p = rmr.query();
        param.ia_handle = c(p.ia);
        param.pz_handle = c(p.pz);
        param.lmr_triplet = DAT_LMR_TRIPLET {
            virtual_address: p.lmr_triplet.0,
            segment_length: p.lmr_triplet.1,
            lmr_context: p.lmr_triplet.2,
        };
        param.mem_priv = p.mem_priv;
        param.rmr_context = p.rmr_context;
        param.rmr_scope = DAT_RMR_SCOPE_EP;
        param.va_type = p.va_type;
        Ok(())
    })
}

/// dat_rmr_bind (2.0: with the LMR handle and VA type). The new
/// rmr_context is returned at once; the bind completes with an
/// RMR_BIND event on the EP's request EVD.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn bind(
    rmr: DAT_RMR_HANDLE,
    lmr: DAT_LMR_HANDLE,
    triplet: *const DAT_LMR_TRIPLET,
    privileges: DAT_MEM_PRIV_FLAGS,
    va_type: DAT_VA_TYPE,
    ep: DAT_EP_HANDLE,
    cookie: DAT_RMR_COOKIE,
    flags: DAT_COMPLETION_FLAGS,
    rmr_context: *mut DAT_RMR_CONTEXT,
) -> DAT_RETURN {
    guard(&calls::RMR_BIND, || {
        let rmr = handle::rmr(h(rmr))?;
        let lmr = if lmr.is_null() {
            None
        } else {
            Some(handle::lmr(h(lmr))?)
        };
        // SAFETY: `triplet` is NULL or points to a readable struct (the C caller's contract).
        let t = unsafe { input(triplet, Param::LmrTriplet) }?;
        let ep = handle::ep(h(ep))?;
        // SAFETY: `rmr_context` is NULL or points to writable memory (the C caller's contract).
        let ctx_out = unsafe { out(rmr_context, Param::RmrContext) }?;
        let ctx = rmr.bind(
            lmr.as_ref(),
            (t.virtual_address, t.segment_length, t.lmr_context),
            privileges,
            va_type,
            &ep,
            cookie.as_u64(),
            flags,
        )?;
        *ctx_out = ctx;
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn free(rmr: DAT_RMR_HANDLE) -> DAT_RETURN {
    guard(&calls::RMR_FREE, || handle::rmr(h(rmr))?.free())
}
