//! The reference CPU engine ([`EngineKind::Reference`]): every op, every data type, any strides,
//! on all cores (rayon). The fast CPU engine ([`super::cpu_fast`]) runs the nodes it does not
//! take itself through this engine's code.
//!
//! It is the reference every other engine is checked against, so it is written for clarity:
//! each input is read into a dense row-major `f64` array ([`Nd`]), each op computes in `f64`,
//! and each result is rounded to its tensor's type (intermediates to the intermediate type,
//! f32 by default) before the next op reads it. It shares no code with any GPU kernel.
//!
//! A plan build refuses a graph whose dense arrays would not fit the host memory limit
//! (`FERRODNN_MAX_HOST_BYTES`, by default the machine's memory) or one of whose nodes would run
//! for hours (`FERRODNN_CPU_MAX_WORK`); see [`budget`]. Executions can be cancelled between
//! nodes ([`Plan::execute_cancellable`](crate::engine::Plan::execute_cancellable)).

pub mod budget;
mod conv;
mod matmul;
mod norm;
mod pointwise;
mod reduction;
mod resample;
mod rng;
mod rnn;
mod sdpa;
mod softmax;
mod transform;

pub use rng::philox4x32;

use super::{BehaviorNotes, Buffer, CancelToken, CompiledPlan, Engine, EngineKind, Knob, VariantPack};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::graph::ops::Op;
use crate::graph::{Graph, Node, TensorDesc, TensorId};
use crate::layout::{required_bytes, scatter, try_gather, Nd, Ragged};
use std::collections::HashMap;
use std::sync::Arc;

/// The CPU engine.
pub struct CpuEngine;

impl Engine for CpuEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Reference
    }
    fn supports(&self, _graph: &Graph) -> Result<()> {
        Ok(())
    }
    fn candidates(&self, _graph: &Graph) -> Vec<Vec<Knob>> {
        vec![Vec::new()]
    }
    fn behavior(&self, _graph: &Graph, _knobs: &[Knob]) -> BehaviorNotes {
        BehaviorNotes { runtime_compiled: false, deterministic: true, reduced_precision: false }
    }
    fn build(&self, graph: Arc<Graph>, _knobs: &[Knob]) -> Result<Box<dyn CompiledPlan>> {
        let order = graph.topological_order()?;
        budget::check(&graph)?;
        Ok(Box::new(CpuPlan { graph, order }))
    }
}

struct CpuPlan {
    graph: Arc<Graph>,
    order: Vec<usize>,
}

impl CompiledPlan for CpuPlan {
    fn workspace_size(&self) -> usize {
        0
    }

    fn execute(&self, pack: &mut VariantPack, workspace: Option<Buffer>) -> Result<()> {
        self.execute_cancellable(pack, workspace, &CancelToken::new())
    }

    fn execute_cancellable(&self, pack: &mut VariantPack, _workspace: Option<Buffer>, cancel: &CancelToken) -> Result<()> {
        let g = &*self.graph;
        check_pack(g, pack)?;
        let gname = || if g.name.is_empty() { "graph".to_string() } else { format!("graph \"{}\"", g.name) };
        let mut values: HashMap<usize, Nd> = HashMap::new();
        for &ni in &self.order {
            let node = &g.nodes[ni];
            cancel.check(|| format!("{}: before {} \"{}\"", gname(), node.op.kind(), node.name))?;
            for port in &node.inputs {
                if let std::collections::hash_map::Entry::Vacant(slot) = values.entry(port.tensor.0) {
                    slot.insert(load_port(g, node, &port.name, port.tensor, pack)?);
                }
            }
            let outputs = {
                let inputs = node.inputs.iter().filter_map(|p| values.get(&p.tensor.0).map(|nd| (p.name.clone(), nd))).collect();
                let mut io = NodeIo { graph: g, node, inputs, outputs: Vec::new() };
                exec_node(&mut io)?;
                io.outputs
            };
            cancel.check(|| format!("{}: after {} \"{}\"", gname(), node.op.kind(), node.name))?;
            for (port, mut nd) in outputs {
                let id = store_output(g, node, &port, &mut nd, pack)?;
                values.insert(id.0, nd);
            }
        }
        Ok(())
    }
}

