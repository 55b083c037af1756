// The Hopper forward kernel (FlashAttention-3's recipe on wgmma, TMA and warp specialization;
// attention/fwd90.rs): a producer warpgroup loading Q and the K/V tiles by TMA, two consumer
// warpgroups of 64 query rows each; persistent: one CTA per SM over the list of (q tile, head,
// batch) items, by index or (FA_DYNAMIC) by ticket, with the split tail (FA_SPLIT).
//
// Reads common.cuh's and sm90.cuh's defines and:
//   FA_BM, FA_BN, FA_KVS, FA_QBUFS        query rows per CTA, keys per K/V tile (128, or 64
//                                         for head dims above 128), K/V stages, Q buffers (two,
//                                         or one where shared memory holds no more)
//   FA_WHOLE_TILES                        no mask and no partial q or K/V tile
//   FA_PINGPONG, FA_QREG                  consumers taking turns; Q fragments in registers
//   FA_QT, FA_DYNAMIC, FA_NFULL, FA_NU    the work list
//   FA_SPLIT, FA_T, FA_TAILW, FA_G        its split tail
//   O_S0..3, O_PAIR, ST_O                 o's strides and store
//   FA_HAS_STATS, ST_STATS, ST_S0..2      the log-sum-exp stats output

FA_DEFINE_STORE(o, O_PAIR, ST_O, O_S3)

// The max (MAX) or sum of row hh (0: g, 1: g + 8) of a thread's score accumulators (columns
// 8n + 2t, +1 at 4n + 2hh, +1), pairwise.
template <bool MAX>
__device__ __forceinline__ float fa90_row_tree(const float (&sc)[FA_BN / 2], int hh) {
    float a[FA_BN / 8];
    #pragma unroll
    for (int n = 0; n < FA_BN / 8; ++n) a[n] = MAX ? fmaxf(sc[4 * n + 2 * hh], sc[4 * n + 2 * hh + 1]) : sc[4 * n + 2 * hh] + sc[4 * n + 2 * hh + 1];
    static_assert(FA_BN == 128 || FA_BN == 64, "four or three levels below the pairs");
#define FA_TREE_LEVEL(W) _Pragma("unroll") for (int i = 0; i < (W); ++i) a[i] = MAX ? fmaxf(a[i], a[i + (W)]) : a[i] + a[i + (W)];
#if FA_BN == 128
    FA_TREE_LEVEL(8)
#endif
    FA_TREE_LEVEL(4)
    FA_TREE_LEVEL(2)
    FA_TREE_LEVEL(1)
#undef FA_TREE_LEVEL
    return a[0];
}

