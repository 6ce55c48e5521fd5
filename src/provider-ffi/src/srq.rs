//! SRQ: shared receive queues.

use crate::boundary::{c, count, count_arg, guard, h, input, out, IovBuf, LocalTriplet};
use crate::calls;
use daplrs::core::error::{DatError, DatResult, Param};
use daplrs::core::handle;
use daplrs::core::srq::{Srq, SrqAttr};
use dat_abi::*;

pub(crate) unsafe extern "C" fn create(
    ia: DAT_IA_HANDLE,
    pz: DAT_PZ_HANDLE,
    attr: *mut DAT_SRQ_ATTR,
    srq: *mut DAT_SRQ_HANDLE,
) -> DAT_RETURN {
    guard(&calls::SRQ_CREATE, || {
        let ia = handle::ia(h(ia))?;
        let pz = handle::pz(h(pz))?;
        // SAFETY: `attr` is NULL or points to a readable struct (the C caller's contract).
        let a = unsafe { input(attr, Param::SrqAttr) }?;
        let attr = SrqAttr {
            max_recv_dtos: count_arg(a.max_recv_dtos, Param::SrqAttr)?,
            max_recv_iov: count_arg(a.max_recv_iov, Param::SrqAttr)?,
            low_watermark: count_arg(a.low_watermark, Param::SrqAttr)?,
        };
        // SAFETY: `srq` is NULL or points to writable memory (the C caller's contract).
        let srq = unsafe { out(srq, Param::SrqHandle) }?;
        *srq = c(Srq::create(&ia, &pz, attr)?.handle());
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn free(srq: DAT_SRQ_HANDLE) -> DAT_RETURN {
    guard(&calls::SRQ_FREE, || handle::srq(h(srq))?.free())
}

pub(crate) unsafe extern "C" fn post_recv(
    srq: DAT_SRQ_HANDLE,
    n: DAT_COUNT,
    iov: *mut DAT_LMR_TRIPLET,
    cookie: DAT_DTO_COOKIE,
) -> DAT_RETURN {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    guard(&calls::SRQ_POST_RECV, || unsafe {
        post_recv_iov(srq, n, iov, cookie)
    })
}

/// dat_srq_post_recv over either version's triplets.
pub(crate) unsafe fn post_recv_iov<T: LocalTriplet>(
    srq: DAT_SRQ_HANDLE,
    n: DAT_COUNT,
    iov: *const T,
    cookie: DAT_DTO_COOKIE,
) -> DatResult<()> {
    let srq = handle::srq(h(srq))?;
    let mut buf = IovBuf::new();
    // SAFETY: `iov` is NULL or points to as many readable triplets as the count says (the C
    // caller's contract).
    let iov = unsafe { buf.read(iov, n, srq.query().attr.max_recv_iov) }?;
    srq.post_recv(iov, cookie.as_u64())
}

pub(crate) unsafe extern "C" fn query(
    srq: DAT_SRQ_HANDLE,
    mask: DAT_SRQ_PARAM_MASK,
    param: *mut DAT_SRQ_PARAM,
) -> DAT_RETURN {
    guard(&calls::SRQ_QUERY, || {
        let srq = handle::srq(h(srq))?;
        // SAFETY: `param` is NULL or points to writable memory (the C caller's contract).
        let param = unsafe { out(param, Param::SrqParam) }?;
        if mask & !DAT_SRQ_FIELD_ALL != 0 {
            return Err(DatError::bad(Param::SrqParamMask));
        }
        let p = srq.query();
        param.ia_handle = c(p.ia);
        param.srq_state = DAT_SRQ_STATE_OPERATIONAL;
        param.pz_handle = c(p.pz);
        param.max_recv_dtos = count(p.attr.max_recv_dtos);
        param.max_recv_iov = count(p.attr.max_recv_iov);
        param.low_watermark = count(p.attr.low_watermark);
        param.available_dto_count = count(p.available_dto_count);
        param.outstanding_dto_count =
            count(p.attr.max_recv_dtos.saturating_sub(p.available_dto_count));
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn resize(
    srq: DAT_SRQ_HANDLE,
    max_recv_dtos: DAT_COUNT,
) -> DAT_RETURN {
    guard(&calls::SRQ_RESIZE, || {
        handle::srq(h(srq))?.resize(max_recv_dtos)
    })
}

pub(crate) unsafe extern "C" fn set_lw(
    srq: DAT_SRQ_HANDLE,
    low_watermark: DAT_COUNT,
) -> DAT_RETURN {
    guard(&calls::SRQ_SET_LW, || {
        handle::srq(h(srq))?.set_lw(low_watermark)
    })
}
