#define _GNU_SOURCE
#include "CRunLoopLab.h"
#include <pthread.h>
#include <stddef.h>
#include <unistd.h>

int crll_accept4(int fd, struct sockaddr *address, socklen_t *length, int flags) {
    return accept4(fd, address, length, flags);
}

pid_t crll_gettid(void) { return gettid(); }

int crll_set_thread_name(const char *name) {
    char truncated[16];
    size_t i = 0;
    for (; i < 15 && name[i] != 0; i++) truncated[i] = name[i];
    truncated[i] = 0;
    return pthread_setname_np(pthread_self(), truncated);
}
