// The Hopper backward's first pass (attention/bwd90.rs): D_i = dO_i . O_i into f32 scratch
// (dbuf_p) with 16-byte loads, FA_DV / 8 threads a row (a power of two; those past the head
// dim FA_DVR add zeros; O and dO in the io type, rows 16-byte aligned); with FA_ZERO_ACC the same launch also zeroes the atomic path's f32 dQ accumulator.
//
// Reads common.cuh's defines and OI_S0..3 (o), DO_S0..3 (do), FA_ZERO_ACC (bwd90_acc.cuh's).

__device__ __forceinline__ float fa_dot_pair(u32 a, u32 b) {
#if FA_BF16
    return __uint_as_float(a << 16) * __uint_as_float(b << 16) + __uint_as_float(a & 0xffff0000u) * __uint_as_float(b & 0xffff0000u);
#else
    const float2 x = __half22float2(*reinterpret_cast<const __half2*>(&a)), y = __half22float2(*reinterpret_cast<const __half2*>(&b));
    return x.x * y.x + x.y * y.y;
#endif
}

extern "C" __global__ void __launch_bounds__(256) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    constexpr int TPR = FA_DV / 8;
    constexpr i64 TOTAL = FA_B * FA_HQ * FA_SQ * TPR;
    float* dbuf = reinterpret_cast<float*>(dbuf_p);
    const int lane = threadIdx.x & 31;
    const i64 nwarps = (i64)gridDim.x * (blockDim.x >> 5);
    // A warp takes 32 consecutive (row, 8 channels) items; TPR divides 32, so a row's threads
    // are one aligned group of lanes and the sum stays inside it.
    for (i64 w0 = ((i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * 32; w0 < TOTAL; w0 += nwarps * 32) {
        const i64 e = w0 + lane;
        float acc = 0.0f;
        const i64 c = (e % TPR) * 8;
        if (e < TOTAL && c < FA_DVR) {
            const i64 r = e / TPR;
            const i64 i = r % FA_SQ, h = (r / FA_SQ) % FA_HQ, bi = r / (FA_SQ * FA_HQ);
            const uint4 o = __ldg(reinterpret_cast<const uint4*>(reinterpret_cast<const u16*>(o_p) + bi * OI_S0 + h * OI_S1 + i * OI_S2 + c));
            const uint4 g = __ldg(reinterpret_cast<const uint4*>(reinterpret_cast<const u16*>(do_p) + bi * DO_S0 + h * DO_S1 + i * DO_S2 + c));
            acc = fa_dot_pair(o.x, g.x) + fa_dot_pair(o.y, g.y) + fa_dot_pair(o.z, g.z) + fa_dot_pair(o.w, g.w);
        }
        #pragma unroll
        for (int s = TPR / 2; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);
        if (e < TOTAL && e % TPR == 0) dbuf[e / TPR] = acc;
    }
#if FA_ZERO_ACC
    fa90_zero_acc(dqa_p);
#else
    (void)dqa_p;
#endif
}
