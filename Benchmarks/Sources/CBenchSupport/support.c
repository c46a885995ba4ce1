// Linux helpers for runloop-bench that Swift's Glibc module does not import or that must be plain C.
#define _GNU_SOURCE
#include "CBenchSupport.h"
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <semaphore.h>
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

// MARK: ping-pong floor

void cbench_run_pair(void *(*side)(void *), void *initiator, void *responder) {
    pthread_t ta, tb;
    pthread_create(&tb, NULL, side, responder);
    pthread_create(&ta, NULL, side, initiator);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
}

struct pp_side {
    int epfd, own, other;
    long round_trips;
    int initiator;
    pthread_barrier_t *start;
    uint64_t elapsed;
};

static int pp_wait(struct pp_side *s) {
    struct epoll_event ev;
    for (;;) {
        int n = epoll_wait(s->epfd, &ev, 1, -1);
        if (n == 1) break;
        if (n < 0 && errno != EINTR) return -1;
    }
    uint64_t value;
    while (read(s->own, &value, sizeof value) < 0) {
        if (errno != EINTR) return -1;
    }
    return 0;
}

static int pp_kick(struct pp_side *s) {
    uint64_t one = 1;
    while (write(s->other, &one, sizeof one) < 0) {
        if (errno != EINTR) return -1;
    }
    return 0;
}

static void *pp_thread(void *raw) {
    struct pp_side *s = raw;
    pthread_barrier_wait(s->start);
    if (s->initiator) {
        uint64_t t0 = cbench_now_ns();
        for (long i = 0; i < s->round_trips; i++) {
            if (pp_kick(s) || pp_wait(s)) return NULL;
        }
        s->elapsed = cbench_now_ns() - t0;
    } else {
        for (long i = 0; i < s->round_trips; i++) {
            if (pp_wait(s) || pp_kick(s)) return NULL;
        }
    }
    return NULL;
}

uint64_t cbench_pingpong_floor(long round_trips) {
    int efd[2] = {eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK), eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
    int ep[2] = {epoll_create1(EPOLL_CLOEXEC), epoll_create1(EPOLL_CLOEXEC)};
    uint64_t result = 0;
    if (efd[0] < 0 || efd[1] < 0 || ep[0] < 0 || ep[1] < 0) goto out;
    for (int i = 0; i < 2; i++) {
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint64_t)i};
        if (epoll_ctl(ep[i], EPOLL_CTL_ADD, efd[i], &ev) < 0) goto out;
    }
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, 2);
    struct pp_side a = {ep[0], efd[0], efd[1], round_trips, 1, &start, 0};
    struct pp_side b = {ep[1], efd[1], efd[0], round_trips, 0, &start, 0};
    cbench_run_pair(pp_thread, &a, &b);
    pthread_barrier_destroy(&start);
    result = a.elapsed;
out:
    for (int i = 0; i < 2; i++) {
        if (efd[i] >= 0) close(efd[i]);
        if (ep[i] >= 0) close(ep[i]);
    }
    return result;
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
