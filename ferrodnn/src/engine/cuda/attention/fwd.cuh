// The sm_80 forward kernel (FlashAttention-2 on mma.sync; attention/fwd.rs): a CTA per (q
// tile, query head, batch), 16 query rows per warp, K/V tiles double-buffered with cp.async.
//
// Reads common.cuh's defines and:
//   FA_NW, FA_NT, FA_BM, FA_BN, FA_LDQ   warps, threads, rows per CTA, keys per K/V tile, the Q
//                                        tile's row stride in shared memory
//   FA_QREG                              Q fragments kept in registers (head dims up to 128)
//   O_S0..3, O_PAIR, ST_O                o's strides and store (pairs of 4 bytes, or st_<type>)
//   FA_HAS_STATS, ST_STATS, ST_S0..2     the log-sum-exp stats output
//   FA_HAS_SMAX, ST_SMAX, SMAX_S0..2     the score_max output (each row's softmax max)
//   FA_HAS_SSUM, ST_SSUM, SSUM_S0..2     the score_sum_exp output (its sum of exp(s - max))
// With FA_HAS_SINK (common.cuh) the sink's logit starts each row's running max, and its term,
// exp(0) = 1, the running sum.

FA_DEFINE_STORE(o, O_PAIR, ST_O, O_S3)

extern "C" __global__ void __launch_bounds__(FA_NT) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    extern __shared__ __align__(16) unsigned char fa_smem[];
    u16* sQ = reinterpret_cast<u16*>(fa_smem);
    u16* sK = sQ + FA_BM * FA_LDQ;
    u16* sV = sK + 2 * FA_BN * FA_LDK;
    FA_INIT
    const u16* Qg = reinterpret_cast<const u16*>(q_p);
    const u16* Kg = reinterpret_cast<const u16*>(k_p);
    const u16* Vg = reinterpret_cast<const u16*>(v_p);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
    const i64 qt = (i64)gridDim.x - 1 - blockIdx.x;
    const i64 h = blockIdx.y, bi = blockIdx.z, kh = h / FA_GROUP;
    i64 lq, lkv;
    fa_lens(A, bi, lq, lkv);
    const i64 off = fa_diag_off(lq, lkv);
    const i64 q0 = qt * FA_BM;
    const i64 imax = fa_min(q0 + FA_BM, lq) - 1;
    i64 jlo, jhi;
    fa_key_range(q0, imax, lkv, off, jlo, jhi);
    const bool any = q0 < lq && jlo < jhi;
    const i64 t0 = any ? jlo / FA_BN : 0, t1 = any ? (jhi + FA_BN - 1) / FA_BN : 0;

    fa_load<FA_BM, FA_D, FA_DR, FA_LDQ, FA_NT, Q_VEC>(sQ, Qg, Q_S3, [&](int r) -> i64 {
        const i64 i = q0 + r;
        return i < lq ? fa_start(A, FA_RG_Q, bi, Q_S0) + h * Q_S1 + i * Q_S2 : (i64)-1;
    });
    auto load_kv = [&](i64 t, int buf) {
        const i64 j0 = t * FA_BN;
        fa_load<FA_BN, FA_D, FA_DR, FA_LDK, FA_NT, K_VEC>(sK + buf * FA_BN * FA_LDK, Kg, K_S3, [&](int r) -> i64 {
            const i64 j = j0 + r;
            return j < lkv ? fa_krow(A, bi, kh, j) : (i64)-1;
        });
        fa_load<FA_BN, FA_DV, FA_DVR, FA_LDV, FA_NT, V_VEC>(sV + buf * FA_BN * FA_LDV, Vg, V_S3, [&](int r) -> i64 {
            const i64 j = j0 + r;
            return j < lkv ? fa_vrow(A, bi, kh, j) : (i64)-1;
        });
    };
    if (any) load_kv(t0, 0);
    fa_commit();

    // Row state of rows g and g + 8 of the warp's 16: running max (log2 units), this thread's
    // part of the running sum, and the output accumulators.
    float m[2] = {FA_NINF, FA_NINF};
    float l[2] = {0.0f, 0.0f};
#if FA_HAS_SINK
    // The sink: a key of logit sink_h (log2 units here) and no value. Its term enters the sum of
    // one thread of the quad that shares the row (the quad's parts are added at the end).
    m[0] = (float)LD_SINK(A.sink, h * SINK_S1) * FA_LOG2E;
    m[1] = m[0];
    l[0] = tg == 0 ? 1.0f : 0.0f;
    l[1] = l[0];
