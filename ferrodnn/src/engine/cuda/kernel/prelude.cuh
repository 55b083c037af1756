// The prelude: included at the top of every kernel ferrodnn compiles (kernel/source.rs puts it
// there, after the launch's FDNN_PDL).
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
typedef long long i64;
struct TRef { i64 dims[8]; i64 strides[8]; int rank; int pad; };

// Loads: element `o` (in elements) of a buffer, as double.
__device__ __forceinline__ double ld_f64(const void* p, i64 o) { return ((const double*)p)[o]; }
__device__ __forceinline__ double ld_f32(const void* p, i64 o) { return (double)((const float*)p)[o]; }
__device__ __forceinline__ double ld_f16(const void* p, i64 o) { return (double)__half2float(((const __half*)p)[o]); }
__device__ __forceinline__ double ld_bf16(const void* p, i64 o) { return (double)__bfloat162float(((const __nv_bfloat16*)p)[o]); }
__device__ __forceinline__ double ld_fp8_e4m3(const void* p, i64 o) {
    __half_raw h = __nv_cvt_fp8_to_halfraw(((const __nv_fp8_storage_t*)p)[o], __NV_E4M3);
    return (double)__half2float(__half(h));
}
__device__ __forceinline__ double ld_fp8_e5m2(const void* p, i64 o) {
    __half_raw h = __nv_cvt_fp8_to_halfraw(((const __nv_fp8_storage_t*)p)[o], __NV_E5M2);
    return (double)__half2float(__half(h));
}
__device__ __forceinline__ double ld_i8(const void* p, i64 o) { return (double)((const signed char*)p)[o]; }
__device__ __forceinline__ double ld_u8(const void* p, i64 o) { return (double)((const unsigned char*)p)[o]; }
__device__ __forceinline__ double ld_i32(const void* p, i64 o) { return (double)((const int*)p)[o]; }
__device__ __forceinline__ double ld_i64(const void* p, i64 o) { return (double)((const long long*)p)[o]; }
__device__ __forceinline__ double ld_bool(const void* p, i64 o) { return ((const unsigned char*)p)[o] != 0 ? 1.0 : 0.0; }

// Stores: round `v` to the type as the CPU engine does.
__device__ __forceinline__ double sat_round(double v, double lo, double hi) {
    if (isnan(v)) return 0.0;
    return fmin(fmax(round(v), lo), hi);
}
__device__ __forceinline__ void st_f64(void* p, i64 o, double v) { ((double*)p)[o] = v; }
__device__ __forceinline__ void st_f32(void* p, i64 o, double v) { ((float*)p)[o] = (float)v; }
__device__ __forceinline__ void st_f16(void* p, i64 o, double v) { ((__half*)p)[o] = __double2half(v); }
__device__ __forceinline__ void st_bf16(void* p, i64 o, double v) { ((__nv_bfloat16*)p)[o] = __double2bfloat16(v); }
__device__ __forceinline__ void st_fp8_e4m3(void* p, i64 o, double v) {
    ((__nv_fp8_storage_t*)p)[o] = __nv_cvt_double_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ void st_fp8_e5m2(void* p, i64 o, double v) {
    ((__nv_fp8_storage_t*)p)[o] = __nv_cvt_double_to_fp8(v, __NV_SATFINITE, __NV_E5M2);
}
__device__ __forceinline__ void st_i8(void* p, i64 o, double v) { ((signed char*)p)[o] = (signed char)sat_round(v, -128.0, 127.0); }
__device__ __forceinline__ void st_u8(void* p, i64 o, double v) { ((unsigned char*)p)[o] = (unsigned char)sat_round(v, 0.0, 255.0); }
__device__ __forceinline__ void st_i32(void* p, i64 o, double v) { ((int*)p)[o] = (int)sat_round(v, -2147483648.0, 2147483647.0); }
__device__ __forceinline__ void st_i64(void* p, i64 o, double v) {
    double r = sat_round(v, -9223372036854775808.0, 9223372036854775807.0);
    ((long long*)p)[o] = r >= 9223372036854775807.0 ? 9223372036854775807LL : (long long)r;
}
__device__ __forceinline__ void st_bool(void* p, i64 o, double v) { ((unsigned char*)p)[o] = (v != 0.0 && !isnan(v)) ? 1 : 0; }

// Round a double to what a type can hold (the CPU engine's DataType::quantize), for values a
// kernel keeps in registers but the reference rounds (e.g. inputs rounded to the compute type).
__device__ __forceinline__ double q_f32(double v) { return (double)(float)v; }

// The element count of a tensor.
__device__ __forceinline__ i64 numel(const TRef& t) { i64 n = 1; for (int a = 0; a < t.rank; ++a) n *= t.dims[a]; return n; }

// Strided offset of the element at row-major logical index `flat`.
__device__ __forceinline__ i64 offset_of(const TRef& t, i64 flat) {
    i64 off = 0;
    for (int a = t.rank - 1; a >= 0; --a) { i64 i = flat % t.dims[a]; flat /= t.dims[a]; off += i * t.strides[a]; }
    return off;
}

// Multi-index of row-major logical index `flat` in `t`'s dims.
__device__ __forceinline__ void unravel(const TRef& t, i64 flat, i64* idx) {
    for (int a = t.rank - 1; a >= 0; --a) { idx[a] = flat % t.dims[a]; flat /= t.dims[a]; }
}

// Strided offset of a multi-index.
__device__ __forceinline__ i64 offset_at(const TRef& t, const i64* idx) {
    i64 off = 0;
    for (int a = 0; a < t.rank; ++a) off += idx[a] * t.strides[a];
    return off;
}

// Offset in `t` of the element a numpy-broadcast read at output index `idx` (of rank
// `out_rank`) sees: dims align on the right, size-1 dims repeat.
__device__ __forceinline__ i64 bcast_offset(const TRef& t, const i64* idx, int out_rank) {
    i64 off = 0;
    int shift = out_rank - t.rank;
    for (int a = 0; a < t.rank; ++a) { i64 i = t.dims[a] == 1 ? 0 : idx[a + shift]; off += i * t.strides[a]; }
    return off;
}

#define GRID_STRIDE(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

// Programmatic dependent launch (sm_90 and newer). A kernel calls pdl_site() once, before its
// first access to memory another kernel may write (only L2 prefetches may come before it): when
// the plan launches the kernel as a programmatic dependent (FDNN_PDL 1 or 2), it waits there until
// the kernels before it in the stream have completed and their writes are visible, and with
// FDNN_PDL 1 then lets the next kernel launch (whose blocks wait the same way, taking only the SM
// slots this kernel's finished blocks leave). With FDNN_PDL 0 it is empty.
#ifndef FDNN_PDL
#define FDNN_PDL 0
#endif
__device__ __forceinline__ void pdl_site() {
#if FDNN_PDL != 0 && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#if FDNN_PDL == 1
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
#endif
}
