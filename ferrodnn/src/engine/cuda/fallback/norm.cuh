// Normalizations in double, for the generic fallback (fallback/norm.rs).
//
// Every normalization is "statistics over groups of x's elements, then an affine map": a group
// is the set of elements of x that share one index of a smaller shape of the same rank (the
// statistics' dims, or scale's dims for dscale/dbias). The group kernels get the reduced axes
// as a bit mask (`mask`), the group count `G` and the group size `M`, and run one
// NORM_BLOCK-thread block per group (grid-stride over groups) with a shared-memory tree
// reduction: deterministic, no atomics. batchnorm inference and bn_finalize are elementwise.
//
// The instantiation defines NORM_KERNEL, one of:
//   NORM_FORWARD          layernorm, rmsnorm, instancenorm, adalayernorm: statistics, then y.
//                         NORM_RMS (no mean), NORM_BIAS (LD_BI), NORM_MEAN (ST_MEAN),
//                         NORM_INV (ST_INV); LD_X, LD_SC, ST_Y
//   NORM_BACKWARD_DX      dx, one block per statistics group: NORM_RMS (no mean: else
//                         LD_MEAN), LD_DY, LD_X, LD_INV, LD_SC, ST_DX
//   NORM_BACKWARD_DSCALE  dscale (and dbias when NORM_DBIAS), one block per element of scale:
//                         NORM_RMS, LD_MEAN, LD_DY, LD_X, LD_INV, ST_DSCALE, ST_DBIAS
//   NORM_BATCHNORM        batchnorm's forward with its peers' statistics, BN_PEERS(X) (a list
//                         of X(k, ld_<type>) for peer k), BN_PARTS (peers + 1, a double literal)
//                         and the running statistics when BN_RUNNING (LD_RM, LD_RV, ST_RM, ST_RV,
//                         the parameter `momentum`); LD_X, LD_SC, LD_BI, ST_Y, ST_MEAN, ST_INV
//   NORM_GENSTATS         per-channel sum and sum of squares: LD_X, ST_SUM, ST_SQ
//   NORM_BN_INFERENCE     y from x and the given statistics: LD_X, LD_SC, LD_BI, LD_MEAN,
//                         LD_INV, ST_Y
//   NORM_BN_FINALIZE      the equivalent scale and bias from genstats' sums: BN_COUNT,
//                         BN_RUNNING (with `momentum`); LD_SUM, LD_SQ, LD_SC, LD_BI,
//                         ST_EQ_SCALE, ST_EQ_BIAS, ST_SAVED_MEAN, ST_SAVED_INV, LD_RM, LD_RV,
//                         ST_RM, ST_RV
// and NORM_BLOCK, the block size of the group kernels (a power of two). Groupnorm sets
// NORM_GROUPED (else 0): axis 1 falls in groups of `cpg` channels (a parameter), the statistics
// ([N, G, 1, ...]) are read and written at the channel's group, and with NORM_SPLIT (the forward
// and dx kernels, whose groups are an image's channel group) axis 1 is split between the group
// index (its channel group) and the member index (the channel within it). The forward kernels,
// batchnorm and bn_finalize take `double epsilon` (and with running statistics `double
// momentum`) as parameters: values a user may change between executes.

#define NORM_FORWARD 0
#define NORM_BACKWARD_DX 1
#define NORM_BACKWARD_DSCALE 2
#define NORM_BATCHNORM 3
#define NORM_GENSTATS 4
#define NORM_BN_INFERENCE 5
#define NORM_BN_FINALIZE 6

#ifndef NORM_GROUPED
#define NORM_GROUPED 0
#endif

// Sum of `v` over the block (blockDim.x == NORM_BLOCK), in a fixed order; every thread gets it.
__device__ __forceinline__ double block_sum(double v, double* sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = NORM_BLOCK / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();
    return r;
}

// The multi-index of member `m` of group `g`: axes whose bit is set in `mask` are reduced
// (indexed by m, row-major), the others are the group's (indexed by g, row-major).
__device__ __forceinline__ void norm_index(const TRef& t, long long mask, i64 g, i64 m, i64* idx) {
    for (int a = t.rank - 1; a >= 0; --a) {
        i64 d = t.dims[a] > 0 ? t.dims[a] : 1;
        if ((mask >> a) & 1) {
            idx[a] = m % d;
            m /= d;
        } else {
            idx[a] = g % d;
            g /= d;
        }
    }
}

