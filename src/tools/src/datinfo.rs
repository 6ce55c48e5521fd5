//! datinfo: what the DAT registry sees, and why an entry does not work.
//!
//! Lists the dat.conf entries in effect ($DAT_OVERRIDE, else /etc/dat.conf)
//! and opens each IA: prints its address and main limits, or the exact
//! reason it cannot be opened (library missing, symbol missing, no device,
//! address not configured). The registry is linked in (the same code as
//! libdat2.so.2) and exported, so providers register with it.
//!
//! Usage: datinfo [IA_NAME...]     (default: every entry)
#![deny(unsafe_op_in_unsafe_fn)]
use dat2::conf;
use dat2::exports::{dat_ia_close, dat_ia_openv, dat_ia_query, dat_strerror};
use dat2::registry;
use dat_abi::*;
use std::ffi::{c_char, CStr, CString};
use std::process::ExitCode;

fn code_name(rc: DAT_RETURN) -> String {
    let (mut major, mut minor): (*const c_char, *const c_char) =
        (std::ptr::null(), std::ptr::null());
    // SAFETY: dat_strerror writes static strings into the two pointers.
    let known = unsafe { dat_strerror(rc, &mut major, &mut minor) } == DAT_SUCCESS;
    if known {
        // SAFETY: static NUL-terminated strings from dat_strerror.
        unsafe {
            format!(
                "{} {} ({rc:#x})",
                CStr::from_ptr(major).to_string_lossy(),
                CStr::from_ptr(minor).to_string_lossy()
            )
        }
    } else {
        format!("{rc:#x}")
    }
}

fn c_chars(a: &[c_char]) -> String {
    let bytes = c_array_bytes(a);
    String::from_utf8_lossy(bytes).into_owned()
}

fn ipv4(p: DAT_IA_ADDRESS_PTR) -> String {
    if p.is_null() {
        return "none".into();
    }
    // SAFETY: the provider returned a pointer to a socket address.
    unsafe {
        if i32::from((*p).sa_family) == libc::AF_INET {
            let sin = &*(p as *const libc::sockaddr_in);
            std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)).to_string()
        } else {
            format!("address family {}", (*p).sa_family)
        }
    }
}

/// Opens one entry and describes it; Err carries the reason it failed.
fn describe(e: &conf::ConfEntry) -> Result<Vec<String>, String> {
    let name =
        CString::new(e.ia_name.as_str()).map_err(|_| "IA name contains a NUL byte".to_string())?;
    let mut ia: DAT_IA_HANDLE = std::ptr::null_mut();
    let mut async_evd: DAT_EVD_HANDLE = std::ptr::null_mut();
    let ts = if e.thread_safe { DAT_TRUE } else { DAT_FALSE };
    // SAFETY: valid pointers to locals.
    let rc = unsafe {
        dat_ia_openv(
            name.as_ptr(),
            8,
            &mut async_evd,
            &mut ia,
            e.api_major,
            e.api_minor,
            ts,
        )
    };
    if rc != DAT_SUCCESS {
        let why = match registry::take_load_failure() {
            Some(load) => format!("cannot load: {load}"),
            None => format!("the provider refused to open it: {}", code_name(rc)),
        };
        return Err(why);
    }
    // SAFETY: all-zero is a valid value of these plain C structs.
    let mut attr: DAT_IA_ATTR = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut pattr: DAT_PROVIDER_ATTR = unsafe { std::mem::zeroed() };
    // SAFETY: ia is open; the attribute structs are ours.
    let rc = unsafe {
        dat_ia_query(
            ia,
            std::ptr::null_mut(),
            DAT_IA_FIELD_ALL,
            &mut attr,
            DAT_PROVIDER_FIELD_ALL,
            &mut pattr,
        )
    };
    let mut lines = Vec::new();
    if rc == DAT_SUCCESS {
        lines.push(format!(
            "IA address {}, adapter \"{}\", vendor \"{}\", provider \"{}\" {}.{}",
            ipv4(attr.ia_address_ptr),
            c_chars(&attr.adapter_name),
            c_chars(&attr.vendor_name),
            c_chars(&pattr.provider_name),
            pattr.provider_version_major,
            pattr.provider_version_minor
        ));
        lines.push(format!(
            "max EPs {}, max EVDs {} (qlen {}), max LMRs {}, max message {} B, max RDMA {} B, IOV {} segments, RDMA reads in flight {}/{}",
            attr.max_eps,
            attr.max_evds,
            attr.max_evd_qlen,
            attr.max_lmrs,
            attr.max_message_size,
            attr.max_rdma_size,
            attr.max_iov_segments_per_dto,
            attr.max_rdma_read_in,
            attr.max_rdma_read_out
        ));
        lines.push(format!(
            "SRQ {}, max private data {} B, thread safe {}",
            if pattr.srq_supported != DAT_FALSE {
                "yes"
            } else {
                "no"
            },
            pattr.max_private_data_size,
            if pattr.is_thread_safe != DAT_FALSE {
                "yes"
            } else {
                "no"
            }
        ));
    } else {
        lines.push(format!(
            "opened, but dat_ia_query failed: {}",
            code_name(rc)
        ));
    }
    // SAFETY: ia is open.
    let rc = unsafe { dat_ia_close(ia, DAT_CLOSE_ABRUPT_FLAG) };
    if rc != DAT_SUCCESS {
        lines.push(format!("dat_ia_close failed: {}", code_name(rc)));
    }
    Ok(lines)
}

