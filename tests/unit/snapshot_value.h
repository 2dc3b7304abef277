// For the agent's tests: a series' value in a metric snapshot.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <string>
#include <utility>

#include "agent/metrics.h"

namespace gpuscope::test {

// The sum of `name`'s samples whose labels include every pair of `match`; -1 if none.
inline double value(const agent::MetricSnapshot& s, const std::string& name,
                    std::initializer_list<std::pair<std::string, std::string>> match = {}) {
  double total = 0;
  bool found = false;
  for (const auto& f : s.families) {
    if (f.name != name) continue;
    for (const auto& sample : f.samples) {
      bool ok = true;
      for (const auto& m : match) ok = ok && std::find(sample.labels.begin(), sample.labels.end(), m) != sample.labels.end();
      if (ok) {
        total += sample.value;
        found = true;
      }
    }
  }
  return found ? total : -1;
}

}  // namespace gpuscope::test
