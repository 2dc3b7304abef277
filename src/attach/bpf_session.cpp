#include "attach/bpf_session.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/perf_event.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>
#include <unordered_set>

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "cuda/functions.h"
#include "discover/proc.h"
#include "gpuscope.skel.h"
#include "elf/elf_file.h"

namespace gpuscope::attach {

std::string_view lost_cause_name(int cause) {
#define GS_LOST_NAME(cause, name) name,
  static constexpr std::string_view kNames[] = {GS_LOST_CAUSES(GS_LOST_NAME)};
#undef GS_LOST_NAME
  static_assert(std::size(kNames) == GS_LOST_NR);
  return cause >= 0 && cause < GS_LOST_NR ? kNames[cause] : "unknown";
}

void BpfSession::LinkDeleter::operator()(bpf_link* l) const { bpf_link__destroy(l); }
void BpfSession::SkelDeleter::operator()(gpuscope_bpf* s) const { gpuscope_bpf__destroy(s); }
void BpfSession::RingDeleter::operator()(ring_buffer* r) const { ring_buffer__free(r); }

namespace {

// libbpf prints through this; keep warnings, drop its debug chatter.
int libbpf_print(enum libbpf_print_level level, const char* fmt, va_list args) {
  if (level == LIBBPF_DEBUG) return 0;
  return vfprintf(stderr, fmt, args);
}

uint32_t round_up_pow2(uint32_t v) {
  uint32_t p = 4096;
  while (p < v) p <<= 1;
  return p;
}

}  // namespace

void BpfSession::open_and_load(const SessionConfig& cfg, bool multi) {
  skel_.reset(gpuscope_bpf__open());
  if (!skel_) throw Error("cannot open the BPF object: {}", strerror(errno));

  skel_->rodata->filter_targets = cfg.filter_targets;
  skel_->rodata->sample_only_targets = cfg.sample_only_targets;
  skel_->rodata->capture_stacks = cfg.capture_stacks;
  skel_->rodata->stop_for_shared_objects = cfg.stop_for_shared_objects;
  skel_->rodata->sample_stack_copy = cfg.sample_stack_copy;
  skel_->rodata->call_stack_copy = cfg.call_stack_copy;
  skel_->rodata->stack_every = std::max<uint32_t>(cfg.stack_every, 1);
  skel_->rodata->stack_budget = cfg.stack_budget;
  skel_->rodata->python_stacks = cfg.python_stacks;
  // The calls' walker comes later, in load_walker's programs: these send stacks as copies
  // meanwhile. (Samples, whose walker is not the default, have theirs at once.)
  skel_->rodata->call_unwind_tables = false;
  skel_->rodata->call_tables_later = cfg.call_unwind_tables && cfg.capture_stacks && !cfg.floor_probes;
  skel_->rodata->sample_unwind_tables = cfg.sample_unwind_tables;
  const bool tables = cfg.call_unwind_tables || cfg.sample_unwind_tables;
  const bool walks = tables || cfg.walk_user_stacks;
  bpf_map__set_max_entries(skel_->maps.unwind_rows, tables ? std::max<uint32_t>(cfg.unwind_rows, 1) : 1);
  // A stack chunk per CPU for the walk (4 KiB each), a call's and a sample's. Where stacks are
  // not walked in BPF these maps are never used: one entry each (the LRU maps are preallocated).
  bpf_map__set_max_entries(skel_->maps.unwind_chunks, walks ? 2 * std::max(libbpf_num_possible_cpus(), 1) : 1);
  if (!walks) bpf_map__set_max_entries(skel_->maps.native_stacks_sent, 1);
  if (!tables) {
    bpf_map__set_max_entries(skel_->maps.unwind_wanted, 1);
    bpf_map__set_max_entries(skel_->maps.unwind_files_wanted, 1);
  }
  skel_->rodata->wakeup_bytes = cfg.wakeup_bytes;
  skel_->rodata->host_telemetry = cfg.host_telemetry;
  // Off: not even loaded (nothing runs at each context switch).
  for (bpf_program* p : host_programs()) bpf_program__set_autoload(p, cfg.host_telemetry);
  for (bpf_program* p : host_alloc_programs()) bpf_program__set_autoload(p, cfg.host_alloc_min_bytes > 0);
  for (bpf_program* p : {skel_->progs.host_heap_alloc, skel_->progs.host_heap_free})
    bpf_program__set_autoload(p, cfg.host_alloc_min_bytes > 0);
  skel_->rodata->host_alloc_min_bytes = cfg.host_alloc_min_bytes;
  skel_->rodata->self_tgid = static_cast<uint32_t>(getpid());
  bpf_map__set_max_entries(skel_->maps.events, round_up_pow2(cfg.ringbuf_bytes));
  stack_map_entries_ = std::max<uint32_t>(cfg.stack_map_entries, 1);
  stack_generations_ = cfg.stack_generations;
  bpf_map__set_max_entries(skel_->maps.stacks, stack_map_entries_);
  bpf_map__set_max_entries(skel_->maps.stacks_alt, stack_generations_ ? stack_map_entries_ : 1);
  if (multi)
    for (bpf_program* p : {skel_->progs.call_entry_emit, skel_->progs.call_entry, skel_->progs.call_return,
                           skel_->progs.calibration_hit})
      bpf_program__set_expected_attach_type(p, static_cast<bpf_attach_type>(kAttachUprobeMulti));

  if (int err = gpuscope_bpf__load(skel_.get())) {
    skel_.reset();
    throw Error("cannot load the BPF programs ({}); run as root, on a kernel with BTF and uprobes (5.15+)",
                strerror(-err));
  }
  multi_ = multi;
  floor_probes_ = cfg.floor_probes;
  if (unwind_rows_) munmap(unwind_rows_, size_t(unwind_rows_cap_) * sizeof(gs_unwind_row));
  unwind_rows_ = nullptr;
  unwind_rows_cap_ = 0;
  if (tables) {
    const uint32_t n = bpf_map__max_entries(skel_->maps.unwind_rows);
    const size_t bytes = size_t(n) * sizeof(gs_unwind_row);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, bpf_map__fd(skel_->maps.unwind_rows), 0);
    if (p == MAP_FAILED) throw Error("cannot map the unwind table array ({} MiB): {}", bytes >> 20, strerror(errno));
    unwind_rows_ = static_cast<gs_unwind_row*>(p);
    unwind_rows_cap_ = n;
  }
}

