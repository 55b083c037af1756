//! Fast batchnorm kernels: training forward (NHWC and NCHW), inference (NHWC and NCHW),
//! backward (NHWC and NCHW, see [`channels::backward`]), genstats (NHWC and NCHW) and
//! bn_finalize. The training forward and genstats are the channel-statistics passes of
//! [`channels`] (statistics, finalize, apply); inference is one apply pass with the
//! coefficients computed in place; bn_finalize a thread per channel (`batchnorm.cuh`).
//!
//! Batchnorm training forward on NHWC (no peers), three launches:
//! 1. statistics: block b covers a slab of positions for all channels; its threads hold the
//!    running sums of `x - K` and `(x - K)^2` (K: the channel's value at position 0, a shift
//!    that keeps the f32 sums well conditioned) for one vector of channels, reduce them over
//!    the block in a fixed order and write per-block partials to scratch `[2][B][C]`;
//! 2. finalize: per channel, the partials summed in f64 in a fixed order; writes mean,
//!    inv_variance, the running statistics (unbiased variance), and the f32 coefficients of
//!    the apply step to scratch;
//! 3. apply: the same slabs (walked backwards, so the rows launch 1 read last, likely still in
//!    L2, come first), `y = (x - mean) * (inv * scale) + bias`.

use super::channels::{self, chan_of, channels_last, define_chans, row_major, same_layout, stat_of, ChanT, Geom, PlaneGeom, StatsGeom, Vectors};
use crate::engine::cuda::kernel::ctype::{self, c_double};
use crate::engine::cuda::kernel::{entry_name, Attr, Grid, Launch, NodeKernels, Signature, Source, Target, Unit};
use crate::error::Result;
use crate::graph::ops::norm::{peer_ports, BatchnormAttrs, BnFinalizeAttrs};
use crate::graph::ops::Op;
use crate::graph::{Graph, Node, TensorId};

/// Batchnorm's own kernels: inference and bn_finalize.
const BATCHNORM: &str = include_str!("batchnorm.cuh");

/// A specialized unit for batchnorm, batchnorm inference and backward, genstats or bn_finalize
/// node `ni`, or None when no fast kernel applies.
pub fn unit(graph: &Graph, ni: usize, target: &Target) -> Result<Option<Unit>> {
    let node = &graph.nodes[ni];
    let sms = target.sm_count.max(1) as i64;
    let kernels = match &node.op {
        Op::Batchnorm(a) => training(graph, ni, node, a, sms).or_else(|| training_nchw(graph, ni, node, a, sms)),
        Op::BatchnormInference(_) => inference(graph, ni, node, sms),
        Op::BatchnormBackward(_) => channels::backward(graph, ni, node, false, sms),
        Op::Genstats(_) => genstats(graph, ni, node, sms).or_else(|| genstats_nchw(graph, ni, node, sms)),
        Op::BnFinalize(a) => bn_finalize(graph, ni, node, a),
        _ => None,
    };
    Ok(kernels.map(|kernels| Unit { nodes: vec![ni], kernels, writes: node.outputs.iter().map(|p| p.tensor).collect(), unaligned: None }))
}

/// The running statistics' tensors of a batchnorm node (in mean, in var, out mean, out var),
/// Some(None) when it has none, None when it has some but not all.
fn running_ports(node: &Node) -> Option<Option<[TensorId; 4]>> {
    match (node.input("in_running_mean"), node.input("in_running_var"), node.output("out_running_mean"), node.output("out_running_var")) {
        (Some(rm), Some(rv), Some(orm), Some(orv)) => Some(Some([rm, rv, orm, orv])),
        (None, None, None, None) => Some(None),
        _ => None,
    }
}

