// The gathered operands of the Hopper GEMM (GEMM_GATHER, an implicit GEMM: see gather.rs): the
// producer warpgroups' GEMM_PRODUCERS threads bring each stage's A (BM x 64 k) and B (BN x 64 k) in through
// the index maps of gather.cuh, in the 128-byte-swizzled layouts that TMA would have written and
// wgmma reads (K-major: a 128-byte row of 64 k per m or n; M/N-major: 64-wide chunks of m or n,
// a 128-byte row per k, 8192 bytes a chunk), 16 bytes at a time by cp.async (zero-filled outside
// the tensor) where the operand's contiguous index allows (GEMM_GA_VEC, GEMM_GB_VEC), else one
// element at a time. 16-bit operands of the kernel's one type only.
//
// Comes after gather.cuh and sm90_common.cuh; reads GEMM_K (the reduction's extent) and
// GEMM_PRODUCERS (the producer threads: 128 or 256).

#define K_ ((long long)GEMM_K)

__device__ __forceinline__ void g90_cp16(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void g90_st16(unsigned dst, unsigned short v) {
    asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(dst), "h"(v) : "memory");
}

// Byte offset of element (mn, k) of a stage's operand tile: K-major rows of 64 k (the 16-byte
// unit swizzled by mn % 8), or M/N-major chunks of 64 mn by 64 k rows (the unit swizzled by k % 8).
template <bool MN_MAJOR> __device__ __forceinline__ unsigned g90_at(int mn, int k) {
    if constexpr (MN_MAJOR) {
        return (unsigned)(mn >> 6) * 8192u + (unsigned)k * 128u + ((unsigned)(((mn & 63) >> 3) ^ (k & 7)) << 4) + (unsigned)(mn & 7) * 2u;
    } else {
        return (unsigned)mn * 128u + ((unsigned)((k >> 3) ^ (mn & 7)) << 4) + (unsigned)(k & 7) * 2u;
    }
}

// Element (mn, k) of the tile of operand X whose first indices are mn0 and k0: its bits, zero
// past the extents (`mn_left`, `k_left` from the tile's origin) and outside the tensor.
template <int X> __device__ __forceinline__ unsigned short g90_elem(const char* g, unsigned mn0, unsigned k0, int mn, int k, long long mn_left, long long k_left) {
    long long off = 0;
    const bool ok = mn < mn_left && k < k_left && gt_offset<X>(gt_index<X, 0>(mn0 + mn), gt_index<X, 1>(k0 + k), off);
    return ok ? ((const unsigned short*)g)[off] : (unsigned short)0;
}

// The producer threads (two warpgroups: a stage's gathers take more issue slots than one
// warpgroup has while the consumers' wgmmas run).
#define G90_P GEMM_PRODUCERS
// k rows a pass of the producers' vectors covers in an M/N-major tile, and the passes over 64.
#define G90_RP (G90_P / 8)
#define G90_KN (64 / G90_RP)

// Which vectors of a stage producer thread `ptid` loads (16-byte vectors): its i-th is, K-major,
// row (mn) ptid / 8 + RP i at k (ptid % 8) * 8; M/N-major, k row ptid / 8 + RP (i % KN) at mn
// (i / KN) * 64 + (ptid % 8) * 8. So a thread's vectors share their k (K-major) or fall on KN k
// rows and EXT / 64 mn positions (M/N-major).
//
// What a producer thread keeps of a tile between its stages, with 16-byte vectors: the index
// parts of its m or n positions (the same every stage), so a stage adds only its k parts.
template <int EXT, bool MN_MAJOR, bool VEC> struct g90_rows {
    static constexpr int N = !VEC ? 1 : MN_MAJOR ? EXT / 64 : EXT * 8 / G90_P;
    gt_part p[N];
};

// A tile's positions along m or n for producer thread `ptid`, from the tile's first, `mn0`.
template <int X, int EXT, bool MN_MAJOR, bool VEC> __device__ __forceinline__ void g90_prepare(g90_rows<EXT, MN_MAJOR, VEC>& rows, unsigned mn0, int ptid) {
    if constexpr (VEC && !MN_MAJOR) {
        #pragma unroll
        for (int i = 0; i < EXT * 8 / G90_P; ++i) rows.p[i] = gt_index<X, 0>(mn0 + (unsigned)((ptid >> 3) + G90_RP * i));
    } else if constexpr (VEC) {
        #pragma unroll
        for (int q = 0; q < EXT / 64; ++q) rows.p[q] = gt_index<X, 0>(mn0 + (unsigned)(q * 64 + (ptid & 7) * 8));
    }
}

// Operand X's tile of one stage: EXT along m or n (from `mn0`; `rows` prepared from it) by 64 k
// (from `k0`) into `dst`, by producer thread `ptid`. VEC: 16-byte vectors along the contiguous
// index (k for a K-major tile, mn for an M/N-major one; its extent a multiple of 8), left in
// flight (the caller commits and waits).
template <int X, int EXT, bool MN_MAJOR, bool VEC>
__device__ __forceinline__ void g90_stage(unsigned dst, const char* __restrict__ g, const g90_rows<EXT, MN_MAJOR, VEC>& rows, unsigned mn0, unsigned k0, long long mn_left, long long k_left, int ptid) {
    if constexpr (VEC) {
        constexpr int ITERS = EXT * 8 / G90_P;
        // The k parts of the thread's vectors (one K-major, KN M/N-major).
        constexpr int KN = MN_MAJOR ? G90_KN : 1;
        gt_part kp[KN];
        #pragma unroll
        for (int r = 0; r < KN; ++r) kp[r] = gt_index<X, 1>(k0 + (unsigned)(MN_MAJOR ? (ptid >> 3) + G90_RP * r : (ptid & 7) * 8));
        #pragma unroll
        for (int i = 0; i < ITERS; ++i) {
            // The vector's first element (mn, k), and whether it lies inside both extents (the
            // contiguous index's extent is a whole number of vectors: gather.rs). No branch, so
            // that the vectors' address computations interleave.
            const int mn = MN_MAJOR ? (i / KN) * 64 + (ptid & 7) * 8 : (ptid >> 3) + G90_RP * i;
            const int k = MN_MAJOR ? (ptid >> 3) + G90_RP * (i % KN) : (ptid & 7) * 8;
            long long off = 0;
            const bool ok = gt_offset<X>(rows.p[MN_MAJOR ? i / KN : i], kp[i % KN], off) && mn < mn_left && k < k_left;
            // Outside the tensor (padding) or past the extents: zero fill (source size 0) from
            // the base pointer.
            g90_cp16(dst + g90_at<MN_MAJOR>(mn, k), ok ? g + off * 2 : g, ok ? 16 : 0);
        }
    } else {
        // One element a thread at a time, consecutive threads along k (K-major) or mn.
        constexpr int ITERS = EXT * 64 / G90_P;
        #pragma unroll 4
        for (int i = 0; i < ITERS; ++i) {
            const int id = ptid + i * G90_P;
            const int mn = MN_MAJOR ? id % EXT : id >> 6;
            const int k = MN_MAJOR ? id / EXT : id & 63;
            g90_st16(dst + g90_at<MN_MAJOR>(mn, k), g90_elem<X>(g, mn0, k0, mn, k, mn_left, k_left));
        }
    }
}
