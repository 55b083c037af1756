//! Pooling on the CPU engine against direct loops over every window position written here
//! (1D, 2D, 3D; max and both averages; asymmetric padding; stride larger than the window;
//! channels-last; f16), the backward against finite differences, and bad graphs.

use ferrodnn::graph::ops::resample::{ResampleAttrs, ResampleMode};
use ferrodnn::graph::{stride_order, strides_for_order};
use ferrodnn::layout::for_each_index;
use ferrodnn::testing::{dot, numeric_gradient, random_values, relative_error, run_cpu, tolerance, SplitMix64};
use ferrodnn::{DataType, Error, Graph, Nd, TensorDesc, TensorId};
use std::collections::HashMap;

const MODES: [ResampleMode; 3] = [ResampleMode::Max, ResampleMode::AvgIncludePadding, ResampleMode::AvgExcludePadding];

fn rand_nd(dims: &[usize], dt: DataType, seed: u64) -> Nd {
    let mut rng = SplitMix64::new(seed);
    Nd::new(dims.to_vec(), random_values(dims.iter().product(), dt, &mut rng))
}

fn attrs(mode: ResampleMode, window: &[i64], stride: &[i64], pre: &[i64], post: &[i64]) -> ResampleAttrs {
    ResampleAttrs { mode, window: window.to_vec(), stride: stride.to_vec(), pre_padding: pre.to_vec(), post_padding: post.to_vec() }
}

/// Pooling by visiting every position of every window, padding included, and classifying each
/// as padding or a real element.
fn reference(x: &Nd, a: &ResampleAttrs) -> Nd {
    let nsp = x.dims.len() - 2;
    let mut out_dims = x.dims[..2].to_vec();
    for d in 0..nsp {
        let padded = x.dims[2 + d] as i64 + a.pre_padding[d] + a.post_padding[d];
        out_dims.push(((padded - a.window[d]) / a.stride[d] + 1) as usize);
    }
    let window: Vec<usize> = a.window.iter().map(|&w| w as usize).collect();
    let mut y = Nd::zeros(&out_dims);
    for_each_index(&out_dims.clone(), |flat, o| {
        let (mut sum, mut real, mut positions) = (0.0, 0usize, 0usize);
        let mut max: Option<f64> = None;
        for_each_index(&window, |_, k| {
            let mut idx = vec![o[0], o[1]];
            let mut inside = true;
            for d in 0..nsp {
                let i = o[2 + d] as i64 * a.stride[d] - a.pre_padding[d] + k[d] as i64;
                inside &= i >= 0 && i < x.dims[2 + d] as i64;
                idx.push(i.max(0) as usize);
            }
            positions += 1;
            if inside {
                let v = x.at(&idx);
                sum += v;
                real += 1;
                let better = match max {
                    None => true,
                    Some(m) => v > m,
                };
                if better {
                    max = Some(v);
                }
            }
        });
        y.data[flat] = match a.mode {
            ResampleMode::Max => max.expect("a window with no real element"),
            ResampleMode::AvgIncludePadding => sum / positions as f64,
            ResampleMode::AvgExcludePadding => sum / real as f64,
        };
    });
    y
}

