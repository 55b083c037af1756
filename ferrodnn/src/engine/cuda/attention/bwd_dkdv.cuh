// The sm_80 backward's dK/dV kernel (attention/bwd.rs): a CTA per (K/V tile, kv head, batch,
// column chunk), 16 keys per warp, looping over the query heads sharing the kv head and their q
// tiles (Q, dO, lse and D double-buffered): S^T = K Q^T and dP^T = V dO^T recomputed,
// dV += P^T dO, dK += dS^T Q.
//
// Reads common.cuh's defines and:
//   FA_NT, FA_BNK, FA_BMQ, FA_NCH, FA_CW, FA_CWV, FA_LDQ   threads, keys, query rows per step,
//                                                          column chunks of dK and dV
//   DO_S0..3, DO_VEC, LD_STATS, ST_S0..2                    dO and the stats
//   DK_S0..3, DK_PAIR, ST_DK, DV_S0..3, DV_PAIR, ST_DV      dk's and dv's strides and stores

FA_DEFINE_STORE(dk, DK_PAIR, ST_DK, DK_S3)
FA_DEFINE_STORE(dv, DV_PAIR, ST_DV, DV_S3)

extern "C" __global__ void __launch_bounds__(FA_NT) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    extern __shared__ __align__(16) unsigned char fa_smem[];
    u16* sK = reinterpret_cast<u16*>(fa_smem);
    u16* sV = sK + FA_BNK * FA_LDK;
    u16* sQ = sV + FA_BNK * FA_LDV;
    u16* sO = sQ + 2 * FA_BMQ * FA_LDQ;
    float* sL = reinterpret_cast<float*>(sO + 2 * FA_BMQ * FA_LDV);
    float* sD = sL + 2 * FA_BMQ;
    FA_INIT
    const u16* Qg = reinterpret_cast<const u16*>(q_p);
    const u16* Kg = reinterpret_cast<const u16*>(k_p);
    const u16* Vg = reinterpret_cast<const u16*>(v_p);
    const u16* DOg = reinterpret_cast<const u16*>(do_p);
    const float* dbuf = reinterpret_cast<const float*>(dbuf_p);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
    const int chunk = (int)(blockIdx.x % FA_NCH);
    const i64 kt = (i64)(blockIdx.x / FA_NCH);
    const i64 kh = blockIdx.y, bi = blockIdx.z;
    i64 lq, lkv;
    fa_lens(A, bi, lq, lkv);
    const i64 off = fa_diag_off(lq, lkv);
    const i64 j0 = kt * FA_BNK;
    const i64 jmax = fa_min(j0 + FA_BNK, lkv) - 1;
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
    const i64 qa = any ? ilo / FA_BMQ : 0;
    const i64 nq = any ? (ihi + FA_BMQ - 1) / FA_BMQ - qa : 0;
    const i64 total = nq * FA_GROUP;

    fa_load<FA_BNK, FA_D, FA_DR, FA_LDK, FA_NT, K_VEC>(sK, Kg, K_S3, [&](int r) -> i64 {
        const i64 j = j0 + r;
        return j < lkv ? fa_krow(A, bi, kh, j) : (i64)-1;
    });
    fa_load<FA_BNK, FA_DV, FA_DVR, FA_LDV, FA_NT, V_VEC>(sV, Vg, V_S3, [&](int r) -> i64 {
        const i64 j = j0 + r;
        return j < lkv ? fa_vrow(A, bi, kh, j) : (i64)-1;
    });
    // Step `it`: query head kh * GROUP + it / nq, q tile qa + it % nq.
    auto load_q = [&](i64 it, int buf) {
        const i64 h = kh * FA_GROUP + it / nq;
        const i64 i0 = (qa + it % nq) * FA_BMQ;
        fa_load<FA_BMQ, FA_D, FA_DR, FA_LDQ, FA_NT, Q_VEC>(sQ + buf * FA_BMQ * FA_LDQ, Qg, Q_S3, [&](int r) -> i64 {
            const i64 i = i0 + r;
            return i < lq ? fa_start(A, FA_RG_Q, bi, Q_S0) + h * Q_S1 + i * Q_S2 : (i64)-1;
        });
        fa_load<FA_BMQ, FA_DV, FA_DVR, FA_LDV, FA_NT, DO_VEC>(sO + buf * FA_BMQ * FA_LDV, DOg, DO_S3, [&](int r) -> i64 {
            const i64 i = i0 + r;
            return i < lq ? fa_start(A, FA_RG_DO, bi, DO_S0) + h * DO_S1 + i * DO_S2 : (i64)-1;
        });
        for (int r = threadIdx.x; r < FA_BMQ; r += FA_NT) {
            const i64 i = i0 + r;
            const bool ok = i < lq;
            sL[buf * FA_BMQ + r] = ok ? fa_lse2(LD_STATS(stats_p, fa_start(A, FA_RG_ST, bi, ST_S0) + h * ST_S1 + i * ST_S2)) : 0.0f;
            sD[buf * FA_BMQ + r] = ok ? dbuf[(bi * FA_HQ + h) * FA_SQ + i] : 0.0f;
        }
    };
    if (total > 0) load_q(0, 0);
    fa_commit();

    float dk[FA_CW / 8][4], dv[FA_CWV / 8][4];
    #pragma unroll
    for (int n = 0; n < FA_CW / 8; ++n) { dk[n][0] = 0.0f; dk[n][1] = 0.0f; dk[n][2] = 0.0f; dk[n][3] = 0.0f; }
    #pragma unroll
    for (int n = 0; n < FA_CWV / 8; ++n) { dv[n][0] = 0.0f; dv[n][1] = 0.0f; dv[n][2] = 0.0f; dv[n][3] = 0.0f; }
    const u16* sKw = sK + (warp * 16 + (lane & 15)) * FA_LDK + (lane >> 4) * 8;
    const u16* sVw = sV + (warp * 16 + (lane & 15)) * FA_LDV + (lane >> 4) * 8;

    for (i64 it = 0; it < total; ++it) {
        const int buf = (int)(it & 1);
        if (it + 1 < total) {
            load_q(it + 1, buf ^ 1);
            fa_commit();
            fa_wait<1>();
        } else {
            fa_wait<0>();
        }
        __syncthreads();
        const i64 h = kh * FA_GROUP + it / nq;
        const i64 i0 = (qa + it % nq) * FA_BMQ;
        const u16* sQb = sQ + buf * FA_BMQ * FA_LDQ;
        const u16* sOb = sO + buf * FA_BMQ * FA_LDV;
        const float* sLb = sL + buf * FA_BMQ;
        const float* sDb = sD + buf * FA_BMQ;

        // S^T = K Q^T and dP^T = V dO^T: 16 keys x BMQ rows per warp.
        float sacc[FA_BMQ / 8][4], pacc[FA_BMQ / 8][4];
        #pragma unroll
        for (int n = 0; n < FA_BMQ / 8; ++n) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) { sacc[n][e] = 0.0f; pacc[n][e] = 0.0f; }
        }
        #pragma unroll
        for (int kk = 0; kk < FA_D / 16; ++kk) {
            u32 a[4];
            fa_ldsm(a, sKw + kk * 16);
            #pragma unroll
            for (int nn = 0; nn < FA_BMQ / 16; ++nn) {
                u32 b[4];
                fa_ldsm(b, sQb + (nn * 16 + (lane & 7) + ((lane >> 4) << 3)) * FA_LDQ + kk * 16 + ((lane >> 3) & 1) * 8);
                fa_mma(sacc[2 * nn], a, b[0], b[1]);
                fa_mma(sacc[2 * nn + 1], a, b[2], b[3]);
            }
        }
        #pragma unroll
        for (int kk = 0; kk < FA_DV / 16; ++kk) {
            u32 a[4];
            fa_ldsm(a, sVw + kk * 16);
            #pragma unroll
            for (int nn = 0; nn < FA_BMQ / 16; ++nn) {
                u32 b[4];
                fa_ldsm(b, sOb + (nn * 16 + (lane & 7) + ((lane >> 4) << 3)) * FA_LDV + kk * 16 + ((lane >> 3) & 1) * 8);
                fa_mma(pacc[2 * nn], a, b[0], b[1]);
                fa_mma(pacc[2 * nn + 1], a, b[2], b[3]);
            }
        }

        // P^T (with the dropout factor) into sacc, dS^T * scale into pacc.
        const bool need = fa_tile_needs_mask(i0, FA_BMQ, j0, FA_BNK, lq, lkv, off);
        #pragma unroll
        for (int n = 0; n < FA_BMQ / 8; ++n) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                const i64 j = j0 + warp * 16 + g + (e >> 1) * 8;
                const int col = n * 8 + tg * 2 + (e & 1);
                const i64 i = i0 + col;
                float pk = 0.0f, ds = 0.0f;
                if (!need || fa_visible(i, j, lq, lkv, off)) {
                    float s2 = sacc[n][e] * A.scale_log2;
#if FA_HAS_BIAS || FA_ALIBI
                    s2 = fmaf(fa_add(A, bi, h, i, j), FA_LOG2E, s2);
#endif
                    const float p = fa_exp2(s2 - sLb[col]);
                    float dp = pacc[n][e];
#if FA_DROPOUT
                    if (fa_keep(A, bi, h, i, j)) {
                        pk = p * A.keep_scale;
                        dp *= A.keep_scale;
                    } else {
                        dp = 0.0f;
                    }
#else
                    pk = p;
#endif
                    ds = p * (dp - sDb[col]);
                }
                sacc[n][e] = pk;
                pacc[n][e] = ds * A.scale;
            }
        }
        (void)h;

        // dV[:, chunk] += P^T dO[:, chunk]; dK[:, chunk] += dS^T Q[:, chunk].
        #pragma unroll
        for (int ks = 0; ks < FA_BMQ / 16; ++ks) {
            u32 a[4];
            a[0] = fa_pack(sacc[2 * ks][0], sacc[2 * ks][1]);
            a[1] = fa_pack(sacc[2 * ks][2], sacc[2 * ks][3]);
            a[2] = fa_pack(sacc[2 * ks + 1][0], sacc[2 * ks + 1][1]);
            a[3] = fa_pack(sacc[2 * ks + 1][2], sacc[2 * ks + 1][3]);
            #pragma unroll
            for (int nd = 0; nd < FA_CWV / 16; ++nd) {
                u32 b[4];
                fa_ldsm_t(b, sOb + (ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * FA_LDV + chunk * FA_CWV + nd * 16 + (lane >> 4) * 8);
                fa_mma(dv[2 * nd], a, b[0], b[1]);
                fa_mma(dv[2 * nd + 1], a, b[2], b[3]);
            }
            a[0] = fa_pack(pacc[2 * ks][0], pacc[2 * ks][1]);
            a[1] = fa_pack(pacc[2 * ks][2], pacc[2 * ks][3]);
            a[2] = fa_pack(pacc[2 * ks + 1][0], pacc[2 * ks + 1][1]);
            a[3] = fa_pack(pacc[2 * ks + 1][2], pacc[2 * ks + 1][3]);
            #pragma unroll
            for (int nd = 0; nd < FA_CW / 16; ++nd) {
                u32 b[4];
                fa_ldsm_t(b, sQb + (ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * FA_LDQ + chunk * FA_CW + nd * 16 + (lane >> 4) * 8);
                fa_mma(dk[2 * nd], a, b[0], b[1]);
                fa_mma(dk[2 * nd + 1], a, b[2], b[3]);
            }
        }
        __syncthreads();
    }
    fa_wait<0>();

    #pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const i64 j = j0 + warp * 16 + g + hh * 8;
        if (j < FA_SKV && fa_has_row(FA_RG_DK, j, lkv)) {
            const i64 kb = fa_start(A, FA_RG_DK, bi, DK_S0) + kh * DK_S1 + j * DK_S2;
            #pragma unroll
            for (int n = 0; n < FA_CW / 8; ++n) {
                const i64 c = chunk * FA_CW + n * 8 + tg * 2;
                if (c < FA_DR) fa_store_dk(dk_p, kb + c * DK_S3, dk[n][2 * hh], dk[n][2 * hh + 1]);
            }
        }
        if (j < FA_SKV && fa_has_row(FA_RG_DV, j, lkv)) {
            const i64 vb = fa_start(A, FA_RG_DV, bi, DV_S0) + kh * DV_S1 + j * DV_S2;
            #pragma unroll
            for (int n = 0; n < FA_CWV / 8; ++n) {
                const i64 c = chunk * FA_CWV + n * 8 + tg * 2;
                if (c < FA_DVR) fa_store_dv(dv_p, vb + c * DV_S3, dv[n][2 * hh], dv[n][2 * hh + 1]);
            }
        }
    }
}
