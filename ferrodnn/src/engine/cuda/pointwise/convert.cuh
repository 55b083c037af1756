// The arithmetic type `fz_t` of the fused pointwise kernels and the GEMM epilogue, and the
// conversions between it and the types they load and store: fz_cv(x) to fz_t, fz_to_<type>(v)
// from it (round to nearest even).
//
// Reads:
//   FZ_DOUBLE   1: double arithmetic; 0: float
#ifndef FDNN_POINTWISE_CONVERT
#define FDNN_POINTWISE_CONVERT
#if FZ_DOUBLE
typedef double fz_t;
__device__ __forceinline__ double fz_cv(double x) { return x; }
__device__ __forceinline__ double fz_cv(float x) { return (double)x; }
__device__ __forceinline__ double fz_cv(__half x) { return (double)__half2float(x); }
__device__ __forceinline__ double fz_cv(__nv_bfloat16 x) { return (double)__bfloat162float(x); }
__device__ __forceinline__ double fz_to_f64(double v) { return v; }
__device__ __forceinline__ float fz_to_f32(double v) { return (float)v; }
__device__ __forceinline__ __half fz_to_f16(double v) { return __double2half(v); }
__device__ __forceinline__ __nv_bfloat16 fz_to_bf16(double v) { return __double2bfloat16(v); }
#else
typedef float fz_t;
__device__ __forceinline__ float fz_cv(float x) { return x; }
__device__ __forceinline__ float fz_cv(__half x) { return __half2float(x); }
__device__ __forceinline__ float fz_cv(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float fz_to_f32(float v) { return v; }
__device__ __forceinline__ __half fz_to_f16(float v) { return __float2half_rn(v); }
__device__ __forceinline__ __nv_bfloat16 fz_to_bf16(float v) { return __float2bfloat16_rn(v); }
#endif
#endif
