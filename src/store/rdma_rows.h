// The record's RDMA verbs tables (rdma_calls, rdma_work_requests, rdma_completions; see
// docs/record-format.md): RdmaEvents as rows. Owned by the RecordWriter, run on its thread.
#pragma once

#include <cstdint>

#include "common/rdma.h"
#include "store/sqlite.h"

namespace gpuscope::store {

class RdmaRows {
 public:
  void prepare(Db& db);
  void close();
  void insert(const RdmaEvent& e);

 private:
  void insert_call(const RdmaEvent& e);
  Stmt call_, wr_, wc_;
  int64_t next_post_ = 1;
};

}  // namespace gpuscope::store
