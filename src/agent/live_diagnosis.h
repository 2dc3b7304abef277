// The agent's live diagnosis: per CUDA process, the last seconds of its CUDA calls and of its
// threads' time (host telemetry), analysed once a second as `gpuscope diagnose` analyses a record
// (diagnose::analyze). Exported as gauges: each process's step time and each finding's share of it.
// Memory is bounded: calls and windows older than the window are dropped, and so are processes
// past max_processes (their evidence comes back with their next calls).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "agent/metrics.h"
#include "common/model.h"
#include "diagnose/analysis.h"
#include "gpu/nvml.h"
#include "store/sink.h"

namespace gpuscope::agent {

class LiveDiagnosis {
 public:
  struct Limits {
    uint64_t window_ns = 3'000'000'000;  // the evidence each analysis looks at
    size_t max_calls = 20000;            // per process, within the window
    size_t max_windows = 4096;           // thread windows per process, within the window
    size_t max_processes = 256;
    // A window without a whole step seen (the budget had the launch probes off throughout) keeps
    // the last analysis this long.
    uint64_t hold_ns = 10'000'000'000;
    // A process's first steps are its start-up, not its steady state (libraries' handles and
    // autotuning, the allocator's growth, pages touched for the first time): the steps at the
    // start of the first analysis that finds some, while they are slower than the settled steps
    // after them, are left out, of it and of every later one (settled_from). In a clean training
    // step's first second the agent had found host_kernel 31% and launch_bound 16% (warm-up steps
    // of 21 ms with page faults, not the 4.9 ms that followed).
    bool skip_start_up = true;
  };
  explicit LiveDiagnosis(Limits limits) : limits_(limits) {}

  // From the pipeline thread (the aggregator's sink calls).
  void add_call(const CallEvent& e);
  void add_thread_time(const store::ThreadTimeRow& r);
  // A CPU sample that found thread `tid` in the kernel, doing `what` (diagnose/kernel_activity.h).
  void add_kernel_sample(uint64_t ts_ns, uint32_t pid, uint32_t tid, const std::string& what);
  // NVML's readings (the GPU's side: busy share, other tenants, PCIe, clocks).
  void add_gpu_batch(const gpu::NvmlSampler::Batch& b);
  // PSI and cpu.stat (host::PressureSampler): the host's (pid 0) and each process's cgroup's.
  void add_pressure(const host::PressureReading& r);
  void forget_process(uint32_t pid);
  // The overhead budget switched the process's launch, copy and memset probes off or on at t_ns:
  // steps across the time they were off are not analysed (their calls went unseen).
  void high_rate_probes(uint32_t pid, bool on, uint64_t t_ns);
  // What a probe hit costs the process (its trap and its program): a hit at entry only, and a call
  // probed at entry and return. The analysis takes what the probes added off the job's time.
  void set_probe_costs(double entry_ns, double pair_ns);

  // Analyses every process with calls in the window ending at now_ns (CLOCK_MONOTONIC); what it
  // finds is what families() exports until the next tick.
  void tick(uint64_t now_ns);
  struct Current {
    uint32_t pid = 0;
    std::string comm;
    double step_s = 0;
    size_t steps = 0;
    std::vector<diagnose::Finding> findings;  // not `none`
    uint64_t analysed_ns = 0;  // the tick whose window held these steps
    // The steps seen whole (start, ms) and the spans with the launch probes off, for /debug/diagnosis.
    std::vector<std::pair<uint64_t, double>> recent_steps;
    std::vector<std::pair<uint64_t, uint64_t>> unobserved;
  };
  std::vector<Current> current() const;
  // Findings that began since the last call: a cause a process did not have at the tick before
  // (and had not had reported in the last minute, so that one that comes and goes is told once).
  struct Onset {
    uint64_t ts_ns = 0;  // CLOCK_MONOTONIC, the tick that found it
    uint32_t pid = 0;
    std::string comm;
    diagnose::Finding finding;
  };
  std::vector<Onset> take_onsets();
  // gpuscope_step_seconds and gpuscope_finding_share, labelled with each process's labels.
  std::vector<MetricFamily> families(const std::function<Labels(uint32_t)>& labels_of) const;

