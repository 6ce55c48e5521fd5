/* Exhausted resources (issue 11, item 5): running out gives
 * DAT_INSUFFICIENT_RESOURCES, never a crash or DAT_INTERNAL_ERROR, and
 * leaves every other object working. A connected EP pair (the bystanders,
 * A and B) moves a message both ways after each case.
 *
 * - EVD overflow: a receive EVD of queue length q gets q + 2 completions:
 *   one DAT_ASYNC_ERROR_EVD_OVERFLOW naming it arrives on the IA's async
 *   EVD, and every completion is still dequeued (none dropped).
 * - EPs: created on one IA until refused; refused exactly at the IA's
 *   max_eps (dat_ia_query) with DAT_INSUFFICIENT_RESOURCES.
 * - IA handles: IAs opened until refused (the registry's table, or the
 *   process's file descriptors): DAT_INSUFFICIENT_RESOURCES.
 * - File descriptors (where a PSP takes one: not on rdma_cm, whose PSPs
 *   share one event channel; skipped there, saying so): with RLIMIT_NOFILE
 *   lowered to just above what is open, PSPs are created until refused
 *   (DAT_INSUFFICIENT_RESOURCES), then dat_cno_create, dat_ia_open and
 *   dat_psp_create_any are refused the same way; a connect is accepted and ends in a connection event other than
 *   ESTABLISHED (its socket is made on the provider's thread); the bystanders
 *   still talk, at the limit and after it is restored, and the refused EP
 *   connects once fds are available again.
 * - Deep queues: 20,000 receives posted on one EP (published benchmarks ask
 *   for that many), the next refused, all flushed in order on dat_ep_free.
 * - PZs, EVDs, SRQs: created until refused, exactly at max_pzs, max_evds,
 *   max_srqs.
 * - LMRs and RMRs (`test_resources full`, run by `make check-memory`: a
 *   million of each): created until refused, exactly at max_lmrs, max_rmrs.
 * - Signal handlers: the program's own handlers of SIGINT, SIGTERM, SIGABRT
 *   and SIGILL, installed before the first dat_ia_open, are still its own
 *   after it (the load of a provider and of what it links must not replace
 *   them: Debian's libfabric pulls in a library whose constructor did).
 *
 * `test_resources valgrind` leaves the fd case out (see main).
 * Prints "test_resources: N passed, N failed". */
#include <dat2/udat.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include "check.h"
#include "dto_pair.h"

#define BUF 4096
static char abuf[BUF], bbuf[BUF];
static DAT_IA_HANDLE ia_a, ia_b;
static DAT_EVD_HANDLE async_a, async_b;
static DAT_PZ_HANDLE pz_a, pz_b;
static DAT_LMR_HANDLE lmr_a, lmr_b;
static DAT_LMR_CONTEXT lc_a, lc_b;
static struct side A, B;

#define CHECK_RESOURCES(rc, what)                                                                              \
	CHECK(DAT_GET_TYPE(rc) == DAT_INSUFFICIENT_RESOURCES && ((rc) & DAT_CLASS_ERROR),                      \
	      "%s: %#x, want DAT_INSUFFICIENT_RESOURCES", what, (unsigned)(rc))

/* The bystanders move one message each way. */
static void bystanders_talk(const char *when)
{
	static uint64_t n = 0x100;
	DAT_LMR_TRIPLET ra = seg(lc_a, abuf + 2048, 64), sa = seg(lc_a, abuf, 64);
	DAT_LMR_TRIPLET rb = seg(lc_b, bbuf + 2048, 64), sb = seg(lc_b, bbuf, 64);
	char what[160];
	n += 4;
	CHECK_RC(dat_ep_post_recv(B.ep, 1, &rb, ck(n), DAT_COMPLETION_DEFAULT_FLAG), DAT_SUCCESS);
	CHECK_RC(dat_ep_post_recv(A.ep, 1, &ra, ck(n + 1), DAT_COMPLETION_DEFAULT_FLAG), DAT_SUCCESS);
	CHECK_RC(dat_ep_post_send(A.ep, 1, &sa, ck(n + 2), DAT_COMPLETION_DEFAULT_FLAG), DAT_SUCCESS);
	CHECK_RC(dat_ep_post_send(B.ep, 1, &sb, ck(n + 3), DAT_COMPLETION_DEFAULT_FLAG), DAT_SUCCESS);
	snprintf(what, sizeof(what), "bystanders %s: A's send", when);
	expect_dto(A.req, A.ep, n + 2, DAT_DTO_SUCCESS, 64, DAT_DTO_SEND, what);
	snprintf(what, sizeof(what), "bystanders %s: B's receive", when);
	expect_dto(B.rcv, B.ep, n, DAT_DTO_SUCCESS, 64, DAT_DTO_RECEIVE, what);
	snprintf(what, sizeof(what), "bystanders %s: B's send", when);
	expect_dto(B.req, B.ep, n + 3, DAT_DTO_SUCCESS, 64, DAT_DTO_SEND, what);
	snprintf(what, sizeof(what), "bystanders %s: A's receive", when);
	expect_dto(A.rcv, A.ep, n + 1, DAT_DTO_SUCCESS, 64, DAT_DTO_RECEIVE, what);
}