/// Runs `f` with stderr captured: providers explain themselves there (ours:
/// "no interface nosuchif0"; OFED's: "Is ib0 configured?"), and datinfo
/// shows that under the entry it belongs to.
fn capturing_stderr<T>(f: impl FnOnce() -> T) -> (T, String) {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    let Ok(mut file) = tempfile() else {
        return (f(), String::new());
    };
    let _ = std::io::stderr().flush();
    // SAFETY: plain descriptor juggling on fds we own; restored below.
    let saved = unsafe { libc::dup(2) };
    // SAFETY: as above.
    unsafe { libc::dup2(file.as_raw_fd(), 2) };
    let result = f();
    let _ = std::io::stderr().flush();
    // SAFETY: as above.
    unsafe {
        libc::dup2(saved, 2);
        libc::close(saved);
    }
    let mut text = String::new();
    let _ = file.rewind();
    let _ = file.read_to_string(&mut text);
    (result, text)
}

fn tempfile() -> std::io::Result<std::fs::File> {
    let path = std::env::temp_dir().join(format!("datinfo-{}.stderr", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)?;
    let _ = std::fs::remove_file(&path);
    Ok(file)
}

fn main() -> ExitCode {
    let only: Vec<String> = std::env::args().skip(1).collect();
    if only.iter().any(|a| a == "-h" || a == "--help") {
        println!(
            "usage: datinfo [IA_NAME...]\nLists the dat.conf entries in effect and opens each IA."
        );
        return ExitCode::SUCCESS;
    }
    let path = conf::conf_path();
    let (entries, errors) = conf::load(&path);
    println!(
        "dat.conf: {}{}",
        path.display(),
        if std::env::var_os(conf::OVERRIDE_ENV).is_some() {
            " (from DAT_OVERRIDE)"
        } else {
            ""
        }
    );
    for e in &errors {
        println!("  skipped {e}");
    }
    let mut failures = 0;
    let mut shown = 0;
    for e in &entries {
        if !only.is_empty() && !only.contains(&e.ia_name) {
            continue;
        }
        shown += 1;
        println!(
            "\n{}  {}  {}  \"{}\"",
            e.ia_name,
            e.api_fields(),
            e.library,
            e.ia_params
        );
        if !e.user_api || !e.is_default {
            println!("    not served: only user-level (u) default entries are");
            continue;
        }
        let (result, said) = capturing_stderr(|| describe(e));
        match result {
            Ok(lines) => lines.iter().for_each(|l| println!("    {l}")),
            Err(why) => {
                failures += 1;
                println!("    {why}");
            }
        }
        for line in said.lines().filter(|l| !l.trim().is_empty()) {
            println!("    | {}", line.trim_end());
        }
    }
    if shown == 0 {
        println!(
            "no entries{}",
            if only.is_empty() {
                ""
            } else {
                " with those names"
            }
        );
    }
    if failures > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
