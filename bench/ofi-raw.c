/*
 * ofi-raw: the raw libfabric reference of `make bench-ofi` (run-bench-ofi.sh).
 *
 * The same measurements datperf makes over a DAT entry, made with libfabric
 * alone on the same provider, so that datperf over one of our ofi entries
 * can be read as a ratio of it:
 *
 *   write_lat  RDMA write ping-pong: each side writes 8 B into the peer's
 *              buffer and waits for the peer's write in its own buffer's last
 *              byte; one-way = RTT/2 (datperf's write_lat)
 *   read_lat   one RDMA read at a time; the whole read (datperf's read_lat)
 *   write_bw, read_bw  `window` operations in flight (reads: -r), MB/s
 *
 * Waits poll as datperf -p does: a completion queue is read in a loop, with
 * sched_yield() between empty looks (-y spin: without). A side waiting for the
 * peer's write reads its CQ while it watches its memory: libfabric's tcp,
 * ofi_rxm and shm providers place incoming data only inside a libfabric call
 * of the target (docs/libfabric.md, "Progress"), so that read is what a raw
 * program must do (our backend's progress thread does it for a DAT program).
 *
 *   ofi-raw -s [-a ADDR] [-p PORT] [-e msg|rdm] [-P PROV]   server: one client, then exits
 *   ofi-raw -c ADDR [-p PORT] [-e msg|rdm] [-P PROV] [-n LAT] [-N BW] [-w W] [-r R] [-S BYTES] [-D]
 *
 *   ofi-raw -s -C N [-a ADDR] [-p PORT] [-P PROV]                  server: N connections, then exits
 *   ofi-raw -c ADDR -C N [-p PORT] [-P PROV] [-o OUTSTANDING]      client: prints
 *       ofi-raw conn prov=tcp n=N seconds=S conn_per_s=R cpu_s=C
 *
 * -C N: the connection rate datscale measures (its conn_per_s), FI_EP_MSG
 * only; see "connection rate" below for what it times.
 *
 * -D (on both sides) posts as our backend does: writes with fi_writemsg and
 * FI_DELIVERY_COMPLETE (a write completes once placed, as on an RDMA NIC: the
 * target then acknowledges each write), reads with fi_readmsg; like with like
 * for run-bench-ofi.sh.
 *
 * -e msg (the default; provider tcp): connected endpoints (FI_EP_MSG). The
 * client sends its buffer's address and key, the iteration counts and sizes
 * in the connection request's private data, the server its own in the
 * accept's. Its hints are older than the RDM mode's: the backend's caps and
 * MR modes, but mode FI_CONTEXT and no threading or msg_order asked; tcp
 * opens with the backend's mr_mode, msg_order and threading all the same
 * (the "# opened as" line against datinfo). Its CQ's format is CONTEXT.
 *
 * -e rdm (-P "tcp;ofi_rxm", -P shm): reliable datagrams (FI_EP_RDM), as our
 * backend opens those providers. The hints are the backend's
 * (src/backend-ofi/src/device.rs, hints_for and device_info): its caps (with
 * FI_ATOMIC where offered), MR modes LOCAL, VIRT_ADDR, ALLOCATED and
 * PROV_KEY, FI_THREAD_SAFE, the full msg_order DAT needs, else send after
 * send only; the source address given (FI_SOURCE) unless the provider names
 * endpoints by string (shm), then none. Like the backend's QP, the endpoint
 * has an AV of its own (FI_AV_TABLE, one entry) and a CQ of format DATA with
 * no wait object. The two sides swap endpoint names, buffer address and key
 * and the counts over a TCP connection to ADDR:PORT (the backend's handshake
 * goes over TCP too), then fi_av_insert the peer. What differs from our
 * backend: no key-table read before an RDMA request (the raw side knows the
 * peer's offset-0 buffer and key from the start; on shm the backend reads
 * the peer's entry again before every RDMA request: docs/libfabric.md,
 * "Memory"), no holding of requests behind earlier ones where the provider
 * orders only send after send (the backend then lets an RDMA request go
 * only once every earlier one completed, for DAT's order; raw keeps the
 * window full; the shm here gives the full order, so neither holds), and
 * one thread (no progress thread).
 *
 * Every wait is bounded (-T seconds).
 */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#define LAT_SIZE 8
#define WARMUP_MAX 100
#define KEY_BASE 0x5eed

static struct {
	const char *prov, *addr, *port;
	int server, lat_iters, bw_iters, window, read_window, spin, timeout_s;
	int delivery;                /* -D: writes complete once placed (FI_DELIVERY_COMPLETE) */
	int rdm;                     /* -e rdm: reliable datagrams and a TCP side channel */
	int conns;                   /* -C: the connection rate over this many connections (0: off) */
	int conn_window;             /* -o: connects in flight at once (datscale's -W) */
	uint32_t bw_size;
} opt = {
	.prov = "tcp", .addr = "127.0.0.1", .port = "18619",
	.lat_iters = 20000, .bw_iters = 2048, .window = 8, .read_window = 8, .timeout_s = 30,
	.conn_window = 64,
	.bw_size = 1u << 20,
};

