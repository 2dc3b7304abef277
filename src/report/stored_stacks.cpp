#include "report/stored_stacks.h"

#include <fmt/format.h>

#include <cstring>

namespace gpuscope::report {

std::string base_name(const std::string& path) { return path.substr(path.rfind('/') + 1); }

std::string short_python_path(const std::string& path) {
  for (const char* marker : {"/site-packages/", "/dist-packages/"})
    if (auto at = path.rfind(marker); at != std::string::npos) return path.substr(at + strlen(marker));
  if (auto at = path.find("/lib/python3"); at != std::string::npos)
    if (auto slash = path.find('/', at + 5); slash != std::string::npos) return path.substr(slash + 1);
  return path;
}

std::string PythonFrameRow::text() const {
  return file.empty() ? function : fmt::format("{} ({}:{})", function, short_python_path(file), line);
}

std::string call_stack_weight_sql(store::Db& db) {
  auto q = db.prepare("SELECT 1 FROM pragma_table_info('calls') WHERE name = 'stack_weight'");
  return q.step() ? "coalesce(c.stack_weight, 1)" : "1";
}

std::string call_copies_sql(store::Db& db) {
  auto q = db.prepare("SELECT 1 FROM pragma_table_info('calls') WHERE name = 'copies'");
  return q.step() ? "coalesce(c.copies, 1)" : "1";
}

StoredStacks::StoredStacks(store::Db& db)
    : frames_(db.prepare("SELECT f.module_id, f.offset, f.ip, m.path, m.build_id, f.depth FROM stack_frames f "
                         "LEFT JOIN modules m ON m.id = f.module_id WHERE f.stack_id = ?1 ORDER BY f.depth")) {
  // Tables a record written by an older gpuscope may lack.
  if (db.has_table("symbols")) {
    auto q = db.prepare("SELECT module_id, offset, name FROM symbols");
    while (q.step()) recorded_[{q.i64(0), uint64_t(q.i64(1))}] = q.str(2);
  }
  if (db.has_table("python_frames")) {
    auto q = db.prepare("SELECT id, function, file, line FROM python_frames");
    while (q.step()) python_[q.i64(0)] = PythonFrameRow{q.str(1), q.str(2), q.i64(3)};
  }
}

const std::vector<StoredFrameRow>& StoredStacks::operator()(int64_t stack_id) {
  auto [it, added] = cache_.try_emplace(stack_id);
  if (!added || stack_id == 0) return it->second;
  frames_.bind(1, stack_id);
  while (frames_.step()) {
    StoredFrameRow f;
    f.in_file = !frames_.is_null(0);
    f.offset = uint64_t(frames_.i64(1));
    f.ip = uint64_t(frames_.i64(2));
    f.depth = frames_.i64(5);
    if (f.in_file) {
      f.path = frames_.str(3);
      f.build_id = frames_.str(4);
      if (auto r = recorded_.find({frames_.i64(0), f.offset}); r != recorded_.end()) f.recorded_name = &r->second;
      if (f.path == "[python]")
        if (auto p = python_.find(int64_t(f.offset)); p != python_.end()) f.python = &p->second;
    }
    it->second.push_back(std::move(f));
  }
  frames_.reset();
  return it->second;
}

}  // namespace gpuscope::report
