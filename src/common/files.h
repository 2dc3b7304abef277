// A whole file's text, for the small files gpuscope reads from /proc and /sys.
#pragma once

#include <fstream>
#include <optional>
#include <sstream>
#include <string>

namespace gpuscope {

// Its text, or nothing where it cannot be opened.
inline std::optional<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace gpuscope
