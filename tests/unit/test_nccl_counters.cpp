// The agent's NCCL series: counted by communicator (the identity its ranks share), rank and
// collective; failures apart.
#include <gtest/gtest.h>

#include "agent/nccl_counters.h"
#include "cuda/functions.h"

using namespace gpuscope;

namespace {

CallEvent nccl_call(const char* symbol, uint64_t comm, int64_t ret = 0, uint64_t bytes = 0) {
  CallEvent e;
  e.func = cuda::function_by_symbol(symbol)->id;
  e.has_return = true;
  e.ret = ret;
  e.bytes = bytes;
  e.duration_ns = 20'000;
  e.nccl = NcclArgs{};
  e.nccl->comm = comm;
  return e;
}

std::string label(const agent::Labels& l, const std::string& key) {
  for (const auto& [k, v] : l)
    if (k == key) return v;
  return "<none>";
}

}  // namespace

TEST(NcclCounters, CollectivesCountUnderTheirCommunicatorAndRank) {
  agent::NcclCounters c;
  auto init = nccl_call("ncclCommInitRank", 0xa0);
  init.nccl->rank = 1;
  init.nccl->nranks = 4;
  init.nccl->id_hash = 0xbeef;
  c.add(init, *cuda::function_by_id(init.func));
  for (int i = 0; i < 3; ++i) {
    const auto e = nccl_call("ncclAllReduce", 0xa0, 0, 4096);
    c.add(e, *cuda::function_by_id(e.func));
  }
  const auto failed = nccl_call("ncclSend", 0xa0, 5, 64);
  c.add(failed, *cuda::function_by_id(failed.func));
  const auto elsewhere = nccl_call("ncclAllGather", 0xb0, 0, 100);  // a communicator made before the agent came
  c.add(elsewhere, *cuda::function_by_id(elsewhere.func));

  auto families = agent::NcclCounters::make_families();
  c.append({{"pid", "7"}}, {&families[0], &families[1], &families[2], &families[3]});
  ASSERT_EQ(families[0].name, "gpuscope_nccl_calls_total");
  ASSERT_EQ(families[0].samples.size(), 2u);
  const auto& ar = families[0].samples[0];
  EXPECT_EQ(label(ar.labels, "pid"), "7");
  EXPECT_EQ(label(ar.labels, "communicator"), "000000000000beef");
  EXPECT_EQ(label(ar.labels, "rank"), "1");
  EXPECT_EQ(label(ar.labels, "ranks"), "4");
  EXPECT_EQ(label(ar.labels, "collective"), "AllReduce");
  EXPECT_EQ(ar.value, 3);
  EXPECT_EQ(families[1].samples[0].value, 3 * 4096);
  EXPECT_NEAR(families[2].samples[0].value, 3 * 20e-6, 1e-12);
  const auto& ag = families[0].samples[1];
  EXPECT_EQ(label(ag.labels, "collective"), "AllGather");
  EXPECT_EQ(label(ag.labels, "communicator"), "");
  EXPECT_EQ(label(ag.labels, "rank"), "");
  // The failed send: a failure, no call, no bytes.
  ASSERT_EQ(families[3].samples.size(), 1u);
  EXPECT_EQ(label(families[3].samples[0].labels, "collective"), "Send");
  EXPECT_EQ(families[3].samples[0].value, 1);
  for (const auto& s : families[1].samples) EXPECT_NE(label(s.labels, "collective"), "Send");
}
