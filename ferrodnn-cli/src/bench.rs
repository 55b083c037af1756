//! `ferrodnn bench`: time the workloads of a named suite on the GPU with CUDA events (warm-up,
//! median of many runs, inputs rotated when they fit in L2), and report each plan's build time
//! (first build in this process, then a rebuild through the plan cache). `bench/run.py` runs this
//! next to PyTorch on the same shapes and writes bench/results/<gpu>.json and BENCHMARKS.md.

use ferrodnn::engine::cuda::{DeviceBuffer, Event};
use ferrodnn::engine::{Buffer, PlanPolicy};
use ferrodnn::graph::ops::norm::{BatchnormAttrs, NormAttrs};
use ferrodnn::graph::ops::pointwise::PointwiseMode;
use ferrodnn::graph::ops::reduction::ReductionMode;
use ferrodnn::graph::ops::resample::ResampleAttrs;
use ferrodnn::layout::required_bytes;
use ferrodnn::testing::{random_values, SplitMix64};
use ferrodnn::{DataType, EngineKind, Graph, Handle, TensorDesc, VariantPack};
use serde_json::json;
use std::time::Instant;

/// A workload: its id (`<op>_<pass>_<dtype>_<shape>`), its graph, and the FLOPs it must do.
pub struct Workload {
    pub id: String,
    pub graph: Graph,
    pub flops: Option<u64>,
}

fn out(g: &mut Graph, t: ferrodnn::TensorId, dt: DataType) {
    g.set_output(t);
    g.desc_mut(t).data_type = Some(dt);
}

fn rows(t: i64, h: i64, what: &str) -> (Graph, ferrodnn::TensorId, ferrodnn::TensorId, ferrodnn::TensorId) {
    let bf = DataType::Bf16;
    let mut g = Graph::new(format!("{what}_bf16_{t}x{h}")).io_data_type(bf);
    let x = g.tensor(TensorDesc::new("x", &[t, h], bf));
    let scale = g.tensor(TensorDesc::new("scale", &[1, h], bf));
    let bias = g.tensor(TensorDesc::new("bias", &[1, h], bf));
    (g, x, scale, bias)
}

/// Layernorm, RMSNorm (no bias) and softmax forward over `t` rows of `h`, bf16 (inference).
fn norm_fwd(t: i64, h: i64) -> Vec<Workload> {
    let bf = DataType::Bf16;
    let mut v = Vec::new();
    let (mut g, x, s, b) = rows(t, h, "layernorm_fwd");
    let (y, _, _) = g.layernorm(x, s, b, NormAttrs::inference());
    out(&mut g, y, bf);
    v.push(Workload { id: format!("layernorm_fwd_bf16_{t}x{h}"), graph: g, flops: None });

    let (mut g, x, s, _) = rows(t, h, "rmsnorm_fwd");
    g.tensors.pop(); // no bias
    let (y, _) = g.rmsnorm(x, s, None, NormAttrs::inference());
    out(&mut g, y, bf);
    v.push(Workload { id: format!("rmsnorm_fwd_bf16_{t}x{h}"), graph: g, flops: None });

    let mut g = Graph::new(format!("softmax_fwd_bf16_{t}x{h}")).io_data_type(bf);
    let x = g.tensor(TensorDesc::new("x", &[t, h], bf));
    let (y, _) = g.softmax(x, 1, false, false);
    out(&mut g, y, bf);
    v.push(Workload { id: format!("softmax_fwd_bf16_{t}x{h}"), graph: g, flops: None });
    v
}