/// Training forward on channels-last x and y (no peers), see the module's description.
/// The parameters of the training forward's finalize kernel (either layout): x, the partial
/// sums and per-channel coefficients in scratch, scale, bias, the saved mean and inverse
/// variance, the running statistics with momentum when the node has them, and epsilon.
fn finalize_signature(node: &Node, a: &BatchnormAttrs, [x, scale, bias, mean, inv]: [TensorId; 5], running: Option<[TensorId; 4]>) -> Signature {
    let mut sig = Signature::new();
    sig.ptr("xv", x, false).scratch("float", "part", 0, false).scratch("float", "co", 1, true);
    sig.ptr("sc", scale, false).ptr("bi", bias, false).ptr("mo", mean, true).ptr("vo", inv, true);
    if let Some([rm, rv, orm, orv]) = running {
        sig.ptr("rm", rm, false).ptr("rv", rv, false).ptr("orm", orm, true).ptr("orv", orv, true).attr("momentum", Attr::of(node, "momentum", a.momentum), true);
    }
    sig.attr("eps", Attr::of(node, "epsilon", a.epsilon), true);
    sig
}

fn training(graph: &Graph, ni: usize, node: &Node, a: &BatchnormAttrs, sms: i64) -> Option<NodeKernels> {
    if !peer_ports(node).ok()?.is_empty() {
        return None;
    }
    let x = node.input("x")?;
    let scale = node.input("scale")?;
    let bias = node.input("bias")?;
    let y = node.output("y")?;
    let mean = node.output("mean")?;
    let inv = node.output("inv_variance")?;
    let running = running_ports(node)?;
    let (xd, yd) = (graph.desc(x), graph.desc(y));
    let v = Vectors::new(ctype::dtype(graph, x), ctype::dtype(graph, y))?;
    if xd.dims != yd.dims || !channels_last(&xd.dims, &xd.strides, false) || !channels_last(&yd.dims, &yd.strides, false) {
        return None;
    }
    // Position p must be at the same offset in x and y.
    if xd.dims.iter().enumerate().any(|(i, &d)| d > 1 && xd.strides[i] != yd.strides[i]) {
        return None;
    }
    let vec = v.vec();
    let c = xd.dims[1];
    if c % vec != 0 {
        return None;
    }
    let positions = xd.element_count() / c;
    // Per-channel tensors: [1, C, 1, ...]; element c at c * stride[1].
    let rank = xd.dims.len();
    let chan = |id: TensorId| chan_of(graph, id, rank, c);
    let (sc, bi, mo, vo) = (chan(scale)?, chan(bias)?, chan(mean)?, chan(inv)?);
    let run = match running {
        Some(ids) => {
            let [rm, rv, orm, orv] = ids.map(chan);
            Some((ids, [rm?, rv?, orm?, orv?]))
        }
        None => None,
    };
    let g = StatsGeom::new(c, vec, positions, sms);
    let stats = channels::slab_stats(entry_name(ni, "bn_nhwc_stats"), v, &g, x);

    let sig = finalize_signature(node, a, [x, scale, bias, mean, inv], run.as_ref().map(|(ids, _)| *ids));
    let fin_entry = entry_name(ni, "bn_nhwc_finalize");
    let src = channels::start(&fin_entry, &sig, v, &g, false).flag("FIN_RUNNING", run.is_some());
    let mut src = define_chans(src, &[(&sc, "SC", false), (&bi, "BI", false), (&mo, "MO", true), (&vo, "VO", true)]);
    if let Some((_, [rm, rv, orm, orv])) = &run {
        let n = positions as f64;
        src = src.define("UNBIAS", c_double(n / (n - 1.0)));
        src = define_chans(src, &[(rm, "RM", false), (rv, "RV", false), (orm, "ORM", true), (orv, "ORV", true)]);
    }
    let finalize = channels::finalize(src, fin_entry, sig, "FIN_BN", 1, c, false);

    let apply_entry = entry_name(ni, "bn_nhwc_apply");
    let mut sig = Signature::new();
    sig.ptr("xv", x, false).scratch("float", "co", 1, false).ptr("yv", y, true);
    let apply = channels::templates(channels::start(&apply_entry, &sig, v, &g, false), channels::APPLY);
    Some(NodeKernels {
        launches: vec![stats, finalize, channels::exact(apply, apply_entry, g.blocks, g.block, sig)],
        scratch: vec![(2 * g.blocks * c * 4) as usize, (3 * c * 4) as usize],
    })
}

