/*
 * <dat2/dat_ib_extensions.h>: the InfiniBand extensions of DAT 2.0 in
 * udapl-rs, interface version 2.0.9 (the one OFED's uDAPL 2.1 ships).
 *
 * A consumer reaches every extended operation through the variadic
 * dat_extension_op(handle, op, ...); the function-like macros below name
 * them. The order and the type of the arguments each macro passes is the
 * binary interface a provider reads its va_list by, so it must not change.
 * Extended completions arrive as DAT_IB_DTO_EVENT events whose
 * event_extension_data holds a DAT_IB_EXTENSION_EVENT_DATA.
 *
 * Values, sizes and field offsets equal OFED's header (tests-c/programs/abi_compare.c
 * asserts each at compile time); the Rust side is src/abi/src/ib_ext.rs.
 * This header includes what it needs: <dat2/udat.h> may come before it or
 * not.
 *
 * Our provider (rs-tcp, libdaplrs.so.2) answers the atomics, RDMA write
 * with immediate data, the counters and the open/close query; the other
 * operations (unreliable datagrams, collectives) return DAT_NOT_IMPLEMENTED.
 */
#ifndef _DAT_IB_EXTENSIONS_H_
#define _DAT_IB_EXTENSIONS_H_

#include <dat2/udat.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- version */

/* Reported as extension_version of DAT_IA_ATTR: 2.0.9. */
#define DAT_IB_EXTENSION_VERSION 209

/* ---------------------------------- names of provider-specific attributes */

/* dat_ia_query with DAT_PROVIDER_FIELD_PROVIDER_SPECIFIC_ATTR lists, by
 * these names, the extended operations an IA supports. */
#define DAT_IB_ATTR_COUNTERS "DAT_COUNTERS"
#define DAT_IB_ATTR_FETCH_AND_ADD "DAT_IB_FETCH_AND_ADD"
#define DAT_IB_ATTR_CMP_AND_SWAP "DAT_IB_CMP_AND_SWAP"
#define DAT_IB_ATTR_IMMED_DATA "DAT_IB_IMMED_DATA"
#define DAT_IB_ATTR_UD "DAT_IB_UD"

/* ... and the collective operations. */
#define DAT_IB_COLL_SET_CLOCK "DAT_COLL_SET_CLOCK"
#define DAT_IB_COLL_READ_CLOCK "DAT_COLL_READ_CLOCK"
#define DAT_IB_COLL_BROADCAST "DAT_COLL_BROADCAST"
#define DAT_IB_COLL_BARRIER "DAT_COLL_BARRIER"
#define DAT_IB_COLL_SCATTER "DAT_COLL_SCATTER"
#define DAT_IB_COLL_SCATTERV "DAT_COLL_SCATTERV"
#define DAT_IB_COLL_GATHER "DAT_COLL_GATHER"
#define DAT_IB_COLL_GATHERV "DAT_COLL_GATHERV"
#define DAT_IB_COLL_ALLGATHER "DAT_COLL_ALLGATHER"
#define DAT_IB_COLL_ALLGATHERV "DAT_COLL_ALLGATHERV"
#define DAT_IB_COLL_ALLTOALL "DAT_COLL_ALLTOALL"
#define DAT_IB_COLL_ALLTOALLV "DAT_COLL_ALLTOALLV"
#define DAT_IB_COLL_REDUCE "DAT_COLL_REDUCE"
#define DAT_IB_COLL_ALLREDUCE "DAT_COLL_ALLREDUCE"
#define DAT_IB_COLL_REDUCE_SCATTER "DAT_COLL_REDUCE_SCATTER"
#define DAT_IB_COLL_SCAN "DAT_COLL_SCAN"

/* A collective group, as created by dat_ib_collective_create_group. */
typedef DAT_HANDLE DAT_IB_COLLECTIVE_HANDLE;

/* ------------------------------------------------------------ event numbers */

/* event_number of the extended events, from DAT_IB_EXTENSION_RANGE_BASE up. */
typedef enum dat_ib_event_number {
	DAT_IB_DTO_EVENT = DAT_IB_EXTENSION_RANGE_BASE, /* every extended completion */
	DAT_IB_UD_CONNECTION_REQUEST_EVENT = DAT_IB_EXTENSION_RANGE_BASE + 1,
	DAT_IB_UD_CONNECTION_EVENT_ESTABLISHED = DAT_IB_EXTENSION_RANGE_BASE + 2,
	DAT_IB_UD_CONNECTION_REJECT_EVENT = DAT_IB_EXTENSION_RANGE_BASE + 3,
	DAT_IB_UD_CONNECTION_ERROR_EVENT = DAT_IB_EXTENSION_RANGE_BASE + 4,
	DAT_IB_COLLECTIVE_EVENT = DAT_IB_EXTENSION_RANGE_BASE + 5
} DAT_IB_EVENT_NUMBER;

/* ------------------------------------------------------ extended operations */

/* The `op` argument of dat_extension_op. Open and close of a query IA lie in
 * the ranges the registry itself looks at (DAT_OPEN/CLOSE_EXTENSION_BASE). */
