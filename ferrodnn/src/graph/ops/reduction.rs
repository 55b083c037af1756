//! Reductions over any set of axes; reduced axes keep size 1. Ports `x` -> `y`.

use crate::error::Result;
use crate::graph::InferCtx;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReductionMode {
    Add,
    Mul,
    Min,
    Max,
    Amax,
    Avg,
    Norm1,
    Norm2,
    MulNoZeros,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReductionAttrs {
    pub mode: ReductionMode,
    /// The axes reduced (each kept with size 1 in the output).
    pub axes: Vec<usize>,
}

pub(crate) fn infer(ctx: &mut InferCtx, _a: &ReductionAttrs) -> Result<()> {
    Err(crate::Error::NotSupported(format!("{}: not implemented yet", ctx.kind())))
}
