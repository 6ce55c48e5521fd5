/* DAT 2.0 operations beyond the 1.2 set, through our libdat2 and the IA
 * $DAT_TEST_IA (default rs-tcp): dat_ep_post_send_with_invalidate,
 * dat_ep_post_rdma_read_to_rmr and LMRs of DAT_MEM_TYPE_SHARED_VIRTUAL. Two
 * IAs in one process, as test_dto_rules; every wait has a timeout.
 *
 * - send with invalidate: the peer's receive completes as
 *   DAT_DTO_RECEIVE_WITH_INVALIDATE naming the RMR context, and that RMR
 *   grants nothing afterwards (an RDMA write through it fails with
 *   DAT_DTO_ERR_REMOTE_ACCESS); a context that names no bound RMR of the
 *   peer fails the peer's receive and ends the connection; invalidate_flag
 *   FALSE is a plain send.
 * - read to RMR: the sink is one of our RMRs; the data lands in the LMR it
 *   is bound into; a stale context or a range outside the binding is refused
 *   at once.
 * - shared virtual: registered like a virtual range, reported with its type
 *   and shared-memory id, usable as an RDMA target.
 * - a CNO made with dat_cno_fd_create: its fd turns readable when an event
 *   reaches an attached EVD, and dat_cno_trigger names that EVD; an RMR from
 *   dat_rmr_create_for_ep binds and grants access as any RMR.
 *
 * On an IA without RMRs (max_rmrs 0: an iWARP device without memory
 * windows, e.g. soft-iWARP) dat_rmr_create and dat_rmr_create_for_ep are
 * DAT_INSUFFICIENT_RESOURCES and every case that needs a bound RMR is
 * skipped, saying so; the plain send of dat_ep_post_send_with_invalidate and
 * the parameter checks of dat_ep_post_rdma_read_to_rmr still run.
 */
#define _GNU_SOURCE
#include <dat2/udat.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>
#include "check.h"
#include "dto_pair.h"

static DAT_IA_HANDLE ia_a, ia_b;
static DAT_PZ_HANDLE pz_a, pz_b;
static struct side A, B;

#define BUF 65536
static char abuf[BUF], bbuf[BUF];
static DAT_LMR_HANDLE lmr_a, lmr_b;
static DAT_LMR_CONTEXT lc_a, lc_b;
static DAT_RMR_CONTEXT rc_a, rc_b;
/* The IA has no RMRs (max_rmrs 0). */
static int no_rmrs;

static void new_pair(void)
{
	DAT_EP_ATTR at = ep_attr(0, 0, 64);
	side_ep(&A, &at);
	side_ep(&B, &at);
	connect_pair(&A, &B);
}

static void free_eps(void)
{
	side_free_ep(&A);
	side_free_ep(&B);
}

/* Binds `rmr` over [p, p+len) of an LMR through `s`'s EP; returns the context. */
static DAT_RMR_CONTEXT rmr_bind_now(struct side *s, DAT_RMR_HANDLE rmr, DAT_LMR_HANDLE lmr, DAT_LMR_CONTEXT lc, void *p,
			    DAT_VLEN len, DAT_MEM_PRIV_FLAGS priv, uint64_t cookie)
{
	DAT_LMR_TRIPLET t = seg(lc, p, len);
	DAT_RMR_CONTEXT ctx = 0;
	CHECK_RC(dat_rmr_bind(rmr, lmr, &t, priv, DAT_VA_TYPE_VA, s->ep, ck(cookie), 0, &ctx), DAT_SUCCESS);
	expect_bind(s->req, rmr, cookie, DAT_RMR_BIND_SUCCESS, "bind");
	return ctx;
}

