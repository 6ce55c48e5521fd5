//! EP: endpoints, their connections and every data transfer call.

use crate::boundary::{
    boolean, bytes, c, count, count_arg, guard, h, input, ipv4_of, out, remote_buffer, sockaddr_of,
    IovBuf, LocalTriplet, RemoteTriplet,
};
use crate::calls;
use daplrs::core::ep::{Ep, EpAttr, EpModify, IovKind, RemoteBuffer};
use daplrs::core::error::{DatError, DatResult, Param, SubType};
use daplrs::core::evd::Evd;
use daplrs::core::handle;
use dat_abi::*;
use std::sync::Arc;

fn ep(handle: DAT_EP_HANDLE) -> DatResult<Arc<Ep>> {
    handle::ep(h(handle))
}

/// The EP of a data transfer call, held for the call (see `handle::ep_held`).
fn ep_held(handle: DAT_EP_HANDLE) -> DatResult<handle::Held<Ep>> {
    handle::ep_held(h(handle))
}

fn evd_opt(handle: DAT_EVD_HANDLE, bad: SubType) -> DatResult<Option<Arc<Evd>>> {
    handle::evd_opt(h(handle), bad)
}

/// DAT_EP_ATTR as the core's EpAttr; a negative count is refused as `param`.
fn attr_of(a: &DAT_EP_ATTR, param: Param) -> DatResult<EpAttr> {
    let n = |v: DAT_COUNT| count_arg(v, param);
    Ok(EpAttr {
        service_type: a.service_type,
        max_message_size: a.max_message_size,
        max_rdma_size: a.max_rdma_size,
        qos: a.qos,
        recv_completion_flags: a.recv_completion_flags,
        request_completion_flags: a.request_completion_flags,
        max_recv_dtos: n(a.max_recv_dtos)?,
        max_request_dtos: n(a.max_request_dtos)?,
        max_recv_iov: n(a.max_recv_iov)?,
        max_request_iov: n(a.max_request_iov)?,
        max_rdma_read_in: n(a.max_rdma_read_in)?,
        max_rdma_read_out: n(a.max_rdma_read_out)?,
        srq_soft_hw: n(a.srq_soft_hw)?,
        max_rdma_read_iov: n(a.max_rdma_read_iov)?,
        max_rdma_write_iov: n(a.max_rdma_write_iov)?,
    })
}

fn c_attr(a: &EpAttr) -> DAT_EP_ATTR {
    let n = count;
    DAT_EP_ATTR {
        service_type: a.service_type,
        max_message_size: a.max_message_size,
        max_rdma_size: a.max_rdma_size,
        qos: a.qos,
        recv_completion_flags: a.recv_completion_flags,
        request_completion_flags: a.request_completion_flags,
        max_recv_dtos: n(a.max_recv_dtos),
        max_request_dtos: n(a.max_request_dtos),
        max_recv_iov: n(a.max_recv_iov),
        max_request_iov: n(a.max_request_iov),
        max_rdma_read_in: n(a.max_rdma_read_in),
        max_rdma_read_out: n(a.max_rdma_read_out),
        srq_soft_hw: n(a.srq_soft_hw),
        max_rdma_read_iov: n(a.max_rdma_read_iov),
        max_rdma_write_iov: n(a.max_rdma_write_iov),
        ep_transport_specific_count: 0,
        ep_transport_specific: std::ptr::null_mut(),
        ep_provider_specific_count: 0,
        ep_provider_specific: std::ptr::null_mut(),
    }
}

#[allow(clippy::too_many_arguments)]
unsafe fn create_common(
    ia: DAT_IA_HANDLE,
    pz: DAT_PZ_HANDLE,
    recv_evd: DAT_EVD_HANDLE,
    request_evd: DAT_EVD_HANDLE,
    connect_evd: DAT_EVD_HANDLE,
    srq: Option<DAT_SRQ_HANDLE>,
    attr: *const DAT_EP_ATTR,
    ep_out: *mut DAT_EP_HANDLE,
) -> DatResult<()> {
    let ia = handle::ia(h(ia))?;
    let pz = if pz.is_null() {
        None
    } else {
        Some(handle::pz(h(pz))?)
    };
    let recv = evd_opt(recv_evd, SubType::InvalidHandleEvdRecv)?;
    let request = evd_opt(request_evd, SubType::InvalidHandleEvdRequest)?;
    let connect = evd_opt(connect_evd, SubType::InvalidHandleEvdConn)?;
    let srq = match srq {
        Some(s) => Some(handle::srq(h(s))?),
        None => None,
    };
    // SAFETY: `attr` is NULL or points to a readable value of its type (the C caller's contract).
    let attr = match unsafe { attr.as_ref() } {
        Some(a) => Some(attr_of(a, Param::EpAttributes)?),
        None => None,
    };
    // SAFETY: `ep_out` is NULL or points to writable memory (the C caller's contract).
    let ep_out = unsafe { out(ep_out, Param::EpHandle) }?;
    *ep_out = c(Ep::create(&ia, pz, recv, request, connect, srq, attr)?.handle());
    Ok(())
}

