// Convolution fprop, dgrad and wgrad (1 to 3 spatial dims, groups, any strides) in double, for
// the generic fallback (fallback/conv.rs); after compute.cuh. One thread per output element,
// walking the output in its memory order; the inner sum runs over the same terms in the same
// order as the CPU engine, each input rounded to the compute type first (cvq).
//
// Per spatial dim, tap `f` of output position `o` reads input position
// `i = o * stride - pre_padding + f * dilation`; convolution mode reads the weight of tap `f`
// at `filter - 1 - f`. Output channel `k` is in group `k / (K / groups)`.
//
// The instantiation defines:
//   CONV_PASS            CONV_FPROP (y from x, w: LD_X, LD_W, ST_Y), CONV_DGRAD (dx from dy, w:
//                        LD_DY, LD_W, ST_DX) or CONV_WGRAD (dw from dy, x: LD_DY, LD_X, ST_DW)
//   CONV_SR              the spatial rank (1 to 3)
//   CONV_FLIP            1: convolution mode (flipped taps), 0: cross-correlation
//   CONV_PRE, CONV_STRIDE, CONV_DILATION   per spatial dim, as C initializer lists
//   CONV_ORDER           the output's axes from the slowest to the fastest in memory

#define CONV_FPROP 0
#define CONV_DGRAD 1
#define CONV_WGRAD 2

#define SR CONV_SR
#define FLIP CONV_FLIP
__constant__ i64 PRE[SR] = { CONV_PRE };
__constant__ i64 STR[SR] = { CONV_STRIDE };
__constant__ i64 DIL[SR] = { CONV_DILATION };
__constant__ int ORD[SR + 2] = { CONV_ORDER };

#if CONV_PASS == CONV_FPROP

// y[n, k, o] = sum over the group's channels cl, then taps f (row-major) inside the image, of
// x[n, c, o*s - p + f*d] * w[k, cl, f'] (f' flipped in convolution mode).
extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    const i64 C = tx.dims[1], K = tw.dims[0], CPG = tw.dims[1];
    const i64 KPG = K / (C / CPG);
    i64 ftot = 1;
    for (int d = 0; d < SR; ++d) ftot *= tw.dims[2 + d];
    const i64 total = numel(ty);
    GRID_STRIDE(e, total) {
        i64 idx[8];
        unravel_ord(ty, ORD, SR + 2, e, idx);
        const i64 n = idx[0], k = idx[1];
        const i64 g = k / KPG;
        double acc = 0.0;
        for (i64 cl = 0; cl < CPG; ++cl) {
            const i64 xb = n * tx.strides[0] + (g * CPG + cl) * tx.strides[1];
            const i64 wb = k * tw.strides[0] + cl * tw.strides[1];
            for (i64 t = 0; t < ftot; ++t) {
                i64 rem = t, xo = xb, wo = wb;
                bool inside = true;
                for (int d = SR - 1; d >= 0; --d) {
                    const i64 fd = tw.dims[2 + d];
                    const i64 f = rem % fd;
                    rem /= fd;
                    const i64 i = idx[2 + d] * STR[d] - PRE[d] + f * DIL[d];
                    if (i < 0 || i >= tx.dims[2 + d]) {
                        inside = false;
                        break;
                    }
                    xo += i * tx.strides[2 + d];
                    wo += (FLIP ? fd - 1 - f : f) * tw.strides[2 + d];
                }
                if (inside) acc = acc + __dmul_rn(cvq(LD_X(x, xo)), cvq(LD_W(w, wo)));
            }
        }
        ST_Y(y, offset_at(ty, idx), acc);
    }
}

#elif CONV_PASS == CONV_DGRAD

