// A DWARF call-frame unwinder for the capture handler that never reads outside the interrupted
// thread's stack.
//
// Why not only glibc backtrace(): libgcc's unwinder trusts the unwind tables at every
// instruction. Where they are wrong (compiler-rt's ASan runtime, interrupted between two pops
// that LLVM emits without CFI, says CFA = rsp+96 where it is rsp+88), it reads a wrong return
// address, follows another function's rules with garbage registers and faults. A profiler
// interrupts code at any instruction, so it must survive wrong tables: here every stack read is
// checked against the thread's registered bounds, every frame's CFA must lie above the last, and
// the unwind stops at the first rule it does not know (CFA expressions are evaluated when they
// only compute from registers, as PLT stubs' do). Tables are found with _dl_find_object
// (glibc 2.35+, async-signal-safe, lock-free) and its .eh_frame_hdr search table.
//
// Async-signal-safe: no allocation, no lock, no errno change; reads only the loaded objects'
// unwind sections and [sp, top) of the stack.
#define _GNU_SOURCE
#include "CRunLoopMonitor.h"
#include <dlfcn.h>
#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#if defined(__x86_64__) && defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))

// DWARF register numbers (System V x86-64 psABI): rax rdx rcx rbx rsi rdi rbp rsp r8..r15, then
// the return-address column 16.
enum { SP_REGISTER = 7, RA_COLUMN = 16, REGISTERS = 17 };
// Registers a callee preserves (rbx, rbp, r12-r15): an unspecified rule means "same value".
static const uint32_t CALLEE_SAVED = (1u << 3) | (1u << 6) | (1u << 12) | (1u << 13) | (1u << 14) | (1u << 15);

/// AT_SP_OFFSET: saved at the frame's own rsp plus `value` (a `breg7 N` expression rule, as in
/// glibc's signal trampoline, whose registers lie in the signal frame).
enum rule_kind { UNSPECIFIED, SAME_VALUE, UNDEFINED, AT_OFFSET, VALUE_OFFSET, IN_REGISTER, EXPRESSION, AT_SP_OFFSET };

typedef struct { uint8_t kind; int64_t value; } rule;

typedef struct {
    rule registers[REGISTERS];
    uint64_t cfa_register;
    int64_t cfa_offset;
    bool cfa_is_expression;
    const uint8_t *cfa_expression;  // with cfa_is_expression: the DWARF expression and its length
    uint64_t cfa_expression_length;
} row;

/// A read position inside one record of the unwind sections, never past `end`.
typedef struct { const uint8_t *p, *end; bool bad; } cursor;

static bool take(cursor *c, size_t n) {
    if (c->bad || (size_t)(c->end - c->p) < n) { c->bad = true; return false; }
    return true;
}

static uint64_t u8(cursor *c) { if (!take(c, 1)) return 0; return *c->p++; }
static uint64_t u16(cursor *c) { uint16_t v = 0; if (take(c, 2)) { memcpy(&v, c->p, 2); c->p += 2; } return v; }
static uint64_t u32(cursor *c) { uint32_t v = 0; if (take(c, 4)) { memcpy(&v, c->p, 4); c->p += 4; } return v; }
static uint64_t u64(cursor *c) { uint64_t v = 0; if (take(c, 8)) { memcpy(&v, c->p, 8); c->p += 8; } return v; }

static uint64_t uleb(cursor *c) {
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
        uint64_t byte = u8(c);
        v |= (byte & 0x7f) << shift;
        if ((byte & 0x80) == 0) return v;
    }
    c->bad = true;
    return 0;
}

static int64_t sleb(cursor *c) {
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
        uint64_t byte = u8(c);
        v |= (byte & 0x7f) << shift;
        if ((byte & 0x80) == 0) {
            if (shift + 7 < 64 && (byte & 0x40)) v |= ~(uint64_t)0 << (shift + 7);
            return (int64_t)v;
        }
    }
    c->bad = true;
    return 0;
}

