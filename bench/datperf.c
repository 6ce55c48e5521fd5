/*
 * datperf: a perftest-style benchmark over the DAT 2.0 API.
 *
 * It calls nothing but <dat2/udat.h>, so the same binary measures any DAT
 * provider: udapl-rs's rs-tcp, or OFED's providers through OFED's libdat2.
 *
 *   datperf -P rs-tcp -s                  server: serves one client, then exits
 *   datperf -P rs-tcp -h 127.0.0.1        client: runs the tests, prints a table
 *
 * Tests (as perftest's ib_*_lat / ib_*_bw):
 *   send_lat   send/recv ping-pong; one-way latency = RTT/2
 *   write_lat  RDMA write ping-pong: each side writes into the peer's buffer
 *              and polls the last byte of its own buffer; one-way = RTT/2
 *   read_lat   one RDMA read at a time; the full read time
 *   send_bw, write_bw, read_bw: a window of outstanding operations
 *   reg_write, reg_read  a rendezvous message as an MPI library without a
 *              registration cache moves it: the target registers its buffer
 *              and sends its rmr_context, the initiator registers its own,
 *              RDMA-writes into it (reads from it), sends a finish message,
 *              and both free their registrations; the same unregistered
 *              buffers every round. Time per round, and the initiator's
 *              dat_lmr_create and dat_lmr_free (rows lmr_create, lmr_free)
 *
 * Waits: dat_evd_wait by default; -p polls with dat_evd_dequeue. A busy wait
 * (a poll, write_lat's wait on its buffer) yields the CPU between looks by
 * default (-y yield, which lets a software provider's threads run on it); -y
 * spin does not, as real programs that spin do, and send_lat then also waits
 * on its receive buffer's last byte, before it reaps the receive; read_lat's
 * server then spins on its memory while it is read (a passive target), until
 * the client's end mark.
 *
 * The client drives; the server follows commands sent over the same
 * connection. Every wait is bounded (-T), and any DAT error prints its
 * dat_strerror() name and exits non-zero.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <dat2/udat.h>

/* ------------------------------------------------------------------ options */

enum test_id {
	SEND_LAT, WRITE_LAT, READ_LAT, SEND_BW, WRITE_BW, READ_BW, REG_WRITE, REG_READ, NTESTS
};

static const char *const test_names[NTESTS] = {
	"send_lat", "write_lat", "read_lat", "send_bw", "write_bw", "read_bw",
	"reg_write", "reg_read",
};

static int is_reg_test(int t) { return t == REG_WRITE || t == REG_READ; }
static int is_latency_test(int t) { return t <= READ_LAT || is_reg_test(t); }

#define MAX_SIZES 64
#define MIN_ITERS 20            /* never fewer samples than this */
#define WARMUP_MAX 100          /* latency tests discard up to this many first samples */
#define CTRL_COOKIE 0xc7c70000u /* recv cookie of control messages, + ring slot */
#define CTRL_SLOTS 4            /* control recvs in flight: at most 2 */
#define DATA_COOKIE 0xd4d4d4d4u /* recv cookie of data messages */

static struct options {
	char *ia_name;                 /* OFED declares dat_ia_open with a non-const name */
	const char *host;              /* NULL: server */
	DAT_CONN_QUAL conn_qual;
	int run[NTESTS];               /* which tests the client runs */
	uint32_t sizes[MAX_SIZES];
	int nsizes;
	int lat_iters;                 /* latency iterations (before the byte budget) */
	int bw_iters;                  /* bandwidth iterations (before the byte budget) */
	uint64_t budget;               /* bytes per test point; 0 = no cap */
	int window;                    /* outstanding operations in bandwidth tests */
	int timeout_s;                 /* every wait for the peer */
	int accept_timeout_s;          /* the server's wait for a client */
	int poll;                      /* busy-poll EVDs instead of dat_evd_wait */
	int spin;                      /* busy waits spin without sched_yield (-y spin) */
	int mem_evd;                   /* waits on memory also dequeue the request EVD (-e) */
} opt = {
	.ia_name = "rs-tcp",
	.conn_qual = 18515,
	.lat_iters = 1000,
	.bw_iters = 2000,
	.budget = 256u << 20,
	.window = 32,
	.timeout_s = 20,
	.accept_timeout_s = 120,
};

/* ------------------------------------------------------------ error exits */

static void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fputs("datperf: ", stderr);
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

/* ---------------------------------------------------------------- session */

/* A registered buffer. */
struct buffer {
	uint8_t *base;
	DAT_VLEN len;
	DAT_LMR_HANDLE lmr;
	DAT_LMR_CONTEXT lmr_context;
	DAT_RMR_CONTEXT rmr_context;
};

/*
 * Control messages. Both peers are assumed to share byte order (the
 * benchmark runs between like hosts); the magic catches a mismatch.
 */
enum msg_kind { MSG_HELLO = 1, MSG_CMD, MSG_READY, MSG_DONE, MSG_QUIT, MSG_CTS, MSG_FINISH };

#define MSG_MAGIC 0x46525044u   /* "DPRF" */

struct ctrl_msg {
	uint32_t magic;
	uint32_t kind;
	uint32_t test;          /* CMD */
	uint32_t size;          /* CMD */
	uint32_t iters;         /* CMD: total, warm-up included */
	uint32_t rmr_context;   /* HELLO: the sender's data buffer; CTS: its message buffer */
	uint64_t addr;          /* HELLO, CTS */
	uint64_t len;           /* HELLO, CTS */
	uint32_t rdma_read_in;  /* HELLO: reads the sender accepts at once */
	uint32_t pad;
};

struct session {
	DAT_IA_HANDLE ia;
	DAT_EVD_HANDLE async_evd, req_evd, rcv_evd, conn_evd, cr_evd;
	DAT_PZ_HANDLE pz;
	DAT_EP_HANDLE ep;
	DAT_IA_ATTR ia_attr;
	int rdma_read_in, rdma_read_out;   /* what our EP was created with */
	int recv_depth;                    /* recvs the server keeps posted in send_bw */
	struct buffer data;     /* the peer writes into and reads from it */
	struct buffer local;    /* source of our sends and writes, target of our reads */
	struct buffer ctrl;     /* control messages: [0] to send, then a ring to receive */
	uint8_t *msg;           /* reg_write/reg_read: registered anew every round */
	int ctrl_next;          /* the ring slot the next control recv uses */
	DAT_RMR_TRIPLET peer;   /* the peer's data buffer */
	int read_window;        /* outstanding reads: ours out, bounded by the peer's in */
};

