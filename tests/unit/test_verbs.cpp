// RDMA verbs: records decoded (decode/verbs), completions matched to their posts for their latency
// (decode/verbs_tracker), on synthetic records and events.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "decode/verbs.h"
#include "decode/verbs_tracker.h"
#include "verbs_events.h"

#ifdef GPUSCOPE_HAVE_IBVERBS
#include <infiniband/verbs.h>
#endif

using namespace gpuscope;

namespace {

gs_verbs_record record(uint16_t op, uint64_t ts_ns) {
  gs_verbs_record r{};
  r.kind = GS_REC_VERBS;
  r.op = op;
  r.pid = 7;
  r.tid = 8;
  r.ts_ns = ts_ns;
  return r;
}

RdmaEvent decoded(const gs_verbs_record& r) {
  RdmaEvent e;
  EXPECT_TRUE(decode::decode_verbs(&r, sizeof(r), e));
  return e;
}

RdmaEvent post(uint16_t op, uint32_t qp, uint64_t ts_ns, std::vector<std::pair<uint64_t, uint8_t>> wrs) {
  auto r = record(op, ts_ns);
  r.a[0] = qp;
  r.a[1] = wrs.size();
  for (size_t i = 0; i < wrs.size(); ++i) {
    r.items[i].wr_id = wrs[i].first;
    r.items[i].send_flags = wrs[i].second;
    r.items[i].opcode = 2;  // IBV_WR_SEND
  }
  r.count = wrs.size();
  return decoded(r);
}

struct Wc {
  uint64_t wr_id;
  uint32_t qp;
  uint8_t status, opcode;
};
RdmaEvent poll(uint64_t ts_ns, uint64_t duration_ns, std::vector<Wc> wcs) {
  auto r = record(GS_VERBS_POLL_CQ, ts_ns);
  r.duration_ns = duration_ns;
  r.ret = wcs.size();
  for (size_t i = 0; i < wcs.size(); ++i) {
    r.items[i].wr_id = wcs[i].wr_id;
    r.items[i].qp_num = wcs[i].qp;
    r.items[i].status = wcs[i].status;
    r.items[i].opcode = wcs[i].opcode;
    r.items[i].bytes = 100 + i;
  }
  r.count = wcs.size();
  return decoded(r);
}

constexpr uint8_t kSignaled = 2, kRecv = 128;

}  // namespace

TEST(Verbs, PostSendDecodesEachWorkRequest) {
  auto r = record(GS_VERBS_POST_SEND, 1000);
  r.a[0] = 0x101;
  r.a[1] = 20;  // a longer list than carried
  r.flags = GS_VERBS_TRUNCATED;
  r.count = 2;
  r.items[0] = {0x21, 0, 512, 0, 0, 2, 0, 1, kSignaled};
  r.items[1] = {0x22, 0xdead0000, 1024, 0, 0x77, 0, 0, 2, 0};
  const RdmaEvent e = decoded(r);
  EXPECT_EQ(e.op, GS_VERBS_POST_SEND);
  EXPECT_EQ(e.pid, 7u);
  EXPECT_EQ(e.listed, 20u);
  EXPECT_EQ(e.flags, GS_VERBS_TRUNCATED);
  ASSERT_EQ(e.wrs.size(), 2u);
  EXPECT_EQ(e.wrs[0].wr_id, 0x21u);
  EXPECT_EQ(e.wrs[0].bytes, 512u);
  EXPECT_EQ(decode::wr_opcode_name(e.wrs[0].opcode), "send");
  EXPECT_EQ(e.wrs[1].remote_addr, 0xdead0000u);
  EXPECT_EQ(e.wrs[1].rkey, 0x77u);
  EXPECT_EQ(decode::wr_opcode_name(e.wrs[1].opcode), "rdma_write");
  EXPECT_EQ(e.wrs[1].num_sge, 2);
  EXPECT_TRUE(e.wcs.empty());
}

TEST(Verbs, RecordsShorterThanTheWireStructAreRefused) {
  const auto r = record(GS_VERBS_POLL_CQ, 1);
  RdmaEvent e;
  EXPECT_FALSE(decode::decode_verbs(&r, sizeof(r) - 1, e));
}

TEST(Verbs, ReceivesHaveNoOpcodeAndACountAboveTheCarriedItemsIsBounded) {
  auto r = record(GS_VERBS_POLL_CQ, 1);
  r.count = 999;  // corrupt: never read past the record
  const RdmaEvent e = decoded(r);
  EXPECT_EQ(e.wcs.size(), size_t(GS_VERBS_MAX_ITEMS));
  auto p = record(GS_VERBS_POST_RECV, 1);
  p.count = 1;
  p.items[0].opcode = 9;  // whatever was there: a receive has none
  EXPECT_EQ(decoded(p).wrs.at(0).opcode, 0);
}

