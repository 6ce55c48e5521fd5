/* libdat2 as a consumer and a provider see it: NULL and bad handles, the
 * dat.conf registry, loading and unloading providers, dispatch, IA handle
 * mapping, va_list forwarding and dat_strerror.
 *
 * Run by run-tests.sh with DAT_OVERRIDE naming a dat.conf whose entries
 * point at the mock provider (see the Makefile). */
#include <dat2/udat.h>
#include <dat2/dat_registry.h>
#include <dat2/dat_ib_extensions.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"

#define INVALID(sub) ERRCODE(DAT_INVALID_HANDLE, sub)
#define BADARG(n) ERRCODE(DAT_INVALID_PARAMETER, DAT_INVALID_ARG##n)

/* Events the mock provider reports (see mock_provider.c). */
static char events[4096];
void mock_event(const char *what)
{
	strncat(events, what, sizeof(events) - strlen(events) - 2);
	strcat(events, " ");
}

/* Runs `call` with stderr captured into buf. */
#define WITH_STDERR(buf, call)                                                  \
	do {                                                                    \
		char tmpl_[] = "/tmp/dat2-stderr-XXXXXX";                       \
		int fd_ = mkstemp(tmpl_), saved_ = dup(2);                      \
		fflush(stderr);                                                 \
		dup2(fd_, 2);                                                   \
		call;                                                           \
		fflush(stderr);                                                 \
		dup2(saved_, 2);                                                \
		close(saved_);                                                  \
		ssize_t n_ = pread(fd_, buf, sizeof(buf) - 1, 0);               \
		buf[n_ > 0 ? n_ : 0] = 0;                                       \
		close(fd_);                                                     \
		unlink(tmpl_);                                                  \
	} while (0)

