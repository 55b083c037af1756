// Staging kernels of convolutions the GEMM kernels take after a change of layout (conv/stage.rs).
// Elements are copied as raw bits (STAGE_T: an unsigned type of the element's size); zero bits
// are 0.0 in every float type. IT is the index type (int where every offset fits).
//
// STAGE_COPY: a strided copy over five logical dims L0..L4 (row-major, L4 fastest): the element
// at (l0..l4) goes from src offset sum(l * SS) to dst offset sum(l * DS), or is zero where
// l3 >= LIM3 or l4 >= LIM4 (a padded image's extra pixels and channels). Each thread writes V
// consecutive elements along L4 as one vector (V > 1: dst contiguous along L4, L4, DS3 and DOFF in
// whole vectors, dst aligned). The destination's elements start DOFF elements after dst.
//   L0..L4, LIM3, LIM4, SS0..SS4, DS0..DS4, DOFF, V, VT (the vector's type)
//
// STAGE_FILTER: a filter [K, C, R0, R1, S] (strides WSK WSC WS0 WS1 WSS) and its staged form
// [K, F * C4, R0, R1, TF] (channels-last, packed: (k, r0, r1, t, p, c) with c fastest), whose
// last spatial dim folds F taps into channels: staged (t, p, c) holds tap s = F * (t - PREF) +
// p + PRE of channel c (zero where c >= C or s is outside 0..S). FLIP: the filter is mirrored
// (convolution mode) on its way into the staged one, which is a cross-correlation's. UNFOLD 0:
// the staged filter written from the filter (every element); UNFOLD 1: the filter written from
// the staged one (the elements that hold a tap).
//   K_, C_, C4, F, PREF, PRE, R0, R1, S_, TF, WSK, WSC, WS0, WS1, WSS, FLIP, UNFOLD
//
// STAGE_COL2IM: a data gradient's dx summed from dcol (f32 rows over dy's pixels (n, o0, o1,
// o2), TCP columns: the pixel's contribution to stored filter tap t and channel c at column
// t * COL_T + c * COL_C): dx[n, c, i] = sum over the taps t with i + PRE - t * D a multiple of
// S inside dy, of dcol[(n, (i + PRE - t * D) / S), (t', c)], t' the stored tap (T - 1 - t in
// convolution mode). One thread per dx element, channels fastest.
//   N_, C_, ID0..ID2, OD0..OD2, T0..T2, S0..S2, D0..D2, PRE0..PRE2, FLIP, COL_T, COL_C, TCP,
//   XSN, XSC, XS0..XS2 (dx's strides), ST (the store of dx's type)

#if STAGE_COPY
extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    const IT vectors = L0 * L1 * L2 * L3 * (L4 / V);
    for (IT e = blockIdx.x * (IT)blockDim.x + threadIdx.x; e < vectors; e += (IT)gridDim.x * blockDim.x) {
        IT r = e;
        const IT l4 = r % (L4 / V) * V;
        r /= L4 / V;
        const IT l3 = r % L3;
        r /= L3;
        const IT l2 = r % L2;
        r /= L2;
        const IT l1 = r % L1;
        const IT l0 = r / L1;
        const IT from = l0 * SS0 + l1 * SS1 + l2 * SS2 + l3 * SS3;
        __align__(16) STAGE_T v[V];
#pragma unroll
        for (int j = 0; j < V; ++j) {
            v[j] = (l3 < LIM3 && l4 + j < LIM4) ? src[from + (l4 + j) * SS4] : (STAGE_T)0;
        }
        *(VT*)(dst + DOFF + l0 * DS0 + l1 * DS1 + l2 * DS2 + l3 * DS3 + l4 * DS4) = *(const VT*)v;
    }
}
#endif

#if STAGE_FILTER
extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    const IT total = K_ * R0 * R1 * TF * F * C4;
    for (IT e = blockIdx.x * (IT)blockDim.x + threadIdx.x; e < total; e += (IT)gridDim.x * blockDim.x) {
        IT r = e;
        const IT c = r % C4;
        r /= C4;
        const IT p = r % F;
        r /= F;
        const IT t = r % TF;
        r /= TF;
        const IT r1 = r % R1;
        r /= R1;
        const IT r0 = r % R0;
        const IT k = r / R0;
        const IT s = F * (t - PREF) + p + PRE;
        const bool tap = c < C_ && s >= 0 && s < S_;
#if FLIP
        const IT from = k * WSK + c * WSC + (R0 - 1 - r0) * WS0 + (R1 - 1 - r1) * WS1 + (S_ - 1 - s) * WSS;
#else
        const IT from = k * WSK + c * WSC + r0 * WS0 + r1 * WS1 + s * WSS;
#endif
#if UNFOLD
        if (tap) {
            dst[from] = src[e];
        }
#else
        dst[e] = tap ? src[from] : (STAGE_T)0;
#endif
    }
}
#endif

#if STAGE_COL2IM
// The taps along one axis that reach input position `i`: with unit dilation only those of its
// residue modulo the stride (every S-th), else every tap, checked.
#define COL2IM_AXIS(a, i, body)                                                   \
    for (IT t##a = (D##a == 1 ? (i + PRE##a) % S##a : 0); t##a < T##a; t##a += (D##a == 1 ? S##a : 1)) { \
        const IT q##a = i + PRE##a - t##a * D##a;                                 \
        if (q##a < 0) {                                                           \
            if (D##a == 1) break;                                                 \
            continue;                                                             \
        }                                                                         \
        if (D##a != 1 && q##a % S##a != 0) continue;                              \
        const IT o##a = q##a / S##a;                                              \
        if (o##a >= OD##a) continue;                                              \
        body                                                                      \
    }

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    const IT total = N_ * C_ * ID0 * ID1 * ID2;
    for (IT e = blockIdx.x * (IT)blockDim.x + threadIdx.x; e < total; e += (IT)gridDim.x * blockDim.x) {
        IT r = e;
        const IT c = r % C_;
        r /= C_;
        const IT i2 = r % ID2;
        r /= ID2;
        const IT i1 = r % ID1;
        r /= ID1;
        const IT i0 = r % ID0;
        const IT n = r / ID0;
        float sum = 0.0f;
        COL2IM_AXIS(0, i0, COL2IM_AXIS(1, i1, COL2IM_AXIS(2, i2, {
            const IT row = ((n * OD0 + o0) * OD1 + o1) * OD2 + o2;
            const IT tap = FLIP ? ((T0 - 1 - t0) * T1 + (T1 - 1 - t1)) * T2 + (T2 - 1 - t2) : (t0 * T1 + t1) * T2 + t2;
            sum += dcol[(long long)row * TCP + tap * COL_T + c * COL_C];
        })))
        ST(dx, (long long)n * XSN + c * XSC + i0 * XS0 + i1 * XS1 + i2 * XS2, (double)sum);
    }
}
#endif
