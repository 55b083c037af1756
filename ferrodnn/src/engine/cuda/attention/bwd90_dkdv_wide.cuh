// The Hopper backward's dK/dV kernel for 256-wide heads (attention/bwd90.rs): a CTA per (64 keys,
// kv head, batch) keeps K and V in shared memory and loops over the query heads of the group and
// their q tiles of 64 rows (Q and dO by TMA, FA_QS stages; lse and D staged by a producer warp).
// Per step consumer 0 computes S^T = K Q^T and P^T, hands P^T to consumer 1 and adds P^T dO into
// dV; consumer 1 computes dP^T = V dO^T, then dS^T = P^T (dP^T - D), and adds dS^T Q into dK
// (bwd90_wide.cuh: each warpgroup holds one 64 x 256 accumulator).
//
// Reads common.cuh's, sm90.cuh's, bwd90.cuh's and bwd90_wide.cuh's defines and:
//   FA_BK, FA_BQ, FA_QS, FA_QREV          keys per CTA (64), query rows per step (64), stages,
//                                         q tiles walked downward
//   LD_STATS, ST_S0..2                    the stats
//   DK_S0..3, DK_PAIR, ST_DK, DV_S0..3, DV_PAIR, ST_DV   dk's and dv's strides and stores

FA_DEFINE_STORE(dk, DK_PAIR, ST_DK, DK_S3)
FA_DEFINE_STORE(dv, DV_PAIR, ST_DV, DV_S3)

extern "C" __global__ void __launch_bounds__(384, 1) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    extern __shared__ unsigned char fa_smem_raw[];
    const unsigned raw = smem_u32(fa_smem_raw);
    const unsigned base = (raw + 1023u) & ~1023u;
    constexpr unsigned K_BYTES = FA_BK * FA_D * 2, V_BYTES = FA_BK * FA_DV * 2, Q_BYTES = FA_BQ * FA_D * 2, O_BYTES = FA_BQ * FA_DV * 2;
    const unsigned sK = base, sV = sK + K_BYTES, sQ = sV + V_BYTES, sO = sQ + FA_QS * Q_BYTES, sP = sO + FA_QS * O_BYTES, bars = sP + FA90_HAND_BYTES;
    // Barriers: K/V; Q+dO full (TMA bytes and the 32 lanes that stage lse and D), empty; P^T
    // handed over, its buffer free (bwd90_wide.cuh). lse and D follow at bars + 64.
    static_assert(8 + 16 * FA_QS + 16 <= 64, "the barriers fit before lse and D");
    const unsigned kvbar = bars, pfull = bars + 8u + 16u * FA_QS, pfree = pfull + 8u;
