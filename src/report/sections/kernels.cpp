#include "report/sections/sections.h"

#include <fmt/format.h>

#include <array>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>

#include "report/format.h"

namespace gpuscope::report {
namespace {

using nlohmann::json;

constexpr size_t kShapes = 5;       // grid/block shapes shown per kernel
constexpr size_t kSites = 3;        // call sites shown per kernel

struct ArrayHash {
  template <size_t N>
  size_t operator()(const std::array<int64_t, N>& a) const {
    size_t h = 0;
    for (int64_t v : a) h = (h ^ std::hash<int64_t>{}(v)) * 0x100000001b3;
    return h;
  }
};

std::string shape_text(const json& sh) {
  const auto& g = sh.at("grid");
  const auto& b = sh.at("block");
  return fmt::format("grid({},{},{}) block({},{},{}) ×{}", g[0].get<int64_t>(), g[1].get<int64_t>(),
                     g[2].get<int64_t>(), b[0].get<int64_t>(), b[1].get<int64_t>(), b[2].get<int64_t>(),
                     num(i64(sh, "launches")));
}

}  // namespace

json kernels(const Record& r, CallSites& stacks, size_t top) {
  // A kernel is its kernels row, or for an unnamed one its handle (kernel_id 0).
  using Key = std::array<int64_t, 2>;
  using Shape = std::array<int64_t, 6>;
  struct Kernel {
    int64_t launches = 0;
    std::unordered_map<Shape, int64_t, ArrayHash> shapes;
    std::unordered_map<int64_t, int64_t> stacks;
  };
  std::unordered_map<Key, Kernel, ArrayHash> all;
  int64_t total = 0;
  // Under --stack-every N a launch's stack was taken for one in N: a call site counts
  // each taken one N times and skips the others.
  auto q = r.db.prepare(
      "SELECT kernel_id, kernel_handle, grid_x, grid_y, grid_z, block_x, block_y, block_z, stack_id, " +
      r.stack_weight + " FROM calls c NOT INDEXED WHERE parent_id IS NULL AND func IN (" +
      ids_of(r.functions, {"launch"}) + ")");
  while (q.step()) {
    const int64_t id = q.i64(0);
    Kernel& k = all[{id, id ? 0 : q.i64(1)}];
    ++k.launches;
    ++k.shapes[{q.i64(2), q.i64(3), q.i64(4), q.i64(5), q.i64(6), q.i64(7)}];
    if (const int64_t w = q.i64(9); w > 0) k.stacks[q.i64(8)] += w;
    ++total;
  }

  std::map<Key, int64_t> launches;
  for (const auto& [key, k] : all) launches[key] = k.launches;
  auto names = r.db.prepare("SELECT name, demangled FROM kernels WHERE id = ?1");
  json out = json::array();
  for (const auto& [k, count] : by_count(launches, top)) {
    const Kernel& kernel = all.at(k);
    std::string symbol, name = fmt::format("[unnamed {:#x}]", uint64_t(k[1]));
    if (k[0] && names.bind(1, k[0]).step()) {
      symbol = names.str(0);
      name = names.str(1).empty() ? symbol : names.str(1);
    }
    names.reset();
    json sh = json::array();
    for (const auto& [s, n] : by_count(kernel.shapes, kShapes))
      sh.push_back({{"grid", {s[0], s[1], s[2]}}, {"block", {s[3], s[4], s[5]}}, {"launches", n}});
    // Different stacks can share their first frame outside CUDA and their Python line.
    std::map<std::pair<std::string, std::string>, int64_t> by_site;
    for (const auto& [stack_id, n] : kernel.stacks)
      by_site[{stacks.python_site(stack_id), stacks.site(stack_id, symbol)}] += n;
    json cs = json::array();
    for (const auto& [site, n] : by_count(by_site, kSites)) {
      json c{{"site", site.second}, {"launches", n}};
      if (!site.first.empty()) c["python"] = site.first;
      cs.push_back(std::move(c));
    }
    out.push_back({{"name", name},
                   {"symbol", symbol},
                   {"launches", count},
                   {"distinct_shapes", kernel.shapes.size()},
                   {"shapes", sh},
                   {"call_sites", cs}});
  }
  json result{{"launches", total}, {"distinct", all.size()}, {"top", out}};
  if (r.stack_every > 1) {
    result["stacks_of_one_in"] = r.stack_every;
    if (r.stack_budget > 0) result["stack_budget"] = r.stack_budget;
  }
  return result;
}

void kernels_text(std::string& out, const json& k) {
  const auto& top = k.at("top");
  heading(out, fmt::format("Kernels: top {} of {} by launches ({} launches in all)", top.size(),
                           num(i64(k, "distinct")), num(i64(k, "launches"))));
  if (top.empty()) {
    out += "  no kernel launches\n";
    return;
  }
  const bool sampled = k.contains("stacks_of_one_in");
  Table t({">LAUNCHES", "KERNEL"});
  for (const auto& kernel : top) {
    t.add({num(i64(kernel, "launches")), shorten(str(kernel, "name"), 120)});
    const auto& shapes = kernel.at("shapes");
    for (const auto& sh : shapes) t.add({"", "  " + shape_text(sh)});
    if (i64(kernel, "distinct_shapes") > int64_t(shapes.size()))
      t.add({"", fmt::format("  … {} shapes in all", num(i64(kernel, "distinct_shapes")))});
    for (const auto& c : kernel.at("call_sites"))
      t.add({"", "  from " + site_text(c, 110) + (sampled ? " ≈×" : " ×") + num(i64(c, "launches"))});
  }
  out += t.render();
  if (sampled && k.contains("stack_budget"))
    out += fmt::format("  Call sites from the stacks of 1 launch in up to {} (record --stack-budget {:g}: their walks "
                       "kept within {:g}% of the process's time): counts are estimates.\n",
                       i64(k, "stacks_of_one_in"), k.at("stack_budget").get<double>(),
                       100 * k.at("stack_budget").get<double>());
  else if (sampled)
    out += fmt::format("  Call sites from the stacks of 1 launch in {} (record --stack-every): counts are "
                       "estimates.\n",
                       i64(k, "stacks_of_one_in"));
}

}  // namespace gpuscope::report
