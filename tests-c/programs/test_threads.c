/* Many threads at once on one provider, through its threadsafe dat.conf
 * entry (issue 11, item 3).
 *
 * Two IAs of rs-tcp in one process, opened with dat_ia_openv(...,
 * DAT_TRUE): side A posts, side B receives and is the target of RDMA.
 * A has `shared` EPs each posted on by `per_shared` threads at once, and
 * `private` EPs with one posting thread each. Every posting thread runs
 * `rounds` rounds of three DTOs on its EP: a send, an RDMA write of the same
 * bytes to a slot of B's memory, an RDMA read of that slot back into a
 * buffer of its own. All A EPs complete into ONE request EVD, reaped by
 * `reapers` threads at once (dat_evd_wait; a second waiter gets
 * DAT_INVALID_STATE and dequeues instead); all B EPs into ONE receive EVD,
 * reaped by `reapers` other threads that verify each message and repost its
 * buffer at once. Meanwhile a thread queries every object and creates and
 * frees EVDs, PZs and LMRs on both IAs, and another connects, uses and
 * drops one more EP pair over and over.
 *
 * Checked: every DTO completes exactly once (a bit per DTO), with its
 * cookie, its EP, its length, its operation and status SUCCESS; the data of
 * every send as received and of every read as read back is the bytes sent;
 * and the order of one EP's queue: each reaper sees the DTOs of one posting
 * thread in the order that thread posted them (DAT orders the completions of
 * one EP's request queue; one thread's posts on an EP are ordered by its own
 * program order, whichever EP it shares), sends arrive at B in that order
 * too, and a read posted after a write on the same EP returns the written
 * bytes. (Across reapers the order of two dequeues cannot be observed from
 * outside the EVD, so order is checked within each reaper's own stream;
 * with one reaper, `make stress-threads` runs one, that is the EVD's whole
 * stream.)
 *
 * Usage: test_threads [rounds shared per_shared private reapers]
 * (default 1000 1 4 4 3: 8 posting threads, 3 + 3 reapers, 1 meddler, 1 churner;
 * `make stress-threads` runs a bigger configuration). Every wait is bounded;
 * the run fails (does not hang) if something never completes. */
#define _GNU_SOURCE
#include "check.h"
#include "dto_pair.h"
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#define MAXLEN 4096  /* largest message */
#define RING 8       /* rounds a poster may have outstanding */
#define RECVS 32     /* receives posted per B EP */
#define HANG_S 60    /* a wait longer than this is a hang */
#define OPS 3        /* DTOs per round */
enum { OP_SEND, OP_WRITE, OP_READ };
#define MAGIC 0x7e57da7au

static struct {
	int rounds, shared, per_shared, private_eps, reapers;
} cfg = { 1000, 1, 4, 4, 3 };

static int nposters, neps;
static int race_selftest; /* $TEST_THREADS_RACE: see poster_main */

/* ---- thread-safe failure reports (CHECK is for the main thread) */
static pthread_mutex_t report_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int worker_failures;
static atomic_int abort_run;
#define WFAIL(...)                                                             \
	do {                                                                   \
		if (atomic_fetch_add(&worker_failures, 1) < 30) {              \
			pthread_mutex_lock(&report_lock);                      \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);            \
			printf(__VA_ARGS__);                                   \
			printf("\n");                                          \
			fflush(stdout);                                        \
			pthread_mutex_unlock(&report_lock);                    \
		}                                                              \
	} while (0)

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static void pause_briefly(void)
{
	struct timespec t = { 0, 20000 };
	nanosleep(&t, NULL);
}

/* ---- the two sides */
static DAT_IA_HANDLE ia_a, ia_b;
static DAT_PZ_HANDLE pz_a, pz_b;
static DAT_EVD_HANDLE req_a, rcv_a, conn_a, cr_a, async_a;
static DAT_EVD_HANDLE req_b, rcv_b, conn_b, cr_b, async_b;
static DAT_EP_HANDLE *eps_a, *eps_b;

/* A's memory: per poster RING send buffers and RING read buffers.
 * B's memory: per EP RECVS receive buffers, per poster RING write slots. */
static unsigned char *arena_a, *arena_b;
static size_t arena_a_len, arena_b_len;
static DAT_LMR_HANDLE lmr_a, lmr_b;
static DAT_LMR_CONTEXT lctx_a, lctx_b;
static DAT_RMR_CONTEXT rctx_b;

static unsigned char *send_buf(int p, int slot)
{
	return arena_a + ((size_t)p * 2 * RING + slot) * MAXLEN;
}
static unsigned char *read_buf(int p, int slot)
{
	return arena_a + ((size_t)p * 2 * RING + RING + slot) * MAXLEN;
}
static unsigned char *recv_buf(int e, int b)
{
	return arena_b + ((size_t)e * RECVS + b) * MAXLEN;
}
static unsigned char *write_slot(int p, int slot)
{
	return arena_b + ((size_t)neps * RECVS + (size_t)p * RING + slot) * MAXLEN;
}

/* ---- per poster state */
struct poster {
	int id, ep;
	atomic_long done_ops;      /* A completions reaped (verified) */
	atomic_long recvd;         /* messages verified at B */
	atomic_uchar *seen_a;      /* OPS bits a round: completions seen */
	atomic_uchar *done_a;      /* a count a round: completions verified */
	atomic_uchar *seen_b;      /* a byte a round: received */
};
static struct poster *posters;
/* per A EP: sends ticketed; per B EP: receives reposted */
static atomic_long *sends_on_ep, *reposted_on_ep;

