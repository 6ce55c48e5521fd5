/* An RDMA device removed under open IAs (issue 38): run by verbs-guest.sh, which
 * deletes the device (`rdma link delete`) once this program prints "ready" and adds
 * it back afterwards. Two IAs of $DAT_TEST_IA in one process, an EP of each connected
 * to the other, receives posted on both and RDMA reads kept in flight from A. Then:
 * each IA's async EVD reports DAT_ASYNC_ERROR_IA_CATASTROPHIC; both connections end
 * (BROKEN, or DISCONNECTED on a side the other's end reached first), once; every request and receive posted completes exactly once (the reads in flight
 * and the receives flushed); a request posted after the loss completes flushed, once;
 * every object frees and both IAs close with DAT_SUCCESS, in bounded time. Nothing
 * hangs: every wait has a timeout, and alarm() ends the program. */
#include <dat2/udat.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "dto_pair.h"

#define BUF (1 << 20)
#define RECVS 4
#define READS_MAX 100000
static char abuf[BUF], bbuf[BUF];
static struct side A, B;
static unsigned char seen[READS_MAX]; /* completions of each read, by number */

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* Waits for DAT_ASYNC_ERROR_IA_CATASTROPHIC on an IA's async EVD (naming the IA as its
 * provider knows it, which need not be the handle the registry gave the consumer). */
static void expect_catastrophic(DAT_EVD_HANDLE async, const char *what)
{
	DAT_EVENT ev;
	DAT_COUNT nmore;
	memset(&ev, 0, sizeof(ev));
	DAT_RETURN rc = dat_evd_wait(async, 30 * 1000000, 1, &ev, &nmore);
	CHECK(rc == DAT_SUCCESS && ev.event_number == DAT_ASYNC_ERROR_IA_CATASTROPHIC &&
		      ev.event_data.asynch_error_event_data.dat_handle != DAT_HANDLE_NULL,
	      "%s: %#x, event %#x (want DAT_ASYNC_ERROR_IA_CATASTROPHIC naming the IA)", what, (unsigned)rc,
	      ev.event_number);
	expect_empty(async, what);
}

/* Takes every completion left on `evd` within `secs`: each of `cookies` (from `first`)
 * exactly once, flushed; returns how many came. */
static int flushed_once(DAT_EVD_HANDLE evd, DAT_EP_HANDLE ep, uint64_t first, int cookies, const char *what)
{
	int got = 0;
	unsigned char once[RECVS] = { 0 };
	for (int i = 0; i < cookies; i++) {
		DAT_EVENT ev;
		if (wait_event(evd, &ev) != DAT_SUCCESS)
			break;
		const DAT_DTO_COMPLETION_EVENT_DATA *d = &ev.event_data.dto_completion_event_data;
		uint64_t c = d->user_cookie.as_64;
		CHECK(ev.event_number == DAT_DTO_COMPLETION_EVENT && d->ep_handle == ep && c >= first &&
			      c < first + (uint64_t)cookies && d->status == DAT_DTO_ERR_FLUSHED,
		      "%s: event %#x cookie %#llx status %u", what, ev.event_number, (unsigned long long)c,
		      d->status);
		if (c >= first && c < first + (uint64_t)cookies) {
			CHECK(!once[c - first], "%s: cookie %#llx completed twice", what, (unsigned long long)c);
			once[c - first] = 1;
		}
		got++;
	}
	CHECK(got == cookies, "%s: %d of %d completed", what, got, cookies);
	expect_empty(evd, what);
	return got;
}

