/*
 * mtrate: message rate of several application threads, each posting on its
 * own EP: what one IA's shared state costs threads that share nothing of
 * their own.
 *
 *   mtrate [-P IA] [-t THREADS] [-n MESSAGES] [-w WINDOW] [-S BYTES] [-q CONN_QUAL] [-s]
 *          [-m write|send]
 *
 * One process: a target IA accepts THREADS connections on CONN_QUAL; THREADS
 * initiator threads each post RDMA writes of BYTES (8) into the target's
 * buffer, WINDOW (64) in flight, MESSAGES (100000) each, reaping their own
 * request EVD with dat_evd_dequeue (busy polling, no sched_yield). With -s
 * the initiator EPs share one IA (one provider engine for all threads);
 * without, each thread opens its own IA. Prints one line:
 *
 *   mtrate threads=T ia=shared|own messages=N seconds=S rate=R msg/s
 *
 * With -m send each thread sends instead, to an EP of a receiving IA of its
 * own (with or without -s) that it serves itself: it reaps that EP's receive
 * EVD and posts a receive for each one reaped, WINDOW posted. -s then shares
 * only the sending IA, as in the default mode.
 *
 * Every wait is bounded (20 s); any DAT error prints its name and exits 1.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <dat2/udat.h>

#define MAX_THREADS 64
#define TIMEOUT_US (20u * 1000000u)

static const char *ia_name = "rs-tcp";
static int nthreads = 1, window = 64, shared_ia, send_mode;
static long messages = 100000;
static uint32_t size = 8;
static DAT_CONN_QUAL conn_qual = 28620;

static void check(DAT_RETURN rc, const char *what)
{
	if (rc != DAT_SUCCESS) {
		const char *major = "?", *minor = "?";

		dat_strerror(rc, &major, &minor);
		fprintf(stderr, "mtrate: %s: %s %s (0x%08x)\n", what, major, minor, rc);
		exit(1);
	}
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

struct region {
	char *base;
	DAT_LMR_HANDLE lmr;
	DAT_LMR_CONTEXT lmr_context;
	DAT_RMR_CONTEXT rmr_context;
};

static void reg(DAT_IA_HANDLE ia, DAT_PZ_HANDLE pz, struct region *r, size_t len)
{
	DAT_REGION_DESCRIPTION d;
	DAT_VLEN got_len;
	DAT_VADDR got_addr;

	if (posix_memalign((void **)&r->base, 4096, len) != 0)
		exit(1);
	memset(r->base, 0, len);
	d.for_va = r->base;
	check(dat_lmr_create(ia, DAT_MEM_TYPE_VIRTUAL, d, len, pz, DAT_MEM_PRIV_ALL_FLAG,
			     DAT_VA_TYPE_VA, &r->lmr, &r->lmr_context, &r->rmr_context, &got_len,
			     &got_addr),
	      "dat_lmr_create");
}

/* An EP whose receive EVD (returned in *rcv_out if not NULL) holds `recvs` receives. */
static DAT_EP_HANDLE make_ep_recv(DAT_IA_HANDLE ia, DAT_PZ_HANDLE pz, DAT_EVD_HANDLE req,
				  DAT_EVD_HANDLE conn, int recvs, DAT_EVD_HANDLE *rcv_out)
{
	DAT_EP_ATTR a;
	DAT_EVD_HANDLE rcv;
	DAT_EP_HANDLE ep;

	check(dat_evd_create(ia, recvs + 8, DAT_HANDLE_NULL, DAT_EVD_DTO_FLAG, &rcv),
	      "dat_evd_create");
	if (rcv_out)
		*rcv_out = rcv;
	memset(&a, 0, sizeof(a));
	a.service_type = DAT_SERVICE_TYPE_RC;
	a.max_message_size = size;
	a.max_rdma_size = size;
	a.qos = DAT_QOS_BEST_EFFORT;
	a.recv_completion_flags = DAT_COMPLETION_DEFAULT_FLAG;
	a.request_completion_flags = DAT_COMPLETION_DEFAULT_FLAG;
	a.max_recv_dtos = recvs;
	a.max_request_dtos = window + 2;
	a.max_recv_iov = 1;
	a.max_request_iov = 1;
	a.max_rdma_read_in = 1;
	a.max_rdma_read_out = 1;
	a.max_rdma_read_iov = 1;
	a.max_rdma_write_iov = 1;
	check(dat_ep_create(ia, pz, rcv, req, conn, &a, &ep), "dat_ep_create");
	return ep;
}

