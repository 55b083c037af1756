//! The Hopper backward kernels: the general backward's three passes ([`super::bwd`]: `D`, dQ,
//! dK/dV; deterministic, no atomics) with the two heavy ones on `wgmma`, TMA and warp
//! specialization (one producer warpgroup, two consumer warpgroups of 64 rows each).
//!
//! - dK/dV: a CTA per (128 keys, kv head, batch) keeps its K and V tiles in shared memory and
//!   loops over the query heads sharing the kv head and their q tiles of 64 rows (Q and dO by
//!   TMA, three stages; a producer warp stages each tile's lse and D in shared memory). Per step
//!   and consumer: S^T = K Q^T and dP^T = V dO^T (both operands from shared memory), P^T =
//!   exp2(S^T - lse) while dP^T is still on the tensor cores, dV += P^T dO with P^T from
//!   registers, then dS^T = P^T (dP^T - D) and dK += dS^T Q, again from registers.
//! - dQ: a CTA per (128 query rows, head, batch) keeps Q and dO and loops over the K/V tiles of
//!   64 keys (two stages): S = Q K^T, dP = dO V^T, dS = P (dP - D), dQ += dS K.
//! - Or, with the `atomics` plan knob and no sliding window (where it pays, see
//!   [`super::atomic_dq_pays`]): no dQ pass; the dK/dV kernel also stores each step's dS^T in
//!   shared memory and the consumers compute dQ += dS K for the step's 64 query rows over the
//!   CTA's 128 keys (at d = 128 one 64-channel chunk each, issued between the two halves of
//!   the dK product so that the tensor cores run on while dQ is staged; at d = 64 the chunk
//!   goes to one consumer a step, after the dK product), staged as 64 x 64 f32 tiles in shared
//!   memory and added with bulk reductions (`cp.reduce.async.bulk .add.f32`, issued by a
//!   reducer warp of the producer warpgroup) into a zeroed, tiled f32 accumulator; a last
//!   launch writes dQ from it. The order of the additions varies from run to run (the plan's
//!   behavior notes say non-deterministic).
//! - Under a causal mask the CTAs take their tiles heaviest first (`fa90_work`), and the dK/dV
//!   kernel walks a K/V tile's q tiles from the last one down (`FA_QTILE`).
//!
//! Masks, bias, ALiBi and dropout as in the general kernels (the dropout mask is regenerated
//! once per element and kept as bits between P and dS). Taken when [`super::hopper::takes`]
//! holds (head dims 64 and 128, no paging or padding mask) and no dbias is asked for.

use super::bwd::{self, Dbias, Ports};
use super::hopper::{self, tma_of};
use super::{fa_init, Problem, HELPERS};
use crate::engine::cuda::kernel::{Arg, Grid, Launch, NodeKernels, Options, Pdl, Target, Unaligned, Unit};

/// dK/dV: keys per CTA (two consumers of 64) and query rows per step.
const KV_BK: i64 = 128;
const KV_BQ: i64 = 64;
/// dQ: query rows per CTA (two consumers of 64) and keys per step.
const Q_BM: i64 = 128;
const Q_BN: i64 = 64;

/// Scores of a 64 x 64 block to P (masked, bias and ALiBi added, against the rows' lse in
/// log2 units), with the dropout keep bits (bit 4n + e for accumulator 4n + e); and dS from
/// P and dP. `row(e)` / `col(n, e)` give the query row and key of accumulator 4n + e; `lse(n,
/// e)` / `dd(n, e)` its row's lse and D.
const SCORES: &str = r#"
template <typename FQ, typename FK, typename FL>
__device__ __forceinline__ unsigned fa90_probs(const FaIn& A, float (&sc)[32], bool need, i64 lq, i64 lkv, i64 off, i64 bi, i64 h, FQ qi, FK kj, FL lse) {
#if !(FA_HAS_BIAS || FA_ALIBI || FA_DROPOUT)
    // Nothing to add or drop: straight-line code (an `if` per element compiles to branches
    // under a causal mask, which cost the backward kernels about one branch stall per issued
    // instruction), one loop for blocks that need no mask (the same for every thread of the
    // warpgroup, so one uniform branch) and one with the mask as a select. The mask's 64-bit
    // index arithmetic, evaluated for every element of every block, was most of these
    // kernels' instructions (bench/NOTES.md, session 14).
    if (!need) {
        #pragma unroll
        for (int n = 0; n < 8; ++n) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) sc[4 * n + e] = fa_exp2(sc[4 * n + e] * FA_SCALE_LOG2 - lse(n, e));
        }
    } else {
        #pragma unroll
        for (int n = 0; n < 8; ++n) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                const bool vis = fa_visible(qi(n, e), kj(n, e), lq, lkv, off);
                const float pv = fa_exp2(sc[4 * n + e] * FA_SCALE_LOG2 - lse(n, e));
                sc[4 * n + e] = vis ? pv : 0.0f;
            }
        }
    }
    (void)A; (void)bi; (void)h;
    return 0u;
#else
    unsigned keep = 0u;
    #pragma unroll
    for (int n = 0; n < 8; ++n) {
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
            const i64 i = qi(n, e), j = kj(n, e);
            float pv = 0.0f;
            if (!need || fa_visible(i, j, lq, lkv, off)) {
                float s2 = sc[4 * n + e] * FA_SCALE_LOG2;
#if FA_HAS_BIAS || FA_ALIBI
                s2 = fmaf(fa_add(A, bi, h, i, j), FA_LOG2E, s2);
#endif
                pv = fa_exp2(s2 - lse(n, e));
#if FA_DROPOUT
                if (fa_keep(A, bi, h, i, j)) keep |= 1u << (4 * n + e);
#endif
            }
            sc[4 * n + e] = pv;
        }
    }
    (void)A; (void)bi; (void)h;
    return keep;
#endif
}

// P as the A operand of dV += P^T dO (with the dropout factor).
__device__ __forceinline__ void fa90_p_frags(u32 (&a)[4][4], const float (&sc)[32], unsigned keep) {
    float t[32];
    #pragma unroll
    for (int x = 0; x < 32; ++x) {
#if FA_DROPOUT
        t[x] = ((keep >> x) & 1u) ? sc[x] * FA_KEEP_SCALE : 0.0f;
#else
        t[x] = sc[x];
#endif
    }
    (void)keep;
    fa90_pack<64>(a, t);
}

