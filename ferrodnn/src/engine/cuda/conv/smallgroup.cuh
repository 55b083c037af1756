// Grouped convolutions of few channels a group (conv/smallgroup.rs): G_ groups of CG image
// channels and KG output channels (filter [K_, CG, taps...], output channel k of group k / KG
// reads image channels (k / KG) * CG ...), direct SIMT kernels with f32 sums. The forward
// (SG_FPROP, with the GEMM epilogue's chain when SG_EPI; a data gradient of unit stride runs as
// the forward convolution of dy, see smallgroup.rs) and the weight gradient's two launches
// (SG_WGRAD: per-block partial sums into scratch; SG_WGRAD_SUM: the partials summed in a fixed
// order). Spatial dims are padded to three (D, H, W; leading dims of extent 1).
//
// A block takes a tile of TH output rows x TW output columns of one output depth slice for GS
// groups; it stages the tile's input (T0 depth slices, HT rows, WT columns, GS * CG channels)
// in shared memory as floats. Its NT threads are (from the fastest) NCT along W, NR along H, FR
// filter rows (weight gradient), KS parts of a group's output channels (KV each), GS groups.
//
// The instantiation defines:
//   SG_ET, SG_OT      the type of x, w and dy (ET), and of the stored output y or dw (OT):
//                     SG_F32, SG_F16 or SG_BF16
//   IT                the index type (int when every offset fits, else long long)
//   N_, G_, CG, KG, C_, K_   images, groups, image and output channels a group, in all
//   ID0 ID1 ID2, OD0 OD1 OD2, T0 T1 T2, T_   image and output spatial dims, taps (and in all)
//   S0 S1 S2, D0 D1 D2, PRE0 PRE1 PRE2        stride, dilation, padding before
//   FLIP              1: convolution mode (tap t reads the weight stored at T - 1 - t)
//   XSN XSC XS0 XS1 XS2   strides of x in elements
//   YSN YSK YS0 YS1 YS2   strides of the stored output (forward) or of dy (weight gradient)
//   WSK WSC WS0 WS1 WS2   strides of w (forward) or dw; WSG: w's from one group to the next
//   NT, GS, NGS, KS, KV, NR, NCT, PX, FR   threads; groups a block and group slices (blocks
//                     along the groups); parts of KG and output channels a part; threads along H
//                     and W; outputs a thread along W; filter rows (T0 * T1 in the weight
//                     gradient, else 1)
//   TH, TW, TILES_H, TILES_W, NTILES   a tile's output rows (= NR) and columns (NCT * PX), tiles
//                     along H and W, tiles in all (images x output depth x H x W)
//   HT, WT            the x tile's rows and columns
//   WP, RP            x tile columns per stride phase (column c at slot (c % S2) * WP + c / S2),
//                     a row's pitch in slots
//   CHX, CQ           floats a slot (a chunk of up to 4 of a group's channels), chunks a group
//   PLANE, GPITCH     floats of one (chunk, depth slice) plane of the x tile, and of a group's
//                     planes: x tile float (g, chunk q, slice s, row r, slot) at
//                     g * GPITCH + (q * T0 + s) * PLANE + (r * RP + slot) * CHX
//   FW                input positions along W a thread's PX outputs cover
//   XV, YV            elements of x a staged item (8, 4 or 1), of the output (forward) or of dy
//                     (weight gradient) an item: 16-byte vectors when more than 1
//   X_CH_FAST, Y_CH_FAST   element-wise items: channels fastest (else columns)
//   X_PUT4            x chunks of 4 floats written as one 16-byte shared store
//   SX_FLOATS         floats of the x tile (the forward's output tile reuses it)
//   UNROLL_ROWS       1: the loops over filter rows (T0 x T1) are unrolled
// Forward: OP (the output tile's floats a pixel), W_VEC4 and O_VEC4 (weights read and outputs
// written as 4 floats), SG_EPI and EPI_NAMES (the GEMM epilogue's arguments after the value).
// Weight gradient: CHY, KQ, RPY, DPITCH (the dy tile: chunks of CHY of a part's KV channels, KQ
// of them, row pitch in slots, floats a (group, part)), NS (reduction slices), MIN_BLOCKS
// (blocks an SM holds at once: the grid is one wave of them), XI, YI (items a thread stages of
// x and dy), PREFETCH (the next tile's items held in registers while the current one is
// summed), Y_PUT4.

