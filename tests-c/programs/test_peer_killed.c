/* A peer process killed mid-transfer (issue 4): the survivor's connect EVD
 * gets DISCONNECTED or BROKEN, every DTO it had outstanding completes exactly
 * once (successfully with the right bytes if it finished before the kill,
 * else DAT_DTO_ERR_FLUSHED), and nothing hangs: every wait has a timeout,
 * alarm() bounds the whole test and run-tests.sh bounds it again.
 *
 * Two children, forked before the parent makes any DAT call (a child of a
 * process whose progress threads hold locks must not use DAT), each open
 * their own IA ($DAT_TEST_IA, default rs-tcp) and connect to a PSP of the
 * parent at that IA's address:
 *  1. streams 64 KiB sends into the parent's receives; the parent has
 *     receives and 32 RDMA reads of the child's memory outstanding when it
 *     SIGKILLs the child: each completes once, SUCCESS or FLUSHED.
 *  2. connects and sends its memory's address, then idles; the parent stops
 *     it (SIGSTOP), posts RDMA reads and sends it can no longer answer, and
 *     SIGKILLs it: every one of them, and every receive, is FLUSHED. */
#include <dat2/udat.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "dto_pair.h"

#define CHUNK 65536
#define CHILD_MEM (4 << 20)
#define PARENT_MEM (8 << 20)
#define READ_AREA (5 << 20)

struct hello {
	uint64_t addr;
	uint32_t rmr_context;
	uint32_t len;
};

static unsigned char pattern(size_t k)
{
	return (unsigned char)(k * 31 + 7);
}

static DAT_EP_ATTR attr(void)
{
	DAT_EP_ATTR a = ep_attr(0, 0, 128);
	a.max_rdma_read_in = 64;
	a.max_rdma_read_out = 64;
	return a;
}

/* ---- the children (exit status only; they are killed anyway) ----------------------------------- */

/* The sends a streaming child makes: one for each receive round_streaming posts. */
enum { STREAM_SENDS = 64 };

static void child(int rfd, int streaming)
{
	DAT_CONN_QUAL port;
	DAT_IA_HANDLE ia;
	DAT_EVD_HANDLE async = DAT_HANDLE_NULL;
	DAT_PZ_HANDLE pz;
	struct side s;
	DAT_LMR_CONTEXT lc;
	DAT_RMR_CONTEXT rc;
	DAT_EVENT ev;
	DAT_COUNT nmore;
	unsigned char *mem;
	struct hello *h;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	/* Everything but the connect before the port arrives: the parent's wait
	 * for the connection request (WAIT_US) then covers the connect alone, not
	 * a fresh process's first dat_ia_open (libfabric's provider discovery,
	 * ofi_rxm's endpoint buffers), which under emulation took past it. */
	mem = malloc(CHILD_MEM);
	for (size_t k = 0; k < CHILD_MEM; k++)
		mem[k] = pattern(k);
	h = malloc(sizeof(*h));
	if (dat_ia_open(dat_test_ia(), 8, &async, &ia) != DAT_SUCCESS || dat_pz_create(ia, &pz) != DAT_SUCCESS)
		_exit(3);
	side_evds(&s, ia, pz);
	DAT_EP_ATTR a = attr();
	side_ep(&s, &a);
	lmr_make(ia, pz, mem, CHILD_MEM, DAT_MEM_PRIV_ALL_FLAG, &lc, &rc);
	DAT_LMR_HANDLE hl;
	DAT_LMR_CONTEXT hc;
	hl = lmr_make(ia, pz, h, sizeof(*h), DAT_MEM_PRIV_ALL_FLAG, &hc, NULL);
	(void)hl;
	if (check_failed)
		_exit(4);
	if (read(rfd, &port, sizeof(port)) != sizeof(port))
		_exit(2);
	alarm(60);
	if (dat_ep_connect(s.ep, ia_address(ia), port, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT, DAT_CONNECT_DEFAULT_FLAG) !=
		    DAT_SUCCESS ||
	    dat_evd_wait(s.conn, WAIT_US, 1, &ev, &nmore) != DAT_SUCCESS ||
	    ev.event_number != DAT_CONNECTION_EVENT_ESTABLISHED)
		_exit(5);
	h->addr = (uint64_t)(uintptr_t)mem;
	h->rmr_context = rc;
	h->len = CHILD_MEM;
	DAT_LMR_TRIPLET t = seg(hc, h, sizeof(*h));
	if (dat_ep_post_send(s.ep, 1, &t, ck(0), 0) != DAT_SUCCESS)
		_exit(6);
	/* streaming: keep 8 sends of 64 KiB in flight, from offsets 0, 64K, ... (mod 32 chunks),
	 * no more than the parent has receives for (STREAM_SENDS): a send with no receive is
	 * the consumer's error, and what a transport does with it differs (an RDMA NIC holds
	 * the sender, iWARP breaks the connection, libfabric's tcp provider stops reading the
	 * stream there, and with it the news of this process's death). */
	uint64_t posted = 0, done = 0;
	for (;;) {
		while (streaming && posted < STREAM_SENDS && posted - done < 8) {
			DAT_LMR_TRIPLET d = seg(lc, mem + (posted % 32) * CHUNK, CHUNK);
			if (dat_ep_post_send(s.ep, 1, &d, ck(++posted), 0) != DAT_SUCCESS)
				_exit(7);
		}
		DAT_RETURN rc2 = dat_evd_wait(s.req, 1000000, 1, &ev, &nmore);
		if (rc2 == DAT_SUCCESS) {
			if (ev.event_data.dto_completion_event_data.status != DAT_DTO_SUCCESS)
				_exit(0);
			if (ev.event_data.dto_completion_event_data.user_cookie.as_64 != 0)
				done++;
		} else if (DAT_GET_TYPE(rc2) != DAT_TIMEOUT_EXPIRED) {
			_exit(8);
		}
	}
}

