// RDMA verbs probes: libibverbs' control path (and libmlx5's direct verbs) per library file, and
// the providers' data-path functions, found through the contexts the control path hands over.
//
// ibv_post_send, ibv_post_recv and ibv_poll_cq are inline in verbs.h: they call the provider
// through the context's ops table, never through libibverbs. The BPF side puts each context a
// control call returns or takes (ibv_open_device, ibv_create_cq, ibv_create_qp) into the map
// verbs_contexts; resolve_contexts() reads its three function pointers from the process's memory,
// finds the file and offset each lies at in its mappings, and probes each (file, offset) once.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "attach/bpf_session.h"

namespace gpuscope::attach {

class VerbsProbes {
 public:
  explicit VerbsProbes(BpfSession& bpf) : bpf_(bpf) {}
  // Probes a libibverbs or libmlx5 file (once per file; others are ignored): the number of
  // functions probed, 0 if none or attached before. Throws Error where a probe cannot be placed.
  int attach_library(const std::string& open_path);
  // The providers' functions of the contexts handed over since the last call, probed: how many
  // functions were new. Skips what cannot be probed, counted by reason (skipped()).
  int resolve_contexts();
  // Provider functions not probed, by reason: "verbs_provider_unmapped" (a pointer into no file:
  // anonymous memory, JIT code), "verbs_context_unreadable" (the process's memory could not be
  // read: it exited), "verbs_provider_attach_failed".
  const std::map<std::string, uint64_t>& skipped() const { return skipped_; }
  // The provider functions probed: (path as gpuscope opened it, file offset, gs_verbs_op).
  const std::vector<std::tuple<std::string, uint64_t, uint16_t>>& provider_probes() const { return provider_; }
  // libmlx5's direct-verbs functions probed, by their index in a GS_VERBS_DIRECT record's a[0].
  static const std::vector<std::string_view>& direct_functions();
  bool any_library() const { return !files_.empty(); }

 private:
  void resolve(uint32_t pid, uint64_t context);
  BpfSession& bpf_;
  std::set<std::pair<uint64_t, uint64_t>> files_;                  // (st_dev, st_ino) attached
  std::set<std::tuple<uint64_t, uint64_t, uint64_t>> functions_;   // (st_dev, st_ino, offset) probed
  std::vector<std::tuple<std::string, uint64_t, uint16_t>> provider_;
  std::map<std::string, uint64_t> skipped_;
};

}  // namespace gpuscope::attach
