/* Many connections between two processes (issue 37): N EP pairs (default
 * 1,024) connected through ONE PSP, and data moved on every one of them. A
 * correctness test with generous bounds, not a benchmark (bench/datscale
 * measures).
 *
 * The parent is the passive side, a child forked before any DAT call the
 * active one; both open $DAT_TEST_IA (default rs-tcp). On each side every EP
 * shares ONE receive EVD, ONE request EVD and ONE connection EVD, as an MPI
 * rank's do; each EP has two receives posted before it connects or is
 * accepted. Then:
 *
 *  1. connect: the child creates N EPs and connects them, 64 outstanding at a
 *     time; the parent answers each request with a new EP and dat_cr_accept;
 *     each side sees ESTABLISHED exactly once for each of its EPs;
 *  2. a send on every EP, child to parent, carrying the child's number of the
 *     EP (requests need not arrive in the order of the connects: the parent's
 *     EP k is the child's EP peer[k]): each completes once on the child, and
 *     each receive on the parent is its EP's first (cookie), on that EP, 64
 *     bytes, the bytes of the child's EP it names, every child EP named once;
 *  3. a send on every EP, parent to child, carrying the child's number of the
 *     EP and where the parent's RDMA target and source for it are: checked on
 *     the child as in 2, and the number must be the receiving EP's;
 *  4. on every EP the child writes (RDMA write) 64 bytes of its own into the
 *     parent's target for that EP, reads (RDMA read) the parent's source for
 *     that EP, and sends a "done" message: every completion once, in order,
 *     with its cookie and EP; the bytes read are that EP's; the parent's
 *     second receive on the EP is the done message, and once it has it the
 *     written bytes are in its target (a send after a write on one EP);
 *  5. the parent disconnects every EP: both sides see DISCONNECTED exactly
 *     once for each of their EPs; every EP is freed.
 *
 * The child counts its checks and hands them to the parent through a pipe;
 * the parent prints the sum. A side stops at its first failing step (the
 * step's first failures are printed, then how many); a parent that stops
 * kills the child, and a parent waiting stops waiting once the child has
 * stopped. Every wait is bounded (30 s); alarm() bounds the whole run.
 *
 * Usage: test_scale [N]   (N pairs, default 1024). */
#define _GNU_SOURCE
#include <dat2/udat.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "dto_pair.h"

#define DEFAULT_PAIRS 1024
#define MSG 64
#define WINDOW 64              /* connects outstanding; EPs with operations in flight */
#define LONG_WAIT_US 30000000u /* every wait: generous, many connections on a loaded host */
#define SLICE_US 1000000u
#define SHOWN 5                /* failures printed per step before only counting */

enum kind { TO_PARENT = 1, TO_CHILD = 2, WRITTEN = 3, READ_SRC = 4, DONE = 5 };
enum op { OP_WRITE = 0, OP_READ = 1, OP_SEND = 2 };

static int npairs = DEFAULT_PAIRS;
static const char *who = "parent";

/* Byte k of the `kind` data of EP i. */
static unsigned char pattern(int kind, int i, int k)
{
	return (unsigned char)(kind * 131 + i * 7 + (i >> 8) * 17 + k * 13 + 1);
}

static void fill(unsigned char *p, int kind, int i)
{
	for (int k = 0; k < MSG; k++)
		p[k] = pattern(kind, i, k);
}

/* Whether `p` holds the `kind` data of EP i from byte `from` on. */
static int holds(const unsigned char *p, int kind, int i, int from)
{
	for (int k = from; k < MSG; k++)
		if (p[k] != pattern(kind, i, k))
			return 0;
	return 1;
}

/* The parent's message to the child on EP i (step 3): where its memory for that EP is. */
struct where {
	uint32_t index;
	uint32_t rmr_context;
	uint64_t target; /* the child writes here */
	uint64_t source; /* the child reads here */
};

/* ---- a step's failures: the first few printed, all counted, one CHECK per step ---------------- */

static int step_bad;

static void bad(const char *fmt, ...)
{
	va_list ap;
	if (step_bad++ >= SHOWN)
		return;
	printf("  %s: ", who);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
}

