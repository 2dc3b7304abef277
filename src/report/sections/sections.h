// The report's sections, one file each in this folder, each with the query that builds its part of
// build_report()'s JSON and the text rendering of that part; report.cpp lists them in order.
// Instants in the JSON count from the recording's start (Record::origin).
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "report/call_sites.h"
#include "report/sections/gpu_time.h"  // the GPU time section (record --gpu-times)
#include "report/sections/record_view.h"
#include "store/record_reader.h"
#include "store/sqlite.h"
#include "symbolize/symbolizer.h"

namespace gpuscope::report {

// summary.cpp: the recording, its processes, its calls by kind and the CUDA libraries attached.
nlohmann::json summary(store::RecordReader& rec, const Record& r, const std::map<int64_t, FunctionStats>& stats);
void summary_text(std::string& out, const nlohmann::json& s);

// kernels.cpp: the most launched kernels, with their grid/block shapes and call sites.
nlohmann::json kernels(const Record& r, CallSites& stacks, size_t top);
void kernels_text(std::string& out, const nlohmann::json& k);

// copies.cpp: copies by direction and host memory.
nlohmann::json copies(const Record& r);
void copies_text(std::string& out, const nlohmann::json& copies);

// memory.cpp: one replay of the allocations and frees makes three sections: device and pinned
// memory per process, what was never freed, and where the most bytes were allocated.
struct MemoryReport {
  nlohmann::json processes = nlohmann::json::array();
  nlohmann::json leaks;
  nlohmann::json allocation_sites;  // where the most bytes were allocated
};
MemoryReport memory(const Record& r, CallSites& stacks, size_t top);
void memory_text(std::string& out, const nlohmann::json& memory);
void leaks_text(std::string& out, const nlohmann::json& leaks);
void allocation_sites_text(std::string& out, const nlohmann::json& sites);

// errors.cpp: failed calls by function and return code.
nlohmann::json errors(const Record& r);
void errors_text(std::string& out, const nlohmann::json& errors);

// communication.cpp: NCCL's collectives and sends per process, communicator and function.
nlohmann::json communication(const Record& r);
void communication_text(std::string& out, const nlohmann::json& comm);
// rdma.cpp: RDMA verbs per process and QP: peer, state, work requests by opcode, bytes, completions,
// errors, post-to-completion latency; memory registrations; where verbs were bypassed.
nlohmann::json rdma(const Record& r);
void rdma_text(std::string& out, const nlohmann::json& rdma);

// sync.cpp: time spent in synchronisation calls.
nlohmann::json sync(const Record& r, const std::map<int64_t, FunctionStats>& stats);
void sync_text(std::string& out, const nlohmann::json& sync);

// cpu.cpp: with --cpu-profile, where the sampled CPU time went, by function, from the same named
// stacks as the CPU flame graph. Null when the record has no samples.
nlohmann::json cpu_profile(store::RecordReader& rec, symbolize::Symbolizer& sym, size_t top);
void cpu_text(std::string& out, const nlohmann::json& cpu);

// gpus.cpp: NVML's view of each GPU over the recording, and each recorded process's share of it.
nlohmann::json gpus(store::RecordReader& rec, const Record& r);
void gpus_text(std::string& out, const nlohmann::json& g);

// lost.cpp: events the recorder lost, by cause. The counts are written when a recording ends: one
// cut short has none.
nlohmann::json lost(store::Db& db);
void lost_text(std::string& out, const nlohmann::json& lost);

}  // namespace gpuscope::report
