// NHWC 2D pooling forward, a thread per output vector (n, p, q, VEC channels) walking its
// window (fused/pooling.rs: the kernel for the shapes the strip and tiled kernels do not take),
// after vectors.cuh and pooling.cuh. Reads NT (threads per block) and TOTAL (output vectors).
// Max with the CPU's NaN rule (a NaN wins; an empty window is NaN), averages summed in f32 and
// divided by the CPU's divisors.

extern "C" __global__ void __launch_bounds__(NT) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    const XT* x = (const XT*)xv;
    YT* y = (YT*)yv;
    const bool al = ((unsigned long long)x & 15) == 0 && ((unsigned long long)y & (YAL - 1)) == 0;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < TOTAL; i += (i64)gridDim.x * blockDim.x) {
        // Output vector i = ((n * P + p) * Q + q) * CV + v.
        const IU ii = (IU)i;
        const IU v = ii % (IU)CV;
        IU t = ii / (IU)CV;
        const IU oq = t % (IU)Q_;
        t /= (IU)Q_;
        const IU op = t % (IU)P_;
        const IU on = t / (IU)P_;
        const IS h0 = (IS)op * SH - PREH, w0 = (IS)oq * SW - PREW;
        const XT* base = x + ((IS)on * (H_ * W_ * C_) + (IS)v * VEC);
        float m[VEC];
#if POOL_MODE == POOL_MAX
#pragma unroll
        for (int k = 0; k < VEC; ++k) m[k] = __uint_as_float(0xff800000u);
#else
#pragma unroll
        for (int k = 0; k < VEC; ++k) m[k] = 0.f;
#endif
        int cnt = 0;
        POOL_PRAGMA_UNROLL
        for (IS dh = 0; dh < KH; ++dh) {
            const IS hh = h0 + dh;
            if (hh < 0 || hh >= H_) continue;
            POOL_PRAGMA_UNROLL
            for (IS dw = 0; dw < KW; ++dw) {
                const IS ww = w0 + dw;
                if (ww < 0 || ww >= W_) continue;
                float f[VEC];
                cvt_x(ldx_raw(base + (hh * W_ + ww) * C_, al), f);
                ++cnt;
#if POOL_MODE == POOL_MAX
#pragma unroll
                for (int k = 0; k < VEC; ++k) {
                    const float e = f[k];
                    if (e > m[k] || e != e) m[k] = e;
                }
#else
#pragma unroll
                for (int k = 0; k < VEC; ++k) m[k] += f[k];
#endif
            }
        }
#if POOL_MODE == POOL_MAX
        if (cnt == 0) {
            for (int k = 0; k < VEC; ++k) m[k] = __uint_as_float(0x7fc00000u);
        }
#elif POOL_MODE == POOL_AVG_INCL
        // The window clipped at the padded input's end (its start never passes the padding).
        const float div = (float)((min(h0 + KH, H_ + POSTH) - h0) * (min(w0 + KW, W_ + POSTW) - w0));
        for (int k = 0; k < VEC; ++k) m[k] = m[k] / div;
#else
        const float div = (float)cnt;
        for (int k = 0; k < VEC; ++k) m[k] = m[k] / div;
#endif
        st_y(y + i * VEC, al, m);
    }
}