static void test_send_with_invalidate(void)
{
	DAT_RMR_HANDLE rmr;
	DAT_EVENT ev;
	int tcp = ia_is_tcp(ia_a);
	if (no_rmrs) {
		/* Nothing to invalidate: the plain send alone (its context is not looked at). */
		printf("SKIP send with invalidate of an RMR context: %s has no RMRs (max_rmrs 0)\n", dat_test_ia());
		CHECK_TYPE(dat_rmr_create(pz_b, &rmr), DAT_INSUFFICIENT_RESOURCES);
		new_pair();
		memset(abuf, 'i', 64);
		DAT_LMR_TRIPLET l = seg(lc_a, abuf, 64);
		DAT_LMR_TRIPLET rcv = seg(lc_b, bbuf + 8192, 64);
		CHECK_RC(dat_ep_post_recv(B.ep, 1, &rcv, ck(0x12), 0), DAT_SUCCESS);
		CHECK_RC(dat_ep_post_send_with_invalidate(A.ep, 1, &l, ck(0x13), 0, DAT_FALSE, rc_b), DAT_SUCCESS);
		expect_dto(A.req, A.ep, 0x13, DAT_DTO_SUCCESS, 64, DAT_DTO_SEND, "send without invalidation");
		if (expect_dto(B.rcv, B.ep, 0x12, DAT_DTO_SUCCESS, 64, DAT_DTO_RECEIVE, "receive without invalidation"))
			CHECK(memcmp(bbuf + 8192, abuf, 64) == 0, "data of a send without invalidation");
		disconnect_pair(&A, &B);
		free_eps();
		return;
	}
	new_pair();
	CHECK_RC(dat_rmr_create(pz_b, &rmr), DAT_SUCCESS);
	DAT_RMR_CONTEXT ctx = rmr_bind_now(&B, rmr, lmr_b, lc_b, bbuf, 4096,
				   DAT_MEM_PRIV_REMOTE_READ_FLAG | DAT_MEM_PRIV_REMOTE_WRITE_FLAG, 0x10);
	/* the RMR grants write before */
	memset(abuf, 'i', 64);
	DAT_LMR_TRIPLET l = seg(lc_a, abuf, 64);
	DAT_RMR_TRIPLET r = rseg(ctx, bbuf, 64);
	CHECK_RC(dat_ep_post_rdma_write(A.ep, 1, &l, ck(0x11), &r, 0), DAT_SUCCESS);
	expect_dto(A.req, A.ep, 0x11, DAT_DTO_SUCCESS, 64, DAT_DTO_RDMA_WRITE, "write through the RMR");

	/* invalidate_flag FALSE: a plain send */
	DAT_LMR_TRIPLET rcv = seg(lc_b, bbuf + 8192, 64);
	CHECK_RC(dat_ep_post_recv(B.ep, 1, &rcv, ck(0x12), 0), DAT_SUCCESS);
	CHECK_RC(dat_ep_post_send_with_invalidate(A.ep, 1, &l, ck(0x13), 0, DAT_FALSE, ctx), DAT_SUCCESS);
	expect_dto(A.req, A.ep, 0x13, DAT_DTO_SUCCESS, 64, DAT_DTO_SEND, "send without invalidation");
	expect_dto(B.rcv, B.ep, 0x12, DAT_DTO_SUCCESS, 64, DAT_DTO_RECEIVE, "receive without invalidation");

	/* with invalidation */
	CHECK_RC(dat_ep_post_recv(B.ep, 1, &rcv, ck(0x14), 0), DAT_SUCCESS);
	CHECK_RC(dat_ep_post_send_with_invalidate(A.ep, 1, &l, ck(0x15), 0, DAT_TRUE, ctx), DAT_SUCCESS);
	expect_dto(A.req, A.ep, 0x15, DAT_DTO_SUCCESS, 64, DAT_DTO_SEND, "send with invalidate");
	if (wait_event(B.rcv, &ev) == DAT_SUCCESS) {
		const DAT_DTO_COMPLETION_EVENT_DATA *d = &ev.event_data.dto_completion_event_data;
		CHECK(ev.event_number == DAT_DTO_COMPLETION_EVENT && d->user_cookie.as_64 == 0x14 &&
			      d->status == DAT_DTO_SUCCESS && d->operation == DAT_DTO_RECEIVE_WITH_INVALIDATE &&
			      d->rmr_context == ctx && d->transfered_length == 64,
		      "receive with invalidate: event %#x cookie %#llx status %u op %u ctx %#x (want %#x) len %u",
		      ev.event_number, (unsigned long long)d->user_cookie.as_64, d->status, d->operation,
		      d->rmr_context, ctx, d->transfered_length);
	} else {
		CHECK(0, "no receive-with-invalidate completion");
	}
	/* the RMR no longer grants access: the write fails and the connection breaks */
	CHECK_RC(dat_ep_post_rdma_write(A.ep, 1, &l, ck(0x16), &r, 0), DAT_SUCCESS);
	expect_dto(A.req, A.ep, 0x16, stale_context_status(ia_a, "write after invalidation"), -1, DAT_DTO_RDMA_WRITE,
		   "write after invalidation");
	expect_conn_event(A.conn, A.ep, DAT_CONNECTION_EVENT_BROKEN, "broken after a write to an invalidated RMR");
	/* the invalidated RMR holds its LMR no longer: both can be freed */
	CHECK_RC(dat_rmr_free(rmr), DAT_SUCCESS);
	free_eps();

	/* a context that names no bound RMR of the peer (its LMR's own rmr_context) */
	new_pair();
	CHECK_RC(dat_ep_post_recv(B.ep, 1, &rcv, ck(0x17), 0), DAT_SUCCESS);
	CHECK_RC(dat_ep_post_send_with_invalidate(A.ep, 1, &l, ck(0x18), 0, DAT_TRUE, rc_b), DAT_SUCCESS);
	/* The target's receive fails and the connection ends. The sender's request fails too on
	 * rs-tcp; soft-RoCE acknowledges the send before the target checks the key, so there
	 * the sender sees success and then the peer's disconnect. */
	if (wait_event(A.req, &ev) == DAT_SUCCESS)
		CHECK(ev.event_data.dto_completion_event_data.user_cookie.as_64 == 0x18 &&
			      (!tcp || ev.event_data.dto_completion_event_data.status != DAT_DTO_SUCCESS),
		      "send invalidating a non-RMR context: status %u", ev.event_data.dto_completion_event_data.status);
	else
		CHECK(0, "no completion for a send invalidating a non-RMR context");
	if (wait_event(B.rcv, &ev) == DAT_SUCCESS)
		CHECK(ev.event_data.dto_completion_event_data.user_cookie.as_64 == 0x17 &&
			      ev.event_data.dto_completion_event_data.status != DAT_DTO_SUCCESS,
		      "receive of a bad invalidation: status %u", ev.event_data.dto_completion_event_data.status);
	else
		CHECK(0, "no receive completion for a bad invalidation");
	if (tcp) {
		expect_conn_event(A.conn, A.ep, DAT_CONNECTION_EVENT_BROKEN, "broken by a bad invalidation");
	} else if (wait_event(A.conn, &ev) == DAT_SUCCESS) {
		CHECK(ev.event_number == DAT_CONNECTION_EVENT_BROKEN ||
			      ev.event_number == DAT_CONNECTION_EVENT_DISCONNECTED,
		      "connection after a bad invalidation: event %#x", ev.event_number);
	} else {
		CHECK(0, "the connection survived a bad invalidation");
	}
	free_eps();
}

