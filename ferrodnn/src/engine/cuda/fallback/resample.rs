//! (to be written)
use super::{Ctx, NodeKernels};
use crate::error::Result;
use crate::graph::ops::resample::ResampleAttrs;
pub(super) fn resample(ctx: &Ctx, _a: &ResampleAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
pub(super) fn resample_backward(ctx: &Ctx, _a: &ResampleAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
