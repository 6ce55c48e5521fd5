//! The 1.2 provider table, and its slots whose C signature is 2.0's: they
//! run the 2.0 function and return the 1.2 reading of its code.

use super::{ep, evd, ia, mem, misc};
use crate::{cno, cr, ep as ep20, evd as evd20, ia as ia20, lmr, pz, rmr, sp, srq};
use dat_abi::*;
use dat_abi12 as d12;

/// Slots 1.2 shares with 2.0 argument for argument: the 2.0 function, its
/// code in 1.2 numbering.
macro_rules! same_as_v20 {
    ($(fn $name:ident($($arg:ident: $ty:ty),*) = $v20:path;)*) => {
        $(
            unsafe extern "C" fn $name($($arg: $ty),*) -> DAT_RETURN {
                // SAFETY: this entry point's pointer arguments, passed on under the same C
                // contract.
                d12::from_v20(unsafe { $v20($($arg),*) })
            }
        )*
    };
}

same_as_v20! {
    fn ia_close(ia: DAT_IA_HANDLE, flags: DAT_CLOSE_FLAGS) = ia20::close;
    fn set_consumer_context(h: DAT_HANDLE, c: DAT_CONTEXT) = ia20::set_consumer_context;
    fn get_consumer_context(h: DAT_HANDLE, c: *mut DAT_CONTEXT) = ia20::get_consumer_context;
    // DAT_HANDLE_TYPE values are the same in 1.2 for every kind a 1.2 IA
    // can hold (no CSP).
    fn get_handle_type(h: DAT_HANDLE, t: *mut DAT_HANDLE_TYPE) = ia20::get_handle_type;
    fn cno_create(ia: DAT_IA_HANDLE, a: DAT_OS_WAIT_PROXY_AGENT, c: *mut DAT_CNO_HANDLE) = cno::create;
    fn cno_modify_agent(c: DAT_CNO_HANDLE, a: DAT_OS_WAIT_PROXY_AGENT) = cno::modify_agent;
    fn cno_free(c: DAT_CNO_HANDLE) = cno::free;
    fn cno_wait(c: DAT_CNO_HANDLE, t: DAT_TIMEOUT, e: *mut DAT_EVD_HANDLE) = cno::wait;
    fn cr_query(c: DAT_CR_HANDLE, m: DAT_CR_PARAM_MASK, p: *mut DAT_CR_PARAM) = cr::query;
    fn cr_accept(c: DAT_CR_HANDLE, e: DAT_EP_HANDLE, n: DAT_COUNT, d: DAT_PVOID) = cr::accept;
    fn cr_handoff(c: DAT_CR_HANDLE, q: DAT_CONN_QUAL) = cr::handoff;
    fn evd_create(
        ia: DAT_IA_HANDLE,
        q: DAT_COUNT,
        c: DAT_CNO_HANDLE,
        f: DAT_EVD_FLAGS,
        e: *mut DAT_EVD_HANDLE
    ) = evd20::create;
    fn evd_query(e: DAT_EVD_HANDLE, m: DAT_EVD_PARAM_MASK, p: *mut DAT_EVD_PARAM) = evd20::query;
    fn evd_modify_cno(e: DAT_EVD_HANDLE, c: DAT_CNO_HANDLE) = evd20::modify_cno;
    fn evd_enable(e: DAT_EVD_HANDLE) = evd20::enable;
    fn evd_disable(e: DAT_EVD_HANDLE) = evd20::disable;
    fn evd_resize(e: DAT_EVD_HANDLE, q: DAT_COUNT) = evd20::resize;
    fn evd_free(e: DAT_EVD_HANDLE) = evd20::free;
    fn evd_set_unwaitable(e: DAT_EVD_HANDLE) = evd20::set_unwaitable;
    fn evd_clear_unwaitable(e: DAT_EVD_HANDLE) = evd20::clear_unwaitable;
    fn ep_connect(
        e: DAT_EP_HANDLE,
        a: DAT_IA_ADDRESS_PTR,
        q: DAT_CONN_QUAL,
        t: DAT_TIMEOUT,
        n: DAT_COUNT,
        d: DAT_PVOID,
        s: DAT_QOS,
        f: DAT_CONNECT_FLAGS
    ) = ep20::connect;
    fn ep_dup_connect(
        e: DAT_EP_HANDLE,
        dup: DAT_EP_HANDLE,
        t: DAT_TIMEOUT,
        n: DAT_COUNT,
        d: DAT_PVOID,
        s: DAT_QOS
    ) = ep20::dup_connect;
    fn ep_disconnect(e: DAT_EP_HANDLE, f: DAT_CLOSE_FLAGS) = ep20::disconnect;
    fn ep_get_status(
        e: DAT_EP_HANDLE,
        s: *mut DAT_EP_STATE,
        r: *mut DAT_BOOLEAN,
        q: *mut DAT_BOOLEAN
    ) = ep20::get_status;
    fn ep_free(e: DAT_EP_HANDLE) = ep20::free;
    fn ep_reset(e: DAT_EP_HANDLE) = ep20::reset;
    fn ep_recv_query(e: DAT_EP_HANDLE, n: *mut DAT_COUNT, s: *mut DAT_COUNT) = ep20::recv_query;
    fn ep_set_watermark(e: DAT_EP_HANDLE, s: DAT_COUNT, h: DAT_COUNT) = ep20::set_watermark;
    fn lmr_free(l: DAT_LMR_HANDLE) = lmr::free;
    fn rmr_create(p: DAT_PZ_HANDLE, r: *mut DAT_RMR_HANDLE) = rmr::create;
    fn rmr_free(r: DAT_RMR_HANDLE) = rmr::free;
    fn psp_create(
        ia: DAT_IA_HANDLE,
        q: DAT_CONN_QUAL,
        e: DAT_EVD_HANDLE,
        f: DAT_PSP_FLAGS,
        p: *mut DAT_PSP_HANDLE
    ) = sp::psp_create;
    fn psp_query(p: DAT_PSP_HANDLE, m: DAT_PSP_PARAM_MASK, q: *mut DAT_PSP_PARAM) = sp::psp_query;
    fn psp_free(p: DAT_PSP_HANDLE) = sp::psp_free;
    fn psp_create_any(
        ia: DAT_IA_HANDLE,
        q: *mut DAT_CONN_QUAL,
        e: DAT_EVD_HANDLE,
        f: DAT_PSP_FLAGS,
        p: *mut DAT_PSP_HANDLE
    ) = sp::psp_create_any;
    fn rsp_create(
        ia: DAT_IA_HANDLE,
        q: DAT_CONN_QUAL,
        ep: DAT_EP_HANDLE,
        e: DAT_EVD_HANDLE,
        r: *mut DAT_RSP_HANDLE
    ) = sp::rsp_create;
    fn rsp_query(r: DAT_RSP_HANDLE, m: DAT_RSP_PARAM_MASK, q: *mut DAT_RSP_PARAM) = sp::rsp_query;
    fn rsp_free(r: DAT_RSP_HANDLE) = sp::rsp_free;
    fn pz_create(ia: DAT_IA_HANDLE, p: *mut DAT_PZ_HANDLE) = pz::create;
    fn pz_query(p: DAT_PZ_HANDLE, m: DAT_PZ_PARAM_MASK, q: *mut DAT_PZ_PARAM) = pz::query;
    fn pz_free(p: DAT_PZ_HANDLE) = pz::free;
    fn srq_create(
        ia: DAT_IA_HANDLE,
        p: DAT_PZ_HANDLE,
        a: *mut DAT_SRQ_ATTR,
        s: *mut DAT_SRQ_HANDLE
    ) = srq::create;
    fn srq_free(s: DAT_SRQ_HANDLE) = srq::free;
    fn srq_resize(s: DAT_SRQ_HANDLE, n: DAT_COUNT) = srq::resize;
    fn srq_set_lw(s: DAT_SRQ_HANDLE, n: DAT_COUNT) = srq::set_lw;
}

