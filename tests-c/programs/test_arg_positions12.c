/* Argument positions of DAT 1.2 (issue 24 item 2): test_arg_positions for
 * every export of libdat.so.1, built as the seed pages build a program
 * (<dat/udat.h>, -ldat), against our provider's 1.2 table. Codes are 1.2's
 * (1.2 numbers the DAT_INVALID_ARGn subtypes differently from 2.0).
 *
 * Where 1.2's argument lists differ from 2.0's, the 1.2 positions hold:
 * dat_lmr_create has no va_type (lmr_handle is argument 7), dat_rmr_bind
 * takes 7 arguments (no LMR handle, no va_type), dat_cr_reject takes the CR
 * only; dat_ia_open's async_evd_qlen (2.0: async_event_qlen) is argument 2.
 * A 1.2 triplet's 64-bit segment_length beyond what one segment carries is
 * DAT_LENGTH_ERROR in a post, DAT_INVALID_ARG2 in dat_rmr_bind.
 *
 * An IA without RMRs (max_rmrs 0: an iWARP device without memory windows,
 * e.g. soft-iWARP) must refuse dat_rmr_create (DAT_INSUFFICIENT_RESOURCES);
 * the rows that need a live RMR are skipped there, saying so (BAD_RMR: they
 * count as covered, and run on every IA with RMRs). */
#define _GNU_SOURCE /* dl_iterate_phdr (arg_cover.h) */
#include <dat/udat.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "check.h"
#include "dto_pair12.h"
#include "arg_cover.h"

#define ARG(n) ERRCODE(DAT_INVALID_PARAMETER, DAT_INVALID_ARG##n)
#define HANDLE(sub) ERRCODE(DAT_INVALID_HANDLE, sub)
#define BAD_FLAGS ((DAT_COMPLETION_FLAGS)0x40000000)
#define BAD_MASK 0xffffffffu
#define BUF 4096

/* Every export of libdat.so.1 and how many arguments it takes. */
static struct export_args EXPORTS[] = {
	{"dat_cno_create", 3, 0},
	{"dat_cno_free", 1, 0},
	{"dat_cno_modify_agent", 2, 0},
	{"dat_cno_query", 3, 0},
	{"dat_cno_wait", 3, 0},
	{"dat_cr_accept", 4, 0},
	{"dat_cr_handoff", 2, 0},
	{"dat_cr_query", 3, 0},
	{"dat_cr_reject", 1, 0},
	{"dat_ep_connect", 8, 0},
	{"dat_ep_create", 7, 0},
	{"dat_ep_create_with_srq", 8, 0},
	{"dat_ep_disconnect", 2, 0},
	{"dat_ep_dup_connect", 6, 0},
	{"dat_ep_free", 1, 0},
	{"dat_ep_get_status", 4, 0},
	{"dat_ep_modify", 3, 0},
	{"dat_ep_post_rdma_read", 6, 0},
	{"dat_ep_post_rdma_write", 6, 0},
	{"dat_ep_post_recv", 5, 0},
	{"dat_ep_post_send", 5, 0},
	{"dat_ep_query", 3, 0},
	{"dat_ep_recv_query", 3, 0},
	{"dat_ep_reset", 1, 0},
	{"dat_ep_set_watermark", 3, 0},
	{"dat_evd_clear_unwaitable", 1, 0},
	{"dat_evd_create", 5, 0},
	{"dat_evd_dequeue", 2, 0},
	{"dat_evd_disable", 1, 0},
	{"dat_evd_enable", 1, 0},
	{"dat_evd_free", 1, 0},
	{"dat_evd_modify_cno", 2, 0},
	{"dat_evd_post_se", 2, 0},
	{"dat_evd_query", 3, 0},
	{"dat_evd_resize", 2, 0},
	{"dat_evd_set_unwaitable", 1, 0},
	{"dat_evd_wait", 5, 0},
	{"dat_get_consumer_context", 2, 0},
	{"dat_get_handle_type", 2, 0},
	{"dat_ia_close", 2, 0},
	{"dat_ia_openv", 7, 0},
	{"dat_ia_query", 6, 0},
	{"dat_lmr_create", 11, 0},
	{"dat_lmr_free", 1, 0},
	{"dat_lmr_query", 3, 0},
	{"dat_lmr_sync_rdma_read", 3, 0},
	{"dat_lmr_sync_rdma_write", 3, 0},
	{"dat_psp_create", 5, 0},
	{"dat_psp_create_any", 5, 0},
	{"dat_psp_free", 1, 0},
	{"dat_psp_query", 3, 0},
	{"dat_pz_create", 2, 0},
	{"dat_pz_free", 1, 0},
	{"dat_pz_query", 3, 0},
	{"dat_registry_add_provider", 2, 0},
	{"dat_registry_list_providers", 3, 0},
	{"dat_registry_remove_provider", 2, 0},
	{"dat_rmr_bind", 7, 0},
	{"dat_rmr_create", 2, 0},
	{"dat_rmr_free", 1, 0},
	{"dat_rmr_query", 3, 0},
	{"dat_rsp_create", 5, 0},
	{"dat_rsp_free", 1, 0},
	{"dat_rsp_query", 3, 0},
	{"dat_set_consumer_context", 2, 0},
	{"dat_srq_create", 4, 0},
	{"dat_srq_free", 1, 0},
	{"dat_srq_post_recv", 4, 0},
	{"dat_srq_query", 3, 0},
	{"dat_srq_resize", 2, 0},
	{"dat_srq_set_lw", 2, 0},
	{"dat_strerror", 3, 0},
};

static DAT_IA_HANDLE ia_a, ia_b;
static DAT_PZ_HANDLE pz_a, pz_b;
static DAT_LMR_HANDLE lmr_a, lmr_b;
static DAT_LMR_CONTEXT lc_a, lc_b;
static DAT_RMR_CONTEXT rc_a, rc_b;
static struct side A, B;
static char abuf[BUF], bbuf[BUF];
static char pd[8];

