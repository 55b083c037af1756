// The gradient of the last layer's output, from dy, as dense rows of the scratch `dseq` (0 past
// each sample's length). The instantiation defines LD_DY.

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    const i64 n = (i64)RNN_T * RNN_B * RNN_F;
    GRID_STRIDE(i, n) {
        int k = (int)(i % RNN_F);
        i64 r = i / RNN_F;
        int t = (int)(r / RNN_B), b = (int)(r % RNN_B);
        i64 row = rnn_row(meta, t, b);
        dseq[i] = row < 0 ? (acc_t)0 : (acc_t)LD_DY(dy, rnn_seq_off(tdy, t, b, row, k));
    }
}
