//! The fast CPU engine, the default engine of a handle without a GPU ([`EngineKind::Cpu`]).
//!
//! Softmax, layernorm and rmsnorm run as one threaded pass per row ([`rows`]), chains of
//! pointwise ops as one threaded pass ([`pointwise`]). Matmuls and
//! convolutions (forward, data and weight gradients) run on the `gemm` crate's
//! multi-threaded f32 kernels (AVX2/FMA or NEON, chosen at run time), with f16 and bf16 tensors
//! converted to f32 on the way in and rounded on the way out, so every product accumulates in
//! f32. The pointwise chain after a matmul or a convolution forward (bias, scale, residual,
//! activations) runs in its epilogue, on each finished tile while it is in cache
//! ([`epilogue`]). Convolutions run as im2col blocks of a bounded size in the plan's workspace
//! followed by the GEMM ([`conv`]); on a machine with AVX-512, 2-D single-group forward
//! convolutions run on a direct kernel instead ([`conv_direct`]).
//!
//! Every other node, and every node whose types the fast kernels do not take (f64, fp8,
//! integers, a compute type other than f32), runs through the f64 reference engine's own code
//! for that node ([`super::cpu`]), so every graph that validates runs. [`FastPlan::explain`]
//! (through [`crate::engine::Plan::explain`]) says which path took each node and why.
//!
//! Workspace: the plan's workspace holds the im2col blocks (or the direct kernel's packed filter
//! and image), the converted f16/bf16 operands and the f32 tiles the epilogue reads; execute allocates only the intermediate (virtual) tensors
//! between groups, as the reference does, and the nodes the reference runs allocate as there.

mod attention;
mod conv;
mod conv_direct;
mod epilogue;
mod gemm;
mod pointwise;
mod pool;
mod rows;
mod tensor;

use super::cpu::{check_pack, exec_node, load_port, store_output, NodeIo};
use super::{BehaviorNotes, Buffer, CancelToken, CompiledPlan, Engine, EngineKind, Knob, VariantPack};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::graph::ops::Op;
use crate::graph::{Graph, TensorId};
use crate::layout::{try_vec, Nd};
use epilogue::{BoundEpilogue, Chain};
use std::collections::HashMap;
use std::sync::Arc;
use tensor::{Dst, Src};

/// The fast CPU engine. Its plans run on `pool`: a pool of its own (a handle made with
/// [`crate::Handle::cpu_with_threads`]), else the process's shared pool of the engine (all
/// cores, or `RAYON_NUM_THREADS`); rayon's global pool only where that could not be started.
/// A pool with one thread per core pins each thread to its core (the `pool` module; off with
/// `FERRODNN_CPU_PIN=0`).
///
/// Mixing runtimes: PyTorch's OpenMP workers (libgomp) spin for several milliseconds after each
/// parallel region before they sleep (with `OMP_WAIT_POLICY` unset), holding a core that this
/// engine's plan, called right after, would use: that plan then runs at the speed of the cores
/// left. `GOMP_SPINCOUNT` (a shorter spin) or `OMP_WAIT_POLICY=PASSIVE` in PyTorch's environment
/// gives the cores back sooner (BENCHMARKS.md, CPU section).
#[derive(Clone, Default)]
pub struct CpuFastEngine {
    pool: Option<Arc<rayon::ThreadPool>>,
}

impl CpuFastEngine {
    /// The engine on the process's shared pool.
    pub fn new() -> CpuFastEngine {
        CpuFastEngine { pool: pool::shared() }
    }

    /// The engine on a pool of its own with `threads` threads (at least 1).
    pub fn with_threads(threads: usize) -> Result<CpuFastEngine> {
        if threads == 0 {
            return Err(Error::InvalidArgument("the fast CPU engine needs at least 1 thread, got 0".into()));
        }
        let pool = pool::build(threads).map_err(|e| Error::InvalidArgument(format!("the fast CPU engine's pool of {threads} threads could not be started: {e}")))?;
        Ok(CpuFastEngine { pool: Some(Arc::new(pool)) })
    }

    /// The threads its plans run on.
    pub fn threads(&self) -> usize {
        self.pool.as_ref().map_or_else(rayon::current_num_threads, |p| p.current_num_threads())
    }
}

