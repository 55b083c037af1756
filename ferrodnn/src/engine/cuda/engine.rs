//! The CUDA engine: plans whose kernels are generated for the graph and compiled with NVRTC
//! when the plan is built; execution only binds pointers and enqueues launches on the handle's
//! stream (no allocation, no compilation, no host synchronization), so it can be captured in a
//! CUDA graph.

use super::kernel::{kernel_text, Arg, Grid, Launch, NodeKernels, Options, Signature, Source, TRef, Target, Tuning};
use super::planner::{self, has_atomic_sdpa_backward, has_f32_matmul, has_fp8_matmul};
use super::{compile_cached, CompileOptions, CudaDevice, DeviceBuffer, Function, KernelCache, Module, Stream};
use crate::dtype::DataType;
use crate::engine::{BehaviorNotes, Buffer, CompiledPlan, Engine, EngineKind, Knob, VariantPack};
use crate::error::{Error, Result};
use crate::graph::{Graph, TensorId};
use crate::layout::required_bytes;
use rayon::prelude::*;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, RwLock};

/// Alignment of each slice of the workspace (and of the constants buffer).
const SLICE_ALIGN: usize = 256;

/// The stream a handle's CUDA work goes to; shared by the engine and its plans so that
/// `Handle::set_stream` applies to plans built before it.
pub type SharedStream = Arc<RwLock<Arc<Stream>>>;

/// The CUDA engine, bound to one device and the handle's stream.
pub struct CudaEngine {
    device: Arc<CudaDevice>,
    stream: SharedStream,
}

impl CudaEngine {
    pub fn new(device: Arc<CudaDevice>, stream: SharedStream) -> CudaEngine {
        CudaEngine { device, stream }
    }

    /// The device this engine generates kernels for.
    pub fn target(&self) -> Target {
        let pdl = Tuning::get().pdl && super::module::has_launch_ex();
        Target::new(&self.device.arch(), self.device.sm_count()).with_pdl(pdl)
    }
}

/// Whether a plan's knobs ask for fusion and specialized kernels (the default).
pub(super) fn fused_knob(knobs: &[Knob]) -> bool {
    knobs.iter().find(|k| k.name == "fused").is_none_or(|k| k.value != 0)
}

/// The kernel-generation options a plan's knobs ask for. `tf32`, `fp8_fast_accum`, `atomics` and
/// `autotune` are off unless asked for, and only with fusion (the fallback computes in double);
/// `gemm_config` forces a GEMM tuning candidate. The process's tuning switches come along.
pub(super) fn options_of(knobs: &[Knob]) -> Options {
    let fused = fused_knob(knobs);
    let on = |name: &str| fused && knobs.iter().any(|k| k.name == name && k.value != 0);
    Options {
        tuning: Tuning::get().clone(),
        tf32: on("tf32"),
        fp8_fast_accum: on("fp8_fast_accum"),
        atomics: on("atomics"),
        autotune: on("autotune"),
        gemm_config: knobs.iter().find(|k| k.name == "gemm_config").and_then(|k| u8::try_from(k.value).ok()),
    }
}

/// The CUDA engine's candidate plans for a graph, best first: fused and specialized kernels,
/// then the plain per-node fallback. A graph with an f32 matmul gets a tf32 plan first (reduced
/// precision, as cuBLAS's and cuDNN's default tf32 math: `PlanPolicy::no_reduced_precision` skips
/// it for the exact 3xTF32 plan); one with an fp8 matmul, a plan first whose fp8 products
/// accumulate in the tensor cores' adder (reduced precision, cuBLASLt's fast accumulation; the
/// next plan converts fp8 to f16 and accumulates in f32). On Hopper, an attention backward gets
/// a plan first that accumulates dQ with float atomics (non-deterministic, as cuDNN's default:
/// `PlanPolicy::deterministic_only` skips it).
pub fn candidate_knobs(graph: &Graph, hopper: bool) -> Vec<Vec<Knob>> {
    let fused = |v| Knob { name: "fused".into(), value: v };
    let mut v = vec![vec![fused(1)], vec![fused(0)]];
    let mut reduced = Vec::new();
    if has_f32_matmul(graph) {
        reduced.push(Knob { name: "tf32".into(), value: 1 });
    }
    if has_fp8_matmul(graph) {
        reduced.push(Knob { name: "fp8_fast_accum".into(), value: 1 });
    }
    if !reduced.is_empty() {
        v.insert(0, std::iter::once(fused(1)).chain(reduced).collect());
    }
    if has_atomic_sdpa_backward(graph) && hopper {
        v.insert(0, vec![fused(1), Knob { name: "atomics".into(), value: 1 }]);
    }
    v
}

/// The by-value scalars whose values come with the variant pack (the graph gives none), by
/// tensor index.
pub(super) fn runtime_scalars(graph: &Graph) -> Vec<usize> {
    graph.tensors.iter().enumerate().filter(|(_, t)| t.is_pass_by_value && t.value.is_none() && !t.is_virtual).map(|(i, _)| i).collect()
}

