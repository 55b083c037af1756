// Tensor transforms (reshape, transpose, slice, copy, concatenate) for the generic fallback
// (fallback/transform.rs): one thread per output element (grid-stride), each computing where
// its source element lives and copying it with the input's ld_ and the output's st_ (which is
// the cast, rounding and saturating as the CPU engine does).
//
// The instantiation defines TR_KERNEL, one of:
//   TR_GATHER   y[idx] = x[TR_X_OFFSET] (an expression of `idx`, `tx` and `ty`), threads walking
//               y in its memory order: when TR_MEMORY_ORDER, TR_AXES_INNER_FIRST(X) lists y's
//               axes as X(a) from the fastest in memory to the slowest; else y is walked
//               row-major. LD_X, ST_Y
//   TR_CONCAT   the elements of y that a group of consecutive inputs of a concatenate along
//               CAT_AXIS own: CAT_INPUTS(X) lists the group's inputs but the last, CAT_LAST(X)
//               the last, as X(j, ld_<type>) for input `xj`. ST_Y

#define TR_GATHER 0
#define TR_CONCAT 1

#if TR_KERNEL == TR_GATHER

#define TR_UNRAVEL_AXIS(a)      \
    idx[a] = rest % ty.dims[a]; \
    rest /= ty.dims[a];

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    i64 n = numel(ty);
    GRID_STRIDE(i, n) {
        i64 idx[8];
#if TR_MEMORY_ORDER
        i64 rest = i;
        TR_AXES_INNER_FIRST(TR_UNRAVEL_AXIS)
#else
        unravel(ty, i, idx);
#endif
        i64 xo = TR_X_OFFSET;
        ST_Y(y, offset_at(ty, idx), LD_X(x, xo));
    }
}

#else

// Input j's element at idx, with c on the axis, into v.
#define CAT_READ(j, LD)                                                                            \
    {                                                                                              \
        i64 o = 0;                                                                                 \
        for (int a = 0; a < tx##j.rank; ++a) o += (a == CAT_AXIS ? c : idx[a]) * tx##j.strides[a]; \
        v = LD(x##j, o);                                                                           \
    }
// Input j's element when c falls in it, else (the chain goes on) c relative to the next input.
#define CAT_PICK(j, LD)           \
    if (c < tx##j.dims[CAT_AXIS]) \
        CAT_READ(j, LD)           \
    else {                        \
        c -= tx##j.dims[CAT_AXIS];
#define CAT_CLOSE(j, LD) }
#define CAT_EXTENT(j, LD) tx##j.dims[CAT_AXIS] +
#define CAT_EXTENT_LAST(j, LD) tx##j.dims[CAT_AXIS]

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    // The group's slab of y: y's dims with the axis cut to the group's inputs.
    TRef ts = ty;
    ts.dims[CAT_AXIS] = CAT_INPUTS(CAT_EXTENT) CAT_LAST(CAT_EXTENT_LAST);
    i64 n = numel(ts);
    GRID_STRIDE(i, n) {
        i64 idx[8];
        unravel(ts, i, idx);
        i64 c = idx[CAT_AXIS];
        double v = 0.0;
        CAT_INPUTS(CAT_PICK)
        CAT_LAST(CAT_READ)
        CAT_INPUTS(CAT_CLOSE)
        idx[CAT_AXIS] += base;
        ST_Y(y, offset_at(ty, idx), v);
    }
}

#endif
