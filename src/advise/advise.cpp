#include "advise/advise.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "report/format.h"
#include "report/sections/record_view.h"

namespace gpuscope::advise {
namespace {

using nlohmann::json;

// One host buffer of one process: its copies from or to the GPU.
struct Buffer {
  double bytes = 0;                 // its size (the largest copy of it)
  int64_t copies = 0, to_device = 0;
  // Its first copy wrote it (from the GPU): its pages were untouched before, and pinning them
  // then (cudaMallocHost, or registering at allocation) makes them: the dearer registration.
  bool written_first = false;
  double copied_bytes = 0;
  double measured_us = 0;           // the calls' own times, where they succeeded
  int64_t measured = 0;             // copies with a time of their own
  double pageable_us = 0, pinned_us = 0;  // the model's, for each copy
  std::map<int64_t, int64_t> stacks;      // stack id -> its copies with it
  std::map<int64_t, int64_t> allocated;   // the stack that mapped the memory it lies in -> its copies
};

struct Site {
  std::string where, allocated_at, copied_at;
  bool data_loader = false, has_python = false;
  int64_t copies = 0, to_device = 0, buffers = 0, measured = 0;
  double bytes = 0, measured_us = 0, pageable_us = 0, pinned_us = 0;
  // Buffers copied often enough that registering each once pays back: their copies' saving and
  // registering's cost.
  int64_t paying_buffers = 0;
  double paying_saving_us = 0, paying_cost_us = 0;
  double largest = 0;
  double largest_cost_us = 0;  // pinning its largest buffer: registering and unregistering it
};

bool in_data_loader(const std::vector<report::StackFrame>& frames) {
  for (const auto& f : frames)
    if (f.python && (f.text.find("torch/utils/data/") != std::string::npos ||
                     f.text.find("_utils/pin_memory") != std::string::npos))
      return true;
  return false;
}

// The large host mappings and heap blocks of each process over time (bpf/host_allocs.bpf.c, and
// the heap hooks of a command gpuscope started: src/inject/heap_hooks.cpp): which one, made by
// which stack, holds an address at an instant. Fed in time order, asked in time order.
class Mappings {
 public:
  struct Event {
    uint64_t ts_ns;
    std::string op;
    uint64_t addr, length, old_addr;
    int64_t stack;
  };
  // The allocation holding an address: the stack that made it (0: none seen) and which one it
  // is (0: none; a block freed and allocated again at the same address is another).
  struct Made {
    int64_t stack = 0;
    uint64_t instance = 0;
  };
  explicit Mappings(std::vector<Event> events) : events_(std::move(events)) {}
  Made made_at(uint64_t ts_ns, uint64_t addr) {
    for (; next_ < events_.size() && events_[next_].ts_ns <= ts_ns; ++next_) apply(events_[next_], next_ + 1);
    return made_now(addr);
  }

