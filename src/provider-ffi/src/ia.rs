//! IA: open, query, close, and the calls that take a handle of any type.

use crate::boundary::{boolean, c, count, cstr_into, guard, h, out, sockaddr_of};
use crate::calls;
use crate::provider::{dispatch_is_thread_safe, entry, table, table_for_ia_name};
use daplrs::core::error::{DatError, DatResult, ErrorType, Param, SubType};
use daplrs::core::handle;
use daplrs::core::ia::{AsyncEvd, Ia};
use daplrs::device::open_device;
use dat_abi::*;
use parking_lot::Mutex;
use std::ffi::{c_char, CStr, CString};
use std::sync::{Arc, Weak};

/// ia_open_func of the `nonthreadsafe` entries: `name` is the dat.conf
/// entry; its ia_params choose the backend and interface. A NULL
/// `*async_evd` asks for an async EVD of `qlen` events, created here and
/// returned.
pub(crate) unsafe extern "C" fn open(
    name: *const c_char,
    qlen: DAT_COUNT,
    async_evd: *mut DAT_EVD_HANDLE,
    ia_handle: *mut DAT_IA_HANDLE,
) -> DAT_RETURN {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    guard(&calls::IA_OPEN, || unsafe {
        open_ia(name, qlen, async_evd, ia_handle, false)
    })
}

/// ia_open_func of the `threadsafe` entries (`PROVIDER_TS`).
pub(crate) unsafe extern "C" fn open_threadsafe(
    name: *const c_char,
    qlen: DAT_COUNT,
    async_evd: *mut DAT_EVD_HANDLE,
    ia_handle: *mut DAT_IA_HANDLE,
) -> DAT_RETURN {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    guard(&calls::IA_OPEN, || unsafe {
        open_ia(name, qlen, async_evd, ia_handle, true)
    })
}

pub(crate) unsafe fn open_ia(
    name: *const c_char,
    qlen: DAT_COUNT,
    async_evd: *mut DAT_EVD_HANDLE,
    ia_handle: *mut DAT_IA_HANDLE,
    thread_safe: bool,
) -> DatResult<()> {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    let ia = unsafe {
        open_ia_with(
            name,
            qlen,
            async_evd,
            ia_handle,
            DAT_VERSION_MAJOR,
            thread_safe,
            table(thread_safe) as *const DAT_PROVIDER as usize,
        )
    }?;
    handle::set_dispatch(
        ia.handle(),
        table_for_ia_name(ia.name(), thread_safe) as *const DAT_PROVIDER as usize,
    );
    Ok(())
}

/// ia_open of either DAT version: the dat.conf entry `name` registered for
/// `major` with this thread safety chooses the backend; every handle of the
/// IA starts with `dispatch`, that version's provider table of that entry
/// (which is how the IA's thread safety is known again, see
/// `dispatch_is_thread_safe`).
pub(crate) unsafe fn open_ia_with(
    name: *const c_char,
    qlen: DAT_COUNT,
    async_evd: *mut DAT_EVD_HANDLE,
    ia_handle: *mut DAT_IA_HANDLE,
    major: u32,
    thread_safe: bool,
    dispatch: usize,
) -> DatResult<Arc<Ia>> {
    if name.is_null() {
        return Err(DatError::bad(Param::Name));
    }
    // SAFETY: `async_evd` is NULL or points to writable memory (the C caller's contract).
    let async_evd = unsafe { out(async_evd, Param::AsyncEventHandle) }?;
    // SAFETY: `ia_handle` is NULL or points to writable memory (the C caller's contract).
    let ia_handle = unsafe { out(ia_handle, Param::IaHandle) }?;
    // SAFETY: not NULL (checked above): the consumer's NUL-terminated IA name.
    let name = unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned();
    let params = entry(&name, major, thread_safe)
        .ok_or(DatError::new(
            ErrorType::ProviderNotFound,
            SubType::NameNotRegistered,
        ))?
        .ia_params;
    let want_async = if async_evd.is_null() {
        AsyncEvd::Create(qlen)
    } else {
        AsyncEvd::Existing(h(*async_evd))
    };
    let (ia, evd) = Ia::open_with_async_evd(&name, &params, open_device, want_async, dispatch)
        .inspect_err(|e| {
            // Say why, once, even with logging off: "no such interface" is
            // the first thing a new user of "tcp eth0" needs to know. (A bad
            // async EVD handle or argument is the caller's, said by the return
            // code.)
            if e.kind == ErrorType::InvalidHandle || e.param.is_some() {
                return;
            }
            let why = daplrs::device::diagnose(&params).unwrap_or_else(|| e.to_string());
            eprintln!("daplrs: cannot open IA '{name}' (ia_params \"{params}\"): {why}");
        })
        // The async EVD this call creates takes its length from async_event_qlen.
        .map_err(|e| match e.param {
            Some(Param::EvdMinQlen) => DatError::bad(Param::AsyncEventQlen),
            _ => e,
        })?;
    if let Some(evd) = evd {
        *async_evd = c(evd.handle());
    }
    *ia_handle = c(ia.handle());
    Ok(ia)
}

