// `gpuscope agent`'s settings: a YAML file (deploy/agent.yaml documents every key), then
// command-line flags over it. Read again on SIGHUP.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace gpuscope::agent {

struct PushTarget {
  std::string url;  // "" : off
  double interval_s = 15;
  std::map<std::string, std::string> headers;
};

struct AgentConfig {
  std::string listen = "127.0.0.1:9464";
  std::string bearer_token_file;  // protects the profile endpoints (and /metrics with protect_metrics)
  bool protect_metrics = false;
  // Share of each process's CPU time its probes may add; 1: no limit. Half of the 1% a job may
  // lose to gpuscope in all: host telemetry and CPU sampling take their part of that too (beside
  // the training step at 1%, the job's steps were 1.3% and 2.4% longer, session 27).
  double budget = 0.005;
  double profile_interval_s = 15; // window of each pprof profile
  PushTarget otlp;                // e.g. http://collector:4318/v1/metrics
  PushTarget pyroscope;           // e.g. http://pyroscope:4040 (POST /ingest)
  size_t max_kernel_names = 100;
  size_t memory_limit_mb = 100;
  // The agent's own CPU, as a share of one core: above it, every process is observed less.
  double agent_cpu_budget = 0.05;
  double gpu_sample_hz = 1;
  // PCIe throughput and per-process GPU use are read this often: each read costs ~3 ms of CPU on
  // an H100 (bench/nvml_refresh), a third of an idle agent's CPU if done every second.
  double gpu_process_sample_s = 10;
  int cpu_profile_hz = 19;
  bool stacks = true;
  bool python_stacks = true;
  // How user stacks are walked: "fp" (frame pointers: cheap, stops in code without them, such
  // as libtorch) or "eh-frame" (from tables compiled from .eh_frame, record --call-stacks eh-frame:
  // whole stacks; the tables take unwind_table_mb of kernel memory, and compiling a library's
  // takes the agent CPU and memory the first time it is seen, unless unwind_cache has it).
  std::string stack_walk = "fp";
  // Launches', copies' and memsets' stacks taken for one call in N, at random (record
  // --stack-every): the cuda_launches profile counts each N times. 1: every call.
  uint32_t stack_every = 1;
  uint32_t unwind_table_mb = 128;
  std::string unwind_cache = "/var/cache/gpuscope/unwind-tables";
  uint32_t ringbuf_mb = 8;
  // Entries of each of the two BPF stack maps (the agent recycles them; see
  // record::Pipeline::recycle_stacks). Not in deploy/agent.yaml: for tests and odd hosts.
  uint32_t stack_map_entries = 8192;
  std::string host_root = "/";  // where the host's / is (containers' state, for pod names)
  // Host telemetry of the CUDA processes and their children, and live findings from it
  // (gpuscope_step_seconds, gpuscope_finding_share): see docs/diagnosis.md.
  bool diagnose = true;
};

// Reads a config file over the defaults. Throws Error naming the file, line and key.
AgentConfig load_config(const std::string& path, AgentConfig base = {});
// "15s", "2m", "500ms", "1h" or plain seconds.
double parse_duration_s(const std::string& text);

}  // namespace gpuscope::agent
