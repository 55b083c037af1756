// Device helpers every attention kernel shares (sm_80 and sm_90a): types, mma.sync, ldmatrix,
// cp.async, tile loads, Philox, the optional inputs (FaIn, FA_INIT), the per-batch lengths, the
// masks, bias and ALiBi, dropout, paged K/V rows, and the output stores (FA_DEFINE_STORE).
//
// The instantiation defines (attention/mod.rs, Problem::source):
//   FA_BF16, FA_MMA_T        the io type (bf16 or f16) and its mma type name ("bf16", "f16")
//   FA_B, FA_HQ, FA_HKV, FA_SQ, FA_SKV, FA_GROUP, FA_D, FA_DV, FA_LDK, FA_LDV   sizes (FA_D, FA_DV:
//     the tile widths; FA_DR, FA_DVR: the head dims, whose channels alone are loaded and stored;
//     FA_DK, FA_DVK: the head dims rounded up to a k step of 16, the k extents of Q K^T, dO V^T)
//   FA_CAUSAL, FA_BOTTOM_RIGHT, FA_HAS_SWL, FA_SWL, FA_HAS_SWR, FA_SWR, FA_PADDING   masks
//   FA_HAS_BIAS, FA_ALIBI, FA_NSLOPES, FA_SLOPES   bias (LD_BIAS, BI_S0..3) and ALiBi slopes
//   FA_DROPOUT, LD_SEED, LD_OFFSET   dropout
//   FA_HAS_SINK, LD_SINK, SINK_S1   the sink token (one logit per query head)
//   FA_PAGED                 paged K/V (LD_PTK, LD_PTV, PTK_S0/2, PTV_S0/2, FA_KNB, FA_KBS,
//                            FA_VNB, FA_VBS)
//   Q_S0..3, K_S0..3, V_S0..3, Q_VEC, K_VEC, V_VEC   strides, and whether rows take cp.async
//   LD_SLQ, LD_SLKV, SLQ_S0, SLKV_S0   the padding mask's lengths (with FA_PADDING)
//   FA_SCALE_POS             1: the attention scale is known positive when the plan is built
//                            (the Hopper forward then takes row maxima on unscaled scores)
//   FA_SOFTMAX_SCALE         the scale times log2 e as the Hopper kernels' softmax reads it (the
//                            forward's, and its recomputation in the backward): a literal when
//                            the plan knows the scale, else A.scale_log2
// The attention scale and the dropout probability's keep scale and threshold are kernel
// parameters (FA_INIT reads them into FaIn), so that one kernel serves every value; except in the
// Hopper kernels' softmax, which takes a scale the plan knows as a literal (FA_SOFTMAX_SCALE):
// its exponent's FFMA with an immediate operand instead of a uniform register made the d = 64
// forward 1.8% faster on the H200 (a scale that comes with each execution stays an argument).

#if FA_ALIBI
// The ALiBi slopes of the query heads. A table in constant memory, not a switch: ptxas compiled
// the switch to an indirect branch, across which it serialized a Hopper kernel's wgmmas (C7511).
__constant__ float fa_slopes[FA_NSLOPES] = {FA_SLOPES};
__device__ __forceinline__ float fa_slope(i64 h) {
    return h >= 0 && h < FA_NSLOPES ? fa_slopes[h] : 0.0f;
}
#endif

typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
#define FA_INF __int_as_float(0x7f800000)
#define FA_NINF __int_as_float(0xff800000)
#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f

__device__ __forceinline__ i64 fa_min(i64 a, i64 b) { return a < b ? a : b; }
__device__ __forceinline__ i64 fa_max(i64 a, i64 b) { return a > b ? a : b; }