BpfSession::BpfSession(const SessionConfig& cfg)
    : runtime_launch_probes_(cfg.runtime_launch_probes),
      high_rate_per_process_(cfg.high_rate_per_process),
      launch_probes_(cfg.launch_probes),
      runtime_launches_per_process_(cfg.runtime_launches_per_process) {
  libbpf_set_print(libbpf_print);
  // Kernels before 6.6 refuse uprobe-multi programs: fall back to one perf link per probe.
  libbpf_set_print(nullptr);
  // A first try with host telemetry is quiet: where its programs are refused, the load without
  // them says what else is wrong.
  auto load = [&](const SessionConfig& c) {
    try {
      open_and_load(c, true);
    } catch (const Error&) {
      if (!c.host_telemetry) libbpf_set_print(libbpf_print);
      open_and_load(c, false);
    }
  };
  SessionConfig effective = cfg;
  try {
    load(effective);
  } catch (const Error&) {
    if (!cfg.host_telemetry) throw;
    // A kernel without BTF tracepoints (or task storage) refuses the host telemetry part: go on without.
    effective.host_telemetry = false;
    libbpf_set_print(nullptr);
    load(effective);
    log_warn("host telemetry is off: this kernel refused its programs (tp_btf and task storage need Linux 5.11+ "
             "with BTF); `diagnose` will have only the CUDA calls to go on");
  }
  libbpf_set_print(libbpf_print);
  loaded_ns_ = monotonic_ns();
  if (cfg.program_stats) {
    stats_fd_ = bpf_enable_stats(BPF_STATS_RUN_TIME);
    if (stats_fd_ < 0 && !cfg.program_stats_optional)
      throw Error("cannot enable BPF program statistics: {}", strerror(errno));
  }

  for (bpf_program* prog : {skel_->progs.on_fork, skel_->progs.on_exit, skel_->progs.on_exec,
                            skel_->progs.on_openat_enter, skel_->progs.on_openat_exit, skel_->progs.on_close}) {
    bpf_link* link = bpf_program__attach(prog);
    if (!link)
      throw Error("cannot attach tracepoint program '{}' ({}); is tracefs available?", bpf_program__name(prog),
                  strerror(errno));
    (prog == skel_->progs.on_close ? close_link_ : links_.emplace_back()).reset(link);
  }
  if (effective.host_telemetry) {
    host_telemetry_ = true;
    const size_t first = links_.size();
    for (bpf_program* prog : host_programs()) {
      bpf_link* link = bpf_program__attach(prog);
      if (!link) {
        log_warn("host telemetry is off: its program '{}' could not be attached ({})", bpf_program__name(prog),
                 strerror(errno));
        links_.resize(first);
        host_telemetry_ = false;
        break;
      }
      links_.emplace_back().reset(link);
    }
  }

  if (cfg.host_alloc_min_bytes > 0) {
    const size_t first = links_.size();
    for (bpf_program* prog : host_alloc_programs()) {
      bpf_link* link = bpf_program__attach(prog);
      if (!link) {
        log_warn("host allocations are not recorded: '{}' could not be attached ({}); `advise` names copy sites only",
                 bpf_program__name(prog), strerror(errno));
        links_.resize(first);
        break;
      }
      links_.emplace_back().reset(link);
    }
  }

  ring_.reset(ring_buffer__new(bpf_map__fd(skel_->maps.events), &BpfSession::on_record, this, nullptr));
  if (!ring_) throw Error("cannot set up the ring buffer: {}", strerror(errno));
  // Last: nothing may throw once the thread runs.
  if (skel_->rodata->call_tables_later) walker_loader_ = std::thread([this, multi = multi_] { load_walker(multi); });
}

bpf_program* BpfSession::emit_program() const {
  return floor_probes_ ? skel_->progs.calibration_hit : skel_->progs.call_entry_emit;
}
bpf_program* BpfSession::entry_program() const {
  return floor_probes_ ? skel_->progs.calibration_hit : skel_->progs.call_entry;
}
bpf_program* BpfSession::return_program() const {
  return floor_probes_ ? skel_->progs.calibration_hit : skel_->progs.call_return;
}

int attach_uprobe_multi(int prog_fd, const std::string& path, const std::vector<uint64_t>& offsets,
                        const std::vector<uint64_t>& cookies, bool retprobe, pid_t pid) {
  // libbpf 1.1 predates uprobe-multi links: build the BPF_LINK_CREATE attribute by hand
  // (layout of union bpf_attr's link_create.uprobe_multi, include/uapi/linux/bpf.h).
  struct {
    uint32_t prog_fd, target_fd, attach_type, flags;
    uint64_t path, offsets, ref_ctr_offsets, cookies;
    uint32_t cnt, multi_flags, pid;
    uint8_t pad[64];
  } attr{};
  attr.prog_fd = static_cast<uint32_t>(prog_fd);
  attr.attach_type = kAttachUprobeMulti;
  attr.path = reinterpret_cast<uint64_t>(path.c_str());
  attr.offsets = reinterpret_cast<uint64_t>(offsets.data());
  attr.cookies = reinterpret_cast<uint64_t>(cookies.data());
  attr.cnt = static_cast<uint32_t>(offsets.size());
  attr.multi_flags = retprobe ? 1 /* BPF_F_UPROBE_MULTI_RETURN */ : 0;
  attr.pid = static_cast<uint32_t>(pid);
  return static_cast<int>(syscall(__NR_bpf, BPF_LINK_CREATE, &attr, sizeof(attr)));
}

int BpfSession::attach_multi(bpf_program* prog, const std::string& path, const ProbeSet& set, bool retprobe, pid_t pid) {
  if (set.offsets.empty()) return -1;
  // With a pid the kernel plants the breakpoints in that process alone: others pay no trap.
  const int fd = attach_uprobe_multi(bpf_program__fd(prog), path, set.offsets, set.cookies, retprobe, pid);
  if (fd < 0) throw Error("uprobe-multi link on {}: {}", path, strerror(errno));
  return fd;
}

