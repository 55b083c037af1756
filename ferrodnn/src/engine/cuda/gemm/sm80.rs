//! The general tensor-core GEMM: `mma.sync` fed by a multi-stage `cp.async` pipeline, for
//! sm_80 and later (and on sm_90a for what the Hopper kernel does not take). Any M, N, K,
//! strides, batch and alignment.
//!
//! - Block tiles of `BM x BN x 32` (128x128 with 8 warps, 64x64 with 4 warps when 128x128
//!   tiles do not fill the GPU, 16x128 with 4 warps for M <= 16), warp tiles of 16-row by
//!   8-column mma tiles, f32 accumulators in registers.
//! - Each operand tile lands in shared memory in the layout of its contiguous global dim
//!   ("K-major" when k is contiguous, "MN-major" otherwise), padded so that fragment loads are
//!   bank-conflict free. 16-bit fragments come from `ldmatrix` (`.trans` for MN-major), f32
//!   fragments from plain shared loads.
//! - Loads: 16-byte `cp.async` with zero fill (the src-size operand) past the edges, when the
//!   contiguous dim has stride 1 and rows (and batches) start 16-byte aligned (decided from the
//!   strides at plan time; the base pointers are checked when the plan runs, and a unit whose
//!   pointers are misaligned runs the alternative kernel with scalar loads and stores). Scalar
//!   loads (which also convert fp8 to f16) otherwise, guarded, zero outside.
//! - Gathered operands (an implicit GEMM's, `gather.rs`; `GM_GATHER`): the loaders address each
//!   16-byte vector (8- or 4-byte where the contiguous runs are shorter, as a grouped
//!   convolution's 4 or 2 channels a group; or each element) through the operand's index map; 128x64 tiles for 64 or fewer
//!   output channels (128x32 and 128x16 for 32 or 16 or fewer, a grouped convolution's: 64
//!   rows where 128 leave SMs idle), and a weight gradient's long reduction split up to 64 ways
//!   (to two blocks an SM, eight for the narrow tiles). A grouped convolution runs its
//!   groups as batches (`GemmProblem::groups`): each block's operands start at its group's
//!   channels and filters.
//! - mma: m16n8k16 f16/bf16; m16n8k8 tf32 when the graph allows reduced precision, else 3xTF32
//!   (each f32 operand split into a tf32 high part and a tf32 remainder, three mmas; about f32
//!   accuracy); fp8 (sm_89+) converted to f16 on load (exact), then m16n8k16; 8-bit integers
//!   (i8, u8) as they are, m16n8k32 into exact i32 accumulators (K-major tiles only: ldmatrix
//!   moves 16-bit elements, so an operand whose k is not contiguous is loaded element by element
//!   into a K-major tile). Their C is stored through the f32 epilogue (the sums converted), or,
//!   when only identities follow into an integer C, as the exact sums saturated to C's type.
//! - Epilogue: the group's [`Epilogue`] function on each accumulator, then a store of two
//!   neighbouring columns at once where C's layout allows, guarded at the edges.
//! - Split-K when the output tiles do not fill the GPU and K is long: each split writes its f32
//!   partial tile to scratch, and a second launch sums the partials in split order (so runs
//!   are bit-identical: no atomics; i32 partials for 8-bit integers), applies the epilogue and
//!   stores C.
//!
//! The device code is `sm80.cuh` (the main kernel: tile loaders, mma stage, epilogue and store)
//! and `sm80_reduce.cuh` (the split's second launch), after `sm80_common.cuh` (the problem and C's
//! stores); here the configuration is chosen.

use super::gather::{Gather, GATHER};
use super::{dt_code, epilogue_params, Epilogue, GemmProblem, Operand, COMMON};
use crate::dtype::DataType;
use crate::engine::cuda::kernel::{entry_name, Arg, Grid, Launch, NodeKernels, Pdl, Signature, Source, Target, Unaligned, Unit};
use crate::error::Result;
use crate::graph::Graph;

