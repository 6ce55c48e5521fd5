/* Register, transfer, free (issue 26): a message layer without a registration
 * cache registers the user's buffer for every rendezvous message. Per round,
 * the target registers its buffer and sends its rmr_context in a small
 * message; the initiator registers its own buffer, RDMA-writes into the
 * target's (or reads from it), sends a finish message, and both free their
 * registrations. The same buffers every round, thousands of rounds:
 *
 *   page      a page-aligned 4 KiB heap buffer
 *   sub-page  2 KiB inside a page whose first KiB is a long-lived
 *             registration, which the initiator has read from often before
 *             (on rs-tcp's same-host path: memory that moved into an arena,
 *             so the per-message registrations land inside it)
 *   1 MiB     a page-aligned 1 MiB heap buffer
 *
 * each with RDMA writes, then RDMA reads. Every round checks every word that
 * moved (the target after a write, the initiator after a read) and the
 * long-lived bytes beside the sub-page buffer. Over rs-tcp every case bounds
 * its rounds' mean time, generously (a regression once made every round take
 * 11-17 ms on the same-host path: the bounds are 2 ms for 4 KiB, 10 ms for
 * 1 MiB, 10-100 times the usual); elsewhere the times are printed only (over
 * libfabric's shm each read needs the target's CPU: a loaded machine makes
 * rounds of milliseconds). Speed itself is `make bench`'s (datperf -t reg).
 *
 * Two processes: the child is the target, forked before any DAT call; it
 * learns the parent's PSP port through a pipe and reports through its exit
 * status (its failures are printed). Both open $DAT_TEST_IA (default rs-tcp). */
#define _GNU_SOURCE
#include <dat2/udat.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "dto_pair.h"

enum { CTS = 1, FINISH = 2, HELLO = 3 };

struct msg {
	uint32_t kind;
	uint32_t rmr_context;
	uint64_t addr;
	uint64_t len;
};

struct reg_case {
	const char *name;
	size_t len;     /* the per-message buffer */
	size_t offset;  /* where it starts in its page-aligned block */
	int rounds;
	int write;      /* RDMA write (else read) */
	double mean_bound_us;
};

#define BLOCK (1 << 20) /* the page and 1 MiB cases' buffers, then one more page: */
#define LONG_LIVED 1024  /* the sub-page case's long-lived bytes, at the start of that page */
#define BLOCK_LEN (BLOCK + 4096)
#define WARM_READS 2000

static const struct reg_case cases[] = {
	{ "page, write", 4096, 0, 2000, 1, 2000 },
	{ "page, read", 4096, 0, 2000, 0, 2000 },
	{ "sub-page beside a long-lived registration, write", 2048, BLOCK + LONG_LIVED, 2000, 1, 2000 },
	{ "sub-page beside a long-lived registration, read", 2048, BLOCK + LONG_LIVED, 2000, 0, 2000 },
	{ "1 MiB, write", 1 << 20, 0, 300, 1, 10000 },
	{ "1 MiB, read", 1 << 20, 0, 300, 0, 10000 },
};
#define NCASES (int)(sizeof(cases) / sizeof(cases[0]))

/* Round `round` of case `c` moves 8-byte words that differ from word to word,
 * round to round and case to case (lengths are multiples of 8). */
static uint64_t word(int c, int round, size_t w)
{
	return (w + 1) * 0x9e3779b97f4a7c15ull ^ ((uint64_t)(c * 100000 + round) << 40);
}

static void fill(void *p, size_t len, int c, int round)
{
	uint64_t *q = p;
	for (size_t w = 0; w < len / 8; w++)
		q[w] = word(c, round, w);
}

/* The first word of `p` that is not round `round`'s, or -1. */
static long mismatch(const void *p, size_t len, int c, int round)
{
	const uint64_t *q = p;
	for (size_t w = 0; w < len / 8; w++)
		if (q[w] != word(c, round, w))
			return (long)w;
	return -1;
}

