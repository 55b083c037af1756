// Scaled dot-product attention, forward and backward, in double, for the generic fallback
// (fallback/sdpa.rs); after philox.cuh. Follows engine::cpu::sdpa literally (masks, padding,
// ALiBi, dropout, paging, empty rows).
//
// Kernels (SD_KERNEL):
// - SD_FORWARD: one thread per query row (b, h, i): a pass over the keys for the row max, one
//   for the sum of exp(s - max), one accumulating o (the sink token, with SD_HAS_SINK, starts
//   the max and the sum); writes o and stats (when SD_HAS_STATS: ST_O, ST_STATS), the max and
//   the sum (when SD_HAS_SMAX / SD_HAS_SSUM: ST_SMAX, ST_SSUM), and the row's dropout mask, 1
//   kept and 0 dropped (when SD_HAS_DUMP: ST_DUMP).
// - SD_ROW_D: one thread per query row: D_i = do_i . o_i into `dbuf`.
// - SD_DQ: one thread per query row: the dq row (ST_DQ).
// - SD_KEY_GRAD: one thread per dk (SD_GRAD_K) or dv row of width SD_G (a logical key, or a pool
//   row with paging: PT_PAGES pages per batch): loops over the SD_GROUP_G query heads that read
//   its K (or V) head and their queries (ST_GRAD).
// - SD_DBIAS: one thread per bias element, summing dS over the broadcast dims (ST_DB).
// - SD_DSINK: one thread per query head: dsink_h = -sum over batches and rows of
//   exp(sink_h - stats) D (ST_DSINK).
//
// The instantiation also defines the sizes SD_B, SD_HQ, SD_HK, SD_HV, SD_SQ, SD_SKV, SD_D,
// SD_DV, SD_GROUP_K and SD_GROUP_V (query heads per K head and per V head); the attributes SD_CAUSAL, SD_BOTTOM_RIGHT,
// SD_HAS_SWL / SD_SWL, SD_HAS_SWR / SD_SWR (sliding windows), SD_HAS_BIAS, SD_PADDING, SD_ALIBI
// (with SD_SLOPES(X), a list of X(head, slope)), SD_DROPOUT, SD_PAGED,
// SD_BACKWARD, SD_HAS_SINK; and the loads LD_Q, LD_K, LD_V, LD_BIAS, LD_SLQ, LD_SLKV, LD_PTK,
// LD_PTV, LD_SINK, LD_O, LD_DO, LD_STATS, LD_SEED, LD_OFFSET of the tensors present; SD_RAGGED(X), the list
// X(index, load) of the ragged tensors (index SD_RG_Q ... SD_RG_DV, with `rg<index>_p` / `rg<index>_s`
// parameters: their offsets and its stride), empty when none is. The attention scale and the
// dropout's probability and keep scale 1/(1-p) are the kernel's double parameters `sd_scale`,
// `sd_dropout_p` and `sd_dropout_keep` (values a user may change between executes).

#define SD_FORWARD 0
#define SD_ROW_D 1
#define SD_DQ 2
#define SD_KEY_GRAD 3
#define SD_DBIAS 4
#define SD_DSINK 5

// The tensors that may be ragged (packed sequences: batch bi starts at element offsets[bi]), by
// their places in graph::ops::sdpa::RAGGED_PORTS.
#define SD_RG_Q 0
#define SD_RG_K 1
#define SD_RG_V 2
#define SD_RG_O 3
#define SD_RG_ST 4
#define SD_RG_SMAX 5
#define SD_RG_SSUM 6
#define SD_RG_DO 7
#define SD_RG_DQ 8
#define SD_RG_DK 9
#define SD_RG_DV 10
#define SD_RG_N 11

#define SD_NEG_INF (-1.0/0.0)
#define SD_DA (SD_D > 0 ? SD_D : 1)
#define SD_DVA (SD_DV > 0 ? SD_DV : 1)
#define SD_ROWS (SD_B * SD_HQ * SD_SQ)

