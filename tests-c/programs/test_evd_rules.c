/* Notification rules of EVDs and the EP's receive high watermarks, on the
 * IA $DAT_TEST_IA (default rs-tcp); two IAs in one process, every wait
 * bounded.
 *
 * - recv_completion_flags name one notification mode: DEFAULT (0),
 *   SOLICITED_WAIT, UNSIGNALLED or EVD_THRESHOLD; a pair of them, or another
 *   bit, is DAT_INVALID_PARAMETER at dat_ep_create and dat_ep_modify; an
 *   EVD_THRESHOLD EP takes no UNSIGNALLED receive.
 * - A threshold above 1 on an EVD a consumer-controlled stream feeds (the
 *   receive EVD of a SOLICITED_WAIT or UNSIGNALLED EP, the request EVD of
 *   an UNSIGNALLED EP) is DAT_INVALID_STATE; on a threshold-mode EVD the
 *   threshold decides, solicited or not.
 * - SOLICITED_WAIT: an unsolicited receive is queued (dequeue returns it)
 *   but neither wakes dat_evd_wait nor triggers the EVD's CNO; a solicited
 *   one does, and the waiter gets the events in arrival order. Over rs-tcp
 *   only: the verbs backend cannot see the solicited bit and reports every
 *   receive as solicited (checked as such there).
 * - dat_ep_set_watermark: DAT_WATERMARK_INFINITE (-1) is valid, other
 *   negative values are not; the soft watermark raises one asynchronous
 *   event (DAT_ASYNC_ERROR_EP_BROKEN, the EP, reason
 *   DAT_SRQ_SOFT_HIGH_WATERMARK_EVENT) when the receives posted and not
 *   completed first exceed it, during the call or at a post, then none until
 *   set again; the hard watermark, exceeded while connected (during the
 *   call, at a post, or when the connection is established), breaks the
 *   connection: DAT_CONNECTION_EVENT_BROKEN, the EP DISCONNECTED, its
 *   receives flushed. dat_ep_recv_query reports the count as both
 *   nbufs_allocated and span. */
#include <dat2/udat.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "dto_pair.h"

#define BADARG(n) ERRCODE(DAT_INVALID_PARAMETER, DAT_INVALID_ARG##n)
#define TIMEOUT ERRCODE(DAT_TIMEOUT_EXPIRED, 0)
/* How long a wait that must not be woken waits. */
#define QUIET_US 300000u

static struct side A, B;
static DAT_EVD_HANDLE async_a = DAT_HANDLE_NULL, async_b = DAT_HANDLE_NULL;
static char abuf[4096], bbuf[4096];
static DAT_LMR_CONTEXT la, lb;
static int tcp;

static void post_recvs(struct side *s, DAT_LMR_CONTEXT ctx, char *buf, int n, uint64_t first_cookie)
{
	for (int i = 0; i < n; i++) {
		DAT_LMR_TRIPLET r = seg(ctx, buf + 64 * i, 64);
		CHECK_RC(dat_ep_post_recv(s->ep, 1, &r, ck(first_cookie + i), DAT_COMPLETION_DEFAULT_FLAG),
			 DAT_SUCCESS);
	}
}

/* A sends 8 bytes to B (or B to A) with `flags`; waits for the send's completion. */
static void send_from(struct side *from, DAT_LMR_CONTEXT ctx, char *buf, uint64_t cookie,
		      DAT_COMPLETION_FLAGS flags)
{
	DAT_LMR_TRIPLET s = seg(ctx, buf, 8);
	CHECK_RC(dat_ep_post_send(from->ep, 1, &s, ck(cookie), flags), DAT_SUCCESS);
	expect_dto(from->req, from->ep, cookie, DAT_DTO_SUCCESS, 8, DAT_DTO_SEND, "send");
}