static struct ctrl_msg *ctrl_out(struct session *s) { return (struct ctrl_msg *)s->ctrl.base; }
static struct ctrl_msg *ctrl_in(struct session *s, int slot)
{
	return (struct ctrl_msg *)s->ctrl.base + 1 + slot;
}

static DAT_TIMEOUT timeout_us(int seconds) { return (DAT_TIMEOUT)seconds * 1000000u; }

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

/*
 * Waits for one event. Blocking (dat_evd_wait) is the default: on a small
 * host, busy-polling threads starve a software provider's progress thread.
 * With -p it polls, yielding the CPU between looks (-y yield, the default)
 * or not (-y spin: as programs that poll do).
 */
static void wait_event(DAT_EVD_HANDLE evd, int seconds, DAT_EVENT *ev, const char *what)
{
	DAT_COUNT nmore;
	DAT_RETURN rc;
	double deadline;

	if (!opt.poll) {
		check(dat_evd_wait(evd, timeout_us(seconds), 1, ev, &nmore), what);
		return;
	}
	deadline = now_us() + seconds * 1e6;
	while ((rc = dat_evd_dequeue(evd, ev)) != DAT_SUCCESS) {
		if (DAT_GET_TYPE(rc) != DAT_QUEUE_EMPTY)
			check(rc, what);
		if (now_us() > deadline)
			check(DAT_TIMEOUT_EXPIRED, what);
		if (!opt.spin)
			sched_yield();
	}
}

/* Events a wait on memory dequeued (-e) before wait_dto asked for them. */
static struct {
	DAT_EVD_HANDLE evd;
	int n;
	DAT_EVENT ev[4];
} banked;

/* Waits for a DTO completion and insists that it succeeded. */
static DAT_DTO_COMPLETION_EVENT_DATA wait_dto(DAT_EVD_HANDLE evd, const char *what)
{
	DAT_EVENT ev;
	DAT_DTO_COMPLETION_EVENT_DATA *dto = &ev.event_data.dto_completion_event_data;

	if (banked.n && banked.evd == evd) {
		ev = banked.ev[0];
		memmove(banked.ev, banked.ev + 1, --banked.n * sizeof(banked.ev[0]));
	} else {
		wait_event(evd, opt.timeout_s, &ev, what);
	}
	if (ev.event_number != DAT_DTO_COMPLETION_EVENT)
		die("%s: got %s (0x%x) instead of a completion", what,
		    event_name(ev.event_number), (unsigned)ev.event_number);
	if (dto->status != DAT_DTO_SUCCESS)
		die("%s: completion status %d, %s", what, (int)dto->status,
		    dto_status_name(dto->status));
	return *dto;
}

static void wait_conn_event(struct session *s, DAT_EVENT_NUMBER want, const char *what)
{
	DAT_EVENT ev;

	wait_event(s->conn_evd, opt.timeout_s, &ev, what);
	if (ev.event_number != want)
		die("%s: %s (event 0x%x)", what, event_name(ev.event_number),
		    (unsigned)ev.event_number);
}

/* ---------------------------------------------------------------- set-up */

static void register_buffer(struct session *s, struct buffer *b, size_t len)
{
	DAT_REGION_DESCRIPTION region;
	DAT_VLEN reg_len;
	DAT_VADDR reg_addr;

	/* Page alignment: what a verbs provider pins anyway. */
	if (posix_memalign((void **)&b->base, 4096, len) != 0)
		die("out of memory (%zu bytes)", len);
	memset(b->base, 0, len);
	b->len = len;
	region.for_va = b->base;
	check(dat_lmr_create(s->ia, DAT_MEM_TYPE_VIRTUAL, region, len, s->pz,
			     DAT_MEM_PRIV_ALL_FLAG, DAT_VA_TYPE_VA, &b->lmr,
			     &b->lmr_context, &b->rmr_context, &reg_len, &reg_addr),
	      "dat_lmr_create");
}

static void free_buffer(struct buffer *b)
{
	check(dat_lmr_free(b->lmr), "dat_lmr_free");
	free(b->base);
}

static uint32_t max_size(void)
{
	uint32_t m = sizeof(struct ctrl_msg);

	for (int i = 0; i < opt.nsizes; i++)
		if (opt.sizes[i] > m)
			m = opt.sizes[i];
	return m;
}

static int min_int(int a, int b) { return a < b ? a : b; }

/* Opens the IA and creates everything but the endpoint. */
static void open_session(struct session *s)
{
	DAT_PROVIDER_ATTR pattr;
	int w = opt.window;

	memset(s, 0, sizeof(*s));
	s->async_evd = DAT_HANDLE_NULL;
	check(dat_ia_open(opt.ia_name, 8, &s->async_evd, &s->ia), "dat_ia_open");
	check(dat_ia_query(s->ia, NULL, DAT_IA_ALL, &s->ia_attr, 0, &pattr), "dat_ia_query");
	if (max_size() > s->ia_attr.max_message_size || max_size() > s->ia_attr.max_rdma_size)
		die("size %u exceeds the IA's limits (message %u, RDMA %u bytes)", max_size(),
		    (unsigned)s->ia_attr.max_message_size, (unsigned)s->ia_attr.max_rdma_size);

	/* Reads in flight are a per-EP resource the IA bounds (16 on many HCAs). */
	s->rdma_read_in = min_int(w, s->ia_attr.max_rdma_read_per_ep_in);
	s->rdma_read_out = min_int(w, s->ia_attr.max_rdma_read_per_ep_out);
	s->recv_depth = 2 * w;

	check(dat_pz_create(s->ia, &s->pz), "dat_pz_create");
	check(dat_evd_create(s->ia, w + 16, DAT_HANDLE_NULL, DAT_EVD_DTO_FLAG, &s->req_evd),
	      "dat_evd_create (requests)");
	check(dat_evd_create(s->ia, s->recv_depth + 16, DAT_HANDLE_NULL, DAT_EVD_DTO_FLAG,
			     &s->rcv_evd), "dat_evd_create (receives)");
	check(dat_evd_create(s->ia, 8, DAT_HANDLE_NULL, DAT_EVD_CONNECTION_FLAG, &s->conn_evd),
	      "dat_evd_create (connection)");
	/* One spare byte past every test's data: read_lat's end mark (post_end_mark). */
	register_buffer(s, &s->data, max_size() + 1);
	register_buffer(s, &s->local, max_size() + 1);
	register_buffer(s, &s->ctrl, (1 + CTRL_SLOTS) * sizeof(struct ctrl_msg));
	/* Heap memory nobody registered for long: what a message layer registers per message. */
	if (posix_memalign((void **)&s->msg, 4096, max_size()) != 0)
		die("out of memory (%u bytes)", max_size());
	memset(s->msg, 0, max_size());
}