// What every kernel reads: the tensors present (pointer and layout), the attention scale and the
// dropout's seed, offset, probability and keep scale.
struct Att {
    const void* q; TRef tq;
    const void* k; TRef tk;
    const void* v; TRef tv;
#if SD_HAS_BIAS
    const void* bias; TRef tb;
#endif
#if SD_PADDING
    const void* slq; TRef tslq;
    const void* slkv; TRef tslkv;
#endif
    double scale;
    // The ragged tensors' offsets and their strides, by SD_RG_* index.
    const void* rg[SD_RG_N];
    i64 rgs[SD_RG_N];
#if SD_DROPOUT
    u64 seed; u64 offset;
    double dropout_p; double dropout_keep;
#endif
#if SD_PAGED
    const void* ptk; TRef tptk;
    const void* ptv; TRef tptv;
#endif
#if SD_HAS_SINK
    const void* sink; TRef tsink;
#endif
#if SD_BACKWARD
    const void* o; TRef to;
    const void* dout; TRef tdo;
    const void* st; TRef tst;
#endif
};

// The kernel's Att, from its parameters (the tensors' `<field>_p` and `<tref>_r`).
#if SD_HAS_BIAS
#define SD_INIT_BIAS \
    A.bias = bias_p; \
    A.tb = tb_r;
#else
#define SD_INIT_BIAS
#endif
#if SD_PADDING
#define SD_INIT_PADDING \
    A.slq = slq_p;      \
    A.tslq = tslq_r;    \
    A.slkv = slkv_p;    \
    A.tslkv = tslkv_r;
#else
#define SD_INIT_PADDING
#endif
#if SD_PAGED
#define SD_INIT_PAGED \
    A.ptk = ptk_p;    \
    A.tptk = tptk_r;  \
    A.ptv = ptv_p;    \
    A.tptv = tptv_r;
#else
#define SD_INIT_PAGED
#endif
#if SD_HAS_SINK
#define SD_INIT_SINK \
    A.sink = sink_p; \
    A.tsink = tsink_r;
#else
#define SD_INIT_SINK
#endif
#if SD_BACKWARD
#define SD_INIT_BACKWARD \
    A.o = o_p;           \
    A.to = to_r;         \
    A.dout = dout_p;     \
    A.tdo = tdo_r;       \
    A.st = st_p;         \
    A.tst = tst_r;
#else
#define SD_INIT_BACKWARD
#endif
// By-value seeds live in the plan's constant buffer: read through the pointer too.
#if SD_DROPOUT
#define SD_INIT_DROPOUT                              \
    A.seed = fd_seed_bits(LD_SEED(seed_p, 0));       \
    A.offset = fd_seed_bits(LD_OFFSET(offset_p, 0)); \
    A.dropout_p = sd_dropout_p;                      \
    A.dropout_keep = sd_dropout_keep;
#else
#define SD_INIT_DROPOUT
#endif
#define SD_RG_INIT(i, ld) \
    A.rg[i] = rg##i##_p;  \
    A.rgs[i] = rg##i##_s;
#define SD_INIT         \
    Att A;              \
    A.q = q_p;          \
    A.tq = tq_r;        \
    A.k = k_p;          \
    A.tk = tk_r;        \
    A.v = v_p;          \
    A.tv = tv_r;        \
    A.scale = sd_scale; \
    SD_INIT_BIAS        \
    SD_INIT_PADDING     \
    SD_INIT_PAGED       \
    SD_INIT_SINK        \
    SD_INIT_BACKWARD    \
    SD_INIT_DROPOUT     \
    SD_RAGGED(SD_RG_INIT)

// Per-batch lengths (clamped to [0, s]: the CPU rejects others, a kernel must not index past).
__device__ __forceinline__ void sd_lens(const Att& A, i64 bi, i64* lq, i64* lkv) {
#if SD_PADDING
    double x = LD_SLQ(A.slq, bi * A.tslq.strides[0]);
    double y = LD_SLKV(A.slkv, bi * A.tslkv.strides[0]);
    *lq = (i64)fmin(fmax(x, 0.0), (double)SD_SQ);
    *lkv = (i64)fmin(fmax(y, 0.0), (double)SD_SKV);
#else
    (void)A; (void)bi;
    *lq = SD_SQ;
    *lkv = SD_SKV;
#endif
}

