// What a process's file descriptor is, for the evidence of what a thread blocked on: a file's
// path, a socket's addresses, a pipe. Read from /proc at the time asked (the descriptor may have
// been closed or reused since the thread blocked on it: best effort).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <unordered_map>

namespace gpuscope::discover {

class FdNames {
 public:
  // "/data/ckpt.pt", "tcp 10.0.0.7:41234 -> 10.0.0.9:5000", "unix /run/x.sock", "pipe", or the
  // link's text ("anon_inode:[eventfd]"); "" when the descriptor is gone.
  std::string name(pid_t pid, int fd);

 private:
  std::string socket_name(pid_t pid, uint64_t inode);
  std::unordered_map<uint64_t, std::string> sockets_;  // by inode ("": not found); cleared past 4096
};

// x86-64 system calls a thread sleeps in, by number ("fsync"); "syscall N" for others, "" for -1.
std::string syscall_name(int nr);

}  // namespace gpuscope::discover
