#include "advise/copy_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>

#include "common/error.h"

namespace gpuscope::advise {
namespace {

// Interpolates y over the rows' sizes, log-log between two measured sizes; past the largest, at
// the largest's rate (time grows with the bytes), below the smallest, the smallest's time.
template <typename Get>
double interpolate(const std::vector<CopyModel::Row>& rows, double bytes, Get y) {
  if (rows.empty() || bytes <= 0) return 0;
  if (bytes <= rows.front().bytes) return y(rows.front());
  if (bytes >= rows.back().bytes) return y(rows.back()) * bytes / rows.back().bytes;
  const auto hi = std::upper_bound(rows.begin(), rows.end(), bytes,
                                   [](double b, const CopyModel::Row& r) { return b < r.bytes; });
  const auto lo = std::prev(hi);
  const double y0 = std::max(y(*lo), 1e-3), y1 = std::max(y(*hi), 1e-3);
  const double t = std::log(bytes / lo->bytes) / std::log(hi->bytes / lo->bytes);
  return std::exp(std::log(y0) + t * (std::log(y1) - std::log(y0)));
}

}  // namespace

double CopyModel::copy_us(double bytes, bool to_device, bool pinned) const {
  return interpolate(rows, bytes, [&](const Row& r) {
    return to_device ? (pinned ? r.h2d_pinned_us : r.h2d_pageable_us) : (pinned ? r.d2h_pinned_us : r.d2h_pageable_us);
  });
}

double CopyModel::register_us(double bytes) const {
  return interpolate(rows, bytes, [](const Row& r) { return r.register_us; });
}

double CopyModel::register_untouched_us(double bytes) const {
  return interpolate(rows, bytes, [](const Row& r) { return r.register_untouched_us; });
}

double CopyModel::unregister_us(double bytes) const {
  return interpolate(rows, bytes, [](const Row& r) { return r.unregister_us; });
}

CopyModel builtin_copy_model() {
  CopyModel m;
  m.source = "built in: NVIDIA H200, PCIe Gen5, driver 580 (bench/pin/copy_table, 2026-11-29)";
  // bytes, H2D pageable, H2D pinned, D2H pageable, D2H pinned, register (touched), unregister,
  // register (untouched): µs
  m.rows = {
      {4096, 7.1, 8.6, 9.9, 7.4, 190.9, 147.8, 145.8},
      {16384, 10.2, 12.4, 12.3, 8.3, 138.5, 113.2, 148.1},
      {65536, 17.8, 10.8, 20.0, 9.4, 136.7, 103.3, 160.4},
      {262144, 30.6, 14.1, 44.7, 12.8, 314.9, 131.1, 278.2},
      {1048576, 95.3, 28.2, 139.8, 27.7, 187.3, 190.9, 677.4},
      {4194304, 358.8, 87.7, 450.0, 84.5, 886.2, 299.2, 2738.6},
      {16777216, 1327.5, 320.8, 1676.7, 311.0, 1467.8, 488.8, 8787.5},
      {67108864, 9709.1, 1270.3, 6539.3, 1221.7, 3506.2, 1463.6, 30088.2},
      {268435456, 41761.7, 4865.2, 26327.2, 4871.7, 12696.2, 5095.1, 115386.0},
      {1073741824, 159659.1, 20698.2, 71164.0, 19406.0, 47907.7, 18243.3, 372666.6},
  };
  return m;
}

CopyModel load_copy_model(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot read the copy table {}: make one with build/bench/copy_table > FILE", path);
  std::map<double, CopyModel::Row> by;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty() || line[0] == '#') continue;
    double bytes = 0, a = 0, b = 0, c = 0, d = 0, e = 0, f = 0;
    char dir[8] = {};
    if (std::sscanf(line.c_str(), "%lf reg: touched %lf us, untouched %lf us; unregister %lf us", &bytes, &a, &b, &c) ==
        4) {
      by[bytes].bytes = bytes;
      by[bytes].register_us = a;
      by[bytes].register_untouched_us = b;
      by[bytes].unregister_us = c;
    } else if (std::sscanf(line.c_str(), "%lf %7s %lf %lf %lf %lf %lf %lf", &bytes, dir, &a, &b, &c, &d, &e, &f) >= 5) {
      auto& r = by[bytes];
      r.bytes = bytes;
      if (std::string(dir) == "H2D")
        r.h2d_pageable_us = a, r.h2d_pinned_us = b;
      else if (std::string(dir) == "D2H")
        r.d2h_pageable_us = a, r.d2h_pinned_us = b;
    }
    // Anything else (the header, `time`'s lines) is not the table's.
  }
  CopyModel m;
  m.source = path;
  for (const auto& [bytes, r] : by)
    if (r.h2d_pageable_us > 0 && r.h2d_pinned_us > 0 && r.d2h_pageable_us > 0 && r.d2h_pinned_us > 0 &&
        r.register_us > 0)
      m.rows.push_back(r);
  if (m.rows.size() < 2)
    throw Error("{} holds {} complete sizes of copy_table's output (H2D, D2H and reg lines): it needs 2 or more; "
                "make it with build/bench/copy_table > FILE",
                path, m.rows.size());
  return m;
}

}  // namespace gpuscope::advise