/// A DW_EH_PE-encoded pointer. Only the encodings compilers emit for .eh_frame are known:
/// absolute or pc-relative, and data-relative for the search table (base `data`).
static uint64_t encoded(cursor *c, uint8_t encoding, uintptr_t data) {
    if (encoding == 0xff) return 0;  // DW_EH_PE_omit
    uintptr_t field = (uintptr_t)c->p;
    uint64_t v;
    switch (encoding & 0x0f) {
    case 0x00: v = u64(c); break;                         // absptr
    case 0x01: v = uleb(c); break;                        // uleb128
    case 0x02: v = u16(c); break;                         // udata2
    case 0x03: v = u32(c); break;                         // udata4
    case 0x04: v = u64(c); break;                         // udata8
    case 0x09: v = (uint64_t)sleb(c); break;              // sleb128
    case 0x0a: v = (uint64_t)(int64_t)(int16_t)u16(c); break;  // sdata2
    case 0x0b: v = (uint64_t)(int64_t)(int32_t)u32(c); break;  // sdata4
    case 0x0c: v = u64(c); break;                         // sdata8
    default: c->bad = true; return 0;
    }
    switch (encoding & 0x70) {
    case 0x00: break;                  // absolute
    case 0x10: v += field; break;      // pcrel
    case 0x30: v += data; break;       // datarel
    default: c->bad = true; return 0;  // textrel, funcrel, aligned: not used on x86-64 Linux
    }
    // DW_EH_PE_indirect (0x80) only appears for personality routines, which are skipped unread.
    return v;
}

/// What the unwinder needs from a CIE.
typedef struct {
    const uint8_t *instructions, *end;
    uint64_t code_alignment;
    int64_t data_alignment;
    uint64_t return_column;
    uint8_t fde_encoding;
    bool augmented;  // 'z': the FDE has an augmentation-data length to skip
    bool signal_frame;  // 'S': a signal trampoline; its caller's pc is the interrupted instruction
} cie_info;

static bool parse_cie(const uint8_t *record, cie_info *cie) {
    uint32_t length;
    memcpy(&length, record, 4);
    if (length == 0 || length == 0xffffffffu) return false;  // 64-bit DWARF is not emitted for .eh_frame
    cursor c = {record + 4, record + 4 + length, false};
    if (u32(&c) != 0) return false;  // not a CIE
    uint64_t version = u8(&c);
    if (version != 1 && version != 3) return false;
    const char *augmentation = (const char *)c.p;
    size_t length_of_augmentation = 0;
    while (take(&c, 1) && *c.p != 0) { c.p++; length_of_augmentation++; }
    if (!take(&c, 1)) return false;
    c.p++;
    cie->code_alignment = uleb(&c);
    cie->data_alignment = sleb(&c);
    cie->return_column = version == 1 ? u8(&c) : uleb(&c);
    cie->fde_encoding = 0;  // absptr
    cie->augmented = length_of_augmentation > 0 && augmentation[0] == 'z';
    cie->signal_frame = false;
    if (length_of_augmentation > 0 && !cie->augmented) return false;  // e.g. "eh": unknown layout
    if (cie->augmented) {
        uint64_t data_length = uleb(&c);
        const uint8_t *data_end = c.p + data_length;
        if (c.bad || data_end > c.end) return false;
        for (size_t i = 1; i < length_of_augmentation; i++) {
            char letter = augmentation[i];
            if (letter == 'R') {
                cie->fde_encoding = (uint8_t)u8(&c);
            } else if (letter == 'P') {
                uint8_t personality_encoding = (uint8_t)u8(&c);
                (void)encoded(&c, personality_encoding & 0x7f, 0);
            } else if (letter == 'L') {
                (void)u8(&c);
            } else if (letter == 'S') {
                cie->signal_frame = true;
            } else if (letter == 'B') {
                // A signal frame or an AArch64 key: nothing to read.
            } else {
                break;  // the data length lets the rest be skipped
            }
        }
        c.p = data_end;
    }
    if (c.bad) return false;
    cie->instructions = c.p;
    cie->end = c.end;
    return true;
}

