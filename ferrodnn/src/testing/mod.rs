//! Helpers to run a graph on dense `f64` values and compare results: used by the test suites,
//! the CLI's `run` and `demo`, and (later) the GPU check. Seeded, dependency-free randomness.
//!
//! Every allocation whose size the graph decides is checked against the host memory limit
//! ([`crate::layout::host_memory_limit`], `FERRODNN_MAX_HOST_BYTES`) and reserved fallibly, so
//! that a huge graph gives an error, never an abort.

use crate::dtype::DataType;
use crate::engine::{CancelToken, EngineKind, Handle, Plan, PlanPolicy, VariantPack};
use crate::error::{Error, Result};
use crate::graph::{Graph, TensorId};
use crate::layout::{check_host_bytes, required_bytes, scatter, try_gather, try_vec, try_vec_filled, Nd, Ragged};
use std::collections::HashMap;

pub use crate::random::{random_value, random_values, SplitMix64};

/// Dense random values for every input tensor of a validated graph that needs a buffer.
///
/// # Panics
/// When the inputs do not fit the host memory limit (or the graph is not validated): for
/// graphs a user chose, call [`try_random_inputs`], which returns the error instead.
pub fn random_inputs(graph: &Graph, seed: u64) -> HashMap<TensorId, Nd> {
    try_random_inputs(graph, seed).unwrap_or_else(|e| panic!("random_inputs: {e}"))
}

/// [`random_inputs`] for any graph: an error, never a panic or an abort, when an input has no
/// usable dims (the graph was not validated) or the inputs, as dense `f64` arrays, exceed the
/// host memory limit (the error names the tensor and the bytes).
pub fn try_random_inputs(graph: &Graph, seed: u64) -> Result<HashMap<TensorId, Nd>> {
    let mut rng = SplitMix64::new(seed);
    let mut out = HashMap::new();
    let mut sizes = Vec::new();
    let mut total = 0u128;
    for id in graph.input_tensors() {
        let d = graph.get(id).ok_or_else(|| Error::InvalidArgument(format!("input tensor #{} is not in the graph", id.0)))?;
        if d.is_pass_by_value && d.value.is_some() {
            continue;
        }
        let mut n = 1usize;
        for &x in &d.dims {
            let x = usize::try_from(x).ok().filter(|&x| x > 0);
            n = x
                .and_then(|x| n.checked_mul(x))
                .ok_or_else(|| Error::InvalidGraph(format!("tensor \"{}\": dims {:?} are not positive or their product overflows (validate the graph first)", d.name, d.dims)))?;
        }
        if d.dims.is_empty() {
            return Err(Error::InvalidGraph(format!("tensor \"{}\" has no dims (validate the graph first)", d.name)));
        }
        total = total.saturating_add(n as u128 * 8);
        sizes.push((id, n));
    }
    check_host_bytes(total, || {
        let (id, n) = sizes.iter().copied().max_by_key(|&(_, n)| n).unwrap_or((TensorId(0), 0));
        let d = graph.desc(id);
        format!("the random inputs of graph \"{}\" (dense f64; the largest, tensor \"{}\" with dims {:?}, has {n} elements)", graph.name, d.name, d.dims)
    })?;
    for (id, n) in sizes {
        let d = graph.desc(id);
        let dtype = graph.resolved_data_type(id).unwrap_or(DataType::F32);
        let dims: Vec<usize> = d.dims.iter().map(|&x| x as usize).collect();
        let values = match attribute_port(graph, id) {
            Some((node, port)) if n != 1 => {
                let msg = format!("input `{port}` (tensor \"{}\") gives an attribute, so it must be one scalar, got dims {:?} (validate the graph first)", d.name, d.dims);
                return Err(Error::op(node.op.kind(), &node.name, msg));
            }
            Some((_, port)) => vec![dtype.quantize(attribute_value(port, &mut rng))],
            None => {
                let mut v = try_vec(n, || format!("random values of tensor \"{}\" (dims {:?})", d.name, d.dims))?;
                v.extend((0..n).map(|_| random_value(dtype, &mut rng)));
                v
            }
        };
        out.insert(id, Nd::new(dims, values));
    }
    ragged_inputs(graph, &mut rng, &mut out);
    Ok(out)
}

