// The record as the report's sections read it: its functions and processes, the span it covers,
// how its stacks were taken, and each function's call counts and times (one pass over all calls,
// shared by the sections that need them).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "cuda/functions.h"
#include "store/record_reader.h"
#include "store/sqlite.h"

namespace gpuscope::report {

// What the record holds beside the calls: its functions, as it names them, and its processes.

struct Function {
  std::string name;
  cuda::Api api;
  std::string kind;
};
using Functions = std::map<int64_t, Function>;

// "1,5,7": the ids of the functions of some kinds, for an IN (...) list.
std::string ids_of(const Functions& fns, std::initializer_list<std::string_view> kinds);

struct Process {
  std::string comm, cmdline;
  std::optional<int64_t> first_seen_ns, exit_ns, exit_code;
};

struct Record {
  store::Db& db;
  Functions functions;
  std::map<int64_t, Process> processes;
  int64_t origin = 0;  // the recording's start: every instant in the report counts from it
  int64_t end = 0;     // its end, or for one cut short the end of the last committed call
  // record --stack-every: stacks were taken for one launch, copy or memset in this many, and
  // the SQL over `calls c` of what each row's stack stands for (call_stack_weight_sql).
  int64_t stack_every = 1;
  double stack_budget = 0;  // record --stack-budget: N was chosen per process, stack_every the largest
  std::string stack_weight;

  const Function* function(int64_t id) const {
    auto it = functions.find(id);
    return it == functions.end() ? nullptr : &it->second;
  }
};

// Reads the functions and processes, and bounds the recording (its meta, else its first and last calls).
Record read_record(store::RecordReader& rec);

struct FunctionStats {
  int64_t calls = 0, nested = 0, total_ns = 0, max_ns = 0;
};

// SQLite groups by sorting every row, seconds for millions of calls: the passes over all calls (here)
// and over all launches (kernels.cpp) count in hash maps instead.

// Per function: its top-level calls with their durations, and how many more were made inside
// runtime calls.
std::map<int64_t, FunctionStats> function_stats(store::Db& db);

}  // namespace gpuscope::report