/// The FDE of `pc` through the object's .eh_frame_hdr binary-search table, with its CIE, its
/// first address and its instructions.
static bool find_fde(uintptr_t pc, cie_info *cie, uintptr_t *start, uintptr_t *end, cursor *instructions) {
    struct dl_find_object object;
    if (_dl_find_object((void *)pc, &object) != 0 || object.dlfo_eh_frame == NULL) return false;
    const uint8_t *header = (const uint8_t *)object.dlfo_eh_frame;
    // version 1; eh_frame_ptr encoding; fde_count encoding; table encoding
    if (header[0] != 1 || header[3] != 0x3b) return false;  // table: datarel | sdata4
    cursor c = {header + 4, header + 4 + 16, false};
    (void)encoded(&c, header[1], (uintptr_t)header);
    uint64_t count = encoded(&c, header[2], (uintptr_t)header);
    if (c.bad || count == 0 || count > (1u << 26)) return false;
    const int32_t *table = (const int32_t *)(const void *)c.p;
    uint64_t lo = 0, hi = count;  // the last entry whose start is <= pc
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if ((uintptr_t)header + (intptr_t)table[2 * mid] <= pc) lo = mid; else hi = mid;
    }
    if ((uintptr_t)header + (intptr_t)table[2 * lo] > pc) return false;
    const uint8_t *fde = header + (intptr_t)table[2 * lo + 1];
    uint32_t length;
    memcpy(&length, fde, 4);
    if (length == 0 || length == 0xffffffffu) return false;
    cursor f = {fde + 4, fde + 4 + length, false};
    uint32_t cie_offset = (uint32_t)u32(&f);
    if (cie_offset == 0) return false;  // a CIE, not an FDE
    if (!parse_cie(fde + 4 - cie_offset, cie)) return false;
    uintptr_t begin = (uintptr_t)encoded(&f, cie->fde_encoding, 0);
    uint64_t range = encoded(&f, cie->fde_encoding & 0x0f, 0);
    if (cie->augmented) {
        uint64_t skip = uleb(&f);
        if (!take(&f, skip)) return false;
        f.p += skip;
    }
    if (f.bad || pc < begin || pc - begin >= range) return false;
    *start = begin;
    *end = begin + range;
    *instructions = f;
    return true;
}

enum { REMEMBERED_ROWS = 8 };

