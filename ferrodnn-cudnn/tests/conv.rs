//! The convolution calls on the CPU handle against plain loops: forward, backward data, backward
//! filter, backward bias and bias + activation, NCHW and NHWC, groups, dilation, strides,
//! padding, both modes, alpha and beta (beta reading the old output), and the algorithm calls.

mod common;
use common::*;
use ferrodnn_cudnn::conv::*;
use ferrodnn_cudnn::desc::*;
use ferrodnn_cudnn::types::*;
use std::ffi::c_void;

#[derive(Clone, Copy, Debug)]
struct Case {
    nhwc: bool,
    x: [i32; 4],
    k: i32,
    rs: [i32; 2],
    groups: i32,
    pad: [i32; 2],
    stride: [i32; 2],
    dil: [i32; 2],
    flip: bool,
    alpha: f32,
    beta: f32,
}

struct Refs {
    y: Vec<f64>,
    dx: Vec<f64>,
    dw: Vec<f64>,
    db: Vec<f64>,
}

/// The four results by direct summation over every valid tap, in each tensor's memory layout;
/// each blended as `alpha * r + beta * old`.
#[allow(clippy::too_many_arguments)]
fn reference(c: &Case, ydims: &[i32], x: &[f32], w: &[f32], dy: &[f32], olds: [&[f32]; 4]) -> Refs {
    let xd = c.x;
    let cg = xd[1] / c.groups;
    let wd = [c.k, cg, c.rs[0], c.rs[1]];
    let (xs, ws, ys) = (strides(&xd, c.nhwc), strides(&wd, c.nhwc), strides(ydims, c.nhwc));
    let mut y = vec![0f64; count(ydims)];
    let mut dx = vec![0f64; count(&xd)];
    let mut dw = vec![0f64; count(&wd)];
    let mut db = vec![0f64; c.k as usize];
    let kg = c.k / c.groups;
    for o in indices(ydims) {
        let (n, k, oh, ow) = (o[0], o[1], o[2] as i32, o[3] as i32);
        let g = k as i32 / kg;
        let yo = off(&o, &ys);
        db[k] += dy[yo] as f64;
        for cc in 0..cg {
            for r in 0..c.rs[0] {
                for s in 0..c.rs[1] {
                    let ih = oh * c.stride[0] - c.pad[0] + r * c.dil[0];
                    let iw = ow * c.stride[1] - c.pad[1] + s * c.dil[1];
                    if ih < 0 || iw < 0 || ih >= xd[2] || iw >= xd[3] {
                        continue;
                    }
                    // Convolution mode flips the filter.
                    let (fr, fs) = if c.flip { (c.rs[0] - 1 - r, c.rs[1] - 1 - s) } else { (r, s) };
                    let xi = off(&[n, (g * cg + cc) as usize, ih as usize, iw as usize], &xs);
                    let wi = off(&[k, cc as usize, fr as usize, fs as usize], &ws);
                    y[yo] += x[xi] as f64 * w[wi] as f64;
                    dx[xi] += dy[yo] as f64 * w[wi] as f64;
                    dw[wi] += dy[yo] as f64 * x[xi] as f64;
                }
            }
        }
    }
    let blend = |v: Vec<f64>, old: &[f32]| -> Vec<f64> { v.iter().zip(old).map(|(&r, &o)| c.alpha as f64 * r + c.beta as f64 * o as f64).collect() };
    Refs { y: blend(y, olds[0]), dx: blend(dx, olds[1]), dw: blend(dw, olds[2]), db: blend(db, olds[3]) }
}