// 2^x (ex2.approx: 2^-22 relative; 2^-inf = 0).
__device__ __forceinline__ float fa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// D (16x8, f32) += A (16x16, row) * B (16x8, col); fragments as in the PTX ISA
// ("Matrix fragments for mma.m16n8k16"): lane = 4 * group + t;
// a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..];
// b0 = B[2t..2t+1][g], b1 = B[2t+8..][g]; c0,c1 = C[g][2t..2t+1], c2,c3 = C[g+8][2t..].
__device__ __forceinline__ void fa_mma(float* c, const u32* a, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32." FA_MMA_T "." FA_MMA_T ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 b16 matrices from shared memory; lanes 8m..8m+7 give the row addresses of matrix m,
// lane l receives row l/4, columns 2(l%4), 2(l%4)+1 of each (of the transpose with .trans).
__device__ __forceinline__ void fa_ldsm(u32* r, const u16* p) {
    u32 a = (u32)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void fa_ldsm_t(u32* r, const u16* p) {
    u32 a = (u32)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

__device__ __forceinline__ void fa_cp16(u16* s, const u16* g) {
    u32 a = (u32)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(a), "l"(g) : "memory");
}
__device__ __forceinline__ void fa_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void fa_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory"); }

// Two floats as a packed pair of the io type (lo in the low half), rounded to nearest even.
__device__ __forceinline__ u32 fa_pack(float lo, float hi) {
#if FA_BF16
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
#else
    __half2 v = __floats2half2_rn(lo, hi);
#endif
    return *reinterpret_cast<u32*>(&v);
}

// A tile of ROWS rows of W elements (W a multiple of 8) into shared memory (row stride LD), of
// which the first WR (a multiple of 8, the head dim) are read and the rest are zeros; rowoff(r)
// is the element offset of row r in g, or -1 for a row of zeros. VEC 1: 16-byte cp.async per 8
// elements (the caller commits and waits); VEC 2: the same where the vector is 16-byte aligned,
// plain loads where not (rows of a ragged tensor start where its offsets say); VEC 0:
// element-wise loads (strided by cs) and plain stores.
template <int ROWS, int W, int WR, int LD, int NT, int VEC, typename F>
__device__ __forceinline__ void fa_load(u16* s, const u16* g, i64 cs, F rowoff) {
    static_assert(WR <= W && WR % 8 == 0, "the head dim fits the tile in whole vectors");
    if constexpr (VEC != 0) {
        (void)cs;
        constexpr int CPR = W / 8;
        for (int c = threadIdx.x; c < ROWS * CPR; c += NT) {
            const int r = c / CPR, k = (c - r * CPR) * 8;
            const i64 o = k < WR ? rowoff(r) : -1;
            u16* d = s + r * LD + k;
            if (o >= 0 && (VEC == 1 || ((o + k) & 7) == 0)) {
                fa_cp16(d, g + o + k);
            } else if (o >= 0) {
                #pragma unroll
                for (int e = 0; e < 8; ++e) d[e] = g[o + k + e];
            } else {
                *reinterpret_cast<uint4*>(d) = make_uint4(0u, 0u, 0u, 0u);
            }
        }
    } else {
        for (int e = threadIdx.x; e < ROWS * W; e += NT) {
            const int r = e / W, k = e - r * W;
            const i64 o = k < WR ? rowoff(r) : -1;
            s[r * LD + k] = o >= 0 ? g[o + (i64)k * cs] : (u16)0;
        }
    }
}

// Philox 4x32-10 as engine::cpu::rng: word index % 4 of the block index / 4.
__device__ __forceinline__ u64 fa_seed_bits(double v) {
    if (isnan(v)) return 0ULL;
    if (v >= 9223372036854775807.0) return (u64)9223372036854775807LL;
    if (v <= -9223372036854775808.0) return (u64)(-9223372036854775807LL - 1LL);
    return (u64)(long long)v;
}
__device__ __forceinline__ u32 fa_philox(u64 seed, u64 offset, u64 index) {
    u64 block = index >> 2;
    u32 c0 = (u32)block, c1 = (u32)(block >> 32), c2 = (u32)offset, c3 = (u32)(offset >> 32);
    u32 k0 = (u32)seed, k1 = (u32)(seed >> 32);
    #pragma unroll
    for (int round = 0; round < 10; ++round) {
        if (round > 0) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        u32 hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        u32 hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        u32 n0 = hi1 ^ c1 ^ k0;
        u32 n2 = hi0 ^ c3 ^ k1;
        c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
    }
    switch ((int)(index & 3ULL)) {
        case 0: return c0;
        case 1: return c1;
        case 2: return c2;
        default: return c3;
    }
}

// The optional inputs (null when absent) and the runtime scalars: the attention scale (and times
// log2(e)), the dropout keep scale 1 / (1 - p) (1 without dropout) and the dropout threshold
// (the smallest Philox word that keeps an element).
struct FaIn {
    const void* bias; const void* slq; const void* slkv; const void* ptk; const void* ptv; const void* sink;
    u64 seed; u64 offset;
    float scale; float scale_log2; float keep_scale; u64 drop_t;
    // The ragged tensors' offsets, by FA_RG_* index (see fa_start).
    const void* rg[11];  // one per graph::ops::sdpa::RAGGED_PORTS
};

// The kernel's parameters in `FaIn A` (FA_INIT, at the start of a kernel that takes them, in the
// order of Problem::inputs): bias_p, slq_p / slkv_p, ptk_p / ptv_p, sink_p as the features ask,
// fa_scale, fa_scale_log2, and with dropout seed_p / offset_p, fa_keep_scale, fa_drop_t.
#if FA_HAS_BIAS
#define FA_INIT_BIAS A.bias = bias_p;
#else
#define FA_INIT_BIAS
#endif
#if FA_PADDING
#define FA_INIT_LENS A.slq = slq_p; A.slkv = slkv_p;
#else
#define FA_INIT_LENS
#endif
#if FA_PAGED
#define FA_INIT_PAGES A.ptk = ptk_p; A.ptv = ptv_p;
#else
#define FA_INIT_PAGES
#endif
#if FA_HAS_SINK
#define FA_INIT_SINK A.sink = sink_p;
#else
#define FA_INIT_SINK
#endif
#if FA_DROPOUT
// By-value seeds live in the plan's constant buffer: read through the pointer too.
#define FA_INIT_SEED                                                                                \
    A.seed = fa_seed_bits(LD_SEED(seed_p, 0));                                                      \
    A.offset = fa_seed_bits(LD_OFFSET(offset_p, 0));                                                \
    A.keep_scale = fa_keep_scale;                                                                   \
    A.drop_t = (u64)fa_drop_t;
#else
#define FA_INIT_SEED
#endif
#define FA_RG_INIT(n, ld, s) A.rg[n] = rg##n##_p;
#define FA_INIT                                                                                     \
    FaIn A;                                                                                         \
    A.bias = nullptr; A.slq = nullptr; A.slkv = nullptr; A.ptk = nullptr; A.ptv = nullptr;         \
    A.sink = nullptr; A.seed = 0; A.offset = 0;                                                     \
    A.scale = fa_scale; A.scale_log2 = fa_scale_log2; A.keep_scale = 1.0f; A.drop_t = 0;            \
    FA_INIT_BIAS FA_INIT_LENS FA_INIT_PAGES FA_INIT_SINK FA_INIT_SEED FA_RAGGED(FA_RG_INIT)

// Ragged (packed) tensors (indices: their places in graph::ops::sdpa::RAGGED_PORTS):
// FA_RAGGED(X) lists X(index, load, stride) for each, with its offsets
// as the parameter rg<index>_p (empty when none is ragged). Batch bi of a ragged tensor starts at
// element offsets[bi] and holds only its own length's rows.
#define FA_RG_Q 0
#define FA_RG_K 1
#define FA_RG_V 2
#define FA_RG_O 3
#define FA_RG_ST 4
#define FA_RG_SMAX 5
#define FA_RG_SSUM 6
#define FA_RG_DO 7
#define FA_RG_DQ 8
#define FA_RG_DK 9
#define FA_RG_DV 10
#define FA_RG_START(n, ld, s) \
    case n: return (i64)ld(A.rg[n], bi * (s));
// Where batch bi of tensor `which` starts: its ragged offset, else bi * s0 (its batch stride).
// `which` is a constant at every call, so the switch folds.
__device__ __forceinline__ i64 fa_start(const FaIn& A, int which, i64 bi, i64 s0) {
    switch (which) {
        FA_RAGGED(FA_RG_START)
        default: (void)A; return bi * s0;
    }
}
#define FA_RG_ROW(n, ld, s) \
    case n: return row < len;
// Whether row `row` of a batch of `len` rows has memory in tensor `which` (a ragged tensor holds
// only its batch's rows: padded rows are neither read nor written).
__device__ __forceinline__ bool fa_has_row(int which, i64 row, i64 len) {
    switch (which) {
        FA_RAGGED(FA_RG_ROW)
        default: (void)row; (void)len; return true;
    }
}

// A row's log-sum-exp (natural units, as the stats hold it) in the log2 units the backward
// kernels use. An empty row's -inf (no key: the log of an empty sum) becomes +inf, so that
// exp2(s - lse) is 0 for every score of the row, masked (-inf) ones included, not NaN.
__device__ __forceinline__ float fa_lse2(double x) {
    const float v = (float)x;
    return v == FA_NINF ? FA_INF : v * FA_LOG2E;
}

// Per-batch lengths, clamped to [0, s] (the CPU rejects others; a kernel must not index past).
__device__ __forceinline__ void fa_lens(const FaIn& A, i64 bi, i64& lq, i64& lkv) {
#if FA_PADDING
    double x = LD_SLQ(A.slq, bi * SLQ_S0);
    double y = LD_SLKV(A.slkv, bi * SLKV_S0);
    lq = (i64)fmin(fmax(x, 0.0), (double)FA_SQ);
    lkv = (i64)fmin(fmax(y, 0.0), (double)FA_SKV);
#else
    (void)A; (void)bi;
    lq = FA_SQ;
    lkv = FA_SKV;
#endif
}

// The diagonal offset: diag(i) = i + off.
__device__ __forceinline__ i64 fa_diag_off(i64 lq, i64 lkv) {
#if FA_BOTTOM_RIGHT
    return lkv - lq;
#else
    (void)lq; (void)lkv;
    return 0;
#endif
}

// Whether key j is visible from query row i (padded rows see nothing).
__device__ __forceinline__ bool fa_visible(i64 i, i64 j, i64 lq, i64 lkv, i64 off) {
    if (i >= lq || j >= lkv) return false;
    const i64 diag = i + off;
#if FA_CAUSAL
    if (j > diag) return false;
#endif
#if FA_HAS_SWL
    if (j < diag - FA_SWL) return false;
#endif
#if FA_HAS_SWR
    if (j > diag + FA_SWR) return false;
#endif
    (void)diag;
    return true;
}

// Keys [*jlo, *jhi) some row of [q0, imax] sees (imax < lq); empty when *jlo >= *jhi.
__device__ __forceinline__ void fa_key_range(i64 q0, i64 imax, i64 lkv, i64 off, i64& jlo, i64& jhi) {
    jlo = 0;
    jhi = lkv;
#if FA_CAUSAL
    jhi = fa_min(jhi, imax + off + 1);
#endif
#if FA_HAS_SWR
    jhi = fa_min(jhi, imax + off + FA_SWR + 1);
#endif
#if FA_HAS_SWL
    jlo = fa_max(jlo, q0 + off - FA_SWL);
#endif
    (void)q0; (void)imax; (void)off;
}

// Whether a tile of rows [i0, i0 + RM) and keys [j0, j0 + RN) needs element-wise masking.
__device__ __forceinline__ bool fa_tile_needs_mask(i64 i0, i64 rm, i64 j0, i64 rn, i64 lq, i64 lkv, i64 off) {
    bool need = i0 + rm > lq || j0 + rn > lkv;
#if FA_CAUSAL
    need = need || j0 + rn - 1 > i0 + off;
#endif
#if FA_HAS_SWR
    need = need || j0 + rn - 1 > i0 + off + FA_SWR;
#endif
#if FA_HAS_SWL
    need = need || j0 < i0 + rm - 1 + off - FA_SWL;
#endif
    (void)off;
    return need;
}

// bias + ALiBi of score (bi, h, i, j), natural units.
__device__ __forceinline__ float fa_add(const FaIn& A, i64 bi, i64 h, i64 i, i64 j) {
    float a = 0.0f;
#if FA_HAS_BIAS
    a += (float)LD_BIAS(A.bias, bi * BI_S0 + h * BI_S1 + i * BI_S2 + j * BI_S3);
#endif
#if FA_ALIBI
    a += fa_slope(h) * (float)(j - i);
#endif
    (void)A; (void)bi; (void)h; (void)i; (void)j;
    return a;
}

// Whether dropout keeps score (bi, h, i, j).
__device__ __forceinline__ bool fa_keep(const FaIn& A, i64 bi, i64 h, i64 i, i64 j) {
#if FA_DROPOUT
    const u64 idx = (u64)(((bi * FA_HQ + h) * FA_SQ + i) * FA_SKV + j);
    return (u64)fa_philox(A.seed, A.offset, idx) >= A.drop_t;
#else
    (void)A; (void)bi; (void)h; (void)i; (void)j;
    return true;
#endif
}

// Offset of row j (channel 0) of kv head kh of batch bi in K / V (through the page tables
// when paged); -1 for a page entry outside the pool (the CPU rejects those).
__device__ __forceinline__ i64 fa_krow(const FaIn& A, i64 bi, i64 kh, i64 j) {
#if FA_PAGED
    double e = LD_PTK(A.ptk, bi * PTK_S0 + (j / FA_KBS) * PTK_S2);
    if (!(e >= 0.0 && e < (double)FA_KNB)) return -1;
    return (i64)e * K_S0 + kh * K_S1 + (j % FA_KBS) * K_S2;
#else
    return fa_start(A, FA_RG_K, bi, K_S0) + kh * K_S1 + j * K_S2;
#endif
}
__device__ __forceinline__ i64 fa_vrow(const FaIn& A, i64 bi, i64 kh, i64 j) {
#if FA_PAGED
    double e = LD_PTV(A.ptv, bi * PTV_S0 + (j / FA_VBS) * PTV_S2);
    if (!(e >= 0.0 && e < (double)FA_VNB)) return -1;
    return (i64)e * V_S0 + kh * V_S1 + (j % FA_VBS) * V_S2;
#else
    return fa_start(A, FA_RG_V, bi, V_S0) + kh * V_S1 + j * V_S2;
#endif
}

// `fa_store_NAME(p, off, a, b)`: an output's elements `off` and `off + S3` from two floats, as a
// pair of 4 bytes (the io type) when PAIR, else through ST (`st_<type>`) each.
#define FA_DEFINE_STORE(NAME, PAIR, ST, S3)                                                         \
    __device__ __forceinline__ void fa_store_##NAME(void* p, i64 off, float a, float b) {           \
        if constexpr (PAIR) {                                                                       \
            *reinterpret_cast<u32*>(reinterpret_cast<u16*>(p) + off) = fa_pack(a, b);               \
        } else {                                                                                    \
            ST(p, off, (double)a);                                                                  \
            ST(p, off + S3, (double)b);                                                             \
        }                                                                                           \
    }
