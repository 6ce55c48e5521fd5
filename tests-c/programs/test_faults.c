/* Network faults between two hosts (issue 11, item 4), one side of the pair:
 * tests-c/scripts/net-faults.sh runs a server in one network namespace and a client
 * in the other, over rs-tcp, and injects the fault (an impaired link, the
 * link taken down, the server stopped with SIGSTOP) while they run. Each
 * side checks what DAT promises whatever the fault:
 *
 *  - data arrives intact and in order: every send's bytes are checked by
 *    the server, every RDMA read's and read-back write's by the client;
 *  - or the connection breaks: DAT_CONNECTION_EVENT_BROKEN on the connect
 *    EVD, within a bounded time of the fault (the provider's dead-peer
 *    detection, DAPLRS_PEER_TIMEOUT_MS, which the script sets);
 *  - every posted DTO completes exactly once (each cookie once: SUCCESS
 *    with the right bytes, or DAT_DTO_ERR_FLUSHED), successes before
 *    flushes, nothing after;
 *  - a stalled peer cannot make the sender buffer without bound: posts past
 *    the EP's queue are refused (DAT_INSUFFICIENT_RESOURCES) and the
 *    sender's RSS stays within its queues' worth.
 *
 *   test_faults server <port> <scenario>
 *   test_faults client <server IPv4> <port> <scenario> <detection ms>
 *
 * Scenarios: integrity (run under delay/loss/reordering/duplication),
 * linkdown, flap, idle, stop-small, stop-flood (see each function). The script
 * signals the fault to the processes: SIGUSR1 when it starts (its time is
 * the reference for the detection time), SIGUSR2 when it is over. Each side
 * prints "RESULT <scenario> <side>: ..." lines the script collects, and the
 * usual "N passed, N failed". Every wait is bounded; alarm() bounds the
 * whole run. */
#include <dat2/udat.h>
#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "dto_pair.h"

#define CHUNK (64 << 10)       /* sends and reads of the streaming scenarios */
#define BIG (256 << 10)        /* sends of stop-flood */
#define QDEPTH 64              /* the client EP's max_request_dtos */
#define NRECV 32               /* receives the server keeps posted */
#define AREA (4 << 20)         /* the server's pattern area and write area */
#define SMEM (8 * 1024 * 1024 + NRECV * BIG)
#define SLOTS (2 * QDEPTH) /* send slots: more than the queue can hold (see run_client) */
#define CSEND ((size_t)SLOTS * BIG)
#define CMEM (CSEND + (size_t)QDEPTH * CHUNK + 2 * CHUNK)
#define MAXOPS (1 << 18)

enum { K_DATA = 1, K_END = 2, K_REPLY = 3, K_HELLO = 4 };

struct msg {
	uint64_t seq;
	uint32_t kind;
	uint32_t len; /* bytes of the whole message */
	uint64_t a, b, c;
};

static unsigned char fill(uint64_t seq, size_t k)
{
	return (unsigned char)(seq * 131 + k * 7 + 3);
}

static unsigned char ppat(size_t k) /* the server's pattern area */
{
	return (unsigned char)(k * 31 + (k >> 12) + 5);
}

static volatile sig_atomic_t fault_on, fault_over;
static struct timespec t_fault, t_over;

static void on_usr1(int s)
{
	(void)s;
	clock_gettime(CLOCK_MONOTONIC, &t_fault);
	fault_on = 1;
}

static void on_usr2(int s)
{
	(void)s;
	clock_gettime(CLOCK_MONOTONIC, &t_over);
	fault_over = 1;
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + t.tv_nsec / 1e9;
}

static double ts(const struct timespec *t)
{
	return (double)t->tv_sec + t->tv_nsec / 1e9;
}

static long rss_kib(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long v = -1;
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld", &v) == 1)
			break;
	fclose(f);
	return v;
}

static const char *scenario;
static long detection_ms; /* the provider's dead-peer detection time */
static int rounds = 48;   /* of the integrity scenario: $FAULTS_ROUNDS */
static const char *role;
static struct side S;
static unsigned char *mem;
static DAT_LMR_CONTEXT lctx;
static DAT_RMR_CONTEXT rctx;

/* ---- completion bookkeeping: every cookie once, successes before flushes -------------------- */

enum { OP_SEND = 1, OP_READ = 2, OP_WRITE = 3, OP_CTRL = 4, OP_RECV = 5 };

static unsigned char seen[6][MAXOPS];
static int flushed_any[6];
static long n_success[6], n_flushed[6];

static uint64_t cookie(int op, uint64_t n)
{
	return ((uint64_t)op << 32) | n;
}

