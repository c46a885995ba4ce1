// Capturing another thread's stack: a signal handler on the target thread writes its return
// addresses into a preallocated buffer while the capturing thread waits on a futex.
//
// The handler is async-signal-safe: it saves errno, allocates nothing, takes no lock, and calls
// only the bounded CFI walk (unwind.c: _dl_find_object, process_vm_readv), clock_gettime,
// syscall(futex) and, where that walk is unavailable, backtrace() (glibc 2.36 + libgcc 12
// unwind through the lock-free _dl_find_object; the first call, which loads libgcc_s, is made
// at install).
// How a stack is unwound, first that applies:
//   1. the frame-pointer chain: a registered thread interrupted in the main executable, when the
//      calibration found the chain matching the tables (the fast path);
//   2. the bounded CFI walk: every thread on x86-64 (reads only the registered stack, or through
//      process_vm_readv when no bounds are registered);
//   3. the frame-pointer chain of a registered thread, when the CFI walk found no caller (code
//      without tables, such as JIT code);
//   4. glibc backtrace(): other architectures, or no bounds and no process_vm_readv (seccomp).
//      libgcc trusts the tables blindly and can fault where they are wrong (see unwind.c).
// Protocol (one capture at a time, serialized by the Swift caller):
//   capturer: target = tid; armed = seq (release); tgkill; futex-wait on done == seq.
//   handler:  if armed is seq and target is me, claim it (CAS seq -> seq|CLAIMED), unwind, then
//             done = seq (release) and wake.
//   timeout:  the capturer cancels with CAS seq -> 0; if the handler claimed first, it waits for
//             it to finish (it cannot block: it only unwinds). A late signal finds nothing armed.
#define _GNU_SOURCE
#include "CRunLoopMonitor.h"
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <stdlib.h>
#include <link.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

// ThreadSanitizer defers signals: its own handler queues them and calls ours later, at a safe
// point in its runtime, with the context of the original interrupt, which is stale by then (the
// stack it describes has moved on). Under it, only backtrace() from the handler's own frames is
// meaningful: it walks call sites only (the runtime's delivery frames, then the code that was
// interrupted), where the tables are right.
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CRLM_DEFERRED_SIGNALS 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define CRLM_DEFERRED_SIGNALS 1
#endif

#define CLAIMED ((uint64_t)1 << 63)
#define MAX_THREADS 512

// The capture signal, 0 until crlm_install. Written once (under the installer's lock), read from
// any thread without it (a thread preparing itself may run while the monitor installs): atomic,
// and lock-free, so the signal handler may read it too.
static _Atomic int g_signal;
static _Atomic uint64_t g_armed;
static _Atomic uint32_t g_done;
static _Atomic pid_t g_target;
static _Atomic int g_capacity;
static _Atomic bool g_calibrating;
static uint64_t g_seq;
static uint64_t g_frames[CRLM_MAX_FRAMES];
static uint64_t g_fp_frames[CRLM_MAX_FRAMES];
static uint64_t g_cfi_frames[CRLM_MAX_FRAMES];
static int g_count, g_fp_count, g_cfi_count, g_method;
static _Atomic int64_t g_sent_ns, g_handled_ns;
static int64_t g_last_latency_ns;

static _Atomic bool g_fp_usable;
static bool g_cfi_usable, g_safe_reads;  // set at install, before the handler
static bool g_parked_usable;             // walks of threads parked in the kernel (set at install)
static _Atomic uint32_t g_fork_generation;
static uintptr_t g_exe_text_lo, g_exe_text_hi;

static struct { _Atomic pid_t tid; _Atomic uintptr_t lo, hi; } g_threads[MAX_THREADS];

static int64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void futex_wake(_Atomic uint32_t *word) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static void futex_wait(_Atomic uint32_t *word, uint32_t seen, int64_t ns) {
    if (ns <= 0) return;
    struct timespec ts = {.tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL};
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, seen, &ts, NULL, 0);
}

static void context_registers(void *context, uintptr_t *pc, uintptr_t *fp, uintptr_t *sp) {
    ucontext_t *uc = (ucontext_t *)context;
#if defined(__x86_64__)
    *pc = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
    *fp = (uintptr_t)uc->uc_mcontext.gregs[REG_RBP];
    *sp = (uintptr_t)uc->uc_mcontext.gregs[REG_RSP];
#elif defined(__aarch64__)
    *pc = (uintptr_t)uc->uc_mcontext.pc;
    *fp = (uintptr_t)uc->uc_mcontext.regs[29];
    *sp = (uintptr_t)uc->uc_mcontext.sp;
#else
    *pc = 0; *fp = 0; *sp = 0;
#endif
}

