// Counts the heap allocations one thread makes, by interposing malloc & co. in the runloop-bench
// executable and forwarding to glibc's own entry points (the idea of the main package's
// Tests/CAllocationCounter). Counting is off unless a thread turns it on for itself; the cost when
// off is one thread-local load per call, paid equally by every implementation measured.
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
#else
static __thread int counting;
static __thread long allocations;

bool cbench_alloc_counter_available(void) { return true; }
void cbench_alloc_counter_start(void) { allocations = 0; counting = 1; }
long cbench_alloc_counter_stop(void) { counting = 0; return allocations; }

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void __libc_free(void *);

void *malloc(size_t size) { if (counting) allocations++; return __libc_malloc(size); }
void *calloc(size_t n, size_t size) { if (counting) allocations++; return __libc_calloc(n, size); }
void *realloc(void *p, size_t size) { if (counting) allocations++; return __libc_realloc(p, size); }
void free(void *p) { __libc_free(p); }
void *memalign(size_t alignment, size_t size) { if (counting) allocations++; return __libc_memalign(alignment, size); }
void *aligned_alloc(size_t alignment, size_t size) { if (counting) allocations++; return __libc_memalign(alignment, size); }
void *valloc(size_t size) { if (counting) allocations++; return __libc_valloc(size); }
int posix_memalign(void **out, size_t alignment, size_t size) {
    if (counting) allocations++;
    void *p = __libc_memalign(alignment, size);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}
#endif