static void null_handles(void)
{
	DAT_CONTEXT ctx = { 0 };
	DAT_OS_WAIT_PROXY_AGENT agent = { 0 };
	DAT_REGION_DESCRIPTION region = { 0 };
	DAT_EVENT ev;
	DAT_HANDLE h;
	DAT_COUNT n;

	/* generic handles */
	CHECK_RC(dat_set_consumer_context(NULL, ctx), 0x8005001b);
	CHECK_RC(dat_get_consumer_context(NULL, &ctx), 0x8005001b);
	CHECK_RC(dat_get_handle_type(NULL, NULL), 0x8005001b);
	CHECK_RC(dat_extension_op(NULL, 0), 0x8005001b);
	/* IA */
	CHECK_RC(dat_ia_close(NULL, DAT_CLOSE_ABRUPT_FLAG), 0x8005000b);
	CHECK_RC(dat_ia_query(NULL, NULL, 0, NULL, 0, NULL), 0x8005000b);
	CHECK_RC(dats_get_ia_handle(NULL, &h), 0x8005000b);
	CHECK_RC(dat_evd_create(NULL, 1, NULL, DAT_EVD_DTO_FLAG, &h), 0x8005000b);
	CHECK_RC(dat_cno_create(NULL, agent, &h), 0x8005000b);
	CHECK_RC(dat_cno_fd_create(NULL, NULL, &h), 0x8005000b);
	CHECK_RC(dat_ep_create(NULL, NULL, NULL, NULL, NULL, NULL, &h), 0x8005000b);
	CHECK_RC(dat_ep_create_with_srq(NULL, NULL, NULL, NULL, NULL, NULL, NULL, &h), 0x8005000b);
	CHECK_RC(dat_lmr_create(NULL, DAT_MEM_TYPE_VIRTUAL, region, 0, NULL, 0, 0, &h, NULL, NULL, NULL, NULL),
		 0x8005000b);
	CHECK_RC(dat_lmr_sync_rdma_read(NULL, NULL, 0), 0x8005000b);
	CHECK_RC(dat_lmr_sync_rdma_write(NULL, NULL, 0), 0x8005000b);
	CHECK_RC(dat_psp_create(NULL, 1, NULL, 0, &h), 0x8005000b);
	CHECK_RC(dat_psp_create_any(NULL, NULL, NULL, 0, &h), 0x8005000b);
	CHECK_RC(dat_rsp_create(NULL, 1, NULL, NULL, &h), 0x8005000b);
	CHECK_RC(dat_csp_create(NULL, NULL, NULL, NULL, &h), 0x8005000b);
	CHECK_RC(dat_pz_create(NULL, &h), 0x8005000b);
	CHECK_RC(dat_srq_create(NULL, NULL, NULL, &h), 0x8005000b);
	/* CNO */
	CHECK_RC(dat_cno_modify_agent(NULL, agent), INVALID(DAT_INVALID_HANDLE_CNO));
	CHECK_RC(dat_cno_query(NULL, 0, NULL), INVALID(DAT_INVALID_HANDLE_CNO));
	CHECK_RC(dat_cno_free(NULL), INVALID(DAT_INVALID_HANDLE_CNO));
	CHECK_RC(dat_cno_wait(NULL, 0, &h), INVALID(DAT_INVALID_HANDLE_CNO));
	CHECK_RC(dat_cno_trigger(NULL, &h), INVALID(DAT_INVALID_HANDLE_CNO));
	/* CR */
	CHECK_RC(dat_cr_query(NULL, 0, NULL), INVALID(DAT_INVALID_HANDLE_CR));
	CHECK_RC(dat_cr_accept(NULL, NULL, 0, NULL), INVALID(DAT_INVALID_HANDLE_CR));
	CHECK_RC(dat_cr_reject(NULL, 0, NULL), INVALID(DAT_INVALID_HANDLE_CR));
	CHECK_RC(dat_cr_handoff(NULL, 1), INVALID(DAT_INVALID_HANDLE_CR));
	/* EVD */
	CHECK_RC(dat_evd_query(NULL, 0, NULL), INVALID(DAT_INVALID_HANDLE_EVD_REQUEST));
	CHECK_RC(dat_evd_modify_cno(NULL, NULL), INVALID(DAT_INVALID_HANDLE_EVD_REQUEST));
	CHECK_RC(dat_evd_enable(NULL), INVALID(DAT_INVALID_HANDLE_EVD_REQUEST));
	CHECK_RC(dat_evd_disable(NULL), INVALID(DAT_INVALID_HANDLE_EVD_REQUEST));
	CHECK_RC(dat_evd_wait(NULL, 0, 1, &ev, &n), INVALID(DAT_INVALID_HANDLE_EVD_REQUEST));
	CHECK_RC(dat_evd_resize(NULL, 1), INVALID(DAT_INVALID_HANDLE_EVD_REQUEST));
	CHECK_RC(dat_evd_post_se(NULL, &ev), INVALID(DAT_INVALID_HANDLE_EVD_REQUEST));
	CHECK_RC(dat_evd_dequeue(NULL, &ev), INVALID(DAT_INVALID_HANDLE_EVD_REQUEST));
	CHECK_RC(dat_evd_free(NULL), INVALID(DAT_INVALID_HANDLE_EVD_REQUEST));
	CHECK_RC(dat_evd_set_unwaitable(NULL), INVALID(DAT_INVALID_HANDLE_EVD_REQUEST));
	CHECK_RC(dat_evd_clear_unwaitable(NULL), INVALID(DAT_INVALID_HANDLE_EVD_REQUEST));
	/* EP */
	CHECK_RC(dat_ep_query(NULL, 0, NULL), 0x8005000c);
	CHECK_RC(dat_ep_modify(NULL, 0, NULL), 0x8005000c);
	CHECK_RC(dat_ep_connect(NULL, NULL, 1, 0, 0, NULL, 0, 0), 0x8005000c);
	CHECK_RC(dat_ep_common_connect(NULL, NULL, 0, 0, NULL), 0x8005000c);
	CHECK_RC(dat_ep_dup_connect(NULL, NULL, 0, 0, NULL, 0), 0x8005000c);
	CHECK_RC(dat_ep_disconnect(NULL, 0), 0x8005000c);
	CHECK_RC(dat_ep_post_send(NULL, 0, NULL, ctx, 0), 0x8005000c);
	CHECK_RC(dat_ep_post_send_with_invalidate(NULL, 0, NULL, ctx, 0, 0, 0), 0x8005000c);
	CHECK_RC(dat_ep_post_recv(NULL, 0, NULL, ctx, 0), 0x8005000c);
	CHECK_RC(dat_ep_post_rdma_read(NULL, 0, NULL, ctx, NULL, 0), 0x8005000c);
	CHECK_RC(dat_ep_post_rdma_read_to_rmr(NULL, NULL, ctx, NULL, 0), 0x8005000c);
	CHECK_RC(dat_ep_post_rdma_write(NULL, 0, NULL, ctx, NULL, 0), 0x8005000c);
	CHECK_RC(dat_ep_get_status(NULL, NULL, NULL, NULL), 0x8005000c);
	CHECK_RC(dat_ep_free(NULL), 0x8005000c);
	CHECK_RC(dat_ep_reset(NULL), 0x8005000c);
	CHECK_RC(dat_ep_recv_query(NULL, NULL, NULL), 0x8005000c);
	CHECK_RC(dat_ep_set_watermark(NULL, 0, 0), 0x8005000c);
	/* LMR, RMR */
	CHECK_RC(dat_lmr_query(NULL, 0, NULL), INVALID(DAT_INVALID_HANDLE_LMR));
	CHECK_RC(dat_lmr_free(NULL), INVALID(DAT_INVALID_HANDLE_LMR));
	CHECK_RC(dat_rmr_create(NULL, &h), INVALID(DAT_INVALID_HANDLE_PZ));
	CHECK_RC(dat_rmr_create_for_ep(NULL, &h), INVALID(DAT_INVALID_HANDLE_PZ));
	CHECK_RC(dat_rmr_query(NULL, 0, NULL), INVALID(DAT_INVALID_HANDLE_RMR));
	CHECK_RC(dat_rmr_bind(NULL, NULL, NULL, 0, 0, NULL, ctx, 0, NULL), INVALID(DAT_INVALID_HANDLE_RMR));
	CHECK_RC(dat_rmr_free(NULL), INVALID(DAT_INVALID_HANDLE_RMR));
	/* PSP, RSP, CSP, PZ, SRQ */
	CHECK_RC(dat_psp_query(NULL, 0, NULL), INVALID(DAT_INVALID_HANDLE_PSP));
	CHECK_RC(dat_psp_free(NULL), INVALID(DAT_INVALID_HANDLE_PSP));
	CHECK_RC(dat_rsp_query(NULL, 0, NULL), INVALID(DAT_INVALID_HANDLE_RSP));
	CHECK_RC(dat_rsp_free(NULL), INVALID(DAT_INVALID_HANDLE_RSP));
	CHECK_RC(dat_csp_query(NULL, 0, NULL), INVALID(DAT_INVALID_HANDLE_CSP));
	CHECK_RC(dat_csp_free(NULL), INVALID(DAT_INVALID_HANDLE_CSP));
	CHECK_RC(dat_pz_query(NULL, 0, NULL), INVALID(DAT_INVALID_HANDLE_PZ));
	CHECK_RC(dat_pz_free(NULL), INVALID(DAT_INVALID_HANDLE_PZ));
	CHECK_RC(dat_srq_free(NULL), INVALID(DAT_INVALID_HANDLE_SRQ));
	CHECK_RC(dat_srq_post_recv(NULL, 0, NULL, ctx), INVALID(DAT_INVALID_HANDLE_SRQ));
	CHECK_RC(dat_srq_query(NULL, 0, NULL), INVALID(DAT_INVALID_HANDLE_SRQ));
	CHECK_RC(dat_srq_resize(NULL, 1), INVALID(DAT_INVALID_HANDLE_SRQ));
	CHECK_RC(dat_srq_set_lw(NULL, 1), INVALID(DAT_INVALID_HANDLE_SRQ));
	/* registry entry points */
	CHECK_RC(dat_ia_openv(NULL, 8, &h, &h, 2, 0, DAT_FALSE), BADARG(1));
	CHECK_RC(dat_ia_openv("x", 8, NULL, &h, 2, 0, DAT_FALSE), BADARG(3));
	CHECK_RC(dat_ia_openv("x", 8, &h, NULL, 2, 0, DAT_FALSE), BADARG(4));
	CHECK_RC(dat_registry_add_provider(NULL, NULL), BADARG(1));
	CHECK_RC(dat_registry_remove_provider(NULL, NULL), BADARG(1));
	CHECK_RC(dat_registry_list_providers(0, NULL, NULL), BADARG(2));
	CHECK_RC(dat_registry_list_providers(4, &n, NULL), BADARG(3));
	CHECK_RC(dat_registry_providers_related(NULL, "x", NULL), BADARG(1));
	CHECK_RC(dat_strerror(0, NULL, NULL), BADARG(2));
}

