/* Compile-time checks of the DAT 1.2 headers, include/dat (types generated
 * from src/abi12, prototypes from src/libdat, macros hand-written). Every
 * check is a _Static_assert, so a wrong header stops the compilation; the
 * program only counts them and prints "abi12_check: N passed, 0 failed".
 * Nothing here links against a DAT library: the API functions appear only
 * inside __typeof__, which does not reference them (test_dat12_rules links
 * libdat.so.1 and runs seed12_synopsis.c, the program written from the three
 * 1.2 seed manual pages).
 *
 * The facts come from /work/shared/design/dat-abi-facts.md ("DAT 1.2"),
 * the seed pages, and sizes measured from OFED's compat-dapl 1.2 headers
 * on x86_64. 2.0's values come from our include/dat2/dat_types.h, renamed
 * V20_* into abi12_v20.h by the Makefile. */
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
#include <dat/udat.h>
#include <dat/dat_registry.h>
#include "abi12_v20.h"

#define FIELD_SIZE(type, field) sizeof(((type *)0)->field)
#define SLOT(field) (offsetof(DAT_PROVIDER, field) / sizeof(void *))
#define SAME_TYPE(a, b) __builtin_types_compatible_p(a, b)

/* The 1.2 signatures the facts single out, spelled here independently of
 * the headers. */
typedef DAT_RETURN rmr_bind_12(DAT_RMR_HANDLE, const DAT_LMR_TRIPLET *, DAT_MEM_PRIV_FLAGS,
			       DAT_EP_HANDLE, DAT_RMR_COOKIE, DAT_COMPLETION_FLAGS,
			       DAT_RMR_CONTEXT *);
typedef DAT_RETURN lmr_create_12(DAT_IA_HANDLE, DAT_MEM_TYPE, DAT_REGION_DESCRIPTION, DAT_VLEN,
				 DAT_PZ_HANDLE, DAT_MEM_PRIV_FLAGS, DAT_LMR_HANDLE *,
				 DAT_LMR_CONTEXT *, DAT_RMR_CONTEXT *, DAT_VLEN *, DAT_VADDR *);
typedef DAT_RETURN cr_reject_12(DAT_CR_HANDLE);

/* dat_ia_open must ask dat_ia_openv for 1.2, not thread-safe by default:
 * from here on a call of dat_ia_openv evaluates to its three last
 * arguments, 100 * major + 10 * minor + thread safety. */
#define dat_ia_openv(name, qlen, evd, ia, major, minor, ts) ((major) * 100 + (minor) * 10 + (ts))