/* One CHECK for the step; returns whether it passed. */
static int step_done(const char *what)
{
	CHECK(step_bad == 0, "%s: %s: %d failure(s) (the first %d above)", who, what, step_bad, SHOWN);
	int ok = step_bad == 0;
	step_bad = 0;
	return ok;
}

/* ---- one side ------------------------------------------------------------------------------- */

struct scale_side {
	DAT_IA_HANDLE ia;
	DAT_EVD_HANDLE async, req, rcv, conn, cr;
	DAT_PZ_HANDLE pz;
	DAT_EP_HANDLE *ep;
	unsigned char *mem; /* [5 * npairs * MSG]: receives (2 per EP), sends, RDMA target or local, RDMA source */
	DAT_LMR_HANDLE lmr;
	DAT_LMR_CONTEXT lc;
	DAT_RMR_CONTEXT rc;
	char *seen; /* per EP: events of the step seen */
	int *peer;  /* per EP: the other side's number of it (the parent learns them in step 2) */
};

static unsigned char *recv_slot(struct scale_side *s, int i, int j) { return s->mem + ((size_t)2 * i + j) * MSG; }
static unsigned char *send_slot(struct scale_side *s, int i) { return s->mem + ((size_t)2 * npairs + i) * MSG; }
static unsigned char *rdma_slot(struct scale_side *s, int i) { return s->mem + ((size_t)3 * npairs + i) * MSG; }
static unsigned char *src_slot(struct scale_side *s, int i) { return s->mem + ((size_t)4 * npairs + i) * MSG; }

/* The IA, a PZ, the shared EVDs, one registered area. Returns 0 if any failed. */
static int open_scale_side(struct scale_side *s, int passive)
{
	memset(s, 0, sizeof(*s));
	s->async = DAT_HANDLE_NULL;
	s->ep = calloc(npairs, sizeof(*s->ep));
	s->seen = calloc(npairs, 1);
	s->mem = calloc(5 * (size_t)npairs, MSG);
	s->peer = calloc(npairs, sizeof(*s->peer));
	if (!s->ep || !s->seen || !s->mem || !s->peer) {
		CHECK(0, "%s: out of memory", who);
		return 0;
	}
	for (int i = 0; i < npairs; i++)
		s->peer[i] = i;
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &s->async, &s->ia), DAT_SUCCESS);
	CHECK_RC(dat_pz_create(s->ia, &s->pz), DAT_SUCCESS);
	/* At most 3 requests of WINDOW EPs in flight; every EP's two receives; ESTABLISHED and
	 * DISCONNECTED of every EP. */
	CHECK_RC(dat_evd_create(s->ia, 3 * WINDOW + 16, DAT_HANDLE_NULL, DAT_EVD_DTO_FLAG, &s->req), DAT_SUCCESS);
	CHECK_RC(dat_evd_create(s->ia, 2 * npairs + 16, DAT_HANDLE_NULL, DAT_EVD_DTO_FLAG, &s->rcv), DAT_SUCCESS);
	CHECK_RC(dat_evd_create(s->ia, 2 * npairs + 16, DAT_HANDLE_NULL, DAT_EVD_CONNECTION_FLAG, &s->conn),
		 DAT_SUCCESS);
	if (passive)
		CHECK_RC(dat_evd_create(s->ia, npairs + 16, DAT_HANDLE_NULL, DAT_EVD_CR_FLAG, &s->cr), DAT_SUCCESS);
	s->lmr = lmr_make(s->ia, s->pz, s->mem, 5 * (size_t)npairs * MSG, DAT_MEM_PRIV_ALL_FLAG, &s->lc, &s->rc);
	return !check_failed;
}