static int ep_of(int p)
{
	return p < cfg.shared * cfg.per_shared ? p / cfg.per_shared : cfg.shared + (p - cfg.shared * cfg.per_shared);
}

static uint32_t mix(uint32_t x)
{
	x ^= x >> 16;
	x *= 0x7feb352dU;
	x ^= x >> 15;
	x *= 0x846ca68bU;
	x ^= x >> 16;
	return x;
}

static uint32_t msg_len(int p, int i)
{
	return 16 + mix((uint32_t)p * 1000003u + (uint32_t)i) % (MAXLEN - 16);
}

static unsigned char pattern(int p, int i, uint32_t k)
{
	return (unsigned char)(p * 131 + i * 7 + k * 13 + (k >> 8));
}

struct header {
	uint32_t magic, seq, len;
	uint16_t poster, ep;
};

static void fill_message(unsigned char *buf, int p, int i, uint32_t len)
{
	struct header h = { MAGIC, (uint32_t)i, len, (uint16_t)p, (uint16_t)ep_of(p) };
	memcpy(buf, &h, sizeof(h));
	for (uint32_t k = sizeof(h); k < len; k++)
		buf[k] = pattern(p, i, k);
}

/* The first byte where `buf` differs from message (p, i), or -1. */
static long check_message(const unsigned char *buf, int p, int i, uint32_t len)
{
	struct header h;
	memcpy(&h, buf, sizeof(h));
	if (h.magic != MAGIC || h.seq != (uint32_t)i || h.len != len || h.poster != p || h.ep != ep_of(p))
		return 0;
	for (uint32_t k = sizeof(h); k < len; k++)
		if (buf[k] != pattern(p, i, k))
			return k;
	return -1;
}

static uint64_t cookie(int p, int op, int i)
{
	return ((uint64_t)p << 48) | ((uint64_t)op << 40) | (uint64_t)i;
}

/* Waits until `cond` holds, for at most HANG_S seconds; 0 on a hang (or an
 * aborted run). */
#define WAIT_UNTIL(cond)                                                       \
	({                                                                     \
		double until_ = now_s() + HANG_S;                              \
		int ok_ = 1;                                                   \
		while (!(cond)) {                                              \
			if (atomic_load(&abort_run) || now_s() > until_) {     \
				ok_ = 0;                                       \
				break;                                         \
			}                                                      \
			pause_briefly();                                       \
		}                                                              \
		ok_;                                                           \
	})

/* ---- posting threads */
static void *poster_main(void *arg)
{
	struct poster *ps = arg;
	int p = ps->id, e = ps->ep;
	DAT_EP_HANDLE ep = eps_a[e];
	for (int i = 0; i < cfg.rounds && !atomic_load(&abort_run); i++) {
		int slot = i % RING;
		/* the slot's previous round has completed and been verified
		 * (by round: with several reapers a count of all this poster's
		 * completions can run ahead of a reaper still verifying) */
		if (i >= RING && !WAIT_UNTIL(atomic_load(&ps->done_a[i - RING]) == OPS)) {
			WFAIL("poster %d round %d: round %d never completed (%ld DTOs reaped)", p, i, i - RING,
			      atomic_load(&ps->done_ops));
			atomic_store(&abort_run, 1);
			break;
		}
		/* a receive is posted for this send at B */
		long ticket = atomic_fetch_add(&sends_on_ep[e], 1);
		if (!WAIT_UNTIL(ticket < RECVS + atomic_load(&reposted_on_ep[e]))) {
			WFAIL("poster %d round %d: no receive reposted at B for send %ld", p, i, ticket);
			atomic_store(&abort_run, 1);
			break;
		}
		uint32_t len = msg_len(p, i);
		unsigned char *sb = send_buf(p, slot), *rb = read_buf(p, slot);
		fill_message(sb, p, i, len);
		memset(rb, 0xee, len);
		DAT_LMR_TRIPLET l = seg(lctx_a, sb, len);
		DAT_RMR_TRIPLET r = rseg(rctx_b, write_slot(p, slot), len);
		DAT_RETURN rc = dat_ep_post_send(ep, 1, &l, ck(cookie(p, OP_SEND, i)), DAT_COMPLETION_DEFAULT_FLAG);
		if (rc != DAT_SUCCESS)
			WFAIL("poster %d round %d: dat_ep_post_send = %#x", p, i, rc);

		rc = dat_ep_post_rdma_write(ep, 1, &l, ck(cookie(p, OP_WRITE, i)), &r, DAT_COMPLETION_DEFAULT_FLAG);
		if (rc != DAT_SUCCESS)
			WFAIL("poster %d round %d: dat_ep_post_rdma_write = %#x", p, i, rc);
		DAT_LMR_TRIPLET lr = seg(lctx_a, rb, len);
		rc = dat_ep_post_rdma_read(ep, 1, &lr, ck(cookie(p, OP_READ, i)), &r, DAT_COMPLETION_DEFAULT_FLAG);
		if (rc != DAT_SUCCESS)
			WFAIL("poster %d round %d: dat_ep_post_rdma_read = %#x", p, i, rc);
		/* check-threads' positive control: a consumer bug DAT forbids,
		 * reading the buffer of a posted read before its completion (by
		 * polling it) while the provider places the answer from another
		 * thread: a data race no lock orders */
		if (race_selftest)
			for (long spin = 0; spin < 2000000 && ((volatile unsigned char *)rb)[len - 1] == 0xee; spin++)
				;
		if (atomic_load(&worker_failures))
			atomic_store(&abort_run, 1);
	}
	return NULL;
}

/* ---- reapers */
static atomic_int stop_reapers;
static atomic_long waiter_busy, empty_dequeues, waited, dequeued;