#if NORM_GROUPED
// norm_index for groupnorm: with NORM_SPLIT, axis 1's index is (the group index's channel
// group) * cpg + (the member index's channel within the group), the member index running over
// the group's channels, then the spatial axes (row-major), the group index over n, then the
// channel groups.
__device__ __forceinline__ void gn_index(const TRef& t, long long mask, i64 cpg, i64 g, i64 m, i64* idx) {
    for (int a = t.rank - 1; a >= 0; --a) {
        i64 d = t.dims[a] > 0 ? t.dims[a] : 1;
        if (NORM_SPLIT && a == 1) {
            i64 groups = d / cpg;
            idx[1] = (g % groups) * cpg + m % cpg;
            g /= groups;
            m /= cpg;
        } else if ((mask >> a) & 1) {
            idx[a] = m % d;
            m /= d;
        } else {
            idx[a] = g % d;
            g /= d;
        }
    }
}

// The offset in statistics tensor `s` ([N, G, 1, ...]) of the element at x's index `idx`.
__device__ __forceinline__ i64 gn_stat_offset(const TRef& s, const i64* idx, int rank, i64 cpg) {
    i64 sidx[8];
    for (int a = 0; a < rank; ++a) sidx[a] = a == 1 ? idx[1] / cpg : idx[a];
    return bcast_offset(s, sidx, rank);
}
#define NORM_INDEX(t, g, m, idx) gn_index(t, mask, cpg, g, m, idx)
#define NORM_STAT_OFF(s, idx) gn_stat_offset(s, idx, tx.rank, cpg)
#else
#define NORM_INDEX(t, g, m, idx) norm_index(t, mask, g, m, idx)
#define NORM_STAT_OFF(s, idx) bcast_offset(s, idx, tx.rank)
#endif

// The mean of the element at `idx` in the backward kernels (rmsnorm has none).
#if NORM_RMS
#define NORM_LOAD_MEAN 0.0
#else
#define NORM_LOAD_MEAN LD_MEAN(mn, NORM_STAT_OFF(tmn, idx))
#endif

#if NORM_KERNEL == NORM_FORWARD

#if NORM_BIAS
#define NORM_BIAS_TERM LD_BI(bi, bcast_offset(tbi, idx, tx.rank))
#else
#define NORM_BIAS_TERM 0.0
#endif

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    __shared__ double sh[NORM_BLOCK];
    for (i64 g = blockIdx.x; g < G; g += gridDim.x) {
        i64 idx[8];
        double mean = 0.0;
#if !NORM_RMS
        double s = 0.0;
        for (i64 m = threadIdx.x; m < M; m += blockDim.x) {
            NORM_INDEX(tx, g, m, idx);
            s += LD_X(x, offset_at(tx, idx));
        }
        s = block_sum(s, sh);
        mean = M > 0 ? s / (double)M : 0.0;
#endif
        double q = 0.0;
        for (i64 m = threadIdx.x; m < M; m += blockDim.x) {
            NORM_INDEX(tx, g, m, idx);
            double d = LD_X(x, offset_at(tx, idx)) - mean;
            q += d * d;
        }
        q = block_sum(q, sh);
        double var = M > 0 ? q / (double)M : 0.0;
        double inv = 1.0 / sqrt(var + epsilon);
        if (threadIdx.x == 0) {
            NORM_INDEX(tx, g, 0, idx);
#if NORM_MEAN
            ST_MEAN(mo, NORM_STAT_OFF(tmo, idx), mean);
#endif
#if NORM_INV
            ST_INV(iv, NORM_STAT_OFF(tiv, idx), inv);
#endif
        }
        for (i64 m = threadIdx.x; m < M; m += blockDim.x) {
            NORM_INDEX(tx, g, m, idx);
            double v = (LD_X(x, offset_at(tx, idx)) - mean) * inv * LD_SC(sc, bcast_offset(tsc, idx, tx.rank)) + NORM_BIAS_TERM;
            ST_Y(y, offset_at(ty, idx), v);
        }
    }
}

#elif NORM_KERNEL == NORM_BACKWARD_DX