#define SG_F32 1
#define SG_F16 2
#define SG_BF16 3

#if SG_ET == SG_F16
typedef __half ET;
#elif SG_ET == SG_BF16
typedef __nv_bfloat16 ET;
#else
typedef float ET;
#endif

#if SG_OT == SG_F16
typedef __half OT;
#elif SG_OT == SG_BF16
typedef __nv_bfloat16 OT;
#else
typedef float OT;
#endif

#if UNROLL_ROWS
#define SG_ROWS_UNROLL _Pragma("unroll")
#else
#define SG_ROWS_UNROLL _Pragma("unroll 1")
#endif

__device__ __forceinline__ float sg_f(float v) { return v; }
__device__ __forceinline__ float sg_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float sg_f(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T sg_to(float v);
template <> __device__ __forceinline__ float sg_to<float>(float v) { return v; }
template <> __device__ __forceinline__ __half sg_to<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 sg_to<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Two 16-bit elements of type T packed in a word, as floats, and back.
template <typename T> __device__ __forceinline__ float2 sg_pair(unsigned int w);
template <> __device__ __forceinline__ float2 sg_pair<__half>(unsigned int w) { return __half22float2(*(const __half2*)&w); }
template <> __device__ __forceinline__ float2 sg_pair<__nv_bfloat16>(unsigned int w) { return __bfloat1622float2(*(const __nv_bfloat162*)&w); }
template <typename T> __device__ __forceinline__ unsigned int sg_word(float a, float b);
template <> __device__ __forceinline__ unsigned int sg_word<__half>(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *(const unsigned int*)&h;
}
template <> __device__ __forceinline__ unsigned int sg_word<__nv_bfloat16>(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *(const unsigned int*)&h;
}

// 16 bytes of T (8 16-bit elements or 4 f32) as floats, and back.
template <typename T> __device__ __forceinline__ void sg_unpack(uint4 u, float* f) {
    if constexpr (sizeof(T) == 4) {
        f[0] = __uint_as_float(u.x);
        f[1] = __uint_as_float(u.y);
        f[2] = __uint_as_float(u.z);
        f[3] = __uint_as_float(u.w);
    } else {
        const float2 a = sg_pair<T>(u.x), b = sg_pair<T>(u.y), c = sg_pair<T>(u.z), d = sg_pair<T>(u.w);
        f[0] = a.x;
        f[1] = a.y;
        f[2] = b.x;
        f[3] = b.y;
        f[4] = c.x;
        f[5] = c.y;
        f[6] = d.x;
        f[7] = d.y;
    }
}

template <typename T> __device__ __forceinline__ uint4 sg_pack(const float* f) {
    if constexpr (sizeof(T) == 4) {
        return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
    } else {
        return make_uint4(sg_word<T>(f[0], f[1]), sg_word<T>(f[2], f[3]), sg_word<T>(f[4], f[5]), sg_word<T>(f[6], f[7]));
    }
}

// A staged item of V elements of T: a 16-byte vector, or one element.
template <typename T, int V> struct SgItem {
    uint4 u;
    __device__ __forceinline__ void zero() { u = make_uint4(0u, 0u, 0u, 0u); }
    __device__ __forceinline__ void load(const T* p) { u = *(const uint4*)p; }
    __device__ __forceinline__ void floats(float* f) const { sg_unpack<T>(u, f); }
};
template <typename T> struct SgItem<T, 1> {
    T v;
    __device__ __forceinline__ void zero() { v = sg_to<T>(0.f); }
    __device__ __forceinline__ void load(const T* p) { v = *p; }
    __device__ __forceinline__ void floats(float* f) const { f[0] = sg_f(v); }
};

// The offset in the filter of geometric tap t (row-major over T0 x T1 x T2): the weight it
// reads is stored at the mirrored tap in convolution mode.
__device__ __forceinline__ IT tap_offset(int t) {
    int t0 = t / (T1 * T2), t1 = (t / T2) % T1, t2 = t % T2;
#if FLIP
    t0 = T0 - 1 - t0;
    t1 = T1 - 1 - t1;
    t2 = T2 - 1 - t2;
#endif
    return (IT)t0 * WS0 + (IT)t1 * WS1 + (IT)t2 * WS2;
}

// Whether position u of the covered input positions along W (u = px * S2 + t2 * D2) feeds
// output px through a tap, and which.
__host__ __device__ constexpr int tap_of(int u, int px) {
    return (u - px * S2 >= 0 && (u - px * S2) % D2 == 0 && (u - px * S2) / D2 < T2) ? (u - px * S2) / D2 : -1;
}

__host__ __device__ constexpr bool position_used(int u) {
    for (int px = 0; px < PX; ++px) {
        if (tap_of(u, px) >= 0) return true;
    }
    return false;
}

// The x tile's slot of column c: the columns of each stride phase together.
__device__ __forceinline__ int x_slot(int c) { return (c % S2) * WP + c / S2; }

// The x tile's float of local channel ch (of the block's GS * CG) at depth slice s, row r,
// column c.
__device__ __forceinline__ int x_at(int ch, int s, int r, int c) {
    const int gl = ch / CG, cc = ch % CG;
    return gl * GPITCH + ((cc / CHX) * T0 + s) * PLANE + (r * RP + x_slot(c)) * CHX + cc % CHX;
}

#define X_ITEMS (T0 * HT * WT * (GS * CG / XV))
typedef SgItem<ET, XV> XItem;

// Item i of the block's x tile: its position (local channel, depth slice, row, column) and
// whether it lies in the image (and the channels), with its offset from the image's base.
struct XAt {
    int ch, s, r, c;
    bool in;
    IT off;
};

__device__ __forceinline__ XAt x_item(int i, int g0, int b0, int b1, int b2) {
    XAt a;
#if X_CH_FAST
    a.ch = (i % (GS * CG / XV)) * XV;
    int p = i / (GS * CG / XV);
    a.c = p % WT;
    p /= WT;
    a.r = p % HT;
    a.s = p / HT;
#else
    a.c = i % WT;
    int p = i / WT;
    a.r = p % HT;
    p /= HT;
    a.s = p % T0;
    a.ch = p / T0;
#endif
    const int i0 = b0 + a.s * D0, i1 = b1 + a.r, i2 = b2 + a.c, ch = g0 * CG + a.ch;
    a.in = i0 >= 0 && i0 < ID0 && i1 >= 0 && i1 < ID1 && i2 >= 0 && i2 < ID2 && ch < C_;
    a.off = (IT)i0 * XS0 + (IT)i1 * XS1 + (IT)i2 * XS2 + (IT)ch * XSC;
    return a;
}

__device__ __forceinline__ void x_fetch(XItem& q, const ET* __restrict__ xn, const XAt& a) {
    q.zero();
    if (a.in) q.load(xn + a.off);
}

__device__ __forceinline__ void x_put(float* sx, const XAt& a, const XItem& q) {
    float f[XV];
    q.floats(f);
#if X_PUT4
#pragma unroll
    for (int j = 0; j < XV; j += 4) *(float4*)(sx + x_at(a.ch + j, a.s, a.r, a.c)) = make_float4(f[j], f[j + 1], f[j + 2], f[j + 3]);
#else
#pragma unroll
    for (int j = 0; j < XV; ++j) sx[x_at(a.ch + j, a.s, a.r, a.c)] = f[j];
#endif
}

// The block's x tile (input origin b0, b1, b2 of image xn, its channels from group g0) into
// shared memory, four items a thread at a time.
__device__ __forceinline__ void x_stage(float* sx, const ET* __restrict__ xn, int g0, int b0, int b1, int b2) {
    for (int base = threadIdx.x; base < X_ITEMS; base += 4 * NT) {
        XItem q[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int i = base + j * NT;
            if (i < X_ITEMS) {
                x_fetch(q[j], xn, x_item(i, g0, b0, b1, b2));
            }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int i = base + j * NT;
            if (i < X_ITEMS) x_put(sx, x_item(i, g0, b0, b1, b2), q[j]);
        }
    }
}

// CG channels of the x tile at chunk slot p (the first chunk's float; the others are
// T0 * PLANE floats apart).
__device__ __forceinline__ void x_chunks(const float* p, float* xv) {
#pragma unroll
    for (int q = 0; q < CQ; ++q) {
        const float* c = p + q * (T0 * PLANE);
#if CHX == 4
        const float4 v = *(const float4*)c;
        const float e[4] = {v.x, v.y, v.z, v.w};
#elif CHX == 2
        const float2 v = *(const float2*)c;
        const float e[2] = {v.x, v.y};
#else
        const float e[1] = {*c};
#endif
#pragma unroll
        for (int j = 0; j < CHX; ++j) {
            if (q * CHX + j < CG) xv[q * CHX + j] = e[j];
        }
    }
}

#if SG_FPROP
// Forward. The block (group slice, tile) stages its filter ([g][tap][c][KG] floats) and x
// tile, then each thread computes PX consecutive outputs along W of KV output channels
// (ks * KV ...) of group gl, one output row: per filter row, the row's weights in registers
// and the FW input positions its outputs cover read once each, CG channels at a time. The
// outputs go through shared memory ([pixel][OP] floats, over the x tile) to stores of YV
// channels (with the epilogue) by consecutive threads.
extern "C" __global__ void __launch_bounds__(NT) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    extern __shared__ float4 sg_smem[];
    float* sx = (float*)sg_smem;
    float* sw = sx + SX_FLOATS;
    const int gsl = (int)(blockIdx.x % NGS);
    IT tile = blockIdx.x / NGS;
    const int tw = (int)(tile % TILES_W);
    tile /= TILES_W;
    const int th = (int)(tile % TILES_H);
    tile /= TILES_H;
    const int o0 = (int)(tile % OD0);
    const IT n = tile / OD0;
    const int g0 = gsl * GS;
    for (int i = threadIdx.x; i < GS * T_ * CG * KG; i += NT) {
        const int kk = i % KG, c = (i / KG) % CG, t = (i / (KG * CG)) % T_, g = g0 + i / (KG * CG * T_);
        sw[i] = g < G_ ? sg_f(w[(IT)g * WSG + (IT)kk * WSK + (IT)c * WSC + tap_offset(t)]) : 0.f;
    }
    x_stage(sx, x + n * XSN, g0, o0 * S0 - PRE0, th * TH * S1 - PRE1, tw * TW * S2 - PRE2);
    __syncthreads();

    const int ct = threadIdx.x % NCT, r = (threadIdx.x / NCT) % NR, ks = (threadIdx.x / (NCT * NR)) % KS, gl = threadIdx.x / (NCT * NR * KS);
    float acc[PX][KV];
#pragma unroll
    for (int px = 0; px < PX; ++px) {
#pragma unroll
        for (int j = 0; j < KV; ++j) acc[px][j] = 0.f;
    }
    const float* xg = sx + gl * GPITCH + ct * PX * CHX;
    const float* wg = sw + gl * (T_ * CG * KG) + ks * KV;
    SG_ROWS_UNROLL
    for (int t0 = 0; t0 < T0; ++t0) {
        SG_ROWS_UNROLL
        for (int t1 = 0; t1 < T1; ++t1) {
            const float* xr = xg + t0 * PLANE + (r * S1 + t1 * D1) * (RP * CHX);
            const float* wr0 = wg + (t0 * T1 + t1) * (T2 * CG * KG);
            float wr[T2][CG][KV];
#pragma unroll
            for (int t2 = 0; t2 < T2; ++t2) {
#pragma unroll
                for (int c = 0; c < CG; ++c) {
                    const float* p = wr0 + (t2 * CG + c) * KG;
#if W_VEC4
#pragma unroll
                    for (int j = 0; j < KV; j += 4) {
                        const float4 v = *(const float4*)(p + j);
                        wr[t2][c][j] = v.x;
                        wr[t2][c][j + 1] = v.y;
                        wr[t2][c][j + 2] = v.z;
                        wr[t2][c][j + 3] = v.w;
                    }
#else
#pragma unroll
                    for (int j = 0; j < KV; ++j) wr[t2][c][j] = p[j];
#endif
                }
            }
#pragma unroll
            for (int u = 0; u < FW; ++u) {
                if (!position_used(u)) continue;
                float xv[CG];
                x_chunks(xr + ((u % S2) * WP + u / S2) * CHX, xv);
#pragma unroll
                for (int px = 0; px < PX; ++px) {
                    const int t2 = tap_of(u, px);
                    if (t2 < 0) continue;
#pragma unroll
                    for (int c = 0; c < CG; ++c) {
#pragma unroll
                        for (int j = 0; j < KV; ++j) acc[px][j] = fmaf(xv[c], wr[t2][c][j], acc[px][j]);
                    }
                }
            }
        }
    }
    __syncthreads();
    float* so = sx;
#pragma unroll
    for (int px = 0; px < PX; ++px) {
        float* p = so + (r * TW + ct * PX + px) * OP + gl * KG + ks * KV;
#if O_VEC4
#pragma unroll
        for (int j = 0; j < KV; j += 4) *(float4*)(p + j) = make_float4(acc[px][j], acc[px][j + 1], acc[px][j + 2], acc[px][j + 3]);
#else
#pragma unroll
        for (int j = 0; j < KV; ++j) p[j] = acc[px][j];
#endif
    }
    __syncthreads();
    for (int i = threadIdx.x; i < TH * TW * (GS * KG / YV); i += NT) {
#if Y_CH_FAST
        const int ch = (i % (GS * KG / YV)) * YV, p = i / (GS * KG / YV);
#else
        const int pc = i % TW, q = i / TW, p = (q % TH) * TW + pc, ch = q / TH;
#endif
        const int o1 = th * TH + p / TW, o2 = tw * TW + p % TW, k = g0 * KG + ch;
        if (o1 >= OD1 || o2 >= OD2 || k >= K_) continue;
        float f[8];
#pragma unroll
        for (int j = 0; j < YV; ++j) f[j] = so[p * OP + ch + j];
#if SG_EPI
        const long long s = ((long long)o0 * OD1 + o1) * OD2 + o2;
#pragma unroll
        for (int j = 0; j < YV; ++j) f[j] = epilogue(f[j], (long long)n, s, (long long)(k + j) EPI_NAMES);
#endif
        OT* yp = y + n * YSN + (IT)o0 * YS0 + (IT)o1 * YS1 + (IT)o2 * YS2 + (IT)k * YSK;
#if YV > 1
        *(uint4*)yp = sg_pack<OT>(f);
#else
        *yp = sg_to<OT>(f[0]);
#endif
    }
}
#endif

