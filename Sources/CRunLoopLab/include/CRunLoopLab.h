// The lab network's own C shim: accept4, a GNU extension Swift's Glibc module does not expose,
// which RunLoopKit itself never needs. (The thread id and name come from CRunLoopKit's shims.)
#pragma once
#include <sys/socket.h>
#include <sys/types.h>

/// accept4(2): a connection, non-blocking and close-on-exec in one call when `flags` says so.
int crll_accept4(int fd, struct sockaddr *address, socklen_t *length, int flags);
