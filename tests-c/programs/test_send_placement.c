/* Sends between two processes (issue 22): on rs-tcp's same-host path the
 * sender places a send's data in the receiver's posted receive itself, so a
 * receiver that spins on its buffer, calling nothing, sees the data; the
 * receive completes when the receiver next looks. Whatever carries it, DAT's
 * rules hold (the same checks run over TCP in make test's second pass):
 *
 *  1. data and order: the receiver posts 64 receives, then spins on the last
 *     byte of each in turn without a DAT call until its message is there (a
 *     bounded spin); then every receive completes once, in order, with its
 *     length and its bytes, and every send once on the sender's side;
 *  2. a receive too small: DAT_DTO_ERR_LOCAL_LENGTH on the receive, the
 *     connection broken, the send not successful;
 *  3. a killed sender: the sender places two messages, says so, and is
 *     killed (SIGKILL) before the receiver has called anything: the two
 *     receives complete with their data, the others are flushed, each
 *     exactly once, and the connection is broken.
 *
 * Three children, forked before the parent makes any DAT call, each learns
 * the port of its scenario's PSP through a pipe and reports through its exit
 * status (its failures are printed). All open $DAT_TEST_IA (default rs-tcp). */
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

#define MSGS 64
#define MSG_LEN 256
#define SPIN_SECONDS 10

enum scenario { ORDER = 0, TOO_SMALL = 1, KILLED = 2, SCENARIOS };