/* One event from `evd` by whichever way is free: dat_evd_wait (one waiter
 * at a time: DAT_INVALID_STATE if another thread waits) or dat_evd_dequeue.
 * 1 with an event, 0 without. */
static int reap_one(DAT_EVD_HANDLE evd, DAT_EVENT *ev, int *use_wait)
{
	DAT_COUNT nmore = 0;
	DAT_RETURN rc;
	if (*use_wait) {
		rc = dat_evd_wait(evd, 20000, 1, ev, &nmore);
		if (rc == DAT_SUCCESS) {
			atomic_fetch_add(&waited, 1);
			return 1;
		}
		if (DAT_GET_TYPE(rc) == DAT_INVALID_STATE) {
			atomic_fetch_add(&waiter_busy, 1);
			*use_wait = 0;
		} else if (DAT_GET_TYPE(rc) != DAT_TIMEOUT_EXPIRED) {
			WFAIL("dat_evd_wait = %#x", rc);
			pause_briefly();
		}
		return 0;
	}
	*use_wait = 1; /* next time try to be the waiter again */
	rc = dat_evd_dequeue(evd, ev);
	if (rc == DAT_SUCCESS) {
		atomic_fetch_add(&dequeued, 1);
		return 1;
	}
	if (DAT_GET_TYPE(rc) == DAT_QUEUE_EMPTY)
		atomic_fetch_add(&empty_dequeues, 1);
	else
		WFAIL("dat_evd_dequeue = %#x", rc);
	pause_briefly();
	return 0;
}

static void *reaper_a_main(void *arg)
{
	(void)arg;
	long *last = malloc(sizeof(long) * nposters); /* this reaper's newest DTO per poster */
	for (int p = 0; p < nposters; p++)
		last[p] = -1;
	int use_wait = 1;
	DAT_EVENT ev;
	while (!atomic_load(&stop_reapers)) {
		if (!reap_one(req_a, &ev, &use_wait))
			continue;
		const DAT_DTO_COMPLETION_EVENT_DATA *d = &ev.event_data.dto_completion_event_data;
		if (ev.event_number != DAT_DTO_COMPLETION_EVENT) {
			WFAIL("request EVD: event %#x, not a DTO completion", ev.event_number);
			continue;
		}
		uint64_t c = d->user_cookie.as_64;
		int p = (int)(c >> 48), op = (int)((c >> 40) & 0xff), i = (int)(c & 0xffffffffffull);
		if (p >= nposters || op >= OPS || i >= cfg.rounds) {
			WFAIL("request EVD: unknown cookie %#llx", (unsigned long long)c);
			continue;
		}
		struct poster *ps = &posters[p];
		uint32_t len = msg_len(p, i);
		static const DAT_DTOS want_op[OPS] = { DAT_DTO_SEND, DAT_DTO_RDMA_WRITE, DAT_DTO_RDMA_READ };
		if (d->status != DAT_DTO_SUCCESS || d->ep_handle != eps_a[ps->ep] || d->operation != want_op[op] ||
		    d->transfered_length != len)
			WFAIL("poster %d round %d op %d: status %u ep %p (want %p) operation %u (want %u) length %u (want "
			      "%u)",
			      p, i, op, d->status, (void *)d->ep_handle, (void *)eps_a[ps->ep], d->operation, want_op[op],
			      d->transfered_length, len);
		long s = (long)OPS * i + op;
		if (s <= last[p])
			WFAIL("poster %d: DTO %ld (round %d op %d) completed after DTO %ld (round %ld op %ld): out of "
			      "order on EP %d",
			      p, s, i, op, last[p], last[p] / OPS, last[p] % OPS, ps->ep);
		last[p] = s;
		if (atomic_fetch_or(&ps->seen_a[i], (unsigned char)(1u << op)) & (1u << op))
			WFAIL("poster %d round %d op %d: completed twice", p, i, op);
		if (op == OP_READ && !race_selftest) {
			long k = check_message(read_buf(p, i % RING), p, i, len);
			if (k >= 0)
				WFAIL("poster %d round %d: RDMA read returned wrong data at byte %ld", p, i, k);
		}
		atomic_fetch_add(&ps->done_a[i], 1);
		atomic_fetch_add(&ps->done_ops, 1);
	}
	free(last);
	return NULL;
}

