// The ranks of an NCCL communicator seen together: who reaches each collective last, what it costs
// the others, and diagnose's straggler finding on a crafted two-rank record.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fmt/format.h>

#include <filesystem>
#include <functional>
#include <optional>

#include "cuda/functions.h"
#include "diagnose/analysis.h"
#include "diagnose/stragglers.h"
#include "store/record_reader.h"
#include "store/record_writer.h"

using namespace gpuscope;

namespace {

diagnose::RankCalls calls(uint32_t pid, int64_t rank, uint64_t start, uint64_t period, size_t n,
                          std::function<uint64_t(size_t)> late = [](size_t) { return 0; }) {
  diagnose::RankCalls r{pid, rank, {}};
  for (size_t k = 0; k < n; ++k) r.ts_ns.push_back(start + k * period + late(k));
  return r;
}

}  // namespace

TEST(RankSkew, TheRankLastAtMostCollectivesIsTheStraggler) {
  // Rank 2 comes 2 ms after the others at 8 of 10 all-reduces; rank 0 is last by 1 µs at the rest.
  auto r2 = calls(12, 2, 1'000'000, 10'000'000, 10, [](size_t k) { return k % 5 == 0 ? 0 : 2'000'000; });
  auto r0 = calls(10, 0, 1'000'000, 10'000'000, 10, [](size_t k) { return k % 5 == 0 ? 1'000 : 0; });
  auto r1 = calls(11, 1, 1'000'000, 10'000'000, 11);  // one more call, unmatched
  const auto s = diagnose::rank_skew("abc", 3, {r2, r0, r1});
  EXPECT_EQ(s.collectives, 10u);
  ASSERT_EQ(s.ranks.size(), 3u);
  EXPECT_EQ(s.ranks[0].rank, 0);  // by rank
  EXPECT_EQ(s.ranks[2].pid, 12u);
  EXPECT_EQ(s.ranks[2].last, 8u);
  EXPECT_EQ(s.ranks[0].last, 2u);
  EXPECT_EQ(s.straggler, 2);
  EXPECT_NEAR(s.ranks[2].mean_lag_ms, 8 * 2.0 / 10, 1e-9);
  // Rank 1 waited 2 ms at each of the 8 and 1 µs at the 2 others.
  EXPECT_NEAR(s.ranks[1].waited_ms, 8 * 2.0 + 2 * 0.001, 1e-9);
  EXPECT_NEAR(s.ranks[2].waited_ms, 2 * 0.001, 1e-9);
  EXPECT_EQ(s.ranks[1].first_ns, 1'000'000u);
  EXPECT_EQ(s.ranks[1].last_ns, 1'000'000u + 9 * 10'000'000u);
}

TEST(RankSkew, NoStragglerWhereTheLastRankTakesTurns) {
  auto r0 = calls(10, 0, 0, 1'000'000, 10, [](size_t k) { return k % 2 ? 500'000 : 0; });
  auto r1 = calls(11, 1, 0, 1'000'000, 10, [](size_t k) { return k % 2 ? 0 : 500'000; });
  EXPECT_EQ(diagnose::rank_skew("abc", 2, {r0, r1}).straggler, -1);
  // One rank alone says nothing.
  const auto one = diagnose::rank_skew("abc", 2, {r0});
  EXPECT_EQ(one.collectives, 0u);
  EXPECT_EQ(one.straggler, -1);
}

namespace {

// Two ranks (processes 200 and 201) of one communicator, 40 steps of 10 ms: 20 launches and an
// all-reduce a step; rank 1 calls its all-reduce `late_ns` after rank 0.
std::string two_ranks(const std::string& name, uint64_t late_ns) {
  const std::string path =
      (std::filesystem::temp_directory_path() / fmt::format("gpuscope_stragglers_{}_{}", name, getpid())).string();
  std::filesystem::remove(path);
  store::RecordWriter w(path);
  w.set_meta("start_ns", "0");
  int64_t id = 1;
  for (uint32_t rank : {0u, 1u}) {
    const uint32_t pid = 200 + rank;
    w.upsert_process(pid, 1, "python3", "python3 train.py", "/usr/bin/python3", 0);
    auto call = [&](std::string_view fn, uint64_t ts, std::optional<NcclArgs> nccl = std::nullopt) {
      CallEvent e;
      e.call_id = id++;
      e.func = cuda::function_by_symbol(fn)->id;
      e.pid = pid;
      e.tid = pid;
      e.ts_ns = ts;
      e.duration_ns = 5'000;
      e.has_return = true;
      e.nccl = nccl;
      w.add_call(e);
    };
    NcclArgs init;
    init.comm = 0xc000 + rank;  // each process's own handle
    init.rank = int32_t(rank);
    init.nranks = 2;
    init.id_hash = 0x5eed;
    call("ncclCommInitRank", 500'000, init);
    for (uint64_t s = 0; s < 40; ++s) {
      const uint64_t t = 1'000'000 + s * 10'000'000;
      for (int k = 0; k < 20; ++k) call("cudaLaunchKernel", t + 50'000 + uint64_t(k) * 20'000);
      NcclArgs ar;
      ar.comm = init.comm;
      ar.count = 1 << 20;
      ar.datatype = 7;  // float32
      ar.op = 0;
      call("ncclAllReduce", t + 600'000 + (rank == 1 ? late_ns : 0), ar);
    }
  }
  w.finish();
  return path;
}

const diagnose::Finding* finding(const diagnose::Diagnosis& d, uint32_t pid, const std::string& cause) {
  for (const auto& p : d.processes)
    if (p.pid == pid)
      for (const auto& f : p.findings)
        if (f.cause == cause) return &f;
  return nullptr;
}

}  // namespace

TEST(Stragglers, TheRankThatWaitsGetsAFindingNamingTheLateRank) {
  const std::string path = two_ranks("late", 3'000'000);
  store::RecordReader rec(path);
  const auto comms = diagnose::read_rank_skew(rec);
  ASSERT_EQ(comms.size(), 1u);
  EXPECT_EQ(comms[0].comm_id, "0000000000005eed");
  EXPECT_EQ(comms[0].nranks, 2);
  EXPECT_EQ(comms[0].collectives, 40u);
  ASSERT_EQ(comms[0].straggler, 1);
  EXPECT_EQ(comms[0].ranks[1].pid, 201u);
  EXPECT_NEAR(comms[0].ranks[1].mean_lag_ms, 3.0, 1e-6);

  const auto d = diagnose::diagnose(rec);
  const auto* f = finding(d, 200, "straggler");
  ASSERT_NE(f, nullptr);
  // 3 ms of each 10 ms step, over the 39 steps between its first all-reduce and its last.
  EXPECT_NEAR(f->share, 40 * 3.0 / (39 * 10.0), 1e-6);
  EXPECT_NE(f->evidence.find("rank 1"), std::string::npos) << f->evidence;
  EXPECT_NE(f->evidence.find("40 of the 40 collectives"), std::string::npos) << f->evidence;
  EXPECT_EQ(finding(d, 201, "straggler"), nullptr);  // the late rank waits for no one
  for (const auto& p : d.processes)
    if (p.pid == 200) EXPECT_EQ(p.findings.front().cause, "straggler");
  std::filesystem::remove(path);
}

TEST(Stragglers, RanksThatArriveTogetherHaveNoFinding) {
  const std::string path = two_ranks("together", 100'000);  // 0.1 ms of a 10 ms step: 1%
  store::RecordReader rec(path);
  const auto d = diagnose::diagnose(rec);
  EXPECT_EQ(finding(d, 200, "straggler"), nullptr);
  EXPECT_EQ(finding(d, 201, "straggler"), nullptr);
  std::filesystem::remove(path);
}
