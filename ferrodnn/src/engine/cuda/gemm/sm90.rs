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
//! fp8 (e4m3 and e5m2, either operand either type) runs `wgmma ... k32` at twice the 16-bit
//! rate, 128 k a stage (the same bytes as 16-bit stages); 8-bit operands are K-major only, so
//! A must be row-major and B stored `n x k` (as cuBLASLt's fp8 GEMMs take them too); other
//! layouts run on the mma.sync kernel, which converts fp8 to f16 as it loads.
//!
//! Shared-memory tiles use the 128-byte swizzle that TMA writes and wgmma reads. Operands may be
//! K-major (the usual row-major A, or B stored `n x k`) or M/N-major (B stored `k x n`, A
//! stored column-major): wgmma's transpose flags take both for 16-bit types. Out-of-range rows,
//! columns and k are zero-filled by TMA, so any M, N and K work; stores are guarded. TMA needs
//! 16-byte aligned row strides and base pointers: the strides are checked here, the pointers
//! when the plan executes (the unit's `unaligned` alternative runs otherwise).

use super::epilogue::{Side, SideKind};
use super::{Epilogue, GemmProblem, Operand, Tap, TapAxes};
use crate::dtype::DataType;
use crate::engine::cuda::kernel::HOPPER;
use crate::engine::cuda::kernel::{entry_name, Arg, Grid, Launch, NodeKernels, Options, Pdl, Target, Unaligned, Unit};
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
    /// CTAs per cluster along M (1 or 2): a pair of CTAs computes two tiles in the same
    /// columns, each loading its own A and half of the shared B tile, multicast by TMA into
    /// both CTAs' shared memory, which halves B's traffic from L2.
    pub cluster_m: usize,
    /// Rows of A per CTA tile: 128 (each consumer warpgroup owns 64 rows), or 64 (both
    /// consumers compute the same 64 rows, each over half of every stage's k steps, and the
    /// second adds its sums into the first's through shared memory before the epilogue).
    pub bm: usize,
    /// The kernel computes C^T = B^T A^T ([`swapped`]): for decode-shaped problems (a few rows
    /// of A, many columns), whose rows become wgmma's narrow N (16 or 32) instead of filling
    /// 128-row tiles with zeros. The epilogue still sees C's row and column.
    pub swap: bool,
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
    /// over C's own 128-row tiles, no split of k, no C^T, no cluster.
    fn folds_tap(&self) -> bool {
        self.splits == 1 && !self.swap && self.bm == BM && self.cluster_m == 1
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
/// fit. Only the heuristic's where it splits k, computes C^T or uses clusters.
pub fn tuning_configs(p: &GemmProblem, target: &Target) -> Vec<Config> {
    tuning_configs_of(p, heuristic(p, target))
}

fn tuning_configs_of(p: &GemmProblem, base: Config) -> Vec<Config> {
    let mut v = vec![base];
    if base.splits != 1 || base.swap || base.cluster_m != 1 || base.bm != BM {
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
    let tiles = |bn: usize| p.batch * p.m.div_ceil(BM) * p.n.div_ceil(bn);
    let sms = target.sm_count.max(1) as usize;
    // BN 256 halves the B traffic per flop, but leaves SMs idle when tiles are few, and short
    // k loops (K <= 256) gain more from more tiles than from wider ones.
    // (64-wide tiles for decode, M <= 64, instead of a 2-way split k measured slower: 32.1 vs
    // 40.4 TFLOP/s at 16 x 8192 x 8192, bench/NOTES.md session 11; their 8 KiB B stages keep
    // less of B in flight per SM.)
    let bn = if p.n > 128 && tiles(256) >= sms && p.k > 256 { 256 } else { 128 };
    let kt = p.k.div_ceil(bk(p.a.dtype));
    let t0 = tiles(bn);
    let splits = if 2 * t0 <= sms && kt >= 8 { (sms / t0).min(kt / 4).max(1) } else { 1 };
    let tma_store = splits == 1 && tma_store_ok(p);
    // Clusters of two with B multicast are correct but measured slower than single CTAs: 2.3x
    // in session 9, 2.5% in session 20 (launching only the clusters that fit; bench/NOTES.md):
    // off.
    let cluster_m = 1;
    let cfg = Config { bn, stages: 2, group_m: p.m.div_ceil(BM).clamp(1, group_m(p)), tma_store, splits, cluster_m, bm: BM, swap: false };
    // Decode: at most 32 rows of A against 64-column tiles for at least 7/8 of the SMs. As C^T,
    // 64-row tiles of B^T need no split of k (16 x 8192 x 8192: 128 tiles, no reduce launch),
    // and each stage carries 2 or 4 KiB of A instead of 16. Eight stages (80 KiB): 6, 12 and 16
    // measured 1-3% slower (bench/NOTES.md, session 14).
    // `FERRODNN_GEMM_SWAP=0` (tuning only) keeps decode on split 128-row tiles; a number sets
    // the swapped kernel's stages.
    let swap_env: Option<usize> = std::env::var("FERRODNN_GEMM_SWAP").ok().and_then(|v| v.parse().ok());
    if p.m <= 32 && !tf32(p) && 8 * p.batch * p.n.div_ceil(64) >= 7 * sms && swap_env != Some(0) && swap_ok(p) {
        let bn = if p.m <= 16 { 16 } else { 32 };
        let stages = swap_env.unwrap_or(8).clamp(2, 16);
        return Config { bn, stages, group_m: 1, tma_store: false, splits: 1, cluster_m: 1, bm: 64, swap: true };
    }
    // tf32 with B N-major: C^T = B^T A^T with B^T's fragments loaded from shared memory into
    // registers (`rs`), where the tiles are enough for every SM without a split of k; else B's
    // transposed copy (split k needs it).
    if b_transposed(p) && rs_ok(p) && std::env::var("FERRODNN_GEMM_TF32_RS").map_or(true, |v| v != "0") {
        let q = swapped(p);
        let tiles = |bn: usize| q.batch * q.m.div_ceil(BM) * q.n.div_ceil(bn);
        if 2 * tiles(128) > sms || kt < 8 {
            let bn = if q.n > 128 && tiles(256) >= sms && q.k > 256 { 256 } else { 128 };
            return Config { bn, stages: 2, group_m: q.m.div_ceil(BM).clamp(1, group_m(&q)), tma_store: false, splits: 1, cluster_m: 1, bm: BM, swap: true }.with_most_stages();
        }
    }
    cfg.with_most_stages()
}

/// Tiles down M per group of the tile order (at most; `FERRODNN_GEMM_GROUP_M` sets it, for
/// tuning): 16 for long k loops, 4 up to K = 4096, where the 132 tiles in flight then cover
/// whole rows of tiles (measured on the H100, bench/NOTES.md: 16384x4096x1024 +2.9%, with bias
/// + relu +2.3%, session 20; 4096^3 +0.3%, with bias + relu +0.4%, session 21; 8192^3, fp16
/// and tf32 slower with 4).
fn group_m(p: &GemmProblem) -> usize {
    let env = std::env::var("FERRODNN_GEMM_GROUP_M").ok().and_then(|v| v.parse().ok()).filter(|&g| g >= 1);
    env.unwrap_or(if p.k <= 4096 { 4 } else { 16 })
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
    let mut d = TmaDesc { tensor: c.tensor, dtype: c.dtype, dims: vec![p.n as u64, p.m as u64], strides: vec![c.row_stride as u64 * 2], boxes: vec![64, 64], swizzle: SWIZZLE };
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
    let t = p.a.dtype;
    let sixteen = matches!(t, DataType::Bf16 | DataType::F16) && p.b.dtype == t;
    if !sixteen && !tf32(p) && !fp8(p) {
        return Some(format!(
            "inputs {} x {}: this kernel takes bf16 x bf16, f16 x f16, fp8 x fp8 (e4m3 or e5m2 each), or f32 x f32 as tf32 (reduced precision allowed)",
            p.a.dtype, p.b.dtype
        ));
    }
    if fp8(p) && (major(&p.a, true) != Some(Major::K) || major(&p.b, false) != Some(Major::K)) {
        return Some("fp8: wgmma reads 8-bit operands K-major only: A must be row-major and B stored n x k (column-major)".into());
    }
    if !matches!(p.c.dtype, DataType::Bf16 | DataType::F16 | DataType::F32) {
        return Some(format!("output {}: this kernel stores bf16, f16 or f32", p.c.dtype));
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

/// fp8 inputs (e4m3 or e5m2, each operand its own) that may accumulate in the tensor cores'
/// adder (`GemmProblem::fast_fp8`): `wgmma ... k32` at twice the 16-bit rate, both operands
/// K-major. (Its sums keep fewer bits than f32: relative errors of 7e-5 at K = 96 and 3e-4 at
/// K = 4096 against the CPU engine's f32 sums, measured on the H100, bench/NOTES.md session 22.)
fn fp8(p: &GemmProblem) -> bool {
    p.a.dtype.is_fp8() && p.b.dtype.is_fp8() && p.fast_fp8
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
/// shared memory so that both the reads (along n) and the writes (along k) are coalesced.
fn transpose_launch(p: &GemmProblem, entry: &str, scratch: usize, target: &Target) -> Launch {
    let b = &p.b;
    let (tk, tn) = (p.k.div_ceil(32), p.n.div_ceil(32));
    let tiles = tk * tn * bt_batches(p);
    // Launched independently, as the GEMM after it (the pair measured 9% slower as dependents).
    let source = format!(
        r#"extern "C" __global__ void __launch_bounds__(256) {entry}(const float* __restrict__ b, float* __restrict__ bt) {{
    __shared__ float tile[32][33];
    const long long K = {k}, N = {n}, KP = {kp}, TK = {tk}, TN = {tn}, TILES = {tiles};
    const int x = threadIdx.x % 32, y = threadIdx.x / 32;
    for (long long t = blockIdx.x; t < TILES; t += gridDim.x) {{
        const long long bb = t / (TK * TN), r = t % (TK * TN);
        const long long k0 = (r / TN) * 32, n0 = (r % TN) * 32;
        #pragma unroll
        for (int i = y; i < 32; i += 8) {{
            const long long k = k0 + i, n = n0 + x;
            tile[i][x] = (k < K && n < N) ? b[bb * {bs}LL + k * {rs}LL + n * {cs}LL] : 0.f;
        }}
        __syncthreads();
        #pragma unroll
        for (int i = y; i < 32; i += 8) {{
            const long long n = n0 + i, k = k0 + x;
            if (n < N && k < K) {{
                unsigned r32;
                asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r32) : "f"(tile[x][i]));
                bt[(bb * N + n) * KP + k] = __uint_as_float(r32);
            }}
        }}
        __syncthreads();
    }}
}}
"#,
        k = p.k,
        n = p.n,
        kp = kp(p),
        bs = if bt_batches(p) > 1 { b.batch_stride } else { 0 },
        rs = b.row_stride,
        cs = b.col_stride,
    );
    let grid = tiles.min(8 * target.sm_count.max(1) as usize).max(1) as u32;
    Launch {
        source,
        entry: entry.to_string(),
        grid: Grid::Exact(grid, 1, 1),
        block: 256,
        shared_bytes: 0,
        args: vec![Arg::Ptr(b.tensor), Arg::Scratch(scratch)],
        cluster: None,
        pdl: Pdl::Independent,
    }
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
    TmaDesc { tensor: op.tensor, dtype: op.dtype, dims, strides, boxes, swizzle: SWIZZLE }
}

/// The type's name in `wgmma`'s shape suffix.
fn ctype(dt: DataType) -> &'static str {
    match dt {
        DataType::Bf16 => "bf16",
        DataType::F32 => "tf32",
        DataType::Fp8E4m3 => "e4m3",
        DataType::Fp8E5m2 => "e5m2",
        _ => "f16",
    }
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
    let kt = p.k.div_ceil(bk(p.a.dtype));
    let bad_split = cfg.splits == 0 || cfg.splits > kt || (cfg.splits > 1 && (cfg.tma_store || cfg.cluster_m != 1 || cfg.swap)) || !matches!(cfg.cluster_m, 1 | 2);
    // 64-row tiles: one CTA per tile, 16-bit, B K-major for the narrow widths, no TMA store.
    let bad_bm = match cfg.bm {
        128 => !matches!(cfg.bn, 64 | 128 | 256),
        64 => !matches!(cfg.bn, 16 | 32 | 64 | 128) || cfg.cluster_m != 1 || cfg.tma_store || tf32(p) || (cfg.bn < 64 && major(&p.b, false) != Some(Major::K)),
        _ => true,
    };
    if reject_as(p, target, cfg.swap && tf32(p)).is_some()
        || (cfg.tma_store && !tma_store_ok(p))
        || bad_bm
        || cfg.shared_bytes() > 227 * 1024
        || bad_split
        || (cfg.bn == 64 && cfg.cluster_m != 1)
    {
        return None;
    }
    if tf32(p) && cfg.cluster_m != 1 {
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
    let (ma, mb) = (major(&p.a, true)?, major(&b, false)?);
    let ta = tma_of(&p.a, true, cfg.bm, p.batch);
    // With a cluster, each CTA loads (and multicasts) its share of B.
    let tb = tma_of(&b, false, cfg.bn / cfg.cluster_m, p.batch);
    if ta.check().is_err() || tb.check().is_err() {
        return None;
    }
    let cm = cfg.cluster_m;
    let tiles = p.batch * p.m.div_ceil(cfg.bm).div_ceil(cm) * p.n.div_ceil(cfg.bn) * cfg.splits;
    let grid = (tiles * cm).min(target.sm_count.max(1) as usize / cm * cm).max(cm) as u32;
    let source = source(p, epi, &cfg, ma, mb, ta.dims.len() == 3, tb.dims.len() == 3, entry);
    // As a programmatic dependent launch the unsplit kernel measured slower on the H100 (6% with
    // a bias + relu epilogue, 9% for tf32 after the transpose); the split one (decode) 2% faster.
    let tb_arg = if b_transposed(p) { Arg::ScratchTensorMap(0, Box::new(tb)) } else { Arg::TensorMap(Box::new(tb)) };
    let mut args = vec![Arg::TensorMap(Box::new(ta)), tb_arg];
    if cfg.tma_store {
        args.push(Arg::TensorMap(Box::new(tma_of_c(p))));
    }
    args.push(Arg::Ptr(p.c.tensor));
    // The tap's partials (before the split partials: a tap comes without a split).
    let tap_part = epi.tap.as_ref().map(|tap| {
        scratch.push(tap_parts(tap, p, cfg.bn) * 4);
        scratch.len() - 1
    });
    // The split partials (a null pointer when there is no split).
    let part = scratch.len();
    args.push(if cfg.splits > 1 { Arg::Scratch(part) } else { Arg::I64(0) });
    args.extend(tap_part.map(Arg::Scratch));
    args.extend(epi.args.iter().cloned());
    let launch = Launch {
        source,
        entry: entry.to_string(),
        grid: Grid::Exact(grid, 1, 1),
        block: 384,
        shared_bytes: cfg.shared_bytes() as u32,
        args,
        cluster: (cfg.cluster_m > 1).then_some((cfg.cluster_m as u32, 1, 1)),
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

/// The tap's device functions: `tap_fold(acc, v)` adds a stored value to a partial, `tap_comb`
/// combines two partials, `TAP_ID` is the empty partial. max and min propagate NaN (`max.NaN`),
/// as the CPU engine's reductions do; sums are f32.
fn tap_helpers(tap: &Tap) -> String {
    let (id, fold, comb) = match tap.mode {
        ReductionMode::Amax => ("0.f", "tap_max(acc, fabsf(v))", "tap_max(a, b)"),
        ReductionMode::Max => ("__int_as_float(0xff800000)", "tap_max(acc, v)", "tap_max(a, b)"),
        ReductionMode::Add => ("0.f", "acc + v", "a + b"),
        _ => ("__int_as_float(0x7f800000)", "tap_min(acc, v)", "tap_min(a, b)"),
    };
    format!(
        r#"#define TAP_ID {id}
__device__ __forceinline__ float tap_max(float a, float b) {{ float r; asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }}
__device__ __forceinline__ float tap_min(float a, float b) {{ float r; asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }}
__device__ __forceinline__ float tap_fold(float acc, float v) {{ return {fold}; }}
__device__ __forceinline__ float tap_comb(float a, float b) {{ return {comb}; }}
"#
    )
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

/// The tap's second launch, folding the partials in a fixed order: one block over all of them
/// (all), or a thread per row or column of each batch, each over its partials in tile order;
/// the result stored in the reduction's output at its strides.
fn tap_launch(tap: &Tap, p: &GemmProblem, bn: usize, entry: &str, scratch: usize) -> Launch {
    let conv = match tap.dtype {
        DataType::Bf16 => "*((__nv_bfloat16*)y + o) = __float2bfloat16_rn(a);",
        DataType::F16 => "*((__half*)y + o) = __float2half_rn(a);",
        _ => "*((float*)y + o) = a;",
    };
    let helpers = tap_helpers(tap);
    let parts = tap_parts(tap, p, bn);
    let (source, threads, block) = match tap.axes {
        TapAxes::All => (
            format!(
                r#"{helpers}extern "C" __global__ void __launch_bounds__(1024) {entry}(const float* __restrict__ part, void* __restrict__ y) {{
    __shared__ float s[1024];
    const int tid = threadIdx.x;
    float a = TAP_ID;
    for (long long i = tid; i < {parts}LL; i += 1024) a = tap_comb(a, part[i]);
    s[tid] = a;
    __syncthreads();
    #pragma unroll
    for (int w = 512; w > 0; w >>= 1) {{
        if (tid < w) s[tid] = tap_comb(s[tid], s[tid + w]);
        __syncthreads();
    }}
    if (tid == 0) {{
        a = s[0];
        const long long o = 0;
        {conv}
    }}
}}
"#
            ),
            1024,
            1024,
        ),
        TapAxes::Rows | TapAxes::Cols => {
            let rows = tap.axes == TapAxes::Rows;
            // Outputs (batch, index): index a row (rows) or a column; partial q of output i at
            // part[(q * OUTS) + i]; the index's stride in y; y's batch strides over C's batch dims.
            let (extent, count, stride) =
                if rows { (p.m, p.n.div_ceil(bn), tap.y_strides[tap.y_strides.len() - 2]) } else { (p.n, p.m.div_ceil(BM) * 8, tap.y_strides[tap.y_strides.len() - 1]) };
            let outs = p.batch * extent;
            let rank = tap.y_strides.len();
            let side =
                super::epilogue::Side { tensor: tap.y, dtype: tap.dtype, row_stride: 0, col_stride: 0, batch: (0..rank - 2).map(|a| (tap.y_dims[a], tap.y_strides[a])).collect() };
            let bo = side.batch_offset("bt", "o");
            (
                format!(
                    r#"{helpers}extern "C" __global__ void __launch_bounds__(256) {entry}(const float* __restrict__ part, void* __restrict__ y) {{
    const long long i = (long long)blockIdx.x * 256 + threadIdx.x;
    if (i >= {outs}LL) return;
    float a = TAP_ID;
    for (int q = 0; q < {count}; ++q) a = tap_comb(a, part[(long long)q * {outs}LL + i]);
    const long long bt = i / {extent}LL;
    long long o = (i % {extent}LL) * {stride}LL;
    {bo}
    {conv}
}}
"#
                ),
                outs as u64,
                256,
            )
        }
    };
    Launch {
        source,
        entry: entry.to_string(),
        grid: Grid::Cover(threads),
        block,
        shared_bytes: 0,
        args: vec![Arg::Scratch(scratch), Arg::Ptr(tap.y)],
        cluster: None,
        pdl: Pdl::Dependent,
    }
}

