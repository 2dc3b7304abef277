#include "attach/verbs_probes.h"

#include <bpf/bpf.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include <array>

#include "common/error.h"
#include "common/log.h"
#include "discover/proc.h"
#include "elf/elf_file.h"
#include "verbs_events.h"

namespace gpuscope::attach {

namespace {

// libibverbs' control path: symbol, op, and whether the op is one of libibverbs' (ibv_reg_mr
// and ibv_reg_mr_iova jump to ibv_reg_mr_iova2: one probe sees all three).
struct ControlFunction {
  const char* symbol;
  uint16_t op;
};
constexpr std::array<ControlFunction, 10> kControl{{
    {"ibv_open_device", GS_VERBS_OPEN_DEVICE},
    {"ibv_close_device", GS_VERBS_CLOSE_DEVICE},
    {"ibv_reg_mr_iova2", GS_VERBS_REG_MR},
    {"ibv_reg_dmabuf_mr", GS_VERBS_REG_DMABUF_MR},
    {"ibv_dereg_mr", GS_VERBS_DEREG_MR},
    {"ibv_create_cq", GS_VERBS_CREATE_CQ},
    {"ibv_destroy_cq", GS_VERBS_DESTROY_CQ},
    {"ibv_create_qp", GS_VERBS_CREATE_QP},
    {"ibv_modify_qp", GS_VERBS_MODIFY_QP},
    {"ibv_destroy_qp", GS_VERBS_DESTROY_QP},
}};

// The context's ops the inline data path calls through (ibv_context.ops).
struct DataFunction {
  uint64_t offset;  // in struct ibv_context
  uint16_t op;
};
constexpr std::array<DataFunction, 3> kData{{
    {GS_IBV_CONTEXT_POST_SEND, GS_VERBS_POST_SEND},
    {GS_IBV_CONTEXT_POST_RECV, GS_VERBS_POST_RECV},
    {GS_IBV_CONTEXT_POLL_CQ, GS_VERBS_POLL_CQ},
}};

}  // namespace

const std::vector<std::string_view>& VerbsProbes::direct_functions() {
  // What a program that drives an mlx5 device's queues itself calls: the queues' own buffers and
  // doorbells (mlx5dv_init_obj), QPs made past ibv_create_qp, DEVX objects and memory. Appended
  // only: the index is stored in records.
  static const std::vector<std::string_view> kNames{"mlx5dv_init_obj", "mlx5dv_create_qp", "mlx5dv_devx_obj_create",
                                                    "mlx5dv_devx_umem_reg"};
  return kNames;
}

int VerbsProbes::attach_library(const std::string& open_path) {
  const bool verbs = discover::is_verbs_library(open_path), mlx5 = discover::is_mlx5_library(open_path);
  if (!verbs && !mlx5) return 0;
  struct stat st{};
  if (stat(open_path.c_str(), &st) != 0 || !files_.insert({st.st_dev, st.st_ino}).second) return 0;
  auto elf = elf::ElfFile::open(open_path);
  int n = 0;
  auto probe = [&](const std::string& symbol, uint64_t cookie) {
    // The default version of a versioned name ("ibv_create_qp@@IBVERBS_1.1", not 1.0's).
    auto offsets = elf->function_offsets({symbol});
    auto it = offsets.find(symbol);
    if (it == offsets.end()) return;
    bpf_.attach_program("verbs_entry", open_path, it->second, cookie, false);
    bpf_.attach_program("verbs_return", open_path, it->second, cookie, true);
    ++n;
  };
  if (verbs)
    for (const auto& f : kControl) probe(f.symbol, f.op);
  if (mlx5)
    for (size_t i = 0; i < direct_functions().size(); ++i)
      probe(std::string(direct_functions()[i]), GS_VERBS_DIRECT | (uint64_t(i) << 16));
  return n;
}

int VerbsProbes::resolve_contexts() {
  const int fd = bpf_.map_fd("verbs_contexts");
  if (fd < 0) return 0;
  std::vector<gs_verbs_context_key> keys;
  gs_verbs_context_key key{}, next{};
  const void* prev = nullptr;
  while (bpf_map_get_next_key(fd, prev, &next) == 0) {
    keys.push_back(next);
    key = next;
    prev = &key;
  }
  const size_t before = provider_.size();
  for (const auto& k : keys) {
    // Deleted once read: a context handed over again (its next QP) is read again, cheaply, and
    // the map keeps only those not yet read.
    resolve(k.pid, k.context);
    bpf_map_delete_elem(fd, &k);
  }
  return static_cast<int>(provider_.size() - before);
}

void VerbsProbes::resolve(uint32_t pid, uint64_t context) {
  std::array<uint64_t, kData.size()> fn{};
  for (size_t i = 0; i < kData.size(); ++i) {
    iovec local{&fn[i], sizeof(uint64_t)}, remote{reinterpret_cast<void*>(context + kData[i].offset), sizeof(uint64_t)};
    if (process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0) != sizeof(uint64_t)) {
      ++skipped_["verbs_context_unreadable"];
      return;
    }
  }
  const auto maps = discover::read_maps(static_cast<pid_t>(pid));
  for (size_t i = 0; i < kData.size(); ++i) {
    const discover::Mapping* in = nullptr;
    for (const auto& m : maps)
      if (fn[i] >= m.start && fn[i] < m.end) in = &m;
    if (!in || in->path.empty() || in->path[0] != '/' || !in->executable) {
      ++skipped_["verbs_provider_unmapped"];
      log_debug("PID {}: the verbs context {:#x}'s {} ({:#x}) is in no file: not probed", pid, context,
                kData[i].op == GS_VERBS_POLL_CQ ? "poll_cq" : kData[i].op == GS_VERBS_POST_SEND ? "post_send" : "post_recv",
                fn[i]);
      continue;
    }
    const std::string path = discover::path_in_target(static_cast<pid_t>(pid), in->path);
    const uint64_t offset = fn[i] - in->start + in->offset;
    struct stat st{};
    if (stat(path.c_str(), &st) != 0) {
      ++skipped_["verbs_provider_unmapped"];
      continue;
    }
    if (!functions_.insert({st.st_dev, st.st_ino, offset}).second) continue;
    try {
      if (kData[i].op == GS_VERBS_POLL_CQ) {
        bpf_.attach_program("verbs_entry", path, offset, GS_VERBS_POLL_CQ, false);
        bpf_.attach_program("verbs_return", path, offset, GS_VERBS_POLL_CQ, true);
      } else {
        bpf_.attach_program("verbs_post", path, offset, kData[i].op, false);
      }
      provider_.emplace_back(path, offset, kData[i].op);
    } catch (const Error& e) {
      ++skipped_["verbs_provider_attach_failed"];
      log_warn("PID {}: cannot probe its RDMA provider's function in {}: {}", pid, in->path, e.what());
    }
  }
}

}  // namespace gpuscope::attach
