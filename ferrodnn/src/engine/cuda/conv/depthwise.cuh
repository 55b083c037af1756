// Depthwise convolution (conv/depthwise.rs): groups == image channels C, filter [K, 1, taps...]
// with K = C * M (M the multiplier; output channel k reads image channel k / M). The forward
// (DW_FPROP), the data gradient (DW_DGRAD), and the weight gradient's two launches (DW_WGRAD:
// per-block partial sums into scratch; DW_WGRAD_SUM: the partials summed in a fixed order).
// Spatial dims are padded to three (D, H, W; leading dims of extent 1); all sums in f32.
//
// The instantiation defines:
//   DW_DT            the type of every tensor: DW_F32, DW_F16 or DW_BF16
//   VEC              channels a thread takes as one vector: 8 (16-bit types) or 4 (f32), read and
//                    written 16 bytes at a time (channels contiguous, bases aligned), or 1
//   IT               the index type (int when every offset fits, else long long)
//   N_, C_, M_, K_   images, image channels, multiplier, output channels (C_ * M_)
//   ID0 ID1 ID2      the image's spatial dims; OD0 OD1 OD2 the output's
//   T0 T1 T2, T_     the filter's taps per dim, and in all
//   S0 S1 S2, D0 D1 D2, PRE0 PRE1 PRE2   stride, dilation, padding before
//   FLIP             1: convolution mode (tap t reads the weight stored at T - 1 - t)
//   XSN XSC XS0 XS1 XS2   strides of the image (x, or dgrad's dx) in elements
//   YSN YSK YS0 YS1 YS2   strides of the output (y, or the gradients' dy)
//   WSK WS0 WS1 WS2       strides of the filter (w, or wgrad's dw)
//   NT               threads per block; the kernels but DW_WGRAD_SUM split them into GB lanes x TB
//                    tiles (CH_FAST 1: lanes fastest, for channels-last tensors; 0: tiles fastest)
//   G_, GB, LS       lanes in all (vectors of channels, times M_ in fprop and wgrad), lanes per
//                    block, lane slices (blocks along the lanes)
//   PX               outputs per thread along W (fprop: y, dgrad: dx, wgrad: dy per step)
//   FW               fprop and wgrad: input positions along W that PX outputs' taps cover
//   QLO, NQ          dgrad: the first dy position along W a tile reads (relative), and how many
//   TW, NTILES       tiles of PX along W, and tiles in all (fprop, dgrad)
//   Y_VEC            fprop: y written as vectors (M_ == 1, channels contiguous)
//   DY_VEC           dgrad, wgrad: dy read as vectors (M_ == 1, channels contiguous)
//   UNROLL_ROWS      1: the loops over filter rows (T0 x T1) are unrolled
//   NS               wgrad: slices of the reduction over (n, output rows), one partial each

#define DW_F32 1
#define DW_F16 2
#define DW_BF16 3

#if DW_DT == DW_F16
typedef __half ET;
#elif DW_DT == DW_BF16
typedef __nv_bfloat16 ET;
#else
typedef float ET;
#endif

#if UNROLL_ROWS
#define DW_ROWS_UNROLL _Pragma("unroll")
#else
#define DW_ROWS_UNROLL _Pragma("unroll 1")
#endif

__device__ __forceinline__ float e2f(ET v) {
#if DW_DT == DW_F16
    return __half2float(v);
#elif DW_DT == DW_BF16
    return __bfloat162float(v);
#else
    return v;
#endif
}

__device__ __forceinline__ ET f2e(float v) {
#if DW_DT == DW_F16
    return __float2half_rn(v);
#elif DW_DT == DW_BF16
    return __float2bfloat16_rn(v);
#else
    return v;
#endif
}

// Two 16-bit elements packed in a word, as floats, and back.
__device__ __forceinline__ float2 w2f(unsigned int w) {
#if DW_DT == DW_F16
    return __half22float2(*(const __half2*)&w);
#elif DW_DT == DW_BF16
    return __bfloat1622float2(*(const __nv_bfloat162*)&w);
#else
    return make_float2(0.f, 0.f);
#endif
}

__device__ __forceinline__ unsigned int f2w(float a, float b) {
#if DW_DT == DW_F16
    __half2 h = __floats2half2_rn(a, b);
    return *(const unsigned int*)&h;
#elif DW_DT == DW_BF16
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *(const unsigned int*)&h;
#else
    return 0u;
#endif
}

