//! The dispatched calls of the DAT C API, declared once for both registry
//! libraries: libdat2.so.2 (DAT 2.0) and libdat.so.1 (DAT 1.2).
//!
//! [`dat_calls!`] holds one line per call: its C name and arguments, the
//! kind of its first argument (how the handle is checked) and the provider
//! table slot it is forwarded to. Each call is tagged with the versions
//! that have it in this shape: `both`, or `v20` / `v12` where the call
//! exists in one version only or its argument list changed between them
//! (`dat_cr_reject`, `dat_lmr_create`, `dat_rmr_bind` have one line per
//! version). The list is in the order of the C API (`dat_api.h`), 2.0's
//! calls interleaved where 2.0 added them; the generated headers keep it.
//!
//! `dat_calls!(v20, exports)` (or `v12`) expands, in the module of the
//! library that invokes it, to one `#[no_mangle] pub unsafe extern "C" fn`
//! a call of that version: check the handle (DAT_INVALID_HANDLE with the
//! call's subtype, as OFED's registry returns it), map an IA handle to the
//! provider's own, call the provider's slot or return DAT_NOT_IMPLEMENTED
//! for an empty one, inside the library's panic boundary (but for object
//! handles, whose dispatch cannot panic: see `@body object`). The names
//! the expansion uses unqualified are the invoking module's, which is how
//! one declaration serves two ABIs: that ABI's types, constants and
//! `DAT_PROVIDER` (`use dat_abi::*` or `use dat_abi12::*`, so the same
//! type name is 2.0's in libdat2 and 1.2's in libdat), and two functions
//! of the library, `ffi_guard(impl FnOnce() -> DAT_RETURN) -> DAT_RETURN`
//! (its catch_unwind boundary) and `error(type, subtype) -> DAT_RETURN`
//! (a code in its numbering).
//!
//! `dat_calls!(v20, prototypes)` is the same calls as Rust source text,
//! `&[&str]` (an empty string for each call of the other version), for
//! gen-header: cbindgen does not expand macros, so it reads the
//! prototypes of the headers' dispatched calls from there.

