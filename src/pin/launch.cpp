#include "pin/launch.h"

#include <fmt/format.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "common/error.h"

extern char** environ;

namespace gpuscope::pin {
namespace fs = std::filesystem;

size_t parse_bytes(const std::string& text, const char* option) {
  char* end = nullptr;
  const double x = std::strtod(text.c_str(), &end);
  double scale = 1;
  if (end && *end) {
    const std::string unit = end;
    if (unit == "K" || unit == "k" || unit == "KiB") scale = 1024.0;
    else if (unit == "M" || unit == "m" || unit == "MiB") scale = 1024.0 * 1024;
    else if (unit == "G" || unit == "g" || unit == "GiB") scale = 1024.0 * 1024 * 1024;
    else end = nullptr;
  }
  if (!end || end == text.c_str() || !std::isfinite(x) || x <= 0)
    throw Error("{} '{}' is not a size: give bytes, or a number with K, M or G (e.g. 512K, 8G)", option, text);
  return size_t(x * scale);
}

namespace {

std::string library_path() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  const fs::path lib = (ec ? fs::path(".") : exe.parent_path()) / "libgpuscope_pin.so";
  if (!fs::exists(lib))
    throw Error("{} not found: it is built beside gpuscope (cmake --build build --target gpuscope_pin)", lib.string());
  return lib.string();
}

std::string mib(double bytes) { return fmt::format("{:.0f} MiB", bytes / (1 << 20)); }

}  // namespace

nlohmann::json summarize(const std::vector<nlohmann::json>& reports) {
  nlohmann::json out = {{"processes", nlohmann::json::array()}};
  for (const auto& r : reports) {
    // A process that served no buffer and made no copy (a shell, a compiler) is not worth a line.
    if (r.value("buffers", 0) == 0 && r.value("unserved_copies", 0) == 0 && r.value("pageable_copies", 0) == 0)
      continue;
    out["processes"].push_back(r);
  }
  return out;
}

std::string render_summary(const nlohmann::json& summary) {
  std::string text;
  for (const auto& p : summary["processes"]) {
    const uint64_t pinned = p.value("pinned_copies", 0), pageable = p.value("pageable_copies", 0),
                   unserved = p.value("unserved_copies", 0);
    text += fmt::format("gpuscope pin: PID {}{}: {} large buffers served; copies: {} pinned, {} pageable, {} of "
                        "other memory (smaller buffers, the program's own pinned)\n",
                        p.value("pid", 0), p.value("child", false) ? " (forked)" : "", p.value("buffers", 0), pinned,
                        pageable, unserved);
    if (p.value("registration_disabled", false)) {
      text += fmt::format("  registering failed (CUDA error {}): the program went on with pageable memory\n",
                          p.value("last_cuda_error", 0));
    } else if (!p.value("cuda_seen", false)) {
      text += "  no CUDA copy from a served buffer: nothing to pin\n";
    } else if (p.value("registrations", 0) == 0) {
      text += "  nothing pinned: no buffer's copies paid for registering it\n";
    } else {
      text += fmt::format("  {} buffers pinned ({} at most, {:.1f} ms registering), {} allocations given a "
                          "pinned buffer from the pool; pinning saved about {:.0f} ms of copies (copy table)\n",
                          p.value("registrations", 0), mib(p.value("peak_pinned_bytes", 0.0)),
                          p.value("register_ms", 0.0), p.value("pool_hits", 0), p.value("modeled_saving_ms", 0.0));
    }
    if (p.value("declined_for_cap", 0))
      text += fmt::format("  {} pinnings declined at the cap ({}): --cap raises it\n", p.value("declined_for_cap", 0),
                          mib(p.value("cap_bytes", 0.0)));
  }
  if (text.empty()) text = "gpuscope pin: no process served a large buffer or made a copy\n";
  return text;
}

