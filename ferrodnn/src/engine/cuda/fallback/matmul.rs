//! Batched matmul: one thread per element of `c` (grid-stride, in `c`'s memory order so that
//! writes coalesce), `c[b, i, j] = sum_k a[b', i, k] * b[b'', k, j]` summed in double in order
//! of k, as the CPU engine (`engine/cpu/matmul.rs`) does. Batch dims broadcast numpy-style
//! (right-aligned, size-1 dims repeat; stride-0 dims just read the same memory); transposes
//! are strides. Inputs are rounded to the compute type first when it is a float type, as on
//! the CPU (integers are exact in double for the sums the CPU does too). The device code is
//! `matmul.cuh`, after conv's `compute.cuh`.

use super::conv::{compute_round, memory_order, COMPUTE};
use super::{Ctx, Launch, NodeKernels};
use crate::engine::cuda::kernel::{Signature, Source};
use crate::error::Result;
use crate::graph::ops::matmul::MatmulAttrs;

pub(super) fn matmul(ctx: &Ctx, _a: &MatmulAttrs) -> Result<NodeKernels> {
    let (a, b, c) = (ctx.input("a")?, ctx.input("b")?, ctx.output("c")?);
    let (ra, rb, rc) = (ctx.dims(a).len(), ctx.dims(b).len(), ctx.dims(c).len());
    if ra < 2 || rb < 2 || rc < ra.max(rb) || rc > 8 {
        return Err(ctx.err(format!("internal: ranks a {ra}, b {rb}, c {rc} do not fit a matmul")));
    }
    let entry = ctx.entry("matmul");
    let mut sig = Signature::new();
    sig.tensor("c", c, true).tensor("a", a, false).tensor("b", b, false);
    let source = compute_round(Source::new().entry(&entry, &sig), ctx.graph.compute_type(ctx.node))
        .define("MM_RANK", rc)
        .define("MM_ORDER", memory_order(ctx, c))
        .define("LD_A", ctx.ld(a))
        .define("LD_B", ctx.ld(b))
        .define("ST_C", ctx.st(c))
        .template(COMPUTE)
        .template(include_str!("matmul.cuh"))
        .build();
    Ok(NodeKernels::one(Launch::elementwise(source, &entry, ctx.numel(c), sig.into_args())))
}
