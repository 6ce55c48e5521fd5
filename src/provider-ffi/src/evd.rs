//! EVD: event dispatchers. Core events become DAT_EVENTs here.

use crate::boundary::{boolean, c, guard, h, input, out, sockaddr_of};
use crate::calls;
use daplrs::core::error::{DatError, Param, SubType};
use daplrs::core::evd::{DtoExt, Evd, Event, EventData, EventSlot, UdConnExt};
use daplrs::core::handle::{self, Handle};
use dat_abi::ib_ext::{
    DAT_IB_EXTENSION_EVENT_DATA, DAT_IB_OP_ERR, DAT_IB_UD_CONNECTION_REQUEST_EVENT,
    DAT_IB_UD_CONNECT_REQUEST, DAT_IB_UD_PASSIVE_REMOTE_AH, DAT_IB_UD_REMOTE_AH, DAT_OP_SUCCESS,
};
use dat_abi::*;

/// The extension data of a DAT_IB_DTO_EVENT: DAT_IB_EXTENSION_EVENT_DATA in the event's
/// `event_extension_data`.
fn write_ib_extension_data(dst: &mut DAT_EVENT, ext: &DtoExt) {
    // SAFETY: plain data; all-zero is a valid value.
    let mut data: DAT_IB_EXTENSION_EVENT_DATA = unsafe { std::mem::zeroed() };
    data.type_ = ext.kind;
    data.status = DAT_OP_SUCCESS;
    data.immed_data = ext.imm;
    const _: () = assert!(
        std::mem::size_of::<DAT_IB_EXTENSION_EVENT_DATA>()
            <= std::mem::size_of::<[DAT_UINT64; 8]>()
    );
    // SAFETY: the extension data fits the 64-byte array (asserted above), which is 8-aligned.
    unsafe {
        (dst.event_extension_data.as_mut_ptr() as *mut DAT_IB_EXTENSION_EVENT_DATA).write(data)
    };
}

/// The extension data of a datagram EP's connection event: the type, the remote address
/// handle (our token, the remote QP number, the remote IA address as a sockaddr_in) and the
/// resolution's record as `context`.
fn write_ud_extension_data(dst: &mut DAT_EVENT, ext: &UdConnExt) {
    // SAFETY: plain data; all-zero is a valid value.
    let mut data: DAT_IB_EXTENSION_EVENT_DATA = unsafe { std::mem::zeroed() };
    data.type_ = ext.kind;
    data.status = if ext.kind == DAT_IB_UD_REMOTE_AH || ext.kind == DAT_IB_UD_PASSIVE_REMOTE_AH {
        DAT_OP_SUCCESS
    } else {
        DAT_IB_OP_ERR
    };
    data.remote_ah.ah = ext.ah as usize as *mut std::ffi::c_void;
    data.remote_ah.qpn = ext.qpn;
    if let Some(addr) = ext.address {
        // SAFETY: plain data; all-zero is a valid value.
        let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        sin.sin_family = libc::AF_INET as libc::sa_family_t;
        sin.sin_addr.s_addr = u32::from(addr).to_be();
        const _: () = assert!(
            std::mem::size_of::<libc::sockaddr_in>() <= std::mem::size_of::<DAT_SOCK_ADDR6>()
        );
        // SAFETY: a sockaddr_in fits the sockaddr_in6 (asserted above), whose alignment is at
        // least its own.
        unsafe {
            (&mut data.remote_ah.ia_addr as *mut DAT_SOCK_ADDR6 as *mut libc::sockaddr_in)
                .write(sin)
        };
    }
    data.context = DAT_CONTEXT::from_u64(ext.cm);
    // SAFETY: as in `write_ib_extension_data`.
    unsafe {
        (dst.event_extension_data.as_mut_ptr() as *mut DAT_IB_EXTENSION_EVENT_DATA).write(data)
    };
}

/// The caller's DAT_EVENT as the slot a dequeue or wait puts its event in: converted there
/// as the drain makes it.
struct CEvent<'a> {
    dst: &'a mut DAT_EVENT,
    filled: bool,
}

