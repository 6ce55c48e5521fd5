/* Unreliable datagram EPs (DAT_IB_SERVICE_TYPE_UD of <dat2/dat_ib_extensions.h>,
 * what Debian's `dtestx -u` uses) through our libdat2 and the IA $DAT_TEST_IA
 * (default rs-tcp), two IAs in one process, every wait with a timeout. The
 * rules are core/ep/ud.rs's:
 *
 * - the provider says DAT_IB_UD=TRUE and a DAT_IB_TRANSPORT_MTU (an IA
 *   without datagrams skips the rest);
 * - dat_ep_connect of a datagram EP resolves an address: the passive side
 *   sees DAT_IB_UD_CONNECTION_REQUEST_EVENT (DAT_IB_UD_CONNECT_REQUEST) with
 *   the requester's private data, dat_cr_accept with a datagram EP gives it
 *   DAT_IB_UD_CONNECTION_EVENT_ESTABLISHED (DAT_IB_UD_PASSIVE_REMOTE_AH), the
 *   active side DAT_IB_UD_CONNECTION_EVENT_ESTABLISHED (DAT_IB_UD_REMOTE_AH)
 *   with the accepter's private data, each with an address handle (non-NULL
 *   ah, QP number, the peer's IA address) and a context; several at once on
 *   one EP; a connection EP cannot accept a datagram request
 *   (DAT_INVALID_HANDLE), a rejected one is DAT_IB_UD_CONNECTION_REJECT_EVENT,
 *   nobody listening DAT_IB_UD_CONNECTION_ERROR_EVENT;
 * - datagrams both ways: receives complete as DAT_IB_DTO_EVENT
 *   (DAT_IB_UD_RECV, DAT_IB_DTO_RECV_UD) with the message after a 40-byte GRH
 *   area, sends as DAT_IB_DTO_EVENT (DAT_IB_UD_SEND, DAT_IB_DTO_SEND_UD);
 * - a datagram that finds no receive posted is dropped (and, on rs-tcp and
 *   the ofi entries, counted in DCNT_IA_DIAG_ERR_RQ_UDSDPRD), the next ones
 *   still arrive;
 * - one larger than its receive fails that receive
 *   (DAT_DTO_ERR_LOCAL_LENGTH) and stops the EP, as an InfiniBand UD QP goes
 *   to its error state: the rest flushed, DAT_CONNECTION_EVENT_BROKEN,
 *   DISCONNECTED; dat_ep_reset makes it usable again;
 * - a message of the MTU goes, one byte more is DAT_LENGTH_ERROR;
 * - no dat_ep_post_send, RDMA, atomics or write-with-immediate on a datagram
 *   EP, no datagram send on a connection EP (DAT_INVALID_PARAMETER);
 * - dat_ib_ud_ah_free and dat_ib_ud_cm_free release what the events handed
 *   out, once; a freed address handle sends nothing;
 * - dat_ep_disconnect flushes the receives (DISCONNECTED), dat_ep_reset
 *   makes the EP UNCONNECTED and usable again.
 */
#define _GNU_SOURCE
#include <dat2/udat.h>
#include <dat2/dat_ib_extensions.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "dto_pair.h"

#define GRH 40
#define BUF (256 * 1024)
static char abuf[BUF], bbuf[BUF] __attribute__((aligned(64)));
static DAT_IA_HANDLE ia_a, ia_b;
static DAT_PZ_HANDLE pz_a, pz_b;
static DAT_LMR_CONTEXT lc_a, lc_b;
static struct side A, B;
static int mtu;
/* The IA offers fetch-and-add (DAT_IB_FETCH_AND_ADD). */
static int atomics;

static DAT_IB_EXTENSION_EVENT_DATA *ext_of(DAT_EVENT *ev)
{
	return (DAT_IB_EXTENSION_EVENT_DATA *)&ev->event_extension_data[0];
}

static DAT_EP_ATTR ud_attr(void)
{
	DAT_EP_ATTR a = ep_attr(DAT_COMPLETION_DEFAULT_FLAG, DAT_COMPLETION_DEFAULT_FLAG, 64);
	a.service_type = DAT_IB_SERVICE_TYPE_UD;
	a.max_message_size = mtu;
	a.max_rdma_size = 0;
	a.max_rdma_read_in = 0;
	a.max_rdma_read_out = 0;
	a.max_recv_iov = 1;
	a.max_request_iov = 1;
	return a;
}

