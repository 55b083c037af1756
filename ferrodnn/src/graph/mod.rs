//! The operation graph: tensors, ops as nodes, the builder (one method per op, in the op's own
//! file under `ops/`), shape and type inference, validation, JSON and the graph key.
//!
//! This layer knows nothing of engines or devices.
//!
//! ```
//! use ferrodnn::{DataType, Graph, TensorDesc};
//! use ferrodnn::graph::ops::pointwise::PointwiseMode;
//! let mut g = Graph::new("example").io_data_type(DataType::F32);
//! let x = g.tensor(TensorDesc::new("x", &[2, 3], DataType::F32));
//! let y = g.pointwise(PointwiseMode::Relu { lower_clip: None, upper_clip: None, negative_slope: None }, &[x]);
//! g.set_output(y);
//! g.validate().unwrap();
//! assert_eq!(g.desc(y).dims, vec![2, 3]);
//! ```

pub mod ops;
pub mod overrides;
pub mod serialize;
pub mod tensor;

use crate::dtype::DataType;
use crate::error::{Error, Result};
use ops::Op;
pub use overrides::ShapeOverrides;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
pub use tensor::{packed_strides, stride_order, strides_for_order, TensorDesc, TensorId, MAX_RANK};

/// Largest number of elements a single tensor may have (2^48): sizes past this are refused
/// before anything is allocated.
pub const MAX_ELEMENTS: i64 = 1 << 48;

/// The input port that carries the ragged offsets of a node's port `p` is `ragged_<p>` (see
/// [`Graph::attach_ragged_offsets`]).
pub const RAGGED_PORT_PREFIX: &str = "ragged_";

/// A named connection of a node to a tensor ("x", "w", "y", ...).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Port {
    pub name: String,
    pub tensor: TensorId,
}

/// One op of the graph with its inputs and outputs by port name.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Node {
    pub name: String,
    pub op: Op,
    pub inputs: Vec<Port>,
    pub outputs: Vec<Port>,
    /// The type arithmetic is done in; unset means the graph's compute type (f32 by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_data_type: Option<DataType>,
}

impl Node {
    /// The by-value scalar tensors that may give a node's attributes, by port (see
    /// [`InferCtx::scalar_attribute`]).
    pub const ATTRIBUTE_PORTS: [&'static str; 3] = ["epsilon", "momentum", "attn_scale"];

    /// The tensors that give this node's attributes (those of [`Op::attribute_ports`] among
    /// `epsilon`, `momentum`, `attn_scale`), by port. A port of another op's attribute is no
    /// attribute here (validation refuses it as a port the op does not read).
    pub fn attribute_inputs(&self) -> impl Iterator<Item = (&str, TensorId)> {
        let own = self.op.attribute_ports();
        self.inputs.iter().filter(move |p| own.contains(&p.name.as_str())).map(|p| (p.name.as_str(), p.tensor))
    }

    /// What a value of attribute `port` must be, as an error message when `v` is not (epsilon
    /// positive and finite, momentum in [0, 1], the attention scale finite). Validation applies it
    /// to the attributes and the values the graph holds; executing a plan, to the values of the
    /// variant pack.
    pub fn attribute_rule(port: &str, v: f64) -> Option<String> {
        let ok = match port {
            "epsilon" => v.is_finite() && v > 0.0,
            "momentum" => (0.0..=1.0).contains(&v),
            "attn_scale" => v.is_finite(),
            _ => true,
        };
        let must = match port {
            "epsilon" => "positive and finite",
            "momentum" => "in [0, 1]",
            _ => "finite",
        };
        (!ok).then(|| format!("{port} must be {must}, got {v}"))
    }

    /// Check the values that execution gives the node's attribute ports: `value` reads a port
    /// tensor's value (None: the graph holds it, or the buffer is missing, which the engine
    /// reports).
    pub fn check_attribute_values(&self, value: impl Fn(TensorId) -> Option<f64>) -> Result<()> {
        for (port, t) in self.attribute_inputs() {
            if let Some(msg) = value(t).and_then(|v| Node::attribute_rule(port, v)) {
                return Err(Error::InvalidArgument(format!("{} \"{}\": {msg} (from the variant pack)", self.op.kind(), self.name)));
            }
        }
        Ok(())
    }

    pub fn input(&self, port: &str) -> Option<TensorId> {
        self.inputs.iter().find(|p| p.name == port).map(|p| p.tensor)
    }
    pub fn output(&self, port: &str) -> Option<TensorId> {
        self.outputs.iter().find(|p| p.name == port).map(|p| p.tensor)
    }
}

/// An operation graph.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Graph {
    #[serde(default)]
    pub name: String,
    /// Type of non-virtual tensors that leave it unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_data_type: Option<DataType>,
    /// Type of virtual tensors that leave it unset (f32 by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intermediate_data_type: Option<DataType>,
    /// Type ops compute in when they leave it unset (f32 by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_data_type: Option<DataType>,
    #[serde(default)]
    pub tensors: Vec<TensorDesc>,
    #[serde(default)]
    pub nodes: Vec<Node>,
}

