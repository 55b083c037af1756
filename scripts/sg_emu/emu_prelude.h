// Host emulation of the CUDA prelude and of the CUDA types the small-group convolution kernels
// use (conv/smallgroup.cuh, and the GEMM epilogue they include): see src/main.rs.
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
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__
#define __expf expf
#define __fdividef(a, b) ((a) / (b))
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
struct uint4 { unsigned x, y, z, w; };
static inline float2 make_float2(float a, float b) { return {a, b}; }
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
// The shared memory of the block running (blocks run one after another).
extern float4 emu_smem[];
struct __half { _Float16 v; };
struct __half2 { __half x, y; };
struct __nv_bfloat16 { uint16_t b; };
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
static inline float __half2float(__half h) { return (float)h.v; }
static inline __half __float2half_rn(float f) { return {(_Float16)f}; }
static inline __half __double2half(double f) { return {(_Float16)f}; }
static inline float2 __half22float2(__half2 h) { return {(float)h.x.v, (float)h.y.v}; }
static inline __half2 __floats2half2_rn(float a, float b) { return {__float2half_rn(a), __float2half_rn(b)}; }
static inline float __bfloat162float(__nv_bfloat16 h) { unsigned u = (unsigned)h.b << 16; return __uint_as_float(u); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    unsigned b = __float_as_uint(f);
    if ((b & 0x7fffffffu) > 0x7f800000u) return {(uint16_t)((b >> 16) | 0x40)};
    unsigned r = b + 0x7fffu + ((b >> 16) & 1u);
    return {(uint16_t)(r >> 16)};
}
static inline __nv_bfloat16 __double2bfloat16(double f) { return __float2bfloat16_rn((float)f); }
static inline float2 __bfloat1622float2(__nv_bfloat162 h) { return {__bfloat162float(h.x), __bfloat162float(h.y)}; }
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)}; }
#define GRID_STRIDE(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)
static inline void pdl_site() {}