/* The posts of a connected EP (A's, connected to B's). */
static void test_posts(void)
{
	DAT_LMR_TRIPLET l = seg(lc_a, abuf, 64);
	DAT_LMR_TRIPLET longseg = seg(lc_a, abuf, (DAT_VLEN)1 << 40);
	DAT_RMR_TRIPLET r = rseg(rc_b, bbuf, 64);
	DAT_EP_HANDLE ep = A.ep;

	/* dat_ep_post_send / _recv(ep_handle, num_segments, local_iov, user_cookie, completion_flags) */
	BAD(dat_ep_post_send, 1, dat_ep_post_send(pz_a, 1, &l, ck(1), 0), HANDLE(DAT_INVALID_HANDLE_EP));
	BAD(dat_ep_post_send, 1, dat_ep_post_send(DAT_HANDLE_NULL, 1, &l, ck(1), 0), HANDLE(DAT_INVALID_HANDLE_EP));
	BAD(dat_ep_post_send, 2, dat_ep_post_send(ep, -1, &l, ck(1), 0), ARG(2));
	BAD(dat_ep_post_send, 3, dat_ep_post_send(ep, 1, NULL, ck(1), 0), ARG(3));
	BAD(dat_ep_post_send, 3, dat_ep_post_send(ep, 1, &longseg, ck(1), 0), ERRCODE(DAT_LENGTH_ERROR, 0));
	NO_BAD_VALUE(dat_ep_post_send, 4, "the cookie is the consumer's");
	BAD(dat_ep_post_send, 5, dat_ep_post_send(ep, 1, &l, ck(1), BAD_FLAGS), ARG(5));
	BAD(dat_ep_post_recv, 1, dat_ep_post_recv(pz_a, 1, &l, ck(1), 0), HANDLE(DAT_INVALID_HANDLE_EP));
	BAD(dat_ep_post_recv, 2, dat_ep_post_recv(ep, -1, &l, ck(1), 0), ARG(2));
	BAD(dat_ep_post_recv, 3, dat_ep_post_recv(ep, 1, NULL, ck(1), 0), ARG(3));
	NO_BAD_VALUE(dat_ep_post_recv, 4, "the cookie is the consumer's");
	BAD(dat_ep_post_recv, 5, dat_ep_post_recv(ep, 1, &l, ck(1), BAD_FLAGS), ARG(5));

	/* dat_ep_post_rdma_read / _write(ep, num_segments, local_iov, cookie, remote_iov, flags) */
	BAD(dat_ep_post_rdma_read, 1, dat_ep_post_rdma_read(pz_a, 1, &l, ck(1), &r, 0), HANDLE(DAT_INVALID_HANDLE_EP));
	BAD(dat_ep_post_rdma_read, 2, dat_ep_post_rdma_read(ep, -1, &l, ck(1), &r, 0), ARG(2));
	BAD(dat_ep_post_rdma_read, 3, dat_ep_post_rdma_read(ep, 1, NULL, ck(1), &r, 0), ARG(3));
	NO_BAD_VALUE(dat_ep_post_rdma_read, 4, "the cookie is the consumer's");
	BAD(dat_ep_post_rdma_read, 5, dat_ep_post_rdma_read(ep, 1, &l, ck(1), NULL, 0), ARG(5));
	BAD(dat_ep_post_rdma_read, 6, dat_ep_post_rdma_read(ep, 1, &l, ck(1), &r, BAD_FLAGS), ARG(6));
	BAD(dat_ep_post_rdma_write, 1, dat_ep_post_rdma_write(pz_a, 1, &l, ck(1), &r, 0),
	    HANDLE(DAT_INVALID_HANDLE_EP));
	BAD(dat_ep_post_rdma_write, 2, dat_ep_post_rdma_write(ep, -1, &l, ck(1), &r, 0), ARG(2));
	BAD(dat_ep_post_rdma_write, 3, dat_ep_post_rdma_write(ep, 1, NULL, ck(1), &r, 0), ARG(3));
	NO_BAD_VALUE(dat_ep_post_rdma_write, 4, "the cookie is the consumer's");
	BAD(dat_ep_post_rdma_write, 5, dat_ep_post_rdma_write(ep, 1, &l, ck(1), NULL, 0), ARG(5));
	BAD(dat_ep_post_rdma_write, 6, dat_ep_post_rdma_write(ep, 1, &l, ck(1), &r, BAD_FLAGS), ARG(6));

	/* dat_rmr_bind of 1.2 (rmr, lmr_triplet, mem_priv, ep, user_cookie, completion_flags,
	 * rmr_context) */
	DAT_RMR_HANDLE rmr = DAT_HANDLE_NULL;
	DAT_RMR_CONTEXT c2 = 0;
	if (no_rmrs) {
		CHECK_TYPE(dat_rmr_create(pz_a, &rmr), DAT_INSUFFICIENT_RESOURCES);
		skip_no_rmrs("dat_rmr_bind's rows after rmr_handle (they need a live RMR)");
	} else {
		CHECK_RC(dat_rmr_create(pz_a, &rmr), DAT_SUCCESS);
	}
	DAT_LMR_TRIPLET whole = seg(lc_a, abuf, BUF);
	DAT_LMR_TRIPLET past = seg(lc_a, abuf + BUF - 8, 64);
	DAT_MEM_PRIV_FLAGS rd = DAT_MEM_PRIV_REMOTE_READ_FLAG;
	BAD(dat_rmr_bind, 1, dat_rmr_bind(pz_a, &whole, rd, ep, ck(2), 0, &c2), HANDLE(DAT_INVALID_HANDLE_RMR));
	BAD_RMR(dat_rmr_bind, 2, dat_rmr_bind(rmr, NULL, rd, ep, ck(2), 0, &c2), ARG(2));
	BAD_RMR(dat_rmr_bind, 2, dat_rmr_bind(rmr, &past, rd, ep, ck(2), 0, &c2), ARG(2));
	BAD_RMR(dat_rmr_bind, 2, dat_rmr_bind(rmr, &longseg, rd, ep, ck(2), 0, &c2), ARG(2));
	BAD_RMR(dat_rmr_bind, 3, dat_rmr_bind(rmr, &whole, 0x40000000, ep, ck(2), 0, &c2), ARG(3));
	BAD_RMR(dat_rmr_bind, 4, dat_rmr_bind(rmr, &whole, rd, pz_a, ck(2), 0, &c2), HANDLE(DAT_INVALID_HANDLE_EP));
	NO_BAD_VALUE(dat_rmr_bind, 5, "the cookie is the consumer's");
	BAD_RMR(dat_rmr_bind, 6, dat_rmr_bind(rmr, &whole, rd, ep, ck(2), BAD_FLAGS, &c2), ARG(6));
	BAD_RMR(dat_rmr_bind, 7, dat_rmr_bind(rmr, &whole, rd, ep, ck(2), 0, NULL), ARG(7));
	if (!no_rmrs)
		CHECK_RC(dat_rmr_free(rmr), DAT_SUCCESS);
	drain(A.req);
}

