// Where a record is written (store/record_writer.h): -o is replaced only once recording has begun,
// by a regular file only, and a record under way is readable from its one file.
#include <gtest/gtest.h>
#include <fmt/format.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "store/record_writer.h"

using namespace gpuscope;

namespace {

std::filesystem::path fresh_dir(const char* name) {
  auto d = std::filesystem::temp_directory_path() / fmt::format("gpuscope_writer_{}_{}", name, getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

std::string read_all(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

int64_t count(const std::filesystem::path& p, const char* sql) {
  sqlite3* db = nullptr;
  int64_t n = -1;
  if (sqlite3_open_v2(p.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK) {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db, sql, -1, &st, nullptr) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
      n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
  }
  sqlite3_close(db);
  return n;
}

}  // namespace

TEST(RecordWriter, ARecordingThatNeverBeganLeavesThePathAsItWas) {
  const auto dir = fresh_dir("never");
  const auto path = dir / "prev.gpuscope";
  std::ofstream(path) << "an earlier record";
  {
    store::RecordWriter w(path.string());
    w.set_meta("mode", "command");
    w.commit();
    w.discard();
  }
  EXPECT_EQ(read_all(path), "an earlier record");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 1);  // nothing left beside it
  std::filesystem::remove_all(dir);
}

TEST(RecordWriter, TheRecordTakesThePlaceOnceKeptAndStaysReadableWhileWritten) {
  const auto dir = fresh_dir("kept");
  const auto path = dir / "run.gpuscope";
  std::ofstream(path) << "an earlier record";
  store::RecordWriter w(path.string());
  w.keep();
  w.set_meta("mode", "command");
  w.commit();
  // Moved into place with the next batch written, folded into the one file a checkpoint later.
  for (int i = 0; i < 300 && count(path, "SELECT count(*) FROM meta WHERE key = 'mode'") != 1; ++i) usleep(10'000);
  EXPECT_EQ(count(path, "SELECT count(*) FROM meta WHERE key = 'mode'"), 1);
  EXPECT_GT(count(path, "SELECT count(*) FROM functions"), 100);
  w.set_meta("later", "1");
  w.commit();
  for (int i = 0; i < 300 && count(path, "SELECT count(*) FROM meta WHERE key = 'later'") != 1; ++i) usleep(10'000);
  EXPECT_EQ(count(path, "SELECT count(*) FROM meta WHERE key = 'later'"), 1);
  w.finish();
  EXPECT_EQ(count(path, "SELECT count(*) FROM meta WHERE key = 'complete' AND value = '1'"), 1);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 1);  // no -wal, no temporary file
  std::filesystem::remove_all(dir);
}

TEST(RecordWriter, RefusesWhatIsNotARegularFile) {
  const auto dir = fresh_dir("refuse");
  EXPECT_THROW(store::RecordWriter(""), Error);
  EXPECT_THROW(store::RecordWriter("/dev/null"), Error);
  EXPECT_THROW(store::RecordWriter(dir.string()), Error);
  EXPECT_TRUE(std::filesystem::is_directory(dir));
  EXPECT_TRUE(std::filesystem::is_character_file("/dev/null"));
  std::filesystem::remove_all(dir);
}

TEST(RecordWriter, TemporariesOfADeadRecorderGoAndAnEarlierRecordsLogIsNotReadAsOurs) {
  const auto dir = fresh_dir("stale");
  const auto path = dir / "run.gpuscope";
  // A gpuscope killed before its record took the place left its temporary files: the PID in
  // their name is no process's now (a child reaped). A live process's are left alone.
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  waitpid(dead, nullptr, 0);
  const auto stale = dir / fmt::format(".run.gpuscope.gpuscope-{}.partial", dead);
  const auto live = dir / fmt::format(".run.gpuscope.gpuscope-{}.partial", getppid());
  // Space held aside by a named file where O_TMPFILE is refused, killed before its unlink.
  const auto stale_reserve = dir / fmt::format(".run.gpuscope.gpuscope-{}.reserve", dead);
  // Not gpuscope's: kept whatever its PID.
  const auto other = dir / fmt::format(".run.gpuscope.gpuscope-{}.mine", dead);
  for (const auto& p : {stale, live, stale_reserve, other}) std::ofstream(p) << "x";
  std::ofstream(stale.string() + "-wal") << "x";
  // An earlier record killed with its log beside it: not to be applied to the new record.
  std::ofstream(path) << "an earlier record";
  std::ofstream(path.string() + "-wal") << "an earlier record's log";
  {
    store::RecordWriter w(path.string());
    w.keep();
    w.set_meta("mode", "command");
    w.finish();
  }
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_FALSE(std::filesystem::exists(stale.string() + "-wal"));
  EXPECT_FALSE(std::filesystem::exists(stale_reserve));
  EXPECT_TRUE(std::filesystem::exists(other));
  EXPECT_TRUE(std::filesystem::exists(live));
  EXPECT_FALSE(std::filesystem::exists(path.string() + "-wal"));
  EXPECT_EQ(count(path, "SELECT count(*) FROM meta WHERE key = 'mode'"), 1);
  std::filesystem::remove_all(dir);
}
