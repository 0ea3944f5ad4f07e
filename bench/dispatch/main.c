#include "vm.h"
int64_t run(Frame *f);
int main(int argc, char **argv) {
  Frame f = {0}; f.consts = consts; f.locals[2] = argc > 1 ? atoll(argv[1]) : 10000000;
  printf("%lld\n", (long long)run(&f));
  return 0;
}
