//! The graph and its tensors: `pygraph` (through its base class `_Graph`) and `tensor`.
//!
//! A `_Graph` holds a ferrodnn [`Graph`] that its builder methods extend as the frontend's do,
//! plus what the frontend keeps that a ferrodnn graph expresses otherwise:
//!
//! - attributes given as tensors (a norm's `epsilon`, batchnorm's `momentum`, sdpa's
//!   `attn_scale`): a by-value scalar goes on the node's port of the same name, so its value
//!   comes with each execution's variant pack and one plan (one compilation) serves every value;
//!   another tensor (a one-element array) is left out of the graph that runs and its value, read
//!   at execution, is written into the node's attribute (plans are cached by those values);
//! - reductions whose axes are given by the output dims (`set_dim` after `reduction`);
//! - tensors no op uses (a `dBias` the frontend's caller creates, an unused input), which are
//!   left out too.
//!
//! `validate` lowers this to the graph that runs (a compact ferrodnn graph, validated);
//! `build_plans` builds its plans on the handle; `execute` picks the engine from where the
//! buffers live (host arrays: the CPU engine; device arrays: the CUDA engine), passes by-value
//! scalars as host buffers, and runs the plan on the buffers.

mod plans;

use crate::array::{self, ArrayDesc};
use crate::frontend::{self, PyBehaviorNote, PyKnob, PyKnobType, PyNumericalNote, PyScalarType};
use crate::{
    default_handle, parse_dtype, to_py_err, FerrodnnError, InvalidArgumentError, NotSupportedError, PyBuildPlanPolicy, PyConvolutionMode, PyDataType, PyDiagonalAlignment,
    PyHandle, PyHeurMode, PyNormPhase, PyPaddingMode, PyReductionMode, PyResampleMode, PyReshapeMode, PyRngDistribution, SerializationError,
};
use ferrodnn::engine::{Buffer, EngineKind, Knob, PlanDesc, PlanPolicy, VariantPack};
use ferrodnn::graph::ops::conv::{ConvAttrs, ConvMode};
use ferrodnn::graph::ops::norm::{BatchnormAttrs, BnFinalizeAttrs, GroupnormAttrs, NormAttrs};
use ferrodnn::graph::ops::pointwise::PointwiseMode;
use ferrodnn::graph::ops::reduction::ReductionMode;
use ferrodnn::graph::ops::resample::{ResampleAttrs, ResampleMode};
use ferrodnn::graph::ops::rng::Distribution;
use ferrodnn::graph::ops::rnn::{RnnBackwardInputs, RnnInputs};
use ferrodnn::graph::ops::sdpa::{CausalAlignment, SdpaAttrs, SdpaInputs};
use ferrodnn::graph::ops::Op;
use ferrodnn::graph::{packed_strides, Port};
use ferrodnn::{DataType, Graph, Handle, ShapeOverrides, TensorDesc, TensorId};
use plans::{Entry, Filters, KnobKey};
use pyo3::exceptions::{PyIndexError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PySlice, PyString, PyTuple};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

/// An attribute of a node that the frontend lets a tensor carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum AttrKind {
    Epsilon,
    Momentum,
    AttnScale,
}

impl AttrKind {
    /// The node's input port that takes the attribute from a by-value scalar.
    fn port(self) -> &'static str {
        match self {
            AttrKind::Epsilon => "epsilon",
            AttrKind::Momentum => "momentum",
            AttrKind::AttnScale => "attn_scale",
        }
    }
}

/// What the binding keeps beside the ferrodnn graph (serialized with it).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Meta {
    /// (node index, attribute, tensor index): the attribute's value is the tensor's.
    attr_refs: Vec<(usize, AttrKind, usize)>,
    /// Reductions (node indices) whose axes come from their output's dims.
    reductions: Vec<usize>,
    /// Tensors whose strides the user set (set_dim leaves them alone).
    user_strides: Vec<usize>,
    /// An op asked for a deterministic algorithm (sdpa_backward's `use_deterministic_algorithm`):
    /// plans whose behavior notes are not deterministic are skipped.
    #[serde(default)]
    deterministic: bool,
    /// Tensors whose dims (or strides) were inferred, when their op was added or at validation,
    /// rather than set by the user: forgotten again when a tensor upstream of them changes
    /// (set_dim, set_stride), so that a graph can be repaired and validated again.
    #[serde(default)]
    inferred_dims: BTreeSet<usize>,
    #[serde(default)]
    inferred_strides: BTreeSet<usize>,
    /// Values of `tensor_scalar(value, scalar_type.RUNTIME_PARAM)` tensors: passed to the plan at
    /// each execution when the variant pack gives none.
    #[serde(default)]
    runtime_values: BTreeMap<usize, f64>,
    /// `set_alignment` (bytes; the frontend's default is 16).
    #[serde(default)]
    alignment: BTreeMap<usize, i64>,
    /// `set_vector_count_and_dimension`'s dimension (the count is always 1).
    #[serde(default)]
    vector_dims: BTreeMap<usize, i64>,
    /// `pygraph(is_override_shape_enabled=True)`: `execute` takes shape overrides.
    #[serde(default)]
    override_shape_enabled: bool,
}

/// The lowered graph and its plans.
struct Built {
    /// The graph that runs: only tensors some op uses, validated.
    lowered: Graph,
    new_to_old: Vec<usize>,
    old_to_new: HashMap<usize, usize>,
    /// The frontend's list of execution plans (with placeholder attribute values), built one
    /// by one (see `plans`).
    entries: Vec<Entry>,
    /// The plan `execute` runs: the first one built (as the frontend's candidate).
    candidate: Option<usize>,
    /// Plans by (engine, knobs (their index in `knob_lists`), the attribute values written into
    /// the graph at execution, the shape overrides of the execution).
    exec: HashMap<(EngineKind, usize, Vec<u64>, ShapeOverrides), ferrodnn::engine::Plan>,
    /// The knob lists of `exec`'s keys, each once: a repeated execute finds its plan by a small
    /// integer, not by hashing and comparing its knobs' text on every call.
    knob_lists: Vec<Vec<Knob>>,
}

struct State {
    graph: Graph,
    meta: Meta,
    handle: Arc<Handle>,
    built: Option<Built>,
    /// Bumped by every change, so a build that ran without the lock can tell it is stale.
    generation: u64,
    /// The `select_*` / `deselect_*` plan filters.
    filters: Filters,
}

type Shared = Arc<Mutex<State>>;

fn lock(s: &Shared) -> PyResult<MutexGuard<'_, State>> {
    s.lock().map_err(|_| FerrodnnError::new_err("the graph's state is poisoned by an earlier panic"))
}

impl State {
    fn changed(&mut self) {
        self.built = None;
        self.generation += 1;
    }

    fn desc(&self, id: usize) -> PyResult<&TensorDesc> {
        self.graph.tensors.get(id).ok_or_else(|| PyIndexError::new_err(format!("tensor #{id} is not in the graph")))
    }

    fn desc_mut(&mut self, id: usize) -> PyResult<&mut TensorDesc> {
        self.changed();
        self.graph.tensors.get_mut(id).ok_or_else(|| PyIndexError::new_err(format!("tensor #{id} is not in the graph")))
    }

    /// The user changed the dims or strides of tensor `id`: forget what was inferred for the
    /// tensors computed from it (their dims and strides are inferred again at the next
    /// validation), so that a graph whose build failed can be repaired with set_dim.
    fn forget_inferred(&mut self, id: usize) {
        let mut dirty: HashSet<usize> = HashSet::from([id]);
        loop {
            let before = dirty.len();
            for n in &self.graph.nodes {
                if n.inputs.iter().any(|p| dirty.contains(&p.tensor.0)) {
                    dirty.extend(n.outputs.iter().map(|p| p.tensor.0));
                }
            }
            if dirty.len() == before {
                break;
            }
        }
        dirty.remove(&id);
        for t in dirty {
            let Some(desc) = self.graph.tensors.get_mut(t) else { continue };
            if self.meta.inferred_dims.remove(&t) {
                desc.dims.clear();
            }
            if self.meta.inferred_strides.remove(&t) {
                desc.strides.clear();
            }
        }
    }

    fn produced(&self, id: usize) -> bool {
        self.graph.nodes.iter().any(|n| n.outputs.iter().any(|p| p.tensor.0 == id))
    }

    /// Give every tensor without a uid one that no other tensor has.
    fn ensure_uids(&mut self) {
        let mut used: HashSet<i64> = self.graph.tensors.iter().filter_map(|t| t.uid).collect();
        let mut next = used.iter().copied().max().unwrap_or(0).max(0) + 1;
        for t in &mut self.graph.tensors {
            if t.uid.is_none() {
                while used.contains(&next) {
                    next += 1;
                }
                t.uid = Some(next);
                used.insert(next);
                next += 1;
            }
        }
    }

    fn find_uid(&self, uid: i64) -> Option<usize> {
        self.graph.tensors.iter().position(|t| t.uid == Some(uid))
    }

    /// Lower and validate the graph (see the module docs); writes the inferred dims and strides
    /// back so that `get_dim` and `get_stride` see them.
    fn lower(&mut self) -> PyResult<()> {
        if self.built.is_some() {
            return Ok(());
        }
        self.ensure_uids();
        let mut g = self.graph.clone();
        // Reductions: the axes are those the output collapses to 1.
        for &ni in &self.meta.reductions {
            let Some(node) = g.nodes.get(ni) else { continue };
            let (Some(x), Some(y)) = (node.input("x"), node.output("y")) else { continue };
            let xd = g.tensors[x.0].dims.clone();
            let yd = g.tensors[y.0].dims.clone();
            if yd.len() == xd.len() {
                let axes: Vec<usize> = (0..xd.len()).filter(|&i| yd[i] == 1 && xd[i] != 1).collect();
                if let Op::Reduction(a) = &mut g.nodes[ni].op {
                    a.axes = axes;
                }
            }
        }
        // Attributes carried by tensors: a by-value scalar goes on the node's port of the same
        // name, so its value comes with each execution and one plan serves every value; another
        // tensor (a one-element array) gives a placeholder until execution writes its value into
        // the attribute.
        for &(ni, kind, t) in &self.meta.attr_refs {
            let by_value = g.tensors.get(t).is_some_and(|d| d.is_pass_by_value);
            let v = g.tensors.get(t).and_then(|d| d.value).unwrap_or_else(|| placeholder(&g, ni, kind));
            if let Some(node) = g.nodes.get_mut(ni) {
                if by_value && node.op.attribute_ports().contains(&kind.port()) {
                    node.inputs.retain(|p| p.name != kind.port());
                    node.inputs.push(Port { name: kind.port().to_string(), tensor: TensorId(t) });
                } else {
                    apply_attr(&mut node.op, kind, v);
                }
            }
        }
        // Ragged offsets become ports of the nodes they serve (so they are kept below).
        g.attach_ragged_offsets().map_err(to_py_err)?;
        // Keep only the tensors some op uses.
        let mut used = vec![false; g.tensors.len()];
        for n in &g.nodes {
            for p in n.inputs.iter().chain(&n.outputs) {
                if let Some(u) = used.get_mut(p.tensor.0) {
                    *u = true;
                }
            }
        }
        let mut old_to_new = HashMap::new();
        let mut new_to_old = Vec::new();
        let mut tensors = Vec::new();
        for (i, t) in g.tensors.iter().enumerate() {
            if used[i] {
                old_to_new.insert(i, tensors.len());
                new_to_old.push(i);
                tensors.push(t.clone());
            }
        }
        let remap = |p: &Port| Port { name: p.name.clone(), tensor: TensorId(old_to_new.get(&p.tensor.0).copied().unwrap_or(usize::MAX)) };
        for n in &mut g.nodes {
            n.inputs = n.inputs.iter().map(remap).collect();
            n.outputs = n.outputs.iter().map(remap).collect();
        }
        g.tensors = tensors;
        for t in &mut g.tensors {
            t.ragged_offset = t.ragged_offset.and_then(|r| old_to_new.get(&r.0)).map(|&n| TensorId(n));
        }
        // What was inferred when an op was added is inferred again, in graph order: an op added
        // after `set_dim` on a tensor whose layout was not known yet (dgrad's output, then drelu
        // on it, as the frontend's samples write it) would otherwise keep the row-major strides
        // it got then.
        for (new, &old) in new_to_old.iter().enumerate() {
            if self.meta.inferred_strides.contains(&old) {
                g.tensors[new].strides.clear();
            }
        }
        g.validate().map_err(to_py_err)?;
        for (new, &old) in new_to_old.iter().enumerate() {
            let (dims, strides) = (g.tensors[new].dims.clone(), g.tensors[new].strides.clone());
            let t = &mut self.graph.tensors[old];
            if t.dims.is_empty() && !dims.is_empty() {
                self.meta.inferred_dims.insert(old);
            }
            if t.strides.is_empty() && !strides.is_empty() {
                self.meta.inferred_strides.insert(old);
            }
            t.dims = dims;
            t.strides = strides;
        }
        self.built = Some(Built { lowered: g, new_to_old, old_to_new, entries: Vec::new(), candidate: None, exec: HashMap::new(), knob_lists: Vec::new() });
        Ok(())
    }

    /// The lowered graph's plan list (after `lower`).
    fn built(&self) -> PyResult<&Built> {
        self.built.as_ref().ok_or_else(|| FerrodnnError::new_err("internal: the graph is not lowered"))
    }

    fn built_mut(&mut self) -> PyResult<&mut Built> {
        self.built.as_mut().ok_or_else(|| FerrodnnError::new_err("internal: the graph is not lowered"))
    }

    /// `create_execution_plans`: append the handle's candidate plans for the lowered graph.
    fn create_entries(&mut self) -> PyResult<()> {
        self.lower()?;
        let b = self.built.as_ref().expect("lowered");
        let cands = self.handle.candidates(&b.lowered, &PlanPolicy::default()).map_err(to_py_err)?;
        self.built_mut()?.entries.extend(cands.into_iter().map(|(d, n)| Entry::new(d, n)));
        Ok(())
    }

    /// Lower, and create the plan list when it is empty (ferrodnn builds and runs graphs whose
    /// caller skipped `create_execution_plans`).
    fn ensure_entries(&mut self) -> PyResult<()> {
        self.lower()?;
        if self.built()?.entries.is_empty() {
            self.create_entries()?;
        }
        Ok(())
    }

    /// Plan `index` of the list, or an error naming the list's length.
    fn entry(&self, method: &str, index: i64) -> PyResult<&Entry> {
        let b = self.built()?;
        usize::try_from(index).ok().and_then(|i| b.entries.get(i)).ok_or_else(|| {
            InvalidArgumentError::new_err(format!(
                "{method}: plan index {index} is out of range: graph \"{}\" has {} execution plans{}",
                self.graph.name,
                b.entries.len(),
                if b.entries.is_empty() { " (create them with create_execution_plans or build them with build_plans)" } else { "" }
            ))
        })
    }

    /// Why plan `i` may not be built or run, if so.
    fn barred(&self, i: usize) -> Option<String> {
        let e = self.built.as_ref()?.entries.get(i)?;
        e.failed.clone().or_else(|| self.filters.bars(&e.desc, &e.notes, self.meta.deterministic))
    }

    /// The engine of id `engine_id` (its position in the handle's engines).
    fn engine_of(&self, method: &str, engine_id: i64) -> PyResult<EngineKind> {
        let engines: Vec<EngineKind> = self.handle.engines().collect();
        usize::try_from(engine_id).ok().and_then(|i| engines.get(i).copied()).ok_or_else(|| {
            let names: Vec<String> = engines.iter().enumerate().map(|(i, e)| format!("{i}: {}", e.name())).collect();
            InvalidArgumentError::new_err(format!("{method}: engine id {engine_id} is out of range: the handle has {} engines ({})", engines.len(), names.join(", ")))
        })
    }
}

/// What an attribute carried by a tensor is assumed to be until its value is known.
fn placeholder(g: &Graph, node: usize, kind: AttrKind) -> f64 {
    match kind {
        AttrKind::Epsilon => 1e-5,
        AttrKind::Momentum => 0.1,
        AttrKind::AttnScale => {
            let d = g.nodes.get(node).and_then(|n| n.input("q")).and_then(|q| g.tensors.get(q.0)).and_then(|t| t.dims.get(3).copied()).unwrap_or(1);
            1.0 / (d.max(1) as f64).sqrt()
        }
    }
}

fn apply_attr(op: &mut Op, kind: AttrKind, v: f64) {
    match (op, kind) {
        (Op::Layernorm(a) | Op::Rmsnorm(a) | Op::Instancenorm(a) | Op::Adalayernorm(a) | Op::BatchnormInference(a) | Op::Genstats(a), AttrKind::Epsilon) => a.epsilon = v,
        (Op::Groupnorm(a), AttrKind::Epsilon) => a.epsilon = v,
        (Op::Batchnorm(a), AttrKind::Epsilon) => a.epsilon = v,
        (Op::Batchnorm(a), AttrKind::Momentum) => a.momentum = v,
        (Op::BnFinalize(a), AttrKind::Epsilon) => a.epsilon = v,
        (Op::BnFinalize(a), AttrKind::Momentum) => a.momentum = v,
        (Op::Sdpa(a) | Op::SdpaBackward(a), AttrKind::AttnScale) => a.attn_scale = Some(v),
        _ => {}
    }
}

/// A number or a tensor carrying it.
enum Scalar {
    Default,
    Value(f64),
    Tensor(usize),
}

/// One entry of a variant pack.
enum PackValue {
    Array(ArrayDesc),
    Number(f64),
}

/// A variant pack's value as read, before its tensor is known: a Python int is a by-value
/// scalar's value, or, for any other tensor, a device pointer (the frontend's `data_ptr()`).
enum Given {
    Value(PackValue),
    Int(i128),
}

/// `cudnn.tensor`: a tensor of one graph.
#[pyclass(name = "tensor", module = "ferrodnn")]
pub struct PyTensor {
    state: Shared,
    id: usize,
}

impl PyTensor {
    fn with<R>(&self, f: impl FnOnce(&State, &TensorDesc) -> PyResult<R>) -> PyResult<R> {
        let st = lock(&self.state)?;
        let d = st.desc(self.id)?;
        f(&st, d)
    }

    fn modify(slf: &Bound<'_, Self>, f: impl FnOnce(&mut State, usize) -> PyResult<()>) -> PyResult<Py<Self>> {
        {
            let me = slf.borrow();
            let mut st = lock(&me.state)?;
            st.desc_mut(me.id)?;
            f(&mut st, me.id)?;
        }
        Ok(slf.clone().unbind())
    }
}

#[pymethods]
impl PyTensor {
    /// Mark the tensor as a graph output (it gets a buffer) or, with False, as virtual.
    #[pyo3(signature = (is_output = true))]
    fn set_output(slf: &Bound<'_, Self>, is_output: bool) -> PyResult<Py<Self>> {
        Self::modify(slf, |st, id| {
            st.graph.tensors[id].is_virtual = !is_output;
            Ok(())
        })
    }

    #[pyo3(signature = (data_type = None))]
    fn set_data_type(slf: &Bound<'_, Self>, data_type: Option<&Bound<'_, PyAny>>) -> PyResult<Py<Self>> {
        let dt = parse_dtype(data_type)?;
        Self::modify(slf, |st, id| {
            st.graph.tensors[id].data_type = dt;
            Ok(())
        })
    }

    fn set_dim(slf: &Bound<'_, Self>, dim: Vec<i64>) -> PyResult<Py<Self>> {
        Self::modify(slf, |st, id| {
            let produced = st.produced(id);
            let keep_strides = st.meta.user_strides.contains(&id);
            st.meta.inferred_dims.remove(&id);
            let t = &mut st.graph.tensors[id];
            if t.dims != dim {
                if produced && !keep_strides {
                    t.strides.clear();
                } else if !produced && !keep_strides {
                    t.strides = packed_strides(&dim);
                }
                t.dims = dim;
                st.meta.inferred_strides.remove(&id);
                st.forget_inferred(id);
            }
            Ok(())
        })
    }

    fn set_stride(slf: &Bound<'_, Self>, stride: Vec<i64>) -> PyResult<Py<Self>> {
        Self::modify(slf, |st, id| {
            let changed = st.graph.tensors[id].strides != stride;
            st.graph.tensors[id].strides = stride;
            if !st.meta.user_strides.contains(&id) {
                st.meta.user_strides.push(id);
            }
            st.meta.inferred_strides.remove(&id);
            if changed {
                st.forget_inferred(id);
            }
            Ok(())
        })
    }

