// Same-policy C floors (issue 37): what RunLoopKit's own policy costs when nothing but that policy
// runs. Each is the machine's floor for a workload done the way RunLoopKit does it:
//
//   wakeups    a request flag and a sleeping flag (the store-buffer pattern, sequentially
//              consistent), an eventfd written only when the other side sleeps in epoll_wait;
//   spin       after a wakeup from another thread, the woken side watches the request flag for up
//              to 5 µs before it sleeps (RunLoopKit's spin after a cross-thread wakeup);
//   queue      submissions go into a buffer under RunLoopKit's spin lock (pause, then yield); the
//              consumer swaps the whole buffer for an empty spare, and runs what it took outside
//              the lock (RunLoopKit's BlockQueue); an item is a function and its argument, called
//              one by one.
//
// No allocation per item, no run loop: the distance from RunLoopKit to these is the price of its
// passes, its closures and its bookkeeping.
#define _GNU_SOURCE
#include "CBenchSupport.h"
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

static const uint64_t floor_spin_ns = 5000;

static inline void floor_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/// RunLoopKit's lock (Locked.swift's SpinLock): an acquiring exchange, a releasing store; a
/// waiter spins with a CPU pause, and after 64 spins yields the CPU (the holder may have been
/// descheduled). The queue's producer and consumer meet in it; the timers' loop takes it
/// uncontended, as a loop thread adding its own timers does.
struct floor_lock {
    atomic_bool held;
};

static inline void floor_lock_take(struct floor_lock *l) {
    if (!atomic_exchange_explicit(&l->held, true, memory_order_acquire)) return;
    // Contended: watch the flag with plain loads (the line stays shared) until it looks free.
    unsigned spins = 0;
    for (;;) {
        while (atomic_load_explicit(&l->held, memory_order_relaxed)) {
            if (++spins < 64)
                floor_relax();
            else
                sched_yield();
        }
        if (!atomic_exchange_explicit(&l->held, true, memory_order_acquire)) return;
    }
}

static inline void floor_lock_give(struct floor_lock *l) { atomic_store_explicit(&l->held, false, memory_order_release); }

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
/// The fence orders the waker's work (a queued item, published with a releasing store) before the
/// load that may return early, as RunLoopKit's WakeProtocol.request() does: without it the store
/// can wait in the store buffer while the load sees a request the waiter is about to take, and
/// the waiter then sleeps with work queued (a lost wakeup, seen with this floor's spin lock).
static void floor_wake(struct floor_waiter *w) {
    atomic_thread_fence(memory_order_seq_cst);
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
    struct floor_lock lock;
    struct floor_buffer filling;
    atomic_bool pending;
    struct floor_waiter waiter;
    atomic_bool stop;
    bool spin;
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
        // Sequentially consistent: after a request taken (an exchange), this load must see the
        // item whose waker returned early on that request (the store-buffer pattern).
        if (atomic_load_explicit(&q->pending, memory_order_seq_cst)) {
            floor_lock_take(&q->lock);
            struct floor_buffer full = q->filling;
            q->filling = spare;
            atomic_store_explicit(&q->pending, false, memory_order_relaxed);
            floor_lock_give(&q->lock);
            for (size_t i = 0; i < full.count; i++) full.items[i].call(full.items[i].argument);
            full.count = 0;
            spare = full;
            continue;
        }
        floor_wait(&q->waiter, woken && q->spin);
        woken = true;
    }
    free(spare.items);
    return NULL;
}

static int floor_submit(struct floor_queue *q, struct floor_item item) {
    floor_lock_take(&q->lock);
    int failed = floor_buffer_push(&q->filling, item);
    bool first = !atomic_load_explicit(&q->pending, memory_order_relaxed);
    if (first) atomic_store_explicit(&q->pending, true, memory_order_release);
    floor_lock_give(&q->lock);
    if (first) floor_wake(&q->waiter);
    return failed;
}

uint64_t cbench_submit_policy_floor(long items, bool spin) {
    struct floor_queue q = {.filling = {0}, .spin = spin};
    atomic_init(&q.lock.held, false);
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
        // The consumer's counter is read once it has stopped (joined): once it has taken the
        // last items, set the stop flag and wake it.
        while (!failed && atomic_load_explicit(&q.pending, memory_order_acquire)) floor_relax();
        atomic_store_explicit(&q.stop, true, memory_order_release);
        floor_wake(&q.waiter);
        pthread_join(consumer, NULL);
        if (!failed && counter.count == items) result = counter.end - start;
    }
    floor_waiter_close(&q.waiter);
    free(q.filling.items);
    return result;
}

