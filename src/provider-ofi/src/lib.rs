//! libdaplrs-ofi.so.2: the same provider as libdaplrs.so.2 (same C layer, same core), built
//! with the `ofi` feature, so its IAs may name a libfabric provider ("ofi tcp lo") as well as
//! a TCP interface (docs/libfabric.md).
//!
//! A library of its own so that libdaplrs.so.2 keeps no link to libfabric: only entries that
//! name this library need libfabric's runtime.
#![deny(unsafe_op_in_unsafe_fn)]

pub use daplrs_ffi::{dat_provider_fini, dat_provider_init};

use std::ffi::{c_char, c_int, CStr};

use daplrs_libfabric::catalog;

/// Describes the ofi entry `ia_params` ("ofi tcp lo") into `buf` (`len` bytes, NUL-terminated,
/// lines separated by '\n', cut at `len`): libfabric's provider, domain, endpoint type, MR
/// mode and limits (returns 0), or why the entry cannot open (returns 1); -1 for bad
/// arguments. datinfo calls it for entries whose library exports it.
///
/// # Safety
/// `ia_params` is NULL or a NUL-terminated string; `buf` is NULL or has `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn daplrs_ofi_describe(
    ia_params: *const c_char,
    buf: *mut c_char,
    len: usize,
) -> c_int {
    if ia_params.is_null() || buf.is_null() || len == 0 {
        return -1;
    }
    // SAFETY: the caller's NUL-terminated string.
    let params = unsafe { CStr::from_ptr(ia_params) }
        .to_string_lossy()
        .into_owned();
    let described = std::panic::catch_unwind(|| {
        let mut words = params.split_whitespace();
        match (words.next(), words.next()) {
            (Some("ofi"), Some(provider)) => {
                let (place, dgram) = daplrs_libfabric::entry_options(words);
                catalog::describe(provider, place, dgram)
            }
            _ => Err(format!(
                "\"{params}\" is not an ofi entry (\"ofi <provider> [where]\")"
            )),
        }
    })
    .unwrap_or_else(|_| Err("internal error while describing the entry".to_string()));
    let (rc, text) = match described {
        Ok(lines) => (0, lines.join("\n")),
        Err(why) => (1, why),
    };
    // SAFETY: the caller's buffer of `len` bytes.
    unsafe { write_c(&text, buf, len) };
    rc
}

/// The dat.conf entries `make install` registers for this host's libfabric providers that the
/// backend supports (`catalog::installable`), one "IA_NAME<TAB>IA_PARAMS" line each, into
/// `buf` as daplrs_ofi_describe writes. Returns the number of entries, -1 for bad arguments.
///
/// # Safety
/// `buf` is NULL or has `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn daplrs_ofi_entries(buf: *mut c_char, len: usize) -> c_int {
    if buf.is_null() || len == 0 {
        return -1;
    }
    let entries = std::panic::catch_unwind(catalog::installable).unwrap_or_default();
    let text: Vec<String> = entries
        .iter()
        .map(|e| format!("{}\t{}", e.ia_name, e.ia_params))
        .collect();
    // SAFETY: the caller's buffer of `len` bytes.
    unsafe { write_c(&text.join("\n"), buf, len) };
    entries.len() as c_int
}

/// `text` into `buf` as a C string, cut to fit `len` bytes with its NUL.
///
/// # Safety
/// `buf` has `len` (> 0) writable bytes.
unsafe fn write_c(text: &str, buf: *mut c_char, len: usize) {
    let n = text.len().min(len - 1);
    // SAFETY: n + 1 <= len bytes of the caller's buffer; text has n readable bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), buf, n);
        *buf.add(n) = 0;
    }
}
