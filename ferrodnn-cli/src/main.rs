//! The `ferrodnn` command: the op-by-engine table, running a graph from JSON, and the demo.

/// `println!` for the command's output: on a closed standard output (`ferrodnn run g.json |
/// head`) the process exits quietly with status 0 instead of panicking.
macro_rules! outln {
    () => {
        $crate::write_out(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` as [`outln!`] is `println!`.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::write_out(format_args!($($arg)*))
    };
}

mod bench;
mod bench_attention;
mod bench_conv;
mod bench_gemm;
mod bench_memory;
mod demo;
mod gpu_check;
mod gpu_reliability;
mod gpu_smoke;
mod ptx_manifest;

use clap::{Parser, Subcommand, ValueEnum};
use ferrodnn::engine::{CancelToken, PlanPolicy};
use ferrodnn::graph::ops::all_op_names;
use ferrodnn::testing::{execute_plan_dense_cancellable, relative_error, tolerance, try_random_inputs};
use ferrodnn::{DataType, EngineKind, Graph, Handle};
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Instant;

/// Write the command's output; a closed pipe ends the process quietly (status 0), any other
/// write error with a message (status 1).
fn write_out(args: std::fmt::Arguments) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(args) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: cannot write to standard output: {e}");
        std::process::exit(1);
    }
}

/// The token Ctrl-C sets: `run` and `demo` execute on the CPU engine watching it. A second
/// Ctrl-C quits at once (status 130).
fn cancel_token() -> &'static CancelToken {
    static TOKEN: OnceLock<CancelToken> = OnceLock::new();
    TOKEN.get_or_init(|| {
        let token = CancelToken::new();
        let for_handler = token.clone();
        // Without a handler (one already set, no signals here) Ctrl-C keeps its default: quit.
        let _ = ctrlc::set_handler(move || {
            if for_handler.is_cancelled() {
                std::process::exit(130);
            }
            for_handler.cancel();
            eprintln!("\nferrodnn: cancelling after the current op (Ctrl-C again to quit at once)");
        });
        token
    })
}

#[derive(Parser)]
#[command(name = "ferrodnn", version, about = "Deep-learning primitives in the shape of cuDNN's graph API")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print which engines run each op.
    Ops {
        /// Print JSON: a list of {"op": NAME, "engines": {"cpu": true, ...}}.
        #[arg(long)]
        json: bool,
    },
    /// Run a graph from a JSON file on seeded random inputs, check it against the f64 reference
    /// engine when another engine ran it, and print the timing.
    Run {
        graph: std::path::PathBuf,
        #[arg(long, value_enum, default_value_t = EngineArg::Auto)]
        engine: EngineArg,
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Explain what the CUDA engine makes of a graph (from a JSON file), without running it: the
    /// fusion groups, which engine took each node and why each fast engine that could have taken
    /// it declined, and the kernels with their launch shapes; `--source` adds every kernel's text
    /// exactly as NVRTC compiles it. Needs no GPU: for this machine's GPU when there is one,
    /// otherwise for `--arch` / `--sm-count` (an H100 by default).
    Explain {
        graph: std::path::PathBuf,
        /// Print each kernel's full source.
        #[arg(long)]
        source: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// The NVRTC architecture to plan for (default: this machine's GPU, else sm_90a).
        #[arg(long)]
        arch: Option<String>,
        /// The SM count to plan for (default: this machine's GPU, else 132).
        #[arg(long)]
        sm_count: Option<u32>,
        /// The plan's knobs as NAME=VALUE (default: the engine's first candidate), e.g. fused=0.
        #[arg(long = "knob", value_parser = parse_knob)]
        knobs: Vec<ferrodnn::engine::Knob>,
        /// Explain the fast CPU engine's plan instead: which nodes run on its GEMM kernels (with
        /// which epilogue), which on the reference's code and why.
        #[arg(long)]
        cpu: bool,
    },
    /// Build a conv -> bias -> relu graph, a layernorm graph and an attention graph, run each on
    /// the best engine available and print results, errors and timings.
    Demo,
    /// Write the example graphs (the demo's and a few more) as JSON into a folder.
    ExampleGraphs { dir: std::path::PathBuf },
    /// Time a suite of workloads on the GPU (CUDA events, medians) and report plan build times;
    /// bench/run.py runs it beside PyTorch and writes bench/results/<gpu>.json.
    Bench {
        #[arg(long, default_value = "memory-bound")]
        suite: String,
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        /// Only workloads whose id contains this.
        #[arg(long)]
        filter: Option<String>,
        /// Most timed runs per workload (also stops after about two seconds).
        #[arg(long, default_value_t = 50)]
        runs: usize,
        /// Build the plans with autotuning (`PlanPolicy::autotune`: each Hopper GEMM timed once
        /// in a few tile configurations, the fastest kept; the build times then include it).
        #[arg(long)]
        autotune: bool,
    },
    /// Run every check case (every op, multi-op graphs) on the GPU against the CPU engine and
    /// print a pass/fail table; exits non-zero on any failure.
    GpuCheck {
        /// Only cases whose name contains this (or any of several, comma-separated).
        #[arg(long)]
        filter: Option<String>,
        /// Also write the results as JSON here.
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Run only shard I of N (`I/N`, cases dealt round-robin), to spread a check over processes.
        #[arg(long, value_parser = parse_shard)]
        shard: Option<(usize, usize)>,
    },
    /// Issue 29's GPU reliability checks: device faults (memory exhausted, a short workspace,
    /// host and foreign pointers, a stream of another context, refused launches) each an error
    /// that leaves the handle usable; 8 threads on their own and on one shared stream; CUDA-graph
    /// capture and replay; two processes sharing one kernel cache folder; with --big, tensors
    /// past 2^31 elements. Writes one JSON record a check; exits non-zero on any failure.
    GpuReliability {
        /// The JSON report to write.
        #[arg(long)]
        out: std::path::PathBuf,
        /// Also the tensors past 2^31 elements (about 30 GB of device memory, 60 GB of host).
        #[arg(long)]
        big: bool,
        /// (Internal: the child side of the two-process kernel cache check.)
        #[arg(long, hide = true)]
        cache_child: bool,
        /// No GPU: generate and compile (NVRTC) every kernel the checks' plans use, for sm_90a
        /// with 132 SMs, into the kernel cache ($FERRODNN_CACHE_DIR), and check that every
        /// graph (the big ones with --big) plans. --out is not written.
        #[arg(long)]
        compile_only: bool,
    },
    /// Compile every kernel the check cases need for one target into the kernel cache
    /// ($FERRODNN_CACHE_DIR): NVRTC needs no GPU, so a build machine can fill the cache that a
    /// GPU machine with the same NVRTC then reads (kernels are keyed by source, arch and NVRTC
    /// version).
    CompileCases {
        /// The NVRTC architecture, e.g. sm_90a.
        #[arg(long, default_value = "sm_90a")]
        arch: String,
        /// The SM count the target device has (one-wave grids are generated for it).
        #[arg(long, default_value_t = 132)]
        sm_count: u32,
        /// Only cases whose name contains this.
        #[arg(long)]
        filter: Option<String>,
        /// Also write each kernel's full source (prelude included) to DIR/<entry>_<n>.cu, for
        /// inspection with NVRTC or nvcc (register use, spills).
        #[arg(long)]
        dump: Option<std::path::PathBuf>,
        /// Also the kernels of this benchmark suite's workloads (with --filter applied to their
        /// ids), e.g. to read ptxas's register report for the benchmark shapes.
        #[arg(long)]
        bench: Option<String>,
        /// Compile each kernel afresh (not through the cache) and print ptxas's performance notes
        /// ("Potential Performance Loss", waits it injected around wgmma), kernel by kernel.
        #[arg(long)]
        notes: bool,
    },
    /// Write the PTX of every kernel the check cases and benchmark suites compile (sm_80 and
    /// sm_90a) as a manifest, one line a kernel with the hash of its PTX: a manifest before and
    /// after a change to the generators shows which kernels' code changed. Needs NVRTC, no GPU.
    PtxManifest {
        /// The manifest file to write.
        out: std::path::PathBuf,
        /// Also keep each distinct PTX here, as <hash>.ptx.
        #[arg(long)]
        ptx_dir: Option<std::path::PathBuf>,
        /// Only graphs whose name contains this.
        #[arg(long)]
        filter: Option<String>,
    },
    /// Smoke-check the CUDA runtime on the GPU: NVRTC compile, kernel cache, module load, launches
    /// checked element by element against the CPU, wrapped streams, event timing, an mma.sync
    /// tile and a cluster launch. Prints JSON; exits non-zero if a check fails (0 with
    /// {"gpu": false} on a machine without a GPU).
    GpuCheckRuntime {
        /// Also write the JSON report to this file.
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        /// The CUDA device ordinal.
        #[arg(long, default_value_t = 0)]
        device: usize,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum EngineArg {
    /// The fast CPU engine.
    Cpu,
    Cuda,
    /// The f64 reference engine.
    Reference,
    Auto,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Command::Run { .. } | Command::Demo) {
        // Ctrl-C cancels from the start on.
        cancel_token();
    }
    let result = match cli.command {
        Command::GpuCheckRuntime { out, device } => return gpu_smoke::main(device, out.as_deref()),
        Command::Ops { json } => ops(json),
        Command::CompileCases { arch, sm_count, filter, dump, bench, notes } => compile_cases(&arch, sm_count, filter.as_deref(), dump.as_deref(), bench.as_deref(), notes),
        Command::PtxManifest { out, ptx_dir, filter } => ptx_manifest::ptx_manifest(&out, ptx_dir.as_deref(), filter.as_deref()),
        Command::Explain { graph, cpu: true, .. } => explain_cpu(&graph),
        Command::Explain { graph, source, json, arch, sm_count, knobs, cpu: false } => explain(&graph, source, json, arch, sm_count, &knobs),
        Command::Run { graph, engine, seed } => run(&graph, engine, seed),
        Command::Demo => demo::demo(),
        Command::ExampleGraphs { dir } => demo::write_examples(&dir),
        Command::Bench { suite, out, filter, runs, autotune } => bench::bench(&suite, out, filter, runs, autotune),
        Command::GpuCheck { filter, out, seed, shard } => gpu_check::gpu_check(filter, out, seed, shard),
        Command::GpuReliability { out, big, cache_child, compile_only } => gpu_reliability::gpu_reliability(&out, big, cache_child, compile_only),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            // Interrupted, as a shell reports a process Ctrl-C ended.
            if cancel_token().is_cancelled() {
                return ExitCode::from(130);
            }
            ExitCode::FAILURE
        }
    }
}

/// Engines a build of ferrodnn can have, whether or not this machine can run them.
const ALL_ENGINES: [EngineKind; 3] = [EngineKind::Cpu, EngineKind::Cuda, EngineKind::Reference];

/// Whether an engine of this build runs an op: the CPU engines run every op (the fast one some
/// through the reference's code: `ferrodnn explain --cpu` says which); the CUDA engine
/// runs an op when it generates kernels for every check case that uses the op (and at least one
/// case uses it). This needs no GPU: kernel generation is plain Rust.
fn engine_supports(engine: EngineKind, op: &str, cuda_ops: &std::collections::HashMap<String, bool>) -> bool {
    match engine {
        EngineKind::Cpu | EngineKind::Reference => true,
        EngineKind::Cuda => cuda_ops.get(op).copied().unwrap_or(false),
    }
}

/// For each op kind in the check cases: whether the CUDA engine generated kernels for every case
/// using it.
fn cuda_support() -> std::collections::HashMap<String, bool> {
    let mut support: std::collections::HashMap<String, bool> = std::collections::HashMap::new();
    for case in ferrodnn::testing::cases::all() {
        let ok = ferrodnn::engine::cuda::kernel_sources(&case.graph, &ferrodnn::engine::cuda::Target::sm90a()).is_ok();
        for node in &case.graph.nodes {
            let e = support.entry(node.op.kind().to_string()).or_insert(true);
            *e &= ok;
        }
    }
    support
}

fn ops(json: bool) -> Result<(), String> {
    let names = all_op_names();
    let cuda_ops = cuda_support();
    let mut text = String::new();
    if json {
        let list: Vec<serde_json::Value> = names
            .iter()
            .map(|op| {
                let engines: serde_json::Map<String, serde_json::Value> =
                    ALL_ENGINES.iter().map(|e| (e.name().to_string(), serde_json::Value::Bool(engine_supports(*e, op, &cuda_ops)))).collect();
                serde_json::json!({ "op": op, "engines": engines })
            })
            .collect();
        text = serde_json::to_string_pretty(&list).map_err(|e| e.to_string())? + "\n";
    } else {
        text += &format!("{:<28} {}\n", "op", ALL_ENGINES.iter().map(|e| format!("{:<6}", e.name())).collect::<String>());
        for op in names {
            let marks: String = ALL_ENGINES.iter().map(|e| format!("{:<6}", if engine_supports(*e, op, &cuda_ops) { "yes" } else { "-" })).collect();
            text += &format!("{op:<28} {marks}\n");
        }
    }
    // A closed pipe (`ferrodnn ops | head`) is not an error worth a panic.
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
    Ok(())
}

fn run(path: &std::path::Path, engine: EngineArg, seed: u64) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    // Parsed and validated before anything is sized from it.
    let graph = Graph::from_json(&text).map_err(|e| e.to_string())?;
    let handle = Handle::new();
    let wanted = match engine {
        EngineArg::Cpu => Some(EngineKind::Cpu),
        EngineArg::Cuda => Some(EngineKind::Cuda),
        EngineArg::Reference => Some(EngineKind::Reference),
        EngineArg::Auto => None,
    };
    if let Some(k) = wanted {
        if !handle.engines().any(|e| e == k) {
            return Err(format!("engine {} is not available on this machine (available: {})", k.name(), handle.engines().map(|e| e.name()).collect::<Vec<_>>().join(", ")));
        }
    }
    let cancel = cancel_token();
    let policy = PlanPolicy { engine: wanted, ..Default::default() };
    // The plan build refuses what this machine cannot hold or would run for hours, naming the op.
    let start = Instant::now();
    let plan = handle.build_plans(&graph, &policy).map_err(|e| e.to_string())?.remove(0);
    let build = start.elapsed();
    let used = plan.engine();
    let inputs = try_random_inputs(&graph, seed).map_err(|e| e.to_string())?;
    let start = Instant::now();
    let outputs = execute_plan_dense_cancellable(&handle, &plan, &inputs, cancel).map_err(|e| e.to_string())?;
    let elapsed = build + start.elapsed();
    outln!("graph \"{}\": {} ops, ran on engine {} in {:.3} ms (plan build included)", graph.name, graph.nodes.len(), used.name(), elapsed.as_secs_f64() * 1e3);
    let reference = if used != EngineKind::Reference {
        let cpu = Handle::reference();
        let plan = cpu.build_plans(&graph, &PlanPolicy::default()).map_err(|e| format!("the CPU reference: {e}"))?.remove(0);
        Some(execute_plan_dense_cancellable(&cpu, &plan, &inputs, cancel).map_err(|e| format!("the CPU reference: {e}"))?)
    } else {
        None
    };
    let mut failed = false;
    let mut ids: Vec<_> = outputs.keys().copied().collect();
    ids.sort();
    for id in ids {
        let out = &outputs[&id];
        let d = graph.desc(id);
        let dtype = graph.resolved_data_type(id).unwrap_or(DataType::F32);
        let preview: Vec<String> = out.data.iter().take(6).map(|v| format!("{v:.5}")).collect();
        out!("  {} {:?} {dtype}: [{}{}]", d.name, d.dims, preview.join(", "), if out.len() > 6 { ", ..." } else { "" });
        if let Some(r) = &reference {
            let err = relative_error(&out.data, &r[&id].data);
            let tol = tolerance(dtype).max(1e-6);
            let ok = err <= tol;
            failed |= !ok;
            out!("  rel. error vs reference {err:.2e} ({})", if ok { "ok" } else { "FAIL" });
        }
        outln!();
    }
    if failed {
        return Err("some outputs differ from the reference engine beyond tolerance".into());
    }
    Ok(())
}

/// See [`Command::Explain`].
fn explain(path: &std::path::Path, source: bool, json: bool, arch: Option<String>, sm_count: Option<u32>, knobs: &[ferrodnn::engine::Knob]) -> Result<(), String> {
    use ferrodnn::engine::cuda::{self, CudaDevice, Target};
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let graph = Graph::from_json(&text).map_err(|e| e.to_string())?;
    let device = if cuda::gpu_available() { CudaDevice::open(0).ok() } else { None };
    let arch = arch.or_else(|| device.as_ref().map(|d| d.arch())).unwrap_or_else(|| "sm_90a".into());
    let sm_count = sm_count.or_else(|| device.as_ref().map(|d| d.sm_count())).unwrap_or(132);
    let e = cuda::explain(&graph, &Target::new(&arch, sm_count), knobs).map_err(|e| e.to_string())?;
    let out = if json { serde_json::to_string_pretty(&e).map_err(|e| e.to_string())? + "\n" } else { e.to_text(source) };
    // A closed pipe (`ferrodnn explain g.json --source | head`) is not an error worth a panic.
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), out.as_bytes());
    Ok(())
}

/// `explain --cpu`: the fast CPU engine's plan for a graph, step by step.
fn explain_cpu(path: &std::path::Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let graph = Graph::from_json(&text).map_err(|e| e.to_string())?;
    let policy = PlanPolicy { engine: Some(EngineKind::Cpu), ..Default::default() };
    let plan = Handle::cpu().build_plans(&graph, &policy).map_err(|e| e.to_string())?.remove(0);
    let out = plan.explain().unwrap_or_default();
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), out.as_bytes());
    Ok(())
}

fn parse_knob(s: &str) -> Result<ferrodnn::engine::Knob, String> {
    let (name, value) = s.split_once('=').ok_or_else(|| format!("`{s}`: expected NAME=VALUE, e.g. fused=0"))?;
    let value: i64 = value.parse().map_err(|_| format!("`{s}`: VALUE is not an integer"))?;
    Ok(ferrodnn::engine::Knob { name: name.to_string(), value })
}

fn parse_shard(s: &str) -> Result<(usize, usize), String> {
    let (i, n) = s.split_once('/').ok_or_else(|| format!("`{s}`: expected I/N, e.g. 0/4"))?;
    let i: usize = i.parse().map_err(|_| format!("`{s}`: I is not a number"))?;
    let n: usize = n.parse().map_err(|_| format!("`{s}`: N is not a number"))?;
    if n == 0 || i >= n {
        return Err(format!("`{s}`: need 0 <= I < N"));
    }
    Ok((i, n))
}

/// See [`Command::CompileCases`].
fn compile_cases(arch: &str, sm_count: u32, filter: Option<&str>, dump: Option<&std::path::Path>, suite: Option<&str>, notes: bool) -> Result<(), String> {
    use ferrodnn::engine::cuda::{compile_cached, compile_cubin_logged, ptxas_perf_notes, CompileOptions, KernelCache, Target};
    use rayon::prelude::*;
    let target = Target::new(arch, sm_count);
    let mut sources = std::collections::BTreeMap::new();
    let mut graphs: Vec<(String, ferrodnn::Graph)> = ferrodnn::testing::cases::all().into_iter().map(|c| (c.name, c.graph)).collect();
    if let Some(name) = suite {
        graphs.extend(bench::suite(name)?.into_iter().map(|w| (w.id, w.graph)));
    }
    for (name, graph) in graphs.iter().filter(|(name, _)| filter.is_none_or(|f| name.contains(f))) {
        match ferrodnn::engine::cuda::kernel_sources(graph, &target) {
            Ok(list) => {
                for (entry, src) in list {
                    sources.entry(src).or_insert(entry);
                }
            }
            Err(e) => {
                use std::io::Write;
                let _ = writeln!(std::io::stderr(), "{name}: no kernels: {e}");
            }
        }
    }
    if let Some(dir) = dump {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for (i, (src, entry)) in sources.iter().enumerate() {
            let path = dir.join(format!("{entry}_{i}.cu"));
            std::fs::write(&path, src).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    let opts = CompileOptions::new(arch);
    if notes {
        let list: Vec<(&String, &String)> = sources.iter().collect();
        let results: Vec<(String, Result<Vec<String>, String>)> = list
            .par_iter()
            .enumerate()
            .map(|(i, (src, entry))| {
                let r = compile_cubin_logged(src, entry, &opts).map(|(_, log)| ptxas_perf_notes(&log).into_iter().map(str::to_string).collect()).map_err(|e| e.to_string());
                (format!("{entry}_{i}"), r)
            })
            .collect();
        let mut failed = Vec::new();
        let mut noted = 0;
        for (name, r) in &results {
            match r {
                Ok(lines) if !lines.is_empty() => {
                    noted += 1;
                    outln!("{name}:");
                    for l in lines {
                        outln!("    {l}");
                    }
                }
                Ok(_) => {}
                Err(e) => failed.push(format!("{name}: {e}")),
            }
        }
        outln!("compiled {} kernels for {arch}; {noted} with ptxas performance notes; {} failed", results.len(), failed.len());
        return if failed.is_empty() { Ok(()) } else { Err(failed.join("\n")) };
    }
    let cache = KernelCache::global();
    let failed: Vec<String> = sources.par_iter().filter_map(|(src, entry)| compile_cached(cache, src, entry, &opts).err().map(|e| format!("{entry}: {e}"))).collect();
    outln!("compiled {} kernels for {arch} into the kernel cache; {} failed", sources.len(), failed.len());
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("\n"))
    }
}
