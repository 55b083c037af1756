//! Engines, plans and execution, in cuDNN's shape: a [`Handle`] holds the engines available on
//! this machine; it builds ranked [`Plan`]s for a validated graph (each names its engine and
//! knobs and knows its workspace size and behavior notes); a plan executes with a
//! [`VariantPack`] (tensor uid -> buffer) and a workspace.
//!
//! ```
//! use ferrodnn::{DataType, Graph, Handle, TensorDesc, VariantPack};
//! let mut g = Graph::new("relu").io_data_type(DataType::F32);
//! let x = g.tensor(TensorDesc::new("x", &[4], DataType::F32).with_uid(1));
//! let y = g.relu(x);
//! g.set_output(y);
//! g.desc_mut(y).uid = Some(2);
//! g.validate().unwrap();
//! let handle = Handle::cpu();
//! let plan = handle.build_plans(&g, &Default::default()).unwrap().remove(0);
//! let xs = DataType::F32.encode(&[-1.0, 2.0, -3.0, 4.0]);
//! let mut ys = vec![0u8; 16];
//! let mut pack = VariantPack::new();
//! pack.input(1, &xs).output(2, &mut ys);
//! plan.execute(&mut pack, None).unwrap();
//! assert_eq!(DataType::F32.decode(&ys), vec![0.0, 2.0, 0.0, 4.0]);
//! ```

pub mod cpu;
pub mod cpu_fast;
pub mod cuda;

use crate::error::{Error, Result};
use crate::graph::{Graph, ShapeOverrides, TensorId};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;

/// Which engine a plan runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    /// The fast CPU engine ([`cpu_fast`]): matmul and convolution on f32 GEMM kernels with
    /// fused epilogues, every other node through the reference's code. The default engine of a
    /// handle without a GPU. Plans serialized as `"cpu"` before the fast engine existed rebuild
    /// on it.
    Cpu,
    /// The GPU engines (the CUDA engine issue).
    Cuda,
    /// The f64 reference engine ([`cpu`]): every op, every type, any strides, on all cores;
    /// what every other engine is checked against. Chosen explicitly ([`Handle::reference`],
    /// or a policy naming it).
    Reference,
}

impl EngineKind {
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Cpu => "cpu",
            EngineKind::Cuda => "cuda",
            EngineKind::Reference => "reference",
        }
    }
}

impl std::str::FromStr for EngineKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<EngineKind> {
        match s {
            "cpu" => Ok(EngineKind::Cpu),
            "cuda" => Ok(EngineKind::Cuda),
            "reference" => Ok(EngineKind::Reference),
            _ => Err(Error::InvalidArgument(format!("unknown engine `{s}`; expected cpu, cuda or reference"))),
        }
    }
}

/// A tuning choice of an engine (tile size, split, ...), by name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Knob {
    pub name: String,
    pub value: i64,
}

/// What a plan promises about how it computes, as cuDNN's behavior notes do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BehaviorNotes {
    /// Its kernels were generated and compiled at plan-build time.
    pub runtime_compiled: bool,
    /// Two runs on the same inputs give bit-identical results.
    pub deterministic: bool,
    /// It uses reduced precision (tensor cores on f16/bf16 inputs, tf32 for f32).
    pub reduced_precision: bool,
}

/// The serializable part of a plan: which engine, which knobs, for which graph.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanDesc {
    pub engine: EngineKind,
    pub knobs: Vec<Knob>,
    /// The key of the graph the plan was built for.
    pub graph_key: u64,
}

impl PlanDesc {
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string(self).map_err(|e| Error::Serialization(format!("plan could not be serialized: {e}")))
    }
    pub fn from_json(text: &str) -> Result<PlanDesc> {
        if text.len() > 1 << 20 {
            return Err(Error::Serialization(format!("plan JSON is {} bytes; at most 1 MiB is accepted", text.len())));
        }
        let d: PlanDesc = serde_json::from_str(text).map_err(|e| Error::Serialization(format!("plan JSON is malformed: {e}")))?;
        if d.knobs.len() > 256 {
            return Err(Error::Serialization(format!("plan has {} knobs; at most 256 are accepted", d.knobs.len())));
        }
        Ok(d)
    }
}