typedef enum dat_ib_op {
	DAT_IB_FETCH_AND_ADD_OP = 0,
	DAT_IB_CMP_AND_SWAP_OP = 1,
	DAT_IB_RDMA_WRITE_IMMED_OP = 2,
	DAT_IB_UD_SEND_OP = 3,
	DAT_IB_QUERY_COUNTERS_OP = 4,
	DAT_IB_PRINT_COUNTERS_OP = 5,
	DAT_IB_COLLECTIVE_CREATE_MEMBER_OP = 6,
	DAT_IB_COLLECTIVE_FREE_MEMBER_OP = 7,
	DAT_IB_COLLECTIVE_CREATE_GROUP_OP = 8,
	DAT_IB_COLLECTIVE_FREE_GROUP_OP = 9,
	DAT_IB_COLLECTIVE_SET_CLOCK_OP = 10,
	DAT_IB_COLLECTIVE_READ_CLOCK_OP = 11,
	DAT_IB_COLLECTIVE_SCATTER_OP = 12,
	DAT_IB_COLLECTIVE_SCATTERV_OP = 13,
	DAT_IB_COLLECTIVE_GATHER_OP = 14,
	DAT_IB_COLLECTIVE_GATHERV_OP = 15,
	DAT_IB_COLLECTIVE_ALLGATHER_OP = 16,
	DAT_IB_COLLECTIVE_ALLGATHERV_OP = 17,
	DAT_IB_COLLECTIVE_ALLTOALL_OP = 18,
	DAT_IB_COLLECTIVE_ALLTOALLV_OP = 19,
	DAT_IB_COLLECTIVE_REDUCE_OP = 20,
	DAT_IB_COLLECTIVE_ALLREDUCE_OP = 21,
	DAT_IB_COLLECTIVE_REDUCE_SCATTER_OP = 22,
	DAT_IB_COLLECTIVE_SCAN_OP = 23,
	DAT_IB_COLLECTIVE_BROADCAST_OP = 24,
	DAT_IB_COLLECTIVE_BARRIER_OP = 25,
	DAT_IB_START_COUNTERS_OP = 26,
	DAT_IB_STOP_COUNTERS_OP = 27,
	DAT_IB_UD_CM_FREE_OP = 28,
	DAT_IB_UD_AH_FREE_OP = 29,
	DAT_IB_OPEN_QUERY_OP = DAT_OPEN_EXTENSION_BASE,
	DAT_IB_CLOSE_QUERY_OP = DAT_CLOSE_EXTENSION_BASE
} DAT_IB_OP;

/* `type` of DAT_IB_EXTENSION_EVENT_DATA: what an extended event reports.
 * (The DTO completion's `operation` says the same as a DAT_IB_DTOS.) */
typedef enum dat_ib_ext_type {
	DAT_IB_FETCH_AND_ADD = 0,
	DAT_IB_CMP_AND_SWAP = 1,
	DAT_IB_RDMA_WRITE_IMMED = 2,      /* initiator of a write with immediate */
	DAT_IB_RDMA_WRITE_IMMED_DATA = 3, /* its target: a receive consumed */
	DAT_IB_RECV_IMMED_DATA = 4,
	DAT_IB_UD_CONNECT_REQUEST = 5,
	DAT_IB_UD_REMOTE_AH = 6,
	DAT_IB_UD_PASSIVE_REMOTE_AH = 7,
	DAT_IB_UD_SEND = 8,
	DAT_IB_UD_RECV = 9,
	DAT_IB_UD_CONNECT_REJECT = 10,
	DAT_IB_UD_CONNECT_ERROR = 11,
	DAT_IB_COLLECTIVE_CREATE_STATUS = 12,
	DAT_IB_COLLECTIVE_CREATE_DATA = 13,
	DAT_IB_COLLECTIVE_CLOCK_SET_STATUS = 14,
	DAT_IB_COLLECTIVE_SCATTER_STATUS = 15,
	DAT_IB_COLLECTIVE_SCATTERV_STATUS = 16,
	DAT_IB_COLLECTIVE_GATHER_STATUS = 17,
	DAT_IB_COLLECTIVE_GATHERV_STATUS = 18,
	DAT_IB_COLLECTIVE_ALLGATHER_STATUS = 19,
	DAT_IB_COLLECTIVE_ALLGATHERV_STATUS = 20,
	DAT_IB_COLLECTIVE_ALLTOALL_STATUS = 21,
	DAT_IB_COLLECTIVE_ALLTOALLV_STATUS = 22,
	DAT_IB_COLLECTIVE_REDUCE_STATUS = 23,
	DAT_IB_COLLECTIVE_ALLREDUCE_STATUS = 24,
	DAT_IB_COLLECTIVE_REDUCE_SCATTER_STATUS = 25,
	DAT_IB_COLLECTIVE_SCAN_STATUS = 26,
	DAT_IB_COLLECTIVE_BROADCAST_STATUS = 27,
	DAT_IB_COLLECTIVE_BARRIER_STATUS = 28
} DAT_IB_EXT_TYPE;

/* `status` of DAT_IB_EXTENSION_EVENT_DATA. */
typedef enum dat_ib_status {
	DAT_OP_SUCCESS = DAT_SUCCESS,
	DAT_IB_OP_ERR = 1,
	DAT_IB_COLL_COMP_ERR = 2
} DAT_IB_STATUS;

/* Return types of the extensions, in the DAT_EXTENSION_BASE type range. */
typedef enum dat_ib_return {
	DAT_IB_ERR = DAT_EXTENSION_BASE,
	DAT_IB_COLLECTIVE_ERR = DAT_EXTENSION_BASE + 1
} DAT_IB_RETURN;

/* `operation` of the DTO completion of an extended operation. */
typedef enum dat_ib_dtos {
	DAT_IB_DTO_RDMA_WRITE_IMMED = DAT_DTO_EXTENSION_BASE,
	DAT_IB_DTO_RECV_IMMED = DAT_DTO_EXTENSION_BASE + 1,
	DAT_IB_DTO_FETCH_ADD = DAT_DTO_EXTENSION_BASE + 2,
	DAT_IB_DTO_CMP_SWAP = DAT_DTO_EXTENSION_BASE + 3,
	DAT_IB_DTO_RECV_MSG_IMMED = DAT_DTO_EXTENSION_BASE + 4,
	DAT_IB_DTO_SEND_UD = DAT_DTO_EXTENSION_BASE + 5,
	DAT_IB_DTO_RECV_UD = DAT_DTO_EXTENSION_BASE + 6,
	DAT_IB_DTO_RECV_UD_IMMED = DAT_DTO_EXTENSION_BASE + 7,
	DAT_IB_DTO_COLLECTIVES = DAT_DTO_EXTENSION_BASE + 8
} DAT_IB_DTOS;

/* dat_get_handle_type answers for the extensions' own objects. */
typedef enum dat_ib_handle_type {
	DAT_IB_HANDLE_TYPE_EXT = DAT_HANDLE_TYPE_EXTENSION_BASE,
	DAT_IB_HANDLE_TYPE_COLLECTIVE = DAT_HANDLE_TYPE_EXTENSION_BASE + 1
} DAT_IB_HANDLE_TYPE;

