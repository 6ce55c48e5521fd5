/* Every handle argument of every DAT 1.2 export is checked for its type
 * (issue 23): test_handle_types's sweep through the DAT 1.2 ABI
 * (<dat/udat.h>, -ldat: our libdat.so.1) on our provider's u1.2 entry
 * ($DAT_TEST_IA, default rs-tcp). The codes are 1.2's (its subtypes from
 * DAT_INVALID_HANDLE1 on are one lower than 2.0's: a 2.0 code passed
 * through unconverted fails here).
 *
 * The pool: one live handle of every type a 1.2 consumer holds -- the IA
 * (the registry's handle), PZ, LMR, RMR, EVDs of six kinds (DTO +
 * RMR_BIND, RMR_BIND only, CONNECTION, CR, SOFTWARE, and the IA's own
 * ASYNC EVD), CNO, EP, PSP, RSP, CR (a pending request: an EP of the IA
 * connecting to the IA's own PSP), SRQ -- and the provider's own IA handle,
 * the one dat_ep_query reports in ia_handle (in 1.2 its first word is the
 * registered 1.2 table, so libdat.so.1 hands it to the provider like any
 * object, and the provider must refuse it wherever another type is due).
 *
 * The sweep (ROWS below): one row per handle argument of an export: the
 * first argument, every further or optional one (the CNO of
 * dat_evd_create, the PZ, EVDs and SRQ of dat_ep_create(_with_srq), the EP
 * of dat_rmr_bind and dat_cr_accept, the async EVD dat_ia_open is given,
 * ...) and the handles inside struct arguments (the PZ and EVDs of
 * dat_ep_modify's DAT_EP_PARAM, the LMR of a DAT_MEM_TYPE_LMR region). A
 * row names the pool handles that are right there; each of the others is
 * passed in that position, the other arguments valid, and must get the
 * row's code: DAT_INVALID_HANDLE with the argument's subtype (an EVD
 * argument's is its role's: an EVD of the wrong kind is a wrong handle
 * there too). Nothing may succeed and nothing may crash; at the end every
 * pool handle is still live and of its type.
 *
 * Codes that are not the type's own subtype: dat_ep_dup_connect's second
 * EP is DAT_INVALID_HANDLE2; the PZ of dat_ep_modify's DAT_EP_PARAM is
 * DAT_INVALID_PARAMETER / DAT_INVALID_ARG3 (a bad ep_param field), its
 * EVDs DAT_INVALID_HANDLE with their role's subtype.
 *
 * Covered: every export of libdat.so.1 with a handle argument (1.2 has no
 * CSP, no dat_extension_op, no dat_cno_fd_create / dat_cno_trigger and
 * none of 2.0's other additions). Not swept: dat_set_consumer_context,
 * dat_get_consumer_context and dat_get_handle_type take a handle of any
 * type (checked instead: each pool handle reports its own type);
 * dat_registry_* and dat_strerror take no handle. Handles in structs that
 * no call reads: DAT_EP_PARAM's ia_handle and srq_handle (dat_ep_modify
 * refuses those mask bits) and DAT_EVENT's evd_handle in dat_evd_post_se.
 * 1.2's DAT_EP_ATTR holds no handle.
 *
 * An IA without RMRs (max_rmrs 0: an iWARP device without memory windows,
 * e.g. soft-iWARP) refuses dat_rmr_create (DAT_INSUFFICIENT_RESOURCES): the
 * pool then has no RMR, and the row that needs a live one (the EP argument
 * of dat_rmr_bind) is skipped, saying so, as test_handle_types does. */
#include <dat/udat.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include "check.h"
#include "dto_pair12.h"

#define BADH(sub) ERRCODE(DAT_INVALID_HANDLE, sub)

/* ------------------------------------------------------------ the pool */

enum kind {
	K_IA,
	K_PIA,
	K_PZ,
	K_LMR,
	K_RMR,
	K_EVD_DTO,
	K_EVD_BIND,
	K_EVD_CONN,
	K_EVD_CR,
	K_EVD_SW,
	K_EVD_ASYNC,
	K_CNO,
	K_EP,
	K_PSP,
	K_RSP,
	K_CR,
	K_SRQ,
	NKINDS
};

#define B(k) (1u << (k))
#define M_EVD (B(K_EVD_DTO) | B(K_EVD_BIND) | B(K_EVD_CONN) | B(K_EVD_CR) | B(K_EVD_SW) | B(K_EVD_ASYNC))

static struct {
	const char *name;
	DAT_HANDLE h;
	int type; /* DAT_HANDLE_TYPE, -1: none to check */
} pool[NKINDS] = {
	[K_IA] = { "IA", 0, DAT_HANDLE_TYPE_IA },
	[K_PIA] = { "provider IA (dat_ep_query's ia_handle)", 0, -1 },
	[K_PZ] = { "PZ", 0, DAT_HANDLE_TYPE_PZ },
	[K_LMR] = { "LMR", 0, DAT_HANDLE_TYPE_LMR },
	[K_RMR] = { "RMR", 0, DAT_HANDLE_TYPE_RMR },
	[K_EVD_DTO] = { "DTO+RMR_BIND EVD", 0, DAT_HANDLE_TYPE_EVD },
	[K_EVD_BIND] = { "RMR_BIND EVD", 0, DAT_HANDLE_TYPE_EVD },
	[K_EVD_CONN] = { "CONNECTION EVD", 0, DAT_HANDLE_TYPE_EVD },
	[K_EVD_CR] = { "CR EVD", 0, DAT_HANDLE_TYPE_EVD },
	[K_EVD_SW] = { "SOFTWARE EVD", 0, DAT_HANDLE_TYPE_EVD },
	[K_EVD_ASYNC] = { "ASYNC EVD", 0, DAT_HANDLE_TYPE_EVD },
	[K_CNO] = { "CNO", 0, DAT_HANDLE_TYPE_CNO },
	[K_EP] = { "EP", 0, DAT_HANDLE_TYPE_EP },
	[K_PSP] = { "PSP", 0, DAT_HANDLE_TYPE_PSP },
	[K_RSP] = { "RSP", 0, DAT_HANDLE_TYPE_RSP },
	[K_CR] = { "CR", 0, DAT_HANDLE_TYPE_CR },
	[K_SRQ] = { "SRQ", 0, DAT_HANDLE_TYPE_SRQ },
};