pub(crate) unsafe extern "C" fn close(ia: DAT_IA_HANDLE, flags: DAT_CLOSE_FLAGS) -> DAT_RETURN {
    // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
    guard(&calls::IA_CLOSE, || unsafe { close_ia(ia, flags) })
}

pub(crate) unsafe fn close_ia(ia: DAT_IA_HANDLE, flags: DAT_CLOSE_FLAGS) -> DatResult<()> {
    if flags > DAT_CLOSE_GRACEFUL_FLAG {
        return Err(DatError::bad(Param::CloseFlags));
    }
    handle::ia(h(ia))?.close(flags)
}

pub(crate) unsafe extern "C" fn query(
    ia: DAT_IA_HANDLE,
    async_evd: *mut DAT_EVD_HANDLE,
    ia_mask: DAT_IA_ATTR_MASK,
    ia_attr: *mut DAT_IA_ATTR,
    provider_mask: DAT_PROVIDER_ATTR_MASK,
    provider_attr: *mut DAT_PROVIDER_ATTR,
) -> DAT_RETURN {
    guard(&calls::IA_QUERY, || {
        // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
        unsafe {
            query_ia(
                ia,
                async_evd,
                ia_mask,
                ia_attr,
                provider_mask,
                provider_attr,
            )
        }
    })
}

/// dat_ia_query for an IA opened through an entry of either DAT version.
pub(crate) unsafe fn query_ia(
    ia: DAT_IA_HANDLE,
    async_evd: *mut DAT_EVD_HANDLE,
    ia_mask: DAT_IA_ATTR_MASK,
    ia_attr: *mut DAT_IA_ATTR,
    provider_mask: DAT_PROVIDER_ATTR_MASK,
    provider_attr: *mut DAT_PROVIDER_ATTR,
) -> DatResult<()> {
    let ia = handle::ia(h(ia))?;
    // SAFETY: `async_evd` is NULL or points to a writable value of its type (the C caller's
    // contract).
    if let Some(e) = unsafe { async_evd.as_mut() } {
        *e = ia
            .async_evd()
            .map(|e| c(e.handle()))
            .unwrap_or(std::ptr::null_mut());
    }
    if ia_mask != 0 {
        // SAFETY: `ia_attr` is NULL or points to writable memory (the C caller's contract).
        fill_ia_attr(&ia, unsafe { out(ia_attr, Param::IaAttr) }?);
    }
    if provider_mask != 0 {
        // SAFETY: `provider_attr` is NULL or points to writable memory (the C caller's contract).
        fill_provider_attr(&ia, unsafe { out(provider_attr, Param::ProviderAttr) }?);
    }
    Ok(())
}

