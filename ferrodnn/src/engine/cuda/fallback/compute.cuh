// Helpers the contraction kernels of the generic fallback share (conv.cuh, matmul.cuh): the
// rounding of inputs to the node's compute type, and the unravelling of a thread index in a
// tensor's memory order.
//
// The instantiation defines:
//   CVQ        how cvq rounds: CVQ_NONE (integer compute types), CVQ_F32, CVQ_F16, CVQ_BF16 or
//              CVQ_FP8 (with CVQ_FP8_KIND: __NV_E4M3 or __NV_E5M2)

#define CVQ_NONE 0
#define CVQ_F32 1
#define CVQ_F16 2
#define CVQ_BF16 3
#define CVQ_FP8 4

// A value rounded to the node's compute type, as the CPU engine's `compute.quantize` does for
// float compute types (integer compute types round nothing).
__device__ __forceinline__ double cvq(double v) {
#if CVQ == CVQ_F32
    return q_f32(v);
#elif CVQ == CVQ_F16
    return (double)__half2float(__double2half(v));
#elif CVQ == CVQ_BF16
    return (double)__bfloat162float(__double2bfloat16(v));
#elif CVQ == CVQ_FP8
    __half_raw h = __nv_cvt_fp8_to_halfraw(__nv_cvt_double_to_fp8(v, __NV_SATFINITE, CVQ_FP8_KIND), CVQ_FP8_KIND);
    return (double)__half2float(__half(h));
#else
    return v;
#endif
}

// Unravels `flat` into the logical multi-index `idx` of `t`, walking the `r` axes in `ord`
// (slowest first).
__device__ __forceinline__ void unravel_ord(const TRef& t, const int* ord, int r, i64 flat, i64* idx) {
    for (int q = r - 1; q >= 0; --q) {
        int a = ord[q];
        idx[a] = flat % t.dims[a];
        flat /= t.dims[a];
    }
}