/// The launches that write the runtime scalars into the plan's constants at the start of every
/// execute, 32 a launch (scalars.cuh): kernels that read by-value tensors through a pointer find
/// them there. The words follow each other from the first scalar's.
pub(super) fn scalar_launches(graph: &Graph) -> Vec<Launch> {
    let runtime = runtime_scalars(graph);
    runtime
        .chunks(32)
        .enumerate()
        .map(|(c, chunk)| {
            let mut sig = Signature::new();
            sig.param("unsigned long long* dst", Arg::Ptr(TensorId(chunk[0])));
            for (k, &t) in chunk.iter().enumerate() {
                sig.param(format!("unsigned long long w{k}"), Arg::ScalarWord(TensorId(t)));
            }
            let entry = format!("set_scalars_{c}");
            let words: Vec<String> = (0..chunk.len()).map(|k| format!("w{k}")).collect();
            let source =
                Source::new().entry(&entry, &sig).define("SCALAR_COUNT", chunk.len()).define("SCALAR_WORDS", words.join(", ")).template(include_str!("scalars.cuh")).build();
            Launch::new(source, entry, Grid::Exact(1, 1, 1), 32, sig.into_args())
        })
        .collect()
}

/// Every launch of a graph's CUDA plans (each candidate plan's, the unaligned alternatives too),
/// for `target`: for tests that compile them without a GPU, and for inspection.
pub fn plan_launches(graph: &Graph, target: &Target) -> Result<Vec<super::kernel::Launch>> {
    let mut g = graph.clone();
    g.validate()?;
    let plain = Options::default();
    let mut units = planner::units(&g, target, &plain, true)?;
    units.extend(planner::units(&g, target, &plain, false)?);
    // The reduced-precision plan's (see `candidates`).
    let (f32s, fp8s) = (has_f32_matmul(&g), has_fp8_matmul(&g));
    if f32s || fp8s {
        units.extend(planner::units(&g, target, &plain.clone().with_tf32(f32s).with_fp8_fast_accum(fp8s), true)?);
    }
    if has_atomic_sdpa_backward(&g) {
        units.extend(planner::units(&g, target, &plain.clone().with_atomics(true), true)?);
    }
    let units = units.into_iter().flat_map(|u| u.kernels.launches.into_iter().chain(u.unaligned.map(|a| a.kernels.launches).unwrap_or_default()));
    Ok(scalar_launches(&g).into_iter().chain(units).collect())
}

/// Every kernel text a graph's CUDA plans compile ([`plan_launches`]), with its entry name.
pub fn kernel_sources(graph: &Graph, target: &Target) -> Result<Vec<(String, String)>> {
    Ok(plan_launches(graph, target)?.into_iter().map(|l| (l.entry.clone(), kernel_text(&l, target).0)).collect())
}

impl CudaEngine {
    /// Tunes each GEMM problem of `graph` that has no tuning yet (`gemm::tune`). A problem that
    /// cannot be timed (its operands do not fit in the device's free memory, say) keeps the
    /// heuristic's configuration: tuning only ever changes speed.
    fn tune_gemms(&self, graph: &Graph, target: &Target, options: &Options) {
        for (p, descs) in super::gemm::tunable_problems(graph, target, options) {
            let key = super::gemm::tune::key(&p, target);
            if super::gemm::tune::TuneCache::global().get(&key).is_none() {
                let _ = self.tune_gemm(&p, descs, &key, target, options);
            }
        }
    }

    /// Times `p` in each of its candidate configurations (a plan of the matmul alone, with the
    /// same operand and output layouts and types, random inputs, built in parallel; two warm-up
    /// runs, then the mean of five between events) and keeps the fastest under `key`.
    fn tune_gemm(&self, p: &super::gemm::GemmProblem, [da, db, dc]: [crate::graph::TensorDesc; 3], key: &str, target: &Target, options: &Options) -> Result<()> {
        use super::gemm::{sm90, tune};
        let configs = sm90::tuning_configs(p, target);
        let mut g = Graph::new("gemm_tune");
        let named = |mut d: crate::graph::TensorDesc, name: &str, uid: i64| {
            d.name = name.into();
            d.uid = Some(uid);
            d.is_virtual = false;
            d
        };
        let a = g.tensor(named(da, "a", 1));
        let b = g.tensor(named(db, "b", 2));
        let c = g.matmul(a, b);
        g.set_output(c);
        {
            let d = g.desc_mut(c);
            d.name = "c".into();
            d.uid = Some(3);
            d.strides = dc.strides.clone();
            d.data_type = dc.data_type;
        }
        g.validate()?;
        let g = Arc::new(g);
        let knob = |name: &str, value: i64| Knob { name: name.into(), value };
        let plans: Vec<Box<dyn CompiledPlan>> = (0..configs.len())
            .into_par_iter()
            .map(|i| {
                let knobs = [knob("tf32", options.tf32 as i64), knob("fp8_fast_accum", options.fp8_fast_accum as i64), knob("gemm_config", i as i64)];
                self.build(g.clone(), &knobs)
            })
            .collect::<Result<_>>()?;
        // Inputs of random values (the tensor cores' power, and so their clock, depends on
        // them), the output, a workspace.
        let mut rng = crate::random::SplitMix64::new(0x7475_6e65);
        let mut buffers = Vec::new();
        for (uid, t) in [(1, a), (2, b), (3, c)] {
            let d = g.desc(t);
            let dt = g.resolved_data_type(t).unwrap_or(DataType::F32);
            let bytes = required_bytes(d, dt).max(1);
            let buf = if uid == 3 {
                self.device.alloc(bytes)?
            } else {
                let mut host = vec![0u8; bytes];
                for (i, v) in crate::random::random_values(bytes / dt.size(), dt, &mut rng).into_iter().enumerate() {
                    dt.write(&mut host, i, v);
                }
                self.device.upload(&host)?
            };
            buffers.push((uid, buf));
        }
        let ws_bytes = plans.iter().map(|p| p.workspace_size()).max().unwrap_or(0).max(1);
        let ws = self.device.alloc(ws_bytes)?;
        let stream = self.stream.read().map_err(|_| Error::Device("the handle's stream lock is poisoned".into()))?.clone();
        let (start, end) = (super::Event::new(&self.device)?, super::Event::new(&self.device)?);
        let mut best: Option<(f32, usize)> = None;
        for (i, plan) in plans.iter().enumerate() {
            let run = || -> Result<()> {
                let mut pack = VariantPack::new();
                for (uid, buf) in &buffers {
                    pack.device(*uid, buf.device_ptr(), buf.len());
                }
                plan.execute(&mut pack, Some(Buffer::Device { ptr: ws.device_ptr(), bytes: ws.len() }))
            };
            run()?;
            run()?;
            start.record(&stream)?;
            for _ in 0..5 {
                run()?;
            }
            end.record(&stream)?;
            end.synchronize()?;
            let ms = start.elapsed_ms(&end)? / 5.0;
            if best.is_none_or(|(b, _)| ms < b) {
                best = Some((ms, i));
            }
        }
        if let Some((_, i)) = best {
            tune::TuneCache::global().put(key, tune::Tuned::of(&configs[i]));
        }
        Ok(())
    }
}

