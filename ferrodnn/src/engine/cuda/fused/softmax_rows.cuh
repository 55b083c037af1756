// Softmax and log-softmax, forward (with the optional log-sum-exp `stats`) and backward, a team
// per row (fused/softmax.rs): the row (both rows backward) read once into registers, reduced
// over the team, each output element written once. Backward: softmax dx = y * (dy - sum(dy * y)),
// log-softmax dx = dy - exp(y) * sum(dy).
//
// The instantiation defines:
//   ROW_N, ROW_C, ROW_V, ROW_CPT, ROW_TS, ROW_BS, ROW_LANES   the row geometry (rows.rs)
//   ROW_ALIGNED        the vector accesses' alignment flag (a C expression of the pointers)
//   SM_LOG             1: log-softmax, 0: softmax
//   SM_EXP             the exponential: expf for f32 outputs, the fast __expf for 2-byte ones
//   SM_BACKWARD        1: dx from y and dy; 0: y (and with SM_STATS the stats) from x
//   T_<t>, OFF_<t>(r)  element type and row offset of tensor t (X, Y, ST; Y, DY, DX)

extern "C" __global__ void __launch_bounds__(ROW_BS, 1) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    constexpr i64 N = ROW_N;
    constexpr int C = ROW_C;
    constexpr int V = ROW_V;
    constexpr int CPT = ROW_CPT;
    constexpr int TS = ROW_TS;
    constexpr int BS = ROW_BS;
#if SM_BACKWARD
    const T_Y* y = (const T_Y*)yp;
    const T_DY* dy = (const T_DY*)dyp;
    T_DX* dx = (T_DX*)dxp;
#else
    const T_X* x = (const T_X*)xp;
    T_Y* y = (T_Y*)yp;
#if SM_STATS
    T_ST* st = (T_ST*)stp;
#endif
#endif
    const bool al = ROW_ALIGNED;
    __shared__ float red[2 * 32];
    int rb = 0;
    FR_TEAM;
    for (i64 r0 = FR_FIRST_ROW; r0 < N; r0 += FR_ROW_STEP) {
        FR_ROW(r0);
#if SM_BACKWARD
        const i64 yo = OFF_Y(r), dyo = OFF_DY(r), dxo = OFF_DX(r);
        float u[CPT][V], g[CPT][V];
        fr_load_rows<TS, C>(y + yo, u, dy + dyo, g, lt, ok, al);
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            if (lt + k * TS < C) {
#if SM_LOG
#pragma unroll
                for (int i = 0; i < V; ++i) s += g[k][i];
#else
#pragma unroll
                for (int i = 0; i < V; ++i) s += g[k][i] * u[k][i];
#endif
            }
        }
        fr_sum<TS, 1>(&s, red + (rb++ & 1) * 32);
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lt + k * TS;
            if (ok && c < C) {
                float o[V];
#if SM_LOG
#pragma unroll
                for (int i = 0; i < V; ++i) o[i] = g[k][i] - SM_EXP(u[k][i]) * s;
#else
#pragma unroll
                for (int i = 0; i < V; ++i) o[i] = u[k][i] * (g[k][i] - s);
#endif
                fr_st<T_DX, V>(dx + dxo + (i64)c * V, o, al);
            }
        }
#else
        const i64 xo = OFF_X(r), yo = OFF_Y(r);
        float v[CPT][V];
        fr_load_row<TS, C>(x + xo, v, lt, ok, al);
        float m = __int_as_float(0xff800000);
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            if (lt + k * TS < C) {
#pragma unroll
                for (int i = 0; i < V; ++i) m = fmaxf(m, v[k][i]);
            }
        }
        m = fr_max<TS>(m, red + (rb++ & 1) * 32);
        // Softmax keeps exp(x - m) in v for the output.
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            if (lt + k * TS < C) {
#pragma unroll
                for (int i = 0; i < V; ++i) {
                    const float e = SM_EXP(v[k][i] - m);
#if !SM_LOG
                    v[k][i] = e;
#endif
                    s += e;
                }
            }
        }
        fr_sum<TS, 1>(&s, red + (rb++ & 1) * 32);
        const float lse = m + logf(s);
        const float rs = 1.0f / s;
        (void)rs;
#if SM_STATS
        if (ok && lt == 0) fr_fromf(lse, st[OFF_ST(r)]);
#endif
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lt + k * TS;
            if (ok && c < C) {
                float o[V];
#if SM_LOG
#pragma unroll
                for (int i = 0; i < V; ++i) o[i] = v[k][i] - lse;
#else
#pragma unroll
                for (int i = 0; i < V; ++i) o[i] = v[k][i] * rs;
#endif
                fr_st<T_Y, V>(y + yo + (i64)c * V, o, al);
            }
        }
#endif
    }
}
