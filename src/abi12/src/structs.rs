//! Parameter, attribute and event structures of DAT 1.2.
//!
//! Shared unchanged with 2.0, from dat-abi: the SRQ, PZ, PSP, RSP and CR
//! parameters, the RMR-bind, connection, asynchronous-error and software
//! event data, DAT_PROVIDER_INFO, DAT_EVD_PARAM and the memory-region
//! description with its shared-memory cookie and the CNO's wait agent.
//!
//! 1.2's own shapes: the triplet-bearing DAT_RMR_PARAM; DAT_EP_ATTR with
//! 64-bit message and RDMA sizes (104 bytes); DAT_EP_PARAM without a
//! DAT_COMM; the DTO completion with a 64-bit `transfered_length` and no
//! operation or context; connection-request data without CSP or truncation
//! flag; DAT_EVENT without extension data (48 bytes); DAT_LMR_PARAM without
//! a VA type; DAT_CNO_PARAM with only an agent; and the IA and provider
//! attributes without the fields 2.0 added.
use crate::basic::*;
use crate::consts::*;
use core::ffi::c_char;

pub use dat_abi::structs::{
    dat_asynch_error_event_data, dat_connection_event_data, dat_cr_param, dat_evd_param,
    dat_os_wait_proxy_agent, dat_provider_info, dat_psp_param, dat_pz_param,
    dat_region_description, dat_rmr_bind_completion_event_data, dat_rsp_param, dat_shared_memory,
    dat_software_event_data, dat_srq_attr, dat_srq_param, DAT_AGENT_FUNC,
    DAT_ASYNCH_ERROR_EVENT_DATA, DAT_CONNECTION_EVENT_DATA, DAT_CR_PARAM, DAT_EVD_PARAM,
    DAT_LMR_COOKIE, DAT_OS_WAIT_PROXY_AGENT, DAT_PROVIDER_INFO, DAT_PSP_PARAM, DAT_PZ_PARAM,
    DAT_REGION_DESCRIPTION, DAT_RMR_BIND_COMPLETION_EVENT_DATA, DAT_RSP_PARAM, DAT_SHARED_MEMORY,
    DAT_SOFTWARE_EVENT_DATA, DAT_SRQ_ATTR, DAT_SRQ_PARAM,
};

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dat_rmr_param {
    pub ia_handle: DAT_IA_HANDLE,
    pub pz_handle: DAT_PZ_HANDLE,
    pub lmr_triplet: DAT_LMR_TRIPLET,
    pub mem_priv: DAT_MEM_PRIV_FLAGS,
    pub rmr_context: DAT_RMR_CONTEXT,
}
pub type DAT_RMR_PARAM = dat_rmr_param;

/// Endpoint attributes (104 bytes): message and RDMA sizes are DAT_VLEN.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dat_ep_attr {
    pub service_type: DAT_SERVICE_TYPE,
    pub max_message_size: DAT_VLEN,
    pub max_rdma_size: DAT_VLEN,
    pub qos: DAT_QOS,
    pub recv_completion_flags: DAT_COMPLETION_FLAGS,
    pub request_completion_flags: DAT_COMPLETION_FLAGS,
    pub max_recv_dtos: DAT_COUNT,
    pub max_request_dtos: DAT_COUNT,
    pub max_recv_iov: DAT_COUNT,
    pub max_request_iov: DAT_COUNT,
    pub max_rdma_read_in: DAT_COUNT,
    pub max_rdma_read_out: DAT_COUNT,
    pub srq_soft_hw: DAT_COUNT,
    pub max_rdma_read_iov: DAT_COUNT,
    pub max_rdma_write_iov: DAT_COUNT,
    pub ep_transport_specific_count: DAT_COUNT,
    pub ep_transport_specific: *mut DAT_NAMED_ATTR,
    pub ep_provider_specific_count: DAT_COUNT,
    pub ep_provider_specific: *mut DAT_NAMED_ATTR,
}
pub type DAT_EP_ATTR = dat_ep_attr;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dat_ep_param {
    pub ia_handle: DAT_IA_HANDLE,
    pub ep_state: DAT_EP_STATE,
    pub local_ia_address_ptr: DAT_IA_ADDRESS_PTR,
    pub local_port_qual: DAT_PORT_QUAL,
    pub remote_ia_address_ptr: DAT_IA_ADDRESS_PTR,
    pub remote_port_qual: DAT_PORT_QUAL,
    pub pz_handle: DAT_PZ_HANDLE,
    pub recv_evd_handle: DAT_EVD_HANDLE,
    pub request_evd_handle: DAT_EVD_HANDLE,
    pub connect_evd_handle: DAT_EVD_HANDLE,
    pub srq_handle: DAT_SRQ_HANDLE,
    pub ep_attr: DAT_EP_ATTR,
}
pub type DAT_EP_PARAM = dat_ep_param;

