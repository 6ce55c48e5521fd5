/* An application's own blocking calls are never interrupted by us (issue 40,
 * item 2): six threads of the application, each the last poster on its own
 * connection, spin on their memory for a while and then sit in one blocking
 * call each -- poll, select, epoll_wait, nanosleep, read of a pipe and
 * pthread_cond_timedwait -- none retrying on EINTR, while a peer process
 * RDMA-writes into their memory and sends into their posted receives on all
 * six connections. A call that fails with EINTR fails the test: a signal of
 * ours reached a thread blocked in a system call.
 *
 * At the end every connection must have carried messages (its receives
 * completed successfully), and every thread must have made its call many
 * times. The peer is forked before any DAT call and reports through its
 * exit status. Opens $DAT_TEST_IA (default rs-tcp). */
#define _GNU_SOURCE
#include <dat2/udat.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "dto_pair.h"

#define CONNS 6
#define RECVS 256   /* receives posted on each connection before it is accepted */
#define SLOT 64     /* bytes of each connection's slot in the written buffers */
#define RUN_MS 1500 /* how long the threads spin and block at least */
#define MIN_CALLS 20 /* and how many calls each makes at least */
#define HARD_S 30    /* the bound on all that (a slow guest's first messages) */
#define CALL_MS 5   /* each blocking call's timeout */

enum call { POLL, SELECT, EPOLL, NANOSLEEP, PIPE_READ, COND_WAIT };
static const char *call_name[CONNS] = { "poll", "select", "epoll_wait", "nanosleep", "read of a pipe",
					"pthread_cond_timedwait" };