// Where batch bi of tensor `which` (SD_RG_*) starts: at its ragged offset when it is ragged,
// else at bi * s0 (its batch stride). `which` is a constant at every call, so this folds.
#define SD_RG_START(i, ld) \
    case i: return (i64)ld(A.rg[i], bi * A.rgs[i]);
__device__ __forceinline__ i64 sd_start(const Att& A, int which, i64 bi, i64 s0) {
    switch (which) {
        SD_RAGGED(SD_RG_START)
        default: return bi * s0;
    }
}

// Whether row `i` of batch bi's `len` rows of tensor `which` has memory: a ragged tensor holds
// only the rows of its batch's length (padded rows are neither read nor written).
#define SD_RG_IS(i, ld) \
    case i: return true;
__device__ __forceinline__ bool sd_ragged(int which) {
    switch (which) {
        SD_RAGGED(SD_RG_IS)
        default: return false;
    }
}
__device__ __forceinline__ bool sd_has_row(int which, i64 i, i64 len) { return !sd_ragged(which) || i < len; }

// Whether key j is visible from (unpadded) query row i.
__device__ __forceinline__ bool sd_visible(i64 i, i64 j, i64 lq, i64 lkv) {
    if (j >= lkv) return false;
#if SD_BOTTOM_RIGHT
    i64 diag = i + lkv - lq;
#else
    i64 diag = i; (void)lq;
#endif
#if SD_CAUSAL
    if (j > diag) return false;
#endif
#if SD_HAS_SWL
    if (j < diag - (i64)SD_SWL) return false;
#endif
#if SD_HAS_SWR
    if (j > diag + (i64)SD_SWR) return false;
#endif
    (void)diag;
    return true;
}

// Offset of element (key t, channel 0) of kv head kh of batch bi in K / V, through the page
// tables when paged; -1 for a page entry outside the pool (the CPU rejects those).
__device__ __forceinline__ i64 sd_krow(const Att& A, i64 bi, i64 kh, i64 t) {
#if SD_PAGED
    i64 bs = A.tk.dims[2];
    double e = LD_PTK(A.ptk, bi * A.tptk.strides[0] + (t / bs) * A.tptk.strides[2]);
    if (!(e >= 0.0 && e < (double)A.tk.dims[0])) return -1;
    return (i64)e * A.tk.strides[0] + kh * A.tk.strides[1] + (t % bs) * A.tk.strides[2];
#else
    return sd_start(A, SD_RG_K, bi, A.tk.strides[0]) + kh * A.tk.strides[1] + t * A.tk.strides[2];
#endif
}
__device__ __forceinline__ i64 sd_vrow(const Att& A, i64 bi, i64 kh, i64 t) {
#if SD_PAGED
    i64 bs = A.tv.dims[2];
    double e = LD_PTV(A.ptv, bi * A.tptv.strides[0] + (t / bs) * A.tptv.strides[2]);
    if (!(e >= 0.0 && e < (double)A.tv.dims[0])) return -1;
    return (i64)e * A.tv.strides[0] + kh * A.tv.strides[1] + (t % bs) * A.tv.strides[2];
#else
    return sd_start(A, SD_RG_V, bi, A.tv.strides[0]) + kh * A.tv.strides[1] + t * A.tv.strides[2];
#endif
}
__device__ __forceinline__ double sd_k(const Att& A, i64 row, i64 c) { return row < 0 ? 0.0 : LD_K(A.k, row + c * A.tk.strides[3]); }
__device__ __forceinline__ double sd_v(const Att& A, i64 row, i64 c) { return row < 0 ? 0.0 : LD_V(A.v, row + c * A.tv.strides[3]); }
__device__ __forceinline__ i64 sd_qrow(const Att& A, i64 bi, i64 h, i64 i) {
    return sd_start(A, SD_RG_Q, bi, A.tq.strides[0]) + h * A.tq.strides[1] + i * A.tq.strides[2];
}

