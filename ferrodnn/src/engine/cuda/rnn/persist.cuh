// The persistent recurrence of one layer (rnn/persist.rs): the whole sequence in one launch.
// Block (j, d) owns hidden units [j * PU, (j + 1) * PU) of direction d and keeps their rows of the
// recurrent matrix R (every gate's) in shared memory for the whole sequence; each step it takes
// the previous step's hidden state of every sample (its exchange buffer in `hb_all`, written by
// all the direction's blocks), multiplies it with its rows on the tensor cores (mma.sync m16n8k16, f32
// accumulators), adds the input projection `gx` (the layer's GEMM, launched before) and the
// biases, runs the gates and the cell of its units (c and h stay in shared memory, in f32), and
// writes its units' new h into the exchange buffer, the layer's output and the reserve; then the
// direction's blocks meet at a grid barrier (a counter in `bar_all`) before the next step. The grid
// (NB x NBB blocks per direction: block (j, d, z) takes samples [z * BP, (z + 1) * BP)) is at most
// the SM count, so every block is resident.
//
// After persist_common.cuh. The instantiation defines, besides common.cuh's, persist_common.cuh's
// and the layer's (R_OFF, BW_OFF, BR_OFF,
// RES_STATES, RES_OUT, LAYER0, LAST, TRAINING, CLIP, CLIP_NAN, the ports' loads and stores):
//   PU, PN        units per block, and its gate rows G * PU rounded up to 16
//   NB, NBB       blocks along the units and along the batch per direction
//   PP, BP        the state size P rounded up to 32, the block's samples rounded up to 16
//   XB            the exchange buffer's rows (NBB * BP; its shape [XB][PP])
//   WM, WK        warps along the batch (a power of 2) and along P (WM * WK = 16)
//   KPW           pairs of k steps (32 columns) per warp along P
//   GX_LD         the row stride of gx (D * G * H)
//   SEQ_T         the exchange and sequence buffers' element type (__half or __nv_bfloat16)
//   MMA_T         its mma type name ("f16" or "bf16")
//   FP            the row stride of the layer's output sequence buffer (not LAST)
//   LAYER_HB, LAYER_BAR  the layer's exchange buffers and counters in `hb_all` and `bar_all`

// The reserve's records of a (step, sample, unit): the activation; LSTM's gates and cell; GRU's
// gates and R_n h + bR_n.
#define PR_NREC (RNN_MODE == 2 ? 5 : (RNN_MODE == 3 ? 4 : 1))