/* The program's own handlers, installed before the provider is loaded. */
static const int OWN_SIGNALS[] = {SIGINT, SIGTERM, SIGABRT, SIGILL};
#define N_OWN_SIGNALS (sizeof OWN_SIGNALS / sizeof OWN_SIGNALS[0])

static void own_handler(int sig)
{
	(void)sig;
}

static void install_own_handlers(void)
{
	struct sigaction act;
	memset(&act, 0, sizeof act);
	act.sa_handler = own_handler;
	sigemptyset(&act.sa_mask);
	for (size_t i = 0; i < N_OWN_SIGNALS; i++)
		sigaction(OWN_SIGNALS[i], &act, NULL);
}

static void own_handlers_kept(void)
{
	for (size_t i = 0; i < N_OWN_SIGNALS; i++) {
		struct sigaction now;
		sigaction(OWN_SIGNALS[i], NULL, &now);
		CHECK(now.sa_handler == own_handler,
		      "signal %d: the program's handler is still in place after dat_ia_open",
		      OWN_SIGNALS[i]);
		/* back to the default: a test runner's SIGTERM must still end us */
		signal(OWN_SIGNALS[i], SIG_DFL);
	}
}

/* A receive EVD of queue length q gets q + 2 completions. */
static void test_evd_overflow(void)
{
	struct side C, D;
	DAT_EVD_PARAM param;
	DAT_EVENT ev;
	DAT_COUNT q;
	side_evds(&C, ia_a, pz_a);
	side_evds(&D, ia_b, pz_b);
	/* D's receive EVD: as short as the provider makes it */
	CHECK_RC(dat_evd_free(D.rcv), DAT_SUCCESS);
	CHECK_RC(dat_evd_create(ia_b, 2, DAT_HANDLE_NULL, DAT_EVD_DTO_FLAG, &D.rcv), DAT_SUCCESS);
	memset(&param, 0, sizeof(param));
	CHECK_RC(dat_evd_query(D.rcv, DAT_EVD_FIELD_EVD_QLEN, &param), DAT_SUCCESS);
	q = param.evd_qlen;
	CHECK(q >= 2 && q <= 64, "EVD qlen %d for a request of 2", q);
	if (q < 2 || q > 64)
		return;
	DAT_EP_ATTR attr = ep_attr(0, 0, 128);
	side_ep(&C, &attr);
	side_ep(&D, &attr);
	if (check_failed || !connect_pair(&C, &D))
		return;
	drain(async_b);
	for (int i = 0; i < q + 2; i++) {
		DAT_LMR_TRIPLET r = seg(lc_b, bbuf + 8 * i, 8);
		CHECK_RC(dat_ep_post_recv(D.ep, 1, &r, ck(0x500 + i), DAT_COMPLETION_DEFAULT_FLAG), DAT_SUCCESS);
	}
	for (int i = 0; i < q + 2; i++) {
		DAT_LMR_TRIPLET s = seg(lc_a, abuf + 8 * i, 8);
		CHECK_RC(dat_ep_post_send(C.ep, 1, &s, ck(0x600 + i), DAT_COMPLETION_DEFAULT_FLAG), DAT_SUCCESS);
	}
	for (int i = 0; i < q + 2; i++)
		expect_dto(C.req, C.ep, 0x600 + i, DAT_DTO_SUCCESS, 8, DAT_DTO_SEND, "send to the short EVD's EP");
	/* every send completed, so every receive did: the overflow was reported */
	DAT_RETURN rc = wait_event(async_b, &ev);
	CHECK(rc == DAT_SUCCESS && ev.event_number == DAT_ASYNC_ERROR_EVD_OVERFLOW &&
		      ev.event_data.asynch_error_event_data.dat_handle == (DAT_HANDLE)D.rcv,
	      "EVD overflow: async wait = %#x, event %#x for %p, want DAT_ASYNC_ERROR_EVD_OVERFLOW for %p",
	      (unsigned)rc, rc == DAT_SUCCESS ? ev.event_number : 0,
	      rc == DAT_SUCCESS ? (void *)ev.event_data.asynch_error_event_data.dat_handle : NULL, (void *)D.rcv);
	expect_empty(async_b, "one overflow event per overflow");
	int kept = 0;
	for (int i = 0; i < q + 2; i++)
		kept += expect_dto_now(D.rcv, D.ep, 0x500 + i, DAT_DTO_SUCCESS, DAT_DTO_RECEIVE,
				       "every completion of the overflowed EVD kept");
	expect_empty(D.rcv, "overflowed EVD after its completions");
	printf("EVD overflow: queue length %d, %d completions: DAT_ASYNC_ERROR_EVD_OVERFLOW %s, %d dequeued\n", q,
	       q + 2, rc == DAT_SUCCESS && ev.event_number == DAT_ASYNC_ERROR_EVD_OVERFLOW ? "raised" : "MISSING",
	       kept);
	disconnect_pair(&C, &D);
	side_free_ep(&C);
	side_free_ep(&D);
	side_free_evds(&C);
	side_free_evds(&D);
}