/* The IPv4 address of a DAT_IA_ADDRESS_PTR, or 0. */
static uint32_t ipv4(const struct sockaddr *sa)
{
	return sa->sa_family == AF_INET ? ((const struct sockaddr_in *)sa)->sin_addr.s_addr : 0;
}

static int capabilities(void)
{
	DAT_EVD_HANDLE async = DAT_HANDLE_NULL;
	DAT_IA_ATTR ia_attr;
	DAT_PROVIDER_ATTR pr;
	int ud = 0;
	CHECK_RC(dat_ia_query(ia_a, &async, DAT_IA_FIELD_ALL, &ia_attr, DAT_PROVIDER_FIELD_ALL, &pr), DAT_SUCCESS);
	for (int i = 0; i < pr.num_provider_specific_attr; i++) {
		const char *n = pr.provider_specific_attr[i].name, *v = pr.provider_specific_attr[i].value;
		if (!strcmp(n, DAT_IB_ATTR_UD))
			ud = !strcmp(v, "TRUE");
		if (!strcmp(n, "DAT_IB_TRANSPORT_MTU"))
			mtu = atoi(v);
		if (!strcmp(n, DAT_IB_ATTR_FETCH_AND_ADD))
			atomics = !strcmp(v, "TRUE");
	}
	CHECK(mtu >= 256, "DAT_IB_TRANSPORT_MTU = %d", mtu);
	return ud;
}

/* One datagram connection event on `evd`; fills `ev`, returns 1 if it is `number` for `ep`. */
static int ud_conn_event(DAT_EVD_HANDLE evd, DAT_EP_HANDLE ep, DAT_EVENT_NUMBER number, DAT_IB_EXT_TYPE type,
			 DAT_EVENT *ev, const char *what)
{
	DAT_RETURN rc = wait_event(evd, ev);
	CHECK(rc == DAT_SUCCESS, "%s: dat_evd_wait = %#x", what, (unsigned)rc);
	if (rc != DAT_SUCCESS)
		return 0;
	int ok = ev->event_number == number && ev->event_data.connect_event_data.ep_handle == ep &&
		 ext_of(ev)->type == type;
	CHECK(ok, "%s: event %#x ep %p type %u; want %#x %p %u", what, ev->event_number,
	      (void *)ev->event_data.connect_event_data.ep_handle, ext_of(ev)->type, number, (void *)ep, type);
	return ok;
}

/* The next CR of b, a datagram request carrying 4 bytes of private data:
 * `pdata`, or (pdata -1) any value, stored in *got. Returns its handle. */
static DAT_CR_HANDLE ud_request_any(struct side *b, DAT_PSP_HANDLE psp, DAT_CONN_QUAL qual, int pdata, int *got,
				    const char *what)
{
	DAT_EVENT ev;
	DAT_CR_PARAM p;
	DAT_RETURN rc = wait_event(b->cr, &ev);
	CHECK(rc == DAT_SUCCESS, "%s: CR wait = %#x", what, (unsigned)rc);
	if (rc != DAT_SUCCESS)
		return DAT_HANDLE_NULL;
	const DAT_CR_ARRIVAL_EVENT_DATA *d = &ev.event_data.cr_arrival_event_data;
	CHECK(ev.event_number == (DAT_EVENT_NUMBER)DAT_IB_UD_CONNECTION_REQUEST_EVENT &&
		      ext_of(&ev)->type == DAT_IB_UD_CONNECT_REQUEST && d->conn_qual == qual &&
		      d->sp_handle.psp_handle == psp,
	      "%s: CR event %#x type %u qual %llu sp %p", what, ev.event_number, ext_of(&ev)->type,
	      (unsigned long long)d->conn_qual, (void *)d->sp_handle.psp_handle);
	CHECK_RC(dat_cr_query(d->cr_handle, DAT_CR_FIELD_ALL, &p), DAT_SUCCESS);
	CHECK(p.private_data_size == 4 && p.private_data && (pdata == -1 || *(int *)p.private_data == pdata),
	      "%s: request private data size %d", what, (int)p.private_data_size);
	if (got && p.private_data_size == 4 && p.private_data)
		*got = *(int *)p.private_data;
	return d->cr_handle;
}

static DAT_CR_HANDLE ud_request(struct side *b, DAT_PSP_HANDLE psp, DAT_CONN_QUAL qual, int pdata, const char *what)
{
	return ud_request_any(b, psp, qual, pdata, NULL, what);
}

