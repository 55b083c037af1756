//! Activation, softmax, pooling and the tensor arithmetic calls on the CPU handle against plain
//! loops, with alpha/beta blending, in-place calls and NHWC tensors.

mod common;
use common::*;
use ferrodnn_cudnn::desc::*;
use ferrodnn_cudnn::ops::*;
use ferrodnn_cudnn::types::*;

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn act_desc(mode: i32, coef: f64, swish_beta: f64) -> cudnnActivationDescriptor_t {
    let mut a = std::ptr::null_mut();
    ok(cudnnCreateActivationDescriptor(&mut a));
    ok(cudnnSetActivationDescriptor(a, mode, CUDNN_PROPAGATE_NAN, coef));
    ok(cudnnSetActivationDescriptorSwishBeta(a, swish_beta));
    a
}

#[test]
fn activations_forward_and_backward_match_formulas() {
    let h = Handle::cpu();
    let dims = [2, 3, 5, 7];
    let t = f32_tensor(&dims, true);
    let n = count(&dims);
    let x: Vec<f32> = rand(n, 1).iter().map(|v| v * 3.0).collect();
    let dy = rand(n, 2);
    let (coef, beta_s) = (0.7, 1.5);
    type F = fn(f64, f64, f64) -> f64;
    let modes: [(i32, F, F); 7] = [
        (CUDNN_ACTIVATION_SIGMOID, |x, _, _| sigmoid(x), |x, dy, _| dy * sigmoid(x) * (1.0 - sigmoid(x))),
        (CUDNN_ACTIVATION_RELU, |x, _, _| x.max(0.0), |x, dy, _| if x > 0.0 { dy } else { 0.0 }),
        (CUDNN_ACTIVATION_TANH, |x, _, _| x.tanh(), |x, dy, _| dy * (1.0 - x.tanh().powi(2))),
        (CUDNN_ACTIVATION_CLIPPED_RELU, |x, c, _| x.max(0.0).min(c), |x, dy, c| if x > 0.0 && x < c { dy } else { 0.0 }),
        (CUDNN_ACTIVATION_ELU, |x, c, _| if x > 0.0 { x } else { c * (x.exp() - 1.0) }, |x, dy, c| if x > 0.0 { dy } else { dy * c * x.exp() }),
        (CUDNN_ACTIVATION_IDENTITY, |x, _, _| x, |_, dy, _| dy),
        (
            CUDNN_ACTIVATION_SWISH,
            |x, _, b| x * sigmoid(b * x),
            |x, dy, b| {
                let s = sigmoid(b * x);
                dy * (s + b * x * s * (1.0 - s))
            },
        ),
    ];
    for (mode, fwd, bwd) in modes {
        let a = act_desc(mode, coef, beta_s);
        let c = if mode == CUDNN_ACTIVATION_SWISH { beta_s } else { coef };
        let fw: Vec<f64> = x.iter().map(|&v| fwd(v as f64, c, c)).collect();
        let (one, zero) = (1.0f32, 0.0f32);
        let mut y = vec![f32::NAN; n];
        ok(cudnnActivationForward(h.0, a, sc(&one), t, p(&x), sc(&zero), t, pm(&mut y)));
        close(&y, &fw, 1e-6, &format!("activation {mode} forward"));
        // In place, with alpha and beta: y = 0.5 act(y) + 0.25 y.
        let (alpha, beta) = (0.5f32, 0.25f32);
        let mut inplace = x.clone();
        let ptr = pm(&mut inplace);
        ok(cudnnActivationForward(h.0, a, sc(&alpha), t, ptr, sc(&beta), t, ptr));
        let want: Vec<f64> = fw.iter().zip(&x).map(|(&f, &v)| 0.5 * f + 0.25 * v as f64).collect();
        close(&inplace, &want, 1e-6, &format!("activation {mode} in place"));
        let mut dx = vec![f32::NAN; n];
        ok(cudnnActivationBackward(h.0, a, sc(&one), t, p(&y), t, p(&dy), t, p(&x), sc(&zero), t, pm(&mut dx)));
        let bw: Vec<f64> = x.iter().zip(&dy).map(|(&v, &d)| bwd(v as f64, d as f64, c)).collect();
        close(&dx, &bw, 1e-5, &format!("activation {mode} backward"));
        ok(cudnnDestroyActivationDescriptor(a));
    }
}