/* EPs on ia_a until refused. */
static void test_eps(void)
{
	DAT_IA_ATTR attr = ia_attr_of(ia_a);
	long limit = attr.max_eps, n = 0;
	DAT_EP_HANDLE *eps = calloc(limit + 1, sizeof(*eps));
	DAT_EP_ATTR ea = ep_attr(0, 0, 16);
	DAT_RETURN rc = DAT_SUCCESS;
	if (!eps)
		return;
	/* A's EP is one of ia_a's */
	while (n <= limit) {
		rc = dat_ep_create(ia_a, pz_a, A.rcv, A.req, A.conn, &ea, &eps[n]);
		if (rc != DAT_SUCCESS)
			break;
		n++;
	}
	printf("EPs: %ld created beside the bystander, then %#x (max_eps %ld)\n", n, (unsigned)rc, limit);
	CHECK_RESOURCES(rc, "dat_ep_create past max_eps");
	CHECK(n + 1 == limit, "EPs refused after %ld (+1 bystander), max_eps %ld", n, limit);
	bystanders_talk("with every EP in use");
	for (long i = 0; i < n; i++)
		CHECK_RC(dat_ep_free(eps[i]), DAT_SUCCESS);
	free(eps);
	/* room again */
	DAT_EP_HANDLE ep = DAT_HANDLE_NULL;
	CHECK_RC(dat_ep_create(ia_a, pz_a, A.rcv, A.req, A.conn, &ea, &ep), DAT_SUCCESS);
	if (ep)
		CHECK_RC(dat_ep_free(ep), DAT_SUCCESS);
}

/* Deep queues (issue 21 item 6): published uDAPL benchmarks ask for 20,000
 * receive DTOs per EP; the IA's max_dto_per_ep must allow it, the EP must
 * take all 20,000 posted receives and refuse the next with
 * DAT_INSUFFICIENT_RESOURCES, and freeing it flushes every one into its EVD. */