/* Resolves A's address at B and B's at A: returns the two address handles
 * (A's, to reach B; B's, to reach A) and checks both events in full. */
static int resolve(DAT_IB_ADDR_HANDLE *ah_a, DAT_IB_ADDR_HANDLE *ah_b)
{
	DAT_CONN_QUAL qual = 0;
	DAT_PSP_HANDLE psp = listen_any(&B, &qual);
	DAT_EVENT ev;
	int pa = 0x11223344, pb = 0x55667788, ok = 0;
	if (psp == DAT_HANDLE_NULL)
		return 0;
	uint32_t addr_a = ipv4(ia_address(ia_a)), addr_b = ipv4(ia_address(ia_b));
	CHECK_RC(dat_ep_connect(A.ep, ia_address(ia_b), qual, WAIT_US, 4, &pa, DAT_QOS_BEST_EFFORT,
				DAT_CONNECT_DEFAULT_FLAG),
		 DAT_SUCCESS);
	CHECK(ep_state(A.ep) == DAT_EP_STATE_UNCONNECTED, "a resolution leaves the EP's state: %d", ep_state(A.ep));
	DAT_CR_HANDLE cr = ud_request(&B, psp, qual, pa, "resolve");
	if (cr == DAT_HANDLE_NULL)
		goto out;
	CHECK_RC(dat_cr_accept(cr, B.ep, 4, &pb), DAT_SUCCESS);
	if (ud_conn_event(B.conn, B.ep, DAT_IB_UD_CONNECTION_EVENT_ESTABLISHED, DAT_IB_UD_PASSIVE_REMOTE_AH, &ev,
			  "passive ESTABLISHED")) {
		DAT_IB_EXTENSION_EVENT_DATA *x = ext_of(&ev);
		const DAT_CONNECTION_EVENT_DATA *c = &ev.event_data.connect_event_data;
		CHECK(x->remote_ah.ah != NULL && x->remote_ah.qpn != 0 && x->context.as_ptr != NULL,
		      "passive AH %p qpn %#x context %p", (void *)x->remote_ah.ah, x->remote_ah.qpn,
		      x->context.as_ptr);
		CHECK(ipv4((struct sockaddr *)&x->remote_ah.ia_addr) == addr_a, "passive AH's address");
		CHECK(c->private_data_size == 4 && c->private_data && *(int *)c->private_data == pa,
		      "passive private data (the requester's), size %d", (int)c->private_data_size);
		*ah_b = x->remote_ah;
		CHECK_RC(dat_ib_ud_cm_free(B.ep, x->context.as_ptr), DAT_SUCCESS);
		CHECK_TYPE(dat_ib_ud_cm_free(B.ep, x->context.as_ptr), DAT_INVALID_PARAMETER);
		ok++;
	}
	if (ud_conn_event(A.conn, A.ep, DAT_IB_UD_CONNECTION_EVENT_ESTABLISHED, DAT_IB_UD_REMOTE_AH, &ev,
			  "active ESTABLISHED")) {
		DAT_IB_EXTENSION_EVENT_DATA *x = ext_of(&ev);
		const DAT_CONNECTION_EVENT_DATA *c = &ev.event_data.connect_event_data;
		CHECK(x->remote_ah.ah != NULL && x->remote_ah.qpn != 0 && x->context.as_ptr != NULL,
		      "active AH %p qpn %#x context %p", (void *)x->remote_ah.ah, x->remote_ah.qpn, x->context.as_ptr);
		CHECK(ipv4((struct sockaddr *)&x->remote_ah.ia_addr) == addr_b, "active AH's address");
		CHECK(c->private_data_size == 4 && c->private_data && *(int *)c->private_data == pb,
		      "active private data (the accepter's), size %d", (int)c->private_data_size);
		*ah_a = x->remote_ah;
		CHECK_RC(dat_ib_ud_cm_free(A.ep, x->context.as_ptr), DAT_SUCCESS);
		ok++;
	}
	CHECK(ep_state(A.ep) == DAT_EP_STATE_CONNECTED && ep_state(B.ep) == DAT_EP_STATE_CONNECTED,
	      "resolved: states %d %d", ep_state(A.ep), ep_state(B.ep));
out:
	CHECK_RC(dat_psp_free(psp), DAT_SUCCESS);
	return ok == 2;
}

