// The agent's two export formats, each checked by an independent reader: the Prometheus text
// by promtool's parser, the OTLP protobuf by protoc decoding it against the real .proto files
// (tests/proto). Both tools come from Debian packages (prometheus, protobuf-compiler) that
// run-tests.sh installs.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "agent/metrics.h"

using namespace gpuscope::agent;
namespace fs = std::filesystem;

namespace {

struct CommandResult {
  int status = -1;  // the exit status, or -1 if it did not exit
  std::string output;  // stdout and stderr together
};

CommandResult run(const std::string& command) {
  CommandResult r;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  int status = pclose(p);
  if (status != -1 && WIFEXITED(status)) r.status = WEXITSTATUS(status);
  return r;
}

bool have_tool(const std::string& name) { return run("command -v " + name).status == 0; }

fs::path temp_file(const std::string& name, const std::string& contents) {
  fs::path p = fs::temp_directory_path() / ("gpuscope-test-" + name + "-" + std::to_string(getpid()));
  std::ofstream(p, std::ios::binary) << contents;
  return p;
}

// protoc's text format puts each field on its own line; on one line, a nested message reads
// as a single substring.
std::string one_line(const std::string& text) {
  std::string out;
  bool space = false;
  for (char c : text) {
    if (c == ' ' || c == '\n') {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
  }
  return out;
}

MetricSnapshot sample_snapshot() {
  MetricSnapshot s;
  s.start_time_unix_ns = 1700000000000000000;
  s.time_unix_ns = 1700000015000000000;
  s.families = {
      {"gpuscope_kernel_launches_total", "Kernel launches.", "", MetricType::Counter,
       {{{{"container", "web"}, {"gpu", "0"}}, 42}, {{{"container", "batch"}, {"gpu", "1"}}, 7}}},
      {"gpuscope_memcpy_bytes_total", "Bytes copied.", "bytes", MetricType::Counter, {{{}, 1048576}}},
      {"gpuscope_gpu_utilization_ratio", "Share of time a kernel ran.", "ratio", MetricType::Gauge,
       {{{{"gpu", "0"}}, 0.25}}},
      {"gpuscope_gpu_temperature_celsius", "GPU temperature.", "celsius", MetricType::Gauge, {{{}, 61}}},
      {"gpuscope_launch_latency_seconds", "Not measured yet.", "seconds", MetricType::Gauge, {}},
  };
  return s;
}

const char* kMissingPromtool =
    "promtool not found: install Debian's `prometheus` package (run-tests.sh does, via "
    "SETUP_TEST_PACKAGES)";
const char* kMissingProtoc =
    "protoc not found: install Debian's `protobuf-compiler` package (run-tests.sh does, via "
    "SETUP_TEST_PACKAGES)";

// ---- Prometheus text ----

MetricSnapshot awkward_snapshot() {
  MetricSnapshot s;
  s.families = {
      {"gpuscope_kernel_launches_total", "Kernel launches, per \\ container\nand GPU.", "",
       MetricType::Counter,
       {{{{"container", R"(C:\dir "quoted")" "\nnext line"}, {"gpu", "0"}}, 42}, {{}, 1e20}}},
      {"gpuscope_gpu_utilization_ratio", "Share of time a kernel ran.", "ratio", MetricType::Gauge,
       {{{{"gpu", "0"}}, 0.25}, {{{"gpu", "1"}}, 3.0}, {{{"gpu", "2"}}, -2}}},
      {"gpuscope_launch_latency_seconds", "Not measured yet.", "seconds", MetricType::Gauge, {}},
  };
  return s;
}

TEST(PrometheusText, EscapesAndFormats) {
  EXPECT_EQ(to_prometheus_text(awkward_snapshot()),
            "# HELP gpuscope_kernel_launches_total Kernel launches, per \\\\ container\\nand GPU.\n"
            "# TYPE gpuscope_kernel_launches_total counter\n"
            "gpuscope_kernel_launches_total{container=\"C:\\\\dir \\\"quoted\\\"\\nnext line\",gpu=\"0\"} 42\n"
            "gpuscope_kernel_launches_total 1e+20\n"
            "# HELP gpuscope_gpu_utilization_ratio Share of time a kernel ran.\n"
            "# TYPE gpuscope_gpu_utilization_ratio gauge\n"
            "gpuscope_gpu_utilization_ratio{gpu=\"0\"} 0.25\n"
            "gpuscope_gpu_utilization_ratio{gpu=\"1\"} 3\n"
            "gpuscope_gpu_utilization_ratio{gpu=\"2\"} -2\n");
}

TEST(PrometheusText, EmptySnapshotIsEmpty) { EXPECT_EQ(to_prometheus_text(MetricSnapshot{}), ""); }

// promtool's exit status: 0 clean, 3 lint problems (counter names, units), 1 a parse error.
// Our names follow the conventions, so anything but a clean pass is a failure.
TEST(PrometheusText, PromtoolAccepts) {
  ASSERT_TRUE(have_tool("promtool")) << kMissingPromtool;
  for (const MetricSnapshot& s : {awkward_snapshot(), sample_snapshot()}) {
    fs::path file = temp_file("prometheus", to_prometheus_text(s));
    CommandResult r = run("promtool check metrics < " + file.string());
    fs::remove(file);
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(r.output, "");
  }
}

// The checker must see a broken exposition as broken, or the test above proves nothing.
TEST(PrometheusText, PromtoolRejectsUnescapedNewline) {
  ASSERT_TRUE(have_tool("promtool")) << kMissingPromtool;
  fs::path file = temp_file("prometheus-bad", "# TYPE x gauge\nx{l=\"a\nb\"} 1\n");
  CommandResult r = run("promtool check metrics < " + file.string());
  fs::remove(file);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("parsing error"), std::string::npos) << r.output;
}

// ---- OTLP ----

CommandResult protoc_decode(const std::string& encoded, const std::string& signal = "metrics",
                            const std::string& request = "ExportMetricsServiceRequest") {
  fs::path proto_root = fs::path(__FILE__).parent_path().parent_path() / "proto";
  fs::path file = temp_file("otlp", encoded);
  CommandResult r = run(fmt::format(
      "protoc --decode=opentelemetry.proto.collector.{0}.v1.{1} -I {2} "
      "opentelemetry/proto/collector/{0}/v1/{0}_service.proto < {3}",
      signal, request, proto_root.string(), file.string()));
  fs::remove(file);
  return r;
}

// A field number or wire type we got wrong shows up as an unknown field: a bare number.
void expect_no_unknown_fields(const std::string& decoded) {
  std::istringstream lines(decoded);
  for (std::string line; std::getline(lines, line);) {
    size_t start = line.find_first_not_of(' ');
    if (start == std::string::npos) continue;
    EXPECT_FALSE(std::isdigit(static_cast<unsigned char>(line[start]))) << "unknown field: " << line;
  }
}

const Labels kResource{{"service.name", "gpuscope-agent"}, {"host.name", "node-7"}};

TEST(OtlpMetrics, ProtocDecodesRequest) {
  ASSERT_TRUE(have_tool("protoc")) << kMissingProtoc;
  CommandResult r = protoc_decode(to_otlp_metrics(sample_snapshot(), kResource));
  ASSERT_EQ(r.status, 0) << r.output;
  expect_no_unknown_fields(r.output);
  std::string text = one_line(r.output);
  auto expect_has = [&](const std::string& part) {
    EXPECT_NE(text.find(part), std::string::npos) << "missing: " << part << "\nin:\n" << r.output;
  };

  expect_has(
      "resource_metrics { resource { "
      "attributes { key: \"service.name\" value { string_value: \"gpuscope-agent\" } } "
      "attributes { key: \"host.name\" value { string_value: \"node-7\" } } } "
      "scope_metrics { scope { name: \"gpuscope\" version: \"" GPUSCOPE_VERSION "\" } metrics {");

  // Counters: the name without _total, a cumulative monotonic sum counted from the start time.
  expect_has(
      "metrics { name: \"gpuscope_kernel_launches\" description: \"Kernel launches.\" unit: \"1\" sum { "
      "data_points { start_time_unix_nano: 1700000000000000000 time_unix_nano: 1700000015000000000 "
      "as_double: 42 "
      "attributes { key: \"container\" value { string_value: \"web\" } } "
      "attributes { key: \"gpu\" value { string_value: \"0\" } } } "
      "data_points { start_time_unix_nano: 1700000000000000000 time_unix_nano: 1700000015000000000 "
      "as_double: 7 "
      "attributes { key: \"container\" value { string_value: \"batch\" } } "
      "attributes { key: \"gpu\" value { string_value: \"1\" } } } "
      "aggregation_temporality: AGGREGATION_TEMPORALITY_CUMULATIVE is_monotonic: true } }");
  expect_has(
      "metrics { name: \"gpuscope_memcpy_bytes\" description: \"Bytes copied.\" unit: \"By\" sum { "
      "data_points { start_time_unix_nano: 1700000000000000000 time_unix_nano: 1700000015000000000 "
      "as_double: 1048576 } "
      "aggregation_temporality: AGGREGATION_TEMPORALITY_CUMULATIVE is_monotonic: true } }");

  // Gauges keep their name and carry only the time they were read.
  expect_has(
      "metrics { name: \"gpuscope_gpu_utilization_ratio\" description: \"Share of time a kernel ran.\" "
      "unit: \"1\" gauge { data_points { time_unix_nano: 1700000015000000000 as_double: 0.25 "
      "attributes { key: \"gpu\" value { string_value: \"0\" } } } } }");
  expect_has(
      "metrics { name: \"gpuscope_gpu_temperature_celsius\" description: \"GPU temperature.\" "
      "unit: \"Cel\" gauge { data_points { time_unix_nano: 1700000015000000000 as_double: 61 } } }");

  // One resource, one scope, one metric per family with samples.
  auto count = [&](const std::string& part) {
    size_t n = 0;
    for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("resource_metrics {"), 1u);
  EXPECT_EQ(count("scope_metrics {"), 1u);
  EXPECT_EQ(count("metrics { name:"), 4u);
  EXPECT_EQ(text.find("gpuscope_launch_latency_seconds"), std::string::npos);
}

TEST(OtlpMetrics, EmptySnapshotIsValidRequest) {
  ASSERT_TRUE(have_tool("protoc")) << kMissingProtoc;
  MetricSnapshot s;
  s.families = {{"gpuscope_launch_latency_seconds", "Not measured yet.", "seconds", MetricType::Gauge, {}}};
  CommandResult r = protoc_decode(to_otlp_metrics(s, kResource));
  ASSERT_EQ(r.status, 0) << r.output;
  expect_no_unknown_fields(r.output);
  std::string text = one_line(r.output);
  EXPECT_NE(text.find("scope { name: \"gpuscope\""), std::string::npos) << r.output;
  EXPECT_NE(text.find("string_value: \"node-7\""), std::string::npos) << r.output;
  EXPECT_EQ(text.find("metrics { name:"), std::string::npos) << r.output;
}

TEST(OtlpMetrics, UnitsAndNames) {
  ASSERT_TRUE(have_tool("protoc")) << kMissingProtoc;
  MetricSnapshot s;
  const std::vector<std::pair<std::string, std::string>> units = {
      {"seconds", "s"}, {"bytes", "By"}, {"ratio", "1"},  {"celsius", "Cel"},           {"watts", "W"},
      {"hertz", "Hz"},  {"", "1"},       {"joules", "joules"}, {"bytes_per_second", "By/s"},
  };
  for (size_t i = 0; i < units.size(); ++i)
    s.families.push_back({"g" + std::to_string(i), "", units[i].first, MetricType::Gauge, {{{}, 1}}});
  // Only a counter loses its _total; a bare "_total" keeps it (an empty name is no name).
  s.families.push_back({"odd_total", "", "", MetricType::Gauge, {{{}, 1}}});
  s.families.push_back({"_total", "", "", MetricType::Counter, {{{}, 1}}});
  CommandResult r = protoc_decode(to_otlp_metrics(s, {}));
  ASSERT_EQ(r.status, 0) << r.output;
  std::string text = one_line(r.output);
  for (size_t i = 0; i < units.size(); ++i) {
    std::string part = "name: \"g" + std::to_string(i) + "\" unit: \"" + units[i].second + "\"";
    EXPECT_NE(text.find(part), std::string::npos) << "missing: " << part << "\nin:\n" << r.output;
  }
  EXPECT_NE(text.find("name: \"odd_total\""), std::string::npos) << r.output;
  EXPECT_NE(text.find("name: \"_total\""), std::string::npos) << r.output;
}

}  // namespace

