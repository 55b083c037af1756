// Softmax and log-softmax, forward (with the optional log-sum-exp `stats`) and backward, in
// double, for the generic fallback (fallback/softmax.rs).
//
// A tensor normalized over SM_AXIS is a set of rows: row `r` runs the row-major order of the
// other dims, and its elements are `len` apart by the axis's stride. Short rows: one thread per
// row, serial passes in the CPU's order. Long rows (SM_BLOCK_PER_ROW): one block per row
// (block-strided over rows), each pass a strided loop plus a shared-memory tree.
//
// The instantiation defines:
//   SM_AXIS            the normalized axis
//   SM_LOG             1: log-softmax, 0: softmax
//   SM_BLOCK_PER_ROW   1: a block per row, 0: a thread per row
//   SM_BACKWARD        1: dx from y and dy (LD_Y, LD_DY, ST_DX); 0: y (and stats) from x (LD_X,
//                      ST_Y, and ST_STATS when SM_STATS)

// The offset of the first element of row `r` of `t` (the axis skipped).
__device__ __forceinline__ i64 row_base(const TRef& t, i64 r) {
    i64 off = 0;
    for (int a = t.rank - 1; a >= 0; --a) {
        if (a == SM_AXIS) continue;
        off += (r % t.dims[a]) * t.strides[a];
        r /= t.dims[a];
    }
    return off;
}
__device__ __forceinline__ i64 row_count(const TRef& t) { return t.dims[SM_AXIS] > 0 ? numel(t) / t.dims[SM_AXIS] : 0; }
// Tree reduction over the block (blockDim.x a power of two); every thread gets the result.
__device__ double block_reduce(double v, double* sh, bool is_max) {
    int t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (t < w) sh[t] = is_max ? fmax(sh[t], sh[t + w]) : sh[t] + sh[t + w];
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();
    return r;
}

#if !SM_BACKWARD

#if SM_LOG
#define SM_OUT(v, lse) ((v) - (lse))
#else
#define SM_OUT(v, lse) exp((v) - (lse))
#endif

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
#if SM_BLOCK_PER_ROW
    __shared__ double sh[256];
    i64 len = tx.dims[SM_AXIS], sx = tx.strides[SM_AXIS], sy = ty.strides[SM_AXIS];
    i64 rows = row_count(tx);
    int t = threadIdx.x;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        i64 bx = row_base(tx, r), by = row_base(ty, r);
        double m = -1.0 / 0.0;
        for (i64 k = t; k < len; k += blockDim.x) m = fmax(m, LD_X(x, bx + k * sx));
        m = block_reduce(m, sh, true);
        double s = -0.0;
        for (i64 k = t; k < len; k += blockDim.x) s += exp(LD_X(x, bx + k * sx) - m);
        s = block_reduce(s, sh, false);
        double lse = m + log(s);
        for (i64 k = t; k < len; k += blockDim.x) { double v = LD_X(x, bx + k * sx); ST_Y(y, by + k * sy, SM_OUT(v, lse)); }
#if SM_STATS
        if (t == 0) { ST_STATS(st, row_base(tst, r), lse); }
#endif
    }
#else
    i64 len = tx.dims[SM_AXIS], sx = tx.strides[SM_AXIS], sy = ty.strides[SM_AXIS];
    GRID_STRIDE(r, row_count(tx)) {
        i64 bx = row_base(tx, r), by = row_base(ty, r);
        // The maximum (NaN skipped, as Rust's f64::max does) is taken out before exponentiating.
        double m = -1.0 / 0.0;
        for (i64 k = 0; k < len; ++k) m = fmax(m, LD_X(x, bx + k * sx));
        double s = -0.0;
        for (i64 k = 0; k < len; ++k) s += exp(LD_X(x, bx + k * sx) - m);
        double lse = m + log(s);
        for (i64 k = 0; k < len; ++k) { double v = LD_X(x, bx + k * sx); ST_Y(y, by + k * sy, SM_OUT(v, lse)); }
#if SM_STATS
        ST_STATS(st, row_base(tst, r), lse);
#endif
    }
#endif
}

#else

// Log-softmax: dx = dy - exp(y) * sum(dy); softmax: dx = y * (dy - sum(dy * y)).
#if SM_LOG
#define SM_TERM(v, g) (g)
#define SM_DX(v, g, s) ((g) - exp(v) * (s))
#else
#define SM_TERM(v, g) ((g) * (v))
#define SM_DX(v, g, s) ((v) * ((g) - (s)))
#endif
#define SM_LOAD double v = LD_Y(y, by + k * sy); double g = LD_DY(dy, bg + k * sg); (void)v;

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
#if SM_BLOCK_PER_ROW
    __shared__ double sh[256];
    i64 len = ty.dims[SM_AXIS], sy = ty.strides[SM_AXIS], sg = tdy.strides[SM_AXIS], sd = tdx.strides[SM_AXIS];
    i64 rows = row_count(ty);
    int t = threadIdx.x;
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        i64 by = row_base(ty, r), bg = row_base(tdy, r), bd = row_base(tdx, r);
        double s = -0.0;
        for (i64 k = t; k < len; k += blockDim.x) { SM_LOAD s += SM_TERM(v, g); }
        s = block_reduce(s, sh, false);
        for (i64 k = t; k < len; k += blockDim.x) { SM_LOAD ST_DX(dx, bd + k * sd, SM_DX(v, g, s)); }
    }
#else
    i64 len = ty.dims[SM_AXIS], sy = ty.strides[SM_AXIS], sg = tdy.strides[SM_AXIS], sd = tdx.strides[SM_AXIS];
    GRID_STRIDE(r, row_count(ty)) {
        i64 by = row_base(ty, r), bg = row_base(tdy, r), bd = row_base(tdx, r);
        double s = -0.0;
        for (i64 k = 0; k < len; ++k) { SM_LOAD s += SM_TERM(v, g); }
        for (i64 k = 0; k < len; ++k) { SM_LOAD ST_DX(dx, bd + k * sd, SM_DX(v, g, s)); }
    }
#endif
}

#endif
