/* A shared receive queue feeding two connections (the same behaviour on every
 * backend): receives posted to the SRQ are taken in posting order by
 * whichever EP a send arrives on, each completes exactly once on that EP's
 * receive EVD with the right EP handle, length and bytes; dat_srq_query
 * counts what is still posted; dat_ep_post_recv on an SRQ EP is refused; the
 * SRQ cannot be freed while an EP uses it. Two IAs in one process of the IA
 * $DAT_TEST_IA (default rs-tcp); every wait has a timeout.
 *
 * The low watermark (dat_srq_set_lw, dat_srq_create's low_watermark): one
 * asynchronous event on the IA's async EVD, naming the SRQ with reason
 * DAT_SRQ_LOW_WATERMARK_EVENT, the first time fewer receives are posted than
 * the watermark; none again until the watermark is set again. Following the
 * man page's description ("This can occur during the current call"), setting
 * a watermark above the posted count raises the event during the call (its
 * usage paragraph says the opposite, "below the current number", which
 * contradicts the event's own rule; we follow the rule). Creating an SRQ
 * with a nonzero watermark raises it at once: nothing is posted yet.
 *
 * What Debian's dtestsrq relies on: an EP using an SRQ reports
 * DAT_ASYNC_ERROR_EP_BROKEN with its handle on the async EVD when its
 * connection ends (verbs' "last WQE reached", as OFED's provider reports
 * it), queued before the connection event; and the provider attribute
 * DAT_IB_TRANSPORT_MTU, which sizes its messages. */
#include <dat2/udat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "dto_pair.h"

#define BUF 65536
static char abuf[BUF], bbuf[BUF];

/* Dequeues one event that must already be on `evd`: an asynchronous error
 * event `number` naming `handle` with `reason`. */
static void expect_async_now(DAT_EVD_HANDLE evd, DAT_EVENT_NUMBER number, DAT_HANDLE handle, DAT_COUNT reason,
			     const char *what)
{
	DAT_EVENT ev;
	memset(&ev, 0, sizeof(ev));
	DAT_RETURN rc = dat_evd_dequeue(evd, &ev);
	CHECK(rc == DAT_SUCCESS, "%s: no event queued (dat_evd_dequeue = %#x)", what, (unsigned)rc);
	if (rc != DAT_SUCCESS)
		return;
	const DAT_ASYNCH_ERROR_EVENT_DATA *d = &ev.event_data.asynch_error_event_data;
	CHECK(ev.event_number == number && d->dat_handle == handle && d->reason == reason,
	      "%s: event %#x handle %p reason %d; want event %#x handle %p reason %d", what, ev.event_number,
	      (void *)d->dat_handle, (int)d->reason, number, (void *)handle, (int)reason);
}

/* The SRQ low-watermark event: number DAT_ASYNC_ERROR_EP_BROKEN (DAT gives
 * the event no number of its own; the one OFED's provider gives the verbs SRQ
 * limit event), the SRQ's handle, reason DAT_SRQ_LOW_WATERMARK_EVENT. */
static void expect_lw_event(DAT_EVD_HANDLE async, DAT_SRQ_HANDLE srq, const char *what)
{
	expect_async_now(async, DAT_ASYNC_ERROR_EP_BROKEN, srq, DAT_SRQ_LOW_WATERMARK_EVENT, what);
}

/* One send from `from` taken from the SRQ by `to` (cookie `rcookie`). */
static void send_one(struct side *from, struct side *to, DAT_LMR_CONTEXT lc_a, uint64_t scookie, uint64_t rcookie,
		     const char *what)
{
	DAT_LMR_TRIPLET s = seg(lc_a, abuf + 20000, 16);
	CHECK_RC(dat_ep_post_send(from->ep, 1, &s, ck(scookie), 0), DAT_SUCCESS);
	expect_dto(from->req, from->ep, scookie, DAT_DTO_SUCCESS, 16, DAT_DTO_SEND, what);
	expect_dto(to->rcv, to->ep, rcookie, DAT_DTO_SUCCESS, 16, DAT_DTO_RECEIVE, what);
}

