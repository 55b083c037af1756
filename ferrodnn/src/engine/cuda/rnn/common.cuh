// Shared by every RNN kernel (rnn/mod.rs): the accumulator type, the activations, and where a
// (step, sample) lives in a sequence tensor. After philox.cuh.
//
// The instantiation defines:
//   ACC_DOUBLE         1: accumulate in double (f64 compute, and the generic fallback's plan);
//                      0: in float
//   RNN_T, RNN_B       max_seq_length, batch
//   RNN_D, RNN_H, RNN_P, RNN_G   directions, hidden size, projected (state) size, gates
//   RNN_MODE           0 relu, 1 tanh, 2 lstm, 3 gru
//   RNN_PROJ           1: LSTM with a recurrent projection
//   RNN_LAYOUT         0 seq_major_unpacked [T, B, f], 1 seq_major_packed [T * B, f],
//                      2 batch_major_unpacked [B, T, f]
//   RNN_F              D * P, the features of a layer's output
//   RNN_GW             the dgates record of a (step, sample, direction)
//   RNN_SW             the reserve's state record of a (step, sample, direction)

#if ACC_DOUBLE
typedef double acc_t;
#define ACC_EXP(v) exp(v)
#define ACC_TANH(v) tanh(v)
#else
typedef float acc_t;
#define ACC_EXP(v) __expf(v)
#define ACC_TANH(v) tanhf(v)
#endif

#define RNN_GH (RNN_G * RNN_H)
// Values the forward saves of a unit for the backward (rnn_cell_backward's `v`).
#define RNN_NSAVED (RNN_MODE == 2 ? 5 : (RNN_MODE == 3 ? 4 : 1))

__device__ __forceinline__ acc_t rnn_sigmoid(acc_t v) { return (acc_t)1 / ((acc_t)1 + ACC_EXP(-v)); }

// The scratch `meta` (written by meta.cuh): lens[B] (each sample's length, clamped to [0, T]
// and, packed, to the length before it: the CPU refuses other values, a kernel must not index
// past), then rows[T + 1] (packed: where each step's rows start).
__device__ __forceinline__ int rnn_len(const int* meta, int b) { return meta[b]; }

// The row of (step t, sample b) in a sequence tensor, or -1 past the sample's length.
__device__ __forceinline__ i64 rnn_row(const int* meta, int t, int b) {
    if (t >= meta[b]) return -1;
#if RNN_LAYOUT == 0
    return (i64)t * RNN_B + b;
#elif RNN_LAYOUT == 1
    return (i64)meta[RNN_B + t] + b;
#else
    return (i64)b * RNN_T + t;
#endif
}

// The offset of feature k of (step t, sample b, row `row`) in a sequence tensor `tr`.
__device__ __forceinline__ i64 rnn_seq_off(const TRef& tr, int t, int b, i64 row, i64 k) {
#if RNN_LAYOUT == 0
    return (i64)t * tr.strides[0] + (i64)b * tr.strides[1] + k * tr.strides[2];
#elif RNN_LAYOUT == 1
    return row * tr.strides[0] + k * tr.strides[1];
#else
    return (i64)b * tr.strides[0] + (i64)t * tr.strides[1] + k * tr.strides[2];
#endif
}

// The offset of element [pl, b, k] of a state tensor ([L * D, B, n]).
__device__ __forceinline__ i64 rnn_state_off(const TRef& tr, int pl, int b, int k) {
    return (i64)pl * tr.strides[0] + (i64)b * tr.strides[1] + (i64)k * tr.strides[2];
}

// Element i of a 1-D tensor.
#define AT1(tr, i) ((i64)(i) * (tr).strides[0])

// The step before t in direction d's order for a sample of length len, or -1 at its first.
__device__ __forceinline__ int rnn_prev_step(int d, int t, int len) {
    return d == 0 ? t - 1 : (t + 1 < len ? t + 1 : -1);
}

// LSTM's cell clipping: a NaN cell stays NaN under CLIP_NAN (else it becomes the lower bound);
// any other is clamped to [lower, upper]. The identity without CLIP.
template <typename T>
__device__ __forceinline__ T rnn_clip_cell(T cn, T lower, T upper) {
#if CLIP
    if (isnan(cn)) {
#if !CLIP_NAN
        cn = lower;
#endif
    } else {
        cn = cn < lower ? lower : (cn > upper ? upper : cn);
    }
#endif
    return cn;
}

// The cell's backward for one unit (RNN_MODE), shared by the standard and the persistent
// backward. `v`: what the forward saved for the unit (relu/tanh: y; LSTM: i, f, g, o, c; GRU: r,
// z, n, R_n h + bR_n); `prev`: the state before the step (LSTM: its cell, GRU: h; else unused);
// `dh`: the gradient of the unit's output. LSTM: `carry` holds the cell's gradient from the step
// after on entry and the step before's on return; GRU: the direct path z * dh on return; else
// unused. `dg`: the gates' gradients (GRU: r, z, n, then n's through R_n h + bR_n).
template <typename T>
__device__ __forceinline__ void rnn_cell_backward(const T* v, T prev, T dh, T& carry, T* dg, T clip_lower, T clip_upper) {
#if RNN_MODE == 0
    dg[0] = dh * (v[0] > (T)0 ? (T)1 : (T)0);
#elif RNN_MODE == 1
    dg[0] = dh * ((T)1 - v[0] * v[0]);
#elif RNN_MODE == 2
    const T gi = v[0], gf = v[1], gg = v[2], go = v[3], tc = ACC_TANH(v[4]);
    T dct = carry + dh * go * ((T)1 - tc * tc);
#if CLIP
    const T pre = gf * prev + gi * gg;
    if (!(pre >= clip_lower && pre <= clip_upper)) dct = (T)0;
#endif
    dg[0] = dct * gg * gi * ((T)1 - gi);
    dg[1] = dct * prev * gf * ((T)1 - gf);
    dg[2] = dct * gi * ((T)1 - gg * gg);
    dg[3] = dh * tc * go * ((T)1 - go);
    carry = dct * gf;
#else
    const T gr = v[0], zz = v[1], gn = v[2], hn = v[3];
    const T dn = dh * ((T)1 - zz) * ((T)1 - gn * gn);
    dg[0] = dn * hn * gr * ((T)1 - gr);
    dg[1] = dh * (prev - gn) * zz * ((T)1 - zz);
    dg[2] = dn;
    dg[3] = dn * gr;
    carry = dh * zz;
#endif
}
