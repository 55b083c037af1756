//! Softmax, log-softmax and their stats on the CPU engine against the direct formulas written
//! here; the backward ops against central finite differences of the forward; bad graphs.

use ferrodnn::graph::{stride_order, strides_for_order};
use ferrodnn::testing::{dot, numeric_gradient, random_values, relative_error, run_cpu, tolerance, SplitMix64};
use ferrodnn::{DataType, Error, Graph, Nd, TensorDesc, TensorId};
use std::collections::HashMap;

fn rand_nd(dims: &[usize], dt: DataType, seed: u64) -> Nd {
    let mut rng = SplitMix64::new(seed);
    Nd::new(dims.to_vec(), random_values(dims.iter().product(), dt, &mut rng))
}

fn flat(dims: &[usize], idx: &[usize]) -> usize {
    idx.iter().zip(dims).fold(0, |acc, (&i, &d)| acc * d + i)
}

/// Softmax, log-softmax and log-sum-exp straight from their definitions, one row at a time.
/// `shift` is subtracted before exponentiating (exp(x - c) / sum exp(x - c) is the same
/// softmax), so rows near 1000 can be checked without overflowing here.
fn reference(x: &Nd, axis: usize, shift: f64) -> (Nd, Nd, Nd) {
    let dims = &x.dims;
    let mut sm = Nd::zeros(dims);
    let mut lsm = Nd::zeros(dims);
    let mut sdims = dims.clone();
    sdims[axis] = 1;
    let mut stats = Nd::zeros(&sdims);
    let mut idx = vec![0usize; dims.len()];
    let total: usize = sdims.iter().product();
    for r in 0..total {
        // Row r: the multi-index of the stats element, varied along the axis.
        let mut rem = r;
        for a in (0..dims.len()).rev() {
            idx[a] = rem % sdims[a];
            rem /= sdims[a];
        }
        let mut denom = 0.0;
        for k in 0..dims[axis] {
            idx[axis] = k;
            denom += (x.data[flat(dims, &idx)] - shift).exp();
        }
        for k in 0..dims[axis] {
            idx[axis] = k;
            let f = flat(dims, &idx);
            let e = (x.data[f] - shift).exp();
            sm.data[f] = e / denom;
            lsm.data[f] = (x.data[f] - shift) - denom.ln();
        }
        stats.data[r] = shift + denom.ln();
    }
    (sm, lsm, stats)
}

struct Forward {
    g: Graph,
    x: TensorId,
    y: TensorId,
    stats: Option<TensorId>,
}

fn forward_graph(desc: TensorDesc, axis: usize, log: bool, stats: bool) -> Forward {
    let mut g = Graph::new("softmax");
    let x = g.tensor(desc);
    let (y, s) = g.softmax(x, axis, log, stats);
    g.set_output(y);
    if let Some(s) = s {
        g.set_output(s);
    }
    g.validate().unwrap();
    Forward { g, x, y, stats: s }
}

fn run(f: &Forward, x: &Nd) -> HashMap<TensorId, Nd> {
    let mut inputs = HashMap::new();
    inputs.insert(f.x, x.clone());
    run_cpu(&f.g, &inputs).unwrap()
}

#[test]
fn every_axis_f64() {
    let dims = [3usize, 5, 7];
    let x = rand_nd(&dims, DataType::F64, 1);
    for axis in 0..3 {
        let (sm, lsm, lse) = reference(&x, axis, 0.0);
        for log in [false, true] {
            let f = forward_graph(TensorDesc::new("x", &[3, 5, 7], DataType::F64), axis, log, true);
            let out = run(&f, &x);
            let want = if log { &lsm } else { &sm };
            let err = relative_error(&out[&f.y].data, &want.data);
            assert!(err < 1e-13, "axis {axis} log {log}: relative error {err}");
            let stats = &out[&f.stats.unwrap()];
            assert_eq!(stats.dims, lse.dims);
            assert_eq!(f.g.resolved_data_type(f.stats.unwrap()), Some(DataType::F64));
            assert!(relative_error(&stats.data, &lse.data) < 1e-13);
        }
        // Softmax rows sum to one.
        let f = forward_graph(TensorDesc::new("x", &[3, 5, 7], DataType::F64), axis, false, false);
        assert!(f.stats.is_none());
        let y = &run(&f, &x)[&f.y];
        let (_, _, ones) = reference(&Nd::new(y.dims.clone(), y.data.iter().map(|v| v.ln()).collect()), axis, 0.0);
        assert!(ones.data.iter().all(|v| v.abs() < 1e-13), "log of row sums: {:?}", ones.data);
    }
}

