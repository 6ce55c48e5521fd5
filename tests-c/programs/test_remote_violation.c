/* Remote access is enforced by the target, as an RDMA NIC would (issue 4):
 * an RDMA write or read with a bad rmr_context, outside the RMR's range,
 * lacking the privilege, or naming memory of another PZ than the target EP's
 * completes the initiator's DTO with DAT_DTO_ERR_REMOTE_ACCESS (also when
 * its success would be suppressed), breaks the connection
 * (DAT_CONNECTION_EVENT_BROKEN on both sides' connect EVDs), flushes every
 * other posted operation of both sides exactly once with
 * DAT_DTO_ERR_FLUSHED, executes nothing posted after the violation, and
 * leaves the target's memory (and for reads the initiator's buffer)
 * untouched. Another connection between the same two IAs keeps working.
 * Two IAs in one process of the IA $DAT_TEST_IA (default rs-tcp, on
 * 127.0.0.1); every wait has a timeout. */
#include <dat2/udat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "dto_pair.h"

static DAT_IA_HANDLE ia_a, ia_b;
static DAT_PZ_HANDLE pz_a, pz_b, pz_b2;
static struct side A, B, A2, B2; /* A2-B2: the bystander connection */

#define BUF 65536
static char abuf[BUF], bbuf[BUF], b2buf[BUF], blbuf[BUF];
static DAT_LMR_HANDLE lmr_a, lmr_b, lmr_b2, lmr_bl;
static DAT_LMR_CONTEXT lc_a, lc_b, lc_b2, lc_bl;
static DAT_RMR_CONTEXT rc_b, rc_b2, rc_bl;

/* The RMR window: 256 bytes at bbuf + 1024. */
#define WIN_OFF 1024
#define WIN_LEN 256

enum kind {
	WRITE_BAD_CONTEXT,
	WRITE_PAST_END,
	WRITE_BEFORE_START,
	WRITE_NO_PRIVILEGE,  /* RMR bound remote read only */
	WRITE_OTHER_PZ,      /* an LMR context of the target IA, but of another PZ than the EP's */
	WRITE_LMR_NO_REMOTE, /* an LMR context whose LMR grants no remote access */
	READ_BAD_CONTEXT,
	READ_PAST_END,
	READ_NO_PRIVILEGE, /* RMR bound remote write only */
	READ_OTHER_PZ,
	READ_LMR_NO_REMOTE,
	KINDS
};

static const char *kind_name[KINDS] = {
	"write, bad rmr_context",   "write past the RMR's end", "write before the RMR's start",
	"write to a read-only RMR", "write to another PZ",      "write to an LMR without remote access",
	"read, bad rmr_context",    "read past the RMR's end",  "read of a write-only RMR",
	"read from another PZ",     "read of an LMR without remote access",
};

static int all_are(const char *p, int c, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)p[i] != (unsigned char)c)
			return 0;
	return 1;
}

static int is_read(enum kind k)
{
	return k >= READ_BAD_CONTEXT;
}

/* The bystander connection still carries a send. */
static void bystander_works(const char *after)
{
	static uint64_t n;
	DAT_LMR_TRIPLET s = seg(lc_a, abuf + 60000, 8), r = seg(lc_b, bbuf + 60000, 8);
	n++;
	memcpy(abuf + 60000, "bystandr", 8);
	memset(bbuf + 60000, 0, 8);
	CHECK_RC(dat_ep_post_recv(B2.ep, 1, &r, ck(0xf000 + n), 0), DAT_SUCCESS);
	CHECK_RC(dat_ep_post_send(A2.ep, 1, &s, ck(0xe000 + n), 0), DAT_SUCCESS);
	CHECK(expect_dto(A2.req, A2.ep, 0xe000 + n, DAT_DTO_SUCCESS, 8, DAT_DTO_SEND, "bystander send") &&
		      expect_dto(B2.rcv, B2.ep, 0xf000 + n, DAT_DTO_SUCCESS, 8, DAT_DTO_RECEIVE, "bystander receive") &&
		      memcmp(bbuf + 60000, "bystandr", 8) == 0,
	      "the other connection no longer works after: %s", after);
}

