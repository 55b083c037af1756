//! conv_fprop, conv_dgrad and conv_wgrad on the CPU engine, checked against a direct
//! nested-loop convolution written here, hand-worked cases, and (for the backward ops)
//! central finite differences of the forward op.

use ferrodnn::graph::ops::conv::{ConvAttrs, ConvMode};
use ferrodnn::layout::for_each_index;
use ferrodnn::testing::{dot, numeric_gradient, random_inputs, random_values, relative_error, run_cpu, tolerance, SplitMix64};
use ferrodnn::{DataType, Error, Graph, Nd, TensorDesc, TensorId};
use std::collections::HashMap;

// ---------------------------------------------------------------------------------------------
// An independent reference: the textbook definition, one output element at a time.
// ---------------------------------------------------------------------------------------------

/// y[n][k][o...] = sum_{c < C/groups} sum_{f...} x[n][g*C/groups + c][o*s - pre + f*d] * w[k][c][f'],
/// f' = f (cross-correlation) or filter - 1 - f (convolution), g = k / (K / groups).
fn reference_fprop(x: &Nd, w: &Nd, a: &ConvAttrs) -> Nd {
    let sr = x.dims.len() - 2;
    let groups = x.dims[1] / w.dims[1];
    let cpg = w.dims[1];
    let kpg = w.dims[0] / groups;
    let mut out_dims = vec![x.dims[0], w.dims[0]];
    for d in 0..sr {
        let padded = x.dims[2 + d] as i64 + a.pre_padding[d] + a.post_padding[d];
        let extent = a.dilation[d] * (w.dims[2 + d] as i64 - 1) + 1;
        out_dims.push(((padded - extent) / a.stride[d] + 1) as usize);
    }
    let mut y = Nd::zeros(&out_dims);
    let filter_sp: Vec<usize> = w.dims[2..].to_vec();
    for_each_index(&out_dims.clone(), |flat, yi| {
        let (n, k) = (yi[0], yi[1]);
        let g = k / kpg;
        let mut acc = 0.0;
        for c in 0..cpg {
            for_each_index(&filter_sp, |_, f| {
                let mut xi = vec![n, g * cpg + c];
                let mut wi = vec![k, c];
                for d in 0..sr {
                    let pos = yi[2 + d] as i64 * a.stride[d] - a.pre_padding[d] + f[d] as i64 * a.dilation[d];
                    if pos < 0 || pos >= x.dims[2 + d] as i64 {
                        return;
                    }
                    xi.push(pos as usize);
                    wi.push(if a.mode == ConvMode::Convolution { filter_sp[d] - 1 - f[d] } else { f[d] });
                }
                acc += x.at(&xi) * w.at(&wi);
            });
        }
        y.data[flat] = acc;
    });
    y
}

struct Conv {
    g: Graph,
    x: TensorId,
    w: TensorId,
    y: TensorId,
}

fn conv_graph(x: TensorDesc, w: TensorDesc, a: &ConvAttrs) -> Conv {
    let mut g = Graph::new("conv");
    let x = g.tensor(x);
    let w = g.tensor(w);
    let y = g.conv_fprop(x, w, a.clone());
    g.set_output(y);
    Conv { g, x, w, y }
}

/// Run fprop on random inputs and compare with the reference; returns the validated graph.
fn check_fprop(x: TensorDesc, w: TensorDesc, a: &ConvAttrs, seed: u64) -> Graph {
    let c = conv_graph(x, w, a);
    let mut g = c.g.clone();
    g.validate().unwrap_or_else(|e| panic!("validate: {e}"));
    let inputs = random_inputs(&g, seed);
    let out = run_cpu(&g, &inputs).unwrap_or_else(|e| panic!("run: {e}"));
    let want = reference_fprop(&inputs[&c.x], &inputs[&c.w], a);
    let got = &out[&c.y];
    assert_eq!(got.dims, want.dims);
    let dt = g.resolved_data_type(c.y).unwrap();
    let rounded: Vec<f64> = want.data.iter().map(|&v| dt.quantize(v)).collect();
    let err = relative_error(&got.data, &rounded);
    assert!(err <= tolerance(dt).max(1e-13), "fprop {dt}: relative error {err} (x {:?}, w {:?}, {a:?})", g.desc(c.x).dims, g.desc(c.w).dims);
    assert!(got.data.iter().any(|&v| v != 0.0));
    g
}