/// Training forward (no peers) on NCHW-packed x: plane statistics, a finalize with the running
/// statistics, the apply pass.
fn training_nchw(graph: &Graph, ni: usize, node: &Node, a: &BatchnormAttrs, sms: i64) -> Option<NodeKernels> {
    if !peer_ports(node).ok()?.is_empty() {
        return None;
    }
    let x = node.input("x")?;
    let scale = node.input("scale")?;
    let bias = node.input("bias")?;
    let y = node.output("y")?;
    let mean = node.output("mean")?;
    let inv = node.output("inv_variance")?;
    let xd = graph.desc(x).clone();
    let xt = ctype::dtype(graph, x);
    if !same_layout(graph, &[x, y]) || !row_major(&xd.dims, &xd.strides) {
        return None;
    }
    let v = Vectors::new(xt, ctype::dtype(graph, y))?;
    let rank = xd.dims.len();
    let (n0, c) = (xd.dims[0], xd.dims[1]);
    let hw: i64 = xd.dims[2..].iter().product();
    let stat = |id: TensorId| stat_of(graph, id, rank, 1, c);
    let (sc, bi, mo, vo) = (stat(scale)?, stat(bias)?, stat(mean)?, stat(inv)?);
    let run = match running_ports(node)? {
        Some(ids) => {
            let [rm, rv, orm, orv] = ids.map(stat);
            Some((ids, [rm?, rv?, orm?, orv?]))
        }
        None => None,
    };
    let geom = PlaneGeom::new(c, n0, hw, v.vec(), xt.size() as i64, sms);
    let stats = channels::plane_shift_stats(entry_name(ni, "bn_nchw_stats"), v, &geom, x, sms);

    let sig = finalize_signature(node, a, [x, scale, bias, mean, inv], run.as_ref().map(|(ids, _)| *ids));
    let fin_entry = entry_name(ni, "bn_nchw_finalize");
    let src = channels::start(&fin_entry, &sig, v, &geom, false).flag("FIN_RUNNING", run.is_some());
    let mut src = define_chans(src, &[(&sc, "SC", false), (&bi, "BI", false), (&mo, "MO", true), (&vo, "VO", true)]);
    if let Some((_, [rm, rv, orm, orv])) = &run {
        let cnt = (n0 * hw) as f64;
        src = src.define("UNBIAS", c_double(cnt / (cnt - 1.0)));
        src = define_chans(src, &[(rm, "RM", false), (rv, "RV", false), (orm, "ORM", true), (orv, "ORV", true)]);
    }
    let finalize = channels::finalize(src, fin_entry, sig, "FIN_BN", 1, c, false);

    let apply_entry = entry_name(ni, "bn_nchw_apply");
    let mut sig = Signature::new();
    sig.ptr("xv", x, false).scratch("float", "co", 1, false).ptr("yv", y, true);
    let apply = channels::templates(channels::start(&apply_entry, &sig, v, &geom, false), channels::APPLY);
    Some(NodeKernels {
        launches: vec![stats, finalize, channels::strided(apply, apply_entry, n0 * c * hw / geom.vw, sig)],
        scratch: vec![(2 * n0 * c * 4) as usize, (3 * c * 4) as usize],
    })
}

