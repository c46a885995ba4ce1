// Same-policy C floors (issue 37): what RunLoopKit's own policy costs when nothing but that policy
// runs. Each is the machine's floor for a workload done the way RunLoopKit does it:
//
//   wakeups    a request flag and a sleeping flag (the store-buffer pattern, sequentially
//              consistent), an eventfd written only when the other side sleeps in epoll_wait;
//   spin       after a wakeup from another thread, the woken side watches the request flag for up
//              to 5 µs before it sleeps (RunLoopKit's spin after a cross-thread wakeup);
//   queue      submissions go into a buffer under a mutex; the consumer swaps the whole buffer for
//              an empty spare, and runs what it took outside the lock (RunLoopKit's BlockQueue);
//              an item is a function and its argument, called one by one.
//
// No allocation per item, no run loop: the distance from RunLoopKit to these is the price of its
// passes, its closures and its bookkeeping.
#define _GNU_SOURCE
#include "CBenchSupport.h"
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

static const uint64_t floor_spin_ns = 5000;

static inline void floor_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

// MARK: The wake protocol of the floors

struct floor_waiter {
    atomic_bool request;
    atomic_bool sleeping;
    int eventfd;
    int epfd;
};

static int floor_waiter_init(struct floor_waiter *w) {
    atomic_init(&w->request, false);
    atomic_init(&w->sleeping, false);
    w->eventfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    w->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (w->eventfd < 0 || w->epfd < 0) return -1;
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 1};
    return epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->eventfd, &ev);
}

static void floor_waiter_close(struct floor_waiter *w) {
    if (w->eventfd >= 0) close(w->eventfd);
    if (w->epfd >= 0) close(w->epfd);
}

/// The waker's side: make the request; write the eventfd only if it is new and the waiter sleeps.
static void floor_wake(struct floor_waiter *w) {
    if (atomic_load_explicit(&w->request, memory_order_seq_cst)) return;
    if (atomic_exchange_explicit(&w->request, true, memory_order_seq_cst)) return;
    if (atomic_load_explicit(&w->sleeping, memory_order_seq_cst)) {
        uint64_t one = 1;
        while (write(w->eventfd, &one, sizeof one) < 0 && errno == EINTR) {}
    }
}

/// The waiter's side: returns once a request is taken. `spin`: watch for it first, up to 5 µs.
static void floor_wait(struct floor_waiter *w, bool spin) {
    if (spin) {
        uint64_t limit = cbench_now_ns() + floor_spin_ns;
        unsigned spins = 0;
        while (!atomic_load_explicit(&w->request, memory_order_relaxed)) {
            floor_relax();
            if ((++spins & 31) == 0 && cbench_now_ns() >= limit) break;
        }
    }
    for (;;) {
        if (atomic_exchange_explicit(&w->request, false, memory_order_seq_cst)) return;
        atomic_store_explicit(&w->sleeping, true, memory_order_seq_cst);
        if (atomic_exchange_explicit(&w->request, false, memory_order_seq_cst)) {
            atomic_store_explicit(&w->sleeping, false, memory_order_seq_cst);
            return;
        }
        struct epoll_event ev;
        int n = epoll_wait(w->epfd, &ev, 1, -1);
        atomic_store_explicit(&w->sleeping, false, memory_order_seq_cst);
        if (n == 1) {
            uint64_t value;
            while (read(w->eventfd, &value, sizeof value) < 0 && errno == EINTR) {}
        }
    }
}

// MARK: Ping-pong, the same policy

struct spp_side {
    struct floor_waiter *own, *other;
    long round_trips;
    int initiator;
    bool spin;
    pthread_barrier_t *start;
    uint64_t elapsed;
};

static void *spp_thread(void *raw) {
    struct spp_side *s = raw;
    pthread_barrier_wait(s->start);
    uint64_t t0 = cbench_now_ns();
    for (long i = 0; i < s->round_trips; i++) {
        if (s->initiator) {
            floor_wake(s->other);
            floor_wait(s->own, s->spin);
        } else {
            floor_wait(s->own, s->spin);
            floor_wake(s->other);
        }
    }
    s->elapsed = cbench_now_ns() - t0;
    return NULL;
}