fn f64_desc(name: &str, dims: &[i64]) -> TensorDesc {
    TensorDesc::new(name, dims, DataType::F64)
}

// ---------------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------------

#[test]
fn fprop_hand_worked_1d() {
    // x = [1 2 3 4 5], w = [1 0 -1], padding 1 on each side, stride 2: the padded input is
    // [0 1 2 3 4 5 0] and the windows start at 0, 2, 4.
    let a = ConvAttrs::new(1).with_padding(&[1]).with_stride(&[2]);
    for (mode, want) in [(ConvMode::CrossCorrelation, [-2.0, -2.0, 4.0]), (ConvMode::Convolution, [2.0, 2.0, -4.0])] {
        let c = conv_graph(f64_desc("x", &[1, 1, 5]), f64_desc("w", &[1, 1, 3]), &a.clone().with_mode(mode));
        let inputs = HashMap::from([(c.x, Nd::new(vec![1, 1, 5], vec![1.0, 2.0, 3.0, 4.0, 5.0])), (c.w, Nd::new(vec![1, 1, 3], vec![1.0, 0.0, -1.0]))]);
        let out = run_cpu(&c.g, &inputs).unwrap();
        assert_eq!(out[&c.y].dims, vec![1, 1, 3]);
        assert_eq!(out[&c.y].data, want.to_vec(), "{mode:?}");
    }
    // Dilation 2, no padding: taps at i, i+2, i+4 of [1 2 3 4 5 6] by w = [1 1 1]: 9, 12.
    let a = ConvAttrs::new(1).with_dilation(&[2]);
    let c = conv_graph(f64_desc("x", &[1, 1, 6]), f64_desc("w", &[1, 1, 3]), &a);
    let inputs = HashMap::from([(c.x, Nd::new(vec![1, 1, 6], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])), (c.w, Nd::new(vec![1, 1, 3], vec![1.0; 3]))]);
    assert_eq!(run_cpu(&c.g, &inputs).unwrap()[&c.y].data, vec![9.0, 12.0]);
}

#[test]
fn fprop_2d_matches_direct_loops() {
    let a = ConvAttrs::new(2).with_padding(&[1, 2]);
    check_fprop(TensorDesc::new("x", &[2, 3, 7, 5], DataType::F32), TensorDesc::new("w", &[5, 3, 3, 3], DataType::F32), &a, 1);
    // No padding, non-square filter, f64.
    check_fprop(f64_desc("x", &[1, 4, 6, 7]), f64_desc("w", &[3, 4, 2, 5]), &ConvAttrs::new(2), 2);
}

#[test]
fn fprop_grouped_and_depthwise() {
    // 3 groups of 2 image channels, 3 output channels each.
    let g = check_fprop(f64_desc("x", &[2, 6, 5, 7]), f64_desc("w", &[9, 2, 3, 3]), &ConvAttrs::new(2).with_padding(&[1, 1]), 3);
    assert_eq!(g.desc(g.output_tensors()[0]).dims, vec![2, 9, 5, 7]);
    // Depthwise: one filter channel per image channel.
    check_fprop(f64_desc("x", &[2, 5, 7, 6]), f64_desc("w", &[5, 1, 3, 3]), &ConvAttrs::new(2).with_stride(&[2, 1]), 4);
    // Depthwise with channel multiplier 2.
    check_fprop(TensorDesc::new("x", &[1, 3, 5, 5], DataType::F32), TensorDesc::new("w", &[6, 1, 3, 3], DataType::F32), &ConvAttrs::new(2).with_padding(&[1, 1]), 5);
}