/// Runs call-frame instructions up to `target` (the row in force there). `initial` is the row
/// after the CIE's instructions (DW_CFA_restore's reference); NULL while running those.
static bool execute(cursor *c, const cie_info *cie, uintptr_t location, uintptr_t target, row *state,
                    const row *initial) {
    // Static, not on the stack: a capture may run on a thread with little stack left (its
    // handler runs there), and walks are serialized (one capture at a time per process).
    static row remembered[REMEMBERED_ROWS];
    int depth = 0;
    while (c->p < c->end && !c->bad) {
        uint8_t op = (uint8_t)u8(c);
        uint64_t reg = op & 0x3f;
        int64_t offset;
        switch (op & 0xc0) {
        case 0x40:  // advance_loc
            location += reg * cie->code_alignment;
            if (location > target) return true;
            continue;
        case 0x80:  // offset
            offset = (int64_t)uleb(c) * cie->data_alignment;
            if (reg < REGISTERS) state->registers[reg] = (rule){AT_OFFSET, offset};
            continue;
        case 0xc0:  // restore
            if (initial == NULL) return false;
            if (reg < REGISTERS) state->registers[reg] = initial->registers[reg];
            continue;
        }
        uint64_t delta, other;
        switch (op) {
        case 0x00: break;  // nop
        case 0x01:         // set_loc
            location = (uintptr_t)encoded(c, cie->fde_encoding, 0);
            if (location > target) return true;
            break;
        case 0x02: case 0x03: case 0x04:  // advance_loc1/2/4
            delta = op == 0x02 ? u8(c) : op == 0x03 ? u16(c) : u32(c);
            location += delta * cie->code_alignment;
            if (location > target) return true;
            break;
        case 0x05: case 0x11: case 0x14: case 0x15: case 0x2f:
            // offset_extended, offset_extended_sf, val_offset, val_offset_sf, GNU_negative_offset_extended
            reg = uleb(c);
            if (op == 0x11 || op == 0x15) offset = sleb(c) * cie->data_alignment;
            else if (op == 0x2f) offset = -(int64_t)uleb(c) * cie->data_alignment;
            else offset = (int64_t)uleb(c) * cie->data_alignment;
            if (reg < REGISTERS)
                state->registers[reg] = (rule){(op == 0x14 || op == 0x15) ? VALUE_OFFSET : AT_OFFSET, offset};
            break;
        case 0x06:  // restore_extended
            reg = uleb(c);
            if (initial == NULL) return false;
            if (reg < REGISTERS) state->registers[reg] = initial->registers[reg];
            break;
        case 0x07: case 0x08:  // undefined, same_value
            reg = uleb(c);
            if (reg < REGISTERS) state->registers[reg] = (rule){op == 0x07 ? UNDEFINED : SAME_VALUE, 0};
            break;
        case 0x09:  // register
            reg = uleb(c);
            other = uleb(c);
            if (reg < REGISTERS) state->registers[reg] = (rule){IN_REGISTER, (int64_t)other};
            break;
        case 0x0a:  // remember_state
            if (depth == REMEMBERED_ROWS) return false;
            remembered[depth++] = *state;
            break;
        case 0x0b:  // restore_state
            if (depth == 0) return false;
            *state = remembered[--depth];
            break;
        case 0x0c:  // def_cfa
            state->cfa_register = uleb(c);
            state->cfa_offset = (int64_t)uleb(c);
            state->cfa_is_expression = false;
            break;
        case 0x0d:  // def_cfa_register
            state->cfa_register = uleb(c);
            state->cfa_is_expression = false;
            break;
        case 0x0e:  // def_cfa_offset
            state->cfa_offset = (int64_t)uleb(c);
            break;
        case 0x0f:  // def_cfa_expression (PLT stubs): evaluated by cfa_from_expression
            delta = uleb(c);
            if (!take(c, delta)) return false;
            state->cfa_expression = c->p;
            state->cfa_expression_length = delta;
            c->p += delta;
            state->cfa_is_expression = true;
            break;
        case 0x10: case 0x16:  // expression, val_expression
            reg = uleb(c);
            delta = uleb(c);
            if (!take(c, delta)) return false;
            {
                // `breg7 N` alone (an address: rsp + N) is understood; any other expression is not.
                cursor e = {c->p, c->p + delta, false};
                rule understood = {EXPRESSION, 0};
                if (op == 0x10 && delta >= 2 && u8(&e) == 0x77) {
                    int64_t offset = sleb(&e);
                    if (!e.bad && e.p == e.end) understood = (rule){AT_SP_OFFSET, offset};
                }
                if (reg < REGISTERS) state->registers[reg] = understood;
            }
            c->p += delta;
            break;
        case 0x12:  // def_cfa_sf
            state->cfa_register = uleb(c);
            state->cfa_offset = sleb(c) * cie->data_alignment;
            state->cfa_is_expression = false;
            break;
        case 0x13:  // def_cfa_offset_sf
            state->cfa_offset = sleb(c) * cie->data_alignment;
            break;
        case 0x2e:  // GNU_args_size
            (void)uleb(c);
            break;
        default:
            return false;
        }
    }
    return !c->bad;
}

