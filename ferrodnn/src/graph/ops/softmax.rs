//! Softmax and log-softmax over one axis, with an optional log-sum-exp `stats` output, and the
//! backward. Ports: forward `x` -> `y`, `stats`; backward `y`, `dy` -> `dx`.

use crate::error::Result;
use crate::graph::InferCtx;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SoftmaxAttrs {
    pub axis: usize,
    #[serde(default)]
    pub log: bool,
}

pub(crate) fn infer(ctx: &mut InferCtx, _a: &SoftmaxAttrs) -> Result<()> {
    Err(crate::Error::NotSupported(format!("{}: not implemented yet", ctx.kind())))
}
pub(crate) fn infer_backward(ctx: &mut InferCtx, _a: &SoftmaxAttrs) -> Result<()> {
    Err(crate::Error::NotSupported(format!("{}: not implemented yet", ctx.kind())))
}