static void *reaper_b_main(void *arg)
{
	(void)arg;
	long *last = malloc(sizeof(long) * nposters);
	for (int p = 0; p < nposters; p++)
		last[p] = -1;
	int use_wait = 1;
	DAT_EVENT ev;
	while (!atomic_load(&stop_reapers)) {
		if (!reap_one(rcv_b, &ev, &use_wait))
			continue;
		const DAT_DTO_COMPLETION_EVENT_DATA *d = &ev.event_data.dto_completion_event_data;
		if (ev.event_number != DAT_DTO_COMPLETION_EVENT) {
			WFAIL("receive EVD: event %#x, not a DTO completion", ev.event_number);
			continue;
		}
		uint64_t c = d->user_cookie.as_64;
		int e = (int)(c >> 32), b = (int)(c & 0xffffffffu);
		if (e >= neps || b >= RECVS) {
			WFAIL("receive EVD: unknown cookie %#llx", (unsigned long long)c);
			continue;
		}
		if (d->status != DAT_DTO_SUCCESS || d->ep_handle != eps_b[e] || d->operation != DAT_DTO_RECEIVE) {
			WFAIL("receive on EP %d buffer %d: status %u ep %p (want %p) operation %u", e, b, d->status,
			      (void *)d->ep_handle, (void *)eps_b[e], d->operation);
			continue;
		}
		struct header h;
		memcpy(&h, recv_buf(e, b), sizeof(h));
		int p = h.poster, i = (int)h.seq;
		if (h.magic != MAGIC || p >= nposters || i >= cfg.rounds || ep_of(p) != e) {
			WFAIL("receive on EP %d buffer %d: bad header (magic %#x poster %d seq %d)", e, b, h.magic, p, i);
		} else {
			uint32_t len = msg_len(p, i);
			long k = check_message(recv_buf(e, b), p, i, len);
			if (d->transfered_length != len || k >= 0)
				WFAIL("poster %d round %d: received %u bytes (want %u), first wrong byte %ld", p, i,
				      d->transfered_length, len, k);
			if (i <= last[p])
				WFAIL("poster %d: send %d arrived after send %ld: out of order on EP %d", p, i, last[p], e);
			last[p] = i;
			if (atomic_fetch_add(&posters[p].seen_b[i], 1) != 0)
				WFAIL("poster %d round %d: received twice", p, i);
			atomic_fetch_add(&posters[p].recvd, 1);
		}
		DAT_LMR_TRIPLET l = seg(lctx_b, recv_buf(e, b), MAXLEN);
		DAT_RETURN rc = dat_ep_post_recv(eps_b[e], 1, &l, ck(((uint64_t)e << 32) | (uint64_t)b),
						 DAT_COMPLETION_DEFAULT_FLAG);
		if (rc != DAT_SUCCESS)
			WFAIL("repost on EP %d buffer %d: dat_ep_post_recv = %#x", e, b, rc);
		else
			atomic_fetch_add(&reposted_on_ep[e], 1);
	}
	free(last);
	return NULL;
}

/* ---- the meddler: queries everything, makes and frees objects */
static atomic_int stop_meddler;
static atomic_long meddles;

static void *meddler_main(void *arg)
{
	(void)arg;
	static char scratch[4096];
	while (!atomic_load(&stop_meddler)) {
		DAT_IA_HANDLE ia = (atomic_load(&meddles) & 1) ? ia_a : ia_b;
		DAT_PZ_HANDLE pz = ia == ia_a ? pz_a : pz_b;
		DAT_EVD_HANDLE async = DAT_HANDLE_NULL, evd = DAT_HANDLE_NULL;
		DAT_IA_ATTR ia_attr;
		DAT_PROVIDER_ATTR pr_attr;
		DAT_RETURN rc = dat_ia_query(ia, &async, DAT_IA_FIELD_ALL, &ia_attr, DAT_PROVIDER_FIELD_ALL, &pr_attr);
		if (rc != DAT_SUCCESS || pr_attr.is_thread_safe != DAT_TRUE)
			WFAIL("dat_ia_query = %#x, is_thread_safe %d", rc, pr_attr.is_thread_safe);
		for (int e = 0; e < neps; e++) {
			DAT_EP_STATE st;
			DAT_BOOLEAN ri, qi;
			DAT_EP_PARAM param;
			if ((rc = dat_ep_get_status(eps_a[e], &st, &ri, &qi)) != DAT_SUCCESS ||
			    st != DAT_EP_STATE_CONNECTED)
				WFAIL("dat_ep_get_status(A %d) = %#x, state %d", e, rc, st);
			if ((rc = dat_ep_query(eps_b[e], DAT_EP_FIELD_ALL, &param)) != DAT_SUCCESS)
				WFAIL("dat_ep_query(B %d) = %#x", e, rc);
		}
		DAT_EVD_PARAM ep;
		if ((rc = dat_evd_query(req_a, DAT_EVD_FIELD_ALL, &ep)) != DAT_SUCCESS)
			WFAIL("dat_evd_query = %#x", rc);
		if ((rc = dat_evd_create(ia, 16, DAT_HANDLE_NULL, DAT_EVD_DTO_FLAG, &evd)) != DAT_SUCCESS)
			WFAIL("dat_evd_create = %#x", rc);
		else if ((rc = dat_evd_free(evd)) != DAT_SUCCESS)
			WFAIL("dat_evd_free = %#x", rc);
		DAT_PZ_HANDLE pz2;
		if ((rc = dat_pz_create(ia, &pz2)) != DAT_SUCCESS)
			WFAIL("dat_pz_create = %#x", rc);
		else if ((rc = dat_pz_free(pz2)) != DAT_SUCCESS)
			WFAIL("dat_pz_free = %#x", rc);
		DAT_LMR_HANDLE lmr = DAT_HANDLE_NULL;
		DAT_LMR_CONTEXT lc;
		DAT_RMR_CONTEXT rc2;
		DAT_VLEN rlen;
		DAT_VADDR raddr;
		DAT_REGION_DESCRIPTION region;
		region.for_va = scratch;
		if ((rc = dat_lmr_create(ia, DAT_MEM_TYPE_VIRTUAL, region, sizeof(scratch), pz, DAT_MEM_PRIV_ALL_FLAG,
					 DAT_VA_TYPE_VA, &lmr, &lc, &rc2, &rlen, &raddr)) != DAT_SUCCESS)
			WFAIL("dat_lmr_create = %#x", rc);
		else if ((rc = dat_lmr_free(lmr)) != DAT_SUCCESS)
			WFAIL("dat_lmr_free = %#x", rc);
		atomic_fetch_add(&meddles, 1);
		sched_yield();
	}
	return NULL;
}

/* ---- the churner: connects, uses and drops one more EP pair, over and
 * over, on the same IAs while the others run (its own EVDs and PSP) */
