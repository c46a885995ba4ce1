// GLib for RunLoopGLib (trait GLib), and the few system calls Swift's Glibc module does not
// import in a usable form: epoll (`struct epoll_event` is packed) and a read of this process's
// own memory that cannot fault (process_vm_readv).
#ifndef CGLIB_SHIM_H
#define CGLIB_SHIM_H

// No _GNU_SOURCE here: it changes the C library's own structs (fd_set's field is `fds_bits` with
// it, `__fds_bits` without), and a module that includes them differently from Swift's Glibc
// module, or from GTK's headers in another module, fails clang's check that one struct has one
// definition ("'__fds_bits' from module 'SwiftGlibc' is not present in definition of 'fd_set' in
// module 'CGLib'"), depending on which module a build happens to compile first. The one GNU
// function used, process_vm_readv, is declared below.
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

/// process_vm_readv(2), which <sys/uio.h> declares only with _GNU_SOURCE.
extern ssize_t process_vm_readv(pid_t pid, const struct iovec *local, unsigned long local_count,
                                const struct iovec *remote, unsigned long remote_count, unsigned long flags);

/// Copies `length` bytes at `address` of this process into `buffer` without faulting: false if
/// any of it is not mapped (or the kernel refuses the call: then `*unavailable` is set).
static inline bool crlg_read_own_memory(void *buffer, const void *address, size_t length, bool *unavailable) {
    struct iovec local = {buffer, length};
    struct iovec remote = {(void *)address, length};
    ssize_t copied = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
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