// dx[n, c, i] = sum over the group's output channels kl, then taps f (row-major), for the
// output position o with o*s - p + f*d = i (when there is one), of dy[n, k, o] * w[k, cl, f'].
extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    const i64 C = tdx.dims[1], K = tw.dims[0], CPG = tw.dims[1];
    const i64 KPG = K / (C / CPG);
    i64 ftot = 1;
    for (int d = 0; d < SR; ++d) ftot *= tw.dims[2 + d];
    const i64 total = numel(tdx);
    GRID_STRIDE(e, total) {
        i64 idx[8];
        unravel_ord(tdx, ORD, SR + 2, e, idx);
        const i64 n = idx[0], c = idx[1];
        const i64 g = c / CPG, cl = c % CPG;
        double acc = 0.0;
        for (i64 kl = 0; kl < KPG; ++kl) {
            const i64 k = g * KPG + kl;
            const i64 yb = n * tdy.strides[0] + k * tdy.strides[1];
            const i64 wb = k * tw.strides[0] + cl * tw.strides[1];
            for (i64 t = 0; t < ftot; ++t) {
                i64 rem = t, yo = yb, wo = wb;
                bool hit = true;
                for (int d = SR - 1; d >= 0; --d) {
                    const i64 fd = tw.dims[2 + d];
                    const i64 f = rem % fd;
                    rem /= fd;
                    const i64 num = idx[2 + d] + PRE[d] - f * DIL[d];
                    if (num < 0 || num % STR[d] != 0) {
                        hit = false;
                        break;
                    }
                    const i64 o = num / STR[d];
                    if (o >= tdy.dims[2 + d]) {
                        hit = false;
                        break;
                    }
                    yo += o * tdy.strides[2 + d];
                    wo += (FLIP ? fd - 1 - f : f) * tw.strides[2 + d];
                }
                if (hit) acc = acc + __dmul_rn(cvq(LD_DY(dy, yo)), cvq(LD_W(w, wo)));
            }
        }
        ST_DX(dx, offset_at(tdx, idx), acc);
    }
}

#else

// dw[k, cl, s] = sum over n, then output positions o (row-major) whose tap f (s flipped in
// convolution mode) lands inside the image, of dy[n, k, o] * x[n, c, o*s - p + f*d], with c
// the image channel of k's group that filter channel cl reads.
extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    const i64 N = tx.dims[0], C = tx.dims[1], K = tdw.dims[0], CPG = tdw.dims[1];
    const i64 KPG = K / (C / CPG);
    i64 otot = 1;
    for (int d = 0; d < SR; ++d) otot *= tdy.dims[2 + d];
    const i64 total = numel(tdw);
    GRID_STRIDE(e, total) {
        i64 idx[8];
        unravel_ord(tdw, ORD, SR + 2, e, idx);
        const i64 k = idx[0], cl = idx[1];
        const i64 c = (k / KPG) * CPG + cl;
        i64 f[SR];
        for (int d = 0; d < SR; ++d) f[d] = FLIP ? tdw.dims[2 + d] - 1 - idx[2 + d] : idx[2 + d];
        double acc = 0.0;
        for (i64 n = 0; n < N; ++n) {
            const i64 yb = n * tdy.strides[0] + k * tdy.strides[1];
            const i64 xb = n * tx.strides[0] + c * tx.strides[1];
            for (i64 t = 0; t < otot; ++t) {
                i64 rem = t, yo = yb, xo = xb;
                bool inside = true;
                for (int d = SR - 1; d >= 0; --d) {
                    const i64 od = tdy.dims[2 + d];
                    const i64 o = rem % od;
                    rem /= od;
                    const i64 i = o * STR[d] - PRE[d] + f[d] * DIL[d];
                    if (i < 0 || i >= tx.dims[2 + d]) {
                        inside = false;
                        break;
                    }
                    yo += o * tdy.strides[2 + d];
                    xo += i * tx.strides[2 + d];
                }
                if (inside) acc = acc + __dmul_rn(cvq(LD_DY(dy, yo)), cvq(LD_X(x, xo)));
            }
        }
        ST_DW(dw, offset_at(tdw, idx), acc);
    }
}

#endif
