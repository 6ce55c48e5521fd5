//! Scalar types, handles and small unions shared by every DAT call.
use core::ffi::{c_char, c_int, c_void};

pub use libc::{sockaddr, sockaddr_in6};

pub type DAT_UINT32 = u32;
pub type DAT_UINT64 = u64;
pub type DAT_UVERYLONG = u64;
pub type DAT_PVOID = *mut c_void;
pub type DAT_COUNT = c_int;
pub type DAT_PADDR = DAT_UINT64;
pub type DAT_FD = c_int;
pub type DAT_NAME_PTR = *mut c_char;

/// `struct sockaddr` in C; the IA address type.
pub type DAT_SOCK_ADDR = sockaddr;
/// `struct sockaddr_in6` in C.
pub type DAT_SOCK_ADDR6 = sockaddr_in6;
pub type DAT_IA_ADDRESS_PTR = *mut DAT_SOCK_ADDR;

/// Socket triple for connection-establishment service points (CSP).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct dat_comm {
    pub domain: c_int,
    pub r#type: c_int,
    pub protocol: c_int,
}
pub type DAT_COMM = dat_comm;

/// A C enum `DAT_BOOLEAN` (DAT_FALSE = 0, DAT_TRUE = 1).
pub type DAT_BOOLEAN = u32;
pub const DAT_FALSE: DAT_BOOLEAN = 0;
pub const DAT_TRUE: DAT_BOOLEAN = 1;

pub type DAT_HA_LB = DAT_UINT32;

pub type DAT_TIMEOUT = DAT_UINT32;
pub type DAT_VLEN = DAT_UINT64;
pub type DAT_VADDR = DAT_UINT64;
pub type DAT_SEG_LENGTH = DAT_UINT32;
pub type DAT_LMR_CONTEXT = DAT_UINT32;
pub type DAT_RMR_CONTEXT = DAT_UINT32;
pub type DAT_CONN_QUAL = DAT_UINT64;
pub type DAT_PORT_QUAL = DAT_UINT64;
pub type DAT_EP_PARAM_MASK = DAT_UINT64;
pub type DAT_IA_ATTR_MASK = DAT_UINT64;
pub type DAT_PROVIDER_ATTR_MASK = DAT_UINT64;
pub type DAT_EXTENDED_OP = c_int;

/// Every DAT object is reached through an opaque handle.
pub type DAT_HANDLE = DAT_PVOID;
pub type DAT_CR_HANDLE = DAT_HANDLE;
pub type DAT_EP_HANDLE = DAT_HANDLE;
pub type DAT_EVD_HANDLE = DAT_HANDLE;
pub type DAT_IA_HANDLE = DAT_HANDLE;
pub type DAT_LMR_HANDLE = DAT_HANDLE;
pub type DAT_PSP_HANDLE = DAT_HANDLE;
pub type DAT_PZ_HANDLE = DAT_HANDLE;
pub type DAT_RMR_HANDLE = DAT_HANDLE;
pub type DAT_RSP_HANDLE = DAT_HANDLE;
pub type DAT_SRQ_HANDLE = DAT_HANDLE;
pub type DAT_CSP_HANDLE = DAT_HANDLE;
pub type DAT_CNO_HANDLE = DAT_HANDLE;

/// Consumer context and cookies: 8 bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub union dat_context {
    pub as_ptr: DAT_PVOID,
    pub as_64: DAT_UINT64,
    pub as_index: DAT_UVERYLONG,
}
pub type DAT_CONTEXT = dat_context;
pub type DAT_DTO_COOKIE = DAT_CONTEXT;
pub type DAT_RMR_COOKIE = DAT_CONTEXT;

impl Default for dat_context {
    fn default() -> Self {
        dat_context { as_64: 0 }
    }
}

impl dat_context {
    pub fn from_u64(v: u64) -> Self {
        dat_context { as_64: v }
    }
    pub fn as_u64(&self) -> u64 {
        // SAFETY: every member is 8 bytes of plain data; reading the
        // integer view of any of them is defined.
        unsafe { self.as_64 }
    }
}

impl core::fmt::Debug for dat_context {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "DAT_CONTEXT({:#x})", self.as_u64())
    }
}

/// The bytes of a fixed-size C `char` array (an IA or adapter name) up to its
/// first NUL, or all of them when there is none.
pub fn c_array_bytes(a: &[c_char]) -> &[u8] {
    // SAFETY: c_char and u8 have the same size and alignment, and every bit
    // pattern is a valid u8.
    let bytes = unsafe { core::slice::from_raw_parts(a.as_ptr() as *const u8, a.len()) };
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    &bytes[..end]
}

/// A name/value pair of transport- or provider-specific attributes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dat_named_attr {
    pub name: *const c_char,
    pub value: *const c_char,
}
pub type DAT_NAMED_ATTR = dat_named_attr;

/// Local memory: `{virtual_address, segment_length, lmr_context}`, the
/// same 16 bytes as `struct ibv_sge`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct dat_lmr_triplet {
    pub virtual_address: DAT_VADDR,
    pub segment_length: DAT_SEG_LENGTH,
    pub lmr_context: DAT_LMR_CONTEXT,
}
pub type DAT_LMR_TRIPLET = dat_lmr_triplet;

/// Remote memory: `{virtual_address, segment_length, rmr_context}`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct dat_rmr_triplet {
    pub virtual_address: DAT_VADDR,
    pub segment_length: DAT_SEG_LENGTH,
    pub rmr_context: DAT_RMR_CONTEXT,
}
pub type DAT_RMR_TRIPLET = dat_rmr_triplet;
