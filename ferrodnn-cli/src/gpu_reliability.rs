//! `ferrodnn gpu-reliability --out FILE.json [--big]`: the GPU side of issue 29's items 4-6.
//!
//! - Faults (item 4): device memory exhausted (allocations refused with the bytes asked and the
//!   free memory named; execution of a built plan and a fresh plan afterwards on the same
//!   handle), a workspace smaller than the plan's, a host pointer and another device's pointer
//!   as a buffer, a stream of another CUDA context, launch failures the driver reports (injected:
//!   a launch the driver refuses). Each is an error naming what failed; the device memory in use
//!   is the same before and after each failed execute; the next execute on the same handle gives
//!   the reference's result.
//! - Concurrency (item 6): 8 threads building and executing plans on their own handles (own
//!   streams) and on one shared handle (one stream), every result bit-identical to a
//!   single-threaded run; `execute` captured into a CUDA graph and replayed on new inputs; two
//!   processes filling and reading one kernel cache folder at once, then again after entries
//!   were damaged.
//! - With `--big` (item 5): tensors past 2^31 elements and 2^32 bytes: pointwise (past 2^31 and
//!   past 2^32 elements), layernorm and softmax over rows, reductions (over rows, and all of it
//!   to one value), a matmul whose output and a batched matmul whose operand pass 2^31 elements.
//!   Pointwise, norms, softmax and reductions are checked element by element against a host
//!   reference computed in parallel chunks (inputs are a hash of the index, so any element's
//!   value is known without storing a second copy); the matmuls against the same product
//!   computed by small plans on slices of the operands (row or batch chunks, offsets below
//!   2^31), plus a host f64 product of sampled rows (the first, the last, and those around
//!   element 2^31).
//! - Attention past 2^31 elements (with `--big`): sdpa forwards whose Q, K, V and O each hold
//!   2^31 + 2^21 elements (bf16, 4.3 GB each; non-causal on the Hopper kernel, and causal with
//!   every base one element off 16-byte alignment, which runs the general kernel's
//!   element-wise variant), and a decode forward whose K and V pass 2^31 elements. Each is
//!   checked element by element against the same sdpa run on batch slices below 2^31 elements,
//!   and on sampled heads (the first, the last, those holding element 2^31 of Q/O or K/V)
//!   against a host f64 attention.
//!
//! Writes one JSON record a check ({"name", "passed", "ms", "detail", figures...}) in a report
//! object, and exits non-zero when a check fails. `--cache-child` is the child side of the
//! two-process check.

use ferrodnn::engine::cuda::{self, CapturedGraph, CudaDevice, DeviceBuffer, ForeignContextStream, KernelCache, KernelKey};
use ferrodnn::engine::PlanPolicy;
use ferrodnn::graph::ops::norm::NormAttrs;
use ferrodnn::graph::ops::reduction::ReductionMode;
use ferrodnn::graph::ops::sdpa::{CausalAlignment, SdpaAttrs, SdpaInputs};
use ferrodnn::testing::{execute_dense, output_precision, random_inputs, relative_error, tolerance};
use ferrodnn::{Buffer, DataType, EngineKind, Graph, Handle, Plan, TensorDesc, VariantPack};
use rayon::prelude::*;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

type Res<T> = std::result::Result<T, String>;

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

fn cuda_policy() -> PlanPolicy {
    PlanPolicy { engine: Some(EngineKind::Cuda), ..Default::default() }
}

// ---------------------------------------------------------------------------------------------
// The small graphs (faults, concurrency, capture, the cache children)
// ---------------------------------------------------------------------------------------------

/// relu(x @ w + b), bf16 in and out, f32 compute: uids x 1, w 2, b 3, y 4.
fn mlp_graph(m: i64, k: i64, n: i64) -> Graph {
    let mut g = Graph::new(format!("mlp_{m}x{k}x{n}")).io_data_type(DataType::Bf16).intermediate_data_type(DataType::F32).compute_data_type(DataType::F32);
    let x = g.tensor(TensorDesc::new("x", &[m, k], DataType::Bf16).with_uid(1));
    let w = g.tensor(TensorDesc::new("w", &[k, n], DataType::Bf16).with_uid(2));
    let b = g.tensor(TensorDesc::new("b", &[1, n], DataType::Bf16).with_uid(3));
    let y = g.matmul(x, w);
    let y = g.bias(y, b);
    let y = g.relu(y);
    g.set_output(y);
    g.desc_mut(y).uid = Some(4);
    g.desc_mut(y).name = "y".into();
    g
}

/// Layernorm (inference) over rows of [rows, h], bf16: uids x 1, scale 2, bias 3, y 4.
fn layernorm_graph(rows: i64, h: i64) -> Graph {
    let mut g = Graph::new(format!("layernorm_{rows}x{h}")).io_data_type(DataType::Bf16).intermediate_data_type(DataType::F32).compute_data_type(DataType::F32);
    let x = g.tensor(TensorDesc::new("x", &[rows, h], DataType::Bf16).with_uid(1));
    let sc = g.tensor(TensorDesc::new("scale", &[1, h], DataType::Bf16).with_uid(2));
    let bi = g.tensor(TensorDesc::new("bias", &[1, h], DataType::Bf16).with_uid(3));
    let (y, _, _) = g.layernorm(x, sc, bi, NormAttrs::inference().with_epsilon(1e-5));
    g.set_output(y);
    g.desc_mut(y).uid = Some(4);
    g.desc_mut(y).name = "y".into();
    g
}

/// Softmax over rows of [rows, len]: uids x 1, y 2.
fn softmax_graph(rows: i64, len: i64, dt: DataType) -> Graph {
    let mut g = Graph::new(format!("softmax_{rows}x{len}")).io_data_type(dt).intermediate_data_type(DataType::F32).compute_data_type(DataType::F32);
    let x = g.tensor(TensorDesc::new("x", &[rows, len], dt).with_uid(1));
    let (y, _) = g.softmax(x, 1, false, false);
    g.set_output(y);
    g.desc_mut(y).uid = Some(2);
    g.desc_mut(y).name = "y".into();
    g
}

/// Sum of [rows, cols] (`dt`) over `axes`, into f32: uids x 1, y 2.
fn reduce_graph(rows: i64, cols: i64, dt: DataType, axes: &[usize]) -> Graph {
    let mut g = Graph::new(format!("reduce_{rows}x{cols}_{axes:?}")).io_data_type(dt).intermediate_data_type(DataType::F32).compute_data_type(DataType::F32);
    let x = g.tensor(TensorDesc::new("x", &[rows, cols], dt).with_uid(1));
    let y = g.reduction(x, ReductionMode::Add, axes);
    g.set_output(y);
    g.desc_mut(y).uid = Some(2);
    g.desc_mut(y).name = "y".into();
    g.desc_mut(y).data_type = Some(DataType::F32);
    g
}

/// relu(x + b) on [rows, cols] with b [1, cols], bf16: uids x 1, b 2, y 3.
fn pointwise_graph(rows: i64, cols: i64) -> Graph {
    let mut g = Graph::new(format!("add_relu_{rows}x{cols}")).io_data_type(DataType::Bf16).intermediate_data_type(DataType::F32).compute_data_type(DataType::F32);
    let x = g.tensor(TensorDesc::new("x", &[rows, cols], DataType::Bf16).with_uid(1));
    let b = g.tensor(TensorDesc::new("b", &[1, cols], DataType::Bf16).with_uid(2));
    let y = g.add(x, b);
    let y = g.relu(y);
    g.set_output(y);
    g.desc_mut(y).uid = Some(3);
    g.desc_mut(y).name = "y".into();
    g
}

/// A graph whose plans need a workspace (a matmul's output a virtual tensor that a softmax
/// reads: the plain per-node plan keeps it in the workspace): uids a 1, b 2, y 3.
fn workspace_graph() -> Graph {
    let mut g = Graph::new("matmul_softmax").io_data_type(DataType::F32).intermediate_data_type(DataType::F32).compute_data_type(DataType::F32);
    let a = g.tensor(TensorDesc::new("a", &[64, 96], DataType::F32).with_uid(1));
    let b = g.tensor(TensorDesc::new("b", &[96, 80], DataType::F32).with_uid(2));
    let c = g.matmul(a, b);
    let (y, _) = g.softmax(c, 1, false, false);
    g.set_output(y);
    g.desc_mut(y).uid = Some(3);
    g.desc_mut(y).name = "y".into();
    g
}

