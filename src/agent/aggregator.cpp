#include "agent/aggregator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <tuple>

#include "attach/bpf_session.h"
#include "common/clock.h"
#include "cuda/functions.h"
#include "diagnose/kernel_activity.h"
#include "discover/proc.h"
#include "report/frame_names.h"
#include "report/stored_stacks.h"
#include "elf/elf_file.h"

namespace gpuscope::agent {
namespace {

std::string_view direction_label(cuda::CopyDir d) {
  switch (d) {
    case cuda::CopyDir::HostToDevice: return "h2d";
    case cuda::CopyDir::DeviceToHost: return "d2h";
    case cuda::CopyDir::DeviceToDevice: return "d2d";
    case cuda::CopyDir::HostToHost: return "h2h";
    default: return "unknown";
  }
}

std::string_view host_memory_label(HostMem h) {
  switch (h) {
    case HostMem::Pageable: return "pageable";
    case HostMem::Pinned: return "pinned";
    case HostMem::Unknown: return "unknown";
    case HostMem::NotApplicable: return "none";
  }
  return "unknown";
}

std::string function_name(uint16_t id) {
  const auto* f = cuda::function_by_id(id);
  return f ? std::string(f->symbol) : fmt::format("function {}", id);
}

// A frame's bytes as a hash key.
std::string stack_key(const std::vector<store::StoredFrame>& frames) {
  std::string key(frames.size() * 2 * sizeof(uint64_t), '\0');
  for (size_t i = 0; i < frames.size(); ++i) {
    const uint64_t words[2] = {uint64_t(frames[i].module_id), frames[i].module_id ? frames[i].offset : frames[i].ip};
    std::memcpy(key.data() + i * sizeof(words), words, sizeof(words));
  }
  return key;
}

MetricFamily family(std::string name, std::string help, std::string unit, MetricType type) {
  return MetricFamily{std::move(name), std::move(help), std::move(unit), type, {}};
}

Labels with(Labels base, std::initializer_list<std::pair<std::string, std::string>> more) {
  for (const auto& m : more) base.push_back(m);
  return base;
}

}  // namespace

std::string kernel_label(const std::string& demangled) {
  std::string s = demangled;
  if (s.starts_with("void ")) s.erase(0, 5);
  // Cut the parameter list: the '(' that closes at the very end, outside template brackets.
  if (!s.empty() && s.back() == ')') {
    int depth = 0;
    for (size_t i = s.size(); i-- > 0;) {
      if (s[i] == ')') ++depth;
      if (s[i] == '(' && --depth == 0) {
        if (i > 0) s.resize(i);
        break;
      }
    }
  }
  constexpr size_t kMax = 160;
  if (s.size() > kMax) s = s.substr(0, kMax - 3) + "...";
  return s;
}

Aggregator::Aggregator(const AggregatorLimits& limits, int cpu_profile_hz, std::string host_root,
                       std::function<uint64_t()> clock)
    : limits_(limits),
      cpu_profile_hz_(cpu_profile_hz),
      host_root_(std::move(host_root)),
      clock_(clock ? std::move(clock) : std::function<uint64_t()>(monotonic_ns)) {}

// Labels without a value are left out: Prometheus reads an empty label as an absent one.
Labels Aggregator::Process::labels() const {
  Labels l{{"pid", std::to_string(pid)}, {"comm", comm}};
  if (!container.container_id.empty()) l.emplace_back("container_id", container.container_id.substr(0, 12));
  if (!container.pod.empty()) l.emplace_back("pod", container.pod);
  if (!container.namespace_.empty()) l.emplace_back("namespace", container.namespace_);
  return l;
}

Aggregator::Process* Aggregator::process(uint32_t pid) {
  auto it = processes_.find(pid);
  if (it != processes_.end()) return &it->second;
  if (processes_.size() >= limits_.max_processes) {
    ++shed_.processes;
    return nullptr;
  }
  Process& p = processes_[pid];
  p.pid = pid;
  p.comm = discover::read_comm(static_cast<pid_t>(pid));
  p.container = discover::container_of(static_cast<pid_t>(pid), host_root_);
  p.window_start_unix_ns = realtime_ns();
  return &p;
}

void Aggregator::set_meta(const std::string&, const std::string&) {}

void Aggregator::add_gpu(const gpu::GpuDevice& d) {
  std::lock_guard lock(mu_);
  gpus_[d.index].device = d;
}

void Aggregator::upsert_process(uint32_t pid, uint32_t, const std::string& comm, const std::string&,
                                const std::string&, uint64_t) {
  std::lock_guard lock(mu_);
  // Only processes already known as CUDA users: every program started on the host comes here.
  auto it = processes_.find(pid);
  if (it == processes_.end()) return;
  if (!comm.empty()) it->second.comm = comm;
  // A process already gone reads as in no container: what was read while it ran stays.
  if (auto c = discover::container_of(static_cast<pid_t>(pid), host_root_); !c.container_id.empty() || !c.pod.empty())
    it->second.container = std::move(c);
}

void Aggregator::set_process_exit(uint32_t pid, uint64_t ts_ns, int) {
  std::lock_guard lock(mu_);
  auto it = processes_.find(pid);
  if (it == processes_.end() || it->second.exited) return;
  it->second.exited = true;
  it->second.cycles.exited(ts_ns, true);
  if (live_) live_->forget_process(pid);
}

void Aggregator::add_library(const store::LibraryRow& lib) {
  std::lock_guard lock(mu_);
  process(lib.pid);
}

void Aggregator::add_call(const CallEvent& e) {
  if (live_) live_->add_call(e);
  const auto* f = cuda::function_by_id(e.func);
  if (!f) return;
  std::lock_guard lock(mu_);
  Process* p = process(e.pid);
  if (!p) return;
  // Probe hits, for the budget: each call is one entry hit, plus its return probe's, plus the
  // driver launch folded into a runtime launch.
  const uint64_t entries = e.driver_func ? 2 : 1, returns = e.has_return ? 1 : 0;
  p->hits.entries += entries;
  p->hits.returns += returns;
  if (cuda::is_high_rate(*f)) {
    p->hits.high_rate_entries += entries;
    p->hits.high_rate_returns += returns;
    ++high_rate_calls_seen_;
    p->high_rate_functions.insert(e.func);
    if (e.driver_func) p->high_rate_functions.insert(e.driver_func);
  }
  // A driver call made inside a runtime call is part of that call: counted once, as the program made it.
  if (e.parent_id) return;
  const bool failed = e.has_return && e.ret != 0;
  if (failed) p->errors[e.func] += 1;
  if (f->api == cuda::Api::Nccl) {
    p->nccl.add(e, *f);
    return;
  }
  // A launch or copy counts once in its cycle's observed calls and, scaled by what that cycle
  // weighs so far, in the counters (which rise with the weight as the cycle goes on). Only
  // calls of the duty-cycled probes say when those were live.
  const ObservedCycles::Slot slot = cuda::is_high_rate(*f) ? p->cycles.slot(e.ts_ns) : ObservedCycles::Slot{};
  const double w = slot.raw ? slot.weight : p->high_rate_weight;
  switch (f->kind) {
    case cuda::CallKind::Launch:
    case cuda::CallKind::GraphLaunch: {
      const int64_t k = launch_key(*p, f->kind == cuda::CallKind::GraphLaunch ? -1 : e.kernel_id);
      p->high.launches[k] += w;
      p->high.calls += w;
      if (slot.raw) {
        slot.raw->launches[k] += 1;
        slot.raw->calls += 1;
      }
      // Under stack_every N a taken stack stands for N launches (e.stack_weight), a left-out one for none.
      if (e.stack_id) p->launch_window[e.stack_id] += e.stack_weight;
      break;
    }
    case cuda::CallKind::Memcpy: {
      const CopyKey key{std::string(direction_label(e.dir)), std::string(host_memory_label(e.host_mem))};
      for (auto [counts, n] : {std::pair{&p->high, w}, std::pair{slot.raw, 1.0}}) {
        if (!counts) continue;
        auto& t = counts->copies[key];
        t.count += n;
        t.bytes += double(e.bytes) * n;
        t.seconds += double(e.duration_ns) * 1e-9 * n;
        counts->calls += n;
      }
      break;
    }
    case cuda::CallKind::Alloc: {
      const bool pinned = f->mem == cuda::MemKind::PinnedHost;
      if (failed) {
        if (!pinned) p->allocation_failures += 1;
        break;
      }
      if (!e.has_return) break;
      if (!pinned) {
        p->allocations += 1;
        p->allocated_bytes += double(e.bytes);
      }
      if (p->live.size() < limits_.max_live_allocations || p->live.contains(e.ptr)) {
        p->live[e.ptr] = {e.bytes, pinned};
        (pinned ? p->pinned_in_use : p->device_in_use) += double(e.bytes);
      } else {
        ++shed_.allocations;
      }
      break;
    }
    case cuda::CallKind::Free: {
      auto it = p->live.find(e.ptr);
      if (it == p->live.end()) break;
      if (it->second.pinned_host) {
        p->pinned_in_use -= double(it->second.size);
      } else {
        p->device_in_use -= double(it->second.size);
        p->freed_bytes += double(it->second.size);
      }
      p->live.erase(it);
      break;
    }
    case cuda::CallKind::Sync: {
      auto& t = p->syncs[e.func];
      t.count += 1;
      t.seconds += double(e.duration_ns) * 1e-9;
      break;
    }
    default:
      break;
  }
}

int64_t Aggregator::intern_kernel(const std::string& name, const std::string& demangled) {
  std::lock_guard lock(mu_);
  auto it = kernel_ids_.find(name);
  if (it != kernel_ids_.end()) return it->second;
  // Names are few (one per kernel in the loaded modules); the cap guards against a flood.
  if (kernel_names_.size() >= 65536) {
    ++shed_.kernel_names;
    return 0;
  }
  kernel_names_.push_back(kernel_label(demangled.empty() ? name : demangled));
  return kernel_ids_[name] = int64_t(kernel_names_.size());
}

int64_t Aggregator::intern_module(const std::string& path, const std::string& build_id) {
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < modules_.size(); ++i)
    if (modules_[i].path == path && modules_[i].build_id == build_id) return int64_t(i + 1);
  modules_.push_back({path, build_id});
  const int64_t id = int64_t(modules_.size());
  if (path == "[python]") python_module_ = id;
  return id;
}

