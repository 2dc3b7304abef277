// `gpuscope advise`: what pinning host memory would save, per place in the program that copies
// from or to pageable memory, and what to do there in the program's own terms. Each host buffer's
// copies (the same address and size in one process) are priced from a copy model (copy_model.h):
// what they took, what pinned memory would take, and what registering the buffer once costs.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>

#include "advise/copy_model.h"
#include "report/call_sites.h"
#include "store/record_reader.h"

namespace gpuscope::advise {

struct AdviseOptions {
  size_t top = 20;  // call sites listed
};

nlohmann::json advise(store::RecordReader& rec, report::CallSites& sites, const CopyModel& model,
                      const AdviseOptions& opts);
std::string render_text(const nlohmann::json& doc);

}  // namespace gpuscope::advise
