// The Hopper backward's dK/dV kernel (attention/bwd90.rs): a CTA per (128 keys, kv head, batch)
// keeps K and V in shared memory and loops over the query heads of the group and their q tiles of
// 64 rows (Q and dO by TMA, FA_QS stages; lse and D staged by a producer warp); per step and
// consumer warpgroup S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q. With FA_ATOMIC_DQ
// it also adds dQ += dS K into the f32 accumulator at dqa_p (no dQ kernel).
//
// Reads common.cuh's, sm90.cuh's and bwd90.cuh's defines and:
//   FA_BK, FA_BQ, FA_QS, FA_QREV          keys per CTA, query rows per step, stages, q tiles
//                                         walked downward
//   FA_ATOMIC_DQ, FA_SPLIT_DK, FA_NQT     the atomic dQ path
//   LD_STATS, ST_S0..2                    the stats
//   DK_S0..3, DK_PAIR, ST_DK, DV_S0..3, DV_PAIR, ST_DV   dk's and dv's strides and stores

FA_DEFINE_STORE(dk, DK_PAIR, ST_DK, DK_S3)
FA_DEFINE_STORE(dv, DV_PAIR, ST_DV, DV_S3)

// The 64-channel chunk of dQ that consumer cw adds at step it, or -1: at d = 128 chunk
// (it + cw) % 2 for each consumer every step, at d = 64 chunk 0 for consumer it % 2.
__device__ __forceinline__ int fa90_dq_chunk(i64 it, int cw) {
#if FA_D == 128
    return (int)((it + cw) & 1);
#else
    return (int)(it & 1) == cw ? 0 : -1;
#endif
}

// One bulk reduction of a staged 64 x 64 f32 dQ tile (at st) into its 16 KiB block of the
// accumulator (query rows i0.., channels 64c..).
__device__ __forceinline__ void fa90_dq_reduce(void* dqa_p, unsigned st, i64 bi, i64 h, i64 i0, int c) {
    float* blk = reinterpret_cast<float*>(dqa_p) + ((((bi * FA_HQ + h) * FA_NQT) + i0 / 64) * (FA_D / 64) + c) * 4096;
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], 16384;" :: "l"(blk), "r"(st) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Stages a consumer's 64 x 64 f32 dQ tile (its step's query rows, one 64-channel chunk) for the
// reducer warp, which adds it into the tile's 16 KiB block of the accumulator by one bulk
// reduction (full L2 lines: measured on the H100 +7% at b4h16s4096d128 and +13% at
// b16h16s1024d64 over vector reductions from the registers; the reducer warp issuing them, not
// the consumers, +3-4% on every backward row): into the consumer's staging buffer st, once the
// reducer warp has read its previous tile. Row r's float pair p sits at pair p ^ 4 (r % 8) (r % 8
// is g: conflict-free stores), which the dQ pass (bwd90_dq_acc.cuh) undoes.
__device__ __forceinline__ void fa90_dq_stage(const float (&dq)[32], unsigned st, int tid, int cw) {
    const int w = tid >> 5, g = (tid & 31) >> 2, tg = tid & 3;
    // The reducer warp (warp 2) has read the buffer's previous tile.
    asm volatile("bar.sync %0, 160;" :: "r"(6 + cw) : "memory");
    #pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const unsigned r = (unsigned)(w * 16 + g + hh * 8);
        #pragma unroll
        for (int n = 0; n < 8; ++n) {
            const unsigned p = (unsigned)((4 * n + tg) ^ (4 * g));
            asm volatile("st.shared.v2.f32 [%0], {%1, %2};" :: "r"(st + r * 256u + p * 8u), "f"(dq[4 * n + 2 * hh]), "f"(dq[4 * n + 2 * hh + 1]) : "memory");
        }
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    // Staged: the reducer warp adds it.
    asm volatile("bar.arrive %0, 160;" :: "r"(4 + cw) : "memory");
}

