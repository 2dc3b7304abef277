// Runs a command with libgpuscope_launches.so preloaded and drains its processes' launch rings as
// gpuscope does (record/launch_rings.h), every --every-us. Prints one JSON line: the launches read
// per process and entry point, the functions' names they gave, those lost, the rings refused, and
// how the records read (times in order per thread, a launch's fields as the caller passed them
// where it is driver_lookups).
//
//     build/bench/launch_ring_drain [--lib build/libgpuscope_launches.so] [--every-us 2000] -- CMD ARGS...
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "record/launch_rings.h"

using namespace gpuscope;

int main(int argc, char** argv) {
  std::string lib;
  long every_us = 2000;
  int i = 1;
  for (; i < argc && std::strcmp(argv[i], "--"); ++i) {
    if (!std::strcmp(argv[i], "--lib") && i + 1 < argc) lib = argv[++i];
    else if (!std::strcmp(argv[i], "--every-us") && i + 1 < argc) every_us = std::atol(argv[++i]);
  }
  if (i + 1 >= argc) {
    std::fprintf(stderr, "usage: launch_ring_drain [--lib LIB] [--every-us N] -- CMD ARGS...\n");
    return 2;
  }
  if (lib.empty()) {
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    const std::string exe = n > 0 ? std::string(self, size_t(n)) : argv[0];
    lib = exe.substr(0, exe.rfind('/')) + "/../libgpuscope_launches.so";
  }
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir = record::LaunchRings::make_dir(access("/dev/shm", W_OK) == 0 ? "/dev/shm" : tmp ? tmp : "/tmp");
  record::LaunchRings rings(dir);
  const pid_t child = fork();
  if (child == 0) {
    setenv(GS_LAUNCH_RING_ENV, dir.c_str(), 1);
    std::string preload = lib;
    if (const char* p = std::getenv("LD_PRELOAD"); p && *p) preload += std::string(":") + p;
    setenv("LD_PRELOAD", preload.c_str(), 1);
    execvp(argv[i + 1], argv + i + 1);
    std::perror("exec");
    _exit(127);
  }
  struct Seen {
    std::map<int, uint64_t> by_api;
    uint64_t total = 0;
  };
  std::map<uint32_t, Seen> seen;
  std::map<uint32_t, std::map<uint64_t, std::string>> names;
  uint64_t names_twice = 0;
  rings.on_name([&](uint32_t pid, uint64_t function, std::string_view name) {
    names_twice += !names[pid].emplace(function, std::string(name)).second;
  });
  std::map<uint32_t, uint64_t> last_ts;  // tid -> last entry time
  uint64_t out_of_order = 0, fields_wrong = 0;
  auto on = [&](uint32_t pid, const gs_launch_record& r) {
    auto& s = seen[pid];
    ++s.by_api[r.api];
    ++s.total;
    auto& t = last_ts[r.tid];
    out_of_order += r.ts_ns < t;
    t = r.ts_ns;
    // driver_lookups' cuLaunchKernel: function 0x1000, grid (i % 7 + 1, 2, 3), block (32, 4, 1).
    if (r.function == 0x1000)
      fields_wrong += r.grid_x < 1 || r.grid_x > 7 || r.grid_y != 2 || r.grid_z != 3 || r.block_x != 32 ||
                      r.block_y != 4 || r.block_z != 1 || r.shared_mem != 256 || r.stream != 0x10;
  };
  int status = 0;
  const auto t0 = std::chrono::steady_clock::now();
  size_t rings_seen = 0;
  while (waitpid(child, &status, WNOHANG) == 0) {
    rings.discover();
    rings_seen = std::max(rings_seen, rings.rings());
    rings.drain(on);
    std::this_thread::sleep_for(std::chrono::microseconds(every_us));
  }
  rings.discover();
  rings.drain(on);
  rings_seen = std::max(rings_seen, rings.rings());
  for (const auto& [pid, s] : seen) rings.forget(pid_t(pid), on);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("{\"exit\": %d, \"seconds\": %.3f, \"rings\": %zu, \"lost\": %llu, \"refused\": %llu, \"out_of_order\": %llu, "
              "\"fields_wrong\": %llu, \"names_twice\": %llu, \"names_lost\": %llu, \"processes\": {",
              WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), secs, rings_seen,
              (unsigned long long)rings.lost(), (unsigned long long)rings.refused(),
              (unsigned long long)out_of_order, (unsigned long long)fields_wrong, (unsigned long long)names_twice,
              (unsigned long long)rings.names_lost());
  bool first = true;
  for (const auto& [pid, s] : seen) {
    std::printf("%s\"%u\": {\"launches\": %llu, \"by_api\": {", first ? "" : ", ", pid, (unsigned long long)s.total);
    bool f2 = true;
    for (const auto& [api, n] : s.by_api) {
      std::printf("%s\"%d\": %llu", f2 ? "" : ", ", api, (unsigned long long)n);
      f2 = false;
    }
    std::printf("}, \"names\": {");
    f2 = true;
    for (const auto& [function, name] : names[pid]) {
      std::printf("%s\"%#llx\": \"%s\"", f2 ? "" : ", ", (unsigned long long)function, name.c_str());
      f2 = false;
    }
    std::printf("}}");
    first = false;
  }
  std::printf("}}\n");
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}
