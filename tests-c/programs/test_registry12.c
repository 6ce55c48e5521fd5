/* libdat.so.1, the DAT 1.2 registry, without any provider library: names
 * dat.conf does not serve, bad handles of every kind (NULL, small
 * integers, garbage, closed), 1.2 return codes and their names, the
 * dat.conf entries it lists, and dispatch through a 1.2 provider table this
 * program registers itself (empty slots, results passed through).
 *
 * Writes its own dat.conf and points DAT_OVERRIDE at it before the first
 * registry call (the registry reads dat.conf once). */
#include <dat/udat.h>
#include <dat/dat_registry.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"

#define INVALID(sub) ERRCODE(DAT_INVALID_HANDLE, sub)
#define BADARG(n) ERRCODE(DAT_INVALID_PARAMETER, DAT_INVALID_ARG##n)
#define NOT_FOUND(sub) ERRCODE(DAT_PROVIDER_NOT_FOUND, sub)

/* Runs `call` with stderr captured into buf. */
#define WITH_STDERR(buf, call)                                                  \
	do {                                                                    \
		char tmpl_[] = "/tmp/dat12-stderr-XXXXXX";                      \
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

static char conf_path[] = "/tmp/dat12-conf-XXXXXX";

/* Three entries libdat serves (u1.2, default) and four it does not. */
static void write_conf(void)
{
	int fd = mkstemp(conf_path);
	FILE *f = fdopen(fd, "w");
	fputs("# written by test_registry12\n"
	      "t12 u1.2 nonthreadsafe default libdat12-missing.so.1 dapl.1.2 \"\" \"\"\n"
	      "t12-ts u1.2 threadsafe default libdat12-missing.so.1 dapl.1.2 \"x\" \"\"\n"
	      "t11 u1.1 nonthreadsafe default libdat12-missing.so.1 dapl.1.1 \"\" \"\"\n"
	      "t20 u2.0 nonthreadsafe default libdat12-missing.so.2 dapl.2.0 \"\" \"\"\n"
	      "t12-hidden u1.2 nonthreadsafe nondefault libdat12-missing.so.1 dapl.1.2 \"\" \"\"\n"
	      "t12-kernel k1.2 nonthreadsafe default libdat12-missing.so.1 dapl.1.2 \"\" \"\"\n"
	      "not an entry\n",
	      f);
	fclose(f);
	setenv("DAT_OVERRIDE", conf_path, 1);
}

static void names_not_served(void)
{
	DAT_IA_HANDLE ia = NULL;
	DAT_EVD_HANDLE evd = DAT_HANDLE_NULL;
	char err[2048];

	/* 1.2 values: DAT_NAME_NOT_REGISTERED is 98 (2.0: 100). */
	CHECK_RC(dat_ia_open("no-such-ia", 8, &evd, &ia), NOT_FOUND(DAT_NAME_NOT_REGISTERED));
	CHECK_RC(dat_ia_open("no-such-ia", 8, &evd, &ia), 0x800a0062);
	CHECK(ia == NULL, "no handle stored on failure");
	/* only a 2.0 entry of that name: no 1.x entry */
	CHECK_RC(dat_ia_open("t20", 8, &evd, &ia), NOT_FOUND(DAT_MAJOR_NOT_FOUND));
	CHECK_RC(dat_ia_open("t11", 8, &evd, &ia), NOT_FOUND(DAT_MINOR_NOT_FOUND));
	CHECK_RC(dat_ia_openv("t12-ts", 8, &evd, &ia, 1, 2, DAT_FALSE),
		 NOT_FOUND(DAT_THREAD_SAFETY_NOT_FOUND));
	/* libdat.so.1 serves DAT 1.x only */
	CHECK_RC(dat_ia_openv("t20", 8, &evd, &ia, 2, 0, DAT_FALSE), NOT_FOUND(DAT_MAJOR_NOT_FOUND));
	/* nondefault and kernel entries take no part */
	CHECK_RC(dat_ia_open("t12-hidden", 8, &evd, &ia), NOT_FOUND(DAT_NAME_NOT_REGISTERED));
	CHECK_RC(dat_ia_open("t12-kernel", 8, &evd, &ia), NOT_FOUND(DAT_NAME_NOT_REGISTERED));
	/* an entry whose library cannot load: one warning, from libdat */
	WITH_STDERR(err, CHECK_RC(dat_ia_open("t12", 8, &evd, &ia), NOT_FOUND(DAT_NAME_NOT_REGISTERED)));
	CHECK(strncmp(err, "libdat: warning: ", 17) == 0 && strstr(err, "'t12'") &&
		      strstr(err, "libdat12-missing.so.1"),
	      "warning names libdat, entry and library: '%s'", err);
	/* arguments */
	CHECK_RC(dat_ia_open(NULL, 8, &evd, &ia), BADARG(1));
	CHECK_RC(dat_ia_open("t12", 8, NULL, &ia), BADARG(3));
	CHECK_RC(dat_ia_open("t12", 8, &evd, NULL), BADARG(4));
}

/* A 1.2 provider table this program registers itself: ia_open, ia_close,
 * get_handle_type and ep_post_send filled in, every other slot NULL. */
static int opens, closes, posts;
static char provider_ia_storage[64] __attribute__((aligned(8)));

static DAT_RETURN fake_ia_open(const char *name, DAT_COUNT qlen, DAT_EVD_HANDLE *evd, DAT_IA_HANDLE *ia)
{
	(void)qlen;
	(void)evd;
	opens++;
	if (strcmp(name, "self12-fail") == 0)
		/* a 1.2 code whose subtype 1.2 numbers one lower than 2.0 */
		return BADARG(3);
	*ia = (DAT_IA_HANDLE)provider_ia_storage;
	return DAT_SUCCESS;
}

static DAT_RETURN fake_ia_close(DAT_IA_HANDLE ia, DAT_CLOSE_FLAGS flags)
{
	(void)flags;
	closes++;
	return ia == (DAT_IA_HANDLE)provider_ia_storage ? DAT_SUCCESS : INVALID(DAT_INVALID_HANDLE_IA);
}

static DAT_RETURN fake_get_handle_type(DAT_HANDLE h, DAT_HANDLE_TYPE *type)
{
	*type = h == (DAT_HANDLE)provider_ia_storage ? DAT_HANDLE_TYPE_IA : DAT_HANDLE_TYPE_EP;
	return DAT_SUCCESS;
}

static DAT_RETURN fake_post_send(DAT_EP_HANDLE ep, DAT_COUNT n, DAT_LMR_TRIPLET *iov, DAT_DTO_COOKIE cookie,
				 DAT_COMPLETION_FLAGS flags)
{
	(void)ep;
	(void)iov;
	(void)cookie;
	(void)flags;
	posts++;
	/* 1.2's DAT_INVALID_ARG2 (37; 2.0 numbers it 38): must pass unchanged */
	return n < 0 ? BADARG(2) : DAT_SUCCESS;
}

static DAT_PROVIDER fake_provider = {
	.device_name = "self12",
	.ia_open_func = fake_ia_open,
	.ia_close_func = fake_ia_close,
	.get_handle_type_func = fake_get_handle_type,
	.ep_post_send_func = fake_post_send,
};

static DAT_PROVIDER_INFO info_of(const char *name, DAT_UINT32 major, DAT_UINT32 minor)
{
	DAT_PROVIDER_INFO info;
	memset(&info, 0, sizeof(info));
	strncpy(info.ia_name, name, sizeof(info.ia_name) - 1);
	info.dapl_version_major = major;
	info.dapl_version_minor = minor;
	info.is_thread_safe = DAT_FALSE;
	return info;
}

/* Handles that are not objects, tried on a sample of calls: each gives its
 * call's DAT_INVALID_HANDLE subtype in 1.2 numbering, and nothing crashes. */
static void bad_handles(DAT_HANDLE closed_ia, DAT_HANDLE closed_ep)
{
	static uint64_t zeroed[8];
	/* an object-like buffer whose first word points at memory that is not
	 * a registered table */
	static void *fake_object[2] = { zeroed, NULL };
	DAT_HANDLE bad[] = { NULL, (DAT_HANDLE)1, (DAT_HANDLE)0x101, (DAT_HANDLE)0xfff8, zeroed,
			     (DAT_HANDLE)((char *)zeroed + 1), fake_object, closed_ia, closed_ep };
	DAT_LMR_TRIPLET iov = { 0 };
	DAT_RMR_TRIPLET riov = { 0 };
	DAT_DTO_COOKIE cookie = { 0 };
	DAT_RMR_COOKIE rcookie = { 0 };
	DAT_REGION_DESCRIPTION region = { 0 };
	DAT_RMR_CONTEXT rctx;
	DAT_LMR_CONTEXT lctx;
	DAT_VLEN len;
	DAT_VADDR addr;
	DAT_HANDLE_TYPE type;
	DAT_EVENT ev;
	DAT_COUNT nmore;
	DAT_HANDLE h;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		DAT_HANDLE b = bad[i];
		CHECK_RC(dat_ep_post_send(b, 1, &iov, cookie, DAT_COMPLETION_DEFAULT_FLAG),
			 INVALID(DAT_INVALID_HANDLE_EP));
		CHECK_RC(dat_ep_post_rdma_read(b, 1, &iov, cookie, &riov, DAT_COMPLETION_DEFAULT_FLAG),
			 INVALID(DAT_INVALID_HANDLE_EP));
		CHECK_RC(dat_rmr_bind(b, &iov, DAT_MEM_PRIV_REMOTE_READ_FLAG, NULL, rcookie,
				      DAT_COMPLETION_DEFAULT_FLAG, &rctx),
			 INVALID(DAT_INVALID_HANDLE_RMR));
		CHECK_RC(dat_evd_wait(b, 0, 1, &ev, &nmore), INVALID(DAT_INVALID_HANDLE_EVD_REQUEST));
		CHECK_RC(dat_ia_close(b, DAT_CLOSE_ABRUPT_FLAG), INVALID(DAT_INVALID_HANDLE_IA));
		CHECK_RC(dat_get_handle_type(b, &type), INVALID(DAT_INVALID_HANDLE1));
		CHECK_RC(dat_lmr_create(b, DAT_MEM_TYPE_VIRTUAL, region, 4096, NULL, DAT_MEM_PRIV_ALL_FLAG, &h,
					&lctx, &rctx, &len, &addr),
			 INVALID(DAT_INVALID_HANDLE_IA));
		CHECK_RC(dat_cr_reject(b), INVALID(DAT_INVALID_HANDLE_CR));
		CHECK_RC(dat_pz_free(b), INVALID(DAT_INVALID_HANDLE_PZ));
		CHECK_RC(dat_srq_free(b), INVALID(DAT_INVALID_HANDLE_SRQ));
	}
	/* the same values written out: 1.2's subtypes, not 2.0's */
	CHECK_RC(dat_ep_post_send(NULL, 1, &iov, cookie, 0), 0x8005000c);
	CHECK_RC(dat_rmr_bind(NULL, &iov, 0, NULL, rcookie, 0, &rctx), 0x8005000e);
	CHECK_RC(dat_evd_wait(NULL, 0, 1, &ev, &nmore), 0x80050015);
	CHECK_RC(dat_get_handle_type(NULL, &type), 0x8005001a);
	CHECK_RC(dat_lmr_create(NULL, DAT_MEM_TYPE_VIRTUAL, region, 4096, NULL, 0, &h, &lctx, &rctx, &len, &addr),
		 0x8005000b);
}

