//! Batched matmul: `a [..., m, k] x b [..., k, n] -> c [..., m, n]`, batch dims broadcast,
//! any strides (a transpose is a stride). Ports `a`, `b` -> `c`.

use crate::error::Result;
use crate::graph::InferCtx;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatmulAttrs {}

pub(crate) fn infer(ctx: &mut InferCtx, _a: &MatmulAttrs) -> Result<()> {
    Err(crate::Error::NotSupported(format!("{}: not implemented yet", ctx.kind())))
}