/* EP creation, connection calls and the EP's own calls, on an EP of A that is not connected. */
static void test_ep(void)
{
	DAT_EP_ATTR attr = ep_attr(0, 0, 64);
	DAT_EP_ATTR huge = attr;
	huge.max_recv_dtos = 1 << 30;
	DAT_EP_HANDLE ep = DAT_HANDLE_NULL;
	DAT_SRQ_HANDLE srq = DAT_HANDLE_NULL;
	DAT_SRQ_ATTR sa = {.max_recv_dtos = 16, .max_recv_iov = 2, .low_watermark = 0};

	/* dat_ep_create(ia, pz, recv_evd, request_evd, connect_evd, ep_attributes, ep_handle) */
	BAD(dat_ep_create, 1, dat_ep_create(pz_a, pz_a, A.rcv, A.req, A.conn, &attr, &ep), HANDLE(DAT_INVALID_HANDLE_IA));
	BAD(dat_ep_create, 2, dat_ep_create(ia_a, A.req, A.rcv, A.req, A.conn, &attr, &ep), HANDLE(DAT_INVALID_HANDLE_PZ));
	BAD(dat_ep_create, 3, dat_ep_create(ia_a, pz_a, pz_a, A.req, A.conn, &attr, &ep),
	    HANDLE(DAT_INVALID_HANDLE_EVD_RECV));
	BAD(dat_ep_create, 4, dat_ep_create(ia_a, pz_a, A.rcv, pz_a, A.conn, &attr, &ep),
	    HANDLE(DAT_INVALID_HANDLE_EVD_REQUEST));
	BAD(dat_ep_create, 5, dat_ep_create(ia_a, pz_a, A.rcv, A.req, pz_a, &attr, &ep),
	    HANDLE(DAT_INVALID_HANDLE_EVD_CONN));
	BAD(dat_ep_create, 6, dat_ep_create(ia_a, pz_a, A.rcv, A.req, A.conn, &huge, &ep), ARG(6));
	BAD(dat_ep_create, 7, dat_ep_create(ia_a, pz_a, A.rcv, A.req, A.conn, &attr, NULL), ARG(7));

	/* dat_ep_create_with_srq(ia, pz, recv, request, connect, srq, ep_attributes, ep_handle) */
	CHECK_RC(dat_srq_create(ia_a, pz_a, &sa, &srq), DAT_SUCCESS);
	BAD(dat_ep_create_with_srq, 1, dat_ep_create_with_srq(pz_a, pz_a, A.rcv, A.req, A.conn, srq, &attr, &ep),
	    HANDLE(DAT_INVALID_HANDLE_IA));
	BAD(dat_ep_create_with_srq, 2, dat_ep_create_with_srq(ia_a, A.req, A.rcv, A.req, A.conn, srq, &attr, &ep),
	    HANDLE(DAT_INVALID_HANDLE_PZ));
	BAD(dat_ep_create_with_srq, 3, dat_ep_create_with_srq(ia_a, pz_a, pz_a, A.req, A.conn, srq, &attr, &ep),
	    HANDLE(DAT_INVALID_HANDLE_EVD_RECV));
	BAD(dat_ep_create_with_srq, 4, dat_ep_create_with_srq(ia_a, pz_a, A.rcv, pz_a, A.conn, srq, &attr, &ep),
	    HANDLE(DAT_INVALID_HANDLE_EVD_REQUEST));
	BAD(dat_ep_create_with_srq, 5, dat_ep_create_with_srq(ia_a, pz_a, A.rcv, A.req, pz_a, srq, &attr, &ep),
	    HANDLE(DAT_INVALID_HANDLE_EVD_CONN));
	BAD(dat_ep_create_with_srq, 6, dat_ep_create_with_srq(ia_a, pz_a, A.rcv, A.req, A.conn, pz_a, &attr, &ep),
	    HANDLE(DAT_INVALID_HANDLE_SRQ));
	BAD(dat_ep_create_with_srq, 7, dat_ep_create_with_srq(ia_a, pz_a, A.rcv, A.req, A.conn, srq, &huge, &ep),
	    ARG(7));
	BAD(dat_ep_create_with_srq, 8, dat_ep_create_with_srq(ia_a, pz_a, A.rcv, A.req, A.conn, srq, &attr, NULL),
	    ARG(8));

	/* dat_srq_create(ia, pz, srq_attr, srq_handle) and the SRQ's calls */
	DAT_LMR_TRIPLET l = seg(lc_a, abuf, 64);
	DAT_SRQ_PARAM sp;
	DAT_SRQ_HANDLE s2;
	DAT_SRQ_ATTR zero = sa;
	zero.max_recv_dtos = 0;
	BAD(dat_srq_create, 1, dat_srq_create(pz_a, pz_a, &sa, &s2), HANDLE(DAT_INVALID_HANDLE_IA));
	BAD(dat_srq_create, 2, dat_srq_create(ia_a, A.req, &sa, &s2), HANDLE(DAT_INVALID_HANDLE_PZ));
	BAD(dat_srq_create, 3, dat_srq_create(ia_a, pz_a, NULL, &s2), ARG(3));
	BAD(dat_srq_create, 3, dat_srq_create(ia_a, pz_a, &zero, &s2), ARG(3));
	BAD(dat_srq_create, 4, dat_srq_create(ia_a, pz_a, &sa, NULL), ARG(4));
	BAD(dat_srq_post_recv, 1, dat_srq_post_recv(pz_a, 1, &l, ck(1)), HANDLE(DAT_INVALID_HANDLE_SRQ));
	BAD(dat_srq_post_recv, 2, dat_srq_post_recv(srq, -1, &l, ck(1)), ARG(2));
	BAD(dat_srq_post_recv, 3, dat_srq_post_recv(srq, 1, NULL, ck(1)), ARG(3));
	NO_BAD_VALUE(dat_srq_post_recv, 4, "the cookie is the consumer's");
	BAD(dat_srq_query, 1, dat_srq_query(pz_a, DAT_SRQ_FIELD_ALL, &sp), HANDLE(DAT_INVALID_HANDLE_SRQ));
	BAD(dat_srq_query, 2, dat_srq_query(srq, BAD_MASK, &sp), ARG(2));
	BAD(dat_srq_query, 3, dat_srq_query(srq, DAT_SRQ_FIELD_ALL, NULL), ARG(3));
	BAD(dat_srq_resize, 1, dat_srq_resize(pz_a, 8), HANDLE(DAT_INVALID_HANDLE_SRQ));
	BAD(dat_srq_resize, 2, dat_srq_resize(srq, 0), ARG(2));
	BAD(dat_srq_set_lw, 1, dat_srq_set_lw(pz_a, 1), HANDLE(DAT_INVALID_HANDLE_SRQ));
	BAD(dat_srq_set_lw, 2, dat_srq_set_lw(srq, -1), ARG(2));
	BAD(dat_srq_free, 1, dat_srq_free(pz_a), HANDLE(DAT_INVALID_HANDLE_SRQ));
	CHECK_RC(dat_srq_free(srq), DAT_SUCCESS);

	/* An unconnected EP for the connection calls. */
	CHECK_RC(dat_ep_create(ia_a, pz_a, A.rcv, A.req, A.conn, &attr, &ep), DAT_SUCCESS);
	DAT_IA_ADDRESS_PTR peer = ia_address(ia_b);
	/* dat_ep_connect(ep, remote_ia_address, remote_conn_qual, timeout, pd_size, pd, qos, connect_flags) */
	BAD(dat_ep_connect, 1, dat_ep_connect(pz_a, peer, 4000, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT, 0),
	    HANDLE(DAT_INVALID_HANDLE_EP));
	BAD(dat_ep_connect, 2, dat_ep_connect(ep, NULL, 4000, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT, 0), ARG(2));
	BAD(dat_ep_connect, 3, dat_ep_connect(ep, peer, 0, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT, 0), ARG(3));
	NO_BAD_VALUE(dat_ep_connect, 4, "every timeout is a wait (DAT_TIMEOUT_INFINITE included)");
	BAD(dat_ep_connect, 5, dat_ep_connect(ep, peer, 4000, WAIT_US, -1, pd, DAT_QOS_BEST_EFFORT, 0), ARG(5));
	BAD(dat_ep_connect, 5, dat_ep_connect(ep, peer, 4000, WAIT_US, 1 << 20, pd, DAT_QOS_BEST_EFFORT, 0), ARG(5));
	BAD(dat_ep_connect, 6, dat_ep_connect(ep, peer, 4000, WAIT_US, 4, NULL, DAT_QOS_BEST_EFFORT, 0), ARG(6));
	NO_BAD_VALUE(dat_ep_connect, 7, "QoS is ignored by this transport");
	BAD(dat_ep_connect, 8, dat_ep_connect(ep, peer, 4000, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT, 7), ARG(8));
	/* dat_ep_dup_connect(ep, ep_dup_handle, timeout, pd_size, pd, qos) */
	BAD(dat_ep_dup_connect, 1, dat_ep_dup_connect(pz_a, A.ep, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT),
	    HANDLE(DAT_INVALID_HANDLE_EP));
	BAD(dat_ep_dup_connect, 2, dat_ep_dup_connect(ep, pz_a, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT),
	    HANDLE(DAT_INVALID_HANDLE2));
	NO_BAD_VALUE(dat_ep_dup_connect, 3, "every timeout is a wait");
	BAD(dat_ep_dup_connect, 4, dat_ep_dup_connect(ep, A.ep, WAIT_US, -1, pd, DAT_QOS_BEST_EFFORT), ARG(4));
	BAD(dat_ep_dup_connect, 5, dat_ep_dup_connect(ep, A.ep, WAIT_US, 4, NULL, DAT_QOS_BEST_EFFORT), ARG(5));
	NO_BAD_VALUE(dat_ep_dup_connect, 6, "QoS is ignored by this transport");
	/* dat_ep_disconnect(ep, close_flags) */
	BAD(dat_ep_disconnect, 1, dat_ep_disconnect(pz_a, DAT_CLOSE_ABRUPT_FLAG), HANDLE(DAT_INVALID_HANDLE_EP));
	BAD(dat_ep_disconnect, 2, dat_ep_disconnect(ep, 7), ARG(2));
	/* dat_ep_query / dat_ep_modify(ep, ep_param_mask, ep_param) */
	DAT_EP_PARAM p;
	memset(&p, 0, sizeof(p));
	BAD(dat_ep_query, 1, dat_ep_query(pz_a, DAT_EP_FIELD_ALL, &p), HANDLE(DAT_INVALID_HANDLE_EP));
	BAD(dat_ep_query, 2, dat_ep_query(ep, BAD_MASK, &p), ARG(2));
	BAD(dat_ep_query, 3, dat_ep_query(ep, DAT_EP_FIELD_ALL, NULL), ARG(3));
	BAD(dat_ep_modify, 1, dat_ep_modify(pz_a, DAT_EP_FIELD_EP_ATTR_ALL, &p), HANDLE(DAT_INVALID_HANDLE_EP));
	BAD(dat_ep_modify, 2, dat_ep_modify(ep, DAT_EP_FIELD_IA_HANDLE, &p), ARG(2));
	BAD(dat_ep_modify, 3, dat_ep_modify(ep, DAT_EP_FIELD_EP_ATTR_ALL, NULL), ARG(3));
	p.ep_attr = huge;
	BAD(dat_ep_modify, 3, dat_ep_modify(ep, DAT_EP_FIELD_EP_ATTR_ALL, &p), ARG(3));
	p.pz_handle = A.req;
	BAD(dat_ep_modify, 3, dat_ep_modify(ep, DAT_EP_FIELD_PZ_HANDLE, &p), ARG(3));
	/* dat_ep_set_watermark(ep, soft_high_watermark, hard_high_watermark) */
	BAD(dat_ep_set_watermark, 1, dat_ep_set_watermark(pz_a, 1, 1), HANDLE(DAT_INVALID_HANDLE_EP));
	BAD(dat_ep_set_watermark, 2, dat_ep_set_watermark(ep, -5, 10), ARG(2));
	BAD(dat_ep_set_watermark, 3, dat_ep_set_watermark(ep, 10, -5), ARG(3));
	/* dat_ep_get_status(ep, ep_state, recv_idle, request_idle); dat_ep_recv_query(ep, nbufs, span) */
	DAT_EP_STATE st;
	DAT_BOOLEAN idle;
	DAT_COUNT nb, span;
	BAD(dat_ep_get_status, 1, dat_ep_get_status(pz_a, &st, &idle, &idle), HANDLE(DAT_INVALID_HANDLE_EP));
	NO_BAD_VALUE(dat_ep_get_status, 2, "optional output (NULL: not reported)");
	NO_BAD_VALUE(dat_ep_get_status, 3, "optional output (NULL: not reported)");
	NO_BAD_VALUE(dat_ep_get_status, 4, "optional output (NULL: not reported)");
	CHECK_RC(dat_ep_get_status(ep, NULL, NULL, NULL), DAT_SUCCESS);
	BAD(dat_ep_recv_query, 1, dat_ep_recv_query(pz_a, &nb, &span), HANDLE(DAT_INVALID_HANDLE_EP));
	NO_BAD_VALUE(dat_ep_recv_query, 2, "optional output (NULL: not reported)");
	NO_BAD_VALUE(dat_ep_recv_query, 3, "optional output (NULL: not reported)");
	CHECK_RC(dat_ep_recv_query(ep, NULL, NULL), DAT_SUCCESS);
	BAD(dat_ep_reset, 1, dat_ep_reset(pz_a), HANDLE(DAT_INVALID_HANDLE_EP));
	BAD(dat_ep_free, 1, dat_ep_free(pz_a), HANDLE(DAT_INVALID_HANDLE_EP));
	CHECK_RC(dat_ep_free(ep), DAT_SUCCESS);
}