/// Softmax references: over (c, h, w) per n (instance) or over c per (n, h, w) (channel).
fn softmax_ref(x: &[f32], dims: &[i32], st: &[i32], instance: bool, log: bool) -> Vec<f64> {
    let mut y = vec![0f64; x.len()];
    let groups: Vec<Vec<Vec<usize>>> = if instance {
        (0..dims[0] as usize).map(|n| indices(&dims[1..]).into_iter().map(|i| [vec![n], i].concat()).collect()).collect()
    } else {
        indices(&[dims[0], dims[2], dims[3]]).into_iter().map(|o| (0..dims[1] as usize).map(|c| vec![o[0], c, o[1], o[2]]).collect()).collect()
    };
    for g in groups {
        let offs: Vec<usize> = g.iter().map(|i| off(i, st)).collect();
        let m = offs.iter().map(|&o| x[o] as f64).fold(f64::MIN, f64::max);
        let s: f64 = offs.iter().map(|&o| (x[o] as f64 - m).exp()).sum();
        for &o in &offs {
            y[o] = if log { x[o] as f64 - m - s.ln() } else { (x[o] as f64 - m).exp() / s };
        }
    }
    y
}

#[test]
fn softmax_every_algorithm_and_mode() {
    let h = Handle::cpu();
    let dims = [3, 5, 2, 3];
    for nhwc in [false, true] {
        let st = strides(&dims, nhwc);
        let t = tdesc(CUDNN_DATA_FLOAT, &dims, &st);
        let n = count(&dims);
        let x: Vec<f32> = rand(n, 5).iter().map(|v| v * 4.0).collect();
        let dy = rand(n, 6);
        for algo in [CUDNN_SOFTMAX_FAST, CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_LOG] {
            for mode in [CUDNN_SOFTMAX_MODE_INSTANCE, CUDNN_SOFTMAX_MODE_CHANNEL] {
                let log = algo == CUDNN_SOFTMAX_LOG;
                let want = softmax_ref(&x, &dims, &st, mode == CUDNN_SOFTMAX_MODE_INSTANCE, log);
                let (one, zero) = (1.0f32, 0.0f32);
                let mut y = vec![f32::NAN; n];
                ok(cudnnSoftmaxForward(h.0, algo, mode, sc(&one), t, p(&x), sc(&zero), t, pm(&mut y)));
                close(&y, &want, 1e-6, &format!("softmax algo {algo} mode {mode} nhwc {nhwc}"));
                // Backward, with the group sums of dy * y (softmax) or dy (log-softmax).
                let instance = mode == CUDNN_SOFTMAX_MODE_INSTANCE;
                let key = |i: &[usize]| if instance { vec![i[0]] } else { vec![i[0], i[2], i[3]] };
                let mut sums = std::collections::HashMap::new();
                for i in indices(&dims) {
                    let o = off(&i, &st);
                    *sums.entry(key(&i)).or_insert(0f64) += if log { dy[o] as f64 } else { dy[o] as f64 * y[o] as f64 };
                }
                let mut want_dx = vec![0f64; n];
                for i in indices(&dims) {
                    let o = off(&i, &st);
                    let s = sums[&key(&i)];
                    want_dx[o] = if log { dy[o] as f64 - (y[o] as f64).exp() * s } else { y[o] as f64 * (dy[o] as f64 - s) };
                }
                let mut dx = rand(n, 7);
                let old = dx.clone();
                let beta = 0.5f32;
                ok(cudnnSoftmaxBackward(h.0, algo, mode, sc(&one), t, p(&y), t, p(&dy), sc(&beta), t, pm(&mut dx)));
                let want_dx: Vec<f64> = want_dx.iter().zip(&old).map(|(&w, &o)| w + 0.5 * o as f64).collect();
                close(&dx, &want_dx, 1e-5, &format!("softmax backward algo {algo} mode {mode}"));
            }
        }
    }
}

