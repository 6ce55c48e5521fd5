//! Parameter, attribute and event structures of DAT 2.0.
use crate::basic::*;
use crate::consts::*;
use core::ffi::c_char;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dat_rmr_param {
    pub ia_handle: DAT_IA_HANDLE,
    pub pz_handle: DAT_PZ_HANDLE,
    pub lmr_triplet: DAT_LMR_TRIPLET,
    pub mem_priv: DAT_MEM_PRIV_FLAGS,
    pub rmr_context: DAT_RMR_CONTEXT,
    pub rmr_scope: DAT_RMR_SCOPE,
    pub va_type: DAT_VA_TYPE,
}
pub type DAT_RMR_PARAM = dat_rmr_param;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dat_ep_attr {
    pub service_type: DAT_SERVICE_TYPE,
    pub max_message_size: DAT_SEG_LENGTH,
    pub max_rdma_size: DAT_SEG_LENGTH,
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
    pub comm: DAT_COMM,
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

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct dat_srq_attr {
    pub max_recv_dtos: DAT_COUNT,
    pub max_recv_iov: DAT_COUNT,
    pub low_watermark: DAT_COUNT,
}
pub type DAT_SRQ_ATTR = dat_srq_attr;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dat_srq_param {
    pub ia_handle: DAT_IA_HANDLE,
    pub srq_state: DAT_SRQ_STATE,
    pub pz_handle: DAT_PZ_HANDLE,
    pub max_recv_dtos: DAT_COUNT,
    pub max_recv_iov: DAT_COUNT,
    pub low_watermark: DAT_COUNT,
    pub available_dto_count: DAT_COUNT,
    pub outstanding_dto_count: DAT_COUNT,
}
pub type DAT_SRQ_PARAM = dat_srq_param;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dat_pz_param {
    pub ia_handle: DAT_IA_HANDLE,
}
pub type DAT_PZ_PARAM = dat_pz_param;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dat_psp_param {
    pub ia_handle: DAT_IA_HANDLE,
    pub conn_qual: DAT_CONN_QUAL,
    pub evd_handle: DAT_EVD_HANDLE,
    pub psp_flags: DAT_PSP_FLAGS,
}
pub type DAT_PSP_PARAM = dat_psp_param;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dat_rsp_param {
    pub ia_handle: DAT_IA_HANDLE,
    pub conn_qual: DAT_CONN_QUAL,
    pub evd_handle: DAT_EVD_HANDLE,
    pub ep_handle: DAT_EP_HANDLE,
}
pub type DAT_RSP_PARAM = dat_rsp_param;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dat_csp_param {
    pub ia_handle: DAT_IA_HANDLE,
    pub comm: *mut DAT_COMM,
    pub address_ptr: DAT_IA_ADDRESS_PTR,
    pub evd_handle: DAT_EVD_HANDLE,
}
pub type DAT_CSP_PARAM = dat_csp_param;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dat_cr_param {
    pub remote_ia_address_ptr: DAT_IA_ADDRESS_PTR,
    pub remote_port_qual: DAT_PORT_QUAL,
    pub private_data_size: DAT_COUNT,
    pub private_data: DAT_PVOID,
    pub local_ep_handle: DAT_EP_HANDLE,
}
pub type DAT_CR_PARAM = dat_cr_param;

// ------------------------------------------------------------------ events

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dat_dto_completion_event_data {
    pub ep_handle: DAT_EP_HANDLE,
    pub user_cookie: DAT_DTO_COOKIE,
    pub status: DAT_DTO_COMPLETION_STATUS,
    pub transfered_length: DAT_SEG_LENGTH,
    pub operation: DAT_DTOS,
    pub rmr_context: DAT_RMR_CONTEXT,
}
pub type DAT_DTO_COMPLETION_EVENT_DATA = dat_dto_completion_event_data;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dat_rmr_bind_completion_event_data {
    pub rmr_handle: DAT_RMR_HANDLE,
    pub user_cookie: DAT_RMR_COOKIE,
    pub status: DAT_RMR_BIND_COMPLETION_STATUS,
}
pub type DAT_RMR_BIND_COMPLETION_EVENT_DATA = dat_rmr_bind_completion_event_data;

#[repr(C)]
#[derive(Clone, Copy)]
pub union dat_sp_handle {
    pub rsp_handle: DAT_RSP_HANDLE,
    pub psp_handle: DAT_PSP_HANDLE,
    pub csp_handle: DAT_CSP_HANDLE,
}
pub type DAT_SP_HANDLE = dat_sp_handle;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct dat_cr_arrival_event_data {
    pub sp_handle: DAT_SP_HANDLE,
    pub local_ia_address_ptr: DAT_IA_ADDRESS_PTR,
    pub conn_qual: DAT_CONN_QUAL,
    pub cr_handle: DAT_CR_HANDLE,
    pub truncate_flag: DAT_BOOLEAN,
}
pub type DAT_CR_ARRIVAL_EVENT_DATA = dat_cr_arrival_event_data;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dat_connection_event_data {
    pub ep_handle: DAT_EP_HANDLE,
    pub private_data_size: DAT_COUNT,
    pub private_data: DAT_PVOID,
}
pub type DAT_CONNECTION_EVENT_DATA = dat_connection_event_data;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dat_asynch_error_event_data {
    pub dat_handle: DAT_HANDLE,
    pub reason: DAT_COUNT,
}
pub type DAT_ASYNCH_ERROR_EVENT_DATA = dat_asynch_error_event_data;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dat_software_event_data {
    pub pointer: DAT_PVOID,
}
pub type DAT_SOFTWARE_EVENT_DATA = dat_software_event_data;

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

/// One event as dat_evd_wait / dat_evd_dequeue return it (120 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct dat_event {
    pub event_number: DAT_EVENT_NUMBER,
    pub evd_handle: DAT_EVD_HANDLE,
    pub event_data: DAT_EVENT_DATA,
    pub event_extension_data: [DAT_UINT64; 8],
}
pub type DAT_EVENT = dat_event;