// MARK: Timers, the same policy
//
// RunLoopKit's timers: each is an object of its own (one allocation), scheduled as an entry of a
// 4-ary min-heap ordered by (fire date, insertion number) that points at it; an entry is live
// while its generation matches the timer's. Adding takes the loop's lock and re-arms the timerfd
// when the new timer is the earliest. A wakeup collects every due timer under the lock in one
// step, re-arms the timerfd for the next one, and fires them outside the lock, one by one.

struct floor_timer {
    void (*call)(void *);
    void *argument;
    uint64_t generation;
};

struct floor_entry {
    int64_t fire, latest;
    uint64_t sequence, generation;
    struct floor_timer *timer;
};

struct floor_heap {
    struct floor_entry *entries;
    size_t count, capacity;
    uint64_t next_sequence;
};

/// A callee that does nothing, where the floors need one.
static void floor_nothing(void *raw) {
    (void)raw;
    __asm__ __volatile__("" ::: "memory");
}

static inline bool floor_precedes(const struct floor_entry *a, const struct floor_entry *b) {
    return a->fire < b->fire || (a->fire == b->fire && a->sequence < b->sequence);
}

static int floor_heap_push(struct floor_heap *h, struct floor_entry e) {
    if (h->count == h->capacity) {
        size_t capacity = h->capacity ? h->capacity * 2 : 64;
        struct floor_entry *grown = realloc(h->entries, capacity * sizeof *grown);
        if (!grown) return -1;
        h->entries = grown;
        h->capacity = capacity;
    }
    size_t i = h->count++;
    while (i > 0) {
        size_t parent = (i - 1) / 4;
        if (!floor_precedes(&e, &h->entries[parent])) break;
        h->entries[i] = h->entries[parent];
        i = parent;
    }
    h->entries[i] = e;
    return 0;
}

/// Puts `moving` at hole `i` of the first `n` entries, moving it down past smaller children.
static void floor_sift_down(struct floor_heap *h, size_t i, struct floor_entry moving, size_t n) {
    for (;;) {
        size_t first = 4 * i + 1;
        if (first >= n) break;
        size_t best = first, end = first + 4 < n ? first + 4 : n;
        for (size_t c = first + 1; c < end; c++)
            if (floor_precedes(&h->entries[c], &h->entries[best])) best = c;
        if (!floor_precedes(&h->entries[best], &moving)) break;
        h->entries[i] = h->entries[best];
        i = best;
    }
    h->entries[i] = moving;
}

static struct floor_entry floor_heap_pop(struct floor_heap *h) {
    struct floor_entry top = h->entries[0];
    struct floor_entry last = h->entries[--h->count];
    if (h->count > 0) floor_sift_down(h, 0, last, h->count);
    return top;
}

struct floor_timer_loop {
    struct floor_heap heap;
    struct floor_lock lock;
    int epfd, timerfd, eventfd;
    int64_t armed;
};

static void floor_arm(struct floor_timer_loop *loop, int64_t deadline) {
    if (deadline == loop->armed) return;
    struct itimerspec spec = {{0, 0}, {0, 0}};
    if (deadline != INT64_MAX) {
        int64_t at = deadline > 0 ? deadline : 1;
        spec.it_value.tv_sec = at / 1000000000;
        spec.it_value.tv_nsec = at % 1000000000;
    }
    timerfd_settime(loop->timerfd, TFD_TIMER_ABSTIME, &spec, NULL);
    loop->armed = deadline;
}

static void floor_timer_loop_close(struct floor_timer_loop *loop) {
    while (loop->heap.count > 0) free(floor_heap_pop(&loop->heap).timer);
    free(loop->heap.entries);
    loop->heap.entries = NULL;
    if (loop->epfd >= 0) close(loop->epfd);
    if (loop->timerfd >= 0) close(loop->timerfd);
    if (loop->eventfd >= 0) close(loop->eventfd);
    loop->epfd = loop->timerfd = loop->eventfd = -1;
}

/// Opens the loop's descriptors; on failure closes what it opened and returns -1 (closing the
/// loop again is then harmless).
static int floor_timer_loop_init(struct floor_timer_loop *loop) {
    *loop = (struct floor_timer_loop){.heap = {0}, .armed = INT64_MAX};
    atomic_init(&loop->lock.held, false);
    loop->epfd = epoll_create1(EPOLL_CLOEXEC);
    loop->timerfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    loop->eventfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    struct epoll_event timer_event = {.events = EPOLLIN, .data.u64 = 1};
    struct epoll_event wake_event = {.events = EPOLLIN, .data.u64 = 2};
    if (loop->epfd < 0 || loop->timerfd < 0 || loop->eventfd < 0
        || epoll_ctl(loop->epfd, EPOLL_CTL_ADD, loop->timerfd, &timer_event) < 0
        || epoll_ctl(loop->epfd, EPOLL_CTL_ADD, loop->eventfd, &wake_event) < 0) {
        floor_timer_loop_close(loop);
        return -1;
    }
    return 0;
}


