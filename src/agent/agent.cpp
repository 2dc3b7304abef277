#include "agent/agent.h"

#include <httplib.h>
#include <malloc.h>
#include <nlohmann/json.hpp>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>

#include <condition_variable>
#include <set>
#include <fstream>
#include <thread>
#include <tuple>

#include "agent/aggregator.h"
#include "agent/budget.h"
#include "agent/http_server.h"
#include "agent/metrics.h"
#include "attach/preflight.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/files.h"
#include "common/log.h"
#include "common/thread_name.h"
#include "discover/proc.h"
#include "record/tracer.h"
#include "report/flamegraph.h"

// The calibration probe's target: a function of our own that begins as the CUDA libraries' do,
// with `push %rbp`. The kernel emulates that instruction at a uprobe; most others (a compiled
// `mov %edi,%eax`) it single-steps out of line, a second trap: the estimate of a hit's cost was
// 6.6 us on the H100 and 9-13 us on the dev VM that way, where a probed CUDA call cost 1-2 us.
extern "C" int gpuscope_calibration_target(int x);
asm(R"(
  .text
  .globl gpuscope_calibration_target
  .type gpuscope_calibration_target, @function
gpuscope_calibration_target:
  push %rbp
  mov %rsp, %rbp
  mov %edi, %eax
  and $1, %eax
  pop %rbp
  ret
  .size gpuscope_calibration_target, .-gpuscope_calibration_target
)");

namespace gpuscope::agent {
namespace {

struct SelfMemory {
  uint64_t resident = 0;
  // Of it, anonymous: the heap, which grows with the workload. The rest (the binary, the files
  // it reads symbols and unwind tables from, mapped) is the page cache's to drop.
  uint64_t anonymous = 0;
};
SelfMemory self_memory() {
  // /proc/self/statm: size resident shared text lib data dt, in pages (shared: file-backed and
  // shared memory).
  const auto text = read_text_file("/proc/self/statm");
  unsigned long long size = 0, resident = 0, shared = 0;
  if (!text || std::sscanf(text->c_str(), "%llu %llu %llu", &size, &resident, &shared) != 3) return {};
  const uint64_t page = uint64_t(sysconf(_SC_PAGESIZE));
  return {resident * page, (resident > shared ? resident - shared : 0) * page};
}

double self_cpu_s() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

std::string read_token(const std::string& path) {
  if (path.empty()) return {};
  std::ifstream in(path);
  std::string token;
  if (!in || !std::getline(in, token) || token.empty())
    throw Error("cannot read a bearer token from {} (one line, non-empty)", path);
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ')) token.pop_back();
  return token;
}

std::pair<std::string, int> split_listen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || (port = std::atoi(listen.c_str() + colon + 1)) <= 0 || port > 65535)
    throw Error("listen address '{}' must be HOST:PORT, e.g. 127.0.0.1:9464", listen);
  std::string host = listen.substr(0, colon);
  if (host.size() > 1 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return {host.empty() ? "0.0.0.0" : host, port};
}

// scheme://host[:port] and the path of a URL, for httplib's client.
std::pair<std::string, std::string> split_url(const std::string& url) {
  const size_t scheme_end = url.find("://");
  const size_t path_at = url.find('/', scheme_end == std::string::npos ? 0 : scheme_end + 3);
  if (path_at == std::string::npos) return {url, "/"};
  return {url.substr(0, path_at), url.substr(path_at)};
}

// Pyroscope's application name: NAME{label=value,...}; label values may not hold , } =.
std::string pyroscope_name(const std::string& base, const Labels& labels) {
  std::string out = base + "{";
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (v.empty()) continue;
    std::string clean = v;
    for (char& c : clean)
      if (c == ',' || c == '}' || c == '{' || c == '=' || c == ' ') c = '_';
    out += (first ? "" : ",") + k + "=" + clean;
    first = false;
  }
  return out + "}";
}

class Agent {
 public:
  explicit Agent(const AgentRun& run) : run_(run) {}
  int run();

 private:
  AgentConfig read_config() const;
  void apply_live(AgentConfig c);
  void start_server();
  void stop_server();
  void exporter_loop();
  void push_otlp();
  // The live findings that began since the last push, as OTLP log records to the collector's /v1/logs.
  void push_finding_logs();
  void take_and_push_profiles();
  // Profiles are named only while someone takes them (a Pyroscope push, or a request for
  // /debug/pprof/ in the last kProfileAskedNs): naming a window's stacks was a third of the
  // agent's CPU beside a PyTorch job. Otherwise each window is kept unnamed, and a request
  // names the last one then.
  bool profiles_wanted(uint64_t now_ns, const AgentConfig& c) const;
  void profiles_asked();
  // Makes `window` the last one (named, or kept unnamed in the aggregator); returns the one before,
  // for the caller to free once the lock is let go (its stacks are large). Takes mu_.
  std::shared_ptr<const std::vector<ProcessProfile>> replace_profiles(
      std::shared_ptr<const std::vector<ProcessProfile>> window, bool named);
  static constexpr uint64_t kProfileAskedNs = 300'000'000'000ull;
  void update_health();
  void enforce_memory_limit();
  std::string metrics_text();
  std::string profile_bytes(const std::string& type, int64_t pid, bool& found);
  bool authorized(const HttpRequest& req, bool profiles) const;
  HttpResponse serve(const HttpRequest& req);
  // Warns when the listen address or a missing token exposes more than this host sees.
  void say_what_is_exposed() const;

