/* Registration of memory that is not there (issue 23, item 5).
 *
 * Part 1, at registration: dat_lmr_create of a region the process cannot
 * access as asked is refused with DAT_INVALID_PARAMETER / DAT_INVALID_ARG3
 * (the region), and leaves nothing behind (dat_pz_free succeeds at the end):
 *   a. 1 MiB mapped, then unmapped
 *   b. 2 pages of which the second is unmapped
 *   c. a read-only mapping with local or remote write privilege (with read
 *      privileges only it registers)
 *   d. a PROT_NONE mapping with remote read privilege
 *   e. ordinary memory (malloc, mmap) registers, as ever.
 * The holes lie at addresses of their own (far from where the kernel places
 * mappings), and are checked to be holes still after each call.
 *
 * Part 2, memory unmapped while registered: a target process registers 1 MiB
 * of its memory with remote read and write, gives the initiator process the
 * RMR context, unmaps the memory (the LMR stays), and lets the initiator go.
 * Run three times, each DTO first once (the first meets the memory on a live
 * connection), the range left a hole or unmapped and reserved again with
 * PROT_NONE in turn (as a program keeping its address space does, so that
 * nothing else is mapped there: issue 41).
 * The initiator's 8 B RDMA read, 64 KiB RDMA read and 8 B RDMA write into it
 * each complete within 10 s: a read either successfully with the target's
 * bytes as registered (what pinned pages give) or with
 * DAT_DTO_ERR_REMOTE_ACCESS; a write successfully or with REMOTE_ACCESS;
 * after a failed one, DAT_DTO_ERR_FLUSHED too (the connection may break).
 * A successful read with other bytes (zeros: memory that is not the
 * registered pages) fails. The target must survive (a normal exit with status
 * 0, not SIGSEGV/SIGBUS): afterwards it registers fresh memory, posts a send
 * from it that completes (successfully, or flushed on a broken connection),
 * disconnects, frees the LMR of the unmapped memory and closes its IA.
 *
 * Every DAT call runs in a child process (part 1's, the initiator, the
 * target), forked before any DAT call: the parent only waits for them (each
 * wait bounded), adds up the checks they report through pipes and checks
 * how they ended, so a provider crashing one of them fails the test and
 * never kills it. Readiness between the two parts of part 2 goes through
 * pipes, never a fixed sleep; every wait has a timeout. All open
 * $DAT_TEST_IA (default rs-tcp). */
#define _GNU_SOURCE
#include <dat2/udat.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "dto_pair.h"

#define MIB (1u << 20)
#define WAIT_DTO_US 10000000u /* every DTO and connection event: 10 s */
#define PIPE_MS 10000         /* every message between the processes: 10 s */
#define REFUSED ERRCODE(DAT_INVALID_PARAMETER, DAT_INVALID_ARG3)

/* Addresses of our own for the holes and the target's region (MAP_FIXED_NOREPLACE;
 * where the kernel has no such flag, or something is there, wherever mmap puts
 * them): far below where the kernel places mappings, so that nothing else lands
 * in a hole left there. */
#define HINT_A 0x3a0000000000ul
#define HINT_B 0x3a0010000000ul
#define HINT_C 0x3a0020000000ul
#define HINT_D 0x3a0030000000ul
#define HINT_SERVER 0x3a0040000000ul

static size_t page;
/* Part 2's rounds: whether the target's unmapped range is reserved PROT_NONE, and which
 * DTO goes first. */
static int reserve_after, first_case;

