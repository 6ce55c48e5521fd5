/* The InfiniBand extensions of DAT 2.0 (<dat2/dat_ib_extensions.h>, what
 * Debian's dtestx uses) through our libdat2 and the IA $DAT_TEST_IA (default
 * rs-tcp): RDMA write with immediate data, fetch-and-add, compare-and-swap,
 * their DAT_IB_DTO_EVENT completions, the counters, and the rules they share
 * with the base operations. Two IAs in one process, as test_dto_rules; every
 * wait has a timeout.
 *
 * - write with immediate data: the data lands where the RMR triplet says,
 *   the initiator's completion says DAT_IB_RDMA_WRITE_IMMED, and exactly one
 *   receive of the target completes with DAT_IB_RDMA_WRITE_IMMED_DATA, the
 *   immediate value and the write's length; with no receive posted the write
 *   waits for one (nothing is lost).
 * - atomics: the previous value lands in the 8-byte local segment, the
 *   target word changes as the operation says; two initiators on two
 *   connections adding to one word never lose an update and never see the
 *   same previous value twice.
 * - a word without DAT_IB_MEM_PRIV_REMOTE_ATOMIC fails the request with a
 *   DTO error (and, as on an RDMA NIC, breaks the connection); a misaligned
 *   target word is DAT_INVALID_PARAMETER and a local segment that is not 8
 *   bytes DAT_LENGTH_ERROR, at once.
 * - on an iWARP device (the adapter name says "iWARP": no atomics, no
 *   immediate data, e.g. soft-iWARP) the provider does not report
 *   DAT_IB_ATTR_FETCH_AND_ADD, _CMP_AND_SWAP or _IMMED_DATA, and the three
 *   posts are DAT_NOT_IMPLEMENTED at once on a connected EP, which stays
 *   connected; the tests of what they do are skipped, saying so.
 */
#define _GNU_SOURCE
#include <dat2/udat.h>
#include <dat2/dat_ib_extensions.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "dto_pair.h"

static DAT_IA_HANDLE ia_a, ia_b;
static DAT_PZ_HANDLE pz_a, pz_b;
static struct side A, B;

#define BUF 65536
static char abuf[BUF], bbuf[BUF] __attribute__((aligned(64)));
static DAT_UINT64 words[64] __attribute__((aligned(64))); /* B's atomic targets */
static DAT_UINT64 noatomic[8] __attribute__((aligned(64))); /* B's, without the privilege */
static DAT_UINT64 results[8] __attribute__((aligned(64))); /* A's result words */
static DAT_LMR_HANDLE lmr_a, lmr_b, lmr_w, lmr_n, lmr_r;
static DAT_LMR_CONTEXT lc_a, lc_b, lc_w, lc_n, lc_r;
static DAT_RMR_CONTEXT rc_b, rc_w, rc_n;

static void new_eps(void)
{
	DAT_EP_ATTR aa = ep_attr(0, 0, 64);
	DAT_EP_ATTR ba = ep_attr(0, 0, 64);
	side_ep(&A, &aa);
	side_ep(&B, &ba);
}

static void free_eps(void)
{
	side_free_ep(&A);
	side_free_ep(&B);
}

static DAT_IB_EXTENSION_EVENT_DATA *ext_of(DAT_EVENT *ev)
{
	return (DAT_IB_EXTENSION_EVENT_DATA *)&ev->event_extension_data[0];
}

/* Waits for a DAT_IB_DTO_EVENT and checks it; returns 1 if every field matched. */
static int expect_ext(DAT_EVD_HANDLE evd, DAT_EP_HANDLE ep, uint64_t cookie, DAT_DTO_COMPLETION_STATUS status,
		      long len, DAT_IB_EXT_TYPE type, DAT_EVENT *out, const char *what)
{
	DAT_EVENT ev;
	DAT_RETURN rc = wait_event(evd, &ev);
	CHECK(rc == DAT_SUCCESS, "%s: dat_evd_wait = %#x", what, (unsigned)rc);
	if (rc != DAT_SUCCESS)
		return 0;
	const DAT_DTO_COMPLETION_EVENT_DATA *d = &ev.event_data.dto_completion_event_data;
	int ok = ev.event_number == (DAT_EVENT_NUMBER)DAT_IB_DTO_EVENT && d->ep_handle == ep &&
		 d->user_cookie.as_64 == cookie && d->status == status &&
		 (len < 0 || d->transfered_length == (DAT_SEG_LENGTH)len) &&
		 (status != DAT_DTO_SUCCESS || ext_of(&ev)->type == type);
	CHECK(ok, "%s: event %#x ep %p cookie %#llx status %u len %u ext type %u; want %#x %p %#llx %u %ld %u", what,
	      ev.event_number, (void *)d->ep_handle, (unsigned long long)d->user_cookie.as_64, d->status,
	      d->transfered_length, ext_of(&ev)->type, DAT_IB_DTO_EVENT, (void *)ep, (unsigned long long)cookie,
	      status, len, type);
	if (out)
		*out = ev;
	return ok;
}