/* Sends `len` bytes from A's buffer at `off` to `ah`; checks the send's completion. */
static void send_ud(struct side *s, DAT_LMR_CONTEXT lc, char *buf, int len, DAT_IB_ADDR_HANDLE *ah, uint64_t cookie,
		    const char *what)
{
	DAT_EVENT ev;
	DAT_LMR_TRIPLET l = seg(lc, buf, len);
	DAT_RETURN rc = dat_ib_post_send_ud(s->ep, 1, &l, ah, ck(cookie), DAT_COMPLETION_DEFAULT_FLAG);
	CHECK(rc == DAT_SUCCESS, "%s: dat_ib_post_send_ud = %#x", what, (unsigned)rc);
	if (rc != DAT_SUCCESS)
		return;
	rc = wait_event(s->req, &ev);
	const DAT_DTO_COMPLETION_EVENT_DATA *d = &ev.event_data.dto_completion_event_data;
	CHECK(rc == DAT_SUCCESS && ev.event_number == (DAT_EVENT_NUMBER)DAT_IB_DTO_EVENT && d->ep_handle == s->ep &&
		      d->user_cookie.as_64 == cookie && d->status == DAT_DTO_SUCCESS &&
		      d->transfered_length == (DAT_SEG_LENGTH)len && d->operation == (DAT_DTOS)DAT_IB_DTO_SEND_UD &&
		      ext_of(&ev)->type == DAT_IB_UD_SEND,
	      "%s: send completion wait %#x event %#x cookie %#llx status %u len %u op %u type %u", what, (unsigned)rc,
	      ev.event_number, (unsigned long long)d->user_cookie.as_64, d->status, d->transfered_length,
	      d->operation, ext_of(&ev)->type);
}

/* Waits for a datagram receive of `s`: cookie, status and (on success) the
 * GRH area plus `len` message bytes equal to `want`. */
static void recv_ud(struct side *s, uint64_t cookie, DAT_DTO_COMPLETION_STATUS status, int len, const char *buf,
		    const char *want, const char *what)
{
	DAT_EVENT ev;
	DAT_RETURN rc = wait_event(s->rcv, &ev);
	const DAT_DTO_COMPLETION_EVENT_DATA *d = &ev.event_data.dto_completion_event_data;
	CHECK(rc == DAT_SUCCESS && ev.event_number == (DAT_EVENT_NUMBER)DAT_IB_DTO_EVENT && d->ep_handle == s->ep &&
		      d->user_cookie.as_64 == cookie && d->status == status,
	      "%s: receive wait %#x event %#x cookie %#llx status %u", what, (unsigned)rc, ev.event_number,
	      (unsigned long long)d->user_cookie.as_64, d->status);
	if (rc != DAT_SUCCESS || status != DAT_DTO_SUCCESS)
		return;
	CHECK(d->transfered_length == (DAT_SEG_LENGTH)(GRH + len) && d->operation == (DAT_DTOS)DAT_IB_DTO_RECV_UD &&
		      ext_of(&ev)->type == DAT_IB_UD_RECV,
	      "%s: receive len %u (want %d) op %u type %u", what, d->transfered_length, GRH + len, d->operation,
	      ext_of(&ev)->type);
	CHECK(memcmp(buf + GRH, want, len) == 0, "%s: message after the GRH area", what);
}

static void post_recv(struct side *s, DAT_LMR_CONTEXT lc, char *buf, int len, uint64_t cookie)
{
	DAT_LMR_TRIPLET r = seg(lc, buf, len);
	CHECK_RC(dat_ep_post_recv(s->ep, 1, &r, ck(cookie), DAT_COMPLETION_DEFAULT_FLAG), DAT_SUCCESS);
}

/* Whether the IA's datagrams are ours end to end (rs-tcp, an ofi entry: its
 * datagram QPs are buffers of ours), so drops are counted as they happen and
 * a receive too small fails as DAT_DTO_ERR_LOCAL_LENGTH. */
static int ud_ours(DAT_IA_HANDLE ia)
{
	return ia_is_tcp(ia) || ia_adapter_is(ia, "ofi ");
}

static DAT_UINT64 dropped(DAT_IA_HANDLE ia)
{
	DAT_UINT64 c[DCNT_IA_ALL_COUNTERS];
	memset(c, 0, sizeof(c));
	DAT_RETURN rc = dat_query_counters(ia, DCNT_IA_DIAG_ERR_RQ_UDSDPRD, c, 0);
	return rc == DAT_SUCCESS ? c[0] : (DAT_UINT64)-1;
}