static void test_read_to_rmr(void)
{
	DAT_RMR_HANDLE rmr;
	new_pair();
	if (no_rmrs) {
		/* No RMR to read into: what is refused before one is looked at still is. */
		printf("SKIP read to RMR: %s has no RMRs (max_rmrs 0)\n", dat_test_ia());
		CHECK_TYPE(dat_rmr_create(pz_a, &rmr), DAT_INSUFFICIENT_RESOURCES);
		DAT_RMR_TRIPLET remote = rseg(rc_b, bbuf, 1024);
		DAT_RMR_TRIPLET stranger = rseg(rc_a, abuf, 64);
		CHECK_TYPE(dat_ep_post_rdma_read_to_rmr(A.ep, &stranger, ck(0x23), &remote, 0), DAT_PRIVILEGES_VIOLATION);
		CHECK_TYPE(dat_ep_post_rdma_read_to_rmr(A.ep, NULL, ck(0x24), &remote, 0), DAT_INVALID_PARAMETER);
		CHECK_TYPE(dat_ep_post_rdma_read_to_rmr(A.ep, &stranger, ck(0x25), NULL, 0), DAT_INVALID_PARAMETER);
		CHECK_TYPE(dat_ep_post_rdma_read_to_rmr(DAT_HANDLE_NULL, &stranger, ck(0x26), &remote, 0),
			   DAT_INVALID_HANDLE);
		expect_empty(A.req, "refused reads to an RMR");
		disconnect_pair(&A, &B);
		free_eps();
		return;
	}
	CHECK_RC(dat_rmr_create(pz_a, &rmr), DAT_SUCCESS);
	DAT_RMR_CONTEXT ctx = rmr_bind_now(&A, rmr, lmr_a, lc_a, abuf + 4096, 4096, DAT_MEM_PRIV_REMOTE_WRITE_FLAG, 0x20);
	for (int i = 0; i < 1024; i++)
		bbuf[i] = (char)(i * 7 + 1);
	memset(abuf + 4096, 0, 4096);
	DAT_RMR_TRIPLET local = rseg(ctx, abuf + 4096 + 512, 1024);
	DAT_RMR_TRIPLET remote = rseg(rc_b, bbuf, 1024);
	CHECK_RC(dat_ep_post_rdma_read_to_rmr(A.ep, &local, ck(0x21), &remote, 0), DAT_SUCCESS);
	if (expect_dto(A.req, A.ep, 0x21, DAT_DTO_SUCCESS, 1024, DAT_DTO_RDMA_READ, "read to RMR"))
		CHECK(memcmp(abuf + 4096 + 512, bbuf, 1024) == 0, "data read into the RMR's memory");

	/* refused at once: a range outside the binding, a context that is no RMR of ours, NULLs */
	DAT_RMR_TRIPLET outside = rseg(ctx, abuf + 4096 + 4000, 1024);
	CHECK_TYPE(dat_ep_post_rdma_read_to_rmr(A.ep, &outside, ck(0x22), &remote, 0), DAT_INVALID_PARAMETER);
	DAT_RMR_TRIPLET stranger = rseg(rc_a, abuf, 64);
	CHECK_TYPE(dat_ep_post_rdma_read_to_rmr(A.ep, &stranger, ck(0x23), &remote, 0), DAT_PRIVILEGES_VIOLATION);
	CHECK_TYPE(dat_ep_post_rdma_read_to_rmr(A.ep, NULL, ck(0x24), &remote, 0), DAT_INVALID_PARAMETER);
	CHECK_TYPE(dat_ep_post_rdma_read_to_rmr(A.ep, &local, ck(0x25), NULL, 0), DAT_INVALID_PARAMETER);
	CHECK_TYPE(dat_ep_post_rdma_read_to_rmr(DAT_HANDLE_NULL, &local, ck(0x26), &remote, 0), DAT_INVALID_HANDLE);
	expect_empty(A.req, "refused reads to an RMR");

	/* an RMR bound read-only is no sink */
	DAT_RMR_HANDLE ro;
	CHECK_RC(dat_rmr_create(pz_a, &ro), DAT_SUCCESS);
	DAT_RMR_CONTEXT rctx = rmr_bind_now(&A, ro, lmr_a, lc_a, abuf + 16384, 1024, DAT_MEM_PRIV_REMOTE_READ_FLAG, 0x27);
	DAT_RMR_TRIPLET rol = rseg(rctx, abuf + 16384, 64);
	CHECK_TYPE(dat_ep_post_rdma_read_to_rmr(A.ep, &rol, ck(0x28), &remote, 0), DAT_INVALID_PARAMETER);
	disconnect_pair(&A, &B);
	free_eps();
	CHECK_RC(dat_rmr_free(rmr), DAT_SUCCESS);
	CHECK_RC(dat_rmr_free(ro), DAT_SUCCESS);
}

