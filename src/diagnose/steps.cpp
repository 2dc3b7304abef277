#include "diagnose/steps.h"

#include <algorithm>
#include <cmath>
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

// A loop that makes one kind of call (a kernel launched N times, then host work) has no pattern
// to find once its repeats are collapsed: its steps are the bursts of calls between the host's
// longer gaps, if the bursts are alike (as many calls, about as long).
Steps bursts(const std::vector<Token>& tokens, size_t min_steps) {
  if (tokens.size() < 2 * (min_steps + 1)) return {};
  std::vector<uint64_t> gaps;
  for (size_t i = 1; i < tokens.size(); ++i) gaps.push_back(tokens[i].ts_ns - tokens[i - 1].ts_ns);
  std::vector<uint64_t> sorted = gaps;
  std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
  constexpr uint64_t kMinGapNs = 50'000;
  const uint64_t cut = std::max(10 * sorted[sorted.size() / 2], kMinGapNs);
  // The first burst may have begun before the window: steps start after a gap.
  std::vector<size_t> first_calls;
  for (size_t i = 0; i < gaps.size(); ++i)
    if (gaps[i] >= cut) first_calls.push_back(i + 1);
  if (first_calls.size() < min_steps + 1) return {};
  std::map<size_t, size_t> calls_per_burst;
  std::vector<uint64_t> lengths;
  for (size_t b = 0; b + 1 < first_calls.size(); ++b) {
    ++calls_per_burst[first_calls[b + 1] - first_calls[b]];
    lengths.push_back(tokens[first_calls[b + 1]].ts_ns - tokens[first_calls[b]].ts_ns);
  }
  const auto mode = std::max_element(calls_per_burst.begin(), calls_per_burst.end(),
                                     [](const auto& a, const auto& b) { return a.second < b.second; });
  const double alike = double(mode->second) / double(lengths.size());
  std::nth_element(lengths.begin(), lengths.begin() + lengths.size() / 2, lengths.end());
  const double median = double(lengths[lengths.size() / 2]);
  size_t near = 0;
  for (uint64_t l : lengths) near += std::abs(double(l) - median) <= 0.5 * median;
  if (alike < 0.7 || double(near) / double(lengths.size()) < 0.7) return {};
  Steps s;
  s.period = mode->first;
  s.similarity = alike;
  s.anchor_key = tokens[first_calls.front()].key;
  for (size_t i : first_calls) s.starts.push_back(tokens[i].ts_ns);
  return s;
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
  if (!best.count() && seq.size() <= min_steps) return bursts(tokens, min_steps);
  return best;
}

}  // namespace gpuscope::diagnose
