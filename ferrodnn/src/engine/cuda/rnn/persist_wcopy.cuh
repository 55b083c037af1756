// Every direction's input matrix W of one layer copied into scratch for its projection GEMM
// (rnn/persist.rs): wc[d * G * H + n][k] = W_d[n][k] for k < RNN_IN, 0 up to the padded row KP.
// The instantiation defines the layer's W_OFF(d) and RNN_IN, KP and SEQ_T.

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    GRID_STRIDE(i, (i64)RNN_D * RNN_GH * KP) {
        const i64 row = i / KP, k = i % KP;
        const int d = (int)(row / RNN_GH);
        const i64 n = row % RNN_GH;
        double v = 0.0;
        if (k < RNN_IN) v = LD_W(weights, AT1(tweights, W_OFF(d) + n * RNN_IN + k));
        wc[i] = (SEQ_T)(float)v;
    }
}
