#include "diagnose/contention.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "diagnose/findings.h"

namespace gpuscope::diagnose {
namespace {

// The link is loaded by others as findings.h's pcie_loaded_by_others says; quiet while the
// others' share stays under kQuietBytesPerS (or kQuietShare of their load, below).
constexpr double kQuietBytesPerS = 1e9, kQuietShare = 0.1;
// Another process computes on the GPU from this share of its SMs' time: the steps it slows are
// gpu_contention's, whatever the link carried.
constexpr double kComputingShare = 0.05;
// Each side of the comparison needs this many steps; the loaded side this many readings (a load
// that lasted), the quiet side one: NVML's PCIe counters are read once a second (gpu/nvml.cpp),
// and a tenant that starts a second into the job leaves one.
constexpr size_t kMinSteps = 8, kMinLoadedReadings = 2;
// Loaded steps slower than the quiet ones by less than this are no evidence.
constexpr double kMinSlowdown = 0.03;
// Per-process readings of another tenant this close to a PCIe reading tell whether it was on the
// GPU then (NVML lists processes less often than it reads the counters).
constexpr uint64_t kTenantNearNs = 1'000'000'000;

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

enum class Link { Unknown, Loaded, Quiet };

}  // namespace

std::optional<PcieComparison> compare_pcie_load(const std::vector<std::pair<uint64_t, uint64_t>>& steps,
                                                const std::vector<double>& copy_bytes,
                                                const std::vector<GpuReading>& gpu,
                                                const std::vector<GpuProcessReading>& processes,
                                                const std::function<bool(uint32_t)>& own) {
  std::vector<const GpuReading*> readings;
  for (const auto& r : gpu)
    if (r.pcie_bytes_per_s >= 0) readings.push_back(&r);
  if (readings.size() < kMinLoadedReadings + 1 || steps.size() < 2 * kMinSteps) return std::nullopt;
  std::vector<double> gaps;
  for (size_t i = 1; i < readings.size(); ++i) gaps.push_back(double(readings[i]->ts_ns - readings[i - 1]->ts_ns));
  const double period = median(gaps);
  if (period <= 0) return std::nullopt;

  std::vector<uint64_t> mids;
  for (const auto& [s, e] : steps) mids.push_back(s + (e - s) / 2);
  // Each reading: the job's own copy rate over the period before it (each step's bytes spread
  // over its span), the others' load beside it.
  std::vector<Link> link(readings.size(), Link::Unknown);
  std::vector<double> external(readings.size(), 0), own_rate(readings.size(), 0);
  std::vector<double> loads;         // the others' share at the loaded readings
  std::vector<size_t> maybe_quiet;   // readings neither loaded nor with a tenant computing
  size_t first_step = 0, tenant_from = 0;
  for (size_t i = 0; i < readings.size(); ++i) {
    const uint64_t ts = readings[i]->ts_ns;
    const uint64_t since = ts - std::min<uint64_t>(ts, uint64_t(period));
    while (first_step < steps.size() && steps[first_step].second <= since) ++first_step;
    double bytes = 0;
    for (size_t j = first_step; j < steps.size() && steps[j].first < ts; ++j) {
      const auto [s, e] = steps[j];
      if (e <= s) continue;
      bytes += copy_bytes[j] * double(std::min(e, ts) - std::max(s, since)) / double(e - s);
    }
    own_rate[i] = bytes / (period / 1e9);
    external[i] = readings[i]->pcie_bytes_per_s - own_rate[i];
    bool tenant = false, computing = false;
    while (tenant_from < processes.size() && processes[tenant_from].ts_ns + kTenantNearNs < ts) ++tenant_from;
    for (size_t j = tenant_from; j < processes.size() && processes[j].ts_ns <= ts + kTenantNearNs; ++j) {
      if (own(processes[j].pid)) continue;
      tenant = true;
      computing |= processes[j].sm >= kComputingShare;
    }
    if (computing) continue;
    if (tenant && pcie_loaded_by_others(external[i], own_rate[i])) {
      link[i] = Link::Loaded;
      loads.push_back(external[i]);
    } else {
      maybe_quiet.push_back(i);
    }
  }
  // Quiet: the others' share of the link under kQuietBytesPerS, or under a tenth of what they
  // moved while it was loaded (a tenant's own start-up copies before it loads the link in full).
  const double quiet_below = loads.empty() ? kQuietBytesPerS : std::max(kQuietBytesPerS, kQuietShare * median(loads));
  for (size_t i : maybe_quiet)
    if (external[i] < quiet_below) link[i] = Link::Quiet;

  // A reading tells the link's state at its instant only (NVML samples it for 20 ms): a step
  // takes the state that the readings on both sides of its middle agree on; one before the first
  // reading or after the last, that reading's, within a period of it. Steps between a quiet
  // reading and a loaded one are left out: the load began somewhere in between.
  auto state_at = [&](uint64_t mid, size_t& at) {
    while (at < readings.size() && readings[at]->ts_ns <= mid) ++at;  // readings[at]: the first after
    const bool before = at > 0, after = at < readings.size();
    if (before && after) return link[at - 1] == link[at] ? std::pair{link[at], at} : std::pair{Link::Unknown, at};
    const size_t only = before ? at - 1 : at;
    const uint64_t ts = readings[only]->ts_ns;
    return double(ts > mid ? ts - mid : mid - ts) <= period ? std::pair{link[only], only}
                                                            : std::pair{Link::Unknown, only};
  };
  PcieComparison c;
  std::vector<double> loaded, quiet;
  std::vector<size_t> loaded_readings;
  double ext_sum = 0, own_sum = 0;
  size_t next_reading = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const double ms = double(steps[i].second - steps[i].first) / 1e6;
    c.all_ms += ms;
    const auto [state, near] = state_at(mids[i], next_reading);
    if (state == Link::Loaded) {
      loaded.push_back(ms);
      if (loaded_readings.empty() || loaded_readings.back() != near) {
        loaded_readings.push_back(near);
        ext_sum += external[near];
        own_sum += own_rate[near];
      }
      if (!c.from_ns) c.from_ns = steps[i].first;
      c.to_ns = steps[i].second;
    } else if (state == Link::Quiet) {
      quiet.push_back(ms);
    }
  }
  if (loaded.size() < kMinSteps || quiet.size() < kMinSteps || loaded_readings.size() < kMinLoadedReadings)
    return std::nullopt;
  c.all_steps = steps.size();
  c.loaded_steps = loaded.size();
  c.quiet_steps = quiet.size();
  c.loaded_ms = median(loaded);
  c.quiet_ms = median(quiet);
  if (c.loaded_ms < (1 + kMinSlowdown) * c.quiet_ms) return std::nullopt;
  c.excess_ms = double(loaded.size()) * (c.loaded_ms - c.quiet_ms);
  c.external_bytes_per_s = ext_sum / double(loaded_readings.size());
  c.own_bytes_per_s = own_sum / double(loaded_readings.size());
  return c;
}