static DAT_EP_HANDLE make_ep(DAT_IA_HANDLE ia, DAT_PZ_HANDLE pz, DAT_EVD_HANDLE req,
			     DAT_EVD_HANDLE conn)
{
	return make_ep_recv(ia, pz, req, conn, 2, NULL);
}

static DAT_EVENT wait_event(DAT_EVD_HANDLE evd, const char *what)
{
	DAT_EVENT ev;
	DAT_COUNT n;

	check(dat_evd_wait(evd, TIMEOUT_US, 1, &ev, &n), what);
	return ev;
}

/* The target: its IA, buffer and accepted EPs. */
static struct {
	DAT_IA_HANDLE ia;
	DAT_PZ_HANDLE pz;
	DAT_EVD_HANDLE cr_evd, conn_evd, req_evd;
	DAT_PSP_HANDLE psp;
	struct region buf;
} target;

/* One initiator thread. */
struct worker {
	int index;
	DAT_IA_HANDLE ia;
	DAT_PZ_HANDLE pz;
	DAT_EVD_HANDLE req, conn;
	DAT_EP_HANDLE ep;
	struct region local;
	pthread_t thread;
	/* -m send: the receiving end, in an IA of the thread's own. */
	DAT_IA_HANDLE tia;
	DAT_PZ_HANDLE tpz;
	DAT_EVD_HANDLE cr_evd, tconn, treq, trcv;
	DAT_PSP_HANDLE psp;
	DAT_EP_HANDLE tep;
	struct region tbuf;
};

static struct worker workers[MAX_THREADS];
static pthread_barrier_t start;

static void check_dto(struct worker *w, DAT_RETURN rc, const DAT_EVENT *ev)
{
	check(rc, "dat_evd_dequeue");
	if (ev->event_number != DAT_DTO_COMPLETION_EVENT ||
	    ev->event_data.dto_completion_event_data.status != DAT_DTO_SUCCESS) {
		fprintf(stderr, "mtrate: thread %d: unexpected event 0x%x\n", w->index,
			ev->event_number);
		exit(1);
	}
}

/* -m send: sends to the thread's own receiving EP, whose receives it reaps and posts again. */
static void send_loop(struct worker *w)
{
	DAT_LMR_TRIPLET l = { .lmr_context = w->local.lmr_context,
			      .virtual_address = (DAT_VADDR)(uintptr_t)w->local.base,
			      .segment_length = size };
	DAT_LMR_TRIPLET rl = { .lmr_context = w->tbuf.lmr_context,
			       .virtual_address = (DAT_VADDR)(uintptr_t)w->tbuf.base,
			       .segment_length = size };
	DAT_DTO_COOKIE c = { .as_64 = 0 };
	long posted = 0, done = 0, received = 0, recvs_posted = window;
	DAT_EVENT ev;
	DAT_RETURN rc;

	while (done < messages || received < messages) {
		while (posted < messages && posted - done < window && posted - received < window) {
			check(dat_ep_post_send(w->ep, 1, &l, c, DAT_COMPLETION_DEFAULT_FLAG),
			      "dat_ep_post_send");
			posted++;
		}
		rc = dat_evd_dequeue(w->trcv, &ev);
		if (DAT_GET_TYPE(rc) != DAT_QUEUE_EMPTY) {
			check_dto(w, rc, &ev);
			received++;
			if (recvs_posted < messages) {
				check(dat_ep_post_recv(w->tep, 1, &rl, c, DAT_COMPLETION_DEFAULT_FLAG),
				      "dat_ep_post_recv");
				recvs_posted++;
			}
		}
		rc = dat_evd_dequeue(w->req, &ev);
		if (DAT_GET_TYPE(rc) != DAT_QUEUE_EMPTY) {
			check_dto(w, rc, &ev);
			done++;
		}
	}
}