uint64_t cbench_pingpong_policy_floor(long round_trips, bool spin) {
    struct floor_waiter w[2];
    uint64_t result = 0;
    int ok = floor_waiter_init(&w[0]) == 0;
    ok = floor_waiter_init(&w[1]) == 0 && ok;
    if (ok) {
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, 2);
        struct spp_side a = {&w[0], &w[1], round_trips, 1, spin, &start, 0};
        struct spp_side b = {&w[1], &w[0], round_trips, 0, spin, &start, 0};
        cbench_run_pair(spp_thread, &a, &b);
        pthread_barrier_destroy(&start);
        result = a.elapsed;
    }
    floor_waiter_close(&w[0]);
    floor_waiter_close(&w[1]);
    return result;
}

// MARK: Submission, the same policy

struct floor_item {
    void (*call)(void *);
    void *argument;
};

struct floor_buffer {
    struct floor_item *items;
    size_t count, capacity;
};

static int floor_buffer_push(struct floor_buffer *b, struct floor_item item) {
    if (b->count == b->capacity) {
        size_t capacity = b->capacity ? b->capacity * 2 : 64;
        struct floor_item *grown = realloc(b->items, capacity * sizeof *grown);
        if (!grown) return -1;
        b->items = grown;
        b->capacity = capacity;
    }
    b->items[b->count++] = item;
    return 0;
}

struct floor_queue {
    pthread_mutex_t lock;
    struct floor_buffer filling;
    atomic_bool pending;
    struct floor_waiter waiter;
    atomic_bool stop;
};

struct floor_counter {
    long count, target;
    uint64_t end;
};

static void floor_count(void *raw) {
    struct floor_counter *c = raw;
    if (++c->count == c->target) c->end = cbench_now_ns();
}

static void *floor_consumer(void *raw) {
    struct floor_queue *q = raw;
    struct floor_buffer spare = {0};
    bool woken = false;
    while (!atomic_load_explicit(&q->stop, memory_order_acquire)) {
        if (atomic_load_explicit(&q->pending, memory_order_acquire)) {
            pthread_mutex_lock(&q->lock);
            struct floor_buffer full = q->filling;
            q->filling = spare;
            atomic_store_explicit(&q->pending, false, memory_order_relaxed);
            pthread_mutex_unlock(&q->lock);
            for (size_t i = 0; i < full.count; i++) full.items[i].call(full.items[i].argument);
            full.count = 0;
            spare = full;
            continue;
        }
        floor_wait(&q->waiter, woken);
        woken = true;
    }
    free(spare.items);
    return NULL;
}

static int floor_submit(struct floor_queue *q, struct floor_item item) {
    pthread_mutex_lock(&q->lock);
    int failed = floor_buffer_push(&q->filling, item);
    bool first = !atomic_load_explicit(&q->pending, memory_order_relaxed);
    if (first) atomic_store_explicit(&q->pending, true, memory_order_release);
    pthread_mutex_unlock(&q->lock);
    if (first) floor_wake(&q->waiter);
    return failed;
}

uint64_t cbench_submit_policy_floor(long items) {
    struct floor_queue q = {.filling = {0}};
    pthread_mutex_init(&q.lock, NULL);
    atomic_init(&q.pending, false);
    atomic_init(&q.stop, false);
    uint64_t result = 0;
    if (floor_waiter_init(&q.waiter) == 0) {
        pthread_t consumer;
        pthread_create(&consumer, NULL, floor_consumer, &q);
        struct floor_counter counter = {0, items, 0};
        uint64_t start = cbench_now_ns();
        int failed = 0;
        for (long i = 0; i < items && !failed; i++) failed = floor_submit(&q, (struct floor_item){floor_count, &counter});
        // The consumer's counter is read once it has stopped (joined): ask it to stop after
        // the last item, with one more item that sets the flag.
        while (!failed && atomic_load_explicit(&q.pending, memory_order_acquire)) floor_relax();
        atomic_store_explicit(&q.stop, true, memory_order_release);
        floor_wake(&q.waiter);
        pthread_join(consumer, NULL);
        if (!failed && counter.count == items) result = counter.end - start;
    }
    floor_waiter_close(&q.waiter);
    free(q.filling.items);
    pthread_mutex_destroy(&q.lock);
    return result;
}
