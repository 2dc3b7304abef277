#include "discover/proc.h"

#include <signal.h>

#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <unordered_map>

#include "common/files.h"

namespace gpuscope::discover {
namespace {

std::string read_file(const std::string& path) { return read_text_file(path).value_or(""); }

std::string base_name(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

uint64_t hex(std::string_view s) {
  uint64_t v = 0;
  std::from_chars(s.data(), s.data() + s.size(), v, 16);
  return v;
}

}  // namespace

bool process_exists(pid_t pid) {
  if (pid <= 0 || (kill(pid, 0) != 0 && errno != EPERM)) return false;
  // A zombie has exited; only its parent's wait is missing.
  const std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

bool process_exiting(pid_t pid) {
  // /proc/PID/stat's ninth field: the task's flags; PF_EXITING is 0x4.
  const std::string s = read_file("/proc/" + std::to_string(pid) + "/stat");
  const auto close = s.rfind(')');
  if (close == std::string::npos) return true;
  std::istringstream in(s.substr(close + 2));
  std::string field;
  uint64_t flags = 0;
  for (int i = 3; i < 9 && in >> field;) ++i;
  if (!(in >> flags)) return true;
  if (!(flags & 0x4)) return false;
  // A main thread that left by pthread_exit is exiting too while the others run on: the memory
  // is torn down only with the last thread.
  const std::string status = read_file("/proc/" + std::to_string(pid) + "/status");
  const auto at = status.find("\nThreads:");
  return at == std::string::npos || std::strtol(status.c_str() + at + 9, nullptr, 10) <= 1;
}

std::string read_comm(pid_t pid) {
  std::string s = read_file("/proc/" + std::to_string(pid) + "/comm");
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

std::string read_cmdline(pid_t pid) {
  std::string s = read_file("/proc/" + std::to_string(pid) + "/cmdline");
  while (!s.empty() && s.back() == '\0') s.pop_back();
  for (char& c : s)
    if (c == '\0') c = ' ';
  return s;
}

std::string read_exe(pid_t pid) {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/" + std::to_string(pid) + "/exe", ec);
  return ec ? std::string() : p.string();
}

pid_t read_ppid(pid_t pid) {
  // The command name in /proc/PID/stat may hold spaces and parentheses: parse after the last ')'.
  std::string s = read_file("/proc/" + std::to_string(pid) + "/stat");
  auto close = s.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream in(s.substr(close + 2));
  char state;
  pid_t ppid = 0;
  in >> state >> ppid;
  return ppid;
}

std::vector<pid_t> list_pids() {
  std::vector<pid_t> pids;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    pid_t pid = 0;
    auto [p, err] = std::from_chars(name.data(), name.data() + name.size(), pid);
    if (err == std::errc() && p == name.data() + name.size()) pids.push_back(pid);
  }
  return pids;
}

std::vector<pid_t> descendants(const std::vector<pid_t>& roots) {
  std::unordered_map<pid_t, pid_t> parent;
  for (pid_t p : list_pids()) parent[p] = read_ppid(p);
  std::set<pid_t> in(roots.begin(), roots.end());
  std::vector<pid_t> out;
  for (auto [pid, ppid] : parent) {
    // Walk up; bounded because pid 1 has parent 0.
    for (pid_t cur = ppid, hops = 0; cur > 1 && hops < 64; cur = parent.count(cur) ? parent[cur] : 0, ++hops) {
      if (in.count(cur)) {
        if (!in.count(pid)) out.push_back(pid);
        break;
      }
    }
  }
  return out;
}

std::vector<Mapping> parse_maps(const std::string& text) {
  std::vector<Mapping> maps;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    // start-end perms offset major:minor inode   path
    std::istringstream ls(line);
    std::string range, perms, offset, dev;
    Mapping m;
    if (!(ls >> range >> perms >> offset >> dev >> m.inode)) continue;
    auto dash = range.find('-');
    auto colon = dev.find(':');
    if (dash == std::string::npos || colon == std::string::npos) continue;
    m.start = hex(std::string_view(range).substr(0, dash));
    m.end = hex(std::string_view(range).substr(dash + 1));
    m.offset = hex(offset);
    m.dev_major = static_cast<uint32_t>(hex(std::string_view(dev).substr(0, colon)));
    m.dev_minor = static_cast<uint32_t>(hex(std::string_view(dev).substr(colon + 1)));
    m.executable = perms.size() > 2 && perms[2] == 'x';
    std::getline(ls >> std::ws, m.path);
    maps.push_back(std::move(m));
  }
  return maps;
}

std::vector<Mapping> read_maps(pid_t pid) { return parse_maps(read_file("/proc/" + std::to_string(pid) + "/maps")); }

std::string path_in_target(pid_t pid, const std::string& path) {
  if (path.empty() || path[0] != '/') return "/proc/" + std::to_string(pid) + "/cwd/" + path;
  return "/proc/" + std::to_string(pid) + "/root" + path;
}

bool is_cuda_runtime_library(const std::string& path) {
  const std::string b = base_name(path);
  return b.starts_with("libcudart.so") || b.starts_with("libcudart-");
}

bool is_cuda_driver_library(const std::string& path) { return base_name(path).starts_with("libcuda.so"); }
bool is_nccl_library(const std::string& path) { return base_name(path).starts_with("libnccl"); }
bool is_verbs_library(const std::string& path) { return base_name(path).starts_with("libibverbs.so"); }
bool is_mlx5_library(const std::string& path) { return base_name(path).starts_with("libmlx5.so"); }
bool is_launch_hooks_library(std::string_view path) {
  const auto slash = path.rfind('/');
  return path.substr(slash == std::string_view::npos ? 0 : slash + 1).starts_with("libgpuscope_launches.so");
}

}  // namespace gpuscope::discover
