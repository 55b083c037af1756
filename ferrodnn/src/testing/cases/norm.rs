//! Normalization cases: every op, both phases, optional ports (running statistics, peers,
//! rmsnorm's bias and dbias), broadcast scale/bias, odd sizes, rows longer than a block,
//! packed, padded, transposed and channels-last strides, f32/f16/bf16/f64.

use super::Case;
use crate::graph::ops::norm::{BatchnormAttrs, BnFinalizeAttrs, NormAttrs};
use crate::graph::TensorId;
use crate::{DataType, Graph, TensorDesc};

const TYPES: [DataType; 4] = [DataType::F32, DataType::F16, DataType::Bf16, DataType::F64];

#[derive(Clone, Copy)]
enum L {
    Packed,
    /// Every axis padded by one element (gaps hold poison).
    Padded,
    /// Axes stored in reverse order.
    Reversed,
    /// Axis 1 innermost (NHWC for NCHW dims).
    ChannelsLast,
}

fn desc(name: &str, dims: &[i64], dt: DataType, l: L) -> TensorDesc {
    let d = TensorDesc::new(name, dims, dt);
    let rank = dims.len();
    match l {
        L::Packed => d,
        L::Padded => {
            let mut strides = vec![0i64; rank];
            let mut acc = 1;
            for a in (0..rank).rev() {
                strides[a] = acc;
                acc *= dims[a] + 1;
            }
            d.with_strides(&strides)
        }
        L::Reversed => d.with_layout(&(0..rank).rev().collect::<Vec<_>>()),
        L::ChannelsLast => {
            let mut order = vec![0];
            order.extend(2..rank);
            order.push(1);
            d.with_layout(&order)
        }
    }
}

/// The type of scale/bias for inputs of type `dt`: f32 for f16 (mixed), else `dt`.
fn param_type(dt: DataType) -> DataType {
    if dt == DataType::F16 {
        DataType::F32
    } else {
        dt
    }
}

/// The type of statistics tensors for inputs of type `dt`.
pub(super) fn stats_type(dt: DataType) -> DataType {
    if dt == DataType::F64 {
        DataType::F64
    } else {
        DataType::F32
    }
}