/// Valid values for ragged layouts: the lengths of a ragged tensor (graph inputs) random in
/// `[0, s]`, and its offsets the running sum of the batches' rows (at the tensor's row stride)
/// with a gap of a few elements after each batch, so that batches pack back to back.
fn ragged_inputs(graph: &Graph, rng: &mut SplitMix64, out: &mut HashMap<TensorId, Nd>) {
    let prefix = crate::graph::RAGGED_PORT_PREFIX;
    let mut lengths_done = Vec::new();
    let mut offsets = Vec::new();
    for node in &graph.nodes {
        for p in node.inputs.iter().filter(|p| p.name.starts_with(prefix)) {
            let port = &p.name[prefix.len()..];
            let Some(t) = node.input(port).or_else(|| node.output(port)) else { continue };
            let Some(lens) = node.input(crate::graph::ops::sdpa::ragged_lengths_port(port)) else { continue };
            let rows = graph.desc(t).dims.get(2).copied().unwrap_or(0);
            if !lengths_done.contains(&lens) {
                if let Some(nd) = out.get_mut(&lens) {
                    for v in &mut nd.data {
                        *v = (rng.next_u64() % (rows.max(0) as u64 + 1)) as f64;
                    }
                    lengths_done.push(lens);
                }
            }
            offsets.push((p.tensor, t, lens));
        }
    }
    for (r, t, lens) in offsets {
        let d = graph.desc(t);
        let row = d.strides.get(2).copied().unwrap_or(1);
        let Some(lens) = out.get(&lens).map(|nd| nd.data.clone()) else { continue };
        if let Some(nd) = out.get_mut(&r) {
            let mut at = 0f64;
            for (i, v) in nd.data.iter_mut().enumerate() {
                *v = at;
                let len = lens.get(i).copied().unwrap_or(0.0);
                // A gap after the batches that leave room for one (the buffer holds s rows each).
                at += len * row as f64 + if len < d.dims[2] as f64 { 3.0 } else { 0.0 };
            }
        }
    }
}

/// The ragged layout of tensor `id` (`TensorDesc::ragged_offset`) from the dense inputs: its
/// offsets and the lengths of the node port it is on. `None` when it is not ragged.
fn ragged_layout(g: &Graph, id: TensorId, inputs: &HashMap<TensorId, Nd>) -> Result<Option<Ragged>> {
    let prefix = crate::graph::RAGGED_PORT_PREFIX;
    for node in &g.nodes {
        for p in node.inputs.iter().chain(&node.outputs).filter(|p| p.tensor == id) {
            let Some(r) = node.input(&format!("{prefix}{}", p.name)) else { continue };
            let lens = node.input(crate::graph::ops::sdpa::ragged_lengths_port(&p.name));
            let (Some(r), Some(l)) = (inputs.get(&r), lens.and_then(|l| inputs.get(&l))) else {
                return Err(Error::InvalidArgument(format!("tensor \"{}\" is ragged: its offsets and lengths must be graph inputs for the dense helpers", g.desc(id).name)));
            };
            return Ok(Some(Ragged::new(&r.data, &l.data)));
        }
    }
    Ok(None)
}

/// The attribute port (`epsilon`, `momentum`, `attn_scale`) that tensor `id` gives, if any,
/// with the node that reads it.
fn attribute_port(graph: &Graph, id: TensorId) -> Option<(&crate::graph::Node, &str)> {
    graph.nodes.iter().find_map(|n| n.attribute_inputs().find(|&(_, t)| t == id).map(|(port, _)| (n, port)))
}

/// A random valid value of attribute `port`: epsilon log-uniform in [1e-5, 0.1], momentum in
/// [0, 1], the attention scale in [0.05, 0.25] (about 1 / sqrt(head dim)).
fn attribute_value(port: &str, rng: &mut SplitMix64) -> f64 {
    match port {
        "epsilon" => 10f64.powf(rng.uniform(-5.0, -1.0)),
        "momentum" => rng.uniform(0.0, 1.0),
        _ => rng.uniform(0.05, 0.25),
    }
}

/// The value written into every byte of an output buffer before a run, so that elements an
/// engine never writes show up (as NaN for floats).
pub const POISON_BYTE: u8 = 0xff;

/// Execute a validated graph on the best plan of `handle` that meets `policy`, with inputs given
/// as dense arrays (scattered into strided buffers whose gaps hold poison), outputs poisoned
/// first; returns every non-virtual output as a dense array. A CUDA plan gets device copies of
/// the buffers and a device workspace, and the call waits for the stream before reading back.
/// The host buffers are checked against the host memory limit before any is allocated.
pub fn execute_dense(handle: &Handle, graph: &Graph, inputs: &HashMap<TensorId, Nd>, policy: &PlanPolicy) -> Result<HashMap<TensorId, Nd>> {
    let plan = handle.build_plans(graph, policy)?.remove(0);
    execute_plan_dense(handle, &plan, inputs)
}

