// The sm_80 backward's dQ kernel (attention/bwd.rs): a CTA per (q tile, query head, batch, column
// chunk), 16 rows per warp, looping over the K/V tiles its rows see (double-buffered cp.async):
// S = Q K^T and dP = dO V^T recomputed, P = exp2(S - lse), dS = P (dP - D), dQ += dS K; dS
// stored for dbias (chunk 0).
//
// Reads common.cuh's defines and:
//   FA_NT, FA_BM, FA_BN, FA_NCH, FA_CW, FA_LDQ   threads, rows, keys per tile, column chunks
//                                                and their width, the Q tile's row stride
//   DO_S0..3, DO_VEC, LD_STATS, ST_S0..2          dO and the stats
//   DQ_S0..3, DQ_PAIR, ST_DQ                      dq's strides and store
//   FA_DBIAS (ST_DB, DB_S0..3)                    where dS goes for dbias (0: nowhere)

FA_DEFINE_STORE(dq, DQ_PAIR, ST_DQ, DQ_S3)

extern "C" __global__ void __launch_bounds__(FA_NT) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    extern __shared__ __align__(16) unsigned char fa_smem[];
    u16* sQ = reinterpret_cast<u16*>(fa_smem);
    u16* sO = sQ + FA_BM * FA_LDQ;
    u16* sK = sO + FA_BM * FA_LDV;
    u16* sV = sK + 2 * FA_BN * FA_LDK;
    FA_INIT
    const u16* Qg = reinterpret_cast<const u16*>(q_p);
    const u16* Kg = reinterpret_cast<const u16*>(k_p);
    const u16* Vg = reinterpret_cast<const u16*>(v_p);
    const u16* DOg = reinterpret_cast<const u16*>(do_p);
    const float* dbuf = reinterpret_cast<const float*>(dbuf_p);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
    const int chunk = (int)(blockIdx.x % FA_NCH);
    const i64 qt = (i64)(gridDim.x / FA_NCH) - 1 - (i64)(blockIdx.x / FA_NCH);
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
    fa_load<FA_BM, FA_DV, FA_DVR, FA_LDV, FA_NT, DO_VEC>(sO, DOg, DO_S3, [&](int r) -> i64 {
        const i64 i = q0 + r;
        return i < lq ? fa_start(A, FA_RG_DO, bi, DO_S0) + h * DO_S1 + i * DO_S2 : (i64)-1;
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

    // lse (log2 units) and D of rows g and g + 8 of the warp.
    float lse2[2], dd[2];
    #pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const i64 i = q0 + warp * 16 + g + hh * 8;
        const bool ok = i < lq;
        lse2[hh] = ok ? fa_lse2(LD_STATS(stats_p, fa_start(A, FA_RG_ST, bi, ST_S0) + h * ST_S1 + i * ST_S2)) : 0.0f;
        dd[hh] = ok ? dbuf[(bi * FA_HQ + h) * FA_SQ + i] : 0.0f;
    }
    float acc[FA_CW / 8][4];
    #pragma unroll
    for (int n = 0; n < FA_CW / 8; ++n) { acc[n][0] = 0.0f; acc[n][1] = 0.0f; acc[n][2] = 0.0f; acc[n][3] = 0.0f; }
    const u16* sQw = sQ + (warp * 16 + (lane & 15)) * FA_LDQ + (lane >> 4) * 8;
    const u16* sOw = sO + (warp * 16 + (lane & 15)) * FA_LDV + (lane >> 4) * 8;

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
        const u16* sKb = sK + buf * FA_BN * FA_LDK;
        const u16* sVb = sV + buf * FA_BN * FA_LDV;

        // S = Q K^T and dP = dO V^T: 16 rows x BN keys per warp.
        float sacc[FA_BN / 8][4], pacc[FA_BN / 8][4];
        #pragma unroll
        for (int n = 0; n < FA_BN / 8; ++n) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) { sacc[n][e] = 0.0f; pacc[n][e] = 0.0f; }
        }
        #pragma unroll
        for (int kk = 0; kk < FA_D / 16; ++kk) {
            u32 a[4];
            fa_ldsm(a, sQw + kk * 16);
            #pragma unroll
            for (int nn = 0; nn < FA_BN / 16; ++nn) {
                u32 b[4];
                fa_ldsm(b, sKb + (nn * 16 + (lane & 7) + ((lane >> 4) << 3)) * FA_LDK + kk * 16 + ((lane >> 3) & 1) * 8);
                fa_mma(sacc[2 * nn], a, b[0], b[1]);
                fa_mma(sacc[2 * nn + 1], a, b[2], b[3]);
            }
        }
        #pragma unroll
        for (int kk = 0; kk < FA_DV / 16; ++kk) {
            u32 a[4];
            fa_ldsm(a, sOw + kk * 16);
            #pragma unroll
            for (int nn = 0; nn < FA_BN / 16; ++nn) {
                u32 b[4];
                fa_ldsm(b, sVb + (nn * 16 + (lane & 7) + ((lane >> 4) << 3)) * FA_LDV + kk * 16 + ((lane >> 3) & 1) * 8);
                fa_mma(pacc[2 * nn], a, b[0], b[1]);
                fa_mma(pacc[2 * nn + 1], a, b[2], b[3]);
            }
        }

        // dS = P (dP - D), P = exp2(S - lse); masked elements 0. sacc becomes dS * scale.
        const i64 j0 = t * FA_BN;
        const bool need = fa_tile_needs_mask(q0, FA_BM, j0, FA_BN, lq, lkv, off);
        #pragma unroll
        for (int n = 0; n < FA_BN / 8; ++n) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                const i64 i = q0 + warp * 16 + g + (e >> 1) * 8;
                const i64 j = j0 + n * 8 + tg * 2 + (e & 1);
                float ds = 0.0f;
                if (!need || fa_visible(i, j, lq, lkv, off)) {
                    float s2 = sacc[n][e] * A.scale_log2;
#if FA_HAS_BIAS || FA_ALIBI
                    s2 = fmaf(fa_add(A, bi, h, i, j), FA_LOG2E, s2);
#endif
                    const float p = fa_exp2(s2 - lse2[e >> 1]);
                    float dp = pacc[n][e];
#if FA_DROPOUT
                    dp = fa_keep(A, bi, h, i, j) ? dp * A.keep_scale : 0.0f;
#endif
                    ds = p * (dp - dd[e >> 1]);
#if FA_DBIAS == 1
                    if (chunk == 0) ST_DB(db_p, bi * DB_S0 + h * DB_S1 + i * DB_S2 + j * DB_S3, (double)ds);
#elif FA_DBIAS == 2
                    if (chunk == 0) reinterpret_cast<float*>(db_p)[((bi * FA_HQ + h) * FA_SQ + i) * FA_SKV + j] = ds;
#endif
                }
                sacc[n][e] = ds * A.scale;
            }
        }

        // dQ[:, chunk] += dS K[:, chunk] (K through ldmatrix.trans).
        #pragma unroll
        for (int kt = 0; kt < FA_BN / 16; ++kt) {
            u32 a[4];
            a[0] = fa_pack(sacc[2 * kt][0], sacc[2 * kt][1]);
            a[1] = fa_pack(sacc[2 * kt][2], sacc[2 * kt][3]);
            a[2] = fa_pack(sacc[2 * kt + 1][0], sacc[2 * kt + 1][1]);
            a[3] = fa_pack(sacc[2 * kt + 1][2], sacc[2 * kt + 1][3]);
            #pragma unroll
            for (int nd = 0; nd < FA_CW / 16; ++nd) {
                u32 b[4];
                fa_ldsm_t(b, sKb + (kt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * FA_LDK + chunk * FA_CW + nd * 16 + (lane >> 4) * 8);
                fa_mma(acc[2 * nd], a, b[0], b[1]);
                fa_mma(acc[2 * nd + 1], a, b[2], b[3]);
            }
        }
        __syncthreads();
    }
    fa_wait<0>();

    #pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const i64 i = q0 + warp * 16 + g + hh * 8;
        if (i < FA_SQ && fa_has_row(FA_RG_DQ, i, lq)) {
            const i64 ob = fa_start(A, FA_RG_DQ, bi, DQ_S0) + h * DQ_S1 + i * DQ_S2;
            #pragma unroll
            for (int n = 0; n < FA_CW / 8; ++n) {
                const i64 c = chunk * FA_CW + n * 8 + tg * 2;
                if (c < FA_DR) fa_store_dq(dq_p, ob + c * DQ_S3, acc[n][2 * hh], acc[n][2 * hh + 1]);
            }
        }
    }
}
