// NHWC 2D strip pooling (fused/pooling.rs, `strip`), for windows that overlap along h, after
// vectors.cuh and pooling.cuh (indices in int). Block b owns RP output rows x QB output columns
// x all channels of one image: it streams its input footprint (FH rows of FWB positions) row
// by row into a ring of ND shared-memory slots (SLOT 16-byte vectors each) with 16-byte
// `cp.async`, ND-1 rows in flight; thread item (column j, channel vector v), IPT items per
// thread (ITEMS per output row, NT threads), reduces each row over its window's columns from
// shared memory and folds it into the accumulators of the output rows whose windows cover that
// row, storing an output as soon as its last row is in. NSP x NSQ blocks per image. Before
// pdl_site(), the first PF footprint rows go to L2.
//
// With POOL_ARGMAX (max pooling backward), each output vector's window taps of the CPU's
// maximum (the first maximal real element in row-major window order, a NaN beating any number;
// 255 for an empty window) go to yv as VEC bytes instead of the pooled values.

__device__ __forceinline__ void cp_async16(void* s, const void* g) {
    const unsigned int a = (unsigned int)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(g) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Footprint row r (when inside the image) into ring slot r % ND: its columns wlo..whi-1 of
// all channels, contiguous in x. Always commits a group (empty past the footprint), so the
// wait below counts rows.
__device__ __forceinline__ void load_row(uint4* ring, const XT* xn, int r, int h0, int w0, int wlo, int nvec, bool alx) {
    const int hh = h0 + r;
    if (r < FH && hh >= 0 && hh < H_) {
        uint4* dst = ring + (r % ND) * SLOT + (wlo - w0) * CV;
        const XT* src = xn + ((i64)hh * W_ + wlo) * C_;
        for (int k = threadIdx.x; k < nvec; k += NT) {
            if (alx) cp_async16(dst + k, src + (i64)k * VEC);
            else dst[k] = ldx_raw(src + (i64)k * VEC, false);
        }
    }
    cp_async_commit();
}

extern "C" __global__ void __launch_bounds__(NT) KERNEL_NAME(KERNEL_PARAMS) {
    extern __shared__ uint4 ring[];
    const XT* __restrict__ x = (const XT*)xv;
    YT* __restrict__ y = (YT*)yv;
    const bool alx = ((unsigned long long)x & 15) == 0;
    const bool aly = ((unsigned long long)y & (YAL - 1)) == 0;
    // Block = (n * NSP + strip along p) * NSQ + strip along q.
    const int sq = blockIdx.x % NSQ;
    const int bt = blockIdx.x / NSQ;
    const int sp = bt % NSP;
    const int n = bt / NSP;
    const int p0 = sp * RP, q0 = sq * QB;
    const int h0 = p0 * SH - PREH, w0 = q0 * SW - PREW;
    const int wlo = max(w0, 0), whi = min(w0 + FWB, W_);
    const int nvec = max(whi - wlo, 0) * CV;
    const XT* xn = x + (i64)n * H_ * W_ * C_;
    // The first PF footprint rows into L2 while the kernel before this one may still run
    // (prefetches before the dependent-launch wait are sound, see pdl_site).
#pragma unroll 1
    for (int r = 0; r < PF && r < FH; ++r) {
        const int hh = h0 + r;
        if (hh >= 0 && hh < H_) {
            const char* lo = (const char*)(xn + ((i64)hh * W_ + wlo) * C_);
            const char* hi = lo + (i64)(whi - wlo) * C_ * (i64)sizeof(XT);
            const char* a0 = (const char*)((unsigned long long)lo & ~127ull);
            for (const char* l = a0 + threadIdx.x * 128; l < hi; l += NT * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(l < lo ? lo : l));
        }
    }
    pdl_site();
#if POOL_ARGMAX
    float best[IPT][RP][VEC];
    unsigned int tap[IPT][RP][VEC];
#pragma unroll
    for (int i = 0; i < IPT; ++i)
#pragma unroll
        for (int o = 0; o < RP; ++o)
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                best[i][o][k] = 0.f;
                tap[i][o][k] = 255u;
            }
#elif POOL_MODE == POOL_MAX
    uint4 acc[IPT][RP];
#pragma unroll
    for (int i = 0; i < IPT; ++i)
#pragma unroll
        for (int o = 0; o < RP; ++o) acc[i][o] = make_uint4(NEG, NEG, NEG, NEG);
#else
    float acc[IPT][RP][VEC];
#pragma unroll
    for (int i = 0; i < IPT; ++i)
#pragma unroll
        for (int o = 0; o < RP; ++o)
#pragma unroll
            for (int k = 0; k < VEC; ++k) acc[i][o][k] = 0.f;
#endif
#pragma unroll
    for (int r = 0; r < ND - 1; ++r) load_row(ring, xn, r, h0, w0, wlo, nvec, alx);
#pragma unroll
    for (int r = 0; r < FH; ++r) {
        // Row r landed (ND-2 younger groups may still fly); every thread is done with row
        // r-1, whose slot the load of row r+ND-1 takes.
        cp_async_wait<ND - 2>();
        __syncthreads();
        load_row(ring, xn, r + ND - 1, h0, w0, wlo, nvec, alx);
        const bool rok = h0 + r >= 0 && h0 + r < H_;
        const uint4* row = ring + (r % ND) * SLOT;
#pragma unroll
        for (int i = 0; i < IPT; ++i) {
            const int it = threadIdx.x + i * NT;
            if (it < ITEMS) {
                const int j = it / CV, v = it % CV;
                // The row reduced over output column j's window.
#if POOL_ARGMAX
                // The row's first maximal real element per channel (a NaN beats any number),
                // and its column in the window (-1: none).
                float rb[VEC];
                int rd[VEC];
#pragma unroll
                for (int k = 0; k < VEC; ++k) {
                    rb[k] = 0.f;
                    rd[k] = -1;
                }
#pragma unroll
                for (int dw = 0; dw < KW; ++dw) {
                    const int ww = w0 + j * SW + dw;
                    if (rok && ww >= 0 && ww < W_) {
                        float f[VEC];
                        cvt_x(row[(j * SW + dw) * CV + v], f);
#pragma unroll
                        for (int k = 0; k < VEC; ++k) {
                            const float e = f[k], b = rb[k];
                            if (rd[k] < 0 || e > b || (e != e && b == b)) {
                                rb[k] = e;
                                rd[k] = dw;
                            }
                        }
                    }
                }
#elif POOL_MODE == POOL_MAX
                uint4 rs = make_uint4(NEG, NEG, NEG, NEG);
#pragma unroll
                for (int dw = 0; dw < KW; ++dw) {
                    const int ww = w0 + j * SW + dw;
                    if (rok && ww >= 0 && ww < W_) rs = vmax(rs, row[(j * SW + dw) * CV + v]);
                }
#else
                float rs[VEC];
#pragma unroll
                for (int k = 0; k < VEC; ++k) rs[k] = 0.f;
#pragma unroll
                for (int dw = 0; dw < KW; ++dw) {
                    const int ww = w0 + j * SW + dw;
                    if (rok && ww >= 0 && ww < W_) {
                        float f[VEC];
                        cvt_x(row[(j * SW + dw) * CV + v], f);
#pragma unroll
                        for (int k = 0; k < VEC; ++k) rs[k] += f[k];
                    }
                }
#endif
#pragma unroll
                for (int o = 0; o < RP; ++o) {
                    // Output row o's window covers footprint rows o*SH .. o*SH+KH-1.
#if POOL_ARGMAX
                    // Rows come in window order, so the CPU's row-major first maximum.
                    if (r >= o * SH && r < o * SH + KH) {
#pragma unroll
                        for (int k = 0; k < VEC; ++k) {
                            const float e = rb[k], b = best[i][o][k];
                            if (rd[k] >= 0 && (tap[i][o][k] == 255u || e > b || (e != e && b == b))) {
                                best[i][o][k] = e;
                                tap[i][o][k] = (unsigned int)((r - o * SH) * KW + rd[k]);
                            }
                        }
                    }
#elif POOL_MODE == POOL_MAX
                    if (r >= o * SH && r < o * SH + KH) acc[i][o] = vmax(acc[i][o], rs);
#else
                    if (r >= o * SH && r < o * SH + KH) {
#pragma unroll
                        for (int k = 0; k < VEC; ++k) acc[i][o][k] += rs[k];
                    }
#endif
                    if (r == o * SH + KH - 1) {
                        const int op = p0 + o, oq = q0 + j;
                        if (op < P_ && oq < Q_) {
                            const int oh = op * SH - PREH, ow = oq * SW - PREW;
                            const int nr = min(oh + KH, H_) - max(oh, 0), nc = min(ow + KW, W_) - max(ow, 0);
                            const i64 yo = (((i64)n * P_ + op) * Q_ + oq) * C_ + v * VEC;
#if POOL_ARGMAX
                            IdxV u;
#pragma unroll
                            for (int k = 0; k < VEC; ++k) u.b[k] = (unsigned char)tap[i][o][k];
                            ((IDXW*)yv)[yo / VEC] = u.u;
                            (void)nr;
                            (void)nc;
                            (void)aly;
#elif POOL_MODE == POOL_MAX
                            // An empty window (all padding) is NaN, as on the CPU.
                            st_raw(y + yo, aly, (nr > 0 && nc > 0) ? acc[i][o] : make_uint4(QNAN, QNAN, QNAN, QNAN));
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
                            for (int k = 0; k < VEC; ++k) f[k] = acc[i][o][k] * inv;
                            st_y(y + yo, aly, f);
#endif
                        }
                    }
                }
            }
        }
    }
}
