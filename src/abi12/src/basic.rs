//! Scalars, handles and the two memory triplets of DAT 1.2.
//!
//! The scalars, handles, `DAT_CONTEXT` and `DAT_NAMED_ATTR` are those of
//! DAT 2.0 and come from `dat-abi`. The triplets are 1.2's own: 24 bytes,
//! the context first and 64-bit address and length (2.0 has 16-byte
//! triplets laid out as `struct ibv_sge`).

pub use dat_abi::basic::{
    dat_context, dat_named_attr, DAT_BOOLEAN, DAT_CNO_HANDLE, DAT_CONN_QUAL, DAT_CONTEXT,
    DAT_COUNT, DAT_CR_HANDLE, DAT_DTO_COOKIE, DAT_EP_HANDLE, DAT_EP_PARAM_MASK, DAT_EVD_HANDLE,
    DAT_HANDLE, DAT_IA_ADDRESS_PTR, DAT_IA_ATTR_MASK, DAT_IA_HANDLE, DAT_LMR_CONTEXT,
    DAT_LMR_HANDLE, DAT_NAMED_ATTR, DAT_NAME_PTR, DAT_PADDR, DAT_PORT_QUAL, DAT_PROVIDER_ATTR_MASK,
    DAT_PSP_HANDLE, DAT_PVOID, DAT_PZ_HANDLE, DAT_RMR_CONTEXT, DAT_RMR_COOKIE, DAT_RMR_HANDLE,
    DAT_RSP_HANDLE, DAT_SOCK_ADDR, DAT_SOCK_ADDR6, DAT_SRQ_HANDLE, DAT_TIMEOUT, DAT_UINT32,
    DAT_UINT64, DAT_UVERYLONG, DAT_VADDR, DAT_VLEN,
};

// The members of the C enum DAT_BOOLEAN (the typedef is dat-abi's).
pub const DAT_FALSE: DAT_BOOLEAN = 0;
pub const DAT_TRUE: DAT_BOOLEAN = 1;

/// Local memory: `{lmr_context, pad, virtual_address, segment_length}`,
/// 24 bytes; `pad` keeps the address and length 8-byte aligned.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct dat_lmr_triplet {
    pub lmr_context: DAT_LMR_CONTEXT,
    pub pad: DAT_UINT32,
    pub virtual_address: DAT_VADDR,
    pub segment_length: DAT_VLEN,
}
pub type DAT_LMR_TRIPLET = dat_lmr_triplet;

/// Remote memory: `{rmr_context, pad, target_address, segment_length}`,
/// 24 bytes, the same shape as the LMR triplet.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct dat_rmr_triplet {
    pub rmr_context: DAT_RMR_CONTEXT,
    pub pad: DAT_UINT32,
    pub target_address: DAT_VADDR,
    pub segment_length: DAT_VLEN,
}
pub type DAT_RMR_TRIPLET = dat_rmr_triplet;

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<DAT_LMR_TRIPLET>() == 24);
    assert!(offset_of!(DAT_LMR_TRIPLET, lmr_context) == 0);
    assert!(offset_of!(DAT_LMR_TRIPLET, pad) == 4);
    assert!(offset_of!(DAT_LMR_TRIPLET, virtual_address) == 8);
    assert!(offset_of!(DAT_LMR_TRIPLET, segment_length) == 16);
    assert!(size_of::<DAT_RMR_TRIPLET>() == 24);
    assert!(offset_of!(DAT_RMR_TRIPLET, rmr_context) == 0);
    assert!(offset_of!(DAT_RMR_TRIPLET, pad) == 4);
    assert!(offset_of!(DAT_RMR_TRIPLET, target_address) == 8);
    assert!(offset_of!(DAT_RMR_TRIPLET, segment_length) == 16);
};
