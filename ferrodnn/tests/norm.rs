//! Normalizations on the CPU engine: every forward op against a straightforward formulation
//! written here (explicit loops over dense row-major data), running statistics against the
//! hand formula, every backward op against central finite differences of its forward op (f64),
//! and the bad-graph paths.

use ferrodnn::graph::ops::norm::{BatchnormAttrs, BnFinalizeAttrs, GroupnormAttrs, NormAttrs};
use ferrodnn::graph::Port;
use ferrodnn::testing::{dot, numeric_gradient, random_values, relative_error, run_cpu, tolerance, SplitMix64};
use ferrodnn::{DataType, Error, Graph, Nd, TensorDesc, TensorId};
use std::collections::HashMap;

// ------------------------------------------------------------------------------------------
// Helpers
// ------------------------------------------------------------------------------------------

fn i64s(d: &[usize]) -> Vec<i64> {
    d.iter().map(|&v| v as i64).collect()
}

fn rand_nd(dims: &[usize], dt: DataType, rng: &mut SplitMix64) -> Nd {
    let n = dims.iter().product();
    Nd::new(dims.to_vec(), random_values(n, dt, rng))
}

/// Random values in [lo, hi), rounded to `dt` (for variances and inverse deviations).
fn rand_pos(dims: &[usize], dt: DataType, lo: f64, hi: f64, rng: &mut SplitMix64) -> Nd {
    let n = dims.iter().product();
    Nd::new(dims.to_vec(), (0..n).map(|_| dt.quantize(rng.uniform(lo, hi))).collect())
}

/// A tensor of `g` with the given dims, type and (optional) explicit strides.
fn input(g: &mut Graph, name: &str, dims: &[usize], dt: DataType, strides: Option<&[i64]>) -> TensorId {
    let mut d = TensorDesc::new(name, &i64s(dims), dt);
    if let Some(s) = strides {
        d = d.with_strides(s);
    }
    g.tensor(d)
}

/// The value of `p` (same rank, dims each equal or 1) at row-major element `flat` of `dims`,
/// computed by hand here rather than with the library's broadcast helpers.
fn bval(p: &Nd, dims: &[usize], mut flat: usize) -> f64 {
    let mut idx = vec![0; dims.len()];
    for a in (0..dims.len()).rev() {
        idx[a] = flat % dims[a];
        flat /= dims[a];
    }
    let mut off = 0;
    for (&i, &pd) in idx.iter().zip(&p.dims) {
        off = off * pd + if pd == 1 { 0 } else { i };
    }
    p.data[off]
}

fn close(what: &str, got: &Nd, want: &[f64], tol: f64) {
    assert_eq!(got.data.len(), want.len(), "{what}: length");
    assert!(got.data.iter().all(|v| v.is_finite()), "{what}: non-finite value in {:?}", got.data);
    let e = relative_error(&got.data, want);
    assert!(e <= tol, "{what}: relative error {e:e} above {tol:e}\n got {:?}\nwant {want:?}", got.data);
}

fn expect_invalid(g: &mut Graph, needle: &str) {
    match g.validate() {
        Err(Error::InvalidGraph(msg)) => assert!(msg.contains(needle), "message {msg:?} lacks {needle:?}"),
        other => panic!("expected InvalidGraph containing {needle:?}, got {other:?}"),
    }
}

/// Mean and biased variance of a list of values.
fn mean_var(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    (m, v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n)
}

// ------------------------------------------------------------------------------------------
// References (dense row-major inputs)
// ------------------------------------------------------------------------------------------

/// Layernorm / rmsnorm: row n is the contiguous block of x's dense data after axis 0.
fn ref_layer(x: &Nd, scale: &Nd, bias: Option<&Nd>, eps: f64, rms: bool) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let n = x.dims[0];
    let m = x.data.len() / n;
    let (mut y, mut means, mut invs) = (vec![0.0; x.data.len()], vec![], vec![]);
    for r in 0..n {
        let row = &x.data[r * m..(r + 1) * m];
        let (mean, var) = if rms { (0.0, row.iter().map(|v| v * v).sum::<f64>() / m as f64) } else { mean_var(row) };
        let inv = 1.0 / (var + eps).sqrt();
        for j in 0..m {
            let f = r * m + j;
            y[f] = (x.data[f] - mean) * inv * bval(scale, &x.dims, f) + bias.map_or(0.0, |b| bval(b, &x.dims, f));
        }
        means.push(mean);
        invs.push(inv);
    }
    (y, means, invs)
}

/// Instancenorm on [N, C, spatial...]: the (n, c) plane is a contiguous block.
fn ref_instance(x: &Nd, scale: &Nd, bias: &Nd, eps: f64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (n, c) = (x.dims[0], x.dims[1]);
    let hw = x.data.len() / (n * c);
    let (mut y, mut means, mut invs) = (vec![0.0; x.data.len()], vec![], vec![]);
    for ni in 0..n {
        for ci in 0..c {
            let base = (ni * c + ci) * hw;
            let (mean, var) = mean_var(&x.data[base..base + hw]);
            let inv = 1.0 / (var + eps).sqrt();
            for k in 0..hw {
                y[base + k] = (x.data[base + k] - mean) * inv * scale.data[ci] + bias.data[ci];
            }
            means.push(mean);
            invs.push(inv);
        }
    }
    (y, means, invs)
}

/// Groupnorm on [N, C, spatial...] in `groups` groups: the (n, group) block of C / G planes
/// is contiguous.
fn ref_group(x: &Nd, scale: &Nd, bias: &Nd, groups: usize, eps: f64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (n, c) = (x.dims[0], x.dims[1]);
    let hw = x.data.len() / (n * c);
    let cpg = c / groups;
    let (mut y, mut means, mut invs) = (vec![0.0; x.data.len()], vec![], vec![]);
    for ni in 0..n {
        for gi in 0..groups {
            let base = (ni * c + gi * cpg) * hw;
            let (mean, var) = mean_var(&x.data[base..base + cpg * hw]);
            let inv = 1.0 / (var + eps).sqrt();
            for k in 0..cpg * hw {
                let ci = gi * cpg + k / hw;
                y[base + k] = (x.data[base + k] - mean) * inv * scale.data[ci] + bias.data[ci];
            }
            means.push(mean);
            invs.push(inv);
        }
    }
    (y, means, invs)
}

/// Adalayernorm on [B, S, D] with scale/bias [B, 1, D].
fn ref_ada(x: &Nd, scale: &Nd, bias: &Nd, eps: f64) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (b, s, d) = (x.dims[0], x.dims[1], x.dims[2]);
    let (mut y, mut means, mut invs) = (vec![0.0; x.data.len()], vec![], vec![]);
    for bi in 0..b {
        for si in 0..s {
            let base = (bi * s + si) * d;
            let (mean, var) = mean_var(&x.data[base..base + d]);
            let inv = 1.0 / (var + eps).sqrt();
            for k in 0..d {
                y[base + k] = (x.data[base + k] - mean) * inv * scale.data[bi * d + k] + bias.data[bi * d + k];
            }
            means.push(mean);
            invs.push(inv);
        }
    }
    (y, means, invs)
}

/// The values of channel `c` of an [N, C, spatial...] dense array.
fn channel(x: &Nd, c: usize) -> Vec<f64> {
    let (n, cs) = (x.dims[0], x.dims[1]);
    let hw = x.data.len() / (n * cs);
    (0..n).flat_map(|ni| x.data[(ni * cs + c) * hw..(ni * cs + c + 1) * hw].to_vec()).collect()
}

// ------------------------------------------------------------------------------------------
// Forward ops against the references
// ------------------------------------------------------------------------------------------