/// The interrupted registers in DWARF numbering, for the CFI walk.
static void context_cfi_registers(void *context, uint64_t registers[CRLM_CFI_REGISTERS]) {
    memset(registers, 0, CRLM_CFI_REGISTERS * sizeof(uint64_t));
#if defined(__x86_64__)
    static const int order[CRLM_CFI_REGISTERS] = {REG_RAX, REG_RDX, REG_RCX, REG_RBX, REG_RSI, REG_RDI,
                                                  REG_RBP, REG_RSP, REG_R8,  REG_R9,  REG_R10, REG_R11,
                                                  REG_R12, REG_R13, REG_R14, REG_R15, REG_RIP};
    ucontext_t *uc = (ucontext_t *)context;
    for (int i = 0; i < CRLM_CFI_REGISTERS; i++) registers[i] = (uint64_t)uc->uc_mcontext.gregs[order[i]];
#else
    (void)context;
#endif
}

/// The registered stack top of thread `tid` when `sp` lies in its registered stack, else 0 (a
/// stale entry of an exited thread whose id was reused fails the check).
static uintptr_t registered_stack_top(pid_t tid, uintptr_t sp) {
    for (int i = 0; i < MAX_THREADS; i++) {
        if (atomic_load_explicit(&g_threads[i].tid, memory_order_acquire) == tid) {
            uintptr_t lo = atomic_load_explicit(&g_threads[i].lo, memory_order_relaxed);
            uintptr_t hi = atomic_load_explicit(&g_threads[i].hi, memory_order_relaxed);
            return (sp == 0 || (sp >= lo && sp < hi)) ? hi : 0;
        }
    }
    return 0;
}

/// Walks the frame-pointer chain, reading only [sp, top): every record must lie above the last.
static int walk_frame_pointers(uintptr_t pc, uintptr_t fp, uintptr_t sp, uintptr_t top, uint64_t *out, int capacity) {
    int n = 0;
    out[n++] = pc;
    while (n < capacity) {
        if (fp < sp || fp > top - 2 * sizeof(uintptr_t) || (fp & (sizeof(uintptr_t) - 1)) != 0) break;
        uintptr_t next = ((uintptr_t *)fp)[0];
        uintptr_t ret = ((uintptr_t *)fp)[1];
        if (ret == 0) break;
        out[n++] = ret;
        if (next <= fp) break;
        fp = next;
    }
    return n;
}

/// glibc backtrace() from inside the handler: drops the handler's own frames, so that the first
/// frame is the interrupted instruction.
static int unwind_backtrace(uintptr_t pc, uint64_t *out, int capacity) {
    static void *buffer[CRLM_MAX_FRAMES + 8];  // static: the handler runs on the target's stack
    int total = backtrace(buffer, capacity + 8 < CRLM_MAX_FRAMES + 8 ? capacity + 8 : CRLM_MAX_FRAMES + 8);
    int start = -1;
    for (int i = 0; i < total && i < 8; i++) {
        if ((uintptr_t)buffer[i] == pc) { start = i; break; }
    }
    int n = 0;
    if (start < 0) {
        // The unwinder did not step through the signal frame onto pc: keep pc, then what it
        // found past the handler and the sigreturn trampoline.
        out[n++] = pc;
        start = total > 2 ? 2 : total;
    }
    for (int i = start; i < total && n < capacity; i++) out[n++] = (uint64_t)(uintptr_t)buffer[i];
    return n;
}

/// The CFI walk, when this build and thread allow it (-1 otherwise).
static int unwind_cfi(void *context, uintptr_t top, uint64_t *out, int capacity) {
    if (!g_cfi_usable || (top == 0 && !g_safe_reads)) return -1;
    uint64_t registers[CRLM_CFI_REGISTERS];
    context_cfi_registers(context, registers);
    return crlm_unwind_cfi(registers, top != 0 ? top : UINTPTR_MAX, out, capacity);
}

/// Unwinds the interrupted context into `out` (the order is in the comment at the top).
static int unwind(void *context, uintptr_t pc, uintptr_t fp, uintptr_t sp, uintptr_t top, uint64_t *out,
                  int capacity, int *method) {
    int n;
    bool in_executable = pc >= g_exe_text_lo && pc < g_exe_text_hi;
    if (top != 0 && atomic_load_explicit(&g_fp_usable, memory_order_relaxed) && in_executable) {
        n = walk_frame_pointers(pc, fp, sp, top, out, capacity);
        *method = CRLM_UNWIND_FRAME_POINTERS;
        if (n >= 3) return n;  // a chain that ends at once: frame pointers not kept after all
    }
    n = unwind_cfi(context, top, out, capacity);
    if (n >= 0) {
        *method = CRLM_UNWIND_TABLES;
        if (n >= 2 || top == 0) return n;
        int chained = walk_frame_pointers(pc, fp, sp, top, g_fp_frames, capacity);
        if (chained > n) {
            memcpy(out, g_fp_frames, (size_t)chained * sizeof(uint64_t));
            *method = CRLM_UNWIND_FRAME_POINTERS;
            return chained;
        }
        return n;
    }
    *method = CRLM_UNWIND_BACKTRACE;
    return unwind_backtrace(pc, out, capacity);
}

