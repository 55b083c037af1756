// NHWC 2D tiled pooling (fused/pooling.rs, `tiled`), after vectors.cuh and pooling.cuh: each
// thread computes a PT x QT tile of outputs for one vector of channels (NTP x NTQ tiles per
// image, TOTAL threads' work, NT threads per block). It walks the tile's input footprint (FH
// rows of FW positions) row by row with one 16-byte load per position (out-of-range positions
// read as the reduction's neutral value, so no branches), so positions shared by the tile's
// windows are loaded once; a finished output row is stored at once. Max reduces the raw words
// (vmax) without converting; averages sum in f32.

extern "C" __global__ void __launch_bounds__(NT, 3) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    const XT* __restrict__ x = (const XT*)xv;
    YT* __restrict__ y = (YT*)yv;
    const bool al = ((unsigned long long)x & 15) == 0 && ((unsigned long long)y & (YAL - 1)) == 0;
    for (IU i = (IU)blockIdx.x * blockDim.x + threadIdx.x; i < (IU)TOTAL; i += (IU)gridDim.x * blockDim.x) {
        // Thread i = ((n * NTP + tile p) * NTQ + tile q) * CV + channel vector.
        const IU v = i % (IU)CV;
        IU t = i / (IU)CV;
        const IU tq = t % (IU)NTQ;
        t /= (IU)NTQ;
        const IU tp = t % (IU)NTP;
        const IU on = t / (IU)NTP;
        const IS p0 = (IS)tp * PT, q0 = (IS)tq * QT;
        const IS h0 = p0 * SH - PREH, w0 = q0 * SW - PREW;
        const XT* xb = x + ((IS)on * (H_ * W_ * C_) + (IS)v * VEC);
        YT* yb = y + ((((IS)on * P_ + p0) * Q_ + q0) * C_ + (IS)v * VEC);
#if POOL_MODE == POOL_MAX
        uint4 m[PT][QT];
#pragma unroll
        for (int o = 0; o < PT; ++o)
#pragma unroll
            for (int j = 0; j < QT; ++j) m[o][j] = make_uint4(NEG, NEG, NEG, NEG);
#else
        float m[PT][QT][VEC];
#pragma unroll
        for (int o = 0; o < PT; ++o)
#pragma unroll
            for (int j = 0; j < QT; ++j)
#pragma unroll
                for (int k = 0; k < VEC; ++k) m[o][j][k] = 0.f;
#endif
#pragma unroll
        for (int r = 0; r < FH; ++r) {
            const IS hh = h0 + r;
            const bool rok = hh >= 0 && hh < H_;
            // The footprint's row r: every load issued before any is used.
            uint4 u[FW];
#pragma unroll
            for (int cc = 0; cc < FW; ++cc) {
                const IS ww = w0 + cc;
#if POOL_MODE == POOL_MAX
                u[cc] = (rok && ww >= 0 && ww < W_) ? ldx_raw(xb + (hh * W_ + ww) * C_, al) : make_uint4(NEG, NEG, NEG, NEG);
#else
                u[cc] = (rok && ww >= 0 && ww < W_) ? ldx_raw(xb + (hh * W_ + ww) * C_, al) : make_uint4(0u, 0u, 0u, 0u);
#endif
            }
            // The row reduced over each output column's window.
#if POOL_MODE == POOL_MAX
            uint4 rs[QT];
#pragma unroll
            for (int j = 0; j < QT; ++j) {
                rs[j] = u[j * SW];
#pragma unroll
                for (int dw = 1; dw < KW; ++dw) rs[j] = vmax(rs[j], u[j * SW + dw]);
            }
#else
            // Each position converted once; the row's sums per output column.
            float rs[QT][VEC];
#pragma unroll
            for (int j = 0; j < QT; ++j)
#pragma unroll
                for (int k = 0; k < VEC; ++k) rs[j][k] = 0.f;
#pragma unroll
            for (int cc = 0; cc < FW; ++cc) {
                float f[VEC];
                cvt_x(u[cc], f);
#pragma unroll
                for (int j = 0; j < QT; ++j)
                    if (cc >= j * SW && cc < j * SW + KW) {
#pragma unroll
                        for (int k = 0; k < VEC; ++k) rs[j][k] += f[k];
                    }
            }
#endif
#pragma unroll
            for (int o = 0; o < PT; ++o) {
                // Output row o's window covers footprint rows o*SH .. o*SH+KH-1.
                if (r >= o * SH && r < o * SH + KH) {
#if POOL_MODE == POOL_MAX
#pragma unroll
                    for (int j = 0; j < QT; ++j) m[o][j] = vmax(m[o][j], rs[j]);
#else
#pragma unroll
                    for (int j = 0; j < QT; ++j) {
#pragma unroll
                        for (int k = 0; k < VEC; ++k) m[o][j][k] += rs[j][k];
                    }
#endif
                }
                if (r == o * SH + KH - 1) {
#pragma unroll
                    for (int j = 0; j < QT; ++j) {
                        const IS op = p0 + o, oq = q0 + j;
                        if (op < P_ && oq < Q_) {
                            const IS oh = op * SH - PREH, ow = oq * SW - PREW;
                            const IS nr = min(oh + KH, H_) - max(oh, (IS)0), nc = min(ow + KW, W_) - max(ow, (IS)0);
#if POOL_MODE == POOL_MAX
                            // An empty window (all padding) is NaN, as on the CPU.
                            st_raw(yb + (o * Q_ + j) * C_, al, (nr > 0 && nc > 0) ? m[o][j] : make_uint4(QNAN, QNAN, QNAN, QNAN));
#else
#if POOL_MODE == POOL_AVG_INCL
                            // The window clipped at the padded input's end (its start never
                            // passes the padding).
                            const float inv = 1.f / (float)((min(oh + KH, H_ + POSTH) - oh) * (min(ow + KW, W_ + POSTW) - ow));
#else
                            // Real positions (0 for an empty window: 0 * inf = NaN, as the
                            // CPU's 0 / 0).
                            const float inv = 1.f / (float)((nr > 0 && nc > 0) ? nr * nc : 0);
#endif
                            float f[VEC];
#pragma unroll
                            for (int k = 0; k < VEC; ++k) f[k] = m[o][j][k] * inv;
                            st_y(yb + (o * Q_ + j) * C_, al, f);
#endif
                        }
                    }
                }
            }
        }
    }
}
