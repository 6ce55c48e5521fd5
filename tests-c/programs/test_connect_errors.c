/* How a connection attempt that fails ends, on every backend: a conn_qual
 * nobody listens on gives DAT_CONNECTION_EVENT_NON_PEER_REJECTED; a request
 * the peer's application rejects gives DAT_CONNECTION_EVENT_PEER_REJECTED
 * (and the passive side's CR is gone); after either the EP is DISCONNECTED
 * and can be reset and connected again. Where the IA sits on a network with
 * no other host (the soft-RoCE guest's dummy interface), a peer address that
 * answers nothing ends with DAT_CONNECTION_EVENT_TIMED_OUT when the
 * connect's timeout passes. (Without a timeout it would end UNREACHABLE
 * once rdma_cm's request retries run out, about a minute later: too long
 * for this suite.)
 * A program started while a PSP listens inherits no listening socket.
 * (Over rs-tcp on loopback there is no address that answers nothing without
 * sending traffic off this machine, so that case runs in the guest.)
 * Two IAs in one process of the IA $DAT_TEST_IA (default rs-tcp). */
#include <dat2/udat.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "dto_pair.h"

static struct side A, B;

/* The EP ended its attempt: DISCONNECTED, and usable again after a reset. */
static void reusable(const char *what)
{
	CHECK(ep_state(A.ep) == DAT_EP_STATE_DISCONNECTED, "%s: EP state %u, want DISCONNECTED", what,
	      ep_state(A.ep));
	CHECK_RC(dat_ep_reset(A.ep), DAT_SUCCESS);
	CHECK(ep_state(A.ep) == DAT_EP_STATE_UNCONNECTED, "%s: EP state after reset %u", what, ep_state(A.ep));
}

static void no_listener(void)
{
	DAT_CONN_QUAL qual = 0;
	/* a conn_qual that was listened on and is free again */
	DAT_PSP_HANDLE psp = listen_any(&B, &qual);
	CHECK_RC(dat_psp_free(psp), DAT_SUCCESS);
	CHECK_RC(dat_ep_connect(A.ep, ia_address(B.ia), qual, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT,
				DAT_CONNECT_DEFAULT_FLAG),
		 DAT_SUCCESS);
	expect_conn_event(A.conn, A.ep, DAT_CONNECTION_EVENT_NON_PEER_REJECTED, "connect to no listener");
	reusable("no listener");
}

static void peer_rejects(void)
{
	DAT_CONN_QUAL qual = 0;
	DAT_PSP_HANDLE psp = listen_any(&B, &qual);
	char pd[8] = "hello!!";
	CHECK_RC(dat_ep_connect(A.ep, ia_address(B.ia), qual, WAIT_US, sizeof(pd), pd, DAT_QOS_BEST_EFFORT,
				DAT_CONNECT_DEFAULT_FLAG),
		 DAT_SUCCESS);
	DAT_EVENT ev;
	DAT_RETURN rc = wait_event(B.cr, &ev);
	CHECK(rc == DAT_SUCCESS && ev.event_number == DAT_CONNECTION_REQUEST_EVENT, "request: %#x event %#x",
	      (unsigned)rc, ev.event_number);
	if (rc == DAT_SUCCESS && ev.event_number == DAT_CONNECTION_REQUEST_EVENT) {
		DAT_CR_HANDLE cr = ev.event_data.cr_arrival_event_data.cr_handle;
		DAT_CR_PARAM cp;
		memset(&cp, 0, sizeof(cp));
		CHECK_RC(dat_cr_query(cr, DAT_CR_FIELD_ALL, &cp), DAT_SUCCESS);
		CHECK(cp.private_data_size >= (DAT_COUNT)sizeof(pd) && cp.private_data != NULL &&
			      memcmp(cp.private_data, pd, sizeof(pd)) == 0,
		      "the request carries the consumer's private data");
		CHECK_RC(dat_cr_reject(cr, 0, NULL), DAT_SUCCESS);
		CHECK_TYPE(dat_cr_reject(cr, 0, NULL), DAT_INVALID_HANDLE);
	}
	expect_conn_event(A.conn, A.ep, DAT_CONNECTION_EVENT_PEER_REJECTED, "connect rejected by the peer");
	CHECK_RC(dat_psp_free(psp), DAT_SUCCESS);
	reusable("peer rejected");
}

