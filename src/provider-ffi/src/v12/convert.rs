//! Pure conversions between the DAT 2.0 C shapes the 2.0 layer fills or
//! reads and their DAT 1.2 forms. No pointer is read here: the callers hold
//! the structs already (see `boundary` for the reading).

use dat_abi as d20;
use dat_abi12 as d12;

/// A 64-bit 1.2 size as the 32-bit 2.0 field: saturating, so a request
/// above what 2.0 can state is the largest 2.0 request, which the core then
/// refuses or grants as it would that one.
fn seg_len(v: u64) -> u32 {
    v.min(u64::from(u32::MAX)) as u32
}

/// DAT_EP_ATTR of 1.2 (64-bit message and RDMA sizes) as 2.0's.
pub(crate) fn ep_attr_to_v20(a: &d12::DAT_EP_ATTR) -> d20::DAT_EP_ATTR {
    d20::DAT_EP_ATTR {
        service_type: a.service_type,
        max_message_size: seg_len(a.max_message_size),
        max_rdma_size: seg_len(a.max_rdma_size),
        qos: a.qos,
        recv_completion_flags: a.recv_completion_flags,
        request_completion_flags: a.request_completion_flags,
        max_recv_dtos: a.max_recv_dtos,
        max_request_dtos: a.max_request_dtos,
        max_recv_iov: a.max_recv_iov,
        max_request_iov: a.max_request_iov,
        max_rdma_read_in: a.max_rdma_read_in,
        max_rdma_read_out: a.max_rdma_read_out,
        srq_soft_hw: a.srq_soft_hw,
        max_rdma_read_iov: a.max_rdma_read_iov,
        max_rdma_write_iov: a.max_rdma_write_iov,
        ep_transport_specific_count: a.ep_transport_specific_count,
        ep_transport_specific: a.ep_transport_specific,
        ep_provider_specific_count: a.ep_provider_specific_count,
        ep_provider_specific: a.ep_provider_specific,
    }
}

/// DAT_EP_ATTR of 2.0 as 1.2's.
pub(crate) fn ep_attr_to_v12(a: &d20::DAT_EP_ATTR) -> d12::DAT_EP_ATTR {
    d12::DAT_EP_ATTR {
        service_type: a.service_type,
        max_message_size: u64::from(a.max_message_size),
        max_rdma_size: u64::from(a.max_rdma_size),
        qos: a.qos,
        recv_completion_flags: a.recv_completion_flags,
        request_completion_flags: a.request_completion_flags,
        max_recv_dtos: a.max_recv_dtos,
        max_request_dtos: a.max_request_dtos,
        max_recv_iov: a.max_recv_iov,
        max_request_iov: a.max_request_iov,
        max_rdma_read_in: a.max_rdma_read_in,
        max_rdma_read_out: a.max_rdma_read_out,
        srq_soft_hw: a.srq_soft_hw,
        max_rdma_read_iov: a.max_rdma_read_iov,
        max_rdma_write_iov: a.max_rdma_write_iov,
        ep_transport_specific_count: a.ep_transport_specific_count,
        ep_transport_specific: a.ep_transport_specific,
        ep_provider_specific_count: a.ep_provider_specific_count,
        ep_provider_specific: a.ep_provider_specific,
    }
}

/// 1.2's DAT_EP_PARAM_MASK in 2.0's bits: 1.2 has no DAT_COMM, so its
/// fields from the local address to the SRQ are one bit lower; the IA,
/// state and attribute bits agree.
pub(crate) fn ep_mask_to_v20(mask: d12::DAT_EP_PARAM_MASK) -> d20::DAT_EP_PARAM_MASK {
    const SAME: d12::DAT_EP_PARAM_MASK =
        d12::DAT_EP_FIELD_IA_HANDLE | d12::DAT_EP_FIELD_EP_STATE | d12::DAT_EP_FIELD_EP_ATTR_ALL;
    // LOCAL_IA_ADDRESS_PTR (0x4) ..= SRQ_HANDLE (0x400).
    const SHIFTED: d12::DAT_EP_PARAM_MASK = 0x7fc;
    // A bit no 2.0 field has: a 1.2 mask naming no 1.2 field maps onto it,
    // so the 2.0 check refuses the mask (DAT_INVALID_ARG2) where it always
    // does.
    const NO_FIELD_V20: d20::DAT_EP_PARAM_MASK = 0x8000_0000;
    let mut out = (mask & SAME) | ((mask & SHIFTED) << 1);
    if mask & !d12::DAT_EP_FIELD_ALL != 0 {
        out |= NO_FIELD_V20;
    }
    out
}

