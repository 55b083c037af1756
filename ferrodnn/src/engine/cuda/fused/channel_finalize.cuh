// The finalize pass of the channel kernels (fused/channels.rs), after channels.cuh: a block of
// 32 warps takes 32 channels; the partials of channel_stats.cuh are summed in f64 in a fixed
// order into `s` and `q` per (group, channel), then FIN_OP's work with them:
//   FIN_BN        batchnorm training forward: mean and inv_variance (ST_MO, ST_VO), with
//                 FIN_RUNNING the running statistics (LD_RM, LD_RV, ST_ORM, ST_ORV, UNBIAS:
//                 n / (n - 1)), and the apply pass's coefficients co[3][C] (mean, inv * scale,
//                 bias: LD_SC, LD_BI); the parameters `eps` and, with FIN_RUNNING, `momentum`
//                 (doubles)
//   FIN_GENSTATS  genstats: the sums of x and x^2 with the shift undone (ST_SU, ST_SQ)
//   FIN_IN        instancenorm forward: per group, the coefficients co[3][G][C] and with
//                 FIN_STATS mean and inv_variance (ST_MO, ST_VO); the parameter `eps` (double)
//   FIN_BWD       the backward: per group, the coefficients co[4][G][C] of dx (LD_MN, LD_IV,
//                 LD_SC), then dscale and dbias (ST_DS, ST_DB) summed over the groups in order
// By CH_GEOM: CH_SLABS (FIN_BN, FIN_GENSTATS), partials part[2][NBLK][C], 32 segments of them
// per channel; else (CH_GROUPS, CH_PLANES) partials part[2][G_ * NBLK][C], and either the
// groups one after the other (each a round of dependent loads and barriers), or with
// FIN_GROUPED (several groups) GPP groups at once: SEGS = 32 / GPP warps per group, each summing
// every SEGS-th partial of the group in order, the group's first warp adding the SEGS sums in
// order; with SPLIT, blockIdx.y takes its own GPP groups (no dscale and dbias then), else the
// block walks all the groups GPP at a time and the sums over the groups go per group lane over
// its groups, then over the lanes.

#define FIN_BN 1
#define FIN_GENSTATS 2
#define FIN_IN 3
#define FIN_BWD 4

// CH_SLABS: the shared sums of squares (genstats has an output named sq; the names are in the
// PTX).
#if FIN_OP == FIN_GENSTATS
#define SLAB_SQ sq2
#else
#define SLAB_SQ sq
#endif
// FIN_GROUPED: warps per group.
#define SEGS (32 / GPP)

extern "C" __global__ void __launch_bounds__(1024) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
#if CH_GEOM == CH_SLABS
    __shared__ double ss[32][33], SLAB_SQ[32][33];
    const int ln = threadIdx.x & 31, seg = threadIdx.x >> 5;
    const i64 c = (i64)blockIdx.x * 32 + ln;
    double s = 0.0, q = 0.0;
    if (c < C_) {
#pragma unroll 4
        for (int b = seg; b < NBLK; b += 32) {
            s += (double)part[(i64)b * C_ + c];
            q += (double)part[((i64)NBLK + b) * C_ + c];
        }
    }
    ss[seg][ln] = s;
    SLAB_SQ[seg][ln] = q;
    __syncthreads();
    if (seg == 0 && c < C_) {
        s = 0.0;
        q = 0.0;
        for (int k = 0; k < 32; ++k) {
            s += ss[k][ln];
            q += SLAB_SQ[k][ln];
        }
#if FIN_OP == FIN_BN
        const double n = (double)P_;
        const double dm = s / n;
        const double mu = (double)x2f(((const XT*)xv)[c]) + dm;
        const double var = fmax(q / n - dm * dm, 0.0);
        const double inv = 1.0 / sqrt(var + eps);
        ST_MO(mo, c * MO_S, mu);
        ST_VO(vo, c * VO_S, inv);
#if FIN_RUNNING
        const double unbias = UNBIAS;
        ST_ORM(orm, c * ORM_S, (1.0 - momentum) * LD_RM(rm, c * RM_S) + momentum * mu);
        ST_ORV(orv, c * ORV_S, (1.0 - momentum) * LD_RV(rv, c * RV_S) + momentum * var * unbias);
#endif
        co[c] = (float)mu;
        co[C_ + c] = (float)(inv * LD_SC(sc, c * SC_S));
        co[2 * C_ + c] = (float)LD_BI(bi, c * BI_S);
#else
        // s, q: sums of d = x - K and d^2; sum x = s + n K, sum x^2 = q + 2 K s + n K^2.
        const double n = (double)P_;
        const double K = (double)x2f(((const XT*)xv)[c]);
        ST_SU(su, c * SU_S, s + n * K);
        ST_SQ(sq, c * SQ_S, q + 2.0 * K * s + n * K * K);
#endif
    }
#else
    __shared__ double fin_s[32][33], fin_q[32][33];
