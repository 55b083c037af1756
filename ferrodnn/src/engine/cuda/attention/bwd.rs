//! The backward kernels (FlashAttention-2, deterministic: every output element is written by
//! exactly one thread, no atomics).
//!
//! 1. `D_i = do_i . o_i`, a warp per query row, into f32 scratch 0.
//! 2. With dbias: zero the dS target (dbias itself when it has the scores' dims, else an f32
//!    scratch `[b, h_q, s_q, s_kv]`): masked and skipped elements stay 0.
//! 3. dQ: a CTA per (q tile of 64 rows, query head, batch, column chunk); each warp owns 16
//!    rows, loops over the K/V tiles the rows see (double-buffered cp.async), recomputes
//!    S = Q K^T and dP = dO V^T on tensor cores, P = exp2(S - lse), dS = P (dP - D), and adds
//!    dS K into its dQ accumulators; it also stores dS (chunk 0) for dbias.
//! 4. dK/dV: a CTA per (K/V tile of 64 keys, kv head, batch, column chunk); each warp owns 16
//!    keys, loops over the query heads sharing the kv head and their q tiles (Q, dO, lse and D
//!    double-buffered), recomputes S^T = K Q^T and dP^T = V dO^T, and adds P^T dO into dV and
//!    dS^T Q into dK.
//! 5. With a dbias broadcast over batch or heads: the dS scratch summed over those dims, in the
//!    CPU's order, a thread per dbias element.
//!
//! Head dims above 128 split the dQ (dK/dV) columns into two chunks, each CTA recomputing the
//! scores for its half (the accumulators of a whole 256-wide row would not fit in registers).
//! Not taken (`None`, the fallback runs): paged K/V (a pool block may gather gradients from
//! several pages), a bias broadcast over query rows or keys when dbias is wanted.

use super::{fa_init, max_shared, Common, Problem, HELPERS};
use crate::engine::cuda::kernel::ctype::{ld, st};
use crate::engine::cuda::kernel::{Arg, Grid, Launch, NodeKernels, Pdl, Target, Unaligned, Unit};
use crate::graph::TensorId;

/// D_i = do_i . o_i, a warp per row (grid-stride).
const ROW_D: &str = r#"
{
    float* dbuf = reinterpret_cast<float*>(dbuf_p);
    const int lane = threadIdx.x & 31;
    const i64 nwarps = (i64)gridDim.x * (blockDim.x >> 5);
    for (i64 r = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < FA_B * FA_HQ * FA_SQ; r += nwarps) {
        const i64 i = r % FA_SQ, h = (r / FA_SQ) % FA_HQ, bi = r / (FA_SQ * FA_HQ);
        const i64 ob = bi * OI_S0 + h * OI_S1 + i * OI_S2, db = bi * DO_S0 + h * DO_S1 + i * DO_S2;
        float acc = 0.0f;
        for (int c = lane; c < FA_DV; c += 32) acc += (float)LD_OI(o_p, ob + c * OI_S3) * (float)LD_DO(do_p, db + c * DO_S3);
        acc += __shfl_xor_sync(0xffffffffu, acc, 16);
        acc += __shfl_xor_sync(0xffffffffu, acc, 8);
        acc += __shfl_xor_sync(0xffffffffu, acc, 4);
        acc += __shfl_xor_sync(0xffffffffu, acc, 2);
        acc += __shfl_xor_sync(0xffffffffu, acc, 1);
        if (lane == 0) dbuf[r] = acc;
    }
}
"#;

/// Zero the dS target: dbias (FA_DBIAS 1) or the f32 scratch (2).
const ZERO_DS: &str = r#"
{
    GRID_STRIDE(e, FA_B * FA_HQ * FA_SQ * FA_SKV) {
#if FA_DBIAS == 1
        const i64 j = e % FA_SKV, i = (e / FA_SKV) % FA_SQ, h = (e / (FA_SKV * FA_SQ)) % FA_HQ, bi = e / (FA_SKV * FA_SQ * FA_HQ);
        ST_DB(db_p, bi * DB_S0 + h * DB_S1 + i * DB_S2 + j * DB_S3, 0.0);
#else
        reinterpret_cast<float*>(db_p)[e] = 0.0f;
#endif
    }
}
"#;

