// The recurrence of one layer: one block per (sample, direction) runs the sample's steps in the
// direction's order, each step the recurrent product R h, the fused gates and cell, and (LSTMP)
// the projection. The block's vectors live in the scratch `st` (h[P], c[H], hh[H], rh[GH] per
// block); __syncthreads orders each phase's global writes before the next phase reads them.
//
// The instantiation defines RNN_L, R_OFF(d), WR_OFF(d), BR_OFF(d), TRAINING, HAS_HX, HAS_CX,
// HAS_HY, HAS_CY, RES_STATES, RES_OUT (the layer's reserve offsets), CLIP, CLIP_NAN, and the
// loads and stores of the ports present.

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    const int b = blockIdx.x, d = blockIdx.y, pl = RNN_L * RNN_D + d;
    const i64 rows = (i64)RNN_T * RNN_B;
    acc_t* h = st + (i64)(d * RNN_B + b) * (RNN_P + 2 * RNN_H + RNN_GH);
    acc_t* c = h + RNN_P;
    acc_t* hh = c + RNN_H;
    acc_t* rh = hh + RNN_H;
    const int len = rnn_len(meta, b);
    for (int k = threadIdx.x; k < RNN_P; k += blockDim.x) {
#if HAS_HX
        h[k] = (acc_t)LD_HX(hx, rnn_state_off(thx, pl, b, k));
#else
        h[k] = 0;
#endif
    }
    for (int j = threadIdx.x; j < RNN_H; j += blockDim.x) {
#if HAS_CX
        c[j] = (acc_t)LD_CX(cx, rnn_state_off(tcx, pl, b, j));
#else
        c[j] = 0;
#endif
    }
    __syncthreads();
    for (int i = 0; i < len; ++i) {
        const int t = d == 0 ? i : len - 1 - i;
        const i64 r = (i64)t * RNN_B + b;
        const acc_t* g = gx + (d * rows + r) * RNN_GH;
        for (int j = threadIdx.x; j < RNN_GH; j += blockDim.x) {
            acc_t acc = 0;
            const i64 w0 = R_OFF(d) + (i64)j * RNN_P;
            for (int k = 0; k < RNN_P; ++k) acc += (acc_t)LD_W(weights, AT1(tweights, w0 + k)) * h[k];
            if (RNN_MODE == 3 && j >= 2 * RNN_H && BR_OFF(d) >= 0) acc += (acc_t)LD_W(weights, AT1(tweights, BR_OFF(d) + j));
            rh[j] = acc;
        }
        __syncthreads();
        const i64 rec = RES_STATES + (r * RNN_D + d) * RNN_SW;
        for (int j = threadIdx.x; j < RNN_H; j += blockDim.x) {
#if RNN_MODE == 0 || RNN_MODE == 1
            acc_t v = g[j] + rh[j];
#if RNN_MODE == 0
            v = v > 0 ? v : (acc_t)0;
#else
            v = ACC_TANH(v);
#endif
            hh[j] = v;
#if TRAINING
            ST_RES(reserve, AT1(treserve, rec + j), (double)v);
#endif
#elif RNN_MODE == 2
            acc_t gi = rnn_sigmoid(g[j] + rh[j]);
            acc_t gf = rnn_sigmoid(g[RNN_H + j] + rh[RNN_H + j]);
            acc_t gg = ACC_TANH(g[2 * RNN_H + j] + rh[2 * RNN_H + j]);
            acc_t go = rnn_sigmoid(g[3 * RNN_H + j] + rh[3 * RNN_H + j]);
            acc_t cn = gf * c[j] + gi * gg;
            cn = rnn_clip_cell(cn, (acc_t)clip_lower, (acc_t)clip_upper);
            c[j] = cn;
            hh[j] = go * ACC_TANH(cn);
#if TRAINING
            ST_RES(reserve, AT1(treserve, rec + j), (double)gi);
            ST_RES(reserve, AT1(treserve, rec + RNN_H + j), (double)gf);
            ST_RES(reserve, AT1(treserve, rec + 2 * RNN_H + j), (double)gg);
            ST_RES(reserve, AT1(treserve, rec + 3 * RNN_H + j), (double)go);
            ST_RES(reserve, AT1(treserve, rec + 4 * RNN_H + j), (double)cn);
#endif
#else
            acc_t gr = rnn_sigmoid(g[j] + rh[j]);
            acc_t gz = rnn_sigmoid(g[RNN_H + j] + rh[RNN_H + j]);
            acc_t gn = ACC_TANH(g[2 * RNN_H + j] + gr * rh[2 * RNN_H + j]);
            hh[j] = ((acc_t)1 - gz) * gn + gz * h[j];
#if TRAINING
            ST_RES(reserve, AT1(treserve, rec + j), (double)gr);
            ST_RES(reserve, AT1(treserve, rec + RNN_H + j), (double)gz);
            ST_RES(reserve, AT1(treserve, rec + 2 * RNN_H + j), (double)gn);
            ST_RES(reserve, AT1(treserve, rec + 3 * RNN_H + j), (double)rh[2 * RNN_H + j]);
#endif
#endif
        }
        __syncthreads();
        for (int k = threadIdx.x; k < RNN_P; k += blockDim.x) {
#if RNN_PROJ
            acc_t v = 0;
            const i64 w0 = WR_OFF(d) + (i64)k * RNN_H;
            for (int j = 0; j < RNN_H; ++j) v += (acc_t)LD_W(weights, AT1(tweights, w0 + j)) * hh[j];
#else
            acc_t v = hh[k];
#endif
            h[k] = v;
            so[r * RNN_F + d * RNN_P + k] = v;
#if TRAINING
            ST_RES(reserve, AT1(treserve, RES_OUT + r * RNN_F + d * RNN_P + k), (double)v);
#endif
        }
        __syncthreads();
    }
#if HAS_HY
    for (int k = threadIdx.x; k < RNN_P; k += blockDim.x) ST_HY(hy, rnn_state_off(thy, pl, b, k), (double)h[k]);
#endif
#if HAS_CY
    for (int j = threadIdx.x; j < RNN_H; j += blockDim.x) ST_CY(cy, rnn_state_off(tcy, pl, b, j), (double)c[j]);
#endif
}