static atomic_int stop_churn;
static atomic_long churns;
static DAT_IA_ADDRESS_PTR addr_b;

/* One event of `number` on `evd` within 5 s; 0 (reported) otherwise. */
static int churn_event(DAT_EVD_HANDLE evd, DAT_EVENT_NUMBER number, DAT_EVENT *ev, const char *what)
{
	DAT_COUNT nmore;
	DAT_RETURN rc = dat_evd_wait(evd, WAIT_US, 1, ev, &nmore);
	if (rc != DAT_SUCCESS || ev->event_number != number) {
		WFAIL("churn %ld: %s: dat_evd_wait = %#x, event %#x (want %#x)", atomic_load(&churns), what, rc,
		      rc == DAT_SUCCESS ? ev->event_number : 0, number);
		return 0;
	}
	return 1;
}

static void *churner_main(void *arg)
{
	(void)arg;
	static char msg_a[256], msg_b[256];
	DAT_EVD_HANDLE req_ca, rcv_ca, conn_ca, req_cb, rcv_cb, conn_cb, cr_cb;
	DAT_PSP_HANDLE psp;
	DAT_CONN_QUAL qual = 0;
	DAT_LMR_HANDLE la, lb;
	DAT_LMR_CONTEXT lca, lcb;
	DAT_RMR_CONTEXT rcx;
	DAT_VLEN rlen;
	DAT_VADDR raddr;
	DAT_REGION_DESCRIPTION ra, rb;
	ra.for_va = msg_a;
	rb.for_va = msg_b;
	DAT_RETURN rc = 0;
	int ok = dat_evd_create(ia_a, 8, NULL, DAT_EVD_DTO_FLAG, &req_ca) == DAT_SUCCESS &&
		 dat_evd_create(ia_a, 8, NULL, DAT_EVD_DTO_FLAG, &rcv_ca) == DAT_SUCCESS &&
		 dat_evd_create(ia_a, 8, NULL, DAT_EVD_CONNECTION_FLAG, &conn_ca) == DAT_SUCCESS &&
		 dat_evd_create(ia_b, 8, NULL, DAT_EVD_DTO_FLAG, &req_cb) == DAT_SUCCESS &&
		 dat_evd_create(ia_b, 8, NULL, DAT_EVD_DTO_FLAG, &rcv_cb) == DAT_SUCCESS &&
		 dat_evd_create(ia_b, 8, NULL, DAT_EVD_CONNECTION_FLAG, &conn_cb) == DAT_SUCCESS &&
		 dat_evd_create(ia_b, 8, NULL, DAT_EVD_CR_FLAG, &cr_cb) == DAT_SUCCESS &&
		 (rc = dat_psp_create_any(ia_b, &qual, cr_cb, DAT_PSP_CONSUMER_FLAG, &psp)) == DAT_SUCCESS &&
		 dat_lmr_create(ia_a, DAT_MEM_TYPE_VIRTUAL, ra, sizeof(msg_a), pz_a, DAT_MEM_PRIV_ALL_FLAG,
				DAT_VA_TYPE_VA, &la, &lca, &rcx, &rlen, &raddr) == DAT_SUCCESS &&
		 dat_lmr_create(ia_b, DAT_MEM_TYPE_VIRTUAL, rb, sizeof(msg_b), pz_b, DAT_MEM_PRIV_ALL_FLAG,
				DAT_VA_TYPE_VA, &lb, &lcb, &rcx, &rlen, &raddr) == DAT_SUCCESS;
	if (!ok) {
		WFAIL("churn: setup failed (%#x)", rc);
		return NULL;
	}
	DAT_EP_ATTR attr = ep_attr(DAT_COMPLETION_DEFAULT_FLAG, DAT_COMPLETION_DEFAULT_FLAG, 8);
	while (!atomic_load(&stop_churn) && !atomic_load(&abort_run)) {
		long n = atomic_load(&churns);
		DAT_EP_HANDLE ea = NULL, eb = NULL;
		DAT_EVENT ev;
		if (dat_ep_create(ia_a, pz_a, rcv_ca, req_ca, conn_ca, &attr, &ea) != DAT_SUCCESS ||
		    dat_ep_create(ia_b, pz_b, rcv_cb, req_cb, conn_cb, &attr, &eb) != DAT_SUCCESS) {
			WFAIL("churn %ld: dat_ep_create failed", n);
			break;
		}
		DAT_LMR_TRIPLET lr = seg(lcb, msg_b, sizeof(msg_b));
		memset(msg_b, 0, sizeof(msg_b));
		snprintf(msg_a, sizeof(msg_a), "churn %ld", n);
		DAT_LMR_TRIPLET ls = seg(lca, msg_a, strlen(msg_a) + 1);
		do {
			if ((rc = dat_ep_post_recv(eb, 1, &lr, ck(n), DAT_COMPLETION_DEFAULT_FLAG)) != DAT_SUCCESS) {
				WFAIL("churn %ld: dat_ep_post_recv = %#x", n, rc);
				break;
			}
			if ((rc = dat_ep_connect(ea, addr_b, qual, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT,
						 DAT_CONNECT_DEFAULT_FLAG)) != DAT_SUCCESS) {
				WFAIL("churn %ld: dat_ep_connect = %#x", n, rc);
				break;
			}
			if (!churn_event(cr_cb, DAT_CONNECTION_REQUEST_EVENT, &ev, "request"))
				break;
			if ((rc = dat_cr_accept(ev.event_data.cr_arrival_event_data.cr_handle, eb, 0, NULL)) !=
			    DAT_SUCCESS) {
				WFAIL("churn %ld: dat_cr_accept = %#x", n, rc);
				break;
			}
			if (!churn_event(conn_cb, DAT_CONNECTION_EVENT_ESTABLISHED, &ev, "passive established") ||
			    !churn_event(conn_ca, DAT_CONNECTION_EVENT_ESTABLISHED, &ev, "active established"))
				break;
			if ((rc = dat_ep_post_send(ea, 1, &ls, ck(n), DAT_COMPLETION_DEFAULT_FLAG)) != DAT_SUCCESS) {
				WFAIL("churn %ld: dat_ep_post_send = %#x", n, rc);
				break;
			}
			if (!churn_event(req_ca, DAT_DTO_COMPLETION_EVENT, &ev, "send") ||
			    !churn_event(rcv_cb, DAT_DTO_COMPLETION_EVENT, &ev, "receive"))
				break;
			if (ev.event_data.dto_completion_event_data.user_cookie.as_64 != (uint64_t)n ||
			    strcmp(msg_a, msg_b) != 0) {
				WFAIL("churn %ld: received '%.20s' with cookie %llu", n, msg_b,
				      (unsigned long long)ev.event_data.dto_completion_event_data.user_cookie.as_64);
				break;
			}
			if ((rc = dat_ep_disconnect(ea, DAT_CLOSE_GRACEFUL_FLAG)) != DAT_SUCCESS) {
				WFAIL("churn %ld: dat_ep_disconnect = %#x", n, rc);
				break;
			}
			if (!churn_event(conn_ca, DAT_CONNECTION_EVENT_DISCONNECTED, &ev, "active disconnected"))
				break;
			churn_event(conn_cb, DAT_CONNECTION_EVENT_DISCONNECTED, &ev, "passive disconnected");
		} while (0);
		if ((rc = dat_ep_free(ea)) != DAT_SUCCESS || (rc = dat_ep_free(eb)) != DAT_SUCCESS)
			WFAIL("churn %ld: dat_ep_free = %#x", n, rc);
		if (atomic_load(&worker_failures))
			break;
		atomic_fetch_add(&churns, 1);
	}
	/* whatever a failed round left queued goes with its EVD */
	dat_psp_free(psp);
	DAT_EVD_HANDLE all[] = { req_ca, rcv_ca, conn_ca, req_cb, rcv_cb, conn_cb, cr_cb };
	for (unsigned k = 0; k < sizeof(all) / sizeof(*all); k++)
		if ((rc = dat_evd_free(all[k])) != DAT_SUCCESS)
			WFAIL("churn: dat_evd_free = %#x", rc);
	dat_lmr_free(la);
	dat_lmr_free(lb);
	return NULL;
}

