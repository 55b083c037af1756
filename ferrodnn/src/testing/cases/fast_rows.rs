//! Cases for the fast row kernels (engine/cuda/fused/rows.rs): layernorm, rmsnorm and softmax
//! forward, layernorm and rmsnorm backward, in bf16, f16 and f32, with rows of 1024 and 4096
//! elements (vector path, lane teams and block teams), rows of 1000 and 4104 (partial teams),
//! odd rows (element-wise path), few rows (3, 7, 33: partial warps and grids, partial
//! backward steps), both phases and every optional port; plus layouts that must fall back
//! (transposed x, softmax over a non-last axis, broadcast scale) and layouts the fast path takes
//! with element-wise accesses (row strides that break 16-byte alignment).

use super::Case;
use crate::graph::ops::norm::NormAttrs;
use crate::{DataType, Graph, TensorDesc};

const TYPES: [DataType; 3] = [DataType::Bf16, DataType::F16, DataType::F32];

/// Scale/bias type for inputs of type `dt`: f32 for f16 (mixed), else `dt`.
fn param_type(dt: DataType) -> DataType {
    if dt == DataType::F16 {
        DataType::F32
    } else {
        dt
    }
}

/// Dims of scale for an x of `x_dims`: `[1, x_dims[1..]...]`.
fn param_dims(x_dims: &[i64]) -> Vec<i64> {
    let mut d = x_dims.to_vec();
    d[0] = 1;
    d
}

/// Dims of the statistics of an x of `x_dims`: `[N, 1, ...]`.
fn stats_dims(x_dims: &[i64]) -> Vec<i64> {
    let mut d = vec![1i64; x_dims.len()];
    d[0] = x_dims[0];
    d
}

/// x of `dims`, with `strides` when given (else packed).
fn x_desc(name: &str, dims: &[i64], dt: DataType, strides: Option<&[i64]>) -> TensorDesc {
    let d = TensorDesc::new(name, dims, dt);
    match strides {
        Some(s) => d.with_strides(s),
        None => d,
    }
}

fn attrs(train: bool) -> NormAttrs {
    if train {
        NormAttrs::default()
    } else {
        NormAttrs::inference().with_epsilon(1e-3)
    }
}

fn phase(train: bool) -> &'static str {
    if train {
        "train"
    } else {
        "infer"
    }
}

fn layernorm(what: &str, dt: DataType, train: bool, dims: &[i64], strides: Option<&[i64]>) -> Case {
    let name = format!("fast_rows_layernorm_{}_{what}_{dt}", phase(train));
    let mut g = Graph::new(name.clone());
    let pt = param_type(dt);
    let x = g.tensor(x_desc("x", dims, dt, strides));
    let s = g.tensor(TensorDesc::new("scale", &param_dims(dims), pt));
    let b = g.tensor(TensorDesc::new("bias", &param_dims(dims), pt));
    let (y, m, v) = g.layernorm(x, s, b, attrs(train));
    for t in [Some(y), m, v].into_iter().flatten() {
        g.set_output(t);
    }
    Case::new(name, g)
}

fn rmsnorm(what: &str, dt: DataType, train: bool, bias: bool, dims: &[i64], strides: Option<&[i64]>) -> Case {
    let name = format!("fast_rows_rmsnorm_{}_{}_{what}_{dt}", phase(train), if bias { "bias" } else { "nobias" });
    let mut g = Graph::new(name.clone());
    let pt = param_type(dt);
    let x = g.tensor(x_desc("x", dims, dt, strides));
    let s = g.tensor(TensorDesc::new("scale", &param_dims(dims), pt));
    let b = if bias { Some(g.tensor(TensorDesc::new("bias", &param_dims(dims), pt))) } else { None };
    let (y, v) = g.rmsnorm(x, s, b, attrs(train));
    for t in [Some(y), v].into_iter().flatten() {
        g.set_output(t);
    }
    Case::new(name, g)
}