// Scores of one K/V tile (keys j0..j0+BN-1) for this thread's rows r0 and r0 + 8: to log2
// units, masked, bias and ALiBi added; the running max and sum updated (alpha: the factor O
// must be rescaled by); sc left holding P (dropout applied).
__device__ __forceinline__ void fa90_softmax(const FaIn& A, float (&sc)[FA_BN / 2], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                             i64 r0, i64 wq0, i64 j0, i64 lq, i64 lkv, i64 off, i64 bi, i64 h, int tg) {
#if FA_WHOLE_TILES
    // No mask, and no partial q or K/V tile: known here, where the split tail leaves the
    // compiler no bound on j0 (with the check, the d = 64 loop ran 7% more
    // instructions).
    const bool need = false;
    (void)wq0; (void)j0; (void)lq; (void)lkv; (void)off;
#else
    const bool need = fa_tile_needs_mask(wq0, 64, j0, FA_BN, lq, lkv, off);
#endif
    // Blocks with nothing to mask or add keep the raw scores: the row max is taken on them
    // (the scale is positive) and the scale goes into the exponent's fused multiply-add, one
    // multiply an element fewer. The scale's sign is compiled in: tested at run time, both
    // paths stayed in the loop and the d = 64 forward ran 6-7% slower (H200). (The scale itself
    // is FA_SOFTMAX_SCALE: see common.cuh.)
    const bool raw = !(need || FA_HAS_BIAS || FA_ALIBI) && FA_SCALE_POS;
    if (need || FA_HAS_BIAS || FA_ALIBI) {
        #pragma unroll
        for (int n = 0; n < FA_BN / 8; ++n) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                const i64 i = r0 + (e >> 1) * 8;
                const i64 j = j0 + n * 8 + tg * 2 + (e & 1);
                float x = sc[4 * n + e] * FA_SOFTMAX_SCALE;
                if (need && !fa_visible(i, j, lq, lkv, off)) x = FA_NINF;
#if FA_HAS_BIAS || FA_ALIBI
                else x = fmaf(fa_add(A, bi, h, i, j), FA_LOG2E, x);
#endif
                sc[4 * n + e] = x;
            }
        }
    } else if (!raw) {
        #pragma unroll
        for (int n = 0; n < FA_BN / 2; ++n) sc[n] *= FA_SOFTMAX_SCALE;
    }
    // Row maxima and sums as trees (depth 5 over a row's 32 elements instead of a chain of 32:
    // the softmax sits on each warpgroup's critical path).
    float mx[2] = {fa90_row_tree<true>(sc, 0), fa90_row_tree<true>(sc, 1)};
    if (!raw) {
        mx[0] = fmaxf(mx[0], m[0]);
        mx[1] = fmaxf(mx[1], m[1]);
    }
    float mu[2];
    const float sm = raw ? FA_SOFTMAX_SCALE : 1.0f;
    #pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 1));
        mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 2));
        if (raw) mx[hh] = fmaxf(m[hh], mx[hh] * FA_SOFTMAX_SCALE);
        // A row with every key masked so far keeps max -inf: exponentiate against 0.
        mu[hh] = mx[hh] == FA_NINF ? 0.0f : mx[hh];
        alpha[hh] = fa_exp2(m[hh] - mu[hh]);
        m[hh] = mx[hh];
        l[hh] *= alpha[hh];
    }
    #pragma unroll
    for (int x = 0; x < FA_BN / 2; ++x) sc[x] = fa_exp2(fmaf(sc[x], sm, -mu[(x >> 1) & 1]));
    l[0] += fa90_row_tree<false>(sc, 0);
    l[1] += fa90_row_tree<false>(sc, 1);
#if FA_DROPOUT
    // Dropped elements leave the sum (taken before dropout) but not the output.
    #pragma unroll
    for (int n = 0; n < FA_BN / 8; ++n) {
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
            if (sc[4 * n + e] != 0.0f && !fa_keep(A, bi, h, r0 + (e >> 1) * 8, j0 + n * 8 + tg * 2 + (e & 1))) sc[4 * n + e] = 0.0f;
        }
    }
#endif
    (void)A; (void)bi; (void)h;
}

// O *= alpha (the rows' factors after a tile's softmax). Always: skipping it where no row of the
// warp has a new max (a vote, one branch per warp) was 2-6% slower on the H100.
__device__ __forceinline__ void fa90_rescale(float (&o)[FA_DV / 2], const float (&alpha)[2]) {
    #pragma unroll
    for (int n = 0; n < FA_DV / 8; ++n) {
        o[4 * n] *= alpha[0]; o[4 * n + 1] *= alpha[0];
        o[4 * n + 2] *= alpha[1]; o[4 * n + 3] *= alpha[1];
    }
}

// S = Q K^T for this warpgroup's 64 rows: Q rows at sq (d-chunks of 64 are 128 * 128 bytes
// apart), K tile at sk (chunks BN * 128 bytes apart); 16 channels (32 bytes) per k step.
__device__ __forceinline__ void fa90_scores(float (&sc)[FA_BN / 2], unsigned sq, unsigned sk) {
    #pragma unroll
    for (int kk = 0; kk < FA_DK / 16; ++kk) {
        fa90_wgmma_ss<FA_BN, false>(sc, make_desc(sq + (kk >> 2) * (FA_BM * 128u) + (kk & 3) * 32u, 16u, 1024u),
                                    make_desc(sk + (kk >> 2) * (FA_BN * 128u) + (kk & 3) * 32u, 16u, 1024u), kk > 0 ? 1 : 0);
    }
}

