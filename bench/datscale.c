/*
 * datscale: what a message costs with N connections, over the DAT 2.0 API.
 *
 * As an MPI rank uses DAT: one EP per peer, every EP of a process sharing ONE
 * receive EVD, ONE request EVD and ONE connection EVD, polled with
 * dat_evd_dequeue. It calls nothing but <dat2/udat.h>, so the same binary
 * measures any DAT provider.
 *
 *   datscale -P rs-tcp -s -c 1024               server: accepts 1024 connections on ONE PSP
 *   datscale -P rs-tcp -h 127.0.0.1 -c 1024     client: connects them, measures, prints
 *
 * Both sides are given the same -c. The client creates its N EPs and keeps up
 * to -W connects outstanding; the server answers each connection request with
 * a new EP (its receive posted first) and dat_cr_accept. Then:
 *
 *   - connection setup: the client's wall time from its first dat_ep_create to
 *     its last ESTABLISHED event (conn_s), as connections per second
 *     (conn_per_s: each one a connect here and an accept at the server); the
 *     server's time from the first connection request to its last ESTABLISHED
 *     (accept_s_server);
 *   - memory: each side's resident set (the Rss of /proc/self/smaps_rollup,
 *     exact; statm's where it is missing) read before its first EP and once
 *     all N are connected, the growth divided by N, in KiB per connection
 *     (rss_kib_per_conn_client / _server); buffers and
 *     arrays are allocated and touched before the first reading;
 *   - an 8 B send/recv ping-pong: the client posts a send, both sides spin on
 *     dat_evd_dequeue of their receive EVD (no sched_yield, no dat_evd_wait),
 *     each repost the receive and reap their send's completion from the
 *     request EVD (dequeue until it is there). A round trip is timed from
 *     posting the ping to having the pong and the ping's completion. Mode
 *     `one`: every round trip on EP 0 (the others idle); mode `all`: each round
 *     trip on the next EP in turn (every EP active). `-m one,all` runs both on
 *     the same connections, in that order. Unmeasured warm-up first: in mode
 *     all a ping on every EP (32 in flight, for at most -D seconds), then 100
 *     round trips. -n round trips are measured, or as many as -D seconds allow
 *     (at least 100).
 *
 * The client prints, per mode, one line (after "# " comment lines), e.g.
 *
 *   scale ia=rs-tcp n=1024 mode=one iters=10000 rtt_med_us=.. rtt_p99_us=.. conn_s=.. conn_per_s=.. accept_s_server=.. rss_kib_per_conn_client=.. rss_kib_per_conn_server=..
 *
 * The server prints "datscale: server listening ..." once its PSP exists
 * (scripts wait for that line), serves one client and exits. Its figures
 * reach the client over EP 0 before the ping-pong; the client's END is
 * answered before it tears down. Every wait is bounded (-T; the server's wait
 * for its first connection request -A), and any DAT error prints its
 * dat_strerror() name and exits non-zero, as does a completion on the wrong
 * EP or with the wrong bytes. The soft RLIMIT_NOFILE is raised to the hard
 * one first (4,096 connections need more than 1,024 descriptors).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <dat2/udat.h>

#define SLOT 64                 /* bytes of each EP's send and receive buffer */
#define PING_BYTES 8            /* the ping-pong's message */
#define EP_DTOS 4               /* max_recv_dtos and max_request_dtos of every EP */
#define EVD_SLACK 64            /* EVD entries beyond one per EP */
#define MAX_CONN 65536
#define WARMUP 100
#define SWEEP_WINDOW 32         /* mode all's warm-up: pings in flight (< EVD_SLACK) */

enum mode { MODE_ONE, MODE_ALL };

static struct options {
	char *ia_name;          /* OFED declares dat_ia_open with a non-const name */
	const char *host;       /* NULL: server */
	DAT_CONN_QUAL conn_qual;
	int nconn;              /* -c */
	int iters;              /* -n: measured round trips per mode */
	int modes[2], nmodes;   /* -m: the modes, in the order run */
	int timeout_s;          /* -T: every wait */
	int accept_timeout_s;   /* -A: the server's wait for its first connection request */
	int window;             /* -W: connects outstanding at once */
	int budget_s;           /* -D: a mode's measured loop stops after this long (0: never) */
} opt = {
	.ia_name = "rs-tcp",
	.conn_qual = 18717,
	.nconn = 1,
	.iters = 10000,
	.modes = { MODE_ONE },
	.nmodes = 1,
	.timeout_s = 30,
	.accept_timeout_s = 120,
	.window = 64,
};

/* ------------------------------------------------------------ error exits */

static const char *side_name = "datscale";

static void die(const char *fmt, ...)
{
	va_list ap;

	fflush(stdout);
	va_start(ap, fmt);
	fprintf(stderr, "%s: ", side_name);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(1);
}