impl Graph {
    pub fn new(name: impl Into<String>) -> Graph {
        Graph { name: name.into(), io_data_type: None, intermediate_data_type: None, compute_data_type: None, tensors: Vec::new(), nodes: Vec::new() }
    }

    pub fn io_data_type(mut self, dt: DataType) -> Graph {
        self.io_data_type = Some(dt);
        self
    }
    pub fn intermediate_data_type(mut self, dt: DataType) -> Graph {
        self.intermediate_data_type = Some(dt);
        self
    }
    pub fn compute_data_type(mut self, dt: DataType) -> Graph {
        self.compute_data_type = Some(dt);
        self
    }

    /// Add an input tensor (or a by-value scalar) and return its handle.
    pub fn tensor(&mut self, desc: TensorDesc) -> TensorId {
        self.tensors.push(desc);
        TensorId(self.tensors.len() - 1)
    }

    /// A by-value f32 scalar constant.
    pub fn scalar(&mut self, name: &str, value: f64) -> TensorId {
        self.tensor(TensorDesc::scalar(name, value, DataType::F32))
    }

    /// The descriptor of a tensor. Panics only on a handle from another graph; use
    /// [`Graph::get`] for a checked lookup.
    pub fn desc(&self, id: TensorId) -> &TensorDesc {
        &self.tensors[id.0]
    }

    pub fn get(&self, id: TensorId) -> Option<&TensorDesc> {
        self.tensors.get(id.0)
    }

    /// Mutable access to a tensor, to override what inference would set (dims, strides, type,
    /// uid, name).
    pub fn desc_mut(&mut self, id: TensorId) -> &mut TensorDesc {
        &mut self.tensors[id.0]
    }

    /// Mark an op's output as a graph output: it gets a buffer in the variant pack.
    pub fn set_output(&mut self, id: TensorId) -> TensorId {
        if let Some(t) = self.tensors.get_mut(id.0) {
            t.is_virtual = false;
        }
        id
    }

    /// Give attribute `port` (`epsilon`, `momentum` or `attn_scale`) of the node that produces
    /// `output` by the by-value scalar `scalar`, as the cudnn frontend takes them: a runtime
    /// scalar ([`TensorDesc::runtime_scalar`]) gets its value from each execution's variant pack,
    /// so one plan serves every value. Validation checks the port belongs to the op.
    ///
    /// ```
    /// use ferrodnn::graph::ops::norm::NormAttrs;
    /// use ferrodnn::{DataType, Graph, TensorDesc};
    /// let f = DataType::F32;
    /// let mut g = Graph::new("ln").io_data_type(f);
    /// let x = g.tensor(TensorDesc::new("x", &[4, 8], f));
    /// let s = g.tensor(TensorDesc::new("s", &[1, 8], f));
    /// let b = g.tensor(TensorDesc::new("b", &[1, 8], f));
    /// let eps = g.tensor(TensorDesc::runtime_scalar("eps", f));
    /// let (y, _, _) = g.layernorm(x, s, b, NormAttrs::inference());
    /// g.set_output(y);
    /// g.set_attribute_tensor(y, "epsilon", eps).unwrap();
    /// g.validate().unwrap();
    /// ```
    pub fn set_attribute_tensor(&mut self, output: TensorId, port: &str, scalar: TensorId) -> Result<()> {
        if !Node::ATTRIBUTE_PORTS.contains(&port) {
            return Err(Error::InvalidArgument(format!("`{port}` is not an attribute given by a tensor (those are {})", Node::ATTRIBUTE_PORTS.join(", "))));
        }
        let node =
            self.nodes.iter_mut().find(|n| n.outputs.iter().any(|p| p.tensor == output)).ok_or_else(|| Error::InvalidArgument(format!("no node produces tensor {}", output.0)))?;
        let own = node.op.attribute_ports();
        if !own.contains(&port) {
            let takes = if own.is_empty() { "takes no attribute from a tensor".to_string() } else { format!("takes only {} from a tensor", own.join(", ")) };
            return Err(Error::op(node.op.kind(), &node.name, format!("has no attribute port `{port}`: it {takes}")));
        }
        node.inputs.retain(|p| p.name != port);
        node.inputs.push(Port { name: port.to_string(), tensor: scalar });
        Ok(())
    }

