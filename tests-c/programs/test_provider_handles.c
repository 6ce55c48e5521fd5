/* Our provider ($DAT_TEST_IA, default rs-tcp) through our libdat2: for
 * every object type, NULL, freed and wrong-type handles give
 * DAT_INVALID_HANDLE with the object's subtype and never crash; and the
 * "in use" rules of DAT 2.0 hold. */
#include <dat2/udat.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"

/* DAT_GET_TYPE(expr) is TYPE. */
#define CHECK_TYPE_OF(expr, type)                                                                   \
	do {                                                                                        \
		DAT_RETURN rc_ = (expr);                                                            \
		CHECK(DAT_GET_TYPE(rc_) == (type), "%s = %#x, want type %#x", #expr, (unsigned)rc_, \
		      (unsigned)(type));                                                            \
	} while (0)

#define BADH(sub) ERRCODE(DAT_INVALID_HANDLE, sub)
#define INUSE(sub) ERRCODE(DAT_INVALID_STATE, sub)

static DAT_IA_HANDLE ia;
static DAT_EVD_HANDLE async_evd;

static DAT_EVD_HANDLE evd(DAT_EVD_FLAGS flags)
{
	DAT_EVD_HANDLE e = DAT_HANDLE_NULL;
	CHECK_RC(dat_evd_create(ia, 8, DAT_HANDLE_NULL, flags, &e), DAT_SUCCESS);
	return e;
}