  const AgentRun& run_;
  AgentConfig cfg_;
  std::unique_ptr<Aggregator> agg_;
  std::unique_ptr<LiveDiagnosis> live_;  // with cfg_.diagnose
  // The live findings' gauges, for /metrics and OTLP.
  std::vector<MetricFamily> live_families() const {
    if (!live_) return {};
    return live_->families([this](uint32_t pid) { return agg_->labels_of(pid); });
  }
  std::unique_ptr<record::Tracer> tracer_;
  std::unique_ptr<BudgetController> budget_;
  attach::BpfSession::HitCost trap_cost_;  // the calibration: a trap with a program that does nothing
  attach::BpfSession::HitCost hit_cost_;   // trap + the call programs' mean run time
  // The call programs' mean run time in ns (call_entry_emit; call_entry + call_return): a prior
  // until they have run a thousand times, then measured.
  double bpf_entry_ns_ = 1000, bpf_pair_ns_ = 2000;
  void update_hit_cost();
  uint64_t start_unix_ns_ = realtime_ns();
  std::string hostname_;

  // Read by the HTTP and exporter threads.
  mutable std::mutex mu_;
  std::string token_;
  std::vector<MetricFamily> health_;  // the agent's own series and the budget's, at the last tick
  uint64_t health_changes_ = 0;       // the budget's changes() health_ was made at
  // The last complete window, shared with the exporter's push (never copied: its stacks are large).
  std::shared_ptr<const std::vector<ProcessProfile>> profiles_ = std::make_shared<std::vector<ProcessProfile>>();
  bool profiles_named_ = true;  // false: the last window was kept unnamed (profiles_wanted)
  std::atomic<uint64_t> profile_asked_ns_{0};
  // Windows ended named, kept unnamed, and named on a request later.
  std::atomic<uint64_t> windows_named_{0}, windows_kept_{0}, windows_named_on_request_{0};
  std::map<std::string, double> export_errors_;

  std::unique_ptr<HttpServer> server_;
  std::thread exporter_;
  std::mutex exporter_mu_;
  std::condition_variable exporter_cv_;
  bool exporter_stop_ = false;
  uint64_t shed_memory_ = 0;
  uint64_t heap_after_trim_ = 0, last_trim_ns_ = 0;  // enforce_memory_limit's last malloc_trim (heap after it)
  uint64_t heap_after_shed_ = 0, last_shed_ns_ = 0;  // and its last shedding
  std::set<pid_t> probe_errors_said_;
  double last_cpu_s_ = 0, last_main_cpu_s_ = 0;  // the agent's CPU; this (the main) thread's
  uint64_t last_cpu_ns_ = 0;
  uint64_t last_records_ = 0, last_high_rate_ = 0;  // at last_cpu_ns_
};

AgentConfig Agent::read_config() const {
  AgentConfig c = run_.config_path.empty() ? AgentConfig{} : load_config(run_.config_path);
  if (run_.overrides) run_.overrides(c);
  return c;
}

bool Agent::authorized(const HttpRequest& req, bool profiles) const {
  std::lock_guard lock(mu_);
  if (token_.empty() || (!profiles && !cfg_.protect_metrics)) return true;
  return req.authorization == "Bearer " + token_;
}

std::string Agent::metrics_text() {
  std::vector<MetricFamily> extra = live_families();
  {
    std::lock_guard lock(mu_);
    extra.insert(extra.end(), health_.begin(), health_.end());
  }
  return to_prometheus_text(agg_->snapshot(std::move(extra), start_unix_ns_));
}

std::string Agent::profile_bytes(const std::string& type, int64_t pid, bool& found) {
  std::lock_guard lock(mu_);
  report::FlameData merged;
  found = false;
  for (const auto& p : *profiles_) {
    if (pid && p.pid != uint64_t(pid)) continue;
    const auto& d = type == "cpu" ? p.cpu : p.launches;
    if (!found) {
      merged.sample_type = d.sample_type;
      merged.unit = d.unit;
      merged.period = d.period;
    }
    // The processes' windows together (one ends where the next begins, for every process).
    const int64_t end = std::max(merged.time_nanos + merged.duration_nanos, d.time_nanos + d.duration_nanos);
    if (!found || d.time_nanos < merged.time_nanos) merged.time_nanos = d.time_nanos;
    merged.duration_nanos = end - merged.time_nanos;
    found = true;
    for (const auto& [stack, v] : d.stacks) merged.stacks[stack] += v;
    merged.sources.insert(d.sources.begin(), d.sources.end());
  }
  if (!found) return {};
  if (merged.sample_type.empty()) {
    merged.sample_type = type == "cpu" ? "cpu" : "launches";
    merged.unit = type == "cpu" ? "nanoseconds" : "count";
  }
  return report::to_pprof(merged);
}

void Agent::say_what_is_exposed() const {
  const std::string host = split_listen(cfg_.listen).first;
  const bool local = host == "127.0.0.1" || host == "::1" || host == "localhost" || host.starts_with("127.");
  if (host == "0.0.0.0" || host == "::")
    log_warn("listen: '{}' serves /metrics and /debug/pprof/ on every interface of this host{}", cfg_.listen,
             cfg_.listen.starts_with(":") ? " (no host given); write 127.0.0.1:PORT to keep it local" : "");
  if (!local && token_.empty())
    log_warn("profiles (/debug/pprof/, which name your code's functions and files) are served on {} to anyone "
             "who can reach it: set bearer_token_file to ask for a token",
             cfg_.listen);
  else if (!local && !run_.quiet)
    log_info("profiles are served on {}, behind the bearer token", cfg_.listen);
}

