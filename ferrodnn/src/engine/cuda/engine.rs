//! The CUDA engine: plans whose kernels are generated for the graph and compiled with NVRTC
//! when the plan is built; execution only binds pointers and enqueues launches on the handle's
//! stream (no allocation, no compilation, no host synchronization), so it can be captured in a
//! CUDA graph.

use super::fallback::{self, Arg, NodeKernels, TRef, PRELUDE};
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

    /// The kernel units of a validated graph: with `fused`, memory-bound chains are fused and
    /// specialized kernels (GEMM, attention, rows, spatial) replace the fallback's where they
    /// apply on `target`.
    fn units(graph: &Graph, target: &Target, fused: bool) -> Result<Vec<Unit>> {
        if fused {
            super::fused::units(graph, target)
        } else {
            fallback_units(graph)
        }
    }

    /// The device this engine generates kernels for.
    pub fn target(&self) -> Target {
        let pdl = !std::env::var("FERRODNN_PDL").is_ok_and(|v| v == "0") && super::module::has_launch_ex();
        let mut t = Target::new(&self.device.arch(), self.device.sm_count()).with_pdl(pdl);
        t.experimental = experimental_from_env();
        t
    }
}

/// Whether `FERRODNN_EXPERIMENTAL=1` asks for the kernels that compile and are generated for the
/// check cases, but have not yet passed the GPU check on a device (see [`Target::experimental`]).
pub fn experimental_from_env() -> bool {
    std::env::var("FERRODNN_EXPERIMENTAL").is_ok_and(|v| v == "1")
}

/// What kernel generation may assume about the device: the NVRTC architecture (`sm_80`,
/// `sm_90a`, ...) and the number of SMs (for one-wave and persistent grids). A kernel source is
/// a pure function of the graph and the target.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    pub arch: String,
    pub sm_count: u32,
    /// Also generate the kernels that are written and compile but have not yet passed the GPU
    /// check against the CPU engine on a device (off by default; `FERRODNN_EXPERIMENTAL=1` turns
    /// it on for the engine). A kernel leaves this set once a GPU run has checked it.
    pub experimental: bool,
    /// The plan lets f32 matmuls run as tf32 (one tensor-core pass on inputs rounded to a
    /// 10-bit mantissa) instead of 3xTF32 (about f32 accuracy): the `tf32` knob, which makes
    /// the plan's behavior notes say reduced precision.
    pub allow_tf32: bool,
    /// The plan lets fp8 matmuls accumulate in the tensor cores' own adder (Hopper's fp8 `wgmma`,
    /// twice the 16-bit rate, whose sums keep fewer bits than f32: cuBLASLt's "fast
    /// accumulation") instead of converting to f16 and accumulating in f32: the `fp8_fast_accum`
    /// knob, which makes the plan's behavior notes say reduced precision.
    pub allow_fp8_fast_accum: bool,
    /// The plan may accumulate with float atomics, whose order varies from run to run: the
    /// `atomics` knob (attention backward's dQ in one pass over K/V), which makes the plan's
    /// behavior notes say non-deterministic.
    pub allow_atomics: bool,
    /// Programmatic dependent launch (sm_90 or newer): every kernel waits for the kernels before
    /// it in the stream at its start (`griddepcontrol.wait`, before any memory access) and then
    /// lets the next one launch (`griddepcontrol.launch_dependents`), and the plan launches it
    /// with programmatic stream serialization, so that a kernel's launch and the scheduling of
    /// its blocks overlap its predecessor's last wave instead of following it. On by default
    /// where the device has it; `FERRODNN_PDL=0` turns it off for the engine.
    pub pdl: bool,
    /// Autotuned GEMM configurations: each Hopper GEMM runs in the configuration its tuning kept
    /// (`gemm::tune`), where there is one; the `autotune` knob.
    pub autotune: bool,
    /// Every Hopper GEMM runs in tuning candidate `i` of its problem (`sm90::tuning_configs`;
    /// the heuristic's where there is no such candidate): the `gemm_config` knob of the plans an
    /// autotuning times.
    pub gemm_config: Option<u8>,
}

