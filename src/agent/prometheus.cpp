#include <fmt/format.h>

#include <cmath>

#include "agent/metrics.h"

namespace gpuscope::agent {
namespace {

// Label values escape backslash, double quote and newline; HELP text backslash and newline.
void append_escaped(std::string& out, std::string_view v, bool quote) {
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (c == '"' && quote)
      out += "\\\"";
    else
      out += c;
  }
}

void append_value(std::string& out, double v) {
  if (std::isnan(v))
    out += "NaN";
  else if (std::isinf(v))
    out += v > 0 ? "+Inf" : "-Inf";
  else if (v == std::floor(v) && std::fabs(v) < 1e15)
    out += fmt::format("{}", static_cast<int64_t>(v));
  else
    out += fmt::format("{}", v);
}

}  // namespace

std::string to_prometheus_text(const MetricSnapshot& s) {
  std::string out;
  for (const auto& f : s.families) {
    if (f.samples.empty()) continue;
    out += "# HELP " + f.name + " ";
    append_escaped(out, f.help, false);
    out += "\n# TYPE " + f.name + (f.type == MetricType::Counter ? " counter\n" : " gauge\n");
    for (const auto& sample : f.samples) {
      out += f.name;
      if (!sample.labels.empty()) {
        out += '{';
        for (size_t i = 0; i < sample.labels.size(); ++i) {
          if (i) out += ',';
          out += sample.labels[i].first + "=\"";
          append_escaped(out, sample.labels[i].second, true);
          out += '"';
        }
        out += '}';
      }
      out += ' ';
      append_value(out, sample.value);
      out += '\n';
    }
  }
  return out;
}

}  // namespace gpuscope::agent
