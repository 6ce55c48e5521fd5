/* The provider side of the registry: what a provider library exports and
 * calls. Include <dat2/udat.h> first. */
#ifndef _DAT_REGISTRY_H_
#define _DAT_REGISTRY_H_

#include <dat2/udat.h>
#include <dat2/udat_redirection.h>

#define DAT_PROVIDER_INIT_FUNC_NAME dat_provider_init
#define DAT_PROVIDER_FINI_FUNC_NAME dat_provider_fini
#define DAT_PROVIDER_INIT_FUNC_STR "dat_provider_init"
#define DAT_PROVIDER_FINI_FUNC_STR "dat_provider_fini"

#endif /* _DAT_REGISTRY_H_ */