impl Target {
    pub fn new(arch: &str, sm_count: u32) -> Target {
        let mut t = Target {
            arch: arch.to_string(),
            sm_count,
            experimental: false,
            allow_tf32: false,
            allow_fp8_fast_accum: false,
            allow_atomics: false,
            pdl: false,
            autotune: false,
            gemm_config: None,
        };
        t.pdl = t.cc() >= 90;
        t
    }
    /// This target with programmatic dependent launch on or off (off below sm_90).
    pub fn with_pdl(mut self, on: bool) -> Target {
        self.pdl = on && self.cc() >= 90;
        self
    }
    /// This target with the experimental kernels on.
    pub fn with_experimental(mut self) -> Target {
        self.experimental = true;
        self
    }
    /// This target with f32 matmuls allowed (or not) to run as tf32.
    pub fn with_tf32(mut self, allow: bool) -> Target {
        self.allow_tf32 = allow;
        self
    }
    /// This target with fp8 matmuls allowed (or not) to accumulate in the tensor cores' adder.
    pub fn with_fp8_fast_accum(mut self, allow: bool) -> Target {
        self.allow_fp8_fast_accum = allow;
        self
    }
    /// This target with float atomics allowed (or not).
    pub fn with_atomics(mut self, allow: bool) -> Target {
        self.allow_atomics = allow;
        self
    }
    /// An A100 (sm_80, 108 SMs): the mma.sync / cp.async generation.
    pub fn sm80() -> Target {
        Target::new("sm_80", 108)
    }
    /// An H100 SXM (sm_90a, 132 SMs): wgmma, TMA, clusters.
    pub fn sm90a() -> Target {
        Target::new("sm_90a", 132)
    }
    /// The compute capability as a number: 80, 86, 89, 90, ...
    pub fn cc(&self) -> u32 {
        self.arch.trim_start_matches("sm_").trim_end_matches('a').parse().unwrap_or(80)
    }
    /// Hopper's arch-specific features (wgmma, setmaxnreg) need the `a` target (`sm_90a`).
    pub fn hopper(&self) -> bool {
        self.arch == "sm_90a"
    }
}

/// The kernels of a group of nodes (one node, or a fused chain) and the tensors they write.
#[derive(Clone, Debug)]
pub struct Unit {
    /// Node indices covered, in topological order.
    pub nodes: Vec<usize>,
    pub kernels: NodeKernels,
    /// Tensors the unit writes to memory (outputs consumed outside the unit, or graph outputs);
    /// tensors internal to the unit never reach memory.
    pub writes: Vec<TensorId>,
    /// Kernels to run instead when a listed tensor's pointer is not 16-byte aligned at execute
    /// time (fast kernels with TMA or vector accesses that need it; the pointer is only known
    /// then). The alternative must compute the same outputs.
    pub unaligned: Option<Box<Unaligned>>,
}

/// See [`Unit::unaligned`].
#[derive(Clone, Debug)]
pub struct Unaligned {
    pub tensors: Vec<TensorId>,
    pub kernels: NodeKernels,
}

/// One fallback unit per node, in topological order.
pub fn fallback_units(graph: &Graph) -> Result<Vec<Unit>> {
    let order = graph.topological_order()?;
    order
        .into_iter()
        .map(|ni| {
            let writes = graph.nodes[ni].outputs.iter().map(|p| p.tensor).collect();
            Ok(Unit { nodes: vec![ni], kernels: fallback::generate(graph, ni)?, writes, unaligned: None })
        })
        .collect()
}

/// Whether a plan's knobs ask for fusion and specialized kernels (the default).
fn fused_knob(knobs: &[Knob]) -> bool {
    knobs.iter().find(|k| k.name == "fused").is_none_or(|k| k.value != 0)
}

/// Whether a plan's knobs let f32 matmuls run as tf32 (off unless asked for; only with fusion,
/// since the fallback computes in double).
fn tf32_knob(knobs: &[Knob]) -> bool {
    fused_knob(knobs) && knobs.iter().any(|k| k.name == "tf32" && k.value != 0)
}

