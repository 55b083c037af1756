// The Hopper GEMM kernel (see sm90.rs): wgmma with both operands in shared memory (or A's
// fragments in registers, tf32 with GEMM_RS), brought in by TMA through an mbarrier pipeline;
// warpgroup 0 produces, warpgroups 1 and 2 consume; persistent over the output tiles in grouped
// order; the epilogue applied to the accumulators and C stored from registers, through the
// workspace (split k) or through shared memory with TMA.
//
// Comes after kernel/hopper.cuh, common.cuh, the epilogue, tap.cuh (with GEMM_TAP), wgmma.cuh and
// sm90_common.cuh, and reads, besides their defines:
//   GEMM_BM, GEMM_BN      the tile: 128 rows (a consumer warpgroup each 64) or 64 (both consumers
//                         the same rows, each half of every stage's k steps), by 16 to 256 columns
//   GEMM_BK               k per stage (128 bytes of a row)
//   GEMM_THREADS          the block: 384 (one producer warpgroup), or 256 + GEMM_PRODUCERS
//   GEMM_STAGES, GEMM_STAGE_BYTES  the pipeline's stages and the bytes of one (A's BM x BK, then B)
//   GEMM_C_BYTES          shared memory after the stages for C (TMA store) or the second
//                         consumer's sums (64-row tiles)
//   GEMM_KT, GEMM_TILES_M, GEMM_TILES_N, GEMM_GROUP_M  k tiles; tile rows and columns; tile rows a
//                         group of the tile order walks together
//   GEMM_STREAMK          1: the last, partial wave's GEMM_SK_TAIL tiles split GEMM_SK_SPLITS
//                         ways along k over the grid (see `Work`), finished through `skpart`
//                         and `skflag`
//   GEMM_A_MN, GEMM_B_MN  1: A M-major, B N-major in shared memory (else K-major)
//   GEMM_INT              1: 8-bit integer operands, exact i32 sums in the accumulators'
//                         registers, converted to f32 once a tile's k loop is done (no split,
//                         no stream-K, 128-row tiles)
//   GEMM_INT_EXACT        1: (with GEMM_INT) no conversion: the sums' bits stored as they are
//                         into an integer C (the chain only identities), saturated to its type
//   GEMM_A3, GEMM_B3      true: the operand's TMA map has a batch coordinate (a grouped
//                         convolution's B: the group's, B_BT)
//   GEMM_GROUPS           the groups of a grouped convolution (gathered operands; 1 otherwise):
//                         the batch `bt` is images x groups, groups inner; the operands are read
//                         at group bt % GEMM_GROUPS (the gathers' base pointers GEMM_GA_GS and
//                         GEMM_GB_GS elements a group further on, B's TMA map at that batch, the
//                         im2col maps at the group's channels), rows of image bt / GEMM_GROUPS
//   GEMM_TMA_STORE        1: C (16-bit, row-major) stored through shared memory with TMA
//   GEMM_HOISTED          1: the epilogue from the side inputs' layouts (GEMM_SIDES): side values
//                         loaded once a tile where they allow; 0: `epilogue` per element
//   GEMM_SIDES(X)         the side inputs, X(i, READ, T, RS, CS, BATCH_OFFSET) each (see below)
//   GEMM_RELU_CVT         1: the chain's last relu is the conversion's (`epilogue_u` computes the rest)
//   GEMM_TAP              1: the tap's partials (TAP_AXES) to `tpart`
//   GEMM_A_IM2COL         1: A is a channels-last image read by im2col loads (sm90_im2col.cuh)
//   GEMM_GATHER           1: A and B gathered through index maps (`ga`, `gb`: their tensors) by
//                         all of the producer's threads (sm90_gather.cuh), each stage made
//                         visible to wgmma GEMM_LAG stages after its loads were issued, B by TMA
//                         (`tb`) instead with GEMM_B_TMA; the producers are GEMM_PRODUCERS
//                         threads (warpgroups 0 .. GEMM_PRODUCERS / 128 - 1), the consumers the
//                         two warpgroups after them; 0: both by TMA (`ta`, `tb`)

#define STAGES GEMM_STAGES
// The image and the group of batch `bt`, and B's TMA batch coordinate (the group's when there are
// groups, else the batch's).
#define A_IMG ((long long)bt / GEMM_GROUPS)
#define GROUP_OF_BT (bt % GEMM_GROUPS)
#if GEMM_GROUPS > 1
#define B_BT GROUP_OF_BT
#else
#define B_BT bt
#endif
// The constants below are globals of the kernel's PTX (as every namespace-scope variable is): they
// stay as they have always been, CM (the CTAs of a cluster: always 1, read by nothing) included.
static constexpr int CM = 1, KT = GEMM_KT, TILES_M = GEMM_TILES_M, TILES_N = GEMM_TILES_N, GROUP_M = GEMM_GROUP_M;
static constexpr int SPLITS = GEMM_SPLITS;
static constexpr long long TILES = (long long)GEMM_BATCH * GEMM_TILES_M * GEMM_TILES_N * SPLITS;
static constexpr unsigned A_BYTES = GEMM_BM * 128u, STAGE_BYTES = GEMM_STAGE_BYTES;
#define BM GEMM_BM
#define BN GEMM_BN
#define BK GEMM_BK
// The accumulators of a consumer thread.
#define ND (GEMM_BN / 2)
#define C_BYTES ((unsigned)GEMM_C_BYTES)
// A M-major: chunks of one swizzle span of m (64 16-bit or 32 f32 elements) by BK k rows.
#define A_SPAN (128 / DT_SIZE(GEMM_A))
#define A_CHUNK (128u * GEMM_BK)