    fn set_uid(slf: &Bound<'_, Self>, uid: i64) -> PyResult<Py<Self>> {
        Self::modify(slf, |st, id| {
            if let Some(other) = st.find_uid(uid).filter(|&o| o != id) {
                return Err(PyValueError::new_err(format!("uid {uid} is already the uid of tensor \"{}\"", st.graph.tensors[other].name)));
            }
            st.graph.tensors[id].uid = Some(uid);
            Ok(())
        })
    }

    fn set_name(slf: &Bound<'_, Self>, name: String) -> PyResult<Py<Self>> {
        Self::modify(slf, |st, id| {
            st.graph.tensors[id].name = name;
            Ok(())
        })
    }

    fn set_is_virtual(slf: &Bound<'_, Self>, value: bool) -> PyResult<Py<Self>> {
        Self::modify(slf, |st, id| {
            st.graph.tensors[id].is_virtual = value;
            Ok(())
        })
    }

    fn set_is_pass_by_value(slf: &Bound<'_, Self>, value: bool) -> PyResult<Py<Self>> {
        Self::modify(slf, |st, id| {
            st.graph.tensors[id].is_pass_by_value = value;
            Ok(())
        })
    }

    /// Make this tensor ragged (packed sequences, the THD layout): batch `i` starts at element
    /// `offset[i]` of its buffer, `offset` an integer tensor of b + 1 elements of this graph.
    /// Only sdpa's sequence tensors may be ragged, with the padding mask.
    fn set_ragged_offset(slf: &Bound<'_, Self>, offset: &Bound<'_, PyAny>) -> PyResult<Py<Self>> {
        let off = offset.downcast::<PyTensor>().map_err(|_| PyTypeError::new_err(format!("set_ragged_offset: expected a tensor of this graph, got {}", type_name(offset))))?;
        let off_id = {
            let o = off.borrow();
            if !Arc::ptr_eq(&o.state, &slf.borrow().state) {
                return Err(PyValueError::new_err("set_ragged_offset: the offsets tensor belongs to another graph"));
            }
            o.id
        };
        Self::modify(slf, |st, id| {
            st.graph.tensors[id].ragged_offset = Some(TensorId(off_id));
            Ok(())
        })
    }

    /// The tensor holding this tensor's ragged offsets, or None.
    fn get_ragged_offset(&self) -> PyResult<Option<PyTensor>> {
        self.with(|_, d| Ok(d.ragged_offset.map(|r| PyTensor { state: self.state.clone(), id: r.0 })))
    }

    /// The uid (assigned by validate when none was set; -1 before).
    fn get_uid(&self) -> PyResult<i64> {
        self.with(|_, d| Ok(d.uid.unwrap_or(-1)))
    }
    fn get_name(&self) -> PyResult<String> {
        self.with(|_, d| Ok(d.name.clone()))
    }
    fn get_dim(&self) -> PyResult<Vec<i64>> {
        self.with(|_, d| Ok(d.dims.clone()))
    }
    fn get_stride(&self) -> PyResult<Vec<i64>> {
        self.with(|_, d| Ok(d.strides.clone()))
    }
    /// The tensor's type: its own; else, once the graph is validated, the type the graph gives it
    /// (its io or intermediate type, or what its op makes), as the frontend fills it in at
    /// validation; NOT_SET before.
    fn get_data_type(&self) -> PyResult<PyDataType> {
        self.with(|st, d| {
            let resolved = || {
                let b = st.built.as_ref()?;
                match b.old_to_new.get(&self.id) {
                    Some(&new) => b.lowered.resolved_data_type(TensorId(new)),
                    None => st.graph.resolved_data_type(TensorId(self.id)),
                }
            };
            Ok(PyDataType::from_rust(d.data_type.or_else(resolved)))
        })
    }
    fn get_is_virtual(&self) -> PyResult<bool> {
        self.with(|_, d| Ok(d.is_virtual))
    }
    fn get_is_pass_by_value(&self) -> PyResult<bool> {
        self.with(|_, d| Ok(d.is_pass_by_value))
    }
    fn get_is_output(&self) -> PyResult<bool> {
        self.with(|st, d| Ok(!d.is_virtual && st.produced(self.id)))
    }

    /// Whether the tensor is a by-value scalar whose value is compiled into the plan
    /// (`tensor_scalar(value, scalar_type.COMPILE_TIME_CONST)`).
    fn get_has_compile_time_constant(&self) -> PyResult<bool> {
        self.with(|_, d| Ok(d.is_pass_by_value && d.value.is_some()))
    }

    /// Always `tensor_reordering.NONE`: ferrodnn reorders no tensor.
    fn get_reordering_type(&self) -> PyResult<frontend::PyTensorReordering> {
        self.with(|_, _| Ok(frontend::PyTensorReordering::NONE))
    }

    /// Only `tensor_reordering.NONE` is accepted (others raise NotSupportedError).
    fn set_reordering_type(slf: &Bound<'_, Self>, reordering_type: &Bound<'_, PyAny>) -> PyResult<Py<Self>> {
        frontend::check_reordering("set_reordering_type", Some(reordering_type))?;
        Ok(slf.clone().unbind())
    }

    /// The alignment in bytes the caller promises for the tensor's buffers (16 unless set, as in
    /// the frontend). ferrodnn checks each buffer's address itself and does not rely on it.
    fn get_alignment(&self) -> PyResult<i64> {
        self.with(|st, _| Ok(st.meta.alignment.get(&self.id).copied().unwrap_or(16)))
    }

    fn set_alignment(slf: &Bound<'_, Self>, alignment: i64) -> PyResult<Py<Self>> {
        if alignment < 1 || (alignment & (alignment - 1)) != 0 {
            return Err(PyValueError::new_err(format!("set_alignment: alignment must be a power of two number of bytes, got {alignment}")));
        }
        Self::modify(slf, |st, id| {
            st.meta.alignment.insert(id, alignment);
            Ok(())
        })
    }

    /// Always 1: ferrodnn has no vectorized layouts (INT8x4, INT8x32).
    fn get_vector_count(&self) -> PyResult<i64> {
        self.with(|_, _| Ok(1))
    }

    /// The dimension given with `set_vector_count_and_dimension` (-1 unless set).
    fn get_vector_dimension(&self) -> PyResult<i64> {
        self.with(|st, _| Ok(st.meta.vector_dims.get(&self.id).copied().unwrap_or(-1)))
    }

    /// Only a count of 1 (no vectorization) is accepted; others raise NotSupportedError.
    fn set_vector_count_and_dimension(slf: &Bound<'_, Self>, vector_count: i64, vector_dimension: i64) -> PyResult<Py<Self>> {
        if vector_count != 1 {
            return Err(NotSupportedError::new_err(format!(
                "set_vector_count_and_dimension: vector count {vector_count} is not supported by ferrodnn (no vectorized layouts; only 1)"
            )));
        }
        let rank = slf.borrow().with(|_, d| Ok(d.dims.len() as i64))?;
        if vector_dimension < -1 || (rank > 0 && vector_dimension >= rank) {
            return Err(PyValueError::new_err(format!("set_vector_count_and_dimension: dimension {vector_dimension} is out of range for a tensor of rank {rank} (-1 for none)")));
        }
        Self::modify(slf, |st, id| {
            st.meta.vector_dims.insert(id, vector_dimension);
            Ok(())
        })
    }

    fn __repr__(&self) -> PyResult<String> {
        self.with(|_, d| Ok(format!("<ferrodnn.tensor {}>", serde_json::to_string(d).unwrap_or_default())))
    }

    fn __hash__(&self) -> isize {
        (Arc::as_ptr(&self.state) as usize as isize).wrapping_mul(31).wrapping_add(self.id as isize)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .downcast::<PyTensor>()
            .map(|o| {
                let o = o.borrow();
                Arc::ptr_eq(&o.state, &self.state) && o.id == self.id
            })
            .unwrap_or(false)
    }
}

/// The graph (`pygraph` is its Python subclass, which adds the pointwise ops).
#[pyclass(subclass, name = "_Graph", module = "ferrodnn")]
pub struct PyGraph {
    state: Shared,
}

impl PyGraph {
    fn tensor_obj(&self, py: Python<'_>, id: usize) -> PyResult<Py<PyTensor>> {
        Py::new(py, PyTensor { state: self.state.clone(), id })
    }

    fn outs(&self, py: Python<'_>, ids: Vec<Option<TensorId>>) -> PyResult<Vec<Option<Py<PyTensor>>>> {
        ids.into_iter().map(|t| t.map(|t| self.tensor_obj(py, t.0)).transpose()).collect()
    }

    fn one(&self, py: Python<'_>, ids: Vec<Option<TensorId>>) -> PyResult<Py<PyTensor>> {
        let id = ids.into_iter().next().flatten().ok_or_else(|| FerrodnnError::new_err("internal: the op produced no output"))?;
        self.tensor_obj(py, id.0)
    }

    /// A tensor argument of this graph.
    fn tid(&self, t: &Bound<'_, PyAny>, what: &str) -> PyResult<TensorId> {
        let t = t.downcast::<PyTensor>().map_err(|_| PyTypeError::new_err(format!("{what} must be a tensor of this graph, got {}", type_name(t))))?;
        let t = t.borrow();
        if !Arc::ptr_eq(&t.state, &self.state) {
            return Err(PyValueError::new_err(format!("{what} is a tensor of another graph; use tensor_like to bring it into this one")));
        }
        Ok(TensorId(t.id))
    }

