//! (to be written)
use super::{Ctx, NodeKernels};
use crate::error::Result;
use crate::graph::ops::reduction::ReductionAttrs;
pub(super) fn reduction(ctx: &Ctx, _a: &ReductionAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
