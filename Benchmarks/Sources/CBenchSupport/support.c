// Linux helpers for runloop-bench that Swift's Glibc module does not import or that must be plain C.
#define _GNU_SOURCE
#include "CBenchSupport.h"
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

uint64_t cbench_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int cbench_gettid(void) { return (int)syscall(SYS_gettid); }

long cbench_thread_context_switches(int tid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/status", tid);
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    char line[256];
    long total = 0;
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        long v;
        if (sscanf(line, "voluntary_ctxt_switches: %ld", &v) == 1) { total += v; found++; }
        else if (sscanf(line, "nonvoluntary_ctxt_switches: %ld", &v) == 1) { total += v; found++; }
    }
    fclose(f);
    return found == 2 ? total : -1;
}

uint64_t cbench_thread_cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int64_t cbench_thread_cpu_ns_of(int tid) {
    // The thread's CPU clock, as pthread_getcpuclockid makes it from a kernel thread id:
    // (~tid << 3) | CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED. Nanosecond resolution, unlike the
    // clock ticks of /proc/self/task/<tid>/stat.
    clockid_t clock = (clockid_t)((~(unsigned)tid << 3) | 6);
    struct timespec ts;
    if (clock_gettime(clock, &ts) != 0) return -1;
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

long cbench_rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "re");
    if (!f) return -1;
    long size = 0, resident = 0;
    int n = fscanf(f, "%ld %ld", &size, &resident);
    fclose(f);
    return n == 2 ? resident * sysconf(_SC_PAGESIZE) : -1;
}

size_t cbench_heap_in_use(void) {
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

// MARK: two threads at once (the ping-pong floors)

void cbench_run_pair(void *(*side)(void *), void *initiator, void *responder) {
    pthread_t ta, tb;
    pthread_create(&tb, NULL, side, responder);
    pthread_create(&ta, NULL, side, initiator);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
}

// MARK: cache line round trip

struct line_bounce {
    _Alignas(64) _Atomic long turn;
    long round_trips;
    uint64_t elapsed;
};

static inline void line_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void *line_bounce_side(void *raw) {
    struct line_bounce *b = raw;
    for (long i = 0; i < b->round_trips; i++) {
        while (atomic_load_explicit(&b->turn, memory_order_acquire) != 2 * i + 1) line_relax();
        atomic_store_explicit(&b->turn, 2 * i + 2, memory_order_release);
    }
    return NULL;
}

double cbench_line_round_trip_ns(long round_trips) {
    struct line_bounce b = {.round_trips = round_trips};
    atomic_init(&b.turn, 0);
    pthread_t other;
    if (pthread_create(&other, NULL, line_bounce_side, &b) != 0) return -1;
    uint64_t start = cbench_now_ns();
    for (long i = 0; i < round_trips; i++) {
        atomic_store_explicit(&b.turn, 2 * i + 1, memory_order_release);
        while (atomic_load_explicit(&b.turn, memory_order_acquire) != 2 * i + 2) line_relax();
    }
    uint64_t end = cbench_now_ns();
    pthread_join(other, NULL);
    return (double)(end - start) / (double)round_trips;
}

// MARK: control thread

static sem_t control_release, control_ready;
static pthread_t control_thread;
static int control_tid;

static void *control_main(void *unused) {
    (void)unused;
    control_tid = cbench_gettid();
    sem_post(&control_ready);
    while (sem_wait(&control_release) < 0 && errno == EINTR) {}
    return NULL;
}

int cbench_control_thread_start(void) {
    sem_init(&control_release, 0, 0);
    sem_init(&control_ready, 0, 0);
    pthread_create(&control_thread, NULL, control_main, NULL);
    while (sem_wait(&control_ready) < 0 && errno == EINTR) {}
    return control_tid;
}

void cbench_control_thread_stop(void) {
    sem_post(&control_release);
    pthread_join(control_thread, NULL);
    sem_destroy(&control_release);
    sem_destroy(&control_ready);
}