/* Exits with the DAT_RETURN named by the registry, e.g. "DAT_TIMEOUT_EXPIRED". */
static void check(DAT_RETURN rc, const char *what)
{
	const char *major = "?", *minor = "";

	if (rc == DAT_SUCCESS)
		return;
	dat_strerror(rc, &major, &minor);
	die("%s failed: %s %s (0x%08x)", what, major, minor ? minor : "", (unsigned)rc);
}

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static DAT_TIMEOUT timeout_us(int seconds) { return (DAT_TIMEOUT)seconds * 1000000u; }

/*
 * The resident set in KiB: the Rss of /proc/self/smaps_rollup, which the kernel
 * counts by walking the page tables when it is read, so it is exact. statm's
 * resident count (the fallback, where smaps_rollup is missing) lags: before
 * Linux 6.2 each thread batches its RSS changes and publishes them only every
 * 64 page faults, so with a provider's helper threads a reading can miss
 * hundreds of KiB (in a 6.1 guest, 64 connections once read as no growth).
 */
static double rss_kib(void)
{
	FILE *f = fopen("/proc/self/smaps_rollup", "r");
	unsigned long size, resident;
	char line[256];

	if (f) {
		while (fgets(line, sizeof(line), f))
			if (sscanf(line, "Rss: %lu kB", &resident) == 1) {
				fclose(f);
				return (double)resident;
			}
		fclose(f);
	}
	f = fopen("/proc/self/statm", "r");
	if (!f)
		die("cannot open /proc/self/statm: %s", strerror(errno));
	if (fscanf(f, "%lu %lu", &size, &resident) != 2)
		die("cannot read /proc/self/statm");
	fclose(f);
	return resident * (sysconf(_SC_PAGESIZE) / 1024.0);
}

/* 4,096 connections need more descriptors than the usual soft limit of 1,024. */
static void raise_nofile(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
		die("getrlimit(RLIMIT_NOFILE): %s", strerror(errno));
	if (rl.rlim_cur == rl.rlim_max)
		return;
	rl.rlim_cur = rl.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
		die("setrlimit(RLIMIT_NOFILE, %llu): %s", (unsigned long long)rl.rlim_max, strerror(errno));
}

/* ----------------------------------------------------------------- events */

static const char *event_name(DAT_EVENT_NUMBER n)
{
	switch (n) {
	case DAT_DTO_COMPLETION_EVENT: return "DTO completion";
	case DAT_CONNECTION_REQUEST_EVENT: return "connection request";
	case DAT_CONNECTION_EVENT_ESTABLISHED: return "connection established";
	case DAT_CONNECTION_EVENT_PEER_REJECTED: return "connection rejected by peer";
	case DAT_CONNECTION_EVENT_NON_PEER_REJECTED: return "connection rejected (no listener?)";
	case DAT_CONNECTION_EVENT_ACCEPT_COMPLETION_ERROR: return "accept failed";
	case DAT_CONNECTION_EVENT_DISCONNECTED: return "disconnected";
	case DAT_CONNECTION_EVENT_BROKEN: return "connection broken";
	case DAT_CONNECTION_EVENT_TIMED_OUT: return "connection timed out";
	case DAT_CONNECTION_EVENT_UNREACHABLE: return "peer unreachable";
	case DAT_ASYNC_ERROR_EVD_OVERFLOW: return "EVD overflow";
	default: return "unexpected event";
	}
}

static const char *dto_status_name(DAT_DTO_COMPLETION_STATUS st)
{
	static const char *const names[] = {
		"DAT_DTO_SUCCESS", "DAT_DTO_ERR_FLUSHED (connection gone)",
		"DAT_DTO_ERR_LOCAL_LENGTH", "DAT_DTO_ERR_LOCAL_EP", "DAT_DTO_ERR_LOCAL_PROTECTION",
		"DAT_DTO_ERR_BAD_RESPONSE", "DAT_DTO_ERR_REMOTE_ACCESS",
		"DAT_DTO_ERR_REMOTE_RESPONDER", "DAT_DTO_ERR_TRANSPORT",
		"DAT_DTO_ERR_RECEIVER_NOT_READY", "DAT_DTO_ERR_PARTIAL_PACKET",
	};

	return (unsigned)st < sizeof(names) / sizeof(names[0]) ? names[st] : "unknown status";
}

/* A blocking wait for a connection or connection request event, bounded. */
static void wait_event(DAT_EVD_HANDLE evd, int seconds, DAT_EVENT *ev, const char *what)
{
	DAT_COUNT nmore;

	check(dat_evd_wait(evd, timeout_us(seconds), 1, ev, &nmore), what);
}

/*
 * The ping-pong's wait: dat_evd_dequeue in a loop, no sched_yield, no
 * dat_evd_wait (as a polling MPI rank does), bounded by -T.
 */
