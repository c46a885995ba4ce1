#define _GNU_SOURCE
#include "CRunLoopLab.h"
#include <unistd.h>

int crll_accept4(int fd, struct sockaddr *address, socklen_t *length, int flags) {
    return accept4(fd, address, length, flags);
}