/* Handles that are not NULL but not live objects either. */
static void bad_handles(void)
{
	DAT_CONTEXT ctx = { 0 };
	DAT_HANDLE h;
	DAT_EVENT not_an_object; /* readable memory holding no provider table */
	memset(&not_an_object, 0x5a, sizeof(not_an_object));

	CHECK_RC(dat_ia_close((DAT_IA_HANDLE)0x7, DAT_CLOSE_ABRUPT_FLAG), 0x8005000b);
	CHECK_RC(dat_ia_close((DAT_IA_HANDLE)0xffff, DAT_CLOSE_ABRUPT_FLAG), 0x8005000b);
	CHECK_RC(dat_ia_close(&not_an_object, DAT_CLOSE_ABRUPT_FLAG), 0x8005000b);
	CHECK_RC(dat_pz_create((DAT_IA_HANDLE)0x3, &h), 0x8005000b);
	/* an IA-sized integer where an object is expected: never dereferenced */
	CHECK_RC(dat_ep_post_send((DAT_EP_HANDLE)0x101, 0, NULL, ctx, 0), 0x8005000c);
	CHECK_RC(dat_evd_free((DAT_EVD_HANDLE)0x42), INVALID(DAT_INVALID_HANDLE_EVD_REQUEST));
	/* readable memory that is not an object of any registered provider */
	CHECK_RC(dat_ep_post_send(&not_an_object, 0, NULL, ctx, 0), 0x8005000c);
	CHECK_RC(dat_lmr_free(&not_an_object), INVALID(DAT_INVALID_HANDLE_LMR));
	CHECK_RC(dat_get_handle_type(&not_an_object, NULL), 0x8005001b);
	/* misaligned */
	CHECK_RC(dat_pz_free((char *)&not_an_object + 3), INVALID(DAT_INVALID_HANDLE_PZ));
}

