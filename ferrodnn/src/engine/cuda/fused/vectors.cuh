// 16-byte vectors of channels, for the channels-last kernels (fused/channels.rs: batchnorm,
// genstats, instancenorm, pooling): x read 16 bytes (VEC elements) at a time and converted to
// float, y written VEC elements at a time (a vector store where aligned).
//
// The instantiation defines:
//   X_DT, Y_DT   the types of x and y: DT_F32, DT_F16 or DT_BF16
//   VEC          elements of x in 16 bytes
//   YVB          bytes of VEC elements of y (the alignment its vector stores need)
//   YAL          the alignment a y base needs for those stores (16 bytes at most)
//
// It gives XT and YT (the element types), x2f and f2y (one element to and from float),
// ldx_raw (16 bytes of x, a vector load when `al`, else element by element), cvt_x (16 bytes
// of x to VEC floats) and st_y (VEC floats to y).

#define DT_F32 1
#define DT_F16 2
#define DT_BF16 3

#if X_DT == DT_F16
typedef __half XT;
#elif X_DT == DT_BF16
typedef __nv_bfloat16 XT;
#else
typedef float XT;
#endif

#if Y_DT == DT_F16
typedef __half YT;
#elif Y_DT == DT_BF16
typedef __nv_bfloat16 YT;
#else
typedef float YT;
#endif

__device__ __forceinline__ float x2f(XT v) {
#if X_DT == DT_F16
    return __half2float(v);
#elif X_DT == DT_BF16
    return __bfloat162float(v);
#else
    return v;
#endif
}

__device__ __forceinline__ YT f2y(float v) {
#if Y_DT == DT_F16
    return __float2half_rn(v);
#elif Y_DT == DT_BF16
    return __float2bfloat16_rn(v);
#else
    return v;
#endif
}

__device__ __forceinline__ uint4 ldx_raw(const XT* p, bool al) {
    if (al) return *(const uint4*)p;
    uint4 u;
    XT* e = (XT*)&u;
#pragma unroll
    for (int k = 0; k < VEC; ++k) e[k] = p[k];
    return u;
}

__device__ __forceinline__ void cvt_x(uint4 u, float* f) {
#if X_DT == DT_F16
    const __half2* h = (const __half2*)&u;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        float2 t = __half22float2(h[k]);
        f[2 * k] = t.x;
        f[2 * k + 1] = t.y;
    }
#elif X_DT == DT_BF16
    const __nv_bfloat162* h = (const __nv_bfloat162*)&u;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        float2 t = __bfloat1622float2(h[k]);
        f[2 * k] = t.x;
        f[2 * k + 1] = t.y;
    }
#else
    f[0] = __uint_as_float(u.x);
    f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z);
    f[3] = __uint_as_float(u.w);
#endif
}

__device__ __forceinline__ void st_y(YT* p, bool al, const float* f) {
    if (al) {
        // VEC elements of y packed in 32-bit words.
        unsigned int w[YVB / 4];
#if Y_DT == DT_F16
#pragma unroll
        for (int k = 0; k < VEC / 2; ++k) {
            __half2 h = __floats2half2_rn(f[2 * k], f[2 * k + 1]);
            w[k] = *(const unsigned int*)&h;
        }
#elif Y_DT == DT_BF16
#pragma unroll
        for (int k = 0; k < VEC / 2; ++k) {
            __nv_bfloat162 h = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]);
            w[k] = *(const unsigned int*)&h;
        }
#else
#pragma unroll
        for (int k = 0; k < VEC; ++k) w[k] = __float_as_uint(f[k]);
#endif
#if YVB == 8
        *(uint2*)p = make_uint2(w[0], w[1]);
#elif YVB == 16
        *(uint4*)p = make_uint4(w[0], w[1], w[2], w[3]);
#else
        ((uint4*)p)[0] = make_uint4(w[0], w[1], w[2], w[3]);
        ((uint4*)p)[1] = make_uint4(w[4], w[5], w[6], w[7]);
#endif
    } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) p[k] = f2y(f[k]);
    }
}
