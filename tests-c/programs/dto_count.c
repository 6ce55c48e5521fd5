/* The DTO loop cost-guard.sh counts instructions of (issue 39): one process,
 * two IAs on $DAT_TEST_IA connected to each other, OP repeated N times with
 * 8 B, one at a time, each completion reaped with dat_evd_dequeue:
 *   write  RDMA write, its completion reaped
 *   read   RDMA read, its completion reaped
 *   send   send, its completion reaped, the peer's receive reaped and reposted
 *   empty  a dequeue of an EVD that has nothing (N looks, no DTO)
 * It prints how many dequeues found nothing ("empty N"): the guard's figures
 * are per operation and assume the count does not grow with N. */
#include "check.h"
#include "dto_pair.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char abuf[64] __attribute__((aligned(64)));
static char bbuf[64] __attribute__((aligned(64)));
static long empty;

static void reap(DAT_EVD_HANDLE evd)
{
	DAT_EVENT ev;
	DAT_RETURN rc;
	while ((rc = dat_evd_dequeue(evd, &ev)) != DAT_SUCCESS) {
		if (DAT_GET_TYPE(rc) != DAT_QUEUE_EMPTY) {
			printf("FAIL dat_evd_dequeue = %#x\n", (unsigned)rc);
			exit(1);
		}
		empty++;
	}
	if (ev.event_number != DAT_DTO_COMPLETION_EVENT ||
	    ev.event_data.dto_completion_event_data.status != DAT_DTO_SUCCESS) {
		printf("FAIL event %#x status %d\n", (unsigned)ev.event_number,
		       (int)ev.event_data.dto_completion_event_data.status);
		exit(1);
	}
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	alarm(600);
	if (argc != 3) {
		fprintf(stderr, "usage: dto_count write|read|send|empty N\n");
		return 2;
	}
	const char *op = argv[1];
	long n = atol(argv[2]);
	struct side A = { 0 }, B = { 0 };
	if (!open_pair(&A, &B, 16))
		return check_summary("dto_count");
	DAT_LMR_CONTEXT lc_a = 0, lc_b = 0;
	DAT_RMR_CONTEXT rc_b = 0;
	DAT_LMR_HANDLE lmr_a = lmr_make(A.ia, A.pz, abuf, sizeof abuf, DAT_MEM_PRIV_ALL_FLAG, &lc_a, NULL);
	DAT_LMR_HANDLE lmr_b = lmr_make(B.ia, B.pz, bbuf, sizeof bbuf, DAT_MEM_PRIV_ALL_FLAG, &lc_b, &rc_b);
	DAT_LMR_TRIPLET l = seg(lc_a, abuf, 8), lb = seg(lc_b, bbuf, 8);
	DAT_RMR_TRIPLET r = rseg(rc_b, bbuf + 8, 8);
	if (strcmp(op, "send") == 0)
		CHECK_RC(dat_ep_post_recv(B.ep, 1, &lb, ck(0), DAT_COMPLETION_DEFAULT_FLAG), DAT_SUCCESS);
	if (strcmp(op, "empty") == 0) {
		DAT_EVENT ev;
		for (long i = 0; i < n; i++)
			if (DAT_GET_TYPE(dat_evd_dequeue(A.req, &ev)) != DAT_QUEUE_EMPTY) {
				CHECK(0, "dequeue of an empty EVD found something");
				break;
			}
		n = 0;
	}
	for (long i = 0; i < n && !check_failed; i++) {
		DAT_RETURN rc;
		if (strcmp(op, "write") == 0)
			rc = dat_ep_post_rdma_write(A.ep, 1, &l, ck(i), &r, DAT_COMPLETION_DEFAULT_FLAG);
		else if (strcmp(op, "read") == 0)
			rc = dat_ep_post_rdma_read(A.ep, 1, &l, ck(i), &r, DAT_COMPLETION_DEFAULT_FLAG);
		else
			rc = dat_ep_post_send(A.ep, 1, &l, ck(i), DAT_COMPLETION_DEFAULT_FLAG);
		if (rc != DAT_SUCCESS) {
			CHECK_RC(rc, DAT_SUCCESS);
			break;
		}
		reap(A.req);
		if (strcmp(op, "send") == 0) {
			reap(B.rcv);
			CHECK_RC(dat_ep_post_recv(B.ep, 1, &lb, ck(i + 1), DAT_COMPLETION_DEFAULT_FLAG),
				 DAT_SUCCESS);
		}
	}
	printf("dto_count %s empty %ld\n", op, empty);
	CHECK_RC(dat_lmr_free(lmr_a), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_b), DAT_SUCCESS);
	close_pair(&A, &B);
	return check_summary("dto_count");
}