/// Where the walk reads the stack: the thread's own memory within [lo, hi); with no known top (hi
/// is UINTPTR_MAX: a thread that registered no bounds) through the kernel, so that an unmapped
/// address is an error instead of a fault; or a copy of [lo, hi) taken earlier (`copy`), for a
/// thread parked in the kernel that is walked from another thread.
typedef struct { uintptr_t lo, hi; const uint8_t *copy; } stack_view;

static bool read_word(const stack_view *view, uintptr_t address, uint64_t *out) {
    if (address < view->lo || address > view->hi - sizeof(uint64_t) || (address & (sizeof(uint64_t) - 1)) != 0) return false;
    if (view->copy != NULL) {
        memcpy(out, view->copy + (address - view->lo), sizeof *out);
        return true;
    }
    if (view->hi != UINTPTR_MAX) {
        *out = *(const uint64_t *)address;
        return true;
    }
    struct iovec local = {out, sizeof *out}, remote = {(void *)address, sizeof *out};
    // flags is a full-width zero: syscall() is variadic, and an int would leave the register's
    // upper half (or the stack slot) undefined, which the kernel rejects with EINVAL.
    return syscall(SYS_process_vm_readv, (long)getpid(), &local, 1UL, &remote, 1UL, 0UL) == (long)sizeof *out;
}

/// Evaluates a CFA expression made of register values, constants, arithmetic and reads of the
/// stack: what compilers and linkers emit for PLT stubs (`breg7 8; breg16 0; lit15; and; lit11;
/// ge; lit3; shl; plus`: the CFA moves by 8 after the stub's push), and what glibc's signal
/// trampoline says (`breg7 160; deref`: the interrupted rsp, saved in the signal frame). A read
/// is checked like every other stack read; any other operation is refused (false): the walk ends
/// there.
static bool cfa_from_expression(const row *state, const uint64_t *values, uint32_t known, uintptr_t pc,
                                const stack_view *view, uintptr_t *cfa) {
    cursor c = {state->cfa_expression, state->cfa_expression + state->cfa_expression_length, false};
    uint64_t stack[8];
    int depth = 0;
    while (c.p < c.end && !c.bad) {
        uint8_t op = (uint8_t)u8(&c);
        if (op >= 0x30 && op <= 0x4f) {  // lit0..lit31
            if (depth == 8) return false;
            stack[depth++] = op - 0x30;
        } else if (op >= 0x70 && op <= 0x8f) {  // breg0..breg31
            uint64_t reg = op - 0x70;
            int64_t offset = sleb(&c);
            uint64_t value;
            if (reg == RA_COLUMN) value = pc;  // rip: the frame's pc
            else if (reg < RA_COLUMN && (known & (1u << reg))) value = values[reg];
            else return false;
            if (depth == 8) return false;
            stack[depth++] = value + (uint64_t)offset;
        } else if (op == 0x10 || op == 0x11) {  // constu, consts
            if (depth == 8) return false;
            stack[depth++] = op == 0x10 ? uleb(&c) : (uint64_t)sleb(&c);
        } else if (op == 0x23) {  // plus_uconst
            if (depth < 1) return false;
            stack[depth - 1] += uleb(&c);
        } else if (op == 0x06) {  // deref
            if (depth < 1 || !read_word(view, (uintptr_t)stack[depth - 1], &stack[depth - 1])) return false;
        } else {
            if (depth < 2) return false;
            uint64_t b = stack[--depth], a = stack[depth - 1];
            switch (op) {
            case 0x1a: a &= b; break;                       // and
            case 0x1c: a -= b; break;                       // minus
            case 0x21: a |= b; break;                       // or
            case 0x22: a += b; break;                       // plus
            case 0x24: a = b < 64 ? a << b : 0; break;      // shl
            case 0x25: a = b < 64 ? a >> b : 0; break;      // shr
            case 0x2a: a = (int64_t)a >= (int64_t)b; break; // ge
            default: return false;
            }
            stack[depth - 1] = a;
        }
    }
    if (c.bad || depth < 1) return false;
    *cfa = (uintptr_t)stack[depth - 1];
    return true;
}

