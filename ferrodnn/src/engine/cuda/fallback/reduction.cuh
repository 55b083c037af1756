// Reductions over any set of axes, folding in double as the CPU engine does, for the generic
// fallback (fallback/reduction.rs).
//
// A mode is a map (red_map, applied to every input element), an associative combine (red_comb)
// with its identity (RED_IDENT), and a finish (red_fin: the mean's division, the 2-norm's square
// root). Kernels:
// - RED_SERIAL: one thread per output element folds its group serially, in the CPU's order
//   (row-major over the reduced axes);
// - RED_PART: one block per (output, chunk) folds its piece of the group (threads strided over
//   it, then a shared-memory tree) into a partial in `part`;
// - RED_FINISH: one thread per output folds its partials in order and finishes.
//
// The instantiation defines:
//   RED_KERNEL   RED_SERIAL, RED_PART or RED_FINISH
//   RED_MODE     RED_ADD, RED_AVG, RED_NORM1, RED_NORM2, RED_MUL, RED_MUL_NO_ZEROS, RED_MIN,
//                RED_MAX or RED_AMAX
//   RED_AXES(X), RED_AXES_REVERSED(X)   the reduced axes, as lists X(a) X(b) ... in increasing
//                and in decreasing order
//   RED_BLOCK    the block size of RED_PART (a power of two)
//   LD_X, ST_Y

#define RED_SERIAL 0
#define RED_PART 1
#define RED_FINISH 2

#define RED_ADD 0
#define RED_AVG 1
#define RED_NORM1 2
#define RED_NORM2 3
#define RED_MUL 4
#define RED_MUL_NO_ZEROS 5
#define RED_MIN 6
#define RED_MAX 7
#define RED_AMAX 8

// The identity of the combine. Rust's float `sum` starts from -0.0; the mean's fold starts from
// +0.0.
#if RED_MODE == RED_ADD || RED_MODE == RED_NORM1 || RED_MODE == RED_NORM2
#define RED_IDENT (-0.0)
#elif RED_MODE == RED_AVG || RED_MODE == RED_AMAX
#define RED_IDENT (0.0)
#elif RED_MODE == RED_MUL || RED_MODE == RED_MUL_NO_ZEROS
#define RED_IDENT (1.0)
#elif RED_MODE == RED_MIN
#define RED_IDENT ((1.0/0.0))
#else
#define RED_IDENT ((-1.0/0.0))
#endif

__device__ __forceinline__ double red_map(double v) {
#if RED_MODE == RED_NORM1 || RED_MODE == RED_AMAX
    return fabs(v);
#elif RED_MODE == RED_NORM2
    return v * v;
#elif RED_MODE == RED_MUL_NO_ZEROS
    // Zeros are skipped: multiplying by 1.0 instead is exact. NaN != 0, so NaN is kept.
    return (v != 0.0 ? v : 1.0);
#else
    return v;
#endif
}

// NaN propagates through min, max and amax (as in the CPU's fold).
__device__ __forceinline__ double red_comb(double a, double b) {
#if RED_MODE == RED_MUL || RED_MODE == RED_MUL_NO_ZEROS
    return a * b;
#elif RED_MODE == RED_MIN
    return (isnan(a) || isnan(b)) ? (0.0/0.0) : fmin(a, b);
#elif RED_MODE == RED_MAX || RED_MODE == RED_AMAX
    return (isnan(a) || isnan(b)) ? (0.0/0.0) : fmax(a, b);
#else
    return a + b;
#endif
}

__device__ __forceinline__ double red_fin(double s, i64 n) {
    (void)n;
#if RED_MODE == RED_AVG
    return s / (double)n;
#elif RED_MODE == RED_NORM2
    return sqrt(s);
#else
    return s;
#endif
}

// The group size.
#define RED_COUNT_AXIS(a) n *= tx.dims[a];
__device__ __forceinline__ i64 red_count(const TRef& tx) {
    i64 n = 1;
    RED_AXES(RED_COUNT_AXIS)
    return n;
}

// The offset of the group's element `r` (row-major over the reduced axes) from the group's
// first element.
#define RED_OFF_AXIS(a)                      \
    off += (r % tx.dims[a]) * tx.strides[a]; \
    r /= tx.dims[a];
__device__ __forceinline__ i64 red_off(const TRef& tx, i64 r) {
    i64 off = 0;
    RED_AXES_REVERSED(RED_OFF_AXIS)
    (void)r;
    return off;
}

#if RED_KERNEL == RED_SERIAL

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    i64 n = numel(ty);
    i64 g = red_count(tx);
    GRID_STRIDE(i, n) {
        i64 idx[8];
        unravel(ty, i, idx);
        // The output index is also that of the group's first input element (reduced axes are 0).
        i64 base = offset_at(tx, idx);
        double acc = RED_IDENT;
        for (i64 r = 0; r < g; ++r) acc = red_comb(acc, red_map(LD_X(x, base + red_off(tx, r))));
        ST_Y(y, offset_at(ty, idx), red_fin(acc, g));
    }
}

#elif RED_KERNEL == RED_PART

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    __shared__ double sh[RED_BLOCK];
    i64 n = numel(ty);
    i64 g = red_count(tx);
    i64 per = (g + chunks - 1) / chunks;
    int t = threadIdx.x;
    for (i64 b = blockIdx.x; b < n * chunks; b += gridDim.x) {
        i64 o = b / chunks, c = b % chunks;
        i64 idx[8];
        unravel(ty, o, idx);
        i64 base = offset_at(tx, idx);
        i64 lo = c * per;
        i64 hi = lo + per < g ? lo + per : g;
        double acc = RED_IDENT;
        for (i64 r = lo + t; r < hi; r += blockDim.x) acc = red_comb(acc, red_map(LD_X(x, base + red_off(tx, r))));
        sh[t] = acc;
        __syncthreads();
        for (int w = blockDim.x / 2; w > 0; w >>= 1) {
            if (t < w) sh[t] = red_comb(sh[t], sh[t + w]);
            __syncthreads();
        }
        if (t == 0) part[b] = sh[0];
        __syncthreads();
    }
}

#else

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    i64 n = numel(ty);
    i64 g = red_count(tx);
    GRID_STRIDE(i, n) {
        double acc = RED_IDENT;
        for (i64 c = 0; c < chunks; ++c) acc = red_comb(acc, part[i * chunks + c]);
        i64 idx[8];
        unravel(ty, i, idx);
        ST_Y(y, offset_at(ty, idx), red_fin(acc, g));
    }
}

#endif