static void test_shared_virtual(void)
{
	size_t len = 1 << 16;
	char *shm = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(shm != MAP_FAILED, "mmap");
	if (shm == MAP_FAILED)
		return;
	static char id[DAT_LMR_COOKIE_SIZE] = "udapl-rs test shared region";
	DAT_REGION_DESCRIPTION region;
	region.for_shared_memory.virtual_address = shm;
	region.for_shared_memory.shared_memory_id = &id;
	DAT_LMR_HANDLE lmr = DAT_HANDLE_NULL;
	DAT_LMR_CONTEXT lc = 0;
	DAT_RMR_CONTEXT rc = 0;
	DAT_VLEN rlen = 0;
	DAT_VADDR raddr = 0;
	CHECK_RC(dat_lmr_create(ia_b, DAT_MEM_TYPE_SHARED_VIRTUAL, region, len, pz_b, DAT_MEM_PRIV_ALL_FLAG,
				DAT_VA_TYPE_VA, &lmr, &lc, &rc, &rlen, &raddr),
		 DAT_SUCCESS);
	CHECK(rlen == len && raddr == (DAT_VADDR)(uintptr_t)shm, "shared LMR registered %llu at %#llx",
	      (unsigned long long)rlen, (unsigned long long)raddr);
	DAT_LMR_PARAM p;
	memset(&p, 0, sizeof(p));
	CHECK_RC(dat_lmr_query(lmr, DAT_LMR_FIELD_ALL, &p), DAT_SUCCESS);
	CHECK(p.mem_type == DAT_MEM_TYPE_SHARED_VIRTUAL &&
		      p.region_desc.for_shared_memory.virtual_address == shm &&
		      p.region_desc.for_shared_memory.shared_memory_id != NULL &&
		      memcmp(*p.region_desc.for_shared_memory.shared_memory_id, id, sizeof(id)) == 0,
	      "shared LMR query: type %u address %p", p.mem_type, p.region_desc.for_shared_memory.virtual_address);

	/* an RDMA target like any LMR */
	new_pair();
	memset(abuf, 's', 256);
	DAT_LMR_TRIPLET l = seg(lc_a, abuf, 256);
	DAT_RMR_TRIPLET r = rseg(rc, shm + 1000, 256);
	CHECK_RC(dat_ep_post_rdma_write(A.ep, 1, &l, ck(0x31), &r, 0), DAT_SUCCESS);
	if (expect_dto(A.req, A.ep, 0x31, DAT_DTO_SUCCESS, 256, DAT_DTO_RDMA_WRITE, "write to a shared LMR"))
		CHECK(memcmp(shm + 1000, abuf, 256) == 0, "data in the shared region");
	disconnect_pair(&A, &B);
	free_eps();
	CHECK_RC(dat_lmr_free(lmr), DAT_SUCCESS);

	/* no id */
	region.for_shared_memory.shared_memory_id = NULL;
	CHECK_TYPE(dat_lmr_create(ia_b, DAT_MEM_TYPE_SHARED_VIRTUAL, region, len, pz_b, DAT_MEM_PRIV_ALL_FLAG,
				  DAT_VA_TYPE_VA, &lmr, &lc, &rc, &rlen, &raddr),
		   DAT_INVALID_PARAMETER);
	munmap(shm, len);
}

