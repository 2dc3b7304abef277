#include "report/flamegraph.h"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "common/error.h"
#include "common/protobuf.h"
#include "report/frame_names.h"
#include "report/stored_stacks.h"

namespace gpuscope::report {
namespace {

// Weights from a record are summed without overflowing (a crafted record's can be anything).
int64_t saturating_add(int64_t a, int64_t b) {
  int64_t sum;
  if (!__builtin_add_overflow(a, b, &sum)) return sum;
  return b > 0 ? INT64_MAX : INT64_MIN;
}

int64_t saturating_sub(int64_t a, int64_t b) {
  int64_t diff;
  if (!__builtin_sub_overflow(a, b, &diff)) return diff;
  return b < 0 ? INT64_MAX : INT64_MIN;
}


using store::Db;

// The frames a view shows of stored stacks, outermost first, per (user stack, kernel stack):
// a CPU sample's kernel part goes under the user stack that made the system call.
class StackLabels {
 public:
  StackLabels(Db& db, symbolize::Symbolizer& sym, NativeView view) : names_(db, sym), view_(view) {}

  const std::vector<std::string>& operator()(int64_t stack_id, int64_t kernel_stack_id = 0) {
    auto [it, added] = cache_.try_emplace({stack_id, kernel_stack_id});
    if (!added) return it->second;
    std::vector<const NamedFrame*> root_first;
    for (int64_t id : {stack_id, kernel_stack_id}) {
      const auto& frames = names_(id);
      for (auto f = frames.rbegin(); f != frames.rend(); ++f) root_first.push_back(&*f);
    }
    for (const NamedFrame* f : root_first) frames_.python |= f->kind == NamedFrame::Kind::Python;
    for (auto& shown : view_stack(root_first, view_)) {
      const NamedFrame& f = *shown.frame;
      if (f.kind == NamedFrame::Kind::Python && !f.row->python->file.empty())
        frames_.sources.try_emplace(shown.label, f.row->python->file, f.row->python->line);
      else if (f.kind == NamedFrame::Kind::Native)
        frames_.modules.try_emplace(shown.label, f.row->path, f.row->build_id);
      it->second.push_back(std::move(shown.label));
    }
    return it->second;
  }
  // What pprof needs to know of the labels handed out.
  struct Frames {
    std::map<std::string, std::pair<std::string, int64_t>> sources;
    std::map<std::string, std::pair<std::string, std::string>> modules;
    bool python = false;  // some stack had Python frames
  };
  Frames& frames() { return frames_; }

