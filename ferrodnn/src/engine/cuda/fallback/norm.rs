//! Normalizations. As on the CPU, every normalization is "statistics over groups of x's
//! elements, then an affine map": a group is the set of elements of x that share one index of
//! a smaller shape of the same rank (the statistics' dims, or scale's dims for dscale/dbias),
//! i.e. the axes where that shape is 1 are reduced. A kernel gets the reduced axes as a bit
//! mask, the group count `G` and the group size `M`, and runs one 256-thread block per group
//! (grid-stride over groups) with a shared-memory tree reduction: deterministic, no atomics.
//! The device code is `norm.cuh`.
//!
//! - Forward ops (layernorm, rmsnorm, instancenorm, adalayernorm, batchnorm): one launch; each
//!   block computes its group's mean and inverse deviation (two passes, as the CPU), writes the
//!   statistics outputs when the op has them, then `y` for its members, using the statistics in
//!   double (the CPU does not round them to the stats type before applying).
//! - Backward ops: one launch per statistics group (sums of `dy * scale` and of
//!   `dy * scale * xhat`, then `dx` for its members) and one launch per element of `scale`
//!   (sums of `dy * xhat` and `dy` into `dscale` and `dbias`).
//! - genstats: one block per channel; batchnorm_inference and bn_finalize: elementwise.
//! - Groupnorm: the forward and backward kernels with `NORM_GROUPED`: a statistics group is an
//!   image's channel group (axis 1 split between the group and member indices, `cpg` channels
//!   per group), and the statistics are read and written at the channel's group.
//!
//! Epsilon and momentum are kernel parameters (a user may change them between executes);
//! bn_finalize's accumulation count is compiled in.

use super::{c_double, Ctx, Grid, Launch, NodeKernels};
use crate::engine::cuda::kernel::{Attr, Signature, Source};
use crate::error::Result;
use crate::graph::ops::norm::*;

/// Threads per block of the group kernels (a power of two: the tree reduction halves it).
const NB: u32 = 256;

/// The text of kernel `kernel` of norm.cuh (NORM_FORWARD, ...) with the entry of `sig` and the
/// kernel's `defines`.
fn source(entry: &str, sig: &Signature, kernel: &str, defines: Vec<(&str, String)>) -> String {
    let mut source = Source::new().entry(entry, sig).define("NORM_KERNEL", kernel).define("NORM_BLOCK", NB);
    for (name, value) in defines {
        source = source.define(name, value);
    }
    source.template(include_str!("norm.cuh")).build()
}

/// `mask`, `G` and `M`: the reduced axes, group count and group size of the group kernels.
fn group_params(sig: &mut Signature, (mask, groups, members): (i64, i64, i64)) {
    sig.i64("mask", mask).i64("G", groups).i64("M", members);
}

/// `1` or `0`, for a flag among the defines.
fn flag(on: bool) -> String {
    (on as u8).to_string()
}

/// Reduced-axes mask (bit a set where `target` is 1), group count and group size of x's
/// elements grouped by `target` (same rank as x, each dim x's or 1).
fn grouping(x: &[i64], target: &[i64]) -> (i64, i64, i64) {
    let mut mask = 0i64;
    let (mut groups, mut members) = (1i64, 1i64);
    for (a, &d) in x.iter().enumerate() {
        let d = d.max(0);
        if target.get(a).copied().unwrap_or(1) == 1 {
            mask |= 1 << a;
            members = members.saturating_mul(d);
        } else {
            groups = groups.saturating_mul(d);
        }
    }
    (mask, groups, members)
}

/// A launch of one `NB`-thread block per group (grid-stride over groups beyond the cap).
fn group_launch(source: String, entry: &str, groups: i64, sig: Signature) -> Launch {
    let blocks = groups.clamp(1, 65535) as u32;
    Launch::new(source, entry, Grid::Exact(blocks, 1, 1), NB, sig.into_args())
}

