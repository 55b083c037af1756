// The backward recurrence of one layer: one block per (sample, direction) walks the sample's
// steps against the direction's order, carrying dh (and the LSTM's dc); each step gives the
// gates' gradients (to the scratch `dgs` and the dgates tensor) and, through the recurrent
// matrices, the previous state's gradient. The block's vectors live in the scratch `st`
// (dh[P], dc[H], dht[P], dhh[H], gz[H] per block).
//
// The instantiation defines RNN_L, R_OFF(d), WR_OFF(d), RES_STATES, RES_OUT, CLIP, HAS_HX,
// HAS_CX, HAS_DHY, HAS_DCY, HAS_DHX, HAS_DCX, HAS_DG, and the loads and stores of the ports.

// The state record of (step t, sample b, direction d) of this layer in the reserve.
#define REC(t, j) ((acc_t)LD_RES(reserve, AT1(treserve, RES_STATES + (((i64)(t) * RNN_B + b) * RNN_D + d) * RNN_SW + (j))))

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    const int b = blockIdx.x, d = blockIdx.y, pl = RNN_L * RNN_D + d;
    const i64 rows = (i64)RNN_T * RNN_B;
    acc_t* dh = st + (i64)(d * RNN_B + b) * (2 * RNN_P + 3 * RNN_H);
    acc_t* dc = dh + RNN_P;
    acc_t* dht = dc + RNN_H;
    acc_t* dhh = dht + RNN_P;
    acc_t* gz = dhh + RNN_H;
    const int len = rnn_len(meta, b);
    for (int k = threadIdx.x; k < RNN_P; k += blockDim.x) {
#if HAS_DHY
        dh[k] = (acc_t)LD_DHY(dhy, rnn_state_off(tdhy, pl, b, k));
#else
        dh[k] = 0;
#endif
    }
    for (int j = threadIdx.x; j < RNN_H; j += blockDim.x) {
#if HAS_DCY
        dc[j] = (acc_t)LD_DCY(dcy, rnn_state_off(tdcy, pl, b, j));
#else
        dc[j] = 0;
#endif
        gz[j] = 0;
    }
    __syncthreads();
    for (int i = 0; i < len; ++i) {
        const int t = d == 0 ? len - 1 - i : i;
        const int tp = rnn_prev_step(d, t, len);
        const i64 r = (i64)t * RNN_B + b;
        acc_t* dg = dgs + (d * rows + r) * RNN_GW;
        const i64 dg_at = (((i64)RNN_L * RNN_T + t) * RNN_B + b) * RNN_D * RNN_GW + (i64)d * RNN_GW;
        for (int k = threadIdx.x; k < RNN_P; k += blockDim.x) {
            acc_t v = dh[k] + dseq[r * RNN_F + d * RNN_P + k];
            dht[k] = v;
#if RNN_PROJ
            dg[4 * RNN_H + k] = v;
#endif
        }
        __syncthreads();
        // The gradient of the cell's output before the projection (LSTMP), else dht itself.
#if RNN_PROJ
        for (int j = threadIdx.x; j < RNN_H; j += blockDim.x) {
            acc_t v = 0;
            for (int k = 0; k < RNN_P; ++k) v += (acc_t)LD_W(weights, AT1(tweights, WR_OFF(d) + (i64)k * RNN_H + j)) * dht[k];
            dhh[j] = v;
        }
        __syncthreads();
        const acc_t* dhv = dhh;
#else
        const acc_t* dhv = dht;
#endif
#define DHH(j) dhv[j]
        for (int j = threadIdx.x; j < RNN_H; j += blockDim.x) {
            // The forward's saved values and the state before the step (LSTM: its cell; GRU: h).
            acc_t v[5], prev = 0, g[4];
            for (int q = 0; q < RNN_NSAVED; ++q) v[q] = REC(t, q * RNN_H + j);
#if RNN_MODE == 2
            if (tp >= 0) {
                prev = REC(tp, 4 * RNN_H + j);
            } else {
#if HAS_CX
                prev = (acc_t)LD_CX(cx, rnn_state_off(tcx, pl, b, j));
#endif
            }
            acc_t& carry = dc[j];
#elif RNN_MODE == 3
            if (tp >= 0) {
                prev = (acc_t)LD_RES(reserve, AT1(treserve, RES_OUT + ((i64)tp * RNN_B + b) * RNN_F + d * RNN_P + j));
            } else {
#if HAS_HX
                prev = (acc_t)LD_HX(hx, rnn_state_off(thx, pl, b, j));
#endif
            }
            acc_t& carry = gz[j];
#else
            acc_t carry = 0;
#endif
            rnn_cell_backward(v, prev, DHH(j), carry, g, (acc_t)clip_lower, (acc_t)clip_upper);
            for (int q = 0; q < (RNN_MODE >= 2 ? 4 : 1); ++q) dg[q * RNN_H + j] = g[q];
        }
#undef DHH
        __syncthreads();
#if HAS_DG
        for (int w = threadIdx.x; w < RNN_GW; w += blockDim.x) ST_DG(dgates, AT1(tdgates, dg_at + w), (double)dg[w]);
#endif
        // dh of the step before: the recurrent matrices' transposes times the gates' gradients
        // (GRU's n gate through R_n h + bR_n), plus GRU's direct path z * dh.
        for (int k = threadIdx.x; k < RNN_P; k += blockDim.x) {
            acc_t v = gz[k];
            for (int j = 0; j < RNN_GH; ++j) {
                acc_t gj = (RNN_MODE == 3 && j >= 2 * RNN_H) ? dg[RNN_H + j] : dg[j];
                v += (acc_t)LD_W(weights, AT1(tweights, R_OFF(d) + (i64)j * RNN_P + k)) * gj;
            }
            dh[k] = v;
        }
        __syncthreads();
    }
#if HAS_DHX
    for (int k = threadIdx.x; k < RNN_P; k += blockDim.x) ST_DHX(dhx, rnn_state_off(tdhx, pl, b, k), (double)dh[k]);
#endif
#if HAS_DCX
    for (int j = threadIdx.x; j < RNN_H; j += blockDim.x) ST_DCX(dcx, rnn_state_off(tdcx, pl, b, j), (double)dc[j]);
#endif
}
#undef REC