/* Accounts one DTO completion; returns its op, or 0 if it was wrong (already failed a check). */
static int account(const DAT_EVENT *ev, int want_success_only)
{
	const DAT_DTO_COMPLETION_EVENT_DATA *d = &ev->event_data.dto_completion_event_data;
	CHECK(ev->event_number == DAT_DTO_COMPLETION_EVENT, "%s: event %#x on a DTO EVD", role, ev->event_number);
	if (ev->event_number != DAT_DTO_COMPLETION_EVENT)
		return 0;
	int op = (int)(d->user_cookie.as_64 >> 32);
	uint64_t n = d->user_cookie.as_64 & 0xffffffffu;
	CHECK(op >= 1 && op <= 5 && n < MAXOPS, "%s: unknown cookie %#llx", role,
	      (unsigned long long)d->user_cookie.as_64);
	if (op < 1 || op > 5 || n >= MAXOPS)
		return 0;
	CHECK(!seen[op][n], "%s: cookie %#llx completed twice", role, (unsigned long long)d->user_cookie.as_64);
	seen[op][n]++;
	if (d->status == DAT_DTO_SUCCESS) {
		CHECK(!flushed_any[op], "%s: op %d #%llu succeeded after an earlier one was flushed", role, op,
		      (unsigned long long)n);
		n_success[op]++;
	} else {
		CHECK(d->status == DAT_DTO_ERR_FLUSHED && !want_success_only, "%s: op %d #%llu: status %#x", role, op,
		      (unsigned long long)n, d->status);
		flushed_any[op] = 1;
		n_flushed[op]++;
	}
	return op;
}

/* ---- the server --------------------------------------------------------------------------- */

static uint64_t next_data_seq = 1; /* sends arrive in order */
static long good_recv, bad_recv;
static int recv_posted[NRECV];

static void post_recv_slot(int i, uint64_t n)
{
	DAT_LMR_TRIPLET t = seg(lctx, mem + 2 * AREA + (size_t)i * BIG, BIG);
	DAT_RETURN rc = dat_ep_post_recv(S.ep, 1, &t, ck(cookie(OP_RECV, n)), DAT_COMPLETION_DEFAULT_FLAG);
	CHECK(rc == DAT_SUCCESS, "server: post_recv = %#x", (unsigned)rc);
	recv_posted[i] = rc == DAT_SUCCESS;
}

static void send_ctrl(unsigned char *buf, uint64_t n, uint32_t kind, uint64_t a, uint64_t b, uint64_t c)
{
	struct msg m = { n, kind, sizeof(m), a, b, c };
	memcpy(buf, &m, sizeof(m));
	DAT_LMR_TRIPLET t = seg(lctx, buf, sizeof(m));
	CHECK_RC(dat_ep_post_send(S.ep, 1, &t, ck(cookie(OP_CTRL, n)), DAT_COMPLETION_DEFAULT_FLAG), DAT_SUCCESS);
}

/* Checks a received message; returns its kind. */
static uint32_t check_received(const unsigned char *p, DAT_SEG_LENGTH got)
{
	struct msg m;
	if (got < sizeof(m)) {
		CHECK(0, "server: a receive of %u bytes", got);
		bad_recv++;
		return 0;
	}
	memcpy(&m, p, sizeof(m));
	if (m.kind != K_DATA)
		return m.kind;
	int ok = m.len == got && m.seq == next_data_seq;
	for (size_t k = sizeof(m); ok && k < got; k++)
		ok = p[k] == fill(m.seq, k);
	CHECK(ok, "server: send #%llu (expected #%llu) of %u bytes (header says %u) arrived damaged or out of order",
	      (unsigned long long)m.seq, (unsigned long long)next_data_seq, got, m.len);
	if (ok)
		good_recv++;
	else
		bad_recv++;
	next_data_seq = m.seq + 1;
	return K_DATA;
}

