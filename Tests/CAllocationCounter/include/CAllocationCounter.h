#ifndef C_ALLOCATION_COUNTER_H
#define C_ALLOCATION_COUNTER_H
#include <stdbool.h>
#include <stddef.h>
#include <pthread.h>

/// Whether this build counts allocations (false under AddressSanitizer/ThreadSanitizer, which
/// replace malloc themselves).
bool alloc_counter_available(void);
/// Starts counting the calling thread's allocations from zero.
void alloc_counter_start(void);
/// Stops counting on the calling thread and returns how many allocations it made meanwhile.
long alloc_counter_stop(void);
/// The usable size of a heap block (glibc's malloc_usable_size).
size_t alloc_counter_usable_size(const void *pointer);
/// The number of open file descriptors of the process (entries of /proc/self/fd), or -1.
int test_count_open_fds(void);
/// Starts a thread on a stack of PTHREAD_STACK_MIN bytes that uses all of it but about `leave`
/// bytes (recursing with small frames), then spins until `*stop` is non-zero; `*tid` gets its
/// kernel id once it spins. What a C library's small-stack thread looks like to a stack capture,
/// whose signal handler runs on that stack. Returns 0 or pthread_create's error.
int test_start_small_stack_spinner(size_t leave, _Atomic int *stop, _Atomic int *tid, pthread_t *thread);

#endif