/* DAT_IB_TRANSPORT_MTU is reported, a number, and the attribute array a
 * query returns stays where it was for the next query (the caller keeps the
 * pointers while the IA is open); DAT_IB_UD, where reported, says TRUE (the
 * datagram service, test_ud.c). */
static void provider_attrs(DAT_IA_HANDLE ia)
{
	DAT_EVD_HANDLE async = DAT_HANDLE_NULL;
	DAT_IA_ATTR ia_attr;
	DAT_PROVIDER_ATTR pr, pr2;
	memset(&pr, 0, sizeof(pr));
	memset(&pr2, 0, sizeof(pr2));
	CHECK_RC(dat_ia_query(ia, &async, 0, &ia_attr, DAT_PROVIDER_FIELD_PROVIDER_SPECIFIC_ATTR, &pr), DAT_SUCCESS);
	CHECK_RC(dat_ia_query(ia, &async, 0, &ia_attr, DAT_PROVIDER_FIELD_PROVIDER_SPECIFIC_ATTR, &pr2), DAT_SUCCESS);
	CHECK(pr.num_provider_specific_attr > 0 && pr.provider_specific_attr == pr2.provider_specific_attr &&
		      pr.num_provider_specific_attr == pr2.num_provider_specific_attr,
	      "provider attributes: %d at %p, then %d at %p", (int)pr.num_provider_specific_attr,
	      (void *)pr.provider_specific_attr, (int)pr2.num_provider_specific_attr,
	      (void *)pr2.provider_specific_attr);
	int mtu = 0, ud = 0;
	for (int i = 0; i < pr.num_provider_specific_attr; i++) {
		const char *n = pr.provider_specific_attr[i].name, *v = pr.provider_specific_attr[i].value;
		CHECK(n != NULL && v != NULL, "provider attribute %d: name %p value %p", i, (void *)n, (void *)v);
		if (n == NULL || v == NULL)
			continue;
		if (!strcmp(n, "DAT_IB_TRANSPORT_MTU"))
			mtu = atoi(v);
		if (!strcmp(n, "DAT_IB_UD"))
			ud = strcmp(v, "TRUE") ? -1 : 1;
	}
	/* 256 is the smallest InfiniBand MTU, 576 the smallest IPv4 one */
	CHECK(mtu >= 256, "DAT_IB_TRANSPORT_MTU = %d", mtu);
	CHECK(ud >= 0, "DAT_IB_UD reported, not TRUE");
}

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

	provider_attrs(ia_b);

	/* created with a watermark and nothing posted: the event comes at once */
	{
		DAT_SRQ_HANDLE lw_srq = DAT_HANDLE_NULL;
		DAT_SRQ_ATTR la = { .max_recv_dtos = 4, .max_recv_iov = 1, .low_watermark = 5 };
		CHECK_TYPE(dat_srq_create(ia_b, pz_b, &la, &lw_srq), DAT_INVALID_PARAMETER);
		la.low_watermark = 2;
		CHECK_RC(dat_srq_create(ia_b, pz_b, &la, &lw_srq), DAT_SUCCESS);
		expect_lw_event(async_b, lw_srq, "SRQ created with low_watermark 2");
		expect_empty(async_b, "one event per setting");
		CHECK_RC(dat_srq_free(lw_srq), DAT_SUCCESS);
	}

	DAT_SRQ_ATTR sa = { .max_recv_dtos = 16, .max_recv_iov = 2, .low_watermark = 0 };
	CHECK_RC(dat_srq_create(ia_b, pz_b, &sa, &srq), DAT_SUCCESS);
	if (check_failed)
		return check_summary("test_srq");
	expect_empty(async_b, "SRQ created with DAT_SRQ_LW_DEFAULT");
	DAT_EP_ATTR attr = ep_attr(0, 0, 16);
	side_ep(&A1, &attr);
	side_ep(&A2, &attr);
	CHECK_RC(dat_ep_create_with_srq(ia_b, pz_b, B1.rcv, B1.req, B1.conn, srq, &attr, &B1.ep), DAT_SUCCESS);
	CHECK_RC(dat_ep_create_with_srq(ia_b, pz_b, B2.rcv, B2.req, B2.conn, srq, &attr, &B2.ep), DAT_SUCCESS);

	/* a count far above the SRQ's IOV limit is refused before the one-triplet array is read */
	{
		DAT_LMR_TRIPLET one = seg(lc_b, bbuf, 64);
		DAT_RETURN rc = dat_srq_post_recv(srq, 1 << 30, &one, ck(0xff));
		CHECK(DAT_GET_TYPE(rc) == DAT_INVALID_PARAMETER, "dat_srq_post_recv(1 << 30 segments) = %#x",
		      (unsigned)rc);
	}
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

	/* a watermark of 3 with 4 posted: armed, nothing yet */
	CHECK_TYPE(dat_srq_set_lw(srq, 17), DAT_INVALID_PARAMETER);
	CHECK_RC(dat_srq_set_lw(srq, 3), DAT_SUCCESS);
	expect_empty(async_b, "low watermark 3, 4 receives posted");
	memset(&sp, 0, sizeof(sp));
	CHECK_RC(dat_srq_query(srq, DAT_SRQ_FIELD_ALL, &sp), DAT_SUCCESS);
	CHECK(sp.low_watermark == 3, "low_watermark: %d, want 3", (int)sp.low_watermark);

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
		/* Posted after each: 3 (not below 3), 2 (below: the event, queued
		 * before the receive's completion), 1 (disarmed: nothing). */
		if (i == 1)
			expect_lw_event(async_b, srq, "2 receives left, low watermark 3");
		expect_empty(async_b, i == 0 ? "3 receives left, low watermark 3" : "no second low-watermark event");
	}
	expect_empty(B1.rcv, "one receive on the first EP");
	expect_empty(B2.rcv, "two receives on the second EP");
	memset(&sp, 0, sizeof(sp));
	CHECK_RC(dat_srq_query(srq, DAT_SRQ_FIELD_ALL, &sp), DAT_SUCCESS);
	CHECK(sp.available_dto_count == 1, "posted receives after three sends: %d, want 1",
	      (int)sp.available_dto_count);

	/* set again: above the posted count it fires during the call; at or below
	 * it, it waits for a receive to be consumed */
	CHECK_RC(dat_srq_set_lw(srq, 2), DAT_SUCCESS);
	expect_lw_event(async_b, srq, "low watermark 2 set with 1 receive posted");
	expect_empty(async_b, "once per setting");
	CHECK_RC(dat_srq_set_lw(srq, 1), DAT_SUCCESS);
	expect_empty(async_b, "low watermark 1 set with 1 receive posted");
	{
		DAT_LMR_TRIPLET r = seg(lc_b, bbuf + 1024 * 4, 64);
		CHECK_RC(dat_srq_post_recv(srq, 1, &r, ck(0x104)), DAT_SUCCESS);
	}
	send_one(&A1, &B1, lc_a, 0x210, 0x103, "fourth send");
	expect_empty(async_b, "1 receive left, low watermark 1");
	send_one(&A2, &B2, lc_a, 0x211, 0x104, "fifth send");
	expect_lw_event(async_b, srq, "no receive left, low watermark 1");
	expect_empty(async_b, "once per setting, after the fifth send");
	CHECK_RC(dat_srq_set_lw(srq, 0), DAT_SUCCESS);
	expect_empty(async_b, "DAT_SRQ_LW_DEFAULT never fires");

	/* an SRQ EP's connection ends: EP_BROKEN naming it, before DISCONNECTED;
	 * EPs without an SRQ report nothing */
	disconnect_pair(&A1, &B1);
	expect_async_now(async_b, DAT_ASYNC_ERROR_EP_BROKEN, B1.ep, DAT_EP_TRANSFER_TO_ERROR,
			 "first SRQ EP disconnected");
	expect_empty(async_b, "one event for the first SRQ EP");
	disconnect_pair(&A2, &B2);
	expect_async_now(async_b, DAT_ASYNC_ERROR_EP_BROKEN, B2.ep, DAT_EP_TRANSFER_TO_ERROR,
			 "second SRQ EP disconnected");
	expect_empty(async_b, "one event for the second SRQ EP");
	expect_empty(async_a, "EPs without an SRQ disconnected");
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
