//! (to be written)
use super::{Ctx, NodeKernels};
use crate::error::Result;
use crate::graph::ops::matmul::MatmulAttrs;
pub(super) fn matmul(ctx: &Ctx, _a: &MatmulAttrs) -> Result<NodeKernels> { Err(ctx.unsupported("has no kernel for this op yet")) }