// ---------------------------------------------------------- registry info

/// What identifies a provider in the registry: its IA name, the DAT
/// version it serves and whether it is thread-safe (268 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct dat_provider_info {
    pub ia_name: [c_char; DAT_NAME_MAX_LENGTH],
    pub dapl_version_major: DAT_UINT32,
    pub dapl_version_minor: DAT_UINT32,
    pub is_thread_safe: DAT_BOOLEAN,
}
pub type DAT_PROVIDER_INFO = dat_provider_info;

// ------------------------------------------------------- udat: EVD, LMR, CNO

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dat_evd_param {
    pub ia_handle: DAT_IA_HANDLE,
    pub evd_qlen: DAT_COUNT,
    pub evd_state: DAT_EVD_STATE,
    pub cno_handle: DAT_CNO_HANDLE,
    pub evd_flags: DAT_EVD_FLAGS,
}
pub type DAT_EVD_PARAM = dat_evd_param;

/// `typedef char (*DAT_LMR_COOKIE)[DAT_LMR_COOKIE_SIZE]`.
pub type DAT_LMR_COOKIE = *mut [c_char; DAT_LMR_COOKIE_SIZE];

/// The consumer's callback run when a CNO fires.
pub type DAT_AGENT_FUNC =
    Option<unsafe extern "C" fn(instance_data: DAT_PVOID, evd: DAT_EVD_HANDLE)>;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dat_os_wait_proxy_agent {
    pub instance_data: DAT_PVOID,
    pub proxy_agent_func: DAT_AGENT_FUNC,
}
pub type DAT_OS_WAIT_PROXY_AGENT = dat_os_wait_proxy_agent;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct dat_shared_memory {
    pub virtual_address: DAT_PVOID,
    pub shared_memory_id: DAT_LMR_COOKIE,
}
pub type DAT_SHARED_MEMORY = dat_shared_memory;

#[repr(C)]
#[derive(Clone, Copy)]
pub union dat_region_description {
    pub for_va: DAT_PVOID,
    pub for_lmr_handle: DAT_LMR_HANDLE,
    pub for_shared_memory: DAT_SHARED_MEMORY,
}
pub type DAT_REGION_DESCRIPTION = dat_region_description;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct dat_lmr_param {
    pub ia_handle: DAT_IA_HANDLE,
    pub mem_type: DAT_MEM_TYPE,
    pub region_desc: DAT_REGION_DESCRIPTION,
    pub length: DAT_VLEN,
    pub pz_handle: DAT_PZ_HANDLE,
    pub mem_priv: DAT_MEM_PRIV_FLAGS,
    pub va_type: DAT_VA_TYPE,
    pub lmr_context: DAT_LMR_CONTEXT,
    pub rmr_context: DAT_RMR_CONTEXT,
    pub registered_size: DAT_VLEN,
    pub registered_address: DAT_VADDR,
}
pub type DAT_LMR_PARAM = dat_lmr_param;

