//! The DAT 1.2 C API of libdat.so.1: the 72 functions of
//! `include/dat/dat_api.h`, with their 1.2 signatures.
//!
//! Every dispatched call is the same three steps, written once in
//! `dispatch!`: check the handle (the code libdat2 returns for the same
//! call, in 1.2's numbering, for NULL and for any handle that is not an
//! open IA or a live object of a registered 1.2 provider), map an IA
//! handle to the provider's own, and call the provider's slot, or return
//! DAT_NOT_IMPLEMENTED when the provider left it empty. The prototypes
//! stay written out, one function each. The registry calls (open, close,
//! add/remove/list providers, strerror) are at the end.

// Each export's safety contract is the DAT 1.2 specification of that call:
// the pointers it takes are valid as the DAT 1.2 API describes them.
#![allow(clippy::missing_safety_doc)]

use crate::{error, ffi_guard, LIBRARY};
use dat_abi12::codes::from_v20;
use dat_abi12::*;
use dat_registry::dispatch::{any_handle, provider_of};
use dat_registry::registry::{self, ProviderKey, ProviderPtr};
use dat_registry::strerror::ReturnNames;
use std::ffi::{c_char, CStr};

/// What a call on an empty provider slot returns.
const NOT_IMPLEMENTED: DAT_RETURN = error(DAT_NOT_IMPLEMENTED, DAT_NO_SUBTYPE);

/// Calls slot `$slot` of 1.2 provider table `$p` with `$args`, or returns
/// DAT_NOT_IMPLEMENTED from the enclosing closure when the slot is empty.
macro_rules! call {
    ($p:expr, $slot:ident, $($arg:expr),*) => {
        match $p.$slot {
            // SAFETY: the table is a registered 1.2 provider's, so the slot
            // has the 1.2 signature; the arguments are the consumer's, as
            // the 1.2 API passes them, and the provider owns their checks.
            Some(f) => unsafe { f($($arg),*) },
            None => return NOT_IMPLEMENTED,
        }
    };
}

/// The body of a dispatched export, by the kind of its first argument:
///
/// * `object h, SUBTYPE => slot(args)`: `h` must be a live object of a
///   registered provider, else DAT_INVALID_HANDLE | SUBTYPE;
/// * `ia h => slot(args)`: `h` must be an open IA handle, else
///   DAT_INVALID_HANDLE | DAT_INVALID_HANDLE_IA; the provider is called
///   with its own IA handle;
/// * `any h => slot(args)`: either of the above, else DAT_INVALID_HANDLE |
///   DAT_INVALID_HANDLE1.
///
/// The handle, mapped, is the slot's first argument, `args` the rest.
macro_rules! dispatch {
    (object $h:ident, $sub:ident => $slot:ident($($arg:expr),* $(,)?)) => {
        ffi_guard(|| {
            // SAFETY: provider_of reads the handle only once it may be an
            // object; the tables of this library's registry are 1.2's.
            match unsafe { provider_of::<DAT_PROVIDER>($h) } {
                Some(p) => call!(p, $slot, $h $(, $arg)*),
                None => error(DAT_INVALID_HANDLE, $sub),
            }
        })
    };
    (ia $h:ident => $slot:ident($($arg:expr),* $(,)?)) => {
        ffi_guard(|| match registry::lookup_ia($h) {
            Some(open) => {
                // SAFETY: the IA is open, so its 1.2 provider is registered
                // and its library loaded.
                let p: &DAT_PROVIDER = unsafe { open.provider.table() };
                call!(p, $slot, open.provider_ia $(, $arg)*)
            }
            None => error(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_IA),
        })
    };
    (any $h:ident => $slot:ident($($arg:expr),* $(,)?)) => {
        ffi_guard(|| {
            // SAFETY: as for `object`, after the IA handle table.
            match unsafe { any_handle::<DAT_PROVIDER>($h) } {
                Some((h, p)) => call!(p, $slot, h $(, $arg)*),
                None => error(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE1),
            }
        })
    };
}

// ------------------------------------------------------------ IA and helpers

#[no_mangle]
pub unsafe extern "C" fn dat_ia_query(
    ia_handle: DAT_IA_HANDLE,
    async_evd_handle: *mut DAT_EVD_HANDLE,
    ia_attr_mask: DAT_IA_ATTR_MASK,
    ia_attr: *mut DAT_IA_ATTR,
    provider_attr_mask: DAT_PROVIDER_ATTR_MASK,
    provider_attr: *mut DAT_PROVIDER_ATTR,
) -> DAT_RETURN {
    dispatch!(ia ia_handle => ia_query_func(
        async_evd_handle,
        ia_attr_mask,
        ia_attr,
        provider_attr_mask,
        provider_attr,
    ))
}