/* What one side tells the other of its buffer: where peers may write. */
struct target {
	DAT_RMR_CONTEXT rmr;
	uint64_t va;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_us(long us)
{
	struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

#define PEER_FAIL(code, ...)                                                   \
	do {                                                                   \
		printf("FAIL peer: " __VA_ARGS__);                             \
		printf("\n");                                                  \
		fflush(stdout);                                                \
		_exit(code);                                                   \
	} while (0)

/* ---- the peer: writes and sends on every connection until told to stop ------------------------ */

/* Whether a post succeeded or only found the request queue full. */
static int posted(DAT_RETURN rc)
{
	return rc == DAT_SUCCESS || DAT_GET_TYPE(rc) == DAT_INSUFFICIENT_RESOURCES;
}

static void peer(int from_app, int to_app)
{
	DAT_CONN_QUAL port;
	DAT_IA_HANDLE ia;
	DAT_EVD_HANDLE async = DAT_HANDLE_NULL;
	DAT_PZ_HANDLE pz;
	struct side s[CONNS];
	struct target app;
	DAT_LMR_CONTEXT lc;
	DAT_RMR_CONTEXT rc;
	DAT_EVENT ev;
	DAT_COUNT nmore;
	static unsigned char buf[CONNS * SLOT];

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	alarm(test_alarm(60));
	if (read(from_app, &port, sizeof(port)) != sizeof(port))
		_exit(2);
	if (dat_ia_open(dat_test_ia(), 8, &async, &ia) != DAT_SUCCESS || dat_pz_create(ia, &pz) != DAT_SUCCESS)
		PEER_FAIL(3, "open");
	lmr_make(ia, pz, buf, sizeof(buf), DAT_MEM_PRIV_ALL_FLAG, &lc, &rc);
	for (int i = 0; i < CONNS; i++) {
		side_evds(&s[i], ia, pz);
		DAT_EP_ATTR a = ep_attr(0, 0, 64);
		side_ep(&s[i], &a);
	}
	if (check_failed)
		PEER_FAIL(3, "objects");
	for (int i = 0; i < CONNS; i++)
		if (dat_ep_connect(s[i].ep, ia_address(ia), port, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT,
				   DAT_CONNECT_DEFAULT_FLAG) != DAT_SUCCESS ||
		    dat_evd_wait(s[i].conn, WAIT_US, 1, &ev, &nmore) != DAT_SUCCESS ||
		    ev.event_number != DAT_CONNECTION_EVENT_ESTABLISHED)
			PEER_FAIL(4, "connect %d", i);
	struct target mine = { rc, (uint64_t)(uintptr_t)buf };
	if (write(to_app, &mine, sizeof(mine)) != sizeof(mine) || read(from_app, &app, sizeof(app)) != sizeof(app))
		PEER_FAIL(5, "exchange of targets");
	fcntl(from_app, F_SETFL, O_NONBLOCK);
	int sends[CONNS] = { 0 };
	double deadline = now_s() + 30;
	for (uint64_t round = 1;; round++) {
		char c;
		if (read(from_app, &c, 1) == 1 || now_s() > deadline)
			break;
		for (int i = 0; i < CONNS; i++) {
			unsigned char *src = buf + i * SLOT;
			memcpy(src, &round, sizeof(round));
			DAT_LMR_TRIPLET t = seg(lc, src, 8);
			DAT_RMR_TRIPLET r = rseg(app.rmr, (void *)(uintptr_t)(app.va + i * SLOT), 8);
			/* A full request queue (completions not reaped yet: over reliable
			 * datagrams a send completes once the app's side took it) only
			 * skips this round's requests on that connection. */
			if (!posted(dat_ep_post_rdma_write(s[i].ep, 1, &t, ck(round), &r, DAT_COMPLETION_DEFAULT_FLAG)))
				PEER_FAIL(6, "post_rdma_write %d", i);
			/* A send every fourth round from the first, as long as the app's
			 * receives last. */
			if (round % 4 == 1 && sends[i] < RECVS - 16) {
				DAT_RETURN rc = dat_ep_post_send(s[i].ep, 1, &t, ck(round), DAT_COMPLETION_DEFAULT_FLAG);
				if (!posted(rc))
					PEER_FAIL(7, "post_send %d", i);
				sends[i] += rc == DAT_SUCCESS;
			}
		}
		for (int i = 0; i < CONNS; i++)
			while (dat_evd_dequeue(s[i].req, &ev) == DAT_SUCCESS)
				if (ev.event_data.dto_completion_event_data.status != DAT_DTO_SUCCESS)
					PEER_FAIL(8, "a request failed (status %#x)",
						  ev.event_data.dto_completion_event_data.status);
		sleep_us(300);
	}
	for (int i = 0; i < CONNS; i++)
		if (sends[i] == 0)
			PEER_FAIL(9, "no send on connection %d", i);
	_exit(0);
}

/* ---- the application's threads -------------------------------------------------------------- */

struct app_thread {
	pthread_t tid;
	int index;
	struct side *s;
	DAT_LMR_CONTEXT lc;
	unsigned char *mine; /* this connection's slot of our written buffer */
	unsigned char *out;  /* what this thread writes to the peer */
	struct target peer;
	int wake_pipe[2]; /* PIPE_READ: a byte every CALL_MS from the ticker */
	int calls, eintr, other_errors, posts;
};

static pthread_mutex_t cond_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static volatile int ticking = 1;

/* One blocking call of kind `k`; -1 with errno set as the call left it if it failed. */
static int blocking_call(struct app_thread *t, enum call k, int idle_fd, int epfd)
{
	switch (k) {
	case POLL: {
		struct pollfd p = { idle_fd, POLLIN, 0 };
		return poll(&p, 1, CALL_MS);
	}
	case SELECT: {
		fd_set r;
		FD_ZERO(&r);
		FD_SET(idle_fd, &r);
		struct timeval tv = { 0, CALL_MS * 1000 };
		return select(idle_fd + 1, &r, NULL, NULL, &tv);
	}
	case EPOLL: {
		struct epoll_event e;
		return epoll_wait(epfd, &e, 1, CALL_MS);
	}
	case NANOSLEEP: {
		struct timespec ts = { 0, CALL_MS * 1000000L };
		return nanosleep(&ts, NULL);
	}
	case PIPE_READ: {
		char c;
		return read(t->wake_pipe[0], &c, 1) == 1 ? 0 : -1;
	}
	case COND_WAIT: {
		struct timespec until;
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_nsec += CALL_MS * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		pthread_mutex_lock(&cond_mutex);
		int rc = pthread_cond_timedwait(&cond, &cond_mutex, &until);
		pthread_mutex_unlock(&cond_mutex);
		if (rc != 0 && rc != ETIMEDOUT) {
			errno = rc;
			return -1;
		}
		return 0;
	}
	}
	return 0;
}

static void *app_thread_main(void *arg)
{
	struct app_thread *t = arg;
	enum call k = (enum call)t->index;
	int idle[2];
	if (pipe(idle) != 0)
		return NULL;
	int epfd = epoll_create1(0);
	struct epoll_event e = { EPOLLIN, { 0 } };
	epoll_ctl(epfd, EPOLL_CTL_ADD, idle[0], &e);
	/* At least RUN_MS, MIN_CALLS calls and until the connection carries the peer's
	 * messages, at most HARD_S. A write the peer posted after its first send has
	 * landed by then: its first write may come around the provider (through the peer's
	 * memory on this host, rs-ofi-*), while that send is what makes ofi_rxm connect,
	 * a second or more in the emulated guest. */
	double start = now_s(), end = start + RUN_MS / 1e3, hard_end = start + HARD_S;
	int peer_seen = 0;
	DAT_EVENT ev;
	for (uint64_t n = 1; (now_s() < end || t->calls < MIN_CALLS || !peer_seen) && now_s() < hard_end; n++) {
		/* Post on our connection (we are its last poster), reap, then spin on our
		 * memory for a moment as a program waiting for the peer's write would. */
		memcpy(t->out, &n, sizeof(n));
		DAT_LMR_TRIPLET l = seg(t->lc, t->out, 8);
		DAT_RMR_TRIPLET r = rseg(t->peer.rmr, (void *)(uintptr_t)(t->peer.va + t->index * SLOT), 8);
		if (dat_ep_post_rdma_write(t->s->ep, 1, &l, ck(n), &r, DAT_COMPLETION_DEFAULT_FLAG) == DAT_SUCCESS)
			t->posts++;
		while (dat_evd_dequeue(t->s->req, &ev) == DAT_SUCCESS)
			;
		volatile unsigned char *watched = t->mine;
		unsigned char before = *watched;
		double spin_end = now_s() + 0.0002;
		while (*watched == before && now_s() < spin_end)
			;
		uint64_t last;
		memcpy(&last, t->mine, sizeof(last));
		peer_seen |= last >= 2;
		errno = 0;
		if (blocking_call(t, k, idle[0], epfd) < 0) {
			if (errno == EINTR)
				t->eintr++;
			else
				t->other_errors++;
		}
		t->calls++;
	}
	close(idle[0]);
	close(idle[1]);
	close(epfd);
	return NULL;
}

/* Writes a byte every CALL_MS into the pipe the PIPE_READ thread reads. */
static void *ticker(void *arg)
{
	struct app_thread *t = arg;
	while (ticking) {
		sleep_us(CALL_MS * 1000);
		if (write(t->wake_pipe[1], "t", 1) != 1)
			break;
	}
	return NULL;
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	alarm(test_alarm(90));
	catch_sigpipe();
	/* A socket pair towards the peer: "stop" goes with MSG_NOSIGNAL, so a peer that
	 * failed and left raises no SIGPIPE here (which catch_sigpipe counts against
	 * the provider). */
	int to_peer[2], from_peer[2];
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, to_peer) == 0 && pipe(from_peer) == 0, "pipes");
	pid_t pid = fork();
	if (pid == 0) {
		close(to_peer[1]);
		close(from_peer[0]);
		peer(to_peer[0], from_peer[1]);
	}
	close(to_peer[0]);
	close(from_peer[1]);

