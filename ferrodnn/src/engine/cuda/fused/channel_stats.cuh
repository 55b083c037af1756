// The statistics pass of the channel kernels (fused/channels.rs), after channels.cuh: per
// channel, two sums `s` and `q` over a block's positions, reduced in a fixed order, written as
// partials to scratch `part` for channel_finalize.cuh. By CH_GEOM (see channels.cuh):
//   CH_SLABS   batchnorm and genstats on NHWC: sums of `x - K` and `(x - K)^2`, K the channel's
//              value at position 0 (a shift that keeps the f32 sums well conditioned);
//              part[2][NBLK][C]
//   CH_GROUPS  NHWC in G_ groups; part[2][G_ * NBLK][C]; with CH_DY the backward's sums of dy
//              and dy * xhat (xhat from the group's mean and inv_variance: LD_MN, LD_IV; at
//              the channel's group of CH_STAT_CPG channels where groupnorm defines it), else
//              instancenorm's shifted sums (K: the group's first position)
//   CH_PLANES  NCHW, a plane per team (a warp, or a block when TS is 256); part[2][PLANES];
//              with CH_DY the backward's sums (LD_MN, LD_IV), else the shifted sums of
//              batchnorm and genstats (K: the channel's first value, in plane (0, c))

extern "C" __global__ void CH_LAUNCH_BOUNDS KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
#if CH_GEOM == CH_SLABS
    const XT* x = (const XT*)xv;
    const bool al = ((unsigned long long)x & 15) == 0;
    const int lane = threadIdx.x % LANES, r = threadIdx.x / LANES;
    const i64 p0 = (i64)blockIdx.x * SLAB;
    const i64 p1 = min(p0 + SLAB, P_);
    __shared__ float sh[2][ROWS][LANES][VEC];
    for (int v0 = 0; v0 < CV; v0 += LANES) {
        const int v = v0 + lane;
        float s[VEC], q[VEC], K[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            s[k] = 0.f;
            q[k] = 0.f;
            K[k] = 0.f;
        }
        if (v < CV) {
            cvt_x(ldx_raw(x + (i64)v * VEC, al), K);
            for (i64 p = p0 + r; p < p1; p += (i64)ROWS * UNR) {
                uint4 u[UNR];
#pragma unroll
                for (int j = 0; j < UNR; ++j) {
                    const i64 pj = p + (i64)j * ROWS;
                    if (pj < p1) u[j] = ldx_raw(x + pj * C_ + (i64)v * VEC, al);
                }
#pragma unroll
                for (int j = 0; j < UNR; ++j) {
                    if (p + (i64)j * ROWS < p1) {
                        float f[VEC];
                        cvt_x(u[j], f);
#pragma unroll
                        for (int k = 0; k < VEC; ++k) {
                            const float d = f[k] - K[k];
                            s[k] += d;
                            q[k] = fmaf(d, d, q[k]);
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            sh[0][r][lane][k] = s[k];
            sh[1][r][lane][k] = q[k];
        }
        __syncthreads();
        // Sum over the block's rows, in row order; write the block's partials.
        for (int t = threadIdx.x; t < 2 * LANES * VEC; t += BLOCK) {
            const int which = t / (LANES * VEC), lv = t % (LANES * VEC);
            const int ln = lv / VEC, k = lv % VEC;
            if (v0 + ln < CV) {
                float acc = 0.f;
                for (int rr = 0; rr < ROWS; ++rr) acc += sh[which][rr][ln][k];
                part[((i64)which * NBLK + blockIdx.x) * C_ + (i64)(v0 + ln) * VEC + k] = acc;
            }
        }
        __syncthreads();
    }
#elif CH_GEOM == CH_GROUPS
    const XT* x = (const XT*)xv;
#if CH_DY
    const XT* dy = (const XT*)dyv;
    const bool al = ((unsigned long long)x & 15) == 0 && ((unsigned long long)dy & 15) == 0;
#else
    const bool al = ((unsigned long long)x & 15) == 0;
#endif
    const int lane = threadIdx.x % LANES, r = threadIdx.x / LANES;
    const i64 g = blockIdx.x / NBLK;
    const i64 q0 = g * P_;
    const i64 p0 = q0 + (i64)(blockIdx.x % NBLK) * SLAB;
    const i64 p1 = min(p0 + SLAB, q0 + P_);
    (void)g;
    __shared__ float sh[2][ROWS][LANES][VEC];
    for (int v0 = 0; v0 < CV; v0 += LANES) {
        const int v = v0 + lane;
        float s[VEC], q[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            s[k] = 0.f;
            q[k] = 0.f;
        }
        if (v < CV) {
#if CH_DY
            float M[VEC], R[VEC];
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                const i64 ch = (i64)v * VEC + k;
#ifdef CH_STAT_CPG
                M[k] = (float)LD_MN(mn, STAT_AT(MN, g, ch / CH_STAT_CPG));
                R[k] = (float)LD_IV(iv, STAT_AT(IV, g, ch / CH_STAT_CPG));
#else
                M[k] = (float)LD_MN(mn, STAT_AT(MN, g, ch));
                R[k] = (float)LD_IV(iv, STAT_AT(IV, g, ch));
#endif
            }
#else
            float K[VEC];
            cvt_x(ldx_raw(x + q0 * C_ + (i64)v * VEC, al), K);
#endif
            for (i64 p = p0 + r; p < p1; p += (i64)ROWS * UNR) {
                uint4 u[UNR];
#if CH_DY
                uint4 w[UNR];
#endif
#pragma unroll
                for (int j = 0; j < UNR; ++j) {
                    const i64 pj = p + (i64)j * ROWS;
                    if (pj < p1) {
                        u[j] = ldx_raw(x + pj * C_ + (i64)v * VEC, al);
#if CH_DY
                        w[j] = ldx_raw(dy + pj * C_ + (i64)v * VEC, al);
#endif
                    }
                }
#pragma unroll
                for (int j = 0; j < UNR; ++j) {
                    if (p + (i64)j * ROWS < p1) {
                        float f[VEC];
                        cvt_x(u[j], f);
#if CH_DY
                        float d[VEC];
                        cvt_x(w[j], d);
#pragma unroll
                        for (int k = 0; k < VEC; ++k) {
                            const float xh = (f[k] - M[k]) * R[k];
                            s[k] += d[k];
                            q[k] = fmaf(d[k], xh, q[k]);
                        }
#else
#pragma unroll
                        for (int k = 0; k < VEC; ++k) {
                            const float e = f[k] - K[k];
                            s[k] += e;
                            q[k] = fmaf(e, e, q[k]);
                        }
#endif
                    }
                }
            }
        }
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            sh[0][r][lane][k] = s[k];
            sh[1][r][lane][k] = q[k];
        }
        __syncthreads();
        // Sum over the block's rows, in row order; write the block's partials.
        for (int t = threadIdx.x; t < 2 * LANES * VEC; t += BLOCK) {
            const int which = t / (LANES * VEC), lv = t % (LANES * VEC);
            const int ln = lv / VEC, k = lv % VEC;
            if (v0 + ln < CV) {
                float acc = 0.f;
                for (int rr = 0; rr < ROWS; ++rr) acc += sh[which][rr][ln][k];
                part[((i64)which * (G_ * NBLK) + blockIdx.x) * C_ + (i64)(v0 + ln) * VEC + k] = acc;
            }
        }
        __syncthreads();
    }
#else
    const XT* x = (const XT*)xv;
#if CH_DY
    const XT* dy = (const XT*)dyv;
#endif
#if VW == 1
    const bool al = false;
#elif CH_DY
    const bool al = ((unsigned long long)x & 15) == 0 && ((unsigned long long)dy & 15) == 0;
#else
    const bool al = ((unsigned long long)x & 15) == 0;
#endif
    (void)al;
    const int t = TS == 32 ? (int)(threadIdx.x & 31) : (int)threadIdx.x;
    const i64 team = TS == 32 ? (((i64)blockIdx.x * 256 + threadIdx.x) >> 5) : (i64)blockIdx.x;
    const i64 nteams = TS == 32 ? (i64)gridDim.x * 8 : (i64)gridDim.x;
    __shared__ float red[2][2][8];
    int rb = 0;
    (void)red;
    (void)rb;
    for (i64 pl = team; pl < PLANES; pl += nteams) {
        const i64 ch = pl % C_;
        (void)ch;
#if CH_DY
        const float M = (float)LD_MN(mn, STAT_AT(MN, 0, ch)), R = (float)LD_IV(iv, STAT_AT(IV, 0, ch));
#else
        const float K = x2f(x[ch * HW_]);
#endif
        float s = 0.f, q = 0.f;
        const XT* xp = x + pl * HW_;
#if CH_DY
        const XT* dyp = dy + pl * HW_;
#endif
        for (i64 i0 = t; i0 < ITEMS; i0 += (i64)TS * UNR) {
            float fx[UNR][VW];
#if CH_DY
            float fd[UNR][VW];
#endif
#pragma unroll
            for (int j = 0; j < UNR; ++j) {
                const i64 i = i0 + (i64)j * TS;
                if (i < ITEMS) {
                    ldv(xp, i, al, fx[j]);
#if CH_DY
                    ldv(dyp, i, al, fd[j]);
#endif
                }
            }
#pragma unroll
            for (int j = 0; j < UNR; ++j) {
                if (i0 + (i64)j * TS < ITEMS) {
#pragma unroll
                    for (int k = 0; k < VW; ++k) {
                        const float f = fx[j][k];
#if CH_DY
                        const float d = fd[j][k];
                        const float xh = (f - M) * R;
                        s += d;
                        q = fmaf(d, xh, q);
#else
                        const float e = f - K;
                        s += e;
                        q = fmaf(e, e, q);
#endif
                    }
                }
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            s += __shfl_xor_sync(0xffffffffu, s, o);
            q += __shfl_xor_sync(0xffffffffu, q, o);
        }
        if (TS > 32) {
            if ((threadIdx.x & 31) == 0) {
                red[rb][0][threadIdx.x >> 5] = s;
                red[rb][1][threadIdx.x >> 5] = q;
            }
            __syncthreads();
            s = 0.f;
            q = 0.f;
#pragma unroll
            for (int w = 0; w < 8; ++w) {
                s += red[rb][0][w];
                q += red[rb][1][w];
            }
            rb ^= 1;
        }
        if (t == 0) {
            part[pl] = s;
            part[PLANES + pl] = q;
        }
    }
#endif
}
