#ifndef C_ALLOCATION_COUNTER_H
#define C_ALLOCATION_COUNTER_H
#include <stdbool.h>
#include <stddef.h>

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
#endif
