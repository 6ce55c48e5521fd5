/* DAT 2.0's Common Service Point and dat_ep_common_connect, on the IA
 * $DAT_TEST_IA (default rs-tcp); two IAs in one process, every wait bounded.
 *
 * - dat_csp_create(ia, comm, address, evd, &csp) listens on the IA's own
 *   address and the address's port (port 0: a free port, which
 *   dat_csp_query then reports); the communicator must be AF_INET /
 *   SOCK_STREAM / protocol 0 or IPPROTO_TCP. dat_get_handle_type says CSP.
 * - dat_ep_common_connect(ep, address, ...) connects to that address and
 *   port; the request arrives on the CSP's EVD as
 *   DAT_CONNECTION_REQUEST_EVENT naming the CSP (sp_handle) and the port
 *   (conn_qual) with the requester's private data; accepted through the CR
 *   like a PSP's, after which a send goes through.
 * - Codes: NULL comm / address / out pointer = DAT_INVALID_PARAMETER on
 *   that argument; another communicator = DAT_COMM_NOT_SUPPORTED; an address
 *   not the IA's = DAT_INVALID_ADDRESS (UNREACHABLE), not IPv4 =
 *   DAT_INVALID_ADDRESS; an EVD without DAT_EVD_CR_FLAG =
 *   DAT_INVALID_HANDLE_EVD_CR; a port in use = DAT_CONN_QUAL_IN_USE; NULL,
 *   wrong-type and freed CSP handles = DAT_INVALID_HANDLE_CSP;
 *   common_connect to port 0 = DAT_INVALID_ADDRESS (MALFORMED).
 * - dat_csp_free with a request pending: the free succeeds, the delivered CR
 *   stays valid and can still be accepted; a later request to the address is
 *   refused (DAT_CONNECTION_EVENT_NON_PEER_REJECTED). */
#include <dat2/udat.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "check.h"
#include "dto_pair.h"

#define INVALID(sub) ERRCODE(DAT_INVALID_HANDLE, sub)
#define BADARG(n) ERRCODE(DAT_INVALID_PARAMETER, DAT_INVALID_ARG##n)

static struct side A, B;
static char abuf[4096], bbuf[4096];

static DAT_COMM tcp_comm(void)
{
	DAT_COMM c;
	c.domain = AF_INET;
	c.type = SOCK_STREAM;
	c.protocol = 0;
	return c;
}

/* The IPv4 address of `ia` with `port`. */
static struct sockaddr_in addr_port(DAT_IA_HANDLE ia, uint16_t port)
{
	struct sockaddr_in sin;
	memcpy(&sin, ia_address(ia), sizeof(sin));
	sin.sin_port = htons(port);
	return sin;
}

/* The port a CSP reports in dat_csp_query (0 if the query fails). */
static uint16_t csp_port(DAT_CSP_HANDLE csp)
{
	DAT_CSP_PARAM p;
	memset(&p, 0, sizeof(p));
	DAT_RETURN rc = dat_csp_query(csp, DAT_CSP_FIELD_ALL, &p);
	CHECK(rc == DAT_SUCCESS && p.address_ptr != NULL, "dat_csp_query = %#x", (unsigned)rc);
	if (rc != DAT_SUCCESS || p.address_ptr == NULL)
		return 0;
	return ntohs(((const struct sockaddr_in *)p.address_ptr)->sin_port);
}

/* Waits for a request on B's CR EVD; checks it names `csp` and `port`;
 * returns its CR (NULL if none came). */