/* Dequeues the marker just flushed on a DISCONNECTED EP: it must be the very
 * next event (nothing flushed twice before it) and the last. */
static void marker(struct side *s, int recv, uint64_t cookie, const char *what)
{
	DAT_LMR_TRIPLET t = seg(s == &A ? lc_a : lc_b, s == &A ? abuf + 50000 : bbuf + 50000, 8);
	if (recv) {
		CHECK_RC(dat_ep_post_recv(s->ep, 1, &t, ck(cookie), 0), DAT_SUCCESS);
		expect_dto_now(s->rcv, s->ep, cookie, DAT_DTO_ERR_FLUSHED, DAT_DTO_RECEIVE, what);
		expect_empty(s->rcv, what);
	} else {
		CHECK_RC(dat_ep_post_send(s->ep, 1, &t, ck(cookie), 0), DAT_SUCCESS);
		expect_dto_now(s->req, s->ep, cookie, DAT_DTO_ERR_FLUSHED, DAT_DTO_SEND, what);
		expect_empty(s->req, what);
	}
}

/* The IA is a soft-RoCE device (rxe), which does not check a window's own bounds. */
static int window_bounds_unchecked;
/* The IA has no RMRs (max_rmrs 0: soft-iWARP has no memory windows). */
static int no_rmrs;

/* The remote triplet violation `k` names, through the window's context `ctx`, and in
 * `*target` the memory it aims at (the window's start unless the kind says otherwise). */
static DAT_RMR_TRIPLET aim(enum kind k, DAT_RMR_CONTEXT ctx, char **target)
{
	switch (k) {
	case WRITE_BAD_CONTEXT:
	case READ_BAD_CONTEXT:
		return rseg(ctx ^ 0x7f7f7f00u, *target, 16);
	case WRITE_PAST_END:
	case READ_PAST_END:
		*target = bbuf + WIN_OFF + WIN_LEN - 8;
		return rseg(ctx, *target, 16);
	case WRITE_BEFORE_START:
		*target = bbuf + WIN_OFF - 8;
		return rseg(ctx, *target, 16);
	case WRITE_OTHER_PZ:
	case READ_OTHER_PZ:
		*target = b2buf + 64;
		return rseg(rc_b2, *target, 16);
	case WRITE_LMR_NO_REMOTE:
	case READ_LMR_NO_REMOTE:
		*target = blbuf + 64;
		return rseg(rc_bl, *target, 16);
	default:
		return rseg(ctx, *target, 16);
	}
}

