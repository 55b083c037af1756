//! The Hopper GEMM kernel: wgmma with both operands in shared memory, brought in by TMA through
//! an mbarrier pipeline, warp-specialized, persistent.
//!
//! One CTA per SM (384 threads) loops over output tiles in a grouped order (`GROUP_M` tiles down
//! M before moving along N, so that concurrently running CTAs share A and B panels in L2; 16, or
//! 4 for k loops up to 4096, see `group_m`):
//! - warpgroup 0, the producer, gives most of its registers back (`setmaxnreg.dec`) and one of its
//!   threads issues the TMA copies of each k-slice (A: `BM x 64`, B: `64 x BN`) into a ring of
//!   `STAGES` shared-memory stages, each guarded by a "full" barrier (TMA transaction count) and
//!   an "empty" barrier (consumers done);
//! - warpgroups 1 and 2, the consumers, each own 64 rows of the `128 x BN` tile and run
//!   `wgmma.m64nBNk16` on each stage (four k-steps of 16 per 64-wide slice), keeping one wgmma
//!   group in flight; then the epilogue applies the fused pointwise chain to each accumulator
//!   and stores straight from registers, while the producer already loads the next tile.
//!
//! Decode shapes (at most 32 rows of A, many columns) run as C^T = B^T A^T: B^T gives the
//! tile's 64 rows and A^T the wgmma's N (16 or 32), so no tensor-core work goes to zero rows
//! and the tiles are many enough that k is not split; both consumers then take the same 64
//! rows, each over half of every stage's k steps, and the second adds its sums into the
//! first's through shared memory before the epilogue, which still sees C's rows and columns.
//!
//! tf32 with B stored `k x n` (N-major): wgmma reads 32-bit operands from shared memory K-major
//! only, so the kernel computes C^T = B^T A^T with B^T (M-major in its stage) as the register
//! operand: each consumer loads its 64 rows' fragments of a stage from shared memory (rounded
//! to tf32) into one of two register sets, alternate stages taking alternate sets, since a
//! stage's wgmmas may still be reading theirs while the next stage's are loaded; A^T, K-major,
//! is read from shared memory as usual. Where that needs a split of k (few tiles) or B's rows
//! are not TMA rows, a first launch copies B transposed and rounded instead.
//!
//! The split tail (`Config::streamk`): where one whole wave of tiles leaves a small last wave of
//! long k loops (a weight gradient's 144 tiles for 132 SMs), the whole wave runs as usual and each
//! tile of the last is split along k over several CTAs (`tail_split`); the CTA with a tile's first
//! k steps waits for the others' f32 sums (a slot and a flag per CTA in the workspace, the flags
//! zeroed by a launch first), adds them in order and runs the epilogue.
//!
//! fp8 (e4m3 and e5m2, either operand either type) runs `wgmma ... k32` at twice the 16-bit
//! rate, 128 k a stage (the same bytes as 16-bit stages); 8-bit operands are K-major only, so
//! A must be row-major and B stored `n x k` (as cuBLASLt's fp8 GEMMs take them too); other
//! layouts run on the mma.sync kernel, which converts fp8 to f16 as it loads. 8-bit integers
//! (i8, u8) run `wgmma ... k32 .s32` the same way, their exact i32 sums kept in the
//! accumulators' registers and converted to f32 once a tile is done, for a float C (whole
//! 128-row tiles: no split of k); an integer C (stored exactly) runs on the mma.sync kernel.
//!
//! Shared-memory tiles use the 128-byte swizzle that TMA writes and wgmma reads. Operands may be
//! K-major (the usual row-major A, or B stored `n x k`) or M/N-major (B stored `k x n`, A
//! stored column-major): wgmma's transpose flags take both for 16-bit types. Out-of-range rows,
//! columns and k are zero-filled by TMA, so any M, N and K work; stores are guarded. TMA needs
//! 16-byte aligned row strides and base pointers: the strides are checked here, the pointers
//! when the plan executes (the unit's `unaligned` alternative runs otherwise).
//!
//! The device code is `sm90.cuh` (after `wgmma.cuh`, the wgmma instructions of the tile width, and
//! `sm90_common.cuh`, C's stores), `sm90_reduce.cuh` (split k's second launch), `sm90_skz.cuh`
//! (the split tail's flag zeroing), `tap.cuh` and `tap_reduce.cuh` (a reduction of C folded in)
//! and `transpose.cuh` (tf32's copy of B); here the configuration is chosen and written as their
//! defines.

use super::epilogue::{Side, SideKind};
use super::gather::GATHER;
use super::{dt_code, Epilogue, GemmProblem, Operand, Tap, TapAxes, COMMON};
use crate::dtype::DataType;
use crate::engine::cuda::kernel::ctype::c_type;
use crate::engine::cuda::kernel::{entry_name, Arg, Grid, Launch, NodeKernels, Options, Pdl, Signature, Source, Target, Unaligned, Unit, HOPPER};
use crate::engine::cuda::tma::TmaDesc;
use crate::error::Result;
use crate::graph::ops::reduction::ReductionMode;
use crate::graph::{Graph, TensorId};
use std::fmt::Write;

/// Rows of A per CTA tile (two consumer warpgroups of 64 rows).
const BM: usize = 128;
/// k per pipeline stage: one 128-byte swizzle span, 64 16-bit elements, 32 f32 (tf32) or 128
/// fp8.
fn bk(t: DataType) -> usize {
    128 / t.size()
}
/// Bytes of one swizzle atom row; 8 rows make the 1024-byte atom.
const SWIZZLE: u32 = 128;

/// How one operand sits in shared memory and how wgmma reads it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Major {
    /// k is the contiguous dim: tile rows of 64 k (128 bytes), one row per m (or n).
    K,
    /// m (or n) is contiguous: chunks of 64 m/n (128 bytes) per k row, chunk after chunk.
    Mn,
}

/// A tile configuration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Config {
    /// Columns per CTA tile: 64, 128 or 256.
    pub bn: usize,
    /// Pipeline stages.
    pub stages: usize,
    /// Tiles down M per group of the tile order.
    pub group_m: usize,
    /// Store C through shared memory with TMA (16-bit row-major C): the stores drain while the
    /// next tile's main loop runs, instead of stalling every SM's epilogue at once.
    pub tma_store: bool,
    /// Ways the k range is split (1: none). Split partial sums go to the workspace in f32 and
    /// a second launch adds them in order, so few-tile problems (decode: M = 16) still keep
    /// every SM streaming.
    pub splits: usize,
    /// Rows of A per CTA tile: 128 (each consumer warpgroup owns 64 rows), or 64 (both
    /// consumers compute the same 64 rows, each over half of every stage's k steps, and the
    /// second adds its sums into the first's through shared memory before the epilogue).
    pub bm: usize,
    /// The kernel computes C^T = B^T A^T ([`swapped`]): for decode-shaped problems (a few rows
    /// of A, many columns), whose rows become wgmma's narrow N (16 or 32) instead of filling
    /// 128-row tiles with zeros. The epilogue still sees C's row and column.
    pub swap: bool,
    /// The split tail: the whole waves of tiles as usual, then the last, partial wave's tiles
    /// each split along k over several CTAs ([`tail_split`]), the one with a tile's first k steps
    /// adding the others' sums from the workspace before the epilogue, where whole tiles would
    /// leave that wave's SMs mostly idle.
    pub streamk: bool,
}

impl Config {
    fn stage_bytes(&self) -> usize {
        (self.bm + self.bn) * 128
    }
    /// Bytes of C staged in shared memory for the TMA store (two 64 x BN 16-bit blocks), or of
    /// the second consumer's f32 sums (64-row tiles).
    fn c_bytes(&self) -> usize {
        if self.tma_store {
            2 * 64 * self.bn * 2
        } else if self.bm == 64 {
            64 * self.bn * 4
        } else {
            0
        }
    }
    /// The kernel of this configuration can fold a reduction of C in (a [`Tap`]): one launch
    /// over C's own 128-row tiles, no split of k, no C^T.
    fn folds_tap(&self) -> bool {
        self.splits == 1 && !self.swap && self.bm == BM
    }
    /// This configuration with as many stages (2 to 8) as fit in 227 KiB of shared memory.
    fn with_most_stages(mut self) -> Config {
        self.stages = 2;
        self.stages = ((227 * 1024 - self.shared_bytes() + 2 * self.stage_bytes()) / self.stage_bytes()).clamp(2, 8);
        self
    }
    /// Dynamic shared memory: the stages, the C blocks, 1 KiB to align them to the swizzle
    /// atom, barriers.
    pub fn shared_bytes(&self) -> usize {
        self.stages * self.stage_bytes() + self.c_bytes() + 1024 + 2 * self.stages * 8
    }
}

/// The configuration for a problem: the heuristic's ([`heuristic`]), or with the target's
/// `gemm_config` the tuning candidate of that index ([`tuning_configs`]: the plans an autotuning
/// times), or in an autotuned plan (`Options::autotune`) the candidate its tuning kept
/// ([`super::tune`]).
pub fn choose(p: &GemmProblem, target: &Target, options: &Options) -> Config {
    let base = heuristic(p, target);
    if let Some(i) = options.gemm_config {
        return tuning_configs_of(p, base).get(i as usize).copied().unwrap_or(base);
    }
    if options.autotune {
        if let Some(t) = super::tune::TuneCache::global().get(&super::tune::key(p, target)) {
            let cfg = t.apply(base);
            if tuning_configs_of(p, base).contains(&cfg) {
                return cfg;
            }
        }
    }
    base
}

/// The configurations an autotuning times for `p`, the heuristic's first: 128- and 256-wide
/// tiles, each in groups of 4, 8 and 16 tiles down M (the heuristic's as well), as many stages as
/// fit. Only the heuristic's where it splits k or computes C^T.
pub fn tuning_configs(p: &GemmProblem, target: &Target) -> Vec<Config> {
    tuning_configs_of(p, heuristic(p, target))
}

fn tuning_configs_of(p: &GemmProblem, base: Config) -> Vec<Config> {
    let mut v = vec![base];
    if base.splits != 1 || base.swap || base.bm != BM || gathered(p) {
        return v;
    }
    let widths: &[usize] = if p.n > 128 { &[256, 128] } else { &[128] };
    for &bn in widths {
        for g in [base.group_m, 4, 8, 16] {
            let cfg = Config { bn, group_m: g.min(p.m.div_ceil(BM)).max(1), ..base }.with_most_stages();
            if !v.contains(&cfg) {
                v.push(cfg);
            }
        }
    }
    v
}