static unsigned char byte_of(int msg, size_t k)
{
	return (unsigned char)(msg * 37 + k * 11 + 1);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

#define CHILD_FAIL(code, ...)                                                  \
	do {                                                                   \
		printf("FAIL sender: " __VA_ARGS__);                           \
		printf("\n");                                                  \
		fflush(stdout);                                                \
		_exit(code);                                                   \
	} while (0)

/* ---- the senders ----------------------------------------------------------------------------- */

static void sender(enum scenario sc, int rfd, int wfd)
{
	DAT_CONN_QUAL port;
	DAT_IA_HANDLE ia;
	DAT_EVD_HANDLE async = DAT_HANDLE_NULL;
	DAT_PZ_HANDLE pz;
	struct side s;
	DAT_EVENT ev;
	DAT_COUNT nmore;
	DAT_LMR_CONTEXT lc;
	static unsigned char buf[MSGS * MSG_LEN];

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	alarm(60);
	if (read(rfd, &port, sizeof(port)) != sizeof(port))
		_exit(2);
	for (int m = 0; m < MSGS; m++)
		for (size_t k = 0; k < MSG_LEN; k++)
			buf[m * MSG_LEN + k] = byte_of(m, k);
	if (dat_ia_open(dat_test_ia(), 8, &async, &ia) != DAT_SUCCESS || dat_pz_create(ia, &pz) != DAT_SUCCESS)
		CHILD_FAIL(3, "open");
	side_evds(&s, ia, pz);
	DAT_EP_ATTR a = ep_attr(0, 0, MSGS + 8);
	side_ep(&s, &a);
	lmr_make(ia, pz, buf, sizeof(buf), DAT_MEM_PRIV_ALL_FLAG, &lc, NULL);
	if (check_failed)
		CHILD_FAIL(3, "objects");
	if (dat_ep_connect(s.ep, ia_address(ia), port, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT, DAT_CONNECT_DEFAULT_FLAG) !=
		    DAT_SUCCESS ||
	    dat_evd_wait(s.conn, WAIT_US, 1, &ev, &nmore) != DAT_SUCCESS ||
	    ev.event_number != DAT_CONNECTION_EVENT_ESTABLISHED)
		CHILD_FAIL(4, "connect");
	/* The receiver posted its receives before it accepted. */
	int n = sc == ORDER ? MSGS : sc == KILLED ? 2 : 1;
	DAT_SEG_LENGTH len = sc == TOO_SMALL ? 16 : MSG_LEN;
	for (int m = 0; m < n; m++) {
		DAT_LMR_TRIPLET t = seg(lc, buf + m * MSG_LEN, len);
		if (dat_ep_post_send(s.ep, 1, &t, ck(m), DAT_COMPLETION_DEFAULT_FLAG) != DAT_SUCCESS)
			CHILD_FAIL(5, "post_send %d", m);
	}
	if (sc == KILLED) {
		/* Both sends completed: their data is the receiver's. Say so, and wait to be killed. */
		for (int m = 0; m < n; m++)
			if (dat_evd_wait(s.req, WAIT_US, 1, &ev, &nmore) != DAT_SUCCESS ||
			    ev.event_data.dto_completion_event_data.status != DAT_DTO_SUCCESS)
				CHILD_FAIL(6, "send %d did not complete", m);
		if (write(wfd, "s", 1) != 1)
			_exit(7);
		for (;;)
			pause();
	}
	int ok_sends = 0, bad_sends = 0;
	for (int m = 0; m < n; m++) {
		if (dat_evd_wait(s.req, WAIT_US, 1, &ev, &nmore) != DAT_SUCCESS)
			CHILD_FAIL(8, "no completion for send %d", m);
		const DAT_DTO_COMPLETION_EVENT_DATA *d = &ev.event_data.dto_completion_event_data;
		if (d->user_cookie.as_64 != (uint64_t)m)
			CHILD_FAIL(9, "send completion %d has cookie %llu", m, (unsigned long long)d->user_cookie.as_64);
		if (d->status == DAT_DTO_SUCCESS)
			ok_sends++;
		else
			bad_sends++;
	}
	if (sc == ORDER && ok_sends != MSGS)
		CHILD_FAIL(10, "%d of %d sends succeeded", ok_sends, MSGS);
	if (sc == TOO_SMALL && ok_sends != 0) {
		/* iWARP (soft-iWARP) completes a send once it is sent, before the peer's
		 * receive takes it: there the receive's LOCAL_LENGTH and the break,
		 * checked by the receiver, are what DAT promises. */
		if (!strstr(ia_attr_of(ia).adapter_name, "iWARP"))
			CHILD_FAIL(11, "a send into a receive too small succeeded");
		printf("SKIP sender: on iWARP a send completes once sent; its status into a receive too small is not checked\n");
		fflush(stdout);
	}
	if (dat_evd_dequeue(s.req, &ev) == DAT_SUCCESS)
		CHILD_FAIL(12, "a send completed twice");
	/* Wait for the receiver to end the connection (ORDER) or for the break (TOO_SMALL). */
	if (dat_evd_wait(s.conn, WAIT_US, 1, &ev, &nmore) != DAT_SUCCESS)
		CHILD_FAIL(13, "no end of the connection");
	_exit(0);
}

/* ---- the receiver ---------------------------------------------------------------------------- */

struct receiver {
	struct side s;
	DAT_PSP_HANDLE psp;
	DAT_CONN_QUAL port;
	DAT_LMR_CONTEXT lc;
	unsigned char *buf;
};

/* A fresh EP with `nrecv` receives of `len` bytes posted, and a PSP for the sender. */
static void prepare(struct receiver *r, int nrecv, DAT_SEG_LENGTH len)
{
	DAT_EP_ATTR a = ep_attr(0, 0, 16);
	a.max_recv_dtos = MSGS + 8;
	side_ep(&r->s, &a);
	memset(r->buf, 0, MSGS * MSG_LEN);
	for (int m = 0; m < nrecv; m++) {
		DAT_LMR_TRIPLET t = seg(r->lc, r->buf + m * MSG_LEN, len);
		CHECK_RC(dat_ep_post_recv(r->s.ep, 1, &t, ck(100 + m), DAT_COMPLETION_DEFAULT_FLAG), DAT_SUCCESS);
	}
	r->psp = listen_any(&r->s, &r->port);
}

/* A sender forked before any DAT call of ours (a child of a process whose provider threads
 * may hold locks must not use DAT), waiting for the port of its scenario. */
struct sender_proc {
	pid_t pid;
	int port_fd;  /* we write the port here */
	int ready_fd; /* it says "sent" here */
};

static struct sender_proc fork_sender(enum scenario sc)
{
	struct sender_proc sp = { -1, -1, -1 };
	int p[2], ready[2];
	if (pipe(p) != 0 || pipe(ready) != 0)
		return sp;
	sp.pid = fork();
	if (sp.pid == 0) {
		close(p[1]);
		close(ready[0]);
		sender(sc, p[0], ready[1]);
	}
	close(p[0]);
	close(ready[1]);
	sp.port_fd = p[1];
	sp.ready_fd = ready[0];
	return sp;
}

static void start_sender(struct sender_proc *sp, struct receiver *r)
{
	CHECK(write(sp->port_fd, &r->port, sizeof(r->port)) == sizeof(r->port), "tell the sender the port");
	close(sp->port_fd);
}

static int accept_sender(struct receiver *r)
{
	int ok = accept_next(&r->s) &&
		 expect_conn_event(r->s.conn, r->s.ep, DAT_CONNECTION_EVENT_ESTABLISHED, "ESTABLISHED");
	CHECK_RC(dat_psp_free(r->psp), DAT_SUCCESS);
	return ok;
}

static int sender_status(pid_t pid)
{
	int status = 0;
	if (waitpid(pid, &status, 0) != pid)
		return -1;
	return status;
}

/* Spins on the last byte of message `m`'s receive, calling nothing, until it is there. */
static int spin_for(struct receiver *r, int m)
{
	volatile unsigned char *last = r->buf + m * MSG_LEN + MSG_LEN - 1;
	double deadline = now_s() + SPIN_SECONDS;
	while (*last != byte_of(m, MSG_LEN - 1))
		if (now_s() > deadline)
			return 0;
	return 1;
}

static void scenario_order(struct receiver *r, struct sender_proc *sp)
{
	pid_t pid = sp->pid;
	prepare(r, MSGS, MSG_LEN);
	start_sender(sp, r);
	if (!accept_sender(r))
		return;
	int seen = 0;
	for (int m = 0; m < MSGS; m++)
		seen += spin_for(r, m);
	CHECK(seen == MSGS, "%d of %d messages seen in memory without a DAT call", seen, MSGS);
	for (int m = 0; m < MSGS; m++) {
		char what[64];
		snprintf(what, sizeof(what), "receive %d", m);
		expect_dto(r->s.rcv, r->s.ep, 100 + m, DAT_DTO_SUCCESS, MSG_LEN, DAT_DTO_RECEIVE, what);
		int same = 1;
		for (size_t k = 0; k < MSG_LEN; k++)
			same &= r->buf[m * MSG_LEN + k] == byte_of(m, k);
		CHECK(same, "message %d holds its bytes", m);
	}
	expect_empty(r->s.rcv, "after the receives");
	CHECK_RC(dat_ep_disconnect(r->s.ep, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	expect_conn_event(r->s.conn, r->s.ep, DAT_CONNECTION_EVENT_DISCONNECTED, "DISCONNECTED");
	int st = sender_status(pid);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "order: the sender saw each send complete once (status %#x)", st);
	side_free_ep(&r->s);
}

static void scenario_too_small(struct receiver *r, struct sender_proc *sp)
{
	pid_t pid = sp->pid;
	prepare(r, 1, 8);
	start_sender(sp, r);
	if (!accept_sender(r))
		return;
	expect_dto(r->s.rcv, r->s.ep, 100, DAT_DTO_ERR_LOCAL_LENGTH, -1, DAT_DTO_RECEIVE, "a receive too small");
	DAT_EVENT ev;
	CHECK(wait_event(r->s.conn, &ev) == DAT_SUCCESS && ev.event_number == DAT_CONNECTION_EVENT_BROKEN,
	      "too small: the connection breaks (event %#x)", ev.event_number);
	int st = sender_status(pid);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "too small: the send failed, once (status %#x)", st);
	side_free_ep(&r->s);
}

static void scenario_killed(struct receiver *r, struct sender_proc *sp)
{
	pid_t pid = sp->pid;
	prepare(r, 4, MSG_LEN);
	start_sender(sp, r);
	if (!accept_sender(r))
		return;
	char c;
	CHECK(read(sp->ready_fd, &c, 1) == 1, "the sender says its two sends completed");
	kill(pid, SIGKILL);
	int st = sender_status(pid);
	CHECK(WIFSIGNALED(st), "the sender was killed");
	for (int m = 0; m < 2; m++) {
		char what[64];
		snprintf(what, sizeof(what), "receive %d of a killed sender", m);
		expect_dto(r->s.rcv, r->s.ep, 100 + m, DAT_DTO_SUCCESS, MSG_LEN, DAT_DTO_RECEIVE, what);
		int same = 1;
		for (size_t k = 0; k < MSG_LEN; k++)
			same &= r->buf[m * MSG_LEN + k] == byte_of(m, k);
		CHECK(same, "message %d of the killed sender holds its bytes", m);
	}
	DAT_EVENT ev;
	CHECK(wait_event(r->s.conn, &ev) == DAT_SUCCESS && (ev.event_number == DAT_CONNECTION_EVENT_BROKEN ||
							      ev.event_number == DAT_CONNECTION_EVENT_DISCONNECTED),
	      "killed sender: the connection ends (event %#x)", ev.event_number);
	for (int m = 2; m < 4; m++)
		expect_dto(r->s.rcv, r->s.ep, 100 + m, DAT_DTO_ERR_FLUSHED, -1, DAT_DTO_RECEIVE, "a flushed receive");
	expect_empty(r->s.rcv, "after the flush");
	side_free_ep(&r->s);
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	alarm(150);
	catch_sigpipe();
	struct sender_proc senders[SCENARIOS];
	for (int sc = 0; sc < SCENARIOS; sc++)
		senders[sc] = fork_sender((enum scenario)sc);
	struct receiver r;
	DAT_EVD_HANDLE async = DAT_HANDLE_NULL;
	DAT_IA_HANDLE ia;
	DAT_PZ_HANDLE pz;
	memset(&r, 0, sizeof(r));
	r.buf = calloc(MSGS, MSG_LEN);
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async, &ia), DAT_SUCCESS);
	CHECK_RC(dat_pz_create(ia, &pz), DAT_SUCCESS);
	side_evds(&r.s, ia, pz);
	lmr_make(ia, pz, r.buf, MSGS * MSG_LEN, DAT_MEM_PRIV_ALL_FLAG, &r.lc, NULL);
	if (!check_failed) {
		scenario_order(&r, &senders[ORDER]);
		scenario_too_small(&r, &senders[TOO_SMALL]);
		scenario_killed(&r, &senders[KILLED]);
	}
	for (int sc = 0; sc < SCENARIOS; sc++)
		kill(senders[sc].pid, SIGKILL);
	check_no_sigpipe();
	return check_summary("test_send_placement");
}