static void handler(int sig, siginfo_t *info, void *context) {
    (void)sig; (void)info;
    int saved_errno = errno;
    uint64_t armed = atomic_load_explicit(&g_armed, memory_order_acquire);
    pid_t self = (pid_t)syscall(SYS_gettid);
    if (armed != 0 && (armed & CLAIMED) == 0 && atomic_load_explicit(&g_target, memory_order_relaxed) == self &&
        atomic_compare_exchange_strong_explicit(&g_armed, &armed, armed | CLAIMED, memory_order_acq_rel,
                                                memory_order_relaxed)) {
        uintptr_t pc, fp, sp;
        context_registers(context, &pc, &fp, &sp);
        int capacity = atomic_load_explicit(&g_capacity, memory_order_relaxed);
        uintptr_t top = registered_stack_top(self, sp);
        if (atomic_load_explicit(&g_calibrating, memory_order_relaxed)) {
            // The calibrating thread is interrupted in tgkill, where glibc's tables are right.
            g_count = unwind_backtrace(pc, g_frames, capacity);
            g_fp_count = top != 0 ? walk_frame_pointers(pc, fp, sp, top, g_fp_frames, capacity) : 0;
            g_cfi_count = unwind_cfi(context, top, g_cfi_frames, capacity);
            g_method = CRLM_UNWIND_BACKTRACE;
        } else {
            g_count = unwind(context, pc, fp, sp, top, g_frames, capacity, &g_method);
        }
        atomic_store_explicit(&g_handled_ns, monotonic_ns(), memory_order_relaxed);
        atomic_store_explicit(&g_done, (uint32_t)armed, memory_order_release);
        futex_wake(&g_done);
    }
    errno = saved_errno;
}

static int find_executable_text(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size; (void)data;
    // The first object is the main program.
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
            uintptr_t start = info->dlpi_addr + ph->p_vaddr;
            if (start < lo) lo = start;
            if (start + ph->p_memsz > hi) hi = start + ph->p_memsz;
        }
    }
    if (hi > lo) { g_exe_text_lo = lo; g_exe_text_hi = hi; }
    return 1;
}

// Reading a thread's procfs files must not depend on a free descriptor: a stall matters most when
// the process is out of them (an accept storm fills the table). So `/proc/self/task` stays open
// (relative opens then need no path walk from `/proc`), and the two files the monitor reads at
// every look of a watched thread (`syscall`, `status`) stay open per thread once kept
// (crlm_keep_thread_readable) and are re-read with pread, which needs no new descriptor.
// Each is tied to the process that opened it: after fork() `/proc/self` is another process.
enum { KEPT_THREADS = 64 };
typedef struct { pid_t owner, tid; int syscall_fd, status_fd; } kept_files;
static kept_files g_kept[KEPT_THREADS];
static int g_task_dir = -1;
static pid_t g_task_dir_owner;
static pthread_mutex_t g_files_lock = PTHREAD_MUTEX_INITIALIZER;

/// `/proc/self/task` of this process, opened once (again after a fork); -1 when it cannot be.
/// Under g_files_lock.
static int task_dir_locked(void) {
    pid_t pid = getpid();
    if (g_task_dir >= 0 && g_task_dir_owner == pid) return g_task_dir;
    if (g_task_dir >= 0) close(g_task_dir);
    g_task_dir = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    g_task_dir_owner = pid;
    return g_task_dir;
}

/// Opens `TID/name` relative to the task directory (or by its whole path without one).
static int open_task_file_locked(pid_t tid, const char *name) {
    char path[64];
    int dir = task_dir_locked();
    if (dir >= 0) {
        snprintf(path, sizeof path, "%d/%s", (int)tid, name);
        return openat(dir, path, O_RDONLY | O_CLOEXEC);
    }
    snprintf(path, sizeof path, "/proc/self/task/%d/%s", (int)tid, name);
    return open(path, O_RDONLY | O_CLOEXEC);
}

static kept_files *kept_locked(pid_t tid) {
    pid_t pid = getpid();
    for (int i = 0; i < KEPT_THREADS; i++) {
        if (g_kept[i].tid == tid && g_kept[i].owner == pid) return &g_kept[i];
    }
    return NULL;
}

static void close_kept_locked(kept_files *kept) {
    if (kept->syscall_fd >= 0) close(kept->syscall_fd);
    if (kept->status_fd >= 0) close(kept->status_fd);
    kept->tid = 0;
    kept->owner = 0;
    kept->syscall_fd = kept->status_fd = -1;
}

