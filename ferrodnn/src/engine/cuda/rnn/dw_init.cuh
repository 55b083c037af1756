// dw = dw_in (the gradient is then added matrix by matrix), or 0 without dw_in. Each element is
// read and written by one thread, so dw_in and dw may share a buffer.
// The instantiation defines HAS_DW_IN (with LD_DW_IN), ST_DW.

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    const i64 n = numel(tdw);
    GRID_STRIDE(i, n) {
#if HAS_DW_IN
        double v = LD_DW_IN(dw_in, AT1(tdw_in, i));
#else
        double v = 0.0;
#endif
        ST_DW(dw, AT1(tdw, i), v);
    }
}