/* EP i: its index as its context, its two receives posted. Returns 0 if refused. */
static int make_ep(struct scale_side *s, int i)
{
	DAT_EP_ATTR a = ep_attr(0, 0, 4);
	a.max_recv_dtos = 4;
	a.max_rdma_read_in = 1;
	a.max_rdma_read_out = 1;
	a.max_message_size = MSG;
	a.max_rdma_size = MSG;
	DAT_RETURN rc = dat_ep_create(s->ia, s->pz, s->rcv, s->req, s->conn, &a, &s->ep[i]);
	if (rc != DAT_SUCCESS) {
		const char *major = "?", *minor = "";
		dat_strerror(rc, &major, &minor);
		bad("dat_ep_create of EP %d (%d made) = %#x %s %s", i, i, (unsigned)rc, major, minor);
		s->ep[i] = DAT_HANDLE_NULL;
		return 0;
	}
	DAT_CONTEXT ctx;
	ctx.as_64 = (uint64_t)i;
	if (dat_set_consumer_context(s->ep[i], ctx) != DAT_SUCCESS)
		bad("dat_set_consumer_context of EP %d", i);
	for (int j = 0; j < 2; j++) {
		DAT_LMR_TRIPLET t = seg(s->lc, recv_slot(s, i, j), MSG);
		rc = dat_ep_post_recv(s->ep[i], 1, &t, ck(2 * (uint64_t)i + j), DAT_COMPLETION_DEFAULT_FLAG);
		if (rc != DAT_SUCCESS)
			bad("dat_ep_post_recv %d of EP %d = %#x", j, i, (unsigned)rc);
	}
	return 1;
}

/* The index of the EP a connection event names, or -1. */
static int index_of(struct scale_side *s, DAT_EP_HANDLE ep)
{
	DAT_CONTEXT ctx;
	if (dat_get_consumer_context(ep, &ctx) != DAT_SUCCESS || ctx.as_64 >= (uint64_t)npairs ||
	    s->ep[ctx.as_64] != ep)
		return -1;
	return (int)ctx.as_64;
}

/* The parent's end of the child's result pipe: readable once the child has stopped. */
static int child_result_fd = -1;

/* Waits up to LONG_WAIT_US for an event, in 1 s slices; in the parent, stops early
 * (DAT_TIMEOUT_EXPIRED) once the child has reported, as it does when it stops at a failure:
 * what the parent waits for will not come. */
static DAT_RETURN wait_long(DAT_EVD_HANDLE evd, DAT_EVENT *ev)
{
	DAT_COUNT nmore = 0;
	DAT_RETURN rc = DAT_TIMEOUT_EXPIRED;
	memset(ev, 0, sizeof(*ev));
	for (unsigned waited = 0; waited < LONG_WAIT_US; waited += SLICE_US) {
		rc = dat_evd_wait(evd, SLICE_US, 1, ev, &nmore);
		if (DAT_GET_TYPE(rc) != DAT_TIMEOUT_EXPIRED)
			return rc;
		struct pollfd p = { .fd = child_result_fd, .events = POLLIN };
		if (child_result_fd >= 0 && poll(&p, 1, 0) > 0) {
			printf("  parent: the child has stopped: no longer waiting\n");
			return rc;
		}
	}
	return rc;
}

/* A connection event `number` for one of our EPs, none seen for it before in this step.
 * Returns 0 when the wait failed (nothing more will come). */
static int take_conn_event(struct scale_side *s, DAT_EVENT_NUMBER number, int *count, const char *what)
{
	DAT_EVENT ev;
	DAT_RETURN rc = wait_long(s->conn, &ev);
	if (rc != DAT_SUCCESS) {
		bad("%s: no event after %d of %d (dat_evd_wait = %#x)", what, *count, npairs, (unsigned)rc);
		return 0;
	}
	int i = index_of(s, ev.event_data.connect_event_data.ep_handle);
	if (ev.event_number != number)
		bad("%s: event %#x for EP %d, want %#x", what, ev.event_number, i, number);
	else if (i < 0)
		bad("%s: an event for an EP that is not ours", what);
	else if (s->seen[i]++)
		bad("%s: a second event for EP %d", what, i);
	else
		(*count)++;
	return 1;
}

/* A receive on every EP, each the `j`th of its EP, 64 bytes, the `kind` data of the peer's
 * EP from byte `from` on (messages carry a header first: the child's number of the EP).
 * `learn`: the parent learns which of the child's EPs each of its own is (each once). */