int64_t Aggregator::intern_stack(const std::vector<store::StoredFrame>& frames) {
  std::lock_guard lock(mu_);
  std::string key = stack_key(frames);
  auto it = stack_ids_.find(key);
  if (it != stack_ids_.end()) return it->second;
  if (stacks_.size() >= limits_.max_stacks) {
    ++shed_.stacks;
    return 0;
  }
  const int64_t id = next_stack_id_++;
  stacks_.emplace(id, frames);
  return stack_ids_[std::move(key)] = id;
}

int64_t Aggregator::intern_python_frame(const std::string& function, const std::string& file, int line) {
  std::lock_guard lock(mu_);
  report::PythonFrameRow row{function, file, line};
  std::string text = row.text();
  auto it = python_ids_.find(text);
  if (it != python_ids_.end()) return it->second;
  const int64_t id = next_python_id_++;
  python_frames_.emplace(id, std::move(row));
  return python_ids_[std::move(text)] = id;
}

void Aggregator::add_symbol(int64_t module_id, uint64_t offset, const std::string& name) {
  std::lock_guard lock(mu_);
  // Kernel function names: one per address seen in a kernel stack, bounded by the kernel's text.
  symbols_[{module_id, offset}] = name;
}

void Aggregator::add_sample(uint64_t ts_ns, uint32_t pid, uint32_t tid, uint32_t, int64_t stack_id,
                            int64_t kernel_stack_id) {
  std::string in_kernel;
  {
    std::lock_guard lock(mu_);
    Process* p = process(pid);
    if (p && stack_id) p->cpu_window[stack_id] += 1;
    // What a sample taken in the kernel found the thread doing there, for the live diagnosis
    // (host_kernel's evidence); a stack's answer is kept as long as the stack.
    if (live_ && p && kernel_stack_id) {
      auto known = kernel_activity_.find(kernel_stack_id);
      if (known == kernel_activity_.end()) {
        std::vector<std::string> names;
        if (const auto st = stacks_.find(kernel_stack_id); st != stacks_.end())
          for (const auto& f : st->second) {
            const auto sym = symbols_.find({f.module_id, f.offset});
            names.push_back(sym == symbols_.end() ? "" : sym->second);
          }
        known = kernel_activity_.emplace(kernel_stack_id, diagnose::kernel_activity(names)).first;
      }
      in_kernel = known->second;
    }
  }
  if (!in_kernel.empty()) live_->add_kernel_sample(ts_ns, pid, tid, in_kernel);
}