static void violation(enum kind k, int suppress)
{
	const char *name = kind_name[k];
	DAT_RMR_HANDLE rmr;
	DAT_RMR_CONTEXT ctx = 0;
	DAT_MEM_PRIV_FLAGS priv = DAT_MEM_PRIV_REMOTE_READ_FLAG | DAT_MEM_PRIV_REMOTE_WRITE_FLAG;
	DAT_LMR_TRIPLET t, l, r;
	DAT_RMR_TRIPLET rem, good;
	char *target = bbuf + WIN_OFF; /* the memory the violation aims at */
	DAT_EP_ATTR attr = ep_attr(0, 0, 64);

	printf("-- %s%s\n", name, suppress ? " (success suppressed)" : "");
	side_ep(&A, &attr);
	side_ep(&B, &attr);
	if (!connect_pair(&A, &B)) {
		side_free_ep(&A);
		side_free_ep(&B);
		return;
	}
	if (k == WRITE_NO_PRIVILEGE)
		priv = DAT_MEM_PRIV_REMOTE_READ_FLAG;
	if (k == READ_NO_PRIVILEGE)
		priv = DAT_MEM_PRIV_REMOTE_WRITE_FLAG;
	/* Without RMRs (soft-iWARP) the window is an LMR of its own over the same
	 * memory, granting what the window would: its rmr_context is the target. */
	if (no_rmrs) {
		printf("-- (no RMRs on %s: the window is an LMR of its own)\n", dat_test_ia());
		rmr = DAT_HANDLE_NULL;
	} else {
		CHECK_RC(dat_rmr_create(pz_b, &rmr), DAT_SUCCESS);
	}
	/* Soft-RoCE checks an access against the window's memory region but not against the
	 * window's own bounds (real NICs check both): there the bounds cases bind a window that
	 * fills an LMR of its own, so past its end or before its start is outside the region
	 * too. Everywhere else the window lies inside the larger LMR, as applications bind it. */
	DAT_LMR_HANDLE lmr_win = lmr_b;
	DAT_LMR_CONTEXT lc_win = lc_b;
	int own_lmr = no_rmrs || (window_bounds_unchecked &&
				  (k == WRITE_PAST_END || k == READ_PAST_END || k == WRITE_BEFORE_START));
	if (no_rmrs) {
		DAT_MEM_PRIV_FLAGS lpriv = priv | DAT_MEM_PRIV_LOCAL_READ_FLAG;
		if (priv & DAT_MEM_PRIV_REMOTE_WRITE_FLAG)
			lpriv |= DAT_MEM_PRIV_LOCAL_WRITE_FLAG;
		lmr_win = lmr_make(ia_b, pz_b, bbuf + WIN_OFF, WIN_LEN, lpriv, &lc_win, &ctx);
	} else if (own_lmr) {
		printf("-- (soft-RoCE: the window fills an LMR of its own, see above)\n");
		lmr_win = lmr_make(ia_b, pz_b, bbuf + WIN_OFF, WIN_LEN, DAT_MEM_PRIV_ALL_FLAG, &lc_win, NULL);
	}
	if (!no_rmrs) {
		t = seg(lc_win, bbuf + WIN_OFF, WIN_LEN);
		CHECK_RC(dat_rmr_bind(rmr, lmr_win, &t, priv, DAT_VA_TYPE_VA, B.ep, ck(0x10), 0, &ctx), DAT_SUCCESS);
		expect_bind(B.req, rmr, 0x10, DAT_RMR_BIND_SUCCESS, "bind of the window");
	}

	rem = aim(k, ctx, &target);

	/* the memory both sides must find untouched */
	memset(bbuf, 0x33, 8192);
	memset(b2buf, 0x33, 4096);
	memset(blbuf, 0x33, 4096);
	memset(abuf, 0x44, 8192);
	memcpy(abuf, "violation-data!!", 16);
	memcpy(abuf + 4096, "later-write-data", 16);

	/* receives on both sides, to be flushed */
	for (int i = 0; i < 3; i++) {
		r = seg(lc_b, bbuf + 4096 + 64 * i, 64);
		CHECK_RC(dat_ep_post_recv(B.ep, 1, &r, ck(0xb00 + i), 0), DAT_SUCCESS);
	}
	for (int i = 0; i < 2; i++) {
		r = seg(lc_a, abuf + 5000 + 64 * i, 64);
		CHECK_RC(dat_ep_post_recv(A.ep, 1, &r, ck(0xa00 + i), 0), DAT_SUCCESS);
	}

	/* the violation, then requests that must never execute */
	DAT_COMPLETION_FLAGS f = suppress ? DAT_COMPLETION_SUPPRESS_FLAG : 0;
	if (is_read(k)) {
		l = seg(lc_a, abuf + 2048, 16);
		CHECK_RC(dat_ep_post_rdma_read(A.ep, 1, &l, ck(0x1), &rem, f), DAT_SUCCESS);
	} else {
		l = seg(lc_a, abuf, 16);
		CHECK_RC(dat_ep_post_rdma_write(A.ep, 1, &l, ck(0x1), &rem, f), DAT_SUCCESS);
	}
	good = rseg(rc_b, bbuf + 6000, 16);
	l = seg(lc_a, abuf + 4096, 16);
	CHECK_RC(dat_ep_post_send(A.ep, 1, &l, ck(0x2), 0), DAT_SUCCESS);
	CHECK_RC(dat_ep_post_rdma_write(A.ep, 1, &l, ck(0x3), &good, 0), DAT_SUCCESS);
	l = seg(lc_a, abuf + 3000, 16);
	CHECK_RC(dat_ep_post_rdma_read(A.ep, 1, &l, ck(0x4), &good, 0), DAT_SUCCESS);
	CHECK_RC(dat_ep_post_send(A.ep, 1, &l, ck(0x5), DAT_COMPLETION_SUPPRESS_FLAG), DAT_SUCCESS);

	/* the initiator: REMOTE_ACCESS for the violation, the rest flushed, in order */
	expect_dto(A.req, A.ep, 0x1, DAT_DTO_ERR_REMOTE_ACCESS, -1, is_read(k) ? DAT_DTO_RDMA_READ : DAT_DTO_RDMA_WRITE,
		   name);
	expect_dto(A.req, A.ep, 0x2, DAT_DTO_ERR_FLUSHED, -1, DAT_DTO_SEND, "send after the violation");
	expect_dto(A.req, A.ep, 0x3, DAT_DTO_ERR_FLUSHED, -1, DAT_DTO_RDMA_WRITE, "write after the violation");
	expect_dto(A.req, A.ep, 0x4, DAT_DTO_ERR_FLUSHED, -1, DAT_DTO_RDMA_READ, "read after the violation");
	expect_dto(A.req, A.ep, 0x5, DAT_DTO_ERR_FLUSHED, -1, DAT_DTO_SEND, "suppressed send after the violation");
	for (int i = 0; i < 2; i++)
		expect_dto(A.rcv, A.ep, 0xa00 + i, DAT_DTO_ERR_FLUSHED, -1, DAT_DTO_RECEIVE, "initiator's receive");
	expect_conn_event(A.conn, A.ep, DAT_CONNECTION_EVENT_BROKEN, "initiator's connect EVD");
	/* the target: BROKEN, its receives flushed */
	expect_conn_event(B.conn, B.ep, DAT_CONNECTION_EVENT_BROKEN, "target's connect EVD");
	for (int i = 0; i < 3; i++)
		expect_dto(B.rcv, B.ep, 0xb00 + i, DAT_DTO_ERR_FLUSHED, -1, DAT_DTO_RECEIVE, "target's receive");
	CHECK(ep_state(A.ep) == DAT_EP_STATE_DISCONNECTED, "%s: initiator EP state %u", name, ep_state(A.ep));
	CHECK(ep_state(B.ep) == DAT_EP_STATE_DISCONNECTED, "%s: target EP state %u", name, ep_state(B.ep));

	/* exactly once: a marker flushed now is the next and last event of each EVD */
	marker(&A, 0, 0xc01, "initiator's request EVD after the flushes");
	marker(&A, 1, 0xc02, "initiator's receive EVD after the flushes");
	marker(&B, 0, 0xc03, "target's request EVD after the flushes");
	marker(&B, 1, 0xc04, "target's receive EVD after the flushes");
	expect_empty(A.conn, "one connection event (initiator)");
	expect_empty(B.conn, "one connection event (target)");

	/* memory: nothing of the violation nor of what followed it */
	CHECK(all_are(bbuf, 0x33, 8192), "%s: the target's memory changed", name);
	CHECK(all_are(b2buf, 0x33, 4096) && all_are(blbuf, 0x33, 4096), "%s: the target's other memory changed",
	      name);
	CHECK(all_are(abuf + 2048, 0x44, 16) && all_are(abuf + 3000, 0x44, 16) && all_are(abuf + 5000, 0x44, 128),
	      "%s: the initiator's buffers changed", name);

	side_free_ep(&A);
	side_free_ep(&B);
	if (!no_rmrs)
		CHECK_RC(dat_rmr_free(rmr), DAT_SUCCESS);
	if (own_lmr)
		CHECK_RC(dat_lmr_free(lmr_win), DAT_SUCCESS);
	bystander_works(name);
}

