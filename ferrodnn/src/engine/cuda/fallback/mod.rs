//! The generic fallback: a CUDA C++ kernel (or a few) generated for every node of any valid
//! graph, so that every graph that validates runs on the GPU. Faster engines take precedence
//! where they apply; this one stays as the one that always works.
//!
//! Conventions of the generated code (see the prelude, `kernel/prelude.cuh`):
//! - Every tensor reaches a kernel as a pointer plus a `TRef` (logical dims and strides in
//!   elements, rank) passed by value; every element is read through `ld_<type>` into `double`
//!   and written through `st_<type>`, which rounds as the CPU engine's `DataType::quantize`
//!   does (round to nearest even; fp8 and integers saturate; NaN to 0 in integers).
//! - Arithmetic is in `double`: the fallback favours agreement with the CPU reference over
//!   speed (the H100 runs f64 at a quarter of its f32 rate, which a fallback can afford).
//! - Indices are 64-bit; loops are grid-stride, so any launch size covers any tensor.
//! - A family file returns [`NodeKernels`]: launches in order, each naming its arguments by
//!   port ([`Arg`]), plus scratch buffers the plan carves out of the workspace.

mod conv;
mod matmul;
mod norm;
mod pointwise;
mod reduction;
mod resample;
mod rng;
mod sdpa;
mod softmax;
mod transform;

use crate::dtype::DataType;
use crate::engine::cuda::kernel::ctype::{self, c_double};
use crate::engine::cuda::kernel::{entry_name, Arg, Grid, Launch, NodeKernels};
use crate::error::{Error, Result};
use crate::graph::ops::Op;
use crate::graph::{Graph, Node, TensorId};

/// The tensor on an input port, or an error naming it.
pub fn input(node: &Node, port: &str) -> Result<TensorId> {
    node.input(port).ok_or_else(|| Error::op(node.op.kind(), &node.name, format!("input `{port}` is missing")))
}

/// The tensor on an output port, or an error naming it.
pub fn output(node: &Node, port: &str) -> Result<TensorId> {
    node.output(port).ok_or_else(|| Error::op(node.op.kind(), &node.name, format!("output `{port}` is missing")))
}

/// `v` as a C initializer list of `long long`s (`1LL, 2LL`).
pub fn c_list(v: &[i64]) -> String {
    v.iter().map(|x| format!("{x}LL")).collect::<Vec<_>>().join(", ")
}

/// The kernels of one node of a validated graph.
pub fn generate(graph: &Graph, node_index: usize) -> Result<NodeKernels> {
    let node = &graph.nodes[node_index];
    let ctx = Ctx { graph, node, index: node_index };
    match &node.op {
        Op::ConvFprop(a) => conv::fprop(&ctx, a),
        Op::ConvDgrad(a) => conv::dgrad(&ctx, a),
        Op::ConvWgrad(a) => conv::wgrad(&ctx, a),
        Op::Matmul(a) => matmul::matmul(&ctx, a),
        Op::Pointwise(a) => pointwise::pointwise(&ctx, a),
        Op::Reduction(a) => reduction::reduction(&ctx, a),
        Op::Batchnorm(a) => norm::batchnorm(&ctx, a),
        Op::BatchnormInference(a) => norm::batchnorm_inference(&ctx, a),
        Op::BatchnormBackward(a) => norm::batchnorm_backward(&ctx, a),
        Op::Genstats(a) => norm::genstats(&ctx, a),
        Op::BnFinalize(a) => norm::bn_finalize(&ctx, a),
        Op::Layernorm(a) => norm::layernorm(&ctx, a),
        Op::LayernormBackward(a) => norm::layernorm_backward(&ctx, a),
        Op::Rmsnorm(a) => norm::rmsnorm(&ctx, a),
        Op::RmsnormBackward(a) => norm::rmsnorm_backward(&ctx, a),
        Op::Instancenorm(a) => norm::instancenorm(&ctx, a),
        Op::InstancenormBackward(a) => norm::instancenorm_backward(&ctx, a),
        Op::Groupnorm(a) => norm::groupnorm(&ctx, a),
        Op::GroupnormBackward(a) => norm::groupnorm_backward(&ctx, a),
        Op::Adalayernorm(a) => norm::adalayernorm(&ctx, a),
        Op::AdalayernormBackward(a) => norm::adalayernorm_backward(&ctx, a),
        Op::Softmax(a) => softmax::softmax(&ctx, a),
        Op::SoftmaxBackward(a) => softmax::softmax_backward(&ctx, a),
        Op::Resample(a) => resample::resample(&ctx, a),
        Op::ResampleBackward(a) => resample::resample_backward(&ctx, a),
        Op::Sdpa(a) => sdpa::sdpa(&ctx, a),
        Op::SdpaBackward(a) => sdpa::sdpa_backward(&ctx, a),
        Op::Reshape(a) => transform::reshape(&ctx, a),
        Op::Transpose(a) => transform::transpose(&ctx, a),
        Op::Slice(a) => transform::slice(&ctx, a),
        Op::Concatenate(a) => transform::concatenate(&ctx, a),
        Op::Copy(a) => transform::copy(&ctx, a),
        Op::Rng(a) => rng::rng(&ctx, a),
        // The planner gives RNN nodes the RNN engine's standard kernels with double accumulators.
        Op::Rnn(_) | Op::RnnBackwardData(_) | Op::RnnBackwardWeights(_) => {
            Err(Error::op(node.op.kind(), &node.name, "internal: RNN nodes are planned by the RNN engine, not the fallback's generators"))
        }
    }
}

/// What a family's generator sees.
pub struct Ctx<'a> {
    pub graph: &'a Graph,
    pub node: &'a Node,
    /// The node's index in the graph (for unique kernel names).
    pub index: usize,
}

impl Ctx<'_> {
    pub fn input(&self, port: &str) -> Result<TensorId> {
        input(self.node, port)
    }
    pub fn output(&self, port: &str) -> Result<TensorId> {
        output(self.node, port)
    }
    pub fn ld(&self, id: TensorId) -> String {
        ctype::ld(self.graph, id)
    }
    pub fn st(&self, id: TensorId) -> String {
        ctype::st(self.graph, id)
    }
    pub fn entry(&self, what: &str) -> String {
        entry_name(self.index, what)
    }
    pub fn dims(&self, id: TensorId) -> Vec<i64> {
        self.graph.desc(id).dims.clone()
    }
    pub fn numel(&self, id: TensorId) -> u64 {
        self.graph.desc(id).element_count().max(0) as u64
    }
    pub fn data_type(&self, id: TensorId) -> DataType {
        ctype::dtype(self.graph, id)
    }
    pub fn err(&self, message: impl std::fmt::Display) -> Error {
        Error::op(self.node.op.kind(), &self.node.name, message)
    }
    /// A NotSupported error for a case the fallback does not generate.
    pub fn unsupported(&self, message: impl std::fmt::Display) -> Error {
        Error::NotSupported(format!("{} \"{}\": the CUDA fallback {message}", self.node.op.kind(), self.node.name))
    }
}