static int run_server(DAT_CONN_QUAL port)
{
	DAT_PSP_HANDLE psp = DAT_HANDLE_NULL;
	DAT_EVENT ev;
	DAT_COUNT nmore;
	uint64_t nrecv_cookie = 0;
	double t_conn_event = 0;
	DAT_EVENT_NUMBER conn_event = 0;
	unsigned char *ctrl = mem + SMEM - 0; /* control messages after the receive area */

	for (size_t k = 0; k < AREA; k++)
		mem[k] = ppat(k);
	DAT_EP_ATTR a = ep_attr(0, 0, QDEPTH);
	a.max_recv_dtos = NRECV;
	a.max_rdma_read_in = 16;
	a.max_rdma_read_out = 16;
	side_ep(&S, &a);
	CHECK_RC(dat_psp_create(S.ia, port, S.cr, DAT_PSP_CONSUMER_FLAG, &psp), DAT_SUCCESS);
	for (int i = 0; i < NRECV; i++)
		post_recv_slot(i, (uint64_t)i);
	nrecv_cookie = NRECV;
	if (check_failed)
		return 1;
	printf("READY\n");
	if (!accept_next(&S) || !expect_conn_event(S.conn, S.ep, DAT_CONNECTION_EVENT_ESTABLISHED, "ESTABLISHED"))
		return 1;
	CHECK_RC(dat_psp_free(psp), DAT_SUCCESS);
	send_ctrl(ctrl, 0, K_HELLO, (uint64_t)(uintptr_t)mem, (uint64_t)(uintptr_t)(mem + AREA), rctx);
	printf("CONNECTED\n");
	/* slot of each receive cookie */
	static int slot_of[MAXOPS];
	for (int i = 0; i < NRECV; i++)
		slot_of[i] = i;
	uint64_t ctrl_n = 1;
	double limit = now_s() + 80 + 4.0 * detection_ms / 1000 + 2.0 * rounds;
	while (now_s() < limit) {
		DAT_RETURN rc = dat_evd_wait(S.rcv, 100000, 1, &ev, &nmore);
		if (rc == DAT_SUCCESS) {
			int op = account(&ev, 0);
			const DAT_DTO_COMPLETION_EVENT_DATA *d = &ev.event_data.dto_completion_event_data;
			uint64_t n = d->user_cookie.as_64 & 0xffffffffu;
			if (op == OP_RECV && n < MAXOPS) {
				int i = slot_of[n];
				recv_posted[i] = 0;
				if (d->status == DAT_DTO_SUCCESS) {
					uint32_t kind = check_received(mem + 2 * AREA + (size_t)i * BIG, d->transfered_length);
					if (kind == K_END) {
						struct msg m;
						memcpy(&m, mem + 2 * AREA + (size_t)i * BIG, sizeof(m));
						printf("server: END after %llu sends\n", (unsigned long long)m.a);
						send_ctrl(ctrl + 64, ctrl_n++, K_REPLY, (uint64_t)good_recv,
							  (uint64_t)bad_recv, 0);
					}
					if (!conn_event && nrecv_cookie < MAXOPS) {
						slot_of[nrecv_cookie] = i;
						post_recv_slot(i, nrecv_cookie++);
					}
				}
			}
		} else {
			CHECK(DAT_GET_TYPE(rc) == DAT_TIMEOUT_EXPIRED, "server: dat_evd_wait = %#x", (unsigned)rc);
			if (DAT_GET_TYPE(rc) != DAT_TIMEOUT_EXPIRED)
				break;
		}
		while (dat_evd_dequeue(S.req, &ev) == DAT_SUCCESS)
			account(&ev, 0);
		if (!conn_event && dat_evd_dequeue(S.conn, &ev) == DAT_SUCCESS) {
			conn_event = ev.event_number;
			t_conn_event = now_s();
		}
		if (conn_event) {
			int left = 0;
			for (int i = 0; i < NRECV; i++)
				left += recv_posted[i];
			if (!left)
				break;
		}
	}
	int left = 0;
	for (int i = 0; i < NRECV; i++)
		left += recv_posted[i];
	CHECK(conn_event && !left, "server: connection event %#x, %d receives never completed", conn_event, left);
	CHECK(bad_recv == 0, "server: %ld damaged receives", bad_recv);
	printf("RESULT %s server: %ld sends received intact, %ld damaged, %ld receives flushed, event %s", scenario,
	       good_recv, bad_recv, n_flushed[OP_RECV],
	       conn_event == DAT_CONNECTION_EVENT_BROKEN	 ? "BROKEN"
	       : conn_event == DAT_CONNECTION_EVENT_DISCONNECTED ? "DISCONNECTED"
								 : "none");
	if (fault_on && conn_event == DAT_CONNECTION_EVENT_BROKEN)
		printf(" %.2f s after the fault", t_conn_event - ts(&t_fault));
	printf("\n");
	expect_empty(S.rcv, "server: receive EVD at the end");
	return 0;
}

/* ---- the client --------------------------------------------------------------------------- */

static struct msg hello;
static uint64_t send_seq = 1, reads = 0, writes = 0, ctrl_n = 1;
static uint64_t outstanding; /* requests posted, not completed */

static unsigned char *send_slot(uint64_t seq, size_t size)
{
	return mem + (size_t)(seq % SLOTS) * size;
}

