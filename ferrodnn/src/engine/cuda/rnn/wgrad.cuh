// The weight gradients of one layer, every matrix and bias of both directions in one launch,
// one thread per weight summing over the T * B rows (a GEMM with K = T * B; the tiled engine is
// the next step), added to dw:
//   W_g[j, k] += sum dgate_j * in[k]; R_g[j, k] += sum dgate'_j * h_prev[k] (GRU's n gate by
//   the gradient of R_n h + bR_n); W_r[k, j] += sum dh_k * (o tanh c)_j (LSTMP);
//   bW_j += sum dgate_j; bR_j += sum dgate'_j.
// The layer's input is x at layer 0, else the layer below's output (times its dropout factors)
// from the reserve; h_prev is the direction's previous output (the reserve) or hx.
//
// The instantiation defines RNN_L, RNN_IN, LAYER0, W_OFF(d), R_OFF(d), WR_OFF(d), BW_OFF(d),
// BR_OFF(d), RES_STATES, RES_OUT, RES_OUT_PREV, RES_MASK_PREV (-1: none), HAS_HX, and the
// loads and stores of the ports.

// dgates of (step t, sample b, direction d), entry w.
#define DGT(t, b, d, w) ((acc_t)LD_DG(dgates, AT1(tdgates, (((i64)RNN_L * RNN_T + (t)) * RNN_B + (b)) * RNN_D * RNN_GW + (i64)(d) * RNN_GW + (w))))
// The gradient that meets the recurrent matrices' row j.
#define DGR(t, b, d, j) ((RNN_MODE == 3 && (j) >= 2 * RNN_H) ? DGT(t, b, d, RNN_H + (j)) : DGT(t, b, d, j))

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    const i64 n_w = (i64)RNN_GH * RNN_IN, n_r = (i64)RNN_GH * RNN_P, n_p = RNN_PROJ ? (i64)RNN_P * RNN_H : 0;
    const i64 per_dir = n_w + n_r + n_p + 2 * RNN_GH;
    const i64 n = per_dir * RNN_D;
    // The layer's input at (t, b), feature k.
    auto input = [&](int t, int b, int k) -> acc_t {
#if LAYER0
        i64 row = rnn_row(meta, t, b);
        return (acc_t)LD_X(x, rnn_seq_off(tx, t, b, row, k));
#else
        i64 r = (i64)t * RNN_B + b;
        acc_t v = (acc_t)LD_RES(reserve, AT1(treserve, RES_OUT_PREV + r * RNN_F + k));
        if (RES_MASK_PREV >= 0) v *= (acc_t)LD_RES(reserve, AT1(treserve, RES_MASK_PREV + r * RNN_F + k));
        return v;
#endif
    };
    GRID_STRIDE(i, n) {
        const int d = (int)(i / per_dir);
        i64 e = i % per_dir;
        const int pl = RNN_L * RNN_D + d;
        acc_t acc = 0;
        i64 dst = -1;
        if (e < n_w) {
            int j = (int)(e / RNN_IN), k = (int)(e % RNN_IN);
            for (int b = 0; b < RNN_B; ++b)
                for (int t = 0; t < rnn_len(meta, b); ++t) acc += DGT(t, b, d, j) * input(t, b, k);
            dst = W_OFF(d) + e;
        } else if ((e -= n_w) < n_r) {
            int j = (int)(e / RNN_P), k = (int)(e % RNN_P);
            for (int b = 0; b < RNN_B; ++b) {
                const int len = rnn_len(meta, b);
                for (int t = 0; t < len; ++t) {
                    int tp = rnn_prev_step(d, t, len);
                    acc_t hp;
                    if (tp >= 0) {
                        hp = (acc_t)LD_RES(reserve, AT1(treserve, RES_OUT + ((i64)tp * RNN_B + b) * RNN_F + d * RNN_P + k));
                    } else {
#if HAS_HX
                        hp = (acc_t)LD_HX(hx, rnn_state_off(thx, pl, b, k));
#else
                        hp = 0;
#endif
                    }
                    acc += DGR(t, b, d, j) * hp;
                }
            }
            dst = R_OFF(d) + e;
        } else if ((e -= n_r) < n_p) {
            int k = (int)(e / RNN_H), j = (int)(e % RNN_H);
            for (int b = 0; b < RNN_B; ++b)
                for (int t = 0; t < rnn_len(meta, b); ++t) {
                    const i64 rec = RES_STATES + (((i64)t * RNN_B + b) * RNN_D + d) * RNN_SW;
                    acc_t o = (acc_t)LD_RES(reserve, AT1(treserve, rec + 3 * RNN_H + j));
                    acc_t c = (acc_t)LD_RES(reserve, AT1(treserve, rec + 4 * RNN_H + j));
                    acc += DGT(t, b, d, 4 * RNN_H + k) * o * ACC_TANH(c);
                }
            dst = WR_OFF(d) + e;
        } else {
            e -= n_p;
            const bool rec = e >= RNN_GH;
            const int j = (int)(rec ? e - RNN_GH : e);
            const i64 off = rec ? BR_OFF(d) : BW_OFF(d);
            if (off < 0) continue;
            for (int b = 0; b < RNN_B; ++b)
                for (int t = 0; t < rnn_len(meta, b); ++t) acc += rec ? DGR(t, b, d, j) : DGT(t, b, d, j);
            dst = off + j;
        }
        double prev = LD_DW(dw, AT1(tdw, dst));
        ST_DW(dw, AT1(tdw, dst), prev + (double)acc);
    }
}
#undef DGR
#undef DGT