/// What the tensor cores multiply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmaKind {
    /// f16 operands in shared memory (from f16, or converted from fp8), m16n8k16.
    F16,
    Bf16,
    /// f32 in shared memory, one m16n8k8 tf32 mma (reduced precision).
    Tf32,
    /// f32 in shared memory, three tf32 mmas on a high/low split (about f32 accuracy).
    Tf32x3,
    /// 8-bit integers (i8 or u8, each operand its own) in shared memory, K-major, m16n8k32
    /// with exact i32 accumulators.
    S8,
}

impl MmaKind {
    fn sixteen_bit(self) -> bool {
        matches!(self, MmaKind::F16 | MmaKind::Bf16)
    }
    /// Fragments from `ldmatrix` (16-bit elements, or pairs of 8-bit ones), accumulators in 32
    /// registers a thread as the 16-bit kinds'.
    fn ldmatrix(self) -> bool {
        self.sixteen_bit() || self == MmaKind::S8
    }
    /// Its name in the templates (`GM_MMA` in `sm80.cuh`).
    fn code(self) -> &'static str {
        match self {
            MmaKind::F16 => "GM_MMA_F16",
            MmaKind::Bf16 => "GM_MMA_BF16",
            MmaKind::Tf32 => "GM_MMA_TF32",
            MmaKind::Tf32x3 => "GM_MMA_TF32X3",
            MmaKind::S8 => "GM_MMA_S8",
        }
    }
    pub fn esize(self) -> usize {
        match self {
            MmaKind::S8 => 1,
            k if k.sixteen_bit() => 2,
            _ => 4,
        }
    }
    /// The k of a block tile: 64 bytes of each row (32 for the 32-bit kinds').
    fn bk(self) -> usize {
        match self {
            MmaKind::S8 => 64,
            _ => 32,
        }
    }
}

/// Which dim of an operand tile is contiguous in shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Major {
    /// k contiguous: A as `[m][k]`, B as `[n][k]`.
    K,
    /// m (for A) or n (for B) contiguous: `[k][m]`, `[k][n]`.
    MN,
}

/// How a tile is brought in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Load {
    /// 16-byte cp.async along the contiguous dim, zero-filled past the edges.
    Async16,
    /// 8- or 4-byte cp.async (a gathered operand whose contiguous runs are shorter than 16
    /// bytes: a grouped convolution's 4 or 2 16-bit channels a group, say).
    Async8,
    Async4,
    /// One element per access through registers (any strides and alignment; converts).
    Scalar,
}

/// A kernel configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub bm: usize,
    pub bn: usize,
    pub bk: usize,
    pub warps_m: usize,
    pub warps_n: usize,
    pub stages: usize,
    pub kind: MmaKind,
    pub a_major: Major,
    pub b_major: Major,
    pub a_load: Load,
    pub b_load: Load,
    /// Store two neighbouring columns of C at once (C's columns contiguous, pairs aligned).
    pub pair_store: bool,
    pub splits: usize,
    /// k tiles per split.
    pub kt_per: usize,
}

/// Tile rows a group of the grouped tile order walks together.
const GROUP_M: usize = 8;

impl Load {
    /// The bytes one cp.async brings (0: scalar loads).
    fn bytes(self) -> usize {
        match self {
            Load::Async16 => 16,
            Load::Async8 => 8,
            Load::Async4 => 4,
            Load::Scalar => 0,
        }
    }
    /// The bytes of a gathered tile's vector (`GM_A_VB`, `GM_B_VB`; 16 for scalar loads, which
    /// read none).
    fn vector_bytes(self) -> usize {
        match self.bytes() {
            0 => 16,
            b => b,
        }
    }
}

