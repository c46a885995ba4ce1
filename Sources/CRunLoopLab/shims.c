#define _GNU_SOURCE
#include "CRunLoopLab.h"
#include <sys/prctl.h>
#include <unistd.h>

int crll_accept4(int fd, struct sockaddr *address, socklen_t *length, int flags) {
    return accept4(fd, address, length, flags);
}

pid_t crll_gettid(void) { return gettid(); }

// PR_SET_NAME names the calling thread and keeps at most 15 bytes itself.
int crll_set_thread_name(const char *name) { return prctl(PR_SET_NAME, (unsigned long)name, 0, 0, 0); }