// A consumer is done with a stage: every thread of both consumers arrives on the stage's "empty"
// barrier. The arrive is a release at CTA scope (the default): the consumers only read the stage,
// and the producer's next TMA write is ordered after the barrier completes. (`lane` is not read:
// the tf32 main loop's lambda capturing it keeps that kernel's PTX as it was.)
__device__ __forceinline__ void release_stage(unsigned bar, int lane) {
    (void)lane;
    mbar_arrive(bar);
}

// Work item `t`: split SPLITS ways along k (k tiles [k0, k1)), then output tiles in grouped
// order: GROUP_M tiles down M, then the next column; batches outermost.
__device__ __forceinline__ void tile_coords(long long t, int& bt, int& tm, int& tn, int& k0, int& k1) {
    const int sp = (int)(t % SPLITS);
    t /= SPLITS;
    k0 = (int)((long long)sp * KT / SPLITS);
    k1 = (int)((long long)(sp + 1) * KT / SPLITS);
    const long long per_batch = (long long)TILES_M * TILES_N;
    bt = (int)(t / per_batch);
    const int r = (int)(t - (long long)bt * per_batch);
    const int per_group = GROUP_M * TILES_N;
    const int g = r / per_group;
    const int first_m = g * GROUP_M;
    const int gm = min(TILES_M - first_m, GROUP_M);
    const int in_group = r - g * per_group;
    tm = first_m + in_group % gm;
    tn = in_group / gm;
}

// The work of a CTA: output tiles (with their split of k) strided over the grid; with the split
// tail (GEMM_STREAMK) the whole waves of tiles so, then the GEMM_SK_TAIL tiles of the last,
// partial wave each split GEMM_SK_SPLITS ways along k over consecutive CTAs (tail item b: tile
// TILES - GEMM_SK_TAIL + b / GEMM_SK_SPLITS, its part b % GEMM_SK_SPLITS), so that the last wave
// keeps every SM busy (see the consumers' epilogue for how a split tile is finished). The tail's
// CTAs all reach it at about the same time and walk its tiles' k in step, as the whole waves do.
struct Work {
    long long at;
    __device__ __forceinline__ Work() : at(blockIdx.x) {}
    // The next work item: tile t (its batch, tile row and column) over k tiles [k0, k1).
    __device__ __forceinline__ bool next(long long& t, int& bt, int& tm, int& tn, int& k0, int& k1) {
#if GEMM_STREAMK
        constexpr long long WHOLE = TILES - GEMM_SK_TAIL;
        if (at < WHOLE) {
            t = at;
            tile_coords(t, bt, tm, tn, k0, k1);
            at += gridDim.x;
            return true;
        }
        // (Past the tail: `at` is parked at the largest value.)
        if (at == 0x7fffffffffffffffLL || blockIdx.x >= GEMM_SK_TAIL * GEMM_SK_SPLITS) return false;
        at = 0x7fffffffffffffffLL;
        t = WHOLE + blockIdx.x / GEMM_SK_SPLITS;
        tile_coords(t, bt, tm, tn, k0, k1);
        const int part = blockIdx.x % GEMM_SK_SPLITS;
        k0 = part * KT / GEMM_SK_SPLITS;
        k1 = (part + 1) * KT / GEMM_SK_SPLITS;
        return true;
#else
        if (at >= TILES) return false;
        t = at;
        tile_coords(t, bt, tm, tn, k0, k1);
        at += gridDim.x;
        return true;
#endif
    }
};

// Shared-memory descriptors of k-step kk (16 elements) for this consumer's 64 rows of A and the
// whole of B. K-major: rows of 128 bytes, 8-row atoms 1024 bytes apart, k steps 32 bytes along the
// row. M/N-major: k rows of 128 bytes (64 m or n), atoms of 8 k rows 1024 bytes apart, 64-wide
// chunks 8192 bytes apart (64 k rows each), k steps 16 rows = 2048 bytes. (64-row tiles: both
// consumers read the same rows of A.)
#if GEMM_BM == 64
#define A_ROWS
#else
#define A_ROWS cw * 8192u +
#endif
#if GEMM_A_MN
#define DESC_A make_desc(sa + A_ROWS kk * 2048u, 8192u, 1024u)
#else
#define DESC_A make_desc(sa + A_ROWS kk * 32u, 16u, 1024u)
#endif
#if GEMM_B_MN
#define DESC_B make_desc(sb + kk * 2048u, 8192u, 1024u)
#else
#define DESC_B make_desc(sb + kk * 32u, 16u, 1024u)
#endif

