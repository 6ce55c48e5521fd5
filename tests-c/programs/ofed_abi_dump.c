/* Compiled against Debian's OFED headers (/usr/include/dat2), prints what
 * they say about every item our headers define (dat_types.h and
 * dat_ib_extensions.h), as #defines for abi_compare.c. */
#include <stdio.h>
#include <stdint.h>
#include <stddef.h>
#include <netinet/in.h> /* OFED's header uses sockaddr_in6 without it */
#include <dat2/udat.h>
#include <dat2/dat_registry.h>
#include <dat2/dat_ib_extensions.h>

int main(void)
{
#define ABI_SIZE(key, type) printf("#define OFED_SIZE_%s %zuu\n", #key, sizeof(type));
#define ABI_OFFSET(key, type, field)                                           \
	printf("#define OFED_OFFSET_%s %zuu\n", #key, offsetof(type, field));  \
	printf("#define OFED_FSIZE_%s %zuu\n", #key, sizeof(((type *)0)->field));
#define ABI_CONST(name) printf("#define OFED_CONST_%s %lluull\n", #name, (unsigned long long)(uintptr_t)(name));
#define ABI_STR(name) printf("#define OFED_STR_%s \"%s\"\n", #name, name);
#include "abi_items.h"
	return 0;
}