/// Groupnorm's statistics groups of an x of dims `x` in `groups` channel groups: (the mask of
/// the spatial axes, N * groups groups, C / groups * spatial members) and the channels per group
/// (axis 1 is split by the kernels, `NORM_SPLIT`).
fn channel_grouping(x: &[i64], groups: i64) -> ((i64, i64, i64), i64) {
    let groups = groups.max(1);
    let cpg = (x.get(1).copied().unwrap_or(1).max(1) / groups).max(1);
    let mut mask = 0i64;
    let mut members = cpg;
    for (a, &d) in x.iter().enumerate().skip(2) {
        mask |= 1 << a;
        members = members.saturating_mul(d.max(0));
    }
    ((mask, x.first().copied().unwrap_or(1).max(0).saturating_mul(groups), members), cpg)
}

/// The defines and parameter of groupnorm's kernels (`cpg`: channels per group; `split`: the
/// kernel's groups are the statistics groups).
fn group_defines(sig: &mut Signature, defines: &mut Vec<(&str, String)>, cpg: i64, split: bool) {
    sig.i64("cpg", cpg);
    defines.extend([("NORM_GROUPED", flag(true)), ("NORM_SPLIT", flag(split))]);
}

/// Forward of layernorm, rmsnorm (`rms`), instancenorm, adalayernorm: statistics per group,
/// then `y`, in one launch.
fn norm_forward(ctx: &Ctx, attrs: &NormAttrs, axes: NormAxes, rms: bool) -> Result<NodeKernels> {
    let xd = ctx.dims(ctx.input("x")?);
    forward_kernel(ctx, attrs.epsilon, grouping(&xd, &axes.stats_dims(&xd)), None, rms)
}

/// The forward kernel over statistics groups `grouping`, with groupnorm's `cpg` where given.
fn forward_kernel(ctx: &Ctx, epsilon: f64, grouping: (i64, i64, i64), cpg: Option<i64>, rms: bool) -> Result<NodeKernels> {
    let x = ctx.input("x")?;
    let scale = ctx.input("scale")?;
    let bias = ctx.node.input("bias");
    let y = ctx.output("y")?;
    let mean = if rms { None } else { ctx.node.output("mean") };
    let inv = ctx.node.output("inv_variance");
    let entry = ctx.entry(if rms { "rmsnorm" } else { "norm_fwd" });

    let mut sig = Signature::new();
    sig.tensor("x", x, false).tensor("sc", scale, false);
    let mut defines = vec![("NORM_RMS", flag(rms)), ("LD_X", ctx.ld(x)), ("LD_SC", ctx.ld(scale)), ("ST_Y", ctx.st(y))];
    defines.push(("NORM_BIAS", flag(bias.is_some())));
    if let Some(b) = bias {
        sig.tensor("bi", b, false);
        defines.push(("LD_BI", ctx.ld(b)));
    }
    sig.tensor("y", y, true);
    defines.push(("NORM_MEAN", flag(mean.is_some())));
    if let Some(m) = mean {
        sig.tensor("mo", m, true);
        defines.push(("ST_MEAN", ctx.st(m)));
    }
    defines.push(("NORM_INV", flag(inv.is_some())));
    if let Some(v) = inv {
        sig.tensor("iv", v, true);
        defines.push(("ST_INV", ctx.st(v)));
    }
    group_params(&mut sig, grouping);
    if let Some(cpg) = cpg {
        group_defines(&mut sig, &mut defines, cpg, true);
    }
    sig.attr("epsilon", Attr::of(ctx.node, "epsilon", epsilon), true);
    let source = source(&entry, &sig, "NORM_FORWARD", defines);
    Ok(NodeKernels::one(group_launch(source, &entry, grouping.1, sig)))
}

/// Backward of layernorm, rmsnorm (`rms`: no mean), instancenorm, adalayernorm, batchnorm.
/// With `xhat = (x - mean) * inv` and `g = dy * scale` over the n elements of a statistics
/// group: `dx = inv * (g - mean(g) - xhat * mean(g * xhat))` (rmsnorm drops `mean(g)`);
/// `dscale = sum(dy * xhat)`, `dbias = sum(dy)` over the elements sharing a scale value.
fn norm_backward(ctx: &Ctx, axes: NormAxes, rms: bool) -> Result<NodeKernels> {
    let xd = ctx.dims(ctx.input("x")?);
    backward_kernels(ctx, grouping(&xd, &axes.stats_dims(&xd)), None, rms)
}