// ------------------------------------------------------------------ events

/// A DTO completion (32 bytes): `transfered_length` (the DAT spelling) is
/// a DAT_VLEN at offset 24.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dat_dto_completion_event_data {
    pub ep_handle: DAT_EP_HANDLE,
    pub user_cookie: DAT_DTO_COOKIE,
    pub status: DAT_DTO_COMPLETION_STATUS,
    pub transfered_length: DAT_VLEN,
}
pub type DAT_DTO_COMPLETION_EVENT_DATA = dat_dto_completion_event_data;

/// The service point a connection request arrived on (no CSP in 1.2).
#[repr(C)]
#[derive(Clone, Copy)]
pub union dat_sp_handle {
    pub rsp_handle: DAT_RSP_HANDLE,
    pub psp_handle: DAT_PSP_HANDLE,
}
pub type DAT_SP_HANDLE = dat_sp_handle;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct dat_cr_arrival_event_data {
    pub sp_handle: DAT_SP_HANDLE,
    pub local_ia_address_ptr: DAT_IA_ADDRESS_PTR,
    pub conn_qual: DAT_CONN_QUAL,
    pub cr_handle: DAT_CR_HANDLE,
}
pub type DAT_CR_ARRIVAL_EVENT_DATA = dat_cr_arrival_event_data;

#[repr(C)]
#[derive(Clone, Copy)]
pub union dat_event_data {
    pub dto_completion_event_data: DAT_DTO_COMPLETION_EVENT_DATA,
    pub rmr_completion_event_data: DAT_RMR_BIND_COMPLETION_EVENT_DATA,
    pub cr_arrival_event_data: DAT_CR_ARRIVAL_EVENT_DATA,
    pub connect_event_data: DAT_CONNECTION_EVENT_DATA,
    pub asynch_error_event_data: DAT_ASYNCH_ERROR_EVENT_DATA,
    pub software_event_data: DAT_SOFTWARE_EVENT_DATA,
}
pub type DAT_EVENT_DATA = dat_event_data;

/// One event as dat_evd_wait / dat_evd_dequeue return it (48 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct dat_event {
    pub event_number: DAT_EVENT_NUMBER,
    pub evd_handle: DAT_EVD_HANDLE,
    pub event_data: DAT_EVENT_DATA,
}
pub type DAT_EVENT = dat_event;

// ------------------------------------------------------- udat: LMR, CNO

#[repr(C)]
#[derive(Clone, Copy)]
pub struct dat_lmr_param {
    pub ia_handle: DAT_IA_HANDLE,
    pub mem_type: DAT_MEM_TYPE,
    pub region_desc: DAT_REGION_DESCRIPTION,
    pub length: DAT_VLEN,
    pub pz_handle: DAT_PZ_HANDLE,
    pub mem_priv: DAT_MEM_PRIV_FLAGS,
    pub lmr_context: DAT_LMR_CONTEXT,
    pub rmr_context: DAT_RMR_CONTEXT,
    pub registered_size: DAT_VLEN,
    pub registered_address: DAT_VADDR,
}
pub type DAT_LMR_PARAM = dat_lmr_param;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dat_cno_param {
    pub ia_handle: DAT_IA_HANDLE,
    pub agent: DAT_OS_WAIT_PROXY_AGENT,
}
pub type DAT_CNO_PARAM = dat_cno_param;