/* Dequeues until an event comes or WAIT_US pass (dequeue does not wait). */
static DAT_RETURN dequeue_soon(DAT_EVD_HANDLE evd, DAT_EVENT *ev)
{
	struct timespec pause = { 0, 1000000 };
	DAT_RETURN rc = DAT_QUEUE_EMPTY;
	for (unsigned i = 0; i < WAIT_US / 1000; i++) {
		rc = dat_evd_dequeue(evd, ev);
		if (rc == DAT_SUCCESS)
			return rc;
		nanosleep(&pause, NULL);
	}
	return rc;
}

static uint64_t cookie_of(const DAT_EVENT *ev)
{
	return ev->event_data.dto_completion_event_data.user_cookie.as_64;
}

static void attr_rules(void)
{
	DAT_EP_HANDLE ep = DAT_HANDLE_NULL;
	DAT_COMPLETION_FLAGS bad[] = {
		DAT_COMPLETION_EVD_THRESHOLD_FLAG | DAT_COMPLETION_UNSIGNALLED_FLAG,
		DAT_COMPLETION_EVD_THRESHOLD_FLAG | DAT_COMPLETION_SOLICITED_WAIT_FLAG,
		DAT_COMPLETION_SOLICITED_WAIT_FLAG | DAT_COMPLETION_UNSIGNALLED_FLAG,
		DAT_COMPLETION_SUPPRESS_FLAG,
		DAT_COMPLETION_BARRIER_FENCE_FLAG,
	};
	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		DAT_EP_ATTR at = ep_attr(0, bad[i], 16);
		DAT_RETURN rc = dat_ep_create(B.ia, B.pz, B.rcv, B.req, B.conn, &at, &ep);
		CHECK(rc == BADARG(6), "dat_ep_create with recv_completion_flags %#x = %#x, want %#x", bad[i],
		      (unsigned)rc, (unsigned)BADARG(6));
		if (rc == DAT_SUCCESS)
			dat_ep_free(ep);
	}
	/* each mode alone is fine; modify checks the same rule */
	DAT_COMPLETION_FLAGS good[] = { DAT_COMPLETION_DEFAULT_FLAG, DAT_COMPLETION_SOLICITED_WAIT_FLAG,
					DAT_COMPLETION_UNSIGNALLED_FLAG, DAT_COMPLETION_EVD_THRESHOLD_FLAG };
	for (unsigned i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		DAT_EP_ATTR at = ep_attr(0, good[i], 16);
		ep = DAT_HANDLE_NULL;
		CHECK_RC(dat_ep_create(B.ia, B.pz, B.rcv, B.req, B.conn, &at, &ep), DAT_SUCCESS);
		if (ep == DAT_HANDLE_NULL)
			continue;
		if (good[i] == DAT_COMPLETION_EVD_THRESHOLD_FLAG) {
			DAT_LMR_TRIPLET r = seg(lb, bbuf, 64);
			CHECK_RC(dat_ep_post_recv(ep, 1, &r, ck(1), DAT_COMPLETION_UNSIGNALLED_FLAG), BADARG(5));
			at.recv_completion_flags |= DAT_COMPLETION_UNSIGNALLED_FLAG;
			CHECK_RC(dat_ep_modify(ep, DAT_EP_FIELD_EP_ATTR_RECV_COMPLETION_FLAGS, (DAT_EP_PARAM *)NULL),
				 BADARG(3));
			DAT_EP_PARAM param;
			memset(&param, 0, sizeof(param));
			param.ep_attr = at;
			CHECK_RC(dat_ep_modify(ep, DAT_EP_FIELD_EP_ATTR_RECV_COMPLETION_FLAGS, &param), BADARG(3));
		}
		CHECK_RC(dat_ep_free(ep), DAT_SUCCESS);
	}
}