/* What each side tells the other in the connection's private data. */
struct hello {
	uint64_t addr, key;          /* RMA address of the buffer (0: offset-based) and its key */
	uint32_t lat_iters, bw_iters, bw_size, pad;
};

/* What each side tells the other over the side channel in RDM mode. */
struct rdm_hello {
	struct hello h;
	uint32_t name_len;           /* of the endpoint's fi_getname */
	uint8_t name[256];
};

struct side {
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_eq *eq;
	struct fid_pep *pep;
	struct fid_ep *ep;
	struct fid_av *av;           /* RDM: the endpoint's own, naming the peer */
	fi_addr_t dest;              /* RDM: the peer (MSG: unused, 0) */
	int sock;                    /* RDM: the side channel (-1: none) */
	struct fid_cq *cq;
	struct fid_mr *mr;
	uint8_t *buf;                /* [0, size): RMA target; [size, 2 size): local source */
	size_t size;
	void *desc;
	struct hello peer;
	long outstanding;            /* posted, not yet completed */
};

static void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fputs("ofi-raw: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(1);
}

static void check(int rc, const char *what)
{
	if (rc < 0)
		die("%s: %s (%d)", what, fi_strerror(-rc), rc);
}

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* ------------------------------------------------------------ setup */

static struct fi_info *get_info(const char *node, const char *service, uint64_t flags)
{
	struct fi_info *hints = fi_allocinfo(), *info = NULL;

	if (!hints)
		die("fi_allocinfo failed");
	hints->caps = FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
	hints->ep_attr->type = FI_EP_MSG;
	hints->mode = FI_CONTEXT | FI_CONTEXT2;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	hints->fabric_attr->prov_name = strdup(opt.prov);
	check(fi_getinfo(FI_VERSION(1, 17), node, service, flags, hints, &info), "fi_getinfo");
	fi_freeinfo(hints);
	return info;
}

/* The backend's hints for reliable datagrams (device.rs, hints_for). */
static struct fi_info *rdm_hints(int ordered, int atomics)
{
	struct fi_info *hints = fi_allocinfo();

	if (!hints)
		die("fi_allocinfo failed");
	hints->caps = FI_MSG | FI_RMA | FI_READ | FI_WRITE | FI_RECV | FI_SEND | FI_REMOTE_READ |
		      FI_REMOTE_WRITE | (atomics ? FI_ATOMIC : 0);
	hints->ep_attr->type = FI_EP_RDM;
	hints->fabric_attr->prov_name = strdup(opt.prov);
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	hints->domain_attr->threading = FI_THREAD_SAFE;
	hints->tx_attr->msg_order = ordered ? FI_ORDER_SAS | FI_ORDER_RAW | FI_ORDER_WAW |
						      FI_ORDER_WAS | FI_ORDER_SAW
					    : FI_ORDER_SAS;
	return hints;
}

/* The fi_info the backend's device_info would open for this provider: the
 * full order before send-after-send only, with atomics before without, on
 * our address (FI_SOURCE) unless the provider names endpoints by string. */
static struct fi_info *get_rdm_info(void)
{
	/* As the backend does (lib.rs, prepare_libfabric): ofi_rxm sizes CQs by it. */
	setenv("FI_UNIVERSE_SIZE", "16", 0);
	for (int ordered = 1; ordered >= 0; ordered--) {
		for (int sourced = 1; sourced >= 0; sourced--) {
			for (int atomics = 1; atomics >= 0; atomics--) {
				struct fi_info *hints = rdm_hints(ordered, atomics), *info = NULL;
				int rc = fi_getinfo(FI_VERSION(1, 17), sourced ? opt.addr : NULL, NULL,
						    sourced ? FI_SOURCE : 0, hints, &info);

				fi_freeinfo(hints);
				if (rc || !info)
					continue;
				if (!sourced || info->addr_format != FI_ADDR_STR)
					return info;
				fi_freeinfo(info);
				break;
			}
		}
	}
	die("provider %s offers no reliable-datagram endpoint with RMA", opt.prov);
	return NULL;
}

static void open_fabric(struct side *s, struct fi_info *info)
{
	/* -C: room for every connection's events at once (0: the provider's size). */
	struct fi_eq_attr eq_attr = { .wait_obj = FI_WAIT_UNSPEC, .size = opt.conns ? opt.conns + 64 : 0 };

	check(fi_fabric(info->fabric_attr, &s->fabric, NULL), "fi_fabric");
	check(fi_eq_open(s->fabric, &eq_attr, &s->eq, NULL), "fi_eq_open");
}

/* The domain, the endpoint for `info` (a connection request's or our own),
 * its CQ (no wait object: it is polled), its AV in RDM mode, and the
 * registered buffer. */
