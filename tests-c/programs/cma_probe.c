/*
 * cma_probe: exits 0 when cross-memory attach works between two sibling
 * processes here (what the same-host path needs between a DAT server and its
 * client), 1 when the kernel refuses it (Yama ptrace_scope, a seccomp filter
 * without process_vm_readv, ...). The tests' Makefile runs the suite with
 * DAPLRS_SAME_HOST=require where it works, and says so where it does not.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile uint64_t secret = 0x5eedc0ffee15900dULL;

int main(void)
{
	int addr_pipe[2], done_pipe[2];

	if (pipe(addr_pipe) || pipe(done_pipe))
		return 1;
	pid_t holder = fork();
	if (holder < 0)
		return 1;
	if (holder == 0) {
		/* hold `secret` until the reader is done */
		uintptr_t a = (uintptr_t)&secret;
		char c;
		close(done_pipe[1]);
		if (write(addr_pipe[1], &a, sizeof a) != sizeof a)
			_exit(1);
		(void)!read(done_pipe[0], &c, 1);
		_exit(0);
	}
	uintptr_t a;
	if (read(addr_pipe[0], &a, sizeof a) != sizeof a)
		return 1;
	pid_t reader = fork();
	if (reader < 0)
		return 1;
	if (reader == 0) {
		uint64_t got = 0;
		struct iovec local = { &got, sizeof got }, remote = { (void *)a, sizeof got };
		ssize_t n = process_vm_readv(holder, &local, 1, &remote, 1, 0);
		_exit(n == (ssize_t)sizeof got && got == 0x5eedc0ffee15900dULL ? 0 : 1);
	}
	int status = 1;
	waitpid(reader, &status, 0);
	close(done_pipe[1]);
	waitpid(holder, NULL, 0);
	int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
	printf("cma_probe: cross-memory attach between sibling processes %s\n",
	       ok ? "works" : "is refused here");
	return ok ? 0 : 1;
}
