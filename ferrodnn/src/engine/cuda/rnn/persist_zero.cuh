// Before the persistent forward (rnn/persist.rs): the exchange buffers zeroed (their padding rows
// and columns are read as zeros by the tensor-core products) and the barrier counters reset.
// The instantiation defines HB_WORDS (32-bit words of `hb`) and BAR_COUNT.

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    GRID_STRIDE(i, HB_WORDS) hb[i] = 0u;
    GRID_STRIDE(i, BAR_COUNT) bar[i] = 0;
}