static void create_ep(struct session *s)
{
	DAT_EP_ATTR a;

	memset(&a, 0, sizeof(a));
	a.service_type = DAT_SERVICE_TYPE_RC;
	a.max_message_size = max_size();
	a.max_rdma_size = max_size();
	a.qos = DAT_QOS_BEST_EFFORT;
	a.recv_completion_flags = DAT_COMPLETION_DEFAULT_FLAG;
	a.request_completion_flags = DAT_COMPLETION_DEFAULT_FLAG;
	a.max_recv_dtos = s->recv_depth + 4;      /* + the control receive */
	a.max_request_dtos = opt.window + 4;      /* + a control send */
	a.max_recv_iov = 1;
	a.max_request_iov = 1;
	a.max_rdma_read_in = s->rdma_read_in;
	a.max_rdma_read_out = s->rdma_read_out;
	a.max_rdma_read_iov = 1;
	a.max_rdma_write_iov = 1;
	check(dat_ep_create(s->ia, s->pz, s->rcv_evd, s->req_evd, s->conn_evd, &a, &s->ep),
	      "dat_ep_create");
}

static void close_session(struct session *s)
{
	check(dat_ep_free(s->ep), "dat_ep_free");
	free_buffer(&s->ctrl);
	free_buffer(&s->local);
	free_buffer(&s->data);
	free(s->msg);
	check(dat_evd_free(s->conn_evd), "dat_evd_free");
	check(dat_evd_free(s->rcv_evd), "dat_evd_free");
	check(dat_evd_free(s->req_evd), "dat_evd_free");
	check(dat_pz_free(s->pz), "dat_pz_free");
	check(dat_ia_close(s->ia, DAT_CLOSE_DEFAULT), "dat_ia_close");
}

/* ---------------------------------------------------------- data transfer */

static DAT_DTO_COOKIE cookie(uint64_t v)
{
	DAT_DTO_COOKIE c;

	c.as_64 = v;
	return c;
}

static DAT_LMR_TRIPLET iov(struct buffer *b, size_t offset, uint32_t len)
{
	DAT_LMR_TRIPLET t;

	t.virtual_address = (DAT_VADDR)(uintptr_t)(b->base + offset);
	t.segment_length = len;
	t.lmr_context = b->lmr_context;
	return t;
}

static void post_send(struct session *s, struct buffer *b, size_t off, uint32_t len)
{
	DAT_LMR_TRIPLET t = iov(b, off, len);

	check(dat_ep_post_send(s->ep, 1, &t, cookie(0), DAT_COMPLETION_DEFAULT_FLAG),
	      "dat_ep_post_send");
}

static void post_recv(struct session *s, struct buffer *b, size_t off, uint32_t len,
		      uint64_t tag)
{
	DAT_LMR_TRIPLET t = iov(b, off, len);

	check(dat_ep_post_recv(s->ep, 1, &t, cookie(tag), DAT_COMPLETION_DEFAULT_FLAG),
	      "dat_ep_post_recv");
}

/* The first `len` bytes of our local buffer to the peer's data buffer. */
static void post_write(struct session *s, uint32_t len)
{
	DAT_LMR_TRIPLET t = iov(&s->local, 0, len);
	DAT_RMR_TRIPLET r = s->peer;

	r.segment_length = len;
	check(dat_ep_post_rdma_write(s->ep, 1, &t, cookie(0), &r, DAT_COMPLETION_DEFAULT_FLAG),
	      "dat_ep_post_rdma_write");
}

/* The first `len` bytes of the peer's data buffer into our local buffer. */
static void post_read(struct session *s, uint32_t len)
{
	DAT_LMR_TRIPLET t = iov(&s->local, 0, len);
	DAT_RMR_TRIPLET r = s->peer;

	r.segment_length = len;
	check(dat_ep_post_rdma_read(s->ep, 1, &t, cookie(0), &r, DAT_COMPLETION_DEFAULT_FLAG),
	      "dat_ep_post_rdma_read");
}

/*
 * The spare last byte of the peer's data buffer set to `v` by an RDMA write: with -y spin,
 * read_lat's server spins on it while the client reads (a passive target that makes no
 * DAT call, as over a NIC).
 */
static void post_end_mark(struct session *s, uint8_t v)
{
	DAT_LMR_TRIPLET t = iov(&s->local, s->local.len - 1, 1);
	DAT_RMR_TRIPLET r = s->peer;

	s->local.base[s->local.len - 1] = v;
	r.virtual_address += r.segment_length - 1;
	r.segment_length = 1;
	check(dat_ep_post_rdma_write(s->ep, 1, &t, cookie(0), &r, DAT_COMPLETION_DEFAULT_FLAG),
	      "dat_ep_post_rdma_write (end mark)");
}

/* ------------------------------------------------------- control messages */

/*
 * Receives match posted recvs in order, so the protocol posts the control
 * recv only after the last data recv of a test, and always before sending
 * anything the peer answers. Each control recv gets its own slot: a second
 * message may land before we have read the first.
 */
static void post_ctrl_recv(struct session *s)
{
	int slot = s->ctrl_next;

	s->ctrl_next = (slot + 1) % CTRL_SLOTS;
	post_recv(s, &s->ctrl, (1 + slot) * sizeof(struct ctrl_msg), sizeof(struct ctrl_msg),
		  CTRL_COOKIE + slot);
}

static void send_ctrl(struct session *s, const struct ctrl_msg *m)
{
	*ctrl_out(s) = *m;
	ctrl_out(s)->magic = MSG_MAGIC;
	post_send(s, &s->ctrl, 0, sizeof(struct ctrl_msg));
	wait_dto(s->req_evd, "control send");
}

static void send_kind(struct session *s, enum msg_kind kind)
{
	struct ctrl_msg m = { .kind = kind };

	send_ctrl(s, &m);
}

