//! Cases for the fast kernels of issue 4's second round (engine/cuda/fused/batchnorm.rs,
//! instancenorm.rs, pooling.rs and rows.rs): batchnorm backward (NHWC and NCHW), batchnorm training forward and genstats on
//! NCHW, bn_finalize, instancenorm forward and backward (NCHW rows, NHWC groups),
//! adalayernorm backward, max and average pooling backward (NHWC 2D), and the prologue fusion
//! of a pointwise chain into layernorm/rmsnorm (residual add -> norm); each with the shapes the
//! fast paths take (odd position counts, several statistics blocks, planes of vectors and of
//! odd lengths, warp and block teams) and layouts that must fall back (padded positions, C not
//! a multiple of 16 bytes, 3D pooling, broadcast inputs in a prologue).

use super::Case;
use crate::graph::ops::norm::{BnFinalizeAttrs, NormAttrs};
use crate::graph::ops::resample::{ResampleAttrs, ResampleMode};
use crate::{DataType, Graph, TensorDesc, TensorId};

const TYPES: [DataType; 3] = [DataType::F16, DataType::Bf16, DataType::F32];

#[derive(Clone, Copy, PartialEq)]
pub(super) enum L {
    /// Packed, axis 1 innermost (NHWC for [N, C, H, W]).
    Last,
    /// Packed row-major (NCHW).
    First,
    /// Channels-last with each position's channels padded by 8 elements.
    PaddedLast,
    /// Row-major with each row of the last axis padded by 8 elements.
    PaddedFirst,
}

pub(super) fn desc(name: &str, dims: &[i64], dt: DataType, l: L) -> TensorDesc {
    let d = TensorDesc::new(name, dims, dt);
    let rank = dims.len();
    match l {
        L::First => d,
        L::Last => {
            let mut order = vec![0];
            order.extend(2..rank);
            order.push(1);
            d.with_layout(&order)
        }
        L::PaddedLast => {
            let mut strides = vec![0i64; rank];
            strides[1] = 1;
            let mut acc = dims[1] + 8;
            for a in (0..rank).rev().filter(|&a| a != 1) {
                strides[a] = acc;
                acc *= dims[a];
            }
            d.with_strides(&strides)
        }
        L::PaddedFirst => {
            let mut strides = vec![0i64; rank];
            let mut acc = 1;
            for a in (0..rank).rev() {
                strides[a] = acc;
                acc *= if a == rank - 1 { dims[a] + 8 } else { dims[a] };
            }
            d.with_strides(&strides)
        }
    }
}

pub(super) fn tag(d: &[i64]) -> String {
    d.iter().map(|v| v.to_string()).collect::<Vec<_>>().join("x")
}

pub(super) fn lname(l: L) -> &'static str {
    match l {
        L::Last => "nhwc",
        L::First => "nchw",
        L::PaddedLast => "padded_nhwc",
        L::PaddedFirst => "padded_nchw",
    }
}

/// scale/bias type for x of type `dt`: f32 for f16 (mixed), else `dt`.
pub(super) fn param_type(dt: DataType) -> DataType {
    if dt == DataType::F16 {
        DataType::F32
    } else {
        dt
    }
}

/// `[1, C, 1, ...]` (or `[N, C, 1, ...]` with `n`) for x dims.
fn chan_dims(x: &[i64], n: i64) -> Vec<i64> {
    let mut d = vec![1i64; x.len()];
    d[0] = n;
    d[1] = x[1];
    d
}

fn outs(g: &mut Graph, ids: &[Option<TensorId>]) {
    for id in ids.iter().flatten() {
        g.set_output(*id);
    }
}

