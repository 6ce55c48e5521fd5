//! dat_extension_op: the InfiniBand extensions of DAT 2.0 (OFED's <dat2/dat_ib_extensions.h>,
//! interface 2.0.9). Each operation's C macro passes its arguments to dat_extension_op in a
//! fixed order; they are read here, in that order, and handed to the core.

use crate::boundary::{guard, h, input, out, IovBuf, VaArgs};
use crate::calls::{self, Call};
use crate::ia;
use daplrs::backend::Sge;
use daplrs::core::counters;
use daplrs::core::ep::{Ep, IovKind, RemoteBuffer};
use daplrs::core::error::{DatError, DatResult, Param};
use daplrs::core::ext::{self, Atomic};
use daplrs::core::handle::{self, HandleKind};
use dat_abi::ib_ext::*;
use dat_abi::*;
use std::ffi::c_char;
use std::sync::Arc;

/// The argument list of the IB extension call `op` (a C macro over dat_extension_op).
fn call_of(op: DAT_EXTENDED_OP) -> &'static Call {
    match op as DAT_IB_OP {
        DAT_IB_RDMA_WRITE_IMMED_OP => &calls::IB_POST_RDMA_WRITE_IMMED,
        DAT_IB_FETCH_AND_ADD_OP => &calls::IB_POST_FETCH_AND_ADD,
        DAT_IB_CMP_AND_SWAP_OP => &calls::IB_POST_CMP_AND_SWAP,
        DAT_IB_QUERY_COUNTERS_OP => &calls::IB_QUERY_COUNTERS,
        DAT_IB_PRINT_COUNTERS_OP => &calls::IB_PRINT_COUNTERS,
        DAT_IB_OPEN_QUERY_OP => &calls::IB_OPEN_QUERY,
        DAT_IB_CLOSE_QUERY_OP => &calls::IB_CLOSE_QUERY,
        DAT_IB_UD_SEND_OP => &calls::IB_POST_SEND_UD,
        DAT_IB_UD_AH_FREE_OP => &calls::IB_UD_AH_FREE,
        DAT_IB_UD_CM_FREE_OP => &calls::IB_UD_CM_FREE,
        _ => &calls::EXTENSION_OP,
    }
}

/// The provider table's `handle_extendedop_func`.
pub(crate) unsafe extern "C" fn extendedop(
    handle: DAT_HANDLE,
    op: DAT_EXTENDED_OP,
    args: va_list,
) -> DAT_RETURN {
    guard(call_of(op), || {
        // SAFETY: `args` is the registry's va_list for this operation (our caller's contract).
        let mut args = unsafe { VaArgs::new(args) };
        match op as DAT_IB_OP {
            // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
            DAT_IB_RDMA_WRITE_IMMED_OP => unsafe { rdma_write_immed(handle, &mut args) },
            // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
            DAT_IB_FETCH_AND_ADD_OP | DAT_IB_CMP_AND_SWAP_OP => unsafe {
                atomic(handle, op, &mut args)
            },
            // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
            DAT_IB_QUERY_COUNTERS_OP => unsafe { query_counters(handle, &mut args) },
            // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
            DAT_IB_PRINT_COUNTERS_OP => unsafe { print_counters(handle, &mut args) },
            // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
            DAT_IB_OPEN_QUERY_OP => unsafe { open_query(handle as *const c_char, &mut args) },
            // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
            DAT_IB_CLOSE_QUERY_OP => unsafe { ia_close(handle) },
            // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
            DAT_IB_UD_SEND_OP => unsafe { post_send_ud(handle, &mut args) },
            // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
            DAT_IB_UD_AH_FREE_OP => unsafe { ud_ah_free(handle, &mut args) },
            // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
            DAT_IB_UD_CM_FREE_OP => unsafe { ud_cm_free(handle, &mut args) },
            // Collectives and the counter sampling of a port are not provided.
            _ => Err(DatError::not_implemented()),
        }
    })
}

fn ep(handle: DAT_HANDLE) -> DatResult<Arc<Ep>> {
    handle::ep(h(handle))
}

unsafe fn remote(r: *const DAT_RMR_TRIPLET) -> DatResult<RemoteBuffer> {
    // SAFETY: `r` is NULL or points to a readable struct (the C caller's contract).
    let r = unsafe { input(r, Param::RemoteIov) }?;
    Ok(RemoteBuffer {
        address: r.virtual_address,
        length: r.segment_length,
        rmr_context: r.rmr_context,
    })
}

