/* A toy bytecode interpreter, to compare two dispatch styles on WebAssembly (run.py builds and
   times it): switch.c is a loop around a switch, as CPython's default interpreter on wasm
   (no computed gotos); tail.c has one function per instruction ending in a guaranteed tail
   call through a table, as CPython's tail-calling interpreter. The program: */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
enum { LOAD_FAST, LOAD_CONST, ADD, MUL, MOD, LT, JUMP_IF_FALSE, STORE_FAST, JUMP, RETURN, NOP1, NOP2 };
typedef struct { uint8_t op; uint8_t arg; } Inst;
typedef struct { int64_t locals[8]; const int64_t *consts; int64_t stack[16]; } Frame;
/* i = 0; s = 0; while i < n: s = (s + i * 3) % 1000003; i = i + 1; return s */
static const Inst code[] = {
  {LOAD_CONST, 0}, {STORE_FAST, 0},            /* i = 0 */
  {LOAD_CONST, 0}, {STORE_FAST, 1},            /* s = 0 */
  {LOAD_FAST, 0}, {LOAD_FAST, 2}, {LT, 0}, {JUMP_IF_FALSE, 23},   /* 4: while i < n */
  {LOAD_FAST, 1}, {LOAD_FAST, 0}, {LOAD_CONST, 1}, {MUL, 0}, {ADD, 0},
  {LOAD_CONST, 2}, {MOD, 0}, {STORE_FAST, 1},
  {LOAD_FAST, 0}, {LOAD_CONST, 3}, {ADD, 0}, {STORE_FAST, 0},
  {NOP1, 0}, {NOP2, 0}, {JUMP, 4},
  {LOAD_FAST, 1}, {RETURN, 0},
};
static const int64_t consts[] = {0, 3, 1000003, 1};