/// The tap's code in the epilogue of the kernel: `decl` before the tile's loops, `fold(lo, hi)`
/// (for element pair (j, h), the stored values of columns `col` and `col + 1`), `pre_j` / `post_j`
/// around each column group's rows, and `end` after the loops (partials to `tpart`).
struct TapCode {
    decl: String,
    pre_j: String,
    post_j: String,
    end: String,
    acc: &'static str,
    acc1: &'static str,
}

impl TapCode {
    fn new(tap: &Tap, p: &GemmProblem) -> TapCode {
        let (m, n, b) = (p.m, p.n, p.batch);
        match tap.axes {
            TapAxes::All => TapCode {
                decl: "            float tacc = TAP_ID;\n".into(),
                pre_j: String::new(),
                post_j: String::new(),
                end: "            #pragma unroll\n            for (int o = 16; o > 0; o >>= 1) tacc = tap_comb(tacc, __shfl_xor_sync(0xffffffffu, tacc, o));\n            if (l == 0) tpart[t * 8 + cw * 4 + w] = tacc;\n".into(),
                acc: "tacc",
                acc1: "tacc",
            },
            // A row's values lie with the four lanes of a quad: folded across them, and the
            // quad's first lane writes the row's partial of this tile column.
            TapAxes::Rows => TapCode {
                decl: "            float racc[2] = {TAP_ID, TAP_ID};\n".into(),
                pre_j: String::new(),
                post_j: String::new(),
                end: format!(
                    r#"            #pragma unroll
            for (int h = 0; h < 2; ++h) {{
                racc[h] = tap_comb(racc[h], __shfl_xor_sync(0xffffffffu, racc[h], 1));
                racc[h] = tap_comb(racc[h], __shfl_xor_sync(0xffffffffu, racc[h], 2));
                const long long row = row0 + 8 * h;
                if ((l & 3) == 0 && row < {m}LL) tpart[((long long)tn * {b} + bt) * {m}LL + row] = racc[h];
            }}
"#
                ),
                acc: "racc[h]",
                acc1: "racc[h]",
            },
            // A column's values of this warp's 16 rows lie with the eight lanes of equal l % 4:
            // folded across them after each column group, and lanes 0-3 write the warp's partials.
            TapAxes::Cols => TapCode {
                decl: String::new(),
                pre_j: "                float cc0 = TAP_ID, cc1 = TAP_ID;\n".into(),
                post_j: format!(
                    r#"                #pragma unroll
                for (int o = 4; o < 32; o <<= 1) {{
                    cc0 = tap_comb(cc0, __shfl_xor_sync(0xffffffffu, cc0, o));
                    cc1 = tap_comb(cc1, __shfl_xor_sync(0xffffffffu, cc1, o));
                }}
                if (l < 4) {{
                    float* const tp = tpart + ((long long)(tm * 8 + cw * 4 + w) * {b} + bt) * {n}LL;
                    if (col < {n}LL) tp[col] = cc0;
                    if (col + 1 < {n}LL) tp[col + 1] = cc1;
                }}
"#
                ),
                end: String::new(),
                acc: "cc0",
                acc1: "cc1",
            },
        }
    }