#[test]
fn fprop_asymmetric_padding_stride_dilation() {
    let a = ConvAttrs::new(2).with_pre_padding(&[2, 0]).with_post_padding(&[0, 1]);
    let g = check_fprop(f64_desc("x", &[2, 3, 7, 5]), f64_desc("w", &[4, 3, 3, 2]), &a, 6);
    // h: (7 + 2 - 3) / 1 + 1 = 7; w: (5 + 1 - 2) / 1 + 1 = 5.
    assert_eq!(g.desc(g.output_tensors()[0]).dims, vec![2, 4, 7, 5]);
    let a = ConvAttrs::new(2).with_pre_padding(&[1, 3]).with_post_padding(&[2, 0]).with_stride(&[2, 3]).with_dilation(&[2, 1]);
    let g = check_fprop(f64_desc("x", &[2, 3, 13, 11]), f64_desc("w", &[5, 3, 3, 3]), &a, 7);
    // h: (13 + 3 - 5) / 2 + 1 = 6; w: (11 + 3 - 3) / 3 + 1 = 4.
    assert_eq!(g.desc(g.output_tensors()[0]).dims, vec![2, 5, 6, 4]);
}

#[test]
fn fprop_1d_and_3d() {
    let a = ConvAttrs::new(1).with_pre_padding(&[2]).with_post_padding(&[1]).with_stride(&[2]).with_dilation(&[3]);
    check_fprop(f64_desc("x", &[3, 4, 13]), f64_desc("w", &[6, 2, 3]), &a, 8);
    let a = ConvAttrs::new(3).with_pre_padding(&[1, 0, 1]).with_post_padding(&[0, 1, 1]).with_stride(&[1, 2, 1]).with_dilation(&[1, 1, 2]);
    check_fprop(TensorDesc::new("x", &[2, 2, 5, 4, 5], DataType::F32), TensorDesc::new("w", &[3, 2, 2, 3, 2], DataType::F32), &a, 9);
}

#[test]
fn fprop_convolution_mode_flips_filter() {
    let a = ConvAttrs::new(2).with_padding(&[1, 0]).with_stride(&[1, 2]).with_mode(ConvMode::Convolution);
    check_fprop(f64_desc("x", &[2, 4, 5, 7]), f64_desc("w", &[4, 2, 3, 2]), &a, 10);
    let a = ConvAttrs::new(3).with_padding(&[1, 1, 0]).with_mode(ConvMode::Convolution);
    check_fprop(f64_desc("x", &[1, 3, 3, 4, 5]), f64_desc("w", &[2, 3, 2, 3, 2]), &a, 11);
}

#[test]
fn fprop_channels_last_and_gapped_strides() {
    // NHWC image and KRSC filter: the output follows the image into channels-last.
    let a = ConvAttrs::new(2).with_padding(&[1, 1]).with_stride(&[2, 1]);
    let x = f64_desc("x", &[2, 3, 7, 5]).with_layout(&[0, 2, 3, 1]);
    let w = f64_desc("w", &[4, 3, 3, 3]).with_layout(&[0, 2, 3, 1]);
    let g = check_fprop(x, w, &a, 12);
    let y = g.desc(g.output_tensors()[0]);
    assert_eq!(y.dims, vec![2, 4, 4, 5]);
    assert_eq!(y.strides, vec![80, 1, 20, 4]);
    // Gapped strides on the image, a filter stored [c, k, r, s], an output given NDHWC-like
    // strides with gaps by the user.
    let x = f64_desc("x", &[2, 3, 5, 5]).with_strides(&[100, 30, 6, 1]);
    let w = f64_desc("w", &[4, 3, 3, 3]).with_layout(&[1, 0, 2, 3]);
    let mut c = conv_graph(x, w, &ConvAttrs::new(2).with_padding(&[1, 1]));
    c.g.desc_mut(c.y).strides = vec![200, 1, 40, 5];
    let mut g = c.g.clone();
    g.validate().unwrap();
    let inputs = random_inputs(&g, 13);
    let got = &run_cpu(&g, &inputs).unwrap()[&c.y];
    let want = reference_fprop(&inputs[&c.x], &inputs[&c.w], &ConvAttrs::new(2).with_padding(&[1, 1]));
    assert!(relative_error(&got.data, &want.data) < 1e-13);
    // 3D channels-last (NDHWC) image.
    let x = TensorDesc::new("x", &[1, 3, 3, 4, 5], DataType::F32).with_layout(&[0, 2, 3, 4, 1]);
    let g = check_fprop(x, TensorDesc::new("w", &[2, 3, 2, 2, 2], DataType::F32), &ConvAttrs::new(3), 14);
    assert_eq!(g.desc(g.output_tensors()[0]).strides, vec![48, 1, 24, 8, 2]);
}

