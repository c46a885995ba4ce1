// The lab's own C shims: the few system calls its demo code needs that Swift's Glibc module does
// not expose (accept4, gettid and prctl's thread name), kept out of RunLoopKit's private shim,
// which only RunLoopKit may import (.ci/check-layers.py).
#pragma once
#include <sys/socket.h>
#include <sys/types.h>

/// accept4(2): a connection, non-blocking and close-on-exec in one call when `flags` says so.
int crll_accept4(int fd, struct sockaddr *address, socklen_t *length, int flags);

/// gettid(2): the calling thread's kernel id.
pid_t crll_gettid(void);

/// Names the calling thread for the OS (prctl PR_SET_NAME: at most 15 bytes are kept).
int crll_set_thread_name(const char *name);