static pid_t spawn(int streaming, int *wfd)
{
	int p[2];
	if (pipe(p) != 0)
		return -1;
	pid_t pid = fork();
	if (pid == 0) {
		close(p[1]);
		child(p[0], streaming);
		_exit(1);
	}
	close(p[0]);
	*wfd = p[1];
	return pid;
}

/* ---- the parent ----------------------------------------------------------------------------- */

static DAT_IA_HANDLE ia;
static int is_tcp; /* rs-tcp: see round_stopped */
/* rs-tcp with its same-host path off (DAPLRS_SAME_HOST=never): only then
 * does the stopped child's own process serve RDMA reads (see round_stopped) */
static int reads_need_the_peer;
/* iWARP: no RNR retry, a send without a receive ends the connection (see
 * round_stopped). */
static int iwarp;
static DAT_PZ_HANDLE pz;
static struct side P;
static unsigned char *pmem;
static DAT_LMR_CONTEXT plc;

/* Accepts the child's connection and takes its hello from receive 0.
 * Receives 1..nrecv (64 KiB each) are posted before the accept. */
static int meet_child(int wfd, int nrecv, struct hello *h)
{
	DAT_CONN_QUAL port = 0;
	DAT_PSP_HANDLE psp = listen_any(&P, &port);
	DAT_LMR_TRIPLET r = seg(plc, pmem, 64);
	int ok;
	CHECK_RC(dat_ep_post_recv(P.ep, 1, &r, ck(0x1000), 0), DAT_SUCCESS);
	for (int i = 1; i <= nrecv; i++) {
		r = seg(plc, pmem + (size_t)i * CHUNK, CHUNK);
		CHECK_RC(dat_ep_post_recv(P.ep, 1, &r, ck(0x1000 + i), 0), DAT_SUCCESS);
	}
	CHECK(write(wfd, &port, sizeof(port)) == sizeof(port), "port to the child");
	close(wfd);
	ok = accept_next(&P) && expect_conn_event(P.conn, P.ep, DAT_CONNECTION_EVENT_ESTABLISHED, "ESTABLISHED") &&
	     expect_dto(P.rcv, P.ep, 0x1000, DAT_DTO_SUCCESS, sizeof(*h), DAT_DTO_RECEIVE, "child's hello");
	CHECK_RC(dat_psp_free(psp), DAT_SUCCESS);
	memcpy(h, pmem, sizeof(*h));
	return ok;
}

static void kill_and_reap(pid_t pid)
{
	int st = 0;
	CHECK(kill(pid, SIGKILL) == 0, "kill: %s", strerror(errno));
	CHECK(waitpid(pid, &st, 0) == pid && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL,
	      "child did not die of SIGKILL (status %#x)", st);
}

/* Collects completions until every expected cookie was seen once; returns
 * how many were seen. `status_ok(i, status, len)` judges each. */
struct want {
	uint64_t base;
	int n;
	DAT_DTOS op;
	int *seen;
	int *flushed;
};