impl Config {
    fn threads(&self) -> usize {
        self.warps_m * self.warps_n * 32
    }
    /// Row pitch in elements: 16 bytes past a row for the ldmatrix kinds (conflict-free
    /// fragment loads), 4 elements for 32-bit ones.
    fn pitch(&self, major: Major, mn: usize) -> usize {
        match (major, self.kind.ldmatrix()) {
            (Major::K, true) => self.bk + 16 / self.kind.esize(),
            (Major::K, false) => self.bk + 4,
            (Major::MN, _) => mn + 8,
        }
    }
    fn a_pitch(&self) -> usize {
        self.pitch(self.a_major, self.bm)
    }
    fn b_pitch(&self) -> usize {
        self.pitch(self.b_major, self.bn)
    }
    fn a_stage_elems(&self) -> usize {
        self.a_pitch() * if self.a_major == Major::K { self.bm } else { self.bk }
    }
    fn b_stage_elems(&self) -> usize {
        self.b_pitch() * if self.b_major == Major::K { self.bn } else { self.bk }
    }
    pub fn shared_bytes(&self) -> usize {
        self.stages * (self.a_stage_elems() + self.b_stage_elems()) * self.kind.esize()
    }
    /// The same kernel with scalar loads and stores only: the alternative for misaligned
    /// pointers.
    pub fn scalar(&self) -> Config {
        Config { a_load: Load::Scalar, b_load: Load::Scalar, pair_store: false, stages: 2, ..self.clone() }
    }
}

fn ceil(a: usize, b: usize) -> usize {
    a.div_ceil(b.max(1))
}

/// The k-contiguous or mn-contiguous layout of an operand (`k_stride`/`mn_stride`: its
/// element strides along k and along m or n), and whether 16-byte cp.async can load it.
fn layout(op: &Operand, k_stride: i64, mn_stride: i64, kind: MmaKind, batch: usize) -> (Major, Load) {
    // (8-bit fragments come from K-major tiles only: ldmatrix moves 16-bit elements.)
    let major = if k_stride == 1 || kind == MmaKind::S8 {
        Major::K
    } else if mn_stride == 1 {
        Major::MN
    } else {
        Major::K
    };
    let esize = op.dtype.size() as i64;
    let other = if major == Major::K { mn_stride } else { k_stride };
    let contiguous = if major == Major::K { k_stride == 1 } else { mn_stride == 1 };
    let same_type = loads_as_is(op.dtype, kind);
    let aligned = (other * esize) % 16 == 0 && (batch == 1 || (op.batch_stride * esize) % 16 == 0);
    let load = if contiguous && same_type && aligned { Load::Async16 } else { Load::Scalar };
    (major, load)
}

/// The layout of a gathered operand's tile in shared memory (K-major when its k index is
/// contiguous, else MN-major when that one is) and whether cp.async loads it: 16-byte vectors
/// where the index's runs allow (its offset per group, `group`, a whole number of vectors too),
/// else 8- or 4-byte ones (runs of 4 or 2 16-bit channels), else one element at a time.
fn gather_layout(g: &Gather, dtype: DataType, kind: MmaKind, group: i64) -> (Major, Load) {
    let same_type = loads_as_is(dtype, kind);
    let major_of = |vec: i64| {
        if g.k.contiguous(vec) {
            Some(Major::K)
        } else if g.mn.contiguous(vec) && kind != MmaKind::S8 {
            Some(Major::MN)
        } else {
            None
        }
    };
    for load in [Load::Async16, Load::Async8, Load::Async4] {
        let vec = (load.bytes() / dtype.size()) as i64;
        if vec < 1 {
            continue;
        }
        if let Some(major) = major_of(vec) {
            if same_type && g.aligned(major == Major::K, vec) && group % vec == 0 {
                return (major, load);
            }
        }
    }
    (major_of((16 / dtype.size()) as i64).unwrap_or(Major::K), Load::Scalar)
}

/// Whether an operand of type `dt` lands in shared memory as it is (cp.async can bring it) for
/// `kind`, rather than converted element by element.
fn loads_as_is(dt: DataType, kind: MmaKind) -> bool {
    matches!(
        (dt, kind),
        (DataType::F16, MmaKind::F16) | (DataType::Bf16, MmaKind::Bf16) | (DataType::F32, MmaKind::Tf32 | MmaKind::Tf32x3) | (DataType::I8 | DataType::U8, MmaKind::S8)
    )
}