// ------------------------------------------------------- IA and provider

/// IA attributes: the LMR block, message and RDMA sizes are DAT_VLEN; no
/// zero-based VA or extension fields.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct dat_ia_attr {
    pub adapter_name: [c_char; DAT_NAME_MAX_LENGTH],
    pub vendor_name: [c_char; DAT_NAME_MAX_LENGTH],
    pub hardware_version_major: DAT_UINT32,
    pub hardware_version_minor: DAT_UINT32,
    pub firmware_version_major: DAT_UINT32,
    pub firmware_version_minor: DAT_UINT32,
    pub ia_address_ptr: DAT_IA_ADDRESS_PTR,
    pub max_eps: DAT_COUNT,
    pub max_dto_per_ep: DAT_COUNT,
    pub max_rdma_read_per_ep_in: DAT_COUNT,
    pub max_rdma_read_per_ep_out: DAT_COUNT,
    pub max_evds: DAT_COUNT,
    pub max_evd_qlen: DAT_COUNT,
    pub max_iov_segments_per_dto: DAT_COUNT,
    pub max_lmrs: DAT_COUNT,
    pub max_lmr_block_size: DAT_VLEN,
    pub max_lmr_virtual_address: DAT_VADDR,
    pub max_pzs: DAT_COUNT,
    pub max_message_size: DAT_VLEN,
    pub max_rdma_size: DAT_VLEN,
    pub max_rmrs: DAT_COUNT,
    pub max_rmr_target_address: DAT_VADDR,
    pub max_srqs: DAT_COUNT,
    pub max_ep_per_srq: DAT_COUNT,
    pub max_recv_per_srq: DAT_COUNT,
    pub max_iov_segments_per_rdma_read: DAT_COUNT,
    pub max_iov_segments_per_rdma_write: DAT_COUNT,
    pub max_rdma_read_in: DAT_COUNT,
    pub max_rdma_read_out: DAT_COUNT,
    pub max_rdma_read_per_ep_in_guaranteed: DAT_BOOLEAN,
    pub max_rdma_read_per_ep_out_guaranteed: DAT_BOOLEAN,
    pub num_transport_attr: DAT_COUNT,
    pub transport_attr: *mut DAT_NAMED_ATTR,
    pub num_vendor_attr: DAT_COUNT,
    pub vendor_attr: *mut DAT_NAMED_ATTR,
}
pub type DAT_IA_ATTR = dat_ia_attr;

/// Provider attributes: 2.0's up to `rdma_write_for_rdma_read_req`, then
/// the provider-specific list.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct dat_provider_attr {
    pub provider_name: [c_char; DAT_NAME_MAX_LENGTH],
    pub provider_version_major: DAT_UINT32,
    pub provider_version_minor: DAT_UINT32,
    pub dapl_version_major: DAT_UINT32,
    pub dapl_version_minor: DAT_UINT32,
    pub lmr_mem_types_supported: DAT_MEM_TYPE,
    pub iov_ownership_on_return: DAT_IOV_OWNERSHIP,
    pub dat_qos_supported: DAT_QOS,
    pub completion_flags_supported: DAT_COMPLETION_FLAGS,
    pub is_thread_safe: DAT_BOOLEAN,
    pub max_private_data_size: DAT_COUNT,
    pub supports_multipath: DAT_BOOLEAN,
    pub ep_creator: DAT_EP_CREATOR_FOR_PSP,
    pub pz_support: DAT_PZ_SUPPORT,
    pub optimal_buffer_alignment: DAT_UINT32,
    pub evd_stream_merging_supported: [[DAT_BOOLEAN; 6]; 6],
    pub srq_supported: DAT_BOOLEAN,
    pub srq_watermarks_supported: DAT_COUNT,
    pub srq_ep_pz_difference_supported: DAT_BOOLEAN,
    pub srq_info_supported: DAT_COUNT,
    pub ep_recv_info_supported: DAT_COUNT,
    pub lmr_sync_req: DAT_BOOLEAN,
    pub dto_async_return_guaranteed: DAT_BOOLEAN,
    pub rdma_write_for_rdma_read_req: DAT_BOOLEAN,
    pub num_provider_specific_attr: DAT_COUNT,
    pub provider_specific_attr: *mut DAT_NAMED_ATTR,
}
pub type DAT_PROVIDER_ATTR = dat_provider_attr;