impl Engine for CudaEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Cuda
    }

    fn tuning_key(&self) -> String {
        Tuning::get().key()
    }

    fn supports(&self, graph: &Graph) -> Result<()> {
        for (i, t) in graph.tensors.iter().enumerate() {
            let scalar = t.is_pass_by_value && !t.is_virtual;
            if scalar && t.value.is_none() && graph.desc(TensorId(i)).element_count() != 1 {
                return Err(Error::NotSupported(format!("tensor \"{}\": a by-value tensor is one scalar, but its dims are {:?}", t.name, t.dims)));
            }
        }
        planner::fallback_units(graph).map(|_| ())
    }

    fn candidates(&self, graph: &Graph) -> Vec<Vec<Knob>> {
        candidate_knobs(graph, self.target().hopper())
    }

    fn behavior(&self, _graph: &Graph, knobs: &[Knob]) -> BehaviorNotes {
        // No atomics unless the `atomics` knob asks for them (split-k partial sums are added in
        // order): same inputs, same bits. The fallback computes in double; f32 matmuls run as
        // 3xTF32 unless the `tf32` knob asks for one tf32 pass, fp8 matmuls in f32 unless the
        // `fp8_fast_accum` knob asks for the tensor cores' adder.
        let o = options_of(knobs);
        BehaviorNotes { runtime_compiled: true, deterministic: !o.atomics, reduced_precision: o.tf32 || o.fp8_fast_accum }
    }

    fn build(&self, graph: Arc<Graph>, knobs: &[Knob]) -> Result<Box<dyn CompiledPlan>> {
        let g = &*graph;
        let target = self.target();
        let options = options_of(knobs);
        if options.autotune {
            self.tune_gemms(g, &target, &options);
        }
        let units = planner::units(g, &target, &options, fused_knob(knobs))?;
        let opts = CompileOptions::new(target.arch.clone());
        let cache = KernelCache::global();

        // Every launch of every unit (and of its unaligned alternative), compiled in parallel
        // (NVRTC is thread-safe), each as its own module.
        let lists: Vec<&NodeKernels> = units.iter().flat_map(|u| std::iter::once(&u.kernels).chain(u.unaligned.as_ref().map(|a| &a.kernels))).collect();
        let launches: Vec<&Launch> = lists.iter().flat_map(|k| k.launches.iter()).collect();
        let texts: Vec<(String, bool)> = launches.iter().map(|l| kernel_text(l, &target)).collect();
        let cubins: Vec<Arc<Vec<u8>>> = launches.par_iter().zip(&texts).map(|(l, (text, _))| compile_cached(cache, text, &l.entry, &opts)).collect::<Result<_>>()?;
        let mut cubins = cubins.into_iter().zip(texts.iter().map(|t| t.1));

        // Workspace: a slice per produced virtual tensor, then each kernel list's scratch buffers.
        let mut workspace = 0usize;
        let mut take = |bytes: usize| {
            let at = workspace;
            workspace += bytes.div_ceil(SLICE_ALIGN).max(1) * SLICE_ALIGN;
            at
        };
        let mut virtual_at: HashMap<usize, usize> = HashMap::new();
        for u in &units {
            for &t in &u.writes {
                let d = g.desc(t);
                if d.is_virtual {
                    let dt = g.resolved_data_type(t).unwrap_or(DataType::F32);
                    virtual_at.insert(t.0, take(required_bytes(d, dt)));
                }
            }
        }

        // Constants: by-value scalars that carry their value, in their own type, uploaded once.
        let mut const_bytes = Vec::new();
        let mut const_at = HashMap::new();
        for (i, t) in g.tensors.iter().enumerate() {
            if let (true, Some(v)) = (t.is_pass_by_value, t.value) {
                let dt = g.resolved_data_type(TensorId(i)).unwrap_or(DataType::F32);
                const_at.insert(i, const_bytes.len());
                const_bytes.extend(dt.encode(&[v]));
                const_bytes.resize(const_bytes.len().div_ceil(SLICE_ALIGN) * SLICE_ALIGN, 0);
            }
        }
        // By-value scalars whose values come with the variant pack: one 8-byte word each, after
        // the constants, written by a kernel of their own at the start of every execute (see
        // scalars.cuh) for the kernels that read them through a pointer; kernels that take them as
        // arguments get the values directly.
        for i in runtime_scalars(g) {
            const_at.insert(i, const_bytes.len());
            const_bytes.extend([0u8; 8]);
        }
        let constants = if const_bytes.is_empty() { None } else { Some(self.device.upload(&const_bytes)?) };
        let mut scalar_steps = Vec::new();
        for launch in scalar_launches(g) {
            let (text, dependent) = kernel_text(&launch, &target);
            let cubin = compile_cached(cache, &text, &launch.entry, &opts)?;
            let function = Module::load(&self.device, &cubin)?.function(&launch.entry)?;
            scalar_steps.push(Step {
                function,
                grid: (1, 1, 1),
                block: (launch.block, 1, 1),
                cluster: None,
                dependent,
                shared_bytes: 0,
                args: launch.args,
                scratch_at: Vec::new(),
                maps: Default::default(),
            });
        }

        let max_grid = self.device.sm_count().max(1) as u64 * 32;
        let mut steps_of = |kernels: &NodeKernels| -> Result<Vec<Step>> {
            let scratch_at: Vec<usize> = kernels.scratch.iter().map(|&b| take(b)).collect();
            let mut steps = Vec::with_capacity(kernels.launches.len());
            for l in &kernels.launches {
                let (cubin, dependent) = cubins.next().ok_or_else(|| Error::Device("internal: a launch was not compiled".into()))?;
                let module = Module::load(&self.device, &cubin)?;
                let function = module.function(&l.entry)?;
                if l.shared_bytes > 48 * 1024 {
                    function.set_max_dynamic_shared_memory(l.shared_bytes)?;
                }
                let mut grid = match l.grid {
                    Grid::Exact(x, y, z) => (x, y, z),
                    Grid::Cover(threads) => (threads.div_ceil(l.block.max(1) as u64).clamp(1, max_grid) as u32, 1, 1),
                };
                // Cluster launches are persistent (they stride over their work by the grid): run
                // no more clusters than fit on the device at once, so none waits for a second
                // wave.
                if let Some(cluster) = l.cluster {
                    if let Some(fit) = function.max_active_clusters((l.block, 1, 1), cluster, l.shared_bytes) {
                        grid.0 = grid.0.min(fit * cluster.0).max(cluster.0);
                    }
                }
                steps.push(Step {
                    function,
                    grid,
                    block: (l.block, 1, 1),
                    cluster: l.cluster,
                    dependent,
                    shared_bytes: l.shared_bytes,
                    args: l.args.clone(),
                    scratch_at: scratch_at.clone(),
                    maps: Default::default(),
                });
            }
            Ok(steps)
        };
        let mut plan_units = Vec::with_capacity(units.len());
        for u in &units {
            let primary = steps_of(&u.kernels)?;
            let unaligned = match &u.unaligned {
                Some(a) => Some((a.tensors.clone(), steps_of(&a.kernels)?)),
                None => None,
            };
            plan_units.push(UnitSteps { primary, unaligned });
        }
        let refs = g.tensors.iter().enumerate().map(|(i, _)| TRef::of(g, TensorId(i))).collect();
        Ok(Box::new(CudaPlan {
            graph: graph.clone(),
            device: self.device.clone(),
            stream: self.stream.clone(),
            scalar_steps,
            units: plan_units,
            refs,
            virtual_at,
            const_at,
            constants,
            workspace,
            device_pointers: Default::default(),
        }))
    }
}