/* What the IA reports, set by test_capabilities. */
static int has_atomics, has_immed;

static void test_capabilities(void)
{
	DAT_EVD_HANDLE async = DAT_HANDLE_NULL;
	DAT_IA_ATTR ia_attr;
	DAT_PROVIDER_ATTR pr;
	int fa = 0, cs = 0, imm = 0, cnt = 0;
	CHECK_RC(dat_ia_query(ia_a, &async, DAT_IA_FIELD_ALL, &ia_attr, DAT_PROVIDER_FIELD_ALL, &pr), DAT_SUCCESS);
	CHECK(ia_attr.extension_supported == DAT_EXTENSION_IB, "extension_supported %d", ia_attr.extension_supported);
	CHECK(ia_attr.extension_version == DAT_IB_EXTENSION_VERSION, "extension_version %d",
	      ia_attr.extension_version);
	for (int i = 0; i < pr.num_provider_specific_attr; i++) {
		const char *n = pr.provider_specific_attr[i].name, *v = pr.provider_specific_attr[i].value;
		if (!strcmp(n, DAT_IB_ATTR_FETCH_AND_ADD))
			fa = !strcmp(v, "TRUE");
		if (!strcmp(n, DAT_IB_ATTR_CMP_AND_SWAP))
			cs = !strcmp(v, "TRUE");
		if (!strcmp(n, DAT_IB_ATTR_IMMED_DATA))
			imm = !strcmp(v, "TRUE");
		if (!strcmp(n, DAT_IB_ATTR_COUNTERS))
			cnt = 1;
	}
	int iwarp = strstr(ia_attr.adapter_name, "iWARP") != NULL;
	/* libfabric's providers through our ofi backend have remote CQ data;
	 * atomics only on shm (tcp has none; tcp;ofi_rxm 1.17 offers them only
	 * without the send-after-write order its entry is opened with) */
	int ofi_tcp = strncmp(ia_attr.adapter_name, "ofi ", 4) == 0 && strncmp(ia_attr.adapter_name, "ofi shm", 7) != 0;
	/* libfabric's verbs provider (1.17) carries 4 bytes of remote CQ data:
	 * over its connected endpoints too few for our immediate data (its 32
	 * bits beside a write's length); over ofi_rxm the closing send's tag
	 * carries the length. It offers no atomics with the order our entries
	 * are opened with. */
	int ofi_verbs = strncmp(ia_attr.adapter_name, "ofi verbs", 9) == 0;
	int ofi_verbs_rdm = ofi_verbs && strstr(ia_attr.adapter_name, "ofi_rxm") != NULL;
	if (iwarp || (ofi_verbs && !ofi_verbs_rdm))
		CHECK(!fa && !cs && !imm && cnt,
		      "provider attributes on %s: fetch-and-add %d, cmp-and-swap %d, immed %d (want none), counters %d",
		      iwarp ? "iWARP" : "libfabric verbs", fa, cs, imm, cnt);
	else if (ofi_tcp)
		CHECK(!fa && !cs && imm && cnt,
		      "provider attributes on libfabric: fetch-and-add %d, cmp-and-swap %d (want none), immed %d, "
		      "counters %d",
		      fa, cs, imm, cnt);
	else
		CHECK(fa && cs && imm && cnt,
		      "provider attributes: fetch-and-add %d, cmp-and-swap %d, immed %d, counters %d", fa, cs, imm, cnt);
	has_atomics = fa && cs;
	has_immed = imm;
}

/* The extensions the device lacks: refused at once with DAT_NOT_IMPLEMENTED,
 * the connection unharmed (it still disconnects gracefully). */
