// What the agent exports, independent of the protocol: a snapshot of metric families, each a
// set of labelled samples. The Prometheus text writer and the OTLP encoder both read it.
//
// Names follow Prometheus's conventions: base units (seconds, bytes, ratios 0..1), counters
// end in `_total`. OTLP gets the same name without `_total`, as a monotonic cumulative sum.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gpuscope::agent {

enum class MetricType { Counter, Gauge };

using Labels = std::vector<std::pair<std::string, std::string>>;

struct MetricSample {
  Labels labels;
  double value = 0;
};

struct MetricFamily {
  std::string name;  // e.g. gpuscope_kernel_launches_total
  std::string help;
  std::string unit;  // "seconds", "bytes", "ratio", "" for counts: OTLP's unit ("s", "By", "1")
  MetricType type = MetricType::Gauge;
  std::vector<MetricSample> samples;
};

struct MetricSnapshot {
  uint64_t time_unix_ns = 0;        // when it was taken
  uint64_t start_time_unix_ns = 0;  // when the agent started: cumulative counters count from here
  std::vector<MetricFamily> families;
};

// Prometheus text exposition format 0.0.4: # HELP, # TYPE, one line per sample, label values
// escaped; families without samples are left out.
std::string to_prometheus_text(const MetricSnapshot& s);

// An OTLP ExportMetricsServiceRequest (opentelemetry/proto/collector/metrics/v1), protobuf
// encoded, for POST to an OTLP/HTTP endpoint's /v1/metrics with
// Content-Type: application/x-protobuf. `resource` becomes the Resource's attributes
// (host.name, service.name...); each sample's labels become its data point's attributes.
std::string to_otlp_metrics(const MetricSnapshot& s, const Labels& resource);

// An event exported as an OTLP log record (a diagnosis finding that began).
struct LogEvent {
  uint64_t time_unix_ns = 0;
  std::string name;  // the event's name, e.g. "gpuscope.finding"
  std::string body;  // for people
  Labels attributes;
};
// An ExportLogsServiceRequest, severity WARN, for POSTing to an OTLP collector's /v1/logs.
std::string to_otlp_logs(const std::vector<LogEvent>& events, const Labels& resource);

}  // namespace gpuscope::agent