    fn opt_tid(&self, t: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<TensorId>> {
        match t {
            Some(t) if !t.is_none() => Ok(Some(self.tid(t, what)?)),
            _ => Ok(None),
        }
    }

    fn scalar(&self, v: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Scalar> {
        let Some(v) = v.filter(|v| !v.is_none()) else { return Ok(Scalar::Default) };
        if v.downcast::<PyTensor>().is_ok() {
            return Ok(Scalar::Tensor(self.tid(v, what)?.0));
        }
        v.extract::<f64>().map(Scalar::Value).map_err(|_| PyTypeError::new_err(format!("{what} must be a number or a tensor, got {}", type_name(v))))
    }

    /// Run a builder on the state, then name the new nodes, set their compute type and forget
    /// any build. `attrs` are attributes carried by tensors, for the last node added.
    fn add_op(
        &self,
        name: &str,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        attrs: Vec<(AttrKind, Scalar)>,
        f: impl FnOnce(&mut Graph) -> PyResult<Vec<Option<TensorId>>>,
    ) -> PyResult<Vec<Option<TensorId>>> {
        let cdt = parse_dtype(compute_data_type)?;
        let mut st = lock(&self.state)?;
        let before = st.graph.nodes.len();
        let outs = f(&mut st.graph)?;
        st.changed();
        let after = st.graph.nodes.len();
        // The builder inferred what it could of the new outputs: remembered as inferred, so that
        // a change upstream forgets it (callers that set an output's dims themselves say so).
        let new_outputs: Vec<usize> = st.graph.nodes[before..after].iter().flat_map(|n| n.outputs.iter().map(|p| p.tensor.0)).collect();
        for t in new_outputs {
            let Some(d) = st.graph.tensors.get(t) else { continue };
            let (dims, strides) = (!d.dims.is_empty(), !d.strides.is_empty());
            if dims {
                st.meta.inferred_dims.insert(t);
            }
            if strides {
                st.meta.inferred_strides.insert(t);
            }
        }
        for ni in before..after {
            let node = &mut st.graph.nodes[ni];
            node.compute_data_type = cdt;
            if !name.is_empty() {
                node.name = name.to_string();
                let ports: Vec<(String, usize)> = node.outputs.iter().map(|p| (p.name.clone(), p.tensor.0)).collect();
                for (port, t) in ports {
                    st.graph.tensors[t].name = format!("{name}::{port}");
                }
            }
        }
        if after > before {
            let last = after - 1;
            for (kind, s) in attrs {
                match s {
                    Scalar::Default => {}
                    Scalar::Value(v) => apply_attr(&mut st.graph.nodes[last].op, kind, v),
                    Scalar::Tensor(t) => st.meta.attr_refs.push((last, kind, t)),
                }
            }
        }
        Ok(outs)
    }

    /// The dims (or strides) of these outputs were given by the caller, not inferred.
    fn user_set(&self, outs: &[Option<TensorId>], dims: bool, strides: bool) -> PyResult<()> {
        let mut st = lock(&self.state)?;
        for t in outs.iter().flatten() {
            if dims {
                st.meta.inferred_dims.remove(&t.0);
            }
            if strides {
                st.meta.inferred_strides.remove(&t.0);
            }
        }
        Ok(())
    }

    fn dims_of(&self, t: TensorId) -> PyResult<Vec<i64>> {
        let st = lock(&self.state)?;
        Ok(st.desc(t.0)?.dims.clone())
    }

    #[allow(clippy::too_many_arguments)]
    fn conv_attrs(
        &self,
        rank_of: TensorId,
        padding: Option<Vec<i64>>,
        pre_padding: Option<Vec<i64>>,
        post_padding: Option<Vec<i64>>,
        stride: Option<Vec<i64>>,
        dilation: Option<Vec<i64>>,
        mode: Option<PyConvolutionMode>,
    ) -> PyResult<ConvAttrs> {
        let rank = self.dims_of(rank_of)?.len();
        let given = [&padding, &pre_padding, &post_padding, &stride, &dilation].iter().filter_map(|l| l.as_ref().filter(|l| !l.is_empty()).map(|l| l.len())).next();
        let spatial = given.unwrap_or(rank.saturating_sub(2));
        let nonempty = |l: Option<Vec<i64>>| l.filter(|l| !l.is_empty());
        let padding = nonempty(padding);
        let mut a = ConvAttrs::new(spatial);
        if let Some(p) = nonempty(pre_padding).or_else(|| padding.clone()) {
            a.pre_padding = p;
        }
        if let Some(p) = nonempty(post_padding).or(padding) {
            a.post_padding = p;
        }
        if let Some(s) = nonempty(stride) {
            a.stride = s;
        }
        if let Some(d) = nonempty(dilation) {
            a.dilation = d;
        }
        if mode == Some(PyConvolutionMode::CONVOLUTION) {
            a.mode = ConvMode::Convolution;
        }
        Ok(a)
    }

    fn norm_attrs(phase: Option<PyNormPhase>) -> NormAttrs {
        match phase {
            Some(PyNormPhase::INFERENCE) => NormAttrs::inference(),
            _ => NormAttrs::default(),
        }
    }

    /// Build plan `i` of the list (compiling kernels on a GPU handle) without holding the GIL.
    /// `Ok(Err(why))` when this plan is deselected or fails to build; with `make_candidate`,
    /// a plan built (or built before) becomes the one `execute` runs.
    fn build_entry(&self, py: Python<'_>, i: usize, make_candidate: bool) -> PyResult<Result<(), String>> {
        let (handle, lowered, desc, generation) = {
            let mut st = lock(&self.state)?;
            st.lower()?;
            if let Some(why) = st.barred(i) {
                return Ok(Err(why));
            }
            let (handle, generation) = (st.handle.clone(), st.generation);
            let b = st.built_mut()?;
            let Some(e) = b.entries.get(i) else {
                return Err(FerrodnnError::new_err(format!("graph \"{}\" has no plan {i} any more: it changed while its plans were being built; build them again", st.graph.name)));
            };
            if e.plan.is_some() {
                if make_candidate {
                    b.candidate = Some(i);
                }
                return Ok(Ok(()));
            }
            (handle, b.lowered.clone(), e.desc.clone(), generation)
        };
        let built = py.allow_threads(|| handle.plan_from_desc(&lowered, &desc));
        let mut st = lock(&self.state)?;
        if st.generation != generation {
            return Err(FerrodnnError::new_err(format!("graph \"{}\" changed while its plan {i} was being built; build it again", st.graph.name)));
        }
        let over = built.as_ref().ok().and_then(|p| st.filters.bars_workspace(p.workspace_size()));
        let b = st.built_mut()?;
        let e = &mut b.entries[i];
        match (built, over) {
            (Ok(_), Some(why)) => {
                e.failed = Some(why.clone());
                Ok(Err(why))
            }
            (Ok(plan), None) => {
                e.plan = Some(plan);
                if make_candidate {
                    b.candidate = Some(i);
                }
                Ok(Ok(()))
            }
            (Err(err), _) => {
                let why = format!("it failed to build: {err}");
                e.failed = Some(why.clone());
                Ok(Err(why))
            }
        }
    }

    /// `build_plans`: build the first plan of the list that builds (`all`: every plan), creating
    /// the list when it is empty; the first built becomes the candidate. With the heuristics'
    /// choice, nothing is built when a candidate exists. Errors give each plan's reason.
    fn build_by_policy(&self, py: Python<'_>, all: bool) -> PyResult<()> {
        let n = {
            let mut st = lock(&self.state)?;
            st.ensure_entries()?;
            let b = st.built()?;
            if !all && b.candidate.is_some() {
                return Ok(());
            }
            b.entries.len()
        };
        let mut reasons = Vec::new();
        let mut any = false;
        for i in 0..n {
            let first = !any && lock(&self.state)?.built()?.candidate.is_none();
            match self.build_entry(py, i, first)? {
                Ok(()) => {
                    any = true;
                    if !all {
                        return Ok(());
                    }
                }
                Err(why) => reasons.push((i, why)),
            }
        }
        let st = lock(&self.state)?;
        if any || st.built()?.candidate.is_some() {
            return Ok(());
        }
        let b = st.built()?;
        let list: Vec<String> = reasons.iter().map(|(i, why)| format!("plan {i} ({}): {why}", plans::plan_name(&b.entries[*i].desc))).collect();
        Err(NotSupportedError::new_err(format!("graph \"{}\": no execution plan could be built: {}", st.graph.name, list.join("; "))))
    }

    /// Build the plans when none is the candidate yet (the calls that need a built plan).
    fn ensure_candidate(&self, py: Python<'_>) -> PyResult<usize> {
        self.build_by_policy(py, false)?;
        lock(&self.state)?.built()?.candidate.ok_or_else(|| FerrodnnError::new_err("internal: no candidate after building"))
    }
}

fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type().name().map(|n| n.to_string()).unwrap_or_default()
}

/// Python slices over a dim: (start, end, step), step >= 1.
fn slice_bounds(s: &Bound<'_, PyAny>, dim: i64) -> PyResult<(i64, i64, i64)> {
    let s = s.downcast::<PySlice>().map_err(|_| PyTypeError::new_err("slices must be Python slice objects"))?;
    let idx = s.indices(dim as isize)?;
    if idx.step < 1 {
        return Err(PyValueError::new_err(format!("slice steps must be positive, got {}", idx.step)));
    }
    let end = if idx.slicelength == 0 { idx.start as i64 } else { idx.start as i64 + (idx.slicelength as i64 - 1) * idx.step as i64 + 1 };
    Ok((idx.start as i64, end, idx.step as i64))
}

/// Whether an array of type `have` may be the buffer of a tensor of type `want`: the same
/// type, or a same-size stand-in for a type the array's library lacks (uint16 for bfloat16,
/// uint8 for fp8 and bool).
fn compatible(a: &ArrayDesc, want: DataType) -> bool {
    match a.dtype {
        Some(d) if d == want => true,
        Some(d) => {
            d.size() == want.size()
                && matches!(want, DataType::Bf16 | DataType::Fp8E4m3 | DataType::Fp8E5m2 | DataType::Bool)
                && matches!(d, DataType::U8 | DataType::I8 | DataType::Bool)
        }
        None => a.itemsize == want.size() && matches!(want, DataType::Bf16 | DataType::Fp8E4m3 | DataType::Fp8E5m2 | DataType::Bool),
    }
}

#[pymethods]
impl PyGraph {
    /// `pygraph(name=, io_data_type=, intermediate_data_type=, compute_data_type=, handle=,
    /// is_override_shape_enabled=)`; the last lets `execute` take shape overrides, as in the
    /// frontend. The frontend's `sm_count`, `sm_version`, `kernel_cache`, `device_property` and
    /// `is_dynamic_shape_enabled` are accepted and ignored (ferrodnn targets the handle's device
    /// with its own kernel cache). Any other keyword raises TypeError.
    #[new]
    #[pyo3(signature = (name = "test_graph".to_string(), io_data_type = None, intermediate_data_type = None, compute_data_type = None, handle = None, sm_count = None,
        sm_version = None, kernel_cache = None, device_property = None, is_dynamic_shape_enabled = false, is_override_shape_enabled = false, **kwargs))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        name: String,
        io_data_type: Option<&Bound<'_, PyAny>>,
        intermediate_data_type: Option<&Bound<'_, PyAny>>,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        handle: Option<&Bound<'_, PyAny>>,
        sm_count: Option<&Bound<'_, PyAny>>,
        sm_version: Option<&Bound<'_, PyAny>>,
        kernel_cache: Option<&Bound<'_, PyAny>>,
        device_property: Option<&Bound<'_, PyAny>>,
        is_dynamic_shape_enabled: bool,
        is_override_shape_enabled: bool,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        // `**kwargs` only so that the TypeError names `pygraph` rather than the base class.
        reject_kwargs("pygraph()", kwargs)?;
        let _ = (sm_count, sm_version, kernel_cache, device_property, is_dynamic_shape_enabled);
        let mut g = Graph::new(name);
        g.io_data_type = parse_dtype(io_data_type)?;
        g.intermediate_data_type = parse_dtype(intermediate_data_type)?;
        g.compute_data_type = parse_dtype(compute_data_type)?;
        let handle = match handle.filter(|h| !h.is_none()) {
            Some(h) => h.downcast::<PyHandle>().map_err(|_| PyTypeError::new_err("handle must come from create_handle()"))?.get().inner.clone(),
            None => default_handle(),
        };
        let meta = Meta { override_shape_enabled: is_override_shape_enabled, ..Meta::default() };
        Ok(PyGraph { state: Arc::new(Mutex::new(State { graph: g, meta, handle, built: None, generation: 0, filters: Filters::default() })) })
    }

    /// A tensor of the graph (an input, or a by-value scalar with is_pass_by_value).
    #[pyo3(signature = (dim, stride = None, data_type = None, is_virtual = false, is_pass_by_value = false, ragged_offset = None, reordering_type = None, name = String::new(), uid = -1))]
    #[allow(clippy::too_many_arguments)]
    fn tensor(
        &self,
        py: Python<'_>,
        dim: Vec<i64>,
        stride: Option<Vec<i64>>,
        data_type: Option<&Bound<'_, PyAny>>,
        is_virtual: bool,
        is_pass_by_value: bool,
        ragged_offset: Option<&Bound<'_, PyAny>>,
        reordering_type: Option<&Bound<'_, PyAny>>,
        name: String,
        uid: i64,
    ) -> PyResult<Py<PyTensor>> {
        frontend::check_reordering("tensor", reordering_type)?;
        let ragged = match ragged_offset.filter(|r| !r.is_none()) {
            Some(r) => {
                let t = r.downcast::<PyTensor>().map_err(|_| PyTypeError::new_err(format!("tensor: ragged_offset must be a tensor of this graph, got {}", type_name(r))))?;
                let t = t.borrow();
                if !Arc::ptr_eq(&t.state, &self.state) {
                    return Err(PyValueError::new_err("tensor: the ragged_offset tensor belongs to another graph"));
                }
                Some(TensorId(t.id))
            }
            None => None,
        };
        let dt = parse_dtype(data_type)?;
        let strides = stride.filter(|s| !s.is_empty()).unwrap_or_else(|| packed_strides(&dim));
        let desc =
            TensorDesc { uid: if uid == -1 { None } else { Some(uid) }, name, dims: dim, strides, data_type: dt, is_virtual, is_pass_by_value, value: None, ragged_offset: ragged };
        let id = {
            let mut st = lock(&self.state)?;
            if let Some(u) = desc.uid {
                if st.find_uid(u).is_some() {
                    return Err(PyValueError::new_err(format!("uid {u} is already taken in this graph")));
                }
            }
            st.changed();
            st.graph.tensor(desc).0
        };
        self.tensor_obj(py, id)
    }

    /// A one-element by-value scalar of `value`, as the frontend's `tensor_scalar`: a Python
    /// float gives a FLOAT tensor, an int an INT32 one (INT64 beyond its range).
    /// `COMPILE_TIME_CONST` compiles the value into the plan; `RUNTIME_PARAM` passes it at each
    /// execution (a variant pack may give another value for it).
    #[pyo3(signature = (value, scalar_type))]
    fn tensor_scalar(&self, py: Python<'_>, value: &Bound<'_, PyAny>, scalar_type: PyScalarType) -> PyResult<Py<PyTensor>> {
        let (v, dt) = if value.is_instance_of::<PyBool>() {
            return Err(PyTypeError::new_err("tensor_scalar: value must be a float or an int, got bool"));
        } else if value.is_instance_of::<PyInt>() {
            let i: i64 = value.extract().map_err(|_| PyValueError::new_err("tensor_scalar: the int does not fit in 64 bits"))?;
            (i as f64, if i32::try_from(i).is_ok() { DataType::I32 } else { DataType::I64 })
        } else if let Ok(f) = value.extract::<f64>() {
            (f, DataType::F32)
        } else {
            return Err(PyTypeError::new_err(format!("tensor_scalar: value must be a float or an int, got {}", type_name(value))));
        };
        let compile_time = scalar_type == PyScalarType::COMPILE_TIME_CONST;
        let desc = TensorDesc {
            uid: None,
            name: String::new(),
            dims: vec![1],
            strides: vec![1],
            data_type: Some(dt),
            is_virtual: false,
            is_pass_by_value: true,
            value: compile_time.then_some(v),
            ragged_offset: None,
        };
        let id = {
            let mut st = lock(&self.state)?;
            st.changed();
            let id = st.graph.tensor(desc).0;
            if !compile_time {
                st.meta.runtime_values.insert(id, v);
            }
            id
        };
        self.tensor_obj(py, id)
    }

    /// A tensor like `input`: another graph's tensor (same dims, strides, type, by-value flag),
    /// or an array (its dims, strides and type; by-value when it is a one-element host array,
    /// as the frontend does for CPU tensors).
    #[pyo3(signature = (input, name = String::new()))]
    fn tensor_like(&self, py: Python<'_>, input: &Bound<'_, PyAny>, name: String) -> PyResult<Py<PyTensor>> {
        let desc = if let Ok(t) = input.downcast::<PyTensor>() {
            let t = t.borrow();
            let st = lock(&t.state)?;
            let d = st.desc(t.id)?;
            let dt = d.data_type.or_else(|| st.graph.resolved_data_type(TensorId(t.id)));
            TensorDesc {
                uid: None,
                name: if name.is_empty() { d.name.clone() } else { name },
                dims: d.dims.clone(),
                strides: d.strides.clone(),
                data_type: dt,
                is_virtual: false,
                is_pass_by_value: d.is_pass_by_value,
                value: d.value,
                ragged_offset: None,
            }
        } else if array::is_array(input) {
            let a = array::describe(input)?;
            let dt = a.dtype.ok_or_else(|| PyTypeError::new_err(format!("tensor_like: unsupported element type {}", a.type_name)))?;
            let by_value = !a.device && a.element_count() == 1;
            let dims = if a.dims.is_empty() { vec![1] } else { a.dims.clone() };
            let strides = if a.dims.is_empty() { vec![1] } else { a.strides.clone() };
            TensorDesc { uid: None, name, dims, strides, data_type: Some(dt), is_virtual: false, is_pass_by_value: by_value, value: None, ragged_offset: None }
        } else {
            return Err(PyTypeError::new_err(format!("tensor_like takes a tensor or an array, got {}", type_name(input))));
        };
        let id = {
            let mut st = lock(&self.state)?;
            st.changed();
            st.graph.tensor(desc).0
        };
        self.tensor_obj(py, id)
    }

    /// Any pointwise op by ferrodnn's mode name and parameters (the pointwise methods of
    /// `pygraph` call this).
    #[pyo3(signature = (mode, inputs, params = None, compute_data_type = None, name = String::new()))]
    fn _pointwise(
        &self,
        py: Python<'_>,
        mode: &str,
        inputs: Vec<Bound<'_, PyAny>>,
        params: Option<&Bound<'_, PyDict>>,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
    ) -> PyResult<Py<PyTensor>> {
        let mut obj = serde_json::Map::new();
        obj.insert("name".into(), serde_json::Value::String(mode.to_string()));
        if let Some(p) = params {
            for (k, v) in p.iter() {
                if v.is_none() {
                    continue;
                }
                let key: String = k.extract()?;
                let value =
                    if v.is_instance_of::<PyInt>() && !v.is_instance_of::<PyBool>() { serde_json::json!(v.extract::<i64>()?) } else { serde_json::json!(v.extract::<f64>()?) };
                obj.insert(key, value);
            }
        }
        let mode: PointwiseMode = serde_json::from_value(serde_json::Value::Object(obj)).map_err(|e| PyValueError::new_err(format!("pointwise mode: {e}")))?;
        let ids = inputs.iter().enumerate().map(|(i, t)| self.tid(t, &format!("input {i}"))).collect::<PyResult<Vec<_>>>()?;
        let outs = self.add_op(&name, compute_data_type, vec![], |g| Ok(vec![Some(g.pointwise(mode, &ids))]))?;
        self.one(py, outs)
    }

    #[pyo3(signature = (image, weight, padding = None, stride = None, dilation = None, pre_padding = None, post_padding = None, convolution_mode = None, compute_data_type = None, name = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn conv_fprop(
        &self,
        py: Python<'_>,
        image: &Bound<'_, PyAny>,
        weight: &Bound<'_, PyAny>,
        padding: Option<Vec<i64>>,
        stride: Option<Vec<i64>>,
        dilation: Option<Vec<i64>>,
        pre_padding: Option<Vec<i64>>,
        post_padding: Option<Vec<i64>>,
        convolution_mode: Option<PyConvolutionMode>,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
    ) -> PyResult<Py<PyTensor>> {
        let (x, w) = (self.tid(image, "image")?, self.tid(weight, "weight")?);
        let a = self.conv_attrs(x, padding, pre_padding, post_padding, stride, dilation, convolution_mode)?;
        let outs = self.add_op(&name, compute_data_type, vec![], |g| Ok(vec![Some(g.conv_fprop(x, w, a))]))?;
        self.one(py, outs)
    }

    /// The data gradient; give its dims with `set_dim` (as the frontend requires).
    #[pyo3(signature = (loss, filter, padding = None, stride = None, dilation = None, pre_padding = None, post_padding = None, convolution_mode = None, compute_data_type = None, name = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn conv_dgrad(
        &self,
        py: Python<'_>,
        loss: &Bound<'_, PyAny>,
        filter: &Bound<'_, PyAny>,
        padding: Option<Vec<i64>>,
        stride: Option<Vec<i64>>,
        dilation: Option<Vec<i64>>,
        pre_padding: Option<Vec<i64>>,
        post_padding: Option<Vec<i64>>,
        convolution_mode: Option<PyConvolutionMode>,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
    ) -> PyResult<Py<PyTensor>> {
        let (dy, w) = (self.tid(loss, "loss")?, self.tid(filter, "filter")?);
        let a = self.conv_attrs(dy, padding, pre_padding, post_padding, stride, dilation, convolution_mode)?;
        let outs = self.add_op(&name, compute_data_type, vec![], |g| Ok(vec![Some(g.conv_dgrad(dy, w, &[], a))]))?;
        self.one(py, outs)
    }

    /// The weight gradient; give its dims with `set_dim` (as the frontend requires).
    #[pyo3(signature = (image, loss, padding = None, stride = None, dilation = None, pre_padding = None, post_padding = None, convolution_mode = None, compute_data_type = None, name = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn conv_wgrad(
        &self,
        py: Python<'_>,
        image: &Bound<'_, PyAny>,
        loss: &Bound<'_, PyAny>,
        padding: Option<Vec<i64>>,
        stride: Option<Vec<i64>>,
        dilation: Option<Vec<i64>>,
        pre_padding: Option<Vec<i64>>,
        post_padding: Option<Vec<i64>>,
        convolution_mode: Option<PyConvolutionMode>,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
    ) -> PyResult<Py<PyTensor>> {
        let (x, dy) = (self.tid(image, "image")?, self.tid(loss, "loss")?);
        let a = self.conv_attrs(x, padding, pre_padding, post_padding, stride, dilation, convolution_mode)?;
        let outs = self.add_op(&name, compute_data_type, vec![], |g| Ok(vec![Some(g.conv_wgrad(dy, x, &[], a))]))?;
        self.one(py, outs)
    }

    #[pyo3(signature = (A, B, compute_data_type = None, padding = 0.0, name = String::new()))]
    #[allow(non_snake_case)]
    fn matmul(
        &self,
        py: Python<'_>,
        A: &Bound<'_, PyAny>,
        B: &Bound<'_, PyAny>,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        padding: f64,
        name: String,
    ) -> PyResult<Py<PyTensor>> {
        if padding != 0.0 {
            return Err(NotSupportedError::new_err("matmul padding values are not supported by ferrodnn"));
        }
        let (a, b) = (self.tid(A, "A")?, self.tid(B, "B")?);
        let outs = self.add_op(&name, compute_data_type, vec![], |g| Ok(vec![Some(g.matmul(a, b))]))?;
        self.one(py, outs)
    }

    /// A reduction; the axes are those its output's dims (set with `set_dim`) collapse to 1, as
    /// in the frontend, or `axes` (ferrodnn's addition).
    #[pyo3(signature = (input, mode, compute_data_type = None, name = String::new(), axes = None))]
    fn reduction(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        mode: PyReductionMode,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
        axes: Option<Vec<i64>>,
    ) -> PyResult<Py<PyTensor>> {
        let x = self.tid(input, "input")?;
        let rank = self.dims_of(x)?.len() as i64;
        let m = match mode {
            PyReductionMode::ADD => ReductionMode::Add,
            PyReductionMode::MUL => ReductionMode::Mul,
            PyReductionMode::MIN => ReductionMode::Min,
            PyReductionMode::MAX => ReductionMode::Max,
            PyReductionMode::AMAX => ReductionMode::Amax,
            PyReductionMode::AVG => ReductionMode::Avg,
            PyReductionMode::NORM1 => ReductionMode::Norm1,
            PyReductionMode::NORM2 => ReductionMode::Norm2,
            PyReductionMode::MUL_NO_ZEROS => ReductionMode::MulNoZeros,
            PyReductionMode::NOT_SET => return Err(PyValueError::new_err("reduction: mode is reduction_mode.NOT_SET; give the reduction's mode (ADD, MAX, ...)")),
        };
        let explicit: Option<Vec<usize>> = axes.map(|a| a.iter().map(|&v| if v < 0 { (v + rank) as usize } else { v as usize }).collect());
        let deferred = explicit.is_none();
        let outs = self.add_op(&name, compute_data_type, vec![], |g| Ok(vec![Some(g.reduction(x, m, explicit.as_deref().unwrap_or(&[])))]))?;
        if deferred {
            let mut st = lock(&self.state)?;
            let ni = st.graph.nodes.len() - 1;
            st.meta.reductions.push(ni);
        }
        self.one(py, outs)
    }

    #[pyo3(signature = (input, compute_data_type = None, name = String::new()))]
    fn genstats(&self, py: Python<'_>, input: &Bound<'_, PyAny>, compute_data_type: Option<&Bound<'_, PyAny>>, name: String) -> PyResult<Vec<Option<Py<PyTensor>>>> {
        let x = self.tid(input, "input")?;
        let outs = self.add_op(&name, compute_data_type, vec![], |g| {
            let (s, q) = g.genstats(x);
            Ok(vec![Some(s), Some(q)])
        })?;
        self.outs(py, outs)
    }

    /// Returns [y, mean, inv_variance]; the statistics are None in the inference phase.
    #[pyo3(signature = (norm_forward_phase, input, scale = None, bias = None, epsilon = None, compute_data_type = None, name = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn layernorm(
        &self,
        py: Python<'_>,
        norm_forward_phase: Option<PyNormPhase>,
        input: &Bound<'_, PyAny>,
        scale: Option<&Bound<'_, PyAny>>,
        bias: Option<&Bound<'_, PyAny>>,
        epsilon: Option<&Bound<'_, PyAny>>,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
    ) -> PyResult<Vec<Option<Py<PyTensor>>>> {
        self.norm3(py, "layernorm", norm_forward_phase, input, scale, bias, epsilon, compute_data_type, name)
    }

    #[pyo3(signature = (norm_forward_phase, input, scale = None, bias = None, epsilon = None, compute_data_type = None, name = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn instancenorm(
        &self,
        py: Python<'_>,
        norm_forward_phase: Option<PyNormPhase>,
        input: &Bound<'_, PyAny>,
        scale: Option<&Bound<'_, PyAny>>,
        bias: Option<&Bound<'_, PyAny>>,
        epsilon: Option<&Bound<'_, PyAny>>,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
    ) -> PyResult<Vec<Option<Py<PyTensor>>>> {
        self.norm3(py, "instancenorm", norm_forward_phase, input, scale, bias, epsilon, compute_data_type, name)
    }

    /// Group normalization (ferrodnn's addition; PyTorch's `group_norm`): the channels (axis 1)
    /// in `groups` groups, statistics per (n, group). Returns [y, mean, inv_variance] (the
    /// statistics `[N, groups, 1, ...]`, None in the inference phase).
    #[pyo3(signature = (norm_forward_phase = None, input = None, scale = None, bias = None, epsilon = None, groups = None, compute_data_type = None, name = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn group_norm(
        &self,
        py: Python<'_>,
        norm_forward_phase: Option<PyNormPhase>,
        input: Option<&Bound<'_, PyAny>>,
        scale: Option<&Bound<'_, PyAny>>,
        bias: Option<&Bound<'_, PyAny>>,
        epsilon: Option<&Bound<'_, PyAny>>,
        groups: Option<i64>,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
    ) -> PyResult<Vec<Option<Py<PyTensor>>>> {
        let input = input.ok_or_else(|| PyValueError::new_err("group_norm needs an input tensor"))?;
        let x = self.tid(input, "input")?;
        let s = self.opt_tid(scale, "scale")?.ok_or_else(|| PyValueError::new_err("group_norm needs a scale tensor"))?;
        let b = self.opt_tid(bias, "bias")?.ok_or_else(|| PyValueError::new_err("group_norm needs a bias tensor"))?;
        let groups = groups.ok_or_else(|| PyValueError::new_err("group_norm needs groups (the number of channel groups)"))?;
        let eps = self.scalar(epsilon, "epsilon")?;
        let mut attrs = GroupnormAttrs::new(groups);
        attrs.phase = Self::norm_attrs(norm_forward_phase).phase;
        let outs = self.add_op(&name, compute_data_type, vec![(AttrKind::Epsilon, eps)], move |g| {
            let (y, m, v) = g.groupnorm(x, s, b, attrs);
            Ok(vec![Some(y), m, v])
        })?;
        self.outs(py, outs)
    }

    #[pyo3(signature = (norm_forward_phase, input, scale = None, bias = None, epsilon = None, compute_data_type = None, name = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn adalayernorm(
        &self,
        py: Python<'_>,
        norm_forward_phase: Option<PyNormPhase>,
        input: &Bound<'_, PyAny>,
        scale: Option<&Bound<'_, PyAny>>,
        bias: Option<&Bound<'_, PyAny>>,
        epsilon: Option<&Bound<'_, PyAny>>,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
    ) -> PyResult<Vec<Option<Py<PyTensor>>>> {
        self.norm3(py, "adalayernorm", norm_forward_phase, input, scale, bias, epsilon, compute_data_type, name)
    }

    /// Returns [y, inv_variance] (None in the inference phase).
    #[pyo3(signature = (norm_forward_phase, input, scale = None, bias = None, epsilon = None, compute_data_type = None, name = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm(
        &self,
        py: Python<'_>,
        norm_forward_phase: Option<PyNormPhase>,
        input: &Bound<'_, PyAny>,
        scale: Option<&Bound<'_, PyAny>>,
        bias: Option<&Bound<'_, PyAny>>,
        epsilon: Option<&Bound<'_, PyAny>>,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
    ) -> PyResult<Vec<Option<Py<PyTensor>>>> {
        let x = self.tid(input, "input")?;
        let s = self.opt_tid(scale, "scale")?.ok_or_else(|| PyValueError::new_err("rmsnorm needs a scale tensor"))?;
        let b = self.opt_tid(bias, "bias")?;
        let eps = self.scalar(epsilon, "epsilon")?;
        let attrs = Self::norm_attrs(norm_forward_phase);
        let outs = self.add_op(&name, compute_data_type, vec![(AttrKind::Epsilon, eps)], |g| {
            let (y, inv) = g.rmsnorm(x, s, b, attrs);
            Ok(vec![Some(y), inv])
        })?;
        self.outs(py, outs)
    }

    /// Returns [y, mean, inv_variance, next_running_mean, next_running_var] (the running
    /// statistics None when no input running statistics are given).
    #[pyo3(signature = (input, scale, bias, in_running_mean = None, in_running_var = None, epsilon = None, momentum = None, peer_stats = None, compute_data_type = None, name = String::new(), norm_forward_phase = None))]
    #[allow(clippy::too_many_arguments)]
    fn batchnorm(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        scale: &Bound<'_, PyAny>,
        bias: &Bound<'_, PyAny>,
        in_running_mean: Option<&Bound<'_, PyAny>>,
        in_running_var: Option<&Bound<'_, PyAny>>,
        epsilon: Option<&Bound<'_, PyAny>>,
        momentum: Option<&Bound<'_, PyAny>>,
        peer_stats: Option<Vec<Bound<'_, PyAny>>>,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
        norm_forward_phase: Option<PyNormPhase>,
    ) -> PyResult<Vec<Option<Py<PyTensor>>>> {
        if norm_forward_phase == Some(PyNormPhase::INFERENCE) {
            return Err(PyValueError::new_err("batchnorm is the training op; use batchnorm_inference for the inference phase"));
        }
        let (x, s, b) = (self.tid(input, "input")?, self.tid(scale, "scale")?, self.tid(bias, "bias")?);
        let rm = self.opt_tid(in_running_mean, "in_running_mean")?;
        let rv = self.opt_tid(in_running_var, "in_running_var")?;
        let running = match (rm, rv) {
            (Some(m), Some(v)) => Some((m, v)),
            (None, None) => None,
            _ => return Err(PyValueError::new_err("give both in_running_mean and in_running_var, or neither")),
        };
        let peers = peer_stats.unwrap_or_default().iter().enumerate().map(|(i, t)| self.tid(t, &format!("peer_stats[{i}]"))).collect::<PyResult<Vec<_>>>()?;
        let eps = self.scalar(epsilon, "epsilon")?;
        let mom = self.scalar(momentum, "momentum")?;
        let outs = self.add_op(&name, compute_data_type, vec![(AttrKind::Epsilon, eps), (AttrKind::Momentum, mom)], |g| {
            let (y, mean, inv, run) = g.batchnorm(x, s, b, running, &peers, BatchnormAttrs::default());
            Ok(vec![Some(y), Some(mean), Some(inv), run.map(|r| r.0), run.map(|r| r.1)])
        })?;
        self.outs(py, outs)
    }

    #[pyo3(signature = (input, mean, inv_variance, scale, bias, compute_data_type = None, name = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn batchnorm_inference(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        mean: &Bound<'_, PyAny>,
        inv_variance: &Bound<'_, PyAny>,
        scale: &Bound<'_, PyAny>,
        bias: &Bound<'_, PyAny>,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
    ) -> PyResult<Py<PyTensor>> {
        let (x, m, v) = (self.tid(input, "input")?, self.tid(mean, "mean")?, self.tid(inv_variance, "inv_variance")?);
        let (s, b) = (self.tid(scale, "scale")?, self.tid(bias, "bias")?);
        let outs = self.add_op(&name, compute_data_type, vec![], |g| Ok(vec![Some(g.batchnorm_inference(x, s, b, m, v))]))?;
        self.one(py, outs)
    }

    /// Returns [dx, dscale, dbias].
    #[pyo3(signature = (grad, input, scale, mean, inv_variance, peer_stats = None, compute_data_type = None, name = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn batchnorm_backward(
        &self,
        py: Python<'_>,
        grad: &Bound<'_, PyAny>,
        input: &Bound<'_, PyAny>,
        scale: &Bound<'_, PyAny>,
        mean: &Bound<'_, PyAny>,
        inv_variance: &Bound<'_, PyAny>,
        peer_stats: Option<Vec<Bound<'_, PyAny>>>,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
    ) -> PyResult<Vec<Option<Py<PyTensor>>>> {
        if peer_stats.is_some_and(|p| !p.is_empty()) {
            return Err(NotSupportedError::new_err("batchnorm_backward with peer statistics is not supported by ferrodnn"));
        }
        self.norm_bwd(py, "batchnorm_backward", grad, input, scale, Some(mean), Some(inv_variance), compute_data_type, name)
    }

    /// Returns [dx, dscale, dbias].
    #[pyo3(signature = (grad, input, scale, mean, inv_variance, compute_data_type = None, name = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn layernorm_backward(
        &self,
        py: Python<'_>,
        grad: &Bound<'_, PyAny>,
        input: &Bound<'_, PyAny>,
        scale: &Bound<'_, PyAny>,
        mean: &Bound<'_, PyAny>,
        inv_variance: &Bound<'_, PyAny>,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
    ) -> PyResult<Vec<Option<Py<PyTensor>>>> {
        self.norm_bwd(py, "layernorm_backward", grad, input, scale, Some(mean), Some(inv_variance), compute_data_type, name)
    }

    /// Returns [dx, dscale, dbias].
    #[pyo3(signature = (grad, input, scale, mean = None, inv_variance = None, compute_data_type = None, name = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn instancenorm_backward(
        &self,
        py: Python<'_>,
        grad: &Bound<'_, PyAny>,
        input: &Bound<'_, PyAny>,
        scale: &Bound<'_, PyAny>,
        mean: Option<&Bound<'_, PyAny>>,
        inv_variance: Option<&Bound<'_, PyAny>>,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
    ) -> PyResult<Vec<Option<Py<PyTensor>>>> {
        self.norm_bwd(py, "instancenorm_backward", grad, input, scale, mean, inv_variance, compute_data_type, name)
    }

    /// Gradient of `group_norm` with `groups` groups. Returns [dx, dscale, dbias].
    #[pyo3(signature = (grad, input, scale, mean, inv_variance, groups, compute_data_type = None, name = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn group_norm_backward(
        &self,
        py: Python<'_>,
        grad: &Bound<'_, PyAny>,
        input: &Bound<'_, PyAny>,
        scale: &Bound<'_, PyAny>,
        mean: &Bound<'_, PyAny>,
        inv_variance: &Bound<'_, PyAny>,
        groups: i64,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
    ) -> PyResult<Vec<Option<Py<PyTensor>>>> {
        let (dy, x, s) = (self.tid(grad, "grad")?, self.tid(input, "input")?, self.tid(scale, "scale")?);
        let (m, v) = (self.tid(mean, "mean")?, self.tid(inv_variance, "inv_variance")?);
        let outs = self.add_op(&name, compute_data_type, vec![], move |g| {
            let (dx, ds, db) = g.groupnorm_backward(dy, x, s, m, v, groups);
            Ok(vec![Some(dx), Some(ds), Some(db)])
        })?;
        self.outs(py, outs)
    }

    /// Returns [dx, dscale, dbias].
    #[pyo3(signature = (grad, input, scale, mean, inv_variance, compute_data_type = None, name = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn adalayernorm_backward(
        &self,
        py: Python<'_>,
        grad: &Bound<'_, PyAny>,
        input: &Bound<'_, PyAny>,
        scale: &Bound<'_, PyAny>,
        mean: &Bound<'_, PyAny>,
        inv_variance: &Bound<'_, PyAny>,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
    ) -> PyResult<Vec<Option<Py<PyTensor>>>> {
        self.norm_bwd(py, "adalayernorm_backward", grad, input, scale, Some(mean), Some(inv_variance), compute_data_type, name)
    }

    /// Returns [dx, dscale, dbias] (dbias None unless has_dbias).
    #[pyo3(signature = (grad, input, scale, inv_variance, has_dbias = false, compute_data_type = None, name = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm_backward(
        &self,
        py: Python<'_>,
        grad: &Bound<'_, PyAny>,
        input: &Bound<'_, PyAny>,
        scale: &Bound<'_, PyAny>,
        inv_variance: &Bound<'_, PyAny>,
        has_dbias: bool,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
    ) -> PyResult<Vec<Option<Py<PyTensor>>>> {
        let (dy, x, s, inv) = (self.tid(grad, "grad")?, self.tid(input, "input")?, self.tid(scale, "scale")?, self.tid(inv_variance, "inv_variance")?);
        let outs = self.add_op(&name, compute_data_type, vec![], |g| {
            let (dx, ds, db) = g.rmsnorm_backward(dy, x, s, inv, has_dbias);
            Ok(vec![Some(dx), Some(ds), db])
        })?;
        self.outs(py, outs)
    }

    /// ferrodnn's bn_finalize: per-channel statistics from genstats' sums. Returns
    /// [eq_scale, eq_bias, saved_mean, saved_inv_std, next_running_mean, next_running_var].
    #[pyo3(signature = (sum, sq_sum, scale, bias, accum_count, epsilon = None, momentum = None, prev_running_mean = None, prev_running_var = None, compute_data_type = None, name = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn bn_finalize(
        &self,
        py: Python<'_>,
        sum: &Bound<'_, PyAny>,
        sq_sum: &Bound<'_, PyAny>,
        scale: &Bound<'_, PyAny>,
        bias: &Bound<'_, PyAny>,
        accum_count: i64,
        epsilon: Option<&Bound<'_, PyAny>>,
        momentum: Option<&Bound<'_, PyAny>>,
        prev_running_mean: Option<&Bound<'_, PyAny>>,
        prev_running_var: Option<&Bound<'_, PyAny>>,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
    ) -> PyResult<Vec<Option<Py<PyTensor>>>> {
        let (s1, s2, sc, b) = (self.tid(sum, "sum")?, self.tid(sq_sum, "sq_sum")?, self.tid(scale, "scale")?, self.tid(bias, "bias")?);
        let running = match (self.opt_tid(prev_running_mean, "prev_running_mean")?, self.opt_tid(prev_running_var, "prev_running_var")?) {
            (Some(m), Some(v)) => Some((m, v)),
            (None, None) => None,
            _ => return Err(PyValueError::new_err("give both prev_running_mean and prev_running_var, or neither")),
        };
        let eps = self.scalar(epsilon, "epsilon")?;
        let mom = self.scalar(momentum, "momentum")?;
        let outs = self.add_op(&name, compute_data_type, vec![(AttrKind::Epsilon, eps), (AttrKind::Momentum, mom)], |g| {
            let (a, b2, c, d, run) = g.bn_finalize(s1, s2, sc, b, running, BnFinalizeAttrs::new(accum_count));
            Ok(vec![Some(a), Some(b2), Some(c), Some(d), run.map(|r| r.0), run.map(|r| r.1)])
        })?;
        self.outs(py, outs)
    }

    /// ferrodnn's softmax over `axis` (log-softmax with `use_log`). Returns y, or [y, stats]
    /// with generate_stats.
    #[pyo3(signature = (input, axis = -1, use_log = false, generate_stats = false, compute_data_type = None, name = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn softmax(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        axis: i64,
        use_log: bool,
        generate_stats: bool,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
    ) -> PyResult<Py<PyAny>> {
        let x = self.tid(input, "input")?;
        let axis = norm_axis(axis, self.dims_of(x)?.len())?;
        let outs = self.add_op(&name, compute_data_type, vec![], |g| {
            let (y, s) = g.softmax(x, axis, use_log, generate_stats);
            Ok(vec![Some(y), s])
        })?;
        if generate_stats {
            Ok(self.outs(py, outs)?.into_pyobject(py)?.into_any().unbind())
        } else {
            Ok(self.one(py, outs)?.into_any())
        }
    }

    /// ferrodnn's softmax backward: dx from the forward output y and its gradient.
    #[pyo3(signature = (y, loss, axis = -1, use_log = false, compute_data_type = None, name = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn softmax_backward(
        &self,
        py: Python<'_>,
        y: &Bound<'_, PyAny>,
        loss: &Bound<'_, PyAny>,
        axis: i64,
        use_log: bool,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
    ) -> PyResult<Py<PyTensor>> {
        let (yt, dy) = (self.tid(y, "y")?, self.tid(loss, "loss")?);
        let axis = norm_axis(axis, self.dims_of(yt)?.len())?;
        let outs = self.add_op(&name, compute_data_type, vec![], |g| Ok(vec![Some(g.softmax_backward(yt, dy, axis, use_log))]))?;
        self.one(py, outs)
    }

    /// Pooling. Returns [y, index] (index is always None: ferrodnn's max-pool backward reads x).
    #[pyo3(signature = (input, resampling_mode, padding_mode = None, window = None, stride = None, pre_padding = None, post_padding = None, generate_index = false, compute_data_type = None, name = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn resample(
        &self,
        py: Python<'_>,
        input: &Bound<'_, PyAny>,
        resampling_mode: PyResampleMode,
        padding_mode: Option<PyPaddingMode>,
        window: Option<Vec<i64>>,
        stride: Option<Vec<i64>>,
        pre_padding: Option<Vec<i64>>,
        post_padding: Option<Vec<i64>>,
        generate_index: bool,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
    ) -> PyResult<Vec<Option<Py<PyTensor>>>> {
        let _ = (padding_mode, generate_index);
        let x = self.tid(input, "input")?;
        let a = self.resample_attrs(x, resampling_mode, window, stride, pre_padding, post_padding)?;
        let outs = self.add_op(&name, compute_data_type, vec![], |g| Ok(vec![Some(g.resample(x, a)), None]))?;
        self.outs(py, outs)
    }

    /// ferrodnn's pooling backward: dx from dy and the forward input x.
    #[pyo3(signature = (loss, input, resampling_mode, window = None, stride = None, pre_padding = None, post_padding = None, compute_data_type = None, name = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn resample_backward(
        &self,
        py: Python<'_>,
        loss: &Bound<'_, PyAny>,
        input: &Bound<'_, PyAny>,
        resampling_mode: PyResampleMode,
        window: Option<Vec<i64>>,
        stride: Option<Vec<i64>>,
        pre_padding: Option<Vec<i64>>,
        post_padding: Option<Vec<i64>>,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
    ) -> PyResult<Py<PyTensor>> {
        let (dy, x) = (self.tid(loss, "loss")?, self.tid(input, "input")?);
        let a = self.resample_attrs(x, resampling_mode, window, stride, pre_padding, post_padding)?;
        let outs = self.add_op(&name, compute_data_type, vec![], |g| Ok(vec![Some(g.resample_backward(dy, x, a))]))?;
        self.one(py, outs)
    }

    /// Scaled dot-product attention. Returns [o, stats] (stats None unless generate_stats).
    /// `rng_dump`, a tensor made by the caller (`[b, h_q, s_q, s_kv]`), receives the dropout
    /// mask (1 kept, 0 dropped); `score_max` and `score_sum_exp`, tensors made by the caller
    /// (`[b, h_q, s_q, 1]`), receive each row's softmax max and sum of exp(s - max);
    /// `sink_token` (`[1, h_q, 1, 1]` f32) is a logit per query head that joins every row's
    /// softmax with no value. The frontend's arguments ferrodnn cannot honour (`block_mask`,
    /// `score_mod`) raise NotSupportedError when set; `paged_attention_max_seq_len_kv`,
    /// `implementation` and `unfuse_fma` are accepted and ignored (ferrodnn picks its own
    /// kernels).
    #[pyo3(signature = (q, k, v, is_inference = None, attn_scale = None, bias = None, block_mask = None, use_alibi_mask = None, use_padding_mask = None, seq_len_q = None,
        seq_len_kv = None, use_causal_mask = None, use_causal_mask_bottom_right = None, sliding_window_length = None, diagonal_alignment = None,
        diagonal_band_left_bound = None, diagonal_band_right_bound = None, dropout = None, rng_dump = None, paged_attention_k_table = None, paged_attention_v_table = None,
        paged_attention_max_seq_len_kv = None, compute_data_type = None, name = String::new(), score_mod = None, generate_stats = None, implementation = None,
        score_max = None, score_sum_exp = None, sink_token = None, unfuse_fma = None))]
    #[allow(clippy::too_many_arguments)]
    fn sdpa(
        &self,
        py: Python<'_>,
        q: &Bound<'_, PyAny>,
        k: &Bound<'_, PyAny>,
        v: &Bound<'_, PyAny>,
        is_inference: Option<bool>,
        attn_scale: Option<&Bound<'_, PyAny>>,
        bias: Option<&Bound<'_, PyAny>>,
        block_mask: Option<&Bound<'_, PyAny>>,
        use_alibi_mask: Option<bool>,
        use_padding_mask: Option<bool>,
        seq_len_q: Option<&Bound<'_, PyAny>>,
        seq_len_kv: Option<&Bound<'_, PyAny>>,
        use_causal_mask: Option<bool>,
        use_causal_mask_bottom_right: Option<bool>,
        sliding_window_length: Option<i64>,
        diagonal_alignment: Option<PyDiagonalAlignment>,
        diagonal_band_left_bound: Option<i64>,
        diagonal_band_right_bound: Option<i64>,
        dropout: Option<&Bound<'_, PyAny>>,
        rng_dump: Option<&Bound<'_, PyAny>>,
        paged_attention_k_table: Option<&Bound<'_, PyAny>>,
        paged_attention_v_table: Option<&Bound<'_, PyAny>>,
        paged_attention_max_seq_len_kv: Option<&Bound<'_, PyAny>>,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
        score_mod: Option<&Bound<'_, PyAny>>,
        generate_stats: Option<bool>,
        implementation: Option<&Bound<'_, PyAny>>,
        score_max: Option<&Bound<'_, PyAny>>,
        score_sum_exp: Option<&Bound<'_, PyAny>>,
        sink_token: Option<&Bound<'_, PyAny>>,
        unfuse_fma: Option<bool>,
    ) -> PyResult<Vec<Option<Py<PyTensor>>>> {
        // None (as the frontend's tests pass it) is the default, false.
        let use_alibi_mask = use_alibi_mask.unwrap_or(false);
        let use_padding_mask = use_padding_mask.unwrap_or(false);
        let use_causal_mask = use_causal_mask.unwrap_or(false);
        let use_causal_mask_bottom_right = use_causal_mask_bottom_right.unwrap_or(false);
        let unfuse_fma = unfuse_fma.unwrap_or(false);
        let _ = (paged_attention_max_seq_len_kv, implementation, unfuse_fma);
        refuse_set("sdpa", &[("block_mask", block_mask), ("score_mod", score_mod)])?;
        let (qt, kt, vt) = (self.tid(q, "q")?, self.tid(k, "k")?, self.tid(v, "v")?);
        let dump_user = self.opt_tid(rng_dump, "rng_dump")?;
        let max_user = self.opt_tid(score_max, "score_max")?;
        let sum_user = self.opt_tid(score_sum_exp, "score_sum_exp")?;
        let mut attrs = SdpaAttrs {
            generate_stats: match (generate_stats, is_inference) {
                (Some(_), Some(_)) => return Err(PyValueError::new_err("set one of generate_stats and is_inference, not both")),
                (Some(g), None) => g,
                (None, Some(i)) => !i,
                (None, None) => false,
            },
            alibi: use_alibi_mask,
            padding_mask: use_padding_mask,
            ..Default::default()
        };
        sdpa_masks(&mut attrs, use_causal_mask, use_causal_mask_bottom_right, sliding_window_length, diagonal_alignment, diagonal_band_left_bound, diagonal_band_right_bound)?;
        let mut inputs = SdpaInputs {
            bias: self.opt_tid(bias, "bias")?,
            seq_len_q: self.opt_tid(seq_len_q, "seq_len_q")?,
            seq_len_kv: self.opt_tid(seq_len_kv, "seq_len_kv")?,
            page_table_k: self.opt_tid(paged_attention_k_table, "paged_attention_k_table")?,
            page_table_v: self.opt_tid(paged_attention_v_table, "paged_attention_v_table")?,
            sink_token: self.opt_tid(sink_token, "sink_token")?,
            ..Default::default()
        };
        self.sdpa_dropout(dropout, &mut attrs, &mut inputs)?;
        if dump_user.is_some() && attrs.dropout.is_none() {
            return Err(PyValueError::new_err("sdpa: rng_dump receives the dropout mask, so it needs dropout=(probability, seed, offset)"));
        }
        attrs.rng_dump = dump_user.is_some();
        attrs.score_max = max_user.is_some();
        attrs.score_sum_exp = sum_user.is_some();
        let scale = self.scalar(attn_scale, "attn_scale")?;
        // The outputs the frontend's caller makes: rng_dump, score_max, score_sum_exp.
        let made_by_user = [("rng_dump", dump_user, rng_dump), ("score_max", max_user, score_max), ("score_sum_exp", sum_user, score_sum_exp)];
        let outs = self.add_op(&name, compute_data_type, vec![(AttrKind::AttnScale, scale)], |g| {
            let (o, stats) = g.sdpa(qt, kt, vt, inputs, attrs);
            let mut outs = vec![Some(o), stats];
            // The node's output takes the place of the caller's tensor.
            for (port, user, _) in made_by_user {
                let made = g.sdpa_output(o, port);
                if let (Some(user), Some(made)) = (user, made) {
                    adopt_user_tensor(g, user, made);
                }
                outs.push(made);
            }
            Ok(outs)
        })?;
        for (i, (_, user, obj)) in made_by_user.into_iter().enumerate() {
            if let (Some(user), Some(made)) = (user, outs.get(2 + i).copied().flatten()) {
                self.point_at_output(obj, user, made)?;
            }
        }
        let outs = outs.into_iter().take(2).collect();
        self.outs(py, outs)
    }

    /// The backward pass of sdpa. Returns [dQ, dK, dV]; with a bias, the bias gradient goes to
    /// `dBias` when given, and the sink's gradient to `dSink_token` (`[1, h_q, 1, 1]`, which
    /// needs `sink_token`; without `dSink_token` the sink changes nothing here, the stats
    /// carrying it, and is not read). `rng_dump`, `score_mod` and `score_mod_bprop` raise
    /// NotSupportedError when set; `max_total_seq_len_q` / `_kv` are accepted and ignored.
    #[pyo3(signature = (q, k, v, o, dO, stats, attn_scale = None, bias = None, dBias = None, use_alibi_mask = None, use_padding_mask = None, seq_len_q = None,
        seq_len_kv = None, max_total_seq_len_q = None, max_total_seq_len_kv = None, use_causal_mask = None, use_causal_mask_bottom_right = None,
        sliding_window_length = None, diagonal_alignment = None, diagonal_band_left_bound = None, diagonal_band_right_bound = None, dropout = None, rng_dump = None,
        use_deterministic_algorithm = None, compute_data_type = None, name = String::new(), score_mod = None, score_mod_bprop = None, sink_token = None,
        dSink_token = None))]
    #[allow(clippy::too_many_arguments, non_snake_case)]
    fn sdpa_backward(
        &self,
        py: Python<'_>,
        q: &Bound<'_, PyAny>,
        k: &Bound<'_, PyAny>,
        v: &Bound<'_, PyAny>,
        o: &Bound<'_, PyAny>,
        dO: &Bound<'_, PyAny>,
        stats: &Bound<'_, PyAny>,
        attn_scale: Option<&Bound<'_, PyAny>>,
        bias: Option<&Bound<'_, PyAny>>,
        dBias: Option<&Bound<'_, PyAny>>,
        use_alibi_mask: Option<bool>,
        use_padding_mask: Option<bool>,
        seq_len_q: Option<&Bound<'_, PyAny>>,
        seq_len_kv: Option<&Bound<'_, PyAny>>,
        max_total_seq_len_q: Option<&Bound<'_, PyAny>>,
        max_total_seq_len_kv: Option<&Bound<'_, PyAny>>,
        use_causal_mask: Option<bool>,
        use_causal_mask_bottom_right: Option<bool>,
        sliding_window_length: Option<i64>,
        diagonal_alignment: Option<PyDiagonalAlignment>,
        diagonal_band_left_bound: Option<i64>,
        diagonal_band_right_bound: Option<i64>,
        dropout: Option<&Bound<'_, PyAny>>,
        rng_dump: Option<&Bound<'_, PyAny>>,
        use_deterministic_algorithm: Option<bool>,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
        score_mod: Option<&Bound<'_, PyAny>>,
        score_mod_bprop: Option<&Bound<'_, PyAny>>,
        sink_token: Option<&Bound<'_, PyAny>>,
        dSink_token: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<Option<Py<PyTensor>>>> {
        // None (as the frontend's tests pass it) is the default, false.
        let use_alibi_mask = use_alibi_mask.unwrap_or(false);
        let use_padding_mask = use_padding_mask.unwrap_or(false);
        let use_causal_mask = use_causal_mask.unwrap_or(false);
        let use_causal_mask_bottom_right = use_causal_mask_bottom_right.unwrap_or(false);
        let use_deterministic_algorithm = use_deterministic_algorithm.unwrap_or(false);
        let _ = (max_total_seq_len_q, max_total_seq_len_kv);
        refuse_set("sdpa_backward", &[("rng_dump", rng_dump), ("score_mod", score_mod), ("score_mod_bprop", score_mod_bprop)])?;
        let sink = self.opt_tid(sink_token, "sink_token")?;
        let dsink_user = self.opt_tid(dSink_token, "dSink_token")?;
        if dsink_user.is_some() && sink.is_none() {
            return Err(PyValueError::new_err("sdpa_backward: dSink_token (the sink's gradient) needs sink_token"));
        }
        if use_deterministic_algorithm {
            let mut st = lock(&self.state)?;
            st.meta.deterministic = true;
            st.changed();
        }
        let (qt, kt, vt) = (self.tid(q, "q")?, self.tid(k, "k")?, self.tid(v, "v")?);
        let (ot, dot, st) = (self.tid(o, "o")?, self.tid(dO, "dO")?, self.tid(stats, "stats")?);
        let dbias_user = self.opt_tid(dBias, "dBias")?;
        let mut attrs = SdpaAttrs { alibi: use_alibi_mask, padding_mask: use_padding_mask, ..Default::default() };
        sdpa_masks(&mut attrs, use_causal_mask, use_causal_mask_bottom_right, sliding_window_length, diagonal_alignment, diagonal_band_left_bound, diagonal_band_right_bound)?;
        let mut inputs = SdpaInputs {
            bias: self.opt_tid(bias, "bias")?,
            seq_len_q: self.opt_tid(seq_len_q, "seq_len_q")?,
            seq_len_kv: self.opt_tid(seq_len_kv, "seq_len_kv")?,
            // Only for its gradient: dQ, dK and dV do not read it.
            sink_token: dsink_user.and(sink),
            ..Default::default()
        };
        if dbias_user.is_some() && inputs.bias.is_none() {
            return Err(PyValueError::new_err("dBias needs the forward pass's bias"));
        }
        self.sdpa_dropout(dropout, &mut attrs, &mut inputs)?;
        let scale = self.scalar(attn_scale, "attn_scale")?;
        let outs = self.add_op(&name, compute_data_type, vec![(AttrKind::AttnScale, scale)], |g| {
            let grads = g.sdpa_backward(qt, kt, vt, ot, dot, st, inputs, attrs);
            // The frontend's caller makes dBias and dSink_token; the node's outputs take their
            // places.
            for (user, made) in [(dbias_user, grads.dbias), (dsink_user, grads.dsink_token)] {
                if let (Some(user), Some(made)) = (user, made) {
                    adopt_user_tensor(g, user, made);
                }
            }
            Ok(vec![Some(grads.dq), Some(grads.dk), Some(grads.dv), grads.dbias, grads.dsink_token])
        })?;
        if let (Some(user), Some(made)) = (dbias_user, outs.get(3).copied().flatten()) {
            self.point_at_output(dBias, user, made)?;
        }
        if let (Some(user), Some(made)) = (dsink_user, outs.get(4).copied().flatten()) {
            self.point_at_output(dSink_token, user, made)?;
        }
        let outs = outs.into_iter().take(3).collect();
        self.outs(py, outs)
    }

    /// `slices`: one Python slice per dim (positive steps).
    #[pyo3(signature = (input, slices = Vec::new(), compute_data_type = None, name = String::new()))]
    fn slice(&self, py: Python<'_>, input: &Bound<'_, PyAny>, slices: Vec<Bound<'_, PyAny>>, compute_data_type: Option<&Bound<'_, PyAny>>, name: String) -> PyResult<Py<PyTensor>> {
        let x = self.tid(input, "input")?;
        let dims = self.dims_of(x)?;
        if slices.len() > dims.len() {
            return Err(PyValueError::new_err(format!("{} slices for a tensor of rank {}", slices.len(), dims.len())));
        }
        let (mut starts, mut ends, mut steps) = (Vec::new(), Vec::new(), Vec::new());
        for (i, &d) in dims.iter().enumerate() {
            let (s, e, st) = match slices.get(i) {
                Some(sl) => slice_bounds(sl, d)?,
                None => (0, d, 1),
            };
            starts.push(s);
            ends.push(e);
            steps.push(st);
        }
        let outs = self.add_op(&name, compute_data_type, vec![], |g| Ok(vec![Some(g.slice_with_steps(x, &starts, &ends, &steps))]))?;
        self.one(py, outs)
    }

    /// Output axis i is input axis permutation[i].
    #[pyo3(signature = (input, permutation, compute_data_type = None, name = String::new()))]
    fn transpose(&self, py: Python<'_>, input: &Bound<'_, PyAny>, permutation: Vec<i64>, compute_data_type: Option<&Bound<'_, PyAny>>, name: String) -> PyResult<Py<PyTensor>> {
        let x = self.tid(input, "input")?;
        let rank = self.dims_of(x)?.len();
        let perm = permutation.iter().map(|&p| norm_axis(p, rank)).collect::<PyResult<Vec<_>>>()?;
        let outs = self.add_op(&name, compute_data_type, vec![], |g| Ok(vec![Some(g.transpose(x, &perm))]))?;
        self.one(py, outs)
    }

    /// A logical (row-major) reshape; the target dims are set on the output with `set_dim`, as in
    /// the frontend, or given as `dim` (ferrodnn's addition, one entry may be -1).
    #[pyo3(signature = (input, name = String::new(), reshape_mode = None, dim = None))]
    fn reshape(&self, py: Python<'_>, input: &Bound<'_, PyAny>, name: String, reshape_mode: Option<PyReshapeMode>, dim: Option<Vec<i64>>) -> PyResult<Py<PyTensor>> {
        let _ = reshape_mode;
        let x = self.tid(input, "input")?;
        let given = dim.is_some();
        let outs = self.add_op(&name, None, vec![], |g| Ok(vec![Some(g.reshape(x, dim.as_deref().unwrap_or(&[])))]))?;
        if given {
            self.user_set(&outs, true, false)?;
        }
        self.one(py, outs)
    }

    #[pyo3(signature = (inputs, axis, in_place_index = None, name = String::new()))]
    fn concatenate(&self, py: Python<'_>, inputs: Vec<Bound<'_, PyAny>>, axis: i64, in_place_index: Option<i64>, name: String) -> PyResult<Py<PyTensor>> {
        if in_place_index.is_some() {
            return Err(NotSupportedError::new_err("in-place concatenation is not supported by ferrodnn"));
        }
        let ids = inputs.iter().enumerate().map(|(i, t)| self.tid(t, &format!("inputs[{i}]"))).collect::<PyResult<Vec<_>>>()?;
        let rank = match ids.first() {
            Some(&t) => self.dims_of(t)?.len(),
            None => return Err(PyValueError::new_err("concatenate needs at least one input")),
        };
        let axis = norm_axis(axis, rank)?;
        let outs = self.add_op(&name, None, vec![], |g| Ok(vec![Some(g.concatenate(&ids, axis))]))?;
        self.one(py, outs)
    }

    /// ferrodnn's copy: the same logical tensor stored with `stride` and cast to `data_type`.
    #[pyo3(signature = (input, stride = None, data_type = None, name = String::new()))]
    fn copy(&self, py: Python<'_>, input: &Bound<'_, PyAny>, stride: Option<Vec<i64>>, data_type: Option<&Bound<'_, PyAny>>, name: String) -> PyResult<Py<PyTensor>> {
        let x = self.tid(input, "input")?;
        let dt = parse_dtype(data_type)?;
        let given = stride.is_some();
        let outs = self.add_op(&name, None, vec![], |g| Ok(vec![Some(g.copy(x, stride.as_deref(), dt))]))?;
        if given {
            self.user_set(&outs, false, true)?;
        }
        self.one(py, outs)
    }

    /// Random numbers from Philox (seed and offset are one-element integer tensors): uniform in
    /// [low, high), or Bernoulli with `bernoulli_probability`. The output dims are `dim` or set
    /// with `set_dim`.
    #[pyo3(signature = (seed, offset, dim = None, distribution = None, bernoulli_probability = None, low = 0.0, high = 1.0, name = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn rng(
        &self,
        py: Python<'_>,
        seed: &Bound<'_, PyAny>,
        offset: &Bound<'_, PyAny>,
        dim: Option<Vec<i64>>,
        distribution: Option<PyRngDistribution>,
        bernoulli_probability: Option<f64>,
        low: f64,
        high: f64,
        name: String,
    ) -> PyResult<Py<PyTensor>> {
        let (s, o) = (self.tid(seed, "seed")?, self.tid(offset, "offset")?);
        let dist = match (distribution, bernoulli_probability) {
            (Some(PyRngDistribution::BERNOULLI), p) | (None, p @ Some(_)) => Distribution::Bernoulli { probability: p.unwrap_or(0.5) },
            _ => Distribution::Uniform { low, high },
        };
        let given = dim.is_some();
        let outs = self.add_op(&name, None, vec![], |g| Ok(vec![Some(g.rng(s, o, dim.as_deref().unwrap_or(&[]), dist))]))?;
        if given {
            self.user_set(&outs, true, false)?;
        }
        self.one(py, outs)
    }

    /// A recurrent network's forward pass (cuDNN's cudnnRNNForward; ferrodnn's `rnn` op): `x`
    /// and the packed weight space `weights` with the descriptor `desc` (a dict, as
    /// `ferrodnn.rnn.rnn_desc` builds it) -> `[y, hy, cy, reserve]` (`cy` for LSTM, `reserve`
    /// in training mode, else None). `seed` and `offset` are dropout's.
    #[pyo3(signature = (x, weights, desc, hx = None, cx = None, seq_lengths = None, seed = None, offset = None, compute_data_type = None, name = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn rnn(
        &self,
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        weights: &Bound<'_, PyAny>,
        desc: &Bound<'_, PyAny>,
        hx: Option<&Bound<'_, PyAny>>,
        cx: Option<&Bound<'_, PyAny>>,
        seq_lengths: Option<&Bound<'_, PyAny>>,
        seed: Option<&Bound<'_, PyAny>>,
        offset: Option<&Bound<'_, PyAny>>,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
    ) -> PyResult<Vec<Option<Py<PyTensor>>>> {
        let d = crate::rnn::desc_from_py(desc)?;
        let (xt, wt) = (self.tid(x, "x")?, self.tid(weights, "weights")?);
        let inputs = RnnInputs {
            hx: self.opt_tid(hx, "hx")?,
            cx: self.opt_tid(cx, "cx")?,
            seq_lengths: self.opt_tid(seq_lengths, "seq_lengths")?,
            seed: self.opt_tid(seed, "seed")?,
            offset: self.opt_tid(offset, "offset")?,
        };
        let outs = self.add_op(&name, compute_data_type, vec![], |g| {
            let o = g.rnn(xt, wt, inputs, d);
            Ok(vec![Some(o.y), Some(o.hy), o.cy, o.reserve])
        })?;
        self.outs(py, outs)
    }

    /// The backward data pass of `rnn` (cudnnRNNBackwardData_v8): -> `[dx, dhx, dcx, dgates]`
    /// (`dcx` for LSTM; `dgates` is what `rnn_backward_weights` reads).
    #[pyo3(signature = (dy, weights, reserve, desc, hx = None, cx = None, dhy = None, dcy = None, seq_lengths = None, compute_data_type = None, name = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn rnn_backward_data(
        &self,
        py: Python<'_>,
        dy: &Bound<'_, PyAny>,
        weights: &Bound<'_, PyAny>,
        reserve: &Bound<'_, PyAny>,
        desc: &Bound<'_, PyAny>,
        hx: Option<&Bound<'_, PyAny>>,
        cx: Option<&Bound<'_, PyAny>>,
        dhy: Option<&Bound<'_, PyAny>>,
        dcy: Option<&Bound<'_, PyAny>>,
        seq_lengths: Option<&Bound<'_, PyAny>>,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
    ) -> PyResult<Vec<Option<Py<PyTensor>>>> {
        let d = crate::rnn::desc_from_py(desc)?;
        let (dyt, wt, rt) = (self.tid(dy, "dy")?, self.tid(weights, "weights")?, self.tid(reserve, "reserve")?);
        let inputs = RnnBackwardInputs {
            hx: self.opt_tid(hx, "hx")?,
            cx: self.opt_tid(cx, "cx")?,
            dhy: self.opt_tid(dhy, "dhy")?,
            dcy: self.opt_tid(dcy, "dcy")?,
            seq_lengths: self.opt_tid(seq_lengths, "seq_lengths")?,
        };
        let outs = self.add_op(&name, compute_data_type, vec![], |g| {
            let o = g.rnn_backward_data(dyt, wt, rt, inputs, d);
            Ok(vec![Some(o.dx), Some(o.dhx), o.dcx, Some(o.dgates)])
        })?;
        self.outs(py, outs)
    }

    /// The backward weights pass of `rnn` (cudnnRNNBackwardWeights_v8): -> `dw`, the gradient
    /// of the weight space added to `dw_in` when given (CUDNN_WGRAD_MODE_ADD).
    #[pyo3(signature = (x, reserve, dgates, desc, hx = None, seq_lengths = None, dw_in = None, compute_data_type = None, name = String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn rnn_backward_weights(
        &self,
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        reserve: &Bound<'_, PyAny>,
        dgates: &Bound<'_, PyAny>,
        desc: &Bound<'_, PyAny>,
        hx: Option<&Bound<'_, PyAny>>,
        seq_lengths: Option<&Bound<'_, PyAny>>,
        dw_in: Option<&Bound<'_, PyAny>>,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
    ) -> PyResult<Py<PyTensor>> {
        let d = crate::rnn::desc_from_py(desc)?;
        let (xt, rt, gt) = (self.tid(x, "x")?, self.tid(reserve, "reserve")?, self.tid(dgates, "dgates")?);
        let (h, l, acc) = (self.opt_tid(hx, "hx")?, self.opt_tid(seq_lengths, "seq_lengths")?, self.opt_tid(dw_in, "dw_in")?);
        let outs = self.add_op(&name, compute_data_type, vec![], |g| Ok(vec![Some(g.rnn_backward_weights(xt, rt, gt, h, l, acc, d))]))?;
        self.one(py, outs)
    }

    /// Infer every shape and type and check the graph; assigns uids.
    fn validate(&self) -> PyResult<()> {
        lock(&self.state)?.lower()
    }

    fn build_operation_graph(&self) -> PyResult<()> {
        lock(&self.state)?.lower()
    }

    /// Append the handle's candidate plans to the graph's list of execution plans, best first
    /// (each engine's candidates, the CUDA engine's before the CPU engine's), without building
    /// them. Heuristic modes pick among cuDNN's engines; ferrodnn's handle ranks its own, so the
    /// modes are checked and otherwise ignored.
    #[pyo3(signature = (heur_modes = None))]
    fn create_execution_plans(&self, heur_modes: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        check_heur_modes("create_execution_plans", heur_modes)?;
        lock(&self.state)?.create_entries()
    }

    /// Append a plan of engine `engine_id` (see `get_engine_count`) with these knob values to the
    /// list: `knobs` maps ferrodnn's knob names (or `knob` objects from `get_knobs_for_engine`)
    /// to values in the knob's range. The frontend's `knob_type` keys name cuDNN's knobs, which
    /// ferrodnn's engines do not have: they are refused.
    #[pyo3(signature = (engine_id, knobs = None))]
    fn create_execution_plan(&self, engine_id: i64, knobs: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
        let mut given: Vec<(KnobKey, i64)> = Vec::new();
        for (k, v) in knobs.map(|d| d.iter().collect::<Vec<_>>()).unwrap_or_default() {
            let key = if let Ok(t) = k.extract::<PyKnobType>() {
                KnobKey::Type(t)
            } else if let Ok(n) = k.extract::<String>() {
                KnobKey::Name(n)
            } else if let Ok(kn) = k.downcast::<PyKnob>() {
                let kn = kn.get();
                match &kn.name {
                    Some(n) => KnobKey::Name(n.clone()),
                    None => KnobKey::Type(kn.knob_type),
                }
            } else {
                return Err(PyTypeError::new_err(format!("create_execution_plan: knob keys must be knob names (str), knob objects or knob_type values, got {}", type_name(&k))));
            };
            if v.is_instance_of::<PyBool>() {
                return Err(PyTypeError::new_err("create_execution_plan: knob values must be ints, got bool"));
            }
            let value = v.extract::<i64>().map_err(|_| PyTypeError::new_err(format!("create_execution_plan: knob values must be ints, got {}", type_name(&v))))?;
            given.push((key, value));
        }
        let mut st = lock(&self.state)?;
        st.lower()?;
        let kind = st.engine_of("create_execution_plan", engine_id)?;
        let cands = st.handle.candidates(&st.built()?.lowered, &PlanPolicy { engine: Some(kind), ..Default::default() }).map_err(to_py_err)?;
        let specs = plans::knob_ranges(&cands);
        let knobs = plans::checked_knobs(kind.name(), &specs, given).map_err(|m| NotSupportedError::new_err(format!("create_execution_plan: {m}")))?;
        let desc = PlanDesc { engine: kind, knobs, graph_key: cands[0].0.graph_key };
        let notes = st.handle.behavior(&st.built()?.lowered, &desc).map_err(to_py_err)?;
        st.built_mut()?.entries.push(Entry::new(desc, notes));
        Ok(())
    }

    /// The number of engines that could run graphs (the handle's: the CUDA engine, then the CPU
    /// engine; the CPU engine alone on a handle without a GPU). Engine ids are 0 to this - 1.
    fn get_engine_count(&self) -> PyResult<usize> {
        Ok(lock(&self.state)?.handle.engines().count())
    }

    /// The knobs of engine `engine_id` for this graph: those its candidate plans set, each a
    /// `knob` with ferrodnn's name, type `knob_type.NOT_SET` and the range of values the
    /// candidates give it. Raises NotSupportedError (a RuntimeError) when the engine cannot run
    /// the graph.
    fn get_knobs_for_engine(&self, engine_id: i64) -> PyResult<Vec<PyKnob>> {
        let mut st = lock(&self.state)?;
        st.lower()?;
        let kind = st.engine_of("get_knobs_for_engine", engine_id)?;
        let cands = st.handle.candidates(&st.built()?.lowered, &PlanPolicy { engine: Some(kind), ..Default::default() }).map_err(to_py_err)?;
        Ok(plans::knob_ranges(&cands))
    }

    /// Build the first plan of the list that builds (creating the list when it is empty); it
    /// becomes the plan `execute` runs. Errors say why no plan of any engine can run the graph.
    fn check_support(&self, py: Python<'_>) -> PyResult<()> {
        self.build_by_policy(py, false)
    }

    /// Build plans of the list: with `HEURISTICS_CHOICE` (the default) the first that builds,
    /// unless one is built already; with `ALL` every one that is not deselected. The first
    /// built becomes the plan `execute` runs.
    #[pyo3(signature = (policy = None))]
    fn build_plans(&self, py: Python<'_>, policy: Option<PyBuildPlanPolicy>) -> PyResult<()> {
        self.build_by_policy(py, policy == Some(PyBuildPlanPolicy::ALL))
    }

    /// Build plan `index` of the list (creating the list when it is empty); it becomes the plan
    /// `execute` runs, as in the frontend. Raises NotSupportedError saying why when the plan is
    /// deselected or fails to build.
    #[pyo3(signature = (index))]
    fn build_plan_at_index(&self, py: Python<'_>, index: i64) -> PyResult<()> {
        let name = {
            let mut st = lock(&self.state)?;
            st.ensure_entries()?;
            plans::plan_name(&st.entry("build_plan_at_index", index)?.desc)
        };
        match self.build_entry(py, index as usize, true)? {
            Ok(()) => Ok(()),
            Err(why) => Err(NotSupportedError::new_err(format!("build_plan_at_index: plan {index} ({name}): {why}"))),
        }
    }

    /// validate + build_operation_graph + create_execution_plans + check_support + build_plans.
    #[pyo3(signature = (heur_modes = None))]
    fn build(&self, py: Python<'_>, heur_modes: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        check_heur_modes("build", heur_modes)?;
        self.build_by_policy(py, false)
    }

    /// The length of the graph's list of execution plans (0 before `create_execution_plans`,
    /// `build_plans` or `build`).
    fn get_execution_plan_count(&self) -> PyResult<usize> {
        Ok(lock(&self.state)?.built.as_ref().map_or(0, |b| b.entries.len()))
    }

    /// The name of plan `index`: its engine and knobs, such as `cuda[fused=1]` or `cpu[]`.
    fn get_plan_name_at_index(&self, index: i64) -> PyResult<String> {
        let mut st = lock(&self.state)?;
        st.ensure_entries()?;
        Ok(plans::plan_name(&st.entry("get_plan_name_at_index", index)?.desc))
    }

    /// The workspace in bytes of the plan `execute` runs (the plans are built when none is).
    #[pyo3(signature = (handle = None))]
    fn get_workspace_size(&self, py: Python<'_>, handle: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
        let _ = handle;
        let i = self.ensure_candidate(py)?;
        let st = lock(&self.state)?;
        Ok(st.built()?.entries[i].plan.as_ref().map_or(0, |p| p.workspace_size()))
    }

    /// The workspace in bytes of plan `index`: 0 when it is not built (as the frontend says).
    #[pyo3(signature = (index))]
    fn get_workspace_size_plan_at_index(&self, index: i64) -> PyResult<usize> {
        let mut st = lock(&self.state)?;
        st.ensure_entries()?;
        Ok(st.entry("get_workspace_size_plan_at_index", index)?.plan.as_ref().map_or(0, |p| p.workspace_size()))
    }

    /// What the CUDA engine makes of this graph, without running it (`ferrodnn explain`): the
    /// fusion groups, which engine took each node and why each fast engine that could have taken
    /// it declined, the kernels with their launch shapes, and with `source=True` every kernel's
    /// text exactly as NVRTC compiles it. For the handle's GPU, or an H100 (sm_90a, 132 SMs) on a
    /// machine without one; `as_json=True` returns JSON text.
    #[pyo3(signature = (source = false, as_json = false))]
    fn explain(&self, source: bool, as_json: bool) -> PyResult<String> {
        let mut st = lock(&self.state)?;
        if st.built.is_none() {
            st.lower()?;
        }
        let target = match st.handle.cuda_device() {
            Some(d) => ferrodnn::engine::cuda::Target::new(&d.arch(), d.sm_count()),
            None => ferrodnn::engine::cuda::Target::sm90a(),
        };
        let lowered = &st.built.as_ref().expect("lowered").lowered;
        let e = ferrodnn::engine::cuda::explain(lowered, &target, &[]).map_err(to_py_err)?;
        if as_json {
            serde_json::to_string_pretty(&e).map_err(|e| SerializationError::new_err(e.to_string()))
        } else {
            Ok(e.to_text(source))
        }
    }

    /// The behavior notes of the plan `execute` runs (the plans are built when none is).
    fn get_behavior_notes(&self, py: Python<'_>) -> PyResult<Vec<PyBehaviorNote>> {
        let i = self.ensure_candidate(py)?;
        let st = lock(&self.state)?;
        Ok(frontend::behavior_notes(&st.built()?.entries[i].notes))
    }

    /// The behavior notes of plan `index` of the list, built or not (creating the list when it
    /// is empty).
    #[pyo3(signature = (index))]
    fn get_behavior_notes_for_plan_at_index(&self, index: i64) -> PyResult<Vec<PyBehaviorNote>> {
        let mut st = lock(&self.state)?;
        st.ensure_entries()?;
        Ok(frontend::behavior_notes(&st.entry("get_behavior_notes_for_plan_at_index", index)?.notes))
    }

    /// The numerical notes of the plan `execute` runs (ferrodnn's addition; see
    /// `numerical_note` for which ferrodnn reports).
    fn get_numerical_notes(&self, py: Python<'_>) -> PyResult<Vec<PyNumericalNote>> {
        let i = self.ensure_candidate(py)?;
        let st = lock(&self.state)?;
        Ok(frontend::numerical_notes(&st.built()?.entries[i].notes))
    }

    /// The numerical notes of plan `index` of the list (ferrodnn's addition).
    #[pyo3(signature = (index))]
    fn get_numerical_notes_for_plan_at_index(&self, index: i64) -> PyResult<Vec<PyNumericalNote>> {
        let mut st = lock(&self.state)?;
        st.ensure_entries()?;
        Ok(frontend::numerical_notes(&st.entry("get_numerical_notes_for_plan_at_index", index)?.notes))
    }

    /// Deselect plans whose name (see `get_plan_name_at_index`) contains any of these strings,
    /// such as "cuda" or "fused=0". Replaces the names given before, as the frontend does.
    fn deselect_engines(&self, engine_names: Vec<String>) -> PyResult<()> {
        lock(&self.state)?.filters.deselected_engines = engine_names;
        Ok(())
    }

    /// Keep only plans that have every one of these numerical notes.
    fn select_numeric_notes(&self, notes: Vec<PyNumericalNote>) -> PyResult<()> {
        lock(&self.state)?.filters.select_numeric.extend(notes);
        Ok(())
    }

    /// Deselect plans that have any of these numerical notes.
    fn deselect_numeric_notes(&self, notes: Vec<PyNumericalNote>) -> PyResult<()> {
        lock(&self.state)?.filters.deselect_numeric.extend(notes);
        Ok(())
    }

    /// Keep only plans that have every one of these behavior notes.
    fn select_behavior_notes(&self, notes: Vec<PyBehaviorNote>) -> PyResult<()> {
        lock(&self.state)?.filters.select_behavior.extend(notes);
        Ok(())
    }

    /// Deselect plans that have any of these behavior notes.
    fn deselect_behavior_notes(&self, notes: Vec<PyBehaviorNote>) -> PyResult<()> {
        lock(&self.state)?.filters.deselect_behavior.extend(notes);
        Ok(())
    }

    /// Refuse plans whose workspace is greater than `workspace` bytes (checked when each plan is
    /// built: ferrodnn knows a plan's workspace once it is built).
    fn deselect_workspace_greater_than(&self, workspace: i64) -> PyResult<()> {
        lock(&self.state)?.filters.max_workspace = Some(workspace);
        Ok(())
    }

    /// The frontend records the graph's launches into a CUDA graph; ferrodnn cannot.
    #[pyo3(signature = (handle, var_pack, workspace, cuda_graph))]
    fn populate_cuda_graph(&self, handle: &Bound<'_, PyAny>, var_pack: &Bound<'_, PyAny>, workspace: &Bound<'_, PyAny>, cuda_graph: &Bound<'_, PyAny>) -> PyResult<()> {
        let _ = (handle, var_pack, workspace, cuda_graph);
        Err(NotSupportedError::new_err("populate_cuda_graph: ferrodnn does not record its plans into CUDA graphs (run execute() instead)"))
    }

    /// See `populate_cuda_graph`.
    #[pyo3(signature = (handle, var_pack, workspace, cuda_graph))]
    fn update_cuda_graph(&self, handle: &Bound<'_, PyAny>, var_pack: &Bound<'_, PyAny>, workspace: &Bound<'_, PyAny>, cuda_graph: &Bound<'_, PyAny>) -> PyResult<()> {
        let _ = (handle, var_pack, workspace, cuda_graph);
        Err(NotSupportedError::new_err("update_cuda_graph: ferrodnn does not record its plans into CUDA graphs (run execute() instead)"))
    }

    /// Run the graph on the arrays of `variant_pack` (keyed by tensor or by uid; the frontend's
    /// name `tensor_to_device_buffer` works too). Host arrays run on the CPU engine, device arrays
    /// on the handle's CUDA engine (on its stream); by-value scalars are one-element host arrays
    /// or Python numbers. Every array is checked: its type, where it lives, a non-null pointer,
    /// and that the tensor's dims and strides reach no further than the array's memory; with
    /// `strict=True` (or `set_strict_buffers(True)`) its dims and strides must also equal the
    /// tensor's. With `as_views=True` every array is read as a view with its tensor's dims and
    /// strides from its first element, whatever its own dims and strides (an input of the
    /// tensor's dims but other strides is not refused; the same memory check applies: the view
    /// must reach no further than the array's memory), as ferrodnn.torch passes its tensors
    /// without making `as_strided` views of them; it cannot be combined with `strict=True`.
    ///
    /// Shape overrides (a graph made with `is_override_shape_enabled=True`): `override_uids`,
    /// `override_shapes` and `override_strides`, one entry per tensor, run the graph on tensors of
    /// other dims and strides (same rank; larger or smaller); the tensors the ops write that are
    /// not named are inferred again, keeping their layout. The plan for those shapes is built on
    /// first use and cached; a device workspace must hold what that plan needs, which the error
    /// says when it is more than `get_workspace_size()`.
    #[pyo3(signature = (variant_pack = None, workspace = None, handle = None, override_uids = None, override_shapes = None, override_strides = None, *, strict = None,
        tensor_to_device_buffer = None, as_views = None))]
    #[allow(clippy::too_many_arguments)]
    fn execute(
        &self,
        variant_pack: Option<&Bound<'_, PyDict>>,
        workspace: Option<&Bound<'_, PyAny>>,
        handle: Option<&Bound<'_, PyAny>>,
        override_uids: Option<&Bound<'_, PyAny>>,
        override_shapes: Option<&Bound<'_, PyAny>>,
        override_strides: Option<&Bound<'_, PyAny>>,
        strict: Option<bool>,
        tensor_to_device_buffer: Option<&Bound<'_, PyDict>>,
        as_views: Option<bool>,
    ) -> PyResult<()> {
        let pack = one_pack("execute", variant_pack, tensor_to_device_buffer)?;
        let overrides = shape_overrides("execute", [override_uids, override_shapes, override_strides])?;
        let layout = match (strict, as_views) {
            (Some(true), Some(true)) => {
                return Err(InvalidArgumentError::new_err("execute: strict=True and as_views=True cannot be combined (a view takes its tensor's dims and strides)"))
            }
            (_, Some(true)) => BufferLayout::View,
            _ if strict.unwrap_or_else(crate::strict_buffers_default) => BufferLayout::Strict,
            _ => BufferLayout::Pointer,
        };
        self.execute_inner(pack, workspace, handle, None, overrides, layout)
    }

    /// `execute` with the plan at `index` (see `execute`).
    #[pyo3(signature = (variant_pack = None, workspace = None, index = None, handle = None, override_uids = None, override_shapes = None, override_strides = None, *,
        strict = None, tensor_to_device_buffer = None))]
    #[allow(clippy::too_many_arguments)]
    fn execute_plan_at_index(
        &self,
        variant_pack: Option<&Bound<'_, PyDict>>,
        workspace: Option<&Bound<'_, PyAny>>,
        index: Option<i64>,
        handle: Option<&Bound<'_, PyAny>>,
        override_uids: Option<&Bound<'_, PyAny>>,
        override_shapes: Option<&Bound<'_, PyAny>>,
        override_strides: Option<&Bound<'_, PyAny>>,
        strict: Option<bool>,
        tensor_to_device_buffer: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        let pack = one_pack("execute_plan_at_index", variant_pack, tensor_to_device_buffer)?;
        let index = index.ok_or_else(|| PyTypeError::new_err("execute_plan_at_index() missing required argument 'index'"))?;
        let overrides = shape_overrides("execute_plan_at_index", [override_uids, override_shapes, override_strides])?;
        let layout = if strict.unwrap_or_else(crate::strict_buffers_default) { BufferLayout::Strict } else { BufferLayout::Pointer };
        self.execute_inner(pack, workspace, handle, Some(index), overrides, layout)
    }

    /// The graph and what the binding keeps beside it, as JSON bytes, with the engine and knobs
    /// of the plan `execute` runs when one is built (`deserialize` restores it as the graph's one
    /// execution plan, as the frontend restores its serialized plan).
    fn serialize<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let mut st = lock(&self.state)?;
        st.ensure_uids();
        let plan: Option<PlanDesc> = st.built.as_ref().and_then(|b| b.candidate.map(|c| b.entries[c].desc.clone()));
        let env = serde_json::json!({ "format": FORMAT, "graph": st.graph, "meta": st.meta, "plan": plan });
        let text = serde_json::to_vec(&env).map_err(|e| SerializationError::new_err(format!("the graph could not be serialized: {e}")))?;
        Ok(PyBytes::new(py, &text))
    }

    /// Replace this graph by a serialized one (bytes, a list of ints or a str); `handle` first
    /// is accepted as the frontend allows. The graph is validated; execute it with a variant
    /// pack keyed by uid. A serialized plan becomes the graph's one execution plan (built when
    /// first needed) when the handle has its engine; otherwise the graph gets its plans anew.
    #[pyo3(signature = (*args, handle_ = None, pyobj = None))]
    fn deserialize(&self, args: &Bound<'_, PyTuple>, handle_: Option<&Bound<'_, PyAny>>, pyobj: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let args: Vec<Bound<'_, PyAny>> = args.iter().collect();
        let (handle, data) = match (args.as_slice(), handle_, pyobj) {
            ([h, d], None, None) => (Some(h.clone()), d.clone()),
            ([d], h, None) => (h.cloned(), d.clone()),
            ([h], None, Some(d)) => (Some(h.clone()), d.clone()),
            ([], h, Some(d)) => (h.cloned(), d.clone()),
            _ => return Err(PyTypeError::new_err("deserialize() takes (data), (handle, data), or the keywords handle_= and pyobj=")),
        };
        let handle = handle.as_ref();
        let data = &data;
        let bytes: Vec<u8> = if let Ok(s) = data.downcast::<PyString>() {
            s.to_str()?.as_bytes().to_vec()
        } else if let Ok(b) = data.downcast::<PyBytes>() {
            b.as_bytes().to_vec()
        } else {
            data.extract::<Vec<u8>>().map_err(|_| PyTypeError::new_err("deserialize takes bytes, a list of ints or a str"))?
        };
        if bytes.len() > 64 << 20 {
            return Err(SerializationError::new_err(format!("serialized graph is {} bytes; at most 64 MiB are accepted", bytes.len())));
        }
        #[derive(Deserialize)]
        struct Env {
            format: String,
            graph: Graph,
            #[serde(default)]
            meta: Meta,
            #[serde(default)]
            plan: Option<PlanDesc>,
        }
        let env: Env = serde_json::from_slice(&bytes).map_err(|e| SerializationError::new_err(format!("serialized graph is malformed: {e}")))?;
        if env.format != FORMAT {
            return Err(SerializationError::new_err(format!("serialized graph has format {:?}; this version reads {FORMAT:?}", env.format)));
        }
        let (nt, nn) = (env.graph.tensors.len(), env.graph.nodes.len());
        if nt > 1 << 16 || nn > 1 << 15 {
            return Err(SerializationError::new_err(format!("serialized graph has {nt} tensors and {nn} nodes; at most 65536 and 32768 are accepted")));
        }
        for &(ni, _, t) in &env.meta.attr_refs {
            if ni >= nn || t >= nt {
                return Err(SerializationError::new_err("serialized graph: an attribute refers to a missing node or tensor"));
            }
        }
        let meta_tensors = env
            .meta
            .user_strides
            .iter()
            .chain(&env.meta.inferred_dims)
            .chain(&env.meta.inferred_strides)
            .chain(env.meta.runtime_values.keys())
            .chain(env.meta.alignment.keys())
            .chain(env.meta.vector_dims.keys());
        if meta_tensors.copied().any(|t| t >= nt) || env.meta.reductions.iter().any(|&n| n >= nn) {
            return Err(SerializationError::new_err("serialized graph: metadata refers to a missing node or tensor"));
        }
        let mut st = lock(&self.state)?;
        if let Some(h) = handle.filter(|h| !h.is_none()) {
            st.handle = h.downcast::<PyHandle>().map_err(|_| PyTypeError::new_err("handle must come from create_handle()"))?.get().inner.clone();
        }
        let (old_graph, old_meta) = (std::mem::replace(&mut st.graph, env.graph), std::mem::replace(&mut st.meta, env.meta));
        st.changed();
        if let Err(e) = st.lower() {
            st.graph = old_graph;
            st.meta = old_meta;
            st.changed();
            return Err(e);
        }
        if let Some(desc) = env.plan.filter(|d| st.handle.engines().any(|e| e == d.engine)) {
            let b = st.built()?;
            // The knobs must be the engine's, with values in their ranges, as create_execution_plan's.
            let checked = st.handle.candidates(&b.lowered, &PlanPolicy { engine: Some(desc.engine), ..Default::default() }).map_err(|e| e.to_string()).and_then(|cands| {
                let given = desc.knobs.iter().map(|k| (KnobKey::Name(k.name.clone()), k.value)).collect();
                plans::checked_knobs(desc.engine.name(), &plans::knob_ranges(&cands), given)
            });
            let notes = match (desc.graph_key == b.lowered.key(), checked.and_then(|_| st.handle.behavior(&b.lowered, &desc).map_err(|e| e.to_string()))) {
                (true, Ok(notes)) => notes,
                (same, notes) => {
                    let why = if same { notes.err().unwrap_or_default() } else { "it was built for another graph (its graph key differs)".to_string() };
                    st.graph = old_graph;
                    st.meta = old_meta;
                    st.changed();
                    return Err(SerializationError::new_err(format!("serialized graph: its plan ({}) cannot be restored: {why}", plans::plan_name(&desc))));
                }
            };
            st.built_mut()?.entries.push(Entry::new(desc, notes));
        }
        Ok(())
    }

    /// The key of the lowered graph (equal graphs, equal keys).
    fn key(&self) -> PyResult<u64> {
        let mut st = lock(&self.state)?;
        st.lower()?;
        Ok(st.built.as_ref().map_or(0, |b| b.lowered.key()))
    }

    fn query_tensor_attributes_of_uid(&self, py: Python<'_>, uid: i64) -> PyResult<Py<PyTensor>> {
        let id = lock(&self.state)?.find_uid(uid).ok_or_else(|| PyValueError::new_err(format!("no tensor has uid {uid}")))?;
        self.tensor_obj(py, id)
    }

    /// The graph as JSON (ferrodnn's graph format).
    fn to_json(&self) -> PyResult<String> {
        lock(&self.state)?.graph.to_json().map_err(to_py_err)
    }

    fn __repr__(&self) -> PyResult<String> {
        let st = lock(&self.state)?;
        Ok(format!("<ferrodnn.pygraph \"{}\": {} tensors, {} ops>", st.graph.name, st.graph.tensors.len(), st.graph.nodes.len()))
    }
}

