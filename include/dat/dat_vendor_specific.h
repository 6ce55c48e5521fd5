/* Vendor-specific additions: none in udapl-rs. */
#ifndef _DAT_VENDOR_SPECIFIC_H_
#define _DAT_VENDOR_SPECIFIC_H_

#endif