#[test]
fn layernorm_padded_strides_and_broadcast_scale_f32() {
    let mut rng = SplitMix64::new(1);
    let dims = [3, 5, 7];
    let eps = 1e-3;
    let mut g = Graph::new("ln");
    // Padded strides: each row of 7 takes 8 slots and each plane 43.
    let x = input(&mut g, "x", &dims, DataType::F32, Some(&[43, 8, 1]));
    let scale = input(&mut g, "scale", &[1, 5, 7], DataType::F32, None);
    let bias = input(&mut g, "bias", &[1, 1, 7], DataType::F32, None);
    let (y, mean, inv) = g.layernorm(x, scale, bias, NormAttrs::default().with_epsilon(eps));
    let (mean, inv) = (mean.unwrap(), inv.unwrap());
    for t in [y, mean, inv] {
        g.set_output(t);
    }
    let vals: HashMap<TensorId, Nd> =
        [(x, rand_nd(&dims, DataType::F32, &mut rng)), (scale, rand_nd(&[1, 5, 7], DataType::F32, &mut rng)), (bias, rand_nd(&[1, 1, 7], DataType::F32, &mut rng))].into();
    let out = run_cpu(&g, &vals).unwrap();
    let (ry, rm, ri) = ref_layer(&vals[&x], &vals[&scale], Some(&vals[&bias]), eps, false);
    assert_eq!(out[&mean].dims, vec![3, 1, 1]);
    let tol = tolerance(DataType::F32);
    close("y", &out[&y], &ry, tol);
    close("mean", &out[&mean], &rm, tol);
    close("inv_variance", &out[&inv], &ri, tol);
}

#[test]
fn layernorm_inference_phase_and_bf16() {
    let mut rng = SplitMix64::new(2);
    let dims = [4, 13];
    let mut g = Graph::new("ln_bf16");
    let x = input(&mut g, "x", &dims, DataType::Bf16, None);
    let scale = input(&mut g, "scale", &[1, 13], DataType::F32, None);
    let bias = input(&mut g, "bias", &[1, 13], DataType::F32, None);
    let (y, m, v) = g.layernorm(x, scale, bias, NormAttrs::inference());
    assert!(m.is_none() && v.is_none(), "the inference phase has no statistics outputs");
    g.set_output(y);
    g.validate().unwrap();
    assert_eq!(g.resolved_data_type(y), Some(DataType::Bf16));
    assert_eq!(g.nodes[0].outputs.len(), 1);
    let vals: HashMap<TensorId, Nd> =
        [(x, rand_nd(&dims, DataType::Bf16, &mut rng)), (scale, rand_nd(&[1, 13], DataType::F32, &mut rng)), (bias, rand_nd(&[1, 13], DataType::F32, &mut rng))].into();
    let out = run_cpu(&g, &vals).unwrap();
    let (ry, _, _) = ref_layer(&vals[&x], &vals[&scale], Some(&vals[&bias]), 1e-5, false);
    close("y bf16", &out[&y], &ry, tolerance(DataType::Bf16));

    // Training on the same bf16 input: stats default to f32.
    let mut g2 = Graph::new("ln_bf16_train");
    let x2 = input(&mut g2, "x", &dims, DataType::Bf16, None);
    let s2 = input(&mut g2, "scale", &[1, 13], DataType::F32, None);
    let b2 = input(&mut g2, "bias", &[1, 13], DataType::F32, None);
    let (_, m2, v2) = g2.layernorm(x2, s2, b2, NormAttrs::default());
    let (m2, v2) = (g2.set_output(m2.unwrap()), g2.set_output(v2.unwrap()));
    g2.validate().unwrap();
    assert_eq!(g2.resolved_data_type(m2), Some(DataType::F32));
    let vals2: HashMap<TensorId, Nd> = [(x2, vals[&x].clone()), (s2, vals[&scale].clone()), (b2, vals[&bias].clone())].into();
    let out2 = run_cpu(&g2, &vals2).unwrap();
    let (_, rm, ri) = ref_layer(&vals[&x], &vals[&scale], Some(&vals[&bias]), 1e-5, false);
    close("mean f32 from bf16", &out2[&m2], &rm, tolerance(DataType::F32));
    close("inv f32 from bf16", &out2[&v2], &ri, tolerance(DataType::F32));
}

#[test]
fn rmsnorm_with_and_without_bias() {
    let mut rng = SplitMix64::new(3);
    let dims = [5, 3, 7];
    for (with_bias, dt) in [(true, DataType::F32), (false, DataType::F16)] {
        let mut g = Graph::new("rms");
        // Transposed layout: axis 2 outermost.
        let x = g.tensor(TensorDesc::new("x", &i64s(&dims), dt).with_layout(&[2, 0, 1]));
        let scale = input(&mut g, "scale", &[1, 3, 7], dt, None);
        let bias = if with_bias { Some(input(&mut g, "bias", &[1, 1, 7], dt, None)) } else { None };
        let (y, inv) = g.rmsnorm(x, scale, bias, NormAttrs::default());
        let inv = g.set_output(inv.unwrap());
        g.set_output(y);
        let mut vals: HashMap<TensorId, Nd> = [(x, rand_nd(&dims, dt, &mut rng)), (scale, rand_nd(&[1, 3, 7], dt, &mut rng))].into();
        if let Some(b) = bias {
            vals.insert(b, rand_nd(&[1, 1, 7], dt, &mut rng));
        }
        let out = run_cpu(&g, &vals).unwrap();
        let (ry, rm, ri) = ref_layer(&vals[&x], &vals[&scale], bias.map(|b| &vals[&b]), 1e-5, true);
        assert!(rm.iter().all(|&m| m == 0.0));
        close("rms y", &out[&y], &ry, tolerance(dt));
        close("rms inv", &out[&inv], &ri, tolerance(DataType::F32));
        assert_eq!(out[&inv].dims, vec![5, 1, 1]);
    }
    // Inference phase: y only.
    let mut g = Graph::new("rms_inf");
    let x = input(&mut g, "x", &[2, 5], DataType::F32, None);
    let s = input(&mut g, "scale", &[1, 5], DataType::F32, None);
    let (y, inv) = g.rmsnorm(x, s, None, NormAttrs::inference());
    assert!(inv.is_none());
    g.set_output(y);
    let vals: HashMap<TensorId, Nd> = [(x, rand_nd(&[2, 5], DataType::F32, &mut rng)), (s, rand_nd(&[1, 5], DataType::F32, &mut rng))].into();
    let out = run_cpu(&g, &vals).unwrap();
    let (ry, _, _) = ref_layer(&vals[&x], &vals[&s], None, 1e-5, true);
    close("rms inference y", &out[&y], &ry, tolerance(DataType::F32));
}

#[test]
fn instancenorm_channels_last_f32_and_f16() {
    let mut rng = SplitMix64::new(4);
    let dims = [2, 3, 5, 3];
    for dt in [DataType::F32, DataType::F16] {
        let mut g = Graph::new("in");
        let x = g.tensor(TensorDesc::new("x", &i64s(&dims), dt).with_layout(&[0, 2, 3, 1]));
        let scale = input(&mut g, "scale", &[1, 3, 1, 1], DataType::F32, None);
        let bias = input(&mut g, "bias", &[1, 3, 1, 1], DataType::F32, None);
        let (y, m, v) = g.instancenorm(x, scale, bias, NormAttrs::default().with_epsilon(1e-4));
        let (m, v) = (g.set_output(m.unwrap()), g.set_output(v.unwrap()));
        g.set_output(y);
        let vals: HashMap<TensorId, Nd> =
            [(x, rand_nd(&dims, dt, &mut rng)), (scale, rand_nd(&[1, 3, 1, 1], DataType::F32, &mut rng)), (bias, rand_nd(&[1, 3, 1, 1], DataType::F32, &mut rng))].into();
        let out = run_cpu(&g, &vals).unwrap();
        let (ry, rm, ri) = ref_instance(&vals[&x], &vals[&scale], &vals[&bias], 1e-4);
        assert_eq!(out[&m].dims, vec![2, 3, 1, 1]);
        close("in y", &out[&y], &ry, tolerance(dt));
        close("in mean", &out[&m], &rm, tolerance(DataType::F32));
        close("in inv", &out[&v], &ri, tolerance(DataType::F32));
    }
}