static DAT_RETURN open_ia(const char *name, DAT_IA_HANDLE *ia)
{
	DAT_EVD_HANDLE evd = DAT_HANDLE_NULL;
	return dat_ia_open(name, 8, &evd, ia);
}

static void registry_and_dispatch(void)
{
	DAT_IA_HANDLE ia1, ia2, stale;
	DAT_PZ_HANDLE pz;
	DAT_HANDLE_TYPE type;
	DAT_CONTEXT ctx;
	DAT_IA_ATTR attr;
	DAT_COUNT count = -1;
	DAT_PROVIDER_INFO infos[16], *list[16];
	char err[2048];
	DAT_RETURN rc;
	int sum = 0;

	/* dat.conf as the registry sees it: every user-level default entry,
	 * of any version (as OFED's registry lists them): 10 u2.0 entries and
	 * rs-tcp's two u1.2 ones (nonthreadsafe, threadsafe). The file also
	 * holds a Latin-1 comment and a line with a 0xff byte: that line alone
	 * is skipped, every other entry stays (issue 23) */
	CHECK_RC(dat_registry_list_providers(0, &count, NULL), DAT_SUCCESS);
	CHECK(count == 12, "dat_registry_list_providers counted %d entries, want 12", count);
	for (int i = 0; i < 16; i++)
		list[i] = &infos[i];
	CHECK_RC(dat_registry_list_providers(2, &count, list), DAT_SUCCESS);
	CHECK(count == 2, "at most max_to_return entries: %d", count);
	CHECK_RC(dat_registry_list_providers(16, &count, list), DAT_SUCCESS);
	CHECK(count == 12 && strcmp(infos[0].ia_name, "mock") == 0 && infos[0].dapl_version_major == 2 &&
		      infos[0].is_thread_safe == DAT_FALSE,
	      "first entry %s %u", infos[0].ia_name, infos[0].dapl_version_major);

	/* unknown names: what dapltest -f hwconn case 1 checks */
	const char *unknown[] = { "40", "x", "xsdf", "x34", "34df", "" };
	for (unsigned i = 0; i < sizeof(unknown) / sizeof(*unknown); i++)
		CHECK_RC(open_ia(unknown[i], &ia1), 0x800a0064);
	/* the dat.conf line with a byte that is not UTF-8 names no entry */
	CHECK_RC(open_ia("bad\377name", &ia1), 0x800a0064);

	/* version and thread-safety must match exactly */
	DAT_EVD_HANDLE evd = DAT_HANDLE_NULL;
	CHECK_RC(dat_ia_openv("mock", 8, &evd, &ia1, 1, 2, DAT_FALSE),
		 ERRCODE(DAT_PROVIDER_NOT_FOUND, DAT_MAJOR_NOT_FOUND));
	CHECK_RC(dat_ia_openv("mock", 8, &evd, &ia1, 2, 1, DAT_FALSE),
		 ERRCODE(DAT_PROVIDER_NOT_FOUND, DAT_MINOR_NOT_FOUND));
	CHECK_RC(dat_ia_openv("mock", 8, &evd, &ia1, 2, 0, DAT_TRUE),
		 ERRCODE(DAT_PROVIDER_NOT_FOUND, DAT_THREAD_SAFETY_NOT_FOUND));
	CHECK(events[0] == 0, "no provider loaded by failed lookups: '%s'", events);

	/* open twice: one init, two opens, small distinct handles */
	CHECK_RC(open_ia("mock", &ia1), DAT_SUCCESS);
	CHECK_RC(open_ia("mock", &ia2), DAT_SUCCESS);
	CHECK(ia1 != ia2 && (unsigned long)ia1 < 0x10000 && (unsigned long)ia2 < 0x10000,
	      "IA handles %p %p are small integers", ia1, ia2);
	CHECK(strcmp(events, "init open open ") == 0, "events '%s'", events);

	/* dispatch with the IA handle mapped to the provider's own */
	memset(&attr, 0, sizeof(attr));
	CHECK_RC(dat_ia_query(ia1, NULL, DAT_IA_FIELD_ALL, &attr, 0, NULL), DAT_SUCCESS);
	CHECK(strcmp(attr.adapter_name, "mock adapter") == 0, "ia_query reached the provider");
	CHECK_RC(dat_get_handle_type(ia1, &type), DAT_SUCCESS);
	CHECK(type == DAT_HANDLE_TYPE_IA, "IA handle type %u", type);
	ctx.as_64 = 0x1234;
	CHECK_RC(dat_set_consumer_context(ia2, ctx), DAT_SUCCESS);
	ctx.as_64 = 0;
	CHECK_RC(dat_get_consumer_context(ia2, &ctx), DAT_SUCCESS);
	CHECK(ctx.as_64 == 0x1234, "consumer context on an IA");
	CHECK_RC(dat_pz_create(ia1, &pz), DAT_SUCCESS);
	CHECK_RC(dat_get_handle_type(pz, &type), DAT_SUCCESS);
	CHECK(type == DAT_HANDLE_TYPE_PZ, "PZ handle type %u", type);

	/* object dispatch forwards every argument unchanged */
	DAT_LMR_TRIPLET iov = { 0 };
	ctx.as_64 = 0xfeedfacecafef00dull;
	CHECK_RC(dat_ep_post_send(pz, 1, &iov, ctx, DAT_COMPLETION_SUPPRESS_FLAG), DAT_SUCCESS);
	CHECK(iov.virtual_address == 0xfeedfacecafef00dull && iov.segment_length == DAT_COMPLETION_SUPPRESS_FLAG,
	      "post_send arguments forwarded");
	/* an empty slot is DAT_NOT_IMPLEMENTED, not a jump to NULL */
	CHECK_RC(dat_ep_free(pz), ERRCODE(DAT_NOT_IMPLEMENTED, 0));
	/* the variadic extension call reaches the provider with its va_list */
	CHECK_RC(dat_extension_op(pz, 3, 10, 20, 12, &sum), DAT_SUCCESS);
	CHECK(sum == 42, "extension op va_list sum %d, want 42", sum);
	CHECK_RC(dat_extension_op(ia1, 2, 1, 2, &sum), DAT_SUCCESS);
	CHECK(sum == 3, "extension op on an IA handle, sum %d", sum);

	/* graceful close fails while a child lives; the IA stays usable */
	CHECK_RC(dat_ia_close(ia1, DAT_CLOSE_GRACEFUL_FLAG), ERRCODE(DAT_INVALID_STATE, DAT_INVALID_STATE_IA_IN_USE));
	CHECK_RC(dat_pz_free(pz), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia1, DAT_CLOSE_GRACEFUL_FLAG), DAT_SUCCESS);
	stale = ia1;
	CHECK_RC(dat_ia_close(stale, DAT_CLOSE_ABRUPT_FLAG), 0x8005000b);
	CHECK_RC(dat_ia_query(stale, NULL, 0, NULL, 0, NULL), 0x8005000b);
	CHECK_RC(dat_get_handle_type(stale, &type), 0x8005001b);
	CHECK(strstr(events, "fini") == NULL, "provider stays loaded while an IA is open: '%s'", events);

	/* a new IA in the freed slot does not revive the stale handle */
	CHECK_RC(open_ia("mock", &ia1), DAT_SUCCESS);
	CHECK(ia1 != stale, "reused slot gets a new handle value");
	CHECK_RC(dat_ia_query(stale, NULL, 0, NULL, 0, NULL), 0x8005000b);
	CHECK_RC(dat_ia_close(ia1, DAT_CLOSE_ABRUPT_FLAG), DAT_SUCCESS);

	/* last close: dat_provider_fini, then the library is unloaded */
	CHECK_RC(dat_ia_close(ia2, DAT_CLOSE_ABRUPT_FLAG), DAT_SUCCESS);
	CHECK(strstr(events, "close fini unloaded") != NULL, "fini and dlclose after last close: '%s'", events);

	/* ... and loaded again on the next open */
	events[0] = 0;
	CHECK_RC(open_ia("mock", &ia1), DAT_SUCCESS);
	CHECK(strcmp(events, "init open ") == 0, "reloaded: '%s'", events);
	CHECK_RC(dat_ia_close(ia1, DAT_CLOSE_ABRUPT_FLAG), DAT_SUCCESS);

	/* provider's own open error is returned, library not kept loaded */
	events[0] = 0;
	CHECK_RC(open_ia("mock-fail-open", &ia1), ERRCODE(DAT_INSUFFICIENT_RESOURCES, DAT_RESOURCE_DEVICE));
	CHECK(strstr(events, "init") && strstr(events, "fini"), "failed open unloads: '%s'", events);

	/* entries that cannot load: DAT_PROVIDER_NOT_FOUND and one warning line */
	WITH_STDERR(err, rc = open_ia("missing-lib", &ia1));
	CHECK(DAT_GET_TYPE(rc) == DAT_PROVIDER_NOT_FOUND, "missing library: %#x", rc);
	CHECK(strstr(err, "missing-lib") && strstr(err, "libdoes-not-exist.so.2") &&
		      strstr(err, "cannot open shared object file"),
	      "warning names entry, library and loader error: '%s'", err);
	CHECK(strchr(err, '\n') == err + strlen(err) - 1, "exactly one line: '%s'", err);
	WITH_STDERR(err, rc = open_ia("no-init-symbol", &ia1));
	CHECK(DAT_GET_TYPE(rc) == DAT_PROVIDER_NOT_FOUND, "library without dat_provider_init: %#x", rc);
	CHECK(strstr(err, "no-init-symbol") && strstr(err, "dat_provider_init"), "warning: '%s'", err);
	WITH_STDERR(err, rc = open_ia("no-register", &ia1));
	CHECK(DAT_GET_TYPE(rc) == DAT_PROVIDER_NOT_FOUND, "init that does not register: %#x", rc);
	CHECK(strstr(err, "no-register") && strstr(err, "did not register"), "warning: '%s'", err);
}

