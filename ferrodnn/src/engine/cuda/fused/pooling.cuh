// What the NHWC 2D pooling kernels (fused/pooling.rs) share, after vectors.cuh; the kernels'
// templates (pool_window.cuh, pool_tiled.cuh, pool_strip.cuh, pool_backward.cuh) follow it.
//
// The instantiation defines:
//   POOL_MODE     POOL_MAX, POOL_AVG_INCL (average, the divisor counting the padding inside the
//                 padded input) or POOL_AVG_EXCL (average over the real positions)
//   POOL_SMALL    1: 32-bit index arithmetic (IU, IS), 0: 64-bit
//   POOL_UNROLL   1: the loops over a window's taps are unrolled (POOL_PRAGMA_UNROLL)
//   the shapes, as numbers of the index type: C_ and CV (channels and 16-byte vectors of them),
//   H_, W_ (input), P_, Q_ (output), KH, KW (window), SH, SW (stride), PREH, PREW, POSTH, POSTW
//   (padding)
//
// Max pooling works on raw 32-bit words of x (two 16-bit elements or one f32): NEG is two
// elements' neutral value (-inf) and QNAN two quiet NaNs; max2 takes the maximum with the CPU's
// rule (a NaN wins), vmax over 16 bytes; st_raw stores 16 raw bytes to y. Max pooling backward
// keeps each output vector's window taps of the maximum as VEC bytes (IDXW, IdxV).

#define POOL_MAX 1
#define POOL_AVG_INCL 2
#define POOL_AVG_EXCL 3

#if POOL_SMALL
typedef unsigned int IU;
typedef int IS;
#else
typedef unsigned long long IU;
typedef long long IS;
#endif

#if POOL_UNROLL
#define POOL_PRAGMA_UNROLL _Pragma("unroll")
#else
#define POOL_PRAGMA_UNROLL _Pragma("unroll 1")
#endif

#if X_DT == DT_F16
#define NEG 0xfc00fc00u
#define QNAN 0x7e007e00u
__device__ __forceinline__ unsigned int max2(unsigned int a, unsigned int b) {
    __half2 r = __hmax2_nan(*(const __half2*)&a, *(const __half2*)&b);
    return *(const unsigned int*)&r;
}
#elif X_DT == DT_BF16
#define NEG 0xff80ff80u
#define QNAN 0x7fc07fc0u
__device__ __forceinline__ unsigned int max2(unsigned int a, unsigned int b) {
    __nv_bfloat162 r = __hmax2_nan(*(const __nv_bfloat162*)&a, *(const __nv_bfloat162*)&b);
    return *(const unsigned int*)&r;
}
#else
#define NEG 0xff800000u
#define QNAN 0x7fc00000u
__device__ __forceinline__ unsigned int max2(unsigned int a, unsigned int b) {
    const float x = __uint_as_float(a), y = __uint_as_float(b);
    return (y > x || y != y) ? b : a;
}
#endif

__device__ __forceinline__ uint4 vmax(uint4 a, uint4 b) { return make_uint4(max2(a.x, b.x), max2(a.y, b.y), max2(a.z, b.z), max2(a.w, b.w)); }

__device__ __forceinline__ void st_raw(YT* p, bool al, uint4 u) {
    if (al) {
        *(uint4*)p = u;
    } else {
        const YT* e = (const YT*)&u;
#pragma unroll
        for (int k = 0; k < VEC; ++k) p[k] = e[k];
    }
}

// VEC argmax bytes of one output vector.
#if VEC == 8
typedef unsigned long long IDXW;
#else
typedef unsigned int IDXW;
#endif
union IdxV {
    IDXW u;
    unsigned char b[VEC];
};