#[no_mangle]
pub unsafe extern "C" fn dat_set_consumer_context(
    handle: DAT_HANDLE,
    context: DAT_CONTEXT,
) -> DAT_RETURN {
    dispatch!(any handle => set_consumer_context_func(context))
}

#[no_mangle]
pub unsafe extern "C" fn dat_get_consumer_context(
    handle: DAT_HANDLE,
    context: *mut DAT_CONTEXT,
) -> DAT_RETURN {
    dispatch!(any handle => get_consumer_context_func(context))
}

#[no_mangle]
pub unsafe extern "C" fn dat_get_handle_type(
    handle: DAT_HANDLE,
    handle_type: *mut DAT_HANDLE_TYPE,
) -> DAT_RETURN {
    dispatch!(any handle => get_handle_type_func(handle_type))
}

// ------------------------------------------------------------ CNO

#[no_mangle]
pub unsafe extern "C" fn dat_cno_create(
    ia_handle: DAT_IA_HANDLE,
    agent: DAT_OS_WAIT_PROXY_AGENT,
    cno_handle: *mut DAT_CNO_HANDLE,
) -> DAT_RETURN {
    dispatch!(ia ia_handle => cno_create_func(agent, cno_handle))
}

#[no_mangle]
pub unsafe extern "C" fn dat_cno_modify_agent(
    cno_handle: DAT_CNO_HANDLE,
    agent: DAT_OS_WAIT_PROXY_AGENT,
) -> DAT_RETURN {
    dispatch!(object cno_handle, DAT_INVALID_HANDLE_CNO => cno_modify_agent_func(agent))
}

#[no_mangle]
pub unsafe extern "C" fn dat_cno_query(
    cno_handle: DAT_CNO_HANDLE,
    cno_param_mask: DAT_CNO_PARAM_MASK,
    cno_param: *mut DAT_CNO_PARAM,
) -> DAT_RETURN {
    dispatch!(object cno_handle, DAT_INVALID_HANDLE_CNO => cno_query_func(
        cno_param_mask,
        cno_param,
    ))
}

#[no_mangle]
pub unsafe extern "C" fn dat_cno_free(cno_handle: DAT_CNO_HANDLE) -> DAT_RETURN {
    dispatch!(object cno_handle, DAT_INVALID_HANDLE_CNO => cno_free_func())
}

#[no_mangle]
pub unsafe extern "C" fn dat_cno_wait(
    cno_handle: DAT_CNO_HANDLE,
    timeout: DAT_TIMEOUT,
    evd_handle: *mut DAT_EVD_HANDLE,
) -> DAT_RETURN {
    dispatch!(object cno_handle, DAT_INVALID_HANDLE_CNO => cno_wait_func(timeout, evd_handle))
}

// ------------------------------------------------------------ CR

#[no_mangle]
pub unsafe extern "C" fn dat_cr_query(
    cr_handle: DAT_CR_HANDLE,
    cr_param_mask: DAT_CR_PARAM_MASK,
    cr_param: *mut DAT_CR_PARAM,
) -> DAT_RETURN {
    dispatch!(object cr_handle, DAT_INVALID_HANDLE_CR => cr_query_func(cr_param_mask, cr_param))
}

#[no_mangle]
pub unsafe extern "C" fn dat_cr_accept(
    cr_handle: DAT_CR_HANDLE,
    ep_handle: DAT_EP_HANDLE,
    private_data_size: DAT_COUNT,
    private_data: DAT_PVOID,
) -> DAT_RETURN {
    dispatch!(object cr_handle, DAT_INVALID_HANDLE_CR => cr_accept_func(
        ep_handle,
        private_data_size,
        private_data,
    ))
}

#[no_mangle]
pub unsafe extern "C" fn dat_cr_reject(cr_handle: DAT_CR_HANDLE) -> DAT_RETURN {
    dispatch!(object cr_handle, DAT_INVALID_HANDLE_CR => cr_reject_func())
}

#[no_mangle]
pub unsafe extern "C" fn dat_cr_handoff(
    cr_handle: DAT_CR_HANDLE,
    handoff: DAT_CONN_QUAL,
) -> DAT_RETURN {
    dispatch!(object cr_handle, DAT_INVALID_HANDLE_CR => cr_handoff_func(handoff))
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
    dispatch!(ia ia_handle => evd_create_func(evd_min_qlen, cno_handle, evd_flags, evd_handle))
}

