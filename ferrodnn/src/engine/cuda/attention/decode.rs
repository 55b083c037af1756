//! The decode kernel (flash-decoding): few query rows against a long K/V sequence.
//!
//! The general forward kernel gives each query head its own CTA, so the query heads sharing a
//! kv head (GQA/MQA) each read that head's K/V, and a 64-row tile holds one valid row. Here one
//! CTA per (kv split, kv head, batch) computes every query row of the group of query heads
//! sharing the kv head (`group * s_q <= 16` rows, padded to one 16-row `mma` tile), so each
//! K/V byte is read once. Its 4 warps split each K/V tile by keys (`KW` keys each) and each
//! keeps its own online softmax (m, l, o) over its keys; K/V tiles stream through a 2-4 stage
//! 16-byte `cp.async` pipeline (about 32-64 KB in flight per CTA, two CTAs per SM on Hopper).
//! At the end the warps merge in shared memory and the CTA writes its split's unnormalized
//! `o`, max and sum (log2 units, f32) to the workspace; a second launch merges the splits in
//! split order (deterministic) and writes `o` and `stats`. With one split the kernel writes
//! `o` and `stats` itself.
//!
//! Splits: the grid is `(splits, h_kv, b)` with `splits = ceil(4 * SMs / (b * h_kv))`, at most
//! `keys / 256` (at least 256 keys a split) and at most the number of K/V tiles, `keys` being
//! `s_kv` or the width of a sliding window. Each batch's visible key range (after padding and
//! masks) is cut into `splits` chunks of whole tiles; chunks past its end do no work.
//!
//! Takes every forward feature the general kernel takes (masks, padding, bias, ALiBi, dropout,
//! GQA/MQA, paged K/V, stats, any strides, element-wise loads when 16-byte ones are not
//! possible) when `group * s_q <= 16` and the shared memory fits; returns `None` otherwise.

use super::{fa_init, max_shared, Problem, HELPERS};
use crate::engine::cuda::kernel::ctype::st;
use crate::engine::cuda::kernel::{Arg, Grid, Launch, NodeKernels, Pdl, Target, Unaligned, Unit};

/// Warps per CTA.
const NW: i64 = 4;
/// Query rows a CTA takes (one m16 tile).
const MAX_ROWS: i64 = 16;
/// The fewest keys a split gets.
const MIN_KEYS_PER_SPLIT: i64 = 256;
/// Shared memory per CTA the stage count aims at (two CTAs per SM on Hopper).
const SMEM_BUDGET: i64 = 112 * 1024;

