// Naming what a thread blocked on, from this process's own descriptors.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>

#include "discover/fd_names.h"

using namespace gpuscope;

TEST(FdNames, FilesPipesAndTcpSocketsAreNamed) {
  discover::FdNames names;
  const auto path = std::filesystem::temp_directory_path() / fmt::format("gpuscope_fd_{}", getpid());
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(names.name(getpid(), fileno(f)), path.string());
  std::fclose(f);
  std::filesystem::remove(path);

  int p[2];
  ASSERT_EQ(pipe(p), 0);
  EXPECT_EQ(names.name(getpid(), p[0]), "pipe");
  close(p[0]);
  close(p[1]);

  const int server = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(server, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(server, 1), 0);
  socklen_t len = sizeof(a);
  getsockname(server, reinterpret_cast<sockaddr*>(&a), &len);
  EXPECT_EQ(names.name(getpid(), server), fmt::format("tcp 127.0.0.1:{}", ntohs(a.sin_port)));
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(client, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  sockaddr_in mine{};
  len = sizeof(mine);
  getsockname(client, reinterpret_cast<sockaddr*>(&mine), &len);
  EXPECT_EQ(names.name(getpid(), client),
            fmt::format("tcp 127.0.0.1:{} -> 127.0.0.1:{}", ntohs(mine.sin_port), ntohs(a.sin_port)));
  close(client);
  close(server);

  EXPECT_EQ(names.name(getpid(), 100000), "");  // no such descriptor
  EXPECT_EQ(discover::syscall_name(74), "fsync");
  EXPECT_EQ(discover::syscall_name(-1), "");
}
