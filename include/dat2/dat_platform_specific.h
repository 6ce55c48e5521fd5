/* Platform glue of the DAT headers (Linux). */
#ifndef _DAT_PLATFORM_SPECIFIC_H_
#define _DAT_PLATFORM_SPECIFIC_H_

#include <sys/types.h>
#include <stddef.h>
#include <stdio.h>
#include <inttypes.h>
#include <sys/socket.h>
#include <netinet/in.h>

#ifndef UINT64_C
#define UINT64_C(c) c##ULL
#endif

/* Calling convention and linkage decorations (empty on Linux). */
#define DAT_API
#define DAT_EXPORT extern

/* Parameter direction annotations used in DAT prototypes. */
#ifndef IN
#define IN
#endif
#ifndef OUT
#define OUT
#endif
#ifndef INOUT
#define INOUT
#endif

#define DAT_AF_INET AF_INET
#define DAT_AF_INET6 AF_INET6

/* IA handles are small integers handed out by the registry. */
#define DAT_IA_HANDLE_TO_UL(a) (unsigned long)(a)
#define DAT_UL_TO_IA_HANDLE(a) (DAT_IA_HANDLE)(a)

#endif /* _DAT_PLATFORM_SPECIFIC_H_ */