/* An EVD flag for EVDs that take extended events of no standard stream. */
typedef enum dat_ib_evd_extension_flags {
	DAT_IB_EVD_EXTENSION_FLAG = DAT_EVD_EXTENSION_BASE
} DAT_IB_EVD_EXTENSION_FLAGS;

/* Remote atomic access (fetch-and-add, compare-and-swap) to an LMR or RMR. */
typedef enum dat_ib_mem_priv_flags {
	DAT_IB_MEM_PRIV_REMOTE_ATOMIC = DAT_MEM_PRIV_EXTENSION_BASE
} DAT_IB_MEM_PRIV_FLAGS;

/* service_type of an EP attribute: unreliable datagram. */
typedef enum dat_ib_service_type {
	DAT_IB_SERVICE_TYPE_UD = DAT_SERVICE_TYPE_EXTENSION_BASE
} DAT_IB_SERVICE_TYPE;

/* ------------------------------------------------------- extended events */

/* Where an unreliable datagram goes: the verbs address handle, the remote
 * QP number and the peer's IA address. */
typedef struct dat_ib_addr_handle {
	struct ibv_ah *ah;
	DAT_UINT32 qpn;
	DAT_SOCK_ADDR6 ia_addr;
} DAT_IB_ADDR_HANDLE;

/* The immediate data of a write with immediate, at its target. */
typedef struct dat_ib_immed_data {
	DAT_UINT32 data;
} DAT_IB_IMMED_DATA;

/* What a collective event carries. */
typedef struct dat_ib_collective_event_data {
	DAT_HANDLE handle;
	DAT_CONTEXT context;
} DAT_IB_COLLECTIVE_EVENT_DATA;

/* The event_extension_data of an event whose event_number is one of
 * DAT_IB_EVENT_NUMBER (at most the 64 bytes DAT_EVENT has room for):
 *
 *   DAT_IB_EXTENSION_EVENT_DATA *x =
 *       (DAT_IB_EXTENSION_EVENT_DATA *)event.event_extension_data;
 *
 * `type` says which operation it reports and which members mean something:
 * val.immed.data for DAT_IB_RDMA_WRITE_IMMED_DATA, remote_ah (and the
 * connection's context) for the UD connection events, coll for the
 * collective ones. */
typedef struct dat_ib_extension_event_data {
	DAT_IB_EXT_TYPE type;
	DAT_IB_STATUS status;
	union {
		DAT_IB_IMMED_DATA immed;
	} val;
	union {
		DAT_IB_ADDR_HANDLE remote_ah;
		DAT_IB_COLLECTIVE_EVENT_DATA coll;
	};
	DAT_CONTEXT context;
} DAT_IB_EXTENSION_EVENT_DATA;

/* ----------------------------------------------------------------- counters */

/* Counters of an IA: dat_ib_query_counters(ia, DCNT_IA_..., ...). With
 * DCNT_IA_ALL_COUNTERS the array receives all of them, in this order. */
typedef enum dat_ia_counters {
	/* objects created and freed */
	DCNT_IA_PZ_CREATE, DCNT_IA_PZ_FREE,
	DCNT_IA_LMR_CREATE, DCNT_IA_LMR_FREE,
	DCNT_IA_RMR_CREATE, DCNT_IA_RMR_FREE,
	DCNT_IA_PSP_CREATE, DCNT_IA_PSP_CREATE_ANY, DCNT_IA_PSP_FREE,
	DCNT_IA_RSP_CREATE, DCNT_IA_RSP_FREE,
	DCNT_IA_EVD_CREATE, DCNT_IA_EVD_FREE,
	DCNT_IA_EP_CREATE, DCNT_IA_EP_FREE,
	DCNT_IA_SRQ_CREATE, DCNT_IA_SRQ_FREE,
	/* connection requests at service points */
	DCNT_IA_SP_CR, DCNT_IA_SP_CR_ACCEPTED, DCNT_IA_SP_CR_REJECTED,
	/* memory */
	DCNT_IA_MEM_ALLOC, DCNT_IA_MEM_ALLOC_DATA, DCNT_IA_MEM_FREE,
	/* asynchronous errors */
	DCNT_IA_ASYNC_ERROR, DCNT_IA_ASYNC_QP_ERROR, DCNT_IA_ASYNC_CQ_ERROR,
	/* connection manager messages */
	DCNT_IA_CM_LISTEN,
	DCNT_IA_CM_REQ_TX, DCNT_IA_CM_REQ_RX,
	DCNT_IA_CM_REP_TX, DCNT_IA_CM_REP_RX,
	DCNT_IA_CM_RTU_TX, DCNT_IA_CM_RTU_RX,
	DCNT_IA_CM_USER_REJ_TX, DCNT_IA_CM_USER_REJ_RX,
	DCNT_IA_CM_ACTIVE_EST, DCNT_IA_CM_PASSIVE_EST,
	DCNT_IA_CM_AH_REQ_TX, DCNT_IA_CM_AH_REQ_RX, DCNT_IA_CM_AH_RESOLVED,
	DCNT_IA_CM_DREQ_TX, DCNT_IA_CM_DREQ_RX,
	DCNT_IA_CM_DREP_TX, DCNT_IA_CM_DREP_RX,
	DCNT_IA_CM_MRA_TX, DCNT_IA_CM_MRA_RX,
	DCNT_IA_CM_REQ_FULLQ_POLL,
	/* connection manager errors */
	DCNT_IA_CM_ERR,
	DCNT_IA_CM_ERR_REQ_FULLQ, DCNT_IA_CM_ERR_REQ_DUP, DCNT_IA_CM_ERR_REQ_RETRY,
	DCNT_IA_CM_ERR_REP_DUP, DCNT_IA_CM_ERR_REP_RETRY,
	DCNT_IA_CM_ERR_RTU_DUP, DCNT_IA_CM_ERR_RTU_RETRY,
	DCNT_IA_CM_ERR_REFUSED, DCNT_IA_CM_ERR_RESET, DCNT_IA_CM_ERR_TIMEOUT,
	DCNT_IA_CM_ERR_REJ_TX, DCNT_IA_CM_ERR_REJ_RX,
	DCNT_IA_CM_ERR_DREQ_DUP, DCNT_IA_CM_ERR_DREQ_RETRY,
	DCNT_IA_CM_ERR_DREP_DUP, DCNT_IA_CM_ERR_DREP_RETRY,
	DCNT_IA_CM_ERR_MRA_DUP, DCNT_IA_CM_ERR_MRA_RETRY,
	DCNT_IA_CM_ERR_UNEXPECTED,
	/* the port's link (sampled between dat_ib_start/stop_counter) */
	DCNT_IA_LNK_ERR_RCV, DCNT_IA_LNK_ERR_RCV_REM_PHYS, DCNT_IA_LNK_ERR_RCV_CONSTRAINT,
	DCNT_IA_LNK_ERR_XMT_DISCARDS, DCNT_IA_LNK_ERR_XMT_CONTRAINT,
	DCNT_IA_LNK_ERR_INTEGRITY, DCNT_IA_LNK_ERR_EXC_BUF_OVERRUN,
	DCNT_IA_LNK_WARN_RCV_SW_RELAY, DCNT_IA_LNK_WARN_XMT_WAIT,
	/* the device's diagnostics */
	DCNT_IA_DIAG_ERR_RQ_RAE, DCNT_IA_DIAG_ERR_RQ_OOS, DCNT_IA_DIAG_ERR_RQ_RIRE,
	DCNT_IA_DIAG_ERR_RQ_UDSDPRD,
	DCNT_IA_DIAG_ERR_SQ_RAE, DCNT_IA_DIAG_ERR_SQ_OOS, DCNT_IA_DIAG_ERR_SQ_RIRE,
	DCNT_IA_DIAG_ERR_SQ_RREE, DCNT_IA_DIAG_ERR_SQ_TREE,
	DCNT_IA_ALL_COUNTERS /* the number of IA counters; keep last */
} DAT_IA_COUNTERS;

