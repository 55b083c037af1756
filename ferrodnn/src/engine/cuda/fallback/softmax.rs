//! Softmax, log-softmax (with the optional log-sum-exp `stats`) and their backward, in double.
//!
//! A tensor normalized over `axis` is a set of rows: row `r` runs the row-major order of the
//! other dims (as the CPU's `outer * inner` rows), and its elements are `len` apart by the
//! axis's stride. Short rows: one thread per row, serial passes in the CPU's order. Long rows:
//! one block per row (block-strided over rows), each pass a strided loop plus a shared-memory
//! tree (maximum, then sum).

use super::{Ctx, Grid, Launch, NodeKernels};
use crate::engine::cuda::kernel::{Signature, Source};
use crate::error::Result;
use crate::graph::ops::softmax::SoftmaxAttrs;
use crate::graph::TensorId;

/// Rows longer than this get a block each.
const SHORT_ROW: i64 = 64;

/// The block size for rows of `len` (a power of two).
fn block_for(len: i64) -> u32 {
    if len <= 512 {
        128
    } else {
        256
    }
}

/// The kernel of `sig` over rows of `len` along `axis` (`configure` adds the direction's
/// defines): a thread per row (grid-stride) for short rows, else a block per row.
fn launch(entry: &str, sig: Signature, axis: usize, log: bool, rows: u64, len: i64, configure: impl FnOnce(Source) -> Source) -> Launch {
    let short = len <= SHORT_ROW;
    let source = configure(Source::new().entry(entry, &sig).define("SM_AXIS", axis).flag("SM_LOG", log).flag("SM_BLOCK_PER_ROW", !short));
    let source = source.template(include_str!("softmax.cuh")).build();
    if short {
        Launch::elementwise(source, entry, rows, sig.into_args())
    } else {
        Launch::new(source, entry, Grid::Exact(rows.clamp(1, 1 << 20) as u32, 1, 1), block_for(len), sig.into_args())
    }
}

fn axis_len(ctx: &Ctx, t: TensorId, axis: usize) -> Result<i64> {
    let d = ctx.dims(t);
    if axis >= d.len() || d.len() > 8 {
        return Err(ctx.err(format!("axis {axis} is out of range for rank {}", d.len())));
    }
    Ok(d[axis])
}

pub(super) fn softmax(ctx: &Ctx, a: &SoftmaxAttrs) -> Result<NodeKernels> {
    let x = ctx.input("x")?;
    let y = ctx.output("y")?;
    let stats = ctx.node.output("stats");
    let len = axis_len(ctx, x, a.axis)?;
    let rows = if len > 0 { ctx.numel(x) / len as u64 } else { 0 };
    let mut sig = Signature::new();
    sig.tensor("y", y, true).tensor("x", x, false);
    if let Some(s) = stats {
        sig.tensor("st", s, true);
    }
    let launch = launch(&ctx.entry("softmax"), sig, a.axis, a.log, rows, len, |src| {
        let src = src.flag("SM_BACKWARD", false).define("LD_X", ctx.ld(x)).define("ST_Y", ctx.st(y)).flag("SM_STATS", stats.is_some());
        match stats {
            Some(s) => src.define("ST_STATS", ctx.st(s)),
            None => src,
        }
    });
    Ok(NodeKernels::one(launch))
}

pub(super) fn softmax_backward(ctx: &Ctx, a: &SoftmaxAttrs) -> Result<NodeKernels> {
    let y = ctx.input("y")?;
    let dy = ctx.input("dy")?;
    let dx = ctx.output("dx")?;
    let len = axis_len(ctx, y, a.axis)?;
    let rows = if len > 0 { ctx.numel(y) / len as u64 } else { 0 };
    let mut sig = Signature::new();
    sig.tensor("dx", dx, true).tensor("y", y, false).tensor("dy", dy, false);
    let launch = launch(&ctx.entry("softmax_bwd"), sig, a.axis, a.log, rows, len, |src| {
        src.flag("SM_BACKWARD", true).define("LD_Y", ctx.ld(y)).define("LD_DY", ctx.ld(dy)).define("ST_DX", ctx.st(dx))
    });
    Ok(NodeKernels::one(launch))
}