/// Whether a plan's knobs let fp8 matmuls accumulate in the tensor cores' adder (off unless
/// asked for; only with fusion).
fn fp8_fast_accum_knob(knobs: &[Knob]) -> bool {
    fused_knob(knobs) && knobs.iter().any(|k| k.name == "fp8_fast_accum" && k.value != 0)
}

/// Whether a plan's knobs ask for autotuned GEMM configurations (only with fusion).
fn autotune_knob(knobs: &[Knob]) -> bool {
    fused_knob(knobs) && knobs.iter().any(|k| k.name == "autotune" && k.value != 0)
}

/// The GEMM tuning candidate a plan's knobs force (`gemm_config`), if any.
fn gemm_config_knob(knobs: &[Knob]) -> Option<u8> {
    knobs.iter().find(|k| k.name == "gemm_config").and_then(|k| u8::try_from(k.value).ok())
}

/// Whether a plan's knobs allow float atomics (off unless asked for; only with fusion).
fn atomics_knob(knobs: &[Knob]) -> bool {
    fused_knob(knobs) && knobs.iter().any(|k| k.name == "atomics" && k.value != 0)
}

/// Whether the graph has an attention backward whose kernels the `atomics` knob changes.
fn has_atomic_sdpa_backward(graph: &Graph) -> bool {
    graph.nodes.iter().any(|n| matches!(&n.op, crate::graph::ops::Op::SdpaBackward(a) if super::attention::atomic_dq_pays(a)))
}

/// Whether the graph has a matmul of two fp8 tensors (its inputs, or the sources of its scaled
/// operands): the `fp8_fast_accum` knob changes its kernels.
fn has_fp8_matmul(graph: &Graph) -> bool {
    super::gemm::has_fp8_matmul(graph)
}

/// Whether the graph has a matmul with an f32 input: the `tf32` knob changes its kernels.
fn has_f32_matmul(graph: &Graph) -> bool {
    graph
        .nodes
        .iter()
        .any(|n| matches!(n.op, crate::graph::ops::Op::Matmul(_)) && n.inputs.iter().any(|p| graph.resolved_data_type(p.tensor).unwrap_or(DataType::F32) == DataType::F32))
}

/// The text NVRTC compiles for a launch: the prelude and the launch's source, with the
/// programmatic-dependent-launch prologue ([`PDL_PROLOGUE`]) as the entry's first statements when
/// the target has it; and whether it has (the plan then launches it as a dependent).
fn kernel_text(l: &fallback::Launch, target: &Target) -> (String, bool) {
    let own_site = l.source.contains(fallback::PDL_SITE);
    if target.pdl && !l.source.starts_with(fallback::INDEPENDENT_LAUNCH) {
        if let Some(at) = entry_body_start(&l.source, &l.entry) {
            // Wait only (the next kernel launches as this one's blocks exit rather than once
            // they have all started) for kernels marked so, or all with `FERRODNN_PDL_TRIGGER=0`
            // (a tuning switch).
            let wait_only = l.source.starts_with(fallback::WAIT_ONLY_LAUNCH) || std::env::var("FERRODNN_PDL_TRIGGER").is_ok_and(|v| v == "0");
            let prologue = if wait_only { PDL_WAIT_ONLY } else { PDL_PROLOGUE };
            if own_site {
                return (format!("{PRELUDE}\n__device__ __forceinline__ void pdl_site() {{{prologue}}}\n{}", l.source), true);
            }
            return (format!("{PRELUDE}\n{}{prologue}{}", &l.source[..at], &l.source[at..]), true);
        }
    }
    let site = if own_site { "__device__ __forceinline__ void pdl_site() {}\n" } else { "" };
    (format!("{PRELUDE}\n{site}{}", l.source), false)
}

/// The first statements of a kernel launched as a programmatic dependent: wait until the
/// kernels before it in the stream have completed and their writes are visible (before any
/// memory access), then let the next kernel launch (its blocks then wait the same way, so they
/// only take the SM slots this kernel's finished blocks leave).
const PDL_PROLOGUE: &str = "\n#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900\n    asm volatile(\"griddepcontrol.wait;\" ::: \"memory\");\n    asm volatile(\"griddepcontrol.launch_dependents;\" ::: \"memory\");\n#endif\n";