#[test]
fn groupnorm_nchw_nhwc_and_ranks() {
    let mut rng = SplitMix64::new(41);
    // (dims, groups, channels-last, type): C = 12 in 3 groups, 40 in 8, 1 and C groups (layer-
    // and instancenorm-like), rank 2, 3 and 5.
    let shapes: [(&[usize], usize, bool, DataType); 7] = [
        (&[2, 12, 3, 5], 3, false, DataType::F32),
        (&[2, 12, 3, 5], 3, true, DataType::F32),
        (&[3, 40, 7], 8, true, DataType::F16),
        (&[2, 6, 2, 3, 2], 2, true, DataType::Bf16),
        (&[4, 6], 3, false, DataType::F32),
        (&[2, 4, 5], 1, false, DataType::F64),
        (&[2, 4, 5], 4, true, DataType::F32),
    ];
    for (dims, groups, last, dt) in shapes {
        let rank = dims.len();
        let mut g = Graph::new("gn");
        let mut xd = TensorDesc::new("x", &i64s(dims), dt);
        if last {
            let mut order = vec![0];
            order.extend(2..rank);
            order.push(1);
            xd = xd.with_layout(&order);
        }
        let x = g.tensor(xd);
        let mut pd = vec![1usize; rank];
        pd[1] = dims[1];
        let pt = if dt == DataType::F64 { dt } else { DataType::F32 };
        let scale = input(&mut g, "scale", &pd, pt, None);
        let bias = input(&mut g, "bias", &pd, pt, None);
        let (y, m, v) = g.groupnorm(x, scale, bias, GroupnormAttrs::new(groups as i64).with_epsilon(1e-4));
        let (m, v) = (g.set_output(m.unwrap()), g.set_output(v.unwrap()));
        g.set_output(y);
        let vals: HashMap<TensorId, Nd> = [(x, rand_nd(dims, dt, &mut rng)), (scale, rand_nd(&pd, pt, &mut rng)), (bias, rand_nd(&pd, pt, &mut rng))].into();
        let out = run_cpu(&g, &vals).unwrap();
        let (ry, rm, ri) = ref_group(&vals[&x], &vals[&scale], &vals[&bias], groups, 1e-4);
        let mut sd = vec![1usize; rank];
        sd[0] = dims[0];
        sd[1] = groups;
        assert_eq!(out[&m].dims, sd, "{dims:?}");
        let what = format!("gn {dims:?} groups {groups} {dt}");
        close(&format!("{what} y"), &out[&y], &ry, tolerance(dt));
        close(&format!("{what} mean"), &out[&m], &rm, tolerance(pt));
        close(&format!("{what} inv"), &out[&v], &ri, tolerance(pt));
    }
}

/// Groupnorm with one group per channel is instancenorm, and the inference phase gives the
/// training phase's y.
#[test]
fn groupnorm_agrees_with_instancenorm_and_its_inference_phase() {
    let mut rng = SplitMix64::new(42);
    let dims = [2usize, 5, 3, 4];
    let f = DataType::F32;
    let mut g = Graph::new("gn_in");
    let x = input(&mut g, "x", &dims, f, None);
    let s = input(&mut g, "s", &[1, 5, 1, 1], f, None);
    let b = input(&mut g, "b", &[1, 5, 1, 1], f, None);
    let (yg, mg, vg) = g.groupnorm(x, s, b, GroupnormAttrs::new(5));
    let (yi, mi, vi) = g.instancenorm(x, s, b, NormAttrs::default());
    let (yn, _, _) = g.groupnorm(x, s, b, GroupnormAttrs::new(5).inference());
    for t in [yg, mg.unwrap(), vg.unwrap(), yi, mi.unwrap(), vi.unwrap(), yn] {
        g.set_output(t);
    }
    let vals: HashMap<TensorId, Nd> = [(x, rand_nd(&dims, f, &mut rng)), (s, rand_nd(&[1, 5, 1, 1], f, &mut rng)), (b, rand_nd(&[1, 5, 1, 1], f, &mut rng))].into();
    let out = run_cpu(&g, &vals).unwrap();
    assert!(out[&yg].data.iter().any(|&v| v != 0.0));
    assert_eq!(out[&yg].data, out[&yi].data);
    assert_eq!(out[&mg.unwrap()].data, out[&mi.unwrap()].data);
    assert_eq!(out[&vg.unwrap()].data, out[&vi.unwrap()].data);
    assert_eq!(out[&yn].data, out[&yg].data);
}

#[test]
fn adalayernorm_transposed_f32_and_bf16() {
    let mut rng = SplitMix64::new(5);
    let dims = [2, 3, 5];
    for dt in [DataType::F32, DataType::Bf16] {
        let mut g = Graph::new("ada");
        // Axis 1 outermost in memory.
        let x = g.tensor(TensorDesc::new("x", &i64s(&dims), dt).with_layout(&[1, 0, 2]));
        let scale = input(&mut g, "scale", &[2, 1, 5], dt, None);
        let bias = input(&mut g, "bias", &[2, 1, 5], dt, None);
        let (y, m, v) = g.adalayernorm(x, scale, bias, NormAttrs::default());
        let (m, v) = (g.set_output(m.unwrap()), g.set_output(v.unwrap()));
        g.set_output(y);
        let vals: HashMap<TensorId, Nd> = [(x, rand_nd(&dims, dt, &mut rng)), (scale, rand_nd(&[2, 1, 5], dt, &mut rng)), (bias, rand_nd(&[2, 1, 5], dt, &mut rng))].into();
        let out = run_cpu(&g, &vals).unwrap();
        let (ry, rm, ri) = ref_ada(&vals[&x], &vals[&scale], &vals[&bias], 1e-5);
        assert_eq!(out[&m].dims, vec![2, 3, 1]);
        close("ada y", &out[&y], &ry, tolerance(dt));
        close("ada mean", &out[&m], &rm, tolerance(DataType::F32));
        close("ada inv", &out[&v], &ri, tolerance(DataType::F32));
    }
}