#[no_mangle]
pub unsafe extern "C" fn dat_evd_query(
    evd_handle: DAT_EVD_HANDLE,
    evd_param_mask: DAT_EVD_PARAM_MASK,
    evd_param: *mut DAT_EVD_PARAM,
) -> DAT_RETURN {
    dispatch!(object evd_handle, DAT_INVALID_HANDLE_EVD_REQUEST => evd_query_func(
        evd_param_mask,
        evd_param,
    ))
}

#[no_mangle]
pub unsafe extern "C" fn dat_evd_modify_cno(
    evd_handle: DAT_EVD_HANDLE,
    cno_handle: DAT_CNO_HANDLE,
) -> DAT_RETURN {
    dispatch!(object evd_handle, DAT_INVALID_HANDLE_EVD_REQUEST => evd_modify_cno_func(cno_handle))
}

#[no_mangle]
pub unsafe extern "C" fn dat_evd_enable(evd_handle: DAT_EVD_HANDLE) -> DAT_RETURN {
    dispatch!(object evd_handle, DAT_INVALID_HANDLE_EVD_REQUEST => evd_enable_func())
}

#[no_mangle]
pub unsafe extern "C" fn dat_evd_disable(evd_handle: DAT_EVD_HANDLE) -> DAT_RETURN {
    dispatch!(object evd_handle, DAT_INVALID_HANDLE_EVD_REQUEST => evd_disable_func())
}

#[no_mangle]
pub unsafe extern "C" fn dat_evd_wait(
    evd_handle: DAT_EVD_HANDLE,
    timeout: DAT_TIMEOUT,
    threshold: DAT_COUNT,
    event: *mut DAT_EVENT,
    nmore: *mut DAT_COUNT,
) -> DAT_RETURN {
    dispatch!(object evd_handle, DAT_INVALID_HANDLE_EVD_REQUEST => evd_wait_func(
        timeout,
        threshold,
        event,
        nmore,
    ))
}

#[no_mangle]
pub unsafe extern "C" fn dat_evd_resize(
    evd_handle: DAT_EVD_HANDLE,
    evd_qlen: DAT_COUNT,
) -> DAT_RETURN {
    dispatch!(object evd_handle, DAT_INVALID_HANDLE_EVD_REQUEST => evd_resize_func(evd_qlen))
}

#[no_mangle]
pub unsafe extern "C" fn dat_evd_post_se(
    evd_handle: DAT_EVD_HANDLE,
    event: *const DAT_EVENT,
) -> DAT_RETURN {
    dispatch!(object evd_handle, DAT_INVALID_HANDLE_EVD_REQUEST => evd_post_se_func(event))
}

#[no_mangle]
pub unsafe extern "C" fn dat_evd_dequeue(
    evd_handle: DAT_EVD_HANDLE,
    event: *mut DAT_EVENT,
) -> DAT_RETURN {
    dispatch!(object evd_handle, DAT_INVALID_HANDLE_EVD_REQUEST => evd_dequeue_func(event))
}

#[no_mangle]
pub unsafe extern "C" fn dat_evd_free(evd_handle: DAT_EVD_HANDLE) -> DAT_RETURN {
    dispatch!(object evd_handle, DAT_INVALID_HANDLE_EVD_REQUEST => evd_free_func())
}

#[no_mangle]
pub unsafe extern "C" fn dat_evd_set_unwaitable(evd_handle: DAT_EVD_HANDLE) -> DAT_RETURN {
    dispatch!(object evd_handle, DAT_INVALID_HANDLE_EVD_REQUEST => evd_set_unwaitable_func())
}