#if FA_QREG
// This warpgroup's Q rows (at sq, as fa90_scores reads them) as wgmma A fragments, one set of
// four registers per k step of 16 channels: ldmatrix.x4, lane L giving row 16w + L % 8 +
// 8 ((L / 8) % 2) at channel 8 (L / 16) of the step (16-byte units swizzled by the row).
__device__ __forceinline__ void fa90_q_frags(u32 (&qf)[FA_DK / 16][4], unsigned sq, int w, int lane) {
    const int mi = lane >> 3, row = w * 16 + (lane & 7) + 8 * (mi & 1);
    #pragma unroll
    for (int kk = 0; kk < FA_DK / 16; ++kk) {
        const unsigned unit = (unsigned)(((kk & 3) * 2 + (mi >> 1)) ^ (row & 7));
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(qf[kk][0]), "=r"(qf[kk][1]), "=r"(qf[kk][2]), "=r"(qf[kk][3])
                     : "r"(sq + (kk >> 2) * (FA_BM * 128u) + row * 128u + unit * 16u));
    }
}

// S = Q K^T with Q from registers (`fa90_q_frags`).
__device__ __forceinline__ void fa90_scores_r(float (&sc)[FA_BN / 2], const u32 (&qf)[FA_DK / 16][4], unsigned sk) {
    #pragma unroll
    for (int kk = 0; kk < FA_DK / 16; ++kk) fa90_wgmma_rs_k<FA_BN>(sc, qf[kk], make_desc(sk + (kk >> 2) * (FA_BN * 128u) + (kk & 3) * 32u, 16u, 1024u), kk > 0 ? 1 : 0);
}
#define FA_SCORES(sc, sk) fa90_scores_r(sc, qf, sk)
#else
#define FA_SCORES(sc, sk) fa90_scores(sc, sq, sk)
#endif

// O += P V: V tile at sv, N-major (rows of 64 channels, 128 bytes; 64-channel chunks BN * 128
// bytes apart); 16 keys (2048 bytes) per k step; in products of up to 128 columns (two chunks)
// of O, whose accumulators are consecutive (a thread's columns 8n + 2t, +1 at 4n..4n+3).
template <int N>
__device__ __forceinline__ void fa90_pv_part(float* o, const u32 (&pf)[FA_BN / 16][4], unsigned sv) {
    float (&acc)[N / 2] = *reinterpret_cast<float (*)[N / 2]>(o);
    #pragma unroll
    for (int kt = 0; kt < FA_BN / 16; ++kt) fa90_wgmma_rs<N>(acc, pf[kt], make_desc(sv + kt * 2048u, FA_BN * 128u, 1024u));
}
__device__ __forceinline__ void fa90_pv(float (&o)[FA_DV / 2], const u32 (&pf)[FA_BN / 16][4], unsigned sv) {
    #pragma unroll
    for (int c = 0; c < FA_DV / 128; ++c) fa90_pv_part<128>(o + 64 * c, pf, sv + c * 2 * (FA_BN * 128u));
    if constexpr (FA_DV % 128 != 0) fa90_pv_part<64>(o + 64 * (FA_DV / 128), pf, sv + (FA_DV / 128) * 2 * (FA_BN * 128u));
}

#if FA_SPLIT
// The split tail (FA_SPLIT): the items past the whole rounds, FA_NFULL..,
// of FA_T K/V tiles each, FA_TAILW tiles in all, cut into FA_G contiguous ranges, CTA c taking
// tiles [lo(c), lo(c + 1)) of that list. A range is shorter than an item, so it holds at most
// two segments (the end of one item, the start of the next): units FA_NFULL + c and
// FA_NFULL + FA_G + c.
__device__ __forceinline__ i64 fa90_tail_lo(i64 c) { return c * FA_TAILW / FA_G; }
// The CTA whose range holds tile x of the list (the last c with lo(c) <= x).
__device__ __forceinline__ i64 fa90_tail_owner(i64 x) { return ((x + 1) * FA_G - 1) / FA_TAILW; }
// Unit u's tiles [x0, x1) of the list (empty when x0 >= x1).
__device__ __forceinline__ void fa90_tail_unit(i64 u, i64& x0, i64& x1) {
    const i64 lo = fa90_tail_lo(blockIdx.x), hi = fa90_tail_lo(blockIdx.x + 1), e = (lo / FA_T + 1) * FA_T;
    const bool first = u - FA_NFULL < FA_G;
    x0 = first ? lo : e;
    x1 = first ? fa_min(hi, e) : hi;
}