#[test]
fn pooling_forward_and_backward_match_loops() {
    let h = Handle::cpu();
    let dims = [2, 3, 7, 6];
    for nhwc in [false, true] {
        for (mode, win, pad, stride) in [
            (CUDNN_POOLING_MAX, [3, 2], [1, 0], [2, 2]),
            (CUDNN_POOLING_MAX_DETERMINISTIC, [2, 2], [0, 0], [2, 2]),
            (CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING, [3, 3], [1, 1], [2, 1]),
            (CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING, [3, 3], [1, 1], [1, 2]),
        ] {
            let mut pd = std::ptr::null_mut();
            ok(cudnnCreatePoolingDescriptor(&mut pd));
            ok(cudnnSetPooling2dDescriptor(pd, mode, CUDNN_NOT_PROPAGATE_NAN, win[0], win[1], pad[0], pad[1], stride[0], stride[1]));
            let xd = f32_tensor(&dims, nhwc);
            let mut o = [0i32; 4];
            ok(cudnnGetPooling2dForwardOutputDim(pd, xd, &mut o[0], &mut o[1], &mut o[2], &mut o[3]));
            let want_o: Vec<i32> = (0..2).map(|d| (dims[2 + d] + 2 * pad[d] - win[d]) / stride[d] + 1).collect();
            assert_eq!(&o[2..], &want_o[..]);
            let yd = f32_tensor(&o, nhwc);
            let (xs, ys) = (strides(&dims, nhwc), strides(&o, nhwc));
            let x = rand(count(&dims), 11);
            let dy = rand(count(&o), 12);
            let mut want_y = vec![0f64; count(&o)];
            let mut want_dx = vec![0f64; count(&dims)];
            for i in indices(&o) {
                let mut taps = Vec::new();
                for r in 0..win[0] {
                    for s in 0..win[1] {
                        let (ih, iw) = (i[2] as i32 * stride[0] - pad[0] + r, i[3] as i32 * stride[1] - pad[1] + s);
                        if ih >= 0 && iw >= 0 && ih < dims[2] && iw < dims[3] {
                            taps.push(off(&[i[0], i[1], ih as usize, iw as usize], &xs));
                        }
                    }
                }
                let yo = off(&i, &ys);
                if mode == CUDNN_POOLING_MAX || mode == CUDNN_POOLING_MAX_DETERMINISTIC {
                    let best = *taps.iter().max_by(|&&a, &&b| x[a].partial_cmp(&x[b]).unwrap()).unwrap();
                    want_y[yo] = x[best] as f64;
                    want_dx[best] += dy[yo] as f64;
                } else {
                    let div = if mode == CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING { (win[0] * win[1]) as f64 } else { taps.len() as f64 };
                    want_y[yo] = taps.iter().map(|&t| x[t] as f64).sum::<f64>() / div;
                    for &t in &taps {
                        want_dx[t] += dy[yo] as f64 / div;
                    }
                }
            }
            let (one, zero) = (1.0f32, 0.0f32);
            let mut y = vec![f32::NAN; count(&o)];
            ok(cudnnPoolingForward(h.0, pd, sc(&one), xd, p(&x), sc(&zero), yd, pm(&mut y)));
            close(&y, &want_y, 1e-6, &format!("pooling {mode} nhwc {nhwc}"));
            let mut dx = vec![f32::NAN; count(&dims)];
            ok(cudnnPoolingBackward(h.0, pd, sc(&one), yd, p(&y), yd, p(&dy), xd, p(&x), sc(&zero), xd, pm(&mut dx)));
            close(&dx, &want_dx, 1e-6, &format!("pooling backward {mode} nhwc {nhwc}"));
            ok(cudnnDestroyPoolingDescriptor(pd));
        }
    }
}

