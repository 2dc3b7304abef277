// How a preloaded library puts itself between a CUDA program and some of the driver's entry
// points (launch_hooks.cpp: launches; pin/preload.cpp: copies). The runtime (static or shared),
// cuBLAS, cuDNN and PyTorch get the driver's entry points from cuGetProcAddress, which they find
// with dlsym on libcuda.so.1: the library defines dlsym (GS_DLSYM_TRAMPOLINE), answers for
// cuGetProcAddress with its own (ProcAddress), and that hands out wrappers (Slots) for the entry
// points it wants. Header-only: each library keeps its own copy (hidden symbols).
#pragma once

#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <cstring>

namespace gpuscope::inject {

using DlsymFn = void* (*)(void*, const char*);
using GetProcAddressV2Fn = int (*)(const char*, void**, int, uint64_t, int*);
using GetProcAddressFn = int (*)(const char*, void**, int, uint64_t);
constexpr int kDriverNotFound = 500;  // CUDA_ERROR_NOT_FOUND

// The dlsym after this library's (its own is the one the program calls): another preloaded
// library's stand-in where there is one (record's launch hooks and the pin library both stand in,
// each handing on to the next), else the C library's. dlvsym finds the C library's by its version;
// a stand-in has none (dlvsym skips it), so the C library's is then asked for the next one.
inline DlsymFn next_dlsym() {
  DlsymFn libc = nullptr;
  for (const char* v : {"GLIBC_2.34", "GLIBC_2.2.5"})
    if (void* p = dlvsym(RTLD_NEXT, "dlsym", v)) {
      libc = reinterpret_cast<DlsymFn>(p);
      break;
    }
  if (!libc) return nullptr;
  // Called from here, RTLD_NEXT means after this library.
  if (void* p = libc(RTLD_NEXT, "dlsym")) return reinterpret_cast<DlsymFn>(p);
  return libc;
}

// Whether `address` is in the library that holds `anchor` (one of its own functions).
inline bool in_library_of(const void* anchor, const void* address) {
  Dl_info mine{}, theirs{};
  return dladdr(anchor, &mine) && dladdr(address, &theirs) && mine.dli_fbase == theirs.dli_fbase;
}

// Up to N real addresses of one entry point, each served by its own wrapper (cuGetProcAddress may
// hand out a version per CUDA version and default-stream flavour asked for).
template <int N>
struct Slots {
  void* wrappers[N] = {};              // filled at load
  std::atomic<void*> real[N] = {};     // slot S's wrapper calls real[S]
  // The wrapper for `address`: the slot that serves it, or a free one claimed for it (`claim(S)`
  // runs first, to fill what the library keeps beside the slot); `address` itself when all N
  // serve other addresses.
  template <typename Claim>
  void* wrapper_for(void* address, Claim claim) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;  // lookups are few: a library's start-up
    pthread_mutex_lock(&mu);
    void* out = address;
    for (int s = 0; s < N; ++s) {
      void* had = real[s].load(std::memory_order_relaxed);
      if (had && had != address) continue;
      if (!had) {
        claim(s);
        real[s].store(address, std::memory_order_release);
      }
      out = wrappers[s];
      break;
    }
    pthread_mutex_unlock(&mu);
    return out;
  }
};

// The library's cuGetProcAddress (both versions): the driver's answer, passed to `after`, which
// swaps the entry points the library wraps; asked for itself, it hands out itself. Tag: one set
// of statics per library.
template <typename Tag>
struct ProcAddress {
  static inline GetProcAddressV2Fn real_v2 = nullptr;
  static inline GetProcAddressFn real_v1 = nullptr;
  static inline DlsymFn real_dlsym = nullptr;
  static inline void* libcuda = nullptr;
  static inline int (*after)(int result, const char* symbol, void** pfn) = nullptr;

  static int v2(const char* symbol, void** pfn, int version, uint64_t flags, int* status) {
    if (!real_v2) return kDriverNotFound;
    return finish(real_v2(symbol, pfn, version, flags, status), symbol, pfn);
  }
  static int v1(const char* symbol, void** pfn, int version, uint64_t flags) {
    if (!real_v1) return kDriverNotFound;
    return finish(real_v1(symbol, pfn, version, flags), symbol, pfn);
  }
  static int finish(int r, const char* symbol, void** pfn) {
    if (r != 0 || !pfn || !*pfn || !symbol) return r;
    if (!std::strcmp(symbol, "cuGetProcAddress")) {
      // Asked through itself: the version handed out depends on the CUDA version asked for.
      if (!real_v2 && libcuda && real_dlsym && *pfn == real_dlsym(libcuda, "cuGetProcAddress_v2"))
        real_v2 = reinterpret_cast<GetProcAddressV2Fn>(*pfn);
      if (*pfn == reinterpret_cast<void*>(real_v2)) *pfn = reinterpret_cast<void*>(&v2);
      else if (*pfn == reinterpret_cast<void*>(real_v1)) *pfn = reinterpret_cast<void*>(&v1);
      return r;
    }
    return after ? after(r, symbol, pfn) : r;
  }
  // For dlsym(handle, name): the stand-in when name is cuGetProcAddress or cuGetProcAddress_v2
  // (the driver's kept), else nullptr.
  static void* for_dlsym(void* handle, const char* name) {
    const bool is_v2 = !std::strcmp(name, "cuGetProcAddress_v2");
    if (!is_v2 && std::strcmp(name, "cuGetProcAddress")) return nullptr;
    void* real = real_dlsym ? real_dlsym(handle, name) : nullptr;
    if (!real) return nullptr;
    if (is_v2) {
      real_v2 = reinterpret_cast<GetProcAddressV2Fn>(real);
      return reinterpret_cast<void*>(&v2);
    }
    real_v1 = reinterpret_cast<GetProcAddressFn>(real);
    return reinterpret_cast<void*>(&v1);
  }
};

}  // namespace gpuscope::inject

// dlsym, in assembly so that the C library's runs with the caller's return address (dlsym(RTLD_NEXT)
// finds the symbol after the object that called it, which a C wrapper would make the library).
// FILTER(handle, name) returns the address to hand out instead, or null to let REAL (a pointer to
// the C library's dlsym) answer.
#define GS_DLSYM_TRAMPOLINE(FILTER, REAL) \
  __asm__(".text\n"                      \
          ".globl dlsym\n"               \
          ".type dlsym, @function\n"     \
          "dlsym:\n"                     \
          ".cfi_startproc\n"             \
          "push %rdi\n"                  \
          ".cfi_adjust_cfa_offset 8\n"   \
          "push %rsi\n"                  \
          ".cfi_adjust_cfa_offset 8\n"   \
          "sub $8, %rsp\n"               \
          ".cfi_adjust_cfa_offset 8\n"   \
          "call " #FILTER "\n"           \
          "add $8, %rsp\n"               \
          ".cfi_adjust_cfa_offset -8\n"  \
          "pop %rsi\n"                   \
          ".cfi_adjust_cfa_offset -8\n"  \
          "pop %rdi\n"                   \
          ".cfi_adjust_cfa_offset -8\n"  \
          "test %rax, %rax\n"            \
          "jnz 1f\n"                     \
          "mov " #REAL "(%rip), %rax\n"  \
          "test %rax, %rax\n"            \
          "jz 1f\n"                      \
          "jmp *%rax\n"                  \
          "1:\n"                         \
          "ret\n"                        \
          ".cfi_endproc\n"               \
          ".size dlsym, .-dlsym\n")