    /// The uid of a tensor (assigned by `validate` when the user set none).
    pub fn uid(&self, id: TensorId) -> Option<i64> {
        self.get(id).and_then(|t| t.uid)
    }

    /// Find a tensor by name.
    pub fn find(&self, name: &str) -> Option<TensorId> {
        self.tensors.iter().position(|t| t.name == name).map(TensorId)
    }

    /// Add a node, creating its output tensors (virtual, dims to be inferred), and infer what
    /// can be inferred now. Errors are kept for `validate`, so builder calls never fail.
    pub(crate) fn add_node(&mut self, op: Op, name: Option<&str>, inputs: Vec<(&str, TensorId)>, outputs: &[&str]) -> Vec<TensorId> {
        let index = self.nodes.len();
        let node_name = name.map(str::to_string).unwrap_or_else(|| format!("{}_{}", op.kind(), index));
        let mut out_ports = Vec::new();
        let mut ids = Vec::new();
        for &port in outputs {
            let id = self.tensor(TensorDesc {
                uid: None,
                name: format!("{node_name}::{port}"),
                dims: Vec::new(),
                strides: Vec::new(),
                data_type: None,
                is_virtual: true,
                is_pass_by_value: false,
                value: None,
                ragged_offset: None,
            });
            out_ports.push(Port { name: port.to_string(), tensor: id });
            ids.push(id);
        }
        self.nodes.push(Node {
            name: node_name,
            op,
            inputs: inputs.into_iter().map(|(n, t)| Port { name: n.to_string(), tensor: t }).collect(),
            outputs: out_ports,
            compute_data_type: None,
        });
        let _ = self.infer_node(index);
        ids
    }

    /// Set the dims of an output the op cannot infer (conv_dgrad's dx, reshape's y, rng's y)
    /// and infer the rest of the last node again. Builder methods use it.
    pub(crate) fn set_dims_and_reinfer(&mut self, id: TensorId, dims: &[i64]) {
        if let Some(t) = self.tensors.get_mut(id.0) {
            t.dims = dims.to_vec();
        }
        if !self.nodes.is_empty() {
            let _ = self.infer_node(self.nodes.len() - 1);
        }
    }

    /// Name the most recently added node (builder convenience: `g.named("conv1")`).
    pub fn named(&mut self, name: &str) -> &mut Graph {
        if let Some(n) = self.nodes.last_mut() {
            n.name = name.to_string();
        }
        self
    }

    /// The type a tensor resolves to: its own, else the graph's intermediate (virtual) or io
    /// type.
    pub fn resolved_data_type(&self, id: TensorId) -> Option<DataType> {
        let t = self.get(id)?;
        t.data_type.or(if t.is_virtual { self.intermediate_data_type.or(Some(DataType::F32)) } else { self.io_data_type })
    }

    /// The type a node computes in.
    pub fn compute_type(&self, node: &Node) -> DataType {
        node.compute_data_type.or(self.compute_data_type).unwrap_or_else(|| {
            // An f64 graph computes in f64 unless told otherwise.
            let any_f64 = node.inputs.iter().chain(&node.outputs).any(|p| self.resolved_data_type(p.tensor) == Some(DataType::F64));
            if any_f64 {
                DataType::F64
            } else {
                DataType::F32
            }
        })
    }

    fn infer_node(&mut self, index: usize) -> Result<()> {
        let node = self.nodes[index].clone();
        let mut ctx = InferCtx { graph: self, node: &node, described: Vec::new(), read: RefCell::new(Vec::new()) };
        ops::infer(&mut ctx)?;
        // A connected input the op never reads would be silently ignored (a misspelt port, or
        // one this op's attributes leave unused).
        if let Some(p) = node.inputs.iter().find(|p| !ctx.read.borrow().contains(&p.name)) {
            let mut known: Vec<String> = Vec::new();
            for k in ctx.read.borrow().iter() {
                if !known.contains(k) {
                    known.push(k.clone());
                }
            }
            let known: Vec<String> = known.iter().map(|k| format!("`{k}`")).collect();
            return Err(Error::op(
                node.op.kind(),
                &node.name,
                format!("has no input port `{}` (tensor \"{}\"); its input ports are {}", p.name, self.tensors.get(p.tensor.0).map_or("?", |t| t.name.as_str()), known.join(", ")),
            ));
        }
        // A connected output the op does not produce would never be written.
        if let Some(p) = node.outputs.iter().find(|p| !ctx.described.contains(&p.name)) {
            let mut known = ctx.described.clone();
            known.dedup();
            let known: Vec<String> = known.iter().map(|k| format!("`{k}`")).collect();
            return Err(Error::op(
                node.op.kind(),
                &node.name,
                format!(
                    "has no output port `{}` (tensor \"{}\"); its outputs here are {}",
                    p.name,
                    self.tensors.get(p.tensor.0).map_or("?", |t| t.name.as_str()),
                    known.join(", ")
                ),
            ));
        }
        Ok(())
    }