static unsigned char long_lived(size_t k)
{
	return (unsigned char)(k * 17 + 5);
}

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* Both sides: a side's objects, its long-lived control buffer (one message to
 * send, two slots to receive into) and the page-aligned block the per-message
 * buffers lie in (never registered for long, but for the target's long-lived
 * bytes in its last page). */
struct end {
	struct side s;
	DAT_IA_HANDLE ia;
	DAT_PZ_HANDLE pz;
	struct msg *ctrl;
	DAT_LMR_HANDLE ctrl_lmr;
	DAT_LMR_CONTEXT ctrl_ctx;
	int next_slot;
	unsigned char *block;
};

static int open_end(struct end *e)
{
	DAT_EVD_HANDLE async = DAT_HANDLE_NULL;
	if (dat_ia_open(dat_test_ia(), 8, &async, &e->ia) != DAT_SUCCESS || dat_pz_create(e->ia, &e->pz) != DAT_SUCCESS)
		return 0;
	side_evds(&e->s, e->ia, e->pz);
	DAT_EP_ATTR a = ep_attr(0, 0, 16);
	side_ep(&e->s, &a);
	e->ctrl = calloc(3, sizeof(struct msg));
	if (posix_memalign((void **)&e->block, 4096, BLOCK_LEN) != 0 || !e->ctrl)
		return 0;
	memset(e->block, 0, BLOCK_LEN);
	e->ctrl_lmr = lmr_make(e->ia, e->pz, e->ctrl, 3 * sizeof(struct msg), DAT_MEM_PRIV_ALL_FLAG, &e->ctrl_ctx, NULL);
	return !check_failed;
}

static int post_ctrl_recv(struct end *e)
{
	int slot = 1 + e->next_slot;
	e->next_slot ^= 1;
	DAT_LMR_TRIPLET t = seg(e->ctrl_ctx, &e->ctrl[slot], sizeof(struct msg));
	return dat_ep_post_recv(e->s.ep, 1, &t, ck(slot), DAT_COMPLETION_DEFAULT_FLAG) == DAT_SUCCESS;
}

/* Sends `m` and waits for its completion. */
static int send_ctrl(struct end *e, struct msg m)
{
	DAT_EVENT ev;
	e->ctrl[0] = m;
	DAT_LMR_TRIPLET t = seg(e->ctrl_ctx, &e->ctrl[0], sizeof(struct msg));
	return dat_ep_post_send(e->s.ep, 1, &t, ck(0), DAT_COMPLETION_DEFAULT_FLAG) == DAT_SUCCESS &&
	       wait_event(e->s.req, &ev) == DAT_SUCCESS && ev.event_number == DAT_DTO_COMPLETION_EVENT &&
	       ev.event_data.dto_completion_event_data.status == DAT_DTO_SUCCESS;
}

/* Waits for the next control message, of kind `kind`. */
/* How long a control message may take: a hang guard, not a bound. The target's
 * first FINISH comes only after the initiator's WARM_READS reads, which take
 * seconds on a loaded machine over providers that need the target's CPU for
 * each read (libfabric shm without cross-memory attach). */
#define CTRL_WAIT_US (12 * WAIT_US)

static int recv_ctrl(struct end *e, uint32_t kind, struct msg *out)
{
	DAT_EVENT ev;
	DAT_COUNT nmore = 0;
	memset(&ev, 0, sizeof(ev));
	if (dat_evd_wait(e->s.rcv, CTRL_WAIT_US, 1, &ev, &nmore) != DAT_SUCCESS ||
	    ev.event_number != DAT_DTO_COMPLETION_EVENT)
		return 0;
	const DAT_DTO_COMPLETION_EVENT_DATA *d = &ev.event_data.dto_completion_event_data;
	uint64_t slot = d->user_cookie.as_64;
	if (d->status != DAT_DTO_SUCCESS || slot < 1 || slot > 2 || e->ctrl[slot].kind != kind)
		return 0;
	*out = e->ctrl[slot];
	return 1;
}