#if SG_WGRAD
#define DY_ITEMS (TH * TW * (GS * KG / YV))
typedef SgItem<ET, YV> DyItem;

// Item i of the block's dy tile (TH x TW outputs, GS * KG channels): its position (local
// channel, row, column), whether it lies in the output, and its offset from the image's base.
struct DyAt {
    int ch, r, c;
    bool in;
    IT off;
};

__device__ __forceinline__ DyAt dy_item(int i, int g0, int o0, int th, int tw) {
    DyAt a;
#if Y_CH_FAST
    a.ch = (i % (GS * KG / YV)) * YV;
    const int p = i / (GS * KG / YV);
    a.c = p % TW;
    a.r = p / TW;
#else
    a.c = i % TW;
    const int p = i / TW;
    a.r = p % TH;
    a.ch = p / TH;
#endif
    const int o1 = th * TH + a.r, o2 = tw * TW + a.c, k = g0 * KG + a.ch;
    a.in = o1 < OD1 && o2 < OD2 && k < K_;
    a.off = (IT)o0 * YS0 + (IT)o1 * YS1 + (IT)o2 * YS2 + (IT)k * YSK;
    return a;
}

// The dy tile's float of local channel ch at row r, column c: [g][part][chunk][row][column]
// chunks of CHY of the part's KV channels.
__device__ __forceinline__ int dy_at(int ch, int r, int c) {
    const int gl = ch / KG, kk = ch % KG, part = kk / KV, j = kk % KV;
    return (gl * KS + part) * DPITCH + (((j / CHY) * TH + r) * RPY + c) * CHY + j % CHY;
}

