//! Resample (pooling): max, average including or excluding padding; 1D, 2D, 3D over the
//! spatial dims of `[n, c, spatial...]`. Ports: forward `x` -> `y`; backward `dy`, `x` -> `dx`.

use crate::error::Result;
use crate::graph::InferCtx;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResampleMode {
    Max,
    AvgIncludePadding,
    AvgExcludePadding,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResampleAttrs {
    pub mode: ResampleMode,
    pub window: Vec<i64>,
    pub stride: Vec<i64>,
    pub pre_padding: Vec<i64>,
    pub post_padding: Vec<i64>,
}

pub(crate) fn infer(ctx: &mut InferCtx, _a: &ResampleAttrs) -> Result<()> {
    Err(crate::Error::NotSupported(format!("{}: not implemented yet", ctx.kind())))
}
pub(crate) fn infer_backward(ctx: &mut InferCtx, _a: &ResampleAttrs) -> Result<()> {
    Err(crate::Error::NotSupported(format!("{}: not implemented yet", ctx.kind())))
}