/* ---- setup */
static DAT_IA_HANDLE open_ts(const char *name, DAT_BOOLEAN ts, DAT_EVD_HANDLE *async)
{
	DAT_IA_HANDLE ia = DAT_HANDLE_NULL;
	*async = DAT_HANDLE_NULL;
	DAT_RETURN rc = dat_ia_openv(name, 16, async, &ia, DAT_VERSION_MAJOR, DAT_VERSION_MINOR, ts);
	CHECK(rc == DAT_SUCCESS, "dat_ia_openv(%s, thread_safety %d) = %#x", name, ts, (unsigned)rc);
	return rc == DAT_SUCCESS ? ia : DAT_HANDLE_NULL;
}

static DAT_BOOLEAN reported_thread_safety(DAT_IA_HANDLE ia)
{
	DAT_EVD_HANDLE async = DAT_HANDLE_NULL;
	DAT_PROVIDER_ATTR pr;
	memset(&pr, 0x55, sizeof(pr));
	CHECK_RC(dat_ia_query(ia, &async, 0, NULL, DAT_PROVIDER_FIELD_ALL, &pr), DAT_SUCCESS);
	return pr.is_thread_safe;
}

/* Both entries of one name at once: each IA reports the thread safety of
 * the entry it was opened through; closing one leaves the other working. */