/// [`execute_dense`] with a plan already built.
pub fn execute_plan_dense(handle: &Handle, plan: &Plan, inputs: &HashMap<TensorId, Nd>) -> Result<HashMap<TensorId, Nd>> {
    execute_plan_dense_cancellable(handle, plan, inputs, &CancelToken::new())
}

/// [`execute_plan_dense`] that stops with an error when `cancel` is set (see
/// [`CancelToken`]).
pub fn execute_plan_dense_cancellable(handle: &Handle, plan: &Plan, inputs: &HashMap<TensorId, Nd>, cancel: &CancelToken) -> Result<HashMap<TensorId, Nd>> {
    let g = plan.graph();
    // The host buffers (inputs, outputs) and the dense outputs read back, all at once.
    let mut total = 0u128;
    let mut largest: Option<(TensorId, u128)> = None;
    let outputs: Vec<TensorId> = g.output_tensors();
    for (id, is_output) in g.input_tensors().into_iter().map(|t| (t, false)).chain(outputs.iter().map(|&t| (t, true))) {
        let d = g.desc(id);
        let dtype = g.resolved_data_type(id).unwrap_or(DataType::F32);
        let mut bytes = required_bytes(d, dtype) as u128;
        if is_output {
            // Read back as a dense f64 array.
            bytes = bytes.saturating_add(d.element_count().max(0) as u128 * 8);
        }
        total = total.saturating_add(bytes);
        if largest.is_none_or(|(_, b)| bytes > b) {
            largest = Some((id, bytes));
        }
    }
    check_host_bytes(total, || {
        let big = largest.map_or(String::new(), |(id, b)| {
            let d = g.desc(id);
            format!(" (the largest, {}, for tensor \"{}\" with dims {:?} and strides {:?})", crate::layout::format_bytes(b), d.name, d.dims, d.strides)
        });
        format!("the host buffers of graph \"{}\"{big}", g.name)
    })?;
    let buffer = |id: TensorId| -> Result<Vec<u8>> {
        let d = g.desc(id);
        let dtype = g.resolved_data_type(id).unwrap_or(DataType::F32);
        try_vec_filled(required_bytes(d, dtype), POISON_BYTE, || format!("the buffer of tensor \"{}\" (dims {:?}, strides {:?} of {dtype})", d.name, d.dims, d.strides))
    };
    // Inputs; by-value scalars (those whose values the graph does not give) stay host buffers.
    let mut in_bufs: Vec<(i64, Vec<u8>)> = Vec::new();
    let mut host_scalars: Vec<(i64, Vec<u8>)> = Vec::new();
    for id in g.input_tensors() {
        let d = g.desc(id);
        if d.is_pass_by_value && d.value.is_some() {
            continue;
        }
        let nd = inputs.get(&id).ok_or_else(|| Error::InvalidArgument(format!("no values given for input tensor \"{}\"", d.name)))?;
        if nd.dims.iter().map(|&x| x as i64).ne(d.dims.iter().copied()) || nd.data.len() != nd.dims.iter().product::<usize>() {
            return Err(Error::InvalidArgument(format!("input tensor \"{}\" has dims {:?} but {} values of dims {:?} were given", d.name, d.dims, nd.data.len(), nd.dims)));
        }
        let dtype = g.resolved_data_type(id).unwrap_or(DataType::F32);
        let mut bytes = buffer(id)?;
        match ragged_layout(g, id, inputs)? {
            Some(r) => r.scatter(d, dtype, nd, &mut bytes).map_err(|m| Error::InvalidArgument(format!("input tensor \"{}\": {m}", d.name)))?,
            None => scatter(d, dtype, nd, &mut bytes),
        }
        if d.is_pass_by_value {
            host_scalars.push((d.uid.unwrap_or_default(), bytes));
        } else {
            in_bufs.push((d.uid.unwrap_or_default(), bytes));
        }
    }
    let mut out_bufs: Vec<(TensorId, i64, Vec<u8>)> = Vec::new();
    for id in outputs {
        out_bufs.push((id, g.desc(id).uid.unwrap_or_default(), buffer(id)?));
    }
    if plan.engine() == EngineKind::Cuda {
        cancel.check(|| format!("graph \"{}\"", g.name))?;
        run_on_device(handle, plan, &in_bufs, &host_scalars, &mut out_bufs)?;
    } else {
        let mut workspace = try_vec_filled(plan.workspace_size(), 0u8, || format!("the workspace of graph \"{}\"", g.name))?;
        let mut pack = VariantPack::new();
        for (uid, b) in in_bufs.iter().chain(&host_scalars) {
            pack.input(*uid, b);
        }
        for (_, uid, b) in &mut out_bufs {
            pack.output(*uid, b);
        }
        let ws = (!workspace.is_empty()).then(|| crate::engine::Buffer::HostMut(&mut workspace));
        plan.execute_cancellable(&mut pack, ws, cancel)?;
    }
    let mut outputs = HashMap::new();
    for (id, _, bytes) in out_bufs {
        let dtype = g.resolved_data_type(id).unwrap_or(DataType::F32);
        let d = g.desc(id);
        let nd = match ragged_layout(g, id, inputs)? {
            // The rows a ragged output holds (the others do not exist, and read as 0).
            Some(r) => r.gather(d, dtype, &bytes).map_err(|m| Error::InvalidArgument(format!("output tensor \"{}\": {m}", d.name)))?,
            None => try_gather(d, dtype, &bytes)?,
        };
        outputs.insert(id, nd);
    }
    Ok(outputs)
}