/// The heuristic's configuration for a problem: the widest tile that still gives every SM work,
/// and as many stages as fit in 227 KiB of shared memory.
pub fn heuristic(p: &GemmProblem, target: &Target) -> Config {
    // C stored column-major (a weight gradient written transposed, dW^T = X^T dY): the kernel
    // computes C^T = B^T A^T, whose C is row-major, so that its stores are whole rows instead of
    // one element a column, where the swapped problem runs whole 128-row tiles.
    if c_column_major(p) && !tf32(p) && !int8(p) && !gathered(p) && im2col_a(p).is_none() {
        let q = swapped(p);
        if reject(&q, target).is_none() {
            let cq = heuristic(&q, target);
            if cq.splits == 1 && !cq.swap && cq.bm == BM {
                return Config { swap: true, tma_store: false, streamk: false, ..cq };
            }
        }
    }
    let tiles = |bn: usize| p.batch * p.m.div_ceil(BM) * p.n.div_ceil(bn);
    let sms = target.sm_count.max(1) as usize;
    // BN 256 halves the B traffic per flop, but leaves SMs idle when tiles are few, and short
    // k loops (K <= 256) gain more from more tiles than from wider ones.
    // (64-wide tiles for decode, M <= 64, instead of a 2-way split k measured slower on the
    // H100: 32.1 vs 40.4 TFLOP/s at 16 x 8192 x 8192; their 8 KiB B stages keep less of B in
    // flight per SM.)
    let bn = if p.n <= 64 {
        // (No half-empty 128-wide tiles.)
        64
    } else if gathered(p) {
        // An implicit GEMM's producers gather at most 128 columns of B a stage, and 128-wide
        // tiles even when they leave SMs idle: its stages are bound by the L2 traffic of
        // re-reading the image for every tap (measured on the H200, 32x256x14x14 by 256 3x3
        // filters: 64-wide tiles 0.0385 ms). 64-wide tiles where their waves cost less (a
        // 64-wide tile taking 0.55 of a 128-wide one's time) and they keep more than a tenth
        // more CTAs busy, counting the splits of k each width gets. Measured on the H200: UNet
        // 2x320x64x64 3x3 fprop 0.0364 -> 0.0351 ms, wgrad 0.0434 -> 0.0304, ResNet's stride-2
        // 3x3 fprop 0.0193 -> 0.0183; where 128-wide tiles split k over more CTAs (1280 channels
        // at 16x16: 120 CTAs against 80) 64-wide ones were up to 44% slower.
        let kt = p.k.div_ceil(bk(p.a.dtype));
        let ctas = |bn: usize| tiles(bn) * splits_for(tiles(bn), kt, sms);
        let (w64, w128) = (tiles(64).div_ceil(sms) as f64 * 0.55, tiles(128).div_ceil(sms) as f64);
        if w64 < w128 && 10 * ctas(64) > 11 * ctas(128) {
            64
        } else {
            128
        }
    } else if p.n > 128 && p.k > 256 && (tiles(256) >= sms || p.k >= 4096) && wave_cost(p, tiles(256), 256, sms) <= wave_cost(p, tiles(128), 128, sms) {
        // (With fewer 256-wide tiles than SMs, only for long k loops: 768 x 3072 x 6304 as 72
        // tiles of 256 columns ran 5-11% faster than 144 of 128 on the H100, but 4096 x 768 x
        // 768 and x 3072 (96 tiles of 256 against 192 of 128) 12-14% slower: in short loops the
        // wide tiles' epilogues weigh as much as their products, and a partial second wave of
        // narrow tiles runs on less contended memory.)
        256
    } else {
        128
    };
    // Half-width tiles instead of a split of k where they alone fill most of the SMs in one wave
    // (the reduce launch and its partial sums cost more than the narrower tiles); not for short
    // M, where the 64-wide tiles' smaller stages keep too little in flight (decode, above).
    let bn = if bn == 128 && !gathered(p) && p.m >= 4 * BM && 2 * tiles(128) <= sms && 8 * tiles(64) >= 7 * sms { 64 } else { bn };
    let kt = p.k.div_ceil(bk(p.a.dtype));
    let t0 = tiles(bn);
    // (8-bit integers: whole tiles only, their i32 sums exact until the one conversion.)
    let splits = if int8(p) { 1 } else { splits_for(t0, kt, sms) };
    let tma_store = splits == 1 && tma_store_ok(p);
    // (Clusters of two CTAs sharing B by TMA multicast measured slower on the H100 than single
    // CTAs, 2.5% even launching only the clusters that fit: there is no cluster variant.)
    let cfg = Config {
        bn,
        stages: 2,
        group_m: p.m.div_ceil(BM).clamp(1, group_m(p)),
        tma_store,
        splits,
        bm: BM,
        swap: false,
        streamk: splits == 1 && !int8(p) && stream_k(p, t0, bn, kt, sms),
    };
    // Decode: at most 32 rows of A against 64-column tiles for at least 7/8 of the SMs. As C^T,
    // 64-row tiles of B^T need no split of k (16 x 8192 x 8192: 128 tiles, no reduce launch),
    // and each stage carries 2 or 4 KiB of A instead of 16. Eight stages (80 KiB): 6, 12 and 16
    // measured 1-3% slower on the H100.
    if p.m <= 32 && !tf32(p) && !int8(p) && !gathered(p) && 8 * p.batch * p.n.div_ceil(64) >= 7 * sms && swap_ok(p) {
        let bn = if p.m <= 16 { 16 } else { 32 };
        return Config { bn, stages: 8, group_m: 1, tma_store: false, splits: 1, bm: 64, swap: true, streamk: false };
    }
    // tf32 with B N-major: C^T = B^T A^T with B^T's fragments loaded from shared memory into
    // registers (`rs`), where the tiles are enough for every SM without a split of k; else B's
    // transposed copy (split k needs it).
    if b_transposed(p) && rs_ok(p) {
        let q = swapped(p);
        let tiles = |bn: usize| q.batch * q.m.div_ceil(BM) * q.n.div_ceil(bn);
        if 2 * tiles(128) > sms || kt < 8 {
            let bn = if q.n > 128 && tiles(256) >= sms && q.k > 256 { 256 } else { 128 };
            return Config { bn, stages: 2, group_m: q.m.div_ceil(BM).clamp(1, group_m(&q)), tma_store: false, splits: 1, bm: BM, swap: true, streamk: false }.with_most_stages();
        }
    }
    cfg.with_most_stages()
}

/// How the last, partial wave of `tiles` tiles of `kt` k steps over `grid` CTAs is split along
/// k (the split tail, `Config::streamk`): its tiles and the ways each is split, as many as its
/// tiles fit in the grid. Only for one whole wave and a small tail (at most an eighth of the
/// grid) of long k loops (32 k steps or more, at least 4 a part): measured on the H200 (ncu),
/// ViT's 768 x 3072 x 6304 weight gradient as 144 tiles of 128 columns with 12 in 11 parts ran
/// in 64.8 us against 82 us as 72 tiles of 256 in one wave. Wider tails gained nothing (likely:
/// the finishing CTA reads the other parts' sums alone, 64-128 KiB each, about what the split
/// saves; not profiled further): 8192 x 320 x 1280, 60 tiles in 2 parts, 22.5 us against 22.2
/// whole; 6304 x 768 x 3072 as 150 tiles of 256, 18 in 7 parts, 68 us against 65 us as 300
/// tiles of 128.
fn tail_split(tiles: usize, kt: usize, grid: usize) -> Option<(usize, usize)> {
    let tail = tiles % grid;
    if tiles.div_ceil(grid) != 2 || tail == 0 || kt < 32 {
        return None;
    }
    let ways = (grid / tail).min(kt / 4);
    (ways >= 8).then_some((tail, ways))
}

/// Whether the heuristic splits the last wave's tiles along k: 128-wide tiles with operands
/// loaded by TMA only (not gathered, not im2col) and a tail worth splitting ([`tail_split`]).
fn stream_k(p: &GemmProblem, tiles: usize, bn: usize, kt: usize, sms: usize) -> bool {
    bn == 128 && !gathered(p) && im2col_a(p).is_none() && tail_split(tiles, kt, sms).is_some()
}

/// Ways the heuristic splits k for `tiles` output tiles over `kt` k steps: enough to bring the
/// CTAs near the SM count where the tiles fill at most half of them, at least 4 k steps a split.
fn splits_for(tiles: usize, kt: usize, sms: usize) -> usize {
    if 2 * tiles <= sms && kt >= 8 {
        (sms / tiles).min(kt / 4).max(1)
    } else {
        1
    }
}

/// The time of a persistent launch of `tiles` tiles of `bn` columns in units of a 256-wide tile:
/// whole waves over the SMs (the last, partial wave takes as long as a full one) times a tile's
/// time, a 128-wide tile costing 0.55 of a 256-wide one (B's traffic per flop is twice as
/// high). Where the wider tiles leave a mostly empty last wave, the narrower ones win: 6304 x
/// 768 x 3072 as 150 tiles of 256 columns (1.14 waves) ran at 0.56x cuBLAS on the H100, as 300
/// of 128 (2.27 waves) 29% faster; 8192 x 768 x 3072 27% faster, 8192 x 1152 x 4608 3%. A last
/// wave split along k counts as its share of a wave.
fn wave_cost(p: &GemmProblem, tiles: usize, bn: usize, sms: usize) -> f64 {
    let per_tile = if bn >= 256 { 1.0 } else { 0.55 };
    // (The last wave split along k costs 1 / ways of a wave: see `tail_split`.)
    let kt = p.k.div_ceil(bk(p.a.dtype));
    match tail_split(tiles, kt, sms).filter(|_| stream_k(p, tiles, bn, kt, sms)) {
        Some((_, ways)) => ((tiles / sms) as f64 + 1.0 / ways as f64) * per_tile,
        None => tiles.div_ceil(sms) as f64 * per_tile,
    }
}

/// Tiles down M per group of the tile order (at most): 16 for long k loops, 4 up to K = 4096,
/// where the 132 tiles in flight then cover whole rows of tiles (measured on the H100:
/// 16384x4096x1024 +2.9%, with bias + relu +2.3%; 4096^3 +0.3%, with bias + relu +0.4%; 8192^3,
/// fp16 and tf32 slower with 4).
fn group_m(p: &GemmProblem) -> usize {
    if p.k <= 4096 {
        4
    } else {
        16
    }
}

/// C's columns are contiguous and its rows are not (more than one row).
fn c_column_major(p: &GemmProblem) -> bool {
    p.m > 1 && p.n > 1 && p.c.row_stride == 1 && p.c.col_stride != 1
}

/// tf32 with B N-major can run as C^T = B^T A^T with B^T from registers: both operands
/// loadable by TMA as the swapped problem's (B^T M-major, A^T K-major).
fn rs_ok(p: &GemmProblem) -> bool {
    let q = swapped(p);
    tf32(p)
        && major(&q.a, true) == Some(Major::Mn)
        && major(&q.b, false) == Some(Major::K)
        && tma_of(&q.a, true, BM, q.batch).check().is_ok()
        && tma_of(&q.b, false, 256, q.batch).check().is_ok()
}

/// The problem as C^T = B^T A^T: M and N trade places, A^T is the new B and B^T the new A.
pub fn swapped(p: &GemmProblem) -> GemmProblem {
    let t = |o: &Operand| Operand { rows: o.cols, cols: o.rows, row_stride: o.col_stride, col_stride: o.row_stride, ..o.clone() };
    GemmProblem { m: p.n, n: p.m, a: t(&p.b), b: t(&p.a), c: t(&p.c), ..p.clone() }
}

/// The swapped kernel can run `p`: 16-bit inputs that TMA can load, with A K-major (A^T, the
/// new B, is then K-major, which its 16- or 32-row tiles need).
fn swap_ok(p: &GemmProblem) -> bool {
    let q = swapped(p);
    major(&p.a, true) == Some(Major::K)
        && major(&q.a, true).is_some()
        && q.a.dtype.size() == 2
        && tma_of(&q.a, true, 64, q.batch).check().is_ok()
        && tma_of(&q.b, false, 16, q.batch).check().is_ok()
}

/// C can be stored with TMA: 16-bit, row-major, rows (and batches) 16-byte aligned.
fn tma_store_ok(p: &GemmProblem) -> bool {
    let c = &p.c;
    c.dtype.size() == 2 && c.col_stride == 1 && (c.row_stride * 2) % 16 == 0 && c.row_stride > 0 && (p.batch == 1 || (c.batch_stride > 0 && (c.batch_stride * 2) % 16 == 0))
}

