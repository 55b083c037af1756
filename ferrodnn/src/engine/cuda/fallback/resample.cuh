// Pooling (max, average including or excluding padding) over 1 to 3 spatial dims of
// `[n, c, spatial...]`, forward and backward, in double, for the generic fallback
// (fallback/resample.rs).
//
// Output position `o` along a spatial dim covers input positions
// `[o * stride - pre, o * stride - pre + window)`; those inside `[0, in)` are real.
// - Forward: one thread per output element; its window in row-major order (max: the first
//   maximal element, a NaN counting as maximal; average: the sum over the divisor).
// - Backward: one thread per `dx` element gathers from the output windows that contain it, in
//   row-major output order: for max, it recomputes each window's first argmax and takes `dy`
//   only where that is itself; for the averages it adds `dy / divisor`.
//
// The instantiation defines:
//   RS_NSP               the number of spatial dims (1 to 3)
//   RS_WINDOW, RS_STRIDE, RS_PRE, RS_POST   per spatial dim, as C initializer lists
//   RS_MAX               1: max pooling, 0: average
//   RS_INCLUDE_PADDING   1: the average's divisor counts the padding, 0: only real elements
//   RS_BACKWARD          1: dx from dy and x (LD_DY, ST_DX), 0: y from x (ST_Y); LD_X

#define RS_CONSTS                                                                             \
    const i64 W[RS_NSP] = { RS_WINDOW }, S[RS_NSP] = { RS_STRIDE }, PRE[RS_NSP] = { RS_PRE }, \
              POST[RS_NSP] = { RS_POST };                                                     \
    (void)W;                                                                                  \
    (void)S;                                                                                  \
    (void)PRE;                                                                                \
    (void)POST;

// Nested loops of `v0, v1, ...` over [lo[d], hi[d]) (outermost dim first), the offset of the
// spatial position `v0, v1, ...` in `t`, its row-major index within a plane of dims `in`, and
// the position as an initializer list.
#define RS_LOOP(v, d, lo, hi) for (i64 v##d = lo[d]; v##d < hi[d]; ++v##d)
#define RS_TERM(v, d, t) +v##d * t.strides[d + 2]
#if RS_NSP == 1
#define RS_FOR(v, lo, hi) RS_LOOP(v, 0, lo, hi)
#define RS_OFFSET(v, t) RS_TERM(v, 0, t)
#define RS_FLAT(v) ((0) * in[0] + v##0)
#define RS_POSITION(v) v##0
#elif RS_NSP == 2
#define RS_FOR(v, lo, hi) RS_LOOP(v, 0, lo, hi) RS_LOOP(v, 1, lo, hi)
#define RS_OFFSET(v, t) RS_TERM(v, 0, t) RS_TERM(v, 1, t)
#define RS_FLAT(v) (((0) * in[0] + v##0) * in[1] + v##1)
#define RS_POSITION(v) v##0, v##1
#else
#define RS_FOR(v, lo, hi) RS_LOOP(v, 0, lo, hi) RS_LOOP(v, 1, lo, hi) RS_LOOP(v, 2, lo, hi)
#define RS_OFFSET(v, t) RS_TERM(v, 0, t) RS_TERM(v, 1, t) RS_TERM(v, 2, t)
#define RS_FLAT(v) ((((0) * in[0] + v##0) * in[1] + v##1) * in[2] + v##2)
#define RS_POSITION(v) v##0, v##1, v##2
#endif