/// batchnorm_backward (`instance` false) or instancenorm_backward.
fn norm_bwd(instance: bool, dt: DataType, dx_type: Option<DataType>, dims: &[i64], l: L) -> Case {
    let op = if instance { "in_bwd" } else { "bn_bwd" };
    let name = format!("fast_mem_{op}_{}_{}_{dt}{}", lname(l), tag(dims), dx_type.map(|t| format!("_dx{t}")).unwrap_or_default());
    let mut g = Graph::new(name.clone());
    let pt = param_type(dt);
    let x = g.tensor(desc("x", dims, dt, l));
    let dy = g.tensor(desc("dy", dims, dt, l));
    let s = g.tensor(TensorDesc::new("scale", &chan_dims(dims, 1), pt));
    let sd = chan_dims(dims, if instance { dims[0] } else { 1 });
    let m = g.tensor(TensorDesc::new("mean", &sd, DataType::F32));
    let v = g.tensor(TensorDesc::new("inv_variance", &sd, DataType::F32));
    let (dx, ds, db) = if instance { g.instancenorm_backward(dy, x, s, m, v) } else { g.batchnorm_backward(dy, x, s, m, v) };
    if let Some(t) = dx_type {
        g.desc_mut(dx).data_type = Some(t);
    }
    outs(&mut g, &[Some(dx), Some(ds), Some(db)]);
    Case::new(name, g)
}

fn in_fwd(dt: DataType, train: bool, dims: &[i64], l: L) -> Case {
    let name = format!("fast_mem_in_fwd_{}_{}_{}_{dt}", if train { "train" } else { "infer" }, lname(l), tag(dims));
    let mut g = Graph::new(name.clone());
    let pt = param_type(dt);
    let x = g.tensor(desc("x", dims, dt, l));
    let s = g.tensor(TensorDesc::new("scale", &chan_dims(dims, 1), pt));
    let b = g.tensor(TensorDesc::new("bias", &chan_dims(dims, 1), pt));
    let attrs = if train { NormAttrs::default() } else { NormAttrs::inference().with_epsilon(1e-3) };
    let (y, m, v) = g.instancenorm(x, s, b, attrs);
    outs(&mut g, &[Some(y), m, v]);
    Case::new(name, g)
}

fn bn_fwd(dt: DataType, running: bool, dims: &[i64], l: L) -> Case {
    let name = format!("fast_mem_bn_fwd_{}_{}_{dt}{}", lname(l), tag(dims), if running { "_running" } else { "" });
    let mut g = Graph::new(name.clone());
    let pt = param_type(dt);
    let cd = chan_dims(dims, 1);
    let x = g.tensor(desc("x", dims, dt, l));
    let s = g.tensor(TensorDesc::new("scale", &cd, pt));
    let b = g.tensor(TensorDesc::new("bias", &cd, pt));
    let run = if running { Some((g.tensor(TensorDesc::new("running_mean", &cd, DataType::F32)), g.tensor(TensorDesc::new("running_var", &cd, DataType::F32)))) } else { None };
    let attrs = crate::graph::ops::norm::BatchnormAttrs { epsilon: 1e-3, momentum: 0.2 };
    let (y, m, v, r) = g.batchnorm(x, s, b, run, &[], attrs);
    outs(&mut g, &[Some(y), Some(m), Some(v), r.map(|r| r.0), r.map(|r| r.1)]);
    Case::new(name, g)
}

fn genstats(dt: DataType, dims: &[i64], l: L) -> Case {
    let name = format!("fast_mem_genstats_{}_{}_{dt}", lname(l), tag(dims));
    let mut g = Graph::new(name.clone());
    let x = g.tensor(desc("x", dims, dt, l));
    let (s, q) = g.genstats(x);
    outs(&mut g, &[Some(s), Some(q)]);
    Case::new(name, g)
}