/// The TMA map of C for the store epilogue: boxes of 64 columns (128 bytes) x 64 rows.
fn tma_of_c(p: &GemmProblem) -> TmaDesc {
    let c = &p.c;
    let mut d = TmaDesc {
        tensor: c.tensor,
        dtype: c.dtype,
        dims: vec![p.n as u64, p.m as u64],
        strides: vec![c.row_stride as u64 * 2],
        boxes: vec![64, 64],
        swizzle: SWIZZLE,
        im2col: None,
    };
    if p.batch > 1 {
        d.dims.push(p.batch as u64);
        d.strides.push(c.batch_stride as u64 * 2);
        d.boxes.push(1);
    }
    d
}

/// Why this kernel cannot run `p` (or `None` when it can).
pub fn reject(p: &GemmProblem, target: &Target) -> Option<String> {
    reject_as(p, target, false)
}

/// [`reject`], where `rs` says the kernel reads A from registers (tf32 C^T with B^T M-major,
/// see [`rs_ok`]).
fn reject_as(p: &GemmProblem, target: &Target, rs: bool) -> Option<String> {
    if !target.hopper() {
        return Some(format!("wgmma needs sm_90a, the target is {}", target.arch));
    }
    if gathered(p) {
        return reject_gathered(p);
    }
    let t = p.a.dtype;
    let sixteen = matches!(t, DataType::Bf16 | DataType::F16) && p.b.dtype == t;
    if !sixteen && !tf32(p) && !fp8(p) && !int8(p) {
        return Some(format!(
            "inputs {} x {}: this kernel takes bf16 x bf16, f16 x f16, fp8 x fp8 (e4m3 or e5m2 each), 8-bit integers (i8 or u8 each), or f32 x f32 as tf32 (reduced precision allowed)",
            p.a.dtype, p.b.dtype
        ));
    }
    if (fp8(p) || int8(p)) && (major(&p.a, true) != Some(Major::K) || major(&p.b, false) != Some(Major::K)) {
        return Some("fp8 and int8: wgmma reads 8-bit operands K-major only: A must be row-major and B stored n x k (column-major)".into());
    }
    // (An integer C after 8-bit integers: their exact sums as they are where the epilogue is
    // only identities (`Epilogue::int_exact`), else the epilogue's value rounded and saturated.)
    let int_c = int8(p) && matches!(p.c.dtype, DataType::I32 | DataType::I8 | DataType::U8);
    if !matches!(p.c.dtype, DataType::Bf16 | DataType::F16 | DataType::F32) && !int_c {
        return Some(format!("output {}: this kernel stores bf16, f16 or f32 (and an 8-bit integer GEMM's exact sums)", p.c.dtype));
    }
    let limit = i32::MAX as usize;
    if p.m > limit || p.n > limit || p.k > limit || p.batch > limit {
        return Some("an extent above 2^31".into());
    }
    if p.m == 0 || p.n == 0 || p.k == 0 || p.batch == 0 {
        return Some("an empty extent".into());
    }
    if tf32(p) && !rs && major(&p.a, true) != Some(Major::K) {
        return Some("tf32: wgmma reads 32-bit operands K-major only, and A is not row-major".into());
    }
    let b = b_operand(p);
    if tf32(p) && major(&b, false) != Some(Major::K) {
        return Some("tf32: B is neither K-major nor N-major".into());
    }
    for (name, op) in [("a", &p.a), ("b", &b)] {
        if let Err(why) = tma_of(op, name == "a", BM, p.batch).check() {
            return Some(format!("operand {name}: {why}"));
        }
    }
    None
}

/// Both operands gathered through index maps (an implicit GEMM): the producer's threads load
/// them (`sm90_gather.cuh`) instead of TMA.
fn gathered(p: &GemmProblem) -> bool {
    p.a.gather.is_some() && p.b.gather.is_some()
}

/// Why the kernel does not take a gathered problem: 16-bit operands of one type only (f16 or
/// bf16; the gathers copy bits), a C it stores, 32-bit extents.
fn reject_gathered(p: &GemmProblem) -> Option<String> {
    let t = p.a.dtype;
    // (f32 as tf32, and 8-bit integers, only where the image is read by im2col loads: a forward
    // convolution.)
    let im2col_only = (tf32(p) || int8(p)) && im2col_a(p).is_some();
    if !(matches!(t, DataType::F16 | DataType::Bf16) && p.b.dtype == t) && !im2col_only {
        return Some(format!(
            "gathered inputs {} x {}: the Hopper implicit GEMM takes f16 x f16 or bf16 x bf16, and f32 x f32 as tf32 or 8-bit integers for a forward convolution whose channels come in 128-byte runs (others run on the mma.sync kernel)",
            p.a.dtype, p.b.dtype
        ));
    }
    let int_c = int8(p) && matches!(p.c.dtype, DataType::I32 | DataType::I8 | DataType::U8);
    if !matches!(p.c.dtype, DataType::Bf16 | DataType::F16 | DataType::F32) && !int_c {
        return Some(format!("output {}: this kernel stores bf16, f16 or f32 (and an 8-bit integer GEMM's exact sums)", p.c.dtype));
    }
    if !gather_major(&p.a, true).1 || (b_tma(p).is_none() && !gather_major(&p.b, false).1) {
        return Some("a gathered operand without 16-byte vectors (channels not a multiple of 8, or not contiguous): element-wise gathers run on the mma.sync kernel, whose every thread loads".into());
    }
    if p.batch as u128 * p.m as u128 > i32::MAX as u128 || p.n > i32::MAX as usize || p.k > i32::MAX as usize || p.m == 0 || p.n == 0 || p.k == 0 {
        return Some("an extent above 2^31 or empty".into());
    }
    None
}

/// The threads that gather an implicit GEMM's stages: two warpgroups (one measured
/// issue-bound on its gathers' address arithmetic).
const PRODUCERS: usize = 256;

/// The kernel's block: one producer warpgroup and two consumers, or the implicit GEMM's
/// [`PRODUCERS`] and the consumers.
fn threads(p: &GemmProblem) -> u32 {
    if producers_gather(p) {
        256 + PRODUCERS as u32
    } else {
        384
    }
}

/// An implicit GEMM whose producers gather (A, and B unless TMA takes it), rather than one
/// whose A is read by im2col loads ([`im2col_a`]).
fn producers_gather(p: &GemmProblem) -> bool {
    gathered(p) && im2col_a(p).is_none()
}

/// A forward convolution's image read by im2col TMA loads: its map, and what the kernel needs
/// to place each tile's load (`sm90_im2col.cuh`): per spatial dim (outermost first, three) the
/// output grid, stride, offset (minus the leading padding), taps and dilation.
struct Im2colA {
    map: TmaDesc,
    /// The image's pixels are A's k index (a weight gradient's `x^T`, A M-major: a stage is 64
    /// pixels of one tap's channels for each 64 rows), not its m index (a forward convolution).
    pixels_on_k: bool,
    /// The taps mirrored (a data gradient's): tap `t` of the k index is read at offset
    /// `(T - 1 - t) * dil` (`dil` and `off` here are the mirrored walk's).
    flip: bool,
    rank: usize,
    channels: i64,
    grid: [i64; 3],
    mul: [i64; 3],
    off: [i64; 3],
    taps: [i64; 3],
    dil: [i64; 3],
}

/// The im2col reading of A, where it applies: a gathered 16-bit A that is a convolution's image
/// (a pixel index with its stride and padding, as A's m index (fprop) or its k index (wgrad's
/// `x^T`), taps of positive dilation, channels contiguous and a multiple of 64, so a stage is one
/// tap's 64 channels), B by TMA, and corners and offsets within what the map's rank allows.
fn im2col_a(p: &GemmProblem) -> Option<Im2colA> {
    use super::gather::Index;
    let g = p.a.gather.as_ref()?;
    if g.block.is_some() || (b_tma(p).is_none() && b_taps(p).is_none()) {
        return None;
    }
    // 16-bit operands; or f32 as tf32 or 8-bit integers (wgmma reads 32- and 8-bit operands
    // K-major only: a forward convolution's image and a filter stored n x k).
    let sixteen = matches!(p.a.dtype, DataType::F16 | DataType::Bf16) && p.b.dtype == p.a.dtype;
    if !sixteen && !((tf32(p) || int8(p)) && matches!(g.mn, Index::Pixel { .. }) && major(&p.b, false) == Some(Major::K) && b_tma(p).is_some()) {
        return None;
    }
    // Channels a stage (one 128-byte row a pixel): 64 16-bit, 32 f32, 128 8-bit.
    let chunk = bk(p.a.dtype) as i64;
    let (pixel, tap, pixels_on_k) = match (&g.mn, &g.k) {
        (Index::Pixel { .. }, Index::Taps { .. }) => (&g.mn, &g.k, false),
        // (One image: the batch is a grouped convolution's groups at most.)
        (Index::Taps { .. }, Index::Pixel { .. }) if p.batch == p.groups.max(1) => (&g.k, &g.mn, true),
        _ => return None,
    };
    let Index::Pixel { n_stride, grid, mul, off } = *pixel else { return None };
    let Index::Taps { taps, channels, ch_stride, tap_major, mut dil } = *tap else { return None };
    if ch_stride != 1 || !tap_major || channels % chunk != 0 || g.axes.iter().any(|a| a.div != 1 || a.base != 0) {
        return None;
    }
    // A grouped convolution's groups: `channels` each, one after another; the map has them all
    // and a load starts at its group's (`ic_load`).
    let groups = p.groups.max(1);
    if groups > 1 && p.a.batch_stride != channels {
        return None;
    }
    // A data gradient's taps walk backwards (dy at i + pre - t * dil): read with the taps
    // mirrored, t' = T - 1 - t, from the window corner i + pre - (T - 1) * dil (`flip`).
    let flip = (0..3).any(|d| taps[d] > 1 && dil[d] < 0);
    let mut off = off;
    if flip {
        if (0..3).any(|d| taps[d] > 1 && dil[d] > 0) {
            return None;
        }
        for d in 0..3 {
            off[d] += (taps[d] - 1) * dil[d];
            dil[d] = -dil[d];
        }
    }
    // The spatial dims in use (from the innermost; at least one).
    let used = |d: usize| g.axes[d].extent > 1 || grid[d] > 1 || taps[d] > 1;
    let spatial = (0..3).find(|&d| used(d)).map_or(1, |d| 3 - d);
    let first = 3 - spatial;
    let rank = spatial + 2;
    // Corner and offset ranges the driver takes for each rank.
    let (corner, offset) = match rank {
        3 => (1i64 << 15, 1i64 << 16),
        4 => (1 << 7, 1 << 8),
        _ => (1 << 4, 1 << 5),
    };
    let es = p.a.dtype.size() as u64;
    let pixels_total = if pixels_on_k { p.k } else { p.batch / groups * p.m };
    let images = pixels_total as i64 / grid.iter().product::<i64>();
    // Pixels a load brings: a tile's 128 rows, or a stage's 64 k.
    let pixels = if pixels_on_k { 64 } else { BM as u32 };
    let (mut dims, mut strides, mut lower, mut upper, mut traversal) = (vec![(channels * groups as i64) as u64], Vec::new(), Vec::new(), Vec::new(), vec![1u32]);
    for d in (first..3).rev() {
        let a = &g.axes[d];
        // The box: the window corners of the first and the last output pixel along the dim.
        let (lo, last) = (off[d], off[d] + (grid[d] - 1) * mul[d]);
        let up = last - (a.extent - 1);
        let max_offset = (taps[d] - 1) * dil[d];
        if (taps[d] > 1 && dil[d] <= 0) || max_offset >= offset || !(-corner..corner).contains(&lo) || !(-corner..corner).contains(&up) || !(1..=8).contains(&mul[d]) {
            return None;
        }
        dims.push(a.extent as u64);
        // (A dim of one element: any stride the map takes.)
        strides.push(if a.extent > 1 { a.stride as u64 * es } else { 16 });
        lower.push(lo as i32);
        upper.push(up as i32);
        traversal.push(mul[d] as u32);
    }
    dims.push(images.max(1) as u64);
    strides.push(n_stride as u64 * es);
    traversal.push(1);
    let map = TmaDesc {
        tensor: p.a.tensor,
        dtype: p.a.dtype,
        dims,
        strides,
        // (Unused by an im2col load; the shape of its bytes, for the checks.)
        boxes: std::iter::once(chunk as u32).chain(std::iter::once(pixels)).chain(std::iter::repeat_n(1, rank - 2)).collect(),
        swizzle: SWIZZLE,
        im2col: Some(crate::engine::cuda::tma::Im2col { lower, upper, channels: chunk as u32, pixels, element_strides: traversal }),
    };
    map.check().ok()?;
    Some(Im2colA { map, pixels_on_k, flip, rank, channels, grid, mul, off, taps, dil })
}