/* Dispatch through the table above: an IA opened by name (no dat.conf
 * entry: the application registered it), an object whose first word is the
 * table, empty slots, provider results passed through, then everything
 * closed or unregistered and tried again as bad handles. */
static void own_provider(void)
{
	DAT_PROVIDER_INFO info = info_of("self12", 1, 2), fail_info = info_of("self12-fail", 1, 2);
	DAT_PROVIDER_INFO info20 = info_of("self20", 2, 0);
	DAT_IA_HANDLE ia = NULL;
	DAT_EVD_HANDLE evd = DAT_HANDLE_NULL;
	DAT_HANDLE_TYPE type = 99;
	DAT_LMR_TRIPLET iov = { 0 };
	DAT_DTO_COOKIE cookie = { 0 };
	void *object[2] = { &fake_provider, NULL };
	DAT_PROVIDER other = fake_provider;

	CHECK_RC(dat_registry_add_provider(&fake_provider, &info), DAT_SUCCESS);
	CHECK_RC(dat_registry_add_provider(&fake_provider, &info),
		 ERRCODE(DAT_PROVIDER_ALREADY_REGISTERED, DAT_NO_SUBTYPE));
	CHECK_RC(dat_registry_add_provider(&other, &fail_info), DAT_SUCCESS);
	/* a 2.0 table would be dispatched as a 1.2 one: refused */
	CHECK_RC(dat_registry_add_provider(&other, &info20), BADARG(2));
	CHECK_RC(dat_registry_add_provider(NULL, &info), BADARG(1));
	CHECK_RC(dat_registry_add_provider(&other, NULL), BADARG(2));

	CHECK_RC(dat_ia_open("self12", 8, &evd, &ia), DAT_SUCCESS);
	CHECK(opens == 1 && (uintptr_t)ia > 0 && (uintptr_t)ia < 0x10000,
	      "IA handle %p is a small integer", (void *)ia);
	/* the provider's own failure passes through unconverted */
	DAT_IA_HANDLE ia2 = NULL;
	CHECK_RC(dat_ia_open("self12-fail", 8, &evd, &ia2), BADARG(3));
	CHECK_RC(dat_ia_open("self12-fail", 8, &evd, &ia2), 0x80060026);

	/* the IA handle is mapped to the provider's */
	CHECK_RC(dat_get_handle_type(ia, &type), DAT_SUCCESS);
	CHECK(type == DAT_HANDLE_TYPE_IA, "handle type %d", (int)type);
	CHECK_RC(dat_get_handle_type(object, &type), DAT_SUCCESS);
	CHECK(type == DAT_HANDLE_TYPE_EP, "handle type %d", (int)type);
	/* empty slots: DAT_NOT_IMPLEMENTED, 1.2's 0x0FFF0000 */
	CHECK_RC(dat_ia_query(ia, NULL, 0, NULL, 0, NULL), ERRCODE(DAT_NOT_IMPLEMENTED, DAT_NO_SUBTYPE));
	CHECK_RC(dat_ia_query(ia, NULL, 0, NULL, 0, NULL), 0x8fff0000);
	CHECK_RC(dat_ep_free(object), 0x8fff0000);
	CHECK_RC(dat_cr_reject(object), 0x8fff0000);
	CHECK_RC(dat_pz_create(ia, NULL), 0x8fff0000);
	/* a filled slot: called, its result unchanged */
	CHECK_RC(dat_ep_post_send(object, 1, &iov, cookie, 0), DAT_SUCCESS);
	CHECK_RC(dat_ep_post_send(object, -1, &iov, cookie, 0), 0x80060025);
	CHECK(posts == 2, "post_send called %d times", posts);

	CHECK_RC(dat_ia_close(ia, DAT_CLOSE_ABRUPT_FLAG), DAT_SUCCESS);
	CHECK(closes == 1, "ia_close called %d times", closes);
	CHECK_RC(dat_registry_remove_provider(&fake_provider, &info), DAT_SUCCESS);
	CHECK_RC(dat_registry_remove_provider(&fake_provider, &info), NOT_FOUND(DAT_NAME_NOT_REGISTERED));
	CHECK_RC(dat_registry_remove_provider(&other, &fail_info), DAT_SUCCESS);

	/* closed IA, and an object of a table no longer registered */
	bad_handles(ia, object);
	CHECK(closes == 1 && posts == 2, "no call reached the unregistered provider");
}

