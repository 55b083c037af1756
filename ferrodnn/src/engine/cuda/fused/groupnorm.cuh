// Group normalization's own kernels (fused/groupnorm.rs), after vectors.cuh (and channels.cuh
// for GN_NHWC_STATS): the statistics passes but the NHWC backward's, the finalize passes, and the
// NCHW apply pass. The NHWC backward's statistics pass and the NHWC apply passes are the channel
// kernels' (channel_stats.cuh, channel_apply.cuh in groups of one image), which leave and read
// the layouts below.
//
// Forward partials: part[2][GN_N * GN_G][GN_NB], per (image, group) GN_NB partial sums of
// `x - K` and `(x - K)^2`, K the group's first channel at the image's first position
// (x[GN_X0(n, g * GN_CPG)]): NHWC one per block of positions, NCHW one per (channel of the group,
// split of its plane). Backward partials: part[2][GN_N * GN_NBLK][GN_C], per image, block of
// positions and channel the sums of dy and dy * xhat (the channel kernels' layout).
// Coefficients: co[NCO][GN_N][GN_C], per (image, channel): the forward's (mean, a, b) with
// y = (x - mean) * a + b, the backward's (mean, A, B, Cs) with dx = A * dy + B * (x - mean) + Cs.
//
// The instantiation defines GN_KERNEL, one of:
//   GN_NHWC_STATS    forward NHWC statistics: a block per (image, slab of positions) in the
//                    channel kernels' geometry (CH_GROUPS: LANES, ROWS, BLOCK, CV, C_, P_, SLAB,
//                    NBLK, UNR): per-channel sums over the slab, then per group in channel order
//                    (a thread per group, a warp per group of 64 channels or more)
//   GN_PLANE_STATS   NCHW statistics: a warp per (plane, split), GN_SPLITS splits of GN_CHUNK
//                    items per plane of GN_ITEMS items of GN_VW elements (GN_HW elements); with
//                    GN_DY the backward's sums (LD_MN, LD_IV at GN_AT), in the backward layout
//   GN_FINALIZE      forward: a warp per (image, group): the group's mean and inverse deviation
//                    from its partials, in double, written to mean and inv_variance when
//                    GN_STATS (ST_MO, ST_VO at GN_AT(MO / VO, n, g)), and the coefficients
//                    (LD_SC, LD_BI, SC_S, BI_S); the parameter `eps` (double)
//   GN_BWD_FINALIZE  backward: blocks 0 .. GN_N * GN_G - 1 one per (image, group): sums of
//                    scale * dy and scale * dy * xhat over the group (LD_SC, SC_S; LD_MN, LD_IV
//                    at GN_AT), then the coefficients; the blocks after them 32 channels each:
//                    dscale and dbias, the column sums of the partials in order (ST_DS, ST_DB,
//                    DS_S, DB_S)
//   GN_PLANE_APPLY   NCHW apply: a thread per item, walking backwards, the coefficients reloaded
//                    where the plane changes; GN_DY for the backward's dx
// and for all: GN_THREADS (threads per block of the kernels but GN_NHWC_STATS), GN_N, GN_C,
// GN_G, GN_CPG (LL literals), GN_NB (forward partials per group), GN_M (elements per group),
// GN_X0(n, c); the backward's GN_NBLK; CH_EPILOGUE(v) where a pointwise chain follows the
// forward's apply (pointwise/ops.cuh before this file).

#define GN_FINALIZE 1
#define GN_BWD_FINALIZE 2
#define GN_PLANE_STATS 3
#define GN_PLANE_APPLY 4
#define GN_NHWC_STATS 5

// The offset of element (n, g) of a per-(image, group) tensor T ([N, G, 1, ...]).
#define GN_AT(T, n, g) ((n) * T##_S0 + (g) * T##_S1)

// Sum of v over the block (GN_THREADS threads), in a fixed order; every thread gets it.
__device__ __forceinline__ double gn_block_sum(double v, double* sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    double r = sh[0];
#pragma unroll
    for (int w = 1; w < GN_THREADS / 32; ++w) r += sh[w];
    __syncthreads();
    return r;
}

