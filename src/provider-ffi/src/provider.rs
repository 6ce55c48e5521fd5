//! The DAT_PROVIDER table of udapl-rs and the two symbols a registry looks
//! up in a provider library: `dat_provider_init` and `dat_provider_fini`.
//!
//! Two tables serve the `u2.0` dat.conf entries naming this library (and
//! `crate::v12` two the `u1.2` entries): [`PROVIDER`] the `nonthreadsafe`
//! entries, [`PROVIDER_TS`] the `threadsafe` ones. They differ only in
//! `ia_open_func`, which is how an IA learns which entry it was opened
//! through (the registry calls the table registered for the entry; the call
//! names only the IA) and so what DAT_PROVIDER_ATTR's is_thread_safe must
//! say (OFED's libdat2 finds the entry to close by it). The provider itself
//! is safe to call from any thread whichever entry opened the IA. Each
//! entry's `ia_params` ("tcp lo", "tcp eth0", "tcp 192.0.2.1") is
//! remembered under its IA name, DAT version and thread safety and used when
//! that entry is opened. Every object handle of an IA starts with a pointer
//! to the table the IA was opened through.

use crate::{cno, cr, csp, ep, evd, ext, ia, lmr, pz, rmr, sp, srq};
use dat_abi::*;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{c_char, CStr};

extern "C" {
    // Resolved at load time from the registry library that loaded us
    // (libdat2.so.2: ours or OFED's); not a link-time dependency.
    fn dat_registry_add_provider(
        provider: *const DAT_PROVIDER,
        info: *const DAT_PROVIDER_INFO,
    ) -> DAT_RETURN;
    fn dat_registry_remove_provider(
        provider: *const DAT_PROVIDER,
        info: *const DAT_PROVIDER_INFO,
    ) -> DAT_RETURN;
}

/// The 2.0 table of the `nonthreadsafe` entries: the first word of every
/// handle of an IA opened through it (the IA's own handle has a per-name
/// copy, see `table_for_ia_name`).
pub(crate) static PROVIDER: DAT_PROVIDER = TABLE;

/// The 2.0 table of the `threadsafe` entries: [`PROVIDER`] but for the open
/// function, which marks the IA thread-safe.
pub(crate) static PROVIDER_TS: DAT_PROVIDER = DAT_PROVIDER {
    ia_open_func: Some(ia::open_threadsafe),
    ..TABLE
};

/// Whether an IA whose handles start with `dispatch` (`Ia::dispatch`) was
/// opened through a `threadsafe` entry, of either DAT version.
pub(crate) fn dispatch_is_thread_safe(dispatch: usize) -> bool {
    dispatch == &PROVIDER_TS as *const DAT_PROVIDER as usize
        || dispatch == &crate::v12::PROVIDER12_TS as *const dat_abi12::DAT_PROVIDER as usize
}

/// The 2.0 table for an entry of the given thread safety.
pub(crate) fn table(thread_safe: bool) -> &'static DAT_PROVIDER {
    if thread_safe {
        &PROVIDER_TS
    } else {
        &PROVIDER
    }
}