TEST(OtlpLogs, AFindingIsALogRecordProtocDecodes) {
  ASSERT_TRUE(have_tool("protoc")) << kMissingProtoc;
  LogEvent e;
  e.time_unix_ns = 1700000000123456789;
  e.name = "gpuscope.diagnosis.finding";
  e.body = "The thread that feeds the GPU waits for a CPU (40% of step time)";
  e.attributes = {{"pid", "4242"}, {"cause", "cpu_contention"}};
  CommandResult r = protoc_decode(to_otlp_logs({e}, kResource), "logs", "ExportLogsServiceRequest");
  ASSERT_EQ(r.status, 0) << r.output;
  expect_no_unknown_fields(r.output);
  const std::string text = one_line(r.output);
  const std::string want =
      "resource_logs { resource { attributes { key: \"service.name\" value { string_value: \"gpuscope-agent\" } } "
      "attributes { key: \"host.name\" value { string_value: \"node-7\" } } } scope_logs { scope { name: "
      "\"gpuscope\" version: \"" GPUSCOPE_VERSION "\" } log_records { time_unix_nano: 1700000000123456789 "
      "severity_number: SEVERITY_NUMBER_WARN severity_text: \"WARN\" body { string_value: \"The thread that feeds "
      "the GPU waits for a CPU (40% of step time)\" } attributes { key: \"pid\" value { string_value: \"4242\" } } "
      "attributes { key: \"cause\" value { string_value: \"cpu_contention\" } } observed_time_unix_nano: "
      "1700000000123456789 event_name: \"gpuscope.diagnosis.finding\" } } }";
  EXPECT_EQ(text, want) << r.output;
}
