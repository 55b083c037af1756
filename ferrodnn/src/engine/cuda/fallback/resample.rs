//! Pooling (max, average including or excluding padding) over 1 to 3 spatial dims of
//! `[n, c, spatial...]`, forward and backward, in double, as the CPU engine computes it.
//!
//! Output position `o` along a spatial dim covers input positions
//! `[o * stride - pre, o * stride - pre + window)`; those inside `[0, in)` are real. The
//! attributes are compiled in; dims and strides arrive in the `TRef`s. The device code is
//! `resample.cuh`.
//! - Forward: one thread per output element; its window in row-major order (max: the first
//!   maximal element, a NaN counting as maximal; average: the sum over the divisor).
//! - Backward: one thread per `dx` element gathers from the output windows that contain it, in
//!   row-major output order (the CPU's order of accumulation): for max, it recomputes each
//!   window's first argmax and takes `dy` only where that is itself; for the averages it adds
//!   `dy / divisor`. No atomics.

use super::{c_list, Ctx, Launch, NodeKernels};
use crate::engine::cuda::kernel::{Signature, Source};
use crate::error::Result;
use crate::graph::ops::resample::{ResampleAttrs, ResampleMode};

/// Checks the attributes against `x`'s rank; the number of spatial dims.
fn spatial_dims(ctx: &Ctx, a: &ResampleAttrs, x_rank: usize) -> Result<usize> {
    if !(3..=5).contains(&x_rank) {
        return Err(ctx.err(format!("input `x` must have rank 3 to 5, got {x_rank}")));
    }
    let nsp = x_rank - 2;
    if [&a.window, &a.stride, &a.pre_padding, &a.post_padding].iter().any(|l| l.len() != nsp) || a.stride.iter().any(|&s| s < 1) {
        return Err(ctx.err(format!("window, stride and padding must have {nsp} entries (stride >= 1)")));
    }
    Ok(nsp)
}

/// The text of the forward or backward kernel of resample.cuh with the entry of `sig`, for
/// `nsp` spatial dims; `io` are the defines of its loads and store.
fn source(entry: &str, sig: &Signature, a: &ResampleAttrs, nsp: usize, backward: bool, io: Vec<(&str, String)>) -> String {
    let mut source = Source::new()
        .entry(entry, sig)
        .define("RS_NSP", nsp)
        .define("RS_WINDOW", c_list(&a.window))
        .define("RS_STRIDE", c_list(&a.stride))
        .define("RS_PRE", c_list(&a.pre_padding))
        .define("RS_POST", c_list(&a.post_padding))
        .flag("RS_MAX", a.mode == ResampleMode::Max)
        .flag("RS_INCLUDE_PADDING", a.mode == ResampleMode::AvgIncludePadding)
        .flag("RS_BACKWARD", backward);
    for (name, value) in io {
        source = source.define(name, value);
    }
    source.template(include_str!("resample.cuh")).build()
}

pub(super) fn resample(ctx: &Ctx, a: &ResampleAttrs) -> Result<NodeKernels> {
    let x = ctx.input("x")?;
    let y = ctx.output("y")?;
    let nsp = spatial_dims(ctx, a, ctx.dims(x).len())?;
    let entry = ctx.entry("pool");
    let mut sig = Signature::new();
    sig.tensor("y", y, true).tensor("x", x, false);
    let source = source(&entry, &sig, a, nsp, false, vec![("LD_X", ctx.ld(x)), ("ST_Y", ctx.st(y))]);
    Ok(NodeKernels::one(Launch::elementwise(source, &entry, ctx.numel(y), sig.into_args())))
}

pub(super) fn resample_backward(ctx: &Ctx, a: &ResampleAttrs) -> Result<NodeKernels> {
    let dy = ctx.input("dy")?;
    let x = ctx.input("x")?;
    let dx = ctx.output("dx")?;
    let nsp = spatial_dims(ctx, a, ctx.dims(x).len())?;
    if ctx.dims(dy).len() != nsp + 2 || ctx.dims(dx) != ctx.dims(x) {
        return Err(ctx.err("`dy` must have the rank of `x`, and `dx` the dims of `x`"));
    }
    let entry = ctx.entry("pool_bwd");
    let mut sig = Signature::new();
    sig.tensor("dx", dx, true).tensor("dy", dy, false).tensor("x", x, false);
    let source = source(&entry, &sig, a, nsp, true, vec![("LD_X", ctx.ld(x)), ("LD_DY", ctx.ld(dy)), ("ST_DX", ctx.st(dx))]);
    Ok(NodeKernels::one(Launch::elementwise(source, &entry, ctx.numel(dx), sig.into_args())))
}
