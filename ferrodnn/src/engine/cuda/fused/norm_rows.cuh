// Layernorm, rmsnorm and adalayernorm forward, a team per row (fused/norm.rs): the row read once
// into registers, its mean and variance taken from them, each output element written once.
// Layernorm and rmsnorm take rows of up to 1024 elements here (a lane team; longer rows:
// norm_block.cuh), adalayernorm any row length (a lane team or a block); adalayernorm's scale
// and bias rows depend on the row (OFF_SC, OFF_BI), the others' are one row. With
// NORM_PROLOGUE, x is computed per element by a chain of pointwise nodes from up to 6 inputs
// (and written too with NORM_WRITE_X).
//
// Epsilon is the kernel parameter `eps` (forward), so that one kernel serves every value.
//
// The instantiation defines:
//   ROW_N, ROW_C, ROW_V, ROW_CPT, ROW_TS, ROW_BS   rows, chunks per row, elements per chunk,
//                      chunks per thread, team size, block size (rows.rs); ROW_LANES
//   ROW_H              elements per row
//   ROW_ALIGNED        the vector accesses' alignment flag (a C expression of the pointers)
//   NORM_RMS           1: rmsnorm (no mean taken out), 0: layernorm
//   NORM_BIAS, NORM_MEAN, NORM_INV   1 where the node has bias, the mean and inv_variance outputs
//   T_<t>, OFF_<t>(r)  the element type of tensor t and the offset of row r's first element
//                      (X, Y, SC, BI, MEAN, INV)
//   NORM_PROLOGUE      1: x from the chain: PRO_INPUTS inputs (T_E<j>, OFF_E<j>(r)), PRO_NODES
//                      nodes (PRO_T<k>: node k's value at element i, a C expression of f<j>[i]
//                      and earlier t<k>), PRO_X (the t<k> that is x), NORM_WRITE_X (x stored)

extern "C" __global__ void __launch_bounds__(ROW_BS, 1) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    constexpr i64 N = ROW_N;
    constexpr int C = ROW_C;
    constexpr int V = ROW_V;
    constexpr int CPT = ROW_CPT;
    constexpr int TS = ROW_TS;
    constexpr int BS = ROW_BS;
    constexpr float HF = ROW_H;
#if NORM_PROLOGUE
#if PRO_INPUTS > 0
    const T_E0* e0 = (const T_E0*)e0p;
#endif
#if PRO_INPUTS > 1
    const T_E1* e1 = (const T_E1*)e1p;
#endif
#if PRO_INPUTS > 2
    const T_E2* e2 = (const T_E2*)e2p;
#endif
#if PRO_INPUTS > 3
    const T_E3* e3 = (const T_E3*)e3p;
#endif
#if PRO_INPUTS > 4
    const T_E4* e4 = (const T_E4*)e4p;
#endif
#if PRO_INPUTS > 5
    const T_E5* e5 = (const T_E5*)e5p;
#endif
#if NORM_WRITE_X
    T_X* hx = (T_X*)hp;
#endif
#else
    const T_X* x = (const T_X*)xp;
#endif
    const T_SC* sc = (const T_SC*)scp;
#if NORM_BIAS
    const T_BI* bi = (const T_BI*)bip;
#endif
    T_Y* y = (T_Y*)yp;
#if NORM_MEAN
    T_MEAN* mo = (T_MEAN*)mop;
#endif
#if NORM_INV
    T_INV* iv = (T_INV*)ivp;