fn small_graphs() -> Vec<Graph> {
    let mut v = vec![mlp_graph(64, 256, 128), layernorm_graph(128, 1024), softmax_graph(256, 512, DataType::F32), reduce_graph(64, 4096, DataType::F32, &[1])];
    for g in &mut v {
        g.validate().expect("the check graphs are valid");
    }
    v
}

/// The inputs of a (packed) graph as bytes by uid, from the seeded dense values.
fn input_bytes(g: &Graph, seed: u64) -> HashMap<i64, Vec<u8>> {
    let nd = random_inputs(g, seed);
    g.input_tensors().into_iter().map(|id| (g.uid(id).unwrap_or_default(), g.resolved_data_type(id).unwrap_or(DataType::F32).encode(&nd[&id].data))).collect()
}

/// The f64 reference's outputs by uid.
fn reference(g: &Graph, seed: u64) -> Res<HashMap<i64, Vec<f64>>> {
    let out = execute_dense(&Handle::reference(), g, &random_inputs(g, seed), &PlanPolicy::default()).map_err(s)?;
    Ok(out.into_iter().map(|(id, nd)| (g.uid(id).unwrap_or_default(), nd.data)).collect())
}

/// Compare outputs (bytes by uid) with the reference within each output's tolerance.
fn check_against(g: &Graph, got: &HashMap<i64, Vec<u8>>, want: &HashMap<i64, Vec<f64>>) -> Res<f64> {
    let mut worst: f64 = 0.0;
    for id in g.output_tensors() {
        let uid = g.uid(id).unwrap_or_default();
        let dt = g.resolved_data_type(id).unwrap_or(DataType::F32);
        let bound = 2.0 * tolerance(output_precision(g, id)).max(1e-6);
        let got = dt.decode(got.get(&uid).ok_or(format!("{}: output uid {uid} missing", g.name))?);
        let err = relative_error(&got, &want[&uid]);
        if err.is_nan() || err > bound {
            return Err(format!("{}: output uid {uid}: relative error {err:.3e} > {bound:.1e}", g.name));
        }
        worst = worst.max(err);
    }
    Ok(worst)
}

/// Device buffers for every io tensor of a plan's graph (inputs uploaded, outputs poisoned) and
/// its workspace.
struct DeviceIo {
    bufs: Vec<(i64, bool, DeviceBuffer)>,
    ws: DeviceBuffer,
}

impl DeviceIo {
    fn new(dev: &Arc<CudaDevice>, plan: &Plan, inputs: &HashMap<i64, Vec<u8>>) -> Res<DeviceIo> {
        let g = plan.graph();
        let mut bufs = Vec::new();
        for id in g.io_tensors() {
            let d = g.desc(id);
            let uid = d.uid.unwrap_or_default();
            let dt = g.resolved_data_type(id).unwrap_or(DataType::F32);
            let bytes = ferrodnn::layout::required_bytes(d, dt);
            let mut b = dev.alloc_for(bytes.max(1), &format!("tensor \"{}\"", d.name)).map_err(s)?;
            match inputs.get(&uid) {
                Some(host) => b.copy_from_host(host).map_err(s)?,
                None => b.copy_from_host(&vec![0xFFu8; bytes]).map_err(s)?,
            }
            bufs.push((uid, inputs.contains_key(&uid), b));
        }
        let ws = dev.alloc_for(plan.workspace_size().max(1), "the workspace").map_err(s)?;
        // Uploads ran on the legacy stream; the plans' streams do not wait for it.
        dev.synchronize().map_err(s)?;
        Ok(DeviceIo { bufs, ws })
    }

    fn pack(&self) -> VariantPack<'static> {
        let mut p = VariantPack::new();
        for (uid, _, b) in &self.bufs {
            p.device(*uid, b.device_ptr(), b.len());
        }
        p
    }

    fn workspace(&self) -> Option<Buffer<'static>> {
        Some(Buffer::Device { ptr: self.ws.device_ptr(), bytes: self.ws.len() })
    }

    fn outputs(&self) -> Res<HashMap<i64, Vec<u8>>> {
        self.bufs.iter().filter(|(_, input, _)| !input).map(|(uid, _, b)| Ok((*uid, b.to_host().map_err(s)?))).collect()
    }

    fn upload(&mut self, inputs: &HashMap<i64, Vec<u8>>) -> Res<()> {
        for (uid, input, b) in &mut self.bufs {
            if *input {
                b.copy_from_host(&inputs[uid]).map_err(s)?;
            }
        }
        Ok(())
    }
}

/// Execute `plan` on fresh device buffers holding `inputs`; the outputs by uid.
fn run_plan(handle: &Handle, plan: &Plan, inputs: &HashMap<i64, Vec<u8>>) -> Res<HashMap<i64, Vec<u8>>> {
    let dev = handle.cuda_device().ok_or("no GPU engine")?;
    let io = DeviceIo::new(dev, plan, inputs)?;
    plan.execute(&mut io.pack(), io.workspace()).map_err(s)?;
    handle.stream().ok_or("no stream")?.synchronize().map_err(s)?;
    io.outputs()
}

fn free_bytes(dev: &CudaDevice) -> Res<usize> {
    dev.memory_info().map(|(free, _)| free).map_err(s)
}