// dS = P (dP' - D) into dp (dP' = dP with the dropout factor, 0 where dropped), without the
// attention scale: dK and dQ take it once, when they are stored, instead of every element of
// every block here.
template <typename FL>
__device__ __forceinline__ void fa90_ds(float (&dp)[32], const float (&sc)[32], unsigned keep, FL dd) {
    #pragma unroll
    for (int n = 0; n < 8; ++n) {
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
            float d = dp[4 * n + e];
#if FA_DROPOUT
            d = ((keep >> (4 * n + e)) & 1u) ? d * FA_KEEP_SCALE : 0.0f;
#endif
            dp[4 * n + e] = sc[4 * n + e] * (d - dd(n, e));
        }
    }
    (void)keep;
}

// 64 x 64 products from shared memory, k = W channels: rows of A at sa and of B at sb, each a
// K-major tile whose 64-channel chunks are ca / cb bytes apart.
template <int W>
__device__ __forceinline__ void fa90_block(float (&acc)[32], unsigned sa, unsigned ca, unsigned sb, unsigned cb) {
    #pragma unroll
    for (int kk = 0; kk < W / 16; ++kk) {
        fa90_mma64(acc, make_desc(sa + (kk >> 2) * ca + (kk & 3) * 32u, 16u, 1024u), make_desc(sb + (kk >> 2) * cb + (kk & 3) * 32u, 16u, 1024u), kk > 0 ? 1 : 0);
    }
}
"#;

const DKDV: &str = r#"
// The 64-channel chunk of dQ that consumer cw adds at step it, or -1: at d = 128 chunk
// (it + cw) % 2 for each consumer every step, at d = 64 chunk 0 for consumer it % 2.
__device__ __forceinline__ int fa90_dq_chunk(i64 it, int cw) {
#if FA_D == 128
    return (int)((it + cw) & 1);
#else
    return (int)(it & 1) == cw ? 0 : -1;
#endif
}

// One bulk reduction of a staged 64 x 64 f32 dQ tile (at st) into its 16 KiB block of the
// accumulator (query rows i0.., channels 64c..).
__device__ __forceinline__ void fa90_dq_reduce(void* dqa_p, unsigned st, i64 bi, i64 h, i64 i0, int c) {
    float* blk = reinterpret_cast<float*>(dqa_p) + ((((bi * FA_HQ + h) * FA_NQT) + i0 / 64) * (FA_D / 64) + c) * 4096;
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], 16384;" :: "l"(blk), "r"(st) : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Adds a consumer's 64 x 64 f32 dQ tile (its step's query rows i0.., channels 64c..) into the
// accumulator at dqa_p. With FA_DQ_BULK: into the consumer's staging buffer st (once the bulk
// reduction of its previous tile has read it), then one bulk reduction into the tile's 16 KiB
// block (full L2 lines instead of 8-byte reductions), issued by the reducer warp with
// FA_DQ_WARP, else by the consumer's thread 0; row r's float pair p sits at pair p ^ 4 (r % 8)
// (r % 8 is g: conflict-free stores), which ACC_DQ undoes. Otherwise vector reductions
// straight from the registers.
__device__ __forceinline__ void fa90_dq_add(void* dqa_p, const float (&dq)[32], unsigned st, int tid, int cw, i64 bi, i64 h, i64 i0, i64 lq, int c) {
    const int w = tid >> 5, g = (tid & 31) >> 2, tg = tid & 3;
#if FA_DQ_BULK
#if FA_DQ_WARP
    // The reducer warp (warp 2) has read the buffer's previous tile.
    asm volatile("bar.sync %0, 160;" :: "r"(6 + cw) : "memory");
#else
    if (tid == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    asm volatile("bar.sync %0, 128;" :: "r"(2 + cw) : "memory");
#endif
    #pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const unsigned r = (unsigned)(w * 16 + g + hh * 8);
        #pragma unroll
        for (int n = 0; n < 8; ++n) {
            const unsigned p = (unsigned)((4 * n + tg) ^ (4 * g));
            asm volatile("st.shared.v2.f32 [%0], {%1, %2};" :: "r"(st + r * 256u + p * 8u), "f"(dq[4 * n + 2 * hh]), "f"(dq[4 * n + 2 * hh + 1]) : "memory");
        }
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#if FA_DQ_WARP
    // Staged: the reducer warp adds it.
    asm volatile("bar.arrive %0, 160;" :: "r"(4 + cw) : "memory");
    (void)dqa_p; (void)bi; (void)h; (void)i0; (void)c;
#else
    asm volatile("bar.sync %0, 128;" :: "r"(2 + cw) : "memory");
    if (tid == 0) fa90_dq_reduce(dqa_p, st, bi, h, i0, c);
#endif
    (void)lq;
#else
    #pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const i64 i = i0 + w * 16 + g + hh * 8;
        if (i < lq) {
            float* row = reinterpret_cast<float*>(dqa_p) + ((bi * FA_HQ + h) * FA_SQ + i) * FA_D + c * 64 + tg * 2;
            #pragma unroll
            for (int n = 0; n < 8; ++n) asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" :: "l"(row + n * 8), "f"(dq[4 * n + 2 * hh]), "f"(dq[4 * n + 2 * hh + 1]) : "memory");
        }
    }
    (void)st; (void)cw;
#endif
}