    /// Connect each ragged tensor's offsets (`TensorDesc::ragged_offset`) to the nodes that
    /// read or write it, as the input port `ragged_<port>` (so that engines see them, and the
    /// variant pack must hold them). Idempotent; `validate` calls it first. A ragged tensor on a
    /// port that takes none is an error.
    pub fn attach_ragged_offsets(&mut self) -> Result<()> {
        for ni in 0..self.nodes.len() {
            let node = &self.nodes[ni];
            let mut ports = Vec::new();
            for p in node.inputs.iter().chain(&node.outputs) {
                if p.name.starts_with(RAGGED_PORT_PREFIX) {
                    continue;
                }
                let Some(t) = self.tensors.get(p.tensor.0) else { continue };
                let Some(r) = t.ragged_offset else { continue };
                if r.0 >= self.tensors.len() {
                    return Err(Error::InvalidGraph(format!("tensor \"{}\": its ragged offsets are tensor #{}, but the graph has {} tensors", t.name, r.0, self.tensors.len())));
                }
                if !node.op.ragged_ports().contains(&p.name.as_str()) {
                    return Err(Error::op(
                        node.op.kind(),
                        &node.name,
                        format!(
                            "port `{}` (tensor \"{}\") has ragged offsets (tensor \"{}\"), but only the attention ops' sequence tensors (sdpa's q, k, v, o, stats, score_max, score_sum_exp and the gradients) may be ragged",
                            p.name, t.name, self.tensors[r.0].name
                        ),
                    ));
                }
                ports.push(Port { name: format!("{RAGGED_PORT_PREFIX}{}", p.name), tensor: r });
            }
            let node = &mut self.nodes[ni];
            node.inputs.retain(|p| !p.name.starts_with(RAGGED_PORT_PREFIX));
            node.inputs.extend(ports);
        }
        Ok(())
    }