/// A data gradient's filter as its B (`(tap, k) x c`, c contiguous): by 3-D TMA over
/// `[c, k, taps]` (the taps in one run, as a packed filter's are), a stage one tap's 64 output
/// channels; with the tap index mirrored in convolution mode (`flip`). The map and whether it
/// is mirrored.
fn b_taps(p: &GemmProblem) -> Option<(TmaDesc, bool)> {
    use super::gather::Index;
    let g = p.b.gather.as_ref()?;
    let Index::Plain { stride: 1 } = g.mn else { return None };
    // (A block-diagonal filter is no tensor TMA can read.)
    if g.block.is_some() {
        return None;
    }
    let Index::Taps { taps, channels, ch_stride, tap_major: true, dil } = g.k else { return None };
    // (A grouped convolution's filters: `channels` a group, one group after another; the map
    // has them all and a load starts at its group's.)
    let groups = p.groups.max(1) as i64;
    if channels % 64 != 0 || !matches!(p.b.dtype, DataType::F16 | DataType::Bf16) || (groups > 1 && p.b.batch_stride != channels * ch_stride) {
        return None;
    }
    // The taps: unit steps forwards (base 0) or backwards (base T - 1), in one run; a dim of one
    // tap at its first element (a strided data gradient's phase may take one tap at an offset:
    // conv/phase.rs).
    if (0..3).any(|d| taps[d] == 1 && (g.axes[d].base != 0 || g.axes[d].div != 1)) {
        return None;
    }
    let used: Vec<usize> = (0..3).filter(|&d| taps[d] > 1).collect();
    let flip = used.first().is_some_and(|&d| dil[d] < 0);
    let mut tap_stride = 0;
    let mut run: Vec<(i64, i64)> = Vec::new();
    for &d in &used {
        let a = &g.axes[d];
        let (step, base) = if flip { (-1, taps[d] - 1) } else { (1, 0) };
        if dil[d] != step || a.base != base || a.div != 1 || a.extent != taps[d] {
            return None;
        }
        run.push((taps[d], a.stride));
    }
    for w in run.windows(2) {
        if w[0].1 != w[1].1 * w[1].0 {
            return None;
        }
    }
    if let Some(&(_, s)) = run.last() {
        tap_stride = s;
    }
    let es = p.b.dtype.size() as u64;
    let total: i64 = taps.iter().product();
    let t = TmaDesc {
        tensor: p.b.tensor,
        dtype: p.b.dtype,
        dims: vec![p.n as u64, (channels * groups) as u64, total as u64],
        strides: vec![ch_stride as u64 * es, if total > 1 { tap_stride as u64 * es } else { 16 }],
        boxes: vec![64, 64, 1],
        swizzle: SWIZZLE,
        im2col: None,
    };
    t.check().ok()?;
    Some((t, flip))
}

/// The TMA map of a gathered B that is a strided matrix after all (a packed filter of fprop, a
/// packed output gradient of wgrad), loaded by TMA instead of the producers' gathers; with a
/// batch dim over a grouped convolution's groups.
fn b_tma(p: &GemmProblem) -> Option<TmaDesc> {
    p.b.gather.as_ref()?.as_matrix()?;
    major(&p.b, false)?;
    let t = tma_of(&p.b, false, 128, p.groups);
    t.check().is_ok().then_some(t)
}

/// A gathered operand's layout in shared memory: K-major when its k index is contiguous in
/// memory, else M/N-major when its other index is, else K-major (loaded element by element);
/// and whether 16-byte vectors load it (aligned, and the contiguous index's extent a whole
/// number of vectors, so that no vector is cut by it; a grouped convolution's groups a whole
/// number of vectors apart). `is_a`: A (`m x k`), else B (`k x n`).
fn gather_major(op: &Operand, is_a: bool) -> (Major, bool) {
    let Some(g) = &op.gather else { return (Major::K, false) };
    let vec = (16 / op.dtype.size()) as i64;
    let (k, mn) = if is_a { (op.cols, op.rows) } else { (op.rows, op.cols) };
    // (A grouped convolution's operand: its groups a whole number of vectors apart too.)
    let group_ok = op.batch_stride % vec == 0;
    if g.k.contiguous(vec) {
        (Major::K, g.aligned(true, vec) && k as i64 % vec == 0 && group_ok)
    } else if g.mn.contiguous(vec) {
        (Major::Mn, g.aligned(false, vec) && mn as i64 % vec == 0 && group_ok)
    } else {
        (Major::K, false)
    }
}

/// fp8 inputs (e4m3 or e5m2, each operand its own) that may accumulate in the tensor cores'
/// adder (`GemmProblem::fast_fp8`): `wgmma ... k32` at twice the 16-bit rate, both operands
/// K-major. (Its sums keep fewer bits than f32: relative errors of 7e-5 at K = 96 and 3e-4 at
/// K = 4096 against the CPU engine's f32 sums, measured on the H100.)
fn fp8(p: &GemmProblem) -> bool {
    p.a.dtype.is_fp8() && p.b.dtype.is_fp8() && p.fast_fp8
}

/// 8-bit integers (i8 or u8, each operand its own): `wgmma ... k32` into exact i32 sums, both
/// operands K-major, converted to f32 once a tile is done: C must be a float (bf16, f16, f32;
/// integer C types, stored exactly, run on the mma.sync kernel).
fn int8(p: &GemmProblem) -> bool {
    super::byte_int(p.a.dtype) && super::byte_int(p.b.dtype)
}

/// f32 inputs that run as tf32: `wgmma ... .tf32` reads the f32 bits and ignores the low 13
/// (A is truncated; B, when copied, is rounded to nearest first).
fn tf32(p: &GemmProblem) -> bool {
    p.a.dtype == DataType::F32 && p.b.dtype == DataType::F32 && p.allow_tf32
}

/// tf32 with B stored `k x n` (N-major, the usual row-major B): wgmma takes 32-bit operands
/// K-major only, so a first launch copies B transposed into the workspace, `n` rows of `KP`
/// floats (k rounded up to 4: 16-byte rows for TMA) per batch (one copy when B is broadcast).
fn b_transposed(p: &GemmProblem) -> bool {
    tf32(p) && major(&p.b, false) == Some(Major::Mn)
}

/// Row length of the transposed copy of B.
fn kp(p: &GemmProblem) -> usize {
    p.k.next_multiple_of(4)
}

/// Batches of the transposed copy of B.
fn bt_batches(p: &GemmProblem) -> usize {
    if p.b.batch_stride != 0 && p.batch > 1 {
        p.batch
    } else {
        1
    }
}

/// B as the main kernel reads it: the operand itself, or its K-major copy in the workspace
/// (the same tensor id, the copy's strides).
fn b_operand(p: &GemmProblem) -> Operand {
    if !b_transposed(p) {
        return p.b.clone();
    }
    let kp = kp(p) as i64;
    let batch_stride = if bt_batches(p) > 1 { p.n as i64 * kp } else { 0 };
    Operand { row_stride: 1, col_stride: kp, batch_stride, ..p.b.clone() }
}

/// The launch that copies B (`k x n`, any strides) into scratch buffer `scratch` as `n` rows of
/// KP floats per batch, each value rounded to nearest tf32 (`cvt.rna`), through 32 x 32 tiles in
/// shared memory so that both the reads (along n) and the writes (along k) are coalesced
/// (`transpose.cuh`).
fn transpose_launch(p: &GemmProblem, entry: &str, scratch: usize, target: &Target) -> Launch {
    let b = &p.b;
    let (tk, tn) = (p.k.div_ceil(32), p.n.div_ceil(32));
    let tiles = tk * tn * bt_batches(p);
    let mut sig = Signature::new();
    sig.param("const float* __restrict__ b", Arg::Ptr(b.tensor)).param("float* __restrict__ bt", Arg::Scratch(scratch));
    let source = Source::new()
        .entry(entry, &sig)
        .define("TR_K", p.k)
        .define("TR_N", p.n)
        .define("TR_KP", kp(p))
        .define("TR_TK", tk)
        .define("TR_TN", tn)
        .define("TR_TILES", tiles)
        .define("TR_BS", if bt_batches(p) > 1 { b.batch_stride } else { 0 })
        .define("TR_RS", b.row_stride)
        .define("TR_CS", b.col_stride)
        .template(include_str!("transpose.cuh"))
        .build();
    let grid = tiles.min(8 * target.sm_count.max(1) as usize).max(1) as u32;
    // Launched independently, as the GEMM after it (the pair measured 9% slower as dependents).
    Launch::new(source, entry, Grid::Exact(grid, 1, 1), 256, sig.into_args()).with_pdl(Pdl::Independent)
}

/// The major-ness of an operand: A is `m x k` (rows = m), B is `k x n` (rows = k).
fn major(op: &Operand, is_a: bool) -> Option<Major> {
    let (k_stride, mn_stride) = if is_a { (op.col_stride, op.row_stride) } else { (op.row_stride, op.col_stride) };
    if k_stride == 1 && (mn_stride != 1 || op.cols == 1) {
        Some(Major::K)
    } else if mn_stride == 1 {
        Some(Major::Mn)
    } else {
        None
    }
}

/// The TMA map of an operand: dims innermost first (the contiguous dim, then the other matrix
/// dim, then the batch when the operand is not broadcast over it).
fn tma_of(op: &Operand, is_a: bool, tile: usize, batch: usize) -> TmaDesc {
    let es = op.dtype.size() as u64;
    let (mn, kdim) = if is_a { (op.rows as u64, op.cols as u64) } else { (op.cols as u64, op.rows as u64) };
    let (k_stride, mn_stride) = if is_a { (op.col_stride, op.row_stride) } else { (op.row_stride, op.col_stride) };
    // The tile's rows of A (`tile`: BM, or 64), or its columns of B (in 64-wide chunks when
    // B is N-major).
    let tile_mn = if is_a || major(op, false) == Some(Major::K) { tile } else { tile.max(64) } as u32;
    let bk = bk(op.dtype) as u32;
    let (mut dims, mut strides, mut boxes) = match major(op, is_a) {
        Some(Major::K) => (vec![kdim, mn], vec![mn_stride as u64 * es], vec![bk, tile_mn]),
        Some(Major::Mn) => (vec![mn, kdim], vec![k_stride as u64 * es], vec![128 / es as u32, bk]),
        // Not loadable: a descriptor that check() rejects (stride 1 byte).
        None => (vec![mn, kdim], vec![1], vec![64, bk]),
    };
    if op.batch_stride != 0 && batch > 1 {
        dims.push(batch as u64);
        strides.push(op.batch_stride as u64 * es);
        boxes.push(1);
    }
    TmaDesc { tensor: op.tensor, dtype: op.dtype, dims, strides, boxes, swizzle: SWIZZLE, im2col: None }
}