    /// Folds stored values `lo` (column `col`) and `hi` (column `col + 1`) of row `row`.
    fn fold(&self, lo: &str, hi: &str) -> String {
        let (a0, a1) = (self.acc, self.acc1);
        format!("                    if (row < M_ && col < N_) {a0} = tap_fold({a0}, {lo});\n                    if (row < M_ && col + 1 < N_) {a1} = tap_fold({a1}, {hi});\n")
    }
}

/// Side inputs of the epilogue that the kernel of `cfg` reads as 2-element vectors: their base
/// pointers must be 16-byte aligned (as A's, B's and C's for TMA).
pub fn vector_sides(p: &GemmProblem, epi: &Epilogue, cfg: &Config) -> Vec<TensorId> {
    match &epi.sides {
        Some(sides) if cfg.splits == 1 && !cfg.swap => epi_code(p, sides, cfg.bn, "", "", false).aligned,
        _ => Vec::new(),
    }
}

/// Inline-asm wrapper of one `wgmma.m64n{bn}k*` with both operands from shared memory (A of
/// type `ta`, B of `tb`).
fn wgmma_fn(bn: usize, ta: DataType, tb: DataType, trans_a: bool, trans_b: bool) -> String {
    let nd = bn / 2;
    let regs: Vec<String> = (0..nd).map(|i| format!("%{i}")).collect();
    let outs: Vec<String> = (0..nd).map(|i| format!("\"+f\"(d[{i}])")).collect();
    // Each instruction takes 32 bytes of a K-major row: k 16 of a 16-bit type, 8 of tf32, 32 of
    // fp8. 32- and 8-bit types have no transpose operands (they are K-major only).
    let kk = 32 / ta.size();
    let trans = if ta.size() == 2 { format!(", {}, {}", trans_a as u8, trans_b as u8) } else { String::new() };
    let (tya, tyb) = (ctype(ta), ctype(tb));
    format!(
        r#"__device__ __forceinline__ void wgmma_tile(float (&d)[{nd}], unsigned long long da, unsigned long long db, int scale_d) {{
    asm volatile(
        "{{\n.reg .pred p;\nsetp.ne.b32 p, %{sd}, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n{bn}k{kk}.f32.{tya}.{tyb} {{{regs}}}, %{da}, %{db}, p, 1, 1{trans};\n}}\n"
        : {outs}
        : "l"(da), "l"(db), "r"(scale_d));
}}
"#,
        sd = nd + 2,
        da = nd,
        db = nd + 1,
        regs = regs.join(", "),
        outs = outs.join(", "),
    )
}

