// NCCL's API called in a loop, without a GPU or a communicator: what probing NCCL adds to a call.
//   nccl_loop CALLS allreduce   ncclAllReduce on a null communicator (NCCL refuses it at once):
//                               a collective, probed at entry only
//   nccl_loop CALLS destroy     ncclCommDestroy(NULL) (NCCL returns at once): probed at entry and
//                               return, for comparison in the same run
// Prints ns a call.
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char** argv) {
  const long calls = argc > 1 ? atol(argv[1]) : 100000;
  const bool destroy = argc > 2 && strcmp(argv[2], "destroy") == 0;
  void* buf = (void*)0x100000;
  ncclAllReduce(buf, buf, 1024, ncclFloat32, ncclSum, nullptr, nullptr);  // NCCL's first-call set-up
  const double t0 = now_ns();
  for (long i = 0; i < calls; ++i) {
    if (destroy)
      ncclCommDestroy(nullptr);
    else
      ncclAllReduce(buf, buf, 1024, ncclFloat32, ncclSum, nullptr, nullptr);
  }
  printf("%.0f ns a call\n", (now_ns() - t0) / (double)calls);
  return 0;
}