__device__ __forceinline__ void dy_fetch(DyItem& q, const ET* __restrict__ dyn, const DyAt& a) {
    q.zero();
    if (a.in) q.load(dyn + a.off);
}

__device__ __forceinline__ void dy_put(float* sd, const DyAt& a, const DyItem& q) {
    float f[YV];
    q.floats(f);
#if Y_PUT4
#pragma unroll
    for (int j = 0; j < YV; j += 4) *(float4*)(sd + dy_at(a.ch + j, a.r, a.c)) = make_float4(f[j], f[j + 1], f[j + 2], f[j + 3]);
#else
#pragma unroll
    for (int j = 0; j < YV; ++j) sd[dy_at(a.ch + j, a.r, a.c)] = f[j];
#endif
}

__device__ __forceinline__ void dy_stage(float* sd, const ET* __restrict__ dyn, int g0, int o0, int th, int tw) {
    for (int base = threadIdx.x; base < DY_ITEMS; base += 4 * NT) {
        DyItem q[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int i = base + j * NT;
            if (i < DY_ITEMS) dy_fetch(q[j], dyn, dy_item(i, g0, o0, th, tw));
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int i = base + j * NT;
            if (i < DY_ITEMS) dy_put(sd, dy_item(i, g0, o0, th, tw), q[j]);
        }
    }
}

