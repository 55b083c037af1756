// The apply pass of the channel kernels (fused/channels.rs), after channels.cuh: y from x (and
// dy) with per-channel coefficients `co` that channel_finalize.cuh wrote, walking backwards
// (the statistics pass read the end last, likely still in L2). By CH_GEOM:
//   CH_SLABS   batchnorm on NHWC: the statistics pass's slabs, co[3][C] (mean, a, b),
//              y = (x - mean) * a + b
//   CH_GROUPS  NHWC in G_ groups, NCO coefficients per (group, channel) from co[NCO][G][C]
//   CH_PLANES  NCHW, a thread per item, the coefficients co[NCO][C] reloaded when the plane
//              changes
// With CH_DY the backward's dx = A * dy + B * (x - mean) + Cs (co: mean, A, B, Cs), else
// y = (x - mean) * a + b (co: mean, a, b), in CH_GROUPS passed through CH_EPILOGUE(v) where
// groupnorm defines it (a pointwise chain fused after the norm).

#if CH_DY
#define NCO 4
#else
#define NCO 3
#endif

extern "C" __global__ void CH_LAUNCH_BOUNDS KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
#if CH_GEOM == CH_SLABS
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
            mu[k] = co[ch];
            a[k] = co[C_ + ch];
            b[k] = co[2 * C_ + ch];
        }
        // Backwards through the slab: the statistics pass read its end last.
        for (i64 p = p1 - 1 - r; p >= p0; p -= (i64)ROWS * UNR) {
            uint4 u[UNR];
#pragma unroll
            for (int j = 0; j < UNR; ++j) {
                const i64 pj = p - (i64)j * ROWS;
                if (pj >= p0) u[j] = ldx_raw(x + pj * C_ + (i64)v * VEC, al);
            }
#pragma unroll
            for (int j = 0; j < UNR; ++j) {
                const i64 pj = p - (i64)j * ROWS;
                if (pj >= p0) {
                    float f[VEC];
                    cvt_x(u[j], f);
#pragma unroll
                    for (int k = 0; k < VEC; ++k) f[k] = fmaf(f[k] - mu[k], a[k], b[k]);
                    st_y(y + pj * C_ + (i64)v * VEC, al, f);
                }
            }
        }
    }
#elif CH_GEOM == CH_GROUPS
    const XT* x = (const XT*)xv;
#if CH_DY
    const XT* dy = (const XT*)dyv;
    YT* y = (YT*)yv;
    const bool al = ((unsigned long long)x & 15) == 0 && ((unsigned long long)dy & 15) == 0 && ((unsigned long long)y & (YAL - 1)) == 0;
#else
    YT* y = (YT*)yv;
    const bool al = ((unsigned long long)x & 15) == 0 && ((unsigned long long)y & (YAL - 1)) == 0;
#endif
    const int lane = threadIdx.x % LANES, r = threadIdx.x / LANES;
    const i64 g = blockIdx.x / NBLK;
    const i64 q0 = g * P_;
    const i64 p0 = q0 + (i64)(blockIdx.x % NBLK) * SLAB;
    const i64 p1 = min(p0 + SLAB, q0 + P_);
    for (int v = lane; v < CV; v += LANES) {
        float cf[NCO][VEC];
#pragma unroll
        for (int m = 0; m < NCO; ++m)
#pragma unroll
            for (int k = 0; k < VEC; ++k) cf[m][k] = co[((i64)m * G_ + g) * C_ + (i64)v * VEC + k];
        for (i64 p = p1 - 1 - r; p >= p0; p -= (i64)ROWS * UNR) {
            uint4 u[UNR];
#if CH_DY
            uint4 w[UNR];
#endif
#pragma unroll
            for (int j = 0; j < UNR; ++j) {
                const i64 pj = p - (i64)j * ROWS;
                if (pj >= p0) {
                    u[j] = ldx_raw(x + pj * C_ + (i64)v * VEC, al);
#if CH_DY
                    w[j] = ldx_raw(dy + pj * C_ + (i64)v * VEC, al);
#endif
                }
            }
#pragma unroll
            for (int j = 0; j < UNR; ++j) {
                const i64 pj = p - (i64)j * ROWS;
                if (pj >= p0) {
                    float f[VEC];
                    cvt_x(u[j], f);
#if CH_DY
                    float d[VEC];
                    cvt_x(w[j], d);
#pragma unroll
                    for (int k = 0; k < VEC; ++k) f[k] = fmaf(cf[1][k], d[k], fmaf(cf[2][k], f[k] - cf[0][k], cf[3][k]));
#elif defined(CH_EPILOGUE)
#pragma unroll
                    for (int k = 0; k < VEC; ++k) f[k] = CH_EPILOGUE(fmaf(f[k] - cf[0][k], cf[1][k], cf[2][k]));
#else
#pragma unroll
                    for (int k = 0; k < VEC; ++k) f[k] = fmaf(f[k] - cf[0][k], cf[1][k], cf[2][k]);
#endif
                    st_y(y + pj * C_ + (i64)v * VEC, al, f);
                }
            }
        }
    }
#else
    const XT* x = (const XT*)xv;
#if CH_DY
    const XT* dy = (const XT*)dyv;
#endif
    YT* y = (YT*)yv;
#if VW == 1
    const bool al = false;
#elif CH_DY
    const bool al = ((unsigned long long)x & 15) == 0 && ((unsigned long long)dy & 15) == 0 && ((unsigned long long)y & (YAL - 1)) == 0;
#else
    const bool al = ((unsigned long long)x & 15) == 0 && ((unsigned long long)y & (YAL - 1)) == 0;
#endif
    (void)al;
    i64 cur = -1;
    float cf[NCO];
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 it = PLANES * ITEMS - 1 - ((i64)blockIdx.x * blockDim.x + threadIdx.x); it >= 0; it -= stride) {
        const i64 pl = it / ITEMS;
        if (pl != cur) {
            cur = pl;
            const i64 ch = pl % C_;
#pragma unroll
            for (int m = 0; m < NCO; ++m) cf[m] = co[(i64)m * C_ + ch];
        }
        float fx[VW], o[VW];
        ldv(x, it, al, fx);
#if CH_DY
        float fd[VW];
        ldv(dy, it, al, fd);
#endif
#pragma unroll
        for (int k = 0; k < VW; ++k) {
            const float f = fx[k];
#if CH_DY
            const float d = fd[k];
            o[k] = fmaf(cf[1], d, fmaf(cf[2], f - cf[0], cf[3]));
#else
            o[k] = fmaf(f - cf[0], cf[1], cf[2]);
#endif
        }
        stv(y, it, al, o);
    }
#endif
}