static void *map_at(unsigned long hint, size_t len, int prot)
{
	void *p = mmap((void *)hint, len, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (p == MAP_FAILED)
		p = mmap(NULL, len, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

/* Whether [p, p + len) holds a page that is not mapped. */
static int has_hole(void *p, size_t len)
{
	static unsigned char vec[4096];
	if (len / page > sizeof(vec))
		return 0;
	return mincore(p, len, vec) == -1 && errno == ENOMEM;
}

/* The target's bytes: offset i of its region holds pattern(i), never 0. */
static unsigned char pattern(size_t i)
{
	return (unsigned char)(i % 251 + 1);
}

static const char *dto_status_name(DAT_DTO_COMPLETION_STATUS s)
{
	switch (s) {
	case DAT_DTO_SUCCESS: return "DAT_DTO_SUCCESS";
	case DAT_DTO_ERR_FLUSHED: return "DAT_DTO_ERR_FLUSHED";
	case DAT_DTO_ERR_LOCAL_PROTECTION: return "DAT_DTO_ERR_LOCAL_PROTECTION";
	case DAT_DTO_ERR_BAD_RESPONSE: return "DAT_DTO_ERR_BAD_RESPONSE";
	case DAT_DTO_ERR_REMOTE_ACCESS: return "DAT_DTO_ERR_REMOTE_ACCESS";
	case DAT_DTO_ERR_REMOTE_RESPONDER: return "DAT_DTO_ERR_REMOTE_RESPONDER";
	case DAT_DTO_ERR_TRANSPORT: return "DAT_DTO_ERR_TRANSPORT";
	default: return "another error";
	}
}

/* ---- pipes between the processes, bounded ------------------------------------------------- */

/* Reads exactly `len` bytes within `ms`; 1 on success, else prints why (timeout,
 * end of file: the other process is gone) and returns 0. */
static int read_within(int fd, void *buf, size_t len, int ms, const char *what)
{
	struct timespec t0, t;
	size_t got = 0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (got < len) {
		clock_gettime(CLOCK_MONOTONIC, &t);
		long left = ms - ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000);
		if (left <= 0) {
			printf("   %s: nothing within %d ms\n", what, ms);
			return 0;
		}
		struct pollfd pfd = { fd, POLLIN, 0 };
		int n = poll(&pfd, 1, (int)left);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			continue;
		ssize_t r = read(fd, (char *)buf + got, len - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			printf("   %s: end of file (the other process is gone)\n", what);
			return 0;
		}
		got += (size_t)r;
	}
	return 1;
}

static int write_all(int fd, const void *buf, size_t len)
{
	return write(fd, buf, len) == (ssize_t)len;
}

/* What a child reports to the parent before it exits. */
struct counts {
	int passed, failed;
};

static void child_exit(int res_fd)
{
	struct counts c = { check_passed, check_failed };
	if (!write_all(res_fd, &c, sizeof(c)))
		printf("   could not report the checks to the parent\n");
	fflush(stdout);
	_exit(check_failed ? 1 : 0);
}

/* ---- part 1: registration of memory that is not there ------------------------------------- */

static DAT_IA_HANDLE ia1;
static DAT_PZ_HANDLE pz1;

static DAT_RETURN lmr_try(void *p, size_t len, DAT_MEM_PRIV_FLAGS priv, DAT_LMR_HANDLE *lmr)
{
	DAT_REGION_DESCRIPTION region;
	DAT_LMR_CONTEXT lc = 0;
	DAT_RMR_CONTEXT rc = 0;
	DAT_VLEN rlen = 0;
	DAT_VADDR raddr = 0;
	region.for_va = p;
	*lmr = DAT_HANDLE_NULL;
	return dat_lmr_create(ia1, DAT_MEM_TYPE_VIRTUAL, region, len, pz1, priv, DAT_VA_TYPE_VA, lmr, &lc, &rc, &rlen,
			      &raddr);
}

/* dat_lmr_create of [p, p + len) with `priv` must be refused; `hole` (if any) is
 * the part that must be (and stay) unmapped around the call. On a refusal the
 * handle is not used; a registration that should not have been is freed again,
 * so that dat_pz_free at the end shows what the refusals left behind. */
static void refused(const char *what, void *p, size_t len, DAT_MEM_PRIV_FLAGS priv, void *hole, size_t hole_len)
{
	DAT_LMR_HANDLE lmr;
	if (hole)
		CHECK(has_hole(hole, hole_len), "%s: setup: %p (+%zu) is not unmapped before the call", what, hole,
		      hole_len);
	DAT_RETURN rc = lmr_try(p, len, priv, &lmr);
	printf("-- %s: dat_lmr_create = %#x\n", what, (unsigned)rc);
	CHECK(rc == REFUSED, "%s: dat_lmr_create = %#x, want %#x (DAT_INVALID_PARAMETER / DAT_INVALID_ARG3)", what,
	      (unsigned)rc, (unsigned)REFUSED);
	if (hole)
		CHECK(has_hole(hole, hole_len), "%s: %p (+%zu) got mapped during the call: the case proves nothing", what,
		      hole, hole_len);
	if (rc == DAT_SUCCESS) {
		DAT_RETURN f = dat_lmr_free(lmr);
		printf("   (it registered: freed again, dat_lmr_free = %#x)\n", (unsigned)f);
	}
}

static void registers(const char *what, void *p, size_t len, DAT_MEM_PRIV_FLAGS priv)
{
	DAT_LMR_HANDLE lmr;
	DAT_RETURN rc = lmr_try(p, len, priv, &lmr);
	printf("-- %s: dat_lmr_create = %#x\n", what, (unsigned)rc);
	CHECK(rc == DAT_SUCCESS, "%s: dat_lmr_create = %#x, want DAT_SUCCESS", what, (unsigned)rc);
	if (rc == DAT_SUCCESS)
		CHECK_RC(dat_lmr_free(lmr), DAT_SUCCESS);
}

static void part1(int res_fd)
{
	DAT_EVD_HANDLE async = DAT_HANDLE_NULL;
	unsigned char *p;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async, &ia1), DAT_SUCCESS);
	if (check_failed)
		child_exit(res_fd);
	CHECK_RC(dat_pz_create(ia1, &pz1), DAT_SUCCESS);
	if (check_failed)
		child_exit(res_fd);

	/* a. 1 MiB, mapped, then unmapped */
	p = map_at(HINT_A, MIB, PROT_READ | PROT_WRITE);
	CHECK(p != NULL, "mmap 1 MiB: %s", strerror(errno));
	if (p) {
		CHECK(munmap(p, MIB) == 0, "munmap: %s", strerror(errno));
		refused("a. 1 MiB unmapped (mmap, munmap), DAT_MEM_PRIV_ALL_FLAG", p, MIB, DAT_MEM_PRIV_ALL_FLAG, p, MIB);
	}

	/* b. 2 pages, the second unmapped */
	p = map_at(HINT_B, 2 * page, PROT_READ | PROT_WRITE);
	CHECK(p != NULL, "mmap 2 pages: %s", strerror(errno));
	if (p) {
		memset(p, 0x5a, 2 * page);
		CHECK(munmap(p + page, page) == 0, "munmap: %s", strerror(errno));
		refused("b. 2 pages, the second unmapped, LOCAL_READ|LOCAL_WRITE", p, 2 * page,
			DAT_MEM_PRIV_LOCAL_READ_FLAG | DAT_MEM_PRIV_LOCAL_WRITE_FLAG, p + page, page);
		munmap(p, page);
	}

	/* c. read-only memory: no write privilege, read privileges fine */
	p = map_at(HINT_C, 16 * page, PROT_READ);
	CHECK(p != NULL, "mmap read-only: %s", strerror(errno));
	if (p) {
		refused("c. PROT_READ mapping, DAT_MEM_PRIV_LOCAL_WRITE_FLAG", p, 16 * page,
			DAT_MEM_PRIV_LOCAL_WRITE_FLAG, NULL, 0);
		refused("c. PROT_READ mapping, DAT_MEM_PRIV_REMOTE_WRITE_FLAG", p, 16 * page,
			DAT_MEM_PRIV_REMOTE_WRITE_FLAG, NULL, 0);
		registers("c. PROT_READ mapping, LOCAL_READ|REMOTE_READ", p, 16 * page,
			  DAT_MEM_PRIV_LOCAL_READ_FLAG | DAT_MEM_PRIV_REMOTE_READ_FLAG);
		munmap(p, 16 * page);
	}

	/* d. PROT_NONE */
	p = map_at(HINT_D, 16 * page, PROT_NONE);
	CHECK(p != NULL, "mmap PROT_NONE: %s", strerror(errno));
	if (p) {
		refused("d. PROT_NONE mapping, DAT_MEM_PRIV_REMOTE_READ_FLAG", p, 16 * page,
			DAT_MEM_PRIV_REMOTE_READ_FLAG, NULL, 0);
		munmap(p, 16 * page);
	}

	/* e. ordinary memory registers */
	p = malloc(65536);
	CHECK(p != NULL, "malloc");
	if (p) {
		memset(p, 1, 65536);
		registers("e. malloc'd 64 KiB, DAT_MEM_PRIV_ALL_FLAG", p, 65536, DAT_MEM_PRIV_ALL_FLAG);
		free(p);
	}
	p = mmap(NULL, MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(p != MAP_FAILED, "mmap 1 MiB: %s", strerror(errno));
	if (p != MAP_FAILED) {
		registers("e. mmap'd 1 MiB, DAT_MEM_PRIV_ALL_FLAG", p, MIB, DAT_MEM_PRIV_ALL_FLAG);
		munmap(p, MIB);
	}

	/* f. nothing left behind by the refusals */
	printf("-- f. dat_pz_free after the refusals, dat_ia_close\n");
	CHECK_RC(dat_pz_free(pz1), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia1, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	child_exit(res_fd);
}

/* ---- part 2: memory unmapped while registered --------------------------------------------- */

struct info {
	uint64_t addr;
	uint64_t len;
	uint32_t rmr_context;
};

/* What the target tells the initiator after its own send. */
#define POST_FAILED 0xffffffffu

#define SERVER_MSG "server-is-alive!"
#define SERVER_MSG_LEN 16

/* Offsets of the initiator's DTOs into the target's region. */
#define READ8_OFF 0
#define READ64K_OFF (512 * 1024 + 24)
#define READ64K_LEN 65536
#define WRITE8_OFF (900 * 1024 + 8)

static DAT_EP_ATTR attr2(void)
{
	DAT_EP_ATTR a = ep_attr(0, 0, 16);
	a.max_rdma_read_in = 8;
	a.max_rdma_read_out = 8;
	return a;
}

static DAT_RETURN wait_for(DAT_EVD_HANDLE evd, DAT_EVENT *ev)
{
	DAT_COUNT nmore = 0;
	memset(ev, 0, sizeof(*ev));
	return dat_evd_wait(evd, WAIT_DTO_US, 1, ev, &nmore);
}

/* One connection event, DISCONNECTED or BROKEN (whichever: a connection that
 * broke on a refused access, or one that lived to be disconnected). */
static void conn_end(struct side *s, const char *who)
{
	DAT_EVENT ev;
	DAT_RETURN rc = wait_for(s->conn, &ev);
	CHECK(rc == DAT_SUCCESS &&
		      (ev.event_number == DAT_CONNECTION_EVENT_DISCONNECTED ||
		       ev.event_number == DAT_CONNECTION_EVENT_BROKEN) &&
		      ev.event_data.connect_event_data.ep_handle == s->ep,
	      "%s: the connection's end: wait = %#x, event %#x", who, (unsigned)rc, ev.event_number);
}

/* The target (server): from_c carries the port, "done" and "bye"; to_c the
 * region's info, "go" and its send's status. */
static void server(int from_c, int to_c, int res_fd)
{
	DAT_CONN_QUAL port;
	DAT_EVD_HANDLE async = DAT_HANDLE_NULL;
	DAT_IA_HANDLE ia;
	DAT_PZ_HANDLE pz;
	struct side s;
	DAT_EVENT ev;
	DAT_LMR_CONTEXT lc, mc;
	DAT_RMR_CONTEXT rc;
	char byte;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	signal(SIGPIPE, SIG_IGN);
	if (!read_within(from_c, &port, sizeof(port), 3 * PIPE_MS, "server: the port")) {
		CHECK(0, "server: no port from the client");
		child_exit(res_fd);
	}
	unsigned char *mem = map_at(HINT_SERVER, MIB, PROT_READ | PROT_WRITE);
	CHECK(mem != NULL, "server: mmap 1 MiB: %s", strerror(errno));
	if (!mem)
		child_exit(res_fd);
	for (size_t i = 0; i < MIB; i++)
		mem[i] = pattern(i);
	unsigned char *msg = malloc(page);
	memset(msg, 0, page);

	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async, &ia), DAT_SUCCESS);
	if (check_failed)
		child_exit(res_fd);
	CHECK_RC(dat_pz_create(ia, &pz), DAT_SUCCESS);
	side_evds(&s, ia, pz);
	DAT_EP_ATTR a = attr2();
	side_ep(&s, &a);
	DAT_LMR_HANDLE lmr = lmr_make(ia, pz, mem, MIB,
				      DAT_MEM_PRIV_LOCAL_READ_FLAG | DAT_MEM_PRIV_LOCAL_WRITE_FLAG |
					      DAT_MEM_PRIV_REMOTE_READ_FLAG | DAT_MEM_PRIV_REMOTE_WRITE_FLAG,
				      &lc, &rc);
	if (check_failed)
		child_exit(res_fd);
	DAT_RETURN r = dat_ep_connect(s.ep, ia_address(ia), port, WAIT_DTO_US, 0, NULL, DAT_QOS_BEST_EFFORT,
				      DAT_CONNECT_DEFAULT_FLAG);
	CHECK(r == DAT_SUCCESS, "server: dat_ep_connect = %#x", (unsigned)r);
	r = r == DAT_SUCCESS ? wait_for(s.conn, &ev) : r;
	CHECK(r == DAT_SUCCESS && ev.event_number == DAT_CONNECTION_EVENT_ESTABLISHED,
	      "server: ESTABLISHED: wait = %#x, event %#x", (unsigned)r, ev.event_number);
	if (check_failed)
		child_exit(res_fd);

	struct info in = { (uint64_t)(uintptr_t)mem, MIB, rc };
	CHECK(write_all(to_c, &in, sizeof(in)), "server: the region's info to the client");
	/* The memory goes; its LMR stays. */
	CHECK(munmap(mem, MIB) == 0, "server: munmap of the registered region: %s", strerror(errno));
	if (reserve_after)
		CHECK(mmap(mem, MIB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == mem,
		      "server: the range reserved PROT_NONE: %s", strerror(errno));
	CHECK(write_all(to_c, "g", 1), "server: go to the client");
	/* The client's DTOs are served (by this process's provider threads on TCP). */
	CHECK(read_within(from_c, &byte, 1, 5 * PIPE_MS, "server: done") && byte == 'd',
	      "server: no 'done' from the client");

	/* Still working: fresh memory, registered, a send from it completes. */
	DAT_LMR_HANDLE mlmr = lmr_make(ia, pz, msg, page, DAT_MEM_PRIV_ALL_FLAG, &mc, NULL);
	uint32_t status = POST_FAILED;
	memcpy(msg, SERVER_MSG, SERVER_MSG_LEN);
	DAT_LMR_TRIPLET t = seg(mc, msg, SERVER_MSG_LEN);
	r = dat_ep_post_send(s.ep, 1, &t, ck(0x5e), DAT_COMPLETION_DEFAULT_FLAG);
	CHECK(r == DAT_SUCCESS, "server: dat_ep_post_send from fresh memory = %#x", (unsigned)r);
	if (r == DAT_SUCCESS) {
		r = wait_for(s.req, &ev);
		const DAT_DTO_COMPLETION_EVENT_DATA *d = &ev.event_data.dto_completion_event_data;
		CHECK(r == DAT_SUCCESS && ev.event_number == DAT_DTO_COMPLETION_EVENT && d->user_cookie.as_64 == 0x5e &&
			      (d->status == DAT_DTO_SUCCESS || d->status == DAT_DTO_ERR_FLUSHED),
		      "server: its send from fresh memory: wait = %#x, event %#x, cookie %#llx, status %u (%s)",
		      (unsigned)r, ev.event_number, (unsigned long long)d->user_cookie.as_64, d->status,
		      dto_status_name(d->status));
		if (r == DAT_SUCCESS && ev.event_number == DAT_DTO_COMPLETION_EVENT)
			status = d->status;
	}
	printf("   server: its send from fresh memory: %s\n",
	       status == POST_FAILED ? "no completion" : dto_status_name(status));
	CHECK(write_all(to_c, &status, sizeof(status)), "server: its send's status to the client");
	CHECK(read_within(from_c, &byte, 1, 3 * PIPE_MS, "server: bye") && byte == 'b', "server: no 'bye' from the client");

	/* The end: disconnect (a no-op on a broken connection), free everything,
	 * the LMR of the unmapped memory too. */
	CHECK_RC(dat_ep_disconnect(s.ep, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	conn_end(&s, "server");
	CHECK_RC(dat_ep_free(s.ep), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr), DAT_SUCCESS);
	if (mlmr)
		CHECK_RC(dat_lmr_free(mlmr), DAT_SUCCESS);
	side_free_evds(&s);
	CHECK_RC(dat_pz_free(pz), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	child_exit(res_fd);
}

/* The initiator (client). */
static struct side C;
static unsigned char *cbuf; /* READ64K_LEN to read into, then 8 bytes to write from, then the server's message */
static DAT_LMR_CONTEXT clc;
static struct info target;
static int failed_before; /* a DTO of the connection completed in error */
static int hung;          /* a DTO did not complete */

/* One DTO into the unmapped region, and its completion. */
static void dto_case(const char *what, int write, size_t off, size_t len, uint64_t cookie)
{
	DAT_EVENT ev;
	unsigned char *local = write ? cbuf + READ64K_LEN : cbuf;

	printf("-- %s\n", what);
	if (hung) {
		printf("   not posted: an earlier DTO never completed\n");
		return;
	}
	memset(cbuf, 0xEE, READ64K_LEN);
	memcpy(cbuf + READ64K_LEN, "written!", 8);
	DAT_LMR_TRIPLET l = seg(clc, local, len);
	DAT_RMR_TRIPLET r = rseg(target.rmr_context, (void *)(uintptr_t)(target.addr + off), len);
	DAT_RETURN rc = write ? dat_ep_post_rdma_write(C.ep, 1, &l, ck(cookie), &r, DAT_COMPLETION_DEFAULT_FLAG)
			      : dat_ep_post_rdma_read(C.ep, 1, &l, ck(cookie), &r, DAT_COMPLETION_DEFAULT_FLAG);
	CHECK(rc == DAT_SUCCESS, "%s: posting = %#x", what, (unsigned)rc);
	if (rc != DAT_SUCCESS)
		return;
	rc = wait_for(C.req, &ev);
	CHECK(rc == DAT_SUCCESS, "%s: no completion within %u s (dat_evd_wait = %#x)", what, WAIT_DTO_US / 1000000,
	      (unsigned)rc);
	if (rc != DAT_SUCCESS) {
		hung = 1;
		return;
	}
	const DAT_DTO_COMPLETION_EVENT_DATA *d = &ev.event_data.dto_completion_event_data;
	CHECK(ev.event_number == DAT_DTO_COMPLETION_EVENT && d->ep_handle == C.ep && d->user_cookie.as_64 == cookie &&
		      d->operation == (write ? DAT_DTO_RDMA_WRITE : DAT_DTO_RDMA_READ),
	      "%s: event %#x ep %p cookie %#llx op %u", what, ev.event_number, (void *)d->ep_handle,
	      (unsigned long long)d->user_cookie.as_64, d->operation);
	printf("   completed: %s (%u), length %u\n", dto_status_name(d->status), d->status, d->transfered_length);
	switch (d->status) {
	case DAT_DTO_SUCCESS:
		if (write) {
			check_passed++;
			break;
		}
		{
			long bad = -1;
			size_t zeros = 0, untouched = 0;
			for (size_t k = 0; k < len; k++) {
				if (cbuf[k] != pattern(off + k) && bad < 0)
					bad = (long)k;
				zeros += cbuf[k] == 0;
				untouched += cbuf[k] == 0xEE;
			}
			CHECK(bad < 0 && d->transfered_length == len,
			      "%s: DAT_DTO_SUCCESS, length %u, but not the registered bytes: byte %ld is %#x, want %#x "
			      "(%zu of %zu bytes zero, %zu untouched)",
			      what, d->transfered_length, bad, bad >= 0 ? cbuf[bad] : 0,
			      bad >= 0 ? pattern(off + (size_t)bad) : 0, zeros, len, untouched);
			if (bad < 0)
				printf("   with the bytes registered (as pinned pages give)\n");
		}
		break;
	case DAT_DTO_ERR_REMOTE_ACCESS:
		check_passed++;
		failed_before = 1;
		break;
	case DAT_DTO_ERR_FLUSHED:
		CHECK(failed_before, "%s: flushed, but no DTO before it failed", what);
		failed_before = 1;
		break;
	default:
		CHECK(0, "%s: status %u (%s): want DAT_DTO_SUCCESS%s or DAT_DTO_ERR_REMOTE_ACCESS", what, d->status,
		      dto_status_name(d->status), write ? "" : " with the registered bytes");
		failed_before = 1;
		break;
	}
}

/* from_s carries the region's info, "go" and the server's send status; to_s
 * the port, "done" and "bye". */
static void client(int from_s, int to_s, int res_fd)
{
	DAT_EVD_HANDLE async = DAT_HANDLE_NULL;
	DAT_IA_HANDLE ia;
	DAT_PZ_HANDLE pz;
	DAT_EVENT ev;
	DAT_RETURN rc;
	char byte;
	int connected = 0;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	signal(SIGPIPE, SIG_IGN);
	cbuf = malloc(READ64K_LEN + 64);
	memset(cbuf, 0, READ64K_LEN + 64);
	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async, &ia), DAT_SUCCESS);
	if (check_failed)
		child_exit(res_fd);
	CHECK_RC(dat_pz_create(ia, &pz), DAT_SUCCESS);
	side_evds(&C, ia, pz);
	DAT_EP_ATTR a = attr2();
	side_ep(&C, &a);
	DAT_LMR_HANDLE lmr = lmr_make(ia, pz, cbuf, READ64K_LEN + 64, DAT_MEM_PRIV_ALL_FLAG, &clc, NULL);
	DAT_CONN_QUAL port = 0;
	DAT_PSP_HANDLE psp = listen_any(&C, &port);
	if (check_failed)
		child_exit(res_fd);
	CHECK(write_all(to_s, &port, sizeof(port)), "client: the port to the server");
	/* the connection */
	rc = wait_for(C.cr, &ev);
	CHECK(rc == DAT_SUCCESS && ev.event_number == DAT_CONNECTION_REQUEST_EVENT,
	      "client: connection request: wait = %#x, event %#x", (unsigned)rc, ev.event_number);
	if (rc == DAT_SUCCESS && ev.event_number == DAT_CONNECTION_REQUEST_EVENT) {
		CHECK_RC(dat_cr_accept(ev.event_data.cr_arrival_event_data.cr_handle, C.ep, 0, NULL), DAT_SUCCESS);
		rc = wait_for(C.conn, &ev);
		connected = rc == DAT_SUCCESS && ev.event_number == DAT_CONNECTION_EVENT_ESTABLISHED;
		CHECK(connected, "client: ESTABLISHED: wait = %#x, event %#x", (unsigned)rc, ev.event_number);
	}
	CHECK_RC(dat_psp_free(psp), DAT_SUCCESS);
	/* the receive for the server's message at the end */
	DAT_LMR_TRIPLET t = seg(clc, cbuf + READ64K_LEN + 16, SERVER_MSG_LEN);
	CHECK_RC(dat_ep_post_recv(C.ep, 1, &t, ck(0x7e), DAT_COMPLETION_DEFAULT_FLAG), DAT_SUCCESS);
	if (!connected || !read_within(from_s, &target, sizeof(target), PIPE_MS, "client: the region's info") ||
	    !read_within(from_s, &byte, 1, PIPE_MS, "client: go")) {
		CHECK(0, "client: no connection, or no region and go from the server");
		child_exit(res_fd); /* the server then ends too (end of file) */
	}
	printf("   the server's region: %#llx, %llu bytes, rmr_context %#x, unmapped by now\n",
	       (unsigned long long)target.addr, (unsigned long long)target.len, target.rmr_context);

	/* Each round begins with another of the three: the first is the one that meets the
	 * memory on a live connection (after a failure the rest may be flushed). */
	for (int i = 0; i < 3; i++) {
		switch ((first_case + i) % 3) {
		case 0:
			dto_case("8 B RDMA read of the unmapped region", 0, READ8_OFF, 8, 1);
			break;
		case 1:
			dto_case("64 KiB RDMA read of the unmapped region", 0, READ64K_OFF, READ64K_LEN, 2);
			break;
		default:
			dto_case("8 B RDMA write into the unmapped region", 1, WRITE8_OFF, 8, 3);
		}
	}

	printf("-- the server after the DTOs: a send from fresh memory, disconnect, close\n");
	/* (the server's absence, if it is gone, is told by what follows) */
	if (!write_all(to_s, "d", 1))
		printf("   client: could not tell the server 'done'\n");
	uint32_t status = POST_FAILED;
	if (read_within(from_s, &status, sizeof(status), 2 * PIPE_MS, "client: the server's send status")) {
		rc = wait_for(C.rcv, &ev);
		const DAT_DTO_COMPLETION_EVENT_DATA *d = &ev.event_data.dto_completion_event_data;
		if (status == DAT_DTO_SUCCESS)
			CHECK(rc == DAT_SUCCESS && d->user_cookie.as_64 == 0x7e && d->status == DAT_DTO_SUCCESS &&
				      d->transfered_length == SERVER_MSG_LEN &&
				      memcmp(cbuf + READ64K_LEN + 16, SERVER_MSG, SERVER_MSG_LEN) == 0,
			      "client: the server's message: wait = %#x, status %u, length %u", (unsigned)rc, d->status,
			      d->transfered_length);
		else
			CHECK(rc == DAT_SUCCESS && d->user_cookie.as_64 == 0x7e && d->status == DAT_DTO_ERR_FLUSHED,
			      "client: its receive on the broken connection: wait = %#x, status %u (%s)", (unsigned)rc,
			      d->status, dto_status_name(d->status));
	} else {
		CHECK(0, "client: no word from the server after the DTOs");
	}
	if (!write_all(to_s, "b", 1))
		printf("   client: could not tell the server 'bye'\n");
	conn_end(&C, "client");
	CHECK_RC(dat_ep_free(C.ep), DAT_SUCCESS);
	CHECK_RC(dat_lmr_free(lmr), DAT_SUCCESS);
	side_free_evds(&C);
	CHECK_RC(dat_pz_free(pz), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	child_exit(res_fd);
}

/* ---- the parent: forks, waits (bounded), adds up ------------------------------------------ */

struct kid {
	const char *name;
	pid_t pid;
	int res_fd;
};

static struct kid spawn(const char *name, void (*role)(int, int, int), int in_fd, int out_fd, int *close_fds,
			int nclose)
{
	struct kid k = { name, -1, -1 };
	int res[2];
	if (pipe(res) != 0)
		return k;
	fflush(stdout);
	k.pid = fork();
	if (k.pid == 0) {
		/* its own checks: not the parent's so far */
		check_passed = check_failed = 0;
		close(res[0]);
		for (int i = 0; i < nclose; i++)
			close(close_fds[i]);
		role(in_fd, out_fd, res[1]);
		_exit(99);
	}
	close(res[1]);
	k.res_fd = res[0];
	return k;
}

static void part1_role(int in_fd, int out_fd, int res_fd)
{
	(void)in_fd;
	(void)out_fd;
	part1(res_fd);
}

/* Waits for `k`'s counts (up to `ms`), then for its end (up to 10 s more),
 * killing it when the time is up. Returns its wait status; `got` says whether
 * its counts came (then they are added). */
static int reap(struct kid *k, int ms, int *got)
{
	struct counts c;
	int st = 0;
	char what[64];
	snprintf(what, sizeof(what), "the %s process's results", k->name);
	*got = read_within(k->res_fd, &c, sizeof(c), ms, what);
	if (*got) {
		check_passed += c.passed;
		check_failed += c.failed;
	}
	close(k->res_fd);
	for (int i = 0; i < 1000; i++) {
		pid_t w = waitpid(k->pid, &st, WNOHANG);
		if (w == k->pid)
			return st;
		if (w < 0)
			return -1;
		struct timespec ts = { 0, 10000000 };
		nanosleep(&ts, NULL);
	}
	printf("   %s: still running: killed\n", k->name);
	kill(k->pid, SIGKILL);
	waitpid(k->pid, &st, 0);
	return st;
}

static const char *ending(int st, char *buf, size_t n)
{
	if (st == -1)
		snprintf(buf, n, "not waitable");
	else if (WIFEXITED(st))
		snprintf(buf, n, "exit status %d", WEXITSTATUS(st));
	else if (WIFSIGNALED(st))
		snprintf(buf, n, "killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
	else
		snprintf(buf, n, "status %#x", st);
	return buf;
}

/* One round of part 2: the two processes, each waited for. */
static void part2_round(void)
{
	char why[96];
	int got;

	int c2s[2], s2c[2];
	if (pipe(c2s) != 0 || pipe(s2c) != 0) {
		CHECK(0, "pipe");
		return;
	}
	int all[4] = { c2s[0], c2s[1], s2c[0], s2c[1] };
	int srv_close[2] = { c2s[1], s2c[0] }, cli_close[2] = { c2s[0], s2c[1] };
	struct kid srv = spawn("server", server, c2s[0], s2c[1], srv_close, 2);
	struct kid cli = spawn("client", client, s2c[0], c2s[1], cli_close, 2);
	for (int i = 0; i < 4; i++)
		close(all[i]);
	CHECK(srv.pid > 0 && cli.pid > 0, "fork");
	if (cli.pid > 0) {
		int st = reap(&cli, 120000, &got);
		CHECK(got && WIFEXITED(st), "the client's process: %s%s", ending(st, why, sizeof(why)),
		      got ? "" : ", without its results");
	}
	if (srv.pid > 0) {
		int st = reap(&srv, 20000, &got);
		printf("-- the server process: %s\n", ending(st, why, sizeof(why)));
		CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
		      "the server process did not end normally with status 0 (it must survive the accesses to "
		      "its unmapped memory): %s%s",
		      ending(st, why, sizeof(why)), got ? "" : ", without its results");
	}
}

int main(void)
{
	char why[96];
	int got;

	setvbuf(stdout, NULL, _IOLBF, 0);
	page = (size_t)sysconf(_SC_PAGESIZE);
	alarm(250); /* a last resort: every wait below is bounded */

	/* Part 1, in a process of its own. */
	printf("== part 1: registration of memory that is not there\n");
	struct kid p1 = spawn("part 1", part1_role, -1, -1, NULL, 0);
	CHECK(p1.pid > 0, "fork");
	if (p1.pid > 0) {
		int st = reap(&p1, 60000, &got);
		CHECK(got && WIFEXITED(st), "part 1's process: %s%s", ending(st, why, sizeof(why)),
		      got ? "" : ", without its results");
	}

	/* Part 2: a target (server) and an initiator (client), once with each DTO first, the
	 * range left a hole or reserved PROT_NONE in turn. */
	for (first_case = 0; first_case < 3; first_case++) {
		reserve_after = first_case % 2;
		printf("== part 2: memory unmapped while registered%s\n",
		       reserve_after ? ", the range then reserved PROT_NONE" : "");
		part2_round();
	}
	return check_summary("test_unmapped");
}