extern "C" __global__ void __launch_bounds__(384, 1) FA_ENTRY(const __grid_constant__ TmaMap tq, const __grid_constant__ TmaMap tdo, const __grid_constant__ TmaMap tk, const __grid_constant__ TmaMap tv, FA_PARAMS)
{
    extern __shared__ unsigned char fa_smem_raw[];
    const unsigned raw = smem_u32(fa_smem_raw);
    const unsigned base = (raw + 1023u) & ~1023u;
    constexpr unsigned K_BYTES = FA_BK * FA_D * 2, V_BYTES = FA_BK * FA_DV * 2, Q_BYTES = FA_BQ * FA_D * 2, O_BYTES = FA_BQ * FA_DV * 2;
    // With FA_ATOMIC_DQ, two buffers of dS^T (keys x queries) for dQ follow dO.
    constexpr unsigned DS_BYTES = FA_BK * FA_BQ * 2;
    // With FA_DQ_BULK, a 64 x 64 f32 dQ staging tile per consumer follows (16 KiB each).
    constexpr unsigned DQT_BYTES = 64 * 64 * 4;
    const unsigned sK = base, sV = sK + K_BYTES, sQ = sV + V_BYTES, sO = sQ + FA_QS * Q_BYTES, sDS = sO + FA_QS * O_BYTES, sDQ = sDS + FA_ATOMIC_DQ * 2 * DS_BYTES, bars = sDQ + FA_DQ_BULK * 2 * DQT_BYTES;
    (void)sDS;
    (void)sDQ;
    // Barriers: K/V; Q+dO full (TMA bytes and the 32 lanes that stage lse and D), empty.
    const unsigned kvbar = bars;
#define QFULL(s) (bars + 8u + 8u * (s))
#define QEMPTY(s) (bars + 8u + 8u * FA_QS + 8u * (s))
    // Step `it`'s q tile: upward from the first tile that sees the K/V tile, or, with FA_QREV
    // (causal masks), downward from the last, so that the CTAs of a head, which start at
    // different tiles, walk the same Q/dO tiles together (through L2) from the start.
#if FA_QREV
#define FA_QTILE(it) (qa + nq - 1 - (it) % nq)
#else
#define FA_QTILE(it) (qa + (it) % nq)
#endif
    float* sL = reinterpret_cast<float*>(fa_smem_raw + (bars + 64u - raw));
    float* sD = sL + FA_QS * FA_BQ;
FA_INIT
    const float* dbuf = reinterpret_cast<const float*>(dbuf_p);
    const int wg = threadIdx.x >> 7;
    i64 rank, kh, bi;
    fa90_work(rank, kh, bi);
    i64 lq, lkv;
    fa_lens(A, bi, lq, lkv);
    const i64 off = fa_diag_off(lq, lkv);
    const i64 j0 = rank * FA_BK;
    const i64 jmax = fa_min(j0 + FA_BK, lkv) - 1;
    // Query rows [ilo, ihi) that see some key of the tile.
    i64 ilo = 0, ihi = lq;
#if FA_CAUSAL
    ilo = fa_max(ilo, j0 - off);
#endif
#if FA_HAS_SWR
    ilo = fa_max(ilo, j0 - off - FA_SWR);
#endif
#if FA_HAS_SWL
    ihi = fa_min(ihi, jmax - off + FA_SWL + 1);
#endif
    (void)jmax;
    const bool any = j0 < lkv && ilo < ihi;
    const i64 qa = any ? ilo / FA_BQ : 0;
    const i64 nq = any ? (ihi + FA_BQ - 1) / FA_BQ - qa : 0;
    const i64 total = nq * FA_GROUP;
    if (threadIdx.x == 0) {
        mbar_init(kvbar, 1u);
        for (int s = 0; s < FA_QS; ++s) {
            mbar_init(QFULL(s), 33u);
            mbar_init(QEMPTY(s), 256u);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (wg == 0) {
        // The producer keeps 24 registers so that each consumer thread gets 240: with 232, at
        // d = 128 (dK, dV, S, dP and P or dS fragments live at once) ptxas serialized every
        // wgmma (C7512, each one waiting for the one before; bench/NOTES.md, session 16). Its
        // loops stay rolled (`unroll 1`) to fit.
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        if (warp == 0 && lane == 0 && any) {
            // K and V once; then Q and dO of step `it`: query head kh * GROUP + it / nq, q tile
            // FA_QTILE(it).
            mbar_expect_tx(kvbar, K_BYTES + V_BYTES);
            #pragma unroll
            for (int c = 0; c < FA_D / 64; ++c) fa90_tma(sK + c * (FA_BK * 128u), &tk, kvbar, c * 64, (int)j0, (int)kh, (int)bi);
            #pragma unroll
            for (int c = 0; c < FA_DV / 64; ++c) fa90_tma(sV + c * (FA_BK * 128u), &tv, kvbar, c * 64, (int)j0, (int)kh, (int)bi);
            #pragma unroll 1
            for (i64 it = 0; it < total; ++it) {
                const int s = (int)(it % FA_QS);
                const unsigned ph = (unsigned)(it / FA_QS) & 1u;
                const int h = (int)(kh * FA_GROUP + it / nq), i0 = (int)(FA_QTILE(it) * FA_BQ);
                mbar_wait(QEMPTY(s), ph ^ 1u);
                mbar_expect_tx(QFULL(s), Q_BYTES + O_BYTES);
                #pragma unroll
                for (int c = 0; c < FA_D / 64; ++c) fa90_tma(sQ + s * Q_BYTES + c * (FA_BQ * 128u), &tq, QFULL(s), c * 64, i0, h, (int)bi);
                #pragma unroll
                for (int c = 0; c < FA_DV / 64; ++c) fa90_tma(sO + s * O_BYTES + c * (FA_BQ * 128u), &tdo, QFULL(s), c * 64, i0, h, (int)bi);
            }
        } else if (warp == 1 && any) {
            // lse (log2 units) and D of each step's rows into shared memory.
            #pragma unroll 1
            for (i64 it = 0; it < total; ++it) {
                const int s = (int)(it % FA_QS);
                const unsigned ph = (unsigned)(it / FA_QS) & 1u;
                const i64 h = kh * FA_GROUP + it / nq, i0 = FA_QTILE(it) * FA_BQ;
                mbar_wait(QEMPTY(s), ph ^ 1u);
                for (int r = lane; r < FA_BQ; r += 32) {
                    const i64 i = i0 + r;
                    const bool ok = i < lq;
                    sL[s * FA_BQ + r] = ok ? (float)LD_STATS(stats_p, bi * ST_S0 + h * ST_S1 + i * ST_S2) * FA_LOG2E : 0.0f;
                    sD[s * FA_BQ + r] = ok ? dbuf[(bi * FA_HQ + h) * FA_SQ + i] : 0.0f;
                }
                mbar_arrive(QFULL(s));
            }
        }
#if FA_ATOMIC_DQ && FA_DQ_BULK && FA_DQ_WARP
        else if (warp == 2 && any) {
            // The dQ reducer: consumer cw's staged tile of each step in which it has one (both
            // every step at d = 128, consumer it % 2 at d = 64) added by one bulk reduction, its
            // buffer handed back once read (named barriers 4 + cw: staged, 6 + cw: free; none
            // after a consumer's last tile, so every barrier ends complete).
            constexpr int EVERY = FA_D == 128 ? 1 : 2;
            for (int cw = 0; cw < 2; ++cw) {
                if (total > (EVERY == 1 ? 0 : cw)) asm volatile("bar.arrive %0, 160;" :: "r"(6 + cw) : "memory");
            }
            #pragma unroll 1
            for (i64 it = 0; it < total; ++it) {
                const i64 h = kh * FA_GROUP + it / nq, i0 = FA_QTILE(it) * FA_BQ;
                for (int cw = 0; cw < 2; ++cw) {
                    const int c = fa90_dq_chunk(it, cw);
                    if (c < 0) continue;
                    asm volatile("bar.sync %0, 160;" :: "r"(4 + cw) : "memory");
                    if (lane == 0) {
                        fa90_dq_reduce(dqa_p, sDQ + cw * DQT_BYTES, bi, h, i0, c);
                        asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
                    }
                    __syncwarp();
                    if (it + EVERY < total) asm volatile("bar.arrive %0, 160;" :: "r"(6 + cw) : "memory");
                }
            }
            if (lane == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
        }
#endif
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
        const int cw = wg - 1, tid = threadIdx.x & 127, w = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
        // This warpgroup's keys jw0 .. jw0 + 63; this thread's jt and jt + 8.
        const i64 jw0 = j0 + cw * 64, jt = jw0 + w * 16 + g;
        float dk[FA_D / 2], dv[FA_DV / 2];
        #pragma unroll
        for (int x = 0; x < FA_D / 2; ++x) dk[x] = 0.0f;
        #pragma unroll
        for (int x = 0; x < FA_DV / 2; ++x) dv[x] = 0.0f;
        if (any) {
            const unsigned sk = sK + cw * 8192u, sv = sV + cw * 8192u;
            mbar_wait(kvbar, 0u);
            for (i64 it = 0; it < total; ++it) {
                const int s = (int)(it % FA_QS);
                const unsigned ph = (unsigned)(it / FA_QS) & 1u;
                const i64 h = kh * FA_GROUP + it / nq, i0 = FA_QTILE(it) * FA_BQ;
                const unsigned sq = sQ + s * Q_BYTES, so = sO + s * O_BYTES;
                const float* sLb = sL + s * FA_BQ;
                const float* sDb = sD + s * FA_BQ;
                mbar_wait(QFULL(s), ph);
                float sc[32], dp[32];
                u32 pa[4][4];
                // S^T = K Q^T, dP^T = V dO^T.
                wgmma_fence();
                fa90_block<FA_D>(sc, sk, FA_BK * 128u, sq, FA_BQ * 128u);
                wgmma_commit();
                fa90_block<FA_DV>(dp, sv, FA_BK * 128u, so, FA_BQ * 128u);
                wgmma_commit();
                wgmma_wait1();
                // P^T (key rows, query columns), while dP^T runs.
                const bool need = fa_tile_needs_mask(i0, FA_BQ, jw0, 64, lq, lkv, off);
                const unsigned keep = fa90_probs(A, sc, need, lq, lkv, off, bi, h,
                    [&](int n, int e) { return i0 + n * 8 + tg * 2 + (e & 1); },
                    [&](int n, int e) { (void)n; return jt + (e >> 1) * 8; },
                    [&](int n, int e) { return sLb[n * 8 + tg * 2 + (e & 1)]; });
                fa90_p_frags(pa, sc, keep);
                // dV += P^T dO (dO N-major: 64-channel chunks FA_BQ * 128 bytes apart).
                wgmma_fence();
                #pragma unroll
                for (int ks = 0; ks < FA_BQ / 16; ++ks) fa90_mma_dv(dv, pa[ks], make_desc(so + ks * 2048u, FA_BQ * 128u, 1024u));
                wgmma_commit();
                wgmma_wait1();
                // dS^T, then dK += dS^T Q.
                fa90_ds(dp, sc, keep, [&](int n, int e) { return sDb[n * 8 + tg * 2 + (e & 1)]; });
                u32 da[4][4];
                fa90_pack<64>(da, dp);
#if FA_ATOMIC_DQ
                // dS^T into this step's buffer: rows of 64 queries (128 bytes, swizzled as TMA's
                // 128-byte mode), this warpgroup's 64 keys after the other's: the M-major A
                // operand of dQ = dS K over the CTA's 128 keys. Row r's 16-byte chunk n sits at
                // chunk n ^ (r % 8), and r % 8 is g here.
                const unsigned sds = sDS + (unsigned)(it & 1) * DS_BYTES;
                #pragma unroll
                for (int n = 0; n < 8; ++n) {
                    #pragma unroll
                    for (int hh = 0; hh < 2; ++hh) {
                        const unsigned r = (unsigned)(cw * 64 + w * 16 + g + hh * 8);
                        asm volatile("st.shared.b32 [%0], %1;" :: "r"(sds + r * 128u + ((unsigned)(n ^ g) << 4) + tg * 4u), "r"(fa_pack(dp[4 * n + 2 * hh], dp[4 * n + 2 * hh + 1])) : "memory");
                    }
                }
                // Visible to wgmma (the async proxy), then to both consumers.
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
#if FA_ATOMIC_DQ && FA_SPLIT_DK
                // dK += dS^T Q in two halves around this step's dQ product (FlashAttention-3's
                // order), so that the tensor cores have work while this warpgroup waits at the
                // barrier and while it stages dQ: first half; barrier (both halves of dS^T
                // written); dQ += dS K for this warpgroup's 64-channel chunk (chunk c of step it
                // goes to consumer (it + c) % 2); second half; then dQ, complete (wait_group 1:
                // only the second half may still run), is added while that half runs. The dS^T
                // buffer is written again two steps later, after the next step's barrier, which
                // each warpgroup passes only once its dQ product here has completed.
                wgmma_fence();
                #pragma unroll
                for (int ks = 0; ks < FA_BQ / 32; ++ks) fa90_mma_d(dk, da[ks], make_desc(sq + ks * 2048u, FA_BQ * 128u, 1024u));
                wgmma_commit();
                asm volatile("bar.sync 1, 256;" ::: "memory");
                const int c = fa90_dq_chunk(it, cw);
                float dq[32];
                #pragma unroll
                for (int ks = 0; ks < FA_BK / 16; ++ks) fa90_mma_dq(dq, make_desc(sds + ks * 2048u, DS_BYTES, 1024u), make_desc(sK + c * (FA_BK * 128u) + ks * 2048u, FA_BK * 128u, 1024u), ks > 0 ? 1 : 0);
                wgmma_commit();
                #pragma unroll
                for (int ks = FA_BQ / 32; ks < FA_BQ / 16; ++ks) fa90_mma_d(dk, da[ks], make_desc(sq + ks * 2048u, FA_BQ * 128u, 1024u));
                wgmma_commit();
                wgmma_wait1();
                fa90_dq_add(dqa_p, dq, sDQ + cw * DQT_BYTES, tid, cw, bi, h, i0, lq, c);
                wgmma_wait0();
                mbar_arrive(QEMPTY(s));
#else
                wgmma_fence();
                #pragma unroll
                for (int ks = 0; ks < FA_BQ / 16; ++ks) fa90_mma_d(dk, da[ks], make_desc(sq + ks * 2048u, FA_BQ * 128u, 1024u));
                wgmma_commit();
#if FA_ATOMIC_DQ
                asm volatile("bar.sync 1, 256;" ::: "memory");
#endif
                wgmma_wait0();
                mbar_arrive(QEMPTY(s));
#if FA_ATOMIC_DQ
                // Without the split (d = 64, where FlashAttention-3's order was 16% slower:
                // bench/NOTES.md, session 15): this warpgroup's chunk of dQ += dS K, if it has one
                // at this step, after the barrier and the dK product. The buffer is written again
                // two steps later, after the next step's barrier, which this warpgroup passes only
                // once its product here has completed.
                const int c = fa90_dq_chunk(it, cw);
                if (c >= 0) {
                    float dq[32];
                    wgmma_fence();
                    #pragma unroll
                    for (int ks = 0; ks < FA_BK / 16; ++ks) fa90_mma_dq(dq, make_desc(sds + ks * 2048u, DS_BYTES, 1024u), make_desc(sK + c * (FA_BK * 128u) + ks * 2048u, FA_BK * 128u, 1024u), ks > 0 ? 1 : 0);
                    wgmma_commit();
                    wgmma_wait0();
                    fa90_dq_add(dqa_p, dq, sDQ + cw * DQT_BYTES, tid, cw, bi, h, i0, lq, c);
                }
#endif
#endif
            }
        }
#if FA_DQ_BULK && !FA_DQ_WARP
        if (tid == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#endif
        #pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const i64 j = jt + hh * 8;
            if (j < FA_SKV) {
                fa90_store_row<FA_D>([&](i64 at, float a, float b) { fa_store_dk(dk_p, at, a, b); }, bi * DK_S0 + kh * DK_S1 + j * DK_S2, DK_S3, dk, hh, tg, FA_SCALE);
                fa90_store_row<FA_DV>([&](i64 at, float a, float b) { fa_store_dv(dv_p, at, a, b); }, bi * DV_S0 + kh * DV_S1 + j * DV_S2, DV_S3, dv, hh, tg, 1.0f);
            }
        }
    }
#undef QFULL
#undef QEMPTY
#undef FA_QTILE
}
"#;

/// `D_i = dO_i . O_i` into f32 scratch 0 with 16-byte loads, FA_DV / 8 threads a row (O and
/// dO in the io type, rows 16-byte aligned); with FA_ZERO_ACC the same launch also zeroes the
/// atomic path's f32 dQ accumulator (16 bytes a thread).
const ROW_D_ZERO: &str = r#"
__device__ __forceinline__ float fa_dot_pair(u32 a, u32 b) {
#if FA_BF16
    return __uint_as_float(a << 16) * __uint_as_float(b << 16) + __uint_as_float(a & 0xffff0000u) * __uint_as_float(b & 0xffff0000u);
#else
    const float2 x = __half22float2(*reinterpret_cast<const __half2*>(&a)), y = __half22float2(*reinterpret_cast<const __half2*>(&b));
    return x.x * y.x + x.y * y.y;
#endif
}
extern "C" __global__ void __launch_bounds__(256) FA_ENTRY(void* dbuf_p, const void* o_p, const void* do_p, void* dqa_p)
{
    constexpr int TPR = FA_DV / 8;
    constexpr i64 TOTAL = FA_B * FA_HQ * FA_SQ * TPR;
    float* dbuf = reinterpret_cast<float*>(dbuf_p);
    const int lane = threadIdx.x & 31;
    const i64 nwarps = (i64)gridDim.x * (blockDim.x >> 5);
    // A warp takes 32 consecutive (row, 8 channels) items; TPR divides 32, so a row's threads
    // are one aligned group of lanes and the sum stays inside it.
    for (i64 w0 = ((i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * 32; w0 < TOTAL; w0 += nwarps * 32) {
        const i64 e = w0 + lane;
        float acc = 0.0f;
        if (e < TOTAL) {
            const i64 r = e / TPR, c = (e % TPR) * 8;
            const i64 i = r % FA_SQ, h = (r / FA_SQ) % FA_HQ, bi = r / (FA_SQ * FA_HQ);
            const uint4 o = __ldg(reinterpret_cast<const uint4*>(reinterpret_cast<const u16*>(o_p) + bi * OI_S0 + h * OI_S1 + i * OI_S2 + c));
            const uint4 g = __ldg(reinterpret_cast<const uint4*>(reinterpret_cast<const u16*>(do_p) + bi * DO_S0 + h * DO_S1 + i * DO_S2 + c));
            acc = fa_dot_pair(o.x, g.x) + fa_dot_pair(o.y, g.y) + fa_dot_pair(o.z, g.z) + fa_dot_pair(o.w, g.w);
        }
        #pragma unroll
        for (int s = TPR / 2; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);
        if (e < TOTAL && e % TPR == 0) dbuf[e / TPR] = acc;
    }
#if FA_ZERO_ACC
    fa90_zero_acc(dqa_p);
#else
    (void)dqa_p;
#endif
}
"#;

/// The f32 dQ accumulator of the atomic path zeroed (16 bytes a thread, grid-stride): in the D
/// launch ([`ROW_D_ZERO`]) or, where D has the general launch, alone ([`ZERO_ACC`]).
const ZERO_ACC_FN: &str = r#"
__device__ __forceinline__ void fa90_zero_acc(void* dqa_p) {
    GRID_STRIDE(e, FA_B * FA_HQ * FA_DQA_ROWS * FA_D / 4) {
        asm volatile("st.global.v4.u32 [%0], {%1, %1, %1, %1};" :: "l"(reinterpret_cast<float*>(dqa_p) + 4 * e), "r"(0u) : "memory");
    }
}
"#;

const ZERO_ACC: &str = "{ fa90_zero_acc(dqa_p); }\n";

/// dQ from the f32 accumulator (times the attention scale, which dS leaves out), four channels
/// (16 bytes of the accumulator) a thread.
const ACC_DQ: &str = r#"
{
    GRID_STRIDE(e, FA_B * FA_HQ * FA_SQ * (FA_D / 4)) {
        const i64 c = (e % (FA_D / 4)) * 4, r = e / (FA_D / 4);
        const i64 i = r % FA_SQ, h = (r / FA_SQ) % FA_HQ, bi = r / (FA_SQ * FA_HQ);
#if FA_DQ_BULK
        // Tiles of 64 rows x 64 channels, 16 KiB each, pairs swizzled by row (see the dK/dV
        // kernel); the swizzle flips pair bits 2 and up, so a 4-aligned channel group stays
        // together and in order.
        const i64 t = ((bi * FA_HQ + h) * FA_NQT + i / 64) * (FA_D / 64) + c / 64, rr = i % 64, pp = ((c % 64) / 2) ^ (4 * (rr % 8));
        const float* a = reinterpret_cast<const float*>(dqa_p) + t * 4096 + rr * 64 + pp * 2;
#else
        const float* a = reinterpret_cast<const float*>(dqa_p) + r * FA_D + c;
#endif
        const float4 v = __ldcs(reinterpret_cast<const float4*>(a));
        const i64 at = bi * DQ_S0 + h * DQ_S1 + i * DQ_S2 + c * DQ_S3;
        fa_store_dq(dq_p, at, v.x * FA_SCALE, v.y * FA_SCALE);
        fa_store_dq(dq_p, at + 2 * DQ_S3, v.z * FA_SCALE, v.w * FA_SCALE);
    }
}
"#;

const DQ: &str = r#"
extern "C" __global__ void __launch_bounds__(384, 1) FA_ENTRY(const __grid_constant__ TmaMap tq, const __grid_constant__ TmaMap tdo, const __grid_constant__ TmaMap tk, const __grid_constant__ TmaMap tv, FA_PARAMS)
{
    extern __shared__ unsigned char fa_smem_raw[];
    const unsigned base = (smem_u32(fa_smem_raw) + 1023u) & ~1023u;
    constexpr unsigned Q_BYTES = FA_BM * FA_D * 2, O_BYTES = FA_BM * FA_DV * 2, K_BYTES = FA_BN * FA_D * 2, V_BYTES = FA_BN * FA_DV * 2;
    const unsigned sQ = base, sO = sQ + Q_BYTES, sK = sO + O_BYTES, sV = sK + 2 * K_BYTES, bars = sV + 2 * V_BYTES;
    // Barriers: Q+dO; K+V full and empty (two stages).
    const unsigned qbar = bars;
#define KFULL(s) (bars + 8u + 8u * (s))
#define KEMPTY(s) (bars + 24u + 8u * (s))
FA_INIT
    const float* dbuf = reinterpret_cast<const float*>(dbuf_p);
    const int wg = threadIdx.x >> 7;
    i64 rank, h, bi;
    fa90_work(rank, h, bi);
    const i64 qt = (i64)gridDim.x - 1 - rank, kh = h / FA_GROUP;
    i64 lq, lkv;
    fa_lens(A, bi, lq, lkv);
    const i64 off = fa_diag_off(lq, lkv);
    const i64 q0 = qt * FA_BM;
    int t0, t1;
    const bool any = fa90_key_tiles(q0, FA_BM, FA_BN, lq, lkv, off, t0, t1);
    if (threadIdx.x == 0) {
        mbar_init(qbar, 1u);
        for (int s = 0; s < 2; ++s) {
            mbar_init(KFULL(s), 1u);
            mbar_init(KEMPTY(s), 256u);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (wg == 0) {
        // 24 / 240 registers as in the dK/dV kernel (with 232, ptxas serialized the wgmmas of
        // the ALiBi variant).
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
        if (threadIdx.x == 0 && any) {
            mbar_expect_tx(qbar, Q_BYTES + O_BYTES);
            #pragma unroll
            for (int c = 0; c < FA_D / 64; ++c) fa90_tma(sQ + c * (FA_BM * 128u), &tq, qbar, c * 64, (int)q0, (int)h, (int)bi);
            #pragma unroll
            for (int c = 0; c < FA_DV / 64; ++c) fa90_tma(sO + c * (FA_BM * 128u), &tdo, qbar, c * 64, (int)q0, (int)h, (int)bi);
            #pragma unroll 1
            for (int t = t0; t < t1; ++t) {
                const int s = (t - t0) & 1;
                const unsigned ph = ((t - t0) >> 1) & 1;
                mbar_wait(KEMPTY(s), ph ^ 1u);
                mbar_expect_tx(KFULL(s), K_BYTES + V_BYTES);
                #pragma unroll
                for (int c = 0; c < FA_D / 64; ++c) fa90_tma(sK + s * K_BYTES + c * (FA_BN * 128u), &tk, KFULL(s), c * 64, t * FA_BN, (int)kh, (int)bi);
                #pragma unroll
                for (int c = 0; c < FA_DV / 64; ++c) fa90_tma(sV + s * V_BYTES + c * (FA_BN * 128u), &tv, KFULL(s), c * 64, t * FA_BN, (int)kh, (int)bi);
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
        const int cw = wg - 1, tid = threadIdx.x & 127, w = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
        const i64 wq0 = q0 + cw * 64, r0 = wq0 + w * 16 + g;
        // lse (log2 units) and D of rows r0 and r0 + 8.
        float lse2[2], dd[2];
        #pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const i64 i = r0 + hh * 8;
            const bool ok = i < lq;
            lse2[hh] = ok ? (float)LD_STATS(stats_p, bi * ST_S0 + h * ST_S1 + i * ST_S2) * FA_LOG2E : 0.0f;
            dd[hh] = ok ? dbuf[(bi * FA_HQ + h) * FA_SQ + i] : 0.0f;
        }
        float dq[FA_D / 2];
        #pragma unroll
        for (int x = 0; x < FA_D / 2; ++x) dq[x] = 0.0f;
        if (any) {
            const unsigned sq = sQ + cw * 8192u, so = sO + cw * 8192u;
            mbar_wait(qbar, 0u);
            for (int t = t0; t < t1; ++t) {
                const int s = (t - t0) & 1;
                const unsigned ph = ((t - t0) >> 1) & 1;
                const i64 j0 = (i64)t * FA_BN;
                const unsigned sk = sK + s * K_BYTES, sv = sV + s * V_BYTES;
                mbar_wait(KFULL(s), ph);
                float sc[32], dp[32];
                // S = Q K^T, dP = dO V^T.
                wgmma_fence();
                fa90_block<FA_D>(sc, sq, FA_BM * 128u, sk, FA_BN * 128u);
                wgmma_commit();
                fa90_block<FA_DV>(dp, so, FA_BM * 128u, sv, FA_BN * 128u);
                wgmma_commit();
                wgmma_wait1();
                const bool need = fa_tile_needs_mask(wq0, 64, j0, FA_BN, lq, lkv, off);
                const unsigned keep = fa90_probs(A, sc, need, lq, lkv, off, bi, h,
                    [&](int n, int e) { (void)n; return r0 + (e >> 1) * 8; },
                    [&](int n, int e) { return j0 + n * 8 + tg * 2 + (e & 1); },
                    [&](int n, int e) { (void)n; return lse2[e >> 1]; });
                wgmma_wait0();
                fa90_ds(dp, sc, keep, [&](int n, int e) { (void)n; return dd[e >> 1]; });
                u32 da[4][4];
                fa90_pack<64>(da, dp);
                // dQ += dS K (K N-major: 64-channel chunks FA_BN * 128 bytes apart).
                wgmma_fence();
                #pragma unroll
                for (int ks = 0; ks < FA_BN / 16; ++ks) fa90_mma_d(dq, da[ks], make_desc(sk + ks * 2048u, FA_BN * 128u, 1024u));
                wgmma_commit();
                wgmma_wait0();
                mbar_arrive(KEMPTY(s));
            }
        }
        #pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const i64 i = r0 + hh * 8;
            if (i < FA_SQ) {
                fa90_store_row<FA_D>([&](i64 at, float a, float b) { fa_store_dq(dq_p, at, a, b); }, bi * DQ_S0 + h * DQ_S1 + i * DQ_S2, DQ_S3, dq, hh, tg, FA_SCALE);
            }
        }
    }
#undef KFULL
#undef KEMPTY
}
"#;

/// The dK/dV kernel's shared memory with `qs` stages of Q and dO (and their lse and D rows), and
/// with `atomic` the dS^T buffers (and the dQ staging tiles of the bulk reductions).
fn dkdv_shared(p: &Problem, atomic: bool, qs: i64) -> usize {
    let ds = if atomic { 2 * KV_BK * KV_BQ * 2 } else { 0 } + if atomic && dq_bulk() { 2 * 64 * 64 * 4 } else { 0 };
    (KV_BK * (p.d + p.d_v) * 2 + qs * KV_BQ * (p.d + p.d_v) * 2 + ds + 2 * qs * KV_BQ * 4) as usize + 1024 + 64
}

/// Stages of Q and dO in the dK/dV kernel: three keep more loads in flight while the two
/// consumers hold a stage for a whole step (measured on the H100 against two: +5% on the causal
/// backward, the same elsewhere; `FERRODNN_ATTN_BWD_QS=2` to compare).
const KV_QS: i64 = 3;

fn kv_qs() -> i64 {
    std::env::var("FERRODNN_ATTN_BWD_QS").ok().and_then(|v| v.parse().ok()).filter(|q| (2..=3).contains(q)).unwrap_or(KV_QS)
}

/// Whether the atomic path adds dQ by bulk reductions of staged tiles (measured on the H100,
/// bench/NOTES.md session 13: +7% at b4h16s4096d128, +13% at b16h16s1024d64 over vector
/// reductions; `FERRODNN_ATTN_DQ_BULK=0` turns it off to compare).
fn dq_bulk() -> bool {
    !super::switched_off("FERRODNN_ATTN_DQ_BULK")
}

/// Whether a reducer warp of the producer warpgroup issues the atomic path's bulk reductions
/// (the consumers only stage their tiles and signal; measured on the H100, bench/NOTES.md
/// session 15: +3-4% on every backward row over the consumers issuing them;
/// `FERRODNN_ATTN_DQ_WARP=0` turns it off to compare).
fn dq_warp() -> bool {
    !super::switched_off("FERRODNN_ATTN_DQ_WARP")
}

/// Whether the atomic path at d = 128 issues each step's dQ product between the two halves of
/// the dK product (FlashAttention-3's order; `FERRODNN_ATTN_BWD_SPLIT_DK=0` issues it after the
/// whole dK product, as at d = 64, to compare).
fn split_dk() -> bool {
    !super::switched_off("FERRODNN_ATTN_BWD_SPLIT_DK")
}

/// Whether the `D` launch reads O and dO 16 bytes at a time: both in the io type with rows
/// 16-byte aligned (dO's alignment is a condition of these kernels already; O's base pointer is
/// then checked at execution, see `unit`).
fn d_vec(p: &Problem, ports: &Ports) -> bool {
    [ports.o, ports.d_o].iter().all(|&t| p.vec_ok(t) && p.graph.resolved_data_type(t) == Some(p.dt)) && p.d_v % 8 == 0
}

fn dq_shared(p: &Problem) -> usize {
    (Q_BM * (p.d + p.d_v) * 2 + 2 * Q_BN * (p.d + p.d_v) * 2) as usize + 1024 + 64
}

/// The launches: `D`, then either the dQ and dK/dV kernels (deterministic), or (`atomic`) the
/// dK/dV kernel adding each step's dS K into a zeroed f32 accumulator and a last pass that
/// writes dQ from it.
fn generate(p: &Problem, ports: &Ports, atomic: bool, qs: i64) -> Option<NodeKernels> {
    let c = p.common(true);
    // The atomic path's dQ by bulk reductions of 64 x 64 tiles: the accumulator is then tiled,
    // with rows padded to whole tiles.
    let bulk = atomic && dq_bulk();
    let nqt = (p.s_q + 63) / 64;
    let acc_rows = if bulk { nqt * 64 } else { p.s_q };
    let base = bwd::base_defines(p, ports, &c, Dbias::None, true)
        + &hopper::heavy_first(p)
        + &format!(
            "#define FA_DQ_BULK {}\n#define FA_NQT {nqt}LL\n#define FA_DQA_ROWS {acc_rows}LL\n#define FA_DQ_WARP {}\n#define FA_SPLIT_DK {}\n",
            bulk as i32,
            dq_warp() as u8,
            (p.d == 128 && split_dk()) as u8
        );
    let init = fa_init(&c);
    let common = format!(
        "{}{}{}{}{}{SCORES}",
        hopper::helpers(),
        hopper::wgmma_ss(p, "fa90_mma64", 64),
        hopper::wgmma_rs(p, "fa90_mma_d", p.d),
        hopper::wgmma_rs(p, "fa90_mma_dv", p.d_v),
        if atomic { hopper::wgmma_ss_major(p, "fa90_mma_dq", 64, true) } else { String::new() }
    );
    let maps = |rows_q: i64, rows_k: i64| {
        vec![
            Arg::TensorMap(Box::new(tma_of(p, p.q, rows_q))),
            Arg::TensorMap(Box::new(tma_of(p, ports.d_o, rows_q))),
            Arg::TensorMap(Box::new(tma_of(p, p.k, rows_k))),
            Arg::TensorMap(Box::new(tma_of(p, p.v, rows_k))),
        ]
    };
    let kernel = |defs: String, stores: String, what: &str, params: Vec<String>, body: &str, grid: (i64, i64, i64), shared: usize| {
        let entry = p.entry(what);
        let body = body.replace("FA_INIT", &init).replace("FA_ENTRY", &entry).replace("FA_PARAMS", &params.join(", "));
        let source = format!("{defs}{HELPERS}{stores}{common}{body}");
        if grid.0 > i32::MAX as i64 {
            return None;
        }
        Some(Launch {
            source,
            entry,
            grid: Grid::Exact(grid.0 as u32, grid.1 as u32, grid.2 as u32),
            block: 384,
            shared_bytes: shared as u32,
            args: Vec::new(),
            cluster: None,
            pdl: Pdl::Dependent,
        })
    };
    let mut inputs = vec!["const void* dbuf_p".to_string(), "const void* stats_p".to_string()];
    inputs.extend(c.params.iter().cloned());
    let mut input_args = vec![Arg::Scratch(0), Arg::Ptr(ports.stats)];
    input_args.extend(c.args.iter().cloned());

    let dq_store = p.output_store("dq", "DQ", ports.dq, p.pair_ok(ports.dq));
    let rows = (p.b * p.h_q * p.s_q) as usize;
    let mut scratch = vec![rows.max(1) * 4];
    let acc_elems = (p.b * p.h_q * acc_rows * p.d) as u64;
    if atomic {
        scratch.push(acc_elems as usize * 4);
    }

    // D, with 16-byte loads where O allows them (dO does, see `unit`), zeroing the atomic
    // path's accumulator in the same launch; else the general D kernel and a zeroing launch.
    let mut launches = Vec::new();
    if d_vec(p, ports) {
        let defs = format!("{base}{}#define FA_ZERO_ACC {}\n", bwd::strides_def(p, "OI", ports.o), atomic as u8);
        let entry = p.entry("attn_bwd_d_sm90");
        let source = format!("{defs}{HELPERS}{ZERO_ACC_FN}{}", ROW_D_ZERO.replace("FA_ENTRY", &entry));
        let mut args = vec![Arg::Scratch(0), Arg::Ptr(ports.o), Arg::Ptr(ports.d_o)];
        args.push(if atomic { Arg::Scratch(1) } else { Arg::Scratch(0) });
        let threads = (rows as u64 * (p.d_v / 8) as u64).max(if atomic { acc_elems / 4 } else { 0 });
        launches.push(Launch { source, entry, grid: Grid::Cover(threads), block: 256, shared_bytes: 0, args, cluster: None, pdl: Pdl::Dependent });
    } else {
        if atomic {
            launches.push(bwd::launch(p, &base, ZERO_ACC_FN, "attn_bwd_dq_zero_sm90", &["void* dqa_p".into()], vec![Arg::Scratch(1)], ZERO_ACC, None, acc_elems / 4, 256, 0)?);
        }
        launches.push(bwd::d_launch(p, ports, &base, true)?);
    }

    // dQ (deterministic).
    if !atomic {
        let dq_defs = format!("{base}#define FA_BM {Q_BM}\n#define FA_BN {Q_BN}\n");
        let mut params = vec!["void* dq_p".to_string()];
        params.extend(inputs.iter().cloned());
        let mut dq = kernel(dq_defs, dq_store.clone(), "attn_bwd_dq_sm90", params, DQ, ((p.s_q + Q_BM - 1) / Q_BM, p.h_q, p.b), dq_shared(p))?;
        dq.args = maps(Q_BM, Q_BN);
        dq.args.push(Arg::Ptr(ports.dq));
        dq.args.extend(input_args.iter().cloned());
        launches.push(dq);
    }

    // dK, dV (and the dQ products with `atomic`).
    // Causal masks walk the q tiles downward (`FA_QTILE`; `FERRODNN_ATTN_QREV=0` turns it off).
    let qrev = p.attrs.causal.is_some() && !super::switched_off("FERRODNN_ATTN_QREV");
    let kv_defs = format!("{base}#define FA_BK {KV_BK}\n#define FA_BQ {KV_BQ}\n#define FA_ATOMIC_DQ {}\n#define FA_QS {qs}\n#define FA_QREV {}\n", atomic as i32, qrev as u8);
    let kv_store = format!("{}{}", p.output_store("dk", "DK", ports.dk, p.pair_ok(ports.dk)), p.output_store("dv", "DV", ports.dv, p.pair_ok(ports.dv)));
    let mut params = vec!["void* dk_p".to_string(), "void* dv_p".to_string()];
    if atomic {
        params.push("void* dqa_p".to_string());
    }
    params.extend(inputs);
    let what = if atomic { "attn_bwd_dkdv_dq_sm90" } else { "attn_bwd_dkdv_sm90" };
    let mut kv = kernel(kv_defs, kv_store, what, params, DKDV, ((p.s_kv + KV_BK - 1) / KV_BK, p.h_kv, p.b), dkdv_shared(p, atomic, qs))?;
    kv.args = maps(KV_BQ, KV_BK);
    kv.args.extend([Arg::Ptr(ports.dk), Arg::Ptr(ports.dv)]);
    if atomic {
        kv.args.push(Arg::Scratch(1));
    }
    kv.args.extend(input_args);
    launches.push(kv);

    if atomic {
        launches.push(bwd::launch(
            p,
            &base,
            &dq_store,
            "attn_bwd_dq_acc_sm90",
            &["void* dq_p".into(), "const void* dqa_p".into()],
            vec![Arg::Ptr(ports.dq), Arg::Scratch(1)],
            ACC_DQ,
            None,
            rows as u64 * (p.d / 4) as u64,
            256,
            0,
        )?);
    }
    Some(NodeKernels { launches, scratch })
}

/// The Hopper unit of a backward node without dbias, when these kernels take it; the general
/// kernels with element-wise loads are the alternative for base pointers TMA cannot take.
pub(super) fn unit(p: &Problem, target: &Target, options: &Options) -> Option<Unit> {
    let node = p.node;
    let ports = Ports {
        o: node.input("o")?,
        d_o: node.input("do")?,
        stats: node.input("stats")?,
        dq: node.output("dq")?,
        dk: node.output("dk")?,
        dv: node.output("dv")?,
        dbias: node.output("dbias"),
    };
    if !target.hopper() || ports.dbias.is_some() || !hopper::takes(p, &[p.q, p.k, p.v, ports.d_o]) {
        return None;
    }
    // dQ by float atomics in the dK/dV pass when the plan allows them (the `atomics` knob) and
    // they pay.
    let atomic = options.atomics && super::atomic_dq_pays(p.attrs);
    let qs = kv_qs();
    if dq_shared(p).max(dkdv_shared(p, atomic, qs)) > 227 * 1024 {
        return None;
    }
    let kernels = generate(p, &ports, atomic, qs)?;
    let alternative = bwd::generate(p, &ports, Dbias::None, false)?;
    let mut tensors = vec![p.q, p.k, p.v, ports.d_o];
    if d_vec(p, &ports) {
        tensors.push(ports.o);
    }
    tensors.extend([ports.dq, ports.dk, ports.dv].into_iter().filter(|&t| p.pair_ok(t)));
    Some(Unit { nodes: vec![p.ni], kernels, writes: node.outputs.iter().map(|x| x.tensor).collect(), unaligned: Some(Box::new(Unaligned { tensors, kernels: alternative })) })
}