static void spin_event(DAT_EVD_HANDLE evd, DAT_EVENT *ev, const char *what)
{
	double deadline = 0;
	unsigned spins = 0;
	DAT_RETURN rc;

	while ((rc = dat_evd_dequeue(evd, ev)) != DAT_SUCCESS) {
		if (DAT_GET_TYPE(rc) != DAT_QUEUE_EMPTY)
			check(rc, what);
		if (++spins % 1024 == 0) {
			double t = now_us();

			if (deadline == 0)
				deadline = t + opt.timeout_s * 1e6;
			else if (t > deadline)
				die("%s: nothing within %d s (-T)", what, opt.timeout_s);
		}
	}
}

/* ---------------------------------------------------------------- set-up */

/* Messages: a ping, pong or control message in the first bytes of a slot. */
enum msg_kind { MSG_PING = 1, MSG_PONG, MSG_STATS, MSG_REPORT, MSG_END, MSG_BYE };

struct msg {                    /* PING_BYTES: the ping-pong's 8 B */
	uint32_t kind;
	uint32_t seq;
};

struct report {                 /* the server's figures (MSG_REPORT) */
	uint32_t kind;
	uint32_t nconn;
	double rss_before_kib;
	double rss_after_kib;
	double accept_us;
};

_Static_assert(sizeof(struct msg) == PING_BYTES, "a ping is 8 bytes");
_Static_assert(sizeof(struct report) <= SLOT, "a report fits a slot");

/* A side: its IA, the EVDs all its EPs share, its EPs and their buffers. */
struct side {
	DAT_IA_HANDLE ia;
	DAT_IA_ATTR ia_attr;
	DAT_EVD_HANDLE async_evd, req_evd, rcv_evd, conn_evd, cr_evd;
	DAT_PZ_HANDLE pz;
	DAT_EP_HANDLE *ep;              /* [nconn] */
	uint8_t *sbuf, *rbuf;           /* [nconn * SLOT]: EP i's send and receive slots */
	DAT_LMR_HANDLE slmr, rlmr;
	DAT_LMR_CONTEXT slc, rlc;
	double *samples;                /* [iters] */
	double rss_before;
};

static DAT_DTO_COOKIE cookie(uint64_t v)
{
	DAT_DTO_COOKIE c;

	c.as_64 = v;
	return c;
}

static void register_buffer(struct side *s, uint8_t **base, size_t len, DAT_LMR_HANDLE *lmr,
			    DAT_LMR_CONTEXT *lc)
{
	DAT_REGION_DESCRIPTION region;
	DAT_RMR_CONTEXT rc;
	DAT_VLEN reg_len;
	DAT_VADDR reg_addr;

	if (posix_memalign((void **)base, 4096, len) != 0)
		die("out of memory (%zu bytes)", len);
	memset(*base, 0, len);
	region.for_va = *base;
	check(dat_lmr_create(s->ia, DAT_MEM_TYPE_VIRTUAL, region, len, s->pz, DAT_MEM_PRIV_ALL_FLAG,
			     DAT_VA_TYPE_VA, lmr, lc, &rc, &reg_len, &reg_addr),
	      "dat_lmr_create");
}

/*
 * Opens the IA and creates everything but the EPs (the caller then reads the
 * resident set: what follows is what the connections cost). Every buffer and
 * array is touched here.
 */
static void open_side(struct side *s, int server)
{
	DAT_PROVIDER_ATTR pattr;
	int n = opt.nconn;

	memset(s, 0, sizeof(*s));
	s->async_evd = DAT_HANDLE_NULL;
	check(dat_ia_open(opt.ia_name, 8, &s->async_evd, &s->ia), "dat_ia_open");
	check(dat_ia_query(s->ia, NULL, DAT_IA_ALL, &s->ia_attr, 0, &pattr), "dat_ia_query");
	if (s->ia_attr.max_evd_qlen > 0 && n + EVD_SLACK > s->ia_attr.max_evd_qlen)
		die("%d connections need EVDs of %d entries; the IA allows %d", n, n + EVD_SLACK,
		    (int)s->ia_attr.max_evd_qlen);
	if (s->ia_attr.max_eps > 0 && n > s->ia_attr.max_eps)
		die("%d connections: the IA allows %d EPs", n, (int)s->ia_attr.max_eps);
	check(dat_pz_create(s->ia, &s->pz), "dat_pz_create");
	check(dat_evd_create(s->ia, EVD_SLACK, DAT_HANDLE_NULL, DAT_EVD_DTO_FLAG, &s->req_evd),
	      "dat_evd_create (requests)");
	check(dat_evd_create(s->ia, n + EVD_SLACK, DAT_HANDLE_NULL, DAT_EVD_DTO_FLAG, &s->rcv_evd),
	      "dat_evd_create (receives)");
	check(dat_evd_create(s->ia, n + EVD_SLACK, DAT_HANDLE_NULL, DAT_EVD_CONNECTION_FLAG,
			     &s->conn_evd), "dat_evd_create (connections)");
	register_buffer(s, &s->sbuf, (size_t)n * SLOT, &s->slmr, &s->slc);
	register_buffer(s, &s->rbuf, (size_t)n * SLOT, &s->rlmr, &s->rlc);
	s->ep = calloc(n, sizeof(*s->ep));
	s->samples = calloc(opt.iters, sizeof(*s->samples));
	if (!s->ep || !s->samples)
		die("out of memory");
	memset(s->ep, 0, n * sizeof(*s->ep));
	memset(s->samples, 0, opt.iters * sizeof(*s->samples));
	if (server)
		check(dat_evd_create(s->ia, n + EVD_SLACK, DAT_HANDLE_NULL, DAT_EVD_CR_FLAG, &s->cr_evd),
		      "dat_evd_create (connection requests)");
}