/* Counters of an EP. */
typedef enum dat_ep_counters {
	DCNT_EP_CONNECT, DCNT_EP_DISCONNECT,
	/* requests posted (count, then bytes) */
	DCNT_EP_POST_SEND, DCNT_EP_POST_SEND_DATA,
	DCNT_EP_POST_SEND_UD, DCNT_EP_POST_SEND_UD_DATA,
	DCNT_EP_POST_RECV, DCNT_EP_POST_RECV_DATA,
	DCNT_EP_POST_WRITE, DCNT_EP_POST_WRITE_DATA,
	DCNT_EP_POST_WRITE_IMM, DCNT_EP_POST_WRITE_IMM_DATA,
	DCNT_EP_POST_READ, DCNT_EP_POST_READ_DATA,
	DCNT_EP_POST_CMP_SWAP, DCNT_EP_POST_FETCH_ADD,
	/* receives completed (count, then bytes) */
	DCNT_EP_RECV, DCNT_EP_RECV_DATA,
	DCNT_EP_RECV_UD, DCNT_EP_RECV_UD_DATA,
	DCNT_EP_RECV_IMM, DCNT_EP_RECV_IMM_DATA,
	DCNT_EP_RECV_RDMA_IMM, DCNT_EP_RECV_RDMA_IMM_DATA,
	DCNT_EP_ALL_COUNTERS /* the number of EP counters; keep last */
} DAT_EP_COUNTERS;

/* Counters of an EVD. */
typedef enum dat_evd_counters {
	DCNT_EVD_WAIT, DCNT_EVD_WAIT_BLOCKED, DCNT_EVD_WAIT_NOTIFY,
	DCNT_EVD_DEQUEUE, DCNT_EVD_DEQUEUE_FOUND, DCNT_EVD_DEQUEUE_NOT_FOUND,
	DCNT_EVD_DEQUEUE_POLL, DCNT_EVD_DEQUEUE_POLL_FOUND,
	DCNT_EVD_CONN_CALLBACK, DCNT_EVD_DTO_CALLBACK,
	DCNT_EVD_ALL_COUNTERS /* the number of EVD counters; keep last */
} DAT_EVD_COUNTERS;

/* Which running IA counters dat_ib_start_counter/stop_counter sample. */
typedef enum dat_ia_counter_type {
	DCNT_IA_CM = 0,
	DCNT_IA_LNK = 1,
	DCNT_IA_DIAG = 2
} DAT_IA_COUNTER_TYPE;

/* -------------------------------------------------------------- collectives */

/* Element types of reductions. */
typedef enum dat_ib_collective_data_type {
	DAT_IB_COLLECTIVE_TYPE_INT8 = 0,
	DAT_IB_COLLECTIVE_TYPE_UINT8 = 1,
	DAT_IB_COLLECTIVE_TYPE_INT16 = 2,
	DAT_IB_COLLECTIVE_TYPE_UINT16 = 3,
	DAT_IB_COLLECTIVE_TYPE_INT32 = 4,
	DAT_IB_COLLECTIVE_TYPE_UINT32 = 5,
	DAT_IB_COLLECTIVE_TYPE_INT64 = 6,
	DAT_IB_COLLECTIVE_TYPE_UINT64 = 7,
	DAT_IB_COLLECTIVE_TYPE_FLOAT = 8,
	DAT_IB_COLLECTIVE_TYPE_DOUBLE = 9,
	DAT_IB_COLLECTIVE_TYPE_LONG_DOUBLE = 10,
	DAT_IB_COLLECTIVE_TYPE_SHORT_INT = 11,
	DAT_IB_COLLECTIVE_TYPE_2INT = 12,
	DAT_IB_COLLECTIVE_TYPE_FLOAT_INT = 13,
	DAT_IB_COLLECTIVE_TYPE_LONG_INT = 14,
	DAT_IB_COLLECTIVE_TYPE_DOUBLE_INT = 15
} DAT_IB_COLLECTIVE_DATA_TYPE;