extern "C" __global__ void __launch_bounds__(PR_THREADS, 1) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    extern __shared__ __align__(16) unsigned char pr_smem[];
    SEQ_T* rw = (SEQ_T*)pr_smem;                                   // [PN][RS]: the block's rows of R
    float* red = (float*)(pr_smem + (size_t)PN * RS * sizeof(SEQ_T));  // [WK][BP][PN]: products
    float* gxs = red + (size_t)WK * BP * PN;                        // [BP][PN]: this step's gx
    float* hs = gxs + (size_t)BP * PN;                              // [BP][PU]: h, then c
    float* cs = hs + (size_t)BP * PU;
    float* bias_x = cs + (size_t)BP * PU;                           // [PN]: biases added to gx
    float* bias_r = bias_x + PN;                                    // [PN]: GRU's b_hn (n gate)
    int* lens = (int*)(bias_r + PN);                                // [RNN_B]
    float* gs = (float*)(lens + RNN_B);                             // [BP * PU][G + 1]: gates (TRAINING)

    const int blk = blockIdx.x, d = blockIdx.y, pl = RNN_L * RNN_D + d;
    // The block's samples: b0 + e / PU for its (sample, unit) pairs e < nbu.
    const int b0 = blockIdx.z * BP, nbl = RNN_B - b0 < BP ? RNN_B - b0 : BP, nbu = nbl * PU;
    const int tid = threadIdx.x;
    // The layer's and direction's two exchange buffers and barrier counter.
    SEQ_T* hb0 = hb_all + LAYER_HB + (size_t)d * 2 * XB * PP;
    int* counter = bar_all + LAYER_BAR + d;

    // The block's gate rows: row n = g * PU + u is R's row g * H + blk * PU + u (zero past H).
    for (int i = tid; i < PN * RS; i += PR_THREADS) {
        const int n = i / RS, g = n / PU, u = n % PU, j = blk * PU + u;
        const int k = i % RS < PP ? rw_col(i % RS) : PP;
        float v = 0.0f;
        if (g < RNN_G && j < RNN_H && k < RNN_P) v = (float)LD_W(weights, AT1(tweights, R_OFF(d) + (i64)(g * RNN_H + j) * RNN_P + k));
        rw[i] = pr_seq(v);
    }
    for (int n = tid; n < PN; n += PR_THREADS) {
        const int g = n / PU, u = n % PU, j = blk * PU + u;
        float bx = 0.0f, br = 0.0f;
        if (g < RNN_G && j < RNN_H) {
            const int row = g * RNN_H + j;
            if (BW_OFF(d) >= 0) bx += (float)LD_W(weights, AT1(tweights, BW_OFF(d) + row));
            if (BR_OFF(d) >= 0) {
                const float v = (float)LD_W(weights, AT1(tweights, BR_OFF(d) + row));
                // GRU's recurrent bias of the n gate stays inside r * (R h + b_hn).
                if (RNN_MODE == 3 && g == 2) br = v; else bx += v;
            }
        }
        bias_x[n] = bx;
        bias_r[n] = br;
    }
    int steps = 0;
    for (int b = 0; b < RNN_B; ++b) {
        const int l = rnn_len(meta, b);
        if (tid == 0) lens[b] = l;
        steps = l > steps ? l : steps;
    }
    // The initial state of the block's units, into shared memory and the exchange buffer 1 (the
    // buffer step 0 reads).
    for (int i = tid; i < nbu; i += PR_THREADS) {
        const int b = b0 + i / PU, u = i % PU, j = blk * PU + u;
        float h0 = 0.0f, c0 = 0.0f;
        if (j < RNN_H) {
#if HAS_HX
            h0 = (float)LD_HX(hx, rnn_state_off(thx, pl, b, j));
#endif
#if HAS_CX
            c0 = (float)LD_CX(cx, rnn_state_off(tcx, pl, b, j));
#endif
            hb0[(size_t)XB * PP + (size_t)b * PP + j] = pr_seq(h0);
        }
        hs[i] = h0;
        cs[i] = c0;
    }
#if TRAINING && HAS_LEN
    // Steps past a sample's length: zero records in the reserve, as the backward reads them.
    for (int b = b0; b < b0 + nbl; ++b) {
        const int len = rnn_len(meta, b);
        for (int e = tid; e < (RNN_T - len) * PU; e += PR_THREADS) {
            const int t = len + e / PU, j = blk * PU + e % PU;
            if (j >= RNN_H) continue;
            const i64 r = (i64)t * RNN_B + b, rec_at = RES_STATES + (r * RNN_D + d) * RNN_SW;
            for (int q = 0; q < PR_NREC; ++q) ST_RES(reserve, AT1(treserve, rec_at + q * RNN_H + j), 0.0);
            ST_RES(reserve, AT1(treserve, RES_OUT + r * RNN_F + d * RNN_P + j), 0.0);
        }
    }
