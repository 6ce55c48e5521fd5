/* One side of a DAT 1.2 <-> DAT 2.0 exchange over $DAT_TEST_IA (default
 * rs-tcp). Built twice from this file: build/tests/test_interop12 against
 * <dat/udat.h> and -ldat (libdat.so.1, the IA's u1.2 entry), and
 * build/tests/test_interop20 against <dat2/udat.h> and libdat2.so.2 (its
 * u2.0 entry); tests-c/scripts/interop12.sh runs a server of one kind with a client
 * of the other, both ways round.
 *
 *   test_interop12 server PEER_VERSION        prints "interop12: listening
 *                                             on port N" once it listens
 *   test_interop12 client PEER_VERSION PORT   connects to that port of its
 *                                             own IA's address
 *
 * PEER_VERSION (1.2 or 2.0) is what the other side was built for. Each side
 * registers a 4 KiB buffer filled with a pattern of its own version and
 * role, sends the peer a hello naming both (and the buffer's address and
 * rmr_context), checks the peer's hello names the peer's version and role,
 * reads the peer's buffer with an RDMA read and checks every byte of it
 * against the peer's pattern, then sends "done" and waits for the peer's,
 * so that neither side unregisters memory the other still reads. The
 * client disconnects. Every wait is bounded (WAIT_US); nothing sleeps. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"

#ifdef INTEROP_DAT12
#include <dat/udat.h>
#include "dto_pair12.h"
#define MY_VERSION "1.2"
/* 1.2's DTO completion has no operation field */
#define EXPECT_DTO(evd, ep, cookie, len, op, what) expect_dto(evd, ep, cookie, DAT_DTO_SUCCESS, len, what)
#else
#include <dat2/udat.h>
#include "dto_pair.h"
#define MY_VERSION "2.0"
#define EXPECT_DTO(evd, ep, cookie, len, op, what) expect_dto(evd, ep, cookie, DAT_DTO_SUCCESS, len, op, what)
#endif

#define EXPORTED 4096

/* What each side sends first. */
struct hello {
	char text[64];
	uint64_t address; /* of the exported buffer */
	uint32_t rmr_context;
	uint32_t length;
};

static char exported[EXPORTED], landing[EXPORTED];
static char send_buf[sizeof(struct hello)], recv_buf[2][sizeof(struct hello)];

/* The byte at `i` of the buffer a side of `version` and `role` exports. */
static unsigned char pattern(const char *version, const char *role, size_t i)
{
	unsigned seed = (unsigned)version[0] * 7u + (unsigned)version[2] * 13u + (unsigned)role[0] * 29u;
	return (unsigned char)(seed + 31u * i + (i >> 8));
}

static void greeting(char *out, size_t n, const char *version, const char *role)
{
	snprintf(out, n, "hello from DAT %s %s", version, role);
}

static char summary_name[64];

