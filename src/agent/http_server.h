// The agent's HTTP service (/metrics, /healthz, /debug/pprof/), on GNU libmicrohttpd's event
// loop: a client that sends its request slowly holds one connection slot, not a handler thread.
// (A pool of two handler threads that each waited up to 5 s per read let two clients dripping a
// header line every 3 s keep /healthz from answering, and Kubernetes would restart the agent.)
//
// Bounds: connections in all and per client address; a request's head must arrive whole within
// kRequestDeadline of its connection's start (or of the previous request's end on a kept-alive
// connection), else the connection is shut; a connection idle longer than kIdleTimeout is closed.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>

namespace gpuscope::agent {

struct HttpRequest {
  std::string method, path;
  std::map<std::string, std::string> query;
  std::string authorization;  // the Authorization header, "" if none
  bool has(const std::string& key) const { return query.contains(key); }
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain";
  std::string body;
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;
  static constexpr std::chrono::seconds kRequestDeadline{10};
  static constexpr unsigned kIdleTimeout = 15;  // seconds
  static constexpr unsigned kMaxConnections = 128, kMaxPerAddress = 16;

  // Listens on host:port (host "0.0.0.0" or "::": every interface) and serves `handler` from
  // threads of its own. Throws Error when it cannot listen.
  HttpServer(const std::string& host, int port, Handler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpuscope::agent
