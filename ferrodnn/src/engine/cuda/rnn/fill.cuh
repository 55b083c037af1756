// Every element of tensor `out` set to `v` (the padding fill of y and dx before the valid rows
// are written, zeros in the reserve and dgates where steps are padding).
// The instantiation defines ST_OUT.

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    i64 n = numel(tout);
    GRID_STRIDE(i, n) { ST_OUT(out, offset_of(tout, i), v); }
}
