// Host emulation of the CUDA prelude (kernel/prelude.cuh) for the RNN kernels: see src/main.rs.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
using std::isnan; using std::fmin; using std::fmax; using std::exp; using std::tanh; using std::round;
typedef long long i64;
struct TRef { i64 dims[8]; i64 strides[8]; int rank; int pad; };
struct emu_dim3 { unsigned x, y, z; };
extern thread_local emu_dim3 threadIdx, blockIdx;
extern emu_dim3 blockDim, gridDim;
void emu_sync();
#define __syncthreads() emu_sync()
#define __global__
#define __device__
#define __forceinline__ static inline
#define __shared__ static
#define __expf expf
static inline double ld_f64(const void* p, i64 o) { return ((const double*)p)[o]; }
static inline double ld_f32(const void* p, i64 o) { return (double)((const float*)p)[o]; }
static inline double ld_f16(const void* p, i64 o) { return (double)((const _Float16*)p)[o]; }
static inline double ld_i32(const void* p, i64 o) { return (double)((const int*)p)[o]; }
static inline double ld_i64(const void* p, i64 o) { return (double)((const long long*)p)[o]; }
static inline void st_f64(void* p, i64 o, double v) { ((double*)p)[o] = v; }
static inline void st_f32(void* p, i64 o, double v) { ((float*)p)[o] = (float)v; }
static inline void st_f16(void* p, i64 o, double v) { ((_Float16*)p)[o] = (_Float16)v; }
static inline double ld_bf16(const void* p, i64 o) { uint32_t b = (uint32_t)((const uint16_t*)p)[o] << 16; float f; memcpy(&f, &b, 4); return f; }
static inline void st_bf16(void* p, i64 o, double v) { float f = (float)v; uint32_t b; memcpy(&b, &f, 4); uint32_t r = b + 0x7fff + ((b >> 16) & 1); ((uint16_t*)p)[o] = (uint16_t)(r >> 16); }
static inline i64 numel(const TRef& t) { i64 n = 1; for (int a = 0; a < t.rank; ++a) n *= t.dims[a]; return n; }
static inline i64 offset_of(const TRef& t, i64 flat) {
    i64 off = 0;
    for (int a = t.rank - 1; a >= 0; --a) { i64 i = flat % t.dims[a]; flat /= t.dims[a]; off += i * t.strides[a]; }
    return off;
}
#define GRID_STRIDE(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)
static inline void pdl_site() {}