/// The backward kernels, the dx kernel over statistics groups `grouping1`, with groupnorm's
/// `cpg` where given.
fn backward_kernels(ctx: &Ctx, grouping1: (i64, i64, i64), cpg: Option<i64>, rms: bool) -> Result<NodeKernels> {
    let dy = ctx.input("dy")?;
    let x = ctx.input("x")?;
    let scale = ctx.input("scale")?;
    let mean = if rms { None } else { Some(ctx.input("mean")?) };
    let inv = ctx.input("inv_variance")?;
    let dx = ctx.output("dx")?;
    let dscale = ctx.output("dscale")?;
    let dbias = ctx.node.output("dbias");
    let xd = ctx.dims(x);
    // The inputs both kernels read, first among their parameters, and their loads.
    let common = |sig: &mut Signature, defines: &mut Vec<(&str, String)>| {
        sig.tensor("dy", dy, false).tensor("x", x, false);
        defines.extend([("NORM_RMS", flag(rms)), ("LD_DY", ctx.ld(dy)), ("LD_X", ctx.ld(x)), ("LD_INV", ctx.ld(inv))]);
        if let Some(m) = mean {
            sig.tensor("mn", m, false);
            defines.push(("LD_MEAN", ctx.ld(m)));
        }
        sig.tensor("iv", inv, false);
    };

    // dx: one block per statistics group.
    let entry1 = ctx.entry("norm_bwd_dx");
    let (mut sig1, mut defines1) = (Signature::new(), Vec::new());
    common(&mut sig1, &mut defines1);
    sig1.tensor("sc", scale, false).tensor("dx", dx, true);
    defines1.extend([("LD_SC", ctx.ld(scale)), ("ST_DX", ctx.st(dx))]);
    group_params(&mut sig1, grouping1);
    if let Some(cpg) = cpg {
        group_defines(&mut sig1, &mut defines1, cpg, true);
    }
    let source1 = source(&entry1, &sig1, "NORM_BACKWARD_DX", defines1);

    // dscale, dbias: one block per element of scale.
    let grouping2 = grouping(&xd, &ctx.dims(scale));
    let entry2 = ctx.entry("norm_bwd_dscale");
    let (mut sig2, mut defines2) = (Signature::new(), Vec::new());
    common(&mut sig2, &mut defines2);
    sig2.tensor("ds", dscale, true);
    defines2.extend([("ST_DSCALE", ctx.st(dscale)), ("NORM_DBIAS", flag(dbias.is_some()))]);
    if let Some(b) = dbias {
        sig2.tensor("db", b, true);
        defines2.push(("ST_DBIAS", ctx.st(b)));
    }
    group_params(&mut sig2, grouping2);
    if let Some(cpg) = cpg {
        group_defines(&mut sig2, &mut defines2, cpg, false);
    }
    let source2 = source(&entry2, &sig2, "NORM_BACKWARD_DSCALE", defines2);
    Ok(NodeKernels { launches: vec![group_launch(source1, &entry1, grouping1.1, sig1), group_launch(source2, &entry2, grouping2.1, sig2)], scratch: Vec::new() })
}