static void post_recv(struct side *s, int i)
{
	DAT_LMR_TRIPLET t;

	t.lmr_context = s->rlc;
	t.virtual_address = (DAT_VADDR)(uintptr_t)(s->rbuf + (size_t)i * SLOT);
	t.segment_length = SLOT;
	check(dat_ep_post_recv(s->ep[i], 1, &t, cookie(i), DAT_COMPLETION_DEFAULT_FLAG),
	      "dat_ep_post_recv");
}

/* EP i, its index as its consumer context, its receive posted. */
static void create_ep(struct side *s, int i)
{
	DAT_EP_ATTR a;
	DAT_CONTEXT ctx;

	memset(&a, 0, sizeof(a));
	a.service_type = DAT_SERVICE_TYPE_RC;
	a.max_message_size = SLOT;
	a.max_rdma_size = SLOT;
	a.qos = DAT_QOS_BEST_EFFORT;
	a.recv_completion_flags = DAT_COMPLETION_DEFAULT_FLAG;
	a.request_completion_flags = DAT_COMPLETION_DEFAULT_FLAG;
	a.max_recv_dtos = EP_DTOS;
	a.max_request_dtos = EP_DTOS;
	a.max_recv_iov = 1;
	a.max_request_iov = 1;
	a.max_rdma_read_in = 1;
	a.max_rdma_read_out = 1;
	a.max_rdma_read_iov = 1;
	a.max_rdma_write_iov = 1;
	check(dat_ep_create(s->ia, s->pz, s->rcv_evd, s->req_evd, s->conn_evd, &a, &s->ep[i]),
	      i == 0 ? "dat_ep_create" : "dat_ep_create (after the first)");
	ctx.as_64 = (uint64_t)i;
	check(dat_set_consumer_context(s->ep[i], ctx), "dat_set_consumer_context (EP)");
	post_recv(s, i);
}

/* The index of the EP a connection event names. */
static int ep_index(struct side *s, DAT_EP_HANDLE ep, const char *what)
{
	DAT_CONTEXT ctx;

	check(dat_get_consumer_context(ep, &ctx), what);
	if (ctx.as_64 >= (uint64_t)opt.nconn || s->ep[ctx.as_64] != ep)
		die("%s: an event for an EP that is not ours (%p)", what, (void *)ep);
	return (int)ctx.as_64;
}

/* -------------------------------------------------------------- messages */

static void post_send(struct side *s, int i, uint32_t len)
{
	DAT_LMR_TRIPLET t;

	t.lmr_context = s->slc;
	t.virtual_address = (DAT_VADDR)(uintptr_t)(s->sbuf + (size_t)i * SLOT);
	t.segment_length = len;
	check(dat_ep_post_send(s->ep[i], 1, &t, cookie(i), DAT_COMPLETION_DEFAULT_FLAG),
	      "dat_ep_post_send");
}

/* A DTO completion on EP i (cookie i), successful; of `len` bytes unless 0. */
static void check_dto(struct side *s, const DAT_EVENT *ev, int i, uint32_t len, const char *what)
{
	const DAT_DTO_COMPLETION_EVENT_DATA *d = &ev->event_data.dto_completion_event_data;

	if (ev->event_number != DAT_DTO_COMPLETION_EVENT)
		die("%s: %s (0x%x) instead of a completion", what, event_name(ev->event_number),
		    (unsigned)ev->event_number);
	if (d->status != DAT_DTO_SUCCESS)
		die("%s: completion status %d, %s", what, (int)d->status, dto_status_name(d->status));
	if (i >= 0 && (d->user_cookie.as_64 != (uint64_t)i || d->ep_handle != s->ep[i]))
		die("%s: completion of EP %llu (%p), expected EP %d (%p)", what,
		    (unsigned long long)d->user_cookie.as_64, (void *)d->ep_handle, i, (void *)s->ep[i]);
	if (len && d->transfered_length != len)
		die("%s: %u bytes, expected %u", what, (unsigned)d->transfered_length, len);
}