fn outputs(g: &mut Graph, ids: &[Option<TensorId>]) {
    for id in ids.iter().flatten() {
        g.set_output(*id);
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

/// layernorm / instancenorm / adalayernorm forward (they share ports).
#[derive(Clone, Copy, PartialEq)]
enum Fwd {
    Layer,
    Instance,
    Ada,
}

#[allow(clippy::too_many_arguments)]
fn forward_case(op: Fwd, what: &str, dt: DataType, train: bool, x_dims: &[i64], xl: L, scale_dims: &[i64], bias_dims: &[i64]) -> Case {
    let name = format!(
        "{}_{}_{what}_{dt}",
        match op {
            Fwd::Layer => "layernorm",
            Fwd::Instance => "instancenorm",
            Fwd::Ada => "adalayernorm",
        },
        phase(train)
    );
    let mut g = Graph::new(name.clone());
    let pt = param_type(dt);
    let x = g.tensor(desc("x", x_dims, dt, xl));
    let s = g.tensor(desc("scale", scale_dims, pt, L::Packed));
    let b = g.tensor(desc("bias", bias_dims, pt, L::Reversed));
    let (y, m, v) = match op {
        Fwd::Layer => g.layernorm(x, s, b, attrs(train)),
        Fwd::Instance => g.instancenorm(x, s, b, attrs(train)),
        Fwd::Ada => g.adalayernorm(x, s, b, attrs(train)),
    };
    outputs(&mut g, &[Some(y), m, v]);
    Case::new(name, g)
}

#[allow(clippy::too_many_arguments)]
fn backward_case(op: Fwd, what: &str, dt: DataType, x_dims: &[i64], xl: L, dyl: L, scale_dims: &[i64], stats_dims: &[i64]) -> Case {
    let name = format!(
        "{}_backward_{what}_{dt}",
        match op {
            Fwd::Layer => "layernorm",
            Fwd::Instance => "instancenorm",
            Fwd::Ada => "adalayernorm",
        }
    );
    let mut g = Graph::new(name.clone());
    let pt = param_type(dt);
    let st = stats_type(dt);
    let dy = g.tensor(desc("dy", x_dims, dt, dyl));
    let x = g.tensor(desc("x", x_dims, dt, xl));
    let s = g.tensor(desc("scale", scale_dims, pt, L::Padded));
    let m = g.tensor(desc("mean", stats_dims, st, L::Packed));
    let v = g.tensor(desc("inv_variance", stats_dims, st, L::Reversed));
    let (dx, ds, db) = match op {
        Fwd::Layer => g.layernorm_backward(dy, x, s, m, v),
        Fwd::Instance => g.instancenorm_backward(dy, x, s, m, v),
        Fwd::Ada => g.adalayernorm_backward(dy, x, s, m, v),
    };
    outputs(&mut g, &[Some(dx), Some(ds), Some(db)]);
    Case::new(name, g)
}

fn rmsnorm_case(what: &str, dt: DataType, train: bool, with_bias: bool, x_dims: &[i64], xl: L, scale_dims: &[i64]) -> Case {
    let name = format!("rmsnorm_{}_{}_{what}_{dt}", phase(train), if with_bias { "bias" } else { "nobias" });
    let mut g = Graph::new(name.clone());
    let pt = param_type(dt);
    let x = g.tensor(desc("x", x_dims, dt, xl));
    let s = g.tensor(desc("scale", scale_dims, pt, L::Reversed));
    let b = if with_bias { Some(g.tensor(desc("bias", scale_dims, pt, L::Padded))) } else { None };
    let (y, v) = g.rmsnorm(x, s, b, attrs(train));
    outputs(&mut g, &[Some(y), v]);
    Case::new(name, g)
}

fn rmsnorm_backward_case(what: &str, dt: DataType, with_dbias: bool, x_dims: &[i64], xl: L, dyl: L, scale_dims: &[i64]) -> Case {
    let name = format!("rmsnorm_backward_{}_{what}_{dt}", if with_dbias { "dbias" } else { "nodbias" });
    let mut g = Graph::new(name.clone());
    let mut stats_dims = vec![1i64; x_dims.len()];
    stats_dims[0] = x_dims[0];
    let dy = g.tensor(desc("dy", x_dims, dt, dyl));
    let x = g.tensor(desc("x", x_dims, dt, xl));
    let s = g.tensor(desc("scale", scale_dims, param_type(dt), L::Packed));
    let v = g.tensor(desc("inv_variance", &stats_dims, stats_type(dt), L::Padded));
    let (dx, ds, db) = g.rmsnorm_backward(dy, x, s, v, with_dbias);
    outputs(&mut g, &[Some(dx), Some(ds), db]);
    Case::new(name, g)
}

/// Per-channel dims `[1, C, 1, ...]` (or `[rows, C, 1, ...]`) for an x of `x_dims`.
fn channel_dims(x_dims: &[i64], rows: i64) -> Vec<i64> {
    let mut d = vec![1i64; x_dims.len()];
    d[0] = rows;
    d[1] = x_dims[1];
    d
}

fn batchnorm_case(what: &str, dt: DataType, x_dims: &[i64], xl: L, running: bool, peers: usize, attrs: BatchnormAttrs) -> Case {
    let name = format!("batchnorm_{what}_{dt}");
    let mut g = Graph::new(name.clone());
    let cd = channel_dims(x_dims, 1);
    let pt = param_type(dt);
    let st = stats_type(dt);
    let x = g.tensor(desc("x", x_dims, dt, xl));
    let s = g.tensor(desc("scale", &cd, pt, L::Packed));
    let b = g.tensor(desc("bias", &cd, pt, L::Padded));
    let run = if running { Some((g.tensor(desc("running_mean", &cd, st, L::Packed)), g.tensor(desc("running_var", &cd, st, L::Padded)))) } else { None };
    let peer_dims = channel_dims(x_dims, 2);
    let peer_layouts = [L::Packed, L::Reversed, L::Padded];
    let p: Vec<TensorId> = (0..peers).map(|i| g.tensor(desc(&format!("peer{i}"), &peer_dims, dt, peer_layouts[i % 3]))).collect();
    let (y, m, v, r) = g.batchnorm(x, s, b, run, &p, attrs);
    outputs(&mut g, &[Some(y), Some(m), Some(v), r.map(|r| r.0), r.map(|r| r.1)]);
    Case::new(name, g)
}

fn batchnorm_inference_case(what: &str, dt: DataType, x_dims: &[i64], xl: L) -> Case {
    let name = format!("batchnorm_inference_{what}_{dt}");
    let mut g = Graph::new(name.clone());
    let cd = channel_dims(x_dims, 1);
    let pt = param_type(dt);
    let st = stats_type(dt);
    let x = g.tensor(desc("x", x_dims, dt, xl));
    let s = g.tensor(desc("scale", &cd, pt, L::Packed));
    let b = g.tensor(desc("bias", &cd, pt, L::Padded));
    let m = g.tensor(desc("mean", &cd, st, L::Reversed));
    let v = g.tensor(desc("inv_variance", &cd, st, L::Packed));
    let y = g.batchnorm_inference(x, s, b, m, v);
    g.set_output(y);
    Case::new(name, g)
}

fn batchnorm_backward_case(what: &str, dt: DataType, x_dims: &[i64], xl: L, dyl: L) -> Case {
    let name = format!("batchnorm_backward_{what}_{dt}");
    let mut g = Graph::new(name.clone());
    let cd = channel_dims(x_dims, 1);
    let st = stats_type(dt);
    let dy = g.tensor(desc("dy", x_dims, dt, dyl));
    let x = g.tensor(desc("x", x_dims, dt, xl));
    let s = g.tensor(desc("scale", &cd, param_type(dt), L::Padded));
    let m = g.tensor(desc("mean", &cd, st, L::Packed));
    let v = g.tensor(desc("inv_variance", &cd, st, L::Packed));
    let (dx, ds, db) = g.batchnorm_backward(dy, x, s, m, v);
    outputs(&mut g, &[Some(dx), Some(ds), Some(db)]);
    Case::new(name, g)
}

fn genstats_case(what: &str, dt: DataType, x_dims: &[i64], xl: L) -> Case {
    let name = format!("genstats_{what}_{dt}");
    let mut g = Graph::new(name.clone());
    let x = g.tensor(desc("x", x_dims, dt, xl));
    let (s, q) = g.genstats(x);
    outputs(&mut g, &[Some(s), Some(q)]);
    Case::new(name, g)
}

fn bn_finalize_case(what: &str, dt: DataType, channels: i64, running: bool, attrs: BnFinalizeAttrs) -> Case {
    let name = format!("bn_finalize_{what}_{dt}");
    let mut g = Graph::new(name.clone());
    let cd = [1, channels, 1, 1];
    let layouts = [L::Packed, L::Padded, L::Reversed];
    let mut t = |n: &str, i: usize| g.tensor(desc(n, &cd, dt, layouts[i % 3]));
    let (s, q, sc, b) = (t("sum", 0), t("sq_sum", 1), t("scale", 2), t("bias", 1));
    let run = if running { Some((t("prev_running_mean", 1), t("prev_running_var", 2))) } else { None };
    let (es, eb, sm, si, r) = g.bn_finalize(s, q, sc, b, run, attrs);
    outputs(&mut g, &[Some(es), Some(eb), Some(sm), Some(si), r.map(|r| r.0), r.map(|r| r.1)]);
    Case::new(name, g)
}

pub(super) fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for dt in TYPES {
        for train in [true, false] {
            let (xl, other) = if train { (L::Padded, L::Reversed) } else { (L::Reversed, L::Padded) };
            v.push(forward_case(Fwd::Layer, "bcast", dt, train, &[5, 3, 7], xl, &[1, 3, 7], &[1, 1, 7]));
            v.push(forward_case(Fwd::Instance, "nhwc", dt, train, &[3, 5, 7, 3], L::ChannelsLast, &[1, 5, 1, 1], &[1, 5, 1, 1]));
            v.push(forward_case(Fwd::Ada, "bcast", dt, train, &[3, 5, 13], other, &[3, 1, 13], &[1, 5, 13]));
            v.push(rmsnorm_case("packed", dt, train, train, &[7, 13], L::Packed, &[1, 13]));
            v.push(rmsnorm_case("strided", dt, train, !train, &[5, 3, 7], xl, &[1, 3, 1]));
        }
        v.push(backward_case(Fwd::Layer, "bcast", dt, &[5, 3, 7], L::Padded, L::Reversed, &[1, 3, 1], &[5, 1, 1]));
        v.push(backward_case(Fwd::Instance, "nhwc", dt, &[3, 5, 7, 3], L::Packed, L::ChannelsLast, &[1, 5, 1, 1], &[3, 5, 1, 1]));
        v.push(backward_case(Fwd::Ada, "bcast", dt, &[3, 5, 13], L::Reversed, L::Padded, &[3, 1, 13], &[3, 5, 1]));
        v.push(rmsnorm_backward_case("strided", dt, true, &[5, 3, 7], L::Padded, L::Reversed, &[1, 3, 7]));
        v.push(rmsnorm_backward_case("bcast", dt, false, &[7, 13], L::Reversed, L::Packed, &[1, 13]));

        let bn = BatchnormAttrs::default;
        v.push(batchnorm_case("plain", dt, &[3, 5, 7, 3], L::Packed, false, 0, bn()));
        v.push(batchnorm_case("running_nhwc", dt, &[3, 5, 7, 3], L::ChannelsLast, true, 0, BatchnormAttrs { epsilon: 1e-3, momentum: 0.25 }));
        v.push(batchnorm_case("peers_running", dt, &[3, 5, 7, 3], L::Padded, true, 2, bn()));
        v.push(batchnorm_inference_case("nhwc", dt, &[3, 5, 7, 3], L::ChannelsLast));
        v.push(batchnorm_backward_case("nhwc", dt, &[3, 5, 7, 3], L::Packed, L::ChannelsLast));
        v.push(genstats_case("nhwc", dt, &[3, 5, 7, 3], L::ChannelsLast));
        v.push(bn_finalize_case("running", dt, 13, true, BnFinalizeAttrs::new(21)));
        v.push(bn_finalize_case("plain", dt, 5, false, BnFinalizeAttrs { epsilon: 1e-3, momentum: 0.5, accum_count: 1 }));
    }
    // Groups longer than a block (256 threads), many groups, rank 2 and rank 5.
    let f32 = DataType::F32;
    v.push(forward_case(Fwd::Layer, "long_rows", f32, true, &[3, 515], L::Packed, &[1, 515], &[1, 515]));
    v.push(forward_case(Fwd::Ada, "many_rows", f32, true, &[300, 2, 3], L::Reversed, &[1, 1, 3], &[300, 1, 3]));
    v.push(backward_case(Fwd::Layer, "long_rows", f32, &[3, 515], L::Reversed, L::Padded, &[1, 515], &[3, 1]));
    v.push(rmsnorm_backward_case("long_rows", f32, true, &[3, 600], L::Packed, L::Padded, &[1, 1]));
    v.push(forward_case(Fwd::Instance, "rank5", f32, true, &[2, 3, 5, 3, 7], L::ChannelsLast, &[1, 3, 1, 1, 1], &[1, 3, 1, 1, 1]));
    v.push(batchnorm_case("large_channels", f32, &[7, 3, 13, 11], L::Reversed, true, 1, BatchnormAttrs::default()));
    v.push(batchnorm_case("rank2_peers", f32, &[13, 5], L::Reversed, false, 3, BatchnormAttrs::default()));
    v.push(batchnorm_backward_case("large", f32, &[7, 3, 13, 11], L::ChannelsLast, L::Padded));
    v.push(genstats_case("large", f32, &[7, 3, 13, 11], L::Padded));
    v
}

#[cfg(test)]
mod tests {
    use crate::testing::{random_inputs, run_cpu};

    /// Every case validates and runs on the CPU reference.
    #[test]
    fn norm_cases_validate_and_run_on_cpu() {
        let cases = super::cases();
        assert!(cases.len() > 100);
        let mut names = std::collections::HashSet::new();
        for c in &cases {
            assert!(names.insert(c.name.clone()), "duplicate case {}", c.name);
            let mut g = c.graph.clone();
            g.validate().unwrap_or_else(|e| panic!("{}: {e}", c.name));
            let inputs = random_inputs(&g, 7);
            let out = run_cpu(&g, &inputs).unwrap_or_else(|e| panic!("{}: {e}", c.name));
            assert!(!out.is_empty(), "{}", c.name);
            for nd in out.values() {
                assert!(nd.data.iter().all(|v| v.is_finite()), "{}: non-finite output", c.name);
            }
        }
    }
}
