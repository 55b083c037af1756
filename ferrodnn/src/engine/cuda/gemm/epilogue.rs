//! The epilogue of a GEMM group as one device function,
//! `float epilogue(float acc, long long batch, long long row, long long col, <side inputs>)`:
//! the pointwise nodes after the matmul applied to the f32 accumulator with the formulas of the
//! fused pointwise engine (`fused/pointwise.rs`), in f32.
//!
//! Side inputs (bias `[.., 1, n]`, `[.., m, 1]`, a residual `[.., m, n]`, any strides) are read
//! at offsets baked into the source from their broadcast strides over C's dims; `batch` is the
//! row-major flat index over C's batch dims. By-value constants become literals (rounded to
//! their tensor's type, as the CPU engine does). Intermediate values are rounded to their
//! tensor's type when it is 16-bit (the chain allows that only under a 16-bit or fp8 output,
//! see `epilogue_chain`); f32 intermediates need nothing.

use super::{dtype, Epilogue};
use crate::dtype::DataType;
use crate::engine::cuda::fallback::Arg;
use crate::engine::cuda::fused::pointwise::{formula, helpers, lit};
use crate::graph::ops::Op;
use crate::graph::{Graph, TensorId};
use std::collections::HashMap;
use std::fmt::Write;

fn ctype(dt: DataType) -> Option<&'static str> {
    match dt {
        DataType::F32 => Some("float"),
        DataType::F16 => Some("__half"),
        DataType::Bf16 => Some("__nv_bfloat16"),
        _ => None,
    }
}

/// Rounding of a value to a 16-bit intermediate type (nothing for f32).
fn round_to(dt: DataType, v: &str) -> Option<String> {
    match dt {
        DataType::F16 => Some(format!("{v} = fz_cv(fz_to_f16({v}));")),
        DataType::Bf16 => Some(format!("{v} = fz_cv(fz_to_bf16({v}));")),
        _ => None,
    }
}

/// The epilogue of matmul `mm` followed by `chain` (nodes already checked by
/// `epilogue_chain`), or None when a node cannot be expressed.
pub fn build(graph: &Graph, mm: usize, chain: &[usize]) -> Option<Epilogue> {
    let c = graph.nodes.get(mm)?.output("c")?;
    let cdims = graph.desc(c).dims.clone();
    let rc = cdims.len();
    if rc < 2 {
        return None;
    }
    let out = match chain.last() {
        Some(&n) => graph.nodes[n].outputs.first()?.tensor,
        None => c,
    };
    // Fast exp/sigmoid intrinsics when the output's rounding dwarfs their error.
    let fast = matches!(dtype(graph, out), DataType::F16 | DataType::Bf16 | DataType::Fp8E4m3 | DataType::Fp8E5m2);
    let mut body = String::new();
    let mut params = String::new();
    let mut names = String::new();
    let mut args = Vec::new();
    let mut side: HashMap<usize, String> = HashMap::new();
    let mut prev: (TensorId, String) = (c, "acc".to_string());
    if !chain.is_empty() {
        if let Some(r) = round_to(dtype(graph, c), "acc") {
            let _ = writeln!(body, "    {r}");
        }
    }
    for (k, &n) in chain.iter().enumerate() {
        let node = graph.nodes.get(n)?;
        let Op::Pointwise(attrs) = &node.op else { return None };
        // Port values of this node (side inputs are loaded before, at function scope, so that
        // a later node reading the same tensor reuses them).
        let mut inner = String::new();
        for port in &node.inputs {
            let v = if port.tensor == prev.0 {
                prev.1.clone()
            } else {
                let d = graph.desc(port.tensor);
                if d.is_pass_by_value {
                    lit(dtype(graph, port.tensor).quantize(d.value?), false)
                } else if let Some(x) = side.get(&port.tensor.0) {
                    x.clone()
                } else {
                    // A side input: loaded once, at its broadcast offset.
                    let i = args.len();
                    let ct = ctype(dtype(graph, port.tensor))?;
                    let r = d.dims.len();
                    if r > rc || d.strides.len() != r {
                        return None;
                    }
                    let shift = rc - r;
                    let eff: Vec<i64> = (0..rc).map(|a| if a < shift || d.dims[a - shift] == 1 { 0 } else { d.strides[a - shift] }).collect();
                    let mut off = String::from("0LL");
                    if eff[rc - 2] != 0 {
                        let _ = write!(off, " + row * {}LL", eff[rc - 2]);
                    }
                    if eff[rc - 1] != 0 {
                        let _ = write!(off, " + col * {}LL", eff[rc - 1]);
                    }
                    let _ = writeln!(body, "    long long o{i} = {off};");
                    if eff[..rc - 2].iter().any(|&s| s != 0) {
                        let _ = writeln!(body, "    {{\n        long long q = batch;");
                        for a in (0..rc - 2).rev() {
                            if eff[a] != 0 {
                                let _ = writeln!(body, "        o{i} += (q % {}LL) * {}LL;", cdims[a], eff[a]);
                            }
                            let _ = writeln!(body, "        q /= {}LL;", cdims[a]);
                        }
                        let _ = writeln!(body, "        (void)q;\n    }}");
                    }
                    let _ = writeln!(body, "    const float x{i} = fz_cv(((const {ct}*)e{i})[o{i}]);");
                    let _ = write!(params, ", const void* __restrict__ e{i}");
                    let _ = write!(names, ", e{i}");
                    args.push(Arg::Ptr(port.tensor));
                    side.insert(port.tensor.0, format!("x{i}"));
                    format!("x{i}")
                }
            };
            let _ = writeln!(inner, "        const float {} = {v};", port.name);
        }
        let _ = writeln!(body, "    float v{k};\n    {{\n{inner}        v{k} = {};\n    }}", formula(attrs.mode, false, fast));
        let y = node.outputs.first()?.tensor;
        if k + 1 < chain.len() {
            if let Some(r) = round_to(dtype(graph, y), &format!("v{k}")) {
                let _ = writeln!(body, "    {r}");
            }
        }
        prev = (y, format!("v{k}"));
    }
    let code = format!(
        "{helpers}\n__device__ __forceinline__ float epilogue(float acc, long long batch, long long row, long long col{params}) {{\n    (void)batch; (void)row; (void)col;\n{body}    return {ret};\n}}\n",
        helpers = helpers(false, fast),
        ret = prev.1
    );
    Some(Epilogue { nodes: chain.to_vec(), code, params, names, args })
}