#[test]
fn log_softmax_convenience() {
    let x = rand_nd(&[4, 6], DataType::F32, 2);
    let mut g = Graph::new("lsm");
    let xi = g.tensor(TensorDesc::new("x", &[4, 6], DataType::F32));
    let y = g.log_softmax(xi, 1);
    g.set_output(y);
    let out = run_cpu(&g, &HashMap::from([(xi, x.clone())])).unwrap();
    let (_, lsm, _) = reference(&x, 1, 0.0);
    assert!(relative_error(&out[&y].data, &lsm.data) < 1e-6);
    assert!(g.nodes[0].op.kind() == "log_softmax");
}

#[test]
fn non_contiguous_and_half() {
    let dims = [3usize, 7, 5];
    for (dt, seed) in [(DataType::F32, 3), (DataType::F16, 4), (DataType::Bf16, 5)] {
        let x = rand_nd(&dims, dt, seed);
        let descs = [TensorDesc::new("x", &[3, 7, 5], dt).with_layout(&[2, 0, 1]), TensorDesc::new("x", &[3, 7, 5], dt).with_strides(&[90, 12, 2])];
        for desc in descs {
            for axis in [0, 1] {
                for log in [false, true] {
                    let f = forward_graph(desc.clone(), axis, log, true);
                    let out = run(&f, &x);
                    let (sm, lsm, lse) = reference(&x, axis, 0.0);
                    let want = if log { lsm } else { sm };
                    let err = relative_error(&out[&f.y].data, &want.data);
                    assert!(err < tolerance(dt).max(1e-6), "{dt} axis {axis} log {log} strides {:?}: {err}", desc.strides);
                    // Stats are f32 for a non-f64 input, so they are as good as f32.
                    let s = f.stats.unwrap();
                    assert_eq!(f.g.resolved_data_type(s), Some(DataType::F32));
                    assert!(relative_error(&out[&s].data, &lse.data) < 1e-6);
                    // Outputs follow x's stride order.
                    let yd = f.g.desc(f.y);
                    assert_eq!(yd.strides, strides_for_order(&yd.dims, &stride_order(&desc.strides)));
                }
            }
        }
    }
}

#[test]
fn large_inputs_are_stable() {
    let dims = [4usize, 9];
    for (offset, seed) in [(1000.0, 6), (-1000.0, 7)] {
        let mut x = rand_nd(&dims, DataType::F64, seed);
        for v in &mut x.data {
            *v = offset + 5.0 * *v;
        }
        let (sm, lsm, lse) = reference(&x, 1, offset);
        for log in [false, true] {
            let f = forward_graph(TensorDesc::new("x", &[4, 9], DataType::F64), 1, log, true);
            let out = run(&f, &x);
            let y = &out[&f.y];
            assert!(y.data.iter().all(|v| v.is_finite()), "offset {offset}: {:?}", y.data);
            let want = if log { &lsm } else { &sm };
            assert!(relative_error(&y.data, &want.data) < 1e-12, "offset {offset} log {log}");
            assert!(relative_error(&out[&f.stats.unwrap()].data, &lse.data) < 1e-14);
        }
        // And in f32, where a naive exp would overflow at 89.
        let f = forward_graph(TensorDesc::new("x", &[4, 9], DataType::F32), 1, false, true);
        let xf = Nd::new(x.dims.clone(), x.data.iter().map(|&v| v as f32 as f64).collect());
        let (sm32, _, _) = reference(&xf, 1, offset);
        let out = run(&f, &xf);
        assert!(relative_error(&out[&f.y].data, &sm32.data) < 1e-6);
    }
}