impl Engine for CpuFastEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Cpu
    }
    fn tuning_key(&self) -> String {
        format!("threads={}", self.threads())
    }
    fn supports(&self, _graph: &Graph) -> Result<()> {
        Ok(())
    }
    fn candidates(&self, _graph: &Graph) -> Vec<Vec<Knob>> {
        vec![Vec::new()]
    }
    fn behavior(&self, _graph: &Graph, _knobs: &[Knob]) -> BehaviorNotes {
        // The GEMM splits rows and columns among threads, never the reduction, and the weight
        // gradient sums its images in order: the same inputs give the same bits.
        BehaviorNotes { runtime_compiled: false, deterministic: true, reduced_precision: false }
    }
    fn build(&self, graph: Arc<Graph>, _knobs: &[Knob]) -> Result<Box<dyn CompiledPlan>> {
        // On the engine's pool, whose thread count the scratch estimate takes (outside it, rayon
        // would start its global pool to answer).
        match &self.pool {
            Some(pool) => pool.install(|| super::cpu::budget::check(&graph))?,
            None => super::cpu::budget::check(&graph)?,
        }
        let mut plan = FastPlan::new(graph)?;
        plan.pool = self.pool.clone();
        Ok(Box::new(plan))
    }
}

/// What runs one node (or a fused group).
enum Step {
    /// The reference engine's code for node `node`; `why` says why the fast kernels declined.
    Reference {
        node: usize,
        why: String,
    },
    Matmul(gemm::MatmulStep),
    Conv(conv::ConvStep),
    Rows(rows::RowStep),
    Pointwise(pointwise::PointwiseStep),
    Attention(attention::AttentionStep),
}

/// A plan of the fast CPU engine: its steps in order and its workspace.
pub struct FastPlan {
    graph: Arc<Graph>,
    steps: Vec<Step>,
    /// Workspace in f32 elements (the largest any step needs).
    workspace_f32: usize,
    /// The engine's thread pool (rayon's global pool when none).
    pool: Option<Arc<rayon::ThreadPool>>,
}

/// Bytes added to the workspace so that its f32 view can start on a 64-byte boundary.
const WORKSPACE_ALIGN: usize = 64;

impl FastPlan {
    fn new(graph: Arc<Graph>) -> Result<FastPlan> {
        let g = &*graph;
        let order = g.topological_order()?;
        let consumers = g.consumers();
        let mut produced: HashMap<usize, usize> = HashMap::new();
        for (ni, node) in g.nodes.iter().enumerate() {
            for p in &node.outputs {
                produced.insert(p.tensor.0, ni);
            }
        }
        let mut fused = vec![false; g.nodes.len()];
        let mut steps = Vec::new();
        let mut workspace_f32 = 0usize;
        for &ni in &order {
            if fused[ni] {
                continue;
            }
            let node = &g.nodes[ni];
            let step = match &node.op {
                Op::Matmul(_) => gemm::MatmulStep::plan(g, ni, &consumers, &produced).map(Step::Matmul),
                Op::ConvFprop(a) | Op::ConvDgrad(a) | Op::ConvWgrad(a) => conv::ConvStep::plan(g, ni, a, &consumers, &produced).map(Step::Conv),
                Op::Softmax(_) | Op::Layernorm(_) | Op::Rmsnorm(_) => rows::RowStep::plan(g, ni).map(Step::Rows),
                Op::Pointwise(_) => pointwise::PointwiseStep::plan(g, ni, &consumers, &produced).map(Step::Pointwise),
                Op::Sdpa(a) => attention::AttentionStep::plan(g, ni, a).map(Step::Attention),
                _ => Err("the fast CPU engine does not take this op yet".to_string()),
            };
            let step = step.unwrap_or_else(|why| Step::Reference { node: ni, why });
            match &step {
                Step::Matmul(m) => {
                    for l in &m.chain.links {
                        fused[l.node] = true;
                    }
                    workspace_f32 = workspace_f32.max(m.workspace_f32);
                }
                Step::Conv(c) => {
                    for l in &c.chain.links {
                        fused[l.node] = true;
                    }
                    workspace_f32 = workspace_f32.max(c.workspace_f32);
                }
                Step::Pointwise(p) => {
                    for l in &p.chain.links {
                        fused[l.node] = true;
                    }
                }
                Step::Reference { .. } | Step::Rows(_) | Step::Attention(_) => {}
            }
            steps.push(step);
        }
        Ok(FastPlan { graph, steps, workspace_f32, pool: None })
    }