#if GN_KERNEL == GN_PLANE_STATS || GN_KERNEL == GN_PLANE_APPLY
// Item i of the planes: GN_VW elements to floats, GN_VW floats to y.
#if GN_VW > 1
__device__ __forceinline__ void gn_ld(const XT* p, i64 i, bool al, float* f) { cvt_x(ldx_raw(p + i * VEC, al), f); }
__device__ __forceinline__ void gn_st(YT* p, i64 i, bool al, const float* f) { st_y(p + i * VEC, al, f); }
#else
__device__ __forceinline__ void gn_ld(const XT* p, i64 i, bool al, float* f) {
    (void)al;
    f[0] = x2f(p[i]);
}
__device__ __forceinline__ void gn_st(YT* p, i64 i, bool al, const float* f) {
    (void)al;
    p[i] = f2y(f[0]);
}
#endif
#endif

#if GN_KERNEL == GN_FINALIZE

extern "C" __global__ void __launch_bounds__(GN_THREADS) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    const XT* x = (const XT*)xv;
    const int lane = threadIdx.x & 31;
    const i64 w = ((i64)blockIdx.x * GN_THREADS + threadIdx.x) >> 5;
    if (w >= GN_N * GN_G) return;
    const i64 n = w / GN_G, g = w % GN_G;
    const i64 c0 = g * GN_CPG;
    // Lane l adds partials l, l + 32, ...; then the lanes' sums (xor butterfly, the same bits in
    // every lane).
    double s = 0.0, q = 0.0;
#pragma unroll 8
    for (i64 b = lane; b < GN_NB; b += 32) {
        s += (double)part[w * GN_NB + b];
        q += (double)part[(GN_N * GN_G + w) * GN_NB + b];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        s += __shfl_xor_sync(0xffffffffu, s, o);
        q += __shfl_xor_sync(0xffffffffu, q, o);
    }
    const double m = (double)GN_M;
    const double dm = s / m;
    const double mean = (double)x2f(x[GN_X0(n, c0)]) + dm;
    const double var = fmax(q / m - dm * dm, 0.0);
    const double inv = 1.0 / sqrt(var + eps);
#if GN_STATS
    if (lane == 0) {
        ST_MO(mo, GN_AT(MO, n, g), mean);
        ST_VO(vo, GN_AT(VO, n, g), inv);
    }
#endif
    for (i64 c = c0 + lane; c < c0 + GN_CPG; c += 32) {
        co[(0 * GN_N + n) * GN_C + c] = (float)mean;
        co[(1 * GN_N + n) * GN_C + c] = (float)(inv * LD_SC(sc, c * SC_S));
        co[(2 * GN_N + n) * GN_C + c] = (float)LD_BI(bi, c * BI_S);
    }
}

#elif GN_KERNEL == GN_BWD_FINALIZE