static unsigned char *read_slot(uint64_t n)
{
	return mem + CSEND + (size_t)(n % QDEPTH) * CHUNK;
}

/* Posts data send number send_seq of `size` bytes; returns the DAT_RETURN. */
static DAT_RETURN post_data(size_t size)
{
	unsigned char *p = send_slot(send_seq, size);
	struct msg m = { send_seq, K_DATA, (uint32_t)size, 0, 0, 0 };
	memcpy(p, &m, sizeof(m));
	for (size_t k = sizeof(m); k < size; k++)
		p[k] = fill(send_seq, k);
	DAT_LMR_TRIPLET t = seg(lctx, p, size);
	DAT_RETURN rc = dat_ep_post_send(S.ep, 1, &t, ck(cookie(OP_SEND, send_seq)), DAT_COMPLETION_DEFAULT_FLAG);
	if (rc == DAT_SUCCESS) {
		send_seq++;
		outstanding++;
	}
	return rc;
}

/* An RDMA read of chunk n of the server's pattern area into read slot n. */
static DAT_RETURN post_read(void)
{
	uint64_t n = reads;
	unsigned char *p = read_slot(n);
	memset(p, 0, CHUNK);
	DAT_LMR_TRIPLET l = seg(lctx, p, CHUNK);
	DAT_RMR_TRIPLET r;
	r.rmr_context = (DAT_RMR_CONTEXT)hello.c;
	r.virtual_address = hello.a + (n % (AREA / CHUNK)) * CHUNK;
	r.segment_length = CHUNK;
	DAT_RETURN rc = dat_ep_post_rdma_read(S.ep, 1, &l, ck(cookie(OP_READ, n)), &r, DAT_COMPLETION_DEFAULT_FLAG);
	if (rc == DAT_SUCCESS) {
		reads++;
		outstanding++;
	}
	return rc;
}

static int read_intact(uint64_t n)
{
	const unsigned char *p = read_slot(n);
	size_t base = (size_t)(n % (AREA / CHUNK)) * CHUNK;
	for (size_t k = 0; k < CHUNK; k++)
		if (p[k] != ppat(base + k))
			return 0;
	return 1;
}

/* Waits up to `us` for one request completion and accounts it (reads: contents checked).
 * Returns 1 if one came. */
static int reap(unsigned us, int want_success_only)
{
	DAT_EVENT ev;
	DAT_COUNT nmore;
	DAT_RETURN rc = dat_evd_wait(S.req, us, 1, &ev, &nmore);
	if (rc != DAT_SUCCESS) {
		CHECK(DAT_GET_TYPE(rc) == DAT_TIMEOUT_EXPIRED, "client: dat_evd_wait = %#x", (unsigned)rc);
		return 0;
	}
	int op = account(&ev, want_success_only);
	const DAT_DTO_COMPLETION_EVENT_DATA *d = &ev.event_data.dto_completion_event_data;
	uint64_t n = d->user_cookie.as_64 & 0xffffffffu;
	if (op && op != OP_CTRL)
		outstanding--;
	if (op == OP_READ && d->status == DAT_DTO_SUCCESS)
		CHECK(d->transfered_length == CHUNK && read_intact(n), "client: RDMA read #%llu: %u bytes, damaged",
		      (unsigned long long)n, d->transfered_length);
	return 1;
}

static DAT_EVENT_NUMBER conn_event;
static double t_conn_event;

static void poll_conn(void)
{
	DAT_EVENT ev;
	if (!conn_event && dat_evd_dequeue(S.conn, &ev) == DAT_SUCCESS) {
		conn_event = ev.event_number;
		t_conn_event = now_s();
	}
}

/* Every outstanding request completes (flushed or not); then nothing more comes. */
static void collect_all(const char *what, int want_success_only)
{
	double limit = now_s() + 30;
	while (outstanding > 0 && now_s() < limit)
		reap(100000, want_success_only);
	CHECK(outstanding == 0, "client %s: %llu requests never completed", what, (unsigned long long)outstanding);
	expect_empty(S.req, what);
}

