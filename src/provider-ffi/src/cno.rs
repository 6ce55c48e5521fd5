//! CNO: notification objects shared by EVDs, with an OS wait proxy agent
//! and a file descriptor a program can poll.

use crate::boundary::{c, guard, h, out};
use crate::calls;
use daplrs::core::cno::{Cno, ProxyAgent};
use daplrs::core::error::{DatError, Param};
use daplrs::core::handle::{self, Handle};
use dat_abi::*;
use std::sync::Arc;

/// The consumer's agent as the core calls it. The instance pointer is the
/// consumer's; we only hand it back.
struct CAgent {
    func: unsafe extern "C" fn(DAT_PVOID, DAT_EVD_HANDLE),
    instance: usize,
}

fn agent_of(a: &DAT_OS_WAIT_PROXY_AGENT) -> (Option<ProxyAgent>, (u64, u64)) {
    let words = (
        a.instance_data as u64,
        a.proxy_agent_func.map(|f| f as usize as u64).unwrap_or(0),
    );
    let agent = a.proxy_agent_func.map(|func| {
        let ca = CAgent {
            func,
            instance: a.instance_data as usize,
        };
        Arc::new(move |evd: Handle| {
            // SAFETY: the consumer registered this function for exactly
            // this call: (instance_data, triggering EVD).
            unsafe { (ca.func)(ca.instance as DAT_PVOID, c(evd)) }
        }) as ProxyAgent
    });
    (agent, words)
}

pub(crate) unsafe extern "C" fn create(
    ia: DAT_IA_HANDLE,
    agent: DAT_OS_WAIT_PROXY_AGENT,
    cno: *mut DAT_CNO_HANDLE,
) -> DAT_RETURN {
    guard(&calls::CNO_CREATE, || {
        let ia = handle::ia(h(ia))?;
        // SAFETY: `cno` is NULL or points to writable memory (the C caller's contract).
        let cno_out = unsafe { out(cno, Param::CnoHandle) }?;
        let (agent, words) = agent_of(&agent);
        *cno_out = c(Cno::create(&ia, agent, words)?.handle());
        Ok(())
    })
}

/// A CNO whose readiness is a pollable fd (readable once triggered).
pub(crate) unsafe extern "C" fn fd_create(
    ia: DAT_IA_HANDLE,
    fd: *mut DAT_FD,
    cno: *mut DAT_CNO_HANDLE,
) -> DAT_RETURN {
    guard(&calls::CNO_FD_CREATE, || {
        let ia = handle::ia(h(ia))?;
        // SAFETY: `fd` is NULL or points to writable memory (the C caller's contract).
        let fd_out = unsafe { out(fd, Param::Fd) }?;
        // SAFETY: `cno` is NULL or points to writable memory (the C caller's contract).
        let cno_out = unsafe { out(cno, Param::CnoHandle) }?;
        let cno = Cno::create(&ia, None, (0, 0))?;
        *fd_out = cno.fd();
        *cno_out = c(cno.handle());
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn modify_agent(
    cno: DAT_CNO_HANDLE,
    agent: DAT_OS_WAIT_PROXY_AGENT,
) -> DAT_RETURN {
    guard(&calls::CNO_MODIFY_AGENT, || {
        let cno = handle::cno(h(cno))?;
        let (agent, words) = agent_of(&agent);
        cno.modify_agent(agent, words);
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn query(
    cno: DAT_CNO_HANDLE,
    mask: DAT_CNO_PARAM_MASK,
    param: *mut DAT_CNO_PARAM,
) -> DAT_RETURN {
    guard(&calls::CNO_QUERY, || {
        let cno = handle::cno(h(cno))?;
        // SAFETY: `param` is NULL or points to writable memory (the C caller's contract).
        let param = unsafe { out(param, Param::CnoParam) }?;
        if mask & !(DAT_CNO_FIELD_ALL | DAT_CNO_FIELD_PROXY) != 0 {
            return Err(DatError::bad(Param::CnoParamMask));
        }
        let p = cno.query();
        param.ia_handle = c(p.ia);
        let (instance, func) = p.agent_words;
        if func != 0 {
            param.proxy_type = DAT_PROXY_TYPE_AGENT;
            param.proxy.agent = DAT_OS_WAIT_PROXY_AGENT {
                instance_data: instance as DAT_PVOID,
                // SAFETY: `func` is the function pointer the consumer gave us.
                proxy_agent_func: Some(unsafe {
                    std::mem::transmute::<usize, unsafe extern "C" fn(DAT_PVOID, DAT_EVD_HANDLE)>(
                        func as usize,
                    )
                }),
            };
        } else {
            param.proxy_type = DAT_PROXY_TYPE_FD;
            param.proxy.fd = cno.fd();
        }
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn free(cno: DAT_CNO_HANDLE) -> DAT_RETURN {
    guard(&calls::CNO_FREE, || handle::cno(h(cno))?.free())
}

pub(crate) unsafe extern "C" fn wait(
    cno: DAT_CNO_HANDLE,
    timeout: DAT_TIMEOUT,
    evd: *mut DAT_EVD_HANDLE,
) -> DAT_RETURN {
    guard(&calls::CNO_WAIT, || {
        let cno = handle::cno(h(cno))?;
        // SAFETY: `evd` is NULL or points to writable memory (the C caller's contract).
        let evd_out = unsafe { out(evd, Param::EvdHandle) }?;
        *evd_out = c(cno.wait(timeout)?);
        Ok(())
    })
}

/// dat_cno_trigger: returns the EVD that triggered the CNO, without
/// waiting (DAT_QUEUE_EMPTY when none has).
pub(crate) unsafe extern "C" fn trigger(
    cno: DAT_CNO_HANDLE,
    evd: *mut DAT_EVD_HANDLE,
) -> DAT_RETURN {
    guard(&calls::CNO_TRIGGER, || {
        let cno = handle::cno(h(cno))?;
        // SAFETY: `evd` is NULL or points to writable memory (the C caller's contract).
        let evd_out = unsafe { out(evd, Param::EvdHandle) }?;
        match cno.wait(0) {
            Ok(e) => {
                *evd_out = c(e);
                Ok(())
            }
            Err(e) if e == DatError::timeout() => Err(DatError::queue_empty()),
            Err(e) => Err(e),
        }
    })
}
