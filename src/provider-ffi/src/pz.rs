//! PZ: protection zones.

use crate::boundary::{c, guard, h, out};
use crate::calls;
use daplrs::core::error::Param;
use daplrs::core::handle;
use daplrs::core::pz::Pz;
use dat_abi::*;

pub(crate) unsafe extern "C" fn create(ia: DAT_IA_HANDLE, pz: *mut DAT_PZ_HANDLE) -> DAT_RETURN {
    guard(&calls::PZ_CREATE, || {
        let ia = handle::ia(h(ia))?;
        // SAFETY: `pz` is NULL or points to writable memory (the C caller's contract).
        let pz = unsafe { out(pz, Param::PzHandle) }?;
        *pz = c(Pz::create(&ia)?.handle());
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn query(
    pz: DAT_PZ_HANDLE,
    mask: DAT_PZ_PARAM_MASK,
    param: *mut DAT_PZ_PARAM,
) -> DAT_RETURN {
    guard(&calls::PZ_QUERY, || {
        let pz = handle::pz(h(pz))?;
        // SAFETY: `param` is NULL or points to writable memory (the C caller's contract).
        let param = unsafe { out(param, Param::PzParam) }?;
        if mask & DAT_PZ_FIELD_IA_HANDLE != 0 {
            param.ia_handle = c(pz.query());
        }
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn free(pz: DAT_PZ_HANDLE) -> DAT_RETURN {
    guard(&calls::PZ_FREE, || handle::pz(h(pz))?.free())
}