namespace {

// The call programs the walker's load replaces, by their index in upgrade_calls (bpf/common.bpf.h:
// UPGRADE_EMIT, UPGRADE_ENTRY).
bpf_program* upgraded_program(gpuscope_bpf& s, uint32_t k) {
  return k == 0 ? s.progs.call_entry_emit : s.progs.call_entry;
}

}  // namespace

// A second load of the programs with the eh-frame walker on, of program k alone (the verifier
// takes ~0.2 s over each: the two are loaded side by side). Every map but the settings is the
// first load's (libbpf leaves a reused map's contents alone). Null with *failed and *err set if
// it fails.
std::unique_ptr<gpuscope_bpf, BpfSession::SkelDeleter> BpfSession::load_walker_program(uint32_t k, bool multi,
                                                                                      const char** failed, int* err) {
  const gpuscope_bpf& first = *skel_;
  std::unique_ptr<gpuscope_bpf, SkelDeleter> w(gpuscope_bpf__open());
  if (!w) {
    *failed = "open";
    *err = errno;
    return nullptr;
  }
  *w->rodata = *first.rodata;
  w->rodata->call_tables_later = false;
  w->rodata->call_unwind_tables = true;
  bpf_map* m;
  bpf_object__for_each_map(m, w->obj) {
    if (std::string_view(bpf_map__name(m)).ends_with(".rodata")) continue;
    const bpf_map* mine = bpf_object__find_map_by_name(first.obj, bpf_map__name(m));
    if (!mine || (*err = -bpf_map__reuse_fd(m, bpf_map__fd(mine))) != 0) {
      *failed = "share the maps with";
      return nullptr;
    }
  }
  bpf_program* p;
  bpf_object__for_each_program(p, w->obj) bpf_program__set_autoload(p, p == upgraded_program(*w, k));
  if (multi) bpf_program__set_expected_attach_type(upgraded_program(*w, k), static_cast<bpf_attach_type>(kAttachUprobeMulti));
  if ((*err = -gpuscope_bpf__load(w.get())) != 0) {
    *failed = "load";
    return nullptr;
  }
  return w;
}

void BpfSession::load_walker(bool multi) {
  const char* failed[2] = {};
  int err[2] = {};
  std::thread second([&] { walkers_[1] = load_walker_program(1, multi, &failed[1], &err[1]); });
  walkers_[0] = load_walker_program(0, multi, &failed[0], &err[0]);
  second.join();
  for (uint32_t k = 0; k < 2; ++k) {
    if (failed[k]) continue;
    const int fd = bpf_program__fd(upgraded_program(*walkers_[k], k));
    if (bpf_map__update_elem(skel_->maps.upgrade_calls, &k, sizeof(k), &fd, sizeof(fd), BPF_ANY) != 0) {
      failed[k] = "install";
      err[k] = errno;
    }
  }
  if (failed[0] || failed[1]) {
    // Both or neither: a walker missing for one kind of call would leave its copies unbounded.
    for (uint32_t k = 0; k < 2; ++k) bpf_map__delete_elem(skel_->maps.upgrade_calls, &k, sizeof(k), 0);
    skel_->bss->walker_failed = true;
    walker_delay_ns_ = -1;
    const int k = failed[0] ? 0 : 1;
    log_warn("cannot {} the eh-frame stack walker ({}): stacks are walked along frame pointers instead", failed[k],
             strerror(err[k]));
    return;
  }
  walker_delay_ns_ = std::max<int64_t>(int64_t(monotonic_ns() - loaded_ns_), 1);
  log_debug("eh-frame stack walker in place {:.0f} ms after the first programs", walker_delay_ns_ / 1e6);
}

