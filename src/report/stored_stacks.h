// The stacks stored in a record, frame by frame as the recorder wrote them, with the names it
// already knew (kernel functions, the truncation marker). Shared by the report and the flame
// graphs, which name the frames each in their own way. Each stack is read once.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "store/sqlite.h"

namespace gpuscope::report {

struct PythonFrameRow {
  std::string function, file;
  int64_t line = 0;
  // "qualname (file:line)", the file shortened to what follows site-packages/ or the standard
  // library's folder.
  std::string text() const;
};

struct StoredFrameRow {
  bool in_file = false;  // false: the address fell in no file-backed mapping
  std::string path, build_id;
  uint64_t offset = 0, ip = 0;
  int64_t depth = 0;                          // 0: innermost (later ones are return addresses)
  const std::string* recorded_name = nullptr;  // named while recording (symbols table)
  const PythonFrameRow* python = nullptr;      // a Python frame (module "[python]")
  bool kernel() const { return path == "[kernel]"; }
};

class StoredStacks {
 public:
  explicit StoredStacks(store::Db& db);
  // Innermost first; empty for stack id 0 (none captured).
  const std::vector<StoredFrameRow>& operator()(int64_t stack_id);

 private:
  store::Stmt frames_;
  std::map<std::pair<int64_t, uint64_t>, std::string> recorded_;  // (module id, offset) -> name
  std::unordered_map<int64_t, PythonFrameRow> python_;             // python_frames by id
  std::unordered_map<int64_t, std::vector<StoredFrameRow>> cache_;
};

std::string base_name(const std::string& path);
// A Python source path as frames show it: after site-packages/ or lib/pythonX.Y/, else whole.
std::string short_python_path(const std::string& path);
// How many calls a call row's stack stands for, as SQL over `calls c`: N for a launch, copy or
// memset whose stack was taken under `record --stack-every N`, 0 for one left out, 1 otherwise
// (and in records from before the column).
std::string call_stack_weight_sql(store::Db& db);
// How many copies a copy row made, as SQL over `calls c`: a batch copy's count, 1 otherwise (and
// in records from before the column).
std::string call_copies_sql(store::Db& db);

}  // namespace gpuscope::report