#[test]
fn batchnorm_channels_last_with_running_stats() {
    let mut rng = SplitMix64::new(6);
    let dims = [3, 5, 7, 3];
    let c = 5;
    let (eps, mo) = (1e-3, 0.25);
    for dt in [DataType::F32, DataType::F16] {
        let mut g = Graph::new("bn");
        let x = g.tensor(TensorDesc::new("x", &i64s(&dims), dt).with_layout(&[0, 2, 3, 1]));
        let sd = [1, c, 1, 1];
        let scale = input(&mut g, "scale", &sd, DataType::F32, None);
        let bias = input(&mut g, "bias", &sd, DataType::F32, None);
        let rm = input(&mut g, "rm", &sd, DataType::F32, None);
        let rv = input(&mut g, "rv", &sd, DataType::F32, None);
        let (y, mean, inv, running) = g.batchnorm(x, scale, bias, Some((rm, rv)), &[], BatchnormAttrs { epsilon: eps, momentum: mo });
        let (orm, orv) = running.unwrap();
        for t in [y, mean, inv, orm, orv] {
            g.set_output(t);
        }
        let vals: HashMap<TensorId, Nd> = [
            (x, rand_nd(&dims, dt, &mut rng)),
            (scale, rand_nd(&sd, DataType::F32, &mut rng)),
            (bias, rand_nd(&sd, DataType::F32, &mut rng)),
            (rm, rand_nd(&sd, DataType::F32, &mut rng)),
            (rv, rand_pos(&sd, DataType::F32, 0.5, 2.0, &mut rng)),
        ]
        .into();
        let out = run_cpu(&g, &vals).unwrap();
        let xv = &vals[&x];
        let count = (dims[0] * dims[2] * dims[3]) as f64;
        let hw = dims[2] * dims[3];
        let mut ry = vec![0.0; xv.data.len()];
        let (mut rmean, mut rinv, mut rrm, mut rrv) = (vec![], vec![], vec![], vec![]);
        for ci in 0..c {
            let (m, var) = mean_var(&channel(xv, ci));
            let iv = 1.0 / (var + eps).sqrt();
            for ni in 0..dims[0] {
                for k in 0..hw {
                    let f = (ni * c + ci) * hw + k;
                    ry[f] = (xv.data[f] - m) * iv * vals[&scale].data[ci] + vals[&bias].data[ci];
                }
            }
            rmean.push(m);
            rinv.push(iv);
            // Hand formula: PyTorch's update with the unbiased variance.
            rrm.push((1.0 - mo) * vals[&rm].data[ci] + mo * m);
            rrv.push((1.0 - mo) * vals[&rv].data[ci] + mo * var * count / (count - 1.0));
        }
        close("bn y", &out[&y], &ry, tolerance(dt));
        let t32 = tolerance(DataType::F32);
        close("bn mean", &out[&mean], &rmean, t32);
        close("bn inv", &out[&inv], &rinv, t32);
        close("bn running mean", &out[&orm], &rrm, t32);
        close("bn running var", &out[&orv], &rrv, t32);
        assert_eq!(out[&orv].dims, vec![1, 5, 1, 1]);
    }
}

#[test]
fn batchnorm_with_peer_stats_matches_the_whole_batch() {
    let mut rng = SplitMix64::new(7);
    let dims = [2, 3, 3, 5];
    let c = 3;
    let sd = [1, c, 1, 1];
    let mo = 0.1;
    // Two peers, each with its own x of the same size; their sums travel as [2, C, 1, 1].
    let peers_x: Vec<Nd> = (0..2).map(|_| rand_nd(&dims, DataType::F32, &mut rng)).collect();
    let mut g = Graph::new("bn_sync");
    let x = input(&mut g, "x", &dims, DataType::F32, None);
    let scale = input(&mut g, "scale", &sd, DataType::F32, None);
    let bias = input(&mut g, "bias", &sd, DataType::F32, None);
    let rm = input(&mut g, "rm", &sd, DataType::F32, None);
    let rv = input(&mut g, "rv", &sd, DataType::F32, None);
    let p0 = input(&mut g, "peer0", &[2, c, 1, 1], DataType::F64, None);
    let p1 = input(&mut g, "peer1", &[2, c, 1, 1], DataType::F64, None);
    let (y, mean, inv, running) = g.batchnorm(x, scale, bias, Some((rm, rv)), &[p0, p1], BatchnormAttrs::default());
    let (orm, orv) = running.unwrap();
    for t in [y, mean, inv, orm, orv] {
        g.set_output(t);
    }
    let peer_nd = |px: &Nd| {
        let mut d = vec![0.0; 2 * c];
        for ci in 0..c {
            let v = channel(px, ci);
            d[ci] = v.iter().sum();
            d[c + ci] = v.iter().map(|a| a * a).sum();
        }
        Nd::new(vec![2, c, 1, 1], d)
    };
    let vals: HashMap<TensorId, Nd> = [
        (x, rand_nd(&dims, DataType::F32, &mut rng)),
        (scale, rand_nd(&sd, DataType::F32, &mut rng)),
        (bias, rand_nd(&sd, DataType::F32, &mut rng)),
        (rm, rand_nd(&sd, DataType::F32, &mut rng)),
        (rv, rand_pos(&sd, DataType::F32, 0.5, 2.0, &mut rng)),
        (p0, peer_nd(&peers_x[0])),
        (p1, peer_nd(&peers_x[1])),
    ]
    .into();
    let out = run_cpu(&g, &vals).unwrap();
    let xv = &vals[&x];
    let hw = dims[2] * dims[3];
    let mut ry = vec![0.0; xv.data.len()];
    let (mut rmean, mut rinv, mut rrm, mut rrv) = (vec![], vec![], vec![], vec![]);
    for ci in 0..c {
        // The whole batch: local values and both peers' values.
        let mut all = channel(xv, ci);
        for px in &peers_x {
            all.extend(channel(px, ci));
        }
        let n = all.len() as f64;
        let (m, var) = mean_var(&all);
        let iv = 1.0 / (var + 1e-5).sqrt();
        for ni in 0..dims[0] {
            for k in 0..hw {
                let f = (ni * c + ci) * hw + k;
                ry[f] = (xv.data[f] - m) * iv * vals[&scale].data[ci] + vals[&bias].data[ci];
            }
        }
        rmean.push(m);
        rinv.push(iv);
        rrm.push((1.0 - mo) * vals[&rm].data[ci] + mo * m);
        rrv.push((1.0 - mo) * vals[&rv].data[ci] + mo * var * n / (n - 1.0));
    }
    let t = tolerance(DataType::F32);
    close("sync y", &out[&y], &ry, t);
    close("sync mean", &out[&mean], &rmean, t);
    close("sync inv", &out[&inv], &rinv, t);
    close("sync running mean", &out[&orm], &rrm, t);
    close("sync running var", &out[&orv], &rrv, t);
}

#[test]
fn batchnorm_inference_channels_last() {
    let mut rng = SplitMix64::new(8);
    let dims = [3, 7, 2, 5];
    let sd = [1, 7, 1, 1];
    for dt in [DataType::F32, DataType::Bf16] {
        let mut g = Graph::new("bn_inf");
        let x = g.tensor(TensorDesc::new("x", &i64s(&dims), dt).with_layout(&[0, 2, 3, 1]));
        let ids: Vec<TensorId> = ["scale", "bias", "mean", "inv"].iter().map(|n| input(&mut g, n, &sd, DataType::F32, None)).collect();
        let y = g.batchnorm_inference(x, ids[0], ids[1], ids[2], ids[3]);
        g.set_output(y);
        let mut vals: HashMap<TensorId, Nd> = [(x, rand_nd(&dims, dt, &mut rng))].into();
        for &t in &ids[..3] {
            vals.insert(t, rand_nd(&sd, DataType::F32, &mut rng));
        }
        vals.insert(ids[3], rand_pos(&sd, DataType::F32, 0.5, 3.0, &mut rng));
        let out = run_cpu(&g, &vals).unwrap();
        let xv = &vals[&x];
        let hw = dims[2] * dims[3];
        let ry: Vec<f64> = (0..xv.data.len())
            .map(|f| {
                let ci = (f / hw) % 7;
                let p = |k: usize| vals[&ids[k]].data[ci];
                (xv.data[f] - p(2)) * p(3) * p(0) + p(1)
            })
            .collect();
        close("bn inference y", &out[&y], &ry, tolerance(dt));
    }
}