/* A pending connection request at B (from an EP of A) for the CR calls. */
static void test_cr(void)
{
	DAT_EP_ATTR attr = ep_attr(0, 0, 64);
	DAT_EP_HANDLE ep = DAT_HANDLE_NULL;
	DAT_CONN_QUAL qual = 0;
	DAT_PSP_HANDLE psp = listen_any(&B, &qual);
	DAT_EVENT ev;
	CHECK_RC(dat_ep_create(ia_a, pz_a, A.rcv, A.req, A.conn, &attr, &ep), DAT_SUCCESS);
	CHECK_RC(dat_ep_connect(ep, ia_address(ia_b), qual, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT, 0), DAT_SUCCESS);
	CHECK_RC(wait_event(B.cr, &ev), DAT_SUCCESS);
	CHECK(ev.event_number == DAT_CONNECTION_REQUEST_EVENT, "event %#x", ev.event_number);
	DAT_CR_HANDLE cr = ev.event_data.cr_arrival_event_data.cr_handle;
	DAT_CR_PARAM cp;

	/* dat_cr_query(cr, cr_param_mask, cr_param) */
	BAD(dat_cr_query, 1, dat_cr_query(pz_a, DAT_CR_FIELD_ALL, &cp), HANDLE(DAT_INVALID_HANDLE_CR));
	BAD(dat_cr_query, 2, dat_cr_query(cr, BAD_MASK, &cp), ARG(2));
	BAD(dat_cr_query, 3, dat_cr_query(cr, DAT_CR_FIELD_ALL, NULL), ARG(3));
	/* dat_cr_accept(cr, ep, private_data_size, private_data) */
	BAD(dat_cr_accept, 1, dat_cr_accept(pz_a, B.ep, 0, NULL), HANDLE(DAT_INVALID_HANDLE_CR));
	BAD(dat_cr_accept, 2, dat_cr_accept(cr, pz_a, 0, NULL), HANDLE(DAT_INVALID_HANDLE_EP));
	BAD(dat_cr_accept, 3, dat_cr_accept(cr, B.ep, -1, pd), ARG(3));
	BAD(dat_cr_accept, 4, dat_cr_accept(cr, B.ep, 4, NULL), ARG(4));
	/* dat_cr_handoff(cr, handoff): a conn_qual no PSP of the IA listens on */
	BAD(dat_cr_handoff, 1, dat_cr_handoff(pz_a, qual), HANDLE(DAT_INVALID_HANDLE_CR));
	BAD(dat_cr_handoff, 2, dat_cr_handoff(cr, 1), ARG(2));
	/* dat_cr_reject(cr): 1.2 sends no private data */
	BAD(dat_cr_reject, 1, dat_cr_reject(pz_a), HANDLE(DAT_INVALID_HANDLE_CR));
	CHECK_RC(dat_cr_reject(cr), DAT_SUCCESS);
	CHECK_RC(wait_event(A.conn, &ev), DAT_SUCCESS);
	CHECK_RC(dat_ep_free(ep), DAT_SUCCESS);
	CHECK_RC(dat_psp_free(psp), DAT_SUCCESS);
	drain(A.conn);
}

