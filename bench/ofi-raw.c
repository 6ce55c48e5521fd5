/*
 * ofi-raw: the raw libfabric reference of `make bench-ofi` (run-bench-ofi.sh).
 *
 * The same measurements datperf makes over a DAT entry, made with libfabric
 * alone on the same provider (FI_EP_MSG, default tcp), so that datperf over
 * rs-ofi-tcp can be read as a ratio of it:
 *
 *   write_lat  RDMA write ping-pong: each side writes 8 B into the peer's
 *              buffer and waits for the peer's write in its own buffer's last
 *              byte; one-way = RTT/2 (datperf's write_lat)
 *   read_lat   one RDMA read at a time; the whole read (datperf's read_lat)
 *   write_bw, read_bw  `window` operations in flight (reads: -r), MB/s
 *
 * Waits poll as datperf -p does: a completion queue is read in a loop, with
 * sched_yield() between empty looks (-y spin: without). A side waiting for the
 * peer's write reads its CQ while it watches its memory: libfabric's tcp
 * provider places incoming data only inside a libfabric call of the target
 * (docs/libfabric.md, "Progress"), so that read is what a raw program must do
 * (our backend's progress thread does it for a DAT program).
 *
 *   ofi-raw -s [-a ADDR] [-p PORT]                    server: one client, then exits
 *   ofi-raw -c ADDR [-p PORT] [-n LAT] [-N BW] [-w W] [-r R] [-S BYTES] [-D]
 *
 * -D (on both sides) posts writes with FI_DELIVERY_COMPLETE, as our backend
 * does (a write completes once placed, as on an RDMA NIC): the target then
 * acknowledges each write, like with like for run-bench-ofi.sh.
 *
 * The client sends its buffer's address and key, the iteration counts and
 * sizes in the connection request's private data, the server its own in the
 * accept's. Every wait is bounded (-T seconds).
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
	uint32_t bw_size;
} opt = {
	.prov = "tcp", .addr = "127.0.0.1", .port = "18619",
	.lat_iters = 20000, .bw_iters = 2048, .window = 8, .read_window = 8, .timeout_s = 30,
	.bw_size = 1u << 20,
};

/* What each side tells the other in the connection's private data. */
struct hello {
	uint64_t addr, key;          /* RMA address of the buffer (0: offset-based) and its key */
	uint32_t lat_iters, bw_iters, bw_size, pad;
};

struct side {
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_eq *eq;
	struct fid_pep *pep;
	struct fid_ep *ep;
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

static void open_fabric(struct side *s, struct fi_info *info)
{
	struct fi_eq_attr eq_attr = { .wait_obj = FI_WAIT_UNSPEC };

	check(fi_fabric(info->fabric_attr, &s->fabric, NULL), "fi_fabric");
	check(fi_eq_open(s->fabric, &eq_attr, &s->eq, NULL), "fi_eq_open");
}

/* The domain, the endpoint for `info` (a connection request's or our own),
 * its CQ (no wait object: it is polled) and the registered buffer. */
static void open_endpoint(struct side *s, struct fi_info *info)
{
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_NONE,
				      .size = 1024 };
	uint64_t key = s->pep ? KEY_BASE + 1 : KEY_BASE;