static void take_receives(struct scale_side *s, int j, int kind, int from, int learn, const char *what)
{
	char *named = calloc(npairs, 1);
	if (!named) {
		bad("out of memory");
		return;
	}
	memset(s->seen, 0, npairs);
	for (int got = 0; got < npairs; got++) {
		DAT_EVENT ev;
		DAT_RETURN rc = wait_long(s->rcv, &ev);
		if (rc != DAT_SUCCESS) {
			bad("%s: no receive after %d of %d (dat_evd_wait = %#x)", what, got, npairs, (unsigned)rc);
			return;
		}
		const DAT_DTO_COMPLETION_EVENT_DATA *d = &ev.event_data.dto_completion_event_data;
		uint64_t cookie = d->user_cookie.as_64;
		int i = (int)(cookie / 2);
		if (ev.event_number != DAT_DTO_COMPLETION_EVENT || d->status != DAT_DTO_SUCCESS) {
			bad("%s: event %#x status %u (cookie %llu)", what, ev.event_number, d->status,
			    (unsigned long long)cookie);
			continue;
		}
		if (cookie >= 2 * (uint64_t)npairs || cookie % 2 != (uint64_t)j || d->ep_handle != s->ep[i]) {
			bad("%s: receive cookie %llu on EP %p: not receive %d of that EP", what, (unsigned long long)cookie,
			    (void *)d->ep_handle, j);
			continue;
		}
		if (s->seen[i]++)
			bad("%s: a second receive on EP %d", what, i);
		uint32_t c;
		memcpy(&c, recv_slot(s, i, j), sizeof(c));
		if (learn && c < (uint32_t)npairs && !named[c]++)
			s->peer[i] = (int)c;
		else if (learn)
			bad("%s: EP %d: names the child's EP %u, out of range or named before", what, i, c);
		if (d->transfered_length != MSG || d->operation != DAT_DTO_RECEIVE)
			bad("%s: EP %d: %u bytes, operation %u", what, i, (unsigned)d->transfered_length, d->operation);
		else if (c != (uint32_t)s->peer[i])
			bad("%s: EP %d: a message for EP %u, not for its peer %d", what, i, c, s->peer[i]);
		else if (!holds(recv_slot(s, i, j), kind, c, from))
			bad("%s: EP %d: the bytes are not its peer's message", what, i);
	}
	free(named);
}

/* Posts `post(s, i)` for every EP, at most WINDOW EPs in flight, and reaps `per_ep`
 * completions of each: cookie i * 4 + op in the order posted, on EP i, successful. */
static void on_every_ep(struct scale_side *s, int per_ep, void (*post)(struct scale_side *, int), const char *what)
{
	int posted = 0, reaped = 0; /* EPs */
	char *got = s->seen;
	memset(got, 0, npairs);
	while (reaped < npairs) {
		while (posted < npairs && posted - reaped < WINDOW)
			post(s, posted++);
		DAT_EVENT ev;
		DAT_RETURN rc = wait_long(s->req, &ev);
		if (rc != DAT_SUCCESS) {
			bad("%s: no completion after %d of %d EPs (dat_evd_wait = %#x)", what, reaped, npairs,
			    (unsigned)rc);
			return;
		}
		const DAT_DTO_COMPLETION_EVENT_DATA *d = &ev.event_data.dto_completion_event_data;
		uint64_t c = d->user_cookie.as_64;
		int i = (int)(c / 4), op = (int)(c % 4);
		if (ev.event_number != DAT_DTO_COMPLETION_EVENT || c / 4 >= (uint64_t)npairs || d->ep_handle != s->ep[i]) {
			bad("%s: event %#x cookie %llu ep %p: not one of ours", what, ev.event_number,
			    (unsigned long long)c, (void *)d->ep_handle);
			continue;
		}
		if (d->status != DAT_DTO_SUCCESS)
			bad("%s: EP %d operation %d: status %u", what, i, op, d->status);
		if (op != got[i])
			bad("%s: EP %d: completion of operation %d, want %d (out of order or twice)", what, i, op,
			    got[i]);
		if (op == OP_READ && !holds(rdma_slot(s, i), READ_SRC, s->peer[i], 0))
			bad("%s: EP %d: the read brought other bytes", what, i);
		if (++got[i] == per_ep)
			reaped++;
	}
}