static DAT_LMR_HANDLE register_msg(struct end *e, void *p, size_t len, DAT_LMR_CONTEXT *lctx, DAT_RMR_CONTEXT *rctx)
{
	DAT_LMR_HANDLE lmr = DAT_HANDLE_NULL;
	DAT_REGION_DESCRIPTION region;
	DAT_VLEN rlen;
	DAT_VADDR raddr;
	region.for_va = p;
	if (dat_lmr_create(e->ia, DAT_MEM_TYPE_VIRTUAL, region, len, e->pz, DAT_MEM_PRIV_ALL_FLAG, DAT_VA_TYPE_VA, &lmr,
			   lctx, rctx, &rlen, &raddr) != DAT_SUCCESS)
		return DAT_HANDLE_NULL;
	return lmr;
}

/* ---- the target (child): its failures print and set its exit status ------------------------ */

#define CHILD_FAIL(code, ...)                                                  \
	do {                                                                   \
		printf("FAIL target: " __VA_ARGS__);                           \
		printf("\n");                                                  \
		fflush(stdout);                                                \
		_exit(code);                                                   \
	} while (0)

static void target(int rfd)
{
	struct end e;
	DAT_CONN_QUAL port;
	DAT_EVENT ev;
	DAT_COUNT nmore;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	/* A hang guard below run-tests.sh's 300 s: in the soft-RoCE guest
	 * (emulated CPUs) a round takes about 10 ms, the whole run over 120 s. */
	alarm(280);
	if (read(rfd, &port, sizeof(port)) != sizeof(port))
		_exit(2);
	memset(&e, 0, sizeof(e));
	if (!open_end(&e))
		CHILD_FAIL(3, "cannot open the IA or make its objects");
	/* The long-lived registration: the first KiB of the block, for the whole run. */
	unsigned char *ll = e.block + BLOCK;
	for (size_t k = 0; k < LONG_LIVED; k++)
		ll[k] = long_lived(k);
	DAT_LMR_CONTEXT ll_lctx;
	DAT_RMR_CONTEXT ll_rctx;
	if (!register_msg(&e, ll, LONG_LIVED, &ll_lctx, &ll_rctx))
		CHILD_FAIL(3, "long-lived registration");
	if (dat_ep_connect(e.s.ep, ia_address(e.ia), port, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT,
			   DAT_CONNECT_DEFAULT_FLAG) != DAT_SUCCESS ||
	    dat_evd_wait(e.s.conn, WAIT_US, 1, &ev, &nmore) != DAT_SUCCESS ||
	    ev.event_number != DAT_CONNECTION_EVENT_ESTABLISHED)
		CHILD_FAIL(5, "connect");
	struct msg hello = { HELLO, ll_rctx, (uint64_t)(uintptr_t)ll, LONG_LIVED };
	if (!send_ctrl(&e, hello))
		CHILD_FAIL(6, "hello");
	for (int c = 0; c < NCASES; c++) {
		const struct reg_case *rc = &cases[c];
		unsigned char *buf = e.block + rc->offset;
		for (int r = 0; r < rc->rounds; r++) {
			DAT_LMR_CONTEXT lctx;
			DAT_RMR_CONTEXT rctx;
			struct msg fin;
			/* For this round's finish, which comes only after our clear-to-send. */
			if (!post_ctrl_recv(&e))
				CHILD_FAIL(7, "%s round %d: post_recv", rc->name, r);
			if (rc->write)
				memset(buf, 0, rc->len);
			else
				fill(buf, rc->len, c, r);
			DAT_LMR_HANDLE lmr = register_msg(&e, buf, rc->len, &lctx, &rctx);
			if (!lmr)
				CHILD_FAIL(8, "%s round %d: dat_lmr_create", rc->name, r);
			struct msg cts = { CTS, rctx, (uint64_t)(uintptr_t)buf, rc->len };
			if (!send_ctrl(&e, cts) || !recv_ctrl(&e, FINISH, &fin))
				CHILD_FAIL(9, "%s round %d: clear-to-send / finish", rc->name, r);
			long bad = rc->write ? mismatch(buf, rc->len, c, r) : -1;
			if (bad >= 0)
				CHILD_FAIL(10, "%s round %d: word %ld is not the written one", rc->name, r, bad);
			if (dat_lmr_free(lmr) != DAT_SUCCESS)
				CHILD_FAIL(11, "%s round %d: dat_lmr_free", rc->name, r);
		}
		for (size_t k = 0; k < LONG_LIVED; k++)
			if (ll[k] != long_lived(k))
				CHILD_FAIL(12, "after %s: long-lived byte %zu changed", rc->name, k);
	}
	/* The initiator's disconnect. */
	if (dat_evd_wait(e.s.conn, WAIT_US, 1, &ev, &nmore) != DAT_SUCCESS ||
	    ev.event_number != DAT_CONNECTION_EVENT_DISCONNECTED)
		CHILD_FAIL(13, "disconnect");
	_exit(0);
}