static bool stack_word(uintptr_t address, uintptr_t lo, uintptr_t hi, uint64_t *out) {
    stack_view view = {lo, hi, NULL};
    return read_word(&view, address, out);
}

/// Whether the bytes before `ra` hold a call instruction that ends at `ra` (x86-64 encodings: a
/// direct `call rel32`, or `call r/m64` in any addressing form, with an optional REX prefix), all
/// within the function [function_start, ra) so that every byte read is mapped code. A direct call
/// must target `callee_start` when it is given (non-zero).
static bool preceded_by_call(uintptr_t ra, uintptr_t function_start, uintptr_t callee_start) {
    if (ra >= function_start + 5 && *(const uint8_t *)(ra - 5) == 0xe8) {
        int32_t relative;
        memcpy(&relative, (const void *)(ra - 4), 4);
        if (callee_start == 0 || ra + (intptr_t)relative == callee_start) return true;
    }
    for (uintptr_t length = 2; length <= 7; length++) {
        if (ra < function_start + length) break;
        const uint8_t *op = (const uint8_t *)(ra - length);
        if (op[0] != 0xff) continue;
        uint8_t modrm = op[1], mod = modrm >> 6, rm = modrm & 7;
        if (((modrm >> 3) & 7) != 2) continue;  // /2: call
        uintptr_t expected;
        if (mod == 3) expected = 2;
        else if (mod == 0) expected = rm == 4 ? 3 : rm == 5 ? 6 : 2;
        else if (mod == 1) expected = rm == 4 ? 4 : 3;
        else expected = rm == 4 ? 7 : 6;
        if (mod == 0 && rm == 4 && length >= 3 && (op[2] & 7) == 5) expected += 4;  // SIB, no base: disp32
        if (expected == length) return true;
    }
    return false;
}

/// How far above a frame's stack pointer ``recover_frame_base`` looks for the frame's return
/// address: a frame's locals rarely pass this.
enum { SCAN_LIMIT = 64 * 1024 };

/// Finds the frame base (the rbp value) of a frame-pointer frame when rbp is unknown, as crash
/// reporters' stack scanning does: the lowest slot X at or above `sp` whose next word is a return
/// address preceded by a call (into this function, for a direct call) in another function that
/// has unwind tables, and whose own word is a plausible saved frame pointer (0, or above X). A
/// return address into the frame's own function is a leftover of a call it made, not its caller.
static bool recover_frame_base(const stack_view *view, uintptr_t sp, uintptr_t function_start,
                               uintptr_t function_end, uintptr_t *base) {
    uintptr_t limit = sp + SCAN_LIMIT < view->hi ? sp + SCAN_LIMIT : view->hi;
    for (uintptr_t slot = (sp + 7) & ~(uintptr_t)7; slot + 16 <= limit; slot += 8) {
        uint64_t saved, ra;
        if (!read_word(view, slot + 8, &ra) || !read_word(view, slot, &saved)) return false;
        if (ra >= function_start && ra < function_end) continue;
        if (saved != 0 && (saved <= slot || saved >= view->hi)) continue;
        cie_info cie;
        uintptr_t caller_start, caller_end;
        cursor unused;
        if (ra < 2 || !find_fde((uintptr_t)ra - 1, &cie, &caller_start, &caller_end, &unused)) continue;
        if (!preceded_by_call((uintptr_t)ra, caller_start, function_start)) continue;
        *base = slot;
        return true;
    }
    return false;
}