#endif
    float oacc[FA_DV / 8][4];
    #pragma unroll
    for (int n = 0; n < FA_DV / 8; ++n) { oacc[n][0] = 0.0f; oacc[n][1] = 0.0f; oacc[n][2] = 0.0f; oacc[n][3] = 0.0f; }
#if FA_QREG
    u32 qf[FA_D / 16][4];
#endif
    const u16* sQw = sQ + (warp * 16 + (lane & 15)) * FA_LDQ + (lane >> 4) * 8;

    for (i64 t = t0; t < t1; ++t) {
        const int buf = (int)((t - t0) & 1);
        if (t + 1 < t1) {
            load_kv(t + 1, buf ^ 1);
            fa_commit();
            fa_wait<1>();
        } else {
            fa_wait<0>();
        }
        __syncthreads();
#if FA_QREG
        if (t == t0) {
            #pragma unroll
            for (int kk = 0; kk < FA_D / 16; ++kk) fa_ldsm(qf[kk], sQw + kk * 16);
        }
#endif
        const u16* sKb = sK + buf * FA_BN * FA_LDK;
        const u16* sVb = sV + buf * FA_BN * FA_LDV;

        // S = Q K^T: 16 rows x BN keys per warp.
        float sacc[FA_BN / 8][4];
        #pragma unroll
        for (int n = 0; n < FA_BN / 8; ++n) { sacc[n][0] = 0.0f; sacc[n][1] = 0.0f; sacc[n][2] = 0.0f; sacc[n][3] = 0.0f; }
        #pragma unroll
        for (int kk = 0; kk < FA_D / 16; ++kk) {
#if FA_QREG
            const u32* a = qf[kk];
#else
            u32 a[4];
            fa_ldsm(a, sQw + kk * 16);
#endif
            #pragma unroll
            for (int nn = 0; nn < FA_BN / 16; ++nn) {
                u32 b[4];
                fa_ldsm(b, sKb + (nn * 16 + (lane & 7) + ((lane >> 4) << 3)) * FA_LDK + kk * 16 + ((lane >> 3) & 1) * 8);
                fa_mma(sacc[2 * nn], a, b[0], b[1]);
                fa_mma(sacc[2 * nn + 1], a, b[2], b[3]);
            }
        }

        // Scores in log2 units, masked ones -inf.
        const i64 j0 = t * FA_BN;
        const bool need = fa_tile_needs_mask(q0, FA_BM, j0, FA_BN, lq, lkv, off);
        if (need || FA_HAS_BIAS || FA_ALIBI) {
            #pragma unroll
            for (int n = 0; n < FA_BN / 8; ++n) {
                #pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const i64 i = q0 + warp * 16 + g + (e >> 1) * 8;
                    const i64 j = j0 + n * 8 + tg * 2 + (e & 1);
                    float x = sacc[n][e] * A.scale_log2;
                    if (need && !fa_visible(i, j, lq, lkv, off)) x = FA_NINF;
#if FA_HAS_BIAS || FA_ALIBI
                    else x = fmaf(fa_add(A, bi, h, i, j), FA_LOG2E, x);
#endif
                    sacc[n][e] = x;
                }
            }
        } else {
            #pragma unroll
            for (int n = 0; n < FA_BN / 8; ++n) {
                #pragma unroll
                for (int e = 0; e < 4; ++e) sacc[n][e] *= A.scale_log2;
            }
        }

        // Online softmax: new row max (over the quad that shares a row), rescale, exponentiate.
        float mx[2] = {m[0], m[1]};
        #pragma unroll
        for (int n = 0; n < FA_BN / 8; ++n) {
            mx[0] = fmaxf(mx[0], fmaxf(sacc[n][0], sacc[n][1]));
            mx[1] = fmaxf(mx[1], fmaxf(sacc[n][2], sacc[n][3]));
        }
        float mu[2];
        #pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 1));
            mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 2));
            // A row with every key masked so far keeps max -inf: exponentiate against 0.
            mu[hh] = mx[hh] == FA_NINF ? 0.0f : mx[hh];
            const float alpha = fa_exp2(m[hh] - mu[hh]);
            m[hh] = mx[hh];
            l[hh] *= alpha;
            #pragma unroll
            for (int n = 0; n < FA_DV / 8; ++n) { oacc[n][2 * hh] *= alpha; oacc[n][2 * hh + 1] *= alpha; }
        }
        #pragma unroll
        for (int n = 0; n < FA_BN / 8; ++n) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float p = fa_exp2(sacc[n][e] - mu[e >> 1]);
                l[e >> 1] += p;
                sacc[n][e] = p;
            }
        }
