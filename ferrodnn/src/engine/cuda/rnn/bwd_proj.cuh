// The gradient of one layer's input for every step at once (a GEMM over the T * B rows):
// din[t * B + b][k] = sum_d sum_j dg_d[t * B + b][j] W_d[j, k] (GRU's n gate by its own
// gradient). Below layer 0 it goes back through the dropout factors into `dseq`, the next
// (lower) layer's output gradient; at layer 0 it is dx (whose padding the fill kernel wrote).
//
// The instantiation defines RNN_L, RNN_IN, LAYER0 (with ST_DX), RES_MASK_PREV (-1: none),
// W_OFF(d), LD_W, LD_RES.

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    const i64 rows = (i64)RNN_T * RNN_B;
    const i64 n = rows * RNN_IN;
    GRID_STRIDE(i, n) {
        int k = (int)(i % RNN_IN);
        i64 r = i / RNN_IN;
        int t = (int)(r / RNN_B), b = (int)(r % RNN_B);
        i64 row = rnn_row(meta, t, b);
        if (row < 0) {
#if !LAYER0
            dseq[i] = 0;
#endif
            continue;
        }
        acc_t acc = 0;
        for (int d = 0; d < RNN_D; ++d) {
            const acc_t* dg = dgs + (d * rows + r) * RNN_GW;
            for (int j = 0; j < RNN_GH; ++j) acc += dg[j] * (acc_t)LD_W(weights, AT1(tweights, W_OFF(d) + (i64)j * RNN_IN + k));
        }
#if LAYER0
        ST_DX(dx, rnn_seq_off(tdx, t, b, row, k), (double)acc);
#else
        if (RES_MASK_PREV >= 0) acc *= (acc_t)LD_RES(reserve, AT1(treserve, RES_MASK_PREV + i));
        dseq[i] = acc;
#endif
    }
}
