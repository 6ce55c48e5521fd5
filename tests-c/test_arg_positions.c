/* Argument positions (issue 24 item 2): for DAT 2.0 calls of libdat2.so.2
 * served by our provider ($DAT_TEST_IA, default rs-tcp), a bad value in
 * each argument in turn, the others valid, must return exactly the code
 * that names that argument: DAT_INVALID_PARAMETER with DAT_INVALID_ARGn
 * (n the argument's position in the C prototype), or DAT_INVALID_HANDLE
 * with the handle's subtype. The provider states each call's argument list
 * once (src/provider-ffi/src/calls.rs); this table is the consumer's view.
 *
 * Arguments with no invalid value are listed in NO_BAD_VALUE below, not
 * swept: DTO and RMR cookies (opaque), timeouts, QoS, an EVD's CNO (NULL is
 * valid), the optional outputs of dat_ep_get_status / dat_ep_recv_query /
 * dat_lmr_create's contexts and lengths, consumer contexts.
 *
 * Regression: dat_ep_post_rdma_read_to_rmr reported a bad local RMR
 * triplet as DAT_INVALID_ARG3 and bad completion flags as DAT_INVALID_ARG6
 * (dat_ep_post_rdma_read's positions); dat_rmr_bind reported bad mem_priv,
 * va_type and completion flags one argument late (ARG5, ARG6, ARG9). */
#include <dat2/udat.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "dto_pair.h"

#define ARG(n) ERRCODE(DAT_INVALID_PARAMETER, DAT_INVALID_ARG##n)
#define HANDLE(sub) ERRCODE(DAT_INVALID_HANDLE, sub)
#define BAD_FLAGS ((DAT_COMPLETION_FLAGS)0x40000000)
#define BUF 4096

static const char *const NO_BAD_VALUE[] = {
	"user_cookie (every DTO and dat_rmr_bind): opaque to the provider",
	"timeout (dat_ep_connect, dat_evd_wait, dat_cno_wait): every value is a wait",
	"qos (dat_ep_connect, dat_ep_dup_connect): ignored by this transport",
	"cno_handle of dat_evd_create / dat_evd_modify_cno: NULL is valid",
	"ep_state, recv_idle, request_idle of dat_ep_get_status: optional outputs",
	"nbufs_allocated, bufs_alloc_span of dat_ep_recv_query: optional outputs",
	"lmr_context .. registered_address of dat_lmr_create: optional outputs",
	"context of dat_set_consumer_context: opaque",
	"invalidate_flag / rmr_context of dat_ep_post_send_with_invalidate: any value",
};

static DAT_IA_HANDLE ia_a, ia_b;
static DAT_PZ_HANDLE pz_a, pz_b;
static DAT_LMR_HANDLE lmr_a, lmr_b;
static DAT_LMR_CONTEXT lc_a, lc_b;
static DAT_RMR_CONTEXT rc_a, rc_b;
static struct side A, B;
static char abuf[BUF], bbuf[BUF];

