#ifndef _DAT_DAT_API_H_
#define _DAT_DAT_API_H_

/*
 * The DAT 1.2 API: the prototypes of the functions libdat.so.1 exports,
 * with their 1.2 signatures (7-argument dat_rmr_bind, 11-argument
 * dat_lmr_create, 1-argument dat_cr_reject, 24-byte triplets, 48-byte
 * events). Include <dat/udat.h>.
 *
 * Written by hand for now: the 1.2 library crate does not exist yet. Once
 * src/libdat does, this file is generated from its exports by gen-header
 * (`make header`), as include/dat2/dat_api.h is from src/libdat2, and
 * `make test` checks it. libdat.so.1 is not built yet, so a program
 * compiles against these declarations but has nothing to link with.
 */

#include <dat/dat_types.h>

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/* IA, registry-backed: dat_ia_open is a macro over dat_ia_openv (dat.h). */

DAT_RETURN dat_ia_openv(const char *name,
                        DAT_COUNT async_evd_qlen,
                        DAT_EVD_HANDLE *async_evd_handle,
                        DAT_IA_HANDLE *ia_handle,
                        DAT_UINT32 dapl_major,
                        DAT_UINT32 dapl_minor,
                        DAT_BOOLEAN thread_safety);

DAT_RETURN dat_ia_query(DAT_IA_HANDLE ia_handle,
                        DAT_EVD_HANDLE *async_evd_handle,
                        DAT_IA_ATTR_MASK ia_attr_mask,
                        DAT_IA_ATTR *ia_attr,
                        DAT_PROVIDER_ATTR_MASK provider_attr_mask,
                        DAT_PROVIDER_ATTR *provider_attr);

DAT_RETURN dat_ia_close(DAT_IA_HANDLE ia_handle, DAT_CLOSE_FLAGS close_flags);

/* Helpers. */

DAT_RETURN dat_set_consumer_context(DAT_HANDLE handle, DAT_CONTEXT context);

DAT_RETURN dat_get_consumer_context(DAT_HANDLE handle, DAT_CONTEXT *context);

DAT_RETURN dat_get_handle_type(DAT_HANDLE handle, DAT_HANDLE_TYPE *handle_type);

/* CNO. */

DAT_RETURN dat_cno_create(DAT_IA_HANDLE ia_handle,
                          DAT_OS_WAIT_PROXY_AGENT agent,
                          DAT_CNO_HANDLE *cno_handle);

DAT_RETURN dat_cno_modify_agent(DAT_CNO_HANDLE cno_handle, DAT_OS_WAIT_PROXY_AGENT agent);

DAT_RETURN dat_cno_query(DAT_CNO_HANDLE cno_handle,
                         DAT_CNO_PARAM_MASK cno_param_mask,
                         DAT_CNO_PARAM *cno_param);

DAT_RETURN dat_cno_free(DAT_CNO_HANDLE cno_handle);

DAT_RETURN dat_cno_wait(DAT_CNO_HANDLE cno_handle, DAT_TIMEOUT timeout, DAT_EVD_HANDLE *evd_handle);

/* CR. */

DAT_RETURN dat_cr_query(DAT_CR_HANDLE cr_handle,
                        DAT_CR_PARAM_MASK cr_param_mask,
                        DAT_CR_PARAM *cr_param);

DAT_RETURN dat_cr_accept(DAT_CR_HANDLE cr_handle,
                         DAT_EP_HANDLE ep_handle,
                         DAT_COUNT private_data_size,
                         DAT_PVOID private_data);

/* 1.2: the CR handle only (2.0 adds private data). */
DAT_RETURN dat_cr_reject(DAT_CR_HANDLE cr_handle);

DAT_RETURN dat_cr_handoff(DAT_CR_HANDLE cr_handle, DAT_CONN_QUAL handoff);

/* EVD. */

DAT_RETURN dat_evd_create(DAT_IA_HANDLE ia_handle,
                          DAT_COUNT evd_min_qlen,
                          DAT_CNO_HANDLE cno_handle,
                          DAT_EVD_FLAGS evd_flags,
                          DAT_EVD_HANDLE *evd_handle);