#[no_mangle]
pub unsafe extern "C" fn dat_evd_clear_unwaitable(evd_handle: DAT_EVD_HANDLE) -> DAT_RETURN {
    dispatch!(object evd_handle, DAT_INVALID_HANDLE_EVD_REQUEST => evd_clear_unwaitable_func())
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
    dispatch!(ia ia_handle => ep_create_func(
        pz_handle,
        recv_evd_handle,
        request_evd_handle,
        connect_evd_handle,
        ep_attributes,
        ep_handle,
    ))
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
    dispatch!(ia ia_handle => ep_create_with_srq_func(
        pz_handle,
        recv_evd_handle,
        request_evd_handle,
        connect_evd_handle,
        srq_handle,
        ep_attributes,
        ep_handle,
    ))
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_query(
    ep_handle: DAT_EP_HANDLE,
    ep_param_mask: DAT_EP_PARAM_MASK,
    ep_param: *mut DAT_EP_PARAM,
) -> DAT_RETURN {
    dispatch!(object ep_handle, DAT_INVALID_HANDLE_EP => ep_query_func(ep_param_mask, ep_param))
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_modify(
    ep_handle: DAT_EP_HANDLE,
    ep_param_mask: DAT_EP_PARAM_MASK,
    ep_param: *const DAT_EP_PARAM,
) -> DAT_RETURN {
    dispatch!(object ep_handle, DAT_INVALID_HANDLE_EP => ep_modify_func(ep_param_mask, ep_param))
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
    dispatch!(object ep_handle, DAT_INVALID_HANDLE_EP => ep_connect_func(
        remote_ia_address,
        remote_conn_qual,
        timeout,
        private_data_size,
        private_data,
        qos,
        connect_flags,
    ))
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
    dispatch!(object ep_handle, DAT_INVALID_HANDLE_EP => ep_dup_connect_func(
        ep_dup_handle,
        timeout,
        private_data_size,
        private_data,
        qos,
    ))
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_disconnect(
    ep_handle: DAT_EP_HANDLE,
    close_flags: DAT_CLOSE_FLAGS,
) -> DAT_RETURN {
    dispatch!(object ep_handle, DAT_INVALID_HANDLE_EP => ep_disconnect_func(close_flags))
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_post_send(
    ep_handle: DAT_EP_HANDLE,
    num_segments: DAT_COUNT,
    local_iov: *mut DAT_LMR_TRIPLET,
    user_cookie: DAT_DTO_COOKIE,
    completion_flags: DAT_COMPLETION_FLAGS,
) -> DAT_RETURN {
    dispatch!(object ep_handle, DAT_INVALID_HANDLE_EP => ep_post_send_func(
        num_segments,
        local_iov,
        user_cookie,
        completion_flags,
    ))
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_post_recv(
    ep_handle: DAT_EP_HANDLE,
    num_segments: DAT_COUNT,
    local_iov: *mut DAT_LMR_TRIPLET,
    user_cookie: DAT_DTO_COOKIE,
    completion_flags: DAT_COMPLETION_FLAGS,
) -> DAT_RETURN {
    dispatch!(object ep_handle, DAT_INVALID_HANDLE_EP => ep_post_recv_func(
        num_segments,
        local_iov,
        user_cookie,
        completion_flags,
    ))
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
    dispatch!(object ep_handle, DAT_INVALID_HANDLE_EP => ep_post_rdma_read_func(
        num_segments,
        local_iov,
        user_cookie,
        remote_iov,
        completion_flags,
    ))
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
    dispatch!(object ep_handle, DAT_INVALID_HANDLE_EP => ep_post_rdma_write_func(
        num_segments,
        local_iov,
        user_cookie,
        remote_iov,
        completion_flags,
    ))
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_get_status(
    ep_handle: DAT_EP_HANDLE,
    ep_state: *mut DAT_EP_STATE,
    recv_idle: *mut DAT_BOOLEAN,
    request_idle: *mut DAT_BOOLEAN,
) -> DAT_RETURN {
    dispatch!(object ep_handle, DAT_INVALID_HANDLE_EP => ep_get_status_func(
        ep_state,
        recv_idle,
        request_idle,
    ))
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_free(ep_handle: DAT_EP_HANDLE) -> DAT_RETURN {
    dispatch!(object ep_handle, DAT_INVALID_HANDLE_EP => ep_free_func())
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_reset(ep_handle: DAT_EP_HANDLE) -> DAT_RETURN {
    dispatch!(object ep_handle, DAT_INVALID_HANDLE_EP => ep_reset_func())
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_recv_query(
    ep_handle: DAT_EP_HANDLE,
    nbufs_allocated: *mut DAT_COUNT,
    bufs_alloc_span: *mut DAT_COUNT,
) -> DAT_RETURN {
    dispatch!(object ep_handle, DAT_INVALID_HANDLE_EP => ep_recv_query_func(
        nbufs_allocated,
        bufs_alloc_span,
    ))
}

#[no_mangle]
pub unsafe extern "C" fn dat_ep_set_watermark(
    ep_handle: DAT_EP_HANDLE,
    soft_high_watermark: DAT_COUNT,
    hard_high_watermark: DAT_COUNT,
) -> DAT_RETURN {
    dispatch!(object ep_handle, DAT_INVALID_HANDLE_EP => ep_set_watermark_func(
        soft_high_watermark,
        hard_high_watermark,
    ))
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
    lmr_handle: *mut DAT_LMR_HANDLE,
    lmr_context: *mut DAT_LMR_CONTEXT,
    rmr_context: *mut DAT_RMR_CONTEXT,
    registered_length: *mut DAT_VLEN,
    registered_address: *mut DAT_VADDR,
) -> DAT_RETURN {
    dispatch!(ia ia_handle => lmr_create_func(
        mem_type,
        region_description,
        length,
        pz_handle,
        privileges,
        lmr_handle,
        lmr_context,
        rmr_context,
        registered_length,
        registered_address,
    ))
}

#[no_mangle]
pub unsafe extern "C" fn dat_lmr_query(
    lmr_handle: DAT_LMR_HANDLE,
    lmr_param_mask: DAT_LMR_PARAM_MASK,
    lmr_param: *mut DAT_LMR_PARAM,
) -> DAT_RETURN {
    dispatch!(object lmr_handle, DAT_INVALID_HANDLE_LMR => lmr_query_func(
        lmr_param_mask,
        lmr_param,
    ))
}

#[no_mangle]
pub unsafe extern "C" fn dat_lmr_free(lmr_handle: DAT_LMR_HANDLE) -> DAT_RETURN {
    dispatch!(object lmr_handle, DAT_INVALID_HANDLE_LMR => lmr_free_func())
}

#[no_mangle]
pub unsafe extern "C" fn dat_lmr_sync_rdma_read(
    ia_handle: DAT_IA_HANDLE,
    local_segments: *const DAT_LMR_TRIPLET,
    num_segments: DAT_VLEN,
) -> DAT_RETURN {
    dispatch!(ia ia_handle => lmr_sync_rdma_read_func(local_segments, num_segments))
}

#[no_mangle]
pub unsafe extern "C" fn dat_lmr_sync_rdma_write(
    ia_handle: DAT_IA_HANDLE,
    local_segments: *const DAT_LMR_TRIPLET,
    num_segments: DAT_VLEN,
) -> DAT_RETURN {
    dispatch!(ia ia_handle => lmr_sync_rdma_write_func(local_segments, num_segments))
}

// ------------------------------------------------------------ RMR

#[no_mangle]
pub unsafe extern "C" fn dat_rmr_create(
    pz_handle: DAT_PZ_HANDLE,
    rmr_handle: *mut DAT_RMR_HANDLE,
) -> DAT_RETURN {
    dispatch!(object pz_handle, DAT_INVALID_HANDLE_PZ => rmr_create_func(rmr_handle))
}

#[no_mangle]
pub unsafe extern "C" fn dat_rmr_query(
    rmr_handle: DAT_RMR_HANDLE,
    rmr_param_mask: DAT_RMR_PARAM_MASK,
    rmr_param: *mut DAT_RMR_PARAM,
) -> DAT_RETURN {
    dispatch!(object rmr_handle, DAT_INVALID_HANDLE_RMR => rmr_query_func(
        rmr_param_mask,
        rmr_param,
    ))
}

#[no_mangle]
pub unsafe extern "C" fn dat_rmr_bind(
    rmr_handle: DAT_RMR_HANDLE,
    lmr_triplet: *const DAT_LMR_TRIPLET,
    mem_priv: DAT_MEM_PRIV_FLAGS,
    ep_handle: DAT_EP_HANDLE,
    user_cookie: DAT_RMR_COOKIE,
    completion_flags: DAT_COMPLETION_FLAGS,
    rmr_context: *mut DAT_RMR_CONTEXT,
) -> DAT_RETURN {
    dispatch!(object rmr_handle, DAT_INVALID_HANDLE_RMR => rmr_bind_func(
        lmr_triplet,
        mem_priv,
        ep_handle,
        user_cookie,
        completion_flags,
        rmr_context,
    ))
}

#[no_mangle]
pub unsafe extern "C" fn dat_rmr_free(rmr_handle: DAT_RMR_HANDLE) -> DAT_RETURN {
    dispatch!(object rmr_handle, DAT_INVALID_HANDLE_RMR => rmr_free_func())
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
    dispatch!(ia ia_handle => psp_create_func(conn_qual, evd_handle, psp_flags, psp_handle))
}

#[no_mangle]
pub unsafe extern "C" fn dat_psp_create_any(
    ia_handle: DAT_IA_HANDLE,
    conn_qual: *mut DAT_CONN_QUAL,
    evd_handle: DAT_EVD_HANDLE,
    psp_flags: DAT_PSP_FLAGS,
    psp_handle: *mut DAT_PSP_HANDLE,
) -> DAT_RETURN {
    dispatch!(ia ia_handle => psp_create_any_func(conn_qual, evd_handle, psp_flags, psp_handle))
}

#[no_mangle]
pub unsafe extern "C" fn dat_psp_query(
    psp_handle: DAT_PSP_HANDLE,
    psp_param_mask: DAT_PSP_PARAM_MASK,
    psp_param: *mut DAT_PSP_PARAM,
) -> DAT_RETURN {
    dispatch!(object psp_handle, DAT_INVALID_HANDLE_PSP => psp_query_func(
        psp_param_mask,
        psp_param,
    ))
}

#[no_mangle]
pub unsafe extern "C" fn dat_psp_free(psp_handle: DAT_PSP_HANDLE) -> DAT_RETURN {
    dispatch!(object psp_handle, DAT_INVALID_HANDLE_PSP => psp_free_func())
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
    dispatch!(ia ia_handle => rsp_create_func(conn_qual, ep_handle, evd_handle, rsp_handle))
}

#[no_mangle]
pub unsafe extern "C" fn dat_rsp_query(
    rsp_handle: DAT_RSP_HANDLE,
    rsp_param_mask: DAT_RSP_PARAM_MASK,
    rsp_param: *mut DAT_RSP_PARAM,
) -> DAT_RETURN {
    dispatch!(object rsp_handle, DAT_INVALID_HANDLE_RSP => rsp_query_func(
        rsp_param_mask,
        rsp_param,
    ))
}

#[no_mangle]
pub unsafe extern "C" fn dat_rsp_free(rsp_handle: DAT_RSP_HANDLE) -> DAT_RETURN {
    dispatch!(object rsp_handle, DAT_INVALID_HANDLE_RSP => rsp_free_func())
}

// ------------------------------------------------------------ PZ

#[no_mangle]
pub unsafe extern "C" fn dat_pz_create(
    ia_handle: DAT_IA_HANDLE,
    pz_handle: *mut DAT_PZ_HANDLE,
) -> DAT_RETURN {
    dispatch!(ia ia_handle => pz_create_func(pz_handle))
}

#[no_mangle]
pub unsafe extern "C" fn dat_pz_query(
    pz_handle: DAT_PZ_HANDLE,
    pz_param_mask: DAT_PZ_PARAM_MASK,
    pz_param: *mut DAT_PZ_PARAM,
) -> DAT_RETURN {
    dispatch!(object pz_handle, DAT_INVALID_HANDLE_PZ => pz_query_func(pz_param_mask, pz_param))
}

#[no_mangle]
pub unsafe extern "C" fn dat_pz_free(pz_handle: DAT_PZ_HANDLE) -> DAT_RETURN {
    dispatch!(object pz_handle, DAT_INVALID_HANDLE_PZ => pz_free_func())
}

// ------------------------------------------------------------ SRQ

#[no_mangle]
pub unsafe extern "C" fn dat_srq_create(
    ia_handle: DAT_IA_HANDLE,
    pz_handle: DAT_PZ_HANDLE,
    srq_attr: *mut DAT_SRQ_ATTR,
    srq_handle: *mut DAT_SRQ_HANDLE,
) -> DAT_RETURN {
    dispatch!(ia ia_handle => srq_create_func(pz_handle, srq_attr, srq_handle))
}

#[no_mangle]
pub unsafe extern "C" fn dat_srq_free(srq_handle: DAT_SRQ_HANDLE) -> DAT_RETURN {
    dispatch!(object srq_handle, DAT_INVALID_HANDLE_SRQ => srq_free_func())
}

#[no_mangle]
pub unsafe extern "C" fn dat_srq_post_recv(
    srq_handle: DAT_SRQ_HANDLE,
    num_segments: DAT_COUNT,
    local_iov: *mut DAT_LMR_TRIPLET,
    user_cookie: DAT_DTO_COOKIE,
) -> DAT_RETURN {
    dispatch!(object srq_handle, DAT_INVALID_HANDLE_SRQ => srq_post_recv_func(
        num_segments,
        local_iov,
        user_cookie,
    ))
}

#[no_mangle]
pub unsafe extern "C" fn dat_srq_query(
    srq_handle: DAT_SRQ_HANDLE,
    srq_param_mask: DAT_SRQ_PARAM_MASK,
    srq_param: *mut DAT_SRQ_PARAM,
) -> DAT_RETURN {
    dispatch!(object srq_handle, DAT_INVALID_HANDLE_SRQ => srq_query_func(
        srq_param_mask,
        srq_param,
    ))
}

#[no_mangle]
pub unsafe extern "C" fn dat_srq_resize(
    srq_handle: DAT_SRQ_HANDLE,
    srq_max_recv_dto: DAT_COUNT,
) -> DAT_RETURN {
    dispatch!(object srq_handle, DAT_INVALID_HANDLE_SRQ => srq_resize_func(srq_max_recv_dto))
}

#[no_mangle]
pub unsafe extern "C" fn dat_srq_set_lw(
    srq_handle: DAT_SRQ_HANDLE,
    low_watermark: DAT_COUNT,
) -> DAT_RETURN {
    dispatch!(object srq_handle, DAT_INVALID_HANDLE_SRQ => srq_set_lw_func(low_watermark))
}

// ------------------------------------------------------------ registry

/// Opens an IA by dat.conf name; `dat_ia_open` is a macro over this. Only
/// DAT 1.x is served here: a table of another version registered in this
/// library would be dispatched as a 1.2 one.
#[no_mangle]
pub unsafe extern "C" fn dat_ia_openv(
    name: *const c_char,
    async_evd_qlen: DAT_COUNT,
    async_evd_handle: *mut DAT_EVD_HANDLE,
    ia_handle: *mut DAT_IA_HANDLE,
    dapl_major: DAT_UINT32,
    dapl_minor: DAT_UINT32,
    thread_safety: DAT_BOOLEAN,
) -> DAT_RETURN {
    dat_registry::init_logging();
    ffi_guard(|| {
        if name.is_null() {
            return error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG1);
        }
        if async_evd_handle.is_null() {
            return error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG3);
        }
        if ia_handle.is_null() {
            return error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG4);
        }
        if dapl_major != DAT_VERSION_MAJOR {
            return error(DAT_PROVIDER_NOT_FOUND, DAT_MAJOR_NOT_FOUND);
        }
        // SAFETY: checked non-NULL; a C string by the API's contract.
        let ia_name = unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned();
        let key = ProviderKey {
            ia_name,
            major: dapl_major,
            minor: dapl_minor,
            thread_safe: thread_safety != DAT_FALSE,
        };
        // SAFETY: name and async_evd_handle as the caller passed them,
        // checked above; the provider reads them.
        let opened =
            unsafe { registry::open_ia(&LIBRARY, &key, name, async_evd_qlen, async_evd_handle) };
        match opened {
            Ok(h) => {
                // SAFETY: checked non-NULL; the consumer's IA handle slot.
                unsafe { *ia_handle = h };
                DAT_SUCCESS
            }
            Err(rc) => {
                log::debug!("dat_ia_openv({}) = {:#x}", key.ia_name, rc);
                rc
            }
        }
    })
}

/// Closes an IA through its provider, whose result passes through.
#[no_mangle]
pub unsafe extern "C" fn dat_ia_close(
    ia_handle: DAT_IA_HANDLE,
    close_flags: DAT_CLOSE_FLAGS,
) -> DAT_RETURN {
    ffi_guard(|| registry::close_ia(&LIBRARY, ia_handle, close_flags))
}

/// The key a provider registers under, if it is one this library serves:
/// a DAT 1.x table (see dat_ia_openv).
///
/// # Safety
/// `provider_info` is non-NULL and readable.
unsafe fn key_of_v12(provider_info: *const DAT_PROVIDER_INFO) -> Option<ProviderKey> {
    // SAFETY: the caller's contract.
    let key = unsafe { ProviderKey::from_info(provider_info) };
    (key.major == DAT_VERSION_MAJOR).then_some(key)
}

/// Called by a provider's dat_provider_init to register its 1.2 table
/// (found as `dat_registry_add_provider@DAT_1.2`).
#[no_mangle]
pub unsafe extern "C" fn dat_registry_add_provider(
    provider: *const DAT_PROVIDER,
    provider_info: *const DAT_PROVIDER_INFO,
) -> DAT_RETURN {
    dat_registry::init_logging();
    ffi_guard(|| {
        if provider.is_null() {
            return error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG1);
        }
        if provider_info.is_null() {
            return error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG2);
        }
        // SAFETY: checked non-NULL.
        match unsafe { key_of_v12(provider_info) } {
            Some(key) => from_v20(registry::add_provider(key, ProviderPtr::new(provider))),
            None => error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG2),
        }
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
            return error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG1);
        }
        if provider_info.is_null() {
            return error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG2);
        }
        // SAFETY: checked non-NULL.
        match unsafe { key_of_v12(provider_info) } {
            Some(key) => from_v20(registry::remove_provider(&key, ProviderPtr::new(provider))),
            None => error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG2),
        }
    })
}

