//! CR: a connection request waiting on a service point.

use crate::boundary::{bytes, c, guard, h, out, sockaddr_of};
use crate::calls;
use daplrs::core::error::{DatError, Param};
use daplrs::core::handle;
use dat_abi::*;

pub(crate) unsafe extern "C" fn query(
    cr: DAT_CR_HANDLE,
    mask: DAT_CR_PARAM_MASK,
    param: *mut DAT_CR_PARAM,
) -> DAT_RETURN {
    guard(&calls::CR_QUERY, || {
        let cr = handle::cr(h(cr))?;
        // SAFETY: `param` is NULL or points to writable memory (the C caller's contract).
        let param = unsafe { out(param, Param::CrParam) }?;
        if mask & !DAT_CR_FIELD_ALL != 0 {
            return Err(DatError::bad(Param::CrParamMask));
        }
        let p = cr.query();
        param.remote_ia_address_ptr = sockaddr_of(p.remote_address);
        param.remote_port_qual = p.remote_port;
        param.private_data_size = p.private_data.len() as DAT_COUNT;
        // The CR keeps its private data alive until it is accepted or
        // rejected, which is as long as DAT promises the pointer.
        param.private_data = if p.private_data.is_empty() {
            std::ptr::null_mut()
        } else {
            p.private_data.as_ptr() as DAT_PVOID
        };
        param.local_ep_handle = c(p.ep);
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn accept(
    cr: DAT_CR_HANDLE,
    ep: DAT_EP_HANDLE,
    pd_size: DAT_COUNT,
    pd: DAT_PVOID,
) -> DAT_RETURN {
    guard(&calls::CR_ACCEPT, || {
        let cr = handle::cr(h(cr))?;
        let ep = if ep.is_null() {
            None
        } else {
            Some(handle::ep(h(ep))?)
        };
        // SAFETY: `pd` is NULL or points to as many readable bytes as the size says (the C caller's
        // contract).
        let pd = unsafe { bytes(pd, pd_size) }?;
        cr.accept(ep.as_ref(), pd)
    })
}

pub(crate) unsafe extern "C" fn reject(
    cr: DAT_CR_HANDLE,
    pd_size: DAT_COUNT,
    pd: DAT_PVOID,
) -> DAT_RETURN {
    guard(&calls::CR_REJECT, || {
        let cr = handle::cr(h(cr))?;
        // SAFETY: `pd` is NULL or points to as many readable bytes as the size says (the C caller's
        // contract).
        let pd = unsafe { bytes(pd, pd_size) }?;
        cr.reject(pd)
    })
}

pub(crate) unsafe extern "C" fn handoff(cr: DAT_CR_HANDLE, conn_qual: DAT_CONN_QUAL) -> DAT_RETURN {
    guard(&calls::CR_HANDOFF, || handle::cr(h(cr))?.handoff(conn_qual))
}