const BODY: &str = r#"
{
    extern __shared__ __align__(16) unsigned char fa_smem[];
    u16* sQ = reinterpret_cast<u16*>(fa_smem);
    u16* sK = sQ + 16 * FA_LDQ;
    u16* sV = sK + FA_STAGES * FA_BN * FA_LDK;
FA_INIT
    const u16* Qg = reinterpret_cast<const u16*>(q_p);
    const u16* Kg = reinterpret_cast<const u16*>(k_p);
    const u16* Vg = reinterpret_cast<const u16*>(v_p);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
    const i64 split = blockIdx.x, kh = blockIdx.y, bi = blockIdx.z;
    i64 lq, lkv;
    fa_lens(A, bi, lq, lkv);
    const i64 off = fa_diag_off(lq, lkv);
    // Keys some row of the batch sees, then this split's whole tiles of them: [s_lo, s_hi).
    i64 s_lo = 0, s_hi = 0;
    if (lq > 0) {
        i64 jlo, jhi;
        fa_key_range(0, fa_min(FA_SQ, lq) - 1, lkv, off, jlo, jhi);
        if (jlo < jhi) {
            const i64 chunk = ((jhi - jlo + FA_NSPLIT - 1) / FA_NSPLIT + FA_BN - 1) / FA_BN * FA_BN;
            s_lo = jlo + split * chunk;
            s_hi = fa_min(jhi, s_lo + chunk);
            if (s_lo >= s_hi) { s_lo = 0; s_hi = 0; }
        }
    }
    const i64 nt = (s_hi - s_lo + FA_BN - 1) / FA_BN;

    // Row r of the tile is query row r % s_q of query head kh * group + r / s_q; rows past
    // FA_R (zeros) are computed but never stored.
    fa_load<16, FA_D, FA_LDQ, FA_NT, Q_VEC>(sQ, Qg, Q_S3, [&](int r) -> i64 {
        if (r >= FA_R) return (i64)-1;
        const i64 i = (i64)r % FA_SQ;
        return i < lq ? bi * Q_S0 + (kh * FA_GROUP + (i64)r / FA_SQ) * Q_S1 + i * Q_S2 : (i64)-1;
    });
    auto load_kv = [&](i64 t, int buf) {
        const i64 j0 = s_lo + t * FA_BN;
        fa_load<FA_BN, FA_D, FA_LDK, FA_NT, K_VEC>(sK + buf * FA_BN * FA_LDK, Kg, K_S3, [&](int r) -> i64 {
            const i64 j = j0 + r;
            return j < s_hi ? fa_krow(A, bi, kh, j) : (i64)-1;
        });
        fa_load<FA_BN, FA_DV, FA_LDV, FA_NT, V_VEC>(sV + buf * FA_BN * FA_LDV, Vg, V_S3, [&](int r) -> i64 {
            const i64 j = j0 + r;
            return j < s_hi ? fa_vrow(A, bi, kh, j) : (i64)-1;
        });
    };
    #pragma unroll
    for (int s = 0; s < FA_STAGES - 1; ++s) {
        if (s < nt) load_kv(s, s);
        fa_commit();
    }

    // The (head, query row) of this thread's rows g and g + 8 (rows past FA_R repeat the last).
    i64 ir[2];
#if FA_HAS_BIAS || FA_ALIBI || FA_DROPOUT
    i64 hr[2];
#endif
    #pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int r = g + hh * 8 < FA_R ? g + hh * 8 : FA_R - 1;
#if FA_HAS_BIAS || FA_ALIBI || FA_DROPOUT
        hr[hh] = kh * FA_GROUP + (i64)r / FA_SQ;
#endif
        ir[hh] = (i64)r % FA_SQ;
    }

    // This warp's online softmax over its keys of each tile: running max (log2 units), this
    // thread's part of the running sum, and the output accumulators.
    float m[2] = {FA_NINF, FA_NINF};
    float l[2] = {0.0f, 0.0f};
    float oacc[FA_DV / 8][4];
    #pragma unroll
    for (int n = 0; n < FA_DV / 8; ++n) { oacc[n][0] = 0.0f; oacc[n][1] = 0.0f; oacc[n][2] = 0.0f; oacc[n][3] = 0.0f; }
#if FA_QREG
    u32 qf[FA_D / 16][4];