/// The table libdat.so.1 dispatches through for the `nonthreadsafe`
/// entries, and the first word of every handle of an IA opened through it
/// (its address is the registration).
pub(crate) static PROVIDER12: d12::DAT_PROVIDER = TABLE12;

/// The same for the `threadsafe` entries: [`PROVIDER12`] but for the open
/// function, which marks the IA thread-safe (see `crate::provider`).
pub(crate) static PROVIDER12_TS: d12::DAT_PROVIDER = d12::DAT_PROVIDER {
    ia_open_func: Some(ia::open_threadsafe),
    ..TABLE12
};

const TABLE12: d12::DAT_PROVIDER = d12::DAT_PROVIDER {
    device_name: c"udapl-rs".as_ptr(),
    extension: std::ptr::null_mut(),
    ia_open_func: Some(ia::open),
    ia_query_func: Some(ia::query),
    ia_close_func: Some(ia_close),
    set_consumer_context_func: Some(set_consumer_context),
    get_consumer_context_func: Some(get_consumer_context),
    get_handle_type_func: Some(get_handle_type),
    cno_create_func: Some(cno_create),
    cno_modify_agent_func: Some(cno_modify_agent),
    cno_query_func: Some(misc::cno_query),
    cno_free_func: Some(cno_free),
    cno_wait_func: Some(cno_wait),
    cr_query_func: Some(cr_query),
    cr_accept_func: Some(cr_accept),
    cr_reject_func: Some(misc::cr_reject),
    cr_handoff_func: Some(cr_handoff),
    evd_create_func: Some(evd_create),
    evd_query_func: Some(evd_query),
    evd_modify_cno_func: Some(evd_modify_cno),
    evd_enable_func: Some(evd_enable),
    evd_disable_func: Some(evd_disable),
    evd_wait_func: Some(evd::wait),
    evd_resize_func: Some(evd_resize),
    evd_post_se_func: Some(evd::post_se),
    evd_dequeue_func: Some(evd::dequeue),
    evd_free_func: Some(evd_free),
    ep_create_func: Some(ep::create),
    ep_query_func: Some(ep::query),
    ep_modify_func: Some(ep::modify),
    ep_connect_func: Some(ep_connect),
    ep_dup_connect_func: Some(ep_dup_connect),
    ep_disconnect_func: Some(ep_disconnect),
    ep_post_send_func: Some(ep::post_send),
    ep_post_recv_func: Some(ep::post_recv),
    ep_post_rdma_read_func: Some(ep::post_rdma_read),
    ep_post_rdma_write_func: Some(ep::post_rdma_write),
    ep_get_status_func: Some(ep_get_status),
    ep_free_func: Some(ep_free),
    lmr_create_func: Some(mem::lmr_create),
    lmr_query_func: Some(mem::lmr_query),
    lmr_free_func: Some(lmr_free),
    rmr_create_func: Some(rmr_create),
    rmr_query_func: Some(mem::rmr_query),
    rmr_bind_func: Some(mem::rmr_bind),
    rmr_free_func: Some(rmr_free),
    psp_create_func: Some(psp_create),
    psp_query_func: Some(psp_query),
    psp_free_func: Some(psp_free),
    rsp_create_func: Some(rsp_create),
    rsp_query_func: Some(rsp_query),
    rsp_free_func: Some(rsp_free),
    pz_create_func: Some(pz_create),
    pz_query_func: Some(pz_query),
    pz_free_func: Some(pz_free),
    psp_create_any_func: Some(psp_create_any),
    ep_reset_func: Some(ep_reset),
    evd_set_unwaitable_func: Some(evd_set_unwaitable),
    evd_clear_unwaitable_func: Some(evd_clear_unwaitable),
    lmr_sync_rdma_read_func: Some(mem::lmr_sync_rdma_read),
    lmr_sync_rdma_write_func: Some(mem::lmr_sync_rdma_write),
    ep_create_with_srq_func: Some(ep::create_with_srq),
    ep_recv_query_func: Some(ep_recv_query),
    ep_set_watermark_func: Some(ep_set_watermark),
    srq_create_func: Some(srq_create),
    srq_free_func: Some(srq_free),
    srq_post_recv_func: Some(misc::srq_post_recv),
    srq_query_func: Some(misc::srq_query),
    srq_resize_func: Some(srq_resize),
    srq_set_lw_func: Some(srq_set_lw),
};