static void test_evd_cno(void)
{
	DAT_EVD_HANDLE evd = DAT_HANDLE_NULL, e2;
	DAT_EVD_PARAM ep;
	DAT_EVENT ev;
	DAT_COUNT nmore;
	CHECK_RC(dat_evd_create(ia_a, 8, DAT_HANDLE_NULL, DAT_EVD_SOFTWARE_FLAG, &evd), DAT_SUCCESS);
	/* dat_evd_create(ia, evd_min_qlen, cno, evd_flags, evd_handle) */
	BAD(dat_evd_create, 1, dat_evd_create(pz_a, 8, DAT_HANDLE_NULL, DAT_EVD_SOFTWARE_FLAG, &e2),
	    HANDLE(DAT_INVALID_HANDLE_IA));
	BAD(dat_evd_create, 2, dat_evd_create(ia_a, 0, DAT_HANDLE_NULL, DAT_EVD_SOFTWARE_FLAG, &e2), ARG(2));
	BAD(dat_evd_create, 3, dat_evd_create(ia_a, 8, pz_a, DAT_EVD_SOFTWARE_FLAG, &e2), HANDLE(DAT_INVALID_HANDLE_CNO));
	BAD(dat_evd_create, 4, dat_evd_create(ia_a, 8, DAT_HANDLE_NULL, 0, &e2), ARG(4));
	BAD(dat_evd_create, 4, dat_evd_create(ia_a, 8, DAT_HANDLE_NULL, 0x40000000, &e2), ARG(4));
	BAD(dat_evd_create, 5, dat_evd_create(ia_a, 8, DAT_HANDLE_NULL, DAT_EVD_SOFTWARE_FLAG, NULL), ARG(5));
	/* dat_evd_query(evd, evd_param_mask, evd_param) */
	BAD(dat_evd_query, 1, dat_evd_query(pz_a, DAT_EVD_FIELD_ALL, &ep), HANDLE(DAT_INVALID_HANDLE_EVD_REQUEST));
	BAD(dat_evd_query, 2, dat_evd_query(evd, BAD_MASK, &ep), ARG(2));
	BAD(dat_evd_query, 3, dat_evd_query(evd, DAT_EVD_FIELD_ALL, NULL), ARG(3));
	/* dat_evd_wait(evd, timeout, threshold, event, nmore) */
	BAD(dat_evd_wait, 1, dat_evd_wait(pz_a, 0, 1, &ev, &nmore), HANDLE(DAT_INVALID_HANDLE_EVD_REQUEST));
	NO_BAD_VALUE(dat_evd_wait, 2, "every timeout is a wait");
	BAD(dat_evd_wait, 3, dat_evd_wait(evd, 0, 0, &ev, &nmore), ARG(3));
	BAD(dat_evd_wait, 3, dat_evd_wait(evd, 0, 9, &ev, &nmore), ARG(3));
	BAD(dat_evd_wait, 4, dat_evd_wait(evd, 0, 1, NULL, &nmore), ARG(4));
	NO_BAD_VALUE(dat_evd_wait, 5, "optional output (NULL: not reported)");
	/* dat_evd_resize(evd, evd_qlen) */
	BAD(dat_evd_resize, 1, dat_evd_resize(pz_a, 8), HANDLE(DAT_INVALID_HANDLE_EVD_REQUEST));
	BAD(dat_evd_resize, 2, dat_evd_resize(evd, 0), ARG(2));
	/* dat_evd_post_se / dat_evd_dequeue(evd, event) */
	BAD(dat_evd_post_se, 1, dat_evd_post_se(pz_a, &ev), HANDLE(DAT_INVALID_HANDLE_EVD_REQUEST));
	BAD(dat_evd_post_se, 2, dat_evd_post_se(evd, NULL), ARG(2));
	memset(&ev, 0, sizeof(ev));
	ev.event_number = DAT_DTO_COMPLETION_EVENT;
	BAD(dat_evd_post_se, 2, dat_evd_post_se(evd, &ev), ARG(2));
	BAD(dat_evd_dequeue, 1, dat_evd_dequeue(pz_a, &ev), HANDLE(DAT_INVALID_HANDLE_EVD_REQUEST));
	BAD(dat_evd_dequeue, 2, dat_evd_dequeue(evd, NULL), ARG(2));
	/* dat_evd_modify_cno(evd, cno) */
	BAD(dat_evd_modify_cno, 1, dat_evd_modify_cno(pz_a, DAT_HANDLE_NULL), HANDLE(DAT_INVALID_HANDLE_EVD_REQUEST));
	BAD(dat_evd_modify_cno, 2, dat_evd_modify_cno(evd, pz_a), HANDLE(DAT_INVALID_HANDLE_CNO));
	BAD(dat_evd_enable, 1, dat_evd_enable(pz_a), HANDLE(DAT_INVALID_HANDLE_EVD_REQUEST));
	BAD(dat_evd_disable, 1, dat_evd_disable(pz_a), HANDLE(DAT_INVALID_HANDLE_EVD_REQUEST));
	BAD(dat_evd_set_unwaitable, 1, dat_evd_set_unwaitable(pz_a), HANDLE(DAT_INVALID_HANDLE_EVD_REQUEST));
	BAD(dat_evd_clear_unwaitable, 1, dat_evd_clear_unwaitable(pz_a), HANDLE(DAT_INVALID_HANDLE_EVD_REQUEST));
	BAD(dat_evd_free, 1, dat_evd_free(pz_a), HANDLE(DAT_INVALID_HANDLE_EVD_REQUEST));
	CHECK_RC(dat_evd_free(evd), DAT_SUCCESS);

	/* The CNO calls. */
	DAT_OS_WAIT_PROXY_AGENT agent = {NULL, NULL};
	DAT_CNO_HANDLE cno = DAT_HANDLE_NULL, c2;
	DAT_CNO_PARAM cp;
	DAT_EVD_HANDLE who;
	BAD(dat_cno_create, 1, dat_cno_create(pz_a, agent, &c2), HANDLE(DAT_INVALID_HANDLE_IA));
	NO_BAD_VALUE(dat_cno_create, 2, "any proxy agent (NULL: none)");
	BAD(dat_cno_create, 3, dat_cno_create(ia_a, agent, NULL), ARG(3));
	CHECK_RC(dat_cno_create(ia_a, agent, &cno), DAT_SUCCESS);
	BAD(dat_cno_modify_agent, 1, dat_cno_modify_agent(pz_a, agent), HANDLE(DAT_INVALID_HANDLE_CNO));
	NO_BAD_VALUE(dat_cno_modify_agent, 2, "any proxy agent (NULL: none)");
	BAD(dat_cno_query, 1, dat_cno_query(pz_a, DAT_CNO_FIELD_ALL, &cp), HANDLE(DAT_INVALID_HANDLE_CNO));
	BAD(dat_cno_query, 2, dat_cno_query(cno, BAD_MASK, &cp), ARG(2));
	BAD(dat_cno_query, 3, dat_cno_query(cno, DAT_CNO_FIELD_ALL, NULL), ARG(3));
	BAD(dat_cno_wait, 1, dat_cno_wait(pz_a, 0, &who), HANDLE(DAT_INVALID_HANDLE_CNO));
	NO_BAD_VALUE(dat_cno_wait, 2, "every timeout is a wait");
	BAD(dat_cno_wait, 3, dat_cno_wait(cno, 0, NULL), ARG(3));
	BAD(dat_cno_free, 1, dat_cno_free(pz_a), HANDLE(DAT_INVALID_HANDLE_CNO));
	CHECK_RC(dat_cno_free(cno), DAT_SUCCESS);
}