/* Threshold rules on EVDs of their own (no connection needed). */
static void threshold_rules(void)
{
	DAT_EVD_HANDLE req, rcv;
	DAT_EVENT ev;
	DAT_COUNT nmore;
	CHECK_RC(dat_evd_create(B.ia, 8, DAT_HANDLE_NULL, DAT_EVD_DTO_FLAG, &req), DAT_SUCCESS);
	CHECK_RC(dat_evd_create(B.ia, 8, DAT_HANDLE_NULL, DAT_EVD_DTO_FLAG, &rcv), DAT_SUCCESS);
	struct {
		DAT_COMPLETION_FLAGS request, recv;
		DAT_RETURN want_req, want_rcv;
	} cases[] = {
		{ 0, 0, TIMEOUT, TIMEOUT },
		{ 0, DAT_COMPLETION_EVD_THRESHOLD_FLAG, TIMEOUT, TIMEOUT },
		{ 0, DAT_COMPLETION_SOLICITED_WAIT_FLAG, TIMEOUT,
		  ERRCODE(DAT_INVALID_STATE, DAT_INVALID_STATE_EVD_CONFIG_SOLICITED) },
		{ 0, DAT_COMPLETION_UNSIGNALLED_FLAG, TIMEOUT,
		  ERRCODE(DAT_INVALID_STATE, DAT_INVALID_STATE_EVD_CONFIG_NOTIFY) },
		{ DAT_COMPLETION_UNSIGNALLED_FLAG, 0, ERRCODE(DAT_INVALID_STATE, DAT_INVALID_STATE_EVD_CONFIG_NOTIFY),
		  TIMEOUT },
	};
	for (unsigned i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		DAT_EP_ATTR at = ep_attr(cases[i].request, cases[i].recv, 8);
		DAT_EP_HANDLE ep = DAT_HANDLE_NULL;
		CHECK_RC(dat_ep_create(B.ia, B.pz, rcv, req, B.conn, &at, &ep), DAT_SUCCESS);
		if (ep == DAT_HANDLE_NULL)
			continue;
		DAT_RETURN rc = dat_evd_wait(req, 0, 2, &ev, &nmore);
		CHECK(rc == cases[i].want_req, "case %u: wait(request EVD, threshold 2) = %#x, want %#x", i,
		      (unsigned)rc, (unsigned)cases[i].want_req);
		rc = dat_evd_wait(rcv, 0, 2, &ev, &nmore);
		CHECK(rc == cases[i].want_rcv, "case %u: wait(receive EVD, threshold 2) = %#x, want %#x", i,
		      (unsigned)rc, (unsigned)cases[i].want_rcv);
		/* threshold 1 is always allowed */
		CHECK_RC(dat_evd_wait(rcv, 0, 1, &ev, &nmore), TIMEOUT);
		CHECK_RC(dat_ep_free(ep), DAT_SUCCESS);
	}
	/* the EP gone, the EVD is unconstrained again */
	CHECK_RC(dat_evd_wait(rcv, 0, 2, &ev, &nmore), TIMEOUT);
	CHECK_RC(dat_evd_free(req), DAT_SUCCESS);
	CHECK_RC(dat_evd_free(rcv), DAT_SUCCESS);
}