// A segment of split item ti done: consumer thread t's (0..255) unnormalized O, row maxima and
// sums into the unit's slot of `part` (float j of thread t at j * 256 + t); the CTA whose
// segment completes the item's count (`cnt`, zeroed by a launch before) then reads every
// segment, in the order of their CTAs (so the result does not depend on which came last),
// and leaves the item's O, maxima and sums in o, m and l for the store. Returns whether this
// CTA is that one. The flag at `flag` (shared) carries the count's answer to every consumer.
__device__ __forceinline__ bool fa90_tail_part(float* part, unsigned* cnt, unsigned flag, i64 u, i64 ti, float (&o)[FA_DV / 2], float (&m)[2], float (&l)[2], int t) {
    constexpr int NV = FA_DV / 2 + 4;
    const i64 x0 = ti * FA_T, ca = fa90_tail_owner(x0), cb = fa90_tail_owner(x0 + FA_T - 1);
    // Slot 2c + 1 when CTA c's range starts before the item (the item is its second segment).
    auto slot = [&](i64 c) { return part + (2 * c + (fa90_tail_lo(c) < x0 ? 1 : 0)) * (NV * 256) + t; };
    float* mine = part + (2 * (i64)blockIdx.x + (u - FA_NFULL >= FA_G ? 1 : 0)) * (NV * 256) + t;
    #pragma unroll
    for (int x = 0; x < FA_DV / 2; ++x) mine[x * 256] = o[x];
    mine[(FA_DV / 2) * 256] = m[0];
    mine[(FA_DV / 2 + 1) * 256] = m[1];
    mine[(FA_DV / 2 + 2) * 256] = l[0];
    mine[(FA_DV / 2 + 3) * 256] = l[1];
    // The consumers' stores ordered (by the barrier, then one thread's device-scope fence,
    // which is cumulative) before that thread counts the segment; on the other side, the count
    // read before a fence, and the barrier, before any consumer reads the other segments.
    asm volatile("bar.sync 3, 256;" ::: "memory");
    if (t == 0) {
        unsigned segs = 0;
        for (i64 c = ca; c <= cb; ++c) segs += fa90_tail_lo(c) < fa90_tail_lo(c + 1) ? 1u : 0u;
        __threadfence();
        const unsigned last = atomicAdd(cnt + ti, 1u) == segs - 1u ? 1u : 0u;
        __threadfence();
        asm volatile("st.shared.u32 [%0], %1;" :: "r"(flag), "r"(last) : "memory");
    }
    asm volatile("bar.sync 3, 256;" ::: "memory");
    unsigned last;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(last) : "r"(flag) : "memory");
    if (!last) return false;
    // Reads through L2 (__ldcg): the other segments were written by other SMs.
    float mx[2] = {FA_NINF, FA_NINF};
    for (i64 c = ca; c <= cb; ++c) {
        if (fa90_tail_lo(c) >= fa90_tail_lo(c + 1)) continue;
        const float* p = slot(c);
        mx[0] = fmaxf(mx[0], __ldcg(p + (FA_DV / 2) * 256));
        mx[1] = fmaxf(mx[1], __ldcg(p + (FA_DV / 2 + 1) * 256));
    }
    #pragma unroll
    for (int x = 0; x < FA_DV / 2; ++x) o[x] = 0.0f;
    l[0] = 0.0f;
    l[1] = 0.0f;
    for (i64 c = ca; c <= cb; ++c) {
        if (fa90_tail_lo(c) >= fa90_tail_lo(c + 1)) continue;
        const float* p = slot(c);
        // A row with every key of the segment masked (max -inf) adds nothing.
        float f[2];
        #pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const float ms = __ldcg(p + (FA_DV / 2 + hh) * 256);
            f[hh] = ms == FA_NINF ? 0.0f : fa_exp2(ms - mx[hh]);
            l[hh] = fmaf(__ldcg(p + (FA_DV / 2 + 2 + hh) * 256), f[hh], l[hh]);
        }
        #pragma unroll
        for (int x = 0; x < FA_DV / 2; ++x) o[x] = fmaf(__ldcg(p + x * 256), f[(x >> 1) & 1], o[x]);
    }
    m[0] = mx[0];
    m[1] = mx[1];
    return true;
}
#endif