static void test_deep_queues(void)
{
	enum { DEPTH = 20000 };
	int failed = check_failed; /* this case's own failures stop it, not an earlier case's */
	DAT_IA_ATTR attr = ia_attr_of(ia_a);
	CHECK(attr.max_dto_per_ep >= DEPTH, "max_dto_per_ep %d < %d", (int)attr.max_dto_per_ep, DEPTH);
	DAT_EVD_HANDLE rcv = DAT_HANDLE_NULL, req = DAT_HANDLE_NULL;
	CHECK_RC(dat_evd_create(ia_a, DEPTH + 16, DAT_HANDLE_NULL, DAT_EVD_DTO_FLAG, &rcv), DAT_SUCCESS);
	CHECK_RC(dat_evd_create(ia_a, DEPTH + 16, DAT_HANDLE_NULL, DAT_EVD_DTO_FLAG, &req), DAT_SUCCESS);
	DAT_EP_ATTR ea = ep_attr(0, 0, DEPTH);
	ea.max_recv_dtos = DEPTH;
	DAT_EP_HANDLE ep = DAT_HANDLE_NULL;
	CHECK_RC(dat_ep_create(ia_a, pz_a, rcv, req, A.conn, &ea, &ep), DAT_SUCCESS);
	if (check_failed > failed || !ep) {
		/* nothing of this case left behind for the next ones to count */
		if (ep)
			dat_ep_free(ep);
		if (rcv)
			dat_evd_free(rcv);
		if (req)
			dat_evd_free(req);
		return;
	}
	DAT_LMR_TRIPLET iov = seg(lc_a, abuf, 64);
	long posted = 0;
	DAT_RETURN rc = DAT_SUCCESS;
	while (posted < DEPTH) {
		DAT_DTO_COOKIE ck = { .as_64 = (DAT_UINT64)posted };
		rc = dat_ep_post_recv(ep, 1, &iov, ck, DAT_COMPLETION_DEFAULT_FLAG);
		if (rc != DAT_SUCCESS)
			break;
		posted++;
	}
	CHECK(posted == DEPTH, "only %ld of %d receives posted: %#x", posted, DEPTH, (unsigned)rc);
	DAT_DTO_COOKIE ck = { .as_64 = DEPTH };
	rc = dat_ep_post_recv(ep, 1, &iov, ck, DAT_COMPLETION_DEFAULT_FLAG);
	printf("deep queues: %ld receives posted on one EP (max_dto_per_ep %d), the next %#x\n", posted,
	       (int)attr.max_dto_per_ep, (unsigned)rc);
	CHECK_RESOURCES(rc, "a receive past max_recv_dtos");
	CHECK_RC(dat_ep_free(ep), DAT_SUCCESS);
	long flushed = 0;
	DAT_EVENT ev;
	while (dat_evd_dequeue(rcv, &ev) == DAT_SUCCESS) {
		if (ev.event_number == DAT_DTO_COMPLETION_EVENT &&
		    ev.event_data.dto_completion_event_data.user_cookie.as_64 == (DAT_UINT64)flushed)
			flushed++;
	}
	CHECK(flushed == posted, "%ld of %ld receives flushed in order", flushed, posted);
	CHECK_RC(dat_evd_free(rcv), DAT_SUCCESS);
	CHECK_RC(dat_evd_free(req), DAT_SUCCESS);
}

/* PZs, EVDs, SRQs (and, `full` only, RMRs) on ia_a until refused: exactly at
 * the IA's max_pzs, max_evds, max_srqs, max_rmrs counting what exists. */
enum kind { PZ, EVD, SRQ, RMR };
static DAT_RETURN make(enum kind k, DAT_HANDLE *h)
{
	DAT_SRQ_ATTR sa = { .max_recv_dtos = 1, .max_recv_iov = 1, .low_watermark = 0 };
	switch (k) {
	case PZ:
		return dat_pz_create(ia_a, (DAT_PZ_HANDLE *)h);
	case EVD:
		return dat_evd_create(ia_a, 1, DAT_HANDLE_NULL, DAT_EVD_SOFTWARE_FLAG, (DAT_EVD_HANDLE *)h);
	case SRQ:
		return dat_srq_create(ia_a, pz_a, &sa, (DAT_SRQ_HANDLE *)h);
	default:
		return dat_rmr_create(pz_a, (DAT_RMR_HANDLE *)h);
	}
}

static DAT_RETURN unmake(enum kind k, DAT_HANDLE h)
{
	switch (k) {
	case PZ:
		return dat_pz_free(h);
	case EVD:
		return dat_evd_free(h);
	case SRQ:
		return dat_srq_free(h);
	default:
		return dat_rmr_free(h);
	}
}

static void test_objects(enum kind k, const char *what, long limit, long existing)
{
	DAT_HANDLE *hs = calloc(limit + 1, sizeof(*hs));
	DAT_RETURN rc = DAT_SUCCESS;
	long n = 0;
	char when[64];
	if (!hs)
		return;
	while (n <= limit) {
		rc = make(k, &hs[n]);
		if (rc != DAT_SUCCESS)
			break;
		n++;
	}
	printf("%s: %ld created beside %ld, then %#x (limit %ld)\n", what, n, existing, (unsigned)rc, limit);
	CHECK_RESOURCES(rc, what);
	CHECK(n + existing == limit, "%s refused after %ld (+%ld existing), limit %ld", what, n, existing, limit);
	snprintf(when, sizeof(when), "with every %s in use", what);
	bystanders_talk(when);
	for (long i = 0; i < n; i++)
		CHECK_RC(unmake(k, hs[i]), DAT_SUCCESS);
	free(hs);
}

