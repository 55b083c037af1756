// Layernorm, rmsnorm and adalayernorm backward, the second launch (fused/norm.rs): dscale (and
// dbias) from the partial column sums norm_bwd.cuh wrote, each column's partials added in block
// order. A block of FS warps takes 32 columns of one group (blockIdx.y): warp s adds partials
// s, s + FS, ..., then warp 0 adds the warps' sums in order.
//
// The instantiation defines:
//   NB_H               columns (elements per row)
//   NB_P, NB_FS        blocks (partials) per group, warps per block
//   NORM_DBIAS         1: dbias too (from pb)
//   T_DS, T_DB         element types of dscale and dbias

extern "C" __global__ void __launch_bounds__(32 * NB_FS) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    constexpr i64 H = NB_H;
    constexpr int P = NB_P, FS = NB_FS;
    T_DS* ds = (T_DS*)dsp;
#if NORM_DBIAS
    T_DB* db = (T_DB*)dbp;
#endif
    __shared__ float sa[FS][33];
    const int l = threadIdx.x & 31, s = threadIdx.x >> 5;
    const i64 col = (i64)blockIdx.x * 32 + l;
    // This group's partials (blocks blockIdx.y * P ...).
    const i64 gofs = (i64)blockIdx.y * P * H;
    float a = 0.0f;
#if NORM_DBIAS
    float b = 0.0f;
#endif
    if (col < H) {
#pragma unroll 8
        for (int p = s; p < P; p += FS) {
            a += pa[gofs + (i64)p * H + col];
#if NORM_DBIAS
            b += pb[gofs + (i64)p * H + col];
#endif
        }
    }
    sa[s][l] = a;
#if NORM_DBIAS
    __shared__ float sb[FS][33];
    sb[s][l] = b;
#endif
    __syncthreads();
    if (s == 0 && col < H) {
        float ta = sa[0][l];
#if NORM_DBIAS
        float tb = sb[0][l];
#endif
        for (int i = 1; i < FS; ++i) {
            ta += sa[i][l];
#if NORM_DBIAS
            tb += sb[i][l];
#endif
        }
        fr_fromf(ta, ds[(i64)blockIdx.y * H + col]);
#if NORM_DBIAS
        fr_fromf(tb, db[(i64)blockIdx.y * H + col]);
#endif
    }
}