void Aggregator::set_lost(const std::string& cause, uint64_t count) {
  std::lock_guard lock(mu_);
  lost_[cause] = count;
}

void Aggregator::add_gpu_batch(const gpu::NvmlSampler::Batch& b) {
  std::lock_guard lock(mu_);
  for (const auto& s : b.samples) {
    auto& gpu = gpus_[s.device].sample;
    // PCIe throughput and GPM are read on slow ticks only: the last reading stands until the next.
    const auto last = gpu;
    gpu = s;
    for (auto field : {&gpu::GpuSample::pcie_tx_kbs, &gpu::GpuSample::pcie_rx_kbs})
      if (!(gpu.*field)) gpu.*field = last.*field;
    for (auto field : {&gpu::GpuSample::sm_active, &gpu::GpuSample::sm_occupancy, &gpu::GpuSample::tensor_active,
                       &gpu::GpuSample::dram_active})
      if (!(gpu.*field)) gpu.*field = last.*field;
  }
  for (const auto& s : b.processes) gpu_processes_[{s.device, s.pid}] = s;
  for (const auto& e : b.events)
    if (e.kind == "xid") gpus_[e.device].xids[e.value] += 1;
  if (live_) live_->add_gpu_batch(b);
}

void Aggregator::add_pressure(const host::PressureReading& r) {
  if (live_) live_->add_pressure(r);
}

int64_t Aggregator::launch_key(Process& p, int64_t kernel) {
  auto& launches = p.high.launches;
  if (launches.contains(kernel)) return kernel;
  const size_t named = launches.size() - launches.count(HighRateCounts::kOtherKernel);
  if (named < limits_.max_kernel_names) return kernel;
  ++shed_.kernel_names;
  return HighRateCounts::kOtherKernel;
}

void Aggregator::high_rate_found(uint32_t pid, uint64_t t_ns, bool at_start) {
  std::lock_guard lock(mu_);
  if (Process* p = process(pid)) p->cycles.found(t_ns, at_start);
}

void Aggregator::high_rate_switched_on(uint32_t pid, uint64_t t_ns) {
  std::lock_guard lock(mu_);
  if (Process* p = process(pid)) p->cycles.switched_on(t_ns, p->high);
  if (live_) live_->high_rate_probes(pid, true, t_ns);
}

void Aggregator::high_rate_switched_off(uint32_t pid, uint64_t t_ns, double probe_share) {
  std::lock_guard lock(mu_);
  if (auto it = processes_.find(pid); it != processes_.end()) it->second.cycles.switched_off(t_ns, probe_share);
  if (live_) live_->high_rate_probes(pid, false, t_ns);
}

void Aggregator::high_rate_let_go(uint32_t pid, uint64_t t_ns) {
  std::lock_guard lock(mu_);
  if (auto it = processes_.find(pid); it != processes_.end()) it->second.cycles.exited(t_ns, false);
}

uint64_t Aggregator::high_rate_calls_seen() const {
  std::lock_guard lock(mu_);
  return high_rate_calls_seen_;
}

void Aggregator::set_high_rate_weight(uint32_t pid, double weight, double observed_ratio) {
  std::lock_guard lock(mu_);
  auto it = processes_.find(pid);
  if (it == processes_.end()) return;
  it->second.high_rate_weight = weight;
  it->second.observed_ratio = observed_ratio;
}

