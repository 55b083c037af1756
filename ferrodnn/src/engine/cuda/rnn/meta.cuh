// Each sample's length and, for the packed layout, where each step's rows start (common.cuh's
// `meta`). One block. The instantiation defines HAS_LEN (and LD_LEN with it).

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    if (threadIdx.x == 0) {
        int prev = RNN_T;
        for (int b = 0; b < RNN_B; ++b) {
#if HAS_LEN
            double v = LD_LEN(seq_lengths, AT1(tseq_lengths, b));
            int l = isnan(v) ? 0 : (int)fmin(fmax(v, 0.0), (double)RNN_T);
#else
            int l = RNN_T;
#endif
#if RNN_LAYOUT == 1
            l = l < prev ? l : prev;
            prev = l;
#endif
            meta[b] = l;
        }
    }
    __syncthreads();
    // The valid samples of each step, then their running sum: rows[t] = the vectors before step t.
    for (int t = threadIdx.x; t < RNN_T; t += blockDim.x) {
        int c = 0;
        for (int b = 0; b < RNN_B; ++b) c += meta[b] > t ? 1 : 0;
        meta[RNN_B + 1 + t] = c;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int s = 0;
        meta[RNN_B] = 0;
        for (int t = 0; t < RNN_T; ++t) {
            s += meta[RNN_B + 1 + t];
            meta[RNN_B + 1 + t] = s;
        }
    }
}