#[test]
fn fprop_reduced_precision_types() {
    let a = ConvAttrs::new(2).with_padding(&[1, 1]);
    for dt in [DataType::F16, DataType::Bf16, DataType::Fp8E4m3, DataType::Fp8E5m2] {
        let g = check_fprop(TensorDesc::new("x", &[2, 5, 5, 7], dt), TensorDesc::new("w", &[3, 5, 3, 3], dt), &a, 15);
        let y = g.output_tensors()[0];
        // fp8 results are kept in f32; f16 and bf16 stay in their type.
        let want = if dt.is_fp8() { DataType::F32 } else { dt };
        assert_eq!(g.resolved_data_type(y), Some(want));
    }
    // An f16 output of an fp8 convolution, set by the user: rounded to f16.
    let mut c = conv_graph(TensorDesc::new("x", &[1, 3, 5, 5], DataType::Fp8E4m3), TensorDesc::new("w", &[2, 3, 3, 3], DataType::Fp8E4m3), &a);
    c.g.desc_mut(c.y).data_type = Some(DataType::F16);
    let inputs = random_inputs(&c.g, 16);
    let got = &run_cpu(&c.g, &inputs).unwrap()[&c.y];
    let want = reference_fprop(&inputs[&c.x], &inputs[&c.w], &a);
    assert!(relative_error(&got.data, &want.data) < tolerance(DataType::F16));
}

// ---------------------------------------------------------------------------------------------
// Backward, against finite differences of the forward op
// ---------------------------------------------------------------------------------------------

/// d/dx and d/dw of dot(fprop(x, w), dy) by central differences of the CPU fprop, in f64.
fn numeric_grads(x_dims: &[i64], w_dims: &[i64], a: &ConvAttrs, seed: u64) -> (Nd, Nd, Nd, Nd, Nd) {
    let c = conv_graph(f64_desc("x", x_dims), f64_desc("w", w_dims), a);
    let mut g = c.g.clone();
    g.validate().unwrap();
    let inputs = random_inputs(&g, seed);
    let (x, w) = (inputs[&c.x].clone(), inputs[&c.w].clone());
    let y_dims = g.desc(c.y).dims.iter().map(|&d| d as usize).collect::<Vec<_>>();
    let mut rng = SplitMix64::new(seed + 1000);
    let n = y_dims.iter().product();
    let dy = Nd::new(y_dims, random_values(n, DataType::F64, &mut rng));
    let loss = |xv: &Nd, wv: &Nd| {
        let ins = HashMap::from([(c.x, xv.clone()), (c.w, wv.clone())]);
        dot(&run_cpu(&g, &ins).unwrap()[&c.y], &dy)
    };
    let dx = numeric_gradient(&x, 1e-3, |xp| loss(xp, &w));
    let dw = numeric_gradient(&w, 1e-3, |wp| loss(&x, wp));
    (x, w, dy, dx, dw)
}

fn run_dgrad(dy: &Nd, w: &Nd, dx_dims: &[i64], a: &ConvAttrs, dy_layout: Option<&[usize]>) -> (Nd, Graph) {
    let mut g = Graph::new("dgrad");
    let mut dyd = f64_desc("dy", &dy.dims.iter().map(|&d| d as i64).collect::<Vec<_>>());
    if let Some(order) = dy_layout {
        dyd = dyd.with_layout(order);
    }
    let dyt = g.tensor(dyd);
    let wt = g.tensor(f64_desc("w", &w.dims.iter().map(|&d| d as i64).collect::<Vec<_>>()));
    let dx = g.conv_dgrad(dyt, wt, dx_dims, a.clone());
    g.set_output(dx);
    let out = run_cpu(&g, &HashMap::from([(dyt, dy.clone()), (wt, w.clone())])).unwrap_or_else(|e| panic!("dgrad: {e}"));
    g.validate().unwrap();
    (out[&dx].clone(), g)
}

