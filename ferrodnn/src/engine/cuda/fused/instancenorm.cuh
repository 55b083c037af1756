// Instancenorm forward and backward with the spatial axes packed, a team per row (n, c)
// (fused/norm.rs): the row (x and dy backward) read once into registers. Forward: y from the
// row's mean and variance and its channel's scale and bias. Backward: dx = inv * scale * (dy -
// sum(dy) / HW - xhat * sum(dy * xhat) / HW), and each row's two sums to scratch (part: sum(dy *
// xhat) at r, sum(dy) at N + r) for instancenorm_params.cuh.
//
// Epsilon is the kernel parameter `eps` (forward), so that one kernel serves every value.
//
// The instantiation defines:
//   ROW_N, ROW_C, ROW_V, ROW_CPT, ROW_TS, ROW_BS, ROW_LANES   the row geometry (rows.rs)
//   ROW_H              elements per row (HW)
//   ROW_ALIGNED        the vector accesses' alignment flag (a C expression of the pointers)
//   IN_BACKWARD        1: backward, 0: forward
//   IN_NC              channels: the row's channel is r % IN_NC
//   IN_SC_STRIDE, IN_BI_STRIDE   element strides of scale and bias between channels
//   NORM_MEAN, NORM_INV   1 where the forward has the mean and inv_variance outputs
//   T_<t>, OFF_<t>(r)  element type and row offset of tensor t (X, Y, MEAN, INV, DY, DX; SC, BI)

extern "C" __global__ void __launch_bounds__(ROW_BS, 1) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    constexpr i64 N = ROW_N;
    constexpr int C = ROW_C;
    constexpr int V = ROW_V;
    constexpr int CPT = ROW_CPT;
    constexpr int TS = ROW_TS;
    constexpr int BS = ROW_BS;
    constexpr float HF = ROW_H;
#if IN_BACKWARD
    const T_X* x = (const T_X*)xp;
    const T_DY* dy = (const T_DY*)dyp;
    const T_SC* sc = (const T_SC*)scp;
    const T_MEAN* mn = (const T_MEAN*)mnp;
    const T_INV* iv = (const T_INV*)ivp;
    T_DX* dx = (T_DX*)dxp;
    const bool al = ROW_ALIGNED;
    __shared__ float red[2 * 32 * 2];
    int rb = 0;
    FR_TEAM;
    for (i64 r0 = FR_FIRST_ROW; r0 < N; r0 += FR_ROW_STEP) {
        FR_ROW(r0);
        const i64 xo = OFF_X(r), dyo = OFF_DY(r), dxo = OFF_DX(r);
        const i64 ch = r % IN_NC;
        float u[CPT][V], g[CPT][V];
        fr_load_rows<TS, C>(x + xo, u, dy + dyo, g, lt, ok, al);
        const float mu = ok ? fr_tof(mn[OFF_MEAN(r)]) : 0.0f;
        const float rs = ok ? fr_tof(iv[OFF_INV(r)]) : 0.0f;
        // t[0] = sum(dy), t[1] = sum(dy * xhat).
        float t[2] = {0.0f, 0.0f};
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            if (lt + k * TS < C) {
#pragma unroll
                for (int i = 0; i < V; ++i) {
                    u[k][i] = (u[k][i] - mu) * rs;
                    t[0] += g[k][i];
                    t[1] += g[k][i] * u[k][i];
                }
            }
        }
        fr_sum<TS, 2>(t, red + (rb++ & 1) * 64);
        const float a = ok ? rs * fr_tof(sc[ch * IN_SC_STRIDE]) : 0.0f;
        const float m0 = t[0] / HF, m1 = t[1] / HF;
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lt + k * TS;
            if (ok && c < C) {
                float o[V];
#pragma unroll
                for (int i = 0; i < V; ++i) o[i] = a * (g[k][i] - m0 - u[k][i] * m1);
                fr_st<T_DX, V>(dx + dxo + (i64)c * V, o, al);
            }
        }
        if (ok && lt == 0) {
            part[r] = t[1];
            part[N + r] = t[0];
        }
    }
#else
    const T_X* x = (const T_X*)xp;
    const T_SC* sc = (const T_SC*)scp;
    const T_BI* bi = (const T_BI*)bip;
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
        const i64 xo = OFF_X(r), yo = OFF_Y(r);
        const i64 ch = r % IN_NC;
        float v[CPT][V];
        fr_load_row<TS, C>(x + xo, v, lt, ok, al);
        const float mean = fr_row_mean<TS>(v, red, rb, HF);
        const float inv = fr_row_inv<TS, C>(v, mean, lt, red, rb, HF, eps);
        if (ok && lt == 0) {
#if NORM_MEAN
            fr_fromf(mean, mo[OFF_MEAN(r)]);
#endif
#if NORM_INV
            fr_fromf(inv, iv[OFF_INV(r)]);
#endif
        }
        const float a = ok ? inv * fr_tof(sc[ch * IN_SC_STRIDE]) : 0.0f;
        const float b = ok ? fr_tof(bi[ch * IN_BI_STRIDE]) : 0.0f;
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lt + k * TS;
            if (ok && c < C) {
                float o[V];
#pragma unroll
                for (int i = 0; i < V; ++i) o[i] = (v[k][i] - mean) * a + b;
                fr_st<T_Y, V>(y + yo + (i64)c * V, o, al);
            }
        }
    }
#endif
}