static DAT_CR_HANDLE expect_request(DAT_CSP_HANDLE csp, uint16_t port, const char *what)
{
	DAT_EVENT ev;
	DAT_RETURN rc = wait_event(B.cr, &ev);
	CHECK(rc == DAT_SUCCESS && ev.event_number == DAT_CONNECTION_REQUEST_EVENT, "%s: wait = %#x, event %#x",
	      what, (unsigned)rc, ev.event_number);
	if (rc != DAT_SUCCESS || ev.event_number != DAT_CONNECTION_REQUEST_EVENT)
		return DAT_HANDLE_NULL;
	const DAT_CR_ARRIVAL_EVENT_DATA *d = &ev.event_data.cr_arrival_event_data;
	CHECK(d->sp_handle.csp_handle == csp, "%s: sp_handle %p, want the CSP %p", what,
	      (void *)d->sp_handle.csp_handle, (void *)csp);
	CHECK(d->conn_qual == port, "%s: conn_qual %llu, want the port %u", what, (unsigned long long)d->conn_qual,
	      port);
	CHECK(d->local_ia_address_ptr != NULL && d->local_ia_address_ptr->sa_family == AF_INET &&
		      ((const struct sockaddr_in *)d->local_ia_address_ptr)->sin_addr.s_addr ==
			      ((const struct sockaddr_in *)ia_address(B.ia))->sin_addr.s_addr,
	      "%s: local address is B's", what);
	return d->cr_handle;
}

static void create_errors(DAT_CSP_HANDLE live)
{
	DAT_COMM comm = tcp_comm();
	struct sockaddr_in sin = addr_port(B.ia, 0);
	DAT_CSP_HANDLE h = DAT_HANDLE_NULL;

	CHECK_RC(dat_csp_create(B.ia, NULL, (DAT_IA_ADDRESS_PTR)&sin, B.cr, &h), BADARG(2));
	CHECK_RC(dat_csp_create(B.ia, &comm, NULL, B.cr, &h), BADARG(3));
	CHECK_RC(dat_csp_create(B.ia, &comm, (DAT_IA_ADDRESS_PTR)&sin, B.cr, NULL), BADARG(5));
	CHECK_RC(dat_csp_create(NULL, &comm, (DAT_IA_ADDRESS_PTR)&sin, B.cr, &h), INVALID(DAT_INVALID_HANDLE_IA));
	/* an EVD that takes no connection requests, and none at all */
	CHECK_RC(dat_csp_create(B.ia, &comm, (DAT_IA_ADDRESS_PTR)&sin, B.conn, &h), INVALID(DAT_INVALID_HANDLE_EVD_CR));
	CHECK_RC(dat_csp_create(B.ia, &comm, (DAT_IA_ADDRESS_PTR)&sin, DAT_HANDLE_NULL, &h),
		 INVALID(DAT_INVALID_HANDLE_EVD_CR));

	/* communicators other than reliable connected IPv4 streams */
	DAT_COMM other = comm;
	other.type = SOCK_DGRAM;
	CHECK_RC(dat_csp_create(B.ia, &other, (DAT_IA_ADDRESS_PTR)&sin, B.cr, &h), ERRCODE(DAT_COMM_NOT_SUPPORTED, 0));
	other = comm;
	other.domain = AF_INET6;
	CHECK_RC(dat_csp_create(B.ia, &other, (DAT_IA_ADDRESS_PTR)&sin, B.cr, &h), ERRCODE(DAT_COMM_NOT_SUPPORTED, 0));
	other = comm;
	other.protocol = IPPROTO_UDP;
	CHECK_RC(dat_csp_create(B.ia, &other, (DAT_IA_ADDRESS_PTR)&sin, B.cr, &h), ERRCODE(DAT_COMM_NOT_SUPPORTED, 0));
	/* IPPROTO_TCP spelled out is the same communicator */
	other = comm;
	other.protocol = IPPROTO_TCP;
	CHECK_RC(dat_csp_create(B.ia, &other, (DAT_IA_ADDRESS_PTR)&sin, B.cr, &h), DAT_SUCCESS);
	if (h != DAT_HANDLE_NULL) {
		DAT_CSP_PARAM p;
		memset(&p, 0, sizeof(p));
		CHECK_RC(dat_csp_query(h, DAT_CSP_FIELD_COMM, &p), DAT_SUCCESS);
		CHECK(p.comm != NULL && p.comm->protocol == IPPROTO_TCP, "query reports protocol IPPROTO_TCP");
		CHECK_RC(dat_csp_free(h), DAT_SUCCESS);
	}

	/* an address that is not the IA's: TEST-NET-2, nobody's */
	struct sockaddr_in foreign = sin;
	foreign.sin_addr.s_addr = htonl(0xc6336407u); /* 198.51.100.7 */
	CHECK_RC(dat_csp_create(B.ia, &comm, (DAT_IA_ADDRESS_PTR)&foreign, B.cr, &h),
		 ERRCODE(DAT_INVALID_ADDRESS, DAT_INVALID_ADDRESS_UNREACHABLE));
	/* not an IPv4 address */
	struct sockaddr_in6 six;
	memset(&six, 0, sizeof(six));
	six.sin6_family = AF_INET6;
	six.sin6_port = htons(4791);
	CHECK_TYPE(dat_csp_create(B.ia, &comm, (DAT_IA_ADDRESS_PTR)&six, B.cr, &h), DAT_INVALID_ADDRESS);

	/* the port of a live CSP is taken, for a CSP and for a PSP */
	struct sockaddr_in taken = addr_port(B.ia, csp_port(live));
	CHECK_RC(dat_csp_create(B.ia, &comm, (DAT_IA_ADDRESS_PTR)&taken, B.cr, &h), ERRCODE(DAT_CONN_QUAL_IN_USE, 0));
	DAT_PSP_HANDLE psp = DAT_HANDLE_NULL;
	CHECK_TYPE(dat_psp_create(B.ia, csp_port(live), B.cr, DAT_PSP_CONSUMER_FLAG, &psp), DAT_CONN_QUAL_IN_USE);
	/* and another IA cannot listen on B's address */
	struct sockaddr_in at_b = addr_port(B.ia, 0);
	if (memcmp(&((struct sockaddr_in *)ia_address(A.ia))->sin_addr, &at_b.sin_addr, sizeof(at_b.sin_addr)) != 0)
		CHECK_RC(dat_csp_create(A.ia, &comm, (DAT_IA_ADDRESS_PTR)&at_b, A.cr, &h),
			 ERRCODE(DAT_INVALID_ADDRESS, DAT_INVALID_ADDRESS_UNREACHABLE));
}

