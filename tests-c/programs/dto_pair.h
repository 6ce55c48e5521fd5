/* Helpers for the data-transfer tests (test_dto_rules, test_remote_violation,
 * test_peer_killed): one side of a connection (IA, PZ, EVDs, EP), connecting
 * two sides through a PSP on a port from dat_psp_create_any, and waiting for
 * events, always with a finite timeout. Include after check.h. */
#ifndef TESTS_C_DTO_PAIR_H
#define TESTS_C_DTO_PAIR_H
#include <dat2/udat.h>
#include <arpa/inet.h>
#include <signal.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>

#define UNUSED __attribute__((unused))

/* Every wait is bounded: 5 s is far more than any step takes on one host
 * (also on soft-RoCE under emulation). */
#define WAIT_US 5000000u

/* The seed pages give return codes as types; a subtype is the provider's
 * choice, so these checks compare the class and the type exactly. */
#define CHECK_TYPE(expr, type)                                                 \
	do {                                                                   \
		DAT_RETURN check_t_ = (expr);                                  \
		CHECK(DAT_GET_TYPE(check_t_) == (DAT_RETURN)(type) &&          \
			      (check_t_ & DAT_CLASS_ERROR),                    \
		      "%s = %#x, want type %#x", #expr, (unsigned)check_t_,    \
		      (unsigned)(type));                                       \
	} while (0)

struct side {
	DAT_IA_HANDLE ia;
	DAT_EVD_HANDLE async;
	DAT_PZ_HANDLE pz;
	DAT_EVD_HANDLE req, rcv, conn, cr;
	DAT_EP_HANDLE ep;
};

static UNUSED DAT_DTO_COOKIE ck(uint64_t v)
{
	DAT_DTO_COOKIE c;
	c.as_64 = v;
	return c;
}

static UNUSED DAT_LMR_TRIPLET seg(DAT_LMR_CONTEXT ctx, const void *p, DAT_SEG_LENGTH len)
{
	DAT_LMR_TRIPLET t;
	t.lmr_context = ctx;
	t.virtual_address = (DAT_VADDR)(uintptr_t)p;
	t.segment_length = len;
	return t;
}

static UNUSED DAT_RMR_TRIPLET rseg(DAT_RMR_CONTEXT ctx, const void *p, DAT_SEG_LENGTH len)
{
	DAT_RMR_TRIPLET t;
	t.rmr_context = ctx;
	t.virtual_address = (DAT_VADDR)(uintptr_t)p;
	t.segment_length = len;
	return t;
}

/* EP attributes with every count set (zero counts are not defaulted by
 * every provider). */
static UNUSED DAT_EP_ATTR ep_attr(DAT_COMPLETION_FLAGS request_flags, DAT_COMPLETION_FLAGS recv_flags,
				  DAT_COUNT max_request_dtos)
{
	DAT_EP_ATTR a;
	memset(&a, 0, sizeof(a));
	a.service_type = DAT_SERVICE_TYPE_RC;
	a.max_message_size = 4 << 20;
	a.max_rdma_size = 4 << 20;
	a.qos = DAT_QOS_BEST_EFFORT;
	a.recv_completion_flags = recv_flags;
	a.request_completion_flags = request_flags;
	a.max_recv_dtos = 128;
	a.max_request_dtos = max_request_dtos;
	a.max_recv_iov = 4;
	a.max_request_iov = 4;
	a.max_rdma_read_in = 8;
	a.max_rdma_read_out = 8;
	a.max_rdma_read_iov = 4;
	a.max_rdma_write_iov = 4;
	return a;
}

/* The EVDs of a side: request EVD (DTO and RMR bind completions), receive
 * EVD, connection EVD, CR EVD. */
