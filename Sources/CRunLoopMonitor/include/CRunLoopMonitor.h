#ifndef C_RUNLOOPMONITOR_H
#define C_RUNLOOPMONITOR_H

#include <stdint.h>
#include <stdbool.h>
#include <sys/types.h>
#include <sys/syscall.h>

/// Most return addresses one capture keeps.
#define CRLM_MAX_FRAMES 128

/// How a capture was unwound.
enum {
    CRLM_UNWIND_BACKTRACE = 1,      ///< glibc backtrace(): libgcc's walk of the unwind tables (the fallback)
    CRLM_UNWIND_FRAME_POINTERS = 2, ///< the frame-pointer chain (registered thread, calibrated image)
    CRLM_UNWIND_TABLES = 3,         ///< the bounded walk of the DWARF unwind tables (no frame pointers needed)
    CRLM_UNWIND_PARKED = 4          ///< a thread parked in the kernel, walked from its sp and pc without a signal
};

/// Outcomes of ``crlm_capture``.
enum {
    CRLM_CAPTURED = 0,
    CRLM_NO_SUCH_THREAD = 1,  ///< tgkill said ESRCH
    CRLM_NO_ANSWER = 2,       ///< the handler did not run within the bound (signal blocked, thread stuck in the kernel with the signal pending, or exited)
    CRLM_NOT_INSTALLED = 3,   ///< crlm_install was not called or failed
    CRLM_SEND_FAILED = 4,     ///< tgkill failed otherwise (errno in *error)
    CRLM_HANDLER_REPLACED = 5, ///< the signal no longer runs our handler (reset to SIG_DFL, or another handler installed): nothing was sent
    CRLM_UNREADABLE = 6       ///< where the thread is cannot be read (errno in *error: EMFILE, no descriptor left) and it is not running: nothing was sent
};

/// Outcomes of ``crlm_capture_parked``.
enum {
    CRLM_PARKED_CAPTURED = 0,
    CRLM_PARKED_RUNNING = 1,      ///< the thread runs (a signal is needed to read it)
    CRLM_PARKED_MOVED = 2,        ///< it left the kernel while it was read: the walk was dropped
    CRLM_PARKED_NO_THREAD = 3,
    CRLM_PARKED_UNAVAILABLE = 4,  ///< no bounded walk here (not x86-64, or process_vm_readv forbidden)
    CRLM_PARKED_UNREADABLE = 5    ///< its syscall file cannot be read (errno set; EMFILE: no descriptor left), though the thread exists
};
/// Keeps thread `tid`'s `syscall` and `status` files open (up to 64 threads), so that reading
/// where it is needs no new descriptor, even when the process has none left. Returns whether they
/// are kept. Dropped by ``crlm_forget_thread`` and when a read says the thread is gone.
bool crlm_keep_thread_readable(pid_t tid);
/// Closes the files ``crlm_keep_thread_readable`` keeps for thread `tid` (it is no longer watched).
void crlm_release_thread_readable(pid_t tid);
/// Whether ``crlm_keep_thread_readable`` keeps thread `tid`'s files.
bool crlm_thread_kept_readable(pid_t tid);

/// Reads the stack of thread `tid` while it is parked in the kernel (blocked in a system call, or
/// stopped), without a signal: its user sp and pc from `/proc/self/task/TID/syscall`, a copy of
/// its stack from sp up (process_vm_readv), then the bounded CFI walk from those two registers;
/// a frame-pointer frame whose rbp is unknown is found by stack scanning (a return address after
/// a call instruction into that function). Re-reads the syscall file and the thread's CPU clock
/// afterwards and drops the walk if either changed. Not async-signal-safe; serialized with
/// ``crlm_capture`` by the caller. `*syscall_number` is the call (-1: parked outside one).
int crlm_capture_parked(pid_t tid, uint64_t *frames, int capacity, int *count, long *syscall_number);

enum { CRLM_THREAD_GONE = -2, CRLM_THREAD_RUNNING = -3, CRLM_THREAD_UNKNOWN = -4 };

