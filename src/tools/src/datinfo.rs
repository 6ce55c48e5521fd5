//! datinfo: what the DAT registry sees, and why an entry does not work.
//!
//! Lists the dat.conf entries in effect ($DAT_OVERRIDE, else /etc/dat.conf)
//! and opens each IA through the registry of its DAT version, as a program
//! of that version would: prints its address and main limits, or the exact
//! reason it cannot be opened (library missing, symbol missing, no device,
//! address not configured). `u2.0` entries open through the DAT 2.0
//! registry linked in (the same code as libdat2.so.2, exported so that
//! providers register with it); `u1.2` entries through libdat.so.1, the DAT
//! 1.2 registry, loaded at the first such entry (found as a 1.2 program
//! finds it: LD_LIBRARY_PATH, then datinfo's own ../lib, then the loader's
//! cache) and called with DAT 1.2's structs.
//!
//! Usage: datinfo [IA_NAME...]     (default: every entry)
#![deny(unsafe_op_in_unsafe_fn)]
use dat2::conf;
use dat2::exports::{dat_ia_close, dat_ia_openv, dat_ia_query, dat_strerror};
use dat2::registry;
use dat_abi::*;
use dat_abi12 as d12;
use std::ffi::{c_char, c_void, CStr, CString};
use std::process::ExitCode;
use std::sync::OnceLock;

type StrErrorFn =
    unsafe extern "C" fn(DAT_RETURN, *mut *const c_char, *mut *const c_char) -> DAT_RETURN;