#[test]
fn genstats_then_bn_finalize() {
    let mut rng = SplitMix64::new(9);
    let dims = [5, 3, 3, 2];
    let c = 3;
    let sd = [1, c, 1, 1];
    let count = (dims[0] * dims[2] * dims[3]) as i64;
    let attrs = BnFinalizeAttrs { epsilon: 1e-4, momentum: 0.3, accum_count: count };
    let mut g = Graph::new("gs_fin").intermediate_data_type(DataType::F32);
    let x = g.tensor(TensorDesc::new("x", &i64s(&dims), DataType::F32).with_layout(&[0, 2, 3, 1]));
    let scale = input(&mut g, "scale", &sd, DataType::F32, None);
    let bias = input(&mut g, "bias", &sd, DataType::F32, None);
    let prm = input(&mut g, "prm", &sd, DataType::F32, None);
    let prv = input(&mut g, "prv", &sd, DataType::F32, None);
    let (sum, sq) = g.genstats(x);
    g.set_output(sum);
    g.set_output(sq);
    let (eqs, eqb, sm, sis, running) = g.bn_finalize(sum, sq, scale, bias, Some((prm, prv)), attrs.clone());
    let (nrm, nrv) = running.unwrap();
    for t in [eqs, eqb, sm, sis, nrm, nrv] {
        g.set_output(t);
    }
    let vals: HashMap<TensorId, Nd> = [
        (x, rand_nd(&dims, DataType::F32, &mut rng)),
        (scale, rand_nd(&sd, DataType::F32, &mut rng)),
        (bias, rand_nd(&sd, DataType::F32, &mut rng)),
        (prm, rand_nd(&sd, DataType::F32, &mut rng)),
        (prv, rand_pos(&sd, DataType::F32, 0.5, 2.0, &mut rng)),
    ]
    .into();
    let out = run_cpu(&g, &vals).unwrap();
    let xv = &vals[&x];
    let n = count as f64;
    let (mut rs, mut rq, mut req_s, mut req_b, mut rmean, mut rinv, mut rnm, mut rnv) = (vec![], vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
    for ci in 0..c {
        let v = channel(xv, ci);
        rs.push(v.iter().sum::<f64>());
        rq.push(v.iter().map(|a| a * a).sum::<f64>());
        let (m, var) = mean_var(&v);
        let iv = 1.0 / (var + 1e-4).sqrt();
        let es = vals[&scale].data[ci] * iv;
        req_s.push(es);
        req_b.push(vals[&bias].data[ci] - m * es);
        rmean.push(m);
        rinv.push(iv);
        rnm.push(0.7 * vals[&prm].data[ci] + 0.3 * m);
        rnv.push(0.7 * vals[&prv].data[ci] + 0.3 * var * n / (n - 1.0));
    }
    let t = tolerance(DataType::F32);
    close("sum", &out[&sum], &rs, t);
    close("sq_sum", &out[&sq], &rq, t);
    assert_eq!(out[&sum].dims, vec![1, 3, 1, 1]);
    // The statistics go through f32 sums and E[x^2] - E[x]^2: allow a little more.
    let t2 = 1e-4;
    close("eq_scale", &out[&eqs], &req_s, t2);
    close("eq_bias", &out[&eqb], &req_b, t2);
    close("saved_mean", &out[&sm], &rmean, t2);
    close("saved_inv_std", &out[&sis], &rinv, t2);
    close("next_running_mean", &out[&nrm], &rnm, t2);
    close("next_running_var", &out[&nrv], &rnv, t2);
    // The equivalent affine map is batchnorm: x * eq_scale + eq_bias.
    let hw = dims[2] * dims[3];
    let affine: Vec<f64> = (0..xv.data.len()).map(|f| xv.data[f] * out[&eqs].data[(f / hw) % c] + out[&eqb].data[(f / hw) % c]).collect();
    let bn: Vec<f64> =
        (0..xv.data.len()).map(|f| (xv.data[f] - rmean[(f / hw) % c]) * rinv[(f / hw) % c] * vals[&scale].data[(f / hw) % c] + vals[&bias].data[(f / hw) % c]).collect();
    assert!(relative_error(&affine, &bn) < t2);

    // bn_finalize alone with f64 sums and no running statistics: outputs are f64, exact.
    let mut g = Graph::new("fin64");
    let ids: Vec<TensorId> = ["s", "q", "sc", "b"].iter().map(|nm| input(&mut g, nm, &[1, 2], DataType::F64, None)).collect();
    let (eqs, eqb, sm, sis, running) = g.bn_finalize(ids[0], ids[1], ids[2], ids[3], None, BnFinalizeAttrs::new(4));
    assert!(running.is_none());
    for t in [eqs, eqb, sm, sis] {
        g.set_output(t);
    }
    // Channel 0 holds {1, 2, 3, 4}: sum 10, squares 30; channel 1 holds {-1, -1, 1, 1}.
    let vals: HashMap<TensorId, Nd> = [
        (ids[0], Nd::new(vec![1, 2], vec![10.0, 0.0])),
        (ids[1], Nd::new(vec![1, 2], vec![30.0, 4.0])),
        (ids[2], Nd::new(vec![1, 2], vec![2.0, 0.5])),
        (ids[3], Nd::new(vec![1, 2], vec![1.0, -1.0])),
    ]
    .into();
    let out = run_cpu(&g, &vals).unwrap();
    let inv0 = 1.0 / (1.25f64 + 1e-5).sqrt();
    let inv1 = 1.0 / (1.0f64 + 1e-5).sqrt();
    close("saved_mean f64", &out[&sm], &[2.5, 0.0], 1e-15);
    close("saved_inv_std f64", &out[&sis], &[inv0, inv1], 1e-15);
    close("eq_scale f64", &out[&eqs], &[2.0 * inv0, 0.5 * inv1], 1e-15);
    close("eq_bias f64", &out[&eqb], &[1.0 - 2.5 * 2.0 * inv0, -1.0], 1e-15);
}

// ------------------------------------------------------------------------------------------
// Backward ops against finite differences of their forward ops (f64)
// ------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Layer,
    Rms,
    Batch,
    Instance,
    Ada,
    /// Groupnorm with this many groups.
    Group(i64),
}

/// Run the forward op in f64: (y, mean, inv_variance).
fn forward(kind: Kind, x: &Nd, scale: &Nd, bias: Option<&Nd>) -> (Nd, Option<Nd>, Nd) {
    let f64t = DataType::F64;
    let mut g = Graph::new("fwd");
    let xt = input(&mut g, "x", &x.dims, f64t, None);
    let st = input(&mut g, "scale", &scale.dims, f64t, None);
    let bt = bias.map(|b| input(&mut g, "bias", &b.dims, f64t, None));
    let attrs = NormAttrs::default().with_epsilon(1e-3);
    let (y, mean, inv) = match kind {
        Kind::Layer => {
            let (y, m, v) = g.layernorm(xt, st, bt.unwrap(), attrs);
            (y, m, v.unwrap())
        }
        Kind::Rms => {
            let (y, v) = g.rmsnorm(xt, st, bt, attrs);
            (y, None, v.unwrap())
        }
        Kind::Instance => {
            let (y, m, v) = g.instancenorm(xt, st, bt.unwrap(), attrs);
            (y, m, v.unwrap())
        }
        Kind::Ada => {
            let (y, m, v) = g.adalayernorm(xt, st, bt.unwrap(), attrs);
            (y, m, v.unwrap())
        }
        Kind::Group(groups) => {
            let (y, m, v) = g.groupnorm(xt, st, bt.unwrap(), GroupnormAttrs::new(groups).with_epsilon(1e-3));
            (y, m, v.unwrap())
        }
        Kind::Batch => {
            let (y, m, v, _) = g.batchnorm(xt, st, bt.unwrap(), None, &[], BatchnormAttrs { epsilon: 1e-3, momentum: 0.1 });
            (y, Some(m), v)
        }
    };
    g.set_output(y);
    g.set_output(inv);
    if let Some(m) = mean {
        g.set_output(m);
    }
    let mut vals: HashMap<TensorId, Nd> = [(xt, x.clone()), (st, scale.clone())].into();
    if let (Some(bt), Some(b)) = (bt, bias) {
        vals.insert(bt, b.clone());
    }
    let mut out = run_cpu(&g, &vals).unwrap();
    (out.remove(&y).unwrap(), mean.map(|m| out.remove(&m).unwrap()), out.remove(&inv).unwrap())
}

