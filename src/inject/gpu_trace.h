/* The file the injection library (gpuscope_inject.cpp, loaded into the CUDA program) writes and
 * `record --gpu-times` reads: one file per process, GPUSCOPE_GPU_TRACE/gpu-PID.bin, a header then
 * records, each a gs_gpu_record optionally followed by `name_len` bytes of kernel name.
 * Times are CLOCK_MONOTONIC nanoseconds, the clock of gpuscope's probes: CUPTI is given that clock
 * (cuptiActivityRegisterTimestampCallback); where it cannot be, `clock_offset_ns` added to CUPTI's
 * timestamps gives it. */
#ifndef GPUSCOPE_GPU_TRACE_H
#define GPUSCOPE_GPU_TRACE_H

#include <stdint.h>

#define GS_GPU_TRACE_MAGIC "GSGPU01"
#define GS_GPU_TRACE_ENV "GPUSCOPE_GPU_TRACE"

struct gs_gpu_trace_header {
  char magic[8];            /* GS_GPU_TRACE_MAGIC */
  uint32_t pid;
  uint32_t cupti_version;
  int64_t clock_offset_ns;  /* 0 when CUPTI already stamps CLOCK_MONOTONIC */
};

enum gs_gpu_record_kind {
  GS_GPU_KERNEL = 1,
  GS_GPU_MEMCPY = 2,
  GS_GPU_MEMSET = 3,
  GS_GPU_API = 4,      /* a runtime or driver API call, to tie activities to gpuscope's calls */
  GS_GPU_DROPPED = 5,  /* `bytes` records CUPTI dropped, or that the writer could not write */
};

struct gs_gpu_record {
  uint16_t kind;
  uint16_t detail;         /* memcpy: CUpti_ActivityMemcpyKind; api: 0 runtime, 1 driver */
  uint32_t device;
  uint64_t start, end;     /* ns */
  uint32_t stream;         /* CUPTI's stream id */
  uint32_t correlation;    /* links an activity to the API call that made it */
  uint64_t bytes;          /* memcpy/memset bytes; api: the callback id */
  uint32_t thread;         /* api: the calling thread's kernel tid */
  uint32_t name_len;       /* kernel: bytes of mangled name that follow */
  uint32_t grid[3], block[3];
};

#endif
