//! (to be written)
use super::{Ctx, NodeKernels};
use crate::error::Result;
use crate::graph::ops::transform::*;
pub(super) fn reshape(ctx: &Ctx, _a: &ReshapeAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
pub(super) fn transpose(ctx: &Ctx, _a: &TransposeAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
pub(super) fn slice(ctx: &Ctx, _a: &SliceAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
pub(super) fn concatenate(ctx: &Ctx, _a: &ConcatenateAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
pub(super) fn copy(ctx: &Ctx, _a: &CopyAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
