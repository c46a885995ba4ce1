// GLib for RunLoopGLib (trait GLib), and the few system calls Swift's Glibc module does not
// import in a usable form: epoll (`struct epoll_event` is packed) and a read of this process's
// own memory that cannot fault (process_vm_readv).
#ifndef CGLIB_SHIM_H
#define CGLIB_SHIM_H

// No _GNU_SOURCE here: it would change the system headers' declarations from those Swift's Glibc
// module was built with (a module conflict). process_vm_readv and gettid are system calls.
#include <glib.h>
#include <glib-unix.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

/// A new epoll descriptor (close-on-exec), or -1 with errno set.
static inline int crlg_epoll_create(void) { return epoll_create1(EPOLL_CLOEXEC); }

/// epoll_ctl(2) for `fd` with `events`, the event's data the descriptor number. 0, or -1 with
/// errno set.
static inline int crlg_epoll_ctl(int epfd, int op, int fd, uint32_t events) {
    struct epoll_event event;
    memset(&event, 0, sizeof event);
    event.events = events;
    event.data.fd = fd;
    return epoll_ctl(epfd, op, fd, &event);
}

/// Whether `epfd` has a ready descriptor now (epoll_wait with a zero timeout); -1 with errno set
/// on failure.
static inline int crlg_epoll_ready(int epfd) {
    struct epoll_event event;
    int count;
    do { count = epoll_wait(epfd, &event, 1, 0); } while (count < 0 && errno == EINTR);
    return count;
}

/// Copies `length` bytes at `address` of this process into `buffer` without faulting: false if
/// any of it is not mapped (or the kernel refuses the call: then `*unavailable` is set).
static inline bool crlg_read_own_memory(void *buffer, const void *address, size_t length, bool *unavailable) {
    struct iovec local = {buffer, length};
    struct iovec remote = {(void *)address, length};
    ssize_t copied = (ssize_t)syscall(SYS_process_vm_readv, getpid(), &local, 1UL, &remote, 1UL, 0UL);
    if (copied < 0 && (errno == EPERM || errno == ENOSYS)) *unavailable = true;
    return copied == (ssize_t)length;
}

/// The calling thread's value for pthread key `key`; NULL for a key that was never made (glibc
/// checks the key's sequence number; keys at or above PTHREAD_KEYS_MAX give NULL).
static inline void *crlg_thread_specific(unsigned key) {
    if (key >= PTHREAD_KEYS_MAX) return NULL;
    return pthread_getspecific((pthread_key_t)key);
}

/// The calling thread's kernel id (gettid(2)).
static inline pid_t crlg_gettid(void) { return (pid_t)syscall(SYS_gettid); }

/// PTHREAD_KEYS_MAX.
static inline unsigned crlg_thread_keys_max(void) { return PTHREAD_KEYS_MAX; }

/// Where a GSource keeps its name (`struct _GSource` is public: gmain.h).
static inline size_t crlg_source_name_offset(void) { return offsetof(GSource, name); }

#endif