fn expect_err<T>(r: ferrodnn::Result<T>, what: &str, wants: &[&str]) -> Res<String> {
    match r {
        Ok(_) => Err(format!("{what}: succeeded, an error was expected")),
        Err(e) => {
            let m = e.to_string();
            for w in wants {
                if !m.contains(w) {
                    return Err(format!("{what}: the error `{m}` does not name `{w}`"));
                }
            }
            Ok(m)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The report
// ---------------------------------------------------------------------------------------------

struct Report {
    checks: Vec<Value>,
}

impl Report {
    /// Run one check (panics caught); its closure gives its figures.
    fn check(&mut self, name: &str, f: impl FnOnce() -> Res<Value>) {
        let start = Instant::now();
        let r = std::panic::catch_unwind(AssertUnwindSafe(f))
            .unwrap_or_else(|p| Err(format!("panicked: {}", p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default())));
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let mut rec = json!({ "name": name, "ms": ms });
        match r {
            Ok(figures) => {
                rec["passed"] = json!(true);
                if let Value::Object(m) = figures {
                    for (k, v) in m {
                        rec[k] = v;
                    }
                }
                outln!("PASS {name:<34} {:>9.0} ms", ms);
            }
            Err(e) => {
                rec["passed"] = json!(false);
                rec["detail"] = json!(e);
                outln!("FAIL {name:<34} {:>9.0} ms  {e}", ms);
            }
        }
        self.checks.push(rec);
    }
}

pub fn gpu_reliability(out: &Path, big: bool, cache_child: bool, compile: bool) -> Res<()> {
    if cache_child {
        return cache_child_main();
    }
    if compile {
        return compile_only(big);
    }
    let handle = Handle::cuda(0).map_err(|e| format!("gpu-reliability needs a GPU: {e}"))?;
    let dev = handle.cuda_device().ok_or("no GPU engine")?.clone();
    outln!("gpu-reliability on {} ({}), {} free", dev.name(), dev.arch(), ferrodnn::layout::format_bytes(free_bytes(&dev)? as u128));
    let start = Instant::now();
    let mut r = Report { checks: Vec::new() };
    r.check("oom_then_recover", || oom_then_recover(&handle, &dev));
    r.check("workspace_too_small", || workspace_too_small(&handle, &dev));
    r.check("host_pointer", || host_pointer(&handle, &dev));
    r.check("other_device_pointer", || other_device_pointer(&handle, &dev));
    r.check("foreign_stream", || foreign_stream(&handle, &dev));
    r.check("launch_failure", || launch_failure(&handle, &dev));
    r.check("threads_own_streams", || threads(&handle, false));
    r.check("threads_shared_stream", || threads(&handle, true));
    r.check("cuda_graph_capture", || graph_capture(&dev));
    r.check("two_processes_one_cache", two_processes_one_cache);
    if big {
        r.check("big_pointwise_2^31", || big_pointwise(&handle, &dev, (1 << 19) + 256, 4096));
        r.check("big_pointwise_2^32", || big_pointwise(&handle, &dev, (1 << 20) + 16, 4096));
        r.check("big_layernorm", || big_rows(&handle, &dev, RowOp::Layernorm, BIG_ROWS, 4096));
        r.check("big_softmax", || big_rows(&handle, &dev, RowOp::Softmax, BIG_ROWS, 4096));
        r.check("big_reduce_rows", || big_reduce(&handle, &dev, BIG_ROWS, 4096, &[1]));
        r.check("big_reduce_all", || big_reduce(&handle, &dev, BIG_ROWS, 4096, &[0, 1]));
        for (name, batch, m, k, n, chunk) in BIG_MATMULS {
            r.check(name, || big_matmul(&handle, &dev, batch, m, k, n, chunk));
        }
        for shape in BIG_SDPAS {
            r.check(shape.name, || big_sdpa(&handle, &dev, &shape));
        }
    }
    let failed: Vec<Value> = r.checks.iter().filter(|c| c["passed"] != json!(true)).map(|c| c["name"].clone()).collect();
    let report = json!({
        "device": dev.name(), "arch": dev.arch(), "big": big, "seconds": start.elapsed().as_secs_f64(),
        "passed": r.checks.len() - failed.len(), "failed": failed, "checks": r.checks,
    });
    std::fs::write(out, serde_json::to_string_pretty(&report).map_err(s)?).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    outln!("gpu-reliability: {} passed, {} failed, {:.1} s; report in {}", report["passed"], failed.len(), start.elapsed().as_secs_f64(), out.display());
    if !failed.is_empty() {
        return Err(format!("{} of {} checks failed: {failed:?}", failed.len(), report["checks"].as_array().map_or(0, |a| a.len())));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Item 4: faults
// ---------------------------------------------------------------------------------------------

fn oom_then_recover(handle: &Handle, dev: &Arc<CudaDevice>) -> Res<Value> {
    // A plan built (and its buffers made) before memory runs out.
    let mut g = mlp_graph(256, 512, 256);
    g.validate().map_err(s)?;
    let plan = handle.build_plans(&g, &cuda_policy()).map_err(s)?.remove(0);
    let inputs = input_bytes(&g, 1);
    let want = reference(&g, 1)?;
    let io = DeviceIo::new(dev, &plan, &inputs)?;
    // Run once first: the driver sizes the kernels' local memory at their first launch.
    plan.execute(&mut io.pack(), io.workspace()).map_err(s)?;
    handle.stream().ok_or("no stream")?.synchronize().map_err(s)?;
    let free_before = free_bytes(dev)?;

    // Allocate until the device refuses: 1 GiB blocks, then 16 MiB, then 1 MiB.
    let mut hog: Vec<DeviceBuffer> = Vec::new();
    let mut first_refusal = None;
    let mut refusals = 0;
    for chunk in [1usize << 30, 16 << 20, 1 << 20] {
        for _ in 0..200_000 {
            match dev.alloc(chunk) {
                Ok(b) => hog.push(b),
                Err(e) => {
                    refusals += 1;
                    if first_refusal.is_none() {
                        first_refusal = Some((chunk, e.to_string()));
                    }
                    break;
                }
            }
        }
    }
    let hogged: usize = hog.iter().map(|b| b.len()).sum();
    let (chunk, msg) = first_refusal.ok_or("no allocation was refused")?;
    if !(msg.contains(&format!("{chunk} bytes")) && msg.contains("free") && msg.contains("OUT_OF_MEMORY")) {
        return Err(format!("the refusal does not name the bytes asked, the free memory and the cause: {msg}"));
    }
    let free_exhausted = free_bytes(dev)?;

    // With the device full: a workspace and a tensor buffer for a new plan are refused by name.
    let ws_err = expect_err(dev.alloc_for(64 << 20, "the workspace of graph \"big_ws\""), "workspace allocation", &["the workspace of graph", "67108864 bytes", "free"])?;
    // A plan built now (its kernels' code needs device memory) either builds or says why.
    let mut g2 = layernorm_graph(512, 2048);
    g2.validate().map_err(s)?;
    let build_now = match handle.build_plans(&g2, &cuda_policy()) {
        Ok(_) => "built".to_string(),
        Err(e) => format!("refused: {e}"),
    };
    // Running a graph through the helpers that allocate its buffers: refused by name.
    let dense = execute_dense(handle, &g2, &random_inputs(&g2, 2), &cuda_policy());
    let dense_err = match dense {
        Ok(_) => "ran (memory sufficed)".to_string(),
        Err(e) => {
            let m = e.to_string();
            if !(m.contains("OUT_OF_MEMORY") && m.contains("free")) {
                return Err(format!("an allocation refused while running a graph is not named: {m}"));
            }
            m
        }
    };
    // The plan built before still runs with no free memory (execute allocates nothing).
    let before_exec = free_bytes(dev)?;
    plan.execute(&mut io.pack(), io.workspace()).map_err(|e| format!("execute with the device full: {e}"))?;
    handle.stream().ok_or("no stream")?.synchronize().map_err(s)?;
    check_against(&g, &io.outputs()?, &want).map_err(|e| format!("execute with the device full: {e}"))?;
    let after_exec = free_bytes(dev)?;

    drop(hog);
    // Recovery: the same handle runs a new graph and the old plan.
    let got = execute_dense(handle, &g2, &random_inputs(&g2, 2), &cuda_policy()).map_err(|e| format!("after freeing: {e}"))?;
    let want2 = reference(&g2, 2)?;
    let got2: HashMap<i64, Vec<u8>> = got.into_iter().map(|(id, nd)| (g2.uid(id).unwrap_or_default(), DataType::Bf16.encode(&nd.data))).collect();
    check_against(&g2, &got2, &want2).map_err(|e| format!("after freeing: {e}"))?;
    plan.execute(&mut io.pack(), io.workspace()).map_err(s)?;
    handle.stream().ok_or("no stream")?.synchronize().map_err(s)?;
    check_against(&g, &io.outputs()?, &want)?;
    let free_after = free_bytes(dev)?;
    Ok(json!({
        "bytes_hogged": hogged, "allocations_refused": refusals + 1, "first_refusal_bytes": chunk,
        "first_refusal": msg, "free_before": free_before, "free_when_exhausted": free_exhausted,
        "workspace_refusal": ws_err, "plan_build_when_full": build_now, "run_when_full": dense_err,
        "free_change_across_execute_when_full": after_exec as i64 - before_exec as i64, "free_after_recovery": free_after,
    }))
}

/// A plan of `workspace_graph` with a workspace, and its inputs and reference.
fn workspace_plan(handle: &Handle) -> Res<(Graph, Plan)> {
    let mut g = workspace_graph();
    g.validate().map_err(s)?;
    // (Exact plans only: the f32 reference's bound holds for them, not for a tf32 plan.)
    let plans = handle.build_plans(&g, &PlanPolicy { all_candidates: true, no_reduced_precision: true, ..cuda_policy() }).map_err(s)?;
    let plan = plans.into_iter().find(|p| p.workspace_size() > 0).ok_or("no CUDA plan of matmul -> softmax has a workspace")?;
    Ok((g, plan))
}

fn workspace_too_small(handle: &Handle, dev: &Arc<CudaDevice>) -> Res<Value> {
    let (g, plan) = workspace_plan(handle)?;
    let need = plan.workspace_size();
    let inputs = input_bytes(&g, 3);
    let io = DeviceIo::new(dev, &plan, &inputs)?;
    let small = dev.alloc(need - 1).map_err(s)?;
    let big = dev.alloc(need + 16).map_err(s)?;
    let free0 = free_bytes(dev)?;
    let m1 = expect_err(
        plan.execute(&mut io.pack(), Some(Buffer::Device { ptr: small.device_ptr(), bytes: small.len() })),
        "short workspace",
        &[&need.to_string(), &(need - 1).to_string()],
    )?;
    let m2 = expect_err(plan.execute(&mut io.pack(), None), "no workspace", &[&need.to_string()])?;
    let m3 = expect_err(plan.execute(&mut io.pack(), Some(Buffer::Device { ptr: 0, bytes: need })), "null workspace", &["workspace"])?;
    let m4 = expect_err(plan.execute(&mut io.pack(), Some(Buffer::Device { ptr: big.device_ptr() + 4, bytes: need })), "unaligned workspace", &["16-byte aligned"])?;
    let free1 = free_bytes(dev)?;
    if free0 != free1 {
        return Err(format!("device memory changed across the failed executes: {free0} -> {free1} free"));
    }
    plan.execute(&mut io.pack(), io.workspace()).map_err(s)?;
    handle.stream().ok_or("no stream")?.synchronize().map_err(s)?;
    let worst = check_against(&g, &io.outputs()?, &reference(&g, 3)?)?;
    Ok(json!({ "workspace_bytes": need, "errors": [m1, m2, m3, m4], "rel_error_after": worst }))
}

fn host_pointer(handle: &Handle, dev: &Arc<CudaDevice>) -> Res<Value> {
    let mut g = mlp_graph(64, 128, 64);
    g.validate().map_err(s)?;
    let plan = handle.build_plans(&g, &cuda_policy()).map_err(s)?.remove(0);
    let inputs = input_bytes(&g, 4);
    let io = DeviceIo::new(dev, &plan, &inputs)?;
    let host = vec![0u8; 64 * 128 * 2];
    let free0 = free_bytes(dev)?;
    let mut pack = io.pack();
    pack.device(1, host.as_ptr() as u64, host.len());
    let m1 = expect_err(plan.execute(&mut pack, io.workspace()), "host pointer", &["tensor \"x\"", "not device memory"])?;
    // A pointer past any allocation (the end of a device buffer, rounded far up).
    let mut pack = io.pack();
    let wild = (io.bufs[0].2.device_ptr() + (1u64 << 40)) & !0xFFF;
    pack.device(1, wild, host.len());
    let m2 = expect_err(plan.execute(&mut pack, io.workspace()), "unmapped pointer", &["not device memory"])?;
    if free_bytes(dev)? != free0 {
        return Err("device memory changed across the failed executes".into());
    }
    plan.execute(&mut io.pack(), io.workspace()).map_err(s)?;
    handle.stream().ok_or("no stream")?.synchronize().map_err(s)?;
    let worst = check_against(&g, &io.outputs()?, &reference(&g, 4)?)?;
    Ok(json!({ "errors": [m1, m2], "rel_error_after": worst }))
}

fn other_device_pointer(handle: &Handle, dev: &Arc<CudaDevice>) -> Res<Value> {
    let n = cuda::device_count().map_err(s)?;
    if n < 2 {
        return Ok(json!({ "skipped": true, "why": format!("{n} device(s): another device's pointer needs two") }));
    }
    let other = CudaDevice::open(1).map_err(s)?;
    let mut g = mlp_graph(64, 128, 64);
    g.validate().map_err(s)?;
    let plan = handle.build_plans(&g, &cuda_policy()).map_err(s)?.remove(0);
    let io = DeviceIo::new(dev, &plan, &input_bytes(&g, 5))?;
    let foreign = other.alloc(64 * 128 * 2).map_err(s)?;
    dev.bind().map_err(s)?;
    let mut pack = io.pack();
    pack.device(1, foreign.device_ptr(), foreign.len());
    let m = expect_err(plan.execute(&mut pack, io.workspace()), "another device's pointer", &["device memory of device 1"])?;
    plan.execute(&mut io.pack(), io.workspace()).map_err(s)?;
    handle.stream().ok_or("no stream")?.synchronize().map_err(s)?;
    let worst = check_against(&g, &io.outputs()?, &reference(&g, 5)?)?;
    Ok(json!({ "error": m, "rel_error_after": worst }))
}

fn foreign_stream(handle: &Handle, dev: &Arc<CudaDevice>) -> Res<Value> {
    let foreign = ForeignContextStream::new(dev).map_err(s)?;
    let before = handle.stream().ok_or("no stream")?.raw() as u64;
    // SAFETY: the stream is live (ForeignContextStream owns it); set_stream must refuse it.
    let m = expect_err(unsafe { handle.set_stream(foreign.raw()) }, "a stream of another context", &["set_stream", "another CUDA context"])?;
    if handle.stream().ok_or("no stream")?.raw() as u64 != before {
        return Err("the refused stream replaced the handle's".into());
    }
    drop(foreign);
    let mut g = mlp_graph(64, 128, 64);
    g.validate().map_err(s)?;
    let plan = handle.build_plans(&g, &cuda_policy()).map_err(s)?.remove(0);
    let got = run_plan(handle, &plan, &input_bytes(&g, 6))?;
    let worst = check_against(&g, &got, &reference(&g, 6)?)?;
    Ok(json!({ "error": m, "rel_error_after": worst }))
}

fn launch_failure(handle: &Handle, dev: &Arc<CudaDevice>) -> Res<Value> {
    let (g, plan) = workspace_plan(handle)?;
    let inputs = input_bytes(&g, 7);
    let want = reference(&g, 7)?;
    let io = DeviceIo::new(dev, &plan, &inputs)?;
    let stream = handle.stream().ok_or("no stream")?;
    let mut errors = Vec::new();
    // The first launch, then the second (after one has been enqueued) refused by the driver.
    for nth in [1u64, 2] {
        let free0 = free_bytes(dev)?;
        cuda::inject_launch_failure(nth);
        let r = plan.execute(&mut io.pack(), io.workspace());
        cuda::inject_launch_failure(0);
        errors.push(expect_err(r, &format!("launch {nth} refused"), &[&format!("graph \"{}\"", g.name), "cuLaunchKernel(`", "injected fault"])?);
        stream.synchronize().map_err(|e| format!("the stream after a refused launch: {e}"))?;
        if free_bytes(dev)? != free0 {
            return Err("device memory changed across the failed execute".into());
        }
        plan.execute(&mut io.pack(), io.workspace()).map_err(|e| format!("the execute after a refused launch: {e}"))?;
        stream.synchronize().map_err(s)?;
        check_against(&g, &io.outputs()?, &want).map_err(|e| format!("the execute after a refused launch: {e}"))?;
    }
    Ok(json!({ "faults_survived": errors.len(), "errors": errors }))
}

// ---------------------------------------------------------------------------------------------
// Item 6: concurrency, capture, the shared kernel cache
// ---------------------------------------------------------------------------------------------

const THREADS: usize = 8;
const ITERS: usize = 4;

fn threads(main: &Handle, shared: bool) -> Res<Value> {
    let graphs = small_graphs();
    // Single-threaded results, per thread's inputs (seed = thread) and graph.
    let mut expected: Vec<Vec<HashMap<i64, Vec<u8>>>> = Vec::new();
    for t in 0..THREADS {
        let mut per = Vec::new();
        for g in &graphs {
            let plan = main.build_plans(g, &cuda_policy()).map_err(s)?.remove(0);
            let inputs = input_bytes(g, 100 + t as u64);
            per.push(run_plan(main, &plan, &inputs)?);
        }
        expected.push(per);
    }
    // The single-threaded run is itself right.
    for (g, got) in graphs.iter().zip(&expected[0]) {
        check_against(g, got, &reference(g, 100)?)?;
    }
    let shared_handle = if shared { Some(Handle::cuda(0).map_err(s)?) } else { None };
    let executes = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<Res<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (graphs, expected, shared_handle, executes) = (&graphs, &expected, &shared_handle, &executes);
                scope.spawn(move || -> Res<()> {
                    let own;
                    let h = match shared_handle {
                        Some(h) => h,
                        None => {
                            own = Handle::cuda(0).map_err(s)?;
                            &own
                        }
                    };
                    let plans: Vec<Plan> = graphs.iter().map(|g| h.build_plans(g, &cuda_policy()).map(|mut v| v.remove(0))).collect::<ferrodnn::Result<_>>().map_err(s)?;
                    for it in 0..ITERS {
                        for (i, (g, plan)) in graphs.iter().zip(&plans).enumerate() {
                            let got = run_plan(h, plan, &input_bytes(g, 100 + t as u64))?;
                            executes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if got != expected[t][i] {
                                return Err(format!("thread {t}, iteration {it}, graph {}: the result differs from the single-threaded run's", g.name));
                            }
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into()))).collect()
    });
    for r in results {
        r?;
    }
    Ok(json!({ "threads": THREADS, "graphs": graphs.len(), "executes": executes.into_inner(), "streams": if shared { 1 } else { THREADS } }))
}

const REPLAYS: usize = 16;

fn graph_capture(dev: &Arc<CudaDevice>) -> Res<Value> {
    if !cuda::graph_capture_available() {
        return Err("the driver lacks the stream capture calls".into());
    }
    let handle = Handle::cuda(0).map_err(s)?;
    let stream = handle.stream().ok_or("no stream")?;
    let mut checked = 0;
    let mut names = Vec::new();
    for g in [mlp_graph(128, 256, 192), layernorm_graph(64, 768)] {
        let mut g = g;
        g.validate().map_err(s)?;
        let plan = handle.build_plans(&g, &cuda_policy()).map_err(s)?.remove(0);
        let mut io = DeviceIo::new(dev, &plan, &input_bytes(&g, 200))?;
        // A direct execute first (warm-up, as frameworks do before capturing).
        plan.execute(&mut io.pack(), io.workspace()).map_err(s)?;
        stream.synchronize().map_err(s)?;
        let graph = CapturedGraph::capture(&stream, || plan.execute(&mut io.pack(), io.workspace())).map_err(s)?;
        for r in 0..REPLAYS {
            let seed = 300 + r as u64;
            let inputs = input_bytes(&g, seed);
            // The direct result for these inputs, on buffers of its own.
            let direct = run_plan(&handle, &plan, &inputs)?;
            io.upload(&inputs)?;
            for (_, input, b) in &mut io.bufs {
                if !*input {
                    b.fill_async(0xFF, &stream).map_err(s)?;
                }
            }
            dev.synchronize().map_err(s)?;
            graph.launch(&stream).map_err(s)?;
            stream.synchronize().map_err(s)?;
            let replayed = io.outputs()?;
            if replayed != direct {
                return Err(format!("graph {}: replay {r} differs from a direct execute on the same inputs", g.name));
            }
            if r == 0 {
                check_against(&g, &replayed, &reference(&g, seed)?)?;
            }
            checked += 1;
        }
        names.push(g.name.clone());
    }
    Ok(json!({ "graphs": names, "replays": checked }))
}

/// The child of `two_processes_one_cache`: waits for the go file, builds and runs the small
/// graphs (through the kernel cache in $FERRODNN_CACHE_DIR), checks them against the reference
/// and prints the cache's counters.
fn cache_child_main() -> Res<()> {
    if let Some(go) = std::env::var_os("FERRODNN_CACHE_CHILD_GO") {
        let start = Instant::now();
        while !Path::new(&go).exists() && start.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let handle = Handle::cuda(0).map_err(s)?;
    for g in small_graphs() {
        let plan = handle.build_plans(&g, &cuda_policy()).map_err(s)?.remove(0);
        let got = run_plan(&handle, &plan, &input_bytes(&g, 9))?;
        check_against(&g, &got, &reference(&g, 9)?)?;
    }
    let st = KernelCache::global().stats();
    outln!("CACHE_CHILD compiles={} disk_hits={} corrupt={}", st.compiles, st.disk_hits, st.corrupt_entries);
    Ok(())
}

fn run_cache_children(dir: &Path, tag: &str) -> Res<Vec<(u64, u64, u64)>> {
    let go = dir.with_extension(format!("{tag}.go"));
    let _ = std::fs::remove_file(&go);
    let exe = std::env::current_exe().map_err(s)?;
    let children = (0..2)
        .map(|_| {
            std::process::Command::new(&exe)
                .args(["gpu-reliability", "--out", "/dev/null", "--cache-child"])
                .env("FERRODNN_CACHE_DIR", dir)
                .env_remove("FERRODNN_KERNEL_CACHE")
                .env("FERRODNN_CACHE_CHILD_GO", &go)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| format!("cannot start a child: {e}"))
        })
        .collect::<Res<Vec<_>>>()?;
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write(&go, b"go").map_err(s)?;
    let mut out = Vec::new();
    for c in children {
        let o = c.wait_with_output().map_err(s)?;
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        if !o.status.success() {
            return Err(format!("a child failed ({}): {text} {}", o.status, String::from_utf8_lossy(&o.stderr)));
        }
        let line = text.lines().find(|l| l.starts_with("CACHE_CHILD ")).ok_or(format!("no CACHE_CHILD line: {text}"))?;
        let field = |name: &str| -> u64 { line.split_whitespace().find_map(|w| w.strip_prefix(&format!("{name}="))).and_then(|v| v.parse().ok()).unwrap_or(u64::MAX) };
        out.push((field("compiles"), field("disk_hits"), field("corrupt")));
    }
    let _ = std::fs::remove_file(&go);
    Ok(out)
}

/// Every cache file is a whole valid entry; no temporary file is left. The entry count.
fn check_cache_folder(dir: &Path) -> Res<usize> {
    let mut n = 0;
    for e in std::fs::read_dir(dir).map_err(s)? {
        let path = e.map_err(s)?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
        if name.ends_with(".tmp") {
            return Err(format!("a temporary file was left: {name}"));
        }
        let Some(hex) = name.strip_suffix(".cubin") else { continue };
        let key = KernelKey(u128::from_str_radix(hex, 16).map_err(|e| format!("{name}: {e}"))?);
        cuda::cache::decode_entry(&std::fs::read(&path).map_err(s)?, key).map_err(|e| format!("{name}: {e}"))?;
        n += 1;
    }
    Ok(n)
}

fn two_processes_one_cache() -> Res<Value> {
    let dir: PathBuf = std::env::temp_dir().join(format!("ferrodnn-reliability-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(s)?;
    let first = run_cache_children(&dir, "fill")?;
    if first.iter().any(|r| r.2 != 0) {
        return Err(format!("a process saw a torn cache entry while both filled the folder: {first:?}"));
    }
    let entries = check_cache_folder(&dir)?;
    if entries == 0 {
        return Err("the children wrote no cache entry".into());
    }
    // Damage three entries: truncated, a flipped byte, garbage.
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).map_err(s)?.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "cubin")).collect();
    files.sort();
    let damaged = files.len().min(3);
    for (i, p) in files.iter().take(damaged).enumerate() {
        let mut b = std::fs::read(p).map_err(s)?;
        match i {
            0 => b.truncate(b.len() / 2),
            1 => {
                let at = b.len() - 17;
                b[at] ^= 0x20;
            }
            _ => b.iter_mut().for_each(|x| *x = 0x5a),
        }
        std::fs::write(p, &b).map_err(s)?;
    }
    let second = run_cache_children(&dir, "damaged")?;
    let corrupt: u64 = second.iter().map(|r| r.2).sum();
    if corrupt < damaged as u64 {
        return Err(format!("{damaged} entries damaged, {corrupt} detected: {second:?}"));
    }
    let after = check_cache_folder(&dir)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(
        json!({ "processes": 2, "entries": entries, "entries_after": after, "damaged": damaged, "first_run": format!("{first:?}"), "damaged_run": format!("{second:?}"), "corrupt_detected": corrupt }),
    )
}

// ---------------------------------------------------------------------------------------------
// Item 5: tensors past 2^31 elements
// ---------------------------------------------------------------------------------------------

fn f2bf(x: f32) -> u16 {
    let b = x.to_bits();
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}
fn bf2f(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Element `i` of input `seed`: a multiple of 1/64 in [-2, 2) (exact in bf16), from a hash.
fn val(seed: u64, i: u64) -> f32 {
    let mut z = i.wrapping_add(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    ((z & 255) as f32 - 128.0) / 64.0
}

fn gen_bf16(seed: u64, n: usize) -> Vec<u16> {
    gen_bf16_at(seed, n, 0)
}

/// `pad` zeros, then the `n` elements of input `seed` (a buffer whose data starts `pad`
/// elements in).
fn gen_bf16_at(seed: u64, n: usize, pad: usize) -> Vec<u16> {
    let mut v = vec![0u16; n + pad];
    v[pad..].par_chunks_mut(1 << 20).enumerate().for_each(|(c, chunk)| {
        for (j, x) in chunk.iter_mut().enumerate() {
            *x = f2bf(val(seed, (c << 20) as u64 + j as u64));
        }
    });
    v
}

fn as_bytes(v: &[u16]) -> &[u8] {
    // SAFETY: u16 has no padding and any byte pattern is a valid u8; the slice covers exactly the
    // vector's memory and borrows it.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, v.len() * 2) }
}

fn upload_bf16(dev: &Arc<CudaDevice>, v: &[u16], what: &str) -> Res<DeviceBuffer> {
    let mut b = dev.alloc_for(v.len() * 2, what).map_err(s)?;
    b.copy_from_host(as_bytes(v)).map_err(s)?;
    Ok(b)
}

fn download_bf16(b: &DeviceBuffer) -> Res<Vec<u16>> {
    let mut v = vec![0u16; b.len() / 2];
    // SAFETY: as in as_bytes, mutably: the vector's memory as bytes, for the copy to fill.
    let bytes = unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, v.len() * 2) };
    b.copy_to_host(bytes).map_err(s)?;
    Ok(v)
}

fn poisoned(dev: &Arc<CudaDevice>, bytes: usize, what: &str) -> Res<DeviceBuffer> {
    let mut b = dev.alloc_for(bytes, what).map_err(s)?;
    let stream = dev.new_stream().map_err(s)?;
    b.fill_async(0xFF, &stream).map_err(s)?;
    stream.synchronize().map_err(s)?;
    Ok(b)
}

/// Run `plan` with device buffers by uid, waiting for the stream.
fn exec_device(handle: &Handle, plan: &Plan, bufs: &[(i64, u64, usize)]) -> Res<()> {
    let dev = handle.cuda_device().ok_or("no GPU")?;
    let ws = dev.alloc_for(plan.workspace_size().max(1), &format!("the workspace of graph \"{}\"", plan.graph().name)).map_err(s)?;
    let mut pack = VariantPack::new();
    for &(uid, ptr, bytes) in bufs {
        pack.device(uid, ptr, bytes);
    }
    plan.execute(&mut pack, Some(Buffer::Device { ptr: ws.device_ptr(), bytes: ws.len() })).map_err(s)?;
    handle.stream().ok_or("no stream")?.synchronize().map_err(s)
}

fn build(handle: &Handle, mut g: Graph) -> Res<(Graph, Plan)> {
    g.validate().map_err(s)?;
    let plan = handle.build_plans(&g, &cuda_policy()).map_err(s)?.remove(0);
    Ok((g, plan))
}

/// Count elements whose |got - want| exceeds `tol * (abs + |want|)`; also NaN (poison left).
fn count_bad(got: &[u16], want: impl Fn(usize) -> f64 + Sync, tol: f64, abs: f64) -> (usize, Option<usize>, f64) {
    let per: Vec<(usize, Option<usize>, f64)> = got
        .par_chunks(1 << 20)
        .enumerate()
        .map(|(c, chunk)| {
            let mut bad = 0;
            let mut first = None;
            let mut worst: f64 = 0.0;
            for (j, &h) in chunk.iter().enumerate() {
                let i = (c << 20) + j;
                let (g, w) = (bf2f(h) as f64, want(i));
                let d = (g - w).abs();
                if d.is_nan() || d > tol * (abs + w.abs()) {
                    bad += 1;
                    first.get_or_insert(i);
                }
                if !d.is_nan() {
                    worst = worst.max(d / (abs + w.abs()));
                }
            }
            (bad, first, worst)
        })
        .collect();
    per.into_iter().fold((0, None, 0.0), |(b, f, w), (b2, f2, w2)| (b + b2, f.or(f2), w.max(w2)))
}

fn big_pointwise(handle: &Handle, dev: &Arc<CudaDevice>, rows: i64, cols: i64) -> Res<Value> {
    let n = (rows * cols) as usize;
    let (_, plan) = build(handle, pointwise_graph(rows, cols))?;
    let x = upload_bf16(dev, &gen_bf16(1, n), "x")?;
    let b = upload_bf16(dev, &gen_bf16(2, cols as usize), "b")?;
    let y = poisoned(dev, n * 2, "y")?;
    exec_device(handle, &plan, &[(1, x.device_ptr(), x.len()), (2, b.device_ptr(), b.len()), (3, y.device_ptr(), y.len())])?;
    drop(x);
    let got = download_bf16(&y)?;
    let c = cols as usize;
    let want = |i: usize| bf2f(f2bf((val(1, i as u64) + val(2, (i % c) as u64)).max(0.0))) as f64;
    let (bad, first, worst) = count_bad(&got, want, 1.0 / 128.0, 1e-30);
    if bad > 0 {
        return Err(format!("{bad} of {n} elements wrong (first at {first:?})"));
    }
    Ok(json!({ "elements": n, "bytes_per_tensor": n * 2, "worst_rel": worst, "reference": "host, every element (inputs a hash of the index)" }))
}

#[derive(Clone, Copy)]
enum RowOp {
    Layernorm,
    Softmax,
}

fn big_rows(handle: &Handle, dev: &Arc<CudaDevice>, op: RowOp, rows: i64, h: i64) -> Res<Value> {
    let n = (rows * h) as usize;
    let hu = h as usize;
    let g = match op {
        RowOp::Layernorm => layernorm_graph(rows, h),
        RowOp::Softmax => softmax_graph(rows, h, DataType::Bf16),
    };
    let (_, plan) = build(handle, g)?;
    let x = upload_bf16(dev, &gen_bf16(11, n), "x")?;
    let y = poisoned(dev, n * 2, "y")?;
    let (sc, bi) = (upload_bf16(dev, &gen_bf16(12, hu), "scale")?, upload_bf16(dev, &gen_bf16(13, hu), "bias")?);
    match op {
        RowOp::Layernorm => {
            exec_device(handle, &plan, &[(1, x.device_ptr(), x.len()), (2, sc.device_ptr(), sc.len()), (3, bi.device_ptr(), bi.len()), (4, y.device_ptr(), y.len())])?
        }
        RowOp::Softmax => exec_device(handle, &plan, &[(1, x.device_ptr(), x.len()), (2, y.device_ptr(), y.len())])?,
    }
    drop(x);
    let got = download_bf16(&y)?;
    // Per-row statistics on the host, in f64.
    let stats: Vec<(f64, f64)> = (0..rows as usize)
        .into_par_iter()
        .map(|r| {
            let xs = (0..hu).map(|j| val(11, (r * hu + j) as u64) as f64);
            match op {
                RowOp::Layernorm => {
                    let mean = xs.clone().sum::<f64>() / h as f64;
                    let var = xs.map(|v| (v - mean) * (v - mean)).sum::<f64>() / h as f64;
                    (mean, 1.0 / (var + 1e-5).sqrt())
                }
                RowOp::Softmax => {
                    let m = xs.clone().fold(f64::NEG_INFINITY, f64::max);
                    (m, xs.map(|v| (v - m).exp()).sum::<f64>())
                }
            }
        })
        .collect();
    let want = |i: usize| {
        let (r, j) = (i / hu, i % hu);
        let v = val(11, i as u64) as f64;
        match op {
            RowOp::Layernorm => (v - stats[r].0) * stats[r].1 * val(12, j as u64) as f64 + val(13, j as u64) as f64,
            RowOp::Softmax => (v - stats[r].0).exp() / stats[r].1,
        }
    };
    let (tol, abs) = match op {
        RowOp::Layernorm => (2e-2, 1.0),
        RowOp::Softmax => (2e-2, 1e-6),
    };
    let (bad, first, worst) = count_bad(&got, want, tol, abs);
    if bad > 0 {
        return Err(format!("{bad} of {n} elements wrong (first at {first:?})"));
    }
    Ok(json!({ "elements": n, "rows": rows, "row_length": h, "worst_rel": worst, "reference": "host f64 per row, every element" }))
}

fn big_reduce(handle: &Handle, dev: &Arc<CudaDevice>, rows: i64, cols: i64, axes: &[usize]) -> Res<Value> {
    let n = (rows * cols) as usize;
    let (g, plan) = build(handle, reduce_graph(rows, cols, DataType::Bf16, axes))?;
    // Non-negative values (no cancellation in the sum): |v|.
    let mut xs = gen_bf16(21, n);
    xs.par_iter_mut().for_each(|v| *v &= 0x7FFF);
    let x = upload_bf16(dev, &xs, "x")?;
    drop(xs);
    let outs = g.desc(g.output_tensors()[0]).element_count() as usize;
    let y = poisoned(dev, outs * 4, "y")?;
    exec_device(handle, &plan, &[(1, x.device_ptr(), x.len()), (2, y.device_ptr(), y.len())])?;
    let got: Vec<f32> = y.to_host().map_err(s)?.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let cu = cols as usize;
    let want: Vec<f64> = if axes.len() == 2 {
        let per: Vec<f64> = (0..rows as usize).into_par_iter().map(|r| (0..cu).map(|j| val(21, (r * cu + j) as u64).abs() as f64).sum::<f64>()).collect();
        vec![per.iter().sum()]
    } else {
        (0..rows as usize).into_par_iter().map(|r| (0..cu).map(|j| val(21, (r * cu + j) as u64).abs() as f64).sum::<f64>()).collect()
    };
    let mut worst: f64 = 0.0;
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let e = (g as f64 - w).abs() / w.abs().max(1.0);
        if e.is_nan() || e > 1e-4 {
            return Err(format!("output {i}: got {g}, want {w} (relative error {e:.2e})"));
        }
        worst = worst.max(e);
    }
    Ok(json!({ "elements": n, "outputs": outs, "worst_rel": worst, "reference": "host f64 sums, every output" }))
}

/// C [batch, m, n] = A [batch, m, k] @ B [batch, k, n], bf16 (batch 1: plain 2-D tensors):
/// uids a 1, b 2, c 3.
fn matmul_graph(batch: i64, m: i64, k: i64, n: i64) -> Graph {
    let dims = |r: i64, c: i64| if batch == 1 { vec![r, c] } else { vec![batch, r, c] };
    let mut g = Graph::new(format!("matmul_{batch}x{m}x{k}x{n}")).io_data_type(DataType::Bf16).intermediate_data_type(DataType::F32).compute_data_type(DataType::F32);
    let a = g.tensor(TensorDesc::new("a", &dims(m, k), DataType::Bf16).with_uid(1));
    let b = g.tensor(TensorDesc::new("b", &dims(k, n), DataType::Bf16).with_uid(2));
    let c = g.matmul(a, b);
    g.set_output(c);
    g.desc_mut(c).uid = Some(3);
    g.desc_mut(c).name = "c".into();
    g.desc_mut(c).data_type = Some(DataType::Bf16);
    g
}

/// The big checks' shapes: (name, what it runs).
const BIG_MATMULS: [(&str, i64, i64, i64, i64, i64); 2] = [("big_matmul_output", 1, (1 << 16) + 4096, 64, 32768, 4096), ("big_matmul_batched_operand", 1040, 1024, 2048, 64, 65)];
const BIG_ROWS: i64 = (1 << 19) + 8;

/// Every graph the checks build plans for (the big ones with `big`), for `--compile-only`.
fn all_graphs(big: bool) -> Vec<Graph> {
    let mut v = small_graphs();
    v.extend([mlp_graph(256, 512, 256), layernorm_graph(512, 2048), workspace_graph(), mlp_graph(64, 128, 64), mlp_graph(128, 256, 192), layernorm_graph(64, 768)]);
    if big {
        v.extend([pointwise_graph((1 << 19) + 256, 4096), pointwise_graph((1 << 20) + 16, 4096), layernorm_graph(BIG_ROWS, 4096), softmax_graph(BIG_ROWS, 4096, DataType::Bf16)]);
        v.extend([reduce_graph(BIG_ROWS, 4096, DataType::Bf16, &[1]), reduce_graph(BIG_ROWS, 4096, DataType::Bf16, &[0, 1])]);
        for (_, batch, m, k, n, chunk) in BIG_MATMULS {
            v.push(matmul_graph(batch, m, k, n));
            v.push(if batch == 1 { matmul_graph(1, chunk, k, n) } else { matmul_graph(chunk, m, k, n) });
        }
        for t in BIG_SDPAS {
            v.push(sdpa_graph(&t, t.b));
            v.push(sdpa_graph(&t, t.chunk));
        }
    }
    v
}

/// Generate and compile (NVRTC, no GPU) every kernel of every plan the checks build, for
/// sm_90a with 132 SMs (an H100 SXM), into the kernel cache ($FERRODNN_CACHE_DIR): a check that
/// the big shapes plan, and a cache the GPU run can start from.
fn compile_only(big: bool) -> Res<()> {
    use cuda::{compile_cached, CompileOptions, Target};
    let target = Target::new("sm_90a", 132);
    let opts = CompileOptions::new("sm_90a");
    let mut sources = std::collections::BTreeMap::new();
    for mut g in all_graphs(big) {
        g.validate().map_err(|e| format!("{}: {e}", g.name))?;
        let list = cuda::kernel_sources(&g, &target).map_err(|e| format!("{}: {e}", g.name))?;
        let entries: Vec<&str> = list.iter().map(|(e, _)| e.as_str()).collect();
        outln!("{}: {}", g.name, entries.join(" "));
        for (entry, src) in list {
            sources.entry(src).or_insert(entry);
        }
    }
    let failed: Vec<String> =
        sources.par_iter().filter_map(|(src, entry)| compile_cached(KernelCache::global(), src, entry, &opts).err().map(|e| format!("{entry}: {e}"))).collect();
    outln!("compiled {} kernels for sm_90a; {} failed", sources.len(), failed.len());
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("\n"))
    }
}

