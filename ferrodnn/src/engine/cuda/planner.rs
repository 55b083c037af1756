//! The planner: which kernels run a validated graph. It partitions the graph into units (a node,
//! or a fused group of nodes) and asks each engine family in turn for a unit's kernels: GEMM
//! groups (a matmul with the epilogue it absorbs) and attention first, then the memory-bound
//! kernels (norms with their pointwise prologue, pointwise chains, rows, batchnorm, instance
//! norm, pooling); whatever none of them covers runs on the generic fallback.

use super::kernel::{Options, Target, Unit};
use super::{attention, fallback, fused, gemm};
use crate::dtype::DataType;
use crate::error::Result;
use crate::graph::ops::Op;
use crate::graph::Graph;
use std::collections::{HashMap, HashSet};

/// The units of a validated graph: with `fused`, memory-bound chains are fused and specialized
/// kernels (GEMM, attention, rows, spatial) replace the fallback's where they apply on `target`;
/// without, one fallback unit per node.
pub fn units(graph: &Graph, target: &Target, options: &Options, fused: bool) -> Result<Vec<Unit>> {
    if fused {
        fused_units(graph, target, options)
    } else {
        fallback_units(graph)
    }
}

/// One fallback unit per node, in topological order.
pub fn fallback_units(graph: &Graph) -> Result<Vec<Unit>> {
    graph.topological_order()?.into_iter().map(|ni| fallback_unit(graph, ni)).collect()
}

fn fallback_unit(graph: &Graph, ni: usize) -> Result<Unit> {
    let writes = graph.nodes[ni].outputs.iter().map(|p| p.tensor).collect();
    Ok(Unit { nodes: vec![ni], kernels: fallback::generate(graph, ni)?, writes, unaligned: None })
}

/// The kinds of multi-node groups.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Group {
    Gemm,
    NormPrologue,
    Pointwise,
}

/// The units of a validated graph with fusion and specialized kernels applied.
fn fused_units(graph: &Graph, target: &Target, options: &Options) -> Result<Vec<Unit>> {
    let order = graph.topological_order()?;
    // Multi-node groups: GEMM groups first (a matmul and the epilogue it absorbs), then norms
    // with the pointwise prologue that makes their input, then pointwise chains among the
    // remaining nodes. Each group runs where its last node (in topological order) would.
    let mut groups: Vec<(Group, Vec<usize>)> = gemm::groups(graph, &order, target, options).into_iter().map(|g| (Group::Gemm, g)).collect();
    let claimed: HashSet<usize> = groups.iter().flat_map(|(_, g)| g.iter().copied()).collect();
    groups.extend(fused::rows::prologue_groups(graph, &order, target).into_iter().filter(|g| g.iter().all(|n| !claimed.contains(n))).map(|g| (Group::NormPrologue, g)));
    let claimed: HashSet<usize> = groups.iter().flat_map(|(_, g)| g.iter().copied()).collect();
    groups.extend(fused::pointwise::groups(graph, &order, &claimed).into_iter().map(|g| (Group::Pointwise, g)));
    let mut group_of: HashMap<usize, usize> = HashMap::new();
    for (gi, (_, grp)) in groups.iter().enumerate() {
        for &n in grp {
            group_of.insert(n, gi);
        }
    }
    let position: HashMap<usize, usize> = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let mut out = Vec::new();
    for &ni in &order {
        if let Some(&gi) = group_of.get(&ni) {
            let (kind, grp) = &groups[gi];
            let last = grp.iter().copied().max_by_key(|n| position[n]).unwrap_or(ni);
            if ni == last {
                let unit = match kind {
                    Group::Gemm => gemm::unit(graph, grp, target, options)?,
                    Group::NormPrologue => fused::rows::prologue_unit(graph, grp, target)?,
                    Group::Pointwise => fused::pointwise::unit(graph, grp)?,
                };
                match unit {
                    Some(u) => out.push(u),
                    // The group could not be generated after all: run its nodes one by one.
                    None => {
                        let mut nodes = grp.clone();
                        nodes.sort_by_key(|n| position[n]);
                        for n in nodes {
                            out.push(single(graph, n, target, options)?);
                        }
                    }
                }
            }
            continue;
        }
        out.push(single(graph, ni, target, options)?);
    }
    Ok(out)
}

/// One node: a specialized kernel when one applies, else the fallback's.
fn single(graph: &Graph, ni: usize, target: &Target, options: &Options) -> Result<Unit> {
    if let Some(u) = gemm::unit(graph, &[ni], target, options)? {
        return Ok(u);
    }
    if let Some(u) = attention::unit(graph, ni, target, options)? {
        return Ok(u);
    }
    if let Some(u) = fused::rows::unit(graph, ni, target)? {
        return Ok(u);
    }
    if let Some(u) = fused::batchnorm::unit(graph, ni, target)? {
        return Ok(u);
    }
    if let Some(u) = fused::instancenorm::unit(graph, ni, target)? {
        return Ok(u);
    }
    if let Some(u) = fused::pooling::unit(graph, ni, target)? {
        return Ok(u);
    }
    fallback_unit(graph, ni)
}

/// Whether the graph has an attention backward whose kernels the `atomics` option changes.
pub fn has_atomic_sdpa_backward(graph: &Graph) -> bool {
    graph.nodes.iter().any(|n| matches!(&n.op, Op::SdpaBackward(a) if attention::atomic_dq_pays(a)))
}

/// Whether the graph has a matmul of two fp8 tensors (its inputs, or the sources of its scaled
/// operands): the `fp8_fast_accum` option changes its kernels.
pub fn has_fp8_matmul(graph: &Graph) -> bool {
    gemm::has_fp8_matmul(graph)
}

/// Whether the graph has a matmul with an f32 input: the `tf32` option changes its kernels.
pub fn has_f32_matmul(graph: &Graph) -> bool {
    graph.nodes.iter().any(|n| matches!(n.op, Op::Matmul(_)) && n.inputs.iter().any(|p| graph.resolved_data_type(p.tensor).unwrap_or(DataType::F32) == DataType::F32))
}
