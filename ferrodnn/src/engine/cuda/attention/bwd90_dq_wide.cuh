// The Hopper backward's dQ kernel for 256-wide heads (attention/bwd90.rs): a CTA per (64 query
// rows, head, batch) keeps Q and dO in shared memory and loops over the K/V tiles of 64 keys (two
// stages, by TMA). Per tile consumer 0 computes S = Q K^T and P and hands P to consumer 1, which
// computes dP = dO V^T and dS = P (dP - D) and hands dS back (as A fragments); then each adds
// dS K into its half of dQ (consumer 0 columns 0..127, consumer 1 columns 128..255; see
// bwd90_wide.cuh).
//
// Reads common.cuh's, sm90.cuh's, bwd90.cuh's and bwd90_wide.cuh's defines and:
//   FA_BM, FA_BN                          query rows per CTA (64), keys per K/V tile (64)
//   LD_STATS, ST_S0..2                    the stats
//   DQ_S0..3, DQ_PAIR, ST_DQ              dq's strides and store

FA_DEFINE_STORE(dq, DQ_PAIR, ST_DQ, DQ_S3)

extern "C" __global__ void __launch_bounds__(384, 1) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    extern __shared__ unsigned char fa_smem_raw[];
    const unsigned raw = smem_u32(fa_smem_raw);
    const unsigned base = (raw + 1023u) & ~1023u;
    constexpr unsigned Q_BYTES = FA_BM * FA_D * 2, O_BYTES = FA_BM * FA_DV * 2, K_BYTES = FA_BN * FA_D * 2, V_BYTES = FA_BN * FA_DV * 2;
    // dS as A fragments: 16 words a thread, word x of thread t at x * 128 + t.
    constexpr unsigned DS_BYTES = 16u * 128u * 4u;
    const unsigned sQ = base, sO = sQ + Q_BYTES, sK = sO + O_BYTES, sV = sK + 2 * K_BYTES, sP = sV + 2 * V_BYTES, sS = sP + FA90_HAND_BYTES, bars = sS + DS_BYTES;
    // Barriers: Q+dO; K+V full and empty (two stages); P handed over and its buffer free, dS
    // handed back and its buffer free (bwd90_wide.cuh).
    const unsigned qbar = bars, pfull = bars + 40u, pfree = bars + 48u, sfull = bars + 56u, sfree = bars + 64u;
#define KFULL(s) (bars + 8u + 8u * (s))
#define KEMPTY(s) (bars + 24u + 8u * (s))
    float* hand = reinterpret_cast<float*>(fa_smem_raw + (sP - raw));
    u32* hand_ds = reinterpret_cast<u32*>(fa_smem_raw + (sS - raw));
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
        for (int b = 0; b < 4; ++b) mbar_init(pfull + 8u * b, 128u);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (wg == 0) {
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
        // Both consumers' rows: r0 and r0 + 8.
        const i64 r0 = q0 + w * 16 + g;
        // lse (log2 units) for consumer 0, D for consumer 1, of rows r0 and r0 + 8.
        float rv[2];
        #pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const i64 i = r0 + hh * 8;
            const bool ok = i < lq;
            rv[hh] = !ok ? 0.0f : cw == 0 ? fa_lse2(LD_STATS(stats_p, bi * ST_S0 + h * ST_S1 + i * ST_S2)) : dbuf[(bi * FA_HQ + h) * FA_SQ + i];
        }
        // This consumer's half of dQ: columns 128 * cw ...
        float dq[64];
        #pragma unroll
        for (int x = 0; x < 64; ++x) dq[x] = 0.0f;
        if (any) {
            const unsigned half = (unsigned)cw * 2u * (FA_BN * 128u);
            mbar_wait(qbar, 0u);
            for (int t = t0; t < t1; ++t) {
                const int s = (t - t0) & 1;
                const unsigned ph = ((t - t0) >> 1) & 1;
                const i64 j0 = (i64)t * FA_BN;
                const unsigned sk = sK + s * K_BYTES, sv = sV + s * V_BYTES;
                mbar_wait(KFULL(s), ph);
                // Consumer 0: S = Q K^T; consumer 1: dP = dO V^T (one code path, as in
                // bwd90_dkdv_wide.cuh).
                float acc[32];
                wgmma_fence();
                fa90_block<FA_WK>(acc, cw == 0 ? sQ : sO, FA_BM * 128u, cw == 0 ? sk : sv, FA_BN * 128u);
                wgmma_commit();
                wgmma_wait0();
                u32 da[4][4];
                if (cw == 0) {
                    // P to consumer 1 once it has read the previous tile's; dS back from it.
                    const bool need = fa_tile_needs_mask(q0, 64, j0, FA_BN, lq, lkv, off);
                    const unsigned keep = fa90_probs(A, acc, need, lq, lkv, off, bi, h,
                        [&](int n, int e) { (void)n; return r0 + (e >> 1) * 8; },
                        [&](int n, int e) { return j0 + n * 8 + tg * 2 + (e & 1); },
                        [&](int n, int e) { (void)n; return rv[e >> 1]; });
                    if (t > t0) fa90_hand_wait(pfree, t - t0 - 1);
                    fa90_hand_f32(hand, tid, acc, keep);
                    mbar_arrive(pfull);
                    fa90_hand_wait(sfull, t - t0);
                    #pragma unroll
                    for (int x = 0; x < 16; ++x) da[x >> 2][x & 3] = hand_ds[x * 128 + tid];
                    if (t + 1 < t1) mbar_arrive(sfree);
                } else {
                    // dS = P (dP - D), handed back.
                    float pr[32];
                    fa90_hand_wait(pfull, t - t0);
                    const unsigned keep = fa90_take_f32(hand, tid, pr);
                    if (t + 1 < t1) mbar_arrive(pfree);
                    fa90_ds(A, acc, pr, keep, [&](int n, int e) { (void)n; return rv[e >> 1]; });
                    fa90_pack<64>(da, acc);
                    if (t > t0) fa90_hand_wait(sfree, t - t0 - 1);
                    #pragma unroll
                    for (int x = 0; x < 16; ++x) hand_ds[x * 128 + tid] = da[x >> 2][x & 3];
                    mbar_arrive(sfull);
                }
                // dQ[:, half] += dS K[:, half] (K N-major: 64-channel chunks FA_BN * 128 bytes apart).
                wgmma_fence();
                #pragma unroll
                for (int ks = 0; ks < FA_BN / 16; ++ks) fa90_wgmma_rs<128>(dq, da[ks], make_desc(sk + half + ks * 2048u, FA_BN * 128u, 1024u));
                wgmma_commit();
                wgmma_wait0();
                mbar_arrive(KEMPTY(s));
            }
        }
        #pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const i64 i = r0 + hh * 8;
            if (i < FA_SQ) {
                const i64 at = bi * DQ_S0 + h * DQ_S1 + i * DQ_S2;
                if (cw == 0) {
                    fa90_store_row<128, 128>([&](i64 o, float a, float b) { fa_store_dq(dq_p, o, a, b); }, at, DQ_S3, dq, hh, tg, A.scale);
                } else {
                    fa90_store_row<128, FA_DR - 128>([&](i64 o, float a, float b) { fa_store_dq(dq_p, o, a, b); }, at + 128 * DQ_S3, DQ_S3, dq, hh, tg, A.scale);
                }
            }
        }
    }
#undef KFULL
#undef KEMPTY
}