	DAT_EVD_HANDLE async = DAT_HANDLE_NULL;
	DAT_IA_HANDLE ia;
	DAT_PZ_HANDLE pz;
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async, &ia), DAT_SUCCESS);
	CHECK_RC(dat_pz_create(ia, &pz), DAT_SUCCESS);
	static unsigned char written[CONNS * SLOT], out[CONNS * SLOT], recv_bufs[CONNS][RECVS][8];
	DAT_LMR_CONTEXT lc, rlc;
	DAT_RMR_CONTEXT rc;
	lmr_make(ia, pz, written, sizeof(written), DAT_MEM_PRIV_ALL_FLAG, &lc, &rc);
	DAT_LMR_CONTEXT olc;
	lmr_make(ia, pz, out, sizeof(out), DAT_MEM_PRIV_ALL_FLAG, &olc, NULL);
	lmr_make(ia, pz, recv_bufs, sizeof(recv_bufs), DAT_MEM_PRIV_ALL_FLAG, &rlc, NULL);
	struct side s[CONNS];
	for (int i = 0; i < CONNS; i++) {
		side_evds(&s[i], ia, pz);
		DAT_EP_ATTR a = ep_attr(0, 0, 64);
		a.max_recv_dtos = RECVS;
		side_ep(&s[i], &a);
		for (int m = 0; m < RECVS; m++) {
			DAT_LMR_TRIPLET t = seg(rlc, recv_bufs[i][m], 8);
			CHECK_RC(dat_ep_post_recv(s[i].ep, 1, &t, ck(m), DAT_COMPLETION_DEFAULT_FLAG), DAT_SUCCESS);
		}
	}
	if (check_failed) {
		kill(pid, SIGKILL);
		return check_summary("test_blocking_calls");
	}
	DAT_CONN_QUAL port;
	DAT_PSP_HANDLE psp = listen_any(&s[0], &port);
	CHECK(send(to_peer[1], &port, sizeof(port), MSG_NOSIGNAL) == sizeof(port), "tell the peer the port");
	int accepted = 0;
	for (int i = 0; i < CONNS; i++) {
		DAT_EVENT ev;
		if (wait_event(s[0].cr, &ev) != DAT_SUCCESS || ev.event_number != DAT_CONNECTION_REQUEST_EVENT)
			break;
		if (dat_cr_accept(ev.event_data.cr_arrival_event_data.cr_handle, s[i].ep, 0, NULL) != DAT_SUCCESS ||
		    !expect_conn_event(s[i].conn, s[i].ep, DAT_CONNECTION_EVENT_ESTABLISHED, "ESTABLISHED"))
			break;
		accepted++;
	}
	CHECK(accepted == CONNS, "%d of %d connections accepted", accepted, CONNS);
	CHECK_RC(dat_psp_free(psp), DAT_SUCCESS);
	struct target peer_target, mine = { rc, (uint64_t)(uintptr_t)written };
	CHECK(accepted == CONNS && read(from_peer[0], &peer_target, sizeof(peer_target)) == sizeof(peer_target) &&
		      send(to_peer[1], &mine, sizeof(mine), MSG_NOSIGNAL) == sizeof(mine),
	      "exchange of targets");
	if (check_failed) {
		kill(pid, SIGKILL);
		return check_summary("test_blocking_calls");
	}

	struct app_thread t[CONNS];
	pthread_t tick;
	memset(t, 0, sizeof(t));
	for (int i = 0; i < CONNS; i++) {
		t[i].index = i;
		t[i].s = &s[i];
		t[i].lc = olc;
		t[i].mine = written + i * SLOT;
		t[i].out = out + i * SLOT;
		t[i].peer = peer_target;
		CHECK(pipe(t[i].wake_pipe) == 0, "pipe");
	}
	CHECK(pthread_create(&tick, NULL, ticker, &t[PIPE_READ]) == 0, "ticker thread");
	for (int i = 0; i < CONNS; i++)
		CHECK(pthread_create(&t[i].tid, NULL, app_thread_main, &t[i]) == 0, "thread %d", i);
	for (int i = 0; i < CONNS; i++)
		pthread_join(t[i].tid, NULL);
	ticking = 0;
	pthread_join(tick, NULL);
	CHECK(send(to_peer[1], "x", 1, MSG_NOSIGNAL) == 1, "tell the peer to stop");
	int status = 0;
	CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "the peer wrote and sent on every connection (status %#x)", status);

	for (int i = 0; i < CONNS; i++) {
		CHECK(t[i].eintr == 0, "%s: %d of %d calls failed with EINTR", call_name[i], t[i].eintr, t[i].calls);
		CHECK(t[i].other_errors == 0, "%s: %d calls failed otherwise", call_name[i], t[i].other_errors);
		CHECK(t[i].calls >= MIN_CALLS, "%s: only %d calls made", call_name[i], t[i].calls);
		CHECK(t[i].posts >= MIN_CALLS, "%s: only %d writes posted", call_name[i], t[i].posts);
		/* The receives the peer's sends did not take are flushed as it leaves. */
		int got = 0, bad = 0;
		DAT_EVENT ev;
		while (dat_evd_dequeue(s[i].rcv, &ev) == DAT_SUCCESS)
			if (ev.event_data.dto_completion_event_data.status == DAT_DTO_SUCCESS)
				got++;
			else if (ev.event_data.dto_completion_event_data.status != DAT_DTO_ERR_FLUSHED)
				bad++;
		CHECK(got > 0 && bad == 0, "%s: its connection carried %d messages (%d failed)", call_name[i], got,
		      bad);
		uint64_t last;
		memcpy(&last, written + i * SLOT, sizeof(last));
		CHECK(last > 0, "%s: the peer's writes landed", call_name[i]);
		printf("%s: %d calls, %d writes posted, %d messages received, last write %llu\n", call_name[i],
		       t[i].calls, t[i].posts, got, (unsigned long long)last);
	}
	for (int i = 0; i < CONNS; i++) {
		dat_ep_disconnect(s[i].ep, DAT_CLOSE_ABRUPT_FLAG);
		side_free_ep(&s[i]);
	}
	check_no_sigpipe();
	return check_summary("test_blocking_calls");
}