/* B's EP is SOLICITED_WAIT for receives; A's is EVD_THRESHOLD. Connected. */
static void solicited_wait(void)
{
	DAT_EVENT ev;
	DAT_COUNT nmore = -1;
	post_recvs(&B, lb, bbuf, 8, 0x100);

	/* an unsolicited receive does not wake the waiter... */
	send_from(&A, la, abuf, 0x1, DAT_COMPLETION_DEFAULT_FLAG);
	DAT_RETURN rc = dat_evd_wait(B.rcv, tcp ? QUIET_US : WAIT_US, 1, &ev, &nmore);
	if (tcp) {
		CHECK(rc == TIMEOUT, "an unsolicited receive woke the waiter: wait = %#x (cookie %#llx)",
		      (unsigned)rc, (unsigned long long)cookie_of(&ev));
		/* ...a solicited one does, and the waiter gets the first event, the other still queued */
		send_from(&A, la, abuf, 0x2, DAT_COMPLETION_SOLICITED_WAIT_FLAG);
		nmore = -1;
		rc = wait_event(B.rcv, &ev);
		CHECK(rc == DAT_SUCCESS && cookie_of(&ev) == 0x100, "solicited receive: wait = %#x cookie %#llx",
		      (unsigned)rc, (unsigned long long)cookie_of(&ev));
		CHECK(dat_evd_wait(B.rcv, 0, 1, &ev, &nmore) == DAT_SUCCESS && cookie_of(&ev) == 0x101 && nmore == 0,
		      "the solicited receive follows at once");
	} else {
		/* verbs: no solicited bit in a work completion; every receive notifies */
		CHECK(rc == DAT_SUCCESS && cookie_of(&ev) == 0x100, "verbs: a receive notifies: wait = %#x", (unsigned)rc);
		send_from(&A, la, abuf, 0x2, DAT_COMPLETION_SOLICITED_WAIT_FLAG);
		expect_dto(B.rcv, B.ep, 0x101, DAT_DTO_SUCCESS, 8, DAT_DTO_RECEIVE, "solicited receive");
	}

	/* an unsolicited receive is still dequeued */
	send_from(&A, la, abuf, 0x3, DAT_COMPLETION_DEFAULT_FLAG);
	rc = dequeue_soon(B.rcv, &ev);
	CHECK(rc == DAT_SUCCESS && cookie_of(&ev) == 0x102, "dequeue of an unsolicited receive = %#x cookie %#llx",
	      (unsigned)rc, (unsigned long long)cookie_of(&ev));

	/* the CNO: triggered by the solicited receive only */
	DAT_CNO_HANDLE cno = DAT_HANDLE_NULL;
	DAT_EVD_HANDLE which = DAT_HANDLE_NULL;
	CHECK_RC(dat_cno_create(B.ia, DAT_OS_WAIT_PROXY_AGENT_NULL, &cno), DAT_SUCCESS);
	CHECK_RC(dat_evd_modify_cno(B.rcv, cno), DAT_SUCCESS);
	send_from(&A, la, abuf, 0x4, DAT_COMPLETION_DEFAULT_FLAG);
	rc = dat_cno_wait(cno, tcp ? QUIET_US : WAIT_US, &which);
	if (tcp)
		CHECK(rc == TIMEOUT, "an unsolicited receive triggered the CNO: dat_cno_wait = %#x",
		      (unsigned)rc);
	else
		CHECK(rc == DAT_SUCCESS && which == B.rcv, "verbs: a receive triggers the CNO: %#x", (unsigned)rc);
	send_from(&A, la, abuf, 0x5, DAT_COMPLETION_SOLICITED_WAIT_FLAG);
	which = DAT_HANDLE_NULL;
	rc = dat_cno_wait(cno, WAIT_US, &which);
	CHECK(rc == DAT_SUCCESS && which == B.rcv, "solicited receive triggers the CNO: %#x evd %p", (unsigned)rc,
	      (void *)which);
	expect_dto_now(B.rcv, B.ep, 0x103, DAT_DTO_SUCCESS, DAT_DTO_RECEIVE, "unsolicited receive behind the CNO");
	expect_dto_now(B.rcv, B.ep, 0x104, DAT_DTO_SUCCESS, DAT_DTO_RECEIVE, "solicited receive behind the CNO");
	CHECK_RC(dat_evd_modify_cno(B.rcv, DAT_HANDLE_NULL), DAT_SUCCESS);
	CHECK_RC(dat_cno_free(cno), DAT_SUCCESS);

	/* a solicited send toward a threshold-mode EVD: the threshold decides */
	post_recvs(&A, la, abuf + 1024, 3, 0x200);
	send_from(&B, lb, bbuf + 2048, 0x11, DAT_COMPLETION_SOLICITED_WAIT_FLAG);
	send_from(&B, lb, bbuf + 2048, 0x12, DAT_COMPLETION_SOLICITED_WAIT_FLAG);
	CHECK_RC(dat_evd_wait(A.rcv, QUIET_US, 3, &ev, &nmore), TIMEOUT);
	send_from(&B, lb, bbuf + 2048, 0x13, DAT_COMPLETION_DEFAULT_FLAG);
	nmore = -1;
	rc = dat_evd_wait(A.rcv, WAIT_US, 3, &ev, &nmore);
	CHECK(rc == DAT_SUCCESS && cookie_of(&ev) == 0x200 && nmore == 2, "threshold 3: wait = %#x cookie %#llx nmore %d",
	      (unsigned)rc, (unsigned long long)cookie_of(&ev), (int)nmore);
	drain(A.rcv);
	drain(B.rcv);
}

