// Which container (and Kubernetes pod) a process runs in, from its cgroup path alone: no
// container runtime or API-server access. The pod's name and namespace come from the OCI
// bundle the runtime keeps on the node (containerd, CRI-O), when it is readable.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

namespace gpuscope::discover {

struct ContainerInfo {
  std::string container_id;  // 64 hex digits; "" on the host
  std::string runtime;       // "containerd", "cri-o", "docker", "podman", "" if unknown
  std::string pod_uid;       // Kubernetes pod UID (dashes restored); "" outside Kubernetes
  std::string pod, namespace_, container;  // from the runtime's bundle; "" if not found
};

// Parses one cgroup path (the v2 line of /proc/PID/cgroup, or a v1 controller's) as kubelet,
// systemd and the container runtimes name them, e.g.
//   /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope
//   /kubepods/besteffort/pod<uid>/<id>        /system.slice/docker-<id>.scope      /docker/<id>
ContainerInfo parse_cgroup_path(std::string_view path);

// The container of a process: its cgroup, then the pod's name and namespace from the OCI
// bundle's annotations under `root` (the host's / as the agent sees it; tests point it elsewhere).
ContainerInfo container_of(pid_t pid, const std::string& root = "/");

// Reads the Kubernetes annotations of an OCI config.json (containerd's io.kubernetes.cri.*
// or CRI-O's io.kubernetes.pod.*) into `info`. False if the file has none.
bool read_bundle_annotations(const std::string& config_json_path, ContainerInfo& info);

}  // namespace gpuscope::discover