#endif
    const u16* sQw = sQ + (lane & 15) * FA_LDQ + (lane >> 4) * 8;
    const int kw0 = warp * FA_KW;

    for (i64 t = 0; t < nt; ++t) {
        fa_wait<FA_STAGES - 2>();
        __syncthreads();
        // Every warp is done with the buffer of tile t - 1: refill it with tile t + STAGES - 1.
        if (t + FA_STAGES - 1 < nt) load_kv(t + FA_STAGES - 1, (int)((t + FA_STAGES - 1) % FA_STAGES));
        fa_commit();
        const int buf = (int)(t % FA_STAGES);
#if FA_QREG
        if (t == 0) {
            #pragma unroll
            for (int kk = 0; kk < FA_D / 16; ++kk) fa_ldsm(qf[kk], sQw + kk * 16);
        }
#endif
        const u16* sKb = sK + buf * FA_BN * FA_LDK + kw0 * FA_LDK;
        const u16* sVb = sV + buf * FA_BN * FA_LDV + kw0 * FA_LDV;

        // S = Q K^T: 16 rows x KW keys.
        float sacc[FA_KW / 8][4];
        #pragma unroll
        for (int n = 0; n < FA_KW / 8; ++n) { sacc[n][0] = 0.0f; sacc[n][1] = 0.0f; sacc[n][2] = 0.0f; sacc[n][3] = 0.0f; }
        #pragma unroll
        for (int kk = 0; kk < FA_D / 16; ++kk) {
#if FA_QREG
            const u32* a = qf[kk];
#else
            u32 a[4];
            fa_ldsm(a, sQw + kk * 16);
#endif
            #pragma unroll
            for (int nn = 0; nn < FA_KW / 16; ++nn) {
                u32 b[4];
                fa_ldsm(b, sKb + (nn * 16 + (lane & 7) + ((lane >> 4) << 3)) * FA_LDK + kk * 16 + ((lane >> 3) & 1) * 8);
                fa_mma(sacc[2 * nn], a, b[0], b[1]);
                fa_mma(sacc[2 * nn + 1], a, b[2], b[3]);
            }
        }

        // Scores in log2 units, masked ones (and keys past the split) -inf.
        const i64 j0 = s_lo + t * FA_BN + kw0;
        const bool need = j0 + FA_KW > s_hi || fa_tile_needs_mask(0, FA_SQ, j0, FA_KW, lq, lkv, off);
        if (need || FA_HAS_BIAS || FA_ALIBI) {
            #pragma unroll
            for (int n = 0; n < FA_KW / 8; ++n) {
                #pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const i64 i = ir[e >> 1];
                    const i64 j = j0 + n * 8 + tg * 2 + (e & 1);
                    float x = sacc[n][e] * FA_SCALE_LOG2;
                    if (need && (j >= s_hi || !fa_visible(i, j, lq, lkv, off))) x = FA_NINF;
#if FA_HAS_BIAS || FA_ALIBI
                    else x = fmaf(fa_add(A, bi, hr[e >> 1], i, j), FA_LOG2E, x);
#endif
                    sacc[n][e] = x;
                }
            }
        } else {
            #pragma unroll
            for (int n = 0; n < FA_KW / 8; ++n) {
                #pragma unroll
                for (int e = 0; e < 4; ++e) sacc[n][e] *= FA_SCALE_LOG2;
            }
        }

        // Online softmax: new row max (over the quad that shares a row), rescale, exponentiate.
        float mx[2] = {m[0], m[1]};
        #pragma unroll
        for (int n = 0; n < FA_KW / 8; ++n) {
            mx[0] = fmaxf(mx[0], fmaxf(sacc[n][0], sacc[n][1]));
            mx[1] = fmaxf(mx[1], fmaxf(sacc[n][2], sacc[n][3]));
        }
        float mu[2];
        #pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 1));
            mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 2));
            // A row with every key masked so far keeps max -inf: exponentiate against 0.
            mu[hh] = mx[hh] == FA_NINF ? 0.0f : mx[hh];
            const float alpha = fa_exp2(m[hh] - mu[hh]);
            m[hh] = mx[hh];
            l[hh] *= alpha;
            #pragma unroll
            for (int n = 0; n < FA_DV / 8; ++n) { oacc[n][2 * hh] *= alpha; oacc[n][2 * hh + 1] *= alpha; }
        }
        #pragma unroll
        for (int n = 0; n < FA_KW / 8; ++n) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float p = fa_exp2(sacc[n][e] - mu[e >> 1]);
                l[e >> 1] += p;
                sacc[n][e] = p;
            }
        }
#if FA_DROPOUT
        // Dropped elements leave the sum (taken before dropout) but not the output.
        #pragma unroll
        for (int n = 0; n < FA_KW / 8; ++n) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                if (sacc[n][e] != 0.0f) {
                    const i64 j = j0 + n * 8 + tg * 2 + (e & 1);
                    if (!fa_keep(A, bi, hr[e >> 1], ir[e >> 1], j)) sacc[n][e] = 0.0f;
                }
            }
        }
