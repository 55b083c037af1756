//! Pieces the Hopper attention kernels share ([`super::fwd90`], [`super::bwd90`]): TMA maps of
//! the rank-4 attention tensors, `wgmma` wrappers, the 4-d TMA load, and the rule for which
//! problems they take.
//!
//! Shared-memory tiles are rows of 64 channels (128 bytes, TMA's 128-byte swizzle), 8-row atoms
//! 1024 bytes apart, 64-channel chunks one after the other. Read as a K-major operand (k = the
//! channels, e.g. Q and K in S = Q K^T) a tile's descriptor is `make_desc(addr + 32 * kstep, 16,
//! 1024)` within a chunk; read as an N-major operand (k = the rows, e.g. V in O = P V) it is
//! `make_desc(addr + 2048 * kstep, chunk_bytes, 1024)`.

use super::Problem;
use crate::dtype::DataType;
use crate::engine::cuda::kernel::HOPPER;
use crate::engine::cuda::tma::TmaDesc;
use crate::graph::TensorId;

/// Whether the Hopper kernels take the problem (the target is checked by the caller): head
/// dims 64 and 128, no page table and no padding mask (TMA would read K/V rows past a
/// sequence's length, which the general kernels zero-fill), TMA-compatible strides.
pub(super) fn takes(p: &Problem, tensors: &[TensorId]) -> bool {
    matches!(p.d, 64 | 128)
        && matches!(p.d_v, 64 | 128)
        && p.paged.is_none()
        && p.seq_len_q.is_none()
        && p.s_q > 64
        && p.s_q < 1 << 31
        && p.s_kv < 1 << 31
        && tensors.iter().all(|&t| p.vec_ok(t) && tma_of(p, t, 64).check().is_ok())
}

/// The TMA map of a rank-4 io-type tensor [b, h, s, width]: dims (channel, row, head, batch),
/// boxes of 64 channels (128 bytes, the swizzle span) by `rows`. Size-1 dims get a stride TMA
/// accepts (their coordinate is always 0).
pub(super) fn tma_of(p: &Problem, t: TensorId, rows: i64) -> TmaDesc {
    let d = p.graph.desc(t);
    let es = 2u64;
    let dims: Vec<u64> = vec![d.dims[3] as u64, d.dims[2] as u64, d.dims[1] as u64, d.dims[0] as u64];
    let mut strides = Vec::new();
    let mut prev = d.dims[3] as u64 * es;
    for axis in [2usize, 1, 0] {
        let s = if d.dims[axis] == 1 { prev } else { d.strides[axis] as u64 * es };
        strides.push(s);
        prev = s.saturating_mul(d.dims[axis].max(1) as u64);
    }
    TmaDesc { tensor: t, dtype: p.dt, dims, strides, boxes: vec![64, rows as u32, 1, 1], swizzle: 128 }
}

fn mma_type(p: &Problem) -> &'static str {
    if p.dt == DataType::Bf16 {
        "bf16"
    } else {
        "f16"
    }
}

/// `name(float (&d)[n/2], u64 da, u64 db, int scale_d)`: d (+)= A B, `wgmma.m64n{n}k16`, both
/// operands K-major in shared memory; `scale_d` 0 overwrites d.
pub(super) fn wgmma_ss(p: &Problem, name: &str, n: i64) -> String {
    wgmma_ss_major(p, name, n, false)
}

/// [`wgmma_ss`] with both operands MN-major instead (`mn`: A M-major, B N-major; the
/// transpose flags), e.g. A = dS from a [keys][queries] tile and B = K from its [keys][d] tile.
pub(super) fn wgmma_ss_major(p: &Problem, name: &str, n: i64, mn: bool) -> String {
    let h = n / 2;
    let t = if mn { "1, 1" } else { "0, 0" };
    format!(
        r#"__device__ __forceinline__ void {name}(float (&d)[{h}], u64 da, u64 db, int scale_d) {{
    asm volatile(
        "{{\n.reg .pred p;\nsetp.ne.b32 p, %{sd}, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{regs}}}, %{h}, %{db}, p, 1, 1, {t};\n}}\n"
        : {outs}
        : "l"(da), "l"(db), "r"(scale_d));
}}
"#,
        ty = mma_type(p),
        regs = (0..h).map(|i| format!("%{i}")).collect::<Vec<_>>().join(", "),
        outs = (0..h).map(|i| format!("\"+f\"(d[{i}])")).collect::<Vec<_>>().join(", "),
        db = h + 1,
        sd = h + 2,
    )
}