static void entries(const char *name)
{
	DAT_EVD_HANDLE as_ts, as_nts;
	DAT_IA_HANDLE ts = open_ts(name, DAT_TRUE, &as_ts);
	DAT_IA_HANDLE nts = open_ts(name, DAT_FALSE, &as_nts);
	if (ts == DAT_HANDLE_NULL || nts == DAT_HANDLE_NULL)
		return;
	CHECK(reported_thread_safety(ts) == DAT_TRUE, "threadsafe entry: IA says is_thread_safe FALSE");
	CHECK(reported_thread_safety(nts) == DAT_FALSE, "nonthreadsafe entry: IA says is_thread_safe TRUE");
	CHECK_RC(dat_ia_close(nts, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	CHECK(reported_thread_safety(ts) == DAT_TRUE, "threadsafe IA after the other entry's close");
	DAT_PZ_HANDLE pz;
	CHECK_RC(dat_pz_create(ts, &pz), DAT_SUCCESS);
	CHECK_RC(dat_pz_free(pz), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ts, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	/* and again in the other order, the threadsafe entry closed first */
	nts = open_ts(name, DAT_FALSE, &as_nts);
	ts = open_ts(name, DAT_TRUE, &as_ts);
	if (ts == DAT_HANDLE_NULL || nts == DAT_HANDLE_NULL)
		return;
	CHECK_RC(dat_ia_close(ts, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	CHECK(reported_thread_safety(nts) == DAT_FALSE, "nonthreadsafe IA after the other entry's close");
	CHECK_RC(dat_ia_close(nts, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
}

static DAT_EVD_HANDLE evd(DAT_IA_HANDLE ia, DAT_COUNT qlen, DAT_EVD_FLAGS flags)
{
	DAT_EVD_HANDLE h = DAT_HANDLE_NULL;
	CHECK_RC(dat_evd_create(ia, qlen, DAT_HANDLE_NULL, flags, &h), DAT_SUCCESS);
	return h;
}

static int setup(const char *name)
{
	ia_a = open_ts(name, DAT_TRUE, &async_a);
	ia_b = open_ts(name, DAT_TRUE, &async_b);
	if (ia_a == DAT_HANDLE_NULL || ia_b == DAT_HANDLE_NULL)
		return 0;
	CHECK(reported_thread_safety(ia_a) == DAT_TRUE, "the IA opened thread-safe says it is not");
	CHECK_RC(dat_pz_create(ia_a, &pz_a), DAT_SUCCESS);
	CHECK_RC(dat_pz_create(ia_b, &pz_b), DAT_SUCCESS);
	DAT_COUNT qlen = nposters * OPS * RING + 64;
	req_a = evd(ia_a, qlen, DAT_EVD_DTO_FLAG);
	rcv_a = evd(ia_a, 16, DAT_EVD_DTO_FLAG);
	conn_a = evd(ia_a, 16, DAT_EVD_CONNECTION_FLAG);
	cr_a = evd(ia_a, 16, DAT_EVD_CR_FLAG);
	req_b = evd(ia_b, 16, DAT_EVD_DTO_FLAG);
	rcv_b = evd(ia_b, neps * RECVS + 64, DAT_EVD_DTO_FLAG);
	conn_b = evd(ia_b, 16, DAT_EVD_CONNECTION_FLAG);
	cr_b = evd(ia_b, 16, DAT_EVD_CR_FLAG);

	arena_a_len = (size_t)nposters * 2 * RING * MAXLEN;
	arena_b_len = ((size_t)neps * RECVS + (size_t)nposters * RING) * MAXLEN;
	arena_a = calloc(1, arena_a_len);
	arena_b = calloc(1, arena_b_len);
	lmr_a = lmr_make(ia_a, pz_a, arena_a, arena_a_len, DAT_MEM_PRIV_LOCAL_READ_FLAG | DAT_MEM_PRIV_LOCAL_WRITE_FLAG,
			 &lctx_a, NULL);
	lmr_b = lmr_make(ia_b, pz_b, arena_b, arena_b_len, DAT_MEM_PRIV_ALL_FLAG, &lctx_b, &rctx_b);
	if (lmr_a == DAT_HANDLE_NULL || lmr_b == DAT_HANDLE_NULL)
		return 0;

	eps_a = calloc(neps, sizeof(*eps_a));
	eps_b = calloc(neps, sizeof(*eps_b));
	struct side a = { ia_a, async_a, pz_a, req_a, rcv_a, conn_a, cr_a, DAT_HANDLE_NULL };
	struct side b = { ia_b, async_b, pz_b, req_b, rcv_b, conn_b, cr_b, DAT_HANDLE_NULL };
	for (int e = 0; e < neps; e++) {
		int posting = e < cfg.shared ? cfg.per_shared : 1;
		DAT_EP_ATTR attr = ep_attr(DAT_COMPLETION_DEFAULT_FLAG, DAT_COMPLETION_DEFAULT_FLAG,
					   posting * OPS * RING + 8);
		attr.max_recv_dtos = RECVS;
		attr.max_rdma_read_out = 16;
		attr.max_rdma_read_in = 16;
		CHECK_RC(dat_ep_create(ia_a, pz_a, rcv_a, req_a, conn_a, &attr, &eps_a[e]), DAT_SUCCESS);
		CHECK_RC(dat_ep_create(ia_b, pz_b, rcv_b, req_b, conn_b, &attr, &eps_b[e]), DAT_SUCCESS);
		a.ep = eps_a[e];
		b.ep = eps_b[e];
		if (!connect_pair(&a, &b))
			return 0;
		for (int k = 0; k < RECVS; k++) {
			DAT_LMR_TRIPLET l = seg(lctx_b, recv_buf(e, k), MAXLEN);
			CHECK_RC(dat_ep_post_recv(eps_b[e], 1, &l, ck(((uint64_t)e << 32) | (uint64_t)k),
						  DAT_COMPLETION_DEFAULT_FLAG),
				 DAT_SUCCESS);
		}
	}
	return 1;
}

static void teardown(void)
{
	struct side a = { ia_a, async_a, pz_a, req_a, rcv_a, conn_a, cr_a, DAT_HANDLE_NULL };
	struct side b = { ia_b, async_b, pz_b, req_b, rcv_b, conn_b, cr_b, DAT_HANDLE_NULL };
	for (int e = 0; e < neps && eps_a && eps_b; e++) {
		if (eps_a[e] == DAT_HANDLE_NULL || eps_b[e] == DAT_HANDLE_NULL)
			continue;
		a.ep = eps_a[e];
		b.ep = eps_b[e];
		disconnect_pair(&a, &b);
		CHECK_RC(dat_ep_free(eps_a[e]), DAT_SUCCESS);
		CHECK_RC(dat_ep_free(eps_b[e]), DAT_SUCCESS);
	}
	if (lmr_a)
		CHECK_RC(dat_lmr_free(lmr_a), DAT_SUCCESS);
	if (lmr_b)
		CHECK_RC(dat_lmr_free(lmr_b), DAT_SUCCESS);
	if (ia_a)
		CHECK_RC(dat_ia_close(ia_a, DAT_CLOSE_ABRUPT_FLAG), DAT_SUCCESS);
	if (ia_b)
		CHECK_RC(dat_ia_close(ia_b, DAT_CLOSE_ABRUPT_FLAG), DAT_SUCCESS);
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	catch_sigpipe();
	if (argc == 6) {
		cfg.rounds = atoi(argv[1]);
		cfg.shared = atoi(argv[2]);
		cfg.per_shared = atoi(argv[3]);
		cfg.private_eps = atoi(argv[4]);
		cfg.reapers = atoi(argv[5]);
	} else if (argc != 1) {
		fprintf(stderr, "usage: %s [rounds shared per_shared private reapers]\n", argv[0]);
		return 2;
	}
	if (cfg.rounds < 1 || cfg.shared < 0 || cfg.per_shared < 1 || cfg.private_eps < 0 || cfg.reapers < 1 ||
	    cfg.shared * cfg.per_shared + cfg.private_eps < 1 || cfg.shared * cfg.per_shared + cfg.private_eps > 200) {
		fprintf(stderr, "test_threads: bad configuration\n");
		return 2;
	}
	const char *name = dat_test_ia();
	race_selftest = getenv("TEST_THREADS_RACE") != NULL;
	nposters = cfg.shared * cfg.per_shared + cfg.private_eps;
	neps = cfg.shared + cfg.private_eps;

	entries(name);

	posters = calloc(nposters, sizeof(*posters));
	sends_on_ep = calloc(neps, sizeof(*sends_on_ep));
	reposted_on_ep = calloc(neps, sizeof(*reposted_on_ep));
	for (int p = 0; p < nposters; p++) {
		posters[p].id = p;
		posters[p].ep = ep_of(p);
		posters[p].seen_a = calloc(cfg.rounds, 1);
		posters[p].seen_b = calloc(cfg.rounds, 1);
		posters[p].done_a = calloc(cfg.rounds, 1);
	}
	if (!setup(name)) {
		CHECK(0, "setup failed");
		teardown();
		return check_summary("test_threads");
	}

	pthread_t *pt = calloc(nposters, sizeof(pthread_t));
	pthread_t *ra = calloc(cfg.reapers, sizeof(pthread_t)), *rb = calloc(cfg.reapers, sizeof(pthread_t));
	pthread_t md, ch;
	addr_b = ia_address(ia_b);
	double t0 = now_s();
	for (int r = 0; r < cfg.reapers; r++) {
		pthread_create(&ra[r], NULL, reaper_a_main, NULL);
		pthread_create(&rb[r], NULL, reaper_b_main, NULL);
	}
	pthread_create(&md, NULL, meddler_main, NULL);
	pthread_create(&ch, NULL, churner_main, NULL);
	for (int p = 0; p < nposters; p++)
		pthread_create(&pt[p], NULL, poster_main, &posters[p]);
	for (int p = 0; p < nposters; p++)
		pthread_join(pt[p], NULL);
	/* every DTO reaped, every message received */
	for (int p = 0; p < nposters; p++) {
		int ok = WAIT_UNTIL(atomic_load(&posters[p].done_ops) == (long)OPS * cfg.rounds &&
				    atomic_load(&posters[p].recvd) == cfg.rounds);
		CHECK(ok, "poster %d: %ld of %d DTOs completed, %ld of %d sends received", p,
		      atomic_load(&posters[p].done_ops), OPS * cfg.rounds, atomic_load(&posters[p].recvd), cfg.rounds);
	}
	double t1 = now_s();
	atomic_store(&stop_reapers, 1);
	atomic_store(&stop_meddler, 1);
	atomic_store(&stop_churn, 1);
	for (int r = 0; r < cfg.reapers; r++) {
		pthread_join(ra[r], NULL);
		pthread_join(rb[r], NULL);
	}
	pthread_join(md, NULL);
	pthread_join(ch, NULL);
	CHECK(atomic_load(&churns) > 0, "the churner connected and disconnected no EP pair");

	/* exactly once: every bit set, nothing left queued */
	long missing = 0;
	for (int p = 0; p < nposters; p++)
		for (int i = 0; i < cfg.rounds; i++) {
			if (atomic_load(&posters[p].seen_a[i]) != (1u << OPS) - 1)
				missing++;
			if (atomic_load(&posters[p].seen_b[i]) != 1)
				missing++;
		}
	CHECK(missing == 0, "%ld DTOs or receives not completed exactly once", missing);
	expect_empty(req_a, "request EVD after the run");
	expect_empty(rcv_b, "receive EVD after the run");
	CHECK(atomic_load(&worker_failures) == 0, "%d failures in worker threads (first ones above)",
	      atomic_load(&worker_failures));
	long dtos = (long)nposters * cfg.rounds * OPS, recvs = (long)nposters * cfg.rounds;
	printf("test_threads: %d posting threads (%d on %d shared EPs, %d on private EPs), %d + %d reapers, 1 "
	       "meddler: %ld DTOs + %ld receives in %.2f s (%.0f/s); reaped %ld by wait, %ld by dequeue; "
	       "%ld waits refused (another waiter), %ld empty dequeues; %ld meddler rounds, %ld EP pairs "
	       "connected, used and dropped meanwhile\n",
	       nposters, cfg.shared * cfg.per_shared, cfg.shared, cfg.private_eps, cfg.reapers, cfg.reapers, dtos,
	       recvs, t1 - t0, (dtos + recvs) / (t1 - t0), atomic_load(&waited), atomic_load(&dequeued),
	       atomic_load(&waiter_busy), atomic_load(&empty_dequeues), atomic_load(&meddles),
	       atomic_load(&churns));
	teardown();
	check_no_sigpipe();
	return check_summary("test_threads");
}