const TABLE: DAT_PROVIDER = DAT_PROVIDER {
    device_name: c"udapl-rs".as_ptr(),
    extension: std::ptr::null_mut(),
    ia_open_func: Some(ia::open),
    ia_query_func: Some(ia::query),
    ia_close_func: Some(ia::close),
    set_consumer_context_func: Some(ia::set_consumer_context),
    get_consumer_context_func: Some(ia::get_consumer_context),
    get_handle_type_func: Some(ia::get_handle_type),
    cno_create_func: Some(cno::create),
    cno_modify_agent_func: Some(cno::modify_agent),
    cno_query_func: Some(cno::query),
    cno_free_func: Some(cno::free),
    cno_wait_func: Some(cno::wait),
    cr_query_func: Some(cr::query),
    cr_accept_func: Some(cr::accept),
    cr_reject_func: Some(cr::reject),
    cr_handoff_func: Some(cr::handoff),
    evd_create_func: Some(evd::create),
    evd_query_func: Some(evd::query),
    evd_modify_cno_func: Some(evd::modify_cno),
    evd_enable_func: Some(evd::enable),
    evd_disable_func: Some(evd::disable),
    evd_wait_func: Some(evd::wait),
    evd_resize_func: Some(evd::resize),
    evd_post_se_func: Some(evd::post_se),
    evd_dequeue_func: Some(evd::dequeue),
    evd_free_func: Some(evd::free),
    ep_create_func: Some(ep::create),
    ep_query_func: Some(ep::query),
    ep_modify_func: Some(ep::modify),
    ep_connect_func: Some(ep::connect),
    ep_dup_connect_func: Some(ep::dup_connect),
    ep_disconnect_func: Some(ep::disconnect),
    ep_post_send_func: Some(ep::post_send),
    ep_post_recv_func: Some(ep::post_recv),
    ep_post_rdma_read_func: Some(ep::post_rdma_read),
    ep_post_rdma_write_func: Some(ep::post_rdma_write),
    ep_get_status_func: Some(ep::get_status),
    ep_free_func: Some(ep::free),
    lmr_create_func: Some(lmr::create),
    lmr_query_func: Some(lmr::query),
    lmr_free_func: Some(lmr::free),
    rmr_create_func: Some(rmr::create),
    rmr_query_func: Some(rmr::query),
    rmr_bind_func: Some(rmr::bind),
    rmr_free_func: Some(rmr::free),
    psp_create_func: Some(sp::psp_create),
    psp_query_func: Some(sp::psp_query),
    psp_free_func: Some(sp::psp_free),
    rsp_create_func: Some(sp::rsp_create),
    rsp_query_func: Some(sp::rsp_query),
    rsp_free_func: Some(sp::rsp_free),
    pz_create_func: Some(pz::create),
    pz_query_func: Some(pz::query),
    pz_free_func: Some(pz::free),
    psp_create_any_func: Some(sp::psp_create_any),
    ep_reset_func: Some(ep::reset),
    evd_set_unwaitable_func: Some(evd::set_unwaitable),
    evd_clear_unwaitable_func: Some(evd::clear_unwaitable),
    lmr_sync_rdma_read_func: Some(lmr::sync_rdma_read),
    lmr_sync_rdma_write_func: Some(lmr::sync_rdma_write),
    ep_create_with_srq_func: Some(ep::create_with_srq),
    ep_recv_query_func: Some(ep::recv_query),
    ep_set_watermark_func: Some(ep::set_watermark),
    srq_create_func: Some(srq::create),
    srq_free_func: Some(srq::free),
    srq_post_recv_func: Some(srq::post_recv),
    srq_query_func: Some(srq::query),
    srq_resize_func: Some(srq::resize),
    srq_set_lw_func: Some(srq::set_lw),
    csp_create_func: Some(csp::csp_create),
    csp_query_func: Some(csp::csp_query),
    csp_free_func: Some(csp::csp_free),
    ep_common_connect_func: Some(csp::ep_common_connect),
    rmr_create_for_ep_func: Some(rmr::create_for_ep),
    ep_post_send_with_invalidate_func: Some(ep::post_send_with_invalidate),
    ep_post_rdma_read_to_rmr_func: Some(ep::post_rdma_read_to_rmr),
    cno_fd_create_func: Some(cno::fd_create),
    cno_trigger_func: Some(cno::trigger),
    ia_ha_related_func: Some(ia::ha_related),
    handle_extendedop_func: Some(ext::extendedop),
};

/// A copy of [`PROVIDER`] (or [`PROVIDER_TS`]) whose `device_name` is
/// `name`, for the first word of that name's IA handles. OFED's libdat2
/// closes an IA by looking up the registry entry named by `device_name` of
/// the IA's table, so each IA name needs its own; every other object, and
/// the registrations, use the table itself (same functions).
pub(crate) fn table_for_ia_name(name: &str, thread_safe: bool) -> &'static DAT_PROVIDER {
    static TABLES: Mutex<Option<HashMap<(String, bool), usize>>> = Mutex::new(None);
    let mut tables = TABLES.lock();
    let addr = *tables
        .get_or_insert_with(HashMap::new)
        .entry((name.to_string(), thread_safe))
        .or_insert_with(|| {
            let device_name = std::ffi::CString::new(name.replace('\0', "")).unwrap_or_default();
            let table = DAT_PROVIDER {
                device_name: device_name.into_raw(),
                ..*table(thread_safe)
            };
            Box::leak(Box::new(table)) as *const DAT_PROVIDER as usize
        });
    // SAFETY: leaked above, never freed.
    unsafe { &*(addr as *const DAT_PROVIDER) }
}

/// What the registry told us about one IA name in dat_provider_init.
#[derive(Clone)]
pub(crate) struct Entry {
    /// "tcp lo", "tcp eth0", "tcp 192.0.2.1": backend and interface.
    pub ia_params: String,
}