/// Inline-asm wrapper of one tf32 `wgmma.m64n{bn}k8` with A's fragment in registers (four
/// values a thread: rows g and g + 8 of the warp's 16, k t and t + 4; g = lane / 4, t = lane % 4)
/// and B from shared memory.
fn wgmma_rs_tf32_fn(bn: usize) -> String {
    let nd = bn / 2;
    let regs: Vec<String> = (0..nd).map(|i| format!("%{i}")).collect();
    let outs: Vec<String> = (0..nd).map(|i| format!("\"+f\"(d[{i}])")).collect();
    format!(
        r#"__device__ __forceinline__ void wgmma_tile_rs(float (&d)[{nd}], const unsigned* a, unsigned long long db, int scale_d) {{
    asm volatile(
        "{{\n.reg .pred p;\nsetp.ne.b32 p, %{sd}, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n{bn}k8.f32.tf32.tf32 {{{regs}}}, {{%{a0}, %{a1}, %{a2}, %{a3}}}, %{db}, p, 1, 1;\n}}\n"
        : {outs}
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
}}
"#,
        a0 = nd,
        a1 = nd + 1,
        a2 = nd + 2,
        a3 = nd + 3,
        db = nd + 4,
        sd = nd + 5,
        regs = regs.join(", "),
        outs = outs.join(", "),
    )
}

/// The end of a consumer's k stage in the main loop (both forms): commit its wgmmas, wait for the
/// previous stage's and hand that stage's buffers back to the producer, advance the ring.
const STAGE_END: &str = r#"                wgmma_commit();
                // The previous stage's wgmmas are done: hand its buffers back to the producer.
                wgmma_wait1();
                if (kt > k0) release_stage(bars + 8u * (STAGES + prev), l);
                prev = s;
                if (++s == STAGES) { s = 0; phase ^= 1u; }
"#;

/// The kernel source (without the prelude).
#[allow(clippy::too_many_arguments)]
fn source(p: &GemmProblem, epi: &Epilogue, cfg: &Config, ma: Major, mb: Major, a3: bool, b3: bool, entry: &str) -> String {
    let bn = cfg.bn;
    let nd = bn / 2;
    let bm = cfg.bm;
    let a_bytes = bm * 128;
    // 64-row tiles: both consumers take the same rows (each half of the k steps).
    let kpair = bm == 64;
    let rb = if kpair { "(long long)tm * 64" } else { "(long long)tm * 128 + cw * 64" };
    let b_bytes = bn * 128;
    #[allow(non_snake_case)]
    let BK = bk(p.a.dtype);
    let mut s = String::new();
    s.push_str(HOPPER);
    s.push_str(&epi.code);
    if let Some(tap) = &epi.tap {
        s.push_str(&tap_helpers(tap));
    }
    // tf32 with A M-major (C^T of a B stored `k x n`): A's fragments come from registers.
    let rs = p.a.dtype == DataType::F32 && ma == Major::Mn;
    s.push_str(&if rs { wgmma_rs_tf32_fn(bn) } else { wgmma_fn(bn, p.a.dtype, p.b.dtype, ma == Major::Mn, mb == Major::Mn) });
    // TMA coordinates (innermost first) of the slices of one stage.
    let a_load = match ma {
        Major::K => format!("tma_load(sa, &ta, full, kt * {BK}, tm * {bm}, bt, {a3});"),
        // Chunks of one swizzle span of m (64 16-bit or 32 f32 elements) by BK k rows.
        Major::Mn => {
            let ce = 128 / p.a.dtype.size();
            format!("for (int q = 0; q < {bm} / {ce}; ++q) tma_load(sa + q * {chunk}u, &ta, full, tm * {bm} + q * {ce}, kt * {BK}, bt, {a3});", chunk = 128 * BK)
        }
    };
    let b_load = match (mb, cfg.cluster_m) {
        (Major::K, 1) => format!("tma_load(sb, &tb, full, kt * {BK}, tn * {bn}, bt, {b3});"),
        (Major::Mn, 1) => format!("for (int q = 0; q < {bn} / 64; ++q) tma_load(sb + q * 8192u, &tb, full, tn * {bn} + q * 64, kt * {BK}, bt, {b3});"),
        // Cluster of two: this CTA's half of B (rows of n for K-major, 64-wide chunks for
        // N-major), multicast into both CTAs at the same offsets.
        (Major::K, _) => format!(
            "tma_load_mc(sb + rank * {half_bytes}u, &tb, full, kt * {BK}, tn * {bn} + rank * {half}, bt, {b3}, (unsigned short)3);",
            half = bn / 2,
            half_bytes = bn / 2 * 128
        ),
        (Major::Mn, _) => format!(
            "for (int q = rank * {qh}; q < (rank + 1) * {qh}; ++q) tma_load_mc(sb + q * 8192u, &tb, full, tn * {bn} + q * 64, kt * {BK}, bt, {b3}, (unsigned short)3);",
            qh = bn / 128
        ),
    };
    // Shared-memory descriptors of k-step kk (16 elements) for this consumer's 64 rows of A and
    // the whole of B. K-major: rows of 128 bytes, 8-row atoms 1024 bytes apart, k steps 32 bytes
    // along the row. M/N-major: k rows of 128 bytes (64 m or n), atoms of 8 k rows 1024 bytes
    // apart, 64-wide chunks 8192 bytes apart (64 k rows each), k steps 16 rows = 2048 bytes.
    // (64-row tiles: both consumers read the same rows of A.)
    let rows = if kpair { "" } else { "cw * 8192u + " };
    let desc_a = match ma {
        Major::K => format!("make_desc(sa + {rows}kk * 32u, 16u, 1024u)"),
        Major::Mn => format!("make_desc(sa + {rows}kk * 2048u, 8192u, 1024u)"),
    };
    let desc_b = match mb {
        Major::K => "make_desc(sb + kk * 32u, 16u, 1024u)",
        Major::Mn => "make_desc(sb + kk * 2048u, 8192u, 1024u)",
    };
    let c = &p.c;
    let names = &epi.names;
    let store = store_code(p, names, "d[4 * j + 2 * h]", "d[4 * j + 2 * h + 1]", cfg.swap);
    let esz = c.dtype.size() as i64;
    // A last relu applied by the TMA-store epilogue's conversion (one instruction a pair instead
    // of two a value: the bias + relu epilogue is 420 SASS instructions instead of 655).
    // (`relu_last` comes only with the side inputs' layouts, so `ec` below exists then.)
    let relu_cvt = epi.relu_last && cfg.tma_store && !std::env::var("FERRODNN_GEMM_RELU_CVT").is_ok_and(|v| v == "0");
    // The epilogue from the side inputs' layouts (loads hoisted out of the store loop), when the
    // epilogue gives them.
    let ec = match &epi.sides {
        Some(sides) if cfg.splits == 1 && !cfg.swap => Some(epi_code(p, sides, bn, "d[4 * j + 2 * h]", "d[4 * j + 2 * h + 1]", relu_cvt)),
        _ => None,
    };
    let tap = epi.tap.as_ref().map(|t| TapCode::new(t, p));
    let prep = match &ec {
        Some(ec) => format!(
            "            // This thread's first row and column in the tile, and the side values it needs.\n            const long long row0 = {rb} + w * 16 + (l >> 2);\n            const long long colt = (long long)tn * {bn} + 2 * (l & 3);\n{}",
            ec.prep
        ),
        None => String::new(),
    };
    let (crs, cbs) = (c.row_stride * esz, c.batch_stride * esz);
    let (epilogue, tail) = if cfg.splits > 1 {
        // Split k: this split's f32 partial sums go to the workspace, [split][batch][M][NP]; the
        // reduce launch adds the splits in order and applies the epilogue.
        let body = format!(
            r#"                    if (row < M_ && col < N_) {{
                        float* pp = part + (((long long)sp * {batch} + bt) * M_ + row) * NP + col;
                        *(float2*)pp = make_float2(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
                    }}
"#,
            batch = p.batch
        );
        (format!("            const int sp = (int)(t % SPLITS);\n{}", acc_loops(rb, bn, false, "", &body)), String::new())
    } else if cfg.tma_store {
        (tma_epilogue(p, names, bn, rb, ec.as_ref(), relu_cvt, tap.as_ref()), TMA_STORE_DRAIN.to_string())
    } else {
        // Direct stores from registers, guarded: accumulator (j, h) of this thread is row
        // 16w + l/4 + 8h, columns 8j + 2(l%4) and the next one, of this warpgroup's 64 x BN
        // block; through the side values (`ec`) or the general `epilogue`.
        let (value, st) = match &ec {
            Some(ec) => (ec.value.as_str(), store_values(p)),
            None => ("", store),
        };
        // The tap folds the values as stored (rounded to C's type).
        let r = |v: &str| match c.dtype {
            DataType::Bf16 => format!("__bfloat162float(__float2bfloat16_rn({v}))"),
            DataType::F16 => format!("__half2float(__float2half_rn({v}))"),
            _ => v.to_string(),
        };
        let fold = tap.as_ref().map_or(String::new(), |t| t.fold(&r("v0"), &r("v1")));
        let body = format!("{value}{fold}                    if (row < M_) {{\n                        unsigned char* rp = cbase + bofs + row * {crs}LL;\n                        {st}\n                    }}\n");
        let (pre_j, post_j) = tap.as_ref().map_or(("", ""), |t| (t.pre_j.as_str(), t.post_j.as_str()));
        (acc_loops_with(rb, bn, ec.is_some(), &format!("            const long long bofs = (long long)bt * {cbs}LL;\n"), pre_j, &body, post_j), String::new())
    };
    // The k steps of a stage: all four, or (64-row tiles) this consumer's two.
    let (steps, first) = if kpair { (2, "2 * cw + ") } else { (4, "") };
    let mainloop = if rs {
        format!(
            r#"            // A's fragments (tf32-rounded) from its M-major stage (chunks of 32 rows x 32 k
            // rows, 128-byte rows swizzled by k % 8) into registers, two sets (fa0 / fa1 on
            // alternate stages), since a stage's wgmmas may still read theirs while the next
            // stage's are loaded.
            auto rs_stage = [&](unsigned (&fa)[16], int kt) {{
                mbar_wait(bars + 8u * s, phase);
                const unsigned sa = base + s * STAGE_BYTES, sb = sa + A_BYTES;
                #pragma unroll
                for (int i = 0; i < 16; ++i) {{
                    // One volatile statement: the compiler may not sink the rounding past the
                    // fence below (ptxas then serializes every wgmma: C7513).
                    asm volatile("{{\n.reg .f32 v;\nld.shared.f32 v, [%1];\ncvt.rna.tf32.f32 %0, v;\n}}" : "=r"(fa[i]) : "r"(sa + foff[i & 3] + (i >> 2) * 1024u));
                }}
                wgmma_fence();
                #pragma unroll
                for (int kk = 0; kk < 4; ++kk) wgmma_tile_rs(d, fa + 4 * kk, {desc_b}, (kt > k0 || kk > 0) ? 1 : 0);
{STAGE_END}            }};
            // (Unrolled by two with a guarded second stage instead, ptxas serialized the wgmmas
            // of some shapes: C7513.)
            for (int kt = k0; kt < k1; ++kt) {{
                if ((kt - k0) & 1) rs_stage(fa1, kt); else rs_stage(fa0, kt);
            }}
"#
        )
    } else {
        format!(
            r#"            for (int kt = k0; kt < k1; ++kt) {{
                mbar_wait(bars + 8u * s, phase);
                const unsigned sa = base + s * STAGE_BYTES, sb = sa + A_BYTES;
                wgmma_fence();
                // (A warpgroup whose rows all lie below M could skip its wgmmas, but a branch
                // around them makes ptxas serialize every wgmma of the kernel: C7520.)
                #pragma unroll
                for (int k2 = 0; k2 < {steps}; ++k2) {{
                    const int kk = {first}k2;
                    wgmma_tile(d, {desc_a}, {desc_b}, (kt > k0 || k2 > 0) ? 1 : 0);
                }}
{STAGE_END}            }}
"#
        )
    };
    // The fragment offsets of A's registers (rs): value i of a k step is row r = 16 (w % 2) +
    // l / 4 + 8 (i % 2) of the warp's 32-row chunk 2 cw + w / 2, k row q = l % 4 + 4 (i / 2),
    // its 16-byte unit (r / 4) swizzled by q.
    let rs_setup = if rs {
        r#"        unsigned foff[4];
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int r = 16 * (w & 1) + (l >> 2) + 8 * (i & 1), q = (l & 3) + 4 * (i >> 1);
            foff[i] = (unsigned)(2 * cw + (w >> 1)) * 4096u + q * 128u + ((unsigned)((r >> 2) ^ q) << 4) + (r & 3) * 4u;
        }
        unsigned fa0[16], fa1[16];
