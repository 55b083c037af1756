//! Random numbers from a counter-based generator (Philox 4x32-10): uniform and Bernoulli, from
//! `seed` and `offset` tensors, so a result is reproducible from the two. Ports `seed`,
//! `offset` -> `y` (dims set by the builder).

use crate::error::Result;
use crate::graph::InferCtx;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case", deny_unknown_fields)]
pub enum Distribution {
    Uniform { low: f64, high: f64 },
    Bernoulli { probability: f64 },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RngAttrs {
    pub distribution: Distribution,
}

pub(crate) fn infer(ctx: &mut InferCtx, _a: &RngAttrs) -> Result<()> {
    Err(crate::Error::NotSupported(format!("{}: not implemented yet", ctx.kind())))
}
