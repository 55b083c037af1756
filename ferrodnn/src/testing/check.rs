//! Checking an engine against the f64 reference on a graph, as `ferrodnn gpu-check` does for the
//! GPU and `ferrodnn cpu-check` (and the `cpu_check` test) for the fast CPU engine: seeded random
//! inputs, outputs poisoned before the run, every output compared by relative L2 error against a
//! bound per type; a NaN where the reference has none (or the reverse), a missing output or a
//! shape mismatch never passes.

use super::{execute_dense, execute_plan_dense, output_precision, random_inputs, relative_error, tolerance};
use crate::dtype::DataType;
use crate::engine::{Handle, PlanPolicy};
use crate::graph::Graph;

/// The relative-error bound for an output of `dtype`: the per-type tolerance, and for integer
/// types a bound that lets an occasional rounding tie fall the other way.
pub fn bound(dtype: DataType) -> f64 {
    match dtype {
        DataType::I8 | DataType::U8 | DataType::I32 | DataType::I64 | DataType::Bool => 1e-3,
        DataType::F64 => 1e-10,
        d => tolerance(d),
    }
}

/// One output's comparison.
#[derive(Clone, Debug)]
pub struct OutputCheck {
    pub name: String,
    pub dtype: DataType,
    pub rel_error: f64,
    pub bound: f64,
}

/// Run validated graph `g` on every plan `handle` builds under `policy` (all candidates) and on the
/// reference, on inputs drawn from `seed`; `Ok` with each output's error when all are within
/// [`bound`], else `Err` naming the plan, the output, its error and the first bad element.
pub fn check_against_reference(handle: &Handle, g: &Graph, policy: &PlanPolicy, seed: u64) -> Result<Vec<OutputCheck>, String> {
    let inputs = random_inputs(g, seed);
    let reference = execute_dense(&Handle::reference(), g, &inputs, &PlanPolicy::default()).map_err(|e| format!("reference: {e}"))?;
    let plans = handle.build_plans(g, &PlanPolicy { all_candidates: true, ..policy.clone() }).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for plan in &plans {
        let engine = plan.engine().name();
        let got = execute_plan_dense(handle, plan, &inputs).map_err(|e| format!("[{engine}] {e}"))?;
        let mut ids: Vec<_> = reference.keys().copied().collect();
        ids.sort();
        for id in ids {
            let r = &reference[&id];
            let dtype = g.resolved_data_type(id).unwrap_or(DataType::F32);
            let name = g.desc(id).name.clone();
            let o = got.get(&id).ok_or_else(|| format!("[{engine}] output {name} missing"))?;
            let b = bound(output_precision(g, id));
            let err = relative_error(&o.data, &r.data);
            if err.is_nan() || err > b {
                let first_bad = o.data.iter().zip(&r.data).position(|(a, x)| a.is_nan() != x.is_nan() || (a - x).abs() > b.max(1e-6) * x.abs().max(1.0));
                let detail = first_bad.map_or(String::new(), |i| format!(" (first bad element {i}: got {} want {})", o.data[i], r.data[i]));
                return Err(format!("[{engine}] output {name} ({dtype}): relative error {err:.3e} > {b:.1e}{detail}"));
            }
            out.push(OutputCheck { name, dtype, rel_error: err, bound: b });
        }
    }
    Ok(out)
}