#if FIN_GROUPED
    const int ln = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int seg = w % SEGS, gl = w / SEGS;
    const i64 c = (i64)blockIdx.x * 32 + ln;
    double a0 = 0.0, a1 = 0.0;
    (void)a0;
    (void)a1;
    const i64 gbeg = SPLIT ? (i64)blockIdx.y * GPP : 0;
    const i64 gend = SPLIT ? min(gbeg + GPP, G_) : G_;
    for (i64 g0 = gbeg; g0 < gend; g0 += GPP) {
        const i64 g = g0 + gl;
        double s = 0.0, q = 0.0;
        if (c < C_ && g < gend) {
#pragma unroll 8
            for (int b = seg; b < NBLK; b += SEGS) {
                const i64 bi = g * NBLK + b;
                s += (double)part[bi * C_ + c];
                q += (double)part[((i64)G_ * NBLK + bi) * C_ + c];
            }
        }
        fin_s[w][ln] = s;
        fin_q[w][ln] = q;
        __syncthreads();
        if (seg == 0 && c < C_ && g < gend) {
            s = 0.0;
            q = 0.0;
            for (int k = 0; k < SEGS; ++k) {
                s += fin_s[gl * SEGS + k][ln];
                q += fin_q[gl * SEGS + k][ln];
            }
#else
    const int ln = threadIdx.x & 31, seg = threadIdx.x >> 5;
    const i64 c = (i64)blockIdx.x * 32 + ln;
    double a0 = 0.0, a1 = 0.0;
    (void)a0;
    (void)a1;
    for (i64 g = 0; g < G_; ++g) {
        double s = 0.0, q = 0.0;
        if (c < C_) {
            for (int b = seg; b < NBLK; b += 32) {
                const i64 bi = g * NBLK + b;
                s += (double)part[bi * C_ + c];
                q += (double)part[((i64)G_ * NBLK + bi) * C_ + c];
            }
        }
        fin_s[seg][ln] = s;
        fin_q[seg][ln] = q;
        __syncthreads();
        if (seg == 0 && c < C_) {
            s = 0.0;
            q = 0.0;
            for (int k = 0; k < 32; ++k) {
                s += fin_s[k][ln];
                q += fin_q[k][ln];
            }
#endif
            // Group g, channel c: the sums s and q over its n positions.
            const double n = (double)P_;
            (void)n;
#if FIN_OP == FIN_BWD
            const double mnv = LD_MN(mn, STAT_AT(MN, g, c)), ivv = LD_IV(iv, STAT_AT(IV, g, c)), scv = LD_SC(sc, STAT_AT(SC, 0, c));
            const double ca = ivv * scv;
            co[((i64)0 * G_ + g) * C_ + c] = (float)mnv;
            co[((i64)1 * G_ + g) * C_ + c] = (float)ca;
            co[((i64)2 * G_ + g) * C_ + c] = (float)(-ca * ivv * (q / n));
            co[((i64)3 * G_ + g) * C_ + c] = (float)(-ca * (s / n));
            a0 += q;
            a1 += s;
#elif FIN_OP == FIN_IN
            const double K = (double)x2f(((const XT*)xv)[g * P_ * C_ + c]);
            const double dm = s / n;
            const double mu = K + dm;
            const double var = fmax(q / n - dm * dm, 0.0);
            const double inv = 1.0 / sqrt(var + eps);
#if FIN_STATS
            ST_MO(mo, STAT_AT(MO, g, c), mu);
            ST_VO(vo, STAT_AT(VO, g, c), inv);
#endif
            co[((i64)0 * G_ + g) * C_ + c] = (float)mu;
            co[((i64)1 * G_ + g) * C_ + c] = (float)(inv * LD_SC(sc, STAT_AT(SC, 0, c)));
            co[((i64)2 * G_ + g) * C_ + c] = (float)LD_BI(bi, STAT_AT(BI, 0, c));
#elif FIN_OP == FIN_BN
            const double K = (double)x2f(((const XT*)xv)[c * HW_]);
            const double dm = s / n;
            const double mu = K + dm;
            const double var = fmax(q / n - dm * dm, 0.0);
            const double inv = 1.0 / sqrt(var + eps);
            ST_MO(mo, STAT_AT(MO, 0, c), mu);
            ST_VO(vo, STAT_AT(VO, 0, c), inv);
#if FIN_RUNNING
            const double unbias = UNBIAS;
            ST_ORM(orm, STAT_AT(ORM, 0, c), (1.0 - momentum) * LD_RM(rm, STAT_AT(RM, 0, c)) + momentum * mu);
            ST_ORV(orv, STAT_AT(ORV, 0, c), (1.0 - momentum) * LD_RV(rv, STAT_AT(RV, 0, c)) + momentum * var * unbias);
#endif
            co[c] = (float)mu;
            co[C_ + c] = (float)(inv * LD_SC(sc, STAT_AT(SC, 0, c)));
            co[2 * C_ + c] = (float)LD_BI(bi, STAT_AT(BI, 0, c));
#else
            const double K = (double)x2f(((const XT*)xv)[c * HW_]);
            ST_SU(su, STAT_AT(SU, 0, c), s + n * K);
            ST_SQ(sq, STAT_AT(SQ, 0, c), q + 2.0 * K * s + n * K * K);
#endif
        }
        __syncthreads();
    }
    // Per channel: dscale and dbias, the sums over the groups (a0, a1).
#if FIN_GROUPED
    if (!SPLIT) {
        if (seg == 0) {
            fin_s[gl][ln] = a0;
            fin_q[gl][ln] = a1;
        }
        __syncthreads();
        if (w == 0 && c < C_) {
            a0 = 0.0;
            a1 = 0.0;
            for (int k = 0; k < GPP; ++k) {
                a0 += fin_s[k][ln];
                a1 += fin_q[k][ln];
            }
#if FIN_OP == FIN_BWD
            ST_DS(ds, STAT_AT(DS, 0, c), a0);
            ST_DB(db, STAT_AT(DB, 0, c), a1);
#endif
        }
    }
#else
    if (seg == 0 && c < C_) {
#if FIN_OP == FIN_BWD
        ST_DS(ds, STAT_AT(DS, 0, c), a0);
        ST_DB(db, STAT_AT(DB, 0, c), a1);
#endif
    }
#endif
#endif
}
