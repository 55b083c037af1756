//! The Hopper forward kernel: FlashAttention-3's recipe on `wgmma`, TMA and warp specialization.
//!
//! One CTA (384 threads) per SM over the work list of (q tile of 128 rows, query head, batch)
//! items, heaviest first (with a causal mask, those of four heads at a time: `fa90_work_at`),
//! taking every `gridDim.x`-th item or, with items of unequal sizes or long ones, the next one by
//! ticket ([`persistent`], [`dynamic`], [`KERNEL_PERSIST`]; one CTA per item, [`KERNEL`], to
//! compare). Without a mask, long items (more than 16 K/V tiles) past the last whole round
//! are split along the keys into one contiguous range of tiles per CTA, each segment's
//! partial O, row maxima and sums stored in scratch and the item combined by the CTA that
//! completes it ([`split`], FA_SPLIT):
//! - warpgroup 0, the producer, gives its registers back (`setmaxnreg.dec`); one thread loads
//!   the Q tile once and then the K and V tiles of 128 keys with TMA into three stages each
//!   (two where shared memory holds no more; 128-byte swizzle), K and V on separate "full" /
//!   "empty" mbarriers so that the next K tile streams in as soon as its stage's scores are
//!   computed;
//! - warpgroups 1 and 2, the consumers, each own 64 query rows. S = Q K^T is one chain of
//!   `wgmma.m64n128k16` with both operands in shared memory (K-major), or, under a causal
//!   mask, Q's fragments loaded into registers once (`ldmatrix`); O += P V takes P from
//!   registers (the f32 score accumulators rounded to the io type already sit in wgmma's A
//!   fragment layout) and V from shared memory (N-major, the transpose flag). Inside a
//!   warpgroup the two products are pipelined: tile t's scores are issued together with tile
//!   t-1's P V, and the online softmax of tile t runs while that P V is on the tensor cores;
//!   O is rescaled once the P V is done. The two consumers take turns on the tensor cores
//!   (ping-pong), except in the persistent kernel at d = 64, which runs faster without. The
//!   softmax sits on each consumer's critical path, so its row maxima and sums are trees, not
//!   chains (measured on the H100, bench/NOTES.md session 15: +2-5% on every forward row).
//!
//! The softmax, masks, bias, ALiBi and dropout are those of the general kernel ([`super::fwd`])
//! on the wgmma accumulator layout (thread `l` of warp `w` holds rows `16w + l/4` and `+8`,
//! columns `8n + 2(l%4)` and `+1`). Taken for head dims 64 and 128 (q/k and v), q, k and v with
//! TMA-compatible strides (contiguous head dim, other strides multiples of 16 bytes), no page
//! table and no padding mask (TMA would read K/V rows past a sequence's length; the general
//! kernel zero-fills them), `s_q > 64`. Base pointers that are not 16-byte aligned run the
//! general kernel (the unit's `unaligned` alternative).

use super::hopper::{self, tma_of};
use super::{fa_init, Problem, HELPERS};
use crate::engine::cuda::kernel::ctype::st;
use crate::engine::cuda::kernel::{Arg, Grid, Launch, NodeKernels, Pdl, Target, Unaligned, Unit};

/// Query rows per CTA (two consumer warpgroups of 64).
const BM: i64 = 128;
/// Keys per K/V tile.
const BN: i64 = 128;

/// Dynamic shared memory: Q (two buffers when persistent), `kvs` stages of K and of V, 1 KiB of
/// alignment slack, barriers (and, when persistent, the two Q buffers' unit numbers and the
/// split tail's flag).
fn shared_bytes(p: &Problem, persist: bool, kvs: i64) -> usize {
    let (q, bars) = if persist { (2, 4 * kvs + 4 + 3) } else { (1, 4 * kvs + 1) };
    (q * BM * p.d * 2 + kvs * BN * p.d * 2 + kvs * BN * p.d_v * 2 + bars * 8) as usize + 1024
}

/// K/V stages: three where shared memory allows (measured on the H100, bench/NOTES.md session
/// 17: +3% at b16h16s1024d64, +1% on the causal rows against two; four gained nothing), else
/// two. `FERRODNN_ATTN_KVS=2` / `4` to compare.
fn kv_stages(p: &Problem, persist: bool) -> i64 {
    let want = std::env::var("FERRODNN_ATTN_KVS").ok().and_then(|v| v.parse().ok()).filter(|k| (2..=4).contains(k)).unwrap_or(3);
    (2..=want).rev().find(|&k| shared_bytes(p, persist, k) <= 227 * 1024).unwrap_or(2)
}

/// Whether the forward runs persistent ([`KERNEL_PERSIST`]), overlapping each item's O stores
/// and first loads with its neighbours' work: everywhere (measured on the H100, bench/NOTES.md
/// sessions 13 and 18: b16h16s1024d64 +10-12%, b4h16s4096d128 +1.5% and the causal rows +1-4%
/// with items by ticket, see [`dynamic`]). `FERRODNN_ATTN_PERSIST=0` runs one CTA per item (the
/// one-item kernel, [`KERNEL`]) to compare.
fn persistent(_p: &Problem) -> bool {
    !super::switched_off("FERRODNN_ATTN_PERSIST")
}

/// Whether the persistent kernel's CTAs take their items by ticket (an atomic counter in scratch,
/// zeroed by a launch before), in list order, instead of every `gridDim.x`-th item: where items
/// differ in size (a causal mask, a window), or are long (more than 16 K/V tiles:
/// b4h16s4096d128 674-675 TFLOP/s by ticket against 664-675 with the fixed assignment and
/// 657-667 with one CTA per item; short uniform items keep the fixed assignment, which needs no
/// launch before). With the fixed assignment and unequal items, CTAs that started on heavy items
/// fall behind the others, the items in flight spread over many heads, and their K/V tiles miss
/// L2 (ncu, bench/NOTES.md session 18: b4h16s4096d128 causal read 1.12 GB from DRAM instead of
/// 0.20, L2 hits 52% instead of 86%, SMs active 411 K to 1136 K cycles); by ticket the items in
/// flight are the next `gridDim.x` of the list, as with one CTA per item.
/// `FERRODNN_ATTN_DYNAMIC=0` / `=1` turns it off / on everywhere to compare.
fn dynamic(p: &Problem) -> bool {
    match std::env::var("FERRODNN_ATTN_DYNAMIC").as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        _ => !super::unmasked(p.attrs) || (p.s_kv + BN - 1) / BN > 16,
    }
}

/// The split tail of the persistent kernel (FA_SPLIT): `nfull` items in whole rounds of `g`
/// CTAs, then the `tail` items left, of `t` K/V tiles each, cut into `g` contiguous ranges of
/// tiles (a CTA's range holds at most two segments of items), each segment's partial O, row
/// maxima and sums stored in scratch and the item combined by the CTA that completes its
/// count.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Split {
    nfull: i64,
    tail: i64,
    t: i64,
    g: i64,
}