/// y = (x - mean) * inv_variance * scale + bias for NHWC-packed (16-byte vectors of channels)
/// or NCHW-packed (each (n, c) plane contiguous) x and y.
fn inference(graph: &Graph, ni: usize, node: &Node, sms: i64) -> Option<NodeKernels> {
    let x = node.input("x")?;
    let y = node.output("y")?;
    let ports = [node.input("scale")?, node.input("bias")?, node.input("mean")?, node.input("inv_variance")?];
    let (xd, yd) = (graph.desc(x), graph.desc(y));
    let xt = ctype::dtype(graph, x);
    let v = Vectors::new(xt, ctype::dtype(graph, y))?;
    if xd.dims != yd.dims || xd.dims.len() < 2 {
        return None;
    }
    if xd.dims.iter().enumerate().any(|(i, &d)| d > 1 && xd.strides[i] != yd.strides[i]) {
        return None;
    }
    let c = xd.dims[1];
    let rank = xd.dims.len();
    let [sc, bi, mn, iv] = ports.map(|id| chan_of(graph, id, rank, c));
    let (sc, bi, mn, iv) = (sc?, bi?, mn?, iv?);
    let vec = v.vec();
    let total = xd.element_count();
    let mut sig = Signature::new();
    sig.ptr("xv", x, false).ptr("sc", ports[0], false).ptr("bi", ports[1], false).ptr("mn", ports[2], false).ptr("iv", ports[3], false).ptr("yv", y, true);
    // The source's start: the entry, the vectors, the channel tensors.
    let start = |entry: &str| define_chans(v.define(Source::new().entry(entry, &sig)), &[(&sc, "SC", false), (&bi, "BI", false), (&mn, "MN", false), (&iv, "IV", false)]);
    if channels_last(&xd.dims, &xd.strides, false) && channels_last(&yd.dims, &yd.strides, false) && c % vec == 0 {
        // NHWC: threads own one vector of channels (coefficients in registers) and walk
        // the positions of a slab.
        let g = StatsGeom::new(c, vec, total / c, sms);
        let entry = entry_name(ni, "bn_infer_nhwc");
        let source = g.define(start(&entry)).define("BN_KERNEL", "BN_INFER_NHWC").template(channels::VECTORS).template(BATCHNORM).build();
        return Some(NodeKernels::one(channels::exact(source, entry, g.blocks, g.block, sig)));
    }
    if !row_major(&xd.dims, &xd.strides) || !row_major(&yd.dims, &yd.strides) {
        return None;
    }
    // NCHW: planes of HW contiguous elements, plane pl has channel pl % C. Vectors along the
    // plane when every plane starts 16-byte aligned.
    let hw: i64 = xd.dims[2..].iter().product();
    let vecs = hw * xt.size() as i64 % 16 == 0;
    let (pv, step) = if vecs { (hw / vec, vec) } else { (hw, 1) };
    let items = total / step;
    let entry = entry_name(ni, "bn_infer_nchw");
    let source = start(&entry)
        .define("BN_KERNEL", "BN_INFER_NCHW")
        .flag("BN_INFER_VEC", vecs)
        .define("C_", format!("{c}LL"))
        .define("PV", format!("{pv}LL"))
        .define("ITEMS", format!("{items}LL"))
        .template(channels::VECTORS)
        .template(BATCHNORM)
        .build();
    Some(NodeKernels::one(Launch::new(source, entry, Grid::Cover(items as u64), 256, sig.into_args())))
}

/// Per-channel sum and sum of squares of NHWC-packed x: the batchnorm statistics pass, then
/// a deterministic finalize (f64, fixed order) that undoes the shift.
fn genstats(graph: &Graph, ni: usize, node: &Node, sms: i64) -> Option<NodeKernels> {
    let x = node.input("x")?;
    let sum = node.output("sum")?;
    let sq = node.output("sq_sum")?;
    let xd = graph.desc(x);
    let xt = ctype::dtype(graph, x);
    let v = Vectors::new(xt, xt)?;
    if !channels_last(&xd.dims, &xd.strides, false) {
        return None;
    }
    let vec = v.vec();
    let c = xd.dims[1];
    if c % vec != 0 {
        return None;
    }
    let rank = xd.dims.len();
    let su = chan_of(graph, sum, rank, c)?;
    let sqs = chan_of(graph, sq, rank, c)?;
    let positions = xd.element_count() / c;
    let g = StatsGeom::new(c, vec, positions, sms);
    let stats = channels::slab_stats(entry_name(ni, "genstats_nhwc_stats"), v, &g, x);
    let mut sig = Signature::new();
    sig.ptr("xv", x, false).scratch("float", "part", 0, false).ptr("su", sum, true).ptr("sq", sq, true);
    let fin_entry = entry_name(ni, "genstats_nhwc_finalize");
    let src = define_chans(channels::start(&fin_entry, &sig, v, &g, false), &[(&su, "SU", true), (&sqs, "SQ", true)]);
    let finalize = channels::finalize(src, fin_entry, sig, "FIN_GENSTATS", 1, c, false);
    Some(NodeKernels { launches: vec![stats, finalize], scratch: vec![(2 * g.blocks * c * 4) as usize] })
}

