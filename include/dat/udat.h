/*
 * <dat/udat.h>: the uDAPL 1.2 consumer API of udapl-rs.
 *
 * What a DAT 1.2 program includes (the 1.2 manual pages: `#include
 * <dat/udat.h>`, `cc ... -ldat`). Types and constants are generated from
 * the Rust ABI of DAT 1.2 (dat_types.h, from src/abi12) and the prototypes
 * from libdat.so.1's exports (dat_api.h, from src/libdat); the
 * function-like macros C needs live in the small hand-written headers
 * beside them. Link with -ldat (libdat.so.1).
 */
#ifndef _UDAT_H_
#define _UDAT_H_

#include <dat/udat_config.h>
#include <dat/dat_platform_specific.h>
#include <dat/dat.h>
#include <dat/udat_vendor_specific.h>

#endif /* _UDAT_H_ */