/// DAT_EP_PARAM of 2.0 as 1.2's (the DAT_COMM dropped).
pub(crate) fn ep_param_to_v12(p: &d20::DAT_EP_PARAM) -> d12::DAT_EP_PARAM {
    d12::DAT_EP_PARAM {
        ia_handle: p.ia_handle,
        ep_state: p.ep_state,
        local_ia_address_ptr: p.local_ia_address_ptr,
        local_port_qual: p.local_port_qual,
        remote_ia_address_ptr: p.remote_ia_address_ptr,
        remote_port_qual: p.remote_port_qual,
        pz_handle: p.pz_handle,
        recv_evd_handle: p.recv_evd_handle,
        request_evd_handle: p.request_evd_handle,
        connect_evd_handle: p.connect_evd_handle,
        srq_handle: p.srq_handle,
        ep_attr: ep_attr_to_v12(&p.ep_attr),
    }
}

/// DAT_EP_PARAM of 1.2 as 2.0's, for dat_ep_modify (the communicator, which
/// 1.2 cannot name, left default).
pub(crate) fn ep_param_to_v20(p: &d12::DAT_EP_PARAM) -> d20::DAT_EP_PARAM {
    d20::DAT_EP_PARAM {
        ia_handle: p.ia_handle,
        ep_state: p.ep_state,
        comm: d20::DAT_COMM::default(),
        local_ia_address_ptr: p.local_ia_address_ptr,
        local_port_qual: p.local_port_qual,
        remote_ia_address_ptr: p.remote_ia_address_ptr,
        remote_port_qual: p.remote_port_qual,
        pz_handle: p.pz_handle,
        recv_evd_handle: p.recv_evd_handle,
        request_evd_handle: p.request_evd_handle,
        connect_evd_handle: p.connect_evd_handle,
        srq_handle: p.srq_handle,
        ep_attr: ep_attr_to_v20(&p.ep_attr),
    }
}

/// DAT_LMR_PARAM of 2.0 as 1.2's (no VA type).
pub(crate) fn lmr_param_to_v12(p: &d20::DAT_LMR_PARAM) -> d12::DAT_LMR_PARAM {
    d12::DAT_LMR_PARAM {
        ia_handle: p.ia_handle,
        mem_type: p.mem_type,
        region_desc: p.region_desc,
        length: p.length,
        pz_handle: p.pz_handle,
        mem_priv: p.mem_priv,
        lmr_context: p.lmr_context,
        rmr_context: p.rmr_context,
        registered_size: p.registered_size,
        registered_address: p.registered_address,
    }
}

/// A 2.0 LMR triplet (16 bytes) as 1.2's (24 bytes).
pub(crate) fn lmr_triplet_to_v12(t: &d20::DAT_LMR_TRIPLET) -> d12::DAT_LMR_TRIPLET {
    d12::DAT_LMR_TRIPLET {
        lmr_context: t.lmr_context,
        pad: 0,
        virtual_address: t.virtual_address,
        segment_length: u64::from(t.segment_length),
    }
}

/// DAT_RMR_PARAM of 2.0 as 1.2's (a 1.2 triplet; no scope or VA type).
pub(crate) fn rmr_param_to_v12(p: &d20::DAT_RMR_PARAM) -> d12::DAT_RMR_PARAM {
    d12::DAT_RMR_PARAM {
        ia_handle: p.ia_handle,
        pz_handle: p.pz_handle,
        lmr_triplet: lmr_triplet_to_v12(&p.lmr_triplet),
        mem_priv: p.mem_priv,
        rmr_context: p.rmr_context,
    }
}