/// The CFI walk. `known` says which of `registers` hold values (a signal's context gives them
/// all; a thread parked in the kernel gives only sp and pc); with `scan`, a frame whose CFA rule
/// needs an unknown rbp gets it from ``recover_frame_base``.
static int unwind_core(const uint64_t registers[CRLM_CFI_REGISTERS], uint32_t known, const stack_view *view,
                       bool scan, uint64_t *out, int capacity) {
    uint64_t values[REGISTERS];
    memcpy(values, registers, sizeof values);
    known &= (1u << RA_COLUMN) - 1;  // the RA column is no register
    uintptr_t pc = (uintptr_t)registers[RA_COLUMN];
    uintptr_t lo = (uintptr_t)registers[SP_REGISTER];
    uintptr_t stack_top = view->hi;
    if (capacity <= 0 || lo == 0 || lo >= stack_top || lo < view->lo) return 0;
    int n = 0;
    out[n++] = pc;
    for (bool interrupted = true; n < capacity;) {
        // A return address points after the call, which may be the next function's first byte:
        // look it up one byte back. The interrupted instruction itself is exact.
        uintptr_t lookup = interrupted ? pc : pc - 1;
        cie_info cie;
        uintptr_t start, function_end;
        cursor fde;
        if (!find_fde(lookup, &cie, &start, &function_end, &fde)) break;
        // Static, like execute's remembered rows: off the stack of a thread that may have little.
        static row state, initial;
        memset(&state, 0, sizeof state);
        cursor initial_instructions = {cie.instructions, cie.end, false};
        if (!execute(&initial_instructions, &cie, 0, UINTPTR_MAX, &state, NULL)) break;
        initial = state;
        if (!execute(&fde, &cie, start, lookup, &state, &initial)) break;
        if (cie.return_column >= REGISTERS) break;
        uintptr_t cfa;
        if (state.cfa_is_expression) {
            if (!cfa_from_expression(&state, values, known, pc, view, &cfa)) break;
        } else {
            if (state.cfa_register >= REGISTERS) break;
            if ((known & (1u << state.cfa_register)) == 0) {
                uintptr_t base;
                // Only the frame-pointer frame's rule (CFA = rbp + 16, rbp saved at CFA - 16) is
                // recovered: its layout tells where the return address and the saved rbp lie.
                if (!scan || state.cfa_register != 6 || state.cfa_offset != 16 ||
                    state.registers[6].kind != AT_OFFSET || state.registers[6].value != -16 ||
                    !recover_frame_base(view, (uintptr_t)values[SP_REGISTER], start, function_end, &base))
                    break;
                values[6] = base;
                known |= 1u << 6;
            }
            cfa = (uintptr_t)((int64_t)values[state.cfa_register] + state.cfa_offset);
        }
        uintptr_t sp = (uintptr_t)values[SP_REGISTER];
        // Frames are laid out upwards: a CFA at or below the last frame's, or off the stack, means
        // the tables were wrong here (or the stack is corrupt).
        if (cfa <= sp || cfa > stack_top) break;
        rule ra_rule = state.registers[cie.return_column];
        uint64_t ra;
        if (ra_rule.kind == UNDEFINED) break;  // the outermost frame (_start, clone)
        uintptr_t ra_address = ra_rule.kind == AT_OFFSET      ? cfa + (uintptr_t)ra_rule.value
                               : ra_rule.kind == AT_SP_OFFSET ? (uintptr_t)values[SP_REGISTER] + (uintptr_t)ra_rule.value
                                                              : 0;
        if (ra_address == 0 || !read_word(view, ra_address, &ra)) break;
        uint64_t next[REGISTERS];
        uint32_t next_known = 0;
        bool consistent = true;
        for (int r = 0; r < REGISTERS && consistent; r++) {
            rule rr = state.registers[r];
            switch (rr.kind) {
            case UNSPECIFIED:
            case SAME_VALUE:
                if ((rr.kind == SAME_VALUE || (CALLEE_SAVED & (1u << r))) && (known & (1u << r))) {
                    next[r] = values[r];
                    next_known |= 1u << r;
                }
                break;
            case AT_OFFSET:
                if (read_word(view, cfa + (uintptr_t)rr.value, &next[r])) next_known |= 1u << r;
                else consistent = false;  // a register saved off the stack: wrong tables
                break;
            case AT_SP_OFFSET:
                if (read_word(view, (uintptr_t)values[SP_REGISTER] + (uintptr_t)rr.value, &next[r])) next_known |= 1u << r;
                else consistent = false;
                break;
            case VALUE_OFFSET:
                next[r] = cfa + (uintptr_t)rr.value;
                next_known |= 1u << r;
                break;
            case IN_REGISTER:
                if (rr.value >= 0 && rr.value < REGISTERS && (known & (1u << rr.value))) {
                    next[r] = values[rr.value];
                    next_known |= 1u << r;
                }
                break;
            default:
                break;
            }
        }
        if (!consistent || ra == 0) break;
        next[SP_REGISTER] = cfa;
        next_known |= 1u << SP_REGISTER;
        memcpy(values, next, sizeof values);
        known = next_known & ((1u << RA_COLUMN) - 1);
        pc = (uintptr_t)ra;
        out[n++] = ra;
        // Past a signal trampoline the pc is the interrupted instruction itself, not a return
        // address: looked up as it is.
        interrupted = cie.signal_frame;
    }
    return n;
}

