// OTLP metrics and log records, written field by field: the message and field numbers below are
// those of opentelemetry-proto's collector/metrics/v1/metrics_service.proto, metrics/v1/metrics.proto,
// collector/logs/v1/logs_service.proto, logs/v1/logs.proto, resource/v1/resource.proto and
// common/v1/common.proto (copies in tests/proto, where the unit tests decode our output with protoc
// against them).
#include <string_view>
#include <vector>

#include "agent/metrics.h"
#include "common/protobuf.h"

namespace gpuscope::agent {
namespace {

// Field numbers, grouped by message.
namespace field {
constexpr int kRequestResourceMetrics = 1;  // ExportMetricsServiceRequest.resource_metrics
constexpr int kResourceMetricsResource = 1;  // ResourceMetrics.resource
constexpr int kResourceMetricsScopeMetrics = 2;
constexpr int kResourceAttributes = 1;  // Resource.attributes
constexpr int kScopeMetricsScope = 1;   // ScopeMetrics.scope
constexpr int kScopeMetricsMetrics = 2;
constexpr int kScopeName = 1;  // InstrumentationScope
constexpr int kScopeVersion = 2;
constexpr int kKeyValueKey = 1;  // KeyValue
constexpr int kKeyValueValue = 2;
constexpr int kAnyValueString = 1;  // AnyValue.string_value
constexpr int kMetricName = 1;      // Metric
constexpr int kMetricDescription = 2;
constexpr int kMetricUnit = 3;
constexpr int kMetricGauge = 5;
constexpr int kMetricSum = 7;
constexpr int kDataPoints = 1;  // Gauge.data_points, Sum.data_points
constexpr int kSumTemporality = 2;
constexpr int kSumMonotonic = 3;
constexpr int kPointStartTime = 2;  // NumberDataPoint
constexpr int kPointTime = 3;
constexpr int kPointAsDouble = 4;
constexpr int kPointAttributes = 7;
constexpr int kLogTime = 1;  // LogRecord
constexpr int kLogSeverityNumber = 2;
constexpr int kLogSeverityText = 3;
constexpr int kLogBody = 5;
constexpr int kLogAttributes = 6;
constexpr int kLogObservedTime = 11;
constexpr int kLogEventName = 12;
}  // namespace field

constexpr uint64_t kSeverityWarn = 13;  // SEVERITY_NUMBER_WARN

constexpr uint64_t kTemporalityCumulative = 2;  // AGGREGATION_TEMPORALITY_CUMULATIVE

// Prometheus base-unit words to UCUM, as OTLP's `unit` wants them; counts are "1".
std::string_view ucum_unit(std::string_view unit) {
  struct Pair {
    std::string_view from, to;
  };
  static constexpr Pair kUnits[] = {
      {"", "1"},          {"ratio", "1"},       {"seconds", "s"}, {"bytes", "By"},
      {"celsius", "Cel"}, {"watts", "W"},       {"hertz", "Hz"},  {"bytes_per_second", "By/s"},
  };
  for (const auto& p : kUnits)
    if (p.from == unit) return p.to;
  return unit;
}

std::string_view otlp_name(const MetricFamily& f) {
  std::string_view name = f.name;
  constexpr std::string_view kTotal = "_total";
  if (f.type == MetricType::Counter && name.size() > kTotal.size() && name.ends_with(kTotal))
    name.remove_suffix(kTotal.size());
  return name;
}

void add_attributes(ProtoWriter& out, int field_number, const Labels& labels) {
  for (const auto& [key, value] : labels) {
    ProtoWriter any;
    any.field_bytes(field::kAnyValueString, value);
    ProtoWriter kv;
    kv.field_bytes(field::kKeyValueKey, key);
    kv.field_bytes(field::kKeyValueValue, any.str());
    out.field_bytes(field_number, kv.str());
  }
}

std::string encode_metric(const MetricFamily& f, const MetricSnapshot& s) {
  const bool sum = f.type == MetricType::Counter;
  ProtoWriter data;  // a Sum or a Gauge
  for (const auto& sample : f.samples) {
    ProtoWriter point;
    // A gauge's value is an instant; only a cumulative sum needs where its count started.
    if (sum) point.field_fixed64(field::kPointStartTime, s.start_time_unix_ns);
    point.field_fixed64(field::kPointTime, s.time_unix_ns);
    point.field_double(field::kPointAsDouble, sample.value);
    add_attributes(point, field::kPointAttributes, sample.labels);
    data.field_bytes(field::kDataPoints, point.str());
  }
  if (sum) {
    data.field_varint(field::kSumTemporality, kTemporalityCumulative);
    data.field_varint(field::kSumMonotonic, 1);
  }

  ProtoWriter metric;
  metric.field_bytes(field::kMetricName, otlp_name(f));
  metric.field_bytes(field::kMetricDescription, f.help);
  metric.field_bytes(field::kMetricUnit, ucum_unit(f.unit));
  metric.field_bytes(sum ? field::kMetricSum : field::kMetricGauge, data.str());
  return metric.str();
}

// The envelope metrics and logs share, field for field: a request of one resource's (`resource`)
// items (Metric or LogRecord messages) under gpuscope's scope. ExportMetricsServiceRequest /
// ResourceMetrics / ScopeMetrics and ExportLogsServiceRequest / ResourceLogs / ScopeLogs number
// their fields alike.
std::string otlp_request(const Labels& resource, const std::vector<std::string>& items) {
  ProtoWriter scope;
  scope.field_bytes(field::kScopeName, "gpuscope");
  scope.field_bytes(field::kScopeVersion, GPUSCOPE_VERSION);

  ProtoWriter scoped;
  scoped.field_bytes(field::kScopeMetricsScope, scope.str());
  for (const auto& item : items) scoped.field_bytes(field::kScopeMetricsMetrics, item);

  ProtoWriter res;
  add_attributes(res, field::kResourceAttributes, resource);

  ProtoWriter resource_items;
  resource_items.field_bytes(field::kResourceMetricsResource, res.str());
  resource_items.field_bytes(field::kResourceMetricsScopeMetrics, scoped.str());

  ProtoWriter request;
  request.field_bytes(field::kRequestResourceMetrics, resource_items.str());
  return request.str();
}

}  // namespace

std::string to_otlp_logs(const std::vector<LogEvent>& events, const Labels& resource) {
  std::vector<std::string> records;
  for (const auto& e : events) {
    ProtoWriter body;
    body.field_bytes(field::kAnyValueString, e.body);
    ProtoWriter rec;
    rec.field_fixed64(field::kLogTime, e.time_unix_ns);
    rec.field_varint(field::kLogSeverityNumber, kSeverityWarn);
    rec.field_bytes(field::kLogSeverityText, "WARN");
    rec.field_bytes(field::kLogBody, body.str());
    add_attributes(rec, field::kLogAttributes, e.attributes);
    rec.field_fixed64(field::kLogObservedTime, e.time_unix_ns);
    rec.field_bytes(field::kLogEventName, e.name);
    records.push_back(rec.str());
  }
  return otlp_request(resource, records);
}

std::string to_otlp_metrics(const MetricSnapshot& s, const Labels& resource) {
  std::vector<std::string> metrics;
  for (const auto& f : s.families)
    if (!f.samples.empty()) metrics.push_back(encode_metric(f, s));
  return otlp_request(resource, metrics);
}

}  // namespace gpuscope::agent