/// dat_ib_post_rdma_write_immed(ep, segments, lmr_triplets, cookie, rmr_triplet, immed, flags).
unsafe fn rdma_write_immed(handle: DAT_HANDLE, a: &mut VaArgs) -> DatResult<()> {
    let ep = ep(handle)?;
    // SAFETY: dat_extension_op's caller passed this operation's arguments (its C macro's contract).
    let segments = unsafe { a.u32() }? as DAT_COUNT;
    // SAFETY: dat_extension_op's caller passed this operation's arguments (its C macro's contract).
    let iov = unsafe { a.ptr::<DAT_LMR_TRIPLET>() }?;
    // SAFETY: dat_extension_op's caller passed this operation's arguments (its C macro's contract).
    let cookie = unsafe { a.u64() }?;
    // SAFETY: dat_extension_op's caller passed this operation's arguments (its C macro's contract).
    let rmr = unsafe { a.ptr::<DAT_RMR_TRIPLET>() }?;
    // SAFETY: dat_extension_op's caller passed this operation's arguments (its C macro's contract).
    let imm = unsafe { a.u32() }?;
    // SAFETY: dat_extension_op's caller passed this operation's arguments (its C macro's contract).
    let flags = unsafe { a.u32() }?;
    let mut buf = IovBuf::new();
    // SAFETY: `iov` is NULL or points to as many readable triplets as the count says (the C
    // caller's contract).
    let iov = unsafe { buf.read(iov, segments, ep.iov_limit(IovKind::RdmaWrite)) }?;
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    ep.post_rdma_write_immed(iov, cookie, unsafe { remote(rmr) }?, imm, flags)
}

/// dat_ib_post_send_ud(ep, segments, lmr_triplets, addr_handle, cookie, flags).
unsafe fn post_send_ud(handle: DAT_HANDLE, a: &mut VaArgs) -> DatResult<()> {
    let ep = ep(handle)?;
    // SAFETY: dat_extension_op's caller passed this operation's arguments (its C macro's contract).
    let segments = unsafe { a.u32() }? as DAT_COUNT;
    // SAFETY: dat_extension_op's caller passed this operation's arguments (its C macro's contract).
    let iov = unsafe { a.ptr::<DAT_LMR_TRIPLET>() }?;
    // SAFETY: dat_extension_op's caller passed this operation's arguments (its C macro's contract).
    let ah = unsafe { a.ptr::<DAT_IB_ADDR_HANDLE>() }?;
    // SAFETY: dat_extension_op's caller passed this operation's arguments (its C macro's contract).
    let cookie = unsafe { a.u64() }?;
    // SAFETY: dat_extension_op's caller passed this operation's arguments (its C macro's contract).
    let flags = unsafe { a.u32() }?;
    let mut buf = IovBuf::new();
    // SAFETY: `iov` is NULL or points to as many readable triplets as the count says (the C
    // caller's contract).
    let iov = unsafe { buf.read(iov, segments, ep.iov_limit(IovKind::Request)) }?;
    // SAFETY: `ah` is NULL or points to a readable struct (the C caller's contract).
    let ah = unsafe { input(ah, Param::AddressHandle) }?;
    ep.post_send_ud(iov, ah.ah as usize as u64, ah.qpn, cookie, flags)
}

/// dat_ib_ud_ah_free(ep, addr_handle).
unsafe fn ud_ah_free(handle: DAT_HANDLE, a: &mut VaArgs) -> DatResult<()> {
    let ep = ep(handle)?;
    // SAFETY: the next argument is the operation's address handle pointer, NULL or readable
    // (its C macro's contract).
    let ah = unsafe { input(a.ptr::<DAT_IB_ADDR_HANDLE>()?, Param::AddressHandle) }?;
    ep.ud_ah_free(ah.ah as usize as u64)
}

/// dat_ib_ud_cm_free(ep, context): the context (a DAT_CONTEXT, one 8-byte slot) of a
/// datagram connection event.
unsafe fn ud_cm_free(handle: DAT_HANDLE, a: &mut VaArgs) -> DatResult<()> {
    let ep = ep(handle)?;
    // SAFETY: dat_extension_op's caller passed this operation's arguments (its C macro's contract).
    ep.ud_cm_free(unsafe { a.u64() }?)
}

