// gpuscope's command line: parses arguments and hands over to a stage. Errors end here, as
// one line and a non-zero exit.
#include <CLI/CLI.hpp>
#include <signal.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <fstream>
#include <map>

#include "agent/agent.h"
#include "common/error.h"
#include "common/log.h"
#include "discover/proc.h"
#include "record/recorder.h"
#include "advise/advise.h"
#include "pin/launch.h"
#include "diagnose/output.h"
#include "report/call_sites.h"
#include "report/flamegraph.h"
#include "report/report.h"
#include "report/timeline.h"
#include "store/record_reader.h"
#include "symbolize/symbolizer.h"

using namespace gpuscope;

namespace {

// --duration: seconds, 0 for no limit; NaN and negative values are refused (a value past what the
// clock reaches, inf included, is no limit either: common/clock.h).
void check_duration(double seconds) {
  if (std::isnan(seconds) || seconds < 0)
    throw Error("--duration must be a number of seconds, 0 or more (0: no limit), e.g. 30 or 2.5");
}

int run_report(const std::string& path, bool json, size_t top) {
  store::RecordReader reader(path);
  symbolize::Symbolizer symbolizer;
  report::Options opt;
  opt.top = top;
  auto doc = report::build_report(reader, symbolizer, opt);
  if (json)
    std::cout << doc.dump(2) << "\n";
  else
    std::cout << report::render_text(doc);
  return 0;
}

int run_diagnose(const std::string& path, bool json, double from_s, double to_s, bool as_agent, double duty) {
  store::RecordReader reader(path);
  symbolize::Symbolizer symbolizer;
  report::CallSites sites(reader.db(), symbolizer);
  diagnose::DiagnoseOptions opts;
  opts.from_ns = uint64_t(std::max(0.0, from_s) * 1e9);
  opts.to_ns = to_s > 0 ? uint64_t(to_s * 1e9) : 0;
  if (as_agent) {
    // The agent's view at --to: the last 3 s (LiveDiagnosis::Limits), slow steps ranked among themselves.
    if (to_s <= 0) throw Error("--as-agent needs --to: the instant the agent would analyse");
    opts.from_ns = opts.to_ns > 3'000'000'000 ? opts.to_ns - 3'000'000'000 : 0;
    opts.slow_ranking = diagnose::SlowSteps::RankedAmongThemselves;
    opts.duty = std::clamp(duty, 0.01, 1.0);
  }
  if (opts.to_ns && opts.to_ns <= opts.from_ns) throw Error("--to must come after --from");
  const auto doc = diagnose::to_json(diagnose::diagnose(reader, &sites, opts));
  if (json)
    std::cout << doc.dump(2) << "\n";
  else
    std::cout << diagnose::render_text(doc);
  return 0;
}

int run_advise(const std::string& path, bool json, const std::string& table, size_t top) {
  const auto model = table.empty() ? advise::builtin_copy_model() : advise::load_copy_model(table);
  store::RecordReader reader(path);
  symbolize::Symbolizer symbolizer;
  report::CallSites sites(reader.db(), symbolizer);
  const auto doc = advise::advise(reader, sites, model, {.top = top});
  if (json)
    std::cout << doc.dump(2) << "\n";
  else
    std::cout << advise::render_text(doc);
  return 0;
}

int run_flamegraph(const std::string& path, const std::string& metric, const std::string& output, int64_t pid,
                   bool peak, const std::string& native) {
  report::FlameOptions opt;
  opt.metric = report::parse_metric(metric);
  opt.pid = pid;
  opt.inuse_at_peak = peak;
  opt.native = report::parse_native_view(native);
  const auto format = report::format_for_path(output);
  store::RecordReader reader(path);
  symbolize::Symbolizer symbolizer;
  const auto data = report::build_flame(reader, symbolizer, opt);
  std::string bytes;
  switch (format) {
    case report::FlameFormat::Folded: bytes = report::to_folded(data); break;
    case report::FlameFormat::Pprof: bytes = report::to_pprof(data); break;
    case report::FlameFormat::Html:
      bytes = report::to_html(data, fmt::format("{}{}: {}", metric, peak ? " (at peak)" : "", reader.meta("command")));
      break;
  }
  if (output == "-") {
    std::cout << bytes;
    return 0;
  }
  std::ofstream out(output, std::ios::binary | std::ios::trunc);
  if (!out || !out.write(bytes.data(), static_cast<std::streamsize>(bytes.size())) || !out.flush())
    throw Error("cannot write {}: {}", output, strerror(errno));
  log_info("{} stacks, {} {} in all, written to {}", data.stacks.size(), data.total(), data.unit, output);
  return 0;
}

int run_timeline(const std::string& path, const std::string& output, const report::TimelineOptions& opt) {
  store::RecordReader reader(path);
  symbolize::Symbolizer symbolizer;
  if (output == "-") {
    report::write_timeline(reader, symbolizer, opt, std::cout);
    return 0;
  }
  std::ofstream out(output, std::ios::binary | std::ios::trunc);
  if (!out) throw Error("cannot write {}: {}", output, strerror(errno));
  const auto st = report::write_timeline(reader, symbolizer, opt, out);
  if (!out.flush()) throw Error("cannot write {}: {}", output, strerror(errno));
  log_info("{} events, {:.1f} MB, written to {} (open it in https://ui.perfetto.dev or chrome://tracing)", st.events,
           st.bytes / 1e6, output);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gpuscope: where the GPU time, memory and bandwidth of a CUDA program go"};
  app.require_subcommand(1);
  app.set_version_flag("--version", GPUSCOPE_VERSION);

  record::RecordOptions ropts;
  std::vector<std::string> pid_args;
  bool no_stacks = false;
  auto* rec = app.add_subcommand("record", "Record the CUDA activity of a command, of running processes, or of every process");
  rec->add_option("-o,--output", ropts.output, "Record file to write")->capture_default_str();
  rec->add_option("-p,--pid", pid_args, "Attach to running process(es) and their children (comma-separated)")
      ->delimiter(',');
  rec->add_flag("-a,--all", ropts.tracer.all, "Record every process on the host, including those that start later");
  rec->add_option("-d,--duration", ropts.duration_s, "Stop after this many seconds");
  rec->add_flag("--no-stacks", no_stacks, "Do not capture user stacks");
  std::map<std::string, record::LaunchProbes> launch_modes{
      {"auto", record::LaunchProbes::Auto},
      {"probes", record::LaunchProbes::Probes},
      {"driver", record::LaunchProbes::Driver},
      {"both", record::LaunchProbes::Both},
      {"in-process", record::LaunchProbes::InProcess}};
  rec->add_option("--launch-probes", ropts.tracer.launch_probes,
                  "How launches are recorded: in-process (no trap; libgpuscope_launches.so, preloaded into "
                  "a command gpuscope starts, or into a process by its owner for --pid, hands the launches "
                  "over through shared memory, and one in N to a probe for its stack, N from the stack budget), "
                  "probes (a trap per launch: the driver's once it is probed, when recording a command; runtime "
                  "and driver with --pid/--all), driver (the driver's probes only), both (runtime and driver: "
                  "two traps), auto (in-process for a command and for --pid processes started with the library "
                  "preloaded, probes otherwise). "
                  "Except with both, a runtime copy, memset or sync function is left to the "
                  "driver's probes once its calls were all seen to make one")
      ->transform(CLI::CheckedTransformer(launch_modes, CLI::ignore_case))
      ->capture_default_str();
  rec->add_option("--cpu-profile", ropts.tracer.cpu_profile_hz,
                  "Sample the targets' on-CPU stacks (user and kernel) this many times per second, e.g. 99");
  std::string sample_unwind = "dwarf";
  rec->add_option("--sample-unwind", sample_unwind,
                  "How CPU samples' user stacks are walked: dwarf (a copy of the stack, unwound from .eh_frame: "
                  "works without frame pointers, cut at 16 KiB), eh-frame (walked in the kernel from tables "
                  "compiled from .eh_frame: whole stacks, no copy) or fp (frame pointers, in the kernel)")
      ->check(CLI::IsMember({"dwarf", "eh-frame", "fp"}))
      ->capture_default_str();
  std::string call_unwind = "eh-frame";
  rec->add_option("--call-stacks", call_unwind,
                  "How CUDA calls' user stacks are walked: eh-frame (in the kernel, from tables compiled from "
                  "the libraries' .eh_frame when a walk first needs them: whole stacks through code without frame "
                  "pointers; until a table is made, a copy of the stack is unwound in user space), fp (frame "
                  "pointers, in the kernel: cheaper, stops at code without them) or dwarf (a 16 KiB stack copy "
                  "per call, unwound from .eh_frame)")
      ->check(CLI::IsMember({"dwarf", "eh-frame", "fp"}))
      ->capture_default_str();
  rec->add_option("--unwind-table-mb", ropts.tracer.unwind_table_mb,
                  "Memory for the eh-frame tables of the files walks go through (8 bytes a row plus its page "
                  "index; libcublasLt needs 6 MiB), allocated whole at start, only in the eh-frame modes; tables "
                  "no process uses are evicted first, files that still do not fit are walked with frame pointers")
      ->capture_default_str();
  rec->add_option("--unwind-cache", ropts.tracer.unwind_cache_dir,
                  "Where the eh-frame modes keep compiled tables between runs, by build id (1 GiB at most; "
                  "\"\" to compile every time): read back, libcufft's took 0.3 ms instead of 1.7 s on the H100")
      ->capture_default_str();
  rec->add_option("--gpu-sample-hz", ropts.tracer.gpu_sample_hz,
                  "Read the GPUs' NVML metrics (utilisation, memory, power, clocks, throttling, PCIe, per-process "
                  "use) this many times per second; 0: off (default: " +
                      fmt::format("{}", record::kDefaultGpuSampleHz) + ")");
  rec->add_flag("--gpu-times", ropts.gpu_times,
                 "Record each kernel's, copy's and memset's start and end on the GPU (CUPTI, through a library "
                 "the CUDA driver loads into the command), tied to the call and stack that made it");
  rec->add_option("--gpu-trace-dir", ropts.gpu_trace_dir,
                  "With --pid/--all: the directory services started with gpuscope's injection library write GPU "
                  "times to (their GPUSCOPE_GPU_TRACE, docs/gpu-times.md); the recording's window of them is stored");
  bool no_python = false;
  rec->add_flag("--no-python", no_python,
                "Do not walk Python frames (by default stacks of CPython 3.10 to 3.13 processes show the Python "
                "functions and lines that made each call)");
  auto* every_opt = rec->add_option(
      "--stack-every", ropts.tracer.stack_every,
      "Take the stacks of one in N kernel launches, copies and memsets (the calls that come by the thousand a "
      "second), chosen at random; flame graphs and the report count each taken one N times. 1: every call's "
      "stack. Every call is still recorded, and allocations', frees' and synchronisations' stacks are always "
      "taken. On a launch-bound PyTorch training step on the H100 the stacks cost 4-5% of the step at 1, 0.7% "
      "at 16 (docs/performance.md). Default: N chosen by --stack-budget");
  rec->add_option("--stack-budget", ropts.tracer.stack_budget,
                  "Without --stack-every: the share of each process's elapsed time its launches', copies' and "
                  "memsets' stack walks may take; every call's stack is taken while they stay within it, one "
                  "in N (N per process, adjusted up to 10 times a second) once they would not. Deciding which "
                  "to walk costs a little more: at 0.005 the stacks' BPF time was 0.67% of a launch-bound "
                  "training step on the H100 and 0.96% of an eager loop of tiny ops (docs/performance.md)")
      ->capture_default_str()
      ->excludes(every_opt);
  rec->add_flag("!--no-host-telemetry", ropts.tracer.host_telemetry,
                "Do not record where the targets' threads spend their time (on a CPU, waiting for one, blocked "
                "on I/O, locks, pipes or sockets): the evidence `diagnose` works from; costs every context switch "
                "on the host a lookup");
  rec->add_option_function<uint64_t>(
         "--host-allocs",
         [&](uint64_t kib) { ropts.tracer.host_alloc_min_bytes = kib << 10; },
         "Record the targets' anonymous host mappings of at least this many KiB with the stack that made each "
         "(`advise` names where a pageable buffer was allocated; the C library maps allocations of 128 KiB and "
         "more until it raises its threshold); 0: off")
      ->default_str("256");
  rec->add_flag("--bpf-stats", ropts.tracer.bpf_stats,
                 "Record each BPF program's run count and run time (costs two clock reads per probe hit)");
  rec->add_option("--ringbuf-mb", ropts.tracer.ringbuf_mb, "Kernel ring buffer size in MiB")->capture_default_str();
  rec->add_option("--stack-map-entries", ropts.tracer.stack_map_entries,
                  "Distinct kernel stacks of CPU samples the BPF stack map holds (they are recycled when it "
                  "fills)")
      ->capture_default_str();
  rec->add_flag("--floor-probes", ropts.tracer.floor_probes,
                "Benchmarks only: the same probes, running a BPF program that does nothing (records no calls): "
                "what the traps alone cost the targets")
      ->group("");  // not in --help: it records nothing a user wants
  rec->add_option("--capture-records", ropts.tracer.pipeline.capture_path,
                  "Developers only: also write every ring-buffer record, as the pipeline receives it, to this file "
                  "(the pipeline's tests replay such captures)")
      ->group("");
  rec->add_flag("-q,--quiet", ropts.tracer.quiet, "Print only errors");
  rec->add_flag("-v,--verbose", g_verbose, "Print debugging detail");
  rec->add_option("command", ropts.command, "Command to run under observation (after --)");
  rec->positionals_at_end();

  std::string report_path;
  bool json = false;
  size_t top = 10;
  auto* rep = app.add_subcommand("report", "Summarise a record file");
  rep->add_option("file", report_path, "Record file")->required();
  rep->add_flag("--json", json, "Print JSON instead of text");
  rep->add_option("--top", top, "Rows per table")->capture_default_str();

  std::string diag_path;
  bool diag_json = false;
  auto* diag = app.add_subcommand("diagnose", "Say why the GPU waited: the causes of slow steps, ranked, with evidence and fixes");
  diag->add_option("file", diag_path, "Record file")->required();
  diag->add_flag("--json", diag_json, "Print JSON instead of text");
  double diag_from = 0, diag_to = 0, diag_duty = 1;
  bool diag_as_agent = false;
  diag->add_option("--from", diag_from, "Only the steps from this many seconds into the recording");
  diag->add_option("--to", diag_to, "Only the steps until this many seconds into the recording");
  diag->add_flag("--as-agent", diag_as_agent,
                 "What the agent's live diagnosis would have said at --to: the 3 s before it, its slow steps' causes "
                 "ranked among themselves");
  diag->add_option("--agent-duty", diag_duty,
                   "With --as-agent: the share of each 2 s its overhead budget observed launches and copies (the "
                   "process's gpuscope_observed_ratio)")
      ->capture_default_str();

  std::string advise_path, advise_table;
  bool advise_json = false;
  size_t advise_top = 20;
  pin::PinOptions pin_opts;
  auto* pin_cmd = app.add_subcommand(
      "pin", "Run a command with its large host buffers pinned when their copies to and from the GPU pay for it "
             "(libgpuscope_pin.so preloaded; docs/pin.md)");
  pin_cmd->add_option("--mode", pin_opts.mode,
                      "online: pin the buffers whose copies pay for it; all: pin every large buffer (what "
                      "cudaMallocHost for everything would do); off: serve them, pin nothing")
      ->capture_default_str();
  pin_cmd->add_option("--cap", pin_opts.cap, "Pinned bytes at most, e.g. 8G (default: a quarter of the host's memory)");
  pin_cmd->add_option("--min", pin_opts.min, "Smaller buffers are left to the C library (default 256K)");
  pin_cmd->add_flag("--relaxed", pin_opts.relaxed,
                    "Let asynchronous copies of buffers pinned here run asynchronously: faster, but a program that "
                    "writes a buffer right after cudaMemcpyAsync from it (legal for pageable memory) sends the new bytes");
  pin_cmd->add_option("--copy-table", pin_opts.copy_table,
                      "This machine's copy times (build/bench/copy_table > FILE); default: measured on an H200");
  pin_cmd->add_option("--report", pin_opts.report, "Write the processes' figures here as JSON");
  pin_cmd->add_option("--profile", pin_opts.profile,
                      "Write what the run learned of its allocation sites (which lines' buffers are copied, and "
                      "what pinning them saves) to this file");
  pin_cmd->add_option("--use", pin_opts.use,
                      "Start from a profile an earlier run wrote: its copying lines get pinned buffers from their "
                      "first allocation");
  pin_cmd->add_option("command", pin_opts.command, "The command to run (after --)")->required();
  auto* adv = app.add_subcommand("advise", "Say which copies pageable memory slows, what pinning would save, and where to pin");
  adv->add_option("file", advise_path, "Record file")->required();
  adv->add_flag("--json", advise_json, "Print JSON instead of text");
  adv->add_option("--copy-table", advise_table,
                  "Copy times measured on the machine the job runs on (build/bench/copy_table's output; default: an "
                  "H200's, built in)");
  adv->add_option("--top", advise_top, "Call sites to list")->capture_default_str();

  std::string flame_path, metric = "cpu", flame_out, native = "auto";
  int64_t flame_pid = 0;
  bool peak = false;
  auto* flame = app.add_subcommand("flamegraph", "Draw the stacks of a record weighted by a metric");
  flame->add_option("file", flame_path, "Record file")->required();
  flame->add_option("-m,--metric", metric, "cpu, launches, memcpy-bytes, alloc-bytes, inuse-bytes, gpu-time or nccl-bytes")
      ->capture_default_str();
  flame->add_option("-o,--output", flame_out,
                    "Output file; its name picks the format: .html (interactive), .folded (Brendan Gregg's "
                    "folded stacks), .pb.gz (pprof); - prints folded stacks")
      ->required();
  flame->add_option("--pid", flame_pid, "Only this process");
  flame->add_flag("--peak", peak, "inuse-bytes: the allocations live when the total in use peaked, not at the end");
  flame->add_option("--native", native,
                    "Native frames of stacks with Python frames: auto (the extension and CUDA code below the "
                    "innermost Python frame, not the interpreter's), none (Python frames and the innermost "
                    "frame) or all")
      ->capture_default_str();

  std::string tl_path, tl_out;
  report::TimelineOptions tl_opt;
  auto* tl = app.add_subcommand("timeline", "Write a record as a trace for Perfetto's UI or chrome://tracing");
  tl->add_option("file", tl_path, "Record file")->required();
  tl->add_option("-o,--output", tl_out, "Trace file (Chrome trace-event JSON); - prints it")->required();
  tl->add_option("--from", tl_opt.from_s, "Start of the window, in seconds from the recording's start");
  tl->add_option("--to", tl_opt.to_s, "End of the window, in seconds from the recording's start");
  tl->add_option("--pid", tl_opt.pid, "Only this process");

  agent::AgentRun arun;
  std::string a_listen, a_otlp, a_pyroscope, a_token, a_interval;
  double a_budget = 0;
  int a_cpu_hz = -1;
  auto* ag = app.add_subcommand(
      "agent", "Run as a node's always-on agent: trace every CUDA process within an overhead budget, serve "
               "Prometheus /metrics and pprof profiles, push OTLP metrics and Pyroscope profiles");
  ag->add_option("-c,--config", arun.config_path, "YAML config file (deploy/agent.yaml documents every key); SIGHUP re-reads it");
  ag->add_option("--listen", a_listen, "HOST:PORT for /metrics and /debug/pprof/ (default 127.0.0.1:9464)");
  ag->add_option("--budget", a_budget, "Share of each process's CPU time its probes may add (default 0.01)");
  ag->add_option("--interval", a_interval, "Profile window, e.g. 15s");
  ag->add_option("--otlp-endpoint", a_otlp, "Push OTLP/HTTP metrics here, e.g. http://collector:4318/v1/metrics");
  ag->add_option("--pyroscope-url", a_pyroscope, "Push profiles to this Pyroscope, e.g. http://pyroscope:4040");
  ag->add_option("--bearer-token-file", a_token, "Require this token (Authorization: Bearer) for profiles");
  ag->add_option("--cpu-profile-hz", a_cpu_hz, "CPU samples per second per CPU (default 19; 0: off)");
  ag->add_option("-d,--duration", arun.duration_s, "Stop after this many seconds (default: run until SIGTERM)");
  ag->add_flag("-q,--quiet", arun.quiet, "Print only errors");
  ag->add_flag("-v,--verbose", g_verbose, "Print debugging detail");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    if (*rec) {
      for (const auto& p : pid_args) {
        pid_t pid = 0;
        auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), pid);
        if (ec != std::errc() || end != p.data() + p.size() || pid <= 0)
          throw Error("--pid '{}' is not a process id", p);
        ropts.pids.push_back(pid);
      }
      const int modes = !ropts.command.empty() + !ropts.pids.empty() + ropts.tracer.all;
      if (modes != 1) throw Error("give exactly one of: a command after --, --pid PID, or --all");
      for (pid_t p : ropts.pids)
        if (!discover::process_exists(p)) {
          if (kill(p, 0) == 0 || errno == EPERM)
            throw Error("PID {} has exited (a zombie its parent has not waited for yet): nothing to record", p);
          throw Error("no process with PID {} (check it with ps)", p);
        }
      check_duration(ropts.duration_s);
      if (ropts.tracer.cpu_profile_hz < 0 || ropts.tracer.cpu_profile_hz > 10000)
        throw Error("--cpu-profile must be between 1 and 10000 samples per second");
      if (ropts.tracer.ringbuf_mb < 1 || ropts.tracer.ringbuf_mb > 2048) throw Error("--ringbuf-mb must be between 1 and 2048");
      if (ropts.tracer.stack_map_entries < 1 || ropts.tracer.stack_map_entries > (1u << 22))
        throw Error("--stack-map-entries must be between 1 and 4194304");
      ropts.tracer.stacks = !no_stacks;
      ropts.tracer.dwarf_unwind_samples = sample_unwind == "dwarf";
      ropts.tracer.dwarf_unwind_calls = call_unwind == "dwarf";
      ropts.tracer.table_unwind_calls = call_unwind == "eh-frame";
      ropts.tracer.table_unwind_samples = sample_unwind == "eh-frame";
      if (ropts.tracer.unwind_table_mb < 1 || ropts.tracer.unwind_table_mb > 4096)
        throw Error("--unwind-table-mb must be between 1 and 4096");
      ropts.tracer.python_stacks = !no_python;
      if (every_opt->count() && (ropts.tracer.stack_every < 1 || ropts.tracer.stack_every > 1'000'000))
        throw Error("--stack-every must be between 1 (every call) and 1000000");
      if (!(ropts.tracer.stack_budget > 0 && ropts.tracer.stack_budget <= 1))
        throw Error("--stack-budget must be in (0, 1], e.g. 0.005 for 0.5% (--stack-every 1 takes every stack)");
      if (every_opt->count()) ropts.tracer.stack_budget = 0;  // N given: no budget
      if (!(ropts.tracer.gpu_sample_hz >= 0 && ropts.tracer.gpu_sample_hz <= 1000))
        throw Error("--gpu-sample-hz must be between 0 (off) and 1000");
      return record::run_record(ropts);
    }
    if (*ag) {
      check_duration(arun.duration_s);
      if (a_budget < 0 || a_budget > 1) throw Error("--budget must be in (0, 1], e.g. 0.01 for 1%");
      arun.overrides = [&](agent::AgentConfig& c) {
        if (!a_listen.empty()) c.listen = a_listen;
        if (a_budget > 0) c.budget = a_budget;
        if (!a_interval.empty()) c.profile_interval_s = agent::parse_duration_s(a_interval);
        if (!a_otlp.empty()) c.otlp.url = a_otlp;
        if (!a_pyroscope.empty()) c.pyroscope.url = a_pyroscope;
        if (!a_token.empty()) c.bearer_token_file = a_token;
        if (a_cpu_hz >= 0) c.cpu_profile_hz = a_cpu_hz;
      };
      return agent::run_agent(arun);
    }
    if (*tl) {
      if (tl_opt.from_s < 0 || (tl_opt.to_s > 0 && tl_opt.to_s <= tl_opt.from_s))
        throw Error("--from must be >= 0 and --to after it");
      return run_timeline(tl_path, tl_out, tl_opt);
    }
    if (*diag) return run_diagnose(diag_path, diag_json, diag_from, diag_to, diag_as_agent, diag_duty);
    if (*adv) return run_advise(advise_path, advise_json, advise_table, advise_top);
    if (*pin_cmd) return pin::run_pinned(pin_opts);
    if (*flame) return run_flamegraph(flame_path, metric, flame_out, flame_pid, peak, native);
    return run_report(report_path, json, top);
  } catch (const std::exception& e) {
    log_error("{}", e.what());
    return 1;
  }
}