static void test_refused(void)
{
	new_eps();
	if (!connect_pair(&A, &B)) {
		free_eps();
		return;
	}
	DAT_LMR_TRIPLET l = seg(lc_a, abuf, 16), l8 = seg(lc_r, &results[0], 8);
	DAT_RMR_TRIPLET r = rseg(rc_b, bbuf, 16), w = rseg(rc_w, &words[0], 8);
	if (!has_immed)
		CHECK_TYPE(dat_ib_post_rdma_write_immed(A.ep, 1, &l, ck(0x60), &r, 1, DAT_COMPLETION_DEFAULT_FLAG),
			   DAT_NOT_IMPLEMENTED);
	if (!has_atomics) {
		CHECK_TYPE(dat_ib_post_fetch_and_add(A.ep, 7, &l8, ck(0x61), &w, DAT_COMPLETION_DEFAULT_FLAG),
			   DAT_NOT_IMPLEMENTED);
		CHECK_TYPE(dat_ib_post_cmp_and_swap(A.ep, 5, 1, &l8, ck(0x62), &w, DAT_COMPLETION_DEFAULT_FLAG),
			   DAT_NOT_IMPLEMENTED);
	}
	disconnect_pair(&A, &B);
	free_eps();
}

static void test_write_immed(void)
{
	DAT_EVENT ev;
	new_eps();
	if (!connect_pair(&A, &B)) {
		free_eps();
		return;
	}
	/* two receives: the write consumes exactly one */
	DAT_LMR_TRIPLET r1 = seg(lc_b, bbuf + 60000, 16), r2 = seg(lc_b, bbuf + 61000, 16);
	CHECK_RC(dat_ep_post_recv(B.ep, 1, &r1, ck(0x71), 0), DAT_SUCCESS);
	CHECK_RC(dat_ep_post_recv(B.ep, 1, &r2, ck(0x72), 0), DAT_SUCCESS);
	memset(abuf, 'w', 4096);
	memset(bbuf, 0, 4096);
	DAT_LMR_TRIPLET l = seg(lc_a, abuf, 4096);
	DAT_RMR_TRIPLET r = rseg(rc_b, bbuf, 4096);
	CHECK_RC(dat_ib_post_rdma_write_immed(A.ep, 1, &l, ck(0x70), &r, 0xabcd1234u, DAT_COMPLETION_DEFAULT_FLAG),
		 DAT_SUCCESS);
	if (expect_ext(A.req, A.ep, 0x70, DAT_DTO_SUCCESS, 4096, DAT_IB_RDMA_WRITE_IMMED, &ev, "write-immed initiator"))
		CHECK(ev.event_data.dto_completion_event_data.operation == (DAT_DTOS)DAT_IB_DTO_RDMA_WRITE_IMMED,
		      "write-immed operation %u", ev.event_data.dto_completion_event_data.operation);
	if (expect_ext(B.rcv, B.ep, 0x71, DAT_DTO_SUCCESS, 4096, DAT_IB_RDMA_WRITE_IMMED_DATA, &ev,
		       "write-immed receive"))
		CHECK(ext_of(&ev)->val.immed.data == 0xabcd1234u, "immediate data %#x", ext_of(&ev)->val.immed.data);
	CHECK(memcmp(abuf, bbuf, 4096) == 0, "write-immed data arrived");
	expect_empty(B.rcv, "one write-immed consumed one receive");

	/* the second receive takes the next one; a third write waits for a receive */
	CHECK_RC(dat_ib_post_rdma_write_immed(A.ep, 1, &l, ck(0x73), &r, 7, DAT_COMPLETION_DEFAULT_FLAG), DAT_SUCCESS);
	expect_ext(A.req, A.ep, 0x73, DAT_DTO_SUCCESS, 4096, DAT_IB_RDMA_WRITE_IMMED, NULL, "second write-immed");
	if (expect_ext(B.rcv, B.ep, 0x72, DAT_DTO_SUCCESS, 4096, DAT_IB_RDMA_WRITE_IMMED_DATA, &ev,
		       "second write-immed receive"))
		CHECK(ext_of(&ev)->val.immed.data == 7, "second immediate data %#x", ext_of(&ev)->val.immed.data);
	CHECK_RC(dat_ib_post_rdma_write_immed(A.ep, 1, &l, ck(0x74), &r, 8, DAT_COMPLETION_DEFAULT_FLAG), DAT_SUCCESS);
	{
		DAT_COUNT nmore;
		DAT_RETURN rc = dat_evd_wait(B.rcv, 200000, 1, &ev, &nmore);
		CHECK(DAT_GET_TYPE(rc) == DAT_TIMEOUT_EXPIRED, "write-immed without a receive completed one: %#x",
		      (unsigned)rc);
	}
	DAT_LMR_TRIPLET r3 = seg(lc_b, bbuf + 62000, 16);
	CHECK_RC(dat_ep_post_recv(B.ep, 1, &r3, ck(0x75), 0), DAT_SUCCESS);
	if (expect_ext(B.rcv, B.ep, 0x75, DAT_DTO_SUCCESS, 4096, DAT_IB_RDMA_WRITE_IMMED_DATA, &ev,
		       "write-immed that waited for a receive"))
		CHECK(ext_of(&ev)->val.immed.data == 8, "third immediate data %#x", ext_of(&ev)->val.immed.data);
	expect_ext(A.req, A.ep, 0x74, DAT_DTO_SUCCESS, 4096, DAT_IB_RDMA_WRITE_IMMED, NULL, "third write-immed");

	/* counters: three writes with immediate data, three receives of them */
	{
		DAT_UINT64 c[DCNT_EP_ALL_COUNTERS];
		memset(c, 0xff, sizeof(c));
		CHECK_RC(dat_query_counters(A.ep, DCNT_EP_ALL_COUNTERS, c, 0), DAT_SUCCESS);
		CHECK(c[DCNT_EP_POST_WRITE_IMM] == 3 && c[DCNT_EP_POST_WRITE_IMM_DATA] == 3 * 4096,
		      "EP write-immed counters %llu/%llu", (unsigned long long)c[DCNT_EP_POST_WRITE_IMM],
		      (unsigned long long)c[DCNT_EP_POST_WRITE_IMM_DATA]);
		CHECK_RC(dat_query_counters(B.ep, DCNT_EP_RECV_RDMA_IMM, c, 1), DAT_SUCCESS);
		CHECK(c[0] == 3, "EP receive-immed counter %llu", (unsigned long long)c[0]);
		CHECK_RC(dat_query_counters(B.ep, DCNT_EP_RECV_RDMA_IMM, c, 0), DAT_SUCCESS);
		CHECK(c[0] == 0, "EP counter after reset %llu", (unsigned long long)c[0]);
		CHECK(DAT_GET_TYPE(dat_query_counters(B.ep, DCNT_EP_ALL_COUNTERS + 1, c, 0)) == DAT_INVALID_PARAMETER,
		      "counter out of range refused");
	}
	disconnect_pair(&A, &B);
	free_eps();
}

