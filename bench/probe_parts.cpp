// What each part of gpuscope's launch probe costs, inside a running workload: the stages of
// probe_parts.bpf.c attached one at a time to FILE's SYMBOLs in process PID, round after round,
// their run time per run read from bpf_prog_info (kernel BPF statistics on while this runs).
// A thread drains the ring buffer every 20 ms and reads every record whole, as gpuscope's does.
//   probe_parts --pid PID [--rounds 3] [--window 3] [--settle 1] [--ring-mb 64] [--consumer-ns 0] [--multi]
//               [--programs p0_empty,p3_fill,...] FILE SYMBOL...
// A program named twice runs twice a round: the ring buffer's memory is fresh (never written
// since it was allocated) for the first programs that write to it, and not for later ones.
// Prints a line per window and then, per program, the median ns a run over the rounds (min..max)
// and its runs per second.
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "attach/bpf_session.h"
#include "probe_parts.skel.h"
#include "elf/elf_file.h"

namespace {

struct Stats {
  uint64_t runs = 0, ns = 0;
};

Stats stats(bpf_program* p) {
  bpf_prog_info info{};
  uint32_t len = sizeof(info);
  if (bpf_obj_get_info_by_fd(bpf_program__fd(p), &info, &len) != 0) return {};
  return {info.run_cnt, info.run_time_ns};
}

std::atomic<uint64_t> words_read{0};
long consumer_ns = 0;  // --consumer-ns: time a record takes the consumer (gpuscope's decodes and stores it)

int read_record(void*, void* data, size_t size) {
  // Every word of the record, as a consumer that decodes it pulls its cache lines over.
  uint64_t sum = 0;
  const auto* w = static_cast<const uint64_t*>(data);
  for (size_t i = 0; i < size / 8; ++i) sum += w[i];
  words_read.fetch_add(sum & 1, std::memory_order_relaxed);
  if (consumer_ns) {
    timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do clock_gettime(CLOCK_MONOTONIC, &t);
    while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < consumer_ns);
  }
  return 0;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= s.size()) {
    size_t comma = s.find(',', at);
    if (comma == std::string::npos) comma = s.size();
    if (comma > at) out.push_back(s.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int pid = 0, rounds = 3;
  double window = 3, settle = 1;
  uint32_t ring_mb = 64;
  bool multi = false;  // --multi: one uprobe-multi link per program, as gpuscope attaches
  std::string programs = "p0_empty,p1a_filter,p1b_clock,p1c_cookie,p1_filter_clock,p2_reserve_submit,p3_fill,"
                         "p4_stack_args,p5_comm,p6_query,p7_marks_sampling,s4_small_stack_args,p2_reserve_submit";
  std::string file;
  std::vector<std::string> symbols;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        fprintf(stderr, "probe_parts: %s needs a value\n", a.c_str());
        exit(2);
      }
      return argv[++i];
    };
    if (a == "--pid") pid = atoi(value().c_str());
    else if (a == "--rounds") rounds = atoi(value().c_str());
    else if (a == "--window") window = atof(value().c_str());
    else if (a == "--settle") settle = atof(value().c_str());
    else if (a == "--programs") programs = value();
    else if (a == "--consumer-ns") consumer_ns = atol(value().c_str());
    else if (a == "--multi") multi = true;
    else if (a == "--ring-mb") ring_mb = static_cast<uint32_t>(atoi(value().c_str()));
    else if (file.empty()) file = a;
    else symbols.push_back(a);
  }
  if (pid <= 0 || file.empty() || symbols.empty()) {
    fprintf(stderr, "usage: probe_parts --pid PID [--rounds R] [--window S] [--programs P,...] FILE SYMBOL...\n");
    return 2;
  }
  if (kill(pid, 0) != 0) {
    fprintf(stderr, "probe_parts: no process %d\n", pid);
    return 1;
  }
  auto* skel = probe_parts_bpf__open();
  if (skel) bpf_map__set_max_entries(skel->maps.events, ring_mb << 20);
  if (skel && multi) {
    bpf_program* p;
    const auto multi_type = static_cast<bpf_attach_type>(gpuscope::attach::kAttachUprobeMulti);
    bpf_object__for_each_program(p, skel->obj) bpf_program__set_expected_attach_type(p, multi_type);
  }
  if (skel && probe_parts_bpf__load(skel) != 0) {
    probe_parts_bpf__destroy(skel);
    skel = nullptr;
  }
  if (!skel) {
    fprintf(stderr, "probe_parts: cannot load the BPF programs (run as root)\n");
    return 1;
  }
  uint32_t key = static_cast<uint32_t>(pid);
  uint8_t one = 1;
  bpf_map__update_elem(skel->maps.targets, &key, sizeof(key), &one, sizeof(one), BPF_ANY);
  int stats_fd = bpf_enable_stats(BPF_STATS_RUN_TIME);
  if (stats_fd < 0) {
    fprintf(stderr, "probe_parts: cannot turn on BPF run-time statistics: %s\n", strerror(errno));
    return 1;
  }
  auto elf = gpuscope::elf::ElfFile::open(file);
  if (!elf) {
    fprintf(stderr, "probe_parts: cannot read %s\n", file.c_str());
    return 1;
  }
  auto offsets = elf->function_offsets(symbols);
  if (offsets.empty()) {
    fprintf(stderr, "probe_parts: none of the symbols is in %s\n", file.c_str());
    return 1;
  }

  ring_buffer* ring = ring_buffer__new(bpf_map__fd(skel->maps.events), read_record, nullptr, nullptr);
  std::atomic<bool> stop{false};
  std::thread consumer([&] {
    while (!stop.load()) ring_buffer__poll(ring, 20);
    ring_buffer__consume(ring);
  });

  std::map<std::string, std::vector<std::pair<double, double>>> results;  // ns a run, runs a second
  const auto names = split(programs);
  std::vector<std::string> labels;  // a program's second run in a round is "NAME#2"
  for (size_t i = 0; i < names.size(); ++i) {
    const auto n = std::count(names.begin(), names.begin() + i, names[i]);
    labels.push_back(n ? names[i] + "#" + std::to_string(n + 1) : names[i]);
  }
  for (int r = 1; r <= rounds; ++r) {
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string& name = names[i];
      bpf_program* prog = bpf_object__find_program_by_name(skel->obj, name.c_str());
      if (!prog) {
        fprintf(stderr, "probe_parts: no program %s\n", name.c_str());
        return 2;
      }
      std::vector<bpf_link*> links;
      std::vector<int> multi_links;
      uint64_t cookie = 1;
      if (multi) {
        std::vector<uint64_t> offs, cookies;
        for (const auto& [sym, off] : offsets) {
          offs.push_back(off);
          cookies.push_back(cookie++);
        }
        int fd = gpuscope::attach::attach_uprobe_multi(bpf_program__fd(prog), file, offs, cookies, false, pid);
        if (fd < 0) {
          fprintf(stderr, "probe_parts: cannot attach %s as uprobe-multi: %s\n", name.c_str(), strerror(errno));
          return 1;
        }
        multi_links.push_back(fd);
      }
      for (const auto& [sym, off] : multi ? decltype(offsets){} : offsets) {
        LIBBPF_OPTS(bpf_uprobe_opts, opts, .bpf_cookie = cookie++);
        bpf_link* l = bpf_program__attach_uprobe_opts(prog, pid, file.c_str(), off, &opts);
        if (!l) {
          fprintf(stderr, "probe_parts: cannot attach %s to %s: %s\n", name.c_str(), sym.c_str(), strerror(errno));
          return 1;
        }
        links.push_back(l);
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(settle));
      Stats a = stats(prog);
      auto t0 = std::chrono::steady_clock::now();
      std::this_thread::sleep_for(std::chrono::duration<double>(window));
      Stats b = stats(prog);
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (auto* l : links) bpf_link__destroy(l);
      for (int fd : multi_links) close(fd);
      const uint64_t runs = b.runs - a.runs;
      const double ns = runs ? double(b.ns - a.ns) / runs : 0;
      results[labels[i]].push_back({ns, runs / secs});
      printf("round %d %-22s %10lu runs %8.0f ns a run\n", r, labels[i].c_str(), (unsigned long)runs, ns);
      fflush(stdout);
    }
  }
  stop = true;
  consumer.join();
  printf("\n%-22s %10s %20s %12s\n", "program", "ns a run", "(min..max)", "runs/s");
  for (const auto& name : labels) {
    auto v = results[name];
    std::vector<double> ns;
    double rate = 0;
    for (auto [n, s] : v) {
      ns.push_back(n);
      rate += s / v.size();
    }
    std::sort(ns.begin(), ns.end());
    const double med = ns.size() % 2 ? ns[ns.size() / 2] : (ns[ns.size() / 2 - 1] + ns[ns.size() / 2]) / 2;
    char spread[64];
    snprintf(spread, sizeof(spread), "(%.0f..%.0f)", ns.front(), ns.back());
    printf("%-22s %10.0f %20s %12.0f\n", name.c_str(), med, spread, rate);
  }
  ring_buffer__free(ring);
  close(stats_fd);
  probe_parts_bpf__destroy(skel);
  return 0;
}
