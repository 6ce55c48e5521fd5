/* Compile-time proof that our <dat2/udat.h> lays out every type, field
 * and constant exactly as Debian's OFED headers do. ofed_abi.h holds the
 * numbers ofed_abi_dump measured from Debian's headers; this file is built
 * against ours, and any difference stops the compilation. */
#include <stdio.h>
#include <stdint.h>
#include <stddef.h>
#include <dat2/udat.h>
#include <dat2/dat_registry.h>
#include "ofed_abi.h"

#define ABI_SIZE(key, type) _Static_assert(sizeof(type) == OFED_SIZE_##key, "sizeof " #type);
#define ABI_OFFSET(key, type, field)                                                  \
	_Static_assert(offsetof(type, field) == OFED_OFFSET_##key, "offsetof " #type "." #field); \
	_Static_assert(sizeof(((type *)0)->field) == OFED_FSIZE_##key, "sizeof " #type "." #field);
#define ABI_CONST(name) _Static_assert((unsigned long long)(uintptr_t)(name) == OFED_CONST_##name, "value of " #name);
#include "abi_items.h"
#undef ABI_SIZE
#undef ABI_OFFSET
#undef ABI_CONST

int main(void)
{
	int n = 0;
#define ABI_SIZE(key, type) n++;
#define ABI_OFFSET(key, type, field) n++;
#define ABI_CONST(name) n++;
#include "abi_items.h"
	printf("abi_compare: %d passed, 0 failed (sizes, offsets and constants equal Debian's <dat2/udat.h>)\n", n);
	return 0;
}