/// What the user asks of plans.
#[derive(Clone, Debug, Default)]
pub struct PlanPolicy {
    /// Only engines of this kind.
    pub engine: Option<EngineKind>,
    /// Only plans whose behavior notes say deterministic.
    pub deterministic_only: bool,
    /// Refuse plans that use reduced precision (such as the CUDA engine's `tf32` plan for
    /// graphs with f32 matmuls, ranked first otherwise).
    pub no_reduced_precision: bool,
    /// Build every candidate plan of every engine (for autotuning or inspection). By default
    /// only each engine's best candidate that builds is compiled.
    pub all_candidates: bool,
    /// Autotune: the CUDA engine's plans get the knob `autotune`, with which each Hopper GEMM
    /// problem is timed once on the device in a few tile configurations and runs in the
    /// fastest; the choice is kept in memory and on disk beside the kernel cache, keyed by the
    /// problem, so later builds (in this process or another) do not time it again.
    pub autotune: bool,
}

/// A buffer of a variant pack or a workspace.
pub enum Buffer<'a> {
    /// Host memory the plan reads.
    Host(&'a [u8]),
    /// Host memory the plan may write.
    HostMut(&'a mut [u8]),
    /// Device memory: a device pointer and its size in bytes.
    Device { ptr: u64, bytes: usize },
}

impl Buffer<'_> {
    pub fn len(&self) -> usize {
        match self {
            Buffer::Host(b) => b.len(),
            Buffer::HostMut(b) => b.len(),
            Buffer::Device { bytes, .. } => *bytes,
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Buffers keyed by tensor uid.
#[derive(Default)]
pub struct VariantPack<'a> {
    pub buffers: HashMap<i64, Buffer<'a>>,
}

impl<'a> VariantPack<'a> {
    pub fn new() -> VariantPack<'a> {
        VariantPack { buffers: HashMap::new() }
    }
    /// A host buffer the plan reads.
    pub fn input(&mut self, uid: i64, data: &'a [u8]) -> &mut Self {
        self.buffers.insert(uid, Buffer::Host(data));
        self
    }
    /// A host buffer the plan writes.
    pub fn output(&mut self, uid: i64, data: &'a mut [u8]) -> &mut Self {
        self.buffers.insert(uid, Buffer::HostMut(data));
        self
    }
    /// A device buffer.
    pub fn device(&mut self, uid: i64, ptr: u64, bytes: usize) -> &mut Self {
        self.buffers.insert(uid, Buffer::Device { ptr, bytes });
        self
    }
}

/// A flag that stops a running execution ([`Plan::execute_cancellable`]): set it from another
/// thread (a Ctrl-C handler, a timeout) and the execution returns an error at its next check.
/// The CPU engine checks it before each node and while it reads inputs and writes outputs, so
/// a node already running finishes first (the CPU engine's work bound,
/// `FERRODNN_CPU_MAX_WORK`, keeps each node's time bounded); other engines check it before they
/// enqueue their work. Clones share one flag.
///
/// ```
/// use ferrodnn::engine::CancelToken;
/// let token = CancelToken::new();
/// let for_handler = token.clone();
/// for_handler.cancel();
/// assert!(token.is_cancelled());
/// ```
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<std::sync::atomic::AtomicBool>);