// A tile's image, output depth slice, rows and columns.
struct SgTile {
    IT n;
    int o0, th, tw;
};

__device__ __forceinline__ SgTile sg_tile(IT t) {
    SgTile a;
    a.tw = (int)(t % TILES_W);
    t /= TILES_W;
    a.th = (int)(t % TILES_H);
    t /= TILES_H;
    a.o0 = (int)(t % OD0);
    a.n = t / OD0;
    return a;
}

// Weight gradient, first launch: block (group slice, reduction slice sb) sums dy * x over the
// tiles sb, sb + NS, ...: each thread over its output row and PX consecutive outputs along W
// of each tile, for filter row fr = (t0, t1), the T2 taps of that row, the CG channels and KV
// output channels (ks * KV ...) of its group, reading each input position its outputs' taps
// cover once. The block then adds its threads' sums (the NR x NCT threads of each filter row,
// part and group, in order) and writes them to part[sb][k][c][tap] (floats). The grid is one
// wave of MIN_BLOCKS blocks an SM.
extern "C" __global__ void __launch_bounds__(NT, MIN_BLOCKS) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    extern __shared__ float4 sg_smem[];
    float* sx = (float*)sg_smem;
    float* sd = sx + SX_FLOATS;
    const int gsl = (int)(blockIdx.x % NGS);
    const int sb = (int)(blockIdx.x / NGS);
    const int g0 = gsl * GS;
    const int ct = threadIdx.x % NCT, r = (threadIdx.x / NCT) % NR, fr = (threadIdx.x / (NCT * NR)) % FR;
    const int ks = (threadIdx.x / (NCT * NR * FR)) % KS, gl = threadIdx.x / (NCT * NR * FR * KS);
    const int t0 = fr / T1, t1 = fr % T1;

    float acc[T2][CG][KV];