void Agent::start_server() {
  const auto [host, port] = split_listen(cfg_.listen);
  server_ = std::make_unique<HttpServer>(host, port, [this](const HttpRequest& req) { return serve(req); });
  if (!run_.quiet) log_info("serving /metrics and /debug/pprof/ on http://{}", cfg_.listen);
}

HttpResponse Agent::serve(const HttpRequest& req) {
  if (req.path == "/healthz") return {200, "text/plain", "ok\n"};
  if (req.path == "/metrics") {
    if (!authorized(req, false)) return {401, "text/plain", "a bearer token is required\n"};
    return {200, "text/plain; version=0.0.4; charset=utf-8", metrics_text()};
  }
  // pprof, as Parca and `go tool pprof` fetch it: the last complete window, one process
  // (?pid=) or all of them, each under a root frame naming the process.
  const bool cpu = req.path == "/debug/pprof/profile", launches = req.path == "/debug/pprof/cuda_launches";
  if (cpu || launches) {
    if (!authorized(req, true)) return {401, "text/plain", "a bearer token is required\n"};
    int64_t pid = 0;
    if (req.has("pid")) {
      const std::string& text = req.query.at("pid");
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), pid);
      if (ec != std::errc() || end != text.data() + text.size() || pid <= 0)
        return {400, "text/plain", "pid must be a process id, e.g. ?pid=1234 (leave it out for every process)\n"};
    }
    profiles_asked();
    bool found = false;
    std::string bytes = profile_bytes(cpu ? "cpu" : "launches", pid, found);
    if (!found)
      return {404, "text/plain",
              pid ? "no profile for this pid in the last window\n" : "no profile yet: wait one interval\n"};
    return {200, "application/octet-stream", std::move(bytes)};
  }
  if (req.path == "/debug/pprof/" || req.path == "/debug/pprof") {
    if (!authorized(req, true)) return {401, "text/plain", "a bearer token is required\n"};
    profiles_asked();
    std::string out =
        "profiles of the last window (pprof): /debug/pprof/profile (CPU), /debug/pprof/cuda_launches; ?pid=N for one "
        "process\n";
    std::lock_guard lock(mu_);
    for (const auto& p : *profiles_)
      out += fmt::format("pid {} ({}): {} CPU stacks, {} launch stacks\n", p.pid, p.comm, p.cpu.stacks.size(),
                         p.launches.stacks.size());
    return {200, "text/plain", std::move(out)};
  }
  if (req.path == "/debug/diagnosis") {
    // The live diagnosis's findings with their evidence and fixes (the series carry only shares):
    // behind the token as profiles are, since the evidence names processes, files and lines.
    if (!authorized(req, true)) return {401, "text/plain", "a bearer token is required\n"};
    nlohmann::json out = nlohmann::json::array();
    if (live_)
      for (const auto& c : live_->current()) {
        nlohmann::json steps = nlohmann::json::array(), unobserved = nlohmann::json::array();
        for (const auto& [start, ms] : c.recent_steps) steps.push_back({start, ms});
        for (const auto& [from, to] : c.unobserved) unobserved.push_back({from, to});
        nlohmann::json findings = nlohmann::json::array();
        for (const auto& f : c.findings)
          findings.push_back({{"cause", f.cause}, {"title", f.title}, {"share_of_step", f.share},
                              {"ms_per_step", f.ms_per_step}, {"evidence", f.evidence}, {"fix", f.fix},
                              {"confidence", f.confidence}});
        out.push_back({{"pid", c.pid}, {"comm", c.comm}, {"step_seconds", c.step_s}, {"steps", c.steps},
                       {"analysed_monotonic_ns", c.analysed_ns}, {"findings", std::move(findings)},
                       // [start (CLOCK_MONOTONIC ns), ms] of the steps seen whole in the window, and
                       // [from, to) of the spans the overhead budget had the launch probes off in.
                       {"recent_steps", std::move(steps)}, {"probes_off", std::move(unobserved)}});
      }
    return {200, "application/json", out.dump(1) + "\n"};
  }
  return {404, "text/plain", "not found: /metrics, /healthz, /debug/pprof/, /debug/diagnosis\n"};
}

void Agent::stop_server() { server_.reset(); }

void Agent::push_otlp() {
  std::vector<MetricFamily> extra = live_families();
  PushTarget target;
  {
    std::lock_guard lock(mu_);
    extra.insert(extra.end(), health_.begin(), health_.end());
    target = cfg_.otlp;
  }
  const auto snap = agg_->snapshot(std::move(extra), start_unix_ns_);
  const Labels resource{{"service.name", "gpuscope-agent"}, {"host.name", hostname_}, {"service.version", GPUSCOPE_VERSION}};
  const std::string body = to_otlp_metrics(snap, resource);
  const auto [base, path] = split_url(target.url);
  httplib::Client client(base);
  client.set_connection_timeout(5);
  client.set_read_timeout(10);
  httplib::Headers headers;
  for (const auto& [k, v] : target.headers) headers.emplace(k, v);
  auto res = client.Post(path, headers, body, "application/x-protobuf");
  if (!res || res->status / 100 != 2) {
    std::lock_guard lock(mu_);
    if (export_errors_["otlp"]++ == 0 || g_verbose)
      log_warn("OTLP export to {} failed: {} (retrying each interval; counted in gpuscope_agent_export_errors_total)",
               target.url, res ? fmt::format("HTTP {}", res->status) : httplib::to_string(res.error()));
  }
}

