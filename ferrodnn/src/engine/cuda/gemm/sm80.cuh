// The general tensor-core GEMM kernel (see sm80.rs): mma.sync fed by a multi-stage cp.async
// pipeline, `BM x BN` tiles of C (or of a split's f32 partial sums) for every batch, warp tiles of
// 16-row by 8-column mma tiles.
//
// Comes after common.cuh, sm80_common.cuh and (without a split) the epilogue, and reads, besides
// their defines:
//   GM_MMA                what the tensor cores multiply: GM_MMA_F16, GM_MMA_BF16 (16-bit operands
//                         in shared memory, m16n8k16), GM_MMA_TF32 (f32 in shared memory, one
//                         m16n8k8 tf32 mma), GM_MMA_TF32X3 (three tf32 mmas on a high/low split)
//                         or GM_MMA_S8 (8-bit integers, K-major tiles, m16n8k32 into exact i32
//                         accumulators)
//   GM_BM, GM_BN, GM_BK   the block tile; GM_WARPS_M, GM_WARPS_N its warps; GM_MIN_BLOCKS blocks
//                         an SM should hold (launch bounds)
//   GM_STAGES             the pipeline's stages
//   GM_TM, GM_TN, GM_KT   tiles along M and N, k tiles; GM_GROUP tile rows a group of the tile
//                         order walks together
//   GM_SPLITS, GM_KT_PER  ways k is split (1: none; then the kernel writes f32 partial tiles to
//                         `gm_ws`) and k tiles a split
//   GM_A_KMAJOR, GM_B_KMAJOR  1: the operand tile is K-major in shared memory (A [m][k], B [n][k]),
//                         0: M/N-major ([k][m], [k][n])
//   GM_A_ASYNC, GM_B_ASYNC  1: 16-byte cp.async along the contiguous dim, 0: one element at a time
//   GM_A_PITCH, GM_B_PITCH  row pitch of a tile in shared memory (elements); GM_A_STAGE,
//                         GM_B_STAGE elements a stage
//   GM_PAIR_STORE         1: two neighbouring columns of C stored at once
//   GM_INT_EXACT          1: (8-bit integers) the i32 accumulators stored into an integer C as
//                         they are, saturated, instead of through the f32 epilogue
//   EPI_NAMES             the epilogue's side-input arguments (`, e0, ...`)
//   GM_GATHER             1: A and B are gathered through the index maps of gather.cuh (an
//                         implicit GEMM: included before this template), not strided matrices
//   GM_A_VB, GM_B_VB      (gathered, with GM_A_ASYNC / GM_B_ASYNC) the bytes of a cp.async vector:
//                         16, or 8 or 4 where the operand's contiguous runs are shorter
//   GM_GROUPS             (gathered) the groups of a grouped convolution, the batch's inner
//                         factor: batch `bz` reads group bz % GM_GROUPS of each operand (A_BS and
//                         B_BS elements a group further on) and rows of image bz / GM_GROUPS

#define GM_MMA_F16 1
#define GM_MMA_BF16 2
#define GM_MMA_TF32 3
#define GM_MMA_TF32X3 4
#define GM_MMA_S8 5

// A shared-memory element: 16-bit and 8-bit kinds are kept as raw bits. GM_LDSM: fragments come
// from ldmatrix (GM_V elements to 16 bytes).
#if GM_MMA == GM_MMA_F16 || GM_MMA == GM_MMA_BF16
#define GM_16BIT 1
#define GM_LDSM 1
typedef unsigned short smem_t;
#elif GM_MMA == GM_MMA_S8
#define GM_16BIT 0
#define GM_LDSM 1
typedef unsigned char smem_t;
#if !GM_A_KMAJOR || !GM_B_KMAJOR
#error "8-bit operands are multiplied from K-major tiles only"
#endif
#else
#define GM_16BIT 0
#define GM_LDSM 0
typedef float smem_t;
#endif
#define GM_V (16 / (int)sizeof(smem_t))

