// The report's "GPU time" section (record --gpu-times): per GPU, how busy it was while the
// program used it, where its time went and its longest idle gaps, with what the threads that
// feed it were doing meanwhile.
//
// Busy share and gaps are over the GPU's span in use, from its first kernel, copy or memset to its
// last: the time before (a program's imports, its data loading, CUDA's start) is start-up, shown
// on its own line, and the time after (saving, exiting) likewise; neither is an idle gap. Each GPU
// has its own span; with several processes on one GPU each has its own span and busy share too.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "report/call_sites.h"
#include "store/sqlite.h"

namespace gpuscope::report {

struct GpuTimeScope {
  store::Db& db;
  int64_t origin = 0;        // the recording's start: instants in the JSON count from it
  int64_t end = 0;           // the recording's end
  bool command_mode = false;  // record -- CMD: the recording started with the program
  std::string stack_weight;  // call_stack_weight_sql
};

// Null when the record has no GPU times.
nlohmann::json gpu_time(const GpuTimeScope& s, CallSites& sites, size_t top);
void gpu_time_text(std::string& out, const nlohmann::json& g);

// Busy stretches: the union of [start, end) intervals, in order of start.
struct Interval {
  int64_t start = 0, end = 0;
};
std::vector<Interval> busy_stretches(std::vector<Interval> intervals);

}  // namespace gpuscope::report