// VEC consecutive elements at p as floats: one 16-byte load when VEC > 1 (p aligned).
__device__ __forceinline__ void ld_vec(const ET* p, float* f) {
#if VEC == 8
    const uint4 u = *(const uint4*)p;
    const float2 a = w2f(u.x), b = w2f(u.y), c = w2f(u.z), d = w2f(u.w);
    f[0] = a.x;
    f[1] = a.y;
    f[2] = b.x;
    f[3] = b.y;
    f[4] = c.x;
    f[5] = c.y;
    f[6] = d.x;
    f[7] = d.y;
#elif VEC == 4
    const float4 u = *(const float4*)p;
    f[0] = u.x;
    f[1] = u.y;
    f[2] = u.z;
    f[3] = u.w;
#else
    f[0] = e2f(*p);
#endif
}

// VEC floats to consecutive elements at p: one 16-byte store when VEC > 1 (p aligned).
__device__ __forceinline__ void st_vec(ET* p, const float* f) {
#if VEC == 8
    *(uint4*)p = make_uint4(f2w(f[0], f[1]), f2w(f[2], f[3]), f2w(f[4], f[5]), f2w(f[6], f[7]));
#elif VEC == 4
    *(float4*)p = make_float4(f[0], f[1], f[2], f[3]);
#else
    *p = f2e(f[0]);
#endif
}

// VEC elements at p, p + s, p + 2s, ... as floats, and back.
__device__ __forceinline__ void ld_strided(const ET* p, IT s, float* f) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) f[j] = e2f(p[(IT)j * s]);
}

__device__ __forceinline__ void st_strided(ET* p, IT s, const float* f) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) p[(IT)j * s] = f2e(f[j]);
}

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
// output px through a tap, and which (fprop, wgrad).
__host__ __device__ constexpr int tap_of(int u, int px) {
    return (u - px * S2 >= 0 && (u - px * S2) % D2 == 0 && (u - px * S2) / D2 < T2) ? (u - px * S2) / D2 : -1;
}

__host__ __device__ constexpr bool position_used(int u) {
    for (int px = 0; px < PX; ++px) {
        if (tap_of(u, px) >= 0) return true;
    }
    return false;
}

// The lane and tile of this thread in its block.
__device__ __forceinline__ void lane_tile(int& gl, int& ty) {
#if CH_FAST
    gl = threadIdx.x % GB;
    ty = threadIdx.x / GB;
#else
    gl = threadIdx.x / TB;
    ty = threadIdx.x % TB;
#endif
}

#if DW_FPROP || DW_DGRAD
// The block's lanes' filter (lane slice `ls`) staged in shared memory as floats,
// [tap][m][lane][VEC] for MS multiplier values a lane: the forward's lane g = cv * M_ + m has
// one (MS 1), the data gradient's lane g = cv sums over all M_ (MS M_). Output channel
// (cv * VEC + j) * M_ + m.
template <int MS> __device__ __forceinline__ void dw_stage(float* sw, const ET* __restrict__ w, int ls) {
    for (int i = threadIdx.x; i < T_ * MS * GB * VEC; i += NT) {
        const int j = i % VEC, gl = (i / VEC) % GB, mm = (i / (VEC * GB)) % MS, t = i / (VEC * GB * MS);
        const int g = ls * GB + gl;
        float v = 0.f;
        if (g < G_) {
            const int cv = MS == 1 ? g / M_ : g, m = MS == 1 ? g % M_ : mm;
            v = e2f(w[(IT)((cv * VEC + j) * M_ + m) * WSK + tap_offset(t)]);
        }
        sw[i] = v;
    }
    __syncthreads();
}
#endif

#if DW_FPROP || DW_FPROP_STAGED
// The forwards' sums over one filter row: the FW input positions the PX outputs' taps cover
// (those no tap uses skipped), each loaded by `load(u, f)` (false: a position outside the
// image, skipped) and multiplied by the row's weights `wr` into the outputs it feeds.
template <typename Load>
__device__ __forceinline__ void dw_fprop_row(float (&acc)[PX][VEC], const float (&wr)[T2][VEC], Load load) {
#pragma unroll
    for (int u = 0; u < FW; ++u) {
        if (!position_used(u)) continue;
        float f[VEC];
        if (!load(u, f)) continue;
#pragma unroll
        for (int px = 0; px < PX; ++px) {
            const int t2 = tap_of(u, px);
            if (t2 < 0) continue;
#pragma unroll
            for (int j = 0; j < VEC; ++j) acc[px][j] = fmaf(f[j], wr[t2][j], acc[px][j]);
        }
    }
}