/// Whether, and how, the persistent kernel splits its last round: without a mask or window
/// (items of equal size), for long items (more than 16 K/V tiles), where that round leaves
/// CTAs idle, when the longest range plus a tile of overhead is at most 4/5 of an item.
/// b4h16s4096d128 has 2048 items of 32 tiles for 132 SMs, 15.5 rounds: the last 68 items as
/// ranges of at most 17 tiles (measured on the H100, bench/NOTES.md session 19: 681 TFLOP/s
/// against 656-671 unsplit). Short items lose: b16h16s1024d64 (8 tiles, ranges of at most 5)
/// ran 385-390 split against 431-437. `FERRODNN_ATTN_SPLIT=0` turns it off, `=1` splits any
/// partial last round, to compare.
fn split(p: &Problem, nt: i64, sms: i64) -> Option<Split> {
    let t = (p.s_kv + BN - 1) / BN;
    let (g, tail) = (sms.max(1), nt % sms.max(1));
    if !super::unmasked(p.attrs) || t < 2 || tail == 0 {
        return None;
    }
    let longest = (tail * t + g - 1) / g;
    let pays = match std::env::var("FERRODNN_ATTN_SPLIT").as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        _ => t > 16 && 5 * (longest + 1) <= 4 * t,
    };
    pays.then_some(Split { nfull: nt - tail, tail, t, g })
}

const BODY: &str = r#"
// The max (MAX) or sum of row hh (0: g, 1: g + 8) of a thread's score accumulators (columns
// 8n + 2t, +1 at 4n + 2hh, +1), pairwise.
template <bool MAX>
__device__ __forceinline__ float fa90_row_tree(const float (&sc)[FA_BN / 2], int hh) {
    float a[FA_BN / 8];
    #pragma unroll
    for (int n = 0; n < FA_BN / 8; ++n) a[n] = MAX ? fmaxf(sc[4 * n + 2 * hh], sc[4 * n + 2 * hh + 1]) : sc[4 * n + 2 * hh] + sc[4 * n + 2 * hh + 1];
    static_assert(FA_BN == 128, "four levels below the pairs");
#define FA_TREE_LEVEL(W) _Pragma("unroll") for (int i = 0; i < (W); ++i) a[i] = MAX ? fmaxf(a[i], a[i + (W)]) : a[i] + a[i + (W)];
    FA_TREE_LEVEL(8)
    FA_TREE_LEVEL(4)
    FA_TREE_LEVEL(2)
    FA_TREE_LEVEL(1)
#undef FA_TREE_LEVEL
    return a[0];
}

// Scores of one K/V tile (keys j0..j0+BN-1) for this thread's rows r0 and r0 + 8: to log2
// units, masked, bias and ALiBi added; the running max and sum updated (alpha: the factor O
// must be rescaled by); sc left holding P (dropout applied).
__device__ __forceinline__ void fa90_softmax(const FaIn& A, float (&sc)[FA_BN / 2], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                             i64 r0, i64 wq0, i64 j0, i64 lq, i64 lkv, i64 off, i64 bi, i64 h, int tg) {
#if FA_WHOLE_TILES
    // No mask, and no partial q or K/V tile: known here, where the persistent kernel's split
    // tail leaves the compiler no bound on j0 (with the check, the d = 64 loop ran 7% more
    // instructions).
    const bool need = false;
    (void)wq0; (void)j0; (void)lq; (void)lkv; (void)off;
#else
    const bool need = fa_tile_needs_mask(wq0, 64, j0, FA_BN, lq, lkv, off);
#endif
    // Blocks with nothing to mask or add keep the raw scores: the row max is taken on them
    // (the scale is positive) and the scale goes into the exponent's fused multiply-add, one
    // multiply an element fewer.
    const bool raw = !(need || FA_HAS_BIAS || FA_ALIBI) && FA_SCALE_LOG2 > 0.0f;
    if (need || FA_HAS_BIAS || FA_ALIBI) {
        #pragma unroll
        for (int n = 0; n < FA_BN / 8; ++n) {
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                const i64 i = r0 + (e >> 1) * 8;
                const i64 j = j0 + n * 8 + tg * 2 + (e & 1);
                float x = sc[4 * n + e] * FA_SCALE_LOG2;
                if (need && !fa_visible(i, j, lq, lkv, off)) x = FA_NINF;
#if FA_HAS_BIAS || FA_ALIBI
                else x = fmaf(fa_add(A, bi, h, i, j), FA_LOG2E, x);
#endif
                sc[4 * n + e] = x;
            }
        }
    } else if (!raw) {
        #pragma unroll
        for (int n = 0; n < FA_BN / 2; ++n) sc[n] *= FA_SCALE_LOG2;
    }
    // Row maxima and sums as trees (depth 5 over a row's 32 elements instead of a chain of 32:
    // the softmax sits on each warpgroup's critical path).
    float mx[2] = {fa90_row_tree<true>(sc, 0), fa90_row_tree<true>(sc, 1)};
    if (!raw) {
        mx[0] = fmaxf(mx[0], m[0]);
        mx[1] = fmaxf(mx[1], m[1]);
    }
    float mu[2];
    const float sm = raw ? FA_SCALE_LOG2 : 1.0f;
    #pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 1));
        mx[hh] = fmaxf(mx[hh], __shfl_xor_sync(0xffffffffu, mx[hh], 2));
        if (raw) mx[hh] = fmaxf(m[hh], mx[hh] * FA_SCALE_LOG2);
        // A row with every key masked so far keeps max -inf: exponentiate against 0.
        mu[hh] = mx[hh] == FA_NINF ? 0.0f : mx[hh];
        alpha[hh] = fa_exp2(m[hh] - mu[hh]);
        m[hh] = mx[hh];
        l[hh] *= alpha[hh];
    }
    #pragma unroll
    for (int x = 0; x < FA_BN / 2; ++x) sc[x] = fa_exp2(fmaf(sc[x], sm, -mu[(x >> 1) & 1]));
    l[0] += fa90_row_tree<false>(sc, 0);
    l[1] += fa90_row_tree<false>(sc, 1);
#if FA_DROPOUT
    // Dropped elements leave the sum (taken before dropout) but not the output.
    #pragma unroll
    for (int n = 0; n < FA_BN / 8; ++n) {
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
            if (sc[4 * n + e] != 0.0f && !fa_keep(A, bi, h, r0 + (e >> 1) * 8, j0 + n * 8 + tg * 2 + (e & 1))) sc[4 * n + e] = 0.0f;
        }
    }
#endif
    (void)A; (void)bi; (void)h;
}

