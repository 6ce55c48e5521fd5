/* A shared receive queue feeding two connections (the same behaviour on every
 * backend): receives posted to the SRQ are taken in posting order by
 * whichever EP a send arrives on, each completes exactly once on that EP's
 * receive EVD with the right EP handle, length and bytes; dat_srq_query
 * counts what is still posted; dat_ep_post_recv on an SRQ EP is refused; the
 * SRQ cannot be freed while an EP uses it. Two IAs in one process of the IA
 * $DAT_TEST_IA (default rs-tcp); every wait has a timeout. */
#include <dat2/udat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "dto_pair.h"

#define BUF 65536
static char abuf[BUF], bbuf[BUF];

int main(void)
{
	DAT_IA_HANDLE ia_a, ia_b;
	DAT_PZ_HANDLE pz_a, pz_b;
	DAT_LMR_CONTEXT lc_a, lc_b;
	DAT_LMR_HANDLE lmr_a, lmr_b;
	DAT_SRQ_HANDLE srq = DAT_HANDLE_NULL;
	struct side A1, A2, B1, B2;
	DAT_EVD_HANDLE async_a = DAT_HANDLE_NULL, async_b = DAT_HANDLE_NULL;

	setvbuf(stdout, NULL, _IONBF, 0);
	alarm(100); /* a hang fails the test rather than the run */
	catch_sigpipe();
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async_a, &ia_a), DAT_SUCCESS);
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async_b, &ia_b), DAT_SUCCESS);
	if (check_failed)
		return check_summary("test_srq");
	CHECK_RC(dat_pz_create(ia_a, &pz_a), DAT_SUCCESS);
	CHECK_RC(dat_pz_create(ia_b, &pz_b), DAT_SUCCESS);
	lmr_a = lmr_make(ia_a, pz_a, abuf, BUF, DAT_MEM_PRIV_ALL_FLAG, &lc_a, NULL);
	lmr_b = lmr_make(ia_b, pz_b, bbuf, BUF, DAT_MEM_PRIV_ALL_FLAG, &lc_b, NULL);
	side_evds(&A1, ia_a, pz_a);
	side_evds(&A2, ia_a, pz_a);
	side_evds(&B1, ia_b, pz_b);
	side_evds(&B2, ia_b, pz_b);

	DAT_SRQ_ATTR sa = { .max_recv_dtos = 16, .max_recv_iov = 2, .low_watermark = 0 };
	CHECK_RC(dat_srq_create(ia_b, pz_b, &sa, &srq), DAT_SUCCESS);
	if (check_failed)
		return check_summary("test_srq");
	DAT_EP_ATTR attr = ep_attr(0, 0, 16);
	side_ep(&A1, &attr);
	side_ep(&A2, &attr);
	CHECK_RC(dat_ep_create_with_srq(ia_b, pz_b, B1.rcv, B1.req, B1.conn, srq, &attr, &B1.ep), DAT_SUCCESS);
	CHECK_RC(dat_ep_create_with_srq(ia_b, pz_b, B2.rcv, B2.req, B2.conn, srq, &attr, &B2.ep), DAT_SUCCESS);

	/* four receives, posted before any connection exists */
	for (int i = 0; i < 4; i++) {
		DAT_LMR_TRIPLET r = seg(lc_b, bbuf + 1024 * i, 64);
		CHECK_RC(dat_srq_post_recv(srq, 1, &r, ck(0x100 + i)), DAT_SUCCESS);
	}
	DAT_SRQ_PARAM sp;
	memset(&sp, 0, sizeof(sp));
	CHECK_RC(dat_srq_query(srq, DAT_SRQ_FIELD_ALL, &sp), DAT_SUCCESS);
	CHECK(sp.available_dto_count == 4, "posted receives: %d, want 4", (int)sp.available_dto_count);
	{
		DAT_LMR_TRIPLET r = seg(lc_b, bbuf + 8192, 64);
		CHECK_TYPE(dat_ep_post_recv(B1.ep, 1, &r, ck(0x1ff), 0), DAT_INVALID_STATE);
	}
	CHECK_TYPE(dat_srq_free(srq), DAT_INVALID_STATE);

	if (!connect_pair(&A1, &B1) || !connect_pair(&A2, &B2))
		return check_summary("test_srq");

	/* A2 sends first, then A1, then A2 again: the SRQ's receives are taken in order */
	struct {
		struct side *from, *to;
		const char *msg;
	} sends[3] = { { &A2, &B2, "second-ep-first!" }, { &A1, &B1, "first-ep-second!" }, { &A2, &B2, "second-ep-third!" } };
	for (int i = 0; i < 3; i++) {
		memcpy(abuf + 4096 * (i + 1), sends[i].msg, 16);
		DAT_LMR_TRIPLET s = seg(lc_a, abuf + 4096 * (i + 1), 16);
		CHECK_RC(dat_ep_post_send(sends[i].from->ep, 1, &s, ck(0x200 + i), 0), DAT_SUCCESS);
		expect_dto(sends[i].from->req, sends[i].from->ep, 0x200 + i, DAT_DTO_SUCCESS, 16, DAT_DTO_SEND,
			   "send to the SRQ");
		expect_dto(sends[i].to->rcv, sends[i].to->ep, 0x100 + i, DAT_DTO_SUCCESS, 16, DAT_DTO_RECEIVE,
			   "receive from the SRQ");
		CHECK(memcmp(bbuf + 1024 * i, sends[i].msg, 16) == 0, "receive %d holds '%.16s'", i, bbuf + 1024 * i);
	}
	expect_empty(B1.rcv, "one receive on the first EP");
	expect_empty(B2.rcv, "two receives on the second EP");
	memset(&sp, 0, sizeof(sp));
	CHECK_RC(dat_srq_query(srq, DAT_SRQ_FIELD_ALL, &sp), DAT_SUCCESS);
	CHECK(sp.available_dto_count == 1, "posted receives after three sends: %d, want 1",
	      (int)sp.available_dto_count);

	disconnect_pair(&A1, &B1);
	disconnect_pair(&A2, &B2);
	side_free_ep(&A1);
	side_free_ep(&A2);
	side_free_ep(&B1);
	side_free_ep(&B2);
	CHECK_RC(dat_srq_free(srq), DAT_SUCCESS);
	side_free_evds(&A1);
	side_free_evds(&A2);
	side_free_evds(&B1);
	side_free_evds(&B2);
	CHECK_RC(dat_lmr_free(lmr_a), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_b), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz_a), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz_b), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia_a, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia_b, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	check_no_sigpipe();
	return check_summary("test_srq");
}
