// Counts heap allocations, one thread's or (below) every thread's, by interposing malloc & co. in
// the runloop-bench executable and forwarding to glibc's own entry points (the idea of the main
// package's Tests/CAllocationCounter). Counting is off unless turned on; the cost when off is one
// thread-local load and one relaxed load of a global per call, paid equally by every
// implementation measured.
#define _GNU_SOURCE
#include "CBenchSupport.h"
#include <errno.h>
#include <stddef.h>
#include <unistd.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define CBENCH_ALLOC_COUNTER_DISABLED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define CBENCH_ALLOC_COUNTER_DISABLED 1
#endif

#ifdef CBENCH_ALLOC_COUNTER_DISABLED
bool cbench_alloc_counter_available(void) { return false; }
void cbench_alloc_counter_start(void) {}
long cbench_alloc_counter_stop(void) { return -1; }
void cbench_alloc_process_start(void) {}
long cbench_alloc_process_stop(void) { return -1; }
long cbench_alloc_process_read(void) { return -1; }
#else
static __thread int counting;
static __thread long allocations;

bool cbench_alloc_counter_available(void) { return true; }
void cbench_alloc_counter_start(void) { allocations = 0; counting = 1; }
long cbench_alloc_counter_stop(void) { counting = 0; return allocations; }

// Process-wide counting: a counter per shard, a cache line each, a thread's shard picked on its
// first counted call, so that a producer and a consumer that both allocate do not bounce one line
// between their cores (that would slow the allocation-heavy implementations more than the others).
#include <stdatomic.h>
#define CBENCH_SHARDS 64
static struct { _Alignas(64) atomic_long count; } shards[CBENCH_SHARDS];
static atomic_int process_counting;
static atomic_int next_shard;
static __thread int shard_plus_one;

static inline void count_process(void) {
    if (!atomic_load_explicit(&process_counting, memory_order_relaxed)) return;
    if (!shard_plus_one) shard_plus_one = 1 + atomic_fetch_add_explicit(&next_shard, 1, memory_order_relaxed) % CBENCH_SHARDS;
    atomic_fetch_add_explicit(&shards[shard_plus_one - 1].count, 1, memory_order_relaxed);
}

void cbench_alloc_process_start(void) {
    for (int i = 0; i < CBENCH_SHARDS; i++) atomic_store_explicit(&shards[i].count, 0, memory_order_relaxed);
    atomic_store_explicit(&process_counting, 1, memory_order_seq_cst);
}

long cbench_alloc_process_read(void) {
    long total = 0;
    for (int i = 0; i < CBENCH_SHARDS; i++) total += atomic_load_explicit(&shards[i].count, memory_order_relaxed);
    return total;
}

long cbench_alloc_process_stop(void) {
    atomic_store_explicit(&process_counting, 0, memory_order_seq_cst);
    long total = 0;
    for (int i = 0; i < CBENCH_SHARDS; i++) total += atomic_load_explicit(&shards[i].count, memory_order_relaxed);
    return total;
}

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void __libc_free(void *);

void *malloc(size_t size) { if (counting) allocations++; count_process(); return __libc_malloc(size); }
void *calloc(size_t n, size_t size) { if (counting) allocations++; count_process(); return __libc_calloc(n, size); }
void *realloc(void *p, size_t size) { if (counting) allocations++; count_process(); return __libc_realloc(p, size); }
void free(void *p) { __libc_free(p); }
void *memalign(size_t alignment, size_t size) { if (counting) allocations++; count_process(); return __libc_memalign(alignment, size); }
void *aligned_alloc(size_t alignment, size_t size) { if (counting) allocations++; count_process(); return __libc_memalign(alignment, size); }
void *valloc(size_t size) { if (counting) allocations++; count_process(); return __libc_valloc(size); }
int posix_memalign(void **out, size_t alignment, size_t size) {
    if (counting) allocations++; count_process();
    void *p = __libc_memalign(alignment, size);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}
#endif
