// The rules that turn where a process's steps went (a Breakdown) into findings: each cause, the
// share of step time it explains, its evidence and the fix. Shared by the analysis of a record and
// the agent's live one (through analyze()).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "diagnose/analysis.h"

namespace gpuscope::diagnose {

constexpr double kMinShare = 0.05;  // a finding explains at least this share of a step
// NVML throttle reasons that mean the GPU was slowed against its will: hardware slowdown, thermal
// (software and hardware) and the power brake. The software power cap is left out: busy GPUs sit
// at it as a matter of course.
constexpr uint64_t kSlowdownReasons = 0x8 | 0x20 | 0x40 | 0x80;

std::string pct(double share);  // "42%"

// pcie_contention, weighed two ways (by the GPU's idle time here, by comparing steps in
// contention.h): another process's copies load the link when it carries 2 GB/s or more beyond the
// job's own copies, and twice as much as those.
inline constexpr char kPcieContentionTitle[] = "Another process's copies load this GPU's PCIe link";
inline constexpr char kPcieContentionFix[] =
    "Move the other tenant's transfers off this GPU (or schedule it elsewhere); keep the job's inputs on the GPU or "
    "copy them in fewer, larger transfers";
inline bool pcie_loaded_by_others(double external_bytes_per_s, double own_bytes_per_s) {
  return external_bytes_per_s >= 2e9 && external_bytes_per_s >= 2 * own_bytes_per_s;
}
// The processes, named, joined by commas.
std::string names_of(const std::set<uint32_t>& pids, const ProcessNames& names);
// The pid that accounts for most of `by`, with its share of the total.
std::pair<uint32_t, double> top(const std::map<uint32_t, double>& by);

// The findings `b` (the steps from..to, since the recording's start) shows, added to `out`; a
// cause already in `out` or in `have` is not added again.
void findings_from(Breakdown b, const ProcessNames& names, const ProcessEvidence& e, uint64_t from, uint64_t to,
                   bool telemetry, std::vector<Finding>& out, const std::set<std::string>& have);

// The driver's error reports (XIDs) about the process's GPU from the first step's start to
// `until_ns` (its exit: the report that ended it counts), as one finding; its share is the part of
// the steps' span after the first. A hardware fault (the GPU fallen off the bus, uncorrectable ECC,
// NVLink, GSP) is `fatal`: ranked first, whatever its share.
struct XidFinding {
  Finding finding;
  bool fatal = false;
};
std::optional<XidFinding> xid_finding(const std::vector<XidEvent>& xids, uint64_t first_step_ns, uint64_t last_step_ns,
                                      uint64_t until_ns, uint64_t origin_ns);

}  // namespace gpuscope::diagnose
