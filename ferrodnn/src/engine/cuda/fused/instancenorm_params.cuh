// Instancenorm backward, the second launch (fused/norm.rs): dscale[c] = the sum over n of
// part[n * C + c], dbias[c] of part[N + n * C + c] (the row sums instancenorm.cuh wrote), in
// double. A block of 32 warps takes 32 channels: warp s adds n = s, s + 32, ..., then warp 0 adds
// the warps' sums in order.
//
// The instantiation defines:
//   IN_NB, IN_NC, IN_ROWS   batch, channels, and their product (all `LL` literals)
//   IN_DS_STRIDE, IN_DB_STRIDE   element strides of dscale and dbias between channels
//   T_DS, T_DB         element types of dscale and dbias

extern "C" __global__ void __launch_bounds__(1024) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    T_DS* ds = (T_DS*)dsp;
    T_DB* db = (T_DB*)dbp;
    __shared__ double sa[32][33], sb[32][33];
    const int l = threadIdx.x & 31, s = threadIdx.x >> 5;
    const i64 col = (i64)blockIdx.x * 32 + l;
    double a = 0.0, b = 0.0;
    if (col < IN_NC) {
        for (i64 n = s; n < IN_NB; n += 32) {
            a += (double)part[n * IN_NC + col];
            b += (double)part[IN_ROWS + n * IN_NC + col];
        }
    }
    sa[s][l] = a;
    sb[s][l] = b;
    __syncthreads();
    if (s == 0 && col < IN_NC) {
        for (int i = 1; i < 32; ++i) {
            a += sa[i][l];
            b += sb[i][l];
        }
        fr_fromf((float)a, ds[col * IN_DS_STRIDE]);
        fr_fromf((float)b, db[col * IN_DB_STRIDE]);
    }
}
