// Iterations of a training or inference loop, found from the periodic pattern of its CUDA calls:
// the loop makes the same calls in the same order every step, so the sequence of what was called
// repeats with the step's length. Each step then starts at one call that comes once per step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpuscope::diagnose {

struct Token {
  uint64_t ts_ns = 0;
  uint64_t key = 0;  // what was called: the function, and the kernel or the copy's direction
  bool input = false;  // a copy to the GPU: a step holds its input's copy
};

struct Steps {
  // Step i is [starts[i], starts[i + 1]); the last start ends the last step.
  std::vector<uint64_t> starts;
  size_t period = 0;          // calls a step (consecutive repeats of one call counted once)
  double similarity = 0;      // share of calls equal to the call one period later
  uint64_t anchor_key = 0;    // the call each step starts at
  size_t count() const { return starts.size() < 2 ? 0 : starts.size() - 1; }
};

// Tokens in time order. Steps are found when at least `min_steps` of them repeat with a period
// that the whole sequence follows (similarity >= min_similarity); otherwise none (count() 0).
// A period is never shorter than the one a regular copy to the GPU comes at (a model's identical
// layers repeat within the step that copies their input once). A loop of one kind of call alone
// (the same kernel launched N times, then host work) is cut at the host's longer gaps instead,
// where the bursts between them are alike.
Steps find_steps(const std::vector<Token>& tokens, size_t min_steps = 3, double min_similarity = 0.7);

}  // namespace gpuscope::diagnose
