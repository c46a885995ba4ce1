#include <dirent.h>
// Counts heap allocations made by one thread, by interposing malloc & co. in the test binary and
// forwarding to glibc's own entry points. Test-only: lets a test assert that a steady-state run
// loop pass allocates nothing.
#define _GNU_SOURCE
#include <malloc.h>
#include "CAllocationCounter.h"
#include <stddef.h>
#include <errno.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define ALLOC_COUNTER_DISABLED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ALLOC_COUNTER_DISABLED 1
#endif

#ifdef ALLOC_COUNTER_DISABLED
bool alloc_counter_available(void) { return false; }
void alloc_counter_start(void) {}
long alloc_counter_stop(void) { return 0; }
#else
static __thread int counting;
static __thread long allocations;

bool alloc_counter_available(void) { return true; }
void alloc_counter_start(void) { allocations = 0; counting = 1; }
long alloc_counter_stop(void) { counting = 0; return allocations; }

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

void *malloc(size_t size) { if (counting) allocations++; return __libc_malloc(size); }
void *calloc(size_t n, size_t size) { if (counting) allocations++; return __libc_calloc(n, size); }
void *realloc(void *p, size_t size) { if (counting) allocations++; return __libc_realloc(p, size); }
void free(void *p) { __libc_free(p); }
void *memalign(size_t alignment, size_t size) { if (counting) allocations++; return __libc_memalign(alignment, size); }
void *aligned_alloc(size_t alignment, size_t size) { if (counting) allocations++; return __libc_memalign(alignment, size); }
int posix_memalign(void **out, size_t alignment, size_t size) {
    if (counting) allocations++;
    void *p = __libc_memalign(alignment, size);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}
#endif

size_t alloc_counter_usable_size(const void *pointer) { return malloc_usable_size((void *)pointer); }

int test_count_open_fds(void) {
    DIR *dir = opendir("/proc/self/fd");
    if (!dir) return -1;
    int count = 0;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        if (entry->d_name[0] != '.') count++;
    }
    closedir(dir);
    return count - 1; /* the directory stream's own descriptor */
}
