// Three functions that differ only in the instruction a uprobe at their entry replaces, called in
// a loop: what a uprobe hit costs by how the kernel gets past that instruction.
//   push: `push %rbp`, as the CUDA libraries' functions begin; the kernel emulates it.
//   nop5: a 5-byte nop; kernels with optimized uprobes (x86, 6.18's arch_uprobe_optimize) rewrite
//         it, after its first hit, into a call to a trampoline that enters by system call.
//   mov:  `mov %edi,%eax`, which the kernel single-steps out of line (a second trap).
//   trap_kinds CALLS ROUNDS   -> a JSON line per kind and round: {"kind", "ns_per_call"}, then
//                               whether the process has the kernel's uprobe trampoline mapped.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int trap_kind_push(int x);
int trap_kind_nop5(int x);
int trap_kind_mov(int x);
asm(R"(
  .text
  .globl trap_kind_push
  .type trap_kind_push, @function
trap_kind_push:
  push %rbp
  mov %rsp, %rbp
  mov %edi, %eax
  and $1, %eax
  pop %rbp
  ret
  .size trap_kind_push, .-trap_kind_push
  .globl trap_kind_nop5
  .type trap_kind_nop5, @function
trap_kind_nop5:
  .byte 0x0f, 0x1f, 0x44, 0x00, 0x00
  mov %edi, %eax
  and $1, %eax
  ret
  .size trap_kind_nop5, .-trap_kind_nop5
  .globl trap_kind_mov
  .type trap_kind_mov, @function
trap_kind_mov:
  mov %edi, %eax
  and $1, %eax
  ret
  .size trap_kind_mov, .-trap_kind_mov
  .section .note.GNU-stack,"",@progbits
  .text
)");

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: trap_kinds CALLS ROUNDS\n");
    return 2;
  }
  const long calls = atol(argv[1]);
  const int rounds = atoi(argv[2]);
  struct { const char* name; int (*fn)(int); } kinds[] = {
      {"push", trap_kind_push}, {"nop5", trap_kind_nop5}, {"mov", trap_kind_mov}};
  volatile int sink = 0;
  for (int r = 0; r < rounds; ++r)
    for (unsigned k = 0; k < sizeof kinds / sizeof kinds[0]; ++k) {
      // The single-stepped kind costs ~30x the others: a tenth of the calls keeps rounds short.
      const long n = strcmp(kinds[k].name, "mov") == 0 ? calls / 10 : calls;
      const double t0 = now_ns();
      for (long i = 0; i < n; ++i) sink += kinds[k].fn((int)i);
      printf("{\"kind\": \"%s\", \"round\": %d, \"ns_per_call\": %.1f}\n", kinds[k].name, r,
             (now_ns() - t0) / n);
    }
  int trampoline = 0;
  FILE* maps = fopen("/proc/self/maps", "r");
  char line[512];
  while (maps && fgets(line, sizeof line, maps))
    if (strstr(line, "[uprobes-trampoline]")) trampoline = 1;
  if (maps) fclose(maps);
  printf("{\"uprobes_trampoline_mapped\": %s}\n", trampoline ? "true" : "false");
  return sink == 42;
}