#define P(k) (pool[k].h)

/* What the rows' other arguments are made of. */
static struct {
	DAT_EP_HANDLE ep2; /* unconnected, no RSP: the EP of rows whose EP is not swept */
	DAT_EP_HANDLE ep_active; /* the requesting side of the pending CR */
	DAT_EP_HANDLE ep_rsp; /* the RSP's */
	DAT_LMR_CONTEXT lctx;
	DAT_RMR_CONTEXT rctx;
	DAT_LMR_TRIPLET seg;
	DAT_RMR_TRIPLET rseg;
	DAT_CONN_QUAL psp_qual, free_qual;
	struct sockaddr_storage addr;
	DAT_OS_WAIT_PROXY_AGENT agent;
	DAT_SRQ_ATTR srq_attr;
	DAT_EVENT se;
	DAT_EP_PARAM modify; /* dat_ep_modify's: a valid change of ep2 */
} g;

static char buf[4096] __attribute__((aligned(64)));

/* Outputs the rows write and never read. */
static DAT_HANDLE out;
static DAT_EVD_HANDLE evd_out;
static DAT_IA_ATTR ia_attr;
static DAT_PROVIDER_ATTR pr_attr;
static DAT_CNO_PARAM cno_param;
static DAT_CR_PARAM cr_param;
static DAT_EVD_PARAM evd_param;
static DAT_EP_PARAM ep_param;
static DAT_LMR_PARAM lmr_param;
static DAT_RMR_PARAM rmr_param;
static DAT_PSP_PARAM psp_param;
static DAT_RSP_PARAM rsp_param;
static DAT_PZ_PARAM pz_param;
static DAT_SRQ_PARAM srq_param;
static DAT_EVENT event;
static DAT_COUNT n1, n2;
static DAT_EP_STATE ep_st;
static DAT_BOOLEAN b1, b2;
static DAT_LMR_CONTEXT lc_out;
static DAT_RMR_CONTEXT rc_out;
static DAT_VLEN len_out;
static DAT_VADDR addr_out;

/* ------------------------------------------------------------ helpers */

typedef DAT_RETURN (*free_fn)(DAT_HANDLE);

/* A create that should have failed and did not: free what it made, so
 * that the pool and the IA stay as they were. */
static DAT_RETURN undo(DAT_RETURN rc, free_fn f)
{
	if (rc == DAT_SUCCESS && out != DAT_HANDLE_NULL)
		f(out);
	out = DAT_HANDLE_NULL;
	return rc;
}

static DAT_RETURN ia_close_abrupt(DAT_HANDLE h)
{
	return dat_ia_close(h, DAT_CLOSE_ABRUPT_FLAG);
}

static DAT_DTO_COOKIE cookie(void)
{
	DAT_DTO_COOKIE c;
	c.as_64 = 0x1234;
	return c;
}

static DAT_REGION_DESCRIPTION va_region(void)
{
	DAT_REGION_DESCRIPTION r;
	r.for_va = buf;
	return r;
}

static DAT_REGION_DESCRIPTION lmr_region(DAT_HANDLE h)
{
	DAT_REGION_DESCRIPTION r;
	r.for_lmr_handle = h;
	return r;
}

/* dat_ia_open given `h` as its async EVD. */
static DAT_RETURN ia_open_async(DAT_HANDLE h)
{
	DAT_EVD_HANDLE async = h;
	out = DAT_HANDLE_NULL;
	return undo(dat_ia_open(dat_test_ia(), 8, &async, (DAT_IA_HANDLE *)&out), ia_close_abrupt);
}

/* dat_ep_modify of ep2 changing one handle field of DAT_EP_PARAM to `h`. */
static DAT_RETURN ep_modify_field(DAT_EP_PARAM_MASK field, DAT_HANDLE h)
{
	DAT_EP_PARAM p;
	memset(&p, 0, sizeof(p));
	if (field == DAT_EP_FIELD_PZ_HANDLE)
		p.pz_handle = h;
	else if (field == DAT_EP_FIELD_RECV_EVD_HANDLE)
		p.recv_evd_handle = h;
	else if (field == DAT_EP_FIELD_REQUEST_EVD_HANDLE)
		p.request_evd_handle = h;
	else
		p.connect_evd_handle = h;
	return dat_ep_modify(g.ep2, field, &p);
}

#define SA(a) ((DAT_IA_ADDRESS_PTR)&(a))
#define LMR_OUTS &lc_out, &rc_out, &len_out, &addr_out
#define EP_FREE ((free_fn)dat_ep_free)

/* ------------------------------------------------------------ the sweep
 *
 * X(id, export, argument, right kinds, code for every other kind, call with
 * the handle `h` in that argument). */