/// The system call thread `tid` is blocked in now (`/proc/self/task/TID/syscall`): its number
/// (and its first argument in `*first_argument`), -1 when it is parked outside one,
/// CRLM_THREAD_RUNNING while it runs, CRLM_THREAD_GONE when the thread does not exist,
/// CRLM_THREAD_UNKNOWN when the file cannot be read (no descriptor left, no such file in this
/// kernel). Not async-signal-safe (it opens a file).
long crlm_blocked_syscall(pid_t tid, uint64_t *first_argument);

/// Whether ``crlm_capture_parked`` can work here (after ``crlm_install``).
bool crlm_parked_walk_available(void);

/// Whether thread `tid` blocks `signal_number`, and whether one is pending for it (its `SigBlk`
/// and `SigPnd`). Returns 0, or an errno (ENOENT: no such thread).
int crlm_thread_signal_state(pid_t tid, int signal_number, bool *blocked, bool *pending);

/// Counts the fork() children this process image has been (incremented in the child by a
/// pthread_atfork handler, registered by ``crlm_register_atfork``): a lock's owner compares it to
/// make its state anew in a child whose parent held the lock at the fork.
uint32_t crlm_fork_generation(void);

/// Registers the fork handler once (``crlm_install`` does it too).
void crlm_register_atfork(void);

/// Unwinds a thread parked in the kernel from its `sp` and `pc` alone over `copy`, a copy of its
/// stack memory [copy_base, copy_base + copy_length). See ``crlm_capture_parked``.
int crlm_unwind_parked(uint64_t sp, uint64_t pc, const uint8_t *copy, uintptr_t copy_base, size_t copy_length,
                       uint64_t *out, int capacity);

/// The start of the function that holds `pc` (its unwind-table entry), or 0 when no table covers
/// it: what identifies a frame's function without symbolicating it.
uint64_t crlm_function_start(uint64_t pc);

/// Installs the capture signal's handler (`signal_number`, a real-time signal) once per process,
/// warms up glibc's unwinder (its first call loads libgcc_s, which must not happen in a handler)
/// and records the main executable's text range. Returns 0, or an errno: EBUSY when another
/// handler is installed for the signal, or sigaction's error. Not async-signal-safe; serialized
/// by the caller.
int crlm_install(int signal_number);

/// The signal ``crlm_install`` installed, or 0.
int crlm_signal_number(void);

/// Marks the main executable as compiled with frame pointers (found by calibration): captures
/// whose interrupted instruction is in it, on a registered thread, then walk the frame-pointer
/// chain instead of calling backtrace().
void crlm_set_frame_pointers_usable(bool usable);

/// Whether ``crlm_set_frame_pointers_usable`` said so.
bool crlm_frame_pointers_usable(void);

/// Records the calling thread's stack bounds (pthread_getattr_np), which the frame-pointer walk
/// needs to read only mapped memory. Returns false when the table is full or the bounds are
/// unknown; the thread's captures then use backtrace(). Not async-signal-safe.
bool crlm_register_current_thread(void);

/// Whether the calling thread's bounds are registered.
bool crlm_current_thread_registered(void);

/// Forgets the calling thread's bounds (call before it exits; a tid may be reused).
void crlm_unregister_current_thread(void);

/// Forgets thread `tid`'s bounds (it exited).
void crlm_forget_thread(pid_t tid);

/// Unblocks the capture signal for the calling thread (threads made by libdispatch's workers,
/// Swift concurrency's threads, or anything they spawn, start with every signal blocked).
bool crlm_unblock_signal(void);

/// Captures thread `tid`'s stack. A thread parked in the kernel is read without a signal
/// (``crlm_capture_parked``); a running one is signalled (only when it neither blocks the signal
/// nor has one of ours pending, and only while the handler is still ours) and waited for up to `timeout_ns` (re-sending every
/// `resend_ns`: glibc blocks signals briefly, e.g. inside pthread_create) for its handler to
/// write the return addresses. On CRLM_CAPTURED, `frames[0]` is the interrupted instruction and
/// the others return addresses, `*count` frames in all (at most `capacity`), `*method` says how
/// they were unwound. Captures are serialized by the caller (one at a time per process). A
/// capture of the calling thread works too (the handler runs before tgkill returns).
int crlm_capture(pid_t tid, int64_t timeout_ns, int64_t resend_ns, uint64_t *frames, int capacity,
                 int *count, int *method, int *error);