static UNUSED void side_evds(struct side *s, DAT_IA_HANDLE ia, DAT_PZ_HANDLE pz)
{
	s->ia = ia;
	s->pz = pz;
	s->ep = DAT_HANDLE_NULL;
	CHECK_RC(dat_evd_create(ia, 512, DAT_HANDLE_NULL, DAT_EVD_DTO_FLAG | DAT_EVD_RMR_BIND_FLAG, &s->req),
		 DAT_SUCCESS);
	CHECK_RC(dat_evd_create(ia, 512, DAT_HANDLE_NULL, DAT_EVD_DTO_FLAG, &s->rcv), DAT_SUCCESS);
	CHECK_RC(dat_evd_create(ia, 16, DAT_HANDLE_NULL, DAT_EVD_CONNECTION_FLAG, &s->conn), DAT_SUCCESS);
	CHECK_RC(dat_evd_create(ia, 16, DAT_HANDLE_NULL, DAT_EVD_CR_FLAG, &s->cr), DAT_SUCCESS);
}

static UNUSED void side_ep(struct side *s, const DAT_EP_ATTR *attr)
{
	CHECK_RC(dat_ep_create(s->ia, s->pz, s->rcv, s->req, s->conn, attr, &s->ep), DAT_SUCCESS);
}

/* Waits for one event; returns the DAT_RETURN of dat_evd_wait. */
static UNUSED DAT_RETURN wait_event(DAT_EVD_HANDLE evd, DAT_EVENT *ev)
{
	DAT_COUNT nmore = 0;
	memset(ev, 0, sizeof(*ev));
	return dat_evd_wait(evd, WAIT_US, 1, ev, &nmore);
}

/* Waits for the connection event `number` on `evd`; returns 1 if it came. */
static UNUSED int expect_conn_event(DAT_EVD_HANDLE evd, DAT_EP_HANDLE ep, DAT_EVENT_NUMBER number, const char *what)
{
	DAT_EVENT ev;
	DAT_RETURN rc = wait_event(evd, &ev);
	CHECK(rc == DAT_SUCCESS, "%s: dat_evd_wait = %#x", what, (unsigned)rc);
	if (rc != DAT_SUCCESS)
		return 0;
	CHECK(ev.event_number == number, "%s: event %#x, want %#x", what, ev.event_number, number);
	CHECK(ev.event_data.connect_event_data.ep_handle == ep, "%s: event for EP %p, want %p", what,
	      (void *)ev.event_data.connect_event_data.ep_handle, (void *)ep);
	return ev.event_number == number;
}

/* Waits for the end of `ep`'s connection on `evd`: BROKEN, or DISCONNECTED where the
 * transport ends a failed connection as an orderly one (iWARP's TERMINATE; the peer of a
 * side whose device went). Returns 1 if it came. */
static UNUSED int expect_conn_end(DAT_EVD_HANDLE evd, DAT_EP_HANDLE ep, const char *what)
{
	DAT_EVENT ev;
	DAT_RETURN rc = wait_event(evd, &ev);
	int ok = rc == DAT_SUCCESS && ev.event_data.connect_event_data.ep_handle == ep &&
		 (ev.event_number == DAT_CONNECTION_EVENT_BROKEN || ev.event_number == DAT_CONNECTION_EVENT_DISCONNECTED);
	CHECK(ok, "%s: %#x, event %#x (want BROKEN or DISCONNECTED)", what, (unsigned)rc, ev.event_number);
	return ok;
}

/* Waits for a DTO completion and checks every field. A `len` of -1 skips the
 * length. Returns 1 if every field matched. */
static UNUSED int expect_dto(DAT_EVD_HANDLE evd, DAT_EP_HANDLE ep, uint64_t cookie, DAT_DTO_COMPLETION_STATUS status,
			     long len, DAT_DTOS op, const char *what)
{
	DAT_EVENT ev;
	DAT_RETURN rc = wait_event(evd, &ev);
	CHECK(rc == DAT_SUCCESS, "%s: dat_evd_wait = %#x", what, (unsigned)rc);
	if (rc != DAT_SUCCESS)
		return 0;
	const DAT_DTO_COMPLETION_EVENT_DATA *d = &ev.event_data.dto_completion_event_data;
	int ok = ev.event_number == DAT_DTO_COMPLETION_EVENT && d->ep_handle == ep && d->user_cookie.as_64 == cookie &&
		 d->status == status && (len < 0 || d->transfered_length == (DAT_SEG_LENGTH)len) && d->operation == op;
	CHECK(ok,
	      "%s: event %#x ep %p cookie %#llx status %u len %u op %u; want event %#x ep %p cookie %#llx status %u "
	      "len %ld op %u",
	      what, ev.event_number, (void *)d->ep_handle, (unsigned long long)d->user_cookie.as_64, d->status,
	      d->transfered_length, d->operation, DAT_DTO_COMPLETION_EVENT, (void *)ep, (unsigned long long)cookie,
	      status, len, op);
	return ok;
}