/* Datagrams both ways; a drop; a receive too small; the MTU. */
static void datagrams(DAT_IB_ADDR_HANDLE *ah_a, DAT_IB_ADDR_HANDLE *ah_b)
{
	char *rb = bbuf + 65536, *ra = abuf + 65536;
	strcpy(abuf, "datagram from A");
	strcpy(bbuf, "B answers");
	post_recv(&B, lc_b, rb, 256, 0xb1);
	send_ud(&A, lc_a, abuf, 16, ah_a, 0xa1, "A to B");
	recv_ud(&B, 0xb1, DAT_DTO_SUCCESS, 16, rb, "datagram from A", "A to B");
	post_recv(&A, lc_a, ra, 256, 0xa2);
	send_ud(&B, lc_b, bbuf, 10, ah_b, 0xb2, "B to A");
	recv_ud(&A, 0xa2, DAT_DTO_SUCCESS, 10, ra, "B answers", "B to A");

	/* no receive posted at B: dropped (rs-tcp and ofi count it, which also says
	 * when it happened; elsewhere we give it a second); the next one arrives */
	DAT_UINT64 before = dropped(ia_b), after = before;
	strcpy(abuf, "lost");
	send_ud(&A, lc_a, abuf, 5, ah_a, 0xa3, "to nobody");
	if (ud_ours(ia_b)) {
		for (int i = 0; i < 500 && after == before; i++) {
			usleep(10000);
			after = dropped(ia_b);
		}
		CHECK(after == before + 1, "dropped datagrams: %llu, then %llu", (unsigned long long)before,
		      (unsigned long long)after);
	} else {
		sleep(1);
	}
	expect_empty(B.rcv, "a dropped datagram completes nothing");
	post_recv(&B, lc_b, rb, 256, 0xb4);
	strcpy(abuf, "found");
	send_ud(&A, lc_a, abuf, 6, ah_a, 0xa4, "after the drop");
	recv_ud(&B, 0xb4, DAT_DTO_SUCCESS, 6, rb, "found", "after the drop");

	/* larger than its receive: that receive fails and the EP stops (the rest
	 * flushed, BROKEN); reset, it takes datagrams again */
	post_recv(&B, lc_b, rb, GRH + 8, 0xb5);
	post_recv(&B, lc_b, rb + 1024, 256, 0xb6);
	memset(abuf, 'x', 100);
	send_ud(&A, lc_a, abuf, 100, ah_a, 0xa5, "too large for its receive");
	if (ud_ours(ia_b)) {
		recv_ud(&B, 0xb5, DAT_DTO_ERR_LOCAL_LENGTH, 0, NULL, NULL, "too large for its receive");
	} else {
		/* a NIC names the error its own way (soft-RoCE: a QP operation error) */
		DAT_EVENT ev;
		DAT_RETURN rc = wait_event(B.rcv, &ev);
		DAT_DTO_COMPLETION_STATUS st = ev.event_data.dto_completion_event_data.status;
		CHECK(rc == DAT_SUCCESS && ev.event_data.dto_completion_event_data.user_cookie.as_64 == 0xb5 &&
			      st != DAT_DTO_SUCCESS && st != DAT_DTO_ERR_FLUSHED,
		      "too large for its receive: wait %#x status %u", (unsigned)rc, st);
	}
	recv_ud(&B, 0xb6, DAT_DTO_ERR_FLUSHED, 0, NULL, NULL, "flushed after the failed receive");
	expect_conn_event(B.conn, B.ep, DAT_CONNECTION_EVENT_BROKEN, "a failed receive stops the EP");
	CHECK(ep_state(B.ep) == DAT_EP_STATE_DISCONNECTED, "stopped: state %d", ep_state(B.ep));
	CHECK_RC(dat_ep_reset(B.ep), DAT_SUCCESS);
	CHECK(ep_state(B.ep) == DAT_EP_STATE_UNCONNECTED, "reset: state %d", ep_state(B.ep));
	post_recv(&B, lc_b, rb + 1024, 256, 0xb6);
	strcpy(abuf, "fits");
	send_ud(&A, lc_a, abuf, 5, ah_a, 0xa6, "after the reset");
	recv_ud(&B, 0xb6, DAT_DTO_SUCCESS, 5, rb + 1024, "fits", "after the reset");

	/* the MTU goes, one byte more does not */
	if (mtu + GRH <= BUF - 65536) {
		for (int i = 0; i < mtu; i++)
			abuf[i] = (char)(i * 7);
		post_recv(&B, lc_b, rb, mtu + GRH, 0xb7);
		send_ud(&A, lc_a, abuf, mtu, ah_a, 0xa7, "a message of the MTU");
		recv_ud(&B, 0xb7, DAT_DTO_SUCCESS, mtu, rb, abuf, "a message of the MTU");
		DAT_LMR_TRIPLET l = seg(lc_a, abuf, mtu + 1);
		CHECK_TYPE(dat_ib_post_send_ud(A.ep, 1, &l, ah_a, ck(0xa8), DAT_COMPLETION_DEFAULT_FLAG),
			   DAT_LENGTH_ERROR);
	}
	expect_empty(A.req, "A's sends all reported");
	expect_empty(B.rcv, "B's receives all reported");
}

