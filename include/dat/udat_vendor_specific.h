/* Vendor-specific additions: none in udapl-rs. */
#ifndef _UDAT_VENDOR_SPECIFIC_H_
#define _UDAT_VENDOR_SPECIFIC_H_

#include <dat/dat_vendor_specific.h>

#endif