/// A node's computed output `port`, as both CPU engines keep it: checked against the graph's
/// dims, rounded to the tensor's type, and written to its buffer unless it is virtual. Returns
/// the output's tensor.
pub(crate) fn store_output(g: &Graph, node: &Node, port: &str, nd: &mut Nd, pack: &mut VariantPack) -> Result<TensorId> {
    let id = node.output(port).ok_or_else(|| Error::op(node.op.kind(), &node.name, format!("the CPU engine produced output `{port}` that the node does not have")))?;
    let desc = g.desc(id);
    let dtype = g.resolved_data_type(id).unwrap_or(DataType::F32);
    let want: Vec<usize> = desc.dims.iter().map(|&d| d as usize).collect();
    if nd.dims != want {
        return Err(Error::op(node.op.kind(), &node.name, format!("internal: output `{port}` computed with dims {:?}, expected {want:?}", nd.dims)));
    }
    for v in &mut nd.data {
        *v = dtype.quantize(*v);
    }
    if !desc.is_virtual {
        let uid = desc.uid.unwrap_or_default();
        let ragged = ragged_of(g, node, port, pack)?;
        match pack.buffers.get_mut(&uid) {
            Some(Buffer::HostMut(bytes)) => match ragged {
                Some(r) => r.scatter(desc, dtype, nd, bytes).map_err(|m| ragged_err(node, port, desc, m))?,
                None => scatter(desc, dtype, nd, bytes),
            },
            _ => return Err(Error::InvalidArgument(format!("tensor \"{}\" (uid {uid}) is an output: pass it as a writable host buffer", desc.name))),
        }
    }
    Ok(id)
}

/// The ragged layout of the tensor on `port` of `node` (`TensorDesc::ragged_offset`, on the
/// node's port `ragged_<port>`), read from the variant pack, or `None` when it is not ragged.
pub(crate) fn ragged_of(g: &Graph, node: &Node, port: &str, pack: &VariantPack) -> Result<Option<Ragged>> {
    let Some(r) = node.input(&format!("{}{port}", crate::graph::RAGGED_PORT_PREFIX)) else { return Ok(None) };
    let lens_port = crate::graph::ops::sdpa::ragged_lengths_port(port);
    let lens = node.input(lens_port).ok_or_else(|| Error::op(node.op.kind(), &node.name, format!("`{port}` is ragged but input `{lens_port}` is missing")))?;
    Ok(Some(Ragged::new(&load_input(g, r, pack)?.data, &load_input(g, lens, pack)?.data)))
}

fn ragged_err(node: &Node, port: &str, desc: &TensorDesc, m: String) -> Error {
    Error::op(node.op.kind(), &node.name, format!("the ragged tensor on `{port}` (tensor \"{}\"): {m}", desc.name))
}

/// Input `port` of `node` as a dense array: [`load_input`], or the rows of a ragged tensor.
pub(crate) fn load_port(g: &Graph, node: &Node, port: &str, id: TensorId, pack: &VariantPack) -> Result<Nd> {
    let Some(r) = ragged_of(g, node, port, pack)? else { return load_input(g, id, pack) };
    let d = g.desc(id);
    let dtype = g.resolved_data_type(id).unwrap_or(DataType::F32);
    let uid = d.uid.unwrap_or_default();
    match pack.buffers.get(&uid) {
        Some(Buffer::Host(b)) => r.gather(d, dtype, b).map_err(|m| ragged_err(node, port, d, m)),
        Some(Buffer::HostMut(b)) => r.gather(d, dtype, b).map_err(|m| ragged_err(node, port, d, m)),
        _ => Err(Error::InvalidArgument(format!("tensor \"{}\" (uid {uid}) has no host buffer in the variant pack", d.name))),
    }
}

/// Whether tensor `id` is ragged on some port: its buffer's size depends on the offsets, which
/// the op checks when it reads or writes it.
pub(crate) fn is_ragged(g: &Graph, id: TensorId) -> bool {
    g.desc(id).ragged_offset.is_some()
}

