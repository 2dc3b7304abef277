// A function that does nothing, for gpuscope to probe: the preloaded libraries call it to hand
// something over with the caller's stack (launch_hooks.cpp's gpuscope_launch_stack, heap_hooks.cpp's
// gpuscope_heap_alloc and gpuscope_heap_free). It begins with push %rbp, as CUDA's entry points
// do (an emulated instruction for uprobes), not with the 5-byte nop that kernel 6.18 turns into a
// call to a trampoline page: a forked child inherits that call but not the page, and died of
// SIGSEGV at its first launch with a stack (dev VM, 2026-11-27). Each has its own body: no two
// share an address.
#pragma once

#define GS_PROBE_MARKER(name, body)              \
  __asm__(".text\n"                              \
          ".globl " #name "\n"                   \
          ".type " #name ", @function\n"         \
          #name ":\n"                            \
          ".cfi_startproc\n"                     \
          "push %rbp\n"                          \
          ".cfi_adjust_cfa_offset 8\n"           \
          ".cfi_offset %rbp, -16\n"              \
          "mov %rsp, %rbp\n" body                \
          "pop %rbp\n"                           \
          ".cfi_adjust_cfa_offset -8\n"          \
          ".cfi_restore %rbp\n"                  \
          "ret\n"                                \
          ".cfi_endproc\n"                       \
          ".size " #name ", .-" #name "\n")
