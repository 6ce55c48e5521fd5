/* A stand-in provider for the registry tests: a DAT_PROVIDER whose calls
 * record what reached them, so the tests can see libdat2's dispatch, IA
 * handle mapping, reference counts and unloading. It reports events to the
 * test program through mock_event() when the program defines one. */
#include <dat2/udat.h>
#include <dat2/dat_registry.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"

#define MOCK_MAGIC 0x4d4f434bu

struct mock_object {
	DAT_PROVIDER *provider; /* first word: what libdat2 dispatches on */
	unsigned magic;
	DAT_HANDLE_TYPE type;
	DAT_CONTEXT context;
	struct mock_object *ia; /* owning IA, for children */
	int children;
};

static DAT_PROVIDER mock_provider;

static void event(const char *what)
{
	void (*ev)(const char *) = (void (*)(const char *))dlsym(RTLD_DEFAULT, "mock_event");
	if (ev)
		ev(what);
}

static struct mock_object *object(DAT_HANDLE h, DAT_HANDLE_TYPE type)
{
	struct mock_object *o = h;
	return (o && o->magic == MOCK_MAGIC && o->type == type) ? o : NULL;
}

static struct mock_object *new_object(DAT_HANDLE_TYPE type, struct mock_object *ia)
{
	struct mock_object *o = calloc(1, sizeof(*o));
	o->provider = &mock_provider;
	o->magic = MOCK_MAGIC;
	o->type = type;
	o->ia = ia;
	if (ia)
		ia->children++;
	return o;
}

static DAT_RETURN mock_ia_open(const char *name, DAT_COUNT qlen, DAT_EVD_HANDLE *async_evd, DAT_IA_HANDLE *ia)
{
	(void)qlen;
	if (strcmp(name, "mock-fail-open") == 0)
		return ERRCODE(DAT_INSUFFICIENT_RESOURCES, DAT_RESOURCE_DEVICE);
	*ia = new_object(DAT_HANDLE_TYPE_IA, NULL);
	*async_evd = new_object(DAT_HANDLE_TYPE_EVD, *ia);
	event("open");
	return DAT_SUCCESS;
}

static DAT_RETURN mock_ia_close(DAT_IA_HANDLE h, DAT_CLOSE_FLAGS flags)
{
	struct mock_object *ia = object(h, DAT_HANDLE_TYPE_IA);
	if (!ia)
		return ERRCODE(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_IA);
	/* the async EVD made at open does not count */
	if (flags == DAT_CLOSE_GRACEFUL_FLAG && ia->children > 1)
		return ERRCODE(DAT_INVALID_STATE, DAT_INVALID_STATE_IA_IN_USE);
	ia->magic = 0; /* leaked on purpose: a stale handle must stay readable */
	event("close");
	return DAT_SUCCESS;
}

static DAT_RETURN mock_ia_query(DAT_IA_HANDLE h, DAT_EVD_HANDLE *evd, DAT_IA_ATTR_MASK m, DAT_IA_ATTR *a,
				DAT_PROVIDER_ATTR_MASK pm, DAT_PROVIDER_ATTR *pa)
{
	(void)evd; (void)m; (void)pm; (void)pa;
	if (!object(h, DAT_HANDLE_TYPE_IA))
		return ERRCODE(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_IA);
	if (a)
		strcpy(a->adapter_name, "mock adapter");
	return DAT_SUCCESS;
}

static DAT_RETURN mock_get_handle_type(DAT_HANDLE h, DAT_HANDLE_TYPE *type)
{
	struct mock_object *o = h;
	if (!o || o->magic != MOCK_MAGIC)
		return ERRCODE(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE1);
	*type = o->type;
	return DAT_SUCCESS;
}

static DAT_RETURN mock_set_context(DAT_HANDLE h, DAT_CONTEXT c)
{
	struct mock_object *o = h;
	if (!o || o->magic != MOCK_MAGIC)
		return ERRCODE(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE1);
	o->context = c;
	return DAT_SUCCESS;
}

static DAT_RETURN mock_get_context(DAT_HANDLE h, DAT_CONTEXT *c)
{
	struct mock_object *o = h;
	if (!o || o->magic != MOCK_MAGIC)
		return ERRCODE(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE1);
	*c = o->context;
	return DAT_SUCCESS;
}

static DAT_RETURN mock_pz_create(DAT_IA_HANDLE h, DAT_PZ_HANDLE *pz)
{
	struct mock_object *ia = object(h, DAT_HANDLE_TYPE_IA);
	if (!ia)
		return ERRCODE(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_IA);
	*pz = new_object(DAT_HANDLE_TYPE_PZ, ia);
	return DAT_SUCCESS;
}

static DAT_RETURN mock_pz_free(DAT_PZ_HANDLE h)
{
	struct mock_object *pz = object(h, DAT_HANDLE_TYPE_PZ);
	if (!pz)
		return ERRCODE(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_PZ);
	pz->magic = 0;
	pz->ia->children--;
	return DAT_SUCCESS;
}

/* Echoes its arguments back through the IOV so the test can see that the
 * registry forwarded them unchanged. */