static void strerror12(void)
{
	const char *major = NULL, *minor = NULL;

	CHECK_RC(dat_strerror(0x8fff0000, &major, &minor), DAT_SUCCESS);
	CHECK(major && minor && !strcmp(major, "DAT_NOT_IMPLEMENTED") && !strcmp(minor, "DAT_NO_SUBTYPE"),
	      "0x8fff0000 named %s %s", major, minor);
	CHECK_RC(dat_strerror(DAT_NOT_IMPLEMENTED, &major, &minor), DAT_SUCCESS);
	CHECK(!strcmp(major, "DAT_NOT_IMPLEMENTED"), "DAT_NOT_IMPLEMENTED named %s", major);
	/* 27 is DAT_INVALID_HANDLE2 in 1.2 (INVALID_HANDLE1 in 2.0) */
	CHECK_RC(dat_strerror(INVALID(27), &major, &minor), DAT_SUCCESS);
	CHECK(!strcmp(major, "DAT_INVALID_HANDLE") && !strcmp(minor, "DAT_INVALID_HANDLE2"),
	      "0x8005001b named %s %s", major, minor);
	CHECK_RC(dat_strerror(INVALID(DAT_INVALID_HANDLE1), &major, &minor), DAT_SUCCESS);
	CHECK(!strcmp(minor, "DAT_INVALID_HANDLE1"), "DAT_INVALID_HANDLE1 named %s", minor);
	CHECK_RC(dat_strerror(NOT_FOUND(DAT_NAME_NOT_REGISTERED), &major, &minor), DAT_SUCCESS);
	CHECK(!strcmp(major, "DAT_PROVIDER_NOT_FOUND") && !strcmp(minor, "DAT_NAME_NOT_REGISTERED"),
	      "0x800a0062 named %s %s", major, minor);
	CHECK_RC(dat_strerror(ERRCODE(DAT_PRIVILEGES_VIOLATION, DAT_PRIVILEGES_READ), &major, &minor),
		 DAT_SUCCESS);
	CHECK(!strcmp(minor, "DAT_PRIVILEGES_READ"), "DAT_PRIVILEGES_READ named %s", minor);
	/* 2.0's DAT_NOT_IMPLEMENTED is no 1.2 type */
	CHECK_RC(dat_strerror(0xbfff0000, &major, &minor), BADARG(1));
	CHECK_RC(dat_strerror(0, NULL, &minor), BADARG(2));
	CHECK_RC(dat_strerror(0, &major, NULL), BADARG(3));
}

