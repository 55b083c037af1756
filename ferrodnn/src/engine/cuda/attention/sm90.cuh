// Hopper (sm_90a) helpers the attention kernels share (attention/fwd90.rs, bwd90.rs), after
// kernel/hopper.cuh: the wgmma products on the attention layouts, the 4-d TMA load, the work
// order of the (tile, head, batch) items, and the packing of f32 accumulators into A fragments.
//
// Reads common.cuh's defines and FA_HEADS_GROUP (hopper.rs, `heads_group`).

// The accumulator operands of a wgmma.m64nNk16 with N / 2 f32 accumulators per thread: the asm
// list "%0, ..., %(N/2 - 1)" and the matching outputs of `d`, for N = 64 and N = 128.
#define FA90_ACC32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define FA90_ACC64 FA90_ACC32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define FA90_OUT32 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
    "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
    "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
    "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
    "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define FA90_OUT64 \
    FA90_OUT32, "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), \
    "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), \
    "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), \
    "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), \
    "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// d (+)= A B, wgmma.m64nNk16, both operands in shared memory (descriptors da, db), K-major or,
// with MN, both MN-major (the transpose flags: e.g. A = dS from a [keys][queries] tile and
// B = K from its [keys][d] tile); scale_d 0 overwrites d.
#define FA90_WGMMA_SS(N, ACC, OUT, DA, DB, SD, TRANS)                                                   \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #SD ", 0;\n"                                      \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." FA_MMA_T "." FA_MMA_T " {" ACC       \
                 "}, %" #DA ", %" #DB ", p, 1, 1, " TRANS ";\n}\n"                                      \
                 : OUT                                                                                  \
                 : "l"(da), "l"(db), "r"(scale_d))
template <int N, bool MN>
__device__ __forceinline__ void fa90_wgmma_ss(float (&d)[N / 2], u64 da, u64 db, int scale_d) {
    static_assert(N == 64 || N == 128, "wgmma widths 64 and 128");
    if constexpr (N == 64 && !MN) {
        FA90_WGMMA_SS(64, FA90_ACC32, FA90_OUT32, 32, 33, 34, "0, 0");
    } else if constexpr (N == 64) {
        FA90_WGMMA_SS(64, FA90_ACC32, FA90_OUT32, 32, 33, 34, "1, 1");
    } else if constexpr (!MN) {
        FA90_WGMMA_SS(128, FA90_ACC64, FA90_OUT64, 64, 65, 66, "0, 0");
    } else {
        FA90_WGMMA_SS(128, FA90_ACC64, FA90_OUT64, 64, 65, 66, "1, 1");
    }
}
#undef FA90_WGMMA_SS

// d += A B (or d = A B with scale_d 0), wgmma.m64nNk16, A from registers (the io type, mma.sync's
// A fragment layout per warp), B in shared memory N-major (TRANS "1", always accumulating: SCALE
// "r"(1)) or K-major (TRANS "0", SCALE "r"(scale_d)).
#define FA90_WGMMA_RS(N, ACC, OUT, A0, A1, A2, A3, DB, SD, TRANS, SCALE)                                \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #SD ", 0;\n"                                      \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." FA_MMA_T "." FA_MMA_T " {" ACC       \
                 "}, {%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #DB ", p, 1, 1, " TRANS ";\n}\n"      \
                 : OUT                                                                                  \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), SCALE)
// d += A B with B N-major.
template <int N>
__device__ __forceinline__ void fa90_wgmma_rs(float (&d)[N / 2], const u32 (&a)[4], u64 db) {
    static_assert(N == 64 || N == 128, "wgmma widths 64 and 128");
    if constexpr (N == 64) {
        FA90_WGMMA_RS(64, FA90_ACC32, FA90_OUT32, 32, 33, 34, 35, 36, 37, "1", "r"(1));
    } else {
        FA90_WGMMA_RS(128, FA90_ACC64, FA90_OUT64, 64, 65, 66, 67, 68, 69, "1", "r"(1));
    }
}
// d (+)= A B with B K-major; scale_d 0 overwrites d.
template <int N>
__device__ __forceinline__ void fa90_wgmma_rs_k(float (&d)[N / 2], const u32 (&a)[4], u64 db, int scale_d) {
    static_assert(N == 64 || N == 128, "wgmma widths 64 and 128");
    if constexpr (N == 64) {
        FA90_WGMMA_RS(64, FA90_ACC32, FA90_OUT32, 32, 33, 34, 35, 36, 37, "0", "r"(scale_d));
    } else {
        FA90_WGMMA_RS(128, FA90_ACC64, FA90_OUT64, 64, 65, 66, 67, 68, 69, "0", "r"(scale_d));
    }
}
#undef FA90_WGMMA_RS

