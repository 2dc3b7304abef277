// What /proc says about a process: identity, mappings, and the CUDA libraries it has mapped.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpuscope::discover {

struct Mapping {
  uint64_t start = 0, end = 0, offset = 0;
  uint64_t inode = 0;
  uint32_t dev_major = 0, dev_minor = 0;
  bool executable = false;
  std::string path;  // as the process sees it; "" for anonymous memory
};

bool process_exists(pid_t pid);
// Its last thread is on its way out (PF_EXITING on the main thread, no other left), or it is
// gone: its memory is being torn down, and /proc/PID/maps may list a part of it meanwhile.
bool process_exiting(pid_t pid);
std::string read_comm(pid_t pid);
std::string read_cmdline(pid_t pid);  // arguments joined by spaces
std::string read_exe(pid_t pid);      // the executable's path, as the process sees it
pid_t read_ppid(pid_t pid);
std::vector<pid_t> list_pids();
// Processes whose parent chain leads to one of `roots` (the roots excluded).
std::vector<pid_t> descendants(const std::vector<pid_t>& roots);
std::vector<Mapping> read_maps(pid_t pid);
std::vector<Mapping> parse_maps(const std::string& text);

// A path through which this process can open the file a target sees at `path`, across mount
// namespaces: /proc/PID/root/PATH.
std::string path_in_target(pid_t pid, const std::string& path);

// Library basenames that carry the CUDA API: libcudart.so*, libcudart-*.so*, libcuda.so*.
bool is_cuda_runtime_library(const std::string& path);
bool is_cuda_driver_library(const std::string& path);
// gpuscope's own launch hooks, preloaded by record --launch-probes in-process.
bool is_launch_hooks_library(std::string_view path);
// libnccl.so*: NCCL, probed for its API (and the CUDA runtime it links statically).
bool is_nccl_library(const std::string& path);
// libibverbs.so*: RDMA verbs' control path, probed; libmlx5.so*: the mlx5 provider, whose direct
// verbs (mlx5dv_*) bypass libibverbs' data path.
bool is_verbs_library(const std::string& path);
bool is_mlx5_library(const std::string& path);

}  // namespace gpuscope::discover