// The first row of this consumer's 64 in the tile, and its k steps of a stage: all four, or with
// 64-row tiles (both consumers on the same rows) its two.
#if GEMM_BM == 64
#define ROW_BASE (long long)tm * 64
#define K_STEPS 2
#define K_FIRST 2 * cw +
#else
#define ROW_BASE (long long)tm * 128 + cw * 64
#define K_STEPS 4
#define K_FIRST
#endif

// The side inputs of the hoisted epilogue (GEMM_SIDES lists X(i, READ, T, RS, CS, BATCH_OFFSET):
// parameter e<i> of element type T, element strides RS and CS along C's rows and columns, and the
// offset for batch `bt` as terms `+ ...` of an index expression). READ says how the kernel reads
// it: SCALAR one value; ROW the thread's two rows; COL the thread's BN / 4 columns, COL2 as
// 2-element vectors; FULL (and per-column ones beyond a register budget) inside the store loop,
// one load per accumulator pair from row pointers computed once a tile, FULL2 as 2-element vectors.
// SIDE_PREP loads what is loaded once a tile (before the last k step's wgmmas complete, so their
// latency hides under the tensor cores), SIDE_VALUE what is loaded per accumulator pair (j, h),
// SIDE_X0 / SIDE_X1 are the values for columns `col` and `col + 1`. Loads are guarded by the
// matrix extents (out-of-range values are computed from zeros and never stored).
#define SIDE_PREP(i, READ, T, RS, CS, BO)             \
    long long bo##i = 0 BO;                           \
    const T* const p##i = (const T*)e##i + bo##i;     \
    SIDE_PREP_##READ(i, T, RS, CS)
#define SIDE_VALUE(i, READ, T, RS, CS, BO) SIDE_VALUE_##READ(i, T, RS, CS)
#define SIDE_X0(i, READ, T, RS, CS, BO) , SIDE_X0_##READ(i, T)
#define SIDE_X1(i, READ, T, RS, CS, BO) , SIDE_X1_##READ(i, T)

// 2-element vectors of a side input's type: the type, its zero, its halves as floats.
#define SIDE_V_float float2
#define SIDE_V___half __half2
#define SIDE_V___nv_bfloat16 __nv_bfloat162
#define SIDE_ZERO_float make_float2(0.f, 0.f)
#define SIDE_ZERO___half __float2half2_rn(0.f)
#define SIDE_ZERO___nv_bfloat16 __float2bfloat162_rn(0.f)
#define SIDE_LO_float(v) v.x
#define SIDE_HI_float(v) v.y
#define SIDE_LO___half(v) __low2float(v)
#define SIDE_HI___half(v) __high2float(v)
#define SIDE_LO___nv_bfloat16(v) __low2float(v)
#define SIDE_HI___nv_bfloat16(v) __high2float(v)

#define SIDE_PREP_SCALAR(i, T, RS, CS) const float s##i = fz_cv(p##i[0]);
#define SIDE_VALUE_SCALAR(i, T, RS, CS)
#define SIDE_X0_SCALAR(i, T) s##i
#define SIDE_X1_SCALAR(i, T) s##i

#define SIDE_PREP_ROW(i, T, RS, CS) \
    float r##i[2];                  \
    _Pragma("unroll") for (int h = 0; h < 2; ++h) r##i[h] = row0 + 8 * h < M_ ? fz_cv(p##i[(row0 + 8 * h) * RS]) : 0.f;
#define SIDE_VALUE_ROW(i, T, RS, CS)
#define SIDE_X0_ROW(i, T) r##i[h]
#define SIDE_X1_ROW(i, T) r##i[h]

#define SIDE_PREP_COL2(i, T, RS, CS) \
    SIDE_V_##T c##i[BN / 8];         \
    _Pragma("unroll") for (int j = 0; j < BN / 8; ++j) c##i[j] = colt + 8 * j < N_ ? *(const SIDE_V_##T*)(p##i + colt + 8 * j) : SIDE_ZERO_##T;
#define SIDE_VALUE_COL2(i, T, RS, CS)
#define SIDE_X0_COL2(i, T) SIDE_LO_##T(c##i[j])
#define SIDE_X1_COL2(i, T) SIDE_HI_##T(c##i[j])

#define SIDE_PREP_COL(i, T, RS, CS) \
    float c##i[BN / 4];             \
    _Pragma("unroll") for (int q = 0; q < BN / 4; ++q) c##i[q] = colt + 8 * (q >> 1) + (q & 1) < N_ ? fz_cv(p##i[(colt + 8 * (q >> 1) + (q & 1)) * CS]) : 0.f;
#define SIDE_VALUE_COL(i, T, RS, CS)
#define SIDE_X0_COL(i, T) c##i[2 * j]
#define SIDE_X1_COL(i, T) c##i[2 * j + 1]

// (Row pointers of the thread's two rows at its first column.)
#define SIDE_PREP_FULL(i, T, RS, CS) \
    const T* fr##i[2];               \
    _Pragma("unroll") for (int h = 0; h < 2; ++h) fr##i[h] = p##i + (row0 + 8 * h) * RS + colt * CS;
#define SIDE_VALUE_FULL(i, T, RS, CS)                                                                   \
    const float f##i##_0 = (row < M_ && col < N_) ? fz_cv(fr##i[h][(8 * j) * CS]) : 0.f;              \
    const float f##i##_1 = (row < M_ && col + 1 < N_) ? fz_cv(fr##i[h][(8 * j + 1) * CS]) : 0.f;