/* dat_extension_op's open and close ranges (the IB extensions'
 * dat_ib_open_query / dat_ib_close_query): the registry loads the named
 * provider itself, hands it the name as the handle and the caller's
 * arguments, and releases the provider at the close of the IA it returned. */
static void extension_open_close(void)
{
	DAT_IA_HANDLE q1 = NULL, q2 = NULL, ia;
	DAT_IA_ATTR attr;
	DAT_PROVIDER_ATTR pattr;
	char want[256];

	/* a NULL name and a NULL or foreign handle, as OFED's registry answers */
	CHECK_RC(dat_ib_open_query(NULL, &q1, DAT_IA_FIELD_ALL, &attr, DAT_PROVIDER_FIELD_ALL, &pattr),
		 INVALID(DAT_INVALID_ARG3));
	CHECK_RC(dat_ib_close_query(NULL), INVALID(DAT_INVALID_HANDLE_IA));
	CHECK_RC(dat_ib_close_query((DAT_HANDLE)0x1234), INVALID(DAT_INVALID_HANDLE_IA));
	/* names are looked up as dat_ia_open looks them up */
	CHECK_RC(dat_ib_open_query("no-such-ia", &q1, DAT_IA_FIELD_ALL, &attr, 0, NULL), 0x800a0064);
	CHECK_RC(dat_ib_open_query("hidden", &q1, DAT_IA_FIELD_ALL, &attr, 0, NULL), 0x800a0064);
	CHECK_RC(dat_ib_open_query("mock-threadsafe", &q1, DAT_IA_FIELD_ALL, &attr, 0, NULL),
		 ERRCODE(DAT_PROVIDER_NOT_FOUND, DAT_THREAD_SAFETY_NOT_FOUND));
	CHECK(events[0] == 0, "no provider loaded by failed lookups: '%s'", events);

	/* open: the provider is loaded and gets the name, the op and every
	 * remaining argument; the IA it returns is its own (not a registry
	 * integer), its first word a table the provider never registered */
	memset(&attr, 0, sizeof(attr));
	memset(&pattr, 0, sizeof(pattr));
	CHECK_RC(dat_ib_open_query("mock", &q1, DAT_IA_FIELD_IA_ADDRESS_PTR, &attr, DAT_PROVIDER_FIELD_ALL, &pattr),
		 DAT_SUCCESS);
	snprintf(want, sizeof(want), "init open-query(mock,%#x,%#llx,attr,%#llx,attr) ", DAT_IB_OPEN_QUERY_OP,
		 (unsigned long long)DAT_IA_FIELD_IA_ADDRESS_PTR, (unsigned long long)DAT_PROVIDER_FIELD_ALL);
	CHECK(strcmp(events, want) == 0, "events '%s', want '%s'", events, want);
	CHECK((unsigned long)q1 >= 0x10000, "open query returns the provider's IA %p", q1);
	CHECK(strcmp(attr.adapter_name, "mock adapter") == 0 && strcmp(pattr.provider_name, "mock provider") == 0,
	      "attributes filled by the provider: '%s' '%s'", attr.adapter_name, pattr.provider_name);

	/* the query holds the provider like an IA: an IA opened and closed
	 * meanwhile does not unload it, and a second query shares it */
	CHECK_RC(open_ia("mock", &ia), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(ia, DAT_CLOSE_ABRUPT_FLAG), DAT_SUCCESS);
	CHECK_RC(dat_ib_open_query("mock", &q2, 0, NULL, 0, NULL), DAT_SUCCESS);
	CHECK(q2 != q1 && strstr(events, "fini") == NULL, "provider kept: '%s'", events);

	/* close: the provider closes its IA; the last one unloads it */
	events[0] = 0;
	CHECK_RC(dat_ib_close_query(q1), DAT_SUCCESS);
	CHECK(strcmp(events, "close-query ") == 0, "first close: '%s'", events);
	/* closed: no longer the registry's to route (and its first word is no
	 * registered table), so it is not dispatched on; nothing released */
	CHECK_RC(dat_ib_close_query(q1), INVALID(DAT_INVALID_HANDLE_IA));
	CHECK(strcmp(events, "close-query ") == 0, "a second close releases nothing: '%s'", events);
	CHECK_RC(dat_ib_close_query(q2), DAT_SUCCESS);
	CHECK(strcmp(events, "close-query close-query fini unloaded ") == 0, "last close unloads: '%s'", events);
	/* its table is gone with it: the stale IA is not dispatched on */
	CHECK_RC(dat_ib_close_query(q2), INVALID(DAT_INVALID_HANDLE_IA));

	/* a provider refusing the open: its error, and the load undone */
	events[0] = 0;
	CHECK_RC(dat_ib_open_query("mock-fail-open", &q1, 0, NULL, 0, NULL),
		 ERRCODE(DAT_INSUFFICIENT_RESOURCES, DAT_RESOURCE_DEVICE));
	CHECK(strstr(events, "init") && strstr(events, "fini unloaded"), "failed open unloads: '%s'", events);

	/* a library that cannot load: DAT_PROVIDER_NOT_FOUND, as for an open */
	char err[2048];
	DAT_RETURN rc;
	WITH_STDERR(err, rc = dat_ib_open_query("missing-lib", &q1, 0, NULL, 0, NULL));
	CHECK(DAT_GET_TYPE(rc) == DAT_PROVIDER_NOT_FOUND && strstr(err, "libdoes-not-exist.so.2"),
	      "missing library: %#x '%s'", rc, err);
}