void Agent::push_finding_logs() {
  if (!live_) return;
  auto onsets = live_->take_onsets();
  if (onsets.empty()) return;
  PushTarget target;
  {
    std::lock_guard lock(mu_);
    target = cfg_.otlp;
  }
  const uint64_t mono = monotonic_ns(), unix_now = realtime_ns();
  std::vector<LogEvent> events;
  for (const auto& o : onsets) {
    LogEvent e;
    e.time_unix_ns = unix_now - std::min(unix_now, mono - std::min(mono, o.ts_ns));
    e.name = "gpuscope.diagnosis.finding";
    const auto& f = o.finding;
    e.body = fmt::format("{} ({:.0f}% of step time, {:.1f} ms a step). Evidence: {}. Fix: {}", f.title,
                         f.share * 100, f.ms_per_step, f.evidence, f.fix);
    e.attributes = agg_->labels_of(o.pid);
    e.attributes.emplace_back("cause", f.cause);
    e.attributes.emplace_back("share_of_step", fmt::format("{:.3f}", f.share));
    e.attributes.emplace_back("confidence", f.confidence);
    events.push_back(std::move(e));
  }
  const Labels resource{{"service.name", "gpuscope-agent"}, {"host.name", hostname_}, {"service.version", GPUSCOPE_VERSION}};
  auto [base, path] = split_url(target.url);
  // The collector's logs endpoint beside its metrics one.
  constexpr std::string_view kMetricsPath = "/v1/metrics";
  path = path.ends_with(kMetricsPath) ? path.substr(0, path.size() - kMetricsPath.size()) + "/v1/logs"
                                      : std::string("/v1/logs");
  httplib::Client client(base);
  client.set_connection_timeout(5);
  client.set_read_timeout(10);
  httplib::Headers headers;
  for (const auto& [k, v] : target.headers) headers.emplace(k, v);
  auto res = client.Post(path, headers, to_otlp_logs(events, resource), "application/x-protobuf");
  if (!res || res->status / 100 != 2) {
    std::lock_guard lock(mu_);
    if (export_errors_["otlp_logs"]++ == 0 || g_verbose)
      log_warn("OTLP log export to {}{} failed: {} (findings are dropped; counted in "
               "gpuscope_agent_export_errors_total)",
               base, path, res ? fmt::format("HTTP {}", res->status) : httplib::to_string(res.error()));
  }
}

bool Agent::profiles_wanted(uint64_t now_ns, const AgentConfig& c) const {
  const uint64_t asked = profile_asked_ns_.load(std::memory_order_relaxed);
  return !c.pyroscope.url.empty() ||
         (asked && now_ns - asked < std::max(kProfileAskedNs, uint64_t(4 * c.profile_interval_s * 1e9)));
}

void Agent::profiles_asked() {
  profile_asked_ns_.store(monotonic_ns(), std::memory_order_relaxed);
  {
    std::lock_guard lock(mu_);
    if (profiles_named_) return;
  }
  // Kept unnamed while nobody asked: the last window, named now.
  auto named = agg_->name_unnamed();
  if (named) ++windows_named_on_request_;
  replace_profiles(std::make_shared<const std::vector<ProcessProfile>>(named ? std::move(*named)
                                                                             : std::vector<ProcessProfile>()),
                   true);
}

std::shared_ptr<const std::vector<ProcessProfile>> Agent::replace_profiles(
    std::shared_ptr<const std::vector<ProcessProfile>> window, bool named) {
  std::lock_guard lock(mu_);
  profiles_named_ = named;
  return std::exchange(profiles_, std::move(window));
}

void Agent::take_and_push_profiles() {
  const auto taken = std::make_shared<const std::vector<ProcessProfile>>(agg_->take_profiles());
  const auto& profiles = *taken;
  replace_profiles(taken, true);
  PushTarget target;
  {
    std::lock_guard lock(mu_);
    target = cfg_.pyroscope;
  }
  if (target.url.empty()) return;
  httplib::Client client(target.url);
  client.set_connection_timeout(5);
  client.set_read_timeout(10);
  httplib::Headers headers;
  for (const auto& [k, v] : target.headers) headers.emplace(k, v);
  for (const auto& p : profiles) {
    for (const auto* d : {&p.cpu, &p.launches}) {
      if (d->stacks.empty()) continue;
      const std::string name = pyroscope_name(d == &p.cpu ? "gpuscope.cpu" : "gpuscope.cuda_launches", p.labels);
      const std::string query = fmt::format("/ingest?name={}&from={}&until={}&format=pprof&spyName=gpuscope{}",
                                            httplib::detail::encode_query_param(name), p.from_unix_ns / 1'000'000'000,
                                            p.until_unix_ns / 1'000'000'000,
                                            d == &p.cpu ? fmt::format("&sampleRate={}", cfg_.cpu_profile_hz) : "");
      httplib::MultipartFormDataItems items{{"profile", report::to_pprof(*d), "profile.pprof", "application/octet-stream"}};
      auto res = client.Post(query, headers, items);
      if (!res || res->status / 100 != 2) {
        std::lock_guard lock(mu_);
        if (export_errors_["pyroscope"]++ == 0 || g_verbose)
          log_warn("profile push to {} failed: {} (retrying each interval; counted in gpuscope_agent_export_errors_total)",
                   target.url, res ? fmt::format("HTTP {}", res->status) : httplib::to_string(res.error()));
      }
    }
  }
}