/* Like expect_dto, but the event must already be queued: dequeued, not waited for. */
static UNUSED int expect_dto_now(DAT_EVD_HANDLE evd, DAT_EP_HANDLE ep, uint64_t cookie,
				 DAT_DTO_COMPLETION_STATUS status, DAT_DTOS op, const char *what)
{
	DAT_EVENT ev;
	memset(&ev, 0, sizeof(ev));
	DAT_RETURN rc = dat_evd_dequeue(evd, &ev);
	CHECK(rc == DAT_SUCCESS, "%s: no event queued at once (dat_evd_dequeue = %#x)", what, (unsigned)rc);
	if (rc != DAT_SUCCESS)
		return 0;
	const DAT_DTO_COMPLETION_EVENT_DATA *d = &ev.event_data.dto_completion_event_data;
	int ok = ev.event_number == DAT_DTO_COMPLETION_EVENT && d->ep_handle == ep && d->user_cookie.as_64 == cookie &&
		 d->status == status && d->operation == op;
	CHECK(ok, "%s: event %#x ep %p cookie %#llx status %u op %u; want ep %p cookie %#llx status %u op %u", what,
	      ev.event_number, (void *)d->ep_handle, (unsigned long long)d->user_cookie.as_64, d->status,
	      d->operation, (void *)ep, (unsigned long long)cookie, status, op);
	return ok;
}

/* Waits for an RMR bind completion. */
static UNUSED int expect_bind(DAT_EVD_HANDLE evd, DAT_RMR_HANDLE rmr, uint64_t cookie,
			      DAT_RMR_BIND_COMPLETION_STATUS status, const char *what)
{
	DAT_EVENT ev;
	DAT_RETURN rc = wait_event(evd, &ev);
	CHECK(rc == DAT_SUCCESS, "%s: dat_evd_wait = %#x", what, (unsigned)rc);
	if (rc != DAT_SUCCESS)
		return 0;
	const DAT_RMR_BIND_COMPLETION_EVENT_DATA *d = &ev.event_data.rmr_completion_event_data;
	int ok = ev.event_number == DAT_RMR_BIND_COMPLETION_EVENT && d->rmr_handle == rmr &&
		 d->user_cookie.as_64 == cookie && d->status == status;
	CHECK(ok, "%s: event %#x rmr %p cookie %#llx status %u; want event %#x rmr %p cookie %#llx status %u", what,
	      ev.event_number, (void *)d->rmr_handle, (unsigned long long)d->user_cookie.as_64, d->status,
	      DAT_RMR_BIND_COMPLETION_EVENT, (void *)rmr, (unsigned long long)cookie, status);
	return ok;
}

/* Checks that nothing is queued on `evd` now. */
static UNUSED void expect_empty(DAT_EVD_HANDLE evd, const char *what)
{
	DAT_EVENT ev;
	DAT_RETURN rc = dat_evd_dequeue(evd, &ev);
	CHECK(DAT_GET_TYPE(rc) == DAT_QUEUE_EMPTY, "%s: unexpected event %#x (dequeue = %#x, cookie %#llx, status %u)",
	      what, rc == DAT_SUCCESS ? ev.event_number : 0, (unsigned)rc,
	      rc == DAT_SUCCESS ? (unsigned long long)ev.event_data.dto_completion_event_data.user_cookie.as_64 : 0ULL,
	      rc == DAT_SUCCESS ? ev.event_data.dto_completion_event_data.status : 0);
}

/* Empties an EVD without checking (between scenarios). */
static UNUSED void drain(DAT_EVD_HANDLE evd)
{
	DAT_EVENT ev;
	while (dat_evd_dequeue(evd, &ev) == DAT_SUCCESS)
		;
}