/* A provider the application registers itself, with no dat.conf entry. */
static DAT_RETURN app_ia_open(const char *name, DAT_COUNT q, DAT_EVD_HANDLE *e, DAT_IA_HANDLE *ia)
{
	(void)name; (void)q; (void)e;
	*ia = (DAT_IA_HANDLE)0x5000;
	return DAT_SUCCESS;
}
static DAT_RETURN app_ia_close(DAT_IA_HANDLE ia, DAT_CLOSE_FLAGS f)
{
	(void)f;
	return ia == (DAT_IA_HANDLE)0x5000 ? DAT_SUCCESS : ERRCODE(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_IA);
}

static void dynamic_registry(void)
{
	static DAT_PROVIDER app;
	DAT_PROVIDER_INFO info = { .ia_name = "app-provider", .dapl_version_major = 2, .is_thread_safe = DAT_FALSE };
	DAT_IA_HANDLE ia, mapped;

	app.ia_open_func = app_ia_open;
	app.ia_close_func = app_ia_close;
	CHECK_RC(dat_registry_add_provider(&app, &info), DAT_SUCCESS);
	CHECK_RC(dat_registry_add_provider(&app, &info), ERRCODE(DAT_PROVIDER_ALREADY_REGISTERED, 0));
	CHECK_RC(open_ia("app-provider", &ia), DAT_SUCCESS);
	CHECK_RC(dats_get_ia_handle(ia, &mapped), DAT_SUCCESS);
	CHECK(mapped == (DAT_IA_HANDLE)0x5000, "dats_get_ia_handle maps to the provider's IA");
	CHECK_RC(dat_ia_close(ia, DAT_CLOSE_ABRUPT_FLAG), DAT_SUCCESS);
	CHECK_RC(dat_registry_remove_provider(&app, &info), DAT_SUCCESS);
	CHECK_RC(dat_registry_remove_provider(&app, &info), ERRCODE(DAT_PROVIDER_NOT_FOUND, DAT_NAME_NOT_REGISTERED));
	CHECK_RC(open_ia("app-provider", &ia), 0x800a0064);
}

