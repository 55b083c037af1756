// The fast weight gradient of rnn_backward_weights for 16-bit sequences (rnn/persist_wgrad.rs):
// per layer, WG_KERNEL 0 and 1 make the two operands of one tensor-core GEMM (the GEMM engine's
// launches), WG_KERNEL 2 adds its f32 result and the biases into dw. With R = T * B rows
// (r = t * B + b, as dgates and the reserve order them) and direction d:
//   dg [D, R, GWP]   (SEQ_T): dgates of layer RNN_L, entry w of direction d (the whole record:
//                    GRU's 4H, the recurrent n gate's gradient last), 0 past a sample's length
//                    and in the padding w >= RNN_GW;
//   xin [D, R, WG_N] (SEQ_T): columns [0, KP) the layer's input, [KP, KP + PPD) h_prev of
//                    direction d; 0 past a sample's length and in the padding;
//   GEMM, batch d:   cm[d] [RNN_GW, WG_N] (f32) = dg[d]^T [RNN_GW, R] x xin[d] [R, WG_N]: its
//                    columns [0, KP) are dW's rows, [KP, WG_N) dR's;
//   part [CHUNKS, D * GWP] (f32): column d * GWP + w of dg summed over CH rows a chunk (from
//                    dgates as stored, before the rounding to SEQ_T; at most 64 chunks), for the
//                    biases.
//
// The instantiation defines WG_KERNEL, SEQ_T, GWP, KP, WG_N (= KP + PPD), CH, CHUNKS,
// WG_BIAS, and for WG_KERNEL 2 WG_PL (elements of one pseudo-layer), LAYER_OFF (the layer's
// first element in the weight space) and HAS_BW (input biases present); with common.cuh's
// sizes, the layer's RNN_L, RNN_IN, LAYER0, RES_OUT, RES_OUT_PREV, the ports' loads and stores.

#define WG_R ((i64)RNN_T * RNN_B)

#if WG_KERNEL == 0
// A block per 32 columns (d, w) of dgates and chunk of CH rows: lane l of warp y converts
// column l's rows y, y + 8, ... of the chunk (a warp reads 32 consecutive entries of a dgates
// record and writes them consecutively to dg), then the block sums each column's 8 partials in
// warp order.
extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    __shared__ float red[8][33];
    const int cols = RNN_D * GWP;
    const int lane = threadIdx.x & 31, y = threadIdx.x >> 5;
    const int c = blockIdx.x * 32 + lane;
    const int d = c / GWP, w = c % GWP;
    const i64 r0 = (i64)blockIdx.y * CH;
    const i64 r1 = r0 + CH < WG_R ? r0 + CH : WG_R;
    float acc = 0.f;
    if (c < cols) {
#pragma unroll 4
        for (i64 r = r0 + y; r < r1; r += 8) {
            const int t = (int)(r / RNN_B), b = (int)(r % RNN_B);
            float v = 0.f;
            if (w < RNN_GW && t < rnn_len(meta, b)) v = (float)LD_DG(dgates, AT1(tdgates, (((i64)RNN_L * WG_R + r) * RNN_D + d) * RNN_GW + w));
            dg[((i64)d * WG_R + r) * GWP + w] = (SEQ_T)v;
            acc += v;
        }
    }
#if WG_BIAS
    red[y][lane] = acc;
    __syncthreads();
    if (y == 0 && c < cols) {
        float s = 0.f;
#pragma unroll
        for (int k = 0; k < 8; ++k) s += red[k][lane];
        part[(i64)blockIdx.y * cols + c] = s;
    }
#endif
}

#elif WG_KERNEL == 1
// One thread per element of `xin`.
extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    GRID_STRIDE(i, (i64)RNN_D * WG_R * WG_N) {
        const int d = (int)(i / (WG_R * WG_N));
        const i64 r = (i / WG_N) % WG_R;
        const int c = (int)(i % WG_N);
        const int t = (int)(r / RNN_B), b = (int)(r % RNN_B);
        const int len = rnn_len(meta, b);
        float v = 0.f;
        if (t < len) {
            if (c < KP) {
                if (c < RNN_IN) {
#if LAYER0
                    v = (float)LD_X(x, rnn_seq_off(tx, t, b, rnn_row(meta, t, b), c));
#else
                    v = (float)LD_RES(reserve, AT1(treserve, RES_OUT_PREV + r * RNN_F + c));
#endif
                }
            } else if (c - KP < RNN_P) {
                // h_prev: the direction's previous step's output (in its own order), or hx.
                const int n = c - KP;
                const int tp = rnn_prev_step(d, t, len);
                if (tp >= 0) {
                    v = (float)LD_RES(reserve, AT1(treserve, RES_OUT + ((i64)tp * RNN_B + b) * RNN_F + (i64)d * RNN_P + n));
                } else {
#if HAS_HX
                    v = (float)LD_HX(hx, rnn_state_off(thx, RNN_L * RNN_D + d, b, n));
#endif
                }
            }
        }
        xin[i] = (SEQ_T)v;
    }
}

#else
// dw over the layer's pseudo-layers (each: W [GH, RNN_IN], R [GH, RNN_P], then the input
// biases if any, then the recurrent ones, GH each) = dw_in (0 without) + the gradient, one
// thread per element: so dw_in and dw may share a buffer. The matrices come from cm (GRU's
// R_n from the recurrent n gate's rows), the biases from the chunks' sums added in chunk order
// (no atomics: the same result every run).
extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    GRID_STRIDE(i, (i64)RNN_D * WG_PL) {
        const int d = (int)(i / WG_PL);
        const i64 e = i % WG_PL;
        const float* cd = cm + (i64)d * RNN_GW * WG_N;
        float g;
        if (e < (i64)RNN_GH * RNN_IN) {
            g = cd[(e / RNN_IN) * WG_N + e % RNN_IN];
        } else if (e < (i64)RNN_GH * (RNN_IN + RNN_P)) {
            const i64 e2 = e - (i64)RNN_GH * RNN_IN;
            i64 m = e2 / RNN_P;
            if (RNN_MODE == 3 && m >= 2 * RNN_H) m += RNN_H;
            g = cd[m * WG_N + KP + e2 % RNN_P];
        } else {
            i64 j = e - (i64)RNN_GH * (RNN_IN + RNN_P);
            bool rec = true;
            if (HAS_BW && j < RNN_GH) rec = false;
            else if (HAS_BW) j -= RNN_GH;
            const i64 w = (rec && RNN_MODE == 3 && j >= 2 * RNN_H) ? RNN_H + j : j;
            float s = 0.f;
#if WG_BIAS
#pragma unroll 8
            for (int ch = 0; ch < CHUNKS; ++ch) s += part[(i64)ch * RNN_D * GWP + (i64)d * GWP + w];
#endif
            g = s;
        }
#if HAS_DW_IN
        const double v = LD_DW_IN(dw_in, AT1(tdw_in, LAYER_OFF + i)) + (double)g;
#else
        const double v = (double)g;
#endif
        ST_DW(dw, AT1(tdw, LAYER_OFF + i), v);
    }
}
#endif
