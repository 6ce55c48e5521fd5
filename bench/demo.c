/*
 * demo: two processes talking RDMA through the DAT 2.0 API.
 *
 *   demo server [IA]            exposes a buffer, waits for one client
 *   demo client SERVER_IP [IA]  writes into it, reads it back, says goodbye
 *
 * The server registers a buffer (an LMR), binds a window onto it (an RMR)
 * and sends the client the window's triplet. The client RDMA-writes a
 * message into the server's memory, RDMA-reads it back into a buffer of its
 * own, checks the copy, and sends a short message. The server's CPU takes
 * no part in the write and the read: it only sees the result afterwards.
 *
 * IA defaults to rs-tcp (udapl-rs's TCP provider, see dat.conf). Every wait
 * is bounded; any failure prints the DAT error and exits non-zero.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <dat2/udat.h>

#define CONN_QUAL 18516
#define TIMEOUT_US (20u * 1000 * 1000)      /* every wait */
#define BUF_SIZE 4096

static const char *role = "demo";

static void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "%s: error: ", role);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(1);
}

static void check(DAT_RETURN rc, const char *what)
{
	const char *major = "?", *minor = "";

	if (rc != DAT_SUCCESS) {
		dat_strerror(rc, &major, &minor);
		die("%s: %s %s (0x%08x)", what, major, minor ? minor : "", (unsigned)rc);
	}
}

static void say(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	printf("%s: ", role);
	vprintf(fmt, ap);
	putchar('\n');
	fflush(stdout);
	va_end(ap);
}

/* Where the server's window is: sent to the client in the first message. */
struct window_msg {
	uint64_t addr;
	uint32_t len;
	uint32_t rmr_context;
};

/* What both sides set up: one endpoint and a registered 4 KiB buffer. */
struct side {
	DAT_IA_HANDLE ia;
	DAT_EVD_HANDLE async_evd, dto_evd, conn_evd;
	DAT_PZ_HANDLE pz;
	DAT_EP_HANDLE ep;
	char *buf;
	DAT_LMR_HANDLE lmr;
	DAT_LMR_CONTEXT lmr_context;
	DAT_RMR_CONTEXT lmr_rmr_context;
};

static void open_side(struct side *s, char *ia_name)
{
	DAT_REGION_DESCRIPTION region;
	DAT_VLEN reg_len;
	DAT_VADDR reg_addr;

	memset(s, 0, sizeof(*s));
	s->async_evd = DAT_HANDLE_NULL;
	check(dat_ia_open(ia_name, 8, &s->async_evd, &s->ia), "opening the IA");
	check(dat_pz_create(s->ia, &s->pz), "dat_pz_create");
	/* One EVD for every data transfer and bind, one for connection events. */
	check(dat_evd_create(s->ia, 16, DAT_HANDLE_NULL, DAT_EVD_DTO_FLAG | DAT_EVD_RMR_BIND_FLAG,
			     &s->dto_evd), "dat_evd_create");
	check(dat_evd_create(s->ia, 4, DAT_HANDLE_NULL, DAT_EVD_CONNECTION_FLAG, &s->conn_evd),
	      "dat_evd_create");
	check(dat_ep_create(s->ia, s->pz, s->dto_evd, s->dto_evd, s->conn_evd, NULL, &s->ep),
	      "dat_ep_create");
	s->buf = calloc(1, BUF_SIZE);
	if (!s->buf)
		die("out of memory");
	region.for_va = s->buf;
	check(dat_lmr_create(s->ia, DAT_MEM_TYPE_VIRTUAL, region, BUF_SIZE, s->pz,
			     DAT_MEM_PRIV_ALL_FLAG, DAT_VA_TYPE_VA, &s->lmr, &s->lmr_context,
			     &s->lmr_rmr_context, &reg_len, &reg_addr), "registering the buffer");
}

static void close_side(struct side *s)
{
	check(dat_ep_free(s->ep), "dat_ep_free");
	check(dat_lmr_free(s->lmr), "dat_lmr_free");
	check(dat_evd_free(s->conn_evd), "dat_evd_free");
	check(dat_evd_free(s->dto_evd), "dat_evd_free");
	check(dat_pz_free(s->pz), "dat_pz_free");
	check(dat_ia_close(s->ia, DAT_CLOSE_DEFAULT), "dat_ia_close");
	free(s->buf);
}

static const char *event_name(DAT_EVENT_NUMBER n)
{
	switch (n) {
	case DAT_CONNECTION_EVENT_NON_PEER_REJECTED: return "refused (is the server running?)";
	case DAT_CONNECTION_EVENT_PEER_REJECTED: return "rejected by the server";
	case DAT_CONNECTION_EVENT_DISCONNECTED: return "the peer disconnected";
	case DAT_CONNECTION_EVENT_BROKEN: return "the connection broke";
	case DAT_CONNECTION_EVENT_TIMED_OUT: return "timed out";
	case DAT_CONNECTION_EVENT_UNREACHABLE: return "peer unreachable";
	default: return "unexpected event";
	}
}