extern "C" __global__ void __launch_bounds__(384, 1) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    extern __shared__ unsigned char fa_smem_raw[];
    const unsigned raw = smem_u32(fa_smem_raw);
    const unsigned base = (raw + 1023u) & ~1023u;
    constexpr unsigned K_BYTES = FA_BK * FA_D * 2, V_BYTES = FA_BK * FA_DV * 2, Q_BYTES = FA_BQ * FA_D * 2, O_BYTES = FA_BQ * FA_DV * 2;
    // With FA_ATOMIC_DQ, two buffers of dS^T (keys x queries) for dQ follow dO.
    constexpr unsigned DS_BYTES = FA_BK * FA_BQ * 2;
    // With FA_ATOMIC_DQ, a 64 x 64 f32 dQ staging tile per consumer follows (16 KiB each).
    constexpr unsigned DQT_BYTES = 64 * 64 * 4;
    const unsigned sK = base, sV = sK + K_BYTES, sQ = sV + V_BYTES, sO = sQ + FA_QS * Q_BYTES, sDS = sO + FA_QS * O_BYTES, sDQ = sDS + FA_ATOMIC_DQ * 2 * DS_BYTES, bars = sDQ + FA_ATOMIC_DQ * 2 * DQT_BYTES;
    (void)sDS;
    (void)sDQ;
    // Barriers: K/V; Q+dO full (TMA bytes and the 32 lanes that stage lse and D), empty.
    const unsigned kvbar = bars;
#define QFULL(s) (bars + 8u + 8u * (s))
#define QEMPTY(s) (bars + 8u + 8u * FA_QS + 8u * (s))
    // Step `it`'s q tile: upward from the first tile that sees the K/V tile, or, with FA_QREV
    // (causal masks), downward from the last, so that the CTAs of a head, which start at
    // different tiles, walk the same Q/dO tiles together (through L2) from the start.
#if FA_QREV
#define FA_QTILE(it) (qa + nq - 1 - (it) % nq)
#else
#define FA_QTILE(it) (qa + (it) % nq)
#endif
    float* sL = reinterpret_cast<float*>(fa_smem_raw + (bars + 64u - raw));
    float* sD = sL + FA_QS * FA_BQ;
    FA_INIT
    const float* dbuf = reinterpret_cast<const float*>(dbuf_p);
    const int wg = threadIdx.x >> 7;
    i64 rank, kh, bi;
    fa90_work(rank, kh, bi);
    i64 lq, lkv;
    fa_lens(A, bi, lq, lkv);
    const i64 off = fa_diag_off(lq, lkv);
    const i64 j0 = rank * FA_BK;
    const i64 jmax = fa_min(j0 + FA_BK, lkv) - 1;
    // Query rows [ilo, ihi) that see some key of the tile.
    i64 ilo = 0, ihi = lq;
#if FA_CAUSAL
    ilo = fa_max(ilo, j0 - off);
#endif
#if FA_HAS_SWR
    ilo = fa_max(ilo, j0 - off - FA_SWR);
#endif
#if FA_HAS_SWL
    ihi = fa_min(ihi, jmax - off + FA_SWL + 1);