const FORMAT: &str = "ferrodnn-python-graph/1";

fn norm_axis(axis: i64, rank: usize) -> PyResult<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r.max(1) {
        return Err(PyValueError::new_err(format!("axis {axis} is out of range for rank {rank}")));
    }
    Ok(a as usize)
}

/// Arguments of the frontend that ferrodnn cannot honour: an error when one is set (not None).
fn refuse_set(op: &str, args: &[(&str, Option<&Bound<'_, PyAny>>)]) -> PyResult<()> {
    for (name, v) in args {
        if v.is_some_and(|v| !v.is_none()) {
            return Err(NotSupportedError::new_err(format!("{op}: argument `{name}` is not supported by ferrodnn")));
        }
    }
    Ok(())
}

/// `**kwargs` of a method that takes no others: the first one raises TypeError as Python does.
fn reject_kwargs(method: &str, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
    if let Some((k, _)) = kwargs.and_then(|kw| kw.iter().next()) {
        return Err(PyTypeError::new_err(format!("{method} got an unexpected keyword argument '{k}'")));
    }
    Ok(())
}

/// The variant pack of execute: given as `variant_pack` or as the frontend's
/// `tensor_to_device_buffer`, exactly once.
fn one_pack<'a, 'py>(method: &str, variant_pack: Option<&'a Bound<'py, PyDict>>, frontend: Option<&'a Bound<'py, PyDict>>) -> PyResult<&'a Bound<'py, PyDict>> {
    match (variant_pack, frontend) {
        (Some(p), None) | (None, Some(p)) => Ok(p),
        (Some(_), Some(_)) => Err(PyTypeError::new_err(format!("{method}() got the variant pack twice (variant_pack and tensor_to_device_buffer)"))),
        (None, None) => Err(PyTypeError::new_err(format!("{method}() missing required argument 'variant_pack'"))),
    }
}

/// Heuristic modes: None, a `heur_mode`, or a list of them (ferrodnn ranks its own plans, so
/// they are checked and otherwise ignored).
fn check_heur_modes(method: &str, modes: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
    let Some(m) = modes.filter(|m| !m.is_none()) else { return Ok(()) };
    if m.extract::<PyHeurMode>().is_ok() {
        return Ok(());
    }
    let bad = || PyTypeError::new_err(format!("{method}: heur_modes must be a heur_mode or a list of them, got {}", type_name(m)));
    if m.is_instance_of::<PyString>() {
        return Err(bad());
    }
    for item in m.try_iter().map_err(|_| bad())? {
        let item = item?;
        if item.extract::<PyHeurMode>().is_err() {
            return Err(PyTypeError::new_err(format!("{method}: heur_modes must hold heur_mode values, got {}", type_name(&item))));
        }
    }
    Ok(())
}

/// An output the frontend's caller makes itself (sdpa's `rng_dump`, `score_max` and
/// `score_sum_exp`, sdpa_backward's `dBias` and `dSink_token`): the node's output `made` takes
/// the caller's tensor `user`'s uid, name, type, virtuality, ragged offsets and (when given) dims
/// and strides; `user` keeps no uid.
fn adopt_user_tensor(g: &mut Graph, user: TensorId, made: TensorId) {
    let u = g.tensors[user.0].clone();
    let t = &mut g.tensors[made.0];
    t.uid = u.uid;
    t.name = u.name.clone();
    t.data_type = u.data_type;
    t.is_virtual = u.is_virtual;
    t.ragged_offset = u.ragged_offset;
    if !u.dims.is_empty() {
        t.dims = u.dims.clone();
        t.strides = u.strides.clone();
    }
    g.tensors[user.0].uid = None;
}

/// The frontend's shape overrides at execution (`override_uids`, `override_shapes`,
/// `override_strides`; None is an empty list) as ferrodnn's, checked for their types and lengths;
/// `None` when there are none.
fn shape_overrides(method: &str, lists: [Option<&Bound<'_, PyAny>>; 3]) -> PyResult<Option<ShapeOverrides>> {
    let [uids, shapes, strides] = lists.map(|v| v.filter(|v| !v.is_none()));
    let bad = |name: &str, what: &str, v: &Bound<'_, PyAny>| PyTypeError::new_err(format!("{method}: `{name}` must be {what}, got {}", type_name(v)));
    let uids: Vec<i64> = match uids {
        Some(v) => v.extract().map_err(|_| bad("override_uids", "a list of uids (ints)", v))?,
        None => Vec::new(),
    };
    let lists = |name: &str, v: Option<&Bound<'_, PyAny>>| -> PyResult<Vec<Vec<i64>>> {
        match v {
            Some(v) => v.extract().map_err(|_| bad(name, "a list with a list of ints for each uid", v)),
            None => Ok(Vec::new()),
        }
    };
    let (shapes, strides) = (lists("override_shapes", shapes)?, lists("override_strides", strides)?);
    if uids.is_empty() && shapes.is_empty() && strides.is_empty() {
        return Ok(None);
    }
    ShapeOverrides::from_lists(&uids, &shapes, &strides).map(Some).map_err(|e| InvalidArgumentError::new_err(format!("{method}: {e}")))
}

/// The frontend's causal / band masks as ferrodnn's: causal (right bound 0) with its diagonal
/// alignment, a left bound of `w` (w keys up to the diagonal, as sliding_window_length) and a
/// positive right bound, on either diagonal.
fn sdpa_masks(
    attrs: &mut SdpaAttrs,
    causal: bool,
    causal_br: bool,
    sliding: Option<i64>,
    alignment: Option<PyDiagonalAlignment>,
    left: Option<i64>,
    right: Option<i64>,
) -> PyResult<()> {
    if causal && causal_br {
        return Err(PyValueError::new_err("use_causal_mask and use_causal_mask_bottom_right cannot both be true"));
    }
    if sliding.is_some() && left.is_some() {
        return Err(PyValueError::new_err("sliding_window_length and diagonal_band_left_bound cannot both be set"));
    }
    if (causal || causal_br) && right.is_some() {
        return Err(PyValueError::new_err("a causal mask and diagonal_band_right_bound cannot both be set"));
    }
    let left = sliding.or(left);
    let (align, right) = if causal {
        (PyDiagonalAlignment::TOP_LEFT, Some(0))
    } else if causal_br {
        (PyDiagonalAlignment::BOTTOM_RIGHT, Some(0))
    } else {
        (alignment.unwrap_or(PyDiagonalAlignment::TOP_LEFT), right)
    };
    let causal_align = if align == PyDiagonalAlignment::BOTTOM_RIGHT { CausalAlignment::BottomRight } else { CausalAlignment::TopLeft };
    match right {
        Some(0) => attrs.causal = Some(causal_align),
        Some(r) if r > 0 => attrs.sliding_window_right = Some(r),
        Some(r) => return Err(PyValueError::new_err(format!("diagonal_band_right_bound must be >= 0, got {r}"))),
        None => {}
    }
    if attrs.causal.is_none() && align == PyDiagonalAlignment::BOTTOM_RIGHT {
        attrs.diagonal_alignment = Some(CausalAlignment::BottomRight);
    }
    if let Some(l) = left {
        if l < 1 {
            return Err(PyValueError::new_err(format!("the sliding window length must be >= 1, got {l}")));
        }
        attrs.sliding_window_left = Some(l - 1);
    }
    Ok(())
}

impl PyGraph {
    #[allow(clippy::too_many_arguments)]
    fn norm3(
        &self,
        py: Python<'_>,
        op: &str,
        phase: Option<PyNormPhase>,
        input: &Bound<'_, PyAny>,
        scale: Option<&Bound<'_, PyAny>>,
        bias: Option<&Bound<'_, PyAny>>,
        epsilon: Option<&Bound<'_, PyAny>>,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
    ) -> PyResult<Vec<Option<Py<PyTensor>>>> {
        let x = self.tid(input, "input")?;
        let s = self.opt_tid(scale, "scale")?.ok_or_else(|| PyValueError::new_err(format!("{op} needs a scale tensor")))?;
        let b = self.opt_tid(bias, "bias")?.ok_or_else(|| PyValueError::new_err(format!("{op} needs a bias tensor")))?;
        let eps = self.scalar(epsilon, "epsilon")?;
        let attrs = Self::norm_attrs(phase);
        let op = op.to_string();
        let outs = self.add_op(&name, compute_data_type, vec![(AttrKind::Epsilon, eps)], move |g| {
            let (y, m, v) = match op.as_str() {
                "layernorm" => g.layernorm(x, s, b, attrs),
                "instancenorm" => g.instancenorm(x, s, b, attrs),
                _ => g.adalayernorm(x, s, b, attrs),
            };
            Ok(vec![Some(y), m, v])
        })?;
        self.outs(py, outs)
    }

    #[allow(clippy::too_many_arguments)]
    fn norm_bwd(
        &self,
        py: Python<'_>,
        op: &str,
        grad: &Bound<'_, PyAny>,
        input: &Bound<'_, PyAny>,
        scale: &Bound<'_, PyAny>,
        mean: Option<&Bound<'_, PyAny>>,
        inv_variance: Option<&Bound<'_, PyAny>>,
        compute_data_type: Option<&Bound<'_, PyAny>>,
        name: String,
    ) -> PyResult<Vec<Option<Py<PyTensor>>>> {
        let (dy, x, s) = (self.tid(grad, "grad")?, self.tid(input, "input")?, self.tid(scale, "scale")?);
        let m = self.opt_tid(mean, "mean")?.ok_or_else(|| PyValueError::new_err(format!("{op} needs the saved mean")))?;
        let v = self.opt_tid(inv_variance, "inv_variance")?.ok_or_else(|| PyValueError::new_err(format!("{op} needs the saved inv_variance")))?;
        let op = op.to_string();
        let outs = self.add_op(&name, compute_data_type, vec![], move |g| {
            let (dx, ds, db) = match op.as_str() {
                "batchnorm_backward" => g.batchnorm_backward(dy, x, s, m, v),
                "layernorm_backward" => g.layernorm_backward(dy, x, s, m, v),
                "instancenorm_backward" => g.instancenorm_backward(dy, x, s, m, v),
                _ => g.adalayernorm_backward(dy, x, s, m, v),
            };
            Ok(vec![Some(dx), Some(ds), Some(db)])
        })?;
        self.outs(py, outs)
    }

    fn resample_attrs(
        &self,
        x: TensorId,
        mode: PyResampleMode,
        window: Option<Vec<i64>>,
        stride: Option<Vec<i64>>,
        pre_padding: Option<Vec<i64>>,
        post_padding: Option<Vec<i64>>,
    ) -> PyResult<ResampleAttrs> {
        let spatial = self.dims_of(x)?.len().saturating_sub(2);
        let window = window.ok_or_else(|| PyValueError::new_err("resample needs a window"))?;
        let mode = match mode {
            PyResampleMode::MAXPOOL => ResampleMode::Max,
            PyResampleMode::AVGPOOL_INCLUDE_PADDING => ResampleMode::AvgIncludePadding,
            PyResampleMode::AVGPOOL_EXCLUDE_PADDING => ResampleMode::AvgExcludePadding,
        };
        Ok(ResampleAttrs {
            mode,
            stride: stride.unwrap_or_else(|| window.clone()),
            pre_padding: pre_padding.unwrap_or_else(|| vec![0; spatial]),
            post_padding: post_padding.unwrap_or_else(|| vec![0; spatial]),
            window,
        })
    }

    /// `dropout = (probability, seed tensor, offset tensor)`.
    /// Point the caller's tensor object `obj` (graph tensor `user`, which the node's output
    /// `made` replaced: [`adopt_user_tensor`]) at `made`; dims the caller gave stay the caller's.
    fn point_at_output(&self, obj: Option<&Bound<'_, PyAny>>, user: TensorId, made: TensorId) -> PyResult<()> {
        {
            let mut st = lock(&self.state)?;
            let given = !st.graph.tensors[user.0].dims.is_empty();
            if given {
                st.meta.inferred_dims.remove(&made.0);
                st.meta.inferred_strides.remove(&made.0);
            }
        }
        if let Some(obj) = obj {
            let mut t = obj.downcast::<PyTensor>()?.borrow_mut();
            t.id = made.0;
        }
        Ok(())
    }

    fn sdpa_dropout(&self, dropout: Option<&Bound<'_, PyAny>>, attrs: &mut SdpaAttrs, inputs: &mut SdpaInputs) -> PyResult<()> {
        let Some(d) = dropout.filter(|d| !d.is_none()) else { return Ok(()) };
        let t = d.downcast::<PyTuple>().map_err(|_| PyTypeError::new_err("dropout must be a tuple (probability, seed tensor, offset tensor)"))?;
        if t.len() != 3 || !t.get_item(0)?.is_instance_of::<PyFloat>() {
            return Err(NotSupportedError::new_err("dropout must be (probability, seed tensor, offset tensor); dropout masks are not supported by ferrodnn"));
        }
        attrs.dropout = Some(t.get_item(0)?.extract()?);
        inputs.seed = Some(self.tid(&t.get_item(1)?, "dropout seed")?);
        inputs.offset = Some(self.tid(&t.get_item(2)?, "dropout offset")?);
        Ok(())
    }

    fn execute_inner(
        &self,
        variant_pack: &Bound<'_, PyDict>,
        workspace: Option<&Bound<'_, PyAny>>,
        handle: Option<&Bound<'_, PyAny>>,
        plan_index: Option<i64>,
        overrides: Option<ShapeOverrides>,
        layout: BufferLayout,
    ) -> PyResult<()> {
        let handle_override = match handle.filter(|h| !h.is_none()) {
            Some(h) => Some(h.downcast::<PyHandle>().map_err(|_| PyTypeError::new_err("handle must come from create_handle()"))?.get().inner.clone()),
            None => None,
        };
        // Read the pack before taking the lock (reading runs Python code). Its items are held
        // here for the whole call: Python code run while reading (an `__array_interface__`
        // property) may change the dict, but cannot free an array described here.
        let items: Vec<(Bound<'_, PyAny>, Bound<'_, PyAny>)> = variant_pack.iter().collect();
        let mut entries: Vec<(Option<usize>, i64, Given)> = Vec::with_capacity(items.len());
        for (k, v) in &items {
            if k.is_none() {
                // The frontend skips None keys (an optional output such as sdpa's stats in
                // inference).
                continue;
            }
            let (tensor, uid) = if let Ok(t) = k.downcast::<PyTensor>() {
                let t = t.borrow();
                if !Arc::ptr_eq(&t.state, &self.state) {
                    return Err(PyValueError::new_err("the variant pack has a tensor of another graph"));
                }
                (Some(t.id), 0)
            } else if let Ok(uid) = k.extract::<i64>() {
                (None, uid)
            } else {
                return Err(PyTypeError::new_err(format!("variant pack keys must be tensors or uids, got {}", type_name(k))));
            };
            let value = if v.is_instance_of::<PyInt>() && !array::is_array(v) {
                Given::Int(v.extract::<i128>()?)
            } else if v.is_instance_of::<PyFloat>() && !array::is_array(v) {
                Given::Value(PackValue::Number(v.extract::<f64>()?))
            } else {
                Given::Value(PackValue::Array(array::describe(v)?))
            };
            entries.push((tensor, uid, value));
        }
        // (A Python int for the workspace: a device pointer, as the frontend takes
        // `workspace.data_ptr()`; the caller vouches for get_workspace_size() bytes there.)
        let ws_pointer = match workspace.filter(|w| w.is_instance_of::<PyInt>() && !array::is_array(w)) {
            Some(w) => {
                let p: i128 = w.extract()?;
                Some(
                    usize::try_from(p)
                        .ok()
                        .filter(|&p| p > 0)
                        .ok_or_else(|| InvalidArgumentError::new_err(format!("the workspace: {p} is not a device pointer (a positive address)")))?,
                )
            }
            None => None,
        };
        let ws_desc = match workspace.filter(|w| !w.is_none() && ws_pointer.is_none()) {
            Some(w) => Some(array::describe(w)?),
            None => None,
        };

        let mut st = lock(&self.state)?;
        st.lower()?;
        let handle = handle_override.unwrap_or_else(|| st.handle.clone());
        // Entries by tensor index.
        let mut by_tensor: HashMap<usize, PackValue> = HashMap::with_capacity(entries.len());
        // (Python ints: a by-value scalar's value, else a device pointer to the tensor's memory,
        // its dims, strides and type as the graph has them.)
        let gpu = handle.cuda_device().is_some();
        for (tensor, uid, given) in entries {
            let id = match tensor {
                Some(id) => id,
                None => st.find_uid(uid).ok_or_else(|| InvalidArgumentError::new_err(format!("the variant pack has uid {uid}, which no tensor of the graph has")))?,
            };
            let value = match given {
                Given::Value(v) => v,
                Given::Int(i) => {
                    let d = &st.graph.tensors[id];
                    if d.is_pass_by_value {
                        PackValue::Number(i as f64)
                    } else {
                        let dtype = st.graph.resolved_data_type(TensorId(id)).unwrap_or(DataType::F32);
                        let what = format!("tensor \"{}\" (uid {})", d.name, d.uid.unwrap_or(-1));
                        PackValue::Array(array::from_pointer(&what, i, &d.dims, &d.strides, dtype, gpu)?)
                    }
                }
            };
            if by_tensor.insert(id, value).is_some() {
                return Err(InvalidArgumentError::new_err(format!("tensor \"{}\" is given twice in the variant pack", st.graph.tensors[id].name)));
            }
        }

        let graph_name = st.graph.name.clone();
        let method = if plan_index.is_some() { "execute_plan_at_index" } else { "execute" };
        // Overrides of tensors left out of the graph that runs (no op uses them) change nothing.
        let overrides = match overrides {
            Some(_) if !st.meta.override_shape_enabled => {
                return Err(InvalidArgumentError::new_err(format!(
                    "{method}: graph \"{graph_name}\" was not made to take shape overrides; make it with pygraph(is_override_shape_enabled=True), as the frontend requires"
                )))
            }
            Some(o) => {
                let b = st.built()?;
                let mut kept = ShapeOverrides::new();
                for (uid, dims, strides) in o.iter() {
                    if st.find_uid(uid).is_none_or(|old| b.old_to_new.contains_key(&old)) {
                        kept.set(uid, dims, strides);
                    }
                }
                kept
            }
            None => ShapeOverrides::new(),
        };
        let attr_refs = st.meta.attr_refs.clone();
        let runtime_values = st.meta.runtime_values.clone();
        // The names of the tensors that carry attributes (for messages; usually none).
        let tensor_names: HashMap<usize, String> = attr_refs.iter().filter_map(|&(_, _, t)| st.graph.tensors.get(t).map(|d| (t, d.name.clone()))).collect();

        // The engine: where the data lives.
        // (Names only for the message: this runs on every execute.)
        let placed = |on_device: bool| -> PyResult<Vec<String>> {
            let b = st.built()?;
            Ok(b.lowered
                .tensors
                .iter()
                .enumerate()
                .filter(|(i, d)| !d.is_virtual && !d.is_pass_by_value && matches!(by_tensor.get(&b.new_to_old[*i]), Some(PackValue::Array(a)) if a.device == on_device))
                .map(|(_, d)| d.name.clone())
                .collect())
        };
        let (mut n_host, mut n_device) = (0usize, 0usize);
        {
            let b = st.built()?;
            for (i, d) in b.lowered.tensors.iter().enumerate() {
                if d.is_virtual || d.is_pass_by_value {
                    continue;
                }
                if let Some(PackValue::Array(a)) = by_tensor.get(&b.new_to_old[i]) {
                    if a.device {
                        n_device += 1;
                    } else {
                        n_host += 1;
                    }
                }
            }
        }
        let (host, device) = if n_host > 0 && n_device > 0 { (placed(false)?, placed(true)?) } else { (vec![String::new(); n_host], vec![String::new(); n_device]) };
        if !host.is_empty() && !device.is_empty() {
            return Err(InvalidArgumentError::new_err(format!(
                "graph \"{graph_name}\": the variant pack mixes host arrays ({}) and device arrays ({}); give all in one place",
                host.join(", "),
                device.join(", ")
            )));
        }
        // Host arrays run on the fast CPU engine, or on the f64 reference when that plan is asked
        // for by index.
        let mut engine = if device.is_empty() { EngineKind::Cpu } else { EngineKind::Cuda };
        let arrays = if device.is_empty() { "host arrays" } else { "device arrays" };
        if engine == EngineKind::Cuda && handle.cuda_device().is_none() {
            return Err(InvalidArgumentError::new_err(format!("graph \"{graph_name}\": the arrays are in device memory but the handle has no GPU engine (no usable CUDA device)")));
        }

        // The plan's knobs: those of the plan asked for; else of the candidate (the plan built
        // first) when it runs where the arrays are; else, tried in turn until one builds, of the
        // plans of that engine in the list, or of the engine's candidates, not deselected.
        let tries: Vec<Vec<Knob>> = match plan_index {
            Some(i) => {
                let e = st.entry("execute_plan_at_index", i)?;
                let name = plans::plan_name(&e.desc);
                if e.plan.is_none() {
                    return Err(InvalidArgumentError::new_err(format!(
                        "execute_plan_at_index: plan {i} ({name}) is not built; build it with build_plan_at_index({i}) or build_plans(build_plan_policy.ALL)"
                    )));
                }
                if engine == EngineKind::Cpu && e.desc.engine == EngineKind::Reference {
                    engine = EngineKind::Reference;
                }
                if e.desc.engine != engine {
                    return Err(InvalidArgumentError::new_err(format!(
                        "execute_plan_at_index: plan {i} ({name}) runs on the {} engine but the arrays are {arrays}",
                        e.desc.engine.name()
                    )));
                }
                vec![e.desc.knobs.clone()]
            }
            None => {
                let b = st.built()?;
                let host_reference = |c: usize| engine == EngineKind::Cpu && b.entries[c].desc.engine == EngineKind::Reference;
                match b.candidate.filter(|&c| b.entries[c].desc.engine == engine || host_reference(c)) {
                    Some(c) => {
                        if host_reference(c) {
                            engine = EngineKind::Reference;
                        }
                        vec![b.entries[c].desc.knobs.clone()]
                    }
                    None => {
                        let listed: Vec<(String, PlanDesc, Option<String>)> = b
                            .entries
                            .iter()
                            .enumerate()
                            .filter(|(_, e)| e.desc.engine == engine)
                            .map(|(i, e)| (format!("plan {i} ({})", plans::plan_name(&e.desc)), e.desc.clone(), st.barred(i)))
                            .collect();
                        let listed = if listed.is_empty() {
                            let cands = handle.candidates(&b.lowered, &PlanPolicy { engine: Some(engine), ..Default::default() }).map_err(to_py_err)?;
                            cands.into_iter().map(|(d, n)| (plans::plan_name(&d), d.clone(), st.filters.bars(&d, &n, st.meta.deterministic))).collect()
                        } else {
                            listed
                        };
                        let tries: Vec<Vec<Knob>> = listed.iter().filter(|(_, _, why)| why.is_none()).map(|(_, d, _)| d.knobs.clone()).collect();
                        if tries.is_empty() {
                            let reasons: Vec<String> = listed.iter().map(|(name, _, why)| format!("{name}: {}", why.clone().unwrap_or_default())).collect();
                            return Err(NotSupportedError::new_err(format!(
                                "graph \"{graph_name}\": the arrays are {arrays}, but every plan of the {} engine is deselected: {}",
                                engine.name(),
                                reasons.join("; ")
                            )));
                        }
                        tries
                    }
                }
            }
        };

        let Built { lowered, new_to_old, old_to_new, exec, knob_lists, .. } = st.built.as_mut().expect("lowered");
        let lowered: &Graph = lowered;

        // Values written into the graph: attributes carried by tensors that are not by-value
        // scalars on the nodes' ports (those come with the variant pack, like every by-value
        // scalar).
        let mut values: BTreeMap<usize, f64> = BTreeMap::new();
        let on_port = |ni: usize, kind: AttrKind, t: usize| lowered.nodes.get(ni).and_then(|n| n.input(kind.port())).is_some_and(|p| old_to_new.get(&t) == Some(&p.0));
        let need_value: Vec<usize> = attr_refs.iter().filter(|&&(ni, kind, t)| !on_port(ni, kind, t)).map(|&(_, _, t)| t).collect();
        for t in need_value {
            if values.contains_key(&t) {
                continue;
            }
            if let Some(v) = st_value(lowered, old_to_new, t) {
                values.insert(t, v);
                continue;
            }
            let name = tensor_names.get(&t).map_or("", String::as_str);
            let v = match (by_tensor.get(&t), runtime_values.get(&t)) {
                (Some(PackValue::Number(v)), _) => *v,
                (Some(PackValue::Array(a)), _) => array::read_scalar(a, &format!("tensor \"{name}\""))?,
                (None, Some(v)) => *v,
                (None, None) => return Err(InvalidArgumentError::new_err(format!("graph \"{graph_name}\": by-value tensor \"{name}\" has no value in the variant pack"))),
            };
            values.insert(t, v);
        }

        let values_key: Vec<u64> = values.iter().flat_map(|(&t, v)| [t as u64, v.to_bits()]).collect();
        let mut chosen = None;
        let mut failures = Vec::new();
        // The graph the plan is built for: the attribute values written in, the overrides applied.
        let mut run_graph: Option<Graph> = None;
        if knob_lists.len() >= 256 {
            // (Many shape overrides, each with knobs of its own: the plans go with their knobs.)
            knob_lists.clear();
            exec.clear();
        }
        for knobs in tries {
            let id = match knob_lists.iter().position(|k| *k == knobs) {
                Some(id) => id,
                None => {
                    knob_lists.push(knobs.clone());
                    knob_lists.len() - 1
                }
            };
            let key = (engine, id, values_key.clone(), overrides.clone());
            if exec.contains_key(&key) {
                chosen = Some(key);
                break;
            }
            if run_graph.is_none() {
                let mut g = lowered.clone();
                for &(ni, kind, t) in &attr_refs {
                    if let (Some(v), Some(node)) = (values.get(&t), g.nodes.get_mut(ni)) {
                        apply_attr(&mut node.op, kind, *v);
                    }
                }
                run_graph = Some(g.with_overrides(&overrides).map_err(|e| match e {
                    ferrodnn::Error::InvalidGraph(m) | ferrodnn::Error::InvalidArgument(m) => InvalidArgumentError::new_err(format!("{method}: {m}")),
                    e => to_py_err(e),
                })?);
            }
            let g = run_graph.as_ref().expect("made above");
            let desc = PlanDesc { engine, knobs, graph_key: g.key() };
            match handle.plan_from_desc(g, &desc) {
                Ok(plan) => {
                    if exec.len() >= 64 {
                        exec.clear();
                    }
                    exec.insert(key.clone(), plan);
                    chosen = Some(key);
                    break;
                }
                Err(e) => failures.push(e),
            }
        }
        let Some(key) = chosen else {
            return Err(match failures.len() {
                1 => to_py_err(failures.remove(0)),
                _ => NotSupportedError::new_err(format!(
                    "graph \"{graph_name}\": no plan of the {} engine could be built: {}",
                    engine.name(),
                    failures.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; ")
                )),
            });
        };
        let plan = &exec[&key];
        let pg = plan.graph();

        // The buffers of the plan's graph, each checked against its tensor.
        let mut produced = vec![false; pg.tensors.len()];
        for p in pg.nodes.iter().flat_map(|n| n.outputs.iter()) {
            if let Some(x) = produced.get_mut(p.tensor.0) {
                *x = true;
            }
        }
        struct Slot<'a> {
            uid: i64,
            a: &'a ArrayDesc,
            output: bool,
            name: &'a str,
        }
        let mut slots: Vec<Slot> = Vec::with_capacity(by_tensor.len());
        // By-value scalars: their values encoded in their types, as host buffers.
        let mut scalars: Vec<(i64, Vec<u8>)> = Vec::new();
        for new in pg.io_tensors() {
            let d = pg.desc(new);
            let old = new_to_old[new.0];
            let uid = d.uid.unwrap_or_default();
            if d.is_pass_by_value {
                let what = format!("tensor \"{}\"", d.name);
                let v = match (by_tensor.get(&old), runtime_values.get(&old)) {
                    (Some(PackValue::Number(v)), _) => *v,
                    (Some(PackValue::Array(a)), _) => array::read_scalar(a, &what)?,
                    (None, Some(v)) => *v,
                    (None, None) => return Err(InvalidArgumentError::new_err(format!("graph \"{graph_name}\": by-value tensor \"{}\" has no value in the variant pack", d.name))),
                };
                scalars.push((uid, pg.resolved_data_type(new).unwrap_or(DataType::F32).encode(&[v])));
                continue;
            }
            let a = match by_tensor.get(&old) {
                Some(PackValue::Array(a)) => a,
                Some(PackValue::Number(_)) => {
                    return Err(InvalidArgumentError::new_err(format!(
                        "tensor \"{}\" (uid {uid}): a Python number is only accepted for a by-value scalar (is_pass_by_value); give this tensor an array",
                        d.name
                    )));
                }
                None => return Err(InvalidArgumentError::new_err(format!("graph \"{graph_name}\": tensor \"{}\" (uid {uid}) has no buffer in the variant pack", d.name))),
            };
            let want = pg.resolved_data_type(new).unwrap_or(DataType::F32);
            if !compatible(a, want) {
                return Err(InvalidArgumentError::new_err(format!("tensor \"{}\" (uid {uid}) is {want} but its array holds {}", d.name, a.type_name)));
            }
            check_buffer(d, uid, want, a, layout == BufferLayout::Strict)?;
            let output = produced.get(new.0).copied().unwrap_or(false);
            // An input array of the tensor's dims but other strides would be read as something it
            // is not: refused. An output's memory is written with the graph's strides from its
            // first element, as the frontend writes through the pointer it is given (the memory
            // check above makes sure the graph's extent fits in the array's). Asked for views,
            // every array is read with the graph's strides.
            if !output && layout != BufferLayout::View && a.dims == d.dims && d.dims.iter().zip(a.strides.iter().zip(&d.strides)).any(|(&n, (&s1, &s2))| n > 1 && s1 != s2) {
                return Err(InvalidArgumentError::new_err(format!(
                    "tensor \"{}\" (uid {uid}) has strides {:?} but its array has strides {:?} (in elements); give the graph the array's layout (tensor_like) or pass an array with the tensor's",
                    d.name, d.strides, a.strides
                )));
            }
            if output && a.readonly {
                return Err(InvalidArgumentError::new_err(format!("tensor \"{}\" (uid {uid}) is an output but its array is read-only", d.name)));
            }
            if engine == EngineKind::Cuda && !a.device && !d.is_pass_by_value {
                return Err(InvalidArgumentError::new_err(format!("tensor \"{}\" (uid {uid}): the CUDA engine needs device arrays", d.name)));
            }
            slots.push(Slot { uid, a, output, name: &d.name });
        }
        for old in by_tensor.keys() {
            if let Some(&new) = old_to_new.get(old) {
                if pg.tensors[new].is_virtual {
                    return Err(InvalidArgumentError::new_err(format!(
                        "tensor \"{}\" is virtual: it has no buffer (call set_output(True) on it to get its values)",
                        pg.tensors[new].name
                    )));
                }
                if pg.tensors[new].is_pass_by_value && pg.tensors[new].value.is_some() {
                    return Err(InvalidArgumentError::new_err(format!(
                        "tensor \"{}\" (uid {}) is a compile-time constant (its value is in the graph): the variant pack may not give it a value",
                        pg.tensors[new].name,
                        pg.tensors[new].uid.unwrap_or(-1)
                    )));
                }
            }
        }

        // Host memory: an output may not share bytes with another buffer, except that an input
        // sharing bytes with an output is read from a copy taken before the plan runs (in-place
        // updates such as batchnorm's running statistics).
        let range = |a: &ArrayDesc| (a.ptr, a.ptr.saturating_add(a.bytes));
        let overlaps = |x: &ArrayDesc, y: &ArrayDesc| {
            let ((a0, a1), (b0, b1)) = (range(x), range(y));
            x.bytes > 0 && y.bytes > 0 && a0 < b1 && b0 < a1
        };
        let mut copies: Vec<Option<Vec<u8>>> = vec![None; slots.len()];
        if engine != EngineKind::Cuda {
            for i in 0..slots.len() {
                for j in 0..slots.len() {
                    if i == j || !slots[i].output || slots[i].a.device || slots[j].a.device || !overlaps(slots[i].a, slots[j].a) {
                        continue;
                    }
                    if slots[j].output {
                        return Err(InvalidArgumentError::new_err(format!("outputs \"{}\" and \"{}\" share memory", slots[i].name, slots[j].name)));
                    }
                    if copies[j].is_none() {
                        let a = slots[j].a;
                        // SAFETY: `a` describes `a.bytes` bytes of live host memory (its object is
                        // held by `items` for this call) from a pointer that is not
                        // null (check_buffer) over a range that does not wrap (array::describe);
                        // no mutable reference to it exists yet.
                        copies[j] = Some(unsafe { std::slice::from_raw_parts(a.ptr as *const u8, a.bytes) }.to_vec());
                    }
                }
            }
        }
        let mut pack = VariantPack::new();
        for (uid, bytes) in &scalars {
            pack.input(*uid, bytes);
        }
        for (slot, copy) in slots.iter().zip(&copies) {
            let a = slot.a;
            if a.device {
                pack.device(slot.uid, a.ptr as u64, a.bytes);
            } else if let Some(c) = copy {
                pack.input(slot.uid, c);
            } else if a.bytes == 0 {
                pack.input(slot.uid, &[]);
            } else if slot.output {
                // SAFETY: `a.ptr .. a.ptr + a.bytes` is host memory of an array that the
                // variant pack's items keep alive for this whole call, as its protocol
                // (__array_interface__, torch's data_ptr/stride/element_size, DLPack) describes
                // it, from a pointer that is not null (check_buffer refused null pointers of
                // arrays that span bytes) over a range that does not wrap (array::describe),
                // and it is writable (read-only arrays are refused above). No other buffer of
                // this pack overlaps it (checked above: overlapping inputs were copied, overlapping
                // outputs refused), so this is the only reference to these bytes while the plan
                // runs. The GIL is held until execute returns, so no Python code can free or
                // resize the array meanwhile.
                let bytes = unsafe { std::slice::from_raw_parts_mut(a.ptr as *mut u8, a.bytes) };
                pack.output(slot.uid, bytes);
            } else {
                // SAFETY: as above, for memory the plan only reads; other shared references to
                // it are fine, and no mutable one overlaps it.
                let bytes = unsafe { std::slice::from_raw_parts(a.ptr as *const u8, a.bytes) };
                pack.input(slot.uid, bytes);
            }
        }

        // The workspace: one given must be usable memory, and, for a CUDA plan, of at least the
        // plan's size, as the frontend requires. A CPU plan (host arrays, also on a machine with a
        // GPU, whose get_workspace_size() answers for the GPU's plan) uses its own.
        let need = plan.workspace_size();
        if let Some(w) = &ws_desc {
            w.check_memory("the workspace")?;
            if engine == EngineKind::Cuda && w.bytes < need {
                let which = if overrides.is_empty() { "(get_workspace_size())" } else { "for the overridden shapes (more than get_workspace_size() may say)" };
                return Err(InvalidArgumentError::new_err(format!(
                    "graph \"{graph_name}\": the workspace spans {} bytes but the plan needs {need} bytes {which}; the array: {}",
                    w.bytes,
                    w.summary()
                )));
            }
        }
        // A CPU plan runs on the given workspace when it is writable host memory of at least the
        // plan's size, without gaps (every byte of its span its own), that shares no bytes with a
        // buffer of the pack (so that its pages are not touched afresh on every call); else on
        // zeroed pages from the allocator (no fill pass over a large workspace).
        let gapless = |w: &ArrayDesc| w.dims.iter().map(|&d| d.max(0) as usize).product::<usize>() * w.itemsize == w.bytes;
        let user_ws = ws_desc.as_ref().filter(|w| {
            engine != EngineKind::Cuda && need > 0 && !w.device && !w.readonly && w.bytes >= need && gapless(w) && slots.iter().all(|s| s.a.device || !overlaps(w, s.a))
        });
        let mut host_ws: Vec<u8> = if need > 0 && engine != EngineKind::Cuda && user_ws.is_none() { vec![0u8; need] } else { Vec::new() };
        let ws = if need == 0 {
            None
        } else if let Some(w) = user_ws {
            // SAFETY: `w.ptr .. w.ptr + w.bytes` is host memory of a writable array the caller
            // holds for this call (the GIL is held until execute returns), from a pointer that is
            // not null over a range that does not wrap (array::describe, check_memory above)
            // whose every byte is the array's (gapless), and no buffer of the pack overlaps it
            // (checked just above): this is the only reference to these bytes while the plan
            // runs.
            Some(Buffer::HostMut(unsafe { std::slice::from_raw_parts_mut(w.ptr as *mut u8, w.bytes) }))
        } else if engine != EngineKind::Cuda {
            Some(Buffer::HostMut(&mut host_ws))
        } else {
            match &ws_desc {
                _ if ws_pointer.is_some() => Some(Buffer::Device { ptr: ws_pointer.unwrap_or_default() as u64, bytes: need }),
                Some(w) if w.device => Some(Buffer::Device { ptr: w.ptr as u64, bytes: w.bytes }),
                Some(_) => return Err(InvalidArgumentError::new_err("the workspace of a CUDA plan must be device memory")),
                None => return Err(InvalidArgumentError::new_err(format!("graph \"{graph_name}\": the plan needs a workspace of {need} bytes"))),
            }
        };
        plan.execute(&mut pack, ws).map_err(to_py_err)
    }
}

/// How `execute` relates an array to the tensor it is the buffer of.
#[derive(Clone, Copy, PartialEq, Eq)]
enum BufferLayout {
    /// The frontend's pointer semantics: the tensor's dims and strides read the array's memory
    /// from its first element (they must reach no further than it), but an input array of the
    /// tensor's dims and other strides is refused (it would be read as something it is not).
    Pointer,
    /// The array's dims and strides must be the tensor's.
    Strict,
    /// The array is read as a view with the tensor's dims and strides (the memory check alone).
    View,
}

/// Check an array against the tensor it is the buffer of (its type was checked): a usable data
/// pointer, and memory enough for every element the tensor's dims and strides reach (the
/// frontend's pointer semantics: an array of other dims with memory enough is accepted). With
/// `strict`, the array's dims and strides (in elements) must also be the tensor's (strides of
/// size-1 dims are not compared; a 0-d array stands for a one-element tensor).
fn check_buffer(d: &TensorDesc, uid: i64, dt: DataType, a: &ArrayDesc, strict: bool) -> PyResult<()> {
    // (The tensor's name for messages, made only for one: this runs on every execute.)
    let what = || format!("tensor \"{}\" (uid {uid})", d.name);
    if a.null_pointer() && a.bytes > 0 {
        a.check_memory(&what())?;
    }
    if d.ragged_offset.is_some() {
        // A ragged tensor spans what its offsets say (a packed [t, h, d] array): the CPU engines
        // check them when they run, the GPU kernels trust them, as cuDNN's do.
        return Ok(());
    }
    let need = d
        .extent_elements()
        .and_then(|e| usize::try_from(e.max(0)).ok())
        .and_then(|e| e.checked_mul(dt.size()))
        .ok_or_else(|| InvalidArgumentError::new_err(format!("{}: the extent of dims {:?} with strides {:?} overflows", what(), d.dims, d.strides)))?;
    if a.bytes < need {
        return Err(InvalidArgumentError::new_err(format!(
            "{} needs {need} bytes (dims {:?}, strides {:?} of {dt}) but its array spans {} bytes ({})",
            what(),
            d.dims,
            d.strides,
            a.bytes,
            a.summary()
        )));
    }
    if strict {
        let scalar_like = a.dims.is_empty() && d.dims.iter().all(|&n| n == 1);
        let same_dims = a.dims == d.dims || scalar_like;
        let same_strides = scalar_like || d.dims.iter().zip(a.strides.iter().zip(&d.strides)).all(|(&n, (&s1, &s2))| n <= 1 || s1 == s2);
        if !same_dims || !same_strides {
            return Err(InvalidArgumentError::new_err(format!(
                "{} (strict): the tensor has dims {:?} and strides {:?} but its array has dims {:?} and strides {:?} (in elements)",
                what(),
                d.dims,
                d.strides,
                a.dims,
                a.strides
            )));
        }
    }
    Ok(())
}

/// The value a tensor carries in the graph, if any.
fn st_value(lowered: &Graph, old_to_new: &HashMap<usize, usize>, old: usize) -> Option<f64> {
    old_to_new.get(&old).and_then(|&n| lowered.tensors.get(n)).and_then(|d| d.value)
}

/// The frontend returns lists of tensors (or None); keep that shape for Python.
#[allow(dead_code)]
fn to_list<'py>(py: Python<'py>, items: Vec<Option<Py<PyTensor>>>) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, items)
}