/// Run the backward op in f64: (dx, dscale, dbias).
fn backward(kind: Kind, dy: &Nd, x: &Nd, scale: &Nd, mean: Option<&Nd>, inv: &Nd, with_dbias: bool) -> (Nd, Nd, Option<Nd>) {
    let f64t = DataType::F64;
    let mut g = Graph::new("bwd");
    let dyt = input(&mut g, "dy", &dy.dims, f64t, None);
    let xt = input(&mut g, "x", &x.dims, f64t, None);
    let st = input(&mut g, "scale", &scale.dims, f64t, None);
    let mt = mean.map(|m| input(&mut g, "mean", &m.dims, f64t, None));
    let it = input(&mut g, "inv", &inv.dims, f64t, None);
    let (dx, ds, db) = match kind {
        Kind::Layer => {
            let r = g.layernorm_backward(dyt, xt, st, mt.unwrap(), it);
            (r.0, r.1, Some(r.2))
        }
        Kind::Rms => g.rmsnorm_backward(dyt, xt, st, it, with_dbias),
        Kind::Batch => {
            let r = g.batchnorm_backward(dyt, xt, st, mt.unwrap(), it);
            (r.0, r.1, Some(r.2))
        }
        Kind::Instance => {
            let r = g.instancenorm_backward(dyt, xt, st, mt.unwrap(), it);
            (r.0, r.1, Some(r.2))
        }
        Kind::Ada => {
            let r = g.adalayernorm_backward(dyt, xt, st, mt.unwrap(), it);
            (r.0, r.1, Some(r.2))
        }
        Kind::Group(groups) => {
            let r = g.groupnorm_backward(dyt, xt, st, mt.unwrap(), it, groups);
            (r.0, r.1, Some(r.2))
        }
    };
    g.set_output(dx);
    g.set_output(ds);
    if let Some(db) = db {
        g.set_output(db);
    }
    let mut vals: HashMap<TensorId, Nd> = [(dyt, dy.clone()), (xt, x.clone()), (st, scale.clone()), (it, inv.clone())].into();
    if let (Some(mt), Some(m)) = (mt, mean) {
        vals.insert(mt, m.clone());
    }
    let mut out = run_cpu(&g, &vals).unwrap();
    (out.remove(&dx).unwrap(), out.remove(&ds).unwrap(), db.map(|d| out.remove(&d).unwrap()))
}

/// dx, dscale, dbias of the backward op against central differences of sum(y * dy).
fn check_gradients(kind: Kind, x_dims: &[usize], param_dims: &[usize], with_bias: bool, seed: u64) {
    let mut rng = SplitMix64::new(seed);
    let f64t = DataType::F64;
    let x = rand_nd(x_dims, f64t, &mut rng);
    // Scale away from zero so that every gradient is well away from zero too.
    let scale = rand_pos(param_dims, f64t, 0.5, 1.5, &mut rng);
    let bias = if with_bias { Some(rand_nd(param_dims, f64t, &mut rng)) } else { None };
    let (y, mean, inv) = forward(kind, &x, &scale, bias.as_ref());
    let dy = rand_nd(&y.dims, f64t, &mut rng);
    let (dx, dscale, dbias) = backward(kind, &dy, &x, &scale, mean.as_ref(), &inv, with_bias);
    assert_eq!(dx.dims, x.dims);
    assert_eq!(dscale.dims, scale.dims);
    let h = 1e-6;
    let tol = 1e-7;
    let num_dx = numeric_gradient(&x, h, |xp| dot(&forward(kind, xp, &scale, bias.as_ref()).0, &dy));
    close(&format!("{kind:?} dx"), &dx, &num_dx.data, tol);
    let num_ds = numeric_gradient(&scale, h, |sp| dot(&forward(kind, &x, sp, bias.as_ref()).0, &dy));
    close(&format!("{kind:?} dscale"), &dscale, &num_ds.data, tol);
    match (&bias, dbias) {
        (Some(b), Some(db)) => {
            let num_db = numeric_gradient(b, h, |bp| dot(&forward(kind, &x, &scale, Some(bp)).0, &dy));
            close(&format!("{kind:?} dbias"), &db, &num_db.data, tol);
        }
        (None, None) => {}
        _ => panic!("{kind:?}: dbias present without bias or missing with it"),
    }
}

#[test]
fn layernorm_backward_matches_finite_differences() {
    // scale and bias broadcast over axis 1: dscale and dbias sum over it.
    check_gradients(Kind::Layer, &[3, 4, 5], &[1, 1, 5], true, 11);
    check_gradients(Kind::Layer, &[2, 7], &[1, 7], true, 12);
}

#[test]
fn rmsnorm_backward_matches_finite_differences() {
    check_gradients(Kind::Rms, &[3, 7], &[1, 7], true, 13);
    check_gradients(Kind::Rms, &[2, 3, 5], &[1, 3, 5], false, 14);
}

#[test]
fn batchnorm_backward_matches_finite_differences() {
    check_gradients(Kind::Batch, &[3, 2, 2, 3], &[1, 2, 1, 1], true, 15);
    check_gradients(Kind::Batch, &[5, 3], &[1, 3], true, 16);
}

#[test]
fn instancenorm_backward_matches_finite_differences() {
    check_gradients(Kind::Instance, &[2, 3, 2, 3], &[1, 3, 1, 1], true, 17);
}

#[test]
fn groupnorm_backward_matches_finite_differences() {
    check_gradients(Kind::Group(3), &[2, 6, 2, 3], &[1, 6, 1, 1], true, 19);
    check_gradients(Kind::Group(2), &[3, 4, 5], &[1, 4, 1], true, 20);
    check_gradients(Kind::Group(1), &[2, 3], &[1, 3], true, 21);
}

#[test]
fn adalayernorm_backward_matches_finite_differences() {
    check_gradients(Kind::Ada, &[2, 3, 5], &[2, 1, 5], true, 18);
}

#[test]
fn stats_types_follow_x() {
    for (xt, want) in [(DataType::F64, DataType::F64), (DataType::F32, DataType::F32), (DataType::F16, DataType::F32)] {
        let mut g = Graph::new("types");
        let x = input(&mut g, "x", &[2, 3, 4], xt, None);
        let s = input(&mut g, "s", &[1, 3, 1], xt, None);
        let b = input(&mut g, "b", &[1, 3, 1], xt, None);
        let (y, m, v) = g.instancenorm(x, s, b, NormAttrs::default());
        let (m, v) = (g.set_output(m.unwrap()), g.set_output(v.unwrap()));
        g.set_output(y);
        let (sum, _) = g.genstats(x);
        g.set_output(sum);
        g.validate().unwrap();
        assert_eq!(g.resolved_data_type(y), Some(xt));
        for t in [m, v, sum] {
            assert_eq!(g.resolved_data_type(t), Some(want), "{xt}");
        }
    }
}

