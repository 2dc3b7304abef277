// What the stack resolver needs of the kernel side: kernel stacks captured into BPF stack maps
// (two generations, recycled), and the maps that remember which user and Python stacks were
// already sent (so that a forgotten one is sent again). A narrow seam, so that the pipeline can
// be driven by captured records without BPF (tests/unit/test_pipeline_replay.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "attach/bpf_session.h"

namespace gpuscope::record {

class StackMaps {
 public:
  virtual ~StackMaps() = default;
  // A kernel stack's return addresses, innermost first (empty: no longer held).
  virtual std::vector<uint64_t> kernel_stack(int32_t id) const = 0;
  // Entries each of the two kernel-stack maps holds (0: no kernel stacks are captured).
  virtual uint32_t kernel_stack_entries() const = 0;
  // Captures go to the other map from now on; returns the generation now current.
  virtual int flip_kernel_stacks() = 0;
  virtual void clear_kernel_stacks(int generation) = 0;
  // The BPF side sends these user stacks (GS_REC_NATIVE_STACK) again when next seen.
  virtual void forget_native_stacks(const std::vector<uint64_t>& ids) = 0;
  // The BPF side sends every Python stack again when next seen.
  virtual void forget_python_stacks() = 0;
};

// The real ones, in a BPF session.
class BpfStackMaps final : public StackMaps {
 public:
  explicit BpfStackMaps(attach::BpfSession& bpf) : bpf_(bpf) {}
  std::vector<uint64_t> kernel_stack(int32_t id) const override { return bpf_.stack(id); }
  uint32_t kernel_stack_entries() const override { return bpf_.stack_map_entries(); }
  int flip_kernel_stacks() override { return bpf_.flip_stack_generation(); }
  void clear_kernel_stacks(int generation) override { bpf_.clear_stacks(generation); }
  void forget_native_stacks(const std::vector<uint64_t>& ids) override { bpf_.forget_native_stacks(ids); }
  void forget_python_stacks() override { bpf_.forget_python_stacks(); }

 private:
  attach::BpfSession& bpf_;
};

}  // namespace gpuscope::record
