// Another tenant's copies over the GPU's PCIe link, told by what they did to the job's steps.
//
// NVML's PCIe counter covers the whole GPU. Where the job leaves the GPU idle, the share of that
// idle time the other tenant's load could explain is a finding of findings_from. A job whose GPU
// stays busy throughout loses its time elsewhere: its own copies wait for the link, its kernels
// for what those copies bring. The loss is then measured by comparison: the steps taken while the
// link carried much more than the job's own copies, against the job's steps without that load.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "diagnose/analysis.h"

namespace gpuscope::diagnose {

struct PcieComparison {
  size_t loaded_steps = 0, quiet_steps = 0;
  double loaded_ms = 0, quiet_ms = 0;          // medians of each
  double excess_ms = 0;                        // the loaded steps' time over the quiet median, summed
  double all_ms = 0;                           // every step's, summed
  size_t all_steps = 0;
  double external_bytes_per_s = 0, own_bytes_per_s = 0;  // while loaded: the others' and the job's
  uint64_t from_ns = 0, to_ns = 0;             // the first loaded step's start, the last one's end
};

// `steps`: the job's steps (start, end) in time order; `copy_bytes`: what the job copied in each;
// `own(pid)`: the job or one of its children. Nothing when the readings do not show both kinds of
// steps, enough of each, or the loaded ones were no slower.
std::optional<PcieComparison> compare_pcie_load(const std::vector<std::pair<uint64_t, uint64_t>>& steps,
                                                const std::vector<double>& copy_bytes,
                                                const std::vector<GpuReading>& gpu,
                                                const std::vector<GpuProcessReading>& processes,
                                                const std::function<bool(uint32_t)>& own);

// The finding the comparison makes (its share: the loaded steps' excess over all the steps').
Finding pcie_comparison_finding(const PcieComparison& c, const std::set<uint32_t>& tenants,
                                const ProcessNames& names, uint64_t origin_ns);

}  // namespace gpuscope::diagnose