static void handle_errors(DAT_CSP_HANDLE live)
{
	DAT_CSP_PARAM p;
	DAT_HANDLE_TYPE t = 0;
	CHECK_RC(dat_get_handle_type(live, &t), DAT_SUCCESS);
	CHECK(t == DAT_HANDLE_TYPE_CSP, "dat_get_handle_type(csp) = %d, want DAT_HANDLE_TYPE_CSP (%d)", (int)t,
	      (int)DAT_HANDLE_TYPE_CSP);
	CHECK_RC(dat_csp_query(live, DAT_CSP_FIELD_ALL, NULL), BADARG(3));
	CHECK_RC(dat_csp_query(live, 0x10, &p), BADARG(2));
	CHECK_RC(dat_csp_query(NULL, DAT_CSP_FIELD_ALL, &p), INVALID(DAT_INVALID_HANDLE_CSP));
	CHECK_RC(dat_csp_free(NULL), INVALID(DAT_INVALID_HANDLE_CSP));
	/* handles of other types */
	CHECK_RC(dat_csp_query(B.ep, DAT_CSP_FIELD_ALL, &p), INVALID(DAT_INVALID_HANDLE_CSP));
	CHECK_RC(dat_csp_free(B.cr), INVALID(DAT_INVALID_HANDLE_CSP));
	DAT_CONN_QUAL q = 0;
	DAT_PSP_HANDLE psp = listen_any(&B, &q);
	CHECK_RC(dat_csp_free(psp), INVALID(DAT_INVALID_HANDLE_CSP));
	CHECK_RC(dat_psp_free(live), INVALID(DAT_INVALID_HANDLE_PSP));
	CHECK_RC(dat_psp_free(psp), DAT_SUCCESS);
}

