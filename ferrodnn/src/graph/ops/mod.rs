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
pub mod rnn;
pub mod sdpa;
pub mod softmax;
pub mod transform;

use super::InferCtx;
use crate::dtype::DataType;
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
    Groupnorm(norm::GroupnormAttrs),
    GroupnormBackward(norm::GroupnormAttrs),
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
    Rnn(rnn::RnnDesc),
    RnnBackwardData(rnn::RnnDesc),
    RnnBackwardWeights(rnn::RnnDesc),
}

impl Op {
    /// The attributes this op may take from a by-value scalar on an input port of the same name
    /// (see `Graph::set_attribute_tensor`).
    pub fn attribute_ports(&self) -> &'static [&'static str] {
        match self {
            Op::Layernorm(_) | Op::Rmsnorm(_) | Op::Instancenorm(_) | Op::Groupnorm(_) | Op::Adalayernorm(_) => &["epsilon"],
            Op::Batchnorm(_) | Op::BnFinalize(_) => &["epsilon", "momentum"],
            Op::Sdpa(_) | Op::SdpaBackward(_) => &["attn_scale"],
            _ => &[],
        }
    }

    /// The ports whose tensors may be ragged (`TensorDesc::ragged_offset`): the attention ops'
    /// sequence tensors.
    pub fn ragged_ports(&self) -> &'static [&'static str] {
        match self {
            Op::Sdpa(_) => &sdpa::RAGGED_PORTS[..sdpa::FORWARD_RAGGED_PORTS],
            Op::SdpaBackward(_) => &sdpa::RAGGED_PORTS,
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
            Op::Groupnorm(_) => "groupnorm",
            Op::GroupnormBackward(_) => "groupnorm_backward",
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
            Op::Rnn(_) => "rnn",
            Op::RnnBackwardData(_) => "rnn_backward_data",
            Op::RnnBackwardWeights(_) => "rnn_backward_weights",
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
        "groupnorm",
        "groupnorm_backward",
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
        "rnn",
        "rnn_backward_data",
        "rnn_backward_weights",
    ]);
    names
}

/// Whether the node can compute in its compute type (the node's, else the graph's; the
/// default, f32 or f64, always can): bool never; fp8 only for matmul and convolution (whose
/// inputs it rounds to fp8); an integer type only on integer (or bool) inputs, for matmul,
/// convolution, reductions other than avg and norm2, and pointwise modes that map integers to
/// integers. Data movement (reshape, transpose, slice, concatenate, copy) takes any.
fn check_compute_type(ctx: &InferCtx) -> Result<()> {
    let node = ctx.node;
    let Some(ct) = node.compute_data_type.or(ctx.graph.compute_data_type) else { return Ok(()) };
    let op = &node.op;
    if matches!(op, Op::Reshape(_) | Op::Transpose(_) | Op::Slice(_) | Op::Concatenate(_) | Op::Copy(_)) {
        return Ok(());
    }
    let whose = if node.compute_data_type.is_some() { "the node's" } else { "the graph's" };
    let kind = op.kind();
    let fail = |why: String| Err(ctx.err(format!("compute_data_type {ct} ({whose}) cannot be used: {why}")));
    if ct == DataType::Bool {
        return fail(format!("{kind} does arithmetic, which bool cannot hold; use f32"));
    }
    let gemm_like = matches!(op, Op::Matmul(_) | Op::ConvFprop(_) | Op::ConvDgrad(_) | Op::ConvWgrad(_));
    if ct.is_fp8() && !gemm_like {
        return fail(format!("fp8 compute types are for matmul and convolution (their inputs rounded to fp8, sums in f32); {kind} computes in f16, bf16, f32 or f64"));
    }
    if ct.is_integer() {
        let closed = match op {
            Op::Matmul(_) | Op::ConvFprop(_) | Op::ConvDgrad(_) | Op::ConvWgrad(_) => true,
            Op::Pointwise(p) => p.mode.is_integer_closed(),
            Op::Reduction(r) => !matches!(r.mode, reduction::ReductionMode::Avg | reduction::ReductionMode::Norm2),
            _ => false,
        };
        if !closed {
            return fail(format!("{kind} gives fractional results, so it computes in f16, bf16, f32 or f64"));
        }
        for p in &node.inputs {
            if let Some(dt) = ctx.graph.resolved_data_type(p.tensor).filter(|dt| dt.is_float()) {
                let name = ctx.graph.get(p.tensor).map_or("?", |t| t.name.as_str());
                return fail(format!("input `{}` (tensor \"{name}\") is {dt}, and an integer compute type would round it to an integer; use a float compute type", p.name));
            }
        }
    }
    Ok(())
}

/// Infer a node's outputs and check its rules (dispatch to the op's own file).
pub(crate) fn infer(ctx: &mut InferCtx) -> Result<()> {
    check_compute_type(ctx)?;
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
        Op::Groupnorm(a) => norm::infer_groupnorm(ctx, a),
        Op::GroupnormBackward(a) => norm::infer_groupnorm_backward(ctx, a),
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
        Op::Rnn(a) => rnn::infer(ctx, a),
        Op::RnnBackwardData(a) => rnn::infer_backward_data(ctx, a),
        Op::RnnBackwardWeights(a) => rnn::infer_backward_weights(ctx, a),
    }
}