bool crlm_keep_thread_readable(pid_t tid) {
    pthread_mutex_lock(&g_files_lock);
    (void)task_dir_locked();
    bool kept = kept_locked(tid) != NULL;
    pid_t pid = getpid();
    for (int i = 0; i < KEPT_THREADS && !kept; i++) {
        if (g_kept[i].tid != 0 && g_kept[i].owner == pid) continue;
        if (g_kept[i].tid != 0) close_kept_locked(&g_kept[i]);  // a parent's, before a fork
        int syscall_fd = open_task_file_locked(tid, "syscall");
        int status_fd = syscall_fd >= 0 ? open_task_file_locked(tid, "status") : -1;
        if (status_fd < 0) {
            if (syscall_fd >= 0) close(syscall_fd);
            break;
        }
        g_kept[i] = (kept_files){pid, tid, syscall_fd, status_fd};
        kept = true;
    }
    pthread_mutex_unlock(&g_files_lock);
    return kept;
}

bool crlm_thread_kept_readable(pid_t tid) {
    pthread_mutex_lock(&g_files_lock);
    bool kept = kept_locked(tid) != NULL;
    pthread_mutex_unlock(&g_files_lock);
    return kept;
}

static void forget_thread_files(pid_t tid);
void crlm_release_thread_readable(pid_t tid) { forget_thread_files(tid); }

static void forget_thread_files(pid_t tid) {
    pthread_mutex_lock(&g_files_lock);
    kept_files *kept = kept_locked(tid);
    if (kept != NULL) close_kept_locked(kept);
    pthread_mutex_unlock(&g_files_lock);
}

/// In a child made by fork(): only the forking thread exists, so no capture is in progress
/// whatever the parent was doing; the locks the parent's threads held are made anew.
static void after_fork_in_child(void) {
    atomic_store(&g_armed, 0);
    atomic_store(&g_calibrating, false);
    for (int i = 0; i < MAX_THREADS; i++) atomic_store(&g_threads[i].tid, 0);
    // The parent's kept procfs files describe the parent's threads: closed (close is
    // async-signal-safe), and the lock, which a parent's thread may have held, made anew.
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    memcpy(&g_files_lock, &fresh, sizeof fresh);
    for (int i = 0; i < KEPT_THREADS; i++) {
        if (g_kept[i].tid != 0) close_kept_locked(&g_kept[i]);
    }
    if (g_task_dir >= 0) close(g_task_dir);
    g_task_dir = -1;
    atomic_fetch_add(&g_fork_generation, 1);
}

uint32_t crlm_fork_generation(void) { return atomic_load(&g_fork_generation); }

void crlm_register_atfork(void) {
    static _Atomic bool registered;
    if (!atomic_exchange(&registered, true)) pthread_atfork(NULL, NULL, after_fork_in_child);
}

int crlm_install(int signal_number) {
    if (g_signal != 0) return g_signal == signal_number ? 0 : EBUSY;
    struct sigaction old;
    if (sigaction(signal_number, NULL, &old) != 0) return errno;
    if ((old.sa_flags & SA_SIGINFO) ? old.sa_sigaction != NULL : (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN)) {
        return EBUSY;
    }
    void *warm[4];
    backtrace(warm, 4);  // loads libgcc_s now, not in the handler
#if defined(CRLM_DEFERRED_SIGNALS)
    g_cfi_usable = false;
#else
    g_cfi_usable = crlm_unwind_cfi_supported();
#endif
    g_safe_reads = g_cfi_usable && crlm_safe_reads_available();
    g_parked_usable = crlm_unwind_cfi_supported() && crlm_safe_reads_available();
    crlm_register_atfork();
    pthread_mutex_lock(&g_files_lock);
    (void)task_dir_locked();  // now, while descriptors are free
    pthread_mutex_unlock(&g_files_lock);
    dl_iterate_phdr(find_executable_text, NULL);
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = handler;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    if (sigaction(signal_number, &action, NULL) != 0) return errno;
    g_signal = signal_number;
    return 0;
}

int crlm_signal_number(void) { return g_signal; }

bool crlm_parked_walk_available(void) { return g_parked_usable; }

void crlm_set_frame_pointers_usable(bool usable) {
#if defined(CRLM_DEFERRED_SIGNALS)
    usable = false;  // the context's frame pointer is stale (see CRLM_DEFERRED_SIGNALS)
#endif
    atomic_store(&g_fp_usable, usable);
}

bool crlm_frame_pointers_usable(void) { return atomic_load(&g_fp_usable); }

bool crlm_bounded_unwind_available(bool *for_unregistered_threads) {
    *for_unregistered_threads = g_safe_reads;
    return g_cfi_usable;
}

bool crlm_unblock_signal(void) {
    if (g_signal == 0) return false;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, g_signal);
    return pthread_sigmask(SIG_UNBLOCK, &set, NULL) == 0;
}