#define ROWS(X)                                                                                                    \
	/* IA handles: the registry's table */                                                                     \
	X(ia_query, "dat_ia_query", "ia_handle", B(K_IA), BADH(DAT_INVALID_HANDLE_IA),                             \
	  dat_ia_query(h, &evd_out, DAT_IA_FIELD_ALL, &ia_attr, DAT_PROVIDER_FIELD_ALL, &pr_attr))                 \
	X(ia_close, "dat_ia_close", "ia_handle", B(K_IA), BADH(DAT_INVALID_HANDLE_IA),                             \
	  dat_ia_close(h, DAT_CLOSE_ABRUPT_FLAG))                                                                  \
	X(ia_open_async, "dat_ia_openv", "*async_evd_handle", B(K_EVD_ASYNC), BADH(DAT_INVALID_HANDLE_EVD_ASYNC),  \
	  ia_open_async(h))                                                                                        \
	X(cno_create, "dat_cno_create", "ia_handle", B(K_IA), BADH(DAT_INVALID_HANDLE_IA),                         \
	  undo(dat_cno_create(h, g.agent, &out), (free_fn)dat_cno_free))                                           \
	X(evd_create, "dat_evd_create", "ia_handle", B(K_IA), BADH(DAT_INVALID_HANDLE_IA),                         \
	  undo(dat_evd_create(h, 8, DAT_HANDLE_NULL, DAT_EVD_DTO_FLAG, &out), (free_fn)dat_evd_free))              \
	X(evd_create_cno, "dat_evd_create", "cno_handle", B(K_CNO), BADH(DAT_INVALID_HANDLE_CNO),                  \
	  undo(dat_evd_create(P(K_IA), 8, h, DAT_EVD_DTO_FLAG, &out), (free_fn)dat_evd_free))                      \
	X(ep_create, "dat_ep_create", "ia_handle", B(K_IA), BADH(DAT_INVALID_HANDLE_IA),                           \
	  undo(dat_ep_create(h, P(K_PZ), P(K_EVD_DTO), P(K_EVD_DTO), P(K_EVD_CONN), NULL, &out), EP_FREE))         \
	X(ep_create_pz, "dat_ep_create", "pz_handle", B(K_PZ), BADH(DAT_INVALID_HANDLE_PZ),                        \
	  undo(dat_ep_create(P(K_IA), h, P(K_EVD_DTO), P(K_EVD_DTO), P(K_EVD_CONN), NULL, &out), EP_FREE))         \
	X(ep_create_recv, "dat_ep_create", "recv_evd_handle", B(K_EVD_DTO), BADH(DAT_INVALID_HANDLE_EVD_RECV),     \
	  undo(dat_ep_create(P(K_IA), P(K_PZ), h, P(K_EVD_DTO), P(K_EVD_CONN), NULL, &out), EP_FREE))              \
	X(ep_create_req, "dat_ep_create", "request_evd_handle", B(K_EVD_DTO) | B(K_EVD_BIND),                      \
	  BADH(DAT_INVALID_HANDLE_EVD_REQUEST),                                                                    \
	  undo(dat_ep_create(P(K_IA), P(K_PZ), P(K_EVD_DTO), h, P(K_EVD_CONN), NULL, &out), EP_FREE))              \
	X(ep_create_conn, "dat_ep_create", "connect_evd_handle", B(K_EVD_CONN), BADH(DAT_INVALID_HANDLE_EVD_CONN), \
	  undo(dat_ep_create(P(K_IA), P(K_PZ), P(K_EVD_DTO), P(K_EVD_DTO), h, NULL, &out), EP_FREE))               \
	X(ep_create_srq, "dat_ep_create_with_srq", "ia_handle", B(K_IA), BADH(DAT_INVALID_HANDLE_IA),              \
	  undo(dat_ep_create_with_srq(h, P(K_PZ), P(K_EVD_DTO), P(K_EVD_DTO), P(K_EVD_CONN), P(K_SRQ), NULL,       \
				      &out),                                                                       \
	       EP_FREE))                                                                                           \
	X(ep_create_srq_pz, "dat_ep_create_with_srq", "pz_handle", B(K_PZ), BADH(DAT_INVALID_HANDLE_PZ),           \
	  undo(dat_ep_create_with_srq(P(K_IA), h, P(K_EVD_DTO), P(K_EVD_DTO), P(K_EVD_CONN), P(K_SRQ), NULL,       \
				      &out),                                                                       \
	       EP_FREE))                                                                                           \
	X(ep_create_srq_recv, "dat_ep_create_with_srq", "recv_evd_handle", B(K_EVD_DTO),                           \
	  BADH(DAT_INVALID_HANDLE_EVD_RECV),                                                                       \
	  undo(dat_ep_create_with_srq(P(K_IA), P(K_PZ), h, P(K_EVD_DTO), P(K_EVD_CONN), P(K_SRQ), NULL, &out),     \
	       EP_FREE))                                                                                           \
	X(ep_create_srq_req, "dat_ep_create_with_srq", "request_evd_handle", B(K_EVD_DTO) | B(K_EVD_BIND),         \
	  BADH(DAT_INVALID_HANDLE_EVD_REQUEST),                                                                    \
	  undo(dat_ep_create_with_srq(P(K_IA), P(K_PZ), P(K_EVD_DTO), h, P(K_EVD_CONN), P(K_SRQ), NULL, &out),     \
	       EP_FREE))                                                                                           \
	X(ep_create_srq_conn, "dat_ep_create_with_srq", "connect_evd_handle", B(K_EVD_CONN),                       \
	  BADH(DAT_INVALID_HANDLE_EVD_CONN),                                                                       \
	  undo(dat_ep_create_with_srq(P(K_IA), P(K_PZ), P(K_EVD_DTO), P(K_EVD_DTO), h, P(K_SRQ), NULL, &out),      \
	       EP_FREE))                                                                                           \
	X(ep_create_srq_srq, "dat_ep_create_with_srq", "srq_handle", B(K_SRQ), BADH(DAT_INVALID_HANDLE_SRQ),       \
	  undo(dat_ep_create_with_srq(P(K_IA), P(K_PZ), P(K_EVD_DTO), P(K_EVD_DTO), P(K_EVD_CONN), h, NULL, &out), \
	       EP_FREE))                                                                                           \
	X(lmr_create, "dat_lmr_create", "ia_handle", B(K_IA), BADH(DAT_INVALID_HANDLE_IA),                         \
	  undo(dat_lmr_create(h, DAT_MEM_TYPE_VIRTUAL, va_region(), 64, P(K_PZ), DAT_MEM_PRIV_ALL_FLAG, &out,      \
			      LMR_OUTS),                                                                           \
	       (free_fn)dat_lmr_free))                                                                             \
	X(lmr_create_pz, "dat_lmr_create", "pz_handle", B(K_PZ), BADH(DAT_INVALID_HANDLE_PZ),                      \
	  undo(dat_lmr_create(P(K_IA), DAT_MEM_TYPE_VIRTUAL, va_region(), 64, h, DAT_MEM_PRIV_ALL_FLAG, &out,      \
			      LMR_OUTS),                                                                           \
	       (free_fn)dat_lmr_free))                                                                             \
	X(lmr_create_region, "dat_lmr_create", "region_description.for_lmr_handle", B(K_LMR),                      \
	  BADH(DAT_INVALID_HANDLE_LMR),                                                                            \
	  undo(dat_lmr_create(P(K_IA), DAT_MEM_TYPE_LMR, lmr_region(h), sizeof(buf), P(K_PZ),                      \
			      DAT_MEM_PRIV_ALL_FLAG, &out, LMR_OUTS),                                              \
	       (free_fn)dat_lmr_free))                                                                             \
	X(lmr_sync_read, "dat_lmr_sync_rdma_read", "ia_handle", B(K_IA), BADH(DAT_INVALID_HANDLE_IA),              \
	  dat_lmr_sync_rdma_read(h, &g.seg, 1))                                                                    \
	X(lmr_sync_write, "dat_lmr_sync_rdma_write", "ia_handle", B(K_IA), BADH(DAT_INVALID_HANDLE_IA),            \
	  dat_lmr_sync_rdma_write(h, &g.seg, 1))                                                                   \
	X(psp_create, "dat_psp_create", "ia_handle", B(K_IA), BADH(DAT_INVALID_HANDLE_IA),                         \
	  undo(dat_psp_create(h, g.free_qual, P(K_EVD_CR), DAT_PSP_CONSUMER_FLAG, &out), (free_fn)dat_psp_free))   \
	X(psp_create_evd, "dat_psp_create", "evd_handle", B(K_EVD_CR), BADH(DAT_INVALID_HANDLE_EVD_CR),            \
	  undo(dat_psp_create(P(K_IA), g.free_qual, h, DAT_PSP_CONSUMER_FLAG, &out), (free_fn)dat_psp_free))       \
	X(psp_create_any, "dat_psp_create_any", "ia_handle", B(K_IA), BADH(DAT_INVALID_HANDLE_IA),                 \
	  undo(dat_psp_create_any(h, &g.free_qual, P(K_EVD_CR), DAT_PSP_CONSUMER_FLAG, &out),                      \
	       (free_fn)dat_psp_free))                                                                             \
	X(psp_create_any_evd, "dat_psp_create_any", "evd_handle", B(K_EVD_CR), BADH(DAT_INVALID_HANDLE_EVD_CR),    \
	  undo(dat_psp_create_any(P(K_IA), &g.free_qual, h, DAT_PSP_CONSUMER_FLAG, &out),                          \
	       (free_fn)dat_psp_free))                                                                             \
	X(rsp_create, "dat_rsp_create", "ia_handle", B(K_IA), BADH(DAT_INVALID_HANDLE_IA),                         \
	  undo(dat_rsp_create(h, g.free_qual, g.ep2, P(K_EVD_CR), &out), (free_fn)dat_rsp_free))                   \
	X(rsp_create_ep, "dat_rsp_create", "ep_handle", B(K_EP), BADH(DAT_INVALID_HANDLE_EP),                      \
	  undo(dat_rsp_create(P(K_IA), g.free_qual, h, P(K_EVD_CR), &out), (free_fn)dat_rsp_free))                 \
	X(rsp_create_evd, "dat_rsp_create", "evd_handle", B(K_EVD_CR), BADH(DAT_INVALID_HANDLE_EVD_CR),            \
	  undo(dat_rsp_create(P(K_IA), g.free_qual, g.ep2, h, &out), (free_fn)dat_rsp_free))                       \
	X(pz_create, "dat_pz_create", "ia_handle", B(K_IA), BADH(DAT_INVALID_HANDLE_IA),                           \
	  undo(dat_pz_create(h, &out), (free_fn)dat_pz_free))                                                      \
	X(srq_create, "dat_srq_create", "ia_handle", B(K_IA), BADH(DAT_INVALID_HANDLE_IA),                         \
	  undo(dat_srq_create(h, P(K_PZ), &g.srq_attr, &out), (free_fn)dat_srq_free))                              \
	X(srq_create_pz, "dat_srq_create", "pz_handle", B(K_PZ), BADH(DAT_INVALID_HANDLE_PZ),                      \
	  undo(dat_srq_create(P(K_IA), h, &g.srq_attr, &out), (free_fn)dat_srq_free))                              \
	/* CNO */                                                                                                  \
	X(cno_modify_agent, "dat_cno_modify_agent", "cno_handle", B(K_CNO), BADH(DAT_INVALID_HANDLE_CNO),          \
	  dat_cno_modify_agent(h, g.agent))                                                                        \
	X(cno_query, "dat_cno_query", "cno_handle", B(K_CNO), BADH(DAT_INVALID_HANDLE_CNO),                        \
	  dat_cno_query(h, DAT_CNO_FIELD_ALL, &cno_param))                                                         \
	X(cno_wait, "dat_cno_wait", "cno_handle", B(K_CNO), BADH(DAT_INVALID_HANDLE_CNO), dat_cno_wait(h, 0, &evd_out)) \
	X(cno_free, "dat_cno_free", "cno_handle", B(K_CNO), BADH(DAT_INVALID_HANDLE_CNO), dat_cno_free(h))         \
	/* CR */                                                                                                   \
	X(cr_query, "dat_cr_query", "cr_handle", B(K_CR), BADH(DAT_INVALID_HANDLE_CR),                             \
	  dat_cr_query(h, DAT_CR_FIELD_ALL, &cr_param))                                                            \
	X(cr_accept, "dat_cr_accept", "cr_handle", B(K_CR), BADH(DAT_INVALID_HANDLE_CR),                           \
	  dat_cr_accept(h, g.ep2, 0, NULL))                                                                        \
	X(cr_accept_ep, "dat_cr_accept", "ep_handle", B(K_EP), BADH(DAT_INVALID_HANDLE_EP),                        \
	  dat_cr_accept(P(K_CR), h, 0, NULL))                                                                      \
	X(cr_reject, "dat_cr_reject", "cr_handle", B(K_CR), BADH(DAT_INVALID_HANDLE_CR), dat_cr_reject(h))         \
	X(cr_handoff, "dat_cr_handoff", "cr_handle", B(K_CR), BADH(DAT_INVALID_HANDLE_CR),                         \
	  dat_cr_handoff(h, g.free_qual))                                                                          \
	/* EVD */                                                                                                  \
	X(evd_query, "dat_evd_query", "evd_handle", M_EVD, BADH(DAT_INVALID_HANDLE_EVD_REQUEST),                   \
	  dat_evd_query(h, DAT_EVD_FIELD_ALL, &evd_param))                                                         \
	X(evd_modify_cno, "dat_evd_modify_cno", "evd_handle", M_EVD, BADH(DAT_INVALID_HANDLE_EVD_REQUEST),         \
	  dat_evd_modify_cno(h, DAT_HANDLE_NULL))                                                                  \
	X(evd_modify_cno_cno, "dat_evd_modify_cno", "cno_handle", B(K_CNO), BADH(DAT_INVALID_HANDLE_CNO),          \
	  dat_evd_modify_cno(P(K_EVD_SW), h))                                                                      \
	X(evd_enable, "dat_evd_enable", "evd_handle", M_EVD, BADH(DAT_INVALID_HANDLE_EVD_REQUEST), dat_evd_enable(h)) \
	X(evd_disable, "dat_evd_disable", "evd_handle", M_EVD, BADH(DAT_INVALID_HANDLE_EVD_REQUEST),               \
	  dat_evd_disable(h))                                                                                      \
	X(evd_wait, "dat_evd_wait", "evd_handle", M_EVD, BADH(DAT_INVALID_HANDLE_EVD_REQUEST),                     \
	  dat_evd_wait(h, 0, 1, &event, &n1))                                                                      \
	X(evd_resize, "dat_evd_resize", "evd_handle", M_EVD, BADH(DAT_INVALID_HANDLE_EVD_REQUEST),                 \
	  dat_evd_resize(h, 32))                                                                                   \
	X(evd_post_se, "dat_evd_post_se", "evd_handle", M_EVD, BADH(DAT_INVALID_HANDLE_EVD_REQUEST),               \
	  dat_evd_post_se(h, &g.se))                                                                               \
	X(evd_dequeue, "dat_evd_dequeue", "evd_handle", M_EVD, BADH(DAT_INVALID_HANDLE_EVD_REQUEST),               \
	  dat_evd_dequeue(h, &event))                                                                              \
	X(evd_set_unwaitable, "dat_evd_set_unwaitable", "evd_handle", M_EVD, BADH(DAT_INVALID_HANDLE_EVD_REQUEST), \
	  dat_evd_set_unwaitable(h))                                                                               \
	X(evd_clear_unwaitable, "dat_evd_clear_unwaitable", "evd_handle", M_EVD,                                   \
	  BADH(DAT_INVALID_HANDLE_EVD_REQUEST), dat_evd_clear_unwaitable(h))                                       \
	X(evd_free, "dat_evd_free", "evd_handle", M_EVD, BADH(DAT_INVALID_HANDLE_EVD_REQUEST), dat_evd_free(h))    \
	/* EP */                                                                                                   \
	X(ep_query, "dat_ep_query", "ep_handle", B(K_EP), BADH(DAT_INVALID_HANDLE_EP),                             \
	  dat_ep_query(h, DAT_EP_FIELD_ALL, &ep_param))                                                            \
	X(ep_modify, "dat_ep_modify", "ep_handle", B(K_EP), BADH(DAT_INVALID_HANDLE_EP),                           \
	  dat_ep_modify(h, DAT_EP_FIELD_CONNECT_EVD_HANDLE, &g.modify))                                            \
	X(ep_modify_pz, "dat_ep_modify", "ep_param->pz_handle", B(K_PZ),                                           \
	  ERRCODE(DAT_INVALID_PARAMETER, DAT_INVALID_ARG3), ep_modify_field(DAT_EP_FIELD_PZ_HANDLE, h))            \
	X(ep_modify_recv, "dat_ep_modify", "ep_param->recv_evd_handle", B(K_EVD_DTO),                              \
	  BADH(DAT_INVALID_HANDLE_EVD_RECV), ep_modify_field(DAT_EP_FIELD_RECV_EVD_HANDLE, h))                     \
	X(ep_modify_req, "dat_ep_modify", "ep_param->request_evd_handle", B(K_EVD_DTO) | B(K_EVD_BIND),            \
	  BADH(DAT_INVALID_HANDLE_EVD_REQUEST), ep_modify_field(DAT_EP_FIELD_REQUEST_EVD_HANDLE, h))               \
	X(ep_modify_conn, "dat_ep_modify", "ep_param->connect_evd_handle", B(K_EVD_CONN),                          \
	  BADH(DAT_INVALID_HANDLE_EVD_CONN), ep_modify_field(DAT_EP_FIELD_CONNECT_EVD_HANDLE, h))                  \
	X(ep_connect, "dat_ep_connect", "ep_handle", B(K_EP), BADH(DAT_INVALID_HANDLE_EP),                         \
	  dat_ep_connect(h, SA(g.addr), g.psp_qual, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT,                         \
			 DAT_CONNECT_DEFAULT_FLAG))                                                                \
	X(ep_dup_connect, "dat_ep_dup_connect", "ep_handle", B(K_EP), BADH(DAT_INVALID_HANDLE_EP),                 \
	  dat_ep_dup_connect(h, g.ep_active, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT))                               \
	X(ep_dup_connect_dup, "dat_ep_dup_connect", "ep_dup_handle", B(K_EP), BADH(DAT_INVALID_HANDLE2),           \
	  dat_ep_dup_connect(g.ep2, h, WAIT_US, 0, NULL, DAT_QOS_BEST_EFFORT))                                     \
	X(ep_disconnect, "dat_ep_disconnect", "ep_handle", B(K_EP), BADH(DAT_INVALID_HANDLE_EP),                   \
	  dat_ep_disconnect(h, DAT_CLOSE_ABRUPT_FLAG))                                                             \
	X(ep_post_send, "dat_ep_post_send", "ep_handle", B(K_EP), BADH(DAT_INVALID_HANDLE_EP),                     \
	  dat_ep_post_send(h, 1, &g.seg, cookie(), DAT_COMPLETION_DEFAULT_FLAG))                                   \
	X(ep_post_recv, "dat_ep_post_recv", "ep_handle", B(K_EP), BADH(DAT_INVALID_HANDLE_EP),                     \
	  dat_ep_post_recv(h, 1, &g.seg, cookie(), DAT_COMPLETION_DEFAULT_FLAG))                                   \
	X(ep_post_rdma_read, "dat_ep_post_rdma_read", "ep_handle", B(K_EP), BADH(DAT_INVALID_HANDLE_EP),           \
	  dat_ep_post_rdma_read(h, 1, &g.seg, cookie(), &g.rseg, DAT_COMPLETION_DEFAULT_FLAG))                     \
	X(ep_post_rdma_write, "dat_ep_post_rdma_write", "ep_handle", B(K_EP), BADH(DAT_INVALID_HANDLE_EP),         \
	  dat_ep_post_rdma_write(h, 1, &g.seg, cookie(), &g.rseg, DAT_COMPLETION_DEFAULT_FLAG))                    \
	X(ep_get_status, "dat_ep_get_status", "ep_handle", B(K_EP), BADH(DAT_INVALID_HANDLE_EP),                   \
	  dat_ep_get_status(h, &ep_st, &b1, &b2))                                                                  \
	X(ep_reset, "dat_ep_reset", "ep_handle", B(K_EP), BADH(DAT_INVALID_HANDLE_EP), dat_ep_reset(h))            \
	X(ep_recv_query, "dat_ep_recv_query", "ep_handle", B(K_EP), BADH(DAT_INVALID_HANDLE_EP),                   \
	  dat_ep_recv_query(h, &n1, &n2))                                                                          \
	X(ep_set_watermark, "dat_ep_set_watermark", "ep_handle", B(K_EP), BADH(DAT_INVALID_HANDLE_EP),             \
	  dat_ep_set_watermark(h, 1, 1))                                                                           \
	X(ep_free, "dat_ep_free", "ep_handle", B(K_EP), BADH(DAT_INVALID_HANDLE_EP), dat_ep_free(h))               \
	/* LMR, RMR */                                                                                             \
	X(lmr_query, "dat_lmr_query", "lmr_handle", B(K_LMR), BADH(DAT_INVALID_HANDLE_LMR),                        \
	  dat_lmr_query(h, DAT_LMR_FIELD_ALL, &lmr_param))                                                         \
	X(lmr_free, "dat_lmr_free", "lmr_handle", B(K_LMR), BADH(DAT_INVALID_HANDLE_LMR), dat_lmr_free(h))         \
	X(rmr_create, "dat_rmr_create", "pz_handle", B(K_PZ), BADH(DAT_INVALID_HANDLE_PZ),                         \
	  undo(dat_rmr_create(h, &out), (free_fn)dat_rmr_free))                                                    \
	X(rmr_query, "dat_rmr_query", "rmr_handle", B(K_RMR), BADH(DAT_INVALID_HANDLE_RMR),                        \
	  dat_rmr_query(h, DAT_RMR_FIELD_ALL, &rmr_param))                                                         \
	X(rmr_bind, "dat_rmr_bind", "rmr_handle", B(K_RMR), BADH(DAT_INVALID_HANDLE_RMR),                          \
	  dat_rmr_bind(h, &g.seg, DAT_MEM_PRIV_REMOTE_READ_FLAG, P(K_EP), cookie(), DAT_COMPLETION_DEFAULT_FLAG,   \
		       &rc_out))                                                                                   \
	X(rmr_bind_ep, "dat_rmr_bind", "ep_handle", B(K_EP), BADH(DAT_INVALID_HANDLE_EP),                          \
	  dat_rmr_bind(P(K_RMR), &g.seg, DAT_MEM_PRIV_REMOTE_READ_FLAG, h, cookie(), DAT_COMPLETION_DEFAULT_FLAG,  \
		       &rc_out))                                                                                   \
	X(rmr_free, "dat_rmr_free", "rmr_handle", B(K_RMR), BADH(DAT_INVALID_HANDLE_RMR), dat_rmr_free(h))         \
	/* service points, PZ, SRQ */                                                                              \
	X(psp_query, "dat_psp_query", "psp_handle", B(K_PSP), BADH(DAT_INVALID_HANDLE_PSP),                        \
	  dat_psp_query(h, DAT_PSP_FIELD_ALL, &psp_param))                                                         \
	X(psp_free, "dat_psp_free", "psp_handle", B(K_PSP), BADH(DAT_INVALID_HANDLE_PSP), dat_psp_free(h))         \
	X(rsp_query, "dat_rsp_query", "rsp_handle", B(K_RSP), BADH(DAT_INVALID_HANDLE_RSP),                        \
	  dat_rsp_query(h, DAT_RSP_FIELD_ALL, &rsp_param))                                                         \
	X(rsp_free, "dat_rsp_free", "rsp_handle", B(K_RSP), BADH(DAT_INVALID_HANDLE_RSP), dat_rsp_free(h))         \
	X(pz_query, "dat_pz_query", "pz_handle", B(K_PZ), BADH(DAT_INVALID_HANDLE_PZ),                             \
	  dat_pz_query(h, DAT_PZ_FIELD_ALL, &pz_param))                                                            \
	X(pz_free, "dat_pz_free", "pz_handle", B(K_PZ), BADH(DAT_INVALID_HANDLE_PZ), dat_pz_free(h))               \
	X(srq_post_recv, "dat_srq_post_recv", "srq_handle", B(K_SRQ), BADH(DAT_INVALID_HANDLE_SRQ),                \
	  dat_srq_post_recv(h, 1, &g.seg, cookie()))                                                               \
	X(srq_query, "dat_srq_query", "srq_handle", B(K_SRQ), BADH(DAT_INVALID_HANDLE_SRQ),                        \
	  dat_srq_query(h, DAT_SRQ_FIELD_ALL, &srq_param))                                                         \
	X(srq_resize, "dat_srq_resize", "srq_handle", B(K_SRQ), BADH(DAT_INVALID_HANDLE_SRQ), dat_srq_resize(h, 8)) \
	X(srq_set_lw, "dat_srq_set_lw", "srq_handle", B(K_SRQ), BADH(DAT_INVALID_HANDLE_SRQ), dat_srq_set_lw(h, 1)) \
	X(srq_free, "dat_srq_free", "srq_handle", B(K_SRQ), BADH(DAT_INVALID_HANDLE_SRQ), dat_srq_free(h))