void Agent::exporter_loop() {
  uint64_t next_profiles = monotonic_ns(), next_otlp = monotonic_ns();
  {
    std::lock_guard lock(mu_);
    next_profiles += uint64_t(cfg_.profile_interval_s * 1e9);
    next_otlp += uint64_t(cfg_.otlp.interval_s * 1e9);
  }
  std::unique_lock lock(exporter_mu_);
  while (!exporter_stop_) {
    exporter_cv_.wait_for(lock, std::chrono::milliseconds(200));
    if (exporter_stop_) break;
    lock.unlock();
    const uint64_t now = monotonic_ns();
    AgentConfig c;
    {
      std::lock_guard l(mu_);
      c = cfg_;
    }
    try {
      if (now >= next_profiles) {
        if (profiles_wanted(now, c)) {
          take_and_push_profiles();
          ++windows_named_;
        } else {
          // Marked first: a request from here on names the window kept last (this one, once kept).
          replace_profiles(std::make_shared<const std::vector<ProcessProfile>>(), false);
          agg_->take_profiles(Aggregator::Take::Kept);
          ++windows_kept_;
        }
        next_profiles = now + uint64_t(c.profile_interval_s * 1e9);
      }
      if (!c.otlp.url.empty() && now >= next_otlp) {
        push_otlp();
        next_otlp = now + uint64_t(c.otlp.interval_s * 1e9);
      }
      // Findings go out as they begin, not at the metrics' interval.
      if (!c.otlp.url.empty()) push_finding_logs();
    } catch (const std::exception& e) {
      log_warn("export: {}", e.what());
    }
    lock.lock();
  }
}

void Agent::update_health() {
  const auto st = tracer_->stats();
  const auto lost = tracer_->bpf().lost();
  const auto shed = agg_->shed();
  std::vector<MetricFamily> h;
  auto add = [&](std::string name, std::string help, std::string unit, MetricType type,
                 std::vector<MetricSample> samples) {
    h.push_back(MetricFamily{std::move(name), std::move(help), std::move(unit), type, std::move(samples)});
  };
  add("gpuscope_agent_events_total", "Records the agent read from the kernel", "", MetricType::Counter,
      {{{}, double(st.records)}});
  std::vector<MetricSample> lost_samples;
  for (int cause = 0; cause < GS_LOST_NR; ++cause)
    if (cause != GS_LOST_RETURN_ORPHAN)
      lost_samples.push_back({{{"cause", std::string(attach::lost_cause_name(cause))}}, double(lost[cause])});
  lost_samples.push_back({{{"cause", "queue_full"}}, double(st.queue_dropped_records)});
  lost_samples.push_back({{{"cause", "stack_expired"}}, double(st.stacks.stacks_expired)});
  add("gpuscope_agent_lost_events_total", "Events that could not be recorded, by cause", "", MetricType::Counter,
      std::move(lost_samples));
  // The budget attaches a process's probes while calls are in flight: their returns come
  // without an entry. Nothing observed is lost, so they are not counted as lost.
  add("gpuscope_agent_unmatched_returns_total",
      "Returns of calls entered while their probes were off (switched on during the call)", "", MetricType::Counter,
      {{{}, double(lost[GS_LOST_RETURN_ORPHAN])}});
  add("gpuscope_agent_stack_map_recycles_total", "Times the BPF stack maps were switched and the old one emptied", "",
      MetricType::Counter, {{{}, double(st.stacks.stack_recycles)}});
  add("gpuscope_agent_python_stack_generations_total",
      "Times the Python stacks held were dropped and the BPF side made to send them again", "", MetricType::Counter,
      {{{}, double(st.stacks.python_stack_generations)}});
  add("gpuscope_agent_attached_processes", "Processes whose CUDA libraries are probed", "", MetricType::Gauge,
      {{{}, double(budget_->processes().size())}});
  add("gpuscope_agent_cpu_seconds_total", "CPU time the agent used", "seconds", MetricType::Counter, {{{}, self_cpu_s()}});
  const SelfMemory mem = self_memory();
  add("gpuscope_agent_resident_memory_bytes", "The agent's resident memory", "bytes", MetricType::Gauge,
      {{{}, double(mem.resident)}});
  add("gpuscope_agent_anonymous_memory_bytes",
      "The agent's anonymous resident memory (its heap, kept under memory_limit_mb)", "bytes", MetricType::Gauge,
      {{{}, double(mem.anonymous)}});
  add("gpuscope_agent_probe_hit_cost_seconds",
      "What one probe hit costs a process here: the trap (measured at start) and the probe programs' mean run time",
      "seconds",
      MetricType::Gauge, {{{{"probe", "entry"}}, hit_cost_.entry_ns / 1e9}, {{{"probe", "entry_and_return"}}, hit_cost_.return_ns / 1e9}});
  add("gpuscope_agent_shed_total", "Detail dropped to stay within bounds, by what", "", MetricType::Counter,
      {{{{"what", "kernel_names"}}, double(shed.kernel_names)},
       {{{"what", "stacks"}}, double(shed.stacks)},
       {{{"what", "processes"}}, double(shed.processes)},
       {{{"what", "allocations"}}, double(shed.allocations)},
       {{{"what", "frame_names"}}, double(shed.frame_names)},
       {{{"what", "memory_limit"}}, double(shed_memory_)}});
  add("gpuscope_agent_profile_windows_total",
      "Profile windows, by how: named as they ended; kept unnamed as they ended (nobody had asked for profiles "
      "lately: naming is most of what they cost); named later, on a request",
      "", MetricType::Counter,
      {{{{"how", "named"}}, double(windows_named_.load())},
       {{{"how", "kept"}}, double(windows_kept_.load())},
       {{{"how", "named_on_request"}}, double(windows_named_on_request_.load())}});
  add("gpuscope_agent_budget_ratio", "The share of each process's CPU time its probes may add", "ratio",
      MetricType::Gauge, {{{}, budget_->config().budget}});
  add("gpuscope_agent_observation_factor",
      "What the agent's own CPU budget leaves of each process's duty cycle (1: nothing taken)", "ratio",
      MetricType::Gauge, {{{}, budget_->agent_factor()}});
  h.push_back(budget_->overhead_family(*agg_));
  health_changes_ = budget_->changes();
  std::lock_guard lock(mu_);
  std::vector<MetricSample> errors;
  for (const auto& [target, n] : export_errors_) errors.push_back({{{"target", target}}, n});
  add("gpuscope_agent_export_errors_total", "Pushes that failed, by target", "", MetricType::Counter, std::move(errors));
  health_ = std::move(h);
}