bool crlm_register_current_thread(void) {
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) != 0) return false;
    void *address = NULL;
    size_t size = 0;
    int r = pthread_attr_getstack(&attr, &address, &size);
    pthread_attr_destroy(&attr);
    if (r != 0 || address == NULL) return false;
    pid_t self = gettid();
    if (registered_stack_top(self, 0) != 0) return true;
    for (int i = 0; i < MAX_THREADS; i++) {
        pid_t expected = 0;
        // Claimed with a placeholder first so that the bounds are in place before the tid.
        if (atomic_compare_exchange_strong(&g_threads[i].tid, &expected, -1)) {
            atomic_store(&g_threads[i].lo, (uintptr_t)address);
            atomic_store(&g_threads[i].hi, (uintptr_t)address + size);
            atomic_store_explicit(&g_threads[i].tid, self, memory_order_release);
            return true;
        }
    }
    return false;
}

bool crlm_current_thread_registered(void) { return registered_stack_top(gettid(), 0) != 0; }

void crlm_unregister_current_thread(void) { crlm_forget_thread(gettid()); }

void crlm_forget_thread(pid_t self) {
    for (int i = 0; i < MAX_THREADS; i++) {
        if (atomic_load(&g_threads[i].tid) == self) atomic_store(&g_threads[i].tid, 0);
    }
    forget_thread_files(self);
}

/// Whether the capture signal still runs our handler: something may have reset it to SIG_DFL
/// (where a send would kill the process) or installed its own handler since.
static bool handler_in_place(void) {
    struct sigaction current;
    if (sigaction(g_signal, NULL, &current) != 0) return false;
    return (current.sa_flags & SA_SIGINFO) && current.sa_sigaction == handler;
}

/// Reads a small procfs file of thread `tid` into `buffer` (NUL-terminated); the length, or -1
/// with errno: ESRCH or ENOENT when the thread is gone, anything else (EMFILE…) when it is
/// unknown (see ``thread_gone``).
static ssize_t read_task_file(pid_t tid, const char *name, char *buffer, size_t size) {
    pthread_mutex_lock(&g_files_lock);
    kept_files *kept = kept_locked(tid);
    int fd = kept == NULL ? -1 : strcmp(name, "syscall") == 0 ? kept->syscall_fd : strcmp(name, "status") == 0 ? kept->status_fd : -1;
    bool own = fd < 0;
    if (own) fd = open_task_file_locked(tid, name);
    if (fd < 0) {
        int saved = errno;
        pthread_mutex_unlock(&g_files_lock);
        errno = saved;
        return -1;
    }
    size_t length = 0;
    int failure = 0;
    while (length + 1 < size) {
        ssize_t got = pread(fd, buffer + length, size - 1 - length, (off_t)length);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) failure = errno;
        if (got <= 0) break;
        length += (size_t)got;
    }
    if (own) close(fd);
    // A kept file of a thread that exited reads ESRCH; its tid may come back for a new thread.
    if (!own && failure != 0 && length == 0) close_kept_locked(kept);
    pthread_mutex_unlock(&g_files_lock);
    buffer[length] = 0;
    if (failure != 0 && length == 0) {
        errno = failure;
        return -1;
    }
    return (ssize_t)length;
}

/// Whether thread `tid` is gone for certain: its task directory does not exist (access needs no
/// descriptor). A failed read for another reason (no descriptor left) is "unknown", never "gone".
static bool thread_gone(pid_t tid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d", (int)tid);
    return access(path, F_OK) != 0 && (errno == ENOENT || errno == ESRCH);
}

/// The thread's `SigBlk` and `SigPnd` (signals it blocks, signals pending for it alone).
static bool signal_sets(pid_t tid, uint64_t *blocked, uint64_t *pending) {
    char status[4096];
    if (read_task_file(tid, "status", status, sizeof status) < 0) return false;
    const char *b = strstr(status, "\nSigBlk:"), *p = strstr(status, "\nSigPnd:");
    if (b == NULL || p == NULL) return false;
    *blocked = strtoull(b + 8, NULL, 16);
    *pending = strtoull(p + 8, NULL, 16);
    return true;
}

int crlm_thread_signal_state(pid_t tid, int signal_number, bool *blocked, bool *pending) {
    uint64_t blocked_set = 0, pending_set = 0;
    if (!signal_sets(tid, &blocked_set, &pending_set)) {
        int e = errno != 0 ? errno : EIO;
        return thread_gone(tid) ? ENOENT : (e == ENOENT || e == ESRCH ? EIO : e);
    }
    uint64_t bit = (uint64_t)1 << (signal_number - 1);
    *blocked = (blocked_set & bit) != 0;
    *pending = (pending_set & bit) != 0;
    return 0;
}

/// What `/proc/self/task/TID/syscall` says: the thread runs (`running`), or it is parked in the
/// kernel (in system call `number`, or -1 when blocked outside one) with user `sp` and `pc`. The
/// raw text too, to compare two readings. Returns PARKED_READ, PARKED_GONE when the thread does not
/// exist, PARKED_UNREADABLE (errno set) when the file cannot be read (no descriptor left).
typedef struct { bool running; long number; uint64_t sp, pc; char text[256]; } parked_state;
enum { PARKED_READ = 1, PARKED_GONE = 0, PARKED_UNREADABLE = -1 };

