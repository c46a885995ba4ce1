#ifndef C_BENCH_SUPPORT_H
#define C_BENCH_SUPPORT_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/// CLOCK_MONOTONIC in nanoseconds (the harness's own clock for spans across threads).
uint64_t cbench_now_ns(void);

/// The calling thread's kernel thread id.
int cbench_gettid(void);

/// voluntary_ctxt_switches + nonvoluntary_ctxt_switches of thread `tid` of this process, read from
/// /proc/self/task/TID/status; -1 if unreadable.
long cbench_thread_context_switches(int tid);

/// Resident set size of the process in bytes (/proc/self/statm), -1 if unreadable.
long cbench_rss_bytes(void);

/// Bytes handed out by malloc: mallinfo2()'s uordblks (arena chunks in use) + hblkhd (mmapped).
size_t cbench_heap_in_use(void);

/// The floor for the ping-pong workload: two pthreads, each blocking in epoll_wait on its own
/// eventfd and writing the other's, bounce a wakeup `round_trips` times. Returns the elapsed
/// nanoseconds of the bounces (threads already started), or 0 on error.
uint64_t cbench_pingpong_floor(long round_trips);

/// Runs `side` on two new threads, `responder`'s started first, and joins both (the ping-pong
/// floors' two sides).
void cbench_run_pair(void *(*side)(void *), void *initiator, void *responder);

/// The ping-pong floor with RunLoopKit's policy (floors.c): the wakeup flag and sleeping flag, the
/// eventfd written only to a sleeping side, and (`spin`) 5 µs of watching for the next wakeup
/// before sleeping. Returns the elapsed nanoseconds of `round_trips` bounces, or 0 on error.
uint64_t cbench_pingpong_policy_floor(long round_trips, bool spin);

/// The cross-thread submission floor with RunLoopKit's policy (floors.c): a mutex-guarded buffer
/// swapped whole by the consumer, the same wakeups and spin as above; `items` function calls.
/// Returns the nanoseconds from the first submission to the last call, or 0 on error.
uint64_t cbench_submit_policy_floor(long items);

/// A control thread that blocks in sem_wait until released: measures what reading another
/// thread's context switches costs that thread (should be nothing). Returns its tid.
int cbench_control_thread_start(void);
void cbench_control_thread_stop(void);

/// Per-thread allocation counting (malloc, calloc, realloc, memalign, aligned_alloc,
/// posix_memalign, valloc are interposed and forwarded to glibc's own entry points).
bool cbench_alloc_counter_available(void);
void cbench_alloc_counter_start(void);
long cbench_alloc_counter_stop(void);
#endif
