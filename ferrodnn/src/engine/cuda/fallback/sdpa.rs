//! Scaled dot-product attention, forward and backward, in double, following
//! `engine::cpu::sdpa` literally (masks, padding, ALiBi, dropout, paging, empty rows).
//!
//! Forward: one launch, one thread per query row `(b, h, i)` (grid-stride): a pass over the keys
//! for the row max, one for the sum of `exp(s - max)`, one accumulating `o` (local array of
//! `d_v` doubles); writes `o` and `stats`.
//!
//! Backward (no atomics, every output element written by exactly one thread):
//! 1. one thread per query row: `D_i = do_i . o_i` into scratch 0 (doubles);
//! 2. one thread per query row: the `dq` row (loop over keys);
//! 3. one thread per `dk` row (a logical key `(b, h_kv, t)`, or a pool row `(block, h_kv, r)`
//!    with paging, which loops over the (batch, page) pairs that read the block): loops over
//!    the query heads of the kv head's group and their queries;
//! 4. the same for `dv` (pages through `page_table_v`);
//! 5. with `dbias`: one thread per bias element, summing dS over the broadcast dims in the CPU's
//!    row-major order.
//!
//! Sizes (dims) and attributes are baked into the source; strides arrive in `TRef`s.

use super::rng::PHILOX;
use super::{c_double, Arg, Ctx, Launch, NodeKernels};
use crate::error::Result;
use crate::graph::ops::sdpa::{alibi_slopes, CausalAlignment, SdpaAttrs};
use crate::graph::TensorId;

/// Device helpers shared by every sdpa kernel; configured by the `SD_*` macros.
const HELPERS: &str = r#"
#define SD_NEG_INF (-1.0/0.0)
#define SD_POS_INF (1.0/0.0)
#define SD_DA (SD_D > 0 ? SD_D : 1)
#define SD_DVA (SD_DV > 0 ? SD_DV : 1)
#define SD_ROWS (SD_B * SD_HQ * SD_SQ)

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
#if SD_DROPOUT
    u64 seed; u64 offset;
#endif
#if SD_PAGED
    const void* ptk; TRef tptk;
    const void* ptv; TRef tptv;
#endif
#if SD_BACKWARD
    const void* o; TRef to;
    const void* dout; TRef tdo;
    const void* st; TRef tst;
#endif
};

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
    return bi * A.tk.strides[0] + kh * A.tk.strides[1] + t * A.tk.strides[2];
#endif
}
__device__ __forceinline__ i64 sd_vrow(const Att& A, i64 bi, i64 kh, i64 t) {
#if SD_PAGED
    i64 bs = A.tv.dims[2];
    double e = LD_PTV(A.ptv, bi * A.tptv.strides[0] + (t / bs) * A.tptv.strides[2]);
    if (!(e >= 0.0 && e < (double)A.tv.dims[0])) return -1;
    return (i64)e * A.tv.strides[0] + kh * A.tv.strides[1] + (t % bs) * A.tv.strides[2];
#else
    return bi * A.tv.strides[0] + kh * A.tv.strides[1] + t * A.tv.strides[2];
#endif
}
__device__ __forceinline__ double sd_k(const Att& A, i64 row, i64 c) { return row < 0 ? 0.0 : LD_K(A.k, row + c * A.tk.strides[3]); }
__device__ __forceinline__ double sd_v(const Att& A, i64 row, i64 c) { return row < 0 ? 0.0 : LD_V(A.v, row + c * A.tv.strides[3]); }
__device__ __forceinline__ i64 sd_qrow(const Att& A, i64 bi, i64 h, i64 i) {
    return bi * A.tq.strides[0] + h * A.tq.strides[1] + i * A.tq.strides[2];
}

