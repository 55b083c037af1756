//! `ferrodnn gpu-check`: every check case (every op, and multi-op graphs) on the GPU against the
//! CPU engine, on seeded random inputs, with outputs poisoned before the run. Prints a pass/fail
//! table and exits non-zero on any failure.

use ferrodnn::engine::PlanPolicy;
use ferrodnn::testing::{cases, execute_dense, execute_plan_dense, output_precision, random_inputs, relative_error, tolerance};
use ferrodnn::{DataType, EngineKind, Handle};
use serde_json::json;
use std::time::Instant;

/// The relative-error bound for an output of `dtype`: the CPU's per-type tolerance, and for
/// integer types a bound that lets an occasional rounding tie fall the other way.
fn bound(dtype: DataType) -> f64 {
    match dtype {
        DataType::I8 | DataType::U8 | DataType::I32 | DataType::I64 | DataType::Bool => 1e-3,
        DataType::F64 => 1e-10,
        d => tolerance(d),
    }
}

/// The bound for an f32 output of a reduced-precision plan (f32 matmuls as tf32: inputs rounded
/// to a 10-bit mantissa, unit roundoff u = 2^-11 ~ 4.9e-4). Each product then carries a relative
/// error of about sqrt(2) u / sqrt(3) ~ 4e-4 (two uniform roundings); over k terms of random sign
/// the errors and the sum both grow like sqrt(k), so the relative L2 error stays near 4e-4 for
/// any k (the design guide's "tf32 near 3e-4"). Hopper's wgmma truncates A instead of rounding
/// it (a bias toward zero of about 3.5e-4 relative, the same for every product, so it adds
/// coherently): about 5e-4 in all. 2e-3 leaves a 4x margin for epilogues; 16-bit and fp8
/// outputs keep their own, larger bounds.
const TF32_BOUND: f64 = 2e-3;

/// The bound for an output of `dtype` from a plan whose notes say `reduced` precision or not.
fn plan_bound(dtype: DataType, reduced: bool) -> f64 {
    if reduced && dtype == DataType::F32 {
        TF32_BOUND
    } else {
        bound(dtype)
    }
}

pub fn gpu_check(filter: Option<String>, out: Option<std::path::PathBuf>, seed: u64, shard: Option<(usize, usize)>) -> Result<(), String> {
    let handle = Handle::new();
    let Some(device) = handle.cuda_device() else {
        outln!("{}", json!({ "gpu": false, "reason": "no supported GPU: the CUDA engine is not available here" }));
        return Err("gpu-check needs a GPU".into());
    };
    outln!("gpu-check on {} ({})", device.name(), device.arch());
    let cpu = Handle::reference();
    let policy = PlanPolicy { engine: Some(EngineKind::Cuda), ..Default::default() };
    let mut rows = Vec::new();
    let mut failed = 0;
    let (shard_index, shards) = shard.unwrap_or((0, 1));
    let all: Vec<_> = cases::all()
        .into_iter()
        .filter(|c| filter.as_deref().is_none_or(|f| f.split(',').any(|f| c.name.contains(f))))
        .enumerate()
        .filter(|(i, _)| i % shards.max(1) == shard_index)
        .map(|(_, c)| c)
        .collect();
    for case in &all {
        let mut g = case.graph.clone();
        let start = Instant::now();
        let result = (|| -> Result<(f64, Vec<serde_json::Value>, f64), String> {
            g.validate().map_err(|e| e.to_string())?;
            let inputs = random_inputs(&g, seed);
            let reference = execute_dense(&cpu, &g, &inputs, &PlanPolicy::default()).map_err(|e| format!("cpu: {e}"))?;
            let build = Instant::now();
            // Every CUDA candidate: the fused/specialized plan and the plain fallback (and, for
            // f32 matmuls, the tf32 plan, checked against the tf32 bound; the exact plans keep
            // the f32 bound).
            let plans = handle.build_plans(&g, &PlanPolicy { all_candidates: true, ..policy.clone() }).map_err(|e| e.to_string())?;
            let build_ms = build.elapsed().as_secs_f64() * 1e3;
            let mut worst: f64 = 0.0;
            let mut outs = Vec::new();
            for plan in &plans {
                let knobs: Vec<String> = plan.desc.knobs.iter().map(|k| format!("{}={}", k.name, k.value)).collect();
                let knobs = knobs.join(",");
                let bound = |dtype| plan_bound(dtype, plan.notes.reduced_precision);
                let got = execute_plan_dense(&handle, plan, &inputs).map_err(|e| format!("[{knobs}] {e}"))?;
                for (id, r) in &reference {
                    let dtype = g.resolved_data_type(*id).unwrap_or(DataType::F32);
                    let b = bound(output_precision(&g, *id));
                    let o = got.get(id).ok_or_else(|| format!("[{knobs}] output {} missing", g.desc(*id).name))?;
                    let err = relative_error(&o.data, &r.data);
                    if err > b {
                        let first_bad = o.data.iter().zip(&r.data).position(|(a, x)| a.is_nan() != x.is_nan() || (a - x).abs() > b.max(1e-6) * x.abs().max(1.0));
                        let detail = first_bad.map_or(String::new(), |i| format!(" (first bad element {i}: got {} want {})", o.data[i], r.data[i]));
                        return Err(format!("[{knobs}] output {} ({dtype}): relative error {err:.3e} > {b:.1e}{detail}", g.desc(*id).name));
                    }
                    worst = worst.max(err / b.max(1e-300));
                    outs.push(json!({ "plan": knobs, "name": g.desc(*id).name, "dtype": dtype.name(), "rel_error": err }));
                }
            }
            Ok((worst, outs, build_ms))
        })();
        let ms = start.elapsed().as_secs_f64() * 1e3;
        match result {
            Ok((worst, outs, build_ms)) => {
                outln!("PASS {:<48} worst/bound {worst:.2e}  build {build_ms:.1} ms", case.name);
                rows.push(json!({ "case": case.name, "ok": true, "outputs": outs, "plan_build_ms": build_ms, "ms": ms }));
            }
            Err(e) => {
                failed += 1;
                outln!("FAIL {:<48} {e}", case.name);
                rows.push(json!({ "case": case.name, "ok": false, "error": e, "ms": ms }));
            }
        }
    }
    let summary = json!({ "gpu": true, "device": device.name(), "arch": device.arch(), "cases": all.len(), "passed": all.len() - failed, "failed": failed, "results": rows });
    if let Some(path) = out {
        std::fs::write(&path, serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())?).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    outln!("gpu-check: {} passed, {failed} failed", all.len() - failed);
    if failed > 0 {
        return Err(format!("{failed} of {} cases failed", all.len()));
    }
    Ok(())
}