static int read_parked_state(pid_t tid, parked_state *state) {
    if (read_task_file(tid, "syscall", state->text, sizeof state->text) < 0) {
        int e = errno;
        if (thread_gone(tid)) return PARKED_GONE;
        errno = e;
        return PARKED_UNREADABLE;
    }
    state->running = strncmp(state->text, "running", 7) == 0;
    state->number = 0;
    state->sp = state->pc = 0;
    if (state->running) return PARKED_READ;
    // "NR a1 a2 a3 a4 a5 a6 sp pc", or "-1 sp pc"
    uint64_t fields[9];
    int count = 0;
    char *cursor = state->text;
    state->number = strtol(cursor, &cursor, 10);
    while (count < 8) {
        char *end;
        uint64_t value = strtoull(cursor, &end, 0);
        if (end == cursor) break;
        fields[count++] = value;
        cursor = end;
    }
    if (count < 2) { state->running = true; return PARKED_READ; }  // unreadable: treat as running
    state->sp = fields[count - 2];
    state->pc = fields[count - 1];
    return PARKED_READ;
}

long crlm_blocked_syscall(pid_t tid, uint64_t *first_argument) {
    parked_state state;
    *first_argument = 0;
    int read = read_parked_state(tid, &state);
    if (read != PARKED_READ) return read == PARKED_GONE ? CRLM_THREAD_GONE : CRLM_THREAD_UNKNOWN;
    if (state.running) return CRLM_THREAD_RUNNING;
    // "NR a1 …": the first argument follows the number.
    char *cursor = state.text;
    strtol(cursor, &cursor, 10);
    *first_argument = strtoull(cursor, NULL, 0);
    return state.number;
}

/// A copy of a parked thread's stack from its sp up, page by page so that the read ends at the
/// first unmapped page (the kernel copies whole iovec elements only).
enum { PARKED_COPY_BYTES = 512 * 1024, PAGE = 4096, PARKED_PAGES = PARKED_COPY_BYTES / PAGE + 1 };
static uint8_t g_parked_copy[PARKED_COPY_BYTES + PAGE];
static struct iovec g_parked_remote[PARKED_PAGES];

static size_t copy_parked_stack(uint64_t sp) {
    uintptr_t address = (uintptr_t)sp, end = address + PARKED_COPY_BYTES;
    int pages = 0;
    while (address < end && pages < PARKED_PAGES) {
        uintptr_t next = (address & ~(uintptr_t)(PAGE - 1)) + PAGE;
        if (next > end) next = end;
        g_parked_remote[pages].iov_base = (void *)address;
        g_parked_remote[pages].iov_len = next - address;
        pages++;
        address = next;
    }
    struct iovec local = {g_parked_copy, end - (uintptr_t)sp};
    long copied = 0;
    // At most IOV_MAX (1024) elements a call: 129 here.
    copied = syscall(SYS_process_vm_readv, (long)getpid(), &local, 1UL, g_parked_remote, (unsigned long)pages, 0UL);
    return copied > 0 ? (size_t)copied : 0;
}

int crlm_capture_parked(pid_t tid, uint64_t *frames, int capacity, int *count, long *syscall_number) {
    *count = 0;
    if (!g_parked_usable) return CRLM_PARKED_UNAVAILABLE;
    if (capacity > CRLM_MAX_FRAMES) capacity = CRLM_MAX_FRAMES;
    parked_state before, after;
    int read = read_parked_state(tid, &before);
    if (read != PARKED_READ) return read == PARKED_GONE ? CRLM_PARKED_NO_THREAD : CRLM_PARKED_UNREADABLE;
    if (before.running) return CRLM_PARKED_RUNNING;
    int64_t cpu_before = crlm_thread_cpu_ns(tid);
    size_t copied = copy_parked_stack(before.sp);
    if (copied < 8) return CRLM_PARKED_RUNNING;  // nothing readable at sp: let the signal tell
    int n = crlm_unwind_parked(before.sp, before.pc, g_parked_copy, (uintptr_t)before.sp, copied, frames, capacity);
    // The thread may have left the kernel while its stack was copied: keep the walk only when it
    // used no CPU meanwhile and is parked at the same place (a thread that ran has CPU time).
    read = read_parked_state(tid, &after);
    if (read != PARKED_READ) return read == PARKED_GONE ? CRLM_PARKED_NO_THREAD : CRLM_PARKED_UNREADABLE;
    if (after.running || strcmp(before.text, after.text) != 0 || crlm_thread_cpu_ns(tid) != cpu_before) {
        return CRLM_PARKED_MOVED;
    }
    *count = n;
    *syscall_number = before.number;
    return CRLM_PARKED_CAPTURED;
}

