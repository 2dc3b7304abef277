// The record file's schema (docs/record-format.md explains every table and column).
#pragma once

namespace gpuscope::store {

inline constexpr int kSchemaVersion = 1;
inline constexpr const char* kFormatName = "gpuscope-record";

inline constexpr const char* kSchemaSql = R"sql(
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE functions(id INTEGER PRIMARY KEY, name TEXT NOT NULL, api TEXT NOT NULL, kind TEXT NOT NULL);
CREATE TABLE processes(pid INTEGER PRIMARY KEY, ppid INTEGER, comm TEXT, cmdline TEXT, exe TEXT,
                       first_seen_ns INTEGER, exit_ns INTEGER, exit_code INTEGER);
CREATE TABLE threads(tid INTEGER PRIMARY KEY, pid INTEGER NOT NULL, comm TEXT);
CREATE TABLE libraries(id INTEGER PRIMARY KEY, pid INTEGER, path TEXT NOT NULL, build_id TEXT,
                       runtime_probes INTEGER, driver_probes INTEGER, ts_ns INTEGER, error TEXT);
CREATE TABLE modules(id INTEGER PRIMARY KEY, path TEXT NOT NULL, build_id TEXT NOT NULL, UNIQUE(path, build_id));
CREATE TABLE stacks(id INTEGER PRIMARY KEY, depth INTEGER NOT NULL);
CREATE TABLE stack_frames(stack_id INTEGER NOT NULL, depth INTEGER NOT NULL, module_id INTEGER, offset INTEGER,
                          ip INTEGER NOT NULL, PRIMARY KEY(stack_id, depth)) WITHOUT ROWID;
CREATE TABLE kernels(id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, demangled TEXT NOT NULL);
CREATE TABLE calls(
  id INTEGER PRIMARY KEY,
  ts_ns INTEGER NOT NULL, duration_ns INTEGER, pid INTEGER NOT NULL, tid INTEGER NOT NULL,
  func INTEGER NOT NULL, ret INTEGER, parent_id INTEGER, stack_id INTEGER,
  stream INTEGER, ptr INTEGER, src INTEGER, bytes INTEGER, dir TEXT, host_mem TEXT,
  kernel_id INTEGER, kernel_handle INTEGER,
  grid_x INTEGER, grid_y INTEGER, grid_z INTEGER, block_x INTEGER, block_y INTEGER, block_z INTEGER,
  shared_mem INTEGER, name TEXT, driver_func INTEGER, driver_handle INTEGER, stack_weight INTEGER,
  copies INTEGER);
CREATE TABLE lost(cause TEXT PRIMARY KEY, count INTEGER NOT NULL);
CREATE TABLE samples(id INTEGER PRIMARY KEY, ts_ns INTEGER NOT NULL, pid INTEGER NOT NULL, tid INTEGER NOT NULL,
                     cpu INTEGER, stack_id INTEGER, kernel_stack_id INTEGER);
CREATE TABLE symbols(module_id INTEGER NOT NULL, offset INTEGER NOT NULL, name TEXT NOT NULL,
                     PRIMARY KEY(module_id, offset)) WITHOUT ROWID;
CREATE TABLE python_frames(id INTEGER PRIMARY KEY, function TEXT NOT NULL, file TEXT NOT NULL, line INTEGER NOT NULL);
CREATE TABLE gpus(idx INTEGER PRIMARY KEY, uuid TEXT, name TEXT, memory_total INTEGER, power_limit_mw INTEGER);
CREATE TABLE gpu_samples(ts_ns INTEGER NOT NULL, gpu INTEGER NOT NULL, gpu_util INTEGER, mem_util INTEGER,
                         mem_used INTEGER, power_mw INTEGER, temperature_c INTEGER, sm_clock_mhz INTEGER,
                         mem_clock_mhz INTEGER, throttle_reasons INTEGER, pcie_tx_kbs INTEGER, pcie_rx_kbs INTEGER,
                         ecc_corrected INTEGER, ecc_uncorrected INTEGER, sm_active REAL, sm_occupancy REAL,
                         tensor_active REAL, dram_active REAL);
CREATE TABLE gpu_process_samples(ts_ns INTEGER NOT NULL, gpu INTEGER NOT NULL, pid INTEGER NOT NULL, sm_util INTEGER,
                                 mem_util INTEGER, used_memory INTEGER);
CREATE TABLE pressure(ts_ns INTEGER NOT NULL, pid INTEGER NOT NULL, cgroup TEXT, cpu_some_us INTEGER,
                      memory_some_us INTEGER, memory_full_us INTEGER, io_some_us INTEGER, io_full_us INTEGER,
                      periods INTEGER, throttled_periods INTEGER, throttled_us INTEGER, refault_file INTEGER,
                      tcp_out_segs INTEGER, tcp_retrans_segs INTEGER);
CREATE TABLE gpu_events(ts_ns INTEGER NOT NULL, gpu INTEGER NOT NULL, kind TEXT NOT NULL, value INTEGER);
CREATE TABLE thread_times(pid INTEGER NOT NULL, tid INTEGER NOT NULL, start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL,
                          on_cpu_ns INTEGER, runnable_ns INTEGER, io_ns INTEGER, lock_ns INTEGER, fd_ns INTEGER,
                          sleep_ns INTEGER, other_ns INTEGER, waited_ns INTEGER, waited_for_tid INTEGER,
                          waited_for_pid INTEGER, waited_for_comm TEXT, blocked_ns INTEGER, waker_tid INTEGER,
                          waker_pid INTEGER, waker_comm TEXT, switches INTEGER, preempted INTEGER, faults INTEGER,
                          state TEXT, reclaim_ns INTEGER, net_softirq_ns INTEGER,
                          blocked_syscall TEXT, blocked_on TEXT, sys_ns INTEGER,
                          waited_for_kthread INTEGER);
CREATE TABLE host_allocs(ts_ns INTEGER NOT NULL, pid INTEGER NOT NULL, tid INTEGER, op TEXT NOT NULL,
                         addr INTEGER NOT NULL, length INTEGER NOT NULL, old_addr INTEGER, stack_id INTEGER);
CREATE TABLE gpu_activities(id INTEGER PRIMARY KEY, pid INTEGER NOT NULL, kind TEXT NOT NULL, gpu INTEGER, stream INTEGER,
                            start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL, bytes INTEGER, copy_kind INTEGER,
                            name TEXT, call_id INTEGER, grid_x INTEGER, grid_y INTEGER, grid_z INTEGER,
                            block_x INTEGER, block_y INTEGER, block_z INTEGER);
CREATE TABLE nccl_calls(call_id INTEGER PRIMARY KEY, comm INTEGER, count INTEGER, datatype TEXT, op TEXT,
                        peer INTEGER, rank INTEGER, nranks INTEGER, comm_id TEXT, parent_comm INTEGER,
                        color INTEGER, split_key INTEGER, group_id INTEGER);
CREATE TABLE rdma_calls(id INTEGER PRIMARY KEY, ts_ns INTEGER NOT NULL, duration_ns INTEGER, pid INTEGER NOT NULL,
                        tid INTEGER NOT NULL, func TEXT NOT NULL, ok INTEGER NOT NULL, ret INTEGER, object INTEGER,
                        context INTEGER, qp_num INTEGER, qp_type TEXT, sq_sig_all INTEGER, send_cq INTEGER,
                        recv_cq INTEGER, state TEXT, prev_state TEXT, dest_qp_num INTEGER, attr_mask INTEGER,
                        addr INTEGER, length INTEGER, iova INTEGER, access INTEGER, lkey INTEGER, rkey INTEGER,
                        dmabuf_fd INTEGER, cqe INTEGER, name TEXT);
CREATE TABLE rdma_work_requests(id INTEGER PRIMARY KEY, post_id INTEGER NOT NULL, ts_ns INTEGER NOT NULL,
                                pid INTEGER NOT NULL, tid INTEGER NOT NULL, qp_num INTEGER NOT NULL, queue TEXT NOT NULL,
                                wr_id INTEGER NOT NULL, opcode TEXT NOT NULL, num_sge INTEGER, bytes INTEGER,
                                signaled INTEGER NOT NULL, remote_addr INTEGER, rkey INTEGER);
CREATE TABLE rdma_completions(id INTEGER PRIMARY KEY, ts_ns INTEGER NOT NULL, pid INTEGER NOT NULL, tid INTEGER NOT NULL,
                              cq INTEGER, qp_num INTEGER NOT NULL, wr_id INTEGER NOT NULL, status TEXT NOT NULL,
                              status_code INTEGER NOT NULL, opcode TEXT, byte_len INTEGER, wr_opcode TEXT,
                              latency_ns INTEGER);
)sql";

// Created when a recording ends; a record cut short is readable without them.
inline constexpr const char* kIndexSql = R"sql(
CREATE INDEX IF NOT EXISTS calls_by_time ON calls(ts_ns);
CREATE INDEX IF NOT EXISTS calls_by_func ON calls(func);
CREATE INDEX IF NOT EXISTS calls_by_kernel ON calls(kernel_id);
CREATE INDEX IF NOT EXISTS samples_by_thread ON samples(tid, ts_ns);
CREATE INDEX IF NOT EXISTS thread_times_by_thread ON thread_times(tid, start_ns);
)sql";

}  // namespace gpuscope::store