/// Copy host buffers to the device (outputs keep their poison), run, wait, copy outputs back.
fn run_on_device(handle: &Handle, plan: &Plan, ins: &[(i64, Vec<u8>)], host_scalars: &[(i64, Vec<u8>)], outs: &mut [(TensorId, i64, Vec<u8>)]) -> Result<()> {
    let device = handle.cuda_device().ok_or_else(|| Error::InvalidArgument("a CUDA plan needs a handle with a GPU".into()))?;
    let stream = handle.stream().ok_or_else(|| Error::InvalidArgument("a CUDA plan needs a handle with a GPU".into()))?;
    // Zero-length tensors cannot exist (dims are positive), but keep every allocation non-empty.
    let g = plan.graph();
    let upload = |uid: i64, b: &[u8]| -> Result<crate::engine::cuda::DeviceBuffer> {
        let mut d = device.alloc_for(b.len().max(1), &format!("graph \"{}\": the device buffer of uid {uid}", g.name))?;
        if !b.is_empty() {
            d.copy_from_host(b)?;
        }
        Ok(d)
    };
    let d_ins = ins.iter().map(|(uid, b)| Ok((*uid, upload(*uid, b)?))).collect::<Result<Vec<_>>>()?;
    let d_outs = outs.iter().map(|(_, uid, b)| Ok((*uid, upload(*uid, b)?))).collect::<Result<Vec<_>>>()?;
    let ws = device.alloc_for(plan.workspace_size().max(1), &format!("graph \"{}\": the workspace", g.name))?;
    // Uploads go through the legacy default stream; make sure they landed before our stream runs.
    device.synchronize()?;
    {
        let mut pack = VariantPack::new();
        for (uid, b) in d_ins.iter().chain(&d_outs) {
            pack.device(*uid, b.device_ptr(), b.len());
        }
        for (uid, b) in host_scalars {
            pack.input(*uid, b);
        }
        plan.execute(&mut pack, Some(crate::engine::Buffer::Device { ptr: ws.device_ptr(), bytes: ws.len() }))?;
    }
    stream.synchronize()?;
    for ((_, _, host), (_, dev)) in outs.iter_mut().zip(&d_outs) {
        if !host.is_empty() {
            dev.copy_to_host(host)?;
        }
    }
    Ok(())
}

/// Validate a copy of `graph` and run it on the f64 reference engine with the given dense
/// inputs.
pub fn run_cpu(graph: &Graph, inputs: &HashMap<TensorId, Nd>) -> Result<HashMap<TensorId, Nd>> {
    let mut g = graph.clone();
    g.validate()?;
    execute_dense(&Handle::reference(), &g, inputs, &PlanPolicy::default())
}

