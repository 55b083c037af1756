// The persistent backward recurrence of one layer (rnn/persist_bwd.rs): every step of the
// sequence, against the direction's order, in one launch. Block (j, d, z) owns hidden units
// [j * PU, (j + 1) * PU) of direction d for samples [z * BP, (z + 1) * BP) and keeps their columns of the recurrent matrix R (every
// gate's rows, as rows of R^T) in shared memory for the whole sequence. Each step it takes the
// gate gradients of the step after (`dgr`, every unit's, through the exchange buffer in `gb_all`
// that all the direction's blocks write), multiplies them with its columns of R on the tensor
// cores (persist_common.cuh's product) into the gradient of its units' h, adds the gradient from
// above (`dseq`: dy, or the layer above's input gradient), runs the cell's backward for its units
// (LSTM's dc and GRU's z * dh stay in shared memory, in f32) and writes its units' gate gradients
// into the exchange buffer; then the direction's blocks meet at a grid barrier (a counter in
// `bar_all`). After the barrier's arrival, off the other blocks' path, it writes the gate
// gradients to the `dgates` tensor and the input-side ones, in the sequence type, to `dgx`
// ([T * B][DGP], every direction's gates side by side: the A operand of the input gradient's
// GEMM). Each sample's own steps run in its order; one more product after its last gives dhx.
// The grid (NB x NBB blocks per direction) is at most the SM count, so every block is resident.
//
// The exchanged vector of a sample is R's row space: entry g * H + j is the gradient of gate g's
// recurrent product for unit j (GRU's n gate: of R_n h + bR_n, i.e. dn * r).
//
// After persist_common.cuh (its PP is GK here, PN the units rounded up to 16, BP the block's
// samples rounded up to 16). The instantiation
// defines, besides common.cuh's, persist_common.cuh's and the layer's (R_OFF, RES_STATES,
// RES_OUT, CLIP, HAS_HX, HAS_CX, HAS_DHY, HAS_DCY, HAS_DHX, HAS_DCX, HAS_LEN, the ports' loads
// and stores):
//   PU, NB, NBB   units per block, blocks along the units and along the batch per direction
//   XB            the exchange buffer's rows (NBB * BP)
//   DGP           the row stride of `dgx` (D * G * H rounded up to 8)
//   LAYER_HB, LAYER_BAR  the layer's exchange buffers and counters in `gb_all` and `bar_all`

// Values the cell's backward reads of a (step, sample, unit), prefetched before the barrier.
#if RNN_MODE == 2
#define PB_NPRE 7  // i, f, g, o, c, the cell before, the gradient from above
#elif RNN_MODE == 3
#define PB_NPRE 6  // r, z, n, R_n h + bR_n, h before, the gradient from above
#else
#define PB_NPRE 2  // the activation, the gradient from above
#endif
// Gate-gradient records of a (step, sample, unit) in dgates: G, and GRU's fourth.
#define PB_NDG (RNN_MODE == 3 ? 4 : RNN_G)