static void collect(DAT_EVD_HANDLE evd, struct want *w, int nw, int (*good)(struct want *, int, const DAT_EVENT *),
		    const char *what)
{
	int left = 0;
	for (int k = 0; k < nw; k++)
		left += w[k].n;
	while (left > 0) {
		DAT_EVENT ev;
		DAT_RETURN rc = wait_event(evd, &ev);
		CHECK(rc == DAT_SUCCESS, "%s: %d completions missing (wait = %#x)", what, left, (unsigned)rc);
		if (rc != DAT_SUCCESS)
			return;
		const DAT_DTO_COMPLETION_EVENT_DATA *d = &ev.event_data.dto_completion_event_data;
		int matched = 0;
		for (int k = 0; k < nw && !matched; k++) {
			uint64_t c = d->user_cookie.as_64;
			if (c < w[k].base || c >= w[k].base + (uint64_t)w[k].n)
				continue;
			int i = (int)(c - w[k].base);
			matched = 1;
			CHECK(ev.event_number == DAT_DTO_COMPLETION_EVENT && d->ep_handle == P.ep && d->operation == w[k].op,
			      "%s: cookie %#llx: event %#x op %u", what, (unsigned long long)c, ev.event_number,
			      d->operation);
			CHECK(!w[k].seen[i], "%s: cookie %#llx completed twice", what, (unsigned long long)c);
			if (!w[k].seen[i])
				left--;
			w[k].seen[i]++;
			if (d->status == DAT_DTO_ERR_FLUSHED)
				w[k].flushed[i] = 1;
			else
				CHECK(good(&w[k], i, &ev), "%s: cookie %#llx: status %u len %u", what,
				      (unsigned long long)c, d->status, d->transfered_length);
		}
		CHECK(matched, "%s: unexpected completion, cookie %#llx status %u", what,
		      (unsigned long long)ev.event_data.dto_completion_event_data.user_cookie.as_64,
		      ev.event_data.dto_completion_event_data.status);
	}
}

/* A receive that completed holds send number i-1 of the child: its chunk
 * (i-1) % 32. */
static int recv_good(struct want *w, int i, const DAT_EVENT *ev)
{
	const DAT_DTO_COMPLETION_EVENT_DATA *d = &ev->event_data.dto_completion_event_data;
	int idx = (int)(w->base - 0x1000) + i; /* receive number */
	if (d->status != DAT_DTO_SUCCESS || d->transfered_length != CHUNK)
		return 0;
	size_t off = (size_t)((idx - 1) % 32) * CHUNK;
	for (size_t k = 0; k < CHUNK; k++)
		if (pmem[(size_t)idx * CHUNK + k] != pattern(off + k))
			return 0;
	return 1;
}

/* A read that completed holds the child's chunk i. */
static int read_good(struct want *w, int i, const DAT_EVENT *ev)
{
	const DAT_DTO_COMPLETION_EVENT_DATA *d = &ev->event_data.dto_completion_event_data;
	(void)w;
	if (d->status != DAT_DTO_SUCCESS || d->transfered_length != CHUNK)
		return 0;
	for (size_t k = 0; k < CHUNK; k++)
		if (pmem[READ_AREA + (size_t)i * CHUNK + k] != pattern((size_t)i * CHUNK + k))
			return 0;
	return 1;
}

static int never_good(struct want *w, int i, const DAT_EVENT *ev)
{
	(void)w;
	(void)i;
	(void)ev;
	return 0;
}

/* On an RDMA device: a read may have completed (with the child's bytes), a
 * send never (the child posts no receive). */
static int read_good_send_never(struct want *w, int i, const DAT_EVENT *ev)
{
	return w->op == DAT_DTO_RDMA_READ && read_good(w, i, ev);
}

/* The connection's end: one event, DISCONNECTED or BROKEN; then the EP is
 * DISCONNECTED and a new post is flushed at once, with nothing before it. */
static void lost_connection(const char *what)
{
	DAT_EVENT ev;
	DAT_RETURN rc = wait_event(P.conn, &ev);
	CHECK(rc == DAT_SUCCESS &&
		      (ev.event_number == DAT_CONNECTION_EVENT_DISCONNECTED ||
		       ev.event_number == DAT_CONNECTION_EVENT_BROKEN) &&
		      ev.event_data.connect_event_data.ep_handle == P.ep,
	      "%s: connect EVD: wait = %#x, event %#x", what, (unsigned)rc, ev.event_number);
}