static void post_or_bad(DAT_RETURN rc, const char *call, int i)
{
	if (rc != DAT_SUCCESS)
		bad("%s on EP %d = %#x", call, i, (unsigned)rc);
}

static void send_slot_of(struct scale_side *s, int i, uint64_t cookie)
{
	DAT_LMR_TRIPLET t = seg(s->lc, send_slot(s, i), MSG);
	post_or_bad(dat_ep_post_send(s->ep[i], 1, &t, ck(cookie), DAT_COMPLETION_DEFAULT_FLAG), "dat_ep_post_send", i);
}

/* Step 2 (child): EP i's message to the parent: its number, then its data. */
static void post_to_parent(struct scale_side *s, int i)
{
	uint32_t c = (uint32_t)i;
	fill(send_slot(s, i), TO_PARENT, i);
	memcpy(send_slot(s, i), &c, sizeof(c));
	send_slot_of(s, i, 4 * (uint64_t)i + OP_WRITE);
}

/* Step 3 (parent): the child's number of EP i, where EP i's memory is, then the data. */
static void post_where(struct scale_side *s, int i)
{
	struct where w = { (uint32_t)s->peer[i], s->rc, (uint64_t)(uintptr_t)rdma_slot(s, i),
			   (uint64_t)(uintptr_t)src_slot(s, i) };
	fill(send_slot(s, i), TO_CHILD, s->peer[i]);
	memcpy(send_slot(s, i), &w, sizeof(w));
	send_slot_of(s, i, 4 * (uint64_t)i + OP_WRITE);
}

/* Step 4 (child): on EP i a write into the parent's target, a read of its source, "done". */
static void post_rdma(struct scale_side *s, int i)
{
	struct where w;
	memcpy(&w, recv_slot(s, i, 0), sizeof(w));
	fill(src_slot(s, i), WRITTEN, i);
	memset(rdma_slot(s, i), 0, MSG);
	DAT_LMR_TRIPLET wl = seg(s->lc, src_slot(s, i), MSG);
	DAT_RMR_TRIPLET wr = { .rmr_context = w.rmr_context, .virtual_address = w.target, .segment_length = MSG };
	post_or_bad(dat_ep_post_rdma_write(s->ep[i], 1, &wl, ck(4 * (uint64_t)i + OP_WRITE), &wr,
					   DAT_COMPLETION_DEFAULT_FLAG),
		    "dat_ep_post_rdma_write", i);
	DAT_LMR_TRIPLET rl = seg(s->lc, rdma_slot(s, i), MSG);
	DAT_RMR_TRIPLET rr = { .rmr_context = w.rmr_context, .virtual_address = w.source, .segment_length = MSG };
	post_or_bad(dat_ep_post_rdma_read(s->ep[i], 1, &rl, ck(4 * (uint64_t)i + OP_READ), &rr,
					  DAT_COMPLETION_DEFAULT_FLAG),
		    "dat_ep_post_rdma_read", i);
	uint32_t c = (uint32_t)i;
	fill(send_slot(s, i), DONE, i);
	memcpy(send_slot(s, i), &c, sizeof(c));
	send_slot_of(s, i, 4 * (uint64_t)i + OP_SEND);
}

/* Step 5: every EP's DISCONNECTED, each once. */
static void take_disconnects(struct scale_side *s)
{
	int count = 0;
	memset(s->seen, 0, npairs);
	while (count < npairs && take_conn_event(s, DAT_CONNECTION_EVENT_DISCONNECTED, &count, "disconnect"))
		;
}

static void free_eps(struct scale_side *s)
{
	for (int i = 0; i < npairs; i++)
		if (s->ep[i] != DAT_HANDLE_NULL)
			post_or_bad(dat_ep_free(s->ep[i]), "dat_ep_free", i);
}

