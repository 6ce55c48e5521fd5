//! The EVD calls of DAT 1.2 that carry a (48-byte) DAT_EVENT.

use super::convert::event_to_v12;
use crate::evd as evd20;
use dat_abi::{DAT_COUNT, DAT_EVD_HANDLE, DAT_RETURN, DAT_TIMEOUT};
use dat_abi12 as d12;

/// Runs a 2.0 call that fills a 2.0 event, and writes its 1.2 form to
/// `event` on success. A NULL `event` is handed on as NULL, so the 2.0 code
/// refuses it where it always does (after the EVD handle).
unsafe fn with_event(
    event: *mut d12::DAT_EVENT,
    call: impl FnOnce(*mut dat_abi::DAT_EVENT) -> DAT_RETURN,
) -> DAT_RETURN {
    // SAFETY: plain C data; all-zero is a valid value.
    let mut e: dat_abi::DAT_EVENT = unsafe { std::mem::zeroed() };
    let rc = call(if event.is_null() {
        std::ptr::null_mut()
    } else {
        &mut e
    });
    if rc == dat_abi::DAT_SUCCESS {
        // SAFETY: `event` is NULL or points to a writable value of its type (the C caller's
        // contract).
        if let Some(out) = unsafe { event.as_mut() } {
            *out = event_to_v12(&e);
        }
    }
    d12::from_v20(rc)
}

pub(crate) unsafe extern "C" fn wait(
    evd: DAT_EVD_HANDLE,
    timeout: DAT_TIMEOUT,
    threshold: DAT_COUNT,
    event: *mut d12::DAT_EVENT,
    nmore: *mut DAT_COUNT,
) -> DAT_RETURN {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    unsafe { with_event(event, |e| evd20::wait(evd, timeout, threshold, e, nmore)) }
}

pub(crate) unsafe extern "C" fn dequeue(
    evd: DAT_EVD_HANDLE,
    event: *mut d12::DAT_EVENT,
) -> DAT_RETURN {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    unsafe { with_event(event, |e| evd20::dequeue(evd, e)) }
}

/// Only software events may be posted (the 2.0 rule); their pointer is all
/// they carry, the same in both versions.
pub(crate) unsafe extern "C" fn post_se(
    evd: DAT_EVD_HANDLE,
    event: *const d12::DAT_EVENT,
) -> DAT_RETURN {
    // SAFETY: `event` is NULL or points to a readable value of its type (the C caller's contract).
    let Some(e12) = (unsafe { event.as_ref() }) else {
        // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
        return d12::from_v20(unsafe { evd20::post_se(evd, std::ptr::null()) });
    };
    // SAFETY: plain C data; all-zero is a valid value.
    let mut e: dat_abi::DAT_EVENT = unsafe { std::mem::zeroed() };
    e.event_number = e12.event_number;
    e.evd_handle = e12.evd_handle;
    if e12.event_number == d12::DAT_SOFTWARE_EVENT {
        // SAFETY: a software event (checked above): its data is the software event's.
        e.event_data.software_event_data = unsafe { e12.event_data.software_event_data };
    }
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    d12::from_v20(unsafe { evd20::post_se(evd, &e) })
}
