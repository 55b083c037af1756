//! Convolution (fprop, dgrad, wgrad; 1D, 2D, 3D; groups; any strides): one thread per output
//! element (grid-stride, in the output's memory order so that writes coalesce), the inner sum
//! in double over the same terms in the same order as the CPU engine (`engine/cpu/conv.rs`),
//! inputs rounded to the compute type first as the CPU does. The device code is `conv.cuh`
//! (after `compute.cuh`, which matmul shares).
//!
//! Per spatial dim, tap `f` of output position `o` reads input position
//! `i = o * stride - pre_padding + f * dilation`; convolution mode reads the weight of tap `f`
//! at `filter - 1 - f`. Output channel `k` is in group `k / (k / groups)` and reads that
//! group's image channels. Attributes are compiled in; dims and strides come at run time
//! through the `TRef`s.

use super::{c_list, Ctx, Launch, NodeKernels};
use crate::dtype::DataType;
use crate::engine::cuda::kernel::{Signature, Source};
use crate::error::Result;
use crate::graph::ops::conv::{ConvAttrs, ConvMode};
use crate::graph::TensorId;

/// The shared header of the contraction kernels (`cvq`, `unravel_ord`).
pub(super) const COMPUTE: &str = include_str!("compute.cuh");

/// The defines of `cvq` (compute.cuh): a value rounded to the node's compute type, as the CPU
/// engine's `compute.quantize` does for float compute types (integer compute types round
/// nothing).
pub(super) fn compute_round(source: Source, ct: DataType) -> Source {
    match ct {
        DataType::F32 => source.define("CVQ", "CVQ_F32"),
        DataType::F16 => source.define("CVQ", "CVQ_F16"),
        DataType::Bf16 => source.define("CVQ", "CVQ_BF16"),
        DataType::Fp8E4m3 => source.define("CVQ", "CVQ_FP8").define("CVQ_FP8_KIND", "__NV_E4M3"),
        DataType::Fp8E5m2 => source.define("CVQ", "CVQ_FP8").define("CVQ_FP8_KIND", "__NV_E5M2"),
        _ => source.define("CVQ", "CVQ_NONE"),
    }
}

/// The axes of a tensor from the slowest to the fastest in memory (stride descending, ties
/// in logical order), as a C initializer: a thread index unravelled in this order walks the
/// tensor's memory in order.
pub(super) fn memory_order(ctx: &Ctx, id: TensorId) -> String {
    let d = ctx.graph.desc(id);
    let mut axes: Vec<usize> = (0..d.dims.len()).collect();
    axes.sort_by(|&a, &b| d.strides[b].cmp(&d.strides[a]).then(a.cmp(&b)));
    axes.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(", ")
}

/// The launch of one of the three kernels, `what` (conv_fprop, conv_dgrad, conv_wgrad: the
/// entry's suffix, and in capitals its CONV_PASS): it writes `out` (the first tensor of `sig`)
/// over `image`'s spatial rank; `loads` are the defines of its loads and store.
fn launch(ctx: &Ctx, a: &ConvAttrs, what: &str, image: TensorId, out: TensorId, sig: Signature, loads: [(&str, String); 3]) -> Result<NodeKernels> {
    let sr = ctx.dims(image).len().saturating_sub(2);
    if !(1..=3).contains(&sr) || a.pre_padding.len() != sr || a.stride.len() != sr || a.dilation.len() != sr {
        return Err(ctx.err(format!("internal: {sr} spatial dims but attributes {a:?}")));
    }
    let entry = ctx.entry(what);
    let mut source = compute_round(Source::new().entry(&entry, &sig), ctx.graph.compute_type(ctx.node))
        .define("CONV_PASS", what.to_uppercase())
        .define("CONV_SR", sr)
        .flag("CONV_FLIP", a.mode == ConvMode::Convolution)
        .define("CONV_PRE", c_list(&a.pre_padding))
        .define("CONV_STRIDE", c_list(&a.stride))
        .define("CONV_DILATION", c_list(&a.dilation))
        .define("CONV_ORDER", memory_order(ctx, out));
    for (name, value) in loads {
        source = source.define(name, value);
    }
    let source = source.template(COMPUTE).template(include_str!("conv.cuh")).build();
    Ok(NodeKernels::one(Launch::elementwise(source, &entry, ctx.numel(out), sig.into_args())))
}

/// y[n, k, o] = sum over the group's channels cl, then taps f (row-major) inside the image, of
/// x[n, c, o*s - p + f*d] * w[k, cl, f'] (f' flipped in convolution mode).
pub(super) fn fprop(ctx: &Ctx, a: &ConvAttrs) -> Result<NodeKernels> {
    let (x, w, y) = (ctx.input("x")?, ctx.input("w")?, ctx.output("y")?);
    let mut sig = Signature::new();
    sig.tensor("y", y, true).tensor("x", x, false).tensor("w", w, false);
    launch(ctx, a, "conv_fprop", x, y, sig, [("LD_X", ctx.ld(x)), ("LD_W", ctx.ld(w)), ("ST_Y", ctx.st(y))])
}

/// dx[n, c, i] = sum over the group's output channels kl, then taps f (row-major), for the
/// output position o with o*s - p + f*d = i (when there is one), of dy[n, k, o] * w[k, cl, f'].
pub(super) fn dgrad(ctx: &Ctx, a: &ConvAttrs) -> Result<NodeKernels> {
    let (dy, w, dx) = (ctx.input("dy")?, ctx.input("w")?, ctx.output("dx")?);
    let mut sig = Signature::new();
    sig.tensor("dx", dx, true).tensor("dy", dy, false).tensor("w", w, false);
    launch(ctx, a, "conv_dgrad", dx, dx, sig, [("LD_DY", ctx.ld(dy)), ("LD_W", ctx.ld(w)), ("ST_DX", ctx.st(dx))])
}

/// dw[k, cl, s] = sum over n, then output positions o (row-major) whose tap f (s flipped in
/// convolution mode) lands inside the image, of dy[n, k, o] * x[n, c, o*s - p + f*d], with c
/// the image channel of k's group that filter channel cl reads.
pub(super) fn wgrad(ctx: &Ctx, a: &ConvAttrs) -> Result<NodeKernels> {
    let (dy, x, dw) = (ctx.input("dy")?, ctx.input("x")?, ctx.output("dw")?);
    let mut sig = Signature::new();
    sig.tensor("dw", dw, true).tensor("dy", dy, false).tensor("x", x, false);
    launch(ctx, a, "conv_wgrad", x, dw, sig, [("LD_DY", ctx.ld(dy)), ("LD_X", ctx.ld(x)), ("ST_DW", ctx.st(dw))])
}