static void after_loss(const char *what)
{
	DAT_LMR_TRIPLET t = seg(plc, pmem, 8);
	CHECK(ep_state(P.ep) == DAT_EP_STATE_DISCONNECTED, "%s: EP state %u", what, ep_state(P.ep));
	CHECK_RC(dat_ep_post_send(P.ep, 1, &t, ck(0x9999), 0), DAT_SUCCESS);
	expect_dto_now(P.req, P.ep, 0x9999, DAT_DTO_ERR_FLUSHED, DAT_DTO_SEND, what);
	CHECK_RC(dat_ep_post_recv(P.ep, 1, &t, ck(0x9998), 0), DAT_SUCCESS);
	expect_dto_now(P.rcv, P.ep, 0x9998, DAT_DTO_ERR_FLUSHED, DAT_DTO_RECEIVE, what);
	expect_empty(P.req, what);
	expect_empty(P.rcv, what);
	expect_empty(P.conn, what);
}

static void round_streaming(pid_t pid, int wfd)
{
	enum { NRECV = STREAM_SENDS, NREAD = 32 };
	static int rseen[NRECV], rfl[NRECV], dseen[NREAD], dfl[NREAD];
	struct hello h;
	DAT_EP_ATTR a = attr();

	printf("-- child killed while streaming sends, with receives and RDMA reads outstanding\n");
	side_ep(&P, &a);
	if (!meet_child(wfd, NRECV, &h)) {
		kill_and_reap(pid);
		side_free_ep(&P);
		return;
	}
	/* the stream is under way: two receives done */
	expect_dto(P.rcv, P.ep, 0x1001, DAT_DTO_SUCCESS, CHUNK, DAT_DTO_RECEIVE, "first streamed receive");
	expect_dto(P.rcv, P.ep, 0x1002, DAT_DTO_SUCCESS, CHUNK, DAT_DTO_RECEIVE, "second streamed receive");
	memset(pmem + READ_AREA, 0, (size_t)NREAD * CHUNK);
	for (int j = 0; j < NREAD; j++) {
		DAT_LMR_TRIPLET l = seg(plc, pmem + READ_AREA + (size_t)j * CHUNK, CHUNK);
		DAT_RMR_TRIPLET r;
		r.rmr_context = h.rmr_context;
		r.virtual_address = h.addr + (uint64_t)j * CHUNK;
		r.segment_length = CHUNK;
		CHECK_RC(dat_ep_post_rdma_read(P.ep, 1, &l, ck(0x2000 + j), &r, 0), DAT_SUCCESS);
	}
	kill_and_reap(pid);

	lost_connection("streaming child killed");
	struct want wr = { 0x1003, NRECV - 2, DAT_DTO_RECEIVE, rseen, rfl };
	struct want wd = { 0x2000, NREAD, DAT_DTO_RDMA_READ, dseen, dfl };
	collect(P.rcv, &wr, 1, recv_good, "receives outstanding at the kill");
	collect(P.req, &wd, 1, read_good, "RDMA reads outstanding at the kill");
	int nf = 0, df = 0;
	for (int i = 0; i < NRECV - 2; i++)
		nf += rfl[i];
	for (int i = 0; i < NREAD; i++)
		df += dfl[i];
	printf("   %d of %d receives and %d of %d reads flushed\n", nf, NRECV - 2, df, NREAD);
	/* flushing is in order: nothing completes successfully after a flushed one */
	for (int i = 1; i < NRECV - 2; i++)
		CHECK(!(rfl[i - 1] && rseen[i] && !rfl[i]), "receive %d succeeded after receive %d was flushed", i, i - 1);
	for (int i = 1; i < NREAD; i++)
		CHECK(!(dfl[i - 1] && !dfl[i]), "read %d succeeded after read %d was flushed", i, i - 1);
	after_loss("after the streaming child's death");
	side_free_ep(&P);
}

