#include "store/record_reader.h"

#include <charconv>
#include <filesystem>

#include "common/error.h"
#include "store/schema.h"

namespace gpuscope::store {
namespace {

Db open_db(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw Error("record file '{}' does not exist", path);
  if (std::filesystem::is_directory(path, ec)) throw Error("'{}' is a directory, not a record file", path);
  // A recording that was killed leaves its write-ahead log beside the file; opening it for
  // writing lets SQLite fold the committed part back in.
  const bool has_wal = std::filesystem::exists(path + "-wal", ec);
  return Db(path, has_wal ? Db::Mode::Create : Db::Mode::ReadOnly);
}

}  // namespace

RecordReader::RecordReader(const std::string& path) : db_(open_db(path)), path_(path) {
  try {
    auto st = db_.prepare("SELECT key, value FROM meta");
    while (st.step()) meta_[st.str(0)] = st.str(1);
    db_.exec("SELECT count(*) FROM calls");
  } catch (const SqliteError& e) {
    throw Error("'{}' is not a readable gpuscope record ({}); it may be truncated or another kind of file", path,
                e.reason());
  }
  if (meta("format") != kFormatName)
    throw Error("'{}' is an SQLite file but not a gpuscope record (no format marker)", path);
  int version = 0;
  try {
    version = std::stoi(meta("schema_version", "0"));
  } catch (...) {
  }
  if (version > kSchemaVersion)
    throw Error("'{}' uses record format {}, newer than this gpuscope reads ({}); upgrade gpuscope", path, version,
                kSchemaVersion);
  if (version < 1) throw Error("'{}' has an invalid record format version '{}'", path, meta("schema_version"));
}

int64_t RecordReader::meta_i64(const std::string& key, int64_t fallback) const {
  auto it = meta_.find(key);
  if (it == meta_.end()) return fallback;
  int64_t v = 0;
  const auto& text = it->second;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size())
    throw Error("'{}' is damaged: its meta value {} is '{}', not a whole number", path_, key, text.substr(0, 40));
  return v;
}

std::string RecordReader::meta(const std::string& key, const std::string& fallback) const {
  auto it = meta_.find(key);
  return it == meta_.end() ? fallback : it->second;
}

}  // namespace gpuscope::store
