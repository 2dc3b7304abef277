// A whole file's text, for the small files gpuscope reads from /proc and /sys.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <string>

namespace gpuscope {

// Its text, or nothing where it cannot be opened. Plain reads: the agent reads pressure and
// cgroup files several times a second, and a stream and a string stream per file cost more than
// the kernel's side of it.
inline std::optional<std::string> read_text_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      out.append(buf, size_t(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(fd);
  return out;
}

}  // namespace gpuscope