/// Checked against small plans over `chunk` rows (batch 1) or `chunk` batches, and host f64
/// products of sampled rows.
fn big_matmul(handle: &Handle, dev: &Arc<CudaDevice>, batch: i64, m: i64, k: i64, n: i64, chunk: i64) -> Res<Value> {
    let graph = |batch: i64, m: i64| matmul_graph(batch, m, k, n);
    let (na, nb, nc) = ((batch * m * k) as usize, (batch * k * n) as usize, (batch * m * n) as usize);
    let (_, big) = build(handle, graph(batch, m))?;
    let (_, small) = if batch == 1 { build(handle, graph(1, chunk))? } else { build(handle, graph(chunk, m))? };
    let a = upload_bf16(dev, &gen_bf16(31, na), "a")?;
    let b = upload_bf16(dev, &gen_bf16(32, nb), "b")?;
    let c = poisoned(dev, nc * 2, "c")?;
    let cref = poisoned(dev, nc * 2, "c (reference)")?;
    exec_device(handle, &big, &[(1, a.device_ptr(), a.len()), (2, b.device_ptr(), b.len()), (3, c.device_ptr(), c.len())])?;
    // The reference: chunks, each a small plan on slices (offsets into the operands).
    let pieces = if batch == 1 { m / chunk } else { batch / chunk };
    if pieces * chunk != if batch == 1 { m } else { batch } {
        return Err("the chunk must divide the problem".into());
    }
    for p in 0..pieces as u64 {
        let (ca, cb, cc) = if batch == 1 { ((chunk * k) as u64, 0, (chunk * n) as u64) } else { ((chunk * m * k) as u64, (chunk * k * n) as u64, (chunk * m * n) as u64) };
        exec_device(
            handle,
            &small,
            &[
                (1, a.device_ptr() + 2 * p * ca, 2 * ca as usize),
                (2, b.device_ptr() + 2 * p * cb, if batch == 1 { b.len() } else { 2 * cb as usize }),
                (3, cref.device_ptr() + 2 * p * cc, 2 * cc as usize),
            ],
        )?;
    }
    drop(a);
    let got = download_bf16(&c)?;
    drop(c);
    let want = download_bf16(&cref)?;
    let (bad, first, worst) = count_bad(&got, |i| bf2f(want[i]) as f64, 2e-2, 1.0);
    if bad > 0 {
        return Err(format!("{bad} of {nc} elements differ from the chunked reference (first at {first:?})"));
    }
    // Host f64 rows: the first, the last, and those holding element 2^31 (and around it).
    let rows_total = (batch * m) as u64;
    let (nu, ku, mu) = (n as u64, k as u64, m as u64);
    let mut rows: Vec<u64> = vec![0, 1, rows_total - 1, rows_total / 2];
    // (The rows of C, and of A, that hold their element 2^31.)
    for pivot in [(1u64 << 31) / nu, (1u64 << 31) / ku] {
        rows.extend((pivot.saturating_sub(2)..pivot + 3).filter(|&r| r < rows_total));
    }
    rows.sort_unstable();
    rows.dedup();
    let mut host_worst: f64 = 0.0;
    for &r in &rows {
        let (bi, i) = (r / mu, r % mu);
        for j in 0..nu {
            let dot: f64 = (0..ku).map(|t| val(31, bi * mu * ku + i * ku + t) as f64 * val(32, bi * ku * nu + t * nu + j) as f64).sum();
            let g = bf2f(got[(r * nu + j) as usize]) as f64;
            let e = (g - dot).abs() / (1.0 + dot.abs());
            if e.is_nan() || e > 2e-2 {
                return Err(format!("row {r}, column {j}: got {g}, the host product is {dot}"));
            }
            host_worst = host_worst.max(e);
        }
    }
    Ok(json!({
        "a_elements": na, "b_elements": nb, "c_elements": nc, "largest_tensor_elements": na.max(nc),
        "worst_rel_vs_chunks": worst, "worst_rel_vs_host_rows": host_worst, "host_rows": rows,
        "reference": format!("{pieces} small plans on {chunk}-{} slices, and host f64 products of {} rows", if batch == 1 { "row" } else { "batch" }, rows.len()),
    }))
}

