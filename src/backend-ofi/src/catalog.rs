//! What `make install` registers and `datinfo` shows for ofi entries: the
//! libfabric providers this backend supports, as `fi_info` lists them here,
//! and one open entry's provider, domain, endpoint type, MR mode and limits.
//!
//! An entry is offered when its provider is in [`SUPPORTED`] and the device
//! actually opens on it (the same checks a program's `dat_ia_open` makes), so
//! that the table says what was proven and the probe what this host has.

use std::collections::BTreeSet;
use std::ffi::{c_void, CStr};
use std::ptr::{null, null_mut};

use ofi_sys as fi;

use crate::{Info, OfiDevice};

/// The libfabric providers the backend supports (proven by `make test-ofi`):
/// tcp with FI_EP_MSG, and tcp;ofi_rxm and shm with FI_EP_RDM (our
/// connection layer; on shm a request through a stale context is refused
/// at the initiator rather than dropped by the provider: docs/libfabric.md,
/// "Where it stands"); verbs (FI_EP_MSG) and verbs;ofi_rxm, proven on
/// soft-RoCE in the guest's pass of `make test` (tests-c/scripts/verbs-guest.sh,
/// which names what still fails there).
pub const SUPPORTED: &[&str] = &["tcp", "tcp;ofi_rxm", "shm", "verbs", "verbs;ofi_rxm"];

/// One dat.conf entry to register: its IA name and its ia_params.
pub struct Entry {
    pub ia_name: String,
    pub ia_params: String,
}

/// Every (provider, domain) `fi_info` reports whose provider is supported
/// and on which the device opens, as dat.conf entries: "rs-ofi-tcp" for tcp
/// on the loopback interface (as rs-tcp is), "rs-ofi-tcp-eth0" on eth0,
/// "rs-ofi-tcp-rxm" for "tcp;ofi_rxm", "rs-ofi-shm" for shm's one domain.
pub fn installable() -> Vec<Entry> {
    let mut seen = BTreeSet::new();
    for (provider, domain) in offered() {
        if SUPPORTED.contains(&provider.as_str()) {
            seen.insert((provider, domain));
        }
    }
    seen.into_iter()
        .filter(|(p, d)| OfiDevice::diagnose(p, Some(d)).is_none())
        .map(|(p, d)| Entry {
            ia_name: ia_name(&p, &d),
            ia_params: format!("ofi {p} {d}"),
        })
        .collect()
}

fn ia_name(provider: &str, domain: &str) -> String {
    let mut name = format!(
        "rs-ofi-{}",
        provider.replace(";ofi_", "-").replace(';', "-")
    );
    if domain != "lo" && domain != provider {
        name.push('-');
        name.push_str(domain);
    }
    name
}

/// The (provider, domain) of every `fi_info` libfabric lists here, any
/// endpoint type.
fn offered() -> Vec<(String, String)> {
    crate::prepare_libfabric();
    let mut list = null_mut();
    // SAFETY: no node, service or hints: every provider's list, which we own.
    let rc = unsafe { fi::fi_getinfo(fi::API_VERSION, null(), null(), 0, null_mut(), &mut list) };
    if rc != 0 || list.is_null() {
        return Vec::new();
    }
    let list = Info(list);
    let mut out = Vec::new();
    let mut cur = list.ptr();
    while !cur.is_null() {
        // SAFETY: an element of the list fi_getinfo returned, alive while `list` is.
        let (prov, domain) = unsafe {
            (
                cstr((*(*cur).fabric_attr).prov_name),
                cstr((*(*cur).domain_attr).name),
            )
        };
        if !prov.is_empty() && !domain.is_empty() {
            out.push((prov, domain));
        }
        // SAFETY: as above.
        cur = unsafe { (*cur).next };
    }
    out
}

/// What libfabric gave an open entry, in a few lines (datinfo prints them):
/// provider, fabric, domain, endpoint type, progress, MR mode, orders and
/// limits. Err: why the entry does not open.
pub fn describe(
    provider: &str,
    place: Option<&str>,
    dgram: Option<&str>,
) -> Result<Vec<String>, String> {
    let dev = OfiDevice::open_with(provider, place, dgram).map_err(|e| {
        OfiDevice::diagnose_with(provider, place, dgram).unwrap_or_else(|| e.to_string())
    })?;
    let mut lines = describe_info(dev.dom.info.ptr());
    lines.extend(dev.dgram.as_ref().map(|d| d.describe()));
    daplrs_backend::Device::close(&*dev);
    Ok(lines)
}

