// Shared by the fuzz targets: the input as a file (the parsers under test read paths). A real
// file on tmpfs, not a memfd: SQLite resolves /proc/self/fd/N to the memfd's name and cannot
// open that.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <string>

namespace gpuscope::fuzz {

class InputFile {
 public:
  InputFile(const uint8_t* data, size_t size)
      : path_("/dev/shm/gpuscope-fuzz-" + std::to_string(getpid()) + "-" + std::to_string(next_++)) {
    const int fd = open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    for (size_t done = 0; fd >= 0 && done < size;) {
      const ssize_t n = write(fd, data + done, size - done);
      if (n <= 0) break;
      done += size_t(n);
    }
    if (fd >= 0) close(fd);
  }
  ~InputFile() {
    unlink(path_.c_str());
    for (const char* suffix : {"-wal", "-shm", "-journal"}) unlink((path_ + suffix).c_str());
  }
  const std::string& path() const { return path_; }

 private:
  static inline uint64_t next_ = 0;
  std::string path_;
};

}  // namespace gpuscope::fuzz
