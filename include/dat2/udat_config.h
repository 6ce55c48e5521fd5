/* Build-time choices a uDAPL 2.0 consumer is compiled with. */
#ifndef _UDAT_CONFIG_H_
#define _UDAT_CONFIG_H_

/* DAT_VERSION_MAJOR / DAT_VERSION_MINOR come from dat_types.h (2.0). */

/* Consumers ask for a non-thread-safe IA unless they say otherwise; the
 * dat.conf entry they open must say the same (exact match). */
#ifndef DAT_THREADSAFE
#define DAT_THREADSAFE DAT_FALSE
#endif

#ifndef DAT_EXTENSIONS
#define DAT_EXTENSIONS 1
#endif

#endif /* _UDAT_CONFIG_H_ */