static void common_connect_errors(uint16_t port)
{
	struct sockaddr_in sin = addr_port(B.ia, port);
	struct sockaddr_in zero = addr_port(B.ia, 0);
	CHECK_RC(dat_ep_common_connect(A.ep, NULL, WAIT_US, 0, NULL), BADARG(2));
	CHECK_RC(dat_ep_common_connect(A.ep, (DAT_IA_ADDRESS_PTR)&zero, WAIT_US, 0, NULL),
		 ERRCODE(DAT_INVALID_ADDRESS, DAT_INVALID_ADDRESS_MALFORMED));
	CHECK_RC(dat_ep_common_connect(A.ep, (DAT_IA_ADDRESS_PTR)&sin, WAIT_US, -1, NULL), BADARG(4));
	CHECK_RC(dat_ep_common_connect(A.ep, (DAT_IA_ADDRESS_PTR)&sin, WAIT_US, 4, NULL), BADARG(5));
	CHECK_RC(dat_ep_common_connect(NULL, (DAT_IA_ADDRESS_PTR)&sin, WAIT_US, 0, NULL),
		 INVALID(DAT_INVALID_HANDLE_EP));
	CHECK_RC(dat_ep_common_connect(B.cr, (DAT_IA_ADDRESS_PTR)&sin, WAIT_US, 0, NULL),
		 INVALID(DAT_INVALID_HANDLE_EP));
	CHECK(ep_state(A.ep) == DAT_EP_STATE_UNCONNECTED, "refused calls leave the EP UNCONNECTED");
}

/* One send A -> B over the connection. */
static void exchange(DAT_LMR_CONTEXT la, DAT_LMR_CONTEXT lb)
{
	memset(bbuf, 0, sizeof(bbuf));
	memcpy(abuf, "through the CSP", 16);
	DAT_LMR_TRIPLET r = seg(lb, bbuf, 64), s = seg(la, abuf, 16);
	CHECK_RC(dat_ep_post_recv(B.ep, 1, &r, ck(0xc1), DAT_COMPLETION_DEFAULT_FLAG), DAT_SUCCESS);
	CHECK_RC(dat_ep_post_send(A.ep, 1, &s, ck(0xc2), DAT_COMPLETION_DEFAULT_FLAG), DAT_SUCCESS);
	expect_dto(A.req, A.ep, 0xc2, DAT_DTO_SUCCESS, 16, DAT_DTO_SEND, "send through the CSP connection");
	expect_dto(B.rcv, B.ep, 0xc1, DAT_DTO_SUCCESS, 16, DAT_DTO_RECEIVE, "receive through the CSP connection");
	CHECK(memcmp(bbuf, "through the CSP", 16) == 0, "the bytes arrived");
}

static void reset_both(void)
{
	CHECK_RC(dat_ep_reset(A.ep), DAT_SUCCESS);
	CHECK_RC(dat_ep_reset(B.ep), DAT_SUCCESS);
	drain(A.conn);
	drain(B.conn);
	drain(A.req);
	drain(A.rcv);
	drain(B.req);
	drain(B.rcv);
}

