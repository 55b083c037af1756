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
//!
//! The device code is `reduction.cuh`, the mode chosen by a define.

use super::{Arg, Ctx, Grid, Launch, NodeKernels};
use crate::engine::cuda::kernel::{Signature, Source};
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

/// The RED_MODE of a mode (reduction.cuh).
fn mode_name(mode: ReductionMode) -> &'static str {
    use ReductionMode::*;
    match mode {
        Add => "RED_ADD",
        Avg => "RED_AVG",
        Norm1 => "RED_NORM1",
        Norm2 => "RED_NORM2",
        Mul => "RED_MUL",
        MulNoZeros => "RED_MUL_NO_ZEROS",
        Min => "RED_MIN",
        Max => "RED_MAX",
        Amax => "RED_AMAX",
    }
}

/// Axes as an X-macro list: ` X(0) X(2)`.
fn axis_list<'a>(axes: impl Iterator<Item = &'a usize>) -> String {
    axes.map(|a| format!(" X({a})")).collect()
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
    let mut axes = a.axes.clone();
    axes.sort_unstable();
    // The text of kernel `kernel` (RED_SERIAL, RED_PART, RED_FINISH) of reduction.cuh.
    let source = |entry: &str, sig: &Signature, kernel: &str| {
        Source::new()
            .entry(entry, sig)
            .define("RED_KERNEL", kernel)
            .define("RED_MODE", mode_name(a.mode))
            .define("RED_AXES(X)", axis_list(axes.iter()))
            .define("RED_AXES_REVERSED(X)", axis_list(axes.iter().rev()))
            .define("RED_BLOCK", BLOCK)
            .define("LD_X", ctx.ld(x))
            .define("ST_Y", ctx.st(y))
            .template(include_str!("reduction.cuh"))
            .build()
    };

    if group < BIG_GROUP || outputs >= FEW_OUTPUTS || outputs == 0 {
        let entry = ctx.entry("reduce");
        let mut sig = Signature::new();
        sig.tensor("y", y, true).tensor("x", x, false);
        let source = source(&entry, &sig, "RED_SERIAL");
        return Ok(NodeKernels::one(Launch::elementwise(source, &entry, outputs, sig.into_args())));
    }

    // Block path: `chunks` partials per output in scratch 0, then a fold of each output's partials.
    let chunks = TARGET_BLOCKS.div_ceil(outputs).min((group / MIN_CHUNK).max(1)).max(1);
    let blocks = outputs * chunks;
    let part_entry = ctx.entry("reduce_part");
    let mut part_sig = Signature::new();
    part_sig.scratch("double", "part", 0, true).tensor("x", x, false).param("TRef ty", Arg::Ref(y)).i64("chunks", chunks as i64);
    let part_source = source(&part_entry, &part_sig, "RED_PART");
    let fin_entry = ctx.entry("reduce_fin");
    let mut fin_sig = Signature::new();
    fin_sig.tensor("y", y, true).scratch("double", "part", 0, false).param("TRef tx", Arg::Ref(x)).i64("chunks", chunks as i64);
    let fin_source = source(&fin_entry, &fin_sig, "RED_FINISH");
    let grid = blocks.min(1 << 20) as u32;
    let part = Launch::new(part_source, part_entry, Grid::Exact(grid, 1, 1), BLOCK, part_sig.into_args());
    let fin = Launch::elementwise(fin_source, &fin_entry, outputs, fin_sig.into_args());
    Ok(NodeKernels { launches: vec![part, fin], scratch: vec![(blocks * 8) as usize] })
}