fn run_case(h: &Handle, c: Case, seed: u64) {
    let xd = tdesc(CUDNN_DATA_FLOAT, &c.x, &strides(&c.x, c.nhwc));
    let wdims = [c.k, c.x[1] / c.groups, c.rs[0], c.rs[1]];
    let wd = fdesc(&wdims, c.nhwc);
    let mut cd = std::ptr::null_mut();
    ok(cudnnCreateConvolutionDescriptor(&mut cd));
    let mode = if c.flip { CUDNN_CONVOLUTION } else { CUDNN_CROSS_CORRELATION };
    ok(cudnnSetConvolution2dDescriptor(cd, c.pad[0], c.pad[1], c.stride[0], c.stride[1], c.dil[0], c.dil[1], mode, CUDNN_DATA_FLOAT));
    ok(cudnnSetConvolutionGroupCount(cd, c.groups));
    let mut o = [0i32; 4];
    ok(cudnnGetConvolution2dForwardOutputDim(cd, xd, wd, &mut o[0], &mut o[1], &mut o[2], &mut o[3]));
    let mut nd = [0i32; 4];
    ok(cudnnGetConvolutionNdForwardOutputDim(cd, xd, wd, 4, nd.as_mut_ptr()));
    assert_eq!(o, nd);
    let yd = tdesc(CUDNN_DATA_FLOAT, &o, &strides(&o, c.nhwc));
    let bd = f32_tensor(&[1, o[1], 1, 1], false);
    let x = rand(count(&c.x), seed);
    let w = rand(count(&wdims), seed + 1);
    let dy = rand(count(&o), seed + 2);
    let olds = [rand(count(&o), seed + 3), rand(count(&c.x), seed + 4), rand(count(&wdims), seed + 5), rand(o[1] as usize, seed + 6)];
    let want = reference(&c, &o, &x, &w, &dy, [&olds[0], &olds[1], &olds[2], &olds[3]]);
    let (mut y, mut dx, mut dw, mut db) = (olds[0].clone(), olds[1].clone(), olds[2].clone(), olds[3].clone());

    let mut ws_bytes = 0usize;
    ok(cudnnGetConvolutionForwardWorkspaceSize(h.0, xd, wd, cd, yd, 0, &mut ws_bytes));
    let mut ws = vec![0u8; ws_bytes];
    ok(cudnnConvolutionForward(h.0, sc(&c.alpha), xd, p(&x), wd, p(&w), cd, 0, ws.as_mut_ptr() as *mut c_void, ws_bytes, sc(&c.beta), yd, pm(&mut y)));
    close(&y, &want.y, 1e-5, &format!("{c:?} y"));
    // No workspace at all: the library finds its own.
    ok(cudnnConvolutionBackwardData(h.0, sc(&c.alpha), wd, p(&w), yd, p(&dy), cd, 1, std::ptr::null_mut(), 0, sc(&c.beta), xd, pm(&mut dx)));
    close(&dx, &want.dx, 1e-5, &format!("{c:?} dx"));
    ok(cudnnConvolutionBackwardFilter(h.0, sc(&c.alpha), xd, p(&x), yd, p(&dy), cd, 1, std::ptr::null_mut(), 0, sc(&c.beta), wd, pm(&mut dw)));
    close(&dw, &want.dw, 1e-5, &format!("{c:?} dw"));
    ok(cudnnConvolutionBackwardBias(h.0, sc(&c.alpha), yd, p(&dy), sc(&c.beta), bd, pm(&mut db)));
    close(&db, &want.db, 1e-5, &format!("{c:?} db"));
    for t in [xd, yd, bd] {
        ok(cudnnDestroyTensorDescriptor(t));
    }
    ok(cudnnDestroyFilterDescriptor(wd));
    ok(cudnnDestroyConvolutionDescriptor(cd));
}

fn case(nhwc: bool, x: [i32; 4], k: i32, rs: [i32; 2], groups: i32) -> Case {
    Case { nhwc, x, k, rs, groups, pad: [0, 0], stride: [1, 1], dil: [1, 1], flip: false, alpha: 1.0, beta: 0.0 }
}

#[test]
fn convolutions_match_direct_summation() {
    let h = Handle::cpu();
    let cases = [
        case(false, [2, 3, 7, 5], 4, [3, 3], 1),
        Case { pad: [1, 2], stride: [2, 1], ..case(true, [2, 4, 9, 8], 6, [3, 2], 2) },
        Case { dil: [2, 3], pad: [2, 1], ..case(false, [1, 6, 11, 10], 9, [3, 3], 3) },
        Case { flip: true, pad: [1, 1], ..case(true, [3, 5, 6, 7], 2, [3, 3], 1) },
        // Depthwise, strided and dilated.
        Case { stride: [2, 2], dil: [2, 1], pad: [2, 2], ..case(true, [2, 8, 9, 9], 8, [3, 3], 8) },
        // One-tap (1x1) in both layouts.
        case(true, [2, 8, 4, 5], 16, [1, 1], 1),
        case(false, [2, 8, 4, 5], 16, [1, 1], 1),
    ];
    for (i, c) in cases.iter().enumerate() {
        run_case(&h, *c, 100 + 10 * i as u64);
        // alpha scales, beta blends the old output in.
        run_case(&h, Case { alpha: 0.5, beta: 0.0, ..*c }, 200 + 10 * i as u64);
        run_case(&h, Case { alpha: 1.5, beta: -0.75, ..*c }, 300 + 10 * i as u64);
    }
}

