// Thin RAII owners for SQLite handles; errors become gpuscope::Error with SQLite's message.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "common/error.h"

namespace gpuscope::store {

class Stmt;

// An error SQLite reported, with its own words apart (reason) for messages that say more.
class SqliteError : public Error {
 public:
  SqliteError(const std::string& where, std::string reason, int code = 0)
      : Error("{}: {}", where, reason), reason_(std::move(reason)), code_(code) {}
  const std::string& reason() const { return reason_; }
  // SQLITE_FULL: the disk (or the user's quota) is full.
  bool disk_full() const;

 private:
  std::string reason_;
  int code_ = 0;  // SQLite's primary result code, 0 if not known
};

class Db {
 public:
  enum class Mode { ReadOnly, Create };
  Db(const std::string& path, Mode mode);
  ~Db();
  Db(Db&& o) noexcept : db_(o.db_), path_(std::move(o.path_)) { o.db_ = nullptr; }
  Db& operator=(Db&& o) noexcept;
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  void exec(const std::string& sql);
  Stmt prepare(std::string_view sql);
  // Tables and columns added to the format later are missing from older records.
  bool has_table(std::string_view table);
  bool has_column(std::string_view table, std::string_view column);
  void close();  // its statements finalized first
  int64_t last_insert_rowid() const { return sqlite3_last_insert_rowid(db_); }
  sqlite3* handle() const { return db_; }
  const std::string& path() const { return path_; }

 private:
  sqlite3* db_ = nullptr;
  std::string path_;
};

class Stmt {
 public:
  Stmt() = default;  // none yet: assign a prepared one
  Stmt(sqlite3* db, std::string_view sql);
  ~Stmt();
  Stmt(Stmt&& o) noexcept : db_(o.db_), st_(o.st_) { o.st_ = nullptr; }
  Stmt& operator=(Stmt&& o) noexcept;
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  Stmt& bind(int i, int64_t v);
  Stmt& bind(int i, uint64_t v) { return bind(i, static_cast<int64_t>(v)); }
  Stmt& bind(int i, int v) { return bind(i, static_cast<int64_t>(v)); }
  Stmt& bind(int i, uint32_t v) { return bind(i, static_cast<int64_t>(v)); }
  Stmt& bind(int i, double v);
  Stmt& bind(int i, std::string_view v);
  Stmt& bind_null(int i);
  // Steps once: true while a row is available.
  bool step();
  // Runs a statement that returns no rows, then resets it for reuse.
  void run();
  void reset();

  int64_t i64(int col) const { return sqlite3_column_int64(st_, col); }
  double f64(int col) const { return sqlite3_column_double(st_, col); }
  std::string str(int col) const;
  bool is_null(int col) const { return sqlite3_column_type(st_, col) == SQLITE_NULL; }

 private:
  sqlite3* db_ = nullptr;
  sqlite3_stmt* st_ = nullptr;
};

}  // namespace gpuscope::store