impl CancelToken {
    pub fn new() -> CancelToken {
        CancelToken::default()
    }
    /// Ask every execution watching this token to stop.
    pub fn cancel(&self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    pub fn is_cancelled(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
    /// Clear the flag, so that the token can watch another execution.
    pub fn reset(&self) {
        self.0.store(false, std::sync::atomic::Ordering::SeqCst);
    }
    /// `Err` naming `where_` when the token is set: `graph "g": execution cancelled before
    /// relu "r"`.
    pub fn check(&self, where_: impl FnOnce() -> String) -> Result<()> {
        if self.is_cancelled() {
            return Err(Error::InvalidArgument(format!("{}: execution cancelled (the cancel token was set)", where_())));
        }
        Ok(())
    }
}

/// An engine: says which graphs it supports and builds compiled plans for them.
pub trait Engine: Send + Sync {
    fn kind(&self) -> EngineKind;
    /// The engine's tuning switches that change its plans (empty for the defaults): part of every
    /// cached plan's key.
    fn tuning_key(&self) -> String {
        String::new()
    }
    /// Ok when this engine can run the (validated) graph; otherwise why not.
    fn supports(&self, graph: &Graph) -> Result<()>;
    /// Candidate knob sets, best first by the engine's own heuristics.
    fn candidates(&self, graph: &Graph) -> Vec<Vec<Knob>>;
    fn behavior(&self, graph: &Graph, knobs: &[Knob]) -> BehaviorNotes;
    /// Compile a plan. All expensive work (compilation, allocation) happens here.
    fn build(&self, graph: Arc<Graph>, knobs: &[Knob]) -> Result<Box<dyn CompiledPlan>>;
}

/// The engine-specific, executable part of a plan.
pub trait CompiledPlan: Send + Sync {
    fn workspace_size(&self) -> usize;
    fn execute(&self, pack: &mut VariantPack, workspace: Option<Buffer>) -> Result<()>;
    /// [`CompiledPlan::execute`] watching `cancel`. By default checked once, before the work
    /// starts; engines that run long on the host check it as they go.
    fn execute_cancellable(&self, pack: &mut VariantPack, workspace: Option<Buffer>, cancel: &CancelToken) -> Result<()> {
        cancel.check(|| "the plan".to_string())?;
        self.execute(pack, workspace)
    }
    /// What the plan runs each node on, as text, where the engine says (the fast CPU engine:
    /// which nodes run on its kernels, which fused, which on the reference's code and why).
    fn explain(&self) -> Option<String> {
        None
    }
}

/// An executable plan: an engine and its knobs, compiled for one graph.
pub struct Plan {
    pub desc: PlanDesc,
    pub notes: BehaviorNotes,
    graph: Arc<Graph>,
    inner: Arc<dyn CompiledPlan>,
}

impl Plan {
    pub fn engine(&self) -> EngineKind {
        self.desc.engine
    }
    pub fn workspace_size(&self) -> usize {
        self.inner.workspace_size()
    }
    pub fn graph(&self) -> &Graph {
        &self.graph
    }
    /// What the plan runs each node on, where its engine says (the fast CPU engine does: see
    /// [`cpu_fast`]).
    pub fn explain(&self) -> Option<String> {
        self.inner.explain()
    }
    /// Run the plan on the buffers of `pack`. Checks that every buffer the graph needs is
    /// there, is large enough and is of the right kind, that the pack names no tensor the
    /// graph lacks, and that the attributes it gives (an `epsilon` port's value) are valid.
    pub fn execute(&self, pack: &mut VariantPack, workspace: Option<Buffer>) -> Result<()> {
        self.check_execute(pack, workspace.as_ref())?;
        self.inner.execute(pack, workspace)
    }

    /// [`Plan::execute`], stopping with an error when `cancel` is set (from another thread, a
    /// Ctrl-C handler): see [`CancelToken`] for how soon each engine notices.
    pub fn execute_cancellable(&self, pack: &mut VariantPack, workspace: Option<Buffer>, cancel: &CancelToken) -> Result<()> {
        self.check_execute(pack, workspace.as_ref())?;
        self.inner.execute_cancellable(pack, workspace, cancel)
    }

    /// Run this plan's engine on tensors whose dims and strides differ from the graph's (the cudnn
    /// frontend's execute with `override_uids`, `override_shapes`, `override_strides`): the plan
    /// for the graph with `overrides` applied ([`Graph::with_overrides`]) is taken from `handle`'s
    /// plan cache or built there ([`Handle::plan_with_overrides`]), and runs on `pack`. The
    /// workspace must hold what that plan needs, which may be more than this plan's; no overrides
    /// runs this plan. Each call applies the overrides to a copy of the graph (a validation and a
    /// key, before the cached plan is found): to run one shape many times, keep the plan
    /// [`Handle::plan_with_overrides`] gives and execute that.
    ///
    /// ```
    /// use ferrodnn::{DataType, Graph, Handle, ShapeOverrides, TensorDesc, VariantPack};
    /// let f = DataType::F32;
    /// let mut g = Graph::new("relu").io_data_type(f);
    /// let x = g.tensor(TensorDesc::new("x", &[4], f).with_uid(1));
    /// let y = g.relu(x);
    /// g.set_output(y);
    /// g.desc_mut(y).uid = Some(2);
    /// let handle = Handle::cpu();
    /// let plan = handle.build_plans(&g, &Default::default()).unwrap().remove(0);
    ///
    /// // Six elements on the plan built for four.
    /// let mut o = ShapeOverrides::new();
    /// o.set(1, &[6], &[1]).set(2, &[6], &[1]);
    /// let xs = f.encode(&[-1.0, 2.0, -3.0, 4.0, -5.0, 6.0]);
    /// let mut ys = vec![0u8; 24];
    /// let mut pack = VariantPack::new();
    /// pack.input(1, &xs).output(2, &mut ys);
    /// plan.execute_with_overrides(&handle, &o, &mut pack, None).unwrap();
    /// assert_eq!(f.decode(&ys), vec![0.0, 2.0, 0.0, 4.0, 0.0, 6.0]);
    /// ```
    pub fn execute_with_overrides(&self, handle: &Handle, overrides: &ShapeOverrides, pack: &mut VariantPack, workspace: Option<Buffer>) -> Result<()> {
        if overrides.is_empty() {
            return self.execute(pack, workspace);
        }
        let plan = handle.plan_with_overrides(self, overrides)?;
        let (need, have) = (plan.workspace_size(), workspace.as_ref().map_or(0, |w| w.len()));
        if have < need {
            return Err(Error::InvalidArgument(format!(
                "graph \"{}\" with shape overrides: the plan for the overridden shapes needs a workspace of {need} bytes but {have} were given (the plan for the built shapes needs {}; Handle::plan_with_overrides(..).workspace_size() tells the size)",
                self.graph.name,
                self.workspace_size()
            )));
        }
        plan.execute(pack, workspace)
    }

    /// The checks of [`Plan::execute`] before the engine runs: workspace size, attribute values.
    fn check_execute(&self, pack: &VariantPack, workspace: Option<&Buffer>) -> Result<()> {
        let need = self.workspace_size();
        let have = workspace.map_or(0, |w| w.len());
        if have < need {
            return Err(Error::InvalidArgument(format!("graph \"{}\": the plan needs a workspace of {need} bytes but {have} were given", self.graph.name)));
        }
        let g = &*self.graph;
        let pack_value = |t: TensorId| {
            let d = g.desc(t);
            if d.value.is_some() {
                return None;
            }
            let dt = g.resolved_data_type(t)?;
            match pack.buffers.get(&g.uid(t)?)? {
                Buffer::Host(b) if b.len() >= dt.size() => dt.decode(&b[..dt.size()]).first().copied(),
                Buffer::HostMut(b) if b.len() >= dt.size() => dt.decode(&b[..dt.size()]).first().copied(),
                _ => None,
            }
        };
        for node in &g.nodes {
            node.check_attribute_values(&pack_value)?;
        }
        Ok(())
    }
}

/// The engines available to this process, bound (for the GPU engine) to one device and stream.
pub struct Handle {
    engines: Vec<Box<dyn Engine>>,
    cuda: Option<(Arc<cuda::CudaDevice>, cuda::SharedStream)>,
    /// Compiled plans by (graph key, engine, knobs and the engine's tuning switches): a graph
    /// seen before builds in microseconds.
    plans: std::sync::Mutex<HashMap<(u64, EngineKind, String), (Arc<Graph>, Arc<dyn CompiledPlan>)>>,
}

impl Handle {
    /// A handle with the CPU engines: the fast one first (the plan [`Handle::build_plans`] ranks
    /// first), then the f64 reference.
    pub fn cpu() -> Handle {
        Handle { engines: vec![Box::new(cpu_fast::CpuFastEngine::new()), Box::new(cpu::CpuEngine)], cuda: None, plans: Default::default() }
    }

    /// [`Handle::cpu`] whose fast CPU engine runs its plans on a thread pool of its own with
    /// `threads` threads (plans of other handles, and the reference engine, keep rayon's global
    /// pool: all cores, or `RAYON_NUM_THREADS`). Fails for 0 threads or when the pool cannot be
    /// started.
    ///
    /// ```
    /// let handle = ferrodnn::Handle::cpu_with_threads(1).unwrap();
    /// assert!(ferrodnn::Handle::cpu_with_threads(0).err().unwrap().to_string().contains("at least 1 thread"));
    /// # let _ = handle;
    /// ```
    pub fn cpu_with_threads(threads: usize) -> Result<Handle> {
        let fast = cpu_fast::CpuFastEngine::with_threads(threads)?;
        Ok(Handle { engines: vec![Box::new(fast), Box::new(cpu::CpuEngine)], cuda: None, plans: Default::default() })
    }

    /// A handle with only the f64 reference engine: what checks compare against.
    pub fn reference() -> Handle {
        Handle { engines: vec![Box::new(cpu::CpuEngine)], cuda: None, plans: Default::default() }
    }

    /// Every engine this machine can run, best first: the CUDA engine on GPU 0 when a supported
    /// GPU is present (on a stream of its own; see [`Handle::set_stream`]), then the fast CPU
    /// engine and the reference.
    pub fn new() -> Handle {
        if cuda::gpu_available() {
            if let Ok(h) = Handle::cuda(0) {
                return h;
            }
        }
        Handle::cpu()
    }

    /// A handle on GPU `ordinal` (and the CPU engines after it). Fails when there is no such
    /// GPU, it is older than sm_80, or the driver cannot be loaded.
    pub fn cuda(ordinal: usize) -> Result<Handle> {
        let device = cuda::CudaDevice::open(ordinal)?;
        // Load NVRTC and open the kernel cache now, as cudnnCreate loads its libraries, so that
        // plan builds only compile what the cache lacks. A missing NVRTC is reported by the
        // first plan build that needs to compile.
        let _ = cuda::nvrtc();
        let _ = cuda::KernelCache::global();
        let stream: cuda::SharedStream = Arc::new(std::sync::RwLock::new(Arc::new(device.new_stream()?)));
        let engine = cuda::CudaEngine::new(device.clone(), stream.clone());
        Ok(Handle { engines: vec![Box::new(engine), Box::new(cpu_fast::CpuFastEngine::new()), Box::new(cpu::CpuEngine)], cuda: Some((device, stream)), plans: Default::default() })
    }

    /// The GPU this handle's CUDA engine runs on, if any.
    pub fn cuda_device(&self) -> Option<&Arc<cuda::CudaDevice>> {
        self.cuda.as_ref().map(|(d, _)| d)
    }

    /// The stream CUDA plans of this handle enqueue their work on.
    pub fn stream(&self) -> Option<Arc<cuda::Stream>> {
        self.cuda.as_ref().and_then(|(_, s)| s.read().ok().map(|s| s.clone()))
    }

    /// Send this handle's GPU work (of plans built before or after) to `raw`, a CUstream of the
    /// handle's device (PyTorch's `torch.cuda.current_stream().cuda_stream`, for one), so that it
    /// is ordered with the caller's work.
    ///
    /// A stream the driver says belongs to another context (or does not know) is refused with
    /// an error, and the handle keeps its stream.
    ///
    /// # Safety
    /// `raw` must be null (the legacy default stream) or a live stream of this device's primary
    /// context, and must outlive every execution enqueued on it.
    pub unsafe fn set_stream(&self, raw: u64) -> Result<()> {
        let (device, shared) = self.cuda.as_ref().ok_or_else(|| Error::InvalidArgument("set_stream: this handle has no GPU engine".into()))?;
        device.check_stream(raw).map_err(|e| match e {
            Error::InvalidArgument(m) => Error::InvalidArgument(format!("set_stream: {m}")),
            e => e,
        })?;
        // SAFETY: the caller guarantees `raw` is a live stream of this device's context.
        let stream = unsafe { device.wrap_stream(raw as cudarc::driver::sys::CUstream) };
        *shared.write().map_err(|_| Error::Device("the handle's stream lock is poisoned".into()))? = Arc::new(stream);
        Ok(())
    }

    pub fn engines(&self) -> impl Iterator<Item = EngineKind> + '_ {
        self.engines.iter().map(|e| e.kind())
    }

    /// Plans for a validated graph, best first. Errors say why each engine declined.
    pub fn build_plans(&self, graph: &Graph, policy: &PlanPolicy) -> Result<Vec<Plan>> {
        let mut g = graph.clone();
        g.validate()?;
        let key = g.key();
        let g = Arc::new(g);
        let mut plans = Vec::new();
        let mut reasons = Vec::new();
        // The engines that gave a plan (only the first of each, unless all are asked for).
        let mut built: Vec<EngineKind> = Vec::new();
        for (engine, knobs, notes) in self.candidate_plans(&g, policy, &mut reasons) {
            if !policy.all_candidates && built.contains(&engine.kind()) {
                continue;
            }
            if (policy.deterministic_only && !notes.deterministic) || (policy.no_reduced_precision && notes.reduced_precision) {
                reasons.push(format!("{}: plan with knobs {knobs:?} does not meet the policy ({notes:?})", engine.kind().name()));
                continue;
            }
            match self.compiled(engine, &g, key, &knobs) {
                Ok((graph, inner)) => {
                    plans.push(Plan { desc: PlanDesc { engine: engine.kind(), knobs, graph_key: key }, notes, graph, inner });
                    built.push(engine.kind());
                }
                Err(e) => reasons.push(format!("{}: plan with knobs {knobs:?} failed to build: {e}", engine.kind().name())),
            }
        }
        if plans.is_empty() {
            let wanted = policy.engine.map_or("any engine".to_string(), |k| format!("engine {}", k.name()));
            return Err(Error::NotSupported(format!("graph \"{}\": no plan on {wanted}{}{}", g.name, if reasons.is_empty() { "" } else { ": " }, reasons.join("; "))));
        }
        Ok(plans)
    }

    /// The candidate plans of this handle's engines for a graph, best first in the order
    /// [`Handle::build_plans`] tries them, without compiling anything: each plan's description and
    /// behavior notes, as cuDNN's engine configurations are before any is finalized. Of `policy`,
    /// `engine` and `autotune` apply; the note filters do not (every candidate is listed with its
    /// notes). Engines that do not support the graph are left out; when none does, the error says
    /// why each declined. Build one with [`Handle::plan_from_desc`].
    pub fn candidates(&self, graph: &Graph, policy: &PlanPolicy) -> Result<Vec<(PlanDesc, BehaviorNotes)>> {
        let mut g = graph.clone();
        g.validate()?;
        let key = g.key();
        let mut reasons = Vec::new();
        let out: Vec<(PlanDesc, BehaviorNotes)> =
            self.candidate_plans(&g, policy, &mut reasons).into_iter().map(|(engine, knobs, notes)| (PlanDesc { engine: engine.kind(), knobs, graph_key: key }, notes)).collect();
        if out.is_empty() {
            let wanted = policy.engine.map_or("any engine".to_string(), |k| format!("engine {}", k.name()));
            return Err(Error::NotSupported(format!("graph \"{}\": no candidate plan on {wanted}{}{}", g.name, if reasons.is_empty() { "" } else { ": " }, reasons.join("; "))));
        }
        Ok(out)
    }

    /// Each engine's candidate knobs for validated graph `g`, best first, with their behavior
    /// notes (`policy`'s engine and autotune applied, not its note filters); each engine that does
    /// not support the graph adds why to `reasons`.
    fn candidate_plans(&self, g: &Graph, policy: &PlanPolicy, reasons: &mut Vec<String>) -> Vec<(&dyn Engine, Vec<Knob>, BehaviorNotes)> {
        let mut out = Vec::new();
        for engine in self.engines.iter().filter(|e| policy.engine.is_none_or(|k| k == e.kind())) {
            if let Err(e) = engine.supports(g) {
                reasons.push(format!("{}: {e}", engine.kind().name()));
                continue;
            }
            for mut knobs in engine.candidates(g) {
                if policy.autotune && engine.kind() == EngineKind::Cuda && !knobs.iter().any(|k| k.name == "fused" && k.value == 0) {
                    knobs.push(Knob { name: "autotune".into(), value: 1 });
                }
                let notes = engine.behavior(g, &knobs);
                out.push((engine.as_ref(), knobs, notes));
            }
        }
        out
    }

    /// The behavior notes a plan of `desc`'s engine and knobs would have for a validated graph,
    /// without compiling it (for a description the user composed rather than a candidate's).
    pub fn behavior(&self, graph: &Graph, desc: &PlanDesc) -> Result<BehaviorNotes> {
        let engine =
            self.engines.iter().find(|e| e.kind() == desc.engine).ok_or_else(|| Error::NotSupported(format!("engine {} is not available on this handle", desc.engine.name())))?;
        Ok(engine.behavior(graph, &desc.knobs))
    }

    /// Rebuild a plan from its serialized description, for the same graph.
    pub fn plan_from_desc(&self, graph: &Graph, desc: &PlanDesc) -> Result<Plan> {
        let mut g = graph.clone();
        g.validate()?;
        let key = g.key();
        if key != desc.graph_key {
            return Err(Error::InvalidArgument(format!("graph \"{}\": the plan was built for graph key {:#x} but this graph's key is {key:#x}", g.name, desc.graph_key)));
        }
        let engine =
            self.engines.iter().find(|e| e.kind() == desc.engine).ok_or_else(|| Error::NotSupported(format!("engine {} is not available on this handle", desc.engine.name())))?;
        engine.supports(&g)?;
        let g = Arc::new(g);
        let notes = engine.behavior(&g, &desc.knobs);
        let (graph, inner) = self.compiled(engine.as_ref(), &g, key, &desc.knobs)?;
        Ok(Plan { desc: desc.clone(), notes, graph, inner })
    }

    /// The plan of `plan`'s engine for its graph with `overrides` applied
    /// ([`Graph::with_overrides`], which says which shapes are refused): with `plan`'s knobs, or,
    /// when those do not build for the new shapes, the engine's first candidate that does. Taken
    /// from this handle's plan cache when the overridden graph (by key) was built before.
    pub fn plan_with_overrides(&self, plan: &Plan, overrides: &ShapeOverrides) -> Result<Plan> {
        let g = plan.graph.with_overrides(overrides)?;
        let key = g.key();
        let kind = plan.engine();
        let engine = self
            .engines
            .iter()
            .find(|e| e.kind() == kind)
            .ok_or_else(|| Error::NotSupported(format!("graph \"{}\": the plan runs on engine {}, which this handle lacks", g.name, kind.name())))?;
        engine.supports(&g).map_err(|e| Error::NotSupported(format!("graph \"{}\" with shape overrides: engine {} cannot run the overridden shapes: {e}", g.name, kind.name())))?;
        let g = Arc::new(g);
        let mut tries = vec![plan.desc.knobs.clone()];
        tries.extend(engine.candidates(&g).into_iter().filter(|k| *k != plan.desc.knobs));
        let mut failures = Vec::new();
        for knobs in tries {
            match self.compiled(engine.as_ref(), &g, key, &knobs) {
                Ok((graph, inner)) => {
                    let notes = engine.behavior(&graph, &knobs);
                    return Ok(Plan { desc: PlanDesc { engine: kind, knobs, graph_key: key }, notes, graph, inner });
                }
                Err(e) => failures.push(format!("knobs {knobs:?}: {e}")),
            }
        }
        Err(Error::NotSupported(format!("graph \"{}\" with shape overrides: no plan of engine {} builds for the overridden shapes: {}", g.name, kind.name(), failures.join("; "))))
    }

    /// The compiled plan of `engine` for a validated graph, from this handle's plan cache when
    /// the same graph (by key) was built before with the same knobs.
    fn compiled(&self, engine: &dyn Engine, g: &Arc<Graph>, key: u64, knobs: &[Knob]) -> Result<(Arc<Graph>, Arc<dyn CompiledPlan>)> {
        let cache_key = (key, engine.kind(), format!("{}{}", serde_json::to_string(knobs).unwrap_or_default(), engine.tuning_key()));
        if let Some(hit) = self.plans.lock().ok().and_then(|m| m.get(&cache_key).cloned()) {
            // Keys hash the whole computation; equal graphs also compare equal but for names.
            return Ok(hit);
        }
        let inner: Arc<dyn CompiledPlan> = Arc::from(engine.build(g.clone(), knobs)?);
        if let Ok(mut m) = self.plans.lock() {
            m.insert(cache_key, (g.clone(), inner.clone()));
        }
        Ok((g.clone(), inner))
    }

    /// Forget every cached plan (their kernels stay in the kernel cache).
    pub fn clear_plan_cache(&self) {
        if let Ok(mut m) = self.plans.lock() {
            m.clear();
        }
    }
}

impl Default for Handle {
    fn default() -> Self {
        Handle::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DataType, TensorDesc};