#if FA_DROPOUT
        // Dropped elements leave the sum (taken before dropout) but not the output.
        #pragma unroll
        for (int n = 0; n < FA_BN / 8; ++n) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                if (sacc[n][e] != 0.0f) {
                    const i64 i = q0 + warp * 16 + g + (e >> 1) * 8;
                    const i64 j = j0 + n * 8 + tg * 2 + (e & 1);
                    if (!fa_keep(A, bi, h, i, j)) sacc[n][e] = 0.0f;
                }
            }
        }
#endif

        // O += P V: P from the S accumulators (A fragments), V through ldmatrix.trans.
        #pragma unroll
        for (int kt = 0; kt < FA_BN / 16; ++kt) {
            u32 a[4];
            a[0] = fa_pack(sacc[2 * kt][0], sacc[2 * kt][1]);
            a[1] = fa_pack(sacc[2 * kt][2], sacc[2 * kt][3]);
            a[2] = fa_pack(sacc[2 * kt + 1][0], sacc[2 * kt + 1][1]);
            a[3] = fa_pack(sacc[2 * kt + 1][2], sacc[2 * kt + 1][3]);
            #pragma unroll
            for (int nd = 0; nd < FA_DV / 16; ++nd) {
                u32 b[4];
                fa_ldsm_t(b, sVb + (kt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * FA_LDV + nd * 16 + (lane >> 4) * 8);
                fa_mma(oacc[2 * nd], a, b[0], b[1]);
                fa_mma(oacc[2 * nd + 1], a, b[2], b[3]);
            }
        }
        __syncthreads();
    }
    fa_wait<0>();

    // Normalize and store; empty rows (padded, or every key masked without a sink) give o = 0,
    // stats = -inf, score_max = -inf and score_sum_exp = 0.
    #pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        float lsum = l[hh];
        lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
        lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
        const i64 i = q0 + warp * 16 + g + hh * 8;
        const bool empty = i >= lq || m[hh] == FA_NINF || !(lsum > 0.0f);
        const float inv = empty ? 0.0f : A.keep_scale / lsum;
        if (i < FA_SQ && fa_has_row(FA_RG_O, i, lq)) {
            const i64 ob = fa_start(A, FA_RG_O, bi, O_S0) + h * O_S1 + i * O_S2;
            #pragma unroll
            for (int n = 0; n < FA_DV / 8; ++n) {
                const i64 c = n * 8 + tg * 2;
                if (c < FA_DVR) fa_store_o(o_p, ob + c * O_S3, oacc[n][2 * hh] * inv, oacc[n][2 * hh + 1] * inv);
            }
        }
#if FA_HAS_STATS
        if (i < FA_SQ && tg == 0 && fa_has_row(FA_RG_ST, i, lq)) {
            ST_STATS(stats_p, fa_start(A, FA_RG_ST, bi, ST_S0) + h * ST_S1 + i * ST_S2, empty ? (double)FA_NINF : (double)(m[hh] * FA_LN2 + logf(lsum)));
        }
#endif
#if FA_HAS_SMAX
        if (i < FA_SQ && tg == 0 && fa_has_row(FA_RG_SMAX, i, lq)) {
            ST_SMAX(smax_p, fa_start(A, FA_RG_SMAX, bi, SMAX_S0) + h * SMAX_S1 + i * SMAX_S2, empty ? (double)FA_NINF : (double)(m[hh] * FA_LN2));
        }
#endif
#if FA_HAS_SSUM
        if (i < FA_SQ && tg == 0 && fa_has_row(FA_RG_SSUM, i, lq)) {
            ST_SSUM(ssum_p, fa_start(A, FA_RG_SSUM, bi, SSUM_S0) + h * SSUM_S1 + i * SSUM_S2, empty ? 0.0 : (double)lsum);
        }
#endif
    }
}