#if SD_ALIBI
// The ALiBi slope of query head h.
#define SD_SLOPE_CASE(head, slope) \
    case head: return slope;
__device__ __forceinline__ double sd_slope(i64 h) {
    switch ((int)h) {
        SD_SLOPES(SD_SLOPE_CASE)
        default: return 0.0;
    }
}
#endif

// The score from the dot product q_i . k_j: scaled, plus bias and ALiBi.
__device__ __forceinline__ double sd_score(const Att& A, i64 bi, i64 h, i64 i, i64 j, double dot) {
    double s = A.scale * dot;
#if SD_HAS_BIAS
    const TRef& tb = A.tb;
    i64 boff = (tb.dims[0] == 1 ? 0 : bi) * tb.strides[0] + (tb.dims[1] == 1 ? 0 : h) * tb.strides[1]
             + (tb.dims[2] == 1 ? 0 : i) * tb.strides[2] + (tb.dims[3] == 1 ? 0 : j) * tb.strides[3];
    s += LD_BIAS(A.bias, boff);
#endif
#if SD_ALIBI
    s += sd_slope(h) * ((double)j - (double)i);
#endif
    (void)A; (void)bi; (void)h; (void)i; (void)j;
    return s;
}

// The sink logit of query head h: a key with no value in every row's softmax (-inf without a
// sink, which adds nothing).
__device__ __forceinline__ double sd_sink(const Att& A, i64 h) {
#if SD_HAS_SINK
    return LD_SINK(A.sink, h * A.tsink.strides[1]);
#else
    (void)A; (void)h;
    return SD_NEG_INF;
#endif
}

// The dropout factor of score element (bi, h, i, j): 0 or 1/(1-p) (1 without dropout).
__device__ __forceinline__ double sd_keep(const Att& A, i64 bi, i64 h, i64 i, i64 j) {
#if SD_DROPOUT
    u64 idx = (u64)((((bi * SD_HQ + h) * SD_SQ + i) * SD_SKV) + j);
    return fd_philox_uniform(A.seed, A.offset, idx) >= A.dropout_p ? A.dropout_keep : 0.0;
#else
    (void)A; (void)bi; (void)h; (void)i; (void)j;
    return 1.0;
#endif
}

#if SD_BACKWARD
__device__ __forceinline__ double sd_do(const Att& A, i64 bi, i64 h, i64 i, i64 c) {
    return LD_DO(A.dout, sd_start(A, SD_RG_DO, bi, A.tdo.strides[0]) + h * A.tdo.strides[1] + i * A.tdo.strides[2] + c * A.tdo.strides[3]);
}
__device__ __forceinline__ double sd_stats(const Att& A, i64 bi, i64 h, i64 i) {
    return LD_STATS(A.st, sd_start(A, SD_RG_ST, bi, A.tst.strides[0]) + h * A.tst.strides[1] + i * A.tst.strides[2]);
}
#endif