#endif
    (void)jmax;
    const bool any = j0 < lkv && ilo < ihi;
    const i64 qa = any ? ilo / FA_BQ : 0;
    const i64 nq = any ? (ihi + FA_BQ - 1) / FA_BQ - qa : 0;
    const i64 total = nq * FA_GROUP;
    if (threadIdx.x == 0) {
        mbar_init(kvbar, 1u);
        for (int s = 0; s < FA_QS; ++s) {
            mbar_init(QFULL(s), 33u);
            mbar_init(QEMPTY(s), 256u);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (wg == 0) {
        // The producer keeps 24 registers so that each consumer thread gets 240: with 232, at
        // d = 128 (dK, dV, S, dP and P or dS fragments live at once) ptxas serialized every
        // wgmma (C7512, each one waiting for the one before). Its
        // loops stay rolled (`unroll 1`) to fit.
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        if (warp == 0 && lane == 0 && any) {
            // K and V once; then Q and dO of step `it`: query head kh * GROUP + it / nq, q tile
            // FA_QTILE(it).
            mbar_expect_tx(kvbar, K_BYTES + V_BYTES);
            #pragma unroll
            for (int c = 0; c < FA_D / 64; ++c) fa90_tma(sK + c * (FA_BK * 128u), &tk, kvbar, c * 64, (int)j0, (int)kh, (int)bi);
            #pragma unroll
            for (int c = 0; c < FA_DV / 64; ++c) fa90_tma(sV + c * (FA_BK * 128u), &tv, kvbar, c * 64, (int)j0, (int)kh, (int)bi);
            #pragma unroll 1
            for (i64 it = 0; it < total; ++it) {
                const int s = (int)(it % FA_QS);
                const unsigned ph = (unsigned)(it / FA_QS) & 1u;
                const int h = (int)(kh * FA_GROUP + it / nq), i0 = (int)(FA_QTILE(it) * FA_BQ);
                mbar_wait(QEMPTY(s), ph ^ 1u);
                mbar_expect_tx(QFULL(s), Q_BYTES + O_BYTES);
                #pragma unroll
                for (int c = 0; c < FA_D / 64; ++c) fa90_tma(sQ + s * Q_BYTES + c * (FA_BQ * 128u), &tq, QFULL(s), c * 64, i0, h, (int)bi);
                #pragma unroll
                for (int c = 0; c < FA_DV / 64; ++c) fa90_tma(sO + s * O_BYTES + c * (FA_BQ * 128u), &tdo, QFULL(s), c * 64, i0, h, (int)bi);
            }
        } else if (warp == 1 && any) {
            // lse (log2 units) and D of each step's rows into shared memory.
            #pragma unroll 1
            for (i64 it = 0; it < total; ++it) {
                const int s = (int)(it % FA_QS);
                const unsigned ph = (unsigned)(it / FA_QS) & 1u;
                const i64 h = kh * FA_GROUP + it / nq, i0 = FA_QTILE(it) * FA_BQ;
                mbar_wait(QEMPTY(s), ph ^ 1u);
                for (int r = lane; r < FA_BQ; r += 32) {
                    const i64 i = i0 + r;
                    const bool ok = i < lq;
                    sL[s * FA_BQ + r] = ok ? fa_lse2(LD_STATS(stats_p, bi * ST_S0 + h * ST_S1 + i * ST_S2)) : 0.0f;
                    sD[s * FA_BQ + r] = ok ? dbuf[(bi * FA_HQ + h) * FA_SQ + i] : 0.0f;
                }
                mbar_arrive(QFULL(s));
            }
        }
#if FA_ATOMIC_DQ
        else if (warp == 2 && any) {
            // The dQ reducer: consumer cw's staged tile of each step in which it has one (both
            // every step at d = 128, consumer it % 2 at d = 64) added by one bulk reduction, its
            // buffer handed back once read (named barriers 4 + cw: staged, 6 + cw: free; none
            // after a consumer's last tile, so every barrier ends complete).
            constexpr int EVERY = FA_D == 128 ? 1 : 2;
            for (int cw = 0; cw < 2; ++cw) {
                if (total > (EVERY == 1 ? 0 : cw)) asm volatile("bar.arrive %0, 160;" :: "r"(6 + cw) : "memory");
            }
            #pragma unroll 1
            for (i64 it = 0; it < total; ++it) {
                const i64 h = kh * FA_GROUP + it / nq, i0 = FA_QTILE(it) * FA_BQ;
                for (int cw = 0; cw < 2; ++cw) {
                    const int c = fa90_dq_chunk(it, cw);
                    if (c < 0) continue;
                    asm volatile("bar.sync %0, 160;" :: "r"(4 + cw) : "memory");
                    if (lane == 0) {
                        fa90_dq_reduce(dqa_p, sDQ + cw * DQT_BYTES, bi, h, i0, c);
                        asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
                    }
                    __syncwarp();
                    if (it + EVERY < total) asm volatile("bar.arrive %0, 160;" :: "r"(6 + cw) : "memory");
                }
            }
            if (lane == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
        }
#endif
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
        const int cw = wg - 1, tid = threadIdx.x & 127, w = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
        // This warpgroup's keys jw0 .. jw0 + 63; this thread's jt and jt + 8.
        const i64 jw0 = j0 + cw * 64, jt = jw0 + w * 16 + g;
        float dk[FA_D / 2], dv[FA_DV / 2];
        #pragma unroll
        for (int x = 0; x < FA_D / 2; ++x) dk[x] = 0.0f;
        #pragma unroll
        for (int x = 0; x < FA_DV / 2; ++x) dv[x] = 0.0f;
        if (any) {
            const unsigned sk = sK + cw * 8192u, sv = sV + cw * 8192u;
            mbar_wait(kvbar, 0u);
            for (i64 it = 0; it < total; ++it) {
                const int s = (int)(it % FA_QS);
                const unsigned ph = (unsigned)(it / FA_QS) & 1u;
                const i64 h = kh * FA_GROUP + it / nq, i0 = FA_QTILE(it) * FA_BQ;
                const unsigned sq = sQ + s * Q_BYTES, so = sO + s * O_BYTES;
                const float* sLb = sL + s * FA_BQ;
                const float* sDb = sD + s * FA_BQ;
                mbar_wait(QFULL(s), ph);
                float sc[32], dp[32];
                u32 pa[4][4];
                // S^T = K Q^T, dP^T = V dO^T.
                wgmma_fence();
                fa90_block<FA_DK>(sc, sk, FA_BK * 128u, sq, FA_BQ * 128u);
                wgmma_commit();
                fa90_block<FA_DVK>(dp, sv, FA_BK * 128u, so, FA_BQ * 128u);
                wgmma_commit();
                wgmma_wait1();
                // P^T (key rows, query columns), while dP^T runs.
                const bool need = fa_tile_needs_mask(i0, FA_BQ, jw0, 64, lq, lkv, off);
                const unsigned keep = fa90_probs(A, sc, need, lq, lkv, off, bi, h,
                    [&](int n, int e) { return i0 + n * 8 + tg * 2 + (e & 1); },
                    [&](int n, int e) { (void)n; return jt + (e >> 1) * 8; },
                    [&](int n, int e) { return sLb[n * 8 + tg * 2 + (e & 1)]; });
                fa90_p_frags(A, pa, sc, keep);
                // dV += P^T dO (dO N-major: 64-channel chunks FA_BQ * 128 bytes apart).
                wgmma_fence();
                #pragma unroll
                for (int ks = 0; ks < FA_BQ / 16; ++ks) fa90_wgmma_rs<FA_DV>(dv, pa[ks], make_desc(so + ks * 2048u, FA_BQ * 128u, 1024u));
                wgmma_commit();
                wgmma_wait1();
                // dS^T, then dK += dS^T Q.
                fa90_ds(A, dp, sc, keep, [&](int n, int e) { return sDb[n * 8 + tg * 2 + (e & 1)]; });
                u32 da[4][4];
                fa90_pack<64>(da, dp);
#if FA_ATOMIC_DQ
                // dS^T into this step's buffer: rows of 64 queries (128 bytes, swizzled as TMA's
                // 128-byte mode), this warpgroup's 64 keys after the other's: the M-major A
                // operand of dQ = dS K over the CTA's 128 keys. Row r's 16-byte chunk n sits at
                // chunk n ^ (r % 8), and r % 8 is g here.
                const unsigned sds = sDS + (unsigned)(it & 1) * DS_BYTES;
                #pragma unroll
                for (int n = 0; n < 8; ++n) {
                    #pragma unroll
                    for (int hh = 0; hh < 2; ++hh) {
                        const unsigned r = (unsigned)(cw * 64 + w * 16 + g + hh * 8);
                        asm volatile("st.shared.b32 [%0], %1;" :: "r"(sds + r * 128u + ((unsigned)(n ^ g) << 4) + tg * 4u), "r"(fa_pack(dp[4 * n + 2 * hh], dp[4 * n + 2 * hh + 1])) : "memory");
                    }
                }
                // Visible to wgmma (the async proxy), then to both consumers.
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
#if FA_ATOMIC_DQ && FA_SPLIT_DK
                // dK += dS^T Q in two halves around this step's dQ product (FlashAttention-3's
                // order), so that the tensor cores have work while this warpgroup waits at the
                // barrier and while it stages dQ: first half; barrier (both halves of dS^T
                // written); dQ += dS K for this warpgroup's 64-channel chunk (chunk c of step it
                // goes to consumer (it + c) % 2); second half; then dQ, complete (wait_group 1:
                // only the second half may still run), is added while that half runs. The dS^T
                // buffer is written again two steps later, after the next step's barrier, which
                // each warpgroup passes only once its dQ product here has completed.
                wgmma_fence();
                #pragma unroll
                for (int ks = 0; ks < FA_BQ / 32; ++ks) fa90_wgmma_rs<FA_D>(dk, da[ks], make_desc(sq + ks * 2048u, FA_BQ * 128u, 1024u));
                wgmma_commit();
                asm volatile("bar.sync 1, 256;" ::: "memory");
                const int c = fa90_dq_chunk(it, cw);
                float dq[32];
                #pragma unroll
                for (int ks = 0; ks < FA_BK / 16; ++ks) fa90_wgmma_ss<64, true>(dq, make_desc(sds + ks * 2048u, DS_BYTES, 1024u), make_desc(sK + c * (FA_BK * 128u) + ks * 2048u, FA_BK * 128u, 1024u), ks > 0 ? 1 : 0);
                wgmma_commit();
                #pragma unroll
                for (int ks = FA_BQ / 32; ks < FA_BQ / 16; ++ks) fa90_wgmma_rs<FA_D>(dk, da[ks], make_desc(sq + ks * 2048u, FA_BQ * 128u, 1024u));
                wgmma_commit();
                wgmma_wait1();
                fa90_dq_stage(dq, sDQ + cw * DQT_BYTES, tid, cw);
                wgmma_wait0();
                mbar_arrive(QEMPTY(s));
#else
                wgmma_fence();
                #pragma unroll
                for (int ks = 0; ks < FA_BQ / 16; ++ks) fa90_wgmma_rs<FA_D>(dk, da[ks], make_desc(sq + ks * 2048u, FA_BQ * 128u, 1024u));
                wgmma_commit();
#if FA_ATOMIC_DQ
                asm volatile("bar.sync 1, 256;" ::: "memory");
#endif
                wgmma_wait0();
                mbar_arrive(QEMPTY(s));
#if FA_ATOMIC_DQ
                // Without the split (d = 64, where FlashAttention-3's order was 16% slower on the
                // H100): this warpgroup's chunk of dQ += dS K, if it has one
                // at this step, after the barrier and the dK product. The buffer is written again
                // two steps later, after the next step's barrier, which this warpgroup passes only
                // once its product here has completed.
                const int c = fa90_dq_chunk(it, cw);
                if (c >= 0) {
                    float dq[32];
                    wgmma_fence();
                    #pragma unroll
                    for (int ks = 0; ks < FA_BK / 16; ++ks) fa90_wgmma_ss<64, true>(dq, make_desc(sds + ks * 2048u, DS_BYTES, 1024u), make_desc(sK + c * (FA_BK * 128u) + ks * 2048u, FA_BK * 128u, 1024u), ks > 0 ? 1 : 0);
                    wgmma_commit();
                    wgmma_wait0();
                    fa90_dq_stage(dq, sDQ + cw * DQT_BYTES, tid, cw);
                }
#endif
#endif
            }
        }
        #pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const i64 j = jt + hh * 8;
            if (j < FA_SKV) {
                fa90_store_row<FA_D, FA_DR>([&](i64 at, float a, float b) { fa_store_dk(dk_p, at, a, b); }, bi * DK_S0 + kh * DK_S1 + j * DK_S2, DK_S3, dk, hh, tg, A.scale);
                fa90_store_row<FA_DV, FA_DVR>([&](i64 at, float a, float b) { fa_store_dv(dv_p, at, a, b); }, bi * DV_S0 + kh * DV_S1 + j * DV_S2, DV_S3, dv, hh, tg, 1.0f);
            }
        }
    }
#undef QFULL
#undef QEMPTY
#undef FA_QTILE
}
