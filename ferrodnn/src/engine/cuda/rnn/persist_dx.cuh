// Layer 0's input gradient, from the GEMM's dense f32 rows in `dseq` ([T * B][RNN_IN], row
// t * B + b) into dx at each valid (step, sample)'s row, and the padding fill `pad` at the others
// of an unpacked layout (a packed dx's padding rows hold the fill written before:
// rnn/persist_bwd.rs). The instantiation defines ST_DX.

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    GRID_STRIDE(i, (i64)RNN_T * RNN_B * RNN_IN) {
        const i64 r = i / RNN_IN, k = i % RNN_IN;
        const int t = (int)(r / RNN_B), b = (int)(r % RNN_B);
        const i64 row = rnn_row(meta, t, b);
        if (row >= 0) {
            ST_DX(dx, rnn_seq_off(tdx, t, b, row, k), (double)dseq[i]);
        } else if (RNN_LAYOUT != 1) {
            ST_DX(dx, rnn_seq_off(tdx, t, b, row, k), pad);
        }
    }
}