static void open_endpoint(struct side *s, struct fi_info *info)
{
	/* RDM: the backend's CQ format; MSG: as before the RDM mode came. */
	struct fi_cq_attr cq_attr = { .format = opt.rdm ? FI_CQ_FORMAT_DATA : FI_CQ_FORMAT_CONTEXT,
				      .wait_obj = FI_WAIT_NONE, .size = 1024 };
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE, .count = 1 };
	uint64_t key = opt.server ? KEY_BASE + 1 : KEY_BASE;

	check(fi_domain(s->fabric, info, &s->domain, NULL), "fi_domain");
	check(fi_endpoint(s->domain, info, &s->ep, NULL), "fi_endpoint");
	check(fi_cq_open(s->domain, &cq_attr, &s->cq, NULL), "fi_cq_open");
	if (opt.rdm) {
		check(fi_av_open(s->domain, &av_attr, &s->av, NULL), "fi_av_open");
		check(fi_ep_bind(s->ep, &s->av->fid, 0), "fi_ep_bind av");
	} else {
		check(fi_ep_bind(s->ep, &s->eq->fid, 0), "fi_ep_bind eq");
	}
	check(fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind cq");
	check(fi_enable(s->ep), "fi_enable");
	s->size = opt.bw_size > LAT_SIZE ? opt.bw_size : LAT_SIZE;
	if (posix_memalign((void **)&s->buf, 4096, 2 * s->size))
		die("out of memory");
	memset(s->buf, 0, 2 * s->size);
	check(fi_mr_reg(s->domain, s->buf, 2 * s->size,
			FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE, 0, key, 0, &s->mr, NULL),
	      "fi_mr_reg");
	s->desc = fi_mr_desc(s->mr);
	s->info = info;
}

static struct hello my_hello(const struct side *s)
{
	struct hello h = {
		.addr = (s->info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) ? (uintptr_t)s->buf : 0,
		.key = fi_mr_key(s->mr),
		.lat_iters = opt.lat_iters, .bw_iters = opt.bw_iters, .bw_size = opt.bw_size,
	};
	return h;
}

/* One EQ event of type `want`; its private data (if any) into s->peer. */
static struct fi_info *wait_cm(struct side *s, uint32_t want, const char *what)
{
	struct {
		struct fi_eq_cm_entry e;
		uint8_t data[256];
	} ev;
	uint32_t event;
	ssize_t n = fi_eq_sread(s->eq, &event, &ev, sizeof(ev), opt.timeout_s * 1000, 0);

	if (n == -FI_EAVAIL) {
		struct fi_eq_err_entry err = { 0 };

		fi_eq_readerr(s->eq, &err, 0);
		die("%s: %s", what, fi_strerror(err.err));
	}
	if (n < 0)
		check((int)n, what);
	if (event != want)
		die("%s: event %u, not %u", what, event, want);
	if ((size_t)n >= sizeof(ev.e) + sizeof(struct hello))
		memcpy(&s->peer, ev.data, sizeof(struct hello));
	return ev.e.info;
}

static void serve_accept(struct side *s)
{
	struct fi_info *info = get_info(opt.addr, opt.port, FI_SOURCE), *req;
	struct hello h;

	open_fabric(s, info);
	check(fi_passive_ep(s->fabric, info, &s->pep, NULL), "fi_passive_ep");
	check(fi_pep_bind(s->pep, &s->eq->fid, 0), "fi_pep_bind");
	check(fi_listen(s->pep), "fi_listen");
	printf("ofi-raw: server listening on %s port %s (%s)\n", opt.addr, opt.port, opt.prov);
	fflush(stdout);
	opt.timeout_s *= 4;          /* the wait for a client */
	req = wait_cm(s, FI_CONNREQ, "waiting for a client");
	opt.timeout_s /= 4;
	opt.lat_iters = s->peer.lat_iters, opt.bw_iters = s->peer.bw_iters, opt.bw_size = s->peer.bw_size;
	open_endpoint(s, req);
	h = my_hello(s);
	check(fi_accept(s->ep, &h, sizeof(h)), "fi_accept");
	wait_cm(s, FI_CONNECTED, "accept");
}

static void connect_to_server(struct side *s)
{
	struct fi_info *info = get_info(opt.addr, opt.port, 0);
	struct hello h;

	open_fabric(s, info);
	open_endpoint(s, info);
	h = my_hello(s);
	check(fi_connect(s->ep, info->dest_addr, &h, sizeof(h)), "fi_connect");
	wait_cm(s, FI_CONNECTED, "connect");
}

/* ------------------------------------------------------------ RDM setup */

/* Waits until `fd` is ready for `events`, at most `secs` seconds. */
static void wait_fd(int fd, short events, int secs, const char *what)
{
	struct pollfd p = { .fd = fd, .events = events };
	int rc = poll(&p, 1, secs * 1000);

	if (rc < 0)
		die("%s: poll: %m", what);
	if (rc == 0)
		die("%s: nothing within %d s", what, secs);
}

static void sock_send(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

		if (n <= 0)
			die("side channel: send: %m");
		p += n, len -= n;
	}
}

static void sock_recv(int fd, void *buf, size_t len)
{
	uint8_t *p = buf;

	while (len) {
		ssize_t n;

		wait_fd(fd, POLLIN, opt.timeout_s, "side channel");
		n = recv(fd, p, len, 0);
		if (n <= 0)
			die("side channel: %s", n ? "recv failed" : "the peer closed it");
		p += n, len -= n;
	}
}

static struct sockaddr_in side_address(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(atoi(opt.port)) };

	if (inet_pton(AF_INET, opt.addr, &a.sin_addr) != 1)
		die("not an IPv4 address: %s", opt.addr);
	return a;
}