#endif
    const bool al = ROW_ALIGNED;
    __shared__ float red[2 * 32];
    int rb = 0;
    FR_TEAM;
    for (i64 r0 = FR_FIRST_ROW; r0 < N; r0 += FR_ROW_STEP) {
        FR_ROW(r0);
        const i64 yo = OFF_Y(r), so = OFF_SC(r);
#if NORM_BIAS
        const i64 bo = OFF_BI(r);
#endif
        float v[CPT][V];
#if NORM_PROLOGUE
#if PRO_INPUTS > 0
        const i64 o0 = OFF_E0(r);
#endif
#if PRO_INPUTS > 1
        const i64 o1 = OFF_E1(r);
#endif
#if PRO_INPUTS > 2
        const i64 o2 = OFF_E2(r);
#endif
#if PRO_INPUTS > 3
        const i64 o3 = OFF_E3(r);
#endif
#if PRO_INPUTS > 4
        const i64 o4 = OFF_E4(r);
#endif
#if PRO_INPUTS > 5
        const i64 o5 = OFF_E5(r);
#endif
#if NORM_WRITE_X
        const i64 oh = OFF_X(r);
#endif
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lt + k * TS;
            if (ok && c < C) {
#if PRO_INPUTS > 0
                float f0[V];
                fr_ld<T_E0, V>(e0 + o0 + (i64)c * V, f0, al);
#endif
#if PRO_INPUTS > 1
                float f1[V];
                fr_ld<T_E1, V>(e1 + o1 + (i64)c * V, f1, al);
#endif
#if PRO_INPUTS > 2
                float f2[V];
                fr_ld<T_E2, V>(e2 + o2 + (i64)c * V, f2, al);
#endif
#if PRO_INPUTS > 3
                float f3[V];
                fr_ld<T_E3, V>(e3 + o3 + (i64)c * V, f3, al);
#endif
#if PRO_INPUTS > 4
                float f4[V];
                fr_ld<T_E4, V>(e4 + o4 + (i64)c * V, f4, al);
#endif
#if PRO_INPUTS > 5
                float f5[V];
                fr_ld<T_E5, V>(e5 + o5 + (i64)c * V, f5, al);
#endif
#pragma unroll
                for (int i = 0; i < V; ++i) {
#if PRO_NODES > 0
                    const float t0 = PRO_T0;
#endif
#if PRO_NODES > 1
                    const float t1 = PRO_T1;
#endif
#if PRO_NODES > 2
                    const float t2 = PRO_T2;
#endif
#if PRO_NODES > 3
                    const float t3 = PRO_T3;
#endif
#if PRO_NODES > 4
                    const float t4 = PRO_T4;
#endif
#if PRO_NODES > 5
                    const float t5 = PRO_T5;
#endif
#if PRO_NODES > 6
                    const float t6 = PRO_T6;
#endif
#if PRO_NODES > 7
                    const float t7 = PRO_T7;
#endif
                    v[k][i] = PRO_X;
                }
#if NORM_WRITE_X
                fr_st<T_X, V>(hx + oh + (i64)c * V, v[k], al);
#endif
            } else {
#pragma unroll
                for (int i = 0; i < V; ++i) v[k][i] = 0.0f;
            }
        }
#else
        const i64 xo = OFF_X(r);
        fr_load_row<TS, C>(x + xo, v, lt, ok, al);
#endif
        float mean = 0.0f;
#if !NORM_RMS
        mean = fr_row_mean<TS>(v, red, rb, HF);
#endif
        const float inv = fr_row_inv<TS, C>(v, mean, lt, red, rb, HF, eps);
        if (ok && lt == 0) {
#if NORM_MEAN
            fr_fromf(mean, mo[OFF_MEAN(r)]);
#endif
#if NORM_INV
            fr_fromf(inv, iv[OFF_INV(r)]);
#endif
        }
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lt + k * TS;
            if (ok && c < C) {
                float s[V], o[V];
                fr_ld<T_SC, V>(sc + so + (i64)c * V, s, al);
#if NORM_BIAS
                float b[V];
                fr_ld<T_BI, V>(bi + bo + (i64)c * V, b, al);
#pragma unroll
                for (int i = 0; i < V; ++i) o[i] = (v[k][i] - mean) * inv * s[i] + b[i];
#else
#pragma unroll
                for (int i = 0; i < V; ++i) o[i] = (v[k][i] - mean) * inv * s[i];
#endif
                fr_st<T_Y, V>(y + yo + (i64)c * V, o, al);
            }
        }
    }
}
