/* User-level provider table; see dat_redirection.h. */
#ifndef _UDAT_REDIRECTION_H_
#define _UDAT_REDIRECTION_H_

#include <dat/dat_redirection.h>

#endif /* _UDAT_REDIRECTION_H_ */