/* A violation on iWARP (siw): what a NIC there must still do. iWARP acknowledges no RDMA
 * write, so the initiator's write may complete as sent (SUCCESS), and a read the target
 * refused may complete FLUSHED (the target's TERMINATE ends the connection first) rather than
 * REMOTE_ACCESS; what follows the violation may have executed (RFC 5040), so only the
 * violation is posted. What must hold: a read does not succeed and brings nothing back, the
 * target's memory stays as it was, and the connection ends on both sides. A region the
 * device cannot restrict as asked (siw lets a peer read whatever it may write) is refused
 * when created (DAT_MODEL_NOT_SUPPORTED): no peer gets more than the consumer asked. */
static void violation_iwarp(enum kind k)
{
	const char *name = kind_name[k];
	DAT_MEM_PRIV_FLAGS priv = DAT_MEM_PRIV_REMOTE_READ_FLAG | DAT_MEM_PRIV_REMOTE_WRITE_FLAG;
	DAT_LMR_HANDLE lmr_win = DAT_HANDLE_NULL;
	DAT_LMR_CONTEXT lc_win;
	DAT_RMR_CONTEXT ctx = 0;
	DAT_RMR_TRIPLET rem;
	DAT_LMR_TRIPLET l;
	char *target = bbuf + WIN_OFF;
	DAT_EP_ATTR attr = ep_attr(0, 0, 64);

	printf("-- %s (iWARP)\n", name);
	if (k == WRITE_NO_PRIVILEGE)
		priv = DAT_MEM_PRIV_REMOTE_READ_FLAG;
	if (k == READ_NO_PRIVILEGE)
		priv = DAT_MEM_PRIV_REMOTE_WRITE_FLAG;
	/* The window: an LMR of its own over the same memory (no RMRs on siw). */
	{
		DAT_MEM_PRIV_FLAGS lpriv = priv | DAT_MEM_PRIV_LOCAL_READ_FLAG;
		if (priv & DAT_MEM_PRIV_REMOTE_WRITE_FLAG)
			lpriv |= DAT_MEM_PRIV_LOCAL_WRITE_FLAG;
		DAT_REGION_DESCRIPTION region;
		DAT_VLEN rlen;
		DAT_VADDR raddr;
		region.for_va = bbuf + WIN_OFF;
		DAT_RETURN rc = dat_lmr_create(ia_b, DAT_MEM_TYPE_VIRTUAL, region, WIN_LEN, pz_b, lpriv, DAT_VA_TYPE_VA,
					       &lmr_win, &lc_win, &ctx, &rlen, &raddr);
		if (k == READ_NO_PRIVILEGE && DAT_GET_TYPE(rc) == DAT_MODEL_NOT_SUPPORTED) {
			printf("-- %s: the write-only region is refused (%#x): the device would let a peer read it\n",
			       name, (unsigned)rc);
			return;
		}
		CHECK_RC(rc, DAT_SUCCESS);
		if (rc != DAT_SUCCESS)
			return;
	}
	rem = aim(k, ctx, &target);
	side_ep(&A, &attr);
	side_ep(&B, &attr);
	if (connect_pair(&A, &B)) {
		memset(bbuf, 0x33, 8192);
		memset(b2buf, 0x33, 4096);
		memset(blbuf, 0x33, 4096);
		memset(abuf, 0x44, 8192);
		memcpy(abuf, "violation-data!!", 16);
		DAT_EVENT ev;
		if (is_read(k)) {
			l = seg(lc_a, abuf + 2048, 16);
			CHECK_RC(dat_ep_post_rdma_read(A.ep, 1, &l, ck(0x1), &rem, 0), DAT_SUCCESS);
		} else {
			l = seg(lc_a, abuf, 16);
			CHECK_RC(dat_ep_post_rdma_write(A.ep, 1, &l, ck(0x1), &rem, 0), DAT_SUCCESS);
		}
		DAT_RETURN rc = wait_event(A.req, &ev);
		CHECK(rc == DAT_SUCCESS && ev.event_number == DAT_DTO_COMPLETION_EVENT, "%s: no completion (%#x)",
		      name, (unsigned)rc);
		DAT_DTO_COMPLETION_STATUS st = ev.event_data.dto_completion_event_data.status;
		if (is_read(k))
			CHECK(st == DAT_DTO_ERR_REMOTE_ACCESS || st == DAT_DTO_ERR_FLUSHED,
			      "%s: the read completed with status %u (it must fail)", name, st);
		else
			CHECK(st == DAT_DTO_SUCCESS || st == DAT_DTO_ERR_REMOTE_ACCESS || st == DAT_DTO_ERR_FLUSHED,
			      "%s: the write completed with status %u", name, st);
		expect_conn_end(B.conn, B.ep, "target's connect EVD");
		expect_conn_end(A.conn, A.ep, "initiator's connect EVD");
		CHECK(all_are(bbuf, 0x33, 8192) && all_are(b2buf, 0x33, 4096) && all_are(blbuf, 0x33, 4096),
		      "%s: the target's memory changed", name);
		CHECK(all_are(abuf + 2048, 0x44, 16), "%s: the read brought bytes back", name);
	}
	side_free_ep(&A);
	side_free_ep(&B);
	CHECK_RC(dat_lmr_free(lmr_win), DAT_SUCCESS);
	bystander_works(name);
}