/// Every non-virtual tensor has a host buffer large enough; the pack names no unknown uid.
pub(crate) fn check_pack(g: &Graph, pack: &VariantPack) -> Result<()> {
    let mut known = HashMap::new();
    for id in g.io_tensors() {
        let d = g.desc(id);
        let uid = d.uid.unwrap_or_default();
        known.insert(uid, id);
        let buf =
            pack.buffers.get(&uid).ok_or_else(|| Error::InvalidArgument(format!("graph \"{}\": tensor \"{}\" (uid {uid}) has no buffer in the variant pack", g.name, d.name)))?;
        let dtype = g.resolved_data_type(id).unwrap_or(DataType::F32);
        let need = required_bytes(d, dtype);
        if let Buffer::Device { .. } = buf {
            return Err(Error::InvalidArgument(format!("tensor \"{}\" (uid {uid}): the CPU engine needs host buffers, but a device pointer was given", d.name)));
        }
        if buf.len() < need && !is_ragged(g, id) {
            return Err(Error::InvalidArgument(format!(
                "tensor \"{}\" (uid {uid}): buffer is {} bytes but dims {:?} with strides {:?} of {dtype} need {need}",
                d.name,
                buf.len(),
                d.dims,
                d.strides
            )));
        }
    }
    for uid in pack.buffers.keys() {
        if !known.contains_key(uid) {
            return Err(Error::InvalidArgument(format!("graph \"{}\": the variant pack has uid {uid}, which no non-virtual tensor of the graph has", g.name)));
        }
    }
    Ok(())
}

pub(crate) fn load_input(g: &Graph, id: TensorId, pack: &VariantPack) -> Result<Nd> {
    let d = g.desc(id);
    let dtype = g.resolved_data_type(id).unwrap_or(DataType::F32);
    let dims: Vec<usize> = d.dims.iter().map(|&x| x as usize).collect();
    if let (true, Some(v)) = (d.is_pass_by_value, d.value) {
        return Ok(Nd::filled(&dims, dtype.quantize(v)));
    }
    if d.is_virtual {
        return Err(Error::InvalidGraph(format!("tensor \"{}\" is virtual but nothing produced it before it was read", d.name)));
    }
    let uid = d.uid.unwrap_or_default();
    match pack.buffers.get(&uid) {
        Some(Buffer::Host(b)) => try_gather(d, dtype, b),
        Some(Buffer::HostMut(b)) => try_gather(d, dtype, b),
        _ => Err(Error::InvalidArgument(format!("tensor \"{}\" (uid {uid}) has no host buffer in the variant pack", d.name))),
    }
}

/// What one op's CPU code sees: its node, its inputs as dense arrays by port, and where to put
/// its outputs.
pub(crate) struct NodeIo<'a> {
    pub graph: &'a Graph,
    pub node: &'a Node,
    pub inputs: HashMap<String, &'a Nd>,
    pub outputs: Vec<(String, Nd)>,
}