/// Genstats on NCHW-packed x: plane statistics and a finalize that undoes the shift.
fn genstats_nchw(graph: &Graph, ni: usize, node: &Node, sms: i64) -> Option<NodeKernels> {
    let x = node.input("x")?;
    let sum = node.output("sum")?;
    let sq = node.output("sq_sum")?;
    let xd = graph.desc(x).clone();
    let xt = ctype::dtype(graph, x);
    if !row_major(&xd.dims, &xd.strides) {
        return None;
    }
    let v = Vectors::new(xt, xt)?;
    let rank = xd.dims.len();
    let (n0, c) = (xd.dims[0], xd.dims[1]);
    let hw: i64 = xd.dims[2..].iter().product();
    let su = stat_of(graph, sum, rank, 1, c)?;
    let sqs = stat_of(graph, sq, rank, 1, c)?;
    let geom = PlaneGeom::new(c, n0, hw, v.vec(), xt.size() as i64, sms);
    let stats = channels::plane_shift_stats(entry_name(ni, "genstats_nchw_stats"), v, &geom, x, sms);
    let mut sig = Signature::new();
    sig.ptr("xv", x, false).scratch("float", "part", 0, false).ptr("su", sum, true).ptr("sq", sq, true);
    let fin_entry = entry_name(ni, "genstats_nchw_finalize");
    let src = define_chans(channels::start(&fin_entry, &sig, v, &geom, false), &[(&su, "SU", true), (&sqs, "SQ", true)]);
    let finalize = channels::finalize(src, fin_entry, sig, "FIN_GENSTATS", 1, c, false);
    Some(NodeKernels { launches: vec![stats, finalize], scratch: vec![(2 * n0 * c * 4) as usize] })
}

/// bn_finalize: one thread per channel, in f64 (C values; a single small launch with the
/// offsets baked in).
fn bn_finalize(graph: &Graph, ni: usize, node: &Node, a: &BnFinalizeAttrs) -> Option<NodeKernels> {
    let sum = node.input("sum")?;
    let d = graph.desc(sum);
    let rank = d.dims.len();
    let c = *d.dims.get(1)?;
    let mut ins = vec![("su", sum), ("sq", node.input("sq_sum")?), ("sc", node.input("scale")?), ("bi", node.input("bias")?)];
    let mut outs = vec![("es", node.output("eq_scale")?), ("eb", node.output("eq_bias")?), ("sm", node.output("saved_mean")?), ("si", node.output("saved_inv_std")?)];
    let running = match (node.input("prev_running_mean"), node.input("prev_running_var"), node.output("next_running_mean"), node.output("next_running_var")) {
        (Some(rm), Some(rv), Some(nrm), Some(nrv)) => {
            ins.extend([("rm", rm), ("rv", rv)]);
            outs.extend([("nm", nrm), ("nv", nrv)]);
            true
        }
        (None, None, None, None) => false,
        _ => return None,
    };
    let count = a.accum_count as f64;
    let entry = entry_name(ni, "bn_finalize_fast");
    let mut sig = Signature::new();
    let mut chans = Vec::new();
    for (write, &(name, id)) in ins.iter().map(|p| (false, p)).chain(outs.iter().map(|p| (true, p))) {
        let t = graph.desc(id);
        if t.dims.len() != rank || t.dims[1] != c || t.dims.iter().enumerate().any(|(i, &n)| i != 1 && n != 1) || !ctype::dtype(graph, id).is_float() {
            return None;
        }
        sig.ptr(name, id, write);
        chans.push((name.to_uppercase(), write, ChanT::new(graph, id, if c > 1 { t.strides[1] } else { 0 })));
    }
    sig.attr("eps", Attr::of(node, "epsilon", a.epsilon), true);
    if running {
        sig.attr("momentum", Attr::of(node, "momentum", a.momentum), true);
    }
    let mut src = Source::new().entry(&entry, &sig).define("BN_KERNEL", "BN_FINALIZE").flag("BN_RUNNING", running).define("C_", format!("{c}LL")).define("COUNT", c_double(count));
    if running {
        src = src.define("UNBIAS", c_double(count / (count - 1.0)));
    }
    for (name, write, t) in &chans {
        src = t.define(src, name, *write);
    }
    let source = src.template(BATCHNORM).build();
    Some(NodeKernels::one(channels::strided(source, entry, c, sig)))
}