fn bn_finalize(dt: DataType, c: i64, running: bool) -> Case {
    let name = format!("fast_mem_bn_finalize_c{c}_{dt}{}", if running { "_running" } else { "" });
    let mut g = Graph::new(name.clone());
    let cd = [1, c, 1, 1];
    let t = |g: &mut Graph, n: &str| g.tensor(TensorDesc::new(n, &cd, dt));
    let su = t(&mut g, "sum");
    let sq = t(&mut g, "sq_sum");
    let s = t(&mut g, "scale");
    let b = t(&mut g, "bias");
    let run = if running { Some((t(&mut g, "running_mean"), t(&mut g, "running_var"))) } else { None };
    let mut a = BnFinalizeAttrs::new(37);
    a.momentum = 0.3;
    let (es, eb, sm, si, r) = g.bn_finalize(su, sq, s, b, run, a);
    outs(&mut g, &[Some(es), Some(eb), Some(sm), Some(si), r.map(|r| r.0), r.map(|r| r.1)]);
    Case::new(name, g)
}

fn ada_bwd(dt: DataType, dims: &[i64], scale_dims: &[i64], strides: Option<&[i64]>) -> Case {
    let name = format!("fast_mem_ada_bwd_{}_s{}_{dt}{}", tag(dims), tag(scale_dims), if strides.is_some() { "_strided" } else { "" });
    let mut g = Graph::new(name.clone());
    let pt = param_type(dt);
    let mk = |n: &str| {
        let d = TensorDesc::new(n, dims, dt);
        match strides {
            Some(s) => d.with_strides(s),
            None => d,
        }
    };
    let x = g.tensor(mk("x"));
    let dy = g.tensor(mk("dy"));
    let s = g.tensor(TensorDesc::new("scale", scale_dims, pt));
    let mut sd = dims.to_vec();
    *sd.last_mut().unwrap() = 1;
    let m = g.tensor(TensorDesc::new("mean", &sd, DataType::F32));
    let v = g.tensor(TensorDesc::new("inv_variance", &sd, DataType::F32));
    let (dx, ds, db) = g.adalayernorm_backward(dy, x, s, m, v);
    outs(&mut g, &[Some(dx), Some(ds), Some(db)]);
    Case::new(name, g)
}

#[allow(clippy::too_many_arguments)]
fn pool_bwd(what: &str, dt: DataType, dims: &[i64], l: L, mode: ResampleMode, window: [i64; 2], stride: [i64; 2], pre: [i64; 2], post: [i64; 2]) -> Case {
    let name = format!("fast_mem_pool_bwd_{}_{what}_{}_{dt}", mode.name(), tag(dims));
    let mut g = Graph::new(name.clone());
    let a = ResampleAttrs { mode, window: window.to_vec(), stride: stride.to_vec(), pre_padding: pre.to_vec(), post_padding: post.to_vec() };
    let od = a.output_dims(dims).expect("pooling dims");
    let x = g.tensor(desc("x", dims, dt, l));
    let dy = g.tensor(desc("dy", &od, dt, l));
    let dx = g.resample_backward(dy, x, a);
    g.set_output(dx);
    Case::new(name, g)
}

/// A prologue chain into a norm: `h = a + b` (optionally `* c` and a second add), then
/// layernorm or rmsnorm of `h`; `h` is a graph output when `keep`, and read by a later
/// pointwise node for `shared`.
fn prologue(what: &str, dt: DataType, rms: bool, keep: bool, dims: &[i64], b_dims: Option<&[i64]>, train: bool) -> Case {
    let name = format!(
        "fast_mem_prologue_{}_{what}_{}_{}{}_{dt}",
        if rms { "rmsnorm" } else { "layernorm" },
        tag(dims),
        if train { "train" } else { "infer" },
        if keep { "_keep" } else { "" }
    );
    let mut g = Graph::new(name.clone()).io_data_type(dt);
    let pt = param_type(dt);
    let a = g.tensor(TensorDesc::new("a", dims, dt));
    let b = g.tensor(TensorDesc::new("b", b_dims.unwrap_or(dims), dt));
    let mut h = g.add(a, b);
    if what == "chain3" {
        let c = g.tensor(TensorDesc::new("c", dims, dt));
        h = g.mul(h, c);
        h = g.add(h, a);
    }
    let mut pd = dims.to_vec();
    pd[0] = 1;
    let s = g.tensor(TensorDesc::new("scale", &pd, pt));
    let attrs = if train { NormAttrs::default() } else { NormAttrs::inference() };
    let ys: Vec<Option<TensorId>> = if rms {
        let (y, v) = g.rmsnorm(h, s, None, attrs);
        vec![Some(y), v]
    } else {
        let bias = g.tensor(TensorDesc::new("bias", &pd, pt));
        let (y, m, v) = g.layernorm(h, s, bias, attrs);
        vec![Some(y), m, v]
    };
    outs(&mut g, &ys);
    if what == "shared" {
        // h (virtual) also read by a node after the norm: the fused kernel writes it.
        let z = g.mul(h, h);
        g.set_output(z);
    }
    if keep {
        g.set_output(h);
        g.desc_mut(h).data_type = Some(dt);
    }
    Case::new(name, g)
}

