// What a copy costs by host memory's kind on a machine: times of synchronous copies from pageable
// and from pinned memory by size and direction, and what registering and unregistering a buffer
// cost (bench/pin/copy_table.cu measures them; its output is what load_copy_model reads).
#pragma once

#include <string>
#include <vector>

namespace gpuscope::advise {

struct CopyModel {
  struct Row {
    double bytes = 0;
    double h2d_pageable_us = 0, h2d_pinned_us = 0, d2h_pageable_us = 0, d2h_pinned_us = 0;
    double register_us = 0;  // cudaHostRegister of pages already touched
    double unregister_us = 0;
    double register_untouched_us = 0;  // of pages never touched (registering makes them)
  };
  std::vector<Row> rows;  // by bytes, ascending
  std::string source;     // where the figures come from

  // A copy of `bytes`: interpolated between the sizes measured (log-log), a size beyond the
  // largest at the largest's bandwidth, one below the smallest at the smallest's time.
  double copy_us(double bytes, bool to_device, bool pinned) const;
  double register_us(double bytes) const;
  double register_untouched_us(double bytes) const;
  double unregister_us(double bytes) const;
  // Pinning a buffer of `bytes` in place for a while: registering it, then unregistering it.
  double pin_cost_us(double bytes) const { return register_us(bytes) + unregister_us(bytes); }
};

// Measured on an H200 (driver 580, PCIe Gen5; docs/validation/2026-11-29-gpu-session35).
CopyModel builtin_copy_model();
// bench/pin/copy_table's output; throws gpuscope::Error saying what is wrong with it.
CopyModel load_copy_model(const std::string& path);

}  // namespace gpuscope::advise
