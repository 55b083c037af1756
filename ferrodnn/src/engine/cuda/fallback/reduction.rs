//! Reductions over any set of axes, folding in double as the CPU engine does.
//!
//! Each mode is a map (`red_map`, applied to every input element), an associative combine
//! (`red_comb`) with its identity, and a finish (`red_fin`: the mean's division, the 2-norm's
//! square root). Two launch shapes:
//! - many outputs or small groups: one thread per output element folds its group serially, in
//!   the CPU's order (row-major over the reduced axes), so the result is bit for bit the CPU's;
//! - few outputs with large groups: each group is cut into `chunks` pieces, one block per
//!   (output, chunk) folds its piece (threads strided over it, then a shared-memory tree) into a
//!   scratch partial, and a second launch folds each output's partials in order and finishes.
//!   Deterministic; sums differ from the serial order only by double rounding, and integer
//!   sums and products stay exact while they fit in a double's 53 bits.

use super::{Arg, Ctx, Grid, Launch, NodeKernels, Pdl};
use crate::error::Result;
use crate::graph::ops::reduction::{ReductionAttrs, ReductionMode};

/// Groups at least this large with fewer outputs than [`FEW_OUTPUTS`] take the block path.
const BIG_GROUP: u64 = 512;
const FEW_OUTPUTS: u64 = 16384;
/// Threads per block of the block path (a power of two, for the tree).
const BLOCK: u32 = 256;
/// Blocks the block path aims for in all, and the fewest elements a chunk should hold.
const TARGET_BLOCKS: u64 = 1024;
const MIN_CHUNK: u64 = 4096;

/// The map, combine, identity and finish of a mode, as C.
fn mode_helpers(mode: ReductionMode) -> String {
    use ReductionMode::*;
    // NaN propagates through min, max and amax (as in the CPU's fold).
    let (map, comb, ident, fin) = match mode {
        // Rust's float `sum` starts from -0.0; the mean's fold starts from +0.0.
        Add => ("v", "a + b", "-0.0", "s"),
        Avg => ("v", "a + b", "0.0", "s / (double)n"),
        Norm1 => ("fabs(v)", "a + b", "-0.0", "s"),
        Norm2 => ("v * v", "a + b", "-0.0", "sqrt(s)"),
        Mul => ("v", "a * b", "1.0", "s"),
        // Zeros are skipped: multiplying by 1.0 instead is exact. NaN != 0, so NaN is kept.
        MulNoZeros => ("(v != 0.0 ? v : 1.0)", "a * b", "1.0", "s"),
        Min => ("v", "(isnan(a) || isnan(b)) ? (0.0/0.0) : fmin(a, b)", "(1.0/0.0)", "s"),
        Max => ("v", "(isnan(a) || isnan(b)) ? (0.0/0.0) : fmax(a, b)", "(-1.0/0.0)", "s"),
        Amax => ("fabs(v)", "(isnan(a) || isnan(b)) ? (0.0/0.0) : fmax(a, b)", "0.0", "s"),
    };
    format!(
        r#"
#define RED_IDENT ({ident})
__device__ __forceinline__ double red_map(double v) {{ return {map}; }}
__device__ __forceinline__ double red_comb(double a, double b) {{ return {comb}; }}
__device__ __forceinline__ double red_fin(double s, i64 n) {{ (void)n; return {fin}; }}
"#
    )
}

/// `red_count(tx)` (the group size) and `red_off(tx, r)` (the offset of the group's element
/// `r`, row-major over the reduced axes, from the group's first element).
fn group_helpers(axes: &[usize]) -> String {
    let mut sorted = axes.to_vec();
    sorted.sort_unstable();
    let count: String = sorted.iter().map(|a| format!(" n *= tx.dims[{a}];")).collect();
    let off: String = sorted.iter().rev().map(|a| format!("\n    off += (r % tx.dims[{a}]) * tx.strides[{a}]; r /= tx.dims[{a}];")).collect();
    format!(
        r#"
__device__ __forceinline__ i64 red_count(const TRef& tx) {{ i64 n = 1;{count} return n; }}
__device__ __forceinline__ i64 red_off(const TRef& tx, i64 r) {{
    i64 off = 0;{off}
    (void)r; return off;
}}
"#
    )
}