/* What a datagram EP refuses, and a connection EP refuses the datagram send. */
static void refused(DAT_IB_ADDR_HANDLE *ah_a)
{
	DAT_LMR_TRIPLET l = seg(lc_a, abuf, 8);
	DAT_RMR_TRIPLET r = rseg(0x100, bbuf, 8);
	CHECK_TYPE(dat_ep_post_send(A.ep, 1, &l, ck(1), 0), DAT_INVALID_PARAMETER);
	CHECK_TYPE(dat_ep_post_rdma_write(A.ep, 1, &l, ck(2), &r, 0), DAT_INVALID_PARAMETER);
	CHECK_TYPE(dat_ep_post_rdma_read(A.ep, 1, &l, ck(3), &r, 0), DAT_INVALID_PARAMETER);
	CHECK_TYPE(dat_ib_post_rdma_write_immed(A.ep, 1, &l, ck(4), &r, 5, 0), DAT_INVALID_PARAMETER);
	/* an IA without atomics refuses them first, whatever the EP
	 * (DAT_NOT_IMPLEMENTED: tcp;ofi_rxm's entry) */
	CHECK_TYPE(dat_ib_post_fetch_and_add(A.ep, 1, &l, ck(5), &r, 0),
		   atomics ? DAT_INVALID_PARAMETER : DAT_NOT_IMPLEMENTED);
	expect_empty(A.req, "refused requests complete nothing");

	struct side C = A;
	DAT_EP_ATTR rc = ep_attr(0, 0, 8);
	C.ep = DAT_HANDLE_NULL;
	CHECK_RC(dat_ep_create(ia_a, pz_a, A.rcv, A.req, A.conn, &rc, &C.ep), DAT_SUCCESS);
	CHECK_TYPE(dat_ib_post_send_ud(C.ep, 1, &l, ah_a, ck(6), 0), DAT_INVALID_PARAMETER);
	/* an address handle is its EP's */
	CHECK_TYPE(dat_ib_ud_ah_free(C.ep, ah_a), DAT_INVALID_PARAMETER);
	CHECK_RC(dat_ep_free(C.ep), DAT_SUCCESS);

	/* a datagram EP takes no SRQ */
	DAT_SRQ_HANDLE srq = DAT_HANDLE_NULL;
	DAT_SRQ_ATTR sa;
	memset(&sa, 0, sizeof(sa));
	sa.max_recv_dtos = 8;
	sa.max_recv_iov = 1;
	if (dat_srq_create(ia_a, pz_a, &sa, &srq) == DAT_SUCCESS) {
		DAT_EP_ATTR ua = ud_attr();
		DAT_EP_HANDLE ep = DAT_HANDLE_NULL;
		CHECK_TYPE(dat_ep_create_with_srq(ia_a, pz_a, A.rcv, A.req, A.conn, srq, &ua, &ep),
			   DAT_INVALID_PARAMETER);
		CHECK_RC(dat_srq_free(srq), DAT_SUCCESS);
	}
}

/* Several resolutions at once on one EP; a connection EP cannot accept a
 * datagram request; a reject; nobody listening. */
