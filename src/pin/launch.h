// `gpuscope pin -- CMD`: runs a command with libgpuscope_pin.so preloaded (pin/preload.cpp) and
// says, per process, what it pinned and what that saved.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace gpuscope::pin {

struct PinOptions {
  std::vector<std::string> command;
  std::string mode = "online";  // online, all, off
  std::string cap;              // pinned bytes at most ("8G"); empty: a quarter of the host's memory
  std::string min;              // smaller buffers are left to the C library ("256K")
  bool relaxed = false;         // asynchronous copies of pinned buffers stay asynchronous
  std::string copy_table;       // bench/pin/copy_table's output for this machine
  std::string report;           // a JSON summary written here
  std::string profile;          // what the run learned of its allocation sites, written here
  std::string use;              // a profile an earlier run wrote, to start from
};

// Bytes from "512K", "8G", "1.5M" or a plain number; throws gpuscope::Error.
size_t parse_bytes(const std::string& text, const char* option);

// Runs the command to its end; its exit status (128 + signal when killed). Throws gpuscope::Error
// when it cannot be started.
int run_pinned(const PinOptions& opts);

// The processes' reports (the library's JSON, one per process), summed up for users.
nlohmann::json summarize(const std::vector<nlohmann::json>& reports);
std::string render_summary(const nlohmann::json& summary);

}  // namespace gpuscope::pin
