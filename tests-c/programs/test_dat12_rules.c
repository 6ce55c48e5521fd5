/* The DAT 1.2 suite: the return codes and rules of the seed pages
 * dat_ep_post_send, dat_ep_post_rdma_read and dat_rmr_bind, in a program
 * built as the pages say (#include <dat/udat.h>, -I include, -ldat: our
 * libdat.so.1) over the IA $DAT_TEST_IA (default rs-tcp, on 127.0.0.1,
 * through its u1.2 entry; tests-c/scripts/verbs-guest.sh runs it on soft-RoCE).
 * test_dto_rules checks the same rules through the 2.0 API; this is its
 * port to the 1.2 signatures (7-argument dat_rmr_bind naming the LMR by the
 * triplet's context, 11-argument dat_lmr_create, 24-byte triplets, DTO
 * completions without an operation field), with the matching rules of
 * post_recv and post_rdma_write, and the program of tests-c/programs/seed12_synopsis.c
 * (written from the pages' synopses) linked in and run. Two IAs in one
 * process: side A connects to side B's IA address, B accepts on a PSP from
 * dat_psp_create_any. Every wait has a timeout; nothing sleeps.
 *
 * Rules of the pages that cannot be tested here, and why:
 * - DAT_MODEL_NOT_SUPPORTED (dat_rmr_bind): 1.2's bind has no argument that
 *   selects a model (2.0 added the DAT_VA_TYPE argument that test_dto_rules
 *   refuses with it); no 7-argument call can request an unsupported one.
 * - DAT_PROTECTION_VIOLATION / DAT_PRIVILEGES_VIOLATION for the *remote*
 *   buffer of dat_ep_post_rdma_read (rmr_context of another PZ, or without
 *   remote read) cannot be returned by the post: the initiator cannot know
 *   the remote context when it posts, on TCP as on an RDMA NIC. The target
 *   refuses the access and the read completes with DAT_DTO_ERR_REMOTE_ACCESS,
 *   which test_remote_read_violation checks.
 * - "use of rmr_context before the bind completed can result in an error":
 *   a "can", not a must; we check the stronger guarantee instead (a Send
 *   posted after the bind carries a context the peer can use at once).
 * - "if the bind fails after dat_rmr_bind returns, the connection breaks":
 *   every failure this provider can detect is returned synchronously; no
 *   consumer action makes a posted bind fail later.
 * - outstanding RDMA Read limits broken by the peer: both our EPs negotiate
 *   nothing on TCP; the provider does not break on them.
 * - "should avoid resource allocation", alignment advice: not observable.
 * - DAT_COMPLETION_BARRIER_FENCE_FLAG: a fenced send must not gather its
 *   data before earlier RDMA reads have completed; we check that a fenced
 *   send carries the bytes its preceding read brought. SOLICITED_WAIT is
 *   accepted; receive-side solicited notification has no TCP meaning here.
 * - on an IA without RMRs (max_rmrs 0: an iWARP device without memory
 *   windows, e.g. soft-iWARP) dat_rmr_create is DAT_INSUFFICIENT_RESOURCES
 *   and every case that needs an RMR is skipped, saying so; on iWARP the
 *   full request queue held by a receiver that is not ready (RNR retry) and
 *   the read its target refuses (siw flushes it, the TERMINATE ends the
 *   connection; test_remote_violation says more) are skipped, saying why; an
 *   RDMA read into more segments than the IA's max_iov_segments_per_rdma_read
 *   (siw: one) must be DAT_INVALID_PARAMETER.
 * - dat_ep_post_recv is not a seed page: DAT lets receives be pre-posted on
 *   an UNCONNECTED EP (dat_ep_reset speaks of "preposted Recvs"), so
 *   post_recv there succeeds; only an UNCONFIGURED EP (no PZ) refuses it. */
#define _GNU_SOURCE /* pthread_timedjoin_np */
#include <dat/udat.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "dto_pair12.h"

static DAT_IA_HANDLE ia_a, ia_b;
static DAT_PZ_HANDLE pz_a, pz_b, pz_a2, pz_b2;
static struct side A, B;

/* Memory: A's buffer (ALL privileges), A's buffer in another PZ, A's
 * buffer with only remote privileges, A's buffer with only local read,
 * B's buffer (ALL). */
#define BUF 65536
static char abuf[BUF], obuf[BUF], rbuf[BUF], robuf[BUF], bbuf[BUF], b2buf[BUF];
static DAT_LMR_HANDLE lmr_a, lmr_o, lmr_r, lmr_ro, lmr_b, lmr_b2;
static DAT_LMR_CONTEXT lc_a, lc_o, lc_r, lc_ro, lc_b, lc_b2;
static DAT_RMR_CONTEXT rc_a, rc_b, rc_b2;

/* tests-c/programs/seed12_synopsis.c, linked in: the program written from the three
 * seed pages' synopses. Each returns 0 when both of its calls succeeded, 1
 * for a return code its page lists, 2 for any other. */
int seed_ep_post_rdma_read(DAT_EP_HANDLE ep_handle, DAT_COUNT num_segments, DAT_LMR_TRIPLET *local_iov,
			   DAT_DTO_COOKIE user_cookie, DAT_RMR_TRIPLET *remote_buffer,
			   DAT_COMPLETION_FLAGS completion_flags);
int seed_ep_post_send(DAT_EP_HANDLE ep_handle, DAT_COUNT num_segments, DAT_LMR_TRIPLET *local_iov,
		      DAT_DTO_COOKIE user_cookie, DAT_COMPLETION_FLAGS completion_flags);
int seed_rmr_bind(DAT_RMR_HANDLE rmr_handle, DAT_LMR_TRIPLET *lmr_triplet, DAT_MEM_PRIV_FLAGS mem_privileges,
		  DAT_EP_HANDLE ep_handle, DAT_RMR_COOKIE user_cookie, DAT_COMPLETION_FLAGS completion_flags,
		  DAT_RMR_CONTEXT *rmr_context);
int seed_other_names(DAT_EP_STATE state, DAT_EVENT_NUMBER event, DAT_VADDR address);

static void fill(void *p, int c, size_t n)
{
	memset(p, c, n);
}

/* The IA has no RMRs (max_rmrs 0); it is an iWARP one (no RNR retry); the
 * local segments an RDMA read fills (siw: one). */
static int no_rmrs, iwarp, read_segments;

/* A new RMR of `pz`, or DAT_HANDLE_NULL on an IA without RMRs (whose
 * dat_rmr_create must be DAT_INSUFFICIENT_RESOURCES). */
static DAT_RMR_HANDLE rmr_new(DAT_PZ_HANDLE pz)
{
	DAT_RMR_HANDLE r = DAT_HANDLE_NULL;
	if (no_rmrs) {
		CHECK_TYPE(dat_rmr_create(pz, &r), DAT_INSUFFICIENT_RESOURCES);
		return DAT_HANDLE_NULL;
	}
	CHECK_RC(dat_rmr_create(pz, &r), DAT_SUCCESS);
	return r;
}

static void rmr_done(DAT_RMR_HANDLE r)
{
	if (r != DAT_HANDLE_NULL)
		CHECK_RC(dat_rmr_free(r), DAT_SUCCESS);
}

static void skip_no_rmrs(const char *what)
{
	printf("SKIP %s: %s has no RMRs (max_rmrs 0)\n", what, dat_test_ia());
}

/* A signalled marker on A's EP: a zero-byte RDMA read, which completes after
 * everything A posted before it. On iWARP 8 bytes into the end of A's
 * buffer instead, saying so: siw (Linux 6.1) may answer a zero-byte read queued behind
 * another read with that read's length, then TERMINATE. */
static void marker_read(uint64_t cookie, const char *what)
{
	DAT_VLEN len = iwarp ? 8 : 0;
	DAT_LMR_TRIPLET m = seg(lc_a, abuf + BUF - 8, 8);
	DAT_RMR_TRIPLET rem = rseg(rc_b, bbuf, len);
	if (iwarp)
		printf("SKIP zero-byte marker read (%s): siw answers a zero-byte read queued behind a read with that read's length\n", what);
	CHECK_RC(dat_ep_post_rdma_read(A.ep, iwarp ? 1 : 0, iwarp ? &m : NULL, ck(cookie), &rem, 0), DAT_SUCCESS);
	expect_dto(A.req, A.ep, cookie, DAT_DTO_SUCCESS, len, what);
}

static int all_are(const char *p, int c, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)p[i] != (unsigned char)c)
			return 0;
	return 1;
}

/* New EPs on both sides with the given request completion flags and
 * request queue depth. */
static void new_eps(DAT_COMPLETION_FLAGS a_req_flags, DAT_COUNT a_max_req)
{
	DAT_EP_ATTR aa = ep_attr(a_req_flags, 0, a_max_req);
	DAT_EP_ATTR ba = ep_attr(0, 0, 64);
	side_ep(&A, &aa);
	side_ep(&B, &ba);
}

static void free_eps(void)
{
	side_free_ep(&A);
	side_free_ep(&B);
}

/* One send of `n` bytes of abuf+off from A into a receive of B at bbuf+boff. */
static int send_recv(size_t off, size_t boff, size_t n, uint64_t cookie)
{
	DAT_LMR_TRIPLET s = seg(lc_a, abuf + off, n), r = seg(lc_b, bbuf + boff, n);
	CHECK_RC(dat_ep_post_recv(B.ep, 1, &r, ck(cookie + 1), 0), DAT_SUCCESS);
	CHECK_RC(dat_ep_post_send(A.ep, 1, &s, ck(cookie), 0), DAT_SUCCESS);
	return expect_dto(A.req, A.ep, cookie, DAT_DTO_SUCCESS, n, "send") &&
	       expect_dto(B.rcv, B.ep, cookie + 1, DAT_DTO_SUCCESS, n, "receive");
}

/* ---- DAT_INVALID_STATE outside CONNECTED / DISCONNECTED ------------------------------------ */

