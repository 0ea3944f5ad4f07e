#include "vm.h"
/* Six parameters, as CPython's tail-calling handlers pass (frame, stack pointer, thread state,
   next instruction, table, oparg). */
struct TS { int64_t ret; };
typedef int64_t (*Handler)(Frame *f, int64_t *sp, struct TS *ts, const Inst *ip, const void *table, int oparg);
#define PARAMS Frame *f, int64_t *sp, struct TS *ts, const Inst *ip, const void *table, int oparg
#define DISPATCH() do { Inst in = *ip++; __attribute__((musttail)) return ((const Handler *)table)[in.op](f, sp, ts, ip, table, in.arg); } while (0)
static int64_t op_load_fast(PARAMS) { *sp++ = f->locals[oparg]; DISPATCH(); }
static int64_t op_load_const(PARAMS) { *sp++ = f->consts[oparg]; DISPATCH(); }
static int64_t op_add(PARAMS) { int64_t b = *--sp, a = sp[-1]; if (__builtin_add_overflow(a, b, &sp[-1])) abort(); DISPATCH(); }
static int64_t op_mul(PARAMS) { int64_t b = *--sp, a = sp[-1]; if (__builtin_mul_overflow(a, b, &sp[-1])) abort(); DISPATCH(); }
static int64_t op_mod(PARAMS) { int64_t b = *--sp, a = sp[-1]; if (!b) abort(); sp[-1] = a % b; DISPATCH(); }
static int64_t op_lt(PARAMS) { int64_t b = *--sp, a = sp[-1]; sp[-1] = a < b; DISPATCH(); }
static int64_t op_jif(PARAMS) { if (!*--sp) ip = code + oparg; DISPATCH(); }
static int64_t op_store_fast(PARAMS) { f->locals[oparg] = *--sp; DISPATCH(); }
static int64_t op_jump(PARAMS) { ip = code + oparg; DISPATCH(); }
static int64_t op_nop1(PARAMS) { f->locals[7] += 1; DISPATCH(); }
static int64_t op_nop2(PARAMS) { f->locals[6] ^= f->locals[7]; DISPATCH(); }
static int64_t op_return(PARAMS) { return *--sp; }
static const Handler handlers[] = { op_load_fast, op_load_const, op_add, op_mul, op_mod, op_lt,
  op_jif, op_store_fast, op_jump, op_return, op_nop1, op_nop2 };
__attribute__((noinline)) int64_t run(Frame *f) {
  static struct TS tsv; const Inst *ip = code + 1;
  return op_load_const(f, f->stack, &tsv, ip, handlers, code[0].arg);
}