pub(crate) unsafe extern "C" fn create(
    ia: DAT_IA_HANDLE,
    pz: DAT_PZ_HANDLE,
    recv_evd: DAT_EVD_HANDLE,
    request_evd: DAT_EVD_HANDLE,
    connect_evd: DAT_EVD_HANDLE,
    attr: *const DAT_EP_ATTR,
    ep_out: *mut DAT_EP_HANDLE,
) -> DAT_RETURN {
    guard(&calls::EP_CREATE, || {
        // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
        unsafe {
            create_common(
                ia,
                pz,
                recv_evd,
                request_evd,
                connect_evd,
                None,
                attr,
                ep_out,
            )
        }
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn create_with_srq(
    ia: DAT_IA_HANDLE,
    pz: DAT_PZ_HANDLE,
    recv_evd: DAT_EVD_HANDLE,
    request_evd: DAT_EVD_HANDLE,
    connect_evd: DAT_EVD_HANDLE,
    srq: DAT_SRQ_HANDLE,
    attr: *const DAT_EP_ATTR,
    ep_out: *mut DAT_EP_HANDLE,
) -> DAT_RETURN {
    guard(&calls::EP_CREATE_WITH_SRQ, || {
        // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
        unsafe {
            create_common(
                ia,
                pz,
                recv_evd,
                request_evd,
                connect_evd,
                Some(srq),
                attr,
                ep_out,
            )
        }
    })
}

pub(crate) unsafe extern "C" fn query(
    ep_handle: DAT_EP_HANDLE,
    mask: DAT_EP_PARAM_MASK,
    param: *mut DAT_EP_PARAM,
) -> DAT_RETURN {
    guard(&calls::EP_QUERY, || {
        let ep = ep(ep_handle)?;
        // SAFETY: `param` is NULL or points to writable memory (the C caller's contract).
        let param = unsafe { out(param, Param::EpParam) }?;
        if mask & !DAT_EP_FIELD_ALL != 0 {
            return Err(DatError::bad(Param::EpParamMask));
        }
        let p = ep.query();
        param.ia_handle = c(p.ia);
        param.ep_state = p.state as DAT_EP_STATE;
        param.comm = DAT_COMM::default();
        param.local_ia_address_ptr = sockaddr_of(p.local_address);
        param.local_port_qual = p.local_port;
        param.remote_ia_address_ptr = p
            .remote_address
            .map(sockaddr_of)
            .unwrap_or(std::ptr::null_mut());
        param.remote_port_qual = p.remote_port;
        param.pz_handle = c(p.pz);
        param.recv_evd_handle = c(p.recv_evd);
        param.request_evd_handle = c(p.request_evd);
        param.connect_evd_handle = c(p.connect_evd);
        param.srq_handle = c(p.srq);
        param.ep_attr = c_attr(&p.attr);
        Ok(())
    })
}

/// Fields dat_ep_modify may change; the rest (IA, state, addresses,
/// ports, SRQ) are the provider's.
const MODIFIABLE: DAT_EP_PARAM_MASK = DAT_EP_FIELD_PZ_HANDLE
    | DAT_EP_FIELD_RECV_EVD_HANDLE
    | DAT_EP_FIELD_REQUEST_EVD_HANDLE
    | DAT_EP_FIELD_CONNECT_EVD_HANDLE
    | DAT_EP_FIELD_EP_ATTR_ALL;

pub(crate) unsafe extern "C" fn modify(
    ep_handle: DAT_EP_HANDLE,
    mask: DAT_EP_PARAM_MASK,
    param: *const DAT_EP_PARAM,
) -> DAT_RETURN {
    guard(&calls::EP_MODIFY, || {
        let ep = ep(ep_handle)?;
        if mask & !MODIFIABLE != 0 {
            return Err(DatError::bad(Param::EpParamMask));
        }
        // SAFETY: `param` is NULL or points to a readable struct (the C caller's contract).
        let p = unsafe { input(param, Param::EpParam) }?;
        let mut change = EpModify::default();
        if mask & DAT_EP_FIELD_PZ_HANDLE != 0 {
            change.pz =
                Some(handle::pz(h(p.pz_handle)).map_err(|_| DatError::bad(Param::EpParam))?);
        }
        if mask & DAT_EP_FIELD_RECV_EVD_HANDLE != 0 {
            change.recv_evd = Some(evd_opt(p.recv_evd_handle, SubType::InvalidHandleEvdRecv)?);
        }
        if mask & DAT_EP_FIELD_REQUEST_EVD_HANDLE != 0 {
            change.request_evd = Some(evd_opt(
                p.request_evd_handle,
                SubType::InvalidHandleEvdRequest,
            )?);
        }
        if mask & DAT_EP_FIELD_CONNECT_EVD_HANDLE != 0 {
            change.connect_evd = Some(evd_opt(
                p.connect_evd_handle,
                SubType::InvalidHandleEvdConn,
            )?);
        }
        if mask & DAT_EP_FIELD_EP_ATTR_ALL != 0 {
            let new = attr_of(&p.ep_attr, Param::EpParam)?;
            let mut a = ep.attr();
            let fields: [(DAT_EP_PARAM_MASK, &mut u32, u32); 15] = [
                (
                    DAT_EP_FIELD_EP_ATTR_SERVICE_TYPE,
                    &mut a.service_type,
                    new.service_type,
                ),
                (
                    DAT_EP_FIELD_EP_ATTR_MAX_MESSAGE_SIZE,
                    &mut a.max_message_size,
                    new.max_message_size,
                ),
                (
                    DAT_EP_FIELD_EP_ATTR_MAX_RDMA_SIZE,
                    &mut a.max_rdma_size,
                    new.max_rdma_size,
                ),
                (DAT_EP_FIELD_EP_ATTR_QOS, &mut a.qos, new.qos),
                (
                    DAT_EP_FIELD_EP_ATTR_RECV_COMPLETION_FLAGS,
                    &mut a.recv_completion_flags,
                    new.recv_completion_flags,
                ),
                (
                    DAT_EP_FIELD_EP_ATTR_REQUEST_COMPLETION_FLAGS,
                    &mut a.request_completion_flags,
                    new.request_completion_flags,
                ),
                (
                    DAT_EP_FIELD_EP_ATTR_MAX_RECV_DTOS,
                    &mut a.max_recv_dtos,
                    new.max_recv_dtos,
                ),
                (
                    DAT_EP_FIELD_EP_ATTR_MAX_REQUEST_DTOS,
                    &mut a.max_request_dtos,
                    new.max_request_dtos,
                ),
                (
                    DAT_EP_FIELD_EP_ATTR_MAX_RECV_IOV,
                    &mut a.max_recv_iov,
                    new.max_recv_iov,
                ),
                (
                    DAT_EP_FIELD_EP_ATTR_MAX_REQUEST_IOV,
                    &mut a.max_request_iov,
                    new.max_request_iov,
                ),
                (
                    DAT_EP_FIELD_EP_ATTR_MAX_RDMA_READ_IN,
                    &mut a.max_rdma_read_in,
                    new.max_rdma_read_in,
                ),
                (
                    DAT_EP_FIELD_EP_ATTR_MAX_RDMA_READ_OUT,
                    &mut a.max_rdma_read_out,
                    new.max_rdma_read_out,
                ),
                (
                    DAT_EP_FIELD_EP_ATTR_SRQ_SOFT_HW,
                    &mut a.srq_soft_hw,
                    new.srq_soft_hw,
                ),
                (
                    DAT_EP_FIELD_EP_ATTR_MAX_RDMA_READ_IOV,
                    &mut a.max_rdma_read_iov,
                    new.max_rdma_read_iov,
                ),
                (
                    DAT_EP_FIELD_EP_ATTR_MAX_RDMA_WRITE_IOV,
                    &mut a.max_rdma_write_iov,
                    new.max_rdma_write_iov,
                ),
            ];
            for (bit, field, value) in fields {
                if mask & bit != 0 {
                    *field = value;
                }
            }
            change.attr = Some(a);
        }
        ep.modify(change)
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn connect(
    ep_handle: DAT_EP_HANDLE,
    remote: DAT_IA_ADDRESS_PTR,
    conn_qual: DAT_CONN_QUAL,
    timeout: DAT_TIMEOUT,
    pd_size: DAT_COUNT,
    pd: DAT_PVOID,
    qos: DAT_QOS,
    flags: DAT_CONNECT_FLAGS,
) -> DAT_RETURN {
    guard(&calls::EP_CONNECT, || {
        let ep = ep(ep_handle)?;
        // SAFETY: `remote` is NULL or a sockaddr of its family's size (the C caller's contract).
        let remote = unsafe { ipv4_of(remote, Param::RemoteIaAddress) }?;
        // SAFETY: `pd` is NULL or points to as many readable bytes as the size says (the C caller's
        // contract).
        let pd = unsafe { bytes(pd, pd_size) }?;
        ep.connect(remote, conn_qual, timeout, pd, qos, flags)
    })
}

pub(crate) unsafe extern "C" fn dup_connect(
    ep_handle: DAT_EP_HANDLE,
    dup: DAT_EP_HANDLE,
    timeout: DAT_TIMEOUT,
    pd_size: DAT_COUNT,
    pd: DAT_PVOID,
    qos: DAT_QOS,
) -> DAT_RETURN {
    guard(&calls::EP_DUP_CONNECT, || {
        let ep = ep(ep_handle)?;
        let dup = handle::ep(h(dup)).map_err(|_| DatError::bad_handle(Param::EpDupHandle))?;
        // SAFETY: `pd` is NULL or points to as many readable bytes as the size says (the C caller's
        // contract).
        let pd = unsafe { bytes(pd, pd_size) }?;
        ep.dup_connect(&dup, timeout, pd, qos)
    })
}

pub(crate) unsafe extern "C" fn disconnect(
    ep_handle: DAT_EP_HANDLE,
    flags: DAT_CLOSE_FLAGS,
) -> DAT_RETURN {
    guard(&calls::EP_DISCONNECT, || ep(ep_handle)?.disconnect(flags))
}

pub(crate) unsafe extern "C" fn post_send(
    ep_handle: DAT_EP_HANDLE,
    n: DAT_COUNT,
    iov: *mut DAT_LMR_TRIPLET,
    cookie: DAT_DTO_COOKIE,
    flags: DAT_COMPLETION_FLAGS,
) -> DAT_RETURN {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    guard(&calls::EP_POST_SEND, || unsafe {
        post_send_iov(ep_handle, n, iov, cookie, flags)
    })
}

/// dat_ep_post_send over either version's triplets.
pub(crate) unsafe fn post_send_iov<T: LocalTriplet>(
    ep_handle: DAT_EP_HANDLE,
    n: DAT_COUNT,
    iov: *const T,
    cookie: DAT_DTO_COOKIE,
    flags: DAT_COMPLETION_FLAGS,
) -> DatResult<()> {
    let ep = ep_held(ep_handle)?;
    let mut buf = IovBuf::new();
    // SAFETY: `iov` is NULL or points to as many readable triplets as the count says (the C
    // caller's contract).
    let iov = unsafe { buf.read(iov, n, ep.iov_limit(IovKind::Request)) }?;
    ep.post_send(iov, cookie.as_u64(), flags)
}

/// Without invalidation this is a plain send; remote invalidation of an
/// RMR is not offered by this provider.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn post_send_with_invalidate(
    ep_handle: DAT_EP_HANDLE,
    n: DAT_COUNT,
    iov: *mut DAT_LMR_TRIPLET,
    cookie: DAT_DTO_COOKIE,
    flags: DAT_COMPLETION_FLAGS,
    invalidate: DAT_BOOLEAN,
    rmr_context: DAT_RMR_CONTEXT,
) -> DAT_RETURN {
    guard(&calls::EP_POST_SEND_WITH_INVALIDATE, || {
        if invalidate == boolean(false) {
            // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
            return unsafe { post_send_iov(ep_handle, n, iov, cookie, flags) };
        }
        let ep = ep_held(ep_handle)?;
        let mut buf = IovBuf::new();
        // SAFETY: `iov` is NULL or points to as many readable triplets as the count says (the C
        // caller's contract).
        let iov = unsafe { buf.read(iov, n, ep.iov_limit(IovKind::Request)) }?;
        ep.post_send_with_invalidate(iov, cookie.as_u64(), flags, rmr_context)
    })
}

/// dat_ep_post_rdma_read_to_rmr: the sink is an RMR triplet of ours.
pub(crate) unsafe extern "C" fn post_rdma_read_to_rmr(
    ep_handle: DAT_EP_HANDLE,
    local: *const DAT_RMR_TRIPLET,
    cookie: DAT_DTO_COOKIE,
    remote: *const DAT_RMR_TRIPLET,
    flags: DAT_COMPLETION_FLAGS,
) -> DAT_RETURN {
    guard(&calls::EP_POST_RDMA_READ_TO_RMR, || {
        let ep = ep_held(ep_handle)?;
        // SAFETY: `local` is NULL or points to a readable struct (the C caller's contract).
        let local = unsafe { input(local, Param::LocalIov) }?;
        let local = RemoteBuffer {
            address: local.virtual_address,
            length: local.segment_length,
            rmr_context: local.rmr_context,
        };
        // SAFETY: `remote` is NULL or points to a readable struct (the C caller's contract).
        let remote = unsafe { input(remote, Param::RemoteIov) }?;
        let remote = RemoteBuffer {
            address: remote.virtual_address,
            length: remote.segment_length,
            rmr_context: remote.rmr_context,
        };
        ep.post_rdma_read_to_rmr(local, cookie.as_u64(), remote, flags)
    })
}

pub(crate) unsafe extern "C" fn post_recv(
    ep_handle: DAT_EP_HANDLE,
    n: DAT_COUNT,
    iov: *mut DAT_LMR_TRIPLET,
    cookie: DAT_DTO_COOKIE,
    flags: DAT_COMPLETION_FLAGS,
) -> DAT_RETURN {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    guard(&calls::EP_POST_RECV, || unsafe {
        post_recv_iov(ep_handle, n, iov, cookie, flags)
    })
}

/// dat_ep_post_recv over either version's triplets.
pub(crate) unsafe fn post_recv_iov<T: LocalTriplet>(
    ep_handle: DAT_EP_HANDLE,
    n: DAT_COUNT,
    iov: *const T,
    cookie: DAT_DTO_COOKIE,
    flags: DAT_COMPLETION_FLAGS,
) -> DatResult<()> {
    let ep = ep_held(ep_handle)?;
    let mut buf = IovBuf::new();
    // SAFETY: `iov` is NULL or points to as many readable triplets as the count says (the C
    // caller's contract).
    let iov = unsafe { buf.read(iov, n, ep.iov_limit(IovKind::Recv)) }?;
    ep.post_recv(iov, cookie.as_u64(), flags)
}

pub(crate) unsafe extern "C" fn post_rdma_read(
    ep_handle: DAT_EP_HANDLE,
    n: DAT_COUNT,
    iov: *mut DAT_LMR_TRIPLET,
    cookie: DAT_DTO_COOKIE,
    remote: *const DAT_RMR_TRIPLET,
    flags: DAT_COMPLETION_FLAGS,
) -> DAT_RETURN {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    guard(&calls::EP_POST_RDMA_READ, || unsafe {
        post_rdma_read_iov(ep_handle, n, iov, cookie, remote, flags)
    })
}

/// dat_ep_post_rdma_read over either version's triplets.
pub(crate) unsafe fn post_rdma_read_iov<T: LocalTriplet, R: RemoteTriplet>(
    ep_handle: DAT_EP_HANDLE,
    n: DAT_COUNT,
    iov: *const T,
    cookie: DAT_DTO_COOKIE,
    remote: *const R,
    flags: DAT_COMPLETION_FLAGS,
) -> DatResult<()> {
    let ep = ep_held(ep_handle)?;
    let mut buf = IovBuf::new();
    // SAFETY: `iov` is NULL or points to as many readable triplets as the count says (the C
    // caller's contract).
    let iov = unsafe { buf.read(iov, n, ep.iov_limit(IovKind::RdmaRead)) }?;
    // SAFETY: `remote` is NULL or points to a readable triplet (the C caller's contract).
    ep.post_rdma_read(
        iov,
        cookie.as_u64(),
        unsafe { remote_buffer(remote) }?,
        flags,
    )
}

pub(crate) unsafe extern "C" fn post_rdma_write(
    ep_handle: DAT_EP_HANDLE,
    n: DAT_COUNT,
    iov: *mut DAT_LMR_TRIPLET,
    cookie: DAT_DTO_COOKIE,
    remote: *const DAT_RMR_TRIPLET,
    flags: DAT_COMPLETION_FLAGS,
) -> DAT_RETURN {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    guard(&calls::EP_POST_RDMA_WRITE, || unsafe {
        post_rdma_write_iov(ep_handle, n, iov, cookie, remote, flags)
    })
}

/// dat_ep_post_rdma_write over either version's triplets.
pub(crate) unsafe fn post_rdma_write_iov<T: LocalTriplet, R: RemoteTriplet>(
    ep_handle: DAT_EP_HANDLE,
    n: DAT_COUNT,
    iov: *const T,
    cookie: DAT_DTO_COOKIE,
    remote: *const R,
    flags: DAT_COMPLETION_FLAGS,
) -> DatResult<()> {
    let ep = ep_held(ep_handle)?;
    let mut buf = IovBuf::new();
    // SAFETY: `iov` is NULL or points to as many readable triplets as the count says (the C
    // caller's contract).
    let iov = unsafe { buf.read(iov, n, ep.iov_limit(IovKind::RdmaWrite)) }?;
    // SAFETY: `remote` is NULL or points to a readable triplet (the C caller's contract).
    ep.post_rdma_write(
        iov,
        cookie.as_u64(),
        unsafe { remote_buffer(remote) }?,
        flags,
    )
}

pub(crate) unsafe extern "C" fn get_status(
    ep_handle: DAT_EP_HANDLE,
    state: *mut DAT_EP_STATE,
    recv_idle: *mut DAT_BOOLEAN,
    request_idle: *mut DAT_BOOLEAN,
) -> DAT_RETURN {
    guard(&calls::EP_GET_STATUS, || {
        let ep = ep(ep_handle)?;
        let (s, recv, request) = ep.get_status();
        // Each output is optional, as in OFED's provider (dtestx asks for the idle flags
        // only).
        // SAFETY: `state` is NULL or points to a writable value of its type (the C caller's
        // contract).
        if let Some(st) = unsafe { state.as_mut() } {
            *st = s as DAT_EP_STATE;
        }
        // SAFETY: `recv_idle` is NULL or points to a writable value of its type (the C caller's
        // contract).
        if let Some(r) = unsafe { recv_idle.as_mut() } {
            *r = boolean(recv);
        }
        // SAFETY: `request_idle` is NULL or points to a writable value of its type (the C caller's
        // contract).
        if let Some(r) = unsafe { request_idle.as_mut() } {
            *r = boolean(request);
        }
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn free(ep_handle: DAT_EP_HANDLE) -> DAT_RETURN {
    guard(&calls::EP_FREE, || ep(ep_handle)?.free())
}

pub(crate) unsafe extern "C" fn reset(ep_handle: DAT_EP_HANDLE) -> DAT_RETURN {
    guard(&calls::EP_RESET, || ep(ep_handle)?.reset())
}

pub(crate) unsafe extern "C" fn recv_query(
    ep_handle: DAT_EP_HANDLE,
    nbufs: *mut DAT_COUNT,
    span: *mut DAT_COUNT,
) -> DAT_RETURN {
    guard(&calls::EP_RECV_QUERY, || {
        let ep = ep(ep_handle)?;
        let (n, s) = ep.recv_query()?;
        // SAFETY: `nbufs` is NULL or points to a writable value of its type (the C caller's
        // contract).
        if let Some(v) = unsafe { nbufs.as_mut() } {
            *v = n;
        }
        // SAFETY: `span` is NULL or points to a writable value of its type (the C caller's
        // contract).
        if let Some(v) = unsafe { span.as_mut() } {
            *v = s;
        }
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn set_watermark(
    ep_handle: DAT_EP_HANDLE,
    soft: DAT_COUNT,
    hard: DAT_COUNT,
) -> DAT_RETURN {
    guard(&calls::EP_SET_WATERMARK, || {
        ep(ep_handle)?.set_watermark(soft, hard)
    })
}