TEST(VerbsTracker, SignalledSendsAndReceivesMatchTheirCompletions) {
  decode::VerbsTracker t;
  auto sends = post(GS_VERBS_POST_SEND, 0x101, 1000, {{0x21, kSignaled}, {0x22, 0}, {0x23, kSignaled}});
  t.process(sends);
  EXPECT_TRUE(sends.wrs[0].signaled);
  EXPECT_FALSE(sends.wrs[1].signaled);
  auto recvs = post(GS_VERBS_POST_RECV, 0x101, 1500, {{0x21, 0}});  // the same wr_id, the other queue
  t.process(recvs);
  EXPECT_TRUE(recvs.wrs[0].signaled);
  EXPECT_EQ(t.outstanding(), 3u);
  // Completions at the poll's return (ts + duration): the receive's wr_id does not take the send's.
  auto wcs = poll(4000, 500, {{0x21, 0x101, 0, kRecv}, {0x21, 0x101, 0, 0}, {0x22, 0x101, 0, 0}});
  t.process(wcs);
  ASSERT_TRUE(wcs.wcs[0].latency_ns);
  EXPECT_EQ(*wcs.wcs[0].latency_ns, 4500u - 1500u);
  EXPECT_FALSE(wcs.wcs[0].wr_opcode);
  ASSERT_TRUE(wcs.wcs[1].latency_ns);
  EXPECT_EQ(*wcs.wcs[1].latency_ns, 4500u - 1000u);
  EXPECT_EQ(wcs.wcs[1].wr_opcode, 2);
  EXPECT_FALSE(wcs.wcs[2].latency_ns);  // unsignalled: never waited for
  EXPECT_EQ(t.outstanding(), 1u);
}

TEST(VerbsTracker, AFailedCompletionMatchesEitherQueueAndAnotherQpNothing) {
  decode::VerbsTracker t;
  auto recvs = post(GS_VERBS_POST_RECV, 0x101, 100, {{5, 0}});
  t.process(recvs);
  // A flushed receive reports no valid opcode (0 here, a send's).
  auto wcs = poll(200, 0, {{5, 0x102, 5, 0}, {5, 0x101, 5, 0}});
  t.process(wcs);
  EXPECT_FALSE(wcs.wcs[0].latency_ns);
  ASSERT_TRUE(wcs.wcs[1].latency_ns);
  EXPECT_EQ(*wcs.wcs[1].latency_ns, 100u);
}

TEST(VerbsTracker, EverySendOfASqSigAllQpCompletes) {
  decode::VerbsTracker t;
  auto r = record(GS_VERBS_CREATE_QP, 1);
  r.ret = r.obj = 0x5000;
  r.a[0] = 0x102;
  r.a[2] = 1;  // sq_sig_all
  auto created = decoded(r);
  t.process(created);
  auto sends = post(GS_VERBS_POST_SEND, 0x102, 10, {{1, 0}});
  t.process(sends);
  EXPECT_TRUE(sends.wrs[0].signaled);
  auto other = post(GS_VERBS_POST_SEND, 0x103, 10, {{1, 0}});
  t.process(other);
  EXPECT_FALSE(other.wrs[0].signaled);
  auto wcs = poll(30, 0, {{1, 0x102, 0, 0}});
  t.process(wcs);
  EXPECT_EQ(wcs.wcs[0].latency_ns, 20u);
}

TEST(VerbsTracker, APostedWrIdPostedAgainIsMatchedToItsLatestPost) {
  decode::VerbsTracker t;
  for (uint64_t ts : {100, 300}) {
    auto p = post(GS_VERBS_POST_SEND, 1, ts, {{9, kSignaled}});
    t.process(p);
  }
  auto wcs = poll(400, 0, {{9, 1, 0, 0}});
  t.process(wcs);
  EXPECT_EQ(wcs.wcs[0].latency_ns, 100u);
}

TEST(VerbsTracker, BoundedAndForgetsAProcess) {
  decode::VerbsTracker t;
  for (uint64_t i = 0; i < decode::VerbsTracker::kMaxOutstanding + 3; ++i) {
    auto p = post(GS_VERBS_POST_RECV, 1, i, {{i, 0}});
    t.process(p);
  }
  EXPECT_EQ(t.outstanding(), decode::VerbsTracker::kMaxOutstanding);
  EXPECT_EQ(t.dropped(), 3u);
  t.forget(7);
  EXPECT_EQ(t.outstanding(), 0u);
}

TEST(Verbs, NamesOfStatesTypesAndOpcodes) {
  EXPECT_EQ(decode::qp_state_name(3), "RTS");
  EXPECT_EQ(decode::qp_state_name(99), "");
  EXPECT_EQ(decode::qp_type_name(2), "RC");
  EXPECT_EQ(decode::wc_opcode_name(128), "recv");
  EXPECT_EQ(decode::wr_opcode_name(6), "atomic_fetch_and_add");
  EXPECT_EQ(decode::verbs_function_name(GS_VERBS_MODIFY_QP), "ibv_modify_qp");
  EXPECT_EQ(decode::wc_status_name(200), "unknown");
}

#ifdef GPUSCOPE_HAVE_IBVERBS
TEST(Verbs, CompletionStatusesAreNamedAsLibibverbsNamesThem) {
  for (int s = 0; s <= 255; ++s)
    EXPECT_EQ(decode::wc_status_name(static_cast<uint8_t>(s)), ibv_wc_status_str(static_cast<ibv_wc_status>(s)))
        << s;
}
#endif