static void posts_refused_in_state(DAT_EP_HANDLE ep, DAT_LMR_CONTEXT lc, char *buf, DAT_RMR_HANDLE rmr,
				   const char *state)
{
	DAT_LMR_TRIPLET l = seg(lc, buf, 16);
	DAT_RMR_TRIPLET r = rseg(rc_b, bbuf, 16);
	DAT_RMR_CONTEXT ctx = 0;
	DAT_RETURN rc;

	rc = dat_ep_post_send(ep, 1, &l, ck(1), 0);
	CHECK(DAT_GET_TYPE(rc) == DAT_INVALID_STATE, "post_send in %s = %#x", state, (unsigned)rc);
	rc = dat_ep_post_rdma_read(ep, 1, &l, ck(2), &r, 0);
	CHECK(DAT_GET_TYPE(rc) == DAT_INVALID_STATE, "post_rdma_read in %s = %#x", state, (unsigned)rc);
	rc = dat_ep_post_rdma_write(ep, 1, &l, ck(3), &r, 0);
	CHECK(DAT_GET_TYPE(rc) == DAT_INVALID_STATE, "post_rdma_write in %s = %#x", state, (unsigned)rc);
	if (rmr != DAT_HANDLE_NULL) {
		rc = dat_rmr_bind(rmr, &l, DAT_MEM_PRIV_REMOTE_READ_FLAG, ep, ck(4), 0, &ctx);
		CHECK(DAT_GET_TYPE(rc) == DAT_INVALID_STATE, "rmr_bind in %s = %#x", state, (unsigned)rc);
	}
}

static void test_states(void)
{
	DAT_RMR_HANDLE rmr;
	DAT_EP_HANDLE unconf;
	DAT_LMR_TRIPLET l = seg(lc_a, abuf, 16);
	DAT_RETURN rc;

	rmr = rmr_new(pz_a);
	if (no_rmrs)
		skip_no_rmrs("dat_rmr_bind refused by EP state");
	new_eps(0, 64);

	/* UNCONNECTED */
	CHECK(ep_state(A.ep) == DAT_EP_STATE_UNCONNECTED, "new EP state %u", ep_state(A.ep));
	posts_refused_in_state(A.ep, lc_a, abuf, rmr, "UNCONNECTED");
	/* ... nothing of it reached an EVD */
	expect_empty(A.req, "UNCONNECTED refusals");

	/* UNCONFIGURED (no PZ): neither requests nor receives */
	{
		DAT_EP_ATTR at = ep_attr(0, 0, 8);
		CHECK_RC(dat_ep_create(ia_a, DAT_HANDLE_NULL, A.rcv, A.req, A.conn, &at, &unconf), DAT_SUCCESS);
		CHECK(ep_state(unconf) == DAT_EP_STATE_UNCONFIGURED_UNCONNECTED, "PZ-less EP state %u",
		      ep_state(unconf));
		posts_refused_in_state(unconf, lc_a, abuf, DAT_HANDLE_NULL, "UNCONFIGURED");
		rc = dat_ep_post_recv(unconf, 1, &l, ck(5), 0);
		CHECK(DAT_GET_TYPE(rc) == DAT_INVALID_STATE, "post_recv on a PZ-less EP = %#x", (unsigned)rc);
		CHECK_RC(dat_ep_free(unconf), DAT_SUCCESS);
	}

	/* RESERVED (held by an RSP) */
	{
		DAT_EP_HANDLE res;
		DAT_RSP_HANDLE rsp;
		DAT_EP_ATTR at = ep_attr(0, 0, 8);
		CHECK_RC(dat_ep_create(ia_b, pz_b, B.rcv, B.req, B.conn, &at, &res), DAT_SUCCESS);
		/* a port nobody else uses: the one a PSP got, freed again (a connection of another
		 * program may take it as its own port in between: then another one) */
		DAT_RETURN rrc = DAT_CONN_QUAL_IN_USE;
		for (int tries = 0; tries < 50 && DAT_GET_TYPE(rrc) == DAT_CONN_QUAL_IN_USE; tries++) {
			DAT_CONN_QUAL q = 0;
			DAT_PSP_HANDLE psp = listen_any(&B, &q);
			CHECK_RC(dat_psp_free(psp), DAT_SUCCESS);
			rrc = dat_rsp_create(ia_b, q, res, B.cr, &rsp);
		}
		CHECK_RC(rrc, DAT_SUCCESS);
		CHECK(ep_state(res) == DAT_EP_STATE_RESERVED, "EP of an RSP: state %u", ep_state(res));
		posts_refused_in_state(res, lc_b, bbuf, DAT_HANDLE_NULL, "RESERVED");
		CHECK_RC(dat_rsp_free(rsp), DAT_SUCCESS);
		CHECK_RC(dat_ep_free(res), DAT_SUCCESS);
	}

	/* Receives may be pre-posted while UNCONNECTED; this one is used below. */
	{
		DAT_LMR_TRIPLET r = seg(lc_b, bbuf, 64);
		CHECK_RC(dat_ep_post_recv(B.ep, 1, &r, ck(0x50), 0), DAT_SUCCESS);
	}

	/* ACTIVE_CONNECTION_PENDING: connected to B's PSP, not yet accepted */
	{
		DAT_CONN_QUAL q = 0;
		DAT_PSP_HANDLE psp = listen_any(&B, &q);
		CHECK_RC(dat_ep_connect(A.ep, ia_address(ia_b), q, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT,
					DAT_CONNECT_DEFAULT_FLAG),
			 DAT_SUCCESS);
		CHECK(ep_state(A.ep) == DAT_EP_STATE_ACTIVE_CONNECTION_PENDING, "connecting EP state %u",
		      ep_state(A.ep));
		posts_refused_in_state(A.ep, lc_a, abuf, rmr, "ACTIVE_CONNECTION_PENDING");
		if (accept_next(&B)) {
			expect_conn_event(B.conn, B.ep, DAT_CONNECTION_EVENT_ESTABLISHED, "passive ESTABLISHED");
			expect_conn_event(A.conn, A.ep, DAT_CONNECTION_EVENT_ESTABLISHED, "active ESTABLISHED");
		}
		CHECK_RC(dat_psp_free(psp), DAT_SUCCESS);
	}
	CHECK(ep_state(A.ep) == DAT_EP_STATE_CONNECTED, "EP state after ESTABLISHED %u", ep_state(A.ep));
	/* the pre-posted receive takes the first send */
	memcpy(abuf, "pre-posted", 10);
	{
		DAT_LMR_TRIPLET s = seg(lc_a, abuf, 10);
		CHECK_RC(dat_ep_post_send(A.ep, 1, &s, ck(0x51), 0), DAT_SUCCESS);
		expect_dto(A.req, A.ep, 0x51, DAT_DTO_SUCCESS, 10, "send to a pre-posted receive");
		expect_dto(B.rcv, B.ep, 0x50, DAT_DTO_SUCCESS, 10, "pre-posted receive");
		CHECK(memcmp(bbuf, "pre-posted", 10) == 0, "pre-posted receive holds the data");
	}
	free_eps();
	rmr_done(rmr);
}

/* ---- synchronous local checks on a CONNECTED EP -------------------------------------------- */