static void test_atomics(void)
{
	DAT_EVENT ev;
	new_eps();
	if (!connect_pair(&A, &B)) {
		free_eps();
		return;
	}
	words[0] = 5;
	results[0] = 0;
	DAT_LMR_TRIPLET l = seg(lc_r, &results[0], 8);
	DAT_RMR_TRIPLET r = rseg(rc_w, &words[0], 8);
	CHECK_RC(dat_ib_post_fetch_and_add(A.ep, 7, &l, ck(0x80), &r, DAT_COMPLETION_DEFAULT_FLAG), DAT_SUCCESS);
	if (expect_ext(A.req, A.ep, 0x80, DAT_DTO_SUCCESS, 8, DAT_IB_FETCH_AND_ADD, &ev, "fetch-and-add"))
		CHECK(ev.event_data.dto_completion_event_data.operation == (DAT_DTOS)DAT_IB_DTO_FETCH_ADD,
		      "fetch-and-add operation %u", ev.event_data.dto_completion_event_data.operation);
	CHECK(results[0] == 5 && words[0] == 12, "fetch-and-add: got %llu, word %llu",
	      (unsigned long long)results[0], (unsigned long long)words[0]);

	/* compare-and-swap that matches, then one that does not */
	CHECK_RC(dat_ib_post_cmp_and_swap(A.ep, 12, 100, &l, ck(0x81), &r, DAT_COMPLETION_DEFAULT_FLAG), DAT_SUCCESS);
	if (expect_ext(A.req, A.ep, 0x81, DAT_DTO_SUCCESS, 8, DAT_IB_CMP_AND_SWAP, &ev, "cmp-and-swap"))
		CHECK(ev.event_data.dto_completion_event_data.operation == (DAT_DTOS)DAT_IB_DTO_CMP_SWAP,
		      "cmp-and-swap operation %u", ev.event_data.dto_completion_event_data.operation);
	CHECK(results[0] == 12 && words[0] == 100, "cmp-and-swap (equal): got %llu, word %llu",
	      (unsigned long long)results[0], (unsigned long long)words[0]);
	CHECK_RC(dat_ib_post_cmp_and_swap(A.ep, 5, 1, &l, ck(0x82), &r, DAT_COMPLETION_DEFAULT_FLAG), DAT_SUCCESS);
	expect_ext(A.req, A.ep, 0x82, DAT_DTO_SUCCESS, 8, DAT_IB_CMP_AND_SWAP, NULL, "cmp-and-swap (different)");
	CHECK(results[0] == 100 && words[0] == 100, "cmp-and-swap (different): got %llu, word %llu",
	      (unsigned long long)results[0], (unsigned long long)words[0]);

	/* 64-bit values wrap as integers */
	words[1] = ~0ull;
	DAT_RMR_TRIPLET r1 = rseg(rc_w, &words[1], 8);
	CHECK_RC(dat_ib_post_fetch_and_add(A.ep, 2, &l, ck(0x83), &r1, DAT_COMPLETION_DEFAULT_FLAG), DAT_SUCCESS);
	expect_ext(A.req, A.ep, 0x83, DAT_DTO_SUCCESS, 8, DAT_IB_FETCH_AND_ADD, NULL, "fetch-and-add wrap");
	CHECK(results[0] == ~0ull && words[1] == 1, "fetch-and-add wrap: got %#llx, word %#llx",
	      (unsigned long long)results[0], (unsigned long long)words[1]);

	/* synchronous refusals: local segment not 8 bytes, bad handles, a datagram send on a connection EP */
	{
		DAT_LMR_TRIPLET l4 = seg(lc_r, &results[0], 4);
		DAT_RETURN rc = dat_ib_post_fetch_and_add(A.ep, 1, &l4, ck(0x84), &r, DAT_COMPLETION_DEFAULT_FLAG);
		CHECK(DAT_GET_TYPE(rc) == DAT_LENGTH_ERROR, "4-byte result segment = %#x", (unsigned)rc);
		rc = dat_ib_post_fetch_and_add(DAT_HANDLE_NULL, 1, &l, ck(0x85), &r, DAT_COMPLETION_DEFAULT_FLAG);
		CHECK(DAT_GET_TYPE(rc) == DAT_INVALID_HANDLE, "NULL EP = %#x", (unsigned)rc);
		rc = dat_ib_post_cmp_and_swap((DAT_EP_HANDLE)B.rcv, 1, 2, &l, ck(0x86), &r, DAT_COMPLETION_DEFAULT_FLAG);
		CHECK(DAT_GET_TYPE(rc) == DAT_INVALID_HANDLE, "EVD as EP = %#x", (unsigned)rc);
		DAT_RMR_TRIPLET odd = rseg(rc_w, (char *)&words[4] + 4, 8);
		rc = dat_ib_post_fetch_and_add(A.ep, 1, &l, ck(0x89), &odd, DAT_COMPLETION_DEFAULT_FLAG);
		CHECK(DAT_GET_TYPE(rc) == DAT_INVALID_PARAMETER, "misaligned target word = %#x", (unsigned)rc);
		rc = dat_ib_post_fetch_and_add(A.ep, 1, NULL, ck(0x87), &r, DAT_COMPLETION_DEFAULT_FLAG);
		CHECK(DAT_GET_TYPE(rc) == DAT_INVALID_PARAMETER, "NULL result triplet = %#x", (unsigned)rc);
		DAT_IB_ADDR_HANDLE ah;
		memset(&ah, 0, sizeof(ah));
		rc = dat_ib_post_send_ud(A.ep, 1, &l, &ah, ck(0x88), DAT_COMPLETION_DEFAULT_FLAG);
		/* a datagram send needs a datagram EP (test_ud.c) */
		CHECK(DAT_GET_TYPE(rc) == DAT_INVALID_PARAMETER, "UD send on a connection EP = %#x", (unsigned)rc);
		expect_empty(A.req, "refused requests");
	}
	{
		DAT_UINT64 c[DCNT_EP_ALL_COUNTERS];
		CHECK_RC(dat_query_counters(A.ep, DCNT_EP_ALL_COUNTERS, c, 0), DAT_SUCCESS);
		CHECK(c[DCNT_EP_POST_FETCH_ADD] == 2 && c[DCNT_EP_POST_CMP_SWAP] == 2, "atomic counters %llu/%llu",
		      (unsigned long long)c[DCNT_EP_POST_FETCH_ADD], (unsigned long long)c[DCNT_EP_POST_CMP_SWAP]);
		DAT_UINT64 ia_c[DCNT_IA_ALL_COUNTERS];
		CHECK_RC(dat_query_counters(ia_a, DCNT_IA_ALL_COUNTERS, ia_c, 0), DAT_SUCCESS);
		CHECK(ia_c[DCNT_IA_EP_CREATE] >= 1 && ia_c[DCNT_IA_LMR_CREATE] >= 2, "IA counters EP %llu LMR %llu",
		      (unsigned long long)ia_c[DCNT_IA_EP_CREATE], (unsigned long long)ia_c[DCNT_IA_LMR_CREATE]);
		DAT_UINT64 evd_c[DCNT_EVD_ALL_COUNTERS];
		CHECK_RC(dat_query_counters(A.req, DCNT_EVD_ALL_COUNTERS, evd_c, 0), DAT_SUCCESS);
		CHECK(evd_c[DCNT_EVD_WAIT] >= 4, "EVD wait counter %llu", (unsigned long long)evd_c[DCNT_EVD_WAIT]);
		CHECK(DAT_GET_TYPE(dat_query_counters(pz_a, 0, c, 0)) == DAT_INVALID_HANDLE, "counters of a PZ");
	}
	disconnect_pair(&A, &B);
	free_eps();
}