static void test_dto(void)
{
	DAT_LMR_TRIPLET l = seg(lc_a, abuf, 64);
	DAT_RMR_TRIPLET r = rseg(rc_b, bbuf, 64);
	DAT_EP_HANDLE ep = A.ep;

	/* dat_ep_post_send(ep_handle, num_segments, local_iov, user_cookie, completion_flags) */
	CHECK_RC(dat_ep_post_send(DAT_HANDLE_NULL, 1, &l, ck(1), 0), HANDLE(DAT_INVALID_HANDLE_EP));
	CHECK_RC(dat_ep_post_send(pz_a, 1, &l, ck(1), 0), HANDLE(DAT_INVALID_HANDLE_EP));
	CHECK_RC(dat_ep_post_send(ep, -1, &l, ck(1), 0), ARG(2));
	CHECK_RC(dat_ep_post_send(ep, 1, NULL, ck(1), 0), ARG(3));
	CHECK_RC(dat_ep_post_send(ep, 1, &l, ck(1), BAD_FLAGS), ARG(5));

	/* dat_ep_post_send_with_invalidate(ep, num_segments, local_iov, cookie, flags, invalidate, rmr_context) */
	CHECK_RC(dat_ep_post_send_with_invalidate(pz_a, 1, &l, ck(1), 0, DAT_TRUE, 0),
		 HANDLE(DAT_INVALID_HANDLE_EP));
	CHECK_RC(dat_ep_post_send_with_invalidate(ep, -1, &l, ck(1), 0, DAT_TRUE, 0), ARG(2));
	CHECK_RC(dat_ep_post_send_with_invalidate(ep, 1, NULL, ck(1), 0, DAT_TRUE, 0), ARG(3));
	CHECK_RC(dat_ep_post_send_with_invalidate(ep, 1, &l, ck(1), BAD_FLAGS, DAT_TRUE, 0), ARG(5));
	CHECK_RC(dat_ep_post_send_with_invalidate(ep, -1, &l, ck(1), 0, DAT_FALSE, 0), ARG(2));
	CHECK_RC(dat_ep_post_send_with_invalidate(ep, 1, &l, ck(1), BAD_FLAGS, DAT_FALSE, 0), ARG(5));

	/* dat_ep_post_recv(ep_handle, num_segments, local_iov, user_cookie, completion_flags) */
	CHECK_RC(dat_ep_post_recv(pz_a, 1, &l, ck(1), 0), HANDLE(DAT_INVALID_HANDLE_EP));
	CHECK_RC(dat_ep_post_recv(ep, -1, &l, ck(1), 0), ARG(2));
	CHECK_RC(dat_ep_post_recv(ep, 1, NULL, ck(1), 0), ARG(3));
	CHECK_RC(dat_ep_post_recv(ep, 1, &l, ck(1), BAD_FLAGS), ARG(5));

	/* dat_ep_post_rdma_read / _write(ep, num_segments, local_iov, cookie, remote_iov, flags) */
	CHECK_RC(dat_ep_post_rdma_read(pz_a, 1, &l, ck(1), &r, 0), HANDLE(DAT_INVALID_HANDLE_EP));
	CHECK_RC(dat_ep_post_rdma_read(ep, -1, &l, ck(1), &r, 0), ARG(2));
	CHECK_RC(dat_ep_post_rdma_read(ep, 1, NULL, ck(1), &r, 0), ARG(3));
	CHECK_RC(dat_ep_post_rdma_read(ep, 1, &l, ck(1), NULL, 0), ARG(5));
	CHECK_RC(dat_ep_post_rdma_read(ep, 1, &l, ck(1), &r, BAD_FLAGS), ARG(6));
	CHECK_RC(dat_ep_post_rdma_write(pz_a, 1, &l, ck(1), &r, 0), HANDLE(DAT_INVALID_HANDLE_EP));
	CHECK_RC(dat_ep_post_rdma_write(ep, -1, &l, ck(1), &r, 0), ARG(2));
	CHECK_RC(dat_ep_post_rdma_write(ep, 1, NULL, ck(1), &r, 0), ARG(3));
	CHECK_RC(dat_ep_post_rdma_write(ep, 1, &l, ck(1), NULL, 0), ARG(5));
	CHECK_RC(dat_ep_post_rdma_write(ep, 1, &l, ck(1), &r, BAD_FLAGS), ARG(6));

	/* dat_ep_post_rdma_read_to_rmr(ep, local_iov (RMR triplet), cookie, remote_iov, flags):
	 * the local RMR is one of A's, bound over A's LMR with write access. */
	DAT_RMR_HANDLE rmr = DAT_HANDLE_NULL;
	DAT_RMR_CONTEXT ctx = 0;
	CHECK_RC(dat_rmr_create(pz_a, &rmr), DAT_SUCCESS);
	DAT_LMR_TRIPLET whole = seg(lc_a, abuf, BUF);
	CHECK_RC(dat_rmr_bind(rmr, lmr_a, &whole, DAT_MEM_PRIV_REMOTE_WRITE_FLAG | DAT_MEM_PRIV_REMOTE_READ_FLAG,
			      DAT_VA_TYPE_VA, ep, ck(9), 0, &ctx),
		 DAT_SUCCESS);
	expect_bind(A.req, rmr, 9, DAT_RMR_BIND_SUCCESS, "bind for _to_rmr");
	DAT_RMR_TRIPLET local = rseg(ctx, abuf, 64);
	DAT_RMR_TRIPLET outside = rseg(ctx, abuf + BUF - 8, 64);
	CHECK_RC(dat_ep_post_rdma_read_to_rmr(pz_a, &local, ck(1), &r, 0), HANDLE(DAT_INVALID_HANDLE_EP));
	CHECK_RC(dat_ep_post_rdma_read_to_rmr(ep, NULL, ck(1), &r, 0), ARG(2));
	CHECK_RC(dat_ep_post_rdma_read_to_rmr(ep, &outside, ck(1), &r, 0), ARG(2));
	CHECK_RC(dat_ep_post_rdma_read_to_rmr(ep, &local, ck(1), NULL, 0), ARG(4));
	CHECK_RC(dat_ep_post_rdma_read_to_rmr(ep, &local, ck(1), &r, BAD_FLAGS), ARG(5));

	/* dat_rmr_bind(rmr, lmr, lmr_triplet, mem_priv, va_type, ep, cookie, flags, rmr_context) */
	DAT_RMR_CONTEXT c2 = 0;
	DAT_MEM_PRIV_FLAGS rw = DAT_MEM_PRIV_REMOTE_READ_FLAG;
	CHECK_RC(dat_rmr_bind(pz_a, lmr_a, &whole, rw, DAT_VA_TYPE_VA, ep, ck(2), 0, &c2),
		 HANDLE(DAT_INVALID_HANDLE_RMR));
	CHECK_RC(dat_rmr_bind(rmr, pz_a, &whole, rw, DAT_VA_TYPE_VA, ep, ck(2), 0, &c2),
		 HANDLE(DAT_INVALID_HANDLE_LMR));
	CHECK_RC(dat_rmr_bind(rmr, lmr_a, NULL, rw, DAT_VA_TYPE_VA, ep, ck(2), 0, &c2), ARG(3));
	CHECK_RC(dat_rmr_bind(rmr, lmr_a, &whole, 0x40000000, DAT_VA_TYPE_VA, ep, ck(2), 0, &c2), ARG(4));
	CHECK_RC(dat_rmr_bind(rmr, lmr_a, &whole, rw, (DAT_VA_TYPE)7, ep, ck(2), 0, &c2), ARG(5));
	CHECK_RC(dat_rmr_bind(rmr, lmr_a, &whole, rw, DAT_VA_TYPE_VA, pz_a, ck(2), 0, &c2),
		 HANDLE(DAT_INVALID_HANDLE_EP));
	CHECK_RC(dat_rmr_bind(rmr, lmr_a, &whole, rw, DAT_VA_TYPE_VA, ep, ck(2), BAD_FLAGS, &c2), ARG(8));
	CHECK_RC(dat_rmr_bind(rmr, lmr_a, &whole, rw, DAT_VA_TYPE_VA, ep, ck(2), 0, NULL), ARG(9));
	CHECK_RC(dat_rmr_free(rmr), DAT_SUCCESS);
	drain(A.req);
}

