/* Compile-time proof that our <dat2/udat.h> and <dat2/dat_ib_extensions.h>
 * lay out every type, field and constant exactly as Debian's OFED headers
 * do. ofed_abi.h holds the numbers ofed_abi_dump measured from Debian's
 * headers; this file is built against ours, and any difference stops the
 * compilation. Strings (attribute names) are compared when it runs.
 *
 * Then the Rust side of the IB extensions (src/abi/src/ib_ext.rs, turned
 * into ib_ext_rust.h by gen_ib_ext_rust.py): each of its constants, struct
 * layouts and type sizes must equal our header's. */
#include <stdio.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <dat2/udat.h>
#include <dat2/dat_registry.h>
#include <dat2/dat_ib_extensions.h>
#include "ofed_abi.h"
#define IBR_DECLARE
#include "ib_ext_rust.h"
#undef IBR_DECLARE

#define ABI_SIZE(key, type) _Static_assert(sizeof(type) == OFED_SIZE_##key, "sizeof " #type);
#define ABI_OFFSET(key, type, field)                                                  \
	_Static_assert(offsetof(type, field) == OFED_OFFSET_##key, "offsetof " #type "." #field); \
	_Static_assert(sizeof(((type *)0)->field) == OFED_FSIZE_##key, "sizeof " #type "." #field);
#define ABI_CONST(name) _Static_assert((unsigned long long)(uintptr_t)(name) == OFED_CONST_##name, "value of " #name);
#define ABI_STR(name) _Static_assert(sizeof(name) == sizeof(OFED_STR_##name), "length of " #name);
#include "abi_items.h"
#undef ABI_SIZE
#undef ABI_OFFSET
#undef ABI_CONST
#undef ABI_STR

#define IBR_CONST(name, rust) \
	_Static_assert((unsigned long long)(name) == (unsigned long long)(rust), "ib_ext.rs: value of " #name);
#define IBR_STR(name, rust) _Static_assert(sizeof(name) == sizeof(rust), "ib_ext.rs: length of " #name);
#define IBR_SIZE(rust, ours) _Static_assert(sizeof(rust) == sizeof(ours), "ib_ext.rs: sizeof " #ours);
#define IBR_OFFSET(rust, rfield, ours, field)                                                   \
	_Static_assert(offsetof(rust, rfield) == offsetof(ours, field), "ib_ext.rs: offsetof " #ours "." #field); \
	_Static_assert(sizeof(((rust *)0)->rfield) == sizeof(((ours *)0)->field), "ib_ext.rs: sizeof " #ours "." #field);
#include "ib_ext_rust.h"
#undef IBR_CONST
#undef IBR_STR
#undef IBR_SIZE
#undef IBR_OFFSET

int main(void)
{
	int n = 0, r = 0, failed = 0;
#define ABI_SIZE(key, type) n++;
#define ABI_OFFSET(key, type, field) n++;
#define ABI_CONST(name) n++;
#define ABI_STR(name)                                                                   \
	if (strcmp(name, OFED_STR_##name) == 0) {                                       \
		n++;                                                                    \
	} else {                                                                        \
		failed++;                                                               \
		printf("abi_compare: FAIL: %s is \"%s\", Debian's \"%s\"\n", #name, name, OFED_STR_##name); \
	}
#include "abi_items.h"
#define IBR_CONST(name, rust) r++;
#define IBR_SIZE(rust, ours) r++;
#define IBR_OFFSET(rust, rfield, ours, field) r++;
#define IBR_STR(name, rust)                                                             \
	if (strcmp(name, rust) == 0) {                                                  \
		r++;                                                                    \
	} else {                                                                        \
		failed++;                                                               \
		printf("abi_compare: FAIL: %s is \"%s\" in ib_ext.rs, \"%s\" in our header\n", #name, rust, name); \
	}
#include "ib_ext_rust.h"
	printf("abi_compare: %d passed, %d failed (%d sizes, offsets, constants and strings equal Debian's "
	       "<dat2/udat.h> and <dat2/dat_ib_extensions.h>; %d items of src/abi/src/ib_ext.rs equal ours)\n",
	       n + r, failed, n, r);
	return failed != 0;
}