/// The kernel's launches: one persistent launch.
pub fn kernels(p: &GemmProblem, epi: &Epilogue, target: &Target, entry: &str) -> Option<NodeKernels> {
    kernels_with(p, epi, target, entry, choose(p, target, &Options::default()))
}

/// [`kernels`] with a given configuration (for tuning; `None` when it cannot run `p`): of the
/// problem as given, or as C^T = B^T A^T when the configuration says so.
pub fn kernels_with(p: &GemmProblem, epi: &Epilogue, target: &Target, entry: &str, cfg: Config) -> Option<NodeKernels> {
    if cfg.swap {
        kernels_of(&swapped(p), epi, target, entry, cfg)
    } else {
        kernels_of(p, epi, target, entry, cfg)
    }
}

/// The launches of the problem the kernel computes (with `cfg.swap`, the swapped one).
fn kernels_of(p: &GemmProblem, epi: &Epilogue, target: &Target, entry: &str, cfg: Config) -> Option<NodeKernels> {
    // (A tap folds C's reduction into whole tiles' epilogues: no stream-K with one.)
    let cfg = if epi.tap.is_some() { Config { streamk: false, ..cfg } } else { cfg };
    if cfg.streamk && (cfg.splits != 1 || cfg.swap || cfg.bm != BM || gathered(p) || im2col_a(p).is_some()) {
        return None;
    }
    let kt = p.k.div_ceil(bk(p.a.dtype));
    let bad_split = cfg.splits == 0 || cfg.splits > kt || (cfg.splits > 1 && (cfg.tma_store || cfg.swap));
    // (8-bit integers: the i32 sums of whole 128-row tiles, converted once; a split or a second
    // consumer's sums would add rounded partials.)
    if int8(p) && (cfg.splits != 1 || cfg.streamk || cfg.swap || cfg.bm != BM) {
        return None;
    }
    // (An integer C: no tap of its values.)
    if p.c.dtype.is_integer() && epi.tap.is_some() {
        return None;
    }
    // 64-row tiles: one CTA per tile, 16-bit, B K-major for the narrow widths, no TMA store.
    let bad_bm = match cfg.bm {
        128 => !matches!(cfg.bn, 64 | 128 | 256),
        64 => !matches!(cfg.bn, 16 | 32 | 64 | 128) || cfg.tma_store || tf32(p) || (cfg.bn < 64 && major(&p.b, false) != Some(Major::K)),
        _ => true,
    };
    if reject_as(p, target, cfg.swap && tf32(p)).is_some() || (cfg.tma_store && !tma_store_ok(p)) || bad_bm || cfg.shared_bytes() > 227 * 1024 || bad_split {
        return None;
    }
    // A tap needs one launch over C's own tiles and the side-value epilogue.
    if epi.tap.is_some() && (!cfg.folds_tap() || epi.sides.is_none()) {
        return None;
    }
    // Scratch buffers: B's transposed copy (tf32), the tap's partials, the split partials.
    let mut launches = Vec::new();
    let mut scratch = Vec::new();
    let b = b_operand(p);
    if b_transposed(p) {
        scratch.push(bt_batches(p) * p.n * kp(p) * 4);
        launches.push(transpose_launch(p, &format!("{entry}_bt"), 0, target));
    }
    let tiles = p.batch * p.m.div_ceil(cfg.bm) * p.n.div_ceil(cfg.bn) * cfg.splits;
    let grid = tiles.min(target.sm_count.max(1) as usize).max(1) as u32;
    let mut sig = Signature::new();
    let (ma, mb, a3, b3);
    let im2col = im2col_a(p);
    if let Some(ic) = &im2col {
        // A by im2col loads, B by TMA: the TMA kernel with one producer thread.
        if cfg.bm != BM || cfg.swap {
            return None;
        }
        // (B's matrix map has a batch dim over a grouped convolution's groups: `b3`.)
        let (tb, b_batched) = match b_taps(p) {
            Some((t, _)) if b_tma(p).is_none() => {
                mb = Major::Mn;
                (t, false)
            }
            _ => {
                mb = major(&p.b, false)?;
                let t = tma_of(&p.b, false, cfg.bn, p.groups);
                t.check().ok()?;
                let batched = t.dims.len() == 3;
                (t, batched)
            }
        };
        if (tf32(p) || int8(p)) && mb != Major::K {
            return None;
        }
        (ma, a3, b3) = (if ic.pixels_on_k { Major::Mn } else { Major::K }, false, b_batched);
        sig.param("const __grid_constant__ TmaMap ta", Arg::TensorMap(Box::new(ic.map.clone()))).param("const __grid_constant__ TmaMap tb", Arg::TensorMap(Box::new(tb)));
    } else if gathered(p) {
        // The producers read the tensors themselves (a tile of 128 x BN, BN at most 128, and
        // stages enough to keep GEMM_LAG of them in flight).
        if cfg.bm != BM || cfg.bn > 128 || cfg.swap || cfg.stages < 3 {
            return None;
        }
        a3 = false;
        sig.param("const void* __restrict__ ga", Arg::Ptr(p.a.tensor));
        ma = gather_major(&p.a, true).0;
        match b_tma(p) {
            Some(_) => {
                mb = major(&p.b, false)?;
                let tb = tma_of(&p.b, false, cfg.bn, p.groups);
                tb.check().ok()?;
                // (A batch dim over a grouped convolution's groups.)
                b3 = tb.dims.len() == 3;
                sig.param("const __grid_constant__ TmaMap tb", Arg::TensorMap(Box::new(tb)));
            }
            None => {
                mb = gather_major(&p.b, false).0;
                b3 = false;
                sig.param("const void* __restrict__ gb", Arg::Ptr(p.b.tensor));
            }
        }
    } else {
        (ma, mb) = (major(&p.a, true)?, major(&b, false)?);
        let ta = tma_of(&p.a, true, cfg.bm, p.batch);
        let tb = tma_of(&b, false, cfg.bn, p.batch);
        if ta.check().is_err() || tb.check().is_err() {
            return None;
        }
        (a3, b3) = (ta.dims.len() == 3, tb.dims.len() == 3);
        let tb_arg = if b_transposed(p) { Arg::ScratchTensorMap(0, Box::new(tb)) } else { Arg::TensorMap(Box::new(tb)) };
        sig.param("const __grid_constant__ TmaMap ta", Arg::TensorMap(Box::new(ta))).param("const __grid_constant__ TmaMap tb", tb_arg);
    }
    if cfg.tma_store {
        sig.param("const __grid_constant__ TmaMap tcm", Arg::TensorMap(Box::new(tma_of_c(p))));
    }
    sig.param("void* __restrict__ c", Arg::Ptr(p.c.tensor));
    // The tap's partials (before the split partials: a tap comes without a split).
    let tap_part = epi.tap.as_ref().map(|tap| {
        scratch.push(tap_parts(tap, p, cfg.bn) * 4);
        scratch.len() - 1
    });
    // The split partials (a null pointer when there is no split).
    let part = scratch.len();
    sig.param("float* __restrict__ part", if cfg.splits > 1 { Arg::Scratch(part) } else { Arg::I64(0) });
    if let Some(at) = tap_part {
        sig.param("float* __restrict__ tpart", Arg::Scratch(at));
    }
    // The split tail: a slot of f32 sums and a flag per CTA, the flags zeroed by a launch first.
    // (A tuning candidate of another tile width may have no tail worth splitting: whole tiles.)
    let tail = if cfg.streamk { tail_split(tiles, kt, grid as usize) } else { None };
    let cfg = Config { streamk: tail.is_some(), ..cfg };
    if cfg.streamk {
        scratch.push(grid as usize * cfg.bm * cfg.bn * 4);
        scratch.push(grid as usize * 4);
        sig.param("float* __restrict__ skpart", Arg::Scratch(scratch.len() - 2)).param("unsigned* __restrict__ skflag", Arg::Scratch(scratch.len() - 1));
        launches.push(zero_flags_launch(&format!("{entry}_skz"), scratch.len() - 1, grid));
    }
    super::epilogue_params(&mut sig, epi);
    let source = source(p, epi, &cfg, tail, ma, mb, a3, b3, entry, &sig);
    // As a programmatic dependent launch the unsplit kernel measured slower on the H100 (6% with
    // a bias + relu epilogue, 9% for tf32 after the transpose); the split one (decode) 2% faster.
    let launch = Launch {
        source,
        entry: entry.to_string(),
        grid: Grid::Exact(grid, 1, 1),
        block: threads(p),
        shared_bytes: cfg.shared_bytes() as u32,
        args: sig.into_args(),
        cluster: None,
        pdl: if cfg.splits == 1 && !cfg.swap { Pdl::Independent } else { Pdl::Dependent },
    };
    launches.push(launch);
    if let (Some(tap), Some(at)) = (&epi.tap, tap_part) {
        launches.push(tap_launch(tap, p, cfg.bn, &format!("{entry}_tap"), at));
    }
    if cfg.splits > 1 {
        scratch.push(cfg.splits * p.batch * p.m * (p.n + p.n % 2) * 4);
        launches.push(reduce_launch(p, epi, cfg.splits, &format!("{entry}_reduce"), part));
    }
    Some(NodeKernels { launches, scratch })
}

/// The Hopper unit of a GEMM group: the wgmma kernel, with the mma.sync kernel (scalar loads,
/// no alignment needs) as the alternative for buffers that are not 16-byte aligned at execute
/// time (TMA needs aligned base addresses). `None` when this kernel cannot run the problem.
pub fn unit(graph: &Graph, nodes: &[usize], p: &GemmProblem, epi: &Epilogue, target: &Target, options: &Options) -> Result<Option<Unit>> {
    let Some(&last) = nodes.last() else { return Ok(None) };
    let cfg = choose(p, target, options);
    let Some(kernels) = kernels_with(p, epi, target, &entry_name(last, "gemm_sm90"), cfg) else { return Ok(None) };
    let Some(alt) = super::sm80::choose(p, target) else { return Ok(None) };
    let mut alternative = super::sm80::kernels(&alt.scalar(), p, epi, last, "_u");
    let mut writes = vec![p.c.tensor];
    if let Some(tap) = &epi.tap {
        // The alternative reduces the stored C with the reduction node's own kernel.
        let r = crate::engine::cuda::fallback::generate(graph, tap.node)?;
        let base = alternative.scratch.len();
        alternative.scratch.extend(r.scratch);
        alternative.launches.extend(r.launches.into_iter().map(|mut l| {
            for a in &mut l.args {
                match a {
                    Arg::Scratch(i) | Arg::ScratchTensorMap(i, _) => *i += base,
                    _ => {}
                }
            }
            l
        }));
        writes.push(tap.y);
    }
    let mut tensors = vec![p.a.tensor, p.b.tensor, p.c.tensor];
    tensors.extend(vector_sides(p, epi, &cfg));
    tensors.sort_by_key(|t| t.0);
    tensors.dedup();
    Ok(Some(Unit { nodes: nodes.to_vec(), kernels, writes, unaligned: Some(Box::new(Unaligned { tensors, kernels: alternative })) }))
}