static void strerror_names(void)
{
	const char *major = NULL, *minor = NULL;
	CHECK_RC(dat_strerror(0x8005000c, &major, &minor), DAT_SUCCESS);
	CHECK(major && minor && strcmp(major, "DAT_INVALID_HANDLE") == 0 && strcmp(minor, "DAT_INVALID_HANDLE_EP") == 0,
	      "strerror(0x8005000c) = %s %s", major, minor);
	CHECK_RC(dat_strerror(ERRCODE(DAT_INVALID_STATE, DAT_INVALID_STATE_EP_DISCONNECTED), &major, &minor),
		 DAT_SUCCESS);
	CHECK(strcmp(major, "DAT_INVALID_STATE") == 0 && strcmp(minor, "DAT_INVALID_STATE_EP_DISCONNECTED") == 0,
	      "%s %s", major, minor);
	CHECK_RC(dat_strerror(ERRCODE(DAT_NOT_IMPLEMENTED, 0), &major, &minor), DAT_SUCCESS);
	CHECK(strcmp(major, "DAT_NOT_IMPLEMENTED") == 0 && strcmp(minor, "DAT_NO_SUBTYPE") == 0, "%s %s", major, minor);
	CHECK_RC(dat_strerror(ERRCODE(DAT_PROVIDER_NOT_FOUND, DAT_THREAD_SAFETY_NOT_FOUND), &major, &minor),
		 DAT_SUCCESS);
	CHECK(strcmp(minor, "DAT_THREAD_SAFETY_NOT_FOUND") == 0, "%s", minor);
	CHECK_RC(dat_strerror(0x01230000, &major, &minor), BADARG(1));
}

int main(void)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	null_handles();
	bad_handles();
	registry_and_dispatch();
	events[0] = 0;
	extension_open_close();
	dynamic_registry();
	strerror_names();
	return check_summary("test_registry");
}
