//! The InfiniBand extensions of DAT 2.0 (OFED's `<dat2/dat_ib_extensions.h>`, interface
//! version 2.0.9): extended operations reached through `dat_extension_op`, the extended DTO
//! completion event and its payload, the extra memory privilege and service type, the counter
//! sets, and the provider-attribute names a program probes.
//!
//! Values are the ones Debian's header gives (tests-c/programs/abi_compare.c asserts each).

use crate::basic::*;
use crate::consts::*;

/// DAT_IB_EXTENSION_VERSION: 2.0.9, reported as `extension_version` of DAT_IA_ATTR.
pub const DAT_IB_EXTENSION_VERSION: u32 = 209;

// ---- enum dat_ib_op: the `ext_op` argument of dat_extension_op
pub type DAT_IB_OP = u32;
pub const DAT_IB_FETCH_AND_ADD_OP: DAT_IB_OP = 0;
pub const DAT_IB_CMP_AND_SWAP_OP: DAT_IB_OP = 1;
pub const DAT_IB_RDMA_WRITE_IMMED_OP: DAT_IB_OP = 2;
pub const DAT_IB_UD_SEND_OP: DAT_IB_OP = 3;
pub const DAT_IB_QUERY_COUNTERS_OP: DAT_IB_OP = 4;
pub const DAT_IB_PRINT_COUNTERS_OP: DAT_IB_OP = 5;
pub const DAT_IB_COLLECTIVE_CREATE_MEMBER_OP: DAT_IB_OP = 6;
pub const DAT_IB_COLLECTIVE_BARRIER_OP: DAT_IB_OP = 25;
pub const DAT_IB_START_COUNTERS_OP: DAT_IB_OP = 26;
pub const DAT_IB_STOP_COUNTERS_OP: DAT_IB_OP = 27;
pub const DAT_IB_UD_CM_FREE_OP: DAT_IB_OP = 28;
pub const DAT_IB_UD_AH_FREE_OP: DAT_IB_OP = 29;
pub const DAT_IB_OPEN_QUERY_OP: DAT_IB_OP = DAT_OPEN_EXTENSION_BASE;
pub const DAT_IB_CLOSE_QUERY_OP: DAT_IB_OP = DAT_CLOSE_EXTENSION_BASE;

// ---- enum dat_ib_event_number
pub const DAT_IB_DTO_EVENT: DAT_EVENT_NUMBER = DAT_IB_EXTENSION_RANGE_BASE;
pub const DAT_IB_UD_CONNECTION_REQUEST_EVENT: DAT_EVENT_NUMBER = DAT_IB_EXTENSION_RANGE_BASE + 1;
pub const DAT_IB_UD_CONNECTION_EVENT_ESTABLISHED: DAT_EVENT_NUMBER =
    DAT_IB_EXTENSION_RANGE_BASE + 2;
pub const DAT_IB_UD_CONNECTION_REJECT_EVENT: DAT_EVENT_NUMBER = DAT_IB_EXTENSION_RANGE_BASE + 3;
pub const DAT_IB_UD_CONNECTION_ERROR_EVENT: DAT_EVENT_NUMBER = DAT_IB_EXTENSION_RANGE_BASE + 4;
pub const DAT_IB_COLLECTIVE_EVENT: DAT_EVENT_NUMBER = DAT_IB_EXTENSION_RANGE_BASE + 5;

// ---- enum dat_ib_ext_type: `type` of DAT_IB_EXTENSION_EVENT_DATA
pub type DAT_IB_EXT_TYPE = u32;
pub const DAT_IB_FETCH_AND_ADD: DAT_IB_EXT_TYPE = 0;
pub const DAT_IB_CMP_AND_SWAP: DAT_IB_EXT_TYPE = 1;
pub const DAT_IB_RDMA_WRITE_IMMED: DAT_IB_EXT_TYPE = 2;
pub const DAT_IB_RDMA_WRITE_IMMED_DATA: DAT_IB_EXT_TYPE = 3;
pub const DAT_IB_RECV_IMMED_DATA: DAT_IB_EXT_TYPE = 4;
pub const DAT_IB_UD_CONNECT_REQUEST: DAT_IB_EXT_TYPE = 5;
pub const DAT_IB_UD_REMOTE_AH: DAT_IB_EXT_TYPE = 6;
pub const DAT_IB_UD_PASSIVE_REMOTE_AH: DAT_IB_EXT_TYPE = 7;
pub const DAT_IB_UD_SEND: DAT_IB_EXT_TYPE = 8;
pub const DAT_IB_UD_RECV: DAT_IB_EXT_TYPE = 9;
pub const DAT_IB_UD_CONNECT_REJECT: DAT_IB_EXT_TYPE = 10;
pub const DAT_IB_UD_CONNECT_ERROR: DAT_IB_EXT_TYPE = 11;

// ---- enum dat_ib_status: `status` of DAT_IB_EXTENSION_EVENT_DATA
pub type DAT_IB_STATUS = u32;
pub const DAT_OP_SUCCESS: DAT_IB_STATUS = 0;
pub const DAT_IB_OP_ERR: DAT_IB_STATUS = 1;
pub const DAT_IB_COLL_COMP_ERR: DAT_IB_STATUS = 2;

