//! Fusion of pointwise chains into one kernel (to be written).
use crate::engine::cuda::engine::Unit;
use crate::error::Result;
use crate::graph::Graph;

/// Disjoint groups of pointwise nodes to fuse (each at least two nodes).
pub fn groups(_graph: &Graph, _order: &[usize]) -> Vec<Vec<usize>> {
    Vec::new()
}

/// The fused unit of a group, or None when it cannot be fused after all.
pub fn unit(_graph: &Graph, _nodes: &[usize]) -> Result<Option<Unit>> {
    Ok(None)
}