#[test]
fn tensor_arithmetic_matches_loops() {
    let h = Handle::cpu();
    let dims = [2, 4, 3, 5];
    let n = count(&dims);
    let c = f32_tensor(&dims, false);
    let a = rand(n, 21);
    // AddTensor: a per-channel bias broadcast, alpha 2, beta 1 (accumulate).
    let bias_t = f32_tensor(&[1, 4, 1, 1], false);
    let bias = rand(4, 22);
    let mut out = a.clone();
    let (two, one, zero, half) = (2.0f32, 1.0f32, 0.0f32, 0.5f32);
    ok(cudnnAddTensor(h.0, sc(&two), bias_t, p(&bias), sc(&one), c, pm(&mut out)));
    let want: Vec<f64> = indices(&dims).iter().map(|i| 2.0 * bias[i[1]] as f64 + a[off(i, &strides(&dims, false))] as f64).collect();
    close(&out, &want, 1e-6, "add tensor");
    // With beta 0 the old values are never read (NaN stays out).
    let mut nan = vec![f32::NAN; n];
    ok(cudnnAddTensor(h.0, sc(&one), bias_t, p(&bias), sc(&zero), c, pm(&mut nan)));
    let want: Vec<f64> = indices(&dims).iter().map(|i| bias[i[1]] as f64).collect();
    close(&nan, &want, 1e-6, "add tensor, beta 0");

    // OpTensor, every op, B broadcast, alpha1 0.5, alpha2 2, beta 0.25.
    let b = rand(4, 23);
    let bt = f32_tensor(&[1, 4, 1, 1], false);
    let pos: Vec<f32> = a.iter().map(|v| v.abs() + 0.1).collect();
    for (op, f) in [
        (CUDNN_OP_TENSOR_ADD, (|a: f64, b: f64| a + b) as fn(f64, f64) -> f64),
        (CUDNN_OP_TENSOR_MUL, |a, b| a * b),
        (CUDNN_OP_TENSOR_MIN, |a, b| a.min(b)),
        (CUDNN_OP_TENSOR_MAX, |a, b| a.max(b)),
        (CUDNN_OP_TENSOR_SQRT, |a, _| a.sqrt()),
        (CUDNN_OP_TENSOR_NOT, |a, _| 1.0 - a),
    ] {
        let mut od = std::ptr::null_mut();
        ok(cudnnCreateOpTensorDescriptor(&mut od));
        ok(cudnnSetOpTensorDescriptor(od, op, CUDNN_DATA_FLOAT, CUDNN_NOT_PROPAGATE_NAN));
        let (a1, a2, beta) = (0.5f32, 2.0f32, 0.25f32);
        let old = rand(n, 24);
        let mut out = old.clone();
        ok(cudnnOpTensor(h.0, od, sc(&a1), c, p(&pos), sc(&a2), bt, p(&b), sc(&beta), c, pm(&mut out)));
        let want: Vec<f64> = indices(&dims)
            .iter()
            .map(|i| {
                let o = off(i, &strides(&dims, false));
                f(0.5 * pos[o] as f64, 2.0 * b[i[1]] as f64) + 0.25 * old[o] as f64
            })
            .collect();
        close(&out, &want, 1e-6, &format!("op tensor {op}"));
        ok(cudnnDestroyOpTensorDescriptor(od));
    }

    // ReduceTensor over axes 0 and 2, every op without indices.
    let cdims = [1, 4, 1, 5];
    let cd = f32_tensor(&cdims, false);
    for (op, f) in [
        (CUDNN_REDUCE_TENSOR_ADD, (|v: &[f64]| v.iter().sum()) as fn(&[f64]) -> f64),
        (CUDNN_REDUCE_TENSOR_MUL, |v| v.iter().product()),
        (CUDNN_REDUCE_TENSOR_MIN, |v| v.iter().cloned().fold(f64::MAX, f64::min)),
        (CUDNN_REDUCE_TENSOR_MAX, |v| v.iter().cloned().fold(f64::MIN, f64::max)),
        (CUDNN_REDUCE_TENSOR_AMAX, |v| v.iter().map(|x| x.abs()).fold(0.0, f64::max)),
        (CUDNN_REDUCE_TENSOR_AVG, |v| v.iter().sum::<f64>() / v.len() as f64),
        (CUDNN_REDUCE_TENSOR_NORM1, |v| v.iter().map(|x| x.abs()).sum()),
        (CUDNN_REDUCE_TENSOR_NORM2, |v| v.iter().map(|x| x * x).sum::<f64>().sqrt()),
    ] {
        let mut rd = std::ptr::null_mut();
        ok(cudnnCreateReduceTensorDescriptor(&mut rd));
        ok(cudnnSetReduceTensorDescriptor(rd, op, CUDNN_DATA_FLOAT, CUDNN_NOT_PROPAGATE_NAN, CUDNN_REDUCE_TENSOR_NO_INDICES, CUDNN_32BIT_INDICES));
        let (mut ws, mut is) = (1usize, 1usize);
        ok(cudnnGetReductionWorkspaceSize(h.0, rd, c, cd, &mut ws));
        ok(cudnnGetReductionIndicesSize(h.0, rd, c, cd, &mut is));
        assert_eq!(is, 0);
        let mut wsb = vec![0u8; ws];
        let mut out = vec![f32::NAN; count(&cdims)];
        ok(cudnnReduceTensor(h.0, rd, std::ptr::null_mut(), 0, wsb.as_mut_ptr() as *mut _, ws, sc(&half), c, p(&a), sc(&zero), cd, pm(&mut out)));
        let want: Vec<f64> = indices(&cdims)
            .iter()
            .map(|o| {
                let vals: Vec<f64> = (0..2).flat_map(|nn| (0..3).map(move |hh| (nn, hh))).map(|(nn, hh)| a[off(&[nn, o[1], hh, o[3]], &strides(&dims, false))] as f64).collect();
                0.5 * f(&vals)
            })
            .collect();
        close(&out, &want, 1e-6, &format!("reduce {op}"));
        ok(cudnnDestroyReduceTensorDescriptor(rd));
    }

    // TransformTensor NCHW -> NHWC, then ScaleTensor and SetTensor.
    let nhwc = f32_tensor(&dims, true);
    let mut t = vec![f32::NAN; n];
    ok(cudnnTransformTensor(h.0, sc(&one), c, p(&a), sc(&zero), nhwc, pm(&mut t)));
    let (ns, hs) = (strides(&dims, false), strides(&dims, true));
    let want: Vec<f64> = {
        let mut w = vec![0f64; n];
        for i in indices(&dims) {
            w[off(&i, &hs)] = a[off(&i, &ns)] as f64;
        }
        w
    };
    close(&t, &want, 0.0, "transform to NHWC");
    let three = 3.0f32;
    ok(cudnnScaleTensor(h.0, nhwc, pm(&mut t), sc(&three)));
    close(&t, &want.iter().map(|v| 3.0 * v).collect::<Vec<_>>(), 1e-7, "scale tensor");
    let v = -1.25f32;
    ok(cudnnSetTensor(h.0, nhwc, pm(&mut t), sc(&v)));
    close(&t, &vec![-1.25; n], 0.0, "set tensor");
}