// The score from the dot product q_i . k_j: scaled, plus bias and ALiBi.
__device__ __forceinline__ double sd_score(const Att& A, i64 bi, i64 h, i64 i, i64 j, double dot) {
    double s = SD_SCALE * dot;
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

// The dropout factor of score element (bi, h, i, j): 0 or 1/(1-p) (1 without dropout).
__device__ __forceinline__ double sd_keep(const Att& A, i64 bi, i64 h, i64 i, i64 j) {
#if SD_DROPOUT
    u64 idx = (u64)((((bi * SD_HQ + h) * SD_SQ + i) * SD_SKV) + j);
    return fd_philox_uniform(A.seed, A.offset, idx) >= SD_P ? SD_KEEP : 0.0;
#else
    (void)A; (void)bi; (void)h; (void)i; (void)j;
    return 1.0;
#endif
}

#if SD_BACKWARD
__device__ __forceinline__ double sd_do(const Att& A, i64 bi, i64 h, i64 i, i64 c) {
    return LD_DO(A.dout, bi * A.tdo.strides[0] + h * A.tdo.strides[1] + i * A.tdo.strides[2] + c * A.tdo.strides[3]);
}
__device__ __forceinline__ double sd_stats(const Att& A, i64 bi, i64 h, i64 i) {
    return LD_STATS(A.st, bi * A.tst.strides[0] + h * A.tst.strides[1] + i * A.tst.strides[2]);
}
#endif
"#;

/// Forward: one thread per query row.
const FORWARD: &str = r#"
extern "C" __global__ void SD_ENTRY(SD_PARAMS) {
    Att A;
SD_INIT
    GRID_STRIDE(r, (i64)SD_ROWS) {
        i64 i = r % SD_SQ;
        i64 h = (r / SD_SQ) % SD_HQ;
        i64 bi = r / (SD_SQ * SD_HQ);
        i64 kh = h / SD_GROUP;
        i64 lq, lkv;
        sd_lens(A, bi, &lq, &lkv);
        double acc[SD_DVA];
        for (int c = 0; c < SD_DV; ++c) acc[c] = 0.0;
        double lse = SD_POS_INF;
        if (i < lq) {
            double qv[SD_DA];
            i64 qo = sd_qrow(A, bi, h, i);
            for (int c = 0; c < SD_D; ++c) qv[c] = LD_Q(A.q, qo + c * A.tq.strides[3]);
            // Pass 1: the row max.
            double m = SD_NEG_INF;
            for (i64 j = 0; j < SD_SKV; ++j) {
                if (!sd_visible(i, j, lq, lkv)) continue;
                i64 kr = sd_krow(A, bi, kh, j);
                double dot = 0.0;
                for (int c = 0; c < SD_D; ++c) dot += qv[c] * sd_k(A, kr, c);
                double s = sd_score(A, bi, h, i, j, dot);
                m = fmax(m, s);
            }
            if (m != SD_NEG_INF) {
                // Pass 2: the sum of exp(s - m) (masked keys add exp(-inf) = 0).
                double sum = 0.0;
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
                    i64 vr = sd_vrow(A, bi, kh, j);
                    for (int c = 0; c < SD_DV; ++c) acc[c] += w * sd_v(A, vr, c);
                }
            }
        }
        i64 oo = bi * to_.strides[0] + h * to_.strides[1] + i * to_.strides[2];
        for (int c = 0; c < SD_DV; ++c) ST_O(o_, oo + c * to_.strides[3], acc[c]);
#if SD_HAS_STATS
        ST_STATS(stats_, bi * tstats_.strides[0] + h * tstats_.strides[1] + i * tstats_.strides[2], lse);
#endif
        (void)lse;
    }
}
"#;

/// Backward 1: D_i = do_i . o_i per query row, into scratch.
const ROW_D: &str = r#"
extern "C" __global__ void SD_ENTRY(SD_PARAMS) {
    Att A;
SD_INIT
    double* dbuf = (double*)dbuf_;
    GRID_STRIDE(r, (i64)SD_ROWS) {
        i64 i = r % SD_SQ;
        i64 h = (r / SD_SQ) % SD_HQ;
        i64 bi = r / (SD_SQ * SD_HQ);
        i64 oo = bi * A.to.strides[0] + h * A.to.strides[1] + i * A.to.strides[2];
        double d = 0.0;
        for (int c = 0; c < SD_DV; ++c) d += sd_do(A, bi, h, i, c) * LD_O(A.o, oo + c * A.to.strides[3]);
        dbuf[r] = d;
    }
}
"#;