static void test_ep(void)
{
	DAT_EP_ATTR attr = ep_attr(0, 0, 64);
	DAT_EP_ATTR huge = attr;
	huge.max_recv_dtos = 1 << 30;
	DAT_EP_HANDLE ep = DAT_HANDLE_NULL;
	DAT_SRQ_HANDLE srq = DAT_HANDLE_NULL;
	DAT_SRQ_ATTR sa = {.max_recv_dtos = 16, .max_recv_iov = 2, .low_watermark = 0};

	/* dat_ep_create(ia, pz, recv_evd, request_evd, connect_evd, ep_attributes, ep_handle) */
	CHECK_RC(dat_ep_create(ia_a, pz_a, A.rcv, A.req, A.conn, &huge, &ep), ARG(6));
	CHECK_RC(dat_ep_create(ia_a, pz_a, A.rcv, A.req, A.conn, &attr, NULL), ARG(7));
	CHECK_RC(dat_ep_create(ia_a, A.req, A.rcv, A.req, A.conn, &attr, &ep), HANDLE(DAT_INVALID_HANDLE_PZ));
	CHECK_RC(dat_ep_create(ia_a, pz_a, pz_a, A.req, A.conn, &attr, &ep), HANDLE(DAT_INVALID_HANDLE_EVD_RECV));
	CHECK_RC(dat_ep_create(ia_a, pz_a, A.rcv, pz_a, A.conn, &attr, &ep),
		 HANDLE(DAT_INVALID_HANDLE_EVD_REQUEST));
	CHECK_RC(dat_ep_create(ia_a, pz_a, A.rcv, A.req, pz_a, &attr, &ep), HANDLE(DAT_INVALID_HANDLE_EVD_CONN));
	/* dat_ep_create_with_srq(ia, pz, recv, request, connect, srq, ep_attributes, ep_handle) */
	CHECK_RC(dat_srq_create(ia_a, pz_a, &sa, &srq), DAT_SUCCESS);
	CHECK_RC(dat_ep_create_with_srq(ia_a, pz_a, A.rcv, A.req, A.conn, srq, &huge, &ep), ARG(7));
	CHECK_RC(dat_ep_create_with_srq(ia_a, pz_a, A.rcv, A.req, A.conn, srq, &attr, NULL), ARG(8));
	CHECK_RC(dat_ep_create_with_srq(ia_a, pz_a, A.rcv, A.req, A.conn, pz_a, &attr, &ep),
		 HANDLE(DAT_INVALID_HANDLE_SRQ));

	/* dat_srq_*(srq, ...) */
	DAT_LMR_TRIPLET l = seg(lc_a, abuf, 64);
	DAT_SRQ_PARAM sp;
	DAT_SRQ_HANDLE s2;
	CHECK_RC(dat_srq_create(ia_a, pz_a, NULL, &s2), ARG(3));
	CHECK_RC(dat_srq_create(ia_a, pz_a, &sa, NULL), ARG(4));
	CHECK_RC(dat_srq_post_recv(srq, -1, &l, ck(1)), ARG(2));
	CHECK_RC(dat_srq_post_recv(srq, 1, NULL, ck(1)), ARG(3));
	CHECK_RC(dat_srq_query(srq, 0xffffffffu, &sp), ARG(2));
	CHECK_RC(dat_srq_query(srq, DAT_SRQ_FIELD_ALL, NULL), ARG(3));
	CHECK_RC(dat_srq_resize(srq, 0), ARG(2));
	CHECK_RC(dat_srq_set_lw(srq, -1), ARG(2));
	CHECK_RC(dat_srq_free(srq), DAT_SUCCESS);

	/* An unconnected EP for the connect calls. */
	CHECK_RC(dat_ep_create(ia_a, pz_a, A.rcv, A.req, A.conn, &attr, &ep), DAT_SUCCESS);
	DAT_IA_ADDRESS_PTR peer = ia_address(ia_b);
	char pd[8] = {0};
	/* dat_ep_connect(ep, remote_ia_address, remote_conn_qual, timeout, pd_size, pd, qos, connect_flags) */
	CHECK_RC(dat_ep_connect(ep, NULL, 4000, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT, 0), ARG(2));
	CHECK_RC(dat_ep_connect(ep, peer, 0, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT, 0), ARG(3));
	CHECK_RC(dat_ep_connect(ep, peer, 4000, WAIT_US, -1, pd, DAT_QOS_BEST_EFFORT, 0), ARG(5));
	CHECK_RC(dat_ep_connect(ep, peer, 4000, WAIT_US, 4, NULL, DAT_QOS_BEST_EFFORT, 0), ARG(6));
	CHECK_RC(dat_ep_connect(ep, peer, 4000, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT, 7), ARG(8));
	/* dat_ep_common_connect(ep, remote_ia_address, timeout, pd_size, pd) */
	CHECK_RC(dat_ep_common_connect(ep, NULL, WAIT_US, 0, NULL), ARG(2));
	CHECK_RC(dat_ep_common_connect(ep, peer, WAIT_US, -1, pd), ARG(4));
	CHECK_RC(dat_ep_common_connect(ep, peer, WAIT_US, 4, NULL), ARG(5));
	/* dat_ep_dup_connect(ep, ep_dup_handle, timeout, pd_size, pd, qos) */
	CHECK_RC(dat_ep_dup_connect(ep, pz_a, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT), HANDLE(DAT_INVALID_HANDLE2));
	CHECK_RC(dat_ep_dup_connect(ep, A.ep, WAIT_US, -1, pd, DAT_QOS_BEST_EFFORT), ARG(4));
	CHECK_RC(dat_ep_dup_connect(ep, A.ep, WAIT_US, 4, NULL, DAT_QOS_BEST_EFFORT), ARG(5));
	/* dat_ep_disconnect(ep, close_flags) */
	CHECK_RC(dat_ep_disconnect(ep, 7), ARG(2));
	/* dat_ep_query / dat_ep_modify(ep, ep_param_mask, ep_param) */
	DAT_EP_PARAM p;
	memset(&p, 0, sizeof(p));
	CHECK_RC(dat_ep_query(ep, 0xffffffffu, &p), ARG(2));
	CHECK_RC(dat_ep_query(ep, DAT_EP_FIELD_ALL, NULL), ARG(3));
	CHECK_RC(dat_ep_modify(ep, DAT_EP_FIELD_IA_HANDLE, &p), ARG(2));
	CHECK_RC(dat_ep_modify(ep, DAT_EP_FIELD_EP_ATTR_ALL, NULL), ARG(3));
	p.ep_attr = huge;
	CHECK_RC(dat_ep_modify(ep, DAT_EP_FIELD_EP_ATTR_ALL, &p), ARG(3));
	/* dat_ep_set_watermark(ep, soft_high_watermark, hard_high_watermark) */
	CHECK_RC(dat_ep_set_watermark(ep, -5, 10), ARG(2));
	CHECK_RC(dat_ep_set_watermark(ep, 10, -5), ARG(3));
	CHECK_RC(dat_ep_free(ep), DAT_SUCCESS);
}

