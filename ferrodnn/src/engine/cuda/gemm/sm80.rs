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
//! - mma: m16n8k16 f16/bf16; m16n8k8 tf32 when the graph allows reduced precision, else 3xTF32
//!   (each f32 operand split into a tf32 high part and a tf32 remainder, three mmas; about f32
//!   accuracy); fp8 (sm_89+) converted to f16 on load (exact), then m16n8k16.
//! - Epilogue: the group's [`Epilogue`] function on each accumulator, then a store of two
//!   neighbouring columns at once where C's layout allows, guarded at the edges.
//! - Split-K when the output tiles do not fill the GPU and K is long: each split writes its f32
//!   partial tile to scratch, and a second launch sums the partials in split order (so runs
//!   are bit-identical: no atomics), applies the epilogue and stores C.
//!
//! The pieces are separate generators ([`tile_loader`], [`mma_stage`], [`epilogue_store`]) so
//! that implicit-GEMM convolution can reuse them with its own loaders.

use super::{Epilogue, GemmProblem, Operand};
use crate::dtype::DataType;
use crate::engine::cuda::kernel::{entry_name, Arg, Grid, Launch, NodeKernels, Pdl, Target, Unaligned, Unit};
use crate::error::Result;
use crate::graph::Graph;
use std::fmt::Write;

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
}