// O *= alpha (the rows' factors after a tile's softmax). Always: skipping it where no row of the
// warp has a new max (a vote, one branch per warp) was 2-6% slower (bench/NOTES.md, session 15).
__device__ __forceinline__ void fa90_rescale(float (&o)[FA_DV / 2], const float (&alpha)[2]) {
    #pragma unroll
    for (int n = 0; n < FA_DV / 8; ++n) {
        o[4 * n] *= alpha[0]; o[4 * n + 1] *= alpha[0];
        o[4 * n + 2] *= alpha[1]; o[4 * n + 3] *= alpha[1];
    }
}

// S = Q K^T for this warpgroup's 64 rows: Q rows at sq (d-chunks of 64 are 128 * 128 bytes
// apart), K tile at sk (chunks BN * 128 bytes apart); 16 channels (32 bytes) per k step.
__device__ __forceinline__ void fa90_scores(float (&sc)[FA_BN / 2], unsigned sq, unsigned sk) {
    #pragma unroll
    for (int kk = 0; kk < FA_D / 16; ++kk) {
        fa90_wgmma_s(sc, make_desc(sq + (kk >> 2) * (FA_BM * 128u) + (kk & 3) * 32u, 16u, 1024u),
                     make_desc(sk + (kk >> 2) * (FA_BN * 128u) + (kk & 3) * 32u, 16u, 1024u), kk > 0 ? 1 : 0);
    }
}

#if FA_QREG
// This warpgroup's Q rows (at sq, as fa90_scores reads them) as wgmma A fragments, one set of
// four registers per k step of 16 channels: ldmatrix.x4, lane L giving row 16w + L % 8 +
// 8 ((L / 8) % 2) at channel 8 (L / 16) of the step (16-byte units swizzled by the row).
__device__ __forceinline__ void fa90_q_frags(u32 (&qf)[FA_D / 16][4], unsigned sq, int w, int lane) {
    const int mi = lane >> 3, row = w * 16 + (lane & 7) + 8 * (mi & 1);
    #pragma unroll
    for (int kk = 0; kk < FA_D / 16; ++kk) {
        const unsigned unit = (unsigned)(((kk & 3) * 2 + (mi >> 1)) ^ (row & 7));
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(qf[kk][0]), "=r"(qf[kk][1]), "=r"(qf[kk][2]), "=r"(qf[kk][3])
                     : "r"(sq + (kk >> 2) * (FA_BM * 128u) + row * 128u + unit * 16u));
    }
}

// S = Q K^T with Q from registers (`fa90_q_frags`).
__device__ __forceinline__ void fa90_scores_r(float (&sc)[FA_BN / 2], const u32 (&qf)[FA_D / 16][4], unsigned sk) {
    #pragma unroll
    for (int kk = 0; kk < FA_D / 16; ++kk) fa90_wgmma_sr(sc, qf[kk], make_desc(sk + (kk >> 2) * (FA_BN * 128u) + (kk & 3) * 32u, 16u, 1024u), kk > 0 ? 1 : 0);
}
#define FA_SCORES(sc, sk) fa90_scores_r(sc, qf, sk)
#else
#define FA_SCORES(sc, sk) fa90_scores(sc, sq, sk)
#endif

// O += P V: V tile at sv, N-major (rows of 64 channels, 128 bytes; 64-channel chunks BN * 128
// bytes apart); 16 keys (2048 bytes) per k step.
__device__ __forceinline__ void fa90_pv(float (&o)[FA_DV / 2], const u32 (&pf)[FA_BN / 16][4], unsigned sv) {
    #pragma unroll
    for (int kt = 0; kt < FA_BN / 16; ++kt) fa90_wgmma_o(o, pf[kt], make_desc(sv + kt * 2048u, FA_BN * 128u, 1024u));
}

#if FA_SPLIT
// The split tail (FA_SPLIT, persistent kernel): the items past the whole rounds, FA_NFULL..,
// of FA_T K/V tiles each, FA_TAILW tiles in all, cut into FA_G contiguous ranges, CTA c taking
// tiles [lo(c), lo(c + 1)) of that list. A range is shorter than an item, so it holds at most
// two segments (the end of one item, the start of the next): units FA_NFULL + c and
// FA_NFULL + FA_G + c.
__device__ __forceinline__ i64 fa90_tail_lo(i64 c) { return c * FA_TAILW / FA_G; }
// The CTA whose range holds tile x of the list (the last c with lo(c) <= x).
__device__ __forceinline__ i64 fa90_tail_owner(i64 x) { return ((x + 1) * FA_G - 1) / FA_TAILW; }
// Unit u's tiles [x0, x1) of the list (empty when x0 >= x1).
__device__ __forceinline__ void fa90_tail_unit(i64 u, i64& x0, i64& x1) {
    const i64 lo = fa90_tail_lo(blockIdx.x), hi = fa90_tail_lo(blockIdx.x + 1), e = (lo / FA_T + 1) * FA_T;
    const bool first = u - FA_NFULL < FA_G;
    x0 = first ? lo : e;
    x1 = first ? fa_min(hi, e) : hi;
}