static void test_local_checks(void)
{
	DAT_RMR_HANDLE rmr_b = DAT_HANDLE_NULL, rmr_o = DAT_HANDLE_NULL;
	DAT_RMR_CONTEXT ctx = 0;
	/* remote buffers as long as the local IOV, so that no length rule applies */
	DAT_RMR_TRIPLET remote = rseg(rc_b, bbuf, 16);
	DAT_RMR_TRIPLET remote64 = rseg(rc_b, bbuf, 64);
	DAT_LMR_TRIPLET t;

	new_eps(0, 64);
	if (!connect_pair(&A, &B)) {
		free_eps();
		return;
	}

	/* DAT_INVALID_PARAMETER: a segment pointing outside its LMR (before its
	 * start, past its end, and a length running past the end) */
	DAT_LMR_TRIPLET outside[3] = { seg(lc_a, abuf - 8, 16), seg(lc_a, abuf + BUF, 8), seg(lc_a, abuf + BUF - 8, 16) };
	for (int i = 0; i < 3; i++) {
		remote.segment_length = outside[i].segment_length;
		CHECK_TYPE(dat_ep_post_send(A.ep, 1, &outside[i], ck(0x100 + i), 0), DAT_INVALID_PARAMETER);
		CHECK_TYPE(dat_ep_post_rdma_read(A.ep, 1, &outside[i], ck(0x110 + i), &remote, 0),
			   DAT_INVALID_PARAMETER);
		CHECK_TYPE(dat_ep_post_rdma_write(A.ep, 1, &outside[i], ck(0x120 + i), &remote, 0),
			   DAT_INVALID_PARAMETER);
		CHECK_TYPE(dat_ep_post_recv(A.ep, 1, &outside[i], ck(0x130 + i), 0), DAT_INVALID_PARAMETER);
	}
	remote.segment_length = 16;
	/* DAT_INVALID_PARAMETER, not a crash: a segment count far above the EP's
	 * IOV limit with an array of one triplet (refused before the array is
	 * read), on every call that takes an IOV */
	{
		DAT_LMR_TRIPLET one = seg(lc_a, abuf, 16);
		CHECK_TYPE(dat_ep_post_recv(A.ep, 1 << 30, &one, ck(0x140), 0), DAT_INVALID_PARAMETER);
		CHECK_TYPE(dat_ep_post_send(A.ep, 1 << 30, &one, ck(0x141), 0), DAT_INVALID_PARAMETER);
		CHECK_TYPE(dat_ep_post_rdma_read(A.ep, 1 << 30, &one, ck(0x142), &remote, 0), DAT_INVALID_PARAMETER);
		CHECK_TYPE(dat_ep_post_rdma_write(A.ep, 1 << 30, &one, ck(0x143), &remote, 0), DAT_INVALID_PARAMETER);
		CHECK_TYPE(dat_ep_post_recv(A.ep, 5, &one, ck(0x145), 0), DAT_INVALID_PARAMETER);
	}
	/* ... also when only the second segment of an IOV is outside */
	{
		DAT_LMR_TRIPLET two[2] = { seg(lc_a, abuf, 8), seg(lc_a, abuf + BUF - 4, 8) };
		CHECK_TYPE(dat_ep_post_send(A.ep, 2, two, ck(0x140), 0), DAT_INVALID_PARAMETER);
		CHECK_TYPE(dat_ep_post_rdma_read(A.ep, 2, two, ck(0x141), &remote, 0), DAT_INVALID_PARAMETER);
	}

	/* DAT_INVALID_PARAMETER: more segments than the EP's max_request_iov /
	 * max_rdma_read_iov / max_rdma_write_iov / max_recv_iov (4 each here;
	 * NetworkDirect's Read page: too many entries for the endpoint) */
	{
		DAT_LMR_TRIPLET five[5];
		for (int i = 0; i < 5; i++)
			five[i] = seg(lc_a, abuf + 16 * i, 4);
		remote.segment_length = 20;
		CHECK_TYPE(dat_ep_post_send(A.ep, 5, five, ck(0x150), 0), DAT_INVALID_PARAMETER);
		CHECK_TYPE(dat_ep_post_rdma_read(A.ep, 5, five, ck(0x151), &remote, 0), DAT_INVALID_PARAMETER);
		CHECK_TYPE(dat_ep_post_rdma_write(A.ep, 5, five, ck(0x152), &remote, 0), DAT_INVALID_PARAMETER);
		CHECK_TYPE(dat_ep_post_recv(A.ep, 5, five, ck(0x153), 0), DAT_INVALID_PARAMETER);
		remote.segment_length = 16;
	}

	/* DAT_PROTECTION_VIOLATION: an LMR of another PZ than the EP's */
	t = seg(lc_o, obuf, 16);
	CHECK_TYPE(dat_ep_post_send(A.ep, 1, &t, ck(0x200), 0), DAT_PROTECTION_VIOLATION);
	CHECK_TYPE(dat_ep_post_rdma_read(A.ep, 1, &t, ck(0x201), &remote, 0), DAT_PROTECTION_VIOLATION);
	CHECK_TYPE(dat_ep_post_rdma_write(A.ep, 1, &t, ck(0x202), &remote, 0), DAT_PROTECTION_VIOLATION);
	CHECK_TYPE(dat_ep_post_recv(A.ep, 1, &t, ck(0x203), 0), DAT_PROTECTION_VIOLATION);

	/* DAT_PRIVILEGES_VIOLATION: a send or write source without local read
	 * (only remote privileges), a read target or receive buffer without
	 * local write (local read only), and an invalid LMR (no such context) */
	t = seg(lc_r, rbuf, 16);
	CHECK_TYPE(dat_ep_post_send(A.ep, 1, &t, ck(0x300), 0), DAT_PRIVILEGES_VIOLATION);
	CHECK_TYPE(dat_ep_post_rdma_write(A.ep, 1, &t, ck(0x301), &remote, 0), DAT_PRIVILEGES_VIOLATION);
	t = seg(lc_ro, robuf, 16);
	CHECK_TYPE(dat_ep_post_rdma_read(A.ep, 1, &t, ck(0x302), &remote, 0), DAT_PRIVILEGES_VIOLATION);
	CHECK_TYPE(dat_ep_post_recv(A.ep, 1, &t, ck(0x303), 0), DAT_PRIVILEGES_VIOLATION);
	t = seg(lc_a ^ 0x5a5a5a00u, abuf, 16);
	CHECK_TYPE(dat_ep_post_send(A.ep, 1, &t, ck(0x304), 0), DAT_PRIVILEGES_VIOLATION);
	CHECK_TYPE(dat_ep_post_rdma_read(A.ep, 1, &t, ck(0x305), &remote, 0), DAT_PRIVILEGES_VIOLATION);
	CHECK_TYPE(dat_ep_post_rdma_write(A.ep, 1, &t, ck(0x306), &remote, 0), DAT_PRIVILEGES_VIOLATION);
	/* a local-read-only LMR is a valid send source */
	{
		DAT_LMR_TRIPLET r = seg(lc_b, bbuf, 16);
		memcpy(robuf, "read-only source", 16);
		t = seg(lc_ro, robuf, 16);
		CHECK_RC(dat_ep_post_recv(B.ep, 1, &r, ck(0x310), 0), DAT_SUCCESS);
		CHECK_RC(dat_ep_post_send(A.ep, 1, &t, ck(0x311), 0), DAT_SUCCESS);
		expect_dto(A.req, A.ep, 0x311, DAT_DTO_SUCCESS, 16, "send from a local-read LMR");
		expect_dto(B.rcv, B.ep, 0x310, DAT_DTO_SUCCESS, 16, "its receive");
		CHECK(memcmp(bbuf, "read-only source", 16) == 0, "data of a send from a local-read LMR");
	}

	/* DAT_LENGTH_ERROR (rdma_read page): the local IOV is smaller than the
	 * remote buffer; with several segments too */
	t = seg(lc_a, abuf, 63);
	CHECK_TYPE(dat_ep_post_rdma_read(A.ep, 1, &t, ck(0x400), &remote64, 0), DAT_LENGTH_ERROR);
	{
		DAT_LMR_TRIPLET two[2] = { seg(lc_a, abuf, 32), seg(lc_a, abuf + 100, 31) };
		CHECK_TYPE(dat_ep_post_rdma_read(A.ep, 2, two, ck(0x401), &remote64, 0), DAT_LENGTH_ERROR);
		CHECK_TYPE(dat_ep_post_rdma_read(A.ep, 0, NULL, ck(0x402), &remote64, 0), DAT_LENGTH_ERROR);
	}
	/* ... and, from the dat_ep_post_rdma_write page (not a seed): more local
	 * data than the remote buffer holds */
	t = seg(lc_a, abuf, 65);
	CHECK_TYPE(dat_ep_post_rdma_write(A.ep, 1, &t, ck(0x403), &remote64, 0), DAT_LENGTH_ERROR);

	/* DAT_INVALID_PARAMETER: DAT_COMPLETION_UNSIGNALLED_FLAG on an EP whose
	 * request_completion_flags lack it (receives: recv_completion_flags) */
	t = seg(lc_a, abuf, 16);
	CHECK_TYPE(dat_ep_post_send(A.ep, 1, &t, ck(0x500), DAT_COMPLETION_UNSIGNALLED_FLAG), DAT_INVALID_PARAMETER);
	CHECK_TYPE(dat_ep_post_rdma_read(A.ep, 1, &t, ck(0x501), &remote, DAT_COMPLETION_UNSIGNALLED_FLAG),
		   DAT_INVALID_PARAMETER);
	CHECK_TYPE(dat_ep_post_rdma_write(A.ep, 1, &t, ck(0x502), &remote, DAT_COMPLETION_UNSIGNALLED_FLAG),
		   DAT_INVALID_PARAMETER);
	CHECK_TYPE(dat_ep_post_recv(A.ep, 1, &t, ck(0x503), DAT_COMPLETION_UNSIGNALLED_FLAG), DAT_INVALID_PARAMETER);

	/* DAT_INVALID_HANDLE */
	CHECK_TYPE(dat_ep_post_rdma_read(DAT_HANDLE_NULL, 1, &t, ck(0x600), &remote, 0), DAT_INVALID_HANDLE);
	CHECK_TYPE(dat_ep_post_rdma_read((DAT_EP_HANDLE)pz_a, 1, &t, ck(0x601), &remote, 0), DAT_INVALID_HANDLE);
	CHECK_TYPE(dat_ep_post_send((DAT_EP_HANDLE)lmr_a, 1, &t, ck(0x602), 0), DAT_INVALID_HANDLE);

	if (no_rmrs) {
		skip_no_rmrs("dat_rmr_bind's synchronous checks");
		rmr_b = rmr_new(pz_b);
	} else {
		/* dat_rmr_bind: B binds into its own LMR through its EP */
		rmr_b = rmr_new(pz_b);
		rmr_o = rmr_new(pz_a2);
		/* DAT_INVALID_PARAMETER: target_address or segment_length past the LMR */
		t = seg(lc_b, bbuf - 16, 32);
		CHECK_TYPE(dat_rmr_bind(rmr_b, &t, DAT_MEM_PRIV_REMOTE_READ_FLAG, B.ep, ck(0x700), 0,
					&ctx),
			   DAT_INVALID_PARAMETER);
		t = seg(lc_b, bbuf + BUF - 16, 32);
		CHECK_TYPE(dat_rmr_bind(rmr_b, &t, DAT_MEM_PRIV_REMOTE_READ_FLAG, B.ep, ck(0x701), 0,
					&ctx),
			   DAT_INVALID_PARAMETER);
		/* DAT_PROTECTION_VIOLATION: the RMR's PZ is not the EP's (A's other PZ
		 * RMR bound through A's EP into an LMR of that PZ) */
		t = seg(lc_o, obuf, 32);
		CHECK_TYPE(dat_rmr_bind(rmr_o, &t, DAT_MEM_PRIV_REMOTE_READ_FLAG, A.ep, ck(0x702), 0,
					&ctx),
			   DAT_PROTECTION_VIOLATION);
		/* ... and the LMR's PZ is not the RMR's */
		{
			DAT_RMR_HANDLE rmr_a;
			CHECK_RC(dat_rmr_create(pz_a, &rmr_a), DAT_SUCCESS);
			CHECK_TYPE(dat_rmr_bind(rmr_a, &t, DAT_MEM_PRIV_REMOTE_READ_FLAG, A.ep,
						ck(0x703), 0, &ctx),
				   DAT_PROTECTION_VIOLATION);
			/* DAT_PRIVILEGES_VIOLATION: remote read of an LMR without local
			 * read, remote write of one without local write */
			t = seg(lc_r, rbuf, 32);
			CHECK_TYPE(dat_rmr_bind(rmr_a, &t, DAT_MEM_PRIV_REMOTE_READ_FLAG, A.ep,
						ck(0x704), 0, &ctx),
				   DAT_PRIVILEGES_VIOLATION);
			CHECK_TYPE(dat_rmr_bind(rmr_a, &t, DAT_MEM_PRIV_REMOTE_WRITE_FLAG, A.ep,
						ck(0x705), 0, &ctx),
				   DAT_PRIVILEGES_VIOLATION);
			t = seg(lc_ro, robuf, 32);
			CHECK_TYPE(dat_rmr_bind(rmr_a, &t, DAT_MEM_PRIV_REMOTE_WRITE_FLAG, A.ep,
						ck(0x706), 0, &ctx),
				   DAT_PRIVILEGES_VIOLATION);
			CHECK_RC(dat_rmr_free(rmr_a), DAT_SUCCESS);
		}
		t = seg(lc_b, bbuf, 32);
		/* DAT_INVALID_PARAMETER: UNSIGNALLED without the EP flag */
		CHECK_TYPE(dat_rmr_bind(rmr_b, &t, DAT_MEM_PRIV_REMOTE_READ_FLAG, B.ep, ck(0x708),
					DAT_COMPLETION_UNSIGNALLED_FLAG, &ctx),
			   DAT_INVALID_PARAMETER);
		/* DAT_INVALID_HANDLE: no RMR, no EP, handles of another type */
		CHECK_TYPE(dat_rmr_bind(DAT_HANDLE_NULL, &t, DAT_MEM_PRIV_REMOTE_READ_FLAG, B.ep,
					ck(0x709), 0, &ctx),
			   DAT_INVALID_HANDLE);
		CHECK_TYPE(dat_rmr_bind(rmr_b, &t, DAT_MEM_PRIV_REMOTE_READ_FLAG, DAT_HANDLE_NULL,
					ck(0x70a), 0, &ctx),
			   DAT_INVALID_HANDLE);
		CHECK_TYPE(dat_rmr_bind((DAT_RMR_HANDLE)lmr_b, &t, DAT_MEM_PRIV_REMOTE_READ_FLAG, B.ep, ck(0x70b), 0, &ctx),
			   DAT_INVALID_HANDLE);
		CHECK_TYPE(dat_rmr_bind(rmr_b, &t, DAT_MEM_PRIV_REMOTE_READ_FLAG, (DAT_EP_HANDLE)pz_b, ck(0x70c), 0, &ctx),
			   DAT_INVALID_HANDLE);
		/* DAT_PRIVILEGES_VIOLATION: 1.2 names the LMR by the triplet's
		 * lmr_context alone; a context no LMR has is refused as the post pages
		 * refuse one ("one of the LMRs used ... was invalid") */
		t = seg(lc_b ^ 0x5a5a5a00u, bbuf, 32);
		CHECK_TYPE(dat_rmr_bind(rmr_b, &t, DAT_MEM_PRIV_REMOTE_READ_FLAG, B.ep, ck(0x70d), 0, &ctx),
			   DAT_PRIVILEGES_VIOLATION);

	}

	/* None of the refused calls produced an event or hurt the connection */
	expect_empty(A.req, "refused requests (A)");
	expect_empty(A.rcv, "refused receives (A)");
	expect_empty(B.req, "refused binds (B)");
	CHECK(ep_state(A.ep) == DAT_EP_STATE_CONNECTED, "EP state after refused calls %u", ep_state(A.ep));
	memcpy(abuf, "still fine", 10);
	send_recv(0, 0, 10, 0x800);
	CHECK(memcmp(bbuf, "still fine", 10) == 0, "data after refused calls");

	free_eps();
	rmr_done(rmr_b);
	rmr_done(rmr_o);
}

