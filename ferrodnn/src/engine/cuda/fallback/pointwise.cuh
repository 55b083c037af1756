// A pointwise op for the generic fallback (fallback/pointwise.rs): one thread per output element
// (grid-stride), inputs read with numpy broadcasting, the mode's formula (pointwise/ops.cuh) in
// double.
//
// The instantiation defines:
//   PW_HAS_A, PW_HAS_B, PW_HAS_C   1: the input port is connected (parameters `pa`, `tpa`, ...),
//                                  read with LD_A, LD_B, LD_C; 0: its value is 0
//   PW_ROUND_F32                   1: inputs are rounded to f32 first (an f32 compute type)
//   PW_FORMULA                     the value of `a`, `b`, `c` (and `idx`, the output's
//                                  multi-index), a call of pointwise/ops.cuh whose attributes
//                                  are the parameters `s0`, `s1`, ...
//   ST_Y                           the store of the output `y`

// An input's value as the CPU engine sees it: rounded to the compute type.
__device__ __forceinline__ double pw_in(double v) {
#if PW_ROUND_F32
    return q_f32(v);
#else
    return (v);
#endif
}

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    i64 n = numel(ty);
    GRID_STRIDE(i, n) {
        i64 idx[8];
        unravel(ty, i, idx);
#if PW_HAS_A
        double a = pw_in(LD_A(pa, bcast_offset(tpa, idx, ty.rank)));
#else
        double a = 0.0;
#endif
#if PW_HAS_B
        double b = pw_in(LD_B(pb, bcast_offset(tpb, idx, ty.rank)));
#else
        double b = 0.0;
#endif
#if PW_HAS_C
        double c = pw_in(LD_C(pc, bcast_offset(tpc, idx, ty.rank)));
#else
        double c = 0.0;
#endif
        (void)a;
        (void)b;
        (void)c;
        double r = PW_FORMULA;
        ST_Y(y, offset_at(ty, idx), r);
    }
}