#[test]
fn graphs_round_trip_through_json() {
    let mut g = Graph::new("json");
    let x = input(&mut g, "x", &[2, 3, 4, 4], DataType::F32, None);
    let s = input(&mut g, "s", &[1, 3, 1, 1], DataType::F32, None);
    let b = input(&mut g, "b", &[1, 3, 1, 1], DataType::F32, None);
    let p = input(&mut g, "p", &[2, 3, 1, 1], DataType::F32, None);
    let (y, _, _, _) = g.batchnorm(x, s, b, None, &[p], BatchnormAttrs { epsilon: 1e-3, momentum: 0.2 });
    g.set_output(y);
    let (sum, sq) = g.genstats(x);
    let _ = g.bn_finalize(sum, sq, s, b, None, BnFinalizeAttrs::new(32));
    let (gy, gm, gv) = g.groupnorm(x, s, b, GroupnormAttrs::new(3).with_epsilon(1e-3));
    g.set_output(gy);
    let _ = g.groupnorm_backward(x, x, s, gm.unwrap(), gv.unwrap(), 3);
    g.validate().unwrap();
    let back = Graph::from_json(&g.to_json().unwrap()).unwrap();
    assert_eq!(back, g);
}

// ------------------------------------------------------------------------------------------
// Bad graphs
// ------------------------------------------------------------------------------------------

fn ln_graph(x_dims: &[usize], p_dims: &[usize], x_type: DataType, attrs: NormAttrs) -> (Graph, TensorId) {
    let mut g = Graph::new("bad");
    let x = input(&mut g, "x", x_dims, x_type, None);
    let s = input(&mut g, "s", p_dims, DataType::F32, None);
    let b = input(&mut g, "b", p_dims, DataType::F32, None);
    let (y, _, _) = g.layernorm(x, s, b, attrs);
    g.set_output(y);
    (g, y)
}

fn bn_graph(x_dims: &[usize], p_dims: &[usize], running: bool, peers: &[&[usize]], attrs: BatchnormAttrs) -> Graph {
    let mut g = Graph::new("bad");
    let x = input(&mut g, "x", x_dims, DataType::F32, None);
    let s = input(&mut g, "s", p_dims, DataType::F32, None);
    let b = input(&mut g, "b", p_dims, DataType::F32, None);
    let run = if running { Some((input(&mut g, "rm", p_dims, DataType::F32, None), input(&mut g, "rv", p_dims, DataType::F32, None))) } else { None };
    let peer_ids: Vec<TensorId> = peers.iter().enumerate().map(|(i, d)| input(&mut g, &format!("p{i}"), d, DataType::F32, None)).collect();
    let (y, _, _, _) = g.batchnorm(x, s, b, run, &peer_ids, attrs);
    g.set_output(y);
    g
}

#[test]
fn bad_graphs_are_rejected() {
    let bn = BatchnormAttrs::default();
    // 1. scale with the wrong channel count.
    let mut g = bn_graph(&[2, 3, 4, 4], &[1, 4, 1, 1], false, &[], bn.clone());
    expect_invalid(&mut g, "has 4 channels but x has 3");
    // 2. running mean given without running variance.
    let mut g = bn_graph(&[2, 3, 4, 4], &[1, 3, 1, 1], true, &[], bn.clone());
    g.nodes[0].inputs.retain(|p| p.name != "in_running_var");
    expect_invalid(&mut g, "`in_running_mean` is given without `in_running_var`");
    // 3. momentum outside [0, 1].
    let mut g = bn_graph(&[2, 3, 4, 4], &[1, 3, 1, 1], true, &[], BatchnormAttrs { epsilon: 1e-5, momentum: 1.5 });
    expect_invalid(&mut g, "momentum must be in [0, 1]");
    // 4. non-positive epsilon.
    let (mut g, _) = ln_graph(&[2, 5], &[1, 5], DataType::F32, NormAttrs::default().with_epsilon(0.0));
    expect_invalid(&mut g, "epsilon must be positive");
    // 5. integer x.
    let (mut g, _) = ln_graph(&[2, 5], &[1, 5], DataType::I32, NormAttrs::default());
    expect_invalid(&mut g, "floating-point tensors only");
    // 6. layernorm scale that is not [1, ...].
    let (mut g, _) = ln_graph(&[2, 5], &[2, 5], DataType::F32, NormAttrs::default());
    expect_invalid(&mut g, "it must be [1, 5 or 1]");
    // 7. peer statistics of the wrong shape.
    let mut g = bn_graph(&[2, 3, 4, 4], &[1, 3, 1, 1], false, &[&[2, 3, 1, 1], &[1, 3, 1, 1]], bn.clone());
    expect_invalid(&mut g, "input `peer_stats_1` has dims [1, 3, 1, 1], but peer statistics");
    // 8. running variance update with one value per channel.
    let mut g = bn_graph(&[1, 3, 1, 1], &[1, 3, 1, 1], true, &[], bn.clone());
    expect_invalid(&mut g, "at least 2 values per channel");

    // 9. bn_finalize: accum_count below 1, and 1 with running statistics.
    for (count, running, needle) in [(0, false, "accum_count (elements per channel behind the sums) must be at least 1"), (1, true, "accum_count of at least 2")] {
        let mut g = Graph::new("bad");
        let ids: Vec<TensorId> = (0..6).map(|i| input(&mut g, &format!("t{i}"), &[1, 3, 1, 1], DataType::F32, None)).collect();
        let run = if running { Some((ids[4], ids[5])) } else { None };
        let (eqs, ..) = g.bn_finalize(ids[0], ids[1], ids[2], ids[3], run, BnFinalizeAttrs::new(count));
        g.set_output(eqs);
        expect_invalid(&mut g, needle);
    }
    // 10. bn_finalize sums that are not per channel.
    let mut g = Graph::new("bad");
    let ids: Vec<TensorId> = (0..4).map(|i| input(&mut g, &format!("t{i}"), &[2, 3, 1, 1], DataType::F32, None)).collect();
    let _ = g.bn_finalize(ids[0], ids[1], ids[2], ids[3], None, BnFinalizeAttrs::new(8));
    expect_invalid(&mut g, "per-channel dims [1, C, 1, ...]");

    // 11. backward with statistics of the wrong dims.
    let mut g = Graph::new("bad");
    let dy = input(&mut g, "dy", &[3, 5], DataType::F32, None);
    let x = input(&mut g, "x", &[3, 5], DataType::F32, None);
    let s = input(&mut g, "s", &[1, 5], DataType::F32, None);
    let m = input(&mut g, "m", &[2, 1], DataType::F32, None);
    let v = input(&mut g, "v", &[3, 1], DataType::F32, None);
    let (dx, _, _) = g.layernorm_backward(dy, x, s, m, v);
    g.set_output(dx);
    expect_invalid(&mut g, "input `mean` has dims [2, 1], but the statistics of x [3, 5] have dims [3, 1]");
    // 12. backward with dy not shaped like x.
    let mut g = Graph::new("bad");
    let dy = input(&mut g, "dy", &[3, 4], DataType::F32, None);
    let x = input(&mut g, "x", &[3, 5], DataType::F32, None);
    let s = input(&mut g, "s", &[1, 5], DataType::F32, None);
    let v = input(&mut g, "v", &[3, 1], DataType::F32, None);
    let _ = g.rmsnorm_backward(dy, x, s, v, true);
    expect_invalid(&mut g, "input `dy` has dims [3, 4] but x has [3, 5]");
    // 13. instancenorm needs a spatial axis.
    let mut g = Graph::new("bad");
    let x = input(&mut g, "x", &[2, 3], DataType::F32, None);
    let s = input(&mut g, "s", &[1, 3], DataType::F32, None);
    let _ = g.instancenorm(x, s, s, NormAttrs::default());
    expect_invalid(&mut g, "rank 3 or more");
    // 14. adalayernorm scale whose last dim is not D.
    let mut g = Graph::new("bad");
    let x = input(&mut g, "x", &[2, 3, 5], DataType::F32, None);
    let s = input(&mut g, "s", &[2, 1, 4], DataType::F32, None);
    let _ = g.adalayernorm(x, s, s, NormAttrs::default());
    expect_invalid(&mut g, "it must be [2 or 1, 3 or 1, 5]");
    // 15. the inference phase with a statistics output connected.
    let (mut g, _) = ln_graph(&[2, 5], &[1, 5], DataType::F32, NormAttrs::inference());
    let extra = g.tensor(TensorDesc::new("m", &[2, 1], DataType::F32));
    g.nodes[0].outputs.push(Port { name: "mean".into(), tensor: extra });
    expect_invalid(&mut g, "the inference phase produces only `y`");
    // 16. a misspelt port.
    let (mut g, _) = ln_graph(&[2, 5], &[1, 5], DataType::F32, NormAttrs::default());
    for p in &mut g.nodes[0].inputs {
        if p.name == "bias" {
            p.name = "biass".into();
        }
    }
    expect_invalid(&mut g, "has no input port `biass`");
    // 17. groupnorm: groups that do not divide the channels, and statistics of the wrong dims.
    let mut g = Graph::new("bad");
    let x = input(&mut g, "x", &[2, 10, 3], DataType::F32, None);
    let s = input(&mut g, "s", &[1, 10, 1], DataType::F32, None);
    let _ = g.groupnorm(x, s, s, GroupnormAttrs::new(4));
    expect_invalid(&mut g, "groupnorm \"groupnorm_0\": input `x` (tensor \"x\", dims [2, 10, 3]) has 10 channels, which 4 groups do not divide");
    let mut g = Graph::new("bad");
    let x = input(&mut g, "x", &[2, 10, 3], DataType::F32, None);
    let s = input(&mut g, "s", &[1, 10, 1], DataType::F32, None);
    let _ = g.groupnorm(x, s, s, GroupnormAttrs::new(0));
    expect_invalid(&mut g, "groups must be at least 1, got 0");
    let mut g = Graph::new("bad");
    let dy = input(&mut g, "dy", &[2, 10, 3], DataType::F32, None);
    let x = input(&mut g, "x", &[2, 10, 3], DataType::F32, None);
    let s = input(&mut g, "s", &[1, 10, 1], DataType::F32, None);
    let m = input(&mut g, "m", &[2, 10, 1], DataType::F32, None);
    let v = input(&mut g, "v", &[2, 5, 1], DataType::F32, None);
    let _ = g.groupnorm_backward(dy, x, s, m, v, 5);
    expect_invalid(&mut g, "input `mean` has dims [2, 10, 1], but the statistics of x [2, 10, 3] have dims [2, 5, 1]");
    let mut g = Graph::new("bad");
    let x = input(&mut g, "x", &[2, 10, 3], DataType::F32, None);
    let s = input(&mut g, "s", &[1, 5, 1], DataType::F32, None);
    let _ = g.groupnorm(x, s, s, GroupnormAttrs::new(5));
    expect_invalid(&mut g, "input `scale` has 5 channels but x has 10");
    // 18. errors name the op and the node.
    let (mut g, _) = ln_graph(&[2, 5], &[1, 5], DataType::F32, NormAttrs::default().with_epsilon(-1.0));
    expect_invalid(&mut g, "layernorm \"layernorm_0\": epsilon must be positive and finite, got -1");
}