std::map<uint32_t, ProbeHits> Aggregator::probe_hits() const {
  std::lock_guard lock(mu_);
  std::map<uint32_t, ProbeHits> out;
  for (const auto& [pid, p] : processes_)
    if (!p.exited) out[pid] = p.hits;
  return out;
}

std::set<uint16_t> Aggregator::high_rate_functions(uint32_t pid) const {
  std::lock_guard lock(mu_);
  auto it = processes_.find(pid);
  return it == processes_.end() ? std::set<uint16_t>{} : it->second.high_rate_functions;
}

Labels Aggregator::labels_of(uint32_t pid) const {
  std::lock_guard lock(mu_);
  auto it = processes_.find(pid);
  return it == processes_.end() ? Labels{} : it->second.labels();
}

Aggregator::Shed Aggregator::shed() const {
  std::lock_guard lock(mu_);
  Shed s = shed_;
  s.frame_names = deferred_frames_.load(std::memory_order_relaxed);
  return s;
}

std::map<std::string, uint64_t> Aggregator::lost() const {
  std::lock_guard lock(mu_);
  return lost_;
}

uint64_t Aggregator::lost_total() const {
  uint64_t n = 0;
  for (const auto& [cause, count] : lost())
    if (cause != attach::lost_cause_name(GS_LOST_RETURN_ORPHAN)) n += count;  // see gpuscope_agent_unmatched_returns_total
  return n;
}