/* 1,024 connections need more descriptors than the usual soft limit of 1,024. */
static void raise_nofile(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0, "setrlimit(RLIMIT_NOFILE): %s", strerror(errno));
	}
}

/* ---- the child: the active side --------------------------------------------------------------- */

static void child(int port_fd, int result_fd)
{
	DAT_CONN_QUAL port;
	struct scale_side s;

	who = "child";
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (read(port_fd, &port, sizeof(port)) != sizeof(port))
		_exit(2); /* the parent could not listen: it says why */
	if (!open_scale_side(&s, 0))
		goto report;
	DAT_IA_ADDRESS_PTR addr = ia_address(s.ia);

	/* 1. every EP, then their connects, WINDOW outstanding */
	int made = 0, next = 0, established = 0;
	while (made < npairs && make_ep(&s, made))
		made++;
	if (!step_done("creating the EPs"))
		goto report;
	while (established < npairs) {
		while (next < npairs && next - established < WINDOW) {
			DAT_RETURN rc = dat_ep_connect(s.ep[next], addr, port, LONG_WAIT_US, 0, NULL,
						       DAT_QOS_BEST_EFFORT, DAT_CONNECT_DEFAULT_FLAG);
			if (rc != DAT_SUCCESS)
				bad("dat_ep_connect of EP %d = %#x", next, (unsigned)rc);
			next++;
		}
		if (!take_conn_event(&s, DAT_CONNECTION_EVENT_ESTABLISHED, &established, "connecting") || step_bad)
			break;
	}
	if (!step_done("connecting"))
		goto report;

	/* 2. a send on every EP */
	on_every_ep(&s, 1, post_to_parent, "sends to the parent");
	if (!step_done("sends to the parent"))
		goto report;
	/* 3. the parent's message on every EP */
	take_receives(&s, 0, TO_CHILD, sizeof(struct where), 0, "receives from the parent");
	if (!step_done("receives from the parent"))
		goto report;
	/* 4. write, read, done on every EP */
	on_every_ep(&s, 3, post_rdma, "RDMA write, RDMA read and send");
	if (!step_done("RDMA write, RDMA read and send"))
		goto report;
	/* 5. the parent disconnects */
	take_disconnects(&s);
	if (!step_done("disconnects"))
		goto report;
	free_eps(&s);
	step_done("freeing the EPs");
	CHECK_RC(dat_ia_close(s.ia, DAT_CLOSE_DEFAULT), DAT_SUCCESS);
report:;
	int counts[2] = { check_passed, check_failed };
	fflush(stdout);
	if (write(result_fd, counts, sizeof(counts)) != sizeof(counts))
		_exit(3);
	_exit(0);
}

/* ---- the parent: the passive side ------------------------------------------------------------- */