/// dat_ib_post_fetch_and_add(ep, add, lmr_triplet, cookie, rmr_triplet, flags) and
/// dat_ib_post_cmp_and_swap(ep, compare, swap, lmr_triplet, cookie, rmr_triplet, flags).
unsafe fn atomic(handle: DAT_HANDLE, op: DAT_EXTENDED_OP, a: &mut VaArgs) -> DatResult<()> {
    let ep = ep(handle)?;
    let atomic = if op as DAT_IB_OP == DAT_IB_FETCH_AND_ADD_OP {
        Atomic::FetchAdd {
            // SAFETY: dat_extension_op's caller passed this operation's arguments (its C
            // macro's contract).
            add: unsafe { a.u64() }?,
        }
    } else {
        // SAFETY: dat_extension_op's caller passed this operation's arguments (its C macro's
        // contract).
        let compare = unsafe { a.u64() }?;
        // SAFETY: dat_extension_op's caller passed this operation's arguments (its C macro's
        // contract).
        let swap = unsafe { a.u64() }?;
        Atomic::CmpSwap { compare, swap }
    };
    // SAFETY: the next argument is the operation's local triplet pointer, NULL or readable
    // (its C macro's contract).
    let local = unsafe { input(a.ptr::<DAT_LMR_TRIPLET>()?, Param::LocalIov) }?;
    // SAFETY: dat_extension_op's caller passed this operation's arguments (its C macro's contract).
    let cookie = unsafe { a.u64() }?;
    // SAFETY: the next argument is the operation's remote triplet pointer, NULL or readable
    // (its C macro's contract).
    let rmr = unsafe { remote(a.ptr::<DAT_RMR_TRIPLET>()?) }?;
    // SAFETY: dat_extension_op's caller passed this operation's arguments (its C macro's contract).
    let flags = unsafe { a.u32() }?;
    let local = Sge {
        addr: local.virtual_address,
        length: local.segment_length,
        lkey: local.lmr_context,
    };
    ep.post_atomic(atomic, &local, cookie, rmr, flags)
}

/// The object whose counters a handle names (IA, EP or EVD).
fn counted(handle: DAT_HANDLE) -> DatResult<handle::Object> {
    handle::lookup_any(h(handle))
        .filter(|o| matches!(o.kind(), HandleKind::Ia | HandleKind::Ep | HandleKind::Evd))
        .ok_or(DatError::bad_handle(Param::Handle))
}

/// dat_query_counters(handle, counter, u64_array_out, reset): with counter =
/// DCNT_{IA,EP,EVD}_ALL_COUNTERS the whole array, else the one counter into its first element.
unsafe fn query_counters(handle: DAT_HANDLE, a: &mut VaArgs) -> DatResult<()> {
    let object = counted(handle)?;
    // SAFETY: dat_extension_op's caller passed this operation's arguments (its C macro's contract).
    let counter = unsafe { a.u32() }? as usize;
    // SAFETY: dat_extension_op's caller passed this operation's arguments (its C macro's contract).
    let dst = unsafe { a.ptr::<DAT_UINT64>() }?;
    // SAFETY: dat_extension_op's caller passed this operation's arguments (its C macro's contract).
    let reset = unsafe { a.u32() }? != 0;
    if dst.is_null() {
        return Err(DatError::bad(Param::CountersOut));
    }
    let values =
        ext::query_counters(&object, counter, reset).ok_or(DatError::bad(Param::Counter))?;
    // SAFETY: `dst` is NULL or points to writable memory (the C caller's contract).
    let dst = unsafe { out(dst, Param::CountersOut) }? as *mut DAT_UINT64;
    for (i, v) in values.iter().enumerate() {
        // SAFETY: the caller's array holds DCNT_*_ALL_COUNTERS values for the whole set, one
        // for a single counter (the DAT IB extension's contract).
        unsafe { dst.add(i).write(*v) };
    }
    Ok(())
}

/// dat_print_counters(handle, counter, reset): the counters on stdout, one line.
unsafe fn print_counters(handle: DAT_HANDLE, a: &mut VaArgs) -> DatResult<()> {
    let object = counted(handle)?;
    // SAFETY: dat_extension_op's caller passed this operation's arguments (its C macro's contract).
    let counter = unsafe { a.u32() }? as usize;
    // SAFETY: dat_extension_op's caller passed this operation's arguments (its C macro's contract).
    let reset = unsafe { a.u32() }? != 0;
    let values =
        ext::query_counters(&object, counter, reset).ok_or(DatError::bad(Param::Counter))?;
    let line: Vec<String> = values.iter().map(|v| v.to_string()).collect();
    println!(
        "udapl-rs {} counters: {}",
        ext::counter_owner_name(&object),
        line.join(" ")
    );
    Ok(())
}