/* The next asynchronous event on B's async EVD must be the soft watermark of `ep`. */
static void expect_soft_event(DAT_EP_HANDLE ep, const char *what)
{
	DAT_EVENT ev;
	memset(&ev, 0, sizeof(ev));
	DAT_RETURN rc = dat_evd_dequeue(async_b, &ev);
	CHECK(rc == DAT_SUCCESS && ev.event_number == DAT_ASYNC_ERROR_EP_BROKEN &&
		      ev.event_data.asynch_error_event_data.dat_handle == ep &&
		      ev.event_data.asynch_error_event_data.reason == DAT_SRQ_SOFT_HIGH_WATERMARK_EVENT,
	      "%s: dequeue = %#x event %#x handle %p reason %d", what, (unsigned)rc, ev.event_number,
	      (void *)ev.event_data.asynch_error_event_data.dat_handle, (int)ev.event_data.asynch_error_event_data.reason);
}

static void soft_watermark(void)
{
	DAT_EP_HANDLE ep = DAT_HANDLE_NULL;
	DAT_EP_ATTR at = ep_attr(0, 0, 16);
	CHECK_RC(dat_ep_create(B.ia, B.pz, B.rcv, B.req, B.conn, &at, &ep), DAT_SUCCESS);
	if (ep == DAT_HANDLE_NULL)
		return;
	drain(async_b);
	CHECK_RC(dat_ep_set_watermark(ep, -2, DAT_WATERMARK_INFINITE), BADARG(2));
	CHECK_RC(dat_ep_set_watermark(ep, DAT_WATERMARK_INFINITE, -7), BADARG(3));
	CHECK_RC(dat_ep_set_watermark(ep, DAT_WATERMARK_INFINITE, DAT_WATERMARK_INFINITE), DAT_SUCCESS);
	CHECK_RC(dat_ep_set_watermark(ep, 2, DAT_WATERMARK_INFINITE), DAT_SUCCESS);
	expect_empty(async_b, "soft watermark 2, nothing posted");
	struct side c = B;
	c.ep = ep;
	post_recvs(&c, lb, bbuf, 2, 0x300);
	expect_empty(async_b, "2 posted, soft watermark 2");
	post_recvs(&c, lb, bbuf + 128, 1, 0x302);
	expect_soft_event(ep, "3 posted, soft watermark 2");
	post_recvs(&c, lb, bbuf + 192, 1, 0x303);
	expect_empty(async_b, "once per setting");
	DAT_COUNT n = -1, span = -1;
	CHECK_RC(dat_ep_recv_query(ep, &n, &span), DAT_SUCCESS);
	CHECK(n == 4 && span == 4, "dat_ep_recv_query = %d, %d; want 4, 4", (int)n, (int)span);
	/* set again below the count: during the call */
	CHECK_RC(dat_ep_set_watermark(ep, 1, DAT_WATERMARK_INFINITE), DAT_SUCCESS);
	expect_soft_event(ep, "set to 1 with 4 posted");
	CHECK_RC(dat_ep_set_watermark(ep, 4, DAT_WATERMARK_INFINITE), DAT_SUCCESS);
	expect_empty(async_b, "set to 4 with 4 posted");
	/* the hard watermark of an EP that is not connected does nothing yet */
	CHECK_RC(dat_ep_set_watermark(ep, DAT_WATERMARK_INFINITE, 1), DAT_SUCCESS);
	CHECK(ep_state(ep) == DAT_EP_STATE_UNCONNECTED, "unconnected EP above its hard watermark stays UNCONNECTED");
	expect_empty(B.conn, "no connection event for an unconnected EP");
	CHECK_RC(dat_ep_free(ep), DAT_SUCCESS);
	drain(B.rcv);
	expect_empty(async_b, "nothing else on the async EVD");
}