int main(void)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	alarm(120);
	catch_sigpipe();
	if (!open_pair(&A, &B, 64))
		return check_summary("test_device_removal");
	DAT_LMR_CONTEXT lc_a, lc_b;
	DAT_RMR_CONTEXT rc_b;
	DAT_LMR_HANDLE lmr_a = lmr_make(A.ia, A.pz, abuf, BUF, DAT_MEM_PRIV_ALL_FLAG, &lc_a, NULL);
	DAT_LMR_HANDLE lmr_b = lmr_make(B.ia, B.pz, bbuf, BUF, DAT_MEM_PRIV_ALL_FLAG, &lc_b, &rc_b);
	if (check_failed)
		return check_summary("test_device_removal");
	for (int i = 0; i < RECVS; i++) {
		DAT_LMR_TRIPLET r = seg(lc_a, abuf + 4096 * i, 4096);
		CHECK_RC(dat_ep_post_recv(A.ep, 1, &r, ck(0xa00 + i), 0), DAT_SUCCESS);
		r = seg(lc_b, bbuf + 4096 * i, 4096);
		CHECK_RC(dat_ep_post_recv(B.ep, 1, &r, ck(0xb00 + i), 0), DAT_SUCCESS);
	}
	printf("ready\n");

	/* Reads of 64 KiB, two in flight, until one fails: each completes once. */
	double t0 = now();
	int posted = 0, done = 0, failed_at = -1;
	while (now() - t0 < 60 && posted < READS_MAX && failed_at < 0) {
		while (posted - done < 2 && posted < READS_MAX) {
			DAT_LMR_TRIPLET l = seg(lc_a, abuf + 65536 * (1 + posted % 2), 65536);
			DAT_RMR_TRIPLET r = rseg(rc_b, bbuf + 65536 * 4, 65536);
			DAT_RETURN rc = dat_ep_post_rdma_read(A.ep, 1, &l, ck(posted), &r, 0);
			if (rc != DAT_SUCCESS) {
				printf("-- read %d refused at %.2fs: %#x\n", posted, now() - t0, (unsigned)rc);
				failed_at = posted;
				break;
			}
			posted++;
		}
		DAT_EVENT ev;
		if (posted == done || wait_event(A.req, &ev) != DAT_SUCCESS)
			break;
		const DAT_DTO_COMPLETION_EVENT_DATA *d = &ev.event_data.dto_completion_event_data;
		uint64_t c = d->user_cookie.as_64;
		CHECK(ev.event_number == DAT_DTO_COMPLETION_EVENT && c < (uint64_t)posted, "read completion: event %#x cookie %#llx",
		      ev.event_number, (unsigned long long)c);
		if (c < (uint64_t)posted) {
			CHECK(!seen[c]++, "read %llu completed twice", (unsigned long long)c);
			done++;
		}
		if (d->status != DAT_DTO_SUCCESS && failed_at < 0) {
			printf("-- read %llu: status %u at %.2fs (after %d reads)\n", (unsigned long long)c, d->status,
			       now() - t0, done);
			CHECK(d->status == DAT_DTO_ERR_FLUSHED, "read %llu: status %u, want FLUSHED",
			      (unsigned long long)c, d->status);
			failed_at = (int)c;
		}
	}
	CHECK(failed_at >= 0, "no read failed in 60 s: was the device removed?");
	/* the read still in flight with the failed one */
	while (done < posted) {
		DAT_EVENT ev;
		if (wait_event(A.req, &ev) != DAT_SUCCESS)
			break;
		uint64_t c = ev.event_data.dto_completion_event_data.user_cookie.as_64;
		CHECK(c < (uint64_t)posted && !seen[c]++, "read %llu: completed twice or never posted",
		      (unsigned long long)c);
		done++;
	}
	CHECK(done == posted, "%d of %d reads completed", done, posted);

	expect_catastrophic(A.async, "IA A's async EVD");
	expect_catastrophic(B.async, "IA B's async EVD");
	expect_conn_end(A.conn, A.ep, "A's connect EVD");
	expect_empty(A.conn, "A's connect EVD");
	expect_conn_end(B.conn, B.ep, "B's connect EVD");
	expect_empty(B.conn, "B's connect EVD");
	flushed_once(A.rcv, A.ep, 0xa00, RECVS, "A's receives");
	flushed_once(B.rcv, B.ep, 0xb00, RECVS, "B's receives");

	/* After the loss: a send completes flushed, once (or is refused: nothing to wait for). */
	{
		DAT_LMR_TRIPLET l = seg(lc_a, abuf, 8);
		DAT_RETURN rc = dat_ep_post_send(A.ep, 1, &l, ck(0x5e), 0);
		if (rc == DAT_SUCCESS)
			expect_dto(A.req, A.ep, 0x5e, DAT_DTO_ERR_FLUSHED, -1, DAT_DTO_SEND, "a send after the loss");
		else
			printf("-- a send after the loss: %#x\n", (unsigned)rc);
		expect_empty(A.req, "A's request EVD after the loss");
	}

	double t1 = now();
	CHECK_RC(dat_lmr_free(lmr_a), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_b), DAT_SUCCESS);
	free_pair(&A, &B);
	CHECK(now() - t1 < 10, "freeing and closing took %.1f s", now() - t1);
	check_no_sigpipe();
	return check_summary("test_device_removal");
}