/// Whether the kernel configuration for `p` can fold a reduction of C into its epilogue
/// ([`Tap`]): one launch without a split of k, C as the problem gives it (not C^T), and the
/// epilogue from the side inputs' layouts (every generated epilogue has them).
pub fn takes_tap(p: &GemmProblem, target: &Target, options: &Options) -> bool {
    reject(p, target).is_none() && choose(p, target, options).folds_tap()
}

/// The partials a tap's kernel writes: one per consumer warp and tile (all), per tile column,
/// batch and row (rows), per tile row, consumer warp, batch and column (columns).
fn tap_parts(tap: &Tap, p: &GemmProblem, bn: usize) -> usize {
    let (tiles_m, tiles_n) = (p.m.div_ceil(BM), p.n.div_ceil(bn));
    match tap.axes {
        TapAxes::All => p.batch * tiles_m * tiles_n * 8,
        TapAxes::Rows => tiles_n * p.batch * p.m,
        TapAxes::Cols => tiles_m * 8 * p.batch * p.n,
    }
}

/// The tap's reduction mode and axes as the templates name them (`tap.cuh`).
fn tap_defines(src: Source, tap: &Tap) -> Source {
    let mode = match tap.mode {
        ReductionMode::Amax => "TAP_AMAX",
        ReductionMode::Max => "TAP_MAX",
        ReductionMode::Add => "TAP_ADD",
        _ => "TAP_MIN",
    };
    let axes = match tap.axes {
        TapAxes::All => "TAP_ALL",
        TapAxes::Rows => "TAP_ROWS",
        TapAxes::Cols => "TAP_COLS",
    };
    src.define("TAP_MODE", mode).define("TAP_AXES", axes)
}

/// The tap's second launch, folding the partials in a fixed order: one block over all of them
/// (all), or a thread per row or column of each batch, each over its partials in tile order;
/// the result stored in the reduction's output at its strides (`tap_reduce.cuh`).
fn tap_launch(tap: &Tap, p: &GemmProblem, bn: usize, entry: &str, scratch: usize) -> Launch {
    let mut sig = Signature::new();
    sig.param("const float* __restrict__ part", Arg::Scratch(scratch)).param("void* __restrict__ y", Arg::Ptr(tap.y));
    let src = tap_defines(Source::new().entry(entry, &sig), tap).define("TAP_Y", dt_code(tap.dtype));
    let parts = tap_parts(tap, p, bn);
    let (src, threads, block) = match tap.axes {
        TapAxes::All => (src.define("TAP_PARTS", parts), 1024, 1024),
        TapAxes::Rows | TapAxes::Cols => {
            let rows = tap.axes == TapAxes::Rows;
            // Outputs (batch, index): index a row (rows) or a column; partial q of output i at
            // part[(q * OUTS) + i]; the index's stride in y; y's batch strides over C's batch dims.
            let (extent, count, stride) =
                if rows { (p.m, p.n.div_ceil(bn), tap.y_strides[tap.y_strides.len() - 2]) } else { (p.n, p.m.div_ceil(BM) * 8, tap.y_strides[tap.y_strides.len() - 1]) };
            let outs = p.batch * extent;
            let rank = tap.y_strides.len();
            let batch: Vec<(i64, i64)> = (0..rank - 2).map(|a| (tap.y_dims[a], tap.y_strides[a])).collect();
            let src = src
                .define("TAP_OUTS", outs)
                .define("TAP_COUNT", count)
                .define("TAP_EXTENT", extent)
                .define("TAP_STRIDE", stride)
                .define("TAP_BATCH_OFFSET", batch_terms(&batch, "bt"));
            (src, outs as u64, 256)
        }
    };
    let source = src.template(COMMON).template(include_str!("tap.cuh")).template(include_str!("tap_reduce.cuh")).build();
    Launch::new(source, entry, Grid::Cover(threads), block, sig.into_args())
}

/// The offset of flat batch index `bt` (a C expression) in a tensor whose batch dims are `batch`
/// ((extent, stride) each, outermost first, stride 0 where broadcast), as the terms
/// ` + (bt % e) * s ...` of an index expression (empty when no batch dim moves the tensor).
fn batch_terms(batch: &[(i64, i64)], bt: &str) -> String {
    let mut terms = String::new();
    let mut q = bt.to_string();
    for &(extent, stride) in batch.iter().rev() {
        if stride != 0 {
            let _ = write!(terms, " + ({q} % {extent}LL) * {stride}LL");
        }
        q = format!("{q} / {extent}LL");
    }
    terms
}

/// How the kernel reads a side input of the epilogue from the side inputs' layouts (see
/// `epilogue.rs`): side values that do not change along a tile's rows or columns are loaded
/// once per tile, before the last k step's wgmmas complete, so their latency hides under the
/// tensor cores and the store loop carries no dependent loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SideRead {
    /// One value.
    Scalar,
    /// Per-row values (`[.., m, 1]`): the thread's two rows.
    Row,
    /// Per-column values (`[.., 1, n]`): the thread's `BN / 4` columns, as 2-element vectors
    /// (one 32-bit register for two 16-bit values), where [`Side::pairs`] allows.
    Col2,
    /// The same one value at a time.
    Col,
    /// Full tensors (and per-column ones beyond a budget of 64 registers): inside the store
    /// loop, one vector load per accumulator pair, from row pointers computed once per tile.
    Full2,
    /// The same one value at a time.
    Full,
}

impl SideRead {
    /// Its name in the templates (`SIDE_PREP_<name>` in `sm90.cuh`).
    fn name(self) -> &'static str {
        match self {
            SideRead::Scalar => "SCALAR",
            SideRead::Row => "ROW",
            SideRead::Col2 => "COL2",
            SideRead::Col => "COL",
            SideRead::Full2 => "FULL2",
            SideRead::Full => "FULL",
        }
    }
    /// Read as 2-element vectors: the base pointer must be 16-byte aligned.
    fn vector(self) -> bool {
        matches!(self, SideRead::Col2 | SideRead::Full2)
    }
}

/// How a kernel with tiles `bn` wide reads each side input.
fn side_reads(p: &GemmProblem, sides: &[Side], bn: usize) -> Vec<SideRead> {
    let mut budget = 64usize;
    sides
        .iter()
        .map(|sd| {
            let pairs = sd.pairs(p.n);
            let regs = if pairs && sd.dtype.size() == 2 { bn / 8 } else { bn / 4 };
            let kind = match sd.kind() {
                SideKind::PerCol if regs > budget => SideKind::Full,
                k => k,
            };
            match kind {
                SideKind::Scalar => SideRead::Scalar,
                SideKind::PerRow => SideRead::Row,
                SideKind::PerCol => {
                    budget -= regs;
                    if pairs {
                        SideRead::Col2
                    } else {
                        SideRead::Col
                    }
                }
                SideKind::Full if pairs => SideRead::Full2,
                SideKind::Full => SideRead::Full,
            }
        })
        .collect()
}

/// The side inputs the kernel of `cfg` reads with loads hoisted out of the store loop (the
/// epilogue gives their layouts; one launch over C as the problem gives it), or None.
fn hoisted_sides<'a>(epi: &'a Epilogue, cfg: &Config) -> Option<&'a [Side]> {
    match &epi.sides {
        Some(sides) if cfg.splits == 1 && !cfg.swap => Some(sides),
        _ => None,
    }
}

/// Side inputs of the epilogue that the kernel of `cfg` reads as 2-element vectors: their base
/// pointers must be 16-byte aligned (as A's, B's and C's for TMA).
pub fn vector_sides(p: &GemmProblem, epi: &Epilogue, cfg: &Config) -> Vec<TensorId> {
    let Some(sides) = hoisted_sides(epi, cfg) else { return Vec::new() };
    sides.iter().zip(side_reads(p, sides, cfg.bn)).filter(|(_, r)| r.vector()).map(|(sd, _)| sd.tensor).collect()
}

/// The defines of `sm90_common.cuh`, for the kernel and its split-k reduce: the problem's
/// extents, C's type and strides, the epilogue's arguments.
fn common_defines(src: Source, p: &GemmProblem, epi: &Epilogue, splits: usize, swap: bool) -> Source {
    let c = &p.c;
    src.define("GEMM_M", p.m)
        .define("GEMM_N", p.n)
        .define("GEMM_BATCH", p.batch)
        .define("GEMM_SPLITS", splits)
        .define("GEMM_C", dt_code(c.dtype))
        .define("GEMM_C_RS", c.row_stride)
        .define("GEMM_C_CS", c.col_stride)
        .define("GEMM_C_BS", c.batch_stride)
        .flag("GEMM_C_PAIRS", c.col_stride == 1 && c.row_stride % 2 == 0 && c.batch_stride % 2 == 0)
        .flag("GEMM_SWAP", swap)
        .define("EPI_NAMES", &epi.names)
}