/// DAT_CNO_PARAM of 2.0 as 1.2's: the agent, or none for a CNO whose proxy
/// is a file descriptor (a 2.0 notion; a 1.2 IA's CNOs are made with an
/// agent or none).
pub(crate) fn cno_param_to_v12(p: &d20::DAT_CNO_PARAM) -> d12::DAT_CNO_PARAM {
    let agent = if p.proxy_type == d20::DAT_PROXY_TYPE_AGENT {
        // SAFETY: the proxy type says the union holds the agent.
        unsafe { p.proxy.agent }
    } else {
        d12::DAT_OS_WAIT_PROXY_AGENT {
            instance_data: std::ptr::null_mut(),
            proxy_agent_func: None,
        }
    };
    d12::DAT_CNO_PARAM {
        ia_handle: p.ia_handle,
        agent,
    }
}

/// DAT_SRQ_STATE of 2.0 as 1.2's (1.2 numbers the two states the other way
/// round and has no SHUTDOWN, which reads as the error state).
pub(crate) fn srq_state_to_v12(s: d20::DAT_SRQ_STATE) -> d12::DAT_SRQ_STATE {
    if s == d20::DAT_SRQ_STATE_OPERATIONAL {
        d12::DAT_SRQ_STATE_OPERATIONAL
    } else {
        d12::DAT_SRQ_STATE_ERROR
    }
}

/// DAT_IA_ATTR of 2.0 as 1.2's (sizes widened; no ZB or extension fields).
pub(crate) fn ia_attr_to_v12(a: &d20::DAT_IA_ATTR) -> d12::DAT_IA_ATTR {
    d12::DAT_IA_ATTR {
        adapter_name: a.adapter_name,
        vendor_name: a.vendor_name,
        hardware_version_major: a.hardware_version_major,
        hardware_version_minor: a.hardware_version_minor,
        firmware_version_major: a.firmware_version_major,
        firmware_version_minor: a.firmware_version_minor,
        ia_address_ptr: a.ia_address_ptr,
        max_eps: a.max_eps,
        max_dto_per_ep: a.max_dto_per_ep,
        max_rdma_read_per_ep_in: a.max_rdma_read_per_ep_in,
        max_rdma_read_per_ep_out: a.max_rdma_read_per_ep_out,
        max_evds: a.max_evds,
        max_evd_qlen: a.max_evd_qlen,
        max_iov_segments_per_dto: a.max_iov_segments_per_dto,
        max_lmrs: a.max_lmrs,
        max_lmr_block_size: u64::from(a.max_lmr_block_size),
        max_lmr_virtual_address: a.max_lmr_virtual_address,
        max_pzs: a.max_pzs,
        max_message_size: u64::from(a.max_message_size),
        max_rdma_size: u64::from(a.max_rdma_size),
        max_rmrs: a.max_rmrs,
        max_rmr_target_address: a.max_rmr_target_address,
        max_srqs: a.max_srqs,
        max_ep_per_srq: a.max_ep_per_srq,
        max_recv_per_srq: a.max_recv_per_srq,
        max_iov_segments_per_rdma_read: a.max_iov_segments_per_rdma_read,
        max_iov_segments_per_rdma_write: a.max_iov_segments_per_rdma_write,
        max_rdma_read_in: a.max_rdma_read_in,
        max_rdma_read_out: a.max_rdma_read_out,
        max_rdma_read_per_ep_in_guaranteed: a.max_rdma_read_per_ep_in_guaranteed,
        max_rdma_read_per_ep_out_guaranteed: a.max_rdma_read_per_ep_out_guaranteed,
        num_transport_attr: a.num_transport_attr,
        transport_attr: a.transport_attr,
        num_vendor_attr: a.num_vendor_attr,
        vendor_attr: a.vendor_attr,
    }
}