/// The 1D, 2D and 3D problems: (x dims, window, stride, pre, post).
type Case = (&'static [i64], &'static [i64], &'static [i64], &'static [i64], &'static [i64]);
const CASES: [Case; 6] = [
    (&[2, 3, 13], &[3], &[2], &[1], &[2]),
    // Stride larger than the window: some inputs belong to no window.
    (&[1, 2, 11], &[2], &[3], &[1], &[0]),
    (&[2, 3, 7, 5], &[3, 2], &[2, 3], &[1, 0], &[2, 1]),
    (&[1, 2, 6, 6], &[3, 3], &[2, 2], &[1, 1], &[1, 1]),
    (&[2, 2, 9, 7], &[2, 3], &[4, 5], &[0, 2], &[1, 0]),
    (&[1, 2, 5, 4, 6], &[2, 3, 2], &[2, 1, 3], &[1, 1, 0], &[0, 2, 1]),
];

fn usize_dims(d: &[i64]) -> Vec<usize> {
    d.iter().map(|&v| v as usize).collect()
}

fn forward_graph(desc: TensorDesc, a: &ResampleAttrs) -> (Graph, TensorId, TensorId) {
    let mut g = Graph::new("pool");
    let x = g.tensor(desc);
    let y = g.resample(x, a.clone());
    g.set_output(y);
    g.validate().unwrap_or_else(|e| panic!("{a:?}: {e}"));
    (g, x, y)
}

fn run_forward(desc: TensorDesc, a: &ResampleAttrs, x: &Nd) -> (Graph, TensorId, Nd) {
    let (g, xi, y) = forward_graph(desc, a);
    let out = run_cpu(&g, &HashMap::from([(xi, x.clone())])).unwrap();
    let yv = out[&y].clone();
    (g, y, yv)
}

#[test]
fn forward_1d_2d_3d_all_modes_f64() {
    for (ci, &(dims, w, s, pre, post)) in CASES.iter().enumerate() {
        let x = rand_nd(&usize_dims(dims), DataType::F64, ci as u64);
        for mode in MODES {
            let a = attrs(mode, w, s, pre, post);
            let (_, _, got) = run_forward(TensorDesc::new("x", dims, DataType::F64), &a, &x);
            let want = reference(&x, &a);
            assert_eq!(got.dims, want.dims, "case {ci} {mode:?}");
            let err = relative_error(&got.data, &want.data);
            assert!(err < 1e-14, "case {ci} {mode:?}: relative error {err}");
        }
    }
}

#[test]
fn hand_worked_values() {
    // x = [1, 2, 3], window 3, stride 1, padding 1 on both sides.
    let x = Nd::new(vec![1, 1, 3], vec![1.0, 2.0, 3.0]);
    let expect = [(ResampleMode::Max, [2.0, 3.0, 3.0]), (ResampleMode::AvgIncludePadding, [1.0, 2.0, 5.0 / 3.0]), (ResampleMode::AvgExcludePadding, [1.5, 2.0, 2.5])];
    for (mode, want) in expect {
        let a = attrs(mode, &[3], &[1], &[1], &[1]);
        let (_, _, got) = run_forward(TensorDesc::new("x", &[1, 1, 3], DataType::F64), &a, &x);
        assert_eq!(got.dims, vec![1, 1, 3]);
        for (g, w) in got.data.iter().zip(want) {
            assert!((g - w).abs() < 1e-15, "{mode:?}: got {:?} want {want:?}", got.data);
        }
    }
    // Max of a window of negatives with padding: padding is not a zero candidate.
    let neg = Nd::new(vec![1, 1, 2], vec![-3.0, -2.0]);
    let (_, _, got) = run_forward(TensorDesc::new("x", &[1, 1, 2], DataType::F64), &attrs(ResampleMode::Max, &[2], &[1], &[1], &[1]), &neg);
    assert_eq!(got.data, vec![-3.0, -2.0, -2.0]);
}

#[test]
fn channels_last_f32_and_f16() {
    for (dt, seed) in [(DataType::F32, 40), (DataType::F16, 41)] {
        for (ci, &(dims, w, s, pre, post)) in CASES.iter().enumerate().filter(|(_, c)| c.0.len() >= 4) {
            let rank = dims.len();
            // Channels last: n outermost, c innermost.
            let order: Vec<usize> = std::iter::once(0).chain(2..rank).chain(std::iter::once(1)).collect();
            let x = rand_nd(&usize_dims(dims), dt, seed + ci as u64);
            for mode in MODES {
                let a = attrs(mode, w, s, pre, post);
                let desc = TensorDesc::new("x", dims, dt).with_layout(&order);
                let (g, y, got) = run_forward(desc.clone(), &a, &x);
                let want = reference(&x, &a);
                let err = relative_error(&got.data, &want.data);
                let tol = if dt == DataType::F32 { 1e-6 } else { tolerance(dt) };
                assert!(err < tol, "{dt} case {ci} {mode:?}: relative error {err}");
                assert_eq!(g.resolved_data_type(y), Some(dt));
                // Channels-last in, channels-last out.
                let yd = g.desc(y);
                assert_eq!(stride_order(&yd.strides), order, "y strides {:?}", yd.strides);
                assert_eq!(yd.strides, strides_for_order(&yd.dims, &order));
            }
        }
    }
}

#[test]
fn integer_max_pooling() {
    let x = rand_nd(&[1, 2, 5, 5], DataType::I8, 50);
    let a = ResampleAttrs::max_2d(2, 2, 1);
    let (_, _, got) = run_forward(TensorDesc::new("x", &[1, 2, 5, 5], DataType::I8), &a, &x);
    assert_eq!(got, reference(&x, &a));
}

#[test]
fn convenience_constructors() {
    let a = ResampleAttrs::max_2d(3, 2, 1);
    assert_eq!(a, attrs(ResampleMode::Max, &[3, 3], &[2, 2], &[1, 1], &[1, 1]));
    let b = ResampleAttrs::avg_2d(2, 1, 0, false);
    assert_eq!(b, attrs(ResampleMode::AvgExcludePadding, &[2, 2], &[1, 1], &[0, 0], &[0, 0]));
    let (g, _, y) = forward_graph(TensorDesc::new("x", &[2, 3, 8, 9], DataType::F32), &a);
    assert_eq!(g.desc(y).dims, vec![2, 3, 4, 5]);
}

/// A random permutation of distinct values spaced 0.01 apart, so that max pooling has no ties
/// a finite-difference step could flip.
fn distinct_values(dims: &[usize], seed: u64) -> Nd {
    let n: usize = dims.iter().product();
    let mut rng = SplitMix64::new(seed);
    let mut v: Vec<f64> = (0..n).map(|i| (i as f64 - n as f64 / 2.0) * 0.01).collect();
    for i in (1..n).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    Nd::new(dims.to_vec(), v)
}

#[test]
fn backward_matches_finite_differences() {
    for (ci, &(dims, w, s, pre, post)) in CASES.iter().enumerate() {
        let ud = usize_dims(dims);
        let rank = dims.len();
        // Alternate row-major and channels-last inputs.
        let order: Vec<usize> = if ci % 2 == 0 { (0..rank).collect() } else { std::iter::once(0).chain(2..rank).chain(std::iter::once(1)).collect() };
        for mode in MODES {
            let a = attrs(mode, w, s, pre, post);
            let x = distinct_values(&ud, 60 + ci as u64);
            let (fg, xi, y) = forward_graph(TensorDesc::new("x", dims, DataType::F64).with_layout(&order), &a);
            let ydims: Vec<i64> = fg.desc(y).dims.clone();
            let dy = rand_nd(&usize_dims(&ydims), DataType::F64, 70 + ci as u64);

            let mut g = Graph::new("pool_backward");
            let dyi = g.tensor(TensorDesc::new("dy", &ydims, DataType::F64));
            let xb = g.tensor(TensorDesc::new("x", dims, DataType::F64).with_layout(&order));
            let dx = g.resample_backward(dyi, xb, a.clone());
            g.set_output(dx);
            let got = run_cpu(&g, &HashMap::from([(dyi, dy.clone()), (xb, x.clone())])).unwrap()[&dx].clone();
            assert_eq!(g.desc(dx).strides, g.desc(xb).strides, "dx follows x's layout");

            let numeric = numeric_gradient(&x, 1e-6, |xp| {
                let out = run_cpu(&fg, &HashMap::from([(xi, xp.clone())])).unwrap();
                dot(&out[&y], &dy)
            });
            let err = relative_error(&got.data, &numeric.data);
            assert!(err < 1e-8, "case {ci} {mode:?}: relative error {err}");
        }
    }
}

#[test]
fn max_backward_routes_to_first_maximum() {
    // Windows [1, 3], [3, 3], [3, 0]: the tie in the middle window goes to its first element.
    let x = Nd::new(vec![1, 1, 4], vec![1.0, 3.0, 3.0, 0.0]);
    let dy = Nd::new(vec![1, 1, 3], vec![1.0, 10.0, 100.0]);
    let mut g = Graph::new("pool_backward");
    let dyi = g.tensor(TensorDesc::new("dy", &[1, 1, 3], DataType::F64));
    let xi = g.tensor(TensorDesc::new("x", &[1, 1, 4], DataType::F64));
    let dx = g.resample_backward(dyi, xi, attrs(ResampleMode::Max, &[2], &[1], &[0], &[0]));
    g.set_output(dx);
    let got = run_cpu(&g, &HashMap::from([(dyi, dy), (xi, x)])).unwrap()[&dx].clone();
    assert_eq!(got.data, vec![0.0, 11.0, 100.0, 0.0]);
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

fn bad_forward(dims: &[i64], dt: DataType, a: ResampleAttrs) -> Graph {
    let mut g = Graph::new("bad");
    let x = g.tensor(TensorDesc::new("x", dims, dt));
    let y = g.resample(x, a);
    g.set_output(y);
    g
}

#[test]
fn bad_graphs() {
    let f32 = DataType::F32;
    expect_invalid(bad_forward(&[4, 4], f32, attrs(ResampleMode::Max, &[], &[], &[], &[])), "resample", "input `x` must have rank 3 to 5");
    expect_invalid(
        bad_forward(&[1, 2, 8, 8], f32, attrs(ResampleMode::Max, &[2], &[2, 2], &[0, 0], &[0, 0])),
        "resample",
        "window has 1 entries but input `x` (dims [1, 2, 8, 8]) has 2 spatial dims",
    );
    expect_invalid(bad_forward(&[1, 2, 8, 8], f32, ResampleAttrs::max_2d(0, 1, 0)), "resample", "window must be at least 1 along spatial dim 0, got 0");
    expect_invalid(bad_forward(&[1, 2, 8, 8], f32, ResampleAttrs::max_2d(2, 0, 0)), "resample", "stride must be at least 1 along spatial dim 0, got 0");
    expect_invalid(
        bad_forward(&[1, 2, 8, 8], f32, attrs(ResampleMode::Max, &[2, 2], &[1, 1], &[0, 2], &[0, 0])),
        "resample",
        "pre_padding 2 along spatial dim 1 must be smaller than the window 2",
    );
    expect_invalid(
        bad_forward(&[1, 2, 8, 8], f32, attrs(ResampleMode::Max, &[2, 2], &[1, 1], &[0, 0], &[-1, 0])),
        "resample",
        "post_padding must be non-negative along spatial dim 0, got -1",
    );
    expect_invalid(bad_forward(&[1, 2, 3, 8], f32, ResampleAttrs::max_2d(5, 1, 0)), "resample", "window 5 along spatial dim 0 is larger than the padded input (3 + 0 + 0 = 3)");
    expect_invalid(
        bad_forward(&[1, 2, 8, 8], DataType::I32, ResampleAttrs::avg_2d(2, 2, 0, true)),
        "resample",
        "input `x` (tensor \"x\") is i32, which avg_include_padding pooling does not take",
    );
    expect_invalid(bad_forward(&[1, 2, 8, 8], DataType::Bool, ResampleAttrs::max_2d(2, 2, 0)), "resample", "is bool");

    // Backward: dy not the forward output's shape.
    let mut g = Graph::new("bad");
    let dy = g.tensor(TensorDesc::new("dy", &[1, 2, 4, 3], f32));
    let x = g.tensor(TensorDesc::new("x", &[1, 2, 8, 8], f32));
    let dx = g.resample_backward(dy, x, ResampleAttrs::max_2d(2, 2, 0));
    g.set_output(dx);
    expect_invalid(g, "resample_backward", "input `dy` has dims [1, 2, 4, 3] but pooling `x` of dims [1, 2, 8, 8] gives [1, 2, 4, 4]");

    // Backward: integer dy.
    let mut g = Graph::new("bad");
    let dy = g.tensor(TensorDesc::new("dy", &[1, 2, 4, 4], DataType::I32));
    let x = g.tensor(TensorDesc::new("x", &[1, 2, 8, 8], f32));
    let dx = g.resample_backward(dy, x, ResampleAttrs::max_2d(2, 2, 0));
    g.set_output(dx);
    expect_invalid(g, "resample_backward", "input `dy` (tensor \"dy\") must be a floating-point type, got i32");
}
