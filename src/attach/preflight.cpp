#include "attach/preflight.h"

#include <linux/capability.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/error.h"

namespace gpuscope::attach {
namespace {

bool has_capability(int cap) {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2]{};
  if (syscall(SYS_capget, &hdr, data) != 0) return false;
  return data[cap / 32].effective & (1u << (cap % 32));
}

}  // namespace

void check_can_trace(std::string_view command) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // CAP_BPF and CAP_PERFMON load and attach; SYS_PTRACE reads other processes' maps; KILL
  // stops and continues them while their CUDA library is probed.
  constexpr int kCapBpf = 39, kCapPerfmon = 38;
  if (geteuid() != 0 && !(has_capability(kCapBpf) && has_capability(kCapPerfmon) &&
                          has_capability(CAP_SYS_PTRACE) && has_capability(CAP_KILL)))
    throw Error("{} needs root (or CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE and CAP_KILL): run it with sudo", command);
  if (!fs::exists("/sys/kernel/btf/vmlinux", ec))
    throw Error("this kernel has no BTF (/sys/kernel/btf/vmlinux is missing); use a kernel built with CONFIG_DEBUG_INFO_BTF=y");
  if (!fs::exists("/sys/bus/event_source/devices/uprobe", ec))
    throw Error("this kernel has no uprobe support; use a kernel built with CONFIG_UPROBE_EVENTS=y");
  if (!fs::exists("/sys/kernel/tracing/events", ec) && !fs::exists("/sys/kernel/debug/tracing/events", ec)) {
    // Tracepoints are found through tracefs; many minimal systems leave it unmounted.
    if (mount("nodev", "/sys/kernel/tracing", "tracefs", 0, nullptr) != 0 && errno != EBUSY)
      throw Error("tracefs is not mounted and could not be ({}); run: mount -t tracefs nodev /sys/kernel/tracing",
                  strerror(errno));
  }
}

void raise_open_file_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= lim.rlim_max) return;
  lim.rlim_cur = lim.rlim_max;
  setrlimit(RLIMIT_NOFILE, &lim);  // best effort: the limit as it was still works, only lower
}

}  // namespace gpuscope::attach