/// The dispatched calls; see the [module documentation](self).
#[macro_export]
macro_rules! dat_calls {
    ($ver:ident, $mode:ident) => {
        $crate::__dat_calls_each! { ($ver, $mode)
            // IA and any handle
            [both] fn dat_ia_query(
                ia ia_handle: DAT_IA_HANDLE,
                async_evd_handle: *mut DAT_EVD_HANDLE,
                ia_attr_mask: DAT_IA_ATTR_MASK,
                ia_attr: *mut DAT_IA_ATTR,
                provider_attr_mask: DAT_PROVIDER_ATTR_MASK,
                provider_attr: *mut DAT_PROVIDER_ATTR,
            ) => ia_query_func;
            [both] fn dat_set_consumer_context(any handle: DAT_HANDLE, context: DAT_CONTEXT)
                => set_consumer_context_func;
            [both] fn dat_get_consumer_context(any handle: DAT_HANDLE, context: *mut DAT_CONTEXT)
                => get_consumer_context_func;
            [both] fn dat_get_handle_type(any handle: DAT_HANDLE, handle_type: *mut DAT_HANDLE_TYPE)
                => get_handle_type_func;

            // CNO
            [both] fn dat_cno_create(
                ia ia_handle: DAT_IA_HANDLE,
                agent: DAT_OS_WAIT_PROXY_AGENT,
                cno_handle: *mut DAT_CNO_HANDLE,
            ) => cno_create_func;
            [both] fn dat_cno_modify_agent(
                object(DAT_INVALID_HANDLE_CNO) cno_handle: DAT_CNO_HANDLE,
                agent: DAT_OS_WAIT_PROXY_AGENT,
            ) => cno_modify_agent_func;
            [both] fn dat_cno_query(
                object(DAT_INVALID_HANDLE_CNO) cno_handle: DAT_CNO_HANDLE,
                cno_param_mask: DAT_CNO_PARAM_MASK,
                cno_param: *mut DAT_CNO_PARAM,
            ) => cno_query_func;
            [both] fn dat_cno_free(object(DAT_INVALID_HANDLE_CNO) cno_handle: DAT_CNO_HANDLE)
                => cno_free_func;
            [both] fn dat_cno_wait(
                object(DAT_INVALID_HANDLE_CNO) cno_handle: DAT_CNO_HANDLE,
                timeout: DAT_TIMEOUT,
                evd_handle: *mut DAT_EVD_HANDLE,
            ) => cno_wait_func;
            [v20] fn dat_cno_fd_create(
                ia ia_handle: DAT_IA_HANDLE,
                fd: *mut DAT_FD,
                cno_handle: *mut DAT_CNO_HANDLE,
            ) => cno_fd_create_func;
            [v20] fn dat_cno_trigger(
                object(DAT_INVALID_HANDLE_CNO) cno_handle: DAT_CNO_HANDLE,
                evd_handle: *mut DAT_EVD_HANDLE,
            ) => cno_trigger_func;

            // CR
            [both] fn dat_cr_query(
                object(DAT_INVALID_HANDLE_CR) cr_handle: DAT_CR_HANDLE,
                cr_param_mask: DAT_CR_PARAM_MASK,
                cr_param: *mut DAT_CR_PARAM,
            ) => cr_query_func;
            [both] fn dat_cr_accept(
                object(DAT_INVALID_HANDLE_CR) cr_handle: DAT_CR_HANDLE,
                ep_handle: DAT_EP_HANDLE,
                private_data_size: DAT_COUNT,
                private_data: DAT_PVOID,
            ) => cr_accept_func;
            [v20] fn dat_cr_reject(
                object(DAT_INVALID_HANDLE_CR) cr_handle: DAT_CR_HANDLE,
                private_data_size: DAT_COUNT,
                private_data: DAT_PVOID,
            ) => cr_reject_func;
            [v12] fn dat_cr_reject(object(DAT_INVALID_HANDLE_CR) cr_handle: DAT_CR_HANDLE)
                => cr_reject_func;
            [both] fn dat_cr_handoff(
                object(DAT_INVALID_HANDLE_CR) cr_handle: DAT_CR_HANDLE,
                handoff: DAT_CONN_QUAL,
            ) => cr_handoff_func;

            // EVD
            [both] fn dat_evd_create(
                ia ia_handle: DAT_IA_HANDLE,
                evd_min_qlen: DAT_COUNT,
                cno_handle: DAT_CNO_HANDLE,
                evd_flags: DAT_EVD_FLAGS,
                evd_handle: *mut DAT_EVD_HANDLE,
            ) => evd_create_func;
            [both] fn dat_evd_query(
                object(DAT_INVALID_HANDLE_EVD_REQUEST) evd_handle: DAT_EVD_HANDLE,
                evd_param_mask: DAT_EVD_PARAM_MASK,
                evd_param: *mut DAT_EVD_PARAM,
            ) => evd_query_func;
            [both] fn dat_evd_modify_cno(
                object(DAT_INVALID_HANDLE_EVD_REQUEST) evd_handle: DAT_EVD_HANDLE,
                cno_handle: DAT_CNO_HANDLE,
            ) => evd_modify_cno_func;
            [both] fn dat_evd_enable(object(DAT_INVALID_HANDLE_EVD_REQUEST) evd_handle: DAT_EVD_HANDLE)
                => evd_enable_func;
            [both] fn dat_evd_disable(object(DAT_INVALID_HANDLE_EVD_REQUEST) evd_handle: DAT_EVD_HANDLE)
                => evd_disable_func;
            [both] fn dat_evd_wait(
                object(DAT_INVALID_HANDLE_EVD_REQUEST) evd_handle: DAT_EVD_HANDLE,
                timeout: DAT_TIMEOUT,
                threshold: DAT_COUNT,
                event: *mut DAT_EVENT,
                nmore: *mut DAT_COUNT,
            ) => evd_wait_func;
            [both] fn dat_evd_resize(
                object(DAT_INVALID_HANDLE_EVD_REQUEST) evd_handle: DAT_EVD_HANDLE,
                evd_qlen: DAT_COUNT,
            ) => evd_resize_func;
            [both] fn dat_evd_post_se(
                object(DAT_INVALID_HANDLE_EVD_REQUEST) evd_handle: DAT_EVD_HANDLE,
                event: *const DAT_EVENT,
            ) => evd_post_se_func;
            [both] fn dat_evd_dequeue(
                object(DAT_INVALID_HANDLE_EVD_REQUEST) evd_handle: DAT_EVD_HANDLE,
                event: *mut DAT_EVENT,
            ) => evd_dequeue_func;
            [both] fn dat_evd_free(object(DAT_INVALID_HANDLE_EVD_REQUEST) evd_handle: DAT_EVD_HANDLE)
                => evd_free_func;
            [both] fn dat_evd_set_unwaitable(
                object(DAT_INVALID_HANDLE_EVD_REQUEST) evd_handle: DAT_EVD_HANDLE,
            ) => evd_set_unwaitable_func;
            [both] fn dat_evd_clear_unwaitable(
                object(DAT_INVALID_HANDLE_EVD_REQUEST) evd_handle: DAT_EVD_HANDLE,
            ) => evd_clear_unwaitable_func;

            // EP
            [both] fn dat_ep_create(
                ia ia_handle: DAT_IA_HANDLE,
                pz_handle: DAT_PZ_HANDLE,
                recv_evd_handle: DAT_EVD_HANDLE,
                request_evd_handle: DAT_EVD_HANDLE,
                connect_evd_handle: DAT_EVD_HANDLE,
                ep_attributes: *const DAT_EP_ATTR,
                ep_handle: *mut DAT_EP_HANDLE,
            ) => ep_create_func;
            [both] fn dat_ep_create_with_srq(
                ia ia_handle: DAT_IA_HANDLE,
                pz_handle: DAT_PZ_HANDLE,
                recv_evd_handle: DAT_EVD_HANDLE,
                request_evd_handle: DAT_EVD_HANDLE,
                connect_evd_handle: DAT_EVD_HANDLE,
                srq_handle: DAT_SRQ_HANDLE,
                ep_attributes: *const DAT_EP_ATTR,
                ep_handle: *mut DAT_EP_HANDLE,
            ) => ep_create_with_srq_func;
            [both] fn dat_ep_query(
                object(DAT_INVALID_HANDLE_EP) ep_handle: DAT_EP_HANDLE,
                ep_param_mask: DAT_EP_PARAM_MASK,
                ep_param: *mut DAT_EP_PARAM,
            ) => ep_query_func;
            [both] fn dat_ep_modify(
                object(DAT_INVALID_HANDLE_EP) ep_handle: DAT_EP_HANDLE,
                ep_param_mask: DAT_EP_PARAM_MASK,
                ep_param: *const DAT_EP_PARAM,
            ) => ep_modify_func;
            [both] fn dat_ep_connect(
                object(DAT_INVALID_HANDLE_EP) ep_handle: DAT_EP_HANDLE,
                remote_ia_address: DAT_IA_ADDRESS_PTR,
                remote_conn_qual: DAT_CONN_QUAL,
                timeout: DAT_TIMEOUT,
                private_data_size: DAT_COUNT,
                private_data: DAT_PVOID,
                qos: DAT_QOS,
                connect_flags: DAT_CONNECT_FLAGS,
            ) => ep_connect_func;
            [v20] fn dat_ep_common_connect(
                object(DAT_INVALID_HANDLE_EP) ep_handle: DAT_EP_HANDLE,
                remote_ia_address: DAT_IA_ADDRESS_PTR,
                timeout: DAT_TIMEOUT,
                private_data_size: DAT_COUNT,
                private_data: DAT_PVOID,
            ) => ep_common_connect_func;
            [both] fn dat_ep_dup_connect(
                object(DAT_INVALID_HANDLE_EP) ep_handle: DAT_EP_HANDLE,
                ep_dup_handle: DAT_EP_HANDLE,
                timeout: DAT_TIMEOUT,
                private_data_size: DAT_COUNT,
                private_data: DAT_PVOID,
                qos: DAT_QOS,
            ) => ep_dup_connect_func;
            [both] fn dat_ep_disconnect(
                object(DAT_INVALID_HANDLE_EP) ep_handle: DAT_EP_HANDLE,
                close_flags: DAT_CLOSE_FLAGS,
            ) => ep_disconnect_func;
            [both] fn dat_ep_post_send(
                object(DAT_INVALID_HANDLE_EP) ep_handle: DAT_EP_HANDLE,
                num_segments: DAT_COUNT,
                local_iov: *mut DAT_LMR_TRIPLET,
                user_cookie: DAT_DTO_COOKIE,
                completion_flags: DAT_COMPLETION_FLAGS,
            ) => ep_post_send_func;
            [v20] fn dat_ep_post_send_with_invalidate(
                object(DAT_INVALID_HANDLE_EP) ep_handle: DAT_EP_HANDLE,
                num_segments: DAT_COUNT,
                local_iov: *mut DAT_LMR_TRIPLET,
                user_cookie: DAT_DTO_COOKIE,
                completion_flags: DAT_COMPLETION_FLAGS,
                invalidate_flag: DAT_BOOLEAN,
                rmr_context: DAT_RMR_CONTEXT,
            ) => ep_post_send_with_invalidate_func;
            [both] fn dat_ep_post_recv(
                object(DAT_INVALID_HANDLE_EP) ep_handle: DAT_EP_HANDLE,
                num_segments: DAT_COUNT,
                local_iov: *mut DAT_LMR_TRIPLET,
                user_cookie: DAT_DTO_COOKIE,
                completion_flags: DAT_COMPLETION_FLAGS,
            ) => ep_post_recv_func;
            [both] fn dat_ep_post_rdma_read(
                object(DAT_INVALID_HANDLE_EP) ep_handle: DAT_EP_HANDLE,
                num_segments: DAT_COUNT,
                local_iov: *mut DAT_LMR_TRIPLET,
                user_cookie: DAT_DTO_COOKIE,
                remote_iov: *const DAT_RMR_TRIPLET,
                completion_flags: DAT_COMPLETION_FLAGS,
            ) => ep_post_rdma_read_func;
            [v20] fn dat_ep_post_rdma_read_to_rmr(
                object(DAT_INVALID_HANDLE_EP) ep_handle: DAT_EP_HANDLE,
                local_iov: *const DAT_RMR_TRIPLET,
                user_cookie: DAT_DTO_COOKIE,
                remote_iov: *const DAT_RMR_TRIPLET,
                completion_flags: DAT_COMPLETION_FLAGS,
            ) => ep_post_rdma_read_to_rmr_func;
            [both] fn dat_ep_post_rdma_write(
                object(DAT_INVALID_HANDLE_EP) ep_handle: DAT_EP_HANDLE,
                num_segments: DAT_COUNT,
                local_iov: *mut DAT_LMR_TRIPLET,
                user_cookie: DAT_DTO_COOKIE,
                remote_iov: *const DAT_RMR_TRIPLET,
                completion_flags: DAT_COMPLETION_FLAGS,
            ) => ep_post_rdma_write_func;
            [both] fn dat_ep_get_status(
                object(DAT_INVALID_HANDLE_EP) ep_handle: DAT_EP_HANDLE,
                ep_state: *mut DAT_EP_STATE,
                recv_idle: *mut DAT_BOOLEAN,
                request_idle: *mut DAT_BOOLEAN,
            ) => ep_get_status_func;
            [both] fn dat_ep_free(object(DAT_INVALID_HANDLE_EP) ep_handle: DAT_EP_HANDLE)
                => ep_free_func;
            [both] fn dat_ep_reset(object(DAT_INVALID_HANDLE_EP) ep_handle: DAT_EP_HANDLE)
                => ep_reset_func;
            [both] fn dat_ep_recv_query(
                object(DAT_INVALID_HANDLE_EP) ep_handle: DAT_EP_HANDLE,
                nbufs_allocated: *mut DAT_COUNT,
                bufs_alloc_span: *mut DAT_COUNT,
            ) => ep_recv_query_func;
            [both] fn dat_ep_set_watermark(
                object(DAT_INVALID_HANDLE_EP) ep_handle: DAT_EP_HANDLE,
                soft_high_watermark: DAT_COUNT,
                hard_high_watermark: DAT_COUNT,
            ) => ep_set_watermark_func;

            // LMR
            [v20] fn dat_lmr_create(
                ia ia_handle: DAT_IA_HANDLE,
                mem_type: DAT_MEM_TYPE,
                region_description: DAT_REGION_DESCRIPTION,
                length: DAT_VLEN,
                pz_handle: DAT_PZ_HANDLE,
                privileges: DAT_MEM_PRIV_FLAGS,
                va_type: DAT_VA_TYPE,
                lmr_handle: *mut DAT_LMR_HANDLE,
                lmr_context: *mut DAT_LMR_CONTEXT,
                rmr_context: *mut DAT_RMR_CONTEXT,
                registered_length: *mut DAT_VLEN,
                registered_address: *mut DAT_VADDR,
            ) => lmr_create_func;
            [v12] fn dat_lmr_create(
                ia ia_handle: DAT_IA_HANDLE,
                mem_type: DAT_MEM_TYPE,
                region_description: DAT_REGION_DESCRIPTION,
                length: DAT_VLEN,
                pz_handle: DAT_PZ_HANDLE,
                privileges: DAT_MEM_PRIV_FLAGS,
                lmr_handle: *mut DAT_LMR_HANDLE,
                lmr_context: *mut DAT_LMR_CONTEXT,
                rmr_context: *mut DAT_RMR_CONTEXT,
                registered_length: *mut DAT_VLEN,
                registered_address: *mut DAT_VADDR,
            ) => lmr_create_func;
            [both] fn dat_lmr_query(
                object(DAT_INVALID_HANDLE_LMR) lmr_handle: DAT_LMR_HANDLE,
                lmr_param_mask: DAT_LMR_PARAM_MASK,
                lmr_param: *mut DAT_LMR_PARAM,
            ) => lmr_query_func;
            [both] fn dat_lmr_free(object(DAT_INVALID_HANDLE_LMR) lmr_handle: DAT_LMR_HANDLE)
                => lmr_free_func;
            [both] fn dat_lmr_sync_rdma_read(
                ia ia_handle: DAT_IA_HANDLE,
                local_segments: *const DAT_LMR_TRIPLET,
                num_segments: DAT_VLEN,
            ) => lmr_sync_rdma_read_func;
            [both] fn dat_lmr_sync_rdma_write(
                ia ia_handle: DAT_IA_HANDLE,
                local_segments: *const DAT_LMR_TRIPLET,
                num_segments: DAT_VLEN,
            ) => lmr_sync_rdma_write_func;

            // RMR
            [both] fn dat_rmr_create(
                object(DAT_INVALID_HANDLE_PZ) pz_handle: DAT_PZ_HANDLE,
                rmr_handle: *mut DAT_RMR_HANDLE,
            ) => rmr_create_func;
            [v20] fn dat_rmr_create_for_ep(
                object(DAT_INVALID_HANDLE_PZ) pz_handle: DAT_PZ_HANDLE,
                rmr_handle: *mut DAT_RMR_HANDLE,
            ) => rmr_create_for_ep_func;
            [both] fn dat_rmr_query(
                object(DAT_INVALID_HANDLE_RMR) rmr_handle: DAT_RMR_HANDLE,
                rmr_param_mask: DAT_RMR_PARAM_MASK,
                rmr_param: *mut DAT_RMR_PARAM,
            ) => rmr_query_func;
            [v20] fn dat_rmr_bind(
                object(DAT_INVALID_HANDLE_RMR) rmr_handle: DAT_RMR_HANDLE,
                lmr_handle: DAT_LMR_HANDLE,
                lmr_triplet: *const DAT_LMR_TRIPLET,
                mem_priv: DAT_MEM_PRIV_FLAGS,
                va_type: DAT_VA_TYPE,
                ep_handle: DAT_EP_HANDLE,
                user_cookie: DAT_RMR_COOKIE,
                completion_flags: DAT_COMPLETION_FLAGS,
                rmr_context: *mut DAT_RMR_CONTEXT,
            ) => rmr_bind_func;
            [v12] fn dat_rmr_bind(
                object(DAT_INVALID_HANDLE_RMR) rmr_handle: DAT_RMR_HANDLE,
                lmr_triplet: *const DAT_LMR_TRIPLET,
                mem_priv: DAT_MEM_PRIV_FLAGS,
                ep_handle: DAT_EP_HANDLE,
                user_cookie: DAT_RMR_COOKIE,
                completion_flags: DAT_COMPLETION_FLAGS,
                rmr_context: *mut DAT_RMR_CONTEXT,
            ) => rmr_bind_func;
            [both] fn dat_rmr_free(object(DAT_INVALID_HANDLE_RMR) rmr_handle: DAT_RMR_HANDLE)
                => rmr_free_func;

            // PSP
            [both] fn dat_psp_create(
                ia ia_handle: DAT_IA_HANDLE,
                conn_qual: DAT_CONN_QUAL,
                evd_handle: DAT_EVD_HANDLE,
                psp_flags: DAT_PSP_FLAGS,
                psp_handle: *mut DAT_PSP_HANDLE,
            ) => psp_create_func;
            [both] fn dat_psp_create_any(
                ia ia_handle: DAT_IA_HANDLE,
                conn_qual: *mut DAT_CONN_QUAL,
                evd_handle: DAT_EVD_HANDLE,
                psp_flags: DAT_PSP_FLAGS,
                psp_handle: *mut DAT_PSP_HANDLE,
            ) => psp_create_any_func;
            [both] fn dat_psp_query(
                object(DAT_INVALID_HANDLE_PSP) psp_handle: DAT_PSP_HANDLE,
                psp_param_mask: DAT_PSP_PARAM_MASK,
                psp_param: *mut DAT_PSP_PARAM,
            ) => psp_query_func;
            [both] fn dat_psp_free(object(DAT_INVALID_HANDLE_PSP) psp_handle: DAT_PSP_HANDLE)
                => psp_free_func;

            // RSP
            [both] fn dat_rsp_create(
                ia ia_handle: DAT_IA_HANDLE,
                conn_qual: DAT_CONN_QUAL,
                ep_handle: DAT_EP_HANDLE,
                evd_handle: DAT_EVD_HANDLE,
                rsp_handle: *mut DAT_RSP_HANDLE,
            ) => rsp_create_func;
            [both] fn dat_rsp_query(
                object(DAT_INVALID_HANDLE_RSP) rsp_handle: DAT_RSP_HANDLE,
                rsp_param_mask: DAT_RSP_PARAM_MASK,
                rsp_param: *mut DAT_RSP_PARAM,
            ) => rsp_query_func;
            [both] fn dat_rsp_free(object(DAT_INVALID_HANDLE_RSP) rsp_handle: DAT_RSP_HANDLE)
                => rsp_free_func;

            // CSP
            [v20] fn dat_csp_create(
                ia ia_handle: DAT_IA_HANDLE,
                comm: *mut DAT_COMM,
                address: DAT_IA_ADDRESS_PTR,
                evd_handle: DAT_EVD_HANDLE,
                csp_handle: *mut DAT_CSP_HANDLE,
            ) => csp_create_func;
            [v20] fn dat_csp_query(
                object(DAT_INVALID_HANDLE_CSP) csp_handle: DAT_CSP_HANDLE,
                csp_param_mask: DAT_CSP_PARAM_MASK,
                csp_param: *mut DAT_CSP_PARAM,
            ) => csp_query_func;
            [v20] fn dat_csp_free(object(DAT_INVALID_HANDLE_CSP) csp_handle: DAT_CSP_HANDLE)
                => csp_free_func;

            // PZ
            [both] fn dat_pz_create(ia ia_handle: DAT_IA_HANDLE, pz_handle: *mut DAT_PZ_HANDLE)
                => pz_create_func;
            [both] fn dat_pz_query(
                object(DAT_INVALID_HANDLE_PZ) pz_handle: DAT_PZ_HANDLE,
                pz_param_mask: DAT_PZ_PARAM_MASK,
                pz_param: *mut DAT_PZ_PARAM,
            ) => pz_query_func;
            [both] fn dat_pz_free(object(DAT_INVALID_HANDLE_PZ) pz_handle: DAT_PZ_HANDLE)
                => pz_free_func;

            // SRQ
            [both] fn dat_srq_create(
                ia ia_handle: DAT_IA_HANDLE,
                pz_handle: DAT_PZ_HANDLE,
                srq_attr: *mut DAT_SRQ_ATTR,
                srq_handle: *mut DAT_SRQ_HANDLE,
            ) => srq_create_func;
            [both] fn dat_srq_free(object(DAT_INVALID_HANDLE_SRQ) srq_handle: DAT_SRQ_HANDLE)
                => srq_free_func;
            [both] fn dat_srq_post_recv(
                object(DAT_INVALID_HANDLE_SRQ) srq_handle: DAT_SRQ_HANDLE,
                num_segments: DAT_COUNT,
                local_iov: *mut DAT_LMR_TRIPLET,
                user_cookie: DAT_DTO_COOKIE,
            ) => srq_post_recv_func;
            [both] fn dat_srq_query(
                object(DAT_INVALID_HANDLE_SRQ) srq_handle: DAT_SRQ_HANDLE,
                srq_param_mask: DAT_SRQ_PARAM_MASK,
                srq_param: *mut DAT_SRQ_PARAM,
            ) => srq_query_func;
            [both] fn dat_srq_resize(
                object(DAT_INVALID_HANDLE_SRQ) srq_handle: DAT_SRQ_HANDLE,
                srq_max_recv_dto: DAT_COUNT,
            ) => srq_resize_func;
            [both] fn dat_srq_set_lw(
                object(DAT_INVALID_HANDLE_SRQ) srq_handle: DAT_SRQ_HANDLE,
                low_watermark: DAT_COUNT,
            ) => srq_set_lw_func;
        }
    };
}