MetricSnapshot Aggregator::snapshot(std::vector<MetricFamily> extra, uint64_t start_unix_ns) {
  MetricSnapshot s;
  s.time_unix_ns = realtime_ns();
  s.start_time_unix_ns = start_unix_ns;
  // Launches and copies: exact while gpuscope_counts_exact is 1, else estimates (docs/agent-metrics.md).
  auto launches = family("gpuscope_kernel_launches_total", "Kernel launches, by kernel (an estimate unless gpuscope_counts_exact is 1)", "", MetricType::Counter);
  auto copies = family("gpuscope_memcpy_total", "Memory copies, by direction and host memory kind (an estimate unless gpuscope_counts_exact is 1)", "", MetricType::Counter);
  auto copy_bytes = family("gpuscope_memcpy_bytes_total", "Bytes copied, by direction and host memory kind (an estimate unless gpuscope_counts_exact is 1)", "bytes", MetricType::Counter);
  auto copy_seconds = family("gpuscope_memcpy_seconds_total", "Time spent in copy calls (an estimate unless gpuscope_counts_exact is 1)", "seconds", MetricType::Counter);
  auto allocs = family("gpuscope_device_memory_allocations_total", "Device and managed memory allocations", "", MetricType::Counter);
  auto alloc_bytes = family("gpuscope_device_memory_allocated_bytes_total", "Device and managed memory allocated", "bytes", MetricType::Counter);
  auto freed = family("gpuscope_device_memory_freed_bytes_total", "Device and managed memory freed", "bytes", MetricType::Counter);
  auto in_use = family("gpuscope_device_memory_used_bytes", "Device and managed memory allocated and not yet freed, as traced", "bytes", MetricType::Gauge);
  auto failures = family("gpuscope_device_memory_allocation_failures_total", "Allocations that returned an error", "", MetricType::Counter);
  auto pinned = family("gpuscope_pinned_host_memory_used_bytes", "Pinned host memory allocated and not yet freed, as traced", "bytes", MetricType::Gauge);
  auto syncs = family("gpuscope_synchronizations_total", "Calls that wait for the GPU, by function", "", MetricType::Counter);
  auto sync_seconds = family("gpuscope_synchronization_seconds_total", "Time spent waiting for the GPU in synchronising calls, by function", "seconds", MetricType::Counter);
  auto errors = family("gpuscope_cuda_call_errors_total", "CUDA calls that returned an error, by function", "", MetricType::Counter);
  auto observed = family("gpuscope_observed_ratio", "Share of the process's traced time its high-rate probes (launches, copies) were on", "ratio", MetricType::Gauge);
  auto exact = family("gpuscope_counts_exact", "1 if the process's launch and copy counters count every call it made since it was found; 0 if they are estimates", "", MetricType::Gauge);
  auto error = family("gpuscope_estimate_error_ratio", "Bound on the relative error of the process's launch and copy counters (0: exact)", "ratio", MetricType::Gauge);
  auto nccl = NcclCounters::make_families();
  auto hits = family("gpuscope_probe_hits_total", "Probe hits in the process (observed, not scaled)", "", MetricType::Counter);

  const uint64_t now = clock_();
  std::lock_guard lock(mu_);
  std::erase_if(processes_, [](const auto& kv) { return kv.second.exited && kv.second.reported_exit; });
  for (auto& [pid, p] : processes_) {
    const Labels base = p.labels();
    p.cycles.advance(now, p.high);  // off-periods credited up to now (less the records' lag)
    for (const auto& [k, n] : p.high.launches) {
      const std::string name = k == HighRateCounts::kOtherKernel ? "other"
                               : k < 0                            ? "[graph]"
                               : k == 0 || size_t(k) > kernel_names_.size() ? "unknown"
                                                                 : kernel_names_[size_t(k) - 1];
      launches.samples.push_back({with(base, {{"kernel", name}}), n});
    }
    for (const auto& [key, t] : p.high.copies) {
      const Labels l = with(base, {{"direction", key.direction}, {"host_memory", key.host_memory}});
      copies.samples.push_back({l, t.count});
      copy_bytes.samples.push_back({l, t.bytes});
      copy_seconds.samples.push_back({l, t.seconds});
    }
    allocs.samples.push_back({base, p.allocations});
    alloc_bytes.samples.push_back({base, p.allocated_bytes});
    freed.samples.push_back({base, p.freed_bytes});
    in_use.samples.push_back({base, p.device_in_use});
    failures.samples.push_back({base, p.allocation_failures});
    pinned.samples.push_back({base, p.pinned_in_use});
    for (const auto& [func, t] : p.syncs) {
      const Labels l = with(base, {{"function", function_name(func)}});
      syncs.samples.push_back({l, t.count});
      sync_seconds.samples.push_back({l, t.seconds});
    }
    for (const auto& [func, n] : p.errors) errors.samples.push_back({with(base, {{"function", function_name(func)}}), n});
    const bool tracked = p.cycles.tracked();
    const double ratio = tracked ? p.cycles.observed_ratio() : p.observed_ratio;
    const bool is_exact = tracked ? p.cycles.exact() : p.high_rate_weight == 1 && p.observed_ratio == 1;
    observed.samples.push_back({base, ratio});
    exact.samples.push_back({base, is_exact ? 1.0 : 0.0});
    // Scaled by a fixed weight, nothing says what the unobserved time held: its whole share,
    // 1 - 1 / weight, may be off (observed_cycles.h's rule for an off-period with no on-period after it).
    const double bound = is_exact ? 0
                         : !tracked ? std::max(0.0, 1 - 1 / p.high_rate_weight)
                         : p.high.calls > 0 ? p.cycles.error_calls() / p.high.calls
                                            : 0;
    error.samples.push_back({base, bound});
    hits.samples.push_back({base, double(p.hits.entries + p.hits.returns)});
    p.nccl.append(base, {&nccl[0], &nccl[1]});
  }
  for (auto* f : {&launches, &copies, &copy_bytes, &copy_seconds, &allocs, &alloc_bytes, &freed, &in_use, &failures,
                  &pinned, &syncs, &sync_seconds, &errors, &observed, &exact, &error, &hits})
    s.families.push_back(std::move(*f));
  for (auto& f : nccl) s.families.push_back(std::move(f));

  // GPUs: the latest reading of each.
  auto g = [&](const char* name, const char* help, const char* unit, MetricType type = MetricType::Gauge) {
    s.families.push_back(family(name, help, unit, type));
    return s.families.size() - 1;
  };
  const size_t util = g("gpuscope_gpu_utilization_ratio", "Share of the last sample period a kernel ran on the GPU (NVML)", "ratio");
  const size_t mem_util = g("gpuscope_gpu_memory_utilization_ratio", "Share of the last sample period device memory was read or written (NVML)", "ratio");
  const size_t sm_active = g("gpuscope_gpu_sm_active_ratio", "Share of the SMs that had work since the last sample (NVML GPM)", "ratio");
  const size_t sm_occupancy = g("gpuscope_gpu_sm_occupancy_ratio", "Warps resident on the SMs, of the most they hold (NVML GPM)", "ratio");
  const size_t tensor_active = g("gpuscope_gpu_tensor_active_ratio", "Share of the time the tensor cores were at work (NVML GPM)", "ratio");
  const size_t dram_active = g("gpuscope_gpu_dram_active_ratio", "DRAM bandwidth used, of its peak (NVML GPM)", "ratio");
  const size_t mem_used = g("gpuscope_gpu_memory_used_bytes", "Device memory in use (NVML)", "bytes");
  const size_t mem_total = g("gpuscope_gpu_memory_total_bytes", "Device memory (NVML)", "bytes");
  const size_t power = g("gpuscope_gpu_power_watts", "Power draw (NVML)", "watts");
  const size_t power_limit = g("gpuscope_gpu_power_limit_watts", "Enforced power limit (NVML)", "watts");
  const size_t temp = g("gpuscope_gpu_temperature_celsius", "GPU temperature (NVML)", "celsius");
  const size_t sm_clock = g("gpuscope_gpu_sm_clock_hertz", "SM clock (NVML)", "hertz");
  const size_t mem_clock = g("gpuscope_gpu_memory_clock_hertz", "Memory clock (NVML)", "hertz");
  const size_t throttle = g("gpuscope_gpu_throttle_reasons", "Clock throttle reasons, NVML's bit mask", "");
  const size_t throttled = g("gpuscope_gpu_throttled", "1 while the clocks are held back for this reason (NVML)", "");
  const size_t tx = g("gpuscope_gpu_pcie_transmit_bytes_per_second", "PCIe transmit throughput (NVML)", "bytes_per_second");
  const size_t rx = g("gpuscope_gpu_pcie_receive_bytes_per_second", "PCIe receive throughput (NVML)", "bytes_per_second");
  const size_t ecc = g("gpuscope_gpu_ecc_errors_total", "ECC errors since the driver loaded (volatile counts)", "", MetricType::Counter);
  const size_t xid = g("gpuscope_gpu_xid_errors_total", "XID error events seen, by XID", "", MetricType::Counter);
  const size_t proc_mem = g("gpuscope_gpu_process_memory_used_bytes", "Device memory a process uses (NVML)", "bytes");
  const size_t proc_sm = g("gpuscope_gpu_process_sm_utilization_ratio", "Share of time a process's kernels ran (NVML)", "ratio");
  for (const auto& [index, gpu] : gpus_) {
    const Labels l{{"gpu", std::to_string(index)}, {"uuid", gpu.device.uuid}, {"model", gpu.device.name}};
    auto put = [&](size_t fam, double v) { s.families[fam].samples.push_back({l, v}); };
    const auto& x = gpu.sample;
    if (x.gpu_util) put(util, *x.gpu_util / 100.0);
    if (x.mem_util) put(mem_util, *x.mem_util / 100.0);
    if (x.sm_active) put(sm_active, *x.sm_active / 100.0);
    if (x.sm_occupancy) put(sm_occupancy, *x.sm_occupancy / 100.0);
    if (x.tensor_active) put(tensor_active, *x.tensor_active / 100.0);
    if (x.dram_active) put(dram_active, *x.dram_active / 100.0);
    if (x.mem_used) put(mem_used, double(*x.mem_used));
    if (gpu.device.memory_total) put(mem_total, double(gpu.device.memory_total));
    if (x.power_mw) put(power, *x.power_mw / 1000.0);
    if (gpu.device.power_limit_mw) put(power_limit, gpu.device.power_limit_mw / 1000.0);
    if (x.temperature_c) put(temp, *x.temperature_c);
    if (x.sm_clock_mhz) put(sm_clock, *x.sm_clock_mhz * 1e6);
    if (x.mem_clock_mhz) put(mem_clock, *x.mem_clock_mhz * 1e6);
    if (x.throttle_reasons) {
      put(throttle, double(*x.throttle_reasons));
      for (const auto& reason : gpu::throttle_reason_names(*x.throttle_reasons))
        s.families[throttled].samples.push_back({with(l, {{"reason", reason}}), 1});
    }
    if (x.pcie_tx_kbs) put(tx, *x.pcie_tx_kbs * 1024.0);
    if (x.pcie_rx_kbs) put(rx, *x.pcie_rx_kbs * 1024.0);
    if (x.ecc_corrected) s.families[ecc].samples.push_back({with(l, {{"type", "corrected"}}), double(*x.ecc_corrected)});
    if (x.ecc_uncorrected)
      s.families[ecc].samples.push_back({with(l, {{"type", "uncorrected"}}), double(*x.ecc_uncorrected)});
    for (const auto& [code, n] : gpu.xids) s.families[xid].samples.push_back({with(l, {{"xid", std::to_string(code)}}), n});
  }
  for (auto it = gpu_processes_.begin(); it != gpu_processes_.end();) {
    const auto& [key, x] = *it;
    const auto p = processes_.find(x.pid);
    const bool alive = discover::process_exists(static_cast<pid_t>(x.pid));
    if (!alive) {
      it = gpu_processes_.erase(it);
      continue;
    }
    Labels l = p != processes_.end() ? p->second.labels()
                                     : Labels{{"pid", std::to_string(x.pid)}, {"comm", discover::read_comm(pid_t(x.pid))}};
    l.insert(l.begin(), {"gpu", std::to_string(key.first)});
    if (x.used_memory) s.families[proc_mem].samples.push_back({l, double(*x.used_memory)});
    if (x.sm_util) s.families[proc_sm].samples.push_back({l, *x.sm_util / 100.0});
    ++it;
  }
  for (auto& f : extra) s.families.push_back(std::move(f));

  // Exited processes are shown once more after their exit (their last counts), then dropped.
  for (auto& [pid, p] : processes_)
    if (p.exited) p.reported_exit = true;
  return s;
}

