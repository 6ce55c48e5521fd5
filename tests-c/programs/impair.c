/* A lossy link in userspace, for kernels without the netem qdisc: joins two
 * TUN devices, each in its own network namespace, and carries IP packets
 * between them with netem's impairments (tests-c/scripts/net-faults.sh):
 *
 *   impair <netns A> <tun A> <netns B> <tun B> <delay ms> <jitter ms> <loss %> <duplicate %> <reorder %>
 *
 * Each packet, either way: dropped with probability loss; otherwise held for
 * delay +- jitter (uniform), or sent at once with probability reorder (so it
 * overtakes the ones held, as netem's "reorder"); and sent a second time
 * with probability duplicate. Prints READY once both devices are open, and
 * its counts on SIGTERM/SIGINT. Network namespaces are files (/run/netns/X,
 * as ip netns makes them). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if_tun.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define MAXQ 8192
#define MTU 65536

struct pkt {
	double due;
	int to;
	size_t len;
	unsigned char *data;
};

static struct pkt q[MAXQ];
static int nq;
static volatile sig_atomic_t stop;
static unsigned long n_in, n_drop, n_dup, n_reorder, n_full;

static void on_term(int s)
{
	(void)s;
	stop = 1;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + t.tv_nsec / 1e9;
}

static int chance(double percent)
{
	return percent > 0 && (double)random() / RAND_MAX * 100.0 < percent;
}

static int open_tun(const char *netns, const char *name)
{
	int nsfd = open(netns, O_RDONLY | O_CLOEXEC);
	if (nsfd < 0 || setns(nsfd, CLONE_NEWNET) != 0) {
		fprintf(stderr, "impair: enter %s: %s\n", netns, strerror(errno));
		exit(1);
	}
	close(nsfd);
	int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC | O_NONBLOCK);
	struct ifreq ifr;
	memset(&ifr, 0, sizeof(ifr));
	ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", name);
	if (fd < 0 || ioctl(fd, TUNSETIFF, &ifr) != 0) {
		fprintf(stderr, "impair: open %s in %s: %s\n", name, netns, strerror(errno));
		exit(1);
	}
	return fd;
}

static void enqueue(int to, const unsigned char *data, size_t len, double due)
{
	if (nq == MAXQ) {
		n_full++; /* a full queue drops, as a qdisc's limit does */
		return;
	}
	q[nq].due = due;
	q[nq].to = to;
	q[nq].len = len;
	q[nq].data = malloc(len);
	if (!q[nq].data)
		return;
	memcpy(q[nq].data, data, len);
	nq++;
}

int main(int argc, char **argv)
{
	if (argc != 10) {
		fprintf(stderr, "usage: impair <netns A> <tun A> <netns B> <tun B> <delay ms> <jitter ms> <loss %%> "
				"<duplicate %%> <reorder %%>\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IONBF, 0);
	int fd[2] = { open_tun(argv[1], argv[2]), open_tun(argv[3], argv[4]) };
	double delay = atof(argv[5]) / 1000, jitter = atof(argv[6]) / 1000;
	double loss = atof(argv[7]), dup = atof(argv[8]), reorder = atof(argv[9]);
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_term;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	srandom((unsigned)getpid());
	static unsigned char buf[MTU];
	printf("READY\n");
	while (!stop) {
		double t = now(), next = t + 0.1;
		/* send what is due, in due order among equals */
		for (int i = 0; i < nq;) {
			if (q[i].due <= t) {
				if (write(fd[q[i].to], q[i].data, q[i].len) < 0 && errno != EAGAIN && errno != EIO)
					fprintf(stderr, "impair: write: %s\n", strerror(errno));
				free(q[i].data);
				memmove(&q[i], &q[i + 1], (size_t)(nq - i - 1) * sizeof(q[0]));
				nq--;
			} else {
				if (q[i].due < next)
					next = q[i].due;
				i++;
			}
		}
		struct pollfd p[2] = { { fd[0], POLLIN, 0 }, { fd[1], POLLIN, 0 } };
		int ms = (int)((next - now()) * 1000);
		if (poll(p, 2, ms < 0 ? 0 : ms) < 0 && errno != EINTR)
			break;
		for (int s = 0; s < 2; s++) {
			if (!(p[s].revents & POLLIN))
				continue;
			for (int k = 0; k < 64; k++) {
				ssize_t n = read(fd[s], buf, sizeof(buf));
				if (n <= 0)
					break;
				n_in++;
				if (chance(loss)) {
					n_drop++;
					continue;
				}
				double d = delay + jitter * (2.0 * random() / RAND_MAX - 1.0);
				if (chance(reorder)) {
					d = 0;
					n_reorder++;
				}
				double at = now() + (d > 0 ? d : 0);
				enqueue(1 - s, buf, (size_t)n, at);
				if (chance(dup)) {
					n_dup++;
					enqueue(1 - s, buf, (size_t)n, at + 0.001);
				}
			}
		}
	}
	printf("impair: %lu packets, %lu dropped, %lu duplicated, %lu sent ahead (reordered), %lu dropped for a full "
	       "queue\n",
	       n_in, n_drop, n_dup, n_reorder, n_full);
	return 0;
}