static void test_evd_cno(void)
{
	DAT_EVD_HANDLE evd = DAT_HANDLE_NULL;
	DAT_EVD_PARAM ep;
	DAT_EVENT ev;
	DAT_COUNT nmore;
	CHECK_RC(dat_evd_create(ia_a, 8, DAT_HANDLE_NULL, DAT_EVD_SOFTWARE_FLAG, &evd), DAT_SUCCESS);
	/* dat_evd_create(ia, evd_min_qlen, cno, evd_flags, evd_handle) */
	DAT_EVD_HANDLE e2;
	CHECK_RC(dat_evd_create(ia_a, 0, DAT_HANDLE_NULL, DAT_EVD_SOFTWARE_FLAG, &e2), ARG(2));
	CHECK_RC(dat_evd_create(ia_a, 8, pz_a, DAT_EVD_SOFTWARE_FLAG, &e2), HANDLE(DAT_INVALID_HANDLE_CNO));
	CHECK_RC(dat_evd_create(ia_a, 8, DAT_HANDLE_NULL, 0, &e2), ARG(4));
	CHECK_RC(dat_evd_create(ia_a, 8, DAT_HANDLE_NULL, DAT_EVD_SOFTWARE_FLAG, NULL), ARG(5));
	/* dat_evd_query(evd, evd_param_mask, evd_param) */
	CHECK_RC(dat_evd_query(evd, 0xffffffffu, &ep), ARG(2));
	CHECK_RC(dat_evd_query(evd, DAT_EVD_FIELD_ALL, NULL), ARG(3));
	/* dat_evd_wait(evd, timeout, threshold, event, nmore) */
	CHECK_RC(dat_evd_wait(evd, 0, 0, &ev, &nmore), ARG(3));
	CHECK_RC(dat_evd_wait(evd, 0, 1, NULL, &nmore), ARG(4));
	/* dat_evd_resize(evd, evd_qlen); dat_evd_post_se / dat_evd_dequeue(evd, event) */
	CHECK_RC(dat_evd_resize(evd, 0), ARG(2));
	CHECK_RC(dat_evd_post_se(evd, NULL), ARG(2));
	memset(&ev, 0, sizeof(ev));
	ev.event_number = DAT_DTO_COMPLETION_EVENT;
	CHECK_RC(dat_evd_post_se(evd, &ev), ARG(2));
	CHECK_RC(dat_evd_dequeue(evd, NULL), ARG(2));
	CHECK_RC(dat_evd_modify_cno(evd, pz_a), HANDLE(DAT_INVALID_HANDLE_CNO));

	/* dat_cno_*(...) */
	DAT_OS_WAIT_PROXY_AGENT agent = {NULL, NULL};
	DAT_CNO_HANDLE cno = DAT_HANDLE_NULL;
	DAT_CNO_PARAM cp;
	DAT_EVD_HANDLE who;
	DAT_FD fd;
	CHECK_RC(dat_cno_create(ia_a, agent, NULL), ARG(3));
	CHECK_RC(dat_cno_create(ia_a, agent, &cno), DAT_SUCCESS);
	CHECK_RC(dat_cno_query(cno, 0xffffffffu, &cp), ARG(2));
	CHECK_RC(dat_cno_query(cno, DAT_CNO_FIELD_ALL, NULL), ARG(3));
	CHECK_RC(dat_cno_wait(cno, 0, NULL), ARG(3));
	CHECK_RC(dat_cno_trigger(cno, NULL), ARG(2));
	CHECK_RC(dat_cno_free(cno), DAT_SUCCESS);
	CHECK_RC(dat_cno_fd_create(ia_a, NULL, &cno), ARG(2));
	CHECK_RC(dat_cno_fd_create(ia_a, &fd, NULL), ARG(3));
	(void)who;
	CHECK_RC(dat_evd_free(evd), DAT_SUCCESS);
}