/// [`PDL_PROLOGUE`] without the trigger.
const PDL_WAIT_ONLY: &str = "\n#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900\n    asm volatile(\"griddepcontrol.wait;\" ::: \"memory\");\n#endif\n";

/// The byte offset just past the opening brace of `entry`'s definition
/// (`extern "C" __global__ ... entry(params) {`) in `source`, or None.
fn entry_body_start(source: &str, entry: &str) -> Option<usize> {
    let needle = format!("{entry}(");
    let mut from = 0;
    while let Some(pos) = source[from..].find(&needle).map(|p| p + from) {
        from = pos + needle.len();
        // The name must be whole, and declared by the `__global__` before it.
        let whole = !matches!(source[..pos].chars().next_back(), Some(c) if c.is_alphanumeric() || c == '_');
        let decl = source[..pos].rfind("__global__").is_some_and(|g| !source[g..pos].contains([';', '{', '}']));
        if !whole || !decl {
            continue;
        }
        let mut depth = 1usize;
        let mut close = None;
        for (i, c) in source[from..].char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        close = Some(from + i + 1);
                        break;
                    }
                }
                _ => {}
            }
        }
        let close = close?;
        let rest = &source[close..];
        let brace = rest.len() - rest.trim_start().len();
        if rest[brace..].starts_with('{') {
            return Some(close + brace + 1);
        }
    }
    None
}

/// Every kernel source a graph's CUDA plan compiles, with its entry name: for tests that
/// compile them without a GPU, and for `FERRODNN_LOG`-style inspection.
pub fn kernel_sources(graph: &Graph, target: &Target) -> Result<Vec<(String, String)>> {
    let mut g = graph.clone();
    g.validate()?;
    let mut out = Vec::new();
    let mut units = CudaEngine::units(&g, target, true)?;
    units.extend(CudaEngine::units(&g, target, false)?);
    // The reduced-precision plan's (see `candidates`).
    let (f32s, fp8s) = (has_f32_matmul(&g), has_fp8_matmul(&g));
    if f32s || fp8s {
        units.extend(CudaEngine::units(&g, &target.clone().with_tf32(f32s).with_fp8_fast_accum(fp8s), true)?);
    }
    if has_atomic_sdpa_backward(&g) {
        units.extend(CudaEngine::units(&g, &target.clone().with_atomics(true), true)?);
    }
    for u in units {
        let alternative = u.unaligned.map(|a| a.kernels.launches).unwrap_or_default();
        for l in u.kernels.launches.into_iter().chain(alternative) {
            out.push((l.entry.clone(), kernel_text(&l, target).0));
        }
    }
    Ok(out)
}

impl CudaEngine {
    /// Tunes each GEMM problem of `graph` that has no tuning yet (`gemm::tune`). A problem that
    /// cannot be timed (its operands do not fit in the device's free memory, say) keeps the
    /// heuristic's configuration: tuning only ever changes speed.
    fn tune_gemms(&self, graph: &Graph, target: &Target) {
        for (p, descs) in super::gemm::tunable_problems(graph, target) {
            let key = super::gemm::tune::key(&p, target);
            if super::gemm::tune::TuneCache::global().get(&key).is_none() {
                let _ = self.tune_gemm(&p, descs, &key, target);
            }
        }
    }