pub(super) fn batchnorm(ctx: &Ctx, a: &BatchnormAttrs) -> Result<NodeKernels> {
    let x = ctx.input("x")?;
    let scale = ctx.input("scale")?;
    let bias = ctx.input("bias")?;
    let y = ctx.output("y")?;
    let mean = ctx.output("mean")?;
    let inv = ctx.output("inv_variance")?;
    let running = match (ctx.node.input("in_running_mean"), ctx.node.input("in_running_var")) {
        (Some(m), Some(v)) => Some((m, v, ctx.output("out_running_mean")?, ctx.output("out_running_var")?)),
        (None, None) => None,
        _ => return Err(ctx.err("give both in_running_mean and in_running_var or neither")),
    };
    let peers = peer_ports(ctx.node).map_err(|m| ctx.err(m))?;
    let xd = ctx.dims(x);
    let grouping = grouping(&xd, &NormAxes::Batch.stats_dims(&xd));
    let entry = ctx.entry("batchnorm");

    let mut sig = Signature::new();
    sig.tensor("x", x, false).tensor("sc", scale, false).tensor("bi", bias, false).tensor("y", y, true).tensor("mo", mean, true).tensor("iv", inv, true);
    let mut defines = vec![("LD_X", ctx.ld(x)), ("LD_SC", ctx.ld(scale)), ("LD_BI", ctx.ld(bias)), ("ST_Y", ctx.st(y)), ("ST_MEAN", ctx.st(mean)), ("ST_INV", ctx.st(inv))];
    // Peer k's statistics arrive as `p<k>`.
    let mut list = String::new();
    for (k, &(_, p)) in peers.iter().enumerate() {
        sig.tensor(&format!("p{k}"), p, false);
        list += &format!(" X({k}, {})", ctx.ld(p));
    }
    defines.push(("BN_PEERS(X)", list));
    defines.push(("BN_PARTS", format!("{}.0", peers.len() + 1)));
    defines.push(("BN_RUNNING", flag(running.is_some())));
    if let Some((rm, rv, orm, orv)) = running {
        sig.tensor("rm", rm, false).tensor("rv", rv, false).tensor("orm", orm, true).tensor("orv", orv, true);
        defines.extend([("LD_RM", ctx.ld(rm)), ("LD_RV", ctx.ld(rv)), ("ST_RM", ctx.st(orm)), ("ST_RV", ctx.st(orv))]);
    }
    group_params(&mut sig, grouping);
    sig.attr("epsilon", Attr::of(ctx.node, "epsilon", a.epsilon), true);
    if running.is_some() {
        sig.attr("momentum", Attr::of(ctx.node, "momentum", a.momentum), true);
    }
    let source = source(&entry, &sig, "NORM_BATCHNORM", defines);
    Ok(NodeKernels::one(group_launch(source, &entry, grouping.1, sig)))
}

pub(super) fn batchnorm_inference(ctx: &Ctx, _a: &NormAttrs) -> Result<NodeKernels> {
    let x = ctx.input("x")?;
    let y = ctx.output("y")?;
    let entry = ctx.entry("bn_infer");
    let mut sig = Signature::new();
    sig.tensor("x", x, false).tensor("y", y, true);
    let mut defines = vec![("LD_X", ctx.ld(x)), ("ST_Y", ctx.st(y))];
    for (name, port, load) in [("sc", "scale", "LD_SC"), ("bi", "bias", "LD_BI"), ("mn", "mean", "LD_MEAN"), ("iv", "inv_variance", "LD_INV")] {
        let t = ctx.input(port)?;
        sig.tensor(name, t, false);
        defines.push((load, ctx.ld(t)));
    }
    let source = source(&entry, &sig, "NORM_BN_INFERENCE", defines);
    Ok(NodeKernels::one(Launch::elementwise(source, &entry, ctx.numel(x), sig.into_args())))
}

pub(super) fn batchnorm_backward(ctx: &Ctx, _a: &NormAttrs) -> Result<NodeKernels> {
    norm_backward(ctx, NormAxes::Batch, false)
}

pub(super) fn genstats(ctx: &Ctx, _a: &NormAttrs) -> Result<NodeKernels> {
    let x = ctx.input("x")?;
    let sum = ctx.output("sum")?;
    let sq = ctx.output("sq_sum")?;
    let xd = ctx.dims(x);
    let grouping = grouping(&xd, &NormAxes::Batch.stats_dims(&xd));
    let entry = ctx.entry("genstats");
    let mut sig = Signature::new();
    sig.tensor("x", x, false).tensor("su", sum, true).tensor("sq", sq, true);
    group_params(&mut sig, grouping);
    let source = source(&entry, &sig, "NORM_GENSTATS", vec![("LD_X", ctx.ld(x)), ("ST_SUM", ctx.st(sum)), ("ST_SQ", ctx.st(sq))]);
    Ok(NodeKernels::one(group_launch(source, &entry, grouping.1, sig)))
}