    fn relu_graph() -> Graph {
        let mut g = Graph::new("relu").io_data_type(DataType::F32);
        let x = g.tensor(TensorDesc::new("x", &[4], DataType::F32).with_uid(1));
        let y = g.relu(x);
        g.set_output(y);
        g.desc_mut(y).uid = Some(2);
        g.validate().unwrap();
        g
    }

    #[test]
    fn candidates_are_what_build_plans_builds() {
        let g = relu_graph();
        let h = Handle::cpu();
        let cands = h.candidates(&g, &PlanPolicy::default()).unwrap();
        let built = h.build_plans(&g, &PlanPolicy { all_candidates: true, ..Default::default() }).unwrap();
        assert_eq!(cands.len(), built.len());
        for ((desc, notes), plan) in cands.iter().zip(&built) {
            assert_eq!(desc, &plan.desc);
            assert_eq!(notes, &plan.notes);
            let rebuilt = h.plan_from_desc(&g, desc).unwrap();
            assert_eq!(rebuilt.desc, plan.desc);
        }
    }

    #[test]
    fn candidates_of_a_missing_engine_say_why() {
        let g = relu_graph();
        let err = Handle::cpu().candidates(&g, &PlanPolicy { engine: Some(EngineKind::Cuda), ..Default::default() }).unwrap_err();
        assert!(matches!(err, Error::NotSupported(ref m) if m.contains("relu") && m.contains("engine cuda")), "{err}");
    }
}