static DAT_EVENT wait_event(DAT_EVD_HANDLE evd, DAT_EVENT_NUMBER want, const char *what)
{
	DAT_EVENT ev;
	DAT_COUNT nmore;

	check(dat_evd_wait(evd, TIMEOUT_US, 1, &ev, &nmore), what);
	if (ev.event_number != want)
		die("%s: %s (event 0x%x)", what, event_name(ev.event_number),
		    (unsigned)ev.event_number);
	return ev;
}

/* Waits for a transfer to complete and insists that it succeeded. */
static DAT_DTO_COMPLETION_EVENT_DATA wait_dto(struct side *s, const char *what)
{
	DAT_EVENT ev = wait_event(s->dto_evd, DAT_DTO_COMPLETION_EVENT, what);

	if (ev.event_data.dto_completion_event_data.status != DAT_DTO_SUCCESS)
		die("%s: completion status %d", what,
		    (int)ev.event_data.dto_completion_event_data.status);
	return ev.event_data.dto_completion_event_data;
}

/* A piece of our registered buffer, as the DAT calls take it. */
static DAT_LMR_TRIPLET piece(struct side *s, size_t offset, size_t len)
{
	DAT_LMR_TRIPLET t;

	t.virtual_address = (DAT_VADDR)(uintptr_t)(s->buf + offset);
	t.segment_length = (DAT_SEG_LENGTH)len;
	t.lmr_context = s->lmr_context;
	return t;
}

static DAT_DTO_COOKIE no_cookie(void)
{
	DAT_DTO_COOKIE c;

	c.as_64 = 0;
	return c;
}

static void post_recv(struct side *s, size_t offset, size_t len)
{
	DAT_LMR_TRIPLET t = piece(s, offset, len);

	check(dat_ep_post_recv(s->ep, 1, &t, no_cookie(), DAT_COMPLETION_DEFAULT_FLAG),
	      "dat_ep_post_recv");
}

static void send_and_wait(struct side *s, size_t offset, size_t len, const char *what)
{
	DAT_LMR_TRIPLET t = piece(s, offset, len);

	check(dat_ep_post_send(s->ep, 1, &t, no_cookie(), DAT_COMPLETION_DEFAULT_FLAG), what);
	wait_dto(s, what);
}

/* ----------------------------------------------------------------- server */

/* The server's buffer: the window the client writes into, then a message area. */
#define WINDOW_LEN 256
#define MSG_OFFSET 1024

static int run_server(char *ia_name)
{
	struct side s;
	DAT_EVD_HANDLE cr_evd;
	DAT_PSP_HANDLE psp;
	DAT_RMR_HANDLE rmr;
	DAT_RMR_CONTEXT rmr_context;
	DAT_RMR_COOKIE rmr_cookie;
	DAT_LMR_TRIPLET window;
	DAT_EVENT ev;
	struct window_msg *wm;
	DAT_DTO_COMPLETION_EVENT_DATA got;

	role = "server";
	open_side(&s, ia_name);
	strcpy(s.buf, "(nothing written yet)");
	check(dat_evd_create(s.ia, 4, DAT_HANDLE_NULL, DAT_EVD_CR_FLAG, &cr_evd), "dat_evd_create");
	check(dat_psp_create(s.ia, CONN_QUAL, cr_evd, DAT_PSP_CONSUMER_FLAG, &psp),
	      "listening (dat_psp_create)");
	say("listening on conn_qual %d; my buffer holds \"%s\"", CONN_QUAL, s.buf);

	ev = wait_event(cr_evd, DAT_CONNECTION_REQUEST_EVENT, "waiting for a client");
	post_recv(&s, MSG_OFFSET, 256);     /* for the client's goodbye */
	check(dat_cr_accept(ev.event_data.cr_arrival_event_data.cr_handle, s.ep, 0, NULL),
	      "dat_cr_accept");
	wait_event(s.conn_evd, DAT_CONNECTION_EVENT_ESTABLISHED, "accepting");
	say("a client connected");

	/* An RMR opens exactly the first WINDOW_LEN bytes to this connection's peer. */
	check(dat_rmr_create(s.pz, &rmr), "dat_rmr_create");
	window = piece(&s, 0, WINDOW_LEN);
	rmr_cookie.as_64 = 1;
	check(dat_rmr_bind(rmr, s.lmr, &window,
			   DAT_MEM_PRIV_REMOTE_READ_FLAG | DAT_MEM_PRIV_REMOTE_WRITE_FLAG,
			   DAT_VA_TYPE_VA, s.ep, rmr_cookie, DAT_COMPLETION_DEFAULT_FLAG,
			   &rmr_context), "dat_rmr_bind");
	ev = wait_event(s.dto_evd, DAT_RMR_BIND_COMPLETION_EVENT, "binding the RMR");
	if (ev.event_data.rmr_completion_event_data.status != DAT_RMR_BIND_SUCCESS)
		die("binding the RMR: status %d", (int)ev.event_data.rmr_completion_event_data.status);
	say("bound an RMR over the first %d bytes of my buffer (rmr_context 0x%x)", WINDOW_LEN,
	    (unsigned)rmr_context);

	wm = (struct window_msg *)(s.buf + 2048);
	wm->addr = window.virtual_address;
	wm->len = WINDOW_LEN;
	wm->rmr_context = rmr_context;
	send_and_wait(&s, 2048, sizeof(*wm), "sending the RMR triplet");
	say("sent the client the RMR triplet; now I only wait for its message");

	got = wait_dto(&s, "waiting for the client's message");
	s.buf[MSG_OFFSET + (got.transfered_length < 255 ? got.transfered_length : 255)] = '\0';
	say("the client says: \"%s\"", s.buf + MSG_OFFSET);
	say("my buffer now holds \"%s\" (written by the client, no call of mine involved)",
	    s.buf);

	wait_event(s.conn_evd, DAT_CONNECTION_EVENT_DISCONNECTED, "waiting for the client to leave");
	check(dat_rmr_free(rmr), "dat_rmr_free");
	check(dat_psp_free(psp), "dat_psp_free");
	check(dat_evd_free(cr_evd), "dat_evd_free");
	close_side(&s);
	say("the client disconnected; done");
	return 0;
}