pub(super) fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for dt in TYPES {
        // Batchnorm backward. NHWC: C = 8, 24, 64; odd position counts; many statistics blocks.
        v.push(norm_bwd(false, dt, None, &[3, 8, 5, 7], L::Last));
        v.push(norm_bwd(false, dt, None, &[3, 24, 5, 7], L::Last));
        v.push(norm_bwd(false, dt, None, &[16, 64, 15, 17], L::Last));
        v.push(norm_bwd(false, dt, None, &[37, 32], L::First));
        // NCHW: planes of 40 (vectors for every type), 35 (elements), a few big planes (block
        // teams), many small ones.
        v.push(norm_bwd(false, dt, None, &[3, 8, 5, 8], L::First));
        v.push(norm_bwd(false, dt, None, &[3, 24, 5, 7], L::First));
        v.push(norm_bwd(false, dt, None, &[1, 3, 96, 96], L::First));
        v.push(norm_bwd(false, dt, None, &[64, 40, 3, 3], L::First));
        // Fallbacks: padded positions; C = 12 channels-last (fast for f32).
        v.push(norm_bwd(false, dt, None, &[3, 8, 5, 7], L::PaddedLast));
        v.push(norm_bwd(false, dt, None, &[3, 12, 5, 7], L::Last));

        // Batchnorm training forward and genstats on NCHW (NHWC is covered by fast_spatial).
        v.push(bn_fwd(dt, true, &[3, 8, 5, 8], L::First));
        v.push(bn_fwd(dt, false, &[3, 24, 5, 7], L::First));
        v.push(bn_fwd(dt, true, &[1, 3, 96, 96], L::First));
        v.push(bn_fwd(dt, true, &[64, 40, 3, 3], L::First));
        v.push(bn_fwd(dt, true, &[3, 8, 5, 7], L::PaddedFirst));
        v.push(genstats(dt, &[3, 8, 5, 8], L::First));
        v.push(genstats(dt, &[3, 24, 5, 7], L::First));
        v.push(genstats(dt, &[1, 3, 96, 96], L::First));
        v.push(genstats(dt, &[3, 8, 5, 7], L::PaddedFirst));

        // Instancenorm forward and backward. NCHW: rows of 40, 35, 4096 (block rows), 9.
        for train in [true, false] {
            v.push(in_fwd(dt, train, &[3, 8, 5, 8], L::First));
            v.push(in_fwd(dt, train, &[3, 24, 5, 7], L::First));
        }
        v.push(in_fwd(dt, true, &[2, 3, 64, 64], L::First));
        v.push(in_fwd(dt, true, &[7, 33, 3, 3], L::First));
        v.push(norm_bwd(true, dt, None, &[3, 8, 5, 8], L::First));
        v.push(norm_bwd(true, dt, None, &[3, 24, 5, 7], L::First));
        v.push(norm_bwd(true, dt, None, &[2, 3, 64, 64], L::First));
        v.push(norm_bwd(true, dt, None, &[7, 33, 3, 3], L::First));
        // NHWC (groups of positions per image): C = 8, 64; several images; many blocks.
        for train in [true, false] {
            v.push(in_fwd(dt, train, &[3, 8, 5, 7], L::Last));
        }
        v.push(in_fwd(dt, true, &[2, 64, 15, 17], L::Last));
        v.push(in_fwd(dt, true, &[5, 16, 7], L::Last));
        v.push(norm_bwd(true, dt, None, &[3, 8, 5, 7], L::Last));
        v.push(norm_bwd(true, dt, None, &[2, 64, 15, 17], L::Last));
        // Fallbacks: padded positions either way.
        v.push(in_fwd(dt, true, &[3, 8, 5, 7], L::PaddedLast));
        v.push(norm_bwd(true, dt, None, &[3, 8, 5, 7], L::PaddedFirst));

        // bn_finalize.
        v.push(bn_finalize(dt, 37, true));
        v.push(bn_finalize(dt, 64, false));

        // Adalayernorm backward: per-batch scale [B, 1, D] (groups of S rows), shared scale
        // [1, 1, D]; rows of 1024 and odd lengths; fallbacks: per-position scale [1, S, D]
        // (non-contiguous groups) and a transposed x.
        v.push(ada_bwd(dt, &[3, 5, 1024], &[3, 1, 1024], None));
        v.push(ada_bwd(dt, &[2, 33, 64], &[2, 1, 64], None));
        v.push(ada_bwd(dt, &[4, 7, 40], &[1, 1, 40], None));
        v.push(ada_bwd(dt, &[3, 5, 13], &[3, 1, 13], None));
        v.push(ada_bwd(dt, &[2, 300, 16], &[2, 1, 16], None));
        v.push(ada_bwd(dt, &[3, 5, 16], &[1, 5, 16], None));
        v.push(ada_bwd(dt, &[3, 5, 16], &[3, 1, 16], Some(&[16, 48, 1])));
    }
    let modes = [ResampleMode::Max, ResampleMode::AvgIncludePadding, ResampleMode::AvgExcludePadding];
    for dt in TYPES {
        for mode in modes {
            v.push(pool_bwd("3x3s2p1", dt, &[2, 16, 13, 11], L::Last, mode, [3, 3], [2, 2], [1, 1], [1, 1]));
            v.push(pool_bwd("2x2s2p0", dt, &[3, 8, 8, 6], L::Last, mode, [2, 2], [2, 2], [0, 0], [0, 0]));
            v.push(pool_bwd("asym", dt, &[2, 24, 7, 9], L::Last, mode, [3, 2], [1, 2], [2, 0], [0, 1]));
            v.push(pool_bwd("odd", dt, &[1, 32, 9, 7], L::Last, mode, [3, 3], [2, 3], [1, 2], [2, 1]));
            v.push(pool_bwd("nchw_fallback", dt, &[2, 16, 13, 11], L::First, mode, [3, 3], [2, 2], [1, 1], [1, 1]));
        }
    }
    v.push(pool_bwd("3x3s2p1", DataType::F16, &[4, 64, 28, 28], L::Last, ResampleMode::Max, [3, 3], [2, 2], [1, 1], [1, 1]));
    // Max pooling backward with the strip kernel's argmax (windows overlapping along h): several
    // strips along p with a partial last one, several blocks along q (C = 512 f16), two items
    // per thread (C = 16 f32, Q = 150), a stride-1 window; the benchmark's geometry on one
    // 56x56 image in every mode (the gather with up to 2x2 covering outputs).
    v.push(pool_bwd("strip_rows", DataType::F16, &[2, 64, 29, 30], L::Last, ResampleMode::Max, [3, 3], [2, 2], [1, 1], [1, 1]));
    v.push(pool_bwd("strip_cols", DataType::F16, &[1, 512, 13, 29], L::Last, ResampleMode::Max, [3, 3], [2, 2], [1, 1], [1, 1]));
    v.push(pool_bwd("strip_ipt2", DataType::F32, &[1, 16, 5, 300], L::Last, ResampleMode::Max, [3, 3], [2, 2], [1, 1], [1, 1]));
    v.push(pool_bwd("strip_s1", DataType::Bf16, &[2, 8, 19, 10], L::Last, ResampleMode::Max, [3, 3], [1, 1], [1, 1], [1, 1]));
    for mode in modes {
        v.push(pool_bwd("bench", DataType::F16, &[1, 64, 56, 56], L::Last, mode, [3, 3], [2, 2], [1, 1], [1, 1]));
    }
    v.push(pool_bwd("global", DataType::Bf16, &[2, 64, 7, 7], L::Last, ResampleMode::AvgExcludePadding, [7, 7], [1, 1], [0, 0], [0, 0]));
    v.push(pool_bwd("c12_fallback", DataType::F16, &[2, 12, 7, 7], L::Last, ResampleMode::Max, [3, 3], [2, 2], [1, 1], [1, 1]));
    v.push(pool_bwd("padded_fallback", DataType::F16, &[2, 16, 7, 7], L::PaddedLast, ResampleMode::Max, [3, 3], [2, 2], [1, 1], [1, 1]));
    // NHWC instancenorm with many images: the group-parallel finalize (32 groups per block,
    // one warp each; forward split over blockIdx.y, backward walking groups 32 at a time), a
    // partial last group block (40 images), several statistics blocks per image (34 images
    // of 576 positions, f32 C = 8).
    for dt in TYPES {
        v.push(in_fwd(dt, true, &[40, 16, 3, 5], L::Last));
        v.push(norm_bwd(true, dt, None, &[40, 16, 3, 5], L::Last));
    }
    v.push(in_fwd(DataType::F32, true, &[34, 8, 24, 24], L::Last));
    v.push(in_fwd(DataType::Bf16, false, &[34, 8, 24, 24], L::Last));
    v.push(norm_bwd(true, DataType::F32, None, &[34, 8, 24, 24], L::Last));
    // Mixed dx type for batchnorm backward.
    v.push(norm_bwd(false, DataType::Bf16, Some(DataType::F32), &[3, 16, 5, 7], L::Last));
    v.push(norm_bwd(false, DataType::F32, Some(DataType::F16), &[3, 16, 5, 8], L::First));

    // Prologue fusion: residual add (and a 3-op chain) into layernorm / rmsnorm, rows of 1024
    // (lane teams) and 4096 (block rows), few rows, the sum kept as an output or not; falls
    // back when an input of the chain broadcasts.
    for dt in TYPES {
        for (rms, keep, train) in [(false, false, true), (false, true, false), (true, true, true), (true, false, false)] {
            v.push(prologue("add", dt, rms, keep, &[7, 1024], None, train));
        }
        v.push(prologue("add", dt, false, true, &[3, 4096], None, true));
        v.push(prologue("chain3", dt, true, false, &[33, 1024], None, false));
        v.push(prologue("chain3", dt, false, true, &[5, 4104], None, true));
        v.push(prologue("add", dt, false, false, &[9, 1000], None, true));
        v.push(prologue("shared", dt, false, false, &[7, 1024], None, true));
        v.push(prologue("bcast_fallback", dt, false, true, &[7, 1024], Some(&[1, 1024]), true));
    }
    v
}

#[cfg(test)]
mod tests {
    use crate::testing::{random_inputs, run_cpu};

    /// Every case validates, has a unique name and runs on the CPU reference.
    #[test]
    fn fast_mem_cases_validate_and_run_on_cpu() {
        let mut names = std::collections::HashSet::new();
        for c in super::cases() {
            assert!(names.insert(c.name.clone()), "duplicate case {}", c.name);
            let mut g = c.graph.clone();
            g.validate().unwrap_or_else(|e| panic!("{}: {e}", c.name));
            let out = run_cpu(&g, &random_inputs(&g, 7)).unwrap_or_else(|e| panic!("{}: {e}", c.name));
            assert!(!out.is_empty(), "{}", c.name);
        }
    }
}