/* Sends slot i's first `len` bytes on EP i and reaps the send's completion. */
static void send_and_reap(struct side *s, int i, uint32_t len, const char *what)
{
	DAT_EVENT ev;

	post_send(s, i, len);
	spin_event(s->req_evd, &ev, what);
	check_dto(s, &ev, i, 0, what);
}

/* ---------------------------------------------------------------- server */

static int run_server(void)
{
	struct side s;
	DAT_PSP_HANDLE psp;
	DAT_EVENT ev;
	char addr[64];
	struct sockaddr *sa;
	int n = opt.nconn, accepted = 0, established = 0;
	double t_first = 0, t_last;

	side_name = "datscale (server)";
	open_side(&s, 1);
	check(dat_psp_create(s.ia, opt.conn_qual, s.cr_evd, DAT_PSP_CONSUMER_FLAG, &psp),
	      "dat_psp_create");
	s.rss_before = rss_kib();
	sa = (struct sockaddr *)s.ia_attr.ia_address_ptr;
	snprintf(addr, sizeof(addr), "?");
	if (sa && sa->sa_family == AF_INET)
		inet_ntop(AF_INET, &((struct sockaddr_in *)sa)->sin_addr, addr, sizeof(addr));
	/* Scripts wait for this line: print it only once we listen. */
	printf("datscale: server listening on %s conn_qual %llu (IA %s, %d connections)\n", addr,
	       (unsigned long long)opt.conn_qual, opt.ia_name, n);
	fflush(stdout);

	/* Every request gets a new EP, its receive posted before it is accepted. */
	while (accepted < n) {
		char what[96];

		snprintf(what, sizeof(what), "waiting for connection request %d of %d", accepted + 1, n);
		wait_event(s.cr_evd, accepted ? opt.timeout_s : opt.accept_timeout_s, &ev, what);
		if (ev.event_number != DAT_CONNECTION_REQUEST_EVENT)
			die("%s: %s (event 0x%x)", what, event_name(ev.event_number),
			    (unsigned)ev.event_number);
		if (!accepted)
			t_first = now_us();
		create_ep(&s, accepted);
		check(dat_cr_accept(ev.event_data.cr_arrival_event_data.cr_handle, s.ep[accepted], 0, NULL),
		      "dat_cr_accept");
		accepted++;
		/* Take the ESTABLISHED events as they come (the EVD holds them all anyway). */
		while (dat_evd_dequeue(s.conn_evd, &ev) == DAT_SUCCESS) {
			if (ev.event_number != DAT_CONNECTION_EVENT_ESTABLISHED)
				die("accepting: %s (event 0x%x)", event_name(ev.event_number),
				    (unsigned)ev.event_number);
			ep_index(&s, ev.event_data.connect_event_data.ep_handle, "accepting");
			established++;
		}
	}
	while (established < n) {
		wait_event(s.conn_evd, opt.timeout_s, &ev, "waiting for the accepted connections");
		if (ev.event_number != DAT_CONNECTION_EVENT_ESTABLISHED)
			die("accepting: %s (event 0x%x)", event_name(ev.event_number), (unsigned)ev.event_number);
		ep_index(&s, ev.event_data.connect_event_data.ep_handle, "accepting");
		established++;
	}
	t_last = now_us();
	double rss_after = rss_kib();

	printf("datscale: server: %d connections accepted in %.3f s, RSS %.0f -> %.0f KiB (%.1f KiB per connection)\n",
	       n, (t_last - t_first) / 1e6, s.rss_before, rss_after, (rss_after - s.rss_before) / n);
	fflush(stdout);

	/* Echo: a pong for every ping on its EP, our figures for STATS, until END. */
	for (;;) {
		struct msg *in, *out;
		int i;

		spin_event(s.rcv_evd, &ev, "waiting for the client's next message");
		check_dto(&s, &ev, -1, 0, "receive");
		i = (int)ev.event_data.dto_completion_event_data.user_cookie.as_64;
		if (i < 0 || i >= n || ev.event_data.dto_completion_event_data.ep_handle != s.ep[i])
			die("receive: completion of EP %d, not of its receive's EP", i);
		in = (struct msg *)(s.rbuf + (size_t)i * SLOT);
		out = (struct msg *)(s.sbuf + (size_t)i * SLOT);
		if (in->kind == MSG_PING) {
			if (ev.event_data.dto_completion_event_data.transfered_length != PING_BYTES)
				die("receive: a ping of %u bytes",
				    (unsigned)ev.event_data.dto_completion_event_data.transfered_length);
			out->kind = MSG_PONG;
			out->seq = in->seq;
			post_recv(&s, i);
			send_and_reap(&s, i, PING_BYTES, "pong completion");
		} else if (in->kind == MSG_STATS) {
			struct report *r = (struct report *)(s.sbuf + (size_t)i * SLOT);

			if (in->seq != (uint32_t)n)
				die("the client has %u connections, the server %d: give both the same -c",
				    in->seq, n);
			r->kind = MSG_REPORT;
			r->nconn = n;
			r->rss_before_kib = s.rss_before;
			r->rss_after_kib = rss_after;
			r->accept_us = t_last - t_first;
			post_recv(&s, i);
			send_and_reap(&s, i, sizeof(*r), "report completion");
		} else if (in->kind == MSG_END) {
			/* Answered, so that the client tears down only once we are out of this loop. */
			out->kind = MSG_BYE;
			out->seq = 0;
			send_and_reap(&s, i, PING_BYTES, "bye completion");
			break;
		} else {
			die("receive: message kind %u", in->kind);
		}
	}

	/* The client disconnects EP 0 and closes: wait for that, then close. */
	for (;;) {
		wait_event(s.conn_evd, opt.timeout_s, &ev, "waiting for the client to leave");
		if (ev.event_number == DAT_CONNECTION_EVENT_DISCONNECTED ||
		    ev.event_number == DAT_CONNECTION_EVENT_BROKEN) {
			if (ep_index(&s, ev.event_data.connect_event_data.ep_handle, "leaving") == 0)
				break;
		} else {
			die("waiting for the client to leave: %s (event 0x%x)", event_name(ev.event_number),
			    (unsigned)ev.event_number);
		}
	}
	check(dat_psp_free(psp), "dat_psp_free");
	check(dat_ia_close(s.ia, DAT_CLOSE_ABRUPT_FLAG), "dat_ia_close");
	printf("datscale: server done\n");
	return 0;
}