#endif

        // O += P V: P from the S accumulators (A fragments), V through ldmatrix.trans.
        #pragma unroll
        for (int kt = 0; kt < FA_KW / 16; ++kt) {
            u32 a[4];
            a[0] = fa_pack(sacc[2 * kt][0], sacc[2 * kt][1]);
            a[1] = fa_pack(sacc[2 * kt][2], sacc[2 * kt][3]);
            a[2] = fa_pack(sacc[2 * kt + 1][0], sacc[2 * kt + 1][1]);
            a[3] = fa_pack(sacc[2 * kt + 1][2], sacc[2 * kt + 1][3]);
            #pragma unroll
            for (int nd = 0; nd < FA_DV / 16; ++nd) {
                u32 b[4];
                fa_ldsm_t(b, sVb + (kt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * FA_LDV + nd * 16 + (lane >> 4) * 8);
                fa_mma(oacc[2 * nd], a, b[0], b[1]);
                fa_mma(oacc[2 * nd + 1], a, b[2], b[3]);
            }
        }
    }
    fa_wait<0>();
    __syncthreads();

    // Merge the warps (the stage buffers are free now): per warp and row its max, sum and o.
    float* sO = reinterpret_cast<float*>(sK);
    float* sM = sO + FA_NW * 16 * FA_LDO;
    float* sL = sM + FA_NW * 16;
    #pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        float lsum = l[hh];
        lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
        lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
        const int r = warp * 16 + g + hh * 8;
        if (tg == 0) { sM[r] = m[hh]; sL[r] = lsum; }
        #pragma unroll
        for (int n = 0; n < FA_DV / 8; ++n) {
            *reinterpret_cast<float2*>(sO + r * FA_LDO + n * 8 + tg * 2) = make_float2(oacc[n][2 * hh], oacc[n][2 * hh + 1]);
        }
    }
    __syncthreads();
    for (int e = tid; e < FA_R * (FA_DV / 2); e += FA_NT) {
        const int r = e / (FA_DV / 2), c = (e - r * (FA_DV / 2)) * 2;
        float mxr = FA_NINF;
        #pragma unroll
        for (int w = 0; w < FA_NW; ++w) mxr = fmaxf(mxr, sM[w * 16 + r]);
        const float mur = mxr == FA_NINF ? 0.0f : mxr;
        float ls = 0.0f, o0 = 0.0f, o1 = 0.0f;
        #pragma unroll
        for (int w = 0; w < FA_NW; ++w) {
            const float a = fa_exp2(sM[w * 16 + r] - mur);
            const float2 ov = *reinterpret_cast<const float2*>(sO + (w * 16 + r) * FA_LDO + c);
            ls += sL[w * 16 + r] * a;
            o0 += ov.x * a;
            o1 += ov.y * a;
        }
        const i64 hq = kh * FA_GROUP + (i64)r / FA_SQ, i = (i64)r % FA_SQ;
#if FA_NSPLIT == 1
        // Empty rows (padded, or every key masked) give o = 0, stats = +inf.
        const bool empty = i >= lq || mxr == FA_NINF || !(ls > 0.0f);
        const float inv = empty ? 0.0f : FA_KEEP_SCALE / ls;
        fa_store_o(o_p, bi * O_S0 + hq * O_S1 + i * O_S2 + c * O_S3, o0 * inv, o1 * inv);
#if FA_HAS_STATS
        if (c == 0) ST_STATS(stats_p, bi * ST_S0 + hq * ST_S1 + i * ST_S2, empty ? (double)FA_INF : (double)(mxr * FA_LN2 + logf(ls)));
#endif
#else
        const i64 row = (bi * FA_HQ + hq) * FA_SQ + i;
        float* po = reinterpret_cast<float*>(part_p);
        *reinterpret_cast<float2*>(po + (split * FA_ROWS + row) * FA_DV + c) = make_float2(o0, o1);
        if (c == 0) *reinterpret_cast<float2*>(po + FA_NSPLIT * FA_ROWS * FA_DV + (split * FA_ROWS + row) * 2) = make_float2(mxr, ls);
#endif
    }
}
"#;