#[test]
fn reduction_indices_are_the_first_extreme() {
    let h = Handle::cpu();
    let dims = [3, 4, 5, 2];
    let st = strides(&dims, true);
    let a = f32_tensor(&dims, true);
    // Reduce axes 0 and 2 (region 3 x 5, row-major): C is [1, 4, 1, 2].
    let cdims = [1, 4, 1, 2];
    let c = f32_tensor(&cdims, false);
    let mut x = rand(count(&dims), 51);
    // A tie: the first of two equal maxima wins.
    x[off(&[2, 1, 4, 0], &st)] = 5.0;
    x[off(&[0, 1, 3, 0], &st)] = 5.0;
    for (op, it, size) in [(CUDNN_REDUCE_TENSOR_MAX, CUDNN_32BIT_INDICES, 4), (CUDNN_REDUCE_TENSOR_MIN, CUDNN_64BIT_INDICES, 8), (CUDNN_REDUCE_TENSOR_AMAX, CUDNN_8BIT_INDICES, 1)]
    {
        let mut rd = std::ptr::null_mut();
        ok(cudnnCreateReduceTensorDescriptor(&mut rd));
        ok(cudnnSetReduceTensorDescriptor(rd, op, CUDNN_DATA_FLOAT, CUDNN_NOT_PROPAGATE_NAN, CUDNN_REDUCE_TENSOR_FLATTENED_INDICES, it));
        let mut is = 0usize;
        ok(cudnnGetReductionIndicesSize(h.0, rd, a, c, &mut is));
        assert_eq!(is, 8 * size);
        let mut idx = vec![0xAAu8; is];
        let mut out = vec![f32::NAN; 8];
        let (one, zero) = (1.0f32, 0.0f32);
        ok(cudnnReduceTensor(h.0, rd, idx.as_mut_ptr() as *mut _, is, std::ptr::null_mut(), 0, sc(&one), a, p(&x), sc(&zero), c, pm(&mut out)));
        for o in indices(&cdims) {
            let mut best: Option<(usize, f32)> = None;
            for (k, (nn, hh)) in (0..3).flat_map(|nn| (0..5).map(move |hh| (nn, hh))).enumerate() {
                let v = x[off(&[nn, o[1], hh, o[3]], &st)];
                let v = if op == CUDNN_REDUCE_TENSOR_AMAX { v.abs() } else { v };
                let better = match best {
                    None => true,
                    Some((_, b)) => {
                        if op == CUDNN_REDUCE_TENSOR_MIN {
                            v < b
                        } else {
                            v > b
                        }
                    }
                };
                if better {
                    best = Some((k, v));
                }
            }
            let (k, v) = best.unwrap();
            let at = off(&o, &strides(&cdims, false));
            let got = match size {
                4 => u32::from_ne_bytes(idx[at * 4..at * 4 + 4].try_into().unwrap()) as usize,
                8 => u64::from_ne_bytes(idx[at * 8..at * 8 + 8].try_into().unwrap()) as usize,
                _ => idx[at] as usize,
            };
            assert_eq!(got, k, "reduce {op}: index of the result at {o:?}");
            assert_eq!(out[at], v, "reduce {op}: value at {o:?}");
        }
        ok(cudnnDestroyReduceTensorDescriptor(rd));
    }
}