DAT_RETURN dat_evd_query(DAT_EVD_HANDLE evd_handle,
                         DAT_EVD_PARAM_MASK evd_param_mask,
                         DAT_EVD_PARAM *evd_param);

DAT_RETURN dat_evd_modify_cno(DAT_EVD_HANDLE evd_handle, DAT_CNO_HANDLE cno_handle);

DAT_RETURN dat_evd_enable(DAT_EVD_HANDLE evd_handle);

DAT_RETURN dat_evd_disable(DAT_EVD_HANDLE evd_handle);

DAT_RETURN dat_evd_wait(DAT_EVD_HANDLE evd_handle,
                        DAT_TIMEOUT timeout,
                        DAT_COUNT threshold,
                        DAT_EVENT *event,
                        DAT_COUNT *nmore);

DAT_RETURN dat_evd_resize(DAT_EVD_HANDLE evd_handle, DAT_COUNT evd_qlen);

DAT_RETURN dat_evd_post_se(DAT_EVD_HANDLE evd_handle, const DAT_EVENT *event);

DAT_RETURN dat_evd_dequeue(DAT_EVD_HANDLE evd_handle, DAT_EVENT *event);

DAT_RETURN dat_evd_free(DAT_EVD_HANDLE evd_handle);

DAT_RETURN dat_evd_set_unwaitable(DAT_EVD_HANDLE evd_handle);

DAT_RETURN dat_evd_clear_unwaitable(DAT_EVD_HANDLE evd_handle);

/* EP. */

DAT_RETURN dat_ep_create(DAT_IA_HANDLE ia_handle,
                         DAT_PZ_HANDLE pz_handle,
                         DAT_EVD_HANDLE recv_evd_handle,
                         DAT_EVD_HANDLE request_evd_handle,
                         DAT_EVD_HANDLE connect_evd_handle,
                         const DAT_EP_ATTR *ep_attributes,
                         DAT_EP_HANDLE *ep_handle);

DAT_RETURN dat_ep_create_with_srq(DAT_IA_HANDLE ia_handle,
                                  DAT_PZ_HANDLE pz_handle,
                                  DAT_EVD_HANDLE recv_evd_handle,
                                  DAT_EVD_HANDLE request_evd_handle,
                                  DAT_EVD_HANDLE connect_evd_handle,
                                  DAT_SRQ_HANDLE srq_handle,
                                  const DAT_EP_ATTR *ep_attributes,
                                  DAT_EP_HANDLE *ep_handle);

DAT_RETURN dat_ep_query(DAT_EP_HANDLE ep_handle,
                        DAT_EP_PARAM_MASK ep_param_mask,
                        DAT_EP_PARAM *ep_param);

DAT_RETURN dat_ep_modify(DAT_EP_HANDLE ep_handle,
                         DAT_EP_PARAM_MASK ep_param_mask,
                         const DAT_EP_PARAM *ep_param);

DAT_RETURN dat_ep_connect(DAT_EP_HANDLE ep_handle,
                          DAT_IA_ADDRESS_PTR remote_ia_address,
                          DAT_CONN_QUAL remote_conn_qual,
                          DAT_TIMEOUT timeout,
                          DAT_COUNT private_data_size,
                          DAT_PVOID private_data,
                          DAT_QOS qos,
                          DAT_CONNECT_FLAGS connect_flags);

DAT_RETURN dat_ep_dup_connect(DAT_EP_HANDLE ep_handle,
                              DAT_EP_HANDLE ep_dup_handle,
                              DAT_TIMEOUT timeout,
                              DAT_COUNT private_data_size,
                              DAT_PVOID private_data,
                              DAT_QOS qos);

DAT_RETURN dat_ep_disconnect(DAT_EP_HANDLE ep_handle, DAT_CLOSE_FLAGS close_flags);

DAT_RETURN dat_ep_post_send(DAT_EP_HANDLE ep_handle,
                            DAT_COUNT num_segments,
                            DAT_LMR_TRIPLET *local_iov,
                            DAT_DTO_COOKIE user_cookie,
                            DAT_COMPLETION_FLAGS completion_flags);

DAT_RETURN dat_ep_post_recv(DAT_EP_HANDLE ep_handle,
                            DAT_COUNT num_segments,
                            DAT_LMR_TRIPLET *local_iov,
                            DAT_DTO_COOKIE user_cookie,
                            DAT_COMPLETION_FLAGS completion_flags);

