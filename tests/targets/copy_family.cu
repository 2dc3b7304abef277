// Every copy of CUDA's copy family once, each of a size of its own: 3-D copies (pitched pointers,
// CUDA arrays, a mipmapped array's level), peer copies, copies into, out of and between arrays,
// symbol copies and batch copies, through the runtime and the driver. With --json PATH it writes
// what it made: per call, the function (the symbol a probe sees), the bytes, the direction (an
// array is device memory) and the host memory, which the runtime test (test_copies.py) and
// bench/gpu/copy_family_check.py compare the record with. Built with --default-stream
// per-thread it calls the _ptds/_ptsz forms.
//
// Without a GPU every call fails (the runtime's for lack of a driver, the stub driver's at once),
// but each probe fires with the arguments below. Exit code: the number of failed calls.
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// cudaMemcpyToArray and its kin are deprecated, still exported, and called by programs.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

__device__ float symbol_buf[1024];

namespace {

#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
constexpr bool kPerThread = true;
#else
constexpr bool kPerThread = false;
#endif

struct Made {
  std::string function;
  size_t bytes;
  const char* dir;   // HtoD, DtoH, DtoD, HtoH
  std::string host;  // pinned, pageable, or "" (no host side)
  size_t copies;     // batch copies; 1 otherwise
  // Its size is in an array's elements: a recorder knows the bytes only from the array's creation.
  bool in_elements;
  // Its direction follows from where its pointers are (batches): a recorder knows it only from
  // the allocations it saw. (cudaMemcpyDefault with an array or a symbol on one side and
  // pageable memory on the other needs none.)
  bool dir_by_pointers;
};
std::vector<Made> made;
int failed = 0;
bool allocated = false;  // the device memory and every array were made (a GPU is there)

// The symbol a call reaches: its legacy-stream name, or its per-thread one.
std::string sym(const char* legacy, const char* per_thread) { return kPerThread ? per_thread : legacy; }

// The first failures are shown (without a GPU every call fails).
void check(const char* what, cudaError_t e) {
  if (e == cudaSuccess) return;
  if (++failed <= 3) std::fprintf(stderr, "copy_family: %s: %s\n", what, cudaGetErrorString(e));
}
void check(const char* what, CUresult r) {
  if (r == CUDA_SUCCESS) return;
  const char* s = nullptr;
  cuGetErrorString(r, &s);
  if (++failed <= 3) std::fprintf(stderr, "copy_family: %s: %s (%d)\n", what, s ? s : "?", int(r));
}

struct Buffers {
  char* dev = nullptr;       // 1 MiB of device memory
  char* pinned = nullptr;    // 1 MiB of pinned host memory (pageable if that allocation failed)
  bool pinned_ok = false;
  char* pageable = nullptr;  // 1 MiB of malloc'ed memory
  cudaArray_t arr2d = nullptr, arr2d_b = nullptr;  // 256 x 64 float4 (16-byte elements)
  cudaArray_t arr3d = nullptr;                     // 64 x 32 x 8 float (4 bytes)
  cudaMipmappedArray_t mip = nullptr;              // 64 x 64 uchar2 (2 bytes), 3 levels
  cudaArray_t mip_level1 = nullptr;
  CUarray arr1d = nullptr, arr1d_b = nullptr;      // driver: 4096 x 4 x uint8 (4 bytes)
  CUarray arr3d_drv = nullptr;                     // driver: 32 x 32 x 4, 2 x half (4 bytes)
  cudaStream_t stream = nullptr;
  CUcontext ctx = nullptr;