static struct ctrl_msg recv_ctrl(struct session *s, const char *what)
{
	DAT_DTO_COMPLETION_EVENT_DATA dto = wait_dto(s->rcv_evd, what);
	uint64_t slot = dto.user_cookie.as_64 - CTRL_COOKIE;
	struct ctrl_msg m;

	if (slot >= CTRL_SLOTS || dto.transfered_length != sizeof(m))
		die("%s: protocol error (a data message where a control message was due)", what);
	m = *ctrl_in(s, (int)slot);
	if (m.magic != MSG_MAGIC)
		die("%s: bad magic 0x%08x (peer of another byte order or program?)", what, m.magic);
	return m;
}

static struct ctrl_msg expect_ctrl(struct session *s, enum msg_kind kind, const char *what)
{
	struct ctrl_msg m = recv_ctrl(s, what);

	if (m.kind != (uint32_t)kind)
		die("%s: protocol error (message kind %u, expected %u)", what, m.kind, kind);
	return m;
}

/*
 * Tells the peer where our data buffer is; learns where its is. The
 * server's first command arrives right after its hello: `server` posts the
 * control recv for it first.
 */
static void exchange_hello(struct session *s, int server)
{
	struct ctrl_msg m = {
		.kind = MSG_HELLO,
		.addr = (uint64_t)(uintptr_t)s->data.base,
		.len = s->data.len,
		.rmr_context = s->data.rmr_context,
		.rdma_read_in = (uint32_t)s->rdma_read_in,
	};

	/* The control recv for the peer's hello was posted before connecting. */
	if (server)
		post_ctrl_recv(s);
	send_ctrl(s, &m);
	m = expect_ctrl(s, MSG_HELLO, "hello from peer");
	s->peer.virtual_address = m.addr;
	s->peer.segment_length = (DAT_SEG_LENGTH)m.len;
	s->peer.rmr_context = m.rmr_context;
	s->read_window = min_int(s->rdma_read_out, (int)m.rdma_read_in);
	if (s->read_window < 1)
		s->read_window = 1;
}

/* ------------------------------------------------------------ RDMA polling */

/* Iteration i's marker in the last byte: never 0, differs from i-1's. */
static uint8_t marker(int i) { return (uint8_t)(i % 251 + 1); }

/* read_lat's end marks, counted alike on both sides: never 0, each differs from the last. */
static uint8_t next_end_mark(void)
{
	static int n;

	return marker(n++);
}

/*
 * Spins until the peer's RDMA write (or send, with -y spin) lands: the last
 * byte of our buffer turns to `want`. With -e each look also dequeues `evd`
 * (the request EVD; wait_dto later takes what it found), as a raw libfabric
 * tcp program must read its CQ for the peer's data to land at all. With -y yield (the default) it yields
 * the CPU between looks, which lets a software provider's progress thread
 * run on it; with -y spin it does not, as programs that spin on their memory
 * do (a NIC needs no CPU of the target's to place the data).
 */
static void wait_for_byte(DAT_EVD_HANDLE evd, volatile uint8_t *p, uint8_t want, const char *what)
{
	double deadline = now_us() + opt.timeout_s * 1e6;
	unsigned spins = 0;

	while (*p != want) {
		if (++spins % 1024 == 0 && now_us() > deadline)
			die("%s: no data from the peer within %d s", what, opt.timeout_s);
		if (opt.mem_evd && banked.n < 4 &&
		    dat_evd_dequeue(evd, &banked.ev[banked.n]) == DAT_SUCCESS) {
			banked.evd = evd;
			banked.n++;
		}
		if (!opt.spin)
			sched_yield();
	}
}

/* -------------------------------------------------------------- the tests */

struct result {
	int iters;              /* measured (warm-up excluded) */
	double median_us, p99_us, mean_us, max_us;
	double mb_per_s;        /* bandwidth tests */
};