DAT_RETURN dat_ep_post_rdma_read(DAT_EP_HANDLE ep_handle,
                                 DAT_COUNT num_segments,
                                 DAT_LMR_TRIPLET *local_iov,
                                 DAT_DTO_COOKIE user_cookie,
                                 const DAT_RMR_TRIPLET *remote_iov,
                                 DAT_COMPLETION_FLAGS completion_flags);

DAT_RETURN dat_ep_post_rdma_write(DAT_EP_HANDLE ep_handle,
                                  DAT_COUNT num_segments,
                                  DAT_LMR_TRIPLET *local_iov,
                                  DAT_DTO_COOKIE user_cookie,
                                  const DAT_RMR_TRIPLET *remote_iov,
                                  DAT_COMPLETION_FLAGS completion_flags);

DAT_RETURN dat_ep_get_status(DAT_EP_HANDLE ep_handle,
                             DAT_EP_STATE *ep_state,
                             DAT_BOOLEAN *recv_idle,
                             DAT_BOOLEAN *request_idle);

DAT_RETURN dat_ep_free(DAT_EP_HANDLE ep_handle);

DAT_RETURN dat_ep_reset(DAT_EP_HANDLE ep_handle);

DAT_RETURN dat_ep_recv_query(DAT_EP_HANDLE ep_handle,
                             DAT_COUNT *nbufs_allocated,
                             DAT_COUNT *bufs_alloc_span);

DAT_RETURN dat_ep_set_watermark(DAT_EP_HANDLE ep_handle,
                                DAT_COUNT soft_high_watermark,
                                DAT_COUNT hard_high_watermark);

/* LMR. 1.2's dat_lmr_create has 11 arguments (2.0 adds a DAT_VA_TYPE). */

DAT_RETURN dat_lmr_create(DAT_IA_HANDLE ia_handle,
                          DAT_MEM_TYPE mem_type,
                          DAT_REGION_DESCRIPTION region_description,
                          DAT_VLEN length,
                          DAT_PZ_HANDLE pz_handle,
                          DAT_MEM_PRIV_FLAGS privileges,
                          DAT_LMR_HANDLE *lmr_handle,
                          DAT_LMR_CONTEXT *lmr_context,
                          DAT_RMR_CONTEXT *rmr_context,
                          DAT_VLEN *registered_length,
                          DAT_VADDR *registered_address);

DAT_RETURN dat_lmr_query(DAT_LMR_HANDLE lmr_handle,
                         DAT_LMR_PARAM_MASK lmr_param_mask,
                         DAT_LMR_PARAM *lmr_param);

DAT_RETURN dat_lmr_free(DAT_LMR_HANDLE lmr_handle);

DAT_RETURN dat_lmr_sync_rdma_read(DAT_IA_HANDLE ia_handle,
                                  const DAT_LMR_TRIPLET *local_segments,
                                  DAT_VLEN num_segments);

DAT_RETURN dat_lmr_sync_rdma_write(DAT_IA_HANDLE ia_handle,
                                   const DAT_LMR_TRIPLET *local_segments,
                                   DAT_VLEN num_segments);

/* RMR. 1.2's dat_rmr_bind has 7 arguments (2.0 adds the LMR handle and a
 * DAT_VA_TYPE). */

DAT_RETURN dat_rmr_create(DAT_PZ_HANDLE pz_handle, DAT_RMR_HANDLE *rmr_handle);

DAT_RETURN dat_rmr_query(DAT_RMR_HANDLE rmr_handle,
                         DAT_RMR_PARAM_MASK rmr_param_mask,
                         DAT_RMR_PARAM *rmr_param);

DAT_RETURN dat_rmr_bind(DAT_RMR_HANDLE rmr_handle,
                        const DAT_LMR_TRIPLET *lmr_triplet,
                        DAT_MEM_PRIV_FLAGS mem_priv,
                        DAT_EP_HANDLE ep_handle,
                        DAT_RMR_COOKIE user_cookie,
                        DAT_COMPLETION_FLAGS completion_flags,
                        DAT_RMR_CONTEXT *rmr_context);