void Agent::update_hit_cost() {
  if (tracer_) {
    uint64_t emit_runs = 0, emit_ns = 0, entry_runs = 0, entry_ns = 0, ret_runs = 0, ret_ns = 0;
    for (const auto& p : tracer_->bpf().program_stats()) {
      if (p.name == "call_entry_emit") emit_runs = p.runs, emit_ns = p.run_time_ns;
      if (p.name == "call_entry") entry_runs = p.runs, entry_ns = p.run_time_ns;
      if (p.name == "call_return") ret_runs = p.runs, ret_ns = p.run_time_ns;
    }
    // Since start: processes come and go, and their stacks differ in depth.
    if (emit_runs >= 1000) bpf_entry_ns_ = double(emit_ns) / double(emit_runs);
    if (entry_runs >= 1000 && ret_runs >= 1000)
      bpf_pair_ns_ = double(entry_ns) / double(entry_runs) + double(ret_ns) / double(ret_runs);
  }
  hit_cost_.entry_ns = trap_cost_.entry_ns + bpf_entry_ns_;
  hit_cost_.return_ns = trap_cost_.return_ns + bpf_pair_ns_;
  if (budget_) budget_->set_hit_costs(hit_cost_.entry_ns, hit_cost_.return_ns);
  if (live_) live_->set_probe_costs(hit_cost_.entry_ns, hit_cost_.return_ns);
}

