// `gpuscope agent`: the always-on daemon for GPU nodes. Traces every process that uses CUDA,
// within an overhead budget per process, and serves what it sees in the formats fleets already
// collect: Prometheus /metrics, OTLP/HTTP metrics pushed to a collector, and pprof profiles
// served for Parca and pushed to Pyroscope.
#pragma once

#include <functional>
#include <string>

#include "agent/config.h"

namespace gpuscope::agent {

struct AgentRun {
  std::string config_path;  // "" : defaults and flags only
  // Applied over the file, again at each reload (flags win).
  std::function<void(AgentConfig&)> overrides;
  double duration_s = 0;  // 0: until SIGINT/SIGTERM
  bool quiet = false;
};

// Returns the exit code. Throws Error with what to do when it cannot start.
int run_agent(const AgentRun& run);

}  // namespace gpuscope::agent