/// An sdpa forward of the big checks: q [b, h, s_q, d], k and v [b, h, s_kv, d], o like q (bf16,
/// contiguous), top-left causal or not; `misaligned`: every base one element (2 bytes) past a
/// 16-byte boundary, so that the plan runs its element-wise alternative kernels; the reference
/// runs the same graph on `chunk` batches at a time.
#[derive(Clone, Copy)]
struct BigSdpa {
    name: &'static str,
    b: i64,
    h: i64,
    s_q: i64,
    s_kv: i64,
    d: i64,
    causal: bool,
    misaligned: bool,
    chunk: i64,
}

/// Q/K/V/O of the first two: 2050 * 64 * 128 * 128 = 2^31 + 2^21 elements each (the smallest
/// batch past 2^31 that two slices below 2^31 split evenly); the decode one's K and V:
/// 16 * 8 * (2^17 + 128) * 128 = 2^31 + 2^21.
const BIG_SDPAS: [BigSdpa; 3] = [
    BigSdpa { name: "big_sdpa", b: 2050, h: 64, s_q: 128, s_kv: 128, d: 128, causal: false, misaligned: false, chunk: 1025 },
    BigSdpa { name: "big_sdpa_causal_unaligned", b: 2050, h: 64, s_q: 128, s_kv: 128, d: 128, causal: true, misaligned: true, chunk: 1025 },
    BigSdpa { name: "big_sdpa_decode_kv", b: 16, h: 8, s_q: 1, s_kv: (1 << 17) + 128, d: 128, causal: false, misaligned: false, chunk: 8 },
];