#if SD_KERNEL == SD_FORWARD

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    SD_INIT
    GRID_STRIDE(r, (i64)SD_ROWS) {
        i64 i = r % SD_SQ;
        i64 h = (r / SD_SQ) % SD_HQ;
        i64 bi = r / (SD_SQ * SD_HQ);
        i64 kh = h / SD_GROUP_K;
        i64 vh = h / SD_GROUP_V;
        i64 lq, lkv;
        sd_lens(A, bi, &lq, &lkv);
        double acc[SD_DVA];
        for (int c = 0; c < SD_DV; ++c) acc[c] = 0.0;
        double lse = SD_NEG_INF;
        // The softmax's max and sum of exp(s - max) (the sink included): -inf and 0 for a row
        // with nothing in its softmax.
        double smax = SD_NEG_INF;
        double ssum = 0.0;
        if (i < lq) {
            double qv[SD_DA];
            i64 qo = sd_qrow(A, bi, h, i);
            for (int c = 0; c < SD_D; ++c) qv[c] = LD_Q(A.q, qo + c * A.tq.strides[3]);
            // Pass 1: the row max (from the sink's logit, when there is one).
            double m = sd_sink(A, h);
            for (i64 j = 0; j < SD_SKV; ++j) {
                if (!sd_visible(i, j, lq, lkv)) continue;
                i64 kr = sd_krow(A, bi, kh, j);
                double dot = 0.0;
                for (int c = 0; c < SD_D; ++c) dot += qv[c] * sd_k(A, kr, c);
                double s = sd_score(A, bi, h, i, j, dot);
                m = fmax(m, s);
            }
            if (m != SD_NEG_INF) {
                // Pass 2: the sum of exp(s - m) (masked keys add exp(-inf) = 0), from the sink's
                // term.
                double sum = exp(sd_sink(A, h) - m);
                for (i64 j = 0; j < SD_SKV; ++j) {
                    double s = SD_NEG_INF;
                    if (sd_visible(i, j, lq, lkv)) {
                        i64 kr = sd_krow(A, bi, kh, j);
                        double dot = 0.0;
                        for (int c = 0; c < SD_D; ++c) dot += qv[c] * sd_k(A, kr, c);
                        s = sd_score(A, bi, h, i, j, dot);
                    }
                    sum += exp(s - m);
                }
                lse = m + log(sum);
                smax = m;
                ssum = sum;
                // Pass 3: o = sum_j (e_j / sum * keep_j) v_j.
                for (i64 j = 0; j < SD_SKV; ++j) {
                    double s = SD_NEG_INF;
                    if (sd_visible(i, j, lq, lkv)) {
                        i64 kr = sd_krow(A, bi, kh, j);
                        double dot = 0.0;
                        for (int c = 0; c < SD_D; ++c) dot += qv[c] * sd_k(A, kr, c);
                        s = sd_score(A, bi, h, i, j, dot);
                    }
                    double w = exp(s - m) / sum * sd_keep(A, bi, h, i, j);
                    if (w == 0.0) continue;
                    i64 vr = sd_vrow(A, bi, vh, j);
                    for (int c = 0; c < SD_DV; ++c) acc[c] += w * sd_v(A, vr, c);
                }
            }
        }
        if (sd_has_row(SD_RG_O, i, lq)) {
            i64 oo = sd_start(A, SD_RG_O, bi, to_.strides[0]) + h * to_.strides[1] + i * to_.strides[2];
            for (int c = 0; c < SD_DV; ++c) ST_O(o_, oo + c * to_.strides[3], acc[c]);
        }
#if SD_HAS_STATS
        if (sd_has_row(SD_RG_ST, i, lq)) {
            ST_STATS(stats_, sd_start(A, SD_RG_ST, bi, tstats_.strides[0]) + h * tstats_.strides[1] + i * tstats_.strides[2], lse);
        }
#endif
#if SD_HAS_SMAX
        if (sd_has_row(SD_RG_SMAX, i, lq)) {
            ST_SMAX(smax_, sd_start(A, SD_RG_SMAX, bi, tsmax_.strides[0]) + h * tsmax_.strides[1] + i * tsmax_.strides[2], smax);
        }
#endif
#if SD_HAS_SSUM
        if (sd_has_row(SD_RG_SSUM, i, lq)) {
            ST_SSUM(ssum_, sd_start(A, SD_RG_SSUM, bi, tssum_.strides[0]) + h * tssum_.strides[1] + i * tssum_.strides[2], ssum);
        }
#endif
#if SD_HAS_DUMP
        i64 mo = bi * tdump_.strides[0] + h * tdump_.strides[1] + i * tdump_.strides[2];
        for (i64 j = 0; j < SD_SKV; ++j) ST_DUMP(dump_, mo + j * tdump_.strides[3], sd_keep(A, bi, h, i, j) != 0.0 ? 1.0 : 0.0);
#endif
        (void)lse; (void)smax; (void)ssum;
    }
}