#define SIDE_X0_FULL(i, T) f##i##_0
#define SIDE_X1_FULL(i, T) f##i##_1

#define SIDE_PREP_FULL2 SIDE_PREP_FULL
#define SIDE_VALUE_FULL2(i, T, RS, CS) \
    const SIDE_V_##T f##i = (row < M_ && col < N_) ? *(const SIDE_V_##T*)(fr##i[h] + 8 * j) : SIDE_ZERO_##T;
#define SIDE_X0_FULL2(i, T) SIDE_LO_##T(f##i)
#define SIDE_X1_FULL2(i, T) SIDE_HI_##T(f##i)

// The chain as a function of the accumulator and the side values: without its last relu where
// the conversion applies it.
// (GEMM_INT_EXACT: the accumulators' bits are the i32 sums, stored as they are.)
#if GEMM_INT_EXACT
#define EPI_V(v) (v)
#elif GEMM_RELU_CVT
#define EPI_V epilogue_u
#else
#define EPI_V epilogue_v
#endif

// Accumulator pair (j, h) of this thread: row 16w + l/4 + 8h, columns 8j + 2(l%4) and the next
// one, of this warpgroup's 64 x BN block.
#if GEMM_HOISTED
#define ACC_COL colt + 8 * j
#else
#define ACC_COL (long long)tn * BN + 8 * j + 2 * (l & 3)
#endif

// TMA-store epilogue: two values packed as C's 16-bit pair (with relu: negative values to +0),
// and the packed values as stored, for the tap.
#if GEMM_C == DT_bf16 && GEMM_RELU_CVT
#define C_PACK(v0, v1) bf16x2_relu_bits(v0, v1)
#elif GEMM_C == DT_bf16
#define C_PACK(v0, v1) bf16x2_bits(v0, v1)
#elif GEMM_RELU_CVT
#define C_PACK(v0, v1) f16x2_relu_bits(v0, v1)
#else
#define C_PACK(v0, v1) f16x2_bits(v0, v1)
#endif
#if GEMM_C == DT_bf16
#define PACKED_LO __uint_as_float(cv[2 * j + h] << 16)
#define PACKED_HI __uint_as_float(cv[2 * j + h] & 0xffff0000u)
#else
#define PACKED_LO __half2float(__ushort_as_half((unsigned short)(cv[2 * j + h] & 0xffffu)))
#define PACKED_HI __half2float(__ushort_as_half((unsigned short)(cv[2 * j + h] >> 16)))
#endif
// A value as stored in C (rounded to its type), for the tap.
#if GEMM_C == DT_bf16
#define C_ROUNDED(v) __bfloat162float(__float2bfloat16_rn(v))
#elif GEMM_C == DT_f16
#define C_ROUNDED(v) __half2float(__float2half_rn(v))
#else
#define C_ROUNDED(v) v
#endif
// The TMA store's batch coordinate.
#if GEMM_BATCH > 1
#define C_COORDS bt, true
#else
#define C_COORDS 0, false
#endif

// The tap's partials: one a tile and consumer warp (TAP_ALL, `tacc`); a row's values lie with the
// four lanes of a quad (TAP_ROWS, `racc[h]`: folded across them, and the quad's first lane writes
// the row's partial of this tile column); a column's values of the warp's 16 rows lie with the
// eight lanes of equal l % 4 (TAP_COLS, `cc0`, `cc1`: folded across them after each column group,
// and lanes 0-3 write the warp's partials). TAP_FOLD(lo, hi) folds the stored values of columns
// `col` and `col + 1` of row `row`.
#if GEMM_TAP && TAP_AXES == TAP_ALL
#define TAP_ACC0 tacc
#define TAP_ACC1 tacc
#elif GEMM_TAP && TAP_AXES == TAP_ROWS
#define TAP_ACC0 racc[h]
#define TAP_ACC1 racc[h]
#else
#define TAP_ACC0 cc0
#define TAP_ACC1 cc1
#endif
#define TAP_FOLD(lo, hi)                                                   \
    if (row < M_ && col < N_) TAP_ACC0 = tap_fold(TAP_ACC0, lo);         \
    if (row < M_ && col + 1 < N_) TAP_ACC1 = tap_fold(TAP_ACC1, hi);

extern "C" __global__ void __launch_bounds__(GEMM_THREADS, 1) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    extern __shared__ unsigned char smem_raw[];
    const unsigned base = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const unsigned bars = base + STAGES * STAGE_BYTES + C_BYTES;
    const int wg = threadIdx.x / 128;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
#if GEMM_GATHER
            // (Every producer thread arrives on a full barrier; with B by TMA, thread 0 once more
            // with its bytes.)
            mbar_init(bars + 8u * s, GEMM_PRODUCERS + GEMM_B_TMA);
#else
            mbar_init(bars + 8u * s, 1u);
#endif
            mbar_init(bars + 8u * (STAGES + s), 256u);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