#define QFULL(s) (bars + 8u + 8u * (s))
#define QEMPTY(s) (bars + 8u + 8u * FA_QS + 8u * (s))
#if FA_QREV
#define FA_QTILE(it) (qa + nq - 1 - (it) % nq)
#else
#define FA_QTILE(it) (qa + (it) % nq)
#endif
    float* sL = reinterpret_cast<float*>(fa_smem_raw + (bars + 64u - raw));
    float* sD = sL + FA_QS * FA_BQ;
    float* hand = reinterpret_cast<float*>(fa_smem_raw + (sP - raw));
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
        mbar_init(pfull, 128u);
        mbar_init(pfree, 128u);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (wg == 0) {
        // 24 registers for the producer, 240 for each consumer thread (as bwd90_dkdv.cuh).
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        if (warp == 0 && lane == 0 && any) {
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
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
        const int cw = wg - 1, tid = threadIdx.x & 127, w = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
        // This thread's keys jt and jt + 8.
        const i64 jt = j0 + w * 16 + g;
        // Consumer 0: dV; consumer 1: dK (columns 0..127 and 128..255).
        float acc0[64], acc1[64];
        #pragma unroll
        for (int x = 0; x < 64; ++x) {
            acc0[x] = 0.0f;
            acc1[x] = 0.0f;
        }
        if (any) {
            mbar_wait(kvbar, 0u);
            for (i64 it = 0; it < total; ++it) {
                const int s = (int)(it % FA_QS);
                const unsigned ph = (unsigned)(it / FA_QS) & 1u;
                const i64 h = kh * FA_GROUP + it / nq, i0 = FA_QTILE(it) * FA_BQ;
                const unsigned sq = sQ + s * Q_BYTES, so = sO + s * O_BYTES;
                mbar_wait(QFULL(s), ph);
                // Consumer 0: S^T = K Q^T; consumer 1: dP^T = V dO^T (the same code for both, so
                // that no wgmma sits on a divergent path; the narrower head dim's tile has zero
                // channels past it).
                float acc[32];
                wgmma_fence();
                fa90_block<FA_WK>(acc, cw == 0 ? sK : sV, FA_BK * 128u, cw == 0 ? sq : so, FA_BQ * 128u);
                wgmma_commit();
                wgmma_wait0();
                u32 frag[4][4];
                if (cw == 0) {
                    // P^T (key rows, query columns), handed to consumer 1 once it has read the
                    // previous step's.
                    const float* sLb = sL + s * FA_BQ;
                    const bool need = fa_tile_needs_mask(i0, FA_BQ, j0, 64, lq, lkv, off);
                    const unsigned keep = fa90_probs(A, acc, need, lq, lkv, off, bi, h,
                        [&](int n, int e) { return i0 + n * 8 + tg * 2 + (e & 1); },
                        [&](int n, int e) { (void)n; return jt + (e >> 1) * 8; },
                        [&](int n, int e) { return sLb[n * 8 + tg * 2 + (e & 1)]; });
                    if (it > 0) fa90_hand_wait(pfree, it - 1);
                    fa90_hand_f32(hand, tid, acc, keep);
                    mbar_arrive(pfull);
                    fa90_p_frags(A, frag, acc, keep);
                } else {
                    // dS^T = P^T (dP^T - D).
                    const float* sDb = sD + s * FA_BQ;
                    float pt[32];
                    fa90_hand_wait(pfull, it);
                    const unsigned keep = fa90_take_f32(hand, tid, pt);
                    if (it + 1 < total) mbar_arrive(pfree);
                    fa90_ds(A, acc, pt, keep, [&](int n, int e) { (void)n; return sDb[n * 8 + tg * 2 + (e & 1)]; });
                    fa90_pack<64>(frag, acc);
                }
                // Consumer 0: dV += P^T dO; consumer 1: dK += dS^T Q (dO and Q N-major: 64-channel
                // chunks FA_BQ * 128 bytes apart).
                const unsigned sb = cw == 0 ? so : sq;
                wgmma_fence();
                #pragma unroll
                for (int ks = 0; ks < FA_BQ / 16; ++ks) fa90_wide_rs(acc0, acc1, frag[ks], sb + ks * 2048u, FA_BQ * 128u);
                wgmma_commit();
                wgmma_wait0();
                mbar_arrive(QEMPTY(s));
            }
        }
        #pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const i64 j = jt + hh * 8;
            if (j < FA_SKV) {
                if (cw == 0) {
                    const i64 at = bi * DV_S0 + kh * DV_S1 + j * DV_S2;
                    fa90_store_row<128, 128>([&](i64 o, float a, float b) { fa_store_dv(dv_p, o, a, b); }, at, DV_S3, acc0, hh, tg, 1.0f);
                    fa90_store_row<128, FA_DVR - 128>([&](i64 o, float a, float b) { fa_store_dv(dv_p, o, a, b); }, at + 128 * DV_S3, DV_S3, acc1, hh, tg, 1.0f);
                } else {
                    const i64 at = bi * DK_S0 + kh * DK_S1 + j * DK_S2;
                    fa90_store_row<128, 128>([&](i64 o, float a, float b) { fa_store_dk(dk_p, o, a, b); }, at, DK_S3, acc0, hh, tg, A.scale);
                    fa90_store_row<128, FA_DR - 128>([&](i64 o, float a, float b) { fa_store_dk(dk_p, o, a, b); }, at + 128 * DK_S3, DK_S3, acc1, hh, tg, A.scale);
                }
            }
        }
    }
#undef QFULL
#undef QEMPTY
#undef FA_QTILE
}