/* The facts, one condition each. */
#define FACTS(F)                                                                                   \
	/* Triplets: 24 bytes {u32 context; u32 pad; u64 address; u64 length}. */                 \
	F(sizeof(DAT_LMR_TRIPLET) == 24)                                                           \
	F(offsetof(DAT_LMR_TRIPLET, lmr_context) == 0 && FIELD_SIZE(DAT_LMR_TRIPLET, lmr_context) == 4) \
	F(offsetof(DAT_LMR_TRIPLET, pad) == 4 && FIELD_SIZE(DAT_LMR_TRIPLET, pad) == 4)            \
	F(offsetof(DAT_LMR_TRIPLET, virtual_address) == 8 && FIELD_SIZE(DAT_LMR_TRIPLET, virtual_address) == 8) \
	F(offsetof(DAT_LMR_TRIPLET, segment_length) == 16 && FIELD_SIZE(DAT_LMR_TRIPLET, segment_length) == 8) \
	F(sizeof(DAT_RMR_TRIPLET) == 24)                                                           \
	F(offsetof(DAT_RMR_TRIPLET, rmr_context) == 0 && FIELD_SIZE(DAT_RMR_TRIPLET, rmr_context) == 4) \
	F(offsetof(DAT_RMR_TRIPLET, pad) == 4 && FIELD_SIZE(DAT_RMR_TRIPLET, pad) == 4)            \
	F(offsetof(DAT_RMR_TRIPLET, target_address) == 8 && FIELD_SIZE(DAT_RMR_TRIPLET, target_address) == 8) \
	F(offsetof(DAT_RMR_TRIPLET, segment_length) == 16 && FIELD_SIZE(DAT_RMR_TRIPLET, segment_length) == 8) \
	/* Events: 48 bytes; the DTO completion's u64 transfered_length at 24. */                 \
	F(sizeof(DAT_EVENT) == 48)                                                                 \
	F(sizeof(DAT_EVENT_DATA) == 32)                                                            \
	F(offsetof(DAT_EVENT, event_data) == 16)                                                   \
	F(sizeof(DAT_DTO_COMPLETION_EVENT_DATA) == 32)                                             \
	F(offsetof(DAT_DTO_COMPLETION_EVENT_DATA, transfered_length) == 24)                        \
	F(FIELD_SIZE(DAT_DTO_COMPLETION_EVENT_DATA, transfered_length) == 8)                       \
	F(SAME_TYPE(__typeof__(((DAT_DTO_COMPLETION_EVENT_DATA *)0)->transfered_length), uint64_t)) \
	F(sizeof(DAT_CR_ARRIVAL_EVENT_DATA) == 32)                                                 \
	/* DAT_EP_ATTR: 104 bytes, 64-bit message and RDMA sizes. */                               \
	F(sizeof(DAT_EP_ATTR) == 104)                                                              \
	F(offsetof(DAT_EP_ATTR, max_message_size) == 8 && FIELD_SIZE(DAT_EP_ATTR, max_message_size) == 8) \
	F(offsetof(DAT_EP_ATTR, max_rdma_size) == 16 && FIELD_SIZE(DAT_EP_ATTR, max_rdma_size) == 8) \
	F(offsetof(DAT_EP_ATTR, ep_provider_specific) == 96)                                       \
	/* Sizes measured from OFED's compat-dapl 1.2 headers (x86_64). */                        \
	F(sizeof(DAT_EP_PARAM) == 192 && offsetof(DAT_EP_PARAM, ep_attr) == 88)                    \
	F(sizeof(DAT_IA_ATTR) == 688 && offsetof(DAT_IA_ATTR, max_message_size) == 592)            \
	F(sizeof(DAT_PROVIDER_ATTR) == 504)                                                        \
	F(sizeof(DAT_LMR_PARAM) == 80 && offsetof(DAT_LMR_PARAM, registered_address) == 72)        \
	F(sizeof(DAT_RMR_PARAM) == 48 && offsetof(DAT_RMR_PARAM, mem_priv) == 40)                  \
	F(sizeof(DAT_CNO_PARAM) == 24)                                                             \
	F(sizeof(DAT_PROVIDER_INFO) == 268)                                                        \
	/* The provider table: 70 slots, 2.0's order up to srq_set_lw. */                          \
	F(sizeof(DAT_PROVIDER) == 70 * sizeof(void *))                                             \
	F(SLOT(device_name) == 0 && SLOT(ia_open_func) == 2)                                       \
	F(SLOT(cr_reject_func) == 15 && SLOT(ep_post_send_func) == 33)                             \
	F(SLOT(lmr_create_func) == 39 && SLOT(rmr_bind_func) == 44)                                \
	F(SLOT(psp_create_any_func) == 55 && SLOT(srq_set_lw_func) == 69)                          \
	/* 1.2 signatures: 7-argument dat_rmr_bind, 11-argument dat_lmr_create,                  \
	 * 1-argument dat_cr_reject, in the prototypes and the table. */                          \
	F(SAME_TYPE(__typeof__(dat_rmr_bind), rmr_bind_12))                                        \
	F(SAME_TYPE(__typeof__(dat_lmr_create), lmr_create_12))                                    \
	F(SAME_TYPE(__typeof__(dat_cr_reject), cr_reject_12))                                      \
	F(SAME_TYPE(DAT_RMR_BIND_FUNC, rmr_bind_12 *))                                             \
	F(SAME_TYPE(DAT_LMR_CREATE_FUNC, lmr_create_12 *))                                         \
	F(SAME_TYPE(DAT_CR_REJECT_FUNC, cr_reject_12 *))                                           \
	/* Return codes. */                                                                        \
	F(DAT_NOT_IMPLEMENTED == 0x0FFF0000)                                                       \
	F(DAT_GET_TYPE(DAT_CLASS_ERROR | DAT_INVALID_HANDLE | DAT_INVALID_HANDLE_EP) == DAT_INVALID_HANDLE) \
	F(DAT_GET_SUBTYPE(DAT_CLASS_ERROR | DAT_INVALID_HANDLE | DAT_INVALID_HANDLE_EP) == DAT_INVALID_HANDLE_EP) \
	F(DAT_IS_WARNING(DAT_CLASS_WARNING | DAT_QUEUE_EMPTY) && !DAT_IS_WARNING(DAT_CLASS_ERROR)) \
	/* Versions and the dat_ia_open macro. */                                                  \
	F(DAT_VERSION_MAJOR == 1 && DAT_VERSION_MINOR == 2)                                        \
	F(dat_ia_open("ia", 8, (DAT_EVD_HANDLE *)0, (DAT_IA_HANDLE *)0) == 120)                   \
	/* Values the seed pages state. */                                                         \
	F(DAT_COMPLETION_DEFAULT_FLAG == 0x00 && DAT_COMPLETION_SUPPRESS_FLAG == 0x01)             \
	F(DAT_COMPLETION_SOLICITED_WAIT_FLAG == 0x02 && DAT_COMPLETION_UNSIGNALLED_FLAG == 0x04)   \
	F(DAT_COMPLETION_BARRIER_FENCE_FLAG == 0x08)                                               \
	F(DAT_MEM_PRIV_NONE_FLAG == 0 && DAT_MEM_PRIV_ALL_FLAG == 0x33)                            \
	F(DAT_MEM_PRIV_REMOTE_READ_FLAG == 0x02 && DAT_MEM_PRIV_REMOTE_WRITE_FLAG == 0x20)