/* The address peers connect to: the IA's own address (dat_ia_query's
 * ia_address_ptr), so that the tests run on any IA, rs-tcp on lo
 * (127.0.0.1) or an RDMA device's address (rdma_cm cannot connect to
 * 127.0.0.1 on soft-RoCE). Copied: the provider owns the original. */
static UNUSED DAT_IA_ADDRESS_PTR ia_address(DAT_IA_HANDLE ia)
{
	static struct sockaddr_storage addr;
	DAT_EVD_HANDLE async = DAT_HANDLE_NULL;
	DAT_IA_ATTR ia_attr;
	DAT_PROVIDER_ATTR pr_attr;
	memset(&addr, 0, sizeof(addr));
	memset(&ia_attr, 0, sizeof(ia_attr));
	DAT_RETURN rc = dat_ia_query(ia, &async, DAT_IA_FIELD_IA_ADDRESS_PTR, &ia_attr, 0, &pr_attr);
	CHECK(rc == DAT_SUCCESS && ia_attr.ia_address_ptr != NULL, "dat_ia_query(IA address) = %#x, address %p",
	      (unsigned)rc, (void *)ia_attr.ia_address_ptr);
	if (rc == DAT_SUCCESS && ia_attr.ia_address_ptr != NULL)
		memcpy(&addr, ia_attr.ia_address_ptr,
		       ia_attr.ia_address_ptr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
								      : sizeof(struct sockaddr_in));
	return (DAT_IA_ADDRESS_PTR)&addr;
}

/* Whether the IA is our TCP provider (adapter "tcp:<interface>"): a few
 * checks hold only there and are skipped on RDMA devices, each with the
 * reason where it is used. */
/* Whether the IA's adapter name starts with `prefix` ("tcp:" for rs-tcp, "rxe" for
 * soft-RoCE). */
static UNUSED int ia_adapter_is(DAT_IA_HANDLE ia, const char *prefix)
{
	DAT_EVD_HANDLE async = DAT_HANDLE_NULL;
	DAT_IA_ATTR ia_attr;
	DAT_PROVIDER_ATTR pr_attr;
	memset(&ia_attr, 0, sizeof(ia_attr));
	if (dat_ia_query(ia, &async, DAT_IA_FIELD_ALL, &ia_attr, 0, &pr_attr) != DAT_SUCCESS)
		return 0;
	return strncmp(ia_attr.adapter_name, prefix, strlen(prefix)) == 0;
}

static UNUSED int ia_is_tcp(DAT_IA_HANDLE ia)
{
	return ia_adapter_is(ia, "tcp:");
}

/* The passive side's PSP: dat_psp_create_any picks the port. */
static UNUSED DAT_PSP_HANDLE listen_any(struct side *b, DAT_CONN_QUAL *qual)
{
	DAT_PSP_HANDLE psp = DAT_HANDLE_NULL;
	CHECK_RC(dat_psp_create_any(b->ia, qual, b->cr, DAT_PSP_CONSUMER_FLAG, &psp), DAT_SUCCESS);
	return psp;
}

/* The passive side takes the next connection request and accepts it on its EP. */
static UNUSED int accept_next(struct side *b)
{
	DAT_EVENT ev;
	DAT_RETURN rc = wait_event(b->cr, &ev);
	CHECK(rc == DAT_SUCCESS && ev.event_number == DAT_CONNECTION_REQUEST_EVENT,
	      "connection request: wait = %#x, event %#x", (unsigned)rc, ev.event_number);
	if (rc != DAT_SUCCESS || ev.event_number != DAT_CONNECTION_REQUEST_EVENT)
		return 0;
	rc = dat_cr_accept(ev.event_data.cr_arrival_event_data.cr_handle, b->ep, 0, NULL);
	CHECK(rc == DAT_SUCCESS, "dat_cr_accept = %#x", (unsigned)rc);
	return rc == DAT_SUCCESS;
}

/* The IA's attributes (what the device under it has: max_rmrs 0 on an
 * iWARP device without memory windows, max_iov_segments_per_rdma_read). */