// Ping-pong between the two consumer warpgroups (FA_PINGPONG): warpgroup cw issues its matrix
// products only in its turn (named barrier 1 + cw) and then hands the turn to the other
// (barrier 2 - cw), so one's softmax runs while the other's products occupy the tensor cores.
__device__ __forceinline__ void fa90_turn_begin(int cw) {
#if FA_PINGPONG
    asm volatile("bar.sync %0, 256;" :: "r"(1 + cw) : "memory");
#else
    (void)cw;
#endif
}
__device__ __forceinline__ void fa90_turn_end(int cw, bool pass) {
#if FA_PINGPONG
    if (pass) asm volatile("bar.arrive %0, 256;" :: "r"(2 - cw) : "memory");
#else
    (void)cw; (void)pass;
#endif
}

// The kernel, persistent: one CTA per SM takes the work items `blockIdx.x`, `+ gridDim.x`, ...
// of the (q tile, head, batch) list (heaviest first: `fa90_work_at`), or (FA_DYNAMIC) its first
// item by its index and then the next item of the list by ticket (an atomic counter: `gridDim.x`
// plus the ticket), which the producer writes beside the item's Q buffer for the consumers (a
// number past the list ends both); Q has two buffers (FA_QBUFS; one for head dims above 128,
// where shared memory holds no more), so the producer loads the next tile's Q and first K/V
// tiles while the consumers still finish the current tile and store its O, and the K/V ring
// runs on across tiles (measured on the H100 against one CTA per item:
// b16h16s1024d64 +10-12%, b4h16s4096d128 +1.5% and the causal rows +1-4%).
extern "C" __global__ void __launch_bounds__(384, 1) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    extern __shared__ unsigned char fa_smem_raw[];
    const unsigned base = (smem_u32(fa_smem_raw) + 1023u) & ~1023u;
    constexpr unsigned Q_BYTES = FA_BM * FA_D * 2, K_BYTES = FA_BN * FA_D * 2, V_BYTES = FA_BN * FA_DV * 2;
    const unsigned sQ = base, sK = sQ + FA_QBUFS * Q_BYTES, sV = sK + FA_KVS * K_BYTES, bars = sV + FA_KVS * V_BYTES;
    // Barriers: K full, V full, K empty, V empty (FA_KVS stages each), Q full, Q empty (two).