static void parent(int port_fd)
{
	struct scale_side s;
	DAT_PSP_HANDLE psp = DAT_HANDLE_NULL;
	DAT_CONN_QUAL port = 0;

	if (!open_scale_side(&s, 1))
		return;
	CHECK_RC(dat_psp_create_any(s.ia, &port, s.cr, DAT_PSP_CONSUMER_FLAG, &psp), DAT_SUCCESS);
	if (check_failed)
		return;
	CHECK(write(port_fd, &port, sizeof(port)) == sizeof(port), "tell the child the port");

	/* 1. a new EP for every request, its receives posted before the accept */
	int accepted = 0, established = 0;
	while (accepted < npairs) {
		DAT_EVENT ev;
		DAT_RETURN rc = wait_long(s.cr, &ev);
		if (rc != DAT_SUCCESS || ev.event_number != DAT_CONNECTION_REQUEST_EVENT) {
			bad("connection request %d of %d: dat_evd_wait = %#x, event %#x", accepted + 1, npairs,
			    (unsigned)rc, ev.event_number);
			break;
		}
		if (!make_ep(&s, accepted))
			break;
		rc = dat_cr_accept(ev.event_data.cr_arrival_event_data.cr_handle, s.ep[accepted], 0, NULL);
		if (rc != DAT_SUCCESS) {
			bad("dat_cr_accept of request %d = %#x", accepted + 1, (unsigned)rc);
			break;
		}
		accepted++;
	}
	if (!step_done("accepting"))
		goto out;
	while (established < npairs)
		if (!take_conn_event(&s, DAT_CONNECTION_EVENT_ESTABLISHED, &established, "accepted connections") ||
		    step_bad)
			break;
	if (!step_done("accepted connections"))
		goto out;
	printf("%d connections on one PSP\n", npairs);

	/* 2. the child's send on every EP */
	take_receives(&s, 0, TO_PARENT, sizeof(uint32_t), 1, "receives from the child");
	if (!step_done("receives from the child"))
		goto out;
	/* 3. where our memory for each EP is, on every EP; the child's reads find this */
	for (int i = 0; i < npairs; i++)
		fill(src_slot(&s, i), READ_SRC, s.peer[i]);
	on_every_ep(&s, 1, post_where, "sends to the child");
	if (!step_done("sends to the child"))
		goto out;
	/* 4. the child's "done" on every EP; its write is there by then */
	take_receives(&s, 1, DONE, sizeof(uint32_t), 0, "done messages");
	for (int i = 0; i < npairs; i++)
		if (!holds(rdma_slot(&s, i), WRITTEN, s.peer[i], 0))
			bad("EP %d: the child's RDMA write is not in its target when its next send has arrived", i);
	if (!step_done("done messages and RDMA writes"))
		goto out;
	printf("data moved on all %d connections: sends both ways, RDMA writes and reads\n", npairs);
	/* 5. we disconnect */
	for (int i = 0; i < npairs; i++)
		post_or_bad(dat_ep_disconnect(s.ep[i], DAT_CLOSE_GRACEFUL_FLAG), "dat_ep_disconnect", i);
	take_disconnects(&s);
	if (!step_done("disconnects"))
		goto out;
	free_eps(&s);
	step_done("freeing the EPs");
	CHECK_RC(dat_psp_free(psp), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(s.ia, DAT_CLOSE_DEFAULT), DAT_SUCCESS);
	return;
out:
	printf("stopped after that step (%d of %d EPs accepted)\n", accepted, npairs);
}

int main(int argc, char **argv)
{
	int port_pipe[2], result_pipe[2];

	if (argc > 2 || (argc == 2 && (npairs = atoi(argv[1])) < 1)) {
		fprintf(stderr, "usage: %s [pairs (default %d)]\n", argv[0], DEFAULT_PAIRS);
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	alarm(test_alarm(240)); /* a hang fails the test rather than the run */
	catch_sigpipe();
	raise_nofile();
	printf("test_scale: %d EP pairs over %s, two processes\n", npairs, dat_test_ia());
	if (pipe(port_pipe) != 0 || pipe(result_pipe) != 0) {
		CHECK(0, "pipe: %s", strerror(errno));
		return check_summary("test_scale");
	}
	/* Forked before any DAT call: a child of a process with provider threads must not use DAT. */
	pid_t pid = fork();
	if (pid == 0) {
		close(port_pipe[1]);
		close(result_pipe[0]);
		child(port_pipe[0], result_pipe[1]);
	}
	close(port_pipe[0]);
	close(result_pipe[1]);
	child_result_fd = result_pipe[0];
	CHECK(pid > 0, "fork: %s", strerror(errno));
	if (pid > 0)
		parent(port_pipe[1]);
	close(port_pipe[1]);
	if (check_failed && pid > 0)
		kill(pid, SIGKILL); /* it may wait for what will not come */

	int counts[2] = { 0, 0 };
	ssize_t got = pid > 0 ? read(result_pipe[0], counts, sizeof(counts)) : 0;
	int status = 0;
	if (pid > 0)
		waitpid(pid, &status, 0);
	if (got == (ssize_t)sizeof(counts)) {
		check_passed += counts[0];
		check_failed += counts[1];
	} else if (!check_failed) {
		CHECK(0, "the child reported nothing (status %#x)", status);
	}
	check_no_sigpipe();
	return check_summary("test_scale");
}