    /// Infer every unset shape and type, then check the whole graph: structure (ports, cycles,
    /// producers), every op's rules, strides, sizes and uids. Assigns uids to tensors that have
    /// none. Returns the first error found.
    pub fn validate(&mut self) -> Result<()> {
        let gname = if self.name.is_empty() { "graph".to_string() } else { format!("graph \"{}\"", self.name) };
        if self.nodes.is_empty() {
            return Err(Error::InvalidGraph(format!("{gname} has no operations")));
        }
        self.attach_ragged_offsets()?;
        // Ports must point at tensors of this graph, and each tensor has at most one producer.
        let mut producer: HashMap<usize, usize> = HashMap::new();
        for (ni, node) in self.nodes.iter().enumerate() {
            let kind = node.op.kind();
            if node.outputs.is_empty() {
                return Err(Error::op(kind, &node.name, "has no output ports: an op must write at least one tensor"));
            }
            for (side, ports) in [("input", &node.inputs), ("output", &node.outputs)] {
                if let Some((i, p)) = ports.iter().enumerate().find(|(i, p)| ports[..*i].iter().any(|q| q.name == p.name)) {
                    let first = ports[..i].iter().find(|q| q.name == p.name).map_or(p.tensor, |q| q.tensor);
                    let name = |t: TensorId| self.tensors.get(t.0).map_or("?", |t| t.name.as_str());
                    return Err(Error::op(
                        kind,
                        &node.name,
                        format!("{side} port `{}` is connected twice (tensors \"{}\" and \"{}\"); each port takes one tensor", p.name, name(first), name(p.tensor)),
                    ));
                }
            }
            for p in node.inputs.iter().chain(&node.outputs) {
                if p.tensor.0 >= self.tensors.len() {
                    return Err(Error::op(kind, &node.name, format!("port `{}` refers to tensor #{} but the graph has {} tensors", p.name, p.tensor.0, self.tensors.len())));
                }
            }
            for p in &node.outputs {
                if let Some(&other) = producer.get(&p.tensor.0) {
                    return Err(Error::op(
                        kind,
                        &node.name,
                        format!("output `{}` (tensor \"{}\") is already produced by op \"{}\"", p.name, self.tensors[p.tensor.0].name, self.nodes[other].name),
                    ));
                }
                producer.insert(p.tensor.0, ni);
                let t = &self.tensors[p.tensor.0];
                if t.is_pass_by_value {
                    return Err(Error::op(kind, &node.name, format!("output `{}` (tensor \"{}\") is a by-value scalar; an op cannot write one", p.name, t.name)));
                }
            }
        }
        let order = self.topological_order()?;
        // Inputs with no producer are graph inputs: they must be described fully.
        for node in &self.nodes {
            for p in &node.inputs {
                if !producer.contains_key(&p.tensor.0) {
                    let t = &self.tensors[p.tensor.0];
                    let kind = node.op.kind();
                    if t.is_virtual {
                        return Err(Error::op(kind, &node.name, format!("input `{}` (tensor \"{}\") is virtual but no op produces it", p.name, t.name)));
                    }
                    if t.dims.is_empty() {
                        return Err(Error::op(kind, &node.name, format!("input `{}` (tensor \"{}\") has no dims", p.name, t.name)));
                    }
                    if self.resolved_data_type(p.tensor).is_none() {
                        return Err(Error::op(kind, &node.name, format!("input `{}` (tensor \"{}\") has no data type and the graph sets no io_data_type", p.name, t.name)));
                    }
                }
            }
        }
        // Check every input tensor's own description before the ops read it. Inputs are only
        // read, so, as in cuDNN, their strides may make elements share memory (stride 0,
        // expanded, transposed and overlapping views).
        for (i, t) in self.tensors.iter().enumerate() {
            if !producer.contains_key(&i) && !t.dims.is_empty() {
                check_tensor_desc(t)?;
            }
        }
        for &ni in &order {
            self.infer_node(ni)?;
        }
        // What an op writes (outputs and virtual tensors) must give each element its own memory.
        for (i, t) in self.tensors.iter().enumerate() {
            if let Some(&ni) = producer.get(&i) {
                check_tensor_desc(t)?;
                // A ragged tensor's batches start where its offsets say, not at its batch
                // stride (THD tensors give it as the row stride): one batch's view must not overlap.
                let one_batch;
                let view = if t.ragged_offset.is_some() && !t.dims.is_empty() {
                    one_batch = TensorDesc { dims: std::iter::once(1).chain(t.dims[1..].iter().copied()).collect(), ..t.clone() };
                    &one_batch
                } else {
                    t
                };
                check_no_overlap(view).map_err(|m| Error::op(self.nodes[ni].op.kind(), &self.nodes[ni].name, m))?;
            }
        }
        if !producer.keys().any(|&t| !self.tensors[t].is_virtual) {
            return Err(Error::InvalidGraph(format!(
                "{gname}: every op output is virtual, so executing it would compute nothing; mark the tensors you want with set_output (is_virtual false)"
            )));
        }
        self.assign_uids()?;
        Ok(())
    }

    fn assign_uids(&mut self) -> Result<()> {
        let mut seen: HashMap<i64, usize> = HashMap::new();
        for (i, t) in self.tensors.iter().enumerate() {
            if let Some(uid) = t.uid {
                if let Some(&j) = seen.get(&uid) {
                    return Err(Error::InvalidGraph(format!("tensors \"{}\" and \"{}\" share uid {uid}; uids must be unique", self.tensors[j].name, t.name)));
                }
                seen.insert(uid, i);
            }
        }
        // Automatic uids count up from the largest user uid; one past i64::MAX does not exist.
        let (top, top_name) =
            self.tensors.iter().filter_map(|t| t.uid.map(|u| (u, t.name.as_str()))).max_by_key(|&(u, _)| u).map_or((0, String::new()), |(u, n)| (u, n.to_string()));
        let mut next = top.max(0).checked_add(1);
        for i in 0..self.tensors.len() {
            if self.tensors[i].uid.is_none() {
                let uid = next.ok_or_else(|| {
                    Error::InvalidGraph(format!(
                        "tensor \"{}\" needs an automatic uid, but they count up from the largest uid given, {top} (tensor \"{top_name}\"), and none is left above it; give smaller uids or set this tensor's",
                        self.tensors[i].name
                    ))
                })?;
                self.tensors[i].uid = Some(uid);
                next = uid.checked_add(1);
            }
        }
        Ok(())
    }

    /// The nodes reading each tensor, by tensor index (each node once, in node order); tensors
    /// no node reads are absent.
    pub fn consumers(&self) -> HashMap<usize, Vec<usize>> {
        let mut m: HashMap<usize, Vec<usize>> = HashMap::new();
        for (ni, node) in self.nodes.iter().enumerate() {
            for p in &node.inputs {
                let v = m.entry(p.tensor.0).or_default();
                if !v.contains(&ni) {
                    v.push(ni);
                }
            }
        }
        m
    }