/* Reduction operators. */
typedef enum dat_ib_collective_reduce_data_op {
	DAT_IB_COLLECTIVE_REDUCE_OP_MAX = 0,
	DAT_IB_COLLECTIVE_REDUCE_OP_MIN = 1,
	DAT_IB_COLLECTIVE_REDUCE_OP_SUM = 2,
	DAT_IB_COLLECTIVE_REDUCE_OP_PROD = 3,
	DAT_IB_COLLECTIVE_REDUCE_OP_LAND = 4,
	DAT_IB_COLLECTIVE_REDUCE_OP_BAND = 5,
	DAT_IB_COLLECTIVE_REDUCE_OP_LOR = 6,
	DAT_IB_COLLECTIVE_REDUCE_OP_BOR = 7,
	DAT_IB_COLLECTIVE_REDUCE_OP_LXOR = 8,
	DAT_IB_COLLECTIVE_REDUCE_OP_BXOR = 9,
	DAT_IB_COLLECTIVE_REDUCE_OP_MAXLOC = 10,
	DAT_IB_COLLECTIVE_REDUCE_OP_MINLOC = 11
} DAT_IB_COLLECTIVE_REDUCE_DATA_OP;

typedef unsigned int DAT_IB_COLLECTIVE_RANK;
typedef unsigned int DAT_IB_COLLECTIVE_ID;
/* A member's address information, from dat_ib_collective_create_member. */
typedef void *DAT_IB_COLLECTIVE_MEMBER;

/* The process layout of a group (dat_ib_collective_create_group). */
typedef struct dat_ib_collective_group {
	int local_size;       /* processes on this node */
	int local_rank;       /* this process among them */
	int *local_ranks;     /* the global rank of each of them */
	int external_size;    /* nodes (one external process each) */
	int external_rank;    /* this process among the external ones, or -1 */
	int *external_ranks;  /* the global rank of each external process */
	int *intranode_table; /* global rank -> local rank, -1 on another node */
	int *internode_table; /* global rank -> external rank, -1 if not external */
	int is_comm_world;
} DAT_IB_COLLECTIVE_GROUP;

/* ------------------------------------------------------- return code names */

/* Names a DAT_RETURN that may carry an extension type: DAT_IB_ERR by name,
 * anything else as dat_strerror's major message. */
static __inline__ DAT_RETURN DAT_API
dat_strerror_extension(DAT_IB_RETURN value, const char **message)
{
	const char *minor;

	if (DAT_GET_TYPE(value) == (DAT_UINT32)DAT_IB_ERR) {
		*message = "DAT_IB_ERR";
		return DAT_SUCCESS;
	}
	return dat_strerror((DAT_RETURN)value, message, &minor);
}

/* Names the status of an extended event. */
static __inline__ DAT_RETURN DAT_API
dat_strerror_ext_status(DAT_IB_STATUS value, const char **message)
{
	switch (value) {
	case DAT_OP_SUCCESS:
		*message = "DAT_OP_SUCCESS";
		return DAT_SUCCESS;
	case DAT_IB_OP_ERR:
		*message = "DAT_IB_OP_ERR";
		return DAT_SUCCESS;
	case DAT_IB_COLL_COMP_ERR:
		*message = "DAT_IB_COLL_COMP_ERR";
		return DAT_SUCCESS;
	default:
		*message = "unknown DAT_IB_STATUS";
		return DAT_INVALID_PARAMETER;
	}
}

/* ---------------------------------------------------- the extended calls
 *
 * Each passes the object handle and the operation first, then its own
 * arguments, each cast to the type the provider reads it as. A `cookie`
 * is a DAT_DTO_COOKIE passed as it is. */

/* Atomically adds add_val to the 64-bit word the RMR triplet names; the
 * word's previous value lands in the 8-byte LMR segment. */
#define dat_ib_post_fetch_and_add(ep, add_val, lbuf, cookie, rbuf, flgs)     \
	dat_extension_op((DAT_EP_HANDLE)(ep), (DAT_IB_OP)DAT_IB_FETCH_AND_ADD_OP, \
			 (DAT_UINT64)(add_val), (DAT_LMR_TRIPLET *)(lbuf),    \
			 (cookie), (DAT_RMR_TRIPLET *)(rbuf),                 \
			 (DAT_COMPLETION_FLAGS)(flgs))

/* Atomically stores swap_val in the remote 64-bit word if it equals
 * cmp_val; the word's previous value lands in the LMR segment either way. */
#define dat_ib_post_cmp_and_swap(ep, cmp_val, swap_val, lbuf, cookie, rbuf, flgs) \
	dat_extension_op((DAT_EP_HANDLE)(ep), (DAT_IB_OP)DAT_IB_CMP_AND_SWAP_OP,   \
			 (DAT_UINT64)(cmp_val), (DAT_UINT64)(swap_val),            \
			 (DAT_LMR_TRIPLET *)(lbuf), (cookie),                      \
			 (DAT_RMR_TRIPLET *)(rbuf), (DAT_COMPLETION_FLAGS)(flgs))

/* An RDMA write of `size` LMR segments that also consumes a receive at the
 * target, which completes with the 32-bit immediate data `idata`. */
#define dat_ib_post_rdma_write_immed(ep, size, lbuf, cookie, rbuf, idata, flgs) \
	dat_extension_op((DAT_EP_HANDLE)(ep), (DAT_IB_OP)DAT_IB_RDMA_WRITE_IMMED_OP, \
			 (DAT_COUNT)(size), (DAT_LMR_TRIPLET *)(lbuf), (cookie),  \
			 (DAT_RMR_TRIPLET *)(rbuf), (DAT_UINT32)(idata),          \
			 (DAT_COMPLETION_FLAGS)(flgs))

/* Unreliable datagrams: a send to the address handle ah_ptr names; the
 * receive side posts ordinary receives. */
