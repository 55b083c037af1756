//! Fused and specialized kernels for memory-bound work: chains of pointwise ops fused into one
//! kernel ([`pointwise`]), fast row kernels for normalizations and softmax ([`rows`]), and
//! fast kernels for batchnorm and pooling ([`spatial`]). Each unit here replaces one or more
//! fallback units; whatever this module does not cover runs on the fallback.
//!
//! A specialized kernel computes in f32 (f64 for f64 tensors) with 16-byte vector accesses
//! where layout and alignment allow; its results are checked against the CPU engine within the
//! data type's tolerance, like the fallback's. Unit sources are generated text like the
//! fallback's: PRELUDE (fallback/mod.rs) + the unit's source.

pub mod pointwise;
pub mod rows;
pub mod spatial;

use super::engine::Unit;
use super::fallback;
use crate::error::Result;
use crate::graph::Graph;
use std::collections::HashMap;

/// The units of a validated graph with fusion and specialized kernels applied.
pub fn units(graph: &Graph) -> Result<Vec<Unit>> {
    let order = graph.topological_order()?;
    // Pointwise groups: each runs where its last node (in topological order) would.
    let groups = pointwise::groups(graph, &order);
    let mut group_of: HashMap<usize, usize> = HashMap::new();
    for (gi, grp) in groups.iter().enumerate() {
        for &n in grp {
            group_of.insert(n, gi);
        }
    }
    let position: HashMap<usize, usize> = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    let mut out = Vec::new();
    for &ni in &order {
        if let Some(&gi) = group_of.get(&ni) {
            let grp = &groups[gi];
            let last = grp.iter().copied().max_by_key(|n| position[n]).unwrap_or(ni);
            if ni == last {
                match pointwise::unit(graph, grp)? {
                    Some(u) => out.push(u),
                    // The group could not be generated after all: run its nodes one by one.
                    None => {
                        let mut nodes = grp.clone();
                        nodes.sort_by_key(|n| position[n]);
                        for n in nodes {
                            out.push(single(graph, n)?);
                        }
                    }
                }
            }
            continue;
        }
        out.push(single(graph, ni)?);
    }
    Ok(out)
}

/// One node: a specialized kernel when one applies, else the fallback's.
fn single(graph: &Graph, ni: usize) -> Result<Unit> {
    if let Some(u) = rows::unit(graph, ni)? {
        return Ok(u);
    }
    if let Some(u) = spatial::unit(graph, ni)? {
        return Ok(u);
    }
    let writes = graph.nodes[ni].outputs.iter().map(|p| p.tensor).collect();
    Ok(Unit { nodes: vec![ni], kernels: fallback::generate(graph, ni)?, writes })
}