static void list_providers(void)
{
	DAT_PROVIDER_INFO infos[8], *list[8];
	DAT_COUNT n = -1;

	for (int i = 0; i < 8; i++)
		list[i] = &infos[i];
	/* t12, t12-ts, t11: user-level, default, DAT 1.x */
	CHECK_RC(dat_registry_list_providers(0, &n, NULL), DAT_SUCCESS);
	CHECK(n == 3, "%d entries counted, want 3", (int)n);
	CHECK_RC(dat_registry_list_providers(8, &n, list), DAT_SUCCESS);
	CHECK(n == 3, "%d entries listed, want 3", (int)n);
	if (n == 3) {
		CHECK(!strcmp(infos[0].ia_name, "t12") && infos[0].dapl_version_major == 1 &&
			      infos[0].dapl_version_minor == 2 && infos[0].is_thread_safe == DAT_FALSE,
		      "first entry %s %u.%u", infos[0].ia_name, infos[0].dapl_version_major,
		      infos[0].dapl_version_minor);
		CHECK(!strcmp(infos[1].ia_name, "t12-ts") && infos[1].is_thread_safe == DAT_TRUE,
		      "second entry %s", infos[1].ia_name);
		CHECK(!strcmp(infos[2].ia_name, "t11") && infos[2].dapl_version_minor == 1,
		      "third entry %s", infos[2].ia_name);
	}
	CHECK_RC(dat_registry_list_providers(1, &n, list), DAT_SUCCESS);
	CHECK(n == 1, "%d entries with room for 1", (int)n);
	CHECK_RC(dat_registry_list_providers(-1, &n, list), BADARG(1));
	CHECK_RC(dat_registry_list_providers(8, NULL, list), BADARG(2));
	CHECK_RC(dat_registry_list_providers(8, &n, NULL), BADARG(3));
}

int main(void)
{
	write_conf();
	names_not_served();
	bad_handles(NULL, NULL);
	own_provider();
	strerror12();
	list_providers();
	unlink(conf_path);
	return check_summary("test_registry12");
}