/// Backward 2: one thread per dq row.
const DQ: &str = r#"
extern "C" __global__ void SD_ENTRY(SD_PARAMS) {
    Att A;
SD_INIT
    const double* dbuf = (const double*)dbuf_;
    GRID_STRIDE(r, (i64)SD_ROWS) {
        i64 i = r % SD_SQ;
        i64 h = (r / SD_SQ) % SD_HQ;
        i64 bi = r / (SD_SQ * SD_HQ);
        i64 kh = h / SD_GROUP;
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
                i64 vr = sd_vrow(A, bi, kh, j);
                double dpv = 0.0;
                for (int c = 0; c < SD_DV; ++c) dpv += dov[c] * sd_v(A, vr, c);
                double dp = sd_keep(A, bi, h, i, j) * dpv;
                double dsc = p * (dp - big_d) * SD_SCALE;
                for (int c = 0; c < SD_D; ++c) acc[c] += dsc * sd_k(A, kr, c);
            }
        }
        i64 oo = bi * tdq_.strides[0] + h * tdq_.strides[1] + i * tdq_.strides[2];
        for (int c = 0; c < SD_D; ++c) ST_DQ(dq_, oo + c * tdq_.strides[3], acc[c]);
    }
}
"#;

/// The dk or dv contribution of logical key t of batch bi (kv head kh), added to `acc` after
/// being summed on its own (the CPU sums each logical key, then adds it into the pool).
const KEY_GRAD: &str = r#"
__device__ __forceinline__ void sd_key_grad(const Att& A, const double* dbuf, i64 bi, i64 kh, i64 t, double* acc) {
    i64 lq, lkv;
    sd_lens(A, bi, &lq, &lkv);
    double kv[SD_DA];
    double vv[SD_DVA];
    double tmp[SD_GA];
    i64 kr = sd_krow(A, bi, kh, t);
    i64 vr = sd_vrow(A, bi, kh, t);
    for (int c = 0; c < SD_D; ++c) kv[c] = sd_k(A, kr, c);
    for (int c = 0; c < SD_DV; ++c) vv[c] = sd_v(A, vr, c);
    for (int c = 0; c < SD_G; ++c) tmp[c] = 0.0;
    for (i64 hg = 0; hg < SD_GROUP; ++hg) {
        i64 h = kh * SD_GROUP + hg;
        for (i64 i = 0; i < lq; ++i) {
            if (!sd_visible(i, t, lq, lkv)) continue;
            i64 qo = sd_qrow(A, bi, h, i);
            double dot = 0.0;
            for (int c = 0; c < SD_D; ++c) dot += LD_Q(A.q, qo + c * A.tq.strides[3]) * kv[c];
            double s = sd_score(A, bi, h, i, t, dot);
            if (s == SD_NEG_INF) continue;
            double p = exp(s - sd_stats(A, bi, h, i));
            if (p == 0.0) continue;
            double keep = sd_keep(A, bi, h, i, t);
#if SD_GRAD_K
            double dpv = 0.0;
            for (int c = 0; c < SD_DV; ++c) dpv += sd_do(A, bi, h, i, c) * vv[c];
            double dp = keep * dpv;
            double dsc = p * (dp - dbuf[(bi * SD_HQ + h) * SD_SQ + i]) * SD_SCALE;
            for (int c = 0; c < SD_D; ++c) tmp[c] += dsc * LD_Q(A.q, qo + c * A.tq.strides[3]);
#else
            double pk = p * keep;
            for (int c = 0; c < SD_DV; ++c) tmp[c] += pk * sd_do(A, bi, h, i, c);
#endif
        }
    }
    (void)dbuf; (void)vv;
    for (int c = 0; c < SD_G; ++c) acc[c] += tmp[c];
}

extern "C" __global__ void SD_ENTRY(SD_PARAMS) {
    Att A;
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
#else
        sd_key_grad(A, dbuf, bo, kh, t, acc);
#endif
        i64 go = bo * tg.strides[0] + kh * tg.strides[1] + t * tg.strides[2];
        for (int c = 0; c < SD_G; ++c) ST_GRAD(grad_, go + c * tg.strides[3], acc[c]);
    }
}
"#;