/// Lists the dat.conf entries this library serves: user-level, default,
/// DAT 1.x. With `max_to_return` 0 it only counts them.
#[no_mangle]
pub unsafe extern "C" fn dat_registry_list_providers(
    max_to_return: DAT_COUNT,
    entries_returned: *mut DAT_COUNT,
    dat_provider_list: *mut *mut DAT_PROVIDER_INFO,
) -> DAT_RETURN {
    dat_registry::init_logging();
    ffi_guard(|| {
        if max_to_return < 0 {
            return error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG1);
        }
        if entries_returned.is_null() {
            return error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG2);
        }
        let entries: Vec<_> = registry::static_entries()
            .into_iter()
            .filter(|e| e.api_major == DAT_VERSION_MAJOR)
            .collect();
        if max_to_return == 0 {
            // SAFETY: checked non-NULL; the consumer's count.
            unsafe { *entries_returned = entries.len() as DAT_COUNT };
            return DAT_SUCCESS;
        }
        if dat_provider_list.is_null() {
            return error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG3);
        }
        let n = entries.len().min(max_to_return as usize);
        for (i, e) in entries.iter().take(n).enumerate() {
            // SAFETY: the consumer's array holds max_to_return pointers.
            let slot = unsafe { *dat_provider_list.add(i) };
            if slot.is_null() {
                return error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG3);
            }
            let key = ProviderKey {
                ia_name: e.ia_name.clone(),
                major: e.api_major,
                minor: e.api_minor,
                thread_safe: e.thread_safe,
            };
            // SAFETY: a non-NULL element of the consumer's array.
            unsafe { *slot = key.to_info() };
        }
        // SAFETY: checked non-NULL.
        unsafe { *entries_returned = n as DAT_COUNT };
        DAT_SUCCESS
    })
}

