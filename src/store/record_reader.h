// Opens a record file for reading, after checking that it is one this version understands.
#pragma once

#include <map>
#include <string>

#include "store/sqlite.h"

namespace gpuscope::store {

class RecordReader {
 public:
  // Throws Error with a message a user can act on: missing, not a record, truncated, too new.
  explicit RecordReader(const std::string& path);

  Db& db() { return db_; }
  const std::map<std::string, std::string>& meta() const { return meta_; }
  std::string meta(const std::string& key, const std::string& fallback = "") const;
  // A meta value that is a number; `fallback` when absent. Throws Error naming the damage when
  // it is not one (a record edited or corrupted by hand).
  int64_t meta_i64(const std::string& key, int64_t fallback = 0) const;
  // False when the recording was cut short (gpuscope killed): what was committed is still there.
  bool complete() const { return meta("complete") == "1"; }

 private:
  Db db_;
  std::map<std::string, std::string> meta_;
  std::string path_;
};

}  // namespace gpuscope::store