/// The sdpa of `t` on `b` batches: uids q 1, k 2, v 3, o 4.
fn sdpa_graph(t: &BigSdpa, b: i64) -> Graph {
    let name = format!("sdpa_b{b}h{}sq{}skv{}d{}{}", t.h, t.s_q, t.s_kv, t.d, if t.causal { "_causal" } else { "" });
    let mut g = Graph::new(name).io_data_type(DataType::Bf16).intermediate_data_type(DataType::F32).compute_data_type(DataType::F32);
    let q = g.tensor(TensorDesc::new("q", &[b, t.h, t.s_q, t.d], DataType::Bf16).with_uid(1));
    let k = g.tensor(TensorDesc::new("k", &[b, t.h, t.s_kv, t.d], DataType::Bf16).with_uid(2));
    let v = g.tensor(TensorDesc::new("v", &[b, t.h, t.s_kv, t.d], DataType::Bf16).with_uid(3));
    let attrs = SdpaAttrs { causal: t.causal.then_some(CausalAlignment::TopLeft), ..Default::default() };
    let (o, _) = g.sdpa(q, k, v, SdpaInputs::default(), attrs);
    g.set_output(o);
    g.desc_mut(o).uid = Some(4);
    g.desc_mut(o).name = "o".into();
    g.desc_mut(o).data_type = Some(DataType::Bf16);
    g
}