int main(void)
{
	DAT_EVD_HANDLE async_a = DAT_HANDLE_NULL, async_b = DAT_HANDLE_NULL;
	DAT_IA_HANDLE ia_a, ia_b;
	DAT_PZ_HANDLE pz_a, pz_b;

	setvbuf(stdout, NULL, _IONBF, 0);
	alarm(100);
	catch_sigpipe();
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async_a, &ia_a), DAT_SUCCESS);
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async_b, &ia_b), DAT_SUCCESS);
	if (check_failed)
		return check_summary("test_csp");
	CHECK_RC(dat_pz_create(ia_a, &pz_a), DAT_SUCCESS);
	CHECK_RC(dat_pz_create(ia_b, &pz_b), DAT_SUCCESS);
	side_evds(&A, ia_a, pz_a);
	side_evds(&B, ia_b, pz_b);
	DAT_EP_ATTR attr = ep_attr(0, 0, 16);
	side_ep(&A, &attr);
	side_ep(&B, &attr);
	DAT_LMR_CONTEXT la = 0, lb = 0;
	DAT_LMR_HANDLE lmr_a = lmr_make(ia_a, pz_a, abuf, sizeof(abuf), DAT_MEM_PRIV_ALL_FLAG, &la, NULL);
	DAT_LMR_HANDLE lmr_b = lmr_make(ia_b, pz_b, bbuf, sizeof(bbuf), DAT_MEM_PRIV_ALL_FLAG, &lb, NULL);
	if (check_failed)
		return check_summary("test_csp");

	/* a CSP on a free port of B's address */
	DAT_COMM comm = tcp_comm();
	struct sockaddr_in any = addr_port(ia_b, 0);
	DAT_CSP_HANDLE csp = DAT_HANDLE_NULL;
	CHECK_RC(dat_csp_create(ia_b, &comm, (DAT_IA_ADDRESS_PTR)&any, B.cr, &csp), DAT_SUCCESS);
	if (csp == DAT_HANDLE_NULL)
		return check_summary("test_csp");
	DAT_CSP_PARAM p;
	memset(&p, 0, sizeof(p));
	CHECK_RC(dat_csp_query(csp, DAT_CSP_FIELD_ALL, &p), DAT_SUCCESS);
	/* queries name the IA as the provider knows it (as dat_psp_query does) */
	DAT_IA_HANDLE provider_ia = DAT_HANDLE_NULL;
	CHECK_RC(dats_get_ia_handle(ia_b, &provider_ia), DAT_SUCCESS);
	CHECK(p.ia_handle == provider_ia, "query: ia_handle %p, want %p", (void *)p.ia_handle, (void *)provider_ia);
	CHECK(p.evd_handle == B.cr, "query: evd_handle %p, want %p", (void *)p.evd_handle, (void *)B.cr);
	CHECK(p.comm != NULL && p.comm->domain == AF_INET && p.comm->type == SOCK_STREAM && p.comm->protocol == 0,
	      "query: the communicator given");
	CHECK(p.address_ptr != NULL && p.address_ptr->sa_family == AF_INET &&
		      ((const struct sockaddr_in *)p.address_ptr)->sin_addr.s_addr == any.sin_addr.s_addr &&
		      ((const struct sockaddr_in *)p.address_ptr)->sin_port != 0,
	      "query: B's address with the picked port");
	uint16_t port = csp_port(csp);

	handle_errors(csp);
	create_errors(csp);
	common_connect_errors(port);

	/* common_connect to the CSP, accept, exchange a send */
	struct sockaddr_in to = addr_port(ia_b, port);
	char pd[8] = "csp-pd!";
	CHECK_RC(dat_ep_common_connect(A.ep, (DAT_IA_ADDRESS_PTR)&to, WAIT_US, sizeof(pd), pd), DAT_SUCCESS);
	DAT_CR_HANDLE cr = expect_request(csp, port, "request to the CSP");
	int connected = 0;
	if (cr != DAT_HANDLE_NULL) {
		DAT_CR_PARAM cp;
		memset(&cp, 0, sizeof(cp));
		CHECK_RC(dat_cr_query(cr, DAT_CR_FIELD_ALL, &cp), DAT_SUCCESS);
		CHECK(cp.private_data_size >= (DAT_COUNT)sizeof(pd) && cp.private_data != NULL &&
			      memcmp(cp.private_data, pd, sizeof(pd)) == 0,
		      "the request carries the requester's private data");
		CHECK_RC(dat_cr_accept(cr, B.ep, 0, NULL), DAT_SUCCESS);
		connected = expect_conn_event(B.conn, B.ep, DAT_CONNECTION_EVENT_ESTABLISHED, "passive ESTABLISHED") &&
			    expect_conn_event(A.conn, A.ep, DAT_CONNECTION_EVENT_ESTABLISHED, "active ESTABLISHED");
	}
	if (connected) {
		CHECK_RC(dat_ep_common_connect(A.ep, (DAT_IA_ADDRESS_PTR)&to, WAIT_US, 0, NULL),
			 ERRCODE(DAT_INVALID_STATE, DAT_INVALID_STATE_EP_CONNECTED));
		DAT_EP_PARAM ep_param;
		memset(&ep_param, 0, sizeof(ep_param));
		CHECK_RC(dat_ep_query(A.ep, DAT_EP_FIELD_ALL, &ep_param), DAT_SUCCESS);
		CHECK(ep_param.remote_port_qual == port, "the active EP's remote port %llu is the CSP's %u",
		      (unsigned long long)ep_param.remote_port_qual, port);
		exchange(la, lb);
		disconnect_pair(&A, &B);
	}
	reset_both();

	/* free while a request is pending: the CR stays valid and is accepted */
	CHECK_RC(dat_ep_common_connect(A.ep, (DAT_IA_ADDRESS_PTR)&to, WAIT_US, 0, NULL), DAT_SUCCESS);
	cr = expect_request(csp, port, "request pending at free");
	CHECK_RC(dat_csp_free(csp), DAT_SUCCESS);
	if (cr != DAT_HANDLE_NULL) {
		DAT_CR_PARAM cp;
		CHECK_RC(dat_cr_query(cr, DAT_CR_FIELD_ALL, &cp), DAT_SUCCESS);
		CHECK_RC(dat_cr_accept(cr, B.ep, 0, NULL), DAT_SUCCESS);
		if (expect_conn_event(B.conn, B.ep, DAT_CONNECTION_EVENT_ESTABLISHED, "passive ESTABLISHED after free") &&
		    expect_conn_event(A.conn, A.ep, DAT_CONNECTION_EVENT_ESTABLISHED, "active ESTABLISHED after free")) {
			exchange(la, lb);
			disconnect_pair(&A, &B);
		}
	}
	reset_both();
	/* the freed handle */
	CHECK_RC(dat_csp_free(csp), INVALID(DAT_INVALID_HANDLE_CSP));
	CHECK_RC(dat_csp_query(csp, DAT_CSP_FIELD_ALL, &p), INVALID(DAT_INVALID_HANDLE_CSP));
	DAT_HANDLE_TYPE t;
	CHECK_TYPE(dat_get_handle_type(csp, &t), DAT_INVALID_HANDLE);
	/* nobody listens there any more */
	CHECK_RC(dat_ep_common_connect(A.ep, (DAT_IA_ADDRESS_PTR)&to, WAIT_US, 0, NULL), DAT_SUCCESS);
	expect_conn_event(A.conn, A.ep, DAT_CONNECTION_EVENT_NON_PEER_REJECTED, "connect to a freed CSP");
	CHECK_RC(dat_ep_reset(A.ep), DAT_SUCCESS);

	/* a CSP on a port of our choosing: the one just freed; a PSP reaches it by conn_qual too */
	DAT_CSP_HANDLE csp2 = DAT_HANDLE_NULL;
	CHECK_RC(dat_csp_create(ia_b, &comm, (DAT_IA_ADDRESS_PTR)&to, B.cr, &csp2), DAT_SUCCESS);
	if (csp2 != DAT_HANDLE_NULL) {
		CHECK(csp_port(csp2) == port, "the CSP listens on the port given");
		CHECK_RC(dat_ep_connect(A.ep, ia_address(ia_b), port, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT,
					DAT_CONNECT_DEFAULT_FLAG),
			 DAT_SUCCESS);
		cr = expect_request(csp2, port, "dat_ep_connect to the CSP's port");
		if (cr != DAT_HANDLE_NULL)
			CHECK_RC(dat_cr_reject(cr, 0, NULL), DAT_SUCCESS);
		expect_conn_event(A.conn, A.ep, DAT_CONNECTION_EVENT_PEER_REJECTED, "rejected through the CSP's CR");
		CHECK_RC(dat_ep_reset(A.ep), DAT_SUCCESS);
		CHECK_RC(dat_csp_free(csp2), DAT_SUCCESS);
	}

	CHECK_RC(dat_lmr_free(lmr_a), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_b), DAT_SUCCESS);
	side_free_ep(&A);
	side_free_ep(&B);
	side_free_evds(&A);
	side_free_evds(&B);
	CHECK_RC(dat_pz_free(pz_a), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz_b), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia_a, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia_b, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	check_no_sigpipe();
	return check_summary("test_csp");
}