    /// One line per step: which nodes it runs and on what (`gemm`, `conv`, or the reference's
    /// code and why).
    pub fn explain(&self) -> String {
        let g = &*self.graph;
        let name = |ni: usize| format!("{}:{} \"{}\"", ni, g.nodes[ni].op.kind(), g.nodes[ni].name);
        let chain = |c: &Chain| if c.links.is_empty() { String::new() } else { format!(" + epilogue [{}]", c.links.iter().map(|l| name(l.node)).collect::<Vec<_>>().join(", ")) };
        let threads = self.pool.as_ref().map_or_else(rayon::current_num_threads, |p| p.current_num_threads());
        let mut out = format!("graph \"{}\" on the fast CPU engine ({threads} threads), workspace {} bytes\n", g.name, self.workspace_size());
        for (i, s) in self.steps.iter().enumerate() {
            let line = match s {
                Step::Reference { node, why } => format!("step {i}: {} -> reference (f64): {why}", name(*node)),
                Step::Matmul(m) => format!("step {i}: {}{} -> gemm f32 ({})", name(m.node), chain(&m.chain), m.describe()),
                Step::Conv(c) => format!("step {i}: {}{} -> conv ({})", name(c.node), chain(&c.chain), c.describe()),
                Step::Rows(r) => format!("step {i}: {} -> rows ({})", name(r.node), r.describe()),
                Step::Pointwise(p) => format!("step {i}: {}{} -> pointwise ({})", name(p.node), chain(&p.chain), p.describe()),
                Step::Attention(a) => format!("step {i}: {} -> attention ({})", name(a.node), a.describe()),
            };
            out.push_str(&line);
            out.push('\n');
        }
        out
    }
}

/// A tensor's value during one execution: dense row-major, as f64 (what the reference's code
/// reads and writes) and/or f32 (what the fast kernels read), each made from the other when
/// first needed.
struct Val {
    dims: Vec<usize>,
    nd: Option<Nd>,
    f32: Option<Vec<f32>>,
}

/// The state of one execution: the values of tensors so far.
pub(crate) struct Exec<'p, 'a, 'b> {
    graph: &'p Graph,
    pack: &'p mut VariantPack<'a>,
    values: HashMap<usize, Val>,
    ws: &'b mut [f32],
}