/// Creates a timer and adds it: an allocation, the lock, a heap push, and a timerfd re-arm when it
/// is the new earliest. Returns the timer, or NULL when out of memory.
static struct floor_timer *floor_add_timer(struct floor_timer_loop *loop, int64_t fire, void (*call)(void *), void *argument) {
    struct floor_timer *timer = malloc(sizeof *timer);
    if (!timer) return NULL;
    *timer = (struct floor_timer){call, argument, 1};
    floor_lock_take(&loop->lock);
    struct floor_entry entry = {fire, fire, loop->heap.next_sequence++, 1, timer};
    int failed = floor_heap_push(&loop->heap, entry);
    if (!failed && loop->heap.entries[0].timer == timer) floor_arm(loop, fire);
    floor_lock_give(&loop->lock);
    if (failed) {
        free(timer);
        return NULL;
    }
    return timer;
}

uint64_t cbench_insert_policy_floor(const int64_t *offsets, long count) {
    struct floor_timer_loop loop;
    uint64_t result = 0;
    if (floor_timer_loop_init(&loop) == 0) {
        int64_t base = (int64_t)cbench_now_ns();
        uint64_t start = cbench_now_ns();
        int failed = 0;
        for (long i = 0; i < count && !failed; i++) failed = !floor_add_timer(&loop, base + offsets[i], floor_nothing, NULL);
        if (!failed) result = cbench_now_ns() - start;
    }
    floor_timer_loop_close(&loop);
    return result;
}

struct floor_fire_run {
    const int64_t *offsets;
    long count;
    long fired;
    uint64_t first_due, last_fire;
    bool overran;
    int failed;
};

static void floor_fired(void *raw) {
    struct floor_fire_run *run = raw;
    if (++run->fired == run->count) run->last_fire = cbench_now_ns();
}

static void *floor_fire_thread(void *raw) {
    struct floor_fire_run *run = raw;
    struct floor_timer_loop loop;
    struct floor_timer **due = malloc((size_t)run->count * sizeof *due);
    if (!due || floor_timer_loop_init(&loop) != 0) {
        run->failed = 1;
        free(due);
        return NULL;
    }
    int64_t base = (int64_t)cbench_now_ns(), first = INT64_MAX;
    for (long i = 0; i < run->count && !run->failed; i++) {
        if (run->offsets[i] < first) first = run->offsets[i];
        run->failed = !floor_add_timer(&loop, base + run->offsets[i], floor_fired, run);
    }
    run->first_due = (uint64_t)(base + first);
    run->overran = cbench_now_ns() >= run->first_due;
    while (!run->failed && run->fired < run->count) {
        struct epoll_event events[8];
        int n = epoll_wait(loop.epfd, events, 8, -1);
        for (int i = 0; i < n; i++) {
            if (events[i].data.u64 != 1) continue;
            uint64_t expirations;
            if (read(loop.timerfd, &expirations, sizeof expirations) > 0) loop.armed = INT64_MAX;
        }
        int64_t now = (int64_t)cbench_now_ns();
        size_t taken = 0;
        floor_lock_take(&loop.lock);
        while (loop.heap.count > 0 && loop.heap.entries[0].fire <= now) {
            struct floor_entry entry = floor_heap_pop(&loop.heap);
            if (entry.generation == entry.timer->generation) due[taken++] = entry.timer;
        }
        floor_arm(&loop, loop.heap.count > 0 ? loop.heap.entries[0].fire : INT64_MAX);
        floor_lock_give(&loop.lock);
        for (size_t i = 0; i < taken; i++) {
            due[i]->generation++;  // a one-shot timer is invalid once it fired
            due[i]->call(due[i]->argument);
            free(due[i]);
        }
    }
    floor_timer_loop_close(&loop);
    free(due);
    return NULL;
}

uint64_t cbench_fire_policy_floor(const int64_t *offsets, long count, bool *overran) {
    struct floor_fire_run run = {offsets, count, 0, 0, 0, false, 0};
    pthread_t thread;
    if (pthread_create(&thread, NULL, floor_fire_thread, &run) != 0) return 0;
    pthread_join(thread, NULL);
    if (overran) *overran = run.overran;
    return run.failed || run.fired != count ? 0 : run.last_fire - run.first_due;
}