/// The memory-bound suite of the fusion issue.
fn memory_bound() -> Vec<Workload> {
    let bf = DataType::Bf16;
    let f32 = DataType::F32;
    let mut v = Vec::new();
    for (t, h) in [(16384i64, 4096i64), (65536, 1024)] {
        v.extend(norm_fwd(t, h));

        let (mut g, x, s, _) = rows(t, h, "layernorm_bwd");
        g.tensors.pop();
        let dy = g.tensor(TensorDesc::new("dy", &[t, h], bf));
        let mean = g.tensor(TensorDesc::new("mean", &[t, 1], f32));
        let inv = g.tensor(TensorDesc::new("inv_variance", &[t, 1], f32));
        let (dx, ds, db) = g.layernorm_backward(dy, x, s, mean, inv);
        out(&mut g, dx, bf);
        out(&mut g, ds, bf);
        out(&mut g, db, bf);
        v.push(Workload { id: format!("layernorm_bwd_bf16_{t}x{h}"), graph: g, flops: None });

        let (mut g, x, s, _) = rows(t, h, "rmsnorm_bwd");
        g.tensors.pop();
        let dy = g.tensor(TensorDesc::new("dy", &[t, h], bf));
        let inv = g.tensor(TensorDesc::new("inv_variance", &[t, 1], f32));
        let (dx, ds, db) = g.rmsnorm_backward(dy, x, s, inv, true);
        out(&mut g, dx, bf);
        out(&mut g, ds, bf);
        if let Some(db) = db {
            out(&mut g, db, bf);
        }
        v.push(Workload { id: format!("rmsnorm_bwd_bf16_{t}x{h}"), graph: g, flops: None });
    }
    let h16 = DataType::F16;
    let mut g = Graph::new("batchnorm_train_fwd_fp16_nhwc_32x256x56x56").io_data_type(h16);
    let x = g.tensor(TensorDesc::new("x", &[32, 256, 56, 56], h16).with_layout(&[0, 2, 3, 1]));
    let s = g.tensor(TensorDesc::new("scale", &[1, 256, 1, 1], f32));
    let b = g.tensor(TensorDesc::new("bias", &[1, 256, 1, 1], f32));
    let rm = g.tensor(TensorDesc::new("running_mean", &[1, 256, 1, 1], f32));
    let rv = g.tensor(TensorDesc::new("running_var", &[1, 256, 1, 1], f32));
    let (y, mean, inv, running) = g.batchnorm(x, s, b, Some((rm, rv)), &[], BatchnormAttrs::default());
    out(&mut g, y, h16);
    out(&mut g, mean, f32);
    out(&mut g, inv, f32);
    if let Some((a, c)) = running {
        out(&mut g, a, f32);
        out(&mut g, c, f32);
    }
    v.push(Workload { id: "batchnorm_train_fwd_fp16_nhwc_32x256x56x56".into(), graph: g, flops: None });
    for (name, attrs) in [("maxpool3x3s2", ResampleAttrs::max_2d(3, 2, 1)), ("avgpool3x3s2", ResampleAttrs::avg_2d(3, 2, 1, true))] {
        let mut g = Graph::new(format!("{name}_fwd_fp16_nhwc_32x64x112x112")).io_data_type(h16);
        let x = g.tensor(TensorDesc::new("x", &[32, 64, 112, 112], h16).with_layout(&[0, 2, 3, 1]));
        let y = g.resample(x, attrs);
        out(&mut g, y, h16);
        v.push(Workload { id: format!("{name}_fwd_fp16_nhwc_32x64x112x112"), graph: g, flops: None });
    }
    // Five pointwise ops on two inputs: y = sigmoid((a * b + a) * 0.5) * b.
    let mut g = Graph::new("pointwise_chain5_bf16_16384x4096").io_data_type(bf);
    let a = g.tensor(TensorDesc::new("a", &[16384, 4096], bf));
    let b = g.tensor(TensorDesc::new("b", &[16384, 4096], bf));
    let half = g.scalar("half", 0.5);
    let t = g.mul(a, b);
    let t = g.add(t, a);
    let t = g.scale(t, half);
    let t = g.pointwise(PointwiseMode::Sigmoid, &[t]);
    let y = g.mul(t, b);
    out(&mut g, y, bf);
    v.push(Workload { id: "pointwise_chain5_bf16_16384x4096".into(), graph: g, flops: None });
    v.extend(crate::bench_memory::workloads());
    v
}

