/*
 * <dat2/udat.h>: the uDAPL 2.0 consumer API of udapl-rs.
 *
 * C source written for OFED's <dat2/udat.h> compiles unchanged against this
 * header. Types, constants and prototypes are generated from the Rust ABI
 * (dat_types.h, dat_api.h); the function-like macros C needs live in the
 * small hand-written headers beside them.
 */
#ifndef _UDAT_H_
#define _UDAT_H_

#include <dat2/udat_config.h>
#include <dat2/dat_platform_specific.h>
#include <dat2/dat.h>
#include <dat2/udat_vendor_specific.h>

#endif /* _UDAT_H_ */
