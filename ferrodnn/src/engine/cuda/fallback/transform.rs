//! Tensor transforms: one thread per output element (grid-stride), each computing where its
//! source element lives and copying it with the input's `ld_` and the output's `st_` (which
//! is the cast, rounding and saturating as the CPU engine does). Threads walk the output in
//! its memory order (outermost stride first), so consecutive threads write consecutive
//! addresses of a packed output whatever its layout. The device code is `transform.cuh`.

use super::{Ctx, Launch, NodeKernels};
use crate::engine::cuda::kernel::{Signature, Source};
use crate::error::Result;
use crate::graph::ops::transform::*;
use crate::graph::stride_order;
use crate::graph::TensorId;

/// Most inputs one concatenate launch takes: 16 x (pointer + TRef) keeps the kernel's
/// parameters under the 4 KiB every driver accepts; more inputs take more launches.
const CONCAT_GROUP: usize = 16;

/// A kernel `y[idx] = x[<x offset>]` over y's elements, `x_offset` a C expression of `idx`,
/// `tx` and `ty`. Threads walk y in its memory order (outermost stride first).
fn gather_kernel(ctx: &Ctx, what: &str, x: TensorId, y: TensorId, x_offset: &str) -> NodeKernels {
    let entry = ctx.entry(what);
    let mut sig = Signature::new();
    sig.tensor("y", y, true).tensor("x", x, false);
    let order = stride_order(&ctx.graph.desc(y).strides);
    let identity = order.iter().enumerate().all(|(i, &a)| i == a);
    let source = Source::new().entry(&entry, &sig).define("TR_KERNEL", "TR_GATHER").flag("TR_MEMORY_ORDER", !identity);
    let source = if identity { source } else { source.define("TR_AXES_INNER_FIRST(X)", order.iter().rev().map(|a| format!(" X({a})")).collect::<String>()) };
    let source = source.define("TR_X_OFFSET", x_offset).define("LD_X", ctx.ld(x)).define("ST_Y", ctx.st(y)).template(include_str!("transform.cuh")).build();
    NodeKernels::one(Launch::elementwise(source, &entry, ctx.numel(y), sig.into_args()))
}

/// Same element count, read in logical row-major order: the output element at multi-index
/// `idx` is x's element at the same row-major flat index.
pub(super) fn reshape(ctx: &Ctx, _a: &ReshapeAttrs) -> Result<NodeKernels> {
    let x = ctx.input("x")?;
    let y = ctx.output("y")?;
    if ctx.numel(x) != ctx.numel(y) {
        return Err(ctx.err(format!("internal: reshape of {} elements to {} elements", ctx.numel(x), ctx.numel(y))));
    }
    // The row-major flat index of idx in y's dims.
    let rank = ctx.dims(y).len();
    let mut flat = String::from("0");
    for a in 0..rank {
        flat = format!("({flat}) * ty.dims[{a}] + idx[{a}]");
    }
    Ok(gather_kernel(ctx, "reshape", x, y, &format!("offset_of(tx, {flat})")))
}

/// `y[i_0, ..., i_{r-1}] = x[j]` with `j[perm[k]] = i_k`.
pub(super) fn transpose(ctx: &Ctx, a: &TransposeAttrs) -> Result<NodeKernels> {
    let x = ctx.input("x")?;
    let y = ctx.output("y")?;
    let (xd, yd) = (ctx.dims(x), ctx.dims(y));
    let perm = &a.permutation;
    let ok = perm.len() == xd.len() && yd.len() == xd.len() && perm.iter().enumerate().all(|(i, &p)| p < xd.len() && xd[p] == yd[i]);
    if !ok {
        return Err(ctx.err(format!("internal: permutation {perm:?} does not map x dims {xd:?} to y dims {yd:?}")));
    }
    let terms: Vec<String> = perm.iter().enumerate().map(|(k, &p)| format!("idx[{k}] * tx.strides[{p}]")).collect();
    let off = if terms.is_empty() { "0".to_string() } else { terms.join(" + ") };
    Ok(gather_kernel(ctx, "transpose", x, y, &off))
}

