//! Convolution: conv_fprop, conv_dgrad, conv_wgrad (1D, 2D, 3D).
//!
//! Logical layouts: image `[n, c, spatial...]`, filter `[k, c / groups, spatial...]`, output
//! `[n, k, spatial...]`, whatever the strides (channels-last is a stride order).
//! Ports: fprop `x`, `w` -> `y`; dgrad `dy`, `w` -> `dx`; wgrad `dy`, `x` -> `dw`.

use crate::error::Result;
use crate::graph::InferCtx;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConvMode {
    #[default]
    CrossCorrelation,
    Convolution,
}

/// Attributes of a convolution; one entry per spatial dim in each list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConvAttrs {
    pub pre_padding: Vec<i64>,
    pub post_padding: Vec<i64>,
    pub stride: Vec<i64>,
    pub dilation: Vec<i64>,
    #[serde(default)]
    pub mode: ConvMode,
}

pub(crate) fn infer_fprop(ctx: &mut InferCtx, _a: &ConvAttrs) -> Result<()> {
    Err(crate::Error::NotSupported(format!("{}: not implemented yet", ctx.kind())))
}
pub(crate) fn infer_dgrad(ctx: &mut InferCtx, _a: &ConvAttrs) -> Result<()> {
    Err(crate::Error::NotSupported(format!("{}: not implemented yet", ctx.kind())))
}
pub(crate) fn infer_wgrad(ctx: &mut InferCtx, _a: &ConvAttrs) -> Result<()> {
    Err(crate::Error::NotSupported(format!("{}: not implemented yet", ctx.kind())))
}