/* Sends END, waits for the server's REPLY: it must have received every data send intact. */
static void end_exchange(void)
{
	unsigned char *buf = mem + CSEND + (size_t)QDEPTH * CHUNK + CHUNK;
	struct msg m = { 0, K_END, sizeof(m), send_seq - 1, 0, 0 };
	memcpy(buf, &m, sizeof(m));
	DAT_LMR_TRIPLET t = seg(lctx, buf, sizeof(m));
	CHECK_RC(dat_ep_post_send(S.ep, 1, &t, ck(cookie(OP_CTRL, ctrl_n++)), DAT_COMPLETION_DEFAULT_FLAG),
		 DAT_SUCCESS);
	reap(WAIT_US, 1);
	DAT_EVENT ev;
	DAT_RETURN rc = wait_event(S.rcv, &ev);
	CHECK(rc == DAT_SUCCESS && account(&ev, 1) == OP_RECV, "client: no REPLY (wait = %#x)", (unsigned)rc);
	struct msg r;
	memcpy(&r, mem + CSEND + (size_t)QDEPTH * CHUNK, sizeof(r));
	CHECK(r.kind == K_REPLY && r.a == send_seq - 1 && r.b == 0,
	      "client: server got %llu of %llu sends intact, %llu damaged", (unsigned long long)r.a,
	      (unsigned long long)(send_seq - 1), (unsigned long long)r.b);
}

static void post_reply_recv(void)
{
	DAT_LMR_TRIPLET t = seg(lctx, mem + CSEND + (size_t)QDEPTH * CHUNK, CHUNK);
	CHECK_RC(dat_ep_post_recv(S.ep, 1, &t, ck(cookie(OP_RECV, ctrl_n++)), DAT_COMPLETION_DEFAULT_FLAG),
		 DAT_SUCCESS);
}

static const char *event_name(DAT_EVENT_NUMBER e)
{
	return e == DAT_CONNECTION_EVENT_BROKEN		? "BROKEN"
	       : e == DAT_CONNECTION_EVENT_DISCONNECTED ? "DISCONNECTED"
	       : e == DAT_CONNECTION_EVENT_TIMED_OUT	? "TIMED_OUT"
	       : e					? "other"
							: "none";
}

/* Under delay, loss, reordering and duplication: rounds of sends, an RDMA write read back, and an
 * RDMA read of the pattern area, every byte checked; then END. */
static void sc_integrity(void)
{
	unsigned char *wsrc = mem + CSEND + (size_t)QDEPTH * CHUNK + CHUNK + 4096;
	double t0 = now_s();
	for (int r = 0; r < rounds && !check_failed; r++) {
		for (int i = 0; i < 4; i++)
			CHECK_RC(post_data(CHUNK), DAT_SUCCESS);
		/* RDMA write of 16 KiB into the server's write area, read back */
		size_t wlen = 16 << 10;
		uint64_t off = (uint64_t)(r % 64) * wlen;
		for (size_t k = 0; k < wlen; k++)
			wsrc[k] = fill((uint64_t)r + 1000, k);
		DAT_LMR_TRIPLET l = seg(lctx, wsrc, wlen);
		DAT_RMR_TRIPLET rt;
		rt.rmr_context = (DAT_RMR_CONTEXT)hello.c;
		rt.virtual_address = hello.b + off;
		rt.segment_length = wlen;
		CHECK_RC(dat_ep_post_rdma_write(S.ep, 1, &l, ck(cookie(OP_WRITE, writes++)), &rt,
						DAT_COMPLETION_DEFAULT_FLAG),
			 DAT_SUCCESS);
		outstanding++;
		CHECK_RC(post_read(), DAT_SUCCESS);
		while (outstanding > 0 && reap(WAIT_US, 1))
			;
		CHECK(outstanding == 0, "client: round %d: %llu requests pending", r, (unsigned long long)outstanding);
		/* read the written range back */
		unsigned char *back = read_slot(reads);
		memset(back, 0, wlen);
		DAT_LMR_TRIPLET lb = seg(lctx, back, wlen);
		CHECK_RC(dat_ep_post_rdma_read(S.ep, 1, &lb, ck(cookie(OP_WRITE, writes++)), &rt,
					       DAT_COMPLETION_DEFAULT_FLAG),
			 DAT_SUCCESS);
		outstanding++;
		reap(WAIT_US, 1);
		int same = memcmp(back, wsrc, wlen) == 0;
		CHECK(same, "client: round %d: RDMA write read back differs", r);
	}
	end_exchange();
	poll_conn();
	CHECK(!conn_event, "client: connection event %s under an impaired link", event_name(conn_event));
	printf("RESULT integrity client: %llu sends, %llu RDMA reads, %llu RDMA writes+read-backs intact in %.2f s\n",
	       (unsigned long long)(send_seq - 1), (unsigned long long)reads, (unsigned long long)writes / 2,
	       now_s() - t0);
}

/* Keeps 16 sends and 8 RDMA reads of CHUNK outstanding. */
static void refill(void)
{
	while (outstanding < 24) {
		uint64_t sends_out = (send_seq - 1) - (uint64_t)(n_success[OP_SEND] + n_flushed[OP_SEND]);
		DAT_RETURN rc = sends_out < 16 ? post_data(CHUNK) : post_read();
		CHECK(rc == DAT_SUCCESS, "client: post while streaming = %#x", (unsigned)rc);
		if (rc != DAT_SUCCESS)
			return;
	}
}