static void resolutions(void)
{
	DAT_CONN_QUAL qual = 0;
	DAT_PSP_HANDLE psp = listen_any(&B, &qual);
	DAT_EVENT ev;
	int p1 = 1, p2 = 2, none = 0;
	if (psp == DAT_HANDLE_NULL)
		return;
	CHECK_RC(dat_ep_connect(A.ep, ia_address(ia_b), qual, WAIT_US, 4, &p1, DAT_QOS_BEST_EFFORT, 0), DAT_SUCCESS);
	CHECK_RC(dat_ep_connect(A.ep, ia_address(ia_b), qual, WAIT_US, 4, &p2, DAT_QOS_BEST_EFFORT, 0), DAT_SUCCESS);
	/* two resolutions at once arrive in either order */
	int got_x = 0, got_y = 0;
	DAT_CR_HANDLE crx = ud_request_any(&B, psp, qual, -1, &got_x, "one of two");
	DAT_CR_HANDLE cry = ud_request_any(&B, psp, qual, -1, &got_y, "the other of two");
	CHECK(got_x + got_y == 3 && got_x * got_y == 2, "the two requests' private data: %d and %d", got_x, got_y);
	DAT_CR_HANDLE cr1 = got_x == 1 ? crx : cry, cr2 = got_x == 1 ? cry : crx;
	if (cr1 != DAT_HANDLE_NULL) {
		struct side C = B;
		DAT_EP_ATTR rc = ep_attr(0, 0, 8);
		CHECK_RC(dat_ep_create(ia_b, pz_b, B.rcv, B.req, B.conn, &rc, &C.ep), DAT_SUCCESS);
		CHECK_RC(dat_cr_accept(cr1, C.ep, 0, NULL), ERRCODE(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_EP));
		CHECK_RC(dat_ep_free(C.ep), DAT_SUCCESS);
		CHECK_RC(dat_cr_accept(cr1, B.ep, 0, NULL), DAT_SUCCESS);
		if (ud_conn_event(B.conn, B.ep, DAT_IB_UD_CONNECTION_EVENT_ESTABLISHED, DAT_IB_UD_PASSIVE_REMOTE_AH,
				  &ev, "first accepted"))
			CHECK_RC(dat_ib_ud_ah_free(B.ep, &ext_of(&ev)->remote_ah), DAT_SUCCESS);
		if (ud_conn_event(A.conn, A.ep, DAT_IB_UD_CONNECTION_EVENT_ESTABLISHED, DAT_IB_UD_REMOTE_AH, &ev,
				  "first resolved")) {
			CHECK_RC(dat_ib_ud_ah_free(A.ep, &ext_of(&ev)->remote_ah), DAT_SUCCESS);
			CHECK_TYPE(dat_ib_ud_ah_free(A.ep, &ext_of(&ev)->remote_ah), DAT_INVALID_PARAMETER);
			/* a freed address handle sends nothing */
			DAT_LMR_TRIPLET l = seg(lc_a, abuf, 8);
			CHECK_TYPE(dat_ib_post_send_ud(A.ep, 1, &l, &ext_of(&ev)->remote_ah, ck(9), 0),
				   DAT_INVALID_PARAMETER);
		}
	}
	if (cr2 != DAT_HANDLE_NULL) {
		int why = 0x5a5a;
		CHECK_RC(dat_cr_reject(cr2, 4, &why), DAT_SUCCESS);
		if (ud_conn_event(A.conn, A.ep, DAT_IB_UD_CONNECTION_REJECT_EVENT, DAT_IB_UD_CONNECT_REJECT, &ev,
				  "rejected")) {
			const DAT_CONNECTION_EVENT_DATA *c = &ev.event_data.connect_event_data;
			CHECK(c->private_data_size == 4 && *(int *)c->private_data == why,
			      "reject private data size %d", (int)c->private_data_size);
			CHECK(ext_of(&ev)->remote_ah.ah == NULL, "a reject hands out no address handle");
			CHECK_RC(dat_ib_ud_cm_free(A.ep, ext_of(&ev)->context.as_ptr), DAT_SUCCESS);
		}
	}
	CHECK_RC(dat_psp_free(psp), DAT_SUCCESS);
	/* nobody listens on the freed PSP's port now */
	CHECK_RC(dat_ep_connect(A.ep, ia_address(ia_b), qual, WAIT_US, 4, &none, DAT_QOS_BEST_EFFORT, 0),
		 DAT_SUCCESS);
	ud_conn_event(A.conn, A.ep, DAT_IB_UD_CONNECTION_ERROR_EVENT, DAT_IB_UD_CONNECT_ERROR, &ev, "nobody listening");
	CHECK(ep_state(A.ep) == DAT_EP_STATE_CONNECTED, "failed resolutions leave the EP's state: %d",
	      ep_state(A.ep));
}

