#include "discover/container.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace gpuscope::discover {
namespace {

bool is_hex(std::string_view s) {
  return s.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

// A 64-hex-digit id at the end of a path component after one of the runtimes' prefixes, with
// systemd's ".scope" suffix dropped.
bool take_container_id(std::string_view part, ContainerInfo& info) {
  static constexpr std::pair<std::string_view, std::string_view> kPrefixes[] = {
      {"cri-containerd-", "containerd"}, {"crio-", "cri-o"}, {"docker-", "docker"},
      {"libpod-", "podman"},            {"containerd-", "containerd"}, {"", ""}};
  if (part.ends_with(".scope")) part.remove_suffix(6);
  for (const auto& [prefix, runtime] : kPrefixes) {
    if (!part.starts_with(prefix)) continue;
    std::string_view id = part.substr(prefix.size());
    if (id.size() != 64 || !is_hex(id)) continue;
    info.container_id = id;
    if (!runtime.empty()) info.runtime = runtime;
    return true;
  }
  return false;
}

// kubelet's pod component: "pod<uid>" (cgroupfs driver) or "kubepods-<qos>-pod<uid>.slice"
// (systemd driver, dashes in the UID turned into underscores).
bool take_pod_uid(std::string_view part, ContainerInfo& info) {
  if (part.ends_with(".slice")) part.remove_suffix(6);
  const size_t at = part.rfind("pod");
  if (at == std::string_view::npos || (at != 0 && part[at - 1] != '-')) return false;
  std::string uid(part.substr(at + 3));
  for (char& c : uid)
    if (c == '_') c = '-';
  if (uid.size() != 36 || uid.find_first_not_of("0123456789abcdef-") != std::string::npos) return false;
  info.pod_uid = uid;
  return true;
}

}  // namespace

ContainerInfo parse_cgroup_path(std::string_view path) {
  ContainerInfo info;
  const bool kube = path.find("kubepods") != std::string_view::npos;
  size_t start = 0;
  while (start < path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    const std::string_view part = path.substr(start, end - start);
    if (!part.empty()) {
      if (kube && info.pod_uid.empty() && take_pod_uid(part, info)) {
      } else {
        take_container_id(part, info);  // the innermost id wins
      }
    }
    start = end + 1;
  }
  if (!info.container_id.empty() && info.runtime.empty())
    info.runtime = path.starts_with("/docker/") ? "docker" : "";
  return info;
}

bool read_bundle_annotations(const std::string& config_json_path, ContainerInfo& info) {
  std::ifstream in(config_json_path);
  if (!in) return false;
  auto doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object() || !doc.contains("annotations") || !doc["annotations"].is_object()) return false;
  const auto& a = doc["annotations"];
  auto get = [&](std::initializer_list<const char*> keys) -> std::string {
    for (const char* k : keys)
      if (auto it = a.find(k); it != a.end() && it->is_string()) return it->get<std::string>();
    return {};
  };
  info.pod = get({"io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name"});
  info.namespace_ = get({"io.kubernetes.cri.sandbox-namespace", "io.kubernetes.pod.namespace"});
  info.container = get({"io.kubernetes.cri.container-name", "io.kubernetes.container.name"});
  if (info.pod_uid.empty()) info.pod_uid = get({"io.kubernetes.cri.sandbox-uid", "io.kubernetes.pod.uid"});
  return !info.pod.empty() || !info.namespace_.empty();
}

ContainerInfo container_of(pid_t pid, const std::string& root) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cgroup");
  std::string line, best;
  // The unified (v2) line "0::PATH" names the process's cgroup on every modern host; on v1
  // hosts any controller's path carries the same ids.
  while (std::getline(in, line)) {
    const size_t second = line.find(':', line.find(':') + 1);
    if (second == std::string::npos) continue;
    std::string path = line.substr(second + 1);
    if (line.starts_with("0::") || best.empty() || best == "/") best = path;
    if (line.starts_with("0::") && path != "/") break;
  }
  ContainerInfo info = parse_cgroup_path(best);
  if (info.container_id.empty() || info.pod_uid.empty()) return info;
  const std::string base = root.ends_with('/') ? root : root + "/";
  // Where containerd (CRI namespace k8s.io) and CRI-O keep each container's OCI bundle.
  for (const std::string& dir : {base + "run/containerd/io.containerd.runtime.v2.task/k8s.io/" + info.container_id,
                                 base + "run/containers/storage/overlay-containers/" + info.container_id + "/userdata"})
    if (read_bundle_annotations(dir + "/config.json", info)) break;
  return info;
}

}  // namespace gpuscope::discover