/* Latency tests first run unmeasured iterations (connection and caches warm up). */
static int warmup_of(int test, int n)
{
	return is_latency_test(test) ? min_int(n / 10, WARMUP_MAX) : 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static void latency_stats(double *samples, int n, struct result *r)
{
	qsort(samples, n, sizeof(double), cmp_double);
	r->median_us = n % 2 ? samples[n / 2] : (samples[n / 2 - 1] + samples[n / 2]) / 2;
	r->p99_us = samples[(int)((n - 1) * 0.99 + 0.5)];
	r->mean_us = 0;
	r->max_us = samples[n - 1];
	for (int i = 0; i < n; i++)
		r->mean_us += samples[i] / n;
}

/* A data message: it must fill a data recv, whole (catches wrong completions). */
static void wait_data_recv(struct session *s, uint32_t size, const char *what)
{
	DAT_DTO_COMPLETION_EVENT_DATA dto = wait_dto(s->rcv_evd, what);

	if (dto.user_cookie.as_64 != DATA_COOKIE || dto.transfered_length != size)
		die("%s: wrong completion (cookie 0x%llx, %u bytes; expected a %u-byte data recv)",
		    what, (unsigned long long)dto.user_cookie.as_64,
		    (unsigned)dto.transfered_length, size);
}

/* Client sides. Each returns after the test's last exchange. */

/*
 * send_lat: each message carries the iteration's marker in its last byte.
 * With -y spin a side waits for a message by spinning on that byte of its
 * receive buffer (the time is taken there), then reaps the receive.
 */
static void client_send_lat(struct session *s, uint32_t size, int total, double *oneway)
{
	volatile uint8_t *mine = s->data.base + size - 1;

	for (int i = 0; i < total; i++) {
		post_recv(s, &s->data, 0, size, DATA_COOKIE);
		s->local.base[size - 1] = marker(i);
		double t0 = now_us();
		post_send(s, &s->local, 0, size);
		if (opt.spin)
			wait_for_byte(s->req_evd, mine, marker(i), "send_lat: pong");
		else
			wait_data_recv(s, size, "send_lat: pong");
		oneway[i] = (now_us() - t0) / 2;
		if (opt.spin)
			wait_data_recv(s, size, "send_lat: pong");
		wait_dto(s->req_evd, "send_lat: ping completion");
	}
}

static void client_write_lat(struct session *s, uint32_t size, int total, double *oneway)
{
	volatile uint8_t *mine = s->data.base + size - 1;

	for (int i = 0; i < total; i++) {
		double t0 = now_us();
		s->local.base[size - 1] = marker(i);
		post_write(s, size);
		wait_for_byte(s->req_evd, mine, marker(i), "write_lat");
		oneway[i] = (now_us() - t0) / 2;
		wait_dto(s->req_evd, "write_lat: write completion");
	}
}

/*
 * The server marks the last byte it serves to reads: a read that completes
 * before its data has landed is a provider bug worth catching.
 */
#define READ_MARK 0xa5

static void check_read_landed(struct session *s, uint32_t size, const char *what)
{
	if (s->local.base[size - 1] != READ_MARK)
		die("%s: the read completed but its data is not in our buffer", what);
}

static void client_read_lat(struct session *s, uint32_t size, int total, double *lat)
{
	for (int i = 0; i < total; i++) {
		s->local.base[size - 1] = 0;
		double t0 = now_us();
		post_read(s, size);
		wait_dto(s->req_evd, "read_lat: read completion");
		lat[i] = now_us() - t0;
		check_read_landed(s, size, "read_lat");
	}
	if (opt.spin) {
		post_end_mark(s, next_end_mark());
		wait_dto(s->req_evd, "read_lat: end mark completion");
	}
}

/*
 * reg_write, reg_read: the message buffer is registered anew every round, by
 * both sides, as a message layer without a registration cache does for each
 * rendezvous message. The writer fills the whole buffer with the round's
 * marker; the reader checks its first, middle and last byte.
 */
static void fill_msg(struct session *s, uint32_t size, uint8_t v) { memset(s->msg, v, size); }

static void check_msg(struct session *s, uint32_t size, int i, const char *what)
{
	uint8_t want = marker(i);

	if (s->msg[0] != want || s->msg[size / 2] != want || s->msg[size - 1] != want)
		die("%s: round %d: the transfer completed but the buffer does not hold its data "
		    "(bytes %u %u %u, want %u)", what, i, s->msg[0], s->msg[size / 2],
		    s->msg[size - 1], want);
}

static DAT_LMR_HANDLE register_msg(struct session *s, uint32_t size, DAT_LMR_CONTEXT *lmr_context,
				   DAT_RMR_CONTEXT *rmr_context)
{
	DAT_REGION_DESCRIPTION region;
	DAT_LMR_HANDLE lmr;
	DAT_VLEN reg_len;
	DAT_VADDR reg_addr;

	region.for_va = s->msg;
	check(dat_lmr_create(s->ia, DAT_MEM_TYPE_VIRTUAL, region, size, s->pz,
			     DAT_MEM_PRIV_ALL_FLAG, DAT_VA_TYPE_VA, &lmr, lmr_context, rmr_context,
			     &reg_len, &reg_addr), "dat_lmr_create (message buffer)");
	return lmr;
}

/*
 * The initiator's rounds. A round's time runs from the finish message of the
 * round before (the command, for the first) to this round's: it holds both
 * sides' registrations and frees, the clear-to-send, the transfer and the
 * finish. `create` and `freed` are our own dat_lmr_create and dat_lmr_free.
 */
static void client_reg(struct session *s, int test, uint32_t size, int total, double *round,
		       double *create, double *freed)
{
	const char *what = test_names[test];
	double last = now_us();

	for (int i = 0; i < total; i++) {
		struct ctrl_msg cts = expect_ctrl(s, MSG_CTS, "clear to send");
		DAT_LMR_CONTEXT lmr_context;
		DAT_RMR_CONTEXT rmr_context;
		DAT_LMR_HANDLE lmr;
		DAT_LMR_TRIPLET t;
		DAT_RMR_TRIPLET r;
		double t0, t1;

		if (cts.len < size)
			die("%s: the peer's buffer (%llu bytes) is smaller than %u", what,
			    (unsigned long long)cts.len, size);
		if (i + 1 < total)
			post_ctrl_recv(s);      /* the next clear-to-send */
		fill_msg(s, size, test == REG_WRITE ? marker(i) : 0);
		t0 = now_us();
		lmr = register_msg(s, size, &lmr_context, &rmr_context);
		create[i] = now_us() - t0;
		t.virtual_address = (DAT_VADDR)(uintptr_t)s->msg;
		t.segment_length = size;
		t.lmr_context = lmr_context;
		r.rmr_context = cts.rmr_context;
		r.virtual_address = cts.addr;
		r.segment_length = size;
		if (test == REG_WRITE)
			check(dat_ep_post_rdma_write(s->ep, 1, &t, cookie(0), &r,
						     DAT_COMPLETION_DEFAULT_FLAG), "dat_ep_post_rdma_write");
		else
			check(dat_ep_post_rdma_read(s->ep, 1, &t, cookie(0), &r,
						    DAT_COMPLETION_DEFAULT_FLAG), "dat_ep_post_rdma_read");
		wait_dto(s->req_evd, what);
		if (test == REG_READ)
			check_msg(s, size, i, what);
		send_kind(s, MSG_FINISH);
		t1 = now_us();
		round[i] = t1 - last;
		last = t1;
		check(dat_lmr_free(lmr), "dat_lmr_free (message buffer)");
		freed[i] = now_us() - t1;
	}
}

/* The target's rounds; leaves the control recv for the next command posted. */
static void server_reg(struct session *s, int test, uint32_t size, int total)
{
	const char *what = test_names[test];

	for (int i = 0; i < total; i++) {
		struct ctrl_msg cts = { .kind = MSG_CTS, .len = size };
		DAT_LMR_CONTEXT lmr_context;
		DAT_RMR_CONTEXT rmr_context;
		DAT_LMR_HANDLE lmr;

		post_ctrl_recv(s);              /* the finish */
		if (i + 1 == total)
			post_ctrl_recv(s);      /* the next command */
		fill_msg(s, size, test == REG_READ ? marker(i) : 0);
		lmr = register_msg(s, size, &lmr_context, &rmr_context);
		cts.rmr_context = rmr_context;
		cts.addr = (uint64_t)(uintptr_t)s->msg;
		send_ctrl(s, &cts);
		expect_ctrl(s, MSG_FINISH, "finish");
		if (test == REG_WRITE)
			check_msg(s, size, i, what);
		check(dat_lmr_free(lmr), "dat_lmr_free (message buffer)");
	}
}

/* Keeps `window` operations outstanding until `total` have completed. */
static void run_windowed(struct session *s, int test, uint32_t size, int total, int window)
{
	int posted = 0, done = 0;

	while (done < total) {
		for (; posted < total && posted - done < window; posted++) {
			if (test == SEND_BW)
				post_send(s, &s->local, 0, size);
			else if (test == WRITE_BW)
				post_write(s, size);
			else
				post_read(s, size);
		}
		wait_dto(s->req_evd, test_names[test]);
		done++;
	}
}

/*
 * Bandwidth: `total` operations of `size` bytes. Sends count once the
 * server confirms it received them all; RDMA operations at their last
 * completion (as perftest's ib_write_bw/ib_read_bw).
 */
static double client_bw(struct session *s, int test, uint32_t size, int total)
{
	double t0, elapsed_us;

	if (test == SEND_BW)
		post_ctrl_recv(s);      /* for the server's "all received" */
	s->local.base[size - 1] = 0;
	t0 = now_us();
	run_windowed(s, test, size, total, test == READ_BW ? s->read_window : opt.window);
	if (test == SEND_BW)
		expect_ctrl(s, MSG_DONE, "send_bw: done from server");
	elapsed_us = now_us() - t0;
	if (test == READ_BW)
		check_read_landed(s, size, "read_bw");
	return (double)size * total / elapsed_us;      /* bytes per us = MB/s */
}

/*
 * Runs one test point: `n` measured iterations after a warm-up. The reg
 * tests also fill `create` and `freed` (our dat_lmr_create and dat_lmr_free).
 */
static struct result client_test(struct session *s, int test, uint32_t size, int n,
				 struct result *create, struct result *freed)
{
	int warm = warmup_of(test, n), total = warm + n;
	struct ctrl_msg cmd = { .kind = MSG_CMD, .test = test, .size = size, .iters = total };
	struct result r = { .iters = n };
	double *samples = calloc(3 * (size_t)total, sizeof(double));

	if (!samples)
		die("out of memory");
	/* The server's first write may land as soon as it has our command. */
	memset(s->data.base, 0, size);
	post_ctrl_recv(s);
	send_ctrl(s, &cmd);
	/* The reg tests' first clear-to-send is their ready. */
	if (!is_reg_test(test))
		expect_ctrl(s, MSG_READY, "ready from server");

	switch (test) {
	case SEND_LAT: client_send_lat(s, size, total, samples); break;
	case WRITE_LAT: client_write_lat(s, size, total, samples); break;
	case READ_LAT: client_read_lat(s, size, total, samples); break;
	case REG_WRITE:
	case REG_READ:
		client_reg(s, test, size, total, samples, samples + total, samples + 2 * total);
		*create = (struct result){ .iters = n };
		*freed = (struct result){ .iters = n };
		latency_stats(samples + total + warm, n, create);
		latency_stats(samples + 2 * total + warm, n, freed);
		break;
	default: r.mb_per_s = client_bw(s, test, size, total); break;
	}
	if (is_latency_test(test))
		latency_stats(samples + warm, n, &r);
	free(samples);
	return r;
}

/* Server sides: each leaves the control recv for the next command posted. */

static void server_send_lat(struct session *s, uint32_t size, int total)
{
	volatile uint8_t *mine = s->data.base + size - 1;

	*mine = 0;
	post_recv(s, &s->data, 0, size, DATA_COOKIE);
	send_kind(s, MSG_READY);
	for (int i = 0; i < total; i++) {
		if (opt.spin)
			wait_for_byte(s->req_evd, mine, marker(i), "send_lat: ping");
		wait_data_recv(s, size, "send_lat: ping");
		if (i + 1 < total)
			post_recv(s, &s->data, 0, size, DATA_COOKIE);
		else
			post_ctrl_recv(s);
		s->local.base[size - 1] = marker(i);
		post_send(s, &s->local, 0, size);
		wait_dto(s->req_evd, "send_lat: pong completion");
	}
}

static void server_write_lat(struct session *s, uint32_t size, int total)
{
	volatile uint8_t *mine = s->data.base + size - 1;

	memset(s->data.base, 0, size);
	post_ctrl_recv(s);
	send_kind(s, MSG_READY);
	for (int i = 0; i < total; i++) {
		wait_for_byte(s->req_evd, mine, marker(i), "write_lat");
		s->local.base[size - 1] = marker(i);
		post_write(s, size);
		wait_dto(s->req_evd, "write_lat: write completion");
	}
}

/* send_bw: keeps recv_depth receives posted until `total` have arrived. */
static void server_send_bw(struct session *s, uint32_t size, int total)
{
	int posted = 0;

	for (; posted < min_int(total, s->recv_depth); posted++)
		post_recv(s, &s->data, 0, size, DATA_COOKIE);
	if (posted == total)
		post_ctrl_recv(s);
	send_kind(s, MSG_READY);
	for (int got = 0; got < total; got++) {
		wait_data_recv(s, size, "send_bw: receive");
		if (posted < total) {
			post_recv(s, &s->data, 0, size, DATA_COOKIE);
			if (++posted == total)
				post_ctrl_recv(s);
		}
	}
	send_kind(s, MSG_DONE);
}

/*
 * RDMA read and write bandwidth, read latency: our CPU takes no part. With -y spin,
 * read_lat's server spins on its memory meanwhile, no DAT call (its reads are then served
 * as for a passive target whose thread computes or spins), until the client's end mark.
 */
static void server_rdma(struct session *s, int test, uint32_t size)
{
	if (test == READ_LAT || test == READ_BW)
		s->data.base[size - 1] = READ_MARK;
	post_ctrl_recv(s);
	send_kind(s, MSG_READY);
	if (test == READ_LAT && opt.spin)
		wait_for_byte(s->req_evd, s->data.base + s->data.len - 1, next_end_mark(),
			      "read_lat: end mark");
}

/* Follows the client's commands until it says quit. */
static void serve(struct session *s)
{
	for (;;) {
		struct ctrl_msg m = recv_ctrl(s, "command from client");

		if (m.kind == MSG_QUIT)
			return;
		if (m.kind != MSG_CMD || m.test >= NTESTS || m.size > s->data.len ||
		    m.size > s->local.len || m.size == 0 || m.iters == 0)
			die("bad command from client (kind %u test %u size %u); "
			    "start the server with -S covering the client's sizes", m.kind, m.test,
			    m.size);
		switch (m.test) {
		case SEND_LAT: server_send_lat(s, m.size, m.iters); break;
		case WRITE_LAT: server_write_lat(s, m.size, m.iters); break;
		case REG_WRITE:
		case REG_READ: server_reg(s, m.test, m.size, m.iters); break;
		case SEND_BW: server_send_bw(s, m.size, m.iters); break;
		default: server_rdma(s, m.test, m.size); break;
		}
	}
}

/* ------------------------------------------------------------ connections */

static void print_ia_address(struct session *s, char *out, size_t n)
{
	struct sockaddr *sa = (struct sockaddr *)s->ia_attr.ia_address_ptr;

	snprintf(out, n, "?");
	if (sa && sa->sa_family == AF_INET)
		inet_ntop(AF_INET, &((struct sockaddr_in *)sa)->sin_addr, out, n);
	else if (sa && sa->sa_family == AF_INET6)
		inet_ntop(AF_INET6, &((struct sockaddr_in6 *)sa)->sin6_addr, out, n);
}

static void accept_one(struct session *s)
{
	DAT_PSP_HANDLE psp;
	DAT_EVENT ev;
	char addr[64];

	check(dat_evd_create(s->ia, 8, DAT_HANDLE_NULL, DAT_EVD_CR_FLAG, &s->cr_evd),
	      "dat_evd_create (connection requests)");
	check(dat_psp_create(s->ia, opt.conn_qual, s->cr_evd, DAT_PSP_CONSUMER_FLAG, &psp),
	      "dat_psp_create");
	print_ia_address(s, addr, sizeof(addr));
	/* run-bench.sh waits for this line: print it only once we listen. */
	printf("datperf: server listening on %s conn_qual %llu (IA %s)\n", addr,
	       (unsigned long long)opt.conn_qual, opt.ia_name);
	fflush(stdout);

	wait_event(s->cr_evd, opt.accept_timeout_s, &ev, "waiting for a client");
	if (ev.event_number != DAT_CONNECTION_REQUEST_EVENT)
		die("waiting for a client: %s", event_name(ev.event_number));
	create_ep(s);
	post_ctrl_recv(s);      /* for the client's hello */
	check(dat_cr_accept(ev.event_data.cr_arrival_event_data.cr_handle, s->ep, 0, NULL),
	      "dat_cr_accept");
	wait_conn_event(s, DAT_CONNECTION_EVENT_ESTABLISHED, "accepting");
	check(dat_psp_free(psp), "dat_psp_free");
	check(dat_evd_free(s->cr_evd), "dat_evd_free");
}

static void connect_to(struct session *s, const char *host)
{
	struct sockaddr_in sin;

	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	if (inet_pton(AF_INET, host, &sin.sin_addr) != 1)
		die("-h %s: not an IPv4 address (the server prints its IA address)", host);
	create_ep(s);
	post_ctrl_recv(s);      /* for the server's hello */
	check(dat_ep_connect(s->ep, (DAT_IA_ADDRESS_PTR)&sin, opt.conn_qual,
			     timeout_us(opt.timeout_s), 0, NULL, DAT_QOS_BEST_EFFORT,
			     DAT_CONNECT_DEFAULT_FLAG), "dat_ep_connect");
	wait_conn_event(s, DAT_CONNECTION_EVENT_ESTABLISHED, "connecting");
}

/* --------------------------------------------------------------- the modes */

static int iterations(int test, uint32_t size)
{
	int n = is_latency_test(test) ? opt.lat_iters : opt.bw_iters;

	/* Large messages: cap the bytes moved so a full run stays short. */
	if (opt.budget && (uint64_t)n * size > opt.budget)
		n = (int)(opt.budget / size);
	return n < MIN_ITERS ? MIN_ITERS : n;
}

static void print_latency_row(const char *name, uint32_t size, const struct result *r)
{
	printf("%-10s %9u %7d %11.2f %11.2f %11s %11.2f %11.1f\n", name, size, r->iters,
	       r->median_us, r->p99_us, "-", r->mean_us, r->max_us);
}

static void print_row(int test, uint32_t size, const struct result *r)
{
	if (is_latency_test(test))
		print_latency_row(test_names[test], size, r);
	else
		/* mean_us of a bandwidth test: the time per message (its message rate's inverse) */
		printf("%-10s %9u %7d %11s %11s %11.1f %11.4f\n", test_names[test], size, r->iters,
		       "-", "-", r->mb_per_s, r->mb_per_s > 0 ? size / r->mb_per_s : 0.0);
	fflush(stdout);
}

static int run_client(void)
{
	struct session s;

	open_session(&s);
	connect_to(&s, opt.host);
	exchange_hello(&s, 0);
	if (s.peer.segment_length < max_size())
		die("the server's buffer (%u bytes) is smaller than -S asks (%u): "
		    "give the server the same -S", (unsigned)s.peer.segment_length, max_size());

	printf("# datperf: IA %s, server %s conn_qual %llu, window %d (RDMA reads %d), %s, %s\n",
	       opt.ia_name, opt.host, (unsigned long long)opt.conn_qual, opt.window,
	       s.read_window, opt.poll ? "polling" : "blocking waits",
	       opt.spin ? "busy waits spin (no sched_yield)" : "busy waits yield (sched_yield)");
	if (opt.mem_evd)
		printf("# waits on memory also dequeue the request EVD (-e)\n");
	printf("# latency in us: send_lat/write_lat one-way (RTT/2), read_lat a whole read,"
	       " reg_* a whole round; MB/s = 10^6 B/s; a *_bw row's mean_us: the time per message\n");
	printf("%-10s %9s %7s %11s %11s %11s %11s %11s\n", "test", "bytes", "iters", "median_us",
	       "p99_us", "MB/s", "mean_us", "max_us");
	for (int t = 0; t < NTESTS; t++) {
		if (!opt.run[t])
			continue;
		for (int i = 0; i < opt.nsizes; i++) {
			struct result create, freed;
			struct result r = client_test(&s, t, opt.sizes[i], iterations(t, opt.sizes[i]),
						      &create, &freed);
			char name[32];

			print_row(t, opt.sizes[i], &r);
			if (!is_reg_test(t))
				continue;
			snprintf(name, sizeof(name), "%s:create", test_names[t]);
			print_latency_row(name, opt.sizes[i], &create);
			snprintf(name, sizeof(name), "%s:free", test_names[t]);
			print_latency_row(name, opt.sizes[i], &freed);
		}
	}

	/* The server leaves first only once it has our quit: no lost completions. */
	send_kind(&s, MSG_QUIT);
	check(dat_ep_disconnect(s.ep, DAT_CLOSE_GRACEFUL_FLAG), "dat_ep_disconnect");
	wait_conn_event(&s, DAT_CONNECTION_EVENT_DISCONNECTED, "disconnecting");
	close_session(&s);
	return 0;
}

static int run_server(void)
{
	struct session s;

	open_session(&s);
	accept_one(&s);
	exchange_hello(&s, 1);
	serve(&s);
	wait_conn_event(&s, DAT_CONNECTION_EVENT_DISCONNECTED, "waiting for the client to leave");
	close_session(&s);
	printf("datperf: server done\n");
	return 0;
}

/* ---------------------------------------------------------- command line */

static void usage(void)
{
	fprintf(stderr,
		"usage: datperf [-P IA] -s [options]            server (one client, then exit)\n"
		"       datperf [-P IA] -h SERVER_IP [options]  client\n"
		"  -P IA        dat.conf entry (default rs-tcp)\n"
		"  -q QUAL      conn_qual (default 18515)\n"
		"  -t TESTS     comma list of send_lat,write_lat,read_lat,send_bw,write_bw,read_bw,\n"
		"               reg_write,reg_read, lat, bw, reg or all (default all)\n"
		"  -S SIZES     comma list of sizes or power-of-2 ranges, K/M suffixes\n"
		"               (default 8-4M; the server needs a maximum at least the client's)\n"
		"  -n N         latency iterations (default 1000)\n"
		"  -N N         bandwidth iterations (default 2000)\n"
		"  -B MIB       cap on bytes per test point, lowers N for large sizes\n"
		"               (default 256, 0 = no cap; never below %d iterations)\n"
		"  -w N         outstanding operations in bandwidth tests (default 32)\n"
		"  -T SEC       timeout of every wait for the peer (default 20)\n"
		"  -A SEC       server: how long to wait for a client (default 120)\n"
		"  -p           busy-poll the EVDs (dat_evd_dequeue) instead of dat_evd_wait\n"
		"  -y MODE      busy waits (-p, and write_lat's wait on memory): yield (default:\n"
		"               sched_yield between looks) or spin (no yield, as programs that\n"
		"               spin do; send_lat then also waits on the receive buffer's memory,\n"
		"               and read_lat's server spins on its memory while it is read)\n"
		"  -e           waits on memory also dequeue the request EVD between looks (as a\n"
		"               raw libfabric tcp program reads its CQ: ofi-raw's wait_byte)\n",
		MIN_ITERS);
	exit(2);
}

static uint32_t parse_size(const char *str, char **end)
{
	unsigned long long v = strtoull(str, end, 10);

	if (*end == str)
		die("bad size '%s'", str);
	switch (toupper((unsigned char)**end)) {
	case 'K': v <<= 10; (*end)++; break;
	case 'M': v <<= 20; (*end)++; break;
	}
	if (v == 0 || v > (1u << 30))
		die("size out of range in '%s'", str);
	return (uint32_t)v;
}

static void add_size(uint32_t v)
{
	if (opt.nsizes == MAX_SIZES)
		die("too many sizes");
	opt.sizes[opt.nsizes++] = v;
}

/* "8,1K,64K" or "8-4M" (every power of 2 from 8 to 4 MiB), combined freely. */
static void parse_sizes(const char *arg)
{
	const char *p = arg;

	opt.nsizes = 0;
	while (*p) {
		char *end;
		uint32_t lo = parse_size(p, &end), hi = lo;

		if (*end == '-')
			hi = parse_size(end + 1, &end);
		for (uint64_t v = lo; v <= hi; v *= 2)
			add_size((uint32_t)v);
		if (*end == ',')
			end++;
		else if (*end)
			die("bad size list '%s'", arg);
		p = end;
	}
	if (opt.nsizes == 0)
		die("empty size list");
}

static void parse_tests(const char *arg)
{
	char *copy = strdup(arg), *save = NULL;

	memset(opt.run, 0, sizeof(opt.run));
	for (char *w = strtok_r(copy, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
		int found = 0;

		for (int t = 0; t < NTESTS; t++) {
			int all = !strcmp(w, "all");
			int group = (!strcmp(w, "lat") && t <= READ_LAT) ||
				    (!strcmp(w, "bw") && !is_latency_test(t)) ||
				    (!strcmp(w, "reg") && is_reg_test(t));

			if (all || group || !strcmp(w, test_names[t]))
				opt.run[t] = found = 1;
		}
		if (!found)
			die("unknown test '%s'", w);
	}
	free(copy);
}

static int positive(const char *arg)
{
	char *end;
	long v = strtol(arg, &end, 10);

	if (*end || v < 0 || v > 100000000)
		die("bad number '%s'", arg);
	return (int)v;
}

int main(int argc, char **argv)
{
	int server = 0, c;

	parse_tests("all");
	parse_sizes("8-4M");
	while ((c = getopt(argc, argv, "P:sh:q:t:S:n:N:B:w:T:A:py:e")) != -1) {
		switch (c) {
		case 'P': opt.ia_name = optarg; break;
		case 's': server = 1; break;
		case 'h': opt.host = optarg; break;
		case 'q': opt.conn_qual = strtoull(optarg, NULL, 0); break;
		case 't': parse_tests(optarg); break;
		case 'S': parse_sizes(optarg); break;
		case 'n': opt.lat_iters = positive(optarg); break;
		case 'N': opt.bw_iters = positive(optarg); break;
		case 'B': opt.budget = (uint64_t)positive(optarg) << 20; break;
		case 'w': opt.window = positive(optarg); break;
		case 'T': opt.timeout_s = positive(optarg); break;
		case 'A': opt.accept_timeout_s = positive(optarg); break;
		case 'p': opt.poll = 1; break;
		case 'e': opt.mem_evd = 1; break;
		case 'y':
			if (strcmp(optarg, "spin") && strcmp(optarg, "yield"))
				usage();
			opt.spin = !strcmp(optarg, "spin");
			break;
		default: usage();
		}
	}
	if (optind != argc || server == (opt.host != NULL) || opt.window < 1 ||
	    opt.timeout_s < 1 || opt.accept_timeout_s < 1 ||
	    opt.timeout_s > 4000 || opt.accept_timeout_s > 4000)   /* DAT_TIMEOUT is 32-bit us */
		usage();
	return server ? run_server() : run_client();
}
