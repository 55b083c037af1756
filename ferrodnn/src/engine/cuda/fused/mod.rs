//! Fused and specialized kernels for memory-bound work: chains of pointwise ops fused into one
//! kernel ([`pointwise`]), fast row kernels for normalizations and softmax ([`rows`]), and
//! fast kernels for batchnorm and pooling ([`spatial`]). This module also picks the units of a
//! whole graph: GEMM groups (matmul with its epilogue, [`super::gemm`]) and attention
//! ([`super::attention`]) first, then the memory-bound kernels here; whatever none of them
//! covers runs on the fallback.
//!
//! A specialized kernel computes in f32 (f64 for f64 tensors) with 16-byte vector accesses
//! where layout and alignment allow; its results are checked against the CPU engine within the
//! data type's tolerance, like the fallback's. Unit sources are generated text like the
//! fallback's: PRELUDE (fallback/mod.rs) + the unit's source.

pub mod pointwise;
pub mod rows;
pub mod spatial;

use super::engine::{Target, Unit};
use super::{attention, fallback, gemm};
use crate::error::Result;
use crate::graph::Graph;
use std::collections::{HashMap, HashSet};

/// The kinds of multi-node groups.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Group {
    Gemm,
    NormPrologue,
    Pointwise,
}

/// The units of a validated graph with fusion and specialized kernels applied.
pub fn units(graph: &Graph, target: &Target) -> Result<Vec<Unit>> {
    let order = graph.topological_order()?;
    // Multi-node groups: GEMM groups first (a matmul and the epilogue it absorbs), then norms
    // with the pointwise prologue that makes their input, then pointwise chains among the
    // remaining nodes. Each group runs where its last node (in topological order) would.
    let mut groups: Vec<(Group, Vec<usize>)> = gemm::groups(graph, &order, target).into_iter().map(|g| (Group::Gemm, g)).collect();
    let claimed: HashSet<usize> = groups.iter().flat_map(|(_, g)| g.iter().copied()).collect();
    groups.extend(rows::prologue_groups(graph, &order, target).into_iter().filter(|g| g.iter().all(|n| !claimed.contains(n))).map(|g| (Group::NormPrologue, g)));
    let claimed: HashSet<usize> = groups.iter().flat_map(|(_, g)| g.iter().copied()).collect();
    groups.extend(pointwise::groups(graph, &order, &claimed).into_iter().map(|g| (Group::Pointwise, g)));
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
                    Group::Gemm => gemm::unit(graph, grp, target)?,
                    Group::NormPrologue => rows::prologue_unit(graph, grp, target)?,
                    Group::Pointwise => pointwise::unit(graph, grp)?,
                };
                match unit {
                    Some(u) => out.push(u),
                    // The group could not be generated after all: run its nodes one by one.
                    None => {
                        let mut nodes = grp.clone();
                        nodes.sort_by_key(|n| position[n]);
                        for n in nodes {
                            out.push(single(graph, n, target)?);
                        }
                    }
                }
            }
            continue;
        }
        out.push(single(graph, ni, target)?);
    }
    Ok(out)
}

/// One node: a specialized kernel when one applies, else the fallback's.
fn single(graph: &Graph, ni: usize, target: &Target) -> Result<Unit> {
    if let Some(u) = gemm::unit(graph, &[ni], target)? {
        return Ok(u);
    }
    if let Some(u) = attention::unit(graph, ni, target)? {
        return Ok(u);
    }
    if let Some(u) = rows::unit(graph, ni, target)? {
        return Ok(u);
    }
    if let Some(u) = spatial::unit(graph, ni, target)? {
        return Ok(u);
    }
    let writes = graph.nodes[ni].outputs.iter().map(|p| p.tensor).collect();
    Ok(Unit { nodes: vec![ni], kernels: fallback::generate(graph, ni)?, writes, unaligned: None })
}