#elif SD_KERNEL == SD_ROW_D

// D_i = do_i . o_i per query row, into scratch.
extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    SD_INIT
    double* dbuf = (double*)dbuf_;
    GRID_STRIDE(r, (i64)SD_ROWS) {
        i64 i = r % SD_SQ;
        i64 h = (r / SD_SQ) % SD_HQ;
        i64 bi = r / (SD_SQ * SD_HQ);
        i64 lq, lkv;
        sd_lens(A, bi, &lq, &lkv);
        double d = 0.0;
        if (sd_has_row(SD_RG_O, i, lq) && sd_has_row(SD_RG_DO, i, lq)) {
            i64 oo = sd_start(A, SD_RG_O, bi, A.to.strides[0]) + h * A.to.strides[1] + i * A.to.strides[2];
            for (int c = 0; c < SD_DV; ++c) d += sd_do(A, bi, h, i, c) * LD_O(A.o, oo + c * A.to.strides[3]);
        }
        dbuf[r] = d;
    }
}

#elif SD_KERNEL == SD_DQ

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    SD_INIT
    const double* dbuf = (const double*)dbuf_;
    GRID_STRIDE(r, (i64)SD_ROWS) {
        i64 i = r % SD_SQ;
        i64 h = (r / SD_SQ) % SD_HQ;
        i64 bi = r / (SD_SQ * SD_HQ);
        i64 kh = h / SD_GROUP_K;
        i64 vh = h / SD_GROUP_V;
        i64 lq, lkv;
        sd_lens(A, bi, &lq, &lkv);
        double acc[SD_DA];
        for (int c = 0; c < SD_D; ++c) acc[c] = 0.0;
        if (i < lq) {
            double qv[SD_DA];
            double dov[SD_DVA];
            i64 qo = sd_qrow(A, bi, h, i);
            for (int c = 0; c < SD_D; ++c) qv[c] = LD_Q(A.q, qo + c * A.tq.strides[3]);
            for (int c = 0; c < SD_DV; ++c) dov[c] = sd_do(A, bi, h, i, c);
            double lse = sd_stats(A, bi, h, i);
            double big_d = dbuf[r];
            for (i64 j = 0; j < SD_SKV; ++j) {
                if (!sd_visible(i, j, lq, lkv)) continue;
                i64 kr = sd_krow(A, bi, kh, j);
                double dot = 0.0;
                for (int c = 0; c < SD_D; ++c) dot += qv[c] * sd_k(A, kr, c);
                double s = sd_score(A, bi, h, i, j, dot);
                if (s == SD_NEG_INF) continue;
                double p = exp(s - lse);
                if (p == 0.0) continue;
                i64 vr = sd_vrow(A, bi, vh, j);
                double dpv = 0.0;
                for (int c = 0; c < SD_DV; ++c) dpv += dov[c] * sd_v(A, vr, c);
                double dp = sd_keep(A, bi, h, i, j) * dpv;
                double dsc = p * (dp - big_d) * A.scale;
                for (int c = 0; c < SD_D; ++c) acc[c] += dsc * sd_k(A, kr, c);
            }
        }
        if (sd_has_row(SD_RG_DQ, i, lq)) {
            i64 oo = sd_start(A, SD_RG_DQ, bi, tdq_.strides[0]) + h * tdq_.strides[1] + i * tdq_.strides[2];
            for (int c = 0; c < SD_D; ++c) ST_DQ(dq_, oo + c * tdq_.strides[3], acc[c]);
        }
    }
}

#elif SD_KERNEL == SD_KEY_GRAD

#define SD_GA (SD_G > 0 ? SD_G : 1)
#if SD_GRAD_K
#define SD_RG_GRAD SD_RG_DK
#else
#define SD_RG_GRAD SD_RG_DV
#endif