/* B's EP broke on its hard watermark: BROKEN on B, the peer told, receives flushed. */
static void expect_hard_break(const char *what)
{
	expect_conn_event(B.conn, B.ep, DAT_CONNECTION_EVENT_BROKEN, what);
	CHECK(ep_state(B.ep) == DAT_EP_STATE_DISCONNECTED, "%s: B's EP state %u, want DISCONNECTED", what,
	      ep_state(B.ep));
	DAT_EVENT ev;
	DAT_RETURN rc = wait_event(A.conn, &ev);
	CHECK(rc == DAT_SUCCESS && (ev.event_number == DAT_CONNECTION_EVENT_DISCONNECTED ||
				    ev.event_number == DAT_CONNECTION_EVENT_BROKEN),
	      "%s: the peer sees the connection end: wait = %#x event %#x", what, (unsigned)rc, ev.event_number);
	rc = wait_event(B.rcv, &ev);
	CHECK(rc == DAT_SUCCESS && ev.event_data.dto_completion_event_data.status == DAT_DTO_ERR_FLUSHED,
	      "%s: B's receives are flushed: wait = %#x status %u", what, (unsigned)rc,
	      ev.event_data.dto_completion_event_data.status);
	drain(B.rcv);
	DAT_COUNT n = -1, span = -1;
	CHECK_RC(dat_ep_recv_query(B.ep, &n, &span), DAT_SUCCESS);
	CHECK(n == 0, "%s: nothing posted after the flush (%d)", what, (int)n);
}

static void reset_pair(void)
{
	CHECK_RC(dat_ep_reset(A.ep), DAT_SUCCESS);
	CHECK_RC(dat_ep_reset(B.ep), DAT_SUCCESS);
	drain(A.conn);
	drain(B.conn);
	drain(A.rcv);
	drain(B.rcv);
	drain(A.req);
	drain(B.req);
}

