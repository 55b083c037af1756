//! (to be written)
use super::{Ctx, NodeKernels};
use crate::error::Result;
use crate::graph::ops::softmax::SoftmaxAttrs;
pub(super) fn softmax(ctx: &Ctx, _a: &SoftmaxAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
pub(super) fn softmax_backward(ctx: &Ctx, _a: &SoftmaxAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
