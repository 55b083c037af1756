// The shared header of the fast row kernels (fused/rows.rs, norm.rs, softmax.rs): conversions,
// vector loads and stores of V consecutive elements, team reductions, the row load, mean and
// variance passes of the lane-team kernels, and their loop over rows.
//
// Reads ROW_LANES (for the loop macros FR_TEAM, FR_FIRST_ROW, FR_ROW_STEP and FR_ROW, which
// also name the kernel's constants TS, BS and N) where the instantiation defines it.

__device__ __forceinline__ float fr_tof(float v) { return v; }
__device__ __forceinline__ float fr_tof(__half v) { return __half2float(v); }
__device__ __forceinline__ float fr_tof(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void fr_fromf(float v, float& o) { o = v; }
__device__ __forceinline__ void fr_fromf(float v, __half& o) { o = __float2half_rn(v); }
__device__ __forceinline__ void fr_fromf(float v, __nv_bfloat16& o) { o = __float2bfloat16_rn(v); }

// A value rounded to type T and back (the CPU stores each node's result in its tensor's type).
template <typename T>
__device__ __forceinline__ float fr_q(float v) {
    T t;
    fr_fromf(v, t);
    return fr_tof(t);
}

// Whether pointer p is aligned to `bytes` (a power of two): the run-time part of a kernel's
// alignment flag (ROW_ALIGNED), the plan-time part being the row strides.
#define FR_AL(p, bytes) (((unsigned long long)(p) & ((bytes) - 1ULL)) == 0)

// V consecutive elements from p, as floats: 16- or 8-byte loads when `al` (the caller checked
// the alignment), else one element at a time.
template <typename T, int V>
__device__ __forceinline__ void fr_ld(const T* p, float* v, bool al) {
    constexpr int B = V * (int)sizeof(T);
    if constexpr (B % 16 == 0) {
        if (al) {
            uint4 q[B / 16];
#pragma unroll
            for (int k = 0; k < B / 16; ++k) q[k] = __ldg(reinterpret_cast<const uint4*>(p) + k);
            const T* e = reinterpret_cast<const T*>(q);
#pragma unroll
            for (int i = 0; i < V; ++i) v[i] = fr_tof(e[i]);
            return;
        }
    } else if constexpr (B % 8 == 0) {
        if (al) {
            uint2 q[B / 8];
#pragma unroll
            for (int k = 0; k < B / 8; ++k) q[k] = __ldg(reinterpret_cast<const uint2*>(p) + k);
            const T* e = reinterpret_cast<const T*>(q);
#pragma unroll
            for (int i = 0; i < V; ++i) v[i] = fr_tof(e[i]);
            return;
        }
    }
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = fr_tof(p[i]);
}

// V floats to consecutive elements at p, rounded to nearest even; vector stores when `al`.
template <typename T, int V>
__device__ __forceinline__ void fr_st(T* p, const float* v, bool al) {
    constexpr int B = V * (int)sizeof(T);
    if constexpr (B % 16 == 0) {
        if (al) {
            uint4 q[B / 16];
            T* e = reinterpret_cast<T*>(q);
#pragma unroll
            for (int i = 0; i < V; ++i) fr_fromf(v[i], e[i]);
#pragma unroll
            for (int k = 0; k < B / 16; ++k) reinterpret_cast<uint4*>(p)[k] = q[k];
            return;
        }
    } else if constexpr (B % 8 == 0) {
        if (al) {
            uint2 q[B / 8];
            T* e = reinterpret_cast<T*>(q);
#pragma unroll
            for (int i = 0; i < V; ++i) fr_fromf(v[i], e[i]);
#pragma unroll
            for (int k = 0; k < B / 8; ++k) reinterpret_cast<uint2*>(p)[k] = q[k];
            return;
        }
    }
#pragma unroll
    for (int i = 0; i < V; ++i) fr_fromf(v[i], p[i]);
}

// The raw bytes of V consecutive elements of type T, as 32-bit words (kept in registers while
// a load is in flight), loaded with 16- or 8-byte accesses when `al`.
template <typename T, int V>
struct alignas((V * sizeof(T)) % 16 == 0 ? 16 : ((V * sizeof(T)) % 8 == 0 ? 8 : 4)) FrRaw {
    unsigned w[(V * sizeof(T) + 3) / 4];
};
template <typename T, int V>
__device__ __forceinline__ void fr_ldraw(const T* p, FrRaw<T, V>& r, bool al) {
    constexpr int B = V * (int)sizeof(T);
    if constexpr (B % 16 == 0) {
        if (al) {
#pragma unroll
            for (int k = 0; k < B / 16; ++k) reinterpret_cast<uint4*>(r.w)[k] = __ldg(reinterpret_cast<const uint4*>(p) + k);
            return;
        }
    } else if constexpr (B % 8 == 0) {
        if (al) {
#pragma unroll
            for (int k = 0; k < B / 8; ++k) reinterpret_cast<uint2*>(r.w)[k] = __ldg(reinterpret_cast<const uint2*>(p) + k);
            return;
        }
    }
    T* e = reinterpret_cast<T*>(r.w);
#pragma unroll
    for (int i = 0; i < V; ++i) e[i] = p[i];
}
template <typename T, int V>
__device__ __forceinline__ void fr_zero(FrRaw<T, V>& r) {
#pragma unroll
    for (int k = 0; k < (int)(sizeof(r.w) / 4); ++k) r.w[k] = 0u;
}
template <typename T, int V>
__device__ __forceinline__ void fr_cvt(const FrRaw<T, V>& r, float* v) {
    const T* e = reinterpret_cast<const T*>(r.w);
#pragma unroll
    for (int i = 0; i < V; ++i) v[i] = fr_tof(e[i]);
}

// Sums of v[0..K) over a team of TS threads; every member gets the same bits. TS <= 32: a
// group of lanes of one warp (xor butterfly: a + b == b + a, so all lanes agree); TS > 32: the
// whole block (TS == blockDim.x), the warps' sums meeting in sh (32 * K floats) and added in
// warp order. Every thread of the warp (block) must call it.
template <int TS, int K>
__device__ __forceinline__ void fr_sum(float* v, float* sh) {
    constexpr int W = TS < 32 ? TS : 32;
#pragma unroll
    for (int o = W / 2; o > 0; o >>= 1) {
#pragma unroll
        for (int k = 0; k < K; ++k) v[k] += __shfl_xor_sync(0xffffffffu, v[k], o);
    }
    if constexpr (TS > 32) {
        const int w = threadIdx.x >> 5;
        if ((threadIdx.x & 31) == 0) {
#pragma unroll
            for (int k = 0; k < K; ++k) sh[k * 32 + w] = v[k];
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < K; ++k) {
            float s = sh[k * 32];
#pragma unroll
            for (int i = 1; i < TS / 32; ++i) s += sh[k * 32 + i];
            v[k] = s;
        }
    }
}

// Maximum of v over a team, as fr_sum.
template <int TS>
__device__ __forceinline__ float fr_max(float v, float* sh) {
    constexpr int W = TS < 32 ? TS : 32;
#pragma unroll
    for (int o = W / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if constexpr (TS > 32) {
        const int w = threadIdx.x >> 5;
        if ((threadIdx.x & 31) == 0) sh[w] = v;
        __syncthreads();
        float m = sh[0];
#pragma unroll
        for (int i = 1; i < TS / 32; ++i) m = fmaxf(m, sh[i]);
        v = m;
    }
    return v;
}

// The lane-team kernels (a team of TS threads holds a row in registers, CPT chunks of V
// elements each, chunk c at thread c % TS: `lt`, the thread's place in its team).

// A row of C chunks at p into v, as floats; zeros past the row's end and where !ok.
template <int TS, int C, typename T, int CPT, int V>
__device__ __forceinline__ void fr_load_row(const T* p, float (&v)[CPT][V], int lt, bool ok, bool al) {
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
        const int c = lt + k * TS;
        if (ok && c < C) {
            fr_ld<T, V>(p + (i64)c * V, v[k], al);
        } else {
#pragma unroll
            for (int i = 0; i < V; ++i) v[k][i] = 0.0f;
        }
    }
}

// Two rows (at p into u, at q into g) as fr_load_row, their loads interleaved.
template <int TS, int C, typename T, typename U, int CPT, int V>
__device__ __forceinline__ void fr_load_rows(const T* p, float (&u)[CPT][V], const U* q, float (&g)[CPT][V], int lt, bool ok, bool al) {
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
        const int c = lt + k * TS;
        if (ok && c < C) {
            fr_ld<T, V>(p + (i64)c * V, u[k], al);
            fr_ld<U, V>(q + (i64)c * V, g[k], al);
        } else {
#pragma unroll
            for (int i = 0; i < V; ++i) {
                u[k][i] = 0.0f;
                g[k][i] = 0.0f;
            }
        }
    }
}