// One 4-d TMA tile copy (channel, row, head, batch) into shared memory, completing on `bar`.
__device__ __forceinline__ void fa90_tma(unsigned dst, const TmaMap* map, unsigned bar, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];"
        :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar) : "memory");
}

// Work item `l` of a list of `nt` tiles x `nh` heads x batch (`nhb` heads and batches): its
// tile's rank (0: the tile with the most work), head and batch. With a causal mask the tiles'
// work differs (it grows with a q tile's index, and shrinks with a K/V tile's), so the items are
// the tiles of FA_HEADS_GROUP heads at a time (one to four) heaviest first: blocks starting in
// the order of their linear index (or persistent blocks taking the items in order) end with the
// lightest, and the heads in flight, whose tiles share K/V or Q/dO through L2, stay few
// (measured on the H100: causal forward +4%, causal backward +6%; `heads_group` in hopper.rs).
// Otherwise tile-major order.
__device__ __forceinline__ void fa90_work_at(i64 l, i64 nt, i64 nh, i64 nhb, i64& rank, i64& h, i64& bi) {
#if FA_CAUSAL
    const i64 g = l / (FA_HEADS_GROUP * nt), r = l - g * FA_HEADS_GROUP * nt, gs = fa_min(FA_HEADS_GROUP, nhb - g * FA_HEADS_GROUP);
    const i64 hb = g * FA_HEADS_GROUP + r % gs;
    rank = r / gs;
#else
    const i64 hb = l / nt;
    rank = l - hb * nt;
    (void)nhb;
#endif
    h = hb % nh;
    bi = hb / nh;
}

// This CTA's work item of a (tiles, heads, batch) grid, as `fa90_work_at` orders them.
__device__ __forceinline__ void fa90_work(i64& rank, i64& h, i64& bi) {
#if FA_CAUSAL
    const i64 nt = gridDim.x, nh = gridDim.y;
    fa90_work_at((i64)blockIdx.x + nt * ((i64)blockIdx.y + nh * (i64)blockIdx.z), nt, nh, nh * (i64)gridDim.z, rank, h, bi);
#else
    rank = blockIdx.x;
    h = blockIdx.y;
    bi = blockIdx.z;
#endif
}

// The K/V tiles [t0, t1) of BN keys that some row of the q tile [q0, q0 + BM) sees (empty,
// with any false, when none does).
__device__ __forceinline__ bool fa90_key_tiles(i64 q0, i64 bm, i64 bn, i64 lq, i64 lkv, i64 off, int& t0, int& t1) {
    i64 jlo, jhi;
    fa_key_range(q0, fa_min(q0 + bm, lq) - 1, lkv, off, jlo, jhi);
    const bool any = q0 < lq && jlo < jhi;
    t0 = any ? (int)(jlo / bn) : 0;
    t1 = any ? (int)((jhi + bn - 1) / bn) : 0;
    return any;
}

// Row hh (0: g, 1: g + 8) of a thread's 64 x W f32 accumulators, times `scale`, through
// `store(offset, a, b)` of two adjacent columns: column c sits at base + c * cs. Only the first
// WR columns (the head dim, a multiple of 8) are stored.
template <int W, int WR, typename F>
__device__ __forceinline__ void fa90_store_row(F store, i64 base, i64 cs, const float (&acc)[W / 2], int hh, int tg, float scale) {
    #pragma unroll
    for (int n = 0; n < WR / 8; ++n) store(base + (i64)(n * 8 + tg * 2) * cs, acc[4 * n + 2 * hh] * scale, acc[4 * n + 2 * hh + 1] * scale);
}

// f32 accumulators of a 64 x N wgmma (thread: rows g, g + 8 of its warp's 16; columns
// 8n + 2t, +1 in acc[4n..4n+3]) as the A fragments of a k = N product, in the io type: k step
// kt (columns 16kt..16kt+15) is accumulators 8kt..8kt+7, already in the A layout.
template <int N>
__device__ __forceinline__ void fa90_pack(u32 (&a)[N / 16][4], const float (&acc)[N / 2]) {
    #pragma unroll
    for (int kt = 0; kt < N / 16; ++kt) {
        a[kt][0] = fa_pack(acc[8 * kt], acc[8 * kt + 1]);
        a[kt][1] = fa_pack(acc[8 * kt + 2], acc[8 * kt + 3]);
        a[kt][2] = fa_pack(acc[8 * kt + 4], acc[8 * kt + 5]);
        a[kt][3] = fa_pack(acc[8 * kt + 6], acc[8 * kt + 7]);
    }
}