static UNUSED DAT_IA_ATTR ia_attr_of(DAT_IA_HANDLE ia)
{
	DAT_IA_ATTR a;
	DAT_PROVIDER_ATTR p;
	DAT_EVD_HANDLE evd;
	memset(&a, 0, sizeof(a));
	CHECK_RC(dat_ia_query(ia, &evd, DAT_IA_FIELD_ALL, &a, DAT_PROVIDER_FIELD_ALL, &p), DAT_SUCCESS);
	return a;
}

/* Whether the IA's provider attribute `name` is "TRUE" (the IB extension's
 * DAT_IB_ATTR_FETCH_AND_ADD, DAT_IB_ATTR_UD, ...). */
static UNUSED int provider_attr_true(DAT_IA_HANDLE ia, const char *name)
{
	DAT_EVD_HANDLE async = DAT_HANDLE_NULL;
	DAT_PROVIDER_ATTR pr;
	if (dat_ia_query(ia, &async, 0, NULL, DAT_PROVIDER_FIELD_ALL, &pr) != DAT_SUCCESS)
		return 0;
	for (int i = 0; i < pr.num_provider_specific_attr; i++)
		if (!strcmp(pr.provider_specific_attr[i].name, name))
			return !strcmp(pr.provider_specific_attr[i].value, "TRUE");
	return 0;
}

/* The status of a write through a stale RMR context (after an unbind, or the
 * previous one after a rebind) that the initiator used before: DAT's
 * REMOTE_ACCESS on every entry. (Over libfabric's tcp and tcp;ofi_rxm between
 * hosts the request is flushed instead: the initiator keeps the peer's key
 * table entry once read, and tcp drops the connection on the refused write
 * without saying why; between processes of one host, as here, the initiator
 * reads the peer's table in place before each request and refuses it:
 * docs/libfabric.md, "Memory".) */
static UNUSED DAT_DTO_COMPLETION_STATUS stale_context_status(DAT_IA_HANDLE ia, const char *what)
{
	(void)ia;
	(void)what;
	return DAT_DTO_ERR_REMOTE_ACCESS;
}

/* Connects a->ep to b->ep through a PSP of b's IA; returns 1 when both sides
 * saw ESTABLISHED. */
static UNUSED int connect_pair(struct side *a, struct side *b)
{
	DAT_CONN_QUAL qual = 0;
	DAT_PSP_HANDLE psp = listen_any(b, &qual);
	int ok = 0;
	if (psp == DAT_HANDLE_NULL)
		return 0;
	DAT_RETURN rc = dat_ep_connect(a->ep, ia_address(b->ia), qual, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT,
				       DAT_CONNECT_DEFAULT_FLAG);
	CHECK(rc == DAT_SUCCESS, "dat_ep_connect = %#x", (unsigned)rc);
	if (rc == DAT_SUCCESS && accept_next(b))
		ok = expect_conn_event(b->conn, b->ep, DAT_CONNECTION_EVENT_ESTABLISHED, "passive ESTABLISHED") &&
		     expect_conn_event(a->conn, a->ep, DAT_CONNECTION_EVENT_ESTABLISHED, "active ESTABLISHED");
	CHECK_RC(dat_psp_free(psp), DAT_SUCCESS);
	return ok;
}

