#define _GNU_SOURCE
#include <dirent.h>
// Counts heap allocations made by one thread, by interposing malloc & co. in the test binary and
// forwarding to glibc's own entry points. Test-only: lets a test assert that a steady-state run
// loop pass allocates nothing.
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

// A thread that leaves only a little of its small stack (test_start_small_stack_spinner).
#include <limits.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

struct small_stack_job { size_t leave; _Atomic int *stop; _Atomic int *tid; uintptr_t low; };

static void __attribute__((noinline)) small_stack_descend(struct small_stack_job *job) {
    volatile char pad[128];
    pad[0] = 1;
    if ((uintptr_t)pad - job->low > job->leave + 256) {
        small_stack_descend(job);
    } else {
        atomic_store(job->tid, (int)syscall(SYS_gettid));
        while (!atomic_load_explicit(job->stop, memory_order_relaxed)) { pad[1] = pad[0]; }
    }
    __asm__ volatile("" ::: "memory");  // not a tail call: the frame stays
}

static void *small_stack_main(void *argument) {
    struct small_stack_job *job = argument;
    pthread_attr_t attributes;
    void *low = NULL;
    size_t size = 0;
    pthread_getattr_np(pthread_self(), &attributes);
    pthread_attr_getstack(&attributes, &low, &size);
    pthread_attr_destroy(&attributes);
    job->low = (uintptr_t)low;
    small_stack_descend(job);
    free(job);
    return NULL;
}

int test_start_small_stack_spinner(size_t leave, _Atomic int *stop, _Atomic int *tid, pthread_t *thread) {
    struct small_stack_job *job = malloc(sizeof *job);
    *job = (struct small_stack_job){leave, stop, tid, 0};
    pthread_attr_t attributes;
    pthread_attr_init(&attributes);
    pthread_attr_setstacksize(&attributes, PTHREAD_STACK_MIN);
    int result = pthread_create(thread, &attributes, small_stack_main, job);
    pthread_attr_destroy(&attributes);
    if (result != 0) free(job);
    return result;
}