// With xhat = (x - mean) * inv and g = dy * scale over the n elements of a statistics group:
// dx = inv * (g - mean(g) - xhat * mean(g * xhat)) (rmsnorm drops mean(g)).
extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    __shared__ double sh[NORM_BLOCK];
    for (i64 g = blockIdx.x; g < G; g += gridDim.x) {
        i64 idx[8];
        NORM_INDEX(tx, g, 0, idx);
        double mean = NORM_LOAD_MEAN;
        double r = LD_INV(iv, NORM_STAT_OFF(tiv, idx));
        double sg = 0.0, sgx = 0.0;
        for (i64 m = threadIdx.x; m < M; m += blockDim.x) {
            NORM_INDEX(tx, g, m, idx);
            double gi = LD_DY(dy, offset_at(tdy, idx)) * LD_SC(sc, bcast_offset(tsc, idx, tx.rank));
            double xhat = (LD_X(x, offset_at(tx, idx)) - mean) * r;
            sg += gi;
            sgx += gi * xhat;
        }
        sg = block_sum(sg, sh);
        sgx = block_sum(sgx, sh);
        double n = M > 1 ? (double)M : 1.0;
#if NORM_RMS
        double mg = 0.0;
#else
        double mg = sg / n;
#endif
        double mgx = sgx / n;
        for (i64 m = threadIdx.x; m < M; m += blockDim.x) {
            NORM_INDEX(tx, g, m, idx);
            double gi = LD_DY(dy, offset_at(tdy, idx)) * LD_SC(sc, bcast_offset(tsc, idx, tx.rank));
            double xhat = (LD_X(x, offset_at(tx, idx)) - mean) * r;
            ST_DX(dx, offset_at(tdx, idx), r * (gi - mg - xhat * mgx));
        }
    }
}

#elif NORM_KERNEL == NORM_BACKWARD_DSCALE

// dscale = sum(dy * xhat), dbias = sum(dy) over the elements sharing a scale value.
extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    __shared__ double sh[NORM_BLOCK];
    for (i64 g = blockIdx.x; g < G; g += gridDim.x) {
        i64 idx[8];
        double a = 0.0, b = 0.0;
        for (i64 m = threadIdx.x; m < M; m += blockDim.x) {
            NORM_INDEX(tx, g, m, idx);
            double mean = NORM_LOAD_MEAN;
            double r = LD_INV(iv, NORM_STAT_OFF(tiv, idx));
            double d = LD_DY(dy, offset_at(tdy, idx));
            a += d * ((LD_X(x, offset_at(tx, idx)) - mean) * r);
            b += d;
        }
        a = block_sum(a, sh);
        b = block_sum(b, sh);
        (void)b;
        if (threadIdx.x == 0) {
            NORM_INDEX(tx, g, 0, idx);
            ST_DSCALE(ds, bcast_offset(tds, idx, tx.rank), a);
#if NORM_DBIAS
            ST_DBIAS(db, bcast_offset(tdb, idx, tx.rank), b);
#endif
        }
    }
}

#elif NORM_KERNEL == NORM_BATCHNORM

// Peer k's (mean, M2) from its (sum, sum of squares) over as many elements as x's, and its
// terms of the combined mean and M2.
#define BN_PEER_STATS(k, LD)                                          \
    double ps##k = LD(p##k, g * tp##k.strides[1]);                    \
    double pq##k = LD(p##k, tp##k.strides[0] + g * tp##k.strides[1]); \
    double pmean##k = ps##k / nl;                                     \
    double pm2##k = pq##k - ps##k * ps##k / nl;
#define BN_PEER_MEAN(k, LD) +pmean##k
#define BN_PEER_M2(k, LD) +(pm2##k + nl * (pmean##k - mu) * (pmean##k - mu))

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    __shared__ double sh[NORM_BLOCK];
    for (i64 g = blockIdx.x; g < G; g += gridDim.x) {
        i64 idx[8];
        double s = 0.0;
        for (i64 m = threadIdx.x; m < M; m += blockDim.x) {
            norm_index(tx, mask, g, m, idx);
            s += LD_X(x, offset_at(tx, idx));
        }
        s = block_sum(s, sh);
        double lmean = M > 0 ? s / (double)M : 0.0;
        double q = 0.0;
        for (i64 m = threadIdx.x; m < M; m += blockDim.x) {
            norm_index(tx, mask, g, m, idx);
            double d = LD_X(x, offset_at(tx, idx)) - lmean;
            q += d * d;
        }
        q = block_sum(q, sh);
        double nl = (double)M;
        double lm2 = M > 0 ? (q / nl) * nl : 0.0;
        BN_PEERS(BN_PEER_STATS)
        double total = nl * BN_PARTS;
        double mu = (0.0 + lmean BN_PEERS(BN_PEER_MEAN)) / BN_PARTS;
        double m2 = 0.0 + (lm2 + nl * (lmean - mu) * (lmean - mu)) BN_PEERS(BN_PEER_M2);
        double var = fmax(m2 / total, 0.0);
        double inv = 1.0 / sqrt(var + epsilon);
        if (threadIdx.x == 0) {
            norm_index(tx, mask, g, 0, idx);
            ST_MEAN(mo, bcast_offset(tmo, idx, tx.rank), mu);
            ST_INV(iv, bcast_offset(tiv, idx, tx.rank), inv);
#if BN_RUNNING
            double unbias = total / (total - 1.0);
            ST_RM(orm, bcast_offset(torm, idx, tx.rank), (1.0 - momentum) * LD_RM(rm, bcast_offset(trm, idx, tx.rank)) + momentum * mu);
            ST_RV(orv, bcast_offset(torv, idx, tx.rank), (1.0 - momentum) * LD_RV(rv, bcast_offset(trv, idx, tx.rank)) + momentum * var * unbias);
#endif
        }
        for (i64 m = threadIdx.x; m < M; m += blockDim.x) {
            norm_index(tx, mask, g, m, idx);
            double v = (LD_X(x, offset_at(tx, idx)) - mu) * inv * LD_SC(sc, bcast_offset(tsc, idx, tx.rank)) + LD_BI(bi, bcast_offset(tbi, idx, tx.rank));
            ST_Y(y, offset_at(ty, idx), v);
        }
    }
}