/* A remote failure: a DTO error on the initiator; the connection breaks. */
static void atomic_fails(DAT_RMR_CONTEXT rctx, void *target, DAT_DTO_COMPLETION_STATUS want, const char *what)
{
	new_eps();
	if (!connect_pair(&A, &B)) {
		free_eps();
		return;
	}
	DAT_LMR_TRIPLET l = seg(lc_r, &results[0], 8);
	DAT_RMR_TRIPLET r = rseg(rctx, target, 8);
	CHECK_RC(dat_ib_post_fetch_and_add(A.ep, 1, &l, ck(0x90), &r, DAT_COMPLETION_DEFAULT_FLAG), DAT_SUCCESS);
	DAT_EVENT ev;
	DAT_RETURN rc = wait_event(A.req, &ev);
	CHECK(rc == DAT_SUCCESS && ev.event_data.dto_completion_event_data.user_cookie.as_64 == 0x90 &&
		      ev.event_data.dto_completion_event_data.status == want,
	      "%s: wait %#x, status %u, want %u", what, (unsigned)rc, ev.event_data.dto_completion_event_data.status,
	      want);
	expect_conn_event(A.conn, A.ep, DAT_CONNECTION_EVENT_BROKEN, what);
	free_eps();
}

/* ---- two initiators, one word ------------------------------------------------------------ */