__device__ __forceinline__ void dw_zero(float (&acc)[PX][VEC]) {
#pragma unroll
    for (int px = 0; px < PX; ++px) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[px][j] = 0.f;
    }
}
#endif

#if DW_FPROP
// Forward: a thread computes PX consecutive outputs along W of VEC output channels
// k_j = (cv * VEC + j) * M_ + m (lane g = cv * M_ + m): it reads each input position its
// outputs' taps cover once per filter row, as a VEC-channel vector of x, and the weights from
// shared memory, where the block stages its lanes' filter as floats ([tap][lane][VEC]).
extern "C" __global__ void __launch_bounds__(NT) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    extern __shared__ float sw[];
    const int ls = blockIdx.x % LS;
    const IT tg = blockIdx.x / LS;
    dw_stage<1>(sw, w, ls);
    int gl, ty;
    lane_tile(gl, ty);
    const int g = ls * GB + gl;
    const IT tile = tg * TB + ty;
    if (g >= G_ || tile >= NTILES) return;
    const int cv = g / M_, m = g % M_;
    const int tw = (int)(tile % TW);
    IT rest = tile / TW;
    const int o1 = (int)(rest % OD1);
    rest /= OD1;
    const int o0 = (int)(rest % OD0);
    const IT n = rest / OD0;

    float acc[PX][VEC];
    dw_zero(acc);
    const ET* xb = x + n * XSN + (IT)(cv * VEC) * XSC;
    const int iw0 = tw * PX * S2 - PRE2;
    DW_ROWS_UNROLL
    for (int t0 = 0; t0 < T0; ++t0) {
        const int i0 = o0 * S0 - PRE0 + t0 * D0;
        if (i0 < 0 || i0 >= ID0) continue;
        DW_ROWS_UNROLL
        for (int t1 = 0; t1 < T1; ++t1) {
            const int i1 = o1 * S1 - PRE1 + t1 * D1;
            if (i1 < 0 || i1 >= ID1) continue;
            const ET* xr = xb + (IT)i0 * XS0 + (IT)i1 * XS1;
            float wr[T2][VEC];
#pragma unroll
            for (int t2 = 0; t2 < T2; ++t2) {
#pragma unroll
                for (int j = 0; j < VEC; ++j) wr[t2][j] = sw[((t0 * T1 + t1) * T2 + t2) * GB * VEC + gl * VEC + j];
            }
            dw_fprop_row(acc, wr, [&](int u, float* f) {
                const int iw = iw0 + u;
                if (iw < 0 || iw >= ID2) return false;
                ld_vec(xr + (IT)iw * XS2, f);
                return true;
            });
        }
    }
    ET* yb = y + n * YSN + (IT)o0 * YS0 + (IT)o1 * YS1;
#pragma unroll
    for (int px = 0; px < PX; ++px) {
        const int ow = tw * PX + px;
        if (ow >= OD2) break;
#if Y_VEC
        st_vec(yb + (IT)ow * YS2 + (IT)(cv * VEC) * YSK, acc[px]);
#else
        st_strided(yb + (IT)ow * YS2 + (IT)((cv * VEC) * M_ + m) * YSK, (IT)M_ * YSK, acc[px]);
#endif
    }
}
#endif