/// dbias from the dS scratch, summed over the broadcast batch / head dims (batch outer).
const REDUCE_DS: &str = r#"
{
    const float* ds = reinterpret_cast<const float*>(ds_p);
    GRID_STRIDE(e, DB_D0 * DB_D1 * FA_SQ * FA_SKV) {
        const i64 j = e % FA_SKV, i = (e / FA_SKV) % FA_SQ, hb = (e / (FA_SKV * FA_SQ)) % DB_D1, bb = e / (FA_SKV * FA_SQ * DB_D1);
        double sum = 0.0;
        for (i64 bi = (DB_D0 == 1 ? 0 : bb); bi < (DB_D0 == 1 ? FA_B : bb + 1); ++bi)
            for (i64 h = (DB_D1 == 1 ? 0 : hb); h < (DB_D1 == 1 ? FA_HQ : hb + 1); ++h)
                sum += (double)ds[((bi * FA_HQ + h) * FA_SQ + i) * FA_SKV + j];
        ST_DB(db_p, bb * DB_S0 + hb * DB_S1 + i * DB_S2 + j * DB_S3, sum);
    }
}
"#;

/// dQ (and dS for dbias).
const DQ: &str = r#"
{
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

    fa_load<FA_BM, FA_D, FA_LDQ, FA_NT, Q_VEC>(sQ, Qg, Q_S3, [&](int r) -> i64 {
        const i64 i = q0 + r;
        return i < lq ? bi * Q_S0 + h * Q_S1 + i * Q_S2 : (i64)-1;
    });
    fa_load<FA_BM, FA_DV, FA_LDV, FA_NT, DO_VEC>(sO, DOg, DO_S3, [&](int r) -> i64 {
        const i64 i = q0 + r;
        return i < lq ? bi * DO_S0 + h * DO_S1 + i * DO_S2 : (i64)-1;
    });
    auto load_kv = [&](i64 t, int buf) {
        const i64 j0 = t * FA_BN;
        fa_load<FA_BN, FA_D, FA_LDK, FA_NT, K_VEC>(sK + buf * FA_BN * FA_LDK, Kg, K_S3, [&](int r) -> i64 {
            const i64 j = j0 + r;
            return j < lkv ? fa_krow(A, bi, kh, j) : (i64)-1;
        });
        fa_load<FA_BN, FA_DV, FA_LDV, FA_NT, V_VEC>(sV + buf * FA_BN * FA_LDV, Vg, V_S3, [&](int r) -> i64 {
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
        lse2[hh] = ok ? (float)LD_STATS(stats_p, bi * ST_S0 + h * ST_S1 + i * ST_S2) * FA_LOG2E : 0.0f;
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
                    float s2 = sacc[n][e] * FA_SCALE_LOG2;
#if FA_HAS_BIAS || FA_ALIBI
                    s2 = fmaf(fa_add(A, bi, h, i, j), FA_LOG2E, s2);
#endif
                    const float p = fa_exp2(s2 - lse2[e >> 1]);
                    float dp = pacc[n][e];
#if FA_DROPOUT
                    dp = fa_keep(A, bi, h, i, j) ? dp * FA_KEEP_SCALE : 0.0f;
#endif
                    ds = p * (dp - dd[e >> 1]);
#if FA_DBIAS == 1
                    if (chunk == 0) ST_DB(db_p, bi * DB_S0 + h * DB_S1 + i * DB_S2 + j * DB_S3, (double)ds);
#elif FA_DBIAS == 2
                    if (chunk == 0) reinterpret_cast<float*>(db_p)[((bi * FA_HQ + h) * FA_SQ + i) * FA_SKV + j] = ds;
#endif
                }
                sacc[n][e] = ds * FA_SCALE;
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
        if (i < FA_SQ) {
            const i64 ob = bi * DQ_S0 + h * DQ_S1 + i * DQ_S2;
            #pragma unroll
            for (int n = 0; n < FA_CW / 8; ++n) {
                const i64 c = chunk * FA_CW + n * 8 + tg * 2;
                fa_store_dq(dq_p, ob + c * DQ_S3, acc[n][2 * hh], acc[n][2 * hh + 1]);
            }
        }
    }
}
"#;

/// dK and dV.
const DKDV: &str = r#"
{
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

    fa_load<FA_BNK, FA_D, FA_LDK, FA_NT, K_VEC>(sK, Kg, K_S3, [&](int r) -> i64 {
        const i64 j = j0 + r;
        return j < lkv ? fa_krow(A, bi, kh, j) : (i64)-1;
    });
    fa_load<FA_BNK, FA_DV, FA_LDV, FA_NT, V_VEC>(sV, Vg, V_S3, [&](int r) -> i64 {
        const i64 j = j0 + r;
        return j < lkv ? fa_vrow(A, bi, kh, j) : (i64)-1;
    });
    // Step `it`: query head kh * GROUP + it / nq, q tile qa + it % nq.
    auto load_q = [&](i64 it, int buf) {
        const i64 h = kh * FA_GROUP + it / nq;
        const i64 i0 = (qa + it % nq) * FA_BMQ;
        fa_load<FA_BMQ, FA_D, FA_LDQ, FA_NT, Q_VEC>(sQ + buf * FA_BMQ * FA_LDQ, Qg, Q_S3, [&](int r) -> i64 {
            const i64 i = i0 + r;
            return i < lq ? bi * Q_S0 + h * Q_S1 + i * Q_S2 : (i64)-1;
        });
        fa_load<FA_BMQ, FA_DV, FA_LDV, FA_NT, DO_VEC>(sO + buf * FA_BMQ * FA_LDV, DOg, DO_S3, [&](int r) -> i64 {
            const i64 i = i0 + r;
            return i < lq ? bi * DO_S0 + h * DO_S1 + i * DO_S2 : (i64)-1;
        });
        for (int r = threadIdx.x; r < FA_BMQ; r += FA_NT) {
            const i64 i = i0 + r;
            const bool ok = i < lq;
            sL[buf * FA_BMQ + r] = ok ? (float)LD_STATS(stats_p, bi * ST_S0 + h * ST_S1 + i * ST_S2) * FA_LOG2E : 0.0f;
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
                    float s2 = sacc[n][e] * FA_SCALE_LOG2;
#if FA_HAS_BIAS || FA_ALIBI
                    s2 = fmaf(fa_add(A, bi, h, i, j), FA_LOG2E, s2);
#endif
                    const float p = fa_exp2(s2 - sLb[col]);
                    float dp = pacc[n][e];
#if FA_DROPOUT
                    if (fa_keep(A, bi, h, i, j)) {
                        pk = p * FA_KEEP_SCALE;
                        dp *= FA_KEEP_SCALE;
                    } else {
                        dp = 0.0f;
                    }
#else
                    pk = p;
#endif
                    ds = p * (dp - sDb[col]);
                }
                sacc[n][e] = pk;
                pacc[n][e] = ds * FA_SCALE;
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
        if (j < FA_SKV) {
            const i64 kb = bi * DK_S0 + kh * DK_S1 + j * DK_S2;
            #pragma unroll
            for (int n = 0; n < FA_CW / 8; ++n) {
                const i64 c = chunk * FA_CW + n * 8 + tg * 2;
                fa_store_dk(dk_p, kb + c * DK_S3, dk[n][2 * hh], dk[n][2 * hh + 1]);
            }
            const i64 vb = bi * DV_S0 + kh * DV_S1 + j * DV_S2;
            #pragma unroll
            for (int n = 0; n < FA_CWV / 8; ++n) {
                const i64 c = chunk * FA_CWV + n * 8 + tg * 2;
                fa_store_dv(dv_p, vb + c * DV_S3, dv[n][2 * hh], dv[n][2 * hh + 1]);
            }
        }
    }
}
"#;

/// Where dS goes for dbias.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Dbias {
    None,
    /// Straight into dbias (it has the scores' dims).
    Direct,
    /// Into f32 scratch 1, then summed over the broadcast batch / head dims.
    Scratch,
}