impl<'a> CEvent<'a> {
    fn new(dst: &'a mut DAT_EVENT) -> CEvent<'a> {
        CEvent { dst, filled: false }
    }
}

impl EventSlot for CEvent<'_> {
    #[inline(always)]
    fn put(&mut self, event: Event) {
        to_c_event(&event, self.dst);
        self.filled = true;
    }
    #[inline(always)]
    fn is_filled(&self) -> bool {
        self.filled
    }
}

/// Writes a core event as the 120-byte DAT_EVENT C expects.
pub(crate) fn to_c_event(ev: &Event, dst: &mut DAT_EVENT) {
    // SAFETY: DAT_EVENT is plain data; all-zero is a valid value.
    *dst = unsafe { std::mem::zeroed() };
    dst.event_number = ev.number;
    dst.evd_handle = c(ev.evd);
    // Each member written in place (the rest of the union stays zero): no whole-union
    // temporary built and copied over it.
    match &ev.data {
        EventData::Dto {
            ep,
            cookie,
            status,
            transferred,
            op,
            rmr_context,
            ext,
        } => {
            if let Some(ext) = ext {
                write_ib_extension_data(dst, ext);
            }
            dst.event_data.dto_completion_event_data = DAT_DTO_COMPLETION_EVENT_DATA {
                ep_handle: c(*ep),
                user_cookie: DAT_CONTEXT::from_u64(*cookie),
                status: *status,
                transfered_length: *transferred,
                operation: *op,
                rmr_context: *rmr_context,
            };
        }
        EventData::RmrBind {
            rmr,
            cookie,
            status,
        } => {
            dst.event_data.rmr_completion_event_data = DAT_RMR_BIND_COMPLETION_EVENT_DATA {
                rmr_handle: c(*rmr),
                user_cookie: DAT_CONTEXT::from_u64(*cookie),
                status: *status,
            }
        }
        EventData::CrArrival {
            sp,
            local_addr,
            conn_qual,
            cr,
        } => {
            if ev.number == DAT_IB_UD_CONNECTION_REQUEST_EVENT {
                write_ib_extension_data(
                    dst,
                    &DtoExt {
                        kind: DAT_IB_UD_CONNECT_REQUEST,
                        imm: 0,
                    },
                );
            }
            dst.event_data.cr_arrival_event_data = DAT_CR_ARRIVAL_EVENT_DATA {
                sp_handle: DAT_SP_HANDLE { psp_handle: c(*sp) },
                local_ia_address_ptr: sockaddr_of(*local_addr),
                conn_qual: *conn_qual,
                cr_handle: c(*cr),
                truncate_flag: boolean(false),
            };
        }
        EventData::UdConnection {
            ep,
            private_data,
            ext,
        } => {
            write_ud_extension_data(dst, ext);
            // The resolution's record keeps this buffer until dat_ib_ud_cm_free.
            dst.event_data.connect_event_data = connect_data(*ep, private_data);
        }
        EventData::Connection { ep, private_data } => {
            // The EP keeps this buffer while the consumer may read it.
            dst.event_data.connect_event_data = connect_data(*ep, private_data);
        }
        EventData::Async { handle, reason } => {
            dst.event_data.asynch_error_event_data = DAT_ASYNCH_ERROR_EVENT_DATA {
                dat_handle: c(*handle),
                reason: *reason as DAT_COUNT,
            }
        }
        EventData::Software { pointer } => {
            dst.event_data.software_event_data = DAT_SOFTWARE_EVENT_DATA {
                pointer: *pointer as DAT_PVOID,
            }
        }
    }
}