/// The small-sizes suite of the shapes issue (norms, softmax and pointwise chains of one row up
/// to 64 rows, bf16), where the host's time per execute, not the GPU's, sets the rate; and two
/// single-kernel plans with TMA tensor maps (a small matmul and a small attention) for the host
/// time of plans that encode maps at execute.
fn small() -> Vec<Workload> {
    let bf = DataType::Bf16;
    let mut v = Vec::new();
    for (t, h) in [(1i64, 4096i64), (32, 4096), (64, 768)] {
        v.extend(norm_fwd(t, h));

        // A residual add then GELU (two pointwise ops, one kernel).
        let mut g = Graph::new(format!("add_gelu_fwd_bf16_{t}x{h}")).io_data_type(bf);
        let a = g.tensor(TensorDesc::new("a", &[t, h], bf));
        let b = g.tensor(TensorDesc::new("b", &[t, h], bf));
        let s = g.add(a, b);
        let y = g.pointwise(PointwiseMode::Gelu, &[s]);
        out(&mut g, y, bf);
        v.push(Workload { id: format!("add_gelu_fwd_bf16_{t}x{h}"), graph: g, flops: None });
    }
    v.push(matmul_workload("matmul_bf16_64x64x64", bf, 1, 64, 64, 64, false));
    v.extend(crate::bench_attention::small_attention_workloads());
    v
}

/// `a [batch.., m, k] x b [batch.., k, n]`, both row-major, optionally `+ bias [1, n]` then
/// relu, output in the input type: the GEMM suite's workloads.
fn matmul_workload(id: &str, dt: DataType, batch: i64, m: i64, n: i64, k: i64, bias_relu: bool) -> Workload {
    let mut g = Graph::new(id).io_data_type(dt);
    let lead: Vec<i64> = if batch > 1 { vec![batch] } else { vec![] };
    let a = g.tensor(TensorDesc::new("a", &[lead.clone(), vec![m, k]].concat(), dt));
    let b = g.tensor(TensorDesc::new("b", &[lead, vec![k, n]].concat(), dt));
    let mut y = g.matmul(a, b);
    if bias_relu {
        let bias = g.tensor(TensorDesc::new("bias", &[1, n], dt));
        let t = g.bias(y, bias);
        y = g.relu(t);
    }
    out(&mut g, y, dt);
    Workload { id: id.to_string(), graph: g, flops: Some(2 * (batch * m * n * k) as u64) }
}

/// `a [m, k] x b [k, n]` in fp8 e4m3, A row-major and B stored `n x k` (K-major, as fp8 GEMMs
/// take it: cuBLASLt's `torch._scaled_mm` needs B column-major too), times a dequantizing scale
/// (0.5, by value), output bf16; with `amax`, also the output's amax (f32), as an fp8 recipe
/// takes it for the next scale.
fn matmul_fp8_workload(m: i64, n: i64, k: i64, amax: bool) -> Workload {
    let (f8, bf) = (DataType::Fp8E4m3, DataType::Bf16);
    let id = format!("matmul_fp8_e4m3_{}{m}x{n}x{k}", if amax { "amax_" } else { "" });
    let mut g = Graph::new(&id).io_data_type(bf);
    let a = g.tensor(TensorDesc::new("a", &[m, k], f8));
    let b = g.tensor(TensorDesc::new("b", &[k, n], f8).with_layout(&[1, 0]));
    let x = g.matmul(a, b);
    let s = g.scalar("scale", 0.5);
    let y = g.scale(x, s);
    out(&mut g, y, bf);
    if amax {
        let r = g.reduction(y, ReductionMode::Amax, &[0, 1]);
        out(&mut g, r, DataType::F32);
    }
    Workload { id, graph: g, flops: Some(2 * (m * n * k) as u64) }
}

