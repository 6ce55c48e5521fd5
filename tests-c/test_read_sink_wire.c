/* The STags an RDMA read puts on the wire (issue 38; run by read-sink-wire.py,
 * which captures the connection's bytes). On iWARP a read request carries its
 * sink's STag and tagged offset to the peer; on soft-iWARP (siw), which checks
 * no remote read right, a peer that learns an STag reads its whole region. So
 * no STag naming the consumer's memory may go out with a read: this program
 * reads into a region registered with local rights only (one segment, then
 * two) and prints, for the capture to look for, the sink's lmr_context and
 * address range ("sink") and the source's rmr_context and address ("source":
 * proof that the capture saw the read requests at all). */
#include "check.h"
#include "dto_pair.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define BUF 8192

static char sink[BUF] __attribute__((aligned(4096)));
static char source[BUF] __attribute__((aligned(4096)));

int main(void)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	alarm(100);
	catch_sigpipe();
	DAT_IA_HANDLE ia_a = DAT_HANDLE_NULL, ia_b = DAT_HANDLE_NULL;
	DAT_EVD_HANDLE async_a = DAT_HANDLE_NULL, async_b = DAT_HANDLE_NULL;
	DAT_PZ_HANDLE pz_a = DAT_HANDLE_NULL, pz_b = DAT_HANDLE_NULL;
	struct side A = { 0 }, B = { 0 };
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async_a, &ia_a), DAT_SUCCESS);
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async_b, &ia_b), DAT_SUCCESS);
	if (check_failed)
		return check_summary("test_read_sink_wire");
	CHECK_RC(dat_pz_create(ia_a, &pz_a), DAT_SUCCESS);
	CHECK_RC(dat_pz_create(ia_b, &pz_b), DAT_SUCCESS);
	DAT_LMR_CONTEXT lc_sink = 0, lc_source = 0;
	DAT_RMR_CONTEXT rc_source = 0;
	DAT_LMR_HANDLE lmr_sink = lmr_make(ia_a, pz_a, sink, BUF,
					   DAT_MEM_PRIV_LOCAL_READ_FLAG | DAT_MEM_PRIV_LOCAL_WRITE_FLAG, &lc_sink, NULL);
	DAT_LMR_HANDLE lmr_source = lmr_make(ia_b, pz_b, source, BUF, DAT_MEM_PRIV_ALL_FLAG, &lc_source, &rc_source);
	side_evds(&A, ia_a, pz_a);
	side_evds(&B, ia_b, pz_b);
	DAT_EP_ATTR attr = ep_attr(0, 0, 16);
	side_ep(&A, &attr);
	side_ep(&B, &attr);
	if (check_failed || !connect_pair(&A, &B))
		return check_summary("test_read_sink_wire");
	printf("sink %08x %016llx %d\n", (unsigned)lc_sink, (unsigned long long)(uintptr_t)sink, BUF);
	printf("source %08x %016llx\n", (unsigned)rc_source, (unsigned long long)(uintptr_t)source);

	for (int i = 0; i < BUF; i++)
		source[i] = (char)(i * 7 + 1);
	/* one segment, 4 KiB */
	DAT_LMR_TRIPLET one = seg(lc_sink, sink, 4096);
	DAT_RMR_TRIPLET from = rseg(rc_source, source, 4096);
	CHECK_RC(dat_ep_post_rdma_read(A.ep, 1, &one, ck(1), &from, DAT_COMPLETION_DEFAULT_FLAG), DAT_SUCCESS);
	expect_dto(A.req, A.ep, 1, DAT_DTO_SUCCESS, 4096, DAT_DTO_RDMA_READ, "one-segment read");
	CHECK(memcmp(sink, source, 4096) == 0, "one-segment read: the bytes");
	/* two segments, 100 B each, out of order in the sink */
	DAT_LMR_TRIPLET two[2] = { seg(lc_sink, sink + 6000, 100), seg(lc_sink, sink + 5000, 100) };
	DAT_RMR_TRIPLET from2 = rseg(rc_source, source + 4096, 200);
	CHECK_RC(dat_ep_post_rdma_read(A.ep, 2, two, ck(2), &from2, DAT_COMPLETION_DEFAULT_FLAG), DAT_SUCCESS);
	expect_dto(A.req, A.ep, 2, DAT_DTO_SUCCESS, 200, DAT_DTO_RDMA_READ, "two-segment read");
	CHECK(memcmp(sink + 6000, source + 4096, 100) == 0 && memcmp(sink + 5000, source + 4196, 100) == 0,
	      "two-segment read: the bytes, in segment order");

	CHECK(disconnect_pair(&A, &B), "disconnect");
	side_free_ep(&A);
	side_free_ep(&B);
	side_free_evds(&A);
	side_free_evds(&B);
	CHECK_RC(dat_lmr_free(lmr_sink), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_source), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz_a), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz_b), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia_a, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia_b, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	check_no_sigpipe();
	return check_summary("test_read_sink_wire");
}