/* ---------------------------------------------------------------- client */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* One round trip on EP i: ping, pong, the receive reposted, the ping's completion reaped. */
static double round_trip(struct side *s, int i, uint32_t seq)
{
	struct msg *out = (struct msg *)(s->sbuf + (size_t)i * SLOT);
	struct msg *in = (struct msg *)(s->rbuf + (size_t)i * SLOT);
	DAT_EVENT ev;

	out->kind = MSG_PING;
	out->seq = seq;
	double t0 = now_us();
	post_send(s, i, PING_BYTES);
	spin_event(s->rcv_evd, &ev, "waiting for a pong");
	check_dto(s, &ev, i, PING_BYTES, "pong");
	if (in->kind != MSG_PONG || in->seq != seq)
		die("pong on EP %d: kind %u seq %u, expected a pong to %u", i, in->kind, in->seq, seq);
	post_recv(s, i);
	spin_event(s->req_evd, &ev, "waiting for a ping's completion");
	check_dto(s, &ev, i, 0, "ping completion");
	return now_us() - t0;
}

/*
 * Mode all's warm-up: a ping on every EP, SWEEP_WINDOW in flight (quicker than N round
 * trips one at a time where a round trip costs O(N)), so that every EP has carried a
 * message before the measured ones. With -D it stops after that long, saying how far it
 * came (where a message costs tens of milliseconds, the measured loop reaches only the
 * first few hundred EPs anyway).
 */
static void sweep(struct side *s, uint32_t *seq)
{
	int n = opt.nconn, base;
	uint32_t first = *seq + 1;
	double t0 = now_us();

	for (base = 0; base < n; base += SWEEP_WINDOW) {
		if (opt.budget_s && now_us() - t0 > opt.budget_s * 1e6) {
			printf("# mode all: the warm-up reached %d of %d EPs in %d s (-D)\n", base, n, opt.budget_s);
			fflush(stdout);
			break;
		}
		int end = base + SWEEP_WINDOW < n ? base + SWEEP_WINDOW : n;
		int pongs = 0, completions = 0;
		double deadline = now_us() + opt.timeout_s * 1e6;
		DAT_EVENT ev;

		for (int i = base; i < end; i++) {
			struct msg *out = (struct msg *)(s->sbuf + (size_t)i * SLOT);

			out->kind = MSG_PING;
			out->seq = first + i;
			post_send(s, i, PING_BYTES);
		}
		while (pongs < end - base || completions < end - base) {
			if (now_us() > deadline)
				die("warm-up: %d of %d pongs and %d of %d ping completions within %d s (-T)", pongs,
				    end - base, completions, end - base, opt.timeout_s);
			if (pongs < end - base && dat_evd_dequeue(s->rcv_evd, &ev) == DAT_SUCCESS) {
				int i = (int)ev.event_data.dto_completion_event_data.user_cookie.as_64;
				const struct msg *in = (const struct msg *)(s->rbuf + (size_t)i * SLOT);

				check_dto(s, &ev, -1, PING_BYTES, "warm-up pong");
				if (i < base || i >= end || ev.event_data.dto_completion_event_data.ep_handle != s->ep[i] ||
				    in->kind != MSG_PONG || in->seq != first + i)
					die("warm-up: a pong on EP %d (seq %u), not one of EPs %d to %d", i, in->seq,
					    base, end - 1);
				post_recv(s, i);
				pongs++;
			}
			if (completions < end - base && dat_evd_dequeue(s->req_evd, &ev) == DAT_SUCCESS) {
				check_dto(s, &ev, -1, 0, "warm-up ping completion");
				completions++;
			}
		}
	}
	*seq = first + n;
}