/// Host f64 attention of one (batch, head) `bh` of `t` (inputs seeds 41-43, contiguous): its
/// [s_q, d] output.
fn host_head(t: &BigSdpa, bh: u64) -> Vec<f64> {
    let (sq, skv, d) = (t.s_q as u64, t.s_kv as u64, t.d as u64);
    let scale = 1.0 / (t.d as f64).sqrt();
    let mut out = vec![0.0; (sq * d) as usize];
    for i in 0..sq {
        let visible = if t.causal { (i + 1).min(skv) } else { skv };
        let scores: Vec<f64> = (0..visible).map(|j| (0..d).map(|c| val(41, (bh * sq + i) * d + c) as f64 * val(42, (bh * skv + j) * d + c) as f64).sum::<f64>() * scale).collect();
        let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
        let sum: f64 = p.iter().sum();
        for c in 0..d {
            out[(i * d + c) as usize] = (0..visible).map(|j| p[j as usize] * val(43, (bh * skv + j) * d + c) as f64).sum::<f64>() / sum;
        }
    }
    out
}

fn big_sdpa(handle: &Handle, dev: &Arc<CudaDevice>, t: &BigSdpa) -> Res<Value> {
    let (nq, nkv) = ((t.b * t.h * t.s_q * t.d) as usize, (t.b * t.h * t.s_kv * t.d) as usize);
    let pad = t.misaligned as usize;
    let (_, big) = build(handle, sdpa_graph(t, t.b))?;
    let (_, small) = build(handle, sdpa_graph(t, t.chunk))?;
    let q = upload_bf16(dev, &gen_bf16_at(41, nq, pad), "q")?;
    let k = upload_bf16(dev, &gen_bf16_at(42, nkv, pad), "k")?;
    let v = upload_bf16(dev, &gen_bf16_at(43, nkv, pad), "v")?;
    let o = poisoned(dev, (nq + pad) * 2, "o")?;
    let oref = poisoned(dev, (nq + pad) * 2, "o (reference)")?;
    let at = |b: &DeviceBuffer| b.device_ptr() + 2 * pad as u64;
    exec_device(handle, &big, &[(1, at(&q), nq * 2), (2, at(&k), nkv * 2), (3, at(&v), nkv * 2), (4, at(&o), nq * 2)])?;
    // The reference: the same sdpa on slices of `chunk` batches (offsets into the buffers).
    let pieces = t.b / t.chunk;
    if pieces * t.chunk != t.b {
        return Err("the chunk must divide the batch".into());
    }
    let (cq, ckv) = ((t.chunk * t.h * t.s_q * t.d) as u64, (t.chunk * t.h * t.s_kv * t.d) as u64);
    for p in 0..pieces as u64 {
        exec_device(
            handle,
            &small,
            &[
                (1, at(&q) + 2 * p * cq, 2 * cq as usize),
                (2, at(&k) + 2 * p * ckv, 2 * ckv as usize),
                (3, at(&v) + 2 * p * ckv, 2 * ckv as usize),
                (4, at(&oref) + 2 * p * cq, 2 * cq as usize),
            ],
        )?;
    }
    drop((q, k, v));
    let got = download_bf16(&o)?;
    drop(o);
    let want = download_bf16(&oref)?;
    let (got, want) = (&got[pad..], &want[pad..]);
    let (bad, first, worst) = count_bad(got, |i| bf2f(want[i]) as f64, 2e-2, 1.0);
    if bad > 0 {
        return Err(format!("{bad} of {nq} elements of o differ from the chunked reference (first at {first:?})"));
    }
    // Host f64 heads: the first, the last, and those holding element 2^31 of Q/O and of K/V.
    let heads = (t.b * t.h) as u64;
    let mut sampled: Vec<u64> = vec![0, heads - 1];
    for per_head in [(t.s_q * t.d) as u64, (t.s_kv * t.d) as u64] {
        let pivot = (1u64 << 31) / per_head;
        sampled.extend((pivot.saturating_sub(1)..pivot + 2).filter(|&x| x < heads));
    }
    sampled.sort_unstable();
    sampled.dedup();
    let per = (t.s_q * t.d) as u64;
    let host_worst = sampled
        .par_iter()
        .map(|&bh| {
            let ref_head = host_head(t, bh);
            let mut worst: f64 = 0.0;
            for (x, &w) in ref_head.iter().enumerate() {
                let g = bf2f(got[(bh * per) as usize + x]) as f64;
                let e = (g - w).abs() / (1.0 + w.abs());
                if e.is_nan() || e > 2e-2 {
                    return Err(format!("head {bh}, element {x}: got {g}, the host attention gives {w}"));
                }
                worst = worst.max(e);
            }
            Ok(worst)
        })
        .collect::<Res<Vec<f64>>>()?
        .into_iter()
        .fold(0.0, f64::max);
    Ok(json!({
        "q_o_elements": nq, "k_v_elements": nkv, "largest_tensor_elements": nq.max(nkv), "causal": t.causal, "misaligned_bases": t.misaligned,
        "plan": big.explain(), "worst_rel_vs_chunks": worst, "worst_rel_vs_host_heads": host_worst, "host_heads": sampled,
        "reference": format!("{pieces} plans on {}-batch slices, and host f64 attention of {} heads", t.chunk, sampled.len()),
    }))
}
