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
	struct side A = { 0 }, B = { 0 };
	if (!open_pair(&A, &B, 16))
		return check_summary("test_read_sink_wire");
	DAT_LMR_CONTEXT lc_sink = 0, lc_source = 0;
	DAT_RMR_CONTEXT rc_source = 0;
	DAT_LMR_HANDLE lmr_sink = lmr_make(A.ia, A.pz, sink, BUF,
					   DAT_MEM_PRIV_LOCAL_READ_FLAG | DAT_MEM_PRIV_LOCAL_WRITE_FLAG, &lc_sink, NULL);
	DAT_LMR_HANDLE lmr_source = lmr_make(B.ia, B.pz, source, BUF, DAT_MEM_PRIV_ALL_FLAG, &lc_source, &rc_source);
	if (check_failed)
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

	CHECK_RC(dat_lmr_free(lmr_sink), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_source), DAT_SUCCESS);
	close_pair(&A, &B);
	check_no_sigpipe();
	return check_summary("test_read_sink_wire");
}