fn softmax(what: &str, dt: DataType, log: bool, stats: bool, dims: &[i64], axis: usize, strides: Option<&[i64]>) -> Case {
    let name = format!("fast_rows_{}_{}_{what}_{dt}", if log { "log_softmax" } else { "softmax" }, if stats { "stats" } else { "nostats" });
    let mut g = Graph::new(name.clone());
    let x = g.tensor(x_desc("x", dims, dt, strides));
    let (y, st) = g.softmax(x, axis, log, stats);
    for t in [Some(y), st].into_iter().flatten() {
        g.set_output(t);
    }
    Case::new(name, g)
}

/// layernorm backward (`rms` false) or rmsnorm backward (with `dbias` or not).
fn backward(what: &str, dt: DataType, rms: bool, dbias: bool, dims: &[i64], strides: Option<&[i64]>) -> Case {
    let op = if rms { format!("rmsnorm_backward_{}", if dbias { "dbias" } else { "nodbias" }) } else { "layernorm_backward".to_string() };
    let name = format!("fast_rows_{op}_{what}_{dt}");
    let mut g = Graph::new(name.clone());
    let st = DataType::F32;
    let dy = g.tensor(x_desc("dy", dims, dt, strides));
    let x = g.tensor(x_desc("x", dims, dt, strides));
    let s = g.tensor(TensorDesc::new("scale", &param_dims(dims), param_type(dt)));
    let v = g.tensor(TensorDesc::new("inv_variance", &stats_dims(dims), st));
    let outs = if rms {
        let (dx, ds, db) = g.rmsnorm_backward(dy, x, s, v, dbias);
        vec![Some(dx), Some(ds), db]
    } else {
        let m = g.tensor(TensorDesc::new("mean", &stats_dims(dims), st));
        let (dx, ds, db) = g.layernorm_backward(dy, x, s, m, v);
        vec![Some(dx), Some(ds), Some(db)]
    };
    for t in outs.into_iter().flatten() {
        g.set_output(t);
    }
    Case::new(name, g)
}

fn softmax_bwd(what: &str, dt: DataType, log: bool, dims: &[i64], axis: usize, strides: Option<&[i64]>) -> Case {
    let name = format!("fast_rows_softmax_bwd_{}_{what}_{dt}", if log { "log" } else { "plain" });
    let mut g = Graph::new(name.clone());
    let y = g.tensor(x_desc("y", dims, dt, strides));
    let dy = g.tensor(x_desc("dy", dims, dt, strides));
    let dx = g.softmax_backward(y, dy, axis, log);
    g.set_output(dx);
    Case::new(name, g)
}

/// adalayernorm of x `dims` (`[B, S..., D]`), scale and bias `[B or 1, 1..., D]` (`per_batch`).
fn adaln(what: &str, dt: DataType, train: bool, per_batch: bool, dims: &[i64], strides: Option<&[i64]>) -> Case {
    let name = format!("fast_rows_adaln_{}_{}_{what}_{dt}", phase(train), if per_batch { "batch" } else { "shared" });
    let mut g = Graph::new(name.clone());
    let pt = param_type(dt);
    let x = g.tensor(x_desc("x", dims, dt, strides));
    let mut pd = vec![1i64; dims.len()];
    pd[dims.len() - 1] = dims[dims.len() - 1];
    if per_batch {
        pd[0] = dims[0];
    }
    let s = g.tensor(TensorDesc::new("scale", &pd, pt));
    let b = g.tensor(TensorDesc::new("bias", &pd, pt));
    let (y, m, iv) = g.adalayernorm(x, s, b, attrs(train));
    for t in [Some(y), m, iv].into_iter().flatten() {
        g.set_output(t);
    }
    Case::new(name, g)
}