// MARK: An empty pass, the same policy
//
// What one pass of RunLoopKit's run costs when nothing but the pass runs: the observers'
// callouts (before timers, before sources), a look at the timers (none), the signalled source
// taken (an atomic exchange: signal() is safe from any thread) and performed, and the poll that
// replaces the sleep after a handled source (the wakeup request taken, the block inbox looked at;
// no syscall: the mode watches no descriptor), then the stop flag.

struct floor_pass_loop {
    atomic_bool signalled, request, inbox_pending, stopped;
    struct floor_heap timers;
    void (*observer)(void *, int);
    long performed, target;
};

static void floor_observe(void *raw, int activity) {
    (void)raw;
    __asm__ __volatile__("" ::"r"(activity) : "memory");  // a callout that does nothing
}

static void floor_perform(struct floor_pass_loop *loop) {
    if (++loop->performed < loop->target)
        atomic_store_explicit(&loop->signalled, true, memory_order_release);
    else
        atomic_store_explicit(&loop->stopped, true, memory_order_release);
}

static void floor_pass_run(struct floor_pass_loop *loop, void (*volatile perform)(struct floor_pass_loop *)) {
    void (*volatile observer)(void *, int) = loop->observer;
    for (;;) {
        if (observer) observer(loop, 2);  // before timers
        if (loop->timers.count > 0) floor_nothing(loop);
        if (observer) observer(loop, 4);  // before sources
        if (atomic_exchange_explicit(&loop->signalled, false, memory_order_acquire)) perform(loop);
        (void)atomic_exchange_explicit(&loop->request, false, memory_order_seq_cst);
        if (atomic_load_explicit(&loop->inbox_pending, memory_order_acquire)) floor_nothing(loop);
        if (atomic_load_explicit(&loop->stopped, memory_order_acquire)) return;
    }
}

uint64_t cbench_iterate_policy_floor(long iterations, bool observed) {
    struct floor_pass_loop loop = {.timers = {0}, .observer = observed ? floor_observe : NULL, .target = iterations};
    atomic_init(&loop.signalled, true);
    atomic_init(&loop.request, false);
    atomic_init(&loop.inbox_pending, false);
    atomic_init(&loop.stopped, false);
    uint64_t start = cbench_now_ns();
    floor_pass_run(&loop, floor_perform);
    uint64_t elapsed = cbench_now_ns() - start;
    return loop.performed == iterations ? elapsed : 0;
}

// MARK: Timer churn, the same policy
//
// RunLoopKit's cancel: the timer's generation moves on (its heap entry goes stale, nothing is
// searched), and the heap is rebuilt from its live entries once stale ones outnumber the live
// (more than twice the live timers plus 32 entries); a dropped entry frees its timer.

static void floor_rebuild(struct floor_heap *h) {
    size_t kept = 0;
    for (size_t i = 0; i < h->count; i++) {
        struct floor_entry e = h->entries[i];
        if (e.generation == e.timer->generation)
            h->entries[kept++] = e;
        else
            free(e.timer);
    }
    h->count = kept;
    // Heapify: sift down every parent, last first.
    for (size_t start = kept > 1 ? (kept - 2) / 4 + 1 : 0; start-- > 0;)
        floor_sift_down(h, start, h->entries[start], kept);
}

uint64_t cbench_churn_policy_floor(const int64_t *offsets, long live, long operations) {
    struct floor_timer_loop loop;
    struct floor_timer **ring = malloc((size_t)live * sizeof *ring);
    uint64_t result = 0;
    if (ring && floor_timer_loop_init(&loop) == 0) {
        int64_t base = (int64_t)cbench_now_ns();
        int failed = 0;
        for (long i = 0; i < live && !failed; i++) {
            ring[i] = floor_add_timer(&loop, base + offsets[i], floor_nothing, NULL);
            failed = !ring[i];
        }
        uint64_t start = cbench_now_ns();
        for (long i = 0; i < operations && !failed; i++) {
            struct floor_timer *added = floor_add_timer(&loop, base + offsets[live + i], floor_nothing, NULL);
            failed = !added;
            struct floor_timer *cancelled = ring[i % live];
            floor_lock_take(&loop.lock);
            cancelled->generation++;
            if (loop.heap.count > 2 * (size_t)live + 32) floor_rebuild(&loop.heap);
            floor_lock_give(&loop.lock);
            ring[i % live] = added;
        }
        if (!failed) result = cbench_now_ns() - start;
        floor_timer_loop_close(&loop);
    }
    free(ring);
    return result;
}