fn fill_ia_attr(ia: &Ia, a: &mut DAT_IA_ATTR) {
    let q = ia.query();
    cstr_into(&mut a.adapter_name, &q.adapter_name);
    cstr_into(&mut a.vendor_name, &q.vendor_name);
    a.hardware_version_major = 0;
    a.hardware_version_minor = 0;
    a.firmware_version_major = 0;
    a.firmware_version_minor = 0;
    a.ia_address_ptr = sockaddr_of(q.address);
    a.max_eps = count(q.max_eps);
    a.max_dto_per_ep = count(q.max_dto_per_ep);
    a.max_rdma_read_per_ep_in = count(q.max_rdma_read_per_ep_in);
    a.max_rdma_read_per_ep_out = count(q.max_rdma_read_per_ep_out);
    a.max_evds = count(q.max_evds);
    a.max_evd_qlen = count(q.max_evd_qlen);
    a.max_iov_segments_per_dto = count(q.max_iov_segments_per_dto);
    a.max_lmrs = count(q.max_lmrs);
    a.max_lmr_block_size = q.max_lmr_block_size.min(u64::from(u32::MAX)) as DAT_SEG_LENGTH;
    a.max_lmr_virtual_address = q.max_lmr_virtual_address;
    a.max_pzs = count(q.max_pzs);
    a.max_message_size = q.max_message_size;
    a.max_rdma_size = q.max_rdma_size;
    a.max_rmrs = count(q.max_rmrs);
    a.max_rmr_target_address = q.max_rmr_target_address;
    a.max_srqs = count(q.max_srqs);
    a.max_ep_per_srq = count(q.max_ep_per_srq);
    a.max_recv_per_srq = count(q.max_recv_per_srq);
    a.max_iov_segments_per_rdma_read = count(q.max_iov_segments_per_rdma_read);
    a.max_iov_segments_per_rdma_write = count(q.max_iov_segments_per_rdma_write);
    a.max_rdma_read_in = count(q.max_rdma_read_in);
    a.max_rdma_read_out = count(q.max_rdma_read_out);
    a.max_rdma_read_per_ep_in_guaranteed = DAT_TRUE;
    a.max_rdma_read_per_ep_out_guaranteed = DAT_TRUE;
    a.zb_supported = DAT_FALSE;
    a.extension_supported = DAT_EXTENSION_IB;
    a.extension_version = dat_abi::ib_ext::DAT_IB_EXTENSION_VERSION as DAT_COUNT;
    a.num_transport_attr = 0;
    a.transport_attr = std::ptr::null_mut();
    a.num_vendor_attr = 0;
    a.vendor_attr = std::ptr::null_mut();
}

/// DAT_PROVIDER_ATTR of an IA opened through a dat.conf entry of either
/// DAT version (the entry's thread safety is reported back).
fn fill_provider_attr(ia: &Arc<Ia>, p: &mut DAT_PROVIDER_ATTR) {
    let q = ia.query();
    // OFED's libdat2 closes the registry entry named here: the IA name.
    cstr_into(&mut p.provider_name, ia.name());
    p.provider_version_major = 0;
    p.provider_version_minor = 1;
    p.dapl_version_major = DAT_VERSION_MAJOR;
    p.dapl_version_minor = DAT_VERSION_MINOR;
    p.lmr_mem_types_supported = DAT_MEM_TYPE_VIRTUAL | DAT_MEM_TYPE_LMR;
    p.iov_ownership_on_return = DAT_IOV_CONSUMER;
    p.dat_qos_supported = DAT_QOS_BEST_EFFORT;
    p.completion_flags_supported = DAT_COMPLETION_DEFAULT_FLAG
        | DAT_COMPLETION_SUPPRESS_FLAG
        | DAT_COMPLETION_UNSIGNALLED_FLAG
        | DAT_COMPLETION_SOLICITED_WAIT_FLAG
        | DAT_COMPLETION_BARRIER_FENCE_FLAG
        | DAT_COMPLETION_EVD_THRESHOLD_FLAG;
    // The provider is safe to call from any thread, but the registry keys
    // entries by the thread safety dat.conf gave them, and OFED's libdat2
    // looks the entry up again with what we report here: the thread safety
    // of the entry this IA was opened through (its dispatch table says).
    p.is_thread_safe = boolean(dispatch_is_thread_safe(ia.dispatch()));
    p.max_private_data_size = count(q.max_private_data_size);
    p.supports_multipath = DAT_FALSE;
    p.ep_creator = DAT_PSP_CREATES_EP_NEVER;
    p.pz_support = DAT_PZ_UNIQUE;
    p.optimal_buffer_alignment = DAT_OPTIMAL_ALIGNMENT;
    p.evd_stream_merging_supported = [[DAT_TRUE; 6]; 6];
    // What the device has (the libfabric backend has no SRQs yet: max_srqs 0).
    p.srq_supported = boolean(q.max_srqs > 0);
    p.srq_watermarks_supported = 0;
    p.srq_ep_pz_difference_supported = DAT_FALSE;
    p.srq_info_supported = 0;
    p.ep_recv_info_supported = 0;
    p.lmr_sync_req = DAT_FALSE;
    p.dto_async_return_guaranteed = DAT_FALSE;
    p.rdma_write_for_rdma_read_req = DAT_FALSE;
    p.rdma_read_lmr_rmr_context_exposure = DAT_FALSE;
    p.rmr_scope_supported = DAT_RMR_SCOPE_EP;
    p.is_signal_safe = DAT_FALSE;
    p.ha_supported = boolean(false);
    p.ha_loadbalancing = DAT_HA_LB_NONE;
    let (n, attrs) = provider_specific(ia);
    p.num_provider_specific_attr = n;
    p.provider_specific_attr = attrs;
}