static void test_memory(void)
{
	DAT_REGION_DESCRIPTION region;
	DAT_LMR_HANDLE lmr;
	DAT_LMR_CONTEXT lc;
	DAT_RMR_CONTEXT rc;
	DAT_VLEN rl;
	DAT_VADDR ra;
	region.for_va = abuf;
	/* dat_lmr_create(ia, mem_type, region, length, pz, privileges, va_type, lmr_handle, ...) */
	CHECK_RC(dat_lmr_create(ia_a, (DAT_MEM_TYPE)0x7777, region, BUF, pz_a, DAT_MEM_PRIV_ALL_FLAG, DAT_VA_TYPE_VA,
				&lmr, &lc, &rc, &rl, &ra),
		 ARG(2));
	region.for_va = NULL;
	CHECK_RC(dat_lmr_create(ia_a, DAT_MEM_TYPE_VIRTUAL, region, BUF, pz_a, DAT_MEM_PRIV_ALL_FLAG, DAT_VA_TYPE_VA,
				&lmr, &lc, &rc, &rl, &ra),
		 ARG(3));
	region.for_va = abuf;
	CHECK_RC(dat_lmr_create(ia_a, DAT_MEM_TYPE_VIRTUAL, region, (DAT_VLEN)1 << 62, pz_a, DAT_MEM_PRIV_ALL_FLAG,
				DAT_VA_TYPE_VA, &lmr, &lc, &rc, &rl, &ra),
		 ARG(4));
	CHECK_RC(dat_lmr_create(ia_a, DAT_MEM_TYPE_VIRTUAL, region, BUF, A.req, DAT_MEM_PRIV_ALL_FLAG, DAT_VA_TYPE_VA,
				&lmr, &lc, &rc, &rl, &ra),
		 HANDLE(DAT_INVALID_HANDLE_PZ));
	CHECK_RC(dat_lmr_create(ia_a, DAT_MEM_TYPE_VIRTUAL, region, BUF, pz_a, 0x40000000, DAT_VA_TYPE_VA, &lmr, &lc,
				&rc, &rl, &ra),
		 ARG(6));
	CHECK_RC(dat_lmr_create(ia_a, DAT_MEM_TYPE_VIRTUAL, region, BUF, pz_a, DAT_MEM_PRIV_ALL_FLAG, (DAT_VA_TYPE)7,
				&lmr, &lc, &rc, &rl, &ra),
		 ARG(7));
	CHECK_RC(dat_lmr_create(ia_a, DAT_MEM_TYPE_VIRTUAL, region, BUF, pz_a, DAT_MEM_PRIV_ALL_FLAG, DAT_VA_TYPE_VA,
				NULL, &lc, &rc, &rl, &ra),
		 ARG(8));
	/* dat_lmr_query(lmr, lmr_param_mask, lmr_param) */
	DAT_LMR_PARAM lp;
	CHECK_RC(dat_lmr_query(lmr_a, 0xffffffffu, &lp), ARG(2));
	CHECK_RC(dat_lmr_query(lmr_a, DAT_LMR_FIELD_ALL, NULL), ARG(3));
	/* dat_lmr_sync_rdma_read / _write(ia, local_segments, num_segments) */
	DAT_LMR_TRIPLET l = seg(lc_a, abuf, 64);
	CHECK_RC(dat_lmr_sync_rdma_read(ia_a, NULL, 1), ARG(2));
	CHECK_RC(dat_lmr_sync_rdma_read(ia_a, &l, 0), ARG(3));
	CHECK_RC(dat_lmr_sync_rdma_write(ia_a, NULL, 1), ARG(2));
	CHECK_RC(dat_lmr_sync_rdma_write(ia_a, &l, 0), ARG(3));
	/* dat_rmr_create(_for_ep)(pz, rmr_handle); dat_rmr_query(rmr, mask, param) */
	DAT_RMR_HANDLE rmr;
	DAT_RMR_PARAM rp;
	CHECK_RC(dat_rmr_create(pz_a, NULL), ARG(2));
	CHECK_RC(dat_rmr_create_for_ep(pz_a, NULL), ARG(2));
	CHECK_RC(dat_rmr_create(pz_a, &rmr), DAT_SUCCESS);
	CHECK_RC(dat_rmr_query(rmr, 0xffffffffu, &rp), ARG(2));
	CHECK_RC(dat_rmr_query(rmr, DAT_RMR_FIELD_ALL, NULL), ARG(3));
	CHECK_RC(dat_rmr_free(rmr), DAT_SUCCESS);
	/* dat_pz_create(ia, pz_handle); dat_pz_query(pz, mask, param) */
	CHECK_RC(dat_pz_create(ia_a, NULL), ARG(2));
	CHECK_RC(dat_pz_query(pz_a, DAT_PZ_FIELD_ALL, NULL), ARG(3));
}