/// The proxy member of DAT_CNO_PARAM (an anonymous union in OFED's header).
#[repr(C)]
#[derive(Clone, Copy)]
pub union dat_cno_proxy {
    pub agent: DAT_OS_WAIT_PROXY_AGENT,
    pub fd: DAT_FD,
    pub none: DAT_PVOID,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct dat_cno_param {
    pub ia_handle: DAT_IA_HANDLE,
    pub proxy_type: DAT_PROXY_TYPE,
    pub proxy: dat_cno_proxy,
}
pub type DAT_CNO_PARAM = dat_cno_param;

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
    pub max_lmr_block_size: DAT_SEG_LENGTH,
    pub max_lmr_virtual_address: DAT_VADDR,
    pub max_pzs: DAT_COUNT,
    pub max_message_size: DAT_SEG_LENGTH,
    pub max_rdma_size: DAT_SEG_LENGTH,
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
    pub zb_supported: DAT_BOOLEAN,
    pub extension_supported: DAT_EXTENSION,
    pub extension_version: DAT_COUNT,
    pub num_transport_attr: DAT_COUNT,
    pub transport_attr: *mut DAT_NAMED_ATTR,
    pub num_vendor_attr: DAT_COUNT,
    pub vendor_attr: *mut DAT_NAMED_ATTR,
}
pub type DAT_IA_ATTR = dat_ia_attr;

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
    pub rdma_read_lmr_rmr_context_exposure: DAT_BOOLEAN,
    pub rmr_scope_supported: DAT_RMR_SCOPE,
    pub is_signal_safe: DAT_BOOLEAN,
    pub ha_supported: DAT_BOOLEAN,
    pub ha_loadbalancing: DAT_HA_LB,
    pub num_provider_specific_attr: DAT_COUNT,
    pub provider_specific_attr: *mut DAT_NAMED_ATTR,
}
pub type DAT_PROVIDER_ATTR = dat_provider_attr;

/// Rust-side layout checks (the C side is checked in tests-c/programs/abi_compare.c).
const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<DAT_LMR_TRIPLET>() == 16);
    assert!(size_of::<DAT_EVENT>() == 120);
    assert!(size_of::<DAT_EVENT_DATA>() == 40);
    assert!(size_of::<DAT_DTO_COMPLETION_EVENT_DATA>() == 32);
    assert!(size_of::<DAT_CR_ARRIVAL_EVENT_DATA>() == 40);
    assert!(size_of::<DAT_PROVIDER_INFO>() == 268);
    assert!(size_of::<DAT_EP_ATTR>() == 88);
    assert!(size_of::<DAT_EP_PARAM>() == 184);
    assert!(offset_of!(DAT_EP_PARAM, ep_attr) == 96);
    assert!(size_of::<DAT_IA_ATTR>() == 688);
    assert!(offset_of!(DAT_IA_ATTR, ia_address_ptr) == 528);
    assert!(offset_of!(DAT_IA_ATTR, vendor_attr) == 680);
    assert!(size_of::<DAT_PROVIDER_ATTR>() == 520);
    assert!(offset_of!(DAT_PROVIDER_ATTR, evd_stream_merging_supported) == 312);
    assert!(size_of::<DAT_LMR_PARAM>() == 80);
    assert!(offset_of!(DAT_LMR_PARAM, registered_address) == 72);
    assert!(size_of::<DAT_RMR_PARAM>() == 48);
    assert!(size_of::<DAT_EVD_PARAM>() == 32);
    assert!(size_of::<DAT_CR_PARAM>() == 40);
    assert!(size_of::<DAT_PSP_PARAM>() == 32);
    assert!(size_of::<DAT_RSP_PARAM>() == 32);
    assert!(size_of::<DAT_SRQ_ATTR>() == 12);
    assert!(size_of::<DAT_SRQ_PARAM>() == 48);
    assert!(size_of::<DAT_CNO_PARAM>() == 32);
};