/* dat_cno_fd_create / dat_cno_trigger: a CNO whose file descriptor becomes readable when an
 * event reaches an EVD attached to it, and which names that EVD. */
static void test_cno_fd(void)
{
	DAT_FD fd = -1;
	DAT_CNO_HANDLE cno = DAT_HANDLE_NULL;
	DAT_EVD_HANDLE evd = DAT_HANDLE_NULL, trig = DAT_HANDLE_NULL;
	DAT_RETURN rc;
	CHECK_RC(dat_cno_fd_create(ia_a, &fd, &cno), DAT_SUCCESS);
	CHECK(fd >= 0, "dat_cno_fd_create gave fd %d", fd);
	CHECK_RC(dat_evd_create(ia_a, 8, cno, DAT_EVD_SOFTWARE_FLAG, &evd), DAT_SUCCESS);
	struct pollfd p = { .fd = fd, .events = POLLIN };
	CHECK(poll(&p, 1, 0) == 0, "CNO fd readable before any event");
	rc = dat_cno_trigger(cno, &trig);
	CHECK(DAT_GET_TYPE(rc) == DAT_QUEUE_EMPTY, "dat_cno_trigger before any event = %#x", (unsigned)rc);
	DAT_EVENT ev;
	memset(&ev, 0, sizeof(ev));
	ev.event_number = DAT_SOFTWARE_EVENT;
	ev.event_data.software_event_data.pointer = &ev;
	CHECK_RC(dat_evd_post_se(evd, &ev), DAT_SUCCESS);
	CHECK(poll(&p, 1, WAIT_US / 1000) == 1 && (p.revents & POLLIN), "CNO fd not readable after an event");
	CHECK_RC(dat_cno_trigger(cno, &trig), DAT_SUCCESS);
	CHECK(trig == evd, "dat_cno_trigger named EVD %p, want %p", (void *)trig, (void *)evd);
	CHECK_TYPE(dat_cno_trigger(cno, NULL), DAT_INVALID_PARAMETER);
	CHECK_TYPE(dat_cno_trigger(DAT_HANDLE_NULL, &trig), DAT_INVALID_HANDLE);
	CHECK_TYPE(dat_cno_fd_create(ia_a, NULL, &cno), DAT_INVALID_PARAMETER);
	drain(evd);
	CHECK_RC(dat_evd_free(evd), DAT_SUCCESS);
	CHECK_RC(dat_cno_free(cno), DAT_SUCCESS);
}