/* Every 1.2 subtype, in order: each equals its position, and 2.0's value
 * less one from DAT_INVALID_HANDLE1 on (2.0 inserted
 * DAT_INVALID_HANDLE_CSP before it) and less two from DAT_PRIVILEGES_READ
 * on (2.0 also inserted DAT_INVALID_STATE_SRQ_SHUTDOWN before that). */
#define SUBTYPES(S)                                                                                \
	S(DAT_NO_SUBTYPE) S(DAT_SUB_INTERRUPTED) S(DAT_RESOURCE_MEMORY) S(DAT_RESOURCE_DEVICE)     \
	S(DAT_RESOURCE_TEP) S(DAT_RESOURCE_TEVD) S(DAT_RESOURCE_PROTECTION_DOMAIN)                 \
	S(DAT_RESOURCE_MEMORY_REGION) S(DAT_RESOURCE_ERROR_HANDLER) S(DAT_RESOURCE_CREDITS)        \
	S(DAT_RESOURCE_SRQ) S(DAT_INVALID_HANDLE_IA) S(DAT_INVALID_HANDLE_EP)                      \
	S(DAT_INVALID_HANDLE_LMR) S(DAT_INVALID_HANDLE_RMR) S(DAT_INVALID_HANDLE_PZ)               \
	S(DAT_INVALID_HANDLE_PSP) S(DAT_INVALID_HANDLE_RSP) S(DAT_INVALID_HANDLE_CR)               \
	S(DAT_INVALID_HANDLE_CNO) S(DAT_INVALID_HANDLE_EVD_CR) S(DAT_INVALID_HANDLE_EVD_REQUEST)   \
	S(DAT_INVALID_HANDLE_EVD_RECV) S(DAT_INVALID_HANDLE_EVD_CONN)                              \
	S(DAT_INVALID_HANDLE_EVD_ASYNC) S(DAT_INVALID_HANDLE_SRQ) S(DAT_INVALID_HANDLE1)           \
	S(DAT_INVALID_HANDLE2) S(DAT_INVALID_HANDLE3) S(DAT_INVALID_HANDLE4) S(DAT_INVALID_HANDLE5) \
	S(DAT_INVALID_HANDLE6) S(DAT_INVALID_HANDLE7) S(DAT_INVALID_HANDLE8) S(DAT_INVALID_HANDLE9) \
	S(DAT_INVALID_HANDLE10) S(DAT_INVALID_ARG1) S(DAT_INVALID_ARG2) S(DAT_INVALID_ARG3)        \
	S(DAT_INVALID_ARG4) S(DAT_INVALID_ARG5) S(DAT_INVALID_ARG6) S(DAT_INVALID_ARG7)            \
	S(DAT_INVALID_ARG8) S(DAT_INVALID_ARG9) S(DAT_INVALID_ARG10)                               \
	S(DAT_INVALID_STATE_EP_UNCONNECTED) S(DAT_INVALID_STATE_EP_ACTCONNPENDING)                 \
	S(DAT_INVALID_STATE_EP_PASSCONNPENDING) S(DAT_INVALID_STATE_EP_TENTCONNPENDING)            \
	S(DAT_INVALID_STATE_EP_CONNECTED) S(DAT_INVALID_STATE_EP_DISCONNECTED)                     \
	S(DAT_INVALID_STATE_EP_RESERVED) S(DAT_INVALID_STATE_EP_COMPLPENDING)                      \
	S(DAT_INVALID_STATE_EP_DISCPENDING) S(DAT_INVALID_STATE_EP_PROVIDERCONTROL)                \
	S(DAT_INVALID_STATE_EP_NOTREADY) S(DAT_INVALID_STATE_EP_RECV_WATERMARK)                    \
	S(DAT_INVALID_STATE_EP_PZ) S(DAT_INVALID_STATE_EP_EVD_REQUEST)                             \
	S(DAT_INVALID_STATE_EP_EVD_RECV) S(DAT_INVALID_STATE_EP_EVD_CONNECT)                       \
	S(DAT_INVALID_STATE_EP_UNCONFIGURED) S(DAT_INVALID_STATE_EP_UNCONFRESERVED)                \
	S(DAT_INVALID_STATE_EP_UNCONFPASSIVE) S(DAT_INVALID_STATE_EP_UNCONFTENTATIVE)              \
	S(DAT_INVALID_STATE_CNO_IN_USE) S(DAT_INVALID_STATE_CNO_DEAD) S(DAT_INVALID_STATE_EVD_OPEN) \
	S(DAT_INVALID_STATE_EVD_ENABLED) S(DAT_INVALID_STATE_EVD_DISABLED)                         \
	S(DAT_INVALID_STATE_EVD_WAITABLE) S(DAT_INVALID_STATE_EVD_UNWAITABLE)                      \
	S(DAT_INVALID_STATE_EVD_IN_USE) S(DAT_INVALID_STATE_EVD_CONFIG_NOTIFY)                     \
	S(DAT_INVALID_STATE_EVD_CONFIG_SOLICITED) S(DAT_INVALID_STATE_EVD_CONFIG_THRESHOLD)        \
	S(DAT_INVALID_STATE_EVD_WAITER) S(DAT_INVALID_STATE_EVD_ASYNC)                             \
	S(DAT_INVALID_STATE_IA_IN_USE) S(DAT_INVALID_STATE_LMR_IN_USE)                             \
	S(DAT_INVALID_STATE_LMR_FREE) S(DAT_INVALID_STATE_PZ_IN_USE) S(DAT_INVALID_STATE_PZ_FREE)  \
	S(DAT_INVALID_STATE_SRQ_OPERATIONAL) S(DAT_INVALID_STATE_SRQ_ERROR)                        \
	S(DAT_INVALID_STATE_SRQ_IN_USE) S(DAT_PRIVILEGES_READ) S(DAT_PRIVILEGES_WRITE)             \
	S(DAT_PRIVILEGES_RDMA_READ) S(DAT_PRIVILEGES_RDMA_WRITE) S(DAT_PROTECTION_READ)            \
	S(DAT_PROTECTION_WRITE) S(DAT_PROTECTION_RDMA_READ) S(DAT_PROTECTION_RDMA_WRITE)           \
	S(DAT_INVALID_ADDRESS_UNSUPPORTED) S(DAT_INVALID_ADDRESS_UNREACHABLE)                      \
	S(DAT_INVALID_ADDRESS_MALFORMED) S(DAT_NAME_NOT_REGISTERED) S(DAT_MAJOR_NOT_FOUND)         \
	S(DAT_MINOR_NOT_FOUND) S(DAT_THREAD_SAFETY_NOT_FOUND)