/* ---- transfers: IOVs, lengths, cookies, order, flags ---------------------------------------- */

static void test_transfers(void)
{
	DAT_LMR_TRIPLET s[3], r[3];
	DAT_RMR_TRIPLET rem;

	new_eps(0, 64);
	if (!connect_pair(&A, &B)) {
		free_eps();
		return;
	}

	/* zero-length send (0 segments, NULL IOV) into a receive with a buffer */
	fill(bbuf, 0xEE, 64);
	r[0] = seg(lc_b, bbuf, 64);
	CHECK_RC(dat_ep_post_recv(B.ep, 1, r, ck(0x1001), 0), DAT_SUCCESS);
	CHECK_RC(dat_ep_post_send(A.ep, 0, NULL, ck(0x1000), 0), DAT_SUCCESS);
	expect_dto(A.req, A.ep, 0x1000, DAT_DTO_SUCCESS, 0, "zero-length send");
	expect_dto(B.rcv, B.ep, 0x1001, DAT_DTO_SUCCESS, 0, "receive of a zero-length send");
	CHECK(all_are(bbuf, 0xEE, 64), "a zero-length send wrote into the receive buffer");
	/* ... into a zero-length receive (0 segments, NULL IOV) */
	CHECK_RC(dat_ep_post_recv(B.ep, 0, NULL, ck(0x1003), 0), DAT_SUCCESS);
	CHECK_RC(dat_ep_post_send(A.ep, 0, NULL, ck(0x1002), 0), DAT_SUCCESS);
	expect_dto(A.req, A.ep, 0x1002, DAT_DTO_SUCCESS, 0, "zero-length send (2)");
	expect_dto(B.rcv, B.ep, 0x1003, DAT_DTO_SUCCESS, 0, "zero-length receive");

	/* the cookie "can be NULL": it comes back as given */
	{
		DAT_DTO_COOKIE null_cookie;
		null_cookie.as_ptr = NULL;
		r[0] = seg(lc_b, bbuf, 64);
		CHECK_RC(dat_ep_post_recv(B.ep, 1, r, null_cookie, 0), DAT_SUCCESS);
		CHECK_RC(dat_ep_post_send(A.ep, 0, NULL, null_cookie, 0), DAT_SUCCESS);
		expect_dto(A.req, A.ep, 0, DAT_DTO_SUCCESS, 0, "send with a NULL cookie");
		expect_dto(B.rcv, B.ep, 0, DAT_DTO_SUCCESS, 0, "receive with a NULL cookie");
	}

	/* a 10-byte send into a 3-segment receive of 3, 4 and 8 bytes: the front
	 * segments filled completely, the third partly, nothing past it */
	fill(bbuf, 0xEE, 256);
	memcpy(abuf, "0123456789", 10);
	r[0] = seg(lc_b, bbuf + 0, 3);
	r[1] = seg(lc_b, bbuf + 64, 4);
	r[2] = seg(lc_b, bbuf + 128, 8);
	s[0] = seg(lc_a, abuf, 10);
	CHECK_RC(dat_ep_post_recv(B.ep, 3, r, ck(0x1011), 0), DAT_SUCCESS);
	CHECK_RC(dat_ep_post_send(A.ep, 1, s, ck(0x1010), 0), DAT_SUCCESS);
	expect_dto(A.req, A.ep, 0x1010, DAT_DTO_SUCCESS, 10, "10-byte send");
	expect_dto(B.rcv, B.ep, 0x1011, DAT_DTO_SUCCESS, 10, "3-segment receive");
	CHECK(memcmp(bbuf, "012", 3) == 0 && all_are(bbuf + 3, 0xEE, 61), "receive segment 1");
	CHECK(memcmp(bbuf + 64, "3456", 4) == 0 && all_are(bbuf + 68, 0xEE, 60), "receive segment 2");
	CHECK(memcmp(bbuf + 128, "789", 3) == 0 && all_are(bbuf + 131, 0xEE, 125), "receive segment 3");

	/* a 3-segment send gathers its segments in order */
	fill(bbuf, 0xEE, 64);
	memcpy(abuf + 1000, "ab", 2);
	memcpy(abuf + 2000, "cde", 3);
	memcpy(abuf + 3000, "fghij", 5);
	s[0] = seg(lc_a, abuf + 1000, 2);
	s[1] = seg(lc_a, abuf + 2000, 3);
	s[2] = seg(lc_a, abuf + 3000, 5);
	r[0] = seg(lc_b, bbuf, 64);
	CHECK_RC(dat_ep_post_recv(B.ep, 1, r, ck(0x1021), 0), DAT_SUCCESS);
	CHECK_RC(dat_ep_post_send(A.ep, 3, s, ck(0x1020), 0), DAT_SUCCESS);
	expect_dto(A.req, A.ep, 0x1020, DAT_DTO_SUCCESS, 10, "3-segment send");
	expect_dto(B.rcv, B.ep, 0x1021, DAT_DTO_SUCCESS, 10, "receive of a 3-segment send");
	CHECK(memcmp(bbuf, "abcdefghij", 10) == 0 && all_are(bbuf + 10, 0xEE, 54), "gathered send data");

	/* sends arrive in order: 32 receives, 32 sends, completions and data in order */
	fill(bbuf, 0xEE, 32 * 64);
	for (int i = 0; i < 32; i++) {
		r[0] = seg(lc_b, bbuf + i * 64, 64);
		CHECK_RC(dat_ep_post_recv(B.ep, 1, r, ck(0x2000 + i), 0), DAT_SUCCESS);
	}
	for (int i = 0; i < 32; i++) {
		char *p = abuf + 4096 + i * 16;
		snprintf(p, 16, "message %02d", i);
		s[0] = seg(lc_a, p, 11 + (i % 3));
		CHECK_RC(dat_ep_post_send(A.ep, 1, s, ck(0x3000 + i), 0), DAT_SUCCESS);
	}
	for (int i = 0; i < 32; i++)
		if (!expect_dto(A.req, A.ep, 0x3000 + i, DAT_DTO_SUCCESS, 11 + (i % 3), "ordered send"))
			break;
	for (int i = 0; i < 32; i++) {
		char want[16];
		snprintf(want, sizeof(want), "message %02d", i);
		if (!expect_dto(B.rcv, B.ep, 0x2000 + i, DAT_DTO_SUCCESS, 11 + (i % 3),
				"ordered receive"))
			break;
		CHECK(memcmp(bbuf + i * 64, want, 10) == 0 &&
			      memcmp(bbuf + i * 64, abuf + 4096 + i * 16, 11 + (i % 3)) == 0 &&
			      all_are(bbuf + i * 64 + 11 + (i % 3), 0xEE, 1),
		      "receive %d holds '%.*s'", i, 11 + (i % 3), bbuf + i * 64);
	}

	/* a receive completes only when its data is in place: 1 MiB checked the
	 * moment its completion is seen */
	{
		size_t n = 1 << 20;
		char *src = malloc(n), *dst = malloc(n);
		DAT_LMR_CONTEXT ls, ld;
		DAT_LMR_HANDLE hs = lmr_make(ia_a, pz_a, src, n, DAT_MEM_PRIV_ALL_FLAG, &ls, NULL);
		DAT_LMR_HANDLE hd = lmr_make(ia_b, pz_b, dst, n, DAT_MEM_PRIV_ALL_FLAG, &ld, NULL);
		for (size_t i = 0; i < n; i++)
			src[i] = (char)(i * 7 + 3);
		memset(dst, 0, n);
		s[0] = seg(ls, src, n);
		r[0] = seg(ld, dst, n);
		CHECK_RC(dat_ep_post_recv(B.ep, 1, r, ck(0x4001), 0), DAT_SUCCESS);
		CHECK_RC(dat_ep_post_send(A.ep, 1, s, ck(0x4000), 0), DAT_SUCCESS);
		if (expect_dto(B.rcv, B.ep, 0x4001, DAT_DTO_SUCCESS, n, "1 MiB receive"))
			CHECK(memcmp(src, dst, n) == 0, "1 MiB receive complete but its data is not all in place");
		expect_dto(A.req, A.ep, 0x4000, DAT_DTO_SUCCESS, n, "1 MiB send");
		CHECK_RC(dat_lmr_free(hs), DAT_SUCCESS);
		CHECK_RC(dat_lmr_free(hd), DAT_SUCCESS);
		free(src);
		free(dst);
	}

	/* RDMA write gathering 3 segments into B's memory (B's LMR context) */
	fill(bbuf + 8192, 0xEE, 64);
	rem = rseg(rc_b, bbuf + 8192, 10);
	s[0] = seg(lc_a, abuf + 1000, 2);
	s[1] = seg(lc_a, abuf + 2000, 3);
	s[2] = seg(lc_a, abuf + 3000, 5);
	CHECK_RC(dat_ep_post_rdma_write(A.ep, 3, s, ck(0x5000), &rem, 0), DAT_SUCCESS);
	if (expect_dto(A.req, A.ep, 0x5000, DAT_DTO_SUCCESS, 10, "3-segment RDMA write"))
		CHECK(memcmp(bbuf + 8192, "abcdefghij", 10) == 0 && all_are(bbuf + 8192 + 10, 0xEE, 54),
		      "RDMA write data at the target");
	expect_empty(B.rcv, "an RDMA write consumed no receive");

	/* RDMA read of 10 bytes into segments of 4, 4 and 16 bytes */
	memcpy(bbuf + 9000, "ABCDEFGHIJ", 10);
	fill(abuf + 10000, 0xEE, 256);
	s[0] = seg(lc_a, abuf + 10000, 4);
	s[1] = seg(lc_a, abuf + 10064, 4);
	s[2] = seg(lc_a, abuf + 10128, 16);
	rem = rseg(rc_b, bbuf + 9000, 10);
	if (read_segments < 3) {
		/* The device reads into fewer segments (siw: one, which alone it would
		 * fill): refused at once, and the EP stays connected. */
		printf("SKIP 3-segment RDMA read: %s reads into %d segment(s) (max_iov_segments_per_rdma_read)\n",
		       dat_test_ia(), read_segments);
		CHECK_TYPE(dat_ep_post_rdma_read(A.ep, 3, s, ck(0x5001), &rem, 0), DAT_INVALID_PARAMETER);
	} else {
		CHECK_RC(dat_ep_post_rdma_read(A.ep, 3, s, ck(0x5001), &rem, 0), DAT_SUCCESS);
		if (expect_dto(A.req, A.ep, 0x5001, DAT_DTO_SUCCESS, 10, "3-segment RDMA read")) {
			CHECK(memcmp(abuf + 10000, "ABCD", 4) == 0 && all_are(abuf + 10004, 0xEE, 60),
			      "read segment 1");
			CHECK(memcmp(abuf + 10064, "EFGH", 4) == 0 && all_are(abuf + 10068, 0xEE, 60),
			      "read segment 2");
			CHECK(memcmp(abuf + 10128, "IJ", 2) == 0 && all_are(abuf + 10130, 0xEE, 126),
			      "read segment 3");
		}
	}
	/* a zero-byte RDMA read (no local segments, remote length 0) completes
	 * (the seed page of NetworkDirect's Read names it a liveness probe) */
	rem = rseg(rc_b, bbuf, 0);
	CHECK_RC(dat_ep_post_rdma_read(A.ep, 0, NULL, ck(0x5002), &rem, 0), DAT_SUCCESS);
	expect_dto(A.req, A.ep, 0x5002, DAT_DTO_SUCCESS, 0, "zero-byte RDMA read");

	/* DAT_COMPLETION_SUPPRESS_FLAG: no event on success. A suppressed send,
	 * write and read, then a signalled send: the first event A sees is the
	 * signalled one and nothing follows it; the suppressed ones did their work. */
	fill(bbuf, 0xEE, 128);
	memcpy(abuf, "suppressed", 10);
	memcpy(bbuf + 9000, "remote-rd!", 10);
	fill(abuf + 200, 0xEE, 16);
	r[0] = seg(lc_b, bbuf, 16);
	CHECK_RC(dat_ep_post_recv(B.ep, 1, r, ck(0x6001), 0), DAT_SUCCESS);
	r[0] = seg(lc_b, bbuf + 16, 16);
	CHECK_RC(dat_ep_post_recv(B.ep, 1, r, ck(0x6003), 0), DAT_SUCCESS);
	s[0] = seg(lc_a, abuf, 10);
	CHECK_RC(dat_ep_post_send(A.ep, 1, s, ck(0x6000), DAT_COMPLETION_SUPPRESS_FLAG), DAT_SUCCESS);
	rem = rseg(rc_b, bbuf + 64, 10);
	CHECK_RC(dat_ep_post_rdma_write(A.ep, 1, s, ck(0x6004), &rem, DAT_COMPLETION_SUPPRESS_FLAG), DAT_SUCCESS);
	s[1] = seg(lc_a, abuf + 200, 10);
	rem = rseg(rc_b, bbuf + 9000, 10);
	CHECK_RC(dat_ep_post_rdma_read(A.ep, 1, &s[1], ck(0x6005), &rem, DAT_COMPLETION_SUPPRESS_FLAG), DAT_SUCCESS);
	CHECK_RC(dat_ep_post_send(A.ep, 1, s, ck(0x6002), 0), DAT_SUCCESS);
	expect_dto(A.req, A.ep, 0x6002, DAT_DTO_SUCCESS, 10, "signalled send after suppressed ones");
	expect_empty(A.req, "suppressed successful completions");
	expect_dto(B.rcv, B.ep, 0x6001, DAT_DTO_SUCCESS, 10, "receive of a suppressed send");
	expect_dto(B.rcv, B.ep, 0x6003, DAT_DTO_SUCCESS, 10, "receive of the signalled send");
	CHECK(memcmp(bbuf, "suppressed", 10) == 0, "data of a suppressed send");
	CHECK(memcmp(bbuf + 64, "suppressed", 10) == 0, "data of a suppressed RDMA write");
	CHECK(memcmp(abuf + 200, "remote-rd!", 10) == 0, "data of a suppressed RDMA read");

	/* SOLICITED_WAIT and BARRIER_FENCE are accepted: a read, then a fenced,
	 * solicited send, complete in order */
	memcpy(bbuf + 9000, "fenced-rd!", 10);
	fill(abuf + 300, 0xEE, 16);
	r[0] = seg(lc_b, bbuf + 32, 16);
	CHECK_RC(dat_ep_post_recv(B.ep, 1, r, ck(0x6101), 0), DAT_SUCCESS);
	s[0] = seg(lc_a, abuf + 300, 10);
	rem = rseg(rc_b, bbuf + 9000, 10);
	CHECK_RC(dat_ep_post_rdma_read(A.ep, 1, s, ck(0x6100), &rem, 0), DAT_SUCCESS);
	CHECK_RC(dat_ep_post_send(A.ep, 1, s, ck(0x6102),
				  DAT_COMPLETION_BARRIER_FENCE_FLAG | DAT_COMPLETION_SOLICITED_WAIT_FLAG),
		 DAT_SUCCESS);
	expect_dto(A.req, A.ep, 0x6100, DAT_DTO_SUCCESS, 10, "read before a fenced send");
	expect_dto(A.req, A.ep, 0x6102, DAT_DTO_SUCCESS, 10, "fenced solicited send");
	expect_dto(B.rcv, B.ep, 0x6101, DAT_DTO_SUCCESS, 10, "receive of a fenced send");
	/* the fence: the send carried what the read had brought */
	CHECK(memcmp(bbuf + 32, "fenced-rd!", 10) == 0, "fenced send sent the data its preceding read brought");

	disconnect_pair(&A, &B);
	free_eps();
}