/// The split merge: one thread per (row, pair of columns), splits in order.
const COMBINE: &str = r#"
{
FA_INIT
    const float* po = reinterpret_cast<const float*>(part_p);
    const float2* pml = reinterpret_cast<const float2*>(po + FA_NSPLIT * FA_ROWS * FA_DV);
    const i64 total = FA_ROWS * (FA_DV / 2);
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (i64)gridDim.x * blockDim.x) {
        const i64 row = e / (FA_DV / 2);
        const int c = (int)(e - row * (FA_DV / 2)) * 2;
        const i64 i = row % FA_SQ, hq = (row / FA_SQ) % FA_HQ, bi = row / (FA_SQ * FA_HQ);
        i64 lq, lkv;
        fa_lens(A, bi, lq, lkv);
        (void)lkv;
        float mx = FA_NINF;
        for (int s = 0; s < FA_NSPLIT; ++s) mx = fmaxf(mx, pml[s * FA_ROWS + row].x);
        const float mu = mx == FA_NINF ? 0.0f : mx;
        float ls = 0.0f, o0 = 0.0f, o1 = 0.0f;
        for (int s = 0; s < FA_NSPLIT; ++s) {
            const float2 ml = pml[s * FA_ROWS + row];
            const float a = fa_exp2(ml.x - mu);
            const float2 ov = *reinterpret_cast<const float2*>(po + (s * FA_ROWS + row) * FA_DV + c);
            ls += ml.y * a;
            o0 += ov.x * a;
            o1 += ov.y * a;
        }
        // Empty rows (padded, or every key masked) give o = 0, stats = +inf.
        const bool empty = i >= lq || mx == FA_NINF || !(ls > 0.0f);
        const float inv = empty ? 0.0f : FA_KEEP_SCALE / ls;
        fa_store_o(o_p, bi * O_S0 + hq * O_S1 + i * O_S2 + c * O_S3, o0 * inv, o1 * inv);
#if FA_HAS_STATS
        if (c == 0) ST_STATS(stats_p, bi * ST_S0 + hq * ST_S1 + i * ST_S2, empty ? (double)FA_INF : (double)(mx * FA_LN2 + logf(ls)));
#endif
    }
}
"#;

/// Tiling and grid of a decode problem.
struct Shape {
    /// Keys per warp in a tile.
    kw: i64,
    /// Pipeline stages (K/V tiles in shared memory).
    stages: i64,
    splits: i64,
    shared: i64,
}

fn shape(p: &Problem, target: &Target) -> Option<Shape> {
    let dmax = p.d.max(p.d_v);
    let kw = if dmax > 64 { 16 } else { 32 };
    let bn = NW * kw;
    let q_bytes = 16 * (p.d + 8) * 2;
    let stage = bn * ((p.d + 8) + (p.d_v + 8)) * 2;
    let merge = NW * 16 * (p.d_v + 8) * 4 + 2 * NW * 16 * 4;
    let stages = ((SMEM_BUDGET - q_bytes) / stage).clamp(2, 4);
    let shared = q_bytes + (stages * stage).max(merge);
    if shared > max_shared(target) as i64 {
        return None;
    }
    // Enough CTAs for about four per SM (two waves at two CTAs per SM), each split at least
    // MIN_KEYS_PER_SPLIT keys and a whole number of tiles.
    // Keys a batch's rows can see: all, or a window's width.
    let a = p.attrs;
    let right = if a.causal.is_some() { Some(0) } else { a.sliding_window_right };
    let keys = match (a.sliding_window_left, right) {
        (Some(l), Some(r)) => p.s_kv.min(l.max(0).saturating_add(r.max(0)).saturating_add(p.s_q)),
        _ => p.s_kv,
    };
    let work = p.b * p.h_kv;
    let want = 4 * target.sm_count.max(1) as i64;
    let splits = ((want + work - 1) / work).min((keys / MIN_KEYS_PER_SPLIT).max(1)).min((keys + bn - 1) / bn).max(1);
    Some(Shape { kw, stages, splits, shared })
}

