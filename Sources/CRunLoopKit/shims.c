#define _GNU_SOURCE
#include "CRunLoopKit.h"
#include <pthread.h>
#include <unistd.h>
#include <errno.h>
#include <stdatomic.h>
#include <linux/futex.h>
#include <sys/syscall.h>

pid_t crlk_gettid(void) { return gettid(); }

bool crlk_is_main_thread(void) { return gettid() == getpid(); }

int crlk_get_thread_name(char *buf, size_t len) { return pthread_getname_np(pthread_self(), buf, len); }

int crlk_set_thread_name(const char *name) {
    char truncated[16];
    size_t i = 0;
    for (; i < 15 && name[i] != 0; i++) truncated[i] = name[i];
    truncated[i] = 0;
    return pthread_setname_np(pthread_self(), truncated);
}

void crlk_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
    __asm__ __volatile__("yield");
#endif
}

int64_t crlk_boottime_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int crlk_timerfd_arm_abs(int fd, int64_t deadline_ns) {
    struct itimerspec spec = {0};
    if (deadline_ns >= 0) {
        if (deadline_ns == 0) deadline_ns = 1; /* 0 would disarm */
        spec.it_value.tv_sec = deadline_ns / 1000000000LL;
        spec.it_value.tv_nsec = deadline_ns % 1000000000LL;
    }
    return timerfd_settime(fd, TFD_TIMER_ABSTIME, &spec, NULL);
}

int crlk_timerfd_arm_periodic_abs(int fd, int64_t first_ns, int64_t interval_ns) {
    struct itimerspec spec = {0};
    if (first_ns >= 0) {
        if (first_ns == 0) first_ns = 1;
        spec.it_value.tv_sec = first_ns / 1000000000LL;
        spec.it_value.tv_nsec = first_ns % 1000000000LL;
        spec.it_interval.tv_sec = interval_ns / 1000000000LL;
        spec.it_interval.tv_nsec = interval_ns % 1000000000LL;
    }
    return timerfd_settime(fd, TFD_TIMER_ABSTIME, &spec, NULL);
}

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CRLK_TSAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define CRLK_TSAN 1
#endif

#ifdef CRLK_TSAN
void __tsan_acquire(void *address);
void __tsan_release(void *address);
void crlk_tsan_acquire(void *address) { __tsan_acquire(address); }
void crlk_tsan_release(void *address) { __tsan_release(address); }
#else
void crlk_tsan_acquire(void *address) { (void)address; }
void crlk_tsan_release(void *address) { (void)address; }
#endif


// MARK: fork

_Atomic uint64_t crlk_fork_generation_count;
static pthread_once_t fork_watch_once = PTHREAD_ONCE_INIT;

// Async-signal-safe: one atomic increment (a child handler runs in the single-threaded child).
static void count_fork_child(void) { atomic_fetch_add_explicit(&crlk_fork_generation_count, 1, memory_order_relaxed); }

static void install_fork_watch(void) { pthread_atfork(NULL, NULL, count_fork_child); }

void crlk_watch_forks(void) { pthread_once(&fork_watch_once, install_fork_watch); }


// MARK: futex

void crlk_futex_post(uint32_t *word) {
    _Atomic uint32_t *atomic_word = (_Atomic uint32_t *)word;
    if (atomic_exchange_explicit(atomic_word, 1, memory_order_seq_cst) == 0) {
        syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    }
}

int crlk_futex_wait(uint32_t *word, int64_t timeout_ns) {
    _Atomic uint32_t *atomic_word = (_Atomic uint32_t *)word;
    if (atomic_load_explicit(atomic_word, memory_order_seq_cst) == 0) {
        struct timespec timeout;
        struct timespec *limit = NULL;
        if (timeout_ns >= 0) {
            timeout.tv_sec = timeout_ns / 1000000000;
            timeout.tv_nsec = timeout_ns % 1000000000;
            limit = &timeout;
        }
        // EINTR, EAGAIN (posted meanwhile) and ETIMEDOUT all just end the wait.
        syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, 0, limit, NULL, 0);
    }
    return atomic_exchange_explicit(atomic_word, 0, memory_order_seq_cst) != 0;
}

// MARK: coarse clock bound

static int64_t timespec_ns(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

// CLOCK_BOOTTIME - CLOCK_MONOTONIC (the time spent suspended), and when it was last read (coarse
// monotonic). Racy refreshes are fine: every value stored is a true offset at some moment, and
// the offset only grows.
static _Atomic int64_t boot_offset_ns;
static _Atomic int64_t boot_offset_read_at;

int64_t crlk_boottime_upper_bound_ns(void) {
    int64_t coarse = timespec_ns(CLOCK_MONOTONIC_COARSE);
    int64_t read_at = atomic_load_explicit(&boot_offset_read_at, memory_order_relaxed);
    if (read_at == 0 || coarse - read_at >= 1000000000LL) {
        int64_t offset = timespec_ns(CLOCK_BOOTTIME) - timespec_ns(CLOCK_MONOTONIC);
        atomic_store_explicit(&boot_offset_ns, offset, memory_order_relaxed);
        atomic_store_explicit(&boot_offset_read_at, coarse, memory_order_relaxed);
    }
    return coarse + atomic_load_explicit(&boot_offset_ns, memory_order_relaxed) + 100000000LL;
}

/* Virtual time (RunLoopTesting). The count of threads on it keeps the kernel clock's path to one
   relaxed load of a global while no thread is; the clock itself is the thread's own. */
static atomic_int virtual_time_threads;
static __thread bool virtual_time_on;
static __thread int64_t virtual_time_now;

int64_t crlk_loop_now_ns(void) {
    if (__builtin_expect(atomic_load_explicit(&virtual_time_threads, memory_order_relaxed) != 0, 0)
        && virtual_time_on)
        return virtual_time_now;
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int64_t crlk_loop_now_upper_bound_ns(void) {
    if (__builtin_expect(atomic_load_explicit(&virtual_time_threads, memory_order_relaxed) != 0, 0)
        && virtual_time_on)
        return virtual_time_now;
    return crlk_boottime_upper_bound_ns();
}

bool crlk_set_virtual_time(bool on, int64_t now_ns, int64_t *previous_ns) {
    bool was = virtual_time_on;
    if (previous_ns) *previous_ns = virtual_time_now;
    if (on && !was) atomic_fetch_add_explicit(&virtual_time_threads, 1, memory_order_relaxed);
    if (!on && was) atomic_fetch_sub_explicit(&virtual_time_threads, 1, memory_order_relaxed);
    virtual_time_on = on;
    virtual_time_now = on ? now_ns : 0;
    return was;
}

void crlk_set_virtual_now(int64_t now_ns) { virtual_time_now = now_ns; }

bool crlk_is_on_virtual_time(void) { return virtual_time_on; }