#if GEMM_GATHER
    if (threadIdx.x < GEMM_PRODUCERS) {
        // Producers: each thread gathers its share of every stage, commits it as one cp.async
        // group, and GEMM_LAG stages later (its loads then complete) makes it visible to the
        // async proxy and arrives on the stage's full barrier. (Registers stay as launched: the
        // gathers need more than TMA's one thread, and the consumers' tiles are at most 128 wide.)
        const int ptid = threadIdx.x;
        int s = 0, issued = 0;
        unsigned phase = 0;
        long long t;
        int bt, tm, tn, k0, k1;
        for (Work work; work.next(t, bt, tm, tn, k0, k1);) {
            const long long m0 = (long long)tm * BM, n0 = (long long)tn * BN;
            const unsigned am0 = (unsigned)(A_IMG * M_ + m0);
            // (The batch's group: its operands from their group's first channels and filters.)
            const char* const gat = (const char*)ga + (long long)GROUP_OF_BT * GEMM_GA_GS * 2;
#if !GEMM_B_TMA
            const char* const gbt = (const char*)gb + (long long)GROUP_OF_BT * GEMM_GB_GS * 2;
#endif
            g90_rows<BM, GEMM_A_MN, GEMM_GA_VEC> ra;
            g90_prepare<0>(ra, am0, ptid);
#if !GEMM_B_TMA
            g90_rows<BN, GEMM_B_MN, GEMM_GB_VEC> rb;
            g90_prepare<1>(rb, (unsigned)n0, ptid);
#endif
            for (int kt = k0; kt < k1; ++kt) {
                mbar_wait(bars + 8u * (STAGES + s), phase ^ 1u);
                const unsigned sa = base + s * STAGE_BYTES, sb = sa + A_BYTES;
                const unsigned kk0 = (unsigned)kt * BK;
#if GEMM_B_TMA
                if (ptid == 0) {
                    const unsigned full = bars + 8u * s;
                    mbar_expect_tx(full, STAGE_BYTES - A_BYTES);
#if GEMM_B_MN
                    for (int q = 0; q < BN / 64; ++q) tma_load(sb + q * 8192u, &tb, full, tn * BN + q * 64, kt * BK, B_BT, GEMM_B3);
#else
                    tma_load(sb, &tb, full, kt * BK, tn * BN, B_BT, GEMM_B3);
#endif
                }
#else
                g90_stage<1>(sb, gbt, rb, (unsigned)n0, kk0, N_ - n0, K_ - kk0, ptid);
#endif
                g90_stage<0>(sa, gat, ra, am0, kk0, M_ - m0, K_ - kk0, ptid);
                asm volatile("cp.async.commit_group;\n" ::: "memory");
                if (issued >= GEMM_LAG) {
                    asm volatile("cp.async.wait_group %0;\n" ::"n"(GEMM_LAG) : "memory");
                    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                    mbar_arrive(bars + 8u * ((s + STAGES - GEMM_LAG) % STAGES));
                }
                ++issued;
                if (++s == STAGES) { s = 0; phase ^= 1u; }
            }
        }
        // The last stages issued.
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        for (int i = min(issued, GEMM_LAG); i > 0; --i) mbar_arrive(bars + 8u * ((s + STAGES - i) % STAGES));
    } else {
        const int cw = wg - GEMM_PRODUCERS / 128;
#else
    if (wg == 0) {
        // Producer.
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (threadIdx.x == 0) {
            asm volatile("prefetch.tensormap [%0];" :: "l"(&ta) : "memory");
            asm volatile("prefetch.tensormap [%0];" :: "l"(&tb) : "memory");
            int s = 0;
            unsigned phase = 0;
            long long t;
            int bt, tm, tn, k0, k1;
            for (Work work; work.next(t, bt, tm, tn, k0, k1);) {
#if GEMM_A_IM2COL && !GEMM_IC_K
                const ic_start st = ic_tile(A_IMG * M_ + (long long)tm * BM);
#endif
                for (int kt = k0; kt < k1; ++kt) {
                    mbar_wait(bars + 8u * (STAGES + s), phase ^ 1u);
                    const unsigned full = bars + 8u * s;
                    mbar_expect_tx(full, STAGE_BYTES);
                    const unsigned sa = base + s * STAGE_BYTES, sb = sa + A_BYTES;
                    // TMA coordinates (innermost first) of the slices of one stage.
#if GEMM_A_IM2COL && GEMM_IC_K
                    // (A M-major: each 64 rows of (tap, channel) one load of this stage's 64 pixels.)
                    const ic_start st = ic_tile((long long)kt * BK);
                    for (int q = 0; q < BM / 64; ++q) ic_load(sa + q * A_CHUNK, &ta, full, st, tm * BM + q * 64, GROUP_OF_BT * GEMM_IC_C);
#elif GEMM_A_IM2COL
                    ic_load(sa, &ta, full, st, kt * BK, GROUP_OF_BT * GEMM_IC_C);
#elif GEMM_A_MN
                    for (int q = 0; q < BM / A_SPAN; ++q) tma_load(sa + q * A_CHUNK, &ta, full, tm * BM + q * A_SPAN, kt * BK, bt, GEMM_A3);
#else
                    tma_load(sa, &ta, full, kt * BK, tm * BM, bt, GEMM_A3);
#endif
#if GEMM_A_IM2COL && GEMM_B_TAPS
                    {
                        // (A data gradient's filter: tap t's output channels k0 .. k0 + 63.)
                        const int t = kt * BK / GEMM_IC_C, k0 = kt * BK % GEMM_IC_C;
                        const int tf = GEMM_BT_FLIP ? GEMM_BT_T - 1 - t : t;
                        for (int q = 0; q < BN / 64; ++q) tma_load(sb + q * 8192u, &tb, full, tn * BN + q * 64, GROUP_OF_BT * GEMM_IC_C + k0, tf, true);
                    }
#elif GEMM_B_MN
                    for (int q = 0; q < BN / 64; ++q) tma_load(sb + q * 8192u, &tb, full, tn * BN + q * 64, kt * BK, B_BT, GEMM_B3);
#else
                    tma_load(sb, &tb, full, kt * BK, tn * BN, B_BT, GEMM_B3);
#endif
                    if (++s == STAGES) { s = 0; phase ^= 1u; }
                }
            }
        }
    } else {
        // Consumers: warpgroup cw owns rows cw * 64 .. cw * 64 + 63 of each tile.
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
        const int cw = wg - 1;
#endif
        const int tid = threadIdx.x % 128, w = tid / 32, l = tid % 32;
        unsigned char* const cbase = (unsigned char*)c;
#if GEMM_RS
        // The fragment offsets of A's registers: value i of a k step is row r = 16 (w % 2) + l / 4
        // + 8 (i % 2) of the warp's 32-row chunk 2 cw + w / 2, k row q = l % 4 + 4 (i / 2), its
        // 16-byte unit (r / 4) swizzled by q.
        unsigned foff[4];
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int r = 16 * (w & 1) + (l >> 2) + 8 * (i & 1), q = (l & 3) + 4 * (i >> 1);
            foff[i] = (unsigned)(2 * cw + (w >> 1)) * 4096u + q * 128u + ((unsigned)((r >> 2) ^ q) << 4) + (r & 3) * 4u;
        }
        unsigned fa0[16], fa1[16];
#endif
        float d[ND];
        #pragma unroll
        for (int i = 0; i < ND; ++i) d[i] = 0.f;
        int s = 0;
        unsigned phase = 0;
        long long t;
        int bt, tm, tn, k0, k1;
        for (Work work; work.next(t, bt, tm, tn, k0, k1);) {
            int prev = 0;
#if GEMM_RS
            // A's fragments (tf32-rounded) from its M-major stage (chunks of 32 rows x 32 k
            // rows, 128-byte rows swizzled by k % 8) into registers, two sets (fa0 / fa1 on
            // alternate stages), since a stage's wgmmas may still read theirs while the next
            // stage's are loaded.
            auto rs_stage = [&](unsigned (&fa)[16], int kt) {
                mbar_wait(bars + 8u * s, phase);
                const unsigned sa = base + s * STAGE_BYTES, sb = sa + A_BYTES;
                #pragma unroll
                for (int i = 0; i < 16; ++i) {
                    // One volatile statement: the compiler may not sink the rounding past the
                    // fence below (ptxas then serializes every wgmma: C7513).
                    asm volatile("{\n.reg .f32 v;\nld.shared.f32 v, [%1];\ncvt.rna.tf32.f32 %0, v;\n}" : "=r"(fa[i]) : "r"(sa + foff[i & 3] + (i >> 2) * 1024u));
                }
                wgmma_fence();
                #pragma unroll
                for (int kk = 0; kk < 4; ++kk) wgmma_tile_rs(d, fa + 4 * kk, DESC_B, (kt > k0 || kk > 0) ? 1 : 0);
                wgmma_commit();
                // The previous stage's wgmmas are done: hand its buffers back to the producer.
                wgmma_wait1();
                if (kt > k0) release_stage(bars + 8u * (STAGES + prev), l);
                prev = s;
                if (++s == STAGES) { s = 0; phase ^= 1u; }
            };
            // (Unrolled by two with a guarded second stage instead, ptxas serialized the wgmmas
            // of some shapes: C7513.)
            for (int kt = k0; kt < k1; ++kt) {
                if ((kt - k0) & 1) rs_stage(fa1, kt); else rs_stage(fa0, kt);
            }
#else
            for (int kt = k0; kt < k1; ++kt) {
                mbar_wait(bars + 8u * s, phase);
                const unsigned sa = base + s * STAGE_BYTES, sb = sa + A_BYTES;
                wgmma_fence();
                // (A warpgroup whose rows all lie below M could skip its wgmmas, but a branch
                // around them makes ptxas serialize every wgmma of the kernel: C7520.)
                #pragma unroll
                for (int k2 = 0; k2 < K_STEPS; ++k2) {
                    const int kk = K_FIRST k2;
                    wgmma_tile(d, DESC_A, DESC_B, (kt > k0 || k2 > 0) ? 1 : 0);
                }
                wgmma_commit();
                // The previous stage's wgmmas are done: hand its buffers back to the producer.
                wgmma_wait1();
                if (kt > k0) release_stage(bars + 8u * (STAGES + prev), l);
                prev = s;
                if (++s == STAGES) { s = 0; phase ^= 1u; }
            }
#endif
#if GEMM_HOISTED
            // This thread's first row and column in the tile, and the side values it needs.
            const long long row0 = ROW_BASE + w * 16 + (l >> 2);
            const long long colt = (long long)tn * BN + 2 * (l & 3);
            GEMM_SIDES(SIDE_PREP)
#endif
            wgmma_wait0();
            release_stage(bars + 8u * (STAGES + prev), l);
#if GEMM_INT && !GEMM_INT_EXACT
            // The tile's exact i32 sums as f32, once (rounded to nearest even past 2^24, as the
            // CPU engine rounds them to an f32 C): the epilogue and the stores work in f32.
            #pragma unroll
            for (int i = 0; i < ND; ++i) d[i] = __int2float_rn(__float_as_int(d[i]));
#endif
#if GEMM_STREAMK
            // A tail tile split along k is finished by the CTA with its first part; each of the
            // others leaves its sums in its own slot of the workspace (f32, element i of consumer
            // thread cw, tid at i * 256 + cw * 128 + tid: coalesced) and sets its flag (zeroed by
            // the launch before). The finisher adds the slots in order (deterministic) into its
            // accumulators, then runs the epilogue. (All CTAs of the persistent grid are resident
            // at once, one per SM, and a part's CTA waits for nothing before it writes.)
            if (k0 > 0) {
                float* const slot = skpart + (long long)blockIdx.x * (BM * BN);
                #pragma unroll
                for (int i = 0; i < ND; ++i) __stcg(slot + i * 256 + cw * 128 + tid, d[i]);
                __threadfence();
                asm volatile("bar.sync 5, 256;" ::: "memory");
                if (cw == 0 && tid == 0) asm volatile("st.release.gpu.global.u32 [%0], %1;" :: "l"(skflag + blockIdx.x), "r"(1u) : "memory");
                continue;
            }
            if (k1 < KT) {
                for (int c = blockIdx.x + 1; c < blockIdx.x + GEMM_SK_SPLITS; ++c) {
                    if (cw == 0 && tid == 0) {
                        unsigned f = 0;
                        for (;;) {
                            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(f) : "l"(skflag + c) : "memory");
                            if (f != 0u) break;
                            __nanosleep(64);
                        }
                    }
                    asm volatile("bar.sync 5, 256;" ::: "memory");
                    const float* const slot = skpart + (long long)c * (BM * BN);
                    #pragma unroll
                    for (int i = 0; i < ND; ++i) d[i] += __ldcg(slot + i * 256 + cw * 128 + tid);
                }
            }
#endif
#if GEMM_BM == 64
            // 64-row tiles: the second consumer's sums go through shared memory (element i of
            // every thread together, so the accesses are conflict-free) into the first's, which
            // alone runs the epilogue; the second barrier keeps the buffer until they are read.
            {
                float* const red = (float*)(smem_raw + (base + STAGES * STAGE_BYTES - smem_u32(smem_raw)));
                if (cw == 1) {
                    #pragma unroll
                    for (int i = 0; i < ND; ++i) red[i * 128 + tid] = d[i];
                }
                asm volatile("bar.sync 3, 256;" ::: "memory");
                if (cw == 0) {
                    #pragma unroll
                    for (int i = 0; i < ND; ++i) d[i] += red[i * 128 + tid];
#endif
            // The epilogue.
#if GEMM_TAP && TAP_AXES == TAP_ALL
            float tacc = TAP_ID;
#elif GEMM_TAP && TAP_AXES == TAP_ROWS
            float racc[2] = {TAP_ID, TAP_ID};
#endif
#if GEMM_SPLITS > 1
            // Split k: this split's f32 partial sums go to the workspace, [split][batch][M][NP];
            // the reduce launch adds the splits in order and applies the epilogue.
            const int sp = (int)(t % SPLITS);
#elif GEMM_TMA_STORE
            // The values of this thread's accumulators as 16-bit pairs cv[2 j + h].
            unsigned cv[BN / 4];
#endif
#if !GEMM_HOISTED
            const long long row0 = ROW_BASE + w * 16 + (l >> 2);
#endif
#if GEMM_SPLITS == 1 && !GEMM_TMA_STORE
            const long long bofs = (long long)bt * C_BS;
#endif
            #pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
                const long long col = ACC_COL;
#if GEMM_TAP && TAP_AXES == TAP_COLS
                float cc0 = TAP_ID, cc1 = TAP_ID;
#endif
                #pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const long long row = row0 + 8 * h;
#if GEMM_SPLITS > 1
                    if (row < M_ && col < N_) {
                        float* pp = part + (((long long)sp * BATCH + bt) * M_ + row) * NP + col;
                        *(float2*)pp = make_float2(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
                    }
#elif GEMM_TMA_STORE && GEMM_HOISTED
                    (void)row; (void)col;
                    GEMM_SIDES(SIDE_VALUE)
                    const float v0 = EPI_V(d[4 * j + 2 * h] GEMM_SIDES(SIDE_X0));
                    const float v1 = EPI_V(d[4 * j + 2 * h + 1] GEMM_SIDES(SIDE_X1));
                    cv[2 * j + h] = C_PACK(v0, v1);
#if GEMM_TAP
                    // The tap folds the packed values (as stored: rounded, and the relu in the
                    // conversion).
                    TAP_FOLD(PACKED_LO, PACKED_HI)
#endif
#elif GEMM_TMA_STORE
                    float v0 = 0.f, v1 = 0.f;
                    if (row < M_ && col < N_) v0 = epilogue(d[4 * j + 2 * h], bt, row, col EPI_NAMES);
                    if (row < M_ && col + 1 < N_) v1 = epilogue(d[4 * j + 2 * h + 1], bt, row, col + 1 EPI_NAMES);
                    cv[2 * j + h] = C_PACK(v0, v1);
#elif GEMM_HOISTED
                    // Direct stores from registers, guarded.
                    GEMM_SIDES(SIDE_VALUE)
                    const float v0 = EPI_V(d[4 * j + 2 * h] GEMM_SIDES(SIDE_X0));
                    const float v1 = EPI_V(d[4 * j + 2 * h + 1] GEMM_SIDES(SIDE_X1));
#if GEMM_TAP
                    // The tap folds the values as stored (rounded to C's type).
                    TAP_FOLD(C_ROUNDED(v0), C_ROUNDED(v1))
#endif
                    if (row < M_) {
                        unsigned char* rp = cbase + bofs + row * C_RS;
                        C_STORE_VALUES
                    }
#else
                    if (row < M_) {
                        unsigned char* rp = cbase + bofs + row * C_RS;
                        C_STORE_EPI(d[4 * j + 2 * h], d[4 * j + 2 * h + 1])
                    }
#endif
                }
#if GEMM_TAP && TAP_AXES == TAP_COLS
                #pragma unroll
                for (int o = 4; o < 32; o <<= 1) {
                    cc0 = tap_comb(cc0, __shfl_xor_sync(0xffffffffu, cc0, o));
                    cc1 = tap_comb(cc1, __shfl_xor_sync(0xffffffffu, cc1, o));
                }
                if (l < 4) {
                    float* const tp = tpart + ((long long)(tm * 8 + cw * 4 + w) * BATCH + bt) * N_;
                    if (col < N_) tp[col] = cc0;
                    if (col + 1 < N_) tp[col + 1] = cc1;
                }
#endif
            }
#if GEMM_TMA_STORE
            // The block written to shared memory in boxes of 64 columns (128-byte rows swizzled as
            // the TMA store reads them), and one thread storing the boxes with TMA (clipped at the
            // matrix edges, so values outside C are computed but never stored) while the warps go
            // on. The block is reused once the last store has read it. Plain C++ stores to shared
            // memory (no asm memory clobber), so the compiler may schedule loads of the values
            // ahead of them.
            const unsigned cbuf = base + STAGES * STAGE_BYTES + cw * (64u * BN * 2);
            unsigned char* const cgen = smem_raw + (cbuf - smem_u32(smem_raw));
            if (tid == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
            consumer_sync(cw);
            #pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
                #pragma unroll
                for (int h = 0; h < 2; ++h) {
                    // Row rl of the block, byte 4 (l % 4) of 16-byte chunk j % 8 of box j / 8,
                    // chunks swizzled by the row (rl % 8 == l / 4).
                    const int rl = w * 16 + (l >> 2) + 8 * h;
                    *(unsigned*)(cgen + (j >> 3) * 8192 + rl * 128 + (((j & 7) ^ (l >> 2)) << 4) + 4 * (l & 3)) = cv[2 * j + h];
                }
            }
            // The block made visible to the TMA (async proxy), the warpgroup synchronized, then
            // one thread stores its 64-column boxes and commits them.
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            consumer_sync(cw);
            if (tid == 0) {
                #pragma unroll
                for (int q = 0; q < BN / 64; ++q) tma_store(cbuf + q * 8192u, &tcm, tn * BN + q * 64, tm * 128 + cw * 64, C_COORDS);
                asm volatile("cp.async.bulk.commit_group;" ::: "memory");
            }
#endif
#if GEMM_TAP && TAP_AXES == TAP_ALL
            #pragma unroll
            for (int o = 16; o > 0; o >>= 1) tacc = tap_comb(tacc, __shfl_xor_sync(0xffffffffu, tacc, o));
            if (l == 0) tpart[t * 8 + cw * 4 + w] = tacc;
#elif GEMM_TAP && TAP_AXES == TAP_ROWS
            #pragma unroll
            for (int h = 0; h < 2; ++h) {
                racc[h] = tap_comb(racc[h], __shfl_xor_sync(0xffffffffu, racc[h], 1));
                racc[h] = tap_comb(racc[h], __shfl_xor_sync(0xffffffffu, racc[h], 2));
                const long long row = row0 + 8 * h;
                if ((l & 3) == 0 && row < M_) tpart[((long long)tn * BATCH + bt) * M_ + row] = racc[h];
            }
#endif
#if GEMM_BM == 64
                }
                asm volatile("bar.sync 3, 256;" ::: "memory");
            }
#endif
        }
#if GEMM_TMA_STORE
        // The last consumer thread to store C with TMA waits for its stores before the kernel ends.
        if (tid == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
    }
}