// A segment of split item ti done: consumer thread t's (0..255) unnormalized O, row maxima and
// sums into the unit's slot of `part` (float j of thread t at j * 256 + t); the CTA whose
// segment completes the item's count (`cnt`, zeroed by a launch before) then reads every
// segment, in the order of their CTAs (so the result does not depend on which came last),
// and leaves the item's O, maxima and sums in o, m and l for the store. Returns whether this
// CTA is that one. The flag at `flag` (shared) carries the count's answer to every consumer.
__device__ __forceinline__ bool fa90_tail_part(float* part, unsigned* cnt, unsigned flag, i64 u, i64 ti, float (&o)[FA_DV / 2], float (&m)[2], float (&l)[2], int t) {
    constexpr int NV = FA_DV / 2 + 4;
    const i64 x0 = ti * FA_T, ca = fa90_tail_owner(x0), cb = fa90_tail_owner(x0 + FA_T - 1);
    // Slot 2c + 1 when CTA c's range starts before the item (the item is its second segment).
    auto slot = [&](i64 c) { return part + (2 * c + (fa90_tail_lo(c) < x0 ? 1 : 0)) * (NV * 256) + t; };
    float* mine = part + (2 * (i64)blockIdx.x + (u - FA_NFULL >= FA_G ? 1 : 0)) * (NV * 256) + t;
    #pragma unroll
    for (int x = 0; x < FA_DV / 2; ++x) mine[x * 256] = o[x];
    mine[(FA_DV / 2) * 256] = m[0];
    mine[(FA_DV / 2 + 1) * 256] = m[1];
    mine[(FA_DV / 2 + 2) * 256] = l[0];
    mine[(FA_DV / 2 + 3) * 256] = l[1];
    // The consumers' stores ordered (by the barrier, then one thread's device-scope fence,
    // which is cumulative) before that thread counts the segment; on the other side, the count
    // read before a fence, and the barrier, before any consumer reads the other segments.
    asm volatile("bar.sync 3, 256;" ::: "memory");
    if (t == 0) {
        unsigned segs = 0;
        for (i64 c = ca; c <= cb; ++c) segs += fa90_tail_lo(c) < fa90_tail_lo(c + 1) ? 1u : 0u;
        __threadfence();
        const unsigned last = atomicAdd(cnt + ti, 1u) == segs - 1u ? 1u : 0u;
        __threadfence();
        asm volatile("st.shared.u32 [%0], %1;" :: "r"(flag), "r"(last) : "memory");
    }
    asm volatile("bar.sync 3, 256;" ::: "memory");
    unsigned last;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(last) : "r"(flag) : "memory");
    if (!last) return false;
    // Reads through L2 (__ldcg): the other segments were written by other SMs.
    float mx[2] = {FA_NINF, FA_NINF};
    for (i64 c = ca; c <= cb; ++c) {
        if (fa90_tail_lo(c) >= fa90_tail_lo(c + 1)) continue;
        const float* p = slot(c);
        mx[0] = fmaxf(mx[0], __ldcg(p + (FA_DV / 2) * 256));
        mx[1] = fmaxf(mx[1], __ldcg(p + (FA_DV / 2 + 1) * 256));
    }
    #pragma unroll
    for (int x = 0; x < FA_DV / 2; ++x) o[x] = 0.0f;
    l[0] = 0.0f;
    l[1] = 0.0f;
    for (i64 c = ca; c <= cb; ++c) {
        if (fa90_tail_lo(c) >= fa90_tail_lo(c + 1)) continue;
        const float* p = slot(c);
        // A row with every key of the segment masked (max -inf) adds nothing.
        float f[2];
        #pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const float ms = __ldcg(p + (FA_DV / 2 + hh) * 256);
            f[hh] = ms == FA_NINF ? 0.0f : fa_exp2(ms - mx[hh]);
            l[hh] = fmaf(__ldcg(p + (FA_DV / 2 + 2 + hh) * 256), f[hh], l[hh]);
        }
        #pragma unroll
        for (int x = 0; x < FA_DV / 2; ++x) o[x] = fmaf(__ldcg(p + x * 256), f[(x >> 1) & 1], o[x]);
    }
    m[0] = mx[0];
    m[1] = mx[1];
    return true;
}
#endif

// Ping-pong between the two consumer warpgroups (FA_PINGPONG): warpgroup cw issues its matrix
// products only in its turn (named barrier 1 + cw) and then hands the turn to the other
// (barrier 2 - cw), so one's softmax runs while the other's products occupy the tensor cores.
__device__ __forceinline__ void fa90_turn_begin(int cw) {
#if FA_PINGPONG
    asm volatile("bar.sync %0, 256;" :: "r"(1 + cw) : "memory");
#else
    (void)cw;
#endif
}
__device__ __forceinline__ void fa90_turn_end(int cw, bool pass) {
#if FA_PINGPONG
    if (pass) asm volatile("bar.arrive %0, 256;" :: "r"(2 - cw) : "memory");
#else
    (void)cw; (void)pass;
#endif
}

"#;

