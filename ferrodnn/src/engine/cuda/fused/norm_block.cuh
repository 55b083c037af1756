// Layernorm and rmsnorm forward over rows longer than 1024 elements, a block per row (fused/norm.rs):
// persistent blocks, each taking every gridDim.x-th row. The next row's raw elements are
// fetched into registers before the current row's reduction (NB_PRE), or the next two rows'
// (NB_AHEAD2: two register buffers taken in turn, the loop unrolled by two so that each keeps
// its registers); scale and bias are loaded once per thread and kept raw in registers
// (NB_KEEP), else read in each row. One block reduction per row: the sums of x - K and
// (x - K)^2 around the row's first element K (layernorm; rmsnorm only needs the squares).
//
// Epsilon is the kernel parameter `eps` (forward), so that one kernel serves every value.
//
// The instantiation defines:
//   ROW_N, ROW_C, ROW_V, ROW_CPT, ROW_BS   rows, chunks per row, elements per chunk, chunks
//                      per thread, threads per block (rows.rs); ROW_MIN_BLOCKS blocks per SM
//   ROW_H              elements per row
//   ROW_ALIGNED        the vector accesses' alignment flag (a C expression of the pointers)
//   NORM_RMS, NORM_BIAS, NORM_MEAN, NORM_INV   as in norm_rows.cuh
//   NB_PRE, NB_AHEAD2, NB_KEEP   the prefetch and the scale and bias in registers, as above
//   T_<t>, OFF_<t>(r)  element type and row offset of tensor t (X, Y, SC, BI, MEAN, INV)

extern "C" __global__ void __launch_bounds__(ROW_BS, ROW_MIN_BLOCKS) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    constexpr i64 N = ROW_N;
    constexpr int C = ROW_C;
    constexpr int V = ROW_V;
    constexpr int CPT = ROW_CPT;
    constexpr int BS = ROW_BS;
    constexpr int PRE = NB_PRE;
    constexpr int RMS = NORM_RMS;
    constexpr int NR = RMS ? 1 : 2;
    constexpr float HF = ROW_H;
    (void)PRE;
    const T_X* x = (const T_X*)xp;
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
    __shared__ float red[2 * 32 * 2];
    int rb = 0;
    const int lt = threadIdx.x;
#if NB_KEEP
    FrRaw<T_SC, V> psc[CPT];
#if NORM_BIAS
    FrRaw<T_BI, V> pbi[CPT];
#endif
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
        const int c = lt + k * BS;
        if (c < C) {
            fr_ldraw<T_SC, V>(sc + (i64)c * V, psc[k], al);
#if NORM_BIAS
            fr_ldraw<T_BI, V>(bi + (i64)c * V, pbi[k], al);
#endif
        } else {
            fr_zero(psc[k]);
#if NORM_BIAS
            fr_zero(pbi[k]);
#endif
        }
    }
#endif
    // The row's raw elements into rx and its first element into pk (layernorm's K).
#if NB_AHEAD2
    FrRaw<T_X, V> rxa[CPT], rxb[CPT];
    float pka = 0.0f, pkb = 0.0f;
    auto fetch = [&](FrRaw<T_X, V> (&rx)[CPT], float& pk, i64 r) {
#else
    FrRaw<T_X, V> rx[CPT];
    float pk = 0.0f;
    auto fetch = [&](i64 r) {
#endif
        const i64 xo = OFF_X(r);
        if (!RMS) pk = fr_tof(x[xo]);
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lt + k * BS;
            if (c < C) fr_ldraw<T_X, V>(x + xo + (i64)c * V, rx[k], al);
            else fr_zero(rx[k]);
        }
    };
    // One row: its raw elements copied into cx and its K taken, the next fetch started, then the
    // statistics and y. The row stays raw in registers (converted again for the output).
#if NB_AHEAD2
    // Rows r + G and r + 2G are in flight while row r reduces.
    const i64 G = gridDim.x;
    auto step = [&](FrRaw<T_X, V> (&rx)[CPT], float& pk, i64 r) {
        FrRaw<T_X, V> cx[CPT];
#pragma unroll
        for (int k = 0; k < CPT; ++k) cx[k] = rx[k];
        const float K = pk;
        if (r + 2 * G < N) fetch(rx, pk, r + 2 * G);
#else
    if (PRE && (i64)blockIdx.x < N) fetch((i64)blockIdx.x);
    for (i64 r = blockIdx.x; r < N; r += gridDim.x) {
        if (!PRE) fetch(r);
        FrRaw<T_X, V> cx[CPT];
#pragma unroll
        for (int k = 0; k < CPT; ++k) cx[k] = rx[k];
        const float K = pk;
        if (PRE && r + (i64)gridDim.x < N) fetch(r + (i64)gridDim.x);
#endif
        // t[0] = sum(x - K), t[1] = sum((x - K)^2) (rmsnorm: K = 0, only t[1]).
        float t[2] = {0.0f, 0.0f};
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            if (lt + k * BS < C) {
                float v[V];
                fr_cvt(cx[k], v);
#pragma unroll
                for (int i = 0; i < V; ++i) {
                    const float d = v[i] - K;
                    if (!RMS) t[0] += d;
                    t[1] += d * d;
                }
            }
        }
        fr_sum<BS, NR>(t + (2 - NR), red + (rb++ & 1) * (32 * 2));
        const float dm = RMS ? 0.0f : t[0] / HF;
        const float mean = RMS ? 0.0f : K + dm;
        const float var = RMS ? t[1] / HF : fmaxf(t[1] / HF - dm * dm, 0.0f);
        const float inv = 1.0f / sqrtf(var + eps);
        const i64 yo = OFF_Y(r);
        if (lt == 0) {
#if NORM_MEAN
            fr_fromf(mean, mo[OFF_MEAN(r)]);
#endif
#if NORM_INV
            fr_fromf(inv, iv[OFF_INV(r)]);
#endif
        }
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = lt + k * BS;
            if (c < C) {
                float v[V], s[V], o[V];
                fr_cvt(cx[k], v);
#if NB_KEEP
                fr_cvt(psc[k], s);
#else
                fr_ld<T_SC, V>(sc + (i64)c * V, s, al);
#endif
#if NORM_BIAS
                float bb[V];
#if NB_KEEP
                fr_cvt(pbi[k], bb);
#else
                fr_ld<T_BI, V>(bi + (i64)c * V, bb, al);
#endif
#pragma unroll
                for (int i = 0; i < V; ++i) o[i] = (v[i] - mean) * inv * s[i] + bb[i];
#else
#pragma unroll
                for (int i = 0; i < V; ++i) o[i] = (v[i] - mean) * inv * s[i];
#endif
                fr_st<T_Y, V>(y + yo + (i64)c * V, o, al);
            }
        }
#if NB_AHEAD2
    };
    if ((i64)blockIdx.x < N) fetch(rxa, pka, (i64)blockIdx.x);
    if ((i64)blockIdx.x + G < N) fetch(rxb, pkb, (i64)blockIdx.x + G);
    for (i64 r = blockIdx.x; r < N; r += 2 * G) {
        step(rxa, pka, r);
        if (r + G < N) step(rxb, pkb, r + G);
    }
#else
    }
#endif
}