// With g = dy * scale and xhat = (x - mean) * inv over the group's M elements:
// dx = inv * (g - mean(g) - xhat * mean(g * xhat)) = A dy + B (x - mean) + Cs with A = inv * scale,
// B = -inv^2 mean(g * xhat), Cs = -inv mean(g).
extern "C" __global__ void __launch_bounds__(GN_THREADS) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    __shared__ double sh[GN_THREADS / 32];
    __shared__ double cs[2][GN_THREADS / 32][32];
    if ((i64)blockIdx.x < GN_N * GN_G) {
        const i64 n = blockIdx.x / GN_G, g = blockIdx.x % GN_G;
        const i64 c0 = g * GN_CPG;
        double s = 0.0, q = 0.0;
        for (i64 i = threadIdx.x; i < GN_CPG * GN_NBLK; i += GN_THREADS) {
            const i64 b = i / GN_CPG, c = c0 + i % GN_CPG;
            const double w = LD_SC(sc, c * SC_S);
            s += w * (double)part[(n * GN_NBLK + b) * GN_C + c];
            q += w * (double)part[((GN_N + n) * GN_NBLK + b) * GN_C + c];
        }
        s = gn_block_sum(s, sh);
        q = gn_block_sum(q, sh);
        const double m = (double)GN_M;
        const double mean = LD_MN(mn, GN_AT(MN, n, g));
        const double inv = LD_IV(iv, GN_AT(IV, n, g));
        const double b2 = -inv * inv * (q / m);
        const double c3 = -inv * (s / m);
        for (i64 c = c0 + threadIdx.x; c < c0 + GN_CPG; c += GN_THREADS) {
            co[(0 * GN_N + n) * GN_C + c] = (float)mean;
            co[(1 * GN_N + n) * GN_C + c] = (float)(inv * LD_SC(sc, c * SC_S));
            co[(2 * GN_N + n) * GN_C + c] = (float)b2;
            co[(3 * GN_N + n) * GN_C + c] = (float)c3;
        }
    } else {
        // dscale = sum(dy * xhat), dbias = sum(dy) per channel: warp w adds the partial rows
        // w, w + GN_THREADS / 32, ... of its lane's channel, then warp 0 the warps' sums in order.
        const int ln = threadIdx.x & 31, w = threadIdx.x >> 5;
        const i64 c = ((i64)blockIdx.x - GN_N * GN_G) * 32 + ln;
        double a = 0.0, b = 0.0;
        if (c < GN_C) {
            for (i64 r = w; r < GN_N * GN_NBLK; r += GN_THREADS / 32) {
                a += (double)part[(GN_N * GN_NBLK + r) * GN_C + c];
                b += (double)part[r * GN_C + c];
            }
        }
        cs[0][w][ln] = a;
        cs[1][w][ln] = b;
        __syncthreads();
        if (w == 0 && c < GN_C) {
            a = cs[0][0][ln];
            b = cs[1][0][ln];
            for (int k = 1; k < GN_THREADS / 32; ++k) {
                a += cs[0][k][ln];
                b += cs[1][k][ln];
            }
            ST_DS(ds, c * DS_S, a);
            ST_DB(db, c * DB_S, b);
        }
    }
}

#elif GN_KERNEL == GN_PLANE_STATS

// Loads in flight per lane.
#define GN_UNR 4

extern "C" __global__ void __launch_bounds__(GN_THREADS) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    const XT* x = (const XT*)xv;
#if GN_DY
    const XT* dy = (const XT*)dyv;
#endif
#if GN_VW == 1
    const bool al = false;
#elif GN_DY
    const bool al = ((unsigned long long)x & 15) == 0 && ((unsigned long long)dy & 15) == 0;
#else
    const bool al = ((unsigned long long)x & 15) == 0;