/// `rc` named by a registry's dat_strerror (each version numbers its codes
/// its own way).
fn code_name_by(strerror: StrErrorFn, rc: DAT_RETURN) -> String {
    let (mut major, mut minor): (*const c_char, *const c_char) =
        (std::ptr::null(), std::ptr::null());
    // SAFETY: dat_strerror writes static strings into the two pointers.
    let known = unsafe { strerror(rc, &mut major, &mut minor) } == DAT_SUCCESS;
    if known && !major.is_null() && !minor.is_null() {
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

/// A DAT 2.0 code's name.
fn code_name(rc: DAT_RETURN) -> String {
    code_name_by(dat_strerror, rc)
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

/// What datinfo shows of an open IA: the fields DAT 2.0's and DAT 1.2's
/// query structs (DAT_IA_ATTR, DAT_PROVIDER_ATTR) both carry, under the
/// same names, so that an entry of either version shows the same lines.
struct Summary {
    address: String,
    adapter: String,
    vendor: String,
    provider: String,
    provider_version: (u32, u32),
    dat_version: (u32, u32),
    max_eps: DAT_COUNT,
    max_evds: DAT_COUNT,
    max_evd_qlen: DAT_COUNT,
    max_lmrs: DAT_COUNT,
    max_rmrs: DAT_COUNT,
    max_iov_segments_per_rdma_read: DAT_COUNT,
    max_message_size: u64,
    max_rdma_size: u64,
    max_iov_segments_per_dto: DAT_COUNT,
    max_rdma_read_in: DAT_COUNT,
    max_rdma_read_out: DAT_COUNT,
    srq: bool,
    max_private_data_size: DAT_COUNT,
    thread_safe: bool,
}

/// A [`Summary`] of a DAT_IA_ATTR and DAT_PROVIDER_ATTR of either version.
macro_rules! summary {
    ($attr:expr, $pattr:expr) => {{
        let (attr, pattr) = (&$attr, &$pattr);
        Summary {
            address: ipv4(attr.ia_address_ptr),
            adapter: c_chars(&attr.adapter_name),
            vendor: c_chars(&attr.vendor_name),
            provider: c_chars(&pattr.provider_name),
            provider_version: (pattr.provider_version_major, pattr.provider_version_minor),
            dat_version: (pattr.dapl_version_major, pattr.dapl_version_minor),
            max_eps: attr.max_eps,
            max_evds: attr.max_evds,
            max_evd_qlen: attr.max_evd_qlen,
            max_lmrs: attr.max_lmrs,
            max_rmrs: attr.max_rmrs,
            max_iov_segments_per_rdma_read: attr.max_iov_segments_per_rdma_read,
            max_message_size: u64::from(attr.max_message_size),
            max_rdma_size: u64::from(attr.max_rdma_size),
            max_iov_segments_per_dto: attr.max_iov_segments_per_dto,
            max_rdma_read_in: attr.max_rdma_read_in,
            max_rdma_read_out: attr.max_rdma_read_out,
            srq: pattr.srq_supported != DAT_FALSE,
            max_private_data_size: pattr.max_private_data_size,
            thread_safe: pattr.is_thread_safe != DAT_FALSE,
        }
    }};
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

impl Summary {
    fn lines(&self) -> Vec<String> {
        vec![
            format!(
                "IA address {}, adapter \"{}\", vendor \"{}\", provider \"{}\" {}.{}",
                self.address,
                self.adapter,
                self.vendor,
                self.provider,
                self.provider_version.0,
                self.provider_version.1
            ),
            format!(
                "max EPs {}, max EVDs {} (qlen {}), max LMRs {}, max message {} B, max RDMA {} B, IOV {} segments, RDMA reads in flight {}/{}",
                self.max_eps,
                self.max_evds,
                self.max_evd_qlen,
                self.max_lmrs,
                self.max_message_size,
                self.max_rdma_size,
                self.max_iov_segments_per_dto,
                self.max_rdma_read_in,
                self.max_rdma_read_out
            ),
            format!(
                "max RMRs {}{}, RDMA read into {} segments",
                self.max_rmrs,
                if self.max_rmrs == 0 {
                    " (no memory windows: dat_rmr_create refused)"
                } else {
                    ""
                },
                self.max_iov_segments_per_rdma_read
            ),
            format!(
                "SRQ {}, max private data {} B, thread safe {}, DAT API {}.{}",
                yes_no(self.srq),
                self.max_private_data_size,
                yes_no(self.thread_safe),
                self.dat_version.0,
                self.dat_version.1
            ),
        ]
    }
}

/// Why an entry did not open.
enum Failure {
    /// The whole reason, ready to print.
    Why(String),
    /// dat_ia_openv failed with this code (named): the provider refused,
    /// unless the registry said on stderr that it could not load it.
    Open(String),
}

/// Opens one entry through the registry of its DAT version and describes
/// it.
fn describe(e: &conf::ConfEntry) -> Result<Vec<String>, Failure> {
    if e.api_major == d12::DAT_VERSION_MAJOR {
        describe12(e)
    } else {
        describe20(e)
    }
}

/// A `u2.0` entry, through the DAT 2.0 registry linked in.
fn describe20(e: &conf::ConfEntry) -> Result<Vec<String>, Failure> {
    let name = CString::new(e.ia_name.as_str())
        .map_err(|_| Failure::Why("IA name contains a NUL byte".into()))?;
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
        return Err(match registry::take_load_failure() {
            Some(load) => Failure::Why(format!("cannot load: {load}")),
            None => Failure::Open(code_name(rc)),
        });
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
    let mut lines = if rc == DAT_SUCCESS {
        let mut l = summary!(attr, pattr).lines();
        l.push(provider_specific(&pattr));
        l
    } else {
        vec![format!(
            "opened, but dat_ia_query failed: {}",
            code_name(rc)
        )]
    };
    // SAFETY: ia is open.
    let rc = unsafe { dat_ia_close(ia, DAT_CLOSE_ABRUPT_FLAG) };
    if rc != DAT_SUCCESS {
        lines.push(format!("dat_ia_close failed: {}", code_name(rc)));
    }
    Ok(lines)
}

/// The provider's named attributes on one line: what the IB extensions offer on this IA
/// (DAT_IB_ATTR_FETCH_AND_ADD, _CMP_AND_SWAP, _IMMED_DATA, _UD: present only where the
/// device has them), the transport MTU, ...
fn provider_specific(p: &DAT_PROVIDER_ATTR) -> String {
    let mut pairs = Vec::new();
    for i in 0..p.num_provider_specific_attr.max(0) as usize {
        if p.provider_specific_attr.is_null() {
            break;
        }
        // SAFETY: the provider's array of num_provider_specific_attr entries, valid while
        // the IA is open.
        let a = unsafe { &*p.provider_specific_attr.add(i) };
        let s = |c: *const c_char| {
            if c.is_null() {
                String::new()
            } else {
                // SAFETY: a NUL-terminated string of the provider's.
                unsafe { std::ffi::CStr::from_ptr(c) }
                    .to_string_lossy()
                    .into_owned()
            }
        };
        let (n, v) = (s(a.name), s(a.value));
        if n == "DAT_IB_DEVICE_NAME" {
            continue; // the adapter above
        }
        if n == "DAPLRS_PIN_LIMIT" {
            // Our provider's (provider-ffi's PIN_LIMIT_ATTR): registrations pin against
            // RLIMIT_MEMLOCK (siw, even for root).
            let kib = v
                .parse::<u64>()
                .map_or(v.clone(), |b| format!("{} KiB", b / 1024));
            pairs.push(format!(
                "locked-memory limit {kib} (RLIMIT_MEMLOCK: registrations beyond it fail; ulimit -l)"
            ));
            continue;
        }
        pairs.push(if v == "TRUE" { n } else { format!("{n}={v}") });
    }
    if pairs.is_empty() {
        "provider attributes: none".to_string()
    } else {
        format!("provider attributes: {}", pairs.join(" "))
    }
}

type IaOpenvFn = unsafe extern "C" fn(
    *const c_char,
    DAT_COUNT,
    *mut DAT_EVD_HANDLE,
    *mut DAT_IA_HANDLE,
    DAT_UINT32,
    DAT_UINT32,
    DAT_BOOLEAN,
) -> DAT_RETURN;
type IaQuery12Fn = unsafe extern "C" fn(
    DAT_IA_HANDLE,
    *mut DAT_EVD_HANDLE,
    DAT_IA_ATTR_MASK,
    *mut d12::DAT_IA_ATTR,
    DAT_PROVIDER_ATTR_MASK,
    *mut d12::DAT_PROVIDER_ATTR,
) -> DAT_RETURN;
type IaCloseFn = unsafe extern "C" fn(DAT_IA_HANDLE, DAT_CLOSE_FLAGS) -> DAT_RETURN;

/// libdat.so.1, the DAT 1.2 registry, and the calls datinfo makes of it.
struct Libdat12 {
    /// The file the loader found.
    path: String,
    ia_openv: IaOpenvFn,
    ia_query: IaQuery12Fn,
    ia_close: IaCloseFn,
    strerror: StrErrorFn,
}

/// The soname DAT 1.2 programs link (`-ldat`).
const LIBDAT12: &CStr = c"libdat.so.1";

/// libdat.so.1, loaded at the first `u1.2` entry and kept; Err says why it
/// could not be.
fn libdat12() -> Result<&'static Libdat12, String> {
    static LIB: OnceLock<Result<Libdat12, String>> = OnceLock::new();
    LIB.get_or_init(load_libdat12)
        .as_ref()
        .map_err(Clone::clone)
}

fn dlerror_string() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated message.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown loader error".into()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

fn load_libdat12() -> Result<Libdat12, String> {
    let lib = LIBDAT12.to_string_lossy();
    // SAFETY: a NUL-terminated name. RTLD_GLOBAL, as a program linked with
    // -ldat has it: providers find the 1.2 registry's
    // dat_registry_add_provider@DAT_1.2 in the global scope.
    let dl = unsafe { libc::dlopen(LIBDAT12.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if dl.is_null() {
        return Err(format!(
            "cannot load {lib}, the DAT 1.2 registry: {}",
            dlerror_string()
        ));
    }
    let sym = |name: &CStr| -> Result<*mut c_void, String> {
        // SAFETY: dl is a live handle; name is NUL-terminated. The lookup
        // starts at libdat.so.1, so its own definition wins over datinfo's
        // (2.0) one of the same name.
        let p = unsafe { libc::dlsym(dl, name.as_ptr()) };
        if p.is_null() {
            Err(format!(
                "{lib} has no {}: {}",
                name.to_string_lossy(),
                dlerror_string()
            ))
        } else {
            Ok(p)
        }
    };
    let (openv, query, close, strerror) = (
        sym(c"dat_ia_openv")?,
        sym(c"dat_ia_query")?,
        sym(c"dat_ia_close")?,
        sym(c"dat_strerror")?,
    );
    // SAFETY: an all-zero Dl_info is valid; dladdr fills it for an
    // address inside a loaded object.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `openv` is an address of a loaded object.
    let path = if unsafe { libc::dladdr(openv, &mut info) } != 0 && !info.dli_fname.is_null() {
        // SAFETY: dladdr's file name is a NUL-terminated string.
        let found = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy();
        std::fs::canonicalize(&*found)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| found.into_owned())
    } else {
        lib.into_owned()
    };
    // SAFETY: the DAT 1.2 API (<dat/udat.h>) gives these functions these
    // signatures.
    unsafe {
        Ok(Libdat12 {
            path,
            ia_openv: std::mem::transmute::<*mut c_void, IaOpenvFn>(openv),
            ia_query: std::mem::transmute::<*mut c_void, IaQuery12Fn>(query),
            ia_close: std::mem::transmute::<*mut c_void, IaCloseFn>(close),
            strerror: std::mem::transmute::<*mut c_void, StrErrorFn>(strerror),
        })
    }
}

/// A `u1.2` entry, through libdat.so.1 with DAT 1.2's structs, as a DAT
/// 1.2 program opens it.
fn describe12(e: &conf::ConfEntry) -> Result<Vec<String>, Failure> {
    let lib = libdat12().map_err(Failure::Why)?;
    let name = CString::new(e.ia_name.as_str())
        .map_err(|_| Failure::Why("IA name contains a NUL byte".into()))?;
    let mut ia: DAT_IA_HANDLE = std::ptr::null_mut();
    let mut async_evd: DAT_EVD_HANDLE = std::ptr::null_mut();
    let ts = if e.thread_safe {
        d12::DAT_TRUE
    } else {
        d12::DAT_FALSE
    };
    // SAFETY: valid pointers to locals; libdat.so.1's dat_ia_openv.
    let rc = unsafe {
        (lib.ia_openv)(
            name.as_ptr(),
            8,
            &mut async_evd,
            &mut ia,
            e.api_major,
            e.api_minor,
            ts,
        )
    };
    let code = |rc| code_name_by(lib.strerror, rc);
    if rc != d12::DAT_SUCCESS {
        return Err(Failure::Open(code(rc)));
    }
    let mut lines = vec![format!("DAT 1.2 entry, opened through {}", lib.path)];
    // SAFETY: all-zero is a valid value of these plain C structs.
    let mut attr: d12::DAT_IA_ATTR = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut pattr: d12::DAT_PROVIDER_ATTR = unsafe { std::mem::zeroed() };
    // SAFETY: ia is open; the attribute structs are ours, of 1.2's layout.
    let rc = unsafe {
        (lib.ia_query)(
            ia,
            std::ptr::null_mut(),
            d12::DAT_IA_FIELD_ALL,
            &mut attr,
            d12::DAT_PROVIDER_FIELD_ALL,
            &mut pattr,
        )
    };
    if rc == d12::DAT_SUCCESS {
        lines.extend(summary!(attr, pattr).lines());
    } else {
        lines.push(format!("opened, but dat_ia_query failed: {}", code(rc)));
    }
    // SAFETY: ia is open.
    let rc = unsafe { (lib.ia_close)(ia, d12::DAT_CLOSE_ABRUPT_FLAG) };
    if rc != d12::DAT_SUCCESS {
        lines.push(format!("dat_ia_close failed: {}", code(rc)));
    }
    Ok(lines)
}

/// The load failure a registry library reported on stderr
/// ("libdat: warning: dat.conf entry 'x' (origin): provider library 'l':
/// why"), from `provider library` on: the reason libdat.so.1 gives no
/// other way.
fn registry_load_warning(said: &str) -> Option<&str> {
    said.lines()
        .filter(|l| l.contains(": warning: dat.conf entry '"))
        .find_map(|l| l.find("provider library '").map(|i| l[i..].trim_end()))
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

type OfiDescribeFn = unsafe extern "C" fn(*const c_char, *mut c_char, usize) -> i32;
type OfiEntriesFn = unsafe extern "C" fn(*mut c_char, usize) -> i32;

/// `symbol` of provider library `library`, loaded as the registry loads it (the same
/// handle when it already did).
fn provider_symbol(library: &str, symbol: &CStr) -> Result<*mut c_void, String> {
    let lib = CString::new(library).map_err(|_| "library name contains a NUL byte".to_string())?;
    // SAFETY: a valid C string; the library stays loaded (never dlclosed).
    let handle = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW) };
    if handle.is_null() {
        return Err(dlerror_string());
    }
    // SAFETY: a handle dlopen returned and a valid C string.
    let f = unsafe { libc::dlsym(handle, symbol.as_ptr()) };
    if f.is_null() {
        return Err(format!("{library} has no {}", symbol.to_string_lossy()));
    }
    Ok(f)
}

/// For an ofi entry ("ofi tcp lo") whose library can say (libdaplrs-ofi.so.2's
/// daplrs_ofi_describe): libfabric's provider, fabric, domain, endpoint type, MR mode and
/// limits. Nothing for other entries.
fn ofi_details(e: &conf::ConfEntry) -> Vec<String> {
    if e.ia_params.split_whitespace().next() != Some("ofi") {
        return Vec::new();
    }
    let Ok(f) = provider_symbol(&e.library, c"daplrs_ofi_describe") else {
        return Vec::new();
    };
    // SAFETY: the library's daplrs_ofi_describe, of this type (src/provider-ofi).
    let describe: OfiDescribeFn = unsafe { std::mem::transmute(f) };
    let Ok(params) = CString::new(e.ia_params.as_str()) else {
        return Vec::new();
    };
    let mut buf = vec![0 as c_char; 4096];
    // SAFETY: a C string and a buffer of buf.len() bytes.
    let rc = unsafe { describe(params.as_ptr(), buf.as_mut_ptr(), buf.len()) };
    // SAFETY: daplrs_ofi_describe NUL-terminates within the buffer.
    let text = unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    match rc {
        0 => text.lines().map(str::to_string).collect(),
        _ => vec![format!("libfabric: {text}")],
    }
}

/// `datinfo --ofi-entries LIBRARY`: the dat.conf entries (IA name, ia_params) LIBRARY's
/// libfabric backend supports on this host, one "NAME<TAB>PARAMS" line each (make install).
fn print_ofi_entries(library: &str) -> ExitCode {
    let f = match provider_symbol(library, c"daplrs_ofi_entries") {
        Ok(f) => f,
        Err(why) => {
            eprintln!("datinfo: {why}");
            return ExitCode::from(1);
        }
    };
    // SAFETY: the library's daplrs_ofi_entries, of this type (src/provider-ofi).
    let entries: OfiEntriesFn = unsafe { std::mem::transmute(f) };
    let mut buf = vec![0 as c_char; 1 << 16];
    let (n, said) =
        // SAFETY: a buffer of buf.len() bytes.
        capturing_stderr(|| unsafe { entries(buf.as_mut_ptr(), buf.len()) });
    if n < 0 {
        eprintln!("datinfo: {library}: daplrs_ofi_entries failed{said}");
        return ExitCode::from(1);
    }
    // SAFETY: NUL-terminated within the buffer.
    let text = unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    if !text.is_empty() {
        println!("{text}");
    }
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    let only: Vec<String> = std::env::args().skip(1).collect();
    if only.len() == 2 && only[0] == "--ofi-entries" {
        return print_ofi_entries(&only[1]);
    }
    if only.iter().any(|a| a == "-h" || a == "--help") {
        println!(
            "usage: datinfo [IA_NAME...] | datinfo --ofi-entries LIBRARY\nLists the dat.conf entries in effect and opens each IA as a program of\nits DAT version would: u2.0 entries through the DAT 2.0 registry, u1.2\nentries through libdat.so.1."
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
        let (result, said) = capturing_stderr(|| {
            describe(e).map(|mut lines| {
                lines.extend(ofi_details(e));
                lines
            })
        });
        match result {
            Ok(lines) => lines.iter().for_each(|l| println!("    {l}")),
            Err(failure) => {
                failures += 1;
                match failure {
                    Failure::Why(why) => println!("    {why}"),
                    Failure::Open(code) => match registry_load_warning(&said) {
                        Some(load) => println!("    cannot load: {load}"),
                        None => println!("    the provider refused to open it: {code}"),
                    },
                }
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