#define KFULL(s) (bars + 8u * (s))
#define VFULL(s) (bars + 8u * FA_KVS + 8u * (s))
#define KEMPTY(s) (bars + 16u * FA_KVS + 8u * (s))
#define VEMPTY(s) (bars + 24u * FA_KVS + 8u * (s))
#define QFULL(s) (bars + 32u * FA_KVS + 8u * (s))
#define QEMPTY(s) (bars + 32u * FA_KVS + 16u + 8u * (s))
    // The unit numbers of the two Q buffers (FA_DYNAMIC), and whether this CTA combines a split
    // item (FA_SPLIT).
    const unsigned ITEMS = bars + 32u * FA_KVS + 32u, FLAG = ITEMS + 16u;
    (void)FLAG;
    FA_INIT
    const int wg = threadIdx.x >> 7;
    // The work list: FA_QT q tiles x FA_HQ heads x FA_B batches.
    // Item l's q tile, head, batch, key range and K/V tiles.
    struct Item { i64 q0, h, bi, lq, lkv, off; int t0, t1; bool any; };
    auto item = [&](i64 l) {
        Item it;
        i64 rank;
        fa90_work_at(l, FA_QT, FA_HQ, (i64)FA_HQ * FA_B, rank, it.h, it.bi);
        it.q0 = (FA_QT - 1 - rank) * FA_BM;
        fa_lens(A, it.bi, it.lq, it.lkv);
        it.off = fa_diag_off(it.lq, it.lkv);
        it.any = fa90_key_tiles(it.q0, FA_BM, FA_BN, it.lq, it.lkv, it.off, it.t0, it.t1);
        return it;
    };
    // Unit u: item u with all its K/V tiles [ta, tb), or (FA_SPLIT, u >= FA_NFULL) this CTA's
    // segment of tail item ti: `part` when the item has others, `none` when the segment is empty.
    struct Unit { Item it; int ta, tb; i64 ti; bool part, none; };
    auto unit = [&](i64 u) {
        Unit w;
#if FA_SPLIT
        if (u >= FA_NFULL) {
            i64 x0, x1;
            fa90_tail_unit(u, x0, x1);
            w.none = x0 >= x1;
            w.ti = w.none ? 0 : x0 / FA_T;
            w.it = item(FA_NFULL + w.ti);
            w.ta = w.it.t0 + (int)(x0 - w.ti * FA_T);
            w.tb = w.none ? w.ta : w.ta + (int)(x1 - x0);
            w.part = x1 - x0 < FA_T;
            return w;
        }
#endif
        w.it = item(u);
        w.ta = w.it.t0;
        w.tb = w.it.t1;
        w.ti = 0;
        w.part = false;
        w.none = false;
        return w;
    };
    if (threadIdx.x == 0) {
        for (int s = 0; s < FA_KVS; ++s) {
            mbar_init(KFULL(s), 1u);
            mbar_init(VFULL(s), 1u);
            mbar_init(KEMPTY(s), 256u);
            mbar_init(VEMPTY(s), 256u);
        }
        for (int s = 0; s < 2; ++s) {
            mbar_init(QFULL(s), 1u);
            mbar_init(QEMPTY(s), 256u);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (wg == 0) {
        // Producer: per unit (an item, or a segment of one), Q into buffer n % 2 (n: the CTA's
        // unit count), then K and V of each of its tiles into stage c % FA_KVS (c: the CTA's K/V
        // tile count). The consumers' setmaxnreg.inc takes only what the producer gives back
        // from the CTA's launch allocation (168 x 384 = 128 x 24 + 256 x 240): asking for more
        // never returns.
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
        if (threadIdx.x == 0) {
            asm volatile("prefetch.tensormap [%0];" :: "l"(&tq) : "memory");
            asm volatile("prefetch.tensormap [%0];" :: "l"(&tk) : "memory");
            asm volatile("prefetch.tensormap [%0];" :: "l"(&tv) : "memory");
            int n = 0, c = 0;
            // (The fixed assignment keeps the loop's form `u < FA_NU; u += gridDim.x`: as an
            // endless loop with a break, ptxas moved the loop's addresses off the uniform datapath
            // and the d64 forward ran 4.5% slower on the H100.)
#if FA_DYNAMIC
            i64 u = -1;
            for (;; ++n) {
                const int qs = (int)((unsigned)n % FA_QBUFS);
                mbar_wait(QEMPTY(qs), (((unsigned)n / FA_QBUFS) & 1u) ^ 1u);
                // The CTA's first item by its index, the next ones by ticket (then, FA_SPLIT, its
                // tail segments that are not empty); the consumers read the unit's number beside
                // Q's buffer, and a number past the units ends them.
                const bool whole = u < FA_NFULL;
                u = n == 0 ? (i64)blockIdx.x : whole ? (i64)gridDim.x + (i64)atomicAdd(fa_ticket, 1u) : u + gridDim.x;
#if FA_SPLIT
                if (u >= FA_NFULL) {
                    if (whole) u = FA_NFULL + blockIdx.x;
                    while (u < FA_NU && unit(u).none) u += gridDim.x;
                }
#endif
                *(volatile i64*)(fa_smem_raw + (ITEMS + 8u * qs - smem_u32(fa_smem_raw))) = u;
                if (u >= FA_NU) {
                    mbar_arrive(QFULL(qs));
                    break;
                }
#else
            for (i64 u = blockIdx.x; u < FA_NU; u += gridDim.x, ++n) {
                const int qs = (int)((unsigned)n % FA_QBUFS);
#endif
                const Unit un = unit(u);
#if FA_SPLIT && !FA_DYNAMIC
                if (un.none) {
                    --n;
                    continue;
                }
#endif
#if !FA_DYNAMIC
                mbar_wait(QEMPTY(qs), (((unsigned)n / FA_QBUFS) & 1u) ^ 1u);
#endif
                const Item& it = un.it;
                mbar_expect_tx(QFULL(qs), Q_BYTES);
                #pragma unroll
                for (int ch = 0; ch < FA_D / 64; ++ch) fa90_tma(sQ + qs * Q_BYTES + ch * (FA_BM * 128u), &tq, QFULL(qs), ch * 64, (int)it.q0, (int)it.h, (int)it.bi);
                const int kh = (int)(it.h / FA_GROUP);
                for (int t = un.ta; t < un.tb; ++t, ++c) {
                    const int s = c % FA_KVS;
                    const unsigned ph = ((unsigned)c / FA_KVS) & 1u;
                    mbar_wait(KEMPTY(s), ph ^ 1u);
                    mbar_expect_tx(KFULL(s), K_BYTES);
                    #pragma unroll
                    for (int ch = 0; ch < FA_D / 64; ++ch) fa90_tma(sK + s * K_BYTES + ch * (FA_BN * 128u), &tk, KFULL(s), ch * 64, t * FA_BN, kh, (int)it.bi);
                    mbar_wait(VEMPTY(s), ph ^ 1u);
                    mbar_expect_tx(VFULL(s), V_BYTES);
                    #pragma unroll
                    for (int ch = 0; ch < FA_DV / 64; ++ch) fa90_tma(sV + s * V_BYTES + ch * (FA_BN * 128u), &tv, VFULL(s), ch * 64, t * FA_BN, kh, (int)it.bi);
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
        const int cw = wg - 1, tid = threadIdx.x & 127, w = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
        float sc[FA_BN / 2];
        u32 pf[FA_BN / 16][4];
        float alpha[2];
#if FA_QREG
        u32 qf[FA_DK / 16][4];
#endif
        // Turns, started afresh for each item with keys: one per tile (its scores with the
        // previous tile's P V) and one for the last P V; warpgroup 0 goes first, and warpgroup 1
        // does not pass its last turn on (no turn of warpgroup 0 follows it).
        int n = 0, c = 0;
#if FA_DYNAMIC
        for (;; ++n) {
            mbar_wait(QFULL((unsigned)n % FA_QBUFS), ((unsigned)n / FA_QBUFS) & 1u);
            const i64 u = *(volatile i64*)(fa_smem_raw + (ITEMS + 8u * ((unsigned)n % FA_QBUFS) - smem_u32(fa_smem_raw)));
            if (u >= FA_NU) break;
#else
        for (i64 u = blockIdx.x; u < FA_NU; u += gridDim.x, ++n) {
#endif
            const Unit un = unit(u);
#if FA_SPLIT && !FA_DYNAMIC
            if (un.none) {
                --n;
                continue;
            }
#endif
            const Item& it = un.it;
            const i64 q0 = it.q0, h = it.h, bi = it.bi, lq = it.lq, lkv = it.lkv, off = it.off;
            const int t0 = un.ta, t1 = un.tb;
            const i64 wq0 = q0 + cw * 64;
            const i64 r0 = wq0 + w * 16 + g;
            const int qs = (int)((unsigned)n % FA_QBUFS);
            const unsigned sq = sQ + qs * Q_BYTES + cw * 8192u;
            float m[2] = {FA_NINF, FA_NINF};
            float l2[2] = {0.0f, 0.0f};
            float o[FA_DV / 2];
            #pragma unroll
            for (int i = 0; i < FA_DV / 2; ++i) o[i] = 0.0f;
#if !FA_DYNAMIC
            mbar_wait(QFULL(qs), ((unsigned)n / FA_QBUFS) & 1u);
#endif
#if FA_QREG
            fa90_q_frags(qf, sq, w, lane);
#endif
            if (it.any) {
#if FA_PINGPONG
                if (cw == 1) asm volatile("bar.arrive 1, 256;" ::: "memory");
#endif
                // Tile t0: scores, softmax, P.
                {
                    const int s = c % FA_KVS;
                    mbar_wait(KFULL(s), ((unsigned)c / FA_KVS) & 1u);
                    fa90_turn_begin(cw);
                    wgmma_fence();
                    FA_SCORES(sc, sK + s * K_BYTES);
                    wgmma_commit();
                    fa90_turn_end(cw, true);
                    wgmma_wait0();
                    mbar_arrive(KEMPTY(s));
                    fa90_softmax(A, sc, m, l2, alpha, r0, wq0, (i64)t0 * FA_BN, lq, lkv, off, bi, h, tg);
                    fa90_pack<FA_BN>(pf, sc);
                }
                for (int t = t0 + 1; t < t1; ++t) {
                    const int cc = c + (t - t0), s = cc % FA_KVS, ps = (cc - 1) % FA_KVS;
                    const unsigned ph = ((unsigned)cc / FA_KVS) & 1u, pph = ((unsigned)(cc - 1) / FA_KVS) & 1u;
                    // Issue tile t's scores and tile t-1's P V together.
                    mbar_wait(KFULL(s), ph);
                    mbar_wait(VFULL(ps), pph);
                    fa90_turn_begin(cw);
                    wgmma_fence();
                    FA_SCORES(sc, sK + s * K_BYTES);
                    wgmma_commit();
                    fa90_pv(o, pf, sV + ps * V_BYTES);
                    wgmma_commit();
                    fa90_turn_end(cw, true);
                    // Scores done (the P V may still run): free K, softmax while P V runs.
                    wgmma_wait1();
                    mbar_arrive(KEMPTY(s));
                    fa90_softmax(A, sc, m, l2, alpha, r0, wq0, (i64)t * FA_BN, lq, lkv, off, bi, h, tg);
                    wgmma_wait0();
                    mbar_arrive(VEMPTY(ps));
                    fa90_rescale(o, alpha);
                    fa90_pack<FA_BN>(pf, sc);
                }
                {
                    const int cc = c + (t1 - 1 - t0), s = cc % FA_KVS;
                    mbar_wait(VFULL(s), ((unsigned)cc / FA_KVS) & 1u);
                    fa90_turn_begin(cw);
                    wgmma_fence();
                    fa90_pv(o, pf, sV + s * V_BYTES);
                    wgmma_commit();
                    fa90_turn_end(cw, cw == 0);
                    wgmma_wait0();
                    mbar_arrive(VEMPTY(s));
                }
                c += t1 - t0;
            }
            // Q is no longer read: its buffer takes item n + FA_QBUFS.
            mbar_arrive(QEMPTY(qs));
#if FA_SPLIT
            // A segment of a split item: stored for the CTA that completes the item.
            if (un.part && !fa90_tail_part(fa_part, fa_ticket + 1, FLAG, u, un.ti, o, m, l2, cw * 128 + tid)) continue;
#endif
            // Normalize and store; empty rows (padded, or every key masked) give o = 0, stats = +inf.
            #pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                float lsum = l2[hh];
                lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
                lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
                const i64 i = r0 + hh * 8;
                const bool empty = i >= lq || m[hh] == FA_NINF || !(lsum > 0.0f);
                const float inv = empty ? 0.0f : A.keep_scale / lsum;
                if (i < FA_SQ) {
                    fa90_store_row<FA_DV, FA_DVR>([&](i64 at, float a, float b) { fa_store_o(o_p, at, a, b); }, bi * O_S0 + h * O_S1 + i * O_S2, O_S3, o, hh, tg, inv);
#if FA_HAS_STATS
                    if (tg == 0) ST_STATS(stats_p, bi * ST_S0 + h * ST_S1 + i * ST_S2, empty ? (double)FA_NINF : (double)(m[hh] * FA_LN2 + logf(lsum)));
#endif
                }
            }
        }
    }
#undef KFULL
#undef VFULL
#undef KEMPTY
#undef VEMPTY
#undef QFULL
#undef QEMPTY
}