const NW: i64 = 4;

/// dQ tiles: (BM, BN, chunks).
fn dq_tiles(p: &Problem) -> (i64, i64, i64) {
    let dmax = p.d.max(p.d_v);
    (NW * 16, if dmax <= 128 { 64 } else { 32 }, if p.d > 128 { 2 } else { 1 })
}

/// dK/dV tiles: (BNK, BMQ, chunks).
fn dkdv_tiles(p: &Problem) -> (i64, i64, i64) {
    let dmax = p.d.max(p.d_v);
    (NW * 16, if dmax <= 64 { 64 } else { 32 }, if dmax > 128 { 2 } else { 1 })
}

fn dq_shared(p: &Problem) -> usize {
    let (bm, bn, _) = dq_tiles(p);
    (2 * (bm * (p.d + 8) + bm * (p.d_v + 8) + 2 * bn * (p.d + 8) + 2 * bn * (p.d_v + 8))) as usize
}

fn dkdv_shared(p: &Problem) -> usize {
    let (bnk, bmq, _) = dkdv_tiles(p);
    (2 * (bnk * (p.d + 8) + bnk * (p.d_v + 8) + 2 * bmq * (p.d + 8) + 2 * bmq * (p.d_v + 8)) + 16 * bmq) as usize
}

/// The tensors of a backward node.
pub(super) struct Ports {
    pub o: TensorId,
    pub d_o: TensorId,
    pub stats: TensorId,
    pub dq: TensorId,
    pub dk: TensorId,
    pub dv: TensorId,
    pub dbias: Option<TensorId>,
}