impl Exec<'_, '_, '_> {
    /// Tensor `t` as a source of f32 values: its buffer when it has one, else its dense value.
    pub fn src(&mut self, t: TensorId) -> Result<Src> {
        let g = self.graph;
        let d = g.desc(t);
        let dims: Vec<usize> = d.dims.iter().map(|&x| x as usize).collect();
        let dtype = g.resolved_data_type(t).unwrap_or(DataType::F32);
        if let (true, Some(v)) = (d.is_pass_by_value, d.value) {
            return Ok(Src::owned(vec![dtype.quantize(v) as f32; dims.iter().product()], &dims));
        }
        if let Some(val) = self.values.get_mut(&t.0) {
            if val.f32.is_none() {
                let nd = val.nd.as_ref().ok_or_else(|| Error::InvalidGraph(format!("internal: tensor \"{}\" has no value", d.name)))?;
                let mut v = try_vec(nd.data.len(), || format!("tensor \"{}\" as f32", d.name))?;
                v.extend(nd.data.iter().map(|&x| x as f32));
                val.f32 = Some(v);
            }
            let data = val.f32.as_ref().map(|v| v.as_slice()).unwrap_or(&[]);
            return Ok(Src::dense(data, &val.dims));
        }
        if d.is_virtual {
            return Err(Error::InvalidGraph(format!("tensor \"{}\" is virtual but nothing produced it before it was read", d.name)));
        }
        let uid = d.uid.unwrap_or_default();
        let bytes: &[u8] = match self.pack.buffers.get(&uid) {
            Some(Buffer::Host(b)) => b,
            Some(Buffer::HostMut(b)) => b,
            _ => return Err(Error::InvalidArgument(format!("tensor \"{}\" (uid {uid}) has no host buffer in the variant pack", d.name))),
        };
        if !epilogue::fast_type(dtype) {
            return Err(Error::InvalidGraph(format!("internal: tensor \"{}\" of {dtype} given to a fast CPU kernel", d.name)));
        }
        let strides: Vec<isize> = d.strides.iter().map(|&s| s as isize).collect();
        Ok(Src::bytes(bytes, dtype, &dims, &strides))
    }

    /// Run `f` with a destination for tensor `t`: its buffer when it has one, else a new dense
    /// f32 value (rounded to the tensor's type) kept for the nodes after.
    pub fn with_dst<R>(&mut self, t: TensorId, f: impl FnOnce(&Dst, &mut [f32]) -> Result<R>) -> Result<R> {
        let g = self.graph;
        let d = g.desc(t);
        let dims: Vec<usize> = d.dims.iter().map(|&x| x as usize).collect();
        let dtype = g.resolved_data_type(t).unwrap_or(DataType::F32);
        if d.is_virtual {
            let n: usize = dims.iter().product();
            let mut data = try_vec::<f32>(n, || format!("intermediate tensor \"{}\" (dims {:?})", d.name, d.dims))?;
            data.resize(n, 0.0);
            let dst = Dst::dense(&mut data, &dims, dtype);
            let r = f(&dst, self.ws)?;
            self.values.insert(t.0, Val { dims, nd: None, f32: Some(data) });
            return Ok(r);
        }
        let uid = d.uid.unwrap_or_default();
        let bytes: &mut [u8] = match self.pack.buffers.get_mut(&uid) {
            Some(Buffer::HostMut(b)) => b,
            _ => return Err(Error::InvalidArgument(format!("tensor \"{}\" (uid {uid}) is an output: pass it as a writable host buffer", d.name))),
        };
        let strides: Vec<isize> = d.strides.iter().map(|&s| s as isize).collect();
        let dst = Dst::bytes(bytes, dtype, &dims, &strides);
        f(&dst, self.ws)
    }

    /// The epilogue `chain` bound to this execution's buffers, for an anchor writing `anchor`.
    pub fn bind(&mut self, anchor: TensorId, chain: &Chain) -> Result<BoundEpilogue> {
        let g = self.graph;
        let out_dims: Vec<usize> = g.desc(anchor).dims.iter().map(|&x| x as usize).collect();
        let mut links = Vec::new();
        for l in &chain.links {
            let mut others = Vec::new();
            for &(port, t) in &l.others {
                let src = self.src(t)?;
                let strides = src.broadcast_strides(&out_dims);
                others.push((port, src, strides));
            }
            links.push((l.clone(), others));
        }
        Ok(BoundEpilogue { anchor_type: g.resolved_data_type(anchor).unwrap_or(DataType::F32), links })
    }

    /// Node `ni` on the reference engine's code, as the reference runs it.
    fn reference(&mut self, ni: usize) -> Result<()> {
        let g = self.graph;
        let node = &g.nodes[ni];
        for port in &node.inputs {
            let t = port.tensor;
            match self.values.get_mut(&t.0) {
                Some(val) if val.nd.is_none() => {
                    let d = g.desc(t);
                    let data = val.f32.as_ref().map(|v| v.as_slice()).unwrap_or(&[]);
                    let mut v = try_vec(data.len(), || format!("tensor \"{}\" read as f64", d.name))?;
                    v.extend(data.iter().map(|&x| x as f64));
                    val.nd = Some(Nd::new(val.dims.clone(), v));
                }
                Some(_) => {}
                None => {
                    let nd = load_port(g, node, &port.name, t, self.pack)?;
                    self.values.insert(t.0, Val { dims: nd.dims.clone(), nd: Some(nd), f32: None });
                }
            }
        }
        let outputs = {
            let inputs = node.inputs.iter().filter_map(|p| self.values.get(&p.tensor.0).and_then(|v| v.nd.as_ref()).map(|nd| (p.name.clone(), nd))).collect();
            let mut io = NodeIo { graph: g, node, inputs, outputs: Vec::new() };
            exec_node(&mut io)?;
            io.outputs
        };
        for (port, mut nd) in outputs {
            let id = store_output(g, node, &port, &mut nd, self.pack)?;
            self.values.insert(id.0, Val { dims: nd.dims.clone(), nd: Some(nd), f32: None });
        }
        Ok(())
    }
}

impl CompiledPlan for FastPlan {
    fn workspace_size(&self) -> usize {
        if self.workspace_f32 == 0 {
            0
        } else {
            self.workspace_f32 * 4 + WORKSPACE_ALIGN
        }
    }

    fn execute(&self, pack: &mut VariantPack, workspace: Option<Buffer>) -> Result<()> {
        self.execute_cancellable(pack, workspace, &CancelToken::new())
    }

    fn execute_cancellable(&self, pack: &mut VariantPack, workspace: Option<Buffer>, cancel: &CancelToken) -> Result<()> {
        match &self.pool {
            Some(pool) => pool.install(|| self.run(pack, workspace, cancel)),
            None => self.run(pack, workspace, cancel),
        }
    }

    fn explain(&self) -> Option<String> {
        Some(FastPlan::explain(self))
    }
}