#define DEFINE_ROW(id, fn, arg, right, want, call)                                                                 \
	static DAT_RETURN row_##id(DAT_HANDLE h)                                                                   \
	{                                                                                                          \
		return call;                                                                                       \
	}
ROWS(DEFINE_ROW)

static const struct row {
	const char *fn, *arg;
	DAT_RETURN (*call)(DAT_HANDLE);
	unsigned right;
	DAT_RETURN want;
} rows[] = {
#define TABLE_ROW(id, fn, arg, right, want, call) { fn, arg, row_##id, right, want },
	ROWS(TABLE_ROW)
};

/* The IA has no RMRs (max_rmrs 0): the pool has none. */
static int no_rmrs;

static void sweep(void)
{
	unsigned nrows = sizeof(rows) / sizeof(rows[0]);
	if (no_rmrs)
		printf("SKIP dat_rmr_bind's ep_handle row, and the RMR as a wrong handle: "
		       "%s has no RMRs (max_rmrs 0)\n",
		       dat_test_ia());
	for (unsigned r = 0; r < nrows; r++)
		for (int k = 0; k < NKINDS; k++) {
			if (rows[r].right & B(k))
				continue;
			if (no_rmrs && (k == K_RMR || rows[r].call == row_rmr_bind_ep))
				continue;
			DAT_RETURN rc = rows[r].call(P(k));
			CHECK(rc == rows[r].want, "%s(%s = the %s) = %#x, want %#x", rows[r].fn, rows[r].arg,
			      pool[k].name, (unsigned)rc, (unsigned)rows[r].want);
		}
	printf("swept %u handle arguments with %d handles each\n", nrows, NKINDS);
}