static int run(const char *role, const char *peer_version, DAT_CONN_QUAL port)
{
	const char *peer_role = strcmp(role, "server") == 0 ? "client" : "server";
	DAT_IA_HANDLE ia;
	DAT_EVD_HANDLE async = DAT_HANDLE_NULL;
	DAT_PZ_HANDLE pz;
	DAT_LMR_HANDLE lmr;
	DAT_LMR_CONTEXT lctx;
	DAT_RMR_CONTEXT rctx = 0;
	struct side me;
	DAT_PSP_HANDLE psp = DAT_HANDLE_NULL;
	DAT_LMR_TRIPLET t;
	struct hello h, peer;
	char want[64];

	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async, &ia), DAT_SUCCESS);
	if (check_failed)
		return 0;
	CHECK_RC(dat_pz_create(ia, &pz), DAT_SUCCESS);
	side_evds(&me, ia, pz);
	DAT_EP_ATTR attr = ep_attr(0, 0, 64);
	side_ep(&me, &attr);
	/* an LMR for each buffer: the exported one, the RDMA read's landing
	 * place, the messages */
	for (size_t i = 0; i < EXPORTED; i++)
		exported[i] = (char)pattern(MY_VERSION, role, i);
	memset(landing, 0xEE, sizeof(landing));
	lmr = lmr_make(ia, pz, exported, sizeof(exported), DAT_MEM_PRIV_ALL_FLAG, &lctx, &rctx);
	DAT_LMR_CONTEXT l_land, l_send, l_recv;
	DAT_LMR_HANDLE lmr_land = lmr_make(ia, pz, landing, sizeof(landing), DAT_MEM_PRIV_ALL_FLAG, &l_land, NULL);
	DAT_LMR_HANDLE lmr_send = lmr_make(ia, pz, send_buf, sizeof(send_buf), DAT_MEM_PRIV_ALL_FLAG, &l_send, NULL);
	DAT_LMR_HANDLE lmr_recv = lmr_make(ia, pz, recv_buf, sizeof(recv_buf), DAT_MEM_PRIV_ALL_FLAG, &l_recv, NULL);
	if (check_failed)
		return 0;

	/* the hello and the "done" of the peer, pre-posted before connecting */
	for (int i = 0; i < 2; i++) {
		t = seg(l_recv, recv_buf[i], sizeof(recv_buf[i]));
		CHECK_RC(dat_ep_post_recv(me.ep, 1, &t, ck(0x100 + i), 0), DAT_SUCCESS);
	}

	if (strcmp(role, "server") == 0) {
		DAT_CONN_QUAL qual = 0;
		psp = listen_any(&me, &qual);
		if (psp == DAT_HANDLE_NULL)
			return 0;
		/* the readiness line interop12.sh waits for */
		printf("interop12: listening on port %llu\n", (unsigned long long)qual);
		fflush(stdout);
		if (!accept_next(&me) ||
		    !expect_conn_event(me.conn, me.ep, DAT_CONNECTION_EVENT_ESTABLISHED, "server ESTABLISHED"))
			return 0;
	} else {
		DAT_RETURN rc = dat_ep_connect(me.ep, ia_address(ia), port, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT,
					       DAT_CONNECT_DEFAULT_FLAG);
		CHECK(rc == DAT_SUCCESS, "dat_ep_connect to port %llu = %#x", (unsigned long long)port, (unsigned)rc);
		if (rc != DAT_SUCCESS ||
		    !expect_conn_event(me.conn, me.ep, DAT_CONNECTION_EVENT_ESTABLISHED, "client ESTABLISHED"))
			return 0;
	}

	/* hello, both ways */
	memset(&h, 0, sizeof(h));
	greeting(h.text, sizeof(h.text), MY_VERSION, role);
	h.address = (uint64_t)(uintptr_t)exported;
	h.rmr_context = rctx;
	h.length = EXPORTED;
	memcpy(send_buf, &h, sizeof(h));
	t = seg(l_send, send_buf, sizeof(h));
	CHECK_RC(dat_ep_post_send(me.ep, 1, &t, ck(0x200), 0), DAT_SUCCESS);
	EXPECT_DTO(me.req, me.ep, 0x200, sizeof(h), DAT_DTO_SEND, "hello sent");
	if (!EXPECT_DTO(me.rcv, me.ep, 0x100, sizeof(h), DAT_DTO_RECEIVE, "hello received"))
		return 0;
	memcpy(&peer, recv_buf[0], sizeof(peer));
	greeting(want, sizeof(want), peer_version, peer_role);
	CHECK(strncmp(peer.text, want, sizeof(peer.text)) == 0, "the peer's hello says '%.64s', want '%s'", peer.text,
	      want);
	CHECK(peer.length == EXPORTED, "the peer exports %u bytes", peer.length);

	/* RDMA read of the peer's whole buffer: every byte the peer's pattern */
	t = seg(l_land, landing, EXPORTED);
	DAT_RMR_TRIPLET rem = rseg(peer.rmr_context, (void *)(uintptr_t)peer.address, EXPORTED);
	CHECK_RC(dat_ep_post_rdma_read(me.ep, 1, &t, ck(0x300), &rem, 0), DAT_SUCCESS);
	if (EXPECT_DTO(me.req, me.ep, 0x300, EXPORTED, DAT_DTO_RDMA_READ, "RDMA read of the peer's buffer")) {
		size_t bad = 0, first = EXPORTED;
		for (size_t i = 0; i < EXPORTED; i++)
			if ((unsigned char)landing[i] != pattern(peer_version, peer_role, i)) {
				bad++;
				if (first == EXPORTED)
					first = i;
			}
		CHECK(bad == 0, "RDMA read from DAT %s %s: %zu of %d bytes differ from its pattern (first at %zu)",
		      peer_version, peer_role, bad, EXPORTED, first);
	}

	/* done, both ways: the peer has finished reading our buffer */
	memset(send_buf, 0, sizeof(send_buf));
	snprintf(send_buf, sizeof(send_buf), "done %s", MY_VERSION);
	t = seg(l_send, send_buf, 16);
	CHECK_RC(dat_ep_post_send(me.ep, 1, &t, ck(0x201), 0), DAT_SUCCESS);
	EXPECT_DTO(me.req, me.ep, 0x201, 16, DAT_DTO_SEND, "done sent");
	if (EXPECT_DTO(me.rcv, me.ep, 0x101, 16, DAT_DTO_RECEIVE, "done received")) {
		snprintf(want, sizeof(want), "done %s", peer_version);
		CHECK(strcmp(recv_buf[1], want) == 0, "the peer's done says '%.16s', want '%s'", recv_buf[1], want);
	}

	if (strcmp(role, "client") == 0) {
		CHECK_RC(dat_ep_disconnect(me.ep, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
		expect_conn_event(me.conn, me.ep, DAT_CONNECTION_EVENT_DISCONNECTED, "client DISCONNECTED");
	} else {
		expect_conn_event(me.conn, me.ep, DAT_CONNECTION_EVENT_DISCONNECTED, "server DISCONNECTED");
	}
	if (psp != DAT_HANDLE_NULL)
		CHECK_RC(dat_psp_free(psp), DAT_SUCCESS);
	side_free_ep(&me);
	side_free_evds(&me);
	CHECK_RC(dat_lmr_free(lmr), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_land), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_send), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_recv), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	return 1;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	alarm(60); /* a hang fails the test rather than the run */
	catch_sigpipe();
	if (argc < 3 || (strcmp(argv[1], "server") != 0 && strcmp(argv[1], "client") != 0) ||
	    (strcmp(argv[2], "1.2") != 0 && strcmp(argv[2], "2.0") != 0) ||
	    (strcmp(argv[1], "client") == 0 && argc < 4)) {
		fprintf(stderr, "usage: %s server PEER_VERSION | client PEER_VERSION PORT (PEER_VERSION 1.2 or 2.0)\n",
			argv[0]);
		return 2;
	}
	snprintf(summary_name, sizeof(summary_name), "DAT %s %s with DAT %s", MY_VERSION, argv[1], argv[2]);
	run(argv[1], argv[2], argc > 3 ? strtoull(argv[3], NULL, 10) : 0);
	check_no_sigpipe();
	return check_summary(summary_name);
}