"#
    } else {
        ""
    };
    let tiles_m = p.m.div_ceil(bm);
    let tiles_n = p.n.div_ceil(bn);
    // 64-row tiles: the second consumer's sums go through shared memory (element i of every
    // thread together, so the accesses are conflict-free) into the first's, which alone runs
    // the epilogue; the second barrier keeps the buffer until they are read.
    // The tap's partials around the epilogue (kernels with a tap have no 64-row tiles).
    let epilogue = match &tap {
        Some(t) => format!("{}{epilogue}{}", t.decl, t.end),
        None => epilogue,
    };
    let epilogue_all = if kpair {
        format!(
            r#"            {{
                float* const red = (float*)(smem_raw + (base + STAGES * STAGE_BYTES - smem_u32(smem_raw)));
                if (cw == 1) {{
                    #pragma unroll
                    for (int i = 0; i < {nd}; ++i) red[i * 128 + tid] = d[i];
                }}
                asm volatile("bar.sync 3, 256;" ::: "memory");
                if (cw == 0) {{
                    #pragma unroll
                    for (int i = 0; i < {nd}; ++i) d[i] += red[i * 128 + tid];
{epilogue}                }}
                asm volatile("bar.sync 3, 256;" ::: "memory");
            }}
"#
        )
    } else {
        epilogue
    };
    let _ = write!(
        s,
        r#"
#define STAGES {stages}
static constexpr long long M_ = {m}, N_ = {n}, NP = {np};
// TILES_M counts cluster rows of tiles: CM CTAs of a cluster take CM adjacent tile rows.
static constexpr int CM = {cm}, KT = {kt}, TILES_M = {tiles_mc}, TILES_N = {tiles_n}, GROUP_M = {group_m};
static constexpr int SPLITS = {splits};
static constexpr long long TILES = {tiles}LL * SPLITS;
static constexpr unsigned A_BYTES = {a_bytes}u, STAGE_BYTES = {stage_bytes}u;

__device__ __forceinline__ unsigned cta_rank() {{
    if (CM == 1) return 0u;
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}}
__device__ __forceinline__ void cluster_sync() {{
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}}
// A consumer is done with a stage: every thread arrives on this CTA's "empty" barrier, or,
// in a cluster, one lane per warp arrives on the barrier of every CTA of the cluster (each
// producer multicasts into all of them, so it waits for all of their consumers).
// The arrive is a release at CTA scope (the default): the consumers only read the stage, and
// the producer's next TMA write is ordered after the barrier completes; a cluster-scope
// release would fence every k step.
__device__ __forceinline__ void release_stage(unsigned bar, int lane) {{
    if (CM == 1) {{
        mbar_arrive(bar);
    }} else {{
        __syncwarp();
        if (lane == 0) {{
            for (unsigned cta = 0; cta < CM; ++cta) {{
                asm volatile("{{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\nmbarrier.arrive.shared::cluster.b64 _, [remote];\n}}" :: "r"(bar), "r"(cta) : "memory");
            }}
        }}
    }}
}}

// Work item `t`: split SPLITS ways along k (k tiles [k0, k1)), then output tiles in grouped
// order: GROUP_M tiles down M, then the next column; batches outermost.
__device__ __forceinline__ void tile_coords(long long t, int rank, int& bt, int& tm, int& tn, int& k0, int& k1) {{
    const int sp = (int)(t % SPLITS);
    t /= SPLITS;
    k0 = (int)((long long)sp * KT / SPLITS);
    k1 = (int)((long long)(sp + 1) * KT / SPLITS);
    const long long per_batch = (long long)TILES_M * TILES_N;
    bt = (int)(t / per_batch);
    const int r = (int)(t - (long long)bt * per_batch);
    const int per_group = GROUP_M * TILES_N;
    const int g = r / per_group;
    const int first_m = g * GROUP_M;
    const int gm = min(TILES_M - first_m, GROUP_M);
    const int in_group = r - g * per_group;
    tm = (first_m + in_group % gm) * CM + rank;
    tn = in_group / gm;
}}

extern "C" __global__ void __launch_bounds__(384, 1) {entry}(const __grid_constant__ TmaMap ta, const __grid_constant__ TmaMap tb, {tcm}void* __restrict__ c, float* __restrict__ part{tpart}{params}) {{
    extern __shared__ unsigned char smem_raw[];
    const unsigned base = (smem_u32(smem_raw) + 1023u) & ~1023u;
    const unsigned bars = base + STAGES * STAGE_BYTES + {c_bytes}u;
    const int wg = threadIdx.x / 128;
    if (threadIdx.x == 0) {{
        for (int s = 0; s < STAGES; ++s) {{
            mbar_init(bars + 8u * s, 1u);
            mbar_init(bars + 8u * (STAGES + s), {empty_count}u);
        }}
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }}
    {start_sync}
    const int rank = (int)cta_rank();
    if (wg == 0) {{
        // Producer.
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (threadIdx.x == 0) {{
            asm volatile("prefetch.tensormap [%0];" :: "l"(&ta) : "memory");
            asm volatile("prefetch.tensormap [%0];" :: "l"(&tb) : "memory");
            int s = 0;
            unsigned phase = 0;
            for (long long t = blockIdx.x / CM; t < TILES; t += gridDim.x / CM) {{
                int bt, tm, tn, k0, k1;
                tile_coords(t, rank, bt, tm, tn, k0, k1);
                for (int kt = k0; kt < k1; ++kt) {{
                    mbar_wait(bars + 8u * (STAGES + s), phase ^ 1u);
                    const unsigned full = bars + 8u * s;
                    mbar_expect_tx(full, STAGE_BYTES);
                    const unsigned sa = base + s * STAGE_BYTES, sb = sa + A_BYTES;
                    {a_load}
                    {b_load}
                    if (++s == STAGES) {{ s = 0; phase ^= 1u; }}
                }}
            }}
        }}
    }} else {{
        // Consumers: warpgroup cw owns rows cw * 64 .. cw * 64 + 63 of each tile.
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
        const int cw = wg - 1;
        const int tid = threadIdx.x % 128, w = tid / 32, l = tid % 32;
        unsigned char* const cbase = (unsigned char*)c;
{rs_setup}        float d[{nd}];
        #pragma unroll
        for (int i = 0; i < {nd}; ++i) d[i] = 0.f;
        int s = 0;
        unsigned phase = 0;
        for (long long t = blockIdx.x / CM; t < TILES; t += gridDim.x / CM) {{
            int bt, tm, tn, k0, k1;
            tile_coords(t, rank, bt, tm, tn, k0, k1);
            int prev = 0;
{mainloop}{prep}            wgmma_wait0();
            release_stage(bars + 8u * (STAGES + prev), l);
{epilogue_all}        }}
{tail}    }}
{cluster_end}}}
"#,
        epilogue_all = epilogue_all,
        mainloop = mainloop,
        rs_setup = rs_setup,
        prep = prep,
        tail = tail,
        c_bytes = cfg.c_bytes(),
        tcm = if cfg.tma_store { "const __grid_constant__ TmaMap tcm, " } else { "" },
        stages = cfg.stages,
        splits = cfg.splits,
        cm = cfg.cluster_m,
        tiles_mc = tiles_m.div_ceil(cfg.cluster_m),
        empty_count = if cfg.cluster_m == 1 { 256 } else { 8 * cfg.cluster_m },
        cluster_end = if cfg.cluster_m > 1 { "    cluster_sync();\n" } else { "" },
        start_sync = if cfg.cluster_m > 1 { "cluster_sync();" } else { "__syncthreads();" },
        np = p.n + p.n % 2,
        m = p.m,
        n = p.n,
        kt = p.k.div_ceil(BK),
        group_m = cfg.group_m,
        tiles = p.batch * tiles_m.div_ceil(cfg.cluster_m) * tiles_n,
        stage_bytes = a_bytes + b_bytes,
        params = epi.params,
        tpart = if epi.tap.is_some() { ", float* __restrict__ tpart" } else { "" },
    );
    s
}

