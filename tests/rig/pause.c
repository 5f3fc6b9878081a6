/*
 * pause: the sandbox (infra) container's process for the node rig.
 *
 * Blocks in pause(); reaps every exited child on SIGCHLD (it is PID 1 of the
 * pod's PID namespace when the namespace is shared); exits 0 on SIGINT or
 * SIGTERM. Built with `gcc -static -O2` by tests/rig/rig.sh images.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig)
{
	(void)sig;
	_exit(0);
}

static void on_chld(int sig)
{
	int saved = errno;

	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
	errno = saved;
}

static int install(int sig, void (*handler)(int), int flags)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = handler;
	sa.sa_flags = flags;
	sigemptyset(&sa.sa_mask);
	return sigaction(sig, &sa, NULL);
}

int main(int argc, char **argv)
{
	if (argc > 1 && (strcmp(argv[1], "-v") == 0 || strcmp(argv[1], "--version") == 0)) {
		puts("pause (node rig) 3.10");
		return 0;
	}
	if (getpid() != 1)
		fprintf(stderr, "pause: warning: not running as PID 1\n");

	if (install(SIGINT, on_term, 0) < 0 || install(SIGTERM, on_term, 0) < 0 ||
	    install(SIGCHLD, on_chld, SA_NOCLDSTOP | SA_RESTART) < 0) {
		perror("pause: sigaction");
		return 1;
	}

	for (;;)
		pause();
	/* not reached */
	return 42;
}