/* Streams until the connection event after the fault, which must be BROKEN within the bound;
 * then every request completes once. `flap`: the link comes back before the detection time:
 * the stream goes on intact, no event. */
static void sc_stream(int flap)
{
	long bound_ms = detection_ms + 20000;
	int announced = 0;
	long after_over = 0;
	double limit = now_s() + 70 + 2.0 * detection_ms / 1000;
	while (now_s() < limit) {
		if (!conn_event)
			refill();
		reap(50000, 0);
		poll_conn();
		if (!announced && n_success[OP_SEND] + n_success[OP_READ] >= 48) {
			printf("STREAMING\n");
			announced = 1;
		}
		if (conn_event)
			break;
		if (fault_on && !flap && (now_s() - ts(&t_fault)) * 1000 > bound_ms)
			break;
		if (flap && fault_over && ++after_over > 200)
			break;
	}
	CHECK(fault_on, "client: the fault never came");
	if (flap) {
		CHECK(!conn_event, "client: %s although the link came back", event_name(conn_event));
		collect_all("after the flap", 1);
		end_exchange();
		printf("RESULT flap client: link down %.2f s, no event, %llu sends and %llu reads intact\n",
		       ts(&t_over) - ts(&t_fault), (unsigned long long)(send_seq - 1), (unsigned long long)reads);
		return;
	}
	double det = t_conn_event - ts(&t_fault);
	CHECK(conn_event == DAT_CONNECTION_EVENT_BROKEN, "client: connection event %s %.2f s after the link went down",
	      event_name(conn_event), conn_event ? det : (double)bound_ms / 1000);
	collect_all("after the link went down", 0);
	if (conn_event)
		printf("RESULT linkdown client: %s %.2f s after the link went down; ", event_name(conn_event), det);
	else
		printf("RESULT linkdown client: no event %.0f s after the link went down; ", (double)bound_ms / 1000);
	printf("%ld sends and %ld reads succeeded, %ld and %ld flushed, each once\n", n_success[OP_SEND],
	       n_success[OP_READ], n_flushed[OP_SEND], n_flushed[OP_READ]);
}

/* The link goes down on an idle connection (nothing outstanding but a receive): keepalive
 * notices, BROKEN within the bound, the receive flushed. */
static void sc_idle(void)
{
	long bound_ms = detection_ms + 20000;
	printf("CONNECTED\n");
	double limit = now_s() + 30;
	while (!fault_on && now_s() < limit)
		usleep(10000);
	CHECK(fault_on, "client: the fault never came");
	while (!conn_event && (now_s() - ts(&t_fault)) * 1000 < bound_ms) {
		usleep(20000);
		poll_conn();
	}
	double det = t_conn_event - ts(&t_fault);
	CHECK(conn_event == DAT_CONNECTION_EVENT_BROKEN, "client: connection event %s on an idle connection",
	      event_name(conn_event));
	if (conn_event)
		printf("RESULT idle client: %s %.2f s after the link went down on an idle connection\n",
		       event_name(conn_event), det);
}

/* The server is stopped (SIGSTOP) with a few small requests posted after: for three detection
 * times nothing completes and the connection stays up (its kernel still acknowledges, and takes
 * all the bytes: its receive window never closes); once it continues, everything completes
 * intact. */
static void sc_stop_small(void)
{
	printf("CONNECTED\n");
	double limit = now_s() + 30;
	while (!fault_on && now_s() < limit)
		usleep(10000);
	CHECK(fault_on, "client: the server was never stopped");
	/* 1 KiB sends and read requests: they fit in the stopped peer's receive window, so its
	 * kernel takes them all (more than the window: see stop-flood) */
	for (int i = 0; i < 4; i++) {
		CHECK_RC(post_data(1024), DAT_SUCCESS);
		CHECK_RC(post_read(), DAT_SUCCESS);
	}
	double wait_until = now_s() + 3.0 * detection_ms / 1000;
	long early = 0;
	while (now_s() < wait_until) {
		early += reap(50000, 1);
		poll_conn();
	}
	CHECK(early == 0 && !conn_event, "client: %ld completions, event %s while the server was stopped", early,
	      event_name(conn_event));
	printf("WAITED\n");
	limit = now_s() + 30;
	while (!fault_over && now_s() < limit)
		usleep(10000);
	collect_all("after the server continued", 1);
	if (!conn_event)
		end_exchange();
	poll_conn();
	CHECK(!conn_event, "client: event %s", event_name(conn_event));
	printf("RESULT stop-small client: stopped %.2f s, connection up, 8 DTOs waited, completed intact after "
	       "SIGCONT\n",
	       ts(&t_over) - ts(&t_fault));
}