#define dat_ib_post_send_ud(ep, segments, lbuf, ah_ptr, cookie, flgs)       \
	dat_extension_op((DAT_EP_HANDLE)(ep), (DAT_IB_OP)DAT_IB_UD_SEND_OP,  \
			 (DAT_COUNT)(segments), (DAT_LMR_TRIPLET *)(lbuf),   \
			 (DAT_IB_ADDR_HANDLE *)(ah_ptr), (cookie),           \
			 (DAT_COMPLETION_FLAGS)(flgs))
#define dat_ib_post_recv_ud dat_ep_post_recv

/* Frees the connection object a UD connection event handed over (its
 * context), once the consumer has kept what it needs of it. */
#define dat_ib_ud_cm_free(ep, cm)                                          \
	dat_extension_op((DAT_EP_HANDLE)(ep), (DAT_IB_OP)DAT_IB_UD_CM_FREE_OP, \
			 (DAT_CONTEXT)(cm))

/* Frees a UD address handle; after its last send, before the EP goes. */
#define dat_ib_ud_ah_free(ep, ah)                                          \
	dat_extension_op((DAT_EP_HANDLE)(ep), (DAT_IB_OP)DAT_IB_UD_AH_FREE_OP, \
			 (DAT_IB_ADDR_HANDLE *)(ah))

/* Counters of an IA, EP or EVD: one (cntr = its DCNT_ value) or all (cntr =
 * DCNT_*_ALL_COUNTERS) into p_cntrs_out; reset != 0 zeroes them after. */
#define dat_ib_query_counters(dat_handle, cntr, p_cntrs_out, reset)           \
	dat_extension_op((DAT_HANDLE)(dat_handle), (DAT_IB_OP)DAT_IB_QUERY_COUNTERS_OP, \
			 (int)(cntr), (DAT_UINT64 *)(p_cntrs_out), (int)(reset))

/* The same counters, printed by the provider. */
#define dat_ib_print_counters(dat_handle, cntr, reset)                        \
	dat_extension_op((DAT_HANDLE)(dat_handle), (DAT_IB_OP)DAT_IB_PRINT_COUNTERS_OP, \
			 (int)(cntr), (int)(reset))

/* Starts and stops sampling the running IA counters of one DAT_IA_COUNTER_TYPE. */
#define dat_ib_start_counter(dat_handle, type)                                \
	dat_extension_op((DAT_HANDLE)(dat_handle), (DAT_IB_OP)DAT_IB_START_COUNTERS_OP, \
			 (DAT_IA_COUNTER_TYPE)(type))
#define dat_ib_stop_counter(dat_handle, type)                                 \
	dat_extension_op((DAT_HANDLE)(dat_handle), (DAT_IB_OP)DAT_IB_STOP_COUNTERS_OP, \
			 (DAT_IA_COUNTER_TYPE)(type))

/* A quick attribute query by IA name: the registry loads the provider of
 * `name` and the provider opens a light IA whose attributes it returns;
 * *ia_handle is the provider's own handle, good only for dat_ib_close_query,
 * which closes it and releases the provider. DAT_SUCCESS, or
 * DAT_INVALID_HANDLE / DAT_NOT_IMPLEMENTED / the provider's error. */
#define dat_ib_open_query(name, ia_handle, ia_mask, ia_attr, prov_mask, prov_attr) \
	dat_extension_op((DAT_HANDLE)(NULL), (DAT_IB_OP)DAT_IB_OPEN_QUERY_OP,      \
			 (const DAT_NAME_PTR)(name), (DAT_HANDLE *)(ia_handle),    \
			 (DAT_IA_ATTR_MASK)(ia_mask), (DAT_IA_ATTR *)(ia_attr),    \
			 (DAT_PROVIDER_ATTR_MASK)(prov_mask),                      \
			 (DAT_PROVIDER_ATTR *)(prov_attr))
#define dat_ib_close_query(ia_handle) \
	dat_extension_op((DAT_HANDLE)(ia_handle), (DAT_IB_OP)DAT_IB_CLOSE_QUERY_OP)

/* ------------------------------------------------- MPI-style collectives */

/* Member and group setup. create_member returns this rank's address
 * information (to be exchanged by the consumer); create_group completes on
 * `evd` with a DAT_IB_COLLECTIVE_CREATE_DATA event carrying the handle. */
#define dat_ib_collective_create_member(ia_handle, progress_func, member, member_size) \
	dat_extension_op((DAT_IA_HANDLE)(ia_handle),                                   \
			 (DAT_IB_OP)DAT_IB_COLLECTIVE_CREATE_MEMBER_OP,                \
			 (void *)(progress_func), (DAT_IB_COLLECTIVE_MEMBER *)(member), \
			 (DAT_UINT32 *)(member_size))
#define dat_ib_collective_free_member(ia_handle, member)                       \
	dat_extension_op((DAT_IA_HANDLE)(ia_handle),                           \
			 (DAT_IB_OP)DAT_IB_COLLECTIVE_FREE_MEMBER_OP,          \
			 (DAT_IB_COLLECTIVE_MEMBER)(member))
#define dat_ib_collective_create_group(members, group_size, self, group_id, group_info, evd, pd, user_context) \
	dat_extension_op((DAT_EVD_HANDLE)(evd),                                        \
			 (DAT_IB_OP)DAT_IB_COLLECTIVE_CREATE_GROUP_OP,                 \
			 (DAT_IB_COLLECTIVE_MEMBER *)(members), (DAT_COUNT)(group_size), \
			 (DAT_IB_COLLECTIVE_RANK)(self), (DAT_IB_COLLECTIVE_ID)(group_id), \
			 (DAT_IB_COLLECTIVE_GROUP *)(group_info), (DAT_PZ_HANDLE)(pd),  \
			 (DAT_CONTEXT)(user_context))
#define dat_ib_collective_free_group(coll_handle)                          \
	dat_extension_op((DAT_IB_COLLECTIVE_HANDLE)(coll_handle),          \
			 (DAT_IB_OP)DAT_IB_COLLECTIVE_FREE_GROUP_OP)