Finding pcie_comparison_finding(const PcieComparison& c, const std::set<uint32_t>& tenants, const ProcessNames& names,
                                uint64_t origin_ns) {
  const std::string who = names_of(tenants, names);
  const double slower = c.loaded_ms / c.quiet_ms - 1;
  const double share = c.all_ms > 0 ? c.excess_ms / c.all_ms : 0;
  Finding f;
  f.cause = "pcie_contention";
  f.title = kPcieContentionTitle;
  f.share = share;
  f.ms_per_step = c.excess_ms / double(c.all_steps);
  f.from_ns = c.from_ns - std::min(c.from_ns, origin_ns);
  f.to_ns = c.to_ns - std::min(c.to_ns, origin_ns);
  f.evidence = fmt::format(
      "{} steps taken while PCIe carried {:.1f} GB/s beyond this process's {:.2f} GB/s took {:.2f} ms (median), {} "
      "longer than its {} steps without that load ({:.2f} ms); also on the GPU: {}",
      c.loaded_steps, c.external_bytes_per_s / 1e9, c.own_bytes_per_s / 1e9, c.loaded_ms, pct(slower),
      c.quiet_steps, c.quiet_ms, who.empty() ? "another process" : who);
  f.fix = kPcieContentionFix;
  f.confidence = slower >= 0.1 && c.loaded_steps >= 30 && c.quiet_steps >= 30 ? "high" : "medium";
  return f;
}

}  // namespace gpuscope::diagnose
