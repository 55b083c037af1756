// A channels-last image as the Hopper GEMM's A through im2col TMA loads (GEMM_A_IM2COL, an
// implicit GEMM: see sm90.rs). A forward convolution's stage is one filter tap's 64 channels of
// the tile's BM output pixels, brought by one load that walks the image from the window corner
// of the tile's first pixel (the map's bounding box wraps rows and images) with the tap as its
// offsets; a weight gradient's (GEMM_IC_K: the pixels are k, A M-major) is, for each 64 rows of
// (tap, channel), one load of the stage's 64 pixels. Padding reads as zeros.
//
// A data gradient (GEMM_IC_FLIP) reads dy with its taps mirrored; its filter, B, comes by 3-D
// TMA one tap's 64 output channels a stage (GEMM_B_TAPS; GEMM_BT_T taps, GEMM_BT_FLIP: the tap
// index mirrored in convolution mode).
//
// Comes after kernel/hopper.cuh and reads: GEMM_IC_RANK (the map's rank: 3, 4 or 5 for 1-3
// spatial dims), GEMM_IC_C (the image's channels (a group's: the map has every group's), a
// multiple of a stage's 64 16-bit or 32 f32),
// and per spatial dim d
// (0 outermost, 2 innermost: W) GEMM_IC_G<d> (the output grid), GEMM_IC_MUL<d> (the stride),
// GEMM_IC_OFF<d> (minus the leading padding), GEMM_IC_T<d> (the filter taps), GEMM_IC_DIL<d>
// (the dilation); unused dims have grid, taps 1 and stride, offset 0.

// Where the tile whose first output pixel (over every image) is `mg` starts reading: its window
// corner and image.
struct ic_start {
    int w, h, d, n;
};
__device__ __forceinline__ ic_start ic_tile(long long mg) {
    ic_start st;
    const int q = (int)(mg % GEMM_IC_G2);
    mg /= GEMM_IC_G2;
    const int p = (int)(mg % GEMM_IC_G1);
    mg /= GEMM_IC_G1;
    const int o = (int)(mg % GEMM_IC_G0);
    st.n = (int)(mg / GEMM_IC_G0);
    st.w = q * GEMM_IC_MUL2 + GEMM_IC_OFF2;
    st.h = p * GEMM_IC_MUL1 + GEMM_IC_OFF1;
    st.d = o * GEMM_IC_MUL0 + GEMM_IC_OFF0;
    return st;
}

// The channels of (tap, channel) index `kk` (a multiple of the map's channels per pixel: 64
// 16-bit or 32 f32, one 128-byte row) of the pixels from `st` into `dst`, completing on `bar`;
// the channels from `c_at` on (a grouped convolution's group: GEMM_IC_C channels each).
__device__ __forceinline__ void ic_load(unsigned dst, const TmaMap* map, unsigned bar, const ic_start& st, int kk, int c_at) {
    const int tap = kk / GEMM_IC_C, c0 = c_at + kk % GEMM_IC_C;
    int t2 = tap % GEMM_IC_T2, t1 = tap / GEMM_IC_T2 % GEMM_IC_T1, t0 = tap / (GEMM_IC_T2 * GEMM_IC_T1);
#if GEMM_IC_FLIP
    // (A data gradient's walk: the taps mirrored.)
    t2 = GEMM_IC_T2 - 1 - t2;
    t1 = GEMM_IC_T1 - 1 - t1;
    t0 = GEMM_IC_T0 - 1 - t0;
#endif
    const unsigned short o2 = (unsigned short)(t2 * GEMM_IC_DIL2);
    const unsigned short o1 = (unsigned short)(t1 * GEMM_IC_DIL1);
    const unsigned short o0 = (unsigned short)(t0 * GEMM_IC_DIL0);
#if GEMM_IC_RANK == 3
    (void)o1;
    (void)o0;
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5], {%6};"
                 ::"r"(dst), "l"(map), "r"(c0), "r"(st.w), "r"(st.n), "r"(bar), "h"(o2) : "memory");
#elif GEMM_IC_RANK == 4
    (void)o0;
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6], {%7, %8};"
                 ::"r"(dst), "l"(map), "r"(c0), "r"(st.w), "r"(st.h), "r"(st.n), "r"(bar), "h"(o2), "h"(o1) : "memory");
#else
    asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, %6}], [%7], {%8, %9, %10};"
                 ::"r"(dst), "l"(map), "r"(c0), "r"(st.w), "r"(st.h), "r"(st.d), "r"(st.n), "r"(bar), "h"(o2), "h"(o1), "h"(o0) : "memory");
#endif
}
