//! PSP and RSP: service points listening on a conn_qual (the TCP port).

use crate::boundary::{c, guard, h, out};
use crate::calls;
use daplrs::core::error::{DatError, DatResult, Param, SubType};
use daplrs::core::handle;
use daplrs::core::sp::{Sp, SpParam};
use dat_abi::*;

fn cr_evd(evd: DAT_EVD_HANDLE) -> DatResult<std::sync::Arc<daplrs::core::evd::Evd>> {
    handle::evd(h(evd), SubType::InvalidHandleEvdCr)
}

pub(crate) unsafe extern "C" fn psp_create(
    ia: DAT_IA_HANDLE,
    conn_qual: DAT_CONN_QUAL,
    evd: DAT_EVD_HANDLE,
    flags: DAT_PSP_FLAGS,
    psp: *mut DAT_PSP_HANDLE,
) -> DAT_RETURN {
    guard(&calls::PSP_CREATE, || {
        let ia = handle::ia(h(ia))?;
        let evd = cr_evd(evd)?;
        // SAFETY: `psp` is NULL or points to writable memory (the C caller's contract).
        let psp = unsafe { out(psp, Param::PspHandle) }?;
        *psp = c(Sp::create_psp(&ia, conn_qual, &evd, flags)?.handle());
        Ok(())
    })
}

/// Listens on a free port the provider picks; the port is the conn_qual.
pub(crate) unsafe extern "C" fn psp_create_any(
    ia: DAT_IA_HANDLE,
    conn_qual: *mut DAT_CONN_QUAL,
    evd: DAT_EVD_HANDLE,
    flags: DAT_PSP_FLAGS,
    psp: *mut DAT_PSP_HANDLE,
) -> DAT_RETURN {
    guard(&calls::PSP_CREATE_ANY, || {
        let ia = handle::ia(h(ia))?;
        // SAFETY: `conn_qual` is NULL or points to writable memory (the C caller's contract).
        let qual = unsafe { out(conn_qual, Param::ConnQual) }?;
        let evd = cr_evd(evd)?;
        // SAFETY: `psp` is NULL or points to writable memory (the C caller's contract).
        let psp = unsafe { out(psp, Param::PspHandle) }?;
        let (sp, q) = Sp::create_psp_any(&ia, &evd, flags)?;
        *qual = q;
        *psp = c(sp.handle());
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn rsp_create(
    ia: DAT_IA_HANDLE,
    conn_qual: DAT_CONN_QUAL,
    ep: DAT_EP_HANDLE,
    evd: DAT_EVD_HANDLE,
    rsp: *mut DAT_RSP_HANDLE,
) -> DAT_RETURN {
    guard(&calls::RSP_CREATE, || {
        let ia = handle::ia(h(ia))?;
        let ep = handle::ep(h(ep))?;
        let evd = cr_evd(evd)?;
        // SAFETY: `rsp` is NULL or points to writable memory (the C caller's contract).
        let rsp = unsafe { out(rsp, Param::RspHandle) }?;
        *rsp = c(Sp::create_rsp(&ia, conn_qual, &ep, &evd)?.handle());
        Ok(())
    })
}

fn param_of(p: &SpParam) -> (DAT_IA_HANDLE, DAT_CONN_QUAL, DAT_EVD_HANDLE) {
    (c(p.ia), p.conn_qual, c(p.evd))
}

pub(crate) unsafe extern "C" fn psp_query(
    psp: DAT_PSP_HANDLE,
    mask: DAT_PSP_PARAM_MASK,
    param: *mut DAT_PSP_PARAM,
) -> DAT_RETURN {
    guard(&calls::PSP_QUERY, || {
        let sp = handle::psp(h(psp))?;
        // SAFETY: `param` is NULL or points to writable memory (the C caller's contract).
        let param = unsafe { out(param, Param::PspParam) }?;
        if mask & !DAT_PSP_FIELD_ALL != 0 {
            return Err(DatError::bad(Param::PspParamMask));
        }
        let p = sp.query();
        (param.ia_handle, param.conn_qual, param.evd_handle) = param_of(&p);
        param.psp_flags = p.flags;
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn rsp_query(
    rsp: DAT_RSP_HANDLE,
    mask: DAT_RSP_PARAM_MASK,
    param: *mut DAT_RSP_PARAM,
) -> DAT_RETURN {
    guard(&calls::RSP_QUERY, || {
        let sp = handle::rsp(h(rsp))?;
        // SAFETY: `param` is NULL or points to writable memory (the C caller's contract).
        let param = unsafe { out(param, Param::RspParam) }?;
        if mask & !DAT_RSP_FIELD_ALL != 0 {
            return Err(DatError::bad(Param::RspParamMask));
        }
        let p = sp.query();
        (param.ia_handle, param.conn_qual, param.evd_handle) = param_of(&p);
        param.ep_handle = c(p.ep);
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn psp_free(psp: DAT_PSP_HANDLE) -> DAT_RETURN {
    guard(&calls::PSP_FREE, || handle::psp(h(psp))?.free())
}

pub(crate) unsafe extern "C" fn rsp_free(rsp: DAT_RSP_HANDLE) -> DAT_RETURN {
    guard(&calls::RSP_FREE, || handle::rsp(h(rsp))?.free())
}