/// A norm's epsilon (and batchnorm's momentum) given by a by-value scalar on the op's port, as
/// the cudnn frontend gives them: the value comes with each execution's variant pack and gives
/// what the attribute of the same value gives; bad tensors on those ports are refused.
#[test]
fn attributes_given_by_runtime_scalars() {
    use ferrodnn::testing::{random_inputs, run_cpu};
    let f = DataType::F32;
    let build = |eps_port: bool, eps: f64| {
        let mut g = Graph::new("ln_eps").io_data_type(f);
        let x = g.tensor(TensorDesc::new("x", &[5, 3, 7], f));
        let s = g.tensor(TensorDesc::new("s", &[1, 3, 7], f));
        let b = g.tensor(TensorDesc::new("b", &[1, 3, 7], f));
        let (y, m, v) = g.layernorm(x, s, b, NormAttrs::default().with_epsilon(if eps_port { 1e-5 } else { eps }));
        for t in [y, m.unwrap(), v.unwrap()] {
            g.set_output(t);
        }
        let e = eps_port.then(|| {
            let e = g.tensor(TensorDesc::runtime_scalar("eps", f));
            g.set_attribute_tensor(y, "epsilon", e).unwrap();
            e
        });
        (g, y, e)
    };
    // (Values f32 holds exactly: the tensor is f32, the attribute f64.)
    for eps in [0.0009765625, 0.25] {
        let (mut with_port, y, e) = build(true, eps);
        with_port.validate().unwrap();
        let mut inputs = random_inputs(&with_port, 7);
        inputs.insert(e.unwrap(), ferrodnn::Nd::new(vec![1], vec![eps]));
        let got = run_cpu(&with_port, &inputs).unwrap();
        let (mut plain, y2, _) = build(false, eps);
        plain.validate().unwrap();
        let want = run_cpu(&plain, &inputs).unwrap();
        assert_eq!(got[&y].data, want[&y2].data, "eps {eps}");
    }
    // A bad value from the variant pack is refused when the plan executes, naming the op.
    let (mut with_port, _, e) = build(true, 0.0);
    with_port.validate().unwrap();
    let mut inputs = random_inputs(&with_port, 7);
    inputs.insert(e.unwrap(), ferrodnn::Nd::new(vec![1], vec![-1.0]));
    let err = run_cpu(&with_port, &inputs).unwrap_err().to_string();
    assert!(err.contains("layernorm") && err.contains("epsilon must be positive and finite, got -1 (from the variant pack)"), "{err}");
    // Refused: a tensor that is not a by-value scalar, a bad value, a port the op lacks.
    let (mut g, y, _) = build(false, 1e-5);
    let t = g.tensor(TensorDesc::new("not_by_value", &[1], f));
    g.set_attribute_tensor(y, "epsilon", t).unwrap();
    let err = g.validate().unwrap_err().to_string();
    assert!(err.contains("input `epsilon`") && err.contains("passed by value"), "{err}");
    let (mut g, y, _) = build(false, 1e-5);
    let t = g.tensor(TensorDesc::scalar("eps", -1.0, f));
    g.set_attribute_tensor(y, "epsilon", t).unwrap();
    let err = g.validate().unwrap_err().to_string();
    assert!(err.contains("epsilon must be positive"), "{err}");
    let (mut g, y, _) = build(false, 1e-5);
    let t = g.tensor(TensorDesc::runtime_scalar("mo", f));
    let err = g.set_attribute_tensor(y, "momentum", t).unwrap_err().to_string();
    assert!(err.contains("layernorm") && err.contains("no attribute port `momentum`: it takes only epsilon"), "{err}");
    // The same port connected by hand: validation refuses it.
    let ln = g.nodes.iter().position(|n| n.outputs.iter().any(|p| p.tensor == y)).unwrap();
    g.nodes[ln].inputs.push(ferrodnn::graph::Port { name: "momentum".into(), tensor: t });
    let err = g.validate().unwrap_err().to_string();
    assert!(err.contains("no input port `momentum`"), "{err}");
    assert!(g.set_attribute_tensor(y, "scale", t).is_err());
}
