// The gradient of one layer's input for every step at once, a GEMM over the T * B rows with both
// directions' gates as its depth: din[t * B + b][k] = sum_d sum_j dg_d[t * B + b][j] W_d[j, k].
// Below layer 0 it goes back through the dropout factors into `dseq`, the next (lower) layer's
// output gradient (0 past each length); at layer 0 it is dx (whose padding the fill kernel
// wrote). Before gemm_tile.cuh.
//
// The instantiation defines RNN_L, RNN_IN, LAYER0 (with ST_DX), RES_MASK_PREV (-1: none),
// W_OFF(d), LD_W, LD_RES.

#define GEMM_M(z) ((i64)RNN_T * RNN_B)
#define GEMM_N(z) ((i64)RNN_IN)
#define GEMM_K(z) ((i64)RNN_D * RNN_GH)
#define A_K_FAST 1
#define B_K_FAST 0
#define GEMM_SETUP

__device__ __forceinline__ bool bp_valid(const int* meta, i64 r) { return rnn_row(meta, (int)(r / RNN_B), (int)(r % RNN_B)) >= 0; }

#define A_AT(z, m, q) (bp_valid(meta, m) ? dgs[(((q) / RNN_GH) * (i64)RNN_T * RNN_B + (m)) * RNN_GW + (q) % RNN_GH] : (acc_t)0)
#define B_AT(z, q, n) LD_W(weights, AT1(tweights, W_OFF((int)((q) / RNN_GH)) + ((q) % RNN_GH) * RNN_IN + (n)))

#if LAYER0
#define C_PUT(z, m, n, v)                                                                          \
    do {                                                                                           \
        const int t_ = (int)((m) / RNN_B), b_ = (int)((m) % RNN_B);                                \
        const i64 row_ = rnn_row(meta, t_, b_);                                                    \
        if (row_ >= 0) ST_DX(dx, rnn_seq_off(tdx, t_, b_, row_, n), (double)(v));                 \
    } while (0)
#else
#define C_PUT(z, m, n, v)                                                                          \
    do {                                                                                           \
        acc_t v_ = (v);                                                                            \
        if (!bp_valid(meta, m)) v_ = 0;                                                            \
        else if (RES_MASK_PREV >= 0) v_ *= (acc_t)LD_RES(reserve, AT1(treserve, RES_MASK_PREV + (m) * RNN_F + (n))); \
        dseq[(m) * RNN_F + (n)] = v_;                                                              \
    } while (0)
#endif