static int run_client(void)
{
	struct side s;
	struct sockaddr_in sin;
	DAT_EVENT ev;
	int n = opt.nconn, next = 0, established = 0;
	uint32_t seq = 0;

	side_name = "datscale (client)";
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	if (inet_pton(AF_INET, opt.host, &sin.sin_addr) != 1)
		die("-h %s: not an IPv4 address (the server prints its IA address)", opt.host);
	open_side(&s, 0);
	s.rss_before = rss_kib();

	/* Every EP, then connects, -W outstanding at a time. */
	double t0 = now_us();
	for (int i = 0; i < n; i++)
		create_ep(&s, i);
	char *state = calloc(n, 1);
	if (!state)
		die("out of memory");
	while (established < n) {
		while (next < n && next - established < opt.window) {
			check(dat_ep_connect(s.ep[next], (DAT_IA_ADDRESS_PTR)&sin, opt.conn_qual,
					     timeout_us(opt.timeout_s), 0, NULL, DAT_QOS_BEST_EFFORT,
					     DAT_CONNECT_DEFAULT_FLAG),
			      next ? "dat_ep_connect (after the first)" : "dat_ep_connect");
			next++;
		}
		char what[96];
		snprintf(what, sizeof(what), "connecting (%d of %d established)", established, n);
		wait_event(s.conn_evd, opt.timeout_s, &ev, what);
		if (ev.event_number != DAT_CONNECTION_EVENT_ESTABLISHED)
			die("%s: %s (event 0x%x)", what, event_name(ev.event_number), (unsigned)ev.event_number);
		int i = ep_index(&s, ev.event_data.connect_event_data.ep_handle, what);
		if (state[i]++)
			die("%s: EP %d established twice", what, i);
		established++;
	}
	double conn_us = now_us() - t0;
	double rss_after = rss_kib();
	free(state);

	/* The server's figures, over EP 0. */
	struct msg *m = (struct msg *)s.sbuf;
	const struct report *r = (const struct report *)s.rbuf;
	m->kind = MSG_STATS;
	m->seq = (uint32_t)n;
	send_and_reap(&s, 0, PING_BYTES, "stats request completion");
	spin_event(s.rcv_evd, &ev, "waiting for the server's figures");
	check_dto(&s, &ev, 0, sizeof(*r), "the server's figures");
	if (r->kind != MSG_REPORT || r->nconn != (uint32_t)n)
		die("the server's figures: message kind %u, %u connections", r->kind, r->nconn);
	struct report srv = *r;
	post_recv(&s, 0);

	printf("# datscale: IA %s, server %s conn_qual %llu, %d connections (%d connects outstanding), "
	       "EP queues %d/%d, 8 B send/recv, both sides spin on dat_evd_dequeue\n",
	       opt.ia_name, opt.host, (unsigned long long)opt.conn_qual, n, opt.window, EP_DTOS, EP_DTOS);
	printf("# client RSS %.0f -> %.0f KiB, server RSS %.0f -> %.0f KiB\n", s.rss_before, rss_after,
	       srv.rss_before_kib, srv.rss_after_kib);
	fflush(stdout);

	for (int k = 0; k < opt.nmodes; k++) {
		int all = opt.modes[k] == MODE_ALL, done = 0, ep = 0;
		double deadline = 0;

		if (all)
			sweep(&s, &seq);
		for (int w = 0; w < WARMUP; w++) {
			round_trip(&s, ep, ++seq);
			if (all)
				ep = (ep + 1) % n;
		}
		if (opt.budget_s)
			deadline = now_us() + opt.budget_s * 1e6;
		while (done < opt.iters) {
			s.samples[done++] = round_trip(&s, ep, ++seq);
			if (all)
				ep = (ep + 1) % n;
			if (deadline && done >= WARMUP && done % 64 == 0 && now_us() > deadline)
				break;
		}
		qsort(s.samples, done, sizeof(double), cmp_double);
		double med = done % 2 ? s.samples[done / 2] : (s.samples[done / 2 - 1] + s.samples[done / 2]) / 2;
		double p99 = s.samples[(int)((done - 1) * 0.99 + 0.5)];
		printf("scale ia=%s n=%d mode=%s iters=%d rtt_med_us=%.2f rtt_p99_us=%.2f conn_s=%.3f "
		       "conn_per_s=%.0f accept_s_server=%.3f rss_kib_per_conn_client=%.1f "
		       "rss_kib_per_conn_server=%.1f\n",
		       opt.ia_name, n, all ? "all" : "one", done, med, p99, conn_us / 1e6, n / (conn_us / 1e6),
		       srv.accept_us / 1e6, (rss_after - s.rss_before) / n,
		       (srv.rss_after_kib - srv.rss_before_kib) / n);
		fflush(stdout);
	}

	/* What the modes' traffic touched (buffers a provider keeps per connection
	 * show here, not in the figure after connecting). */
	double rss_traffic = rss_kib();
	printf("# client RSS after the modes %.0f KiB (%.1f KiB per connection from before the first EP)\n",
	       rss_traffic, (rss_traffic - s.rss_before) / n);
	fflush(stdout);

	/* The server answers END and leaves once EP 0 is disconnected. */
	m->kind = MSG_END;
	m->seq = 0;
	send_and_reap(&s, 0, PING_BYTES, "end message completion");
	spin_event(s.rcv_evd, &ev, "waiting for the server's bye");
	check_dto(&s, &ev, 0, PING_BYTES, "the server's bye");
	if (((const struct msg *)s.rbuf)->kind != MSG_BYE)
		die("the server's bye: message kind %u", ((const struct msg *)s.rbuf)->kind);
	check(dat_ep_disconnect(s.ep[0], DAT_CLOSE_GRACEFUL_FLAG), "dat_ep_disconnect");
	for (;;) {
		wait_event(s.conn_evd, opt.timeout_s, &ev, "disconnecting");
		if (ev.event_number != DAT_CONNECTION_EVENT_DISCONNECTED &&
		    ev.event_number != DAT_CONNECTION_EVENT_BROKEN)
			die("disconnecting: %s (event 0x%x)", event_name(ev.event_number),
			    (unsigned)ev.event_number);
		if (ep_index(&s, ev.event_data.connect_event_data.ep_handle, "disconnecting") == 0)
			break;
	}
	check(dat_ia_close(s.ia, DAT_CLOSE_ABRUPT_FLAG), "dat_ia_close");
	return 0;
}