fn describe_info(info: *const fi::fi_info) -> Vec<String> {
    // SAFETY: the device's fi_info and its attribute structs, alive while it is open.
    unsafe {
        let (fab, dom, ep) = (
            &*(*info).fabric_attr,
            &*(*info).domain_attr,
            &*(*info).ep_attr,
        );
        let (tx, rx) = (&*(*info).tx_attr, &*(*info).rx_attr);
        vec![
            format!(
                "libfabric provider {} {}.{}, fabric {}, domain {}, {}",
                cstr(fab.prov_name),
                fab.prov_version >> 16,
                fab.prov_version & 0xffff,
                cstr(fab.name),
                cstr(dom.name),
                tostr(&ep.type_ as *const _ as *const c_void, fi::fi_type_FI_TYPE_EP_TYPE)
            ),
            format!(
                "MR mode {}, data progress {}, send order [{}]",
                mr_mode(dom.mr_mode),
                tostr(
                    &dom.data_progress as *const _ as *const c_void,
                    fi::fi_type_FI_TYPE_PROGRESS
                ),
                tostr(&tx.msg_order as *const _ as *const c_void, fi::fi_type_FI_TYPE_MSG_ORDER)
            ),
            format!(
                "limits: transmit depth {}, receive depth {}, inject {} B, IOV {} (RMA {}), max message {} B, CQ data {} B, EPs per shared receive context {}",
                tx.size,
                rx.size,
                tx.inject_size,
                tx.iov_limit,
                tx.rma_iov_limit,
                ep.max_msg_size,
                dom.cq_data_size,
                dom.max_ep_srx_ctx
            ),
        ]
    }
}

/// The MR mode bits by name; none: remote addresses are offsets into a
/// registration and the keys ours (the backend translates: docs/libfabric.md).
fn mr_mode(mode: i32) -> String {
    if mode == 0 {
        return "none (remote addresses are offsets, keys ours)".to_string();
    }
    // SAFETY: an int, the type FI_TYPE_MR_MODE names.
    let names = unsafe {
        tostr(
            &mode as *const i32 as *const c_void,
            fi::fi_type_FI_TYPE_MR_MODE,
        )
    };
    format!("[{names}]")
}

/// fi_tostr's text for a value of libfabric type `kind`, trimmed ("FI_EP_MSG").
///
/// # Safety
/// `data` points to a value of the type `kind` names.
unsafe fn tostr(data: *const c_void, kind: fi::fi_type) -> String {
    // SAFETY: the caller's value; fi_tostr returns a thread-local buffer.
    let s = unsafe { cstr(fi::fi_tostr(data, kind)) };
    s.trim()
        .trim_end_matches(',')
        .replace(", ", " ")
        .to_string()
}

/// A C string of libfabric's, or "" for NULL.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn cstr(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the caller's string.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names_follow_provider_and_domain() {
        assert_eq!(ia_name("tcp", "lo"), "rs-ofi-tcp");
        assert_eq!(ia_name("tcp", "eth0"), "rs-ofi-tcp-eth0");
        assert_eq!(ia_name("tcp;ofi_rxm", "lo"), "rs-ofi-tcp-rxm");
        assert_eq!(ia_name("verbs;ofi_rxm", "rxe0"), "rs-ofi-verbs-rxm-rxe0");
        assert_eq!(ia_name("shm", "shm"), "rs-ofi-shm");
    }

    #[test]
    fn tcp_rxm_and_shm_are_installable_and_described() {
        let entries = installable();
        assert!(
            entries
                .iter()
                .any(|e| e.ia_name == "rs-ofi-tcp" && e.ia_params == "ofi tcp lo"),
            "no rs-ofi-tcp entry"
        );
        assert!(
            entries
                .iter()
                .any(|e| e.ia_name == "rs-ofi-tcp-rxm" && e.ia_params == "ofi tcp;ofi_rxm lo"),
            "no rs-ofi-tcp-rxm entry"
        );
        assert!(
            entries
                .iter()
                .any(|e| e.ia_name == "rs-ofi-shm" && e.ia_params == "ofi shm shm"),
            "no rs-ofi-shm entry"
        );
        let rxm = describe("tcp;ofi_rxm", Some("lo"), None).expect("ofi tcp;ofi_rxm lo opens");
        assert!(rxm[0].contains("FI_EP_RDM"), "{rxm:?}");
        let lines = describe("tcp", Some("lo"), None).expect("ofi tcp lo opens");
        assert!(lines[0].contains("libfabric provider tcp") && lines[0].contains("FI_EP_MSG"));
        assert!(describe("nosuchprov", None, None).is_err());
        // With datagrams: a fourth line says what carries them.
        let dg = describe("tcp;ofi_rxm", Some("127.0.0.1"), Some("udp")).expect("with udp");
        assert_eq!(dg.len(), rxm.len() + 1, "{dg:?}");
        let last = dg.last().expect("lines");
        assert!(
            last.starts_with("datagrams: libfabric provider udp") && last.contains("MTU 1464 B")
        );
        assert!(
            describe("tcp", Some("lo"), Some("udp")).is_err(),
            "a connected entry has none"
        );
    }
}