fn run_wgrad(dy: &Nd, x: &Nd, dw_dims: &[i64], a: &ConvAttrs, x_layout: Option<&[usize]>) -> (Nd, Graph) {
    let mut g = Graph::new("wgrad");
    let dyt = g.tensor(f64_desc("dy", &dy.dims.iter().map(|&d| d as i64).collect::<Vec<_>>()));
    let mut xd = f64_desc("x", &x.dims.iter().map(|&d| d as i64).collect::<Vec<_>>());
    if let Some(order) = x_layout {
        xd = xd.with_layout(order);
    }
    let xt = g.tensor(xd);
    let dw = g.conv_wgrad(dyt, xt, dw_dims, a.clone());
    g.set_output(dw);
    let out = run_cpu(&g, &HashMap::from([(dyt, dy.clone()), (xt, x.clone())])).unwrap_or_else(|e| panic!("wgrad: {e}"));
    g.validate().unwrap();
    (out[&dw].clone(), g)
}

fn check_backward(x_dims: &[i64], w_dims: &[i64], a: &ConvAttrs, seed: u64) {
    let (x, w, dy, num_dx, num_dw) = numeric_grads(x_dims, w_dims, a, seed);
    let (dx, _) = run_dgrad(&dy, &w, x_dims, a, None);
    let err = relative_error(&dx.data, &num_dx.data);
    assert!(err < 1e-8, "dgrad vs finite differences: {err} (x {x_dims:?}, w {w_dims:?}, {a:?})");
    let (dw, _) = run_wgrad(&dy, &x, w_dims, a, None);
    let err = relative_error(&dw.data, &num_dw.data);
    assert!(err < 1e-8, "wgrad vs finite differences: {err} (x {x_dims:?}, w {w_dims:?}, {a:?})");
    assert!(dx.data.iter().any(|&v| v != 0.0) && dw.data.iter().any(|&v| v != 0.0));
}

#[test]
fn backward_2d_matches_finite_differences() {
    // Plain, padded.
    check_backward(&[2, 3, 5, 4], &[2, 3, 3, 3], &ConvAttrs::new(2).with_padding(&[1, 1]), 20);
    // Grouped, asymmetric padding, stride and dilation (some inputs reach no output).
    let a = ConvAttrs::new(2).with_pre_padding(&[2, 0]).with_post_padding(&[0, 1]).with_stride(&[2, 3]).with_dilation(&[1, 2]);
    check_backward(&[1, 4, 7, 7], &[4, 2, 3, 2], &a, 21);
    // Depthwise, convolution mode.
    let a = ConvAttrs::new(2).with_padding(&[1, 0]).with_mode(ConvMode::Convolution);
    check_backward(&[2, 3, 4, 5], &[3, 1, 3, 2], &a, 22);
}

#[test]
fn backward_1d_and_3d_match_finite_differences() {
    let a = ConvAttrs::new(1).with_pre_padding(&[1]).with_post_padding(&[2]).with_stride(&[2]).with_dilation(&[2]).with_mode(ConvMode::Convolution);
    check_backward(&[2, 2, 9], &[3, 2, 3], &a, 23);
    let a = ConvAttrs::new(3).with_pre_padding(&[1, 0, 0]).with_post_padding(&[0, 0, 1]).with_stride(&[1, 2, 1]);
    check_backward(&[1, 2, 3, 5, 3], &[2, 1, 2, 2, 2], &a, 24);
}

