//! The EP calls of DAT 1.2 whose C shapes differ from 2.0's: 1.2's
//! DAT_EP_ATTR and DAT_EP_PARAM, and 24-byte triplets in every post.

use super::convert::{ep_attr_to_v20, ep_mask_to_v20, ep_param_to_v12, ep_param_to_v20};
use super::{calls, guard12};
use crate::ep as ep20;
use dat_abi::{
    DAT_COMPLETION_FLAGS, DAT_COUNT, DAT_DTO_COOKIE, DAT_EP_HANDLE, DAT_EP_PARAM_MASK,
    DAT_EVD_HANDLE, DAT_IA_HANDLE, DAT_PZ_HANDLE, DAT_RETURN, DAT_SRQ_HANDLE,
};
use dat_abi12 as d12;

/// A 1.2 EP attribute struct as 2.0's, or NULL for NULL (the provider's
/// defaults).
unsafe fn attr_v20(attr: *const d12::DAT_EP_ATTR) -> Option<dat_abi::DAT_EP_ATTR> {
    // SAFETY: `attr` is NULL or points to a readable value of its type (the C caller's contract).
    unsafe { attr.as_ref() }.map(ep_attr_to_v20)
}

fn ptr_of<T>(v: &Option<T>) -> *const T {
    v.as_ref().map_or(std::ptr::null(), |v| v as *const T)
}

pub(crate) unsafe extern "C" fn create(
    ia: DAT_IA_HANDLE,
    pz: DAT_PZ_HANDLE,
    recv_evd: DAT_EVD_HANDLE,
    request_evd: DAT_EVD_HANDLE,
    connect_evd: DAT_EVD_HANDLE,
    attr: *const d12::DAT_EP_ATTR,
    ep_out: *mut DAT_EP_HANDLE,
) -> DAT_RETURN {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    let attr = unsafe { attr_v20(attr) };
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    d12::from_v20(unsafe {
        ep20::create(
            ia,
            pz,
            recv_evd,
            request_evd,
            connect_evd,
            ptr_of(&attr),
            ep_out,
        )
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
    attr: *const d12::DAT_EP_ATTR,
    ep_out: *mut DAT_EP_HANDLE,
) -> DAT_RETURN {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    let attr = unsafe { attr_v20(attr) };
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    d12::from_v20(unsafe {
        ep20::create_with_srq(
            ia,
            pz,
            recv_evd,
            request_evd,
            connect_evd,
            srq,
            ptr_of(&attr),
            ep_out,
        )
    })
}

pub(crate) unsafe extern "C" fn query(
    ep: DAT_EP_HANDLE,
    mask: DAT_EP_PARAM_MASK,
    param: *mut d12::DAT_EP_PARAM,
) -> DAT_RETURN {
    // SAFETY: plain C data; all-zero is a valid value.
    let mut p: dat_abi::DAT_EP_PARAM = unsafe { std::mem::zeroed() };
    let p_ptr = if param.is_null() {
        std::ptr::null_mut()
    } else {
        &mut p as *mut _
    };
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    let rc = unsafe { ep20::query(ep, ep_mask_to_v20(mask), p_ptr) };
    if rc == dat_abi::DAT_SUCCESS {
        // SAFETY: `param` is NULL or points to a writable value of its type (the C caller's
        // contract).
        if let Some(out) = unsafe { param.as_mut() } {
            *out = ep_param_to_v12(&p);
        }
    }
    d12::from_v20(rc)
}

pub(crate) unsafe extern "C" fn modify(
    ep: DAT_EP_HANDLE,
    mask: DAT_EP_PARAM_MASK,
    param: *const d12::DAT_EP_PARAM,
) -> DAT_RETURN {
    // SAFETY: `param` is NULL or points to a readable value of its type (the C caller's contract).
    let p = unsafe { param.as_ref() }.map(ep_param_to_v20);
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    d12::from_v20(unsafe { ep20::modify(ep, ep_mask_to_v20(mask), ptr_of(&p)) })
}

pub(crate) unsafe extern "C" fn post_send(
    ep: DAT_EP_HANDLE,
    n: DAT_COUNT,
    iov: *mut d12::DAT_LMR_TRIPLET,
    cookie: DAT_DTO_COOKIE,
    flags: DAT_COMPLETION_FLAGS,
) -> DAT_RETURN {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    guard12(&calls::EP_POST_SEND, || unsafe {
        ep20::post_send_iov(ep, n, iov as *const d12::DAT_LMR_TRIPLET, cookie, flags)
    })
}

pub(crate) unsafe extern "C" fn post_recv(
    ep: DAT_EP_HANDLE,
    n: DAT_COUNT,
    iov: *mut d12::DAT_LMR_TRIPLET,
    cookie: DAT_DTO_COOKIE,
    flags: DAT_COMPLETION_FLAGS,
) -> DAT_RETURN {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    guard12(&calls::EP_POST_RECV, || unsafe {
        ep20::post_recv_iov(ep, n, iov as *const d12::DAT_LMR_TRIPLET, cookie, flags)
    })
}

pub(crate) unsafe extern "C" fn post_rdma_read(
    ep: DAT_EP_HANDLE,
    n: DAT_COUNT,
    iov: *mut d12::DAT_LMR_TRIPLET,
    cookie: DAT_DTO_COOKIE,
    remote: *const d12::DAT_RMR_TRIPLET,
    flags: DAT_COMPLETION_FLAGS,
) -> DAT_RETURN {
    guard12(&calls::EP_POST_RDMA_READ, || {
        // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
        unsafe {
            ep20::post_rdma_read_iov(
                ep,
                n,
                iov as *const d12::DAT_LMR_TRIPLET,
                cookie,
                remote,
                flags,
            )
        }
    })
}

pub(crate) unsafe extern "C" fn post_rdma_write(
    ep: DAT_EP_HANDLE,
    n: DAT_COUNT,
    iov: *mut d12::DAT_LMR_TRIPLET,
    cookie: DAT_DTO_COOKIE,
    remote: *const d12::DAT_RMR_TRIPLET,
    flags: DAT_COMPLETION_FLAGS,
) -> DAT_RETURN {
    guard12(&calls::EP_POST_RDMA_WRITE, || {
        // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
        unsafe {
            ep20::post_rdma_write_iov(
                ep,
                n,
                iov as *const d12::DAT_LMR_TRIPLET,
                cookie,
                remote,
                flags,
            )
        }
    })
}