/* Graceful disconnect from a; both sides see DISCONNECTED. */
static UNUSED int disconnect_pair(struct side *a, struct side *b)
{
	CHECK_RC(dat_ep_disconnect(a->ep, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	return expect_conn_event(a->conn, a->ep, DAT_CONNECTION_EVENT_DISCONNECTED, "active DISCONNECTED") &&
	       expect_conn_event(b->conn, b->ep, DAT_CONNECTION_EVENT_DISCONNECTED, "passive DISCONNECTED");
}

static UNUSED DAT_EP_STATE ep_state(DAT_EP_HANDLE ep)
{
	DAT_EP_STATE st = 0xffff;
	DAT_BOOLEAN ri, qi;
	CHECK_RC(dat_ep_get_status(ep, &st, &ri, &qi), DAT_SUCCESS);
	return st;
}

/* Frees the EP of a side and empties its EVDs for the next scenario. */
static UNUSED void side_free_ep(struct side *s)
{
	if (s->ep != DAT_HANDLE_NULL)
		CHECK_RC(dat_ep_free(s->ep), DAT_SUCCESS);
	s->ep = DAT_HANDLE_NULL;
	drain(s->req);
	drain(s->rcv);
	drain(s->conn);
	drain(s->cr);
}

static UNUSED void side_free_evds(struct side *s)
{
	CHECK_RC(dat_evd_free(s->req), DAT_SUCCESS);
	CHECK_RC(dat_evd_free(s->rcv), DAT_SUCCESS);
	CHECK_RC(dat_evd_free(s->conn), DAT_SUCCESS);
	CHECK_RC(dat_evd_free(s->cr), DAT_SUCCESS);
}

/* One connection between two IAs on $DAT_TEST_IA, as a test of a single
 * connection sets it up: on each side an IA, a PZ, the EVDs and an EP with
 * `depth` requests; a connected to b. Returns 1 when connected. The test's
 * LMRs go in a->pz and b->pz, and are freed before close_pair. */
static UNUSED int open_pair(struct side *a, struct side *b, DAT_COUNT depth)
{
	struct side *s[2] = { a, b };
	for (int i = 0; i < 2; i++) {
		DAT_IA_HANDLE ia = DAT_HANDLE_NULL;
		DAT_PZ_HANDLE pz = DAT_HANDLE_NULL;
		s[i]->async = DAT_HANDLE_NULL;
		CHECK_RC(dat_ia_open(dat_test_ia(), 8, &s[i]->async, &ia), DAT_SUCCESS);
		if (check_failed)
			return 0;
		CHECK_RC(dat_pz_create(ia, &pz), DAT_SUCCESS);
		side_evds(s[i], ia, pz);
		DAT_EP_ATTR attr = ep_attr(0, 0, depth);
		side_ep(s[i], &attr);
	}
	return !check_failed && connect_pair(a, b);
}

/* Frees what open_pair made, the connection already ended: the EPs, EVDs,
 * PZs and IAs. */
static UNUSED void free_pair(struct side *a, struct side *b)
{
	struct side *s[2] = { a, b };
	for (int i = 0; i < 2; i++) {
		side_free_ep(s[i]);
		side_free_evds(s[i]);
		CHECK_RC(dat_pz_free(s[i]->pz), DAT_SUCCESS);
		CHECK_RC(dat_ia_close(s[i]->ia, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	}
}

/* Undoes open_pair: disconnects, then free_pair. */
static UNUSED void close_pair(struct side *a, struct side *b)
{
	CHECK(disconnect_pair(a, b), "disconnect");
	free_pair(a, b);
}

/* Registers `len` bytes at `p` in `pz`. */
static UNUSED DAT_LMR_HANDLE lmr_make(DAT_IA_HANDLE ia, DAT_PZ_HANDLE pz, void *p, DAT_VLEN len,
				      DAT_MEM_PRIV_FLAGS priv, DAT_LMR_CONTEXT *lctx, DAT_RMR_CONTEXT *rctx)
{
	DAT_LMR_HANDLE lmr = DAT_HANDLE_NULL;
	DAT_REGION_DESCRIPTION region;
	DAT_VLEN rlen;
	DAT_VADDR raddr;
	DAT_RMR_CONTEXT r = 0;
	region.for_va = p;
	CHECK_RC(dat_lmr_create(ia, DAT_MEM_TYPE_VIRTUAL, region, len, pz, priv, DAT_VA_TYPE_VA, &lmr, lctx, &r,
				&rlen, &raddr),
		 DAT_SUCCESS);
	if (rctx)
		*rctx = r;
	return lmr;
}
/* A provider must not raise SIGPIPE in its consumer when a peer goes away
 * (OFED's does not; consumers do not ignore it). Record it instead of dying
 * of it, and fail at the end. */
static volatile sig_atomic_t sigpipes;

static void on_sigpipe(int sig)
{
	(void)sig;
	sigpipes++;
}

static UNUSED void catch_sigpipe(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_sigpipe;
	sigaction(SIGPIPE, &sa, NULL);
}

static UNUSED void check_no_sigpipe(void)
{
	CHECK(sigpipes == 0, "the provider raised SIGPIPE %d time(s) in this process (a socket write without MSG_NOSIGNAL)",
	      (int)sigpipes);
}
#endif
