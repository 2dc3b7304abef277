#include "agent/http_server.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <sys/socket.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "common/error.h"
#include "common/thread_name.h"

namespace gpuscope::agent {

struct HttpServer::Impl {
  Handler handler;
  MHD_Daemon* daemon = nullptr;

  // Connections whose current request has not been answered yet, and since when they wait for
  // it: the reaper shuts those past the deadline. Entries go before MHD closes their socket, under
  // this lock, so that a descriptor shut is still the connection's.
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::unordered_map<MHD_Connection*, std::pair<int, std::chrono::steady_clock::time_point>> waiting;
  std::thread reaper;

  void reap() {
    std::unique_lock lock(mu);
    while (!stopping) {
      cv.wait_for(lock, std::chrono::seconds(1));
      const auto now = std::chrono::steady_clock::now();
      for (auto& [conn, w] : waiting)
        if (w.first >= 0 && now - w.second > kRequestDeadline) {
          shutdown(w.first, SHUT_RDWR);  // MHD sees the connection fail and closes it
          w.first = -1;
        }
    }
  }
};

namespace {

using Impl = HttpServer::Impl;

void on_connection(void* cls, MHD_Connection* conn, void**, MHD_ConnectionNotificationCode code) {
  auto* impl = static_cast<Impl*>(cls);
  std::lock_guard lock(impl->mu);
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    const MHD_ConnectionInfo* info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    impl->waiting[conn] = {info ? info->connect_fd : -1, std::chrono::steady_clock::now()};
  } else {
    impl->waiting.erase(conn);
  }
}

// A request answered: on a kept-alive connection, the next one's head is timed from now.
void on_completed(void* cls, MHD_Connection* conn, void**, MHD_RequestTerminationCode) {
  auto* impl = static_cast<Impl*>(cls);
  std::lock_guard lock(impl->mu);
  if (auto it = impl->waiting.find(conn); it != impl->waiting.end() && it->second.first >= 0)
    it->second.second = std::chrono::steady_clock::now();
}

MHD_Result add_query(void* cls, MHD_ValueKind, const char* key, const char* value) {
  static_cast<HttpRequest*>(cls)->query[key ? key : ""] = value ? value : "";
  return MHD_YES;
}

MHD_Result on_request(void* cls, MHD_Connection* conn, const char* url, const char* method, const char*,
                      const char*, size_t* upload_size, void** request_state) {
  auto* impl = static_cast<Impl*>(cls);
  // The head is in: the deadline is met. (A body is not read: every route is a GET.)
  if (!*request_state) {
    *request_state = impl;
    std::lock_guard lock(impl->mu);
    if (auto it = impl->waiting.find(conn); it != impl->waiting.end())
      it->second.second = std::chrono::steady_clock::time_point::max() - HttpServer::kRequestDeadline;
  }
  if (*upload_size) {
    *upload_size = 0;  // drained; answered once it is all in
    return MHD_YES;
  }
  HttpRequest req;
  req.method = method ? method : "";
  req.path = url ? url : "";
  MHD_get_connection_values(conn, MHD_GET_ARGUMENT_KIND, add_query, &req);
  if (const char* auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION))
    req.authorization = auth;
  HttpResponse res;
  if (req.method != "GET" && req.method != "HEAD") {
    res.status = 405;
    res.body = "only GET\n";
  } else {
    try {
      res = impl->handler(req);
    } catch (const std::exception& e) {
      res = {500, "text/plain", std::string(e.what()) + "\n"};
    }
  }
  MHD_Response* response = MHD_create_response_from_buffer(res.body.size(), res.body.data(), MHD_RESPMEM_MUST_COPY);
  if (!response) return MHD_NO;
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, res.content_type.c_str());
  const MHD_Result queued = MHD_queue_response(conn, static_cast<unsigned>(res.status), response);
  MHD_destroy_response(response);
  return queued;
}

}  // namespace

HttpServer::HttpServer(const std::string& host, int port, Handler handler) : impl_(std::make_unique<Impl>()) {
  impl_->handler = std::move(handler);
  sockaddr_storage addr{};
  if (inet_pton(AF_INET6, host.c_str(), &reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr) == 1) {
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&addr);
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(uint16_t(port));
  } else {
    auto* a4 = reinterpret_cast<sockaddr_in*>(&addr);
    a4->sin_family = AF_INET;
    a4->sin_port = htons(uint16_t(port));
    if (inet_pton(AF_INET, host.c_str(), &a4->sin_addr) != 1) {
      addrinfo hints{}, *found = nullptr;
      hints.ai_family = AF_INET;
      if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || !found)
        throw Error("cannot listen on {}:{}: the host is not an address or a name that resolves", host, port);
      a4->sin_addr = reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr;
      freeaddrinfo(found);
    }
  }
  unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD;
  if (addr.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
  errno = 0;
  impl_->daemon = MHD_start_daemon(
      flags, uint16_t(port), nullptr, nullptr, on_request, impl_.get(),  //
      MHD_OPTION_SOCK_ADDR, reinterpret_cast<sockaddr*>(&addr),          //
      MHD_OPTION_THREAD_POOL_SIZE, 2u,                                   // a slow handler leaves the other loop
      MHD_OPTION_CONNECTION_LIMIT, kMaxConnections,                      //
      MHD_OPTION_PER_IP_CONNECTION_LIMIT, kMaxPerAddress,                //
      MHD_OPTION_CONNECTION_TIMEOUT, kIdleTimeout,                       //
      MHD_OPTION_CONNECTION_MEMORY_LIMIT, size_t(64 * 1024),             // a request's head and query
      MHD_OPTION_NOTIFY_CONNECTION, on_connection, impl_.get(),          //
      MHD_OPTION_NOTIFY_COMPLETED, on_completed, impl_.get(),            //
      MHD_OPTION_END);
  if (!impl_->daemon)
    throw Error("cannot listen on {}:{}: {} (is another agent running? set listen: in the config)", host, port,
                errno ? std::strerror(errno) : "the HTTP server did not start");
  impl_->reaper = std::thread([impl = impl_.get()] {
    name_this_thread("gs-http-reaper");
    impl->reap();
  });
}

HttpServer::~HttpServer() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  if (impl_->reaper.joinable()) impl_->reaper.join();
  MHD_stop_daemon(impl_->daemon);
}

}  // namespace gpuscope::agent