    /// Node indices in an order where each node comes after the producers of its inputs.
    pub fn topological_order(&self) -> Result<Vec<usize>> {
        let mut producer: HashMap<usize, usize> = HashMap::new();
        for (ni, node) in self.nodes.iter().enumerate() {
            for p in &node.outputs {
                producer.insert(p.tensor.0, ni);
            }
        }
        // 0 = unvisited, 1 = on the stack, 2 = done.
        let mut state = vec![0u8; self.nodes.len()];
        let mut order = Vec::with_capacity(self.nodes.len());
        for start in 0..self.nodes.len() {
            if state[start] != 0 {
                continue;
            }
            let mut stack: Vec<(usize, usize)> = vec![(start, 0)];
            state[start] = 1;
            while let Some(&mut (n, ref mut next_input)) = stack.last_mut() {
                let inputs = &self.nodes[n].inputs;
                if *next_input < inputs.len() {
                    let t = inputs[*next_input].tensor.0;
                    *next_input += 1;
                    if let Some(&p) = producer.get(&t) {
                        match state[p] {
                            0 => {
                                state[p] = 1;
                                stack.push((p, 0));
                            }
                            1 => {
                                return Err(Error::InvalidGraph(format!(
                                    "{} \"{}\": the graph has a cycle through tensor \"{}\"",
                                    self.nodes[n].op.kind(),
                                    self.nodes[n].name,
                                    self.tensors.get(t).map(|x| x.name.as_str()).unwrap_or("?")
                                )))
                            }
                            _ => {}
                        }
                    }
                } else {
                    state[n] = 2;
                    order.push(n);
                    stack.pop();
                }
            }
        }
        Ok(order)
    }

    /// Tensors that need a buffer in the variant pack: non-virtual, not a constant by-value.
    pub fn io_tensors(&self) -> Vec<TensorId> {
        self.tensors.iter().enumerate().filter(|(_, t)| !t.is_virtual && !(t.is_pass_by_value && t.value.is_some())).map(|(i, _)| TensorId(i)).collect()
    }

    /// Tensors no op produces (the graph's inputs), in index order.
    pub fn input_tensors(&self) -> Vec<TensorId> {
        let produced = self.produced();
        let mut used: Vec<usize> = self.nodes.iter().flat_map(|n| n.inputs.iter().map(|p| p.tensor.0)).filter(|t| !produced.contains_key(t)).collect();
        used.sort_unstable();
        used.dedup();
        used.into_iter().map(TensorId).collect()
    }

    /// Non-virtual tensors an op produces (the graph's outputs), in index order.
    pub fn output_tensors(&self) -> Vec<TensorId> {
        let produced = self.produced();
        let mut outs: Vec<usize> = produced.keys().copied().filter(|&t| self.tensors.get(t).is_some_and(|d| !d.is_virtual)).collect();
        outs.sort_unstable();
        outs.into_iter().map(TensorId).collect()
    }

    fn produced(&self) -> HashMap<usize, usize> {
        let mut m = HashMap::new();
        for (ni, node) in self.nodes.iter().enumerate() {
            for p in &node.outputs {
                m.insert(p.tensor.0, ni);
            }
        }
        m
    }

    /// A stable 64-bit hash of everything that determines the computation: ops, attributes,
    /// shapes, strides, types, by-value constants and uids (names excluded). Caches key on it.
    pub fn key(&self) -> u64 {
        let mut h = Fnv64::new();
        let canonical = serde_json::to_string(&KeyView { graph: self }).unwrap_or_default();
        h.write(canonical.as_bytes());
        h.finish()
    }
}

/// What the graph key hashes: the graph without names.
struct KeyView<'a> {
    graph: &'a Graph,
}

impl Serialize for KeyView<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let g = self.graph;
        let tensors: Vec<_> = g.tensors.iter().map(|t| (t.uid, &t.dims, &t.strides, t.data_type, t.is_virtual, t.is_pass_by_value, t.value)).collect();
        let nodes: Vec<_> = g
            .nodes
            .iter()
            .map(|n| {
                let ins: BTreeMap<&str, usize> = n.inputs.iter().map(|p| (p.name.as_str(), p.tensor.0)).collect();
                let outs: BTreeMap<&str, usize> = n.outputs.iter().map(|p| (p.name.as_str(), p.tensor.0)).collect();
                (&n.op, ins, outs, n.compute_data_type)
            })
            .collect();
        (g.io_data_type, g.intermediate_data_type, g.compute_data_type, tensors, nodes).serialize(s)
    }
}

/// FNV-1a, 64-bit: stable across processes and Rust versions, unlike `DefaultHasher`.
pub struct Fnv64(u64);
impl Fnv64 {
    pub fn new() -> Fnv64 {
        Fnv64(0xcbf29ce484222325)
    }
    pub fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x100000001b3);
        }
    }
    pub fn finish(&self) -> u64 {
        self.0
    }
}
impl Default for Fnv64 {
    fn default() -> Self {
        Fnv64::new()
    }
}

