// Batchnorm's own kernels (fused/batchnorm.rs), besides the channel-statistics passes: the
// inference apply y = (x - mean) * inv_variance * scale + bias, and bn_finalize. By BN_KERNEL:
//   BN_INFER_NHWC  after vectors.cuh, with the slab geometry of channels.cuh's CH_SLABS: a
//                  thread owns one vector of channels (coefficients in registers) and walks
//                  the positions of a slab
//   BN_INFER_NCHW  after vectors.cuh: a thread per item (PV items of VEC elements per plane with
//                  BN_INFER_VEC, else of one element; ITEMS in all), the coefficients reloaded
//                  when the plane changes
//   BN_FINALIZE    a thread per channel (C_ channels), in f64: from the sums (LD_SU, LD_SQ)
//                  over COUNT elements, the equivalent scale and bias (ST_ES, ST_EB), the saved
//                  mean and inverse deviation (ST_SM, ST_SI), with BN_RUNNING the running
//                  statistics (LD_RM, LD_RV, ST_NM, ST_NV, UNBIAS: COUNT / (COUNT - 1)); the
//                  parameters `eps` and, with BN_RUNNING, `momentum` (doubles)
// Per-channel tensor T: LD_T or ST_T, and its stride T_S along C.

#define BN_INFER_NHWC 1
#define BN_INFER_NCHW 2
#define BN_FINALIZE 3

#if BN_KERNEL == BN_INFER_NHWC
#define BN_LAUNCH_BOUNDS __launch_bounds__(BLOCK, 4)
#else
#define BN_LAUNCH_BOUNDS __launch_bounds__(256)
#endif

extern "C" __global__ void BN_LAUNCH_BOUNDS KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
#if BN_KERNEL == BN_INFER_NHWC
    const XT* x = (const XT*)xv;
    YT* y = (YT*)yv;
    const bool al = ((unsigned long long)x & 15) == 0 && ((unsigned long long)y & (YAL - 1)) == 0;
    const int lane = threadIdx.x % LANES, r = threadIdx.x / LANES;
    const i64 p0 = (i64)blockIdx.x * SLAB;
    const i64 p1 = min(p0 + SLAB, P_);
    for (int v = lane; v < CV; v += LANES) {
        float mu[VEC], a[VEC], b[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            const i64 ch = (i64)v * VEC + k;
            const double sc_ = LD_SC(sc, ch * SC_S), bi_ = LD_BI(bi, ch * BI_S), mn_ = LD_MN(mn, ch * MN_S), iv_ = LD_IV(iv, ch * IV_S);
            mu[k] = (float)mn_;
            a[k] = (float)(iv_ * sc_);
            b[k] = (float)bi_;
        }
        for (i64 p = p0 + r; p < p1; p += (i64)ROWS * UNR) {
            uint4 u[UNR];
#pragma unroll
            for (int j = 0; j < UNR; ++j) {
                const i64 pj = p + (i64)j * ROWS;
                if (pj < p1) u[j] = ldx_raw(x + pj * C_ + (i64)v * VEC, al);
            }
#pragma unroll
            for (int j = 0; j < UNR; ++j) {
                const i64 pj = p + (i64)j * ROWS;
                if (pj < p1) {
                    float f[VEC];
                    cvt_x(u[j], f);
#pragma unroll
                    for (int k = 0; k < VEC; ++k) f[k] = fmaf(f[k] - mu[k], a[k], b[k]);
                    st_y(y + pj * C_ + (i64)v * VEC, al, f);
                }
            }
        }
    }
#elif BN_KERNEL == BN_INFER_NCHW
    const XT* x = (const XT*)xv;
    YT* y = (YT*)yv;
    const bool al = ((unsigned long long)x & 15) == 0 && ((unsigned long long)y & (YAL - 1)) == 0;
    (void)al;
    // The coefficients are reloaded (from L1/L2) only when a thread's plane changes.
    i64 cur = -1;
    float mu = 0.f, a = 0.f, b = 0.f;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < ITEMS; i += (i64)gridDim.x * blockDim.x) {
        const i64 pl = i / PV;
        if (pl != cur) {
            cur = pl;
            const i64 ch = pl % C_;
            const double sc_ = LD_SC(sc, ch * SC_S), bi_ = LD_BI(bi, ch * BI_S), mn_ = LD_MN(mn, ch * MN_S), iv_ = LD_IV(iv, ch * IV_S);
            mu = (float)mn_;
            a = (float)(iv_ * sc_);
            b = (float)bi_;
        }
        {
#if BN_INFER_VEC
            float f[VEC];
            cvt_x(ldx_raw(x + i * VEC, al), f);
#pragma unroll
            for (int k = 0; k < VEC; ++k) f[k] = fmaf(f[k] - mu, a, b);
            st_y(y + i * VEC, al, f);
#else
            y[i] = f2y(fmaf(x2f(x[i]) - mu, a, b));
#endif
        }
    }
#else
    for (i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x; c < C_; c += (i64)gridDim.x * blockDim.x) {
        const double mean = LD_SU(su, c * SU_S) / COUNT;
        const double var = fmax(LD_SQ(sq, c * SQ_S) / COUNT - mean * mean, 0.0);
        const double inv = 1.0 / sqrt(var + eps);
        const double eqs = LD_SC(sc, c * SC_S) * inv;
        ST_ES(es, c * ES_S, eqs);
        ST_EB(eb, c * EB_S, LD_BI(bi, c * BI_S) - mean * eqs);
        ST_SM(sm, c * SM_S, mean);
        ST_SI(si, c * SI_S, inv);
#if BN_RUNNING
        ST_NM(nm, c * NM_S, (1.0 - momentum) * LD_RM(rm, c * RM_S) + momentum * mean);
        ST_NV(nv, c * NV_S, (1.0 - momentum) * LD_RV(rv, c * RV_S) + momentum * var * UNBIAS);
#endif
    }
#endif
}