/// Whether thread `tid` used CPU within about two milliseconds (its CPU clock moved): it runs in
/// user space or is about to, so a signal interrupts no blocking call. Needs no descriptor.
static bool cpu_advances(pid_t tid) {
    int64_t before = crlm_thread_cpu_ns(tid);
    if (before < 0) return false;
    for (int i = 0; i < 20; i++) {
        struct timespec pause = {0, 100000};
        nanosleep(&pause, NULL);
        int64_t now = crlm_thread_cpu_ns(tid);
        if (now < 0) return false;
        if (now != before) return true;
    }
    return false;
}

int crlm_capture(pid_t tid, int64_t timeout_ns, int64_t resend_ns, uint64_t *frames, int capacity,
                 int *count, int *method, int *error) {
    *count = 0;
    *error = 0;
    if (g_signal == 0) return CRLM_NOT_INSTALLED;
    if (capacity > CRLM_MAX_FRAMES) capacity = CRLM_MAX_FRAMES;
    pid_t self = gettid();
    if (tid != self) {
        // A thread parked in the kernel is read where it is, never signalled: a signal would end
        // its sleep, poll or wait early (EINTR).
        for (int attempt = 0; attempt < 3; attempt++) {
            long number = 0;
            int parked = crlm_capture_parked(tid, frames, capacity, count, &number);
            if (parked == CRLM_PARKED_CAPTURED) {
                *method = CRLM_UNWIND_PARKED;
                return CRLM_CAPTURED;
            }
            if (parked == CRLM_PARKED_NO_THREAD) { *error = ESRCH; return CRLM_NO_SUCH_THREAD; }
            if (parked == CRLM_PARKED_UNREADABLE) {
                // Where the thread is cannot be read (no descriptor left): a signal is sent only
                // to a thread seen running, since one blocked in the kernel would see its call
                // return EINTR.
                int e = errno;
                if (!cpu_advances(tid)) {
                    if (thread_gone(tid)) { *error = ESRCH; return CRLM_NO_SUCH_THREAD; }
                    *error = e;
                    return CRLM_UNREADABLE;
                }
                break;
            }
            if (parked != CRLM_PARKED_MOVED) break;
        }
    }
    uint64_t seq = ++g_seq;
    atomic_store_explicit(&g_target, tid, memory_order_relaxed);
    atomic_store_explicit(&g_capacity, capacity, memory_order_relaxed);
    atomic_store_explicit(&g_armed, seq, memory_order_release);
    int64_t start = monotonic_ns();
    int64_t next_send = start;
    bool sent = false;
    pid_t pid = getpid();
    for (;;) {
        uint32_t done = atomic_load_explicit(&g_done, memory_order_acquire);
        if (done == (uint32_t)seq) break;
        int64_t now = monotonic_ns();
        if (now - start >= timeout_ns) {
            uint64_t expected = seq;
            if (atomic_compare_exchange_strong(&g_armed, &expected, 0)) return CRLM_NO_ANSWER;
            // The handler claimed it: it is unwinding and finishes without blocking.
            futex_wait(&g_done, done, 1000000);
            continue;
        }
        if (now >= next_send) {
            next_send = now + resend_ns;
            if (!handler_in_place()) {
                uint64_t expected = seq;
                if (atomic_compare_exchange_strong(&g_armed, &expected, 0)) return CRLM_HANDLER_REPLACED;
                continue;
            }
            if (tid != self) {
                // At most one of our signals pending per thread, and none sent to a thread that
                // blocks it (it would stay queued, and a stalled loop would pile them up against
                // the user's RLIMIT_SIGPENDING): wait for the pending one, or for an unblock.
                bool blocked = false, pending = false;
                int state = crlm_thread_signal_state(tid, g_signal, &blocked, &pending);
                if (state == ENOENT) {
                    uint64_t expected = seq;
                    if (atomic_compare_exchange_strong(&g_armed, &expected, 0)) {
                        *error = ESRCH;
                        return CRLM_NO_SUCH_THREAD;
                    }
                    continue;
                }
                if (state == 0 && (blocked || pending)) {
                    if (!sent && !pending) next_send = now + (resend_ns < 1000000 ? resend_ns : 1000000);
                    goto wait;
                }
                // Parked since the first look: read it there instead of interrupting it.
                parked_state parked;
                if (!sent && g_parked_usable && read_parked_state(tid, &parked) == PARKED_READ && !parked.running) {
                    uint64_t expected = seq;
                    if (atomic_compare_exchange_strong(&g_armed, &expected, 0)) {
                        long number = 0;
                        if (crlm_capture_parked(tid, frames, capacity, count, &number) == CRLM_PARKED_CAPTURED) {
                            *method = CRLM_UNWIND_PARKED;
                            return CRLM_CAPTURED;
                        }
                        atomic_store_explicit(&g_armed, seq, memory_order_release);
                    }
                }
            }
            if (!sent) atomic_store_explicit(&g_sent_ns, monotonic_ns(), memory_order_relaxed);  // after the checks: signal to handler only
            sent = true;
            if (syscall(SYS_tgkill, pid, tid, g_signal) != 0) {
                int e = errno;
                uint64_t expected = seq;
                if (atomic_compare_exchange_strong(&g_armed, &expected, 0)) {
                    *error = e;
                    return e == ESRCH ? CRLM_NO_SUCH_THREAD : CRLM_SEND_FAILED;
                }
                continue;  // claimed meanwhile by an earlier signal's handler: wait for it
            }
        }
    wait:;
        int64_t wait = next_send - now;
        if (start + timeout_ns - now < wait) wait = start + timeout_ns - now;
        futex_wait(&g_done, done, wait);
    }
    int n = g_count < capacity ? g_count : capacity;
    memcpy(frames, g_frames, (size_t)n * sizeof(uint64_t));
    *count = n;
    *method = g_method;
    g_last_latency_ns = atomic_load(&g_handled_ns) - atomic_load(&g_sent_ns);
    atomic_store_explicit(&g_armed, 0, memory_order_release);
    return CRLM_CAPTURED;
}

