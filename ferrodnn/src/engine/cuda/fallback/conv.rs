//! (to be written)
use super::{Ctx, NodeKernels};
use crate::error::Result;
use crate::graph::ops::conv::ConvAttrs;
pub(super) fn fprop(ctx: &Ctx, _a: &ConvAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
pub(super) fn dgrad(ctx: &Ctx, _a: &ConvAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
pub(super) fn wgrad(ctx: &Ctx, _a: &ConvAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