/// The provider-specific attribute naming the locked-memory limit registrations pin against.
/// (datinfo shows it by this name.)
const PIN_LIMIT_ATTR: &str = "DAPLRS_PIN_LIMIT";

/// The provider-specific attributes of DAT_PROVIDER_ATTR, by the names OFED's provider reports
/// them under (programs written for it look them up by name: dtestsrq sizes its messages by
/// DAT_IB_TRANSPORT_MTU, dtestx checks the extension names), each with what holds for this IA.
fn provider_specific_attrs(ia: &Ia) -> Vec<(&'static str, String)> {
    use dat_abi::ib_ext::attr_names::*;
    let yes = || "TRUE".to_string();
    let mut attrs = vec![
        // The adapter as dat_ia_query's adapter_name gives it (OFED reports its adapter name).
        ("DAT_IB_DEVICE_NAME", ia.query().adapter_name),
        // Connections are made by the provider itself, not through a proxy (OFED's other
        // mode, "PROXY", is its MIC offload).
        ("DAT_IB_CONNECTIVITY_MODE", "DIRECT".to_string()),
        // dat_ep_post_rdma_read works on both backends.
        ("DAT_IB_RDMA_READ", yes()),
        // The backend's link MTU (DeviceAttr::mtu), the bound of a datagram's message: the
        // verbs port's active MTU, or what one UDP datagram carries unfragmented on the
        // interface a TCP device is bound to.
        ("DAT_IB_TRANSPORT_MTU", ia.device().attr().mtu.to_string()),
        // The IB extensions dat_extension_op serves (provider-ffi/src/ext.rs): fetch-and-add,
        // compare-and-swap, RDMA write with immediate data, and the counters.
        ("DAT_EXTENSION_INTERFACE", yes()),
        (DAT_IB_ATTR_COUNTERS, yes()),
        // Left out what has no true value here: DAT_IB_PROVIDER_NAME (OFED's
        // connection-manager flavour), DAT_IB_NODE_GUID, DAT_IB_GID, DAT_IB_PORT_STATUS and
        // DAT_IB_PORT_NUMBER (an InfiniBand port's).
    ];
    // What the device under the IA has (iWARP: no atomics, no immediate data, no datagrams).
    let dev = ia.device().attr();
    if dev.atomics {
        attrs.push((DAT_IB_ATTR_FETCH_AND_ADD, yes()));
        attrs.push((DAT_IB_ATTR_CMP_AND_SWAP, yes()));
    }
    if dev.write_imm {
        attrs.push((DAT_IB_ATTR_IMMED_DATA, yes()));
    }
    // Unreliable datagrams (core/ep/ud.rs), where the backend has datagram QPs.
    if dev.ud {
        attrs.push((DAT_IB_ATTR_UD, yes()));
    }
    // Ours: the locked-memory limit registrations pin against, in bytes, where they do
    // (datinfo shows it: a registration beyond it fails).
    if let Some(limit) = dev.pin_limit {
        attrs.push((PIN_LIMIT_ATTR, limit.to_string()));
    }
    attrs
}

