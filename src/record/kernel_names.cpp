#include "record/kernel_names.h"

#include <sys/uio.h>

#include <cstring>
#include <fstream>

#include "cuda/functions.h"
#include "elf/elf_file.h"

namespace gpuscope::record {

void KernelNames::name_call(CallEvent& e) {
  if (!e.name_addr) return;
  const auto* f = cuda::function_by_id(e.func);
  if (lazy_registrations_ && f && f->sig == cuda::Signature::RegisterFunction) {
    e.name.clear();  // the Tracker keeps name_addr, read at the kernel's first launch
    return;
  }
  e.name = read_name(e.pid, e.name_addr, e.name);
  if (e.name.empty()) ++unread_;
}

std::string KernelNames::read_name(uint32_t pid, uint64_t addr, const std::string& partial) {
  char buf[4096] = {};
  iovec local{buf, sizeof(buf) - 1}, remote{reinterpret_cast<void*>(addr), sizeof(buf) - 1};
  // Names in read-only data may sit at the end of a mapping; a short read is fine.
  if (process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0) <= 0) {
    // The process is gone: the name is in its file, where the mapping says.
    auto m = maps_.resolve(pid, addr);
    if (!m) return partial;
    std::ifstream in(symbolize::openable_path(pid, m->path), std::ios::binary);  // as in BuildIds::of
    in.seekg(static_cast<std::streamoff>(m->file_offset));
    in.read(buf, sizeof(buf) - 1);
  }
  std::string name(buf, strnlen(buf, sizeof(buf)));
  return name.size() >= partial.size() ? name : partial;
}

int64_t KernelNames::kernel_id(const CallEvent& e, const decode::Tracker& tracker) {
  const auto* f = cuda::function_by_id(e.func);
  auto& ids = ids_[e.pid];
  const uint64_t key = e.kernel_handle ^ (uint64_t(f->api) << 63);  // handles are user addresses: bit 63 is free
  auto cached = ids.find(key);
  if (cached != ids.end() && cached->second) return cached->second;
  std::string name = tracker.kernel_name(e);
  if (name.empty()) {
    if (const uint64_t addr = tracker.kernel_name_addr(e)) {
      name = read_name(e.pid, addr, "");
      if (name.empty()) ++unread_;
    }
  }
  if (name.empty()) {
    if (cached != ids.end()) return 0;  // the symbol table was already asked
    // No registration or lookup seen (attached to a running process): the runtime's host
    // stub is a function of the program, named like the kernel.
    if (f->api == cuda::Api::Runtime) {
      if (auto m = maps_.resolve(e.pid, e.kernel_handle)) {
        auto frame = symbolizer_.resolve(symbolize::openable_path(e.pid, m->path), build_ids_.of(e.pid, *m), m->file_offset);
        if (!frame.function.empty() && frame.offset_in_function == 0) name = frame.raw_function;
      }
    }
    if (name.empty()) {
      ids.emplace(key, 0);
      return 0;
    }
  }
  const int64_t id = sink_.intern_kernel(name, elf::demangle(name));
  ids[key] = id;
  return id;
}

}  // namespace gpuscope::record
