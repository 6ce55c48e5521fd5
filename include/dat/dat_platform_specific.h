/* Platform glue of the DAT 1.2 headers (Linux). */
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

#endif /* _DAT_PLATFORM_SPECIFIC_H_ */
