#include "report/stored_stacks.h"

namespace gpuscope::report {

std::string base_name(const std::string& path) { return path.substr(path.rfind('/') + 1); }

bool has_table(store::Db& db, const char* name) {
  auto q = db.prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1");
  q.bind(1, std::string_view(name));
  return q.step();
}

StoredStacks::StoredStacks(store::Db& db)
    : frames_(db.prepare("SELECT f.module_id, f.offset, f.ip, m.path, m.build_id, f.depth FROM stack_frames f "
                         "LEFT JOIN modules m ON m.id = f.module_id WHERE f.stack_id = ?1 ORDER BY f.depth")) {
  if (!has_table(db, "symbols")) return;  // written before the table existed
  auto q = db.prepare("SELECT module_id, offset, name FROM symbols");
  while (q.step()) recorded_[{q.i64(0), uint64_t(q.i64(1))}] = q.str(2);
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
    }
    it->second.push_back(std::move(f));
  }
  frames_.reset();
  return it->second;
}

}  // namespace gpuscope::report