int run_pinned(const PinOptions& opts) {
  if (opts.command.empty()) throw Error("give the command to run after --, e.g. gpuscope pin -- python train.py");
  if (opts.mode != "online" && opts.mode != "all" && opts.mode != "off")
    throw Error("--mode '{}': give online, all or off", opts.mode);
  const std::string lib = library_path();
  char dir_template[] = "/tmp/gpuscope-pin-XXXXXX";
  if (!mkdtemp(dir_template)) throw Error("cannot make a directory in /tmp for the reports: {}", strerror(errno));
  const std::string dir = dir_template;
  // What the library reads (src/pin/preload.cpp); the command's own settings of them give way.
  std::map<std::string, std::string> set;
  const char* preload = getenv("LD_PRELOAD");
  set["LD_PRELOAD"] = lib + (preload && *preload ? std::string(":") + preload : "");
  set["GPUSCOPE_PIN_MODE"] = opts.mode;
  set["GPUSCOPE_PIN_REPORT"] = dir + "/report";
  if (!opts.cap.empty()) set["GPUSCOPE_PIN_CAP_BYTES"] = std::to_string(parse_bytes(opts.cap, "--cap"));
  if (!opts.min.empty()) set["GPUSCOPE_PIN_MIN_BYTES"] = std::to_string(parse_bytes(opts.min, "--min"));
  if (opts.relaxed) set["GPUSCOPE_PIN_RELAXED"] = "1";
  if (!opts.copy_table.empty()) {
    if (!fs::exists(opts.copy_table)) throw Error("--copy-table {}: no such file", opts.copy_table);
    set["GPUSCOPE_PIN_COPY_TABLE"] = fs::absolute(opts.copy_table).string();
  }
  if (!opts.use.empty()) {
    if (!fs::exists(opts.use)) throw Error("--use {}: no such file (write one with --profile)", opts.use);
    set["GPUSCOPE_PIN_USE"] = fs::absolute(opts.use).string();
  }
  if (!opts.profile.empty()) {
    // The run's processes append to it: it starts empty.
    std::ofstream truncate(opts.profile, std::ios::trunc);
    if (!truncate) throw Error("cannot write --profile {}", opts.profile);
    set["GPUSCOPE_PIN_PROFILE"] = fs::absolute(opts.profile).string();
  }
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (!eq || !set.count(std::string(*e, size_t(eq - *e)))) env.emplace_back(*e);
  }
  for (const auto& [k, v] : set) env.push_back(k + "=" + v);
  std::vector<char*> envp, argv;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = opts.command;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  int err[2];
  if (pipe2(err, O_CLOEXEC) != 0) throw Error("pipe: {}", strerror(errno));
  const pid_t pid = fork();
  if (pid < 0) throw Error("fork: {}", strerror(errno));
  if (pid == 0) {
    close(err[0]);
    execvpe(argv[0], argv.data(), envp.data());
    const int e = errno;
    [[maybe_unused]] auto n = write(err[1], &e, sizeof e);
    _exit(127);
  }
  close(err[1]);
  int exec_errno = 0;
  const bool failed = read(err[0], &exec_errno, sizeof exec_errno) == sizeof exec_errno;
  close(err[0]);
  // Ctrl-C reaches the command (same process group); gpuscope waits for it and reports.
  signal(SIGINT, SIG_IGN);
  signal(SIGTERM, SIG_IGN);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  if (failed) {
    std::error_code ec;
    fs::remove_all(dir, ec);
    throw Error("cannot run {}: {}", opts.command[0], strerror(exec_errno));
  }
  std::vector<nlohmann::json> reports;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::ifstream in(entry.path());
    auto j = nlohmann::json::parse(in, nullptr, false);
    if (!j.is_discarded()) reports.push_back(std::move(j));
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  std::sort(reports.begin(), reports.end(),
            [](const auto& a, const auto& b) { return a.value("pid", 0) < b.value("pid", 0); });
  const auto summary = summarize(reports);
  fprintf(stderr, "%s", render_summary(summary).c_str());
  if (!opts.report.empty()) {
    std::ofstream out(opts.report);
    if (!out) throw Error("cannot write --report {}", opts.report);
    out << summary.dump(2) << "\n";
  }
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

}  // namespace gpuscope::pin