// Floor division by a positive b.
__device__ __forceinline__ i64 fdiv(i64 a, i64 b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// The real input range [lo, hi) of output position o per spatial dim; returns the divisor:
// the window size clipped at the padded input (including padding) or the real count.
__device__ __forceinline__ double rs_window(const i64* o, const i64* in, i64* lo, i64* hi) {
    RS_CONSTS
    double swp = 1.0, rc = 1.0;
#pragma unroll
    for (int d = 0; d < RS_NSP; ++d) {
        i64 start = o[d] * S[d] - PRE[d];
        i64 end = start + W[d];
        i64 l = start > 0 ? start : 0;
        i64 h = end < in[d] ? end : in[d];
        lo[d] = l;
        hi[d] = h > l ? h : l;
        i64 pe = end < in[d] + POST[d] ? end : in[d] + POST[d];
        swp *= (double)(pe - start);
        rc *= (double)(h - l > 0 ? h - l : 0);
    }
    (void)swp;
    (void)rc;
#if RS_INCLUDE_PADDING
    return swp;
#else
    return rc;
#endif
}

// The first maximal real element of a window (a NaN counts as the maximum), as its row-major
// index within the plane, -1 for an empty window; its value in *val.
__device__ __forceinline__ i64 rs_argmax(const void* x, i64 base, const TRef& tx, const i64* in, const i64* lo, const i64* hi, double* val) {
    i64 best = -1;
    double b = 0.0;
    RS_FOR(i, lo, hi) {
        double v = LD_X(x, base RS_OFFSET(i, tx));
        if (best < 0 || v > b || (isnan(v) && !isnan(b))) {
            best = RS_FLAT(i);
            b = v;
        }
    }
    *val = b;
    return best;
}

#if !RS_BACKWARD

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    i64 n = numel(ty);
    GRID_STRIDE(i, n) {
        i64 idx[8];
        unravel(ty, i, idx);
        i64 base = idx[0] * tx.strides[0] + idx[1] * tx.strides[1];
        i64 in[RS_NSP], o[RS_NSP], lo[RS_NSP], hi[RS_NSP];
#pragma unroll
        for (int d = 0; d < RS_NSP; ++d) {
            in[d] = tx.dims[d + 2];
            o[d] = idx[d + 2];
        }
        double div = rs_window(o, in, lo, hi);
#if RS_MAX
        double v;
        double r = rs_argmax(x, base, tx, in, lo, hi, &v) >= 0 ? v : (0.0 / 0.0);
        (void)div;
#else
        double sum = 0.0;
        RS_FOR(i, lo, hi) sum += LD_X(x, base RS_OFFSET(i, tx));
        double r = sum / div;
#endif
        ST_Y(y, offset_at(ty, idx), r);
    }
}

#else

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    RS_CONSTS
    i64 n = numel(tdx);
    GRID_STRIDE(i, n) {
        i64 idx[8];
        unravel(tdx, i, idx);
        i64 base = idx[0] * tx.strides[0] + idx[1] * tx.strides[1];
        i64 gbase = idx[0] * tdy.strides[0] + idx[1] * tdy.strides[1];
        // The output positions whose windows hold this element: start <= p < start + window.
        i64 in[RS_NSP], olo[RS_NSP], ohi[RS_NSP];
        i64 p = 0;
#pragma unroll
        for (int d = 0; d < RS_NSP; ++d) {
            in[d] = tx.dims[d + 2];
            i64 pd = idx[d + 2];
            p = p * in[d] + pd;
            i64 first = fdiv(pd + PRE[d] - W[d], S[d]) + 1;
            i64 last = (pd + PRE[d]) / S[d] + 1;
            i64 od = tdy.dims[d + 2];
            olo[d] = first > 0 ? first : 0;
            ohi[d] = last < od ? last : od;
        }
        double g = 0.0;
        RS_FOR(o, olo, ohi) {
            i64 o[RS_NSP] = { RS_POSITION(o) };
            i64 lo[RS_NSP], hi[RS_NSP];
            double div = rs_window(o, in, lo, hi);
            double gv = LD_DY(dy, gbase RS_OFFSET(o, tdy));
#if RS_MAX
            double v;
            if (rs_argmax(x, base, tx, in, lo, hi, &v) == p) g += gv;
            (void)div;
#else
            g += gv / div;
#endif
        }
        ST_DX(dx, offset_at(tdx, idx), g);
    }
}

#endif