/* dat_rmr_create_for_ep: an RMR for binding through an EP, used as any RMR. */
static void test_rmr_for_ep(void)
{
	DAT_RMR_HANDLE rmr = DAT_HANDLE_NULL;
	if (no_rmrs) {
		printf("SKIP RMR for EP: %s has no RMRs (max_rmrs 0)\n", dat_test_ia());
		CHECK_TYPE(dat_rmr_create_for_ep(pz_b, &rmr), DAT_INSUFFICIENT_RESOURCES);
		CHECK_TYPE(dat_rmr_create_for_ep(DAT_HANDLE_NULL, &rmr), DAT_INVALID_HANDLE);
		return;
	}
	new_pair();
	CHECK_RC(dat_rmr_create_for_ep(pz_b, &rmr), DAT_SUCCESS);
	DAT_RMR_CONTEXT ctx = rmr_bind_now(&B, rmr, lmr_b, lc_b, bbuf + 512, 256,
					   DAT_MEM_PRIV_REMOTE_READ_FLAG, 0x40);
	memset(bbuf + 512, 'e', 256);
	DAT_LMR_TRIPLET l = seg(lc_a, abuf, 256);
	DAT_RMR_TRIPLET r = rseg(ctx, bbuf + 512, 256);
	CHECK_RC(dat_ep_post_rdma_read(A.ep, 1, &l, ck(0x41), &r, 0), DAT_SUCCESS);
	if (expect_dto(A.req, A.ep, 0x41, DAT_DTO_SUCCESS, 256, DAT_DTO_RDMA_READ, "read through an RMR for EP"))
		CHECK(memcmp(abuf, bbuf + 512, 256) == 0, "data read through an RMR for EP");
	CHECK_TYPE(dat_rmr_create_for_ep(DAT_HANDLE_NULL, &rmr), DAT_INVALID_HANDLE);
	disconnect_pair(&A, &B);
	free_eps();
	CHECK_RC(dat_rmr_free(rmr), DAT_SUCCESS);
}

int main(void)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	alarm(100);
	catch_sigpipe();
	DAT_EVD_HANDLE async_a = DAT_HANDLE_NULL, async_b = DAT_HANDLE_NULL;
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async_a, &ia_a), DAT_SUCCESS);
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async_b, &ia_b), DAT_SUCCESS);
	if (check_failed)
		return check_summary("test_dat2_ops");
	CHECK_RC(dat_pz_create(ia_a, &pz_a), DAT_SUCCESS);
	CHECK_RC(dat_pz_create(ia_b, &pz_b), DAT_SUCCESS);
	lmr_a = lmr_make(ia_a, pz_a, abuf, BUF, DAT_MEM_PRIV_ALL_FLAG, &lc_a, &rc_a);
	lmr_b = lmr_make(ia_b, pz_b, bbuf, BUF, DAT_MEM_PRIV_ALL_FLAG, &lc_b, &rc_b);
	side_evds(&A, ia_a, pz_a);
	side_evds(&B, ia_b, pz_b);
	if (check_failed)
		return check_summary("test_dat2_ops");
	no_rmrs = ia_attr_of(ia_a).max_rmrs == 0;

	test_send_with_invalidate();
	test_read_to_rmr();
	test_shared_virtual();
	test_cno_fd();
	test_rmr_for_ep();

	side_free_evds(&A);
	side_free_evds(&B);
	CHECK_RC(dat_lmr_free(lmr_a), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_b), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz_a), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz_b), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia_a, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia_b, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	check_no_sigpipe();
	return check_summary("test_dat2_ops");
}