/// Checks a tensor's own description: rank, positive dims, strides, and sizes that fit in i64 and
/// under [`MAX_ELEMENTS`]. Elements may share memory (an input's stride 0, expanded or overlapping
/// view); [`check_no_overlap`] is the rule for the tensors an op writes.
pub fn check_tensor_desc(t: &TensorDesc) -> Result<()> {
    let name = &t.name;
    if t.dims.is_empty() || t.dims.len() > MAX_RANK {
        return Err(Error::InvalidGraph(format!("tensor \"{name}\": rank must be 1 to {MAX_RANK}, got {} (dims {:?})", t.dims.len(), t.dims)));
    }
    if let Some((i, &d)) = t.dims.iter().enumerate().find(|(_, &d)| d <= 0) {
        return Err(Error::InvalidGraph(format!("tensor \"{name}\": dim {i} must be positive, got {d} (dims {:?})", t.dims)));
    }
    if t.strides.len() != t.dims.len() {
        return Err(Error::InvalidGraph(format!("tensor \"{name}\": {} strides given for {} dims (dims {:?}, strides {:?})", t.strides.len(), t.dims.len(), t.dims, t.strides)));
    }
    if let Some((i, &s)) = t.strides.iter().enumerate().find(|(_, &s)| s < 0) {
        return Err(Error::InvalidGraph(format!("tensor \"{name}\": stride {i} must be non-negative, got {s}")));
    }
    let mut count = 1i64;
    for &d in &t.dims {
        count = count.checked_mul(d).ok_or_else(|| Error::InvalidGraph(format!("tensor \"{name}\": element count of dims {:?} overflows i64", t.dims)))?;
    }
    if count > MAX_ELEMENTS {
        return Err(Error::InvalidGraph(format!("tensor \"{name}\": {count} elements is more than the {MAX_ELEMENTS} a tensor may have (dims {:?})", t.dims)));
    }
    let extent =
        t.extent_elements().ok_or_else(|| Error::InvalidGraph(format!("tensor \"{name}\": the extent of dims {:?} with strides {:?} overflows i64", t.dims, t.strides)))?;
    if let Some(dt) = t.data_type {
        if extent.checked_mul(dt.size() as i64).is_none() {
            return Err(Error::InvalidGraph(format!("tensor \"{name}\": its size in bytes overflows i64")));
        }
    }
    if t.is_pass_by_value && count != 1 {
        return Err(Error::InvalidGraph(format!("tensor \"{name}\": a by-value scalar must have one element, got dims {:?}", t.dims)));
    }
    Ok(())
}

/// Checks that no two elements of `t` share memory, the rule for a tensor an op writes (an
/// output or a virtual tensor); `Err` is the message. Sorts the axes of size > 1 by stride: each
/// stride must be at least the extent of all smaller-stride axes (so a stride 0 fails).
pub fn check_no_overlap(t: &TensorDesc) -> std::result::Result<(), String> {
    let mut axes: Vec<(i64, i64)> = t.dims.iter().zip(&t.strides).filter(|(&d, _)| d > 1).map(|(&d, &s)| (s, d)).collect();
    axes.sort();
    let mut reach = 1i64;
    for (s, d) in axes {
        if s < reach {
            return Err(format!(
                "output tensor \"{}\": strides {:?} make elements of dims {:?} overlap; a tensor an op writes must give each element its own memory",
                t.name, t.strides, t.dims
            ));
        }
        reach = s.saturating_mul(d);
    }
    Ok(())
}

/// What an op's inference sees: its node, its input descriptors, and a way to set outputs.
pub struct InferCtx<'a> {
    pub graph: &'a mut Graph,
    pub node: &'a Node,
    /// The output ports the op's inference described (connected or not): validation refuses
    /// a connected output port that is not among them.
    pub(crate) described: Vec<String>,
    /// The input ports the op's inference asked for (connected or not): validation refuses a
    /// connected input port that is not among them.
    pub(crate) read: RefCell<Vec<String>>,
}