#if DW_FPROP_STAGED
// Forward, staged (sm_80+, 16-byte channel vectors, M_ == 1, y written as vectors): block
// (n, o0, row piece rb, column piece cw, lane slice ls) first copies, with 16-byte cp.async,
// the input footprint of its RH output rows x OWB output columns x GB channel vectors into
// shared memory (zeros outside the image), so that every input vector is read from global
// memory once per block and all of the block's reads are in flight together. Then each thread
// computes PX consecutive outputs along W (tile tw of TWB) of one channel vector, for rows rg,
// rg + RG, ... of the block's RH, from shared memory. (Persistent blocks with two footprint
// buffers, the next one's copies in flight during the compute, measured 15-27% slower on the
// H200: fewer blocks an SM.)
// Shared memory: the filter slice as float4s, [tap][VEC / 4][GB] (a quarter-warp's lanes read
// 128 contiguous bytes), then the footprint, [T0][SR][SWID][DW_CSTRIDE] vectors. Copied by the
// threads (cp.async): a column's GB <= 8 lanes in 8 slots rotated by GB per PX * S2 columns,
// so that the 8 threads of a quarter-warp (consecutive lanes, then tiles) read 8 different
// slots (no bank conflicts). By TMA (DW_TMA, Hopper): GB vectors a column, as the box lands.
//   RH, RB, OWB, CW     output rows a block and row pieces; output columns a block and pieces
//   SR, SWID            footprint rows ((RH - 1) * S1 + (T1 - 1) * D1 + 1) and columns
//   TWB, RG             tiles of PX along the block's columns; thread groups over its rows
__device__ __forceinline__ void dw_cp16(void* s, const void* g, int bytes) {
    const unsigned int a = (unsigned int)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(g), "r"(bytes) : "memory");
}

#if DW_TMA
// Hopper: the footprint comes as T0 TMA tile copies (one a filter slab along D) of the box
// [GB * VEC channels, SWID, SR] of map `xmap` over x ([C, W, H, (D,) N], innermost first; zeros
// outside the image and past the channels), dense: GB vectors a column.
#define DW_CSTRIDE GB
__device__ __forceinline__ int dw_slot(int c, int gl) { return gl; }

__device__ __forceinline__ void dw_tma(unsigned dst, const TmaMap* map, unsigned bar, int ch, int iw, int ih, int id, int n) {
#if DW_TMA_RANK == 5
    asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, %6}], [%7];"
        :: "r"(dst), "l"(map), "r"(ch), "r"(iw), "r"(ih), "r"(id), "r"(n), "r"(bar) : "memory");
#elif DW_TMA_RANK == 4
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];"
        :: "r"(dst), "l"(map), "r"(ch), "r"(iw), "r"(ih), "r"(n), "r"(bar) : "memory");
#else
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
        :: "r"(dst), "l"(map), "r"(ch), "r"(iw), "r"(n), "r"(bar) : "memory");
#endif
}
#else
// The slot of lane gl in footprint column c.
#define DW_CSTRIDE 8
__device__ __forceinline__ int dw_slot(int c, int gl) { return (gl + GB * (c / (PX * S2))) & 7; }
#endif

extern "C" __global__ void __launch_bounds__(NT) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    extern __shared__ float4 sw4[];
    // The footprint after the filter, at the next 128-byte boundary (TMA's destination).
    uint4* sx = (uint4*)(sw4 + T_ * (VEC / 4) * GB);
    sx += ((128u - ((unsigned)__cvta_generic_to_shared(sx) & 127u)) & 127u) / 16;
    IT bi = blockIdx.x;
    const int ls = (int)(bi % LS);
    bi /= LS;
    const int cw = (int)(bi % CW);
    bi /= CW;
    const int rb = (int)(bi % RB);
    bi /= RB;
    const int o0 = (int)(bi % OD0);
    const IT n = bi / OD0;
    const int oh0 = rb * RH, ow0 = cw * OWB;
    const int ih0 = oh0 * S1 - PRE1, iw0 = ow0 * S2 - PRE2;
#if DW_TMA
    __shared__ __align__(8) unsigned long long bar_mem;
    const unsigned bar = smem_u32(&bar_mem);
    if (threadIdx.x == 0) {
        mbar_init(bar, 1u);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar_expect_tx(bar, (unsigned)(T0 * SR * SWID * GB * 16));
        for (int t0 = 0; t0 < T0; ++t0) {
            dw_tma(smem_u32(sx + t0 * SR * SWID * GB), &xmap, bar, ls * GB * VEC, iw0, ih0, o0 * S0 - PRE0 + t0 * D0, (int)n);
        }
    }