/// `name(float (&d)[n/2], const u32 (&a)[4], u64 db)`: d += A B, `wgmma.m64n{n}k16`, A from
/// registers (the io type, mma.sync's A fragment layout per warp), B N-major in shared memory.
pub(super) fn wgmma_rs(p: &Problem, name: &str, n: i64) -> String {
    wgmma_rs_major(p, name, n, true)
}

/// [`wgmma_rs`] with B N-major (`n_major`, the transpose flag) or K-major, and a `scale_d`
/// argument: `name(d, a, db, scale_d)` computes d = A B (scale_d 0) or d += A B.
pub(super) fn wgmma_rs_major(p: &Problem, name: &str, n: i64, n_major: bool) -> String {
    let h = n / 2;
    let (params, scale) = if n_major { ("", "\"r\"(1)") } else { (", int scale_d", "\"r\"(scale_d)") };
    format!(
        r#"__device__ __forceinline__ void {name}(float (&d)[{h}], const u32 (&a)[4], u64 db{params}) {{
    asm volatile(
        "{{\n.reg .pred p;\nsetp.ne.b32 p, %{sd}, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{regs}}}, {{%{a0}, %{a1}, %{a2}, %{a3}}}, %{db}, p, 1, 1, {t};\n}}\n"
        : {outs}
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), {scale});
}}
"#,
        t = n_major as u8,
        ty = mma_type(p),
        regs = (0..h).map(|i| format!("%{i}")).collect::<Vec<_>>().join(", "),
        outs = (0..h).map(|i| format!("\"+f\"(d[{i}])")).collect::<Vec<_>>().join(", "),
        a0 = h,
        a1 = h + 1,
        a2 = h + 2,
        a3 = h + 3,
        db = h + 4,
        sd = h + 5,
    )
}

/// The defines of `fa90_work`'s heaviest-first order for causal masks (measured on the H100,
/// bench/NOTES.md session 13: causal forward +4%, causal backward +6%;
/// `FERRODNN_ATTN_HEAVY_FIRST=0` turns it off to compare) and of the heads it takes at a time:
/// as many as keep their Q, dO, K and V within 16 MiB, from one to four (b1h32s16384d128
/// causal: one, backward +0.4-0.6% against four; b4h16s4096d128: four, its forward 4.5% slower
/// with one; bench/NOTES.md session 20). `FERRODNN_ATTN_HEADS_GROUP` sets it, for tuning.
pub(super) fn heavy_first(p: &Problem) -> String {
    let per_head = (p.s_q + p.s_kv) * (p.d + p.d_v) * 2;
    let fit = ((16i64 << 20) / per_head.max(1)).clamp(1, 4);
    let env = std::env::var("FERRODNN_ATTN_HEADS_GROUP").ok().and_then(|v| v.parse::<i64>().ok()).filter(|&g| g >= 1);
    format!("#define FA_HEAVY_FIRST {}\n#define FA_HEADS_GROUP {}\n", !super::switched_off("FERRODNN_ATTN_HEAVY_FIRST") as u8, env.unwrap_or(fit))
}

/// Device code after the attention HELPERS: the TMA map type, the sm90 barrier / TMA / wgmma
/// helpers, the 4-d tile load, and the packing of f32 accumulators into A fragments.
pub(super) fn helpers() -> String {
    format!("{HOPPER}{TMA4}")
}

const TMA4: &str = r#"
// One 4-d TMA tile copy (channel, row, head, batch) into shared memory, completing on `bar`.
__device__ __forceinline__ void fa90_tma(unsigned dst, const TmaMap* map, unsigned bar, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];"
        :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar) : "memory");
}

