#include "agent/config.h"

#include <yaml-cpp/yaml.h>

#include <charconv>
#include <fstream>
#include <set>

#include "common/error.h"

namespace gpuscope::agent {
namespace {

[[noreturn]] void fail(const std::string& path, const YAML::Node& node, const std::string& what) {
  throw Error("{}:{}: {}", path, node.Mark().line + 1, what);
}

template <typename T>
T scalar(const std::string& path, const std::string& key, const YAML::Node& node) {
  try {
    return node.as<T>();
  } catch (const YAML::Exception&) {
    fail(path, node, "'" + key + "' has a value of the wrong type");
  }
}

void check_keys(const std::string& path, const std::string& where, const YAML::Node& map,
                const std::set<std::string>& known) {
  if (!map.IsMap()) fail(path, map, where + " must be a mapping");
  for (const auto& kv : map) {
    if (!kv.first.IsNull() && !kv.first.IsScalar())
      fail(path, kv.first, "a key must be a plain name, not a list or a mapping" + (where.empty() ? "" : " (in " + where + ")"));
    const auto key = kv.first.IsNull() ? std::string() : kv.first.Scalar();
    if (key.empty()) fail(path, kv.first, "an entry has no key name" + (where.empty() ? "" : " (in " + where + ")"));
    if (!known.contains(key)) fail(path, kv.first, "unknown key '" + (where.empty() ? "" : where + ".") + key + "'");
  }
}

void read_push(const std::string& path, const std::string& name, const YAML::Node& node, PushTarget& t) {
  check_keys(path, name, node, {"url", "endpoint", "interval", "headers"});
  if (node["url"]) t.url = scalar<std::string>(path, name + ".url", node["url"]);
  if (node["endpoint"]) t.url = scalar<std::string>(path, name + ".endpoint", node["endpoint"]);
  if (node["interval"]) t.interval_s = parse_duration_s(scalar<std::string>(path, name + ".interval", node["interval"]));
  if (const auto h = node["headers"]) {
    if (!h.IsMap()) fail(path, h, name + ".headers must be a mapping");
    for (const auto& kv : h) {
      if (!kv.first.IsScalar()) fail(path, kv.first, name + ".headers: a header's name must be a plain name");
      t.headers[kv.first.Scalar()] = scalar<std::string>(path, name + ".headers", kv.second);
    }
  }
  if (!t.url.empty() && !t.url.starts_with("http://") && !t.url.starts_with("https://"))
    fail(path, node, name + " url must start with http:// or https://");
}

}  // namespace

double parse_duration_s(const std::string& text) {
  double v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || v < 0) throw Error("'{}' is not a duration (e.g. 15s, 2m, 500ms)", text);
  const std::string_view unit(p, size_t(end - p));
  if (unit.empty() || unit == "s") return v;
  if (unit == "ms") return v / 1000;
  if (unit == "m") return v * 60;
  if (unit == "h") return v * 3600;
  throw Error("'{}' is not a duration (e.g. 15s, 2m, 500ms)", text);
}

namespace {

AgentConfig read_config(const std::string& path, const YAML::Node& root, AgentConfig c);

}  // namespace

AgentConfig load_config(const std::string& path, AgentConfig c) {
  std::ifstream in(path);
  if (!in) throw Error("cannot read the config file {} (give --config a readable YAML file)", path);
  // Every error, yaml-cpp's too, is one line naming the file and line.
  try {
    return read_config(path, YAML::Load(in), std::move(c));
  } catch (const YAML::Exception& e) {
    throw Error("{}:{}: {}", path, e.mark.line + 1, e.msg);
  }
}

namespace {

AgentConfig read_config(const std::string& path, const YAML::Node& root, AgentConfig c) {
  if (root.IsNull()) return c;
  check_keys(path, "", root,
             {"listen", "bearer_token_file", "protect_metrics", "budget", "interval", "otlp", "pyroscope",
              "max_kernel_names", "memory_limit_mb", "gpu_sample_hz", "cpu_profile_hz", "stacks", "python_stacks",
              "ringbuf_mb", "host_root", "stack_map_entries", "agent_cpu_budget", "gpu_process_sample_interval",
              "stack_walk", "unwind_table_mb", "unwind_cache", "stack_every", "diagnose"});
  auto get = [&](const char* key, auto& out) {
    if (const auto n = root[key]) out = scalar<std::decay_t<decltype(out)>>(path, key, n);
  };
  get("listen", c.listen);
  get("bearer_token_file", c.bearer_token_file);
  get("protect_metrics", c.protect_metrics);
  get("budget", c.budget);
  if (const auto n = root["interval"]) c.profile_interval_s = parse_duration_s(scalar<std::string>(path, "interval", n));
  if (const auto n = root["otlp"]) read_push(path, "otlp", n, c.otlp);
  if (const auto n = root["pyroscope"]) read_push(path, "pyroscope", n, c.pyroscope);
  get("max_kernel_names", c.max_kernel_names);
  get("memory_limit_mb", c.memory_limit_mb);
  get("gpu_sample_hz", c.gpu_sample_hz);
  if (const auto n = root["gpu_process_sample_interval"])
    c.gpu_process_sample_s = parse_duration_s(scalar<std::string>(path, "gpu_process_sample_interval", n));
  get("cpu_profile_hz", c.cpu_profile_hz);
  get("stacks", c.stacks);
  get("python_stacks", c.python_stacks);
  get("ringbuf_mb", c.ringbuf_mb);
  get("host_root", c.host_root);
  get("stack_map_entries", c.stack_map_entries);
  get("agent_cpu_budget", c.agent_cpu_budget);
  get("stack_walk", c.stack_walk);
  get("unwind_table_mb", c.unwind_table_mb);
  get("unwind_cache", c.unwind_cache);
  get("stack_every", c.stack_every);
  get("diagnose", c.diagnose);
  auto at = [&](const char* key) { return root[key] ? root[key] : root; };
  if (c.budget <= 0 || c.budget > 1) fail(path, at("budget"), "budget must be in (0, 1], e.g. 0.01 for 1%");
  if (c.cpu_profile_hz < 0 || c.cpu_profile_hz > 1000) fail(path, at("cpu_profile_hz"), "cpu_profile_hz must be 0..1000");
  if (c.profile_interval_s < 1) fail(path, at("interval"), "interval must be at least 1s");
  if (c.gpu_process_sample_s <= 0 || c.gpu_process_sample_s > 3600)
    fail(path, at("gpu_process_sample_interval"), "gpu_process_sample_interval must be in (0, 1h], e.g. 10s");
  if (c.memory_limit_mb < 32) fail(path, at("memory_limit_mb"), "memory_limit_mb must be at least 32");
  if (c.agent_cpu_budget <= 0 || c.agent_cpu_budget > 16)
    fail(path, at("agent_cpu_budget"), "agent_cpu_budget must be in (0, 16] cores, e.g. 0.01");
  if (c.stack_walk != "fp" && c.stack_walk != "eh-frame") fail(path, at("stack_walk"), "stack_walk must be fp or eh-frame");
  if (c.unwind_table_mb < 1 || c.unwind_table_mb > 4096) fail(path, at("unwind_table_mb"), "unwind_table_mb must be 1..4096");
  if (c.stack_every < 1 || c.stack_every > 1'000'000) fail(path, at("stack_every"), "stack_every must be 1..1000000");
  if (c.stack_map_entries < 256 || c.stack_map_entries > (1u << 20))
    fail(path, at("stack_map_entries"), "stack_map_entries must be 256..1048576");
  return c;
}

}  // namespace

}  // namespace gpuscope::agent