/* Disconnect flushes the receives; reset makes the EP usable again. */
static void disconnect_reset(void)
{
	post_recv(&A, lc_a, abuf + 65536, 256, 0xd1);
	CHECK_RC(dat_ep_disconnect(A.ep, DAT_CLOSE_ABRUPT_FLAG), DAT_SUCCESS);
	expect_conn_event(A.conn, A.ep, DAT_CONNECTION_EVENT_DISCONNECTED, "datagram EP disconnected");
	CHECK(ep_state(A.ep) == DAT_EP_STATE_DISCONNECTED, "disconnected: state %d", ep_state(A.ep));
	DAT_EVENT ev;
	DAT_RETURN rc = wait_event(A.rcv, &ev);
	CHECK(rc == DAT_SUCCESS && ev.event_data.dto_completion_event_data.user_cookie.as_64 == 0xd1 &&
		      ev.event_data.dto_completion_event_data.status == DAT_DTO_ERR_FLUSHED,
	      "the posted receive is flushed: wait %#x status %u", (unsigned)rc,
	      ev.event_data.dto_completion_event_data.status);
	CHECK_RC(dat_ep_reset(A.ep), DAT_SUCCESS);
	CHECK(ep_state(A.ep) == DAT_EP_STATE_UNCONNECTED, "reset: state %d", ep_state(A.ep));
	DAT_IB_ADDR_HANDLE ah_a, ah_b;
	memset(&ah_a, 0, sizeof(ah_a));
	memset(&ah_b, 0, sizeof(ah_b));
	if (resolve(&ah_a, &ah_b)) {
		post_recv(&B, lc_b, bbuf + 65536, 256, 0xd2);
		strcpy(abuf, "again");
		send_ud(&A, lc_a, abuf, 6, &ah_a, 0xd3, "after reset");
		recv_ud(&B, 0xd2, DAT_DTO_SUCCESS, 6, bbuf + 65536, "again", "after reset");
	}
}

int main(void)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	alarm(100); /* a hang fails the test rather than the run */
	catch_sigpipe();
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &A.async, &ia_a), DAT_SUCCESS);
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &B.async, &ia_b), DAT_SUCCESS);
	if (check_failed)
		return check_summary("test_ud");
	if (!capabilities()) {
		printf("test_ud: %s has no datagram service (DAT_IB_UD); skipped\n", dat_test_ia());
		dat_ia_close(ia_a, DAT_CLOSE_ABRUPT_FLAG);
		dat_ia_close(ia_b, DAT_CLOSE_ABRUPT_FLAG);
		return check_summary("test_ud");
	}
	CHECK_RC(dat_pz_create(ia_a, &pz_a), DAT_SUCCESS);
	CHECK_RC(dat_pz_create(ia_b, &pz_b), DAT_SUCCESS);
	DAT_LMR_HANDLE lmr_a = lmr_make(ia_a, pz_a, abuf, BUF, DAT_MEM_PRIV_ALL_FLAG, &lc_a, NULL);
	DAT_LMR_HANDLE lmr_b = lmr_make(ia_b, pz_b, bbuf, BUF, DAT_MEM_PRIV_ALL_FLAG, &lc_b, NULL);
	side_evds(&A, ia_a, pz_a);
	side_evds(&B, ia_b, pz_b);
	DAT_EP_ATTR ua = ud_attr();
	side_ep(&A, &ua);
	side_ep(&B, &ua);
	CHECK(ep_state(A.ep) == DAT_EP_STATE_UNCONNECTED, "a new datagram EP: state %d", ep_state(A.ep));

	DAT_IB_ADDR_HANDLE ah_a, ah_b;
	memset(&ah_a, 0, sizeof(ah_a));
	memset(&ah_b, 0, sizeof(ah_b));
	if (resolve(&ah_a, &ah_b)) {
		datagrams(&ah_a, &ah_b);
		refused(&ah_a);
		resolutions();
		CHECK_RC(dat_ib_ud_ah_free(A.ep, &ah_a), DAT_SUCCESS);
		CHECK_RC(dat_ib_ud_ah_free(B.ep, &ah_b), DAT_SUCCESS);
		disconnect_reset();
	}

	/* what was not freed goes with the EPs */
	side_free_ep(&A);
	side_free_ep(&B);
	side_free_evds(&A);
	side_free_evds(&B);
	CHECK_RC(dat_lmr_free(lmr_a), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_b), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz_a), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz_b), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia_a, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia_b, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	check_no_sigpipe();
	return check_summary("test_ud");
}
