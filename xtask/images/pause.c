/*
 * pause: the init process of kubelet-rs test pod sandboxes.
 *
 * It holds the sandbox's namespaces open and does nothing else: it sleeps until SIGTERM or
 * SIGINT (then exits 0) and reaps every child re-parented to it, so no zombie is left behind.
 * Built static by `cargo xtask setup` so the image needs no libc.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_terminate(int sig) {
    static const char prefix[] = "pause: shutting down, got signal ";
    char digits[4];
    int n = 0;
    if (sig >= 100) digits[n++] = (char)('0' + sig / 100);
    if (sig >= 10) digits[n++] = (char)('0' + (sig / 10) % 10);
    digits[n++] = (char)('0' + sig % 10);
    digits[n++] = '\n';
    /* Only async-signal-safe calls here. */
    (void)!write(STDERR_FILENO, prefix, sizeof prefix - 1);
    (void)!write(STDERR_FILENO, digits, (size_t)n);
    _exit(0);
}

static void on_child(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        puts("pause (kubelet-rs test image) 1.0");
        return 0;
    }
    if (getpid() != 1) {
        fputs("pause: warning: not running as PID 1\n", stderr);
    }

    struct sigaction terminate;
    memset(&terminate, 0, sizeof terminate);
    terminate.sa_handler = on_terminate;
    sigemptyset(&terminate.sa_mask);
    if (sigaction(SIGINT, &terminate, NULL) < 0 || sigaction(SIGTERM, &terminate, NULL) < 0) {
        return 1;
    }

    struct sigaction child;
    memset(&child, 0, sizeof child);
    child.sa_handler = on_child;
    child.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigemptyset(&child.sa_mask);
    if (sigaction(SIGCHLD, &child, NULL) < 0) {
        return 1;
    }

    for (;;) {
        pause();
    }
}