static struct rdm_hello my_rdm_hello(const struct side *s)
{
	struct rdm_hello r = { .h = my_hello(s) };
	size_t len = sizeof(r.name);

	check(fi_getname(&s->ep->fid, r.name, &len), "fi_getname");
	r.name_len = (uint32_t)len;
	return r;
}

static void insert_peer(struct side *s, const struct rdm_hello *peer)
{
	if (peer->name_len > sizeof(peer->name))
		die("side channel: a name of %u bytes", peer->name_len);
	s->peer = peer->h;
	if (fi_av_insert(s->av, peer->name, 1, &s->dest, 0, NULL) != 1)
		die("fi_av_insert failed");
}

/* The server: the client's hello (its counts size our buffer), then ours. */
static void serve_rdm(struct side *s)
{
	struct sockaddr_in a = side_address();
	struct rdm_hello peer, mine;
	int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);

	if (l < 0 || setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(l, (struct sockaddr *)&a, sizeof(a)) || listen(l, 1))
		die("side channel on %s port %s: %m", opt.addr, opt.port);
	s->info = get_rdm_info();
	open_fabric(s, s->info);
	printf("ofi-raw: server listening on %s port %s (%s, FI_EP_RDM)\n", opt.addr, opt.port, opt.prov);
	fflush(stdout);
	wait_fd(l, POLLIN, opt.timeout_s * 4, "waiting for a client");
	s->sock = accept(l, NULL, NULL);
	if (s->sock < 0)
		die("side channel: accept: %m");
	close(l);
	setsockopt(s->sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	sock_recv(s->sock, &peer, sizeof(peer));
	opt.lat_iters = peer.h.lat_iters, opt.bw_iters = peer.h.bw_iters, opt.bw_size = peer.h.bw_size;
	open_endpoint(s, s->info);
	mine = my_rdm_hello(s);
	sock_send(s->sock, &mine, sizeof(mine));
	insert_peer(s, &peer);
}