static void *run_worker(void *arg)
{
	struct worker *w = arg;
	DAT_LMR_TRIPLET l = { .lmr_context = w->local.lmr_context,
			      .virtual_address = (DAT_VADDR)(uintptr_t)w->local.base,
			      .segment_length = size };
	DAT_RMR_TRIPLET r = { .rmr_context = target.buf.rmr_context,
			      .virtual_address = (DAT_VADDR)(uintptr_t)target.buf.base +
						 (DAT_VADDR)w->index * 4096,
			      .segment_length = size };
	DAT_DTO_COOKIE c = { .as_64 = 0 };
	long posted = 0, done = 0;

	pthread_barrier_wait(&start);
	if (send_mode) {
		send_loop(w);
		done = messages;
	}
	while (done < messages) {
		while (posted < messages && posted - done < window) {
			check(dat_ep_post_rdma_write(w->ep, 1, &l, c, &r, DAT_COMPLETION_DEFAULT_FLAG),
			      "dat_ep_post_rdma_write");
			posted++;
		}
		DAT_EVENT ev;
		DAT_RETURN rc = dat_evd_dequeue(w->req, &ev);

		if (DAT_GET_TYPE(rc) == DAT_QUEUE_EMPTY)
			continue;
		check_dto(w, rc, &ev);
		done++;
	}
	pthread_barrier_wait(&start);
	return NULL;
}

/* -m send: connects the worker's EP to an EP of a receiving IA of its own, with WINDOW
 * receives posted. */
static void connect_to_receiver(struct worker *w)
{
	DAT_EVD_HANDLE a = DAT_HANDLE_NULL;
	DAT_CONN_QUAL qual = conn_qual + 1 + (DAT_CONN_QUAL)w->index;
	DAT_IA_ATTR attr;
	DAT_DTO_COOKIE c = { .as_64 = 0 };

	check(dat_ia_open(ia_name, 8, &a, &w->tia), "dat_ia_open (receiver)");
	check(dat_pz_create(w->tia, &w->tpz), "dat_pz_create");
	reg(w->tia, w->tpz, &w->tbuf, 4096);
	check(dat_evd_create(w->tia, 8, DAT_HANDLE_NULL, DAT_EVD_CR_FLAG, &w->cr_evd),
	      "dat_evd_create (CR)");
	check(dat_psp_create(w->tia, qual, w->cr_evd, DAT_PSP_CONSUMER_FLAG, &w->psp),
	      "dat_psp_create");
	check(dat_evd_create(w->tia, 8, DAT_HANDLE_NULL, DAT_EVD_CONNECTION_FLAG, &w->tconn),
	      "dat_evd_create (connection)");
	check(dat_evd_create(w->tia, 8, DAT_HANDLE_NULL, DAT_EVD_DTO_FLAG, &w->treq),
	      "dat_evd_create (requests)");
	check(dat_ia_query(w->tia, NULL, DAT_IA_ALL, &attr, 0, NULL), "dat_ia_query");
	check(dat_ep_connect(w->ep, attr.ia_address_ptr, qual, TIMEOUT_US, 0, NULL,
			     DAT_QOS_BEST_EFFORT, DAT_CONNECT_DEFAULT_FLAG),
	      "dat_ep_connect");
	DAT_EVENT cr = wait_event(w->cr_evd, "waiting for the connection request");
	DAT_LMR_TRIPLET rl = { .lmr_context = w->tbuf.lmr_context,
			       .virtual_address = (DAT_VADDR)(uintptr_t)w->tbuf.base,
			       .segment_length = size };

	w->tep = make_ep_recv(w->tia, w->tpz, w->treq, w->tconn, window, &w->trcv);
	for (int i = 0; i < window; i++)
		check(dat_ep_post_recv(w->tep, 1, &rl, c, DAT_COMPLETION_DEFAULT_FLAG),
		      "dat_ep_post_recv");
	check(dat_cr_accept(cr.event_data.cr_arrival_event_data.cr_handle, w->tep, 0, NULL),
	      "dat_cr_accept");
	if (wait_event(w->conn, "connecting").event_number != DAT_CONNECTION_EVENT_ESTABLISHED ||
	    wait_event(w->tconn, "accepting").event_number != DAT_CONNECTION_EVENT_ESTABLISHED) {
		fprintf(stderr, "mtrate: connection %d not established\n", w->index);
		exit(1);
	}
}

