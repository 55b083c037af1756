//! Fast instancenorm kernels on NHWC-packed x (N outermost): the forward (statistics per image
//! and channel, the channel-statistics passes of [`channels`] in N groups) and the backward
//! ([`channels::backward`]). Instancenorm with packed spatial axes (NCHW) is a row kernel
//! (`rows.rs`).

use super::channels::{self, channels_last, define_chans, same_layout, stat_of, ChanGeom, Vectors, BN_BLOCKS_PER_SM};
use crate::engine::cuda::kernel::ctype;
use crate::engine::cuda::kernel::{entry_name, Attr, NodeKernels, Signature, Target, Unit};
use crate::error::Result;
use crate::graph::ops::Op;
use crate::graph::{Graph, Node};

/// A specialized unit for instancenorm or instancenorm backward node `ni`, or None when no fast
/// kernel applies.
pub fn unit(graph: &Graph, ni: usize, target: &Target) -> Result<Option<Unit>> {
    let node = &graph.nodes[ni];
    let sms = target.sm_count.max(1) as i64;
    let kernels = match &node.op {
        Op::Instancenorm(a) => forward(graph, ni, node, a.epsilon, sms),
        Op::InstancenormBackward(_) => channels::backward(graph, ni, node, true, sms),
        _ => None,
    };
    Ok(kernels.map(|kernels| Unit { nodes: vec![ni], kernels, writes: node.outputs.iter().map(|p| p.tensor).collect(), unaligned: None }))
}

/// Instancenorm forward on NHWC-packed x (N outermost): per (n, c) the shifted sums over the
/// image's positions (shift: the image's first value of the channel), a finalize writing mean
/// and inv_variance (training) and the coefficients, and the apply pass.
fn forward(graph: &Graph, ni: usize, node: &Node, eps: f64, sms: i64) -> Option<NodeKernels> {
    let x = node.input("x")?;
    let scale = node.input("scale")?;
    let bias = node.input("bias")?;
    let y = node.output("y")?;
    let xd = graph.desc(x).clone();
    if xd.dims.len() < 3 || !same_layout(graph, &[x, y]) || !channels_last(&xd.dims, &xd.strides, true) {
        return None;
    }
    let v = Vectors::new(ctype::dtype(graph, x), ctype::dtype(graph, y))?;
    let rank = xd.dims.len();
    let (n0, c) = (xd.dims[0], xd.dims[1]);
    let vec = v.vec();
    if c % vec != 0 {
        return None;
    }
    let sc = stat_of(graph, scale, rank, 1, c)?;
    let bi = stat_of(graph, bias, rank, 1, c)?;
    let stats = match (node.output("mean"), node.output("inv_variance")) {
        (Some(m), Some(iv)) => Some((m, stat_of(graph, m, rank, n0, c)?, iv, stat_of(graph, iv, rank, n0, c)?)),
        (None, None) => None,
        _ => return None,
    };
    let positions = xd.element_count() / c / n0;
    let geom = ChanGeom::new(c, vec, n0, positions, sms, BN_BLOCKS_PER_SM);

    let stats_entry = entry_name(ni, "in_nhwc_stats");
    let mut sig = Signature::new();
    sig.ptr("xv", x, false).scratch("float", "part", 0, true);
    let src = channels::templates(channels::start(&stats_entry, &sig, v, &geom, false), channels::STATS);
    let stats_launch = channels::exact(src, stats_entry, geom.grid(), geom.block, sig);

    let fin_entry = entry_name(ni, "in_nhwc_finalize");
    let mut sig = Signature::new();
    sig.ptr("xv", x, false).scratch("float", "part", 0, false).scratch("float", "co", 1, true).ptr("sc", scale, false).ptr("bi", bias, false);
    if let Some((m, _, iv, _)) = &stats {
        sig.ptr("mo", *m, true).ptr("vo", *iv, true);
    }
    sig.attr("eps", Attr::of(node, "epsilon", eps), true);
    let src = channels::start(&fin_entry, &sig, v, &geom, false).flag("FIN_STATS", stats.is_some());
    let mut src = define_chans(src, &[(&sc, "SC", false), (&bi, "BI", false)]);
    if let Some((_, ms, _, vs)) = &stats {
        src = define_chans(src, &[(ms, "MO", true), (vs, "VO", true)]);
    }
    let finalize = channels::finalize(src, fin_entry, sig, "FIN_IN", n0, c, true);

    let apply_entry = entry_name(ni, "in_nhwc_apply");
    let mut sig = Signature::new();
    sig.ptr("xv", x, false).scratch("float", "co", 1, false).ptr("yv", y, true);
    let src = channels::templates(channels::start(&apply_entry, &sig, v, &geom, false), channels::APPLY);
    Some(NodeKernels {
        launches: vec![stats_launch, finalize, channels::exact(src, apply_entry, geom.grid(), geom.block, sig)],
        scratch: vec![(2 * geom.grid() * c * 4) as usize, (3 * n0 * c * 4) as usize],
    })
}