/// Launches still to go before the injected fault ([`inject_launch_failure`]); 0: none armed.
static INJECTED_FAULT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Fault injection, for reliability checks: the `nth` CUDA-plan launch from now on (1 = the next
/// one, in any plan of the process) is made so that the driver rejects it (see
/// `Function::launch_rejected`): that `execute` fails as it would on a real launch failure.
/// 0 disarms. Not for production use.
#[doc(hidden)]
pub fn inject_launch_failure(nth: u64) {
    INJECTED_FAULT.store(nth, std::sync::atomic::Ordering::SeqCst);
}

/// Whether this launch is the injected fault (counting one launch down when armed).
fn take_injected_fault() -> bool {
    use std::sync::atomic::Ordering;
    if INJECTED_FAULT.load(Ordering::Relaxed) == 0 {
        return false;
    }
    INJECTED_FAULT.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok_and(|n| n == 1)
}

/// A unit's launches, and the ones to run instead when a tensor that needs 16-byte alignment
/// does not have it.
struct UnitSteps {
    primary: Vec<Step>,
    unaligned: Option<(Vec<TensorId>, Vec<Step>)>,
}

struct Step {
    function: Function,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    cluster: Option<(u32, u32, u32)>,
    /// Launched as a programmatic dependent of the previous kernel (its source waits first).
    dependent: bool,
    shared_bytes: u32,
    args: Vec<Arg>,
    scratch_at: Vec<usize>,
    /// The tensor maps last encoded for this launch, one per map argument in order, with the
    /// address each was encoded for: a map depends only on the launch (dims, strides, box, fixed
    /// when the plan is built) and the address, and encoding one costs the host about as much as
    /// the launch itself; a caller that reuses its buffers reuses the maps.
    maps: std::sync::Mutex<Vec<(u64, cudarc::driver::sys::CUtensorMap)>>,
}

struct CudaPlan {
    graph: Arc<Graph>,
    device: Arc<CudaDevice>,
    stream: SharedStream,
    /// The launches that write the variant pack's by-value scalars where kernels read them.
    scalar_steps: Vec<Step>,
    units: Vec<UnitSteps>,
    refs: Vec<TRef>,
    virtual_at: HashMap<usize, usize>,
    const_at: HashMap<usize, usize>,
    constants: Option<DeviceBuffer>,
    workspace: usize,
    /// Buffer addresses already confirmed to be device memory of this device. Asking the driver
    /// (cuPointerGetAttribute) costs about a microsecond per buffer, on every execute; a buffer
    /// a caller reuses is asked about once. (An address freed and then reused by host memory is
    /// a use-after-free on the caller's side, as with any CUDA library.)
    device_pointers: std::sync::Mutex<std::collections::HashSet<u64>>,
}

impl CompiledPlan for CudaPlan {
    fn workspace_size(&self) -> usize {
        self.workspace
    }

    fn execute(&self, pack: &mut VariantPack, workspace: Option<Buffer>) -> Result<()> {
        let g = &*self.graph;
        let ws_ptr = match (&workspace, self.workspace) {
            (_, 0) => 0,
            (Some(Buffer::Device { bytes, .. }), need) if *bytes < need => {
                return Err(Error::InvalidArgument(format!("graph \"{}\": the plan needs a workspace of {need} bytes but the device workspace given has {bytes}", g.name)))
            }
            (Some(Buffer::Device { ptr, .. }), _) if *ptr != 0 => *ptr,
            (Some(Buffer::Device { .. }), _) => return Err(Error::InvalidArgument(format!("graph \"{}\": the workspace's device pointer is null", g.name))),
            (Some(_), _) => return Err(Error::InvalidArgument(format!("graph \"{}\": the CUDA plan's workspace must be device memory", g.name))),
            (None, _) => return Err(Error::InvalidArgument(format!("graph \"{}\": the plan needs a workspace of {} bytes", g.name, self.workspace))),
        };
        // Scratch buffers sit at 256-byte multiples from the workspace's start, and kernels read
        // some of them through 16-byte loads and TMA tensor maps.
        if ws_ptr % 16 != 0 {
            return Err(Error::InvalidArgument(format!("graph \"{}\": the workspace pointer {ws_ptr:#x} must be 16-byte aligned (its address mod 16 is {})", g.name, ws_ptr % 16)));
        }
        if ws_ptr != 0 {
            if let Some(what) = self.not_device_memory(ws_ptr) {
                return Err(Error::InvalidArgument(format!("graph \"{}\": the workspace pointer {ws_ptr:#x} is {what}", g.name)));
            }
        }
        let ptrs = self.resolve_pointers(pack, ws_ptr)?;
        let scalars = self.scalar_values(pack)?;
        let stream = self.stream.read().map_err(|_| Error::Device("the handle's stream lock is poisoned".into()))?.clone();
        // A launch the driver refuses ends the execute with its error, naming the graph and the
        // kernel; the launches before it stay enqueued (their outputs are then undefined, as
        // after any failed execute), nothing was allocated, and the plan and handle stay usable.
        let failed = |e: Error| match e {
            Error::Device(m) => Error::Device(format!("graph \"{}\": {m}", g.name)),
            Error::InvalidArgument(m) => Error::InvalidArgument(format!("graph \"{}\": {m}", g.name)),
            e => e,
        };
        for step in &self.scalar_steps {
            self.launch(step, &ptrs, &scalars, ws_ptr, &stream).map_err(failed)?;
        }
        for unit in &self.units {
            let steps = match &unit.unaligned {
                Some((tensors, alt)) if tensors.iter().any(|t| ptrs[t.0] % 16 != 0) => alt,
                _ => &unit.primary,
            };
            for step in steps {
                self.launch(step, &ptrs, &scalars, ws_ptr, &stream).map_err(failed)?;
            }
        }
        Ok(())
    }
}

impl CudaPlan {
    fn launch(&self, step: &Step, ptrs: &[u64], scalars: &[Option<f64>], ws_ptr: u64, stream: &Stream) -> Result<()> {
        // Argument values live in these vectors until the launch returns; `params` points at
        // them. Capacities are reserved up front so the pointers stay put.
        // (Each vector allocates only when the launch has arguments of its kind.)
        let n = step.args.len();
        let count = |f: fn(&Arg) -> bool| step.args.iter().filter(|a| f(a)).count();
        let mut words: Vec<u64> = Vec::with_capacity(count(|a| matches!(a, Arg::Ptr(_) | Arg::Scratch(_) | Arg::I64(_) | Arg::ScalarWord(_))));
        let mut refs: Vec<TRef> = Vec::with_capacity(count(|a| matches!(a, Arg::Ref(_))));
        let mut floats: Vec<f64> = Vec::with_capacity(count(|a| matches!(a, Arg::F64(_) | Arg::Scalar { .. })));
        let mut singles: Vec<f32> = Vec::with_capacity(count(|a| matches!(a, Arg::F32(_) | Arg::Scalar { .. })));
        let n_maps = count(|a| matches!(a, Arg::TensorMap(_) | Arg::ScratchTensorMap(..)));
        let mut maps: Vec<cudarc::driver::sys::CUtensorMap> = Vec::with_capacity(n_maps);
        let mut params: Vec<*mut c_void> = Vec::with_capacity(n);
        // The maps encoded last time (another thread running this plan at the same moment holds
        // them: this launch then encodes its own).
        let mut cached = if n_maps > 0 { step.maps.try_lock().ok() } else { None };
        if let Some(c) = cached.as_mut() {
            if c.len() != n_maps {
                c.clear();
            }
        }
        let mut map_of = |i: usize, desc: &crate::engine::cuda::tma::TmaDesc, ptr: u64| -> Result<cudarc::driver::sys::CUtensorMap> {
            if let Some(c) = cached.as_mut() {
                if let Some((at, m)) = c.get(i) {
                    if *at == ptr {
                        return Ok(*m);
                    }
                }
                let m = desc.encode(ptr)?;
                if i < c.len() {
                    c[i] = (ptr, m);
                } else if i == c.len() {
                    c.push((ptr, m));
                }
                return Ok(m);
            }
            desc.encode(ptr)
        };
        for arg in &step.args {
            match arg {
                Arg::Ptr(t) => {
                    words.push(ptrs[t.0]);
                    params.push(words.last_mut().map_or(std::ptr::null_mut(), |w| w as *mut u64 as *mut c_void));
                }
                Arg::Scratch(i) => {
                    let at = step.scratch_at.get(*i).copied().ok_or_else(|| Error::Device(format!("internal: scratch buffer {i} was not laid out")))?;
                    words.push(ws_ptr + at as u64);
                    params.push(words.last_mut().map_or(std::ptr::null_mut(), |w| w as *mut u64 as *mut c_void));
                }
                Arg::I64(v) => {
                    words.push(*v as u64);
                    params.push(words.last_mut().map_or(std::ptr::null_mut(), |w| w as *mut u64 as *mut c_void));
                }
                Arg::Ref(t) => {
                    refs.push(self.refs[t.0]);
                    params.push(refs.last_mut().map_or(std::ptr::null_mut(), |r| r as *mut TRef as *mut c_void));
                }
                Arg::F64(v) => {
                    floats.push(*v);
                    params.push(floats.last_mut().map_or(std::ptr::null_mut(), |f| f as *mut f64 as *mut c_void));
                }
                Arg::ScalarWord(tensor) => {
                    let v = self.graph.desc(*tensor).value.or(scalars[tensor.0]).ok_or_else(|| Error::Device("internal: a by-value scalar was not resolved".into()))?;
                    let dt = self.graph.resolved_data_type(*tensor).unwrap_or(DataType::F32);
                    let mut word = [0u8; 8];
                    let bytes = dt.encode(&[v]);
                    word[..bytes.len()].copy_from_slice(&bytes);
                    words.push(u64::from_le_bytes(word));
                    params.push(words.last_mut().map_or(std::ptr::null_mut(), |w| w as *mut u64 as *mut c_void));
                }
                Arg::F32(v) => {
                    singles.push(*v);
                    params.push(singles.last_mut().map_or(std::ptr::null_mut(), |f| f as *mut f32 as *mut c_void));
                }
                Arg::Scalar { tensor, double, times } => {
                    let d = self.graph.desc(*tensor);
                    let v = d.value.or(scalars[tensor.0]).ok_or_else(|| Error::Device("internal: a by-value scalar was not resolved".into()))?;
                    // Rounded to the tensor's type, as the CPU engine reads it.
                    let v = self.graph.resolved_data_type(*tensor).unwrap_or(DataType::F32).quantize(v) * times;
                    if *double {
                        floats.push(v);
                        params.push(floats.last_mut().map_or(std::ptr::null_mut(), |f| f as *mut f64 as *mut c_void));
                    } else {
                        singles.push(v as f32);
                        params.push(singles.last_mut().map_or(std::ptr::null_mut(), |f| f as *mut f32 as *mut c_void));
                    }
                }
                Arg::TensorMap(desc) => {
                    let m = map_of(maps.len(), desc, ptrs[desc.tensor.0])?;
                    maps.push(m);
                    params.push(maps.last_mut().map_or(std::ptr::null_mut(), |m| m as *mut cudarc::driver::sys::CUtensorMap as *mut c_void));
                }
                Arg::ScratchTensorMap(i, desc) => {
                    let at = step.scratch_at.get(*i).copied().ok_or_else(|| Error::Device(format!("internal: scratch buffer {i} was not laid out")))?;
                    let m = map_of(maps.len(), desc, ws_ptr + at as u64)?;
                    maps.push(m);
                    params.push(maps.last_mut().map_or(std::ptr::null_mut(), |m| m as *mut cudarc::driver::sys::CUtensorMap as *mut c_void));
                }
            }
        }
        // SAFETY: the kernel was generated with exactly these parameters in this order (the
        // generators build source and args together); each params entry points at a value of
        // the parameter's C type (a tensor map is the 128-byte, 64-byte aligned CUtensorMap the
        // kernel declares as TmaMap) that lives until the call returns (the vectors do not
        // reallocate: their capacity was reserved). Every pointer argument is device memory
        // checked in resolve_pointers to hold the tensor's whole extent, or a slice of a
        // workspace checked to be large enough; a tensor map spans only its tensor's extent (or its scratch buffer's).
        if take_injected_fault() {
            // SAFETY: as below; the driver rejects the launch (see launch_rejected), so the
            // kernel never runs.
            return unsafe { step.function.launch_rejected(stream, step.grid, step.block, &mut params) };
        }
        unsafe {
            if step.cluster.is_some() || step.dependent {
                step.function.launch_ex(stream, step.grid, step.block, step.cluster, step.dependent, step.shared_bytes, &mut params)
            } else {
                step.function.launch(stream, step.grid, step.block, step.shared_bytes, &mut params)
            }
        }
    }

    /// None when `ptr` is memory this plan's kernels may use (device memory of the plan's
    /// device, or managed memory); else what it is, for the error.
    fn not_device_memory(&self, ptr: u64) -> Option<String> {
        if self.device_pointers.lock().is_ok_and(|set| set.contains(&ptr)) {
            return None;
        }
        let at = self.device.pointer_location(ptr);
        let ok = matches!(at, super::PointerLocation::ThisDevice | super::PointerLocation::Managed);
        if !ok {
            return Some(format!("{} ({})", at.describe(self.device.ordinal()), self.device.name()));
        }
        if let Ok(mut set) = self.device_pointers.lock() {
            if set.len() >= 4096 {
                set.clear();
            }
            set.insert(ptr);
        }
        None
    }

    /// The value of every by-value scalar the variant pack gives (by tensor index; None for the
    /// others): a host buffer of one element of the tensor's type, as cuDNN takes them.
    fn scalar_values(&self, pack: &VariantPack) -> Result<Vec<Option<f64>>> {
        let g = &*self.graph;
        let mut values = vec![None; g.tensors.len()];
        for (i, d) in g.tensors.iter().enumerate() {
            if !d.is_pass_by_value || d.value.is_some() || d.is_virtual {
                continue;
            }
            let uid = d.uid.unwrap_or_default();
            let dt = g.resolved_data_type(TensorId(i)).unwrap_or(DataType::F32);
            let bytes: &[u8] = match pack.buffers.get(&uid) {
                Some(Buffer::Host(b)) => b,
                Some(Buffer::HostMut(b)) => b,
                Some(Buffer::Device { .. }) => {
                    return Err(Error::InvalidArgument(format!("tensor \"{}\" (uid {uid}): a by-value scalar is read from host memory, but a device pointer was given", d.name)))
                }
                None => return Err(Error::InvalidArgument(format!("graph \"{}\": by-value tensor \"{}\" (uid {uid}) has no value in the variant pack", g.name, d.name))),
            };
            if bytes.len() < dt.size() {
                return Err(Error::InvalidArgument(format!(
                    "tensor \"{}\" (uid {uid}): the by-value scalar's buffer has {} bytes, but one {dt} needs {}",
                    d.name,
                    bytes.len(),
                    dt.size()
                )));
            }
            values[i] = Some(dt.read(bytes, 0));
        }
        Ok(values)
    }

    /// Device pointer of every tensor a kernel may touch, checked: variant-pack buffers are
    /// device memory of this device, large enough, aligned to their type and non-null.
    fn resolve_pointers(&self, pack: &VariantPack, ws_ptr: u64) -> Result<Vec<u64>> {
        let g = &*self.graph;
        let mut ptrs = vec![0u64; g.tensors.len()];
        // Pack entries that name a tensor of the graph (each uid is one tensor's).
        let mut matched = 0;
        for id in g.io_tensors() {
            let d = g.desc(id);
            let uid = d.uid.unwrap_or_default();
            matched += usize::from(pack.buffers.contains_key(&uid));
            if d.is_pass_by_value {
                // A host scalar (see `scalar_values`); kernels read it from the plan's constants.
                continue;
            }
            let dt = g.resolved_data_type(id).unwrap_or(DataType::F32);
            let need = required_bytes(d, dt);
            let (ptr, bytes) = match pack.buffers.get(&uid) {
                Some(Buffer::Device { ptr, bytes }) => (*ptr, *bytes),
                Some(_) => return Err(Error::InvalidArgument(format!("tensor \"{}\" (uid {uid}): the CUDA engine needs device buffers, but a host buffer was given", d.name))),
                None => return Err(Error::InvalidArgument(format!("graph \"{}\": tensor \"{}\" (uid {uid}) has no buffer in the variant pack", g.name, d.name))),
            };
            if ptr == 0 {
                return Err(Error::InvalidArgument(format!("tensor \"{}\" (uid {uid}): the device pointer is null", d.name)));
            }
            if ptr % dt.size() as u64 != 0 {
                return Err(Error::InvalidArgument(format!("tensor \"{}\" (uid {uid}): device pointer {ptr:#x} is not aligned to {} bytes for {dt}", d.name, dt.size())));
            }
            // A ragged tensor's size depends on its offsets, which are device memory: the kernels
            // trust them, as cuDNN does (the CPU engines check them).
            if bytes < need && d.ragged_offset.is_none() {
                return Err(Error::InvalidArgument(format!(
                    "tensor \"{}\" (uid {uid}): buffer is {bytes} bytes but dims {:?} with strides {:?} of {dt} need {need}",
                    d.name, d.dims, d.strides
                )));
            }
            if let Some(what) = self.not_device_memory(ptr) {
                return Err(Error::InvalidArgument(format!("tensor \"{}\" (uid {uid}): {ptr:#x} is {what}", d.name)));
            }
            ptrs[id.0] = ptr;
        }
        if matched < pack.buffers.len() {
            let known: std::collections::HashSet<i64> = g.io_tensors().iter().map(|&id| g.desc(id).uid.unwrap_or_default()).collect();
            if let Some(uid) = pack.buffers.keys().find(|uid| !known.contains(uid)) {
                return Err(Error::InvalidArgument(format!("graph \"{}\": the variant pack has uid {uid}, which no non-virtual tensor of the graph has", g.name)));
            }
        }
        for (&t, &at) in &self.virtual_at {
            ptrs[t] = ws_ptr + at as u64;
        }
        if let Some(c) = &self.constants {
            for (&t, &at) in &self.const_at {
                ptrs[t] = c.device_ptr() + at as u64;
            }
        }
        Ok(ptrs)
    }
}

#[cfg(test)]
mod tests {
    use super::{inject_launch_failure, kernel_sources, plan_launches, take_injected_fault, Target};

    /// An armed fault fires on exactly the nth launch, once; disarmed, never.
    #[test]
    fn injected_fault_fires_once_on_the_nth_launch() {
        assert!(!take_injected_fault());
        inject_launch_failure(3);
        let fired: Vec<bool> = (0..6).map(|_| take_injected_fault()).collect();
        assert_eq!(fired, [false, false, true, false, false, false]);
        inject_launch_failure(1);
        inject_launch_failure(0);
        assert!(!take_injected_fault());
    }
    use crate::engine::cuda::kernel::{kernel_text, Pdl};

    /// Every kernel of every check case is launched as a programmatic dependent on sm_90a unless
    /// its launch says independent (without the early trigger when it says wait-only), and as
    /// an ordinary launch on sm_80 or with dependent launches turned off; a dependent's text calls
    /// `pdl_site()`. (That it waits once, before any global access, is checked in its PTX by the
    /// codegen test.)
    #[test]
    fn every_hopper_kernel_waits_for_its_predecessor() {
        for case in crate::testing::cases::all() {
            for target in [Target::sm90a(), Target::sm90a().with_pdl(false), Target::sm80().with_pdl(true)] {
                let Ok(list) = plan_launches(&case.graph, &target) else { continue };
                for l in list {
                    let (text, dependent) = kernel_text(&l, &target);
                    let what = format!("{} {} ({})", case.name, l.entry, target.arch);
                    let want = target.hopper() && target.pdl && l.pdl != Pdl::Independent;
                    assert_eq!(dependent, want, "{what}");
                    let mode = match (want, l.pdl) {
                        (false, _) => 0,
                        (true, Pdl::WaitOnly) => 2,
                        (true, _) => 1,
                    };
                    assert!(text.starts_with(&format!("#define FDNN_PDL {mode}\n")), "{what}");
                    assert!(!want || text.contains("pdl_site();"), "{what}");
                }
            }
        }
    }

    /// Warp-specialized kernels move registers from the producer warpgroup to the consumers with
    /// `setmaxnreg`; the consumers' `inc` only takes what the producer's `dec` gave back from the
    /// CTA's launch allocation (at most 65536 / threads per thread, in steps of 8), so asking for
    /// more blocks forever (the persistent attention forward, as first written, hung exactly so).
    #[test]
    fn setmaxnreg_never_asks_for_more_than_the_launch_allocation() {
        let value =
            |src: &str, what: &str| -> Vec<u32> { src.match_indices(what).map(|(at, _)| src[at + what.len()..].split(';').next().unwrap().trim().parse().unwrap()).collect() };
        let mut seen = 0;
        for case in crate::testing::cases::all() {
            for target in [Target::sm90a()] {
                let Ok(list) = kernel_sources(&case.graph, &target) else { continue };
                for (entry, src) in list {
                    let (dec, inc) = (value(&src, "setmaxnreg.dec.sync.aligned.u32"), value(&src, "setmaxnreg.inc.sync.aligned.u32"));
                    // (An implicit GEMM's producers gather and keep the launch's registers: its
                    // template's setmaxnreg lines are compiled out.)
                    if (dec.is_empty() && inc.is_empty()) || src.contains("#define GEMM_GATHER 1\n") {
                        continue;
                    }
                    assert!(dec.len() == 1 && inc.len() == 1, "{} {entry}: one dec and one inc expected, got {dec:?} {inc:?}", case.name);
                    // The launch bounds: a number, or a define of one.
                    let bound = src.split("__launch_bounds__(").nth(1).and_then(|s| s.split(',').next()).map(str::trim).expect("launch bounds");
                    let threads: u32 = bound
                        .parse()
                        .ok()
                        .or_else(|| src.split(&format!("#define {bound} ")).nth(1).and_then(|s| s.lines().next()).and_then(|s| s.trim().parse().ok()))
                        .expect("launch bounds");
                    let per_thread = ((65536 / threads) & !7).min(255);
                    assert!(
                        128 * dec[0] + (threads - 128) * inc[0] <= per_thread * threads,
                        "{} {entry}: 128 x {} + {} x {} registers exceed the launch allocation {} x {threads}",
                        case.name,
                        dec[0],
                        threads - 128,
                        inc[0],
                        per_thread
                    );
                    seen += 1;
                }
            }
        }
        assert!(seen > 0, "no warp-specialized kernel among the cases");
    }
}
