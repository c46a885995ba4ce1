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

/// The calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID) in nanoseconds.
uint64_t cbench_thread_cpu_ns(void);

/// Thread `tid`'s (of this process) CPU time in nanoseconds, or -1 once it has exited.
int64_t cbench_thread_cpu_ns_of(int tid);

/// Resident set size of the process in bytes (/proc/self/statm), -1 if unreadable.
long cbench_rss_bytes(void);

/// Bytes handed out by malloc: mallinfo2()'s uordblks (arena chunks in use) + hblkhd (mmapped).
size_t cbench_heap_in_use(void);

/// Runs `side` on two new threads, `responder`'s started first, and joins both (the ping-pong
/// floors' two sides).
void cbench_run_pair(void *(*side)(void *), void *initiator, void *responder);

/// The ping-pong floor with RunLoopKit's policy (floors.c): the wakeup flag and sleeping flag, the
/// eventfd written only to a sleeping side, and (`spin`) 5 µs of watching for the next wakeup
/// before sleeping. Returns the elapsed nanoseconds of `round_trips` bounces, or 0 on error.
uint64_t cbench_pingpong_policy_floor(long round_trips, bool spin);

/// The cross-thread submission floor with RunLoopKit's policy (floors.c): a buffer under RunLoopKit's spin lock,
/// swapped whole by the consumer, the same wakeups and (`spin`) the same spin as above; `items`
/// function calls. Returns the nanoseconds from the first submission to the last call, or 0 on
/// error.
uint64_t cbench_submit_policy_floor(long items, bool spin);

/// The machine, not a loop: two threads hand one cache line back and forth `round_trips` times
/// (each spins, with a CPU pause, until the other has written it). Returns the nanoseconds per
/// round trip: what one cross-core transfer of a line and back costs right now, the latency every
/// cross-thread workload's wakeups, locks and buffers pay. On a virtual machine it follows where
/// the host runs the two virtual CPUs.
double cbench_line_round_trip_ns(long round_trips);

/// The timer insertion floor with RunLoopKit's policy (floors.c): per timer an allocation, the
/// loop's lock, a push onto a 4-ary heap and a timerfd re-arm when it is the new earliest; fire
/// dates now + `offsets[i]` ns. Returns the nanoseconds of the `count` additions, or 0 on error.
uint64_t cbench_insert_policy_floor(const int64_t *offsets, long count);

/// The timer churn floor with RunLoopKit's policy (floors.c): `live` timers added as above (due
/// now + `offsets[0..<live]`), then `operations` times a timer added (`offsets[live + i]`) and the
/// oldest cancelled (its generation moves on; the heap is rebuilt from its live entries once it
/// holds more than twice the live timers plus 32). Returns the nanoseconds of the operations, or 0
/// on error.
uint64_t cbench_churn_policy_floor(const int64_t *offsets, long live, long operations);

/// The timer firing floor with RunLoopKit's policy (floors.c): on a new thread, `count` timers
/// added as above (due now + `offsets[i]` ns), then epoll_wait on the timerfd, every due timer
/// collected under the lock, the timerfd re-armed, the timers fired outside the lock and freed.
/// Returns the nanoseconds from the first due date to the last fire (0 on error); `overran`: the
/// adding finished after the first was due.
uint64_t cbench_fire_policy_floor(const int64_t *offsets, long count, bool *overran);

/// The empty-pass floor with RunLoopKit's policy (floors.c): a source that re-signals itself
/// `iterations` times, each pass with (`observed`) two observer callouts, a look at the timers,
/// the source taken and performed, the wakeup request taken and the inbox looked at. Returns the
/// elapsed nanoseconds, or 0 on error.
uint64_t cbench_iterate_policy_floor(long iterations, bool observed);

/// A control thread that blocks in sem_wait until released: measures what reading another
/// thread's context switches costs that thread (should be nothing). Returns its tid.
int cbench_control_thread_start(void);
void cbench_control_thread_stop(void);

/// Per-thread allocation counting (malloc, calloc, realloc, memalign, aligned_alloc,
/// posix_memalign, valloc are interposed and forwarded to glibc's own entry points).
bool cbench_alloc_counter_available(void);
/// Process-wide counting, every thread's allocations (sharded counters: threads do not share a
/// cache line); start resets. Independent of the per-thread counter.
void cbench_alloc_process_start(void);
long cbench_alloc_process_stop(void);
/// The process-wide count so far, counting on (-1 where the counter is unavailable).
long cbench_alloc_process_read(void);
void cbench_alloc_counter_start(void);
long cbench_alloc_counter_stop(void);
#endif