/// What the tensor cores multiply for inputs of types `a` and `b`, when this path takes them.
/// Operands of another type are converted exactly while loaded: fp8 fits f16 and bf16; f16
/// and bf16 fit tf32 (so f16 x bf16 runs one tf32 mma with no rounding); f32 with anything runs
/// 3xTF32 (tf32 when the graph allows reduced precision). fp8 only on sm_89 and later. 8-bit
/// integers (i8, u8, any pair) multiply exactly into i32 sums; not with another type.
pub fn mma_kind(a: DataType, b: DataType, allow_tf32: bool, target: &Target) -> Option<MmaKind> {
    use DataType::*;
    if matches!(a, I8 | U8) && matches!(b, I8 | U8) {
        return Some(MmaKind::S8);
    }
    if (a.is_fp8() || b.is_fp8()) && target.cc() < 89 {
        return None;
    }
    let f32_kind = if allow_tf32 { MmaKind::Tf32 } else { MmaKind::Tf32x3 };
    Some(match (a, b) {
        (F16, F16) => MmaKind::F16,
        (Bf16, Bf16) => MmaKind::Bf16,
        (x, y) if x.is_fp8() && y.is_fp8() => MmaKind::F16,
        (x, F16) | (F16, x) if x.is_fp8() => MmaKind::F16,
        (x, Bf16) | (Bf16, x) if x.is_fp8() => MmaKind::Bf16,
        (F16, Bf16) | (Bf16, F16) => MmaKind::Tf32,
        (F32, y) if y == F32 || y == F16 || y == Bf16 || y.is_fp8() => f32_kind,
        (x, F32) if x == F16 || x == Bf16 || x.is_fp8() => f32_kind,
        _ => return None,
    })
}

