// The agent's parts that need no kernel: cgroup paths, runtime bundles, the config file, the
// aggregates and the budget's duty cycle.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "agent/aggregator.h"
#include "agent/budget.h"
#include "agent/config.h"
#include "common/error.h"
#include "cuda/functions.h"
#include "discover/container.h"
#include "elf/elf_file.h"
#include "snapshot_value.h"

using namespace gpuscope;
namespace fs = std::filesystem;

namespace {

const std::string kId = "3f1c2ab5e6d7c8b9a0f1e2d3c4b5a6978877665544332211ffeeddccbbaa9988";
const std::string kUid = "6b1c7d2e-0f3a-4b5c-8d9e-a1b2c3d4e5f6";

fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("gpuscope-test-" + name + "-" + std::to_string(getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

uint16_t id_of(const char* symbol) { return cuda::function_by_symbol(symbol)->id; }

CallEvent call(uint32_t pid, const char* symbol) {
  CallEvent e;
  e.pid = pid;
  e.tid = pid;
  e.func = id_of(symbol);
  e.has_return = cuda::function_by_symbol(symbol)->has_return;
  return e;
}

using test::value;

}  // namespace

TEST(Container, KubeletSystemdDriverWithContainerd) {
  std::string uid_underscores = kUid;
  std::replace(uid_underscores.begin(), uid_underscores.end(), '-', '_');
  auto c = discover::parse_cgroup_path("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" +
                                       uid_underscores + ".slice/cri-containerd-" + kId + ".scope");
  EXPECT_EQ(c.container_id, kId);
  EXPECT_EQ(c.runtime, "containerd");
  EXPECT_EQ(c.pod_uid, kUid);
}

TEST(Container, KubeletCgroupfsDriverAndOtherRuntimes) {
  auto c = discover::parse_cgroup_path("/kubepods/besteffort/pod" + kUid + "/" + kId);
  EXPECT_EQ(c.container_id, kId);
  EXPECT_EQ(c.pod_uid, kUid);
  c = discover::parse_cgroup_path("/kubepods.slice/kubepods-pod" + kUid + ".slice/crio-" + kId + ".scope");
  EXPECT_EQ(c.runtime, "cri-o");
  EXPECT_EQ(c.container_id, kId);
  c = discover::parse_cgroup_path("/system.slice/docker-" + kId + ".scope");
  EXPECT_EQ(c.runtime, "docker");
  EXPECT_TRUE(c.pod_uid.empty());
  c = discover::parse_cgroup_path("/docker/" + kId);
  EXPECT_EQ(c.container_id, kId);
  EXPECT_EQ(c.runtime, "docker");
  c = discover::parse_cgroup_path("/user.slice/user-1000.slice/session-2.scope");
  EXPECT_TRUE(c.container_id.empty());
  EXPECT_TRUE(c.pod_uid.empty());
}

TEST(Container, BundleAnnotationsOfContainerdAndCriO) {
  const auto dir = temp_dir("bundle");
  write(dir / "containerd.json",
        R"({"ociVersion":"1.1.0","annotations":{"io.kubernetes.cri.sandbox-name":"trainer-0",)"
        R"("io.kubernetes.cri.sandbox-namespace":"ml","io.kubernetes.cri.container-name":"main"}})");
  write(dir / "crio.json", R"({"annotations":{"io.kubernetes.pod.name":"infer-7","io.kubernetes.pod.namespace":"serving",)"
                           R"("io.kubernetes.container.name":"server","io.kubernetes.pod.uid":")" + kUid + R"("}})");
  write(dir / "none.json", R"({"annotations":{}})");
  write(dir / "broken.json", R"({"annotations": )");
  discover::ContainerInfo a, b, c, d;
  ASSERT_TRUE(discover::read_bundle_annotations(dir / "containerd.json", a));
  EXPECT_EQ(a.pod, "trainer-0");
  EXPECT_EQ(a.namespace_, "ml");
  EXPECT_EQ(a.container, "main");
  ASSERT_TRUE(discover::read_bundle_annotations(dir / "crio.json", b));
  EXPECT_EQ(b.pod, "infer-7");
  EXPECT_EQ(b.namespace_, "serving");
  EXPECT_EQ(b.pod_uid, kUid);
  EXPECT_FALSE(discover::read_bundle_annotations(dir / "none.json", c));
  EXPECT_FALSE(discover::read_bundle_annotations(dir / "broken.json", d));
  EXPECT_FALSE(discover::read_bundle_annotations(dir / "missing.json", d));
  fs::remove_all(dir);
}

TEST(AgentConfig, ReadsEveryKeyAndSaysWhereItIsWrong) {
  const auto dir = temp_dir("config");
  write(dir / "ok.yaml",
        "listen: 0.0.0.0:9500\nbudget: 0.02\ninterval: 30s\notlp:\n  endpoint: http://c:4318/v1/metrics\n"
        "  interval: 500ms\n  headers:\n    X-Tenant: a\npyroscope:\n  url: http://p:4040\nmax_kernel_names: 50\n"
        "cpu_profile_hz: 0\ngpu_process_sample_interval: 2m\n");
  const auto c = agent::load_config(dir / "ok.yaml");
  EXPECT_EQ(c.listen, "0.0.0.0:9500");
  EXPECT_DOUBLE_EQ(c.budget, 0.02);
  EXPECT_DOUBLE_EQ(c.profile_interval_s, 30);
  EXPECT_EQ(c.otlp.url, "http://c:4318/v1/metrics");
  EXPECT_DOUBLE_EQ(c.otlp.interval_s, 0.5);
  EXPECT_EQ(c.otlp.headers.at("X-Tenant"), "a");
  EXPECT_EQ(c.pyroscope.url, "http://p:4040");
  EXPECT_EQ(c.max_kernel_names, 50u);
  EXPECT_EQ(c.cpu_profile_hz, 0);
  EXPECT_EQ(c.memory_limit_mb, 100u);  // default kept
  EXPECT_EQ(c.stack_map_entries, 8192u);
  EXPECT_DOUBLE_EQ(c.gpu_process_sample_s, 120);
  EXPECT_DOUBLE_EQ(agent::AgentConfig{}.gpu_process_sample_s, 10);

  write(dir / "typo.yaml", "budget: 0.02\notlp:\n  endpiont: http://c\n");
  try {
    agent::load_config(dir / "typo.yaml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("typo.yaml:3: unknown key 'otlp.endpiont'"), std::string::npos) << e.what();
  }
  write(dir / "stacks.yaml", "stack_map_entries: 512\n");
  EXPECT_EQ(agent::load_config(dir / "stacks.yaml").stack_map_entries, 512u);
  write(dir / "few.yaml", "budget: 0.02\nstack_map_entries: 16\n");
  try {
    agent::load_config(dir / "few.yaml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("few.yaml:2: stack_map_entries must be"), std::string::npos) << e.what();
  }
  write(dir / "walk.yaml", "stack_walk: eh-frame\nunwind_table_mb: 256\nunwind_cache: /tmp/t\n");
  const auto walk = agent::load_config(dir / "walk.yaml");
  EXPECT_EQ(walk.stack_walk, "eh-frame");
  EXPECT_EQ(walk.unwind_table_mb, 256u);
  EXPECT_EQ(walk.unwind_cache, "/tmp/t");
  EXPECT_EQ(agent::AgentConfig{}.stack_walk, "fp");
  EXPECT_EQ(agent::AgentConfig{}.stack_every, 1u);
  write(dir / "every.yaml", "stack_every: 16\n");
  EXPECT_EQ(agent::load_config(dir / "every.yaml").stack_every, 16u);
  write(dir / "badevery.yaml", "stack_every: 0\n");
  EXPECT_THROW(agent::load_config(dir / "badevery.yaml"), Error);
  write(dir / "badwalk.yaml", "budget: 0.02\nstack_walk: dwarf\n");
  try {
    agent::load_config(dir / "badwalk.yaml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("badwalk.yaml:2: stack_walk must be fp or eh-frame"), std::string::npos) << e.what();
  }
  // The documented file in deploy/ is a valid configuration with the defaults.
  const auto documented = agent::load_config(GPUSCOPE_SOURCE_DIR "/deploy/agent.yaml");
  EXPECT_EQ(documented.stack_walk, "fp");
  write(dir / "type.yaml", "budget: lots\n");
  EXPECT_THROW(agent::load_config(dir / "type.yaml"), Error);
  write(dir / "syntax.yaml", "budget: [0.01\n");
  EXPECT_THROW(agent::load_config(dir / "syntax.yaml"), Error);
  EXPECT_THROW(agent::load_config(dir / "missing.yaml"), Error);
  EXPECT_DOUBLE_EQ(agent::parse_duration_s("2m"), 120);
  EXPECT_DOUBLE_EQ(agent::parse_duration_s("1.5"), 1.5);
  EXPECT_THROW(agent::parse_duration_s("5 minutes"), Error);
  fs::remove_all(dir);
}

TEST(Aggregator, KernelLabelsDropParametersAndStayShort) {
  EXPECT_EQ(agent::kernel_label("vecAdd(float const*, float const*, float*, int)"), "vecAdd");
  EXPECT_EQ(agent::kernel_label("void scale<float>(float*, float, int)"), "scale<float>");
  EXPECT_EQ(agent::kernel_label("void at::native::f<(anonymous namespace)::Op>(int)"),
            "at::native::f<(anonymous namespace)::Op>");
  EXPECT_EQ(agent::kernel_label("plain_c_kernel"), "plain_c_kernel");
  EXPECT_LE(agent::kernel_label(std::string(1000, 'k')).size(), 160u);
}

TEST(Aggregator, CountsCallsByWhatTheyDid) {
  agent::AggregatorLimits limits;
  limits.max_kernel_names = 2;
  agent::Aggregator agg(limits, 99);
  const uint32_t pid = static_cast<uint32_t>(getpid());
  const int64_t k1 = agg.intern_kernel("_Z1av", "a()"), k2 = agg.intern_kernel("_Z1bv", "b()"),
                k3 = agg.intern_kernel("_Z1cv", "c()");
  for (int64_t k : {k1, k1, k2, k3}) {
    auto e = call(pid, "cudaLaunchKernel");
    e.kernel_id = k;
    agg.add_call(e);
  }
  auto copy = call(pid, "cudaMemcpy");
  copy.bytes = 1000;
  copy.dir = cuda::CopyDir::HostToDevice;
  copy.host_mem = HostMem::Pinned;
  copy.duration_ns = 2'000'000;
  agg.add_call(copy);
  auto alloc = call(pid, "cudaMalloc");
  alloc.ptr = 0x1000;
  alloc.bytes = 4096;
  agg.add_call(alloc);
  auto failed = call(pid, "cudaMalloc");
  failed.ret = 2;  // cudaErrorMemoryAllocation
  failed.bytes = 1 << 30;
  agg.add_call(failed);
  auto inner = call(pid, "cuMemAlloc_v2");  // the driver call inside cudaMalloc: not counted again
  inner.parent_id = 7;
  agg.add_call(inner);
  auto sync = call(pid, "cudaStreamSynchronize");
  sync.duration_ns = 5'000'000;
  agg.add_call(sync);

  auto s = agg.snapshot({}, 1);
  EXPECT_EQ(value(s, "gpuscope_kernel_launches_total", {{"kernel", "a"}}), 2);
  EXPECT_EQ(value(s, "gpuscope_kernel_launches_total", {{"kernel", "b"}}), 1);
  EXPECT_EQ(value(s, "gpuscope_kernel_launches_total", {{"kernel", "other"}}), 1);  // past the cap of 2
  EXPECT_EQ(value(s, "gpuscope_memcpy_bytes_total", {{"direction", "h2d"}, {"host_memory", "pinned"}}), 1000);
  EXPECT_DOUBLE_EQ(value(s, "gpuscope_memcpy_seconds_total"), 0.002);
  EXPECT_EQ(value(s, "gpuscope_device_memory_allocations_total"), 1);
  EXPECT_EQ(value(s, "gpuscope_device_memory_used_bytes"), 4096);
  EXPECT_EQ(value(s, "gpuscope_device_memory_allocation_failures_total"), 1);
  EXPECT_EQ(value(s, "gpuscope_cuda_call_errors_total", {{"function", "cudaMalloc"}}), 1);
  EXPECT_DOUBLE_EQ(value(s, "gpuscope_synchronization_seconds_total", {{"function", "cudaStreamSynchronize"}}), 0.005);
  EXPECT_EQ(agg.shed().kernel_names, 1u);
  // Probe hits: 4 launches (entry only), and 5 calls probed at entry and return.
  const auto hits = agg.probe_hits().at(pid);
  EXPECT_EQ(hits.entries, 9u);
  EXPECT_EQ(hits.returns, 5u);

  auto free = call(pid, "cudaFree");
  free.ptr = 0x1000;
  agg.add_call(free);
  // A sampled process: each observed launch stands for four.
  agg.set_high_rate_weight(pid, 4, 0.25);
  auto e = call(pid, "cudaLaunchKernel");
  e.kernel_id = k2;
  agg.add_call(e);
  s = agg.snapshot({}, 1);
  EXPECT_EQ(value(s, "gpuscope_device_memory_used_bytes"), 0);
  EXPECT_EQ(value(s, "gpuscope_device_memory_freed_bytes_total"), 4096);
  EXPECT_EQ(value(s, "gpuscope_kernel_launches_total", {{"kernel", "b"}}), 5);
  EXPECT_EQ(value(s, "gpuscope_observed_ratio"), 0.25);

  // An exited process is exported once more, then let go.
  agg.set_process_exit(pid, 0, 0);
  agg.set_process_exit(pid, 0, 0);  // told twice (a record and a sweep): once
  EXPECT_EQ(value(agg.snapshot({}, 1), "gpuscope_kernel_launches_total", {{"kernel", "a"}}), 2);
  EXPECT_EQ(value(agg.snapshot({}, 1), "gpuscope_kernel_launches_total"), -1);
}

TEST(Aggregator, StackTableIsBoundedAndOldIdsStayVoid) {
  agent::AggregatorLimits limits;
  limits.max_stacks = 8;
  agent::Aggregator agg(limits, 100);
  const uint32_t pid = static_cast<uint32_t>(getpid());
  const int64_t m = agg.intern_module("/nonexistent/libx.so", "");
  std::vector<int64_t> ids;
  for (uint64_t i = 0; i < 10; ++i) ids.push_back(agg.intern_stack({{m, 0x100 + i, 0}}));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 0), 2);  // past the cap: shed
  EXPECT_EQ(agg.shed().stacks, 2u);
  for (int64_t id : ids)
    if (id) agg.add_sample(0, pid, pid, 0, id, 0);
  const uint64_t epoch = agg.stack_epoch();
  auto profiles = agg.take_profiles();
  ASSERT_EQ(profiles.size(), 1u);
  EXPECT_EQ(profiles[0].cpu.stacks.size(), 8u);
  EXPECT_EQ(profiles[0].cpu.total(), 8 * 10'000'000);  // 8 samples at 100 Hz
  EXPECT_EQ(profiles[0].cpu.stacks.begin()->first[1], "libx.so+0x100");
  EXPECT_NE(agg.stack_epoch(), epoch);  // emptied: more than half full
  // An id from before the table was emptied names nothing now.
  agg.add_sample(0, pid, pid, 0, ids[0], 0);
  const auto later = agg.take_profiles();
  EXPECT_TRUE(later.empty() || later[0].cpu.stacks.empty());
  EXPECT_NE(agg.intern_stack({{m, 0x100, 0}}), ids[0]);  // ids are not reused
}

TEST(Aggregator, AWindowKeptUnnamedIsNamedLaterAsItWas) {
  // Nobody asked for the window: it is kept unnamed, and the table empties (more than half
  // full). Named later, it is the window as it was, Python frames and all; the next window is
  // its own.
  agent::AggregatorLimits limits;
  limits.max_stacks = 8;
  agent::Aggregator agg(limits, 100);
  const uint32_t pid = static_cast<uint32_t>(getpid());
  const int64_t m = agg.intern_module("/nonexistent/libx.so", "");
  const int64_t py = agg.intern_module("[python]", "");
  const int64_t step = agg.intern_python_frame("train_step", "train.py", 42);
  for (uint64_t i = 0; i < 5; ++i)
    agg.add_sample(0, pid, pid, 0, agg.intern_stack({{py, uint64_t(step), 0}, {m, 0x100 + i, 0}}), 0);
  const uint64_t epoch = agg.stack_epoch();
  EXPECT_TRUE(agg.take_profiles(agent::Aggregator::Take::Kept).empty());
  EXPECT_NE(agg.stack_epoch(), epoch);  // emptied
  agg.add_sample(0, pid, pid, 0, agg.intern_stack({{m, 0x200, 0}}), 0);  // the next window's
  auto named = agg.name_unnamed();
  ASSERT_TRUE(named.has_value());
  ASSERT_EQ(named->size(), 1u);
  const auto& cpu = (*named)[0].cpu;
  EXPECT_EQ(cpu.total(), 5 * 10'000'000);
  ASSERT_EQ(cpu.stacks.size(), 5u);
  for (const auto& [path, n] : cpu.stacks) {
    ASSERT_EQ(path.size(), 3u);
    EXPECT_TRUE(path[1].starts_with("libx.so+0x10")) << path[1];  // outermost first: the native frame
    EXPECT_EQ(path[2], "train_step (train.py:42)");
  }
  EXPECT_EQ(cpu.sources.at("train_step (train.py:42)"), (std::pair<std::string, int64_t>{"train.py", 42}));
  EXPECT_FALSE(agg.name_unnamed().has_value());  // named once
  // Dropped (the memory limit): nothing kept to name.
  agg.take_profiles(agent::Aggregator::Take::Dropped);
  EXPECT_FALSE(agg.name_unnamed().has_value());
}

TEST(Aggregator, LaunchProfileWeighsSampledStacks) {
  // Under stack_every 4 a launch whose stack was taken stands for 4 in the cuda_launches
  // profile; one left out has no stack. Counters count every launch once.
  agent::Aggregator agg({}, 100);
  const uint32_t pid = static_cast<uint32_t>(getpid());
  const int64_t m = agg.intern_module("/nonexistent/libx.so", "");
  const int64_t stack = agg.intern_stack({{m, 0x100, 0}});
  for (uint32_t weight : {4u, 0u, 0u, 0u, 4u}) {
    auto e = call(pid, "cudaLaunchKernel");
    e.stack_weight = weight;
    e.stack_id = weight ? stack : 0;
    agg.add_call(e);
  }
  EXPECT_EQ(value(agg.snapshot({}, 1), "gpuscope_kernel_launches_total"), 5);
  auto profiles = agg.take_profiles();
  ASSERT_EQ(profiles.size(), 1u);
  EXPECT_EQ(profiles[0].launches.total(), 8);
}

TEST(Aggregator, PcieReadingsStandBetweenTheTicksThatReadThem) {
  // PCIe throughput is read on slow ticks only (gpu_process_sample_interval): the ticks in
  // between keep its last reading, and update everything else.
  agent::Aggregator agg({}, 0);
  gpu::GpuSample slow;
  slow.gpu_util = 50;
  slow.pcie_tx_kbs = 1000;
  slow.pcie_rx_kbs = 2000;
  agg.add_gpu_batch({{slow}, {}, {}});
  gpu::GpuSample fast;
  fast.gpu_util = 60;
  agg.add_gpu_batch({{fast}, {}, {}});
  const auto s = agg.snapshot({}, 1);
  EXPECT_DOUBLE_EQ(value(s, "gpuscope_gpu_utilization_ratio"), 0.6);
  EXPECT_DOUBLE_EQ(value(s, "gpuscope_gpu_pcie_transmit_bytes_per_second"), 1000 * 1024.0);
  EXPECT_DOUBLE_EQ(value(s, "gpuscope_gpu_pcie_receive_bytes_per_second"), 2000 * 1024.0);
}

// A 1% budget with the given cost of a hit (entry only; entry and return), in ns.
static agent::BudgetConfig one_percent_budget(double entry_hit_ns, double return_hit_ns) {
  agent::BudgetConfig cfg;
  cfg.budget = 0.01;
  cfg.entry_hit_ns = entry_hit_ns;
  cfg.return_hit_ns = return_hit_ns;
  return cfg;
}

TEST(Budget, DutyFollowsWhatTheProbesCostAgainstTheProcessCpu) {
  agent::Aggregator agg({}, 0);
  const pid_t pid = getpid();
  std::vector<std::pair<pid_t, bool>> switches;
  const agent::BudgetConfig cfg = one_percent_budget(1000, 3000);
  agent::BudgetController budget(cfg, agg, [&](pid_t p, bool on, bool) {
    switches.emplace_back(p, on);
    return on;
  });
  // The process (this test) must be known to the aggregator for its hits to count.
  agg.add_call(call(uint32_t(pid), "cudaDeviceSynchronize"));
  uint64_t now = 1'000'000'000;
  budget.add_process(pid, now);
  ASSERT_EQ(switches, (std::vector<std::pair<pid_t, bool>>{{pid, true}}));

  // Burn about a second of CPU, then report probe hits costing 10% of what was burnt.
  const uint64_t cpu0 = agent::process_cpu_ns(pid);
  volatile uint64_t x = 0;
  while (agent::process_cpu_ns(pid) - cpu0 < 1'000'000'000) x = x + 1;
  const uint64_t burnt = agent::process_cpu_ns(pid) - cpu0;
  const auto hits = burnt / 10 / 1000;  // entry-only hits at 1 µs each
  for (uint64_t i = 0; i < hits; ++i) agg.add_call(call(uint32_t(pid), "cudaLaunchKernel"));
  // Counting the calls costs CPU too (much of it in a sanitized build): the cost is weighed
  // against all of it.
  const double cost = double(hits) * 1000 / double(agent::process_cpu_ns(pid) - cpu0);
  // The cost is ~10% in a plain build, less where counting is slow (sanitizers): ~6%. The
  // tick comes late enough for any duty up to 0.5, so the on-period has always run out.
  ASSERT_GT(cost, 0.02);
  const double on_s = 5.0;
  now += uint64_t(on_s * 1e9);
  budget.tick(now);
  const auto& st = budget.processes().at(pid);
  EXPECT_NEAR(st.duty, 0.01 / cost, 0.02);  // 1% budget / the cost
  // On for duty * 2 s of each cycle (already spent: the 5 s at full duty were within the budget
  // as it then stood), then off for (1 - duty) / duty times that.
  EXPECT_FALSE(st.on);
  EXPECT_EQ(switches.back(), std::make_pair(pid, false));
  EXPECT_NEAR(st.off_len_s, std::max(0.2, st.duty * 2) * (1 - st.duty) / st.duty, 0.01);
  const double off_s = st.off_len_s;
  now += uint64_t((off_s - 0.3) * 1e9);
  budget.tick(now);
  EXPECT_FALSE(budget.processes().at(pid).on);
  now += 400'000'000;
  budget.tick(now);
  EXPECT_TRUE(budget.processes().at(pid).on);
  EXPECT_NEAR(budget.processes().at(pid).observed_ratio(), on_s / (on_s + off_s + 0.1), 0.01);
  budget.remove_process(pid);
  EXPECT_EQ(switches.back(), std::make_pair(pid, false));
}

// Burns about `ns` of this process's CPU time; returns what it burnt.
static uint64_t burn_cpu(uint64_t ns) {
  const uint64_t cpu0 = agent::process_cpu_ns(getpid());
  volatile uint64_t x = 0;
  while (agent::process_cpu_ns(getpid()) - cpu0 < ns) x = x + 1;
  return agent::process_cpu_ns(getpid()) - cpu0;
}

TEST(Budget, AlwaysOnProbesTakeTheirShareAndLateHitsStillCount) {
  // The process's CPU time is the test's to set: what it reads is what the duty follows,
  // whatever else this process or the machine does meanwhile.
  agent::Aggregator agg({}, 0);
  const pid_t pid = getpid();
  const agent::BudgetConfig cfg = one_percent_budget(1000, 1000);
  uint64_t cpu_ns = 5'000'000'000;
  agent::BudgetController budget(cfg, agg, [](pid_t, bool on, bool) { return on; },
                                 [&](pid_t) { return cpu_ns; });
  agg.add_call(call(uint32_t(pid), "cudaDeviceSynchronize"));
  uint64_t now = 1'000'000'000;
  budget.add_process(pid, now);
  auto hits = [&](const char* func, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) agg.add_call(call(uint32_t(pid), func));
  };
  // Launches cost 5% of the CPU time while on, the always-on probes 0.5%: the launches get
  // what is left of the 1%, on (1% - 0.5%) / 5% = 10% of the time.
  const uint64_t burnt = 1'000'000'000;
  cpu_ns += burnt;
  hits("cudaLaunchKernel", burnt / 20 / 1000);
  hits("cudaDeviceSynchronize", burnt / 200 / 1000);
  now += 1'050'000'000;
  budget.tick(now);
  EXPECT_NEAR(budget.processes().at(pid).duty, 0.1, 1e-9);
  EXPECT_FALSE(budget.processes().at(pid).on);
  // Launch records that arrive after the switch-off belong to the on-time before it: here,
  // the next on-period's launches all arrive late, costing 10% of its CPU time.
  hits("cudaLaunchKernel", burnt / 10 / 1000);
  now += 500'000'000;
  budget.tick(now);
  now += 9'000'000'000;
  budget.tick(now);  // the next cycle: on
  ASSERT_TRUE(budget.processes().at(pid).on);
  cpu_ns += burnt;
  now += 1'050'000'000;
  budget.tick(now);
  // 1% / 10%; had the late hits been dropped, the period would look free and the duty double.
  EXPECT_LT(budget.processes().at(pid).duty, 0.15);
}

TEST(Budget, SlowSwitchesLengthenTheOffPeriodNotTheShareObserved) {
  // Detaching takes the agent time during which the probes still fire: the off-period is
  // sized from the on-period as it really was (from the duty's planned length on, the time
  // before at full duty aside), so the share observed stays the duty.
  agent::Aggregator agg({}, 0);
  const pid_t pid = getpid();
  const agent::BudgetConfig cfg = one_percent_budget(1000, 1000);
  agent::BudgetController budget(cfg, agg, [](pid_t, bool on, bool) {
    if (!on) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    return on;
  });
  agg.add_call(call(uint32_t(pid), "cudaDeviceSynchronize"));
  uint64_t now = 1'000'000'000;
  budget.add_process(pid, now);
  const uint64_t burnt = burn_cpu(1'000'000'000);
  for (uint64_t i = 0; i < burnt / 10 / 1000; ++i) agg.add_call(call(uint32_t(pid), "cudaLaunchKernel"));
  now += 1'050'000'000;
  budget.tick(now);
  const auto& st = budget.processes().at(pid);
  ASSERT_FALSE(st.on);
  EXPECT_NEAR(st.duty, 0.1, 0.02);
  // Live for the 0.2 s a duty of 0.1 plans and the 0.3 s the switch-off took: off for
  // 0.5 * (1 - duty) / duty.
  EXPECT_GT(st.off_len_s, 0.49 * (1 - st.duty) / st.duty);
  EXPECT_LT(st.off_len_s, 0.56 * (1 - st.duty) / st.duty);
}

TEST(Budget, ProbesEveryFunctionInTheFirstAndEveryFourthOnPeriodOnly) {
  // Between those, only the functions the process was seen calling are probed: the aggregator
  // keeps them, driver calls made inside runtime calls included.
  agent::Aggregator agg({}, 0);
  const pid_t pid = getpid();
  std::vector<bool> all_functions;  // one per switch-on
  agent::BudgetController budget(one_percent_budget(1000, 1000), agg, [&](pid_t, bool on, bool all) {
    if (on) all_functions.push_back(all);
    return on;
  });
  agg.add_call(call(uint32_t(pid), "cudaDeviceSynchronize"));
  uint64_t now = 1'000'000'000;
  budget.add_process(pid, now);
  const uint64_t burnt = burn_cpu(300'000'000);
  CallEvent launch = call(uint32_t(pid), "cudaLaunchKernel");
  launch.driver_func = cuda::function_by_symbol("cuLaunchKernel")->id;
  for (uint64_t i = 0; i < burnt / 10 / 1000; ++i) agg.add_call(launch);
  for (int i = 0; i < 600 && all_functions.size() < 10; ++i) budget.tick(now += 100'000'000);
  ASSERT_GE(all_functions.size(), 10u);
  for (size_t i = 0; i < all_functions.size(); ++i) EXPECT_EQ(all_functions[i], i % 4 == 0) << "on-period " << i;
  EXPECT_EQ(agg.high_rate_functions(uint32_t(pid)),
            (std::set<uint16_t>{cuda::function_by_symbol("cudaLaunchKernel")->id, launch.driver_func}));
  EXPECT_TRUE(agg.high_rate_functions(uint32_t(pid) + 1).empty());
}

TEST(NameOffsets, AgreesWithTheIndexedFileAndKeepsNothing) {
  // This test binary: its own functions, named by the full index and by the one-pass reader.
  const std::string exe = fs::read_symlink("/proc/self/exe");
  auto elf = elf::ElfFile::open(exe);
  const auto offsets = elf->function_offsets({"main", "gpuscope_calibration_target"});
  std::vector<uint64_t> wanted;
  for (const auto& [name, off] : offsets) wanted.push_back(off + 1);
  ASSERT_FALSE(wanted.empty());
  wanted.push_back(1);  // the ELF header: in no function
  const auto names = elf::name_offsets(exe, elf->build_id(), wanted);
  ASSERT_EQ(names.size(), wanted.size());
  for (size_t i = 0; i + 1 < wanted.size(); ++i) {
    const auto indexed = elf->symbolize(wanted[i]);
    ASSERT_TRUE(indexed);
    EXPECT_EQ(names[i].name, elf::demangle(indexed->first.name));
    EXPECT_EQ(names[i].start, indexed->first.file_offset);
    EXPECT_EQ(names[i].start, wanted[i] - 1);
    EXPECT_GT(names[i].end, wanted[i]);
  }
  EXPECT_EQ(names.back().name, "");
  EXPECT_THROW(elf::name_offsets(exe, "00ff", wanted), std::runtime_error);  // another build
}

extern "C" __attribute__((noinline, used)) int gpuscope_test_other_function(int x) { return x * 3 + 1; }

TEST(Aggregator, SymbolPassesOverOneLibraryAreSpacedByTheirCost) {
  // Frame-pointer walks through code without frame pointers give ever new offsets in a library:
  // after one pass over its symbols, an offset no known function covers waits for the next pass
  // (named file+offset for the window, counted) while offsets in known functions are named.
  // Here the wait is at its cap (a minute): spacing far above what any pass costs.
  const std::string exe = fs::read_symlink("/proc/self/exe");
  auto elf = elf::ElfFile::open(exe);
  const auto offsets = elf->function_offsets({"main", "gpuscope_test_other_function"});
  ASSERT_EQ(offsets.size(), 2u);
  const uint64_t in_main = offsets.at("main") + 1, in_target = offsets.at("gpuscope_test_other_function") + 1;
  agent::AggregatorLimits limits;
  limits.symbol_pass_spacing = 1'000'000'000'000;
  agent::Aggregator agg(limits, 100);
  const uint32_t pid = static_cast<uint32_t>(getpid());
  const int64_t m = agg.intern_module(exe, elf->build_id());
  const auto leaf_of = [](const agent::ProcessProfile& p) {
    std::set<std::string> leaves;
    for (const auto& [path, n] : p.cpu.stacks) leaves.insert(path.back());
    return leaves;
  };
  agg.add_sample(0, pid, pid, 0, agg.intern_stack({{m, in_main, 0}}), 0);
  auto first = agg.take_profiles();
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(leaf_of(first[0]), std::set<std::string>{"main"});

  agg.add_sample(0, pid, pid, 0, agg.intern_stack({{m, in_main + 1, 0}}), 0);
  const int64_t waiting = agg.intern_stack({{m, in_target, 0}});
  agg.add_sample(0, pid, pid, 0, waiting, 0);
  auto second = agg.take_profiles();
  ASSERT_EQ(second.size(), 1u);
  const std::string unnamed = fmt::format("{}+{:#x}", fs::path(exe).filename().string(), in_target);
  EXPECT_EQ(leaf_of(second[0]), (std::set<std::string>{"main", unnamed}));
  EXPECT_EQ(agg.shed().frame_names, 1u);
  // Its stack is named again in the next window (still waiting here: a minute has not passed).
  agg.add_sample(0, pid, pid, 0, waiting, 0);
  auto third = agg.take_profiles();
  ASSERT_EQ(third.size(), 1u);
  EXPECT_EQ(leaf_of(third[0]), std::set<std::string>{unnamed});
  EXPECT_EQ(agg.shed().frame_names, 2u);
}

TEST(Aggregator, ACheapSymbolPassIsNotPutOff) {
  // With no spacing, a function first met in a later window (a launch stack after a window of
  // start-up samples, in a short-lived process) is named in that window.
  const std::string exe = fs::read_symlink("/proc/self/exe");
  auto elf = elf::ElfFile::open(exe);
  const auto offsets = elf->function_offsets({"main", "gpuscope_test_other_function"});
  ASSERT_EQ(offsets.size(), 2u);
  agent::AggregatorLimits limits;
  limits.symbol_pass_spacing = limits.symbol_pass_spacing_all = 0;
  agent::Aggregator agg(limits, 100);
  const uint32_t pid = static_cast<uint32_t>(getpid());
  const int64_t m = agg.intern_module(exe, elf->build_id());
  for (const char* fn : {"main", "gpuscope_test_other_function"}) {
    agg.add_sample(0, pid, pid, 0, agg.intern_stack({{m, offsets.at(fn) + 1, 0}}), 0);
    auto window = agg.take_profiles();
    ASSERT_EQ(window.size(), 1u);
    ASSERT_EQ(window[0].cpu.stacks.size(), 1u);
    EXPECT_EQ(window[0].cpu.stacks.begin()->first.back(), fn);
  }
  EXPECT_EQ(agg.shed().frame_names, 0u);
}

TEST(Aggregator, SymbolPassesOverAllLibrariesTogetherAreSpacedByTheirCost) {
  // A PyTorch process samples in a dozen large libraries: each file's first pass is made at once,
  // a later one (here the test binary's, no spacing of its own) waits for the passes over every
  // file to have used their share of a thread (here: far longer than the test).
  const std::string exe = fs::read_symlink("/proc/self/exe");
  auto elf = elf::ElfFile::open(exe);
  const auto offsets = elf->function_offsets({"main", "gpuscope_test_other_function"});
  ASSERT_EQ(offsets.size(), 2u);
  // A function of the C library, and where its file is mapped.
  Dl_info info{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&getppid), &info), 0);
  const std::string libc = fs::canonical(info.dli_fname);
  auto libc_elf = elf::ElfFile::open(libc);
  const auto libc_offsets = libc_elf->function_offsets({"getppid"});
  ASSERT_EQ(libc_offsets.size(), 1u);
  agent::AggregatorLimits limits;
  limits.symbol_pass_spacing = 0;
  limits.symbol_pass_spacing_all = 1'000'000'000'000;
  agent::Aggregator agg(limits, 100);
  const uint32_t pid = static_cast<uint32_t>(getpid());
  const int64_t m = agg.intern_module(exe, elf->build_id()), c = agg.intern_module(libc, libc_elf->build_id());
  auto leaf = [&](int64_t module, uint64_t offset) {
    agg.add_sample(0, pid, pid, 0, agg.intern_stack({{module, offset, 0}}), 0);
    auto window = agg.take_profiles();
    return window.size() == 1 && window[0].cpu.stacks.size() == 1 ? window[0].cpu.stacks.begin()->first.back() : "";
  };
  EXPECT_EQ(leaf(m, offsets.at("main") + 1), "main");
  EXPECT_EQ(leaf(c, libc_offsets.at("getppid") + 1), "getppid");  // another file's first pass
  const uint64_t in_target = offsets.at("gpuscope_test_other_function") + 1;
  EXPECT_EQ(leaf(m, in_target), fmt::format("{}+{:#x}", fs::path(exe).filename().string(), in_target));
  EXPECT_EQ(agg.shed().frame_names, 1u);
}

TEST(Budget, KernelLookupsBeforeEachLaunchAreDutyCycledOthersStayOn) {
  auto spec = [](const char* s) { return *cuda::function_by_symbol(s); };
  EXPECT_TRUE(cuda::is_high_rate(spec("cuLaunchKernel")));
  EXPECT_TRUE(cuda::is_high_rate(spec("cuKernelGetFunction")));  // cuBLASLt: one per launch
  EXPECT_FALSE(cuda::is_high_rate(spec("cuModuleGetFunction")));  // once per kernel
  EXPECT_FALSE(cuda::is_high_rate(spec("cuLibraryGetKernel")));
  EXPECT_FALSE(cuda::is_high_rate(spec("cudaMalloc")));
  EXPECT_FALSE(cuda::is_high_rate(spec("cudaStreamSynchronize")));
}

TEST(NameOffsets, DefinesAnyFunctionMatchesWholeNamesOnly) {
  // Asked of every library a CUDA process loads (a static CUDA runtime inside it?): the names
  // are found in the string tables first, then only their symbols are looked at.
  const std::string exe = fs::read_symlink("/proc/self/exe");
  EXPECT_EQ(gpuscope_test_other_function(1), 4);
  EXPECT_TRUE(elf::defines_any_function(exe, {"nothing_by_this_name", "gpuscope_test_other_function"}));
  EXPECT_TRUE(elf::defines_any_function(exe, {"main"}));
  EXPECT_FALSE(elf::defines_any_function(exe, {"gpuscope_test_other_functio"}));  // a prefix
  EXPECT_FALSE(elf::defines_any_function(exe, {"test_other_function"}));          // a tail
  EXPECT_FALSE(elf::defines_any_function(exe, {"sqlite3_open_v2"}));  // imported, not defined
  EXPECT_FALSE(elf::defines_any_function("/nonexistent", {"main"}));
}

TEST(Budget, ProcessCpuTimeReadsStatPastACommandWithParentheses) {
  // /proc/PID/stat's command may hold spaces and parentheses: the fields are counted from the last ')'.
  char old_name[16] = {};
  prctl(PR_GET_NAME, old_name);
  prctl(PR_SET_NAME, "a) b (c) 1 2");
  burn_cpu(200'000'000);
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  const double truth = double(ts.tv_sec) * 1e9 + double(ts.tv_nsec);
  const double read = double(agent::process_cpu_ns(getpid()));
  prctl(PR_SET_NAME, old_name);
  EXPECT_GT(read, 0);
  EXPECT_NEAR(read, truth, 50e6);  // the kernel's clock ticks (10 ms) and the threads' accounting
  EXPECT_EQ(agent::process_cpu_ns(999'999'999), 0u);  // no such process
}

// This test process, found by a 1% budget (a hit costs 1 us) at `now`, its probes on.
struct FoundProcess {
  agent::Aggregator agg{{}, 0, "/", [this] { return now; }};  // the budget's clock
  const pid_t pid = getpid();
  agent::BudgetController budget{one_percent_budget(1000, 1000), agg, [](pid_t, bool on, bool) { return on; }};
  uint64_t now = 1'000'000'000;
  FoundProcess() {
    agg.add_call(call(uint32_t(pid), "cudaDeviceSynchronize"));  // known to the aggregator
    budget.add_process(pid, now);
  }
  void calls(const char* func, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) {
      auto e = call(uint32_t(pid), func);
      e.ts_ns = now;  // made now (by the budget's clock)
      agg.add_call(e);
    }
  }
};

TEST(Budget, TheFirstEstimateComesAfterHalfASecond) {
  // A process is found with its probes on: a launch-bound one pays their whole cost until the
  // first estimate, so that comes after half a second of on-time (later ones after a second).
  FoundProcess found;
  // Probes costing half its CPU time while on: on 2% of the time, in on-periods of 0.2 s.
  const uint64_t burnt = burn_cpu(500'000'000);
  found.calls("cudaLaunchKernel", burnt / 2 / 1000);
  found.now += 550'000'000;
  found.budget.tick(found.now);
  const auto& st = found.budget.processes().at(found.pid);
  EXPECT_TRUE(st.estimated);
  EXPECT_NEAR(st.duty, 0.02, 0.005);
  EXPECT_FALSE(st.on);  // switched off found.now, not after a second
}

TEST(Budget, AProcessFarOverItsBudgetIsCutBackAfterAFifthOfASecond) {
  // A job that was quiet (duty 1) and starts launching pays the probes' full cost until the
  // next estimate; more than twice over budget, it is cut back after 0.2 s of on-time.
  FoundProcess found;
  const uint64_t burnt = burn_cpu(200'000'000);
  found.calls("cudaLaunchKernel", burnt / 2 / 1000);
  // 0.3 s of on-time: past the on-period a 2% duty allows (0.2 s), short of half a second.
  found.now += 300'000'000;
  found.budget.tick(found.now);
  const auto& st = found.budget.processes().at(found.pid);
  EXPECT_NEAR(st.duty, 0.02, 0.005);  // 1% / 50%
  EXPECT_FALSE(st.on);
}

TEST(Budget, AProcessSlightlyOverItsBudgetWaitsForTheFullEstimate) {
  FoundProcess found;
  // 1.5% while on: 0.67 of the time is wanted, not under half of the duty (1) yet.
  const uint64_t burnt = burn_cpu(200'000'000);
  found.calls("cudaLaunchKernel", burnt * 15 / 1000 / 1000);
  found.now += 210'000'000;
  found.budget.tick(found.now);
  EXPECT_DOUBLE_EQ(found.budget.processes().at(found.pid).duty, 1.0);
  EXPECT_TRUE(found.budget.processes().at(found.pid).on);
}

TEST(Budget, AnExitedProcessKeepsItsOverheadSeriesWhileItsOtherSeriesStay) {
  // Its counters stay until the next export drops them; its estimated cost must stay beside.
  FoundProcess found;
  const uint64_t burnt = burn_cpu(200'000'000);
  found.calls("cudaLaunchKernel", burnt / 100 / 1000);
  found.budget.tick(found.now + 250'000'000);
  const double live = found.budget.overhead_family(found.agg).samples.at(0).value;
  EXPECT_GT(live, 0.005);
  found.budget.remove_process(found.pid);
  const auto f = found.budget.overhead_family(found.agg);
  ASSERT_EQ(f.samples.size(), 1u);
  EXPECT_DOUBLE_EQ(f.samples[0].value, live);
}

TEST(Budget, OnlyTheAgentsWorkOnObservedCallsCutsEveryDuty) {
  // Process churn: the agent's readers spend 5% of a core on 1,000 exec, fork and exit records
  // a second, none of them a call. Observing less would save none of it.
  EXPECT_EQ(agent::observing_share(0.05, 1, 1000, 0), 0);
  EXPECT_DOUBLE_EQ(agent::observing_share(0.2, 2, 50000, 50000), 0.1);  // all launches
  EXPECT_DOUBLE_EQ(agent::observing_share(0.08, 1, 2000, 1000), 0.04);  // half
  EXPECT_EQ(agent::observing_share(0.08, 1, 0, 0), 0);
  agent::Aggregator agg({}, 0);
  agent::BudgetController budget(one_percent_budget(1000, 1000), agg, [](pid_t, bool on, bool) { return on; });
  budget.note_agent_cpu(agent::observing_share(0.08, 1, 1000, 0), 0.05);
  EXPECT_EQ(budget.agent_factor(), 1);
  budget.note_agent_cpu(agent::observing_share(0.2, 1, 1000, 1000), 0.05);
  EXPECT_DOUBLE_EQ(budget.agent_factor(), 0.25);
}

TEST(Budget, AnOnPeriodsLaunchesCountForTheCycleAsItIsLived) {
  // A process is found with its probes on (duty 1); its first estimate cuts them to 2%. The
  // launches seen in that first on-period (0.3 s) stand for the whole cycle as it is lived: once
  // each as they come, rising while the off-period (49 times the 0.2 s the duty plans) passes, to
  // the cycle's length over the on-period's each when it has run. (They were once counted 1 / duty
  // each at the switch-off, before the off-period was lived: a process that exited in it was
  // counted for a cycle it never had.)
  FoundProcess found;
  const uint64_t burnt = burn_cpu(200'000'000);
  const uint64_t launches = burnt / 2 / 1000;  // 50% of the CPU time at 1 us a hit
  found.calls("cudaLaunchKernel", launches);
  EXPECT_EQ(value(found.agg.snapshot({}, 1), "gpuscope_kernel_launches_total"), double(launches));
  found.now += 300'000'000;
  found.budget.tick(found.now);
  const auto& st = found.budget.processes().at(found.pid);
  ASSERT_FALSE(st.on);
  EXPECT_EQ(value(found.agg.snapshot({}, 1), "gpuscope_kernel_launches_total"), double(launches));
  found.now += uint64_t(st.off_len_s * 1e9) + 1;
  found.budget.tick(found.now);
  ASSERT_TRUE(found.budget.processes().at(found.pid).on);
  const double duty = found.budget.processes().at(found.pid).duty;
  EXPECT_NEAR(st.off_len_s, 0.2 * (1 - duty) / duty, 0.01);
  const double each = (0.3 + st.off_len_s) / 0.3;
  EXPECT_NEAR(value(found.agg.snapshot({}, 1), "gpuscope_kernel_launches_total"), double(launches) * each,
              1e-3 * double(launches) * each);
  // One arriving late, after the switch-off, belongs to that period: it counts the same.
  auto late = call(uint32_t(found.pid), "cudaLaunchKernel");
  late.ts_ns = 1'000'000'000 + 100'000'000;  // made 0.1 s into the on-period
  found.agg.add_call(late);
  EXPECT_NEAR(value(found.agg.snapshot({}, 1), "gpuscope_kernel_launches_total"), double(launches + 1) * each,
              1e-3 * double(launches) * each);
}
