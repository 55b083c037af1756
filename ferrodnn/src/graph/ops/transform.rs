//! Tensor transforms: reshape, transpose (permute), slice, concatenate, and copy (a strided
//! copy and cast; also the NCHW <-> NHWC layout conversion). Ports: `x` -> `y`; concatenate
//! takes `x0`, `x1`, ...

use crate::error::Result;
use crate::graph::InferCtx;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReshapeAttrs {}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransposeAttrs {
    /// Output axis i is input axis `permutation[i]`.
    pub permutation: Vec<usize>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SliceAttrs {
    pub starts: Vec<i64>,
    pub ends: Vec<i64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConcatenateAttrs {
    pub axis: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CopyAttrs {}

pub(crate) fn infer_reshape(ctx: &mut InferCtx, _a: &ReshapeAttrs) -> Result<()> {
    Err(crate::Error::NotSupported(format!("{}: not implemented yet", ctx.kind())))
}
pub(crate) fn infer_transpose(ctx: &mut InferCtx, _a: &TransposeAttrs) -> Result<()> {
    Err(crate::Error::NotSupported(format!("{}: not implemented yet", ctx.kind())))
}
pub(crate) fn infer_slice(ctx: &mut InferCtx, _a: &SliceAttrs) -> Result<()> {
    Err(crate::Error::NotSupported(format!("{}: not implemented yet", ctx.kind())))
}
pub(crate) fn infer_concatenate(ctx: &mut InferCtx, _a: &ConcatenateAttrs) -> Result<()> {
    Err(crate::Error::NotSupported(format!("{}: not implemented yet", ctx.kind())))
}
pub(crate) fn infer_copy(ctx: &mut InferCtx, _a: &CopyAttrs) -> Result<()> {
    Err(crate::Error::NotSupported(format!("{}: not implemented yet", ctx.kind())))
}