/// The configuration for a problem on a target, or None when this path does not take it.
pub fn choose(p: &GemmProblem, target: &Target) -> Option<Config> {
    if target.cc() < 80 || p.m == 0 || p.n == 0 || p.k == 0 || p.batch == 0 {
        return None;
    }
    // Both operands gathered or neither (the kernel has one loader for both).
    if p.a.gather.is_some() != p.b.gather.is_some() {
        return None;
    }
    let kind = mma_kind(p.a.dtype, p.b.dtype, p.allow_tf32, target)?;
    let sm = target.sm_count.max(1) as usize;
    let tiles = |bm: usize, bn: usize| ceil(p.m, bm) * ceil(p.n, bn) * p.batch;
    let gathered = p.a.gather.is_some() || p.b.gather.is_some();
    let (bm, bn, warps_m, warps_n) = if p.m <= 16 {
        (16, 128, 1, 4)
    } else if gathered && p.n <= 32 {
        // (A convolution with few output channels, a grouped one's a group: tiles as narrow as
        // the mma's fragments allow (16 columns), so that they do not fill 64 with zeros; 64 rows
        // where 128 leave SMs idle.)
        let bn = if p.n <= 16 { 16 } else { 32 };
        if tiles(128, bn) >= sm {
            (128, bn, 4, 1)
        } else {
            (64, bn, 4, 1)
        }
    } else if gathered && p.n <= 64 && tiles(128, 64) >= sm {
        // (A convolution with 64 or fewer output channels: no half-empty 128-column tiles.)
        (128, 64, 4, 2)
    } else if tiles(128, 128) >= sm {
        (128, 128, 2, 4)
    } else {
        (64, 64, 2, 2)
    };
    let bk = kind.bk();
    // A is m x k (k along columns), B is k x n (k along rows).
    let (a_major, a_load) = match &p.a.gather {
        Some(g) => gather_layout(g, p.a.dtype, kind, p.a.batch_stride),
        None => layout(&p.a, p.a.col_stride, p.a.row_stride, kind, p.batch),
    };
    let (b_major, b_load) = match &p.b.gather {
        Some(g) => gather_layout(g, p.b.dtype, kind, p.b.batch_stride),
        None => layout(&p.b, p.b.row_stride, p.b.col_stride, kind, p.batch),
    };
    let any_async = a_load != Load::Scalar || b_load != Load::Scalar;
    let stages = match (any_async, kind.ldmatrix()) {
        (false, _) => 2,
        (true, true) => 4,
        (true, false) => 3,
    };
    let csize = p.c.dtype.size() as i64;
    let pair_store = p.c.col_stride == 1 && p.n >= 2 && (p.c.row_stride * csize) % (2 * csize) == 0 && (p.batch == 1 || (p.c.batch_stride * csize) % (2 * csize) == 0);
    // Split-K: few output tiles and a long K.
    let tiles_mn = tiles(bm, bn);
    let kt = ceil(p.k, bk);
    let mut splits = 1;
    if tiles_mn < sm && kt >= 8 {
        // (An implicit GEMM's long reduction, a weight gradient's, splits further, to two
        // blocks an SM: its tiles are few and its operands are re-read from L2.)
        // (Narrow tiles, a grouped convolution's, split to eight blocks an SM: their blocks of
        // four warps are small.)
        let (blocks, most) = if gathered && bn <= 32 {
            (8 * sm, 64)
        } else if gathered {
            (2 * sm, 64)
        } else {
            (sm, 16)
        };
        splits = ceil(blocks, tiles_mn).min(most).min(kt / 4).max(1);
        let cap = (256usize << 20) / (4 * p.batch * p.m * p.n).max(1);
        splits = splits.min(cap.max(1));
    }
    let kt_per = ceil(kt, splits);
    let splits = ceil(kt, kt_per);
    // (An implicit GEMM's short reduction, a grouped convolution's few channels a group: no
    // more stages than its k tiles and one, so that more blocks fit an SM.)
    let stages = if gathered && splits == 1 { stages.min(kt + 1).max(2) } else { stages };
    if (tiles_mn as u128) * (splits as u128) > i32::MAX as u128 {
        return None;
    }
    let cfg = Config { bm, bn, bk, warps_m, warps_n, stages, kind, a_major, b_major, a_load, b_load, pair_store, splits, kt_per };
    if cfg.shared_bytes() > 160 * 1024 {
        return None;
    }
    Some(cfg)
}

/// The defines of `sm80_common.cuh`: the problem's extents, types and strides, and the
/// epilogue's arguments.
fn problem_defines(src: Source, p: &GemmProblem, epi: &Epilogue) -> Source {
    let (a, b, c) = (&p.a, &p.b, &p.c);
    src.define("GEMM_M", p.m)
        .define("GEMM_N", p.n)
        .define("GEMM_K", p.k)
        .define("GEMM_BATCH", p.batch)
        .define("GEMM_A", dt_code(a.dtype))
        .define("GEMM_B", dt_code(b.dtype))
        .define("GEMM_C", dt_code(c.dtype))
        .define("GEMM_A_RS", a.row_stride)
        .define("GEMM_A_CS", a.col_stride)
        .define("GEMM_A_BS", a.batch_stride)
        .define("GEMM_B_RS", b.row_stride)
        .define("GEMM_B_CS", b.col_stride)
        .define("GEMM_B_BS", b.batch_stride)
        .define("GEMM_C_RS", c.row_stride)
        .define("GEMM_C_CS", c.col_stride)
        .define("GEMM_C_BS", c.batch_stride)
        .define("EPI_NAMES", &epi.names)
}

