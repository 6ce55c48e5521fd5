/*
 * regcost: what registering memory costs, one process, no peer.
 *
 *   regcost -P IA [-n N] [-S SIZES]    dat_lmr_create + dat_lmr_free through libdat2
 *   regcost -d DEVICE [-n N] [-S SIZES] ibv_reg_mr + ibv_dereg_mr on an RDMA device
 *
 * Each size registers and frees the same page-aligned heap buffer N times
 * (default 2000), as a message layer without a registration cache does for
 * every message, and prints the median, p99 and mean of each call in us.
 * The first tenth (at most 100) are a warm-up and not counted. The two modes
 * side by side tell what a DAT provider adds to the verbs registration.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <dat2/udat.h>
#include <infiniband/verbs.h>

#define MAX_SIZES 16

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void die(const char *what)
{
	fprintf(stderr, "regcost: %s\n", what);
	exit(1);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static void report(const char *call, size_t size, double *t, int n)
{
	double sum = 0;

	for (int i = 0; i < n; i++)
		sum += t[i];
	qsort(t, n, sizeof(double), cmp_double);
	printf("%-16s %9zu %7d %11.2f %11.2f %11.2f\n", call, size, n, t[n / 2], t[(n * 99) / 100],
	       sum / n);
}

/* The registrations of one size: `reg` and `dereg` time each half of a round. */
struct ops {
	void *ctx;
	int (*reg)(void *ctx, void *buf, size_t len);
	int (*dereg)(void *ctx);
	const char *reg_name, *dereg_name;
};

static void run(const struct ops *o, size_t size, int n)
{
	int warm = n / 10 < 100 ? n / 10 : 100;
	double *treg = calloc(n + warm, sizeof(double)), *tdereg = calloc(n + warm, sizeof(double));
	void *buf;

	if (!treg || !tdereg || posix_memalign(&buf, 4096, size) != 0)
		die("out of memory");
	memset(buf, 1, size);
	for (int i = 0; i < n + warm; i++) {
		double t0 = now_us();
		if (o->reg(o->ctx, buf, size) != 0)
			die(o->reg_name);
		double t1 = now_us();
		if (o->dereg(o->ctx) != 0)
			die(o->dereg_name);
		treg[i] = t1 - t0;
		tdereg[i] = now_us() - t1;
	}
	report(o->reg_name, size, treg + warm, n);
	report(o->dereg_name, size, tdereg + warm, n);
	free(buf);
	free(treg);
	free(tdereg);
}

/* ---- DAT ---- */

struct dat_ctx {
	DAT_IA_HANDLE ia;
	DAT_PZ_HANDLE pz;
	DAT_LMR_HANDLE lmr;
};

static int dat_reg(void *c, void *buf, size_t len)
{
	struct dat_ctx *d = c;
	DAT_REGION_DESCRIPTION region;
	DAT_LMR_CONTEXT lctx;
	DAT_RMR_CONTEXT rctx;
	DAT_VLEN rlen;
	DAT_VADDR raddr;

	region.for_va = buf;
	return dat_lmr_create(d->ia, DAT_MEM_TYPE_VIRTUAL, region, len, d->pz, DAT_MEM_PRIV_ALL_FLAG,
			      DAT_VA_TYPE_VA, &d->lmr, &lctx, &rctx, &rlen, &raddr) != DAT_SUCCESS;
}

static int dat_dereg(void *c)
{
	return dat_lmr_free(((struct dat_ctx *)c)->lmr) != DAT_SUCCESS;
}

/* ---- verbs ---- */

struct verbs_ctx {
	struct ibv_pd *pd;
	struct ibv_mr *mr;
};

static int verbs_reg(void *c, void *buf, size_t len)
{
	struct verbs_ctx *v = c;

	v->mr = ibv_reg_mr(v->pd, buf, len,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
	return v->mr == NULL;
}

static int verbs_dereg(void *c)
{
	return ibv_dereg_mr(((struct verbs_ctx *)c)->mr);
}

static struct ibv_pd *open_device(const char *name)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);

	for (int i = 0; list && i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name)) {
			struct ibv_context *ctx = ibv_open_device(list[i]);
			struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;

			if (!pd)
				die("cannot open the device or allocate a PD");
			return pd;
		}
	die("no such RDMA device");
	return NULL;
}

static size_t parse_size(const char *s, char **end)
{
	unsigned long long v = strtoull(s, end, 10);

	switch (toupper((unsigned char)**end)) {
	case 'K': v <<= 10; (*end)++; break;
	case 'M': v <<= 20; (*end)++; break;
	}
	if (v == 0 || v > (1ull << 30))
		die("bad size");
	return v;
}

int main(int argc, char **argv)
{
	const char *ia = NULL, *dev = NULL, *sizes = "4K,1M";
	size_t size[MAX_SIZES];
	int n = 2000, nsizes = 0, c;

	while ((c = getopt(argc, argv, "P:d:n:S:")) != -1) {
		switch (c) {
		case 'P': ia = optarg; break;
		case 'd': dev = optarg; break;
		case 'n': n = atoi(optarg); break;
		case 'S': sizes = optarg; break;
		default: goto usage;
		}
	}
	if ((ia == NULL) == (dev == NULL) || n < 1 || optind != argc)
		goto usage;
	for (const char *p = sizes; *p && nsizes < MAX_SIZES;) {
		char *end;

		size[nsizes++] = parse_size(p, &end);
		p = *end == ',' ? end + 1 : end;
		if (*end && *end != ',')
			goto usage;
	}

	struct dat_ctx d;
	struct verbs_ctx v;
	struct ops o;

	if (ia) {
		DAT_EVD_HANDLE async = DAT_HANDLE_NULL;

		memset(&d, 0, sizeof(d));
		if (dat_ia_open(ia, 8, &async, &d.ia) != DAT_SUCCESS || dat_pz_create(d.ia, &d.pz) != DAT_SUCCESS)
			die("cannot open the IA");
		o = (struct ops){ &d, dat_reg, dat_dereg, "dat_lmr_create", "dat_lmr_free" };
	} else {
		v.pd = open_device(dev);
		o = (struct ops){ &v, verbs_reg, verbs_dereg, "ibv_reg_mr", "ibv_dereg_mr" };
	}
	printf("# regcost: %s %s, the same buffer registered and freed %d times a size (us)\n",
	       ia ? "IA" : "device", ia ? ia : dev, n);
	printf("%-16s %9s %7s %11s %11s %11s\n", "call", "bytes", "iters", "median_us", "p99_us",
	       "mean_us");
	for (int i = 0; i < nsizes; i++)
		run(&o, size[i], n);
	if (ia) {
		dat_pz_free(d.pz);
		dat_ia_close(d.ia, DAT_CLOSE_DEFAULT);
	}
	return 0;
usage:
	fprintf(stderr, "usage: regcost -P IA | -d DEVICE [-n N] [-S SIZES]\n");
	return 2;
}