/// Backward 5: dbias, one thread per bias element, summing dS over the broadcast dims.
const DBIAS: &str = r#"
__device__ __forceinline__ double sd_ds(const Att& A, const double* dbuf, i64 bi, i64 h, i64 i, i64 j, i64 lq, i64 lkv) {
    if (i >= lq || !sd_visible(i, j, lq, lkv)) return 0.0;
    i64 kh = h / SD_GROUP;
    i64 qo = sd_qrow(A, bi, h, i);
    i64 kr = sd_krow(A, bi, kh, j);
    double dot = 0.0;
    for (int c = 0; c < SD_D; ++c) dot += LD_Q(A.q, qo + c * A.tq.strides[3]) * sd_k(A, kr, c);
    double s = sd_score(A, bi, h, i, j, dot);
    if (s == SD_NEG_INF) return 0.0;
    double p = exp(s - sd_stats(A, bi, h, i));
    if (p == 0.0) return 0.0;
    i64 vr = sd_vrow(A, bi, kh, j);
    double dpv = 0.0;
    for (int c = 0; c < SD_DV; ++c) dpv += sd_do(A, bi, h, i, c) * sd_v(A, vr, c);
    double dp = sd_keep(A, bi, h, i, j) * dpv;
    return p * (dp - dbuf[(bi * SD_HQ + h) * SD_SQ + i]);
}