#define BM GM_BM
#define BN GM_BN
#define BK GM_BK
#define STAGES GM_STAGES
// k tiles in flight ahead of the one multiplied, and the cp.async groups a stage may leave pending.
#define PRE (GM_STAGES - 1)
#define WAIT (GM_STAGES > 2 ? GM_STAGES - 2 : 0)
#define THREADS (GM_WARPS_M * GM_WARPS_N * 32)
// A warp's tile, and its mma tiles along M and N.
#define WM (GM_BM / GM_WARPS_M)
#define WN (GM_BN / GM_WARPS_N)
#define MI (WM / 16)
#define NI (WN / 8)
#define TM GM_TM
#define TN GM_TN
#define KT GM_KT
#define TILES (GM_TM * GM_TN)
#define SPLITS GM_SPLITS
#define KT_PER GM_KT_PER
// Grouped tile order: GROUP tile rows walk the columns together (B tiles stay in L2).
#define GROUP GM_GROUP
#define A_PITCH GM_A_PITCH
#define B_PITCH GM_B_PITCH
#define A_STAGE GM_A_STAGE
#define B_STAGE GM_B_STAGE
// B's stages after A's in shared memory.
#define SB_OFF (GM_STAGES * GM_A_STAGE * (int)sizeof(smem_t))
// Bytes of global memory between k tiles.
#define A_STEP (GM_BK * A_CS * ESA)
#define B_STEP (GM_BK * B_RS * ESB)