/* LMRs on ia_a until refused (a million: `full` only). */
static void test_lmrs(void)
{
	DAT_IA_ATTR attr = ia_attr_of(ia_a);
	long limit = attr.max_lmrs, n = 0;
	DAT_LMR_HANDLE *lmrs = calloc(limit + 1, sizeof(*lmrs));
	DAT_RETURN rc = DAT_SUCCESS;
	if (!lmrs)
		return;
	while (n <= limit) {
		DAT_REGION_DESCRIPTION region;
		DAT_LMR_CONTEXT lc;
		DAT_RMR_CONTEXT rc_;
		DAT_VLEN rlen;
		DAT_VADDR raddr;
		region.for_va = abuf + (n % 64);
		rc = dat_lmr_create(ia_a, DAT_MEM_TYPE_VIRTUAL, region, 64, pz_a, DAT_MEM_PRIV_ALL_FLAG,
				    DAT_VA_TYPE_VA, &lmrs[n], &lc, &rc_, &rlen, &raddr);
		if (rc != DAT_SUCCESS)
			break;
		n++;
	}
	printf("LMRs: %ld created beside the bystander's, then %#x (max_lmrs %ld)\n", n, (unsigned)rc, limit);
	CHECK_RESOURCES(rc, "dat_lmr_create past max_lmrs");
	CHECK(n + 1 == limit, "LMRs refused after %ld (+1 bystander's), max_lmrs %ld", n, limit);
	bystanders_talk("with every LMR in use");
	for (long i = 0; i < n; i++)
		CHECK_RC(dat_lmr_free(lmrs[i]), DAT_SUCCESS);
	free(lmrs);
}