// A frame as take_profiles names it: a name known now, or a place in a file to symbolize once
// the lock is let go.
struct Aggregator::PendingFrame {
  std::string name;  // set: the frame's name
  std::string open_path, path, build_id;
  uint64_t offset = 0;
  bool deferred = false;  // named file+offset: its file's symbols were passed over too recently
  std::string python_file;
  int64_t python_line = 0;
  uint64_t key = 0;  // frame_key: kept in frame_names_ once named
  int64_t python_id = 0;  // kept in python_labels_ once labelled
};

uint64_t Aggregator::frame_key(int64_t module_id, uint64_t offset) {
  constexpr int kOffsetBits = 44;  // 16 TiB into a file
  if (module_id <= 0 || uint64_t(module_id) >= (1ull << (64 - kOffsetBits)) || offset >= (1ull << kOffsetBits))
    return 0;
  return (uint64_t(module_id) << kOffsetBits) | offset;
}

std::vector<Aggregator::PendingFrame> Aggregator::pending_frames(
    uint32_t pid, const std::vector<store::StoredFrame>& frames,
    const std::unordered_map<int64_t, report::PythonFrameRow>& python_rows) const {
  std::vector<PendingFrame> out;
  out.reserve(frames.size());
  for (auto f = frames.rbegin(); f != frames.rend(); ++f) {  // outermost first
    // Named as the report names a stored frame (report::classify_frame); native frames are
    // symbolised after, in one pass per file.
    const bool python = f->module_id == python_module_;
    const uint64_t key = python ? 0 : frame_key(f->module_id, f->offset);
    if (key)
      if (auto known = frame_names_.find(key); known != frame_names_.end()) {
        out.push_back(PendingFrame{.name = known->second});
        continue;
      }
    if (python)
      if (auto known = python_labels_.find(int64_t(f->offset)); known != python_labels_.end()) {
        const PythonLabel& l = known->second;
        out.push_back(PendingFrame{.name = l.name, .python_file = l.file, .python_line = l.line});
        continue;
      }
    report::StoredFrameRow row;
    row.ip = f->ip;
    row.offset = f->offset;
    if (f->module_id > 0 && size_t(f->module_id) <= modules_.size()) {
      const Module& m = modules_[size_t(f->module_id) - 1];
      row.in_file = true;
      row.path = m.path;
      row.build_id = m.build_id;
      if (auto sym = symbols_.find({f->module_id, f->offset}); sym != symbols_.end()) row.recorded_name = &sym->second;
      if (f->module_id == python_module_)
        if (auto py = python_rows.find(int64_t(f->offset)); py != python_rows.end()) row.python = &py->second;
    }
    const report::NamedFrame named = report::classify_frame(row);
    PendingFrame p;
    if (named.kind == report::NamedFrame::Kind::Native) {
      p.open_path = discover::path_in_target(static_cast<pid_t>(pid), row.path);
      p.path = row.path;
      p.build_id = row.build_id;
      p.offset = row.offset;
      p.key = key;
    } else {
      p.name = report::frame_label(named, true, /*addresses=*/true);
      if (row.python) {
        p.python_file = row.python->file;
        p.python_line = row.python->line;
        p.python_id = int64_t(f->offset);
      }
    }
    out.push_back(std::move(p));
  }
  return out;
}