/* ---- DAT_COMPLETION_UNSIGNALLED_FLAG on an EP configured for it ----------------------------- */

static void test_unsignalled(void)
{
	DAT_LMR_TRIPLET s, r;
	DAT_RMR_TRIPLET rem;
	DAT_RMR_HANDLE rmr;
	DAT_RMR_CONTEXT ctx = 0;

	new_eps(DAT_COMPLETION_UNSIGNALLED_FLAG, 64);
	if (!connect_pair(&A, &B)) {
		free_eps();
		return;
	}
	rmr = rmr_new(pz_a);
	fill(bbuf, 0xEE, 64);
	memcpy(abuf, "unsignal", 8);
	s = seg(lc_a, abuf, 8);
	r = seg(lc_b, bbuf, 16);
	CHECK_RC(dat_ep_post_recv(B.ep, 1, &r, ck(0x7001), 0), DAT_SUCCESS);
	CHECK_RC(dat_ep_post_send(A.ep, 1, &s, ck(0x7000), DAT_COMPLETION_UNSIGNALLED_FLAG), DAT_SUCCESS);
	rem = rseg(rc_b, bbuf + 32, 8);
	CHECK_RC(dat_ep_post_rdma_write(A.ep, 1, &s, ck(0x7002), &rem, DAT_COMPLETION_UNSIGNALLED_FLAG), DAT_SUCCESS);
	CHECK_RC(dat_ep_post_rdma_read(A.ep, 1, &s, ck(0x7003), &rem, DAT_COMPLETION_UNSIGNALLED_FLAG), DAT_SUCCESS);
	s = seg(lc_a, abuf + 512, 64);
	if (no_rmrs)
		skip_no_rmrs("unsignalled dat_rmr_bind");
	else
		CHECK_RC(dat_rmr_bind(rmr, &s, DAT_MEM_PRIV_REMOTE_READ_FLAG, A.ep, ck(0x7004),
				      DAT_COMPLETION_UNSIGNALLED_FLAG, &ctx),
			 DAT_SUCCESS);
	/* a signalled marker: the only event */
	marker_read(0x7005, "signalled marker");
	expect_empty(A.req, "unsignalled completions");
	expect_dto(B.rcv, B.ep, 0x7001, DAT_DTO_SUCCESS, 8, "receive of an unsignalled send");
	CHECK(memcmp(bbuf, "unsignal", 8) == 0 && memcmp(bbuf + 32, "unsignal", 8) == 0,
	      "unsignalled send and write data");
	disconnect_pair(&A, &B);
	free_eps();
	rmr_done(rmr);
}

/* ---- DAT_INSUFFICIENT_RESOURCES: a full request queue ----------------------------------------- */