// The dk or dv contribution of logical key t of batch bi (K head, or V head, gh), added to `acc`
// after being summed on its own (the CPU sums each logical key, then adds it into the pool).
__device__ __forceinline__ void sd_key_grad(const Att& A, const double* dbuf, i64 bi, i64 gh, i64 t, double* acc) {
    i64 lq, lkv;
    sd_lens(A, bi, &lq, &lkv);
    double tmp[SD_GA];
    for (int c = 0; c < SD_G; ++c) tmp[c] = 0.0;
    for (i64 hg = 0; hg < SD_GROUP_G; ++hg) {
        i64 h = gh * SD_GROUP_G + hg;
        // The K and V rows query head h reads (the group's own head is one of them).
        i64 kr = sd_krow(A, bi, h / SD_GROUP_K, t);
        i64 vr = sd_vrow(A, bi, h / SD_GROUP_V, t);
        for (i64 i = 0; i < lq; ++i) {
            if (!sd_visible(i, t, lq, lkv)) continue;
            i64 qo = sd_qrow(A, bi, h, i);
            double dot = 0.0;
            for (int c = 0; c < SD_D; ++c) dot += LD_Q(A.q, qo + c * A.tq.strides[3]) * sd_k(A, kr, c);
            double s = sd_score(A, bi, h, i, t, dot);
            if (s == SD_NEG_INF) continue;
            double p = exp(s - sd_stats(A, bi, h, i));
            if (p == 0.0) continue;
            double keep = sd_keep(A, bi, h, i, t);
#if SD_GRAD_K
            double dpv = 0.0;
            for (int c = 0; c < SD_DV; ++c) dpv += sd_do(A, bi, h, i, c) * sd_v(A, vr, c);
            double dp = keep * dpv;
            double dsc = p * (dp - dbuf[(bi * SD_HQ + h) * SD_SQ + i]) * A.scale;
            for (int c = 0; c < SD_D; ++c) tmp[c] += dsc * LD_Q(A.q, qo + c * A.tq.strides[3]);
#else
            double pk = p * keep;
            for (int c = 0; c < SD_DV; ++c) tmp[c] += pk * sd_do(A, bi, h, i, c);
#endif
        }
        (void)vr;
    }
    (void)dbuf;
    for (int c = 0; c < SD_G; ++c) acc[c] += tmp[c];
}

#if SD_PAGED
#if SD_GRAD_K
#define PT_PTR A.ptk
#define PT_REF A.tptk
#define LD_PT LD_PTK
#else
#define PT_PTR A.ptv
#define PT_REF A.tptv
#define LD_PT LD_PTV
#endif
#endif

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    SD_INIT
    const double* dbuf = (const double*)dbuf_;
    const TRef& tg = tgrad_;
    // Rows of the output: (batch or block, kv head, key or block row).
    i64 rows = tg.dims[0] * tg.dims[1] * tg.dims[2];
    GRID_STRIDE(r, rows) {
        i64 t = r % tg.dims[2];
        i64 kh = (r / tg.dims[2]) % tg.dims[1];
        i64 bo = r / (tg.dims[2] * tg.dims[1]);
        double acc[SD_GA];
        for (int c = 0; c < SD_G; ++c) acc[c] = 0.0;
#if SD_PAGED
        // bo is a pool block, t a row in it: every (batch, page) whose table entry is bo.
        for (i64 bi = 0; bi < SD_B; ++bi) {
            i64 lq, lkv;
            sd_lens(A, bi, &lq, &lkv);
            for (i64 p = 0; p < PT_PAGES; ++p) {
                if (p * tg.dims[2] >= lkv) continue;
                double e = LD_PT(PT_PTR, bi * PT_REF.strides[0] + p * PT_REF.strides[2]);
                if (!(e >= 0.0 && e < (double)tg.dims[0]) || (i64)e != bo) continue;
                sd_key_grad(A, dbuf, bi, kh, p * tg.dims[2] + t, acc);
            }
        }
        i64 go = bo * tg.strides[0] + kh * tg.strides[1] + t * tg.strides[2];
#else
        sd_key_grad(A, dbuf, bo, kh, t, acc);
        i64 lq, lkv;
        sd_lens(A, bo, &lq, &lkv);
        if (!sd_has_row(SD_RG_GRAD, t, lkv)) continue;
        i64 go = sd_start(A, SD_RG_GRAD, bo, tg.strides[0]) + kh * tg.strides[1] + t * tg.strides[2];
#endif
        for (int c = 0; c < SD_G; ++c) ST_GRAD(grad_, go + c * tg.strides[3], acc[c]);
    }
}