 private:
  FrameNamer names_;
  NativeView view_;
  std::map<std::pair<int64_t, int64_t>, std::vector<std::string>> cache_;
  Frames frames_;
};

std::map<int64_t, std::string> process_names(Db& db) {
  std::map<int64_t, std::string> out;
  auto q = db.prepare("SELECT pid, comm FROM processes");
  while (q.step()) out[q.i64(0)] = fmt::format("{} ({})", q.str(1).empty() ? "pid" : q.str(1), q.i64(0));
  return out;
}

std::string process_name(const std::map<int64_t, std::string>& names, int64_t pid) {
  auto it = names.find(pid);
  return it == names.end() ? fmt::format("pid {}", pid) : it->second;
}

// Calls of the given kinds made by the program itself (not the driver calls inside runtime calls).
std::string calls_of_kind_sql(const std::string& columns, const std::string& kinds, int64_t pid) {
  return fmt::format(
      "SELECT {} FROM calls c JOIN functions f ON f.id = c.func WHERE f.kind IN ({}) AND c.parent_id IS NULL{} "
      "ORDER BY c.id",
      columns, kinds, pid ? fmt::format(" AND c.pid = {}", pid) : "");
}

std::string gzip(const std::string& in) {
  z_stream z{};
  if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    throw Error("zlib: cannot start compression");
  std::string out(deflateBound(&z, in.size()) + 32, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&z, Z_FINISH);
  deflateEnd(&z);
  if (rc != Z_STREAM_END) throw Error("zlib: compression failed");
  out.resize(z.total_out);
  return out;
}

}  // namespace

int64_t FlameData::total() const {
  int64_t t = 0;
  for (const auto& [k, v] : stacks) t = saturating_add(t, v);
  return t;
}

Metric parse_metric(const std::string& s) {
  static const std::map<std::string, Metric> metrics{{"cpu", Metric::Cpu},
                                                     {"launches", Metric::Launches},
                                                     {"memcpy-bytes", Metric::MemcpyBytes},
                                                     {"alloc-bytes", Metric::AllocBytes},
                                                     {"inuse-bytes", Metric::InuseBytes},
                                                     {"gpu-time", Metric::GpuTime},
                                                     {"nccl-bytes", Metric::NcclBytes}};
  auto it = metrics.find(s);
  if (it == metrics.end())
    throw Error("unknown metric '{}': use cpu, launches, memcpy-bytes, alloc-bytes, inuse-bytes, gpu-time or nccl-bytes", s);
  return it->second;
}

FlameFormat format_for_path(const std::string& path) {
  auto ends = [&](std::string_view suffix) { return path.ends_with(suffix); };
  if (ends(".html") || ends(".htm")) return FlameFormat::Html;
  if (ends(".pb.gz") || ends(".pprof") || ends(".pb")) return FlameFormat::Pprof;
  if (ends(".folded") || ends(".txt") || path == "-") return FlameFormat::Folded;
  throw Error("cannot tell the format from '{}': name it .html, .folded (or .txt) or .pb.gz (pprof)", path);
}

FlameData build_flame(store::RecordReader& rec, symbolize::Symbolizer& sym, const FlameOptions& opt) {
  Db& db = rec.db();
  const bool have_samples = db.has_table("samples");
  StackLabels names(db, sym, opt.native);
  const auto procs = process_names(db);
  FlameData d;

  auto add_with_kernel = [&](int64_t pid, int64_t stack_id, int64_t kernel_stack_id,
                             const std::vector<std::string>& leaf, int64_t value) {
    std::vector<std::string> path{process_name(procs, pid)};
    const auto& frames = names(stack_id, kernel_stack_id);
    if (stack_id == 0) path.insert(path.end(), "[no stack]");
    path.insert(path.end(), frames.begin(), frames.end());
    path.insert(path.end(), leaf.begin(), leaf.end());
    d.stacks[path] = saturating_add(d.stacks[path], value);
  };
  auto add = [&](int64_t pid, int64_t stack_id, const std::vector<std::string>& leaf, int64_t value) {
    add_with_kernel(pid, stack_id, 0, leaf, value);
  };

  switch (opt.metric) {
    case Metric::Cpu: {
      if (!have_samples) throw Error("this record has no CPU samples: record with --cpu-profile 99");
      const int64_t hz = rec.meta_i64("cpu_profile_hz", 0);
      d.sample_type = "cpu";
      d.unit = "nanoseconds";
      d.period = hz > 0 ? 1'000'000'000 / hz : 1;
      auto q = db.prepare(fmt::format("SELECT pid, coalesce(stack_id, 0), coalesce(kernel_stack_id, 0) FROM samples{}",
                                      opt.pid ? fmt::format(" WHERE pid = {}", opt.pid) : ""));
      while (q.step()) add_with_kernel(q.i64(0), q.i64(1), q.i64(2), {}, d.period);
      break;
    }
    case Metric::GpuTime: {
      if (!db.has_table("gpu_activities"))
        throw Error("this record has no GPU times: record with --gpu-times");
      d.sample_type = "gpu_time";
      d.unit = "nanoseconds";
      // Each kernel's (and copy's, memset's) time on the GPU, under the stack that launched it;
      // the leaf is the kernel, or the kind of transfer.
      // A kernel whose launch's stack was left out (--stack-every) is counted in those
      // that were taken: each stands for N.
      auto q = db.prepare(fmt::format(
          "SELECT coalesce(c.pid, a.pid), coalesce(c.stack_id, 0), CASE a.kind WHEN 'kernel' THEN "
          "coalesce(a.name, '[unnamed kernel]') ELSE '[' || a.kind || ']' END, a.end_ns - a.start_ns, "
          "CASE WHEN c.id IS NULL THEN 1 ELSE {} END AS w "
          "FROM gpu_activities a LEFT JOIN calls c ON c.id = a.call_id WHERE w > 0{}",
          call_stack_weight_sql(db), opt.pid ? fmt::format(" AND a.pid = {}", opt.pid) : ""));
      while (q.step()) add(q.i64(0), q.i64(1), {q.str(2)}, std::max<int64_t>(q.i64(3), 0) * q.i64(4));
      break;
    }
    case Metric::Launches: {
      d.sample_type = "launches";
      d.unit = "count";
      auto q = db.prepare(calls_of_kind_sql(
          "c.pid, coalesce(c.stack_id, 0), coalesce((SELECT demangled FROM kernels k WHERE k.id = c.kernel_id), "
          "'[unnamed kernel]'), " + call_stack_weight_sql(db),
          "'launch'", opt.pid));
      while (q.step())
        if (q.i64(3) > 0) add(q.i64(0), q.i64(1), {q.str(2)}, q.i64(3));
      break;
    }
    case Metric::MemcpyBytes: {
      d.sample_type = "memcpy";
      d.unit = "bytes";
      // The leaf says what kind of copy it was; the copying function is the frame above it.
      auto q = db.prepare(calls_of_kind_sql(
          "c.pid, coalesce(c.stack_id, 0), coalesce(c.dir, '?'), coalesce(c.host_mem, ''), c.bytes, " +
              call_stack_weight_sql(db),
          "'memcpy'", opt.pid));
      while (q.step())
        if (!q.is_null(4) && q.i64(5) > 0)
          add(q.i64(0), q.i64(1), {q.str(3).empty() ? q.str(2) : fmt::format("{} ({})", q.str(2), q.str(3))},
              q.i64(4) * q.i64(5));
      break;
    }
    case Metric::NcclBytes: {
      d.sample_type = "nccl";
      d.unit = "bytes";
      // What each collective, send and receive passed NCCL (count x the type's size, one rank's
      // side), under the stack that called it; the leaf is the function, and says where the call
      // failed: those bytes never moved.
      auto q = db.prepare(calls_of_kind_sql(
          "c.pid, coalesce(c.stack_id, 0), f.name, c.bytes, coalesce(c.ret, 0), " + call_stack_weight_sql(db),
          "'collective', 'p2p'", opt.pid));
      while (q.step())
        if (!q.is_null(3) && q.i64(5) > 0)
          add(q.i64(0), q.i64(1), {q.i64(4) == 0 ? q.str(2) : q.str(2) + " (failed)"}, q.i64(3) * q.i64(5));
      break;
    }
    case Metric::AllocBytes:
    case Metric::InuseBytes: {
      d.sample_type = opt.metric == Metric::AllocBytes ? "alloc_space" : "inuse_space";
      d.unit = "bytes";
      // Replayed in order: frees retire the allocation of the same pointer in the same process.
      struct Live {
        int64_t pid, stack_id, bytes;
        std::string func;
      };
      std::map<std::pair<int64_t, int64_t>, Live> live;
      std::map<std::pair<int64_t, int64_t>, Live> at_peak;
      int64_t in_use = 0, peak = 0;
      auto q = db.prepare(calls_of_kind_sql("c.pid, coalesce(c.stack_id, 0), f.name, f.kind, c.ptr, c.bytes, c.ret",
                                            "'alloc', 'free'", opt.pid));
      while (q.step()) {
        const bool ok = q.is_null(6) || q.i64(6) == 0;
        if (!ok || q.is_null(4)) continue;
        const std::pair key{q.i64(0), q.i64(4)};
        if (q.str(3) == "alloc") {
          const int64_t bytes = q.is_null(5) ? 0 : q.i64(5);
          if (opt.metric == Metric::AllocBytes) {
            add(q.i64(0), q.i64(1), {q.str(2)}, bytes);
            continue;
          }
          if (auto old = live.find(key); old != live.end()) in_use = saturating_sub(in_use, old->second.bytes);
          live[key] = {q.i64(0), q.i64(1), bytes, q.str(2)};
          in_use = saturating_add(in_use, bytes);
          if (opt.inuse_at_peak && in_use > peak) {
            peak = in_use;
            at_peak = live;
          }
        } else if (auto it = live.find(key); it != live.end()) {
          in_use = saturating_sub(in_use, it->second.bytes);
          live.erase(it);
        }
      }
      if (opt.metric == Metric::InuseBytes)
        for (const auto& [key, a] : opt.inuse_at_peak ? at_peak : live)
          if (a.bytes > 0) add(a.pid, a.stack_id, {a.func}, a.bytes);
      break;
    }
  }
  if (d.stacks.empty()) throw Error("the record has nothing to weigh by this metric (no matching events)");
  if (names.frames().python && opt.native == NativeView::Auto)
    d.note = "Python stacks without the interpreter's own frames (--native all shows every frame)";
  else if (names.frames().python && opt.native == NativeView::None)
    d.note = "Python stacks show their Python frames and innermost frame (--native auto, all show more)";
  d.sources = std::move(names.frames().sources);
  d.modules = std::move(names.frames().modules);
  return d;
}

std::string to_folded(const FlameData& d) {
  std::string out;
  for (const auto& [path, value] : d.stacks) {
    for (size_t i = 0; i < path.size(); ++i) {
      if (i) out += ';';
      // ';' separates frames and the last space the value: keep names from breaking either.
      for (char c : path[i]) out += c == ';' ? ':' : c == '\n' ? ' ' : c;
    }
    out += fmt::format(" {}\n", value);
  }
  return out;
}

std::string to_pprof(const FlameData& d) {
  std::vector<std::string> strings{""};  // string_table[0] must be ""
  std::unordered_map<std::string, uint64_t> string_ids{{"", 0}};
  auto intern = [&](const std::string& s) {
    auto [it, added] = string_ids.try_emplace(s, strings.size());
    if (added) strings.push_back(s);
    return it->second;
  };
  auto value_type = [&](const std::string& type, const std::string& unit) {
    ProtoWriter vt;
    vt.field_varint(1, intern(type));
    vt.field_varint(2, intern(unit));
    return vt.str();
  };
  ProtoWriter profile;
  profile.field_bytes(1, value_type(d.sample_type, d.unit));  // sample_type
  // One function and one location per distinct frame name (ids from 1); pprof lists a
  // sample's locations leaf first.
  std::unordered_map<std::string, uint64_t> ids;
  std::vector<const std::string*> by_id;
  for (const auto& [path, value] : d.stacks) {
    std::vector<uint64_t> locs;
    for (auto it = path.rbegin(); it != path.rend(); ++it) {
      auto [found, added] = ids.try_emplace(*it, by_id.size() + 1);
      if (added) by_id.push_back(&found->first);
      locs.push_back(found->second);
    }
    ProtoWriter sample;
    sample.field_packed(1, locs);                             // location_id
    sample.field_packed(2, {static_cast<uint64_t>(value)});  // value
    profile.field_bytes(2, sample.str());
  }
  // Native frames' files as mappings (with no addresses: a location is a frame of the view, which
  // for a library's unsymbolised frames stands for many), so that viewers can tell binaries apart.
  std::map<std::string, uint64_t> mapping_ids;  // file -> id
  for (const auto& [name, file] : d.modules) {
    auto [it, added] = mapping_ids.try_emplace(file.first, mapping_ids.size() + 1);
    if (!added) continue;
    ProtoWriter m;
    m.field_varint(1, it->second);             // Mapping.id
    m.field_varint(5, intern(file.first));     // Mapping.filename
    if (!file.second.empty()) m.field_varint(6, intern(file.second));  // Mapping.build_id
    m.field_varint(7, 1);                      // has_functions: already symbolised
    profile.field_bytes(3, m.str());
  }
  for (uint64_t id = 1; id <= by_id.size(); ++id) {
    ProtoWriter line, loc;
    line.field_varint(1, id);  // Line.function_id
    if (auto src = d.sources.find(*by_id[id - 1]); src != d.sources.end())
      line.field_varint(2, static_cast<uint64_t>(src->second.second));  // Line.line
    loc.field_varint(1, id);       // Location.id
    if (auto m = d.modules.find(*by_id[id - 1]); m != d.modules.end())
      loc.field_varint(2, mapping_ids.at(m->second.first));  // Location.mapping_id
    loc.field_bytes(4, line.str());  // Location.line
    profile.field_bytes(4, loc.str());
  }
  for (uint64_t id = 1; id <= by_id.size(); ++id) {
    ProtoWriter fn;
    fn.field_varint(1, id);                   // Function.id
    fn.field_varint(2, intern(*by_id[id - 1]));  // Function.name
    if (auto src = d.sources.find(*by_id[id - 1]); src != d.sources.end())
      fn.field_varint(4, intern(src->second.first));  // Function.filename
    profile.field_bytes(5, fn.str());
  }
  const std::string period = value_type(d.sample_type, d.unit);
  for (const auto& s : strings) profile.field_bytes(6, s);  // string_table, after every intern
  profile.field_bytes(11, period);                             // period_type
  profile.field_varint(12, static_cast<uint64_t>(d.period));   // period
  if (d.duration_nanos > 0) {
    profile.field_varint(9, static_cast<uint64_t>(d.time_nanos));       // time_nanos
    profile.field_varint(10, static_cast<uint64_t>(d.duration_nanos));  // duration_nanos
  }
  return gzip(profile.str());
}

}  // namespace gpuscope::report

