//! The DAT 2.0 C API of libdat2, one function an entry point.
//!
//! Every function here is the same three steps, kept visible rather than
//! hidden in a macro so that cbindgen sees each prototype: check the
//! handle (the exact code OFED's libdat2 returns for NULL, and for any
//! handle that is not a live object of a registered provider), map IA
//! handles to the provider's own, and call the provider's slot. The
//! registry calls (open, close, add/remove/list providers, strerror) live
//! at the end.

// Each export's safety contract is the DAT specification of that call:
// the pointers it takes are valid as the DAT 2.0 API describes them.
#![allow(clippy::missing_safety_doc)]

use crate::dispatch::{any_handle, provider_of};
use crate::registry::{self, ProviderKey, ProviderPtr};
use crate::{ffi_guard, init_logging, LIBRARY};
use dat_abi::*;
use std::ffi::{c_char, CStr};

/// The provider's function in `slot`, or DAT_NOT_IMPLEMENTED from the
/// enclosing closure when the provider left the slot empty.
macro_rules! slot {
    ($p:expr, $slot:ident) => {
        match $p.$slot {
            Some(f) => f,
            None => return dat_error(DAT_NOT_IMPLEMENTED, DAT_NO_SUBTYPE),
        }
    };
}

/// Calls `f` with the provider of object handle `h`, or returns
/// DAT_INVALID_HANDLE with subtype `sub`.
#[inline]
unsafe fn on_object(
    h: DAT_HANDLE,
    sub: DAT_RETURN_SUBTYPE,
    f: impl FnOnce(&DAT_PROVIDER) -> DAT_RETURN,
) -> DAT_RETURN {
    ffi_guard(|| match provider_of(h) {
        Some(p) => f(p),
        None => dat_error(DAT_INVALID_HANDLE, sub),
    })
}

/// Calls `f` with the provider's IA handle and table for consumer IA handle
/// `ia`, or returns DAT_INVALID_HANDLE | DAT_INVALID_HANDLE_IA.
#[inline]
unsafe fn on_ia(
    ia: DAT_IA_HANDLE,
    f: impl FnOnce(DAT_IA_HANDLE, &DAT_PROVIDER) -> DAT_RETURN,
) -> DAT_RETURN {
    ffi_guard(|| match registry::lookup_ia(ia) {
        Some(open) => f(open.provider_ia, open.provider.table()),
        None => dat_error(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_IA),
    })
}

/// Calls `f` for a handle of any type (IA handles mapped), or returns
/// DAT_INVALID_HANDLE | DAT_INVALID_HANDLE1.
#[inline]
unsafe fn on_any(
    h: DAT_HANDLE,
    f: impl FnOnce(DAT_HANDLE, &DAT_PROVIDER) -> DAT_RETURN,
) -> DAT_RETURN {
    ffi_guard(|| match any_handle(h) {
        Some((h, p)) => f(h, p),
        None => dat_error(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE1),
    })
}

// ------------------------------------------------------------ IA

