//! LMR: local memory regions, registered with privileges; their
//! lmr_context (lkey) and rmr_context (rkey) are unique while live.

use crate::boundary::{c, guard, h, interned_cookie, lmr_spans, out, LocalTriplet};
use crate::calls;
use daplrs::core::error::{DatError, DatResult, Param};
use daplrs::core::handle;
use daplrs::core::lmr::{sync_rdma, Lmr, LmrRegion};
use dat_abi::*;

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn create(
    ia: DAT_IA_HANDLE,
    mem_type: DAT_MEM_TYPE,
    region: DAT_REGION_DESCRIPTION,
    length: DAT_VLEN,
    pz: DAT_PZ_HANDLE,
    privileges: DAT_MEM_PRIV_FLAGS,
    va_type: DAT_VA_TYPE,
    lmr_handle: *mut DAT_LMR_HANDLE,
    lmr_context: *mut DAT_LMR_CONTEXT,
    rmr_context: *mut DAT_RMR_CONTEXT,
    registered_length: *mut DAT_VLEN,
    registered_address: *mut DAT_VADDR,
) -> DAT_RETURN {
    guard(&calls::LMR_CREATE, || {
        // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
        unsafe {
            create_lmr(
                ia,
                mem_type,
                region,
                length,
                pz,
                privileges,
                va_type,
                lmr_handle,
                lmr_context,
                rmr_context,
                registered_length,
                registered_address,
            )
        }
    })
}

/// dat_lmr_create of either DAT version (1.2's passes DAT_VA_TYPE_VA).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn create_lmr(
    ia: DAT_IA_HANDLE,
    mem_type: DAT_MEM_TYPE,
    region: DAT_REGION_DESCRIPTION,
    length: DAT_VLEN,
    pz: DAT_PZ_HANDLE,
    privileges: DAT_MEM_PRIV_FLAGS,
    va_type: DAT_VA_TYPE,
    lmr_handle: *mut DAT_LMR_HANDLE,
    lmr_context: *mut DAT_LMR_CONTEXT,
    rmr_context: *mut DAT_RMR_CONTEXT,
    registered_length: *mut DAT_VLEN,
    registered_address: *mut DAT_VADDR,
) -> DatResult<()> {
    let ia = handle::ia(h(ia))?;
    let region = match mem_type {
        DAT_MEM_TYPE_VIRTUAL => LmrRegion::Virtual {
            // SAFETY: mem_type names the member the caller filled (the C contract; here and
            // below).
            address: unsafe { region.for_va } as u64,
            length,
        },
        // SAFETY: as above.
        DAT_MEM_TYPE_LMR => LmrRegion::Lmr(handle::lmr(h(unsafe { region.for_lmr_handle }))?),
        DAT_MEM_TYPE_SHARED_VIRTUAL => {
            // SAFETY: as above.
            let shared = unsafe { region.for_shared_memory };
            // SAFETY: `shared_memory_id` is NULL or points to a readable id (the C caller's
            // contract).
            let id = unsafe { shared.shared_memory_id.as_ref() }
                .ok_or(DatError::bad(Param::RegionDescription))?;
            LmrRegion::SharedVirtual {
                address: shared.virtual_address as u64,
                length,
                id: id.map(|c| c as u8),
            }
        }
        _ => return Err(DatError::bad(Param::MemType)),
    };
    let pz = handle::pz(h(pz))?;
    // SAFETY: `lmr_handle` is NULL or points to writable memory (the C caller's contract).
    let lmr_out = unsafe { out(lmr_handle, Param::LmrHandle) }?;
    let lmr = Lmr::create(&ia, region, &pz, privileges, va_type)?;
    let p = lmr.query();
    *lmr_out = c(lmr.handle());
    // The remaining outputs are optional in practice; fill those given.
    // SAFETY: `lmr_context` is NULL or points to a writable value of its type (the C caller's
    // contract).
    if let Some(v) = unsafe { lmr_context.as_mut() } {
        *v = p.lmr_context;
    }
    // SAFETY: `rmr_context` is NULL or points to a writable value of its type (the C caller's
    // contract).
    if let Some(v) = unsafe { rmr_context.as_mut() } {
        *v = p.rmr_context;
    }
    // SAFETY: `registered_length` is NULL or points to a writable value of its type (the C
    // caller's contract).
    if let Some(v) = unsafe { registered_length.as_mut() } {
        *v = p.registered_size;
    }
    // SAFETY: `registered_address` is NULL or points to a writable value of its type (the C
    // caller's contract).
    if let Some(v) = unsafe { registered_address.as_mut() } {
        *v = p.registered_address;
    }
    Ok(())
}

pub(crate) unsafe extern "C" fn query(
    lmr: DAT_LMR_HANDLE,
    mask: DAT_LMR_PARAM_MASK,
    param: *mut DAT_LMR_PARAM,
) -> DAT_RETURN {
    guard(&calls::LMR_QUERY, || {
        let lmr = handle::lmr(h(lmr))?;
        // SAFETY: `param` is NULL or points to writable memory (the C caller's contract).
        let param = unsafe { out(param, Param::LmrParam) }?;
        if mask & !DAT_LMR_FIELD_ALL != 0 {
            return Err(DatError::bad(Param::LmrParamMask));
        }
        let p = lmr.query();
        param.ia_handle = c(p.ia);
        param.mem_type = p.mem_type;
        param.region_desc = match p.shared_id {
            Some(id) => DAT_REGION_DESCRIPTION {
                for_shared_memory: DAT_SHARED_MEMORY {
                    virtual_address: p.address as DAT_PVOID,
                    shared_memory_id: interned_cookie(id),
                },
            },
            None => DAT_REGION_DESCRIPTION {
                for_va: p.address as DAT_PVOID,
            },
        };
        param.length = p.length;
        param.pz_handle = c(p.pz);
        param.mem_priv = p.mem_priv;
        param.va_type = p.va_type;
        param.lmr_context = p.lmr_context;
        param.rmr_context = p.rmr_context;
        param.registered_size = p.registered_size;
        param.registered_address = p.registered_address;
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn free(lmr: DAT_LMR_HANDLE) -> DAT_RETURN {
    guard(&calls::LMR_FREE, || handle::lmr(h(lmr))?.free())
}

pub(crate) unsafe extern "C" fn sync_rdma_read(
    ia: DAT_IA_HANDLE,
    segs: *const DAT_LMR_TRIPLET,
    n: DAT_VLEN,
) -> DAT_RETURN {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    guard(&calls::LMR_SYNC_RDMA_READ, || unsafe {
        sync_segments(ia, segs, n)
    })
}

pub(crate) unsafe extern "C" fn sync_rdma_write(
    ia: DAT_IA_HANDLE,
    segs: *const DAT_LMR_TRIPLET,
    n: DAT_VLEN,
) -> DAT_RETURN {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    guard(&calls::LMR_SYNC_RDMA_WRITE, || unsafe {
        sync_segments(ia, segs, n)
    })
}

/// dat_lmr_sync_rdma_read and _write over either version's triplets: the
/// same rule for both directions (see `sync_rdma`).
pub(crate) unsafe fn sync_segments<T: LocalTriplet>(
    ia: DAT_IA_HANDLE,
    segs: *const T,
    n: DAT_VLEN,
) -> DatResult<()> {
    // SAFETY: `segs` is NULL or points to as many readable triplets as the count says (the C
    // caller's contract).
    sync_rdma(&handle::ia(h(ia))?, &unsafe { lmr_spans(segs, n) }?)
}
