/* Build-time choices a uDAPL 1.2 consumer is compiled with. */
#ifndef _UDAT_CONFIG_H_
#define _UDAT_CONFIG_H_

/* The DAT version dat_ia_open asks for; dat_types.h (generated from
 * src/abi12) defines the same two values. */
#define DAT_VERSION_MAJOR 1
#define DAT_VERSION_MINOR 2

/* Consumers ask for a non-thread-safe IA unless they say otherwise; the
 * dat.conf entry they open must say the same (an exact match). */
#ifndef DAT_THREADSAFE
#define DAT_THREADSAFE DAT_FALSE
#endif

#endif /* _UDAT_CONFIG_H_ */
