// Staging kernels of convolutions the GEMM kernels take after a change of layout (conv/stage.rs).
//
// STAGE_COPY: a strided copy over five logical dims L0..L4 (row-major, L4 fastest) of raw
// elements (STAGE_T, the element's size in bytes as an unsigned type): the element at logical
// (l0..l4) goes to dst offset sum(l * DS) from src offset sum(l * SS); along L4, positions at or
// past LIM are written as zeros (all-zero bits: 0.0 in every float type). It zero-pads channels
// (the image or filter copied channels-last with its channels rounded up to a 16-byte vector)
// and copies a padded result back out (LIM = L4).
//   L0..L4, LIM, SS0..SS4, DS0..DS4, STAGE_T
//
// STAGE_COL2IM: a data gradient's dx summed from dcol (f32 rows over dy's pixels (n, o0, o1, o2),
// TCP columns: the pixel's contribution to filter tap t and channel c at column t * COL_T +
// c * COL_C, t row-major over the stored filter's taps): dx[n, c, i] = sum over the taps t with
// i + PRE - t * D a multiple of S inside dy, of dcol[(n, (i + PRE - t * D) / S), (t', c)], t'
// the stored tap (T - 1 - t in convolution mode). One thread per dx element, channels fastest.
//   N_, C_, ID0..ID2, OD0..OD2, T0..T2, S0..S2, D0..D2, PRE0..PRE2, FLIP, COL_T, COL_C, TCP,
//   XSN, XSC, XS0..XS2 (dx's strides), ST (the store of dx's type)

#if STAGE_COPY
extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    const i64 total = L0 * L1 * L2 * L3 * L4;
    for (i64 e = blockIdx.x * (i64)blockDim.x + threadIdx.x; e < total; e += (i64)gridDim.x * blockDim.x) {
        i64 r = e;
        const i64 l4 = r % L4;
        r /= L4;
        const i64 l3 = r % L3;
        r /= L3;
        const i64 l2 = r % L2;
        r /= L2;
        const i64 l1 = r % L1;
        const i64 l0 = r / L1;
        STAGE_T v = 0;
        if (l4 < LIM) {
            v = src[l0 * SS0 + l1 * SS1 + l2 * SS2 + l3 * SS3 + l4 * SS4];
        }
        dst[l0 * DS0 + l1 * DS1 + l2 * DS2 + l3 * DS3 + l4 * DS4] = v;
    }
}
#endif

#if STAGE_COL2IM
// The dy position along one axis that input position `i` reaches through tap `t`, or -1.
__device__ __forceinline__ i64 col2im_reach(i64 i, i64 t, i64 pre, i64 d, i64 s, i64 od) {
    const i64 q = i + pre - t * d;
    if (q < 0 || q % s != 0) {
        return -1;
    }
    const i64 o = q / s;
    return o < od ? o : -1;
}

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    const i64 total = N_ * C_ * ID0 * ID1 * ID2;
    for (i64 e = blockIdx.x * (i64)blockDim.x + threadIdx.x; e < total; e += (i64)gridDim.x * blockDim.x) {
        i64 r = e;
        const i64 c = r % C_;
        r /= C_;
        const i64 i2 = r % ID2;
        r /= ID2;
        const i64 i1 = r % ID1;
        r /= ID1;
        const i64 i0 = r % ID0;
        const i64 n = r / ID0;
        float sum = 0.0f;
        for (i64 t0 = 0; t0 < T0; ++t0) {
            const i64 o0 = col2im_reach(i0, t0, PRE0, D0, S0, OD0);
            if (o0 < 0) {
                continue;
            }
            for (i64 t1 = 0; t1 < T1; ++t1) {
                const i64 o1 = col2im_reach(i1, t1, PRE1, D1, S1, OD1);
                if (o1 < 0) {
                    continue;
                }
                for (i64 t2 = 0; t2 < T2; ++t2) {
                    const i64 o2 = col2im_reach(i2, t2, PRE2, D2, S2, OD2);
                    if (o2 < 0) {
                        continue;
                    }
                    const i64 row = ((n * OD0 + o0) * OD1 + o1) * OD2 + o2;
#if FLIP
                    const i64 tap = ((T0 - 1 - t0) * T1 + (T1 - 1 - t1)) * T2 + (T2 - 1 - t2);
#else
                    const i64 tap = (t0 * T1 + t1) * T2 + t2;
#endif
                    sum += dcol[row * TCP + tap * COL_T + c * COL_C];
                }
            }
        }
        ST(dx, n * XSN + c * XSC + i0 * XS0 + i1 * XS1 + i2 * XS2, (double)sum);
    }
}
#endif