static void hard_watermark(void)
{
	/* exceeded by a post while connected */
	DAT_COUNT n = -1, span = -1;
	CHECK_RC(dat_ep_recv_query(B.ep, &n, &span), DAT_SUCCESS);
	CHECK_RC(dat_ep_set_watermark(B.ep, DAT_WATERMARK_INFINITE, n + 1), DAT_SUCCESS);
	post_recvs(&B, lb, bbuf + 128, 1, 0x402);
	expect_empty(B.conn, "at the hard watermark");
	CHECK(ep_state(B.ep) == DAT_EP_STATE_CONNECTED, "still connected at the watermark");
	post_recvs(&B, lb, bbuf + 192, 1, 0x403);
	expect_hard_break("one above the hard watermark");
	reset_pair();

	/* exceeded during the call */
	if (connect_pair(&A, &B)) {
		post_recvs(&B, lb, bbuf, 2, 0x410);
		CHECK_RC(dat_ep_set_watermark(B.ep, DAT_WATERMARK_INFINITE, 1), DAT_SUCCESS);
		expect_hard_break("hard watermark set to 1 with 2 posted");
	}
	reset_pair();

	/* exceeded before the connection: it breaks once established */
	post_recvs(&B, lb, bbuf, 2, 0x420);
	CHECK_RC(dat_ep_set_watermark(B.ep, DAT_WATERMARK_INFINITE, 1), DAT_SUCCESS);
	CHECK(ep_state(B.ep) == DAT_EP_STATE_UNCONNECTED, "not connected: no break yet");
	DAT_CONN_QUAL qual = 0;
	DAT_PSP_HANDLE psp = listen_any(&B, &qual);
	CHECK_RC(dat_ep_connect(A.ep, ia_address(B.ia), qual, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT,
				DAT_CONNECT_DEFAULT_FLAG),
		 DAT_SUCCESS);
	if (accept_next(&B)) {
		expect_conn_event(B.conn, B.ep, DAT_CONNECTION_EVENT_ESTABLISHED, "ESTABLISHED above the hard watermark");
		expect_conn_event(A.conn, A.ep, DAT_CONNECTION_EVENT_ESTABLISHED, "active ESTABLISHED");
		expect_hard_break("established with 2 posted, hard watermark 1");
	}
	CHECK_RC(dat_psp_free(psp), DAT_SUCCESS);
	reset_pair();
	/* infinite again: no more breaks */
	CHECK_RC(dat_ep_set_watermark(B.ep, DAT_WATERMARK_INFINITE, DAT_WATERMARK_INFINITE), DAT_SUCCESS);
	post_recvs(&B, lb, bbuf, 4, 0x430);
	if (connect_pair(&A, &B)) {
		send_from(&A, la, abuf, 0x31, DAT_COMPLETION_SOLICITED_WAIT_FLAG);
		expect_dto(B.rcv, B.ep, 0x430, DAT_DTO_SUCCESS, 8, DAT_DTO_RECEIVE, "after the watermarks are cleared");
		disconnect_pair(&A, &B);
	}
	expect_empty(async_b, "the hard watermark raises no asynchronous event");
}

int main(void)
{
	DAT_IA_HANDLE ia_a, ia_b;
	DAT_PZ_HANDLE pz_a, pz_b;

	setvbuf(stdout, NULL, _IONBF, 0);
	alarm(150);
	catch_sigpipe();
	CHECK_RC(dat_ia_open(dat_test_ia(), 16, &async_a, &ia_a), DAT_SUCCESS);
	CHECK_RC(dat_ia_open(dat_test_ia(), 16, &async_b, &ia_b), DAT_SUCCESS);
	if (check_failed)
		return check_summary("test_evd_rules");
	tcp = ia_is_tcp(ia_a);
	CHECK_RC(dat_pz_create(ia_a, &pz_a), DAT_SUCCESS);
	CHECK_RC(dat_pz_create(ia_b, &pz_b), DAT_SUCCESS);
	side_evds(&A, ia_a, pz_a);
	side_evds(&B, ia_b, pz_b);
	DAT_LMR_HANDLE lmr_a = lmr_make(ia_a, pz_a, abuf, sizeof(abuf), DAT_MEM_PRIV_ALL_FLAG, &la, NULL);
	DAT_LMR_HANDLE lmr_b = lmr_make(ia_b, pz_b, bbuf, sizeof(bbuf), DAT_MEM_PRIV_ALL_FLAG, &lb, NULL);
	if (check_failed)
		return check_summary("test_evd_rules");

	attr_rules();
	threshold_rules();
	soft_watermark();

	DAT_EP_ATTR aa = ep_attr(0, DAT_COMPLETION_EVD_THRESHOLD_FLAG, 64);
	DAT_EP_ATTR ba = ep_attr(0, DAT_COMPLETION_SOLICITED_WAIT_FLAG, 64);
	side_ep(&A, &aa);
	side_ep(&B, &ba);
	if (connect_pair(&A, &B)) {
		solicited_wait();
		hard_watermark();
	}

	CHECK_RC(dat_lmr_free(lmr_a), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_b), DAT_SUCCESS);
	side_free_ep(&A);
	side_free_ep(&B);
	side_free_evds(&A);
	side_free_evds(&B);
	CHECK_RC(dat_pz_free(pz_a), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz_b), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia_a, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia_b, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	check_no_sigpipe();
	return check_summary("test_evd_rules");
}
