// Kernels' names, as the launches name them: from the registration or lookup the Tracker saw
// (read from the target's memory, or its file once it is gone), else from the runtime's host
// stub in the program's symbol table. Each (process, handle) is interned once.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>

#include "common/model.h"
#include "decode/tracker.h"
#include "record/build_ids.h"
#include "store/sink.h"
#include "symbolize/process_maps.h"
#include "symbolize/symbolizer.h"

namespace gpuscope::record {

class KernelNames {
 public:
  // lazy_registrations: see PipelineConfig::lazy_registration_names.
  KernelNames(store::EventSink& sink, symbolize::ProcessMaps& maps, BuildIds& build_ids, bool lazy_registrations)
      : sink_(sink), maps_(maps), build_ids_(build_ids), lazy_registrations_(lazy_registrations) {}

  // Reads the name a call points at (registrations, lookups), where it is wanted now.
  void name_call(CallEvent& e);
  // The sink's kernel id of a launch (0: no name found).
  int64_t kernel_id(const CallEvent& launch, const decode::Tracker& tracker);
  void forget(uint32_t pid) { ids_.erase(pid); }
  // Names that could be read neither from the process nor from its file.
  uint64_t unread() const { return unread_; }

 private:
  // A name in the target's memory (or, once it is gone, its file); `partial` if neither reads.
  std::string read_name(uint32_t pid, uint64_t addr, const std::string& partial);

  store::EventSink& sink_;
  symbolize::ProcessMaps& maps_;
  BuildIds& build_ids_;
  symbolize::Symbolizer symbolizer_;
  bool lazy_registrations_;
  std::unordered_map<uint32_t, std::unordered_map<uint64_t, int64_t>> ids_;  // handle ^ api -> kernel
  uint64_t unread_ = 0;
};

}  // namespace gpuscope::record
