#include "store/sqlite.h"

namespace gpuscope::store {

bool SqliteError::disk_full() const { return (code_ & 0xff) == SQLITE_FULL; }

Db::Db(const std::string& path, Mode mode) : path_(path) {
  // Memory statistics take a global mutex on every allocation; nothing here reads them.
  static const bool configured = sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0) == SQLITE_OK;
  (void)configured;
  // One thread uses a connection at a time: no per-call mutex (it cost a fifth of the writer's time).
  const int flags = SQLITE_OPEN_NOMUTEX |
                    (mode == Mode::ReadOnly ? SQLITE_OPEN_READONLY : (SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE));
  if (sqlite3_open_v2(path.c_str(), &db_, flags, nullptr) != SQLITE_OK) {
    std::string msg = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    db_ = nullptr;
    throw Error("cannot open record file '{}': {}", path, msg);
  }
  sqlite3_busy_timeout(db_, 2000);
}

Db::~Db() { sqlite3_close_v2(db_); }

// close_v2: a statement still open (one its owner forgot to finalize first) keeps the connection
// until it is finalized, where sqlite3_close would fail and leak it.
void Db::close() {
  sqlite3_close_v2(db_);
  db_ = nullptr;
}

Db& Db::operator=(Db&& o) noexcept {
  if (this != &o) {
    sqlite3_close_v2(db_);
    db_ = o.db_;
    path_ = std::move(o.path_);
    o.db_ = nullptr;
  }
  return *this;
}

void Db::exec(const std::string& sql) {
  char* err = nullptr;
  if (const int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err); rc != SQLITE_OK) {
    std::string msg = err ? err : sqlite3_errmsg(db_);
    sqlite3_free(err);
    throw SqliteError(fmt::format("record file '{}'", path_), msg, rc);
  }
}

Stmt Db::prepare(std::string_view sql) { return Stmt(db_, sql); }

bool Db::has_table(std::string_view table) {
  auto q = prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1");
  q.bind(1, table);
  return q.step();
}

bool Db::has_column(std::string_view table, std::string_view column) {
  auto q = prepare("SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2");
  q.bind(1, table).bind(2, column);
  return q.step();
}

Stmt::Stmt(sqlite3* db, std::string_view sql) : db_(db) {
  if (sqlite3_prepare_v3(db, sql.data(), static_cast<int>(sql.size()), SQLITE_PREPARE_PERSISTENT, &st_, nullptr) !=
      SQLITE_OK)
    throw SqliteError("record file", sqlite3_errmsg(db));
}

Stmt::~Stmt() { sqlite3_finalize(st_); }

Stmt& Stmt::operator=(Stmt&& o) noexcept {
  if (this != &o) {
    sqlite3_finalize(st_);
    db_ = o.db_;
    st_ = o.st_;
    o.st_ = nullptr;
  }
  return *this;
}

Stmt& Stmt::bind(int i, int64_t v) {
  sqlite3_bind_int64(st_, i, v);
  return *this;
}
Stmt& Stmt::bind(int i, double v) {
  sqlite3_bind_double(st_, i, v);
  return *this;
}
Stmt& Stmt::bind(int i, std::string_view v) {
  sqlite3_bind_text(st_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  return *this;
}
Stmt& Stmt::bind_null(int i) {
  sqlite3_bind_null(st_, i);
  return *this;
}

bool Stmt::step() {
  const int rc = sqlite3_step(st_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  throw SqliteError("record file", sqlite3_errmsg(db_), rc);
}

void Stmt::run() {
  while (step()) {
  }
  reset();
}

void Stmt::reset() {
  sqlite3_reset(st_);
  sqlite3_clear_bindings(st_);
}

std::string Stmt::str(int col) const {
  const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(st_, col));
  return p ? std::string(p, sqlite3_column_bytes(st_, col)) : std::string();
}

}  // namespace gpuscope::store
