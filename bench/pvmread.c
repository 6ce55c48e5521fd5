/*
 * pvmread: the same-host limit, process_vm_readv (cross-memory attach)
 * reading another process's buffer.
 *
 *   pvmread [-n N] [-m M]
 *
 * Forks a child that holds a 1 MiB buffer (touched, so it is resident) and
 * waits; the parent reads it: N (default 20,000, after 1,000 warm-up) 8-byte
 * reads timed one by one (median, p99, mean), then M (default 500) whole
 * 1 MiB reads (bandwidth, MB = 10^6 B). The child leaves when the parent
 * closes the pipe or dies, and after 60 s at the latest.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BIG (1u << 20)

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	int c, n = 20000, warm = 1000, m = 500, ready[2], done[2];
	char *buf = malloc(BIG), *mine = malloc(BIG), byte;
	double *lat, mean = 0, t0, mbps;
	pid_t pid;

	while ((c = getopt(argc, argv, "n:m:")) != -1) {
		if (c == 'n')
			n = atoi(optarg);
		else if (c == 'm')
			m = atoi(optarg);
		else
			goto usage;
	}
	if (n < 1 || m < 1 || !buf || !mine || !(lat = calloc(n, sizeof(double))))
		goto usage;
	memset(buf, 0x5a, BIG);
	if (pipe(ready) < 0 || pipe(done) < 0)
		return perror("pipe"), 1;
	pid = fork();
	if (pid < 0)
		return perror("fork"), 1;
	if (pid == 0) {
		struct pollfd p = { .fd = done[0], .events = POLLIN };

		prctl(PR_SET_PDEATHSIG, SIGTERM);
		close(done[1]);
		close(ready[0]);
		if (write(ready[1], "r", 1) != 1)
			_exit(1);
		poll(&p, 1, 60000);     /* the parent closes done[1] (or dies) */
		_exit(0);
	}
	close(done[0]);
	close(ready[1]);
	if (read(ready[0], &byte, 1) != 1)
		return fprintf(stderr, "pvmread: the child did not start\n"), 1;

	/* buf has the same address in the child (fork). */
	for (int i = 0; i < warm + n; i++) {
		struct iovec l = { mine, 8 }, r = { buf + (i % 4096) * 8, 8 };

		t0 = now_us();
		if (process_vm_readv(pid, &l, 1, &r, 1, 0) != 8)
			return perror("process_vm_readv"), 1;
		if (i >= warm)
			lat[i - warm] = now_us() - t0;
	}
	t0 = now_us();
	for (int i = 0; i < m; i++) {
		struct iovec l = { mine, BIG }, r = { buf, BIG };

		if (process_vm_readv(pid, &l, 1, &r, 1, 0) != BIG)
			return perror("process_vm_readv"), 1;
	}
	mbps = (double)BIG * m / (now_us() - t0);
	close(done[1]);
	waitpid(pid, NULL, 0);
	for (int i = 0; i < n; i++)
		mean += lat[i] / n;
	qsort(lat, n, sizeof(double), cmp);
	printf("pvmread 8 B: %d reads median_us %.2f p99_us %.2f mean_us %.2f\n", n,
	       n % 2 ? lat[n / 2] : (lat[n / 2 - 1] + lat[n / 2]) / 2,
	       lat[(int)((n - 1) * 0.99 + 0.5)], mean);
	printf("pvmread 1 MiB: %d reads MB/s %.1f\n", m, mbps);
	return 0;
usage:
	fprintf(stderr, "usage: pvmread [-n N] [-m M]\n");
	return 2;
}
