/* The provider side of the DAT 1.2 registry: what a provider library
 * exports and calls (dat_registry_add_provider and _remove_provider are
 * declared in dat_api.h). Include <dat/udat.h> first. */
#ifndef _DAT_REGISTRY_H_
#define _DAT_REGISTRY_H_

#include <dat/udat.h>
#include <dat/udat_redirection.h>

#define DAT_PROVIDER_INIT_FUNC_NAME dat_provider_init
#define DAT_PROVIDER_FINI_FUNC_NAME dat_provider_fini
#define DAT_PROVIDER_INIT_FUNC_STR "dat_provider_init"
#define DAT_PROVIDER_FINI_FUNC_STR "dat_provider_fini"

#endif /* _DAT_REGISTRY_H_ */