static DAT_RETURN mock_ep_post_send(DAT_EP_HANDLE ep, DAT_COUNT n, DAT_LMR_TRIPLET *iov, DAT_DTO_COOKIE cookie,
				    DAT_COMPLETION_FLAGS flags)
{
	if (!object(ep, DAT_HANDLE_TYPE_PZ))
		return ERRCODE(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_EP);
	if (n != 1 || !iov)
		return ERRCODE(DAT_INVALID_PARAMETER, DAT_INVALID_ARG2);
	iov->virtual_address = cookie.as_64;
	iov->segment_length = (DAT_SEG_LENGTH)flags;
	return DAT_SUCCESS;
}

/* The open-query extension (dat_ib_open_query): the registry passes the IA
 * name as the handle and the rest of the caller's arguments. Opens a mock
 * IA, fills what was asked for, and reports "open-query(<name>,<op>,<masks
 * and pointers as seen>)". */
static DAT_RETURN mock_open_query(const char *name, DAT_EXTENDED_OP op, va_list args)
{
	char what[256];
	DAT_HANDLE *ia_out = va_arg(args, DAT_HANDLE *);
	DAT_IA_ATTR_MASK ia_mask = va_arg(args, DAT_IA_ATTR_MASK);
	DAT_IA_ATTR *ia_attr = va_arg(args, DAT_IA_ATTR *);
	DAT_PROVIDER_ATTR_MASK pr_mask = va_arg(args, DAT_PROVIDER_ATTR_MASK);
	DAT_PROVIDER_ATTR *pr_attr = va_arg(args, DAT_PROVIDER_ATTR *);

	snprintf(what, sizeof(what), "open-query(%s,%#x,%#llx,%s,%#llx,%s)", name, (unsigned)op,
		 (unsigned long long)ia_mask, ia_attr ? "attr" : "null", (unsigned long long)pr_mask,
		 pr_attr ? "attr" : "null");
	event(what);
	if (strcmp(name, "mock-fail-open") == 0)
		return ERRCODE(DAT_INSUFFICIENT_RESOURCES, DAT_RESOURCE_DEVICE);
	if (!ia_out)
		return ERRCODE(DAT_INVALID_PARAMETER, DAT_INVALID_ARG4);
	/* Its first word is a copy of the table, never registered, as our
	 * provider's IAs have (one naming each IA, for OFED's registry): the
	 * registry must close it through the provider that opened it. */
	static DAT_PROVIDER query_table;
	struct mock_object *ia = new_object(DAT_HANDLE_TYPE_IA, NULL);
	query_table = mock_provider;
	query_table.device_name = "mock-query";
	ia->provider = &query_table;
	*ia_out = ia;
	if (ia_attr)
		strcpy(ia_attr->adapter_name, "mock adapter");
	if (pr_attr)
		strcpy(pr_attr->provider_name, "mock provider");
	return DAT_SUCCESS;
}

/* Its close (dat_ib_close_query): the handle is the mock IA of the open. */
static DAT_RETURN mock_close_query(DAT_HANDLE h)
{
	struct mock_object *ia = object(h, DAT_HANDLE_TYPE_IA);
	if (!ia)
		return ERRCODE(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE_IA);
	ia->magic = 0; /* leaked on purpose, as at mock_ia_close */
	event("close-query");
	return DAT_SUCCESS;
}

/* Other ops: the sum of `op` int arguments, which proves the va_list made
 * it through. */
static DAT_RETURN mock_extendedop(DAT_HANDLE h, DAT_EXTENDED_OP op, va_list args)
{
	int sum = 0, *out;
	if (op & DAT_OPEN_EXTENSION_BASE)
		return mock_open_query((const char *)h, op, args);
	if (op & DAT_CLOSE_EXTENSION_BASE)
		return mock_close_query(h);
	if (!h)
		return ERRCODE(DAT_INVALID_HANDLE, DAT_INVALID_HANDLE1);
	for (int i = 0; i < op; i++)
		sum += va_arg(args, int);
	out = va_arg(args, int *);
	*out = sum;
	return DAT_SUCCESS;
}

void dat_provider_init(const DAT_PROVIDER_INFO *info, const char *ia_params)
{
	mock_provider.device_name = "mock";
	mock_provider.ia_open_func = mock_ia_open;
	mock_provider.ia_close_func = mock_ia_close;
	mock_provider.ia_query_func = mock_ia_query;
	mock_provider.get_handle_type_func = mock_get_handle_type;
	mock_provider.set_consumer_context_func = mock_set_context;
	mock_provider.get_consumer_context_func = mock_get_context;
	mock_provider.pz_create_func = mock_pz_create;
	mock_provider.pz_free_func = mock_pz_free;
	mock_provider.ep_post_send_func = mock_ep_post_send;
	mock_provider.handle_extendedop_func = mock_extendedop;
	event("init");
	if (strcmp(ia_params, "no-register") == 0)
		return;
	dat_registry_add_provider(&mock_provider, info);
}

void dat_provider_fini(const DAT_PROVIDER_INFO *info)
{
	dat_registry_remove_provider(&mock_provider, info);
	event("fini");
}

__attribute__((destructor)) static void mock_unloaded(void)
{
	event("unloaded");
}