/* The return types 1.2 has: the same values as 2.0's. (1.2 stops at
 * DAT_CONN_QUAL_UNAVAILABLE; DAT_NOT_IMPLEMENTED differs, checked above.) */
#define TYPES(T)                                                                                   \
	T(DAT_SUCCESS) T(DAT_ABORT) T(DAT_CONN_QUAL_IN_USE) T(DAT_INSUFFICIENT_RESOURCES)          \
	T(DAT_INTERNAL_ERROR) T(DAT_INVALID_HANDLE) T(DAT_INVALID_PARAMETER) T(DAT_INVALID_STATE)  \
	T(DAT_LENGTH_ERROR) T(DAT_MODEL_NOT_SUPPORTED) T(DAT_PROVIDER_NOT_FOUND)                   \
	T(DAT_PRIVILEGES_VIOLATION) T(DAT_PROTECTION_VIOLATION) T(DAT_QUEUE_EMPTY) T(DAT_QUEUE_FULL) \
	T(DAT_TIMEOUT_EXPIRED) T(DAT_PROVIDER_ALREADY_REGISTERED) T(DAT_PROVIDER_IN_USE)           \
	T(DAT_INVALID_ADDRESS) T(DAT_INTERRUPTED_CALL) T(DAT_CONN_QUAL_UNAVAILABLE)