/// The GEMM suite of the tensor-core matmul issue. `matmul_tf32_*` has f32 inputs and output.
fn gemm() -> Vec<Workload> {
    let (bf, h, f) = (DataType::Bf16, DataType::F16, DataType::F32);
    let mut v = Vec::new();
    for (m, n, k) in [(8192, 8192, 8192), (4096, 4096, 4096), (16384, 4096, 1024)] {
        v.push(matmul_workload(&format!("matmul_bf16_{m}x{n}x{k}"), bf, 1, m, n, k, false));
    }
    for (m, n, k) in [(8192, 8192, 8192), (4096, 4096, 4096), (16384, 4096, 1024)] {
        v.push(matmul_workload(&format!("matmul_bias_relu_bf16_{m}x{n}x{k}"), bf, 1, m, n, k, true));
    }
    v.push(matmul_workload("matmul_fp16_8192x8192x8192", h, 1, 8192, 8192, 8192, false));
    v.push(matmul_workload("matmul_tf32_8192x8192x8192", f, 1, 8192, 8192, 8192, false));
    v.push(matmul_workload("matmul_bf16_batch64_512x512x64", bf, 64, 512, 512, 64, false));
    v.push(matmul_workload("matmul_bf16_16x8192x8192", bf, 1, 16, 8192, 8192, false));
    for (m, n, k) in [(8192, 8192, 8192), (4096, 4096, 4096)] {
        v.push(matmul_fp8_workload(m, n, k, false));
    }
    v.push(matmul_fp8_workload(8192, 8192, 8192, true));
    v
}

pub fn suite(name: &str) -> Result<Vec<Workload>, String> {
    match name {
        "memory-bound" => Ok(memory_bound()),
        "small" => Ok(small()),
        "gemm" => Ok(gemm()),
        "attention" => Ok(crate::bench_attention::attention_workloads()),
        "attention-sweep" => Ok(crate::bench_attention::attention_sweep_workloads()),
        "conv" => Ok(crate::bench_conv::conv_workloads()),
        "gemm-sweep" => Ok(crate::bench_gemm::gemm_sweep_workloads()),
        // The memory-bound suite's group normalization rows alone.
        "groupnorm" => Ok(crate::bench_memory::groupnorm_workloads()),
        _ => Err(format!("unknown suite `{name}`; the suites are: memory-bound, small, groupnorm, gemm, attention, attention-sweep, gemm-sweep, conv")),
    }
}

/// The fewest bytes a graph must move: each non-virtual input read once, each output written once.
pub fn min_bytes(g: &Graph) -> u64 {
    g.io_tensors()
        .iter()
        .map(|&id| {
            let d = g.desc(id);
            d.element_count() as u64 * g.resolved_data_type(id).unwrap_or(DataType::F32).size() as u64
        })
        .sum()
}

