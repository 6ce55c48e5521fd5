/*
 * tcprtt: the limit for an RDMA read over TCP, a busy-polled TCP round trip.
 *
 *   tcprtt -s [-p PORT] [-T SEC]          server: echoes one client, then exits
 *   tcprtt -c HOST [-p PORT] [-n N] [-w W] client: prints median, p99, mean
 *
 * 8-byte ping-pong over one connection with TCP_NODELAY; both sides
 * busy-poll non-blocking recv(MSG_DONTWAIT) (no wake-up, no sleep), as a
 * polling RDMA consumer and an ideal TCP engine would. W warm-up round
 * trips (default 1,000) are discarded, then N (default 20,000) measured.
 * The server prints "tcprtt: listening" when it accepts connections and
 * gives up after -T seconds (default 60) without a client or a byte.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MSG 8

static int timeout_s = 60;

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void die(const char *what)
{
	fprintf(stderr, "tcprtt: %s: %s\n", what, errno ? strerror(errno) : "failed");
	exit(1);
}

/* Busy-polls until `len` bytes arrived; 0 when the peer closed first. */
static int recv_all(int fd, char *buf, size_t len, double deadline)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n = recv(fd, buf + got, len - got, MSG_DONTWAIT);

		if (n > 0)
			got += (size_t)n;
		else if (n == 0)
			return 0;
		else if (errno != EAGAIN && errno != EINTR)
			die("recv");
		else if (now_us() > deadline) {
			errno = ETIMEDOUT;
			die("recv");
		}
	}
	return 1;
}

static void send_all(int fd, const char *buf, size_t len)
{
	size_t sent = 0;

	while (sent < len) {
		ssize_t n = send(fd, buf + sent, len - sent, MSG_DONTWAIT | MSG_NOSIGNAL);

		if (n > 0)
			sent += (size_t)n;
		else if (n < 0 && errno != EAGAIN && errno != EINTR)
			die("send");
	}
}

static void nodelay(int fd)
{
	int one = 1;

	if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
		die("TCP_NODELAY");
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static int server(int port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	int one = 1, lfd = socket(AF_INET, SOCK_STREAM, 0), fd;
	struct pollfd pfd;
	char buf[MSG];

	if (lfd < 0)
		die("socket");
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(lfd, 1) < 0)
		die("bind/listen");
	printf("tcprtt: listening on port %d\n", port);
	fflush(stdout);
	pfd = (struct pollfd){ .fd = lfd, .events = POLLIN };
	if (poll(&pfd, 1, timeout_s * 1000) != 1) {
		errno = ETIMEDOUT;
		die("accept");
	}
	fd = accept(lfd, NULL, NULL);
	if (fd < 0)
		die("accept");
	nodelay(fd);
	/* Echo until the client closes; each wait bounded by -T. */
	while (recv_all(fd, buf, MSG, now_us() + timeout_s * 1e6))
		send_all(fd, buf, MSG);
	close(fd);
	close(lfd);
	return 0;
}

static int client(const char *host, int port, int n, int warm)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	double *lat = calloc(n, sizeof(double)), mean = 0;
	char buf[MSG] = "ping!!!";

	if (fd < 0 || !lat || inet_pton(AF_INET, host, &sa.sin_addr) != 1)
		die("setup");
	if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0)
		die("connect");
	nodelay(fd);
	for (int i = 0; i < warm + n; i++) {
		double t0 = now_us();

		send_all(fd, buf, MSG);
		if (!recv_all(fd, buf, MSG, t0 + timeout_s * 1e6)) {
			errno = ECONNRESET;
			die("recv");
		}
		if (i >= warm)
			lat[i - warm] = now_us() - t0;
	}
	close(fd);
	for (int i = 0; i < n; i++)
		mean += lat[i] / n;
	qsort(lat, n, sizeof(double), cmp);
	printf("tcprtt %d B round trips: %d (after %d warm-up) median_us %.2f p99_us %.2f mean_us %.2f\n",
	       MSG, n, warm, n % 2 ? lat[n / 2] : (lat[n / 2 - 1] + lat[n / 2]) / 2,
	       lat[(int)((n - 1) * 0.99 + 0.5)], mean);
	return 0;
}

int main(int argc, char **argv)
{
	int c, srv = 0, port = 19766, n = 20000, warm = 1000;
	const char *host = NULL;

	while ((c = getopt(argc, argv, "sc:p:n:w:T:")) != -1) {
		switch (c) {
		case 's': srv = 1; break;
		case 'c': host = optarg; break;
		case 'p': port = atoi(optarg); break;
		case 'n': n = atoi(optarg); break;
		case 'w': warm = atoi(optarg); break;
		case 'T': timeout_s = atoi(optarg); break;
		default: goto usage;
		}
	}
	if (srv == (host != NULL) || n < 1 || warm < 0 || timeout_s < 1 || port < 1)
		goto usage;
	return srv ? server(port) : client(host, port, n, warm);
usage:
	fprintf(stderr, "usage: tcprtt -s [-p PORT] [-T SEC] | tcprtt -c HOST [-p PORT] [-n N] [-w W] [-T SEC]\n");
	return 2;
}