static void connect_rdm(struct side *s)
{
	struct sockaddr_in a = side_address();
	struct rdm_hello peer, mine;
	int one = 1;

	s->info = get_rdm_info();
	open_fabric(s, s->info);
	open_endpoint(s, s->info);
	s->sock = socket(AF_INET, SOCK_STREAM, 0);
	if (s->sock < 0 || connect(s->sock, (struct sockaddr *)&a, sizeof(a)))
		die("side channel to %s port %s: %m", opt.addr, opt.port);
	setsockopt(s->sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	mine = my_rdm_hello(s);
	sock_send(s->sock, &mine, sizeof(mine));
	sock_recv(s->sock, &peer, sizeof(peer));
	insert_peer(s, &peer);
}

/* ------------------------------------------------------------ polling */

/* One look at the CQ: completions counted off `outstanding`; a failed one dies. */
static int reap(struct side *s)
{
	struct fi_cq_data_entry e[16];      /* room for either format */
	ssize_t n = fi_cq_read(s->cq, e, 16);

	if (n > 0) {
		s->outstanding -= n;
		return (int)n;
	}
	if (n == -FI_EAVAIL) {
		struct fi_cq_err_entry err = { 0 };

		fi_cq_readerr(s->cq, &err, 0);
		die("completion error: %s", fi_strerror(err.err));
	}
	if (n != -FI_EAGAIN)
		check((int)n, "fi_cq_read");
	return 0;
}

static void idle(void)
{
	if (!opt.spin)
		sched_yield();
}

/* Polls until at most `left` requests are outstanding. */
static void drain_to(struct side *s, long left, const char *what)
{
	double deadline = now_us() + opt.timeout_s * 1e6;

	while (s->outstanding > left) {
		if (!reap(s))
			idle();
		if (now_us() > deadline)
			die("%s: no completion within %d s", what, opt.timeout_s);
	}
}

/* Waits for the peer's write of `want` into our buffer's byte `at`, reading
 * the CQ meanwhile (which also places the data: see the top). */
static void wait_byte(struct side *s, size_t at, uint8_t want, const char *what)
{
	volatile uint8_t *p = s->buf + at;
	double deadline = now_us() + opt.timeout_s * 1e6;

	while (*p != want) {
		if (!reap(s))
			idle();
		if (now_us() > deadline)
			die("%s: no data from the peer within %d s", what, opt.timeout_s);
	}
}

/* Posts an RDMA read or write of `len` bytes between our source half and the
 * peer's buffer. With -D, as the backend posts them: fi_readmsg with
 * FI_COMPLETION, fi_writemsg with FI_DELIVERY_COMPLETE too. */
static void post(struct side *s, int read, size_t len)
{
	struct iovec iov = { s->buf + s->size, len };
	struct fi_rma_iov rma = { s->peer.addr, len, s->peer.key };
	void *desc = s->desc;
	struct fi_msg_rma msg = { .msg_iov = &iov, .desc = &desc, .iov_count = 1, .addr = s->dest,
				  .rma_iov = &rma, .rma_iov_count = 1, .context = s };
	ssize_t rc;

	do {
		if (opt.delivery)
			rc = read ? fi_readmsg(s->ep, &msg, FI_COMPLETION)
				  : fi_writemsg(s->ep, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE);
		else
			rc = read ? fi_read(s->ep, iov.iov_base, len, desc, s->dest, rma.addr, rma.key, s)
				  : fi_write(s->ep, iov.iov_base, len, desc, s->dest, rma.addr, rma.key, s);
		/* A busy provider (shm while a segmented transfer to the peer is
		 * under way) is waited for like a CQ: an empty look yields. */
		if (rc == -FI_EAGAIN && !reap(s))
			idle();
	} while (rc == -FI_EAGAIN);
	check((int)rc, read ? "fi_read" : "fi_write");
	s->outstanding++;
}

/* ------------------------------------------------------------ tests */

static uint8_t marker(int i) { return (uint8_t)(i % 251 + 1); }

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static void print_latency(const char *name, double *t, int n)
{
	double mean = 0;

	qsort(t, n, sizeof(double), cmp_double);
	for (int i = 0; i < n; i++)
		mean += t[i] / n;
	printf("%-10s %9d %7d %11.2f %11.2f %11s %11.2f %11.1f\n", name, LAT_SIZE, n,
	       n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2, t[(int)((n - 1) * 0.99 + 0.5)], "-",
	       mean, t[n - 1]);
	fflush(stdout);
}

static int warmup(int n) { return n / 10 < WARMUP_MAX ? n / 10 : WARMUP_MAX; }

/* write_lat: the client writes first; each side answers the other's write. */
static void write_lat(struct side *s, int client)
{
	int warm = warmup(opt.lat_iters), total = warm + opt.lat_iters;
	double *t = calloc(total, sizeof(double));
	size_t last = LAT_SIZE - 1;

	for (int i = 0; i < total; i++) {
		double t0 = now_us();

		if (!client)
			wait_byte(s, last, marker(i), "write_lat");
		s->buf[s->size + last] = marker(i);
		post(s, 0, LAT_SIZE);
		if (client)
			wait_byte(s, last, marker(i), "write_lat");
		t[i] = (now_us() - t0) / 2;
		drain_to(s, 0, "write_lat");
	}
	if (client)
		print_latency("write_lat", t + warm, opt.lat_iters);
	free(t);
}

static void read_lat(struct side *s)
{
	int warm = warmup(opt.lat_iters), total = warm + opt.lat_iters;
	double *t = calloc(total, sizeof(double));

	for (int i = 0; i < total; i++) {
		double t0 = now_us();

		post(s, 1, LAT_SIZE);
		drain_to(s, 0, "read_lat");
		t[i] = now_us() - t0;
	}
	print_latency("read_lat", t + warm, opt.lat_iters);
	free(t);
}

static void bandwidth(struct side *s, int read)
{
	int window = read ? opt.read_window : opt.window;
	double t0 = now_us(), mb_per_s;

	for (int i = 0; i < opt.bw_iters; i++) {
		drain_to(s, window - 1, read ? "read_bw" : "write_bw");
		post(s, read, opt.bw_size);
	}
	drain_to(s, 0, read ? "read_bw" : "write_bw");
	mb_per_s = (double)opt.bw_size * opt.bw_iters / (now_us() - t0);
	printf("%-10s %9u %7d %11s %11s %11.1f %11.4f\n", read ? "read_bw" : "write_bw", opt.bw_size,
	       opt.bw_iters, "-", "-", mb_per_s, opt.bw_size / mb_per_s);
	fflush(stdout);
}

/* The server answers write_lat, then keeps the provider moving (reads and
 * writes aimed at it need its CQ read) until the client's final write of
 * the byte 0xff after its own last byte. */
static void serve(struct side *s)
{
	write_lat(s, 0);
	wait_byte(s, LAT_SIZE, 0xff, "waiting for the client's end");
}

/* The end: 0xff into the server's byte LAT_SIZE. Over RDM it completes once
 * placed, so that our endpoint's close cannot overtake it. */
static void end_server(struct side *s)
{
	struct iovec iov = { s->buf + s->size + LAT_SIZE, 1 };
	struct fi_rma_iov rma = { s->peer.addr + LAT_SIZE, 1, s->peer.key };
	void *desc = s->desc;
	struct fi_msg_rma msg = { .msg_iov = &iov, .desc = &desc, .iov_count = 1, .addr = s->dest,
				  .rma_iov = &rma, .rma_iov_count = 1, .context = s };
	ssize_t rc;

	s->buf[s->size + LAT_SIZE] = 0xff;
	while ((rc = fi_writemsg(s->ep, &msg, FI_COMPLETION | (opt.rdm ? FI_DELIVERY_COMPLETE : 0))) ==
	       -FI_EAGAIN)
		if (!reap(s))
			idle();
	check((int)rc, "fi_write (end)");
	s->outstanding++;
	drain_to(s, 0, "end");
}

static void run_client(struct side *s)
{
	printf("# ofi-raw: provider %s (%s), server %s port %s, window %d (RDMA reads %d), polling, %s\n",
	       opt.prov, opt.rdm ? "FI_EP_RDM" : "FI_EP_MSG", opt.addr, opt.port, opt.window, opt.read_window,
	       opt.spin ? "busy waits spin (no sched_yield)" : "busy waits yield (sched_yield)");
	if (opt.delivery)
		printf("# writes complete once placed (FI_DELIVERY_COMPLETE, -D)\n");
	printf("# opened as: mr_mode 0x%x, msg_order 0x%llx, atomics %s, threading %d\n",
	       s->info->domain_attr->mr_mode, (unsigned long long)s->info->tx_attr->msg_order,
	       s->info->caps & FI_ATOMIC ? "yes" : "no", s->info->domain_attr->threading);
	printf("%-10s %9s %7s %11s %11s %11s %11s %11s\n", "test", "bytes", "iters", "median_us",
	       "p99_us", "MB/s", "mean_us", "max_us");
	write_lat(s, 1);
	read_lat(s);
	bandwidth(s, 0);
	bandwidth(s, 1);
	end_server(s);
}

/* ------------------------------------------------------------ connection rate */

/*
 * -C N: datscale's conn_per_s (bench/datscale.c) with libfabric alone, on
 * connected endpoints (FI_EP_MSG only: over -e rdm, ofi_rxm connects inside
 * the provider on the first transfer to a peer, with no event to time). The
 * client's wall time from its first fi_endpoint to its last FI_CONNECTED:
 * every endpoint first, then fi_connect, -o in flight at once, as datscale
 * creates its EPs and then connects -W at a time. Every endpoint binds the
 * one EQ and the one CQ, as datscale's EPs share one connection EVD and one
 * receive EVD (and as any consumer with many peers would): tcp takes a CQ
 * bound to many endpoints. The hints are the MSG mode's. What differs from
 * datscale: no private data, and no receive posted per endpoint (datscale
 * posts one on each EP before it connects or accepts).
 */

static double cpu_s(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* 4,096 connections need more descriptors than the usual soft limit of 1,024. */
static void raise_nofile(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl))
		die("getrlimit(RLIMIT_NOFILE): %m");
	rl.rlim_cur = rl.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &rl))
		die("setrlimit(RLIMIT_NOFILE): %m");
}