#[test]
fn backward_layouts_follow_inputs() {
    let a = ConvAttrs::new(2).with_padding(&[1, 1]).with_stride(&[2, 2]);
    let (x, w, dy, num_dx, num_dw) = numeric_grads(&[1, 2, 5, 5], &[3, 2, 3, 3], &a, 25);
    // dgrad with a channels-last dy writes a channels-last dx.
    let (dx, g) = run_dgrad(&dy, &w, &[1, 2, 5, 5], &a, Some(&[0, 2, 3, 1]));
    assert!(relative_error(&dx.data, &num_dx.data) < 1e-8);
    let dxd = g.desc(g.output_tensors()[0]);
    assert_eq!(dxd.strides, vec![50, 1, 10, 2]);
    // wgrad with a channels-last x writes a KRSC (channels-last) dw.
    let (dw, g) = run_wgrad(&dy, &x, &[3, 2, 3, 3], &a, Some(&[0, 2, 3, 1]));
    assert!(relative_error(&dw.data, &num_dw.data) < 1e-8);
    assert_eq!(g.desc(g.output_tensors()[0]).strides, vec![18, 1, 6, 2]);
}

#[test]
fn backward_reduced_precision_matches_f64() {
    // bf16 dgrad and f16 wgrad against the f64 results on the same (rounded) values.
    let a = ConvAttrs::new(2).with_padding(&[1, 1]);
    let (x, w, dy, _, _) = numeric_grads(&[2, 3, 5, 5], &[4, 3, 3, 3], &a, 26);
    let round = |nd: &Nd, dt: DataType| Nd::new(nd.dims.clone(), nd.data.iter().map(|&v| dt.quantize(v)).collect());
    for dt in [DataType::Bf16, DataType::F16] {
        let (dyq, wq, xq) = (round(&dy, dt), round(&w, dt), round(&x, dt));
        let (want_dx, _) = run_dgrad(&dyq, &wq, &[2, 3, 5, 5], &a, None);
        let (want_dw, _) = run_wgrad(&dyq, &xq, &[4, 3, 3, 3], &a, None);
        let mut g = Graph::new("bwd");
        let dyt = g.tensor(TensorDesc::new("dy", &[2, 4, 5, 5], dt));
        let wt = g.tensor(TensorDesc::new("w", &[4, 3, 3, 3], dt));
        let xt = g.tensor(TensorDesc::new("x", &[2, 3, 5, 5], dt));
        let dx = g.conv_dgrad(dyt, wt, &[2, 3, 5, 5], a.clone());
        let dw = g.conv_wgrad(dyt, xt, &[4, 3, 3, 3], a.clone());
        g.set_output(dx);
        g.set_output(dw);
        let out = run_cpu(&g, &HashMap::from([(dyt, dyq), (wt, wq), (xt, xq)])).unwrap();
        assert!(relative_error(&out[&dx].data, &want_dx.data) < tolerance(dt), "{dt} dgrad");
        assert!(relative_error(&out[&dw].data, &want_dw.data) < tolerance(dt), "{dt} wgrad");
    }
}

// ---------------------------------------------------------------------------------------------
// Bad graphs
// ---------------------------------------------------------------------------------------------

fn expect_invalid(mut g: Graph, want: &str) {
    match g.validate() {
        Err(Error::InvalidGraph(msg)) => assert!(msg.contains(want), "error {msg:?} does not contain {want:?}"),
        other => panic!("expected InvalidGraph containing {want:?}, got {other:?}"),
    }
}

fn fprop_bad(x: TensorDesc, w: TensorDesc, a: ConvAttrs, want: &str) {
    expect_invalid(conv_graph(x, w, &a).g, want);
}