/// 1.2's code names (its numbering of types and subtypes).
static NAMES: ReturnNames = ReturnNames::new(DAT_RETURN_TYPE_NAMES, DAT_RETURN_SUBTYPE_NAMES);

/// Names the type and subtype of a 1.2 DAT_RETURN ("DAT_INVALID_HANDLE",
/// "DAT_INVALID_HANDLE_EP"). The strings are static.
#[no_mangle]
pub unsafe extern "C" fn dat_strerror(
    value: DAT_RETURN,
    major_message: *mut *const c_char,
    minor_message: *mut *const c_char,
) -> DAT_RETURN {
    ffi_guard(|| {
        if major_message.is_null() {
            return error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG2);
        }
        if minor_message.is_null() {
            return error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG3);
        }
        match NAMES.names(value) {
            Some((major, minor)) => {
                // SAFETY: both checked non-NULL; the strings are static.
                unsafe {
                    *major_message = major.as_ptr();
                    *minor_message = minor.as_ptr();
                }
                DAT_SUCCESS
            }
            None => error(DAT_INVALID_PARAMETER, DAT_INVALID_ARG1),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_12s() {
        let (major, minor) = NAMES.names(0x8fff_0000).unwrap();
        assert_eq!((major, minor), (c"DAT_NOT_IMPLEMENTED", c"DAT_NO_SUBTYPE"));
        let (major, minor) = NAMES.names(0x8005_001a).unwrap();
        assert_eq!(
            (major, minor),
            (c"DAT_INVALID_HANDLE", c"DAT_INVALID_HANDLE1")
        );
        assert!(NAMES.names(0x3fff_0000).is_none(), "2.0's NOT_IMPLEMENTED");
    }

    #[test]
    fn null_handles_give_12_codes() {
        // SAFETY: NULL handles are checked before anything is read.
        unsafe {
            assert_eq!(dat_ep_free(std::ptr::null_mut()), 0x8005_000c);
            assert_eq!(
                dat_get_handle_type(std::ptr::null_mut(), std::ptr::null_mut()),
                0x8005_001a
            );
            assert_eq!(
                dat_ia_close(std::ptr::null_mut(), DAT_CLOSE_ABRUPT_FLAG),
                0x8005_000b
            );
            assert_eq!(dat_cr_reject(0x20 as _), 0x8005_0012);
        }
    }
}