/* ------------------------------------------------------------ setup */

static DAT_EVD_HANDLE make_evd(DAT_EVD_FLAGS flags)
{
	DAT_EVD_HANDLE e = DAT_HANDLE_NULL;
	CHECK_RC(dat_evd_create(P(K_IA), 64, DAT_HANDLE_NULL, flags, &e), DAT_SUCCESS);
	return e;
}

static DAT_EP_HANDLE make_ep(void)
{
	DAT_EP_HANDLE e = DAT_HANDLE_NULL;
	CHECK_RC(dat_ep_create(P(K_IA), P(K_PZ), P(K_EVD_DTO), P(K_EVD_DTO), P(K_EVD_CONN), NULL, &e), DAT_SUCCESS);
	return e;
}

/* A conn_qual no service point of this IA listens on. */
static DAT_CONN_QUAL unused_qual(void)
{
	DAT_CONN_QUAL q = 0;
	DAT_PSP_HANDLE psp = DAT_HANDLE_NULL;
	CHECK_RC(dat_psp_create_any(P(K_IA), &q, P(K_EVD_CR), DAT_PSP_CONSUMER_FLAG, &psp), DAT_SUCCESS);
	CHECK_RC(dat_psp_free(psp), DAT_SUCCESS);
	return q;
}

static int setup(void)
{
	DAT_EVD_HANDLE async = DAT_HANDLE_NULL;
	DAT_EVENT ev;

	CHECK_RC(dat_ia_open(dat_test_ia(), 8, &async, &P(K_IA)), DAT_SUCCESS);
	if (check_failed)
		return 0;
	P(K_EVD_ASYNC) = async;
	CHECK_RC(dat_pz_create(P(K_IA), &P(K_PZ)), DAT_SUCCESS);
	P(K_LMR) = lmr_make(P(K_IA), P(K_PZ), buf, sizeof(buf), DAT_MEM_PRIV_ALL_FLAG, &g.lctx, &g.rctx);
	no_rmrs = ia_attr_of(P(K_IA)).max_rmrs == 0;
	if (no_rmrs)
		CHECK_TYPE(dat_rmr_create(P(K_PZ), &P(K_RMR)), DAT_INSUFFICIENT_RESOURCES);
	else
		CHECK_RC(dat_rmr_create(P(K_PZ), &P(K_RMR)), DAT_SUCCESS);
	P(K_EVD_DTO) = make_evd(DAT_EVD_DTO_FLAG | DAT_EVD_RMR_BIND_FLAG);
	P(K_EVD_BIND) = make_evd(DAT_EVD_RMR_BIND_FLAG);
	P(K_EVD_CONN) = make_evd(DAT_EVD_CONNECTION_FLAG);
	P(K_EVD_CR) = make_evd(DAT_EVD_CR_FLAG);
	P(K_EVD_SW) = make_evd(DAT_EVD_SOFTWARE_FLAG);
	CHECK_RC(dat_cno_create(P(K_IA), DAT_OS_WAIT_PROXY_AGENT_NULL, &P(K_CNO)), DAT_SUCCESS);
	P(K_EP) = make_ep();
	g.ep2 = make_ep();
	g.ep_active = make_ep();
	g.ep_rsp = make_ep();
	g.srq_attr.max_recv_dtos = 4;
	g.srq_attr.max_recv_iov = 1;
	g.srq_attr.low_watermark = 0;
	CHECK_RC(dat_srq_create(P(K_IA), P(K_PZ), &g.srq_attr, &P(K_SRQ)), DAT_SUCCESS);
	CHECK_RC(dat_psp_create_any(P(K_IA), &g.psp_qual, P(K_EVD_CR), DAT_PSP_CONSUMER_FLAG, &P(K_PSP)),
		 DAT_SUCCESS);
	CHECK_RC(dat_rsp_create(P(K_IA), unused_qual(), g.ep_rsp, P(K_EVD_CR), &P(K_RSP)), DAT_SUCCESS);
	g.free_qual = unused_qual();

	/* the IA's address with the PSP's port */
	memcpy(&g.addr, ia_address(P(K_IA)), sizeof(g.addr));
	CHECK(g.addr.ss_family == AF_INET, "the IA's address is IPv4 (family %d)", g.addr.ss_family);
	((struct sockaddr_in *)&g.addr)->sin_port = htons((uint16_t)g.psp_qual);

	/* a pending CR: ep_active asks the IA's own PSP (no timeout: the
	 * request stays pending however long the sweep takes) */
	CHECK_RC(dat_ep_connect(g.ep_active, SA(g.addr), g.psp_qual, DAT_TIMEOUT_INFINITE, 0, NULL, DAT_QOS_BEST_EFFORT,
				DAT_CONNECT_DEFAULT_FLAG),
		 DAT_SUCCESS);
	DAT_RETURN rc = wait_event(P(K_EVD_CR), &ev);
	CHECK(rc == DAT_SUCCESS && ev.event_number == DAT_CONNECTION_REQUEST_EVENT, "request: wait = %#x, event %#x",
	      (unsigned)rc, ev.event_number);
	if (rc == DAT_SUCCESS && ev.event_number == DAT_CONNECTION_REQUEST_EVENT)
		P(K_CR) = ev.event_data.cr_arrival_event_data.cr_handle;

	/* the provider's own IA handle, as dat_ep_query reports it */
	memset(&ep_param, 0, sizeof(ep_param));
	CHECK_RC(dat_ep_query(P(K_EP), DAT_EP_FIELD_ALL, &ep_param), DAT_SUCCESS);
	P(K_PIA) = ep_param.ia_handle;
	CHECK(P(K_PIA) != DAT_HANDLE_NULL && P(K_PIA) != P(K_IA), "dat_ep_query's ia_handle %p (the IA is %p)",
	      (void *)P(K_PIA), (void *)P(K_IA));

	/* the rows' valid other arguments */
	g.seg = seg(g.lctx, buf, 64);
	g.rseg = rseg(g.rctx, buf + 128, 64);
	g.agent = DAT_OS_WAIT_PROXY_AGENT_NULL;
	memset(&g.se, 0, sizeof(g.se));
	g.se.event_number = DAT_SOFTWARE_EVENT;
	g.se.evd_handle = P(K_EVD_SW);
	g.se.event_data.software_event_data.pointer = buf;
	memset(&g.modify, 0, sizeof(g.modify));
	g.modify.connect_evd_handle = P(K_EVD_CONN);

	for (int k = 0; k < NKINDS; k++)
		CHECK(P(k) != DAT_HANDLE_NULL || (no_rmrs && k == K_RMR), "pool: no %s", pool[k].name);
	return !check_failed;
}

/* Every pool handle still live and of its type: no wrong call freed or
 * changed one. */
static void pool_intact(const char *when)
{
	for (int k = 0; k < NKINDS; k++) {
		DAT_HANDLE_TYPE t = (DAT_HANDLE_TYPE)-1;
		if (pool[k].type < 0 || (no_rmrs && k == K_RMR))
			continue;
		DAT_RETURN rc = dat_get_handle_type(P(k), &t);
		CHECK(rc == DAT_SUCCESS && t == (DAT_HANDLE_TYPE)pool[k].type,
		      "%s: dat_get_handle_type(the %s) = %#x, type %d, want type %d", when, pool[k].name, (unsigned)rc,
		      (int)t, pool[k].type);
	}
}

int main(void)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	if (!setup())
		return check_summary("test_handle_types12");
	pool_intact("before the sweep");
	sweep();
	pool_intact("after the sweep");
	CHECK_RC(dat_cr_reject(P(K_CR)), DAT_SUCCESS);
	CHECK_RC(dat_ia_close(P(K_IA), DAT_CLOSE_ABRUPT_FLAG), DAT_SUCCESS);
	return check_summary("test_handle_types12");
}