void Aggregator::forget_names_of_old_stacks() {
  // Names of stacks from before the table was last emptied are of no use any more.
  if (names_epoch_ != stack_epoch() || names_cache_.size() >= limits_.max_stacks) {
    names_cache_.clear();
    python_labels_.clear();
    names_epoch_ = stack_epoch();
  }
}

std::vector<ProcessProfile> Aggregator::take_profiles(Take how) {
  const bool named = how == Take::Named;
  // One caller at a time (the exporter, the memory limit, a request); names_cache_ is theirs.
  std::lock_guard profiles_lock(profile_mu_);
  forget_names_of_old_stacks();
  const uint64_t now = realtime_ns();
  TakenProfiles t;
  {
    std::lock_guard lock(mu_);
    for (auto& [pid, p] : processes_) {
      if (p.cpu_window.empty() && p.launch_window.empty()) {
        p.window_start_unix_ns = now;
        continue;
      }
      TakenWindow w;
      w.prof.pid = pid;
      w.prof.comm = p.comm;
      w.prof.labels = p.labels();
      w.prof.from_unix_ns = p.window_start_unix_ns;
      w.prof.until_unix_ns = now;
      w.cpu.swap(p.cpu_window);
      w.launches.swap(p.launch_window);
      p.window_start_unix_ns = now;
      if (how == Take::Dropped) continue;
      // The frames of the stacks to name (kept unnamed: all of them, since the names known now
      // may be forgotten by then), and the Python frames in them.
      for (const auto* window : {&w.cpu, &w.launches})
        for (const auto& [stack_id, n] : *window) {
          if ((named && names_cache_.contains(stack_id)) || t.stacks.contains(stack_id)) continue;
          const auto stack = stacks_.find(stack_id);
          if (stack == stacks_.end()) continue;
          t.stacks.emplace(stack_id, std::pair{pid, stack->second});
          for (const auto& f : stack->second)
            if (f.module_id == python_module_ && !(named && python_labels_.contains(int64_t(f.offset))))
              if (auto py = python_frames_.find(int64_t(f.offset)); py != python_frames_.end())
                t.python.try_emplace(py->first, py->second);
        }
      t.windows.push_back(std::move(w));
    }
    // Bounded: once half the stack table is used, start a new one. Ids handed out before are
    // void from here (the pipeline sees the new epoch and forgets the ones it cached); this
    // window's stacks were copied above.
    if (stacks_.size() >= limits_.max_stacks / 2) {
      stacks_.clear();
      stack_ids_.clear();
      kernel_activity_.clear();
      python_frames_.clear();
      python_ids_.clear();
      stack_epoch_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (how == Take::Kept) {
    unnamed_ = std::move(t);
    return {};
  }
  unnamed_.reset();
  if (how == Take::Dropped) return {};
  return name_windows(std::move(t));
}

std::optional<std::vector<ProcessProfile>> Aggregator::name_unnamed() {
  std::lock_guard profiles_lock(profile_mu_);
  if (!unnamed_) return std::nullopt;
  forget_names_of_old_stacks();
  TakenProfiles t = std::move(*unnamed_);
  unnamed_.reset();
  return name_windows(std::move(t));
}

std::vector<ProcessProfile> Aggregator::name_windows(TakenProfiles t) {
  const int64_t period = cpu_profile_hz_ > 0 ? 1'000'000'000 / cpu_profile_hz_ : 1;
  // Frames resolved as far as the tables go (under the lock: modules and recorded symbols; the
  // pipeline waits meanwhile) and symbolized after (without it).
  std::unordered_map<int64_t, std::vector<PendingFrame>> pending;
  {
    std::lock_guard lock(mu_);
    for (const auto& [stack_id, stack] : t.stacks)
      if (!names_cache_.contains(stack_id)) pending.emplace(stack_id, pending_frames(stack.first, stack.second, t.python));
  }
  auto& windows = t.windows;
  // Each file's addresses named in one pass over its symbols (see elf::name_offsets).
  std::map<std::tuple<std::string, std::string, std::string>, std::vector<PendingFrame*>> by_file;
  for (auto& [stack_id, frames] : pending)
    for (auto& f : frames)
      if (f.name.empty()) by_file[{f.open_path, f.path, f.build_id}].push_back(&f);
  if (known_function_count_ >= kMaxKnownFunctions) {
    known_functions_.clear();
    known_function_count_ = 0;
  }
  if (frame_names_.size() >= kMaxFrameNames) frame_names_.clear();
  for (auto& [file, frames] : by_file) {
    const auto& [open_path, path, build_id] = file;
    auto& known = known_functions_[{path, build_id}];
    // (clang 14, which builds the fuzz targets, cannot capture a structured binding)
    auto name_frame = [&, &shown_path = path](PendingFrame& f, const std::string& name) {
      f.name = report::native_label(name, shown_path, f.offset);
    };
    std::vector<PendingFrame*> unknown;
    for (auto* f : frames) {
      auto it = known.upper_bound(f->offset);
      if (it != known.begin() && f->offset < std::prev(it)->second.first)
        name_frame(*f, std::prev(it)->second.second);
      else
        unknown.push_back(f);
    }
    if (unknown.empty()) continue;
    const uint64_t now_ns = monotonic_ns();
    auto [last_pass, first_pass] = last_symbol_pass_.try_emplace({path, build_id});
    const uint64_t wait_ns = std::min(kSymbolPassMaxWaitNs, last_pass->second.cost_ns * limits_.symbol_pass_spacing);
    if (!first_pass && (now_ns - last_pass->second.at_ns < wait_ns || now_ns < next_symbol_pass_ns_)) {
      for (auto* f : unknown) {
        name_frame(*f, "");
        f->deferred = true;
      }
      deferred_frames_ += unknown.size();
      continue;
    }
    last_pass->second.at_ns = now_ns;
    std::vector<uint64_t> offsets;
    for (const auto* f : unknown) offsets.push_back(f->offset);
    std::vector<elf::OffsetName> names;
    bool read = false;
    for (const auto& candidate : {open_path, path}) {
      try {
        names = elf::name_offsets(candidate, build_id, offsets);
        read = true;
        break;
      } catch (const std::exception&) {
        // The process is gone (its root with it), or the file changed: try the host's path.
      }
    }
    last_pass->second.cost_ns = monotonic_ns() - now_ns;
    next_symbol_pass_ns_ = now_ns + last_pass->second.cost_ns * (limits_.symbol_pass_spacing_all + 1);
    names.resize(unknown.size());
    for (size_t i = 0; i < unknown.size(); ++i) {
      auto& n = names[i];
      if (read && !build_id.empty()) {
        // Remembered (a file told apart from another at its path by its build id): a function
        // over its range, or that this offset is in none.
        const uint64_t start = n.name.empty() ? unknown[i]->offset : n.start;
        const uint64_t end = n.name.empty() ? unknown[i]->offset + 1 : n.end;
        if (known.try_emplace(start, end, n.name).second) ++known_function_count_;
      }
      name_frame(*unknown[i], n.name);
    }
  }
  std::unordered_map<std::string, std::pair<std::string, int64_t>> sources;
  std::vector<int64_t> name_again;  // stacks with deferred frames: named for this window only
  for (auto& [stack_id, frames] : pending) {
    std::vector<std::string> names;
    bool deferred = false;
    for (auto& f : frames) {
      if (!f.python_file.empty()) sources.try_emplace(f.name, f.python_file, f.python_line);
      if (f.key && !f.deferred) frame_names_.try_emplace(f.key, f.name);
      if (f.python_id) python_labels_.try_emplace(f.python_id, PythonLabel{f.name, f.python_file, f.python_line});
      names.push_back(std::move(f.name));
      deferred |= f.deferred;
    }
    names_cache_[stack_id] = std::move(names);
    if (deferred) name_again.push_back(stack_id);
  }

  std::vector<ProcessProfile> out;
  for (auto& w : windows) {
    const std::string root = fmt::format("{} ({})", w.prof.comm, w.prof.pid);
    auto fill = [&](report::FlameData& d, const std::unordered_map<int64_t, int64_t>& window, int64_t weight) {
      for (const auto& [stack_id, n] : window) {
        const auto names = names_cache_.find(stack_id);
        if (names == names_cache_.end()) continue;  // from before the table was emptied
        std::vector<std::string> path{root};
        path.insert(path.end(), names->second.begin(), names->second.end());
        for (const auto& frame : names->second)
          if (auto src = sources.find(frame); src != sources.end()) d.sources.insert(*src);
        d.stacks[path] += n * weight;
      }
    };
    for (auto* d : {&w.prof.cpu, &w.prof.launches}) {
      d->time_nanos = int64_t(w.prof.from_unix_ns);
      d->duration_nanos = int64_t(w.prof.until_unix_ns - w.prof.from_unix_ns);
    }
    w.prof.cpu.sample_type = "cpu";
    w.prof.cpu.unit = "nanoseconds";
    w.prof.cpu.period = period;
    fill(w.prof.cpu, w.cpu, period);
    w.prof.launches.sample_type = "launches";
    w.prof.launches.unit = "count";
    fill(w.prof.launches, w.launches, 1);
    out.push_back(std::move(w.prof));
  }
  for (int64_t stack_id : name_again) names_cache_.erase(stack_id);
  return out;
}

}  // namespace gpuscope::agent
