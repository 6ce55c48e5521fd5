/* Growth under repetition (issue 11, item 2): IA open/close cycles with
 * every object type, and connect/disconnect cycles, with the process's
 * resident memory (/proc/self/statm), open file descriptors (/proc/self/fd)
 * and threads (/proc/self/task) sampled along the way. After a warm-up
 * (a tenth of the cycles, at least 20), each figure must stay flat: the
 * last sample may exceed the warm-up one by a fixed tolerance only (fds
 * and threads: 2, for a connection's teardown still under way on the
 * progress thread; RSS: 4 MiB, for allocator fragmentation, far below
 * what a leak of even a few bytes a cycle adds over the long run). The end
 * sample waits up to 3 s for a teardown still under way to finish.
 *
 *   test_cycles [IA_CYCLES [CONN_CYCLES]]
 *
 * One IA cycle: dat_ia_open, then a PZ, an LMR, an RMR, a CNO, the four
 * EVDs of an EP (one with the CNO), two EPs, an SRQ and an EP on it, a PSP,
 * an RSP (on a third EP), a connection of the first EP to the PSP (the CR
 * accepted on the second EP), one send and receive and an RMR bind over it,
 * a disconnect, every object freed and dat_ia_close. No other IA is open
 * during these cycles, so each one also goes through the registry's
 * dlopen and dlclose of the provider library. On an IA without RMRs
 * (max_rmrs 0: an iWARP device without memory windows, e.g. soft-iWARP)
 * each cycle checks instead that dat_rmr_create is refused
 * (DAT_INSUFFICIENT_RESOURCES) and skips the bind, saying so once.
 * One connection cycle (two IAs open throughout, one PSP): a fresh EP on
 * each side, connect, accept, one send/receive, disconnect, both EPs freed.
 *
 * Defaults (for `make test`): 100 IA cycles and 300 connection cycles,
 * within a time budget of BUDGET_S seconds: with the default counts, the IA
 * cycles stop once half of it is spent and the connection cycles once all
 * of it is, each after at least twice its warm-up, and the program says so.
 * Here the defaults take seconds; in the soft-RoCE guest (TCG emulation,
 * where verbs-guest.sh bounds each program at 300 s) over verbs;ofi_rxm,
 * 100 IA cycles took 99 s and 300 connection cycles 279 s, so there fewer
 * cycles run: a smaller count, each sample checked as strictly.
 * Counts given as arguments have no budget: `make check-memory` runs
 * 10,000 and 100,000. Under AddressSanitizer (whose quarantine holds freed
 * memory on purpose) the RSS figure is printed, not checked. Prints
 * "test_cycles: N passed, N failed".
 *
 * glibc's malloc raises its mmap threshold each time a block above it is
 * freed (up to 32 MiB), and later blocks that size then come from the heap
 * and stay resident: libfabric's providers allocate and free pools of that
 * size with every endpoint (ofi_rxm: 2 x 1024 x 16 KiB), and over the
 * reliable-datagram entries that alone grew the IA cycles by 55 KiB (shm)
 * to 700 KiB (tcp;ofi_rxm) a cycle, flat with the threshold fixed. So the
 * threshold is fixed at glibc's default: what is measured is what the
 * process keeps, not where the allocator chose to put it. */
#include <dat2/udat.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "dto_pair.h"

#if defined(__SANITIZE_ADDRESS__)
#define RSS_CHECKED 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RSS_CHECKED 0
#endif
#endif
#ifndef RSS_CHECKED
#define RSS_CHECKED 1
#endif

#define FD_TOLERANCE 2
#define THREAD_TOLERANCE 2
#define RSS_TOLERANCE_KB 4096
#define BUDGET_S 200.0

#define BUF 4096
static char abuf[BUF], bbuf[BUF];

/* The IA has no RMRs (max_rmrs 0), as the first IA cycle found; -1 before. */
static int no_rmrs = -1;

