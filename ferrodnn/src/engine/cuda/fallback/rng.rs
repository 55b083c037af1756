//! (to be written)
use super::{Ctx, NodeKernels};
use crate::error::Result;
use crate::graph::ops::rng::RngAttrs;
pub(super) fn rng(ctx: &Ctx, _a: &RngAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