/// The main kernel's text (`sm80.cuh`): tiles of C (or of a split's partial sums) for every
/// batch.
fn main_source(cfg: &Config, p: &GemmProblem, epi: &Epilogue, entry: &str, sig: &Signature) -> String {
    let split = cfg.splits > 1;
    // Two blocks per SM for the 16-bit (and 8-bit) 8-warp tile (at most 128 registers a thread).
    let min_blocks = if cfg.threads() == 256 && cfg.kind.ldmatrix() { 2 } else { 1 };
    let src = problem_defines(Source::new().entry(entry, sig), p, epi)
        .define("GM_MMA", cfg.kind.code())
        .define("GM_BM", cfg.bm)
        .define("GM_BN", cfg.bn)
        .define("GM_BK", cfg.bk)
        .define("GM_WARPS_M", cfg.warps_m)
        .define("GM_WARPS_N", cfg.warps_n)
        .define("GM_MIN_BLOCKS", min_blocks)
        .define("GM_STAGES", cfg.stages)
        .define("GM_TM", ceil(p.m, cfg.bm))
        .define("GM_TN", ceil(p.n, cfg.bn))
        .define("GM_KT", ceil(p.k, cfg.bk))
        .define("GM_GROUP", GROUP_M)
        .define("GM_SPLITS", cfg.splits)
        .define("GM_KT_PER", cfg.kt_per)
        .flag("GM_A_KMAJOR", cfg.a_major == Major::K)
        .flag("GM_B_KMAJOR", cfg.b_major == Major::K)
        .flag("GM_A_ASYNC", cfg.a_load != Load::Scalar)
        .flag("GM_B_ASYNC", cfg.b_load != Load::Scalar)
        .define("GM_A_PITCH", cfg.a_pitch())
        .define("GM_B_PITCH", cfg.b_pitch())
        .define("GM_A_STAGE", cfg.a_stage_elems())
        .define("GM_B_STAGE", cfg.b_stage_elems())
        .flag("GM_PAIR_STORE", cfg.pair_store)
        .flag("GM_INT_EXACT", epi.int_exact)
        .flag("GM_GATHER", p.a.gather.is_some())
        .define("GM_GROUPS", p.groups.max(1));
    let src = match (&p.a.gather, &p.b.gather) {
        (Some(a), Some(b)) => {
            b.defines(a.defines(src, "GA_"), "GB_").define("GM_A_VB", cfg.a_load.vector_bytes()).define("GM_B_VB", cfg.b_load.vector_bytes()).template(COMMON).template(GATHER)
        }
        _ => src.template(COMMON),
    };
    // (A split's kernel stores no C: no epilogue.)
    let src = if split { src } else { src.template(&epi.code) };
    src.template(include_str!("sm80_common.cuh")).template(include_str!("sm80.cuh")).build()
}