/// Rust-side layout checks (the C side: tests-c/programs/abi12_check.c).
const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<DAT_RMR_PARAM>() == 48);
    assert!(offset_of!(DAT_RMR_PARAM, mem_priv) == 40);
    assert!(size_of::<DAT_EP_ATTR>() == 104);
    assert!(offset_of!(DAT_EP_ATTR, max_message_size) == 8);
    assert!(offset_of!(DAT_EP_ATTR, max_rdma_size) == 16);
    assert!(offset_of!(DAT_EP_ATTR, qos) == 24);
    assert!(offset_of!(DAT_EP_ATTR, ep_transport_specific) == 80);
    assert!(offset_of!(DAT_EP_ATTR, ep_provider_specific) == 96);
    assert!(size_of::<DAT_EP_PARAM>() == 192);
    assert!(offset_of!(DAT_EP_PARAM, local_ia_address_ptr) == 16);
    assert!(offset_of!(DAT_EP_PARAM, ep_attr) == 88);
    assert!(size_of::<DAT_DTO_COMPLETION_EVENT_DATA>() == 32);
    assert!(offset_of!(DAT_DTO_COMPLETION_EVENT_DATA, status) == 16);
    assert!(offset_of!(DAT_DTO_COMPLETION_EVENT_DATA, transfered_length) == 24);
    assert!(size_of::<DAT_SP_HANDLE>() == 8);
    assert!(size_of::<DAT_CR_ARRIVAL_EVENT_DATA>() == 32);
    assert!(size_of::<DAT_EVENT_DATA>() == 32);
    assert!(size_of::<DAT_EVENT>() == 48);
    assert!(offset_of!(DAT_EVENT, evd_handle) == 8);
    assert!(offset_of!(DAT_EVENT, event_data) == 16);
    assert!(size_of::<DAT_LMR_PARAM>() == 80);
    assert!(offset_of!(DAT_LMR_PARAM, region_desc) == 16);
    assert!(offset_of!(DAT_LMR_PARAM, lmr_context) == 52);
    assert!(offset_of!(DAT_LMR_PARAM, registered_address) == 72);
    assert!(size_of::<DAT_CNO_PARAM>() == 24);
    assert!(size_of::<DAT_IA_ATTR>() == 688);
    assert!(offset_of!(DAT_IA_ATTR, ia_address_ptr) == 528);
    assert!(offset_of!(DAT_IA_ATTR, max_lmr_block_size) == 568);
    assert!(offset_of!(DAT_IA_ATTR, max_message_size) == 592);
    assert!(offset_of!(DAT_IA_ATTR, num_transport_attr) == 660);
    assert!(offset_of!(DAT_IA_ATTR, vendor_attr) == 680);
    assert!(size_of::<DAT_PROVIDER_ATTR>() == 504);
    assert!(offset_of!(DAT_PROVIDER_ATTR, evd_stream_merging_supported) == 312);
    assert!(offset_of!(DAT_PROVIDER_ATTR, provider_specific_attr) == 496);
    // Shared with 2.0 (dat-abi), unchanged.
    assert!(size_of::<DAT_PROVIDER_INFO>() == 268);
    assert!(size_of::<DAT_CR_PARAM>() == 40);
    assert!(size_of::<DAT_SRQ_PARAM>() == 48);
    assert!(size_of::<DAT_EVD_PARAM>() == 32);
    assert!(size_of::<DAT_REGION_DESCRIPTION>() == 16);
};