static void test_memory(void)
{
	DAT_REGION_DESCRIPTION region;
	DAT_LMR_HANDLE lmr;
	DAT_LMR_CONTEXT lc;
	DAT_RMR_CONTEXT rc;
	DAT_VLEN rl;
	DAT_VADDR ra;
	DAT_MEM_PRIV_FLAGS all = DAT_MEM_PRIV_ALL_FLAG;
	region.for_va = abuf;
	/* dat_lmr_create(ia, mem_type, region, length, pz, privileges, lmr_handle, lmr_context,
	 * rmr_context, registered_length, registered_address): 1.2, no va_type */
	BAD(dat_lmr_create, 1,
	    dat_lmr_create(pz_a, DAT_MEM_TYPE_VIRTUAL, region, BUF, pz_a, all, &lmr, &lc, &rc, &rl, &ra),
	    HANDLE(DAT_INVALID_HANDLE_IA));
	BAD(dat_lmr_create, 2,
	    dat_lmr_create(ia_a, (DAT_MEM_TYPE)0x7777, region, BUF, pz_a, all, &lmr, &lc, &rc, &rl, &ra),
	    ARG(2));
	region.for_va = NULL;
	BAD(dat_lmr_create, 3,
	    dat_lmr_create(ia_a, DAT_MEM_TYPE_VIRTUAL, region, BUF, pz_a, all, &lmr, &lc, &rc, &rl, &ra),
	    ARG(3));
	region.for_va = abuf;
	lmr = DAT_HANDLE_NULL;
	BAD(dat_lmr_create, 4,
	    dat_lmr_create(ia_a, DAT_MEM_TYPE_VIRTUAL, region, (DAT_VLEN)1 << 62, pz_a, all, &lmr, &lc,
			   &rc, &rl, &ra),
	    ARG(4));
	if (lmr != DAT_HANDLE_NULL) /* registered after all: not left holding pz_a */
		dat_lmr_free(lmr);
	BAD(dat_lmr_create, 5,
	    dat_lmr_create(ia_a, DAT_MEM_TYPE_VIRTUAL, region, BUF, A.req, all, &lmr, &lc, &rc, &rl, &ra),
	    HANDLE(DAT_INVALID_HANDLE_PZ));
	BAD(dat_lmr_create, 6,
	    dat_lmr_create(ia_a, DAT_MEM_TYPE_VIRTUAL, region, BUF, pz_a, 0x40000000, &lmr, &lc, &rc,
			   &rl, &ra),
	    ARG(6));
	BAD(dat_lmr_create, 7,
	    dat_lmr_create(ia_a, DAT_MEM_TYPE_VIRTUAL, region, BUF, pz_a, all, NULL, &lc, &rc, &rl, &ra),
	    ARG(7));
	for (unsigned a = 8; a <= 11; a++)
		NO_BAD_VALUE(dat_lmr_create, a, "optional output (NULL: not reported)");
	/* dat_lmr_query(lmr, lmr_param_mask, lmr_param) */
	DAT_LMR_PARAM lp;
	BAD(dat_lmr_query, 1, dat_lmr_query(pz_a, DAT_LMR_FIELD_ALL, &lp), HANDLE(DAT_INVALID_HANDLE_LMR));
	BAD(dat_lmr_query, 2, dat_lmr_query(lmr_a, BAD_MASK, &lp), ARG(2));
	BAD(dat_lmr_query, 3, dat_lmr_query(lmr_a, DAT_LMR_FIELD_ALL, NULL), ARG(3));
	BAD(dat_lmr_free, 1, dat_lmr_free(pz_a), HANDLE(DAT_INVALID_HANDLE_LMR));
	/* dat_lmr_sync_rdma_read / _write(ia, local_segments, num_segments) */
	DAT_LMR_TRIPLET l = seg(lc_a, abuf, 64);
	BAD(dat_lmr_sync_rdma_read, 1, dat_lmr_sync_rdma_read(pz_a, &l, 1), HANDLE(DAT_INVALID_HANDLE_IA));
	BAD(dat_lmr_sync_rdma_read, 2, dat_lmr_sync_rdma_read(ia_a, NULL, 1), ARG(2));
	BAD(dat_lmr_sync_rdma_read, 3, dat_lmr_sync_rdma_read(ia_a, &l, 0), ARG(3));
	BAD(dat_lmr_sync_rdma_write, 1, dat_lmr_sync_rdma_write(pz_a, &l, 1), HANDLE(DAT_INVALID_HANDLE_IA));
	BAD(dat_lmr_sync_rdma_write, 2, dat_lmr_sync_rdma_write(ia_a, NULL, 1), ARG(2));
	BAD(dat_lmr_sync_rdma_write, 3, dat_lmr_sync_rdma_write(ia_a, &l, 0), ARG(3));
	/* dat_rmr_create(pz, rmr_handle); dat_rmr_query(rmr, mask, param); dat_rmr_free(rmr) */
	DAT_RMR_HANDLE rmr;
	DAT_RMR_PARAM rp;
	BAD(dat_rmr_create, 1, dat_rmr_create(A.req, &rmr), HANDLE(DAT_INVALID_HANDLE_PZ));
	BAD(dat_rmr_create, 2, dat_rmr_create(pz_a, NULL), ARG(2));
	if (no_rmrs) {
		CHECK_TYPE(dat_rmr_create(pz_a, &rmr), DAT_INSUFFICIENT_RESOURCES);
		skip_no_rmrs("dat_rmr_query's rows after rmr_handle (they need a live RMR)");
	} else {
		CHECK_RC(dat_rmr_create(pz_a, &rmr), DAT_SUCCESS);
	}
	BAD(dat_rmr_query, 1, dat_rmr_query(pz_a, DAT_RMR_FIELD_ALL, &rp), HANDLE(DAT_INVALID_HANDLE_RMR));
	BAD_RMR(dat_rmr_query, 2, dat_rmr_query(rmr, BAD_MASK, &rp), ARG(2));
	BAD_RMR(dat_rmr_query, 3, dat_rmr_query(rmr, DAT_RMR_FIELD_ALL, NULL), ARG(3));
	BAD(dat_rmr_free, 1, dat_rmr_free(pz_a), HANDLE(DAT_INVALID_HANDLE_RMR));
	if (!no_rmrs)
		CHECK_RC(dat_rmr_free(rmr), DAT_SUCCESS);
	/* dat_pz_create(ia, pz_handle); dat_pz_query(pz, mask, param); dat_pz_free(pz) */
	DAT_PZ_HANDLE pz;
	DAT_PZ_PARAM pp;
	BAD(dat_pz_create, 1, dat_pz_create(pz_a, &pz), HANDLE(DAT_INVALID_HANDLE_IA));
	BAD(dat_pz_create, 2, dat_pz_create(ia_a, NULL), ARG(2));
	BAD(dat_pz_query, 1, dat_pz_query(A.req, DAT_PZ_FIELD_ALL, &pp), HANDLE(DAT_INVALID_HANDLE_PZ));
	NO_BAD_VALUE(dat_pz_query, 2, "fields outside DAT_PZ_FIELD_ALL are not filled");
	BAD(dat_pz_query, 3, dat_pz_query(pz_a, DAT_PZ_FIELD_ALL, NULL), ARG(3));
	BAD(dat_pz_free, 1, dat_pz_free(A.req), HANDLE(DAT_INVALID_HANDLE_PZ));
}

