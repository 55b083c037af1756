// The weight-matrix gradients of one layer, added to dw: per direction d, GEMMs over the T * B
// rows (z = 3 d + kind):
//   kind 0: W_g[j, k] += sum dgate_j in[k]  (the layer's input: x at layer 0, else the layer
//           below's output times its dropout factors, from the reserve);
//   kind 1: R_g[j, k] += sum dgate'_j h_prev[k]  (GRU's n gate by the gradient of R_n h + bR_n;
//           h_prev the direction's previous output from the reserve, or hx);
//   kind 2: W_r[k, j] += sum dh_k (o tanh c)_j  (LSTMP).
// Rows past a sample's length read as 0. Each weight is one thread's, so the read-add-store
// into dw is safe. Before gemm_tile.cuh.
//
// The instantiation defines RNN_L, RNN_IN, LAYER0, W_OFF(d), R_OFF(d), WR_OFF(d), RES_STATES,
// RES_OUT, RES_OUT_PREV, RES_MASK_PREV (-1: none), HAS_HX, and the loads and stores.

#define WG_KIND(z) ((z) % 3)
#define WG_DIR(z) ((z) / 3)
#define GEMM_M(z) (WG_KIND(z) == 2 ? (RNN_PROJ ? (i64)RNN_P : 0) : (i64)RNN_GH)
#define GEMM_N(z) (WG_KIND(z) == 0 ? (i64)RNN_IN : WG_KIND(z) == 1 ? (i64)RNN_P : (i64)RNN_H)
#define GEMM_K(z) ((i64)RNN_T * RNN_B)
#define A_K_FAST 0
#define B_K_FAST 0
#define GEMM_SETUP

// dgates of row r = t * B + b, direction d, entry w (0 past the sample's length).
#define WG_DG(r, d, w) ((acc_t)LD_DG(dgates, AT1(tdgates, ((i64)RNN_L * RNN_T * RNN_B + (r)) * RNN_D * RNN_GW + (i64)(d) * RNN_GW + (w))))

__device__ __forceinline__ bool wg_valid(const int* meta, i64 r) { return (int)(r / RNN_B) < rnn_len(meta, (int)(r % RNN_B)); }

#define A_AT(z, m, r) (wg_valid(meta, r) ? wg_a(dgates, tdgates, z, m, r) : (acc_t)0)
#define B_AT(z, r, n) (wg_valid(meta, r) ? wg_b(meta, x, tx, hx_p, thx_r, reserve, treserve, z, r, n) : (acc_t)0)

__device__ __forceinline__ acc_t wg_a(const void* dgates, const TRef& tdgates, int z, i64 m, i64 r) {
    const int d = WG_DIR(z);
    switch (WG_KIND(z)) {
        case 0: return WG_DG(r, d, m);
        case 1: return (RNN_MODE == 3 && m >= 2 * RNN_H) ? WG_DG(r, d, RNN_H + m) : WG_DG(r, d, m);
        default: return WG_DG(r, d, 4 * RNN_H + m);
    }
}

__device__ __forceinline__ acc_t wg_b(const int* meta, const void* x, const TRef& tx, const void* hx, const TRef& thx, const void* reserve, const TRef& treserve, int z, i64 r, i64 n) {
    const int d = WG_DIR(z), t = (int)(r / RNN_B), b = (int)(r % RNN_B);
    if (WG_KIND(z) == 0) {
#if LAYER0
        return (acc_t)LD_X(x, rnn_seq_off(tx, t, b, rnn_row(meta, t, b), n));
#else
        acc_t v = (acc_t)LD_RES(reserve, AT1(treserve, RES_OUT_PREV + r * RNN_F + n));
        if (RES_MASK_PREV >= 0) v *= (acc_t)LD_RES(reserve, AT1(treserve, RES_MASK_PREV + r * RNN_F + n));
        return v;
#endif
    }
    if (WG_KIND(z) == 1) {
        const int tp = rnn_prev_step(d, t, rnn_len(meta, b));
        if (tp >= 0) return (acc_t)LD_RES(reserve, AT1(treserve, RES_OUT + ((i64)tp * RNN_B + b) * RNN_F + d * RNN_P + n));
#if HAS_HX
        return (acc_t)LD_HX(hx, rnn_state_off(thx, RNN_L * RNN_D + d, b, (int)n));
#else
        return 0;
#endif
    }
    const i64 rec = RES_STATES + (r * RNN_D + d) * RNN_SW;
    const acc_t o = (acc_t)LD_RES(reserve, AT1(treserve, rec + 3 * RNN_H + n));
    const acc_t c = (acc_t)LD_RES(reserve, AT1(treserve, rec + 4 * RNN_H + n));
    return o * ACC_TANH(c);
}

#if HAS_HX
#define hx_p hx
#define thx_r thx
#else
#define hx_p nullptr
#define thx_r TRef{}
#endif

#define C_PUT(z, m, n, v)                                                                                   \
    do {                                                                                                    \
        const int d_ = WG_DIR(z), k_ = WG_KIND(z);                                                          \
        const i64 dst_ = (k_ == 0 ? W_OFF(d_) : k_ == 1 ? R_OFF(d_) : WR_OFF(d_)) + (m) * GEMM_N(z) + (n); \
        ST_DW(dw, AT1(tdw, dst_), LD_DW(dw, AT1(tdw, dst_)) + (double)(v));                                 \
    } while (0)