pub(super) fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    // Vector paths: a lane team per 1024-row (33 rows: a partial last warp), a block per 4096-row
    // spread over two axes (7 rows).
    let shapes: [(&str, &[i64]); 2] = [("h1024", &[33, 1024]), ("h4096", &[7, 4, 1024])];
    for dt in TYPES {
        for (what, dims) in shapes {
            for train in [true, false] {
                v.push(layernorm(what, dt, train, dims, None));
                v.push(rmsnorm(what, dt, train, train, dims, None));
                v.push(rmsnorm(what, dt, train, !train, dims, None));
            }
            for (log, stats) in [(false, true), (false, false), (true, true), (true, false)] {
                v.push(softmax(what, dt, log, stats, dims, dims.len() - 1, None));
            }
            v.push(backward(what, dt, false, true, dims, None));
            v.push(backward(what, dt, true, true, dims, None));
            v.push(backward(what, dt, true, false, dims, None));
        }
        // Partial teams: 1000 (125 chunks of 8 for 2-byte types) and 4096 + 8 (513 chunks).
        v.push(layernorm("h1000", dt, true, &[3, 1000], None));
        v.push(rmsnorm("h4104", dt, false, true, &[3, 4104], None));
        v.push(softmax("h4104", dt, false, true, &[3, 4104], 1, None));
        v.push(softmax("h1000", dt, true, true, &[7, 1000], 1, None));
        v.push(backward("h4104", dt, false, true, &[3, 4104], None));
        v.push(backward("h1000", dt, true, true, &[7, 1000], None));
        // Block-per-row forward norms with many rows per persistent block (prefetch, buffers).
        v.push(layernorm("many_h4096", dt, false, &[64, 4096], None));
        v.push(rmsnorm("many_h2048", dt, true, true, &[37, 2048], None));
        // Rmsnorm without bias on 16-bit rows: two rows in flight (both register buffers, a
        // refill, an odd row count per block; 4104 = 513 chunks: a partial last chunk column).
        v.push(rmsnorm("many_h4096", dt, true, false, &[70, 4096], None));
        v.push(rmsnorm("many_h4104", dt, false, false, &[11, 4104], None));
        // Element-wise path: odd rows, short (several rows per warp) and long (a block).
        v.push(layernorm("h13", dt, true, &[33, 13], None));
        v.push(rmsnorm("h1025", dt, true, false, &[7, 1025], None));
        v.push(softmax("h13", dt, false, true, &[5, 7, 13], 2, None));
        v.push(softmax("h2049", dt, true, false, &[3, 2049], 1, None));
        v.push(backward("h13", dt, false, true, &[33, 13], None));
        v.push(backward("h1025", dt, true, false, &[7, 1025], None));
        // Short vector rows: teams of 2 and 4 lanes (several rows per warp).
        v.push(layernorm("h16", dt, false, &[33, 16], None));
        v.push(softmax("h24", dt, false, false, &[3, 11, 24], 2, None));
    }
    // softmax backward and adalayernorm: lane teams (1024), blocks (4096), element-wise (odd).
    for dt in TYPES {
        for log in [false, true] {
            v.push(softmax_bwd("h1024", dt, log, &[33, 1024], 1, None));
            v.push(softmax_bwd("h4096", dt, log, &[2, 3, 4096], 2, None));
            v.push(softmax_bwd("h1000", dt, log, &[7, 1000], 1, None));
            v.push(softmax_bwd("h13", dt, log, &[5, 7, 13], 2, None));
        }
        for train in [true, false] {
            v.push(adaln("h1024", dt, train, true, &[3, 11, 1024], None));
            v.push(adaln("h4096", dt, train, !train, &[2, 5, 4096], None));
            v.push(adaln("h13", dt, train, true, &[3, 11, 13], None));
        }
        v.push(adaln("h4104", dt, true, true, &[3, 2, 4104], None));
    }
    v.push(softmax_bwd("h2049", DataType::Bf16, true, &[3, 2049], 1, None));
    v.push(softmax_bwd("trailing1", DataType::Bf16, false, &[5, 1024, 1], 1, None));
    v.push(adaln("rank2", DataType::Bf16, true, true, &[7, 1024], None));
    // Must fall back: transposed inputs.
    v.push(softmax_bwd("transposed", DataType::Bf16, false, &[64, 32], 1, Some(&[1, 64])));
    v.push(adaln("transposed", DataType::Bf16, true, true, &[2, 64, 32], Some(&[2048, 1, 64])));
    let bf16 = DataType::Bf16;
    let f32 = DataType::F32;
    // Padded rows: a row stride of 1032 keeps 16-byte row starts (vector path), 1025 does not
    // (the fast kernels with element-wise accesses).
    v.push(layernorm("pad1032", bf16, true, &[7, 1024], Some(&[1032, 1])));
    v.push(layernorm("pad1025", bf16, true, &[7, 1024], Some(&[1025, 1])));
    v.push(softmax("pad4100", f32, false, true, &[3, 4096], 1, Some(&[4100, 1])));
    v.push(backward("pad1025", bf16, true, true, &[7, 1024], Some(&[1025, 1])));
    // Rows strided over two outer axes; softmax over an axis followed by size-1 axes.
    v.push(softmax("outer_strided", bf16, true, true, &[2, 3, 1024], 2, Some(&[4 * 1024, 1024, 1])));
    v.push(softmax("trailing1", bf16, false, true, &[5, 1024, 1], 1, None));
    // Must fall back: transposed x, softmax over a non-last axis, broadcast scale.
    v.push(layernorm("transposed", bf16, true, &[64, 32], Some(&[1, 64])));
    v.push(backward("transposed", bf16, false, true, &[64, 32], Some(&[1, 64])));
    v.push(softmax("axis0", bf16, false, true, &[1024, 8], 0, None));
    {
        let name = "fast_rows_layernorm_train_bcast_scale_bf16".to_string();
        let mut g = Graph::new(name.clone());
        let x = g.tensor(TensorDesc::new("x", &[7, 4, 1024], bf16));
        let s = g.tensor(TensorDesc::new("scale", &[1, 1, 1024], bf16));
        let b = g.tensor(TensorDesc::new("bias", &[1, 4, 1024], bf16));
        let (y, m, iv) = g.layernorm(x, s, b, NormAttrs::default());
        for t in [Some(y), m, iv].into_iter().flatten() {
            g.set_output(t);
        }
        v.push(Case::new(name, g));
    }
    v
}