 private:
  using Ranges = std::map<uint64_t, std::pair<uint64_t, Made>>;  // start -> (end, made)
  static void unmap(Ranges& r, uint64_t from, uint64_t to) {
    auto it = r.upper_bound(from);
    if (it != r.begin() && std::prev(it)->second.first > from) --it;
    while (it != r.end() && it->first < to) it = r.erase(it);
  }
  static Made find(const Ranges& r, uint64_t addr) {
    auto it = r.upper_bound(addr);
    if (it == r.begin()) return {};
    --it;
    return addr < it->second.first ? it->second.second : Made{};
  }
  void apply(const Event& e, uint64_t instance) {
    if (e.op == "mmap") {
      unmap(mapped_, e.addr, e.addr + e.length);
      unmap(blocks_, e.addr, e.addr + e.length);
      mapped_[e.addr] = {e.addr + e.length, {e.stack, instance}};
    } else if (e.op == "munmap") {
      unmap(mapped_, e.addr, e.addr + e.length);
      unmap(blocks_, e.addr, e.addr + e.length);
    } else if (e.op == "mremap") {
      const Made was = find(mapped_, e.old_addr);
      unmap(mapped_, e.old_addr, e.old_addr + 1);
      unmap(mapped_, e.addr, e.addr + e.length);
      mapped_[e.addr] = {e.addr + e.length, was};
    } else if (e.op == "malloc") {
      unmap(blocks_, e.addr, e.addr + e.length);
      blocks_[e.addr] = {e.addr + e.length, {e.stack, instance}};
    } else if (e.op == "free") {
      blocks_.erase(e.addr);
    }
  }
  // A heap block lies in a mapping of its allocator's (an arena, or the block's own mmap): the
  // block says more.
  Made made_now(uint64_t addr) const {
    const Made block = find(blocks_, addr);
    return block.instance ? block : find(mapped_, addr);
  }
  std::vector<Event> events_;
  size_t next_ = 0;
  Ranges mapped_, blocks_;
};

// A native frame's function and module, without the offset and line ("f(int)+0x51 (prog) at
// vector.tcc:464" -> "f(int) (prog)"); a Python site as it is.
std::string function_of(const std::string& site) {
  const size_t plus = site.rfind("+0x", site.rfind(" ("));
  if (plus == std::string::npos) return site;
  const size_t module = site.find(" (", plus), at = site.find(" at ", plus);
  return site.substr(0, plus) + (module == std::string::npos ? "" : site.substr(module, at - module));
}

// Where a mapping's stack says the program allocated: its Python line, else the function of its
// first frame past the C library, the C++ runtime and the allocators (mmap, malloc, operator new,
// std::vector's constructor, PyTorch's CPU allocator).
std::string allocation_site(report::CallSites& sites, int64_t stack) {
  if (auto py = sites.python_site(stack); !py.empty()) return py;
  static constexpr std::string_view kAllocatorModules[] = {"libc.so", "libstdc++.so", "ld-linux", "libc10.so",
                                                           "libjemalloc", "libtcmalloc", "libgpuscope_pin",
                                                           "libgpuscope_launches"};
  static constexpr std::string_view kAllocatorSymbols[] = {"std::", "__gnu_cxx::", "operator new", "c10::alloc_cpu",
                                                           "malloc", "calloc", "realloc", "posix_memalign",
                                                           "aligned_alloc", "memalign", "mmap", "gpuscope_heap_alloc"};
  for (const auto& f : sites.frames(stack)) {
    // The demangled name ("function+0xoff (module) at file:line"); a template function's starts
    // with its return type ("void std::vector<...>::_M_realloc_insert<...>(...)"): the qualified
    // name is after it.
    std::string_view name = f.text;
    name = name.substr(0, name.rfind(" at "));
    name = name.substr(0, name.rfind("+0x"));
    if (const size_t space = name.find(' '); space != std::string_view::npos && name.find_first_of("<(:") > space)
      name.remove_prefix(space + 1);
    const bool allocator =
        std::any_of(std::begin(kAllocatorModules), std::end(kAllocatorModules),
                    [&](std::string_view m) {
                      // "function+0xoff (module)", or the module alone where the frame is unnamed
                      return f.site.starts_with(m) || f.text.find(fmt::format("({}", m)) != std::string::npos;
                    }) ||
        std::any_of(std::begin(kAllocatorSymbols), std::end(kAllocatorSymbols),
                    [&](std::string_view s) { return name.starts_with(s) || f.symbol.starts_with(s); });
    if (!allocator) return function_of(f.site);
  }
  return sites.python_or_caller(stack);
}

std::string ms(double us) { return fmt::format("{:.2f} ms", us / 1e3); }

// What a buffer's or a site's copies took: as measured where every one of them was, else the
// model's.
template <typename Copies>
double taken_us(const Copies& c) {
  return c.measured == c.copies ? c.measured_us : c.pageable_us;
}

// Pinned copies saving less than this share of their time: no faster. Registering that leaves less
// than kWorthPinning of the copies' time saved: not worth the memory it locks. A site of this many
// buffers or more, each copied about once: its data is new each time.
constexpr double kNoFaster = 0.05, kWorthPinning = 0.1;
constexpr int64_t kManyBuffers = 8;
// A copy's own time is taken up to this many times the model's: the rest is its wait for the work
// queued before it.
constexpr double kQueuedWait = 1.5;

}  // namespace

json advise(store::RecordReader& rec, report::CallSites& sites, const CopyModel& model, const AdviseOptions& opts) {
  const report::Record r = report::read_record(rec);
  const std::string h2d(cuda::to_string(cuda::CopyDir::HostToDevice)), d2h(cuda::to_string(cuda::CopyDir::DeviceToHost));
  auto q = r.db.prepare(
      "SELECT pid, dir, bytes, duration_ns, coalesce(ret, 0), coalesce(stack_id, 0), "
      "CASE WHEN dir = ?1 THEN src ELSE ptr END, ts_ns FROM calls WHERE parent_id IS NULL AND host_mem = 'pageable' "
      "AND dir IN (?1, ?2) AND bytes > 0 AND func IN (" + report::ids_of(r.functions, {"memcpy"}) + ") ORDER BY ts_ns");
  q.bind(1, h2d).bind(2, d2h);
  // (pid, host address, which allocation holds it: 0 where none was seen) -> its copies
  std::map<std::tuple<int64_t, int64_t, uint64_t>, Buffer> buffers;
  // Where the host memory came from: large mappings with their stacks (records before them, or
  // made with --host-allocs 0, have none).
  std::map<int64_t, Mappings> mappings;
  if (r.db.has_table("host_allocs")) {
    std::map<int64_t, std::vector<Mappings::Event>> events;
    auto a = r.db.prepare(
        "SELECT pid, ts_ns, op, addr, length, coalesce(old_addr, 0), coalesce(stack_id, 0) FROM host_allocs ORDER BY ts_ns");
    while (a.step())
      events[a.i64(0)].push_back({uint64_t(a.i64(1)), a.str(2), uint64_t(a.i64(3)), uint64_t(a.i64(4)),
                                  uint64_t(a.i64(5)), a.i64(6)});
    for (auto& [pid, e] : events) mappings.emplace(pid, Mappings(std::move(e)));
  }
  int64_t pageable = 0;
  while (q.step()) {
    const double bytes = double(q.i64(2));
    const bool to_device = q.str(1) == h2d;
    Mappings::Made made;
    if (auto m = mappings.find(q.i64(0)); m != mappings.end())
      made = m->second.made_at(uint64_t(q.i64(7)), uint64_t(q.i64(6)));
    auto& b = buffers[{q.i64(0), q.i64(6), made.instance}];
    if (!b.copies) b.written_first = !to_device;
    b.bytes = std::max(b.bytes, bytes);
    ++b.copies;
    b.to_device += to_device;
    b.copied_bytes += bytes;
    const double pageable_us = model.copy_us(bytes, to_device, false);
    if (q.i64(4) == 0 && q.i64(3) > 0) {
      // A copy's call also waits for the work queued before it on its stream (a synchronous copy,
      // or an asynchronous one from pageable memory): beyond kQueuedWait times the model's time,
      // the rest is taken for that wait, not the copy.
      b.measured_us += std::min(double(q.i64(3)) / 1e3, kQueuedWait * pageable_us);
      ++b.measured;
    }
    b.pageable_us += pageable_us;
    b.pinned_us += model.copy_us(bytes, to_device, true);
    if (q.i64(5)) ++b.stacks[q.i64(5)];
    if (made.stack) ++b.allocated[made.stack];
    ++pageable;
  }

  // Each buffer goes to the place that allocated it where its mapping was seen, else to the call
  // site of most of its copies with a stack.
  auto most_of = [](const std::map<int64_t, int64_t>& counts) {
    int64_t id = 0, most = 0;
    for (const auto& [k, n] : counts)
      if (n > most) id = k, most = n;
    return id;
  };
  std::map<std::string, Site> by_site;
  for (const auto& [key, b] : buffers) {
    const int64_t stack = most_of(b.stacks), made = most_of(b.allocated);
    const std::string copied_at = stack ? sites.python_or_caller(stack) : "[no stack]";
    const std::string allocated_at = made ? allocation_site(sites, made) : "";
    const std::string where = allocated_at.empty() ? copied_at : allocated_at;
    // Buffers allocated in one function and copied at one place are one site, whichever of its
    // lines allocated each (a vector's element made in place, or when the vector grows, has a
    // line of its own, often a library header's).
    auto& s = by_site[allocated_at.empty() ? copied_at : allocated_at + "\n" + copied_at];
    if (s.where.empty()) {
      s.where = where;
      s.allocated_at = allocated_at;
      s.copied_at = copied_at;
      if (stack) {
        s.has_python = !sites.python_site(stack).empty();
        s.data_loader = in_data_loader(sites.frames(stack));
      }
    }
    ++s.buffers;
    s.copies += b.copies;
    s.to_device += b.to_device;
    s.bytes += b.copied_bytes;
    s.largest = std::max(s.largest, b.bytes);
    s.measured += b.measured;
    s.measured_us += b.measured_us;
    s.pageable_us += b.pageable_us;
    s.pinned_us += b.pinned_us;
    const double now = taken_us(b);
    // (Never below the touched pages' price: at 4 KB the table's two differ by its own noise.)
    const double cost = b.written_first ? std::max(model.pin_cost_us(b.bytes), model.register_untouched_us(b.bytes) +
                                                                                  model.unregister_us(b.bytes))
                                        : model.pin_cost_us(b.bytes);
    if (b.bytes >= s.largest) s.largest_cost_us = cost;
    if (now - b.pinned_us > cost) {
      ++s.paying_buffers;
      s.paying_saving_us += now - b.pinned_us;
      s.paying_cost_us += cost;
    }
  }

  std::vector<Site> ranked;
  for (auto& [where, s] : by_site) ranked.push_back(std::move(s));
  std::sort(ranked.begin(), ranked.end(),
            [](const Site& a, const Site& b) { return taken_us(a) - a.pinned_us > taken_us(b) - b.pinned_us; });

  json out;
  out["model"] = model.source;
  out["pageable_copies"] = pageable;
  out["allocations_recorded"] = !mappings.empty();
  out["buffers"] = buffers.size();
  json list = json::array();
  double total_now = 0, total_pinned = 0, total_saving = 0;
  for (const auto& s : ranked) {
    const double now = taken_us(s), saving = now - s.pinned_us;
    total_now += now;
    total_pinned += s.pinned_us;
    const double per_copy_bytes = s.bytes / double(std::max<int64_t>(1, s.copies));
    std::string action, advice;
    const double net_pin = s.paying_saving_us - s.paying_cost_us;
    const double reuse = double(s.copies) / double(std::max<int64_t>(1, s.buffers));
    if (saving <= kNoFaster * now) {
      action = "leave";
      advice = fmt::format("pinned memory is no faster for copies of {} (the copy model: {} pageable, {} pinned)",
                           report::bytes_text(int64_t(per_copy_bytes)), ms(s.pageable_us), ms(s.pinned_us));
    } else if (s.paying_buffers > 0 && net_pin >= kWorthPinning * now) {
      action = "pin";
      total_saving += net_pin;
      const std::string how =
          s.has_python ? "allocate it pinned once (tensor.pin_memory(), or torch.empty(..., pin_memory=True)) and copy "
                         "with non_blocking=True"
                       : "allocate it with cudaMallocHost (or cudaHostRegister it once) and keep it";
      advice = fmt::format("{} buffer{} copied {:.0f} times each on average: {}; saves {} for {} of registering",
                           s.paying_buffers, s.paying_buffers == 1 ? "" : "s", reuse, how, ms(s.paying_saving_us),
                           ms(s.paying_cost_us));
    } else if (s.buffers >= kManyBuffers && reuse < 2) {
      // New buffers each time: registering each costs more than its copy saves; the data must be
      // made in pinned memory.
      action = "pin at the source";
      total_saving += saving;
      advice = s.data_loader
                   ? "pin_memory=True on this DataLoader (its batches are made in pinned memory by a helper thread), "
                     "then .to(device, non_blocking=True)"
                   : s.has_python
                         ? "make the data in a pinned buffer reused each step (torch.empty(..., pin_memory=True), "
                           "then .copy_() into it) and copy with non_blocking=True; each new buffer is copied too "
                           "seldom to register it"
                         : "copy through a pinned staging buffer allocated once (cudaMallocHost), or allocate the "
                           "data there; each new buffer is copied too seldom to register it";
      advice += fmt::format(" ({} buffers, {:.1f} copies each)", s.buffers, reuse);
    } else {
      action = "leave";
      const double cost = s.paying_buffers ? s.paying_cost_us : s.largest_cost_us;
      advice = fmt::format(
          "{} cop{} of {} buffer{}: registering ({}) {} pinned copies save ({}); not worth it",
          s.copies, s.copies == 1 ? "y" : "ies", s.buffers, s.buffers == 1 ? "" : "s", ms(cost),
          cost >= saving ? "costs more than" : "costs nearly as much as", ms(saving));
    }
    if (list.size() < opts.top)
      list.push_back({{"site", s.where},
                      {"allocated_at", s.allocated_at.empty() ? json() : json(s.allocated_at)},
                      {"copied_at", s.copied_at},
                      {"action", action},
                      {"advice", advice},
                      {"copies", s.copies},
                      {"to_device", s.to_device},
                      {"buffers", s.buffers},
                      {"bytes", int64_t(s.bytes)},
                      {"time_ms", now / 1e3},
                      {"time_from", s.measured == s.copies ? "measured" : "model"},
                      {"pinned_ms", s.pinned_us / 1e3},
                      {"register_ms", s.paying_cost_us / 1e3}});
  }
  // Where pinning pays, the same program can be pinned without a change (docs/pin.md).
  const bool pays = std::any_of(list.begin(), list.end(), [](const json& site) {
    return site["action"] != "leave";
  });
  if (pays) {
    const std::string command = rec.meta("command");
    out["pin_command"] = "gpuscope pin -- " + (command.empty() ? std::string("COMMAND") : command);
  }
  out["sites"] = std::move(list);
  out["sites_total"] = ranked.size();
  out["time_ms"] = total_now / 1e3;
  out["pinned_ms"] = total_pinned / 1e3;
  out["saving_ms"] = total_saving / 1e3;
  return out;
}

std::string render_text(const json& doc) {
  std::string out;
  out += fmt::format("Copies from or to pageable memory: {} in {} host buffers; copy model: {}\n",
                     doc["pageable_copies"].get<int64_t>(), doc["buffers"].get<int64_t>(),
                     doc["model"].get<std::string>());
  if (doc["sites"].empty()) {
    out += "Nothing to pin: no copy used pageable memory.\n";
    return out;
  }
  out += fmt::format("They took {:.2f} ms; pinned, {:.2f} ms; the advice below saves {:.2f} ms with registering paid.\n\n",
                     doc["time_ms"].get<double>(), doc["pinned_ms"].get<double>(), doc["saving_ms"].get<double>());
  int i = 0;
  for (const auto& s : doc["sites"]) {
    out += fmt::format("{}. [{}] {}\n", ++i, s["action"].get<std::string>(), s["site"].get<std::string>());
    if (!s["allocated_at"].is_null() && s["copied_at"] != s["site"])
      out += fmt::format("   allocated there; copied at {}\n", s["copied_at"].get<std::string>());
    out += fmt::format("   {} cop{} ({} to the GPU) of {} in {} buffer{}: {:.2f} ms ({}), pinned {:.2f} ms\n",
                       s["copies"].get<int64_t>(), s["copies"].get<int64_t>() == 1 ? "y" : "ies",
                       s["to_device"].get<int64_t>(),
                       report::bytes_text(s["bytes"].get<int64_t>()), s["buffers"].get<int64_t>(),
                       s["buffers"].get<int64_t>() == 1 ? "" : "s", s["time_ms"].get<double>(),
                       s["time_from"].get<std::string>(), s["pinned_ms"].get<double>());
    out += "   " + s["advice"].get<std::string>() + "\n";
  }
  if (doc["sites_total"].get<size_t>() > doc["sites"].size())
    out += fmt::format("({} more call sites; --top shows more)\n", doc["sites_total"].get<size_t>() - doc["sites"].size());
  if (doc.contains("pin_command"))
    out += fmt::format("\nWithout changing the program, {} pins the buffers whose copies pay for it (docs/pin.md).\n",
                       doc["pin_command"].get<std::string>());
  return out;
}

}  // namespace gpuscope::advise