static void test_service_points(void)
{
	DAT_PSP_HANDLE psp;
	DAT_RSP_HANDLE rsp;
	DAT_CONN_QUAL q;
	/* dat_psp_create(ia, conn_qual, evd, psp_flags, psp_handle) */
	BAD(dat_psp_create, 1, dat_psp_create(pz_a, 41000, A.cr, DAT_PSP_CONSUMER_FLAG, &psp),
	    HANDLE(DAT_INVALID_HANDLE_IA));
	BAD(dat_psp_create, 2, dat_psp_create(ia_a, 0, A.cr, DAT_PSP_CONSUMER_FLAG, &psp), ARG(2));
	BAD(dat_psp_create, 3, dat_psp_create(ia_a, 41000, A.conn, DAT_PSP_CONSUMER_FLAG, &psp),
	    HANDLE(DAT_INVALID_HANDLE_EVD_CR));
	BAD(dat_psp_create, 4, dat_psp_create(ia_a, 41000, A.cr, (DAT_PSP_FLAGS)9, &psp), ARG(4));
	BAD(dat_psp_create, 5, dat_psp_create(ia_a, 41000, A.cr, DAT_PSP_CONSUMER_FLAG, NULL), ARG(5));
	/* dat_psp_create_any(ia, conn_qual out, evd, psp_flags, psp_handle) */
	BAD(dat_psp_create_any, 1, dat_psp_create_any(pz_a, &q, A.cr, DAT_PSP_CONSUMER_FLAG, &psp),
	    HANDLE(DAT_INVALID_HANDLE_IA));
	BAD(dat_psp_create_any, 2, dat_psp_create_any(ia_a, NULL, A.cr, DAT_PSP_CONSUMER_FLAG, &psp), ARG(2));
	BAD(dat_psp_create_any, 3, dat_psp_create_any(ia_a, &q, A.conn, DAT_PSP_CONSUMER_FLAG, &psp),
	    HANDLE(DAT_INVALID_HANDLE_EVD_CR));
	BAD(dat_psp_create_any, 4, dat_psp_create_any(ia_a, &q, A.cr, (DAT_PSP_FLAGS)9, &psp), ARG(4));
	BAD(dat_psp_create_any, 5, dat_psp_create_any(ia_a, &q, A.cr, DAT_PSP_CONSUMER_FLAG, NULL), ARG(5));
	CHECK_RC(dat_psp_create_any(ia_a, &q, A.cr, DAT_PSP_CONSUMER_FLAG, &psp), DAT_SUCCESS);
	/* dat_psp_query(psp, mask, param); dat_psp_free(psp) */
	DAT_PSP_PARAM pp;
	BAD(dat_psp_query, 1, dat_psp_query(pz_a, DAT_PSP_FIELD_ALL, &pp), HANDLE(DAT_INVALID_HANDLE_PSP));
	BAD(dat_psp_query, 2, dat_psp_query(psp, BAD_MASK, &pp), ARG(2));
	BAD(dat_psp_query, 3, dat_psp_query(psp, DAT_PSP_FIELD_ALL, NULL), ARG(3));
	BAD(dat_psp_free, 1, dat_psp_free(pz_a), HANDLE(DAT_INVALID_HANDLE_PSP));
	CHECK_RC(dat_psp_free(psp), DAT_SUCCESS);
	/* dat_rsp_create(ia, conn_qual, ep, evd, rsp_handle), on a fresh EP */
	DAT_EP_ATTR attr = ep_attr(0, 0, 64);
	DAT_EP_HANDLE ep = DAT_HANDLE_NULL;
	CHECK_RC(dat_ep_create(ia_a, pz_a, A.rcv, A.req, A.conn, &attr, &ep), DAT_SUCCESS);
	BAD(dat_rsp_create, 1, dat_rsp_create(pz_a, 41001, ep, A.cr, &rsp), HANDLE(DAT_INVALID_HANDLE_IA));
	BAD(dat_rsp_create, 2, dat_rsp_create(ia_a, 0, ep, A.cr, &rsp), ARG(2));
	BAD(dat_rsp_create, 3, dat_rsp_create(ia_a, 41001, pz_a, A.cr, &rsp), HANDLE(DAT_INVALID_HANDLE_EP));
	BAD(dat_rsp_create, 4, dat_rsp_create(ia_a, 41001, ep, A.conn, &rsp), HANDLE(DAT_INVALID_HANDLE_EVD_CR));
	BAD(dat_rsp_create, 5, dat_rsp_create(ia_a, 41001, ep, A.cr, NULL), ARG(5));
	CHECK_RC(dat_rsp_create(ia_a, 0, ep, A.cr, &rsp) == DAT_SUCCESS ? 1 : 0, 0);
	q = 0;
	DAT_PSP_HANDLE tmp;
	CHECK_RC(dat_psp_create_any(ia_a, &q, A.cr, DAT_PSP_CONSUMER_FLAG, &tmp), DAT_SUCCESS);
	CHECK_RC(dat_psp_free(tmp), DAT_SUCCESS);
	CHECK_RC(dat_rsp_create(ia_a, q, ep, A.cr, &rsp), DAT_SUCCESS);
	DAT_RSP_PARAM rp;
	BAD(dat_rsp_query, 1, dat_rsp_query(pz_a, DAT_RSP_FIELD_ALL, &rp), HANDLE(DAT_INVALID_HANDLE_RSP));
	BAD(dat_rsp_query, 2, dat_rsp_query(rsp, BAD_MASK, &rp), ARG(2));
	BAD(dat_rsp_query, 3, dat_rsp_query(rsp, DAT_RSP_FIELD_ALL, NULL), ARG(3));
	BAD(dat_rsp_free, 1, dat_rsp_free(pz_a), HANDLE(DAT_INVALID_HANDLE_RSP));
	CHECK_RC(dat_rsp_free(rsp), DAT_SUCCESS);
	CHECK_RC(dat_ep_free(ep), DAT_SUCCESS);
}