#else
    const ET* xn = x + n * XSN;
    for (int i = threadIdx.x; i < T0 * SR * SWID * GB; i += NT) {
        const int gl = i % GB;
        int rest = i / GB;
        const int c = rest % SWID;
        rest /= SWID;
        const int r = rest % SR, t0 = rest / SR;
        const int i0 = o0 * S0 - PRE0 + t0 * D0, i1 = ih0 + r, i2 = iw0 + c, g = ls * GB + gl;
        const bool in = g < G_ && i0 >= 0 && i0 < ID0 && i1 >= 0 && i1 < ID1 && i2 >= 0 && i2 < ID2;
        // Outside the image: no bytes read (the base stands in as the address), 16 zeros written.
        const ET* src = in ? xn + (IT)i0 * XS0 + (IT)i1 * XS1 + (IT)i2 * XS2 + (IT)(g * VEC) * XSC : x;
        dw_cp16(sx + ((t0 * SR + r) * SWID + c) * DW_CSTRIDE + dw_slot(c, gl), src, in ? 16 : 0);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
    // The filter slice as floats while the copies fly: element (tap t, channel j) of lane gl.
    {
        float* sw = (float*)sw4;
        for (int i = threadIdx.x; i < T_ * GB * VEC; i += NT) {
            const int q = i % 4, gl = (i / 4) % GB, h = (i / (4 * GB)) % (VEC / 4), t = i / (VEC * GB);
            const int g = ls * GB + gl;
            sw[i] = g < G_ ? e2f(w[(IT)(g * VEC + h * 4 + q) * WSK + tap_offset(t)]) : 0.f;
        }
    }
#if DW_TMA
    __syncthreads();
    mbar_wait(bar, 0);
#else
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();
#endif
    const int gl = threadIdx.x % GB, tw = (threadIdx.x / GB) % TWB, rg = threadIdx.x / (GB * TWB);
    const int g = ls * GB + gl;
    if (g >= G_) return;
    for (int rr = rg; rr < RH; rr += RG) {
        const int o1 = oh0 + rr;
        if (o1 >= OD1) break;
        float acc[PX][VEC];
        dw_zero(acc);
        DW_ROWS_UNROLL
        for (int t0 = 0; t0 < T0; ++t0) {
            const int i0 = o0 * S0 - PRE0 + t0 * D0;
            if (i0 < 0 || i0 >= ID0) continue;
            DW_ROWS_UNROLL
            for (int t1 = 0; t1 < T1; ++t1) {
                const int r = rr * S1 + t1 * D1;
                if (ih0 + r < 0 || ih0 + r >= ID1) continue;
                const uint4* row = sx + ((t0 * SR + r) * SWID + tw * PX * S2) * DW_CSTRIDE;
                float wr[T2][VEC];
#pragma unroll
                for (int t2 = 0; t2 < T2; ++t2) {
#pragma unroll
                    for (int h = 0; h < VEC / 4; ++h) {
                        const float4 v = sw4[(((t0 * T1 + t1) * T2 + t2) * (VEC / 4) + h) * GB + gl];
                        wr[t2][h * 4] = v.x;
                        wr[t2][h * 4 + 1] = v.y;
                        wr[t2][h * 4 + 2] = v.z;
                        wr[t2][h * 4 + 3] = v.w;
                    }
                }
                dw_fprop_row(acc, wr, [&](int u, float* f) {
                    ld_vec((const ET*)(row + u * DW_CSTRIDE + dw_slot(tw * PX * S2 + u, gl)), f);
                    return true;
                });
            }
        }
        ET* yb = y + n * YSN + (IT)o0 * YS0 + (IT)o1 * YS1 + (IT)(g * VEC) * YSK;
#pragma unroll
        for (int px = 0; px < PX; ++px) {
            const int ow = ow0 + tw * PX + px;
            if (ow >= OD2) break;
            st_vec(yb + (IT)ow * YS2, acc[px]);
        }
    }
}
#endif