impl MmaKind {
    fn sixteen_bit(self) -> bool {
        matches!(self, MmaKind::F16 | MmaKind::Bf16)
    }
    /// The C type of a shared-memory element (16-bit kinds are kept as raw bits).
    pub fn smem_type(self) -> &'static str {
        if self.sixteen_bit() {
            "unsigned short"
        } else {
            "float"
        }
    }
    pub fn esize(self) -> usize {
        if self.sixteen_bit() {
            2
        } else {
            4
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
    /// One element per access through registers (any strides and alignment; converts).
    Scalar,
}

/// One operand tile's trip from global to shared memory: a `rows x cols` tile stored with row
/// pitch `pitch` (elements) whose element `(r, c)` is at `r * row_stride + c * col_stride`
/// elements from the tile's origin in global memory.
#[derive(Clone, Debug, PartialEq)]
pub struct TileLoad {
    pub name: String,
    pub gtype: DataType,
    pub kind: MmaKind,
    pub rows: usize,
    pub cols: usize,
    pub pitch: usize,
    pub row_stride: i64,
    pub col_stride: i64,
    pub load: Load,
    pub threads: usize,
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

const GROUP_M: usize = 8;

impl Config {
    fn threads(&self) -> usize {
        self.warps_m * self.warps_n * 32
    }
    fn mi(&self) -> usize {
        self.bm / self.warps_m / 16
    }
    fn ni(&self) -> usize {
        self.bn / self.warps_n / 8
    }
    fn pitch(&self, major: Major, mn: usize) -> usize {
        match (major, self.kind.sixteen_bit()) {
            (Major::K, true) => self.bk + 8,
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
    let major = if k_stride == 1 {
        Major::K
    } else if mn_stride == 1 {
        Major::MN
    } else {
        Major::K
    };
    let esize = op.dtype.size() as i64;
    let other = if major == Major::K { mn_stride } else { k_stride };
    let contiguous = if major == Major::K { k_stride == 1 } else { mn_stride == 1 };
    let same_type = matches!((op.dtype, kind), (DataType::F16, MmaKind::F16) | (DataType::Bf16, MmaKind::Bf16) | (DataType::F32, MmaKind::Tf32 | MmaKind::Tf32x3));
    let aligned = (other * esize) % 16 == 0 && (batch == 1 || (op.batch_stride * esize) % 16 == 0);
    let load = if contiguous && same_type && aligned { Load::Async16 } else { Load::Scalar };
    (major, load)
}

/// What the tensor cores multiply for inputs of types `a` and `b`, when this path takes them.
/// Operands of another type are converted exactly while loaded: fp8 fits f16 and bf16; f16
/// and bf16 fit tf32 (so f16 x bf16 runs one tf32 mma with no rounding); f32 with anything runs
/// 3xTF32 (tf32 when the graph allows reduced precision). fp8 only on sm_89 and later.
pub fn mma_kind(a: DataType, b: DataType, allow_tf32: bool, target: &Target) -> Option<MmaKind> {
    use DataType::*;
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
    let kind = mma_kind(p.a.dtype, p.b.dtype, p.allow_tf32, target)?;
    let sm = target.sm_count.max(1) as usize;
    let tiles = |bm: usize, bn: usize| ceil(p.m, bm) * ceil(p.n, bn) * p.batch;
    let (bm, bn, warps_m, warps_n) = if p.m <= 16 {
        (16, 128, 1, 4)
    } else if tiles(128, 128) >= sm {
        (128, 128, 2, 4)
    } else {
        (64, 64, 2, 2)
    };
    let bk = 32;
    // A is m x k (k along columns), B is k x n (k along rows).
    let (a_major, a_load) = layout(&p.a, p.a.col_stride, p.a.row_stride, kind, p.batch);
    let (b_major, b_load) = layout(&p.b, p.b.row_stride, p.b.col_stride, kind, p.batch);
    let any_async = a_load == Load::Async16 || b_load == Load::Async16;
    let stages = match (any_async, kind.sixteen_bit()) {
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
        splits = ceil(sm, tiles_mn).min(16).min(kt / 4).max(1);
        let cap = (256usize << 20) / (4 * p.batch * p.m * p.n).max(1);
        splits = splits.min(cap.max(1));
    }
    let kt_per = ceil(kt, splits);
    let splits = ceil(kt, kt_per);
    if (tiles_mn as u128) * (splits as u128) > i32::MAX as u128 {
        return None;
    }
    let cfg = Config { bm, bn, bk, warps_m, warps_n, stages, kind, a_major, b_major, a_load, b_load, pair_store, splits, kt_per };
    if cfg.shared_bytes() > 160 * 1024 {
        return None;
    }
    Some(cfg)
}

/// Device helpers every kernel of this path uses: cp.async, ldmatrix, mma, tf32 conversion.
pub fn common() -> &'static str {
    r#"
__device__ __forceinline__ unsigned gm_saddr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void gm_cp16(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void gm_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void gm_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory"); }
__device__ __forceinline__ void gm_ldsm4(unsigned addr, unsigned (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void gm_ldsm4t(unsigned addr, unsigned (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void gm_mma_f16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void gm_mma_bf16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void gm_mma_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ unsigned gm_tf32(float x) { unsigned r; asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x)); return r; }
"#
}

/// A scalar load expression of global type `gt` at element offset `o` of `g` (a `const
/// char*`), as the shared-memory type of `kind`.
/// Every conversion here is exact (see [`mma_kind`]).
fn load_expr(gt: DataType, kind: MmaKind, o: &str) -> String {
    let fp8_half = |e: &str| format!("__half(__nv_cvt_fp8_to_halfraw(((const __nv_fp8_storage_t*)g)[{o}], {e}))");
    let fp8 = if gt == DataType::Fp8E5m2 { "__NV_E5M2" } else { "__NV_E4M3" };
    match (gt, kind) {
        (DataType::F16, MmaKind::F16) | (DataType::Bf16, MmaKind::Bf16) => format!("((const unsigned short*)g)[{o}]"),
        (DataType::Fp8E4m3 | DataType::Fp8E5m2, MmaKind::F16) => format!("__half_as_ushort({})", fp8_half(fp8)),
        (DataType::Fp8E4m3 | DataType::Fp8E5m2, MmaKind::Bf16) => format!("__bfloat16_as_ushort(__float2bfloat16_rn(__half2float({})))", fp8_half(fp8)),
        (DataType::F16, _) => format!("__half2float(((const __half*)g)[{o}])"),
        (DataType::Bf16, _) => format!("__bfloat162float(((const __nv_bfloat16*)g)[{o}])"),
        (DataType::Fp8E4m3 | DataType::Fp8E5m2, _) => format!("__half2float({})", fp8_half(fp8)),
        _ => format!("((const float*)g)[{o}]"),
    }
}

/// `void <name>(T* s, const char* g, long long rows_valid, long long cols_valid, int tid)`:
/// every thread of the block brings its share of the tile at `g` into `s`; elements at rows
/// `>= rows_valid` or cols `>= cols_valid` become zero. Async loads are left in flight (the
/// caller commits and waits); scalar loads are stored before it returns.
pub fn tile_loader(t: &TileLoad) -> String {
    let st = t.kind.smem_type();
    let mut s = format!("__device__ __forceinline__ void {}({st}* __restrict__ s, const char* __restrict__ g, long long rows_valid, long long cols_valid, int tid) {{\n", t.name);
    match t.load {
        Load::Async16 => {
            let es = t.gtype.size();
            let vec = 16 / es;
            let per_row = t.cols / vec;
            let total = t.rows * per_row;
            let iters = ceil(total, t.threads);
            let _ = writeln!(s, "    #pragma unroll\n    for (int it = 0; it < {iters}; ++it) {{");
            let _ = writeln!(s, "        const int idx = tid + it * {};", t.threads);
            if total % t.threads != 0 {
                let _ = writeln!(s, "        if (idx >= {total}) break;");
            }
            let _ = writeln!(s, "        const int r = idx / {per_row}, c = (idx % {per_row}) * {vec};");
            let _ = writeln!(s, "        const long long left = r < rows_valid ? cols_valid - c : 0;");
            let _ = writeln!(s, "        const int n = left <= 0 ? 0 : (left >= {vec} ? {vec} : (int)left);");
            // Whole 16-byte chunks by cp.async; a chunk cut by the edge (or wholly outside) by
            // plain loads of its valid elements and zeros, so that nothing past the tensor's
            // extent is ever addressed.
            let zero = if t.kind.sixteen_bit() { "(unsigned short)0" } else { "0.0f" };
            let _ = writeln!(s, "        {st}* const d = s + r * {} + c;", t.pitch);
            let _ = writeln!(s, "        if (n == {vec}) {{");
            let _ = writeln!(s, "            gm_cp16(gm_saddr(d), g + ((long long)r * {}LL + c) * {es}, 16);", t.row_stride);
            let _ = writeln!(s, "        }} else {{");
            let _ = writeln!(s, "            const {st}* const src = (const {st}*)(g + ((long long)r * {}LL + c) * {es});", t.row_stride);
            let _ = writeln!(s, "            #pragma unroll\n            for (int e = 0; e < {vec}; ++e) d[e] = e < n ? src[e] : {zero};");
            let _ = writeln!(s, "        }}");
            s += "    }\n";
        }
        Load::Scalar => {
            let total = t.rows * t.cols;
            let iters = ceil(total, t.threads);
            let zero = if t.kind.sixteen_bit() { "(unsigned short)0" } else { "0.0f" };
            // Loads in chunks of 4, then their stores: a few loads in flight per thread without
            // holding the whole tile in registers next to the accumulators.
            let chunk = iters.min(4);
            let bound = if total % t.threads != 0 { format!("idx < {total} && ") } else { String::new() };
            let o = format!("(long long)r * {}LL + (long long)c * {}LL", t.row_stride, t.col_stride);
            let _ = writeln!(s, "    #pragma unroll 1\n    for (int it0 = 0; it0 < {iters}; it0 += {chunk}) {{");
            let _ = writeln!(s, "        {st} v[{chunk}];");
            let _ = writeln!(s, "        #pragma unroll\n        for (int u = 0; u < {chunk}; ++u) {{");
            let _ = writeln!(s, "            const int idx = tid + (it0 + u) * {};", t.threads);
            let _ = writeln!(s, "            const int r = idx / {c}, c = idx % {c};", c = t.cols);
            let guard = if iters % chunk != 0 { format!("it0 + u < {iters} && ") } else { String::new() };
            let _ = writeln!(s, "            v[u] = ({guard}{bound}r < rows_valid && c < cols_valid) ? {} : {zero};", load_expr(t.gtype, t.kind, &o));
            s += "        }\n";
            let _ = writeln!(s, "        #pragma unroll\n        for (int u = 0; u < {chunk}; ++u) {{");
            let _ = writeln!(s, "            const int idx = tid + (it0 + u) * {};", t.threads);
            let _ = writeln!(s, "            if ({guard}idx < {total}) s[(idx / {c}) * {p} + idx % {c}] = v[u];", c = t.cols, p = t.pitch);
            s += "        }\n    }\n";
        }
    }
    s += "}\n";
    s
}

/// `void gm_mma_stage(const T* sA, const T* sB, float (&acc)[MI][NI][4], int wm0, int wn0,
/// int lane)`: one shared-memory stage (`BK` of k) multiplied into a warp's accumulators
/// (`wm0`, `wn0`: the warp's tile origin within the block tile).
pub fn mma_stage(cfg: &Config) -> String {
    let (mi, ni) = (cfg.mi(), cfg.ni());
    let (pa, pb) = (cfg.a_pitch(), cfg.b_pitch());
    let st = cfg.kind.smem_type();
    let mut s = format!(
        "__device__ __forceinline__ void gm_mma_stage(const {st}* __restrict__ sA, const {st}* __restrict__ sB, float (&acc)[{mi}][{ni}][4], int wm0, int wn0, int lane) {{\n"
    );
    if cfg.kind.sixteen_bit() {
        let mma = if cfg.kind == MmaKind::F16 { "gm_mma_f16" } else { "gm_mma_bf16" };
        let _ = writeln!(s, "    const int j = lane >> 3, r = lane & 7;");
        let _ = writeln!(s, "    #pragma unroll\n    for (int ks = 0; ks < {}; ++ks) {{", cfg.bk / 16);
        let _ = writeln!(s, "        unsigned af[{mi}][4], bf[{ni}][2];");
        let _ = writeln!(s, "        #pragma unroll\n        for (int i = 0; i < {mi}; ++i) {{");
        match cfg.a_major {
            Major::K => {
                let _ = writeln!(s, "            gm_ldsm4(gm_saddr(sA + (wm0 + i * 16 + (j & 1) * 8 + r) * {pa} + ks * 16 + (j >> 1) * 8), af[i]);");
            }
            Major::MN => {
                let _ = writeln!(s, "            gm_ldsm4t(gm_saddr(sA + (ks * 16 + (j >> 1) * 8 + r) * {pa} + wm0 + i * 16 + (j & 1) * 8), af[i]);");
            }
        }
        s += "        }\n";
        let _ = writeln!(s, "        #pragma unroll\n        for (int q = 0; q < {}; ++q) {{\n            unsigned t[4];", ni / 2);
        match cfg.b_major {
            Major::K => {
                let _ = writeln!(s, "            gm_ldsm4(gm_saddr(sB + (wn0 + q * 16 + (j >> 1) * 8 + r) * {pb} + ks * 16 + (j & 1) * 8), t);");
            }
            Major::MN => {
                let _ = writeln!(s, "            gm_ldsm4t(gm_saddr(sB + (ks * 16 + (j & 1) * 8 + r) * {pb} + wn0 + q * 16 + (j >> 1) * 8), t);");
            }
        }
        s += "            bf[2 * q][0] = t[0]; bf[2 * q][1] = t[1]; bf[2 * q + 1][0] = t[2]; bf[2 * q + 1][1] = t[3];\n        }\n";
        let _ = writeln!(s, "        #pragma unroll\n        for (int i = 0; i < {mi}; ++i)\n            #pragma unroll\n            for (int n = 0; n < {ni}; ++n) {mma}(acc[i][n], af[i], bf[n]);");
        s += "    }\n";
    } else {
        let _ = writeln!(s, "    const int g = lane >> 2, t = lane & 3;");
        let _ = writeln!(s, "    #pragma unroll\n    for (int ks = 0; ks < {}; ++ks) {{", cfg.bk / 8);
        let _ = writeln!(s, "        const int k = ks * 8 + t;\n        float af[{mi}][4], bf[{ni}][2];");
        let _ = writeln!(s, "        #pragma unroll\n        for (int i = 0; i < {mi}; ++i) {{\n            const int m = wm0 + i * 16 + g;");
        match cfg.a_major {
            Major::K => {
                let _ = writeln!(
                    s,
                    "            af[i][0] = sA[m * {pa} + k]; af[i][1] = sA[(m + 8) * {pa} + k]; af[i][2] = sA[m * {pa} + k + 4]; af[i][3] = sA[(m + 8) * {pa} + k + 4];"
                );
            }
            Major::MN => {
                let _ = writeln!(
                    s,
                    "            af[i][0] = sA[k * {pa} + m]; af[i][1] = sA[k * {pa} + m + 8]; af[i][2] = sA[(k + 4) * {pa} + m]; af[i][3] = sA[(k + 4) * {pa} + m + 8];"
                );
            }
        }
        s += "        }\n";
        let _ = writeln!(s, "        #pragma unroll\n        for (int n = 0; n < {ni}; ++n) {{\n            const int c = wn0 + n * 8 + g;");
        match cfg.b_major {
            Major::K => {
                let _ = writeln!(s, "            bf[n][0] = sB[c * {pb} + k]; bf[n][1] = sB[c * {pb} + k + 4];");
            }
            Major::MN => {
                let _ = writeln!(s, "            bf[n][0] = sB[k * {pb} + c]; bf[n][1] = sB[(k + 4) * {pb} + c];");
            }
        }
        s += "        }\n";
        if cfg.kind == MmaKind::Tf32 {
            let _ = writeln!(s, "        unsigned ah[{mi}][4], bh[{ni}][2];");
            let _ = writeln!(
                s,
                "        #pragma unroll\n        for (int i = 0; i < {mi}; ++i)\n            #pragma unroll\n            for (int e = 0; e < 4; ++e) ah[i][e] = gm_tf32(af[i][e]);"
            );
            let _ = writeln!(
                s,
                "        #pragma unroll\n        for (int n = 0; n < {ni}; ++n)\n            #pragma unroll\n            for (int e = 0; e < 2; ++e) bh[n][e] = gm_tf32(bf[n][e]);"
            );
            let _ = writeln!(s, "        #pragma unroll\n        for (int i = 0; i < {mi}; ++i)\n            #pragma unroll\n            for (int n = 0; n < {ni}; ++n) gm_mma_tf32(acc[i][n], ah[i], bh[n]);");
        } else {
            // x = hi + lo with hi = tf32(x), lo = tf32(x - hi): a*b ~ alo*bhi + ahi*blo + ahi*bhi
            // (the small products first).
            let _ = writeln!(s, "        unsigned ah[{mi}][4], al[{mi}][4], bh[{ni}][2], bl[{ni}][2];");
            let _ = writeln!(
                s,
                "        #pragma unroll\n        for (int i = 0; i < {mi}; ++i)\n            #pragma unroll\n            for (int e = 0; e < 4; ++e) {{ ah[i][e] = gm_tf32(af[i][e]); al[i][e] = gm_tf32(af[i][e] - __uint_as_float(ah[i][e])); }}"
            );
            let _ = writeln!(
                s,
                "        #pragma unroll\n        for (int n = 0; n < {ni}; ++n)\n            #pragma unroll\n            for (int e = 0; e < 2; ++e) {{ bh[n][e] = gm_tf32(bf[n][e]); bl[n][e] = gm_tf32(bf[n][e] - __uint_as_float(bh[n][e])); }}"
            );
            let _ = writeln!(
                s,
                "        #pragma unroll\n        for (int i = 0; i < {mi}; ++i)\n            #pragma unroll\n            for (int n = 0; n < {ni}; ++n) {{ gm_mma_tf32(acc[i][n], al[i], bh[n]); gm_mma_tf32(acc[i][n], ah[i], bl[n]); gm_mma_tf32(acc[i][n], ah[i], bh[n]); }}"
            );
        }
        s += "    }\n";
    }
    s += "}\n";
    s
}

/// C type helpers: `gm_st(char* base, long long off, float v)` stores one element of C's type
/// (rounded to nearest even; fp8 saturates to finite as the CPU engine does), `gm_st2` two
/// neighbours at `off` (aligned to two elements).
pub fn store_helpers(dt: DataType) -> String {
    let (one, two) = match dt {
        DataType::F16 => ("((__half*)p)[o] = __float2half_rn(v);", "*(__half2*)((__half*)p + o) = __floats2half2_rn(v0, v1);"),
        DataType::Bf16 => ("((__nv_bfloat16*)p)[o] = __float2bfloat16_rn(v);", "*(__nv_bfloat162*)((__nv_bfloat16*)p + o) = __floats2bfloat162_rn(v0, v1);"),
        DataType::Fp8E4m3 => (
            "((__nv_fp8_storage_t*)p)[o] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);",
            "*(unsigned short*)((__nv_fp8_storage_t*)p + o) = (unsigned short)((unsigned)__nv_cvt_float_to_fp8(v0, __NV_SATFINITE, __NV_E4M3) | ((unsigned)__nv_cvt_float_to_fp8(v1, __NV_SATFINITE, __NV_E4M3) << 8));",
        ),
        DataType::Fp8E5m2 => (
            "((__nv_fp8_storage_t*)p)[o] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2);",
            "*(unsigned short*)((__nv_fp8_storage_t*)p + o) = (unsigned short)((unsigned)__nv_cvt_float_to_fp8(v0, __NV_SATFINITE, __NV_E5M2) | ((unsigned)__nv_cvt_float_to_fp8(v1, __NV_SATFINITE, __NV_E5M2) << 8));",
        ),
        _ => ("((float*)p)[o] = v;", "*(float2*)((float*)p + o) = make_float2(v0, v1);"),
    };
    format!(
        "__device__ __forceinline__ void gm_st(char* __restrict__ p, long long o, float v) {{ {one} }}\n__device__ __forceinline__ void gm_st2(char* __restrict__ p, long long o, float v0, float v1) {{ {two} }}\n"
    )
}

/// Code (inside a kernel, after the main loop) storing a warp's accumulators `acc`: through
/// the epilogue into C (`gc`: C's pointer at this batch), or, for a split, raw into the f32
/// partial tile at `gw` (`[m][n]` packed). Expects `m0`, `n0`, `wm0`, `wn0`, `lane`, `bz` in
/// scope.
pub fn epilogue_store(cfg: &Config, p: &GemmProblem, epi: &Epilogue, split: bool) -> String {
    let (mi, ni) = (cfg.mi(), cfg.ni());
    let (m, n) = (p.m, p.n);
    let mut s = String::new();
    s += "    {\n    const int g = lane >> 2, t4 = lane & 3;\n";
    let _ = writeln!(
        s,
        "    #pragma unroll\n    for (int i = 0; i < {mi}; ++i)\n    #pragma unroll\n    for (int j = 0; j < {ni}; ++j)\n    #pragma unroll\n    for (int h = 0; h < 2; ++h) {{"
    );
    s += "        const long long row = m0 + wm0 + i * 16 + g + h * 8;\n        const long long col = n0 + wn0 + j * 8 + t4 * 2;\n";
    let _ = writeln!(s, "        if (row >= {m}LL || col >= {n}LL) continue;");
    s += "        const float a0 = acc[i][j][2 * h], a1 = acc[i][j][2 * h + 1];\n";
    if split {
        let _ = writeln!(s, "        float* w = gw + row * {n}LL + col;");
        if n % 2 == 0 {
            s += "        *(float2*)w = make_float2(a0, a1);\n";
        } else {
            let _ = writeln!(s, "        w[0] = a0;\n        if (col + 1 < {n}LL) w[1] = a1;");
        }
    } else {
        let (rs, cs) = (p.c.row_stride, p.c.col_stride);
        let names = &epi.names;
        let _ = writeln!(s, "        const long long off = row * {rs}LL + col * {cs}LL;");
        let _ = writeln!(s, "        const float v0 = epilogue(a0, bz, row, col{names});");
        let _ = writeln!(s, "        if (col + 1 < {n}LL) {{\n            const float v1 = epilogue(a1, bz, row, col + 1{names});");
        if cfg.pair_store {
            s += "            gm_st2(gc, off, v0, v1);\n";
        } else {
            let _ = writeln!(s, "            gm_st(gc, off, v0);\n            gm_st(gc, off + {cs}LL, v1);");
        }
        s += "        } else {\n            gm_st(gc, off, v0);\n        }\n";
    }
    s += "    }\n    }\n";
    s
}

/// The loaders of A and B for a configuration.
fn loaders(cfg: &Config, p: &GemmProblem) -> (TileLoad, TileLoad) {
    let threads = cfg.threads();
    let a = match cfg.a_major {
        Major::K => TileLoad {
            name: "gm_load_a".into(),
            gtype: p.a.dtype,
            kind: cfg.kind,
            rows: cfg.bm,
            cols: cfg.bk,
            pitch: cfg.a_pitch(),
            row_stride: p.a.row_stride,
            col_stride: p.a.col_stride,
            load: cfg.a_load,
            threads,
        },
        Major::MN => TileLoad {
            name: "gm_load_a".into(),
            gtype: p.a.dtype,
            kind: cfg.kind,
            rows: cfg.bk,
            cols: cfg.bm,
            pitch: cfg.a_pitch(),
            row_stride: p.a.col_stride,
            col_stride: p.a.row_stride,
            load: cfg.a_load,
            threads,
        },
    };
    let b = match cfg.b_major {
        Major::K => TileLoad {
            name: "gm_load_b".into(),
            gtype: p.b.dtype,
            kind: cfg.kind,
            rows: cfg.bn,
            cols: cfg.bk,
            pitch: cfg.b_pitch(),
            row_stride: p.b.col_stride,
            col_stride: p.b.row_stride,
            load: cfg.b_load,
            threads,
        },
        Major::MN => TileLoad {
            name: "gm_load_b".into(),
            gtype: p.b.dtype,
            kind: cfg.kind,
            rows: cfg.bk,
            cols: cfg.bn,
            pitch: cfg.b_pitch(),
            row_stride: p.b.row_stride,
            col_stride: p.b.col_stride,
            load: cfg.b_load,
            threads,
        },
    };
    (a, b)
}

/// The main kernel: tiles of C (or of a split's partial sums) for every batch.
pub fn main_kernel(cfg: &Config, p: &GemmProblem, epi: &Epilogue, entry: &str) -> String {
    let split = cfg.splits > 1;
    let (la, lb) = loaders(cfg, p);
    let (mi, ni) = (cfg.mi(), cfg.ni());
    let threads = cfg.threads();
    let st = cfg.kind.smem_type();
    let (tm, tn) = (ceil(p.m, cfg.bm), ceil(p.n, cfg.bn));
    let tiles = tm * tn;
    let kt = ceil(p.k, cfg.bk);
    let (wm, wn) = (cfg.bm / cfg.warps_m, cfg.bn / cfg.warps_n);
    let (esa, esb, esc) = (p.a.dtype.size(), p.b.dtype.size(), p.c.dtype.size());
    let (a, b) = (&p.a, &p.b);
    let mut s = String::new();
    s += common();
    if !split {
        s += &epi.code;
        s += &store_helpers(p.c.dtype);
    }
    s += &tile_loader(&la);
    s += &tile_loader(&lb);
    s += &mma_stage(cfg);
    // Valid rows/cols of each loader's tile at k tile `kt` (absolute).
    let (a_rows, a_cols) = match cfg.a_major {
        Major::K => ("m_left", "k_left"),
        Major::MN => ("k_left", "m_left"),
    };
    let (b_rows, b_cols) = match cfg.b_major {
        Major::K => ("n_left", "k_left"),
        Major::MN => ("k_left", "n_left"),
    };
    let (sa_elems, sb_elems) = (cfg.a_stage_elems(), cfg.b_stage_elems());
    let _ = writeln!(
        s,
        r#"
// One k tile (`t`, relative to the split's first) of A and B into stage `stage`.
__device__ __forceinline__ void gm_load_stage({st}* sa, {st}* sb, const char* ga, const char* gb, int stage, int t, int kt0, long long m_left, long long n_left, int tid) {{
    const long long k_left = {k}LL - (long long)(kt0 + t) * {bk};
    gm_load_a(sa + stage * {sa_elems}, ga + (long long)t * {a_step}LL, {a_rows}, {a_cols}, tid);
    gm_load_b(sb + stage * {sb_elems}, gb + (long long)t * {b_step}LL, {b_rows}, {b_cols}, tid);
}}
"#,
        k = p.k,
        bk = cfg.bk,
        a_step = cfg.bk as i64 * a.col_stride * esa as i64,
        b_step = cfg.bk as i64 * b.row_stride * esb as i64,
    );
    let params = if split { "float* __restrict__ gm_ws".to_string() } else { format!("void* __restrict__ gm_c{}", epi.params) };
    // Two blocks per SM for the 16-bit 8-warp tile (at most 128 registers a thread).
    let min_blocks = if threads == 256 && cfg.kind.sixteen_bit() { 2 } else { 1 };
    let _ =
        writeln!(s, "extern \"C\" __global__ void __launch_bounds__({threads}, {min_blocks}) {entry}(const void* __restrict__ gm_a, const void* __restrict__ gm_b, {params}) {{");
    let _ = writeln!(
        s,
        r#"    extern __shared__ __align__(16) unsigned char gm_shared[];
    {st}* const sa = ({st}*)gm_shared;
    {st}* const sb = ({st}*)(gm_shared + {sb_off});
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm0 = (warp / {wn_count}) * {wm}, wn0 = (warp % {wn_count}) * {wn};
    long long pid = blockIdx.x;
    const int tile = (int)(pid % {tiles});
    pid /= {tiles};
    const int split = (int)(pid % {splits});
    const long long bz = pid / {splits};
    // Grouped tile order: {group} tile rows walk the columns together (B tiles stay in L2).
    const int group = tile / ({group} * {tn});
    const int first_m = group * {group};
    const int gsize = min({tm} - first_m, {group});
    const int tm_ = first_m + (tile % ({group} * {tn})) % gsize;
    const int tn_ = (tile % ({group} * {tn})) / gsize;
    const long long m0 = (long long)tm_ * {bm}, n0 = (long long)tn_ * {bn};
    const int kt0 = split * {kt_per};
    const int nkt = min({kt} - kt0, {kt_per});
    const char* ga = (const char*)gm_a + (bz * {bsa}LL + m0 * {rsa}LL + (long long)kt0 * {bk} * {csa}LL) * {esa};
    const char* gb = (const char*)gm_b + (bz * {bsb}LL + n0 * {csb}LL + (long long)kt0 * {bk} * {rsb}LL) * {esb};
    const long long m_left = {m}LL - m0, n_left = {n}LL - n0;
    float acc[{mi}][{ni}][4];
    #pragma unroll
    for (int i = 0; i < {mi}; ++i)
        #pragma unroll
        for (int j = 0; j < {ni}; ++j)
            #pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    #pragma unroll
    for (int st = 0; st < {pre}; ++st) {{
        if (st < nkt) gm_load_stage(sa, sb, ga, gb, st, st, kt0, m_left, n_left, tid);
        gm_commit();
    }}
    for (int t = 0; t < nkt; ++t) {{
        gm_wait<{wait}>();
        __syncthreads();
        const int nx = t + {pre};
        if (nx < nkt) gm_load_stage(sa, sb, ga, gb, nx % {stages}, nx, kt0, m_left, n_left, tid);
        gm_commit();
        gm_mma_stage(sa + (t % {stages}) * {sa_elems}, sb + (t % {stages}) * {sb_elems}, acc, wm0, wn0, lane);
    }}
    gm_wait<0>();"#,
        sb_off = cfg.stages * sa_elems * cfg.kind.esize(),
        wn_count = cfg.warps_n,
        splits = cfg.splits,
        group = GROUP_M,
        bm = cfg.bm,
        bn = cfg.bn,
        bk = cfg.bk,
        kt_per = cfg.kt_per,
        bsa = a.batch_stride,
        rsa = a.row_stride,
        csa = a.col_stride,
        bsb = b.batch_stride,
        rsb = b.row_stride,
        csb = b.col_stride,
        m = p.m,
        n = p.n,
        pre = cfg.stages - 1,
        wait = cfg.stages.saturating_sub(2),
        stages = cfg.stages,
    );
    if split {
        let _ = writeln!(s, "    float* gw = gm_ws + ((long long)split * {} + bz) * {}LL;", p.batch, p.m as u64 * p.n as u64);
    } else {
        let _ = writeln!(s, "    char* gc = (char*)gm_c + bz * {}LL * {esc};\n    (void)split;", p.c.batch_stride);
    }
    s += &epilogue_store(cfg, p, epi, split);
    s += "}\n";
    s
}

/// The second launch of a split: sums the partials of every element in split order, applies
/// the epilogue, stores C.
pub fn reduce_kernel(cfg: &Config, p: &GemmProblem, epi: &Epilogue, entry: &str) -> String {
    let total = p.batch as u64 * p.m as u64 * p.n as u64;
    let mut s = String::new();
    s += &epi.code;
    s += &store_helpers(p.c.dtype);
    let _ = writeln!(
        s,
        r#"extern "C" __global__ void {entry}(const float* __restrict__ gm_ws, void* __restrict__ gm_c{params}) {{
    GRID_STRIDE(e, {total}LL) {{
        const long long col = e % {n}LL;
        const long long q = e / {n}LL;
        const long long row = q % {m}LL;
        const long long bz = q / {m}LL;
        float sum = 0.0f;
        #pragma unroll 4
        for (int sp = 0; sp < {splits}; ++sp) sum += gm_ws[(long long)sp * {total}LL + e];
        gm_st((char*)gm_c, bz * {bsc}LL + row * {rsc}LL + col * {csc}LL, epilogue(sum, bz, row, col{names}));
    }}
}}"#,
        params = epi.params,
        names = epi.names,
        n = p.n,
        m = p.m,
        splits = cfg.splits,
        bsc = p.c.batch_stride,
        rsc = p.c.row_stride,
        csc = p.c.col_stride,
    );
    s
}

/// The launches of a configuration (`tag` keeps entry names apart).
pub fn kernels(cfg: &Config, p: &GemmProblem, epi: &Epilogue, node: usize, tag: &str) -> NodeKernels {
    let tiles = ceil(p.m, cfg.bm) * ceil(p.n, cfg.bn);
    let grid = (tiles * cfg.splits * p.batch) as u64;
    let entry = entry_name(node, &format!("gemm{tag}"));
    let main = main_kernel(cfg, p, epi, &entry);
    let mut args = vec![Arg::Ptr(p.a.tensor), Arg::Ptr(p.b.tensor)];
    let mut launches = Vec::new();
    let mut scratch = Vec::new();
    if cfg.splits > 1 {
        args.push(Arg::Scratch(0));
        scratch.push(cfg.splits * p.batch * p.m * p.n * 4);
    } else {
        args.push(Arg::Ptr(p.c.tensor));
        args.extend(epi.args.iter().cloned());
    }
    let threads = cfg.threads() as u32;
    let grid32 = grid.min(u32::MAX as u64) as u32;
    launches.push(Launch {
        source: main,
        entry,
        grid: Grid::Exact(grid32, 1, 1),
        block: threads,
        shared_bytes: cfg.shared_bytes() as u32,
        args,
        cluster: None,
        pdl: Pdl::Dependent,
    });
    if cfg.splits > 1 {
        let entry = entry_name(node, &format!("gemm{tag}_reduce"));
        let src = reduce_kernel(cfg, p, epi, &entry);
        let mut args = vec![Arg::Scratch(0), Arg::Ptr(p.c.tensor)];
        args.extend(epi.args.iter().cloned());
        let total = p.batch as u64 * p.m as u64 * p.n as u64;
        launches.push(Launch::elementwise(src, &entry, total.max(1), args));
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
    if cfg.a_load == Load::Async16 {
        tensors.push(p.a.tensor);
    }
    if cfg.b_load == Load::Async16 && !tensors.contains(&p.b.tensor) {
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
        Operand { tensor: TensorId(t), dtype: dt, rows, cols, row_stride: rs, col_stride: cs, batch_stride: bs }
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
            allow_tf32: false,
            fast_fp8: false,
        }
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