/* The domain and the one CQ every endpoint shares (polled, but nothing is
 * posted: it is there because a consumer's endpoints have one). */
static void open_conn_domain(struct side *s, struct fi_info *info)
{
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_NONE };

	check(fi_domain(s->fabric, info, &s->domain, NULL), "fi_domain");
	check(fi_cq_open(s->domain, &cq_attr, &s->cq, NULL), "fi_cq_open");
	s->info = info;
}

/* An enabled endpoint for `info`; its context is its own slot, so that an EQ
 * event names it (conn_index). */
static void open_conn_ep(struct side *s, struct fi_info *info, struct fid_ep **ep)
{
	check(fi_endpoint(s->domain, info, ep, ep), "fi_endpoint");
	check(fi_ep_bind(*ep, &s->eq->fid, 0), "fi_ep_bind eq");
	check(fi_ep_bind(*ep, &s->cq->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind cq");
	check(fi_enable(*ep), "fi_enable");
}

/* An EQ entry with room for private data, should a provider send some. */
struct cm_event {
	struct fi_eq_cm_entry e;
	uint8_t data[256];
};

/* What an EQ read returned (`n`, `event`): the event; an error entry (a
 * refused or failed connect, say) or nothing within `secs` dies naming `what`. */
static uint32_t cm_result(struct side *s, ssize_t n, uint32_t event, int secs, const char *what)
{
	if (n == -FI_EAVAIL) {
		struct fi_eq_err_entry err = { 0 };
		char buf[256];

		fi_eq_readerr(s->eq, &err, 0);
		if (err.prov_errno)
			die("%s: %s (provider: %s)", what, fi_strerror(err.err),
			    fi_eq_strerror(s->eq, err.prov_errno, err.err_data, buf, sizeof(buf)));
		die("%s: %s", what, fi_strerror(err.err));
	}
	if (n == -FI_EAGAIN || n == -FI_ETIMEDOUT)
		die("%s: no event within %d s", what, secs);
	check((int)n, what);
	return event;
}

/* The next EQ event within `secs`. */
static uint32_t next_cm(struct side *s, int secs, struct cm_event *ev, const char *what)
{
	uint32_t event = 0;
	ssize_t n = fi_eq_sread(s->eq, &event, ev, sizeof(*ev), secs * 1000, 0);

	return cm_result(s, n, event, secs, what);
}

/* The index of the endpoint an event names, its state moved from `from` to
 * `to` (0 none, 1 connected, 2 shut down): an event for an endpoint not
 * ours, or a second one of a kind, dies. */
static int conn_index(struct fid_ep **ep, char *state, fid_t fid, char from, char to,
		      const char *what)
{
	struct fid_ep **p = fid ? fid->context : NULL;

	if (!p || p < ep || p >= ep + opt.conns || !*p || &(*p)->fid != fid)
		die("%s: an event for an endpoint that is not ours", what);
	if (state[p - ep] != from)
		die("%s: endpoint %d in state %d, not %d", what, (int)(p - ep), state[p - ep], from);
	state[p - ep] = to;
	return (int)(p - ep);
}

static const char *event_name(uint32_t event)
{
	switch (event) {
	case FI_CONNREQ: return "FI_CONNREQ";
	case FI_CONNECTED: return "FI_CONNECTED";
	case FI_SHUTDOWN: return "FI_SHUTDOWN";
	default: return "an unexpected event";
	}
}

/* The server's wait for the client to shut every connection down. tcp
 * (1.17) reads an endpoint's socket, and so sees it closed and writes its
 * FI_SHUTDOWN, only in a read of its CQ (the EQ runs connection set-up
 * alone): so this wait polls the CQ and the EQ in turn, as the file's other
 * waits poll, bounded by -T as a whole. */
static void wait_closed(struct side *s, struct fid_ep **ep, char *state)
{
	double deadline = now_us() + opt.timeout_s * 1e6;
	char what[96];

	for (int closed = 0; closed < opt.conns;) {
		struct fi_cq_entry c[16];
		struct cm_event ev;
		uint32_t event = 0;
		ssize_t n = fi_cq_read(s->cq, c, 16);

		snprintf(what, sizeof(what), "waiting for the client to close (%d of %d closed)", closed,
			 opt.conns);
		if (n != -FI_EAGAIN)
			die("%s: fi_cq_read returned %zd (nothing was posted)", what, n);
		n = fi_eq_read(s->eq, &event, &ev, sizeof(ev), 0);
		if (n == -FI_EAGAIN) {
			if (now_us() > deadline)
				n = -FI_ETIMEDOUT;
			else {
				idle();
				continue;
			}
		}
		event = cm_result(s, n, event, opt.timeout_s, what);
		if (event != FI_SHUTDOWN)
			die("%s: %s (%u)", what, event_name(event), event);
		conn_index(ep, state, ev.e.fid, 1, 2, what);
		closed++;
	}
}

/* What every side opened under its endpoints: CQ, domain, passive endpoint,
 * EQ and fabric, in that order. */
static void close_fabric(struct side *s)
{
	fi_close(&s->cq->fid);
	fi_close(&s->domain->fid);
	if (s->pep)
		fi_close(&s->pep->fid);
	fi_close(&s->eq->fid);
	fi_close(&s->fabric->fid);
}

/* Closes every endpoint (fi_shutdown first: the peer sees FI_SHUTDOWN), then
 * what they shared. */
static void close_conns(struct side *s, struct fid_ep **ep)
{
	for (int i = 0; i < opt.conns; i++) {
		if (!ep[i])
			continue;
		fi_shutdown(ep[i], 0);
		fi_close(&ep[i]->fid);
	}
	close_fabric(s);
	fi_freeinfo(s->info);
}

/* The server: one endpoint and fi_accept per FI_CONNREQ, the FI_CONNECTED
 * events counted as they come; one line (first request to last
 * FI_CONNECTED, as datscale's accept_s_server); then waits until the client
 * has shut every connection down. */
static void serve_conns(struct side *s)
{
	struct cm_event ev;
	struct fid_ep **ep = calloc(opt.conns, sizeof(*ep));
	char *state = calloc(opt.conns, 1), what[96];
	int n = opt.conns, accepted = 0, connected = 0;
	double t0 = 0, cpu0 = 0, secs;

	if (!ep || !state)
		die("out of memory");
	s->info = get_info(opt.addr, opt.port, FI_SOURCE);
	open_fabric(s, s->info);
	open_conn_domain(s, s->info);
	check(fi_passive_ep(s->fabric, s->info, &s->pep, NULL), "fi_passive_ep");
	check(fi_pep_bind(s->pep, &s->eq->fid, 0), "fi_pep_bind");
	check(fi_listen(s->pep), "fi_listen");
	printf("ofi-raw: server listening on %s port %s (%s, %d connections)\n", opt.addr, opt.port,
	       opt.prov, n);
	fflush(stdout);
	while (connected < n) {
		uint32_t event;

		snprintf(what, sizeof(what), "accepting (%d of %d requests, %d connected)", accepted, n,
			 connected);
		/* The first request waits for a client to start (as serve_accept). */
		event = next_cm(s, accepted ? opt.timeout_s : 4 * opt.timeout_s, &ev, what);
		if (event == FI_CONNREQ && accepted < n) {
			if (!accepted)
				t0 = now_us(), cpu0 = cpu_s();
			open_conn_ep(s, ev.e.info, &ep[accepted]);
			check(fi_accept(ep[accepted], NULL, 0), "fi_accept");
			fi_freeinfo(ev.e.info);
			accepted++;
		} else if (event == FI_CONNECTED) {
			conn_index(ep, state, ev.e.fid, 0, 1, what);
			connected++;
		} else {
			die("%s: %s (%u)", what, event_name(event), event);
		}
	}
	secs = (now_us() - t0) / 1e6;
	printf("ofi-raw conn-server prov=%s n=%d seconds=%.3f conn_per_s=%.0f cpu_s=%.3f\n", opt.prov, n,
	       secs, n / secs, cpu_s() - cpu0);
	fflush(stdout);
	wait_closed(s, ep, state);
	close_conns(s, ep);
	free(ep);
	free(state);
}

/* The client: every endpoint, then the connects, -o in flight; timed from
 * before the first fi_endpoint to the last FI_CONNECTED. */
static void connect_conns(struct side *s)
{
	struct cm_event ev;
	struct fid_ep **ep = calloc(opt.conns, sizeof(*ep));
	char *state = calloc(opt.conns, 1), what[96];
	int n = opt.conns, next = 0, connected = 0;
	double t0, cpu0, secs;

	if (!ep || !state)
		die("out of memory");
	s->info = get_info(opt.addr, opt.port, 0);
	open_fabric(s, s->info);
	open_conn_domain(s, s->info);
	cpu0 = cpu_s();
	t0 = now_us();
	for (int i = 0; i < n; i++)
		open_conn_ep(s, s->info, &ep[i]);
	while (connected < n) {
		uint32_t event;

		for (; next < n && next - connected < opt.conn_window; next++)
			check(fi_connect(ep[next], s->info->dest_addr, NULL, 0),
			      next ? "fi_connect (after the first)" : "fi_connect");
		snprintf(what, sizeof(what), "connecting (%d of %d connected)", connected, n);
		event = next_cm(s, opt.timeout_s, &ev, what);
		if (event != FI_CONNECTED)
			die("%s: %s (%u)", what, event_name(event), event);
		conn_index(ep, state, ev.e.fid, 0, 1, what);
		connected++;
	}
	secs = (now_us() - t0) / 1e6;
	printf("ofi-raw conn prov=%s n=%d seconds=%.3f conn_per_s=%.0f cpu_s=%.3f\n", opt.prov, n, secs,
	       n / secs, cpu_s() - cpu0);
	fflush(stdout);
	close_conns(s, ep);
	free(ep);
	free(state);
}

/* Closes what was opened, in order: shm removes an endpoint's files in
 * /dev/shm only when it is closed. */
static void close_side(struct side *s)
{
	if (!opt.rdm)
		fi_shutdown(s->ep, 0);
	fi_close(&s->ep->fid);
	if (s->av)
		fi_close(&s->av->fid);
	fi_close(&s->mr->fid);
	close_fabric(s);
	if (s->sock >= 0)
		close(s->sock);
}

static void usage(void)
{
	fprintf(stderr, "usage: ofi-raw -s [-a ADDR] [-p PORT] [-e msg|rdm] [-P PROV] | -c ADDR [-p PORT] [-e msg|rdm]\n"
			"       [-P PROV] [-n LAT_ITERS] [-N BW_ITERS] [-S BW_BYTES] [-w WINDOW] [-r READ_WINDOW]\n"
			"       [-y spin|yield] [-T SECONDS] [-D]\n"
			"  -e rdm  reliable datagrams (-P \"tcp;ofi_rxm\", -P shm), set up over TCP to ADDR:PORT\n"
			"  -D  writes complete once placed at the target (FI_DELIVERY_COMPLETE, as our backend's)\n"
			"   or: ofi-raw -s -C N [-a ADDR] [-p PORT] [-P PROV] [-T SECONDS]\n"
			"       ofi-raw -c ADDR -C N [-p PORT] [-P PROV] [-o OUTSTANDING] [-T SECONDS]\n"
			"  -C N  the connection rate over N connections (FI_EP_MSG only), -o connects in flight\n");
	exit(2);
}

int main(int argc, char **argv)
{
	struct side s = { .sock = -1 };
	int c;

	while ((c = getopt(argc, argv, "sc:a:p:P:e:n:N:S:w:r:y:T:DC:o:")) != -1) {
		switch (c) {
		case 's': opt.server = 1; break;
		case 'c': opt.addr = optarg; break;
		case 'a': opt.addr = optarg; break;
		case 'p': opt.port = optarg; break;
		case 'P': opt.prov = optarg; break;
		case 'e':
			if (strcmp(optarg, "msg") && strcmp(optarg, "rdm"))
				usage();
			opt.rdm = !strcmp(optarg, "rdm");
			break;
		case 'n': opt.lat_iters = atoi(optarg); break;
		case 'N': opt.bw_iters = atoi(optarg); break;
		case 'S': opt.bw_size = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'w': opt.window = atoi(optarg); break;
		case 'r': opt.read_window = atoi(optarg); break;
		case 'y': opt.spin = !strcmp(optarg, "spin"); break;
		case 'T': opt.timeout_s = atoi(optarg); break;
		case 'D': opt.delivery = 1; break;
		case 'C': opt.conns = atoi(optarg); break;
		case 'o': opt.conn_window = atoi(optarg); break;
		default: usage();
		}
	}
	if (opt.lat_iters < 1 || opt.bw_iters < 1 || opt.window < 1 || opt.read_window < 1 ||
	    opt.bw_size < LAT_SIZE + 1 || opt.timeout_s < 1 || opt.conns < 0 || opt.conn_window < 1)
		usage();
	if (opt.conns) {
		if (opt.rdm)
			die("-C: connected endpoints only (-e msg)");
		raise_nofile();
		if (opt.server)
			serve_conns(&s);
		else
			connect_conns(&s);
		return 0;
	}
	if (opt.server) {
		if (opt.rdm)
			serve_rdm(&s);
		else
			serve_accept(&s);
		serve(&s);
	} else {
		if (opt.rdm)
			connect_rdm(&s);
		else
			connect_to_server(&s);
		run_client(&s);
	}
	close_side(&s);
	return 0;
}