void Agent::enforce_memory_limit() {
  // The limit is on anonymous memory: what grows with the workload. Beside a PyTorch job on the
  // H100 the whole resident set sat at 90 MiB with the files read for symbols and unwinding
  // mapped, and the window's profiles were dropped at every tick (2026-11-27).
  const uint64_t limit = uint64_t(cfg_.memory_limit_mb) << 20;
  // Bursts (a program registering thousands of kernels at its start) leave freed heap behind
  // that the allocator keeps unless asked: hand it back first. A trim walks the whole heap
  // (4.5% of the agent's CPU on the H100 when done every second), so only once the heap has
  // grown since the last one, or after a minute.
  const uint64_t now = monotonic_ns();
  uint64_t heap = self_memory().anonymous;
  if (heap >= limit * 7 / 10 && (heap >= heap_after_trim_ + (limit >> 5) || now >= last_trim_ns_ + 60'000'000'000ull)) {
    malloc_trim(0);
    heap = self_memory().anonymous;
    heap_after_trim_ = heap;
    last_trim_ns_ = now;
  }
  if (heap < limit * 9 / 10) return;
  // Then shed what grows with the workload: the window's stacks (the profiles of this window
  // are lost; the counters are not). Not again while that did not bring it down and it has not
  // grown since (shedding each tick would lose every profile and only cost CPU).
  if (shed_memory_ > 0 && heap < heap_after_shed_ + (limit >> 5) && now < last_shed_ns_ + 15'000'000'000ull) return;
  agg_->take_profiles(Aggregator::Take::Dropped);
  malloc_trim(0);
  heap_after_trim_ = heap_after_shed_ = self_memory().anonymous;
  last_trim_ns_ = last_shed_ns_ = now;
  ++shed_memory_;
  if (shed_memory_ == 1 || g_verbose)
    log_warn("memory (anonymous, resident) near the {} MiB limit: dropped this window's profiles (counted in "
             "gpuscope_agent_shed_total{{what=\"memory_limit\"}})",
             cfg_.memory_limit_mb);
}

// The settings a reload cannot change (they shape what was loaded and attached at start), as
// one tuple of references: compared, and copied back, together.
auto restart_only(AgentConfig& c) {
  return std::tie(c.listen, c.cpu_profile_hz, c.stacks, c.python_stacks, c.ringbuf_mb, c.gpu_sample_hz, c.host_root,
                  c.max_kernel_names, c.stack_map_entries, c.gpu_process_sample_s, c.stack_walk, c.unwind_table_mb,
                  c.unwind_cache, c.stack_every);
}

void Agent::apply_live(AgentConfig c) {
  if (restart_only(c) != restart_only(cfg_))
    log_warn("reload: listen, cpu_profile_hz, stacks, python_stacks, ringbuf_mb, gpu_sample_hz, host_root, "
             "max_kernel_names, stack_map_entries, gpu_process_sample_interval, stack_walk, unwind_table_mb, "
             "unwind_cache and stack_every take effect at restart; the rest now");
  const std::string token = read_token(c.bearer_token_file);
  std::lock_guard lock(mu_);
  token_ = token;
  restart_only(c) = restart_only(cfg_);  // they keep their running values
  cfg_ = c;
  budget_->set_budget(c.budget);
}

int Agent::run() {
  attach::check_can_trace("gpuscope agent");
  attach::raise_open_file_limit();
  // Few malloc arenas: each thread's own arena would keep its freed memory apart.
  mallopt(M_ARENA_MAX, 2);
  // And no handing back a second's buffers to be faulted in again the next: the live analysis
  // copies and frees a few MiB each second, and with glibc's defaults a third of its time went
  // to page faults (bench/live_diagnosis_cost: 2.1 ms a tick, 1.4 ms with these). At most 8 MiB
  // free kept at the top of each arena; enforce_memory_limit trims all the same.
  mallopt(M_MMAP_THRESHOLD, 4 << 20);
  mallopt(M_TRIM_THRESHOLD, 8 << 20);
  cfg_ = read_config();
  token_ = read_token(cfg_.bearer_token_file);
  say_what_is_exposed();
  utsname u{};
  uname(&u);
  hostname_ = u.nodename;

  sigset_t sigs;
  sigemptyset(&sigs);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&sigs, s);
  sigaddset(&sigs, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  const int sfd = signalfd(-1, &sigs, SFD_CLOEXEC | SFD_NONBLOCK);

  AggregatorLimits limits;
  limits.max_kernel_names = cfg_.max_kernel_names;
  agg_ = std::make_unique<Aggregator>(limits, cfg_.cpu_profile_hz, cfg_.host_root);
  if (cfg_.diagnose) {
    live_ = std::make_unique<LiveDiagnosis>(LiveDiagnosis::Limits{});
    agg_->set_live_diagnosis(live_.get());
  }

  record::TracerOptions topts;
  topts.all = true;
  topts.only_cuda_processes = true;
  topts.high_rate_per_process = true;
  topts.stacks = cfg_.stacks;
  topts.python_stacks = cfg_.python_stacks;
  topts.launch_probes = record::LaunchProbes::Both;  // processes are joined late
  // The probe programs' own run time is part of what a hit costs the process (BPF_ENABLE_STATS:
  // two clock reads per program run).
  topts.bpf_stats = true;
  topts.bpf_stats_optional = true;  // BPF_ENABLE_STATS needs CAP_SYS_ADMIN, which deploy/ does not give
  topts.cpu_profile_hz = cfg_.stacks ? cfg_.cpu_profile_hz : 0;
  topts.dwarf_unwind_samples = false;  // frame pointers: no 16 KiB copy per sample in a daemon
  topts.table_unwind_calls = topts.table_unwind_samples = cfg_.stack_walk == "eh-frame";
  topts.stack_every = cfg_.stack_every;
  topts.unwind_table_mb = cfg_.unwind_table_mb;
  topts.unwind_cache_dir = cfg_.unwind_cache;
  topts.ringbuf_mb = cfg_.ringbuf_mb;
  topts.gpu_sample_hz = cfg_.gpu_sample_hz;
  topts.gpu_slow_sample_hz = 1 / cfg_.gpu_process_sample_s;
  topts.quiet = true;
  topts.pipeline.max_queued_bytes = 16u << 20;
  topts.pipeline.max_batch_bytes = 2u << 20;
  topts.pipeline.note_every_exec = false;
  // A daemon that mostly waits: records may come 100 ms late, the lost counters are read each
  // second (the health gauges read them anyway).
  topts.poll_ms = 100;
  topts.pipeline.commit_interval_ns = 1'000'000'000;
  topts.pipeline.lazy_registration_names = true;
  // A new stack is also lost when its bucket in the map holds another one, with a chance equal
  // to the map's occupancy: recycled at 1/32 full, the maps lose 1.5% of new stacks on average.
  // A recycle costs two system calls per entry emptied, and the stacks still in use are read
  // again.
  topts.stack_map_entries = cfg_.stack_map_entries;
  topts.host_telemetry = cfg_.diagnose;
  topts.pipeline.recycle_stacks_at = 1.0 / 32;
  tracer_ = std::make_unique<record::Tracer>(topts, *agg_);

  trap_cost_ = tracer_->bpf().measure_hit_cost(&gpuscope_calibration_target, 20000);
  if (!run_.quiet)
    log_info("a probe's trap costs {:.2f} µs here (entry), {:.2f} µs (entry and return); its program's run time {}; "
             "budget {:.2g}% of each process's CPU time",
             trap_cost_.entry_ns / 1e3, trap_cost_.return_ns / 1e3,
             tracer_->bpf().program_stats_enabled()
                 ? std::string("is measured (BPF statistics)")
                 : fmt::format("is taken as {:.1f} µs per entry hit, {:.1f} µs per call with a return (BPF "
                               "statistics need CAP_SYS_ADMIN or kernel.bpf_stats_enabled=1)",
                               bpf_entry_ns_ / 1e3, bpf_pair_ns_ / 1e3),
             cfg_.budget * 100);
  update_hit_cost();
  BudgetConfig bcfg;
  bcfg.budget = cfg_.budget;
  bcfg.entry_hit_ns = hit_cost_.entry_ns;
  bcfg.return_hit_ns = hit_cost_.return_ns;
  budget_ = std::make_unique<BudgetController>(bcfg, *agg_, [this](pid_t pid, bool on, bool all_functions) {
    try {
      const auto seen = on && !all_functions ? agg_->high_rate_functions(uint32_t(pid)) : std::set<uint16_t>{};
      tracer_->bpf().set_high_rate_probes(pid, on, on && !all_functions ? &seen : nullptr);
      return on;
    } catch (const std::exception& e) {
      // Said once per process; its launches and copies go unobserved (observed_ratio shows it).
      if (probe_errors_said_.insert(pid).second)
        log_warn("PID {}: cannot switch its launch and copy probes {}: {}", pid, on ? "on" : "off", e.what());
      return false;
    }
  });
  // Exits from exit records (in tick) and from the sweep below; the tracer lets go of the
  // process's probes itself.
  tracer_->lifetime().on_exit([this](uint32_t pid, uint64_t) {
    if (!budget_->processes().contains(pid_t(pid))) return;
    budget_->remove_process(pid_t(pid), monotonic_ns());
    probe_errors_said_.erase(pid_t(pid));
    log_debug("PID {} exited", pid);
  });
  tracer_->on_cuda_process = [this](pid_t pid, bool at_load) {
    budget_->add_process(pid, monotonic_ns(), at_load);
    log_debug("tracing PID {} ({})", pid, discover::read_comm(pid));
  };
  tracer_->start();
  // The processes already running are attached to once the stack walker is in (a fraction of a
  // second): their first stacks are walked, not sent as copies.
  tracer_->wait_for_stack_walker();
  for (pid_t p : discover::list_pids())
    if (p != getpid()) tracer_->attach_mapped_libraries(p);
  tracer_->start_gpu_metrics();
  // PSI and the CUDA processes' cgroups' throttling, for the live diagnosis's evidence.
  if (live_) tracer_->start_pressure(2);
  update_health();
  start_server();
  exporter_ = std::thread([this] {
    name_this_thread("gs-export");
    exporter_loop();
  });

  const uint64_t deadline = deadline_after_ns(monotonic_ns(), run_.duration_s);
  uint64_t next_health = 0;
  int exit_code = 0;
  bool running = true;
  while (running) {
    pollfd fds[2] = {{sfd, POLLIN, 0}, {tracer_->control_fd(), POLLIN, 0}};
    int timeout_ms = tracer_->control_poll_ms();
    if (const uint64_t next = budget_->next_switch_ns(), t = monotonic_ns(); next != UINT64_MAX)
      timeout_ms = next <= t ? 0 : int(std::min<uint64_t>(uint64_t(timeout_ms), (next - t + 999'999) / 1'000'000));
    ::poll(fds, 2, timeout_ms);
    tracer_->tick(fds[1].revents & POLLIN);
    signalfd_siginfo si{};
    while (read(sfd, &si, sizeof(si)) == sizeof(si)) {
      if (si.ssi_signo == SIGHUP) {
        try {
          apply_live(read_config());
          if (!run_.quiet) log_info("configuration reloaded from {}", run_.config_path.empty() ? "flags" : run_.config_path);
        } catch (const std::exception& e) {
          log_error("reload failed, keeping the running configuration: {}", e.what());
        }
      } else if (si.ssi_signo != SIGPIPE) {
        running = false;
      }
    }
    const uint64_t now = monotonic_ns();
    // Once a second, a sweep of /proc for processes whose exit record was lost.
    if (now >= next_health) {
      std::vector<pid_t> gone;
      for (const auto& [pid, st] : budget_->processes())
        if (!discover::process_exists(pid)) gone.push_back(pid);
      for (pid_t pid : gone) tracer_->process_gone(pid);
      if (live_) live_->tick(now);
    }
    budget_->tick(now);
    if (now >= next_health) {
      // The agent's own CPU over the last seconds steers how much of every process it observes:
      // the part of it that observing less saves (observing_share). This thread's is not in it:
      // it attaches, switches probes and looks at every new program, whatever the duties.
      const double cpu = self_cpu_s(), main_cpu = double(clock_ns(CLOCK_THREAD_CPUTIME_ID)) / 1e9;
      const uint64_t records = tracer_->stats().records, high_rate = agg_->high_rate_calls_seen();
      if (last_cpu_ns_) {
        const double observing =
            observing_share(std::max(0.0, (cpu - last_cpu_s_) - (main_cpu - last_main_cpu_s_)),
                            double(now - last_cpu_ns_) / 1e9, records - last_records_, high_rate - last_high_rate_);
        double agent_budget;
        {
          std::lock_guard lock(mu_);
          agent_budget = cfg_.agent_cpu_budget;
        }
        budget_->note_agent_cpu(observing, agent_budget);
      }
      last_cpu_s_ = cpu;
      last_main_cpu_s_ = main_cpu;
      last_cpu_ns_ = now;
      last_records_ = records;
      last_high_rate_ = high_rate;
      update_hit_cost();
      update_health();
      enforce_memory_limit();
      next_health = now + 1'000'000'000;
    } else if (budget_->changes() != health_changes_) {
      // A process found or gone, or a duty changed: its overhead series goes out with its
      // observed share, not up to a second later.
      update_health();
    }
    if (deadline && now >= deadline) running = false;
  }

  {
    std::lock_guard lock(exporter_mu_);
    exporter_stop_ = true;
  }
  exporter_cv_.notify_all();
  exporter_.join();
  stop_server();
  tracer_->stop();
  close(sfd);
  if (!run_.quiet) {
    const auto st = tracer_->stats();
    log_info("agent stopped: {} records read, {} CUDA calls, {} lost", st.records, st.calls,
             agg_->lost_total() + st.queue_dropped_records);
  }
  return exit_code;
}

}  // namespace

int run_agent(const AgentRun& run) {
  Agent a(run);
  return a.run();
}

}  // namespace gpuscope::agent