/// The calibration capture: the calling thread raises the signal and the handler unwinds it
/// every way (backtrace() into `bt`, the frame-pointer chain into `fp`, the bounded CFI walk into
/// `cfi`; a count of 0 where a way is unavailable). The caller compares them. Returns false when
/// not installed or the thread is not registered.
bool crlm_calibrate(uint64_t *bt, int *bt_count, uint64_t *fp, int *fp_count, uint64_t *cfi, int *cfi_count,
                    int capacity);

/// Whether captures walk the unwind tables with the bounded CFI walk (x86-64, glibc 2.35+), and
/// whether threads without registered bounds get it too (process_vm_readv allowed). Valid after
/// ``crlm_install``.
bool crlm_bounded_unwind_available(bool *for_unregistered_threads);

/// The CPU time thread `tid` of this process has used (its CLOCK_THREAD_CPUTIME clock), in
/// nanoseconds, or -1 (errno set) when the thread is gone.
int64_t crlm_thread_cpu_ns(pid_t tid);

/// The calling thread's kernel id.
pid_t crlm_gettid(void);

/// Times for the benchmark: nanoseconds from the capture's signal to the handler's end, for the
/// last successful capture (CLOCK_MONOTONIC).
int64_t crlm_last_capture_latency_ns(void);

/// dladdr(3) for `address` (outside a handler): the containing image's path and load base, and
/// the nearest dynamic symbol's (mangled) name and address when there is one. Returns false when
/// no image contains the address.
bool crlm_dladdr(uint64_t address, char *image, size_t image_size, uint64_t *image_base, char *symbol,
                 size_t symbol_size, uint64_t *symbol_address);

/// `name` demangled by the Swift runtime (`swift_demangle`), written to `out`; false when it is
/// not a Swift name.
bool crlm_demangle(const char *name, char *out, size_t out_size);

/// The signal captures use unless told otherwise: SIGRTMIN + 7 (a real-time signal: queued, never
/// merged with the application's, unused by glibc, libdispatch and the Swift runtime).
int crlm_default_signal(void);

/// Names the calling thread (the first 15 characters of `name`).
void crlm_set_thread_name(const char *name);

/// The register file the CFI walk starts from, in DWARF numbering (x86-64: rax rdx rcx rbx rsi
/// rdi rbp rsp r8-r15, then the interrupted pc in slot 16).
#define CRLM_CFI_REGISTERS 17

/// Unwinds from `registers` (an interrupted context) with the loaded objects' .eh_frame tables,
/// reading the stack only within [registers[sp], stack_top); a `stack_top` of UINTPTR_MAX (bounds
/// unknown) reads through process_vm_readv, which fails instead of faulting. Writes the interrupted pc, then
/// return addresses, into `out`; returns how many (0 where unsupported). Async-signal-safe.
int crlm_unwind_cfi(const uint64_t registers[CRLM_CFI_REGISTERS], uintptr_t stack_top, uint64_t *out,
                    int capacity);

/// Whether this build has the CFI walk (x86-64 with glibc 2.35 or later).
bool crlm_unwind_cfi_supported(void);

/// Whether the kernel lets this process read its own memory with process_vm_readv (a seccomp
/// filter may forbid it): the CFI walk of a thread without registered bounds needs it.
bool crlm_safe_reads_available(void);

/// The numbers of the system calls an idle epoll-based event loop waits in, from this
/// architecture's <sys/syscall.h> (Swift does not import it): epoll_wait, epoll_pwait and
/// epoll_pwait2; -1 for one the architecture (or these headers) lacks.
static inline long crlm_sys_epoll_wait(void) {
#ifdef SYS_epoll_wait
    return SYS_epoll_wait;
#else
    return -1;
#endif
}
static inline long crlm_sys_epoll_pwait(void) {
#ifdef SYS_epoll_pwait
    return SYS_epoll_pwait;
#else
    return -1;
#endif
}
static inline long crlm_sys_epoll_pwait2(void) {
#ifdef SYS_epoll_pwait2
    return SYS_epoll_pwait2;
#else
    return -1;
#endif
}

#endif