static void test_service_points(void)
{
	DAT_PSP_HANDLE psp;
	DAT_RSP_HANDLE rsp;
	DAT_CSP_HANDLE csp;
	DAT_CONN_QUAL q;
	/* dat_psp_create(ia, conn_qual, evd, psp_flags, psp_handle) */
	CHECK_RC(dat_psp_create(ia_a, 0, A.cr, DAT_PSP_CONSUMER_FLAG, &psp), ARG(2));
	CHECK_RC(dat_psp_create(ia_a, 41000, A.conn, DAT_PSP_CONSUMER_FLAG, &psp),
		 HANDLE(DAT_INVALID_HANDLE_EVD_CR));
	CHECK_RC(dat_psp_create(ia_a, 41000, A.cr, (DAT_PSP_FLAGS)9, &psp), ARG(4));
	CHECK_RC(dat_psp_create(ia_a, 41000, A.cr, DAT_PSP_CONSUMER_FLAG, NULL), ARG(5));
	/* dat_psp_create_any(ia, conn_qual out, evd, psp_flags, psp_handle) */
	CHECK_RC(dat_psp_create_any(ia_a, NULL, A.cr, DAT_PSP_CONSUMER_FLAG, &psp), ARG(2));
	CHECK_RC(dat_psp_create_any(ia_a, &q, A.cr, (DAT_PSP_FLAGS)9, &psp), ARG(4));
	CHECK_RC(dat_psp_create_any(ia_a, &q, A.cr, DAT_PSP_CONSUMER_FLAG, NULL), ARG(5));
	CHECK_RC(dat_psp_create_any(ia_a, &q, A.cr, DAT_PSP_CONSUMER_FLAG, &psp), DAT_SUCCESS);
	DAT_PSP_PARAM pp;
	CHECK_RC(dat_psp_query(psp, 0xffffffffu, &pp), ARG(2));
	CHECK_RC(dat_psp_query(psp, DAT_PSP_FIELD_ALL, NULL), ARG(3));
	CHECK_RC(dat_psp_free(psp), DAT_SUCCESS);
	/* dat_rsp_create(ia, conn_qual, ep, evd, rsp_handle) */
	CHECK_RC(dat_rsp_create(ia_a, 0, A.ep, A.cr, &rsp), ARG(2));
	CHECK_RC(dat_rsp_create(ia_a, 41001, A.ep, A.cr, NULL), ARG(5));
	/* dat_csp_create(ia, comm, address, evd, csp_handle) */
	DAT_COMM comm = {AF_INET, SOCK_STREAM, 0};
	CHECK_RC(dat_csp_create(ia_a, NULL, ia_address(ia_a), A.cr, &csp), ARG(2));
	CHECK_RC(dat_csp_create(ia_a, &comm, NULL, A.cr, &csp), ARG(3));
	CHECK_RC(dat_csp_create(ia_a, &comm, ia_address(ia_a), A.cr, NULL), ARG(5));
}