bool crlm_calibrate(uint64_t *bt, int *bt_count, uint64_t *fp, int *fp_count, uint64_t *cfi, int *cfi_count,
                    int capacity) {
    *bt_count = 0;
    *fp_count = 0;
    *cfi_count = 0;
    if (g_signal == 0) return false;
    pid_t self = gettid();
    if (registered_stack_top(self, 0) == 0) return false;
    // The calling thread may block every signal (libdispatch's and Swift concurrency's threads
    // do): unblocked for this capture only.
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, g_signal);
    pthread_sigmask(SIG_UNBLOCK, &set, &old);
    atomic_store(&g_calibrating, true);
    uint64_t frames[CRLM_MAX_FRAMES];
    int count = 0, method = 0, error = 0;
    int r = crlm_capture(self, 200000000LL, 50000000LL, frames, capacity, &count, &method, &error);
    atomic_store(&g_calibrating, false);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (r != CRLM_CAPTURED) return false;
    if (capacity > CRLM_MAX_FRAMES) capacity = CRLM_MAX_FRAMES;
    memcpy(bt, frames, (size_t)count * sizeof(uint64_t));
    *bt_count = count;
    int n = g_fp_count < capacity ? g_fp_count : capacity;
    memcpy(fp, g_fp_frames, (size_t)n * sizeof(uint64_t));
    *fp_count = n;
    n = g_cfi_count < capacity ? g_cfi_count : capacity;
    if (n > 0) memcpy(cfi, g_cfi_frames, (size_t)n * sizeof(uint64_t));
    *cfi_count = n > 0 ? n : 0;
    return true;
}

int64_t crlm_thread_cpu_ns(pid_t tid) {
    clockid_t clock = (clockid_t)(((unsigned)~tid << 3) | 6);  // CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED
    struct timespec ts;
    if (clock_gettime(clock, &ts) != 0) return -1;
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

pid_t crlm_gettid(void) { return gettid(); }

int64_t crlm_last_capture_latency_ns(void) { return g_last_latency_ns; }

#include <dlfcn.h>
#include <stdlib.h>

bool crlm_dladdr(uint64_t address, char *image, size_t image_size, uint64_t *image_base, char *symbol,
                 size_t symbol_size, uint64_t *symbol_address) {
    Dl_info info;
    memset(&info, 0, sizeof info);
    if (dladdr((void *)(uintptr_t)address, &info) == 0) return false;
    snprintf(image, image_size, "%s", info.dli_fname ? info.dli_fname : "");
    *image_base = (uint64_t)(uintptr_t)info.dli_fbase;
    snprintf(symbol, symbol_size, "%s", info.dli_sname ? info.dli_sname : "");
    *symbol_address = (uint64_t)(uintptr_t)info.dli_saddr;
    return true;
}

// Exported by libswiftCore, which every Swift program links.
extern char *swift_demangle(const char *mangled, size_t length, char *out, size_t *out_size, uint32_t flags);

bool crlm_demangle(const char *name, char *out, size_t out_size) {
    char *demangled = swift_demangle(name, strlen(name), NULL, NULL, 0);
    if (demangled == NULL) return false;
    snprintf(out, out_size, "%s", demangled);
    free(demangled);
    return true;
}

int crlm_default_signal(void) { return SIGRTMIN + 7 <= SIGRTMAX ? SIGRTMIN + 7 : SIGRTMAX; }

void crlm_set_thread_name(const char *name) {
    char truncated[16];
    snprintf(truncated, sizeof truncated, "%s", name);
    pthread_setname_np(pthread_self(), truncated);
}
