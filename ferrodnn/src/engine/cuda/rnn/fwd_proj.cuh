// The input projection of one layer for every step at once, a GEMM over the T * B rows for
// each direction d (z): gx[d][t * B + b][j] = sum_k in[t, b, k] W_d[j, k] + bW_d[j] + bR_d[j]
// (bR of GRU's n gate excluded: it sits inside r * (R_n h + bR_n)). Rows past a sample's length
// read as 0 and are not stored. Before gemm_tile.cuh.
//
// The instantiation defines RNN_L, RNN_IN, LAYER0 (input from x, else from the scratch `si`),
// W_OFF(d), BW_OFF(d), BR_OFF(d) (-1: no bias), LD_X, LD_W.

#define GEMM_M(z) ((i64)RNN_T * RNN_B)
#define GEMM_N(z) ((i64)RNN_GH)
#define GEMM_K(z) ((i64)RNN_IN)
#define A_K_FAST 1
#define B_K_FAST 1
#define GEMM_SETUP

// Layer input (row r = t * B + b, feature k); 0 past the sample's length.
__device__ __forceinline__ acc_t fp_input(const int* meta, const void* x, const TRef& tx, const acc_t* si, i64 r, i64 k) {
    const int t = (int)(r / RNN_B), b = (int)(r % RNN_B);
    const i64 row = rnn_row(meta, t, b);
    if (row < 0) return 0;
#if LAYER0
    return (acc_t)LD_X(x, rnn_seq_off(tx, t, b, row, k));
#else
    return si[r * RNN_F + k];
#endif
}

#if LAYER0
#define A_AT(z, m, k) fp_input(meta, x, tx, nullptr, m, k)
#else
#define A_AT(z, m, k) fp_input(meta, nullptr, TRef{}, si, m, k)
#endif
#define B_AT(z, k, n) LD_W(weights, AT1(tweights, W_OFF(z) + (n) * RNN_IN + (k)))

__device__ __forceinline__ acc_t fp_bias(const void* weights, const TRef& tweights, int d, i64 j) {
    acc_t v = 0;
    if (BW_OFF(d) >= 0) v += (acc_t)LD_W(weights, AT1(tweights, BW_OFF(d) + j));
    if (BR_OFF(d) >= 0 && !(RNN_MODE == 3 && j >= 2 * RNN_H)) v += (acc_t)LD_W(weights, AT1(tweights, BR_OFF(d) + j));
    return v;
}

#define C_PUT(z, m, n, v)                                                                          \
    do {                                                                                           \
        if (rnn_row(meta, (int)((m) / RNN_B), (int)((m) % RNN_B)) >= 0)                            \
            gx[((i64)(z) * RNN_T * RNN_B + (m)) * RNN_GH + (n)] = (v) + fp_bias(weights, tweights, z, n); \
    } while (0)