// ---- enum dat_ib_return
pub const DAT_IB_ERR: u32 = 0x1000_0000;
pub const DAT_IB_COLLECTIVE_ERR: u32 = 0x1000_0001;

// ---- enum dat_ib_dtos: `operation` of the DTO completion of an extended operation
pub const DAT_IB_DTO_RDMA_WRITE_IMMED: DAT_DTOS = DAT_DTO_EXTENSION_BASE;
pub const DAT_IB_DTO_RECV_IMMED: DAT_DTOS = DAT_DTO_EXTENSION_BASE + 1;
pub const DAT_IB_DTO_FETCH_ADD: DAT_DTOS = DAT_DTO_EXTENSION_BASE + 2;
pub const DAT_IB_DTO_CMP_SWAP: DAT_DTOS = DAT_DTO_EXTENSION_BASE + 3;
pub const DAT_IB_DTO_RECV_MSG_IMMED: DAT_DTOS = DAT_DTO_EXTENSION_BASE + 4;
pub const DAT_IB_DTO_SEND_UD: DAT_DTOS = DAT_DTO_EXTENSION_BASE + 5;
pub const DAT_IB_DTO_RECV_UD: DAT_DTOS = DAT_DTO_EXTENSION_BASE + 6;
pub const DAT_IB_DTO_RECV_UD_IMMED: DAT_DTOS = DAT_DTO_EXTENSION_BASE + 7;

// ---- the rest of the extension ranges
pub const DAT_IB_HANDLE_TYPE_EXT: DAT_HANDLE_TYPE = DAT_HANDLE_TYPE_EXTENSION_BASE;
pub const DAT_IB_HANDLE_TYPE_COLLECTIVE: DAT_HANDLE_TYPE = DAT_HANDLE_TYPE_EXTENSION_BASE + 1;
pub const DAT_IB_EVD_EXTENSION_FLAG: DAT_EVD_FLAGS = DAT_EVD_EXTENSION_BASE;
/// Remote atomic access to an LMR or RMR (fetch-and-add, compare-and-swap).
pub const DAT_IB_MEM_PRIV_REMOTE_ATOMIC: DAT_MEM_PRIV_FLAGS = DAT_MEM_PRIV_EXTENSION_BASE;
pub const DAT_IB_SERVICE_TYPE_UD: DAT_SERVICE_TYPE = DAT_SERVICE_TYPE_EXTENSION_BASE;

// ---- counters: array lengths of dat_query_counters (DCNT_*_ALL_COUNTERS)
pub const DCNT_IA_ALL_COUNTERS: u32 = 85;
pub const DCNT_EP_ALL_COUNTERS: u32 = 24;
pub const DCNT_EVD_ALL_COUNTERS: u32 = 10;

/// struct dat_ib_addr_handle (UD address handle; 40 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct dat_ib_addr_handle {
    pub ah: *mut core::ffi::c_void,
    pub qpn: DAT_UINT32,
    pub ia_addr: DAT_SOCK_ADDR6,
}
pub type DAT_IB_ADDR_HANDLE = dat_ib_addr_handle;

/// The payload of a DAT_IB_DTO_EVENT, in `event_extension_data` of DAT_EVENT (64 bytes).
/// `remote_ah` overlays the collective data of OFED's header (handle, context).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct dat_ib_extension_event_data {
    pub type_: DAT_IB_EXT_TYPE,
    pub status: DAT_IB_STATUS,
    /// `val.immed.data`: the immediate data of a write-with-immediate.
    pub immed_data: DAT_UINT32,
    pub remote_ah: DAT_IB_ADDR_HANDLE,
    pub context: DAT_CONTEXT,
}
pub type DAT_IB_EXTENSION_EVENT_DATA = dat_ib_extension_event_data;

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<DAT_IB_ADDR_HANDLE>() == 40);
    assert!(size_of::<DAT_IB_EXTENSION_EVENT_DATA>() == 64);
    assert!(offset_of!(DAT_IB_EXTENSION_EVENT_DATA, immed_data) == 8);
    assert!(offset_of!(DAT_IB_EXTENSION_EVENT_DATA, remote_ah) == 16);
    assert!(offset_of!(DAT_IB_EXTENSION_EVENT_DATA, context) == 56);
};

/// Provider-specific attribute names OFED's provider reports and programs probe.
pub mod attr_names {
    pub const DAT_IB_ATTR_COUNTERS: &str = "DAT_COUNTERS";
    pub const DAT_IB_ATTR_FETCH_AND_ADD: &str = "DAT_IB_FETCH_AND_ADD";
    pub const DAT_IB_ATTR_CMP_AND_SWAP: &str = "DAT_IB_CMP_AND_SWAP";
    pub const DAT_IB_ATTR_IMMED_DATA: &str = "DAT_IB_IMMED_DATA";
    pub const DAT_IB_ATTR_UD: &str = "DAT_IB_UD";
}