#define V20_SHIFT(v20) ((v20) >= V20_DAT_PRIVILEGES_READ ? 2 : (v20) >= V20_DAT_INVALID_HANDLE1 ? 1 : 0)

/* Every slot of the table against the prototype of the call it serves
 * (dat_ia_open is the registry's macro; its slot is checked above). */
#define SLOTS(P)                                                                                   \
	P(dat_ia_query, ia_query_func) P(dat_ia_close, ia_close_func)                              \
	P(dat_set_consumer_context, set_consumer_context_func)                                     \
	P(dat_get_consumer_context, get_consumer_context_func)                                     \
	P(dat_get_handle_type, get_handle_type_func) P(dat_cno_create, cno_create_func)            \
	P(dat_cno_modify_agent, cno_modify_agent_func) P(dat_cno_query, cno_query_func)            \
	P(dat_cno_free, cno_free_func) P(dat_cno_wait, cno_wait_func) P(dat_cr_query, cr_query_func) \
	P(dat_cr_accept, cr_accept_func) P(dat_cr_reject, cr_reject_func)                          \
	P(dat_cr_handoff, cr_handoff_func) P(dat_evd_create, evd_create_func)                      \
	P(dat_evd_query, evd_query_func) P(dat_evd_modify_cno, evd_modify_cno_func)                \
	P(dat_evd_enable, evd_enable_func) P(dat_evd_disable, evd_disable_func)                    \
	P(dat_evd_wait, evd_wait_func) P(dat_evd_resize, evd_resize_func)                          \
	P(dat_evd_post_se, evd_post_se_func) P(dat_evd_dequeue, evd_dequeue_func)                  \
	P(dat_evd_free, evd_free_func) P(dat_ep_create, ep_create_func) P(dat_ep_query, ep_query_func) \
	P(dat_ep_modify, ep_modify_func) P(dat_ep_connect, ep_connect_func)                        \
	P(dat_ep_dup_connect, ep_dup_connect_func) P(dat_ep_disconnect, ep_disconnect_func)        \
	P(dat_ep_post_send, ep_post_send_func) P(dat_ep_post_recv, ep_post_recv_func)              \
	P(dat_ep_post_rdma_read, ep_post_rdma_read_func)                                           \
	P(dat_ep_post_rdma_write, ep_post_rdma_write_func)                                         \
	P(dat_ep_get_status, ep_get_status_func) P(dat_ep_free, ep_free_func)                      \
	P(dat_lmr_create, lmr_create_func) P(dat_lmr_query, lmr_query_func)                        \
	P(dat_lmr_free, lmr_free_func) P(dat_rmr_create, rmr_create_func)                          \
	P(dat_rmr_query, rmr_query_func) P(dat_rmr_bind, rmr_bind_func) P(dat_rmr_free, rmr_free_func) \
	P(dat_psp_create, psp_create_func) P(dat_psp_query, psp_query_func)                        \
	P(dat_psp_free, psp_free_func) P(dat_rsp_create, rsp_create_func)                          \
	P(dat_rsp_query, rsp_query_func) P(dat_rsp_free, rsp_free_func) P(dat_pz_create, pz_create_func) \
	P(dat_pz_query, pz_query_func) P(dat_pz_free, pz_free_func)                                \
	P(dat_psp_create_any, psp_create_any_func) P(dat_ep_reset, ep_reset_func)                  \
	P(dat_evd_set_unwaitable, evd_set_unwaitable_func)                                         \
	P(dat_evd_clear_unwaitable, evd_clear_unwaitable_func)                                     \
	P(dat_lmr_sync_rdma_read, lmr_sync_rdma_read_func)                                         \
	P(dat_lmr_sync_rdma_write, lmr_sync_rdma_write_func)                                       \
	P(dat_ep_create_with_srq, ep_create_with_srq_func)                                         \
	P(dat_ep_recv_query, ep_recv_query_func) P(dat_ep_set_watermark, ep_set_watermark_func)    \
	P(dat_srq_create, srq_create_func) P(dat_srq_free, srq_free_func)                          \
	P(dat_srq_post_recv, srq_post_recv_func) P(dat_srq_query, srq_query_func)                  \
	P(dat_srq_resize, srq_resize_func) P(dat_srq_set_lw, srq_set_lw_func)