int main(void)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	alarm(100); /* a hang fails the test rather than the run */
	catch_sigpipe();
	DAT_EVD_HANDLE async_a = DAT_HANDLE_NULL, async_b = DAT_HANDLE_NULL;
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async_a, &ia_a), DAT_SUCCESS);
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async_b, &ia_b), DAT_SUCCESS);
	if (check_failed)
		return check_summary("test_remote_violation");
	window_bounds_unchecked = ia_adapter_is(ia_b, "rxe");
	no_rmrs = ia_attr_of(ia_b).max_rmrs == 0;
	CHECK_RC(dat_pz_create(ia_a, &pz_a), DAT_SUCCESS);
	CHECK_RC(dat_pz_create(ia_b, &pz_b), DAT_SUCCESS);
	CHECK_RC(dat_pz_create(ia_b, &pz_b2), DAT_SUCCESS);
	lmr_a = lmr_make(ia_a, pz_a, abuf, BUF, DAT_MEM_PRIV_ALL_FLAG, &lc_a, NULL);
	lmr_b = lmr_make(ia_b, pz_b, bbuf, BUF, DAT_MEM_PRIV_ALL_FLAG, &lc_b, &rc_b);
	lmr_b2 = lmr_make(ia_b, pz_b2, b2buf, BUF, DAT_MEM_PRIV_ALL_FLAG, &lc_b2, &rc_b2);
	lmr_bl = lmr_make(ia_b, pz_b, blbuf, BUF, DAT_MEM_PRIV_LOCAL_READ_FLAG | DAT_MEM_PRIV_LOCAL_WRITE_FLAG, &lc_bl,
			  &rc_bl);
	side_evds(&A, ia_a, pz_a);
	side_evds(&B, ia_b, pz_b);
	side_evds(&A2, ia_a, pz_a);
	side_evds(&B2, ia_b, pz_b);
	{
		DAT_EP_ATTR attr = ep_attr(0, 0, 64);
		side_ep(&A2, &attr);
		side_ep(&B2, &attr);
	}
	if (check_failed || !connect_pair(&A2, &B2))
		return check_summary("test_remote_violation");
	/* the valid context really works: a write and a read through it */
	{
		DAT_LMR_TRIPLET l = seg(lc_a, abuf, 8);
		DAT_RMR_TRIPLET g = rseg(rc_b, bbuf + 100, 8);
		memcpy(abuf, "baseline", 8);
		CHECK_RC(dat_ep_post_rdma_write(A2.ep, 1, &l, ck(1), &g, 0), DAT_SUCCESS);
		expect_dto(A2.req, A2.ep, 1, DAT_DTO_SUCCESS, 8, DAT_DTO_RDMA_WRITE, "baseline write");
		CHECK(memcmp(bbuf + 100, "baseline", 8) == 0, "baseline write data");
	}

	int iwarp = strstr(ia_attr_of(ia_b).adapter_name, "iWARP") != NULL;
	for (int k = 0; k < KINDS; k++) {
		if (iwarp)
			violation_iwarp((enum kind)k);
		else
			violation((enum kind)k, k % 2);
	}

	CHECK(disconnect_pair(&A2, &B2), "bystander disconnect");
	side_free_ep(&A2);
	side_free_ep(&B2);
	side_free_evds(&A);
	side_free_evds(&B);
	side_free_evds(&A2);
	side_free_evds(&B2);
	CHECK_RC(dat_lmr_free(lmr_a), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_b), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_b2), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_bl), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz_a), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz_b), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz_b2), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia_a, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia_b, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	check_no_sigpipe();
	return check_summary("test_remote_violation");
}