int crlm_unwind_cfi(const uint64_t registers[CRLM_CFI_REGISTERS], uintptr_t stack_top, uint64_t *out,
                    int capacity) {
    stack_view view = {(uintptr_t)registers[SP_REGISTER], stack_top, NULL};
    return unwind_core(registers, (1u << RA_COLUMN) - 1, &view, false, out, capacity);
}

int crlm_unwind_parked(uint64_t sp, uint64_t pc, const uint8_t *copy, uintptr_t copy_base, size_t copy_length,
                       uint64_t *out, int capacity) {
    uint64_t registers[CRLM_CFI_REGISTERS];
    memset(registers, 0, sizeof registers);
    registers[SP_REGISTER] = sp;
    registers[RA_COLUMN] = pc;
    stack_view view = {copy_base, copy_base + copy_length, copy};
    return unwind_core(registers, 1u << SP_REGISTER, &view, true, out, capacity);
}

bool crlm_unwind_cfi_supported(void) { return true; }

uint64_t crlm_function_start(uint64_t pc) {
    cie_info cie;
    uintptr_t start, end;
    cursor unused;
    return find_fde((uintptr_t)pc, &cie, &start, &end, &unused) ? start : 0;
}

bool crlm_safe_reads_available(void) {
    uint64_t probe = 0x5afe, copy = 0;
    int saved = errno;
    bool mapped = stack_word((uintptr_t)&probe, 0, UINTPTR_MAX, &copy) && copy == probe;
    bool unmapped = !stack_word(8, 0, UINTPTR_MAX, &copy);
    errno = saved;
    return mapped && unmapped;
}

#else

int crlm_unwind_cfi(const uint64_t registers[CRLM_CFI_REGISTERS], uintptr_t stack_top, uint64_t *out,
                    int capacity) {
    (void)registers; (void)stack_top; (void)out; (void)capacity;
    return 0;
}

int crlm_unwind_parked(uint64_t sp, uint64_t pc, const uint8_t *copy, uintptr_t copy_base, size_t copy_length,
                       uint64_t *out, int capacity) {
    (void)sp; (void)pc; (void)copy; (void)copy_base; (void)copy_length; (void)out; (void)capacity;
    return 0;
}

bool crlm_unwind_cfi_supported(void) { return false; }

uint64_t crlm_function_start(uint64_t pc) { (void)pc; return 0; }

bool crlm_safe_reads_available(void) { return false; }

#endif