/* The group's network clock. OFED's set_clock macro passes READ_CLOCK_OP
 * and an undefined name, and its read_clock macro does not parse, so no
 * program can use them; these pass what their names say. */
#define dat_ib_collective_set_clock(coll_handle, clock_value, user_context) \
	dat_extension_op((DAT_IB_COLLECTIVE_HANDLE)(coll_handle),           \
			 (DAT_IB_OP)DAT_IB_COLLECTIVE_SET_CLOCK_OP,         \
			 (DAT_UINT64)(clock_value), (DAT_CONTEXT)(user_context))
#define dat_ib_collective_read_clock(coll_handle, clock_value)    \
	dat_extension_op((DAT_IB_COLLECTIVE_HANDLE)(coll_handle), \
			 (DAT_IB_OP)DAT_IB_COLLECTIVE_READ_CLOCK_OP, \
			 (DAT_UINT64 *)(clock_value))

/* Data movement. Completions go to the group's EVD unless `flags` suppress
 * them; a NULL receive (scatter) or send (gather) buffer at the root means
 * "in place". */
#define dat_ib_collective_scatter(coll_handle, sendbuf, sendsize, recvbuf, recvsize, root, user_context, flags) \
	dat_extension_op((DAT_IB_COLLECTIVE_HANDLE)(coll_handle),                        \
			 (DAT_IB_OP)DAT_IB_COLLECTIVE_SCATTER_OP,                         \
			 (DAT_PVOID)(sendbuf), (DAT_COUNT)(sendsize),                     \
			 (DAT_PVOID)(recvbuf), (DAT_COUNT)(recvsize),                     \
			 (DAT_IB_COLLECTIVE_RANK)(root), (DAT_CONTEXT)(user_context),     \
			 (DAT_COMPLETION_FLAGS)(flags))
#define dat_ib_collective_scatterv(coll_handle, sendbuf, sendsizes, displs, recvbuf, recvsize, root, user_context, flags) \
	dat_extension_op((DAT_IB_COLLECTIVE_HANDLE)(coll_handle),                        \
			 (DAT_IB_OP)DAT_IB_COLLECTIVE_SCATTERV_OP,                        \
			 (DAT_PVOID)(sendbuf), (DAT_COUNT *)(sendsizes),                  \
			 (DAT_COUNT *)(displs), (DAT_PVOID)(recvbuf),                     \
			 (DAT_COUNT)(recvsize), (DAT_IB_COLLECTIVE_RANK)(root),           \
			 (DAT_CONTEXT)(user_context), (DAT_COMPLETION_FLAGS)(flags))
#define dat_ib_collective_gather(coll_handle, sendbuf, sendsize, recvbuf, recvsize, root, user_context, flags) \
	dat_extension_op((DAT_IB_COLLECTIVE_HANDLE)(coll_handle),                        \
			 (DAT_IB_OP)DAT_IB_COLLECTIVE_GATHER_OP,                          \
			 (DAT_PVOID)(sendbuf), (DAT_COUNT)(sendsize),                     \
			 (DAT_PVOID)(recvbuf), (DAT_COUNT)(recvsize),                     \
			 (DAT_IB_COLLECTIVE_RANK)(root), (DAT_CONTEXT)(user_context),     \
			 (DAT_COMPLETION_FLAGS)(flags))
/* (OFED's macro passes a variable named `recvbuf` here, not its argument.) */
#define dat_ib_collective_gatherv(coll_handle, sendbuf, sendsize, recvbufs, recvsizes, displs, root, user_context, flags) \
	dat_extension_op((DAT_IB_COLLECTIVE_HANDLE)(coll_handle),                        \
			 (DAT_IB_OP)DAT_IB_COLLECTIVE_GATHERV_OP,                         \
			 (DAT_PVOID)(sendbuf), (DAT_COUNT)(sendsize),                     \
			 (DAT_PVOID)(recvbufs), (DAT_COUNT *)(recvsizes),                 \
			 (DAT_COUNT *)(displs), (DAT_IB_COLLECTIVE_RANK)(root),           \
			 (DAT_CONTEXT)(user_context), (DAT_COMPLETION_FLAGS)(flags))
#define dat_ib_collective_allgather(coll_handle, sendbuf, sendsize, recvbuf, recvsize, user_context, flags) \
	dat_extension_op((DAT_IB_COLLECTIVE_HANDLE)(coll_handle),                        \
			 (DAT_IB_OP)DAT_IB_COLLECTIVE_ALLGATHER_OP,                       \
			 (DAT_PVOID)(sendbuf), (DAT_COUNT)(sendsize),                     \
			 (DAT_PVOID)(recvbuf), (DAT_COUNT)(recvsize),                     \
			 (DAT_CONTEXT)(user_context), (DAT_COMPLETION_FLAGS)(flags))
#define dat_ib_collective_allgatherv(coll_handle, sendbuf, sendsize, recvbuf, recvsizes, displs, user_context, flags) \
	dat_extension_op((DAT_IB_COLLECTIVE_HANDLE)(coll_handle),                        \
			 (DAT_IB_OP)DAT_IB_COLLECTIVE_ALLGATHERV_OP,                      \
			 (DAT_PVOID)(sendbuf), (DAT_COUNT)(sendsize),                     \
			 (DAT_PVOID)(recvbuf), (DAT_COUNT *)(recvsizes),                  \
			 (DAT_COUNT *)(displs), (DAT_CONTEXT)(user_context),              \
			 (DAT_COMPLETION_FLAGS)(flags))
#define dat_ib_collective_alltoall(coll_handle, sendbuf, sendsize, recvbuf, recvsize, user_context, flags) \
	dat_extension_op((DAT_IB_COLLECTIVE_HANDLE)(coll_handle),                        \
			 (DAT_IB_OP)DAT_IB_COLLECTIVE_ALLTOALL_OP,                        \
			 (DAT_PVOID)(sendbuf), (DAT_COUNT)(sendsize),                     \
			 (DAT_PVOID)(recvbuf), (DAT_COUNT)(recvsize),                     \
			 (DAT_CONTEXT)(user_context), (DAT_COMPLETION_FLAGS)(flags))