static void freed_and_wrong_type(void)
{
	DAT_PZ_HANDLE pz, pz2;
	DAT_EP_HANDLE ep;
	DAT_EVD_HANDLE dto, conn, cr;
	DAT_CNO_HANDLE cno;
	DAT_LMR_HANDLE lmr;
	DAT_RMR_HANDLE rmr;
	DAT_PSP_HANDLE psp;
	DAT_RSP_HANDLE rsp;
	DAT_SRQ_HANDLE srq;
	DAT_LMR_CONTEXT lctx;
	DAT_RMR_CONTEXT rctx;
	DAT_VLEN rlen;
	DAT_VADDR raddr;
	DAT_REGION_DESCRIPTION region;
	DAT_CONTEXT cookie = { 0 };
	DAT_EVENT event;
	DAT_SRQ_ATTR srq_attr = { .max_recv_dtos = 4, .max_recv_iov = 1, .low_watermark = 0 };
	DAT_CONN_QUAL qual;
	DAT_HANDLE_TYPE type;
	DAT_PZ_PARAM pz_param;
	static char buf[4096];

	CHECK_RC(dat_pz_create(ia, &pz), DAT_SUCCESS);
	CHECK_RC(dat_pz_create(ia, &pz2), DAT_SUCCESS);
	dto = evd(DAT_EVD_DTO_FLAG);
	conn = evd(DAT_EVD_CONNECTION_FLAG);
	cr = evd(DAT_EVD_CR_FLAG);
	CHECK_RC(dat_cno_create(ia, DAT_OS_WAIT_PROXY_AGENT_NULL, &cno), DAT_SUCCESS);
	region.for_va = buf;
	CHECK_RC(dat_lmr_create(ia, DAT_MEM_TYPE_VIRTUAL, region, sizeof(buf), pz, DAT_MEM_PRIV_ALL_FLAG, DAT_VA_TYPE_VA,
				&lmr, &lctx, &rctx, &rlen, &raddr),
		 DAT_SUCCESS);
	/* An IA without RMRs (max_rmrs 0: an iWARP device without memory windows,
	 * e.g. soft-iWARP) refuses to create one, DAT_INSUFFICIENT_RESOURCES as any
	 * object past its IA's maximum; the CR EVD stands in for the RMR in the
	 * wrong-type checks below. */
	DAT_IA_ATTR ia_attr;
	DAT_PROVIDER_ATTR pr_attr;
	DAT_EVD_HANDLE ia_async;
	CHECK_RC(dat_ia_query(ia, &ia_async, DAT_IA_FIELD_ALL, &ia_attr, DAT_PROVIDER_FIELD_ALL, &pr_attr), DAT_SUCCESS);
	int no_rmrs = ia_attr.max_rmrs == 0;
	if (no_rmrs) {
		printf("SKIP RMR handle checks: %s has no RMRs (max_rmrs 0)\n", dat_test_ia());
		CHECK_TYPE_OF(dat_rmr_create(pz, &rmr), DAT_INSUFFICIENT_RESOURCES);
		rmr = cr;
	} else {
		CHECK_RC(dat_rmr_create(pz, &rmr), DAT_SUCCESS);
	}
	CHECK_RC(dat_ep_create(ia, pz, dto, dto, conn, NULL, &ep), DAT_SUCCESS);
	CHECK_RC(dat_psp_create_any(ia, &qual, cr, DAT_PSP_CONSUMER_FLAG, &psp), DAT_SUCCESS);
	CHECK(qual > 0 && qual < 65536, "psp_create_any picked TCP port %llu", (unsigned long long)qual);
	CHECK_RC(dat_srq_create(ia, pz2, &srq_attr, &srq), DAT_SUCCESS);

	/* dat_ia_open's async EVD, when given, must be a live ASYNC EVD: an
	 * RMR, a DTO EVD or a freed one is refused (issue 23); the IA's own
	 * async EVD may serve a second IA too */
	{
		DAT_IA_HANDLE ia2;
		DAT_EVD_HANDLE given = rmr;
		CHECK_RC(dat_ia_open(dat_test_ia(), 8, &given, &ia2), BADH(DAT_INVALID_HANDLE_EVD_ASYNC));
		given = dto;
		CHECK_RC(dat_ia_open(dat_test_ia(), 8, &given, &ia2), BADH(DAT_INVALID_HANDLE_EVD_ASYNC));
		given = async_evd;
		CHECK_RC(dat_ia_open(dat_test_ia(), 8, &given, &ia2), DAT_SUCCESS);
		CHECK(given == async_evd, "the given async EVD stays the IA's");
		CHECK_RC(dat_ia_close(ia2, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	}

	/* wrong type: each call given a live handle of another type */
	CHECK_RC(dat_ep_post_send(pz, 0, NULL, cookie, 0), BADH(DAT_INVALID_HANDLE_EP));
	CHECK_RC(dat_ep_free(lmr), BADH(DAT_INVALID_HANDLE_EP));
	CHECK_RC(dat_pz_free(ep), BADH(DAT_INVALID_HANDLE_PZ));
	CHECK_RC(dat_lmr_free(rmr), BADH(DAT_INVALID_HANDLE_LMR));
	CHECK_RC(dat_rmr_free(lmr), BADH(DAT_INVALID_HANDLE_RMR));
	CHECK_RC(dat_evd_dequeue(cno, &event), BADH(DAT_INVALID_HANDLE_EVD_REQUEST));
	CHECK_RC(dat_cno_free(dto), BADH(DAT_INVALID_HANDLE_CNO));
	CHECK_RC(dat_psp_free(ep), BADH(DAT_INVALID_HANDLE_PSP));
	CHECK_RC(dat_rsp_free(psp), BADH(DAT_INVALID_HANDLE_RSP));
	CHECK_RC(dat_cr_reject(ep, 0, NULL), BADH(DAT_INVALID_HANDLE_CR));
	CHECK_RC(dat_srq_free(pz), BADH(DAT_INVALID_HANDLE_SRQ));
	CHECK_RC(dat_pz_query(ia, DAT_PZ_FIELD_ALL, &pz_param), BADH(DAT_INVALID_HANDLE_PZ));
	CHECK_RC(dat_get_handle_type(srq, &type), DAT_SUCCESS);
	CHECK(type == DAT_HANDLE_TYPE_SRQ, "SRQ handle type %u", type);
	CHECK_RC(dat_get_handle_type(ia, &type), DAT_SUCCESS);
	CHECK(type == DAT_HANDLE_TYPE_IA, "IA handle type %u", type);

	/* in-use rules */
	CHECK_RC(dat_pz_free(pz), INUSE(DAT_INVALID_STATE_PZ_IN_USE));
	CHECK_RC(dat_evd_free(conn), INUSE(DAT_INVALID_STATE_EVD_IN_USE));
	CHECK_RC(dat_evd_free(cr), INUSE(DAT_INVALID_STATE_EVD_IN_USE));
	CHECK_RC(dat_pz_free(pz2), INUSE(DAT_INVALID_STATE_PZ_IN_USE));
	{
		DAT_EVD_HANDLE with_cno;
		CHECK_RC(dat_evd_create(ia, 8, cno, DAT_EVD_DTO_FLAG, &with_cno), DAT_SUCCESS);
		CHECK_RC(dat_cno_free(cno), INUSE(DAT_INVALID_STATE_CNO_IN_USE));
		CHECK_RC(dat_evd_free(with_cno), DAT_SUCCESS);
	}
	CHECK_RC(dat_ia_close(ia, DAT_CLOSE_GRACEFUL_FLAG), INUSE(DAT_INVALID_STATE_IA_IN_USE));

	/* free everything, in an order the rules allow */
	CHECK_RC(dat_psp_free(psp), DAT_SUCCESS);
	CHECK_RC(dat_ep_free(ep), DAT_SUCCESS);
	if (!no_rmrs)
		CHECK_RC(dat_rmr_free(rmr), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr), DAT_SUCCESS);
	CHECK_RC(dat_srq_free(srq), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz2), DAT_SUCCESS);
	CHECK_RC(dat_evd_free(dto), DAT_SUCCESS);
	CHECK_RC(dat_evd_free(conn), DAT_SUCCESS);
	CHECK_RC(dat_evd_free(cr), DAT_SUCCESS);
	CHECK_RC(dat_cno_free(cno), DAT_SUCCESS);

	/* freed handles: every call on them is refused, nothing crashes */
	CHECK_RC(dat_ep_post_send(ep, 0, NULL, cookie, 0), BADH(DAT_INVALID_HANDLE_EP));
	CHECK_RC(dat_ep_free(ep), BADH(DAT_INVALID_HANDLE_EP));
	CHECK_RC(dat_pz_free(pz), BADH(DAT_INVALID_HANDLE_PZ));
	CHECK_RC(dat_lmr_free(lmr), BADH(DAT_INVALID_HANDLE_LMR));
	CHECK_RC(dat_rmr_free(rmr), BADH(DAT_INVALID_HANDLE_RMR));
	CHECK_RC(dat_evd_dequeue(dto, &event), BADH(DAT_INVALID_HANDLE_EVD_REQUEST));
	CHECK_RC(dat_cno_free(cno), BADH(DAT_INVALID_HANDLE_CNO));
	CHECK_RC(dat_psp_free(psp), BADH(DAT_INVALID_HANDLE_PSP));
	CHECK_RC(dat_srq_free(srq), BADH(DAT_INVALID_HANDLE_SRQ));
	CHECK_RC(dat_get_handle_type(ep, &type), BADH(DAT_INVALID_HANDLE1));

	/* an RSP needs an EP of its own; freeing it frees the reservation */
	CHECK_RC(dat_pz_create(ia, &pz), DAT_SUCCESS);
	dto = evd(DAT_EVD_DTO_FLAG);
	conn = evd(DAT_EVD_CONNECTION_FLAG);
	cr = evd(DAT_EVD_CR_FLAG);
	CHECK_RC(dat_ep_create(ia, pz, dto, dto, conn, NULL, &ep), DAT_SUCCESS);
	CHECK_RC(dat_rsp_create(ia, qual, ep, cr, &rsp), DAT_SUCCESS);
	CHECK_RC(dat_rsp_free(rsp), DAT_SUCCESS);
	CHECK_RC(dat_rsp_free(rsp), BADH(DAT_INVALID_HANDLE_RSP));
	/* abrupt close tears all of it down */
	CHECK_RC(dat_ia_close(ia, DAT_CLOSE_ABRUPT_FLAG), DAT_SUCCESS);
	CHECK_RC(dat_ep_free(ep), BADH(DAT_INVALID_HANDLE_EP));
	CHECK_RC(dat_pz_free(pz), BADH(DAT_INVALID_HANDLE_PZ));
	CHECK_RC(dat_evd_free(dto), BADH(DAT_INVALID_HANDLE_EVD_REQUEST));
	CHECK_RC(dat_ia_close(ia, DAT_CLOSE_ABRUPT_FLAG), BADH(DAT_INVALID_HANDLE_IA));
}

