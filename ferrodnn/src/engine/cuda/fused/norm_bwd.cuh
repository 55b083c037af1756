// Layernorm, rmsnorm and adalayernorm backward, the first launch (fused/norm.rs): dx a block per
// row, RPI rows a step (the next step's rows fetched raw while this one computes), and per
// thread the partial column sums of dy * xhat (and dy) over the block's rows, written to scratch
// (pa, pb: [blocks, C * V] floats) for norm_bwd_params.cuh. The rows sharing a row of scale come
// in groups of RG consecutive rows (adalayernorm; else one group): BPG blocks per group.
//
// The instantiation defines:
//   ROW_C, ROW_V, ROW_CPT, ROW_BS   chunks per row, elements per chunk, chunks per thread,
//                      threads per block (rows.rs); ROW_MIN_BLOCKS blocks per SM
//   ROW_H              elements per row
//   ROW_ALIGNED        the vector accesses' alignment flag (a C expression of the pointers)
//   NB_BPG, NB_RG, NB_RPI   blocks per group, rows per group, rows per step
//   NORM_RMS           1: rmsnorm (no mean), 0: layernorm (mean read from mn)
//   NORM_DBIAS         1: dbias too (column sums of dy into pb)
//   T_<t>, OFF_<t>(r)  element type and row offset of tensor t (DY, X, SC, MEAN, INV, DX)

extern "C" __global__ void __launch_bounds__(ROW_BS, ROW_MIN_BLOCKS) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    constexpr int C = ROW_C;
    constexpr int V = ROW_V;
    constexpr int CPT = ROW_CPT;
    constexpr int BS = ROW_BS;
    constexpr int BPG = NB_BPG;
    constexpr i64 RG = NB_RG;
    constexpr int RPI = NB_RPI;
    constexpr float HF = ROW_H;
    const T_DY* dy = (const T_DY*)dyp;
    const T_X* x = (const T_X*)xp;
    const T_SC* sc = (const T_SC*)scp;
#if !NORM_RMS
    const T_MEAN* mn = (const T_MEAN*)mnp;
#endif
    const T_INV* iv = (const T_INV*)ivp;
    T_DX* dx = (T_DX*)dxp;
    const bool al = ROW_ALIGNED;
    __shared__ float red[2 * 32 * 2 * RPI];
    int rb = 0;
    const int lt = threadIdx.x;
    const bool pal = V > 1;
    float ax[CPT][V];
#pragma unroll
    for (int k = 0; k < CPT; ++k)
#pragma unroll
        for (int i = 0; i < V; ++i) ax[k][i] = 0.0f;
#if NORM_DBIAS
    float ab[CPT][V];
#pragma unroll
    for (int k = 0; k < CPT; ++k)
#pragma unroll
        for (int i = 0; i < V; ++i) ab[k][i] = 0.0f;
#endif
    // The rows of a step are fetched (raw) while the previous step computes.
    FrRaw<T_X, V> rx[RPI][CPT];
    FrRaw<T_DY, V> rd[RPI][CPT];
    float pmu[RPI], prs[RPI];
    // This block's group of rows [gb, rend) and the group's row of scale (at so).
    const i64 gb = (i64)(blockIdx.x / BPG) * RG;
    const i64 rend = gb + RG;
    const i64 so = (i64)(blockIdx.x / BPG) * ((i64)C * V);
    const i64 rfirst = gb + (i64)(blockIdx.x % BPG) * RPI;
    auto fetch = [&](i64 r0) {
#pragma unroll
        for (int j = 0; j < RPI; ++j) {
            const i64 r = r0 + j;
            const bool ok = r < rend;
            const i64 xo = OFF_X(r), dyo = OFF_DY(r);
#if NORM_RMS
            pmu[j] = 0.0f;
#else
            pmu[j] = ok ? fr_tof(mn[OFF_MEAN(r)]) : 0.0f;
#endif
            prs[j] = ok ? fr_tof(iv[OFF_INV(r)]) : 0.0f;
#pragma unroll
            for (int k = 0; k < CPT; ++k) {
                const int c = lt + k * BS;
                if (ok && c < C) {
                    fr_ldraw<T_X, V>(x + xo + (i64)c * V, rx[j][k], al);
                    fr_ldraw<T_DY, V>(dy + dyo + (i64)c * V, rd[j][k], al);
                } else {
                    fr_zero(rx[j][k]);
                    fr_zero(rd[j][k]);
                }
            }
        }
    };
    const i64 step = (i64)BPG * RPI;
    if (rfirst < rend) fetch(rfirst);
    for (i64 r0 = rfirst; r0 < rend; r0 += step) {
        float xv[RPI][CPT][V], gv[RPI][CPT][V], mu[RPI], rs[RPI];
#pragma unroll
        for (int j = 0; j < RPI; ++j) {
            mu[j] = pmu[j];
            rs[j] = prs[j];
#pragma unroll
            for (int k = 0; k < CPT; ++k) {
                fr_cvt(rx[j][k], xv[j][k]);
                fr_cvt(rd[j][k], gv[j][k]);
            }
        }
        if (r0 + step < rend) fetch(r0 + step);
        // Per row j: t[2j] = sum(dy * scale), t[2j + 1] = sum(dy * scale * xhat).
        float t[2 * RPI];
#pragma unroll
        for (int j = 0; j < 2 * RPI; ++j) t[j] = 0.0f;
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lt + k * BS;
            if (c < C) {
                float s[V];
                fr_ld<T_SC, V>(sc + so + (i64)c * V, s, al);
#pragma unroll
                for (int j = 0; j < RPI; ++j) {
#pragma unroll
                    for (int i = 0; i < V; ++i) {
                        const float xh = (xv[j][k][i] - mu[j]) * rs[j];
                        const float d = gv[j][k][i];
                        const float g = d * s[i];
                        ax[k][i] += d * xh;
#if NORM_DBIAS
                        ab[k][i] += d;
#endif
                        t[2 * j] += g;
                        t[2 * j + 1] += g * xh;
                        xv[j][k][i] = xh;
                        gv[j][k][i] = g;
                    }
                }
            }
        }
        fr_sum<BS, 2 * RPI>(t, red + (rb++ & 1) * (32 * 2 * RPI));
#pragma unroll
        for (int j = 0; j < RPI; ++j) {
            const i64 r = r0 + j;
            if (r < rend) {
                const i64 dxo = OFF_DX(r);
                const float mg = NORM_RMS ? 0.0f : t[2 * j] / HF;
                const float mgx = t[2 * j + 1] / HF;
#pragma unroll
                for (int k = 0; k < CPT; ++k) {
                    const int c = lt + k * BS;
                    if (c < C) {
                        float o[V];
#pragma unroll
                        for (int i = 0; i < V; ++i) o[i] = rs[j] * (gv[j][k][i] - mg - xv[j][k][i] * mgx);
                        fr_st<T_DX, V>(dx + dxo + (i64)c * V, o, al);
                    }
                }
            }
        }
    }
    // This block's column sums over its rows.
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
        const int c = lt + k * BS;
        if (c < C) {
            fr_st<float, V>(pa + (i64)blockIdx.x * (C * V) + (i64)c * V, ax[k], pal);
#if NORM_DBIAS
            fr_st<float, V>(pb + (i64)blockIdx.x * (C * V) + (i64)c * V, ab[k], pal);
#endif
        }
    }
}