static void test_resources(void)
{
	DAT_LMR_TRIPLET s = seg(lc_a, abuf, 8), r;
	DAT_RMR_TRIPLET rem = rseg(rc_b, bbuf, 8);

	/* A's request queue holds 2. B posts no receive, so A's two sends stay
	 * outstanding (a TCP target holds a send until a receive comes; an RDMA
	 * one answers RNR and the sender retries). iWARP has no RNR retry: a send
	 * that finds no receive is a TERMINATE at the target. */
	if (iwarp) {
		printf("SKIP full request queue held by a receiver not ready: iWARP has no RNR retry\n");
		return;
	}
	new_eps(0, 2);
	if (!connect_pair(&A, &B)) {
		free_eps();
		return;
	}
	CHECK_RC(dat_ep_post_send(A.ep, 1, &s, ck(0x8000), 0), DAT_SUCCESS);
	CHECK_RC(dat_ep_post_send(A.ep, 1, &s, ck(0x8001), 0), DAT_SUCCESS);
	CHECK_TYPE(dat_ep_post_send(A.ep, 1, &s, ck(0x8002), 0), DAT_INSUFFICIENT_RESOURCES);
	CHECK_TYPE(dat_ep_post_rdma_read(A.ep, 1, &s, ck(0x8003), &rem, 0), DAT_INSUFFICIENT_RESOURCES);
	CHECK_TYPE(dat_ep_post_rdma_write(A.ep, 1, &s, ck(0x8004), &rem, 0), DAT_INSUFFICIENT_RESOURCES);
	{
		DAT_RMR_HANDLE rmr;
		DAT_RMR_CONTEXT ctx = 0;
		DAT_LMR_TRIPLET t = seg(lc_a, abuf + 512, 64);
		rmr = rmr_new(pz_a);
		if (no_rmrs)
			skip_no_rmrs("dat_rmr_bind on a full request queue");
		else
			CHECK_TYPE(dat_rmr_bind(rmr, &t, DAT_MEM_PRIV_REMOTE_READ_FLAG, A.ep, ck(0x8006), 0,
						&ctx),
				   DAT_INSUFFICIENT_RESOURCES);
		rmr_done(rmr);
	}
	/* the receives come; both sends complete, nothing of the refused ones */
	for (int i = 0; i < 2; i++) {
		r = seg(lc_b, bbuf + 64 * i, 64);
		CHECK_RC(dat_ep_post_recv(B.ep, 1, &r, ck(0x8100 + i), 0), DAT_SUCCESS);
	}
	expect_dto(A.req, A.ep, 0x8000, DAT_DTO_SUCCESS, 8, "held send 1");
	expect_dto(A.req, A.ep, 0x8001, DAT_DTO_SUCCESS, 8, "held send 2");
	expect_dto(B.rcv, B.ep, 0x8100, DAT_DTO_SUCCESS, 8, "late receive 1");
	expect_dto(B.rcv, B.ep, 0x8101, DAT_DTO_SUCCESS, 8, "late receive 2");
	expect_empty(A.req, "refused requests");
	/* room again */
	CHECK_RC(dat_ep_post_rdma_read(A.ep, 1, &s, ck(0x8005), &rem, 0), DAT_SUCCESS);
	expect_dto(A.req, A.ep, 0x8005, DAT_DTO_SUCCESS, 8, "read after the queue drained");
	disconnect_pair(&A, &B);
	free_eps();
}

/* ---- DISCONNECTED: posts succeed and are flushed at once -------------------------------------- */

struct bind_call {
	DAT_RMR_HANDLE rmr;
	DAT_LMR_TRIPLET t;
	DAT_EP_HANDLE ep;
	uint64_t cookie;
	DAT_RETURN rc;
	DAT_RMR_CONTEXT ctx;
};

static void *bind_thread(void *arg)
{
	struct bind_call *b = arg;
	b->rc = dat_rmr_bind(b->rmr, &b->t, DAT_MEM_PRIV_REMOTE_READ_FLAG, b->ep, ck(b->cookie),
			     0, &b->ctx);
	return NULL;
}

static void test_disconnected(void)
{
	DAT_LMR_TRIPLET s = seg(lc_a, abuf, 8), r;
	DAT_RMR_TRIPLET rem = rseg(rc_b, bbuf, 8);
	DAT_RMR_HANDLE rmr;
	DAT_EVENT ev;

	new_eps(0, 64);
	rmr = rmr_new(pz_a);
	/* receives posted before the disconnect are flushed by it, once each */
	for (int i = 0; i < 3; i++) {
		r = seg(lc_b, bbuf + 64 * i, 64);
		CHECK_RC(dat_ep_post_recv(B.ep, 1, &r, ck(0x9000 + i), 0), DAT_SUCCESS);
	}
	if (!connect_pair(&A, &B) || !disconnect_pair(&A, &B)) {
		free_eps();
		rmr_done(rmr);
		return;
	}
	for (int i = 0; i < 3; i++)
		expect_dto(B.rcv, B.ep, 0x9000 + i, DAT_DTO_ERR_FLUSHED, -1,
			   "receive flushed by a disconnect");
	expect_empty(B.rcv, "each receive flushed once");
	CHECK(ep_state(A.ep) == DAT_EP_STATE_DISCONNECTED, "active EP state %u", ep_state(A.ep));
	CHECK(ep_state(B.ep) == DAT_EP_STATE_DISCONNECTED, "passive EP state %u", ep_state(B.ep));

	/* each post succeeds and its completion is already queued, flushed, on
	 * the right EVD, with the cookie */
	CHECK_RC(dat_ep_post_send(A.ep, 1, &s, ck(0x9100), 0), DAT_SUCCESS);
	expect_dto_now(A.req, A.ep, 0x9100, DAT_DTO_ERR_FLUSHED, "send on a DISCONNECTED EP");
	CHECK_RC(dat_ep_post_send(A.ep, 0, NULL, ck(0x9101), 0), DAT_SUCCESS);
	expect_dto_now(A.req, A.ep, 0x9101, DAT_DTO_ERR_FLUSHED, "zero-length send, DISCONNECTED");
	CHECK_RC(dat_ep_post_rdma_read(A.ep, 1, &s, ck(0x9102), &rem, 0), DAT_SUCCESS);
	expect_dto_now(A.req, A.ep, 0x9102, DAT_DTO_ERR_FLUSHED, "RDMA read, DISCONNECTED");
	CHECK_RC(dat_ep_post_rdma_write(A.ep, 1, &s, ck(0x9103), &rem, 0), DAT_SUCCESS);
	expect_dto_now(A.req, A.ep, 0x9103, DAT_DTO_ERR_FLUSHED, "RDMA write, DISCONNECTED");
	/* the error is reported even when success would be suppressed */
	CHECK_RC(dat_ep_post_send(A.ep, 1, &s, ck(0x9104), DAT_COMPLETION_SUPPRESS_FLAG), DAT_SUCCESS);
	expect_dto_now(A.req, A.ep, 0x9104, DAT_DTO_ERR_FLUSHED, "suppressed send, DISCONNECTED");
	CHECK_RC(dat_ep_post_rdma_read(A.ep, 1, &s, ck(0x9105), &rem, DAT_COMPLETION_SUPPRESS_FLAG), DAT_SUCCESS);
	expect_dto_now(A.req, A.ep, 0x9105, DAT_DTO_ERR_FLUSHED, "suppressed read, DISCONNECTED");
	/* a receive is flushed to the receive EVD, not the request EVD */
	r = seg(lc_a, abuf + 64, 64);
	CHECK_RC(dat_ep_post_recv(A.ep, 1, &r, ck(0x9106), 0), DAT_SUCCESS);
	expect_dto_now(A.rcv, A.ep, 0x9106, DAT_DTO_ERR_FLUSHED, "receive, DISCONNECTED");
	/* the passive side is DISCONNECTED too */
	r = seg(lc_b, bbuf, 8);
	CHECK_RC(dat_ep_post_send(B.ep, 1, &r, ck(0x9108), 0), DAT_SUCCESS);
	expect_dto_now(B.req, B.ep, 0x9108, DAT_DTO_ERR_FLUSHED, "send on the passive side");
	/* the synchronous checks still come first */
	r = seg(lc_a, abuf + BUF - 4, 8);
	CHECK_TYPE(dat_ep_post_send(A.ep, 1, &r, ck(0x9109), 0), DAT_INVALID_PARAMETER);
	r = seg(lc_o, obuf, 8);
	CHECK_TYPE(dat_ep_post_send(A.ep, 1, &r, ck(0x910a), 0), DAT_PROTECTION_VIOLATION);
	CHECK_TYPE(dat_ep_post_send(A.ep, 1, &s, ck(0x910b), DAT_COMPLETION_UNSIGNALLED_FLAG), DAT_INVALID_PARAMETER);
	expect_empty(A.req, "flushed once each, refused ones not at all");
	expect_empty(A.rcv, "receive EVD after the flushes");

	/* an RMR bind is flushed to the request EVD as an RMR bind completion.
	 * The call runs on a helper thread so that a provider that never
	 * returns from it fails this check instead of hanging the test. */
	if (no_rmrs) {
		skip_no_rmrs("dat_rmr_bind flushed on a DISCONNECTED EP");
	} else {
		struct bind_call bc = { rmr, seg(lc_a, abuf + 512, 64), A.ep, 0x9107, 0xffffffffu, 0 };
		pthread_t th;
		struct timespec until;
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += 5;
		CHECK(pthread_create(&th, NULL, bind_thread, &bc) == 0, "pthread_create");
		int joined = pthread_timedjoin_np(th, NULL, &until) == 0;
		CHECK(joined, "dat_rmr_bind on a DISCONNECTED EP did not return within 5 s (provider deadlock)");
		if (!joined) {
			/* the provider holds its locks for good: report and leave */
			check_no_sigpipe();
			check_summary("test_dat12_rules");
			_exit(1);
		}
		CHECK_RC(bc.rc, DAT_SUCCESS);
		DAT_RETURN rc = dat_evd_dequeue(A.req, &ev);
		CHECK(rc == DAT_SUCCESS, "RMR bind on a DISCONNECTED EP: no event queued at once (%#x)", (unsigned)rc);
		if (rc == DAT_SUCCESS)
			CHECK(ev.event_number == DAT_RMR_BIND_COMPLETION_EVENT &&
				      ev.event_data.rmr_completion_event_data.rmr_handle == rmr &&
				      ev.event_data.rmr_completion_event_data.user_cookie.as_64 == 0x9107 &&
				      ev.event_data.rmr_completion_event_data.status == DAT_DTO_ERR_FLUSHED,
			      "flushed bind: event %#x rmr %p cookie %#llx status %u", ev.event_number,
			      (void *)ev.event_data.rmr_completion_event_data.rmr_handle,
			      (unsigned long long)ev.event_data.rmr_completion_event_data.user_cookie.as_64,
			      ev.event_data.rmr_completion_event_data.status);
		expect_empty(A.req, "one flushed bind");
	}
	free_eps();
	rmr_done(rmr);
}

/* ---- dat_rmr_bind: completion, fencing, privileges, unbind ----------------------------------- */