/// DAT_PROVIDER_ATTR of 2.0 as 1.2's: the fields 1.2 has, and the DAT
/// version the IA was opened with.
pub(crate) fn provider_attr_to_v12(p: &d20::DAT_PROVIDER_ATTR) -> d12::DAT_PROVIDER_ATTR {
    d12::DAT_PROVIDER_ATTR {
        provider_name: p.provider_name,
        provider_version_major: p.provider_version_major,
        provider_version_minor: p.provider_version_minor,
        dapl_version_major: d12::DAT_VERSION_MAJOR,
        dapl_version_minor: d12::DAT_VERSION_MINOR,
        lmr_mem_types_supported: p.lmr_mem_types_supported,
        iov_ownership_on_return: p.iov_ownership_on_return,
        dat_qos_supported: p.dat_qos_supported,
        completion_flags_supported: p.completion_flags_supported,
        is_thread_safe: p.is_thread_safe,
        max_private_data_size: p.max_private_data_size,
        supports_multipath: p.supports_multipath,
        ep_creator: p.ep_creator,
        pz_support: p.pz_support,
        optimal_buffer_alignment: p.optimal_buffer_alignment,
        evd_stream_merging_supported: p.evd_stream_merging_supported,
        srq_supported: p.srq_supported,
        srq_watermarks_supported: p.srq_watermarks_supported,
        srq_ep_pz_difference_supported: p.srq_ep_pz_difference_supported,
        srq_info_supported: p.srq_info_supported,
        ep_recv_info_supported: p.ep_recv_info_supported,
        lmr_sync_req: p.lmr_sync_req,
        dto_async_return_guaranteed: p.dto_async_return_guaranteed,
        rdma_write_for_rdma_read_req: p.rdma_write_for_rdma_read_req,
        num_provider_specific_attr: p.num_provider_specific_attr,
        provider_specific_attr: p.provider_specific_attr,
    }
}

