//! EVD: event dispatchers. Core events become DAT_EVENTs here.

use crate::boundary::{boolean, c, guard, h, input, out, sockaddr_of};
use daplrs::core::error::{DatError, SubType};
use daplrs::core::evd::{Evd, Event, EventData};
use daplrs::core::handle;
use dat_abi::*;

/// Writes a core event as the 120-byte DAT_EVENT C expects.
pub(crate) fn to_c_event(ev: &Event, dst: &mut DAT_EVENT) {
    // SAFETY: DAT_EVENT is plain data; all-zero is a valid value.
    *dst = unsafe { std::mem::zeroed() };
    dst.event_number = ev.number;
    dst.evd_handle = c(ev.evd);
    dst.event_data = match &ev.data {
        EventData::Dto {
            ep,
            cookie,
            status,
            transferred,
            op,
            rmr_context,
        } => DAT_EVENT_DATA {
            dto_completion_event_data: DAT_DTO_COMPLETION_EVENT_DATA {
                ep_handle: c(*ep),
                user_cookie: DAT_CONTEXT::from_u64(*cookie),
                status: *status,
                transfered_length: *transferred,
                operation: *op,
                rmr_context: *rmr_context,
            },
        },
        EventData::RmrBind {
            rmr,
            cookie,
            status,
        } => DAT_EVENT_DATA {
            rmr_completion_event_data: DAT_RMR_BIND_COMPLETION_EVENT_DATA {
                rmr_handle: c(*rmr),
                user_cookie: DAT_CONTEXT::from_u64(*cookie),
                status: *status,
            },
        },
        EventData::CrArrival {
            sp,
            local_addr,
            conn_qual,
            cr,
        } => DAT_EVENT_DATA {
            cr_arrival_event_data: DAT_CR_ARRIVAL_EVENT_DATA {
                sp_handle: DAT_SP_HANDLE { psp_handle: c(*sp) },
                local_ia_address_ptr: sockaddr_of(*local_addr),
                conn_qual: *conn_qual,
                cr_handle: c(*cr),
                truncate_flag: boolean(false),
            },
        },
        EventData::Connection { ep, private_data } => DAT_EVENT_DATA {
            connect_event_data: DAT_CONNECTION_EVENT_DATA {
                ep_handle: c(*ep),
                private_data_size: private_data.len() as DAT_COUNT,
                // The EP keeps this buffer while the consumer may read it.
                private_data: if private_data.is_empty() {
                    std::ptr::null_mut()
                } else {
                    private_data.as_ptr() as DAT_PVOID
                },
            },
        },
        EventData::Async { handle, reason } => DAT_EVENT_DATA {
            asynch_error_event_data: DAT_ASYNCH_ERROR_EVENT_DATA {
                dat_handle: c(*handle),
                reason: *reason as DAT_COUNT,
            },
        },
        EventData::Software { pointer } => DAT_EVENT_DATA {
            software_event_data: DAT_SOFTWARE_EVENT_DATA {
                pointer: *pointer as DAT_PVOID,
            },
        },
    };
}

fn evd(handle: DAT_EVD_HANDLE) -> daplrs::core::error::DatResult<std::sync::Arc<Evd>> {
    handle::evd(h(handle), SubType::InvalidHandleEvdRequest)
}

pub(crate) unsafe extern "C" fn create(
    ia: DAT_IA_HANDLE,
    qlen: DAT_COUNT,
    cno: DAT_CNO_HANDLE,
    flags: DAT_EVD_FLAGS,
    evd_handle: *mut DAT_EVD_HANDLE,
) -> DAT_RETURN {
    guard(|| {
        let ia = handle::ia(h(ia))?;
        let cno = if cno.is_null() {
            None
        } else {
            Some(handle::cno(h(cno))?)
        };
        let evd_out = out(evd_handle, 5)?;
        *evd_out = c(Evd::create(&ia, qlen, cno, flags)?.handle());
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn query(
    evd_handle: DAT_EVD_HANDLE,
    mask: DAT_EVD_PARAM_MASK,
    param: *mut DAT_EVD_PARAM,
) -> DAT_RETURN {
    guard(|| {
        let evd = evd(evd_handle)?;
        let param = out(param, 3)?;
        if mask & !DAT_EVD_FIELD_ALL != 0 {
            return Err(DatError::invalid_arg(2));
        }
        let p = evd.query();
        param.ia_handle = c(p.ia);
        param.evd_qlen = p.qlen as DAT_COUNT;
        param.evd_state = p.state;
        param.cno_handle = c(p.cno);
        param.evd_flags = p.flags;
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn modify_cno(
    evd_handle: DAT_EVD_HANDLE,
    cno: DAT_CNO_HANDLE,
) -> DAT_RETURN {
    guard(|| {
        let evd = evd(evd_handle)?;
        let cno = if cno.is_null() {
            None
        } else {
            Some(handle::cno(h(cno))?)
        };
        evd.modify_cno(cno)
    })
}

pub(crate) unsafe extern "C" fn enable(evd_handle: DAT_EVD_HANDLE) -> DAT_RETURN {
    guard(|| {
        evd(evd_handle)?.set_enabled(true);
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn disable(evd_handle: DAT_EVD_HANDLE) -> DAT_RETURN {
    guard(|| {
        evd(evd_handle)?.set_enabled(false);
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn set_unwaitable(evd_handle: DAT_EVD_HANDLE) -> DAT_RETURN {
    guard(|| {
        evd(evd_handle)?.set_waitable(false);
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn clear_unwaitable(evd_handle: DAT_EVD_HANDLE) -> DAT_RETURN {
    guard(|| {
        evd(evd_handle)?.set_waitable(true);
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn wait(
    evd_handle: DAT_EVD_HANDLE,
    timeout: DAT_TIMEOUT,
    threshold: DAT_COUNT,
    event: *mut DAT_EVENT,
    nmore: *mut DAT_COUNT,
) -> DAT_RETURN {
    guard(|| {
        let evd = evd(evd_handle)?;
        let event = out(event, 4)?;
        let (ev, more) = evd.wait(timeout, threshold)?;
        to_c_event(&ev, event);
        if let Some(n) = nmore.as_mut() {
            *n = more as DAT_COUNT;
        }
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn dequeue(
    evd_handle: DAT_EVD_HANDLE,
    event: *mut DAT_EVENT,
) -> DAT_RETURN {
    guard(|| {
        let evd = evd(evd_handle)?;
        let event = out(event, 2)?;
        let ev = evd.dequeue()?;
        to_c_event(&ev, event);
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn resize(evd_handle: DAT_EVD_HANDLE, qlen: DAT_COUNT) -> DAT_RETURN {
    guard(|| evd(evd_handle)?.resize(qlen))
}

/// Only software events may be posted; their pointer is all they carry.
pub(crate) unsafe extern "C" fn post_se(
    evd_handle: DAT_EVD_HANDLE,
    event: *const DAT_EVENT,
) -> DAT_RETURN {
    guard(|| {
        let evd = evd(evd_handle)?;
        let event = input(event, 2)?;
        if event.event_number != DAT_SOFTWARE_EVENT {
            return Err(DatError::invalid_arg(2));
        }
        evd.post_se(event.event_data.software_event_data.pointer as u64)
    })
}

pub(crate) unsafe extern "C" fn free(evd_handle: DAT_EVD_HANDLE) -> DAT_RETURN {
    guard(|| evd(evd_handle)?.free())
}
