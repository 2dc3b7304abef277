// The agent's HTTP service as a client on the network meets it: bytes sent to a real
// HttpServer (GNU libmicrohttpd and gpuscope's request assembly: path, query, Authorization,
// deadlines) on the loopback, answered by a handler that reads the request as the agent's does.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>

#include "agent/http_server.h"
#include "common/error.h"

namespace {

int g_port = 0;

std::unique_ptr<gpuscope::agent::HttpServer> start_server() {
  auto handler = [](const gpuscope::agent::HttpRequest& req) {
    gpuscope::agent::HttpResponse res;
    res.body = req.method + " " + req.path + " " + req.authorization;
    for (const auto& [k, v] : req.query) res.body += "\n" + k + "=" + v;
    if (req.has("pid")) res.status = 400;
    return res;
  };
  for (int port = 20000 + getpid() % 20000;; port = 20000 + (port + 7) % 40000) {
    try {
      auto server = std::make_unique<gpuscope::agent::HttpServer>("127.0.0.1", port, handler);
      g_port = port;
      return server;
    } catch (const gpuscope::Error&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static auto server = start_server();
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(g_port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    for (size_t done = 0; done < size;) {
      const ssize_t n = send(fd, data + done, size - done, MSG_NOSIGNAL);
      if (n <= 0) break;
      done += size_t(n);
    }
    shutdown(fd, SHUT_WR);
    // The answer, until the server closes (it does on a bad request, or at the end of what
    // was sent); a request left incomplete is cut off by the server's deadline, not waited for.
    char buf[65536];
    pollfd p{fd, POLLIN, 0};
    while (poll(&p, 1, 200) > 0 && recv(fd, buf, sizeof(buf), 0) > 0) {
    }
  }
  close(fd);
  return 0;
}