// Device helpers: cp.async, ldmatrix, mma, tf32 conversion.
__device__ __forceinline__ unsigned gm_saddr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void gm_cp16(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(src), "r"(bytes) : "memory");
}
// A VB-byte cp.async (16: through L2 only, as gm_cp16; 8 or 4: `.ca`, the only form of those
// sizes), `bytes` of them from `src` (the rest zero-filled).
template <int VB> __device__ __forceinline__ void gm_cp(unsigned dst, const void* src, int bytes) {
    if constexpr (VB == 16) {
        gm_cp16(dst, src, bytes);
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" :: "r"(dst), "l"(src), "n"(VB), "r"(bytes) : "memory");
    }
}
__device__ __forceinline__ void gm_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void gm_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory"); }
__device__ __forceinline__ void gm_ldsm4(unsigned addr, unsigned (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void gm_ldsm4t(unsigned addr, unsigned (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void gm_mma_f16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void gm_mma_bf16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void gm_mma_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ unsigned gm_tf32(float x) { unsigned r; asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x)); return r; }
#if GM_MMA == GM_MMA_S8
// Each operand's signedness (i8 or u8).
#if GEMM_A == DT_u8
#define GM_S8_A "u8"
#else
#define GM_S8_A "s8"
#endif
#if GEMM_B == DT_u8
#define GM_S8_B "u8"
#else
#define GM_S8_B "s8"
#endif
// The fragments of m16n8k32 on 8-bit integers are those of m16n8k16 on 16-bit values, byte pairs
// for elements: the same ldmatrix loads give them.
__device__ __forceinline__ void gm_mma_s8(int (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32." GM_S8_A "." GM_S8_B ".s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

// Element `o` of an operand of type GT at `g`, as the shared-memory type (every conversion exact:
// fp8 fits f16 and bf16, 16-bit types fit tf32; see mma_kind in sm80.rs).
template <int GT> __device__ __forceinline__ smem_t gm_ld(const char* g, long long o) {
    constexpr __nv_fp8_interpretation_t E = GT == DT_fp8_e5m2 ? __NV_E5M2 : __NV_E4M3;
    constexpr bool FP8 = GT == DT_fp8_e4m3 || GT == DT_fp8_e5m2;
    if constexpr ((GT == DT_f16 && GM_MMA == GM_MMA_F16) || (GT == DT_bf16 && GM_MMA == GM_MMA_BF16)) {
        return ((const unsigned short*)g)[o];
    } else if constexpr (GM_MMA == GM_MMA_S8) {
        return ((const unsigned char*)g)[o];
    } else if constexpr (FP8 && GM_MMA == GM_MMA_F16) {
        return __half_as_ushort(__half(__nv_cvt_fp8_to_halfraw(((const __nv_fp8_storage_t*)g)[o], E)));
    } else if constexpr (FP8 && GM_MMA == GM_MMA_BF16) {
        return __bfloat16_as_ushort(__float2bfloat16_rn(__half2float(__half(__nv_cvt_fp8_to_halfraw(((const __nv_fp8_storage_t*)g)[o], E)))));
    } else if constexpr (GT == DT_f16) {
        return __half2float(((const __half*)g)[o]);
    } else if constexpr (GT == DT_bf16) {
        return __bfloat162float(((const __nv_bfloat16*)g)[o]);
    } else if constexpr (FP8) {
        return __half2float(__half(__nv_cvt_fp8_to_halfraw(((const __nv_fp8_storage_t*)g)[o], E)));
    } else {
        return ((const float*)g)[o];
    }
}

// Every thread of the block brings its share of a ROWS x COLS tile at `g` (element (r, c) at
// r * RS + c * CS elements, of type GT) into `s` (row pitch PITCH); elements at rows >=
// `rows_valid` or cols >= `cols_valid` become zero. ASYNC: 16-byte cp.async along the rows (CS 1),
// left in flight (the caller commits and waits); else one element at a time, stored before it
// returns.
template <int ROWS, int COLS, int PITCH, long long RS, long long CS, int GT, bool ASYNC>
__device__ __forceinline__ void gm_load_tile(smem_t* __restrict__ s, const char* __restrict__ g, long long rows_valid, long long cols_valid, int tid) {
    if constexpr (ASYNC) {
        constexpr int ES = DT_SIZE(GT), VEC = 16 / ES, PER_ROW = COLS / VEC, TOTAL = ROWS * PER_ROW, ITERS = (TOTAL + THREADS - 1) / THREADS;
        #pragma unroll
        for (int it = 0; it < ITERS; ++it) {
            const int idx = tid + it * THREADS;
            if constexpr (TOTAL % THREADS != 0) {
                if (idx >= TOTAL) break;
            }
            const int r = idx / PER_ROW, c = (idx % PER_ROW) * VEC;
            const long long left = r < rows_valid ? cols_valid - c : 0;
            const int n = left <= 0 ? 0 : (left >= VEC ? VEC : (int)left);
            // Whole 16-byte chunks by cp.async; a chunk cut by the edge (or wholly outside) by
            // plain loads of its valid elements and zeros, so that nothing past the tensor's
            // extent is ever addressed.
            smem_t* const d = s + r * PITCH + c;
            if (n == VEC) {
                gm_cp16(gm_saddr(d), g + ((long long)r * RS + c) * ES, 16);
            } else {
                const smem_t* const src = (const smem_t*)(g + ((long long)r * RS + c) * ES);
                #pragma unroll
                for (int e = 0; e < VEC; ++e) d[e] = e < n ? src[e] : (smem_t)0;
            }
        }
    } else {
        // Loads in chunks of 4, then their stores: a few loads in flight per thread without
        // holding the whole tile in registers next to the accumulators.
        constexpr int TOTAL = ROWS * COLS, ITERS = (TOTAL + THREADS - 1) / THREADS, CHUNK = ITERS < 4 ? ITERS : 4;
        // Guards: the last chunk is partial (ITERS), the last iteration (TOTAL).
        constexpr bool ITER_GUARD = ITERS % CHUNK != 0, IDX_GUARD = TOTAL % THREADS != 0;
        #pragma unroll 1
        for (int it0 = 0; it0 < ITERS; it0 += CHUNK) {
            smem_t v[CHUNK];
            #pragma unroll
            for (int u = 0; u < CHUNK; ++u) {
                const int idx = tid + (it0 + u) * THREADS;
                const int r = idx / COLS, c = idx % COLS;
                if constexpr (ITER_GUARD && IDX_GUARD) {
                    v[u] = (it0 + u < ITERS && idx < TOTAL && r < rows_valid && c < cols_valid) ? gm_ld<GT>(g, (long long)r * RS + (long long)c * CS) : (smem_t)0;
                } else if constexpr (ITER_GUARD) {
                    v[u] = (it0 + u < ITERS && r < rows_valid && c < cols_valid) ? gm_ld<GT>(g, (long long)r * RS + (long long)c * CS) : (smem_t)0;
                } else if constexpr (IDX_GUARD) {
                    v[u] = (idx < TOTAL && r < rows_valid && c < cols_valid) ? gm_ld<GT>(g, (long long)r * RS + (long long)c * CS) : (smem_t)0;
                } else {
                    v[u] = (r < rows_valid && c < cols_valid) ? gm_ld<GT>(g, (long long)r * RS + (long long)c * CS) : (smem_t)0;
                }
            }
            #pragma unroll
            for (int u = 0; u < CHUNK; ++u) {
                const int idx = tid + (it0 + u) * THREADS;
                if constexpr (ITER_GUARD) {
                    if (it0 + u < ITERS && idx < TOTAL) s[(idx / COLS) * PITCH + idx % COLS] = v[u];
                } else {
                    if (idx < TOTAL) s[(idx / COLS) * PITCH + idx % COLS] = v[u];
                }
            }
        }
    }
}

// The operand tiles: A's BM x BK (K-major [m][k]) or BK x BM, B's BN x BK ([n][k]) or BK x BN,
// with their strides in global memory, and the valid rows and columns of each from what is left
// of M, N and K (`m_left`, `n_left`, `k_left`).
#if GM_A_KMAJOR
#define GM_LOAD_A gm_load_tile<BM, BK, A_PITCH, A_RS, A_CS, GEMM_A, GM_A_ASYNC>
#define GM_A_VALID m_left, k_left
#else
#define GM_LOAD_A gm_load_tile<BK, BM, A_PITCH, A_CS, A_RS, GEMM_A, GM_A_ASYNC>
#define GM_A_VALID k_left, m_left
#endif
#if GM_B_KMAJOR
#define GM_LOAD_B gm_load_tile<BN, BK, B_PITCH, B_CS, B_RS, GEMM_B, GM_B_ASYNC>
#define GM_B_VALID n_left, k_left
#else
#define GM_LOAD_B gm_load_tile<BK, BN, B_PITCH, B_RS, B_CS, GEMM_B, GM_B_ASYNC>
#define GM_B_VALID k_left, n_left
#endif

#if GM_GATHER
// Every thread of the block brings its share of a ROWS x COLS tile of gathered operand X into `s`
// (row pitch PITCH): rows are the operand's index ROW_SIDE (0: along m or n, 1: along k) from
// `r0`, columns its other index from `c0`; rows >= `rows_valid`, columns >= `cols_valid` and
// elements outside the tensor (padding) become zero. ASYNC: VB-byte cp.async along the rows (the
// column index is contiguous in runs of VB bytes, gather.rs), zero-filled through the source
// size, left in flight; else one element at a time.
template <int X, int ROWS, int COLS, int PITCH, int GT, bool ASYNC, int ROW_SIDE, int VB>
__device__ __forceinline__ void gm_gather_tile(smem_t* __restrict__ s, const char* __restrict__ g, unsigned r0, unsigned c0, long long rows_valid, long long cols_valid, int tid) {
    constexpr int COL_SIDE = 1 - ROW_SIDE;
    constexpr int ES = DT_SIZE(GT);
    if constexpr (ASYNC) {
        constexpr int VEC = VB / ES, PER_ROW = COLS / VEC, TOTAL = ROWS * PER_ROW, ITERS = (TOTAL + THREADS - 1) / THREADS;
        #pragma unroll
        for (int it = 0; it < ITERS; ++it) {
            const int idx = tid + it * THREADS;
            if constexpr (TOTAL % THREADS != 0) {
                if (idx >= TOTAL) break;
            }
            const int r = idx / PER_ROW, c = (idx % PER_ROW) * VEC;
            const long long left = r < rows_valid ? cols_valid - c : 0;
            const int n = left <= 0 ? 0 : (left >= VEC ? VEC : (int)left);
            smem_t* const d = s + r * PITCH + c;
            const gt_part pr = gt_index<X, ROW_SIDE>(r0 + r);
            if (n == VEC) {
                long long off;
                const bool ok = gt_offset<X>(pr, gt_index<X, COL_SIDE>(c0 + c), off);
                // Outside the tensor: zero fill (source size 0) from the base pointer.
                gm_cp<VB>(gm_saddr(d), ok ? g + off * ES : g, ok ? VB : 0);
            } else {
                // A vector cut by the edge of the index (a plain one: tap indices are whole
                // vectors) or wholly past it: its valid elements and zeros.
                #pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    long long off;
                    const bool ok = e < n && gt_offset<X>(pr, gt_index<X, COL_SIDE>(c0 + c + e), off);
                    d[e] = ok ? gm_ld<GT>(g, off) : (smem_t)0;
                }
            }
        }
    } else {
        constexpr int TOTAL = ROWS * COLS, ITERS = (TOTAL + THREADS - 1) / THREADS;
        #pragma unroll 4
        for (int it = 0; it < ITERS; ++it) {
            const int idx = tid + it * THREADS;
            if constexpr (TOTAL % THREADS != 0) {
                if (idx >= TOTAL) break;
            }
            const int r = idx / COLS, c = idx % COLS;
            long long off = 0;
            const bool ok = r < rows_valid && c < cols_valid && gt_offset<X>(gt_index<X, ROW_SIDE>(r0 + r), gt_index<X, COL_SIDE>(c0 + c), off);
            s[r * PITCH + c] = ok ? gm_ld<GT>(g, off) : (smem_t)0;
        }
    }
}

#if GM_A_KMAJOR
#define GM_GATHER_A(s, g, m0, kk0) gm_gather_tile<0, BM, BK, A_PITCH, GEMM_A, GM_A_ASYNC, 0, GM_A_VB>(s, g, m0, kk0, m_left, k_left, tid)
#else
#define GM_GATHER_A(s, g, m0, kk0) gm_gather_tile<0, BK, BM, A_PITCH, GEMM_A, GM_A_ASYNC, 1, GM_A_VB>(s, g, kk0, m0, k_left, m_left, tid)
#endif
#if GM_B_KMAJOR
#define GM_GATHER_B(s, g, n0, kk0) gm_gather_tile<1, BN, BK, B_PITCH, GEMM_B, GM_B_ASYNC, 0, GM_B_VB>(s, g, n0, kk0, n_left, k_left, tid)
#else
#define GM_GATHER_B(s, g, n0, kk0) gm_gather_tile<1, BK, BN, B_PITCH, GEMM_B, GM_B_ASYNC, 1, GM_B_VB>(s, g, kk0, n0, k_left, n_left, tid)
#endif
#endif

// One shared-memory stage (BK of k) multiplied into a warp's accumulators (`wm0`, `wn0`: the
// warp's tile origin within the block tile). 16-bit and 8-bit fragments come from ldmatrix
// (`.trans` for M/N-major 16-bit tiles; a k step is 32 bytes of each row), f32 fragments from
// plain shared loads.
__device__ __forceinline__ void gm_mma_stage(const smem_t* __restrict__ sA, const smem_t* __restrict__ sB, acc_t (&acc)[MI][NI][4], int wm0, int wn0, int lane) {
#if GM_LDSM
    const int j = lane >> 3, r = lane & 7;
    #pragma unroll
    for (int ks = 0; ks < BK / (2 * GM_V); ++ks) {
        unsigned af[MI][4], bf[NI][2];
        #pragma unroll
        for (int i = 0; i < MI; ++i) {
#if GM_A_KMAJOR
            gm_ldsm4(gm_saddr(sA + (wm0 + i * 16 + (j & 1) * 8 + r) * A_PITCH + ks * 2 * GM_V + (j >> 1) * GM_V), af[i]);
#else
            gm_ldsm4t(gm_saddr(sA + (ks * 16 + (j >> 1) * 8 + r) * A_PITCH + wm0 + i * 16 + (j & 1) * 8), af[i]);
#endif
        }
        #pragma unroll
        for (int q = 0; q < NI / 2; ++q) {
            unsigned t[4];
#if GM_B_KMAJOR
            gm_ldsm4(gm_saddr(sB + (wn0 + q * 16 + (j >> 1) * 8 + r) * B_PITCH + ks * 2 * GM_V + (j & 1) * GM_V), t);
#else
            gm_ldsm4t(gm_saddr(sB + (ks * 16 + (j & 1) * 8 + r) * B_PITCH + wn0 + q * 16 + (j >> 1) * 8), t);
#endif
            bf[2 * q][0] = t[0]; bf[2 * q][1] = t[1]; bf[2 * q + 1][0] = t[2]; bf[2 * q + 1][1] = t[3];
        }
        #pragma unroll
        for (int i = 0; i < MI; ++i)
            #pragma unroll
#if GM_MMA == GM_MMA_F16
            for (int n = 0; n < NI; ++n) gm_mma_f16(acc[i][n], af[i], bf[n]);
#elif GM_MMA == GM_MMA_BF16
            for (int n = 0; n < NI; ++n) gm_mma_bf16(acc[i][n], af[i], bf[n]);
#else
            for (int n = 0; n < NI; ++n) gm_mma_s8(acc[i][n], af[i], bf[n]);
#endif
    }
#else
    const int g = lane >> 2, t = lane & 3;
    #pragma unroll
    for (int ks = 0; ks < BK / 8; ++ks) {
        const int k = ks * 8 + t;
        float af[MI][4], bf[NI][2];
        #pragma unroll
        for (int i = 0; i < MI; ++i) {
            const int m = wm0 + i * 16 + g;
#if GM_A_KMAJOR
            af[i][0] = sA[m * A_PITCH + k]; af[i][1] = sA[(m + 8) * A_PITCH + k]; af[i][2] = sA[m * A_PITCH + k + 4]; af[i][3] = sA[(m + 8) * A_PITCH + k + 4];
#else
            af[i][0] = sA[k * A_PITCH + m]; af[i][1] = sA[k * A_PITCH + m + 8]; af[i][2] = sA[(k + 4) * A_PITCH + m]; af[i][3] = sA[(k + 4) * A_PITCH + m + 8];
#endif
        }
        #pragma unroll
        for (int n = 0; n < NI; ++n) {
            const int c = wn0 + n * 8 + g;
#if GM_B_KMAJOR
            bf[n][0] = sB[c * B_PITCH + k]; bf[n][1] = sB[c * B_PITCH + k + 4];
#else
            bf[n][0] = sB[k * B_PITCH + c]; bf[n][1] = sB[(k + 4) * B_PITCH + c];
#endif
        }
#if GM_MMA == GM_MMA_TF32
        unsigned ah[MI][4], bh[NI][2];
        #pragma unroll
        for (int i = 0; i < MI; ++i)
            #pragma unroll
            for (int e = 0; e < 4; ++e) ah[i][e] = gm_tf32(af[i][e]);
        #pragma unroll
        for (int n = 0; n < NI; ++n)
            #pragma unroll
            for (int e = 0; e < 2; ++e) bh[n][e] = gm_tf32(bf[n][e]);
        #pragma unroll
        for (int i = 0; i < MI; ++i)
            #pragma unroll
            for (int n = 0; n < NI; ++n) gm_mma_tf32(acc[i][n], ah[i], bh[n]);
#else
        // x = hi + lo with hi = tf32(x), lo = tf32(x - hi): a*b ~ alo*bhi + ahi*blo + ahi*bhi
        // (the small products first).
        unsigned ah[MI][4], al[MI][4], bh[NI][2], bl[NI][2];
        #pragma unroll
        for (int i = 0; i < MI; ++i)
            #pragma unroll
            for (int e = 0; e < 4; ++e) { ah[i][e] = gm_tf32(af[i][e]); al[i][e] = gm_tf32(af[i][e] - __uint_as_float(ah[i][e])); }
        #pragma unroll
        for (int n = 0; n < NI; ++n)
            #pragma unroll
            for (int e = 0; e < 2; ++e) { bh[n][e] = gm_tf32(bf[n][e]); bl[n][e] = gm_tf32(bf[n][e] - __uint_as_float(bh[n][e])); }
        #pragma unroll
        for (int i = 0; i < MI; ++i)
            #pragma unroll
            for (int n = 0; n < NI; ++n) { gm_mma_tf32(acc[i][n], al[i], bh[n]); gm_mma_tf32(acc[i][n], ah[i], bl[n]); gm_mma_tf32(acc[i][n], ah[i], bh[n]); }
#endif
    }
#endif
}

// One k tile (`t`, relative to the split's first) of A and B into stage `stage`.
#if GM_GATHER
// (Gathered: `ga`, `gb` are the tensors' base pointers at the batch's group; `m0` is the tile's
// first row over every image, `n0` its first column.)
__device__ __forceinline__ void gm_load_stage(smem_t* sa, smem_t* sb, const char* ga, const char* gb, int stage, int t, int kt0, long long m_left, long long n_left, unsigned m0, unsigned n0, int tid) {
    const long long k_left = K_ - (long long)(kt0 + t) * BK;
    const unsigned kk0 = (unsigned)(kt0 + t) * BK;
    GM_GATHER_A(sa + stage * A_STAGE, ga, m0, kk0);
    GM_GATHER_B(sb + stage * B_STAGE, gb, n0, kk0);
}
#define GM_LOAD_STAGE(stage, t) gm_load_stage(sa, sb, ga, gb, stage, t, kt0, m_left, n_left, (unsigned)(bz / GM_GROUPS * M_ + m0), (unsigned)n0, tid)
#else
__device__ __forceinline__ void gm_load_stage(smem_t* sa, smem_t* sb, const char* ga, const char* gb, int stage, int t, int kt0, long long m_left, long long n_left, int tid) {
    const long long k_left = K_ - (long long)(kt0 + t) * BK;
    GM_LOAD_A(sa + stage * A_STAGE, ga + (long long)t * A_STEP, GM_A_VALID, tid);
    GM_LOAD_B(sb + stage * B_STAGE, gb + (long long)t * B_STEP, GM_B_VALID, tid);
}
#define GM_LOAD_STAGE(stage, t) gm_load_stage(sa, sb, ga, gb, stage, t, kt0, m_left, n_left, tid)
#endif

extern "C" __global__ void __launch_bounds__(THREADS, GM_MIN_BLOCKS) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    extern __shared__ __align__(16) unsigned char gm_shared[];
    smem_t* const sa = (smem_t*)gm_shared;
    smem_t* const sb = (smem_t*)(gm_shared + SB_OFF);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm0 = (warp / GM_WARPS_N) * WM, wn0 = (warp % GM_WARPS_N) * WN;
    long long pid = blockIdx.x;
    const int tile = (int)(pid % TILES);
    pid /= TILES;
    const int split = (int)(pid % SPLITS);
    const long long bz = pid / SPLITS;
    // Grouped tile order: GROUP tile rows walk the columns together (B tiles stay in L2).
    const int group = tile / (GROUP * TN);
    const int first_m = group * GROUP;
    const int gsize = min(TM - first_m, GROUP);
    const int tm_ = first_m + (tile % (GROUP * TN)) % gsize;
    const int tn_ = (tile % (GROUP * TN)) / gsize;
    const long long m0 = (long long)tm_ * BM, n0 = (long long)tn_ * BN;
    const int kt0 = split * KT_PER;
    const int nkt = min(KT - kt0, KT_PER);
#if GM_GATHER
    // (A grouped convolution's group: its channels and filters are the operands' first.)
    const char* ga = (const char*)gm_a + bz % GM_GROUPS * A_BS * ESA;
    const char* gb = (const char*)gm_b + bz % GM_GROUPS * B_BS * ESB;
#else
    const char* ga = (const char*)gm_a + (bz * A_BS + m0 * A_RS + (long long)kt0 * BK * A_CS) * ESA;
    const char* gb = (const char*)gm_b + (bz * B_BS + n0 * B_CS + (long long)kt0 * BK * B_RS) * ESB;
#endif
    const long long m_left = M_ - m0, n_left = N_ - n0;
    acc_t acc[MI][NI][4];
    #pragma unroll
    for (int i = 0; i < MI; ++i)
        #pragma unroll
        for (int j = 0; j < NI; ++j)
            #pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0;
    #pragma unroll
    for (int st = 0; st < PRE; ++st) {
        if (st < nkt) GM_LOAD_STAGE(st, st);
        gm_commit();
    }
    for (int t = 0; t < nkt; ++t) {
        gm_wait<WAIT>();
        __syncthreads();
        const int nx = t + PRE;
        if (nx < nkt) GM_LOAD_STAGE(nx % STAGES, nx);
        gm_commit();
        gm_mma_stage(sa + (t % STAGES) * A_STAGE, sb + (t % STAGES) * B_STAGE, acc, wm0, wn0, lane);
    }
    gm_wait<0>();
#if GM_SPLITS > 1
    acc_t* gw = gm_ws + ((long long)split * BATCH + bz) * (M_ * N_);
#else
    char* gc = (char*)gm_c + bz * C_BS * ESC;
    (void)split;
#endif
    // The warp's accumulators through the epilogue into C (`gc`: C at this batch; or as they are,
    // GM_INT_EXACT), or, for a split, raw into the partial tile at `gw` (`[m][n]` packed).
    {
        const int g = lane >> 2, t4 = lane & 3;
        #pragma unroll
        for (int i = 0; i < MI; ++i)
            #pragma unroll
            for (int j = 0; j < NI; ++j)
                #pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const long long row = m0 + wm0 + i * 16 + g + h * 8;
                    const long long col = n0 + wn0 + j * 8 + t4 * 2;
                    if (row >= M_ || col >= N_) continue;
                    const acc_t a0 = acc[i][j][2 * h], a1 = acc[i][j][2 * h + 1];
#if GM_SPLITS > 1
                    acc_t* w = gw + row * N_ + col;
#if GEMM_N % 2 == 0 && GM_INT_ACC
                    *(int2*)w = make_int2(a0, a1);
#elif GEMM_N % 2 == 0
                    *(float2*)w = make_float2(a0, a1);
#else
                    w[0] = a0;
                    if (col + 1 < N_) w[1] = a1;
#endif
#elif GM_INT_EXACT
                    const long long off = row * C_RS + col * C_CS;
                    if (col + 1 < N_) {
#if GM_PAIR_STORE
                        gm_sti2(gc, off, a0, a1);
#else
                        gm_sti(gc, off, a0);
                        gm_sti(gc, off + C_CS, a1);
#endif
                    } else {
                        gm_sti(gc, off, a0);
                    }
#else
                    const long long off = row * C_RS + col * C_CS;
                    const float v0 = epilogue(gm_accf(a0), bz, row, col EPI_NAMES);
                    if (col + 1 < N_) {
                        const float v1 = epilogue(gm_accf(a1), bz, row, col + 1 EPI_NAMES);
#if GM_PAIR_STORE
                        gm_st2(gc, off, v0, v1);
#else
                        gm_st(gc, off, v0);
                        gm_st(gc, off + C_CS, v1);
#endif
                    } else {
                        gm_st(gc, off, v0);
                    }
#endif
                }
    }
}
