#include "discover/fd_names.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <fmt/format.h>

#include <array>
#include <fstream>
#include <sstream>
#include <utility>

namespace gpuscope::discover {
namespace {

// /proc/net/tcp's addresses: hex, the IPv4 one in host order, IPv6 as four host-order words.
std::string address(const std::string& hex, bool v6) {
  const auto colon = hex.find(':');
  if (colon == std::string::npos) return hex;
  const unsigned port = unsigned(std::stoul(hex.substr(colon + 1), nullptr, 16));
  char buf[INET6_ADDRSTRLEN] = {};
  if (!v6) {
    in_addr a{uint32_t(std::stoul(hex.substr(0, colon), nullptr, 16))};
    inet_ntop(AF_INET, &a, buf, sizeof(buf));
    return fmt::format("{}:{}", buf, port);
  }
  in6_addr a{};
  for (int w = 0; w < 4 && size_t(w * 8 + 8) <= colon; ++w) {
    const uint32_t word = uint32_t(std::stoul(hex.substr(size_t(w) * 8, 8), nullptr, 16));
    std::memcpy(&a.s6_addr[w * 4], &word, 4);
  }
  inet_ntop(AF_INET6, &a, buf, sizeof(buf));
  return fmt::format("[{}]:{}", buf, port);
}

}  // namespace

std::string FdNames::name(pid_t pid, int fd) {
  if (fd < 0) return "";
  std::array<char, 4096> buf{};
  const auto link = fmt::format("/proc/{}/fd/{}", pid, fd);
  const ssize_t n = readlink(link.c_str(), buf.data(), buf.size() - 1);
  if (n <= 0) return "";
  std::string target(buf.data(), size_t(n));
  if (target.starts_with("pipe:")) return "pipe";
  if (target.starts_with("socket:[") && target.ends_with("]")) {
    try {
      const uint64_t inode = std::stoull(target.substr(8, target.size() - 9));
      auto name = socket_name(pid, inode);
      if (!name.empty()) return name;
    } catch (const std::exception&) {
    }
    return "socket";
  }
  return target;
}

std::string FdNames::socket_name(pid_t pid, uint64_t inode) {
  if (auto it = sockets_.find(inode); it != sockets_.end()) return it->second;
  std::string found;
  // tcp/udp: "sl local rem st tx:rx tr:when retrnsmt uid timeout inode"; unix: "Num RefCount
  // Protocol Flags Type St Inode Path".
  for (const auto& [table, v6] : {std::pair{"tcp", false}, {"tcp6", true}, {"udp", false}, {"udp6", true}}) {
    std::ifstream in(fmt::format("/proc/{}/net/{}", pid, table));
    std::string line;
    std::getline(in, line);
    while (found.empty() && std::getline(in, line)) {
      std::istringstream f(line);
      std::string sl, local, remote, st, queues, timer, retr, uid, timeout, ino;
      if (!(f >> sl >> local >> remote >> st >> queues >> timer >> retr >> uid >> timeout >> ino)) continue;
      if (ino != std::to_string(inode)) continue;
      const std::string proto = std::string(table).substr(0, 3);
      found = remote.find_first_not_of("0:") == std::string::npos
                  ? fmt::format("{} {}", proto, address(local, v6))
                  : fmt::format("{} {} -> {}", proto, address(local, v6), address(remote, v6));
    }
    if (!found.empty()) break;
  }
  if (found.empty()) {
    std::ifstream in(fmt::format("/proc/{}/net/unix", pid));
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string num, refs, proto, flags, type, st, ino, path;
      if (!(f >> num >> refs >> proto >> flags >> type >> st >> ino)) continue;
      if (ino != std::to_string(inode)) continue;
      f >> path;
      found = path.empty() ? "unix socket" : "unix " + path;
      break;
    }
  }
  // A socket /proc/PID/net does not list (netlink, one already closed) is remembered too: a thread
  // that keeps blocking on it would otherwise read every table again at each window.
  if (sockets_.size() >= 4096) sockets_.clear();
  sockets_[inode] = found;
  return found;
}

std::string syscall_name(int nr) {
  static const std::unordered_map<int, const char*> kNames = {
      {0, "read"},         {1, "write"},        {3, "close"},         {7, "poll"},        {17, "pread64"},
      {18, "pwrite64"},    {19, "readv"},       {20, "writev"},       {23, "select"},     {35, "nanosleep"},
      {42, "connect"},     {43, "accept"},      {44, "sendto"},       {45, "recvfrom"},   {46, "sendmsg"},
      {47, "recvmsg"},     {61, "wait4"},       {74, "fsync"},        {75, "fdatasync"},  {77, "ftruncate"},
      {202, "futex"},      {230, "clock_nanosleep"}, {232, "epoll_wait"}, {270, "pselect6"}, {271, "ppoll"},
      {277, "sync_file_range"}, {281, "epoll_pwait"}, {288, "accept4"}, {295, "preadv"}, {296, "pwritev"},
      {299, "recvmmsg"},   {307, "sendmmsg"},   {441, "epoll_pwait2"}, {449, "futex_waitv"}, {9, "mmap"},
      {11, "munmap"},      {2, "open"},         {257, "openat"},      {4, "stat"},        {262, "newfstatat"},
  };
  if (nr < 0) return "";
  const auto it = kNames.find(nr);
  return it == kNames.end() ? fmt::format("syscall {}", nr) : it->second;
}

}  // namespace gpuscope::discover