/// The launches of a configuration (`tag` keeps entry names apart).
pub fn kernels(cfg: &Config, p: &GemmProblem, epi: &Epilogue, node: usize, tag: &str) -> NodeKernels {
    let tiles = ceil(p.m, cfg.bm) * ceil(p.n, cfg.bn);
    let grid = (tiles * cfg.splits * p.batch) as u64;
    let entry = entry_name(node, &format!("gemm{tag}"));
    let mut sig = Signature::new();
    sig.param("const void* __restrict__ gm_a", Arg::Ptr(p.a.tensor)).param("const void* __restrict__ gm_b", Arg::Ptr(p.b.tensor));
    let mut launches = Vec::new();
    let mut scratch = Vec::new();
    // (A split's partials are the accumulators' type: i32 for 8-bit integers.)
    let ws_type = if cfg.kind == MmaKind::S8 { "int" } else { "float" };
    if cfg.splits > 1 {
        sig.param(format!("{ws_type}* __restrict__ gm_ws"), Arg::Scratch(0));
        scratch.push(cfg.splits * p.batch * p.m * p.n * 4);
    } else {
        sig.param("void* __restrict__ gm_c", Arg::Ptr(p.c.tensor));
        epilogue_params(&mut sig, epi);
    }
    let main = main_source(cfg, p, epi, &entry, &sig);
    let threads = cfg.threads() as u32;
    let grid32 = grid.min(u32::MAX as u64) as u32;
    launches.push(Launch {
        source: main,
        entry,
        grid: Grid::Exact(grid32, 1, 1),
        block: threads,
        shared_bytes: cfg.shared_bytes() as u32,
        args: sig.into_args(),
        cluster: None,
        pdl: Pdl::Dependent,
    });
    if cfg.splits > 1 {
        // The second launch: sums the partials of every element in split order, applies the
        // epilogue, stores C (`sm80_reduce.cuh`).
        let entry = entry_name(node, &format!("gemm{tag}_reduce"));
        let mut sig = Signature::new();
        sig.param(format!("const {ws_type}* __restrict__ gm_ws"), Arg::Scratch(0)).param("void* __restrict__ gm_c", Arg::Ptr(p.c.tensor));
        epilogue_params(&mut sig, epi);
        let src = problem_defines(Source::new().entry(&entry, &sig), p, epi)
            .define("GM_SPLITS", cfg.splits)
            .flag("GM_INT_EXACT", epi.int_exact)
            .template(COMMON)
            .template(&epi.code)
            .template(include_str!("sm80_common.cuh"))
            .template(include_str!("sm80_reduce.cuh"))
            .build();
        let total = p.batch as u64 * p.m as u64 * p.n as u64;
        launches.push(Launch::elementwise(src, &entry, total.max(1), sig.into_args()));
    }
    NodeKernels { launches, scratch }
}