pub(super) fn bn_finalize(ctx: &Ctx, a: &BnFinalizeAttrs) -> Result<NodeKernels> {
    let sum = ctx.input("sum")?;
    let entry = ctx.entry("bn_finalize");
    let mut sig = Signature::new();
    let mut defines = vec![("BN_COUNT", c_double(a.accum_count as f64))];
    for (name, port, load) in [("su", "sum", "LD_SUM"), ("sq", "sq_sum", "LD_SQ"), ("sc", "scale", "LD_SC"), ("bi", "bias", "LD_BI")] {
        let t = ctx.input(port)?;
        sig.tensor(name, t, false);
        defines.push((load, ctx.ld(t)));
    }
    for (name, port, store) in [("es", "eq_scale", "ST_EQ_SCALE"), ("eb", "eq_bias", "ST_EQ_BIAS"), ("sm", "saved_mean", "ST_SAVED_MEAN"), ("si", "saved_inv_std", "ST_SAVED_INV")]
    {
        let t = ctx.output(port)?;
        sig.tensor(name, t, true);
        defines.push((store, ctx.st(t)));
    }
    let running = match (ctx.node.input("prev_running_mean"), ctx.node.input("prev_running_var")) {
        (Some(rm), Some(rv)) => {
            let (nrm, nrv) = (ctx.output("next_running_mean")?, ctx.output("next_running_var")?);
            sig.tensor("rm", rm, false).tensor("rv", rv, false).tensor("nrm", nrm, true).tensor("nrv", nrv, true);
            defines.extend([("LD_RM", ctx.ld(rm)), ("LD_RV", ctx.ld(rv)), ("ST_RM", ctx.st(nrm)), ("ST_RV", ctx.st(nrv))]);
            true
        }
        (None, None) => false,
        _ => return Err(ctx.err("give both prev_running_mean and prev_running_var or neither")),
    };
    defines.push(("BN_RUNNING", flag(running)));
    sig.attr("epsilon", Attr::of(ctx.node, "epsilon", a.epsilon), true);
    if running {
        sig.attr("momentum", Attr::of(ctx.node, "momentum", a.momentum), true);
    }
    let source = source(&entry, &sig, "NORM_BN_FINALIZE", defines);
    Ok(NodeKernels::one(Launch::elementwise(source, &entry, ctx.numel(sum), sig.into_args())))
}

pub(super) fn layernorm(ctx: &Ctx, a: &NormAttrs) -> Result<NodeKernels> {
    norm_forward(ctx, a, NormAxes::Layer, false)
}
pub(super) fn layernorm_backward(ctx: &Ctx, _a: &NormAttrs) -> Result<NodeKernels> {
    norm_backward(ctx, NormAxes::Layer, false)
}
pub(super) fn rmsnorm(ctx: &Ctx, a: &NormAttrs) -> Result<NodeKernels> {
    norm_forward(ctx, a, NormAxes::Layer, true)
}
pub(super) fn rmsnorm_backward(ctx: &Ctx, _a: &NormAttrs) -> Result<NodeKernels> {
    norm_backward(ctx, NormAxes::Layer, true)
}
pub(super) fn instancenorm(ctx: &Ctx, a: &NormAttrs) -> Result<NodeKernels> {
    norm_forward(ctx, a, NormAxes::Instance, false)
}
pub(super) fn instancenorm_backward(ctx: &Ctx, _a: &NormAttrs) -> Result<NodeKernels> {
    norm_backward(ctx, NormAxes::Instance, false)
}
pub(super) fn groupnorm(ctx: &Ctx, a: &GroupnormAttrs) -> Result<NodeKernels> {
    let (grouping, cpg) = channel_grouping(&ctx.dims(ctx.input("x")?), a.groups);
    forward_kernel(ctx, a.epsilon, grouping, Some(cpg), false)
}
pub(super) fn groupnorm_backward(ctx: &Ctx, a: &GroupnormAttrs) -> Result<NodeKernels> {
    let (grouping, cpg) = channel_grouping(&ctx.dims(ctx.input("x")?), a.groups);
    backward_kernels(ctx, grouping, Some(cpg), false)
}
pub(super) fn adalayernorm(ctx: &Ctx, a: &NormAttrs) -> Result<NodeKernels> {
    norm_forward(ctx, a, NormAxes::AdaLayer, false)
}
pub(super) fn adalayernorm_backward(ctx: &Ctx, _a: &NormAttrs) -> Result<NodeKernels> {
    norm_backward(ctx, NormAxes::AdaLayer, false)
}