void BpfSession::wait_for_walker(uint64_t timeout_ns) const {
  if (!walker_loader_.joinable()) return;
  const uint64_t until = monotonic_ns() + timeout_ns;
  while (!walker_delay_ns_.load() && monotonic_ns() < until) std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

BpfSession::~BpfSession() {
  if (walker_loader_.joinable()) walker_loader_.join();
  close_link_.reset();
  if (unwind_rows_) munmap(unwind_rows_, size_t(unwind_rows_cap_) * sizeof(gs_unwind_row));
  for (auto& [pid, links] : high_rate_links_) retire(pid, std::move(links));
  high_rate_links_.clear();
  for (int fd : multi_links_) close(fd);
  for (int fd : runtime_launch_multi_links_) close(fd);
  runtime_launch_links_.clear();
  closer_.drain();
  std::vector<int> function_fds;  // closed with links_ below: a link apiece, each waits
  for (auto& [id, fds] : runtime_function_multi_links_) function_fds.insert(function_fds.end(), fds.begin(), fds.end());
  for (auto& [id, links] : runtime_function_links_)
    for (auto& l : links) links_.push_back(std::move(l));
  runtime_function_links_.clear();
  if (stats_fd_ >= 0) close(stats_fd_);
  // Probes go before the maps they write to. Each uprobe's removal waits for an RCU grace
  // period (~100 ms in a VM); removing them from many threads lets those waits overlap, so
  // detaching a hundred probes takes a fraction of a second, not ten.
  constexpr size_t kDetachThreads = 32;
  std::vector<std::thread> pool;
  // Runs remove(0..n-1) over up to kDetachThreads threads of the pool.
  auto spread = [&pool](size_t n, const auto& remove) {
    const size_t per_thread = (n + kDetachThreads - 1) / kDetachThreads;
    for (size_t start = 0; start < n; start += per_thread)
      pool.emplace_back([&remove, start, end = std::min(n, start + per_thread)] {
        for (size_t i = start; i < end; ++i) remove(i);
      });
  };
  const auto reset_link = [this](size_t i) { links_[i].reset(); };
  const auto close_fd = [&function_fds](size_t i) { close(function_fds[i]); };
  spread(links_.size(), reset_link);
  spread(function_fds.size(), close_fd);
  for (auto& t : pool) t.join();
  links_.clear();
}

int BpfSession::on_record(void* ctx, void* data, size_t size) {
  auto* self = static_cast<BpfSession*>(ctx);
  if (self->handler_) self->handler_(data, size);
  return 0;
}

int BpfSession::poll(int timeout_ms) {
  // Calls are submitted without waking us (a wake-up costs more than the probe), except the one
  // that passes the wake-up threshold; otherwise the timeout is when we collect them.
  int n = ring_buffer__poll(ring_.get(), timeout_ms);
  if (n < 0 && n != -EINTR) return n;
  // The next record past the wake-up threshold may wake us again (submit_flags in the BPF code);
  // cleared before the ring is drained, so that data passing it meanwhile is not left waiting.
  __atomic_store_n(&skel_->bss->wakeup_sent, 0, __ATOMIC_SEQ_CST);
  int m = ring_buffer__consume(ring_.get());
  return m < 0 ? m : std::max(n, 0) + m;
}

void BpfSession::add_target(pid_t pid) {
  uint32_t key = static_cast<uint32_t>(pid);
  uint8_t one = 1;
  bpf_map__update_elem(skel_->maps.targets, &key, sizeof(key), &one, sizeof(one), BPF_ANY);
  // After the hash: a slot may only name a target. It takes the slot from any other target
  // there, which is then found in the hash.
  __atomic_store_n(&skel_->bss->target_slots[key & (GS_TARGET_SLOTS - 1)], key, __ATOMIC_SEQ_CST);
  set_host_pid(pid, true);
}

void BpfSession::add_host_process(pid_t pid) { set_host_pid(pid, true); }

void BpfSession::set_host_pid(pid_t pid, bool on) {
  const uint32_t p = static_cast<uint32_t>(pid);
  if (!host_telemetry_ || p >= GS_HOST_PIDS) return;
  auto* word = const_cast<uint64_t*>(reinterpret_cast<volatile uint64_t*>(&skel_->bss->host_pids[p / 64]));
  if (on)
    __atomic_fetch_or(word, uint64_t(1) << (p % 64), __ATOMIC_SEQ_CST);
  else
    __atomic_fetch_and(word, ~(uint64_t(1) << (p % 64)), __ATOMIC_SEQ_CST);
}

std::vector<bpf_program*> BpfSession::host_programs() const {
  return {skel_->progs.host_switch,         skel_->progs.host_waking,        skel_->progs.host_fault,
          skel_->progs.host_fork,           skel_->progs.host_exit,          skel_->progs.host_reclaim_begin,
          skel_->progs.host_reclaim_end,    skel_->progs.host_memcg_reclaim_begin,
          skel_->progs.host_memcg_reclaim_end, skel_->progs.host_softirq_entry, skel_->progs.host_softirq_exit};
}

std::vector<bpf_program*> BpfSession::host_alloc_programs() const {
  return {skel_->progs.host_mmap_enter, skel_->progs.host_mmap_exit, skel_->progs.host_mremap_enter,
          skel_->progs.host_mremap_exit, skel_->progs.host_munmap_enter};
}

void BpfSession::remove_target(pid_t pid) {
  uint32_t key = static_cast<uint32_t>(pid);
  uint32_t expected = key;
  set_host_pid(pid, false);
  __atomic_compare_exchange_n(&skel_->bss->target_slots[key & (GS_TARGET_SLOTS - 1)], &expected, 0u, false,
                              __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  bpf_map__delete_elem(skel_->maps.targets, &key, sizeof(key), 0);
}

bool BpfSession::set_python_process(pid_t pid, const gs_py_process& proc) {
  uint32_t key = static_cast<uint32_t>(pid);
  return bpf_map__update_elem(skel_->maps.python_procs, &key, sizeof(key), &proc, sizeof(proc), BPF_ANY) == 0;
}

bool BpfSession::set_unwind_process(pid_t pid, const gs_unwind_proc& proc) {
  uint32_t key = static_cast<uint32_t>(pid);
  return bpf_map__update_elem(skel_->maps.unwind_procs, &key, sizeof(key), &proc, sizeof(proc), BPF_ANY) == 0;
}

void BpfSession::remove_unwind_process(pid_t pid) {
  uint32_t key = static_cast<uint32_t>(pid);
  bpf_map__delete_elem(skel_->maps.unwind_procs, &key, sizeof(key), 0);
}

std::vector<pid_t> BpfSession::unwind_wanted() const {
  std::vector<pid_t> out;
  if (!unwind_rows_) return out;
  uint32_t key = 0;
  for (const uint32_t* prev = nullptr;
       bpf_map__get_next_key(skel_->maps.unwind_wanted, prev, &key, sizeof(key)) == 0 && out.size() < 4096;) {
    out.push_back(static_cast<pid_t>(key));
    prev = reinterpret_cast<const uint32_t*>(&out.back());
  }
  return out;
}

void BpfSession::clear_unwind_wanted(pid_t pid) {
  uint32_t key = static_cast<uint32_t>(pid);
  bpf_map__delete_elem(skel_->maps.unwind_wanted, &key, sizeof(key), 0);
}

std::vector<gs_unwind_file_want> BpfSession::unwind_files_wanted() const {
  std::vector<gs_unwind_file_want> out;
  if (!unwind_rows_) return out;
  gs_unwind_file_want key{};
  for (const gs_unwind_file_want* prev = nullptr;
       bpf_map__get_next_key(skel_->maps.unwind_files_wanted, prev, &key, sizeof(key)) == 0 && out.size() < 4096;) {
    out.push_back(key);
    prev = &out.back();
  }
  return out;
}

void BpfSession::clear_unwind_file_wanted(const gs_unwind_file_want& want) {
  bpf_map__delete_elem(skel_->maps.unwind_files_wanted, &want, sizeof(want), 0);
}

void BpfSession::forget_native_stacks(const std::vector<uint64_t>& ids) {
  for (uint64_t id : ids) bpf_map__delete_elem(skel_->maps.native_stacks_sent, &id, sizeof(id), 0);
}

void BpfSession::forget_python_stacks() {
  // Keys are read ahead of the deletes: deleting the key in hand would restart the walk.
  const int fd = bpf_map__fd(skel_->maps.py_stacks_sent);
  std::vector<uint64_t> keys;
  uint64_t key = 0, next = 0;
  const uint64_t* prev = nullptr;
  while (bpf_map_get_next_key(fd, prev, &next) == 0) {
    keys.push_back(next);
    key = next;
    prev = &key;
  }
  for (uint64_t k : keys) bpf_map_delete_elem(fd, &k);
}

void BpfSession::start_cpu_sampling(int hz) {
  const int ncpu = libbpf_num_possible_cpus();
  int opened = 0;
  for (int cpu = 0; cpu < ncpu; ++cpu) {
    perf_event_attr attr{};
    attr.size = sizeof(attr);
    attr.type = PERF_TYPE_SOFTWARE;
    attr.config = PERF_COUNT_SW_CPU_CLOCK;
    attr.freq = 1;
    attr.sample_freq = static_cast<uint64_t>(hz);
    const int fd = static_cast<int>(syscall(__NR_perf_event_open, &attr, -1, cpu, -1, PERF_FLAG_FD_CLOEXEC));
    if (fd < 0) {
      if (errno == ENODEV || errno == ENOENT) continue;  // a possible CPU that is not online
      throw Error("cannot open a cpu-clock perf event on CPU {}: {} (is kernel.perf_event_paranoid too high?)", cpu,
                  strerror(errno));
    }
    // The link owns the event's descriptor from here: destroying it closes it.
    bpf_link* link = bpf_program__attach_perf_event(skel_->progs.on_cpu_sample, fd);
    if (!link) {
      const int err = errno;
      close(fd);
      throw Error("cannot attach the CPU sampler on CPU {}: {}", cpu, strerror(err));
    }
    links_.emplace_back(link);
    ++opened;
  }
  if (opened == 0) throw Error("no CPU could be sampled");
}

void BpfSession::stop_stopping_processes() { close_link_.reset(); }

void BpfSession::mark_checked(uint64_t dev, uint64_t ino) {
  gs_file_key key{dev, ino};
  uint8_t one = 1;
  bpf_map__update_elem(skel_->maps.checked_files, &key, sizeof(key), &one, sizeof(one), BPF_ANY);
}

void BpfSession::attach_probe(const std::string& path, uint64_t offset, uint64_t cookie, bool entry_only,
                              bool with_return, std::vector<std::unique_ptr<bpf_link, LinkDeleter>>& into, pid_t pid) {
  LIBBPF_OPTS(bpf_uprobe_opts, opts, .bpf_cookie = cookie);
  bpf_program* entry = entry_only ? emit_program() : entry_program();
  bpf_link* link = bpf_program__attach_uprobe_opts(entry, pid, path.c_str(), offset, &opts);
  if (!link) throw Error("uprobe at {}+{:#x}: {}", path, offset, strerror(errno));
  into.emplace_back(link);
  if (!with_return) return;
  LIBBPF_OPTS(bpf_uprobe_opts, ropts, .bpf_cookie = cookie, .retprobe = true);
  link = bpf_program__attach_uprobe_opts(return_program(), pid, path.c_str(), offset, &ropts);
  if (!link) throw Error("uretprobe at {}+{:#x}: {}", path, offset, strerror(errno));
  into.emplace_back(link);
}

void BpfSession::attach_entry_probe(const std::string& path, uint64_t offset, uint16_t func) {
  if (!multi_) {
    attach_probe(path, offset, func, true, false, links_);
    return;
  }
  // The programs were loaded for multi-uprobe links, which they then need.
  ProbeSet one;
  one.offsets.push_back(offset);
  one.cookies.push_back(func);
  multi_links_.push_back(attach_multi(emit_program(), path, one, false));
}

void BpfSession::attach_program(const char* program, const std::string& path, uint64_t offset, uint64_t cookie,
                                bool retprobe) {
  bpf_program* prog = bpf_object__find_program_by_name(skel_->obj, program);
  if (!prog) throw Error("no BPF program {}", program);
  LIBBPF_OPTS(bpf_uprobe_opts, opts, .bpf_cookie = cookie, .retprobe = retprobe);
  bpf_link* link = bpf_program__attach_uprobe_opts(prog, -1, path.c_str(), offset, &opts);
  if (!link) throw Error("{} at {}+{:#x}: {}", retprobe ? "uretprobe" : "uprobe", path, offset, strerror(errno));
  links_.emplace_back(link);
}

void BpfSession::attach_heap_hooks(const std::string& path) {
  if (skel_->rodata->host_alloc_min_bytes == 0) return;
  for (auto [prog, symbol] : {std::pair{skel_->progs.host_heap_alloc, "gpuscope_heap_alloc"},
                              std::pair{skel_->progs.host_heap_free, "gpuscope_heap_free"}}) {
    LIBBPF_OPTS(bpf_uprobe_opts, opts, .func_name = symbol);
    bpf_link* link = bpf_program__attach_uprobe_opts(prog, -1, path.c_str(), 0, &opts);
    if (!link) throw Error("uprobe at {} in {}: {}", symbol, path, strerror(errno));
    links_.emplace_back(link);
  }
}

int BpfSession::map_fd(const char* name) const {
  bpf_map* m = bpf_object__find_map_by_name(skel_->obj, name);
  return m ? bpf_map__fd(m) : -1;
}

AttachResult BpfSession::attach_file(const std::string& path) {
  AttachResult result;
  struct stat st{};
  if (stat(path.c_str(), &st) != 0) {
    result.error = fmt::format("cannot stat {}: {}", path, strerror(errno));
    return result;
  }
  auto [file, added] = attached_files_.try_emplace({st.st_dev, st.st_ino}, 0);
  if (!added) {
    result.already_attached = true;
    result.driver_probed_ns = file->second;
    return result;
  }
  try {
    auto elf = elf::ElfFile::open(path);
    result.build_id = elf->build_id();
    std::vector<std::string> names;
    for (const auto& f : cuda::all_functions()) names.emplace_back(f.symbol);
    auto offsets = elf->function_offsets(names);
    ProbeSet emit, entry, rt_launch;  // entry-only probes, entries of calls with a return probe
    std::map<uint16_t, ProbeSet> by_driver;  // runtime functions the driver may record instead
    HighRateSet high_rate;
    // Two probed names at one address (an alias) would record each call twice: the first name
    // in the table's order is probed.
    std::unordered_set<uint64_t> probed_offsets;
    for (const auto& f : cuda::all_functions()) {
      auto it = offsets.find(std::string(f.symbol));
      if (it == offsets.end() || !probed_offsets.insert(it->second).second) continue;
      const bool is_rt_launch = f.api == cuda::Api::Runtime && f.kind == cuda::CallKind::Launch;
      if (is_rt_launch && !runtime_launch_probes_) continue;
      if (detached_runtime_functions_.contains(f.id)) continue;
      // The hooks record cuKernelGetFunction too: its probe reads what it wrote at the thread's
      // next launch, which no longer traps.
      // (The runtime's launch probes are attached as with probes, until the driver is probed, when
      // gpuscope started the processes; else per process, with the driver's.)
      const bool per_process_launch = !launch_probes_ && f.sig != cuda::Signature::InProcessLaunch &&
                                      (!is_rt_launch || runtime_launches_per_process_) &&
                                      (f.kind == cuda::CallKind::Launch || f.kind == cuda::CallKind::GraphLaunch ||
                                       f.sig == cuda::Signature::KernelGetFunction);
      if ((high_rate_per_process_ && cuda::is_high_rate(f)) || per_process_launch) {
        ProbeSet& set = f.has_return ? high_rate.entry : high_rate.emit;
        set.offsets.push_back(it->second);
        set.cookies.push_back(cuda::probe_cookie(f));
      } else if (multi_) {
        ProbeSet& set = is_rt_launch                          ? rt_launch
                        : cuda::may_be_recorded_by_driver(f) ? by_driver[f.id]
                        : f.has_return                         ? entry
                                                               : emit;
        set.offsets.push_back(it->second);
        set.cookies.push_back(cuda::probe_cookie(f));
      } else {
        attach_probe(path, it->second, cuda::probe_cookie(f), !f.has_return, f.has_return,
                     is_rt_launch                           ? runtime_launch_links_
                     : cuda::may_be_recorded_by_driver(f) ? runtime_function_links_[f.id]
                                                            : links_);
      }
      (f.api == cuda::Api::Runtime  ? result.runtime_probes
       : f.api == cuda::Api::Driver ? result.driver_probes
                                    : result.nccl_probes)++;
    }
    if (multi_) {
      for (int fd : {attach_multi(emit_program(), path, emit, false),
                     attach_multi(entry_program(), path, entry, false),
                     attach_multi(return_program(), path, entry, true)})
        if (fd >= 0) multi_links_.push_back(fd);
      if (int fd = attach_multi(emit_program(), path, rt_launch, false); fd >= 0)
        runtime_launch_multi_links_.push_back(fd);
      for (const auto& [id, set] : by_driver)
        for (int fd : {attach_multi(entry_program(), path, set, false), attach_multi(return_program(), path, set, true)})
          if (fd >= 0) runtime_function_multi_links_[id].push_back(fd);
    }
    if (!high_rate.emit.offsets.empty() || !high_rate.entry.offsets.empty()) {
      const int fd = open(path.c_str(), O_PATH | O_CLOEXEC);
      if (fd < 0) throw Error("cannot hold {} open: {}", path, strerror(errno));
      high_rate.fd = std::shared_ptr<int>(new int(fd), [](int* p) {
        close(*p);
        delete p;
      });
      high_rate.path = "/proc/self/fd/" + std::to_string(fd);
      high_rate_sets_.push_back(std::move(high_rate));
      for (auto& [pid, links] : high_rate_links_) attach_high_rate(pid, high_rate_sets_.back(), links);
    }
  } catch (const std::exception& e) {
    result.error = e.what();
  }
  if (result.error.empty() && result.driver_probes > 0) file->second = result.driver_probed_ns = monotonic_ns();
  return result;
}

void BpfSession::attach_high_rate(pid_t pid, const HighRateSet& set, ProcessLinks& into,
                                  const std::set<uint16_t>* only) {
  // Each probe written into a process or taken out of it costs the agent a TLB flush across the
  // host's CPUs per mapping (uprobe_write_opcode): attaching and removing a file's ~60 high-rate
  // probes every cycle was the largest part of the agent's CPU beside a training job (dev VM,
  // perf). A program calls a handful of them.
  auto pick = [only](const ProbeSet& all) {
    if (!only) return all;
    ProbeSet some;
    for (size_t i = 0; i < all.offsets.size(); ++i)
      if (only->contains(uint16_t(GS_COOKIE_FUNC(all.cookies[i])))) {
        some.offsets.push_back(all.offsets[i]);
        some.cookies.push_back(all.cookies[i]);
      }
    return some;
  };
  const ProbeSet emit = pick(set.emit), entry = pick(set.entry);
  if (multi_) {
    for (int fd : {attach_multi(emit_program(), set.path, emit, false, pid),
                   attach_multi(entry_program(), set.path, entry, false, pid),
                   attach_multi(return_program(), set.path, entry, true, pid)})
      if (fd >= 0) into.fds.push_back(fd);
    return;
  }
  for (size_t i = 0; i < emit.offsets.size(); ++i)
    attach_probe(set.path, emit.offsets[i], emit.cookies[i], true, false, into.links, pid);
  for (size_t i = 0; i < entry.offsets.size(); ++i)
    attach_probe(set.path, entry.offsets[i], entry.cookies[i], false, true, into.links, pid);
}

void BpfSession::retire(pid_t pid, ProcessLinks&& links) {
  closer_.close(pid, [links = std::make_shared<ProcessLinks>(std::move(links))] {
    for (int fd : links->fds) close(fd);
    links->links.clear();
  });
}

int BpfSession::set_high_rate_probes(pid_t pid, bool on, const std::set<uint16_t>* only) {
  auto it = high_rate_links_.find(pid);
  if (!on) {
    if (it == high_rate_links_.end()) return 0;
    const int n = static_cast<int>(it->second.fds.size() + it->second.links.size());
    retire(pid, std::move(it->second));
    high_rate_links_.erase(it);
    return n;
  }
  if (it != high_rate_links_.end()) return 0;
  // Its links of an earlier on-period, if still closing, would see each call a second time.
  closer_.wait_for(pid);
  ProcessLinks links;
  try {
    for (const auto& set : high_rate_sets_) attach_high_rate(pid, set, links, only);
  } catch (...) {
    for (int fd : links.fds) close(fd);
    throw;
  }
  const int n = static_cast<int>(links.fds.size() + links.links.size());
  high_rate_links_.emplace(pid, std::move(links));
  return n;
}

BpfSession::HitCost BpfSession::measure_hit_cost(int (*target)(int), int calls) {
  // The function's file offset, from the mapping that holds it.
  const auto addr = reinterpret_cast<uint64_t>(target);
  std::string path;
  uint64_t offset = 0;
  for (const auto& m : discover::read_maps(getpid()))
    if (addr >= m.start && addr < m.end && !m.path.empty()) {
      path = discover::path_in_target(getpid(), m.path);
      offset = addr - m.start + m.offset;
    }
  if (path.empty()) throw Error("cannot find the calibration function in this process's mappings");
  auto time_calls = [&] {
    // The best of a few rounds: the machine's noise only ever adds.
    double best = 1e300;
    for (int round = 0; round < 5; ++round) {
      const uint64_t t0 = monotonic_ns();
      int acc = 0;
      for (int i = 0; i < calls; ++i) acc += target(i);
      const uint64_t t1 = monotonic_ns();
      if (acc == 42) fprintf(stderr, " ");  // keeps the calls
      best = std::min(best, double(t1 - t0) / calls);
    }
    return best;
  };
  const double base = time_calls();
  HitCost cost;
  for (bool ret : {false, true}) {
    // An uprobe-multi link where the kernel has them, like every other probe: a perf-event
    // uprobe would need CAP_SYS_ADMIN on kernels with the fix for CVE-2025-38466.
    if (multi_) {
      const int fd = attach_multi(skel_->progs.calibration_hit, path, ProbeSet{{offset}, {0}}, ret, getpid());
      (ret ? cost.return_ns : cost.entry_ns) = std::max(0.0, time_calls() - base);
      close(fd);
      continue;
    }
    LIBBPF_OPTS(bpf_uprobe_opts, opts, .retprobe = ret);
    std::unique_ptr<bpf_link, LinkDeleter> link(
        bpf_program__attach_uprobe_opts(skel_->progs.calibration_hit, getpid(), path.c_str(), offset, &opts));
    if (!link) throw Error("cannot attach the calibration probe: {}", strerror(errno));
    (ret ? cost.return_ns : cost.entry_ns) = std::max(0.0, time_calls() - base);
  }
  return cost;
}

std::vector<BpfSession::ProgramStats> BpfSession::program_stats() const {
  std::vector<ProgramStats> out;
  bpf_program* prog = nullptr;
  bpf_object__for_each_program(prog, skel_->obj) {
    bpf_prog_info info{};
    uint32_t len = sizeof(info);
    if (bpf_obj_get_info_by_fd(bpf_program__fd(prog), &info, &len) != 0) continue;
    out.push_back({bpf_program__name(prog), info.run_cnt, info.run_time_ns});
  }
  return out;
}

int BpfSession::detach_runtime_launch_probes() {
  runtime_launch_probes_ = false;
  const int n = static_cast<int>(runtime_launch_multi_links_.size() + runtime_launch_links_.size());
  for (int fd : runtime_launch_multi_links_) close(fd);
  runtime_launch_multi_links_.clear();
  runtime_launch_links_.clear();
  return n;
}

int BpfSession::detach_runtime_functions(const std::vector<uint16_t>& funcs) {
  std::vector<int> fds;
  auto links = std::make_shared<std::vector<std::unique_ptr<bpf_link, LinkDeleter>>>();
  for (uint16_t id : funcs) {
    detached_runtime_functions_.insert(id);
    if (id < 256) skel_->bss->retiring_funcs[id >> 6] |= 1ull << (id & 63);
    if (auto it = runtime_function_multi_links_.find(id); it != runtime_function_multi_links_.end()) {
      fds.insert(fds.end(), it->second.begin(), it->second.end());
      runtime_function_multi_links_.erase(it);
    }
    if (auto it = runtime_function_links_.find(id); it != runtime_function_links_.end()) {
      for (auto& l : it->second) links->push_back(std::move(l));
      runtime_function_links_.erase(it);
    }
  }
  const int n = static_cast<int>(fds.size() + links->size());
  if (n) closer_.close(0, [fds = std::move(fds), links] {
      for (int fd : fds) close(fd);
      links->clear();
    });
  return n;
}

std::vector<uint64_t> BpfSession::stack(int32_t id) const {
  if (id < 0) return {};
  const bpf_map* map = (id & GS_STACK_GEN_BIT) ? skel_->maps.stacks_alt : skel_->maps.stacks;
  const uint32_t key = uint32_t(id) & GS_STACK_ID_MASK;
  std::vector<uint64_t> ips(GS_MAX_STACK_DEPTH);
  if (bpf_map__lookup_elem(map, &key, sizeof(key), ips.data(), ips.size() * sizeof(uint64_t), 0) != 0) return {};
  size_t n = 0;
  while (n < ips.size() && ips[n]) ++n;
  ips.resize(n);
  return ips;
}

int BpfSession::stack_generation() const { return int(__atomic_load_n(&skel_->bss->stack_gen, __ATOMIC_RELAXED)); }

int BpfSession::flip_stack_generation() {
  if (!stack_generations_) throw Error("internal: stack generations flipped without a second stack map");
  const uint32_t next = uint32_t(stack_generation() ^ 1);
  // The programs read it from the mmapped .bss at their next capture.
  __atomic_store_n(&skel_->bss->stack_gen, next, __ATOMIC_SEQ_CST);
  return int(next);
}

size_t BpfSession::clear_stacks(int generation) {
  if (generation == stack_generation()) throw Error("internal: the stack map in use cannot be emptied");
  const bpf_map* map = generation ? skel_->maps.stacks_alt : skel_->maps.stacks;
  // Every key first: get_next_key from a deleted key starts over at the first bucket. Stack
  // maps have no batch delete (ENOTSUPP, kernel 6.18): one system call per entry.
  std::vector<uint32_t> keys;
  uint32_t key = 0;
  for (const uint32_t* prev = nullptr; bpf_map__get_next_key(map, prev, &key, sizeof(key)) == 0; prev = &keys.back())
    keys.push_back(key);
  for (uint32_t k : keys) bpf_map__delete_elem(map, &k, sizeof(k), 0);
  return keys.size();
}

namespace {
// A per-CPU array's entry, summed over CPUs; 0 if it cannot be read.
uint64_t sum_over_cpus(const bpf_map* map, uint32_t key) {
  const int ncpu = libbpf_num_possible_cpus();
  std::vector<uint64_t> per_cpu(ncpu > 0 ? ncpu : 1);
  if (bpf_map__lookup_elem(map, &key, sizeof(key), per_cpu.data(), per_cpu.size() * sizeof(uint64_t), 0) != 0)
    return 0;
  uint64_t total = 0;
  for (uint64_t v : per_cpu) total += v;
  return total;
}
}  // namespace

LostCounts BpfSession::lost() const {
  LostCounts total{};
  for (uint32_t cause = 0; cause < GS_LOST_NR; ++cause) total[cause] = sum_over_cpus(skel_->maps.lost, cause);
  return total;
}

std::array<uint64_t, GS_UNWIND_STAT_NR> BpfSession::unwind_stats() const {
  std::array<uint64_t, GS_UNWIND_STAT_NR> total{};
  const int ncpu = std::max(libbpf_num_possible_cpus(), 1);
  std::vector<std::array<uint64_t, GS_UNWIND_STAT_NR>> per_cpu(static_cast<size_t>(ncpu));  // one array per CPU
  const uint32_t key = 0;
  if (bpf_map__lookup_elem(skel_->maps.unwind_stats, &key, sizeof(key), per_cpu.data(),
                           per_cpu.size() * sizeof(per_cpu[0]), 0) != 0)
    return total;
  for (const auto& cpu : per_cpu)
    for (size_t stat = 0; stat < total.size(); ++stat) total[stat] += cpu[stat];
  return total;
}

std::vector<BpfSession::StackCost> BpfSession::stack_costs() const {
  std::vector<StackCost> out;
  const int ncpu = std::max(libbpf_num_possible_cpus(), 1);
  std::vector<gs_stack_cost> per_cpu(static_cast<size_t>(ncpu));
  const bpf_map* map = skel_->maps.stack_costs;
  uint32_t key = 0, next = 0;
  const void* prev = nullptr;
  while (bpf_map__get_next_key(map, prev, &next, sizeof(next)) == 0) {
    key = next;
    prev = &key;
    if (bpf_map__lookup_elem(map, &key, sizeof(key), per_cpu.data(), per_cpu.size() * sizeof(per_cpu[0]), 0) != 0)
      continue;  // deleted meanwhile
    StackCost c{static_cast<pid_t>(key)};
    for (const auto& cpu : per_cpu) {
      c.walk_ns += cpu.walk_ns;
      c.walks += cpu.walks;
      if (cpu.first_ns && (!c.first_ns || cpu.first_ns < c.first_ns)) c.first_ns = cpu.first_ns;
    }
    out.push_back(c);
  }
  return out;
}

bool BpfSession::set_stack_rate(pid_t pid, uint32_t every) {
  const uint32_t tgid = static_cast<uint32_t>(pid);
  __u64* slot = const_cast<__u64*>(&skel_->bss->stack_rates[tgid & (GS_STACK_RATE_SLOTS - 1)]);
  const uint64_t held = __atomic_load_n(slot, __ATOMIC_RELAXED);
  if (held && GS_STACK_RATE_TGID(held) != tgid) return false;  // another process's (tgids 4,096 apart)
  __atomic_store_n(slot, every > 1 ? GS_STACK_RATE(tgid, every) : 0, __ATOMIC_RELAXED);
  return true;
}

void BpfSession::forget_stack_budget(pid_t pid) {
  const uint32_t key = static_cast<uint32_t>(pid);
  set_stack_rate(pid, 1);
  bpf_map__delete_elem(skel_->maps.stack_costs, &key, sizeof(key), 0);
}

int BpfSession::stops_made_fd() const { return bpf_map__fd(skel_->maps.stops_made); }

int BpfSession::stops_answered_fd() const { return bpf_map__fd(skel_->maps.stops_answered); }

int BpfSession::stop_guard_fd() const { return bpf_map__fd(skel_->maps.stop_guard); }

uint32_t BpfSession::stopping_program_id() const {
  bpf_prog_info info{};
  uint32_t len = sizeof(info);
  if (bpf_obj_get_info_by_fd(bpf_program__fd(skel_->progs.on_close), &info, &len) != 0)
    throw Error("cannot read the id of the program that stops processes: {}", strerror(errno));
  return info.id;
}

bool BpfSession::stops_guarded() const {
  const uint32_t key = 0;
  uint32_t value = 0;
  return bpf_map_lookup_elem(stop_guard_fd(), &key, &value) == 0 && value;
}

void BpfSession::answer_stop(pid_t pid, const gs_stop_count& stop) {
  const uint32_t key = uint32_t(pid);
  bpf_map_update_elem(stops_answered_fd(), &key, &stop, BPF_ANY);
}

void BpfSession::forget_process(pid_t pid) {
  set_high_rate_probes(pid, false);
  // The BPF side removes both counts at the process's end; an answer written after that (to a
  // stop whose record came late) is removed here.
  const uint32_t key = uint32_t(pid);
  gs_stop_count made{}, answered{};
  if (bpf_map_lookup_elem(stops_answered_fd(), &key, &answered) == 0 &&
      (bpf_map_lookup_elem(stops_made_fd(), &key, &made) != 0 || made.start_ns != answered.start_ns))
    bpf_map_delete_elem(stops_answered_fd(), &key);
}

}  // namespace gpuscope::attach