#[test]
fn bias_activation_forward_matches_loops() {
    let h = Handle::cpu();
    let c = Case { pad: [1, 1], ..case(true, [2, 4, 6, 5], 6, [3, 3], 2) };
    let xd = tdesc(CUDNN_DATA_FLOAT, &c.x, &strides(&c.x, true));
    let wdims = [6, 2, 3, 3];
    let wd = fdesc(&wdims, true);
    let mut cd = std::ptr::null_mut();
    ok(cudnnCreateConvolutionDescriptor(&mut cd));
    ok(cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    ok(cudnnSetConvolutionGroupCount(cd, 2));
    let o = [2, 6, 6, 5];
    let yd = tdesc(CUDNN_DATA_FLOAT, &o, &strides(&o, true));
    let bd = f32_tensor(&[1, 6, 1, 1], false);
    let mut act = std::ptr::null_mut();
    ok(cudnnCreateActivationDescriptor(&mut act));
    ok(cudnnSetActivationDescriptor(act, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
    let x = rand(count(&c.x), 1);
    let w = rand(count(&wdims), 2);
    let bias = rand(6, 3);
    let z = rand(count(&o), 4);
    let conv =
        reference(&Case { alpha: 1.0, beta: 0.0, ..c }, &o, &x, &w, &vec![0.0; count(&o)], [&vec![0.0; count(&o)], &vec![0.0; count(&c.x)], &vec![0.0; count(&wdims)], &[0.0; 6]]);
    let ys = strides(&o, true);
    for (alpha1, alpha2) in [(1.0f32, 0.0f32), (0.75, 0.5)] {
        let mut want = vec![0f64; count(&o)];
        for idx in indices(&o) {
            let at = off(&idx, &ys);
            let v = alpha1 as f64 * conv.y[at] + alpha2 as f64 * z[at] as f64 + bias[idx[1]] as f64;
            want[at] = v.max(0.0);
        }
        // y is z's memory, as ResNet's residual blocks call it.
        let mut y = z.clone();
        ok(cudnnConvolutionBiasActivationForward(
            h.0,
            sc(&alpha1),
            xd,
            p(&x),
            wd,
            p(&w),
            cd,
            CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
            std::ptr::null_mut(),
            0,
            sc(&alpha2),
            yd,
            p(&y),
            bd,
            p(&bias),
            act,
            yd,
            pm(&mut y),
        ));
        close(&y, &want, 1e-5, "conv + z + bias + relu");
    }
}

#[test]
fn algorithm_calls_answer_from_the_plan() {
    let h = Handle::cpu();
    let xd = f32_tensor(&[2, 4, 8, 8], true);
    let wd = fdesc(&[8, 4, 3, 3], true);
    let yd = f32_tensor(&[2, 8, 8, 8], true);
    let mut cd = std::ptr::null_mut();
    ok(cudnnCreateConvolutionDescriptor(&mut cd));
    ok(cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    let mut n = 0;
    ok(cudnnGetConvolutionForwardAlgorithmMaxCount(h.0, &mut n));
    assert!(n >= 1);
    let mut perf = [AlgoPerf { algo: -1, status: -1, time: 0.0, memory: 0, determinism: -1, math_type: -1, reserved: [0; 3] }; 4];
    let mut got = 0;
    ok(cudnnGetConvolutionForwardAlgorithm_v7(h.0, xd, wd, cd, yd, 4, &mut got, perf.as_mut_ptr()));
    assert_eq!(got, 1);
    assert_eq!(perf[0].status, CUDNN_STATUS_SUCCESS);
    assert_eq!(perf[0].algo, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM);
    let mut ws = 0usize;
    ok(cudnnGetConvolutionForwardWorkspaceSize(h.0, xd, wd, cd, yd, perf[0].algo, &mut ws));
    assert_eq!(perf[0].memory, ws);
    assert_eq!(perf[0].time, -1.0, "heuristic answers are not timed");
    assert_eq!(perf[0].determinism, CUDNN_DETERMINISTIC, "the CPU engine is deterministic");
    // FindEx runs and times the plan on the caller's buffers (and writes y).
    let x = rand(2 * 4 * 64, 1);
    let w = rand(8 * 4 * 9, 2);
    let mut y = vec![f32::NAN; 2 * 8 * 64];
    let mut wsb = vec![0u8; ws];
    ok(cudnnFindConvolutionForwardAlgorithmEx(h.0, xd, p(&x), wd, p(&w), cd, yd, pm(&mut y), 1, &mut got, perf.as_mut_ptr(), wsb.as_mut_ptr() as *mut c_void, ws));
    assert!(perf[0].time >= 0.0 && got == 1);
    assert!(y.iter().all(|v| v.is_finite()), "FindEx wrote y");
    // The backward directions answer too.
    ok(cudnnGetConvolutionBackwardDataAlgorithm_v7(h.0, wd, yd, cd, xd, 1, &mut got, perf.as_mut_ptr()));
    assert_eq!(perf[0].algo, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1);
    ok(cudnnFindConvolutionBackwardFilterAlgorithm(h.0, xd, yd, cd, wd, 2, &mut got, perf.as_mut_ptr()));
    assert_eq!((perf[0].algo, got), (CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, 1));
    assert!(perf[0].time >= 0.0, "Find times the plan on buffers of its own");
    ok(cudnnGetConvolutionBackwardFilterWorkspaceSize(h.0, xd, yd, cd, wd, 0, &mut ws));
    assert_eq!(perf[0].memory, ws);
    // Bad requests.
    // Asking for no algorithm answers none, as NVIDIA's does; a negative count is refused.
    ok(cudnnGetConvolutionForwardAlgorithm_v7(h.0, xd, wd, cd, yd, 0, &mut got, perf.as_mut_ptr()));
    assert_eq!(got, 0);
    fails(cudnnGetConvolutionForwardAlgorithm_v7(h.0, xd, wd, cd, yd, -1, &mut got, perf.as_mut_ptr()), CUDNN_STATUS_BAD_PARAM, &["requestedAlgoCount"]);
    // An algorithm number out of range is unsupported (NVIDIA's status), not a bad parameter.
    fails(cudnnGetConvolutionForwardWorkspaceSize(h.0, xd, wd, cd, yd, 8, &mut ws), CUDNN_STATUS_NOT_SUPPORTED, &["algo 8"]);
    fails(cudnnGetConvolutionForwardAlgorithm_v7(h.0, xd, wd, cd, yd, 1, &mut got, std::ptr::null_mut()), CUDNN_STATUS_BAD_PARAM_NULL_POINTER, &["perfResults"]);
}

#[test]
fn descriptor_getters_give_back_what_was_set() {
    let mut cd = std::ptr::null_mut();
    ok(cudnnCreateConvolutionDescriptor(&mut cd));
    ok(cudnnSetConvolutionNdDescriptor(cd, 3, [1, 2, 3].as_ptr(), [1, 1, 2].as_ptr(), [2, 1, 1].as_ptr(), CUDNN_CONVOLUTION, CUDNN_DATA_FLOAT));
    ok(cudnnSetConvolutionMathType(cd, CUDNN_TENSOR_OP_MATH));
    ok(cudnnSetConvolutionReorderType(cd, CUDNN_NO_REORDER));
    let (mut len, mut pads, mut st, mut dil, mut mode, mut ct) = (0, [0; 3], [0; 3], [0; 3], 0, 0);
    ok(cudnnGetConvolutionNdDescriptor(cd, 3, &mut len, pads.as_mut_ptr(), st.as_mut_ptr(), dil.as_mut_ptr(), &mut mode, &mut ct));
    assert_eq!((len, pads, st, dil, mode, ct), (3, [1, 2, 3], [1, 1, 2], [2, 1, 1], CUDNN_CONVOLUTION, CUDNN_DATA_FLOAT));
    let (mut m, mut r) = (0, 0);
    ok(cudnnGetConvolutionMathType(cd, &mut m));
    ok(cudnnGetConvolutionReorderType(cd, &mut r));
    assert_eq!((m, r), (CUDNN_TENSOR_OP_MATH, CUDNN_NO_REORDER));
    let mut f = std::ptr::null_mut();
    ok(cudnnCreateFilterDescriptor(&mut f));
    ok(cudnnSetFilter4dDescriptor(f, CUDNN_DATA_HALF, CUDNN_TENSOR_NHWC, 8, 3, 5, 7));
    let (mut dt, mut fmt, mut k, mut c, mut hh, mut ww) = (0, 0, 0, 0, 0, 0);
    ok(cudnnGetFilter4dDescriptor(f, &mut dt, &mut fmt, &mut k, &mut c, &mut hh, &mut ww));
    assert_eq!((dt, fmt, k, c, hh, ww), (CUDNN_DATA_HALF, CUDNN_TENSOR_NHWC, 8, 3, 5, 7));
    let mut bytes = 0;
    ok(cudnnGetFilterSizeInBytes(f, &mut bytes));
    assert_eq!(bytes, 8 * 3 * 5 * 7 * 2);
    let t = f32_tensor(&[2, 3, 4, 5], true);
    let mut v = [0i32; 9];
    ok(cudnnGetTensor4dDescriptor(t, &mut v[0], &mut v[1], &mut v[2], &mut v[3], &mut v[4], &mut v[5], &mut v[6], &mut v[7], &mut v[8]));
    assert_eq!(v, [CUDNN_DATA_FLOAT, 2, 3, 4, 5, 60, 1, 15, 3]);
    ok(cudnnSetTensorNdDescriptorEx(t, CUDNN_TENSOR_NHWC, CUDNN_DATA_DOUBLE, 5, [2, 3, 4, 5, 6].as_ptr()));
    let (mut dt, mut nb, mut dims, mut strd) = (0, 0, [0i32; 5], [0i32; 5]);
    ok(cudnnGetTensorNdDescriptor(t, 5, &mut dt, &mut nb, dims.as_mut_ptr(), strd.as_mut_ptr()));
    assert_eq!((dt, nb, dims, strd), (CUDNN_DATA_DOUBLE, 5, [2, 3, 4, 5, 6], [360, 1, 90, 18, 3]));
    ok(cudnnGetTensorSizeInBytes(t, &mut bytes));
    assert_eq!(bytes, 720 * 8);
    ok(cudnnDestroyTensorDescriptor(t));
    ok(cudnnDestroyFilterDescriptor(f));
    ok(cudnnDestroyConvolutionDescriptor(cd));
}

/// 3D convolutions (5D tensors, cudnnSetConvolutionNdDescriptor) against ferrodnn's f64
/// reference engine through the Rust graph API, channels-last.
#[test]
fn three_d_convolutions_match_the_reference_engine() {
    use ferrodnn::graph::ops::conv::ConvAttrs;
    use ferrodnn::{DataType, Graph, Nd, TensorDesc};
    let h = Handle::cpu();
    let xdims = [2, 4, 5, 6, 7];
    let wdims = [6, 2, 3, 2, 3];
    let (pad, stride, dil) = ([1, 0, 2], [1, 2, 1], [2, 1, 1]);
    let xd = f32_tensor(&xdims, true);
    let wd = fdesc(&wdims, true);
    let mut cd = std::ptr::null_mut();
    ok(cudnnCreateConvolutionDescriptor(&mut cd));
    ok(cudnnSetConvolutionNdDescriptor(cd, 3, pad.as_ptr(), stride.as_ptr(), dil.as_ptr(), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    ok(cudnnSetConvolutionGroupCount(cd, 2));
    let mut o = [0i32; 5];
    ok(cudnnGetConvolutionNdForwardOutputDim(cd, xd, wd, 5, o.as_mut_ptr()));
    let yd = f32_tensor(&o, true);
    // Logical (row-major) values, and the same in channels-last memory for the C API.
    let xl = rand(count(&xdims), 61);
    let wl = rand(count(&wdims), 62);
    let to_mem = |l: &[f32], dims: &[i32]| -> Vec<f32> {
        let st = strides(dims, true);
        let mut m = vec![0f32; l.len()];
        for (k, i) in indices(dims).iter().enumerate() {
            m[off(i, &st)] = l[k];
        }
        m
    };
    let (xm, wm) = (to_mem(&xl, &xdims), to_mem(&wl, &wdims));
    let mut y = vec![f32::NAN; count(&o)];
    let (one, zero) = (1.0f32, 0.0f32);
    ok(cudnnConvolutionForward(h.0, sc(&one), xd, p(&xm), wd, p(&wm), cd, 0, std::ptr::null_mut(), 0, sc(&zero), yd, pm(&mut y)));
    let l64 = |v: &[i32]| v.iter().map(|&d| d as i64).collect::<Vec<i64>>();
    let mut g = Graph::new("conv3d").io_data_type(DataType::F32);
    let x = g.tensor(TensorDesc::new("x", &l64(&xdims), DataType::F32));
    let w = g.tensor(TensorDesc::new("w", &l64(&wdims), DataType::F32));
    let yt = g.conv_fprop(x, w, ConvAttrs::new(3).with_padding(&l64(&pad)).with_stride(&l64(&stride)).with_dilation(&l64(&dil)));
    g.set_output(yt);
    let dense = |v: &[f32], dims: &[i32]| Nd::new(dims.iter().map(|&d| d as usize).collect(), v.iter().map(|&f| f as f64).collect());
    let inputs = [(x, dense(&xl, &xdims)), (w, dense(&wl, &wdims))].into_iter().collect();
    let want = ferrodnn::testing::run_cpu(&g, &inputs).unwrap().remove(&yt).unwrap();
    let ys = strides(&o, true);
    let got: Vec<f32> = indices(&o).iter().map(|i| y[off(i, &ys)]).collect();
    close(&got, &want.data, 1e-5, "3D convolution");
}