/// The kernel's text (`sm90.cuh`): the configuration as defines (with the side inputs' reads,
/// [`side_reads`]), then the templates.
#[allow(clippy::too_many_arguments)]
fn source(p: &GemmProblem, epi: &Epilogue, cfg: &Config, tail: Option<(usize, usize)>, ma: Major, mb: Major, a3: bool, b3: bool, entry: &str, sig: &Signature) -> String {
    // tf32 with A M-major (C^T of a B stored `k x n`): A's fragments come from registers.
    let rs = p.a.dtype == DataType::F32 && ma == Major::Mn;
    // A last relu applied by the TMA-store epilogue's conversion (one instruction a pair instead
    // of two a value: the bias + relu epilogue is 420 SASS instructions instead of 655).
    // (`relu_last` comes only with the side inputs' layouts, so the epilogue is hoisted then.)
    let relu_cvt = epi.relu_last && cfg.tma_store;
    let sides = hoisted_sides(epi, cfg);
    let mut src = common_defines(Source::new().entry(entry, sig), p, epi, cfg.splits, cfg.swap)
        .define("GEMM_A", dt_code(p.a.dtype))
        .define("GEMM_B", dt_code(p.b.dtype))
        .flag("GEMM_A_MN", ma == Major::Mn)
        .flag("GEMM_B_MN", mb == Major::Mn)
        .define("GEMM_A3", a3)
        .define("GEMM_B3", b3)
        .flag("GEMM_RS", rs)
        .flag("GEMM_INT", int8(p))
        .flag("GEMM_INT_EXACT", int8(p) && epi.int_exact)
        .define("GEMM_THREADS", threads(p))
        .define("GEMM_BM", cfg.bm)
        .define("GEMM_BN", cfg.bn)
        .define("GEMM_BK", bk(p.a.dtype))
        .define("GEMM_STAGES", cfg.stages)
        .define("GEMM_STAGE_BYTES", cfg.stage_bytes())
        .define("GEMM_C_BYTES", cfg.c_bytes())
        .define("GEMM_KT", p.k.div_ceil(bk(p.a.dtype)))
        .define("GEMM_TILES_M", p.m.div_ceil(cfg.bm))
        .define("GEMM_TILES_N", p.n.div_ceil(cfg.bn))
        .define("GEMM_GROUP_M", cfg.group_m)
        .flag("GEMM_STREAMK", cfg.streamk)
        .define("GEMM_GROUPS", p.groups.max(1))
        .flag("GEMM_TMA_STORE", cfg.tma_store)
        .flag("GEMM_RELU_CVT", relu_cvt)
        .flag("GEMM_HOISTED", sides.is_some())
        .flag("GEMM_TAP", epi.tap.is_some());
    // The split tail's tiles and parts (`tail_split`).
    if let Some((tiles, ways)) = tail {
        src = src.define("GEMM_SK_TAIL", tiles).define("GEMM_SK_SPLITS", ways);
    }
    if let Some(sides) = sides {
        let list: Vec<String> = sides
            .iter()
            .zip(side_reads(p, sides, cfg.bn))
            .enumerate()
            .map(|(i, (sd, read))| format!("X({i}, {}, {}, {}LL, {}LL, {})", read.name(), c_type(sd.dtype), sd.row_stride, sd.col_stride, batch_terms(&sd.batch, "bt")))
            .collect();
        src = src.define("GEMM_SIDES(X)", list.join(" "));
    }
    if let Some(tap) = &epi.tap {
        src = tap_defines(src, tap);
    }
    src = src.flag("GEMM_GATHER", producers_gather(p));
    let im2col = im2col_a(p);
    src = src.flag("GEMM_A_IM2COL", im2col.is_some());
    if let Some(ic) = &im2col {
        src = src.define("GEMM_IC_RANK", ic.rank).define("GEMM_IC_C", ic.channels).flag("GEMM_IC_K", ic.pixels_on_k).flag("GEMM_IC_FLIP", ic.flip);
        // B by 3-D TMA, a stage one tap's 64 channels (a data gradient's filter).
        let taps = b_taps(p).filter(|_| b_tma(p).is_none());
        src = src.flag("GEMM_B_TAPS", taps.is_some()).flag("GEMM_BT_FLIP", taps.as_ref().is_some_and(|t| t.1)).define("GEMM_BT_T", ic.taps.iter().product::<i64>());
        for d in 0..3 {
            src = src
                .define(&format!("GEMM_IC_G{d}"), ic.grid[d])
                .define(&format!("GEMM_IC_MUL{d}"), ic.mul[d])
                .define(&format!("GEMM_IC_OFF{d}"), ic.off[d])
                .define(&format!("GEMM_IC_T{d}"), ic.taps[d])
                .define(&format!("GEMM_IC_DIL{d}"), ic.dil[d]);
        }
    } else if let (Some(ga), Some(gb)) = (&p.a.gather, &p.b.gather) {
        // Stages a producer thread keeps in flight before it makes the oldest visible: as many
        // as can be without a deadlock (the consumers release a stage only once they have the
        // next one, so the producer may hold back at most STAGES - 2).
        src = gb
            .defines(ga.defines(src, "GA_"), "GB_")
            .define("GEMM_K", p.k)
            .flag("GEMM_GA_VEC", gather_major(&p.a, true).1)
            .flag("GEMM_GB_VEC", gather_major(&p.b, false).1)
            .flag("GEMM_B_TMA", b_tma(p).is_some())
            .define("GEMM_GA_GS", p.a.batch_stride)
            .define("GEMM_GB_GS", p.b.batch_stride)
            .define("GEMM_PRODUCERS", PRODUCERS)
            .define("GEMM_LAG", cfg.stages - 2);
    }
    let mut src = src.template(HOPPER).template(COMMON).template(&epi.code);
    if epi.tap.is_some() {
        src = src.template(include_str!("tap.cuh"));
    }
    src = src.template(include_str!("wgmma.cuh")).template(include_str!("sm90_common.cuh"));
    if im2col.is_some() {
        src = src.template(include_str!("sm90_im2col.cuh"));
    } else if gathered(p) {
        src = src.template(GATHER).template(include_str!("sm90_gather.cuh"));
    }
    src.template(include_str!("sm90.cuh")).build()
}

/// The split tail's first launch: the `n` flags of scratch buffer `at` zeroed (the workspace holds
/// anything before an execute).
fn zero_flags_launch(entry: &str, at: usize, n: u32) -> Launch {
    let mut sig = Signature::new();
    sig.param("unsigned* __restrict__ skflag", Arg::Scratch(at));
    let source = Source::new().entry(entry, &sig).define("SK_FLAGS", n).template(include_str!("sm90_skz.cuh")).build();
    Launch::new(source, entry, Grid::Exact(1, 1, 1), 256, sig.into_args())
}