impl FastPlan {
    /// Every step in order, on the current rayon pool.
    fn run(&self, pack: &mut VariantPack, workspace: Option<Buffer>, cancel: &CancelToken) -> Result<()> {
        let g = &*self.graph;
        check_pack(g, pack)?;
        let gname = || if g.name.is_empty() { "graph".to_string() } else { format!("graph \"{}\"", g.name) };
        let mut workspace = workspace;
        let ws: &mut [f32] = match workspace.as_mut() {
            _ if self.workspace_f32 == 0 => &mut [],
            Some(Buffer::HostMut(bytes)) => {
                // SAFETY: every bit pattern is a valid f32, and align_to_mut returns a correctly
                // aligned middle part.
                let (_, mid, _) = unsafe { bytes.align_to_mut::<f32>() };
                // From the first 64-byte boundary when the buffer reaches that far (the plan's
                // size has WORKSPACE_ALIGN bytes for it): the kernels' vectors then do not
                // straddle cache lines.
                let skip = (WORKSPACE_ALIGN - mid.as_ptr() as usize % WORKSPACE_ALIGN) % WORKSPACE_ALIGN / 4;
                let mid = if mid.len() >= skip + self.workspace_f32 { &mut mid[skip..] } else { mid };
                if mid.len() < self.workspace_f32 {
                    return Err(Error::InvalidArgument(format!("{}: the workspace holds {} aligned f32 values but the plan needs {}", gname(), mid.len(), self.workspace_f32)));
                }
                &mut mid[..self.workspace_f32]
            }
            _ => return Err(Error::InvalidArgument(format!("{}: the fast CPU engine needs a writable host workspace of {} bytes", gname(), self.workspace_size()))),
        };
        let mut ex = Exec { graph: g, pack, values: HashMap::new(), ws };
        for step in &self.steps {
            let ni = match step {
                Step::Reference { node, .. } => *node,
                Step::Matmul(m) => m.node,
                Step::Conv(c) => c.node,
                Step::Rows(r) => r.node,
                Step::Pointwise(p) => p.node,
                Step::Attention(a) => a.node,
            };
            let node = &g.nodes[ni];
            cancel.check(|| format!("{}: before {} \"{}\"", gname(), node.op.kind(), node.name))?;
            match step {
                Step::Reference { node, .. } => ex.reference(*node)?,
                Step::Matmul(m) => m.run(&mut ex)?,
                Step::Conv(c) => c.run(&mut ex)?,
                Step::Rows(r) => r.run(&mut ex)?,
                Step::Pointwise(p) => p.run(&mut ex)?,
                Step::Attention(a) => a.run(&mut ex)?,
            }
        }
        cancel.check(|| format!("{}: after the last node", gname()))?;
        Ok(())
    }
}

/// How many of validated graph `g`'s nodes the fast kernels run (fused epilogue nodes
/// included); the rest run on the reference's code.
pub fn fast_node_count(g: &Graph) -> Result<usize> {
    let plan = FastPlan::new(Arc::new(g.clone()))?;
    // (No pool needed: nothing runs.)
    Ok(plan
        .steps
        .iter()
        .map(|s| match s {
            Step::Reference { .. } => 0,
            Step::Matmul(m) => 1 + m.chain.links.len(),
            Step::Conv(c) => 1 + c.chain.links.len(),
            Step::Rows(_) | Step::Attention(_) => 1,
            Step::Pointwise(p) => 1 + p.chain.links.len(),
        })
        .sum())
}

/// Shape facts every fast step checks: the tensor's type is one the fast kernels take, and (for
/// an output) no dim of size > 1 has stride 0.
pub(crate) fn check_tensor(g: &Graph, t: TensorId, output: bool) -> std::result::Result<(), String> {
    let d = g.desc(t);
    let dt = g.resolved_data_type(t).unwrap_or(DataType::F32);
    if !epilogue::fast_type(dt) {
        return Err(format!("tensor \"{}\" is {dt} (the fast kernels take f32, f16 and bf16)", d.name));
    }
    if d.strides.len() != d.dims.len() {
        return Err(format!("tensor \"{}\" has no strides", d.name));
    }
    if output && !d.is_virtual && d.dims.iter().zip(&d.strides).any(|(&n, &s)| n > 1 && s == 0) {
        return Err(format!("output \"{}\" has a zero stride", d.name));
    }
    if d.is_pass_by_value {
        return Err(format!("tensor \"{}\" is a by-value scalar", d.name));
    }
    Ok(())
}