/// Seeded random values in every element slot of a buffer (the strides' gaps too, which no
/// kernel reads), in parallel chunks: the attention shapes hold up to 67M elements a tensor.
/// `positive`: |v| + 0.5 (an inverse variance).
fn random_fill(host: &mut [u8], dt: DataType, seed: u64, positive: bool) {
    use rayon::prelude::*;
    let size = dt.size();
    host.par_chunks_mut(size << 16).enumerate().for_each(|(c, chunk)| {
        let mut rng = SplitMix64::new(seed ^ (c as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        for (i, v) in random_values(chunk.len() / size, dt, &mut rng).into_iter().enumerate() {
            dt.write(chunk, i, if positive { v.abs() + 0.5 } else { v });
        }
    });
}

pub fn bench(suite_name: &str, out_path: Option<std::path::PathBuf>, filter: Option<String>, max_runs: usize, autotune: bool) -> Result<(), String> {
    let t = Instant::now();
    let handle = Handle::new();
    let handle_ms = t.elapsed().as_secs_f64() * 1e3;
    let device = handle.cuda_device().ok_or("bench needs a GPU with the CUDA engine")?.clone();
    outln!("handle created in {handle_ms:.1} ms (device, driver context, NVRTC, kernel cache)");
    let stream = handle.stream().ok_or("bench needs a GPU stream")?;
    let l2 = device.info().l2_cache_bytes.max(1);
    let policy = PlanPolicy { engine: Some(EngineKind::Cuda), autotune, ..Default::default() };
    let mut results = Vec::new();
    for w in suite(suite_name)? {
        if filter.as_deref().is_some_and(|f| !w.id.contains(f)) {
            continue;
        }
        let mut g = w.graph.clone();
        g.validate().map_err(|e| format!("{}: {e}", w.id))?;
        let t0 = Instant::now();
        let plan = match handle.build_plans(&g, &policy) {
            Ok(mut p) => p.remove(0),
            Err(e) => {
                outln!("{:<48} not run: {e}", w.id);
                results.push(json!({ "id": w.id, "error": e.to_string() }));
                continue;
            }
        };
        let build_first_ms = t0.elapsed().as_secs_f64() * 1e3;
        let t1 = Instant::now();
        let _again = handle.build_plans(&g, &policy).map_err(|e| e.to_string())?;
        let build_again_ms = t1.elapsed().as_secs_f64() * 1e3;

        // Input sets: enough copies that one run's inputs are not left in L2 by the last.
        let bytes = crate::bench_memory::min_bytes_override(&w.id).unwrap_or_else(|| min_bytes(&g));
        let sets = if bytes < 4 * l2 as u64 { (4 * l2 as u64).div_ceil(bytes.max(1)).min(64) as usize } else { 1 };
        let mut rng = SplitMix64::new(1);
        let mut buffers: Vec<Vec<(i64, DeviceBuffer)>> = Vec::new();
        for _ in 0..sets {
            let mut set = Vec::new();
            for id in g.io_tensors() {
                let d = g.desc(id);
                let dt = g.resolved_data_type(id).unwrap_or(DataType::F32);
                let mut host = vec![0u8; required_bytes(d, dt).max(1)];
                if g.input_tensors().contains(&id) {
                    random_fill(&mut host, dt, rng.next_u64(), d.name == "inv_variance");
                }
                set.push((d.uid.unwrap_or_default(), device.upload(&host).map_err(|e| e.to_string())?));
            }
            buffers.push(set);
        }
        let ws = device.alloc(plan.workspace_size().max(1)).map_err(|e| e.to_string())?;
        device.synchronize().map_err(|e| e.to_string())?;
        let ws_buffer = || Some(Buffer::Device { ptr: ws.device_ptr(), bytes: ws.len() });
        let run = |i: usize| -> Result<(), String> {
            let mut pack = VariantPack::new();
            for (uid, b) in &buffers[i % sets] {
                pack.device(*uid, b.device_ptr(), b.len());
            }
            plan.execute(&mut pack, ws_buffer()).map_err(|e| e.to_string())
        };
        // Warm up, then time batches of BATCH back-to-back executes (rotating input sets) with
        // events, until `max_runs` executes or about two seconds: the per-execute time of a
        // stream kept busy, as a training step issues work (PyTorch's side is timed the same
        // way in bench/run.py). The median batch, divided by BATCH.
        const BATCH: usize = 20;
        for i in 0..2 {
            run(i)?;
        }
        stream.synchronize().map_err(|e| e.to_string())?;
        let (start, end) = (Event::new(&device).map_err(|e| e.to_string())?, Event::new(&device).map_err(|e| e.to_string())?);
        let mut times = Vec::new();
        // The host's time to issue one execute (it must stay below the GPU's, or the stream
        // runs dry between kernels).
        let mut host = Vec::new();
        let wall = Instant::now();
        for b in 0..max_runs.div_ceil(BATCH).max(3) {
            start.record(&stream).map_err(|e| e.to_string())?;
            let issue = Instant::now();
            for i in 0..BATCH {
                run(b * BATCH + i)?;
            }
            host.push(issue.elapsed().as_secs_f64() * 1e3 / BATCH as f64);
            end.record(&stream).map_err(|e| e.to_string())?;
            end.synchronize().map_err(|e| e.to_string())?;
            times.push(start.elapsed_ms(&end).map_err(|e| e.to_string())? as f64 / BATCH as f64);
            if wall.elapsed().as_secs_f64() > 2.0 && times.len() >= 3 {
                break;
            }
        }
        times.sort_by(|a, b| a.total_cmp(b));
        let median = times[times.len() / 2];
        host.sort_by(|a, b| a.total_cmp(b));
        let host_ms = host[host.len() / 2];
        // `execute` alone on the host (the variant pack built once, as a caller that keeps it
        // does): batches of calls on one input set timed with a CPU clock, the stream
        // drained between batches so that the driver's launch queue never fills; the median
        // batch, in microseconds a call. (Batches of 20 for plans whose GPU time is long: their
        // host time is not what bounds them.)
        let host_batch = if median < 0.05 { 200 } else { 20 };
        let mut pack = VariantPack::new();
        for (uid, b) in &buffers[0] {
            pack.device(*uid, b.device_ptr(), b.len());
        }
        let mut alone = Vec::new();
        for _ in 0..7 {
            stream.synchronize().map_err(|e| e.to_string())?;
            let t = Instant::now();
            for _ in 0..host_batch {
                plan.execute(&mut pack, ws_buffer()).map_err(|e| e.to_string())?;
            }
            alone.push(t.elapsed().as_secs_f64() * 1e6 / host_batch as f64);
        }
        stream.synchronize().map_err(|e| e.to_string())?;
        alone.sort_by(|a, b| a.total_cmp(b));
        let execute_us = alone[alone.len() / 2];
        let gbs = bytes as f64 / median / 1e6;
        let rate = match w.flops {
            Some(fl) => format!("{:>8.1} TFLOP/s", fl as f64 / median / 1e9),
            None => format!("{gbs:>8.1} GB/s"),
        };
        outln!(
            "{:<48} {median:>10.4} ms  {rate}  build {build_first_ms:.1} ms, again {build_again_ms:.3} ms, issue {:.1} us, execute {execute_us:.2} us  ({} runs)",
            w.id,
            host_ms * 1e3,
            times.len()
        );
        results.push(json!({
            "id": w.id, "ours_ms": median, "bytes": bytes, "flops": w.flops, "tflops": w.flops.map(|f| f as f64 / median / 1e9), "runs": times.len(),
            "host_ms_per_execute": host_ms, "execute_host_us": execute_us, "build_ms_first": build_first_ms, "build_ms_in_process": build_again_ms,
            "engine": plan.engine().name(), "workspace_bytes": plan.workspace_size(),
        }));
    }
    let report = json!({ "device": device.name(), "arch": device.arch(), "suite": suite_name, "autotune": autotune, "handle_ms": handle_ms, "workloads": results });
    let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
    match out_path {
        Some(p) => std::fs::write(&p, text).map_err(|e| format!("cannot write {}: {e}", p.display()))?,
        None => outln!("{text}"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_workload_validates_and_moves_bytes() {
        for w in super::suite("memory-bound").unwrap() {
            let mut g = w.graph.clone();
            g.validate().unwrap_or_else(|e| panic!("{}: {e}", w.id));
            assert!(super::min_bytes(&g) > 1 << 20, "{}", w.id);
        }
        assert!(super::suite("nope").is_err());
    }

    #[test]
    fn every_gemm_workload_validates_and_counts_flops() {
        let ws = super::suite("gemm").unwrap();
        assert_eq!(ws.len(), 13);
        for w in ws {
            let mut g = w.graph.clone();
            g.validate().unwrap_or_else(|e| panic!("{}: {e}", w.id));
            assert!(w.flops.unwrap_or(0) >= 1 << 30, "{}", w.id);
        }
    }
}
