// The input projection of one layer for every step at once (a GEMM over the T * B rows):
// gx[d][t * B + b][j] = sum_k W_d[j, k] in[t, b, k] + bW_d[j] + bR_d[j] (bR of GRU's n gate
// excluded: it sits inside r * (R_n h + bR_n)). Rows past a sample's length are skipped.
// One thread per output element for now (the tiled GEMM engine is the next step).
//
// The instantiation defines RNN_L (the layer), RNN_IN (its input size), LAYER0 (input from x,
// else from the scratch `si`), W_OFF(d), BW_OFF(d), BR_OFF(d) (-1: no bias), LD_X, LD_W.

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    const i64 rows = (i64)RNN_T * RNN_B;
    const i64 n = (i64)RNN_D * rows * RNN_GH;
    GRID_STRIDE(i, n) {
        int j = (int)(i % RNN_GH);
        i64 r = (i / RNN_GH) % rows;
        int d = (int)(i / (RNN_GH * rows));
        int t = (int)(r / RNN_B), b = (int)(r % RNN_B);
        i64 row = rnn_row(meta, t, b);
        if (row < 0) continue;
        acc_t acc = 0;
        const i64 w0 = W_OFF(d) + (i64)j * RNN_IN;
        for (int k = 0; k < RNN_IN; ++k) {
#if LAYER0
            acc_t v = (acc_t)LD_X(x, rnn_seq_off(tx, t, b, row, k));
#else
            acc_t v = si[r * RNN_F + k];
#endif
            acc += (acc_t)LD_W(weights, AT1(tweights, w0 + k)) * v;
        }
        if (BW_OFF(d) >= 0) acc += (acc_t)LD_W(weights, AT1(tweights, BW_OFF(d) + j));
        if (BR_OFF(d) >= 0 && !(RNN_MODE == 3 && j >= 2 * RNN_H)) acc += (acc_t)LD_W(weights, AT1(tweights, BR_OFF(d) + j));
        gx[(d * rows + r) * RNN_GH + j] = acc;
    }
}
