// `gpuscope record`: discover the targets, attach, and run the pipeline until the command
// exits, the duration ends, or the user stops it.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace gpuscope::record {

struct RecordOptions {
  std::vector<std::string> command;  // record -- CMD ...
  std::vector<pid_t> pids;           // --pid
  bool all = false;                  // --all
  double duration_s = 0;             // 0: until the command exits or Ctrl-C
  std::string output = "gpuscope.record";
  bool stacks = true;
  uint32_t ringbuf_mb = 64;
  bool quiet = false;
};

// Returns the exit code gpuscope should exit with: the command's, under `record -- CMD`.
int run_record(const RecordOptions& opts);

}  // namespace gpuscope::record