/// What a user's graph goes through on the fast CPU engine (`ferrodnn run FILE --engine cpu`,
/// the Python package's `run_graph_json`, the hostile-input corpus of `tests/hostile.rs`):
/// validate a copy of `graph`, build its CPU plan, fill its inputs with random values from `seed`
/// and execute it; the first error ends it. Returns every non-virtual output as a dense array.
pub fn run_cpu_random(graph: &Graph, seed: u64) -> Result<HashMap<TensorId, Nd>> {
    let mut g = graph.clone();
    g.validate()?;
    let handle = Handle::cpu();
    let plan = handle.build_plans(&g, &PlanPolicy { engine: Some(EngineKind::Cpu), ..Default::default() })?.remove(0);
    let inputs = try_random_inputs(plan.graph(), seed)?;
    execute_plan_dense(&handle, &plan, &inputs)
}

/// ||a - b|| / ||b|| (with ||b|| floored at 1e-30); infinite when the shapes differ or either
/// holds a NaN the other does not.
pub fn relative_error(a: &[f64], b: &[f64]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let mut num = 0.0;
    let mut den = 0.0;
    for (&x, &y) in a.iter().zip(b) {
        if x.is_nan() != y.is_nan() {
            return f64::INFINITY;
        }
        if x.is_nan() {
            continue;
        }
        if x.is_infinite() || y.is_infinite() {
            if x != y {
                return f64::INFINITY;
            }
            continue;
        }
        num += (x - y) * (x - y);
        den += y * y;
    }
    num.sqrt() / den.sqrt().max(1e-30)
}

/// Largest |a - b| over elements (infinite on a NaN mismatch or shape mismatch).
pub fn max_abs_error(a: &[f64], b: &[f64]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    a.iter().zip(b).fold(0.0f64, |m, (&x, &y)| {
        if x.is_nan() || y.is_nan() {
            if x.is_nan() && y.is_nan() {
                m
            } else {
                f64::INFINITY
            }
        } else if x == y {
            m
        } else {
            m.max((x - y).abs())
        }
    })
}

/// The type whose precision output `id` of `graph` carries: its own, except for an f32 output of
/// an RNN node whose sequence (`x`, or `dy` in backward data) is f16 or bf16. The fast forward
/// rounds each step's state to the sequence's type before the next step's recurrent product, as
/// cuDNN's RNN kernels do, so the f32 gates in the reserve, and the gradients computed from
/// them, carry that type's error.
pub fn output_precision(graph: &Graph, id: TensorId) -> DataType {
    use crate::graph::ops::Op;
    let own = graph.resolved_data_type(id).unwrap_or(DataType::F32);
    let Some(node) = graph.nodes.iter().find(|n| n.outputs.iter().any(|p| p.tensor == id)) else { return own };
    if !matches!(node.op, Op::Rnn(_) | Op::RnnBackwardData(_) | Op::RnnBackwardWeights(_)) || own != DataType::F32 {
        return own;
    }
    match node.input("x").or_else(|| node.input("dy")).and_then(|x| graph.resolved_data_type(x)) {
        Some(dt @ (DataType::F16 | DataType::Bf16)) => dt,
        _ => own,
    }
}

/// The relative-error tolerance for results stored in `dtype`.
pub fn tolerance(dtype: DataType) -> f64 {
    match dtype {
        DataType::F64 => 1e-12,
        DataType::F32 => 1e-5,
        DataType::F16 => 5e-3,
        DataType::Bf16 => 2e-2,
        DataType::Fp8E4m3 | DataType::Fp8E5m2 => 1.5e-1,
        _ => 0.0,
    }
}

/// Central finite differences of a scalar function: d f / d x[i] for every element of `x`,
/// with step `h` (use f64 graphs and h near 1e-6).
pub fn numeric_gradient(x: &Nd, h: f64, mut f: impl FnMut(&Nd) -> f64) -> Nd {
    let mut grad = Nd::zeros(&x.dims);
    let mut probe = x.clone();
    for i in 0..x.len() {
        let orig = probe.data[i];
        probe.data[i] = orig + h;
        let up = f(&probe);
        probe.data[i] = orig - h;
        let down = f(&probe);
        probe.data[i] = orig;
        grad.data[i] = (up - down) / (2.0 * h);
    }
    grad
}

/// sum(a * b) over all elements: the scalar loss whose gradient with respect to a forward
/// output is `b` (the "dy" of a backward op).
pub fn dot(a: &Nd, b: &Nd) -> f64 {
    a.data.iter().zip(&b.data).map(|(x, y)| x * y).sum()
}

pub mod cases;
pub mod check;
pub mod fuzz;
