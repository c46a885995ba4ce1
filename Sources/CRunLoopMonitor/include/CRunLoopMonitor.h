#ifndef C_RUNLOOPMONITOR_H
#define C_RUNLOOPMONITOR_H

#include <stdint.h>
#include <stdbool.h>
#include <sys/types.h>

/// Most return addresses one capture keeps.
#define CRLM_MAX_FRAMES 128

/// How a capture was unwound.
enum {
    CRLM_UNWIND_BACKTRACE = 1,      ///< glibc backtrace(): libgcc's walk of the unwind tables (the fallback)
    CRLM_UNWIND_FRAME_POINTERS = 2, ///< the frame-pointer chain (registered thread, calibrated image)
    CRLM_UNWIND_TABLES = 3          ///< the bounded walk of the DWARF unwind tables (no frame pointers needed)
};

/// Outcomes of ``crlm_capture``.
enum {
    CRLM_CAPTURED = 0,
    CRLM_NO_SUCH_THREAD = 1,  ///< tgkill said ESRCH
    CRLM_NO_ANSWER = 2,       ///< the handler did not run within the bound (signal blocked, thread stuck in the kernel with the signal pending, or exited)
    CRLM_NOT_INSTALLED = 3,   ///< crlm_install was not called or failed
    CRLM_SEND_FAILED = 4      ///< tgkill failed otherwise (errno in *error)
};

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

/// Captures thread `tid`'s stack: signals it and waits up to `timeout_ns` (re-sending every
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

#endif