/// The C form of an IA's provider-specific attributes: the strings, and the array of
/// DAT_NAMED_ATTR pointing into them.
struct NamedAttrs {
    _strings: Vec<CString>,
    array: Vec<DAT_NAMED_ATTR>,
}

// SAFETY: the array's pointers point into `_strings`, owned by the same value and never
// changed after construction.
unsafe impl Send for NamedAttrs {}

/// The attribute arrays of the open IAs. The caller of dat_ia_query keeps the pointers it got,
/// so an IA's array is built once and kept until the IA is closed (an array is dropped by the
/// first query after its IA's close).
static NAMED_ATTRS: Mutex<Vec<(Weak<Ia>, Box<NamedAttrs>)>> = Mutex::new(Vec::new());

/// `ia`'s provider-specific attributes: their count and the IA's array.
fn provider_specific(ia: &Arc<Ia>) -> (DAT_COUNT, *mut DAT_NAMED_ATTR) {
    let mut all = NAMED_ATTRS.lock();
    all.retain(|(w, _)| {
        w.upgrade()
            .is_some_and(|i| handle::ia(i.handle()).is_ok_and(|live| Arc::ptr_eq(&live, &i)))
    });
    let i = match all
        .iter()
        .position(|(w, _)| std::ptr::eq(w.as_ptr(), &**ia))
    {
        Some(i) => i,
        None => {
            let pairs = provider_specific_attrs(ia);
            let c = |x: &str| CString::new(x).unwrap_or_default();
            let strings: Vec<CString> = pairs
                .iter()
                .flat_map(|(name, value)| [c(name), c(value)])
                .collect();
            let array = strings
                .chunks(2)
                .map(|nv| DAT_NAMED_ATTR {
                    name: nv[0].as_ptr(),
                    value: nv[1].as_ptr(),
                })
                .collect();
            all.push((
                Arc::downgrade(ia),
                Box::new(NamedAttrs {
                    _strings: strings,
                    array,
                }),
            ));
            all.len() - 1
        }
    };
    let attrs = &all[i].1.array;
    (
        attrs.len() as DAT_COUNT,
        attrs.as_ptr() as *mut DAT_NAMED_ATTR,
    )
}

pub(crate) unsafe extern "C" fn get_handle_type(
    handle: DAT_HANDLE,
    ty: *mut DAT_HANDLE_TYPE,
) -> DAT_RETURN {
    guard(&calls::GET_HANDLE_TYPE, || {
        let t = handle::handle_type(h(handle))?;
        // SAFETY: `ty` is NULL or points to writable memory (the C caller's contract).
        *unsafe { out(ty, Param::HandleType) }? = t;
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn set_consumer_context(
    handle: DAT_HANDLE,
    context: DAT_CONTEXT,
) -> DAT_RETURN {
    guard(&calls::SET_CONSUMER_CONTEXT, || {
        handle::set_consumer_context(h(handle), context.as_u64())
    })
}

pub(crate) unsafe extern "C" fn get_consumer_context(
    handle: DAT_HANDLE,
    context: *mut DAT_CONTEXT,
) -> DAT_RETURN {
    guard(&calls::GET_CONSUMER_CONTEXT, || {
        let v = handle::consumer_context(h(handle))?;
        // SAFETY: `context` is NULL or points to writable memory (the C caller's contract).
        *unsafe { out(context, Param::Context) }? = DAT_CONTEXT::from_u64(v);
        Ok(())
    })
}

/// ia_ha_related_func: whether this IA and the IA named `provider` back each other up for high
/// availability. This provider forms no HA relationships, so the answer is always false.
pub(crate) unsafe extern "C" fn ha_related(
    ia: DAT_IA_HANDLE,
    provider: *const c_char,
    answer: *mut DAT_BOOLEAN,
) -> DAT_RETURN {
    guard(&calls::IA_HA_RELATED, || {
        handle::ia(h(ia))?;
        if provider.is_null() {
            return Err(DatError::bad(Param::Provider));
        }
        // SAFETY: `answer` is NULL or points to writable memory (the C caller's contract).
        *unsafe { out(answer, Param::Answer) }? = boolean(false);
        Ok(())
    })
}