#pragma unroll
    for (int t2 = 0; t2 < T2; ++t2) {
#pragma unroll
        for (int c = 0; c < CG; ++c) {
#pragma unroll
            for (int j = 0; j < KV; ++j) acc[t2][c][j] = 0.f;
        }
    }
    const float* xr = sx + gl * GPITCH + t0 * PLANE + (r * S1 + t1 * D1) * (RP * CHX) + ct * PX * CHX;
    const float* dr = sd + (gl * KS + ks) * DPITCH + (r * RPY + ct * PX) * CHY;
#if PREFETCH
    XItem xq[XI];
    DyItem yq[YI];
    // This tile's items (fetched) and the next's.
    auto fetch = [&](IT t) {
        const SgTile a = sg_tile(t);
#pragma unroll
        for (int j = 0; j < XI; ++j) {
            const int i = threadIdx.x + j * NT;
            if (i < X_ITEMS) x_fetch(xq[j], x + a.n * XSN, x_item(i, g0, a.o0 * S0 - PRE0, a.th * TH * S1 - PRE1, a.tw * TW * S2 - PRE2));
        }
#pragma unroll
        for (int j = 0; j < YI; ++j) {
            const int i = threadIdx.x + j * NT;
            if (i < DY_ITEMS) dy_fetch(yq[j], dy + a.n * YSN, dy_item(i, g0, a.o0, a.th, a.tw));
        }
    };
    if (sb < NTILES) fetch(sb);