pub(super) fn reduction(ctx: &Ctx, a: &ReductionAttrs) -> Result<NodeKernels> {
    let x = ctx.input("x")?;
    let y = ctx.output("y")?;
    let xd = ctx.dims(x);
    if ctx.dims(y).len() != xd.len() || xd.len() > 8 {
        return Err(ctx.err("output `y` must have the rank of input `x` (at most 8)"));
    }
    if let Some(&bad) = a.axes.iter().find(|&&axis| axis >= xd.len()) {
        return Err(ctx.err(format!("axis {bad} is out of range for rank {}", xd.len())));
    }
    let group: u64 = a.axes.iter().map(|&axis| xd[axis].max(0) as u64).product();
    let outputs = ctx.numel(y);
    let helpers = format!("{}{}", mode_helpers(a.mode), group_helpers(&a.axes));
    let (ldx, sty) = (ctx.ld(x), ctx.st(y));

    if group < BIG_GROUP || outputs >= FEW_OUTPUTS || outputs == 0 {
        let entry = ctx.entry("reduce");
        let source = format!(
            r#"{helpers}
extern "C" __global__ void {entry}(void* y, TRef ty, const void* x, TRef tx) {{
    i64 n = numel(ty);
    i64 g = red_count(tx);
    GRID_STRIDE(i, n) {{
        i64 idx[8];
        unravel(ty, i, idx);
        // The output index is also that of the group's first input element (reduced axes are 0).
        i64 base = offset_at(tx, idx);
        double acc = RED_IDENT;
        for (i64 r = 0; r < g; ++r) acc = red_comb(acc, red_map({ldx}(x, base + red_off(tx, r))));
        {sty}(y, offset_at(ty, idx), red_fin(acc, g));
    }}
}}
"#
        );
        return Ok(NodeKernels::one(Launch::elementwise(source, &entry, outputs, vec![Arg::Ptr(y), Arg::Ref(y), Arg::Ptr(x), Arg::Ref(x)])));
    }

    // Block path: `chunks` partials per output in scratch 0, then a fold of each output's partials.
    let chunks = TARGET_BLOCKS.div_ceil(outputs).min((group / MIN_CHUNK).max(1)).max(1);
    let blocks = outputs * chunks;
    let part_entry = ctx.entry("reduce_part");
    let part_source = format!(
        r#"{helpers}
extern "C" __global__ void {part_entry}(double* part, const void* x, TRef tx, TRef ty, i64 chunks) {{
    __shared__ double sh[{BLOCK}];
    i64 n = numel(ty);
    i64 g = red_count(tx);
    i64 per = (g + chunks - 1) / chunks;
    int t = threadIdx.x;
    for (i64 b = blockIdx.x; b < n * chunks; b += gridDim.x) {{
        i64 o = b / chunks, c = b % chunks;
        i64 idx[8];
        unravel(ty, o, idx);
        i64 base = offset_at(tx, idx);
        i64 lo = c * per;
        i64 hi = lo + per < g ? lo + per : g;
        double acc = RED_IDENT;
        for (i64 r = lo + t; r < hi; r += blockDim.x) acc = red_comb(acc, red_map({ldx}(x, base + red_off(tx, r))));
        sh[t] = acc;
        __syncthreads();
        for (int w = blockDim.x / 2; w > 0; w >>= 1) {{
            if (t < w) sh[t] = red_comb(sh[t], sh[t + w]);
            __syncthreads();
        }}
        if (t == 0) part[b] = sh[0];
        __syncthreads();
    }}
}}
"#
    );
    let fin_entry = ctx.entry("reduce_fin");
    let fin_source = format!(
        r#"{helpers}
extern "C" __global__ void {fin_entry}(void* y, TRef ty, const double* part, TRef tx, i64 chunks) {{
    i64 n = numel(ty);
    i64 g = red_count(tx);
    GRID_STRIDE(i, n) {{
        double acc = RED_IDENT;
        for (i64 c = 0; c < chunks; ++c) acc = red_comb(acc, part[i * chunks + c]);
        i64 idx[8];
        unravel(ty, i, idx);
        {sty}(y, offset_at(ty, idx), red_fin(acc, g));
    }}
}}
"#
    );
    let grid = blocks.min(1 << 20) as u32;
    let part = Launch {
        source: part_source,
        entry: part_entry,
        grid: Grid::Exact(grid, 1, 1),
        block: BLOCK,
        shared_bytes: 0,
        args: vec![Arg::Scratch(0), Arg::Ptr(x), Arg::Ref(x), Arg::Ref(y), Arg::I64(chunks as i64)],
        cluster: None,
        pdl: Pdl::Dependent,
    };
    let fin = Launch::elementwise(fin_source, &fin_entry, outputs, vec![Arg::Ptr(y), Arg::Ref(y), Arg::Scratch(0), Arg::Ref(x), Arg::I64(chunks as i64)]);
    Ok(NodeKernels { launches: vec![part, fin], scratch: vec![(blocks * 8) as usize] })
}
