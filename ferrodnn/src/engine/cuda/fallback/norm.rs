//! (to be written)
use super::{Ctx, NodeKernels};
use crate::error::Result;
use crate::graph::ops::norm::*;
pub(super) fn batchnorm(ctx: &Ctx, _a: &BatchnormAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
pub(super) fn batchnorm_inference(ctx: &Ctx, _a: &NormAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
pub(super) fn batchnorm_backward(ctx: &Ctx, _a: &NormAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
pub(super) fn genstats(ctx: &Ctx, _a: &NormAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
pub(super) fn bn_finalize(ctx: &Ctx, _a: &BnFinalizeAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
pub(super) fn layernorm(ctx: &Ctx, _a: &NormAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
pub(super) fn layernorm_backward(ctx: &Ctx, _a: &NormAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
pub(super) fn rmsnorm(ctx: &Ctx, _a: &NormAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
pub(super) fn rmsnorm_backward(ctx: &Ctx, _a: &NormAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
pub(super) fn instancenorm(ctx: &Ctx, _a: &NormAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
pub(super) fn instancenorm_backward(ctx: &Ctx, _a: &NormAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
pub(super) fn adalayernorm(ctx: &Ctx, _a: &NormAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
pub(super) fn adalayernorm_backward(ctx: &Ctx, _a: &NormAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