pub(super) fn strides_def(p: &Problem, prefix: &str, t: TensorId) -> String {
    p.graph.desc(t).strides.iter().enumerate().map(|(i, s)| format!("#define {prefix}_S{i} {s}LL\n")).collect()
}

/// One launch: `defs` (node + kernel defines), HELPERS, `extra` (functions using HELPERS), then
/// the kernel with the given parameters and body.
#[allow(clippy::too_many_arguments)]
pub(super) fn launch(
    p: &Problem,
    defs: &str,
    extra: &str,
    what: &str,
    params: &[String],
    args: Vec<Arg>,
    body: &str,
    grid: Option<(i64, i64, i64)>,
    threads: u64,
    block: u32,
    shared: usize,
) -> Option<Launch> {
    let entry = p.entry(what);
    let source = format!("{defs}{HELPERS}{extra}\nextern \"C\" __global__ void __launch_bounds__({block}) {entry}({})\n{body}", params.join(", "));
    let exact_grid = match grid {
        Some((x, y, z)) => {
            if x > i32::MAX as i64 {
                return None;
            }
            Some((x as u32, y as u32, z as u32))
        }
        None => None,
    };
    Some(Launch {
        source,
        entry,
        grid: match exact_grid {
            Some((x, y, z)) => Grid::Exact(x, y, z),
            None => Grid::Cover(threads),
        },
        block,
        shared_bytes: shared as u32,
        args,
        cluster: None,
        pdl: Pdl::Dependent,
    })
}

/// The `#define`s every backward launch shares: the node's (`c`), dO's strides, the dbias
/// mode and target, the stats loader.
pub(super) fn base_defines(p: &Problem, ports: &Ports, c: &Common, mode: Dbias, vec: bool) -> String {
    let g = p.graph;
    let flag = |b: bool| if b { "1" } else { "0" };
    let mut base = c.defines.clone();
    base += &strides_def(p, "DO", ports.d_o);
    base += &format!("#define DO_VEC {}\n", flag(vec && p.vec_ok(ports.d_o)));
    base += &format!("#define FA_LDQ {}\n#define FA_NT {}\n", p.d + 8, NW * 32);
    base += &format!(
        "#define FA_DBIAS {}\n",
        match mode {
            Dbias::None => 0,
            Dbias::Direct => 1,
            Dbias::Scratch => 2,
        }
    );
    if let Some(db) = ports.dbias {
        base += &strides_def(p, "DB", db);
        let d = &g.desc(db).dims;
        base += &format!("#define ST_DB {}\n#define DB_D0 {}LL\n#define DB_D1 {}LL\n", st(g, db), d[0], d[1]);
    }
    let sd = g.desc(ports.stats);
    base += &format!("#define LD_STATS {}\n#define ST_S0 {}LL\n#define ST_S1 {}LL\n#define ST_S2 {}LL\n", ld(g, ports.stats), sd.strides[0], sd.strides[1], sd.strides[2]);
    base
}

