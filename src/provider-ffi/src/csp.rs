//! CSP: DAT 2.0's Common Service Point, a service point named by a socket
//! address (the IA's address and a port) and a communicator. The rules are
//! the core's (`daplrs::core::sp`); this only translates.

use crate::boundary::{
    bytes, c, guard, h, input, interned_comm, ipv4_port_of, out, sockaddr_port_of,
};
use crate::calls;
use daplrs::core::error::{DatError, Param, SubType};
use daplrs::core::handle;
use daplrs::core::sp::{Comm, Sp};
use dat_abi::*;

/// dat_csp_create(ia, comm, address, evd, &csp).
pub(crate) unsafe extern "C" fn csp_create(
    ia: DAT_IA_HANDLE,
    comm: *mut DAT_COMM,
    address: DAT_IA_ADDRESS_PTR,
    evd: DAT_EVD_HANDLE,
    csp: *mut DAT_CSP_HANDLE,
) -> DAT_RETURN {
    guard(&calls::CSP_CREATE, || {
        let ia = handle::ia(h(ia))?;
        // SAFETY: `comm` is NULL or points to a readable struct (the C caller's contract).
        let comm = unsafe { input(comm, Param::Comm) }?;
        let comm = Comm {
            domain: comm.domain,
            kind: comm.r#type,
            protocol: comm.protocol,
        };
        // SAFETY: `address` is NULL or a sockaddr of its family's size (the C caller's contract).
        let address = unsafe { ipv4_port_of(address, Param::Address) }?;
        let evd = handle::evd(h(evd), SubType::InvalidHandleEvdCr)?;
        // SAFETY: `csp` is NULL or points to writable memory (the C caller's contract).
        let csp = unsafe { out(csp, Param::CspHandle) }?;
        *csp = c(Sp::create_csp(&ia, comm, address, &evd)?.handle());
        Ok(())
    })
}

/// dat_csp_query: every field; `comm` and `address_ptr` point to copies that
/// stay valid for the life of the process.
pub(crate) unsafe extern "C" fn csp_query(
    csp: DAT_CSP_HANDLE,
    mask: DAT_CSP_PARAM_MASK,
    param: *mut DAT_CSP_PARAM,
) -> DAT_RETURN {
    guard(&calls::CSP_QUERY, || {
        let sp = handle::csp(h(csp))?;
        if mask & !DAT_CSP_FIELD_ALL != 0 {
            return Err(DatError::bad(Param::CspParamMask));
        }
        // SAFETY: `param` is NULL or points to writable memory (the C caller's contract).
        let param = unsafe { out(param, Param::CspParam) }?;
        let p = sp.query();
        param.ia_handle = c(p.ia);
        param.comm = p
            .comm
            .map(|cm| interned_comm((cm.domain, cm.kind, cm.protocol)))
            .unwrap_or(std::ptr::null_mut());
        param.address_ptr = sockaddr_port_of(p.address);
        param.evd_handle = c(p.evd);
        Ok(())
    })
}

/// dat_csp_free.
pub(crate) unsafe extern "C" fn csp_free(csp: DAT_CSP_HANDLE) -> DAT_RETURN {
    guard(&calls::CSP_FREE, || handle::csp(h(csp))?.free())
}

/// dat_ep_common_connect(ep, remote_address, timeout, pd_size, pd): the
/// active side toward a CSP, connecting to the address's port itself.
pub(crate) unsafe extern "C" fn ep_common_connect(
    ep: DAT_EP_HANDLE,
    remote: DAT_IA_ADDRESS_PTR,
    timeout: DAT_TIMEOUT,
    pd_size: DAT_COUNT,
    pd: DAT_PVOID,
) -> DAT_RETURN {
    guard(&calls::EP_COMMON_CONNECT, || {
        let ep = handle::ep(h(ep))?;
        // SAFETY: `remote` is NULL or a sockaddr of its family's size (the C caller's contract).
        let remote = unsafe { ipv4_port_of(remote, Param::RemoteIaAddress) }?;
        // SAFETY: `pd` is NULL or points to as many readable bytes as the size says (the C caller's
        // contract).
        let pd = unsafe { bytes(pd, pd_size) }?;
        ep.common_connect(remote, timeout, pd)
    })
}