/* Names 2.0 has and 1.2 must not: the two subtypes and four types 2.0
 * added. Checked by the preprocessor (cbindgen emits #defines). */
#if defined(DAT_INVALID_HANDLE_CSP) || defined(DAT_INVALID_STATE_SRQ_SHUTDOWN)
#error "a DAT 2.0 subtype in the DAT 1.2 header"
#endif
#if defined(DAT_RESERVED_LMR) || defined(DAT_PORT_IN_USE) || defined(DAT_COMM_NOT_SUPPORTED) || \
	defined(DAT_EXTENSION_BASE)
#error "a DAT 2.0 return type in the DAT 1.2 header"
#endif
#define ABSENT_2_0_NAMES 6

#define FACT_ASSERT(...) _Static_assert(__VA_ARGS__, #__VA_ARGS__);
FACTS(FACT_ASSERT)

enum subtype_position {
#define SUBTYPE_POSITION(name) POS_##name,
	SUBTYPES(SUBTYPE_POSITION) SUBTYPE_COUNT
};
#define SUBTYPE_ASSERT(name)                                                                       \
	_Static_assert(name == POS_##name, #name " is its position in the 1.2 list");            \
	_Static_assert(name == V20_##name - V20_SHIFT(V20_##name), #name " is 2.0's less the inserted members");
SUBTYPES(SUBTYPE_ASSERT)
_Static_assert(SUBTYPE_COUNT == 102, "DAT 1.2 has 102 subtypes");
_Static_assert(DAT_THREAD_SAFETY_NOT_FOUND == V20_DAT_THREAD_SAFETY_NOT_FOUND - 2, "the last subtype");

#define TYPE_ASSERT(name) _Static_assert(name == V20_##name, #name " is 2.0's value");
TYPES(TYPE_ASSERT)

#define SLOT_ASSERT(func, slot)                                                                    \
	_Static_assert(SAME_TYPE(__typeof__(&func), __typeof__(((DAT_PROVIDER *)0)->slot)),      \
		       #func " has the signature of DAT_PROVIDER." #slot);
SLOTS(SLOT_ASSERT)
_Static_assert(SAME_TYPE(__typeof__(&(dat_ia_openv)), DAT_IA_OPENV_FUNC), "dat_ia_openv");

int main(void)
{
	int facts = 0, codes = 0, slots = 0;
#define COUNT_FACT(...) facts++;
	FACTS(COUNT_FACT)
#define COUNT_TYPE(name) codes++;
	TYPES(COUNT_TYPE)
#define COUNT_SUBTYPE(name) codes += 2;
	SUBTYPES(COUNT_SUBTYPE)
	codes += 2; /* the subtype count and the last subtype */
#define COUNT_SLOT(func, slot) slots++;
	SLOTS(COUNT_SLOT)
	slots++; /* dat_ia_openv */
	printf("abi12_check: %d passed, 0 failed (%d layout, signature and value facts of <dat/udat.h>, "
	       "%d return type and subtype checks, %d prototypes against the 70-slot DAT_PROVIDER, %d DAT 2.0 names "
	       "absent; seed12_synopsis.c compiled)\n",
	       facts + codes + slots + ABSENT_2_0_NAMES, facts, codes, slots, ABSENT_2_0_NAMES);
	return 0;
}