static void test_rmr(void)
{
	if (no_rmrs) {
		skip_no_rmrs("dat_rmr_bind completion, fencing, privileges, unbind");
		return;
	}
	DAT_RMR_HANDLE rmr;
	DAT_RMR_CONTEXT ctx = 0, ctx2 = 0, ctx3 = 0;
	DAT_LMR_TRIPLET t, s, r;
	DAT_RMR_TRIPLET rem;
	DAT_RMR_PARAM param;

	new_eps(0, 64);
	if (!connect_pair(&A, &B)) {
		free_eps();
		return;
	}
	CHECK_RC(dat_rmr_create(pz_b, &rmr), DAT_SUCCESS);
	for (int i = 0; i < 256; i++)
		bbuf[1024 + i] = (char)i;

	/* B binds 256 bytes at bbuf+1024, remote read only, and at once sends
	 * the new context to A: the bind fences the send, so A may use it on
	 * arrival. The bind completion comes first on B's request EVD, with its
	 * cookie; the receive EVD sees nothing of it. */
	r = seg(lc_a, abuf, 16);
	CHECK_RC(dat_ep_post_recv(A.ep, 1, &r, ck(0xa001), 0), DAT_SUCCESS);
	t = seg(lc_b, bbuf + 1024, 256);
	CHECK_RC(dat_rmr_bind(rmr, &t, DAT_MEM_PRIV_REMOTE_READ_FLAG, B.ep, ck(0xa000), 0, &ctx),
		 DAT_SUCCESS);
	memcpy(bbuf + 4096, &ctx, sizeof(ctx));
	s = seg(lc_b, bbuf + 4096, sizeof(ctx));
	CHECK_RC(dat_ep_post_send(B.ep, 1, &s, ck(0xa002), 0), DAT_SUCCESS);
	expect_bind(B.req, rmr, 0xa000, DAT_RMR_BIND_SUCCESS, "RMR bind completion");
	expect_dto(B.req, B.ep, 0xa002, DAT_DTO_SUCCESS, sizeof(ctx), "send after the bind");
	expect_empty(B.rcv, "a bind reports only to the request EVD");
	if (expect_dto(A.rcv, A.ep, 0xa001, DAT_DTO_SUCCESS, sizeof(ctx), "context received")) {
		DAT_RMR_CONTEXT got;
		memcpy(&got, abuf, sizeof(got));
		CHECK(got == ctx, "received context %#x, sent %#x", got, ctx);
		fill(abuf + 512, 0xEE, 300);
		s = seg(lc_a, abuf + 512, 256);
		rem = rseg(got, bbuf + 1024, 256);
		CHECK_RC(dat_ep_post_rdma_read(A.ep, 1, &s, ck(0xa003), &rem, 0), DAT_SUCCESS);
		if (expect_dto(A.req, A.ep, 0xa003, DAT_DTO_SUCCESS, 256, "read through the RMR"))
			CHECK(memcmp(abuf + 512, bbuf + 1024, 256) == 0 && all_are(abuf + 768, 0xEE, 44),
			      "data read through the RMR");
	}
	CHECK_RC(dat_rmr_query(rmr, DAT_RMR_FIELD_ALL, &param), DAT_SUCCESS);
	CHECK(param.rmr_context == ctx && param.mem_priv == DAT_MEM_PRIV_REMOTE_READ_FLAG &&
		      param.lmr_triplet.virtual_address == (DAT_VADDR)(uintptr_t)(bbuf + 1024) &&
		      param.lmr_triplet.segment_length == 256,
	      "rmr_query after bind: context %#x priv %#x addr %#llx len %llu", param.rmr_context, param.mem_priv,
	      (unsigned long long)param.lmr_triplet.virtual_address,
	      (unsigned long long)param.lmr_triplet.segment_length);

	/* a suppressed bind: no event on success; a rebind gives a new context */
	t = seg(lc_b, bbuf + 2048, 128);
	CHECK_RC(dat_rmr_bind(rmr, &t, DAT_MEM_PRIV_REMOTE_READ_FLAG | DAT_MEM_PRIV_REMOTE_WRITE_FLAG,
			      B.ep, ck(0xa010), DAT_COMPLETION_SUPPRESS_FLAG, &ctx2),
		 DAT_SUCCESS);
	CHECK(ctx2 != ctx, "rebinding gave the same rmr_context %#x", ctx2);
	/* a marker: a zero-byte read from A would not order B's queue, so B reads itself from A */
	rem = rseg(rc_a, abuf, 0);
	CHECK_RC(dat_ep_post_rdma_read(B.ep, 0, NULL, ck(0xa011), &rem, 0), DAT_SUCCESS);
	expect_dto(B.req, B.ep, 0xa011, DAT_DTO_SUCCESS, 0, "marker after a suppressed bind");
	expect_empty(B.req, "suppressed bind");
	/* the new binding grants write */
	fill(bbuf + 2048, 0xEE, 256);
	memcpy(abuf, "rebound-w", 9);
	s = seg(lc_a, abuf, 9);
	rem = rseg(ctx2, bbuf + 2048 + 100, 9);
	CHECK_RC(dat_ep_post_rdma_write(A.ep, 1, &s, ck(0xa012), &rem, 0), DAT_SUCCESS);
	if (expect_dto(A.req, A.ep, 0xa012, DAT_DTO_SUCCESS, 9, "write to the rebound RMR"))
		CHECK(memcmp(bbuf + 2148, "rebound-w", 9) == 0 && all_are(bbuf + 2048, 0xEE, 100) &&
			      all_are(bbuf + 2157, 0xEE, 147),
		      "data written through the rebound RMR");

	/* unbind: a zero-length triplet; its completion carries the cookie */
	t = seg(lc_b, bbuf + 2048, 0);
	CHECK_RC(dat_rmr_bind(rmr, &t, DAT_MEM_PRIV_REMOTE_READ_FLAG, B.ep, ck(0xa020), 0, &ctx3),
		 DAT_SUCCESS);
	expect_bind(B.req, rmr, 0xa020, DAT_RMR_BIND_SUCCESS, "unbind completion");
	/* ... and the RMR can be bound again, remote read only */
	t = seg(lc_b, bbuf + 3072, 64);
	CHECK_RC(dat_rmr_bind(rmr, &t, DAT_MEM_PRIV_REMOTE_READ_FLAG, B.ep, ck(0xa030), 0, &ctx3),
		 DAT_SUCCESS);
	expect_bind(B.req, rmr, 0xa030, DAT_RMR_BIND_SUCCESS, "bind after unbind");
	/* a remote write to a read-only RMR fails at the initiator with
	 * DAT_DTO_ERR_REMOTE_ACCESS and leaves the memory alone (the connection
	 * breaks: test_remote_violation checks the rest) */
	fill(bbuf + 3072, 0x11, 64);
	rem = rseg(ctx3, bbuf + 3072, 9);
	CHECK_RC(dat_ep_post_rdma_write(A.ep, 1, &s, ck(0xa031), &rem, 0), DAT_SUCCESS);
	expect_dto(A.req, A.ep, 0xa031, DAT_DTO_ERR_REMOTE_ACCESS, -1, "write to a read-only RMR");
	CHECK(all_are(bbuf + 3072, 0x11, 64), "a refused remote write changed the target's memory");
	expect_conn_event(A.conn, A.ep, DAT_CONNECTION_EVENT_BROKEN, "initiator BROKEN after a refused write");
	expect_conn_event(B.conn, B.ep, DAT_CONNECTION_EVENT_BROKEN, "target BROKEN after a refused write");
	free_eps();
	CHECK_RC(dat_rmr_free(rmr), DAT_SUCCESS);
}

/* An RMR context no longer valid (after an unbind, or the previous one
 * after a rebind) fails a remote access: "Any RDMA DTO that uses the
 * previous value of rmr_context after the dat_rmr_bind() is completed fail". */
static void test_rmr_stale(int rebind)
{
	if (no_rmrs) {
		skip_no_rmrs(rebind ? "previous RMR context after a rebind" : "RMR context after an unbind");
		return;
	}
	DAT_RMR_HANDLE rmr;
	DAT_RMR_CONTEXT old = 0, now = 0;
	DAT_LMR_TRIPLET t, s;
	DAT_RMR_TRIPLET rem;
	const char *what = rebind ? "previous context after a rebind" : "context after an unbind";

	new_eps(0, 64);
	if (!connect_pair(&A, &B)) {
		free_eps();
		return;
	}
	CHECK_RC(dat_rmr_create(pz_b, &rmr), DAT_SUCCESS);
	t = seg(lc_b, bbuf + 1024, 256);
	CHECK_RC(dat_rmr_bind(rmr, &t, DAT_MEM_PRIV_REMOTE_READ_FLAG | DAT_MEM_PRIV_REMOTE_WRITE_FLAG,
			      B.ep, ck(0xb000), 0, &old),
		 DAT_SUCCESS);
	expect_bind(B.req, rmr, 0xb000, DAT_RMR_BIND_SUCCESS, "first bind");
	/* the context works */
	memcpy(abuf, "live", 4);
	s = seg(lc_a, abuf, 4);
	rem = rseg(old, bbuf + 1024, 4);
	CHECK_RC(dat_ep_post_rdma_write(A.ep, 1, &s, ck(0xb001), &rem, 0), DAT_SUCCESS);
	expect_dto(A.req, A.ep, 0xb001, DAT_DTO_SUCCESS, 4, "write through a live context");
	t = rebind ? seg(lc_b, bbuf + 1024, 256) : seg(lc_b, bbuf + 1024, 0);
	CHECK_RC(dat_rmr_bind(rmr, &t, DAT_MEM_PRIV_REMOTE_READ_FLAG | DAT_MEM_PRIV_REMOTE_WRITE_FLAG,
			      B.ep, ck(0xb002), 0, &now),
		 DAT_SUCCESS);
	expect_bind(B.req, rmr, 0xb002, DAT_RMR_BIND_SUCCESS, rebind ? "rebind" : "unbind");
	if (rebind)
		CHECK(now != old, "rebind kept the context %#x", old);
	fill(bbuf + 1024, 0x22, 256);
	memcpy(abuf, "dead", 4);
	CHECK_RC(dat_ep_post_rdma_write(A.ep, 1, &s, ck(0xb003), &rem, 0), DAT_SUCCESS);
	expect_dto(A.req, A.ep, 0xb003, stale_context_status(ia_a, what), -1, what);
	CHECK(all_are(bbuf + 1024, 0x22, 256), "write through a %s changed the target's memory", what);
	expect_conn_event(A.conn, A.ep, DAT_CONNECTION_EVENT_BROKEN, "initiator BROKEN (stale context)");
	expect_conn_event(B.conn, B.ep, DAT_CONNECTION_EVENT_BROKEN, "target BROKEN (stale context)");
	free_eps();
	CHECK_RC(dat_rmr_free(rmr), DAT_SUCCESS);
}

/* ---- dat_ep_post_rdma_read: the remote buffer's protection and privileges --------------------- */