/// A connection event's data: the EP and the private data, read in place (its owner keeps
/// the buffer while the consumer may read it).
fn connect_data(ep: Handle, private_data: &[u8]) -> DAT_CONNECTION_EVENT_DATA {
    DAT_CONNECTION_EVENT_DATA {
        ep_handle: c(ep),
        private_data_size: private_data.len() as DAT_COUNT,
        private_data: if private_data.is_empty() {
            std::ptr::null_mut()
        } else {
            private_data.as_ptr() as DAT_PVOID
        },
    }
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
    guard(&calls::EVD_CREATE, || {
        let ia = handle::ia(h(ia))?;
        let cno = if cno.is_null() {
            None
        } else {
            Some(handle::cno(h(cno))?)
        };
        // SAFETY: `evd_handle` is NULL or points to writable memory (the C caller's contract).
        let evd_out = unsafe { out(evd_handle, Param::EvdHandle) }?;
        *evd_out = c(Evd::create(&ia, qlen, cno, flags)?.handle());
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn query(
    evd_handle: DAT_EVD_HANDLE,
    mask: DAT_EVD_PARAM_MASK,
    param: *mut DAT_EVD_PARAM,
) -> DAT_RETURN {
    guard(&calls::EVD_QUERY, || {
        let evd = evd(evd_handle)?;
        // SAFETY: `param` is NULL or points to writable memory (the C caller's contract).
        let param = unsafe { out(param, Param::EvdParam) }?;
        if mask & !DAT_EVD_FIELD_ALL != 0 {
            return Err(DatError::bad(Param::EvdParamMask));
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
    guard(&calls::EVD_MODIFY_CNO, || {
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
    guard(&calls::EVD_ENABLE, || {
        evd(evd_handle)?.set_enabled(true);
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn disable(evd_handle: DAT_EVD_HANDLE) -> DAT_RETURN {
    guard(&calls::EVD_DISABLE, || {
        evd(evd_handle)?.set_enabled(false);
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn set_unwaitable(evd_handle: DAT_EVD_HANDLE) -> DAT_RETURN {
    guard(&calls::EVD_SET_UNWAITABLE, || {
        evd(evd_handle)?.set_waitable(false);
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn clear_unwaitable(evd_handle: DAT_EVD_HANDLE) -> DAT_RETURN {
    guard(&calls::EVD_CLEAR_UNWAITABLE, || {
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
    guard(&calls::EVD_WAIT, || {
        // Held for the wait, as a dequeue holds it: no reference of its own (a free while it
        // waits is refused, DAT_INVALID_STATE, and the slot keeps the EVD alive meanwhile).
        let evd = handle::evd_held(h(evd_handle), SubType::InvalidHandleEvdRequest)?;
        // SAFETY: `event` is NULL or points to writable memory (the C caller's contract).
        let event = unsafe { out(event, Param::Event) }?;
        let more = evd.wait_into(timeout, threshold, &mut CEvent::new(event))?;
        // SAFETY: `nmore` is NULL or points to a writable value of its type (the C caller's
        // contract).
        if let Some(n) = unsafe { nmore.as_mut() } {
            *n = more as DAT_COUNT;
        }
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn dequeue(
    evd_handle: DAT_EVD_HANDLE,
    event: *mut DAT_EVENT,
) -> DAT_RETURN {
    guard(&calls::EVD_DEQUEUE, || {
        let evd = handle::evd_held(h(evd_handle), SubType::InvalidHandleEvdRequest)?;
        // SAFETY: `event` is NULL or points to writable memory (the C caller's contract).
        let event = unsafe { out(event, Param::Event) }?;
        evd.dequeue_into(&mut CEvent::new(event))
    })
}

pub(crate) unsafe extern "C" fn resize(evd_handle: DAT_EVD_HANDLE, qlen: DAT_COUNT) -> DAT_RETURN {
    guard(&calls::EVD_RESIZE, || evd(evd_handle)?.resize(qlen))
}

/// Only software events may be posted; their pointer is all they carry.
pub(crate) unsafe extern "C" fn post_se(
    evd_handle: DAT_EVD_HANDLE,
    event: *const DAT_EVENT,
) -> DAT_RETURN {
    guard(&calls::EVD_POST_SE, || {
        let evd = evd(evd_handle)?;
        // SAFETY: `event` is NULL or points to a readable struct (the C caller's contract).
        let event = unsafe { input(event, Param::Event) }?;
        if event.event_number != DAT_SOFTWARE_EVENT {
            return Err(DatError::bad(Param::Event));
        }
        // SAFETY: a DAT_SOFTWARE_EVENT (checked above): its data is the software event's.
        evd.post_se(unsafe { event.event_data.software_event_data.pointer } as u64)
    })
}

pub(crate) unsafe extern "C" fn free(evd_handle: DAT_EVD_HANDLE) -> DAT_RETURN {
    guard(&calls::EVD_FREE, || evd(evd_handle)?.free())
}