impl InferCtx<'_> {
    pub fn kind(&self) -> &'static str {
        self.node.op.kind()
    }

    /// An error about this op.
    pub fn err(&self, message: impl std::fmt::Display) -> Error {
        Error::op(self.node.op.kind(), &self.node.name, message)
    }

    /// The descriptor of a required input, with its type resolved; an error names the port.
    pub fn input(&self, port: &str) -> Result<TensorDesc> {
        self.opt_input(port)?.ok_or_else(|| self.err(format!("input `{port}` is missing")))
    }

    /// The descriptor of an optional input, if connected.
    pub fn opt_input(&self, port: &str) -> Result<Option<TensorDesc>> {
        self.read.borrow_mut().push(port.to_string());
        let Some(id) = self.node.input(port) else { return Ok(None) };
        let t = self.graph.get(id).ok_or_else(|| self.err(format!("input `{port}` refers to a tensor not in the graph")))?;
        if t.dims.is_empty() {
            return Err(self.err(format!("input `{port}` (tensor \"{}\") has no dims yet: its producer failed to infer them", t.name)));
        }
        let mut t = t.clone();
        t.data_type = self.graph.resolved_data_type(id);
        if t.data_type.is_none() {
            return Err(self.err(format!("input `{port}` (tensor \"{}\") has no data type", t.name)));
        }
        Ok(Some(t))
    }

    /// The resolved data type of an input.
    pub fn input_type(&self, port: &str) -> Result<DataType> {
        Ok(self.input(port)?.data_type.unwrap_or(DataType::F32))
    }

    pub fn has_output(&self, port: &str) -> bool {
        self.node.output(port).is_some()
    }

    /// An attribute given as a tensor on input `port` (a norm's `epsilon` or `momentum`,
    /// attention's `attn_scale`), as the cudnn frontend takes them: when connected it must be one
    /// floating-point element passed by value; its value, when the graph holds it, is checked by
    /// `check`, otherwise it comes with each execution's variant pack and replaces the attribute.
    pub fn scalar_attribute(&self, port: &str, check: impl Fn(f64) -> Result<()>) -> Result<()> {
        let Some(t) = self.opt_input(port)? else { return Ok(()) };
        let dt = t.data_type.unwrap_or(DataType::F32);
        if !t.is_pass_by_value || t.element_count() != 1 || !dt.is_float() {
            return Err(self.err(format!(
                "input `{port}` (tensor \"{}\") gives an attribute: it must be one floating-point scalar passed by value, got dims {:?} of {dt}{}",
                t.name,
                t.dims,
                if t.is_pass_by_value { "" } else { " not passed by value" }
            )));
        }
        match t.value {
            Some(v) => check(v),
            None => Ok(()),
        }
    }

    /// Set an output's dims (checking any the user set), packed strides in the stride order of
    /// `layout_like` (an input descriptor whose layout the output follows; row-major when
    /// `None` or when ranks differ), and its type: the user's, else the graph's intermediate or
    /// io type, else `default_type`.
    pub fn set_output(&mut self, port: &str, dims: &[i64], layout_like: Option<&TensorDesc>, default_type: DataType) -> Result<()> {
        self.described.push(port.to_string());
        let Some(id) = self.node.output(port) else { return Ok(()) };
        let kind = self.node.op.kind();
        let node_name = self.node.name.clone();
        let io = self.graph.io_data_type;
        let inter = self.graph.intermediate_data_type;
        let t = self.graph.tensors.get_mut(id.0).ok_or_else(|| Error::op(kind, &node_name, format!("output `{port}` refers to a tensor not in the graph")))?;
        if t.dims.is_empty() {
            t.dims = dims.to_vec();
        } else if t.dims != dims {
            return Err(Error::op(kind, &node_name, format!("output `{port}` (tensor \"{}\") was given dims {:?} but the op produces {:?}", t.name, t.dims, dims)));
        }
        if t.strides.is_empty() {
            t.strides = match layout_like {
                // An axis the input expands (stride 0) is the output's outermost.
                Some(l) if l.strides.len() == dims.len() => {
                    let expanded: Vec<i64> = l.strides.iter().map(|&s| if s == 0 { i64::MAX } else { s }).collect();
                    strides_for_order(dims, &stride_order(&expanded))
                }
                _ => packed_strides(dims),
            };
        } else if t.strides.len() != dims.len() {
            return Err(Error::op(kind, &node_name, format!("output `{port}` (tensor \"{}\") has {} strides for {} dims", t.name, t.strides.len(), dims.len())));
        } else if t.strides.iter().zip(dims).any(|(&s, &d)| s == 0 && d > 1) {
            return Err(Error::op(kind, &node_name, format!("output `{port}` (tensor \"{}\") has a zero stride (strides {:?}); outputs cannot broadcast", t.name, t.strides)));
        }
        // Leave the type unset where the graph's types decide it, so that `set_output` after
        // building still moves a tensor from the intermediate to the io type.
        let _ = inter;
        if t.data_type.is_none() && !t.is_virtual && io.is_none() {
            t.data_type = Some(default_type);
        }
        Ok(())
    }
}