static long rss_kb(void)
{
	long size = 0, resident = 0;
	FILE *f = fopen("/proc/self/statm", "r");
	if (f) {
		if (fscanf(f, "%ld %ld", &size, &resident) != 2)
			resident = 0;
		fclose(f);
	}
	return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

struct sample {
	long rss;
	int fds, threads;
};

static struct sample measure(void)
{
	struct sample s = { rss_kb(), proc_entries("/proc/self/fd"), proc_entries("/proc/self/task") };
	return s;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The end sample, taken once the teardown of the last cycles has settled:
 * a connection's sockets and threads are closed by the progress thread
 * after dat_ep_free returns, which on a loaded machine can lag by more
 * than the tolerance. Waits at most 3 s for the fd and thread counts to
 * come back within it; a leak never does, so it still fails. */
static struct sample settled(struct sample warm)
{
	struct sample s = measure();
	for (int i = 0; i < 300 && (s.fds > warm.fds + FD_TOLERANCE || s.threads > warm.threads + THREAD_TOLERANCE);
	     i++) {
		usleep(10000);
		s = measure();
	}
	return s;
}

/* Reports the samples of one phase and checks that they stayed flat. */
static void check_flat(const char *phase, long cycles, struct sample start, struct sample warm, struct sample end,
		       double seconds)
{
	printf("%s: %ld cycles in %.1f s; start RSS %ld KiB, fds %d, threads %d; after warm-up RSS %ld KiB, fds %d, "
	       "threads %d; end RSS %ld KiB, fds %d, threads %d\n",
	       phase, cycles, seconds, start.rss, start.fds, start.threads, warm.rss, warm.fds, warm.threads, end.rss,
	       end.fds, end.threads);
	CHECK(end.fds <= warm.fds + FD_TOLERANCE, "%s: open fds grew from %d to %d", phase, warm.fds, end.fds);
	CHECK(end.threads <= warm.threads + THREAD_TOLERANCE, "%s: threads grew from %d to %d", phase, warm.threads,
	      end.threads);
	if (RSS_CHECKED)
		CHECK(end.rss <= warm.rss + RSS_TOLERANCE_KB, "%s: RSS grew from %ld KiB to %ld KiB", phase, warm.rss,
		      end.rss);
}

/* Waits for the next event on `evd` and checks its number; the CR handle of a
 * connection request is returned through `cr`. */
static int next_event(DAT_EVD_HANDLE evd, DAT_EVENT_NUMBER want, DAT_CR_HANDLE *cr, const char *what)
{
	DAT_EVENT ev;
	DAT_RETURN rc = wait_event(evd, &ev);
	CHECK(rc == DAT_SUCCESS && ev.event_number == want, "%s: wait = %#x, event %#x, want %#x", what,
	      (unsigned)rc, rc == DAT_SUCCESS ? ev.event_number : 0, want);
	if (cr && rc == DAT_SUCCESS)
		*cr = ev.event_data.cr_arrival_event_data.cr_handle;
	return rc == DAT_SUCCESS && ev.event_number == want;
}

/* Connects a (active) to b (passive, through `psp` on port `qual` of b's IA),
 * moves one message a -> b, disconnects. */
static int one_connection(struct side *a, struct side *b, DAT_CONN_QUAL qual, DAT_LMR_CONTEXT lc_a,
			  DAT_LMR_CONTEXT lc_b, DAT_IA_ADDRESS_PTR addr)
{
	DAT_CR_HANDLE cr = DAT_HANDLE_NULL;
	DAT_LMR_TRIPLET r = seg(lc_b, bbuf, 64), s = seg(lc_a, abuf, 64);
	DAT_RETURN rc = dat_ep_connect(a->ep, addr, qual, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT,
				       DAT_CONNECT_DEFAULT_FLAG);
	CHECK(rc == DAT_SUCCESS, "dat_ep_connect = %#x", (unsigned)rc);
	if (rc != DAT_SUCCESS || !next_event(b->cr, DAT_CONNECTION_REQUEST_EVENT, &cr, "connection request"))
		return 0;
	CHECK_RC(dat_ep_post_recv(b->ep, 1, &r, ck(2), DAT_COMPLETION_DEFAULT_FLAG), DAT_SUCCESS);
	CHECK_RC(dat_cr_accept(cr, b->ep, 0, NULL), DAT_SUCCESS);
	if (!next_event(b->conn, DAT_CONNECTION_EVENT_ESTABLISHED, NULL, "passive ESTABLISHED") ||
	    !next_event(a->conn, DAT_CONNECTION_EVENT_ESTABLISHED, NULL, "active ESTABLISHED"))
		return 0;
	CHECK_RC(dat_ep_post_send(a->ep, 1, &s, ck(1), DAT_COMPLETION_DEFAULT_FLAG), DAT_SUCCESS);
	if (!expect_dto(a->req, a->ep, 1, DAT_DTO_SUCCESS, 64, DAT_DTO_SEND, "send") ||
	    !expect_dto(b->rcv, b->ep, 2, DAT_DTO_SUCCESS, 64, DAT_DTO_RECEIVE, "receive"))
		return 0;
	return disconnect_pair(a, b);
}

/* One IA cycle with every object type. */
static int ia_cycle(void)
{
	DAT_IA_HANDLE ia = DAT_HANDLE_NULL;
	DAT_EVD_HANDLE async = DAT_HANDLE_NULL;
	DAT_PZ_HANDLE pz = DAT_HANDLE_NULL;
	DAT_LMR_HANDLE lmr_a, lmr_b;
	DAT_LMR_CONTEXT lc_a = 0, lc_b = 0;
	DAT_RMR_HANDLE rmr = DAT_HANDLE_NULL;
	DAT_RMR_CONTEXT rctx = 0;
	DAT_CNO_HANDLE cno = DAT_HANDLE_NULL;
	DAT_EVD_HANDLE cno_evd = DAT_HANDLE_NULL;
	DAT_SRQ_HANDLE srq = DAT_HANDLE_NULL;
	DAT_EP_HANDLE srq_ep = DAT_HANDLE_NULL, rsp_ep = DAT_HANDLE_NULL;
	DAT_PSP_HANDLE psp = DAT_HANDLE_NULL;
	DAT_RSP_HANDLE rsp = DAT_HANDLE_NULL;
	DAT_CONN_QUAL qual = 0;
	struct side A, B;
	int ok = 1;

	DAT_RETURN rc = dat_ia_open(dat_test_ia(), 8, &async, &ia);
	CHECK(rc == DAT_SUCCESS, "dat_ia_open = %#x", (unsigned)rc);
	if (rc != DAT_SUCCESS)
		return 0;
	CHECK_RC(dat_pz_create(ia, &pz), DAT_SUCCESS);
	lmr_a = lmr_make(ia, pz, abuf, BUF / 2, DAT_MEM_PRIV_ALL_FLAG, &lc_a, NULL);
	lmr_b = lmr_make(ia, pz, bbuf, BUF, DAT_MEM_PRIV_ALL_FLAG, &lc_b, NULL);
	if (no_rmrs < 0) {
		no_rmrs = ia_attr_of(ia).max_rmrs == 0;
		if (no_rmrs)
			printf("SKIP the IA cycles' RMR and its bind (dat_rmr_create is checked refused): "
			       "%s has no RMRs (max_rmrs 0)\n",
			       dat_test_ia());
	}
	if (no_rmrs)
		CHECK_TYPE(dat_rmr_create(pz, &rmr), DAT_INSUFFICIENT_RESOURCES);
	else
		CHECK_RC(dat_rmr_create(pz, &rmr), DAT_SUCCESS);
	CHECK_RC(dat_cno_create(ia, DAT_OS_WAIT_PROXY_AGENT_NULL, &cno), DAT_SUCCESS);
	CHECK_RC(dat_evd_create(ia, 8, cno, DAT_EVD_DTO_FLAG, &cno_evd), DAT_SUCCESS);
	side_evds(&A, ia, pz);
	side_evds(&B, ia, pz);
	DAT_EP_ATTR attr = ep_attr(0, 0, 16);
	side_ep(&A, &attr);
	side_ep(&B, &attr);
	DAT_SRQ_ATTR sa = { .max_recv_dtos = 8, .max_recv_iov = 1, .low_watermark = 0 };
	CHECK_RC(dat_srq_create(ia, pz, &sa, &srq), DAT_SUCCESS);
	CHECK_RC(dat_ep_create_with_srq(ia, pz, cno_evd, A.req, A.conn, srq, &attr, &srq_ep), DAT_SUCCESS);
	CHECK_RC(dat_ep_create(ia, pz, A.rcv, A.req, A.conn, &attr, &rsp_ep), DAT_SUCCESS);
	CHECK_RC(dat_psp_create_any(ia, &qual, B.cr, DAT_PSP_CONSUMER_FLAG, &psp), DAT_SUCCESS);
	/* an RSP on a port next to the PSP's (another program may hold one: try a few) */
	rc = DAT_CONN_QUAL_IN_USE;
	for (DAT_CONN_QUAL q = qual + 1; q < qual + 64 && DAT_GET_TYPE(rc) == DAT_CONN_QUAL_IN_USE; q++)
		rc = dat_rsp_create(ia, q, rsp_ep, B.cr, &rsp);
	CHECK(rc == DAT_SUCCESS, "dat_rsp_create = %#x", (unsigned)rc);
	if (check_failed)
		return 0;

	if (!one_connection(&A, &B, qual, lc_a, lc_b, ia_address(ia)))
		ok = 0;
	/* an RMR bind needs a connected EP: connect again after a reset (also
	 * without RMRs: the cycle is the same but for the bind) */
	if (ok) {
		CHECK_RC(dat_ep_reset(A.ep), DAT_SUCCESS);
		CHECK_RC(dat_ep_reset(B.ep), DAT_SUCCESS);
		DAT_CR_HANDLE cr = DAT_HANDLE_NULL;
		rc = dat_ep_connect(A.ep, ia_address(ia), qual, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT,
				    DAT_CONNECT_DEFAULT_FLAG);
		CHECK(rc == DAT_SUCCESS, "reconnect = %#x", (unsigned)rc);
		ok = rc == DAT_SUCCESS && next_event(B.cr, DAT_CONNECTION_REQUEST_EVENT, &cr, "second request");
		if (ok) {
			CHECK_RC(dat_cr_accept(cr, B.ep, 0, NULL), DAT_SUCCESS);
			ok = next_event(B.conn, DAT_CONNECTION_EVENT_ESTABLISHED, NULL, "second passive ESTABLISHED") &&
			     next_event(A.conn, DAT_CONNECTION_EVENT_ESTABLISHED, NULL, "second active ESTABLISHED");
		}
		if (ok && !no_rmrs) {
			DAT_LMR_TRIPLET t = seg(lc_b, bbuf, 256);
			CHECK_RC(dat_rmr_bind(rmr, lmr_b, &t, DAT_MEM_PRIV_REMOTE_READ_FLAG, DAT_VA_TYPE_VA, B.ep,
					      ck(3), DAT_COMPLETION_DEFAULT_FLAG, &rctx),
				 DAT_SUCCESS);
			ok = expect_bind(B.req, rmr, 3, DAT_RMR_BIND_SUCCESS, "bind");
			/* the IA closes with this connection still up: freeing the EP breaks it */
		}
	}

	CHECK_RC(dat_rsp_free(rsp), DAT_SUCCESS);
	CHECK_RC(dat_psp_free(psp), DAT_SUCCESS);
	if (!no_rmrs)
		CHECK_RC(dat_rmr_free(rmr), DAT_SUCCESS);
	CHECK_RC(dat_ep_free(rsp_ep), DAT_SUCCESS);
	CHECK_RC(dat_ep_free(srq_ep), DAT_SUCCESS);
	CHECK_RC(dat_srq_free(srq), DAT_SUCCESS);
	side_free_ep(&A);
	side_free_ep(&B);
	side_free_evds(&A);
	side_free_evds(&B);
	CHECK_RC(dat_evd_free(cno_evd), DAT_SUCCESS);
	CHECK_RC(dat_cno_free(cno), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_a), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_b), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	return ok && !check_failed;
}

static long warmup_of(long n)
{
	long w = n / 10;
	return w < 20 ? (n < 20 ? n : 20) : w;
}

/* When the time budget ends (0: none; see the top), from now_s(). */
static double budget_end;

/* Whether a phase of n cycles, `done` of them run, stops here: its share of
 * the budget (ending at `end`) spent, and twice its warm-up run. */
static int out_of_time(const char *phase, long done, long n, double end)
{
	if (!budget_end || done >= n || done < 2 * warmup_of(n) || now_s() < end)
		return 0;
	printf("%s: stopped after %ld of %ld cycles: the time budget (%.0f s with the default counts) is spent\n", phase,
	       done, n, BUDGET_S);
	return 1;
}

static void ia_cycles(long n)
{
	long warm = warmup_of(n), i;
	struct sample start = measure(), after_warm = start;
	double t0 = now_s();
	for (i = 0; i < n && !out_of_time("IA open/close", i, n, budget_end - BUDGET_S / 2); i++) {
		if (!ia_cycle()) {
			printf("IA cycle %ld failed\n", i);
			return;
		}
		if (i + 1 == warm)
			after_warm = measure();
	}
	check_flat("IA open/close", i, start, after_warm, settled(after_warm), now_s() - t0);
}

static void conn_cycles(long n)
{
	DAT_IA_HANDLE ia_a = DAT_HANDLE_NULL, ia_b = DAT_HANDLE_NULL;
	DAT_EVD_HANDLE async_a = DAT_HANDLE_NULL, async_b = DAT_HANDLE_NULL;
	DAT_PZ_HANDLE pz_a = DAT_HANDLE_NULL, pz_b = DAT_HANDLE_NULL;
	DAT_LMR_CONTEXT lc_a = 0, lc_b = 0;
	DAT_CONN_QUAL qual = 0;
	struct side A, B;
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async_a, &ia_a), DAT_SUCCESS);
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async_b, &ia_b), DAT_SUCCESS);
	if (check_failed)
		return;
	CHECK_RC(dat_pz_create(ia_a, &pz_a), DAT_SUCCESS);
	CHECK_RC(dat_pz_create(ia_b, &pz_b), DAT_SUCCESS);
	DAT_LMR_HANDLE lmr_a = lmr_make(ia_a, pz_a, abuf, BUF, DAT_MEM_PRIV_ALL_FLAG, &lc_a, NULL);
	DAT_LMR_HANDLE lmr_b = lmr_make(ia_b, pz_b, bbuf, BUF, DAT_MEM_PRIV_ALL_FLAG, &lc_b, NULL);
	side_evds(&A, ia_a, pz_a);
	side_evds(&B, ia_b, pz_b);
	DAT_PSP_HANDLE psp = listen_any(&B, &qual);
	DAT_IA_ADDRESS_PTR addr = ia_address(ia_b);
	DAT_EP_ATTR attr = ep_attr(0, 0, 16);
	if (check_failed)
		return;

	long warm = warmup_of(n), i;
	struct sample start = measure(), after_warm = start;
	double t0 = now_s();
	for (i = 0; i < n && !out_of_time("connect/disconnect", i, n, budget_end); i++) {
		side_ep(&A, &attr);
		side_ep(&B, &attr);
		int ok = !check_failed && one_connection(&A, &B, qual, lc_a, lc_b, addr);
		side_free_ep(&A);
		side_free_ep(&B);
		if (!ok) {
			printf("connection cycle %ld failed\n", i);
			return;
		}
		if (i + 1 == warm)
			after_warm = measure();
	}
	check_flat("connect/disconnect", i, start, after_warm, settled(after_warm), now_s() - t0);

	CHECK_RC(dat_psp_free(psp), DAT_SUCCESS);
	side_free_evds(&A);
	side_free_evds(&B);
	CHECK_RC(dat_lmr_free(lmr_a), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr_b), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz_a), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz_b), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia_a, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia_b, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
}

int main(int argc, char **argv)
{
	long ia_n = argc > 1 ? atol(argv[1]) : 100;
	long conn_n = argc > 2 ? atol(argv[2]) : 300;
	if (argc == 1)
		budget_end = now_s() + BUDGET_S;
	setvbuf(stdout, NULL, _IONBF, 0);
	mallopt(M_MMAP_THRESHOLD, 128 * 1024);
	catch_sigpipe();
	if (ia_n > 0)
		ia_cycles(ia_n);
	if (conn_n > 0 && !check_failed)
		conn_cycles(conn_n);
	check_no_sigpipe();
	return check_summary("test_cycles");
}
