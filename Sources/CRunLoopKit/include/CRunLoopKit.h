#ifndef C_RUNLOOPKIT_H
#define C_RUNLOOPKIT_H

#include <stdint.h>
#include <stdbool.h>
#include <sys/types.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <time.h>

/// The kernel thread id of the calling thread (gettid(2)).
pid_t crlk_gettid(void);

/// True when the calling thread is the process's main thread (its tid equals the pid).
bool crlk_is_main_thread(void);

/// Copies the calling thread's name (at most `len` bytes including NUL) into `buf`.
int crlk_get_thread_name(char *buf, size_t len);

/// Sets the calling thread's name as the OS sees it (15 characters at most are kept).
int crlk_set_thread_name(const char *name);

/// Reads CLOCK_BOOTTIME (the clock Swift's ContinuousClock uses on Linux) in nanoseconds.
int64_t crlk_boottime_ns(void);

/// The loop clock of the calling thread, in nanoseconds: CLOCK_BOOTTIME (``crlk_boottime_ns``),
/// or the thread's virtual clock while it is on virtual time (RunLoopTesting). Costs one relaxed
/// load of a process-wide count more than the kernel clock while no thread is on virtual time.
int64_t crlk_loop_now_ns(void);

/// ``crlk_boottime_upper_bound_ns`` for the loop clock: on virtual time, the virtual now.
int64_t crlk_loop_now_upper_bound_ns(void);

/// Puts the calling thread on virtual time at `now_ns` (or moves its virtual clock there) when
/// `on`, or takes it off; returns whether it was on before, and its virtual clock in `*previous_ns`
/// (for nested scopes to restore).
bool crlk_set_virtual_time(bool on, int64_t now_ns, int64_t *previous_ns);

/// Sets the calling thread's virtual clock (it must be on virtual time).
void crlk_set_virtual_now(int64_t now_ns);

/// Whether the calling thread is on virtual time (a thread-local read).
bool crlk_is_on_virtual_time(void);

/// A bound CLOCK_BOOTTIME (``crlk_boottime_ns``) has not passed yet, for a few nanoseconds instead
/// of a precise read's twenty-odd: the coarse monotonic clock (updated every scheduler tick) plus
/// the boot-time offset (re-read at least once a second) plus a margin of 100 ms, far above a
/// tick's lag. A date above it is certainly in the future.
int64_t crlk_boottime_upper_bound_ns(void);

/// Arms `fd` (a timerfd on CLOCK_BOOTTIME) to expire once at the absolute time `deadline_ns`,
/// or disarms it when `deadline_ns` is negative. Returns 0, or -1 with errno set.
int crlk_timerfd_arm_abs(int fd, int64_t deadline_ns);

/// Arms `fd` (a timerfd on CLOCK_BOOTTIME) to expire at the absolute time `first_ns`, then every
/// `interval_ns` on that grid (the kernel counts missed expirations); a negative `first_ns`
/// disarms it.
int crlk_timerfd_arm_periodic_abs(int fd, int64_t first_ns, int64_t interval_ns);



/// A spin-wait hint to the CPU (`pause` on x86, `yield` on Arm).
void crlk_cpu_relax(void);

/// Asks the CPU to start loading the cache lines holding `size` bytes at `address` (a hint: no
/// fault, no effect on results). Inline, so a call costs one instruction per line.
static inline __attribute__((always_inline)) void crlk_prefetch(const void *address, unsigned long size) {
    for (unsigned long offset = 0; offset < size; offset += 64) {
        __builtin_prefetch((const char *)address + offset, 1, 3);
    }
}

/// Tell ThreadSanitizer that the lock at `address` was acquired / is being released. No-ops
/// unless this file is compiled with -fsanitize=thread (`swift build --sanitize=thread`).
/// Swift's `Synchronization.Mutex` waits with raw futex calls on Linux, which ThreadSanitizer
/// does not intercept, so without these every access it guards is reported as a race.
void crlk_tsan_acquire(void *address);
void crlk_tsan_release(void *address);

/// libdispatch's entry points for CoreFoundation's run loop ("4CF"), through which a run loop on
/// the main thread serves `DispatchQueue.main` (see Sources/RunLoopKit/Integration/MainQueue.swift).
/// The toolchain's libdispatch.so exports them (`nm -D`: `T _dispatch_get_main_queue_handle_4CF`,
/// `T _dispatch_main_queue_callback_4CF`) but ships no header declaring them (they live in
/// libdispatch's private headers), so they are declared here; RunLoopKit links libdispatch through
/// `import Dispatch`. What they do on Linux (swift-corelibs-libdispatch, src/queue.c, checked on
/// this toolchain, Swift 6.3.1):
///
/// `_dispatch_get_main_queue_handle_4CF` returns the main queue's `dispatch_runloop_handle_t`, an
/// `int` on Linux: an eventfd made once (`eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)`, the same
/// descriptor on every call). libdispatch writes 1 to it (`eventfd_write`) when the main queue gets
/// work, and never reads it: the caller must read it (resetting the counter) before draining, as
/// CFRunLoop.c's `__CFRunLoopServiceFileDescriptors` does, or a level-triggered wait wakes forever.
/// It returns -1 once `dispatch_main()` has run (the main thread exited and libdispatch closed the
/// eventfd; the main queue is then an ordinary serial queue served by worker threads).
int _dispatch_get_main_queue_handle_4CF(void);

/// Runs, on the calling thread, the blocks the main queue holds now (`@MainActor` jobs included);
/// blocks they queue wait for the next call (libdispatch writes the eventfd again for them). The
/// argument is ignored on Linux (a Mach message on Darwin): pass NULL. It must be called on the main
/// thread: from another thread, with work queued, libdispatch stops the process ("called from the
/// wrong thread"); after `dispatch_main()` it stops it too. A call made from inside a block it runs
/// returns at once without running anything (the drain is not re-entrant), which is why CF does not
/// serve the main queue in runs nested in a main-queue block.
void _dispatch_main_queue_callback_4CF(void *msg);

/// Starts counting fork(2)s (a `pthread_atfork` child handler; idempotent). A run loop made before
/// a fork shares its epoll, eventfd and timerfd with the parent: the child must not use it.
void crlk_watch_forks(void);

/// How many times this process has been forked into (0 in the original process, incremented in
/// each child); counts only after `crlk_watch_forks`. Inline: a relaxed load.
extern _Atomic uint64_t crlk_fork_generation_count;
static inline __attribute__((always_inline)) uint64_t crlk_fork_generation(void) {
    return __atomic_load_n((uint64_t *)&crlk_fork_generation_count, __ATOMIC_RELAXED);
}

/// A wakeup without a descriptor, for a loop that cannot open its kernel descriptors (out of
/// descriptors): a futex word. `crlk_futex_post` sets it and wakes a waiter; `crlk_futex_wait`
/// sleeps while it is 0, at most `timeout_ns` (negative: no limit), then clears it; returns 1 if
/// it was posted.
void crlk_futex_post(uint32_t *word);
int crlk_futex_wait(uint32_t *word, int64_t timeout_ns);

/// Constants Swift cannot import from the headers as macros of the right type.
enum {
    CRLK_EPOLLIN = EPOLLIN,
    CRLK_EPOLLOUT = EPOLLOUT,
    CRLK_EPOLLERR = EPOLLERR,
    CRLK_EPOLLHUP = EPOLLHUP,
};

#endif
