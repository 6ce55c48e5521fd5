/* How the registry reaches a provider: every non-IA handle starts with a
 * pointer to its provider's DAT_PROVIDER table (the 70-slot DAT 1.2 table,
 * defined in dat_types.h). */
#ifndef _DAT_REDIRECTION_H_
#define _DAT_REDIRECTION_H_

#include <dat/dat.h>

#define DAT_HANDLE_TO_PROVIDER(handle) (*(DAT_PROVIDER **)(handle))

#endif /* _DAT_REDIRECTION_H_ */