extern "C" __global__ void SD_ENTRY(SD_PARAMS) {
    Att A;
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
"#;

/// The sizes of a node, from its validated tensors.
struct Sizes {
    b: i64,
    h_q: i64,
    h_kv: i64,
    s_q: i64,
    s_kv: i64,
    d: i64,
    d_v: i64,
}

/// The `#define`s, `Att` parameters/arguments and initialisation common to a node's kernels.
struct Common {
    defines: String,
    params: Vec<String>,
    args: Vec<Arg>,
    init: String,
    sizes: Sizes,
    paged: Option<(TensorId, TensorId)>,
}

fn common(ctx: &Ctx, a: &SdpaAttrs, backward: bool) -> Result<Common> {
    let q = ctx.input("q")?;
    let k = ctx.input("k")?;
    let v = ctx.input("v")?;
    let (qd, kd, vd) = (ctx.dims(q), ctx.dims(k), ctx.dims(v));
    if qd.len() != 4 || kd.len() != 4 || vd.len() != 4 {
        return Err(ctx.err("q, k and v must have rank 4"));
    }
    let paged = match (ctx.node.input("page_table_k"), ctx.node.input("page_table_v")) {
        (Some(tk), Some(tv)) => Some((tk, tv)),
        _ => None,
    };
    let s_kv = match paged {
        Some((tk, _)) => ctx.dims(tk).get(2).copied().unwrap_or(0) * kd[2],
        None => kd[2],
    };
    let sizes = Sizes { b: qd[0], h_q: qd[1], h_kv: kd[1], s_q: qd[2], s_kv, d: qd[3], d_v: vd[3] };
    if sizes.h_kv <= 0 || sizes.h_q % sizes.h_kv != 0 {
        return Err(ctx.err(format!("q has {} heads, not a multiple of the {} kv heads", sizes.h_q, sizes.h_kv)));
    }
    let bias = ctx.node.input("bias");
    let padding = a.padding_mask;
    let dropout = a.dropout.filter(|&p| p > 0.0);
    let scale = a.attn_scale.unwrap_or(1.0 / (sizes.d as f64).sqrt());
    let flag = |b: bool| if b { 1 } else { 0 };
    // Windows past 2^62 mask nothing either way; capping keeps `diag -/+ w` from overflowing.
    let cap = |w: i64| w.min(1 << 62);

    let mut defines = String::new();
    let mut def = |name: &str, value: String| defines += &format!("#define {name} {value}\n");
    def("SD_B", format!("{}LL", sizes.b));
    def("SD_HQ", format!("{}LL", sizes.h_q));
    def("SD_HKV", format!("{}LL", sizes.h_kv));
    def("SD_SQ", format!("{}LL", sizes.s_q));
    def("SD_SKV", format!("{}LL", sizes.s_kv));
    def("SD_D", format!("{}", sizes.d));
    def("SD_DV", format!("{}", sizes.d_v));
    def("SD_GROUP", format!("{}LL", sizes.h_q / sizes.h_kv));
    def("SD_SCALE", c_double(scale));
    def("SD_CAUSAL", flag(a.causal.is_some()).to_string());
    def("SD_BOTTOM_RIGHT", flag(a.causal == Some(CausalAlignment::BottomRight)).to_string());
    def("SD_HAS_SWL", flag(a.sliding_window_left.is_some()).to_string());
    def("SD_SWL", format!("{}LL", cap(a.sliding_window_left.unwrap_or(0))));
    def("SD_HAS_SWR", flag(a.sliding_window_right.is_some()).to_string());
    def("SD_SWR", format!("{}LL", cap(a.sliding_window_right.unwrap_or(0))));
    def("SD_HAS_BIAS", flag(bias.is_some()).to_string());
    def("SD_PADDING", flag(padding).to_string());
    def("SD_ALIBI", flag(a.alibi).to_string());
    def("SD_DROPOUT", flag(dropout.is_some()).to_string());
    def("SD_P", c_double(dropout.unwrap_or(0.0)));
    def("SD_KEEP", c_double(dropout.map_or(1.0, |p| 1.0 / (1.0 - p))));
    def("SD_PAGED", flag(paged.is_some()).to_string());
    def("SD_BACKWARD", flag(backward).to_string());

    let mut params = Vec::new();
    let mut args = Vec::new();
    let mut init = String::new();
    let mut tensor = |defines: &mut String, field: &str, tref: &str, ld_macro: &str, id: TensorId| {
        params.push(format!("const void* {field}_p"));
        params.push(format!("TRef {tref}_r"));
        args.push(Arg::Ptr(id));
        args.push(Arg::Ref(id));
        init += &format!("    A.{field} = {field}_p; A.{tref} = {tref}_r;\n");
        *defines += &format!("#define {ld_macro} {}\n", ctx.ld(id));
    };
    tensor(&mut defines, "q", "tq", "LD_Q", q);
    tensor(&mut defines, "k", "tk", "LD_K", k);
    tensor(&mut defines, "v", "tv", "LD_V", v);
    if let Some(b) = bias {
        tensor(&mut defines, "bias", "tb", "LD_BIAS", b);
    }
    if padding {
        tensor(&mut defines, "slq", "tslq", "LD_SLQ", ctx.input("seq_len_q")?);
        tensor(&mut defines, "slkv", "tslkv", "LD_SLKV", ctx.input("seq_len_kv")?);
    }
    if let Some((tk, tv)) = paged {
        tensor(&mut defines, "ptk", "tptk", "LD_PTK", tk);
        tensor(&mut defines, "ptv", "tptv", "LD_PTV", tv);
    }
    if backward {
        tensor(&mut defines, "o", "to", "LD_O", ctx.input("o")?);
        tensor(&mut defines, "dout", "tdo", "LD_DO", ctx.input("do")?);
        tensor(&mut defines, "st", "tst", "LD_STATS", ctx.input("stats")?);
    }
    if dropout.is_some() {
        let (seed, offset) = (ctx.input("seed")?, ctx.input("offset")?);
        params.push("const void* seed_p".into());
        params.push("const void* offset_p".into());
        args.push(Arg::Ptr(seed));
        args.push(Arg::Ptr(offset));
        // By-value seeds live in the plan's constant buffer: read through the pointer too.
        init += &format!("    A.seed = fd_seed_bits({}(seed_p, 0));\n", ctx.ld(seed));
        init += &format!("    A.offset = fd_seed_bits({}(offset_p, 0));\n", ctx.ld(offset));
    }
    if a.alibi {
        let slopes = alibi_slopes(sizes.h_q.max(0) as usize);
        let cases: String = slopes.iter().enumerate().map(|(h, s)| format!("        case {h}: return {};\n", c_double(*s))).collect();
        defines += &format!("__device__ __forceinline__ double sd_slope(i64 h) {{\n    switch ((int)h) {{\n{cases}        default: return 0.0;\n    }}\n}}\n");
    }
    Ok(Common { defines, params, args, init, sizes, paged })
}

#[allow(clippy::too_many_arguments)]
/// One launch: the common parameters after the launch's own (`own`, matching `own_args`).
fn launch(ctx: &Ctx, c: &Common, extra_defines: &str, body: &str, what: &str, own: &[&str], own_args: Vec<Arg>, threads: u64) -> Launch {
    let entry = ctx.entry(what);
    let mut params: Vec<String> = own.iter().map(|s| s.to_string()).collect();
    params.extend(c.params.iter().cloned());
    let mut args = own_args;
    args.extend(c.args.iter().cloned());
    let source =
        format!("{PHILOX}\n{}{extra_defines}{HELPERS}\n{}", c.defines, body).replace("SD_ENTRY", &entry).replace("SD_PARAMS", &params.join(", ")).replace("SD_INIT", &c.init);
    Launch::elementwise(source, &entry, threads, args)
}

fn rows(s: &Sizes) -> u64 {
    (s.b * s.h_q * s.s_q).max(0) as u64
}

pub(super) fn sdpa(ctx: &Ctx, a: &SdpaAttrs) -> Result<NodeKernels> {
    let c = common(ctx, a, false)?;
    let o = ctx.output("o")?;
    let stats = ctx.node.output("stats");
    let mut extra = format!("#define ST_O {}\n#define SD_HAS_STATS {}\n", ctx.st(o), if stats.is_some() { 1 } else { 0 });
    let mut own = vec!["void* o_", "TRef to_"];
    let mut own_args = vec![Arg::Ptr(o), Arg::Ref(o)];
    if let Some(st) = stats {
        extra += &format!("#define ST_STATS {}\n", ctx.st(st));
        own.extend(["void* stats_", "TRef tstats_"]);
        own_args.extend([Arg::Ptr(st), Arg::Ref(st)]);
    }
    let l = launch(ctx, &c, &extra, FORWARD, "sdpa_fwd", &own, own_args, rows(&c.sizes));
    Ok(NodeKernels::one(l))
}

pub(super) fn sdpa_backward(ctx: &Ctx, a: &SdpaAttrs) -> Result<NodeKernels> {
    let c = common(ctx, a, true)?;
    let s = &c.sizes;
    let mut launches = Vec::new();
    // 1. D per row.
    launches.push(launch(ctx, &c, "", ROW_D, "sdpa_bwd_d", &["void* dbuf_"], vec![Arg::Scratch(0)], rows(s)));
    // 2. dq.
    let dq = ctx.output("dq")?;
    launches.push(launch(
        ctx,
        &c,
        &format!("#define ST_DQ {}\n", ctx.st(dq)),
        DQ,
        "sdpa_bwd_dq",
        &["void* dq_", "TRef tdq_", "const void* dbuf_"],
        vec![Arg::Ptr(dq), Arg::Ref(dq), Arg::Scratch(0)],
        rows(s),
    ));
    // 3, 4. dk and dv (pool-shaped when paged).
    for (port, grad_k) in [("dk", true), ("dv", false)] {
        let g = ctx.output(port)?;
        let gd = ctx.dims(g);
        let width = if grad_k { s.d } else { s.d_v };
        let mut extra =
            format!("#define ST_GRAD {}\n#define SD_GRAD_K {}\n#define SD_G {width}\n#define SD_GA ({width} > 0 ? {width} : 1)\n", ctx.st(g), if grad_k { 1 } else { 0 });
        if let Some((tk, tv)) = c.paged {
            let (table, ptr, tref) = if grad_k { (tk, "A.ptk", "A.tptk") } else { (tv, "A.ptv", "A.tptv") };
            extra +=
                &format!("#define PT_PAGES {}LL\n#define PT_PTR {ptr}\n#define PT_REF {tref}\n#define LD_PT {}\n", ctx.dims(table).get(2).copied().unwrap_or(0), ctx.ld(table));
        }
        let threads = gd.iter().take(3).product::<i64>().max(0) as u64;
        launches.push(launch(
            ctx,
            &c,
            &extra,
            KEY_GRAD,
            &format!("sdpa_bwd_{port}"),
            &["void* grad_", "TRef tgrad_", "const void* dbuf_"],
            vec![Arg::Ptr(g), Arg::Ref(g), Arg::Scratch(0)],
            threads,
        ));
    }
    // 5. dbias.
    if let Some(db) = ctx.node.output("dbias") {
        launches.push(launch(
            ctx,
            &c,
            &format!("#define ST_DB {}\n", ctx.st(db)),
            DBIAS,
            "sdpa_bwd_dbias",
            &["void* db_", "TRef tdb_", "const void* dbuf_"],
            vec![Arg::Ptr(db), Arg::Ref(db), Arg::Scratch(0)],
            ctx.numel(db),
        ));
    }
    Ok(NodeKernels { launches, scratch: vec![(rows(s) as usize).max(1) * 8] })
}