/// The launch of `D_i = do_i . o_i` into f32 scratch 0.
pub(super) fn d_launch(p: &Problem, ports: &Ports, base: &str, vec: bool) -> Option<Launch> {
    let g = p.graph;
    let rows = (p.b * p.h_q * p.s_q) as u64;
    let d_defs = format!("{base}{}#define LD_OI {}\n#define LD_DO {}\n", strides_def(p, "OI", ports.o), ld(g, ports.o), ld(g, ports.d_o));
    launch(
        p,
        &d_defs,
        "",
        if vec { "attn_bwd_d" } else { "attn_bwd_d_unaligned" },
        &["void* dbuf_p".into(), "const void* o_p".into(), "const void* do_p".into()],
        vec![Arg::Scratch(0), Arg::Ptr(ports.o), Arg::Ptr(ports.d_o)],
        ROW_D,
        None,
        rows * 32,
        256,
        0,
    )
}

pub(super) fn generate(p: &Problem, ports: &Ports, mode: Dbias, vec: bool) -> Option<NodeKernels> {
    let g = p.graph;
    let c = p.common(vec);
    let base = base_defines(p, ports, &c, mode, vec);
    let init = fa_init(&c);
    let rows = (p.b * p.h_q * p.s_q) as u64;
    let scores = (p.b * p.h_q * p.s_q * p.s_kv) as u64;
    let mut launches = vec![d_launch(p, ports, &base, vec)?];

    // 2. Zero the dS target.
    let ds_arg = match mode {
        Dbias::Direct => ports.dbias.map(Arg::Ptr),
        Dbias::Scratch => Some(Arg::Scratch(1)),
        Dbias::None => None,
    };
    if let Some(a) = &ds_arg {
        launches.push(launch(p, &base, "", if vec { "attn_bwd_zero" } else { "attn_bwd_zero_unaligned" }, &["void* db_p".into()], vec![a.clone()], ZERO_DS, None, scores, 256, 0)?);
    }

    // 3. dQ.
    let (bm, bn, nch) = dq_tiles(p);
    let cw = p.d / nch;
    let dq_defs = format!("{base}#define FA_BM {bm}\n#define FA_BN {bn}\n#define FA_NCH {nch}\n#define FA_CW {cw}\n");
    let dq_store = p.output_store("dq", "DQ", ports.dq, vec && p.pair_ok(ports.dq));
    let mut params: Vec<String> = vec!["void* dq_p".into()];
    let mut args = vec![Arg::Ptr(ports.dq)];
    if let Some(a) = &ds_arg {
        params.push("void* db_p".into());
        args.push(a.clone());
    }
    let inputs = |params: &mut Vec<String>, args: &mut Vec<Arg>| {
        params.extend(["const void* dbuf_p", "const void* q_p", "const void* k_p", "const void* v_p", "const void* do_p", "const void* stats_p"].map(String::from));
        args.extend([Arg::Scratch(0), Arg::Ptr(p.q), Arg::Ptr(p.k), Arg::Ptr(p.v), Arg::Ptr(ports.d_o), Arg::Ptr(ports.stats)]);
        params.extend(c.params.iter().cloned());
        args.extend(c.args.iter().cloned());
    };
    inputs(&mut params, &mut args);
    let nqt = (p.s_q + bm - 1) / bm;
    launches.push(launch(
        p,
        &dq_defs,
        &dq_store,
        if vec { "attn_bwd_dq" } else { "attn_bwd_dq_unaligned" },
        &params,
        args,
        &DQ.replace("FA_INIT", &init),
        Some((nqt * nch, p.h_q, p.b)),
        0,
        (NW * 32) as u32,
        dq_shared(p),
    )?);

    // 4. dK, dV.
    let (bnk, bmq, nch) = dkdv_tiles(p);
    let (cw, cwv) = (p.d / nch, p.d_v / nch);
    let kv_defs = format!("{base}#define FA_BNK {bnk}\n#define FA_BMQ {bmq}\n#define FA_NCH {nch}\n#define FA_CW {cw}\n#define FA_CWV {cwv}\n");
    let kv_store = format!("{}{}", p.output_store("dk", "DK", ports.dk, vec && p.pair_ok(ports.dk)), p.output_store("dv", "DV", ports.dv, vec && p.pair_ok(ports.dv)));
    let mut params: Vec<String> = vec!["void* dk_p".into(), "void* dv_p".into()];
    let mut args = vec![Arg::Ptr(ports.dk), Arg::Ptr(ports.dv)];
    inputs(&mut params, &mut args);
    let nkt = (p.s_kv + bnk - 1) / bnk;
    launches.push(launch(
        p,
        &kv_defs,
        &kv_store,
        if vec { "attn_bwd_dkdv" } else { "attn_bwd_dkdv_unaligned" },
        &params,
        args,
        &DKDV.replace("FA_INIT", &init),
        Some((nkt * nch, p.h_kv, p.b)),
        0,
        (NW * 32) as u32,
        dkdv_shared(p),
    )?);

    // 5. dbias from the scratch.
    if let (Dbias::Scratch, Some(db)) = (mode, ports.dbias) {
        let n = g.desc(db).element_count().max(0) as u64;
        launches.push(launch(
            p,
            &base,
            "",
            if vec { "attn_bwd_dbias" } else { "attn_bwd_dbias_unaligned" },
            &["void* db_p".into(), "const void* ds_p".into()],
            vec![Arg::Ptr(db), Arg::Scratch(1)],
            REDUCE_DS,
            None,
            n,
            256,
            0,
        )?);
    }
    let mut scratch = vec![(rows as usize).max(1) * 4];
    if mode == Dbias::Scratch {
        scratch.push((scores as usize).max(1) * 4);
    }
    Some(NodeKernels { launches, scratch })
}