namespace gpuscope::report {
namespace {

// The page's script: draws the tree with root on top, one absolutely placed box per frame
// wider than a pixel; a click zooms to a frame, the search box (or #search=REGEX in the
// address) highlights matches and totals them. Python frames ("name (file:line)") are blue,
// OS kernel frames orange, markers grey, native frames warm.
constexpr const char* kPage = R"html(<!doctype html>
<html><head><meta charset="utf-8"><title>@TITLE@</title>
<style>
body{font:12px ui-monospace,Menlo,Consolas,monospace;margin:8px;color:#222;background:#fff}
header{display:flex;gap:8px;align-items:center;flex-wrap:wrap;margin-bottom:6px}
h1{font-size:15px;margin:0 12px 0 0}
#chart{position:relative;width:100%;overflow:hidden}
.frame{position:absolute;height:17px;line-height:17px;overflow:hidden;white-space:nowrap;text-overflow:ellipsis;
 box-sizing:border-box;border:1px solid #fff;padding:0 3px;cursor:pointer;border-radius:2px}
.frame.match{background:#e040fb!important;color:#fff}
.frame.faded{opacity:.45}
#details{min-height:16px;margin-bottom:4px;color:#444;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
</style></head><body>
<header><h1 id="title"></h1><input id="search" size="28" placeholder="search (regular expression)">
<button id="reset">reset zoom</button><span id="matched"></span></header>
<div id="details"></div>
<div id="chart"></div>
<script>
const META=@META@;
const ROOT=@DATA@;
const H=18, MIN_PX=0.5;
let zoomed=ROOT, query=null;
function fmt(v){const u=META.unit;if(u==="bytes"){const k=["B","KiB","MiB","GiB","TiB"];let i=0;while(v>=1024&&i<4){v/=1024;i++}return v.toFixed(i?1:0)+" "+k[i]}
 if(u==="nanoseconds"){return (v/1e6).toFixed(1)+" ms"}return v.toLocaleString()+" "+META.sample_type}
function hue(s){let h=0;for(let i=0;i<s.length;i++)h=(h*31+s.charCodeAt(i))|0;return Math.abs(h)}
function color(n){if(n.endsWith("_[k]"))return "hsl(25,85%,"+(62+hue(n)%12)+"%)";if(n.startsWith("["))return "#c8c8c8";
 if(/ \([^()]*:\d+\)$/.test(n))return "hsl("+(190+hue(n)%40)+",55%,"+(72+hue(n)%10)+"%)";
 return "hsl("+(hue(n)%50)+","+(70+hue(n)%20)+"%,"+(60+hue(n)%15)+"%)"}
function parentsOf(n){const p=[];for(let x=n.parent;x;x=x.parent)p.unshift(x);return p}
function link(n,p){n.parent=p;(n[2]||[]).forEach(c=>link(c,n))}
link(ROOT,null);
function draw(){
 const chart=document.getElementById("chart");chart.innerHTML="";
 const W=chart.clientWidth||1200, total=zoomed[1], chain=parentsOf(zoomed);
 let rows=0, matched=0;
 const re=query?new RegExp(query):null;
 function box(n,x,w,depth,faded){
  const d=document.createElement("div");d.className="frame"+(faded?" faded":"");
  if(re&&re.test(n[0]))d.classList.add("match");
  d.style.left=x+"px";d.style.width=w+"px";d.style.top=depth*H+"px";d.style.background=color(n[0]);
  d.textContent=n[0];d.title=n[0]+"\n"+fmt(n[1])+" ("+(100*n[1]/ROOT[1]).toFixed(2)+"% of all)";
  d.onclick=()=>{zoomed=n;draw()};d.onmouseover=()=>{document.getElementById("details").textContent=d.title.replace("\n"," — ")};
  chart.appendChild(d);rows=Math.max(rows,depth+1)}
 chain.forEach((p,i)=>box(p,0,W,i,true));
 function walk(n,x,depth,inMatch){
  const w=W*n[1]/total;if(w<MIN_PX)return;
  const hit=re&&re.test(n[0]);if(hit&&!inMatch)matched+=n[1];
  box(n,x,w,depth,false);let cx=x;
  for(const c of (n[2]||[])){walk(c,cx,depth+1,inMatch||hit);cx+=W*c[1]/total}}
 walk(zoomed,0,chain.length,false);
 chart.style.height=(rows*H+4)+"px";
 document.getElementById("matched").textContent=re?("matched: "+fmt(matched)+" = "+(100*matched/ROOT[1]).toFixed(2)+"% of all"):"";
}
document.getElementById("title").textContent=META.title+" — "+fmt(ROOT[1]);
document.getElementById("details").textContent="click a frame to zoom; hover for its weight"+(META.note?"; "+META.note:"");
document.getElementById("search").oninput=e=>{query=e.target.value||null;try{draw()}catch(x){}};
document.getElementById("reset").onclick=()=>{zoomed=ROOT;draw()};
window.onresize=draw;
const m=/search=([^&]*)/.exec(location.hash);if(m){query=decodeURIComponent(m[1]);document.getElementById("search").value=query}
draw();
</script></body></html>
)html";

// Deeper stacks end in one frame that says how many were left out: the tree is built, written
// and drawn recursively (a crafted 30,000-frame stack overflowed the stack writing it).
constexpr size_t kMaxFlameDepth = 1024;

// [name, value, [children...]], children by descending weight.
nlohmann::json tree(const FlameData& d) {
  struct Node {
    int64_t value = 0;
    std::map<std::string, Node> children;
  };
  Node root;
  for (const auto& [path, value] : d.stacks) {
    root.value = saturating_add(root.value, value);
    Node* n = &root;
    const size_t depth = std::min(path.size(), kMaxFlameDepth);
    for (size_t i = 0; i < depth; ++i) {
      const bool cut = i + 1 == kMaxFlameDepth && path.size() > kMaxFlameDepth;
      n = &n->children[cut ? fmt::format("[{} deeper frames]", path.size() - i) : path[i]];
      n->value = saturating_add(n->value, value);
    }
  }
  auto to_json = [](auto&& self, const std::string& name, const Node& n) -> nlohmann::json {
    std::vector<std::pair<const std::string*, const Node*>> kids;
    for (const auto& [k, c] : n.children) kids.emplace_back(&k, &c);
    std::sort(kids.begin(), kids.end(), [](auto& a, auto& b) { return a.second->value > b.second->value; });
    nlohmann::json arr = nlohmann::json::array();
    for (auto& [k, c] : kids) arr.push_back(self(self, *k, *c));
    nlohmann::json j = nlohmann::json::array({name, n.value});
    if (!arr.empty()) j.push_back(std::move(arr));
    return j;
  };
  return to_json(to_json, "all", root);
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

// JSON inside <script>: "</" would end the element.
std::string script_safe(const nlohmann::json& j) {
  return replace_all(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "</", "<\\/");
}

std::string html_escape(const std::string& s) {
  return replace_all(replace_all(replace_all(s, "&", "&amp;"), "<", "&lt;"), ">", "&gt;");
}

}  // namespace

std::string to_html(const FlameData& d, const std::string& title) {
  nlohmann::json meta{{"title", title}, {"unit", d.unit}, {"sample_type", d.sample_type}, {"note", d.note}};
  std::string page = kPage;
  page = replace_all(page, "@TITLE@", html_escape(title));
  page = replace_all(page, "@META@", script_safe(meta));
  return replace_all(page, "@DATA@", script_safe(tree(d)));
}

}  // namespace gpuscope::report
