#include "diagnose/steps.h"

#include <algorithm>
#include <map>
#include <unordered_map>

namespace gpuscope::diagnose {
namespace {

// Consecutive calls of one kind are one step of the pattern (a loop of N launches of a kernel is
// one token), so that a step's length in tokens does not depend on how often the loop ran.
std::vector<Token> collapse(const std::vector<Token>& tokens) {
  std::vector<Token> out;
  out.reserve(tokens.size());
  for (const auto& t : tokens)
    if (out.empty() || out.back().key != t.key) out.push_back(t);
  return out;
}

double self_similarity(const std::vector<Token>& s, size_t period) {
  if (period == 0 || s.size() <= period) return 0;
  size_t same = 0;
  for (size_t i = 0; i + period < s.size(); ++i) same += s[i].key == s[i + period].key;
  return double(same) / double(s.size() - period);
}

}  // namespace

Steps find_steps(const std::vector<Token>& tokens, size_t min_steps, double min_similarity) {
  const auto seq = collapse(tokens);
  // Candidate periods: for each kind of call that comes at least min_steps times, the gap (in
  // tokens) that most of its occurrences are apart by.
  std::unordered_map<uint64_t, std::vector<size_t>> positions;
  for (size_t i = 0; i < seq.size(); ++i) positions[seq[i].key].push_back(i);
  struct Candidate {
    size_t period;
    uint64_t key;
    double regularity;
  };
  std::unordered_map<uint64_t, bool> input;
  for (const auto& t : seq) input[t.key] = input[t.key] || t.input;
  std::vector<Candidate> candidates;
  size_t least_period = 0, input_count = 0;  // the period of the most frequent copy to the GPU
  for (const auto& [key, pos] : positions) {
    if (pos.size() < min_steps + 1) continue;
    std::map<size_t, size_t> gaps;
    for (size_t i = 1; i < pos.size(); ++i) ++gaps[pos[i] - pos[i - 1]];
    const auto mode = std::max_element(gaps.begin(), gaps.end(),
                                       [](const auto& a, const auto& b) { return a.second < b.second; });
    const double regularity = double(mode->second) / double(pos.size() - 1);
    if (regularity < 0.6) continue;
    candidates.push_back({mode->first, key, regularity});
    if (input[key] && pos.size() > input_count) least_period = mode->first, input_count = pos.size();
  }
  std::erase_if(candidates, [&](const Candidate& c) { return c.period < least_period; });
  // The shortest period the sequence follows: a longer one that it also follows is a multiple
  // (every other step), and a shorter one it does not follow is a call made twice a step.
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.period != b.period ? a.period < b.period : a.regularity > b.regularity;
  });
  Steps best;
  for (const auto& c : candidates) {
    const double sim = self_similarity(seq, c.period);
    if (sim < min_similarity) continue;
    // Among the calls that come once a period, the most regular starts each step.
    Steps s;
    s.period = c.period;
    s.similarity = sim;
    s.anchor_key = c.key;
    for (size_t i : positions[c.key]) s.starts.push_back(seq[i].ts_ns);
    if (s.count() >= min_steps) {
      best = std::move(s);
      break;
    }
  }
  return best;
}

}  // namespace gpuscope::diagnose