extern "C" __global__ void __launch_bounds__(PR_THREADS, 1) KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    extern __shared__ __align__(16) unsigned char pr_smem[];
    SEQ_T* rw = (SEQ_T*)pr_smem;                                       // [PN][RS]: R's columns
    float* red = (float*)(pr_smem + (size_t)PN * RS * sizeof(SEQ_T));  // [WK][BP][PN]: products
    float* pre = red + (size_t)WK * BP * PN;                            // [BP * PU][PB_NPRE]
    float* dgs = pre + (size_t)BP * PU * PB_NPRE;                       // [BP * PU][4]: this step's
    float* dh0 = dgs + (size_t)BP * PU * 4;                             // [BP * PU]: dhy
    float* cs = dh0 + (size_t)BP * PU;                                  // [BP * PU]: LSTM's dc
    float* gzs = cs + (size_t)BP * PU;                                  // [BP * PU]: GRU's z * dh
    int* lens = (int*)(gzs + (size_t)BP * PU);                          // [RNN_B]

    const int blk = blockIdx.x, d = blockIdx.y, pl = RNN_L * RNN_D + d;
    // The block's samples: b0 + e / PU for its (sample, unit) pairs e < nbu.
    const int b0 = blockIdx.z * BP, nbu = (RNN_B - b0 < BP ? RNN_B - b0 : BP) * PU;
    const int tid = threadIdx.x;
    SEQ_T* gb0 = gb_all + LAYER_HB + (size_t)d * 2 * XB * PP;
    int* counter = bar_all + LAYER_BAR + d;

    // rw[u][q] = R[rw_col(q)][blk * PU + u]: the block's units' columns, zero past H and GH.
    for (int i = tid; i < PN * RS; i += PR_THREADS) {
        const int u = i / RS, j = blk * PU + u;
        const int q = i % RS < PP ? rw_col(i % RS) : PP;
        float v = 0.0f;
        if (u < PU && j < RNN_H && q < RNN_GH) v = (float)LD_W(weights, AT1(tweights, R_OFF(d) + (i64)q * RNN_P + j));
        rw[i] = pr_seq(v);
    }
    int steps = 0;
    for (int b = 0; b < RNN_B; ++b) {
        const int l = rnn_len(meta, b);
        if (tid == 0) lens[b] = l;
        steps = l > steps ? l : steps;
    }
    for (int e = tid; e < nbu; e += PR_THREADS) {
        const int b = b0 + e / PU, j = blk * PU + e % PU;
        float h0 = 0.0f, c0 = 0.0f;
        if (j < RNN_H) {
#if HAS_DHY
            h0 = (float)LD_DHY(dhy, rnn_state_off(tdhy, pl, b, j));
#endif
#if HAS_DCY
            c0 = (float)LD_DCY(dcy, rnn_state_off(tdcy, pl, b, j));
#endif
        }
        dh0[e] = h0;
        cs[e] = c0;
        gzs[e] = 0.0f;
    }
#if HAS_LEN
    // Steps past a sample's length: zero gate gradients (the GEMM's rows and the dgates tensor).
    for (int b = b0; b < b0 + nbu / PU; ++b) {
        const int len = rnn_len(meta, b);
        for (int e = tid; e < (RNN_T - len) * PU; e += PR_THREADS) {
            const int t = len + e / PU, j = blk * PU + e % PU;
            if (j >= RNN_H) continue;
            const i64 r = (i64)t * RNN_B + b;
            for (int g = 0; g < RNN_G; ++g) dgx[r * DGP + (i64)d * RNN_GH + g * RNN_H + j] = pr_seq(0.0f);
#if HAS_DGATES
            const i64 at = (((i64)RNN_L * RNN_T + t) * RNN_B + b) * RNN_D * RNN_GW + (i64)d * RNN_GW;
            for (int g = 0; g < PB_NDG; ++g) ST_DGATES(dgates, AT1(tdgates, at + g * RNN_H + j), 0.0);
#endif
        }
    }