/// The split-k reduce launch (`sm90_reduce.cuh`): for each pair of columns, the splits' partial
/// sums added in order (deterministic), then the epilogue and the store.
fn reduce_launch(p: &GemmProblem, epi: &Epilogue, splits: usize, entry: &str, part: usize) -> Launch {
    let mut sig = Signature::new();
    sig.param("void* __restrict__ c", Arg::Ptr(p.c.tensor)).param("const float* __restrict__ part", Arg::Scratch(part));
    super::epilogue_params(&mut sig, epi);
    // C stored column-major (a weight gradient computed as dw^T): tiles transposed through
    // shared memory, so that both the partials' reads and C's stores are coalesced, each
    // element's splits over several threads (many splits over few tiles: the sums' latency,
    // not bandwidth, bounds the reduce; 66 splits of a 256 x 64 dw^T took 7.5 us on the H200
    // with one thread an element).
    let transposed = p.c.row_stride == 1 && p.c.col_stride != 1 && p.m > 1;
    // Threads sharing an element's splits (transposed): at most 8 loads a thread, 32 at most.
    let sg = splits.div_ceil(8).next_power_of_two().min(32);
    let source = common_defines(Source::new().entry(entry, &sig), p, epi, splits, false)
        .flag("GEMM_REDUCE_T", transposed)
        .define("RED_SG", sg)
        .template(COMMON)
        .template(&epi.code)
        .template(include_str!("sm90_common.cuh"))
        .template(include_str!("sm90_reduce.cuh"))
        .build();
    if transposed {
        // One 1024-thread block a tile of 32 columns x 32 / sg rows.
        let tiles = (p.batch * p.m.div_ceil(32 / sg) * p.n.div_ceil(32)) as u64;
        return Launch::new(source, entry, Grid::Cover(tiles * 1024), 1024, sig.into_args());
    }
    let pairs = (p.batch * p.m * (p.n + p.n % 2) / 2) as u64;
    Launch::elementwise(source, entry, pairs, sig.into_args())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cuda::{compile_cubin, nvrtc_available, CompileOptions};
    use crate::graph::TensorId;

    fn operand(t: usize, dtype: DataType, rows: usize, cols: usize, row_stride: i64, col_stride: i64, batch_stride: i64) -> Operand {
        Operand { tensor: TensorId(t), dtype, rows, cols, row_stride, col_stride, batch_stride, gather: None }
    }

    fn problem(batch: usize, m: usize, n: usize, k: usize, a_kmajor: bool, b_kmajor: bool, out: DataType) -> GemmProblem {
        let t = DataType::Bf16;
        let a = if a_kmajor { operand(0, t, m, k, k as i64, 1, (m * k) as i64) } else { operand(0, t, m, k, 1, m as i64, (m * k) as i64) };
        let b = if b_kmajor { operand(1, t, k, n, 1, k as i64, 0) } else { operand(1, t, k, n, n as i64, 1, 0) };
        let c = operand(2, out, m, n, n as i64, 1, (m * n) as i64);
        GemmProblem { batch, m, n, k, a, b, c, groups: 1, allow_tf32: false, fast_fp8: false }
    }

    fn identity() -> Epilogue {
        Epilogue::identity()
    }

    /// The wgmma instructions in a launch's PTX for sm_90a (None without NVRTC).
    fn wgmma_lines(l: &Launch) -> Option<Vec<String>> {
        if !nvrtc_available() {
            return None;
        }
        let text = crate::engine::cuda::kernel::kernel_text(l, &Target::sm90a()).0;
        let ptx = crate::engine::cuda::compile_ptx(&text, &l.entry, &CompileOptions::new("sm_90a")).expect("compiles");
        Some(ptx.lines().filter(|x| x.contains("wgmma.mma_async")).map(str::to_string).collect())
    }

    #[test]
    fn picks_and_rejects() {
        let t = Target::sm90a();
        let o = Options::default();
        let p = problem(1, 8192, 8192, 8192, true, false, DataType::Bf16);
        assert_eq!(reject(&p, &t), None);
        assert_eq!(choose(&p, &t, &o).bn, 256);
        // Groups of 16 tiles down M for long k loops, of 4 up to K = 4096.
        assert_eq!(choose(&p, &t, &o).group_m, 16);
        assert_eq!(choose(&problem(1, 16384, 4096, 1024, true, false, DataType::Bf16), &t, &o).group_m, 4);
        assert_eq!(choose(&problem(1, 4096, 4096, 4096, true, false, DataType::Bf16), &t, &o).group_m, 4);
        assert!(choose(&p, &t, &o).shared_bytes() <= 227 * 1024);
        assert!(reject(&p, &Target::sm80()).is_some());
        // k = 7: a row stride of 14 bytes cannot be a TMA stride.
        assert!(reject(&problem(1, 64, 64, 7, true, false, DataType::Bf16), &t).is_some());
        // Decode: C^T in 64 x 16 tiles, no split; 64 x 32 tiles for M = 17..32; A column-major
        // keeps the split 128-row tiles (A^T would be N-major, too narrow a tile for TMA).
        let d = choose(&problem(1, 16, 8192, 8192, true, false, DataType::Bf16), &t, &o);
        assert_eq!((d.swap, d.bm, d.bn, d.splits), (true, 64, 16, 1));
        assert!(d.stages == 8 && d.shared_bytes() <= 227 * 1024);
        assert_eq!(choose(&problem(1, 20, 8192, 8192, true, true, DataType::Bf16), &t, &o).bn, 32);
        let d = choose(&problem(1, 16, 8192, 8192, false, false, DataType::Bf16), &t, &o);
        assert_eq!((d.swap, d.bn, d.splits), (false, 128, 2));
        // Fewer columns: 128-wide tiles and split k.
        let d = choose(&problem(1, 16, 2048, 8192, true, false, DataType::Bf16), &t, &o);
        assert_eq!((d.bn, d.splits > 1), (128, true));
        // The last wave split along k where it is mostly idle: ViT's weight gradients as 144 tiles
        // of 128 columns for 132 SMs (12 in 11 parts; before, 72 of 256 in one wave); not where
        // the tail is wide (BERT's projection, 192 tiles of 128: 60 in the last wave), the last
        // wave nearly full (4096^3: 256 tiles of 256, 124 in the last wave; 8192^3) or the
        // tiles few.
        for (m, n, k, a_kmajor, bn, parts) in [(768, 3072, 6304, false, 128, 11), (3072, 768, 6304, false, 128, 11)] {
            let d = choose(&problem(1, m, n, k, a_kmajor, true, DataType::Bf16), &t, &o);
            assert!(d.streamk && d.splits == 1 && !d.swap && d.bn == bn, "{m}x{n}x{k}: {d:?}");
            let tiles = m.div_ceil(BM) * n.div_ceil(bn);
            assert_eq!(tail_split(tiles, k / 64, 132).map(|s| s.1), Some(parts), "{m}x{n}x{k}");
        }
        // C column-major (dW^T = X^T dY written transposed): the kernel computes C^T, whole tiles.
        let mut q = problem(1, 2048, 5632, 4096, false, false, DataType::Bf16);
        q.c.row_stride = 1;
        q.c.col_stride = 2048;
        let d = choose(&q, &t, &o);
        assert!(d.swap && d.bm == BM && d.splits == 1 && !d.tma_store, "{d:?}");
        for (m, n, k) in [(4096, 4096, 4096), (8192, 8192, 8192), (256, 256, 8192), (4096, 768, 3072)] {
            assert!(!choose(&problem(1, m, n, k, true, false, DataType::Bf16), &t, &o).streamk, "{m}x{n}x{k}");
        }
    }

    #[test]
    fn kernels_compile_for_sm90a() {
        if !nvrtc_available() {
            eprintln!("skipped: NVRTC not found");
            return;
        }
        let t = Target::sm90a();
        let o = Options::default();
        for (p, what) in [
            (problem(1, 8192, 8192, 8192, true, false, DataType::Bf16), "A K-major, B N-major"),
            (problem(3, 304, 200, 136, false, true, DataType::F32), "A M-major, B K-major, batched"),
            (problem(1, 16, 8192, 8192, true, false, DataType::Bf16), "decode, C^T"),
            (problem(2, 24, 8192, 512, true, true, DataType::F16), "decode, C^T, B K-major, batched"),
            (problem(1, 16, 2048, 8192, true, false, DataType::Bf16), "decode, split k"),
            (problem(1, 40, 4296, 48, true, true, DataType::F32), "B K-major, f32 out"),
            (fp8_problem(problem(1, 1100, 4000, 400, true, true, DataType::Bf16), DataType::Fp8E4m3, DataType::Fp8E4m3), "fp8 e4m3"),
            (fp8_problem(problem(2, 72, 136, 96, true, true, DataType::F32), DataType::Fp8E5m2, DataType::Fp8E4m3), "fp8 e5m2 x e4m3, batched"),
            (problem(1, 768, 3072, 6304, false, true, DataType::Bf16), "stream-K, A M-major"),
            (
                {
                    let mut q = problem(1, 2048, 5632, 4096, false, false, DataType::Bf16);
                    q.c.row_stride = 1;
                    q.c.col_stride = 2048;
                    q
                },
                "C column-major, as C^T",
            ),
        ] {
            let k = kernels(&p, &identity(), &t, "gemm_test").unwrap_or_else(|| panic!("{what}: no kernel"));
            for l in &k.launches {
                let src = format!("{}\n{}", crate::engine::cuda::kernel::PRELUDE, l.source);
                compile_cubin(&src, &l.entry, &CompileOptions::new("sm_90a")).unwrap_or_else(|e| panic!("{what}, {}: {e}", l.entry));
            }
        }
        // The 64-wide tile, a configuration the probe (tests/cuda_sm90.rs) times.
        let p = problem(1, 16, 8192, 8192, true, false, DataType::Bf16);
        let cfg = Config { bn: 64, splits: 1, stages: 8, tma_store: true, bm: BM, swap: false, streamk: false, ..choose(&p, &t, &o) };
        let k = kernels_with(&p, &identity(), &t, "gemm_test", cfg).expect("BN 64 config");
        let src = format!("{}\n{}", crate::engine::cuda::kernel::PRELUDE, k.launches[0].source);
        compile_cubin(&src, "gemm_test", &CompileOptions::new("sm_90a")).unwrap_or_else(|e| panic!("BN 64: {e}"));
        // tf32: B N-major (C^T with B^T from registers), B K-major, batched with split k (B N-major
        // through a transposed copy).
        for (p, what, launches) in [
            (tf32_problem(problem(1, 8192, 8192, 8192, true, false, DataType::F32)), "tf32, B N-major", 1),
            (tf32_problem(problem(1, 300, 200, 136, true, true, DataType::Bf16)), "tf32, B K-major", 1),
            (tf32_problem(problem(2, 64, 64, 4096, true, false, DataType::F32)), "tf32, split", 3),
        ] {
            let k = kernels(&p, &identity(), &t, "gemm_test").unwrap_or_else(|| panic!("{what}: no kernel ({:?})", reject(&p, &t)));
            assert_eq!(k.launches.len(), launches, "{what}");
            for l in &k.launches {
                let src = format!("{}\n{}", crate::engine::cuda::kernel::PRELUDE, l.source);
                compile_cubin(&src, &l.entry, &CompileOptions::new("sm_90a")).unwrap_or_else(|e| panic!("{what}: {e}"));
            }
        }
    }

    /// The problem with f32 inputs allowed to run as tf32.
    fn tf32_problem(mut p: GemmProblem) -> GemmProblem {
        p.a.dtype = DataType::F32;
        p.b.dtype = DataType::F32;
        p.allow_tf32 = true;
        p
    }

    /// An autotuning's candidates: the heuristic's first, then other widths and tile orders,
    /// each a configuration the kernel takes; the `gemm_config` knob (`Target::gemm_config`)
    /// picks one; problems that split k or compute C^T have only the heuristic's.
    #[test]
    fn tuning_candidates_are_valid_configurations() {
        let t = Target::sm90a();
        for p in [
            problem(1, 8192, 8192, 8192, true, false, DataType::Bf16),
            problem(1, 16384, 4096, 1024, true, true, DataType::Bf16),
            problem(2, 304, 200, 136, false, true, DataType::F16),
        ] {
            let v = tuning_configs(&p, &t);
            assert_eq!(v[0], heuristic(&p, &t));
            // Two widths by four tile orders, fewer where the rows of tiles are few.
            assert!(v.len() >= if p.m >= 4096 { 6 } else { 2 }, "{v:?}");
            for (i, cfg) in v.iter().enumerate() {
                assert!(kernels_with(&p, &identity(), &t, "g", *cfg).is_some(), "{cfg:?}");
                assert!(!v[..i].contains(cfg), "duplicate {cfg:?}");
                let forced = Options { gemm_config: Some(i as u8), ..Default::default() };
                assert_eq!(choose(&p, &t, &forced), *cfg);
            }
            // Past the list: the heuristic's.
            assert_eq!(choose(&p, &t, &Options { gemm_config: Some(200), ..Default::default() }), v[0]);
        }
        for p in [problem(1, 16, 8192, 8192, true, false, DataType::Bf16), problem(1, 16, 2048, 8192, true, false, DataType::Bf16)] {
            assert_eq!(tuning_configs(&p, &t), vec![heuristic(&p, &t)]);
        }
    }

    /// The problem with fp8 inputs (`ta` x `tb`).
    fn fp8_problem(mut p: GemmProblem, ta: DataType, tb: DataType) -> GemmProblem {
        p.a.dtype = ta;
        p.b.dtype = tb;
        p.fast_fp8 = true;
        p
    }

    #[test]
    fn fp8_takes_k_major_operands() {
        let t = Target::sm90a();
        // A row-major, B stored n x k: wgmma k32 with each operand's own type, 128 k a stage.
        let p = fp8_problem(problem(1, 8192, 8192, 8192, true, true, DataType::Bf16), DataType::Fp8E4m3, DataType::Fp8E5m2);
        assert_eq!(reject(&p, &t), None);
        let k = kernels(&p, &identity(), &t, "g").unwrap();
        let src = &k.launches[0].source;
        assert!(src.contains("#define GEMM_BN 256\n") && src.contains("#define GEMM_A DT_fp8_e4m3\n") && src.contains("#define GEMM_B DT_fp8_e5m2\n"), "fp8 wgmma");
        if let Some(wgmma) = wgmma_lines(&k.launches[0]) {
            assert!(!wgmma.is_empty() && wgmma.iter().all(|w| w.contains("m64n256k32.f32.e4m3.e5m2")), "fp8 wgmma: {wgmma:?}");
            assert!(wgmma.iter().all(|w| !w.contains(", 0, 0;")), "no transpose operands for 8-bit types");
        }
        // B N-major (or A column-major): 8-bit operands are K-major only, so the mma.sync kernel
        // (which converts fp8 to f16 on load) takes it.
        let why = reject(&fp8_problem(problem(1, 256, 256, 256, true, false, DataType::Bf16), DataType::Fp8E4m3, DataType::Fp8E4m3), &t).expect("B N-major rejected");
        assert!(why.contains("K-major"), "{why}");
        assert!(reject(&fp8_problem(problem(1, 256, 256, 256, false, true, DataType::Bf16), DataType::Fp8E4m3, DataType::Fp8E4m3), &t).is_some());
        // fp8 x bf16 is not a wgmma type pair.
        assert!(reject(&fp8_problem(problem(1, 256, 256, 256, true, true, DataType::Bf16), DataType::Fp8E4m3, DataType::Bf16), &t).is_some());
        // K = 40: rows of 40 bytes are not 16-byte multiples for TMA.
        assert!(reject(&fp8_problem(problem(1, 64, 64, 40, true, true, DataType::Bf16), DataType::Fp8E4m3, DataType::Fp8E4m3), &t).is_some());
        // Without fast accumulation (the plan's `fp8_fast_accum` knob), fp8 is not taken: the
        // mma.sync kernel accumulates in f32.
        assert!(reject(&GemmProblem { fast_fp8: false, ..p }, &t).is_some());
    }

    #[test]
    fn tf32_takes_k_major_a_and_copies_n_major_b() {
        let t = Target::sm90a();
        let o = Options::default();
        let p = tf32_problem(problem(1, 8192, 8192, 8192, true, false, DataType::F32));
        assert_eq!(reject(&p, &t), None);
        assert!(b_transposed(&p) && rs_ok(&p));
        // Enough tiles: C^T = B^T A^T in one launch, B^T's fragments from registers.
        let cfg = choose(&p, &t, &o);
        assert!(cfg.swap && cfg.bm == BM && cfg.bn == 256 && cfg.splits == 1);
        let k = kernels(&p, &identity(), &t, "g").unwrap();
        assert!(k.scratch.is_empty() && k.launches.len() == 1);
        let tf32_256 = |l: &Launch| l.source.contains("#define GEMM_BN 256\n") && l.source.contains("#define GEMM_A DT_f32\n");
        assert!(tf32_256(&k.launches[0]) && k.launches[0].source.contains("#define GEMM_RS 1\n"));
        if let Some(wgmma) = wgmma_lines(&k.launches[0]) {
            assert!(!wgmma.is_empty() && wgmma.iter().all(|w| w.contains("m64n256k8.f32.tf32.tf32 {") && w.contains("}, {")), "{wgmma:?}");
        }
        // Unswapped, B goes through its transposed copy.
        let k = kernels_with(&p, &identity(), &t, "g", Config { swap: false, stages: 4, ..cfg }).unwrap();
        assert_eq!(k.scratch, vec![8192 * 8192 * 4]);
        assert!(tf32_256(&k.launches[1]) && k.launches[1].source.contains("#define GEMM_RS 0\n"));
        if let Some(wgmma) = wgmma_lines(&k.launches[1]) {
            assert!(!wgmma.is_empty() && wgmma.iter().all(|w| w.contains("m64n256k8.f32.tf32.tf32 {") && !w.contains("}, {")), "{wgmma:?}");
        }
        // Few tiles (split k): the copy.
        let few = tf32_problem(problem(1, 64, 64, 4096, true, false, DataType::F32));
        assert!(!choose(&few, &t, &o).swap && choose(&few, &t, &o).splits > 1);
        // N not a multiple of 4: B's rows cannot be TMA rows, so only the copy can run it.
        assert!(!rs_ok(&tf32_problem(problem(1, 72, 97, 64, true, false, DataType::F32))));
        // Without the knob, f32 is not taken; A column-major is not either (no transpose of A).
        assert!(reject(&GemmProblem { allow_tf32: false, ..p.clone() }, &t).is_some());
        assert!(reject(&tf32_problem(problem(1, 256, 256, 256, false, false, DataType::F32)), &t).is_some());
        // K not a multiple of 4: A's rows are not 16-byte aligned for TMA.
        assert!(reject(&tf32_problem(problem(1, 64, 64, 70, true, false, DataType::F32)), &t).is_some());
    }
}