/// `y[i] = x[start + step * i]` on every axis.
pub(super) fn slice(ctx: &Ctx, a: &SliceAttrs) -> Result<NodeKernels> {
    let x = ctx.input("x")?;
    let y = ctx.output("y")?;
    let (xd, yd) = (ctx.dims(x), ctx.dims(y));
    let rank = xd.len();
    let starts: Vec<i64> = a.starts.iter().map(|&s| s.max(0)).collect();
    let steps: Vec<i64> = (0..rank).map(|i| a.steps.get(i).copied().unwrap_or(1).max(1)).collect();
    let ok = starts.len() == rank && yd.len() == rank && (0..rank).all(|i| yd[i] >= 1 && starts[i] + (yd[i] - 1) * steps[i] < xd[i]);
    if !ok {
        return Err(ctx.err(format!("internal: slice {a:?} of x dims {xd:?} does not give y dims {yd:?}")));
    }
    let terms: Vec<String> = (0..rank).map(|i| format!("({}LL + {}LL * idx[{i}]) * tx.strides[{i}]", starts[i], steps[i])).collect();
    let off = if terms.is_empty() { "0".to_string() } else { terms.join(" + ") };
    Ok(gather_kernel(ctx, "slice", x, y, &off))
}

/// Join along `axis`. Each launch covers the output elements of up to [`CONCAT_GROUP`]
/// consecutive inputs (one launch for most graphs): a thread unravels its element in the
/// group's slab of y, then an if-chain on the axis coordinate picks the input that owns it.
pub(super) fn concatenate(ctx: &Ctx, a: &ConcatenateAttrs) -> Result<NodeKernels> {
    let y = ctx.output("y")?;
    let yd = ctx.dims(y);
    let axis = a.axis;
    let n = ctx.node.inputs.len();
    let mut xs = Vec::with_capacity(n);
    for i in 0..n {
        xs.push(ctx.input(&concat_port(i))?);
    }
    // Check the shapes as the CPU does, and find where each input starts on the axis.
    let mut at = 0i64;
    let mut starts = Vec::with_capacity(n);
    for &x in &xs {
        let xd = ctx.dims(x);
        let fits = xd.len() == yd.len() && axis < yd.len() && (0..yd.len()).all(|d| d == axis || xd[d] == yd[d]);
        if !fits {
            return Err(ctx.err(format!("internal: input dims {xd:?} do not fit output dims {yd:?} on axis {axis}")));
        }
        starts.push(at);
        at += xd[axis];
    }
    if n == 0 || at != yd[axis] {
        return Err(ctx.err(format!("internal: inputs add up to {at} on axis {axis} but the output has dims {yd:?}")));
    }
    let mut launches = Vec::new();
    for (g, group) in xs.chunks(CONCAT_GROUP).enumerate() {
        let first = g * CONCAT_GROUP;
        let entry = ctx.entry(&format!("concat{g}"));
        let mut sig = Signature::new();
        sig.tensor("y", y, true).i64("base", starts[first]);
        // Input j of the group is `xj`; the group's extent on the axis is summed from the
        // inputs' TRefs at run time.
        let mut inputs = Vec::new();
        for (j, &x) in group.iter().enumerate() {
            sig.tensor(&format!("x{j}"), x, false);
            inputs.push(format!(" X({j}, {})", ctx.ld(x)));
        }
        let last = inputs.pop().unwrap_or_default();
        let threads: u64 = yd.iter().enumerate().map(|(d, &v)| if d == axis { group.iter().map(|&x| ctx.dims(x)[axis]).sum::<i64>() } else { v }).product::<i64>().max(0) as u64;
        let source = Source::new()
            .entry(&entry, &sig)
            .define("TR_KERNEL", "TR_CONCAT")
            .define("CAT_AXIS", axis)
            .define("CAT_INPUTS(X)", inputs.concat())
            .define("CAT_LAST(X)", last)
            .define("ST_Y", ctx.st(y))
            .template(include_str!("transform.cuh"))
            .build();
        launches.push(Launch::elementwise(source, &entry, threads, sig.into_args()));
    }
    Ok(NodeKernels { launches, scratch: Vec::new() })
}

/// Same dims: the values pass through, cast to y's type and stored with y's strides.
pub(super) fn copy(ctx: &Ctx, _a: &CopyAttrs) -> Result<NodeKernels> {
    let x = ctx.input("x")?;
    let y = ctx.output("y")?;
    if ctx.dims(x) != ctx.dims(y) {
        return Err(ctx.err(format!("internal: copy of dims {:?} to dims {:?}", ctx.dims(x), ctx.dims(y))));
    }
    Ok(gather_kernel(ctx, "copy", x, y, "offset_at(tx, idx)"))
}