/// The epilogue of one consumer thread's accumulators, from the side inputs' layouts (see
/// `epilogue.rs`): side values that do not change along a tile's rows or columns are loaded
/// once per tile, before the last k step's wgmmas complete (`prep`, which needs `bt`, `row0`:
/// the thread's first row, and `colt`: its first column), so their latency hides under the
/// tensor cores and the store loop carries no dependent loads:
/// - scalars: one value; per-row values (`[.., m, 1]`): the thread's two rows;
/// - per-column values (`[.., 1, n]`): the thread's `BN / 4` columns, as 2-element vectors
///   (one 32-bit register for two 16-bit values) where [`Side::pairs`] allows, up to a budget of
///   64 registers;
/// - full tensors (and per-column ones beyond the budget): inside the loop, one (vector) load
///   per accumulator pair, from row pointers computed once per tile.
///
/// `value` computes `v0` and `v1` (columns `col`, `col + 1` of row `row`; without the last relu
/// with `relu_cvt`, `epilogue_u`) for accumulator pair
/// `(j, h)` inside the loops over `j` and `h` (unrolled: the arrays indexed by them are
/// registers), with `row`, `col` defined. Loads are guarded by the matrix extents (out-of-range
/// values are computed from zeros and never stored by the caller). `aligned`: side inputs read as
/// vectors, whose base pointers must be 16-byte aligned.
struct EpiCode {
    prep: String,
    value: String,
    aligned: Vec<TensorId>,
}

fn epi_code(p: &GemmProblem, sides: &[Side], bn: usize, acc0: &str, acc1: &str, relu_cvt: bool) -> EpiCode {
    let mut prep = String::new();
    let mut value = String::new();
    let mut aligned = Vec::new();
    let (mut x0, mut x1) = (Vec::new(), Vec::new());
    let mut budget = 64usize;
    for (i, sd) in sides.iter().enumerate() {
        let ct = sd.ctype();
        let (rs, cs) = (sd.row_stride, sd.col_stride);
        let pairs = sd.pairs(p.n);
        // The 2-element vector type, its zero and its halves as floats.
        let (vt, zero, lo, hi) = match sd.dtype {
            DataType::Bf16 => ("__nv_bfloat162", "__float2bfloat162_rn(0.f)", "__low2float({})", "__high2float({})"),
            DataType::F16 => ("__half2", "__float2half2_rn(0.f)", "__low2float({})", "__high2float({})"),
            _ => ("float2", "make_float2(0.f, 0.f)", "{}.x", "{}.y"),
        };
        let half = |f: &str, v: &str| f.replace("{}", v);
        let _ = writeln!(prep, "            long long bo{i} = 0;");
        let bo = sd.batch_offset("bt", &format!("bo{i}"));
        if !bo.is_empty() {
            let _ = write!(prep, "            {bo}");
        }
        let _ = writeln!(prep, "            const {ct}* const p{i} = (const {ct}*)e{i} + bo{i};");
        let regs = if pairs && sd.dtype.size() == 2 { bn / 8 } else { bn / 4 };
        let kind = match sd.kind() {
            SideKind::PerCol if regs > budget => SideKind::Full,
            k => k,
        };
        match kind {
            SideKind::Scalar => {
                let _ = writeln!(prep, "            const float s{i} = fz_cv(p{i}[0]);");
                x0.push(format!("s{i}"));
                x1.push(format!("s{i}"));
            }
            SideKind::PerRow => {
                let _ = writeln!(
                    prep,
                    "            float r{i}[2];\n            #pragma unroll\n            for (int h = 0; h < 2; ++h) r{i}[h] = row0 + 8 * h < M_ ? fz_cv(p{i}[(row0 + 8 * h) * {rs}LL]) : 0.f;"
                );
                x0.push(format!("r{i}[h]"));
                x1.push(format!("r{i}[h]"));
            }
            SideKind::PerCol if pairs => {
                budget -= regs;
                aligned.push(sd.tensor);
                let _ = writeln!(
                    prep,
                    "            {vt} c{i}[{n2}];\n            #pragma unroll\n            for (int j = 0; j < {n2}; ++j) c{i}[j] = colt + 8 * j < N_ ? *(const {vt}*)(p{i} + colt + 8 * j) : {zero};",
                    n2 = bn / 8
                );
                x0.push(half(lo, &format!("c{i}[j]")));
                x1.push(half(hi, &format!("c{i}[j]")));
            }
            SideKind::PerCol => {
                budget -= regs;
                let _ = writeln!(
                    prep,
                    "            float c{i}[{n4}];\n            #pragma unroll\n            for (int q = 0; q < {n4}; ++q) c{i}[q] = colt + 8 * (q >> 1) + (q & 1) < N_ ? fz_cv(p{i}[(colt + 8 * (q >> 1) + (q & 1)) * {cs}LL]) : 0.f;",
                    n4 = bn / 4
                );
                x0.push(format!("c{i}[2 * j]"));
                x1.push(format!("c{i}[2 * j + 1]"));
            }
            SideKind::Full => {
                // Row pointers of the thread's two rows at its first column.
                let _ = writeln!(
                    prep,
                    "            const {ct}* fr{i}[2];\n            #pragma unroll\n            for (int h = 0; h < 2; ++h) fr{i}[h] = p{i} + (row0 + 8 * h) * {rs}LL + colt * {cs}LL;"
                );
                if pairs {
                    aligned.push(sd.tensor);
                    let _ = writeln!(value, "                    const {vt} f{i} = (row < M_ && col < N_) ? *(const {vt}*)(fr{i}[h] + 8 * j) : {zero};");
                    x0.push(half(lo, &format!("f{i}")));
                    x1.push(half(hi, &format!("f{i}")));
                } else {
                    let _ = writeln!(
                        value,
                        "                    const float f{i}_0 = (row < M_ && col < N_) ? fz_cv(fr{i}[h][(8 * j) * {cs}LL]) : 0.f;\n                    const float f{i}_1 = (row < M_ && col + 1 < N_) ? fz_cv(fr{i}[h][(8 * j + 1) * {cs}LL]) : 0.f;"
                    );
                    x0.push(format!("f{i}_0"));
                    x1.push(format!("f{i}_1"));
                }
            }
        }
    }
    let a0: String = x0.iter().map(|x| format!(", {x}")).collect();
    let a1: String = x1.iter().map(|x| format!(", {x}")).collect();
    let f = if relu_cvt { "epilogue_u" } else { "epilogue_v" };
    let _ = writeln!(value, "                    const float v0 = {f}({acc0}{a0});\n                    const float v1 = {f}({acc1}{a1});");
    EpiCode { prep, value, aligned }
}