    /// Times `p` in each of its candidate configurations (a plan of the matmul alone, with the
    /// same operand and output layouts and types, random inputs, built in parallel; two warm-up
    /// runs, then the mean of five between events) and keeps the fastest under `key`.
    fn tune_gemm(&self, p: &super::gemm::GemmProblem, [da, db, dc]: [crate::graph::TensorDesc; 3], key: &str, target: &Target) -> Result<()> {
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
                let knobs = [knob("tf32", target.allow_tf32 as i64), knob("fp8_fast_accum", target.allow_fp8_fast_accum as i64), knob("gemm_config", i as i64)];
                self.build(g.clone(), &knobs)
            })
            .collect::<Result<_>>()?;
        // Inputs of random values (the tensor cores' power, and so their clock, depends on
        // them), the output, a workspace.
        let mut rng = crate::testing::SplitMix64::new(0x7475_6e65);
        let mut buffers = Vec::new();
        for (uid, t) in [(1, a), (2, b), (3, c)] {
            let d = g.desc(t);
            let dt = g.resolved_data_type(t).unwrap_or(DataType::F32);
            let bytes = required_bytes(d, dt).max(1);
            let buf = if uid == 3 {
                self.device.alloc(bytes)?
            } else {
                let mut host = vec![0u8; bytes];
                for (i, v) in crate::testing::random_values(bytes / dt.size(), dt, &mut rng).into_iter().enumerate() {
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

    fn supports(&self, graph: &Graph) -> Result<()> {
        for t in &graph.tensors {
            if t.is_pass_by_value && t.value.is_none() && !t.is_virtual {
                return Err(Error::NotSupported(format!("tensor \"{}\": the CUDA engine needs by-value scalars to carry their value in the graph", t.name)));
            }
        }
        Self::units(graph, &self.target(), false).map(|_| ())
    }

    /// Fused and specialized kernels first, then the plain per-node fallback. A graph with an
    /// f32 matmul gets a tf32 plan first (reduced precision, as cuBLAS's and cuDNN's default
    /// tf32 math: `PlanPolicy::no_reduced_precision` skips it for the exact 3xTF32 plan); one
    /// with an fp8 matmul, a plan first whose fp8 products accumulate in the tensor cores' adder
    /// (reduced precision, cuBLASLt's fast accumulation; the next plan converts fp8 to f16 and
    /// accumulates in f32). On
    /// Hopper, an attention backward gets a plan first that accumulates dQ with float atomics
    /// (non-deterministic, as cuDNN's default: `PlanPolicy::deterministic_only` skips it).
    fn candidates(&self, graph: &Graph) -> Vec<Vec<Knob>> {
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
        if has_atomic_sdpa_backward(graph) && self.target().hopper() {
            v.insert(0, vec![fused(1), Knob { name: "atomics".into(), value: 1 }]);
        }
        v
    }

    fn behavior(&self, _graph: &Graph, knobs: &[Knob]) -> BehaviorNotes {
        // No atomics unless the `atomics` knob asks for them (split-k partial sums are added in
        // order): same inputs, same bits. The fallback computes in double; f32 matmuls run as
        // 3xTF32 unless the `tf32` knob asks for one tf32 pass, fp8 matmuls in f32 unless the
        // `fp8_fast_accum` knob asks for the tensor cores' adder.
        BehaviorNotes { runtime_compiled: true, deterministic: !atomics_knob(knobs), reduced_precision: tf32_knob(knobs) || fp8_fast_accum_knob(knobs) }
    }

    fn build(&self, graph: Arc<Graph>, knobs: &[Knob]) -> Result<Box<dyn CompiledPlan>> {
        let g = &*graph;
        let mut target = self.target().with_tf32(tf32_knob(knobs)).with_fp8_fast_accum(fp8_fast_accum_knob(knobs)).with_atomics(atomics_knob(knobs));
        target.gemm_config = gemm_config_knob(knobs);
        if autotune_knob(knobs) {
            self.tune_gemms(g, &target);
            target.autotune = true;
        }
        let units = Self::units(g, &target, fused_knob(knobs))?;
        let opts = CompileOptions::new(target.arch.clone());
        let cache = KernelCache::global();

        // Every launch of every unit (and of its unaligned alternative), compiled in parallel
        // (NVRTC is thread-safe), each as its own module.
        let lists: Vec<&NodeKernels> = units.iter().flat_map(|u| std::iter::once(&u.kernels).chain(u.unaligned.as_ref().map(|a| &a.kernels))).collect();
        let launches: Vec<&fallback::Launch> = lists.iter().flat_map(|k| k.launches.iter()).collect();
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
        let constants = if const_bytes.is_empty() { None } else { Some(self.device.upload(&const_bytes)?) };

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
                let mut grid = match l.exact_grid {
                    Some(grid) => grid,
                    None => (l.threads.div_ceil(l.block.max(1) as u64).clamp(1, max_grid) as u32, 1, 1),
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
}

struct CudaPlan {
    graph: Arc<Graph>,
    device: Arc<CudaDevice>,
    stream: SharedStream,
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
            (Some(Buffer::Device { ptr, .. }), _) if *ptr != 0 => *ptr,
            (Some(_), _) => return Err(Error::InvalidArgument(format!("graph \"{}\": the CUDA plan's workspace must be device memory", g.name))),
            (None, _) => return Err(Error::InvalidArgument(format!("graph \"{}\": the plan needs a workspace of {} bytes", g.name, self.workspace))),
        };
        if ws_ptr != 0 && !self.is_device_pointer(ws_ptr) {
            return Err(Error::InvalidArgument(format!("graph \"{}\": the workspace pointer {ws_ptr:#x} is not device memory of {}", g.name, self.device.name())));
        }
        let ptrs = self.resolve_pointers(pack, ws_ptr)?;
        let stream = self.stream.read().map_err(|_| Error::Device("the handle's stream lock is poisoned".into()))?.clone();
        for unit in &self.units {
            let steps = match &unit.unaligned {
                Some((tensors, alt)) if tensors.iter().any(|t| ptrs[t.0] % 16 != 0) => alt,
                _ => &unit.primary,
            };
            for step in steps {
                self.launch(step, &ptrs, ws_ptr, &stream)?;
            }
        }
        Ok(())
    }
}

impl CudaPlan {
    fn launch(&self, step: &Step, ptrs: &[u64], ws_ptr: u64, stream: &Stream) -> Result<()> {
        // Argument values live in these vectors until the launch returns; `params` points at
        // them. Capacities are reserved up front so the pointers stay put.
        let n = step.args.len();
        let mut words: Vec<u64> = Vec::with_capacity(n);
        let mut refs: Vec<TRef> = Vec::with_capacity(n);
        let mut floats: Vec<f64> = Vec::with_capacity(n);
        let mut maps: Vec<cudarc::driver::sys::CUtensorMap> = Vec::with_capacity(n);
        let mut params: Vec<*mut c_void> = Vec::with_capacity(n);
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
                Arg::TensorMap(desc) => {
                    maps.push(desc.encode(ptrs[desc.tensor.0])?);
                    params.push(maps.last_mut().map_or(std::ptr::null_mut(), |m| m as *mut cudarc::driver::sys::CUtensorMap as *mut c_void));
                }
                Arg::ScratchTensorMap(i, desc) => {
                    let at = step.scratch_at.get(*i).copied().ok_or_else(|| Error::Device(format!("internal: scratch buffer {i} was not laid out")))?;
                    maps.push(desc.encode(ws_ptr + at as u64)?);
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
        unsafe {
            if step.cluster.is_some() || step.dependent {
                step.function.launch_ex(stream, step.grid, step.block, step.cluster, step.dependent, step.shared_bytes, &mut params)
            } else {
                step.function.launch(stream, step.grid, step.block, step.shared_bytes, &mut params)
            }
        }
    }

    fn is_device_pointer(&self, ptr: u64) -> bool {
        if self.device_pointers.lock().is_ok_and(|set| set.contains(&ptr)) {
            return true;
        }
        let ok = self.device.is_device_pointer(ptr);
        if ok {
            if let Ok(mut set) = self.device_pointers.lock() {
                if set.len() >= 4096 {
                    set.clear();
                }
                set.insert(ptr);
            }
        }
        ok
    }

    /// Device pointer of every tensor a kernel may touch, checked: variant-pack buffers are
    /// device memory of this device, large enough, aligned to their type and non-null.
    fn resolve_pointers(&self, pack: &VariantPack, ws_ptr: u64) -> Result<Vec<u64>> {
        let g = &*self.graph;
        let mut ptrs = vec![0u64; g.tensors.len()];
        let mut known = std::collections::HashSet::new();
        for id in g.io_tensors() {
            let d = g.desc(id);
            let uid = d.uid.unwrap_or_default();
            known.insert(uid);
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
            if bytes < need {
                return Err(Error::InvalidArgument(format!(
                    "tensor \"{}\" (uid {uid}): buffer is {bytes} bytes but dims {:?} with strides {:?} of {dt} need {need}",
                    d.name, d.dims, d.strides
                )));
            }
            if !self.is_device_pointer(ptr) {
                return Err(Error::InvalidArgument(format!("tensor \"{}\" (uid {uid}): {ptr:#x} is not device memory of {} (a host pointer?)", d.name, self.device.name())));
            }
            ptrs[id.0] = ptr;
        }
        for uid in pack.buffers.keys() {
            if !known.contains(uid) {
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
    use super::{entry_body_start, kernel_sources, Target};

    #[test]
    fn entry_body_start_finds_the_definition() {
        let src = "// k_rows( in a comment\n__device__ void k_rows_helper(int a) {}\nextern \"C\" __global__ void __launch_bounds__(256, 2) k_rows(const float* x, TRef r) {\n    body();\n}\n";
        let at = entry_body_start(src, "k_rows").expect("found");
        assert_eq!(&src[at - 1..at + 5], "{\n    ");
        assert!(src[..at].ends_with("TRef r) {"));
        assert_eq!(entry_body_start(src, "k_none"), None);
        assert_eq!(entry_body_start("extern \"C\" __global__ void k(int a);", "k"), None);
    }

    /// Every kernel of every check case gets the dependent-launch prologue on sm_90a (once, as
    /// its first statements; none for the few marked independent) and none on sm_80 or with it
    /// turned off.
    #[test]
    fn every_hopper_kernel_waits_for_its_predecessor_first() {
        let wait = "griddepcontrol.wait;";
        for case in crate::testing::cases::all() {
            for (target, want) in [(Target::sm90a(), 1), (Target::sm90a().with_pdl(false), 0), (Target::sm80().with_pdl(true), 0)] {
                let Ok(list) = kernel_sources(&case.graph, &target) else { continue };
                for (entry, src) in list {
                    let want = if src.contains(crate::engine::cuda::fallback::INDEPENDENT_LAUNCH) { 0 } else { want };
                    assert_eq!(src.matches(wait).count(), want, "{} {entry} ({})", case.name, target.arch);
                    let trigger = "griddepcontrol.launch_dependents;";
                    let wait_only = src.contains(crate::engine::cuda::fallback::WAIT_ONLY_LAUNCH);
                    assert_eq!(src.matches(trigger).count(), if wait_only { 0 } else { want }, "{} {entry} ({})", case.name, target.arch);
                    if want == 1 && src.contains(crate::engine::cuda::fallback::PDL_SITE) {
                        // The kernel places the prologue itself: before any load (only L2
                        // prefetches may come first).
                        let body = &src[entry_body_start(&src, &entry).expect("entry found")..];
                        let site = body.find(crate::engine::cuda::fallback::PDL_SITE).expect("site in the entry");
                        for load in ["cp.async", "ld.global", "ldx_", "ld_"] {
                            assert!(!body[..site].contains(load), "{} {entry}: {load} before the dependent-launch wait", case.name);
                        }
                    } else if want == 1 {
                        let body = entry_body_start(&src, &entry).expect("entry found");
                        assert!(src[body..].trim_start().starts_with("#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900"), "{} {entry}", case.name);
                    }
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
            for target in [Target::sm90a(), Target::sm90a().with_experimental()] {
                let Ok(list) = kernel_sources(&case.graph, &target) else { continue };
                for (entry, src) in list {
                    let (dec, inc) = (value(&src, "setmaxnreg.dec.sync.aligned.u32"), value(&src, "setmaxnreg.inc.sync.aligned.u32"));
                    if dec.is_empty() && inc.is_empty() {
                        continue;
                    }
                    assert!(dec.len() == 1 && inc.len() == 1, "{} {entry}: one dec and one inc expected, got {dec:?} {inc:?}", case.name);
                    let threads: u32 = src.split("__launch_bounds__(").nth(1).and_then(|s| s.split(',').next()).and_then(|s| s.trim().parse().ok()).expect("launch bounds");
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
