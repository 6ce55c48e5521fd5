/* Coverage of the argument-position tests (test_arg_positions*.c): which
 * argument of which export a row exercised, and the exports of the library
 * under test, read from its dynamic symbol table, so a new export without
 * rows fails the test. */
#ifndef TESTS_C_ARG_COVER_H
#define TESTS_C_ARG_COVER_H
#include <elf.h>
#include <link.h>
#include <stdint.h>
#include <string.h>
#include "check.h"

/* One export: its name, how many arguments its prototype has, and a bit per
 * argument (bit n-1 for argument n) that a row or a NO_BAD_VALUE entry
 * covered. */
struct export_args {
	const char *name;
	unsigned nargs;
	unsigned covered;
};

static struct export_args *cover_table;
static size_t cover_len;

static struct export_args *cover_find(const char *name)
{
	for (size_t i = 0; i < cover_len; i++)
		if (strcmp(cover_table[i].name, name) == 0)
			return &cover_table[i];
	return NULL;
}

static void cover_arg(const char *name, unsigned arg)
{
	struct export_args *e = cover_find(name);
	CHECK(e != NULL && arg >= 1 && arg <= e->nargs, "row for %s argument %u: no such argument", name, arg);
	if (e && arg >= 1 && arg <= e->nargs)
		e->covered |= 1u << (arg - 1);
}

/* A bad value for argument `n` of `fn`: exactly `want`. */
#define BAD(fn, n, expr, want)                                                 \
	do {                                                                   \
		CHECK_RC(expr, want);                                          \
		cover_arg(#fn, n);                                             \
	} while (0)

/* Argument `n` of `fn` has no invalid value (`why` says why). */
#define NO_BAD_VALUE(fn, n, why) cover_arg(#fn, n)

/* The IA has no RMRs (max_rmrs 0: an iWARP device without memory windows);
 * the test sets it from dat_ia_query once the IA is open. */
static int no_rmrs;

static void skip_no_rmrs(const char *what)
{
	printf("SKIP %s: %s has no RMRs (max_rmrs 0)\n", what, dat_test_ia());
}

/* A row that needs a live RMR: BAD, or on an IA without RMRs only covered
 * (the caller prints the SKIP line). */
#define BAD_RMR(fn, n, expr, want)                                             \
	do {                                                                   \
		if (no_rmrs)                                                   \
			cover_arg(#fn, n);                                     \
		else                                                           \
			BAD(fn, n, expr, want);                                \
	} while (0)

/* The DAT functions `lib` (a loaded library's file name) defines, by its
 * dynamic symbol table; calls `each` with every name. */
struct cover_walk {
	const char *lib;
	void (*each)(const char *name);
	int found;
};

static ElfW(Addr) cover_abs(ElfW(Addr) base, ElfW(Addr) v)
{
	return v < base ? base + v : v;
}

static size_t cover_nsyms(const uint32_t *gnu, const uint32_t *sysv)
{
	if (sysv)
		return sysv[1];
	if (!gnu)
		return 0;
	uint32_t nbuckets = gnu[0], symoffset = gnu[1], bloom_size = gnu[2];
	const ElfW(Addr) *bloom = (const ElfW(Addr) *)&gnu[4];
	const uint32_t *buckets = (const uint32_t *)&bloom[bloom_size];
	const uint32_t *chain = &buckets[nbuckets];
	uint32_t last = 0;
	for (uint32_t b = 0; b < nbuckets; b++)
		if (buckets[b] > last)
			last = buckets[b];
	if (last < symoffset)
		return symoffset;
	while (!(chain[last - symoffset] & 1))
		last++;
	return last + 1;
}

static int cover_walk_one(struct dl_phdr_info *info, size_t size, void *data)
{
	struct cover_walk *w = data;
	(void)size;
	const char *slash = strrchr(info->dlpi_name, '/');
	if (strcmp(slash ? slash + 1 : info->dlpi_name, w->lib) != 0)
		return 0;
	const ElfW(Sym) *symtab = NULL;
	const char *strtab = NULL;
	const uint32_t *gnu = NULL, *sysv = NULL;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		if (info->dlpi_phdr[i].p_type != PT_DYNAMIC)
			continue;
		const ElfW(Dyn) *d = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
		for (; d->d_tag != DT_NULL; d++) {
			ElfW(Addr) v = cover_abs(info->dlpi_addr, d->d_un.d_ptr);
			if (d->d_tag == DT_SYMTAB)
				symtab = (const ElfW(Sym) *)v;
			else if (d->d_tag == DT_STRTAB)
				strtab = (const char *)v;
			else if (d->d_tag == DT_GNU_HASH)
				gnu = (const uint32_t *)v;
			else if (d->d_tag == DT_HASH)
				sysv = (const uint32_t *)v;
		}
	}
	if (!symtab || !strtab)
		return 0;
	size_t n = cover_nsyms(gnu, sysv);
	for (size_t i = 0; i < n; i++) {
		const char *name = strtab + symtab[i].st_name;
		if (symtab[i].st_shndx == SHN_UNDEF || ELF64_ST_TYPE(symtab[i].st_info) != STT_FUNC)
			continue;
		if (strncmp(name, "dat", 3) == 0)
			w->each(name);
	}
	w->found = 1;
	return 1;
}

static void cover_known(const char *name)
{
	CHECK(cover_find(name) != NULL, "export %s has no row in the argument-position table", name);
}

/* Every export of `lib` is in the table, and every argument of every
 * table entry was covered. */
static void cover_check(const char *lib)
{
	struct cover_walk w = {lib, cover_known, 0};
	dl_iterate_phdr(cover_walk_one, &w);
	CHECK(w.found, "%s is not loaded", lib);
	for (size_t i = 0; i < cover_len; i++)
		for (unsigned a = 1; a <= cover_table[i].nargs; a++)
			CHECK(cover_table[i].covered & (1u << (a - 1)), "%s argument %u: no row", cover_table[i].name,
			      a);
}
#endif