/// A 2.0 DAT_EVENT (120 bytes) as 1.2's (48 bytes). The event number says
/// which member of the data union is live; every kind the core delivers to
/// a 1.2 consumer has a 1.2 form. Extension events (IB datagram and
/// extended-DTO events, reachable only through dat_extension_op, which 1.2
/// lacks) keep their number and carry no data.
pub(crate) fn event_to_v12(e: &d20::DAT_EVENT) -> d12::DAT_EVENT {
    let number = e.event_number;
    // SAFETY: each union read below: the event number names the member the
    // 2.0 layer wrote (evd::to_c_event).
    let data = unsafe {
        match number {
            d20::DAT_DTO_COMPLETION_EVENT => {
                let d = e.event_data.dto_completion_event_data;
                d12::DAT_EVENT_DATA {
                    dto_completion_event_data: d12::DAT_DTO_COMPLETION_EVENT_DATA {
                        ep_handle: d.ep_handle,
                        user_cookie: d.user_cookie,
                        status: d.status,
                        transfered_length: u64::from(d.transfered_length),
                    },
                }
            }
            d20::DAT_RMR_BIND_COMPLETION_EVENT => d12::DAT_EVENT_DATA {
                rmr_completion_event_data: e.event_data.rmr_completion_event_data,
            },
            d20::DAT_CONNECTION_REQUEST_EVENT => {
                let d = e.event_data.cr_arrival_event_data;
                d12::DAT_EVENT_DATA {
                    cr_arrival_event_data: d12::DAT_CR_ARRIVAL_EVENT_DATA {
                        sp_handle: d12::DAT_SP_HANDLE {
                            psp_handle: d.sp_handle.psp_handle,
                        },
                        local_ia_address_ptr: d.local_ia_address_ptr,
                        conn_qual: d.conn_qual,
                        cr_handle: d.cr_handle,
                    },
                }
            }
            d20::DAT_CONNECTION_EVENT_ESTABLISHED..=d20::DAT_CONNECTION_EVENT_UNREACHABLE => {
                d12::DAT_EVENT_DATA {
                    connect_event_data: e.event_data.connect_event_data,
                }
            }
            d20::DAT_ASYNC_ERROR_EVD_OVERFLOW..=d20::DAT_ASYNC_ERROR_PROVIDER_INTERNAL_ERROR => {
                d12::DAT_EVENT_DATA {
                    asynch_error_event_data: e.event_data.asynch_error_event_data,
                }
            }
            d20::DAT_SOFTWARE_EVENT => d12::DAT_EVENT_DATA {
                software_event_data: e.event_data.software_event_data,
            },
            _ => std::mem::zeroed(),
        }
    };
    d12::DAT_EVENT {
        event_number: number,
        evd_handle: e.evd_handle,
        event_data: data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::c_void;

    fn p(v: usize) -> *mut c_void {
        v as *mut c_void
    }

    fn zeroed_v20() -> d20::DAT_EVENT {
        // SAFETY: plain data; all-zero is valid.
        unsafe { std::mem::zeroed() }
    }

    #[test]
    fn dto_completion_widens_the_length_and_drops_the_operation() {
        let mut e = zeroed_v20();
        e.event_number = d20::DAT_DTO_COMPLETION_EVENT;
        e.evd_handle = p(0x1000);
        e.event_data.dto_completion_event_data = d20::DAT_DTO_COMPLETION_EVENT_DATA {
            ep_handle: p(0x2000),
            user_cookie: d20::DAT_CONTEXT::from_u64(77),
            status: d20::DAT_DTO_ERR_FLUSHED,
            transfered_length: 0xffff_fff0,
            operation: d20::DAT_DTO_RDMA_READ,
            rmr_context: 9,
        };
        let v = event_to_v12(&e);
        assert_eq!(v.event_number, d12::DAT_DTO_COMPLETION_EVENT);
        assert_eq!(v.evd_handle, p(0x1000));
        // SAFETY: the member the event number names (set above).
        let d = unsafe { v.event_data.dto_completion_event_data };
        assert_eq!(d.ep_handle, p(0x2000));
        assert_eq!(d.user_cookie.as_u64(), 77);
        assert_eq!(d.status, d12::DAT_DTO_ERR_FLUSHED);
        assert_eq!(d.transfered_length, 0xffff_fff0u64);
        // The 48-byte event really holds the u64 length at offset 16 + 24.
        // SAFETY: a plain C struct of 48 bytes, viewed as its bytes.
        let bytes: [u8; 48] = unsafe { std::mem::transmute(v) };
        assert_eq!(&bytes[40..48], &0xffff_fff0u64.to_ne_bytes());
    }

    #[test]
    fn cr_arrival_keeps_sp_address_qualifier_and_cr() {
        let mut e = zeroed_v20();
        e.event_number = d20::DAT_CONNECTION_REQUEST_EVENT;
        e.event_data.cr_arrival_event_data = d20::DAT_CR_ARRIVAL_EVENT_DATA {
            sp_handle: d20::DAT_SP_HANDLE {
                psp_handle: p(0x30),
            },
            local_ia_address_ptr: 0x40 as d20::DAT_IA_ADDRESS_PTR,
            conn_qual: 45248,
            cr_handle: p(0x50),
            truncate_flag: d20::DAT_FALSE,
        };
        let v = event_to_v12(&e);
        // SAFETY: the member the event number names (set above).
        let d = unsafe { v.event_data.cr_arrival_event_data };
        // SAFETY: the member the converter wrote.
        assert_eq!(unsafe { d.sp_handle.psp_handle }, p(0x30));
        assert_eq!(d.local_ia_address_ptr as usize, 0x40);
        assert_eq!(d.conn_qual, 45248);
        assert_eq!(d.cr_handle, p(0x50));
    }

    #[test]
    fn connection_async_software_and_bind_events_carry_their_data() {
        let mut e = zeroed_v20();
        e.event_number = d20::DAT_CONNECTION_EVENT_ESTABLISHED;
        e.event_data.connect_event_data = d20::DAT_CONNECTION_EVENT_DATA {
            ep_handle: p(0x60),
            private_data_size: 5,
            private_data: p(0x70),
        };
        // SAFETY: the member the event number names (set above).
        let d = unsafe { event_to_v12(&e).event_data.connect_event_data };
        assert_eq!(
            (d.ep_handle, d.private_data_size, d.private_data),
            (p(0x60), 5, p(0x70))
        );

        e.event_number = d20::DAT_ASYNC_ERROR_EP_BROKEN;
        e.event_data.asynch_error_event_data = d20::DAT_ASYNCH_ERROR_EVENT_DATA {
            dat_handle: p(0x80),
            reason: 1,
        };
        // SAFETY: the member the event number names (set above).
        let d = unsafe { event_to_v12(&e).event_data.asynch_error_event_data };
        assert_eq!((d.dat_handle, d.reason), (p(0x80), 1));

        e.event_number = d20::DAT_SOFTWARE_EVENT;
        e.event_data.software_event_data = d20::DAT_SOFTWARE_EVENT_DATA { pointer: p(0x90) };
        // SAFETY: the member the event number names (set above).
        let d = unsafe { event_to_v12(&e).event_data.software_event_data };
        assert_eq!(d.pointer, p(0x90));

        e.event_number = d20::DAT_RMR_BIND_COMPLETION_EVENT;
        e.event_data.rmr_completion_event_data = d20::DAT_RMR_BIND_COMPLETION_EVENT_DATA {
            rmr_handle: p(0xa0),
            user_cookie: d20::DAT_CONTEXT::from_u64(3),
            status: d20::DAT_RMR_BIND_SUCCESS,
        };
        // SAFETY: the member the event number names (set above).
        let d = unsafe { event_to_v12(&e).event_data.rmr_completion_event_data };
        assert_eq!((d.rmr_handle, d.user_cookie.as_u64()), (p(0xa0), 3));
    }

    #[test]
    fn ep_attr_round_trips_and_saturates() {
        // SAFETY: a plain C struct, valid all zero.
        let mut a: d12::DAT_EP_ATTR = unsafe { std::mem::zeroed() };
        a.max_message_size = 1 << 40;
        a.max_rdma_size = 4096;
        a.max_recv_dtos = 7;
        a.max_rdma_write_iov = 3;
        let two = ep_attr_to_v20(&a);
        assert_eq!(two.max_message_size, u32::MAX);
        assert_eq!(two.max_rdma_size, 4096);
        let back = ep_attr_to_v12(&two);
        assert_eq!(back.max_rdma_size, 4096);
        assert_eq!(back.max_recv_dtos, 7);
        assert_eq!(back.max_rdma_write_iov, 3);
    }

    #[test]
    fn ep_mask_moves_the_fields_past_the_missing_comm() {
        assert_eq!(
            ep_mask_to_v20(d12::DAT_EP_FIELD_IA_HANDLE),
            d20::DAT_EP_FIELD_IA_HANDLE
        );
        assert_eq!(
            ep_mask_to_v20(d12::DAT_EP_FIELD_PZ_HANDLE),
            d20::DAT_EP_FIELD_PZ_HANDLE
        );
        assert_eq!(
            ep_mask_to_v20(d12::DAT_EP_FIELD_CONNECT_EVD_HANDLE),
            d20::DAT_EP_FIELD_CONNECT_EVD_HANDLE
        );
        assert_eq!(
            ep_mask_to_v20(d12::DAT_EP_FIELD_SRQ_HANDLE),
            d20::DAT_EP_FIELD_SRQ_HANDLE
        );
        assert_eq!(
            ep_mask_to_v20(d12::DAT_EP_FIELD_EP_ATTR_ALL),
            d20::DAT_EP_FIELD_EP_ATTR_ALL
        );
        assert_eq!(
            ep_mask_to_v20(d12::DAT_EP_FIELD_ALL) & d20::DAT_EP_FIELD_COMM,
            0
        );
        assert_eq!(
            ep_mask_to_v20(d12::DAT_EP_FIELD_ALL) & !d20::DAT_EP_FIELD_ALL,
            0
        );
        assert_ne!(ep_mask_to_v20(0x800) & !d20::DAT_EP_FIELD_ALL, 0);
    }

    #[test]
    fn rmr_param_triplet_widens() {
        let p20 = d20::DAT_RMR_PARAM {
            ia_handle: p(1),
            pz_handle: p(2),
            lmr_triplet: d20::DAT_LMR_TRIPLET {
                virtual_address: 0x1234,
                segment_length: 99,
                lmr_context: 5,
            },
            mem_priv: d20::DAT_MEM_PRIV_REMOTE_READ_FLAG,
            rmr_context: 6,
            rmr_scope: d20::DAT_RMR_SCOPE_EP,
            va_type: d20::DAT_VA_TYPE_VA,
        };
        let v = rmr_param_to_v12(&p20);
        assert_eq!(
            v.lmr_triplet,
            d12::DAT_LMR_TRIPLET {
                lmr_context: 5,
                pad: 0,
                virtual_address: 0x1234,
                segment_length: 99
            }
        );
        assert_eq!(
            (v.mem_priv, v.rmr_context),
            (d12::DAT_MEM_PRIV_REMOTE_READ_FLAG, 6)
        );
    }

    #[test]
    fn srq_states_swap() {
        assert_eq!(
            srq_state_to_v12(d20::DAT_SRQ_STATE_OPERATIONAL),
            d12::DAT_SRQ_STATE_OPERATIONAL
        );
        assert_eq!(
            srq_state_to_v12(d20::DAT_SRQ_STATE_ERROR),
            d12::DAT_SRQ_STATE_ERROR
        );
    }
}