#endif
    pr_arrive(counter);

    for (int i = 0; i < steps; ++i) {
        // This step's input projection (independent of the other blocks): before the barrier.
        for (int e = tid; e < nbl * PN; e += PR_THREADS) {
            const int b = b0 + e / PN, n = e % PN, g = n / PU, u = n % PU, j = blk * PU + u;
            float v = 0.0f;
            if (i < lens[b] && g < RNN_G && j < RNN_H) {
                const int t = d == 0 ? i : lens[b] - 1 - i;
#if LAYER0
                const i64 r = rnn_row(meta, t, b);
#else
                const i64 r = (i64)t * RNN_B + b;
#endif
                v = gx[r * GX_LD + (i64)d * RNN_GH + g * RNN_H + j] + bias_x[n];
            }
            gxs[e] = v;
        }
        pr_wait(counter, (i + 1) * NB * NBB);
        // R h of the step before, for the block's samples.
        pr_products(hb0 + ((size_t)((i + 1) & 1) * XB + b0) * PP, nbl, rw, red);
        __syncthreads();
        SEQ_T* hn = hb0 + (size_t)(i & 1) * XB * PP;
        for (int e = tid; e < nbu; e += PR_THREADS) {
            const int bl = e / PU, b = b0 + bl, u = e % PU, j = blk * PU + u;
            if (j >= RNN_H) continue;
            if (i >= lens[b]) {
                // Past the sample's length its state stays; the exchange buffer still needs it.
                hn[(size_t)b * PP + j] = pr_seq(hs[e]);
                continue;
            }
            float pre[RNN_G], rec[RNN_G];
#pragma unroll
            for (int g = 0; g < RNN_G; ++g) {
                const int n = g * PU + u;
                float v = 0.0f;
#pragma unroll
                for (int w = 0; w < WK; ++w) v += red[((size_t)w * BP + bl) * PN + n];
                rec[g] = v + bias_r[n];
                pre[g] = gxs[bl * PN + n];
            }
            float hv;
            // The record the reserve keeps of this (step, sample, unit), written after the
            // barrier's arrival (other blocks wait only for the exchange buffer).
            float* rec_s = gs + (size_t)e * (RNN_G + 1);
#if RNN_MODE == 0 || RNN_MODE == 1
            hv = pre[0] + rec[0];
#if RNN_MODE == 0
            hv = hv > 0.0f ? hv : 0.0f;
#else
            hv = tanhf(hv);
#endif
            if (TRAINING) rec_s[0] = hv;
#elif RNN_MODE == 2
            const float gi = rnn_sigmoid(pre[0] + rec[0]);
            const float gf = rnn_sigmoid(pre[1] + rec[1]);
            const float gg = tanhf(pre[2] + rec[2]);
            const float go = rnn_sigmoid(pre[3] + rec[3]);
            float cn = gf * cs[e] + gi * gg;
            cn = rnn_clip_cell(cn, (float)clip_lower, (float)clip_upper);
            cs[e] = cn;
            hv = go * tanhf(cn);
            if (TRAINING) {
                rec_s[0] = gi;
                rec_s[1] = gf;
                rec_s[2] = gg;
                rec_s[3] = go;
                rec_s[4] = cn;
            }
#else
            const float gr = rnn_sigmoid(pre[0] + rec[0]);
            const float gz = rnn_sigmoid(pre[1] + rec[1]);
            const float gn = tanhf(pre[2] + gr * rec[2]);
            hv = (1.0f - gz) * gn + gz * hs[e];
            if (TRAINING) {
                rec_s[0] = gr;
                rec_s[1] = gz;
                rec_s[2] = gn;
                rec_s[3] = rec[2];
            }
#endif
            hs[e] = hv;
            hn[(size_t)b * PP + j] = pr_seq(hv);
        }
        pr_arrive(counter);
        // The step's outputs, while the other blocks finish it.
        for (int e = tid; e < nbu; e += PR_THREADS) {
            const int b = b0 + e / PU, u = e % PU, j = blk * PU + u;
            if (j >= RNN_H || i >= lens[b]) continue;
            const int t = d == 0 ? i : lens[b] - 1 - i;
            const i64 r = (i64)t * RNN_B + b;
            const float hv = hs[e];
#if LAST
            ST_Y(y, rnn_seq_off(ty, t, b, rnn_row(meta, t, b), (i64)d * RNN_P + j), (double)hv);
#else
            so[r * FP + (i64)d * RNN_P + j] = pr_seq(hv);
#endif
#if TRAINING
            const float* rec_s = gs + (size_t)e * (RNN_G + 1);
            const i64 rec_at = RES_STATES + (r * RNN_D + d) * RNN_SW;
            for (int q = 0; q < PR_NREC; ++q) ST_RES(reserve, AT1(treserve, rec_at + q * RNN_H + j), (double)rec_s[q]);
            ST_RES(reserve, AT1(treserve, RES_OUT + r * RNN_F + d * RNN_P + j), (double)hv);
#endif
        }
    }
    for (int e = tid; e < nbu; e += PR_THREADS) {
        const int b = b0 + e / PU, u = e % PU, j = blk * PU + u;
        if (j >= RNN_H) continue;
#if HAS_HY
        ST_HY(hy, rnn_state_off(thy, pl, b, j), (double)hs[e]);
#endif
#if HAS_CY
        ST_CY(cy, rnn_state_off(tcy, pl, b, j), (double)cs[e]);
#endif
    }
}