#if DW_DGRAD
// Data gradient: a thread computes PX consecutive positions along W (a tile starting at a
// multiple of S2, PX a multiple of S2) of VEC image channels c_j = cv * VEC + j (lane g = cv),
// summing over the multiplier m and the taps through which each reaches an output: along D
// and H the output row o = (i + pre - t * dil) / stride when exact and in range; along W the
// (position, tap) pairs are fixed by the tile's residue, so a tap that lands between strides
// costs nothing. Each dy position is read once per filter row. The block stages its lanes'
// filter in shared memory as floats ([tap][m][lane][VEC]).
extern "C" __global__ void __launch_bounds__(NT) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    extern __shared__ float sw[];
    const int ls = blockIdx.x % LS;
    const IT tg = blockIdx.x / LS;
    dw_stage<M_>(sw, w, ls);
    int gl, ty;
    lane_tile(gl, ty);
    const int g = ls * GB + gl;
    const IT tile = tg * TB + ty;
    if (g >= G_ || tile >= NTILES) return;
    const int cv = g;
    const int tw = (int)(tile % TW);
    IT rest = tile / TW;
    const int i1 = (int)(rest % ID1);
    rest /= ID1;
    const int i0 = (int)(rest % ID0);
    const IT n = rest / ID0;

    float acc[PX][VEC];
#pragma unroll
    for (int px = 0; px < PX; ++px) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[px][j] = 0.f;
    }
    const int iw0 = tw * PX;
    const int ob = iw0 / S2;
#pragma unroll 1
    for (int m = 0; m < M_; ++m) {
        // dy of channel k_0 = cv * VEC * M_ + m; k_j steps by M_.
        const ET* db = dy + n * YSN + (IT)((cv * VEC) * M_ + m) * YSK;
        DW_ROWS_UNROLL
        for (int t0 = 0; t0 < T0; ++t0) {
            const int e0 = i0 + PRE0 - t0 * D0;
            if (e0 < 0 || e0 % S0 != 0 || e0 / S0 >= OD0) continue;
            DW_ROWS_UNROLL
            for (int t1 = 0; t1 < T1; ++t1) {
                const int e1 = i1 + PRE1 - t1 * D1;
                if (e1 < 0 || e1 % S1 != 0 || e1 / S1 >= OD1) continue;
                const ET* dr = db + (IT)(e0 / S0) * YS0 + (IT)(e1 / S1) * YS1;
                float wr[T2][VEC];
#pragma unroll
                for (int t2 = 0; t2 < T2; ++t2) {
#pragma unroll
                    for (int j = 0; j < VEC; ++j) wr[t2][j] = sw[(((t0 * T1 + t1) * T2 + t2) * M_ + m) * GB * VEC + gl * VEC + j];
                }
#pragma unroll
                for (int qq = 0; qq < NQ; ++qq) {
                    // dy position ob + q feeds tile position px through tap t2 where
                    // px + PRE2 - t2 * D2 == q * S2.
                    const int q = QLO + qq;
                    const int ow = ob + q;
                    if (ow < 0 || ow >= OD2) continue;
                    float f[VEC];
#if DY_VEC
                    ld_vec(dr + (IT)ow * YS2, f);
#else
                    ld_strided(dr + (IT)ow * YS2, (IT)M_ * YSK, f);
#endif
#pragma unroll
                    for (int px = 0; px < PX; ++px) {
                        const int d = px + PRE2 - q * S2;
                        if (d < 0 || d % D2 != 0 || d / D2 >= T2) continue;
#pragma unroll
                        for (int j = 0; j < VEC; ++j) acc[px][j] = fmaf(f[j], wr[d / D2][j], acc[px][j]);
                    }
                }
            }
        }
    }
    ET* xb = dx + n * XSN + (IT)i0 * XS0 + (IT)i1 * XS1 + (IT)(cv * VEC) * XSC;
#pragma unroll
    for (int px = 0; px < PX; ++px) {
        const int iw = iw0 + px;
        if (iw >= ID2) break;
        st_vec(xb + (IT)iw * XS2, acc[px]);
    }
}
#endif

#if DW_WGRAD
// Weight gradient, first launch: block (filter row r = (t0, t1), lane slice, reduction slice
// sb) sums dy * x over output rows (n, o0, o1) sb * TB + ty, stepping by NS * TB, for the T2
// taps of row r and VEC channels k_j = (cv * VEC + j) * M_ + m of each lane g = cv * M_ + m;
// a thread walks its rows PX outputs at a time, reading each input position those outputs'
// taps cover once. The block then adds its TB threads' sums per lane in order of ty, and writes
// them to part[sb][tap][k] (floats).
extern "C" __global__ void __launch_bounds__(NT) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    __shared__ float red[NT * VEC];
    const int r = blockIdx.x % (T0 * T1);
    const int ls = (blockIdx.x / (T0 * T1)) % LS;
    const int sb = blockIdx.x / (T0 * T1 * LS);
    const int t0 = r / T1, t1 = r % T1;
    int gl, ty;
    lane_tile(gl, ty);
    const int g = ls * GB + gl;
    const int cv = g / M_, m = g % M_;

    float acc[T2][VEC];