/// The entries this library was initialised for, by IA name, DAT major
/// version and thread safety: a `u2.0` and a `u1.2` entry, each
/// `threadsafe` and `nonthreadsafe`, may share a name ("rs-tcp") and be
/// initialised and finished independently.
static ENTRIES: Mutex<Option<HashMap<EntryKey, Entry>>> = Mutex::new(None);

/// IA name, DAT major version, thread safety.
type EntryKey = (String, u32, bool);

/// The dat.conf entry this library was initialised with for `name` under
/// DAT major version `major` and the given thread safety.
pub(crate) fn entry(name: &str, major: u32, thread_safe: bool) -> Option<Entry> {
    ENTRIES
        .lock()
        .as_ref()?
        .get(&(name.to_string(), major, thread_safe))
        .cloned()
}

/// The DAT major version whose table serves the entry `info`: 1 for a
/// 1.2 registry, else 2.
fn abi_major(info: &DAT_PROVIDER_INFO) -> u32 {
    if info.dapl_version_major == dat_abi12::DAT_VERSION_MAJOR {
        dat_abi12::DAT_VERSION_MAJOR
    } else {
        DAT_VERSION_MAJOR
    }
}

fn ia_name(info: &DAT_PROVIDER_INFO) -> String {
    let bytes = c_array_bytes(&info.ia_name);
    String::from_utf8_lossy(bytes).into_owned()
}

/// Called by the registry once per dat.conf entry naming this library.
///
/// # Safety
/// `info` points to a DAT_PROVIDER_INFO; `ia_params` is NULL or a C string.
#[no_mangle]
pub unsafe extern "C" fn dat_provider_init(
    info: *const DAT_PROVIDER_INFO,
    ia_params: *const c_char,
) {
    let _ = std::panic::catch_unwind(|| {
        daplrs_logging();
        // SAFETY: `info` is NULL or points to a readable value of its type (the C caller's
        // contract).
        let Some(info) = (unsafe { info.as_ref() }) else {
            return;
        };
        let params = if ia_params.is_null() {
            String::new()
        } else {
            // SAFETY: not NULL (checked above): the registry's NUL-terminated ia_params string.
            unsafe { CStr::from_ptr(ia_params) }
                .to_string_lossy()
                .into_owned()
        };
        let name = ia_name(info);
        let major = abi_major(info);
        let thread_safe = info.is_thread_safe != DAT_FALSE;
        let entry = Entry {
            ia_params: params.clone(),
        };
        ENTRIES
            .lock()
            .get_or_insert_with(HashMap::new)
            .insert((name.clone(), major, thread_safe), entry);
        // A DAT 1.2 registry (libdat.so.1) gets a 1.2 table; any other a
        // 2.0 one, as before; each of the entry's thread safety.
        let rc = if major == dat_abi12::DAT_VERSION_MAJOR {
            // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
            unsafe { crate::v12::register(info, thread_safe) }
        } else {
            // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
            unsafe { dat_registry_add_provider(table(thread_safe), info) }
        };
        log::debug!(
            "dat_provider_init({name}, u{major}, threadsafe {thread_safe}, \"{params}\"): registry answered {rc:#x}"
        );
    });
}

/// Called by the registry when the last IA of an entry is closed.
///
/// # Safety
/// `info` points to a DAT_PROVIDER_INFO.
#[no_mangle]
pub unsafe extern "C" fn dat_provider_fini(info: *const DAT_PROVIDER_INFO) {
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: `info` is NULL or points to a readable value of its type (the C caller's
        // contract).
        let Some(info) = (unsafe { info.as_ref() }) else {
            return;
        };
        let major = abi_major(info);
        let thread_safe = info.is_thread_safe != DAT_FALSE;
        if let Some(map) = ENTRIES.lock().as_mut() {
            map.remove(&(ia_name(info), major, thread_safe));
        }
        if major == dat_abi12::DAT_VERSION_MAJOR {
            // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
            unsafe { crate::v12::unregister(info, thread_safe) };
        } else {
            // SAFETY: this entry point's pointer arguments, passed on under the same C contract.
            unsafe { dat_registry_remove_provider(table(thread_safe), info) };
        }
    });
}

/// `DAT_LOG` switches on the provider's diagnostics too (env_logger syntax).
fn daplrs_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let env = env_logger::Env::new()
            .filter("DAT_LOG")
            .write_style("DAT_LOG_STYLE");
        let _ = env_logger::Builder::from_env(env)
            .format_timestamp_micros()
            .try_init();
    });
}
