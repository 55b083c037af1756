// After a layer's recurrence: below the last layer, its output (dropout applied in training,
// the factors kept in the reserve) becomes the next layer's input `si`; the last layer's output
// is written to y (whose padding the fill kernel wrote before).
//
// The instantiation defines RNN_L, LAST, DROPOUT (with RES_MASK, LD_SEED, LD_OFFSET), ST_Y,
// ST_RES.

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
#if DROPOUT
    const u64 seed = fd_seed_bits(LD_SEED(seed_p, 0));
    const u64 offs = fd_seed_bits(LD_OFFSET(offset_p, 0));
#endif
    const i64 n = (i64)RNN_T * RNN_B * RNN_F;
    GRID_STRIDE(i, n) {
        int k = (int)(i % RNN_F);
        i64 r = i / RNN_F;
        int t = (int)(r / RNN_B), b = (int)(r % RNN_B);
        i64 row = rnn_row(meta, t, b);
        if (row < 0) continue;
        acc_t v = so[i];
#if LAST
        ST_Y(y, rnn_seq_off(ty, t, b, row, k), (double)v);
#else
#if DROPOUT
        double u = fd_philox_uniform(seed, offs, (u64)(((i64)RNN_L * RNN_T + t) * RNN_B + b) * RNN_F + k);
        double m = u >= drop_p ? 1.0 / (1.0 - drop_p) : 0.0;
        ST_RES(reserve, AT1(treserve, RES_MASK + i), m);
        v = v * (acc_t)m;
#endif
        si[i] = v;
#endif
    }
}
