#include "vm.h"
__attribute__((noinline)) int64_t run(Frame *f) {
  const Inst *ip = code; int64_t *sp = f->stack; int64_t a, b;
  for (;;) {
    Inst in = *ip++;
    switch (in.op) {
    case LOAD_FAST: *sp++ = f->locals[in.arg]; break;
    case LOAD_CONST: *sp++ = f->consts[in.arg]; break;
    case ADD: b = *--sp; a = sp[-1]; if (__builtin_add_overflow(a, b, &sp[-1])) abort(); break;
    case MUL: b = *--sp; a = sp[-1]; if (__builtin_mul_overflow(a, b, &sp[-1])) abort(); break;
    case MOD: b = *--sp; a = sp[-1]; if (!b) abort(); sp[-1] = a % b; break;
    case LT: b = *--sp; a = sp[-1]; sp[-1] = a < b; break;
    case JUMP_IF_FALSE: if (!*--sp) ip = code + in.arg; break;
    case STORE_FAST: f->locals[in.arg] = *--sp; break;
    case JUMP: ip = code + in.arg; break;
    case NOP1: f->locals[7] += 1; break;
    case NOP2: f->locals[6] ^= f->locals[7]; break;
    case RETURN: return *--sp;
    default: abort();
    }
  }
}
