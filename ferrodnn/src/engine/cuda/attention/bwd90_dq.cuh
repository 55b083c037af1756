// The Hopper backward's dQ kernel (attention/bwd90.rs): a CTA per (128 query rows, head, batch)
// keeps Q and dO in shared memory and loops over the K/V tiles of 64 keys (two stages, by TMA):
// S = Q K^T, dP = dO V^T, dS = P (dP - D), dQ += dS K.
//
// Reads common.cuh's, sm90.cuh's and bwd90.cuh's defines and:
//   FA_BM, FA_BN                          query rows per CTA, keys per K/V tile
//   LD_STATS, ST_S0..2                    the stats
//   DQ_S0..3, DQ_PAIR, ST_DQ              dq's strides and store

FA_DEFINE_STORE(dq, DQ_PAIR, ST_DQ, DQ_S3)

extern "C" __global__ void __launch_bounds__(384, 1) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    extern __shared__ unsigned char fa_smem_raw[];
    const unsigned base = (smem_u32(fa_smem_raw) + 1023u) & ~1023u;
    constexpr unsigned Q_BYTES = FA_BM * FA_D * 2, O_BYTES = FA_BM * FA_DV * 2, K_BYTES = FA_BN * FA_D * 2, V_BYTES = FA_BN * FA_DV * 2;
    const unsigned sQ = base, sO = sQ + Q_BYTES, sK = sO + O_BYTES, sV = sK + 2 * K_BYTES, bars = sV + 2 * V_BYTES;
    // Barriers: Q+dO; K+V full and empty (two stages).
    const unsigned qbar = bars;
#define KFULL(s) (bars + 8u + 8u * (s))
#define KEMPTY(s) (bars + 24u + 8u * (s))
    FA_INIT
    const float* dbuf = reinterpret_cast<const float*>(dbuf_p);
    const int wg = threadIdx.x >> 7;
    i64 rank, h, bi;
    fa90_work(rank, h, bi);
    const i64 qt = (i64)gridDim.x - 1 - rank, kh = h / FA_GROUP;
    i64 lq, lkv;
    fa_lens(A, bi, lq, lkv);
    const i64 off = fa_diag_off(lq, lkv);
    const i64 q0 = qt * FA_BM;
    int t0, t1;
    const bool any = fa90_key_tiles(q0, FA_BM, FA_BN, lq, lkv, off, t0, t1);
    if (threadIdx.x == 0) {
        mbar_init(qbar, 1u);
        for (int s = 0; s < 2; ++s) {
            mbar_init(KFULL(s), 1u);
            mbar_init(KEMPTY(s), 256u);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (wg == 0) {
        // 24 / 240 registers as in the dK/dV kernel (with 232, ptxas serialized the wgmmas of
        // the ALiBi variant).
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
        if (threadIdx.x == 0 && any) {
            mbar_expect_tx(qbar, Q_BYTES + O_BYTES);
            #pragma unroll
            for (int c = 0; c < FA_D / 64; ++c) fa90_tma(sQ + c * (FA_BM * 128u), &tq, qbar, c * 64, (int)q0, (int)h, (int)bi);
            #pragma unroll
            for (int c = 0; c < FA_DV / 64; ++c) fa90_tma(sO + c * (FA_BM * 128u), &tdo, qbar, c * 64, (int)q0, (int)h, (int)bi);
            #pragma unroll 1
            for (int t = t0; t < t1; ++t) {
                const int s = (t - t0) & 1;
                const unsigned ph = ((t - t0) >> 1) & 1;
                mbar_wait(KEMPTY(s), ph ^ 1u);
                mbar_expect_tx(KFULL(s), K_BYTES + V_BYTES);
                #pragma unroll
                for (int c = 0; c < FA_D / 64; ++c) fa90_tma(sK + s * K_BYTES + c * (FA_BN * 128u), &tk, KFULL(s), c * 64, t * FA_BN, (int)kh, (int)bi);
                #pragma unroll
                for (int c = 0; c < FA_DV / 64; ++c) fa90_tma(sV + s * V_BYTES + c * (FA_BN * 128u), &tv, KFULL(s), c * 64, t * FA_BN, (int)kh, (int)bi);
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
        const int cw = wg - 1, tid = threadIdx.x & 127, w = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
        const i64 wq0 = q0 + cw * 64, r0 = wq0 + w * 16 + g;
        // lse (log2 units) and D of rows r0 and r0 + 8.
        float lse2[2], dd[2];
        #pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const i64 i = r0 + hh * 8;
            const bool ok = i < lq;
            lse2[hh] = ok ? fa_lse2(LD_STATS(stats_p, bi * ST_S0 + h * ST_S1 + i * ST_S2)) : 0.0f;
            dd[hh] = ok ? dbuf[(bi * FA_HQ + h) * FA_SQ + i] : 0.0f;
        }
        float dq[FA_D / 2];
        #pragma unroll
        for (int x = 0; x < FA_D / 2; ++x) dq[x] = 0.0f;
        if (any) {
            const unsigned sq = sQ + cw * 8192u, so = sO + cw * 8192u;
            mbar_wait(qbar, 0u);
            for (int t = t0; t < t1; ++t) {
                const int s = (t - t0) & 1;
                const unsigned ph = ((t - t0) >> 1) & 1;
                const i64 j0 = (i64)t * FA_BN;
                const unsigned sk = sK + s * K_BYTES, sv = sV + s * V_BYTES;
                mbar_wait(KFULL(s), ph);
                float sc[32], dp[32];
                // S = Q K^T, dP = dO V^T.
                wgmma_fence();
                fa90_block<FA_DK>(sc, sq, FA_BM * 128u, sk, FA_BN * 128u);
                wgmma_commit();
                fa90_block<FA_DVK>(dp, so, FA_BM * 128u, sv, FA_BN * 128u);
                wgmma_commit();
                wgmma_wait1();
                const bool need = fa_tile_needs_mask(wq0, 64, j0, FA_BN, lq, lkv, off);
                const unsigned keep = fa90_probs(A, sc, need, lq, lkv, off, bi, h,
                    [&](int n, int e) { (void)n; return r0 + (e >> 1) * 8; },
                    [&](int n, int e) { return j0 + n * 8 + tg * 2 + (e & 1); },
                    [&](int n, int e) { (void)n; return lse2[e >> 1]; });
                wgmma_wait0();
                fa90_ds(A, dp, sc, keep, [&](int n, int e) { (void)n; return dd[e >> 1]; });
                u32 da[4][4];
                fa90_pack<64>(da, dp);
                // dQ += dS K (K N-major: 64-channel chunks FA_BN * 128 bytes apart).
                wgmma_fence();
                #pragma unroll
                for (int ks = 0; ks < FA_BN / 16; ++ks) fa90_wgmma_rs<FA_D>(dq, da[ks], make_desc(sk + ks * 2048u, FA_BN * 128u, 1024u));
                wgmma_commit();
                wgmma_wait0();
                mbar_arrive(KEMPTY(s));
            }
        }
        #pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const i64 i = r0 + hh * 8;
            if (i < FA_SQ) {
                fa90_store_row<FA_D, FA_DR>([&](i64 at, float a, float b) { fa_store_dq(dq_p, at, a, b); }, bi * DQ_S0 + h * DQ_S1 + i * DQ_S2, DQ_S3, dq, hh, tg, A.scale);
            }
        }
    }
#undef KFULL
#undef KEMPTY
}
