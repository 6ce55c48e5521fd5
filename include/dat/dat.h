/* The DAT 1.2 API common to user and kernel consumers. */
#ifndef _DAT_H_
#define _DAT_H_

#include <dat/dat_platform_specific.h>
#include <dat/dat_types.h>
#include <dat/dat_error.h>
#include <dat/dat_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DAT_HANDLE_NULL ((DAT_HANDLE)NULL)

/* Special values of the async EVD handle passed to dat_ia_open. */
#define DAT_EVD_ASYNC_EXISTS ((DAT_EVD_HANDLE)0x1)
#define DAT_EVD_OUT_OF_SCOPE ((DAT_EVD_HANDLE)0x2)

#define DAT_OS_WAIT_PROXY_AGENT_NULL \
	(DAT_OS_WAIT_PROXY_AGENT) { (DAT_PVOID)NULL, (DAT_AGENT_FUNC)NULL }

/* Older spellings of DAT_IA_ATTR fields, kept by the DAT 1.2 headers. */
#define max_rdma_read_per_ep max_rdma_read_per_ep_in
#define max_mtu_size max_message_size

/* Opens an IA of the version this source is compiled for: 1.2, with the
 * thread safety of udat_config.h. */
#define dat_ia_open(name, qlen, async_evd, ia)                               \
	dat_ia_openv((name), (qlen), (async_evd), (ia), DAT_VERSION_MAJOR,   \
		     DAT_VERSION_MINOR, DAT_THREADSAFE)

#ifdef __cplusplus
}
#endif

#endif /* _DAT_H_ */
