//! The Hopper GEMM (wgmma + TMA, sm_90a). Placeholder: takes nothing, so every GEMM runs on
//! the mma.sync path (`sm80`) until the Hopper kernel lands.

use super::{Epilogue, GemmProblem};
use crate::engine::cuda::engine::{Target, Unit};
use crate::error::Result;
use crate::graph::Graph;

/// The Hopper unit of a GEMM group, or None when the sm80 path should run it.
pub fn unit(_graph: &Graph, _nodes: &[usize], _p: &GemmProblem, _epi: &Epilogue, _target: &Target) -> Result<Option<Unit>> {
    Ok(None)
}