  const char* host(const char* p) const {
    return p >= pinned && p < pinned + (1 << 20) && pinned_ok ? "pinned" : "pageable";
  }
};

void note(std::string function, size_t bytes, const char* dir, std::string host = "", size_t copies = 1,
          bool in_elements = false, bool dir_by_pointers = false) {
  made.push_back({std::move(function), bytes, dir, std::move(host), copies, in_elements, dir_by_pointers});
}
// Stands in for an array that could not be made (no GPU): the calls fail either way, but their
// probes see an array handle as they would.
template <typename T>
void stand_in(T& handle, uintptr_t value) {
  if (!handle) handle = reinterpret_cast<T>(value);
}

void allocate(Buffers& b) {
  check("cudaFree(0)", cudaFree(nullptr));
  check("cudaMalloc", cudaMalloc(&b.dev, 1 << 20));
  b.pinned_ok = cudaMallocHost(&b.pinned, 1 << 20) == cudaSuccess;
  if (!b.pinned_ok) {
    ++failed;
    b.pinned = static_cast<char*>(std::malloc(1 << 20));
  }
  b.pageable = static_cast<char*>(std::malloc(1 << 20));
  std::memset(b.pageable, 1, 1 << 20);
  std::memset(b.pinned, 2, 1 << 20);
  cudaChannelFormatDesc f4 = cudaCreateChannelDesc<float4>();
  check("cudaMallocArray", cudaMallocArray(&b.arr2d, &f4, 256, 64));
  check("cudaMallocArray", cudaMallocArray(&b.arr2d_b, &f4, 256, 64));
  cudaChannelFormatDesc f1 = cudaCreateChannelDesc<float>();
  check("cudaMalloc3DArray", cudaMalloc3DArray(&b.arr3d, &f1, make_cudaExtent(64, 32, 8)));
  cudaChannelFormatDesc u2 = cudaCreateChannelDesc<uchar2>();
  check("cudaMallocMipmappedArray", cudaMallocMipmappedArray(&b.mip, &u2, make_cudaExtent(64, 64, 0), 3));
  check("cudaGetMipmappedArrayLevel", cudaGetMipmappedArrayLevel(&b.mip_level1, b.mip, 1));
  check("cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking));
  check("cuCtxGetCurrent", cuCtxGetCurrent(&b.ctx));
  CUDA_ARRAY_DESCRIPTOR d1{};
  d1.Width = 4096;
  d1.Height = 0;  // 1-D: what cuMemcpyHtoA and its kin copy to and from
  d1.Format = CU_AD_FORMAT_UNSIGNED_INT8;
  d1.NumChannels = 4;
  check("cuArrayCreate", cuArrayCreate(&b.arr1d, &d1));
  check("cuArrayCreate", cuArrayCreate(&b.arr1d_b, &d1));
  CUDA_ARRAY3D_DESCRIPTOR d3{};
  d3.Width = 32, d3.Height = 32, d3.Depth = 4;
  d3.Format = CU_AD_FORMAT_HALF;
  d3.NumChannels = 2;
  check("cuArray3DCreate", cuArray3DCreate(&b.arr3d_drv, &d3));
  allocated = b.dev && b.arr2d && b.arr2d_b && b.arr3d && b.mip && b.mip_level1 && b.arr1d && b.arr1d_b && b.arr3d_drv;
  stand_in(b.arr2d, 0xa2d0), stand_in(b.arr2d_b, 0xa2d1), stand_in(b.arr3d, 0xa3d0), stand_in(b.mip, 0xa1f0);
  stand_in(b.mip_level1, 0xa1f1), stand_in(b.arr1d, 0xa1d0), stand_in(b.arr1d_b, 0xa1d1), stand_in(b.arr3d_drv, 0xa3d1);
}

cudaPitchedPtr pitched(void* p, size_t pitch, size_t w, size_t h) { return make_cudaPitchedPtr(p, pitch, w, h); }

void runtime_3d(Buffers& b) {
  cudaStream_t s = b.stream;
  {  // pitched pointers, no array: the extent is in bytes
    cudaMemcpy3DParms p{};
    p.srcPtr = pitched(b.pageable, 1000, 1000, 3);
    p.dstPtr = pitched(b.dev, 1024, 1000, 3);
    p.extent = make_cudaExtent(1000, 3, 2);
    p.kind = cudaMemcpyHostToDevice;
    check("cudaMemcpy3D", cudaMemcpy3D(&p));
    note(sym("cudaMemcpy3D", "cudaMemcpy3D_ptds"), 6000, "HtoD", b.host(b.pageable));
  }
  {  // into a 3-D array: the extent is in its 4-byte elements
    cudaMemcpy3DParms p{};
    p.srcPtr = pitched(b.pinned, 64 * 4, 64, 32);
    p.dstArray = b.arr3d;
    p.extent = make_cudaExtent(64, 32, 8);
    p.kind = cudaMemcpyHostToDevice;
    check("cudaMemcpy3D", cudaMemcpy3D(&p));
    note(sym("cudaMemcpy3D", "cudaMemcpy3D_ptds"), 64 * 32 * 8 * 4, "HtoD", b.host(b.pinned), 1, true);
  }
  {  // into a mipmapped array's level 1 (32 x 32 uchar2): 2-byte elements; kind Default
    cudaMemcpy3DParms p{};
    p.srcPtr = pitched(b.pageable, 40, 20, 10);
    p.dstArray = b.mip_level1;
    p.extent = make_cudaExtent(20, 10, 1);
    p.kind = cudaMemcpyDefault;
    check("cudaMemcpy3D", cudaMemcpy3D(&p));
    note(sym("cudaMemcpy3D", "cudaMemcpy3D_ptds"), 20 * 10 * 2, "HtoD", b.host(b.pageable), 1, true);
  }
  {  // into a 3-D array the driver made (2 x half: 4 bytes)
    cudaMemcpy3DParms p{};
    p.srcPtr = pitched(b.pageable + 4096, 32 * 4, 32, 32);
    p.dstArray = reinterpret_cast<cudaArray_t>(b.arr3d_drv);
    p.extent = make_cudaExtent(32, 32, 3);
    p.kind = cudaMemcpyHostToDevice;
    check("cudaMemcpy3D", cudaMemcpy3D(&p));
    note(sym("cudaMemcpy3D", "cudaMemcpy3D_ptds"), 32 * 32 * 3 * 4, "HtoD", b.host(b.pageable), 1, true);
  }
  {  // out of the 3-D array into pinned memory, on a stream
    cudaMemcpy3DParms p{};
    p.srcArray = b.arr3d;
    p.dstPtr = pitched(b.pinned, 64 * 4, 64, 32);
    p.extent = make_cudaExtent(64, 32, 4);
    p.kind = cudaMemcpyDeviceToHost;
    check("cudaMemcpy3DAsync", cudaMemcpy3DAsync(&p, s));
    note(sym("cudaMemcpy3DAsync", "cudaMemcpy3DAsync_ptsz"), 64 * 32 * 4 * 4, "DtoH", b.host(b.pinned), 1, true);
  }
  {  // between devices (here: device 0 and itself)
    cudaMemcpy3DPeerParms p{};
    p.srcPtr = pitched(b.dev, 2048, 2048, 1);
    p.dstPtr = pitched(b.dev + 65536, 2048, 2048, 1);
    p.extent = make_cudaExtent(2048, 1, 1);
    check("cudaMemcpy3DPeer", cudaMemcpy3DPeer(&p));
    note(sym("cudaMemcpy3DPeer", "cudaMemcpy3DPeer_ptds"), 2048, "DtoD");
    p.extent = make_cudaExtent(4096, 1, 1);
    p.srcPtr = pitched(b.dev, 4096, 4096, 1);
    p.dstPtr = pitched(b.dev + 65536, 4096, 4096, 1);
    check("cudaMemcpy3DPeerAsync", cudaMemcpy3DPeerAsync(&p, s));
    note(sym("cudaMemcpy3DPeerAsync", "cudaMemcpy3DPeerAsync_ptsz"), 4096, "DtoD");
  }
  // A copy of 0 bytes, as mergeSort makes 24 of: a call the program made, no work for the GPU.
  check("cudaMemcpy", cudaMemcpy(b.dev + 131072, b.dev, 0, cudaMemcpyDeviceToDevice));
  note(sym("cudaMemcpy", "cudaMemcpy_ptds"), 0, "DtoD");
  check("cudaMemcpyPeer", cudaMemcpyPeer(b.dev + 131072, 0, b.dev, 0, 3000));
  note("cudaMemcpyPeer", 3000, "DtoD");  // no per-thread form
  check("cudaMemcpyPeerAsync", cudaMemcpyPeerAsync(b.dev + 131072, 0, b.dev, 0, 5000, s));
  note("cudaMemcpyPeerAsync", 5000, "DtoD");
}

void runtime_arrays(Buffers& b) {
  cudaStream_t s = b.stream;
  // 2-D copies into and out of arrays: widths in bytes (16-byte elements).
  check("cudaMemcpy2DToArray",
        cudaMemcpy2DToArray(b.arr2d, 0, 0, b.pageable, 4096, 128 * 16, 10, cudaMemcpyHostToDevice));
  note(sym("cudaMemcpy2DToArray", "cudaMemcpy2DToArray_ptds"), 128 * 16 * 10, "HtoD", b.host(b.pageable));
  check("cudaMemcpy2DToArrayAsync",
        cudaMemcpy2DToArrayAsync(b.arr2d, 16, 1, b.pinned, 4096, 64 * 16, 12, cudaMemcpyHostToDevice, s));
  note(sym("cudaMemcpy2DToArrayAsync", "cudaMemcpy2DToArrayAsync_ptsz"), 64 * 16 * 12, "HtoD", b.host(b.pinned));
  check("cudaMemcpy2DFromArray",
        cudaMemcpy2DFromArray(b.pageable, 4096, b.arr2d, 0, 0, 100 * 16, 7, cudaMemcpyDeviceToHost));
  note(sym("cudaMemcpy2DFromArray", "cudaMemcpy2DFromArray_ptds"), 100 * 16 * 7, "DtoH", b.host(b.pageable));
  check("cudaMemcpy2DFromArrayAsync",
        cudaMemcpy2DFromArrayAsync(b.pinned, 4096, b.arr2d, 0, 2, 50 * 16, 9, cudaMemcpyDeviceToHost, s));
  note(sym("cudaMemcpy2DFromArrayAsync", "cudaMemcpy2DFromArrayAsync_ptsz"), 50 * 16 * 9, "DtoH", b.host(b.pinned));
  check("cudaMemcpy2DArrayToArray",
        cudaMemcpy2DArrayToArray(b.arr2d_b, 0, 0, b.arr2d, 0, 0, 32 * 16, 5, cudaMemcpyDeviceToDevice));
  note(sym("cudaMemcpy2DArrayToArray", "cudaMemcpy2DArrayToArray_ptds"), 32 * 16 * 5, "DtoD");
  // The deprecated 1-D forms: counts in bytes. cudaMemcpyDefault: the array is device memory
  // whatever the tracked allocations know.
  check("cudaMemcpyToArray", cudaMemcpyToArray(b.arr2d, 0, 3, b.pageable, 3072, cudaMemcpyDefault));
  note(sym("cudaMemcpyToArray", "cudaMemcpyToArray_ptds"), 3072, "HtoD", b.host(b.pageable));
  check("cudaMemcpyToArrayAsync", cudaMemcpyToArrayAsync(b.arr2d, 0, 4, b.pinned, 2304, cudaMemcpyHostToDevice, s));
  note(sym("cudaMemcpyToArrayAsync", "cudaMemcpyToArrayAsync_ptsz"), 2304, "HtoD", b.host(b.pinned));
  check("cudaMemcpyFromArray", cudaMemcpyFromArray(b.pageable, b.arr2d, 0, 0, 1792, cudaMemcpyDeviceToHost));
  note(sym("cudaMemcpyFromArray", "cudaMemcpyFromArray_ptds"), 1792, "DtoH", b.host(b.pageable));
  check("cudaMemcpyFromArrayAsync",
        cudaMemcpyFromArrayAsync(b.pinned, b.arr2d, 0, 1, 1536, cudaMemcpyDeviceToHost, s));
  note(sym("cudaMemcpyFromArrayAsync", "cudaMemcpyFromArrayAsync_ptsz"), 1536, "DtoH", b.host(b.pinned));
  check("cudaMemcpyArrayToArray", cudaMemcpyArrayToArray(b.arr2d_b, 0, 0, b.arr2d, 0, 0, 1280, cudaMemcpyDeviceToDevice));
  note(sym("cudaMemcpyArrayToArray", "cudaMemcpyArrayToArray_ptds"), 1280, "DtoD");
}

void runtime_symbols_and_batches(Buffers& b) {
  cudaStream_t s = b.stream;
  check("cudaMemcpyToSymbol", cudaMemcpyToSymbol(symbol_buf, b.pageable, 640, 0, cudaMemcpyHostToDevice));
  note(sym("cudaMemcpyToSymbol", "cudaMemcpyToSymbol_ptds"), 640, "HtoD", b.host(b.pageable));
  check("cudaMemcpyToSymbolAsync", cudaMemcpyToSymbolAsync(symbol_buf, b.pinned, 768, 64, cudaMemcpyHostToDevice, s));
  note(sym("cudaMemcpyToSymbolAsync", "cudaMemcpyToSymbolAsync_ptsz"), 768, "HtoD", b.host(b.pinned));
  // cudaMemcpyDefault: the symbol is device memory whatever the tracked allocations know.
  check("cudaMemcpyFromSymbol", cudaMemcpyFromSymbol(b.pageable, symbol_buf, 896, 0, cudaMemcpyDefault));
  note(sym("cudaMemcpyFromSymbol", "cudaMemcpyFromSymbol_ptds"), 896, "DtoH", b.host(b.pageable));
  check("cudaMemcpyFromSymbolAsync", cudaMemcpyFromSymbolAsync(b.pinned, symbol_buf, 1024, 0, cudaMemcpyDeviceToHost, s));
  note(sym("cudaMemcpyFromSymbolAsync", "cudaMemcpyFromSymbolAsync_ptsz"), 1024, "DtoH", b.host(b.pinned));

  {  // three host-to-device copies in one batch
    void* dsts[3] = {b.dev + 200000, b.dev + 210000, b.dev + 220000};
    const void* srcs[3] = {b.pinned, b.pinned + 10000, b.pinned + 20000};
    size_t sizes[3] = {1100, 2200, 3300};
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t attr_idx = 0;
    check("cudaMemcpyBatchAsync", cudaMemcpyBatchAsync(dsts, srcs, sizes, 3, &attr, &attr_idx, 1, s));
    note(sym("cudaMemcpyBatchAsync", "cudaMemcpyBatchAsync_ptsz"), 6600, "HtoD", b.host(b.pinned), 3, false, true);
  }
  {  // a 3-D batch: a pointer-to-pointer copy (bytes) and one into the 3-D array (4-byte elements)
    cudaMemcpy3DBatchOp ops[2]{};
    ops[0].src.type = cudaMemcpyOperandTypePointer;
    ops[0].src.op.ptr.ptr = b.pinned + 30000;
    ops[0].dst.type = cudaMemcpyOperandTypePointer;
    ops[0].dst.op.ptr.ptr = b.dev + 300000;
    ops[0].extent = make_cudaExtent(500, 2, 1);
    ops[0].srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    ops[1].src.type = cudaMemcpyOperandTypePointer;
    ops[1].src.op.ptr.ptr = b.pinned + 40000;
    ops[1].dst.type = cudaMemcpyOperandTypeArray;
    ops[1].dst.op.array.array = b.arr3d;
    ops[1].extent = make_cudaExtent(16, 4, 1);
    ops[1].srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    check("cudaMemcpy3DBatchAsync", cudaMemcpy3DBatchAsync(2, ops, 0, s));
    note(sym("cudaMemcpy3DBatchAsync", "cudaMemcpy3DBatchAsync_ptsz"), 1000 + 16 * 4 * 4, "HtoD", b.host(b.pinned), 2,
         true, true);
  }
  check("cudaStreamSynchronize", cudaStreamSynchronize(s));
}

CUdeviceptr dptr(const char* p) { return reinterpret_cast<CUdeviceptr>(p); }

void driver_copies(Buffers& b) {
  CUstream s = b.stream;
  {
    CUDA_MEMCPY3D m{};
    m.srcMemoryType = CU_MEMORYTYPE_HOST, m.srcHost = b.pinned, m.srcPitch = 700, m.srcHeight = 4;
    m.dstMemoryType = CU_MEMORYTYPE_DEVICE, m.dstDevice = dptr(b.dev), m.dstPitch = 1024, m.dstHeight = 4;
    m.WidthInBytes = 700, m.Height = 4, m.Depth = 3;
    check("cuMemcpy3D", cuMemcpy3D(&m));
    note(sym("cuMemcpy3D_v2", "cuMemcpy3D_v2_ptds"), 8400, "HtoD", b.host(b.pinned));
  }
  {
    CUDA_MEMCPY3D m{};
    m.srcMemoryType = CU_MEMORYTYPE_DEVICE, m.srcDevice = dptr(b.dev), m.srcPitch = 1024, m.srcHeight = 2;
    m.dstMemoryType = CU_MEMORYTYPE_HOST, m.dstHost = b.pinned + 100000, m.dstPitch = 900, m.dstHeight = 2;
    m.WidthInBytes = 900, m.Height = 2, m.Depth = 2;
    check("cuMemcpy3DAsync", cuMemcpy3DAsync(&m, s));
    note(sym("cuMemcpy3DAsync_v2", "cuMemcpy3DAsync_v2_ptsz"), 3600, "DtoH", b.host(b.pinned));
  }
  {
    CUDA_MEMCPY3D_PEER m{};
    m.srcMemoryType = CU_MEMORYTYPE_DEVICE, m.srcDevice = dptr(b.dev), m.srcContext = b.ctx, m.srcPitch = 2048;
    m.srcHeight = 2;
    m.dstMemoryType = CU_MEMORYTYPE_DEVICE, m.dstDevice = dptr(b.dev + 400000), m.dstContext = b.ctx;
    m.dstPitch = 2048, m.dstHeight = 2;
    m.WidthInBytes = 1600, m.Height = 2, m.Depth = 1;
    check("cuMemcpy3DPeer", cuMemcpy3DPeer(&m));
    note(sym("cuMemcpy3DPeer", "cuMemcpy3DPeer_ptds"), 3200, "DtoD");
    m.WidthInBytes = 1700, m.Height = 1;
    check("cuMemcpy3DPeerAsync", cuMemcpy3DPeerAsync(&m, s));
    note(sym("cuMemcpy3DPeerAsync", "cuMemcpy3DPeerAsync_ptsz"), 1700, "DtoD");
  }
  check("cuMemcpyPeer", cuMemcpyPeer(dptr(b.dev + 500000), b.ctx, dptr(b.dev), b.ctx, 2500));
  note(sym("cuMemcpyPeer", "cuMemcpyPeer_ptds"), 2500, "DtoD");
  check("cuMemcpyPeerAsync", cuMemcpyPeerAsync(dptr(b.dev + 500000), b.ctx, dptr(b.dev), b.ctx, 2700, s));
  note(sym("cuMemcpyPeerAsync", "cuMemcpyPeerAsync_ptsz"), 2700, "DtoD");

  // 1-D arrays of 4-byte elements: offsets and counts in bytes, multiples of the element.
  check("cuMemcpyHtoA", cuMemcpyHtoA(b.arr1d, 0, b.pageable, 1400));
  note(sym("cuMemcpyHtoA_v2", "cuMemcpyHtoA_v2_ptds"), 1400, "HtoD", b.host(b.pageable));
  check("cuMemcpyHtoAAsync", cuMemcpyHtoAAsync(b.arr1d, 4096, b.pinned, 1300, s));
  note(sym("cuMemcpyHtoAAsync_v2", "cuMemcpyHtoAAsync_v2_ptsz"), 1300, "HtoD", b.host(b.pinned));
  check("cuMemcpyAtoH", cuMemcpyAtoH(b.pageable, b.arr1d, 0, 1200));
  note(sym("cuMemcpyAtoH_v2", "cuMemcpyAtoH_v2_ptds"), 1200, "DtoH", b.host(b.pageable));
  check("cuMemcpyAtoHAsync", cuMemcpyAtoHAsync(b.pinned + 200000, b.arr1d, 0, 1152, s));
  note(sym("cuMemcpyAtoHAsync_v2", "cuMemcpyAtoHAsync_v2_ptsz"), 1152, "DtoH", b.host(b.pinned));
  check("cuMemcpyDtoA", cuMemcpyDtoA(b.arr1d_b, 0, dptr(b.dev), 1048));
  note(sym("cuMemcpyDtoA_v2", "cuMemcpyDtoA_v2_ptds"), 1048, "DtoD");
  check("cuMemcpyAtoD", cuMemcpyAtoD(dptr(b.dev + 600000), b.arr1d, 0, 952));
  note(sym("cuMemcpyAtoD_v2", "cuMemcpyAtoD_v2_ptds"), 952, "DtoD");
  check("cuMemcpyAtoA", cuMemcpyAtoA(b.arr1d_b, 2048, b.arr1d, 0, 848));
  note(sym("cuMemcpyAtoA_v2", "cuMemcpyAtoA_v2_ptds"), 848, "DtoD");

  {  // a 2-D copy into a 2-D array (CU_MEMORYTYPE_ARRAY): the array's handle is its destination
    CUDA_MEMCPY2D m{};
    m.srcMemoryType = CU_MEMORYTYPE_HOST, m.srcHost = b.pageable, m.srcPitch = 160;
    m.dstMemoryType = CU_MEMORYTYPE_ARRAY, m.dstArray = reinterpret_cast<CUarray>(b.arr2d);
    m.WidthInBytes = 160, m.Height = 2;
    check("cuMemcpy2D", cuMemcpy2D(&m));
    note(sym("cuMemcpy2D_v2", "cuMemcpy2D_v2_ptds"), 320, "HtoD", b.host(b.pageable));
    m.dstMemoryType = CU_MEMORYTYPE_DEVICE, m.dstDevice = dptr(b.dev + 700000), m.dstPitch = 512;
    m.WidthInBytes = 333, m.Height = 3, m.srcPitch = 333;
    check("cuMemcpy2DUnaligned", cuMemcpy2DUnaligned(&m));
    note(sym("cuMemcpy2DUnaligned_v2", "cuMemcpy2DUnaligned_v2_ptds"), 999, "HtoD", b.host(b.pageable));
  }
  {  // two device-to-host copies in one batch
    CUdeviceptr dsts[2] = {dptr(b.pinned + 300000), dptr(b.pinned + 310000)};
    CUdeviceptr srcs[2] = {dptr(b.dev), dptr(b.dev + 10000)};
    size_t sizes[2] = {700, 800};
    CUmemcpyAttributes attr{};
    attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    size_t attr_idx = 0;
    check("cuMemcpyBatchAsync", cuMemcpyBatchAsync(dsts, srcs, sizes, 2, &attr, &attr_idx, 1, s));
    note(sym("cuMemcpyBatchAsync_v2", "cuMemcpyBatchAsync_v2_ptsz"), 1500, "DtoH", b.host(b.pinned), 2, false, true);
    // CUDA 12.8's form, with failIdx before the stream, under the name it kept.
    using BatchFailIdx = CUresult (*)(CUdeviceptr*, CUdeviceptr*, size_t*, size_t, CUmemcpyAttributes*, size_t*,
                                      size_t, size_t*, CUstream);
    const std::string old_name = sym("cuMemcpyBatchAsync", "cuMemcpyBatchAsync_ptsz");
    if (auto fn = reinterpret_cast<BatchFailIdx>(dlsym(RTLD_DEFAULT, old_name.c_str()))) {
      CUdeviceptr d1[1] = {dptr(b.dev + 800000)};
      CUdeviceptr s1[1] = {dptr(b.pinned + 320000)};
      size_t n1[1] = {600};
      size_t fail_idx = 0;
      check("cuMemcpyBatchAsync (12.8)", fn(d1, s1, n1, 1, &attr, &attr_idx, 1, &fail_idx, s));
      note(old_name, 600, "HtoD", b.host(b.pinned), 1, false, true);
    }
  }
  {  // a 3-D batch of one copy out of the driver's 3-D array (4-byte elements) into pinned memory
    CUDA_MEMCPY3D_BATCH_OP op{};
    op.src.type = CU_MEMCPY_OPERAND_TYPE_ARRAY;
    op.src.op.array.array = b.arr3d_drv;
    op.dst.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
    op.dst.op.ptr.ptr = dptr(b.pinned + 400000);
    op.extent = {8, 8, 2};
    op.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    check("cuMemcpy3DBatchAsync", cuMemcpy3DBatchAsync(1, &op, 0, s));
    note(sym("cuMemcpy3DBatchAsync_v2", "cuMemcpy3DBatchAsync_v2_ptsz"), 8 * 8 * 2 * 4, "DtoH", b.host(b.pinned), 1,
         true, true);
  }
  check("cuStreamSynchronize", cuStreamSynchronize(s));
}

void release(Buffers& b) {
  check("cuArrayDestroy", cuArrayDestroy(b.arr3d_drv));
  check("cuArrayDestroy", cuArrayDestroy(b.arr1d_b));
  check("cuArrayDestroy", cuArrayDestroy(b.arr1d));
  check("cudaFreeMipmappedArray", cudaFreeMipmappedArray(b.mip));
  check("cudaFreeArray", cudaFreeArray(b.arr3d));
  check("cudaFreeArray", cudaFreeArray(b.arr2d_b));
  check("cudaFreeArray", cudaFreeArray(b.arr2d));
  check("cudaStreamDestroy", cudaStreamDestroy(b.stream));
  if (b.pinned_ok)
    cudaFreeHost(b.pinned);
  else
    std::free(b.pinned);
  std::free(b.pageable);
  check("cudaFree", cudaFree(b.dev));
}

void write_json(const char* path) {
  FILE* f = std::fopen(path, "w");
  if (!f) {
    std::perror(path);
    std::exit(100);
  }
  std::fprintf(f, "{\"per_thread_default_stream\": %s, \"allocated\": %s, \"failed_calls\": %d, \"copies\": [\n",
               kPerThread ? "true" : "false", allocated ? "true" : "false", failed);
  for (size_t i = 0; i < made.size(); ++i)
    std::fprintf(f,
                 "  {\"function\": \"%s\", \"bytes\": %zu, \"dir\": \"%s\", \"host_mem\": \"%s\", \"copies\": %zu, "
                 "\"in_elements\": %s, \"dir_by_pointers\": %s}%s\n",
                 made[i].function.c_str(), made[i].bytes, made[i].dir, made[i].host.c_str(), made[i].copies,
                 made[i].in_elements ? "true" : "false", made[i].dir_by_pointers ? "true" : "false",
                 i + 1 < made.size() ? "," : "");
  std::fprintf(f, "]}\n");
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  const char* json = nullptr;
  for (int i = 1; i + 1 < argc; i += 2)
    if (!std::strcmp(argv[i], "--json")) json = argv[i + 1];
  Buffers b;
  allocate(b);
  runtime_3d(b);
  runtime_arrays(b);
  runtime_symbols_and_batches(b);
  driver_copies(b);
  release(b);
  if (json) write_json(json);
  std::printf("copy_family: %zu copy calls, %d calls failed\n", made.size(), failed);
  return failed > 100 ? 100 : failed;
}
