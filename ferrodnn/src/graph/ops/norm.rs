//! Normalizations: batchnorm (training, inference, backward), genstats, bn_finalize,
//! layernorm, rmsnorm, instancenorm, adalayernorm and their backward forms.

use crate::error::Result;
use crate::graph::InferCtx;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormPhase {
    #[default]
    Training,
    Inference,
}

/// Attributes shared by the normalizations.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NormAttrs {
    #[serde(default)]
    pub phase: NormPhase,
    #[serde(default = "default_epsilon")]
    pub epsilon: f64,
}

impl Default for NormAttrs {
    fn default() -> Self {
        NormAttrs { phase: NormPhase::Training, epsilon: default_epsilon() }
    }
}

fn default_epsilon() -> f64 {
    1e-5
}

/// Batchnorm training forward.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchnormAttrs {
    #[serde(default = "default_epsilon")]
    pub epsilon: f64,
    /// running = (1 - momentum) * running + momentum * batch statistic.
    #[serde(default = "default_momentum")]
    pub momentum: f64,
}

fn default_momentum() -> f64 {
    0.1
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BnFinalizeAttrs {
    #[serde(default = "default_epsilon")]
    pub epsilon: f64,
    #[serde(default = "default_momentum")]
    pub momentum: f64,
    /// Number of elements per channel the sums were taken over.
    pub accum_count: i64,
}

fn todo(ctx: &InferCtx) -> Result<()> {
    Err(crate::Error::NotSupported(format!("{}: not implemented yet", ctx.kind())))
}
pub(crate) fn infer_batchnorm(ctx: &mut InferCtx, _a: &BatchnormAttrs) -> Result<()> { todo(ctx) }
pub(crate) fn infer_batchnorm_inference(ctx: &mut InferCtx, _a: &NormAttrs) -> Result<()> { todo(ctx) }
pub(crate) fn infer_batchnorm_backward(ctx: &mut InferCtx, _a: &NormAttrs) -> Result<()> { todo(ctx) }
pub(crate) fn infer_genstats(ctx: &mut InferCtx, _a: &NormAttrs) -> Result<()> { todo(ctx) }
pub(crate) fn infer_bn_finalize(ctx: &mut InferCtx, _a: &BnFinalizeAttrs) -> Result<()> { todo(ctx) }
pub(crate) fn infer_layernorm(ctx: &mut InferCtx, _a: &NormAttrs) -> Result<()> { todo(ctx) }
pub(crate) fn infer_layernorm_backward(ctx: &mut InferCtx, _a: &NormAttrs) -> Result<()> { todo(ctx) }
pub(crate) fn infer_rmsnorm(ctx: &mut InferCtx, _a: &NormAttrs) -> Result<()> { todo(ctx) }
pub(crate) fn infer_rmsnorm_backward(ctx: &mut InferCtx, _a: &NormAttrs) -> Result<()> { todo(ctx) }
pub(crate) fn infer_instancenorm(ctx: &mut InferCtx, _a: &NormAttrs) -> Result<()> { todo(ctx) }
pub(crate) fn infer_instancenorm_backward(ctx: &mut InferCtx, _a: &NormAttrs) -> Result<()> { todo(ctx) }
pub(crate) fn infer_adalayernorm(ctx: &mut InferCtx, _a: &NormAttrs) -> Result<()> { todo(ctx) }
pub(crate) fn infer_adalayernorm_backward(ctx: &mut InferCtx, _a: &NormAttrs) -> Result<()> { todo(ctx) }