#endif
    (void)al;
    const int lane = threadIdx.x & 31;
    const i64 warp0 = ((i64)blockIdx.x * GN_THREADS + threadIdx.x) >> 5;
    const i64 warps = ((i64)gridDim.x * GN_THREADS) >> 5;
    for (i64 u = warp0; u < GN_N * GN_C * GN_SPLITS; u += warps) {
        const i64 pl = u / GN_SPLITS, sp = u % GN_SPLITS;
        const i64 n = pl / GN_C, c = pl % GN_C;
        const i64 i0 = sp * GN_CHUNK;
        const i64 i1 = min(i0 + (i64)GN_CHUNK, (i64)GN_ITEMS);
        const XT* xp = x + pl * GN_HW;
#if GN_DY
        const XT* dyp = dy + pl * GN_HW;
        const float M = (float)LD_MN(mn, GN_AT(MN, n, c / GN_CPG));
        const float R = (float)LD_IV(iv, GN_AT(IV, n, c / GN_CPG));
#else
        const float K = x2f(x[GN_X0(n, c / GN_CPG * GN_CPG)]);
#endif
        float s = 0.f, q = 0.f;
        for (i64 i = i0 + lane; i < i1; i += 32 * GN_UNR) {
            float fx[GN_UNR][GN_VW];
#if GN_DY
            float fd[GN_UNR][GN_VW];
#endif
#pragma unroll
            for (int j = 0; j < GN_UNR; ++j) {
                const i64 ij = i + (i64)j * 32;
                if (ij < i1) {
                    gn_ld(xp, ij, al, fx[j]);
#if GN_DY
                    gn_ld(dyp, ij, al, fd[j]);
#endif
                }
            }
#pragma unroll
            for (int j = 0; j < GN_UNR; ++j) {
                if (i + (i64)j * 32 < i1) {
#pragma unroll
                    for (int k = 0; k < GN_VW; ++k) {
#if GN_DY
                        const float d = fd[j][k];
                        s += d;
                        q = fmaf(d, (fx[j][k] - M) * R, q);
#else
                        const float e = fx[j][k] - K;
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
        if (lane == 0) {
#if GN_DY
            part[(n * GN_SPLITS + sp) * GN_C + c] = s;
            part[((GN_N + n) * GN_SPLITS + sp) * GN_C + c] = q;
#else
            // Partial (c % GN_CPG) * GN_SPLITS + sp of group (n, c / GN_CPG): pl * GN_SPLITS + sp.
            part[u] = s;
            part[GN_N * GN_C * GN_SPLITS + u] = q;
#endif
        }
    }
}

#elif GN_KERNEL == GN_NHWC_STATS

// Channel sums a thread adds over the rows of the block (2 * LANES * VEC sums, BLOCK threads).
#define GN_PT ((2 * LANES * VEC + BLOCK - 1) / BLOCK)

extern "C" __global__ void CH_LAUNCH_BOUNDS KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    const XT* x = (const XT*)xv;
    const bool al = ((unsigned long long)x & 15) == 0;
    const int lane = threadIdx.x % LANES, r = threadIdx.x / LANES;
    const i64 n = blockIdx.x / NBLK, b = blockIdx.x % NBLK;
    const i64 q0 = n * P_;
    const i64 p0 = q0 + b * SLAB;
    const i64 p1 = min(p0 + SLAB, q0 + P_);
    __shared__ float sh[2][ROWS][LANES][VEC];
    __shared__ float gs[2][GN_G];
    for (int t = threadIdx.x; t < 2 * GN_G; t += BLOCK) gs[t / GN_G][t % GN_G] = 0.f;
    for (int v0 = 0; v0 < CV; v0 += LANES) {
        const int v = v0 + lane;
        float s[VEC], q[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            s[k] = 0.f;
            q[k] = 0.f;
        }
        if (v < CV) {
            // Each channel's shift: its group's first channel at the image's first position.
            float K[VEC];
#pragma unroll
            for (int k = 0; k < VEC; ++k) K[k] = x2f(x[GN_X0(n, ((i64)v * VEC + k) / GN_CPG * GN_CPG)]);
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
                            const float e = f[k] - K[k];
                            s[k] += e;
                            q[k] = fmaf(e, e, q[k]);
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
        // Per channel of the chunk: the sum over the rows, in row order, into row 0.
        float acc[GN_PT];
#pragma unroll
        for (int j = 0; j < GN_PT; ++j) {
            const int t = threadIdx.x + j * BLOCK;
            acc[j] = 0.f;
            if (t < 2 * LANES * VEC) {
                const int which = t / (LANES * VEC), lv = t % (LANES * VEC);
                for (int rr = 0; rr < ROWS; ++rr) acc[j] += sh[which][rr][lv / VEC][lv % VEC];
            }
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < GN_PT; ++j) {
            const int t = threadIdx.x + j * BLOCK;
            if (t < 2 * LANES * VEC) {
                const int which = t / (LANES * VEC), lv = t % (LANES * VEC);
                sh[which][0][lv / VEC][lv % VEC] = acc[j];
            }
        }
        __syncthreads();
        // Per group with channels in the chunk: their sums, in channel order, added to the
        // group's (chunks in order).
        const i64 clo = (i64)v0 * VEC, chi = min((i64)(v0 + LANES) * VEC, (i64)C_);
        const i64 glo = clo / GN_CPG, gn = (chi - 1) / GN_CPG - glo + 1;
#if GN_CPG >= 64
        // Long groups: a (full) warp per group, its lanes striding the channels, then the lanes'
        // sums in a fixed tree.
        const int w = threadIdx.x >> 5, wl = threadIdx.x & 31;
        if (w < BLOCK / 32) {
            for (i64 t = w; t < 2 * gn; t += BLOCK / 32) {
                const int which = (int)(t / gn);
                const i64 g = glo + t % gn;
                const i64 a0 = max(clo, g * GN_CPG), a1 = min(chi, (g + 1) * GN_CPG);
                float sum = 0.f;
                for (i64 c = a0 + wl; c < a1; c += 32) sum += sh[which][0][(c - clo) / VEC][(c - clo) % VEC];
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
                if (wl == 0) gs[which][g] += sum;
            }
        }
#else
        for (i64 t = threadIdx.x; t < 2 * gn; t += BLOCK) {
            const int which = (int)(t / gn);
            const i64 g = glo + t % gn;
            const i64 a0 = max(clo, g * GN_CPG), a1 = min(chi, (g + 1) * GN_CPG);
            float sum = 0.f;
            for (i64 c = a0; c < a1; ++c) sum += sh[which][0][(c - clo) / VEC][(c - clo) % VEC];
            gs[which][g] += sum;
        }
#endif
        __syncthreads();
    }
    for (int t = threadIdx.x; t < 2 * GN_G; t += BLOCK) {
        const int which = t / GN_G, g = t % GN_G;
        part[(((i64)which * GN_N + n) * GN_G + g) * NBLK + b] = gs[which][g];
    }
}

#elif GN_KERNEL == GN_PLANE_APPLY

#if GN_DY
#define NCO 4
#else
#define NCO 3
#endif

extern "C" __global__ void __launch_bounds__(GN_THREADS) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    const XT* x = (const XT*)xv;
#if GN_DY
    const XT* dy = (const XT*)dyv;
#endif
    YT* y = (YT*)yv;
#if GN_VW == 1
    const bool al = false;
#elif GN_DY
    const bool al = ((unsigned long long)x & 15) == 0 && ((unsigned long long)dy & 15) == 0 && ((unsigned long long)y & (YAL - 1)) == 0;
#else
    const bool al = ((unsigned long long)x & 15) == 0 && ((unsigned long long)y & (YAL - 1)) == 0;
#endif
    (void)al;
    const i64 planes = GN_N * GN_C;
    i64 cur = -1;
    float cf[NCO];
    const i64 stride = (i64)gridDim.x * blockDim.x;
    // Backwards: the statistics pass read the end last.
    for (i64 it = planes * GN_ITEMS - 1 - ((i64)blockIdx.x * blockDim.x + threadIdx.x); it >= 0; it -= stride) {
        const i64 pl = it / GN_ITEMS;
        if (pl != cur) {
            cur = pl;
#pragma unroll
            for (int m = 0; m < NCO; ++m) cf[m] = co[(i64)m * planes + pl];
        }
        float fx[GN_VW], o[GN_VW];
        gn_ld(x, it, al, fx);
#if GN_DY
        float fd[GN_VW];
        gn_ld(dy, it, al, fd);
#endif
#pragma unroll
        for (int k = 0; k < GN_VW; ++k) {
#if GN_DY
            o[k] = fmaf(cf[1], fd[k], fmaf(cf[2], fx[k] - cf[0], cf[3]));
#elif defined(CH_EPILOGUE)
            o[k] = CH_EPILOGUE(fmaf(fx[k] - cf[0], cf[1], cf[2]));
#else
            o[k] = fmaf(fx[k] - cf[0], cf[1], cf[2]);
#endif
        }
        gn_st(y, it, al, o);
    }
}

#endif
