//! The op set, one file per family. Each file holds the family's attributes, its builder
//! methods on [`Graph`](super::Graph), and its inference and validation (`infer`).
//!
//! Port names are fixed per op and documented on each builder method.

pub mod conv;
pub mod matmul;
pub mod norm;
pub mod pointwise;
pub mod reduction;
pub mod resample;
pub mod rng;
pub mod sdpa;
pub mod softmax;
pub mod transform;

use super::InferCtx;
use crate::error::Result;
use serde::{Deserialize, Serialize};

/// Every op of the graph API with its attributes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Op {
    ConvFprop(conv::ConvAttrs),
    ConvDgrad(conv::ConvAttrs),
    ConvWgrad(conv::ConvAttrs),
    Matmul(matmul::MatmulAttrs),
    Pointwise(pointwise::PointwiseAttrs),
    Reduction(reduction::ReductionAttrs),
    Batchnorm(norm::BatchnormAttrs),
    BatchnormInference(norm::NormAttrs),
    BatchnormBackward(norm::NormAttrs),
    Genstats(norm::NormAttrs),
    BnFinalize(norm::BnFinalizeAttrs),
    Layernorm(norm::NormAttrs),
    LayernormBackward(norm::NormAttrs),
    Rmsnorm(norm::NormAttrs),
    RmsnormBackward(norm::NormAttrs),
    Instancenorm(norm::NormAttrs),
    InstancenormBackward(norm::NormAttrs),
    Adalayernorm(norm::NormAttrs),
    AdalayernormBackward(norm::NormAttrs),
    Softmax(softmax::SoftmaxAttrs),
    SoftmaxBackward(softmax::SoftmaxAttrs),
    Resample(resample::ResampleAttrs),
    ResampleBackward(resample::ResampleAttrs),
    Sdpa(sdpa::SdpaAttrs),
    SdpaBackward(sdpa::SdpaAttrs),
    Reshape(transform::ReshapeAttrs),
    Transpose(transform::TransposeAttrs),
    Slice(transform::SliceAttrs),
    Concatenate(transform::ConcatenateAttrs),
    Copy(transform::CopyAttrs),
    Rng(rng::RngAttrs),
}

impl Op {
    /// The attributes this op may take from a by-value scalar on an input port of the same name
    /// (see `Graph::set_attribute_tensor`).
    pub fn attribute_ports(&self) -> &'static [&'static str] {
        match self {
            Op::Layernorm(_) | Op::Rmsnorm(_) | Op::Instancenorm(_) | Op::Adalayernorm(_) => &["epsilon"],
            Op::Batchnorm(_) | Op::BnFinalize(_) => &["epsilon", "momentum"],
            Op::Sdpa(_) | Op::SdpaBackward(_) => &["attn_scale"],
            _ => &[],
        }
    }

    /// The op's name as in cuDNN's graph API (pointwise ops by their mode: "add", "relu", ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Op::ConvFprop(_) => "conv_fprop",
            Op::ConvDgrad(_) => "conv_dgrad",
            Op::ConvWgrad(_) => "conv_wgrad",
            Op::Matmul(_) => "matmul",
            Op::Pointwise(p) => p.mode.name(),
            Op::Reduction(_) => "reduction",
            Op::Batchnorm(_) => "batchnorm",
            Op::BatchnormInference(_) => "batchnorm_inference",
            Op::BatchnormBackward(_) => "batchnorm_backward",
            Op::Genstats(_) => "genstats",
            Op::BnFinalize(_) => "bn_finalize",
            Op::Layernorm(_) => "layernorm",
            Op::LayernormBackward(_) => "layernorm_backward",
            Op::Rmsnorm(_) => "rmsnorm",
            Op::RmsnormBackward(_) => "rmsnorm_backward",
            Op::Instancenorm(_) => "instancenorm",
            Op::InstancenormBackward(_) => "instancenorm_backward",
            Op::Adalayernorm(_) => "adalayernorm",
            Op::AdalayernormBackward(_) => "adalayernorm_backward",
            Op::Softmax(s) => {
                if s.log {
                    "log_softmax"
                } else {
                    "softmax"
                }
            }
            Op::SoftmaxBackward(s) => {
                if s.log {
                    "log_softmax_backward"
                } else {
                    "softmax_backward"
                }
            }
            Op::Resample(_) => "resample",
            Op::ResampleBackward(_) => "resample_backward",
            Op::Sdpa(_) => "sdpa",
            Op::SdpaBackward(_) => "sdpa_backward",
            Op::Reshape(_) => "reshape",
            Op::Transpose(_) => "transpose",
            Op::Slice(_) => "slice",
            Op::Concatenate(_) => "concatenate",
            Op::Copy(_) => "copy",
            Op::Rng(_) => "rng",
        }
    }
}