// The mean of a row of `hf` elements in v (zeros past its end), over the team; the reduction
// takes the next of the two buffers of 32 floats at red.
template <int TS, int CPT, int V>
__device__ __forceinline__ float fr_row_mean(const float (&v)[CPT][V], float* red, int& rb, float hf) {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < CPT; ++k)
#pragma unroll
        for (int i = 0; i < V; ++i) s += v[k][i];
    fr_sum<TS, 1>(&s, red + (rb++ & 1) * 32);
    return s / hf;
}

// 1 / sqrt(variance + eps) of a row of `hf` elements in v around `mean` (the squared deviations
// summed over the row's chunks only), as fr_row_mean.
template <int TS, int C, int CPT, int V>
__device__ __forceinline__ float fr_row_inv(const float (&v)[CPT][V], float mean, int lt, float* red, int& rb, float hf, float eps) {
    float q = 0.0f;
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
        if (lt + k * TS < C) {
#pragma unroll
            for (int i = 0; i < V; ++i) {
                const float d = v[k][i] - mean;
                q += d * d;
            }
        }
    }
    fr_sum<TS, 1>(&q, red + (rb++ & 1) * 32);
    return 1.0f / sqrtf(q / hf + eps);
}

// The loop over a lane-team kernel's rows:
//     FR_TEAM;
//     for (i64 r0 = FR_FIRST_ROW; r0 < N; r0 += FR_ROW_STEP) {
//         FR_ROW(r0);
//         ...
// FR_TEAM defines `lt`; FR_ROW defines `r` (the row) and `ok` (r < N). ROW_LANES: a team of
// TS <= 32 lanes of a warp (32 / TS rows per warp a step); lane teams share the warp's trip
// count so that the shuffles see every lane. Else a block per row (TS == BS).
#if defined(ROW_LANES) && ROW_LANES
#define FR_TEAM                                                   \
    const int lane = threadIdx.x & 31;                            \
    const int lt = lane & (TS - 1);                               \
    const i64 gw = ((i64)blockIdx.x * BS + threadIdx.x) >> 5;     \
    const i64 nw = ((i64)gridDim.x * BS) >> 5
#define FR_FIRST_ROW (gw * (32 / TS))
#define FR_ROW_STEP (nw * (32 / TS))
#define FR_ROW(r0)                 \
    const i64 r = (r0) + lane / TS; \
    const bool ok = r < N
#else
#define FR_TEAM const int lt = threadIdx.x
#define FR_FIRST_ROW blockIdx.x
#define FR_ROW_STEP gridDim.x
#define FR_ROW(r0)     \
    const i64 r = (r0); \
    const bool ok = true
#endif