/* The IA, the generic handle calls and the registry's own exports. */
static void test_ia_registry(void)
{
	DAT_IA_ATTR ia_attr;
	DAT_PROVIDER_ATTR pa;
	DAT_EVD_HANDLE async;
	DAT_HANDLE_TYPE t;
	DAT_CONTEXT ctx;
	DAT_IA_HANDLE ia;
	/* dat_ia_query(ia, async_evd_handle, ia_attr_mask, ia_attr, provider_attr_mask, provider_attr) */
	BAD(dat_ia_query, 1, dat_ia_query(pz_a, &async, 0, NULL, 0, NULL), HANDLE(DAT_INVALID_HANDLE_IA));
	NO_BAD_VALUE(dat_ia_query, 2, "optional output (NULL: not reported)");
	NO_BAD_VALUE(dat_ia_query, 3, "a mask: the provider fills every field asked for and more");
	BAD(dat_ia_query, 4, dat_ia_query(ia_a, &async, DAT_IA_FIELD_ALL, NULL, 0, &pa), ARG(4));
	NO_BAD_VALUE(dat_ia_query, 5, "a mask: the provider fills every field asked for and more");
	BAD(dat_ia_query, 6, dat_ia_query(ia_a, &async, 0, &ia_attr, DAT_PROVIDER_FIELD_ALL, NULL), ARG(6));
	/* dat_ia_openv(name, async_evd_qlen, async_evd_handle, ia_handle, dapl_major, dapl_minor,
	 * thread_safety) */
	async = DAT_HANDLE_NULL;
	BAD(dat_ia_openv, 1, dat_ia_openv(NULL, 8, &async, &ia, DAT_VERSION_MAJOR, DAT_VERSION_MINOR, DAT_FALSE),
	    ARG(1));
	BAD(dat_ia_openv, 2, dat_ia_openv(dat_test_ia(), -1, &async, &ia, DAT_VERSION_MAJOR, DAT_VERSION_MINOR, DAT_FALSE),
	    ARG(2));
	BAD(dat_ia_openv, 3, dat_ia_openv(dat_test_ia(), 8, NULL, &ia, DAT_VERSION_MAJOR, DAT_VERSION_MINOR, DAT_FALSE),
	    ARG(3));
	async = pz_a;
	BAD(dat_ia_openv, 3, dat_ia_openv(dat_test_ia(), 8, &async, &ia, DAT_VERSION_MAJOR, DAT_VERSION_MINOR, DAT_FALSE),
	    HANDLE(DAT_INVALID_HANDLE_EVD_ASYNC));
	async = DAT_HANDLE_NULL;
	BAD(dat_ia_openv, 4, dat_ia_openv(dat_test_ia(), 8, &async, NULL, DAT_VERSION_MAJOR, DAT_VERSION_MINOR, DAT_FALSE),
	    ARG(4));
	BAD(dat_ia_openv, 5, dat_ia_openv(dat_test_ia(), 8, &async, &ia, 99, DAT_VERSION_MINOR, DAT_FALSE),
	    ERRCODE(DAT_PROVIDER_NOT_FOUND, DAT_MAJOR_NOT_FOUND));
	NO_BAD_VALUE(dat_ia_openv, 6, "any minor version of the major is served");
	NO_BAD_VALUE(dat_ia_openv, 7, "either thread safety (a threadsafe consumer may use either entry)");
	/* dat_ia_close(ia, close_flags) */
	BAD(dat_ia_close, 1, dat_ia_close(pz_a, DAT_CLOSE_ABRUPT_FLAG), HANDLE(DAT_INVALID_HANDLE_IA));
	BAD(dat_ia_close, 2, dat_ia_close(ia_b, (DAT_CLOSE_FLAGS)9), ARG(2));
	/* dat_get_handle_type / dat_get_consumer_context / dat_set_consumer_context(handle, ...) */
	BAD(dat_get_handle_type, 1, dat_get_handle_type(DAT_HANDLE_NULL, &t), HANDLE(DAT_INVALID_HANDLE1));
	BAD(dat_get_handle_type, 2, dat_get_handle_type(pz_a, NULL), ARG(2));
	BAD(dat_get_consumer_context, 1, dat_get_consumer_context(DAT_HANDLE_NULL, &ctx), HANDLE(DAT_INVALID_HANDLE1));
	BAD(dat_get_consumer_context, 2, dat_get_consumer_context(pz_a, NULL), ARG(2));
	ctx.as_64 = 0;
	BAD(dat_set_consumer_context, 1, dat_set_consumer_context(DAT_HANDLE_NULL, ctx), HANDLE(DAT_INVALID_HANDLE1));
	NO_BAD_VALUE(dat_set_consumer_context, 2, "the context is the consumer's");
	/* dat_registry_add_provider / _remove_provider(provider, provider_info) */
	DAT_PROVIDER prov;
	DAT_PROVIDER_INFO info;
	memset(&prov, 0, sizeof(prov));
	memset(&info, 0, sizeof(info));
	info.dapl_version_major = DAT_VERSION_MAJOR;
	BAD(dat_registry_add_provider, 1, dat_registry_add_provider(NULL, &info), ARG(1));
	BAD(dat_registry_add_provider, 2, dat_registry_add_provider(&prov, NULL), ARG(2));
	BAD(dat_registry_remove_provider, 1, dat_registry_remove_provider(NULL, &info), ARG(1));
	BAD(dat_registry_remove_provider, 2, dat_registry_remove_provider(&prov, NULL), ARG(2));
	/* dat_registry_list_providers(max_to_return, entries_returned, dat_provider_list) */
	DAT_COUNT n;
	BAD(dat_registry_list_providers, 1, dat_registry_list_providers(-1, &n, NULL), ARG(1));
	BAD(dat_registry_list_providers, 2, dat_registry_list_providers(0, NULL, NULL), ARG(2));
	BAD(dat_registry_list_providers, 3, dat_registry_list_providers(1, &n, NULL), ARG(3));
	/* dat_strerror(value, major_message, minor_message) */
	const char *major, *minor;
	BAD(dat_strerror, 1, dat_strerror(DAT_CLASS_ERROR | 0x3ffe0000u, &major, &minor), ARG(1));
	BAD(dat_strerror, 2, dat_strerror(0, NULL, &minor), ARG(2));
	BAD(dat_strerror, 3, dat_strerror(0, &major, NULL), ARG(3));
}

int main(void)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	alarm(100);
	catch_sigpipe();
	cover_table = EXPORTS;
	cover_len = sizeof(EXPORTS) / sizeof(EXPORTS[0]);
	DAT_EVD_HANDLE async_a = DAT_HANDLE_NULL, async_b = DAT_HANDLE_NULL;
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async_a, &ia_a), DAT_SUCCESS);
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async_b, &ia_b), DAT_SUCCESS);
	if (check_failed)
		return check_summary("test_arg_positions12");
	no_rmrs = ia_attr_of(ia_a).max_rmrs == 0;
	CHECK_RC(dat_pz_create(ia_a, &pz_a), DAT_SUCCESS);
	CHECK_RC(dat_pz_create(ia_b, &pz_b), DAT_SUCCESS);
	lmr_a = lmr_make(ia_a, pz_a, abuf, BUF, DAT_MEM_PRIV_ALL_FLAG, &lc_a, &rc_a);
	lmr_b = lmr_make(ia_b, pz_b, bbuf, BUF, DAT_MEM_PRIV_ALL_FLAG, &lc_b, &rc_b);
	side_evds(&A, ia_a, pz_a);
	side_evds(&B, ia_b, pz_b);
	DAT_EP_ATTR attr = ep_attr(0, 0, 64);
	side_ep(&A, &attr);
	side_ep(&B, &attr);
	if (!connect_pair(&A, &B))
		return check_summary("test_arg_positions12");

	test_posts();
	test_ep();
	test_cr();
	test_evd_cno();
	test_memory();
	test_service_points();
	test_ia_registry();
	cover_check("libdat.so.1");

	disconnect_pair(&A, &B);
	side_free_ep(&A);
	side_free_ep(&B);
	side_free_evds(&A);
	side_free_evds(&B);
	CHECK_RC(dat_lmr_free(lmr_a), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_b), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz_a), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz_b), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia_a, DAT_CLOSE_ABRUPT_FLAG), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia_b, DAT_CLOSE_ABRUPT_FLAG), DAT_SUCCESS);
	return check_summary("test_arg_positions12");
}
