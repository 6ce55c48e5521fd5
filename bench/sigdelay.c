/*
 * sigdelay: what a signal costs a message over loopback TCP (docs/performance.md, "Targets
 * that spin on their memory"). One-way time from a send() to the receiving process noticing
 * the 8 bytes, the receiver either busy-polling recv(MSG_DONTWAIT) (mode 0) or spinning on
 * memory with the socket armed for a real-time signal (O_ASYNC, F_SETSIG, F_SETOWN_EX) whose
 * handler reads them (mode 1), as DAPLRS_TARGET_SIGNAL does. The sender spins on shared
 * memory for the receiver's timestamp.
 *
 *   sigdelay [0|1] [N]     prints median and p99 of N (default 2,000) one-way times
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Shared with the child: [0] when it saw the bytes, [1] how many times, [2] < 0: stop. */
static volatile double *shm;

static double now_us(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void seen(void)
{
	shm[0] = now_us();
	__atomic_fetch_add((long *)&shm[1], 1, __ATOMIC_SEQ_CST);
}

static void on_signal(int sig, siginfo_t *si, void *ctx)
{
	char b[64];

	(void)sig;
	(void)ctx;
	if (recv(si->si_fd, b, sizeof b, MSG_DONTWAIT) > 0)
		seen();
}

static void receiver(int fd, int mode)
{
	char b[64];

	if (mode == 1) {
		struct sigaction sa = { .sa_sigaction = on_signal, .sa_flags = SA_SIGINFO | SA_RESTART };
		struct f_owner_ex o = { F_OWNER_PID, getpid() };

		sigaction(SIGRTMIN + 4, &sa, NULL);
		fcntl(fd, F_SETOWN_EX, &o);
		fcntl(fd, F_SETSIG, SIGRTMIN + 4);
		fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_ASYNC | O_NONBLOCK);
		while (shm[2] >= 0)
			;
		_exit(0);
	}
	while (shm[2] >= 0)
		if (recv(fd, b, sizeof b, MSG_DONTWAIT) > 0)
			seen();
	_exit(0);
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	int mode = argc > 1 ? atoi(argv[1]) : 1, n = argc > 2 ? atoi(argv[2]) : 2000, one = 1;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof a;
	char msg[8] = { 0 };
	double *d;
	int l, s;
	pid_t child;

	shm = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	d = malloc(n * sizeof *d);
	l = socket(AF_INET, SOCK_STREAM, 0);
	if (shm == MAP_FAILED || !d || n < 1 || l < 0 || bind(l, (void *)&a, sizeof a) ||
	    getsockname(l, (void *)&a, &al) || listen(l, 1)) {
		perror("sigdelay: setup");
		return 1;
	}
	child = fork();
	if (child == 0) {
		int fd = accept(l, NULL, NULL);

		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		receiver(fd, mode);
	}
	s = socket(AF_INET, SOCK_STREAM, 0);
	if (s < 0 || connect(s, (void *)&a, sizeof a)) {
		perror("sigdelay: connect");
		return 1;
	}
	setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	usleep(200000); /* the receiver armed its socket */
	for (int i = 0; i < n; i++) {
		long before = *(volatile long *)&shm[1];
		double t0 = now_us();

		if (send(s, msg, sizeof msg, 0) != sizeof msg) {
			perror("sigdelay: send");
			return 1;
		}
		while (*(volatile long *)&shm[1] == before)
			;
		d[i] = shm[0] - t0;
	}
	shm[2] = -1;
	waitpid(child, NULL, 0);
	qsort(d, n, sizeof *d, cmp);
	printf("sigdelay %s: one-way median_us %.2f p99_us %.2f\n",
	       mode == 1 ? "signal" : "busy-recv", d[n / 2], d[n * 99 / 100]);
	return 0;
}
