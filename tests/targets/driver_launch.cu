// Launches through the driver API only, as Triton, CuPy's RawKernel and XLA do. Built against
// the driver stub: without a GPU every call returns an error, but each probe fires with the
// arguments below, which test_record.py checks.
#include <cuda.h>

#include <cstdio>

int main() {
  cuInit(0);
  CUdevice dev = 0;
  cuDeviceGet(&dev, 0);
  CUfunction fn = reinterpret_cast<CUfunction>(0x1000);  // never dereferenced by a stub
  void* params[] = {nullptr};
  for (int i = 0; i < 3; ++i)
    cuLaunchKernel(fn, 7, 5, 3, 64, 2, 1, 1024, nullptr, params, nullptr);
  CUresult r = cuCtxSynchronize();
  std::printf("driver_launch: last result %d\n", static_cast<int>(r));
  return 0;
}
