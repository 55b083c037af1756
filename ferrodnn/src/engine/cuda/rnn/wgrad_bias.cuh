// The bias gradients of one layer, added to dw: bW_j += sum dgate_j, bR_j += sum dgate'_j (GRU's
// n gate by the gradient of R_n h + bR_n) over each sample's valid steps, one thread per bias
// element of each direction.
//
// The instantiation defines RNN_L, BW_OFF(d), BR_OFF(d) (-1: none), LD_DG, LD_DW, ST_DW.

#define WB_DG(t, b, d, w) ((acc_t)LD_DG(dgates, AT1(tdgates, (((i64)RNN_L * RNN_T + (t)) * RNN_B + (b)) * RNN_D * RNN_GW + (i64)(d) * RNN_GW + (w))))

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    const i64 n = (i64)RNN_D * 2 * RNN_GH;
    GRID_STRIDE(i, n) {
        const int d = (int)(i / (2 * RNN_GH));
        const bool rec = (i / RNN_GH) % 2 == 1;
        const int j = (int)(i % RNN_GH);
        const i64 off = rec ? BR_OFF(d) : BW_OFF(d);
        if (off < 0) continue;
        const int w = (rec && RNN_MODE == 3 && j >= 2 * RNN_H) ? RNN_H + j : j;
        acc_t acc = 0;
        for (int b = 0; b < RNN_B; ++b)
            for (int t = 0; t < rnn_len(meta, b); ++t) acc += WB_DG(t, b, d, w);
        ST_DW(dw, AT1(tdw, off + j), LD_DW(dw, AT1(tdw, off + j)) + (double)acc);
    }
}
