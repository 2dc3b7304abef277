#include "attach/bpf_session.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "decode/functions.h"
#include "gpuscope.skel.h"
#include "symbolize/elf_file.h"

namespace gpuscope::attach {

std::string_view lost_cause_name(int cause) {
  switch (cause) {
    case GS_LOST_RINGBUF_FULL: return "ringbuf_full";
    case GS_LOST_PENDING_FULL: return "pending_full";
    case GS_LOST_RETURN_ORPHAN: return "return_orphan";
    case GS_LOST_STACK: return "stack";
    case GS_LOST_DEREF: return "deref";
    case GS_LOST_TARGETS_FULL: return "targets_full";
  }
  return "unknown";
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

BpfSession::BpfSession(const SessionConfig& cfg) {
  libbpf_set_print(libbpf_print);
  skel_.reset(gpuscope_bpf__open());
  if (!skel_) throw Error("cannot open the BPF object: {}", strerror(errno));

  skel_->rodata->filter_targets = cfg.filter_targets;
  skel_->rodata->capture_stacks = cfg.capture_stacks;
  skel_->rodata->wakeup_bytes = cfg.wakeup_bytes;
  skel_->rodata->self_tgid = static_cast<uint32_t>(getpid());
  bpf_map__set_max_entries(skel_->maps.events, round_up_pow2(cfg.ringbuf_bytes));
  bpf_map__set_max_entries(skel_->maps.stacks, cfg.capture_stacks ? cfg.stack_map_entries : 1);

  if (int err = gpuscope_bpf__load(skel_.get()))
    throw Error("cannot load the BPF programs ({}); run as root, on a kernel with BTF and uprobes (5.15+)",
                strerror(-err));

  for (bpf_program* prog : {skel_->progs.on_fork, skel_->progs.on_exit, skel_->progs.on_exec,
                            skel_->progs.on_openat_enter, skel_->progs.on_openat_exit, skel_->progs.on_close}) {
    bpf_link* link = bpf_program__attach(prog);
    if (!link)
      throw Error("cannot attach tracepoint program '{}' ({}); is tracefs available?", bpf_program__name(prog),
                  strerror(errno));
    links_.emplace_back(link);
  }

  ring_.reset(ring_buffer__new(bpf_map__fd(skel_->maps.events), &BpfSession::on_record, this, nullptr));
  if (!ring_) throw Error("cannot set up the ring buffer: {}", strerror(errno));
}

BpfSession::~BpfSession() {
  // Probes go before the maps they write to.
  links_.clear();
}

int BpfSession::on_record(void* ctx, void* data, size_t size) {
  auto* self = static_cast<BpfSession*>(ctx);
  if (self->handler_) self->handler_(data, size);
  return 0;
}

int BpfSession::poll(int timeout_ms) {
  // Calls are submitted without waking us (a wake-up costs more than the probe); the timeout
  // is when we collect them.
  int n = ring_buffer__poll(ring_.get(), timeout_ms);
  if (n < 0 && n != -EINTR) return n;
  int m = ring_buffer__consume(ring_.get());
  return m < 0 ? m : std::max(n, 0) + m;
}

void BpfSession::add_target(pid_t pid) {
  uint32_t key = static_cast<uint32_t>(pid);
  uint8_t one = 1;
  bpf_map__update_elem(skel_->maps.targets, &key, sizeof(key), &one, sizeof(one), BPF_ANY);
}

void BpfSession::attach_probe(const std::string& path, uint64_t offset, uint64_t cookie, bool entry_only,
                              bool with_return) {
  LIBBPF_OPTS(bpf_uprobe_opts, opts, .bpf_cookie = cookie);
  bpf_program* entry = entry_only ? skel_->progs.call_entry_emit : skel_->progs.call_entry;
  bpf_link* link = bpf_program__attach_uprobe_opts(entry, -1, path.c_str(), offset, &opts);
  if (!link) throw Error("uprobe at {}+{:#x}: {}", path, offset, strerror(errno));
  links_.emplace_back(link);
  if (!with_return) return;
  LIBBPF_OPTS(bpf_uprobe_opts, ropts, .bpf_cookie = cookie, .retprobe = true);
  link = bpf_program__attach_uprobe_opts(skel_->progs.call_return, -1, path.c_str(), offset, &ropts);
  if (!link) throw Error("uretprobe at {}+{:#x}: {}", path, offset, strerror(errno));
  links_.emplace_back(link);
}

AttachResult BpfSession::attach_file(const std::string& path) {
  AttachResult result;
  struct stat st{};
  if (stat(path.c_str(), &st) != 0) {
    result.error = fmt::format("cannot stat {}: {}", path, strerror(errno));
    return result;
  }
  if (!attached_files_.insert({st.st_dev, st.st_ino}).second) {
    result.already_attached = true;
    return result;
  }
  try {
    auto elf = symbolize::ElfFile::open(path);
    result.build_id = elf->build_id();
    std::vector<std::string> names;
    for (const auto& f : decode::all_functions()) names.emplace_back(f.symbol);
    auto offsets = elf->function_offsets(names);
    for (const auto& f : decode::all_functions()) {
      auto it = offsets.find(std::string(f.symbol));
      if (it == offsets.end()) continue;
      attach_probe(path, it->second, decode::probe_cookie(f), !f.has_return, f.has_return);
      (f.api == decode::Api::Runtime ? result.runtime_probes : result.driver_probes)++;
    }
  } catch (const std::exception& e) {
    result.error = e.what();
  }
  return result;
}

std::vector<uint64_t> BpfSession::stack(int32_t id) const {
  std::vector<uint64_t> ips(GS_MAX_STACK_DEPTH);
  if (id < 0 || bpf_map__lookup_elem(skel_->maps.stacks, &id, sizeof(id), ips.data(), ips.size() * sizeof(uint64_t),
                                     0) != 0)
    return {};
  size_t n = 0;
  while (n < ips.size() && ips[n]) ++n;
  ips.resize(n);
  return ips;
}

LostCounts BpfSession::lost() const {
  LostCounts total{};
  const int ncpu = libbpf_num_possible_cpus();
  std::vector<uint64_t> per_cpu(ncpu > 0 ? ncpu : 1);
  for (uint32_t cause = 0; cause < GS_LOST_NR; ++cause) {
    if (bpf_map__lookup_elem(skel_->maps.lost, &cause, sizeof(cause), per_cpu.data(),
                             per_cpu.size() * sizeof(uint64_t), 0) != 0)
      continue;
    for (uint64_t v : per_cpu) total[cause] += v;
  }
  return total;
}

}  // namespace gpuscope::attach