/* ---------------------------------------------------------- command line */

static void usage(void)
{
	fprintf(stderr,
		"usage: datscale [-P IA] -s -c N [options]            server (one client, then exit)\n"
		"       datscale [-P IA] -h SERVER_IP -c N [options]  client\n"
		"  -P IA        dat.conf entry (default rs-tcp)\n"
		"  -q QUAL      conn_qual (default 18717)\n"
		"  -c N         connections, the same on both sides (default 1, at most %d)\n"
		"  -n N         measured round trips per mode (default 10000)\n"
		"  -m MODES     one (every round trip on EP 0), all (each on the next EP in turn),\n"
		"               or one,all / all,one (both, in that order, on the same connections;\n"
		"               default one)\n"
		"  -W N         client: connects outstanding at once (default 64)\n"
		"  -D SEC       client: a mode's measured loop stops after SEC s, with at least\n"
		"               %d round trips, and mode all's warm-up over every EP after\n"
		"               SEC s (default 0: after -n, and every EP)\n"
		"  -T SEC       timeout of every wait (default 30)\n"
		"  -A SEC       server: how long to wait for the first connection request (default 120)\n",
		MAX_CONN, WARMUP);
	exit(2);
}

static int number(const char *arg, int lo, int hi)
{
	char *end;
	long v = strtol(arg, &end, 10);

	if (*end || end == arg || v < lo || v > hi)
		die("bad number '%s' (%d to %d)", arg, lo, hi);
	return (int)v;
}

int main(int argc, char **argv)
{
	int server = 0, c;

	while ((c = getopt(argc, argv, "P:sh:q:c:n:m:W:D:T:A:")) != -1) {
		switch (c) {
		case 'P': opt.ia_name = optarg; break;
		case 's': server = 1; break;
		case 'h': opt.host = optarg; break;
		case 'q': opt.conn_qual = strtoull(optarg, NULL, 0); break;
		case 'c': opt.nconn = number(optarg, 1, MAX_CONN); break;
		case 'n': opt.iters = number(optarg, 1, 100000000); break;
		case 'm':
			opt.nmodes = 0;
			for (char *save = NULL, *w = strtok_r(optarg, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
				if (opt.nmodes == 2 || (strcmp(w, "one") && strcmp(w, "all")))
					usage();
				opt.modes[opt.nmodes++] = strcmp(w, "one") ? MODE_ALL : MODE_ONE;
			}
			if (!opt.nmodes || (opt.nmodes == 2 && opt.modes[0] == opt.modes[1]))
				usage();
			break;
		case 'W': opt.window = number(optarg, 1, MAX_CONN); break;
		case 'D': opt.budget_s = number(optarg, 0, 4000); break;
		case 'T': opt.timeout_s = number(optarg, 1, 4000); break;       /* DAT_TIMEOUT: 32-bit us */
		case 'A': opt.accept_timeout_s = number(optarg, 1, 4000); break;
		default: usage();
		}
	}
	if (optind != argc || server == (opt.host != NULL))
		usage();
	raise_nofile();
	return server ? run_server() : run_client();
}