/* IAs until refused. */
static void test_ias(void)
{
	enum { MAX = 4096 };
	static DAT_IA_HANDLE ias[MAX];
	long n = 0;
	DAT_RETURN rc = DAT_SUCCESS;
	while (n < MAX) {
		DAT_EVD_HANDLE async = DAT_HANDLE_NULL;
		rc = dat_ia_open(dat_test_ia(), 8, &async, &ias[n]);
		if (rc != DAT_SUCCESS)
			break;
		n++;
	}
	printf("IAs: %ld opened beside the bystanders' 2, then %#x\n", n, (unsigned)rc);
	CHECK_RESOURCES(rc, "dat_ia_open until refused");
	bystanders_talk("with every IA handle in use");
	for (long i = 0; i < n; i++)
		CHECK_RC(dat_ia_close(ias[i], DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
}

static int highest_fd(void)
{
	int hi = 2;
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	if (!d)
		return 1023;
	while ((e = readdir(d)) != NULL)
		if (e->d_name[0] != '.' && atoi(e->d_name) > hi)
			hi = atoi(e->d_name);
	closedir(d);
	return hi;
}

/* File descriptors: RLIMIT_NOFILE just above what is open. */
static void test_fds(void)
{
	DAT_PSP_HANDLE *psps;
	struct rlimit old, low;
	DAT_RETURN rc = DAT_SUCCESS;
	int n = 0;
	int failed = check_failed; /* this case's own failures stop it, not an earlier case's */
	struct side C;
	if (getrlimit(RLIMIT_NOFILE, &old) != 0)
		return;
	/* the PSPs' listening sockets use the fds up: an IA whose PSPs take none
	 * (rdma_cm's, on one event channel) has nothing here to run out of */
	int before = proc_entries("/proc/self/fd");
	DAT_PSP_HANDLE probe = DAT_HANDLE_NULL;
	CHECK_RC(dat_psp_create_any(ia_a, &(DAT_CONN_QUAL){ 0 }, A.cr, DAT_PSP_CONSUMER_FLAG, &probe), DAT_SUCCESS);
	int taken = proc_entries("/proc/self/fd") - before;
	if (probe)
		CHECK_RC(dat_psp_free(probe), DAT_SUCCESS);
	if (taken < 1) {
		printf("SKIP fds: a PSP of %s takes no file descriptor (%d), so PSPs cannot use them up\n",
		       dat_test_ia(), taken);
		return;
	}
	/* an EP to connect while no fd is left */
	side_evds(&C, ia_a, pz_a);
	DAT_EP_ATTR ea = ep_attr(0, 0, 16);
	side_ep(&C, &ea);
	DAT_CONN_QUAL qual = 0;
	DAT_PSP_HANDLE target = listen_any(&B, &qual);
	if (check_failed > failed) {
		/* nothing of this case left behind for the next ones to count */
		if (target)
			dat_psp_free(target);
		side_free_ep(&C);
		side_free_evds(&C);
		return;
	}

	low = old;
	low.rlim_cur = highest_fd() + 1 + 4;
	/* a PSP takes one fd: the free numbers below the limit bound their count */
	const int MAX = (int)low.rlim_cur;
	psps = calloc(MAX, sizeof(*psps));
	if (!psps)
		return;
	CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0, "setrlimit(RLIMIT_NOFILE, %ld)", (long)low.rlim_cur);
	while (n < MAX) {
		rc = dat_psp_create_any(ia_a, &(DAT_CONN_QUAL){ 0 }, A.cr, DAT_PSP_CONSUMER_FLAG, &psps[n]);
		if (rc != DAT_SUCCESS)
			break;
		n++;
	}
	printf("fds: RLIMIT_NOFILE %ld: %d PSPs created, then %#x\n", (long)low.rlim_cur, n, (unsigned)rc);
	CHECK_RESOURCES(rc, "dat_psp_create_any with no fd left");
	DAT_CNO_HANDLE cno = DAT_HANDLE_NULL;
	rc = dat_cno_create(ia_a, DAT_OS_WAIT_PROXY_AGENT_NULL, &cno);
	printf("fds: dat_cno_create = %#x\n", (unsigned)rc);
	CHECK_RESOURCES(rc, "dat_cno_create with no fd left");
	if (rc == DAT_SUCCESS)
		dat_cno_free(cno);
	DAT_IA_HANDLE ia = DAT_HANDLE_NULL;
	DAT_EVD_HANDLE async = DAT_HANDLE_NULL;
	rc = dat_ia_open(dat_test_ia(), 8, &async, &ia);
	printf("fds: dat_ia_open = %#x\n", (unsigned)rc);
	CHECK_RESOURCES(rc, "dat_ia_open with no fd left");
	if (rc == DAT_SUCCESS)
		dat_ia_close(ia, DAT_CLOSE_ABRUPT_FLAG);
	/* what needs no fd still works */
	DAT_EP_HANDLE ep = DAT_HANDLE_NULL;
	DAT_PZ_HANDLE pz = DAT_HANDLE_NULL;
	CHECK_RC(dat_pz_create(ia_a, &pz), DAT_SUCCESS);
	CHECK_RC(dat_ep_create(ia_a, pz_a, A.rcv, A.req, A.conn, &ea, &ep), DAT_SUCCESS);
	DAT_LMR_CONTEXT lc;
	DAT_LMR_HANDLE lmr = lmr_make(ia_a, pz_a, abuf, 64, DAT_MEM_PRIV_ALL_FLAG, &lc, NULL);
	bystanders_talk("at the fd limit");
	/* a connect needs a socket: accepted, then refused by an event */
	rc = dat_ep_connect(C.ep, ia_address(ia_b), qual, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT,
			    DAT_CONNECT_DEFAULT_FLAG);
	printf("fds: dat_ep_connect = %#x", (unsigned)rc);
	if (rc == DAT_SUCCESS) {
		DAT_EVENT ev;
		rc = wait_event(C.conn, &ev);
		printf(", then event %#x", rc == DAT_SUCCESS ? ev.event_number : 0);
		CHECK(rc == DAT_SUCCESS && ev.event_number != DAT_CONNECTION_EVENT_ESTABLISHED,
		      "connect with no fd left: wait = %#x, event %#x", (unsigned)rc,
		      rc == DAT_SUCCESS ? ev.event_number : 0);
	} else {
		CHECK_RESOURCES(rc, "dat_ep_connect with no fd left");
	}
	printf("\n");

	for (int i = 0; i < n; i++)
		CHECK_RC(dat_psp_free(psps[i]), DAT_SUCCESS);
	free(psps);
	CHECK(setrlimit(RLIMIT_NOFILE, &old) == 0, "restoring RLIMIT_NOFILE");
	bystanders_talk("after the fd limit is restored");
	CHECK_RC(dat_ep_free(ep), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz), DAT_SUCCESS);
	/* the refused EP connects now */
	drain(B.cr);
	CHECK_RC(dat_ep_reset(C.ep), DAT_SUCCESS);
	DAT_EP_HANDLE b_ep = B.ep;
	B.ep = DAT_HANDLE_NULL;
	struct side Bc = B;
	side_ep(&Bc, &ea);
	rc = dat_ep_connect(C.ep, ia_address(ia_b), qual, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT,
			    DAT_CONNECT_DEFAULT_FLAG);
	CHECK(rc == DAT_SUCCESS, "connect after the limit is restored = %#x", (unsigned)rc);
	if (rc == DAT_SUCCESS && accept_next(&Bc)) {
		expect_conn_event(Bc.conn, Bc.ep, DAT_CONNECTION_EVENT_ESTABLISHED, "passive ESTABLISHED after the limit");
		expect_conn_event(C.conn, C.ep, DAT_CONNECTION_EVENT_ESTABLISHED, "active ESTABLISHED after the limit");
		CHECK_RC(dat_ep_disconnect(C.ep, DAT_CLOSE_ABRUPT_FLAG), DAT_SUCCESS);
	}
	CHECK_RC(dat_psp_free(target), DAT_SUCCESS);
	CHECK_RC(dat_ep_free(Bc.ep), DAT_SUCCESS);
	drain(B.conn);
	B.ep = b_ep;
	side_free_ep(&C);
	side_free_evds(&C);
}