#pragma unroll
    for (int t2 = 0; t2 < T2; ++t2) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[t2][j] = 0.f;
    }
    if (g < G_) {
        const ET* xc = x + (IT)(cv * VEC) * XSC;
        const ET* dc = dy + (IT)((cv * VEC) * M_ + m) * YSK;
#pragma unroll 1
        for (IT rr = (IT)sb * TB + ty; rr < (IT)N_ * OD0 * OD1; rr += (IT)NS * TB) {
            const int o1 = (int)(rr % OD1);
            const int o0 = (int)((rr / OD1) % OD0);
            const IT n = rr / ((IT)OD1 * OD0);
            const int i0 = o0 * S0 - PRE0 + t0 * D0;
            const int i1 = o1 * S1 - PRE1 + t1 * D1;
            if (i0 < 0 || i0 >= ID0 || i1 < 0 || i1 >= ID1) continue;
            const ET* xr = xc + n * XSN + (IT)i0 * XS0 + (IT)i1 * XS1;
            const ET* dr = dc + n * YSN + (IT)o0 * YS0 + (IT)o1 * YS1;
#pragma unroll 1
            for (int ow0 = 0; ow0 < OD2; ow0 += PX) {
                float dv[PX][VEC];
#pragma unroll
                for (int px = 0; px < PX; ++px) {
                    if (ow0 + px < OD2) {
#if DY_VEC
                        ld_vec(dr + (IT)(ow0 + px) * YS2, dv[px]);
#else
                        ld_strided(dr + (IT)(ow0 + px) * YS2, (IT)M_ * YSK, dv[px]);
#endif
                    } else {
#pragma unroll
                        for (int j = 0; j < VEC; ++j) dv[px][j] = 0.f;
                    }
                }
                const int iw0 = ow0 * S2 - PRE2;
#pragma unroll
                for (int u = 0; u < FW; ++u) {
                    if (!position_used(u)) continue;
                    const int iw = iw0 + u;
                    if (iw < 0 || iw >= ID2) continue;
                    float f[VEC];
                    ld_vec(xr + (IT)iw * XS2, f);
#pragma unroll
                    for (int px = 0; px < PX; ++px) {
                        const int t2 = tap_of(u, px);
                        if (t2 < 0) continue;
#pragma unroll
                        for (int j = 0; j < VEC; ++j) acc[t2][j] = fmaf(f[j], dv[px][j], acc[t2][j]);
                    }
                }
            }
        }
    }
    // The block's sums per lane, tap by tap: the TB threads of a lane added in order of ty
    // (unrolled: acc stays in registers).
#pragma unroll
    for (int t2 = 0; t2 < T2; ++t2) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) red[(ty * GB + gl) * VEC + j] = acc[t2][j];
        __syncthreads();
        for (int i = threadIdx.x; i < GB * VEC; i += NT) {
            const int gl2 = i / VEC, j = i % VEC;
            const int g2 = ls * GB + gl2;
            float s = 0.f;
            for (int y2 = 0; y2 < TB; ++y2) s += red[(y2 * GB + gl2) * VEC + j];
            if (g2 < G_) {
                const int k = ((g2 / M_) * VEC + j) * M_ + g2 % M_;
                part[((IT)sb * T_ + r * T2 + t2) * K_ + k] = s;
            }
        }
        __syncthreads();
    }
}
#endif

#if DW_WGRAD_SUM
// Weight gradient, second launch: dw[k, tap] = the NS partials summed in order of the slice.
extern "C" __global__ void __launch_bounds__(NT) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    GRID_STRIDE(i, (i64)K_ * T_) {
        const int k = (int)(i % K_), t = (int)(i / K_);
        float s = 0.f;
        for (int sb = 0; sb < NS; ++sb) s += part[((IT)sb * T_ + t) * K_ + k];
        dw[(IT)k * WSK + tap_offset(t)] = f2e(s);
    }
}
#endif
