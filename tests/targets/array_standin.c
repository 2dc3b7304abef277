// A stand-in CUDA runtime and driver for CUDA arrays whose calls succeed without a GPU, so that
// what the record makes of arrays is tested through real probes: its cudaMalloc3DArray makes an
// array with its cuArray3DCreate_v2, and its cudaMemcpy3D copies through its cuMemcpy3D_v2 with
// the width in bytes, as libcudart's do. The structs are laid out as CUDA 13's headers lay them
// out. It defines cudaMalloc (what marks a static runtime), so gpuscope probes it. Loaded late
// by load_lib.py, which calls run_arrays().
#include <stddef.h>
#include <stdint.h>

struct channel_desc { int x, y, z, w, f; };           // cudaChannelFormatDesc
struct extent { size_t width, height, depth; };        // cudaExtent, passed by value
struct pos { size_t x, y, z; };
struct pitched_ptr { void *ptr; size_t pitch, xsize, ysize; };
struct memcpy3d_parms {                                // cudaMemcpy3DParms
  void *src_array;
  struct pos src_pos;
  struct pitched_ptr src_ptr;
  void *dst_array;
  struct pos dst_pos;
  struct pitched_ptr dst_ptr;
  struct extent extent;
  int kind;
};
struct array3d_desc { size_t width, height, depth; unsigned format, channels, flags; };  // CUDA_ARRAY3D_DESCRIPTOR
struct memcpy3d {                                      // CUDA_MEMCPY3D
  size_t src_x, src_y, src_z, src_lod;
  unsigned src_type;
  const void *src_host;
  uint64_t src_device;
  void *src_array, *reserved0;
  size_t src_pitch, src_height;
  size_t dst_x, dst_y, dst_z, dst_lod;
  unsigned dst_type;
  void *dst_host;
  uint64_t dst_device;
  void *dst_array, *reserved1;
  size_t dst_pitch, dst_height;
  size_t width_bytes, height, depth;
};
_Static_assert(sizeof(struct memcpy3d_parms) == 160, "cudaMemcpy3DParms");
_Static_assert(sizeof(struct memcpy3d) == 200, "CUDA_MEMCPY3D");

struct array { size_t elem; };
static struct array arrays[4];
static int n_arrays;
// An array made where no probe saw it (before a recording began): 8-byte elements.
static struct array unseen = {8};

__attribute__((noinline)) int cuArray3DCreate_v2(void **out, const struct array3d_desc *d) {
  if (n_arrays == 4) return 2;
  const size_t channel = d->format == 0x20 ? 4 : d->format == 0x10 ? 2 : 1;  // FLOAT, HALF, 8-bit
  arrays[n_arrays].elem = channel * d->channels;
  *out = &arrays[n_arrays++];
  return 0;
}

__attribute__((noinline)) int cudaMalloc3DArray(void **out, const struct channel_desc *desc, struct extent e,
                                                unsigned flags) {
  struct array3d_desc d = {e.width, e.height, e.depth, desc->f == 2 ? 0x20u : 0x01u, 0, flags};
  d.channels = (desc->x > 0) + (desc->y > 0) + (desc->z > 0) + (desc->w > 0);
  return cuArray3DCreate_v2(out, &d) ? 2 : 0;
}

__attribute__((noinline)) int cuMemcpy3D_v2(const struct memcpy3d *m) {
  __asm__ volatile("" ::: "memory");
  return m->width_bytes ? 0 : 1;
}

// Host to array or host to host only: what run_arrays() copies.
__attribute__((noinline)) int cudaMemcpy3D(const struct memcpy3d_parms *p) {
  const struct array *a = p->dst_array;
  struct memcpy3d m = {0};
  m.src_type = 1;  // CU_MEMORYTYPE_HOST
  m.src_host = p->src_ptr.ptr;
  m.src_pitch = p->src_ptr.pitch;
  m.src_height = p->src_ptr.ysize;
  m.dst_type = a ? 3 : 1;
  m.dst_array = p->dst_array;
  m.dst_host = p->dst_ptr.ptr;
  m.width_bytes = p->extent.width * (a ? a->elem : 1);
  m.height = p->extent.height;
  m.depth = p->extent.depth;
  return cuMemcpy3D_v2(&m);
}

int cudaMalloc(void **p, size_t n) {
  (void)n;
  *p = 0;
  return 2;
}

int run_arrays(void) {
  static float host[4096];
  const struct channel_desc f = {32, 0, 0, 0, 2};  // float
  void *arr = 0;
  int failures = cudaMalloc3DArray(&arr, &f, (struct extent){16, 8, 4}, 0);
  struct memcpy3d_parms p = {0};
  p.src_ptr = (struct pitched_ptr){host, 64, 16, 8};
  p.dst_array = arr;
  p.extent = (struct extent){8, 4, 2};
  p.kind = 1;                     // cudaMemcpyHostToDevice
  failures += cudaMemcpy3D(&p);   // 64 floats: 256 bytes
  p.dst_array = &unseen;
  p.extent = (struct extent){5, 3, 1};
  failures += cudaMemcpy3D(&p);   // 15 elements of 8 bytes: 120, told only by the driver's copy
  return failures;
}