// Work item `l` of a list of `nt` tiles x `nh` heads x batch (`nhb` heads and batches): its
// tile's rank (0: the tile with the most work), head and batch. With a causal mask the tiles'
// work differs (it grows with a q tile's index, and shrinks with a K/V tile's), so the items are
// the tiles of FA_HEADS_GROUP heads at a time (one to four) heaviest first: blocks starting in
// the order of their linear index (or persistent blocks taking the items in order) end with the
// lightest, and the heads in flight, whose tiles share K/V or Q/dO through L2, stay few
// (FA_HEAVY_FIRST, `heavy_first` in hopper.rs). Otherwise tile-major order.
__device__ __forceinline__ void fa90_work_at(i64 l, i64 nt, i64 nh, i64 nhb, i64& rank, i64& h, i64& bi) {
#if FA_CAUSAL && FA_HEAVY_FIRST
    const i64 g = l / (FA_HEADS_GROUP * nt), r = l - g * FA_HEADS_GROUP * nt, gs = fa_min(FA_HEADS_GROUP, nhb - g * FA_HEADS_GROUP);
    const i64 hb = g * FA_HEADS_GROUP + r % gs;
    rank = r / gs;
#else
    const i64 hb = l / nt;
    rank = l - hb * nt;
    (void)nhb;
#endif
    h = hb % nh;
    bi = hb / nh;
}

// This CTA's work item of a (tiles, heads, batch) grid, as `fa90_work_at` orders them.
__device__ __forceinline__ void fa90_work(i64& rank, i64& h, i64& bi) {
#if FA_CAUSAL && FA_HEAVY_FIRST
    const i64 nt = gridDim.x, nh = gridDim.y;
    fa90_work_at((i64)blockIdx.x + nt * ((i64)blockIdx.y + nh * (i64)blockIdx.z), nt, nh, nh * (i64)gridDim.z, rank, h, bi);
#else
    rank = blockIdx.x;
    h = blockIdx.y;
    bi = blockIdx.z;
#endif
}

// The K/V tiles [t0, t1) of BN keys that some row of the q tile [q0, q0 + BM) sees (empty,
// with any false, when none does).
__device__ __forceinline__ bool fa90_key_tiles(i64 q0, i64 bm, i64 bn, i64 lq, i64 lkv, i64 off, int& t0, int& t1) {
    i64 jlo, jhi;
    fa_key_range(q0, fa_min(q0 + bm, lq) - 1, lkv, off, jlo, jhi);
    const bool any = q0 < lq && jlo < jhi;
    t0 = any ? (int)(jlo / bn) : 0;
    t1 = any ? (int)((jhi + bn - 1) / bn) : 0;
    return any;
}

// Row hh (0: g, 1: g + 8) of a thread's 64 x W f32 accumulators, times `scale`, through
// `store(offset, a, b)` of two adjacent columns: column c sits at base + c * cs.
template <int W, typename F>
__device__ __forceinline__ void fa90_store_row(F store, i64 base, i64 cs, const float (&acc)[W / 2], int hh, int tg, float scale) {
    #pragma unroll
    for (int n = 0; n < W / 8; ++n) store(base + (i64)(n * 8 + tg * 2) * cs, acc[4 * n + 2 * hh] * scale, acc[4 * n + 2 * hh + 1] * scale);
}

// f32 accumulators of a 64 x N wgmma (thread: rows g, g + 8 of its warp's 16; columns
// 8n + 2t, +1 in acc[4n..4n+3]) as the A fragments of a k = N product, in the io type: k step
// kt (columns 16kt..16kt+15) is accumulators 8kt..8kt+7, already in the A layout.
template <int N>
__device__ __forceinline__ void fa90_pack(u32 (&a)[N / 16][4], const float (&acc)[N / 2]) {
    #pragma unroll
    for (int kt = 0; kt < N / 16; ++kt) {
        a[kt][0] = fa_pack(acc[8 * kt], acc[8 * kt + 1]);
        a[kt][1] = fa_pack(acc[8 * kt + 2], acc[8 * kt + 3]);
        a[kt][2] = fa_pack(acc[8 * kt + 4], acc[8 * kt + 5]);
        a[kt][3] = fa_pack(acc[8 * kt + 6], acc[8 * kt + 7]);
    }
}
"#;