/* ---- the initiator (parent) ----------------------------------------------------------------- */

/* Reads 8 bytes of the long-lived registration `n` times (memory peers use
 * often, as a message layer's control area is). */
static void warm_long_lived(struct end *e, const struct msg *hello)
{
	DAT_LMR_CONTEXT lctx;
	unsigned char *dst = e->block + BLOCK_LEN - 8;
	DAT_LMR_HANDLE lmr = register_msg(e, dst, 8, &lctx, NULL);
	CHECK(lmr != DAT_HANDLE_NULL, "warm-up registration");
	int ok = 1;
	for (int i = 0; i < WARM_READS && ok; i++) {
		DAT_LMR_TRIPLET t = seg(lctx, dst, 8);
		DAT_RMR_TRIPLET r = rseg(hello->rmr_context, (void *)(uintptr_t)(hello->addr + (i % 64) * 8), 8);
		ok = dat_ep_post_rdma_read(e->s.ep, 1, &t, ck(7), &r, DAT_COMPLETION_DEFAULT_FLAG) == DAT_SUCCESS &&
		     expect_dto(e->s.req, e->s.ep, 7, DAT_DTO_SUCCESS, 8, DAT_DTO_RDMA_READ, "warm-up read");
		for (size_t k = 0; ok && k < 8; k++)
			if (dst[k] != long_lived((i % 64) * 8 + k)) {
				printf("  read %d: byte %zu is %u, want %u\n", i, k, dst[k], long_lived((i % 64) * 8 + k));
				ok = 0;
			}
	}
	CHECK(ok, "%d reads of the long-lived registration, each with its bytes", WARM_READS);
	if (lmr)
		CHECK_RC(dat_lmr_free(lmr), DAT_SUCCESS);
}

