// NHWC 2D pooling backward (fused/pooling.rs, `backward`), after vectors.cuh and pooling.cuh
// (x, dy and dx of one type: XT = YT). Two kernels:
//   POOL_BWD_ARGMAX 1  max pooling's argmax, a thread per output vector (OUTS of them): the
//                      window tap of the CPU's maximum (the first maximal real element in
//                      row-major window order, a NaN beating any number; 255 for an empty
//                      window) per channel, VEC bytes to idx (where the strip kernel does not
//                      take the shape)
//   POOL_BWD_ARGMAX 0  the gather, a thread per input vector (TOTAL of them): dx is the sum of
//                      dy over the outputs whose windows cover it (ascending p, then q, as the
//                      CPU adds them), for max those whose argmax (idx) is this position, for
//                      averages dy / divisor; at most NPH x NQW covering outputs, walked in
//                      fixed-count loops so that all their dy loads can be in flight at once

extern "C" __global__ void __launch_bounds__(256) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
#if POOL_BWD_ARGMAX
    const XT* x = (const XT*)xv;
    const bool al = ((unsigned long long)x & 15) == 0;
    for (IU i = (IU)blockIdx.x * blockDim.x + threadIdx.x; i < (IU)OUTS; i += (IU)gridDim.x * blockDim.x) {
        // Output vector i = ((n * P + p) * Q + q) * CV + v.
        const IS v = (IS)(i % (IU)CV);
        IU t = i / (IU)CV;
        const IS oq = (IS)(t % (IU)Q_);
        t /= (IU)Q_;
        const IS op = (IS)(t % (IU)P_);
        const IS on = (IS)(t / (IU)P_);
        const IS h0 = op * SH - PREH, w0 = oq * SW - PREW;
        const XT* base = x + on * (H_ * W_ * C_) + v * VEC;
        float best[VEC];
        IdxV r;
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            best[k] = 0.f;
            r.b[k] = 255;
        }
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
                const unsigned char tap = (unsigned char)(dh * KW + dw);
#pragma unroll
                for (int k = 0; k < VEC; ++k) {
                    const float e = f[k], b = best[k];
                    if (r.b[k] == 255 || e > b || (e != e && b == b)) {
                        best[k] = e;
                        r.b[k] = tap;
                    }
                }
            }
        }
        idx[i] = r.u;
    }
#else
    const XT* dy = (const XT*)dyv;
    YT* dx = (YT*)dxv;
    const bool al = ((unsigned long long)dy & 15) == 0 && ((unsigned long long)dx & 15) == 0;
    for (IU i = (IU)blockIdx.x * blockDim.x + threadIdx.x; i < (IU)TOTAL; i += (IU)gridDim.x * blockDim.x) {
        // Input vector i = ((n * H + h) * W + w) * CV + v.
        const IS v = (IS)(i % (IU)CV);
        IU t = i / (IU)CV;
        const IS w = (IS)(t % (IU)W_);
        t /= (IU)W_;
        const IS h = (IS)(t % (IU)H_);
        const IS n = (IS)(t / (IU)H_);
        // Outputs whose windows cover (h, w): p * SH - PREH <= h < p * SH - PREH + KH (at most
        // NPH of them along h, NQW along w: fixed trip counts, so every dy load of the
        // position can be in flight at once).
        const IS ah = h + PREH - KH + 1, aw = w + PREW - KW + 1;
        const IS plo = ah <= 0 ? 0 : (ah + SH - 1) / SH, phi = min(P_ - 1, (h + PREH) / SH);
        const IS qlo = aw <= 0 ? 0 : (aw + SW - 1) / SW, qhi = min(Q_ - 1, (w + PREW) / SW);
        float acc[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) acc[k] = 0.f;
        POOL_PRAGMA_UNROLL
        for (int a = 0; a < NPH; ++a) {
            const IS p = plo + a;
            if (p <= phi) {
                const IS oh = p * SH - PREH;
                POOL_PRAGMA_UNROLL
                for (int b = 0; b < NQW; ++b) {
                    const IS q = qlo + b;
                    if (q <= qhi) {
                        const IS ow = q * SW - PREW;
                        const IS o = ((n * P_ + p) * Q_ + q) * C_ + v * VEC;
                        float g[VEC];
                        cvt_x(ldx_raw(dy + o, al), g);
#if POOL_MODE == POOL_MAX
                        IdxV r;
                        r.u = idx[o / VEC];
                        const unsigned char tap = (unsigned char)((h - oh) * KW + (w - ow));
#pragma unroll
                        for (int k = 0; k < VEC; ++k)
                            if (r.b[k] == tap) acc[k] += g[k];
#else
                        // One division per covering output (not per element).
#if POOL_MODE == POOL_AVG_INCL
                        const float inv = 1.f / (float)((min(oh + KH, H_ + POSTH) - oh) * (min(ow + KW, W_ + POSTW) - ow));
#else
                        const float inv = 1.f / (float)((min(oh + KH, H_) - max(oh, (IS)0)) * (min(ow + KW, W_) - max(ow, (IS)0)));
#endif
#pragma unroll
                        for (int k = 0; k < VEC; ++k) acc[k] = fmaf(g[k], inv, acc[k]);
#endif
                    }
                }
            }
        }
        st_y(dx + (IS)i * VEC, al, acc);
    }
#endif
}