/// dx from the backward op against d(sum(y * dy)) / dx of the forward op, in f64.
fn check_backward(log: bool, axis: usize, desc_dims: &[i64], layout: &[usize]) {
    let dims: Vec<usize> = desc_dims.iter().map(|&d| d as usize).collect();
    let x = rand_nd(&dims, DataType::F64, 10 + axis as u64);
    let dy = rand_nd(&dims, DataType::F64, 20 + axis as u64);
    let fwd = forward_graph(TensorDesc::new("x", desc_dims, DataType::F64).with_layout(layout), axis, log, false);
    let y = run(&fwd, &x)[&fwd.y].clone();

    let mut g = Graph::new("softmax_backward");
    let yi = g.tensor(TensorDesc::new("y", desc_dims, DataType::F64));
    let dyi = g.tensor(TensorDesc::new("dy", desc_dims, DataType::F64).with_layout(layout));
    let dx = g.softmax_backward(yi, dyi, axis, log);
    g.set_output(dx);
    let got = run_cpu(&g, &HashMap::from([(yi, y), (dyi, dy.clone())])).unwrap()[&dx].clone();

    let numeric = numeric_gradient(&x, 1e-6, |xp| dot(&run(&fwd, xp)[&fwd.y], &dy));
    let err = relative_error(&got.data, &numeric.data);
    assert!(err < 1e-7, "log {log} axis {axis}: relative error {err}");
}

#[test]
fn backward_matches_finite_differences() {
    for log in [false, true] {
        check_backward(log, 1, &[3, 5, 4], &[0, 1, 2]);
        check_backward(log, 0, &[5, 3], &[1, 0]);
        check_backward(log, 2, &[2, 3, 7], &[2, 0, 1]);
    }
}

fn expect_invalid(mut g: Graph, kind: &str, needle: &str) {
    match g.validate() {
        Err(Error::InvalidGraph(msg)) => {
            assert!(msg.contains(needle), "message `{msg}` lacks `{needle}`");
            assert!(msg.starts_with(&format!("{kind} \"")), "message `{msg}` does not name {kind}");
        }
        other => panic!("expected InvalidGraph containing `{needle}`, got {other:?}"),
    }
}

#[test]
fn bad_graphs() {
    // Axis out of range.
    let mut g = Graph::new("bad");
    let x = g.tensor(TensorDesc::new("x", &[2, 3], DataType::F32));
    let (y, _) = g.softmax(x, 2, false, true);
    g.set_output(y);
    expect_invalid(g, "softmax", "axis 2 is out of range for input `x` of rank 2");

    // Integer input.
    let mut g = Graph::new("bad");
    let x = g.tensor(TensorDesc::new("x", &[2, 3], DataType::I32));
    let y = g.log_softmax(x, 1);
    g.set_output(y);
    expect_invalid(g, "log_softmax", "input `x` (tensor \"x\") must be a floating-point type, got i32");

    // Backward: y and dy of different dims.
    let mut g = Graph::new("bad");
    let y = g.tensor(TensorDesc::new("y", &[2, 3], DataType::F32));
    let dy = g.tensor(TensorDesc::new("dy", &[2, 4], DataType::F32));
    let dx = g.softmax_backward(y, dy, 1, false);
    g.set_output(dx);
    expect_invalid(g, "softmax_backward", "input `dy` has dims [2, 4] but `y` has [2, 3]");

    // Backward: axis out of range.
    let mut g = Graph::new("bad");
    let y = g.tensor(TensorDesc::new("y", &[2, 3], DataType::F32));
    let dy = g.tensor(TensorDesc::new("dy", &[2, 3], DataType::F32));
    let dx = g.softmax_backward(y, dy, 5, true);
    g.set_output(dx);
    expect_invalid(g, "log_softmax_backward", "axis 5 is out of range");

    // Backward: integer dy.
    let mut g = Graph::new("bad");
    let y = g.tensor(TensorDesc::new("y", &[2, 3], DataType::F32));
    let dy = g.tensor(TensorDesc::new("dy", &[2, 3], DataType::I8));
    let dx = g.softmax_backward(y, dy, 1, false);
    g.set_output(dx);
    expect_invalid(g, "softmax_backward", "input `dy` (tensor \"dy\") must be a floating-point type, got i8");
}