/// The loops over this thread's accumulator pairs `(j, h)` around `body`: row `row = row0 + 8 h`,
/// columns `col` and `col + 1`. With `sides` the side-value epilogue's `prep` already defined
/// `row0` and `colt` (the thread's first row and column); otherwise `row0` is defined here from
/// the tile's row base `rb`. The statements `pre` come before the loops.
fn acc_loops(rb: &str, bn: usize, sides: bool, pre: &str, body: &str) -> String {
    acc_loops_with(rb, bn, sides, pre, "", body, "")
}

/// [`acc_loops`] with statements `pre_j` and `post_j` before and after each column group's rows
/// (inside the loop over `j`, where `col` is defined).
fn acc_loops_with(rb: &str, bn: usize, sides: bool, pre: &str, pre_j: &str, body: &str, post_j: &str) -> String {
    let (row0, col) = if sides {
        (String::new(), "colt + 8 * j".to_string())
    } else {
        (format!("            const long long row0 = {rb} + w * 16 + (l >> 2);\n"), format!("(long long)tn * {bn} + 8 * j + 2 * (l & 3)"))
    };
    format!(
        r#"{row0}{pre}            #pragma unroll
            for (int j = 0; j < {bn} / 8; ++j) {{
                const long long col = {col};
{pre_j}                #pragma unroll
                for (int h = 0; h < 2; ++h) {{
                    const long long row = row0 + 8 * h;
{body}                }}
{post_j}            }}
"#
    )
}

/// The last consumer thread to store C with TMA waits for its stores before the kernel ends.
const TMA_STORE_DRAIN: &str = "        if (tid == 0) asm volatile(\"cp.async.bulk.wait_group 0;\" ::: \"memory\");\n";

/// The TMA-store epilogue (16-bit row-major C): the values of this thread's accumulators as
/// 16-bit pairs `cv[2 j + h]` (row `16 w + l / 4 + 8 h`, columns `8 j + 2 (l % 4)`
/// and the next one, of the warpgroup's 64 x BN block), from the side inputs' layouts (`ec`,
/// whose `prep` ran before) or the general `epilogue`; then the store: the block written to
/// shared memory in boxes of 64 columns (128-byte rows swizzled as the TMA store reads them),
/// and one thread storing the boxes with TMA (clipped at the matrix edges, so values outside C
/// are computed but never stored) while the warps go on. The block is reused once the last
/// store has read it. Plain C++ stores to shared memory (no asm memory clobber), so the
/// compiler may schedule loads of the values ahead of them.
fn tma_epilogue(p: &GemmProblem, names: &str, bn: usize, rb: &str, ec: Option<&EpiCode>, relu_cvt: bool, tap: Option<&TapCode>) -> String {
    let ty = if p.c.dtype == DataType::Bf16 { "bf16" } else { "f16" };
    let pack = format!("{ty}x2{}_bits(v0, v1)", if relu_cvt { "_relu" } else { "" });
    let coords = if p.batch > 1 { "bt, true" } else { "0, false" };
    // The tap folds the packed values (as stored: rounded, and the relu in the conversion).
    let fold = tap.map_or(String::new(), |t| {
        if p.c.dtype == DataType::Bf16 {
            t.fold("__uint_as_float(cv[2 * j + h] << 16)", "__uint_as_float(cv[2 * j + h] & 0xffff0000u)")
        } else {
            t.fold("__half2float(__ushort_as_half((unsigned short)(cv[2 * j + h] & 0xffffu)))", "__half2float(__ushort_as_half((unsigned short)(cv[2 * j + h] >> 16)))")
        }
    });
    let (pre_j, post_j) = tap.map_or(("", ""), |t| (t.pre_j.as_str(), t.post_j.as_str()));
    let body = match ec {
        Some(ec) => format!("                    (void)row; (void)col;\n{}                    cv[2 * j + h] = {pack};\n{fold}", ec.value),
        None => format!(
            r#"                    float v0 = 0.f, v1 = 0.f;
                    if (row < M_ && col < N_) v0 = epilogue(d[4 * j + 2 * h], bt, row, col{names});
                    if (row < M_ && col + 1 < N_) v1 = epilogue(d[4 * j + 2 * h + 1], bt, row, col + 1{names});
                    cv[2 * j + h] = {pack};
"#
        ),
    };
    let values = format!("            unsigned cv[{}];\n{}", bn / 4, acc_loops_with(rb, bn, ec.is_some(), "", pre_j, &body, post_j));
    let store = format!(
        r#"            const unsigned cbuf = base + STAGES * STAGE_BYTES + cw * {cblock}u;
            unsigned char* const cgen = smem_raw + (cbuf - smem_u32(smem_raw));
            if (tid == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
            consumer_sync(cw);
            #pragma unroll
            for (int j = 0; j < {bn} / 8; ++j) {{
                #pragma unroll
                for (int h = 0; h < 2; ++h) {{
                    // Row rl of the block, byte 4 (l % 4) of 16-byte chunk j % 8 of box j / 8,
                    // chunks swizzled by the row (rl % 8 == l / 4).
                    const int rl = w * 16 + (l >> 2) + 8 * h;
                    *(unsigned*)(cgen + (j >> 3) * 8192 + rl * 128 + (((j & 7) ^ (l >> 2)) << 4) + 4 * (l & 3)) = cv[2 * j + h];
                }}
            }}
{tail}"#,
        cblock = 64 * bn * 2,
        tail = tma_store_tail(bn, coords),
    );
    values + &store
}

/// Stores of accumulators `a0` (column `col`) and `a1` (column `col + 1`) of row `row` through
/// the epilogue, at row pointer `rp` (batch and row applied): pairs when C is row-major with
/// even strides, else one element at a time.
fn store_code(p: &GemmProblem, names: &str, a0: &str, a1: &str, swap: bool) -> String {
    // The epilogue's call for value `v` at column `c` of the kernel's row: C's row and column
    // trade places when the kernel computes C^T.
    let call = |v: &str, c: &str| if swap { format!("epilogue({v}, bt, {c}, row{names})") } else { format!("epilogue({v}, bt, row, {c}{names})") };
    let (e0, e1) = (call(a0, "col"), call(a1, "col + 1"));
    let ee = call(&format!("e == 0 ? {a0} : {a1}"), "col + e");
    let c = &p.c;
    let pair = c.col_stride == 1 && c.row_stride % 2 == 0 && c.batch_stride % 2 == 0;
    let (st1, st2) = match c.dtype {
        DataType::Bf16 => ("*(__nv_bfloat16*)(cp) = __float2bfloat16_rn(v0);", "*(__nv_bfloat162*)(cp) = __floats2bfloat162_rn(v0, v1);"),
        DataType::F16 => ("*(__half*)(cp) = __float2half_rn(v0);", "*(__half2*)(cp) = __floats2half2_rn(v0, v1);"),
        _ => ("*(float*)(cp) = v0;", "*(float2*)(cp) = make_float2(v0, v1);"),
    };
    let esz = c.dtype.size() as i64;
    if pair {
        format!(
            r#"if (col + 1 < N_) {{
                            const float v0 = {e0};
                            const float v1 = {e1};
                            unsigned char* cp = rp + col * {esz}LL;
                            {st2}
                        }} else if (col < N_) {{
                            const float v0 = {e0};
                            unsigned char* cp = rp + col * {esz}LL;
                            {st1}
                        }}"#
        )
    } else {
        format!(
            r#"for (int e = 0; e < 2; ++e) {{
                            if (col + e < N_) {{
                                const float v0 = {ee};
                                unsigned char* cp = rp + (col + e) * {ccs}LL;
                                {st1}
                            }}
                        }}"#,
            ccs = c.col_stride * esz,
        )
    }
}