static void run_case(struct end *e, int c)
{
	const struct reg_case *rc = &cases[c];
	unsigned char *buf = e->block + rc->offset;
	double total = 0, worst = 0;
	int failed = 0;

	for (int r = 0; r < rc->rounds && !failed; r++) {
		struct msg cts;
		DAT_LMR_CONTEXT lctx;
		double t0 = now_us();
		if (!recv_ctrl(e, CTS, &cts)) {
			CHECK(0, "%s round %d: no clear-to-send", rc->name, r);
			return;
		}
		/* The next round's clear-to-send (or the end: unused). */
		CHECK(post_ctrl_recv(e), "post_recv");
		if (rc->write)
			fill(buf, rc->len, c, r);
		else
			memset(buf, 0, rc->len);
		DAT_LMR_HANDLE lmr = register_msg(e, buf, rc->len, &lctx, NULL);
		if (!lmr) {
			CHECK(0, "%s round %d: dat_lmr_create", rc->name, r);
			return;
		}
		DAT_LMR_TRIPLET t = seg(lctx, buf, rc->len);
		DAT_RMR_TRIPLET rt = rseg(cts.rmr_context, (void *)(uintptr_t)cts.addr, rc->len);
		DAT_RETURN posted = rc->write ? dat_ep_post_rdma_write(e->s.ep, 1, &t, ck(r), &rt, DAT_COMPLETION_DEFAULT_FLAG)
					      : dat_ep_post_rdma_read(e->s.ep, 1, &t, ck(r), &rt, DAT_COMPLETION_DEFAULT_FLAG);
		failed = posted != DAT_SUCCESS ||
			 !expect_dto(e->s.req, e->s.ep, r, DAT_DTO_SUCCESS, rc->len, rc->write ? DAT_DTO_RDMA_WRITE : DAT_DTO_RDMA_READ,
				     rc->name);
		long bad = failed || rc->write ? -1 : mismatch(buf, rc->len, c, r);
		if (bad >= 0) {
			CHECK(0, "%s round %d: word %ld is not the one read", rc->name, r, bad);
			failed = 1;
		}
		struct msg fin = { FINISH, 0, 0, 0 };
		if (!failed && !send_ctrl(e, fin)) {
			CHECK(0, "%s round %d: finish", rc->name, r);
			failed = 1;
		}
		if (dat_lmr_free(lmr) != DAT_SUCCESS) {
			CHECK(0, "%s round %d: dat_lmr_free", rc->name, r);
			failed = 1;
		}
		double took = now_us() - t0;
		total += took;
		if (took > worst)
			worst = took;
	}
	double mean = total / rc->rounds;
	CHECK(!failed, "%s: every round moved its data", rc->name);
	if (strncmp(dat_test_ia(), "rs-tcp", 6) == 0)
		CHECK(mean <= rc->mean_bound_us,
		      "%s: a round takes %.0f us on average (bound %.0f us), the slowest %.0f us", rc->name, mean,
		      rc->mean_bound_us, worst);
	printf("  %-50s %5d rounds of %7zu B: mean %7.1f us, slowest %8.1f us\n", rc->name, rc->rounds, rc->len,
	       mean, worst);
}

int main(void)
{
	int p[2];
	setvbuf(stdout, NULL, _IOLBF, 0);
	/* A hang guard: past the target's (280 s), below run-tests.sh's 300 s. */
	alarm(290);
	if (pipe(p) != 0)
		return 1;
	pid_t child = fork();
	if (child == 0) {
		close(p[1]);
		target(p[0]);
	}
	close(p[0]);

	struct end e;
	memset(&e, 0, sizeof(e));
	CHECK(open_end(&e), "open the initiator's IA");
	DAT_CONN_QUAL port = 0;
	DAT_PSP_HANDLE psp = listen_any(&e.s, &port);
	CHECK(write(p[1], &port, sizeof(port)) == sizeof(port), "tell the target the port");
	/* The target sends its first clear-to-send right after its hello: both receives are
	 * posted before the connection exists, since on iWARP (siw) a send that finds no
	 * receive ends the connection (no receiver-not-ready retry, as RoCE has). */
	CHECK(post_ctrl_recv(&e), "post_recv (hello)");
	CHECK(post_ctrl_recv(&e), "post_recv (first clear-to-send)");
	if (!check_failed && accept_next(&e.s) &&
	    expect_conn_event(e.s.conn, e.s.ep, DAT_CONNECTION_EVENT_ESTABLISHED, "ESTABLISHED")) {
		struct msg hello;
		CHECK(recv_ctrl(&e, HELLO, &hello), "hello from the target");
		warm_long_lived(&e, &hello);
		for (int c = 0; c < NCASES && !check_failed; c++)
			run_case(&e, c);
		CHECK_RC(dat_ep_disconnect(e.s.ep, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	}
	if (psp != DAT_HANDLE_NULL)
		CHECK_RC(dat_psp_free(psp), DAT_SUCCESS);
	if (check_failed)
		kill(child, SIGKILL);
	int status = 0;
	CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "the target process ended cleanly (status %#x)", status);
	return check_summary("test_reg_per_message");
}