#elif NORM_KERNEL == NORM_GENSTATS

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    __shared__ double sh[NORM_BLOCK];
    for (i64 g = blockIdx.x; g < G; g += gridDim.x) {
        i64 idx[8];
        double s = 0.0, q = 0.0;
        for (i64 m = threadIdx.x; m < M; m += blockDim.x) {
            norm_index(tx, mask, g, m, idx);
            double v = LD_X(x, offset_at(tx, idx));
            s += v;
            q += v * v;
        }
        s = block_sum(s, sh);
        q = block_sum(q, sh);
        if (threadIdx.x == 0) {
            norm_index(tx, mask, g, 0, idx);
            ST_SUM(su, bcast_offset(tsu, idx, tx.rank), s);
            ST_SQ(sq, bcast_offset(tsq, idx, tx.rank), q);
        }
    }
}

#elif NORM_KERNEL == NORM_BN_INFERENCE

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    i64 n = numel(tx);
    GRID_STRIDE(i, n) {
        i64 idx[8];
        unravel(tx, i, idx);
        double sc_v = LD_SC(sc, bcast_offset(tsc, idx, tx.rank));
        double bi_v = LD_BI(bi, bcast_offset(tbi, idx, tx.rank));
        double mn_v = LD_MEAN(mn, bcast_offset(tmn, idx, tx.rank));
        double iv_v = LD_INV(iv, bcast_offset(tiv, idx, tx.rank));
        double v = (LD_X(x, offset_at(tx, idx)) - mn_v) * iv_v * sc_v + bi_v;
        ST_Y(y, offset_at(ty, idx), v);
    }
}

#elif NORM_KERNEL == NORM_BN_FINALIZE

// Every tensor has sum's dims: element i is the same logical index in each.
extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    i64 n = numel(tsu);
    const double count = BN_COUNT;
    GRID_STRIDE(i, n) {
        i64 idx[8];
        unravel(tsu, i, idx);
        double su_v = LD_SUM(su, offset_at(tsu, idx));
        double sq_v = LD_SQ(sq, offset_at(tsq, idx));
        double sc_v = LD_SC(sc, offset_at(tsc, idx));
        double bi_v = LD_BI(bi, offset_at(tbi, idx));
        double mean = su_v / count;
        double var = fmax(sq_v / count - mean * mean, 0.0);
        double inv = 1.0 / sqrt(var + epsilon);
        double eq_scale = sc_v * inv;
        ST_EQ_SCALE(es, offset_at(tes, idx), eq_scale);
        ST_EQ_BIAS(eb, offset_at(teb, idx), bi_v - mean * eq_scale);
        ST_SAVED_MEAN(sm, offset_at(tsm, idx), mean);
        ST_SAVED_INV(si, offset_at(tsi, idx), inv);
#if BN_RUNNING
        double unbias = count / (count - 1.0);
        ST_RM(nrm, offset_at(tnrm, idx), (1.0 - momentum) * LD_RM(rm, offset_at(trm, idx)) + momentum * mean);
        ST_RV(nrv, offset_at(tnrv, idx), (1.0 - momentum) * LD_RV(rv, offset_at(trv, idx)) + momentum * var * unbias);
#endif
    }
}

#endif