/* The server is stopped and the client keeps posting 256 KiB sends: posts past the queue are
 * refused, RSS stays bounded; the connection either stays up (DTOs wait) or breaks (BROKEN,
 * everything flushed once) when the peer's receive window has stayed shut for the detection
 * time (TCP_USER_TIMEOUT applies to zero-window probing since Linux 5.11). */
static void sc_stop_flood(void)
{
	printf("CONNECTED\n");
	double limit = now_s() + 30;
	while (!fault_on && now_s() < limit)
		usleep(10000);
	CHECK(fault_on, "client: the server was never stopped");
	long rss0 = rss_kib(), rss_max = rss0;
	long refused = 0, other = 0, posted = 0;
	DAT_RETURN other_rc = 0;
	double until = now_s() + 3.0 * detection_ms / 1000 + 5;
	while (now_s() < until && !conn_event) {
		DAT_RETURN rc = post_data(BIG);
		if (rc == DAT_SUCCESS)
			posted++;
		else if (DAT_GET_TYPE(rc) == DAT_INSUFFICIENT_RESOURCES)
			refused++;
		else
			other++, other_rc = rc;
		if (rc != DAT_SUCCESS)
			reap(1000, 0);
		poll_conn();
		long r = rss_kib();
		if (r > rss_max)
			rss_max = r;
	}
	double det = t_conn_event - ts(&t_fault);
	/* The queues' worth: QDEPTH sends of BIG, which the provider may copy once. */
	long bound_kib = 2L * QDEPTH * BIG / 1024 + 16 * 1024;
	CHECK(other == 0, "client: %ld posts failed with %#x (want success or DAT_INSUFFICIENT_RESOURCES)", other,
	      (unsigned)other_rc);
	CHECK(refused > 0, "client: no post was refused although the peer was stopped");
	CHECK(rss_max - rss0 <= bound_kib, "client: RSS grew by %ld KiB (bound %ld KiB) while the peer was stopped",
	      rss_max - rss0, bound_kib);
	printf("FLOODED\n");
	limit = now_s() + 30;
	while (!fault_over && now_s() < limit)
		usleep(10000);
	CHECK(conn_event == 0 || conn_event == DAT_CONNECTION_EVENT_BROKEN, "client: event %s", event_name(conn_event));
	collect_all("after the server continued", 0);
	if (!conn_event)
		end_exchange();
	printf("RESULT stop-flood client: %ld posts accepted, %ld refused (DAT_INSUFFICIENT_RESOURCES), RSS +%ld KiB "
	       "(bound %ld); %s",
	       posted, refused, rss_max - rss0, bound_kib, event_name(conn_event));
	if (conn_event)
		printf(" %.2f s after SIGSTOP; %ld sends succeeded, %ld flushed, each once\n", det, n_success[OP_SEND],
		       n_flushed[OP_SEND]);
	else
		printf(", every send completed intact after SIGCONT\n");
}