static void round_stopped(pid_t pid, int wfd)
{
	enum { NRECV = 16, NREAD = 16, NSEND = 4 };
	static int rseen[NRECV], rfl[NRECV], dseen[NREAD], dfl[NREAD], sseen[NSEND], sfl[NSEND];
	struct hello h;
	int st = 0;
	DAT_EP_ATTR a = attr();

	printf("-- child stopped, then killed, with receives, RDMA reads and sends outstanding\n");
	side_ep(&P, &a);
	if (!meet_child(wfd, NRECV, &h)) {
		kill_and_reap(pid);
		side_free_ep(&P);
		return;
	}
	CHECK(kill(pid, SIGSTOP) == 0, "SIGSTOP: %s", strerror(errno));
	CHECK(waitpid(pid, &st, WUNTRACED) == pid && WIFSTOPPED(st), "child not stopped (%#x)", st);
	memset(pmem + READ_AREA, 0, (size_t)NREAD * CHUNK);
	for (int j = 0; j < NREAD; j++) {
		DAT_LMR_TRIPLET l = seg(plc, pmem + READ_AREA + (size_t)j * CHUNK, CHUNK);
		DAT_RMR_TRIPLET r;
		r.rmr_context = h.rmr_context;
		r.virtual_address = h.addr + (uint64_t)j * CHUNK;
		r.segment_length = CHUNK;
		CHECK_RC(dat_ep_post_rdma_read(P.ep, 1, &l, ck(0x2000 + j), &r, 0), DAT_SUCCESS);
	}
	/* iWARP has no RNR retry: a send reaching a peer with no receive posted
	 * ends the connection (TERMINATE), before the kill this round is about. */
	int nsend = iwarp ? 0 : NSEND;
	if (iwarp)
		printf("SKIP sends to a stopped peer: iWARP has no RNR retry, a send that finds no "
		       "receive ends the connection at once\n");
	for (int j = 0; j < nsend; j++) {
		DAT_LMR_TRIPLET l = seg(plc, pmem + READ_AREA, CHUNK);
		CHECK_RC(dat_ep_post_send(P.ep, 1, &l, ck(0x3000 + j), j % 2 ? DAT_COMPLETION_SUPPRESS_FLAG : 0),
			 DAT_SUCCESS);
	}
	/* the child cannot answer: nothing may have completed. The requests
	 * only on TCP: there the child's own process serves RDMA reads, but on
	 * an RDMA device its NIC (for soft-RoCE, the kernel) answers reads of a
	 * stopped process, so they may complete, successfully, before the kill;
	 * so does rs-tcp's same-host path (the parent copies from the child's
	 * memory with process_vm_readv), unless DAPLRS_SAME_HOST=never.
	 * Sends wait on all: the child posts no receive. */
	if (reads_need_the_peer)
		expect_empty(P.req, "requests to a stopped peer");
	expect_empty(P.rcv, "receives from a stopped peer");
	kill_and_reap(pid);

	lost_connection("stopped child killed");
	struct want wr = { 0x1001, NRECV, DAT_DTO_RECEIVE, rseen, rfl };
	struct want wq[2] = { { 0x2000, NREAD, DAT_DTO_RDMA_READ, dseen, dfl },
			      { 0x3000, nsend, DAT_DTO_SEND, sseen, sfl } };
	collect(P.rcv, &wr, 1, never_good, "receives outstanding at the kill");
	collect(P.req, wq, 2, reads_need_the_peer ? never_good : read_good_send_never, "requests outstanding at the kill");
	after_loss("after the stopped child's death");
	side_free_ep(&P);
}

int main(void)
{
	int w1, w2;
	setvbuf(stdout, NULL, _IONBF, 0);
	/* children first: no DAT state, no threads yet */
	pid_t c1 = spawn(1, &w1);
	pid_t c2 = spawn(0, &w2);
	CHECK(c1 > 0 && c2 > 0, "fork");
	if (c1 <= 0 || c2 <= 0)
		return check_summary("test_peer_killed");
	alarm(100); /* a hang fails the test rather than the run */
	catch_sigpipe();

	DAT_EVD_HANDLE async = DAT_HANDLE_NULL;
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async, &ia), DAT_SUCCESS);
	is_tcp = ia_is_tcp(ia);
	iwarp = strstr(ia_attr_of(ia).adapter_name, "iWARP") != NULL;
	const char *same_host = getenv("DAPLRS_SAME_HOST");
	reads_need_the_peer = is_tcp && same_host && strcmp(same_host, "never") == 0;
	CHECK_RC(dat_pz_create(ia, &pz), DAT_SUCCESS);
	pmem = malloc(PARENT_MEM);
	memset(pmem, 0, PARENT_MEM);
	DAT_LMR_HANDLE lmr = lmr_make(ia, pz, pmem, PARENT_MEM, DAT_MEM_PRIV_ALL_FLAG, &plc, NULL);
	side_evds(&P, ia, pz);
	if (check_failed) {
		kill(c1, SIGKILL);
		kill(c2, SIGKILL);
		return check_summary("test_peer_killed");
	}

	round_streaming(c1, w1);
	round_stopped(c2, w2);

	side_free_evds(&P);
	CHECK_RC(dat_lmr_free(lmr), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	check_no_sigpipe();
	return check_summary("test_peer_killed");
}
