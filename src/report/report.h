// `gpuscope report`: one JSON document built from a record file, and its text rendering.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>

#include "store/record_reader.h"
#include "symbolize/symbolizer.h"

namespace gpuscope::report {

struct Options {
  size_t top = 10;  // rows in the kernel and leak tables
};

// The whole report: sections summary, kernels, copies, memory, leaks, allocation_sites, errors, sync,
// cpu (null without CPU samples), gpus (NVML), gpu_time (null without GPU times; sections/gpu_time.h), lost.
// Times are nanoseconds; instants (`*_at_ns`, `t_ns`) count from the start of the recording.
// Reads the calls table a few times in aggregate, never whole; symbolises only stacks it shows.
nlohmann::json build_report(store::RecordReader& rec, symbolize::Symbolizer& sym, const Options& opt);
// Human-readable text of a build_report() document, so both outputs always agree.
std::string render_text(const nlohmann::json& report);

}  // namespace gpuscope::report