/// [`dat_calls!`]'s list, taken apart: each call to [`__dat_call!`], as
/// items (`exports`) or as the elements of a `&[&str]` (`prototypes`).
#[doc(hidden)]
#[macro_export]
macro_rules! __dat_calls_each {
    (($ver:ident, exports) $(
        [$tag:ident] fn $name:ident($kind:ident $(($sub:ident))? $h:ident: $hty:ty
            $(, $a:ident: $aty:ty)* $(,)?) => $slot:ident;
    )*) => {
        $(
            $crate::__dat_call! { $ver $tag export
                $name($kind $(($sub))? $h: $hty $(, $a: $aty)*) => $slot }
        )*
    };
    (($ver:ident, prototypes) $(
        [$tag:ident] fn $name:ident($kind:ident $(($sub:ident))? $h:ident: $hty:ty
            $(, $a:ident: $aty:ty)* $(,)?) => $slot:ident;
    )*) => {
        &[$(
            $crate::__dat_call! { $ver $tag prototype
                $name($kind $(($sub))? $h: $hty $(, $a: $aty)*) => $slot }
        ),*]
    };
}

/// One call of [`dat_calls!`]: its export (or its prototype's source text)
/// when its tag names the version asked for, else nothing (an empty
/// string). The `@body` arms are the dispatch itself, also used by
/// libdat2's hand-written `dat2_extension_opv`.
#[doc(hidden)]
#[macro_export]
macro_rules! __dat_call {
    // Which calls a version has.
    (v20 both $($call:tt)*) => { $crate::__dat_call! { @$($call)* } };
    (v12 both $($call:tt)*) => { $crate::__dat_call! { @$($call)* } };
    (v20 v20 $($call:tt)*) => { $crate::__dat_call! { @$($call)* } };
    (v12 v12 $($call:tt)*) => { $crate::__dat_call! { @$($call)* } };
    ($ver:ident $tag:ident export $($call:tt)*) => {};
    ($ver:ident $tag:ident prototype $($call:tt)*) => { "" };

    (@export $name:ident($kind:ident $(($sub:ident))? $h:ident: $hty:ty
        $(, $a:ident: $aty:ty)*) => $slot:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name($h: $hty $(, $a: $aty)*) -> DAT_RETURN {
            $crate::__dat_call! { @body $kind $(($sub))? $h => $slot($($a),*) }
        }
    };
    (@prototype $name:ident($kind:ident $(($sub:ident))? $h:ident: $hty:ty
        $(, $a:ident: $aty:ty)*) => $slot:ident) => {
        stringify! {
            #[no_mangle]
            pub unsafe extern "C" fn $name($h: $hty $(, $a: $aty)*) -> DAT_RETURN {}
        }
    };

    // `h` must be a live object of a registered provider, else
    // DAT_INVALID_HANDLE | `sub`. The one arm outside `ffi_guard`: every
    // data transfer call and dat_evd_dequeue come this way, and the guard
    // spilled each call's arguments into a closure on the stack (about 25
    // instructions a call). Nothing here can panic: `provider_of` compares
    // and loads (`dispatch.rs`, which keeps it so), and the provider's
    // function is `extern "C"`, which does not unwind into us.
    (@body object($sub:ident) $h:ident => $slot:ident($($a:expr),*)) => {
        // SAFETY: provider_of reads the handle only once it may be an
        // object; the tables of this library's registry are of its ABI.
        match unsafe { $crate::dispatch::provider_of::<DAT_PROVIDER>($h) } {
            Some(p) => $crate::__dat_call! { @slot p.$slot($h $(, $a)*) },
            None => error(DAT_INVALID_HANDLE, $sub),
        }
    };
    // `h` must be an open IA handle, else DAT_INVALID_HANDLE |
    // DAT_INVALID_HANDLE_IA; the provider is called with its own IA handle.
    (@body ia $h:ident => $slot:ident($($a:expr),*)) => {
        ffi_guard(|| match $crate::registry::lookup_ia($h) {
            Some(open) => {
                // SAFETY: the IA is open, so its provider is registered (with
                // this library, so of its ABI) and its library loaded.
                let p: &DAT_PROVIDER = unsafe { open.provider.table() };
                $crate::__dat_call! { @slot p.$slot(open.provider_ia $(, $a)*) }
            }
            None => error(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_IA),
        })
    };
    // Either of the above, else DAT_INVALID_HANDLE | DAT_INVALID_HANDLE1.
    (@body any $h:ident => $slot:ident($($a:expr),*)) => {
        ffi_guard(|| {
            // SAFETY: as for `object`, after the IA handle table.
            match unsafe { $crate::dispatch::any_handle::<DAT_PROVIDER>($h) } {
                Some((h, p)) => $crate::__dat_call! { @slot p.$slot(h $(, $a)*) },
                None => error(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE1),
            }
        })
    };
    // The provider's function in the slot, called, or DAT_NOT_IMPLEMENTED
    // when the provider left the slot empty.
    (@slot $p:ident.$slot:ident($($a:expr),*)) => {
        match $p.$slot {
            // SAFETY: the table is a registered provider's of this
            // library's ABI, so the slot has the signature the call has;
            // the arguments are the consumer's, passed as the API passes
            // them, and the provider owns their checks.
            Some(f) => unsafe { f($($a),*) },
            None => error(DAT_NOT_IMPLEMENTED, DAT_NO_SUBTYPE),
        }
    };
}