/* Whether this process holds a socket listening on TCP port `port`. */
static int holds_listener(int port)
{
	for (int fd = 0; fd < 4096; fd++) {
		int on = 0;
		socklen_t len = sizeof(on);
		struct sockaddr_in sin;
		socklen_t slen = sizeof(sin);
		if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &on, &len) == 0 && on &&
		    getsockname(fd, (struct sockaddr *)&sin, &slen) == 0 && sin.sin_family == AF_INET &&
		    ntohs(sin.sin_port) == port)
			return 1;
	}
	return 0;
}

/* A program that a DAT program starts (system(3), posix_spawn) must not
 * inherit a PSP's listening socket: one that outlived the program (which
 * died, or exited without freeing its PSPs) would keep the conn_qual
 * listening, and the program, started again, would have dat_psp_create
 * refused with DAT_CONN_QUAL_IN_USE. This program, run again as that child,
 * looks at the descriptors it got. */
static void psp_not_inherited(void)
{
	DAT_CONN_QUAL qual = 0;
	DAT_PSP_HANDLE psp = listen_any(&B, &qual);
	char port[16];
	snprintf(port, sizeof(port), "%u", (unsigned)qual);
	/* (Over rdma_cm, verbs, the listener is no socket of ours: nothing to
	 * inherit. Over TCP entries the child finds it unless it is
	 * close-on-exec.) */
	if (holds_listener((int)qual))
		CHECK(1, "the PSP's listener on %s is a socket of ours", port);
	pid_t child = fork();
	if (child == 0) {
		execl("/proc/self/exe", "test_connect_errors", "--holds-listener", port, (char *)NULL);
		_exit(127);
	}
	int status = -1;
	CHECK(child > 0 && waitpid(child, &status, 0) == child, "fork and wait");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "a child started while the PSP listens got its listener (status %#x)",
	      (unsigned)status);
	CHECK_RC(dat_psp_free(psp), DAT_SUCCESS);
}

/* An address on the IA's subnet where no host answers. */
static DAT_IA_ADDRESS_PTR silent_address(void)
{
	static struct sockaddr_in sin;
	memcpy(&sin, ia_address(A.ia), sizeof(sin));
	sin.sin_addr.s_addr = htonl((ntohl(sin.sin_addr.s_addr) & 0xffffff00u) | 99u);
	return (DAT_IA_ADDRESS_PTR)&sin;
}

static void nobody_there(void)
{
	/* the connect's own timeout passes while rdma_cm still waits for an answer */
	CHECK_RC(dat_ep_connect(A.ep, silent_address(), 4000, 300000, 0, NULL, DAT_QOS_BEST_EFFORT,
				DAT_CONNECT_DEFAULT_FLAG),
		 DAT_SUCCESS);
	expect_conn_event(A.conn, A.ep, DAT_CONNECTION_EVENT_TIMED_OUT, "connect timeout to a silent address");
	reusable("timed out");
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "--holds-listener") == 0)
		return holds_listener(atoi(argv[2]));
	DAT_EVD_HANDLE async_a = DAT_HANDLE_NULL, async_b = DAT_HANDLE_NULL;
	DAT_IA_HANDLE ia_a, ia_b;
	DAT_PZ_HANDLE pz_a, pz_b;

	setvbuf(stdout, NULL, _IONBF, 0);
	alarm(100); /* a hang fails the test rather than the run */
	catch_sigpipe();
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async_a, &ia_a), DAT_SUCCESS);
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async_b, &ia_b), DAT_SUCCESS);
	if (check_failed)
		return check_summary("test_connect_errors");
	CHECK_RC(dat_pz_create(ia_a, &pz_a), DAT_SUCCESS);
	CHECK_RC(dat_pz_create(ia_b, &pz_b), DAT_SUCCESS);
	side_evds(&A, ia_a, pz_a);
	side_evds(&B, ia_b, pz_b);
	DAT_EP_ATTR attr = ep_attr(0, 0, 16);
	side_ep(&A, &attr);
	side_ep(&B, &attr);
	if (check_failed)
		return check_summary("test_connect_errors");

	no_listener();
	peer_rejects();
	psp_not_inherited();
	if (ia_adapter_is(ia_a, "rxe"))
		nobody_there();
	/* after all that, a connection still works */
	if (connect_pair(&A, &B))
		disconnect_pair(&A, &B);

	side_free_ep(&A);
	side_free_ep(&B);
	side_free_evds(&A);
	side_free_evds(&B);
	CHECK_RC(dat_pz_free(pz_a), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz_b), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia_a, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia_b, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	check_no_sigpipe();
	return check_summary("test_connect_errors");
}