const KERNEL: &str = r#"extern "C" __global__ void __launch_bounds__(384, 1) FA_ENTRY(const __grid_constant__ TmaMap tq, const __grid_constant__ TmaMap tk, const __grid_constant__ TmaMap tv, FA_PARAMS)
{
    extern __shared__ unsigned char fa_smem_raw[];
    const unsigned base = (smem_u32(fa_smem_raw) + 1023u) & ~1023u;
    constexpr unsigned Q_BYTES = FA_BM * FA_D * 2, K_BYTES = FA_BN * FA_D * 2, V_BYTES = FA_BN * FA_DV * 2;
    const unsigned sQ = base, sK = sQ + Q_BYTES, sV = sK + FA_KVS * K_BYTES, bars = sV + FA_KVS * V_BYTES;
    // Barriers: Q; K full, V full, K empty, V empty (FA_KVS stages each).
    const unsigned qbar = bars;
#define KFULL(s) (bars + 8u + 8u * (s))
#define VFULL(s) (bars + 8u + 8u * FA_KVS + 8u * (s))
#define KEMPTY(s) (bars + 8u + 16u * FA_KVS + 8u * (s))
#define VEMPTY(s) (bars + 8u + 24u * FA_KVS + 8u * (s))
FA_INIT
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
        for (int s = 0; s < FA_KVS; ++s) {
            mbar_init(KFULL(s), 1u);
            mbar_init(VFULL(s), 1u);
            mbar_init(KEMPTY(s), 256u);
            mbar_init(VEMPTY(s), 256u);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (wg == 0) {
        // Producer: Q once, then K and V of each tile into stage (t - t0) % FA_KVS.
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
        if (threadIdx.x == 0 && any) {
            asm volatile("prefetch.tensormap [%0];" :: "l"(&tk) : "memory");
            asm volatile("prefetch.tensormap [%0];" :: "l"(&tv) : "memory");
            mbar_expect_tx(qbar, Q_BYTES);
            #pragma unroll
            for (int c = 0; c < FA_D / 64; ++c) fa90_tma(sQ + c * (FA_BM * 128u), &tq, qbar, c * 64, (int)q0, (int)h, (int)bi);
            for (int t = t0; t < t1; ++t) {
                const int s = (t - t0) % FA_KVS;
                const unsigned ph = ((t - t0) / FA_KVS) & 1;
                mbar_wait(KEMPTY(s), ph ^ 1u);
                mbar_expect_tx(KFULL(s), K_BYTES);
                #pragma unroll
                for (int c = 0; c < FA_D / 64; ++c) fa90_tma(sK + s * K_BYTES + c * (FA_BN * 128u), &tk, KFULL(s), c * 64, t * FA_BN, (int)kh, (int)bi);
                mbar_wait(VEMPTY(s), ph ^ 1u);
                mbar_expect_tx(VFULL(s), V_BYTES);
                #pragma unroll
                for (int c = 0; c < FA_DV / 64; ++c) fa90_tma(sV + s * V_BYTES + c * (FA_BN * 128u), &tv, VFULL(s), c * 64, t * FA_BN, (int)kh, (int)bi);
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
        const int cw = wg - 1, tid = threadIdx.x & 127, w = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
        const i64 wq0 = q0 + cw * 64;
        const i64 r0 = wq0 + w * 16 + g;
        const unsigned sq = sQ + cw * 8192u;
        float m[2] = {FA_NINF, FA_NINF};
        float l[2] = {0.0f, 0.0f};
        float o[FA_DV / 2];
        #pragma unroll
        for (int i = 0; i < FA_DV / 2; ++i) o[i] = 0.0f;
        if (any) {
            float sc[FA_BN / 2];
            u32 pf[FA_BN / 16][4];
            float alpha[2];
            // Turns: one per tile (its scores with the previous tile's P V) and one for the
            // last P V; warpgroup 0 goes first, and warpgroup 1 does not pass its last turn on
            // (no turn of warpgroup 0 follows it).
#if FA_PINGPONG
            if (cw == 1) asm volatile("bar.arrive 1, 256;" ::: "memory");
#endif
            mbar_wait(qbar, 0u);
#if FA_QREG
            u32 qf[FA_D / 16][4];
            fa90_q_frags(qf, sq, w, lane);
#endif
            // Tile t0: scores, softmax, P.
            mbar_wait(KFULL(0), 0u);
            fa90_turn_begin(cw);
            wgmma_fence();
            FA_SCORES(sc, sK);
            wgmma_commit();
            fa90_turn_end(cw, true);
            wgmma_wait0();
            mbar_arrive(KEMPTY(0));
            fa90_softmax(A, sc, m, l, alpha, r0, wq0, (i64)t0 * FA_BN, lq, lkv, off, bi, h, tg);
            fa90_pack<FA_BN>(pf, sc);
            for (int t = t0 + 1; t < t1; ++t) {
                const int s = (t - t0) % FA_KVS, ps = (t - 1 - t0) % FA_KVS;
                const unsigned ph = ((t - t0) / FA_KVS) & 1, pph = ((t - 1 - t0) / FA_KVS) & 1;
                // Issue tile t's scores and tile t-1's P V together.
                mbar_wait(KFULL(s), ph);
                mbar_wait(VFULL(ps), pph);
                fa90_turn_begin(cw);
                wgmma_fence();
                FA_SCORES(sc, sK + s * K_BYTES);
                wgmma_commit();
                fa90_pv(o, pf, sV + ps * V_BYTES);
                wgmma_commit();
                fa90_turn_end(cw, true);
                // Scores done (the P V may still run): free K, softmax while P V runs.
                wgmma_wait1();
                mbar_arrive(KEMPTY(s));
                fa90_softmax(A, sc, m, l, alpha, r0, wq0, (i64)t * FA_BN, lq, lkv, off, bi, h, tg);
                wgmma_wait0();
                mbar_arrive(VEMPTY(ps));
                fa90_rescale(o, alpha);
                fa90_pack<FA_BN>(pf, sc);
            }
            {
                const int s = (t1 - 1 - t0) % FA_KVS;
                const unsigned ph = ((t1 - 1 - t0) / FA_KVS) & 1;
                mbar_wait(VFULL(s), ph);
                fa90_turn_begin(cw);
                wgmma_fence();
                fa90_pv(o, pf, sV + s * V_BYTES);
                wgmma_commit();
                fa90_turn_end(cw, cw == 0);
                wgmma_wait0();
                mbar_arrive(VEMPTY(s));
            }
        }
        // Normalize and store; empty rows (padded, or every key masked) give o = 0, stats = +inf.
        #pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            float lsum = l[hh];
            lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
            lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
            const i64 i = r0 + hh * 8;
            const bool empty = i >= lq || m[hh] == FA_NINF || !(lsum > 0.0f);
            const float inv = empty ? 0.0f : FA_KEEP_SCALE / lsum;
            if (i < FA_SQ) {
                fa90_store_row<FA_DV>([&](i64 at, float a, float b) { fa_store_o(o_p, at, a, b); }, bi * O_S0 + h * O_S1 + i * O_S2, O_S3, o, hh, tg, inv);
#if FA_HAS_STATS
                if (tg == 0) ST_STATS(stats_p, bi * ST_S0 + h * ST_S1 + i * ST_S2, empty ? (double)FA_INF : (double)(m[hh] * FA_LN2 + logf(lsum)));
#endif
            }
        }
    }
#undef KFULL
#undef VFULL
#undef KEMPTY
#undef VEMPTY
}
"#;

/// The persistent form of [`KERNEL`]: one CTA per SM takes the work items `blockIdx.x`,
/// `+ gridDim.x`, ... of the (q tile, head, batch) list (heaviest first: `fa90_work_at`), or
/// (`FA_DYNAMIC`) its first item by its index and then the next item of the list by ticket (an
/// atomic counter: `gridDim.x` plus the ticket), which the producer writes beside the item's Q
/// buffer for the consumers (a number past the list ends both); Q has two buffers, so the
/// producer loads the next tile's Q and first K/V tiles while the consumers still finish the
/// current tile and store its O, and the K/V ring runs on across tiles. The per-tile steps are
/// those of [`KERNEL`]. Both kernels stay: the work-list form with a grid of one CTA per item ran
/// b4h16s4096d128 3% slower than [`KERNEL`] (bench/NOTES.md, session 13).
const KERNEL_PERSIST: &str = r#"extern "C" __global__ void __launch_bounds__(384, 1) FA_ENTRY(const __grid_constant__ TmaMap tq, const __grid_constant__ TmaMap tk, const __grid_constant__ TmaMap tv, FA_PARAMS)
{
    extern __shared__ unsigned char fa_smem_raw[];
    const unsigned base = (smem_u32(fa_smem_raw) + 1023u) & ~1023u;
    constexpr unsigned Q_BYTES = FA_BM * FA_D * 2, K_BYTES = FA_BN * FA_D * 2, V_BYTES = FA_BN * FA_DV * 2;
    const unsigned sQ = base, sK = sQ + 2 * Q_BYTES, sV = sK + FA_KVS * K_BYTES, bars = sV + FA_KVS * V_BYTES;
    // Barriers: K full, V full, K empty, V empty (FA_KVS stages each), Q full, Q empty (two).
#define KFULL(s) (bars + 8u * (s))
#define VFULL(s) (bars + 8u * FA_KVS + 8u * (s))
#define KEMPTY(s) (bars + 16u * FA_KVS + 8u * (s))
#define VEMPTY(s) (bars + 24u * FA_KVS + 8u * (s))
#define QFULL(s) (bars + 32u * FA_KVS + 8u * (s))
#define QEMPTY(s) (bars + 32u * FA_KVS + 16u + 8u * (s))
    // The unit numbers of the two Q buffers (FA_DYNAMIC), and whether this CTA combines a split
    // item (FA_SPLIT).
    const unsigned ITEMS = bars + 32u * FA_KVS + 32u, FLAG = ITEMS + 16u;
    (void)FLAG;
FA_INIT
    const int wg = threadIdx.x >> 7;
    // The work list: FA_QT q tiles x FA_HQ heads x FA_B batches.
    // Item l's q tile, head, batch, key range and K/V tiles.
    struct Item { i64 q0, h, bi, lq, lkv, off; int t0, t1; bool any; };
    auto item = [&](i64 l) {
        Item it;
        i64 rank;
        fa90_work_at(l, FA_QT, FA_HQ, (i64)FA_HQ * FA_B, rank, it.h, it.bi);
        it.q0 = (FA_QT - 1 - rank) * FA_BM;
        fa_lens(A, it.bi, it.lq, it.lkv);
        it.off = fa_diag_off(it.lq, it.lkv);
        it.any = fa90_key_tiles(it.q0, FA_BM, FA_BN, it.lq, it.lkv, it.off, it.t0, it.t1);
        return it;
    };
    // Unit u: item u with all its K/V tiles [ta, tb), or (FA_SPLIT, u >= FA_NFULL) this CTA's
    // segment of tail item ti: `part` when the item has others, `none` when the segment is empty.
    struct Unit { Item it; int ta, tb; i64 ti; bool part, none; };
    auto unit = [&](i64 u) {
        Unit w;
#if FA_SPLIT
        if (u >= FA_NFULL) {
            i64 x0, x1;
            fa90_tail_unit(u, x0, x1);
            w.none = x0 >= x1;
            w.ti = w.none ? 0 : x0 / FA_T;
            w.it = item(FA_NFULL + w.ti);
            w.ta = w.it.t0 + (int)(x0 - w.ti * FA_T);
            w.tb = w.none ? w.ta : w.ta + (int)(x1 - x0);
            w.part = x1 - x0 < FA_T;
            return w;
        }
#endif
        w.it = item(u);
        w.ta = w.it.t0;
        w.tb = w.it.t1;
        w.ti = 0;
        w.part = false;
        w.none = false;
        return w;
    };
    if (threadIdx.x == 0) {
        for (int s = 0; s < FA_KVS; ++s) {
            mbar_init(KFULL(s), 1u);
            mbar_init(VFULL(s), 1u);
            mbar_init(KEMPTY(s), 256u);
            mbar_init(VEMPTY(s), 256u);
        }
        for (int s = 0; s < 2; ++s) {
            mbar_init(QFULL(s), 1u);
            mbar_init(QEMPTY(s), 256u);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (wg == 0) {
        // Producer: per unit (an item, or a segment of one), Q into buffer n % 2 (n: the CTA's
        // unit count), then K and V of each of its tiles into stage c % FA_KVS (c: the CTA's K/V
        // tile count). The consumers' setmaxnreg.inc takes only what the producer gives back
        // from the CTA's launch allocation (168 x 384 = 128 x 24 + 256 x 240): asking for more
        // never returns.
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
        if (threadIdx.x == 0) {
            asm volatile("prefetch.tensormap [%0];" :: "l"(&tq) : "memory");
            asm volatile("prefetch.tensormap [%0];" :: "l"(&tk) : "memory");
            asm volatile("prefetch.tensormap [%0];" :: "l"(&tv) : "memory");
            int n = 0, c = 0;
            // (The fixed assignment keeps the loop's form `u < FA_NU; u += gridDim.x`: as an
            // endless loop with a break, ptxas moved the loop's addresses off the uniform datapath
            // and the persistent d64 forward ran 4.5% slower, bench/NOTES.md session 18.)
#if FA_DYNAMIC
            i64 u = -1;
            for (;; ++n) {
                const int qs = n & 1;
                mbar_wait(QEMPTY(qs), ((unsigned)(n >> 1) & 1u) ^ 1u);
                // The CTA's first item by its index, the next ones by ticket (then, FA_SPLIT, its
                // tail segments that are not empty); the consumers read the unit's number beside
                // Q's buffer, and a number past the units ends them.
                const bool whole = u < FA_NFULL;
                u = n == 0 ? (i64)blockIdx.x : whole ? (i64)gridDim.x + (i64)atomicAdd(fa_ticket, 1u) : u + gridDim.x;
#if FA_SPLIT
                if (u >= FA_NFULL) {
                    if (whole) u = FA_NFULL + blockIdx.x;
                    while (u < FA_NU && unit(u).none) u += gridDim.x;
                }
#endif
                *(volatile i64*)(fa_smem_raw + (ITEMS + 8u * qs - smem_u32(fa_smem_raw))) = u;
                if (u >= FA_NU) {
                    mbar_arrive(QFULL(qs));
                    break;
                }
#else
            for (i64 u = blockIdx.x; u < FA_NU; u += gridDim.x, ++n) {
                const int qs = n & 1;
#endif
                const Unit un = unit(u);
#if FA_SPLIT && !FA_DYNAMIC
                if (un.none) {
                    --n;
                    continue;
                }
#endif
#if !FA_DYNAMIC
                mbar_wait(QEMPTY(qs), ((unsigned)(n >> 1) & 1u) ^ 1u);
#endif
                const Item& it = un.it;
                mbar_expect_tx(QFULL(qs), Q_BYTES);
                #pragma unroll
                for (int ch = 0; ch < FA_D / 64; ++ch) fa90_tma(sQ + qs * Q_BYTES + ch * (FA_BM * 128u), &tq, QFULL(qs), ch * 64, (int)it.q0, (int)it.h, (int)it.bi);
                const int kh = (int)(it.h / FA_GROUP);
                for (int t = un.ta; t < un.tb; ++t, ++c) {
                    const int s = c % FA_KVS;
                    const unsigned ph = ((unsigned)c / FA_KVS) & 1u;
                    mbar_wait(KEMPTY(s), ph ^ 1u);
                    mbar_expect_tx(KFULL(s), K_BYTES);
                    #pragma unroll
                    for (int ch = 0; ch < FA_D / 64; ++ch) fa90_tma(sK + s * K_BYTES + ch * (FA_BN * 128u), &tk, KFULL(s), ch * 64, t * FA_BN, kh, (int)it.bi);
                    mbar_wait(VEMPTY(s), ph ^ 1u);
                    mbar_expect_tx(VFULL(s), V_BYTES);
                    #pragma unroll
                    for (int ch = 0; ch < FA_DV / 64; ++ch) fa90_tma(sV + s * V_BYTES + ch * (FA_BN * 128u), &tv, VFULL(s), ch * 64, t * FA_BN, kh, (int)it.bi);
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
        const int cw = wg - 1, tid = threadIdx.x & 127, w = tid >> 5, lane = tid & 31, g = lane >> 2, tg = lane & 3;
        float sc[FA_BN / 2];
        u32 pf[FA_BN / 16][4];
        float alpha[2];
#if FA_QREG
        u32 qf[FA_D / 16][4];
#endif
        // Turns as in the one-item kernel, started afresh for each item with keys.
        int n = 0, c = 0;
#if FA_DYNAMIC
        for (;; ++n) {
            mbar_wait(QFULL(n & 1), (unsigned)(n >> 1) & 1u);
            const i64 u = *(volatile i64*)(fa_smem_raw + (ITEMS + 8u * (n & 1) - smem_u32(fa_smem_raw)));
            if (u >= FA_NU) break;
#else
        for (i64 u = blockIdx.x; u < FA_NU; u += gridDim.x, ++n) {
#endif
            const Unit un = unit(u);
#if FA_SPLIT && !FA_DYNAMIC
            if (un.none) {
                --n;
                continue;
            }
#endif
            const Item& it = un.it;
            const i64 q0 = it.q0, h = it.h, bi = it.bi, lq = it.lq, lkv = it.lkv, off = it.off;
            const int t0 = un.ta, t1 = un.tb;
            const i64 wq0 = q0 + cw * 64;
            const i64 r0 = wq0 + w * 16 + g;
            const int qs = n & 1;
            const unsigned sq = sQ + qs * Q_BYTES + cw * 8192u;
            float m[2] = {FA_NINF, FA_NINF};
            float l2[2] = {0.0f, 0.0f};
            float o[FA_DV / 2];
            #pragma unroll
            for (int i = 0; i < FA_DV / 2; ++i) o[i] = 0.0f;
#if !FA_DYNAMIC
            mbar_wait(QFULL(qs), (unsigned)(n >> 1) & 1u);
#endif
#if FA_QREG
            fa90_q_frags(qf, sq, w, lane);
#endif
            if (it.any) {
#if FA_PINGPONG
                if (cw == 1) asm volatile("bar.arrive 1, 256;" ::: "memory");
#endif
                // Tile t0: scores, softmax, P.
                {
                    const int s = c % FA_KVS;
                    mbar_wait(KFULL(s), ((unsigned)c / FA_KVS) & 1u);
                    fa90_turn_begin(cw);
                    wgmma_fence();
                    FA_SCORES(sc, sK + s * K_BYTES);
                    wgmma_commit();
                    fa90_turn_end(cw, true);
                    wgmma_wait0();
                    mbar_arrive(KEMPTY(s));
                    fa90_softmax(A, sc, m, l2, alpha, r0, wq0, (i64)t0 * FA_BN, lq, lkv, off, bi, h, tg);
                    fa90_pack<FA_BN>(pf, sc);
                }
                for (int t = t0 + 1; t < t1; ++t) {
                    const int cc = c + (t - t0), s = cc % FA_KVS, ps = (cc - 1) % FA_KVS;
                    const unsigned ph = ((unsigned)cc / FA_KVS) & 1u, pph = ((unsigned)(cc - 1) / FA_KVS) & 1u;
                    // Issue tile t's scores and tile t-1's P V together.
                    mbar_wait(KFULL(s), ph);
                    mbar_wait(VFULL(ps), pph);
                    fa90_turn_begin(cw);
                    wgmma_fence();
                    FA_SCORES(sc, sK + s * K_BYTES);
                    wgmma_commit();
                    fa90_pv(o, pf, sV + ps * V_BYTES);
                    wgmma_commit();
                    fa90_turn_end(cw, true);
                    // Scores done (the P V may still run): free K, softmax while P V runs.
                    wgmma_wait1();
                    mbar_arrive(KEMPTY(s));
                    fa90_softmax(A, sc, m, l2, alpha, r0, wq0, (i64)t * FA_BN, lq, lkv, off, bi, h, tg);
                    wgmma_wait0();
                    mbar_arrive(VEMPTY(ps));
                    fa90_rescale(o, alpha);
                    fa90_pack<FA_BN>(pf, sc);
                }
                {
                    const int cc = c + (t1 - 1 - t0), s = cc % FA_KVS;
                    mbar_wait(VFULL(s), ((unsigned)cc / FA_KVS) & 1u);
                    fa90_turn_begin(cw);
                    wgmma_fence();
                    fa90_pv(o, pf, sV + s * V_BYTES);
                    wgmma_commit();
                    fa90_turn_end(cw, cw == 0);
                    wgmma_wait0();
                    mbar_arrive(VEMPTY(s));
                }
                c += t1 - t0;
            }
            // Q is no longer read: its buffer takes item n + 2.
            mbar_arrive(QEMPTY(qs));
#if FA_SPLIT
            // A segment of a split item: stored for the CTA that completes the item.
            if (un.part && !fa90_tail_part(fa_part, fa_ticket + 1, FLAG, u, un.ti, o, m, l2, cw * 128 + tid)) continue;
#endif
            // Normalize and store; empty rows (padded, or every key masked) give o = 0, stats = +inf.
            #pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                float lsum = l2[hh];
                lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
                lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
                const i64 i = r0 + hh * 8;
                const bool empty = i >= lq || m[hh] == FA_NINF || !(lsum > 0.0f);
                const float inv = empty ? 0.0f : FA_KEEP_SCALE / lsum;
                if (i < FA_SQ) {
                    fa90_store_row<FA_DV>([&](i64 at, float a, float b) { fa_store_o(o_p, at, a, b); }, bi * O_S0 + h * O_S1 + i * O_S2, O_S3, o, hh, tg, inv);
#if FA_HAS_STATS
                    if (tg == 0) ST_STATS(stats_p, bi * ST_S0 + h * ST_S1 + i * ST_S2, empty ? (double)FA_INF : (double)(m[hh] * FA_LN2 + logf(lsum)));
#endif
                }
            }
        }
    }
#undef KFULL
#undef VFULL
#undef KEMPTY
#undef VEMPTY
#undef QFULL
#undef QEMPTY
}
"#;

/// Whether the consumers take turns (FA_PINGPONG): yes at d = 128 (measured on the H100,
/// bench/NOTES.md sessions 17 and 18: without, b4h16s4096d128 1-3% slower in both kernels), not
/// in the persistent kernel at d = 64 (b16h16s1024d64 +5% without, 421.6-422.6 against
/// 394.2-401.9 TFLOP/s). `FERRODNN_ATTN_PINGPONG=0` / `=1` turns it off / on everywhere to
/// compare.
fn pingpong(p: &Problem, persist: bool) -> bool {
    match std::env::var("FERRODNN_ATTN_PINGPONG").as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        _ => !(persist && p.d == 64),
    }
}

/// Whether the scores take Q from registers (`fa90_q_frags`) instead of shared memory, which
/// spares the K/V tiles' shared-memory reads a fifth of their traffic: under a causal mask
/// (measured on the H100, bench/NOTES.md session 17: +2-3% on both causal rows, -1% on
/// b4h16s4096d128). `FERRODNN_ATTN_QREG=0` / `=1` turns it off / on everywhere to compare.
fn qreg(p: &Problem) -> bool {
    match std::env::var("FERRODNN_ATTN_QREG").as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        _ => p.attrs.causal.is_some(),
    }
}

fn generate(p: &Problem, target: &Target) -> Option<NodeKernels> {
    let node = p.node;
    let o = node.output("o")?;
    let stats = node.output("stats");
    let c = p.common(true);
    let mut defs = c.defines.clone() + &hopper::heavy_first(p);
    let persist = persistent(p);
    let whole_tiles = super::unmasked(p.attrs) && p.s_q % BM == 0 && p.s_kv % BN == 0;
    defs += &format!("#define FA_WHOLE_TILES {}\n", whole_tiles as u8);
    defs += &format!("#define FA_BM {BM}\n#define FA_BN {BN}\n#define FA_HAS_STATS {}\n#define FA_PINGPONG {}\n", if stats.is_some() { 1 } else { 0 }, pingpong(p, persist) as u8);
    let stores = p.output_store("o", "O", o, p.pair_ok(o));
    let mut params = vec!["void* o_p".to_string()];
    let (tq, tk, tv) = (tma_of(p, p.q, BM), tma_of(p, p.k, BN), tma_of(p, p.v, BN));
    let mut args = vec![Arg::TensorMap(Box::new(tq)), Arg::TensorMap(Box::new(tk)), Arg::TensorMap(Box::new(tv)), Arg::Ptr(o)];
    if let Some(s) = stats {
        let sd = p.graph.desc(s);
        defs += &format!("#define ST_STATS {}\n#define ST_S0 {}LL\n#define ST_S1 {}LL\n#define ST_S2 {}LL\n", st(p.graph, s), sd.strides[0], sd.strides[1], sd.strides[2]);
        params.push("void* stats_p".into());
        args.push(Arg::Ptr(s));
    }
    params.extend(c.params.iter().cloned());
    args.extend(c.args.iter().cloned());
    let entry = p.entry("attn_fwd_sm90");
    let qt = (p.s_q + BM - 1) / BM;
    let nt = qt * p.h_q * p.b;
    let dynamic = persist && dynamic(p);
    let split = if persist { split(p, nt, target.sm_count as i64) } else { None };
    if persist {
        let (nfull, nu) = split.map_or((nt, nt), |s| (s.nfull, s.nfull + 2 * s.g));
        defs += &format!("#define FA_QT {qt}LL\n#define FA_DYNAMIC {}\n#define FA_NFULL {nfull}LL\n#define FA_NU {nu}LL\n", dynamic as u8);
        defs += &match split {
            Some(s) => format!("#define FA_SPLIT 1\n#define FA_T {}LL\n#define FA_TAILW {}LL\n#define FA_G {}LL\n", s.t, s.tail * s.t, s.g),
            None => "#define FA_SPLIT 0\n".into(),
        };
    }
    if dynamic || split.is_some() {
        params.push("unsigned* fa_ticket".into());
        args.push(Arg::Scratch(0));
    }
    if split.is_some() {
        params.push("float* fa_part".into());
        args.push(Arg::Scratch(1));
    }
    let body = format!("{BODY}{}", if persist { KERNEL_PERSIST } else { KERNEL });
    let body = body.replace("FA_INIT", &fa_init(&c)).replace("FA_ENTRY", &entry).replace("FA_PARAMS", &params.join(", "));
    let qreg = qreg(p);
    let kvs = kv_stages(p, persist);
    defs += &format!("#define FA_QREG {}\n#define FA_KVS {kvs}\n", qreg as u8);
    let wgmma = format!(
        "{}{}{}",
        hopper::wgmma_ss(p, "fa90_wgmma_s", BN),
        hopper::wgmma_rs(p, "fa90_wgmma_o", p.d_v),
        if qreg { hopper::wgmma_rs_major(p, "fa90_wgmma_sr", BN, false) } else { String::new() }
    );
    let source = format!("{defs}{HELPERS}{stores}{}{wgmma}{body}", hopper::helpers());
    let grid = match (persist, split) {
        (true, Some(s)) => (s.g, 1, 1),
        (true, None) => (nt.min(target.sm_count.max(1) as i64), 1, 1),
        _ => (qt, p.h_q, p.b),
    };
    if grid.0 > i32::MAX as i64 {
        return None;
    }
    let main = Launch {
        source,
        entry,
        grid: Grid::Exact(grid.0 as u32, grid.1 as u32, grid.2 as u32),
        block: 384,
        shared_bytes: shared_bytes(p, persist, kvs) as u32,
        args,
        cluster: None,
        pdl: Pdl::Dependent,
    };
    if !dynamic && split.is_none() {
        return Some(NodeKernels::one(main));
    }
    // The ticket counter and the split items' counts, zeroed before the kernel.
    let words = 1 + split.map_or(0, |s| s.tail);
    let entry = p.entry("attn_fwd_ticket_sm90");
    let zero = Launch {
        source: format!(
            "extern \"C\" __global__ void __launch_bounds__(256) {entry}(unsigned* fa_ticket)\n{{\n    for (int i = threadIdx.x; i < {words}; i += 256) fa_ticket[i] = 0u;\n}}\n"
        ),
        entry,
        grid: Grid::Exact(1, 1, 1),
        block: 256,
        shared_bytes: 0,
        args: vec![Arg::Scratch(0)],
        cluster: None,
        pdl: Pdl::Dependent,
    };
    // A split tail's partials: two slots per CTA of 256 consumer threads' O, maxima and sums.
    let mut scratch = vec![4 * words as usize];
    if let Some(s) = split {
        scratch.push((2 * s.g * 256 * (p.d_v / 2 + 4) * 4) as usize);
    }
    Some(NodeKernels { launches: vec![zero, main], scratch })
}

/// The Hopper unit of a forward node, when this kernel takes it; the general kernel with
/// element-wise loads is the alternative for base pointers TMA cannot take.
pub(super) fn unit(p: &Problem, target: &Target) -> Option<Unit> {
    if !target.hopper() || !hopper::takes(p, &[p.q, p.k, p.v]) || shared_bytes(p, persistent(p), 2) > 227 * 1024 {
        return None;
    }
    let kernels = generate(p, target)?;
    let alternative = super::fwd::generate(p, false)?;
    let node = p.node;
    // TMA needs 16-byte aligned bases; o is stored in 4-byte pairs when its strides allow.
    let mut tensors = vec![p.q, p.k, p.v];
    if p.pair_ok(node.output("o")?) {
        tensors.push(node.output("o")?);
    }
    Some(Unit { nodes: vec![p.ni], kernels, writes: node.outputs.iter().map(|x| x.tensor).collect(), unaligned: Some(Box::new(Unaligned { tensors, kernels: alternative })) })
}