static void test_ia(void)
{
	DAT_IA_ATTR ia_attr;
	DAT_PROVIDER_ATTR pa;
	DAT_EVD_HANDLE async;
	DAT_HANDLE_TYPE t;
	DAT_CONTEXT ctx;
	/* dat_ia_query(ia, async_evd_handle, ia_attr_mask, ia_attr, provider_attr_mask, provider_attr) */
	CHECK_RC(dat_ia_query(ia_a, &async, DAT_IA_FIELD_ALL, NULL, 0, &pa), ARG(4));
	CHECK_RC(dat_ia_query(ia_a, &async, 0, &ia_attr, DAT_PROVIDER_FIELD_ALL, NULL), ARG(6));
	/* dat_get_handle_type(handle, handle_type); dat_get_consumer_context(handle, context) */
	CHECK_RC(dat_get_handle_type(pz_a, NULL), ARG(2));
	CHECK_RC(dat_get_consumer_context(pz_a, NULL), ARG(2));
	(void)t;
	(void)ctx;
	/* dat_ia_close(ia, close_flags) */
	CHECK_RC(dat_ia_close(ia_b, (DAT_CLOSE_FLAGS)9), ARG(2));
}

int main(void)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	alarm(100);
	catch_sigpipe();
	(void)NO_BAD_VALUE;
	DAT_EVD_HANDLE async_a = DAT_HANDLE_NULL, async_b = DAT_HANDLE_NULL;
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async_a, &ia_a), DAT_SUCCESS);
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async_b, &ia_b), DAT_SUCCESS);
	if (check_failed)
		return check_summary("test_arg_positions");
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
		return check_summary("test_arg_positions");

	test_dto();
	test_ep();
	test_evd_cno();
	test_memory();
	test_service_points();
	test_ia();

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
	return check_summary("test_arg_positions");
}