#define dat_ib_collective_alltoallv(coll_handle, sendbuf, sendsizes, senddispls, recvbuf, recvsizes, recvdispls, user_context, flags) \
	dat_extension_op((DAT_IB_COLLECTIVE_HANDLE)(coll_handle),                        \
			 (DAT_IB_OP)DAT_IB_COLLECTIVE_ALLTOALLV_OP,                       \
			 (DAT_PVOID)(sendbuf), (DAT_COUNT *)(sendsizes),                  \
			 (DAT_COUNT *)(senddispls), (DAT_PVOID)(recvbuf),                 \
			 (DAT_COUNT *)(recvsizes), (DAT_COUNT *)(recvdispls),             \
			 (DAT_CONTEXT)(user_context), (DAT_COMPLETION_FLAGS)(flags))

/* Reductions over the group (MINLOC/MAXLOC work on (value, uint32 rank)
 * pairs); reduce_scatter is a reduce followed by a scatterv of the result,
 * scan a prefix reduction by rank. */
#define dat_ib_collective_reduce(coll_handle, sendbuf, sendsize, recvbuf, recvsize, op, type, root, user_context, flags) \
	dat_extension_op((DAT_IB_COLLECTIVE_HANDLE)(coll_handle),                        \
			 (DAT_IB_OP)DAT_IB_COLLECTIVE_REDUCE_OP,                          \
			 (DAT_PVOID)(sendbuf), (DAT_COUNT)(sendsize),                     \
			 (DAT_PVOID)(recvbuf), (DAT_COUNT)(recvsize),                     \
			 (DAT_IB_COLLECTIVE_REDUCE_DATA_OP)(op),                          \
			 (DAT_IB_COLLECTIVE_DATA_TYPE)(type),                             \
			 (DAT_IB_COLLECTIVE_RANK)(root), (DAT_CONTEXT)(user_context),     \
			 (DAT_COMPLETION_FLAGS)(flags))
#define dat_ib_collective_allreduce(coll_handle, sendbuf, sendsize, recvbuf, recvsize, op, type, user_context, flags) \
	dat_extension_op((DAT_IB_COLLECTIVE_HANDLE)(coll_handle),                        \
			 (DAT_IB_OP)DAT_IB_COLLECTIVE_ALLREDUCE_OP,                       \
			 (DAT_PVOID)(sendbuf), (DAT_COUNT)(sendsize),                     \
			 (DAT_PVOID)(recvbuf), (DAT_COUNT)(recvsize),                     \
			 (DAT_IB_COLLECTIVE_REDUCE_DATA_OP)(op),                          \
			 (DAT_IB_COLLECTIVE_DATA_TYPE)(type),                             \
			 (DAT_CONTEXT)(user_context), (DAT_COMPLETION_FLAGS)(flags))
#define dat_ib_collective_reduce_scatter(coll_handle, sendbuf, sendsize, recvbuf, recvsizes, op, type, user_context, flags) \
	dat_extension_op((DAT_IB_COLLECTIVE_HANDLE)(coll_handle),                        \
			 (DAT_IB_OP)DAT_IB_COLLECTIVE_REDUCE_SCATTER_OP,                  \
			 (DAT_PVOID)(sendbuf), (DAT_COUNT)(sendsize),                     \
			 (DAT_PVOID)(recvbuf), (DAT_COUNT *)(recvsizes),                  \
			 (DAT_IB_COLLECTIVE_REDUCE_DATA_OP)(op),                          \
			 (DAT_IB_COLLECTIVE_DATA_TYPE)(type),                             \
			 (DAT_CONTEXT)(user_context), (DAT_COMPLETION_FLAGS)(flags))
#define dat_ib_collective_scan(coll_handle, sendbuf, sendsize, recvbuf, recvsize, op, type, user_context, flags) \
	dat_extension_op((DAT_IB_COLLECTIVE_HANDLE)(coll_handle),                        \
			 (DAT_IB_OP)DAT_IB_COLLECTIVE_SCAN_OP,                            \
			 (DAT_PVOID)(sendbuf), (DAT_COUNT)(sendsize),                     \
			 (DAT_PVOID)(recvbuf), (DAT_COUNT)(recvsize),                     \
			 (DAT_IB_COLLECTIVE_REDUCE_DATA_OP)(op),                          \
			 (DAT_IB_COLLECTIVE_DATA_TYPE)(type),                             \
			 (DAT_CONTEXT)(user_context), (DAT_COMPLETION_FLAGS)(flags))

/* The root's buffer into everyone's (always in place), and a barrier. */
#define dat_ib_collective_broadcast(coll_handle, buf, size, root, user_context, flags) \
	dat_extension_op((DAT_IB_COLLECTIVE_HANDLE)(coll_handle),                      \
			 (DAT_IB_OP)DAT_IB_COLLECTIVE_BROADCAST_OP,                     \
			 (DAT_PVOID)(buf), (DAT_COUNT)(size),                           \
			 (DAT_IB_COLLECTIVE_RANK)(root), (DAT_CONTEXT)(user_context),   \
			 (DAT_COMPLETION_FLAGS)(flags))
#define dat_ib_collective_barrier(coll_handle, user_context, flags)  \
	dat_extension_op((DAT_IB_COLLECTIVE_HANDLE)(coll_handle),    \
			 (DAT_IB_OP)DAT_IB_COLLECTIVE_BARRIER_OP,     \
			 (DAT_CONTEXT)(user_context), (DAT_COMPLETION_FLAGS)(flags))

/* ------------------------------------------------------- older spellings */

#define DAT_ATTR_COUNTERS DAT_IB_ATTR_COUNTERS
#define DAT_QUERY_COUNTERS_OP DAT_IB_QUERY_COUNTERS_OP
#define DAT_PRINT_COUNTERS_OP DAT_IB_PRINT_COUNTERS_OP
#define dat_query_counters dat_ib_query_counters
#define dat_print_counters dat_ib_print_counters

#ifdef __cplusplus
}
#endif

#endif /* _DAT_IB_EXTENSIONS_H_ */