#[cfg(test)]
mod tests {
    use crate::engine::cuda::fused::rows;
    use crate::testing::{random_inputs, run_cpu};

    /// Every case validates and runs on the CPU reference; the fast path takes the cases meant
    /// for it and leaves the fall-back ones alone.
    #[test]
    fn fast_rows_cases_validate_and_pick_their_path() {
        let cases = super::cases();
        let mut names = std::collections::HashSet::new();
        for c in &cases {
            assert!(names.insert(c.name.clone()), "duplicate case {}", c.name);
            let mut g = c.graph.clone();
            g.validate().unwrap_or_else(|e| panic!("{}: {e}", c.name));
            let fast = rows::unit(&g, 0, &crate::engine::cuda::Target::sm90a()).unwrap_or_else(|e| panic!("{}: {e}", c.name)).is_some();
            let want = !["transposed", "axis0", "bcast_scale"].iter().any(|w| c.name.contains(w));
            assert_eq!(fast, want, "{}: fast path {}", c.name, if fast { "taken" } else { "not taken" });
            let n: i64 = g.tensors.iter().map(|t| t.element_count()).max().unwrap_or(0);
            assert!(n <= 300_000, "{}: {n} elements", c.name);
            let inputs = random_inputs(&g, 7);
            let out = run_cpu(&g, &inputs).unwrap_or_else(|e| panic!("{}: {e}", c.name));
            assert!(!out.is_empty(), "{}", c.name);
        }
    }
}