#[allow(dead_code)]
impl NodeIo<'_> {
    pub fn input(&self, port: &str) -> Result<&Nd> {
        self.inputs.get(port).copied().ok_or_else(|| Error::op(self.node.op.kind(), &self.node.name, format!("input `{port}` is missing")))
    }
    pub fn opt_input(&self, port: &str) -> Option<&Nd> {
        self.inputs.get(port).copied()
    }
    /// An attribute: the value of the by-value scalar on input `port` when one is connected (see
    /// `InferCtx::scalar_attribute`), else the node's own `value`.
    pub fn attribute(&self, port: &str, value: f64) -> f64 {
        self.opt_input(port).and_then(|nd| nd.data.first().copied()).unwrap_or(value)
    }
    pub fn has_output(&self, port: &str) -> bool {
        self.node.output(port).is_some()
    }
    /// The descriptor of an output (its inferred dims, strides, type).
    pub fn output_desc(&self, port: &str) -> Option<&TensorDesc> {
        self.node.output(port).map(|id| self.graph.desc(id))
    }
    /// The dims of an output as `usize`.
    pub fn output_dims(&self, port: &str) -> Result<Vec<usize>> {
        let d = self.output_desc(port).ok_or_else(|| Error::op(self.node.op.kind(), &self.node.name, format!("output `{port}` is missing")))?;
        Ok(d.dims.iter().map(|&x| x as usize).collect())
    }
    /// The resolved type of an output.
    pub fn output_type(&self, port: &str) -> DataType {
        self.node.output(port).and_then(|id| self.graph.resolved_data_type(id)).unwrap_or(DataType::F32)
    }
    /// The type of an input.
    pub fn input_type(&self, port: &str) -> DataType {
        self.node.input(port).and_then(|id| self.graph.resolved_data_type(id)).unwrap_or(DataType::F32)
    }
    /// The type the op computes in.
    pub fn compute_type(&self) -> DataType {
        self.graph.compute_type(self.node)
    }
    /// Set an output, if the node has that port (optional outputs are skipped).
    pub fn set(&mut self, port: &str, nd: Nd) {
        if self.has_output(port) {
            self.outputs.push((port.to_string(), nd));
        }
    }
    pub fn err(&self, message: impl std::fmt::Display) -> Error {
        Error::op(self.node.op.kind(), &self.node.name, message)
    }
}

pub(crate) fn exec_node(io: &mut NodeIo) -> Result<()> {
    let op = io.node.op.clone();
    match &op {
        Op::ConvFprop(a) => conv::fprop(io, a),
        Op::ConvDgrad(a) => conv::dgrad(io, a),
        Op::ConvWgrad(a) => conv::wgrad(io, a),
        Op::Matmul(a) => matmul::matmul(io, a),
        Op::Pointwise(a) => pointwise::pointwise(io, a),
        Op::Reduction(a) => reduction::reduction(io, a),
        Op::Batchnorm(a) => norm::batchnorm(io, a),
        Op::BatchnormInference(a) => norm::batchnorm_inference(io, a),
        Op::BatchnormBackward(a) => norm::batchnorm_backward(io, a),
        Op::Genstats(a) => norm::genstats(io, a),
        Op::BnFinalize(a) => norm::bn_finalize(io, a),
        Op::Layernorm(a) => norm::layernorm(io, a),
        Op::LayernormBackward(a) => norm::layernorm_backward(io, a),
        Op::Rmsnorm(a) => norm::rmsnorm(io, a),
        Op::RmsnormBackward(a) => norm::rmsnorm_backward(io, a),
        Op::Instancenorm(a) => norm::instancenorm(io, a),
        Op::InstancenormBackward(a) => norm::instancenorm_backward(io, a),
        Op::Groupnorm(a) => norm::groupnorm(io, a),
        Op::GroupnormBackward(a) => norm::groupnorm_backward(io, a),
        Op::Adalayernorm(a) => norm::adalayernorm(io, a),
        Op::AdalayernormBackward(a) => norm::adalayernorm_backward(io, a),
        Op::Softmax(a) => softmax::softmax(io, a),
        Op::SoftmaxBackward(a) => softmax::softmax_backward(io, a),
        Op::Resample(a) => resample::resample(io, a),
        Op::ResampleBackward(a) => resample::resample_backward(io, a),
        Op::Sdpa(a) => sdpa::sdpa(io, a),
        Op::SdpaBackward(a) => sdpa::sdpa_backward(io, a),
        Op::Reshape(a) => transform::reshape(io, a),
        Op::Transpose(a) => transform::transpose(io, a),
        Op::Slice(a) => transform::slice(io, a),
        Op::Concatenate(a) => transform::concatenate(io, a),
        Op::Copy(a) => transform::copy(io, a),
        Op::Rng(a) => rng::rng(io, a),
        Op::Rnn(a) => rnn::forward(io, a),
        Op::RnnBackwardData(a) => rnn::backward_data(io, a),
        Op::RnnBackwardWeights(a) => rnn::backward_weights(io, a),
    }
}