#endif
    __syncthreads();

    for (int i = 0; i <= steps; ++i) {
        // What the cell's backward reads of this step, independent of the other blocks.
        for (int e = tid; e < nbu; e += PR_THREADS) {
            const int b = b0 + e / PU, j = blk * PU + e % PU;
            if (j >= RNN_H || i >= lens[b]) continue;
            const int t = d == 0 ? lens[b] - 1 - i : i;
            const int tp = rnn_prev_step(d, t, lens[b]);
            const i64 r = (i64)t * RNN_B + b;
            const i64 rec = RES_STATES + (r * RNN_D + d) * RNN_SW;
            float* p = pre + (size_t)e * PB_NPRE;
#if RNN_MODE == 2
            for (int q = 0; q < 5; ++q) p[q] = (float)LD_RES(reserve, AT1(treserve, rec + q * RNN_H + j));
            float cp = 0.0f;
            if (tp >= 0) {
                cp = (float)LD_RES(reserve, AT1(treserve, RES_STATES + (((i64)tp * RNN_B + b) * RNN_D + d) * RNN_SW + 4 * RNN_H + j));
            } else {
#if HAS_CX
                cp = (float)LD_CX(cx, rnn_state_off(tcx, pl, b, j));
#endif
            }
            p[5] = cp;
#elif RNN_MODE == 3
            for (int q = 0; q < 4; ++q) p[q] = (float)LD_RES(reserve, AT1(treserve, rec + q * RNN_H + j));
            float hp = 0.0f;
            if (tp >= 0) {
                hp = (float)LD_RES(reserve, AT1(treserve, RES_OUT + ((i64)tp * RNN_B + b) * RNN_F + d * RNN_P + j));
            } else {
#if HAS_HX
                hp = (float)LD_HX(hx, rnn_state_off(thx, pl, b, j));
#endif
            }
            p[4] = hp;
#else
            p[0] = (float)LD_RES(reserve, AT1(treserve, rec + j));
#endif
            p[PB_NPRE - 1] = dseq[r * RNN_F + d * RNN_P + j];
        }
        if (i > 0) {
            pr_wait(counter, i * NB * NBB);
            // R^T dgr of the step after, for the block's samples.
            pr_products(gb0 + ((size_t)((i + 1) & 1) * XB + b0) * PP, nbu / PU, rw, red);
        }
        __syncthreads();
        SEQ_T* gn = gb0 + (size_t)(i & 1) * XB * PP;
        for (int e = tid; e < nbu; e += PR_THREADS) {
            const int bl = e / PU, b = b0 + bl, u = e % PU, j = blk * PU + u;
            if (j >= RNN_H || i > lens[b]) continue;
            // The gradient of the state this step produced, through the steps after.
            float dh = dh0[e];
            if (i > 0) {
                dh = gzs[e];
#pragma unroll
                for (int w = 0; w < WK; ++w) dh += red[((size_t)w * BP + bl) * PN + u];
            }
            if (i == lens[b]) {
                // The sample's steps are done: dh and dc are the initial state's.
#if HAS_DHX
                ST_DHX(dhx, rnn_state_off(tdhx, pl, b, j), (double)dh);
#endif
#if HAS_DCX
                ST_DCX(dcx, rnn_state_off(tdcx, pl, b, j), (double)cs[e]);
#endif
                continue;
            }
            const float* p = pre + (size_t)e * PB_NPRE;
            dh += p[PB_NPRE - 1];
            float* dg = dgs + (size_t)e * 4;
#if RNN_MODE == 2
            float& carry = cs[e];
#elif RNN_MODE == 3
            float& carry = gzs[e];
#else
            float carry = 0.0f;
#endif
            rnn_cell_backward(p, p[RNN_NSAVED], dh, carry, dg, (float)clip_lower, (float)clip_upper);
#if RNN_MODE == 3
            // The exchanged gradients: r, z and n's through R_n h + bR_n.
            gn[(size_t)b * PP + j] = pr_seq(dg[0]);
            gn[(size_t)b * PP + RNN_H + j] = pr_seq(dg[1]);
            gn[(size_t)b * PP + 2 * RNN_H + j] = pr_seq(dg[3]);
#else
#pragma unroll
            for (int g = 0; g < RNN_G; ++g) gn[(size_t)b * PP + g * RNN_H + j] = pr_seq(dg[g]);
#endif
        }
        if (i == steps) break;
        pr_arrive(counter);
        // The step's gate gradients, while the other blocks finish it.
        for (int e = tid; e < nbu; e += PR_THREADS) {
            const int b = b0 + e / PU, j = blk * PU + e % PU;
            if (j >= RNN_H || i >= lens[b]) continue;
            const int t = d == 0 ? lens[b] - 1 - i : i;
            const i64 r = (i64)t * RNN_B + b;
            const float* dg = dgs + (size_t)e * 4;
            for (int g = 0; g < RNN_G; ++g) dgx[r * DGP + (i64)d * RNN_GH + g * RNN_H + j] = pr_seq(dg[g]);
#if HAS_DGATES
            const i64 at = (((i64)RNN_L * RNN_T + t) * RNN_B + b) * RNN_D * RNN_GW + (i64)d * RNN_GW;
            for (int g = 0; g < PB_NDG; ++g) ST_DGATES(dgates, AT1(tdgates, at + g * RNN_H + j), (double)dg[g]);
#endif
        }
    }
}