	check(fi_domain(s->fabric, info, &s->domain, NULL), "fi_domain");
	check(fi_endpoint(s->domain, info, &s->ep, NULL), "fi_endpoint");
	check(fi_cq_open(s->domain, &cq_attr, &s->cq, NULL), "fi_cq_open");
	check(fi_ep_bind(s->ep, &s->eq->fid, 0), "fi_ep_bind eq");
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

/* ------------------------------------------------------------ polling */

/* One look at the CQ: completions counted off `outstanding`; a failed one dies. */
static int reap(struct side *s)
{
	struct fi_cq_entry e[16];
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

static void post(struct side *s, int read, size_t len)
{
	uint8_t *local = s->buf + s->size;
	ssize_t rc;

	do {
		if (!read && opt.delivery) {
			struct iovec iov = { local, len };
			struct fi_rma_iov rma = { s->peer.addr, len, s->peer.key };
			void *desc = s->desc;
			struct fi_msg_rma msg = { .msg_iov = &iov, .desc = &desc, .iov_count = 1,
						  .rma_iov = &rma, .rma_iov_count = 1, .context = s };

			rc = fi_writemsg(s->ep, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE);
		} else {
			rc = read ? fi_read(s->ep, local, len, s->desc, 0, s->peer.addr, s->peer.key, s)
				  : fi_write(s->ep, local, len, s->desc, 0, s->peer.addr, s->peer.key, s);
		}
		if (rc == -FI_EAGAIN)
			reap(s);
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

static void run_client(struct side *s)
{
	printf("# ofi-raw: provider %s, server %s port %s, window %d (RDMA reads %d), polling, %s\n",
	       opt.prov, opt.addr, opt.port, opt.window, opt.read_window,
	       opt.spin ? "busy waits spin (no sched_yield)" : "busy waits yield (sched_yield)");
	if (opt.delivery)
		printf("# writes complete once placed (FI_DELIVERY_COMPLETE, -D)\n");
	printf("%-10s %9s %7s %11s %11s %11s %11s %11s\n", "test", "bytes", "iters", "median_us",
	       "p99_us", "MB/s", "mean_us", "max_us");
	write_lat(s, 1);
	read_lat(s);
	bandwidth(s, 0);
	bandwidth(s, 1);
	/* The end: 0xff into the server's byte LAT_SIZE, then a read to know it landed. */
	s->buf[s->size + LAT_SIZE] = 0xff;
	check((int)fi_write(s->ep, s->buf + s->size + LAT_SIZE, 1, s->desc, 0, s->peer.addr + LAT_SIZE,
			    s->peer.key, s), "fi_write (end)");
	s->outstanding++;
	drain_to(s, 0, "end");
}

static void usage(void)
{
	fprintf(stderr, "usage: ofi-raw -s [-a ADDR] [-p PORT] | -c ADDR [-p PORT] [-P PROV] [-n LAT_ITERS]\n"
			"       [-N BW_ITERS] [-S BW_BYTES] [-w WINDOW] [-r READ_WINDOW] [-y spin|yield] [-T SECONDS] [-D]\n"
			"  -D  writes complete once placed at the target (FI_DELIVERY_COMPLETE, as our backend's)\n");
	exit(2);
}

int main(int argc, char **argv)
{
	struct side s = { 0 };
	int c;

	while ((c = getopt(argc, argv, "sc:a:p:P:n:N:S:w:r:y:T:D")) != -1) {
		switch (c) {
		case 's': opt.server = 1; break;
		case 'c': opt.addr = optarg; break;
		case 'a': opt.addr = optarg; break;
		case 'p': opt.port = optarg; break;
		case 'P': opt.prov = optarg; break;
		case 'n': opt.lat_iters = atoi(optarg); break;
		case 'N': opt.bw_iters = atoi(optarg); break;
		case 'S': opt.bw_size = (uint32_t)strtoul(optarg, NULL, 0); break;
		case 'w': opt.window = atoi(optarg); break;
		case 'r': opt.read_window = atoi(optarg); break;
		case 'y': opt.spin = !strcmp(optarg, "spin"); break;
		case 'T': opt.timeout_s = atoi(optarg); break;
		case 'D': opt.delivery = 1; break;
		default: usage();
		}
	}
	if (opt.lat_iters < 1 || opt.bw_iters < 1 || opt.window < 1 || opt.read_window < 1 ||
	    opt.bw_size < LAT_SIZE + 1 || opt.timeout_s < 1)
		usage();
	if (opt.server) {
		serve_accept(&s);
		serve(&s);
	} else {
		connect_to_server(&s);
		run_client(&s);
	}
	fi_shutdown(s.ep, 0);
	return 0;
}