  // Where a process's start-up ends among the first steps it was seen to take (in time order):
  // at the first step not over kStartUpStepFactor times their median, where kSettledSteps or
  // kSettledMs of steps follow and the later half of them is not kStillFaster than the earlier;
  // none yet otherwise (still warming up). (Leaving out all the steps of the first analysis that
  // found some, as before, delayed faults there from the start by up to 6.5 s: the next analysis
  // held too few steps to show a starved DataLoader.)
  static std::optional<uint64_t> settled_from(const std::vector<double>& step_ms, const std::vector<uint64_t>& start_ns);

 private:
  struct Process {
    std::string comm;
    std::deque<diagnose::CudaCall> calls;
    std::map<uint32_t, std::deque<diagnose::ThreadWindow>> windows;
    size_t window_count = 0;
    std::deque<diagnose::KernelSample> kernel_samples;
    std::deque<std::pair<uint64_t, uint64_t>> unobserved;  // spans with the high-rate probes off
    uint64_t off_since = 0;                                // they are off now, since then
    // Its calls seen, and of them, those kept at the top (not within another): what the probes cost
    // each of the latter. Halved at each analysis: the last seconds count, not a start-up's kernel
    // registrations (thousands of hits before the first launch).
    double entry_hits = 0, pair_hits = 0, top_calls = 0;
    uint64_t steady_from_ns = 0;  // where its start-up ended (settled_from); 0: not yet
    int warming_ticks = 0;        // analyses that found its steps still getting faster
  };
  void trim(Process& p, uint64_t before_ns);
  static constexpr double kStartUpStepFactor = 1.5;
  static constexpr size_t kSettledSteps = 5;
  static constexpr double kStillFaster = 0.8;
  static constexpr double kSettledMs = 1000;
  // NVML's utilisation covers a sample period before its reading, between 1/6 s and 1 s by
  // product: those taken within a second after a process's start-up may describe the start-up.
  // (After a clean training job's warm-up, readings 0.2 s into its settled steps showed the GPU
  // idle 21-81%, an inference loop's 98%, where the steps that followed kept it 91-98% busy:
  // launch_bound, io_wait or host_kernel in 18-25 of 70 polls.) Where its GPU is read, the host's
  // causes are told only once a reading of the settled steps bounds them (unbounded, its threads'
  // first waits after their start-up were cpu_contention 5-25% in clean runs).
  static constexpr uint64_t kNvmlReadingSpanNs = 1'000'000'000;
  // Leaves out those readings; false where the GPU was read but none of the settled steps is yet.
  static bool drop_start_up_readings(diagnose::ProcessEvidence& e, uint64_t steady_from_ns);
  // Analyses that found steps still warming up before the start-up is taken to end anyway.
  static constexpr int kMaxStartUpTicks = 5;
  static constexpr uint64_t kLongCallNs = 10'000;  // other calls are kept from this long

  struct Gpu {
    std::deque<diagnose::GpuReading> readings;
    std::deque<diagnose::GpuProcessReading> processes;
    std::deque<diagnose::XidEvent> xids;  // the last kXidHoldNs
  };
  // The driver's error reports (XIDs) stand this long: a GPU that failed often leaves its
  // processes hung in a call that never returns, with nothing more to see.
  static constexpr uint64_t kXidHoldNs = 60'000'000'000;
  static constexpr size_t kMaxXids = 256;  // per GPU
  // Adds the gpu_error finding to every process on a GPU with XIDs in the last kXidHoldNs, steps
  // seen or not (under mu_).
  void add_xid_findings(std::vector<Current>& found, uint64_t now_ns);
  Limits limits_;
  mutable std::mutex mu_;
  std::map<uint32_t, Gpu> gpus_;                 // by device, within the window
  std::map<uint32_t, uint32_t> process_gpu_;     // pid -> the device NVML last saw it on
  std::map<uint32_t, std::deque<host::PressureReading>> pressure_;  // pid (0: the host), within the window
  std::map<uint32_t, Process> processes_;
  diagnose::ProcessNames names_;  // comm of processes seen in the evidence
  std::map<uint32_t, std::string> traced_;  // comm of the processes whose calls were seen, until they exit
  std::vector<Current> current_;
  std::vector<Onset> onsets_;                                     // at most 256 waiting
  std::map<std::pair<uint32_t, std::string>, uint64_t> reported_;  // (pid, cause) -> when last told
  double entry_hit_ns_ = 0, pair_hit_ns_ = 0;
};

}  // namespace gpuscope::agent