#[test]
fn bad_fprop_graphs_are_rejected() {
    let f = |dims: &[i64]| TensorDesc::new("t", dims, DataType::F32);
    // Channels that do not split into groups.
    fprop_bad(f(&[1, 6, 5, 5]), f(&[4, 4, 3, 3]), ConvAttrs::new(2), "image `x` (tensor \"t\") has 6 channels, which is not a multiple of the 4 input channels");
    // k not divisible by groups (6 / 2 = 3 groups, 4 filters).
    fprop_bad(f(&[1, 6, 5, 5]), f(&[4, 2, 3, 3]), ConvAttrs::new(2), "has 4 output channels (dim 0), which is not divisible by groups = 3");
    // Attribute lists of the wrong length.
    fprop_bad(f(&[1, 3, 5, 5]), f(&[4, 3, 3, 3]), ConvAttrs::new(2).with_stride(&[1]), "stride has 1 entries [1] but the tensors have 2 spatial dims");
    // Bad attribute values.
    fprop_bad(f(&[1, 3, 5, 5]), f(&[4, 3, 3, 3]), ConvAttrs::new(2).with_stride(&[1, 0]), "stride[1] must be >= 1, got 0");
    fprop_bad(f(&[1, 3, 5, 5]), f(&[4, 3, 3, 3]), ConvAttrs::new(2).with_pre_padding(&[-1, 0]), "pre_padding[0] must be >= 0, got -1");
    fprop_bad(f(&[1, 3, 5, 5]), f(&[4, 3, 3, 3]), ConvAttrs::new(2).with_dilation(&[1, 0]), "dilation[1] must be >= 1, got 0");
    // Empty output.
    fprop_bad(
        f(&[1, 3, 5, 4]),
        f(&[4, 3, 3, 3]),
        ConvAttrs::new(2).with_dilation(&[1, 2]),
        "spatial dim 1: the output would be empty: image `x` (tensor \"t\") size 4 + padding 0 + 0 = 4 is less than the dilated filter extent 5",
    );
    // Ranks.
    fprop_bad(f(&[3, 5]), f(&[4, 3]), ConvAttrs::new(0), "must have rank 3, 4 or 5");
    fprop_bad(f(&[1, 3, 5, 5, 5, 5]), f(&[4, 3, 3, 3, 3, 3]), ConvAttrs::new(4), "must have rank 3, 4 or 5");
    fprop_bad(f(&[1, 3, 5, 5]), f(&[4, 3, 3]), ConvAttrs::new(2), "filter `w` (tensor \"t\") has rank 3");
    // Types.
    let b = TensorDesc::new("xb", &[1, 3, 5, 5], DataType::Bool);
    fprop_bad(b, f(&[4, 3, 3, 3]), ConvAttrs::new(2), "`x` (tensor \"xb\") has type bool; this convolution takes float types only");
    // 8-bit integers: both inputs or neither; no wider integers.
    let i = TensorDesc::new("wi", &[4, 3, 3, 3], DataType::I8);
    fprop_bad(f(&[1, 3, 5, 5]), i, ConvAttrs::new(2), "`x` (tensor \"t\") is f32 but `w` (tensor \"wi\") is i8: an integer convolution takes 8-bit integers (i8 or u8) for both");
    let wide = TensorDesc::new("x32", &[1, 3, 5, 5], DataType::I32);
    fprop_bad(wide, TensorDesc::new("w32", &[4, 3, 3, 3], DataType::I32), ConvAttrs::new(2), "`x` (tensor \"x32\") has type i32; this convolution takes float types only");
    // An integer output type of a float convolution.
    let mut c = conv_graph(f(&[1, 3, 5, 5]), f(&[4, 3, 3, 3]), &ConvAttrs::new(2));
    c.g.desc_mut(c.y).data_type = Some(DataType::I32);
    expect_invalid(c.g, "output `y` (tensor \"conv_fprop_0::y\") has type i32; this convolution writes float types only");
    // An output whose dims the user set wrongly.
    let mut c = conv_graph(f(&[1, 3, 5, 5]), f(&[4, 3, 3, 3]), &ConvAttrs::new(2));
    c.g.desc_mut(c.y).dims = vec![1, 4, 5, 5];
    expect_invalid(c.g, "was given dims [1, 4, 5, 5] but the op produces [1, 4, 3, 3]");
}