/// Stores of computed values `v0` (column `col`) and `v1` (column `col + 1`) of a row at row
/// pointer `rp`: pairs when C is row-major with even strides, else one element at a time;
/// guarded by N (the caller guards the row).
fn store_values(p: &GemmProblem) -> String {
    let c = &p.c;
    let pair = c.col_stride == 1 && c.row_stride % 2 == 0 && c.batch_stride % 2 == 0;
    let (st0, st1, st2) = match c.dtype {
        DataType::Bf16 => {
            ("*(__nv_bfloat16*)(cp) = __float2bfloat16_rn(v0);", "*(__nv_bfloat16*)(cp) = __float2bfloat16_rn(v1);", "*(__nv_bfloat162*)(cp) = __floats2bfloat162_rn(v0, v1);")
        }
        DataType::F16 => ("*(__half*)(cp) = __float2half_rn(v0);", "*(__half*)(cp) = __float2half_rn(v1);", "*(__half2*)(cp) = __floats2half2_rn(v0, v1);"),
        _ => ("*(float*)(cp) = v0;", "*(float*)(cp) = v1;", "*(float2*)(cp) = make_float2(v0, v1);"),
    };
    let esz = c.dtype.size() as i64;
    if pair {
        format!(
            r#"unsigned char* cp = rp + col * {esz}LL;
                        if (col + 1 < N_) {{
                            {st2}
                        }} else if (col < N_) {{
                            {st0}
                        }}"#
        )
    } else {
        format!(
            r#"if (col < N_) {{
                            unsigned char* cp = rp + col * {ccs}LL;
                            {st0}
                        }}
                        if (col + 1 < N_) {{
                            unsigned char* cp = rp + (col + 1) * {ccs}LL;
                            {st1}
                        }}"#,
            ccs = c.col_stride * esz,
        )
    }
}

/// The end of the shared-memory epilogues: the block made visible to the TMA (async proxy),
/// the warpgroup synchronized, then one thread stores its 64-column boxes and commits them.
fn tma_store_tail(bn: usize, coords: &str) -> String {
    format!(
        r#"            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            consumer_sync(cw);
            if (tid == 0) {{
                #pragma unroll
                for (int q = 0; q < {bn} / 64; ++q) tma_store(cbuf + q * 8192u, &tcm, tn * {bn} + q * 64, tm * {BM} + cw * 64, {coords});
                asm volatile("cp.async.bulk.commit_group;" ::: "memory");
            }}
"#
    )
}

/// The split-k reduce launch: for each pair of columns, the splits' partial sums added in
/// order (deterministic), then the epilogue and the store.
fn reduce_launch(p: &GemmProblem, epi: &Epilogue, splits: usize, entry: &str, part: usize) -> Launch {
    let c = &p.c;
    let esz = c.dtype.size() as i64;
    let np = p.n + p.n % 2;
    let store = store_code(p, &epi.names, "acc.x", "acc.y", false);
    let source = format!(
        r#"{code}
static constexpr long long M_ = {m}, N_ = {n}, NP = {np};
extern "C" __global__ void {entry}(void* __restrict__ c, const float* __restrict__ part{params}) {{
    unsigned char* const cbase = (unsigned char*)c;
    const long long pairs = {batch}LL * M_ * (NP / 2);
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < pairs; e += (long long)gridDim.x * blockDim.x) {{
        const long long col = (e % (NP / 2)) * 2;
        const long long rowg = e / (NP / 2);
        const long long row = rowg % M_;
        const int bt = (int)(rowg / M_);
        float2 acc = make_float2(0.f, 0.f);
        #pragma unroll 4
        for (int s = 0; s < {splits}; ++s) {{
            const float2 v = *(const float2*)(part + (((long long)s * {batch} + bt) * M_ + row) * NP + col);
            acc.x += v.x;
            acc.y += v.y;
        }}
        unsigned char* rp = cbase + (long long)bt * {cbs}LL + row * {crs}LL;
        {store}
    }}
}}
"#,
        code = epi.code,
        m = p.m,
        n = p.n,
        batch = p.batch,
        params = epi.params,
        cbs = c.batch_stride * esz,
        crs = c.row_stride * esz,
    );
    let pairs = (p.batch * p.m * np / 2) as u64;
    let mut args = vec![Arg::Ptr(c.tensor), Arg::Scratch(part)];
    args.extend(epi.args.iter().cloned());
    Launch::elementwise(source, entry, pairs, args)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cuda::{compile_cubin, nvrtc_available, CompileOptions};
    use crate::graph::TensorId;

    fn operand(t: usize, dtype: DataType, rows: usize, cols: usize, row_stride: i64, col_stride: i64, batch_stride: i64) -> Operand {
        Operand { tensor: TensorId(t), dtype, rows, cols, row_stride, col_stride, batch_stride }
    }

    fn problem(batch: usize, m: usize, n: usize, k: usize, a_kmajor: bool, b_kmajor: bool, out: DataType) -> GemmProblem {
        let t = DataType::Bf16;
        let a = if a_kmajor { operand(0, t, m, k, k as i64, 1, (m * k) as i64) } else { operand(0, t, m, k, 1, m as i64, (m * k) as i64) };
        let b = if b_kmajor { operand(1, t, k, n, 1, k as i64, 0) } else { operand(1, t, k, n, n as i64, 1, 0) };
        let c = operand(2, out, m, n, n as i64, 1, (m * n) as i64);
        GemmProblem { batch, m, n, k, a, b, c, allow_tf32: false, fast_fp8: false }
    }

    fn identity() -> Epilogue {
        Epilogue::identity()
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
        ] {
            let k = kernels(&p, &identity(), &t, "gemm_test").unwrap_or_else(|| panic!("{what}: no kernel"));
            let src = format!("{}\n{}", crate::engine::cuda::kernel::PRELUDE, k.launches[0].source);
            compile_cubin(&src, "gemm_test", &CompileOptions::new("sm_90a")).unwrap_or_else(|e| panic!("{what}: {e}"));
        }
        // The 64-wide tile, a configuration the probe (tests/cuda_sm90.rs) times.
        let p = problem(1, 16, 8192, 8192, true, false, DataType::Bf16);
        let cfg = Config { bn: 64, splits: 1, stages: 8, tma_store: true, bm: BM, swap: false, ..choose(&p, &t, &o) };
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
        assert!(k.launches[0].source.contains("m64n256k32.f32.e4m3.e5m2"), "fp8 wgmma");
        assert!(!k.launches[0].source.contains(", 0, 0;"), "no transpose operands for 8-bit types");
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
        assert!(k.launches[0].source.contains("m64n256k8.f32.tf32.tf32") && k.launches[0].source.contains("wgmma_tile_rs"));
        // Unswapped, B goes through its transposed copy.
        let k = kernels_with(&p, &identity(), &t, "g", Config { swap: false, stages: 4, ..cfg }).unwrap();
        assert_eq!(k.scratch, vec![8192 * 8192 * 4]);
        assert!(k.launches[1].source.contains("m64n256k8.f32.tf32.tf32") && !k.launches[1].source.contains("wgmma_tile_rs"));
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
