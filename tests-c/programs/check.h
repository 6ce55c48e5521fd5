/* A minimal check harness for the C tests: every CHECK counts, failures
 * print where and why, and check_summary prints the "N passed, N failed"
 * line run-tests.sh adds up. */
#ifndef TESTS_C_CHECK_H
#define TESTS_C_CHECK_H
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An error code as providers compose it: class, type and subtype. */
#define ERRCODE(type, sub) ((DAT_RETURN)(DAT_CLASS_ERROR | (type) | (sub)))

static int check_passed, check_failed;

#define CHECK(cond, ...)                                                       \
	do {                                                                   \
		if (cond) {                                                    \
			check_passed++;                                        \
		} else {                                                       \
			check_failed++;                                        \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);            \
			printf(__VA_ARGS__);                                   \
			printf("\n");                                          \
		}                                                              \
	} while (0)

/* Checks that a DAT call returns exactly `want`. */
#define CHECK_RC(expr, want)                                                   \
	do {                                                                   \
		DAT_RETURN check_rc_ = (expr);                                 \
		CHECK(check_rc_ == (DAT_RETURN)(want), "%s = %#x, want %#x",   \
		      #expr, (unsigned)check_rc_, (unsigned)(want));           \
	} while (0)

/* The IA the provider tests open: $DAT_TEST_IA (a dat.conf entry name), by
 * default our TCP provider's rs-tcp. The same binaries run unchanged against
 * a verbs entry in the soft-RoCE guest (tests-c/scripts/verbs-guest.sh). */
static inline const char *dat_test_ia(void)
{
	const char *name = getenv("DAT_TEST_IA");
	return name && *name ? name : "rs-tcp";
}

/* Entries of a /proc directory such as /proc/self/fd (open descriptors, less
 * the one this reads it with) or /proc/self/task (threads); -1 if unreadable. */
static inline int proc_entries(const char *path)
{
	int n = 0;
	DIR *d = opendir(path);
	struct dirent *e;
	if (!d)
		return -1;
	while ((e = readdir(d)) != NULL)
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - (strcmp(path, "/proc/self/fd") == 0); /* the DIR's own fd */
}

/* The seconds a test's alarm allows: DEFAULT, or $DAT_TEST_ALARM where a
 * slower machine (an emulated guest) needs longer. */
static inline unsigned test_alarm(unsigned default_secs)
{
	const char *s = getenv("DAT_TEST_ALARM");
	long v = s ? strtol(s, NULL, 10) : 0;
	return v > 0 ? (unsigned)v : default_secs;
}

static inline int check_summary(const char *name)
{
	printf("%s: %d passed, %d failed\n", name, check_passed, check_failed);
	return check_failed ? 1 : 0;
}
#endif