DAT_RETURN dat_rmr_free(DAT_RMR_HANDLE rmr_handle);

/* PSP, RSP, PZ. */

DAT_RETURN dat_psp_create(DAT_IA_HANDLE ia_handle,
                          DAT_CONN_QUAL conn_qual,
                          DAT_EVD_HANDLE evd_handle,
                          DAT_PSP_FLAGS psp_flags,
                          DAT_PSP_HANDLE *psp_handle);

DAT_RETURN dat_psp_create_any(DAT_IA_HANDLE ia_handle,
                              DAT_CONN_QUAL *conn_qual,
                              DAT_EVD_HANDLE evd_handle,
                              DAT_PSP_FLAGS psp_flags,
                              DAT_PSP_HANDLE *psp_handle);

DAT_RETURN dat_psp_query(DAT_PSP_HANDLE psp_handle,
                         DAT_PSP_PARAM_MASK psp_param_mask,
                         DAT_PSP_PARAM *psp_param);

DAT_RETURN dat_psp_free(DAT_PSP_HANDLE psp_handle);

DAT_RETURN dat_rsp_create(DAT_IA_HANDLE ia_handle,
                          DAT_CONN_QUAL conn_qual,
                          DAT_EP_HANDLE ep_handle,
                          DAT_EVD_HANDLE evd_handle,
                          DAT_RSP_HANDLE *rsp_handle);

DAT_RETURN dat_rsp_query(DAT_RSP_HANDLE rsp_handle,
                         DAT_RSP_PARAM_MASK rsp_param_mask,
                         DAT_RSP_PARAM *rsp_param);

DAT_RETURN dat_rsp_free(DAT_RSP_HANDLE rsp_handle);

DAT_RETURN dat_pz_create(DAT_IA_HANDLE ia_handle, DAT_PZ_HANDLE *pz_handle);

DAT_RETURN dat_pz_query(DAT_PZ_HANDLE pz_handle,
                        DAT_PZ_PARAM_MASK pz_param_mask,
                        DAT_PZ_PARAM *pz_param);

DAT_RETURN dat_pz_free(DAT_PZ_HANDLE pz_handle);

/* SRQ. */

DAT_RETURN dat_srq_create(DAT_IA_HANDLE ia_handle,
                          DAT_PZ_HANDLE pz_handle,
                          DAT_SRQ_ATTR *srq_attr,
                          DAT_SRQ_HANDLE *srq_handle);

DAT_RETURN dat_srq_free(DAT_SRQ_HANDLE srq_handle);

DAT_RETURN dat_srq_post_recv(DAT_SRQ_HANDLE srq_handle,
                             DAT_COUNT num_segments,
                             DAT_LMR_TRIPLET *local_iov,
                             DAT_DTO_COOKIE user_cookie);

DAT_RETURN dat_srq_query(DAT_SRQ_HANDLE srq_handle,
                         DAT_SRQ_PARAM_MASK srq_param_mask,
                         DAT_SRQ_PARAM *srq_param);

DAT_RETURN dat_srq_resize(DAT_SRQ_HANDLE srq_handle, DAT_COUNT srq_max_recv_dto);

DAT_RETURN dat_srq_set_lw(DAT_SRQ_HANDLE srq_handle, DAT_COUNT low_watermark);

/* Registry. */

/* Called by a provider's dat_provider_init. */
DAT_RETURN dat_registry_add_provider(const DAT_PROVIDER *provider,
                                     const DAT_PROVIDER_INFO *provider_info);

/* Called by a provider's dat_provider_fini. */
DAT_RETURN dat_registry_remove_provider(const DAT_PROVIDER *provider,
                                        const DAT_PROVIDER_INFO *provider_info);

/* Lists the dat.conf entries in effect. */
DAT_RETURN dat_registry_list_providers(DAT_COUNT max_to_return,
                                       DAT_COUNT *entries_returned,
                                       DAT_PROVIDER_INFO **dat_provider_list);

/* Names the type and subtype of a DAT_RETURN. The strings are static. */
DAT_RETURN dat_strerror(DAT_RETURN value, const char **major_message, const char **minor_message);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* _DAT_DAT_API_H_ */