#[test]
fn bad_backward_graphs_are_rejected() {
    let f = |name: &str, dims: &[i64]| TensorDesc::new(name, dims, DataType::F32);
    let a = ConvAttrs::new(2).with_padding(&[1, 1]).with_stride(&[2, 2]);
    // dgrad: dx dims inconsistent with dy (dx 7x7 would give 4x4, dy is 3x3).
    let mut g = Graph::new("g");
    let dy = g.tensor(f("dy", &[1, 4, 3, 3]));
    let w = g.tensor(f("w", &[4, 2, 3, 3]));
    g.conv_dgrad(dy, w, &[1, 2, 7, 7], a.clone());
    expect_invalid(g, "`dy` (tensor \"dy\") has dims [1, 4, 3, 3] but a forward convolution of `dx` [1, 2, 7, 7] by `w` [4, 2, 3, 3] with these attributes gives [1, 4, 4, 4]");
    // dgrad: the filter's k must match dy's channels.
    let mut g = Graph::new("g");
    let dy = g.tensor(f("dy", &[1, 5, 3, 3]));
    let w = g.tensor(f("w", &[4, 2, 3, 3]));
    g.conv_dgrad(dy, w, &[1, 2, 5, 5], a.clone());
    expect_invalid(g, "has dims [1, 5, 3, 3] but a forward convolution");
    // dgrad: a dx rank that does not match the filter.
    let mut g = Graph::new("g");
    let dy = g.tensor(f("dy", &[1, 4, 3, 3]));
    let w = g.tensor(f("w", &[4, 2, 3, 3]));
    g.conv_dgrad(dy, w, &[1, 2, 5], a.clone());
    expect_invalid(g, "filter `w` (tensor \"w\") has rank 4 (dims [4, 2, 3, 3]) but image `dx` has rank 3");
    // dgrad: dx channels not a multiple of the filter's.
    let mut g = Graph::new("g");
    let dy = g.tensor(f("dy", &[1, 4, 3, 3]));
    let w = g.tensor(f("w", &[4, 2, 3, 3]));
    g.conv_dgrad(dy, w, &[1, 3, 5, 5], a.clone());
    expect_invalid(g, "image `dx` has 3 channels, which is not a multiple of the 2 input channels");
    // wgrad: dw dims inconsistent with dy.
    let mut g = Graph::new("g");
    let dy = g.tensor(f("dy", &[1, 4, 3, 3]));
    let x = g.tensor(f("x", &[1, 2, 5, 5]));
    g.conv_wgrad(dy, x, &[4, 2, 5, 5], a.clone());
    expect_invalid(g, "`dy` (tensor \"dy\") has dims [1, 4, 3, 3] but a forward convolution of `x` [1, 2, 5, 5] by `dw` [4, 2, 5, 5] with these attributes gives [1, 4, 2, 2]");
    // wgrad: a bool dy.
    let mut g = Graph::new("g");
    let dy = g.tensor(TensorDesc::new("dyb", &[1, 4, 3, 3], DataType::Bool));
    let x = g.tensor(f("x", &[1, 2, 5, 5]));
    g.conv_wgrad(dy, x, &[4, 2, 3, 3], a.clone());
    expect_invalid(g, "`dy` (tensor \"dyb\") has type bool");
    // wgrad: no dw dims given (a graph built by hand, e.g. from JSON).
    let mut g = Graph::new("g");
    let dy = g.tensor(f("dy", &[1, 4, 3, 3]));
    let x = g.tensor(f("x", &[1, 2, 5, 5]));
    g.conv_wgrad(dy, x, &[], a.clone());
    expect_invalid(g, "output `dw` (tensor \"conv_wgrad_0::dw\") has no dims");
}

#[test]
fn attrs_round_trip_through_json() {
    let a = ConvAttrs::new(3).with_pre_padding(&[1, 2, 3]).with_post_padding(&[0, 1, 0]).with_stride(&[2, 1, 1]).with_dilation(&[1, 1, 3]).with_mode(ConvMode::Convolution);
    let c = conv_graph(f64_desc("x", &[1, 2, 6, 6, 9]), f64_desc("w", &[2, 2, 2, 2, 2]), &a);
    let back = Graph::from_json(&c.g.to_json().unwrap()).unwrap();
    assert_eq!(back.nodes[0].op, ferrodnn::graph::ops::Op::ConvFprop(a));
    assert_eq!(back.desc(c.y).dims, vec![1, 2, 3, 8, 9]);
}
