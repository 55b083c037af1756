//! The attention engine: flash-attention kernels for sdpa and sdpa_backward (online softmax;
//! the score matrix never reaches device memory).

use super::engine::{Target, Unit};
use crate::error::Result;
use crate::graph::Graph;

/// The unit of an sdpa or sdpa_backward node, when this engine runs it.
pub fn unit(_graph: &Graph, _ni: usize, _target: &Target) -> Result<Option<Unit>> {
    Ok(None)
}