/* The page's DAT_PROTECTION_VIOLATION ("Protection Zone mismatch between
 * ... the rmr_context and the remote Endpoint") and DAT_PRIVILEGES_VIOLATION
 * ("rmr_context does not have the remote read privileges") for the remote
 * side: the initiator cannot know them when it posts, so the post succeeds,
 * the target refuses the access, and the read completes with
 * DAT_DTO_ERR_REMOTE_ACCESS, the local buffer untouched, the connection
 * BROKEN on both sides (test_remote_violation checks the rest for 2.0). */
static void test_remote_read_violation(int other_pz)
{
	DAT_RMR_HANDLE rmr = DAT_HANDLE_NULL;
	DAT_RMR_CONTEXT ctx = 0;
	DAT_LMR_TRIPLET t, s;
	DAT_RMR_TRIPLET rem;
	const char *what = other_pz ? "read of memory in another PZ than the target EP's"
				    : "read through an RMR without remote read";
	if (iwarp) {
		printf("SKIP %s: siw flushes a read its target refused (its TERMINATE ends the connection), "
		       "no REMOTE_ACCESS\n",
		       what);
		return;
	}
	if (no_rmrs && !other_pz) {
		skip_no_rmrs(what);
		return;
	}

	new_eps(0, 64);
	if (!connect_pair(&A, &B)) {
		free_eps();
		return;
	}
	if (other_pz) {
		/* an LMR context of B's IA, with every privilege, of B's other PZ */
		memcpy(b2buf, "other-pz", 8);
		rem = rseg(rc_b2, b2buf, 8);
	} else {
		CHECK_RC(dat_rmr_create(pz_b, &rmr), DAT_SUCCESS);
		t = seg(lc_b, bbuf + 1024, 256);
		CHECK_RC(dat_rmr_bind(rmr, &t, DAT_MEM_PRIV_REMOTE_WRITE_FLAG, B.ep, ck(0xc000), 0, &ctx), DAT_SUCCESS);
		expect_bind(B.req, rmr, 0xc000, DAT_RMR_BIND_SUCCESS, "write-only bind");
		memcpy(bbuf + 1024, "write-only", 10);
		rem = rseg(ctx, bbuf + 1024, 8);
	}
	fill(abuf, 0x33, 64);
	s = seg(lc_a, abuf, 8);
	CHECK_RC(dat_ep_post_rdma_read(A.ep, 1, &s, ck(0xc001), &rem, 0), DAT_SUCCESS);
	expect_dto(A.req, A.ep, 0xc001, DAT_DTO_ERR_REMOTE_ACCESS, -1, what);
	CHECK(all_are(abuf, 0x33, 64), "%s: the refused read wrote into the local buffer", what);
	expect_conn_event(A.conn, A.ep, DAT_CONNECTION_EVENT_BROKEN, "initiator BROKEN (refused read)");
	expect_conn_event(B.conn, B.ep, DAT_CONNECTION_EVENT_BROKEN, "target BROKEN (refused read)");
	free_eps();
	if (rmr != DAT_HANDLE_NULL)
		CHECK_RC(dat_rmr_free(rmr), DAT_SUCCESS);
}

/* ---- the seed pages' synopses (seed12_synopsis.c) run --------------------------------------- */

/* The functions of seed12_synopsis.c, compiled from the pages' synopses
 * alone, called with live objects: each makes its page's call once as
 * given and once with every flag its page lists (suppression,
 * non-notification, fence; solicited wait for the send), on an EP
 * configured for non-notification completion. */
static void test_seed_synopsis(void)
{
	DAT_RMR_HANDLE rmr;
	DAT_RMR_CONTEXT ctx = 0;
	DAT_LMR_TRIPLET s, r, t;
	DAT_RMR_TRIPLET rem;

	/* a NULL EP: a code the page lists (DAT_INVALID_HANDLE) */
	s = seg(lc_a, abuf, 8);
	CHECK(seed_ep_post_send(DAT_HANDLE_NULL, 1, &s, ck(1), 0) == 1, "seed post_send on a NULL EP");
	CHECK(seed_ep_post_rdma_read(DAT_HANDLE_NULL, 1, &s, ck(1), NULL, 0) == 1, "seed post_rdma_read on a NULL EP");
	CHECK(seed_rmr_bind(DAT_HANDLE_NULL, &s, DAT_MEM_PRIV_REMOTE_READ_FLAG, DAT_HANDLE_NULL, ck(1), 0, &ctx) == 1,
	      "seed rmr_bind of a NULL RMR");

	new_eps(DAT_COMPLETION_UNSIGNALLED_FLAG, 64);
	if (!connect_pair(&A, &B)) {
		free_eps();
		return;
	}
	CHECK(seed_other_names(ep_state(A.ep), DAT_CONNECTION_EVENT_BROKEN, 3 * DAT_OPTIMAL_ALIGNMENT) == 1 + 2 + 4,
	      "seed_other_names: a CONNECTED EP is in a state the operations are valid in");

	/* send: 8 bytes, then a zero-length send with a NULL cookie and every flag */
	memcpy(abuf, "seedsend", 8);
	fill(bbuf, 0xEE, 64);
	r = seg(lc_b, bbuf, 16);
	CHECK_RC(dat_ep_post_recv(B.ep, 1, &r, ck(0xd001), 0), DAT_SUCCESS);
	r = seg(lc_b, bbuf + 32, 16);
	CHECK_RC(dat_ep_post_recv(B.ep, 1, &r, ck(0xd002), 0), DAT_SUCCESS);
	s = seg(lc_a, abuf, 8);
	CHECK(seed_ep_post_send(A.ep, 1, &s, ck(0xd000), 0) == 0, "seed_ep_post_send");
	expect_dto(A.req, A.ep, 0xd000, DAT_DTO_SUCCESS, 8, "seed send");
	expect_dto(B.rcv, B.ep, 0xd001, DAT_DTO_SUCCESS, 8, "receive of the seed send");
	expect_dto(B.rcv, B.ep, 0xd002, DAT_DTO_SUCCESS, 0, "receive of the seed zero-length send");
	CHECK(memcmp(bbuf, "seedsend", 8) == 0 && all_are(bbuf + 32, 0xEE, 16), "seed send data");

	/* RDMA read: 8 bytes of B's memory, twice (the second suppressed) */
	memcpy(bbuf + 512, "seedread", 8);
	fill(abuf + 512, 0xEE, 16);
	s = seg(lc_a, abuf + 512, 8);
	rem = rseg(rc_b, bbuf + 512, 8);
	CHECK(seed_ep_post_rdma_read(A.ep, 1, &s, ck(0xd010), &rem, 0) == 0, "seed_ep_post_rdma_read");
	expect_dto(A.req, A.ep, 0xd010, DAT_DTO_SUCCESS, 8, "seed RDMA read");
	CHECK(memcmp(abuf + 512, "seedread", 8) == 0 && all_are(abuf + 520, 0xEE, 8), "seed RDMA read data");

	/* bind: remote read, then rebound with no privilege (suppressed) */
	rmr = rmr_new(pz_a);
	t = seg(lc_a, abuf + 1024, 64);
	if (no_rmrs) {
		skip_no_rmrs("seed_rmr_bind");
	} else {
		CHECK(seed_rmr_bind(rmr, &t, DAT_MEM_PRIV_REMOTE_READ_FLAG, A.ep, ck(0xd020), 0, &ctx) == 0,
		      "seed_rmr_bind");
		expect_bind(A.req, rmr, 0xd020, DAT_RMR_BIND_SUCCESS, "seed RMR bind");
	}

	/* a signalled marker: nothing else completes on A's request EVD */
	marker_read(0xd030, "marker after the seed calls");
	expect_empty(A.req, "the seed calls' suppressed completions");
	disconnect_pair(&A, &B);
	free_eps();
	rmr_done(rmr);
}

int main(void)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	alarm(100); /* a hang fails the test rather than the run */
	catch_sigpipe();
	DAT_EVD_HANDLE async_a = DAT_HANDLE_NULL, async_b = DAT_HANDLE_NULL;
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async_a, &ia_a), DAT_SUCCESS);
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async_b, &ia_b), DAT_SUCCESS);
	if (check_failed)
		return check_summary("test_dat12_rules");
	CHECK_RC(dat_pz_create(ia_a, &pz_a), DAT_SUCCESS);
	CHECK_RC(dat_pz_create(ia_a, &pz_a2), DAT_SUCCESS);
	CHECK_RC(dat_pz_create(ia_b, &pz_b), DAT_SUCCESS);
	CHECK_RC(dat_pz_create(ia_b, &pz_b2), DAT_SUCCESS);
	lmr_a = lmr_make(ia_a, pz_a, abuf, BUF, DAT_MEM_PRIV_ALL_FLAG, &lc_a, &rc_a);
	lmr_o = lmr_make(ia_a, pz_a2, obuf, BUF, DAT_MEM_PRIV_ALL_FLAG, &lc_o, NULL);
	lmr_r = lmr_make(ia_a, pz_a, rbuf, BUF, DAT_MEM_PRIV_REMOTE_READ_FLAG | DAT_MEM_PRIV_REMOTE_WRITE_FLAG, &lc_r,
			 NULL);
	lmr_ro = lmr_make(ia_a, pz_a, robuf, BUF, DAT_MEM_PRIV_LOCAL_READ_FLAG, &lc_ro, NULL);
	lmr_b = lmr_make(ia_b, pz_b, bbuf, BUF, DAT_MEM_PRIV_ALL_FLAG, &lc_b, &rc_b);
	lmr_b2 = lmr_make(ia_b, pz_b2, b2buf, BUF, DAT_MEM_PRIV_ALL_FLAG, &lc_b2, &rc_b2);
	side_evds(&A, ia_a, pz_a);
	side_evds(&B, ia_b, pz_b);
	if (check_failed)
		return check_summary("test_dat12_rules");
	DAT_IA_ATTR attr = ia_attr_of(ia_a);
	no_rmrs = attr.max_rmrs == 0;
	iwarp = strstr(attr.adapter_name, "iWARP") != NULL;
	read_segments = (int)attr.max_iov_segments_per_rdma_read;

	test_states();
	test_local_checks();
	test_transfers();
	test_unsignalled();
	test_resources();
	test_rmr();
	test_rmr_stale(0);
	test_rmr_stale(1);
	test_remote_read_violation(0);
	test_remote_read_violation(1);
	test_seed_synopsis();
	test_disconnected(); /* last: see the bind at its end */

	side_free_evds(&A);
	side_free_evds(&B);
	CHECK_RC(dat_lmr_free(lmr_a), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_o), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_r), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_ro), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_b), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_b2), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz_a), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz_a2), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz_b), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz_b2), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia_a, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia_b, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	check_no_sigpipe();
	return check_summary("test_dat12_rules");
}