#endif
#pragma unroll 1
    for (IT t = sb; t < NTILES; t += NS) {
        __syncthreads();
#if PREFETCH
#pragma unroll
        for (int j = 0; j < XI; ++j) {
            const int i = threadIdx.x + j * NT;
            if (i < X_ITEMS) x_put(sx, x_item(i, 0, 0, 0, 0), xq[j]);
        }
#pragma unroll
        for (int j = 0; j < YI; ++j) {
            const int i = threadIdx.x + j * NT;
            if (i < DY_ITEMS) dy_put(sd, dy_item(i, 0, 0, 0, 0), yq[j]);
        }
        __syncthreads();
        if (t + NS < NTILES) fetch(t + NS);
#else
        const SgTile a = sg_tile(t);
        x_stage(sx, x + a.n * XSN, g0, a.o0 * S0 - PRE0, a.th * TH * S1 - PRE1, a.tw * TW * S2 - PRE2);
        dy_stage(sd, dy + a.n * YSN, g0, a.o0, a.th, a.tw);
        __syncthreads();
#endif
        float dv[PX][KV];
#pragma unroll
        for (int px = 0; px < PX; ++px) {
#pragma unroll
            for (int q = 0; q < KQ; ++q) {
                const float* p = dr + (q * TH * RPY + px) * CHY;
#if CHY == 4
                const float4 v = *(const float4*)p;
                const float e[4] = {v.x, v.y, v.z, v.w};
#elif CHY == 2
                const float2 v = *(const float2*)p;
                const float e[2] = {v.x, v.y};
#else
                const float e[1] = {*p};
#endif
#pragma unroll
                for (int j = 0; j < CHY; ++j) {
                    if (q * CHY + j < KV) dv[px][q * CHY + j] = e[j];
                }
            }
        }
#pragma unroll
        for (int u = 0; u < FW; ++u) {
            if (!position_used(u)) continue;
            float xv[CG];
            x_chunks(xr + ((u % S2) * WP + u / S2) * CHX, xv);
#pragma unroll
            for (int px = 0; px < PX; ++px) {
                const int t2 = tap_of(u, px);
                if (t2 < 0) continue;
#pragma unroll
                for (int c = 0; c < CG; ++c) {
#pragma unroll
                    for (int j = 0; j < KV; ++j) acc[t2][c][j] = fmaf(xv[c], dv[px][j], acc[t2][c][j]);
                }
            }
        }
    }
    // The block's sums, one filter-row tap at a time: [c][j][thread] floats over the tiles,
    // each (filter row, part, group) summing its NR x NCT threads in order.
    float* red = sx;
#pragma unroll
    for (int t2 = 0; t2 < T2; ++t2) {
        __syncthreads();
#pragma unroll
        for (int c = 0; c < CG; ++c) {
#pragma unroll
            for (int j = 0; j < KV; ++j) red[(c * KV + j) * NT + threadIdx.x] = acc[t2][c][j];
        }
        __syncthreads();
        for (int i = threadIdx.x; i < (NT / (NR * NCT)) * CG * KV; i += NT) {
            const int e = i % (CG * KV), owner = i / (CG * KV);
            float s = 0.f;
            for (int l = 0; l < NR * NCT; ++l) s += red[e * NT + owner * (NR * NCT) + l];
            const int f = owner % FR, kp = (owner / FR) % KS, g = g0 + owner / (FR * KS);
            const int c = e / KV, k = g * KG + kp * KV + e % KV;
            if (g < G_) part[((IT)sb * K_ + k) * (CG * T_) + c * T_ + f * T2 + t2] = s;
        }
    }
}
#endif

#if SG_WGRAD_SUM
// Weight gradient, second launch (256 threads a block): dw[k, c, tap] = the NS partials summed
// in order of the slice.
extern "C" __global__ void __launch_bounds__(256) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    GRID_STRIDE(i, (i64)K_ * CG * T_) {
        const int e = (int)(i % (CG * T_)), k = (int)(i / (CG * T_));
        float s = 0.f;
        for (int sb = 0; sb < NS; ++sb) s += part[((IT)sb * K_ + k) * (CG * T_) + e];
        dw[(IT)k * WSK + (IT)(e / T_) * WSC + tap_offset(e % T_)] = sg_to<OT>(s);
    }
}
#endif