/// Every op name the library knows, as `ferrodnn ops` lists them.
pub fn all_op_names() -> Vec<&'static str> {
    let mut names = vec!["conv_fprop", "conv_dgrad", "conv_wgrad", "matmul"];
    names.extend(pointwise::PointwiseMode::all_names());
    names.extend([
        "reduction",
        "batchnorm",
        "batchnorm_inference",
        "batchnorm_backward",
        "genstats",
        "bn_finalize",
        "layernorm",
        "layernorm_backward",
        "rmsnorm",
        "rmsnorm_backward",
        "instancenorm",
        "instancenorm_backward",
        "adalayernorm",
        "adalayernorm_backward",
        "softmax",
        "log_softmax",
        "softmax_backward",
        "resample",
        "resample_backward",
        "sdpa",
        "sdpa_backward",
        "reshape",
        "transpose",
        "slice",
        "concatenate",
        "copy",
        "rng",
    ]);
    names
}

/// Infer a node's outputs and check its rules (dispatch to the op's own file).
pub(crate) fn infer(ctx: &mut InferCtx) -> Result<()> {
    match &ctx.node.op {
        Op::ConvFprop(a) => conv::infer_fprop(ctx, a),
        Op::ConvDgrad(a) => conv::infer_dgrad(ctx, a),
        Op::ConvWgrad(a) => conv::infer_wgrad(ctx, a),
        Op::Matmul(a) => matmul::infer(ctx, a),
        Op::Pointwise(a) => pointwise::infer(ctx, a),
        Op::Reduction(a) => reduction::infer(ctx, a),
        Op::Batchnorm(a) => norm::infer_batchnorm(ctx, a),
        Op::BatchnormInference(a) => norm::infer_batchnorm_inference(ctx, a),
        Op::BatchnormBackward(a) => norm::infer_batchnorm_backward(ctx, a),
        Op::Genstats(a) => norm::infer_genstats(ctx, a),
        Op::BnFinalize(a) => norm::infer_bn_finalize(ctx, a),
        Op::Layernorm(a) => norm::infer_layernorm(ctx, a),
        Op::LayernormBackward(a) => norm::infer_layernorm_backward(ctx, a),
        Op::Rmsnorm(a) => norm::infer_rmsnorm(ctx, a),
        Op::RmsnormBackward(a) => norm::infer_rmsnorm_backward(ctx, a),
        Op::Instancenorm(a) => norm::infer_instancenorm(ctx, a),
        Op::InstancenormBackward(a) => norm::infer_instancenorm_backward(ctx, a),
        Op::Adalayernorm(a) => norm::infer_adalayernorm(ctx, a),
        Op::AdalayernormBackward(a) => norm::infer_adalayernorm_backward(ctx, a),
        Op::Softmax(a) => softmax::infer(ctx, a),
        Op::SoftmaxBackward(a) => softmax::infer_backward(ctx, a),
        Op::Resample(a) => resample::infer(ctx, a),
        Op::ResampleBackward(a) => resample::infer_backward(ctx, a),
        Op::Sdpa(a) => sdpa::infer(ctx, a),
        Op::SdpaBackward(a) => sdpa::infer_backward(ctx, a),
        Op::Reshape(a) => transform::infer_reshape(ctx, a),
        Op::Transpose(a) => transform::infer_transpose(ctx, a),
        Op::Slice(a) => transform::infer_slice(ctx, a),
        Op::Concatenate(a) => transform::infer_concatenate(ctx, a),
        Op::Copy(a) => transform::infer_copy(ctx, a),
        Op::Rng(a) => rng::infer(ctx, a),
    }
}
