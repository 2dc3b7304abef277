// NCCL's API called as a training job calls it, with arguments a test can check: communicators
// made (from an ncclUniqueId whose bytes are 1, 2, 3, ...), split and ended; each collective, a
// send and a receive in a group. Built against the real libnccl.so.2; without a GPU every call
// fails (ncclUnhandledCudaError, ncclInvalidArgument: the communicators are null), but each
// reaches NCCL with its arguments. Prints one JSON line: the calls made by function, and the
// results.
#include <nccl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main() {
  ncclUniqueId id;
  for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; ++i) id.internal[i] = (char)(i + 1);
  ncclComm_t comm = nullptr, split = nullptr;
  int results[32], n = 0;
  results[n++] = ncclCommInitRank(&comm, 4, id, 2);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  results[n++] = ncclCommInitRankConfig(&comm, 8, id, 3, &config);
  results[n++] = ncclCommSplit(comm, 5, 7, &split, nullptr);
  void* send = (void*)0x100000;
  void* recv = (void*)0x200000;
  cudaStream_t stream = (cudaStream_t)0x30;
  results[n++] = ncclAllReduce(send, recv, 1024, ncclFloat32, ncclSum, comm, stream);
  results[n++] = ncclReduceScatter(send, recv, 512, ncclBfloat16, ncclAvg, comm, stream);
  results[n++] = ncclAllGather(send, recv, 256, ncclFloat16, comm, stream);
  results[n++] = ncclAlltoAll(send, recv, 128, ncclInt64, comm, stream);
  results[n++] = ncclBroadcast(send, recv, 64, ncclUint8, 3, comm, stream);
  results[n++] = ncclReduce(send, recv, 32, ncclFloat64, ncclMax, 2, comm, stream);
  results[n++] = ncclGroupStart();
  results[n++] = ncclSend(send, 100, ncclInt32, 1, comm, stream);
  results[n++] = ncclRecv(recv, 200, ncclInt32, 3, comm, stream);
  results[n++] = ncclGroupEnd();
  results[n++] = ncclCommDestroy(comm);
  printf("{\"pid\": %d, \"results\": [", (int)getpid());
  for (int i = 0; i < n; ++i) printf("%s%d", i ? ", " : "", results[i]);
  printf("]}\n");
  return 0;
}
