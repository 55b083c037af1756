//! (to be written)
use super::{Ctx, NodeKernels};
use crate::error::Result;
use crate::graph::ops::sdpa::SdpaAttrs;
pub(super) fn sdpa(ctx: &Ctx, _a: &SdpaAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
pub(super) fn sdpa_backward(ctx: &Ctx, _a: &SdpaAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