#[no_mangle]
pub unsafe extern "C" fn dat_ia_query(
    ia_handle: DAT_IA_HANDLE,
    async_evd_handle: *mut DAT_EVD_HANDLE,
    ia_attr_mask: DAT_IA_ATTR_MASK,
    ia_attr: *mut DAT_IA_ATTR,
    provider_attr_mask: DAT_PROVIDER_ATTR_MASK,
    provider_attr: *mut DAT_PROVIDER_ATTR,
) -> DAT_RETURN {
    on_ia(ia_handle, |ia, p| {
        slot!(p, ia_query_func)(
            ia,
            async_evd_handle,
            ia_attr_mask,
            ia_attr,
            provider_attr_mask,
            provider_attr,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_set_consumer_context(
    handle: DAT_HANDLE,
    context: DAT_CONTEXT,
) -> DAT_RETURN {
    on_any(handle, |h, p| {
        slot!(p, set_consumer_context_func)(h, context)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_get_consumer_context(
    handle: DAT_HANDLE,
    context: *mut DAT_CONTEXT,
) -> DAT_RETURN {
    on_any(handle, |h, p| {
        slot!(p, get_consumer_context_func)(h, context)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_get_handle_type(
    handle: DAT_HANDLE,
    handle_type: *mut DAT_HANDLE_TYPE,
) -> DAT_RETURN {
    on_any(handle, |h, p| {
        slot!(p, get_handle_type_func)(h, handle_type)
    })
}

// ------------------------------------------------------------ CNO

#[no_mangle]
pub unsafe extern "C" fn dat_cno_create(
    ia_handle: DAT_IA_HANDLE,
    agent: DAT_OS_WAIT_PROXY_AGENT,
    cno_handle: *mut DAT_CNO_HANDLE,
) -> DAT_RETURN {
    on_ia(ia_handle, |ia, p| {
        slot!(p, cno_create_func)(ia, agent, cno_handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_cno_modify_agent(
    cno_handle: DAT_CNO_HANDLE,
    agent: DAT_OS_WAIT_PROXY_AGENT,
) -> DAT_RETURN {
    on_object(cno_handle, DAT_INVALID_HANDLE_CNO, |p| {
        slot!(p, cno_modify_agent_func)(cno_handle, agent)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_cno_query(
    cno_handle: DAT_CNO_HANDLE,
    cno_param_mask: DAT_CNO_PARAM_MASK,
    cno_param: *mut DAT_CNO_PARAM,
) -> DAT_RETURN {
    on_object(cno_handle, DAT_INVALID_HANDLE_CNO, |p| {
        slot!(p, cno_query_func)(cno_handle, cno_param_mask, cno_param)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_cno_free(cno_handle: DAT_CNO_HANDLE) -> DAT_RETURN {
    on_object(cno_handle, DAT_INVALID_HANDLE_CNO, |p| {
        slot!(p, cno_free_func)(cno_handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_cno_wait(
    cno_handle: DAT_CNO_HANDLE,
    timeout: DAT_TIMEOUT,
    evd_handle: *mut DAT_EVD_HANDLE,
) -> DAT_RETURN {
    on_object(cno_handle, DAT_INVALID_HANDLE_CNO, |p| {
        slot!(p, cno_wait_func)(cno_handle, timeout, evd_handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_cno_fd_create(
    ia_handle: DAT_IA_HANDLE,
    fd: *mut DAT_FD,
    cno_handle: *mut DAT_CNO_HANDLE,
) -> DAT_RETURN {
    on_ia(ia_handle, |ia, p| {
        slot!(p, cno_fd_create_func)(ia, fd, cno_handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_cno_trigger(
    cno_handle: DAT_CNO_HANDLE,
    evd_handle: *mut DAT_EVD_HANDLE,
) -> DAT_RETURN {
    on_object(cno_handle, DAT_INVALID_HANDLE_CNO, |p| {
        slot!(p, cno_trigger_func)(cno_handle, evd_handle)
    })
}

// ------------------------------------------------------------ CR

#[no_mangle]
pub unsafe extern "C" fn dat_cr_query(
    cr_handle: DAT_CR_HANDLE,
    cr_param_mask: DAT_CR_PARAM_MASK,
    cr_param: *mut DAT_CR_PARAM,
) -> DAT_RETURN {
    on_object(cr_handle, DAT_INVALID_HANDLE_CR, |p| {
        slot!(p, cr_query_func)(cr_handle, cr_param_mask, cr_param)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_cr_accept(
    cr_handle: DAT_CR_HANDLE,
    ep_handle: DAT_EP_HANDLE,
    private_data_size: DAT_COUNT,
    private_data: DAT_PVOID,
) -> DAT_RETURN {
    on_object(cr_handle, DAT_INVALID_HANDLE_CR, |p| {
        slot!(p, cr_accept_func)(cr_handle, ep_handle, private_data_size, private_data)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_cr_reject(
    cr_handle: DAT_CR_HANDLE,
    private_data_size: DAT_COUNT,
    private_data: DAT_PVOID,
) -> DAT_RETURN {
    on_object(cr_handle, DAT_INVALID_HANDLE_CR, |p| {
        slot!(p, cr_reject_func)(cr_handle, private_data_size, private_data)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_cr_handoff(
    cr_handle: DAT_CR_HANDLE,
    handoff: DAT_CONN_QUAL,
) -> DAT_RETURN {
    on_object(cr_handle, DAT_INVALID_HANDLE_CR, |p| {
        slot!(p, cr_handoff_func)(cr_handle, handoff)
    })
}

// ------------------------------------------------------------ EVD

#[no_mangle]
pub unsafe extern "C" fn dat_evd_create(
    ia_handle: DAT_IA_HANDLE,
    evd_min_qlen: DAT_COUNT,
    cno_handle: DAT_CNO_HANDLE,
    evd_flags: DAT_EVD_FLAGS,
    evd_handle: *mut DAT_EVD_HANDLE,
) -> DAT_RETURN {
    on_ia(ia_handle, |ia, p| {
        slot!(p, evd_create_func)(ia, evd_min_qlen, cno_handle, evd_flags, evd_handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_evd_query(
    evd_handle: DAT_EVD_HANDLE,
    evd_param_mask: DAT_EVD_PARAM_MASK,
    evd_param: *mut DAT_EVD_PARAM,
) -> DAT_RETURN {
    on_object(evd_handle, DAT_INVALID_HANDLE_EVD_REQUEST, |p| {
        slot!(p, evd_query_func)(evd_handle, evd_param_mask, evd_param)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_evd_modify_cno(
    evd_handle: DAT_EVD_HANDLE,
    cno_handle: DAT_CNO_HANDLE,
) -> DAT_RETURN {
    on_object(evd_handle, DAT_INVALID_HANDLE_EVD_REQUEST, |p| {
        slot!(p, evd_modify_cno_func)(evd_handle, cno_handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_evd_enable(evd_handle: DAT_EVD_HANDLE) -> DAT_RETURN {
    on_object(evd_handle, DAT_INVALID_HANDLE_EVD_REQUEST, |p| {
        slot!(p, evd_enable_func)(evd_handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_evd_disable(evd_handle: DAT_EVD_HANDLE) -> DAT_RETURN {
    on_object(evd_handle, DAT_INVALID_HANDLE_EVD_REQUEST, |p| {
        slot!(p, evd_disable_func)(evd_handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_evd_wait(
    evd_handle: DAT_EVD_HANDLE,
    timeout: DAT_TIMEOUT,
    threshold: DAT_COUNT,
    event: *mut DAT_EVENT,
    nmore: *mut DAT_COUNT,
) -> DAT_RETURN {
    on_object(evd_handle, DAT_INVALID_HANDLE_EVD_REQUEST, |p| {
        slot!(p, evd_wait_func)(evd_handle, timeout, threshold, event, nmore)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_evd_resize(
    evd_handle: DAT_EVD_HANDLE,
    evd_qlen: DAT_COUNT,
) -> DAT_RETURN {
    on_object(evd_handle, DAT_INVALID_HANDLE_EVD_REQUEST, |p| {
        slot!(p, evd_resize_func)(evd_handle, evd_qlen)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_evd_post_se(
    evd_handle: DAT_EVD_HANDLE,
    event: *const DAT_EVENT,
) -> DAT_RETURN {
    on_object(evd_handle, DAT_INVALID_HANDLE_EVD_REQUEST, |p| {
        slot!(p, evd_post_se_func)(evd_handle, event)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_evd_dequeue(
    evd_handle: DAT_EVD_HANDLE,
    event: *mut DAT_EVENT,
) -> DAT_RETURN {
    on_object(evd_handle, DAT_INVALID_HANDLE_EVD_REQUEST, |p| {
        slot!(p, evd_dequeue_func)(evd_handle, event)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_evd_free(evd_handle: DAT_EVD_HANDLE) -> DAT_RETURN {
    on_object(evd_handle, DAT_INVALID_HANDLE_EVD_REQUEST, |p| {
        slot!(p, evd_free_func)(evd_handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_evd_set_unwaitable(evd_handle: DAT_EVD_HANDLE) -> DAT_RETURN {
    on_object(evd_handle, DAT_INVALID_HANDLE_EVD_REQUEST, |p| {
        slot!(p, evd_set_unwaitable_func)(evd_handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_evd_clear_unwaitable(evd_handle: DAT_EVD_HANDLE) -> DAT_RETURN {
    on_object(evd_handle, DAT_INVALID_HANDLE_EVD_REQUEST, |p| {
        slot!(p, evd_clear_unwaitable_func)(evd_handle)
    })
}

// ------------------------------------------------------------ EP

#[no_mangle]
pub unsafe extern "C" fn dat_ep_create(
    ia_handle: DAT_IA_HANDLE,
    pz_handle: DAT_PZ_HANDLE,
    recv_evd_handle: DAT_EVD_HANDLE,
    request_evd_handle: DAT_EVD_HANDLE,
    connect_evd_handle: DAT_EVD_HANDLE,
    ep_attributes: *const DAT_EP_ATTR,
    ep_handle: *mut DAT_EP_HANDLE,
) -> DAT_RETURN {
    on_ia(ia_handle, |ia, p| {
        slot!(p, ep_create_func)(
            ia,
            pz_handle,
            recv_evd_handle,
            request_evd_handle,
            connect_evd_handle,
            ep_attributes,
            ep_handle,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_create_with_srq(
    ia_handle: DAT_IA_HANDLE,
    pz_handle: DAT_PZ_HANDLE,
    recv_evd_handle: DAT_EVD_HANDLE,
    request_evd_handle: DAT_EVD_HANDLE,
    connect_evd_handle: DAT_EVD_HANDLE,
    srq_handle: DAT_SRQ_HANDLE,
    ep_attributes: *const DAT_EP_ATTR,
    ep_handle: *mut DAT_EP_HANDLE,
) -> DAT_RETURN {
    on_ia(ia_handle, |ia, p| {
        slot!(p, ep_create_with_srq_func)(
            ia,
            pz_handle,
            recv_evd_handle,
            request_evd_handle,
            connect_evd_handle,
            srq_handle,
            ep_attributes,
            ep_handle,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_query(
    ep_handle: DAT_EP_HANDLE,
    ep_param_mask: DAT_EP_PARAM_MASK,
    ep_param: *mut DAT_EP_PARAM,
) -> DAT_RETURN {
    on_object(ep_handle, DAT_INVALID_HANDLE_EP, |p| {
        slot!(p, ep_query_func)(ep_handle, ep_param_mask, ep_param)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_modify(
    ep_handle: DAT_EP_HANDLE,
    ep_param_mask: DAT_EP_PARAM_MASK,
    ep_param: *const DAT_EP_PARAM,
) -> DAT_RETURN {
    on_object(ep_handle, DAT_INVALID_HANDLE_EP, |p| {
        slot!(p, ep_modify_func)(ep_handle, ep_param_mask, ep_param)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_connect(
    ep_handle: DAT_EP_HANDLE,
    remote_ia_address: DAT_IA_ADDRESS_PTR,
    remote_conn_qual: DAT_CONN_QUAL,
    timeout: DAT_TIMEOUT,
    private_data_size: DAT_COUNT,
    private_data: DAT_PVOID,
    qos: DAT_QOS,
    connect_flags: DAT_CONNECT_FLAGS,
) -> DAT_RETURN {
    on_object(ep_handle, DAT_INVALID_HANDLE_EP, |p| {
        slot!(p, ep_connect_func)(
            ep_handle,
            remote_ia_address,
            remote_conn_qual,
            timeout,
            private_data_size,
            private_data,
            qos,
            connect_flags,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_common_connect(
    ep_handle: DAT_EP_HANDLE,
    remote_ia_address: DAT_IA_ADDRESS_PTR,
    timeout: DAT_TIMEOUT,
    private_data_size: DAT_COUNT,
    private_data: DAT_PVOID,
) -> DAT_RETURN {
    on_object(ep_handle, DAT_INVALID_HANDLE_EP, |p| {
        slot!(p, ep_common_connect_func)(
            ep_handle,
            remote_ia_address,
            timeout,
            private_data_size,
            private_data,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_dup_connect(
    ep_handle: DAT_EP_HANDLE,
    ep_dup_handle: DAT_EP_HANDLE,
    timeout: DAT_TIMEOUT,
    private_data_size: DAT_COUNT,
    private_data: DAT_PVOID,
    qos: DAT_QOS,
) -> DAT_RETURN {
    on_object(ep_handle, DAT_INVALID_HANDLE_EP, |p| {
        slot!(p, ep_dup_connect_func)(
            ep_handle,
            ep_dup_handle,
            timeout,
            private_data_size,
            private_data,
            qos,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_disconnect(
    ep_handle: DAT_EP_HANDLE,
    close_flags: DAT_CLOSE_FLAGS,
) -> DAT_RETURN {
    on_object(ep_handle, DAT_INVALID_HANDLE_EP, |p| {
        slot!(p, ep_disconnect_func)(ep_handle, close_flags)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_post_send(
    ep_handle: DAT_EP_HANDLE,
    num_segments: DAT_COUNT,
    local_iov: *mut DAT_LMR_TRIPLET,
    user_cookie: DAT_DTO_COOKIE,
    completion_flags: DAT_COMPLETION_FLAGS,
) -> DAT_RETURN {
    on_object(ep_handle, DAT_INVALID_HANDLE_EP, |p| {
        slot!(p, ep_post_send_func)(
            ep_handle,
            num_segments,
            local_iov,
            user_cookie,
            completion_flags,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_post_send_with_invalidate(
    ep_handle: DAT_EP_HANDLE,
    num_segments: DAT_COUNT,
    local_iov: *mut DAT_LMR_TRIPLET,
    user_cookie: DAT_DTO_COOKIE,
    completion_flags: DAT_COMPLETION_FLAGS,
    invalidate_flag: DAT_BOOLEAN,
    rmr_context: DAT_RMR_CONTEXT,
) -> DAT_RETURN {
    on_object(ep_handle, DAT_INVALID_HANDLE_EP, |p| {
        slot!(p, ep_post_send_with_invalidate_func)(
            ep_handle,
            num_segments,
            local_iov,
            user_cookie,
            completion_flags,
            invalidate_flag,
            rmr_context,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_post_recv(
    ep_handle: DAT_EP_HANDLE,
    num_segments: DAT_COUNT,
    local_iov: *mut DAT_LMR_TRIPLET,
    user_cookie: DAT_DTO_COOKIE,
    completion_flags: DAT_COMPLETION_FLAGS,
) -> DAT_RETURN {
    on_object(ep_handle, DAT_INVALID_HANDLE_EP, |p| {
        slot!(p, ep_post_recv_func)(
            ep_handle,
            num_segments,
            local_iov,
            user_cookie,
            completion_flags,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_post_rdma_read(
    ep_handle: DAT_EP_HANDLE,
    num_segments: DAT_COUNT,
    local_iov: *mut DAT_LMR_TRIPLET,
    user_cookie: DAT_DTO_COOKIE,
    remote_iov: *const DAT_RMR_TRIPLET,
    completion_flags: DAT_COMPLETION_FLAGS,
) -> DAT_RETURN {
    on_object(ep_handle, DAT_INVALID_HANDLE_EP, |p| {
        slot!(p, ep_post_rdma_read_func)(
            ep_handle,
            num_segments,
            local_iov,
            user_cookie,
            remote_iov,
            completion_flags,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_post_rdma_read_to_rmr(
    ep_handle: DAT_EP_HANDLE,
    local_iov: *const DAT_RMR_TRIPLET,
    user_cookie: DAT_DTO_COOKIE,
    remote_iov: *const DAT_RMR_TRIPLET,
    completion_flags: DAT_COMPLETION_FLAGS,
) -> DAT_RETURN {
    on_object(ep_handle, DAT_INVALID_HANDLE_EP, |p| {
        slot!(p, ep_post_rdma_read_to_rmr_func)(
            ep_handle,
            local_iov,
            user_cookie,
            remote_iov,
            completion_flags,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_post_rdma_write(
    ep_handle: DAT_EP_HANDLE,
    num_segments: DAT_COUNT,
    local_iov: *mut DAT_LMR_TRIPLET,
    user_cookie: DAT_DTO_COOKIE,
    remote_iov: *const DAT_RMR_TRIPLET,
    completion_flags: DAT_COMPLETION_FLAGS,
) -> DAT_RETURN {
    on_object(ep_handle, DAT_INVALID_HANDLE_EP, |p| {
        slot!(p, ep_post_rdma_write_func)(
            ep_handle,
            num_segments,
            local_iov,
            user_cookie,
            remote_iov,
            completion_flags,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_get_status(
    ep_handle: DAT_EP_HANDLE,
    ep_state: *mut DAT_EP_STATE,
    recv_idle: *mut DAT_BOOLEAN,
    request_idle: *mut DAT_BOOLEAN,
) -> DAT_RETURN {
    on_object(ep_handle, DAT_INVALID_HANDLE_EP, |p| {
        slot!(p, ep_get_status_func)(ep_handle, ep_state, recv_idle, request_idle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_free(ep_handle: DAT_EP_HANDLE) -> DAT_RETURN {
    on_object(ep_handle, DAT_INVALID_HANDLE_EP, |p| {
        slot!(p, ep_free_func)(ep_handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_reset(ep_handle: DAT_EP_HANDLE) -> DAT_RETURN {
    on_object(ep_handle, DAT_INVALID_HANDLE_EP, |p| {
        slot!(p, ep_reset_func)(ep_handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_recv_query(
    ep_handle: DAT_EP_HANDLE,
    nbufs_allocated: *mut DAT_COUNT,
    bufs_alloc_span: *mut DAT_COUNT,
) -> DAT_RETURN {
    on_object(ep_handle, DAT_INVALID_HANDLE_EP, |p| {
        slot!(p, ep_recv_query_func)(ep_handle, nbufs_allocated, bufs_alloc_span)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_set_watermark(
    ep_handle: DAT_EP_HANDLE,
    soft_high_watermark: DAT_COUNT,
    hard_high_watermark: DAT_COUNT,
) -> DAT_RETURN {
    on_object(ep_handle, DAT_INVALID_HANDLE_EP, |p| {
        slot!(p, ep_set_watermark_func)(ep_handle, soft_high_watermark, hard_high_watermark)
    })
}

// ------------------------------------------------------------ LMR

#[no_mangle]
pub unsafe extern "C" fn dat_lmr_create(
    ia_handle: DAT_IA_HANDLE,
    mem_type: DAT_MEM_TYPE,
    region_description: DAT_REGION_DESCRIPTION,
    length: DAT_VLEN,
    pz_handle: DAT_PZ_HANDLE,
    privileges: DAT_MEM_PRIV_FLAGS,
    va_type: DAT_VA_TYPE,
    lmr_handle: *mut DAT_LMR_HANDLE,
    lmr_context: *mut DAT_LMR_CONTEXT,
    rmr_context: *mut DAT_RMR_CONTEXT,
    registered_length: *mut DAT_VLEN,
    registered_address: *mut DAT_VADDR,
) -> DAT_RETURN {
    on_ia(ia_handle, |ia, p| {
        slot!(p, lmr_create_func)(
            ia,
            mem_type,
            region_description,
            length,
            pz_handle,
            privileges,
            va_type,
            lmr_handle,
            lmr_context,
            rmr_context,
            registered_length,
            registered_address,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_lmr_query(
    lmr_handle: DAT_LMR_HANDLE,
    lmr_param_mask: DAT_LMR_PARAM_MASK,
    lmr_param: *mut DAT_LMR_PARAM,
) -> DAT_RETURN {
    on_object(lmr_handle, DAT_INVALID_HANDLE_LMR, |p| {
        slot!(p, lmr_query_func)(lmr_handle, lmr_param_mask, lmr_param)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_lmr_free(lmr_handle: DAT_LMR_HANDLE) -> DAT_RETURN {
    on_object(lmr_handle, DAT_INVALID_HANDLE_LMR, |p| {
        slot!(p, lmr_free_func)(lmr_handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_lmr_sync_rdma_read(
    ia_handle: DAT_IA_HANDLE,
    local_segments: *const DAT_LMR_TRIPLET,
    num_segments: DAT_VLEN,
) -> DAT_RETURN {
    on_ia(ia_handle, |ia, p| {
        slot!(p, lmr_sync_rdma_read_func)(ia, local_segments, num_segments)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_lmr_sync_rdma_write(
    ia_handle: DAT_IA_HANDLE,
    local_segments: *const DAT_LMR_TRIPLET,
    num_segments: DAT_VLEN,
) -> DAT_RETURN {
    on_ia(ia_handle, |ia, p| {
        slot!(p, lmr_sync_rdma_write_func)(ia, local_segments, num_segments)
    })
}

// ------------------------------------------------------------ RMR

#[no_mangle]
pub unsafe extern "C" fn dat_rmr_create(
    pz_handle: DAT_PZ_HANDLE,
    rmr_handle: *mut DAT_RMR_HANDLE,
) -> DAT_RETURN {
    on_object(pz_handle, DAT_INVALID_HANDLE_PZ, |p| {
        slot!(p, rmr_create_func)(pz_handle, rmr_handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_rmr_create_for_ep(
    pz_handle: DAT_PZ_HANDLE,
    rmr_handle: *mut DAT_RMR_HANDLE,
) -> DAT_RETURN {
    on_object(pz_handle, DAT_INVALID_HANDLE_PZ, |p| {
        slot!(p, rmr_create_for_ep_func)(pz_handle, rmr_handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_rmr_query(
    rmr_handle: DAT_RMR_HANDLE,
    rmr_param_mask: DAT_RMR_PARAM_MASK,
    rmr_param: *mut DAT_RMR_PARAM,
) -> DAT_RETURN {
    on_object(rmr_handle, DAT_INVALID_HANDLE_RMR, |p| {
        slot!(p, rmr_query_func)(rmr_handle, rmr_param_mask, rmr_param)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_rmr_bind(
    rmr_handle: DAT_RMR_HANDLE,
    lmr_handle: DAT_LMR_HANDLE,
    lmr_triplet: *const DAT_LMR_TRIPLET,
    mem_priv: DAT_MEM_PRIV_FLAGS,
    va_type: DAT_VA_TYPE,
    ep_handle: DAT_EP_HANDLE,
    user_cookie: DAT_RMR_COOKIE,
    completion_flags: DAT_COMPLETION_FLAGS,
    rmr_context: *mut DAT_RMR_CONTEXT,
) -> DAT_RETURN {
    on_object(rmr_handle, DAT_INVALID_HANDLE_RMR, |p| {
        slot!(p, rmr_bind_func)(
            rmr_handle,
            lmr_handle,
            lmr_triplet,
            mem_priv,
            va_type,
            ep_handle,
            user_cookie,
            completion_flags,
            rmr_context,
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_rmr_free(rmr_handle: DAT_RMR_HANDLE) -> DAT_RETURN {
    on_object(rmr_handle, DAT_INVALID_HANDLE_RMR, |p| {
        slot!(p, rmr_free_func)(rmr_handle)
    })
}

// ------------------------------------------------------------ PSP

#[no_mangle]
pub unsafe extern "C" fn dat_psp_create(
    ia_handle: DAT_IA_HANDLE,
    conn_qual: DAT_CONN_QUAL,
    evd_handle: DAT_EVD_HANDLE,
    psp_flags: DAT_PSP_FLAGS,
    psp_handle: *mut DAT_PSP_HANDLE,
) -> DAT_RETURN {
    on_ia(ia_handle, |ia, p| {
        slot!(p, psp_create_func)(ia, conn_qual, evd_handle, psp_flags, psp_handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_psp_create_any(
    ia_handle: DAT_IA_HANDLE,
    conn_qual: *mut DAT_CONN_QUAL,
    evd_handle: DAT_EVD_HANDLE,
    psp_flags: DAT_PSP_FLAGS,
    psp_handle: *mut DAT_PSP_HANDLE,
) -> DAT_RETURN {
    on_ia(ia_handle, |ia, p| {
        slot!(p, psp_create_any_func)(ia, conn_qual, evd_handle, psp_flags, psp_handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_psp_query(
    psp_handle: DAT_PSP_HANDLE,
    psp_param_mask: DAT_PSP_PARAM_MASK,
    psp_param: *mut DAT_PSP_PARAM,
) -> DAT_RETURN {
    on_object(psp_handle, DAT_INVALID_HANDLE_PSP, |p| {
        slot!(p, psp_query_func)(psp_handle, psp_param_mask, psp_param)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_psp_free(psp_handle: DAT_PSP_HANDLE) -> DAT_RETURN {
    on_object(psp_handle, DAT_INVALID_HANDLE_PSP, |p| {
        slot!(p, psp_free_func)(psp_handle)
    })
}

// ------------------------------------------------------------ RSP

#[no_mangle]
pub unsafe extern "C" fn dat_rsp_create(
    ia_handle: DAT_IA_HANDLE,
    conn_qual: DAT_CONN_QUAL,
    ep_handle: DAT_EP_HANDLE,
    evd_handle: DAT_EVD_HANDLE,
    rsp_handle: *mut DAT_RSP_HANDLE,
) -> DAT_RETURN {
    on_ia(ia_handle, |ia, p| {
        slot!(p, rsp_create_func)(ia, conn_qual, ep_handle, evd_handle, rsp_handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_rsp_query(
    rsp_handle: DAT_RSP_HANDLE,
    rsp_param_mask: DAT_RSP_PARAM_MASK,
    rsp_param: *mut DAT_RSP_PARAM,
) -> DAT_RETURN {
    on_object(rsp_handle, DAT_INVALID_HANDLE_RSP, |p| {
        slot!(p, rsp_query_func)(rsp_handle, rsp_param_mask, rsp_param)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_rsp_free(rsp_handle: DAT_RSP_HANDLE) -> DAT_RETURN {
    on_object(rsp_handle, DAT_INVALID_HANDLE_RSP, |p| {
        slot!(p, rsp_free_func)(rsp_handle)
    })
}

// ------------------------------------------------------------ CSP

#[no_mangle]
pub unsafe extern "C" fn dat_csp_create(
    ia_handle: DAT_IA_HANDLE,
    comm: *mut DAT_COMM,
    address: DAT_IA_ADDRESS_PTR,
    evd_handle: DAT_EVD_HANDLE,
    csp_handle: *mut DAT_CSP_HANDLE,
) -> DAT_RETURN {
    on_ia(ia_handle, |ia, p| {
        slot!(p, csp_create_func)(ia, comm, address, evd_handle, csp_handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_csp_query(
    csp_handle: DAT_CSP_HANDLE,
    csp_param_mask: DAT_CSP_PARAM_MASK,
    csp_param: *mut DAT_CSP_PARAM,
) -> DAT_RETURN {
    on_object(csp_handle, DAT_INVALID_HANDLE_CSP, |p| {
        slot!(p, csp_query_func)(csp_handle, csp_param_mask, csp_param)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_csp_free(csp_handle: DAT_CSP_HANDLE) -> DAT_RETURN {
    on_object(csp_handle, DAT_INVALID_HANDLE_CSP, |p| {
        slot!(p, csp_free_func)(csp_handle)
    })
}

// ------------------------------------------------------------ PZ

#[no_mangle]
pub unsafe extern "C" fn dat_pz_create(
    ia_handle: DAT_IA_HANDLE,
    pz_handle: *mut DAT_PZ_HANDLE,
) -> DAT_RETURN {
    on_ia(ia_handle, |ia, p| slot!(p, pz_create_func)(ia, pz_handle))
}

#[no_mangle]
pub unsafe extern "C" fn dat_pz_query(
    pz_handle: DAT_PZ_HANDLE,
    pz_param_mask: DAT_PZ_PARAM_MASK,
    pz_param: *mut DAT_PZ_PARAM,
) -> DAT_RETURN {
    on_object(pz_handle, DAT_INVALID_HANDLE_PZ, |p| {
        slot!(p, pz_query_func)(pz_handle, pz_param_mask, pz_param)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_pz_free(pz_handle: DAT_PZ_HANDLE) -> DAT_RETURN {
    on_object(pz_handle, DAT_INVALID_HANDLE_PZ, |p| {
        slot!(p, pz_free_func)(pz_handle)
    })
}

// ------------------------------------------------------------ SRQ

#[no_mangle]
pub unsafe extern "C" fn dat_srq_create(
    ia_handle: DAT_IA_HANDLE,
    pz_handle: DAT_PZ_HANDLE,
    srq_attr: *mut DAT_SRQ_ATTR,
    srq_handle: *mut DAT_SRQ_HANDLE,
) -> DAT_RETURN {
    on_ia(ia_handle, |ia, p| {
        slot!(p, srq_create_func)(ia, pz_handle, srq_attr, srq_handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_srq_free(srq_handle: DAT_SRQ_HANDLE) -> DAT_RETURN {
    on_object(srq_handle, DAT_INVALID_HANDLE_SRQ, |p| {
        slot!(p, srq_free_func)(srq_handle)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_srq_post_recv(
    srq_handle: DAT_SRQ_HANDLE,
    num_segments: DAT_COUNT,
    local_iov: *mut DAT_LMR_TRIPLET,
    user_cookie: DAT_DTO_COOKIE,
) -> DAT_RETURN {
    on_object(srq_handle, DAT_INVALID_HANDLE_SRQ, |p| {
        slot!(p, srq_post_recv_func)(srq_handle, num_segments, local_iov, user_cookie)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_srq_query(
    srq_handle: DAT_SRQ_HANDLE,
    srq_param_mask: DAT_SRQ_PARAM_MASK,
    srq_param: *mut DAT_SRQ_PARAM,
) -> DAT_RETURN {
    on_object(srq_handle, DAT_INVALID_HANDLE_SRQ, |p| {
        slot!(p, srq_query_func)(srq_handle, srq_param_mask, srq_param)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_srq_resize(
    srq_handle: DAT_SRQ_HANDLE,
    srq_max_recv_dto: DAT_COUNT,
) -> DAT_RETURN {
    on_object(srq_handle, DAT_INVALID_HANDLE_SRQ, |p| {
        slot!(p, srq_resize_func)(srq_handle, srq_max_recv_dto)
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_srq_set_lw(
    srq_handle: DAT_SRQ_HANDLE,
    low_watermark: DAT_COUNT,
) -> DAT_RETURN {
    on_object(srq_handle, DAT_INVALID_HANDLE_SRQ, |p| {
        slot!(p, srq_set_lw_func)(srq_handle, low_watermark)
    })
}
// ------------------------------------------------------------ registry

/// Opens an IA by dat.conf name; `dat_ia_open` is a macro over this.
#[no_mangle]
pub unsafe extern "C" fn dat_ia_openv(
    name: *const c_char,
    async_event_qlen: DAT_COUNT,
    async_event_handle: *mut DAT_EVD_HANDLE,
    ia_handle: *mut DAT_IA_HANDLE,
    dapl_major: DAT_UINT32,
    dapl_minor: DAT_UINT32,
    thread_safety: DAT_BOOLEAN,
) -> DAT_RETURN {
    init_logging();
    ffi_guard(|| {
        if name.is_null() {
            return dat_error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG1);
        }
        if async_event_handle.is_null() {
            return dat_error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG3);
        }
        if ia_handle.is_null() {
            return dat_error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG4);
        }
        let ia_name = CStr::from_ptr(name).to_string_lossy().into_owned();
        let key = ProviderKey {
            ia_name,
            major: dapl_major,
            minor: dapl_minor,
            thread_safe: thread_safety != DAT_FALSE,
        };
        match registry::open_ia(&LIBRARY, &key, name, async_event_qlen, async_event_handle) {
            Ok(h) => {
                *ia_handle = h;
                DAT_SUCCESS
            }
            Err(rc) => {
                log::debug!("dat_ia_openv({}) = {:#x}", key.ia_name, rc);
                rc
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn dat_ia_close(
    ia_handle: DAT_IA_HANDLE,
    close_flags: DAT_CLOSE_FLAGS,
) -> DAT_RETURN {
    ffi_guard(|| registry::close_ia(&LIBRARY, ia_handle, close_flags))
}

/// Maps a consumer IA handle to the provider's own (OFED-internal export,
/// kept for binary compatibility).
#[no_mangle]
pub unsafe extern "C" fn dats_get_ia_handle(
    handle: DAT_IA_HANDLE,
    ia_handle_p: *mut DAT_IA_HANDLE,
) -> DAT_RETURN {
    ffi_guard(|| match registry::lookup_ia(handle) {
        Some(_) if ia_handle_p.is_null() => dat_error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG2),
        Some(open) => {
            *ia_handle_p = open.provider_ia;
            DAT_SUCCESS
        }
        None => dat_error(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_IA),
    })
}

/// The variadic `dat_extension_op` is a C shim (c/extension_op.c) that
/// forwards its `va_list` here (and to the two functions after this one
/// for the open and close ranges of `ext_op`).
#[no_mangle]
pub unsafe extern "C" fn dat2_extension_opv(
    handle: DAT_HANDLE,
    ext_op: DAT_EXTENDED_OP,
    args: va_list,
) -> DAT_RETURN {
    on_any(handle, |h, p| {
        slot!(p, handle_extendedop_func)(h, ext_op, args)
    })
}

/// `dat_extension_op` with DAT_OPEN_EXTENSION_BASE set in `ext_op` (the IB
/// extensions' `dat_ib_open_query`): the shim has taken the IA name off the
/// argument list and peeked at the next argument, where the provider will
/// store its IA. The provider is found and loaded as by `dat_ia_open` (DAT
/// 2.0, not thread-safe); its handle is its own, not a registry handle.
#[no_mangle]
pub unsafe extern "C" fn dat2_extension_openv(
    name: *const c_char,
    ext_op: DAT_EXTENDED_OP,
    ia_out: *const DAT_HANDLE,
    args: va_list,
) -> DAT_RETURN {
    init_logging();
    ffi_guard(|| {
        if name.is_null() {
            // What OFED's registry returns for a NULL name.
            return dat_error(DAT_INVALID_HANDLE, DAT_INVALID_ARG3);
        }
        let key = ProviderKey {
            ia_name: CStr::from_ptr(name).to_string_lossy().into_owned(),
            major: DAT_VERSION_MAJOR,
            minor: DAT_VERSION_MINOR,
            thread_safe: false,
        };
        crate::extension::open_extension(&key, name, ext_op, ia_out, args)
    })
}

/// `dat_extension_op` with DAT_CLOSE_EXTENSION_BASE set in `ext_op`
/// (`dat_ib_close_query`): `handle` is the provider's IA from the open.
#[no_mangle]
pub unsafe extern "C" fn dat2_extension_closev(
    handle: DAT_HANDLE,
    ext_op: DAT_EXTENDED_OP,
    args: va_list,
) -> DAT_RETURN {
    ffi_guard(|| crate::extension::close_extension(handle, ext_op, args))
}

/// Called by a provider's dat_provider_init to make itself known.
#[no_mangle]
pub unsafe extern "C" fn dat_registry_add_provider(
    provider: *const DAT_PROVIDER,
    provider_info: *const DAT_PROVIDER_INFO,
) -> DAT_RETURN {
    init_logging();
    ffi_guard(|| {
        if provider.is_null() {
            return dat_error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG1);
        }
        if provider_info.is_null() {
            return dat_error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG2);
        }
        registry::add_provider(
            ProviderKey::from_info(provider_info),
            ProviderPtr::new(provider),
        )
    })
}

/// Called by a provider's dat_provider_fini.
#[no_mangle]
pub unsafe extern "C" fn dat_registry_remove_provider(
    provider: *const DAT_PROVIDER,
    provider_info: *const DAT_PROVIDER_INFO,
) -> DAT_RETURN {
    ffi_guard(|| {
        if provider.is_null() {
            return dat_error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG1);
        }
        if provider_info.is_null() {
            return dat_error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG2);
        }
        registry::remove_provider(
            &ProviderKey::from_info(provider_info),
            ProviderPtr::new(provider),
        )
    })
}

/// Lists the dat.conf entries in effect. With `max_to_return` 0 it only
/// counts them.
#[no_mangle]
pub unsafe extern "C" fn dat_registry_list_providers(
    max_to_return: DAT_COUNT,
    entries_returned: *mut DAT_COUNT,
    dat_provider_list: *mut *mut DAT_PROVIDER_INFO,
) -> DAT_RETURN {
    init_logging();
    ffi_guard(|| {
        if max_to_return < 0 {
            return dat_error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG1);
        }
        if entries_returned.is_null() {
            return dat_error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG2);
        }
        let entries = registry::static_entries();
        if max_to_return == 0 {
            *entries_returned = entries.len() as DAT_COUNT;
            return DAT_SUCCESS;
        }
        if dat_provider_list.is_null() {
            return dat_error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG3);
        }
        let n = entries.len().min(max_to_return as usize);
        for (i, e) in entries.iter().take(n).enumerate() {
            let slot = *dat_provider_list.add(i);
            if slot.is_null() {
                return dat_error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG3);
            }
            let key = ProviderKey {
                ia_name: e.ia_name.clone(),
                major: e.api_major,
                minor: e.api_minor,
                thread_safe: e.thread_safe,
            };
            *slot = key.to_info();
        }
        *entries_returned = n as DAT_COUNT;
        DAT_SUCCESS
    })
}

/// Whether two IA names are served by the same provider (DAT 2.0 HA).
#[no_mangle]
pub unsafe extern "C" fn dat_registry_providers_related(
    provider1: *const c_char,
    provider2: *const c_char,
    answer: *mut DAT_HA_RELATIONSHIP,
) -> DAT_RETURN {
    ffi_guard(|| {
        if provider1.is_null() {
            return dat_error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG1);
        }
        if provider2.is_null() {
            return dat_error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG2);
        }
        if answer.is_null() {
            return dat_error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG3);
        }
        let a = CStr::from_ptr(provider1).to_string_lossy();
        let b = CStr::from_ptr(provider2).to_string_lossy();
        match registry::providers_related(&a, &b) {
            Ok(r) => {
                *answer = r;
                DAT_SUCCESS
            }
            Err(rc) => rc,
        }
    })
}

/// Names the type and subtype of a DAT_RETURN ("DAT_INVALID_HANDLE",
/// "DAT_INVALID_HANDLE_EP"). The strings are static.
#[no_mangle]
pub unsafe extern "C" fn dat_strerror(
    value: DAT_RETURN,
    major_message: *mut *const c_char,
    minor_message: *mut *const c_char,
) -> DAT_RETURN {
    ffi_guard(|| {
        if major_message.is_null() {
            return dat_error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG2);
        }
        if minor_message.is_null() {
            return dat_error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG3);
        }
        match crate::strerror::names(value) {
            Some((major, minor)) => {
                *major_message = major.as_ptr();
                *minor_message = minor.as_ptr();
                DAT_SUCCESS
            }
            None => dat_error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG1),
        }
    })
}