pub(super) fn unit(p: &Problem, target: &Target) -> Option<Unit> {
    if p.paged.is_some() {
        return None;
    }
    let node = p.node;
    let ports = Ports {
        o: node.input("o")?,
        d_o: node.input("do")?,
        stats: node.input("stats")?,
        dq: node.output("dq")?,
        dk: node.output("dk")?,
        dv: node.output("dv")?,
        dbias: node.output("dbias"),
    };
    let (_, _, nch) = dkdv_tiles(p);
    if nch == 2 && (p.d % 32 != 0 || p.d_v % 32 != 0) {
        return None;
    }
    if dq_shared(p).max(dkdv_shared(p)) > max_shared(target) {
        return None;
    }
    let mode = match (ports.dbias, p.bias) {
        (Some(db), Some(_)) => {
            let d = &p.graph.desc(db).dims;
            if d.len() != 4 || d[2] != p.s_q || d[3] != p.s_kv {
                return None;
            }
            if d[0] == p.b && d[1] == p.h_q {
                Dbias::Direct
            } else {
                // The f32 dS scratch: keep it under 4 GiB.
                if p.b * p.h_q * p.s_q * p.s_kv > (1 << 30) {
                    return None;
                }
                Dbias::Scratch
            }
        }
        (Some(_), None) => return None,
        _ => Dbias::None,
    };
    let kernels = generate(p, &ports, mode, true)?;
    let mut needs: Vec<TensorId> = [p.q, p.k, p.v, ports.d_o].into_iter().filter(|&t| p.vec_ok(t)).collect();
    needs.extend([ports.dq, ports.dk, ports.dv].into_iter().filter(|&t| p.pair_ok(t)));
    let unaligned = if needs.is_empty() { None } else { Some(Box::new(Unaligned { tensors: needs, kernels: generate(p, &ports, mode, false)? })) };
    Some(Unit { nodes: vec![p.ni], kernels, writes: node.outputs.iter().map(|x| x.tensor).collect(), unaligned })
}