#define ROUNDS 1000
struct adder {
	struct side s;
	DAT_LMR_TRIPLET l;
	DAT_RMR_TRIPLET r;
	DAT_UINT64 seen[ROUNDS];
	int failed;
};

static void *add_loop(void *arg)
{
	struct adder *a = arg;
	for (int i = 0; i < ROUNDS && !a->failed; i++) {
		DAT_EVENT ev;
		if (dat_ib_post_fetch_and_add(a->s.ep, 1, &a->l, ck(i), &a->r, DAT_COMPLETION_DEFAULT_FLAG) !=
			    DAT_SUCCESS ||
		    wait_event(a->s.req, &ev) != DAT_SUCCESS ||
		    ev.event_data.dto_completion_event_data.status != DAT_DTO_SUCCESS) {
			a->failed = 1;
			break;
		}
		a->seen[i] = *(volatile DAT_UINT64 *)(uintptr_t)a->l.virtual_address;
	}
	return NULL;
}

static int cmp_u64(const void *x, const void *y)
{
	DAT_UINT64 a = *(const DAT_UINT64 *)x, b = *(const DAT_UINT64 *)y;
	return a < b ? -1 : a > b;
}

static void test_atomicity(void)
{
	static struct adder ad[2];
	static struct side targets[2];
	static DAT_UINT64 all[2 * ROUNDS];
	pthread_t th[2];
	words[8] = 0;
	for (int i = 0; i < 2; i++) {
		/* each initiator its own EVDs and EP on A's IA; each target EP on B's */
		memset(&ad[i], 0, sizeof(ad[i]));
		side_evds(&ad[i].s, ia_a, pz_a);
		side_evds(&targets[i], ia_b, pz_b);
		DAT_EP_ATTR at = ep_attr(0, 0, 64);
		side_ep(&ad[i].s, &at);
		side_ep(&targets[i], &at);
		if (!connect_pair(&ad[i].s, &targets[i]))
			return;
		ad[i].l = seg(lc_r, &results[2 + i], 8);
		ad[i].r = rseg(rc_w, &words[8], 8);
	}
	for (int i = 0; i < 2; i++)
		pthread_create(&th[i], NULL, add_loop, &ad[i]);
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	CHECK(!ad[0].failed && !ad[1].failed, "concurrent fetch-and-add failed (%d, %d)", ad[0].failed,
	      ad[1].failed);
	CHECK(words[8] == 2 * ROUNDS, "two initiators x %d adds: word %llu", ROUNDS, (unsigned long long)words[8]);
	memcpy(all, ad[0].seen, sizeof(ad[0].seen));
	memcpy(all + ROUNDS, ad[1].seen, sizeof(ad[1].seen));
	qsort(all, 2 * ROUNDS, sizeof(all[0]), cmp_u64);
	int distinct = 1;
	for (int i = 0; i < 2 * ROUNDS; i++)
		if (all[i] != (DAT_UINT64)i)
			distinct = 0;
	CHECK(distinct, "every previous value 0..%d seen exactly once", 2 * ROUNDS - 1);
	for (int i = 0; i < 2; i++) {
		disconnect_pair(&ad[i].s, &targets[i]);
		side_free_ep(&ad[i].s);
		side_free_ep(&targets[i]);
		side_free_evds(&ad[i].s);
		side_free_evds(&targets[i]);
	}
}