/// dat_ib_open_query(name, &ia, ia_mask, &ia_attr, provider_mask, &provider_attr): opens the
/// IA named `name` and queries it in one call; the registry passes the name as the handle.
/// The IA handle returned is ours (the registry does not map it): dat_ib_close_query closes it.
unsafe fn open_query(name: *const c_char, a: &mut VaArgs) -> DatResult<()> {
    // SAFETY: dat_extension_op's caller passed this operation's arguments (its C macro's contract).
    let ia_out = unsafe { a.ptr::<DAT_IA_HANDLE>() }?;
    // SAFETY: dat_extension_op's caller passed this operation's arguments (its C macro's contract).
    let ia_mask = unsafe { a.u64() }?;
    // SAFETY: dat_extension_op's caller passed this operation's arguments (its C macro's contract).
    let ia_attr = unsafe { a.ptr::<DAT_IA_ATTR>() }?;
    // SAFETY: dat_extension_op's caller passed this operation's arguments (its C macro's contract).
    let provider_mask = unsafe { a.u64() }?;
    // SAFETY: dat_extension_op's caller passed this operation's arguments (its C macro's contract).
    let provider_attr = unsafe { a.ptr::<DAT_PROVIDER_ATTR>() }?;
    // SAFETY: `ia_out` is NULL or points to writable memory (the C caller's contract).
    let ia_out = unsafe { out(ia_out, Param::IaHandle) }?;
    let mut async_evd: DAT_EVD_HANDLE = std::ptr::null_mut();
    let mut ia_handle: DAT_IA_HANDLE = std::ptr::null_mut();
    // Registries look the open-query provider up as a `nonthreadsafe`
    // entry (ours and OFED's libdat2 alike): open that entry.
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    unsafe { ia::open_ia(name, 8, &mut async_evd, &mut ia_handle, false) }?;
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    let queried = unsafe {
        ia::query_ia(
            ia_handle,
            std::ptr::null_mut(),
            ia_mask,
            ia_attr,
            provider_mask,
            provider_attr,
        )
    };
    if let Err(e) = queried {
        // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
        let _ = unsafe { ia::close_ia(ia_handle, DAT_CLOSE_ABRUPT_FLAG) };
        return Err(e);
    }
    *ia_out = ia_handle;
    Ok(())
}

/// dat_ib_close_query(ia).
unsafe fn ia_close(handle: DAT_HANDLE) -> DatResult<()> {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    unsafe { ia::close_ia(handle, DAT_CLOSE_ABRUPT_FLAG) }
}

/// The counters' array lengths, and the datagram service's numbers, are the ABI's.
const _: () = {
    use daplrs::core::consts::ib_ext as core_ext;
    assert!(core_ext::SERVICE_TYPE_UD == DAT_IB_SERVICE_TYPE_UD);
    assert!(core_ext::UD_CONNECTION_REQUEST_EVENT == DAT_IB_UD_CONNECTION_REQUEST_EVENT);
    assert!(core_ext::UD_CONNECTION_EVENT_ESTABLISHED == DAT_IB_UD_CONNECTION_EVENT_ESTABLISHED);
    assert!(core_ext::UD_CONNECTION_REJECT_EVENT == DAT_IB_UD_CONNECTION_REJECT_EVENT);
    assert!(core_ext::UD_CONNECTION_ERROR_EVENT == DAT_IB_UD_CONNECTION_ERROR_EVENT);
    assert!(core_ext::TYPE_UD_CONNECT_REQUEST == DAT_IB_UD_CONNECT_REQUEST);
    assert!(core_ext::TYPE_UD_REMOTE_AH == DAT_IB_UD_REMOTE_AH);
    assert!(core_ext::TYPE_UD_PASSIVE_REMOTE_AH == DAT_IB_UD_PASSIVE_REMOTE_AH);
    assert!(core_ext::TYPE_UD_SEND == DAT_IB_UD_SEND);
    assert!(core_ext::TYPE_UD_RECV == DAT_IB_UD_RECV);
    assert!(core_ext::TYPE_UD_CONNECT_REJECT == DAT_IB_UD_CONNECT_REJECT);
    assert!(core_ext::TYPE_UD_CONNECT_ERROR == DAT_IB_UD_CONNECT_ERROR);
    assert!(core_ext::DTO_SEND_UD == DAT_IB_DTO_SEND_UD);
    assert!(core_ext::DTO_RECV_UD == DAT_IB_DTO_RECV_UD);
    assert!(counters::ia::ALL == DCNT_IA_ALL_COUNTERS as usize);
    assert!(counters::ep::ALL == DCNT_EP_ALL_COUNTERS as usize);
    assert!(counters::evd::ALL == DCNT_EVD_ALL_COUNTERS as usize);
};