/* A freed handle stays dead however many objects of its type come after
 * it (issue 23: freed EP handles named new EPs after 4,096 cycles, IA
 * handles after 256 opens of a slot). Each value is new, not just unused:
 * the stale one is refused all along and at the end. */
#define STALE_CYCLES 10000
#define STALE_IA_CYCLES 300
static void stale_handles_stay_dead(void)
{
	DAT_IA_HANDLE ia2, stale_ia;
	DAT_PZ_HANDLE pz, stale_pz;
	DAT_EVD_HANDLE dto, conn, evd_h = DAT_HANDLE_NULL;
	DAT_EP_HANDLE ep, stale_ep;
	DAT_CONTEXT cookie = { 0 };
	DAT_HANDLE_TYPE type;
	DAT_PZ_PARAM pz_param;
	int aliased = 0, revived = 0;

	CHECK_RC(dat_pz_create(ia, &pz), DAT_SUCCESS);
	dto = evd(DAT_EVD_DTO_FLAG);
	conn = evd(DAT_EVD_CONNECTION_FLAG);
	CHECK_RC(dat_ep_create(ia, pz, dto, dto, conn, NULL, &stale_ep), DAT_SUCCESS);
	CHECK_RC(dat_ep_free(stale_ep), DAT_SUCCESS);
	CHECK_RC(dat_pz_create(ia, &stale_pz), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(stale_pz), DAT_SUCCESS);
	for (int i = 0; i < STALE_CYCLES; i++) {
		DAT_PZ_HANDLE p;
		if (dat_ep_create(ia, pz, dto, dto, conn, NULL, &ep) || dat_pz_create(ia, &p)) {
			CHECK(0, "EP/PZ creation %d failed", i);
			break;
		}
		aliased += ep == stale_ep || p == stale_pz;
		revived += dat_get_handle_type(stale_ep, &type) == DAT_SUCCESS ||
			   dat_pz_query(stale_pz, DAT_PZ_FIELD_ALL, &pz_param) == DAT_SUCCESS;
		if (dat_ep_free(ep) || dat_pz_free(p)) {
			CHECK(0, "EP/PZ free %d failed", i);
			break;
		}
	}
	CHECK(aliased == 0, "%d of %d new EPs/PZs got a freed handle's value", aliased, STALE_CYCLES);
	CHECK(revived == 0, "a freed EP/PZ handle worked again %d times", revived);
	CHECK_RC(dat_ep_post_send(stale_ep, 0, NULL, cookie, 0), BADH(DAT_INVALID_HANDLE_EP));
	CHECK_RC(dat_ep_free(stale_ep), BADH(DAT_INVALID_HANDLE_EP));
	CHECK_RC(dat_pz_free(stale_pz), BADH(DAT_INVALID_HANDLE_PZ));

	/* IA handles: the same slot reopened, one IA kept open throughout */
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &evd_h, &stale_ia), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(stale_ia, DAT_CLOSE_ABRUPT_FLAG), DAT_SUCCESS);
	aliased = 0;
	for (int i = 0; i < STALE_IA_CYCLES; i++) {
		evd_h = DAT_HANDLE_NULL;
		if (dat_ia_open(dat_test_ia(), 8, &evd_h, &ia2) || dat_ia_close(ia2, DAT_CLOSE_ABRUPT_FLAG)) {
			CHECK(0, "IA open/close %d failed", i);
			break;
		}
		aliased += ia2 == stale_ia;
	}
	CHECK(aliased == 0, "%d of %d IAs opened got a closed IA's handle", aliased, STALE_IA_CYCLES);
	CHECK_RC(dat_ia_close(stale_ia, DAT_CLOSE_ABRUPT_FLAG), BADH(DAT_INVALID_HANDLE_IA));

	CHECK_RC(dat_evd_free(dto), DAT_SUCCESS);
	CHECK_RC(dat_evd_free(conn), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz), DAT_SUCCESS);
}

int main(void)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	async_evd = DAT_HANDLE_NULL;
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async_evd, &ia), DAT_SUCCESS);
	if (check_failed)
		return check_summary("test_provider_handles");
	freed_and_wrong_type();
	async_evd = DAT_HANDLE_NULL;
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async_evd, &ia), DAT_SUCCESS);
	stale_handles_stay_dead();
	CHECK_RC(dat_ia_close(ia, DAT_CLOSE_ABRUPT_FLAG), DAT_SUCCESS);
	/* a graceful close of an IA with nothing left succeeds */
	async_evd = DAT_HANDLE_NULL;
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async_evd, &ia), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	return check_summary("test_provider_handles");
}