static void usage(void)
{
	fprintf(stderr, "usage: mtrate [-P IA] [-t THREADS] [-n MESSAGES] [-w WINDOW] [-S BYTES]"
			" [-q CONN_QUAL] [-s] [-m write|send]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	DAT_IA_ATTR attr;
	DAT_EVD_HANDLE async = DAT_HANDLE_NULL;
	int c;

	while ((c = getopt(argc, argv, "P:t:n:w:S:q:sm:")) != -1) {
		switch (c) {
		case 'P': ia_name = optarg; break;
		case 't': nthreads = atoi(optarg); break;
		case 'n': messages = atol(optarg); break;
		case 'w': window = atoi(optarg); break;
		case 'S': size = (uint32_t)atoi(optarg); break;
		case 'q': conn_qual = strtoull(optarg, NULL, 0); break;
		case 's': shared_ia = 1; break;
		case 'm':
			if (strcmp(optarg, "send") == 0)
				send_mode = 1;
			else if (strcmp(optarg, "write") != 0)
				usage();
			break;
		default: usage();
		}
	}
	if (nthreads < 1 || nthreads > MAX_THREADS || window < 1 || messages < 1 || size < 1 ||
	    size > 4096)
		usage();

	check(dat_ia_open(ia_name, 8, &async, &target.ia), "dat_ia_open (target)");
	check(dat_ia_query(target.ia, NULL, DAT_IA_ALL, &attr, 0, NULL), "dat_ia_query");
	check(dat_pz_create(target.ia, &target.pz), "dat_pz_create");
	check(dat_evd_create(target.ia, 8, DAT_HANDLE_NULL, DAT_EVD_CR_FLAG, &target.cr_evd),
	      "dat_evd_create (CR)");
	check(dat_evd_create(target.ia, 2 * nthreads + 8, DAT_HANDLE_NULL, DAT_EVD_CONNECTION_FLAG,
			     &target.conn_evd), "dat_evd_create (connections)");
	check(dat_evd_create(target.ia, 8, DAT_HANDLE_NULL, DAT_EVD_DTO_FLAG, &target.req_evd),
	      "dat_evd_create (requests)");
	reg(target.ia, target.pz, &target.buf, (size_t)nthreads * 4096);
	check(dat_psp_create(target.ia, conn_qual, target.cr_evd, DAT_PSP_CONSUMER_FLAG, &target.psp),
	      "dat_psp_create");

	for (int i = 0; i < nthreads; i++) {
		struct worker *w = &workers[i];

		w->index = i;
		if (shared_ia && i > 0) {
			w->ia = workers[0].ia;
			w->pz = workers[0].pz;
		} else {
			DAT_EVD_HANDLE a = DAT_HANDLE_NULL;

			check(dat_ia_open(ia_name, 8, &a, &w->ia), "dat_ia_open (initiator)");
			check(dat_pz_create(w->ia, &w->pz), "dat_pz_create");
		}
		check(dat_evd_create(w->ia, window + 8, DAT_HANDLE_NULL, DAT_EVD_DTO_FLAG, &w->req),
		      "dat_evd_create (requests)");
		check(dat_evd_create(w->ia, 8, DAT_HANDLE_NULL, DAT_EVD_CONNECTION_FLAG, &w->conn),
		      "dat_evd_create (connection)");
		w->ep = make_ep(w->ia, w->pz, w->req, w->conn);
		reg(w->ia, w->pz, &w->local, 4096);
		if (send_mode) {
			connect_to_receiver(w);
			continue;
		}
		check(dat_ep_connect(w->ep, attr.ia_address_ptr,
				     conn_qual, TIMEOUT_US, 0, NULL, DAT_QOS_BEST_EFFORT,
				     DAT_CONNECT_DEFAULT_FLAG),
		      "dat_ep_connect");
		DAT_EVENT cr = wait_event(target.cr_evd, "waiting for the connection request");
		DAT_EP_HANDLE tep = make_ep(target.ia, target.pz, target.req_evd, target.conn_evd);

		check(dat_cr_accept(cr.event_data.cr_arrival_event_data.cr_handle, tep, 0, NULL),
		      "dat_cr_accept");
		if (wait_event(w->conn, "connecting").event_number != DAT_CONNECTION_EVENT_ESTABLISHED ||
		    wait_event(target.conn_evd, "accepting").event_number !=
			    DAT_CONNECTION_EVENT_ESTABLISHED) {
			fprintf(stderr, "mtrate: connection %d not established\n", i);
			return 1;
		}
	}

	pthread_barrier_init(&start, NULL, (unsigned)nthreads + 1);
	for (int i = 0; i < nthreads; i++)
		pthread_create(&workers[i].thread, NULL, run_worker, &workers[i]);
	pthread_barrier_wait(&start);
	double t0 = now_s();
	pthread_barrier_wait(&start);
	double secs = now_s() - t0;
	for (int i = 0; i < nthreads; i++)
		pthread_join(workers[i].thread, NULL);

	printf("mtrate threads=%d ia=%s messages=%ld seconds=%.3f rate=%.0f msg/s\n", nthreads,
	       shared_ia ? "shared" : "own", messages * nthreads, secs, messages * nthreads / secs);
	/* The provider tears everything down at exit; the figures are out. */
	return 0;
}
