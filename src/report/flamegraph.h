// `gpuscope flamegraph`: stacks from a record weighted by a metric, written as folded stacks,
// pprof or a self-contained interactive HTML page.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "report/stack_view.h"
#include "store/record_reader.h"
#include "symbolize/symbolizer.h"

namespace gpuscope::report {

enum class Metric { Cpu, Launches, MemcpyBytes, AllocBytes, InuseBytes, GpuTime, NcclBytes };
enum class FlameFormat { Folded, Pprof, Html };

struct FlameOptions {
  Metric metric = Metric::Cpu;
  bool inuse_at_peak = false;  // inuse-bytes: live allocations at the peak of the total, not at the end
  int64_t pid = 0;             // 0: every process
  NativeView native = NativeView::Auto;  // which native frames stacks with Python frames show
};

// Stacks root first (the process, then outermost frame ... leaf), each with its weight.
struct FlameData {
  std::map<std::vector<std::string>, int64_t> stacks;
  std::string sample_type, unit;  // pprof's names: ("cpu", "nanoseconds"), ("launches", "count"), ...
  int64_t period = 1;             // CPU samples: nanoseconds between samples
  int64_t time_nanos = 0, duration_nanos = 0;  // the window the stacks were taken in (Unix time); 0: not known
  std::string note;               // what the view left out, for the HTML page
  // Frames that name one source line (Python frames): name -> (file, line), for pprof.
  std::map<std::string, std::pair<std::string, int64_t>> sources;
  // Native frames (functions, and libraries standing for their unsymbolised frames): name ->
  // (file, build id), pprof's mapping.
  std::map<std::string, std::pair<std::string, std::string>> modules;
  int64_t total() const;
};

// Throws Error when the record has nothing for the metric to weigh (e.g. no CPU samples).
FlameData build_flame(store::RecordReader& rec, symbolize::Symbolizer& sym, const FlameOptions& opt);

std::string to_folded(const FlameData& d);
// A gzip-compressed profile.proto message (github.com/google/pprof/proto/profile.proto).
std::string to_pprof(const FlameData& d);
// One HTML file with everything inline: zoom on click, search, works offline.
std::string to_html(const FlameData& d, const std::string& title);

Metric parse_metric(const std::string& s);       // throws Error listing the metrics
FlameFormat format_for_path(const std::string& path);  // by extension: .folded/.txt, .pb.gz/.pprof, .html

}  // namespace gpuscope::report