static int run_client(const char *server, DAT_CONN_QUAL port)
{
	struct sockaddr_in sin;
	DAT_EVENT ev;
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_port = 0;
	CHECK(inet_pton(AF_INET, server, &sin.sin_addr) == 1, "bad address %s", server);
	DAT_EP_ATTR a = ep_attr(0, 0, QDEPTH);
	a.max_rdma_read_in = 16;
	a.max_rdma_read_out = 16;
	side_ep(&S, &a);
	/* the server's HELLO, then its REPLY, land here */
	DAT_LMR_TRIPLET t = seg(lctx, mem + CSEND + (size_t)QDEPTH * CHUNK, CHUNK);
	CHECK_RC(dat_ep_post_recv(S.ep, 1, &t, ck(cookie(OP_RECV, 0)), DAT_COMPLETION_DEFAULT_FLAG), DAT_SUCCESS);
	CHECK_RC(dat_ep_connect(S.ep, (DAT_IA_ADDRESS_PTR)&sin, port, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT,
				DAT_CONNECT_DEFAULT_FLAG),
		 DAT_SUCCESS);
	if (!expect_conn_event(S.conn, S.ep, DAT_CONNECTION_EVENT_ESTABLISHED, "client ESTABLISHED"))
		return 1;
	/* A send's slot is reused SLOTS sends later: the queue must hold fewer (a post refused for a
	 * full queue fills the slot of a send that may still be queued, which must have completed). */
	DAT_EP_PARAM param;
	CHECK_RC(dat_ep_query(S.ep, DAT_EP_FIELD_ALL, &param), DAT_SUCCESS);
	CHECK(param.ep_attr.max_request_dtos >= QDEPTH && param.ep_attr.max_request_dtos < SLOTS,
	      "client: max_request_dtos %d", param.ep_attr.max_request_dtos);
	DAT_RETURN rc = wait_event(S.rcv, &ev);
	CHECK(rc == DAT_SUCCESS && account(&ev, 1) == OP_RECV, "client: no HELLO (wait = %#x)", (unsigned)rc);
	memcpy(&hello, mem + CSEND + (size_t)QDEPTH * CHUNK, sizeof(hello));
	CHECK(hello.kind == K_HELLO, "client: HELLO kind %u", hello.kind);
	if (check_failed)
		return 1;
	post_reply_recv();
	if (!strcmp(scenario, "integrity"))
		sc_integrity();
	else if (!strcmp(scenario, "linkdown"))
		sc_stream(0);
	else if (!strcmp(scenario, "flap"))
		sc_stream(1);
	else if (!strcmp(scenario, "idle"))
		sc_idle();
	else if (!strcmp(scenario, "stop-small"))
		sc_stop_small();
	else if (!strcmp(scenario, "stop-flood"))
		sc_stop_flood();
	else
		CHECK(0, "unknown scenario %s", scenario);
	poll_conn();
	if (!conn_event) {
		CHECK_RC(dat_ep_disconnect(S.ep, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
		expect_conn_event(S.conn, S.ep, DAT_CONNECTION_EVENT_DISCONNECTED, "client DISCONNECTED");
	}
	/* the reply receive, if the connection broke first */
	while (dat_evd_dequeue(S.rcv, &ev) == DAT_SUCCESS)
		account(&ev, 0);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	if (argc < 4 || (strcmp(argv[1], "server") && strcmp(argv[1], "client")) ||
	    (!strcmp(argv[1], "client") && argc < 6)) {
		fprintf(stderr, "usage: test_faults server <port> <scenario>\n"
				"       test_faults client <server IPv4> <port> <scenario> <detection ms>\n");
		return 2;
	}
	int server = !strcmp(argv[1], "server");
	role = argv[1];
	scenario = server ? argv[3] : argv[4];
	DAT_CONN_QUAL port = (DAT_CONN_QUAL)strtoul(server ? argv[2] : argv[3], NULL, 0);
	detection_ms = server ? 0 : strtol(argv[5], NULL, 0);
	if (server) /* the provider's detection time: its variable, or its default */
		detection_ms = getenv("DAPLRS_PEER_TIMEOUT_MS") ? atol(getenv("DAPLRS_PEER_TIMEOUT_MS")) : 30000;
	if (getenv("FAULTS_ROUNDS") && atoi(getenv("FAULTS_ROUNDS")) > 0)
		rounds = atoi(getenv("FAULTS_ROUNDS"));
	/* integrity rounds take well under 2 s each */
	alarm(120 + (unsigned)(5 * detection_ms / 1000) + 2 * (unsigned)rounds);
	printf("PID %d\n", (int)getpid()); /* ip netns exec may run us in a child: signals go here */
	catch_sigpipe();
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_usr1;
	sigaction(SIGUSR1, &sa, NULL);
	sa.sa_handler = on_usr2;
	sigaction(SIGUSR2, &sa, NULL);

	DAT_EVD_HANDLE async = DAT_HANDLE_NULL;
	DAT_IA_HANDLE ia;
	DAT_PZ_HANDLE pz;
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async, &ia), DAT_SUCCESS);
	CHECK_RC(dat_pz_create(ia, &pz), DAT_SUCCESS);
	size_t size = server ? SMEM + 4096 : CMEM + 4096 + CHUNK;
	mem = malloc(size);
	memset(mem, 0, size);
	DAT_LMR_HANDLE lmr = lmr_make(ia, pz, mem, size, DAT_MEM_PRIV_ALL_FLAG, &lctx, &rctx);
	side_evds(&S, ia, pz);
	if (!check_failed) {
		if (server)
			run_server(port);
		else
			run_client(argv[2], port);
	}
	if (S.ep != DAT_HANDLE_NULL)
		side_free_ep(&S);
	side_free_evds(&S);
	CHECK_RC(dat_lmr_free(lmr), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia, DAT_CLOSE_ABRUPT_FLAG), DAT_SUCCESS);
	check_no_sigpipe();
	char name[64];
	snprintf(name, sizeof(name), "test_faults %s %s", role, scenario);
	return check_summary(name);
}