fn generate(p: &Problem, s: &Shape, vec: bool) -> Option<NodeKernels> {
    let node = p.node;
    let o = node.output("o")?;
    let stats = node.output("stats");
    let rows = p.b * p.h_q * p.s_q;
    let c = p.common(vec);
    let mut defs = c.defines.clone();
    let mut d = |name: &str, v: String| defs += &format!("#define {name} {v}\n");
    d("FA_NW", NW.to_string());
    d("FA_NT", (NW * 32).to_string());
    d("FA_KW", s.kw.to_string());
    d("FA_BN", (NW * s.kw).to_string());
    d("FA_STAGES", s.stages.to_string());
    d("FA_NSPLIT", s.splits.to_string());
    d("FA_R", (p.h_q / p.h_kv * p.s_q).to_string());
    d("FA_ROWS", format!("{rows}LL"));
    d("FA_LDQ", (p.d + 8).to_string());
    d("FA_LDO", (p.d_v + 8).to_string());
    d("FA_QREG", if p.d <= 128 { "1" } else { "0" }.into());
    d("FA_HAS_STATS", if stats.is_some() { "1" } else { "0" }.into());
    let stores = p.output_store("o", "O", o, vec && p.pair_ok(o));
    let mut out_params = vec!["void* o_p".to_string()];
    let mut out_args = vec![Arg::Ptr(o)];
    if let Some(t) = stats {
        let sd = p.graph.desc(t);
        defs += &format!("#define ST_STATS {}\n#define ST_S0 {}LL\n#define ST_S1 {}LL\n#define ST_S2 {}LL\n", st(p.graph, t), sd.strides[0], sd.strides[1], sd.strides[2]);
        out_params.push("void* stats_p".into());
        out_args.push(Arg::Ptr(t));
    }
    let split = s.splits > 1;
    // The main kernel writes o (and stats) with one split, else the partials.
    let (mut params, mut args) = if split { (vec!["void* part_p".to_string()], vec![Arg::Scratch(0)]) } else { (out_params.clone(), out_args.clone()) };
    params.extend(["const void* q_p".to_string(), "const void* k_p".to_string(), "const void* v_p".to_string()]);
    args.extend([Arg::Ptr(p.q), Arg::Ptr(p.k), Arg::Ptr(p.v)]);
    params.extend(c.params.iter().cloned());
    args.extend(c.args.iter().cloned());
    let init = fa_init(&c);
    let suffix = if vec { "" } else { "_unaligned" };
    let entry = p.entry(&format!("attn_decode{suffix}"));
    let nt = NW * 32;
    let source = format!("{defs}{HELPERS}{stores}\nextern \"C\" __global__ void __launch_bounds__({nt}) {entry}({})\n{}", params.join(", "), BODY.replace("FA_INIT", &init));
    let grid = (s.splits, p.h_kv, p.b);
    let main = Launch {
        source,
        entry,
        grid: Grid::Exact(grid.0 as u32, grid.1 as u32, grid.2 as u32),
        block: nt as u32,
        shared_bytes: s.shared as u32,
        args,
        cluster: None,
        pdl: Pdl::Dependent,
    };
    if !split {
        return Some(NodeKernels::one(main));
    }
    let mut params = out_params;
    let mut args = out_args;
    params.push("const void* part_p".into());
    args.push(Arg::Scratch(0));
    params.extend(c.params.iter().cloned());
    args.extend(c.args.iter().cloned());
    let entry = p.entry(&format!("attn_decode_combine{suffix}"));
    let source = format!("{defs}{HELPERS}{stores}\nextern \"C\" __global__ void __launch_bounds__(256) {entry}({})\n{}", params.join(", "), COMBINE.replace("FA_INIT", &init));
    let combine = Launch::elementwise(source, &entry, (rows * (p.d_v / 2)) as u64, args);
    let scratch = (s.splits * rows * (p.d_v + 2) * 4) as usize;
    Some(NodeKernels { launches: vec![main, combine], scratch: vec![scratch] })
}

/// The decode unit of a forward sdpa node, when `group * s_q` query rows fit one CTA.
pub(super) fn unit(p: &Problem, target: &Target) -> Option<Unit> {
    if p.h_q / p.h_kv * p.s_q > MAX_ROWS {
        return None;
    }
    let s = shape(p, target)?;
    let kernels = generate(p, &s, true)?;
    let node = p.node;
    let o = node.output("o")?;
    // Tensors the fast kernel reads with 16-byte cp.async or writes in 4-byte pairs.
    let mut needs: Vec<_> = [p.q, p.k, p.v].into_iter().filter(|&t| p.vec_ok(t)).collect();
    if p.pair_ok(o) {
        needs.push(o);
    }
    let unaligned = if needs.is_empty() { None } else { Some(Box::new(Unaligned { tensors: needs, kernels: generate(p, &s, false)? })) };
    Some(Unit { nodes: vec![p.ni], kernels, writes: node.outputs.iter().map(|x| x.tensor).collect(), unaligned })
}