int main(int argc, char **argv)
{
	int full = argc > 1 && strcmp(argv[1], "full") == 0;
	/* under valgrind (check-memory.sh): slower, and valgrind keeps descriptors
	 * of its own above the soft RLIMIT_NOFILE, so the fd case (run natively
	 * and under ASan) is left out */
	int valgrind = argc > 1 && strcmp(argv[1], "valgrind") == 0;
	setvbuf(stdout, NULL, _IONBF, 0);
	alarm(test_alarm(full || valgrind ? 600 : 100)); /* a hang fails the test rather than the run */
	catch_sigpipe();
	install_own_handlers();
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async_a, &ia_a), DAT_SUCCESS);
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async_b, &ia_b), DAT_SUCCESS);
	own_handlers_kept();
	if (check_failed)
		return check_summary("test_resources");
	CHECK_RC(dat_pz_create(ia_a, &pz_a), DAT_SUCCESS);
	CHECK_RC(dat_pz_create(ia_b, &pz_b), DAT_SUCCESS);
	lmr_a = lmr_make(ia_a, pz_a, abuf, BUF, DAT_MEM_PRIV_ALL_FLAG, &lc_a, NULL);
	lmr_b = lmr_make(ia_b, pz_b, bbuf, BUF, DAT_MEM_PRIV_ALL_FLAG, &lc_b, NULL);
	side_evds(&A, ia_a, pz_a);
	side_evds(&B, ia_b, pz_b);
	DAT_EP_ATTR attr = ep_attr(0, 0, 64);
	side_ep(&A, &attr);
	side_ep(&B, &attr);
	if (check_failed || !connect_pair(&A, &B))
		return check_summary("test_resources");
	bystanders_talk("at the start");

	test_evd_overflow();
	bystanders_talk("after the EVD overflow");
	test_eps();
	test_deep_queues();
	bystanders_talk("after the deep queues");
	test_ias();
	if (!valgrind)
		test_fds();
	{
		DAT_IA_ATTR a = ia_attr_of(ia_a);
		test_objects(PZ, "PZs", a.max_pzs, 1);
		/* the async EVD and the bystander's four */
		test_objects(EVD, "EVDs", a.max_evds, 5);
		test_objects(SRQ, "SRQs", a.max_srqs, 0);
		if (full)
			test_objects(RMR, "RMRs", a.max_rmrs, 0);
	}
	if (full)
		test_lmrs();

	disconnect_pair(&A, &B);
	side_free_ep(&A);
	side_free_ep(&B);
	side_free_evds(&A);
	side_free_evds(&B);
	CHECK_RC(dat_lmr_free(lmr_a), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_b), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz_a), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz_b), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia_a, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia_b, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	check_no_sigpipe();
	return check_summary("test_resources");
}