/* ----------------------------------------------------------------- client */

static int run_client(const char *host, char *ia_name)
{
	static const char message[] = "Hello, server! This text came by RDMA write.";
	static const char goodbye[] = "I wrote into your memory and read it back. Bye!";
	struct side s;
	struct sockaddr_in sin;
	struct window_msg wm;
	DAT_RMR_TRIPLET remote;
	DAT_LMR_TRIPLET t;
	char *out, *back;

	role = "client";
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	if (inet_pton(AF_INET, host, &sin.sin_addr) != 1)
		die("'%s' is not an IPv4 address", host);
	open_side(&s, ia_name);
	out = s.buf + 1024;          /* what we write */
	back = s.buf + 2048;         /* where the read lands */

	post_recv(&s, 0, sizeof(wm));   /* for the server's RMR triplet */
	check(dat_ep_connect(s.ep, (DAT_IA_ADDRESS_PTR)&sin, CONN_QUAL, TIMEOUT_US, 0, NULL,
			     DAT_QOS_BEST_EFFORT, DAT_CONNECT_DEFAULT_FLAG), "dat_ep_connect");
	wait_event(s.conn_evd, DAT_CONNECTION_EVENT_ESTABLISHED, "connecting");
	say("connected to %s", host);

	wait_dto(&s, "waiting for the server's RMR triplet");
	memcpy(&wm, s.buf, sizeof(wm));
	remote.virtual_address = wm.addr;
	remote.segment_length = sizeof(message);
	remote.rmr_context = wm.rmr_context;
	say("the server exposes %u bytes at 0x%llx (rmr_context 0x%x)", wm.len,
	    (unsigned long long)wm.addr, wm.rmr_context);
	if (sizeof(message) > wm.len)
		die("the server's window is too small");

	strcpy(out, message);
	t = piece(&s, 1024, sizeof(message));
	check(dat_ep_post_rdma_write(s.ep, 1, &t, no_cookie(), &remote,
				     DAT_COMPLETION_DEFAULT_FLAG), "dat_ep_post_rdma_write");
	wait_dto(&s, "RDMA write");
	say("RDMA-wrote \"%s\" into the server's memory", message);

	memset(back, 0, sizeof(message));
	t = piece(&s, 2048, sizeof(message));
	check(dat_ep_post_rdma_read(s.ep, 1, &t, no_cookie(), &remote,
				    DAT_COMPLETION_DEFAULT_FLAG), "dat_ep_post_rdma_read");
	wait_dto(&s, "RDMA read");
	say("RDMA-read it back: \"%s\"", back);
	if (memcmp(back, message, sizeof(message)) != 0)
		die("the copy read back differs from what was written");
	say("the copy matches what was written");

	strcpy(s.buf + 3072, goodbye);
	send_and_wait(&s, 3072, sizeof(goodbye), "sending the goodbye");
	say("sent the server a message: \"%s\"", goodbye);

	check(dat_ep_disconnect(s.ep, DAT_CLOSE_GRACEFUL_FLAG), "dat_ep_disconnect");
	wait_event(s.conn_evd, DAT_CONNECTION_EVENT_DISCONNECTED, "disconnecting");
	close_side(&s);
	say("disconnected; done");
	return 0;
}

int main(int argc, char **argv)
{
	char default_ia[] = "rs-tcp";

	if (argc >= 2 && argc <= 3 && !strcmp(argv[1], "server"))
		return run_server(argc == 3 ? argv[2] : default_ia);
	if (argc >= 3 && argc <= 4 && !strcmp(argv[1], "client"))
		return run_client(argv[2], argc == 4 ? argv[3] : default_ia);
	fprintf(stderr, "usage: demo server [IA] | demo client SERVER_IP [IA]\n");
	return 2;
}