/// The mma.sync unit of a GEMM group, or None when this path does not take the problem.
pub fn unit(_graph: &Graph, nodes: &[usize], p: &GemmProblem, epi: &Epilogue, target: &Target) -> Result<Option<Unit>> {
    let Some(cfg) = choose(p, target) else { return Ok(None) };
    let Some(&last) = nodes.last() else { return Ok(None) };
    let kernels = kernels(&cfg, p, epi, last, "");
    // Kernels that rely on 16-byte aligned base pointers, and the alternative without.
    let mut tensors = Vec::new();
    if cfg.a_load != Load::Scalar {
        tensors.push(p.a.tensor);
    }
    if cfg.b_load != Load::Scalar && !tensors.contains(&p.b.tensor) {
        tensors.push(p.b.tensor);
    }
    if cfg.pair_store && cfg.splits == 1 {
        tensors.push(p.c.tensor);
    }
    let unaligned = if tensors.is_empty() { None } else { Some(Box::new(Unaligned { tensors, kernels: self::kernels(&cfg.scalar(), p, epi, last, "_u") })) };
    Ok(Some(Unit { nodes: nodes.to_vec(), kernels, writes: vec![p.c.tensor], unaligned }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::TensorId;

    fn op(dt: DataType, rows: usize, cols: usize, rs: i64, cs: i64, bs: i64, t: usize) -> Operand {
        Operand { tensor: TensorId(t), dtype: dt, rows, cols, row_stride: rs, col_stride: cs, batch_stride: bs, gather: None }
    }

    fn problem(dt: DataType, batch: usize, m: usize, n: usize, k: usize) -> GemmProblem {
        GemmProblem {
            batch,
            m,
            n,
            k,
            a: op(dt, m, k, k as i64, 1, (m * k) as i64, 0),
            b: op(dt, k, n, n as i64, 1, (k * n) as i64, 1),
            c: op(dt, m, n, n as i64, 1, (m * n) as i64, 2),
            groups: 1,
            allow_tf32: false,
            fast_fp8: false,
        }
    }

    /// A gathered image of 4 (or 2) 16-bit channels a tap loads by 8-byte (4-byte) vectors; 8
    /// channels by 16-byte ones.
    #[test]
    fn short_channel_runs_load_by_short_vectors() {
        use super::super::gather::{Axis, Index};
        let image = |c: i64| Gather {
            mn: Index::Pixel { n_stride: 35 * c * 4, grid: [1, 5, 7], mul: [0, 1, 1], off: [0, -1, -1] },
            k: Index::Taps { taps: [1, 3, 3], channels: c, ch_stride: 1, tap_major: true, dil: [0, 1, 1] },
            axes: [Axis::unit(), Axis { extent: 5, stride: 7 * c * 4, div: 1, base: 0 }, Axis { extent: 7, stride: c * 4, div: 1, base: 0 }],
            block: None,
        };
        assert_eq!(gather_layout(&image(8), DataType::F16, MmaKind::F16, 8), (Major::K, Load::Async16));
        assert_eq!(gather_layout(&image(4), DataType::F16, MmaKind::F16, 4), (Major::K, Load::Async8));
        assert_eq!(gather_layout(&image(2), DataType::Bf16, MmaKind::Bf16, 2), (Major::K, Load::Async4));
        assert_eq!(gather_layout(&image(2), DataType::F32, MmaKind::Tf32x3, 2), (Major::K, Load::Async8));
        // A group offset that is not a whole number of vectors: shorter ones.
        assert_eq!(gather_layout(&image(8), DataType::F16, MmaKind::F16, 12), (Major::K, Load::Async8));
        // 3 channels: element by element.
        assert_eq!(gather_layout(&image(3), DataType::F16, MmaKind::F16, 3).1, Load::Scalar);
    }

    #[test]
    fn tiles_splits_and_layouts() {
        let h = Target::sm90a();
        let c = choose(&problem(DataType::Bf16, 1, 8192, 8192, 8192), &h).unwrap();
        assert_eq!((c.bm, c.bn, c.splits, c.stages), (128, 128, 1, 4));
        assert_eq!((c.a_major, c.b_major, c.a_load, c.b_load), (Major::K, Major::MN, Load::Async16, Load::Async16));
        assert!(c.pair_store);
        let c = choose(&problem(DataType::Bf16, 1, 64, 64, 4096), &h).unwrap();
        assert_eq!((c.bm, c.bn, c.splits, c.kt_per), (64, 64, 16, 8));
        let c = choose(&problem(DataType::Bf16, 1, 16, 8192, 8192), &h).unwrap();
        assert_eq!((c.bm, c.bn, c.splits), (16, 128, 3));
        // Odd k in row-major A: rows are not 16-byte aligned.
        let c = choose(&problem(DataType::F16, 1, 33, 130, 257), &h).unwrap();
        assert_eq!(c.a_load, Load::Scalar);
        let c = choose(&problem(DataType::F32, 2, 130, 257, 33), &h).unwrap();
        assert_eq!(c.kind, MmaKind::Tf32x3);
        assert!(choose(&problem(DataType::Fp8E4m3, 1, 64, 64, 64), &Target::sm80()).is_none());
        assert_eq!(mma_kind(DataType::F16, DataType::Bf16, false, &h), Some(MmaKind::Tf32));
        assert_eq!(mma_kind(DataType::F32, DataType::Bf16, false, &h), Some(MmaKind::Tf32x3));
        assert_eq!(mma_kind(DataType::Fp8E5m2, DataType::Bf16, false, &h), Some(MmaKind::Bf16));
        assert_eq!(mma_kind(DataType::F16, DataType::Fp8E4m3, false, &Target::sm80()), None);
        assert_eq!(mma_kind(DataType::F64, DataType::F32, false, &h), None);
        assert_eq!(choose(&problem(DataType::Fp8E4m3, 1, 64, 64, 64), &h).unwrap().kind, MmaKind::F16);
        for dt in [DataType::F16, DataType::F32] {
            for (m, n, k) in [(8192, 8192, 8192), (64, 64, 64), (16, 8192, 8192)] {
                let c = choose(&problem(dt, 1, m, n, k), &h).unwrap();
                assert!(c.shared_bytes() <= 160 * 1024);
                assert_eq!(c.bm % (c.warps_m * 16), 0);
                assert_eq!(c.bn % (c.warps_n * 16), 0);
            }
        }
    }
}