int main(void)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	alarm(100);
	catch_sigpipe();
	DAT_EVD_HANDLE async_a = DAT_HANDLE_NULL, async_b = DAT_HANDLE_NULL;
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async_a, &ia_a), DAT_SUCCESS);
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async_b, &ia_b), DAT_SUCCESS);
	if (check_failed)
		return check_summary("test_ib_ext");
	CHECK_RC(dat_pz_create(ia_a, &pz_a), DAT_SUCCESS);
	CHECK_RC(dat_pz_create(ia_b, &pz_b), DAT_SUCCESS);
	lmr_a = lmr_make(ia_a, pz_a, abuf, BUF, DAT_MEM_PRIV_ALL_FLAG, &lc_a, NULL);
	lmr_r = lmr_make(ia_a, pz_a, results, sizeof(results), DAT_MEM_PRIV_ALL_FLAG, &lc_r, NULL);
	lmr_b = lmr_make(ia_b, pz_b, bbuf, BUF, DAT_MEM_PRIV_ALL_FLAG, &lc_b, &rc_b);
	lmr_w = lmr_make(ia_b, pz_b, words, sizeof(words),
			 DAT_MEM_PRIV_ALL_FLAG | (DAT_MEM_PRIV_FLAGS)DAT_IB_MEM_PRIV_REMOTE_ATOMIC, &lc_w, &rc_w);
	lmr_n = lmr_make(ia_b, pz_b, noatomic, sizeof(noatomic), DAT_MEM_PRIV_ALL_FLAG, &lc_n, &rc_n);
	side_evds(&A, ia_a, pz_a);
	side_evds(&B, ia_b, pz_b);
	if (check_failed)
		return check_summary("test_ib_ext");

	test_capabilities();
	if (!has_immed || !has_atomics)
		test_refused();
	if (has_immed)
		test_write_immed();
	else
		printf("SKIP write with immediate data: %s has none (iWARP)\n", dat_test_ia());
	if (has_atomics) {
		test_atomics();
		atomic_fails(rc_n, &noatomic[0], DAT_DTO_ERR_REMOTE_ACCESS,
			     "fetch-and-add without remote atomic privilege");
		test_atomicity();
	} else {
		printf("SKIP atomics: %s has none (iWARP, or libfabric)\n", dat_test_ia());
	}

	side_free_evds(&A);
	side_free_evds(&B);
	CHECK_RC(dat_lmr_free(lmr_a), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_r), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_b), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_w), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_n), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz_a), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz_b), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia_a, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia_b, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	check_no_sigpipe();
	return check_summary("test_ib_ext");
}