#elif SD_KERNEL == SD_DBIAS

__device__ __forceinline__ double sd_ds(const Att& A, const double* dbuf, i64 bi, i64 h, i64 i, i64 j, i64 lq, i64 lkv) {
    if (i >= lq || !sd_visible(i, j, lq, lkv)) return 0.0;
    i64 kh = h / SD_GROUP_K;
    i64 qo = sd_qrow(A, bi, h, i);
    i64 kr = sd_krow(A, bi, kh, j);
    double dot = 0.0;
    for (int c = 0; c < SD_D; ++c) dot += LD_Q(A.q, qo + c * A.tq.strides[3]) * sd_k(A, kr, c);
    double s = sd_score(A, bi, h, i, j, dot);
    if (s == SD_NEG_INF) return 0.0;
    double p = exp(s - sd_stats(A, bi, h, i));
    if (p == 0.0) return 0.0;
    i64 vr = sd_vrow(A, bi, h / SD_GROUP_V, j);
    double dpv = 0.0;
    for (int c = 0; c < SD_DV; ++c) dpv += sd_do(A, bi, h, i, c) * sd_v(A, vr, c);
    double dp = sd_keep(A, bi, h, i, j) * dpv;
    return p * (dp - dbuf[(bi * SD_HQ + h) * SD_SQ + i]);
}

extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    SD_INIT
    const double* dbuf = (const double*)dbuf_;
    const TRef& tg = tdb_;
    GRID_STRIDE(e, numel(tg)) {
        i64 idx[8];
        unravel(tg, e, idx);
        bool bb = tg.dims[0] == 1, bh = tg.dims[1] == 1, bq = tg.dims[2] == 1, bk = tg.dims[3] == 1;
        double sum = 0.0;
        for (i64 bi = bb ? 0 : idx[0]; bi < (bb ? SD_B : idx[0] + 1); ++bi) {
            i64 lq, lkv;
            sd_lens(A, bi, &lq, &lkv);
            for (i64 h = bh ? 0 : idx[1]; h < (bh ? SD_HQ : idx[1] + 1); ++h)
                for (i64 i = bq ? 0 : idx[2]; i < (bq ? SD_SQ : idx[2] + 1); ++i)
                    for (i64 j = bk ? 0 : idx[3]; j < (bk ? SD_SKV : idx[3] + 1); ++j)
                        sum += sd_ds(A, dbuf, bi, h, i, j, lq, lkv);
        }
        ST_DB(db_, offset_at(tg, idx), sum);
    }
}

#elif SD_KERNEL == SD_DSINK

// dsink_h = -sum over batches and rows of exp(sink_h - stats) D, in the CPU's order; padded rows
// and rows whose stats is -inf (nothing in their softmax) add nothing.
extern "C" __global__ void KERNEL_NAME(KERNEL_PARAMS) {
    pdl_site();
    SD_INIT
    const double* dbuf = (const double*)dbuf_;
    GRID_STRIDE(h, (i64)SD_HQ) {
        double t = sd_sink(A, h);
        double sum = 0.0;
        for (i64 bi = 0; bi < SD_B; ++bi) {
            i64 lq, lkv;
            sd_lens(A, bi, &lq, &lkv);
            for (i64 i = 0; i < lq; ++i) {
                double lse = sd_stats(A, bi, h, i);
                if (lse == SD_NEG_INF) continue;
                sum += exp(t - lse) * dbuf[(bi * SD_HQ + h) * SD_SQ + i];
            }
        }
        ST_DSINK(dsink_, h * tdsink_.strides[1], -sum);
    }
}

#endif
